//! `tributary bench --scenario silent-connections`: what a crowd of silent, unauthenticated
//! connections costs the AMQP door, and whether it delays an authenticated client.
//!
//! One process runs a hub (one partition, the first `--modes` durability) and its AMQP door on
//! 127.0.0.1, and an authenticated producer (the Rust client) sending one event at a time for
//! `--seconds`: first with nothing else connected (the baseline), then while `--connections`
//! silent connections are held, twice — bare TCP sockets that never send a byte, then
//! connections that finish an ANONYMOUS SASL exchange and `open` and then never put a token. It
//! reports the server process's resident-set growth per phase and the p50/p99 send latency in
//! each phase, against the targets: ≤ 100 MiB for the crowd, ≤ 10 ms p99 added latency. The
//! crowd is held by a child process (this binary again, told so by [`CROWD_ENV`]), so the
//! growth measured is the server's alone and each process needs one descriptor per connection.
//!
//! To hold them at all, the door is configured with caps above `--connections` and deadlines
//! longer than the run (the defaults would refuse connections beyond 1,000 per address and cut
//! every one off within 30 s — which is the point of them, measured by the tests). Each
//! process's open-file limit is raised (soft to hard, and hard too when permitted) to one
//! descriptor per connection plus headroom; if it cannot be, the scenario says so and stops.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tributary_amqp::limits::ConnectionLimits;
use tributary_amqp::{AccessPolicies, AccessPolicy, AmqpConfig, Right};
use tributary_broker::{Broker, BrokerConfig, HubSpec};
use tributary_client::ProducerClient;
use tributary_event::{EventData, SendTarget};

use crate::args::BenchArgs;

const HUB: &str = "silent";

/// Connections opened at once while filling the crowd.
const CONNECT_WAVE: usize = 256;

/// Set in the child that holds the crowd: `<server address> <anonymous: true|false>`.
const CROWD_ENV: &str = "TRIBUTARY_BENCH_SILENT_CROWD";

/// Descriptors kept free beyond one per connection (the log, the client, the runtime).
const FD_HEADROOM: u64 = 1_024;

/// The targets of issue 18: what the crowd may cost, and what it may add to a send's p99.
const RSS_TARGET_MIB: f64 = 100.0;
const P99_ADDED_TARGET_MS: f64 = 10.0;

/// Runs the scenario under `root` (a fresh directory).
pub async fn run(args: &BenchArgs, root: &std::path::Path) -> Result<()> {
    let connections = args.connections;
    raise_fd_limit(connections as u64 + FD_HEADROOM)?;
    if let Ok(spec) = std::env::var(CROWD_ENV) {
        return hold_crowd(&spec, connections).await;
    }
    let durability = *args.modes.first().context("give a durability mode")?;
    let mut config = BrokerConfig::new(root);
    config.log.durability = durability;
    let broker = Broker::open(config).await.context("cannot open the hub")?;
    broker
        .create_hub(HubSpec::new(HUB, 1))
        .await
        .context("cannot create the hub")?;
    let root_policy = AccessPolicy::generate("RootManageSharedAccessKey", vec![Right::Manage])?;
    let policies = AccessPolicies::new(vec![root_policy.clone()])?;
    let mut amqp = AmqpConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), policies);
    amqp.limits = ConnectionLimits {
        connections_max: connections + 16,
        connections_per_address_max: connections + 16,
        handshake_timeout: Duration::from_secs(3_600),
        auth_timeout: Duration::from_secs(3_600),
    };
    let server = tributary_amqp::start(broker.clone(), amqp).await?;
    let addr = server.local_addr();
    let conn = tributary_amqp::connection_string("127.0.0.1", addr.port(), &root_policy);
    let producer = ProducerClient::connect(&conn, HUB)
        .await
        .context("the authenticated client cannot connect")?;
    println!(
        "# silent connections: {connections} against the AMQP door in process, durability {durability}, one producer sending 1 event (100 B) at a time for {} s per phase",
        args.seconds
    );
    let seconds = Duration::from_secs(args.seconds);
    let baseline = send_for(&producer, seconds).await?;
    report("baseline (no other connection)", &baseline, None);
    for anonymous in [false, true] {
        phase(&producer, addr, connections, anonymous, seconds, &baseline).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    producer.close().await;
    server.shutdown().await;
    broker.shutdown().await?;
    Ok(())
}

