//! The flags of `tributary bench`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use tributary_log::Durability;

use super::{parse_bytes, parse_durability};

/// What `tributary bench` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Append throughput and acknowledgement latency, then read it all back.
    Append,
    /// Reopen a large partition.
    Recover,
    /// Resident memory after appending a lot.
    Memory,
    /// The event processor host: start-up, failover, steady state, throughput.
    Processor,
    /// Replication tasks between two hubs over AMQP: raw ingest, copy throughput, lag.
    Replicate,
    /// Silent unauthenticated AMQP connections: their memory, and an authenticated client's
    /// send latency while they are held (not part of `all`: it needs many file descriptors).
    SilentConnections,
    /// The Kafka door beside the Tansu broker, loaded by librdkafka clients: produce, consume,
    /// latency at a fixed rate, idle connections, a replication task copying a topic into a hub
    /// and processor failover over a topic, and the AMQP door's ingest as a yardstick (not part
    /// of `all`: it needs the `kafka-bench` feature and `scripts/setup-tansu`).
    Kafka,
    /// Performance as curves: sweeps of partitions, hubs, connections, consumer groups and data
    /// on disk against a server in a child process, written as CSV files and one HTML report
    /// (not part of `all`: it runs for minutes and needs many file descriptors).
    Scale,
    /// Event Hubs Capture beside ingest, in process: its CPU per captured event against the
    /// hub's per ingested event, and its lag at half the ingest maximum (not part of `all`).
    Capture,
    /// All of the above but `silent-connections`, `kafka`, `scale` and `capture`.
    All,
}

/// One sweep of the scale scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum)]
pub enum Sweep {
    /// Partitions of one hub, 4 to 1,024: ingest rate, acknowledgement p99, server memory.
    Partitions,
    /// Hubs of 16 partitions, 1 to 100: the same.
    Hubs,
    /// Producer connections, 1 to 1,000: ingest rate and server memory per connection.
    Connections,
    /// Idle connections holding a receiver, up to 10,000, beside one active producer.
    Idle,
    /// Consumer groups reading one hub, 1 to 20: delivered events/s and end-to-end p99.
    Groups,
    /// Data on disk, 1 GiB up to `--data-max`: time to open and serve, memory, deep reads,
    /// and retention deleting segments while ingest runs.
    Data,
}

/// `tributary bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Scenario::Append)]
    pub scenario: Scenario,
    /// Event body sizes to run, comma-separated (e.g. 100,1KiB); the replicate scenario runs
    /// the first.
    #[arg(long, value_delimiter = ',', default_value = "100,1KiB", value_parser = parse_bytes)]
    pub event_bytes: Vec<u64>,
    /// Events per appended batch.
    #[arg(long, default_value_t = 100)]
    pub batch_events: usize,
    /// Partitions appended to.
    #[arg(long, default_value_t = 4)]
    pub partitions: usize,
    /// Concurrent appenders (threads); appender i appends to partition i mod partitions.
    #[arg(long, default_value_t = 4)]
    pub appenders: usize,
    /// Batches each appender keeps unacknowledged at most (1 = wait for each ack).
    #[arg(long, default_value_t = 32)]
    pub in_flight: usize,
    /// Durability modes to run, comma-separated (fsync, none, interval:<ms>); the replicate
    /// scenario runs the first, on both hubs.
    #[arg(long, value_delimiter = ',', default_value = "fsync,none", value_parser = parse_durability)]
    pub modes: Vec<Durability>,
    #[command(flatten)]
    pub sync_scope: super::shared::SyncScopeArgs,
    /// How long each append run (and the replicate scenario's ingest baseline) lasts, in
    /// seconds.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Size of the partition the recovery scenario reopens, in GiB.
    #[arg(long, default_value_t = 1)]
    pub recovery_gib: u64,
    /// How much the memory scenario appends, in GiB.
    #[arg(long, default_value_t = 5)]
    pub memory_gib: u64,
    /// Touch this many GiB of memory first. On a fresh virtual machine the first touch of a
    /// page is slow (the host backs it lazily); a long-running server's memory is warm.
    #[arg(long, default_value_t = 0)]
    pub warm_memory_gib: u64,
    /// Producers in the replicate scenario, one AMQP connection each.
    #[arg(long, default_value_t = 4)]
    pub producers: usize,
    /// Concurrent sends per producer and partition in the replicate scenario's ingest baseline.
    #[arg(long, default_value_t = 16)]
    pub send_window: usize,
    /// Events the replicate scenario fills the source with and copies.
    #[arg(long, default_value_t = 3_000_000)]
    pub copy_events: u64,
    /// Rounds of ingest baseline, fill and copy the replicate scenario runs before its lag runs,
    /// each copy into event hubs of its own; with more than one it prints each round's copy /
    /// baseline and their median (this machine's rates drift between runs), and `half` is half
    /// the median copy rate.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Rates at which the replicate scenario measures the lag, comma-separated: events/s, or
    /// `half` for half the copy throughput it measured.
    #[arg(long, value_delimiter = ',', default_value = "half,10000", value_parser = parse_lag_rate)]
    pub lag_rates: Vec<LagRate>,
    /// How long each lag run lasts (after a 2 s warm-up), in seconds.
    #[arg(long, default_value_t = 10)]
    pub lag_seconds: u64,
    /// The replication task's `batch_events_max` (default: the task's own default).
    #[arg(long)]
    pub task_batch_events: Option<u32>,
    /// The replication task's `prefetch` (default: the task's own default).
    #[arg(long)]
    pub task_prefetch: Option<u32>,
    /// How the replicate scenario's task reaches the two hubs, comma-separated: `amqp`
    /// (connection strings, as a task deployed beside remote hubs does) and/or `local` (their
    /// data directories: both hubs in the task's process, as at the edge). With both, each
    /// round copies once each way, and the CPU ratios of both come from the one run.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "amqp")]
    pub task_transport: Vec<TaskTransport>,
    /// Silent connections the silent-connections scenario holds.
    #[arg(long, default_value_t = 10_000)]
    pub connections: usize,
    /// The Kafka scenario's servers, in the order they run, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "tributary,tansu"
    )]
    pub kafka_servers: Vec<KafkaServer>,
    /// The Tansu broker the Kafka scenario runs (`scripts/setup-tansu` installs it there).
    #[arg(long, default_value = ".venv/bin/tansu")]
    pub tansu_bin: PathBuf,
    /// How the Kafka scenario's consumers share the partitions.
    #[arg(long, value_enum, default_value_t = KafkaConsume::Group)]
    pub kafka_consume: KafkaConsume,
    /// Records per second, in all, of the Kafka scenario's latency run.
    #[arg(long, default_value_t = 50_000)]
    pub kafka_rate: u64,
    /// Idle connections the Kafka scenario holds to measure what one costs a server.
    #[arg(long, default_value_t = 1_000)]
    pub kafka_idle_connections: usize,
    /// The scale scenario's sweeps, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "partitions,hubs,connections,idle,groups,data"
    )]
    pub sweep: Vec<Sweep>,
    /// The capture scenario's size window: Azure's smallest (10 MiB) by default, so windows
    /// close often; Azure's default is 300 MiB. 10 MiB to 500 MiB.
    #[arg(long, default_value = "10MiB", value_parser = parse_bytes)]
    pub capture_size: u64,
    /// The scale and capture scenarios with tiny steps of a fraction of a second (for tests:
    /// their figures mean nothing).
    #[arg(long)]
    pub quick: bool,
    /// Where the scale scenario writes its CSV files and report.html [default: scale-report
    /// under the data directory].
    #[arg(long)]
    pub report_dir: Option<PathBuf>,
    /// The scale scenario's largest data directory (steps from 1 GiB, doubling, to 50 GiB at
    /// most); lowered to half the free disk when that is less.
    #[arg(long, default_value = "8GiB", value_parser = parse_bytes)]
    pub data_max: u64,
    /// Where to write (default: a directory under the data directory, removed afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub data: super::DataDirArgs,
}

