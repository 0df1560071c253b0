//! A Tansu broker (a Kafka-compatible broker in Rust) for tests and benchmarks: the real
//! cluster the Kafka engine is tested against, since no Apache Kafka or Redpanda can be
//! installed here (see `scripts/setup-tansu`, which installs it as `<repo>/.venv/bin/tansu`).
//!
//! [`Tansu::shared`] starts one broker per test binary, on first use, on a free loopback port,
//! with memory storage; tests keep apart by topic name. The broker runs under a small shell
//! supervisor holding a pipe from the test process: when that process ends — normally, by a
//! panic or by `kill -9` — the pipe closes and the supervisor stops the broker. A missing
//! binary or a broker that does not start is a panic naming `scripts/setup-tansu`: tests fail
//! on it, never skip.
//!
//! Tansu 0.6.0's known bug: after a multi-record batch its high watermark is the batch's base
//! offset + 1. [`TestCluster::produce`] therefore sends one record per batch, so watermarks are
//! right.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::options::KafkaOptions;
use crate::test_cluster::TestCluster;

/// How long the broker may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs the broker and stops it when its stdin closes. Arguments: the binary, the port.
const SUPERVISOR: &str = r#"
"$1" broker --listener-url "tcp://127.0.0.1:$2" --advertised-listener-url "tcp://127.0.0.1:$2" \
    --storage-engine memory://tansu/ --silent >/dev/null 2>&1 &
pid=$!
cat >/dev/null
kill "$pid" 2>/dev/null
wait "$pid"
"#;

/// A running Tansu broker of this process.
#[derive(Debug)]
pub struct Tansu {
    cluster: TestCluster,
    _supervisor: Mutex<Child>,
    /// Closing it (when the process ends) stops the broker.
    _stop: Mutex<ChildStdin>,
}

impl Tansu {
    /// The broker this process shares, started on first use; panics (failing the test) when
    /// Tansu is missing or does not start.
    pub fn shared() -> &'static Tansu {
        static SHARED: OnceLock<Result<Tansu, String>> = OnceLock::new();
        match SHARED.get_or_init(Tansu::start) {
            Ok(tansu) => tansu,
            Err(error) => panic!("{error}"),
        }
    }

    /// The Tansu binary: `$TANSU_BIN`, else `<repo>/.venv/bin/tansu`.
    pub fn binary() -> PathBuf {
        match std::env::var_os("TANSU_BIN") {
            Some(path) => PathBuf::from(path),
            None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/tansu"),
        }
    }

    /// Starts a broker on a free loopback port.
    pub fn start() -> Result<Tansu, String> {
        let binary = Tansu::binary();
        if !binary.exists() {
            return Err(format!(
                "Tansu is not installed at {} (run scripts/setup-tansu, or set TANSU_BIN)",
                binary.display()
            ));
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|e| format!("cannot find a free port for Tansu: {e}"))?
            .port();
        let mut supervisor = Command::new("sh")
            .args(["-c", SUPERVISOR, "tansu-supervisor"])
            .arg(&binary)
            .arg(port.to_string())
            .stdin(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start Tansu ({}): {e}", binary.display()))?;
        let stop = supervisor.stdin.take().expect("piped");
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + START_TIMEOUT;
        while TcpStream::connect(address).is_err() {
            if let Ok(Some(status)) = supervisor.try_wait() {
                return Err(format!(
                    "Tansu ({}) exited at start: {status}",
                    binary.display()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "Tansu did not listen on {address} within {START_TIMEOUT:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Tansu {
            cluster: TestCluster::new(KafkaOptions::new(address.to_string())),
            _supervisor: Mutex::new(supervisor),
            _stop: Mutex::new(stop),
        })
    }
}

impl std::ops::Deref for Tansu {
    type Target = TestCluster;

    /// The broker as a [`TestCluster`]: plain TCP, no authentication.
    fn deref(&self) -> &TestCluster {
        &self.cluster
    }
}
