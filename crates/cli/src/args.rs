//! Every command and flag of `tributary`, with its documentation; `--help` is generated from
//! these definitions. Values with a syntax of their own (positions, durations, sizes,
//! properties) are parsed here, so a bad one is reported before anything runs.

use std::path::PathBuf;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use tributary_event::{EventPosition, PropertyValue, SmolStr};
use tributary_log::{CleanupPolicy, Durability};

mod bench;
mod demo;
mod failover;
mod process;
mod replicate;
mod shared;

pub use bench::{BenchArgs, LagRate, Scenario, Sweep, TaskTransport};
#[cfg(feature = "kafka-bench")]
pub use bench::{KafkaConsume, KafkaServer};
pub use demo::{DemoArgs, DemoWorkerArgs};
pub use failover::{AliasArgs, FailoverArgs, FailoverCommand, TranslateArgs};
#[cfg(feature = "kafka")]
pub use process::KafkaSasl;
pub use process::{Action, GroupStore, OwnershipArgs, ProcessArgs, Strategy};
pub use replicate::ReplicateArgs;
pub use shared::{ConnectionArgs, DataArgs, DataDirArgs, DurabilityArgs, GlobalArgs, TrustArgs};

/// Tributary: a partitioned, durable event hub with epoch receivers and consumer groups.
#[derive(Debug, Parser)]
#[command(name = "tributary", version, propagate_version = true)]
pub struct Cli {
    /// Log level for diagnostics on stderr (error, warn, info, debug, trace), or a tracing filter.
    #[arg(long, global = true, env = "TRIBUTARY_LOG", default_value = "warn")]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the hub on its data directory until interrupted (Ctrl-C). On an empty data directory
    /// it first creates the hub named by --hub.
    Serve(ServeArgs),
    /// Create, list, show and delete event hubs: on the data directory, through the
    /// `tributary serve` running on it, or on a remote Tributary hub (--connection-string).
    Hub(HubArgs),
    /// Create, list and delete consumer groups: on the data directory, through the `tributary
    /// serve` running on it, or on a remote Tributary hub (--connection-string).
    Group(GroupArgs),
    /// Create, list, show, regenerate the keys of and delete shared access policies — the
    /// namespace's, or an event hub's (--hub): on the data directory, through the `tributary
    /// serve` running on it (in force on every door at once), or on a remote Tributary hub
    /// (--connection-string). Keys are printed only when asked (--keys).
    Policy(PolicyArgs),
    /// Send events to a hub: one per input line, or JSON lines with body, key and properties.
    Send(SendArgs),
    /// Receive events from a hub's partitions, from any position, optionally following.
    ///
    /// Without --follow it stops at each partition's end as of its start, and says `no events`
    /// on stderr when there were none. Following a remote hub, it reconnects when the connection
    /// drops (to the `tributary serve` running on the data directory, wherever it listens now).
    Receive(ReceiveArgs),
    /// Run one event processor instance: it shares the hub's partitions with every other
    /// instance of the consumer group, checkpoints, and takes over when instances come and go.
    Process(ProcessArgs),
    /// Print the ownership and checkpoint table of a consumer group.
    ///
    /// Refuses a hub that does not exist when it can tell: with --connection-string (it asks
    /// the hub) or when the data directory exists (it looks there; while a running `serve`
    /// holds the directory it says it cannot check). With only a store it cannot tell an
    /// unknown hub from one nobody has processed yet, and prints an empty table.
    Ownership(OwnershipArgs),
    /// Open everything the data directory holds with this build — catalog, partition logs,
    /// ownership and checkpoint records, access policies, server-side groups, the processor's
    /// checkpoints.sqlite — upgrading in place what an older build wrote (crash-safe: run it
    /// again if interrupted), and refusing, with both versions, a format newer than this build
    /// reads. Not while `tributary serve` runs on it.
    Migrate(MigrateArgs),
    /// Run a replication task (a TOML file): copy, merge, edit and route events from a source
    /// hub to target hubs, as a consumer group that any number of processes share.
    Replicate(ReplicateArgs),
    /// Move consumers to a replica hub after a failover: translate a consumer group's
    /// checkpoints from the source hub to its replica.
    Failover(FailoverArgs),
    /// Make a development certificate authority and a server certificate it signs, for
    /// `serve --tls-cert/--tls-key` and for clients to trust.
    Cert(CertArgs),
    /// Print the connection string of a shared access policy (for the Azure SDKs and
    /// --connection-string). It contains the policy's key.
    ConnectionString(ConnectionStringArgs),
    /// Measure the partition log (append throughput and acknowledgement latency, reads,
    /// recovery, memory) and the event processor host (start-up, failover, throughput).
    Bench(BenchArgs),
    /// The home-security scenario of the Event Processor Host documentation, live: an embedded
    /// 16-partition hub, simulated sensors of many homes, processor instances (child processes)
    /// aggregating per home per minute, and a residents' page. Mid-run it adds carbon-monoxide
    /// sensors, adds an instance and kills one, announcing each step.
    Demo(DemoArgs),
    /// Print a completion script for a shell, from these same definitions. Load it in your
    /// shell's startup (bash: `source <(tributary completions bash)`) or install it where the
    /// shell looks (bash: ~/.local/share/bash-completion/completions/tributary; zsh: a file
    /// `_tributary` in a directory of $fpath; fish: ~/.config/fish/completions/tributary.fish).
    Completions(CompletionsArgs),
    /// Print the man page of `tributary` (roff; read it with `tributary man | man -l -`), or
    /// write one per command into a directory (--dir) for MANPATH.
    Man(ManArgs),
    /// One processor instance of `tributary demo` (started by it).
    #[command(hide = true)]
    DemoWorker(DemoWorkerArgs),
}

/// `tributary completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `tributary man`.
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write tributary.1 and a page per command (tributary-serve.1, tributary-hub-create.1, …)
    /// into this directory (created if absent) instead of printing the main page.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

impl Cli {
    /// What the command runs with: the shared flags it took, the others at their defaults.
    pub fn global(&self) -> GlobalArgs {
        let global = GlobalArgs::new(&self.log);
        match &self.command {
            Command::Serve(args) => global.with_data(&args.data),
            Command::Hub(HubArgs { data, remote, .. })
            | Command::Group(GroupArgs { data, remote, .. })
            | Command::Policy(PolicyArgs { data, remote, .. }) => {
                global.with_data(data).with_trust(&remote.trust)
            }
            Command::Send(SendArgs {
                data, connection, ..
            })
            | Command::Receive(ReceiveArgs {
                data, connection, ..
            })
            | Command::Process(ProcessArgs {
                at: GroupStore {
                    data, connection, ..
                },
                ..
            })
            | Command::Ownership(OwnershipArgs {
                at: GroupStore {
                    data, connection, ..
                },
            }) => global.with_data(data).with_connection(connection),
            Command::Failover(FailoverArgs {
                command:
                    FailoverCommand::Status { alias, .. } | FailoverCommand::Switch { alias, .. },
            }) => global.with_alias(alias),
            Command::Migrate(MigrateArgs { data }) => global.with_data(data),
            Command::Cert(CertArgs { data, .. })
            | Command::ConnectionString(ConnectionStringArgs { data, .. })
            | Command::Bench(BenchArgs { data, .. }) => global.with_dir(data),
            Command::Demo(args) => global.with_durability(&args.durability),
            Command::Failover(_)
            | Command::Replicate(_)
            | Command::Completions(_)
            | Command::Man(_)
            | Command::DemoWorker(_) => global,
        }
    }
}

