// Checks the SDK makes before sending anything (no node needed): each refusal names the field.
import { test } from "node:test";
import assert from "node:assert/strict";
import sdk from "../dist/index.js";

const { Client, KairosError } = sdk;
const client = new Client("127.0.0.1:1");

function refuses(fn, field) {
  assert.throws(fn, (e) => e instanceof KairosError && e.code === 3 && e.field === field && e.message.includes(field));
}

test("inputs over 32 KiB are refused naming inputs", () => {
  refuses(() => client.submitRequest("x", { inputs: { blob: "a".repeat(32 * 1024) } }), "inputs");
  assert.doesNotThrow(() => client.submitRequest("x", { inputs: { blob: "a".repeat(32 * 1024 - 20) } }));
});

test("a submit in many refuses the item naming its index", async () => {
  await assert.rejects(client.submitMany([{ definition: "x" }, { definition: "x", inputs: { b: "a".repeat(40_000) } }]),
    (e) => e instanceof KairosError && e.field === "requests[1].inputs");
});

test("at and afterMs together are refused; a bare name becomes a registry URI", () => {
  refuses(() => client.submitRequest("x", { at: Date.now(), afterMs: 5 }), "at");
  refuses(() => client.submitRequest("x", { afterMs: -1 }), "afterMs");
  const r = client.submitRequest("report", { afterMs: 1500, version: 3 });
  assert.equal(r.definitionUri, "registry://jobs/report");
  assert.equal(r.delayMs, 1500);
  assert.equal(r.definitionVersion, 3);
  assert.equal(client.submitRequest("registry://jobs/a", { at: new Date(5000) }).executeAtMs, 5000);
});

test("TLS settings are checked", () => {
  refuses(() => new Client("http://127.0.0.1:1", { tls: { ca: "/nonexistent" } }), "tls");
  refuses(() => new Client("https://127.0.0.1:1", { tls: { ca: "/nonexistent/ca.pem" } }), "tls.ca");
  refuses(() => new Client("ftp://x"), "endpoint");
  refuses(() => new Client("127.0.0.1:1", { apiKey: "kai bad" }), "apiKey");
});

test("list limits and worker settings are checked", () => {
  refuses(() => client.list({ limit: 1001 }), "limit");
  refuses(() => new sdk.Worker(client, { queue: "" }), "queue");
  refuses(() => new sdk.Worker(client, { queue: "q", concurrency: 0 }), "concurrency");
});

test("an unreachable node is UNAVAILABLE, transient", async () => {
  const c = new Client("127.0.0.1:1", { timeoutMs: 2_000, retries: 1 });
  await assert.rejects(c.get("x"), (e) => e instanceof KairosError && (e.codeName === "UNAVAILABLE" || e.codeName === "DEADLINE_EXCEEDED") && e.transient);
  c.close();
});

test("withNamespace keeps the key, TLS and time-out", () => {
  const c = new Client("https://127.0.0.1:1", { apiKey: "kai_x", timeoutMs: 1234, tls: { serverName: "n" } });
  const d = c.withNamespace("team-a");
  assert.equal(d.namespace, "team-a");
  assert.equal(d.timeoutMs, 1234);
  assert.equal(d.metadata().get("authorization")[0], "Bearer kai_x");
  assert.equal(d.channelOptions["grpc.ssl_target_name_override"], "n");
  c.close(); d.close();
});
