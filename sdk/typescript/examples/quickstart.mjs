import { Client, Worker } from "@kairos/sdk";

const client = new Client(process.env.KAIROS_ENDPOINT ?? "http://127.0.0.1:7071"); // `kairos dev`'s gRPC port
await client.applyDefinition(`
name: greet
version: 1
inputs:
  name: string
execution: {type: typescript}
`);

const worker = new Worker(client, { queue: "greet", concurrency: 16 });
worker.handle("greet", async (task) => ({ greeting: `hello, ${task.inputs.name}` }));
const running = worker.run();

const { executionId, executeAtMs } = await client.submit("greet", { inputs: { name: "Ada" }, afterMs: 1_000 });
const done = await client.wait(executionId, 30_000);
console.log(done.status, JSON.parse(done.outputJson), `due ${new Date(Number(executeAtMs)).toISOString()}`);

await worker.stop(); // takes no more work, lets running handlers finish and report
await running;
client.close();
