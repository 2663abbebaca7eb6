// The client's calls against a real server: every method once, and the
// errors a caller branches on.

import { after, test } from "node:test";
import assert from "node:assert/strict";
import { ApiError, Client, ConfigError, TransportError } from "qftrio";
import { closedPort, testServer } from "./server.js";

const server = await testServer();
const client = server.client;
after(() => server.stop());

test("the application API: enqueue, read, list, cancel, retry, queues, bulk", async () => {
  const job = await client.enqueue("resize", { src: "a.png" }, { queue: "api", priority: 3, max_attempts: 2 });
  assert.equal(job.status, "pending");
  assert.deepEqual([job.queue, job.kind, job.priority, job.max_attempts], ["api", "resize", 3, 2]);
  assert.deepEqual((await client.jobGet(job.id)).payload, { src: "a.png" });

  const again = await client.enqueue("resize", {}, { queue: "api", idempotency_key: "k1" });
  assert.equal((await client.enqueue("resize", {}, { queue: "api", idempotency_key: "k1" })).id, again.id);
  const many = await client.enqueueMany([
    { kind: "a", config: { queue: "api" } },
    { kind: "b", payload: { n: 1 }, config: { queue: "api" } },
  ]);
  assert.deepEqual(many.map((j) => j.kind), ["a", "b"]);

  const first = await client.jobsList({ queue: "api", limit: 2 });
  assert.equal(first.jobs.length, 2);
  assert.ok(first.next_cursor);
  const rest = await client.jobsList({ queue: "api", cursor: first.next_cursor });
  assert.equal(first.jobs.length + rest.jobs.length, 4);
  assert.equal(rest.next_cursor, null);

  assert.equal((await client.jobCancel(job.id)).status, "cancelled");
  const conflict = await client.jobCancel(job.id).catch((e: unknown) => e);
  assert.ok(conflict instanceof ApiError);
  assert.deepEqual([conflict.status, conflict.code], [409, "conflict"]);
  assert.equal((await client.jobRetry(job.id)).status, "pending");

  const stats = await client.queueStats("api");
  assert.equal(stats.counts.pending, 4);
  assert.equal((await client.queuePause("api")).paused, true);
  assert.equal((await client.queues()).find((q) => q.queue === "api")?.paused, true);
  assert.equal((await client.queueResume("api")).paused, false);
  assert.equal(await client.jobsBulk("cancel", { queue: "api", kind: "a" }), 1);
  assert.equal(await client.jobsBulk("retry", { queue: "api", status: "cancelled" }), 1);
  assert.equal(await client.jobsBulk("delete", { queue: "api", status: "completed" }), 0);
  assert.equal((await client.health()).status, "ok");
});

test("the worker protocol: lease, heartbeat, complete, fail, and their batch forms", async () => {
  const [a, b, c] = await client.enqueueMany(["a", "b", "c"].map((kind) => ({ kind, config: { queue: "proto" } })));
  const leases = await client.lease("proto", { max_jobs: 3, lease_secs: 30, worker_id: "ts-1" });
  assert.deepEqual(leases.map((l) => l.job.id), [a!.id, b!.id, c!.id]);
  assert.ok(leases.every((l) => l.job.status === "running" && l.job.worker_id === "ts-1"));
  const [la, lb, lc] = leases;

  const beat = await client.heartbeat(la!.job.id, la!.lease_token, 30);
  assert.equal(beat.status, "running");
  assert.ok(beat.locked_until);
  const beats = await client.heartbeatMany([
    { id: lb!.job.id, lease_token: lb!.lease_token, extend_secs: 30 },
    { id: lc!.job.id, lease_token: "stale", extend_secs: 30 },
  ]);
  assert.deepEqual(beats.map((r) => [r.code, r.status ?? null]), [[200, "running"], [409, null]]);
  const worker = (await client.workers()).find((w) => w.worker_id === "ts-1");
  assert.deepEqual([worker?.jobs, worker?.queues], [3, ["proto"]]);

  await client.complete(la!.job.id, la!.lease_token, { ok: true });
  await client.complete(la!.job.id, la!.lease_token, { ok: true }); // a replay changes nothing
  const stale = await client.fail(la!.job.id, "not-the-token", "boom").catch((e: unknown) => e);
  assert.ok(stale instanceof ApiError);
  assert.deepEqual([stale.status, stale.code], [409, "lease_lost"]);
  await client.fail(lb!.job.id, lb!.lease_token, "no", false);
  const done = await client.completeMany([{ id: lc!.job.id, lease_token: lc!.lease_token, result: { n: 3 } }]);
  assert.deepEqual(done.map((r) => r.code), [204]);
  const late = await client.failMany([{ id: lc!.job.id, lease_token: lc!.lease_token, error: "x" }]);
  assert.deepEqual(late.map((r) => r.code), [409]);

  assert.deepEqual((await client.jobGet(la!.job.id)).result, { ok: true });
  assert.equal((await client.jobGet(lb!.job.id)).status, "failed");
  assert.deepEqual((await client.jobGet(lc!.job.id)).result, { n: 3 });
  assert.deepEqual(await client.lease("proto"), []);
});

