//! End-to-end benchmark of the AMQP front door with the Rust client (`tributary-client`).
//!
//! `cargo bench -p tributary-amqp --bench end_to_end [-- options]` starts a broker (fsync
//! durability, a temporary data directory under `$TRIBUTARY_BENCH_DIR`, default
//! `<repo>/target/bench-tmp`) and the AMQP listener on loopback, then measures:
//!
//! - **connections**: 1,000 connections, each holding a receiver open, made by a child process
//!   (this binary re-run with `--connections-child`), so the figure is this server process's
//!   own resident memory (`VmRSS`, `VmHWM` from `/proc/self/status`), before and with them.
//! - **ingest**: producers (one connection each) sending batches of 100-byte events, each
//!   with `--in-flight` concurrent `send` calls per partition (default 16; the client pipelines
//!   them on one link); events/s and MB/s of bodies acknowledged.
//! - **ingest, pipelined**: the same with a bare engine sender that keeps 16 batches in flight
//!   per link: the engine's ceiling, without the client's event encoding.
//! - **deliver**: receivers on every partition reading the ingested backlog from the start.
//! - **latency**: p50/p99/p999 from the send call to the receive (a timestamp in the body) at
//!   a fixed offered rate, with receivers tailing every partition.
//! - **handshake** (with `--tls`): TLS handshakes one after another for `--seconds`, each a new
//!   TCP connection to the AMQPS listener; p50/p99/max of connect + handshake.
//!
//! Client and server share the machine (and, but for the connections run, the process); every
//! figure is printed on its own line with its conditions. Options: `--seconds N` (each timed
//! run, default 10), `--warm-memory-gib N` (default 4: memory allocated and touched by a child
//! process first, because first touch of fresh memory is slow on the VMs this runs on; 0 skips
//! it), `--only ingest,ingest-pipelined,deliver,latency,connections`, `--producers`,
//! `--partitions`, `--consumer-connections`, `--prefetch`, `--in-flight`, `--durability fsync|none`,
//! `--tls` (AMQPS with a development certificate; the connections run stays plain),
//! `--event-bytes N` (every event body's size, default 100), `--groups N` (consumer groups
//! reading the backlog at once in the delivery run, each on `--consumer-connections` of its
//! own; default 1).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fe2o3_amqp::connection::Connection;
use fe2o3_amqp::link::delivery::{DeliveryFut, Sendable};
use fe2o3_amqp::link::{SendError, Sender};
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::session::Session;
use fe2o3_amqp_types::messaging::message::__private::Serializable;
use fe2o3_amqp_types::messaging::{Batch, Data, Message, Outcome};
use fe2o3_amqp_types::primitives::Binary;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tributary_amqp::{AccessPolicies, AccessPolicy, AmqpConfig, Right};
use tributary_broker::{Broker, BrokerConfig, Durability, HubSpec, SyncTimes};
use tributary_client::{ClientOptions, ConsumerClient, ProducerClient};
use tributary_event::{EventData, EventPosition, SendTarget};

/// The allocator `tributary` ships with, so the server's figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The size of every event body (`--event-bytes`, default 100), set once before any run.
static EVENT_BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn event_bytes() -> usize {
    *EVENT_BYTES.get_or_init(|| 100)
}
/// The message format of an Event Hubs batch.
const BATCH_FORMAT: u32 = 0x8001_3700;
const BATCH_EVENTS: usize = 100;
/// Hub for the connections run: 32 partitions × 7 consumer groups × 5 receivers ≥ 1,000
/// (Event Hubs allows five non-epoch receivers per partition and group).
const FANOUT_PARTITIONS: u32 = 32;
const FANOUT_GROUPS: usize = 7;

#[derive(Debug, Clone)]
struct Options {
    seconds: u64,
    warm_memory_gib: u64,
    only: Vec<String>,
    producers: usize,
    partitions: u32,
    consumer_connections: usize,
    prefetch: u32,
    /// Concurrent `send` calls per producer and partition in the ingest run.
    in_flight: usize,
    durability: Durability,
    /// Events per second offered in the latency run.
    latency_rate: u64,
    /// Connections in the connections run.
    connections: usize,
    /// AMQPS: the listener has a development certificate and the clients trust its authority.
    tls: bool,
    /// Consumer groups reading the backlog at once in the delivery run, each on its own
    /// connections.
    groups: usize,
}

