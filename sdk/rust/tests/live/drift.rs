//! The types cannot drift: the client's routes and the wire types are held
//! against the live server's `/openapi.json`.

use std::collections::{BTreeMap, BTreeSet};

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client as Http;
use hyper_util::rt::TokioExecutor;
use qftrio::*;
use serde::Serialize;
use serde_json::{json, Value};

use crate::server;

async fn openapi() -> Value {
    let http = Http::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let uri = format!("{}/openapi.json", server().url).parse().unwrap();
    let answer = http.get(uri).await.expect("GET /openapi.json");
    assert_eq!(answer.status(), 200);
    let body = answer.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&body).expect("the schema is JSON")
}

struct Schema {
    properties: BTreeSet<String>,
    required: BTreeSet<String>,
}

/// Every object schema in the document with a title, by title (the server
/// declares request bodies and answers inline, each titled after its model).
fn schemas(doc: &Value) -> BTreeMap<String, Schema> {
    fn walk(value: &Value, found: &mut BTreeMap<String, Schema>) {
        match value {
            Value::Object(map) => {
                if let (Some(Value::String(title)), Some(Value::Object(properties))) =
                    (map.get("title"), map.get("properties"))
                {
                    let required = map
                        .get("required")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten();
                    found.entry(title.clone()).or_insert(Schema {
                        properties: properties.keys().cloned().collect(),
                        required: required
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect(),
                    });
                }
                map.values().for_each(|v| walk(v, found));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, found)),
            _ => {}
        }
    }
    let mut found = BTreeMap::new();
    walk(doc, &mut found);
    found
}

fn keys(value: impl Serialize) -> BTreeSet<String> {
    match serde_json::to_value(value).unwrap() {
        Value::Object(map) => map.keys().cloned().collect(),
        other => panic!("not an object: {other}"),
    }
}