/// The command line as `tributary` parses it and as `--help`, the completions and the man pages
/// show it: the derived commands, and at the top, hidden, the shared flags again, so that a
/// script giving them before the command (`tributary --data-dir D send …`, from when they were
/// global) keeps working. There they carry no default and no environment variable: a value
/// given before the command is used only when the command itself was not given one.
pub fn command() -> clap::Command {
    let shared = AliasArgs::augment_args(TrustArgs::augment_args(DataArgs::augment_args(
        clap::Command::new("shared"),
    )));
    let before = shared.get_arguments().map(|arg| {
        arg.clone()
            .global(true)
            .hide(true)
            .default_value(None::<&str>)
            .env(None::<&str>)
    });
    Cli::command().args(before.collect::<Vec<_>>())
}

/// Parses the command line; a usage error prints clap's message and exits with status 2.
pub fn parse() -> Cli {
    try_parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit())
}

/// Parses `args` (the program's name first). A shared flag given to a command that does not
/// use it (`tributary --alias-file F serve`) is refused, wherever it stands.
pub fn try_parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut command = command();
    let matches = command.try_get_matches_from_mut(args)?;
    if let Some(refused) = shared_flag_not_taken(&matches) {
        return Err(command.error(clap::error::ErrorKind::UnknownArgument, refused));
    }
    Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut command))
}

/// Why a shared flag on the command line was refused, if one was: the command it reached
/// does not take it (it was accepted only as one of [`command`]'s hidden top-level copies).
fn shared_flag_not_taken(matches: &clap::ArgMatches) -> Option<String> {
    let derived = Cli::command();
    let mut path = vec!["tributary"];
    let mut taken = std::collections::HashSet::new();
    let (mut at, mut matched) = (&derived, matches);
    while let Some((name, sub)) = matched.subcommand() {
        at = at.find_subcommand(name)?;
        path.push(at.get_name());
        taken.extend(at.get_arguments().map(|arg| arg.get_id().clone()));
        matched = sub;
    }
    let full = command();
    let refused = full.get_arguments().find(|arg| {
        arg.is_hide_set()
            && !taken.contains(arg.get_id())
            && matches.value_source(arg.get_id().as_str())
                == Some(clap::parser::ValueSource::CommandLine)
    })?;
    Some(format!(
        "--{} does not apply to `{}`",
        refused.get_long().unwrap_or_default(),
        path.join(" ")
    ))
}

/// `serve --help` headings: what the hub is, where it listens, who may use it, TLS, limits, and
/// the Event Hubs emulator's stand-in (the data directory's flags have their own).
const SERVE_HUB_HEADING: &str = "Hub";
const SERVE_PORTS_HEADING: &str = "Ports";
const SERVE_ACCESS_HEADING: &str = "Access";
const SERVE_TLS_HEADING: &str = "TLS";
const SERVE_LIMITS_HEADING: &str = "Limits";
const SERVE_EMULATOR_HEADING: &str = "Emulator";

