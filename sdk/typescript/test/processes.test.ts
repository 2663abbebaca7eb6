// The example worker (examples/worker.ts) as real processes: killed, frozen,
// and stopped by signals, as the pool guide's drills do by hand.

import { after, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { testServer, stopChild, waitForJob } from "./server.js";

const EXAMPLE = fileURLToPath(new URL("../examples/worker.js", import.meta.url));
const server = await testServer();
const client = server.client;
const children: ChildProcess[] = [];
after(async () => {
  await Promise.all(children.map(stopChild));
  await server.stop();
});

interface Worker {
  child: ChildProcess;
  /** Its output so far. */
  output(): string;
  /** Until its output matches *pattern* (at most *capMs*); answers the match. */
  waitFor(pattern: RegExp, capMs?: number): Promise<RegExpMatchArray>;
  exited: Promise<number | null>;
}

/** `node examples/worker.js` with one lane and short leases, on *queue*.
 * (A lease of a few seconds: renewals every half of it must land within
 * the last fifth, even on a busy machine.) */
function worker(id: string, queue: string, leaseSecs = 4): Worker {
  const child = spawn(process.execPath, [EXAMPLE], {
    env: {
      ...process.env,
      QFTRIO_URL: server.url,
      QFTRIO_WORKER_TOKEN: "dev",
      WORKER_QUEUE: queue,
      WORKER_ID: id,
      WORKER_LANES: "1",
      WORKER_LEASE_SECS: String(leaseSecs),
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.push(child);
  let text = "";
  const listeners = new Set<() => void>();
  const read = (chunk: Buffer) => {
    text += chunk.toString();
    listeners.forEach((listener) => listener());
  };
  child.stdout!.on("data", read);
  child.stderr!.on("data", read);
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  return {
    child,
    exited,
    output: () => text,
    waitFor(pattern, capMs = 30_000) {
      return new Promise((resolve, reject) => {
        const cap = setTimeout(() => reject(new Error(`${id}: no ${pattern} after ${capMs} ms:\n${text}`)), capMs);
        const check = () => {
          const match = text.match(pattern);
          if (match) {
            listeners.delete(check);
            clearTimeout(cap);
            resolve(match);
          }
        };
        listeners.add(check);
        void exited.then(() => {
          clearTimeout(cap);
          reject(new Error(`${id} exited before ${pattern}:\n${text}`));
        });
        check();
      });
    },
  };
}

test("kill a worker: the job it held completes on the other with attempt 2", async () => {
  const alpha = worker("alpha", "drill");
  const held = await client.enqueue("work", {}, { queue: "drill" });
  await alpha.waitFor(new RegExp(`claimed ${held.id}`));
  const beta = worker("beta", "drill");
  alpha.child.kill("SIGKILL"); // no clean shutdown: its lease must run out
  const job = await waitForJob(client, held.id);
  assert.equal(job.status, "completed");
  assert.equal(job.attempt, 2);
  assert.deepEqual(job.result, { handledBy: "beta", attempt: 2 });
  assert.equal(job.errors[0]!.error, "lease expired");
  beta.child.kill("SIGTERM");
  assert.equal(await beta.exited, 0);
});

test("a frozen worker that wakes after its lease changes nothing", async () => {
  const alpha = worker("alpha", "freeze");
  const job = await client.enqueue("work", {}, { queue: "freeze" });
  await alpha.waitFor(new RegExp(`claimed ${job.id}`));
  alpha.child.kill("SIGSTOP");
  const beta = worker("beta", "freeze");
  const done = await waitForJob(client, job.id);
  assert.deepEqual(done.result, { handledBy: "beta", attempt: 2 });
  alpha.child.kill("SIGCONT");
  // Its lease ran out while it slept: its outcome is given up or refused, never recorded.
  await alpha.waitFor(new RegExp(`(unreported|lost) ${job.id}`));
  assert.doesNotMatch(alpha.output(), new RegExp(`completed ${job.id}`));
  assert.deepEqual((await client.jobGet(job.id)).result, { handledBy: "beta", attempt: 2 });
  alpha.child.kill("SIGTERM");
  beta.child.kill("SIGTERM");
  assert.deepEqual([await alpha.exited, await beta.exited], [0, 0]);
});

test("a second SIGINT quits at once, reporting nothing", async () => {
  const alpha = worker("alpha", "quit", 10);
  const job = await client.enqueue("work", {}, { queue: "quit" });
  await alpha.waitFor(new RegExp(`claimed ${job.id}`));
  alpha.child.kill("SIGINT");
  await alpha.waitFor(/stopping/);
  alpha.child.kill("SIGINT");
  assert.equal(await alpha.exited, 130);
  // The handler (one to three seconds) had not finished: the job stays
  // running until its lease runs out, and then runs elsewhere.
  const after = await client.jobGet(job.id);
  assert.deepEqual([after.status, after.worker_id], ["running", "alpha"]);
});
