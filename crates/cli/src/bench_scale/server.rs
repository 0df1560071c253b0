//! The scale scenario's server: a hub and its AMQP door in a child process (this binary again,
//! with [`SERVER_ENV`] naming its data directory), so that its resident set and CPU time are
//! its own. The parent drives it by lines on its standard input — `hub NAME PARTITIONS
//! [RETENTION_BYTES]`, `group HUB NAME`, `syncs` (the log's `fdatasync` calls so far) — each
//! answered by `ok` (`ok N` to `syncs`) or `error …`; the child ends, shutting the hub down
//! cleanly, when its standard input closes.
//!
//! The door's caps and deadlines are raised above what the sweeps open, and the child's
//! open-file limit to [`FD_WANTED`] (one descriptor per connection plus the logs' files).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tributary_amqp::limits::ConnectionLimits;
use tributary_amqp::{AccessPolicies, AccessPolicy, AmqpConfig, Right};
use tributary_broker::{Broker, BrokerConfig, HubSpec};

use crate::args::BenchArgs;

/// Set in the server child: its data directory.
pub const SERVER_ENV: &str = "TRIBUTARY_BENCH_SCALE_SERVER";
/// Set in the server child when its segments are smaller than the default (the retention run).
const SEGMENT_ENV: &str = "TRIBUTARY_BENCH_SCALE_SEGMENT_BYTES";

/// Open files each process asks for: 10,000 connections, their receivers' files, headroom.
pub const FD_WANTED: u64 = 16_384;
/// Connections the door admits in all and per address during the sweeps.
const CONNECTIONS_MAX: usize = 12_000;

/// The child's side: serves until its standard input ends.
pub async fn serve_child(args: &BenchArgs, dir: &Path) -> Result<()> {
    crate::bench_silent::raise_fd_limit(FD_WANTED)?;
    let mut config = BrokerConfig::new(dir);
    config.log.durability = *args.modes.first().context("give a durability mode")?;
    config.sync_scope = args.sync_scope.sync_scope;
    config.retention_check_interval = Duration::from_secs(1);
    if let Ok(bytes) = std::env::var(SEGMENT_ENV) {
        config.log.segment_bytes_max = bytes.parse().context("a malformed segment size")?;
    }
    let broker = Broker::open(config).await.context("cannot open the hub")?;
    let root = AccessPolicy::generate("RootManageSharedAccessKey", vec![Right::Manage])?;
    let mut amqp = AmqpConfig::new(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        AccessPolicies::new(vec![root.clone()])?,
    );
    amqp.limits = ConnectionLimits {
        connections_max: CONNECTIONS_MAX,
        connections_per_address_max: CONNECTIONS_MAX,
        handshake_timeout: Duration::from_secs(3_600),
        auth_timeout: Duration::from_secs(3_600),
    };
    let server = tributary_amqp::start(broker.clone(), amqp).await?;
    let port = server.local_addr().port();
    println!(
        "ready {}",
        tributary_amqp::connection_string("127.0.0.1", port, &root)
    );
    let mut commands = BufReader::new(tokio::io::stdin()).lines();
    while let Some(command) = commands.next_line().await? {
        match obey(&broker, &command).await {
            Ok(None) => println!("ok"),
            Ok(Some(answer)) => println!("ok {answer}"),
            Err(e) => println!("error {e:#}"),
        }
    }
    server.shutdown().await;
    broker.shutdown().await?;
    Ok(())
}

/// Carries out one command; what it answers beyond `ok`, if anything.
async fn obey(broker: &Broker, command: &str) -> Result<Option<String>> {
    let words: Vec<&str> = command.split_whitespace().collect();
    match words.as_slice() {
        ["hub", name, partitions, rest @ ..] => {
            let mut spec = HubSpec::new(*name, partitions.parse()?);
            spec.retention_age_ms = None;
            spec.retention_bytes_max = rest.first().map(|b| b.parse()).transpose()?;
            broker.create_hub(spec).await?;
        }
        ["group", hub, name] => {
            broker.create_consumer_group(hub, name).await?;
        }
        ["syncs"] => return Ok(Some(broker.sync_times().syncs.count.to_string())),
        _ => anyhow::bail!("unknown command {command:?}"),
    }
    Ok(None)
}

