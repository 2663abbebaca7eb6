//! The crate against a real `qftrio serve --dev`: one server per run of this
//! test binary (the executable named by `QFTRIO_BIN`, default the
//! repository's `.venv/bin/qftrio`), on a free port and a fresh SQLite file
//! in a temporary directory. Each test works on queues of its own.

mod client;
mod drift;
mod example;
mod worker;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};

use qftrio::Client;

pub struct Server {
    pub url: String,
    /// Its standard input: the server ends when this process does and the pipe closes.
    _child: Mutex<Child>,
}

/// The server every test of this binary shares, started by the first to ask.
pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(start)
}

/// The SDK's directory, as `cargo test` tells the test binary when it runs
/// it: a build directory shared by several checkouts may hold a binary built
/// in another, which the compile-time value would name.
pub fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

fn start() -> Server {
    let bin = std::env::var_os("QFTRIO_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest_dir().join("../../.venv/bin/qftrio"));
    assert!(
        bin.exists(),
        "no qftrio executable at {} (set QFTRIO_BIN)",
        bin.display()
    );
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is past 1970")
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("qftrio-rust-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    // The shell holds the server and ends it (and removes its directory)
    // when its standard input closes: when this test process exits, however
    // it exits, as Rust never drops a static.
    let script = r#""$0" serve --dev --db "$1/qftrio.db" --bind "127.0.0.1:$2" --log-level WARNING 2>&1 &
pid=$!
read _ignored
kill "$pid" 2>/dev/null
wait "$pid"
rm -rf "$1""#;
    let mut child = Command::new("sh")
        .args(["-c", script])
        .arg(&bin)
        .arg(&dir)
        .arg(port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sh starts");
    // The server's WARNING line about development mode comes once it has
    // started; then wait for its port to accept.
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    out.read_line(&mut line).expect("the server's output");
    assert!(
        line.contains("DEVELOPMENT MODE"),
        "the server did not start: {line}"
    );
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let address = format!("127.0.0.1:{port}");
    // Bounded by the work: the server is up; the cap only turns a hang into a failure.
    let started = std::time::Instant::now();
    while std::net::TcpStream::connect(&address).is_err() {
        assert!(
            started.elapsed().as_secs() < 60,
            "the server never listened on {address}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Server {
        url: format!("http://{address}"),
        _child: Mutex::new(child),
    }
}

/// A client with the dev tenant's token (also a worker's, in `--dev` mode).
pub fn client() -> Client {
    Client::new(&server().url, "dev").expect("a valid client")
}

/// Held by a test whose workflow steps run, or must stay, on the `default`
/// queue, which every workflow's steps share (tests run in parallel).
pub static DEFAULT_QUEUE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A queue name no other test uses.
pub fn queue(name: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("rust-{name}-{n}")
}

/// An object from `json!` literal.
pub fn obj(value: serde_json::Value) -> qftrio::Object {
    match value {
        serde_json::Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

/// The job once `done` holds of it (polled: bounded by the work; the cap
/// only turns a hang into a failure).
pub async fn job_until(
    client: &Client,
    id: &str,
    done: impl Fn(&qftrio::Job) -> bool,
) -> qftrio::Job {
    let wait = async {
        loop {
            let job = client.job_get(id).await.unwrap();
            if done(&job) {
                return job;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(120), wait)
        .await
        .unwrap_or_else(|_| panic!("job {id} never got there"))
}

/// The job once it has ended.
pub async fn settled(client: &Client, id: &str) -> qftrio::Job {
    job_until(client, id, |job| job.status.is_terminal()).await
}
