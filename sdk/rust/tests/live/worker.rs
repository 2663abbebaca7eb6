//! What is particular to the Rust worker: the per-job cancellation token,
//! `run_until`'s drain, `run` returning with no task left, and its errors.
//! The rules every runtime keeps are the conformance suite's
//! (tests/sdk_conformance/); these check them lightly.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use qftrio::*;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::{client, job_until, obj, queue, server, settled};

/// Generous: it only turns a hang into a failure.
const CAP: Duration = Duration::from_secs(60);

fn options(lanes: usize, lease_secs: u32) -> WorkerOptions {
    WorkerOptions {
        lanes,
        lease_secs,
        wait_secs: 1.0,
        worker_id: Some("rust-worker-test".into()),
        handle_signals: false,
        ..WorkerOptions::default()
    }
}

async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(CAP, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not happen"))
}

#[tokio::test]
async fn the_token_fires_when_the_job_is_cancelled_and_nothing_is_reported() {
    let client = client();
    let q = queue("cancel");
    let job = client
        .enqueue("wait", Object::new(), JobConfig::queue(&q))
        .await
        .unwrap();
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let (saw, mut saw_rx) = mpsc::unbounded_channel::<Option<String>>();
    let events = Arc::new(Mutex::new(Vec::new()));
    let seen = events.clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let worker = Worker::new(
        client.clone(),
        &q,
        WorkerOptions {
            on_event: Some(Arc::new(move |e: &Event| {
                seen.lock().unwrap().push(e.clone())
            })),
            ..options(1, 2)
        },
    )
    .register("wait", move |_job, ctx| {
        let (started, saw) = (started.clone(), saw.clone());
        async move {
            started.send(()).unwrap();
            ctx.cancelled().await;
            saw.send(ctx.reason()).unwrap();
            Ok(json!({"finished": "after all"}))
        }
    });
    let running = tokio::spawn(worker.run_until(async {
        let _ = stopped.await;
    }));
    within("the handler starting", started_rx.recv()).await;
    client.job_cancel(&job.id).await.unwrap();
    // The next heartbeat (every lease_secs / 2) learns of it.
    let reason = within("the token firing", saw_rx.recv()).await.unwrap();
    assert_eq!(reason.as_deref(), Some("the job is cancelled"));
    stop.send(()).unwrap();
    within("run_until returning", running)
        .await
        .unwrap()
        .unwrap();
    let job = client.job_get(&job.id).await.unwrap();
    assert_eq!((job.status, job.result), (Status::Cancelled, None));
    let kinds: Vec<_> = events.lock().unwrap().iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [EventKind::Claimed, EventKind::Lost, EventKind::Stopping]
    );
}

#[tokio::test]
async fn run_until_drains_held_jobs_and_leases_nothing_more() {
    let client = client();
    let q = queue("drain");
    let first = client
        .enqueue("hold", Object::new(), JobConfig::queue(&q))
        .await
        .unwrap();
    let (started, mut started_rx) = mpsc::unbounded_channel();
    let release = Arc::new(tokio::sync::Notify::new());
    let released = release.clone();
    let worker =
        Worker::new(client.clone(), &q, options(2, 30)).register("hold", move |job, ctx| {
            let (started, released) = (started.clone(), released.clone());
            async move {
                started.send(job.id.clone()).unwrap();
                released.notified().await;
                Ok(json!({"cancelled": ctx.is_cancelled()}))
            }
        });
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(worker.run_until(async {
        let _ = stopped.await;
    }));
    assert_eq!(
        within("the handler starting", started_rx.recv())
            .await
            .unwrap(),
        first.id
    );
    stop.send(()).unwrap();
    // Draining: the long poll in flight is abandoned, nothing more leased.
    tokio::task::yield_now().await;
    let second = client
        .enqueue("hold", Object::new(), JobConfig::queue(&q))
        .await
        .unwrap();
    release.notify_one();
    within("run_until returning", running)
        .await
        .unwrap()
        .unwrap();
    let done = client.job_get(&first.id).await.unwrap();
    assert_eq!(
        (done.status, done.result),
        (Status::Completed, Some(obj(json!({"cancelled": false}))))
    );
    assert_eq!(
        client.job_get(&second.id).await.unwrap().status,
        Status::Pending
    );
    assert!(
        started_rx.try_recv().is_err(),
        "a job was leased while draining"
    );
}