impl Options {
    fn parse(args: &[String]) -> Options {
        let mut options = Options {
            seconds: 10,
            warm_memory_gib: 4,
            only: vec![],
            producers: 4,
            partitions: 8,
            consumer_connections: 4,
            prefetch: 3000,
            in_flight: 16,
            durability: Durability::Fsync,
            latency_rate: 50_000,
            connections: 1000,
            tls: false,
            groups: 1,
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value = || args.next().expect("option value").clone();
            match arg.as_str() {
                "--seconds" => options.seconds = value().parse().expect("--seconds N"),
                "--warm-memory-gib" => {
                    options.warm_memory_gib = value().parse().expect("--warm-memory-gib N")
                }
                "--only" => options.only = value().split(',').map(str::to_owned).collect(),
                "--producers" => options.producers = value().parse().expect("--producers N"),
                "--partitions" => options.partitions = value().parse().expect("--partitions N"),
                "--consumer-connections" => {
                    options.consumer_connections =
                        value().parse().expect("--consumer-connections N")
                }
                "--prefetch" => options.prefetch = value().parse().expect("--prefetch N"),
                "--in-flight" => options.in_flight = value().parse().expect("--in-flight N"),
                "--latency-rate" => {
                    options.latency_rate = value().parse().expect("--latency-rate N")
                }
                "--connections" => options.connections = value().parse().expect("--connections N"),
                "--tls" => options.tls = true,
                "--groups" => options.groups = value().parse().expect("--groups N"),
                "--event-bytes" => {
                    let bytes: usize = value().parse().expect("--event-bytes N");
                    assert!(
                        bytes >= 16,
                        "--event-bytes is at least 16 (bodies carry stamps)"
                    );
                    EVENT_BYTES.set(bytes).expect("--event-bytes given once");
                }
                "--durability" => {
                    options.durability = match value().as_str() {
                        "fsync" => Durability::Fsync,
                        "none" => Durability::None,
                        other => panic!("--durability fsync|none, not {other}"),
                    }
                }
                // `cargo bench` passes `--bench`; filters are not used.
                _ => {}
            }
        }
        options
    }

    fn runs(&self, name: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|o| o == name)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--warm-child") => warm_memory(args[1].parse().expect("GiB")),
        Some("--connections-child") => connections_child(&args[1..]),
        _ if args.iter().any(|a| a == "--bench") => bench(Options::parse(&args)),
        // `cargo test --all-targets` runs this without `--bench`: a short smoke run that keeps
        // the benchmark's code working, with figures that mean nothing (debug build).
        _ => {
            println!("# smoke run (cargo test): the figures below are not measurements");
            let mut smoke = Options::parse(&args);
            smoke.seconds = 1;
            smoke.warm_memory_gib = 0;
            smoke.latency_rate = 2_000;
            smoke.connections = 20;
            smoke.producers = 1;
            smoke.partitions = 2;
            bench(smoke);
        }
    }
}

