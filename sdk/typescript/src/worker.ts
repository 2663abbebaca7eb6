/**
 * The worker runtime: lease jobs, run their handlers, heartbeat, report.
 *
 *     await runWorker("images", {
 *       "resize-image": async (job, ctx) => resize(job.payload, { signal: ctx.signal }),
 *     }, { url, token, lanes: 8 });
 *
 * It keeps the rules of the Python runtime (`docs/worker.md`):
 *
 * - Lanes: a handler runs in a lane, one job per lane. A lease asks for as
 *   many jobs as there are free lanes (at most 100), only while one is free.
 * - One heartbeat scheduler renews every held job every `leaseSecs/2` from
 *   its claim, the jobs due together in one batch call. A `409`, a `404` or
 *   a status other than `running` aborts the job's `ctx.signal` and nothing
 *   is reported (`lost`). When renewals keep failing and the lease is about
 *   to end, the signal is aborted and a retryable fail is attempted.
 * - Reports (complete, fail) go in batch calls, retried with backoff until
 *   the lease ends, then given up (`unreported`): the job runs again later.
 * - Lease calls back off with jitter on transport errors and 5xx answers
 *   (`waiting`), forever; answers that never change (`401`/`403`, a refused
 *   request, an answer that is not qftrio's) stop the worker with that error.
 * - The first SIGINT/SIGTERM (or the `signal` option) drains: lease nothing
 *   more, finish and report the held jobs. A second signal quits at once
 *   (exit status 130); the held jobs' leases expire and other workers take
 *   them.
 *
 * JavaScript cannot interrupt a function: a handler stops when it honours
 * `ctx.signal`. Whatever a handler answers after its signal was aborted
 * because the job was lost is dropped.
 */

import { hostname } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import { Client, oneLine } from "./client.js";
import {
  ApiError,
  ConfigError,
  PermanentError,
  QftrioError,
  RetryIn,
  Snooze,
  TransportError,
  UnexpectedAnswer,
} from "./errors.js";
import { inHandlerSpan } from "./tracing.js";
import type {
  CompleteItem,
  FailItem,
  HeartbeatItem,
  Job,
  JsonObject,
  Lease,
  SnoozeItem,
  Workflow,
  WorkflowStepRequest,
} from "./types.js";

/** What a handler gets besides the job. */
export interface JobContext {
  /** Aborted when the job is no longer this worker's (cancelled, lease
   * lost) or its lease is about to end: stop then. */
  readonly signal: AbortSignal;
  /** The lane (1..lanes) the handler runs in. */
  readonly lane: number;
  /** Report how far the handler has got: a JSON object of at most 8 KiB,
   * sent with a heartbeat batch within a second; the latest wins. */
  progress(value: JsonObject): void;
  /** Add steps to this step's workflow (`POST /api/v1/jobs/{id}/steps`):
   * they run once this handler's job has completed, the steps waiting for it
   * wait for them too, and with `collect` their results go, in this order, to
   * a list under that key of the context. Sent again after transport errors
   * while the lease lasts (a repeat changes nothing). Rejects with the
   * server's `ApiError` (409: the lease is lost; 422: steps that do not fit). */
  addSteps(steps: WorkflowStepRequest[], options?: { collect?: string }): Promise<Workflow>;
}

/** A job's handler: its answer (a JSON object, or nothing for `{}`)
 * completes the job; what it throws fails it, retryably unless it is a
 * `PermanentError`. A `Snooze` puts the job back for a while without using
 * up its attempt; a `RetryIn` fails it with a chosen delay. */
export type Handler = (job: Job, ctx: JobContext) => Promise<JsonObject | void | null> | JsonObject | void | null;

export type WorkerEventType =
  | "claimed"
  | "completed"
  | "failed"
  | "snoozed"
  | "lost"
  | "unreported"
  | "waiting"
  | "stopping";

/** Something the worker did, for logs and dashboards. */
export interface WorkerEvent {
  type: WorkerEventType;
  /** The job's, when the event is about one. */
  jobId?: string;
  kind?: string;
  attempt?: number;
  lane?: number;
  /** What went wrong, in words (for `stopping`: what happens to held jobs). */
  error?: string;
  /** For `failed`: whether the job will be retried (attempts permitting). */
  retryable?: boolean;
  /** For `waiting`: seconds until the next lease call; for `snoozed` and a
   * `failed` of a `RetryIn`: until the job runs again. */
  delaySecs?: number;
}

