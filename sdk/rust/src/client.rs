//! `Client`: a method per route of the API, over one pooled HTTP/1.1 connection set.

use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::routes::{self, Route};
use crate::types::*;

/// Path and query parts keep only RFC 3986's unreserved characters as they are.
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');
/// An answer larger than this is refused rather than held in memory
/// (the server's own answers are capped far below it).
const MAX_ANSWER_BYTES: usize = 64 << 20;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A client of one qftrio server with one token. Cloning is cheap and
/// shares the connection pool.
#[derive(Clone)]
pub struct Client {
    base: String,
    authorization: HeaderValue,
    timeout: Duration,
    http: hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token stays out of logs.
        f.debug_struct("Client").field("url", &self.base).finish()
    }
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Deserialize)]
struct ErrorDetail {
    code: String,
    message: String,
}

#[derive(Deserialize)]
struct Jobs {
    jobs: Vec<Lease>,
}

#[derive(Deserialize)]
struct Results {
    results: Vec<ReportResult>,
}

#[derive(Deserialize)]
struct JobList {
    jobs: Vec<Job>,
}

#[derive(Deserialize)]
struct Count {
    count: u64,
}

#[derive(Deserialize)]
struct Workers {
    workers: Vec<WorkerInfo>,
}

#[derive(Deserialize)]
struct RateLimits {
    rate_limits: Vec<RateLimit>,
}

#[derive(Serialize)]
struct Items<T> {
    items: Vec<T>,
}

/// A `204` answer's body: nothing (read from an empty body, refusing any other).
struct NoContent;

fn one_line(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() > 200 {
        line.chars().take(200).collect::<String>() + "..."
    } else {
        line
    }
}