/// `tributary serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// The hub to create when the data directory has none.
    #[arg(long, default_value = "events", help_heading = SERVE_HUB_HEADING)]
    pub hub: String,
    /// Partitions of that hub.
    #[arg(long, default_value_t = 4, help_heading = SERVE_HUB_HEADING)]
    pub partitions: u32,
    /// How often retention is enforced.
    #[arg(long, default_value = "60s", value_parser = parse_duration_ms, help_heading = shared::DATA_HEADING)]
    pub retention_check: i64,
    /// How often compacted hubs' partitions are looked at; each is compacted when sealed
    /// segments hold events compaction has not yet seen (past the minimum compaction lag), or
    /// tombstones may have expired.
    #[arg(long, default_value = "15s", value_parser = parse_duration_ms, help_heading = shared::DATA_HEADING)]
    pub compaction_check: i64,
    /// A compacted hub's active segment holding events is sealed once this old, so that
    /// compaction reaches the newest events of a partition written slowly (Kafka's segment.ms).
    #[arg(long, default_value = "1h", value_parser = parse_duration_ms, help_heading = shared::DATA_HEADING)]
    pub compaction_segment_age: i64,
    /// What retention does with events of a captured hub its capture has not written yet:
    /// `hold` keeps them past the retention (and warns), `proceed` removes them as due,
    /// counting them (tributary_capture_uncaptured_events_removed).
    #[arg(long, default_value = "hold", value_parser = parse_capture_retention, help_heading = shared::DATA_HEADING)]
    pub capture_retention: tributary_broker::CaptureRetention,
    /// The namespace name captured hubs' archive names carry ({Namespace}).
    #[arg(long, default_value = "tributary", help_heading = shared::DATA_HEADING)]
    pub capture_namespace: String,
    /// The connection string of the Azure Storage account that `blob:` capture destinations
    /// are in (DefaultEndpointsProtocol=…;AccountName=…;AccountKey=…;BlobEndpoint=…). Kept out of
    /// the hub catalog and never shown.
    #[arg(long, env = "TRIBUTARY_CAPTURE_STORAGE", hide_env_values = true, value_name = "CONNECTION_STRING", help_heading = shared::DATA_HEADING)]
    pub capture_storage: Option<String>,
    /// The address the network front doors listen on (0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1", help_heading = SERVE_PORTS_HEADING)]
    pub listen: std::net::IpAddr,
    /// The AMQP front door's port (the Azure Event Hubs SDKs); 0 picks a free one.
    #[arg(long, default_value_t = 5672, help_heading = SERVE_PORTS_HEADING)]
    pub amqp_port: u16,
    /// The HTTP front door's port (OCI Streaming message API, admin API, /health, /metrics);
    /// 0 picks a free one [default: 8080; 5300, the emulator's health port, with
    /// --emulator-compat].
    #[arg(long, help_heading = SERVE_PORTS_HEADING)]
    pub http_port: Option<u16>,
    /// Accept unsigned HTTP requests. For development only: anyone who can reach the port can
    /// read, write and delete.
    #[arg(long, help_heading = SERVE_ACCESS_HEADING)]
    pub http_unauthenticated: bool,
    /// Serve Kafka clients without SASL, with every right. For development only: anyone who
    /// can reach the Kafka port can read, write and delete.
    #[arg(long, help_heading = SERVE_ACCESS_HEADING)]
    pub kafka_unauthenticated: bool,
    /// Throttle the HTTP API as OCI Streaming does (5 GetMessages/s per reader, 1 MiB/s put
    /// per partition; beyond that, 429).
    #[arg(long, help_heading = SERVE_LIMITS_HEADING)]
    pub http_oci_rate_limits: bool,
    /// Limit the namespace's throughput as Event Hubs' throughput units do: each unit allows
    /// 1 MiB/s or 1000 events/s in and 2 MiB/s or 4096 events/s out, shared by every hub.
    /// Over the ingress limit AMQP sends get `com.microsoft:server-busy`, Kafka produces
    /// `throttle_time_ms` and HTTP puts 429; reads are slowed to the egress limit.
    #[arg(long, value_parser = crate::throughput::parse_throughput_units, help_heading = SERVE_LIMITS_HEADING)]
    pub throughput_units: Option<u64>,
    /// The namespace's ingress limit, e.g. `1MiB/s,1000ev/s` (either part may be left out);
    /// replaces the ingress part of --throughput-units.
    #[arg(long, value_parser = crate::throughput::parse_rate, help_heading = SERVE_LIMITS_HEADING)]
    pub ingress_limit: Option<tributary_broker::throttle::Rate>,
    /// The namespace's egress limit, e.g. `2MiB/s,4096ev/s`; replaces the egress part of
    /// --throughput-units.
    #[arg(long, value_parser = crate::throughput::parse_rate, help_heading = SERVE_LIMITS_HEADING)]
    pub egress_limit: Option<tributary_broker::throttle::Rate>,
    /// One hub's limits on top of the namespace's, e.g.
    /// `orders:ingress=256KiB/s,250ev/s,egress=1MiB/s`. Repeatable, once per hub.
    #[arg(long, value_parser = crate::throughput::parse_hub_limit, help_heading = SERVE_LIMITS_HEADING)]
    pub hub_limit: Vec<(String, tributary_broker::throttle::DirectionLimits)>,
    /// The server's certificate chain (PEM; `tributary cert` makes one for development). With
    /// --tls-key it turns on AMQPS (--amqps-port) and HTTPS (--https-port) and turns the plain
    /// ports off unless --plain is given. The files are re-read when they change.
    #[arg(long, requires = "tls_key", help_heading = SERVE_TLS_HEADING)]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, requires = "tls_cert", help_heading = SERVE_TLS_HEADING)]
    pub tls_key: Option<PathBuf>,
    /// The AMQPS port (AMQP over TLS, what the Azure SDKs use without
    /// UseDevelopmentEmulator), with --tls-cert.
    #[arg(long, default_value_t = 5671, help_heading = SERVE_PORTS_HEADING)]
    pub amqps_port: u16,
    /// The HTTPS port of the HTTP front door, with --tls-cert.
    #[arg(long, default_value_t = 8443, help_heading = SERVE_PORTS_HEADING)]
    pub https_port: u16,
    /// The Kafka front door's port (Kafka clients, SASL_PLAINTEXT, as Event Hubs' Kafka
    /// endpoint); 0 picks a free one.
    #[arg(long, env = "TRIBUTARY_KAFKA_PORT", default_value_t = 9092, help_heading = SERVE_PORTS_HEADING)]
    pub kafka_port: u16,
    /// The Kafka front door's SASL_SSL port, with --tls-cert (9093, as Event Hubs').
    #[arg(long, env = "TRIBUTARY_KAFKA_TLS_PORT", default_value_t = 9093, help_heading = SERVE_PORTS_HEADING)]
    pub kafka_tls_port: u16,
    /// The host Kafka clients are told to connect to after bootstrapping (Kafka's advertised
    /// listener): a name or address they can reach, e.g. a container's network alias
    /// [default: the --listen address; localhost when it is 0.0.0.0 or ::].
    #[arg(long, value_name = "HOST", help_heading = SERVE_PORTS_HEADING)]
    pub kafka_advertised_host: Option<String>,
    /// With --tls-cert, keep the plain AMQP and HTTP ports open as well (for the SDKs'
    /// emulator mode on this machine).
    #[arg(long, requires = "tls_cert", help_heading = SERVE_TLS_HEADING)]
    pub plain: bool,
    /// The most connections each front door holds at once; beyond it AMQP refuses with
    /// amqp:resource-limit-exceeded and HTTP answers 503.
    #[arg(long, default_value_t = tributary_amqp::limits::CONNECTIONS_MAX_DEFAULT, help_heading = SERVE_LIMITS_HEADING)]
    pub connections_max: usize,
    /// The most connections one source IP address holds at once on each front door; beyond it
    /// AMQP refuses with amqp:resource-limit-exceeded and HTTP answers 429.
    #[arg(long, default_value_t = tributary_amqp::limits::CONNECTIONS_PER_ADDRESS_MAX_DEFAULT, help_heading = SERVE_LIMITS_HEADING)]
    pub connections_per_address_max: usize,
    /// How long an AMQP connection has from its accept to its `open` [default: 10s].
    #[arg(long, value_parser = parse_duration_ms, help_heading = SERVE_LIMITS_HEADING)]
    pub amqp_handshake_timeout: Option<i64>,
    /// How long an AMQP connection may stay unauthenticated (no token put on $cbs, no SASL
    /// PLAIN login), counted from its accept; a Kafka connection has as long for its TLS
    /// handshake and SASL login [default: 30s].
    #[arg(long, value_parser = parse_duration_ms, help_heading = SERVE_LIMITS_HEADING)]
    pub amqp_auth_timeout: Option<i64>,
    /// How long an HTTP client has to send a request's headers (also the idle time allowed
    /// between requests) [default: 30s].
    #[arg(long, value_parser = parse_duration_ms, help_heading = SERVE_LIMITS_HEADING)]
    pub http_header_timeout: Option<i64>,
    /// How long an HTTP client has to send a request's body; beyond it, 408 [default: 60s].
    #[arg(long, value_parser = parse_duration_ms, help_heading = SERVE_LIMITS_HEADING)]
    pub http_body_timeout: Option<i64>,
    /// Create the event hubs and consumer groups of a Microsoft Event Hubs emulator
    /// configuration file (its Config.json: UserConfig.NamespaceConfig[].Entities[] with Name,
    /// PartitionCount and ConsumerGroups[].Name) instead of the default hub (--hub). The whole
    /// file is checked before anything is created; hubs already there with the same partition
    /// count are kept. Implies nothing about --emulator-compat.
    #[arg(long, value_name = "CONFIG_JSON", help_heading = SERVE_EMULATOR_HEADING)]
    pub emulator_config: Option<PathBuf>,
    /// Stand in for Microsoft's Event Hubs emulator, so code and configuration written for it
    /// run unchanged: also accept its publicly known key (SharedAccessKeyName
    /// RootManageSharedAccessKey with the key its documentation gives) with the Manage right,
    /// and put the HTTP door, with /health, on the emulator's health port 5300 unless
    /// --http-port is given (AMQP stays on 5672, as the emulator's). FOR DEVELOPMENT ONLY:
    /// anyone who can reach the ports can use that key.
    #[arg(long, help_heading = SERVE_EMULATOR_HEADING)]
    pub emulator_compat: bool,
}

/// Where the HTTP door listens by default.
pub const HTTP_PORT_DEFAULT: u16 = 8080;

/// Where the Event Hubs emulator serves its health check (`GET /health`), and so where the HTTP
/// door listens by default with --emulator-compat.
pub const EMULATOR_HEALTH_PORT: u16 = 5300;

impl ServeArgs {
    /// The HTTP door's port: --http-port, else the emulator's health port with
    /// --emulator-compat, else 8080.
    pub fn http_port(&self) -> u16 {
        match (self.http_port, self.emulator_compat) {
            (Some(port), _) => port,
            (None, true) => EMULATOR_HEALTH_PORT,
            (None, false) => HTTP_PORT_DEFAULT,
        }
    }
}

/// `tributary cert`.
#[derive(Debug, Args)]
pub struct CertArgs {
    #[command(flatten)]
    pub data: DataDirArgs,
    /// Where to write ca.pem, ca-key.pem, server.pem and server-key.pem (default: tls/ in the
    /// data directory). An authority already there signs the new server certificate.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Host names and IP addresses the server certificate is valid for, besides localhost,
    /// 127.0.0.1 and ::1.
    #[arg(long = "host")]
    pub hosts: Vec<String>,
}

/// `tributary migrate`.
#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub data: DataArgs,
}

