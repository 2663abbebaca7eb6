//! `examples/worker.rs`, run as written (docs/sdk-rust.md): the "kill a
//! worker" drill, and a drain on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use qftrio::*;
use serde_json::json;
use tokio::sync::mpsc;

use crate::{client, obj, queue, server, settled};

const CAP: Duration = Duration::from_secs(120);

/// The example's binary, which `cargo test` builds beside this one.
fn example() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples")
        .join("worker")
}

fn start(id: &str, q: &str) -> (Child, mpsc::UnboundedReceiver<String>) {
    let mut child = Command::new(example())
        .env("QFTRIO_URL", &server().url)
        .env("QFTRIO_WORKER_TOKEN", "dev")
        .env("WORKER_QUEUE", q)
        .env("WORKER_ID", id)
        .env("WORKER_LANES", "1")
        .env("WORKER_LEASE_SECS", "2")
        .stdout(Stdio::piped())
        .spawn()
        .expect("the example worker starts");
    let (lines, receiver) = mpsc::unbounded_channel();
    let out = BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
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

#[test]
fn the_docs_show_the_example_as_it_is() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = std::fs::read_to_string(root.join("../../docs/sdk-rust.md")).unwrap();
    let example = std::fs::read_to_string(root.join("examples/worker.rs")).unwrap();
    assert!(
        docs.contains(&format!(
            "`sdk/rust/examples/worker.rs`:\n\n```rust\n{example}```\n"
        )),
        "docs/sdk-rust.md does not show examples/worker.rs as it is"
    );
}