impl Client {
    /// A client of the server at `url` (`http://host:port`) with `token`
    /// (a worker token for the worker routes, a tenant token for the rest).
    pub fn new(url: &str, token: &str) -> Result<Client> {
        let base = url.trim_end_matches('/');
        let uri: Uri = base
            .parse()
            .map_err(|e| Error::Config(format!("url {url:?} is not a URL: {e}")))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(Error::Config(format!(
                    "url {url:?}: this crate speaks plain HTTP (no TLS stack is compiled in); \
                     reach the server over http:// or through a local TLS-terminating proxy"
                )))
            }
            _ => {
                return Err(Error::Config(format!(
                    "url {url:?}: expected http://host:port"
                )))
            }
        }
        if uri.authority().is_none() || uri.query().is_some() {
            return Err(Error::Config(format!(
                "url {url:?}: expected http://host:port"
            )));
        }
        if token.is_empty() {
            return Err(Error::Config("token: a client needs a token".into()));
        }
        let mut authorization = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| Error::Config("token: it cannot be sent as a header".into()))?;
        authorization.set_sensitive(true);
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let http = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Client {
            base: base.to_owned(),
            authorization,
            timeout: DEFAULT_TIMEOUT,
            http,
        })
    }

    /// This client, with each call given up after `timeout` (default 10 s;
    /// a long poll gets its `wait_secs` on top).
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    /// The server's base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    async fn call<T: DeserializeOwned>(
        &self,
        route: &Route,
        params: &[&str],
        query: &[(&str, String)],
        body: Option<Value>,
        extra: Duration,
    ) -> Result<T> {
        let (path, target) = target_of(route, params, query);
        let transport = |message: String| Error::Transport {
            method: route.method,
            path: path.clone(),
            message,
        };
        let bytes = match &body {
            Some(body) => Bytes::from(serde_json::to_vec(body).expect("a JSON value serializes")),
            None => Bytes::new(),
        };
        let mut request = Request::builder()
            .method(Method::from_bytes(route.method.as_bytes()).expect("a route's method is valid"))
            .uri(format!("{}{target}", self.base))
            .header(AUTHORIZATION, self.authorization.clone());
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(bytes))
            .map_err(|e| transport(format!("cannot build the request: {e}")))?;
        let exchange = async {
            let answer = self
                .http
                .request(request)
                .await
                .map_err(|e| transport(describe_chain(&e)))?;
            let status = answer.status().as_u16();
            let body = Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| transport(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok::<_, Error>((status, body))
        };
        let (status, body) = tokio::time::timeout(self.timeout + extra, exchange)
            .await
            .map_err(|_| transport(format!("no answer within {:?}", self.timeout + extra)))??;
        if status >= 400 {
            return Err(api_error(status, &body));
        }
        serde_json::from_slice(&body).map_err(|e| {
            Error::Unexpected(format!(
                "{} {path} answered {status} with a body that is not qftrio's ({e}): {}",
                route.method,
                one_line(&String::from_utf8_lossy(&body))
            ))
        })
    }

    /// The tenant's live job changes from any server (`GET /api/v1/events`),
    /// as an [`EventStream`]: a live feed, not a log (nothing is replayed; a
    /// reader that falls behind gets an `overflow` event and the stream ends).
    pub async fn events(&self, filter: &EventsFilter) -> Result<EventStream> {
        let mut query = Vec::new();
        for (name, value) in [
            ("queue", &filter.queue),
            ("kind", &filter.kind),
            ("job", &filter.job),
        ] {
            if let Some(value) = value {
                query.push((name, value.clone()));
            }
        }
        if let Some(secs) = filter.stats_secs {
            query.push(("stats_secs", secs.to_string()));
        }
        let route = &routes::EVENTS;
        let (path, target) = target_of(route, &[], &query);
        let transport = |message: String| Error::Transport {
            method: route.method,
            path: path.clone(),
            message,
        };
        let request = Request::builder()
            .method(Method::GET)
            .uri(format!("{}{target}", self.base))
            .header(AUTHORIZATION, self.authorization.clone())
            .body(Full::new(Bytes::new()))
            .map_err(|e| transport(format!("cannot build the request: {e}")))?;
        let answer = tokio::time::timeout(self.timeout, self.http.request(request))
            .await
            .map_err(|_| transport(format!("no answer within {:?}", self.timeout)))?
            .map_err(|e| transport(describe_chain(&e)))?;
        let status = answer.status().as_u16();
        if status >= 400 {
            let body = Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| transport(format!("reading the answer: {e}")))?
                .to_bytes();
            return Err(api_error(status, &body));
        }
        Ok(EventStream {
            body: answer.into_body(),
            buffer: Vec::new(),
            path,
        })
    }

    // -- the worker protocol (worker token) ---------------------------------

    /// Lease up to `request.max_jobs` jobs of `queue`, waiting up to `request.wait_secs` for one.
    pub async fn lease(&self, queue: &str, request: &LeaseRequest) -> Result<Vec<Lease>> {
        let wait = Duration::from_secs_f64(request.wait_secs.clamp(0.0, 60.0));
        let body = serde_json::to_value(request).expect("a lease request serializes");
        let answer: Jobs = self
            .call(&routes::LEASE, &[queue], &[], Some(body), wait)
            .await?;
        Ok(answer.jobs)
    }

    /// Extend one job's lease by `extend_secs` from now.
    pub async fn heartbeat(
        &self,
        job_id: &str,
        lease_token: &str,
        extend_secs: u32,
    ) -> Result<HeartbeatAnswer> {
        let body = json!({"lease_token": lease_token, "extend_secs": extend_secs});
        self.call(
            &routes::HEARTBEAT,
            &[job_id],
            &[],
            Some(body),
            Duration::ZERO,
        )
        .await
    }

    /// Record how far a job's handler has got (a JSON object of at most
    /// 8 KiB; the latest wins), extending nothing; the same answers as
    /// `heartbeat`. A handler the `Worker` runs reports with `ctx.progress()`.
    pub async fn job_progress(
        &self,
        job_id: &str,
        lease_token: &str,
        progress: Object,
    ) -> Result<HeartbeatAnswer> {
        let body = json!({"lease_token": lease_token, "progress": progress});
        self.call(
            &routes::PROGRESS,
            &[job_id],
            &[],
            Some(body),
            Duration::ZERO,
        )
        .await
    }

    /// Complete a job with `result`.
    pub async fn complete(&self, job_id: &str, lease_token: &str, result: Object) -> Result<()> {
        let body = json!({"lease_token": lease_token, "result": result});
        self.call::<NoContent>(
            &routes::COMPLETE,
            &[job_id],
            &[],
            Some(body),
            Duration::ZERO,
        )
        .await?;
        Ok(())
    }

    /// Add steps (at most 1000 a call) to the workflow of the running step
    /// `job_id`, whose lease `lease_token` holds (worker token). They run once
    /// that step has completed, and the steps waiting for it wait for them
    /// too; with `collect`, their results go, in this order, to a list under
    /// that key of the context. The same call repeated changes nothing. A lost
    /// lease is an `Error::Api` 409; steps that do not fit the workflow, 422.
    pub async fn steps_add(
        &self,
        job_id: &str,
        lease_token: &str,
        steps: Vec<StepSpec>,
        collect: Option<&str>,
    ) -> Result<Workflow> {
        let body = json!({"lease_token": lease_token, "steps": steps, "collect": collect});
        self.call(
            &routes::STEPS_ADD,
            &[job_id],
            &[],
            Some(body),
            Duration::ZERO,
        )
        .await
    }

    /// Fail a job; `retry_in` replaces its backoff's delay.
    pub async fn fail(
        &self,
        job_id: &str,
        lease_token: &str,
        error: &str,
        retryable: bool,
        retry_in: Option<Duration>,
    ) -> Result<()> {
        let mut body = json!({"lease_token": lease_token, "error": error, "retryable": retryable});
        if let Some(delay) = retry_in {
            body["retry_in_secs"] = json!(delay.as_secs_f64());
        }
        self.call::<NoContent>(&routes::FAIL, &[job_id], &[], Some(body), Duration::ZERO)
            .await?;
        Ok(())
    }

    /// Put a job back to pending for `delay` without using up its attempt.
    pub async fn snooze(&self, job_id: &str, lease_token: &str, delay: Duration) -> Result<()> {
        let body = json!({"lease_token": lease_token, "delay_secs": delay.as_secs_f64()});
        self.call::<NoContent>(&routes::SNOOZE, &[job_id], &[], Some(body), Duration::ZERO)
            .await?;
        Ok(())
    }

    async fn many<T: Serialize>(&self, route: &Route, items: Vec<T>) -> Result<Vec<ReportResult>> {
        let body = serde_json::to_value(Items { items }).expect("report items serialize");
        let answer: Results = self
            .call(route, &[], &[], Some(body), Duration::ZERO)
            .await?;
        Ok(answer.results)
    }

    /// Renew many leases in one call; one answer per item, in order.
    pub async fn heartbeat_many(&self, items: Vec<HeartbeatItem>) -> Result<Vec<ReportResult>> {
        self.many(&routes::HEARTBEAT_MANY, items).await
    }

    /// Complete many jobs in one call.
    pub async fn complete_many(&self, items: Vec<CompleteItem>) -> Result<Vec<ReportResult>> {
        self.many(&routes::COMPLETE_MANY, items).await
    }

    /// Fail many jobs in one call.
    pub async fn fail_many(&self, items: Vec<FailItem>) -> Result<Vec<ReportResult>> {
        self.many(&routes::FAIL_MANY, items).await
    }

    /// Snooze many jobs in one call.
    pub async fn snooze_many(&self, items: Vec<SnoozeItem>) -> Result<Vec<ReportResult>> {
        self.many(&routes::SNOOZE_MANY, items).await
    }

    // -- the application API (tenant token) ---------------------------------

    /// Enqueue one job (or get the one an idempotency or unique key names).
    pub async fn enqueue(&self, kind: &str, payload: Object, config: JobConfig) -> Result<Job> {
        let body = serde_json::to_value(NewJob {
            kind: kind.to_owned(),
            payload,
            config,
        })
        .expect("a job serializes");
        self.call(&routes::ENQUEUE, &[], &[], Some(body), Duration::ZERO)
            .await
    }

    /// Enqueue up to 1000 jobs in one transaction.
    pub async fn enqueue_many(&self, jobs: Vec<NewJob>) -> Result<Vec<Job>> {
        let body = json!({"jobs": jobs});
        let answer: JobList = self
            .call(&routes::ENQUEUE_MANY, &[], &[], Some(body), Duration::ZERO)
            .await?;
        Ok(answer.jobs)
    }

    pub async fn job_get(&self, job_id: &str) -> Result<Job> {
        self.call(&routes::JOB_GET, &[job_id], &[], None, Duration::ZERO)
            .await
    }

    /// The job once it has ended (completed, failed or cancelled), or as it
    /// stands after `timeout` (at most 60 s): read its `status`. The server
    /// wakes the wait within milliseconds of the end, from any server.
    pub async fn job_wait(&self, job_id: &str, timeout: Duration) -> Result<Job> {
        let query = [("timeout_secs", timeout.as_secs_f64().to_string())];
        self.call(&routes::JOB_WAIT, &[job_id], &query, None, timeout)
            .await
    }

    /// A page of the tenant's jobs, newest first.
    pub async fn jobs_list(&self, filter: &JobsFilter) -> Result<JobsPage> {
        let mut query = Vec::new();
        if let Some(queue) = &filter.queue {
            query.push(("queue", queue.clone()));
        }
        if let Some(status) = filter.status {
            query.push(("status", status.as_str().to_owned()));
        }
        if let Some(kind) = &filter.kind {
            query.push(("kind", kind.clone()));
        }
        page_query(&mut query, filter.limit, &filter.cursor);
        self.call(&routes::JOBS_LIST, &[], &query, None, Duration::ZERO)
            .await
    }

    pub async fn job_cancel(&self, job_id: &str) -> Result<Job> {
        self.call(&routes::JOB_CANCEL, &[job_id], &[], None, Duration::ZERO)
            .await
    }

    pub async fn job_retry(&self, job_id: &str) -> Result<Job> {
        self.call(&routes::JOB_RETRY, &[job_id], &[], None, Duration::ZERO)
            .await
    }

    /// Retry, cancel or delete the jobs `filter` takes; answers how many.
    pub async fn jobs_bulk(&self, action: BulkAction, filter: &BulkFilter) -> Result<u64> {
        let route = match action {
            BulkAction::Retry => &routes::JOBS_BULK_RETRY,
            BulkAction::Cancel => &routes::JOBS_BULK_CANCEL,
            BulkAction::Delete => &routes::JOBS_BULK_DELETE,
        };
        let body = serde_json::to_value(filter).expect("a filter serializes");
        let answer: Count = self
            .call(route, &[], &[], Some(body), Duration::ZERO)
            .await?;
        Ok(answer.count)
    }

    /// The first page of the tenant's queues.
    pub async fn queues(&self) -> Result<Vec<QueueStats>> {
        Ok(self.queues_page(None, None).await?.queues)
    }

    pub async fn queues_page(
        &self,
        limit: Option<u32>,
        cursor: Option<String>,
    ) -> Result<QueuesPage> {
        let mut query = Vec::new();
        page_query(&mut query, limit, &cursor);
        self.call(&routes::QUEUES, &[], &query, None, Duration::ZERO)
            .await
    }

    pub async fn queue_stats(&self, queue: &str) -> Result<QueueStats> {
        self.call(&routes::QUEUE_STATS, &[queue], &[], None, Duration::ZERO)
            .await
    }

    pub async fn queue_pause(&self, queue: &str) -> Result<QueueStats> {
        self.call(&routes::QUEUE_PAUSE, &[queue], &[], None, Duration::ZERO)
            .await
    }

    pub async fn queue_resume(&self, queue: &str) -> Result<QueueStats> {
        self.call(&routes::QUEUE_RESUME, &[queue], &[], None, Duration::ZERO)
            .await
    }

    /// The live workers.
    pub async fn workers(&self) -> Result<Vec<WorkerInfo>> {
        let answer: Workers = self
            .call(&routes::WORKERS, &[], &[], None, Duration::ZERO)
            .await?;
        Ok(answer.workers)
    }

    pub async fn rate_limit_set(&self, name: &str, limit: u64, per_secs: f64) -> Result<RateLimit> {
        let body = json!({"limit": limit, "per_secs": per_secs});
        self.call(
            &routes::RATE_LIMIT_SET,
            &[name],
            &[],
            Some(body),
            Duration::ZERO,
        )
        .await
    }

    pub async fn rate_limit_get(&self, name: &str) -> Result<RateLimit> {
        self.call(&routes::RATE_LIMIT_GET, &[name], &[], None, Duration::ZERO)
            .await
    }

    pub async fn rate_limits_list(&self) -> Result<Vec<RateLimit>> {
        let answer: RateLimits = self
            .call(&routes::RATE_LIMITS_LIST, &[], &[], None, Duration::ZERO)
            .await?;
        Ok(answer.rate_limits)
    }

    pub async fn rate_limit_delete(&self, name: &str) -> Result<()> {
        self.call::<NoContent>(
            &routes::RATE_LIMIT_DELETE,
            &[name],
            &[],
            None,
            Duration::ZERO,
        )
        .await?;
        Ok(())
    }

    pub async fn workflow_create(
        &self,
        name: &str,
        steps: Vec<StepSpec>,
        context: Object,
    ) -> Result<Workflow> {
        let body = json!({"name": name, "steps": steps, "context": context});
        self.call(
            &routes::WORKFLOW_CREATE,
            &[],
            &[],
            Some(body),
            Duration::ZERO,
        )
        .await
    }

    pub async fn workflow_get(&self, workflow_id: &str) -> Result<Workflow> {
        self.call(
            &routes::WORKFLOW_GET,
            &[workflow_id],
            &[],
            None,
            Duration::ZERO,
        )
        .await
    }

    pub async fn workflows_list(
        &self,
        status: Option<WorkflowStatus>,
        limit: Option<u32>,
        cursor: Option<String>,
    ) -> Result<WorkflowsPage> {
        let mut query = Vec::new();
        if let Some(status) = status {
            let status = serde_json::to_value(status).expect("a status serializes");
            query.push(("status", status.as_str().unwrap_or_default().to_owned()));
        }
        page_query(&mut query, limit, &cursor);
        self.call(&routes::WORKFLOWS_LIST, &[], &query, None, Duration::ZERO)
            .await
    }

    pub async fn workflow_cancel(&self, workflow_id: &str) -> Result<Workflow> {
        self.call(
            &routes::WORKFLOW_CANCEL,
            &[workflow_id],
            &[],
            None,
            Duration::ZERO,
        )
        .await
    }

    pub async fn schedule_set(&self, name: &str, spec: &ScheduleSpec) -> Result<Schedule> {
        let body = serde_json::to_value(spec).expect("a schedule serializes");
        self.call(
            &routes::SCHEDULE_SET,
            &[name],
            &[],
            Some(body),
            Duration::ZERO,
        )
        .await
    }

    pub async fn schedule_get(&self, name: &str) -> Result<Schedule> {
        self.call(&routes::SCHEDULE_GET, &[name], &[], None, Duration::ZERO)
            .await
    }

    pub async fn schedules_list(
        &self,
        limit: Option<u32>,
        cursor: Option<String>,
    ) -> Result<SchedulesPage> {
        let mut query = Vec::new();
        page_query(&mut query, limit, &cursor);
        self.call(&routes::SCHEDULES_LIST, &[], &query, None, Duration::ZERO)
            .await
    }

    pub async fn schedule_delete(&self, name: &str) -> Result<()> {
        self.call::<NoContent>(&routes::SCHEDULE_DELETE, &[name], &[], None, Duration::ZERO)
            .await?;
        Ok(())
    }

    pub async fn schedule_pause(&self, name: &str) -> Result<Schedule> {
        self.call(&routes::SCHEDULE_PAUSE, &[name], &[], None, Duration::ZERO)
            .await
    }

    pub async fn schedule_resume(&self, name: &str) -> Result<Schedule> {
        self.call(&routes::SCHEDULE_RESUME, &[name], &[], None, Duration::ZERO)
            .await
    }

    /// Enqueue the schedule's job now.
    pub async fn schedule_trigger(&self, name: &str) -> Result<ScheduleTrigger> {
        self.call(
            &routes::SCHEDULE_TRIGGER,
            &[name],
            &[],
            None,
            Duration::ZERO,
        )
        .await
    }

    /// `GET /healthz`: `ok`, or `unavailable` (a `503`) when the server cannot reach its database.
    pub async fn health(&self) -> Result<Health> {
        self.call(&routes::HEALTH, &[], &[], None, Duration::ZERO)
            .await
    }
}

