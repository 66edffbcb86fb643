// Worker behaviour beyond the conformance list, against a real `kairos dev`: the node's errors
// name their field, a handler's time-out, output limits, graceful shutdown, and results kept
// across a node restart (reconnect, resend until acknowledged).
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import sdk from "../dist/index.js";
import { startNode, sleep } from "./harness.mjs";

const { Client, Worker, KairosError } = sdk;

describe("worker and errors on kairos dev", () => {
  let node, client;
  before(async () => { node = await startNode("dev"); client = node.client(); });
  after(async () => { client?.close(); await node?.stop(); });
  const def = (name, extra = "") => client.applyDefinition(`name: ${name}\nversion: 1\ninputs:\n  n: {type: int, required: false}\nexecution: {type: test-ts}\nretry: {max_attempts: 2, base_delay: 100ms}\n${extra}`);
  const worker = (queue, handler, options = {}) => {
    const w = new Worker(new Client(node.endpoint), { queue, concurrency: 8, ...options });
    w.handle(queue, handler, options.handlerOptions);
    return { w, running: w.run() };
  };

  it("the node's refusals carry the gRPC code and the field", async () => {
    await def("errs");
    const bad = await client.submit("errs", { inputs: { n: "seven" } }).then(() => null, (e) => e);
    assert.ok(bad instanceof KairosError);
    assert.equal(bad.codeName, "INVALID_ARGUMENT");
    assert.equal(bad.field, "inputs.n", bad.message);
    const missing = await client.get("01ZZZZZZZZZZZZZZZZZZZZZZZZ").then(() => null, (e) => e);
    assert.equal(missing?.codeName, "NOT_FOUND");
    const unknown = await client.submit("no-such-definition").then(() => null, (e) => e);
    assert.equal(unknown?.codeName, "NOT_FOUND");
  });

  it("a handler over its time-out fails retryably with code timeout, its signal aborted", async () => {
    await def("slow");
    let aborted = 0;
    const { w } = worker("slow", (task) => new Promise((res) => task.signal.addEventListener("abort", () => { aborted++; res(); })), { handlerOptions: { timeoutMs: 200 } });
    const s = await client.submit("slow");
    const e = await client.wait(s.executionId, 15_000);
    await w.stop();
    assert.equal(e.status, "EXECUTION_STATUS_FAILED");
    assert.equal(e.attemptCount, 2, "retried once (max_attempts 2)");
    assert.equal(e.error.code, "timeout");
    assert.equal(aborted, 2);
  });

  it("an output over 32 KiB fails the attempt naming output", async () => {
    await def("big");
    const { w } = worker("big", () => ({ blob: "x".repeat(33 * 1024) }));
    const s = await client.submit("big");
    const e = await client.wait(s.executionId, 15_000);
    await w.stop();
    assert.equal(e.status, "EXECUTION_STATUS_FAILED");
    assert.match(e.error.message, /^output: is \d+ bytes of JSON, more than 32768/);
  });

  it("a graceful stop lets running handlers finish and report, then takes no more", async () => {
    await def("drain");
    let release;
    const gate = new Promise((r) => { release = r; });
    let startedCount = 0;
    const { w, running } = worker("drain", async (task) => { startedCount++; await gate; return { n: task.inputs.n }; }, { concurrency: 3 });
    const items = await client.submitMany([1, 2, 3, 4, 5].map((n) => ({ definition: "drain", inputs: { n } })));
    const ids = items.map((i) => i.ok.executionId);
    while (startedCount < 3) await sleep(20);
    const stopped = w.stop();
    await sleep(200);
    release();
    await stopped;
    await running;
    assert.equal(startedCount, 3, "no task started after the stop");
    const statuses = await Promise.all(ids.map(async (id) => (await client.get(id)).execution.status));
    assert.equal(statuses.filter((s) => s === "EXECUTION_STATUS_SUCCEEDED").length, 3, statuses.join(","));
    // The two never reached this worker: what the node's dispatch had claimed for the
    // stream goes back to the queue (READY, the attempt ABANDONED) once the stream closes.
    const rest = ids.filter((_, i) => statuses[i] !== "EXECUTION_STATUS_SUCCEEDED");
    assert.equal(rest.length, 2, statuses.join(","));
    for (const id of rest) {
      let g;
      for (let t = 0; t < 100; t++) { g = await client.get(id); if (g.execution.status === "EXECUTION_STATUS_READY") break; await sleep(50); }
      assert.equal(g.execution.status, "EXECUTION_STATUS_READY");
      assert.ok(g.attempts.every((a) => a.status === "ATTEMPT_STATUS_ABANDONED" && a.workerId === ""), JSON.stringify(g.attempts));
    }
    // Another worker finishes the rest.
    const other = worker("drain", (task) => ({ n: task.inputs.n }));
    for (const id of ids) assert.equal((await client.wait(id, 15_000)).status, "EXECUTION_STATUS_SUCCEEDED");
    await other.w.stop();
  });

  it("results made while the node is down are sent on the new stream and applied", async () => {
    await def("restart", "timeouts: {lease: 30s}\n");
    let release;
    const gate = new Promise((r) => { release = r; });
    let started = 0;
    const disconnects = [];
    const { w } = worker("restart", async (task) => { started++; await gate; return { n: task.inputs.n, attempt: task.attempt }; });
    w.on("disconnected", (e) => disconnects.push(e.codeName));
    const items = await client.submitMany([1, 2, 3].map((n) => ({ definition: "restart", inputs: { n } })));
    while (started < 3) await sleep(20);
    await sleep(300); // heartbeats: the attempts are confirmed
    // Results made while the node is down: kept until a new stream acknowledges them.
    await node.restart(async () => { release(); await sleep(300); });
    for (const { ok } of items) {
      const e = await client.wait(ok.executionId, 30_000);
      assert.equal(e.status, "EXECUTION_STATUS_SUCCEEDED");
      assert.equal(JSON.parse(e.outputJson).attempt, 1, "the first attempt's result, not a retry");
    }
    assert.ok(disconnects.length >= 1, "the worker saw the stream break");
    await w.stop();
  });
});
