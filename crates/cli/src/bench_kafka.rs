//! `tributary bench --scenario kafka` (built with the `kafka-bench` feature): Tributary's Kafka
//! door beside the Tansu broker, loaded by the same librdkafka clients (the `rdkafka` crate), one
//! server after the other in one run.
//!
//! Each server runs in a process of its own, so that its CPU time (`/proc/<pid>/stat`) and its
//! resident set are its alone: Tributary in a child process of this binary (a hub with the first
//! `--modes` durability, its Kafka door requiring SASL PLAIN and its AMQP door, on 127.0.0.1),
//! Tansu as `tansu broker` (`--tansu-bin`, installed by `scripts/setup-tansu`) with memory
//! storage, the only storage its build has. Against each server, in order:
//!
//! * **idle connections**: `--kafka-idle-connections` connections log in (SASL PLAIN on
//!   Tributary; Tansu runs without authentication), ask ApiVersions and stay silent; the
//!   server's resident-set growth divided by their number.
//! * **produce**: `--producers` librdkafka producers, one connection each, producer i writing
//!   partition i mod `--partitions` of a topic of its own per record size (`--event-bytes`),
//!   acks=all, `batch.num.messages` = `--batch-events`, `linger.ms` 5, as fast as they are
//!   acknowledged; the rate is counted over `--seconds` after a 1 s warm-up.
//! * **consume**: `--partitions` consumers read all of it back, each assigned one partition
//!   (`--kafka-consume assign`) or as one consumer group (`group`), from the first record
//!   received to the last. Records are counted, never compared with a high watermark: Tansu's
//!   is wrong after multi-record batches.
//! * **latency**: 100-byte records at `--kafka-rate` records/s in all, each producer pacing its
//!   share on a 1 ms tick, `linger.ms` 1; each record's time from the send call to its
//!   acknowledgement (delivery report), after a 1 s warm-up.
//!
//! Then, against each server, a Kafka cluster as the engine of Tributary's tasks: a replication
//! task process copying the first size's topic into a hub, and processor hosts failing over on a
//! topic (see `engine.rs`).
//!
//! Then the AMQP door's ingest into the same Tributary with the Rust client (`--producers`
//! connections, batches of `--batch-events` of the first `--event-bytes`, `--send-window` sends
//! in flight per producer): the yardstick for the Kafka door's produce rate. Every rate is printed
//! with the CPU time per record of the server's process and of this one (the clients).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use rdkafka::ClientConfig;
use rdkafka::ClientContext;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tributary_event::{EventData, SendTarget};

use crate::args::{BenchArgs, KafkaConsume, KafkaServer};
use crate::bench::thousands;

mod engine;

/// Set in the child process that serves Tributary: the event hubs to create, comma-separated.
const SERVER_ENV: &str = "TRIBUTARY_BENCH_KAFKA_SERVER";
/// The topic of the latency run.
const LATENCY_TOPIC: &str = "latency";
/// The event hub of the AMQP door's ingest.
const AMQP_HUB: &str = "amqp-ingest";
/// Producing before a rate's window opens (connections, metadata, the first batches).
const WARM_UP: Duration = Duration::from_secs(1);
/// `linger.ms` of the throughput runs: librdkafka's default, ample to fill batches of 100 there.
const LINGER_MS_FLOOD: &str = "5";
/// `linger.ms` of the latency run: at a quarter of the latency run's rate a producer takes longer
/// to fill a batch of 100 than the latency target allows, so batches go when they have lingered.
const LINGER_MS_LATENCY: &str = "1";
/// Records one producer keeps queued at most (bounds the flush at the end of a run).
const QUEUE_RECORDS_MAX: &str = "100000";
/// A consume with no record for this long has stalled.
const STALL: Duration = Duration::from_secs(30);
/// How long a server may take to accept connections after it is started.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Idle connections opened at once.
const CONNECT_WAVE: usize = 100;

/// The targets of issue 32.
const PRODUCE_TARGET: f64 = 1_000_000.0;
const CONSUME_TARGET: f64 = 1_500_000.0;
const TANSU_RATIO_TARGET: f64 = 1.5;
const AMQP_SHARE_TARGET: f64 = 0.6;
const P99_TARGET_MS: f64 = 5.0;
const IDLE_TARGET_KIB: f64 = 64.0;

/// Runs the scenario (or, in the child process, serves Tributary) under `root`.
pub async fn run(args: &BenchArgs, root: &Path) -> Result<()> {
    if let Ok(hubs) = std::env::var(SERVER_ENV) {
        return serve_child(args, root, &hubs).await;
    }
    let outcome = measure_all(args, root).await;
    let _ = std::fs::remove_dir_all(root);
    outcome
}

