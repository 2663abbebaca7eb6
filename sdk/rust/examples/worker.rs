//! A worker for the queue "jobs". Start as many copies as you like, on as
//! many machines as you like: they share the queue, and when one dies, the
//! others finish its jobs once its leases run out.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use qftrio::{Client, Event, HandlerResult, Job, JobContext, Worker, WorkerOptions};
use serde_json::json;

/// Your job goes here. It can run more than once (a worker can die after
/// doing the work but before reporting it), so pass job.id to external
/// services as an idempotency key. Stop when `ctx.cancelled()` fires: the
/// job is no longer yours, or its lease is about to end.
async fn work(job: Job, ctx: JobContext) -> HandlerResult {
    let pretend = Duration::from_millis(1_000 + RandomState::new().build_hasher().finish() % 2_000);
    tokio::select! {
        _ = tokio::time::sleep(pretend) => {} // Pretend to call an API.
        _ = ctx.cancelled() => return Err(ctx.reason().unwrap_or_default().into()),
    }
    Ok(json!({"handledBy": job.worker_id, "attempt": job.attempt}))
}

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

fn number<T: std::str::FromStr>(name: &str, default: &str) -> T {
    env(name, default).parse().unwrap_or_else(|_| {
        eprintln!("{name} must be a number");
        std::process::exit(2)
    })
}

/// One line per event: `23:10:37 lane 1: claimed 01a2...`.
fn log(event: &Event) {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        % 86_400;
    let mut line = format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60);
    if let Some(lane) = event.lane {
        line += &format!(" lane {lane}:");
    }
    line += &format!(" {:?}", event.kind).to_lowercase();
    for part in [&event.job_id, &event.error].into_iter().flatten() {
        line += &format!(" {part}");
    }
    println!("{line}");
}

#[tokio::main]
async fn main() {
    let url = env("QFTRIO_URL", "http://127.0.0.1:8000");
    let token = env("QFTRIO_WORKER_TOKEN", "dev");
    let client = Client::new(&url, &token).unwrap_or_else(|error| {
        eprintln!("worker: {error}");
        std::process::exit(2)
    });
    // The first Ctrl+C or SIGTERM stops leasing and finishes held jobs; a
    // second quits at once (their leases expire and other workers take over).
    let options = WorkerOptions {
        lanes: number("WORKER_LANES", "4"),
        lease_secs: number("WORKER_LEASE_SECS", "10"),
        worker_id: std::env::var("WORKER_ID").ok(),
        on_event: Some(Arc::new(log)),
        ..WorkerOptions::default()
    };
    let worker = Worker::new(client, env("WORKER_QUEUE", "jobs"), options).register("work", work);
    if let Err(error) = worker.run().await {
        eprintln!("worker stopped: {error}");
        std::process::exit(2);
    }
}
