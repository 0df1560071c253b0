//! What the interop tests share: a broker with the AMQP listener on 127.0.0.1 (and, for AMQP
//! over WebSockets, the HTTP door handing its WebSocket connections to that listener), and
//! running the official SDKs' scenario scripts (Python from `<repo>/.venv` or
//! `$TRIBUTARY_PYTHON`, JavaScript with the modules in `<repo>/.interop/node_modules` or
//! `$TRIBUTARY_INTEROP_DIR/node_modules`). A missing client FAILS a test, it never skips it.

#![allow(dead_code)] // each test binary uses its own part

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tributary_amqp::{AccessPolicies, AccessPolicy, AmqpConfig, Right, RunningAmqpServer};
use tributary_broker::{Broker, BrokerConfig, HubSpec, ReceiverSpec, SendReceipt, SendTarget};
use tributary_event::{EventData, EventPosition, ReceivedEvent};

/// How long one scenario script may run.
pub(crate) const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

pub(crate) struct Fixture {
    _dir: tempfile::TempDir,
    pub(crate) broker: Broker,
    server: Option<RunningAmqpServer>,
    http: Option<tributary_http::RunningHttpServer>,
    pub(crate) root: AccessPolicy,
    pub(crate) listen: AccessPolicy,
    pub(crate) send: AccessPolicy,
}

impl Fixture {
    pub(crate) async fn start(hubs: &[(&str, u32)]) -> Fixture {
        Fixture::start_in(tempfile::tempdir().unwrap(), hubs, |_| {}, None).await
    }

    /// A fixture whose broker keeps its data in `dir`, with its configuration changed by
    /// `configure`, and whose listener speaks AMQPS with `tls`.
    pub(crate) async fn start_in(
        dir: tempfile::TempDir,
        hubs: &[(&str, u32)],
        configure: impl FnOnce(&mut BrokerConfig),
        tls: Option<tributary_tls::ServerTls>,
    ) -> Fixture {
        let mut config = BrokerConfig::new(dir.path());
        configure(&mut config);
        let broker = Broker::open(config).await.unwrap();
        for (name, partitions) in hubs {
            broker
                .create_hub(HubSpec::new(*name, *partitions))
                .await
                .unwrap();
        }
        let root =
            AccessPolicy::generate("RootManageSharedAccessKey", vec![Right::Manage]).unwrap();
        let listen = AccessPolicy::generate("listen-only", vec![Right::Listen]).unwrap();
        let send = AccessPolicy::generate("send-only", vec![Right::Send]).unwrap();
        let policies =
            AccessPolicies::new(vec![root.clone(), listen.clone(), send.clone()]).unwrap();
        let mut config = AmqpConfig::new("127.0.0.1:0".parse().unwrap(), policies);
        config.tls = tls;
        let server = tributary_amqp::start(broker.clone(), config).await.unwrap();
        Fixture {
            _dir: dir,
            broker,
            server: Some(server),
            http: None,
            root,
            listen,
            send,
        }
    }

    pub(crate) fn port(&self) -> u16 {
        self.server.as_ref().unwrap().local_addr().port()
    }

    /// Also starts the HTTP door on 127.0.0.1:0 (HTTPS with `tls`), handing its AMQP over
    /// WebSockets connections to this fixture's AMQP door, as `tributary serve` wires them.
    pub(crate) async fn with_websockets(mut self, tls: Option<tributary_tls::ServerTls>) -> Self {
        let connections = self.server.as_ref().unwrap().connections();
        let auth = tributary_http::AuthConfig::DevelopmentUnauthenticated;
        let mut config = tributary_http::HttpConfig::new("127.0.0.1:0".parse().unwrap(), auth);
        config.tls = tls;
        config.websocket_amqp = Some(tributary_http::AmqpOverWebSockets::new(
            move |stream, peer| {
                let connections = connections.clone();
                Box::pin(async move { connections.serve(stream, peer).await })
            },
        ));
        let http = tributary_http::start(self.broker.clone(), config).await;
        self.http = Some(http.unwrap());
        self
    }