export interface WorkerOptions {
  /** A client with the worker token; or give `url` and `token`. */
  client?: Client;
  /** The server's URL; default `http://127.0.0.1:8000`. */
  url?: string;
  /** The worker token (any token of a `--dev` server). */
  token?: string;
  /** Jobs run at once; default 10. */
  lanes?: number;
  /** The lease asked for and each renewal's extension (1..3600, default
   * 60). A crashed worker's jobs wait up to this long before running elsewhere. */
  leaseSecs?: number;
  /** The long poll of each lease call (0..60, default 20). */
  waitSecs?: number;
  /** Recorded on every job it holds; default `host-pid`. */
  workerId?: string;
  /** Aborting it drains the worker. */
  signal?: AbortSignal;
  /** The first SIGINT/SIGTERM drains, the second quits at once (default true). */
  handleSignals?: boolean;
  /** Called with every event. It must not block; what it throws is ignored. */
  onEvent?: (event: WorkerEvent) => void;
}

const NAME = /^[A-Za-z0-9_.-]{1,128}$/;
const OPTIONS = new Set([
  "client", "url", "token", "lanes", "leaseSecs", "waitSecs", "workerId", "signal", "handleSignals", "onEvent",
]);
const DEFAULT_URL = "http://127.0.0.1:8000";
const MAX_LEASE_JOBS = 100;
const MAX_BATCH = 1000;
const MAX_WORKER_ID = 200;
const MAX_ERROR_CHARS = 65536;
/** Backoff of retried calls, seconds: about `base` first, doubling up to
 * `cap`, each wait scaled by a random factor in [0.5, 1] so that a fleet
 * does not retry in lockstep. */
const LEASE_BACKOFF: [number, number] = [0.5, 15];
const REPORT_BACKOFF: [number, number] = [0.25, 5];
/** Milliseconds allowed between the server's claim and our reading its
 * answer: the lease is reckoned from then. */
const CLAIM_SLACK_MS = 100;
/** Reports and renewals falling due within this many milliseconds go together. */
const COALESCE_MS = 5;
/** A handler's progress goes with a heartbeat batch at most this long after
 * `ctx.progress()`; the reports of every job made within it share one call. */
const PROGRESS_MS = 1000;
/** A job's `progress`: the bytes of its JSON text. */
const MAX_PROGRESS_BYTES = 8192;
/** Answers to a lease call that a later call may not get: ridden out. */
const PASSING = new Set([408, 429, 500, 502, 503, 504]);

function backoff(failures: number, [base, cap]: [number, number]): number {
  return Math.min(cap, base * 2 ** Math.max(0, failures - 1)) * (0.5 + 0.5 * Math.random());
}

/** The server will refuse the credential, or is not qftrio: stop. */
function isFatal(error: unknown): boolean {
  return (error instanceof ApiError && (error.status === 401 || error.status === 403)) || error instanceof UnexpectedAnswer;
}

/** The server refused the request itself: sending it again cannot help. */
function isRefusal(error: unknown): boolean {
  return error instanceof ApiError && [400, 413, 422].includes(error.status);
}

function describe(error: unknown): string {
  if (error instanceof Error) return error.message ? `${error.name}: ${error.message}` : error.name;
  return String(error);
}

/** *text* cut to what the server takes, saying so. */
function truncateError(text: string): string {
  if (text.length <= MAX_ERROR_CHARS) return text;
  const note = `\n[truncated: ${text.length} characters in all]`;
  return text.slice(0, MAX_ERROR_CHARS - note.length) + note;
}

interface Outcome {
  result?: JsonObject;
  error?: string;
  retryable?: boolean;
  /** Run the job again in this many seconds: a snooze (no error), or a
   * failure's retry (`RetryIn`). */
  againIn?: number;
}

type Report = "complete" | "fail" | "snooze";

/** The error of an attempt that ran past its job's `timeout_secs`: the
 * server's text, which the runtime reports when it ends the handler. */
