// ctx.addSteps() in runWorker against a real server: a step fans out a PDF's
// pages, and the step that waited for it sees every thumbnail, in page order.

import { after, test } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { ApiError, runWorker, type Workflow } from "qftrio";
import { testServer } from "./server.js";

const server = await testServer();
const client = server.client;
after(() => server.stop());

async function finished(id: string): Promise<Workflow> {
  const end = Date.now() + 30_000; // the wait is bounded by the work; the cap turns a hang into a failure
  for (;;) {
    const workflow = await client.workflowGet(id);
    if (workflow.status !== "running") return workflow;
    if (Date.now() > end) throw new Error(`workflow ${id} still running after 30 s`);
    await sleep(50);
  }
}

test("ctx.addSteps() fans out, and the waiting step fans in every result in the order added", async () => {
  const drain = new AbortController();
  const refused: number[] = [];
  const done = runWorker(
    "default",
    {
      "ts-split": async (job, ctx) => {
        const pages = Array.from({ length: 30 }, (_, n) => ({ name: `page-${n}`, kind: "ts-thumb", payload: { page: n } }));
        const grown = await ctx.addSteps(pages, { collect: "thumbs" });
        assert.equal(grown.steps.length, 32);
        await ctx.addSteps(pages, { collect: "thumbs" }); // a repeat changes nothing
        const taken = await ctx.addSteps([{ name: "page-0", kind: "other" }]).catch((e: unknown) => e);
        if (taken instanceof ApiError) refused.push(taken.status);
        return { pages: pages.length, pdf: job.payload.pdf as string };
      },
      "ts-thumb": async (job) => ({ url: `thumbs/${job.payload.page as number}.png` }),
      "ts-zip": async (job) => ({ zipped: (job.context!.thumbs as { url: string }[]).map((t) => t.url) }),
    },
    { client, handleSignals: false, signal: drain.signal, lanes: 4, leaseSecs: 30 },
  );
  const flow = await client.workflowCreate("ts-pdf", [
    { name: "split", kind: "ts-split", payload: { pdf: "report.pdf" } },
    { name: "zip", kind: "ts-zip", depends_on: ["split"] },
  ]);
  const ended = await finished(flow.id);
  drain.abort();
  await done;
  assert.equal(ended.status, "completed");
  assert.deepEqual(refused, [409]);
  assert.deepEqual(ended.context.zipped, Array.from({ length: 30 }, (_, n) => `thumbs/${n}.png`));
  assert.deepEqual(
    ended.steps.map((s) => s.added_by),
    [null, null, ...Array(30).fill("split")],
  );
});

test("client.stepsAdd() with a stale token is a 409 and adds nothing", async () => {
  const flow = await client.workflowCreate("ts-stale", [{ name: "only", kind: "ts-nobody" }]);
  const error = await client.stepsAdd(flow.steps[0]!.job_id!, "not-the-token", [{ name: "x", kind: "k" }]).catch((e: unknown) => e);
  assert.ok(error instanceof ApiError && error.status === 409, String(error));
  assert.equal((await client.workflowGet(flow.id)).steps.length, 1);
  await client.workflowCancel(flow.id);
});