/// Holds `connections` silent connections while the producer sends; reports both.
async fn phase(
    producer: &ProducerClient,
    addr: SocketAddr,
    connections: usize,
    anonymous: bool,
    seconds: Duration,
    baseline: &Histogram<u64>,
) -> Result<()> {
    let kind = if anonymous {
        "anonymous SASL + open, no token"
    } else {
        "bare TCP, no byte sent"
    };
    let before = crate::bench::resident_kib().0;
    let started = Instant::now();
    let mut crowd = Crowd::start(addr, connections, anonymous).await?;
    let opened_in = started.elapsed();
    // Let the server take every connection in before measuring.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let held = crate::bench::resident_kib().0;
    let latency = send_for(producer, seconds).await?;
    let open = crowd.still_open().await?;
    let growth_mib = held.saturating_sub(before) as f64 / 1024.0;
    println!(
        "silent connections ({kind}): {connections} opened in {:.1} s, {open} still open after the run; server RSS +{growth_mib:.1} MiB ({:.2} KiB per connection; target <= {RSS_TARGET_MIB} MiB: {})",
        opened_in.as_secs_f64(),
        held.saturating_sub(before) as f64 / connections as f64,
        verdict(growth_mib <= RSS_TARGET_MIB),
    );
    report(&format!("while held ({kind})"), &latency, Some(baseline));
    Ok(())
}

/// The child process holding a crowd; dropping it closes its stdin, which ends it.
struct Crowd {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    stdin: tokio::process::ChildStdin,
}

impl Crowd {
    /// Starts the child and waits until it holds all `n` connections.
    async fn start(addr: SocketAddr, n: usize, anonymous: bool) -> Result<Crowd> {
        let exe = std::env::current_exe().context("cannot find this program")?;
        let mut child = tokio::process::Command::new(exe)
            .args(["bench", "--scenario", "silent-connections", "--connections"])
            .arg(n.to_string())
            .env(CROWD_ENV, format!("{addr} {anonymous}"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start the process holding the connections")?;
        let stdin = child.stdin.take().context("the child's stdin")?;
        let stdout = child.stdout.take().context("the child's stdout")?;
        let mut crowd = Crowd {
            child,
            lines: BufReader::new(stdout).lines(),
            stdin,
        };
        let ready = crowd.answer().await?;
        anyhow::ensure!(ready == "ready", "the crowd did not open: {ready}");
        Ok(crowd)
    }

    /// How many of the crowd's connections the server still holds open.
    async fn still_open(&mut self) -> Result<usize> {
        self.stdin.write_all(b"count\n").await?;
        let count = self.answer().await?;
        count
            .parse()
            .with_context(|| format!("the crowd answered {count:?}"))
    }

    async fn answer(&mut self) -> Result<String> {
        let line = self.lines.next_line().await?;
        if let Some(line) = line {
            return Ok(line);
        }
        let status = self.child.wait().await?;
        anyhow::bail!("the process holding the connections ended ({status})")
    }
}

/// The child's side: opens the crowd, says `ready`, answers `count` with how many are still
/// open, and ends (closing them all) when its stdin ends.
async fn hold_crowd(spec: &str, connections: usize) -> Result<()> {
    let (addr, anonymous) = spec.split_once(' ').context("a malformed crowd spec")?;
    let addr: SocketAddr = addr.parse().context("a malformed crowd address")?;
    let crowd = open_crowd(addr, connections, anonymous == "true").await?;
    println!("ready");
    let mut commands = BufReader::new(tokio::io::stdin()).lines();
    while let Some(command) = commands.next_line().await? {
        if command == "count" {
            println!("{}", crowd.iter().filter(|s| still_open(s)).count());
        }
    }
    Ok(())
}

/// Opens `n` connections, `CONNECT_WAVE` at a time; each sends nothing (`anonymous`: the SASL
/// ANONYMOUS exchange, the AMQP header and `open`, written at once without waiting).
async fn open_crowd(addr: SocketAddr, n: usize, anonymous: bool) -> Result<Vec<TcpStream>> {
    let mut crowd = Vec::with_capacity(n);
    while crowd.len() < n {
        let wave = CONNECT_WAVE.min(n - crowd.len());
        let mut opening = tokio::task::JoinSet::new();
        for _ in 0..wave {
            opening.spawn(async move {
                let mut socket = TcpStream::connect(addr).await?;
                if anonymous {
                    socket.write_all(&anonymous_open()).await?;
                }
                std::io::Result::Ok(socket)
            });
        }
        while let Some(opened) = opening.join_next().await {
            let socket = opened
                .context("a connecting task failed")?
                .with_context(|| format!("connection {} failed", crowd.len() + 1))?;
            crowd.push(socket);
        }
    }
    Ok(crowd)
}

/// The bytes an SDK sends to open a connection with SASL ANONYMOUS: the SASL header, a
/// `sasl-init`, the AMQP header and an `open` (container id "silent").
fn anonymous_open() -> Vec<u8> {
    let mut out = b"AMQP\x03\x01\x00\x00".to_vec();
    // sasl-init (0x41): [mechanism: symbol "ANONYMOUS"], in a SASL frame (type 1).
    let init = [&[0x00, 0x53, 0x41, 0xc0, 12, 1, 0xa3, 9][..], b"ANONYMOUS"].concat();
    frame(&mut out, 1, &init);
    out.extend_from_slice(b"AMQP\x00\x01\x00\x00");
    // open (0x10): [container-id: string "silent"], in an AMQP frame (type 0).
    let open = [&[0x00, 0x53, 0x10, 0xc0, 9, 1, 0xa1, 6][..], b"silent"].concat();
    frame(&mut out, 0, &open);
    out
}

fn frame(out: &mut Vec<u8>, frame_type: u8, body: &[u8]) {
    let size = u32::try_from(8 + body.len()).expect("a small frame");
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&[2, frame_type, 0, 0]);
    out.extend_from_slice(body);
}

/// Whether the server still holds `socket` open (what it sent is read and dropped).
fn still_open(socket: &TcpStream) -> bool {
    let mut sink = [0u8; 1024];
    loop {
        match socket.try_read(&mut sink) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e) => return e.kind() == std::io::ErrorKind::WouldBlock,
        }
    }
}