fn bench(options: Options) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "# tributary-amqp end-to-end bench: broker, AMQP server and Rust clients on loopback, sharing {cores} cores (client and server compete for them); {} build; load average {}",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        load_average()
    );
    if options.warm_memory_gib > 0 {
        let started = Instant::now();
        let status = std::process::Command::new(std::env::current_exe().expect("own path"))
            .arg("--warm-child")
            .arg(options.warm_memory_gib.to_string())
            .status()
            .expect("warm-up child runs");
        assert!(status.success(), "warm-up child failed");
        println!(
            "# warmed {} GiB of memory first (allocated and touched in a child process, {:.1} s): first touch of fresh memory is slow on this VM",
            options.warm_memory_gib,
            started.elapsed().as_secs_f64()
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(run(options));
}

/// Allocates and touches `gib` GiB, one GiB at a time, then exits.
fn warm_memory(gib: u64) {
    for _ in 0..gib {
        let block = vec![1u8; 1 << 30];
        std::hint::black_box(&block);
    }
}

struct Server {
    broker: Broker,
    server: tributary_amqp::RunningAmqpServer,
    root: AccessPolicy,
    /// The development authority the clients trust, when the listener speaks TLS.
    authority: Option<PathBuf>,
    _dir: tempfile::TempDir,
}

impl Server {
    async fn start(durability: Durability, tls: bool) -> Server {
        let base = std::env::var_os("TRIBUTARY_BENCH_DIR").map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-tmp"),
            PathBuf::from,
        );
        std::fs::create_dir_all(&base).expect("bench directory");
        let dir = tempfile::tempdir_in(&base).expect("temporary data directory");
        let mut config = BrokerConfig::new(dir.path());
        config.log.durability = durability;
        let broker = Broker::open(config).await.expect("broker opens");
        let root = AccessPolicy::generate("RootManageSharedAccessKey", vec![Right::Manage])
            .expect("policy");
        let policies = AccessPolicies::new(vec![root.clone()]).expect("policies");
        let mut config = AmqpConfig::new("127.0.0.1:0".parse().expect("address"), policies);
        let mut authority = None;
        if tls {
            let hosts = ["localhost".to_owned(), "127.0.0.1".to_owned()];
            let made =
                tributary_tls::write_development_certificates(&dir.path().join("tls"), &hosts)
                    .expect("development certificates");
            config.tls = Some(
                tributary_tls::ServerTls::from_pem_files(&made.server_cert, &made.server_key)
                    .expect("certificate"),
            );
            authority = Some(made.ca_cert);
        }
        let server = tributary_amqp::start(broker.clone(), config)
            .await
            .expect("listener");
        println!(
            "# data directory {} (durability {durability}, {})",
            dir.path().display(),
            if tls {
                "AMQPS: TLS 1.3 with rustls"
            } else {
                "plain AMQP"
            }
        );
        Server {
            broker,
            server,
            root,
            authority,
            _dir: dir,
        }
    }

    fn conn(&self) -> String {
        let port = self.server.local_addr().port();
        match self.authority {
            Some(_) => tributary_amqp::tls_connection_string("localhost", port, &self.root),
            None => tributary_amqp::connection_string("127.0.0.1", port, &self.root),
        }
    }

    /// How the bench's clients connect: trusting the development authority over TLS.
    fn options(&self) -> ClientOptions {
        match &self.authority {
            Some(ca) => ClientOptions::default().with_trusted_certificates(ca),
            None => ClientOptions::default(),
        }
    }

    async fn stop(self) {
        self.server.shutdown().await;
        self.broker.shutdown().await.expect("broker shuts down");
    }
}

async fn run(options: Options) {
    let server = Server::start(options.durability, options.tls).await;
    if options.runs("handshake") && options.tls {
        handshakes(&server, options.seconds).await;
    }
    if options.runs("connections") {
        connections(&server, options.connections).await;
    }
    server
        .broker
        .create_hub(HubSpec::new("bench", options.partitions))
        .await
        .expect("hub");
    let mut ingested = 0;
    if options.runs("ingest") || options.runs("deliver") {
        ingested = ingest(&server, &options).await;
    }
    if options.runs("ingest-pipelined") {
        // Its own hub, so the delivery run reads what the Rust client sent.
        server
            .broker
            .create_hub(HubSpec::new("pipelined", options.partitions))
            .await
            .expect("hub");
        ingest_pipelined(&server, &options).await;
    }
    if options.runs("deliver") {
        deliver(&server, &options, ingested).await;
    }
    if options.runs("latency") {
        latency(&server, &options).await;
    }
    server.stop().await;
}

