/**
 * The HTTP client: a method per route, named as the Python `qftrio.Client`'s
 * in camelCase. Bodies and answers are the wire's (`docs/protocol.md`).
 *
 *     const client = new Client("http://127.0.0.1:8000", token);
 *     const job = await client.enqueue("resize-image", { src: "a.png" }, { queue: "images" });
 *
 * An error answer throws `ApiError` (`status`, `code`); no answer (refused,
 * broken, timed out) throws `TransportError`; an answer that is not qftrio's
 * throws `UnexpectedAnswer`. A failed call is never sent again by the client.
 */

import { ApiError, ConfigError, TransportError, UnexpectedAnswer } from "./errors.js";
import { ROUTES, type RouteName } from "./routes.js";
import { withTraceContext } from "./tracing.js";
import type {
  BulkFilter,
  CompleteItem,
  EnqueueRequest,
  EventsFilter,
  FailItem,
  FailRequest,
  SnoozeItem,
  Health,
  HeartbeatAnswer,
  HeartbeatItem,
  Job,
  JobConfig,
  JobsFilter,
  JobsPage,
  JsonObject,
  Lease,
  LeaseRequest,
  QueueStats,
  QueuesAnswer,
  QueuesFilter,
  RateLimit,
  ReportResult,
  Schedule,
  ScheduleRequest,
  SchedulesFilter,
  SchedulesPage,
  ScheduleTriggered,
  StreamEvent,
  WorkerInfo,
  Workflow,
  WorkflowStepRequest,
  WorkflowsFilter,
  WorkflowsPage,
} from "./types.js";

export interface ClientOptions {
  url: string;
  /** A worker token (protocol calls) or a tenant token (the application
   * API); none sends no credential. */
  token?: string | null;
  /** Milliseconds allowed for each call (a long poll gets its `wait_secs`
   * on top). Default 10 s. */
  timeoutMs?: number;
}

/** Options of one call. */
export interface CallOptions {
  /** Aborts the call: it rejects with the signal's reason. */
  signal?: AbortSignal;
}

type Query = Record<string, string | number | undefined | null>;

/** A path parameter as one path segment: `.` and `..` too, so that nothing
 * climbs to another route. */
function segment(value: string): string {
  const text = encodeURIComponent(value);
  return text === "." || text === ".." ? text.replaceAll(".", "%2E") : text;
}

function checkUrl(url: unknown): string {
  if (typeof url !== "string") throw new ConfigError(`not a usable server URL: ${String(url)}`);
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new ConfigError(`not a usable server URL: ${JSON.stringify(url)}`);
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new ConfigError(`not a usable server URL: ${JSON.stringify(url)} (not http:// or https://)`);
  }
  if (parsed.search || parsed.hash || parsed.username || parsed.password) {
    throw new ConfigError(`not a usable server URL: ${JSON.stringify(url)} (no query, fragment or user info)`);
  }
  return parsed.href.replace(/\/+$/, "");
}