async fn measure_all(args: &BenchArgs, root: &Path) -> Result<()> {
    anyhow::ensure!(
        args.producers > 0 && args.partitions > 0 && !args.event_bytes.is_empty(),
        "producers, partitions and event sizes must not be empty"
    );
    print_conditions(args)?;
    let mut figures = Vec::new();
    let mut amqp = None;
    for &kind in &args.kafka_servers {
        let mut server = Server::start(kind, args, root).await?;
        let outcome = measure(args, root, &mut server).await;
        if kind == KafkaServer::Tributary && outcome.is_ok() {
            amqp = Some(amqp_ingest(args, &server).await?);
        }
        server.stop().await?;
        figures.push((kind, outcome?));
    }
    summarize(args, &figures, amqp);
    Ok(())
}

fn print_conditions(args: &BenchArgs) -> Result<()> {
    let durability = args.modes.first().context("give a durability mode")?;
    let (_, librdkafka) = rdkafka::util::get_rdkafka_version();
    let tansu = if args.kafka_servers.contains(&KafkaServer::Tansu) {
        tansu_version(args)?
    } else {
        "not run".to_owned()
    };
    println!(
        "# kafka: {} cores, load average {}; Tributary {} (durability {durability}), Tansu: {tansu} (memory storage, no authentication); clients: librdkafka {librdkafka} (rdkafka crate), {} producers and {} consumers, {} partitions, acks=all, batch.num.messages={}, no compression",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        crate::bench::load_average(),
        env!("CARGO_PKG_VERSION"),
        args.producers,
        args.partitions,
        args.partitions,
        args.batch_events,
    );
    Ok(())
}