/// New TCP connections with a TLS handshake each, one after another, for `seconds`: what a
/// client pays to connect over AMQPS, before AMQP's own open.
async fn handshakes(server: &Server, seconds: u64) {
    let ca = server.authority.as_ref().expect("a TLS listener");
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("authority") {
        roots.add(cert.expect("certificate")).expect("trusted");
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let addr = server.server.local_addr();
    let mut samples = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < deadline {
        let started = Instant::now();
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let name = ServerName::try_from("localhost").expect("name");
        let tls = connector.connect(name, tcp).await.expect("handshake");
        samples.push(started.elapsed().as_nanos() as u64);
        drop(tls);
    }
    samples.sort_unstable();
    println!(
        "handshake: {} TLS handshakes (TCP connect + TLS 1.3, rustls both ends, loopback): p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        samples.len(),
        quantile_ms(&samples, 0.50),
        quantile_ms(&samples, 0.99),
        quantile_ms(&samples, 1.0),
    );
}

fn batch(tag: usize) -> Vec<EventData> {
    (0..BATCH_EVENTS)
        .map(|i| {
            let mut body = vec![b'x'; event_bytes()];
            body[..8].copy_from_slice(&((tag * BATCH_EVENTS + i) as u64).to_le_bytes());
            EventData::new(body)
        })
        .collect()
}

/// Producers each keep `in_flight` batches in flight per partition (that many concurrent
/// `send` calls) until `seconds` have passed; returns the events acknowledged.
async fn ingest(server: &Server, o: &Options) -> u64 {
    let (seconds, n_producers, n_partitions) = (o.seconds, o.producers, o.partitions);
    let (durability, in_flight) = (o.durability, o.in_flight);
    let conn = server.conn();
    let mut producers = Vec::new();
    for _ in 0..n_producers {
        producers.push(
            ProducerClient::connect_with_options(&conn, Some("bench"), server.options())
                .await
                .expect("producer"),
        );
    }
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let syncs_before = server.broker.sync_times();
    let mut tasks = Vec::new();
    for (p, producer) in producers.iter().enumerate() {
        for (partition, _) in (0..n_partitions).flat_map(|n| (0..in_flight).map(move |i| (n, i))) {
            let producer = producer.clone();
            let (acked, stop) = (acked.clone(), stop.clone());
            let events = batch(p);
            tasks.push(tokio::spawn(async move {
                let target = SendTarget::Partition(partition.to_string());
                while !stop.load(Ordering::Relaxed) {
                    producer.send(&events, target.clone()).await.expect("send");
                    acked.fetch_add(events.len() as u64, Ordering::Relaxed);
                }
            }));
        }
    }
    let (rate, cpu) = timed_window(seconds, &acked, &stop, tasks).await;
    println!(
        "ingest: {} events/s, {:.1} MB/s of event bodies (durability {durability}, {bytes}-byte events, batches of {BATCH_EVENTS}, {n_producers} producers (one connection each) with {in_flight} concurrent sends per partition, {n_partitions} partitions, {seconds} s; {cpu})",
        thousands(rate),
        rate * event_bytes() as f64 / 1e6,
        bytes = event_bytes(),
    );
    println!(
        "{}",
        sync_note(&server.broker.sync_times().since(&syncs_before))
    );
    for producer in &producers {
        producer.close().await;
    }
    acked.load(Ordering::Relaxed)
}

/// One second of warm-up (links attach, segments grow), then `seconds` timed: the rate of
/// `acked` over the timed window and a note of the CPU it took; then `stop` and wait for
/// `tasks`.
async fn timed_window(
    seconds: u64,
    acked: &AtomicU64,
    stop: &AtomicBool,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) -> (f64, String) {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (start_count, started) = (acked.load(Ordering::Relaxed), Instant::now());
    let cpu = cpu_seconds();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (end_count, elapsed) = (acked.load(Ordering::Relaxed), started.elapsed());
    let cpu = cpu_note(cpu, end_count - start_count);
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("sending task");
    }
    (
        (end_count - start_count) as f64 / elapsed.as_secs_f64(),
        cpu,
    )
}

/// Batches in flight per link in the pipelined ingest run.
const PIPELINE_WINDOW: usize = 16;

/// A batch of 100 events as the SDKs send it: format 0x80013700, one data section per encoded
/// event message.
fn raw_batch() -> Message<Batch<Data>> {
    let sections: Vec<Data> = (0..BATCH_EVENTS)
        .map(|i| {
            let mut body = vec![b'x'; event_bytes()];
            body[..8].copy_from_slice(&(i as u64).to_le_bytes());
            let inner = Message::builder().data(Binary::from(body)).build();
            Data(Binary::from(
                serde_amqp::to_vec(&Serializable(inner)).expect("encodes"),
            ))
        })
        .collect();
    Message::builder().body(Batch::from(sections)).build()
}

