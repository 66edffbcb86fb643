// A worker in a child process (the `worker-killed` scenario SIGKILLs it mid-handler). It
// prints `started <execution id> <attempt>` when a handler starts, then never finishes.
import sdk from "../dist/index.js";

const { KAIROS_ENDPOINT, KAIROS_API_KEY, KAIROS_CA, KAIROS_CERT, KAIROS_KEY, QUEUE } = process.env;
const tls = KAIROS_CA ? { ca: KAIROS_CA, cert: KAIROS_CERT, key: KAIROS_KEY, serverName: "localhost" } : undefined;
const client = new sdk.Client(KAIROS_ENDPOINT, { apiKey: KAIROS_API_KEY || undefined, tls });
const worker = new sdk.Worker(client, { queue: QUEUE, workerId: "child", concurrency: 1 });
worker.handle(QUEUE, (task) => {
  process.stdout.write(`started ${task.executionId} ${task.attempt}\n`);
  return new Promise(() => {});
});
worker.run().catch((e) => { console.error(`worker-child: ${e.message}`); process.exit(1); });