fn tansu_version(args: &BenchArgs) -> Result<String> {
    let output = std::process::Command::new(&args.tansu_bin)
        .arg("--version")
        .output()
        .with_context(|| {
            format!(
                "cannot run Tansu at {} (install it with scripts/setup-tansu, or give --tansu-bin)",
                args.tansu_bin.display()
            )
        })?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// What one server measured.
#[derive(Default)]
struct Figures {
    idle_kib: f64,
    produce: Vec<Run>,
    consume: Vec<Run>,
    p99_ms: f64,
    /// The replication task's copy of the first record size's topic.
    copy: Option<engine::CopyRun>,
    failovers: Option<engine::Failovers>,
}

/// One produce or consume run: its record size, its rate and the server's CPU per record.
#[derive(Clone, Copy)]
struct Run {
    size: u64,
    rate: f64,
    server_us: f64,
}

async fn measure(args: &BenchArgs, root: &Path, server: &mut Server) -> Result<Figures> {
    let mut figures = Figures {
        idle_kib: idle_connections(args, server).await?,
        ..Figures::default()
    };
    let mut first_topic = None;
    for &size in &args.event_bytes {
        let topic = topic_of(size);
        let produced = produce(args, server, &topic, size, None).await?;
        let rate = produced.rate();
        println!(
            "{} produce {size} B: {} records/s ({} records in {:.1} s); {}",
            server.name(),
            thousands(rate),
            thousands(produced.records as f64),
            produced.cpu.wall.as_secs_f64(),
            produced.cpu.per_record(produced.records),
        );
        if let Some(disk) = server.disk().await? {
            println!("  disk: {disk}");
        }
        figures.produce.push(Run {
            size,
            rate,
            server_us: produced.cpu.server_us(produced.records),
        });
        let consumed = consume(args, server, &topic, size, produced.total).await?;
        figures.consume.push(consumed);
        first_topic.get_or_insert((topic, produced.total));
    }
    figures.p99_ms = latency(args, server).await?;
    if let Some((topic, records)) = first_topic {
        figures.copy = Some(engine::copy(args, root, server, &topic, records).await?);
    }
    figures.failovers = Some(engine::failovers(server).await?);
    Ok(figures)
}

fn topic_of(size: u64) -> String {
    format!("records-{size}")
}

/// A server under test, in a process of its own.
struct Server {
    kind: KafkaServer,
    child: tokio::process::Child,
    pid: u32,
    bootstrap: SocketAddr,
    /// Tributary's connection string: the SASL PLAIN password and the AMQP clients'.
    connection_string: Option<String>,
    /// Tributary's child: its stdin (closing it stops the child) and its answers.
    control: Option<(
        tokio::process::ChildStdin,
        tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    )>,
}

impl Server {
    async fn start(kind: KafkaServer, args: &BenchArgs, root: &Path) -> Result<Server> {
        let server = match kind {
            KafkaServer::Tributary => {
                let mut hubs: Vec<String> = args.event_bytes.iter().map(|&s| topic_of(s)).collect();
                hubs.extend([LATENCY_TOPIC.to_owned(), AMQP_HUB.to_owned()]);
                Server::start_tributary(args, &root.join("tributary"), &hubs).await?
            }
            KafkaServer::Tansu => Server::start_tansu(args).await?,
        };
        wait_for_port(server.bootstrap).await?;
        if kind == KafkaServer::Tansu {
            create_topics(args, &server).await?;
        }
        Ok(server)
    }

    /// Tributary in a child process with the event hubs `hubs`, keeping its data in `dir`.
    async fn start_tributary(
        args: &BenchArgs,
        dir: &Path,
        hubs: &[impl AsRef<str>],
    ) -> Result<Server> {
        let hubs: Vec<&str> = hubs.iter().map(AsRef::as_ref).collect();
        let mode = args.modes.first().context("give a durability mode")?;
        let exe = std::env::current_exe().context("cannot find this program")?;
        let mut child = tokio::process::Command::new(exe)
            .args(["bench", "--scenario", "kafka", "--modes", &mode.to_string()])
            .args(["--partitions", &args.partitions.to_string()])
            .args(["--kafka-idle-connections"])
            .arg(args.kafka_idle_connections.to_string())
            .arg("--dir")
            .arg(dir)
            .env(SERVER_ENV, hubs.join(","))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start Tributary's server process")?;
        let stdin = child.stdin.take().context("the child's stdin")?;
        let mut lines = BufReader::new(child.stdout.take().context("the child's stdout")?).lines();
        let ready = lines.next_line().await?.unwrap_or_default();
        let mut words = ready.split(' ');
        anyhow::ensure!(
            words.next() == Some("ready"),
            "Tributary's server did not start: {ready:?}"
        );
        let bootstrap = words.next().context("no address")?.parse()?;
        let connection_string = words.next().context("no connection string")?.to_owned();
        Ok(Server {
            kind: KafkaServer::Tributary,
            pid: child.id().context("the child's pid")?,
            child,
            bootstrap,
            connection_string: Some(connection_string),
            control: Some((stdin, lines)),
        })
    }

    async fn start_tansu(args: &BenchArgs) -> Result<Server> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let url = format!("tcp://127.0.0.1:{port}");
        let child = tokio::process::Command::new(&args.tansu_bin)
            .args(["broker", "--listener-url", &url])
            .args(["--advertised-listener-url", &url])
            .args(["--storage-engine", "memory://tansu/"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start Tansu ({})", args.tansu_bin.display()))?;
        Ok(Server {
            kind: KafkaServer::Tansu,
            pid: child.id().context("Tansu's pid")?,
            child,
            bootstrap: SocketAddr::from(([127, 0, 0, 1], port)),
            connection_string: None,
            control: None,
        })
    }

    fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// Tributary's disk since the last call (syncs, appends per sync, their waits).
    async fn disk(&mut self) -> Result<Option<String>> {
        let Some((stdin, lines)) = self.control.as_mut() else {
            return Ok(None);
        };
        stdin.write_all(b"disk\n").await?;
        Ok(lines.next_line().await?)
    }

    /// The settings every client of this server shares.
    fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", self.bootstrap.to_string());
        if let Some(password) = &self.connection_string {
            config
                .set("security.protocol", "SASL_PLAINTEXT")
                .set("sasl.mechanisms", "PLAIN")
                .set("sasl.username", "$ConnectionString")
                .set("sasl.password", password);
        }
        config
    }

    async fn stop(mut self) -> Result<()> {
        if let Some((stdin, _)) = self.control.take() {
            drop(stdin);
            let ended = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
            if ended.is_ok() {
                return Ok(());
            }
        }
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }
}

async fn wait_for_port(addr: SocketAddr) -> Result<()> {
    let started = Instant::now();
    while TcpStream::connect(addr).await.is_err() {
        anyhow::ensure!(
            started.elapsed() < START_TIMEOUT,
            "nothing listens on {addr} after {START_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// Tansu's topics, created with an admin client (Tributary's child creates its event hubs).
async fn create_topics(args: &BenchArgs, server: &Server) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = server.client_config().create()?;
    let mut names: Vec<String> = args.event_bytes.iter().map(|&s| topic_of(s)).collect();
    names.push(LATENCY_TOPIC.to_owned());
    let partitions = i32::try_from(args.partitions)?;
    let topics: Vec<NewTopic<'_>> = names
        .iter()
        .map(|name| NewTopic::new(name, partitions, TopicReplication::Fixed(1)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics(&topics, &options).await? {
        result.map_err(|(topic, code)| anyhow::anyhow!("Tansu cannot create {topic}: {code}"))?;
    }
    Ok(())
}

/// A process's resident set, in KiB.
fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in the server's status")
}

/// CPU time of the server's process and of this one, at a moment.
#[derive(Clone, Copy)]
struct CpuMark {
    at: Instant,
    server: u64,
    client: u64,
}

/// CPU seconds used by each side over a window.
struct CpuUse {
    wall: Duration,
    server_s: f64,
    client_s: f64,
}

impl CpuMark {
    fn now(server: &Server) -> CpuMark {
        CpuMark {
            at: Instant::now(),
            server: crate::bench::cpu_ticks(&server.pid.to_string()),
            client: crate::bench::cpu_ticks("self"),
        }
    }

    fn since(self, server: &Server) -> CpuUse {
        let now = CpuMark::now(server);
        CpuUse {
            wall: now.at.duration_since(self.at),
            server_s: now.server.saturating_sub(self.server) as f64 / 100.0,
            client_s: now.client.saturating_sub(self.client) as f64 / 100.0,
        }
    }
}

impl CpuUse {
    /// The server's CPU time per record, in µs.
    fn server_us(&self, records: u64) -> f64 {
        self.server_s * 1e6 / records.max(1) as f64
    }

    fn per_record(&self, records: u64) -> String {
        let records = records.max(1) as f64;
        let wall = self.wall.as_secs_f64().max(1e-9);
        format!(
            "CPU per record: server {:.2} µs ({:.0} % of a core), clients {:.2} µs ({:.0} %)",
            self.server_s * 1e6 / records,
            self.server_s * 100.0 / wall,
            self.client_s * 1e6 / records,
            self.client_s * 100.0 / wall,
        )
    }
}

/// Holds `--kafka-idle-connections` logged-in, silent connections; the server's resident-set
/// growth per connection, in KiB.
async fn idle_connections(args: &BenchArgs, server: &Server) -> Result<f64> {
    let n = args.kafka_idle_connections;
    let before = rss_kib(server.pid)?;
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        let mut opening = tokio::task::JoinSet::new();
        for _ in 0..CONNECT_WAVE.min(n - held.len()) {
            let (addr, password) = (server.bootstrap, server.connection_string.clone());
            opening.spawn(async move { open_idle(addr, password.as_deref()).await });
        }
        while let Some(opened) = opening.join_next().await {
            held.push(opened.context("a connecting task failed")??);
        }
    }
    // Let the server settle each connection after its last answer.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss_kib(server.pid)?;
    let per_connection = after.saturating_sub(before) as f64 / n.max(1) as f64;
    println!(
        "{} idle connections: {n} logged in and silent, server RSS {:.1} -> {:.1} MiB, {per_connection:.1} KiB per connection",
        server.name(),
        before as f64 / 1024.0,
        after as f64 / 1024.0,
    );
    drop(held);
    Ok(per_connection)
}

/// A connection as a client leaves it idle: logged in (SASL PLAIN when `password` is given),
/// its ApiVersions asked, then silent.
async fn open_idle(addr: SocketAddr, password: Option<&str>) -> Result<TcpStream> {
    let mut socket = TcpStream::connect(addr).await?;
    if let Some(password) = password {
        exchange(&mut socket, 17, 1, &kafka_string(b"PLAIN")).await?;
        let login = [&b"\0$ConnectionString\0"[..], password.as_bytes()].concat();
        let mut bytes = i32::try_from(login.len())?.to_be_bytes().to_vec();
        bytes.extend_from_slice(&login);
        exchange(&mut socket, 36, 0, &bytes).await?;
    }
    exchange(&mut socket, 18, 0, &[]).await?;
    Ok(socket)
}

fn kafka_string(value: &[u8]) -> Vec<u8> {
    let mut out = i16::try_from(value.len())
        .expect("a short string")
        .to_be_bytes()
        .to_vec();
    out.extend_from_slice(value);
    out
}

/// Sends one request (header v1, client id `idle`) and checks its answer's error code (the
/// first field of these APIs' responses).
async fn exchange(socket: &mut TcpStream, api_key: i16, version: i16, body: &[u8]) -> Result<()> {
    socket
        .write_all(&request_frame(api_key, version, body))
        .await?;
    let size = usize::try_from(socket.read_i32().await?)?;
    let mut answer = vec![0; size];
    socket.read_exact(&mut answer).await?;
    let code = answer.get(4..6).context("a short answer")?;
    anyhow::ensure!(
        code == [0, 0],
        "API {api_key} answered error {}",
        i16::from_be_bytes([code[0], code[1]])
    );
    Ok(())
}

/// A request as the wire carries it: its size, then header v1 (API key, version, correlation id
/// 1, client id `idle`) and `body`.
fn request_frame(api_key: i16, version: i16, body: &[u8]) -> Vec<u8> {
    let mut frame = vec![0; 4];
    frame.extend_from_slice(&api_key.to_be_bytes());
    frame.extend_from_slice(&version.to_be_bytes());
    frame.extend_from_slice(&1i32.to_be_bytes());
    frame.extend_from_slice(&kafka_string(b"idle"));
    frame.extend_from_slice(body);
    let size = u32::try_from(frame.len() - 4).expect("a small request");
    frame[..4].copy_from_slice(&size.to_be_bytes());
    frame
}

/// Counts one producer's acknowledgements and, in the latency run, their latencies.
struct Acks {
    base: Instant,
    delivered: AtomicU64,
    failed: AtomicU64,
    first_error: Mutex<Option<String>>,
    /// Latencies (µs) of records sent at or after `record_from_us` (since `base`).
    latency_us: Option<Mutex<Histogram<u64>>>,
    record_from_us: usize,
}

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    /// When the record was sent, in µs since `base`.
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, sent_us: usize) {
        match result {
            Ok(_) => {
                self.delivered.fetch_add(1, Ordering::Relaxed);
                if let Some(histogram) = &self.latency_us
                    && sent_us >= self.record_from_us
                {
                    let now_us = self.base.elapsed().as_micros() as usize;
                    let us = now_us.saturating_sub(sent_us).max(1) as u64;
                    histogram.lock().expect("histogram").saturating_record(us);
                }
            }
            Err((e, _)) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                let mut first = self.first_error.lock().expect("first error");
                first.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

type KafkaProducer = ThreadedProducer<Acks>;

/// One producer (its own connection) for the flood or (`paced`) the latency run, sending
/// batches of at most `batch_records`.
fn new_producer(
    server: &Server,
    i: usize,
    paced: bool,
    batch_records: usize,
) -> Result<Arc<KafkaProducer>> {
    let mut config = server.client_config();
    let linger = if paced {
        LINGER_MS_LATENCY
    } else {
        LINGER_MS_FLOOD
    };
    config
        .set("client.id", format!("bench-producer-{i}"))
        .set("acks", "all")
        .set("enable.idempotence", "false")
        .set("compression.type", "none")
        .set("linger.ms", linger)
        .set("batch.num.messages", batch_records.to_string())
        .set("queue.buffering.max.messages", QUEUE_RECORDS_MAX);
    let acks = Acks {
        base: Instant::now(),
        delivered: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        first_error: Mutex::new(None),
        latency_us: paced
            .then(|| Histogram::new_with_bounds(1, 60_000_000, 3).expect("bounds"))
            .map(Mutex::new),
        record_from_us: WARM_UP.as_micros() as usize,
    };
    Ok(Arc::new(config.create_with_context(acks)?))
}

/// What a produce run measured.
struct Produced {
    /// Acknowledged within the window.
    records: u64,
    cpu: CpuUse,
    /// Acknowledged in all (what the consumers read back).
    total: u64,
    latency_us: Option<Histogram<u64>>,
}

impl Produced {
    fn rate(&self) -> f64 {
        self.records as f64 / self.cpu.wall.as_secs_f64()
    }
}

/// Produces `size`-byte records to `topic` from `--producers` producers, flat out or, with
/// `rate`, at `rate` records/s in all; counts what is acknowledged within `--seconds` after the
/// warm-up.
async fn produce(
    args: &BenchArgs,
    server: &Server,
    topic: &str,
    size: u64,
    rate: Option<f64>,
) -> Result<Produced> {
    let producers: Vec<_> = (0..args.producers)
        .map(|i| new_producer(server, i, rate.is_some(), args.batch_events))
        .collect::<Result<_>>()?;
    let stop = Arc::new(AtomicBool::new(false));
    let share = rate.map(|r| r / args.producers as f64);
    let threads: Vec<_> = producers
        .iter()
        .enumerate()
        .map(|(i, producer)| {
            let (producer, stop, topic) = (producer.clone(), stop.clone(), topic.to_owned());
            let partition = i32::try_from(i % args.partitions).expect("a partition");
            let body = vec![0x5a; usize::try_from(size).expect("a record size")];
            std::thread::spawn(move || send_loop(&producer, &topic, partition, &body, share, &stop))
        })
        .collect();
    let delivered = || -> u64 {
        let each = producers
            .iter()
            .map(|p| p.context().delivered.load(Ordering::Relaxed));
        each.sum()
    };
    tokio::time::sleep(WARM_UP).await;
    let (first, mark) = (delivered(), CpuMark::now(server));
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let (records, cpu) = (delivered() - first, mark.since(server));
    stop.store(true, Ordering::Relaxed);
    let joined = tokio::task::spawn_blocking(move || {
        threads
            .into_iter()
            .map(|t| t.join().expect("a producer thread panicked"))
            .collect::<Result<Vec<()>>>()
    });
    joined.await??;
    Ok(Produced {
        records,
        cpu,
        total: delivered(),
        latency_us: acknowledged(&producers)?,
    })
}

/// Checks that nothing failed; the producers' latencies merged (latency run only).
fn acknowledged(producers: &[Arc<KafkaProducer>]) -> Result<Option<Histogram<u64>>> {
    let mut merged: Option<Histogram<u64>> = None;
    for producer in producers {
        let acks = producer.context();
        if let Some(e) = acks.first_error.lock().expect("first error").take() {
            anyhow::bail!(
                "{} records were not acknowledged; the first: {e}",
                acks.failed.load(Ordering::Relaxed)
            );
        }
        if let Some(h) = &acks.latency_us {
            let h = h.lock().expect("histogram");
            match merged.as_mut() {
                Some(m) => m.add(&*h).expect("same bounds"),
                None => merged = Some(h.clone()),
            }
        }
    }
    Ok(merged)
}

/// One producer's thread: sends until `stop` (flat out, or `share` records/s on a 1 ms tick),
/// then waits for every acknowledgement.
fn send_loop(
    producer: &KafkaProducer,
    topic: &str,
    partition: i32,
    body: &[u8],
    share: Option<f64>,
    stop: &AtomicBool,
) -> Result<()> {
    let base = producer.context().base;
    let started = Instant::now();
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let due = share.map_or(sent + 1_000, |r| {
            (started.elapsed().as_secs_f64() * r) as u64
        });
        while sent < due {
            let at = base.elapsed().as_micros() as usize;
            let record = BaseRecord::<(), [u8], usize>::with_opaque_to(topic, at)
                .partition(partition)
                .payload(body);
            match producer.send(record) {
                Ok(()) => sent += 1,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    std::thread::sleep(Duration::from_micros(200));
                }
                Err((e, _)) => return Err(e).context("a send failed"),
            }
        }
        if share.is_some() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    producer
        .flush(Duration::from_secs(60))
        .context("the producer's last records were not acknowledged within 60 s")
}

/// Reads `expected` records of `size` bytes back from `topic`.
async fn consume(
    args: &BenchArgs,
    server: &Server,
    topic: &str,
    size: u64,
    expected: u64,
) -> Result<Run> {
    let count = Arc::new(ConsumeCount::default());
    let mark = CpuMark::now(server);
    let threads: Vec<_> = (0..args.partitions)
        .map(|i| {
            let config = consumer_config(server, topic, i);
            let (topic, count) = (topic.to_owned(), count.clone());
            let mode = args.kafka_consume;
            std::thread::spawn(move || consume_loop(&config, &topic, i, mode, expected, &count))
        })
        .collect();
    let joined = tokio::task::spawn_blocking(move || {
        threads
            .into_iter()
            .map(|t| t.join().expect("a consumer thread panicked"))
            .collect::<Result<Vec<()>>>()
    });
    joined.await??;
    let cpu = mark.since(server);
    let (first, last) = count.span();
    let span = last.duration_since(first).as_secs_f64();
    let records = count.records.load(Ordering::Relaxed);
    let bytes = count.bytes.load(Ordering::Relaxed);
    anyhow::ensure!(
        bytes == records * size,
        "{records} records read back with {bytes} bytes, not {size} each"
    );
    let rate = records as f64 / span;
    println!(
        "{} consume {size} B ({}): {} records/s ({records} records in {span:.2} s from the first; the first {:.0} ms after the consumers started); {}",
        server.name(),
        consume_mode(args.kafka_consume),
        thousands(rate),
        first.duration_since(mark.at).as_secs_f64() * 1e3,
        cpu.per_record(records),
    );
    Ok(Run {
        size,
        rate,
        server_us: cpu.server_us(records),
    })
}

fn consume_mode(mode: KafkaConsume) -> &'static str {
    match mode {
        KafkaConsume::Assign => "one partition assigned to each consumer",
        KafkaConsume::Group => "one consumer group",
    }
}

/// The consumers' shared count, and when the first and the last record came.
#[derive(Default)]
struct ConsumeCount {
    records: AtomicU64,
    bytes: AtomicU64,
    span: Mutex<Option<(Instant, Instant)>>,
}

impl ConsumeCount {
    fn add(&self, records: u64, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.records.fetch_add(records, Ordering::Relaxed);
    }

    /// One consumer's first and last record, merged into the earliest and the latest.
    fn merge_span(&self, first: Instant, last: Instant) {
        let mut span = self.span.lock().expect("span");
        let merged = span.map_or((first, last), |(f, l)| (f.min(first), l.max(last)));
        *span = Some(merged);
    }

    fn span(&self) -> (Instant, Instant) {
        let now = Instant::now();
        self.span.lock().expect("span").unwrap_or((now, now))
    }
}

fn consumer_config(server: &Server, topic: &str, i: usize) -> ClientConfig {
    let mut config = server.client_config();
    config
        .set("client.id", format!("bench-consumer-{i}"))
        .set("group.id", format!("bench-{topic}"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_uncommitted")
        .set("fetch.wait.max.ms", "100");
    config
}

/// One consumer's thread: reads until the consumers together have `expected` records.
fn consume_loop(
    config: &ClientConfig,
    topic: &str,
    partition: usize,
    mode: KafkaConsume,
    expected: u64,
    count: &ConsumeCount,
) -> Result<()> {
    let consumer: BaseConsumer = config.create()?;
    match mode {
        KafkaConsume::Assign => {
            let mut assignment = TopicPartitionList::new();
            assignment.add_partition_offset(topic, i32::try_from(partition)?, Offset::Beginning)?;
            consumer.assign(&assignment)?;
        }
        KafkaConsume::Group => consumer.subscribe(&[topic])?,
    }
    let (mut records, mut bytes) = (0u64, 0u64);
    let mut span: Option<(Instant, Instant)> = None;
    let (mut seen, mut progress) = (0u64, Instant::now());
    while seen < expected {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(message)) => {
                let now = Instant::now();
                span = Some(span.map_or((now, now), |(first, _)| (first, now)));
                records += 1;
                bytes += message.payload_len() as u64;
                if records < 256 {
                    continue;
                }
            }
            Some(Err(e)) => return Err(e).context("a consumer's poll failed"),
            None => {}
        }
        count.add(records, bytes);
        (records, bytes) = (0, 0);
        let now_seen = count.records.load(Ordering::Relaxed);
        if now_seen > seen {
            (seen, progress) = (now_seen, Instant::now());
        }
        anyhow::ensure!(
            progress.elapsed() < STALL,
            "the consumers stalled at {seen} of {expected} records"
        );
    }
    if let Some((first, last)) = span {
        count.merge_span(first, last);
    }
    Ok(())
}

/// The latency run: 100-byte records at `--kafka-rate` in all; the p99 in ms.
async fn latency(args: &BenchArgs, server: &Server) -> Result<f64> {
    let rate = args.kafka_rate as f64;
    let produced = produce(args, server, LATENCY_TOPIC, 100, Some(rate)).await?;
    let h = produced
        .latency_us
        .as_ref()
        .context("no latencies recorded")?;
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{} latency at {} records/s offered (100 B, linger.ms {LINGER_MS_LATENCY}, acks=all), send call to acknowledgement: p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms, max {:.2} ms ({} records; {} records/s acknowledged); {}",
        server.name(),
        thousands(rate),
        ms(0.5),
        ms(0.99),
        ms(0.999),
        h.max() as f64 / 1000.0,
        h.len(),
        thousands(produced.rate()),
        produced.cpu.per_record(produced.records),
    );
    Ok(ms(0.99))
}

/// The AMQP door's ingest into the same Tributary with the Rust client.
async fn amqp_ingest(args: &BenchArgs, server: &Server) -> Result<Run> {
    let connection_string = server
        .connection_string
        .as_deref()
        .context("no AMQP door")?;
    let mut clients = Vec::with_capacity(args.producers);
    for _ in 0..args.producers {
        let client = tributary_client::ProducerClient::connect(connection_string, AMQP_HUB)
            .await
            .context("an AMQP producer cannot connect")?;
        clients.push(client);
    }
    let size = usize::try_from(args.event_bytes[0])?;
    let batch: Vec<EventData> = (0..args.batch_events)
        .map(|_| EventData::new(vec![0x5a; size]))
        .collect();
    let (acked, stop) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let mut tasks = tokio::task::JoinSet::new();
    for (i, client) in clients.iter().enumerate() {
        let target = SendTarget::Partition((i % args.partitions).to_string());
        for _ in 0..args.send_window {
            let (client, acked, stop) = (client.clone(), acked.clone(), stop.clone());
            let (batch, target) = (batch.clone(), target.clone());
            tasks.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    client.send(&batch, target.clone()).await?;
                    acked.fetch_add(batch.len() as u64, Ordering::Relaxed);
                }
                anyhow::Ok(())
            });
        }
    }
    tokio::time::sleep(WARM_UP).await;
    let (first, mark) = (acked.load(Ordering::Relaxed), CpuMark::now(server));
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let (records, cpu) = (acked.load(Ordering::Relaxed) - first, mark.since(server));
    stop.store(true, Ordering::Relaxed);
    while let Some(task) = tasks.join_next().await {
        task.context("a sending task panicked")??;
    }
    for client in &clients {
        client.close().await;
    }
    let rate = records as f64 / cpu.wall.as_secs_f64();
    println!(
        "tributary AMQP ingest {size} B (Rust client, {} producers, batches of {}, {} sends in flight each): {} records/s; {}",
        args.producers,
        args.batch_events,
        args.send_window,
        thousands(rate),
        cpu.per_record(records),
    );
    Ok(Run {
        size: args.event_bytes[0],
        rate,
        server_us: cpu.server_us(records),
    })
}

