//! `examples/worker.rs`, run as written (docs/sdk-rust.md): the "kill a
//! worker" drill, and a drain on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use qftrio::*;
use serde_json::json;
use tokio::sync::mpsc;

use crate::{client, manifest_dir, obj, queue, server, settled};

const CAP: Duration = Duration::from_secs(120);

/// An example's binary, which `cargo test` builds beside this one.
fn example(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples")
        .join(name)
}

fn start(id: &str, q: &str) -> (Child, mpsc::UnboundedReceiver<String>) {
    let mut command = Command::new(example("worker"));
    command
        .env("QFTRIO_URL", &server().url)
        .env("QFTRIO_WORKER_TOKEN", "dev")
        .env("WORKER_QUEUE", q)
        .env("WORKER_ID", id)
        .env("WORKER_LANES", "1")
        .env("WORKER_LEASE_SECS", "2");
    spawn(command)
}

/// The program started, and the lines of its standard output and error as they come.
fn spawn(mut command: Command) -> (Child, mpsc::UnboundedReceiver<String>) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the example starts");
    let (lines, receiver) = mpsc::unbounded_channel();
    let out: [Box<dyn std::io::Read + Send>; 2] = [
        Box::new(child.stdout.take().unwrap()),
        Box::new(child.stderr.take().unwrap()),
    ];
    for stream in out {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
    }
    (child, receiver)
}

fn signal(child: &Child, name: &str) {
    let sent = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
}

async fn line_with(lines: &mut mpsc::UnboundedReceiver<String>, word: &str) -> String {
    tokio::time::timeout(CAP, async {
        loop {
            let line = lines
                .recv()
                .await
                .unwrap_or_else(|| panic!("the worker ended before printing {word}"));
            if line.contains(word) {
                return line;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no line with {word}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_a_worker() {
    let client = client();
    let q = queue("drill");
    let (mut alpha, mut alpha_lines) = start("alpha", &q);
    let (mut beta, mut beta_lines) = start("beta", &q);
    let mut ids = Vec::new();
    for n in 1..=4 {
        ids.push(
            client
                .enqueue("work", obj(json!({"n": n})), JobConfig::queue(&q))
                .await
                .unwrap()
                .id,
        );
    }
    // Crash alpha mid-job, as Ctrl+\ does: no clean shutdown.
    let claimed = line_with(&mut alpha_lines, "claimed").await;
    let id = claimed.rsplit(' ').next().unwrap().to_owned();
    signal(&alpha, "QUIT");
    assert!(!alpha.wait().unwrap().success());
    // Its lease runs out, the job goes back in line, and beta runs it.
    let done = settled(&client, &id).await;
    assert_eq!(done.attempt, 2);
    assert_eq!(
        done.result,
        Some(obj(json!({"handledBy": "beta", "attempt": 2})))
    );
    for id in &ids {
        assert_eq!(settled(&client, id).await.status, Status::Completed);
    }
    // SIGTERM drains: beta says so and exits cleanly.
    signal(&beta, "TERM");
    line_with(&mut beta_lines, "stopping").await;
    assert!(beta.wait().unwrap().success());
}

/// The conformance adapter (the suite's view of this worker) quits at once
/// on a second signal, with its handler still sleeping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_quits_at_once() {
    let client = client();
    let q = queue("quit");
    let mut command = Command::new(example("conformance"));
    command
        .env("QFTRIO_URL", &server().url)
        .env("QFTRIO_TOKEN", "dev")
        .env("ADAPTER_QUEUE", &q)
        .env("ADAPTER_LANES", "1")
        .env("ADAPTER_LEASE_SECS", "30")
        .env("ADAPTER_WAIT_SECS", "1")
        .env("ADAPTER_WORKER_ID", "gamma");
    let (mut adapter, mut lines) = spawn(command);
    let job = client
        .enqueue("sleep", obj(json!({"secs": 600})), JobConfig::queue(&q))
        .await
        .unwrap();
    line_with(&mut lines, "started").await;
    signal(&adapter, "TERM");
    // Its event on standard error: the first signal was taken (two sent at
    // once could arrive as one).
    line_with(&mut lines, "Stopping").await;
    signal(&adapter, "TERM");
    line_with(&mut lines, "quitting").await;
    assert_eq!(adapter.wait().unwrap().code(), Some(130));
    // Nothing was reported: the job waits for its lease to run out.
    assert_eq!(
        client.job_get(&job.id).await.unwrap().status,
        Status::Running
    );
}

#[test]
fn the_docs_show_the_example_as_it_is() {
    let root = manifest_dir();
    let docs = std::fs::read_to_string(root.join("../../docs/sdk-rust.md")).unwrap();
    let example = std::fs::read_to_string(root.join("examples/worker.rs")).unwrap();
    assert!(
        docs.contains(&format!(
            "`sdk/rust/examples/worker.rs`:\n\n```rust\n{example}```\n"
        )),
        "docs/sdk-rust.md does not show examples/worker.rs as it is"
    );
}
