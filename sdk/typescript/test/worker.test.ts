// runWorker in this process against a real server: outcomes, the abort
// signal, retried reports and heartbeats, and refusals (the rules every
// runtime keeps are tests/sdk_conformance/).

import { after, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import {
  ApiError,
  Client,
  ConfigError,
  PermanentError,
  RetryIn,
  Snooze,
  TransportError,
  runWorker,
  type Handler,
  type WorkerEvent,
  type WorkerOptions,
} from "qftrio";
import { closedPort, testServer, until, waitForJob } from "./server.js";

const server = await testServer();
const client = server.client;
after(() => server.stop());

/** A worker of *queue* in this process, drained by `stop()`. */
function start(queue: string, handlers: Record<string, Handler>, options: WorkerOptions = {}) {
  const drain = new AbortController();
  const events: WorkerEvent[] = [];
  const done = runWorker(queue, handlers, {
    client,
    handleSignals: false,
    signal: drain.signal,
    onEvent: (event) => events.push(event),
    ...options,
  });
  return {
    events,
    done,
    stop: () => {
      drain.abort();
      return done;
    },
  };
}

/** A client whose calls named in *failing* throw, as if the network were down. */
function faulty(failing: "completeMany" | "heartbeatMany"): Client {
  const broken = new Client(server.url, "dev");
  broken[failing] = async () => {
    throw new TransportError("injected: the network is down");
  };
  return broken;
}

const settled = (id: string) => (e: WorkerEvent) =>
  e.jobId === id && ["completed", "failed", "lost", "unreported"].includes(e.type);

test("a result completes a job; a throw is retried; PermanentError and unknown kinds fail at once", async () => {
  const [ok, flaky, perm, nope] = await client.enqueueMany([
    { kind: "ok", payload: { n: 7 }, config: { queue: "outcomes" } },
    { kind: "flaky", config: { queue: "outcomes", max_attempts: 3 } },
    { kind: "perm", config: { queue: "outcomes" } },
    { kind: "nope", config: { queue: "outcomes" } },
  ]);
  const worker = start("outcomes", {
    ok: async (job) => ({ n: job.payload.n ?? null }),
    flaky: async (job) => {
      if (job.attempt === 1) throw new Error("first try fails");
      return { attempt: job.attempt };
    },
    perm: () => {
      throw new PermanentError("bad payload");
    },
  });
  assert.deepEqual((await waitForJob(client, ok!.id)).result, { n: 7 });
  const retried = await waitForJob(client, flaky!.id);
  assert.deepEqual([retried.status, retried.attempt, retried.result], ["completed", 2, { attempt: 2 }]);
  assert.equal(retried.errors[0]!.error, "Error: first try fails");
  const permanent = await waitForJob(client, perm!.id);
  assert.deepEqual([permanent.status, permanent.attempt, permanent.error], ["failed", 1, "bad payload"]);
  const unknown = await waitForJob(client, nope!.id);
  assert.equal(unknown.status, "failed");
  assert.match(unknown.error!, /no handler for kind "nope" on this worker \(it handles: ok, flaky, perm\)/);
  await worker.stop();
  const failed = worker.events.filter((e) => e.type === "failed").map((e) => [e.kind, e.retryable]);
  assert.deepEqual(failed.sort(), [["flaky", true], ["nope", false], ["perm", false]]);
});

test("Snooze runs the job again without using its attempt; RetryIn fails it with the delay given", async () => {
  const [later, upstream] = await client.enqueueMany([
    { kind: "later", config: { queue: "snoozing", max_attempts: 1 } },
    { kind: "upstream", config: { queue: "snoozing", max_attempts: 2 } },
  ]);
  const worker = start("snoozing", {
    later: (job) => {
      if (job.attempt < 3) throw new Snooze(0);
      return { attempt: job.attempt };
    },
    upstream: (job) => {
      if (job.attempt === 1) throw new RetryIn(0, "upstream said 429");
      return {};
    },
  });
  const snoozed = await waitForJob(client, later!.id);
  assert.deepEqual([snoozed.status, snoozed.attempt, snoozed.max_attempts, snoozed.errors], ["completed", 3, 3, []]);
  const retried = await waitForJob(client, upstream!.id);
  assert.deepEqual([retried.status, retried.errors[0]!.error], ["completed", "upstream said 429"]);
  await worker.stop();
  assert.deepEqual(worker.events.filter((e) => e.type === "snoozed").map((e) => e.delaySecs), [0, 0]);
  const failed = worker.events.find((e) => e.type === "failed");
  assert.deepEqual([failed?.error, failed?.delaySecs], ["upstream said 429", 0]);
});

test("a result the server refuses fails the job without retry, saying why", async () => {
  const job = await client.enqueue("huge", {}, { queue: "refused" });
  const worker = start("refused", { huge: () => ({ blob: "x".repeat(1_100_000) }) });
  const done = await waitForJob(client, job.id);
  await worker.stop();
  assert.deepEqual([done.status, done.attempt, done.result], ["failed", 1, null]);
  assert.match(done.error!, /^the server refused the result: 413 payload_too_large/);
});

test("an error longer than the server takes is cut to it, saying so", async () => {
  const job = await client.enqueue("wordy", {}, { queue: "wordy", max_attempts: 1 });
  const worker = start("wordy", {
    wordy: () => {
      throw new Error("x".repeat(70_000));
    },
  });
  const done = await waitForJob(client, job.id);
  await worker.stop();
  assert.equal(done.error!.length, 65_536);
  assert.match(done.error!, /^Error: xxx[\s\S]*\n\[truncated: 70007 characters in all\]$/);
});

test("a lease asks for the free lanes only", async () => {
  await client.enqueueMany(Array.from({ length: 6 }, (_, n) => ({ kind: "slow", payload: { n }, config: { queue: "lanes" } })));
  const asked: number[] = [];
  const watched = new Client(server.url, "dev");
  const lease = watched.lease.bind(watched);
  watched.lease = (queue, request, options) => {
    asked.push(request?.max_jobs ?? 1);
    return lease(queue, request, options);
  };
  let running = 0;
  let most = 0;
  const worker = start("lanes", {
    slow: async (_job, ctx) => {
      most = Math.max(most, ++running);
      assert.ok(ctx.lane === 1 || ctx.lane === 2);
      await new Promise((resolve) => setTimeout(resolve, 20));
      running -= 1;
    },
  }, { client: watched, lanes: 2 });
  await until(worker.events, () => worker.events.filter((e) => e.type === "completed").length === 6);
  await worker.stop();
  assert.equal(most, 2);
  assert.equal(asked[0], 2);
  assert.ok(asked.every((n) => n === 1 || n === 2), `asked for ${asked}`);
});

test("cancelling a running job aborts its signal, and what its handler answers is never reported", async () => {
  const job = await client.enqueue("wait", {}, { queue: "cancel" });
  let reason: unknown;
  const worker = start("cancel", {
    wait: async (_job, ctx) => {
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
      reason = ctx.signal.reason;
      return { answered: "after the abort" }; // a handler that ignores the signal
    },
  }, { leaseSecs: 3 });
  await until(worker.events, (e) => e.type === "claimed" && e.jobId === job.id);
  await client.jobCancel(job.id);
  const lost = await until(worker.events, settled(job.id));
  await worker.stop(); // every report made has landed or been given up
  assert.equal(lost.type, "lost");
  assert.match(String(lost.error), /the job is cancelled/);
  assert.match(String(reason), /the job is cancelled/);
  const after = await client.jobGet(job.id);
  assert.deepEqual([after.status, after.result], ["cancelled", null]);
});

test("a job's timeout aborts its handler at the deadline and fails it with the server's text", async () => {
  const job = await client.enqueue("hang", {}, { queue: "timeout", timeout_secs: 1, max_attempts: 1 });
  let reason: unknown;
  let abortedAfter = NaN;
  const worker = start("timeout", {
    hang: async (_job, ctx) => {
      const started = performance.now();
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
      abortedAfter = performance.now() - started;
      reason = ctx.signal.reason;
      await new Promise(() => {}); // a handler that never ends: the report does not wait for it
    },
  }, { leaseSecs: 30 });
  const ended = await until(worker.events, settled(job.id));
  await worker.stop();
  // at the deadline, not when the 30 s lease would have run out
  assert.ok(abortedAfter < 5_000, `aborted after ${abortedAfter} ms`);
  assert.match(String(reason), /timed out after 1 s/);
  // the worker's report, or the server's janitor if it came first: the same end
  if (ended.type === "failed") assert.equal(ended.error, "timed out after 1 s");
  else assert.equal(ended.type, "lost");
  const after = await client.jobGet(job.id);
  assert.deepEqual([after.status, after.error], ["failed", "timed out after 1 s"]);
});

test("a report that cannot land is retried until the lease ends, then unreported", async () => {
  const job = await client.enqueue("quick", {}, { queue: "unreported" });
  const worker = start("unreported", { quick: () => ({ done: true }) }, { client: faulty("completeMany"), leaseSecs: 2 });
  const event = await until(worker.events, settled(job.id));
  await worker.stop();
  assert.equal(event.type, "unreported");
  assert.match(String(event.error), /injected: the network is down/);
  const after = await client.jobGet(job.id);
  assert.equal(after.result, null);
});

test("heartbeats that cannot land abort the handler before the lease ends, and a retryable fail lands", async () => {
  const job = await client.enqueue("long", {}, { queue: "expiring" });
  let aborted = false;
  const worker = start("expiring", {
    long: async (job, ctx) => {
      if (job.attempt > 1) return {};
      await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
      aborted = true;
      throw ctx.signal.reason;
    },
  }, { client: faulty("heartbeatMany"), leaseSecs: 5 }); // the fail has the last second to land
  const event = await until(worker.events, settled(job.id));
  await worker.stop();
  assert.ok(aborted);
  assert.deepEqual([event.type, event.retryable], ["failed", true]);
  assert.match(String(event.error), /^lease about to expire: heartbeats failed: injected/);
  const after = await client.jobGet(job.id);
  assert.match(after.errors[0]!.error, /lease about to expire/);
});

test("lease calls back off on transport errors, and a drain ends the wait", async () => {
  const closed = `http://127.0.0.1:${await closedPort()}`;
  const worker = start("down", { x: () => {} }, { client: new Client(closed, "dev") });
  await until(worker.events, () => worker.events.filter((e) => e.type === "waiting").length >= 2);
  await worker.stop();
  const delays = worker.events.filter((e) => e.type === "waiting").map((e) => e.delaySecs!);
  assert.ok(delays[0]! <= 0.5 && delays[1]! <= 1 && delays[1]! >= 0.5, `delays: ${delays}`);
  assert.match(String(worker.events[0]!.error), /ECONNREFUSED/);
});

test("a refused credential, or a URL that is not qftrio, stops the worker with one error", async () => {
  const events: WorkerEvent[] = [];
  const refused = await runWorker("q", { x: () => {} }, { url: server.url, token: "wrong", handleSignals: false, onEvent: (e) => events.push(e) }).catch((e: unknown) => e);
  assert.ok(refused instanceof ApiError);
  assert.deepEqual([refused.status, refused.code], [401, "unauthorized"]);
  assert.deepEqual(events.filter((e) => e.type === "waiting"), []);

  const other = createServer((_req, res) => res.writeHead(404, { "content-type": "text/html" }).end("<html>nope</html>"));
  await new Promise<void>((resolve) => other.listen(0, "127.0.0.1", resolve));
  const { port } = other.address() as { port: number };
  const notQftrio = await runWorker("q", { x: () => {} }, { url: `http://127.0.0.1:${port}`, token: "t", handleSignals: false }).catch((e: unknown) => e);
  other.close();
  assert.ok(notQftrio instanceof ApiError && notQftrio.status === 404, String(notQftrio));
  assert.match(notQftrio.message, /not qftrio's \(text\/html\)/);
});

test("bad options are one ConfigError at start", async () => {
  const cases: [string, unknown, WorkerOptions][] = [
    ["q", {}, { token: "t" }],
    ["q", { "bad kind": () => {} }, { token: "t" }],
    ["q", { x: "not a function" }, { token: "t" }],
    ["bad queue!", { x: () => {} }, { token: "t" }],
    ["q", { x: () => {} }, { token: "t", lanes: 0 }],
    ["q", { x: () => {} }, { token: "t", leaseSecs: 0 }],
    ["q", { x: () => {} }, { token: "t", waitSecs: 61 }],
    ["q", { x: () => {} }, { token: "t", workerId: "w".repeat(201) }],
    ["q", { x: () => {} }, { url: "not a url", token: "t" }],
    ["q", { x: () => {} }, { url: "http://127.0.0.1:1", token: "line\nbreak" }],
    ["q", { x: () => {} }, { url: "http://127.0.0.1:1" }],
    ["q", { x: () => {} }, { token: "t", leaseSec: 5 } as WorkerOptions],
  ];
  for (const [queue, handlers, options] of cases) {
    await assert.rejects(
      runWorker(queue, handlers as Record<string, Handler>, { handleSignals: false, ...options }),
      ConfigError,
      JSON.stringify([queue, Object.keys(handlers as object), options]),
    );
  }
});
