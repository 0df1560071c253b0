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
//! offset + 1. [`Tansu::produce`] therefore sends one record per batch (it waits for each
//! record's acknowledgement before sending the next), so watermarks are right.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::options::KafkaOptions;

/// How long the broker may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a produce or topic creation may take before the test fails.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

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
    address: SocketAddr,
    _supervisor: Mutex<Child>,
    /// Closing it (when the process ends) stops the broker.
    _stop: Mutex<ChildStdin>,
}

/// A record for [`Tansu::produce`].
#[derive(Debug, Clone, Default)]
pub struct TestRecord {
    /// The key, if any.
    pub key: Option<Vec<u8>>,
    /// The value.
    pub value: Vec<u8>,
    /// Headers (name, value), in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The CreateTime, in ms since the Unix epoch; the producer's clock when `None`.
    pub timestamp_ms: Option<i64>,
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
            address,
            _supervisor: Mutex::new(supervisor),
            _stop: Mutex::new(stop),
        })
    }

    /// The broker's `host:port`.
    pub fn bootstrap_servers(&self) -> String {
        self.address.to_string()
    }

    /// Options that reach the broker (plain TCP, no authentication).
    pub fn options(&self) -> KafkaOptions {
        KafkaOptions::new(self.bootstrap_servers())
    }

    /// Creates a topic with `partitions` partitions; panics if the broker refuses.
    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = self
            .options()
            .client_config()
            .create()
            .expect("an admin client");
        let new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
        let results = admin
            .create_topics([&new_topic], &options)
            .await
            .expect("CreateTopics answered");
        for result in results {
            result.unwrap_or_else(|(name, code)| panic!("topic {name} not created: {code}"));
        }
    }

    /// A producer that acknowledges each record before the next is sent (`acks=all`).
    pub fn producer(&self) -> FutureProducer {
        self.options()
            .client_config()
            .set("acks", "all")
            .set("linger.ms", "0")
            .create()
            .expect("a producer")
    }

    /// Appends `records` to one partition, one record per batch (see the module docs); returns
    /// their offsets.
    pub async fn produce(&self, topic: &str, partition: i32, records: &[TestRecord]) -> Vec<i64> {
        let producer = self.producer();
        let mut offsets = Vec::with_capacity(records.len());
        for record in records {
            let mut headers = OwnedHeaders::new();
            for (key, value) in &record.headers {
                headers = headers.insert(Header {
                    key,
                    value: value.as_deref(),
                });
            }
            let mut kafka_record = FutureRecord::<[u8], [u8]>::to(topic)
                .partition(partition)
                .payload(&record.value[..])
                .headers(headers);
            if let Some(key) = &record.key {
                kafka_record = kafka_record.key(&key[..]);
            }
            if let Some(ms) = record.timestamp_ms {
                kafka_record = kafka_record.timestamp(ms);
            }
            let delivery = producer
                .send(kafka_record, REQUEST_TIMEOUT)
                .await
                .unwrap_or_else(|(e, _)| panic!("produce to {topic}/{partition}: {e}"));
            offsets.push(delivery.offset);
        }
        offsets
    }
}