/// `tributary connection-string`.
#[derive(Debug, Args)]
pub struct ConnectionStringArgs {
    #[command(flatten)]
    pub data: DataDirArgs,
    /// The shared access policy.
    #[arg(long, default_value = "RootManageSharedAccessKey")]
    pub policy: String,
    /// The host clients connect to (default: the address of the `tributary serve` running on
    /// the data directory, else localhost).
    #[arg(long)]
    pub host: Option<String>,
    /// The AMQP port clients connect to (default: the port the `tributary serve` running on
    /// the data directory really listens on, else 5672).
    #[arg(long)]
    pub port: Option<u16>,
    /// Print a Kafka client's settings for the Kafka door instead (librdkafka properties, as
    /// `kcat -F` and confluent-kafka take them): bootstrap.servers where the running server's
    /// Kafka door listens (else localhost:9092, or --host), SASL PLAIN with the connection
    /// string as the password.
    #[arg(long, conflicts_with = "port")]
    pub kafka: bool,
}

/// Where `hub` and `group` work when not on the data directory.
#[derive(Debug, Args)]
pub struct AdminArgs {
    /// Manage a running Tributary hub instead of the data directory: its connection string,
    /// with a policy that has the Manage right. The changes go through its admin API
    /// (--admin-url).
    #[arg(
        long,
        global = true,
        env = "TRIBUTARY_CONNECTION_STRING",
        hide_env_values = true,
        help_heading = shared::CONNECTION_HEADING
    )]
    pub connection_string: Option<String>,
    /// The admin API of that hub: its HTTP door, `http://host:port`, or its HTTPS door,
    /// `https://host:port` (its certificate checked against the usual roots and --ca-file).
    /// Default: the connection string's host, port 8080, plain HTTP.
    #[arg(
        long,
        global = true,
        env = "TRIBUTARY_ADMIN_URL",
        requires = "connection_string",
        help_heading = shared::CONNECTION_HEADING
    )]
    pub admin_url: Option<String>,
    #[command(flatten)]
    pub trust: TrustArgs,
}

/// `tributary hub`.
#[derive(Debug, Args)]
pub struct HubArgs {
    #[command(subcommand)]
    pub command: HubCommand,
    #[command(flatten)]
    pub remote: AdminArgs,
    #[command(flatten)]
    pub data: DataArgs,
}

/// `tributary group`.
#[derive(Debug, Args)]
pub struct GroupArgs {
    #[command(subcommand)]
    pub command: GroupCommand,
    #[command(flatten)]
    pub remote: AdminArgs,
    #[command(flatten)]
    pub data: DataArgs,
}

/// `tributary hub …`.
#[derive(Debug, Subcommand)]
pub enum HubCommand {
    /// Create an event hub (with the $Default consumer group).
    Create {
        /// Its name: letters, digits, '.', '-', '_'; starting and ending with a letter or digit.
        name: String,
        /// How many partitions (1 to 1024).
        #[arg(long, short, default_value_t = 4)]
        partitions: u32,
        /// How long events are kept, e.g. `1h`, `7d`, or `forever`.
        #[arg(long, default_value = "1d", value_parser = parse_retention)]
        retention: RetentionAge,
        /// The most bytes each partition keeps (e.g. `10GiB`); the oldest segments go first.
        #[arg(long, value_parser = parse_bytes)]
        retention_bytes: Option<u64>,
        #[command(flatten)]
        cleanup: CleanupArgs,
        #[command(flatten)]
        capture: CaptureArgs,
    },
    /// Change an event hub's retention, cleanup policy or capture (only the settings given). A
    /// hub that now compacts refuses events without a partition key from then on.
    Update {
        /// The hub.
        name: String,
        /// How long events are kept, e.g. `1h`, `7d`, or `forever`.
        #[arg(long, value_parser = parse_retention)]
        retention: Option<RetentionAge>,
        /// The most bytes each partition keeps (e.g. `10GiB`), or `none` for no limit.
        #[arg(long, value_parser = parse_retention_bytes)]
        retention_bytes: Option<RetentionBytes>,
        /// `delete`, `compact` or `delete,compact` (see `hub create --help`).
        #[arg(long, value_parser = parse_cleanup_policy)]
        cleanup_policy: Option<CleanupPolicy>,
        /// How long an event stays readable once a later event of its key supersedes it.
        #[arg(long, value_parser = parse_duration_or_zero_ms)]
        min_compaction_lag: Option<i64>,
        /// How long a tombstone (a key and an empty body) is kept.
        #[arg(long, value_parser = parse_duration_or_zero_ms)]
        tombstone_retention: Option<i64>,
        #[command(flatten)]
        capture: CaptureArgs,
        /// Stop capturing the hub (its files stay; capture turned on again starts afresh).
        #[arg(long, conflicts_with_all = ["capture", "capture_format", "capture_interval", "capture_size", "capture_skip_empty", "capture_name_format", "capture_notify"])]
        no_capture: bool,
    },
    /// List the event hubs.
    List,
    /// Show an event hub: its settings, consumer groups and each partition's properties.
    Show {
        /// The hub.
        name: String,
    },
    /// Delete an event hub and all its events.
    Delete {
        /// The hub.
        name: String,
    },
}

/// How a new event hub cleans up (`hub create`).
#[derive(Debug, Clone, Copy, Args)]
pub struct CleanupArgs {
    /// `delete` removes events by age and size (--retention, --retention-bytes); `compact`
    /// keeps the latest event of each partition key forever (every event must then have a
    /// key; one with a key and an empty body is a tombstone, which removes its key); `delete,compact`
    /// (or `DeleteOrCompact`) does both.
    #[arg(long, default_value = "delete", value_parser = parse_cleanup_policy)]
    pub cleanup_policy: CleanupPolicy,
    /// With compaction: how long an event stays readable once a later event of its key
    /// supersedes it, e.g. `0`, `10m` (Event Hubs' minCompactionLagTimeInMinutes).
    #[arg(long, default_value = "0", value_parser = parse_duration_or_zero_ms)]
    pub min_compaction_lag: i64,
    /// With compaction: how long a tombstone is kept, so readers see the deletion, e.g. `1d`
    /// (Event Hubs' tombstoneRetentionTimeInHours).
    #[arg(long, default_value = "1d", value_parser = parse_duration_or_zero_ms)]
    pub tombstone_retention: i64,
}

impl CleanupArgs {
    /// The hub's cleanup settings these flags give.
    pub fn cleanup(&self) -> tributary_broker::HubCleanup {
        tributary_broker::HubCleanup {
            policy: self.cleanup_policy,
            min_compaction_lag_ms: self.min_compaction_lag,
            tombstone_retention_ms: self.tombstone_retention,
        }
    }
}

/// A hub's Event Hubs Capture (`hub create`, `hub update`): each window of each partition's
/// events written to an Avro file, as Azure's Capture writes them, by `tributary serve`.
#[derive(Debug, Clone, Default, Args)]
pub struct CaptureArgs {
    /// Capture the hub's events to DEST: `file:/absolute/dir`, or
    /// `blob:https://ACCOUNT.blob.core.windows.net/CONTAINER` (serve needs the account's
    /// connection string: --capture-storage). Windows start with the events enqueued from now on.
    #[arg(long, value_name = "DEST")]
    pub capture: Option<String>,
    /// The capture files' encoding: `avro`, `avro-deflate` or `parquet` [default: avro].
    #[arg(long, value_name = "FORMAT")]
    pub capture_format: Option<String>,
    /// The capture's time window, 60s to 900s [default: 300s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_ms)]
    pub capture_interval: Option<i64>,
    /// The capture's size window, 10MiB to 500MiB [default: 300MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    pub capture_size: Option<u64>,
    /// Write no file for a window without events (Azure's skipEmptyArchives).
    #[arg(long)]
    pub capture_skip_empty: bool,
    /// Azure's archive name format: all of {Namespace} {EventHub} {PartitionId} {Year}
    /// {Month} {Day} {Hour} {Minute} {Second}, in any order
    /// [default: {Namespace}/{EventHub}/{PartitionId}/{Year}/{Month}/{Day}/{Hour}/{Minute}/{Second}].
    #[arg(long, value_name = "FORMAT")]
    pub capture_name_format: Option<String>,
    /// Append each file's Microsoft.EventHub.CaptureFileCreated notification (Event Grid
    /// schema, JSON) to this hub.
    #[arg(long, value_name = "HUB")]
    pub capture_notify: Option<String>,
}

