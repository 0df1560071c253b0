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
    /// All of the above.
    All,
}

/// `tributary bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(long, value_enum, default_value_t = Scenario::Append)]
    pub scenario: Scenario,
    /// Event body sizes to run, comma-separated (e.g. 100,1KiB).
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
    /// Durability modes to run, comma-separated (fsync, none, interval:<ms>).
    #[arg(long, value_delimiter = ',', default_value = "fsync,none", value_parser = parse_durability)]
    pub modes: Vec<Durability>,
    /// How long each append run lasts, in seconds.
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
    /// Where to write (default: a directory under the data directory, removed afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}
