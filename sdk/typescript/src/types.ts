/**
 * The wire's shapes, field for field as `docs/protocol.md` and the server's
 * `/openapi.json` give them (snake_case, times as RFC 3339 strings).
 *
 * `@wire Name` names the schema of the server's OpenAPI document a type
 * stands for: `test/openapi.test.ts` holds every such type to it (every
 * field the server always sends is declared, none the server lacks, `null`
 * where the server may send it), so that these types cannot drift.
 */

/** Any JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };
/** A JSON object: payloads, results, contexts. */
export type JsonObject = { [key: string]: Json };

/** @wire Status */
export type Status = "pending" | "running" | "completed" | "failed" | "cancelled";
/** @wire WorkflowStatus */
export type WorkflowStatus = "running" | "completed" | "failed" | "cancelled";
/** @wire StepStatus */
export type StepStatus = "waiting" | "pending" | "running" | "completed" | "failed" | "cancelled";

/** @wire ErrorEntryAnswer */
export interface ErrorEntry {
  attempt: number;
  error: string;
  at: string;
}

/** How one claim of a job ended (`running` while it has not); `lost`: its
 * lease expired, taken back by the janitor or claimed again.
 * @wire AttemptOutcome */
export type AttemptOutcome = "running" | "completed" | "failed" | "timed_out" | "lost" | "snoozed" | "cancelled";

/** One claim of a job: who claimed it and when, when and how it ended.
 * @wire AttemptEntryAnswer */
export interface AttemptEntry {
  attempt: number;
  worker_id: string | null;
  claimed_at: string | null;
  ended_at: string | null;
  outcome: AttemptOutcome;
  error: string | null;
}

/** A job, as every route shows it.
 * @wire JobAnswer */
export interface Job {
  id: string;
  tenant: string;
  queue: string;
  kind: string;
  payload: JsonObject;
  status: Status;
  priority: number;
  attempt: number;
  max_attempts: number;
  scheduled_at: string;
  created_at: string;
  updated_at: string;
  locked_until: string | null;
  worker_id: string | null;
  result: JsonObject | null;
  error: string | null;
  errors: ErrorEntry[];
  workflow_id: string | null;
  step: string | null;
  context: JsonObject | null;
  /** Each attempt ends this long after its claim (`config.timeout_secs`). */
  timeout_secs: number | null;
  /** The job's own retry backoff (`config.backoff`). */
  backoff: JsonObject | null;
  /** As enqueued (`config.headers`), `null` when none: a W3C `traceparent`
   * here is the trace the handler's span continues. */
  headers: Record<string, string> | null;
  /** The schedule whose tick enqueued it. */
  schedule: string | null;
  concurrency: ConcurrencyConfig | null;
  rate_limit: string | null;
  unique: UniqueConfig | null;
  /** The last progress its handler reported (`ctx.progress()`), and when. */
  progress: JsonObject | null;
  progress_at: string | null;
  /** Its claims, oldest first, the newest 20 kept. */
  attempts: AttemptEntry[];
}

/** A job's retry delays: the n-th failed attempt waits
 * `min(max_secs, initial_secs * factor ** (n - 1))`, less up to `jitter` of
 * it at random. A field left out is the server's default's.
 * @wire BackoffConfig */
export interface Backoff {
  initial_secs?: number;
  factor?: number;
  max_secs?: number;
  jitter?: number;
}

/** A claimed job and the token that proves the claim.
 * @wire LeaseAnswer */
export interface Lease {
  job: Job;
  lease_token: string;
}

// -- worker protocol ---------------------------------------------------------

/** @wire LeaseRequest */
export interface LeaseRequest {
  max_jobs?: number;
  lease_secs?: number;
  wait_secs?: number;
  worker_id?: string | null;
}

/** @wire LeasesAnswer */
export interface LeasesAnswer {
  jobs: Lease[];
}

/** @wire HeartbeatRequest */
export interface HeartbeatRequest {
  lease_token: string;
  extend_secs: number;
}

/** @wire ProgressRequest */
export interface ProgressRequest {
  lease_token: string;
  progress: JsonObject;
}

/** `status` is `running` (then `locked_until` is the new deadline) or the
 * status the job has instead: stop, report nothing.
 * @wire HeartbeatAnswer */
export interface HeartbeatAnswer {
  status: Status;
  locked_until?: string | null;
}

/** @wire CompleteRequest */
export interface CompleteRequest {
  lease_token: string;
  result?: JsonObject;
}

/** @wire FailRequest */
export interface FailRequest {
  lease_token: string;
  error: string;
  retryable?: boolean;
  /** The retry's delay instead of the backoff (0 to 30 days). */
  retry_in_secs?: number | null;
}

/** @wire SnoozeRequest */
export interface SnoozeRequest {
  lease_token: string;
  delay_secs: number;
}

/** @wire HeartbeatManyItem */
export interface HeartbeatItem {
  id: string;
  lease_token: string;
  extend_secs: number;
  /** The handler's latest progress, recorded with this heartbeat. */
  progress?: JsonObject | null;
}