impl CaptureArgs {
    /// The capture these flags set, as Azure's `captureDescription` (only what is given);
    /// `None` when no capture flag is given.
    pub fn description(&self) -> Result<Option<tributary_capture::CaptureDescription>, String> {
        use tributary_capture::spec::DestinationSpec;
        let given = self.capture.is_some()
            || self.capture_format.is_some()
            || self.capture_interval.is_some()
            || self.capture_size.is_some()
            || self.capture_skip_empty
            || self.capture_name_format.is_some()
            || self.capture_notify.is_some();
        if !given {
            return Ok(None);
        }
        let named = self
            .capture
            .as_deref()
            .map(DestinationSpec::parse)
            .transpose()
            .map_err(|e| e.to_string())?
            .map(|spec| spec.described());
        let interval = self.capture_interval.map(|ms| {
            if ms % 1000 == 0 {
                u32::try_from(ms / 1000).map_err(|_| "--capture-interval is too long".to_owned())
            } else {
                Err(format!(
                    "--capture-interval {ms} ms is not a whole number of seconds"
                ))
            }
        });
        let destination = (named.is_some() || self.capture_name_format.is_some()).then(|| {
            let mut destination = named.unwrap_or_default();
            destination
                .properties
                .archive_name_format
                .clone_from(&self.capture_name_format);
            destination
        });
        Ok(Some(tributary_capture::CaptureDescription {
            enabled: self.capture.is_some().then_some(true),
            encoding: self.capture_format.clone(),
            interval_in_seconds: interval.transpose()?,
            size_limit_in_bytes: self.capture_size,
            skip_empty_archives: self.capture_skip_empty.then_some(true),
            destination,
            notify_event_hub: self.capture_notify.clone(),
        }))
    }
}

/// `tributary policy`.
#[derive(Debug, Args)]
pub struct PolicyArgs {
    #[command(subcommand)]
    pub command: PolicyCommand,
    #[command(flatten)]
    pub remote: AdminArgs,
    #[command(flatten)]
    pub data: DataArgs,
}

/// Which policy: its name, and the event hub it belongs to (none: the namespace's).
#[derive(Debug, Args)]
pub struct PolicyTarget {
    /// The policy's name (the connection string's SharedAccessKeyName).
    pub name: String,
    /// The event hub whose policy it is; without it, the namespace's.
    #[arg(long)]
    pub hub: Option<String>,
}

/// `tributary policy …`.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Create a policy with fresh primary and secondary keys. A hub's policy (--hub) grants
    /// its rights on that hub only; its connection strings carry EntityPath=<hub>.
    Create {
        #[command(flatten)]
        target: PolicyTarget,
        /// Its rights, comma-separated: Listen, Send, Manage (Manage includes the others).
        #[arg(long, value_delimiter = ',', required = true, value_parser = parse_right)]
        rights: Vec<tributary_amqp::Right>,
    },
    /// List the namespace's policies, or an event hub's (--hub): names and rights.
    List {
        /// The event hub whose policies to list; without it, the namespace's.
        #[arg(long)]
        hub: Option<String>,
        /// Also print each policy's keys and connection strings.
        #[arg(long)]
        keys: bool,
    },
    /// Show a policy: its rights, and with --keys its keys and connection strings.
    Show {
        #[command(flatten)]
        target: PolicyTarget,
        /// Also print its primary and secondary keys and connection strings.
        #[arg(long)]
        keys: bool,
    },
    /// Regenerate one of a policy's keys. Tokens and logins with the old key are refused at
    /// once on every door; connections already authenticated keep going (until their token
    /// expires, or, logged in with the key itself, until they close). Move clients to the
    /// other key first.
    Rotate {
        #[command(flatten)]
        target: PolicyTarget,
        /// Which key: primary or secondary.
        #[arg(long, value_parser = parse_key_type)]
        key: tributary_amqp::policies::KeyType,
    },
    /// Delete a policy: tokens and logins with its keys are refused from then on.
    Delete {
        #[command(flatten)]
        target: PolicyTarget,
    },
}

fn parse_right(text: &str) -> Result<tributary_amqp::Right, String> {
    text.parse()
        .map_err(|e: tributary_amqp::AmqpError| e.to_string())
}

fn parse_key_type(text: &str) -> Result<tributary_amqp::policies::KeyType, String> {
    text.parse()
        .map_err(|e: tributary_amqp::AmqpError| e.to_string())
}

/// `tributary group …`.
#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// Create a consumer group.
    Create {
        /// The hub.
        hub: String,
        /// The group's name.
        name: String,
    },
    /// List a hub's consumer groups.
    List {
        /// The hub.
        hub: String,
    },
    /// Delete a consumer group ($Default cannot be deleted).
    Delete {
        /// The hub.
        hub: String,
        /// The group.
        name: String,
    },
    /// Move a processor group's checkpoints (the hub-hosted store) so that its processors
    /// resume at earliest, latest or time:<…>; refused while any of its processors runs.
    Reset {
        /// The hub.
        hub: String,
        /// The group.
        name: String,
        /// Where its processors resume: earliest, latest, or time:<RFC 3339 | ms | -duration>.
        #[arg(long, value_parser = parse_position)]
        to: PositionArg,
    },
}

/// How `send` reads its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InputFormat {
    /// Each line is one event's body.
    Lines,
    /// Each line is a JSON object: {"body": …, "partition_key"?, "partition"?, "properties"?,
    /// "content_type"?, "correlation_id"?, "message_id"?}. A string body is sent as UTF-8; any
    /// other JSON value is sent as its JSON text.
    Json,
}

/// `tributary send`.
#[derive(Debug, Args)]
pub struct SendArgs {
    /// The hub to send to.
    pub hub: String,
    /// Read events from this file instead of standard input. A file is checked completely
    /// before the first event is sent, so a bad line sends nothing.
    #[arg(long, short)]
    pub file: Option<PathBuf>,
    /// The input format.
    #[arg(long, value_enum, default_value_t = InputFormat::Lines)]
    pub format: InputFormat,
    /// Route every event by this partition key (the Event Hubs hash).
    #[arg(long, short, conflicts_with = "partition")]
    pub key: Option<String>,
    /// Send every event to this partition id.
    #[arg(long, short)]
    pub partition: Option<String>,
    /// An application property for every event, `name=value`; the value is typed as a
    /// boolean, an integer, a float or else a string. Repeat for more.
    #[arg(long = "property", value_parser = parse_property)]
    pub properties: Vec<(SmolStr, PropertyValue)>,
    /// The most events in one batch (each batch is appended atomically).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub batch_size: u32,
    /// Print one JSON line per acknowledged batch to standard output (partition, first
    /// sequence number, count, offsets, enqueued time).
    ///
    /// Over AMQP (a running `serve`, or --connection-string) the hub's acknowledgement carries
    /// none of these, so each batch is read back from its partition in the consumer group
    /// $Default: this needs the Listen right besides Send, and gives every event without a
    /// message id one (a UUID) to find it by. A batch cut to the hub's message size gets a line
    /// per part.
    #[arg(long)]
    pub receipts: bool,
    #[command(flatten)]
    pub connection: ConnectionArgs,
    #[command(flatten)]
    pub data: DataArgs,
}