/// Like [`ingest`], but with a bare engine sender per link keeping [`PIPELINE_WINDOW`] batches
/// in flight, sending one pre-encoded batch again and again: the engine's ceiling.
async fn ingest_pipelined(server: &Server, o: &Options) -> u64 {
    let (seconds, n_producers, n_partitions) = (o.seconds, o.producers, o.partitions);
    let durability = o.durability;
    let url = format!("amqp://127.0.0.1:{}", server.server.local_addr().port());
    let acked = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    let mut connections = Vec::new();
    for p in 0..n_producers {
        let mut connection = Connection::builder()
            .container_id(format!("bench-producer-{p}"))
            .sasl_profile(SaslProfile::Plain {
                username: server.root.name.clone(),
                password: server.root.key.clone(),
            })
            .open(url.as_str())
            .await
            .expect("connection");
        let mut session = Session::begin(&mut connection).await.expect("session");
        for partition in 0..n_partitions {
            let address = format!("pipelined/Partitions/{partition}");
            let sender = Sender::attach(&mut session, format!("p{p}-{partition}"), address)
                .await
                .expect("sender");
            tasks.push(tokio::spawn(pipelined_sender(
                sender,
                acked.clone(),
                stop.clone(),
            )));
        }
        connections.push((connection, session));
    }
    let (rate, cpu) = timed_window(seconds, &acked, &stop, tasks).await;
    println!(
        "ingest, pipelined: {} events/s, {:.1} MB/s of event bodies (durability {durability}, {bytes}-byte events, batches of {BATCH_EVENTS}, {n_producers} producers (one connection each) with {PIPELINE_WINDOW} batches in flight per partition on one link each (a bare engine sender, no client encoding), {n_partitions} partitions, {seconds} s; {cpu})",
        thousands(rate),
        rate * event_bytes() as f64 / 1e6,
        bytes = event_bytes(),
    );
    for (mut connection, mut session) in connections {
        let _ = session.end().await;
        let _ = connection.close().await;
    }
    acked.load(Ordering::Relaxed)
}

async fn pipelined_sender(mut sender: Sender, acked: Arc<AtomicU64>, stop: Arc<AtomicBool>) {
    let batch = raw_batch();
    let sendable = Sendable::builder()
        .message(batch)
        .message_format(BATCH_FORMAT)
        .build();
    let mut window: VecDeque<DeliveryFut<Result<Outcome, SendError>>> =
        VecDeque::with_capacity(PIPELINE_WINDOW);
    while !stop.load(Ordering::Relaxed) {
        if window.len() == PIPELINE_WINDOW {
            let settled = window.pop_front().expect("in flight");
            let outcome = settled.await.expect("settled");
            assert!(matches!(outcome, Outcome::Accepted(_)), "{outcome:?}");
            acked.fetch_add(BATCH_EVENTS as u64, Ordering::Relaxed);
        }
        window.push_back(sender.send_batchable_ref(&sendable).await.expect("send"));
    }
    for settled in window {
        settled.await.expect("settled");
        acked.fetch_add(BATCH_EVENTS as u64, Ordering::Relaxed);
    }
    let _ = sender.close().await;
}

/// Receivers on every partition read the whole backlog from the start.
async fn deliver(server: &Server, o: &Options, total: u64) {
    let (n_partitions, n_consumers, prefetch) = (o.partitions, o.consumer_connections, o.prefetch);
    let (durability, n_groups) = (o.durability, o.groups.max(1));
    let conn = server.conn();
    let mut groups = vec!["$Default".to_owned()];
    for g in 1..n_groups {
        let name = format!("g{g}");
        server
            .broker
            .create_consumer_group("bench", &name)
            .await
            .expect("consumer group");
        groups.push(name);
    }
    let mut consumers = Vec::new();
    for _ in 0..n_consumers * n_groups {
        consumers.push(
            ConsumerClient::connect_with_options(&conn, Some("bench"), server.options())
                .await
                .expect("consumer"),
        );
    }
    let (started, cpu) = (Instant::now(), cpu_seconds());
    let mut tasks = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        for partition in 0..n_partitions {
            let consumer = consumers[g * n_consumers + partition as usize % n_consumers].clone();
            let expected = server
                .broker
                .partition_properties("bench", &partition.to_string())
                .expect("partition")
                .last_enqueued_sequence_number
                + 1;
            tasks.push(tokio::spawn(read_partition(
                consumer,
                group.clone(),
                partition,
                prefetch,
                expected,
            )));
        }
    }
    let mut received = 0;
    for task in tasks {
        received += task.await.expect("receiver task");
    }
    let elapsed = started.elapsed();
    let cpu = cpu_note(cpu, received);
    assert_eq!(received, total * n_groups as u64);
    println!(
        "deliver: {} events/s ({received} events of {bytes} bytes read from the start of {n_partitions} partitions by {n_groups} consumer group(s), each {n_partitions} receivers on {n_consumers} connections, prefetch {prefetch}, {:.1} s; durability {durability}; {cpu})",
        thousands(received as f64 / elapsed.as_secs_f64()),
        elapsed.as_secs_f64(),
        bytes = event_bytes(),
    );
    for consumer in &consumers {
        consumer.close().await;
    }
}

