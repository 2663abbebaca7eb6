//! Every method of `Client` against the server, and its errors.

use std::time::Duration;

use qftrio::*;
use serde_json::json;

use crate::{client, obj, queue, server};

fn api_error(error: Error) -> (u16, Option<String>, String) {
    match error {
        Error::Api {
            status,
            code,
            message,
        } => (status, code, message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn jobs_round_trip() {
    let client = client();
    let q = queue("jobs");
    let mut config = JobConfig::queue(&q);
    config.max_attempts = Some(2);
    config.priority = Some(3);
    config.headers = Some([("x-origin".to_owned(), "test".to_owned())].into());
    let job = client
        .enqueue("resize", obj(json!({"src": "a.png"})), config)
        .await
        .unwrap();
    assert_eq!(
        (job.queue.as_str(), job.kind.as_str(), job.status),
        (q.as_str(), "resize", Status::Pending)
    );
    assert_eq!((job.max_attempts, job.priority, job.attempt), (2, 3, 0));
    assert_eq!(job.payload, obj(json!({"src": "a.png"})));
    assert_eq!(job.headers.as_ref().unwrap()["x-origin"], "test");
    assert_eq!(client.job_get(&job.id).await.unwrap(), job);
    // A wait answers the job as it stands when its time runs out.
    let still = client
        .job_wait(&job.id, Duration::from_millis(200))
        .await
        .unwrap();
    assert_eq!(still.status, job.status);

    // A repeated idempotency key answers the first job and enqueues nothing.
    let mut keyed = JobConfig::queue(&q);
    keyed.idempotency_key = Some(format!("{q}-key"));
    let first = client
        .enqueue("resize", Object::new(), keyed.clone())
        .await
        .unwrap();
    let again = client
        .enqueue("resize", obj(json!({"other": 1})), keyed)
        .await
        .unwrap();
    assert_eq!(first.id, again.id);

    let more = (0..3)
        .map(|n| NewJob {
            kind: "batch".into(),
            payload: obj(json!({"n": n})),
            config: JobConfig::queue(&q),
        })
        .collect();
    let batch = client.enqueue_many(more).await.unwrap();
    assert_eq!(batch.len(), 3);

    let filter = JobsFilter {
        queue: Some(q.clone()),
        kind: Some("batch".into()),
        limit: Some(2),
        ..Default::default()
    };
    let page = client.jobs_list(&filter).await.unwrap();
    assert_eq!(page.jobs.len(), 2);
    let cursor = page.next_cursor.expect("a second page");
    let rest = client
        .jobs_list(&JobsFilter {
            cursor: Some(cursor),
            ..filter
        })
        .await
        .unwrap();
    assert_eq!(rest.jobs.len(), 1);
    assert_eq!(rest.next_cursor, None);

    let cancelled = client.job_cancel(&job.id).await.unwrap();
    assert_eq!(cancelled.status, Status::Cancelled);
    let (status, code, _) = api_error(client.job_cancel(&job.id).await.unwrap_err());
    assert_eq!(status, 409);
    let _ = code;
    let retried = client.job_retry(&job.id).await.unwrap();
    assert_eq!(retried.status, Status::Pending);

    let stats = client.queue_stats(&q).await.unwrap();
    assert_eq!(stats.queue, q);
    assert_eq!(stats.counts.pending, 5);
    assert!(client.queues().await.unwrap().iter().any(|s| s.queue == q));
    assert!(client.queue_pause(&q).await.unwrap().paused);
    assert!(!client.queue_resume(&q).await.unwrap().paused);

    let bulk = BulkFilter {
        queue: Some(q.clone()),
        kind: Some("batch".into()),
        ..Default::default()
    };
    assert_eq!(
        client.jobs_bulk(BulkAction::Cancel, &bulk).await.unwrap(),
        3
    );
    assert_eq!(client.jobs_bulk(BulkAction::Retry, &bulk).await.unwrap(), 3);
    let bulk = BulkFilter {
        status: Some(Status::Pending),
        ..bulk
    };
    assert_eq!(
        client
            .jobs_bulk(
                BulkAction::Delete,
                &BulkFilter {
                    status: Some(Status::Cancelled),
                    ..bulk.clone()
                }
            )
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        client.jobs_bulk(BulkAction::Cancel, &bulk).await.unwrap(),
        3
    );
    assert_eq!(
        client
            .jobs_bulk(
                BulkAction::Delete,
                &BulkFilter {
                    status: Some(Status::Cancelled),
                    ..bulk
                }
            )
            .await
            .unwrap(),
        3
    );
    assert_eq!(client.health().await.unwrap().status, "ok");
}

#[tokio::test]
async fn the_worker_protocol() {
    let client = client();
    let q = queue("protocol");
    let mut config = JobConfig::queue(&q);
    config.max_attempts = Some(3);
    for n in 0..4 {
        client
            .enqueue("step", obj(json!({"n": n})), config.clone())
            .await
            .unwrap();
    }
    let request = LeaseRequest {
        max_jobs: 4,
        lease_secs: 30,
        wait_secs: 0.0,
        worker_id: Some("rust-test".into()),
    };
    let leases = client.lease(&q, &request).await.unwrap();
    assert_eq!(leases.len(), 4);
    assert!(leases.iter().all(
        |l| l.job.status == Status::Running && l.job.worker_id.as_deref() == Some("rust-test")
    ));
    let [a, b, c, d] = <[Lease; 4]>::try_from(leases).unwrap();

    let beat = client
        .heartbeat(&a.job.id, &a.lease_token, 30)
        .await
        .unwrap();
    assert_eq!(beat.status, Status::Running);
    assert!(beat.locked_until.is_some());
    let (status, code, _) = api_error(
        client
            .heartbeat(&a.job.id, "not-the-token", 30)
            .await
            .unwrap_err(),
    );
    assert_eq!((status, code.as_deref()), (409, Some("lease_lost")));

    let items = vec![
        HeartbeatItem {
            id: a.job.id.clone(),
            lease_token: a.lease_token.clone(),
            extend_secs: 30,
            progress: Some(obj(json!({"page": 2}))),
        },
        HeartbeatItem {
            id: b.job.id.clone(),
            lease_token: "stale".into(),
            extend_secs: 30,
            progress: None,
        },
    ];
    let results = client.heartbeat_many(items).await.unwrap();
    assert_eq!(
        client.job_get(&a.job.id).await.unwrap().progress,
        Some(obj(json!({"page": 2})))
    );
    let recorded = client
        .job_progress(&a.job.id, &a.lease_token, obj(json!({"page": 3})))
        .await
        .unwrap();
    assert_eq!(recorded.status, Status::Running);
    let job = client.job_get(&a.job.id).await.unwrap();
    assert_eq!(job.progress, Some(obj(json!({"page": 3}))));
    assert!(job.progress_at.is_some());
    let refused = client
        .job_progress(&a.job.id, "stale", Object::new())
        .await
        .unwrap_err();
    assert_eq!(refused.status(), Some(409));
    assert_eq!(
        (results[0].code, results[0].status),
        (200, Some(Status::Running))
    );
    assert_eq!(results[1].code, 409);
    assert!(client
        .workers()
        .await
        .unwrap()
        .iter()
        .any(|w| w.worker_id == "rust-test" && w.jobs == 4));

    client
        .complete(&a.job.id, &a.lease_token, obj(json!({"ok": true})))
        .await
        .unwrap();
    // Replaying a report that landed changes nothing.
    client
        .complete(&a.job.id, &a.lease_token, obj(json!({"ok": true})))
        .await
        .unwrap();
    assert_eq!(
        client.job_get(&a.job.id).await.unwrap().result,
        Some(obj(json!({"ok": true})))
    );

    client
        .fail(&b.job.id, &b.lease_token, "no", false, None)
        .await
        .unwrap();
    let failed = client.job_get(&b.job.id).await.unwrap();
    assert_eq!(
        (failed.status, failed.error.as_deref()),
        (Status::Failed, Some("no"))
    );

    client
        .snooze(&c.job.id, &c.lease_token, Duration::from_secs(600))
        .await
        .unwrap();
    let snoozed = client.job_get(&c.job.id).await.unwrap();
    assert_eq!((snoozed.status, snoozed.max_attempts), (Status::Pending, 4));

    let fail = FailItem {
        id: d.job.id.clone(),
        lease_token: d.lease_token.clone(),
        error: "later".into(),
        retryable: true,
        retry_in_secs: Some(900.0),
    };
    assert_eq!(client.fail_many(vec![fail]).await.unwrap()[0].code, 204);
    let retrying = client.job_get(&d.job.id).await.unwrap();
    assert_eq!(
        (retrying.status, retrying.attempt, retrying.error.as_deref()),
        (Status::Pending, 1, Some("later"))
    );
    let stale = CompleteItem {
        id: d.job.id.clone(),
        lease_token: "stale".into(),
        result: Object::new(),
    };
    assert_eq!(
        client.complete_many(vec![stale]).await.unwrap()[0].code,
        409
    );
    let snooze = SnoozeItem {
        id: d.job.id.clone(),
        lease_token: "stale".into(),
        delay_secs: 1.0,
    };
    assert_eq!(client.snooze_many(vec![snooze]).await.unwrap()[0].code, 409);
    assert_eq!(
        client.job_get(&d.job.id).await.unwrap().status,
        Status::Pending
    );
}

#[tokio::test]
async fn rate_limits_workflows_and_schedules() {
    let client = client();
    let q = queue("more");
    let name = format!("{q}-limit");
    let limit = client.rate_limit_set(&name, 5, 60.0).await.unwrap();
    assert_eq!((limit.limit, limit.per_secs), (5, 60.0));
    assert_eq!(client.rate_limit_get(&name).await.unwrap(), limit);
    assert!(client.rate_limits_list().await.unwrap().contains(&limit));
    client.rate_limit_delete(&name).await.unwrap();
    assert_eq!(
        api_error(client.rate_limit_get(&name).await.unwrap_err()).0,
        404
    );

    let steps = vec![
        StepSpec {
            name: "fetch".into(),
            kind: "fetch".into(),
            ..Default::default()
        },
        StepSpec {
            name: "store".into(),
            kind: "store".into(),
            depends_on: vec!["fetch".into()],
            max_attempts: Some(2),
            ..Default::default()
        },
    ];
    let _default = crate::DEFAULT_QUEUE.lock().await;
    let flow = client
        .workflow_create(&format!("{q}-flow"), steps, obj(json!({"user": 7})))
        .await
        .unwrap();
    assert_eq!(flow.status, WorkflowStatus::Running);
    assert_eq!(
        flow.steps.iter().map(|s| s.status).collect::<Vec<_>>(),
        [StepStatus::Pending, StepStatus::Waiting]
    );
    assert_eq!(client.workflow_get(&flow.id).await.unwrap().id, flow.id);
    let page = client
        .workflows_list(Some(WorkflowStatus::Running), Some(100), None)
        .await
        .unwrap();
    assert!(page.workflows.iter().any(|w| w.id == flow.id));
    assert_eq!(
        client.workflow_cancel(&flow.id).await.unwrap().status,
        WorkflowStatus::Cancelled
    );

    let sched = format!("{q}-nightly");
    let spec = ScheduleSpec {
        cron: "0 3 * * *".into(),
        job: NewJob {
            kind: "report".into(),
            payload: Object::new(),
            config: JobConfig::queue(&q),
        },
        timezone: Some("Europe/Paris".into()),
        paused: Some(false),
        catch_up: Some("none".into()),
    };
    let schedule = client.schedule_set(&sched, &spec).await.unwrap();
    assert_eq!(
        (schedule.timezone.as_str(), schedule.catch_up.as_str()),
        ("Europe/Paris", "none")
    );
    assert!(schedule.next_run_at.is_some());
    assert_eq!(client.schedule_get(&sched).await.unwrap().cron, "0 3 * * *");
    assert!(client
        .schedules_list(Some(1000), None)
        .await
        .unwrap()
        .schedules
        .iter()
        .any(|s| s.name == sched));
    assert!(client.schedule_pause(&sched).await.unwrap().paused);
    assert!(!client.schedule_resume(&sched).await.unwrap().paused);
    let fired = client.schedule_trigger(&sched).await.unwrap();
    assert_eq!(
        (fired.job.schedule.as_deref(), fired.job.queue.as_str()),
        (Some(sched.as_str()), q.as_str())
    );
    client.schedule_delete(&sched).await.unwrap();
    assert_eq!(
        api_error(client.schedule_get(&sched).await.unwrap_err()).0,
        404
    );
}

#[tokio::test]
async fn errors_say_what_and_where() {
    let client = client();
    let (status, code, _) = api_error(
        client
            .job_get("01a25054-0000-7000-8000-000000000000")
            .await
            .unwrap_err(),
    );
    assert_eq!((status, code.as_deref()), (404, Some("not_found")));
    // A path parameter is one segment, whatever it holds.
    let (status, _, _) = api_error(client.job_get("a/b?c").await.unwrap_err());
    assert_eq!(status, 404);

    let (status, code, message) = api_error(
        client
            .enqueue("bad kind!", Object::new(), JobConfig::default())
            .await
            .unwrap_err(),
    );
    assert_eq!((status, code.as_deref()), (422, Some("invalid")));
    assert!(message.contains("kind"), "{message}");
    let mut config = JobConfig::queue("fine");
    config.max_attempts = Some(0);
    let (status, _, message) = api_error(
        client
            .enqueue("k", Object::new(), config)
            .await
            .unwrap_err(),
    );
    assert_eq!(status, 422);
    assert!(message.contains("max_attempts"), "{message}");

    let stranger = Client::new(&server().url, "not-a-token-of-this-server").unwrap();
    let (status, code, _) = api_error(
        stranger
            .lease("x", &LeaseRequest::default())
            .await
            .unwrap_err(),
    );
    assert_eq!((status, code.as_deref()), (401, Some("unauthorized")));

    // Nothing listens on a port just freed: the error names the call.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nobody = Client::new(&format!("http://127.0.0.1:{port}"), "dev").unwrap();
    match nobody.job_get("some id").await.unwrap_err() {
        Error::Transport {
            method,
            path,
            message,
        } => {
            assert_eq!((method, path.as_str()), ("GET", "/api/v1/jobs/some%20id"));
            assert!(!message.is_empty());
        }
        other => panic!("expected a transport error, got {other:?}"),
    }

    for (url, token) in [
        ("ftp://h", "t"),
        ("https://example.com", "t"),
        ("not a url", "t"),
        ("http://h:1", ""),
        ("http://h:1", "a\nb"),
    ] {
        assert!(
            matches!(Client::new(url, token), Err(Error::Config(_))),
            "{url} {token:?}"
        );
    }
}

#[tokio::test]
async fn the_event_stream_shows_a_jobs_changes() {
    let client = client();
    let q = queue("events");
    let filter = EventsFilter {
        queue: Some(q.clone()),
        ..EventsFilter::default()
    };
    let mut stream = client.events(&filter).await.unwrap();
    let job = client
        .enqueue("echo", obj(json!({})), JobConfig::queue(&q))
        .await
        .unwrap();
    client.job_cancel(&job.id).await.unwrap();
    let mut statuses = Vec::new();
    while statuses.len() < 2 {
        let event = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("an event within the cap")
            .unwrap()
            .expect("the stream goes on");
        if event.kind == "job" && event.data["id"] == json!(job.id) {
            statuses.push(event.data["status"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(statuses, ["pending", "cancelled"]);
}
