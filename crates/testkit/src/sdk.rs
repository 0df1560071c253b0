//! Running the official SDKs' scenario scripts: Python from `<repo>/.venv` (or
//! `$TRIBUTARY_PYTHON`), JavaScript with the modules in `<repo>/.interop/node_modules`. Each
//! script prints one JSON document (or one per line, [`JsonLines`]); a missing client FAILS a
//! test, it never skips it.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tributary_broker::Broker;
use tributary_event::ReceivedEvent;

/// How long one scenario script may run.
pub const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

/// The repository's root directory.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Python with the official SDKs: `$TRIBUTARY_PYTHON`, else `<repo>/.venv/bin/python`
/// (installed by `scripts/setup-python-interop`); missing is a failure, never a skip.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("TRIBUTARY_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = repo().join(".venv/bin/python");
    assert!(
        venv.exists(),
        "the Python interop client is not installed: run scripts/setup-python-interop (expected {})",
        venv.display()
    );
    venv
}

/// `<repo>/.interop/node_modules`, where scripts/setup-js-interop installs the JavaScript SDK,
/// `ws` and Azurite; or `$TRIBUTARY_INTEROP_DIR/node_modules` (another checkout's `.interop`).
pub fn node_modules() -> PathBuf {
    let interop = std::env::var_os("TRIBUTARY_INTEROP_DIR")
        .map_or_else(|| repo().join(".interop"), PathBuf::from);
    let modules = interop.join("node_modules");
    assert!(
        modules.join("@azure/event-hubs/package.json").exists(),
        "the JavaScript interop client is not installed: run scripts/setup-js-interop (expected {})",
        modules.display()
    );
    modules
}

/// Runs `program args…` to completion and returns the JSON document it printed last.
pub async fn run_json(mut command: tokio::process::Command, what: &str) -> Value {
    let output = command.kill_on_drop(true).output();
    let output = tokio::time::timeout(SCRIPT_TIMEOUT, output)
        .await
        .unwrap_or_else(|_| panic!("{what} timed out"))
        .unwrap_or_else(|e| panic!("{what} did not start: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{what} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| {
        panic!("{what} printed no JSON ({e}):\nstdout:\n{stdout}\nstderr:\n{stderr}")
    })
}

/// Runs one scenario of `tests/python/<script>` and returns the JSON it printed.
pub async fn run_python(script: &str, command: &str, args: Value) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(&path).arg(command).arg(args.to_string());
    run_json(cmd, &format!("{script} {command}")).await
}

/// Runs one scenario of `tests/js/interop.js` with Node and returns the JSON it printed.
pub async fn run_node(command: &str, args: Value) -> Value {
    run_node_with(command, args, &[]).await
}

/// [`run_node`] with more environment variables (`NODE_EXTRA_CA_CERTS`, say).
pub async fn run_node_with(command: &str, args: Value, env: &[(&str, &str)]) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/js/interop.js");
    let mut cmd = tokio::process::Command::new("node");
    cmd.envs(env.iter().copied());
    cmd.env("NODE_PATH", node_modules())
        .arg(&path)
        .arg(command)
        .arg(args.to_string());
    run_json(cmd, &format!("interop.js {command}")).await
}

/// Runs `tests/js/<script> args…` with Node and kafkajs (`<repo>/.interop/kafkajs`, installed
/// by scripts/setup-kafka-interop; missing, the test fails) and returns the JSON it printed.
pub async fn run_kafkajs(script: &str, args: &[&str]) -> Value {
    let modules = repo().join(".interop/kafkajs/node_modules");
    assert!(
        modules.join("kafkajs/package.json").exists(),
        "kafkajs is not installed: run scripts/setup-kafka-interop (expected {})",
        modules.display()
    );
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/js")
        .join(script);
    let mut cmd = tokio::process::Command::new("node");
    cmd.env("NODE_PATH", modules).arg(path).args(args);
    run_json(cmd, script).await
}

/// A long-running child that prints one JSON document per line; its lines arrive on `lines`.
#[derive(Debug)]
pub struct JsonLines {
    /// What the child is, for messages.
    pub name: String,
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    /// The documents it printed, in order.
    pub lines: mpsc::UnboundedReceiver<Value>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl JsonLines {
    /// Starts `command` with piped standard streams.
    pub fn spawn(name: &str, mut command: tokio::process::Command) -> JsonLines {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{name} did not start: {e}"));
        let stdout = child.stdout.take().unwrap();
        let stderr_pipe = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        let label = name.to_owned();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                match serde_json::from_str::<Value>(&line) {
                    Ok(doc) => {
                        let _ = tx.send(doc);
                    }
                    Err(_) => eprintln!("{label} stdout: {line}"),
                }
            }
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = stderr.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr_pipe).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        JsonLines {
            name: name.to_owned(),
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
        }
    }

    /// What the child wrote on standard error so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The next document, or a panic naming the child after `wait`.
    pub async fn next(&mut self, wait: Duration) -> Value {
        match tokio::time::timeout(wait, self.lines.recv()).await {
            Ok(Some(doc)) => doc,
            Ok(None) => panic!(
                "{} ended its output early; stderr:\n{}",
                self.name,
                self.stderr()
            ),
            Err(_) => panic!(
                "{} printed nothing for {wait:?}; stderr:\n{}",
                self.name,
                self.stderr()
            ),
        }
    }

    /// Writes one line to the child's standard input.
    pub async fn write_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
    }

    /// Waits for the child to exit and asserts it succeeded.
    pub async fn wait_success(&mut self, wait: Duration) {
        self.stdin = None;
        let status = tokio::time::timeout(wait, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} did not exit", self.name))
            .unwrap();
        assert!(
            status.success(),
            "{} failed ({status}); stderr:\n{}",
            self.name,
            self.stderr()
        );
    }
}

/// Waits (30 s at most) until `count` receivers are open on `hub`.
pub async fn wait_for_receivers(broker: &Broker, hub: &str, count: usize) {
    for _ in 0..600 {
        if broker.open_receiver_count(hub).unwrap() >= count {
            // The attach reply may still be on its way; the receiver's position is fixed.
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no receiver opened on {hub}");
}

/// Runs futures concurrently and returns their outputs in order (no `futures` dependency).
pub async fn join_all<F: std::future::Future<Output = Value> + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<Value> {
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// How many SDK receivers on one partition and consumer group a test runs at once: the hub
/// takes at most five non-epoch receivers there, and the receivers of one wave may still be
/// closing when the next starts, so two waves together stay under the quota.
pub const RECEIVER_WAVE: usize = 2;

/// Runs `run` on each of `args`, [`RECEIVER_WAVE`] at a time (a wave concurrently); the results
/// in the order of `args`.
pub async fn join_in_waves<A, F>(
    args: impl IntoIterator<Item = A>,
    run: impl Fn(A) -> F,
) -> Vec<Value>
where
    F: std::future::Future<Output = Value> + Send + 'static,
{
    let mut args = args.into_iter().peekable();
    let mut out = Vec::new();
    while args.peek().is_some() {
        let wave: Vec<F> = args.by_ref().take(RECEIVER_WAVE).map(&run).collect();
        out.extend(join_all(wave.into_iter()).await);
    }
    out
}

/// The events' bodies as text.
pub fn bodies(events: &[ReceivedEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| String::from_utf8_lossy(&e.data.body).into_owned())
        .collect()
}