test("workflows: create, read, list, cancel", async () => {
  const flow = await client.workflowCreate(
    "pipeline",
    [
      { name: "fetch", kind: "fetch" },
      { name: "resize", kind: "resize", depends_on: ["fetch"] },
    ],
    { context: { src: "a.png" } },
  );
  assert.equal(flow.status, "running");
  assert.deepEqual(flow.steps.map((s) => [s.name, s.status]), [["fetch", "pending"], ["resize", "waiting"]]);
  assert.equal((await client.workflowGet(flow.id)).context.src, "a.png");
  assert.ok((await client.workflowsList({ status: "running" })).workflows.some((w) => w.id === flow.id));
  assert.equal((await client.workflowCancel(flow.id)).status, "cancelled");
  const cycle = await client.workflowCreate("bad", [{ name: "x", kind: "x", depends_on: ["x"] }]).catch((e: unknown) => e);
  assert.ok(cycle instanceof ApiError && cycle.status === 422, String(cycle));
});

test("schedules: set, read, list, pause, resume, trigger, delete", async () => {
  const job = { kind: "report", payload: { n: 1 }, config: { queue: "cron" } };
  const set = await client.scheduleSet("nightly", { cron: "30 2 * * *", timezone: "Europe/Paris", job });
  assert.deepEqual([set.name, set.timezone, set.catch_up, set.last_run_at], ["nightly", "Europe/Paris", "latest", null]);
  assert.equal((await client.scheduleGet("nightly")).next_run_at, set.next_run_at);
  assert.deepEqual((await client.schedulesList()).schedules.map((s) => s.name), ["nightly"]);
  assert.equal((await client.schedulePause("nightly")).next_run_at, null);
  assert.equal((await client.scheduleResume("nightly")).paused, false);
  const triggered = await client.scheduleTrigger("nightly");
  assert.deepEqual([triggered.job.schedule, triggered.schedule.last_job_id], ["nightly", triggered.job.id]);
  await client.scheduleDelete("nightly");
  const gone = await client.scheduleGet("nightly").catch((e: unknown) => e);
  assert.ok(gone instanceof ApiError && gone.status === 404);
  const bad = await client.scheduleSet("x", { cron: "61 * * * *", job }).catch((e: unknown) => e);
  assert.ok(bad instanceof ApiError && bad.status === 422 && bad.message.includes("cron"));
});

test("errors carry the status and the code, and name the field", async () => {
  const missing = await client.jobGet("00000000-0000-7000-8000-000000000000").catch((e: unknown) => e);
  assert.ok(missing instanceof ApiError);
  assert.deepEqual([missing.status, missing.code], [404, "not_found"]);

  const invalid = await client.enqueue("bad kind!").catch((e: unknown) => e);
  assert.ok(invalid instanceof ApiError);
  assert.deepEqual([invalid.status, invalid.code], [422, "invalid"]);
  assert.match(invalid.message, /kind/);

  const unknown = await new Client(server.url, "not-a-token").jobsList().catch((e: unknown) => e);
  assert.ok(unknown instanceof ApiError);
  assert.deepEqual([unknown.status, unknown.code], [401, "unauthorized"]);
  // A path parameter stays one segment: no climbing to another route.
  const climb = await client.jobGet("../queues").catch((e: unknown) => e);
  assert.ok(climb instanceof ApiError && climb.status === 404);
});

test("a server that cannot be reached is a TransportError", async () => {
  const port = await closedPort();
  const error = await new Client(`http://127.0.0.1:${port}`, "dev").health().catch((e: unknown) => e);
  assert.ok(error instanceof TransportError, String(error));
  assert.match(error.message, /ECONNREFUSED/);
  const leased = await new Client(`http://127.0.0.1:${port}`, "dev").lease("images").catch((e: unknown) => e);
  assert.ok(leased instanceof TransportError, String(leased));
  assert.match(leased.message, new RegExp(`^POST http://127\\.0\\.0\\.1:${port}/api/v1/queues/images/lease: ECONNREFUSED`));
});

test("a bad URL or token is a ConfigError at once", () => {
  for (const url of ["not a url", "ftp://host", "http://host/?q=1", ""]) {
    assert.throws(() => new Client(url, "t"), ConfigError, url);
  }
  for (const token of ["a\nb", " padded", "é"]) {
    assert.throws(() => new Client("http://127.0.0.1:1", token), ConfigError);
  }
  assert.equal(new Client({ url: "http://127.0.0.1:1/", token: "t" }).url, "http://127.0.0.1:1");
});