/// One receiver of `group` reading `partition` from the start until it has `expected` events.
async fn read_partition(
    consumer: ConsumerClient,
    group: String,
    partition: u32,
    prefetch: u32,
    expected: i64,
) -> u64 {
    let mut receiver = consumer
        .open_receiver(
            &partition.to_string(),
            &group,
            EventPosition::Earliest,
            None,
            prefetch,
        )
        .await
        .expect("receiver");
    let mut got = 0i64;
    while got < expected {
        let events = receiver
            .receive(prefetch as usize, Duration::from_secs(10))
            .await
            .expect("receive");
        assert!(!events.is_empty(), "partition {partition} stalled");
        got += events.len() as i64;
    }
    receiver.close().await;
    got as u64
}

/// CPU time this process used so far (user + system), from `/proc/self/stat` (USER_HZ 100).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line; 12 and 13 after the name.
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// The 1-minute load average: other work on the machine competes with the run.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// CPU used since `since` by this process, per event.
fn cpu_note(since: f64, events: u64) -> String {
    let used = cpu_seconds() - since;
    format!(
        "process CPU {used:.2} s = {:.2} us per event, client and server together; load average {}",
        used * 1e6 / events.max(1) as f64,
        load_average()
    )
}

/// The log's `fdatasync` calls during a run, and the appends' waits for them, as the broker's
/// group committer timed them: the disk's share of every acknowledgement.
fn sync_note(times: &SyncTimes) -> String {
    format!("disk: {times} (the log's own timing; quantiles are bucket bounds)")
}

fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Latency at a fixed offered rate: producers send a batch every `interval` (spread over the
/// partitions), stamping the scheduled send time into each body; receivers tail every partition.
async fn latency(server: &Server, o: &Options) {
    let (seconds, n_producers, n_partitions) = (o.seconds, o.producers, o.partitions);
    let conn = server.conn();
    let base = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let receivers = spawn_latency_receivers(o, (&conn, server.options()), base, stop.clone()).await;
    let syncs_before = server.broker.sync_times();
    let mut producers = Vec::new();
    for _ in 0..n_producers {
        producers.push(
            ProducerClient::connect_with_options(&conn, Some("bench"), server.options())
                .await
                .expect("producer"),
        );
    }
    let batches_per_s = (o.latency_rate / BATCH_EVENTS as u64 / n_producers as u64).max(1);
    let interval = Duration::from_nanos(1_000_000_000 / batches_per_s);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds + 1);
    let sent = Arc::new(AtomicU64::new(0));
    // Acknowledgement times from the send call, and from the time the send was scheduled for.
    let acks = Arc::new(std::sync::Mutex::new((Vec::new(), Vec::new())));
    let mut pacers = Vec::new();
    for (p, producer) in producers.iter().enumerate() {
        let (producer, sent, acks) = (producer.clone(), sent.clone(), acks.clone());
        // Producers are independent: each paces from its own phase instead of all four sending
        // at the same instants.
        let phase = interval.mul_f64(p as f64 / n_producers as f64);
        pacers.push(tokio::spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + phase, interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut n = p;
            let mut in_flight = tokio::task::JoinSet::new();
            while tokio::time::Instant::now() < deadline {
                let scheduled = ticks.tick().await;
                let scheduled = scheduled.into_std().duration_since(base).as_nanos() as u64;
                let target = SendTarget::Partition((n % n_partitions as usize).to_string());
                n += n_producers;
                let (producer, acks) = (producer.clone(), acks.clone());
                in_flight.spawn(async move {
                    let called = base.elapsed().as_nanos() as u64;
                    let events = stamped_batch(called, scheduled);
                    producer.send(&events, target).await.expect("send");
                    let acked = base.elapsed().as_nanos() as u64;
                    let mut acks = acks.lock().expect("acks");
                    acks.0.push(acked.saturating_sub(called));
                    acks.1.push(acked.saturating_sub(scheduled));
                });
                sent.fetch_add(BATCH_EVENTS as u64, Ordering::Relaxed);
                while in_flight.try_join_next().is_some() {}
            }
            while in_flight.join_next().await.is_some() {}
        }));
    }
    for pacer in pacers {
        pacer.await.expect("pacer");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut samples = Vec::new();
    for receiver in receivers {
        samples.extend(receiver.await.expect("receiver task"));
    }
    let acks = std::mem::take(&mut *acks.lock().expect("acks"));
    report_latency(o, samples, acks, sent.load(Ordering::Relaxed));
    println!(
        "{}",
        sync_note(&server.broker.sync_times().since(&syncs_before))
    );
    for producer in &producers {
        producer.close().await;
    }
}

