/**
 * The TypeScript runtime's conformance adapter (tests/sdk_conformance/ADAPTER.md):
 * `runWorker` with its own signal handling on the queue the environment
 * names, printing the contract's events on standard output.
 */

import { setTimeout as sleep } from "node:timers/promises";
import { PermanentError, RetryIn, Snooze, runWorker, type Handler, type Job, type JobContext, type JsonObject } from "qftrio";

function say(event: string, fields: Record<string, unknown> = {}): void {
  process.stdout.write(JSON.stringify({ event, ...fields }) + "\n");
}

function started(job: Job): void {
  say("started", { job: job.id, kind: job.kind, attempt: job.attempt, headers: job.headers ?? {} });
}

function payload(job: Job): Record<string, unknown> {
  return (job.payload ?? {}) as Record<string, unknown>;
}

/** Wait *secs*, or until the job's signal is aborted: then say so and end. */
async function waitOrAbort(job: Job, ctx: JobContext, secs: number): Promise<void> {
  try {
    await sleep(secs * 1000, undefined, { signal: ctx.signal });
  } catch (error) {
    if (!ctx.signal.aborted) throw error;
    say("aborted", { job: job.id });
    throw error;
  }
}

/** A handler that prints `started`, runs *body*, and prints `returned` when
 * the body ends by itself (not after `aborted`). */
function handler(body: (job: Job, ctx: JobContext) => Promise<JsonObject | void>): Handler {
  return async (job, ctx) => {
    started(job);
    let aborted = false;
    try {
      return await body(job, ctx);
    } catch (error) {
      aborted = ctx.signal.aborted;
      throw error;
    } finally {
      if (!aborted) say("returned", { job: job.id });
    }
  };
}

const handlers: Record<string, Handler> = {
  echo: handler(async (job) => ({ echo: job.payload })),
  sleep: handler(async (job, ctx) => {
    const secs = payload(job).secs as number;
    await waitOrAbort(job, ctx, secs);
    return { slept: secs };
  }),
  fail: handler(async (job) => {
    throw new Error(payload(job).message as string);
  }),
  permanent: handler(async (job) => {
    throw new PermanentError(payload(job).message as string);
  }),
  snooze: handler(async (job) => {
    throw new Snooze(payload(job).secs as number);
  }),
  retry_in: handler(async (job) => {
    throw new RetryIn(payload(job).secs as number, payload(job).message as string);
  }),
  progress: handler(async (job, ctx) => {
    ctx.progress(payload(job).progress as JsonObject);
    await waitOrAbort(job, ctx, payload(job).then_secs as number);
    return {};
  }),
  headers: handler(async (job) => ({ headers: job.headers ?? {} })),
};

const env = process.env;
say("ready");
try {
  await runWorker(env.ADAPTER_QUEUE!, handlers, {
    url: env.QFTRIO_URL!,
    token: env.QFTRIO_TOKEN!,
    lanes: Number(env.ADAPTER_LANES),
    leaseSecs: Number(env.ADAPTER_LEASE_SECS),
    waitSecs: Number(env.ADAPTER_WAIT_SECS),
    workerId: env.ADAPTER_WORKER_ID!,
  });
  say("stopped", { error: null });
  process.exitCode = 0;
} catch (error) {
  say("stopped", { error: error instanceof Error ? `${error.name}: ${error.message}` : String(error) });
  process.exitCode = 2;
}