impl<'de> Deserialize<'de> for NoContent {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> std::result::Result<Self, D::Error> {
        Ok(NoContent)
    }
}

fn page_query(query: &mut Vec<(&str, String)>, limit: Option<u32>, cursor: &Option<String>) {
    if let Some(limit) = limit {
        query.push(("limit", limit.to_string()));
    }
    if let Some(cursor) = cursor {
        query.push(("cursor", cursor.clone()));
    }
}

/// An error with its causes, one line (hyper's outer errors say little alone).
pub(crate) fn describe_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A route's path with its parameters, and that path with its query.
fn target_of(route: &Route, params: &[&str], query: &[(&str, String)]) -> (String, String) {
    let mut parts = route.path.split('{');
    let mut path = parts.next().unwrap_or_default().to_owned();
    for (part, param) in parts.zip(params) {
        // Each parameter is one path segment, whatever it holds.
        path.extend(utf8_percent_encode(param, COMPONENT).map(str::to_owned));
        path.push_str(part.split_once('}').map_or("", |(_, rest)| rest));
    }
    let mut target = path.clone();
    for (i, (name, value)) in query.iter().enumerate() {
        target.push(if i == 0 { '?' } else { '&' });
        target.push_str(name);
        target.push('=');
        target.extend(utf8_percent_encode(value, COMPONENT).map(str::to_owned));
    }
    (path, target)
}