/** @wire CompleteManyItem */
export interface CompleteItem {
  id: string;
  lease_token: string;
  result?: JsonObject;
}

/** @wire FailManyItem */
export interface FailItem {
  id: string;
  lease_token: string;
  error: string;
  retryable?: boolean;
  retry_in_secs?: number | null;
}

/** @wire SnoozeManyItem */
export interface SnoozeItem {
  id: string;
  lease_token: string;
  delay_secs: number;
}

/** @wire HeartbeatManyRequest */
export interface HeartbeatManyRequest {
  items: HeartbeatItem[];
}

/** @wire CompleteManyRequest */
export interface CompleteManyRequest {
  items: CompleteItem[];
}

/** @wire FailManyRequest */
export interface FailManyRequest {
  items: FailItem[];
}

/** @wire SnoozeManyRequest */
export interface SnoozeManyRequest {
  items: SnoozeItem[];
}

/** One item's answer in a batch report: `code` is what the single route
 * would have answered (200 or 204, 404 unknown job, 409 lease lost); a
 * heartbeat's 200 carries `status` (and `locked_until` when extended).
 * @wire ReportResultAnswer */
export interface ReportResult {
  id: string;
  code: 200 | 204 | 404 | 409;
  status?: Status | null;
  locked_until?: string | null;
}

/** @wire ReportResultsAnswer */
export interface ReportResultsAnswer {
  results: ReportResult[];
}

// -- application API ---------------------------------------------------------

/** At most `limit` running jobs of the tenant carry `key`.
 * @wire ConcurrencyConfig */
export interface ConcurrencyConfig {
  key: string;
  limit?: number;
}

/** While a job of the tenant with `key` is in one of `statuses` (created
 * less than `period_secs` ago), an enqueue answers that job.
 * @wire UniqueConfig */
export interface UniqueConfig {
  key: string;
  statuses?: Status[];
  period_secs?: number | null;
}

/** A job's `config` when enqueued: every field optional.
 * @wire JobConfig */
export interface JobConfig {
  queue?: string;
  priority?: number;
  max_attempts?: number;
  delay_secs?: number | null;
  scheduled_at?: string | null;
  idempotency_key?: string | null;
  /** Each attempt ends this long after its claim (1 s to 7 days). */
  timeout_secs?: number | null;
  backoff?: Backoff | null;
  /** Carried to the worker untouched: names are HTTP field names, values
   * hold no control character, at most 8 KiB in all. */
  headers?: Record<string, string> | null;
  concurrency?: ConcurrencyConfig | null;
  rate_limit?: string | null;
  unique?: UniqueConfig | null;
}

/** @wire EnqueueRequest */
export interface EnqueueRequest {
  kind: string;
  payload?: JsonObject;
  config?: JobConfig;
}

/** @wire EnqueueBatchRequest */
export interface EnqueueBatchRequest {
  jobs: EnqueueRequest[];
}

/** @wire JobsAnswer */
export interface JobsAnswer {
  jobs: Job[];
}

/** A page of jobs, newest first; `next_cursor` is `null` on the last page.
 * @wire JobsPageAnswer */
export interface JobsPage {
  jobs: Job[];
  next_cursor: string | null;
}

/** The query of `GET /api/v1/jobs`. */
/** Which of the tenant's jobs `Client.events()` follows (all by default),
 * and how often it sends each queue's stats (1..60 s; never by default). */
export interface EventsFilter {
  queue?: string;
  kind?: string;
  job?: string;
  stats_secs?: number;
}

/** A change of a job, as the event stream carries it: `at` is when it was
 * made, epoch seconds. */
export interface JobEvent {
  id: string;
  queue: string;
  kind: string;
  status: Status;
  attempt: number;
  progress: JsonObject | null;
  at: number;
}

/** One event of `Client.events()`. After an `overflow` (the reader fell
 * behind) the stream ends: read the jobs for what was missed. */
export type StreamEvent =
  | { event: "job"; data: JobEvent }
  | { event: "stats"; data: QueueStats }
  | { event: "overflow"; data: { max_behind: number } };

export interface JobsFilter {
  queue?: string;
  status?: Status;
  kind?: string;
  limit?: number;
  cursor?: string;
}

/** Jobs by status; `scheduled` counts the pending ones whose time has not
 * come (a delay, a retry's backoff, a snooze), up to 10,000.
 * @wire CountsAnswer */
export interface Counts {
  pending: number;
  running: number;
  completed: number;
  failed: number;
  cancelled: number;
  scheduled: number;
}

/** Of the pending jobs whose time has come, those a concurrency key at its
 * limit or a rate limit with no unit left holds back, each up to 10,000.
 * @wire HeldBackAnswer */
export interface HeldBack {
  concurrency: number;
  rate_limit: number;
}

/** @wire QueueStatsAnswer */
export interface QueueStats {
  queue: string;
  counts: Counts;
  held_back: HeldBack;
  oldest_ready_at: string | null;
  next_available_at: string | null;
  paused: boolean;
}

