// The `throughput` conformance scenario (run once, on `kairos dev`, by .ci/sdk-typescript):
// 100,000 executions due at one instant (SubmitBatch of 1,000), one TypeScript worker (one Work
// stream, 200 credits, no-op handler) drains them; the Rust SDK's figure comes from
// `kairosctl bench s2 --count N --workers 1 --slots 200` in the same run. Completions/s is the
// bench's definition: executions started / (last start − first start). The ratio is printed,
// not asserted (speed lives in benchmarks; the machine is shared); every execution must end
// SUCCEEDED. Usage: node test/throughput.mjs [--count N] [--skip-rust]
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import sdk from "../dist/index.js";
import { startNode, kairosBin, repoRoot, sleep } from "./harness.mjs";

const arg = (name, def) => { const i = process.argv.indexOf(name); return i > 0 ? process.argv[i + 1] : def; };
const count = Number(arg("--count", "100000"));
const slots = 200;
const skipRust = process.argv.includes("--skip-rust");

function rustFigure() {
  const ctl = process.env.KAIROSCTL_BIN ?? path.join(repoRoot, "target/release/kairosctl");
  if (!fs.existsSync(ctl)) throw new Error(`no kairosctl at ${ctl} (set KAIROSCTL_BIN)`);
  const out = execFileSync(ctl, ["bench", "s2", "--count", String(count), "--workers", "1", "--slots", String(slots), "--kairos", kairosBin()],
    { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"], maxBuffer: 64 * 1024 * 1024 });
  const json = JSON.parse(out.trim().split("\n").pop());
  return json;
}

async function typescriptFigure() {
  const node = await startNode("dev");
  try {
    const client = node.client();
    const name = "throughput";
    await client.applyDefinition(`name: ${name}\nversion: 1\nexecution: {type: noop}\ntimeouts: {lease: 30s}\n`);
    let started = 0, first = 0, last = 0, acked = 0;
    const worker = new sdk.Worker(new sdk.Client(node.endpoint, node.options("worker")), { queue: name, workerId: "ts-throughput", concurrency: slots });
    worker.handle(name, () => {
      const now = performance.now();
      if (started++ === 0) first = now;
      last = now;
      return undefined;
    });
    worker.on("acked", () => { acked++; });
    worker.on("warning", (m) => console.error(`worker: ${m}`));
    const running = worker.run();
    const leadMs = Math.round(count / 20) + 2_000;
    const t0 = Date.now();
    const at = t0 + leadMs;
    let submitted = 0;
    const batches = [];
    for (let i = 0; i < count; i += 1_000) batches.push(Array.from({ length: Math.min(1_000, count - i) }, (_, j) => ({ definition: name, at, idempotencyKey: `tp-${i + j}` })));
    const inFlight = 4;
    await Promise.all(Array.from({ length: inFlight }, async () => {
      for (let b; (b = batches.shift()); ) {
        const items = await client.submitMany(b);
        const bad = items.find((x) => !x.ok);
        if (bad) throw new Error(`a submission was refused: ${JSON.stringify(bad.error)}`);
        submitted += items.length;
      }
    }));
    const submitS = (Date.now() - t0) / 1000;
    if (Date.now() > at) console.error(`note: submission took ${submitS.toFixed(2)} s, past the ${leadMs} ms lead`);
    const deadline = Date.now() + 300_000;
    while (acked < count && Date.now() < deadline) await sleep(100);
    await worker.stop();
    await running;
    const stats = await client.stats();
    const succeeded = stats.EXECUTION_STATUS_SUCCEEDED ?? 0;
    client.close();
    const perS = started > 1 ? (started - 1) / ((last - first) / 1000) : 0;
    return { perS, started, acked, succeeded, submitted, submitPerS: submitted / submitS, drainS: (last - first) / 1000 };
  } finally {
    await node.stop();
  }
}

const rust = skipRust ? null : rustFigure();
const ts = await typescriptFigure();
const fmt = (n) => Math.round(n).toLocaleString("en-US");
console.log(`typescript: ${fmt(ts.perS)} completions/s (${ts.started} started, drain ${ts.drainS.toFixed(2)} s, ${ts.succeeded} SUCCEEDED; submit ${fmt(ts.submitPerS)}/s)`);
if (rust) console.log(`rust:       ${fmt(rust.completions_per_s)} completions/s (kairosctl bench s2 --count ${count} --workers 1 --slots ${slots}; missing ${rust.missing}, duplicates ${rust.duplicates?.total})`);
const ratio = rust ? ts.perS / rust.completions_per_s : NaN;
const ok = ts.succeeded === count && ts.started >= count;
console.log(`conformance typescript dev throughput ${ok ? "ok" : "FAILED"} typescript ${fmt(ts.perS)}/s rust ${rust ? fmt(rust.completions_per_s) : "n/a"}/s ratio ${ratio.toFixed(2)} (target >= 0.70, printed not asserted)${ok ? "" : `; ${ts.succeeded} of ${count} SUCCEEDED, ${ts.started} started`}`);
process.exit(ok ? 0 : 1);
