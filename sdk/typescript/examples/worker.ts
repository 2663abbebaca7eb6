import { hostname } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { runWorker, type Job, type JobContext, type JsonObject } from "qftrio";

// A worker for the queue "jobs". Start as many copies as you like, on as
// many machines as you like: they share the queue, and when one dies, the
// others finish its jobs once its leases run out.

// Your job goes here. It can run more than once (a worker can die after doing
// the work but before reporting it), so pass job.id to external services as an
// idempotency key. Stop when `ctx.signal` aborts: the job is no longer yours,
// or its lease is about to end.
export async function work(job: Job, ctx: JobContext): Promise<JsonObject> {
  await sleep(1_000 + Math.random() * 2_000, undefined, { signal: ctx.signal }); // Pretend to call an API.
  return { handledBy: job.worker_id, attempt: job.attempt };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  // The first Ctrl+C or SIGTERM stops leasing and finishes held jobs; a
  // second quits at once (their leases expire and other workers take over).
  const time = () => new Date().toTimeString().slice(0, 8);
  await runWorker(process.env.WORKER_QUEUE ?? "jobs", { work }, {
    url: process.env.QFTRIO_URL ?? "http://127.0.0.1:8000",
    token: process.env.QFTRIO_WORKER_TOKEN ?? "dev",
    workerId: process.env.WORKER_ID ?? `${hostname()}-${process.pid}`,
    lanes: Number(process.env.WORKER_LANES ?? 4),
    leaseSecs: Number(process.env.WORKER_LEASE_SECS ?? 10),
    onEvent: (event) =>
      console.log(time(), ...[event.lane && `lane ${event.lane}:`, event.type, event.jobId, event.error].filter(Boolean)),
  }).catch((error: unknown) => {
    console.error(`worker stopped: ${error instanceof Error ? error.message : String(error)}`);
    process.exit(2);
  });
}