/// Sends one event at a time for `duration`; the latency of each send, in microseconds.
async fn send_for(producer: &ProducerClient, duration: Duration) -> Result<Histogram<u64>> {
    let mut latency = Histogram::<u64>::new(3).context("a histogram")?;
    let events = [EventData::new(vec![b'x'; 100])];
    let target = SendTarget::Partition("0".into());
    let started = Instant::now();
    while started.elapsed() < duration {
        let sent = Instant::now();
        producer
            .send(&events, target.clone())
            .await
            .context("the authenticated client's send failed")?;
        let us = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
        latency.record(us.max(1)).context("recording a latency")?;
    }
    Ok(latency)
}

fn report(what: &str, latency: &Histogram<u64>, baseline: Option<&Histogram<u64>>) {
    let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let added = baseline.map_or(String::new(), |b| {
        let added = ms(latency, 0.99) - ms(b, 0.99);
        format!(
            "; p99 added {added:+.2} ms (target <= {P99_ADDED_TARGET_MS} ms: {})",
            verdict(added <= P99_ADDED_TARGET_MS)
        )
    });
    println!(
        "authenticated sends {what}: {} sends, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms{added}",
        latency.len(),
        ms(latency, 0.50),
        ms(latency, 0.99),
        latency.max() as f64 / 1000.0,
    );
}

pub(crate) fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "MISSED" }
}

/// Raises the open-file limit to at least `wanted` descriptors, or explains why it cannot.
pub(crate) fn raise_fd_limit(wanted: u64) -> Result<()> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let current = getrlimit(Resource::Nofile);
    if current.current.is_none_or(|soft| soft >= wanted) {
        return Ok(());
    }
    let hard = current.maximum.map_or(wanted, |hard| hard.max(wanted));
    // Raising the hard limit needs CAP_SYS_RESOURCE; without it, go as far as the hard limit.
    let raised = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(wanted),
            maximum: Some(hard),
        },
    )
    .or_else(|_| {
        let maximum = current.maximum;
        let soft = maximum.map_or(wanted, |m| m.min(wanted));
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(soft),
                maximum,
            },
        )
    });
    raised.context("cannot raise the open-file limit")?;
    let now = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    anyhow::ensure!(
        now >= wanted,
        "the open-file limit is {now}, and {wanted} descriptors are needed (two per connection): \
         run `ulimit -n {wanted}` as a user allowed to, or pass a smaller --connections"
    );
    Ok(())
}
