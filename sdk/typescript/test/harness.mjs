// Real `kairos` nodes for the tests: `kairos dev` (plaintext, no keys) and `kairos serve`
// (TLS with a client CA — mutual TLS — and API keys), each in a temp dir on free ports.
import { spawn, execFileSync } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import sdk from "../dist/index.js";

const here = path.dirname(fileURLToPath(import.meta.url));
export const repoRoot = path.resolve(here, "../../..");

/** The node binary: $KAIROS_BIN, else target/release/kairos, else target/debug/kairos. A missing one is a failure. */
export function kairosBin() {
  const candidates = [process.env.KAIROS_BIN, path.join(repoRoot, "target/release/kairos"), path.join(repoRoot, "target/debug/kairos")];
  for (const c of candidates) if (c && fs.existsSync(c)) return c;
  throw new Error(`no kairos binary: set KAIROS_BIN or build target/release/kairos (looked at ${candidates.filter(Boolean).join(", ")})`);
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function openssl(args, cwd) {
  execFileSync("openssl", args, { cwd, stdio: ["ignore", "ignore", "pipe"] });
}

/** A CA, a node certificate for 127.0.0.1 / localhost, and a client certificate, made with the openssl CLI. */
export function makeCerts(dir) {
  openssl(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=kairos-test-ca"], dir);
  fs.writeFileSync(path.join(dir, "node.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n");
  openssl(["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=localhost"], dir);
  openssl(["x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "node.pem", "-days", "2", "-extfile", "node.ext"], dir);
  fs.writeFileSync(path.join(dir, "client.ext"), "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n");
  openssl(["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "client.key", "-out", "client.csr", "-subj", "/CN=sdk-typescript-test"], dir);
  openssl(["x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "client.pem", "-days", "2", "-extfile", "client.ext"], dir);
  const p = (f) => path.join(dir, f);
  return { ca: p("ca.pem"), nodeCert: p("node.pem"), nodeKey: p("node.key"), clientCert: p("client.pem"), clientKey: p("client.key") };
}

/**
 * Starts a node: target `dev` or `serve`. Returns { endpoint, clientOptions(scope), admin, stop }.
 * For `serve`, `clientOptions` carry TLS (CA + client certificate) and the narrower keys the
 * SDK's own client created from the bootstrap admin key.
 */
export async function startNode(target, { extraArgs = [] } = {}) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `kairos-sdk-ts-${target}-`));
  const data = path.join(dir, "data");
  const [http, grpcPort] = [await freePort(), await freePort()];
  const args = [target, "--data-dir", data, "--listen-http", `127.0.0.1:${http}`, "--listen-grpc", `127.0.0.1:${grpcPort}`, "--log", "warn", ...extraArgs];
  let certs;
  if (target === "serve") {
    certs = makeCerts(dir);
    args.push("--tls-cert-file", certs.nodeCert, "--tls-key-file", certs.nodeKey, "--tls-client-ca-file", certs.ca);
  }
  const log = fs.openSync(path.join(dir, "node.log"), "a");
  let child, exited;
  const launch = () => {
    exited = null;
    child = spawn(kairosBin(), args, { stdio: ["ignore", log, log] });
    const me = child;
    me.on("exit", (code, signal) => { if (child === me) exited = { code, signal }; });
  };
  launch();
  const endpoint = target === "serve" ? `https://127.0.0.1:${grpcPort}` : `http://127.0.0.1:${grpcPort}`;
  const tls = certs ? { ca: certs.ca, cert: certs.clientCert, key: certs.clientKey, serverName: "localhost" } : undefined;
  let adminKey;
  const ready = async () => {
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (exited) throw new Error(`kairos ${target} exited (${JSON.stringify(exited)}): ${fs.readFileSync(path.join(dir, "node.log"), "utf8").slice(-2000)}`);
    if (Date.now() > deadline) throw new Error(`kairos ${target} did not come up in 30 s (log ${dir}/node.log)`);
    try {
      if (target === "serve") {
        adminKey = fs.readFileSync(path.join(data, "admin-key"), "utf8").trim();
        if (!adminKey) throw new Error("empty admin-key");
      }
      const c = new sdk.Client(endpoint, { apiKey: adminKey, tls, timeoutMs: 2_000 });
      await c.whoAmI();
      c.close();
      break;
    } catch {
      await sleep(100);
    }
  }
  };
  await ready();
  const admin = new sdk.Client(endpoint, { apiKey: adminKey, tls });
  const keys = {};
  if (target === "serve") {
    keys.client = (await admin.createApiKey({ namespace: "default", scopes: ["submit", "read", "definitions"], name: "sdk-ts-client" })).token;
    keys.worker = (await admin.createApiKey({ namespace: "default", scopes: ["worker"], name: "sdk-ts-worker" })).token;
  }
  return {
    target, dir, endpoint, tls, admin, keys,
    get child() { return child; },
    /** SIGKILLs the node, runs `whileDown`, and starts it again on the same data dir and ports. */
    async restart(whileDown = async () => {}) {
      const old = child;
      const gone = new Promise((r) => old.once("exit", r));
      old.kill("SIGKILL");
      await gone;
      await whileDown();
      launch();
      await ready();
    },
    /** Options of a client (`role`: client | worker). */
    options(role = "client") { return { apiKey: keys[role], tls }; },
    client(role = "client") { return new sdk.Client(endpoint, { apiKey: keys[role], tls }); },
    async stop() {
      admin.close();
      if (!exited) {
        child.kill("SIGTERM");
        const t0 = Date.now();
        while (!exited && Date.now() - t0 < 10_000) await sleep(50);
        if (!exited) child.kill("SIGKILL");
      }
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}