/// The targets, each with the figures it is judged on; a rate's ratio also as the ratio of the
/// servers' CPU per record, which holds when the clients' share of the cores limits the rates.
fn summarize(args: &BenchArgs, figures: &[(KafkaServer, Figures)], amqp: Option<Run>) {
    for (kind, figures) in figures {
        let consumed = figures.consume.first().map(|run| run.rate);
        if let (Some(copy), Some(rate), Some(failovers)) =
            (figures.copy, consumed, figures.failovers)
        {
            engine::summarize(kind.name(), copy, rate, failovers);
        }
    }
    let of = |kind| figures.iter().find(|(k, _)| *k == kind).map(|(_, f)| f);
    let Some(ours) = of(KafkaServer::Tributary) else {
        return;
    };
    let small = args.event_bytes[0];
    let at = |runs: &[Run], size| runs.iter().find(|r| r.size == size).copied();
    if let Some(run) = at(&ours.produce, small) {
        let what = format!("produce {small} B");
        target(&what, run.rate, PRODUCE_TARGET, "records/s");
        if let Some(amqp) = amqp {
            ratio(
                "produce over Kafka / AMQP ingest",
                run,
                amqp,
                AMQP_SHARE_TARGET,
            );
        }
    }
    if let Some(run) = at(&ours.consume, small) {
        let what = format!("consume {small} B");
        target(&what, run.rate, CONSUME_TARGET, "records/s");
    }
    if let Some(tansu) = of(KafkaServer::Tansu) {
        for (what, ours, theirs) in [
            ("produce", &ours.produce, &tansu.produce),
            ("consume", &ours.consume, &tansu.consume),
        ] {
            for &run in ours {
                if let Some(theirs) = at(theirs, run.size) {
                    let what = format!("{what}, Tributary / Tansu");
                    ratio(&what, run, theirs, TANSU_RATIO_TARGET);
                }
            }
        }
    }
    let p99 = verdict(ours.p99_ms <= P99_TARGET_MS);
    println!(
        "target: produce p99 {:.2} ms (<= {P99_TARGET_MS} ms: {p99})",
        ours.p99_ms
    );
    let idle = verdict(ours.idle_kib <= IDLE_TARGET_KIB);
    println!(
        "target: idle connection {:.1} KiB (<= {IDLE_TARGET_KIB} KiB: {idle})",
        ours.idle_kib
    );
}