/// A server the Kafka scenario loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KafkaServer {
    /// Tributary's Kafka door, in a child process (a hub with the first `--modes`).
    Tributary,
    /// The Tansu broker (`--tansu-bin`).
    Tansu,
}

// Only the Kafka scenario, built with the `kafka-bench` feature, prints server names.
#[cfg(feature = "kafka-bench")]
impl KafkaServer {
    /// Its name in the scenario's lines.
    pub fn name(self) -> &'static str {
        match self {
            KafkaServer::Tributary => "tributary",
            KafkaServer::Tansu => "tansu",
        }
    }
}

/// How the Kafka scenario's consumers share the partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KafkaConsume {
    /// Each consumer is assigned one partition (no group coordinator involved).
    Assign,
    /// The consumers subscribe as one consumer group and are given partitions by it.
    Group,
}

/// How the replicate scenario's task reaches its hubs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TaskTransport {
    /// Over AMQP, with each hub's connection string.
    Amqp,
    /// In process, by each hub's data directory.
    Local,
}

impl TaskTransport {
    /// Its name on the command line, which also names what the bench makes for it (event
    /// hubs, consumer groups, task files).
    pub fn slug(self) -> &'static str {
        match self {
            TaskTransport::Amqp => "amqp",
            TaskTransport::Local => "local",
        }
    }
}

impl std::fmt::Display for TaskTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TaskTransport::Amqp => "over AMQP (connection strings)",
            TaskTransport::Local => "in process (data directories)",
        })
    }
}

/// A rate the replicate scenario measures the lag at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LagRate {
    /// Half the copy throughput measured in the same run.
    HalfCopy,
    /// This many events per second.
    EventsPerSecond(u64),
}

fn parse_lag_rate(s: &str) -> Result<LagRate, String> {
    if s == "half" {
        return Ok(LagRate::HalfCopy);
    }
    match s.parse::<u64>() {
        Ok(rate) if rate > 0 => Ok(LagRate::EventsPerSecond(rate)),
        _ => Err(format!(
            "{s:?} is not a rate: give events per second (above 0) or \"half\""
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_rates_are_events_per_second_or_half_the_copy_rate() {
        assert_eq!(parse_lag_rate("half"), Ok(LagRate::HalfCopy));
        assert_eq!(
            parse_lag_rate("10000"),
            Ok(LagRate::EventsPerSecond(10_000))
        );
        for wrong in ["0", "-5", "fast", ""] {
            assert!(parse_lag_rate(wrong).is_err(), "{wrong:?} was taken");
        }
    }
}
