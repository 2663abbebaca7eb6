// The event stream, read by `Client.events()` against a real server: a
// job's changes in order, the stats, a refusal, and the end of the stream
// when the loop leaves.

import { after, test } from "node:test";
import assert from "node:assert/strict";
import { ApiError, type StreamEvent } from "qftrio";
import { testServer } from "./server.js";

const server = await testServer();
const client = server.client;
after(() => server.stop());

test("events(): a job's changes in order, and stats, until the loop leaves", async () => {
  const seen: StreamEvent[] = [];
  let job: { id: string } | undefined;
  for await (const event of client.events({ queue: "ts-events", stats_secs: 1 })) {
    seen.push(event);
    // The first stats say the stream is open: a change made now is on it.
    if (event.event === "stats" && !job) {
      job = await client.enqueue("watched", {}, { queue: "ts-events" });
      await client.jobCancel(job.id);
    }
    if (event.event === "job" && event.data.status === "cancelled") break;
  }
  const changes = seen.flatMap((e) => (e.event === "job" ? [[e.data.id, e.data.status, e.data.queue]] : []));
  assert.deepEqual(changes, [
    [job!.id, "pending", "ts-events"],
    [job!.id, "cancelled", "ts-events"],
  ]);
  assert.ok(seen.every((e) => e.event !== "stats" || e.data.queue === "ts-events"));
});

test("events(): a filter out of range is the server's 422, naming it", async () => {
  const refused = await client.events({ stats_secs: 0 }).next().catch((e: unknown) => e);
  assert.ok(refused instanceof ApiError);
  assert.equal(refused.status, 422);
  assert.match(refused.message, /stats_secs/);
});