#[tokio::test]
async fn run_returns_with_no_task_left() {
    let client = client();
    let q = queue("tasks");
    let mut config = JobConfig::queue(&q);
    config.timeout_secs = Some(1);
    config.max_attempts = Some(1);
    // A handler that ignores its token: it outlives its job's timeout.
    let ignoring = client
        .enqueue("stubborn", Object::new(), config)
        .await
        .unwrap();
    for n in 0..3 {
        client
            .enqueue("quick", obj(json!({"n": n})), JobConfig::queue(&q))
            .await
            .unwrap();
    }
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    let (done, mut done_rx) = mpsc::unbounded_channel::<String>();
    let (finish, finished) = oneshot::channel::<()>();
    let finished = Arc::new(Mutex::new(Some(finished)));
    let quick = done.clone();
    // A client of its own: the connections of a pool it shared would stay open.
    let worker = Worker::new(crate::client(), &q, options(4, 30))
        .register("stubborn", move |job, ctx| {
            let (done, finished) = (done.clone(), finished.lock().unwrap().take());
            async move {
                ctx.cancelled().await;
                done.send(job.id.clone()).unwrap();
                // It stops only when the test says so, long after the timeout.
                if let Some(finished) = finished {
                    let _ = finished.await;
                }
                Ok(json!({}))
            }
        })
        .register("quick", move |job, _ctx| {
            let done = quick.clone();
            async move {
                done.send(job.id.clone()).unwrap();
                Ok(json!({}))
            }
        });
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(worker.run_until(async {
        let _ = stopped.await;
    }));
    let mut seen = Vec::new();
    while seen.len() < 4 {
        seen.push(within("the handlers", done_rx.recv()).await.unwrap());
    }
    assert!(seen.contains(&ignoring.id));
    // The job failed at its deadline, its handler still running.
    let timed_out = settled(&client, &ignoring.id).await;
    assert_eq!(
        (timed_out.status, timed_out.error.as_deref()),
        (Status::Failed, Some("timed out after 1 s"))
    );
    stop.send(()).unwrap();
    tokio::task::yield_now().await;
    assert!(
        !running.is_finished(),
        "run_until returned before its handler ended"
    );
    finish.send(()).unwrap();
    within("run_until returning", running)
        .await
        .unwrap()
        .unwrap();
    // Only the pool's connection tasks can outlive it: they end as soon as
    // the runtime polls them after their client is dropped.
    for _ in 0..1000 {
        if metrics.num_alive_tasks() <= before {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert!(
        metrics.num_alive_tasks() <= before,
        "{} tasks left, {before} before",
        metrics.num_alive_tasks()
    );
}

#[tokio::test]
async fn handler_errors_end_jobs_as_they_say() {
    let client = client();
    let q = queue("errors");
    let mut config = JobConfig::queue(&q);
    config.max_attempts = Some(3);
    let mut ids = Vec::new();
    for kind in [
        "ok",
        "null",
        "permanent",
        "snooze",
        "retry-in",
        "other",
        "array",
        "panics",
        "unknown",
    ] {
        ids.push(
            client
                .enqueue(kind, Object::new(), config.clone())
                .await
                .unwrap()
                .id,
        );
    }
    let (stop, stopped) = oneshot::channel::<()>();
    let stop = Arc::new(Mutex::new(Some(stop)));
    let (reported, mut reported_rx) = mpsc::unbounded_channel::<()>();
    let worker = Worker::new(
        client.clone(),
        &q,
        WorkerOptions {
            on_event: Some(Arc::new(move |e: &Event| {
                if matches!(
                    e.kind,
                    EventKind::Completed | EventKind::Failed | EventKind::Snoozed
                ) {
                    let _ = reported.send(());
                }
            })),
            ..options(10, 30)
        },
    )
    .register("ok", |job, _ctx| async move {
        Ok(json!({"attempt": job.attempt}))
    })
    .register(
        "null",
        |_job, _ctx| async move { Ok(serde_json::Value::Null) },
    )
    .register("permanent", |_job, _ctx| async move {
        Err(Error::Permanent("bad input".into()).into())
    })
    .register("snooze", |_job, _ctx| async move {
        Err(Error::Snooze(Duration::from_secs(600)).into())
    })
    .register("retry-in", |_job, _ctx| async move {
        Err(Error::RetryIn(Duration::from_secs(900), "upstream busy".into()).into())
    })
    .register("other", |_job, _ctx| async move {
        let number: i32 = "x".parse()?;
        Ok(json!({"n": number}))
    })
    .register("array", |_job, _ctx| async move { Ok(json!([1])) })
    .register("panics", |_job, _ctx| async move {
        if true {
            panic!("on purpose");
        }
        Ok(json!({}))
    });
    let running = tokio::spawn(worker.run_until(async {
        let _ = stopped.await;
    }));
    for _ in 0..9 {
        within("a report", reported_rx.recv()).await;
    }
    stop.lock().unwrap().take().unwrap().send(()).unwrap();
    within("run_until returning", running)
        .await
        .unwrap()
        .unwrap();
    let mut jobs = Vec::new();
    for id in &ids {
        let job = client.job_get(id).await.unwrap();
        jobs.push((
            job.status,
            job.error.unwrap_or_default(),
            job.result,
            job.max_attempts,
        ));
    }
    let done = |result| (Status::Completed, String::new(), Some(obj(result)), 3);
    assert_eq!(jobs[0], done(json!({"attempt": 1})));
    assert_eq!(jobs[1], done(json!({})));
    assert_eq!(jobs[2], (Status::Failed, "bad input".into(), None, 3));
    assert_eq!(jobs[3], (Status::Pending, String::new(), None, 4));
    assert_eq!(jobs[4], (Status::Pending, "upstream busy".into(), None, 3));
    assert_eq!(
        jobs[5],
        (
            Status::Pending,
            "invalid digit found in string".into(),
            None,
            3
        )
    );
    assert_eq!(jobs[6].0, Status::Failed);
    assert!(jobs[6].1.contains("an array"), "{}", jobs[6].1);
    assert_eq!(
        jobs[7],
        (Status::Pending, "the handler panicked".into(), None, 3)
    );
    assert_eq!(jobs[8].0, Status::Failed);
    assert!(
        jobs[8].1.contains("no handler for kind \"unknown\""),
        "{}",
        jobs[8].1
    );
}

#[tokio::test]
async fn bad_options_and_credentials_end_run_with_an_error() {
    let client = client();
    let handler = |_job, _ctx| async move { Ok(json!({})) };
    for (queue, options) in [
        ("bad queue", options(1, 10)),
        (
            "q",
            WorkerOptions {
                lanes: 0,
                ..options(1, 10)
            },
        ),
        (
            "q",
            WorkerOptions {
                lanes: 10_001,
                ..options(1, 10)
            },
        ),
        (
            "q",
            WorkerOptions {
                lease_secs: 0,
                ..options(1, 10)
            },
        ),
        (
            "q",
            WorkerOptions {
                wait_secs: 61.0,
                ..options(1, 10)
            },
        ),
        (
            "q",
            WorkerOptions {
                worker_id: Some(String::new()),
                ..options(1, 10)
            },
        ),
    ] {
        let error = Worker::new(client.clone(), queue, options)
            .register("k", handler)
            .run()
            .await
            .unwrap_err();
        assert!(matches!(error, Error::Config(_)), "{error:?}");
    }
    let error = Worker::new(client.clone(), "q", options(1, 10))
        .run()
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Config(_)), "{error:?}");

    let stranger = Client::new(&server().url, "not-a-token-of-this-server").unwrap();
    let error = within(
        "run returning",
        Worker::new(stranger, queue("auth"), options(1, 10))
            .register("k", handler)
            .run(),
    )
    .await
    .unwrap_err();
    assert_eq!(error.status(), Some(401), "{error:?}");
}

