//! The flags of `tributary process` and `tributary ownership`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{ConnectionArgs, DataArgs, PositionArg, parse_duration_ms, parse_position};

/// What `process` does with each event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Action {
    /// Print one JSON line per event (partition, sequence number, offset, body).
    Print,
    /// Count events per partition; print the counts every few seconds and at the end.
    Count,
    /// Append each event's body as a line to `<output-dir>/<partition>.events`.
    File,
}

/// Where a consumer group's ownership and checkpoints live; shared by `process` and
/// `ownership`.
#[derive(Debug, Args)]
pub struct GroupStore {
    /// The hub (with --kafka: the topic, unless --topic names it).
    #[arg(
        default_value = "",
        hide_default_value = true,
        required_unless_present = "topic"
    )]
    pub hub: String,
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// The consumer group.
    #[arg(long, short, default_value = "$Default")]
    pub group: String,
    /// The checkpoint store, as a URL: `hub:` (the store a Tributary hub keeps itself, reached
    /// over the AMQP connection; Azure Event Hubs has none), `sqlite:PATH` or a bare path (a SQLite file the
    /// processors on this machine share), `postgres://USER:PASSWORD@HOST:PORT/DATABASE` (three
    /// tables that processors on many machines share, `tributary_ownership`,
    /// `tributary_checkpoint` and `tributary_host`, created if absent; `?schema=NAME` picks the
    /// schema, default public; no TLS), `https://ACCOUNT.blob.core.windows.net/CONTAINER` (blobs in the layout
    /// the official .NET, Python and JavaScript processors share, so they can balance one group
    /// with these; a SAS in the URL, or AZURE_STORAGE_CONNECTION_STRING / AZURE_STORAGE_KEY;
    /// Azurite: `http://127.0.0.1:10000/devstoreaccount1/CONTAINER`), `memory:` (`process`
    /// only: this instance alone, forgotten at exit), or with --kafka `kafka:` (checkpoints
    /// committed as the Kafka consumer group's offsets too, so Kafka's tools see them, and a
    /// partition never checkpointed here starts from the group's committed offset; ownership and
    /// fenced checkpoints in checkpoints.sqlite of the data directory, or in the store URL
    /// written after it, as in `kafka:postgres://...`).
    /// Default: `hub:` for a remote hub (--connection-string, or a running `serve` on the data
    /// directory), else checkpoints.sqlite in the data directory.
    #[arg(
        long,
        value_name = "URL",
        env = "TRIBUTARY_STORE",
        hide_env_values = true
    )]
    pub store: Option<String>,
    /// The namespace name ownership and checkpoints are recorded under (default: the host of
    /// --connection-string, else "localhost"). Processors balance a group together only when
    /// they record it under one name: the official .NET and JavaScript processors use the
    /// connection string's host, Python its `host:port` when the endpoint names a port.
    #[arg(long)]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub connection: ConnectionArgs,
    #[command(flatten)]
    pub data: DataArgs,
}

/// A Kafka cluster in place of a hub: the topic's partitions are the hub's (`process`,
/// `ownership`).
#[derive(Debug, Args)]
#[command(next_help_heading = "Kafka")]
pub struct KafkaArgs {
    /// Read a Kafka topic (Apache Kafka, Redpanda, Event Hubs' Kafka endpoint on port 9093, a
    /// Tributary serve's Kafka door) instead of a hub: its bootstrap servers, `HOST:PORT[,…]`.
    /// With --connection-string, SASL PLAIN as `$ConnectionString` with it as the password (over
    /// TLS when its endpoint uses TLS). Ownership and checkpoints stay in --store (default:
    /// checkpoints.sqlite in the data directory), recorded under the first bootstrap server
    /// unless --namespace says otherwise. Needs a tributary built with the `kafka` feature.
    #[arg(long, value_name = "BOOTSTRAP")]
    pub kafka: Option<String>,
    /// The Kafka topic (default: the hub argument).
    #[arg(long, requires = "kafka")]
    pub topic: Option<String>,
    /// SASL user name (with --kafka-password; PLAIN unless --kafka-sasl-mechanism says otherwise).
    #[arg(long, requires_all = ["kafka", "kafka_password"])]
    pub kafka_username: Option<String>,
    /// SASL password.
    #[arg(
        long,
        env = "TRIBUTARY_KAFKA_PASSWORD",
        hide_env_values = true,
        requires = "kafka_username"
    )]
    pub kafka_password: Option<String>,
    /// SASL mechanism.
    #[arg(long, value_enum, default_value_t = KafkaSasl::Plain, requires = "kafka_username")]
    pub kafka_sasl_mechanism: KafkaSasl,
    /// Connect over TLS (the system's trust store, or --ca-file).
    #[arg(long, requires = "kafka")]
    pub kafka_tls: bool,
}

/// A SASL mechanism for --kafka.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KafkaSasl {
    /// PLAIN.
    Plain,
    /// SCRAM-SHA-256.
    ScramSha256,
    /// SCRAM-SHA-512.
    ScramSha512,
}

/// `tributary process`.
#[derive(Debug, Args)]
pub struct ProcessArgs {
    #[command(flatten)]
    pub at: GroupStore,
    /// This instance's name; unique within the consumer group (default: generated).
    #[arg(long)]
    pub host_name: Option<String>,
    /// What to do with events.
    #[arg(long, value_enum, default_value_t = Action::Print)]
    pub action: Action,
    /// Where `--action file` writes.
    #[arg(long, required_if_eq("action", "file"))]
    pub output_dir: Option<PathBuf>,
    /// Checkpoint after every this many batches (and when shutting down).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub checkpoint_every: u32,
    /// Where a partition with no checkpoint starts: `earliest`, `latest`, `seq:<n>`,
    /// `offset:<n>` or `time:<RFC 3339 | ms | -duration>`. After a failover to a replica hub,
    /// a new --store with `time:` a little before the source failed resumes every partition
    /// by enqueued time (or translate the checkpoints: `failover translate-checkpoints`).
    #[arg(long, default_value = "earliest", value_parser = parse_position)]
    pub initial_position: PositionArg,
    /// The most events per batch.
    #[arg(long, default_value_t = 100)]
    pub batch_size: u32,
    /// Balanced moves only the partitions an even split needs moved, by a plan every instance
    /// computes alike; greedy steals all it is short of each cycle, from the busiest instances.
    #[arg(long, value_enum, default_value_t = Strategy::Balanced)]
    pub strategy: Strategy,
    /// How often ownership is renewed and balanced.
    #[arg(long, default_value = "500ms", value_parser = parse_duration_ms)]
    pub interval: i64,
    /// How long an instance that stops renewing keeps its partitions (at least 3 intervals).
    #[arg(long, default_value = "5s", value_parser = parse_duration_ms)]
    pub expiration: i64,
}

/// `tributary ownership` (its help is on `Command::Ownership`).
#[derive(Debug, Args)]
pub struct OwnershipArgs {
    #[command(flatten)]
    pub at: GroupStore,
}

/// The load-balancing strategy, as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Strategy {
    /// Move only what the even split needs moved, by a plan every instance computes alike.
    Balanced,
    /// Take over every partition this instance is short of each cycle (more churn).
    Greedy,
}