function timeoutError(timeoutSecs: number | null): string {
  return `timed out after ${timeoutSecs} s`;
}

function reportOf(outcome: Outcome): Report {
  if (outcome.error !== undefined) return "fail";
  return outcome.againIn === undefined ? "complete" : "snooze";
}

/** One leased job, from claim to report. Times are `performance.now()` ms. */
interface Held {
  job: Job;
  token: string;
  lane: number;
  deadline: number; // when our lease ends, by our own reckoning
  timeoutAt: number; // the job's own deadline (`timeout_secs` after its claim), by our reckoning
  timedOut: boolean; // aborted at that deadline: the attempt is over
  nextBeat: number; // when its next renewal falls due
  controller: AbortController; // its handler's signal
  beating: boolean; // renewed until its handler is done, or it is given up
  inCall: boolean; // a renewal of it is in flight
  expiring: boolean; // aborted because renewals failed and the lease is ending
  failures: number; // renewals, then reports, failed in a row
  lost: string | null; // why the server took it back: nothing is reported
  lastError: string | null; // of the last renewal or report that failed
  progress: JsonObject | null; // reported by its handler, not yet sent
  outcome: Outcome | null;
  retry: ReturnType<typeof setTimeout> | null; // its report's next try
}

function validate(queue: unknown, handlers: unknown, options: WorkerOptions): void {
  if (typeof queue !== "string" || !NAME.test(queue)) {
    throw new ConfigError(`queue ${JSON.stringify(queue)}: use 1-128 characters of A-Z a-z 0-9 _ . -`);
  }
  if (typeof handlers !== "object" || handlers === null || Array.isArray(handlers)) {
    throw new ConfigError("handlers: expected an object mapping each job kind to its handler");
  }
  const kinds = Object.keys(handlers);
  if (kinds.length === 0) throw new ConfigError("handlers names no kind: the worker would fail every job it leases");
  for (const kind of kinds) {
    if (!NAME.test(kind)) throw new ConfigError(`handlers: kind ${JSON.stringify(kind)}: use 1-128 characters of A-Z a-z 0-9 _ . -`);
    if (typeof (handlers as Record<string, unknown>)[kind] !== "function") {
      throw new ConfigError(`handlers: the handler of ${JSON.stringify(kind)} is not a function`);
    }
  }
  for (const key of Object.keys(options)) {
    if (!OPTIONS.has(key)) throw new ConfigError(`unknown option ${JSON.stringify(key)}`);
  }
  const { lanes, leaseSecs, waitSecs, workerId } = options;
  if (lanes !== undefined && !(Number.isInteger(lanes) && lanes >= 1)) {
    throw new ConfigError(`lanes must be a positive integer, not ${String(lanes)}`);
  }
  if (leaseSecs !== undefined && !(Number.isInteger(leaseSecs) && leaseSecs >= 1 && leaseSecs <= 3600)) {
    throw new ConfigError(`leaseSecs must be an integer from 1 to 3600, not ${String(leaseSecs)}`);
  }
  if (waitSecs !== undefined && !(typeof waitSecs === "number" && waitSecs >= 0 && waitSecs <= 60)) {
    throw new ConfigError(`waitSecs must be from 0 to 60, not ${String(waitSecs)}`);
  }
  if (workerId !== undefined && !(typeof workerId === "string" && workerId.length >= 1 && workerId.length <= MAX_WORKER_ID)) {
    throw new ConfigError(`workerId must be a string of 1 to ${MAX_WORKER_ID} characters`);
  }
  if (options.client !== undefined && !(options.client instanceof Client)) {
    throw new ConfigError("client: expected a qftrio Client");
  }
  if (options.client !== undefined && (options.url !== undefined || options.token !== undefined)) {
    throw new ConfigError("give either client, or url and token, not both");
  }
  if (options.client === undefined && !options.token) {
    throw new ConfigError("token: a worker needs the worker token (any token of a --dev server)");
  }
  if (options.signal !== undefined && !(options.signal instanceof AbortSignal)) {
    throw new ConfigError("signal: expected an AbortSignal");
  }
  if (options.onEvent !== undefined && typeof options.onEvent !== "function") {
    throw new ConfigError("onEvent: expected a function");
  }
}