function checkToken(token: unknown): string | null {
  if (token === undefined || token === null || token === "") return null;
  // A header value: printable ASCII, no surrounding spaces (and never shown).
  if (typeof token !== "string" || !/^[\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?$/.test(token)) {
    throw new ConfigError(
      "the token cannot be sent: use printable ASCII without a line break or surrounding spaces",
    );
  }
  return token;
}

/** The first line of *text*, at most *limit* characters: an answer may be a whole page. */
export function oneLine(text: string, limit = 200): string {
  const line = text.trim().split("\n", 1)[0]!.trim();
  return line.length <= limit ? line : `${line.slice(0, limit - 3)}...`;
}

function describeFetchError(error: unknown): string {
  // undici's "fetch failed" says nothing; its cause names the reason.
  const cause = (error as { cause?: { code?: string; message?: string } }).cause;
  if (cause?.code) return `${cause.code}${cause.message ? ` (${oneLine(cause.message)})` : ""}`;
  if (cause?.message) return oneLine(cause.message);
  return error instanceof Error ? oneLine(error.message) : String(error);
}

/** *config* with the active span's trace context in its headers (or as it is). */
async function traced(config: JobConfig | undefined): Promise<JobConfig | undefined> {
  const headers = await withTraceContext(config?.headers);
  return headers === config?.headers ? config : { ...config, headers };
}

export class Client {
  readonly url: string;
  readonly timeoutMs: number;
  readonly #headers: Record<string, string>;

  constructor(url: string, token?: string | null, options?: { timeoutMs?: number });
  constructor(options: ClientOptions);
  constructor(urlOrOptions: string | ClientOptions, token?: string | null, options?: { timeoutMs?: number }) {
    const opts: ClientOptions =
      typeof urlOrOptions === "object" && urlOrOptions !== null
        ? urlOrOptions
        : { url: urlOrOptions, token, ...options };
    this.url = checkUrl(opts.url);
    const checked = checkToken(opts.token);
    const timeoutMs = opts.timeoutMs ?? 10_000;
    if (!(Number.isFinite(timeoutMs) && timeoutMs > 0)) {
      throw new ConfigError(`timeoutMs must be a positive number, not ${timeoutMs}`);
    }
    this.timeoutMs = timeoutMs;
    this.#headers = { "content-type": "application/json", "user-agent": "qftrio-typescript" };
    if (checked !== null) this.#headers.authorization = `Bearer ${checked}`;
  }

  // -- plumbing ---------------------------------------------------------------

  /** One call of *name*: `params` fill the path, `query` the query string.
   * Answers the parsed JSON, or `undefined` for a `204`. */
  async #call(
    name: RouteName,
    params: Record<string, string>,
    body: unknown,
    query?: Query,
    options: CallOptions & { extraMs?: number } = {},
  ): Promise<unknown> {
    const route = ROUTES[name];
    let path: string = route.path;
    for (const [key, value] of Object.entries(params)) {
      if (typeof value !== "string" || value === "") throw new ConfigError(`${key}: expected a non-empty string`);
      path = path.replace(`{${key}}`, segment(value));
    }
    // the path asked for, not the route's template: what a reader can retry by hand
    const where = `${route.method} ${this.url}${path}`;
    if (query) {
      const search = new URLSearchParams();
      for (const [key, value] of Object.entries(query)) {
        if (value !== undefined && value !== null) search.set(key, String(value));
      }
      if (search.size) path += `?${search}`;
    }
    let text: string | undefined;
    if (body !== undefined) {
      try {
        text = JSON.stringify(body);
      } catch (error) {
        throw new ConfigError(`the request cannot be sent as JSON: ${(error as Error).message}`);
      }
    }
    const timeoutMs = this.timeoutMs + (options.extraMs ?? 0);
    const timeout = AbortSignal.timeout(timeoutMs);
    const signal = options.signal ? AbortSignal.any([options.signal, timeout]) : timeout;
    let response: Response;
    let answer: string;
    try {
      response = await fetch(this.url + path, { method: route.method, headers: this.#headers, body: text, signal });
      answer = await response.text();
    } catch (error) {
      if (options.signal?.aborted) throw options.signal.reason;
      if (timeout.aborted) throw new TransportError(`${where}: no answer within ${timeoutMs / 1000} s`);
      throw new TransportError(`${where}: ${describeFetchError(error)}`);
    }
    if (response.status >= 400) throw apiError(response, answer);
    if (response.status === 204) return undefined;
    try {
      const data: unknown = JSON.parse(answer);
      if (typeof data === "object" && data !== null && !Array.isArray(data)) return data;
    } catch {
      // said below
    }
    throw new UnexpectedAnswer(`${where}: the answer is not qftrio's: is the URL a qftrio server?`);
  }

  // -- the worker protocol ----------------------------------------------------

  /** Claim up to `max_jobs` jobs of *queue*, waiting up to `wait_secs` for
   * the first. May answer none. */
  async lease(queue: string, request: LeaseRequest = {}, options: CallOptions = {}): Promise<Lease[]> {
    const data = await this.#call("lease", { queue }, request, undefined, {
      ...options,
      extraMs: (request.wait_secs ?? 0) * 1000,
    });
    return field<Lease[]>(data, "jobs", "lease");
  }

  /** Extend a lease by *extendSecs* from now. The answer's `status` is
   * `running` while the job is ours; anything else, or an `ApiError` 409,
   * means stop and report nothing. */
  async heartbeat(jobId: string, leaseToken: string, extendSecs: number, options: CallOptions = {}): Promise<HeartbeatAnswer> {
    const body = { lease_token: leaseToken, extend_secs: extendSecs };
    return (await this.#call("heartbeat", { job_id: jobId }, body, undefined, options)) as HeartbeatAnswer;
  }

  /** Record how far a job's handler has got (a JSON object of at most
   * 8 KiB; the latest wins), extending nothing; the same answers as
   * `heartbeat`. A handler `runWorker` runs reports with `ctx.progress()`. */
  async jobProgress(jobId: string, leaseToken: string, progress: JsonObject, options: CallOptions = {}): Promise<HeartbeatAnswer> {
    const body = { lease_token: leaseToken, progress };
    return (await this.#call("progress", { job_id: jobId }, body, undefined, options)) as HeartbeatAnswer;
  }

  /** Record success (replaying it with the same token changes nothing). */
  async complete(jobId: string, leaseToken: string, result: JsonObject = {}, options: CallOptions = {}): Promise<void> {
    await this.#call("complete", { job_id: jobId }, { lease_token: leaseToken, result }, undefined, options);
  }

  /** Record a failure: retried later when *retryable* and attempts are
   * left (after `retryInSecs` when given, else after the job's backoff),
   * else dead-lettered. */
  async fail(
    jobId: string,
    leaseToken: string,
    error: string,
    retryable = true,
    options: CallOptions & { retryInSecs?: number } = {},
  ): Promise<void> {
    const { retryInSecs, ...call } = options;
    const body: FailRequest = { lease_token: leaseToken, error, retryable };
    if (retryInSecs !== undefined) body.retry_in_secs = retryInSecs;
    await this.#call("fail", { job_id: jobId }, body, undefined, call);
  }

  /** Put a running job back to pending for *delaySecs* (0 to 30 days)
   * without using up its attempt. */
  async snooze(jobId: string, leaseToken: string, delaySecs: number, options: CallOptions = {}): Promise<void> {
    await this.#call("snooze", { job_id: jobId }, { lease_token: leaseToken, delay_secs: delaySecs }, undefined, options);
  }

  /** Heartbeat many leases in one call (at most 1000); one result per item, in order. */
  async heartbeatMany(items: HeartbeatItem[], options: CallOptions = {}): Promise<ReportResult[]> {
    return field<ReportResult[]>(await this.#call("heartbeatMany", {}, { items }, undefined, options), "results", "heartbeatMany");
  }

  /** Complete many jobs in one call (at most 1000). */
  async completeMany(items: CompleteItem[], options: CallOptions = {}): Promise<ReportResult[]> {
    return field<ReportResult[]>(await this.#call("completeMany", {}, { items }, undefined, options), "results", "completeMany");
  }

  /** Fail many jobs in one call (at most 1000). */
  async failMany(items: FailItem[], options: CallOptions = {}): Promise<ReportResult[]> {
    return field<ReportResult[]>(await this.#call("failMany", {}, { items }, undefined, options), "results", "failMany");
  }

  /** Snooze many jobs in one call (at most 1000). */
  async snoozeMany(items: SnoozeItem[], options: CallOptions = {}): Promise<ReportResult[]> {
    return field<ReportResult[]>(await this.#call("snoozeMany", {}, { items }, undefined, options), "results", "snoozeMany");
  }

  // -- the application API ----------------------------------------------------

  /** Enqueue one job. A repeated `idempotency_key` answers the first job.
   * `config.headers` go to the worker untouched; with `@opentelemetry/api`
   * present and a span active, its trace context is added to them. */
  async enqueue(kind: string, payload: JsonObject = {}, config: JobConfig = {}): Promise<Job> {
    return (await this.#call("enqueue", {}, { kind, payload, config: await traced(config) })) as Job;
  }

  /** Enqueue many jobs in one transaction (at most 1000), each with the
   * trace context as `enqueue` adds it. */
  async enqueueMany(jobs: EnqueueRequest[]): Promise<Job[]> {
    const body = { jobs: await Promise.all(jobs.map(async (job) => ({ ...job, config: await traced(job.config) }))) };
    return field<Job[]>(await this.#call("enqueueMany", {}, body), "jobs", "enqueueMany");
  }

  async jobGet(jobId: string): Promise<Job> {
    return (await this.#call("jobGet", { job_id: jobId }, undefined)) as Job;
  }

  /** The job once it has ended (completed, failed or cancelled), or as it
   * stands after `timeoutSecs` (0 to 60, default 30): read its `status`.
   * Woken within milliseconds of the end, from any server. */
  async jobWait(jobId: string, { timeoutSecs = 30, signal }: { timeoutSecs?: number; signal?: AbortSignal } = {}): Promise<Job> {
    const query = { timeout_secs: timeoutSecs };
    return (await this.#call("jobWait", { job_id: jobId }, undefined, query, { signal, extraMs: timeoutSecs * 1000 })) as Job;
  }

  /** One page of jobs, newest first; pass `next_cursor` as `cursor` for the next. */
  async jobsList(filter: JobsFilter = {}): Promise<JobsPage> {
    return (await this.#call("jobsList", {}, undefined, { ...filter })) as JobsPage;
  }

  /** The tenant's job changes as they happen, on any server: an async
   * iterable of `StreamEvent`s (`for await (const e of client.events())`).
   * A live feed, not a log: nothing from before it opened is replayed. It
   * ends after an `overflow` event or when the server shuts down; `break`
   * (or `options.signal`) ends it. Fails with `TransportError` after 45 s
   * without a byte (the server sends a comment every 15 s). */
  async *events(filter: EventsFilter = {}, options: CallOptions = {}): AsyncGenerator<StreamEvent> {
    const search = new URLSearchParams();
    for (const [key, value] of Object.entries(filter)) {
      if (value !== undefined && value !== null) search.set(key, String(value));
    }
    const path = ROUTES.events.path + (search.size ? `?${search}` : "");
    const where = `GET ${this.url}${path}`;
    const ending = new AbortController();
    const signal = options.signal ? AbortSignal.any([options.signal, ending.signal]) : ending.signal;
    let idle: ReturnType<typeof setTimeout> | undefined;
    let timedOut = false;
    const arm = (ms: number) => {
      clearTimeout(idle);
      idle = setTimeout(() => {
        timedOut = true;
        ending.abort();
      }, ms);
    };
    const failed = (error: unknown): Error => {
      if (options.signal?.aborted) return options.signal.reason as Error;
      if (timedOut) return new TransportError(`${where}: nothing came for ${STREAM_IDLE_MS / 1000} s`);
      return new TransportError(`${where}: ${describeFetchError(error)}`);
    };
    arm(this.timeoutMs);
    try {
      let response: Response;
      try {
        response = await fetch(this.url + path, { headers: this.#headers, signal });
        if (response.status >= 400) throw apiError(response, await response.text());
      } catch (error) {
        if (error instanceof ApiError) throw error;
        throw failed(error);
      }
      const lines = response.body!.pipeThrough(new TextDecoderStream()).getReader();
      let buffered = "";
      let kind = "message";
      let data: string[] = [];
      for (;;) {
        arm(STREAM_IDLE_MS);
        let chunk: Awaited<ReturnType<typeof lines.read>>;
        try {
          chunk = await lines.read();
        } catch (error) {
          throw failed(error);
        }
        if (chunk.done) return;
        buffered += chunk.value;
        let end: number;
        while ((end = buffered.indexOf("\n")) >= 0) {
          const line = buffered.slice(0, end);
          buffered = buffered.slice(end + 1);
          if (line === "") {
            if (data.length) yield { event: kind, data: JSON.parse(data.join("\n")) } as StreamEvent;
            kind = "message";
            data = [];
            continue;
          }
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "event") kind = value;
          else if (field === "data") data.push(value);
        }
      }
    } finally {
      clearTimeout(idle);
      ending.abort(); // the connection closes: the server ends the stream at once
    }
  }

  async jobCancel(jobId: string): Promise<Job> {
    return (await this.#call("jobCancel", { job_id: jobId }, undefined)) as Job;
  }

  async jobRetry(jobId: string): Promise<Job> {
    return (await this.#call("jobRetry", { job_id: jobId }, undefined)) as Job;
  }

  /** The first page of queues, by name (100 of them); `queuesPage` reads the others. */
  async queues(): Promise<QueueStats[]> {
    return field<QueueStats[]>(await this.#call("queues", {}, undefined), "queues", "queues");
  }

  /** One page of queues, by name; pass `next_cursor` as `cursor` for the next. */
  async queuesPage(filter: QueuesFilter = {}): Promise<QueuesAnswer> {
    return (await this.#call("queues", {}, undefined, { ...filter })) as QueuesAnswer;
  }

  async queueStats(queue: string): Promise<QueueStats> {
    return (await this.#call("queueStats", { queue }, undefined)) as QueueStats;
  }

  /** Pause *queue* on every server (idempotent): leases hand out none of
   * its jobs until `queueResume`; running jobs go on. */
  async queuePause(queue: string): Promise<QueueStats> {
    return (await this.#call("queuePause", { queue }, undefined)) as QueueStats;
  }

  async queueResume(queue: string): Promise<QueueStats> {
    return (await this.#call("queueResume", { queue }, undefined)) as QueueStats;
  }

  /** `retry`, `cancel` or `delete` every job matching *filter* (at most
   * `limit`, default 10,000); answers how many changed. */
  async jobsBulk(action: "retry" | "cancel" | "delete", filter: BulkFilter = {}): Promise<number> {
    const name = ({ retry: "jobsBulkRetry", cancel: "jobsBulkCancel", delete: "jobsBulkDelete" } as const)[action];
    if (name === undefined) throw new ConfigError(`action: not one of retry, cancel, delete: ${JSON.stringify(action)}`);
    return field<number>(await this.#call(name, {}, filter), "count", "jobsBulk");
  }

  /** The worker ids holding running jobs, most jobs first. */
  /** Declare or change a rate limit: at most `limit` claims of jobs naming it
   * (`config.rate_limit`) in any window of `perSecs`, across every server. */
  async rateLimitSet(name: string, limit: number, perSecs: number): Promise<RateLimit> {
    return (await this.#call("rateLimitSet", { name }, { limit, per_secs: perSecs })) as RateLimit;
  }

  /** A rate limit, and when a job it holds back can next be claimed. */
  async rateLimitGet(name: string): Promise<RateLimit> {
    return (await this.#call("rateLimitGet", { name }, undefined)) as RateLimit;
  }

  /** The tenant's rate limits, by name. */
  async rateLimitsList(): Promise<RateLimit[]> {
    return field<RateLimit[]>(await this.#call("rateLimitsList", {}, undefined), "rate_limits", "rateLimitsList");
  }

  /** Forget a rate limit: jobs naming it are no longer held back by it. */
  async rateLimitDelete(name: string): Promise<void> {
    await this.#call("rateLimitDelete", { name }, undefined);
  }

  async workers(): Promise<WorkerInfo[]> {
    return field<WorkerInfo[]>(await this.#call("workers", {}, undefined), "workers", "workers");
  }

  /** `GET /healthz` (no credential needed). */
  async health(): Promise<Health> {
    return (await this.#call("health", {}, undefined)) as Health;
  }

  // -- schedules --------------------------------------------------------------

  /** Create or replace the schedule *name*: each tick of `cron` (five
   * fields, or six with a leading seconds field) in `timezone` enqueues one
   * job as `job` says. A cron, time zone or job config the server cannot
   * use is an `ApiError` 422 naming the field, and stores nothing. */
  async scheduleSet(name: string, schedule: ScheduleRequest): Promise<Schedule> {
    return (await this.#call("scheduleSet", { name }, schedule)) as Schedule;
  }

  async scheduleGet(name: string): Promise<Schedule> {
    return (await this.#call("scheduleGet", { name }, undefined)) as Schedule;
  }

  /** One page of schedules by name; pass `next_cursor` as `cursor` for the next. */
  async schedulesList(filter: SchedulesFilter = {}): Promise<SchedulesPage> {
    return (await this.#call("schedulesList", {}, undefined, { ...filter })) as SchedulesPage;
  }

  /** Delete the schedule; the jobs it enqueued stay. */
  async scheduleDelete(name: string): Promise<void> {
    await this.#call("scheduleDelete", { name }, undefined);
  }

  /** Pause the schedule (idempotent): no tick fires until `scheduleResume`. */
  async schedulePause(name: string): Promise<Schedule> {
    return (await this.#call("schedulePause", { name }, undefined)) as Schedule;
  }

  /** Resume the schedule from its next tick (the ticks of the pause are not caught up). */
  async scheduleResume(name: string): Promise<Schedule> {
    return (await this.#call("scheduleResume", { name }, undefined)) as Schedule;
  }

  /** Enqueue one job of the schedule now, besides its ticks. */
  async scheduleTrigger(name: string): Promise<ScheduleTriggered> {
    return (await this.#call("scheduleTrigger", { name }, undefined)) as ScheduleTriggered;
  }

  // -- workflows --------------------------------------------------------------

  /** Add steps (at most 1000 a call) to the workflow of the running step
   * `jobId`, whose lease `leaseToken` holds (worker token). They run once
   * that step has completed, and the steps waiting for it wait for them too;
   * with `collect`, their results go, in this order, to a list under that
   * key of the context. The same call repeated changes nothing. A lost
   * lease is an `ApiError` 409; steps that do not fit the workflow, 422. */
  async stepsAdd(
    jobId: string,
    leaseToken: string,
    steps: WorkflowStepRequest[],
    options: { collect?: string } & CallOptions = {},
  ): Promise<Workflow> {
    const { collect, ...call } = options;
    const body = { lease_token: leaseToken, steps, ...(collect === undefined ? {} : { collect }) };
    return (await this.#call("stepsAdd", { job_id: jobId }, body, undefined, call)) as Workflow;
  }

  /** Create a workflow; a bad step graph is an `ApiError` 422 and stores nothing. */
  async workflowCreate(name: string, steps: WorkflowStepRequest[], options: { context?: JsonObject } = {}): Promise<Workflow> {
    return (await this.#call("workflowCreate", {}, { name, steps, context: options.context ?? {} })) as Workflow;
  }

  async workflowGet(workflowId: string): Promise<Workflow> {
    return (await this.#call("workflowGet", { workflow_id: workflowId }, undefined)) as Workflow;
  }

  async workflowsList(filter: WorkflowsFilter = {}): Promise<WorkflowsPage> {
    return (await this.#call("workflowsList", {}, undefined, { ...filter })) as WorkflowsPage;
  }

  async workflowCancel(workflowId: string): Promise<Workflow> {
    return (await this.#call("workflowCancel", { workflow_id: workflowId }, undefined)) as Workflow;
  }
}

/** A stream with no byte for this long is taken for dead: the server sends
 * a comment every 15 s. */
const STREAM_IDLE_MS = 45_000;

/** `data[key]`, which a qftrio answer always has. */
function field<T>(data: unknown, key: string, call: string): T {
  const value = (data as Record<string, unknown> | undefined)?.[key];
  if (value === undefined) throw new UnexpectedAnswer(`${call}: the answer has no ${key}: is the URL a qftrio server?`);
  return value as T;
}

function apiError(response: Response, text: string): ApiError {
  try {
    const error = (JSON.parse(text) as { error?: { code?: unknown; message?: unknown } }).error;
    if (typeof error?.code === "string" && typeof error.message === "string") {
      return new ApiError(response.status, error.code, error.message);
    }
  } catch {
    // not qftrio's error shape: said below
  }
  // A proxy's short text is worth passing on; another server's page is named, not repeated.
  const kind = (response.headers.get("content-type") ?? "no content type").split(";")[0]!.trim();
  const message =
    kind === "text/plain" && text.trim() && !text.trim().includes("\n")
      ? oneLine(text)
      : `the answer is not qftrio's (${kind}): is the URL a qftrio server?`;
  return new ApiError(response.status, null, message);
}