/// What [`Client::events`] streams: the tenant's jobs of `queue`, `kind` or
/// `job` (each optional), and with `stats_secs` (1 to 60) each named queue's
/// stats that often.
#[derive(Debug, Clone, Default)]
pub struct EventsFilter {
    pub queue: Option<String>,
    pub kind: Option<String>,
    pub job: Option<String>,
    pub stats_secs: Option<u32>,
}

/// One server-sent event: `kind` is `job`, `stats` or `overflow`, `data` its JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamEvent {
    pub kind: String,
    pub data: Value,
}

/// An open event stream ([`Client::events`]); dropping it closes it.
pub struct EventStream {
    body: hyper::body::Incoming,
    buffer: Vec<u8>,
    path: String,
}

impl EventStream {
    /// The next event, or `None` once the stream has ended.
    pub async fn next(&mut self) -> Result<Option<StreamEvent>> {
        loop {
            // An event ends with a blank line.
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let text = String::from_utf8_lossy(&block);
                let (mut kind, mut data) = (String::new(), Vec::new());
                for line in text.lines() {
                    if let Some(rest) = line.strip_prefix("event:") {
                        kind = rest.trim().to_owned();
                    } else if let Some(rest) = line.strip_prefix("data:") {
                        data.push(rest.strip_prefix(' ').unwrap_or(rest).to_owned());
                    }
                }
                if kind.is_empty() && data.is_empty() {
                    continue; // a keep-alive comment
                }
                let data = serde_json::from_str(&data.join("\n")).map_err(|e| {
                    Error::Unexpected(format!(
                        "GET {} sent an event that is not JSON: {e}",
                        self.path
                    ))
                })?;
                return Ok(Some(StreamEvent { kind, data }));
            }
            if self.buffer.len() > MAX_ANSWER_BYTES {
                return Err(Error::Unexpected(format!(
                    "GET {} sent an event over {MAX_ANSWER_BYTES} bytes",
                    self.path
                )));
            }
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => {
                    return Err(Error::Transport {
                        method: "GET",
                        path: self.path.clone(),
                        message: format!("reading the stream: {e}"),
                    })
                }
                Some(Ok(frame)) => {
                    if let Ok(chunk) = frame.into_data() {
                        self.buffer.extend_from_slice(&chunk);
                    }
                }
            }
        }
    }
}

/// The error an answer of *status* (400 or more) with *body* stands for.
fn api_error(status: u16, body: &[u8]) -> Error {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(ErrorBody { error }) => Error::Api {
            status,
            code: Some(error.code),
            message: error.message,
        },
        Err(_) => Error::Api {
            status,
            code: None,
            message: one_line(&String::from_utf8_lossy(body)),
        },
    }
}