    /// The HTTP door's port (see [`Fixture::with_websockets`]).
    pub(crate) fn http_port(&self) -> u16 {
        self.http.as_ref().unwrap().local_addr().port()
    }

    /// Stops the AMQP door only (its WebSocket connections must close with it).
    pub(crate) async fn stop_amqp(&mut self) {
        self.server.take().unwrap().shutdown().await;
    }

    pub(crate) fn conn(&self, policy: &AccessPolicy) -> String {
        tributary_amqp::connection_string("127.0.0.1", self.port(), policy)
    }

    pub(crate) async fn send(&self, hub: &str, partition: &str, body: &str) -> SendReceipt {
        let target = SendTarget::Partition(partition.to_owned());
        let events = vec![EventData::new(body.as_bytes().to_vec())];
        self.broker.send(hub, target, events).await.unwrap()
    }

    pub(crate) async fn read_all(&self, hub: &str, partition: u32) -> Vec<ReceivedEvent> {
        let spec = ReceiverSpec::new(hub, partition.to_string(), EventPosition::Earliest);
        let mut receiver = self.broker.open_receiver(spec).unwrap();
        let mut all = Vec::new();
        loop {
            let batch = receiver
                .receive(1000, Duration::from_millis(200))
                .await
                .unwrap();
            if batch.is_empty() {
                return all;
            }
            all.extend(batch);
        }
    }

    pub(crate) async fn stop(mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown().await;
        }
        if let Some(http) = self.http.take() {
            http.shutdown().await.unwrap();
        }
        self.broker.shutdown().await.unwrap();
    }
}

pub(crate) fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub(crate) fn python() -> PathBuf {
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
pub(crate) fn node_modules() -> PathBuf {
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
pub(crate) async fn run_json(mut command: tokio::process::Command, what: &str) -> Value {
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
pub(crate) async fn run_python(script: &str, command: &str, args: Value) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(&path).arg(command).arg(args.to_string());
    run_json(cmd, &format!("{script} {command}")).await
}

/// Runs one scenario of `tests/js/interop.js` with Node and returns the JSON it printed.
pub(crate) async fn run_node(command: &str, args: Value) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/js/interop.js");
    let mut cmd = tokio::process::Command::new("node");
    cmd.env("NODE_PATH", node_modules())
        .arg(&path)
        .arg(command)
        .arg(args.to_string());
    run_json(cmd, &format!("interop.js {command}")).await
}

/// A long-running child that prints one JSON document per line; its lines arrive on `lines`.
pub(crate) struct JsonLines {
    pub(crate) name: String,
    child: tokio::process::Child,
    stdin: Option<tokio::process::ChildStdin>,
    pub(crate) lines: mpsc::UnboundedReceiver<Value>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl JsonLines {
    pub(crate) fn spawn(name: &str, mut command: tokio::process::Command) -> JsonLines {
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

    pub(crate) fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The next document, or a panic naming the child after `wait`.
    pub(crate) async fn next(&mut self, wait: Duration) -> Value {
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

    pub(crate) async fn write_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(line.as_bytes()).await.unwrap();
        stdin.write_all(b"\n").await.unwrap();
        stdin.flush().await.unwrap();
    }

    /// Waits for the child to exit and asserts it succeeded.
    pub(crate) async fn wait_success(&mut self, wait: Duration) {
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

pub(crate) async fn wait_for_receivers(broker: &Broker, hub: &str, count: usize) {
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
pub(crate) async fn join_all<F: std::future::Future<Output = Value> + Send + 'static>(
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
pub(crate) const RECEIVER_WAVE: usize = 2;

/// Runs `run` on each of `args`, [`RECEIVER_WAVE`] at a time (a wave concurrently); the results
/// in the order of `args`.
pub(crate) async fn join_in_waves<A, F>(
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

pub(crate) fn bodies(events: &[ReceivedEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| String::from_utf8_lossy(&e.data.body).into_owned())
        .collect()
}
