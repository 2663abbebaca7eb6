//! The conformance suite's adapter (tests/sdk_conformance/ADAPTER.md): the
//! SDK's worker on one queue, with the handlers the suite's scenarios name,
//! printing one JSON line per thing the suite watches.

use std::time::Duration;

use qftrio::{Client, Error, HandlerResult, Job, JobContext, Worker, WorkerOptions};
use serde_json::{json, Value};

fn setting(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        eprintln!("conformance adapter: {name} is not set");
        std::process::exit(2)
    })
}

fn number(name: &str) -> f64 {
    let text = setting(name);
    text.parse().unwrap_or_else(|_| {
        eprintln!("conformance adapter: {name}={text:?} is not a number");
        std::process::exit(2)
    })
}

fn print(line: Value) {
    // Rust's standard output is line-buffered: each line goes out whole, at once.
    println!("{line}");
}

fn started(job: &Job) {
    let headers = job.headers.clone().unwrap_or_default();
    print(
        json!({"event": "started", "job": job.id, "kind": job.kind, "attempt": job.attempt, "headers": headers}),
    );
}

fn returned(job: &Job, answer: HandlerResult) -> HandlerResult {
    print(json!({"event": "returned", "job": job.id}));
    answer
}

fn secs(job: &Job, field: &str) -> Duration {
    Duration::from_secs_f64(
        job.payload
            .get(field)
            .and_then(Value::as_f64)
            .unwrap_or(0.0)
            .max(0.0),
    )
}

fn message(job: &Job) -> String {
    job.payload
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// Wait `secs`, or until the job's token fires: then print `aborted`.
async fn wait(job: &Job, ctx: &JobContext, secs: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(secs) => true,
        _ = ctx.cancelled() => {
            print(json!({"event": "aborted", "job": job.id}));
            false
        }
    }
}

#[tokio::main]
async fn main() {
    let client =
        Client::new(&setting("QFTRIO_URL"), &setting("QFTRIO_TOKEN")).unwrap_or_else(|error| {
            eprintln!("conformance adapter: {error}");
            std::process::exit(2)
        });
    let options = WorkerOptions {
        lanes: number("ADAPTER_LANES") as usize,
        lease_secs: number("ADAPTER_LEASE_SECS") as u32,
        wait_secs: number("ADAPTER_WAIT_SECS"),
        worker_id: Some(setting("ADAPTER_WORKER_ID")),
        on_event: Some(std::sync::Arc::new(|event| eprintln!("{event:?}"))),
        ..WorkerOptions::default()
    };
    let worker = Worker::new(client, setting("ADAPTER_QUEUE"), options)
        .register("echo", |job, _ctx| async move {
            started(&job);
            let answer = Ok(json!({"echo": job.payload}));
            returned(&job, answer)
        })
        .register("sleep", |job, ctx| async move {
            started(&job);
            let secs = secs(&job, "secs");
            if !wait(&job, &ctx, secs).await {
                return Ok(json!({}));
            }
            returned(&job, Ok(json!({"slept": secs.as_secs_f64()})))
        })
        .register("fail", |job, _ctx| async move {
            started(&job);
            let error: Box<dyn std::error::Error + Send + Sync> = message(&job).into();
            returned(&job, Err(error))
        })
        .register("permanent", |job, _ctx| async move {
            started(&job);
            returned(&job, Err(Error::Permanent(message(&job)).into()))
        })
        .register("snooze", |job, _ctx| async move {
            started(&job);
            returned(&job, Err(Error::Snooze(secs(&job, "secs")).into()))
        })
        .register("retry_in", |job, _ctx| async move {
            started(&job);
            returned(
                &job,
                Err(Error::RetryIn(secs(&job, "secs"), message(&job)).into()),
            )
        })
        .register("progress", |job, ctx| async move {
            started(&job);
            if let Err(refused) =
                ctx.progress(job.payload.get("progress").cloned().unwrap_or(json!({})))
            {
                return returned(&job, Err(refused.into()));
            }
            if !wait(&job, &ctx, secs(&job, "then_secs")).await {
                return Ok(json!({}));
            }
            returned(&job, Ok(json!({})))
        })
        .register("headers", |job, _ctx| async move {
            started(&job);
            let headers = job.headers.clone().unwrap_or_default();
            returned(&job, Ok(json!({"headers": headers})))
        });
    print(json!({"event": "ready"}));
    match worker.run().await {
        Ok(()) => print(json!({"event": "stopped", "error": null})),
        Err(error) => {
            print(json!({"event": "stopped", "error": error.to_string()}));
            std::process::exit(2);
        }
    }
}
