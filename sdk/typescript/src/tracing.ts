/**
 * OpenTelemetry, when the application has `@opentelemetry/api` (an optional
 * peer dependency): the client puts the active span's W3C trace context
 * (`traceparent`, `tracestate`) in the headers of the jobs it enqueues, and
 * the worker runs each handler in a span continuing the trace in its job's
 * headers, as the Python runtime does (`docs/sdk-typescript.md`, "Tracing").
 *
 * The API is loaded with a dynamic `import()` at the first use, and a
 * failure to load it is quiet: without it nothing is traced and nothing
 * changes. Its types are used here only; nothing the SDK exports names them,
 * so an application without the package compiles as before.
 *
 * The headers are W3C trace context whatever propagators the application
 * registered (the API ships none: each SDK registers its own), so that a
 * worker in any language reads them: the two headers are written and read
 * here, as the W3C Trace Context recommendation gives them.
 */

import type * as OtelApi from "@opentelemetry/api";
import { Snooze } from "./errors.js";
import type { Job } from "./types.js";

type Api = typeof OtelApi;

/** A job's headers: names and values, at most this many bytes (UTF-8) in all. */
export const MAX_HEADERS_BYTES = 8192;
const TRACE_HEADERS = new Set(["traceparent", "tracestate"]);
/** Version 00: version, trace id, parent id, flags; a later version may add fields. */
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

let loading: Promise<Api | null> | null = null;

/** The OpenTelemetry API, or `null` when the application does not have it. */
function otel(): Promise<Api | null> {
  // A variable, so that TypeScript leaves the import alone and a bundler
  // does not try to resolve a package the application may lack.
  const name = "@opentelemetry/api";
  loading ??= (import(name) as Promise<Api>).then(
    (api) => (typeof api?.trace?.getSpanContext === "function" ? api : null),
    () => null,
  );
  return loading;
}

function headersSize(headers: Record<string, string>): number {
  let size = 0;
  for (const [name, value] of Object.entries(headers)) size += Buffer.byteLength(name) + Buffer.byteLength(value);
  return size;
}

/** *headers* with the active span's trace context added, for a job to
 * enqueue. Left as they are when no span is active, when they hold a trace
 * context of their own (`traceparent` or `tracestate`, in any case), or when
 * the context would take them over the cap: tracing never makes an enqueue
 * fail. */
export async function withTraceContext(
  headers: Record<string, string> | null | undefined,
): Promise<Record<string, string> | null | undefined> {
  const api = await otel();
  if (api === null) return headers;
  if (headers && Object.keys(headers).some((name) => TRACE_HEADERS.has(name.toLowerCase()))) return headers;
  const span = api.trace.getSpanContext(api.context.active());
  if (span === undefined || !api.isSpanContextValid(span)) return headers;
  const context: Record<string, string> = {
    traceparent: `00-${span.traceId}-${span.spanId}-${(span.traceFlags & 0xff).toString(16).padStart(2, "0")}`,
  };
  const state = span.traceState?.serialize();
  if (state) context.tracestate = state;
  const merged = { ...headers, ...context };
  return headersSize(merged) <= MAX_HEADERS_BYTES ? merged : headers;
}

/** The remote parent in *headers*, or the root context (a new trace). */
function parentOf(api: Api, headers: Record<string, string> | null): OtelApi.Context {
  const match = TRACEPARENT.exec(headers?.traceparent?.trim() ?? "");
  if (match === null) return api.ROOT_CONTEXT;
  const [, version, traceId, spanId, flags, rest] = match;
  if (version === "ff" || (version === "00" && rest !== undefined)) return api.ROOT_CONTEXT;
  const state = headers?.tracestate;
  let traceState: OtelApi.TraceState | undefined;
  try {
    traceState = state ? api.createTraceState(state) : undefined;
  } catch {
    traceState = undefined; // a malformed tracestate is dropped, the trace goes on
  }
  const parent: OtelApi.SpanContext = {
    traceId: traceId!,
    spanId: spanId!,
    traceFlags: parseInt(flags!, 16),
    isRemote: true,
    ...(traceState ? { traceState } : {}),
  };
  return api.isSpanContextValid(parent) ? api.trace.setSpanContext(api.ROOT_CONTEXT, parent) : api.ROOT_CONTEXT;
}

/** *run* (a job's handler) in a span: kind `CONSUMER`, named after the job's
 * kind, a child of the trace context in the job's headers (a new trace
 * without one), with the job's id, queue and attempt; what it throws is
 * recorded as the span's error. Just *run* without OpenTelemetry. */
export async function inHandlerSpan<T>(job: Job, run: () => Promise<T> | T): Promise<T> {
  const api = await otel();
  if (api === null) return await run();
  const tracer = api.trace.getTracer("qftrio");
  const options: OtelApi.SpanOptions = {
    kind: api.SpanKind.CONSUMER,
    attributes: { "qftrio.job.id": job.id, "qftrio.job.queue": job.queue, "qftrio.job.attempt": job.attempt },
  };
  return await tracer.startActiveSpan(job.kind, options, parentOf(api, job.headers), async (span) => {
    try {
      return await run();
    } catch (error) {
      if (error instanceof Snooze) {
        // "not now" is the handler's answer, not a failure
        span.setAttribute("qftrio.job.snoozed_secs", error.seconds);
        throw error;
      }
      const message = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
      span.recordException(error instanceof Error ? error : message);
      span.setStatus({ code: api.SpanStatusCode.ERROR, message });
      throw error;
    } finally {
      span.end();
    }
  });
}