/**
 * Run the handlers of *handlers* for jobs leased from *queue* until drained
 * (a signal, the `signal` option) or stopped by an error that would never
 * change. The promise settles when the worker has stopped and every handler
 * it started has returned.
 *
 * Rejects with `ConfigError` at once for bad options, with `ApiError`
 * (`401`/`403`, a lease request the server refuses) or `UnexpectedAnswer`
 * (not a qftrio server) when the server makes working impossible.
 */
export async function runWorker(
  queue: string,
  handlers: Record<string, Handler>,
  options: WorkerOptions = {},
): Promise<void> {
  validate(queue, handlers, options);
  const client = options.client ?? new Client(options.url ?? DEFAULT_URL, options.token);
  await new WorkerRun(client, queue, { ...handlers }, options).run();
}

class WorkerRun {
  readonly lanes: number;
  readonly leaseMs: number;
  readonly waitSecs: number;
  readonly workerId: string;
  readonly abortMarginMs: number;

  stopping = false;
  /** Aborted by `stop()`: ends the long poll in flight and a lease backoff. */
  readonly stopped = new AbortController();
  fatal: unknown = null;
  readonly held = new Map<string, Held>();
  readonly freeLanes: number[];
  busy = 0;
  leaseFailures = 0;
  waiters: Array<() => void> = [];
  beatTimer: ReturnType<typeof setTimeout> | null = null;
  reportTimer: ReturnType<typeof setTimeout> | null = null;
  toComplete: Held[] = [];
  toFail: Held[] = [];
  toSnooze: Held[] = [];
  readonly handlersRunning = new Set<Promise<void>>();

  constructor(
    readonly client: Client,
    readonly queue: string,
    readonly handlers: Record<string, Handler>,
    readonly options: WorkerOptions,
  ) {
    this.lanes = options.lanes ?? 10;
    const leaseSecs = options.leaseSecs ?? 60;
    this.leaseMs = leaseSecs * 1000;
    this.waitSecs = options.waitSecs ?? 20;
    this.workerId = options.workerId ?? `${hostname()}-${process.pid}`;
    this.abortMarginMs = Math.min(5, leaseSecs * 0.2) * 1000;
    this.freeLanes = Array.from({ length: this.lanes }, (_, i) => i + 1);
  }

  async run(): Promise<void> {
    const drain = () => this.stop();
    let signals = 0;
    const onSignal = () => {
      signals += 1;
      if (signals === 1) return this.stop();
      // The second signal: quit now. Held jobs are not reported; their
      // leases run out and other workers take them.
      this.emit({ type: "stopping", error: `quitting: ${this.held.size} held job(s) abandoned` });
      process.exit(130);
    };
    const handleSignals = this.options.handleSignals ?? true;
    if (handleSignals) {
      process.on("SIGINT", onSignal);
      process.on("SIGTERM", onSignal);
    }
    this.options.signal?.addEventListener("abort", drain);
    try {
      if (this.options.signal?.aborted) this.stop();
      await this.leaseLoop();
      // Leasing has stopped: wait for the held jobs to finish and report.
      while (this.held.size > 0) await this.changed();
      await Promise.all(this.handlersRunning);
    } finally {
      if (handleSignals) {
        process.off("SIGINT", onSignal);
        process.off("SIGTERM", onSignal);
      }
      this.options.signal?.removeEventListener("abort", drain);
      if (this.beatTimer) clearTimeout(this.beatTimer);
      if (this.reportTimer) clearTimeout(this.reportTimer);
    }
    if (this.fatal !== null) throw this.fatal;
  }

  /** Drain: lease nothing more, finish the held jobs. The long poll in
   * flight is abandoned (a job the server claimed for it meanwhile runs
   * elsewhere once its lease expires). */
  stop(why = `finishing ${this.held.size} held job(s)`): void {
    if (this.stopping) return;
    this.stopping = true;
    this.emit({ type: "stopping", error: why });
    this.stopped.abort();
    this.notify();
  }