/// How `receive` prints events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// One line per event: its body.
    Text,
    /// One JSON object per line: partition, sequence_number, offset, enqueued_time, the
    /// partition_key, content_type, correlation_id and message_id it has, its properties, and
    /// its body: JSON itself when the body is a JSON object, array, number, boolean or null;
    /// else a string when it is UTF-8 text; else (binary) base64 in "body_base64".
    Json,
}

/// `tributary receive`.
#[derive(Debug, Args)]
pub struct ReceiveArgs {
    /// The hub to receive from.
    pub hub: String,
    /// The consumer group.
    #[arg(long, short, default_value = "$Default")]
    pub group: String,
    /// Only this partition id (default: all partitions).
    #[arg(long, short)]
    pub partition: Option<String>,
    /// Where to start: `earliest`, `latest`, `seq:<n>`, `offset:<n>`, or `time:<RFC 3339, ms
    /// since the epoch, or -<duration> before now, e.g. -5m>`.
    #[arg(long, default_value = "earliest", value_parser = parse_position)]
    pub from: PositionArg,
    /// Start after the given sequence number, offset or time instead of at it.
    #[arg(long)]
    pub exclusive: bool,
    /// Stop after this many events.
    #[arg(long, short = 'n')]
    pub count: Option<u64>,
    /// Keep waiting for new events (until Ctrl-C or --count).
    #[arg(long, short)]
    pub follow: bool,
    /// Open epoch receivers with this owner level (disconnecting lower ones).
    #[arg(long)]
    pub owner_level: Option<i64>,
    /// The output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub format: OutputFormat,
    #[command(flatten)]
    pub connection: ConnectionArgs,
    #[command(flatten)]
    pub data: DataArgs,
}

/// A start position as given on the command line (inclusive until `--exclusive` says not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PositionArg {
    /// `earliest`.
    Earliest,
    /// `latest`.
    Latest,
    /// `seq:<n>`.
    Sequence(i64),
    /// `offset:<n>`.
    Offset(u64),
    /// `time:<…>`, in ms since the epoch.
    Time(i64),
}

impl PositionArg {
    /// The event position this means.
    pub fn to_position(self, exclusive: bool) -> EventPosition {
        let inclusive = !exclusive;
        match self {
            PositionArg::Earliest => EventPosition::Earliest,
            PositionArg::Latest => EventPosition::Latest,
            PositionArg::Sequence(sequence_number) => EventPosition::SequenceNumber {
                sequence_number,
                inclusive,
            },
            PositionArg::Offset(offset) => EventPosition::Offset { offset, inclusive },
            PositionArg::Time(enqueued_time_ms) => EventPosition::EnqueuedTime {
                enqueued_time_ms,
                inclusive,
            },
        }
    }
}

pub fn parse_durability(s: &str) -> Result<Durability, String> {
    s.parse()
}

/// Parses `earliest`, `latest`, `seq:<n>`, `offset:<n>`, `time:<RFC 3339 | ms | -duration>`.
pub fn parse_position(s: &str) -> Result<PositionArg, String> {
    match s {
        "earliest" => return Ok(PositionArg::Earliest),
        "latest" => return Ok(PositionArg::Latest),
        _ => {}
    }
    let (kind, value) = s.split_once(':').ok_or_else(|| {
        format!("unknown position {s:?}: use earliest, latest, seq:<n>, offset:<n> or time:<…>")
    })?;
    match kind {
        "seq" => value
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .map(PositionArg::Sequence)
            .ok_or_else(|| {
                format!("invalid sequence number {value:?}: expected a whole number ≥ 0")
            }),
        "offset" => value
            .parse::<u64>()
            .map(PositionArg::Offset)
            .map_err(|_| format!("invalid offset {value:?}: expected a whole number ≥ 0")),
        "time" => parse_time_ms(value).map(PositionArg::Time),
        _ => Err(format!(
            "unknown position kind {kind:?}: use seq, offset or time"
        )),
    }
}

/// Parses an RFC 3339 time, milliseconds since the Unix epoch, or a time before now as `-`
/// and a duration (`-5m`: five minutes ago, when the command starts) — the way to resume a
/// consumer on a replica hub at the time it stopped on the source, minus a margin.
pub fn parse_time_ms(value: &str) -> Result<i64, String> {
    if let Ok(ms) = value.parse::<i64>() {
        return Ok(ms);
    }
    if let Some(ago) = value.strip_prefix('-') {
        let ago = parse_duration_ms(ago).map_err(|e| {
            format!("invalid time {value:?}: {e} (a time before now is -<duration>, e.g. -5m)")
        })?;
        let now = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
        return i64::try_from(now)
            .map(|now| now.saturating_sub(ago))
            .map_err(|_| format!("time {value:?} is out of range"));
    }
    let t = time::OffsetDateTime::parse(value, &time::format_description::well_known::Rfc3339)
        .map_err(|e| format!("invalid time {value:?}: {e} (expected RFC 3339, e.g. 2026-11-22T10:00:00Z, or ms since the epoch)"))?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| format!("time {value:?} is out of range"))
}

/// Parses a duration like `500ms`, `30s`, `15m`, `1h`, `7d` into milliseconds.
pub fn parse_duration_ms(s: &str) -> Result<i64, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: i64 = digits.parse().map_err(|_| {
        format!("invalid duration {s:?}: expected a number and a unit, e.g. 30s, 1h, 7d")
    })?;
    let scale = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?}: use ms, s, m, h or d"
            ));
        }
    };
    match n.checked_mul(scale) {
        Some(ms) if ms > 0 => Ok(ms),
        _ => Err(format!(
            "invalid duration {s:?}: must be above 0 and not absurdly large"
        )),
    }
}

/// How long a hub keeps events, in ms; `None` is forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionAge(pub Option<i64>);

fn parse_retention(s: &str) -> Result<RetentionAge, String> {
    if s == "forever" {
        return Ok(RetentionAge(None));
    }
    parse_duration_ms(s).map(|ms| RetentionAge(Some(ms)))
}

/// Parses a duration as [`parse_duration_ms`] does, or `0`.
pub fn parse_duration_or_zero_ms(s: &str) -> Result<i64, String> {
    parse_duration_ms(s).or_else(|e| {
        let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let unit = &s[digits.len()..];
        let zero = !digits.is_empty() && digits.bytes().all(|b| b == b'0');
        if zero && (unit.is_empty() || parse_duration_ms(&format!("1{unit}")).is_ok()) {
            Ok(0)
        } else {
            Err(e)
        }
    })
}

/// Parses `serve --capture-retention`: `hold` or `proceed`.
fn parse_capture_retention(s: &str) -> Result<tributary_broker::CaptureRetention, String> {
    match s {
        "hold" => Ok(tributary_broker::CaptureRetention::Hold),
        "proceed" => Ok(tributary_broker::CaptureRetention::Proceed),
        _ => Err(format!("{s:?}: use hold or proceed")),
    }
}

/// Parses a cleanup policy: `delete`, `compact`, `delete,compact` (either order) or Event
/// Hubs' `Delete`, `Compact`, `DeleteOrCompact`.
fn parse_cleanup_policy(s: &str) -> Result<CleanupPolicy, String> {
    s.parse()
}