/// `ours` against `theirs`: the rates' ratio judged against `goal`, and the inverse ratio of
/// the servers' CPU per record (how many times less CPU each record cost ours).
fn ratio(what: &str, ours: Run, theirs: Run, goal: f64) {
    let rates = ours.rate / theirs.rate;
    println!(
        "target: {what} {} B = {} / {} records/s = {rates:.2}x (>= {goal:.2}x: {}); server CPU per record {:.2} / {:.2} µs = {:.2}x less",
        ours.size,
        thousands(ours.rate),
        thousands(theirs.rate),
        verdict(rates >= goal),
        ours.server_us,
        theirs.server_us,
        theirs.server_us / ours.server_us.max(1e-9),
    )
}

fn target(what: &str, value: f64, goal: f64, unit: &str) {
    println!(
        "target: {what} {} {unit} (>= {} {unit}: {})",
        thousands(value),
        thousands(goal),
        verdict(value >= goal)
    );
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

/// The child process: a hub with the event hubs `hubs`, its Kafka and AMQP doors on 127.0.0.1;
/// prints `ready <Kafka address> <connection string>`, answers `disk` with the log's syncs since
/// the last answer and `events <hub>` with the events the hub holds, and stops when its stdin
/// ends.
async fn serve_child(args: &BenchArgs, root: &Path, hubs: &str) -> Result<()> {
    use tributary_amqp::{AccessPolicies, AccessPolicy, AmqpConfig, Right};
    let mut config = tributary_broker::BrokerConfig::new(root);
    config.log.durability = *args.modes.first().context("give a durability mode")?;
    let broker = tributary_broker::Broker::open(config).await?;
    let partitions = u32::try_from(args.partitions)?;
    for hub in hubs.split(',') {
        broker
            .create_hub(tributary_broker::HubSpec::new(hub, partitions))
            .await?;
    }
    let policy = AccessPolicy::generate("RootManageSharedAccessKey", vec![Right::Manage])?;
    let policies = AccessPolicies::new(vec![policy.clone()])?;
    let local = SocketAddr::from(([127, 0, 0, 1], 0));
    let amqp =
        tributary_amqp::start(broker.clone(), AmqpConfig::new(local, policies.clone())).await?;
    let mut kafka_config = tributary_kafka::KafkaConfig::new(local, policies);
    let caps = args.kafka_idle_connections + 64;
    kafka_config.limits.connections_max = caps;
    kafka_config.limits.connections_per_address_max = caps;
    let kafka = tributary_kafka::start(broker.clone(), kafka_config).await?;
    let port = amqp.local_addr().port();
    let connection_string = tributary_amqp::connection_string("127.0.0.1", port, &policy);
    println!("ready {} {connection_string}", kafka.local_addr());
    let mut last = broker.sync_times();
    let mut commands = BufReader::new(tokio::io::stdin()).lines();
    while let Some(command) = commands.next_line().await? {
        if command == "disk" {
            let now = broker.sync_times();
            println!("{}", now.since(&last));
            last = now;
        } else if let Some(hub) = command.strip_prefix("events ") {
            println!("{}", events_held(&broker, hub, partitions)?);
        }
    }
    kafka.shutdown().await;
    amqp.shutdown().await;
    broker.shutdown().await?;
    Ok(())
}

/// The events the event hub `hub` holds: its partitions' end sequence numbers + 1 (nothing
/// expires within a run).
fn events_held(broker: &tributary_broker::Broker, hub: &str, partitions: u32) -> Result<u64> {
    let mut total = 0;
    for partition in 0..partitions {
        let properties = broker.partition_properties(hub, &partition.to_string())?;
        total += u64::try_from(properties.last_enqueued_sequence_number + 1).unwrap_or(0);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_frame_is_its_size_then_header_v1_then_its_body() {
        let frame = request_frame(17, 1, &kafka_string(b"PLAIN"));
        let expected: &[u8] = &[
            0, 0, 0, 21, // size of what follows
            0, 17, 0, 1, // SaslHandshake v1
            0, 0, 0, 1, // correlation id
            0, 4, b'i', b'd', b'l', b'e', // client id
            0, 5, b'P', b'L', b'A', b'I', b'N', // mechanism
        ];
        assert_eq!(frame, expected);
    }

    #[test]
    fn rates_print_with_thousands_separators() {
        assert_eq!(thousands(0.0), "0");
        assert_eq!(thousands(999.4), "999");
        assert_eq!(thousands(1_000.0), "1,000");
        assert_eq!(thousands(1_234_567.8), "1,234,568");
    }
}