  /** Stop everything because of *error*, which `run` rejects with: abort
   * every handler, report nothing. */
  die(error: unknown): void {
    if (this.fatal === null) this.fatal = error;
    this.stop(`${error instanceof Error ? error.message : String(error)}: abandoning ${this.held.size} held job(s)`);
    for (const held of this.held.values()) {
      held.beating = false;
      held.controller.abort(error);
      if (held.retry) clearTimeout(held.retry);
    }
    this.held.clear();
    this.toComplete = [];
    this.toFail = [];
    this.toSnooze = [];
    this.notify();
  }

  emit(event: WorkerEvent): void {
    try {
      this.options.onEvent?.(event);
    } catch {
      // A listener's failure is not the worker's.
    }
  }

  jobEvent(type: WorkerEventType, held: Held, extra: Partial<WorkerEvent> = {}): void {
    const { id, kind, attempt } = held.job;
    this.emit({ type, jobId: id, kind, attempt, lane: held.lane, ...extra });
  }

  /** Until a lane is freed, a held job is gone, or the worker stops. */
  changed(): Promise<void> {
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  notify(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }

  /** *ms* milliseconds, or less if the worker stops meanwhile. */
  async pause(ms: number): Promise<void> {
    await sleep(ms, undefined, { signal: this.stopped.signal }).catch(() => {});
  }

  forget(held: Held): void {
    if (held.retry) clearTimeout(held.retry);
    this.held.delete(held.token);
    this.notify();
  }

  // -- leasing -----------------------------------------------------------------

  async leaseLoop(): Promise<void> {
    const most = Math.min(MAX_LEASE_JOBS, this.lanes);
    while (!this.stopping) {
      // Jobs whose handler is done count as gone (their reports travel in
      // the background); the second bound keeps lagging reports from
      // piling up without end.
      if (this.busy >= this.lanes || this.held.size >= this.lanes + 2 * most) {
        await this.changed();
        continue;
      }
      const maxJobs = Math.min(MAX_LEASE_JOBS, this.lanes - this.busy);
      const sentAt = performance.now();
      let leases: Lease[];
      try {
        leases = await this.client.lease(
          this.queue,
          { max_jobs: maxJobs, lease_secs: this.leaseMs / 1000, wait_secs: this.waitSecs, worker_id: this.workerId },
          { signal: this.stopped.signal },
        );
      } catch (error) {
        if (this.stopped.signal.aborted) return; // the long poll, abandoned by stop()
        if (isFatal(error) || !(error instanceof QftrioError) || (error instanceof ApiError && !PASSING.has(error.status))) {
          // A 404 here means no qftrio worker route at this URL.
          this.die(error);
          return;
        }
        this.leaseFailures += 1;
        const delay = backoff(this.leaseFailures, LEASE_BACKOFF);
        this.emit({ type: "waiting", error: oneLine(error.message), delaySecs: delay });
        await this.pause(delay * 1000);
        continue;
      }
      this.leaseFailures = 0;
      const now = performance.now();
      if (leases.length === 0 && this.waitSecs > 0 && now - sentAt < Math.min(this.waitSecs, 1) * 500) {
        // An empty answer that did not wait: a server shutting down answers
        // long polls at once. Do not spin on it.
        await this.pause(backoff(1, LEASE_BACKOFF) * 1000);
        continue;
      }
      // A long poll may have waited long before anything came: the claim
      // was just before the answer, not when we asked.
      const deadline = Math.max(sentAt, now - CLAIM_SLACK_MS) + this.leaseMs;
      for (const lease of leases) this.start(lease, deadline);
      this.scheduleBeats();
    }
  }

  start(lease: Lease, deadline: number): void {
    const claimed = deadline - this.leaseMs; // by our reckoning, as the lease's deadline
    this.freeLanes.sort((a, b) => a - b);
    const lane = this.freeLanes.shift()!;
    this.busy += 1;
    const held: Held = {
      job: lease.job,
      token: lease.lease_token,
      lane,
      deadline,
      timeoutAt: lease.job.timeout_secs == null ? Infinity : claimed + lease.job.timeout_secs * 1000,
      timedOut: false,
      nextBeat: deadline - this.leaseMs / 2,
      controller: new AbortController(),
      beating: true,
      inCall: false,
      expiring: false,
      failures: 0,
      lost: null,
      lastError: null,
      progress: null,
      outcome: null,
      retry: null,
    };
    this.held.set(held.token, held);
    this.jobEvent("claimed", held);
    const running = this.execute(held).then((outcome) => this.finished(held, outcome));
    this.handlersRunning.add(running);
    void running.finally(() => this.handlersRunning.delete(running));
  }

  // -- one job -----------------------------------------------------------------

  async execute(held: Held): Promise<Outcome> {
    const { job } = held;
    if (!Object.hasOwn(this.handlers, job.kind)) {
      // The lease has no filter by kind: fail such a job, so that it does
      // not bounce between workers until its attempts run out.
      const known = Object.keys(this.handlers).join(", ");
      return { error: `no handler for kind ${JSON.stringify(job.kind)} on this worker (it handles: ${known})`, retryable: false };
    }
    let result: unknown;
    // At the job's deadline the handler's signal is aborted and the job
    // failed with the server's text at once, whatever the handler does
    // after: the server ends the attempt then (as the Python runtime does).
    const signal = held.controller.signal;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = new Promise<void>((resolve) => {
      if (held.timeoutAt === Infinity) return;
      timer = setTimeout(() => {
        held.timedOut = true;
        held.controller.abort(new Error(timeoutError(job.timeout_secs)));
        resolve();
      }, Math.max(0, held.timeoutAt - performance.now()));
    });
    try {
      const ctx: JobContext = {
        signal,
        lane: held.lane,
        progress: (value: JsonObject) => this.takeProgress(held, value),
        addSteps: (steps: WorkflowStepRequest[], options: { collect?: string } = {}) => this.addSteps(held, steps, options),
      };
      result = await Promise.race([inHandlerSpan(job, () => this.handlers[job.kind]!(job, ctx)), timedOut]);
    } catch (error) {
      if (held.timedOut) return { error: timeoutError(job.timeout_secs), retryable: true };
      if (error instanceof PermanentError) return { error: error.message || "PermanentError", retryable: false };
      if (error instanceof Snooze) return { againIn: error.seconds };
      if (error instanceof RetryIn) return { error: error.message || "RetryIn", retryable: true, againIn: error.seconds };
      return { error: describe(error), retryable: true };
    } finally {
      clearTimeout(timer);
    }
    if (held.timedOut) return { error: timeoutError(job.timeout_secs), retryable: true };
    if (result === undefined || result === null) return { result: {} };
    if (typeof result !== "object" || Array.isArray(result)) {
      const type = Array.isArray(result) ? "an array" : typeof result;
      return { error: `handler returned ${type}; expected an object or nothing`, retryable: false };
    }
    try {
      JSON.stringify(result);
    } catch (error) {
      return { error: `handler result is not JSON: ${describe(error)}`, retryable: false };
    }
    return { result: result as JsonObject };
  }

  finished(held: Held, outcome: Outcome): void {
    held.beating = false;
    this.busy -= 1;
    this.freeLanes.push(held.lane);
    this.notify();
    if (!this.held.has(held.token)) return; // given up by a hard stop
    if (held.lost !== null) {
      this.jobEvent("lost", held, { error: held.lost });
      this.forget(held);
      return;
    }
    if (held.expiring) {
      const reason = held.lastError ? `: ${held.lastError}` : "";
      outcome = { error: `lease about to expire: heartbeats failed${reason}`, retryable: true };
    }
    held.failures = 0;
    this.queueReport(held, outcome);
  }

  // -- heartbeats --------------------------------------------------------------

  /** (Re)arm the one timer of the heartbeat scheduler for the first
   * renewal or give-up that falls due. */
  scheduleBeats(): void {
    if (this.beatTimer) clearTimeout(this.beatTimer);
    this.beatTimer = null;
    let wake = Infinity;
    for (const held of this.held.values()) {
      if (!held.beating) continue;
      wake = Math.min(wake, held.deadline - this.abortMarginMs);
      if (!held.inCall) wake = Math.min(wake, held.nextBeat);
    }
    if (wake === Infinity) return;
    this.beatTimer = setTimeout(() => this.beat(), Math.max(0, wake - performance.now()));
  }

  beat(): void {
    this.beatTimer = null;
    const now = performance.now();
    const due: Held[] = [];
    for (const held of this.held.values()) {
      if (!held.beating) continue;
      if (now >= held.deadline - this.abortMarginMs) {
        // Renewals kept failing and the lease is about to end: stop the
        // handler while there is still time to say so.
        held.beating = false;
        held.expiring = true;
        held.controller.abort(new Error("the lease is about to expire: heartbeats failed"));
      } else if (!held.inCall && held.nextBeat <= now + COALESCE_MS) {
        held.inCall = true;
        due.push(held);
      }
    }
    for (let i = 0; i < due.length; i += MAX_BATCH) void this.renew(due.slice(i, i + MAX_BATCH));
    this.scheduleBeats();
  }

  /** `ctx.addSteps(steps, {collect})`: sent, and sent again after a
   * transport error with the reports' backoff until the lease is about to
   * end (a repeat of a landed add changes nothing). */
  async addSteps(held: Held, steps: WorkflowStepRequest[], options: { collect?: string }): Promise<Workflow> {
    for (let failures = 1; ; failures++) {
      try {
        return await this.client.stepsAdd(held.job.id, held.token, steps, options);
      } catch (error) {
        const retryAt = performance.now() + backoff(failures, REPORT_BACKOFF) * 1000;
        if (!(error instanceof TransportError) || retryAt >= held.deadline - this.abortMarginMs) throw error;
        await sleep(retryAt - performance.now());
      }
    }
  }

  /** `ctx.progress(value)`: checked here, where the handler sees the
   * error, then sent with a heartbeat batch within `PROGRESS_MS`. */
  takeProgress(held: Held, value: JsonObject): void {
    if (typeof value !== "object" || value === null || Array.isArray(value)) {
      throw new TypeError("progress: expected a JSON object");
    }
    const size = Buffer.byteLength(JSON.stringify(value));
    if (size > MAX_PROGRESS_BYTES) {
      throw new RangeError(`progress holds ${size} bytes of JSON, over the ${MAX_PROGRESS_BYTES} allowed`);
    }
    if (!held.beating) return; // its handler is done or the job was given up
    held.progress = value;
    if (!held.inCall) {
      held.nextBeat = Math.min(held.nextBeat, performance.now() + PROGRESS_MS);
      this.scheduleBeats();
    }
  }

  /** One batch renewal: extend the leases still ours, abort the handlers
   * of the jobs that are not. */
  async renew(due: Held[]): Promise<void> {
    const sentAt = performance.now();
    const items: HeartbeatItem[] = due.map((held) => ({
      id: held.job.id,
      lease_token: held.token,
      extend_secs: this.leaseMs / 1000,
      ...(held.progress === null ? {} : { progress: held.progress }),
    }));
    for (const held of due) held.progress = null;
    try {
      const replies = await this.client.heartbeatMany(items);
      due.forEach((held, i) => {
        const reply = replies[i];
        if (reply?.code === 200 && reply.status === "running") {
          held.deadline = sentAt + this.leaseMs;
          held.failures = 0;
          held.nextBeat = sentAt + this.leaseMs / 2;
          return;
        }
        if (!held.beating) return; // its handler is done: its report learns the same
        held.lost =
          reply?.code === 200
            ? `the job is ${reply.status}`
            : reply?.code === 409
              ? "lease lost (409): the job was taken back"
              : `heartbeat answered ${reply?.code}`;
        held.beating = false;
        held.controller.abort(new Error(held.lost));
      });
    } catch (error) {
      if (isFatal(error)) return this.die(error);
      const text = oneLine(error instanceof Error ? error.message : String(error));
      const now = performance.now();
      due.forEach((held, i) => {
        if (held.progress === null) held.progress = items[i]!.progress ?? null; // nothing newer since: send it again
      });
      for (const held of due) {
        held.failures += 1;
        held.lastError = text;
        held.nextBeat = now + backoff(held.failures, REPORT_BACKOFF) * 1000;
      }
    } finally {
      const soon = performance.now() + PROGRESS_MS;
      for (const held of due) {
        held.inCall = false;
        if (held.progress !== null) held.nextBeat = Math.min(held.nextBeat, soon);
      }
      if (!this.fatal) this.scheduleBeats();
    }
  }

  // -- reports -----------------------------------------------------------------

  queueReport(held: Held, outcome: Outcome): void {
    held.outcome = outcome;
    if (performance.now() >= held.deadline) return this.giveUp(held);
    ({ complete: this.toComplete, fail: this.toFail, snooze: this.toSnooze })[reportOf(outcome)].push(held);
    // Reports of jobs finishing about now go in the same call.
    this.reportTimer ??= setTimeout(() => this.flushReports(), COALESCE_MS);
  }

  giveUp(held: Held): void {
    this.jobEvent("unreported", held, { error: held.lastError ?? "the lease ran out before the report landed" });
    this.forget(held);
  }

  flushReports(): void {
    this.reportTimer = null;
    for (const queue of [this.toComplete, this.toFail, this.toSnooze]) {
      const batch = queue.splice(0);
      for (let i = 0; i < batch.length; i += MAX_BATCH) void this.sendReports(batch.slice(i, i + MAX_BATCH));
    }
  }

  /** One report call for *batch* (all completions, failures or snoozes). */
  async sendReports(batch: Held[]): Promise<void> {
    const report = reportOf(batch[0]!.outcome!);
    let replies;
    try {
      if (report === "complete") {
        const items: CompleteItem[] = batch.map((h) => ({ id: h.job.id, lease_token: h.token, result: h.outcome!.result! }));
        replies = await this.client.completeMany(items);
      } else if (report === "snooze") {
        const items: SnoozeItem[] = batch.map((h) => ({ id: h.job.id, lease_token: h.token, delay_secs: h.outcome!.againIn! }));
        replies = await this.client.snoozeMany(items);
      } else {
        const items: FailItem[] = batch.map((h) => {
          const item: FailItem = {
            id: h.job.id,
            lease_token: h.token,
            error: truncateError(h.outcome!.error!),
            retryable: h.outcome!.retryable ?? true,
          };
          if (h.outcome!.againIn !== undefined) item.retry_in_secs = h.outcome!.againIn;
          return item;
        });
        replies = await this.client.failMany(items);
      }
    } catch (error) {
      if (this.fatal !== null) return;
      if (isFatal(error)) return this.die(error);
      if (isRefusal(error) && batch.length > 1) {
        // One report's result, say, is too large: send them one by one, so that it fails alone.
        for (const held of batch) await this.sendReports([held]);
        return;
      }
      return this.reportFailed(batch, error);
    }
    if (this.fatal !== null) return;
    batch.forEach((held, i) => {
      const code = replies[i]?.code;
      if (code === 204) {
        const { error, retryable, againIn } = held.outcome!;
        const delay = againIn === undefined ? {} : { delaySecs: againIn };
        if (report === "complete") this.jobEvent("completed", held);
        else if (report === "snooze") this.jobEvent("snoozed", held, delay);
        else this.jobEvent("failed", held, { error, retryable: retryable ?? true, ...delay });
      } else {
        held.lost = code === 409 ? "lease lost (409): the report was refused" : `report answered ${code}`;
        this.jobEvent("lost", held, { error: held.lost });
      }
      this.forget(held);
    });
  }

  /** The report call of *batch* failed: send each again later, until its lease ends. */
  reportFailed(batch: Held[], error: unknown): void {
    const text = oneLine(error instanceof Error ? error.message : String(error));
    const now = performance.now();
    for (const held of batch) {
      held.lastError = text;
      if (isRefusal(error)) {
        if (reportOf(held.outcome!) !== "complete") this.giveUp(held); // the server refuses this fail or snooze
        // The server refuses this result (a smaller body cap, say): fail
        // the job, saying why, rather than run it again.
        else this.queueReport(held, { error: `the server refused the result: ${text}`, retryable: false });
      } else if (now >= held.deadline) {
        this.giveUp(held);
      } else {
        held.failures += 1;
        const at = Math.min(now + backoff(held.failures, REPORT_BACKOFF) * 1000, held.deadline);
        held.retry = setTimeout(() => {
          held.retry = null;
          if (performance.now() >= held.deadline) this.giveUp(held);
          else this.queueReport(held, held.outcome!);
        }, at - now);
      }
    }
  }
}