#[tokio::test]
async fn every_route_is_the_servers_and_every_server_route_is_here() {
    let doc = openapi().await;
    let mut server_routes = BTreeMap::new();
    for (path, methods) in doc["paths"].as_object().unwrap() {
        for (method, operation) in methods.as_object().unwrap() {
            let query: BTreeSet<String> = operation["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "query")
                .map(|p| p["name"].as_str().unwrap().to_owned())
                .collect();
            server_routes.insert((method.to_uppercase(), path.clone()), query);
        }
    }
    let ours: BTreeMap<_, BTreeSet<String>> = routes::ALL
        .iter()
        .map(|r| {
            (
                (r.method.to_owned(), r.path.to_owned()),
                r.query.iter().map(|q| q.to_string()).collect(),
            )
        })
        .collect();
    assert_eq!(ours.len(), routes::ALL.len(), "a route is declared twice");
    for (route, query) in &ours {
        let theirs = server_routes
            .get(route)
            .unwrap_or_else(|| panic!("{route:?} is not the server's"));
        assert_eq!(query, theirs, "the query parameters of {route:?}");
    }
    for route in server_routes.keys() {
        if route.1 != "/metrics" {
            assert!(
                ours.contains_key(route),
                "the server's {route:?} has no method"
            );
        }
    }
}

#[tokio::test]
async fn every_wire_type_matches_its_schema() {
    let doc = openapi().await;
    let schemas = schemas(&doc);
    let schema = |title: &str| {
        schemas
            .get(title)
            .unwrap_or_else(|| panic!("the server has no schema {title}"))
    };

    // Answers: exactly the server's fields, every one.
    let answers: Vec<(&str, BTreeSet<String>)> = vec![
        ("JobAnswer", keys(Job::default())),
        ("ErrorEntryAnswer", keys(ErrorEntry::default())),
        ("AttemptEntryAnswer", keys(AttemptEntry::default())),
        ("LeaseAnswer", keys(Lease::default())),
        ("HeartbeatAnswer", keys(HeartbeatAnswer::default())),
        ("ReportResultAnswer", keys(ReportResult::default())),
        ("JobsPageAnswer", keys(JobsPage::default())),
        ("QueueStatsAnswer", keys(QueueStats::default())),
        ("CountsAnswer", keys(Counts::default())),
        ("HeldBackAnswer", keys(HeldBack::default())),
        ("QueuesAnswer", keys(QueuesPage::default())),
        ("WorkerAnswer", keys(WorkerInfo::default())),
        ("RateLimitAnswer", keys(RateLimit::default())),
        ("WorkflowAnswer", keys(Workflow::default())),
        ("WorkflowStepAnswer", keys(WorkflowStep::default())),
        ("WorkflowsPageAnswer", keys(WorkflowsPage::default())),
        ("ScheduleAnswer", keys(Schedule::default())),
        ("SchedulesAnswer", keys(SchedulesPage::default())),
        ("ScheduleTriggerAnswer", keys(ScheduleTrigger::default())),
        ("HealthAnswer", keys(Health::default())),
    ];
    for (title, ours) in answers {
        assert_eq!(ours, schema(title).properties, "the fields of {title}");
    }

    // Requests: every field the server takes can be sent, and nothing else;
    // the least one can build sends every field it requires.
    let s = || "x".to_owned();
    let job_config = JobConfig {
        queue: Some(s()),
        priority: Some(1),
        max_attempts: Some(1),
        delay_secs: Some(1.0),
        scheduled_at: Some(s()),
        idempotency_key: Some(s()),
        timeout_secs: Some(1),
        backoff: Some(BackoffConfig::default()),
        concurrency: Some(ConcurrencyConfig::default()),
        rate_limit: Some(s()),
        unique: Some(UniqueConfig::default()),
        headers: Some(BTreeMap::new()),
    };
    let new_job = NewJob::default();
    let requests: Vec<(&str, BTreeSet<String>, BTreeSet<String>)> = vec![
        (
            "LeaseRequest",
            keys(LeaseRequest {
                worker_id: Some(s()),
                ..Default::default()
            }),
            keys(LeaseRequest::default()),
        ),
        (
            "HeartbeatManyItem",
            keys(HeartbeatItem {
                id: s(),
                lease_token: s(),
                extend_secs: 1,
                progress: Some(Object::new()),
            }),
            keys(HeartbeatItem {
                id: s(),
                lease_token: s(),
                extend_secs: 1,
                progress: None,
            }),
        ),
        (
            "CompleteManyItem",
            keys(CompleteItem {
                id: s(),
                lease_token: s(),
                result: Object::new(),
            }),
            keys(CompleteItem {
                id: s(),
                lease_token: s(),
                result: Object::new(),
            }),
        ),
        (
            "FailManyItem",
            keys(FailItem {
                id: s(),
                lease_token: s(),
                error: s(),
                retryable: true,
                retry_in_secs: Some(1.0),
            }),
            keys(FailItem {
                id: s(),
                lease_token: s(),
                error: s(),
                retryable: true,
                retry_in_secs: None,
            }),
        ),
        (
            "SnoozeManyItem",
            keys(SnoozeItem {
                id: s(),
                lease_token: s(),
                delay_secs: 1.0,
            }),
            keys(SnoozeItem {
                id: s(),
                lease_token: s(),
                delay_secs: 1.0,
            }),
        ),
        ("JobConfig", keys(&job_config), keys(JobConfig::default())),
        (
            "BackoffConfig",
            keys(BackoffConfig {
                initial_secs: Some(1.0),
                factor: Some(2.0),
                max_secs: Some(9.0),
                jitter: Some(0.1),
            }),
            keys(BackoffConfig::default()),
        ),
        (
            "ConcurrencyConfig",
            keys(ConcurrencyConfig {
                key: s(),
                limit: Some(1),
            }),
            keys(ConcurrencyConfig::default()),
        ),
        (
            "UniqueConfig",
            keys(UniqueConfig {
                key: s(),
                statuses: Some(vec![]),
                period_secs: Some(1.0),
            }),
            keys(UniqueConfig::default()),
        ),
        ("EnqueueRequest", keys(&new_job), keys(&new_job)),
        (
            "WorkflowStepRequest",
            keys(StepSpec {
                max_attempts: Some(1),
                ..Default::default()
            }),
            keys(StepSpec::default()),
        ),
        (
            "ScheduleRequest",
            keys(ScheduleSpec {
                timezone: Some(s()),
                paused: Some(true),
                catch_up: Some(s()),
                ..Default::default()
            }),
            keys(ScheduleSpec::default()),
        ),
        (
            "BulkRetryRequest",
            keys(BulkFilter {
                queue: Some(s()),
                status: Some(Status::Failed),
                kind: Some(s()),
                created_after: Some(s()),
                created_before: Some(s()),
                limit: Some(1),
                all: true,
            }),
            keys(BulkFilter::default()),
        ),
    ];
    for (title, full, least) in requests {
        let theirs = schema(title);
        assert_eq!(full, theirs.properties, "the fields of {title}");
        let missing: Vec<_> = theirs.required.difference(&least).collect();
        assert!(
            missing.is_empty(),
            "{title} can be built without {missing:?}"
        );
    }
    // The bodies the client builds by hand.
    for (title, body) in [
        ("RateLimitRequest", json!({"limit": 1, "per_secs": 1})),
        (
            "WorkflowCreateRequest",
            json!({"name": "n", "steps": [], "context": {}}),
        ),
        (
            "HeartbeatRequest",
            json!({"lease_token": "t", "extend_secs": 1}),
        ),
        ("CompleteRequest", json!({"lease_token": "t", "result": {}})),
        (
            "FailRequest",
            json!({"lease_token": "t", "error": "e", "retryable": true, "retry_in_secs": 1}),
        ),
        (
            "SnoozeRequest",
            json!({"lease_token": "t", "delay_secs": 1}),
        ),
    ] {
        assert!(
            keys(&body).is_subset(&schema(title).properties),
            "{title}: {body}"
        );
    }
}
