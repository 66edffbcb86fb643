// `kairos serve` with mutual TLS and API keys: what the node refuses, the SDK reports with the
// gRPC code; a worker the node refuses for good stops instead of idling.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import sdk from "../dist/index.js";
import { startNode } from "./harness.mjs";

const { Client, Worker, KairosError } = sdk;

describe("serve: mutual TLS and API keys", () => {
  let node;
  before(async () => { node = await startNode("serve"); });
  after(async () => { await node?.stop(); });

  const refused = async (promise) => {
    const e = await promise.then(() => null, (err) => err);
    assert.ok(e instanceof KairosError, `refused with a KairosError, got ${e}`);
    return e;
  };

  it("a client without a client certificate is refused by the TLS handshake", async () => {
    const c = new Client(node.endpoint, { apiKey: node.keys.client, tls: { ca: node.tls.ca, serverName: "localhost" }, timeoutMs: 5_000 });
    const e = await refused(c.whoAmI());
    assert.equal(e.codeName, "UNAVAILABLE", e.message);
    assert.ok(e.tlsFailure, `a TLS failure: ${e.message}`);
    c.close();
  });

  it("a client that does not trust the node's CA is refused", async () => {
    const c = new Client(node.endpoint, { apiKey: node.keys.client, tls: { cert: node.tls.cert, key: node.tls.key, serverName: "localhost" }, timeoutMs: 5_000 });
    const e = await refused(c.whoAmI());
    assert.equal(e.codeName, "UNAVAILABLE", e.message);
    assert.ok(e.tlsFailure, `a TLS failure: ${e.message}`);
    c.close();
  });

  it("a worker refused by the TLS handshake stops instead of retrying", async () => {
    const w = new Worker(new Client(node.endpoint, { apiKey: node.keys.worker, tls: { ca: node.tls.ca, serverName: "localhost" } }), { queue: "q0" });
    const e = await refused(w.run());
    assert.ok(e.tlsFailure, e.message);
  });

  it("the API key goes with every call: none is UNAUTHENTICATED, a missing scope PERMISSION_DENIED", async () => {
    const anonymous = new Client(node.endpoint, { tls: node.tls });
    assert.equal((await refused(anonymous.listDefinitions())).codeName, "UNAUTHENTICATED");
    anonymous.close();
    const workerKey = new Client(node.endpoint, { apiKey: node.keys.worker, tls: node.tls });
    const e = await refused(workerKey.submit("anything"));
    assert.equal(e.codeName, "PERMISSION_DENIED");
    assert.match(e.message, /submit/);
    workerKey.close();
    const c = node.client("client");
    const me = await c.whoAmI();
    assert.deepEqual([...me.scopes].sort(), ["definitions", "read", "submit"]);
    assert.equal(me.authentication, true);
    c.close();
  });

  it("a worker whose key lacks the worker scope, or was revoked, stops with the code", async () => {
    const noScope = new Worker(new Client(node.endpoint, node.options("client")), { queue: "q1" });
    assert.equal((await refused(noScope.run())).codeName, "PERMISSION_DENIED");
    const { key, token } = await node.admin.createApiKey({ namespace: "default", scopes: ["worker"], name: "to-revoke" });
    await node.admin.revokeApiKey(key.id);
    const revoked = new Worker(new Client(node.endpoint, { apiKey: token, tls: node.tls }), { queue: "q1" });
    assert.equal((await refused(revoked.run())).codeName, "UNAUTHENTICATED");
  });
});