/// The parent's handle on a server child.
pub struct ServerProcess {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    pid: String,
    /// A connection string with every right.
    pub conn: String,
    /// From spawning the child until its door accepted connections.
    pub started_in: Duration,
}

/// Options of a server child beyond its data directory.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerOptions {
    /// Segments of this size instead of the log's default.
    pub segment_bytes: Option<u64>,
}

impl ServerProcess {
    /// Starts a server on `dir` (created if missing) and waits until it serves.
    pub async fn start(plan: &super::Plan, dir: &Path, options: ServerOptions) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&plan.server_log)
            .with_context(|| format!("cannot open {}", plan.server_log.display()))?;
        let exe = std::env::current_exe().context("cannot find this program")?;
        let mut command = tokio::process::Command::new(exe);
        command
            .args(["bench", "--scenario", "scale", "--modes"])
            .arg(plan.durability.to_string())
            .arg("--sync-scope")
            .arg(plan.sync_scope.to_string())
            .env(SERVER_ENV, dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(log)
            .kill_on_drop(true);
        if let Some(bytes) = options.segment_bytes {
            command.env(SEGMENT_ENV, bytes.to_string());
        }
        let started = Instant::now();
        let mut child = command.spawn().context("cannot start the server")?;
        let pid = child.id().context("the server ended at once")?.to_string();
        let stdin = child.stdin.take().context("the server's stdin")?;
        let stdout = child.stdout.take().context("the server's stdout")?;
        let mut server = ServerProcess {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            pid,
            conn: String::new(),
            started_in: Duration::ZERO,
        };
        let ready = server.answer().await?;
        server.conn = ready
            .strip_prefix("ready ")
            .with_context(|| format!("the server said {ready:?}"))?
            .to_owned();
        server.started_in = started.elapsed();
        Ok(server)
    }

    /// Sends one command and waits for its `ok`.
    pub async fn command(&mut self, command: &str) -> Result<()> {
        let answer = self.ask(command).await?;
        anyhow::ensure!(
            answer.is_empty(),
            "the server answered {command:?} with \"ok {answer}\""
        );
        Ok(())
    }

    /// The `fdatasync` calls the server's log has made so far.
    pub async fn syncs(&mut self) -> Result<u64> {
        let answer = self.ask("syncs").await?;
        answer
            .parse()
            .with_context(|| format!("the server answered syncs with \"ok {answer}\""))
    }

    /// Sends one command and waits for its `ok`; what follows `ok `, if anything.
    async fn ask(&mut self, command: &str) -> Result<String> {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await?;
        let answer = self.answer().await?;
        match answer.strip_prefix("ok") {
            Some(rest) if rest.is_empty() || rest.starts_with(' ') => Ok(rest.trim().to_owned()),
            _ => anyhow::bail!("the server answered {command:?} with {answer:?}"),
        }
    }

    async fn answer(&mut self) -> Result<String> {
        if let Some(line) = self.lines.next_line().await? {
            return Ok(line);
        }
        let status = self.child.wait().await?;
        anyhow::bail!("the server ended ({status}); its standard error is in server-stderr.log")
    }

    /// The server's resident set, in KiB.
    pub fn rss_kib(&self) -> u64 {
        crate::bench::resident_kib_of(&self.pid).0
    }

    /// The server's CPU time so far (user + system), in seconds.
    pub fn cpu_seconds(&self) -> f64 {
        crate::bench::cpu_ticks(&self.pid) as f64 / 100.0
    }

    /// Closes its standard input and waits for it to shut down.
    pub async fn stop(mut self) -> Result<()> {
        drop(self.stdin);
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .context("the server did not shut down within 60 s")??;
        anyhow::ensure!(status.success(), "the server ended with {status}");
        Ok(())
    }
}
