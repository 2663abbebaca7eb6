// ctx.progress() in runWorker against a real server: sent with a heartbeat
// within a second, the latest winning; bad values throw in the handler.

import { after, test } from "node:test";
import assert from "node:assert/strict";
import { runWorker, type JsonObject, type WorkerEvent } from "qftrio";
import { testServer, until, waitForJob } from "./server.js";

const server = await testServer();
const client = server.client;
after(() => server.stop());

test("ctx.progress() lands on the job within a second, the latest winning", async () => {
  const queue = "ts-progress";
  const drain = new AbortController();
  const events: WorkerEvent[] = [];
  let release!: () => void;
  const released = new Promise<void>((resolve) => (release = resolve));
  const errors: string[] = [];
  const done = runWorker(
    queue,
    {
      steps: async (_job, ctx) => {
        ctx.progress({ done: 1 });
        ctx.progress({ done: 2 });
        for (const bad of [{ blob: "x".repeat(9000) }, [1, 2] as unknown as JsonObject]) {
          try {
            ctx.progress(bad);
          } catch (error) {
            errors.push((error as Error).name);
          }
        }
        await released;
        return {};
      },
    },
    { client, handleSignals: false, signal: drain.signal, leaseSecs: 60, onEvent: (e) => events.push(e) },
  );
  const job = await client.enqueue("steps", {}, { queue });
  await until(events, (e) => e.type === "claimed" && e.jobId === job.id);
  const got = await waitForJob(client, job.id, (j) => j.progress !== null);
  assert.deepEqual(got.progress, { done: 2 });
  assert.ok(got.progress_at !== null);
  assert.deepEqual(errors, ["RangeError", "TypeError"]);
  release();
  const ended = await waitForJob(client, job.id, (j) => j.status === "completed");
  assert.deepEqual(ended.progress, { done: 2 });
  drain.abort();
  await done;
});

test("jobWait() answers the job once it ends, or as it stands at its timeout", async () => {
  const queue = "ts-wait";
  const job = await client.enqueue("steps", {}, { queue });
  const still = await client.jobWait(job.id, { timeoutSecs: 0.2 });
  assert.equal(still.status, "pending");
  const waiting = client.jobWait(job.id, { timeoutSecs: 60 });
  await client.jobCancel(job.id);
  assert.equal((await waiting).status, "cancelled");
});