#[tokio::test]
async fn progress_is_refused_unless_a_small_object() {
    let client = client();
    let q = queue("progress");
    client
        .enqueue("report", Object::new(), JobConfig::queue(&q))
        .await
        .unwrap();
    let (answers, mut answers_rx) = mpsc::unbounded_channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let worker =
        Worker::new(client.clone(), &q, options(1, 30)).register("report", move |_job, ctx| {
            let answers = answers.clone();
            async move {
                let big = json!({"blob": "x".repeat(9000)});
                answers
                    .send([
                        ctx.progress(json!([1])).is_err(),
                        ctx.progress(big).is_err(),
                    ])
                    .unwrap();
                Ok(json!({}))
            }
        });
    let running = tokio::spawn(worker.run_until(async {
        let _ = stopped.await;
    }));
    assert_eq!(
        within("the handler", answers_rx.recv()).await.unwrap(),
        [true, true]
    );
    stop.send(()).unwrap();
    within("run_until returning", running)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn progress_goes_with_the_next_heartbeat_latest_winning() {
    let client = client();
    let q = queue("progress-sent");
    let job = client
        .enqueue("report", Object::new(), JobConfig::queue(&q))
        .await
        .unwrap();
    let release = Arc::new(tokio::sync::Notify::new());
    let released = release.clone();
    let (reported, mut reported_rx) = mpsc::unbounded_channel();
    // A long lease: the progress, not a renewal, makes the heartbeat go.
    let worker =
        Worker::new(client.clone(), &q, options(1, 600)).register("report", move |_job, ctx| {
            let (released, reported) = (released.clone(), reported.clone());
            async move {
                ctx.progress(json!({"page": 1}))?;
                ctx.progress(json!({"page": 2}))?;
                reported.send(()).unwrap();
                released.notified().await;
                Ok(json!({}))
            }
        });
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(worker.run_until(async {
        let _ = stopped.await;
    }));
    within("the handler reporting", reported_rx.recv()).await;
    let seen = job_until(&client, &job.id, |job| job.progress.is_some()).await;
    assert_eq!(seen.progress, Some(obj(json!({"page": 2}))));
    assert_eq!(seen.status, Status::Running);
    release.notify_one();
    stop.send(()).unwrap();
    within("run_until returning", running)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn add_steps_fans_out_and_the_waiting_step_fans_in_every_result_in_order() {
    let _default = crate::DEFAULT_QUEUE.lock().await;
    let client = client();
    let refused = Arc::new(Mutex::new(Vec::new()));
    let seen = refused.clone();
    let worker = Worker::new(client.clone(), "default", options(4, 30))
        .register("rust-split", move |_job, ctx| {
            let seen = seen.clone();
            async move {
                let pages: Vec<StepSpec> = (0..30)
                    .map(|n| StepSpec {
                        name: format!("page-{n}"),
                        kind: "rust-thumb".into(),
                        payload: obj(json!({"page": n})),
                        ..Default::default()
                    })
                    .collect();
                let grown = ctx.add_steps(pages.clone(), Some("thumbs")).await?;
                assert_eq!(grown.steps.len(), 32);
                ctx.add_steps(pages, Some("thumbs")).await?; // a repeat changes nothing
                let taken = StepSpec {
                    name: "page-0".into(),
                    kind: "other".into(),
                    ..Default::default()
                };
                if let Err(Error::Api { status, .. }) = ctx.add_steps(vec![taken], None).await {
                    seen.lock().unwrap().push(status);
                }
                Ok(json!({"pages": 30}))
            }
        })
        .register("rust-thumb", |job, _ctx| async move {
            Ok(json!({"url": format!("thumbs/{}.png", job.payload["page"])}))
        })
        .register("rust-zip", |job, _ctx| async move {
            let context = job.context.unwrap_or_default();
            let urls: Vec<Value> = context
                .get("thumbs")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|thumb| thumb["url"].clone())
                .collect();
            Ok(json!({"zipped": urls}))
        });
    let steps = vec![
        StepSpec {
            name: "split".into(),
            kind: "rust-split".into(),
            ..Default::default()
        },
        StepSpec {
            name: "zip".into(),
            kind: "rust-zip".into(),
            depends_on: vec!["split".into()],
            ..Default::default()
        },
    ];
    let flow = client
        .workflow_create("rust-pdf", steps, Object::new())
        .await
        .unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(worker.run_until(async {
        let _ = stopped.await;
    }));
    let ended = within("the workflow ending", async {
        loop {
            let workflow = client.workflow_get(&flow.id).await.unwrap();
            if workflow.status != WorkflowStatus::Running {
                return workflow;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    stop.send(()).unwrap();
    within("the worker stopping", running)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ended.status, WorkflowStatus::Completed);
    assert_eq!(*refused.lock().unwrap(), [409]);
    let want: Vec<Value> = (0..30).map(|n| json!(format!("thumbs/{n}.png"))).collect();
    assert_eq!(ended.context["zipped"], Value::Array(want));
    let added: Vec<Option<&str>> = ended.steps.iter().map(|s| s.added_by.as_deref()).collect();
    assert_eq!(added[..2], [None, None]);
    assert!(added[2..].iter().all(|by| *by == Some("split")));
}
