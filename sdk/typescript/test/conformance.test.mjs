// The conformance scenarios of sdk/conformance/SCENARIOS.md (all but `throughput`, which
// throughput.mjs runs) against a real `kairos dev` and a real `kairos serve` (mutual TLS, API
// keys). Prints `conformance typescript <target> <id> ok|FAILED <detail>` per scenario.
import { describe, it, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import path from "node:path";
import { fileURLToPath } from "node:url";
import sdk from "../dist/index.js";
import { startNode, sleep } from "./harness.mjs";

const { Client, Worker, KairosError, NonRetryableError } = sdk;
const here = path.dirname(fileURLToPath(import.meta.url));
const targets = (process.env.CONFORMANCE_TARGETS ?? "dev,serve").split(",");

function scenario(target, id, fn) {
  it(id, async () => {
    const t0 = Date.now();
    try {
      const detail = await fn();
      console.log(`conformance typescript ${target} ${id} ok ${detail ? detail + " " : ""}(${Date.now() - t0} ms)`);
    } catch (e) {
      console.log(`conformance typescript ${target} ${id} FAILED ${String(e?.message ?? e).split("\n")[0]}`);
      throw e;
    }
  });
}

async function until(what, fn, timeoutMs = 15_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(50);
  }
}

for (const target of targets) {
  describe(`conformance ${target}`, () => {
    let node, client, workerOptions;
    const workers = [];
    const suffix = randomUUID().slice(0, 8);
    const def = (name, extra = "") => `name: ${name}\nversion: 1\ninputs:\n  n: {type: int, required: false}\n  s: {type: string, required: false}\nexecution: {type: test-ts}\n${extra}`;
    const startWorker = (queue, handler, options = {}) => {
      const w = new Worker(new Client(node.endpoint, workerOptions), { queue, workerId: `ts-${queue}`, concurrency: 4, ...options });
      w.handle(queue, handler);
      w.on("warning", (m) => console.error(`worker ${queue}: ${m}`));
      const running = w.run();
      running.catch((e) => console.error(`worker ${queue} ended: ${e.message}`));
      workers.push(w);
      return w;
    };

    before(async () => {
      node = await startNode(target);
      client = node.client("client");
      workerOptions = node.options("worker");
    });
    after(async () => {
      await Promise.all(workers.map((w) => w.stop().catch(() => {})));
      client?.close();
      await node?.stop();
    });

    scenario(target, "submit-idempotent", async () => {
      const name = `idem-${suffix}`;
      await client.applyDefinition(def(name));
      const key = `k-${randomUUID()}`;
      const first = await client.submit(name, { inputs: { n: 1 }, idempotencyKey: key });
      const second = await client.submit(name, { inputs: { n: 1 }, idempotencyKey: key });
      assert.equal(second.executionId, first.executionId, "the repeat returns the same execution");
      assert.equal(first.created, true);
      assert.equal(second.created, false);
      const err = await client.submit(name, { inputs: { n: 2 }, idempotencyKey: key }).then(() => null, (e) => e);
      assert.ok(err instanceof KairosError, `a conflict is refused (got ${err})`);
      assert.equal(err.code, 6, `ALREADY_EXISTS, got ${err.codeName}: ${err.message}`);
      return `${err.codeName}`;
    });

    scenario(target, "get-by-key", async () => {
      const name = `getkey-${suffix}`;
      await client.applyDefinition(def(name));
      const key = `g-${randomUUID()}`;
      const inputs = { n: 42, s: "héllo" };
      const s = await client.submit(name, { inputs, idempotencyKey: key });
      const byId = await client.get(s.executionId);
      const byKey = await client.getByIdempotencyKey(key);
      assert.equal(byId.execution.executionId, s.executionId);
      assert.equal(byKey.execution.executionId, s.executionId);
      assert.deepEqual(JSON.parse(byId.execution.inputsJson), inputs);
      assert.deepEqual(JSON.parse(byKey.execution.inputsJson), inputs);
      assert.equal(byKey.execution.idempotencyKey, key);
    });

    scenario(target, "delayed", async () => {
      const name = `delayed-${suffix}`;
      await client.applyDefinition(def(name));
      let startedAt = 0;
      startWorker(name, (task) => { startedAt = Date.now(); return { doubled: task.inputs.n * 2 }; });
      const s = await client.submit(name, { inputs: { n: 21 }, afterMs: 1_500 });
      const e = await client.wait(s.executionId, 20_000);
      assert.equal(e.status, "EXECUTION_STATUS_SUCCEEDED");
      assert.ok(startedAt >= Number(s.executeAtMs), `started ${startedAt} before execute_at ${s.executeAtMs}`);
      assert.deepEqual(JSON.parse(e.outputJson), { doubled: 42 });
      return `started ${startedAt - Number(s.executeAtMs)} ms after execute_at`;
    });

    scenario(target, "retry-backoff", async () => {
      const name = `retry-${suffix}`;
      await client.applyDefinition(def(name, "retry: {max_attempts: 3, base_delay: 100ms, max_delay: 300ms}\n"));
      const spans = [];
      startWorker(name, async (task) => {
        const span = { attempt: task.attempt, start: Date.now(), end: 0 };
        spans.push(span);
        await sleep(20);
        span.end = Date.now();
        if (task.attempt < 3) throw new Error(`transient failure ${task.attempt}`);
        return { attempt: task.attempt };
      });
      const s = await client.submit(name, {});
      const e = await client.wait(s.executionId, 20_000);
      assert.equal(e.status, "EXECUTION_STATUS_SUCCEEDED", `status ${e.status}: ${e.error?.message}`);
      assert.equal(e.attemptCount, 3);
      assert.deepEqual(spans.map((x) => x.attempt), [1, 2, 3]);
      for (let i = 0; i + 1 < spans.length; i++) {
        assert.ok(spans[i + 1].start > spans[i].end, `attempt ${i + 2} started before attempt ${i + 1} ended`);
      }
      const { attempts } = await client.get(s.executionId);
      assert.equal(attempts.length, 3);
      return `gaps ${spans.slice(1).map((x, i) => x.start - spans[i].end).join(", ")} ms`;
    });

    scenario(target, "non-retryable", async () => {
      const name = `nonretry-${suffix}`;
      await client.applyDefinition(def(name, "retry: {max_attempts: 5, base_delay: 100ms}\n"));
      startWorker(name, () => { throw new NonRetryableError("the input is wrong for good", { code: "bad-input" }); });
      const s = await client.submit(name, {});
      const e = await client.wait(s.executionId, 20_000);
      assert.equal(e.status, "EXECUTION_STATUS_FAILED");
      assert.equal(e.attemptCount, 1);
      assert.equal(e.error.message, "the input is wrong for good");
      assert.equal(e.error.retryable, false);
      assert.equal(e.error.code, "bad-input");
    });

    scenario(target, "cancel-running", async () => {
      const name = `cancel-${suffix}`;
      await client.applyDefinition(def(name));
      let started = false;
      let observedAt = 0;
      startWorker(name, (task) => new Promise((_, reject) => {
        started = true;
        task.signal.addEventListener("abort", () => { observedAt = Date.now(); reject(task.signal.reason); });
      }));
      const s = await client.submit(name, {});
      await until("the handler to start", () => started);
      const cancelledAt = Date.now();
      const c = await client.cancel(s.executionId);
      assert.equal(c.cancelled, false, "a running execution: its worker is asked to stop");
      await until("the handler to observe the cancellation", () => observedAt > 0, 5_000);
      const e = await client.wait(s.executionId, 10_000);
      assert.equal(e.status, "EXECUTION_STATUS_CANCELLED");
      return `observed ${observedAt - cancelledAt} ms after cancel`;
    });

    scenario(target, "worker-killed", async () => {
      const name = `killed-${suffix}`;
      await client.applyDefinition(def(name, "retry: {max_attempts: 3, base_delay: 100ms, max_delay: 200ms}\ntimeouts: {lease: 2s}\n"));
      const env = { ...process.env, KAIROS_ENDPOINT: node.endpoint, KAIROS_API_KEY: workerOptions.apiKey ?? "", QUEUE: name };
      if (node.tls) Object.assign(env, { KAIROS_CA: node.tls.ca, KAIROS_CERT: node.tls.cert, KAIROS_KEY: node.tls.key });
      const child = spawn(process.execPath, [path.join(here, "worker-child.mjs")], { env, stdio: ["ignore", "pipe", "inherit"] });
      let out = "";
      child.stdout.on("data", (d) => { out += d; });
      try {
        const s = await client.submit(name, {});
        await until("the child's handler to start", () => out.includes(`started ${s.executionId} 1`));
        await sleep(300); // its first heartbeat: the node knows the attempt reached a worker
        child.kill("SIGKILL");
        const second = startWorker(name, (task) => ({ by: "second", attempt: task.attempt }), { workerId: "second" });
        assert.ok(second);
        const e = await client.wait(s.executionId, 20_000);
        assert.equal(e.status, "EXECUTION_STATUS_SUCCEEDED");
        assert.equal(e.attemptCount, 2);
        assert.deepEqual(JSON.parse(e.outputJson), { by: "second", attempt: 2 });
        const { attempts } = await client.get(s.executionId);
        assert.equal(attempts[0].workerId, "child");
        assert.equal(attempts[1].workerId, "second");
        return `attempt 1 ${attempts[0].status}`;
      } finally {
        child.kill("SIGKILL");
      }
    });

    scenario(target, "stale-fenced", async () => {
      const name = `fenced-${suffix}`;
      await client.applyDefinition(def(name, "retry: {max_attempts: 3, base_delay: 100ms, max_delay: 200ms}\ntimeouts: {lease: 1s}\n"));
      let id;
      let firstStarted = false;
      const stale = startWorker(name, async (task) => {
        firstStarted = true;
        // Outlive the lease (no heartbeats) until attempt 2 has completed elsewhere.
        await until("attempt 2 to complete", async () => (await client.get(task.executionId)).execution.status === "EXECUTION_STATUS_SUCCEEDED", 20_000);
        return { by: "stale", attempt: task.attempt };
      }, { workerId: "stale", concurrency: 1, heartbeats: false });
      const fenced = [], acked = [];
      stale.on("fenced", (r) => fenced.push(r));
      stale.on("acked", (eid) => acked.push(eid));
      const s = await client.submit(name, {});
      id = s.executionId;
      await until("attempt 1 to start", () => firstStarted);
      startWorker(name, (task) => ({ by: "fresh", attempt: task.attempt }), { workerId: "fresh" });
      await until("the stale result to be refused as fenced", () => fenced.some((r) => r.executionId === id), 20_000);
      assert.ok(!acked.includes(id), "the stale result was not acknowledged as applied");
      const { execution } = await client.get(id);
      assert.equal(execution.status, "EXECUTION_STATUS_SUCCEEDED");
      assert.equal(JSON.parse(execution.outputJson).by, "fresh");
      return `fenced: ${fenced.find((r) => r.executionId === id).message}`;
    });

    scenario(target, "list-pages", async () => {
      const name = `list-${suffix}`;
      await client.applyDefinition(def(name));
      const prefix = `lp-${randomUUID()}`;
      const items = await client.submitMany(Array.from({ length: 25 }, (_, i) => ({ definition: name, idempotencyKey: `${prefix}-${i}`, inputs: { n: i } })));
      assert.equal(items.length, 25);
      assert.ok(items.every((i) => i.ok), `every submission accepted: ${JSON.stringify(items.find((i) => !i.ok))}`);
      const ids = [];
      let cursor, pages = 0;
      do {
        const page = await client.list({ definition: name, limit: 10, cursor });
        pages++;
        assert.ok(page.executions.length <= 10);
        ids.push(...page.executions.filter((e) => e.idempotencyKey.startsWith(prefix)).map((e) => e.executionId));
        cursor = page.nextCursor.length ? page.nextCursor : undefined;
      } while (cursor && pages < 20);
      assert.equal(ids.length, 25, `25 listed, got ${ids.length}`);
      assert.equal(new Set(ids).size, 25, "no duplicates");
      assert.equal(pages, 3, `three pages, got ${pages}`);
    });

    scenario(target, "cron", async () => {
      const name = `cron-${suffix}`;
      await client.applyDefinition(def(name));
      startWorker(name, () => ({ ok: true }));
      const { cronJob } = await client.createCron({ definition: name, expression: "* * * * * *", timezone: "UTC" });
      const jobId = cronJob.cronJobId;
      await sleep(3_500);
      const paused = await client.pauseCron(jobId);
      assert.equal(paused.status, "CRON_STATUS_PAUSED");
      const runs = (await client.cronRuns(jobId, { limit: 100 })).executions;
      assert.ok(runs.length >= 2, `at least 2 runs, got ${runs.length}`);
      const keys = new Set();
      for (const r of runs) {
        const e = await client.wait(r.executionId, 15_000);
        assert.equal(e.status, "EXECUTION_STATUS_SUCCEEDED", `run ${r.executionId}: ${e.status}`);
        assert.ok(r.idempotencyKey.startsWith(`cron:${jobId}:`), `key ${r.idempotencyKey}`);
        keys.add(r.idempotencyKey);
      }
      assert.equal(keys.size, runs.length, "distinct idempotency keys");
      const now = Date.now();
      const occ = await client.previewCron({ expression: "* * * * * *", timezone: "UTC", fromMs: now, untilMs: now + 5_000 });
      assert.ok(occ.length >= 4 && occ.length <= 5, `preview: ${occ.length} occurrences in 5 s`);
      assert.ok(Number(occ[0].utcMs) >= now);
      await client.deleteCron(jobId);
      return `${runs.length} runs`;
    });
  });
}
