// Run by tracing.test.ts in a process of its own: @opentelemetry/api cannot
// be loaded here (a resolve hook refuses it), and a job is enqueued and run
// as ever. Prints the job's status and headers.

import { register } from "node:module";

register(
  "data:text/javascript," +
    encodeURIComponent(`export async function resolve(specifier, context, next) {
      if (specifier.startsWith("@opentelemetry/")) throw new Error("blocked: " + specifier);
      return next(specifier, context);
    }`),
);

const { Client, runWorker } = await import("qftrio");
const { waitForJob } = await import("./server.js");

const client = new Client(process.env.QFTRIO_TEST_URL!, "dev");
const job = await client.enqueue("plain", {}, { queue: "without-otel" });
const drain = new AbortController();
const done = runWorker("without-otel", { plain: async () => ({ ok: true }) }, {
  client,
  handleSignals: false,
  signal: drain.signal,
  waitSecs: 1,
});
const ended = await waitForJob(client, job.id);
drain.abort();
await done;
console.log(ended.status, JSON.stringify(ended.headers));
