// Tracing with @opentelemetry/api present (a dev dependency here; an optional
// peer dependency of the package): the client carries the active span's
// trace context in the jobs it enqueues, and runWorker runs each handler in
// a span continuing it, against a real server. Spans are read from the
// SDK's in-memory exporter. Each test file runs in a process of its own, so
// the providers registered here reach no other file.

import { after, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { SpanKind, SpanStatusCode, context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from "@opentelemetry/sdk-trace-base";
import { runWorker, type Handler, type Job } from "qftrio";
import { testServer, waitForJob } from "./server.js";

const server = await testServer();
const client = server.client;
after(() => server.stop());

context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
const exporter = new InMemorySpanExporter();
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
const tracer = trace.getTracer("test");

/** *enqueue* inside a span of its own, and that span. */
async function inSpan<T>(enqueue: () => Promise<T>): Promise<[T, ReadableSpan]> {
  let id = "";
  const result = await tracer.startActiveSpan("request", async (span) => {
    id = span.spanContext().spanId;
    try {
      return await enqueue();
    } finally {
      span.end();
    }
  });
  return [result, exporter.getFinishedSpans().find((s) => s.spanContext().spanId === id)!];
}

/** Run *handlers* on *queue* until every job of *ids* has ended. */
async function work(queue: string, handlers: Record<string, Handler>, ids: string[]): Promise<Job[]> {
  const drain = new AbortController();
  const done = runWorker(queue, handlers, { client, handleSignals: false, signal: drain.signal, waitSecs: 1 });
  try {
    return await Promise.all(ids.map((id) => waitForJob(client, id)));
  } finally {
    drain.abort();
    await done;
  }
}

const handlerSpan = (job: Job) => exporter.getFinishedSpans().find((s) => s.attributes["qftrio.job.id"] === job.id)!;

test("one trace from the enqueuing span to the handler's span, through the server", async () => {
  const [[traced, many], request] = await inSpan(async () => [
    await client.enqueue("traced", { n: 1 }, { queue: "tracing", headers: { "x-app": "shop" } }),
    await client.enqueueMany([{ kind: "traced", config: { queue: "tracing" } }]),
  ] as const);
  const { traceId, spanId } = request.spanContext();
  assert.deepEqual(traced.headers, { "x-app": "shop", traceparent: `00-${traceId}-${spanId}-01` });
  assert.equal(many[0]!.headers!.traceparent, `00-${traceId}-${spanId}-01`);
  const untraced = await client.enqueue("traced", {}, { queue: "tracing" });
  assert.equal(untraced.headers, null, "no span active: no headers");

  const seen: Array<string | undefined> = [];
  await work("tracing", { traced: async () => void seen.push(trace.getActiveSpan()?.spanContext().traceId) }, [
    traced.id,
    many[0]!.id,
    untraced.id,
  ]);
  for (const job of [traced, many[0]!]) {
    const span = handlerSpan(job);
    assert.equal(span.name, "traced");
    assert.equal(span.kind, SpanKind.CONSUMER);
    assert.equal(span.spanContext().traceId, traceId);
    assert.equal(span.parentSpanContext?.spanId, spanId);
    assert.equal(span.parentSpanContext?.isRemote, true);
    assert.deepEqual(span.attributes, { "qftrio.job.id": job.id, "qftrio.job.queue": "tracing", "qftrio.job.attempt": 1 });
    assert.equal(span.status.code, SpanStatusCode.UNSET);
  }
  // A job enqueued outside any span starts a trace of its own.
  const own = handlerSpan(untraced);
  assert.notEqual(own.spanContext().traceId, traceId);
  assert.equal(own.parentSpanContext, undefined);
  // The handler runs with its span active: its own spans are children.
  assert.deepEqual(seen.filter((id) => id === traceId).length, 2);
});

test("a throwing handler's span records the error; the caller's trace headers are kept", async () => {
  const mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  const [[broken, kept], request] = await inSpan(async () => [
    await client.enqueue("broken", {}, { queue: "tracing-errors", max_attempts: 1 }),
    await client.enqueue("kept", {}, { queue: "tracing-errors", headers: { traceparent: mine } }),
  ] as const);
  assert.deepEqual(kept.headers, { traceparent: mine });
  const [failed] = await work(
    "tracing-errors",
    {
      broken: async () => {
        throw new Error("no such image");
      },
      kept: async () => ({}),
    },
    [broken.id, kept.id],
  );
  assert.equal(failed!.status, "failed");
  const span = handlerSpan(broken);
  assert.equal(span.spanContext().traceId, request.spanContext().traceId);
  assert.deepEqual(span.status, { code: SpanStatusCode.ERROR, message: "Error: no such image" });
  assert.equal(span.events[0]!.name, "exception");
  assert.equal(span.events[0]!.attributes!["exception.message"], "no such image");
  // The caller's own traceparent is the one continued.
  assert.equal(handlerSpan(kept).spanContext().traceId, "0af7651916cd43dd8448eb211c80319c");
  assert.equal(handlerSpan(kept).parentSpanContext?.spanId, "b7ad6b7169203331");
});

test("without @opentelemetry/api the client and the worker run as before", () => {
  // A process in which the package cannot be loaded: enqueue and run a job.
  const script = fileURLToPath(new URL("./without-otel.js", import.meta.url));
  const done = spawnSync(process.execPath, [script], {
    env: { ...process.env, QFTRIO_TEST_URL: server.url },
    encoding: "utf8",
    timeout: 60_000,
  });
  assert.equal(done.status, 0, done.stdout + done.stderr);
  assert.match(done.stdout, /^completed null$/m);
});