/// A batch whose bodies carry the time the send was called and the time it was scheduled for
/// (nanoseconds since the bench's base), for the receivers to measure from.
fn stamped_batch(called_ns: u64, scheduled_ns: u64) -> Vec<EventData> {
    (0..BATCH_EVENTS)
        .map(|_| {
            let mut body = vec![b'x'; event_bytes()];
            body[..8].copy_from_slice(&called_ns.to_le_bytes());
            body[8..16].copy_from_slice(&scheduled_ns.to_le_bytes());
            EventData::new(body)
        })
        .collect()
}

/// One tailing receiver per partition; each returns its latency samples (ns; from the send call
/// and from the scheduled time) once `stop` is set.
async fn spawn_latency_receivers(
    o: &Options,
    (conn, options): (&str, ClientOptions),
    base: Instant,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<(u64, u64)>>> {
    let (n_partitions, n_consumers, prefetch) = (o.partitions, o.consumer_connections, o.prefetch);
    let mut consumers = Vec::new();
    for _ in 0..n_consumers {
        consumers.push(
            ConsumerClient::connect_with_options(conn, Some("bench"), options.clone())
                .await
                .expect("consumer"),
        );
    }
    let mut tasks = Vec::new();
    for partition in 0..n_partitions {
        let consumer = consumers[partition as usize % n_consumers].clone();
        let mut receiver = consumer
            .open_receiver(
                &partition.to_string(),
                "$Default",
                EventPosition::Latest,
                None,
                prefetch,
            )
            .await
            .expect("receiver");
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let events = receiver
                    .receive(prefetch as usize, Duration::from_millis(100))
                    .await
                    .expect("receive");
                let now = base.elapsed().as_nanos() as u64;
                for event in events {
                    let stamp = |at: usize| {
                        u64::from_le_bytes(event.data.body[at..at + 8].try_into().expect("8"))
                    };
                    samples.push((now.saturating_sub(stamp(0)), now.saturating_sub(stamp(8))));
                }
            }
            receiver.close().await;
            drop(consumer);
            samples
        }));
    }
    tasks
}

