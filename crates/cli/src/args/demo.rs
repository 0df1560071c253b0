//! The flags of `tributary demo` and of its hidden worker, `tributary demo-worker`.

use std::path::PathBuf;

use clap::Args;

use super::{DurabilityArgs, parse_duration_ms};

/// `tributary demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How many homes the simulated sensors are in.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub homes: u32,
    /// Readings each sensor sends per minute (spread evenly over the minute).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=600))]
    pub rate: u32,
    /// Run this long, then check the aggregates against what was sent and stop (e.g. 60s,
    /// 10m). The script's steps come at fixed fractions of it. Without it the steps are timed
    /// as for 8m; when the last one (an instance killed) has played out, the demo checks the
    /// aggregates and keeps running until Ctrl-C.
    #[arg(long, value_parser = parse_duration_ms)]
    pub duration: Option<i64>,
    /// Without `--duration`: time the script's steps as for this length instead of 8m (for
    /// tests, which cannot wait minutes).
    #[arg(long, hide = true, value_parser = parse_duration_ms, conflicts_with = "duration")]
    pub script_length: Option<i64>,
    /// Keep the hub, the checkpoint store, the aggregates and the summary in this directory
    /// (default: a temporary one, removed at the end). Its own, not the one TRIBUTARY_DATA_DIR
    /// names: the demo's hub is not one to keep by accident.
    #[arg(
        id = "data_dir",
        long = "data-dir",
        alias = "data",
        value_name = "DATA_DIR",
        help_heading = super::shared::DATA_HEADING
    )]
    pub data: Option<PathBuf>,
    /// The residents' page's port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 8090)]
    pub port: u16,
    /// How many processor instances start (the script adds one more, then kills one).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(2..=32))]
    pub instances: u32,
    #[command(flatten)]
    pub durability: DurabilityArgs,
}

/// `tributary demo-worker`: one processor instance of the demo, started by `tributary demo`.
#[derive(Debug, Args)]
pub struct DemoWorkerArgs {
    /// The embedded hub's AMQP connection string.
    #[arg(long, env = "TRIBUTARY_CONNECTION_STRING", hide_env_values = true)]
    pub connection_string: String,
    /// The hub.
    #[arg(long)]
    pub hub: String,
    /// The shared SQLite checkpoint store.
    #[arg(long)]
    pub store: PathBuf,
    /// The shared SQLite aggregates database.
    #[arg(long)]
    pub aggregates: PathBuf,
    /// This instance's name.
    #[arg(long)]
    pub host_name: String,
    /// How often ownership is renewed and balanced.
    #[arg(long, default_value = "1s", value_parser = parse_duration_ms)]
    pub interval: i64,
    /// How long an instance that stops renewing keeps its partitions.
    #[arg(long, default_value = "4s", value_parser = parse_duration_ms)]
    pub expiration: i64,
}