/** A page of queues, by name; `next_cursor` is `null` on the last page.
 * @wire QueuesAnswer */
export interface QueuesAnswer {
  queues: QueueStats[];
  next_cursor: string | null;
}

/** The query of `GET /api/v1/queues`: at most `limit` queues (default
 * 100, at most 1000), after the page whose `next_cursor` is `cursor`. */
export interface QueuesFilter {
  limit?: number;
  cursor?: string;
}

/** Which jobs a bulk action takes (`created_after <= created_at <
 * created_before`) and at most how many.
 * @wire BulkRequest */
export interface BulkFilter {
  queue?: string | null;
  status?: Status | null;
  kind?: string | null;
  created_after?: string | null;
  created_before?: string | null;
  limit?: number;
  /** Act on every job the action applies to when no filter is given. */
  all?: boolean;
}

/** @wire CountAnswer */
export interface CountAnswer {
  count: number;
}

/** @wire WorkerAnswer */
export interface WorkerInfo {
  worker_id: string;
  jobs: number;
  job_ids: string[];
  queues: string[];
  last_seen_at: string;
}

/** @wire WorkersAnswer */
export interface WorkersAnswer {
  workers: WorkerInfo[];
}

/** @wire RateLimitRequest */
export interface RateLimitRequest {
  limit: number;
  per_secs: number;
}

/** A rate limit: at most `limit` claims in any window of `per_secs`;
 * `next_available_at` is when a held-back job can next be claimed.
 * @wire RateLimitAnswer */
export interface RateLimit {
  name: string;
  limit: number;
  per_secs: number;
  next_available_at: string | null;
}

/** @wire RateLimitsAnswer */
export interface RateLimitsAnswer {
  rate_limits: RateLimit[];
}

/** @wire HealthAnswer */
export interface Health {
  status: "ok" | "unavailable";
}

// -- schedules ---------------------------------------------------------------

/** How a schedule catches up the ticks missed while no server ran. */
export type CatchUp = "latest" | "none" | "all";

/** `PUT /api/v1/schedules/{name}`.
 * @wire ScheduleRequest */
export interface ScheduleRequest {
  cron: string;
  timezone?: string;
  job: EnqueueRequest;
  paused?: boolean;
  catch_up?: CatchUp;
}

/** A cron schedule: each tick enqueues one job as `job` says.
 * @wire ScheduleAnswer */
export interface Schedule {
  name: string;
  tenant: string;
  cron: string;
  timezone: string;
  job: EnqueueRequest;
  paused: boolean;
  catch_up: string;
  next_run_at: string | null;
  last_run_at: string | null;
  last_job_id: string | null;
  created_at: string;
  updated_at: string;
}

/** A page of schedules by name; `next_cursor` is `null` on the last page.
 * @wire SchedulesAnswer */
export interface SchedulesPage {
  schedules: Schedule[];
  next_cursor: string | null;
}

/** What `scheduleTrigger` answers: the schedule and the job it enqueued.
 * @wire ScheduleTriggerAnswer */
export interface ScheduleTriggered {
  schedule: Schedule;
  job: Job;
}

/** The query of `GET /api/v1/schedules`. */
export interface SchedulesFilter {
  limit?: number;
  cursor?: string;
}

// -- workflows ---------------------------------------------------------------

/** @wire WorkflowStepRequest */
export interface WorkflowStepRequest {
  name: string;
  kind: string;
  payload?: JsonObject;
  depends_on?: string[];
  max_attempts?: number;
}

/** @wire WorkflowCreateRequest */
export interface WorkflowCreateRequest {
  name: string;
  context?: JsonObject;
  steps: WorkflowStepRequest[];
}

/** @wire StepsAddRequest */
export interface StepsAddRequest {
  lease_token: string;
  steps: WorkflowStepRequest[];
  collect?: string | null;
}

/** @wire WorkflowStepAnswer */
export interface WorkflowStep {
  name: string;
  kind: string;
  payload: JsonObject;
  depends_on: string[];
  max_attempts: number;
  status: StepStatus;
  job_id: string | null;
  /** The step that added it at run time, else `null`. */
  added_by?: string | null;
  job?: Job | null;
}

/** @wire WorkflowAnswer */
export interface Workflow {
  id: string;
  tenant: string;
  name: string;
  status: WorkflowStatus;
  context: JsonObject;
  steps: WorkflowStep[];
  created_at: string;
  updated_at: string;
}

/** @wire WorkflowsPageAnswer */
export interface WorkflowsPage {
  workflows: Workflow[];
  next_cursor: string | null;
}

/** The query of `GET /api/v1/workflows`. */
export interface WorkflowsFilter {
  status?: WorkflowStatus;
  limit?: number;
  cursor?: string;
}

/** @wire ErrorDetail */
export interface ErrorDetail {
  code: string;
  message: string;
}

/** @wire ErrorAnswer */
export interface ErrorAnswer {
  error: ErrorDetail;
}