/// Quantile `q` of sorted nanosecond samples, in milliseconds.
fn quantile_ms(sorted: &[u64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(i).copied().unwrap_or(0) as f64 / 1e6
}

/// Prints the acknowledgement and end-to-end latencies, each measured from the send call (the
/// figure the target is about: what an application that calls `send` sees) and from the time
/// the pacer scheduled the send for (adding the pacing timer's lateness: tokio's timer fires on
/// millisecond ticks, later when the shared cores are busy).
fn report_latency(o: &Options, samples: Vec<(u64, u64)>, acks: (Vec<u64>, Vec<u64>), sent: u64) {
    let (seconds, n_producers, n_partitions) = (o.seconds, o.producers, o.partitions);
    let (n_consumers, prefetch, durability) = (o.consumer_connections, o.prefetch, o.durability);
    let sorted = |mut v: Vec<u64>| {
        v.sort_unstable();
        v
    };
    let (from_call, from_schedule): (Vec<u64>, Vec<u64>) = samples.into_iter().unzip();
    let (from_call, from_schedule) = (sorted(from_call), sorted(from_schedule));
    let (acks, acks_scheduled) = (sorted(acks.0), sorted(acks.1));
    println!(
        "acknowledgement: p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms, send call to its return ({} sends of {BATCH_EVENTS} events); from the scheduled time p50 {:.2} ms, p99 {:.2} ms",
        quantile_ms(&acks, 0.50),
        quantile_ms(&acks, 0.99),
        quantile_ms(&acks, 0.999),
        acks.len(),
        quantile_ms(&acks_scheduled, 0.50),
        quantile_ms(&acks_scheduled, 0.99),
    );
    println!(
        "latency: p50 {:.2} ms, p99 {:.2} ms, p999 {:.2} ms, max {:.2} ms, send call to receive; from the scheduled time p50 {:.2} ms, p99 {:.2} ms; at {} events/s offered ({} events sent, {} received; durability {durability}, {bytes}-byte events, batches of {BATCH_EVENTS}, {n_producers} producers, {n_partitions} partitions, {n_partitions} tailing receivers on {n_consumers} connections, prefetch {prefetch}, {seconds} s + 1 s)",
        quantile_ms(&from_call, 0.50),
        quantile_ms(&from_call, 0.99),
        quantile_ms(&from_call, 0.999),
        quantile_ms(&from_call, 1.0),
        quantile_ms(&from_schedule, 0.50),
        quantile_ms(&from_schedule, 0.99),
        thousands(o.latency_rate as f64),
        sent,
        from_call.len(),
        bytes = event_bytes(),
    );
}

/// `VmRSS` and `VmHWM` of a process, in KiB.
fn memory_kib(pid: &str) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// 1,000 connections, each with a receiver open, from a child process; this (server) process's
/// resident memory before and with them.
async fn connections(server: &Server, connections: usize) {
    assert!(
        connections <= FANOUT_PARTITIONS as usize * FANOUT_GROUPS * 5,
        "at most five receivers per partition and consumer group"
    );
    server
        .broker
        .create_hub(HubSpec::new("fanout", FANOUT_PARTITIONS))
        .await
        .expect("hub");
    for g in 1..FANOUT_GROUPS {
        server
            .broker
            .create_consumer_group("fanout", &format!("group-{g}"))
            .await
            .expect("group");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (base_rss, base_hwm) = memory_kib("self");
    let mut child = tokio::process::Command::new(std::env::current_exe().expect("own path"))
        .arg("--connections-child")
        .arg(server.conn())
        .arg(connections.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("connections child");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let started = Instant::now();
    let ready = lines.next_line().await.expect("child output");
    assert_eq!(ready.as_deref(), Some("ready"), "connections child failed");
    let opened = started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let receivers = server.broker.open_receiver_count("fanout").expect("count");
    let (rss, hwm) = memory_kib("self");
    let child_pid = child.id().expect("child pid").to_string();
    let (child_rss, _) = memory_kib(&child_pid);
    let mut stdin = child.stdin.take().expect("stdin");
    let _ = stdin.write_all(b"stop\n").await;
    drop(stdin);
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    let delta = rss.saturating_sub(base_rss);
    println!(
        "connections: {connections} AMQP connections each holding a receiver open ({receivers} receivers on the server, opened in {:.1} s): server process VmRSS {:.1} MiB -> {:.1} MiB (+{:.1} MiB, {:.1} KiB per connection), VmHWM {:.1} MiB (baseline VmHWM {:.1} MiB); the clients ran in a child process (VmRSS {:.1} MiB); {FANOUT_PARTITIONS} partitions x {FANOUT_GROUPS} consumer groups",
        opened.as_secs_f64(),
        base_rss as f64 / 1024.0,
        rss as f64 / 1024.0,
        delta as f64 / 1024.0,
        delta as f64 / connections as f64,
        hwm as f64 / 1024.0,
        base_hwm as f64 / 1024.0,
        child_rss as f64 / 1024.0,
    );
}

/// The child of the connections run: opens `count` consumer connections, each with one
/// receiver, prints `ready`, and holds them until its stdin closes.
fn connections_child(args: &[String]) {
    let conn = args[0].clone();
    let count: usize = args[1].parse().expect("count");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let mut held = VecDeque::new();
        let mut opening = tokio::task::JoinSet::new();
        for i in 0..count {
            let conn = conn.clone();
            opening.spawn(async move {
                let group = match i % FANOUT_GROUPS {
                    0 => "$Default".to_owned(),
                    g => format!("group-{g}"),
                };
                let partition = ((i / FANOUT_GROUPS) % FANOUT_PARTITIONS as usize).to_string();
                let consumer = ConsumerClient::connect(&conn, "fanout")
                    .await
                    .expect("connect");
                let receiver = consumer
                    .open_receiver(&partition, &group, EventPosition::Latest, None, 300)
                    .await
                    .expect("receiver");
                (consumer, receiver)
            });
            // At most 50 handshakes at once, as a fleet of clients starting would.
            while opening.len() >= 50 {
                held.push_back(opening.join_next().await.expect("task").expect("open"));
            }
        }
        while let Some(opened) = opening.join_next().await {
            held.push_back(opened.expect("open"));
        }
        println!("ready");
        let _ = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
        })
        .await;
        drop(held);
    });
}