/// `hub update --retention-bytes`: a size, or `none` for no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionBytes(pub Option<u64>);

fn parse_retention_bytes(s: &str) -> Result<RetentionBytes, String> {
    if s == "none" {
        return Ok(RetentionBytes(None));
    }
    parse_bytes(s).map(|bytes| RetentionBytes(Some(bytes)))
}

/// Parses a size like `512`, `64KiB`, `10MiB`, `2GiB` (also KB/MB/GB as powers of 1000).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: u64 = digits.parse().map_err(|_| {
        format!("invalid size {s:?}: expected a number and an optional unit, e.g. 10GiB")
    })?;
    let scale: u64 = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => {
            return Err(format!(
                "invalid size unit in {s:?}: use B, KiB, MiB, GiB, TiB, KB, MB or GB"
            ));
        }
    };
    match n.checked_mul(scale) {
        Some(bytes) if bytes > 0 => Ok(bytes),
        _ => Err(format!("invalid size {s:?}: must be above 0")),
    }
}

/// Parses `name=value`, typing the value as bool, integer, float or string.
pub fn parse_property(s: &str) -> Result<(SmolStr, PropertyValue), String> {
    let (name, value) = s
        .split_once('=')
        .ok_or_else(|| format!("invalid property {s:?}: expected name=value"))?;
    if name.is_empty() {
        return Err(format!("invalid property {s:?}: the name is empty"));
    }
    let typed = match value {
        "true" => PropertyValue::Bool(true),
        "false" => PropertyValue::Bool(false),
        _ => value
            .parse::<i64>()
            .map(PropertyValue::Int64)
            .or_else(|_| value.parse::<f64>().map(PropertyValue::Float64))
            .unwrap_or_else(|_| PropertyValue::String(value.into())),
    };
    Ok((name.into(), typed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        try_parse_from(std::iter::once("tributary").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_definitions_are_consistent() {
        command().debug_assert();
    }

    #[test]
    fn emulator_flags_parse_and_move_the_http_port_unless_given() {
        let serve = |args: &[&str]| match parse(args).unwrap().command {
            Command::Serve(serve) => serve,
            other => panic!("{other:?}"),
        };
        let plain = serve(&["serve"]);
        assert!(!plain.emulator_compat);
        assert_eq!(plain.emulator_config, None);
        assert_eq!((plain.amqp_port, plain.http_port()), (5672, 8080));
        let compat = serve(&[
            "serve",
            "--emulator-compat",
            "--emulator-config",
            "Config.json",
        ]);
        assert!(compat.emulator_compat);
        assert_eq!(compat.emulator_config, Some(PathBuf::from("Config.json")));
        assert_eq!((compat.amqp_port, compat.http_port()), (5672, 5300));
        let chosen = serve(&["serve", "--emulator-compat", "--http-port", "0"]);
        assert_eq!(chosen.http_port(), 0);
        assert!(!serve(&["serve", "--emulator-config", "c.json"]).emulator_compat);
    }

    #[test]
    fn global_flags_parse_anywhere() {
        let cli = parse(&[
            "hub",
            "list",
            "--data-dir",
            "/tmp/x",
            "--durability",
            "interval:50",
        ])
        .unwrap();
        assert_eq!(cli.global().data_dir, PathBuf::from("/tmp/x"));
        assert_eq!(
            cli.global().durability,
            Durability::Interval(std::time::Duration::from_millis(50))
        );
        assert!(parse(&["hub", "list", "--durability", "sometimes"]).is_err());
        assert_eq!(cli.global().sync_scope, tributary_log::SyncScope::File);
        let shared = parse(&["serve", "--sync-scope", "filesystem"]).unwrap();
        assert_eq!(
            shared.global().sync_scope,
            tributary_log::SyncScope::FileSystem
        );
        let refused = parse(&["serve", "--sync-scope", "disk"]).unwrap_err();
        assert!(
            refused.to_string().contains("use file or filesystem"),
            "{refused}"
        );
    }

    #[test]
    fn shared_flags_stand_before_or_after_a_command_that_takes_them() {
        let before = parse(&["--data-dir", "/a", "--ca-file", "ca.pem", "send", "h"]).unwrap();
        assert_eq!(before.global().data_dir, PathBuf::from("/a"));
        assert_eq!(before.global().ca_file, Some(PathBuf::from("ca.pem")));
        let both = parse(&["--data-dir", "/a", "send", "h", "--data-dir", "/b"]).unwrap();
        assert_eq!(
            both.global().data_dir,
            PathBuf::from("/b"),
            "the command's own wins"
        );
        let migrate = parse(&["migrate", "--data-dir", "/m"]).unwrap();
        assert!(matches!(migrate.command, Command::Migrate(_)));
        assert_eq!(migrate.global().data_dir, PathBuf::from("/m"));
        let alias = parse(&["--alias-file", "f", "receive", "h"]).unwrap();
        assert_eq!(alias.global().alias.alias_file, Some(PathBuf::from("f")));
        let status = parse(&["failover", "status", "--alias-srv", "hub.example"]).unwrap();
        assert_eq!(
            status.global().alias.alias_srv.as_deref(),
            Some("hub.example")
        );
        for refused in [
            &["--alias-file", "f", "serve"][..],
            &["serve", "--alias-srv", "hub.example"],
            &["serve", "--ca-file", "ca.pem"],
            &["hub", "list", "--alias-file", "f"],
            &["--durability", "none", "cert"],
            &["--data-dir", "/a", "replicate", "task.toml"],
            &["--alias-file", "f", "replicate", "task.toml"],
            &[
                "failover",
                "translate-checkpoints",
                "--offset-map",
                "m",
                "--source-store",
                "s",
                "--source-hub",
                "h",
                "--alias-file",
                "f",
            ],
        ] {
            let error = parse(refused).map(|_| ()).unwrap_err();
            assert_eq!(
                error.kind(),
                clap::error::ErrorKind::UnknownArgument,
                "{refused:?}"
            );
        }
    }

    #[test]
    fn the_demo_keeps_its_data_in_a_directory_of_its_own_unless_given_one() {
        let demo = |args: &[&str]| match parse(args).unwrap().command {
            Command::Demo(demo) => demo.data,
            other => panic!("{other:?}"),
        };
        assert_eq!(demo(&["demo"]), None, "no default: a temporary directory");
        let kept = Some(PathBuf::from("kept"));
        assert_eq!(demo(&["demo", "--data-dir", "kept"]), kept);
        assert_eq!(demo(&["--data-dir", "kept", "demo"]), kept);
        assert_eq!(
            demo(&["demo", "--data", "kept"]),
            kept,
            "the former spelling"
        );
        let durable = parse(&["demo", "--durability", "none"]).unwrap();
        assert_eq!(durable.global().durability, Durability::None);
    }

    #[test]
    fn send_flags() {
        let cli = parse(&[
            "send",
            "h",
            "-k",
            "dev-1",
            "--property",
            "n=3",
            "--property",
            "ok=true",
            "--receipts",
        ])
        .unwrap();
        let Command::Send(send) = cli.command else {
            panic!("send")
        };
        assert_eq!(send.key.as_deref(), Some("dev-1"));
        assert_eq!(send.properties[0], ("n".into(), PropertyValue::Int64(3)));
        assert_eq!(send.properties[1], ("ok".into(), PropertyValue::Bool(true)));
        assert!(send.receipts);
        assert!(
            parse(&["send", "h", "-k", "a", "-p", "0"]).is_err(),
            "key and partition conflict"
        );
        assert!(parse(&["send", "h", "--batch-size", "0"]).is_err());
        assert!(parse(&["send", "h", "--property", "novalue"]).is_err());
    }

    #[test]
    fn capture_flags() {
        let cli = parse(&[
            "hub",
            "create",
            "c",
            "--capture",
            "file:/cap",
            "--capture-format",
            "avro-deflate",
            "--capture-interval",
            "2m",
            "--capture-size",
            "10MiB",
            "--capture-skip-empty",
            "--capture-notify",
            "files",
        ])
        .unwrap();
        let Command::Hub(HubArgs {
            command: HubCommand::Create { capture, .. },
            ..
        }) = cli.command
        else {
            panic!("hub create")
        };
        let description = capture.description().unwrap().unwrap();
        let set = description.apply("c", None).unwrap().unwrap();
        assert_eq!(set.destination, "file:/cap");
        assert_eq!(set.encoding, "AvroDeflate");
        assert_eq!(set.interval_secs, 120);
        assert_eq!(set.size_bytes_max, 10 << 20);
        assert!(set.skip_empty);
        assert_eq!(set.notify_hub.as_deref(), Some("files"));
        let no_flags = CaptureArgs::default();
        assert_eq!(no_flags.description(), Ok(None));
        let relative = CaptureArgs {
            capture: Some("file:cap".into()),
            ..CaptureArgs::default()
        };
        assert!(relative.description().unwrap_err().contains("absolute"));
        let fractional = CaptureArgs {
            capture_interval: Some(60_500),
            ..CaptureArgs::default()
        };
        assert!(fractional.description().is_err());
        assert!(parse(&["hub", "update", "c", "--no-capture", "--capture", "file:/x"]).is_err());
        assert!(parse(&["hub", "update", "c", "--no-capture"]).is_ok());
    }

    #[test]
    fn positions() {
        assert_eq!(parse_position("earliest"), Ok(PositionArg::Earliest));
        assert_eq!(parse_position("seq:42"), Ok(PositionArg::Sequence(42)));
        assert_eq!(parse_position("offset:7"), Ok(PositionArg::Offset(7)));
        assert_eq!(parse_position("time:1000"), Ok(PositionArg::Time(1000)));
        assert_eq!(
            parse_position("time:1970-01-01T00:00:01Z"),
            Ok(PositionArg::Time(1000))
        );
        let before = time::OffsetDateTime::now_utc().unix_timestamp() * 1000;
        let Ok(PositionArg::Time(ago)) = parse_position("time:-5m") else {
            panic!("time:-5m is a time five minutes ago")
        };
        let after = time::OffsetDateTime::now_utc().unix_timestamp() * 1000 + 1000;
        assert!((before - 300_000..=after - 300_000).contains(&ago), "{ago}");
        for bad in [
            "seq:-1",
            "seq:x",
            "offset:-3",
            "time:yesterday",
            "time:-5 minutes",
            "time:-m",
            "middle",
            "page:3",
        ] {
            assert!(parse_position(bad).is_err(), "{bad}");
        }
        let cli = parse(&["receive", "h", "--from", "seq:5", "--exclusive", "-n", "3"]).unwrap();
        let Command::Receive(r) = cli.command else {
            panic!("receive")
        };
        assert_eq!(
            r.from.to_position(r.exclusive),
            EventPosition::SequenceNumber {
                sequence_number: 5,
                inclusive: false
            }
        );
        assert_eq!(r.count, Some(3));
    }

    #[test]
    fn durations_sizes_and_retention() {
        assert_eq!(parse_duration_ms("30s"), Ok(30_000));
        assert_eq!(parse_duration_ms("7d"), Ok(7 * 86_400_000));
        assert!(parse_duration_ms("0s").is_err());
        assert!(parse_duration_ms("10y").is_err());
        assert_eq!(parse_bytes("10GiB"), Ok(10 << 30));
        assert_eq!(parse_bytes("512"), Ok(512));
        assert!(parse_bytes("1PB").is_err());
        assert_eq!(parse_retention("forever"), Ok(RetentionAge(None)));
        let cli = parse(&["hub", "create", "h", "-p", "8", "--retention", "2h"]).unwrap();
        let Command::Hub(HubArgs {
            command:
                HubCommand::Create {
                    partitions,
                    retention,
                    ..
                },
            ..
        }) = cli.command
        else {
            panic!("hub create")
        };
        assert_eq!(partitions, 8);
        assert_eq!(retention, RetentionAge(Some(7_200_000)));
    }

    #[test]
    fn cleanup_flags() {
        assert_eq!(parse_duration_or_zero_ms("0"), Ok(0));
        assert_eq!(parse_duration_or_zero_ms("0s"), Ok(0));
        assert_eq!(parse_duration_or_zero_ms("10m"), Ok(600_000));
        assert!(parse_duration_or_zero_ms("-1s").is_err());
        assert!(parse_duration_or_zero_ms("").is_err());
        let cli = parse(&["hub", "create", "t", "--cleanup-policy", "compact"]).unwrap();
        let Command::Hub(HubArgs {
            command: HubCommand::Create { cleanup, .. },
            ..
        }) = cli.command
        else {
            panic!("hub create")
        };
        assert_eq!(cleanup.cleanup_policy, CleanupPolicy::Compact);
        assert_eq!(cleanup.min_compaction_lag, 0);
        assert_eq!(cleanup.tombstone_retention, 86_400_000);
        assert!(parse(&["hub", "create", "t", "--cleanup-policy", "shred"]).is_err());
        let cli = parse(&[
            "hub",
            "update",
            "t",
            "--cleanup-policy",
            "DeleteOrCompact",
            "--min-compaction-lag",
            "5m",
            "--retention-bytes",
            "none",
        ])
        .unwrap();
        let Command::Hub(HubArgs {
            command:
                HubCommand::Update {
                    cleanup_policy,
                    min_compaction_lag,
                    retention_bytes,
                    retention,
                    tombstone_retention,
                    ..
                },
            ..
        }) = cli.command
        else {
            panic!("hub update")
        };
        assert_eq!(cleanup_policy, Some(CleanupPolicy::DeleteOrCompact));
        assert_eq!(min_compaction_lag, Some(300_000));
        assert_eq!(retention_bytes, Some(RetentionBytes(None)));
        assert_eq!((retention, tombstone_retention), (None, None));
    }

    #[test]
    fn policy_flags() {
        use tributary_amqp::Right;
        use tributary_amqp::policies::KeyType;
        let cli = parse(&[
            "policy",
            "create",
            "p",
            "--hub",
            "h",
            "--rights",
            "send,Listen",
        ])
        .unwrap();
        let Command::Policy(PolicyArgs {
            command: PolicyCommand::Create { target, rights },
            ..
        }) = cli.command
        else {
            panic!("policy create")
        };
        assert_eq!(
            (target.name.as_str(), target.hub.as_deref()),
            ("p", Some("h"))
        );
        assert_eq!(rights, vec![Right::Send, Right::Listen]);
        let cli = parse(&["policy", "rotate", "p", "--key", "secondary"]).unwrap();
        let Command::Policy(PolicyArgs {
            command: PolicyCommand::Rotate { target, key },
            ..
        }) = cli.command
        else {
            panic!("policy rotate")
        };
        assert_eq!((target.hub, key), (None, KeyType::Secondary));
        assert!(parse(&["policy", "rotate", "p", "--key", "tertiary"]).is_err());
        assert!(parse(&["policy", "create", "p", "--rights", "Own"]).is_err());
        assert!(
            parse(&["policy", "create", "p"]).is_err(),
            "rights are required"
        );
    }
}
