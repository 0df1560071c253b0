//! The task file: a declarative TOML description of one replication task, read and checked
//! completely before anything starts.
//!
//! ```toml
//! name = "orders-to-backup"            # names the task's metrics and status
//!
//! [source]                             # read as a consumer group, with leases and checkpoints
//! connection_string_env = "SOURCE_CS"  # or connection_string = "Endpoint=sb://…", or data_dir = "…"
//! event_hub = "orders"
//! consumer_group = "$Default"          # default $Default; give each task its own in production
//! initial_position = "earliest"        # where a partition without a checkpoint starts:
//!                                      # earliest, latest or an RFC 3339 time
//! checkpoint_store = "orders.sqlite"   # shared by every process running this task (default:
//!                                      # <task file name>.checkpoints.sqlite beside the file)
//! batch_events_max = 1000
//!
//! [[target]]                           # one target copies; several route
//! name = "backup"
//! connection_string_env = "BACKUP_CS"
//! event_hub = "orders"
//! alias_file = "backup.alias"          # any hub reached by connection string may name an alias:
//!                                      # a file holding host[:port], or alias_srv = "NAME" (DNS
//!                                      # SRV _azure_eventhub._amqp.NAME; dns_server = "IP:PORT");
//!                                      # the key stays the connection string's. The task follows
//!                                      # the alias when it changes, or after failover_failures
//!                                      # (default 3) failed connections or failover_after
//!                                      # (default "10s") without one. No offset-map syncs are
//!                                      # taken for an aliased target (its hub may change)
//! keep_partition = true                # keyless events keep their partition number (needs
//!                                      # equal partition counts); keyed ones always go by key
//! when = "user.kind = 'alarm'"         # a routing condition (default: every event); the
//!                                      # condition language is tributary_edit::condition's
//!
//! [[target]]                           # kind = "postgres": a table instead of a hub (the
//! name = "orders-table"                # postgres feature; crate::projection::config lists
//! kind = "postgres"                    # its keys: url or url_env, table, shape, keyless,
//! url_env = "ORDERS_DB"                # backoff_max, [target.columns]); when routes to it as
//! table = "orders"                     # to a hub
//! shape = "history"
//! backoff_max = "30s"                  # a failed write is retried without end, the pause
//!                                      # doubling from [retry] backoff_min up to this
//!                                      # (default: [retry] backoff_max)
//!
//! [[step]]                             # the editor: steps run in file order on each batch,
//! kind = "filter"                      # before routing (tributary_edit lists every kind and
//! when = "body.temperature > 30"       # its keys); kind = "custom" with a name runs a step
//!                                      # the library user registered (StartOptions::steps)
//!
//! [dead_letter]                        # where events a target refuses go, with the reason
//! data_dir = "/var/lib/tributary"
//! event_hub = "replication-dead-letters"
//!
//! [routing]
//! unmatched = "drop"                   # drop | dead-letter | <a target's name>
//!
//! [merge]
//! forward_replicated = true            # false: forward only events produced at the source
//!                                      # (what a mesh of one task per pair of hubs needs: such
//!                                      # tasks cannot see each other's copies; a mesh of one
//!                                      # task per hub, every other hub a target, needs nothing:
//!                                      # `repl-fanout` names the hubs a hop already sent to);
//!                                      # events Azure's merge sample copied in (`repl-target` =
//!                                      # the source hub) count as replicated too
//! azure_marker = false                 # true: also set `repl-target` = the target hub's name,
//!                                      # for a mesh shared with Azure's EventHubMerge functions
//!
//! [retry]                              # a failed send (or table write) is retried without
//! backoff_min = "200ms"                # end; the pause doubles from backoff_min up to
//! backoff_max = "5m"                   # backoff_max
//!
//! [processor]
//! load_balancing_interval = "500ms"
//! ownership_expiration = "5s"
//!
//! [offset_map]                         # the syncs `tributary failover translate-checkpoints`
//! every_events = 10000                 # reads: one per source partition once the task read a
//! every = "10s"                        # batch and the prefetch there, then after this many
//!                                      # events or this long, whichever comes first, and every
//!                                      # `every` while it is idle (an empty partition too). A
//!                                      # translated checkpoint replays about one sync's worth
//!                                      # of events per partition; each sync asks every target
//!                                      # partition (with keep_partition: the one) its newest
//!                                      # sequence number and writes a transaction
//!
//! [metrics]
//! listen = "127.0.0.1:9464"            # Prometheus text at /metrics
//! ```
//!
//! `kind = "kafka"` in `[source]` or a `[[target]]` reads or writes a Kafka topic instead of a
//! hub ([`kafka`] lists its keys).
//!
//! Every table refuses keys it does not know. An error names the file, the line and the key,
//! and what would be accepted; a secret (a connection string's key) never appears in one.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;
use tributary_client::FailoverOptions;
use tributary_edit::{CompileContext, Condition, Step};
use tributary_event::EventPosition;
use tributary_event::names::{validate_consumer_group_name, validate_hub_name};

use crate::limits::{
    BACKOFF_MAX_DEFAULT, BACKOFF_MIN_DEFAULT, BATCH_EVENTS_DEFAULT, TARGETS_MAX,
    TASK_NAME_CHARS_MAX,
};
use crate::offset_map::SyncPolicy;

pub mod kafka;
pub use kafka::KafkaConnection;

/// A task file that could not be used: where, which key, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}: {key}: {message}", file.display(), line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct TaskError {
    /// The task file.
    pub file: PathBuf,
    /// The line (1-based), when the error is about one place.
    pub line: Option<usize>,
    /// The key (a dotted path such as `target "backup".event_hub`), or `-` for the file.
    pub key: String,
    /// What is wrong and what would be accepted.
    pub message: String,
}

/// The task file as written (see the module docs for every key).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// The task's name.
    pub name: Spanned<String>,
    /// Where events are read.
    pub source: Spanned<EndpointSpec>,
    /// Where they go.
    #[serde(rename = "target", default)]
    pub targets: Vec<Spanned<EndpointSpec>>,
    /// Where refused events go.
    pub dead_letter: Option<Spanned<EndpointSpec>>,
    /// The editor's steps, in order (each table's keys are the step kind's own).
    #[serde(rename = "step", default)]
    pub steps: Vec<Spanned<toml::Table>>,
    /// What happens to events no route matches.
    #[serde(default)]
    pub routing: RoutingSpec,
    /// Merging and mirroring.
    #[serde(default)]
    pub merge: MergeSpec,
    /// Retrying sends.
    #[serde(default)]
    pub retry: RetrySpec,
    /// The processor host's balancing.
    #[serde(default)]
    pub processor: ProcessorSpec,
    /// How often the offset map records a sync.
    #[serde(default)]
    pub offset_map: OffsetMapSpec,
    /// The Prometheus endpoint.
    pub metrics: Option<MetricsSpec>,
}

/// A hub, as a source, a target or the dead-letter target. Which keys a role allows is
/// checked after parsing ([`TaskSpec`] validation names a key that does not belong).
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct EndpointSpec {
    /// A target's name (targets only).
    pub name: Option<String>,
    /// A connection string (a Tributary hub's or Azure Event Hubs').
    pub connection_string: Option<String>,
    /// The environment variable holding the connection string (keeps the key out of the file).
    pub connection_string_env: Option<String>,
    /// A data directory: the hub runs in this process.
    pub data_dir: Option<PathBuf>,
    /// The event hub.
    pub event_hub: Option<String>,
    /// A PEM file of certificates to trust for TLS (a development CA).
    pub ca_file: Option<PathBuf>,
    /// A file naming the hub's active endpoint (`host[:port]`), followed when it changes.
    pub alias_file: Option<PathBuf>,
    /// A DNS SRV alias: the records `_azure_eventhub._amqp.<alias_srv>` name the endpoints.
    pub alias_srv: Option<String>,
    /// The DNS server `alias_srv` asks (`IP:PORT`; default the system's).
    pub dns_server: Option<String>,
    /// Consecutive failed connection attempts before the alias is resolved again.
    pub failover_failures: Option<u32>,
    /// How long without a working connection before the alias is resolved again.
    pub failover_after: Option<Spanned<String>>,
    /// The consumer group (source only).
    pub consumer_group: Option<String>,
    /// Where partitions without a checkpoint start (source only).
    pub initial_position: Option<String>,
    /// The checkpoint store's SQLite file (source only).
    pub checkpoint_store: Option<PathBuf>,
    /// Events per batch (source only).
    pub batch_events_max: Option<u32>,
    /// Events buffered ahead (source only).
    pub prefetch: Option<u32>,
    /// The id recorded as the source hub's (source only; default: what the hub reports).
    pub origin_id: Option<String>,
    /// Keyless events keep their partition number (targets only).
    pub keep_partition: Option<bool>,
    /// The routing condition (targets only).
    pub when: Option<Spanned<String>>,
    /// A target's kind: `hub` (default) or `postgres` (a projection).
    pub kind: Option<String>,
    /// A postgres target's database URL.
    pub url: Option<String>,
    /// The environment variable holding it.
    pub url_env: Option<String>,
    /// A postgres target's table.
    pub table: Option<String>,
    /// A postgres target's shape: `history` or `compacted`.
    pub shape: Option<String>,
    /// What a compacted table does with keyless events: `history` or `refuse`.
    pub keyless: Option<String>,
    /// Body fields mapped to typed columns.
    pub columns: Option<toml::Table>,
    /// The longest pause between tries of a postgres target's failed write.
    pub backoff_max: Option<Spanned<String>>,
    /// A Kafka endpoint's bootstrap servers (`kind = "kafka"`, [`kafka`]).
    pub bootstrap_servers: Option<String>,
    /// A Kafka endpoint's topic.
    pub topic: Option<String>,
    /// A Kafka endpoint's SASL mechanism: PLAIN (default), SCRAM-SHA-256 or SCRAM-SHA-512.
    pub sasl_mechanism: Option<String>,
    /// A Kafka endpoint's SASL user name.
    pub sasl_username: Option<String>,
    /// The environment variable holding a Kafka endpoint's SASL password.
    pub sasl_password_env: Option<String>,
    /// Whether a Kafka endpoint is reached over TLS.
    pub tls: Option<bool>,
}

/// `[routing]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RoutingSpec {
    /// `drop` (default), `dead-letter`, or a target's name.
    pub unmatched: Option<Spanned<String>>,
}

/// `[merge]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MergeSpec {
    /// Whether events replicated into the source are forwarded too (default true).
    #[serde(default = "yes")]
    pub forward_replicated: bool,
    /// Whether each forwarded event also gets Azure's merge marker (`repl-target`, the target
    /// hub's name), for a mesh shared with Azure's `EventHubMerge` functions (default false).
    #[serde(default)]
    pub azure_marker: bool,
}

fn yes() -> bool {
    true
}

impl Default for MergeSpec {
    fn default() -> Self {
        MergeSpec {
            forward_replicated: true,
            azure_marker: false,
        }
    }
}

/// `[retry]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RetrySpec {
    /// The first pause, e.g. `"200ms"`.
    pub backoff_min: Option<Spanned<String>>,
    /// The longest pause, e.g. `"5m"`.
    pub backoff_max: Option<Spanned<String>>,
}

/// `[processor]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ProcessorSpec {
    /// How often ownership is renewed and balanced.
    pub load_balancing_interval: Option<Spanned<String>>,
    /// How long a process that stops renewing keeps its partitions.
    pub ownership_expiration: Option<Spanned<String>>,
    /// This process's name among the task's processes (default: generated).
    pub host_name: Option<String>,
}

/// `[offset_map]`.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct OffsetMapSpec {
    /// A sync after this many source events.
    pub every_events: Option<Spanned<i64>>,
    /// Or after this long, e.g. `"10s"`.
    pub every: Option<Spanned<String>>,
}

/// `[metrics]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSpec {
    /// Where to serve `/metrics`.
    pub listen: Spanned<String>,
}

/// How an endpoint is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    /// Over AMQP with this connection string.
    Remote {
        /// The connection string (holds a secret: never print it).
        connection_string: String,
        /// Certificates to trust.
        ca_file: Option<PathBuf>,
        /// The alias naming where the hub is, when one does (its endpoint is then the
        /// connection string's only in name).
        failover: Option<FailoverOptions>,
    },
    /// In this process, on this data directory.
    Local {
        /// The data directory.
        data_dir: PathBuf,
    },
    /// A Kafka cluster (`kind = "kafka"`); the endpoint's `event_hub` is the topic.
    Kafka(Box<KafkaConnection>),
}

/// A checked endpoint.
#[derive(Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// How it is reached.
    pub connection: Connection,
    /// The event hub.
    pub event_hub: String,
    /// Where it is in the task file, for errors found when it is opened.
    pub key: String,
    /// Its line in the task file.
    pub line: usize,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let how = match &self.connection {
            Connection::Remote { .. } => "remote".to_owned(),
            Connection::Local { data_dir } => format!("local {}", data_dir.display()),
            Connection::Kafka(kafka) => format!("kafka {}", kafka.bootstrap_servers),
        };
        f.debug_struct("Endpoint")
            .field("connection", &how)
            .field("event_hub", &self.event_hub)
            .field("key", &self.key)
            .finish()
    }
}

/// The source, checked.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// The hub.
    pub endpoint: Endpoint,
    /// The consumer group.
    pub consumer_group: String,
    /// Where partitions without a checkpoint start.
    pub initial_position: EventPosition,
    /// The checkpoint store's file.
    pub checkpoint_store: PathBuf,
    /// Events per batch.
    pub batch_events_max: u32,
    /// Events buffered ahead.
    pub prefetch: u32,
    /// The origin id to record, if set in the file.
    pub origin_id: Option<String>,
}

/// A target, checked.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// Its name.
    pub name: String,
    /// What it is.
    pub kind: TargetKind,
    /// The routing condition (compiled from the task file's `when`).
    pub when: Option<Condition>,
    /// Where it is in the task file (`target "NAME"`), for errors found when it is opened.
    pub key: String,
    /// Its line in the task file.
    pub line: usize,
}

/// What a target is.
#[derive(Debug, Clone)]
pub enum TargetKind {
    /// An event hub.
    Hub {
        /// The hub.
        endpoint: Endpoint,
        /// Whether keyless events keep their partition number.
        keep_partition: bool,
    },
    /// A PostgreSQL table (`kind = "postgres"`, [`crate::projection`]).
    #[cfg(feature = "postgres")]
    Postgres(Box<crate::projection::config::ProjectionConfig>),
}

/// One editor step of a task, as the task file names it.
#[derive(Debug, Clone)]
pub enum StepPlan {
    /// A built-in step, compiled.
    BuiltIn(Arc<dyn Step>),
    /// `kind = "custom"`: the step the library user registers under `name` when the task
    /// starts ([`crate::StartOptions::steps`]).
    Custom {
        /// The name it is registered under.
        name: String,
        /// Its table's line, for the error when nothing is registered under the name.
        line: usize,
    },
}

/// What happens to events no route matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unmatched {
    /// Dropped and counted.
    Drop,
    /// Sent to the dead-letter target.
    DeadLetter,
    /// Sent to the target at this index.
    Target(usize),
}

/// A task file, read and checked.
#[derive(Debug, Clone)]
pub struct TaskConfig {
    /// The file it came from.
    pub file: PathBuf,
    /// The task's name.
    pub name: String,
    /// The source.
    pub source: SourceConfig,
    /// The targets (routes), in file order.
    pub targets: Vec<TargetConfig>,
    /// The dead-letter target.
    pub dead_letter: Option<Endpoint>,
    /// The editor's steps, in order.
    pub steps: Vec<StepPlan>,
    /// Events no route matches.
    pub unmatched: Unmatched,
    /// Whether events replicated into the source are forwarded.
    pub forward_replicated: bool,
    /// Whether forwarded events get Azure's merge marker `repl-target`.
    pub azure_marker: bool,
    /// The first retry pause.
    pub backoff_min: Duration,
    /// The longest retry pause.
    pub backoff_max: Duration,
    /// Balancing interval, if set.
    pub load_balancing_interval: Option<Duration>,
    /// Ownership expiration, if set.
    pub ownership_expiration: Option<Duration>,
    /// This process's name, if set.
    pub host_name: Option<String>,
    /// How often each source partition records an offset sync.
    pub offset_sync: SyncPolicy,
    /// Where to serve metrics.
    pub metrics_listen: Option<SocketAddr>,
}

/// Checks a parsed file; every error carries the file, a line and the key.
pub(crate) struct Checker<'a> {
    file: &'a Path,
    text: &'a str,
}

impl Checker<'_> {
    fn line_of(&self, span: Range<usize>) -> usize {
        let end = span.start.min(self.text.len());
        self.text[..end].bytes().filter(|b| *b == b'\n').count() + 1
    }

    pub(crate) fn error(
        &self,
        span: Range<usize>,
        key: &str,
        message: impl Into<String>,
    ) -> TaskError {
        TaskError {
            file: self.file.to_owned(),
            line: Some(self.line_of(span)),
            key: key.to_owned(),
            message: message.into(),
        }
    }

    /// A TOML error (a syntax error, or a value of the wrong type) about `key`.
    fn toml_error(&self, error: &toml::de::Error, key: &str) -> TaskError {
        TaskError {
            file: self.file.to_owned(),
            line: error.span().map(|span| self.line_of(span)),
            key: key.to_owned(),
            message: error.message().to_owned(),
        }
    }

    /// A deserialization error, naming the dotted key it is about. An unknown key in an
    /// endpoint table is answered with the keys that table takes in its role, and the one it
    /// was probably meant to be.
    fn deserialize_error(&self, error: &serde_path_to_error::Error<toml::de::Error>) -> TaskError {
        let key = dotted_key(error.path());
        let mut task_error = self.toml_error(error.inner(), &key);
        if !error.inner().message().starts_with("unknown field") {
            return task_error;
        }
        let table = key.split(['.', '[']).next().unwrap_or_default();
        let unknown = key.rsplit('.').next().unwrap_or_default();
        let meant = match keys_of_endpoint(table) {
            Some((sentence, keys)) => {
                task_error.message = format!("unknown key {unknown:?}; {sentence}");
                closest_key(unknown, keys)
            }
            // The parser lists the table's keys in backquotes.
            None => closest_key(
                unknown,
                error.inner().message().split('`').skip(3).step_by(2),
            ),
        };
        if let Some(meant) = meant {
            task_error.message = format!("{} (did you mean {meant}?)", task_error.message);
        }
        task_error
    }

    pub(crate) fn duration(
        &self,
        value: &Option<Spanned<String>>,
        key: &str,
    ) -> Result<Option<Duration>, TaskError> {
        let Some(value) = value else { return Ok(None) };
        humantime::parse_duration(value.get_ref())
            .map(Some)
            .map_err(|e| {
                self.error(
                    value.span(),
                    key,
                    format!(
                        "{:?} is not a duration such as \"500ms\" or \"5m\": {e}",
                        value.get_ref()
                    ),
                )
            })
    }
}

impl TaskConfig {
    /// Reads and checks the task file at `path`.
    pub fn load(path: &Path) -> Result<TaskConfig, TaskError> {
        let text = std::fs::read_to_string(path).map_err(|e| TaskError {
            file: path.to_owned(),
            line: None,
            key: "-".to_owned(),
            message: format!("cannot read the task file: {e}"),
        })?;
        TaskConfig::parse(path, &text)
    }

    /// Checks `text`, the contents of the task file `path` (relative paths in it are relative
    /// to the file's directory).
    pub fn parse(path: &Path, text: &str) -> Result<TaskConfig, TaskError> {
        let checker = Checker { file: path, text };
        let document = toml::Deserializer::parse(text).map_err(|e| checker.toml_error(&e, "-"))?;
        let spec: TaskSpec = serde_path_to_error::deserialize(document)
            .map_err(|e| checker.deserialize_error(&e))?;
        checker.task(&spec)
    }
}

/// The keys every hub endpoint takes, as a source, a target or the dead-letter target.
const HUB_KEYS: [&str; 10] = [
    "event_hub",
    "connection_string",
    "connection_string_env",
    "data_dir",
    "ca_file",
    "alias_file",
    "alias_srv",
    "dns_server",
    "failover_failures",
    "failover_after",
];

/// The keys only `[source]` takes.
const SOURCE_KEYS: [&str; 6] = [
    "consumer_group",
    "initial_position",
    "checkpoint_store",
    "batch_events_max",
    "prefetch",
    "origin_id",
];

/// The keys only a hub `[[target]]` takes.
const HUB_TARGET_KEYS: [&str; 4] = ["name", "kind", "keep_partition", "when"];

/// A dotted key as a task file's errors name it (`source.consumer_group`, `target[1].when`),
/// from where deserialization stopped; `-` for the file as a whole.
fn dotted_key(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut key = String::new();
    for segment in path.iter() {
        match segment {
            // `toml::Spanned` wraps a value in a table of its own: not a key of the file.
            Segment::Map { key: k } if k.starts_with("$__serde_spanned") => {}
            Segment::Map { key: k } | Segment::Enum { variant: k } => {
                if !key.is_empty() {
                    key.push('.');
                }
                key.push_str(k);
            }
            Segment::Seq { index } => key.push_str(&format!("[{index}]")),
            Segment::Unknown => {}
        }
    }
    if key.is_empty() { "-".to_owned() } else { key }
}

/// What an endpoint table takes in its role, for an unknown key in it: the sentence and the
/// keys. None for the other tables, whose parser's own list (every field of the table's type)
/// is already right.
fn keys_of_endpoint(table: &str) -> Option<(String, Vec<&'static str>)> {
    let hub_and = |own: &[&'static str]| [&HUB_KEYS[..], own].concat();
    match table {
        "source" => {
            let keys = hub_and(&SOURCE_KEYS);
            let sentence = format!(
                "[source] takes {}; with kind = \"kafka\": {}",
                keys.join(", "),
                kafka::KAFKA_KEYS.join(", ")
            );
            Some((sentence, [keys, kafka::KAFKA_KEYS.to_vec()].concat()))
        }
        "dead_letter" => Some((
            format!("[dead_letter] takes {}", HUB_KEYS.join(", ")),
            HUB_KEYS.to_vec(),
        )),
        "target" => {
            let hub = hub_and(&HUB_TARGET_KEYS);
            let postgres = postgres_target_keys();
            let mut sentence = format!(
                "a [[target]] takes {}; with kind = \"kafka\": {}",
                hub.join(", "),
                kafka::KAFKA_KEYS.join(", ")
            );
            if !postgres.is_empty() {
                sentence.push_str(&format!(
                    "; with kind = \"postgres\": {}",
                    postgres.join(", ")
                ));
            }
            Some((
                sentence,
                [hub, postgres, kafka::KAFKA_KEYS.to_vec()].concat(),
            ))
        }
        _ => None,
    }
}

/// A postgres target's keys (none without the feature that projects into PostgreSQL).
fn postgres_target_keys() -> Vec<&'static str> {
    #[cfg(feature = "postgres")]
    return crate::projection::config::KEYS.to_vec();
    #[cfg(not(feature = "postgres"))]
    Vec::new()
}

/// The known key closest to `unknown`, when one is close enough to be a typo of it.
fn closest_key<'k>(unknown: &str, known: impl IntoIterator<Item = &'k str>) -> Option<&'k str> {
    // Jaro-Winkler weighs a shared beginning, which the misspelled and the shortened or
    // lengthened keys of a file (`consumer_gruop`, `backoff_maximum`) keep.
    known
        .into_iter()
        .map(|k| (strsim::jaro_winkler(unknown, k), k))
        .filter(|(similarity, _)| *similarity >= 0.85)
        .max_by(|(a, _), (b, _)| a.total_cmp(b))
        .map(|(_, k)| k)
}

impl Checker<'_> {
    fn base_dir(&self) -> PathBuf {
        self.file
            .parent()
            .map(Path::to_owned)
            .unwrap_or_else(|| PathBuf::from("."))
    }

    fn task(&self, spec: &TaskSpec) -> Result<TaskConfig, TaskError> {
        let name = self.task_name(&spec.name)?;
        let source = self.source(&spec.source)?;
        let targets = self.targets(&spec.targets)?;
        let dead_letter = match &spec.dead_letter {
            Some(table) => Some(self.dead_letter(table)?),
            None => None,
        };
        let unmatched = self.unmatched(&spec.routing, &targets, dead_letter.is_some())?;
        let steps = spec
            .steps
            .iter()
            .enumerate()
            .map(|(index, table)| self.step(index, table))
            .collect::<Result<Vec<_>, _>>()?;
        let backoff_min = self
            .duration(&spec.retry.backoff_min, "retry.backoff_min")?
            .unwrap_or(BACKOFF_MIN_DEFAULT);
        let backoff_max = self
            .duration(&spec.retry.backoff_max, "retry.backoff_max")?
            .unwrap_or(BACKOFF_MAX_DEFAULT);
        if backoff_min.is_zero() || backoff_min > backoff_max {
            let span = spec.retry.backoff_min.as_ref().map_or(0..0, Spanned::span);
            return Err(self.error(span, "retry.backoff_min", format!(
                "must be above zero and at most retry.backoff_max ({backoff_max:?}), not {backoff_min:?}"
            )));
        }
        let offset_sync = self.offset_sync(&spec.offset_map)?;
        let metrics_listen = match &spec.metrics {
            Some(metrics) => Some(metrics.listen.get_ref().parse().map_err(|e| {
                self.error(
                    metrics.listen.span(),
                    "metrics.listen",
                    format!(
                        "{:?} is not an address such as \"127.0.0.1:9464\": {e}",
                        metrics.listen.get_ref()
                    ),
                )
            })?),
            None => None,
        };
        Ok(TaskConfig {
            file: self.file.to_owned(),
            name,
            source,
            targets,
            dead_letter,
            steps,
            unmatched,
            forward_replicated: spec.merge.forward_replicated,
            azure_marker: spec.merge.azure_marker,
            backoff_min,
            backoff_max,
            load_balancing_interval: self.duration(
                &spec.processor.load_balancing_interval,
                "processor.load_balancing_interval",
            )?,
            ownership_expiration: self.duration(
                &spec.processor.ownership_expiration,
                "processor.ownership_expiration",
            )?,
            host_name: spec.processor.host_name.clone(),
            offset_sync,
            metrics_listen,
        })
    }

    fn offset_sync(&self, spec: &OffsetMapSpec) -> Result<SyncPolicy, TaskError> {
        let default = SyncPolicy::default();
        let every_events = match &spec.every_events {
            Some(value) if *value.get_ref() < 1 => {
                return Err(self.error(
                    value.span(),
                    "offset_map.every_events",
                    format!("must be at least 1, not {}", value.get_ref()),
                ));
            }
            Some(value) => *value.get_ref(),
            None => default.every_events,
        };
        let every = self
            .duration(&spec.every, "offset_map.every")?
            .unwrap_or(default.every);
        if every.is_zero() {
            let span = spec.every.as_ref().map_or(0..0, Spanned::span);
            return Err(self.error(span, "offset_map.every", "must be above zero"));
        }
        Ok(SyncPolicy {
            every_events,
            every,
        })
    }

    fn task_name(&self, name: &Spanned<String>) -> Result<String, TaskError> {
        let text = name.get_ref();
        let ok = !text.is_empty()
            && text.chars().count() <= TASK_NAME_CHARS_MAX
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if ok {
            Ok(text.clone())
        } else {
            Err(self.error(name.span(), "name", format!(
                "{text:?} is not a task name: use 1 to {TASK_NAME_CHARS_MAX} letters, digits, '-', '_' or '.'"
            )))
        }
    }

    /// The keys a role does not allow that `spec` sets.
    fn misplaced(spec: &EndpointSpec, allowed: &[&str]) -> Option<&'static str> {
        let set = [
            ("name", spec.name.is_some()),
            ("consumer_group", spec.consumer_group.is_some()),
            ("initial_position", spec.initial_position.is_some()),
            ("checkpoint_store", spec.checkpoint_store.is_some()),
            ("batch_events_max", spec.batch_events_max.is_some()),
            ("prefetch", spec.prefetch.is_some()),
            ("origin_id", spec.origin_id.is_some()),
            ("keep_partition", spec.keep_partition.is_some()),
            ("when", spec.when.is_some()),
            ("kind", spec.kind.is_some()),
            ("url", spec.url.is_some()),
            ("url_env", spec.url_env.is_some()),
            ("table", spec.table.is_some()),
            ("shape", spec.shape.is_some()),
            ("keyless", spec.keyless.is_some()),
            ("columns", spec.columns.is_some()),
            ("backoff_max", spec.backoff_max.is_some()),
            ("bootstrap_servers", spec.bootstrap_servers.is_some()),
            ("topic", spec.topic.is_some()),
            ("sasl_mechanism", spec.sasl_mechanism.is_some()),
            ("sasl_username", spec.sasl_username.is_some()),
            ("sasl_password_env", spec.sasl_password_env.is_some()),
            ("tls", spec.tls.is_some()),
        ];
        set.into_iter()
            .find(|(key, is_set)| *is_set && !allowed.contains(key))
            .map(|(key, _)| key)
    }

    fn endpoint(
        &self,
        table: &Spanned<EndpointSpec>,
        key: &str,
        allowed: &[&str],
    ) -> Result<Endpoint, TaskError> {
        let spec = table.get_ref();
        let span = table.span();
        if spec.kind.as_deref() == Some("kafka") {
            return self.kafka_endpoint(table, key, allowed);
        }
        if let Some(misplaced) = Self::misplaced(spec, allowed) {
            return Err(self.error(
                span,
                &format!("{key}.{misplaced}"),
                format!(
                    "{misplaced:?} does not belong in {key}; it takes {}",
                    [&HUB_KEYS[..], allowed].concat().join(", ")
                ),
            ));
        }
        let event_hub = spec.event_hub.clone().ok_or_else(|| {
            self.error(
                span.clone(),
                &format!("{key}.event_hub"),
                "missing: name the event hub",
            )
        })?;
        validate_hub_name(&event_hub)
            .map_err(|e| self.error(span.clone(), &format!("{key}.event_hub"), e.to_string()))?;
        let connection = self.connection(spec, span.clone(), key)?;
        Ok(Endpoint {
            connection,
            event_hub,
            key: key.to_owned(),
            line: self.line_of(span),
        })
    }

    fn connection(
        &self,
        spec: &EndpointSpec,
        span: Range<usize>,
        key: &str,
    ) -> Result<Connection, TaskError> {
        let given = [
            spec.connection_string.is_some(),
            spec.connection_string_env.is_some(),
            spec.data_dir.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err(self.error(
                span,
                key,
                "give exactly one of connection_string, connection_string_env and data_dir",
            ));
        }
        if let Some(dir) = &spec.data_dir {
            if let Some(alias_key) = Self::alias_keys(spec).first() {
                return Err(self.error(
                    span,
                    &format!("{key}.{alias_key}"),
                    "a hub in this process (data_dir) is not reached through an alias; give a connection string",
                ));
            }
            if spec.ca_file.is_some() {
                return Err(self.error(
                    span,
                    &format!("{key}.ca_file"),
                    "a hub in this process (data_dir) has no TLS to trust",
                ));
            }
            return Ok(Connection::Local {
                data_dir: self.base_dir().join(dir),
            });
        }
        let connection_string = match (&spec.connection_string, &spec.connection_string_env) {
            (Some(text), _) => text.clone(),
            (None, Some(variable)) => std::env::var(variable).map_err(|_| {
                self.error(
                    span.clone(),
                    &format!("{key}.connection_string_env"),
                    format!("the environment variable {variable:?} is not set (or not UTF-8)"),
                )
            })?,
            (None, None) => unreachable!("one of them is given"),
        };
        if let Err(e) = tributary_client::ConnectionString::parse(&connection_string) {
            return Err(self.error(span, &format!("{key}.connection_string"), e.to_string()));
        }
        Ok(Connection::Remote {
            connection_string,
            ca_file: spec.ca_file.as_ref().map(|f| self.base_dir().join(f)),
            failover: self.failover(spec, span, key)?,
        })
    }

    /// The alias keys `spec` sets.
    fn alias_keys(spec: &EndpointSpec) -> Vec<&'static str> {
        [
            ("alias_file", spec.alias_file.is_some()),
            ("alias_srv", spec.alias_srv.is_some()),
            ("dns_server", spec.dns_server.is_some()),
            ("failover_failures", spec.failover_failures.is_some()),
            ("failover_after", spec.failover_after.is_some()),
        ]
        .into_iter()
        .filter_map(|(key, set)| set.then_some(key))
        .collect()
    }

    /// The alias of a hub reached by connection string, checked as connecting would check it;
    /// an alias file must exist and name an endpoint already.
    fn failover(
        &self,
        spec: &EndpointSpec,
        span: Range<usize>,
        key: &str,
    ) -> Result<Option<FailoverOptions>, TaskError> {
        let at = |name: &str, message: String| {
            self.error(span.clone(), &format!("{key}.{name}"), message)
        };
        let options = match (&spec.alias_file, &spec.alias_srv) {
            (Some(_), Some(_)) => {
                return Err(at(
                    "alias_srv",
                    "give alias_file or alias_srv, not both".into(),
                ));
            }
            (Some(file), None) => {
                if spec.dns_server.is_some() {
                    return Err(at("dns_server", "dns_server is for alias_srv".into()));
                }
                let path = self.base_dir().join(file);
                tributary_client::failover::read_alias_file(&path)
                    .map_err(|e| at("alias_file", e.to_string()))?;
                FailoverOptions::file(path)
            }
            (None, Some(name)) => {
                let server = match &spec.dns_server {
                    Some(text) => Some(text.parse::<SocketAddr>().map_err(|e| {
                        at(
                            "dns_server",
                            format!("{text:?} is not an address such as \"10.0.0.2:53\": {e}"),
                        )
                    })?),
                    None => None,
                };
                FailoverOptions::srv(name, server)
            }
            (None, None) => {
                return match Self::alias_keys(spec).first() {
                    Some(other) => Err(at(other, "needs alias_file or alias_srv".into())),
                    None => Ok(None),
                };
            }
        };
        let mut options = options;
        if let Some(failures) = spec.failover_failures {
            if failures == 0 {
                return Err(at("failover_failures", "must be at least 1".into()));
            }
            options = options.with_failures_before_switch(failures);
        }
        let after_key = format!("{key}.failover_after");
        if let Some(after) = self.duration(&spec.failover_after, &after_key)? {
            options = options.with_unavailable_after(after);
        }
        // What is left to refuse is the SRV name.
        options
            .check()
            .map_err(|e| at("alias_srv", e.to_string()))?;
        Ok(Some(options))
    }

    fn source(&self, table: &Spanned<EndpointSpec>) -> Result<SourceConfig, TaskError> {
        let endpoint = self.endpoint(table, "source", &SOURCE_KEYS)?;
        let spec = table.get_ref();
        let span = table.span();
        let consumer_group = spec
            .consumer_group
            .clone()
            .unwrap_or_else(|| "$Default".to_owned());
        validate_consumer_group_name(&consumer_group)
            .map_err(|e| self.error(span.clone(), "source.consumer_group", e.to_string()))?;
        let initial_position = match spec.initial_position.as_deref() {
            None | Some("earliest") => EventPosition::Earliest,
            Some("latest") => EventPosition::Latest,
            Some(time) => match crate::metadata::parse_enqueued_time(time) {
                Some(ms) => EventPosition::EnqueuedTime { enqueued_time_ms: ms, inclusive: true },
                None => return Err(self.error(span, "source.initial_position", format!(
                    "{time:?} is not earliest, latest or an RFC 3339 time such as 2026-01-31T12:00:00Z"
                ))),
            },
        };
        let batch_events_max = spec.batch_events_max.unwrap_or(BATCH_EVENTS_DEFAULT);
        let prefetch = spec.prefetch.unwrap_or(batch_events_max.saturating_mul(2));
        let default_store = format!(
            "{}.checkpoints.sqlite",
            self.file
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("task")
        );
        let checkpoint_store = self.base_dir().join(
            spec.checkpoint_store
                .clone()
                .unwrap_or_else(|| default_store.into()),
        );
        if let Some(origin) = &spec.origin_id
            && (origin.is_empty() || origin.contains(crate::metadata::HOP_SEPARATOR))
        {
            return Err(self.error(
                span,
                "source.origin_id",
                "an origin id is not empty and holds no ';'",
            ));
        }
        Ok(SourceConfig {
            endpoint,
            consumer_group,
            initial_position,
            checkpoint_store,
            batch_events_max,
            prefetch,
            origin_id: spec.origin_id.clone(),
        })
    }

    fn targets(&self, tables: &[Spanned<EndpointSpec>]) -> Result<Vec<TargetConfig>, TaskError> {
        if tables.is_empty() || tables.len() > TARGETS_MAX {
            return Err(TaskError {
                file: self.file.to_owned(),
                line: None,
                key: "target".to_owned(),
                message: format!(
                    "a task has 1 to {TARGETS_MAX} [[target]] tables, not {}",
                    tables.len()
                ),
            });
        }
        let mut targets: Vec<TargetConfig> = Vec::with_capacity(tables.len());
        for table in tables {
            let spec = table.get_ref();
            let Some(name) = spec.name.clone().filter(|n| !n.is_empty()) else {
                return Err(self.error(
                    table.span(),
                    "target.name",
                    "missing: give every target a name",
                ));
            };
            let key = format!("target {name:?}");
            if targets.iter().any(|t| t.name == name) {
                return Err(self.error(
                    table.span(),
                    &format!("{key}.name"),
                    "another target has this name",
                ));
            }
            let kind = self.target_kind(table, &key)?;
            let when =
                match &spec.when {
                    Some(text) => Some(Condition::parse(text.get_ref()).map_err(|e| {
                        self.error(text.span(), &format!("{key}.when"), e.to_string())
                    })?),
                    None => None,
                };
            targets.push(TargetConfig {
                name,
                kind,
                when,
                line: self.line_of(table.span()),
                key,
            });
        }
        Ok(targets)
    }

    /// What the target `table` (named by `key`) is: a hub, or with `kind = "postgres"` a table.
    fn target_kind(
        &self,
        table: &Spanned<EndpointSpec>,
        key: &str,
    ) -> Result<TargetKind, TaskError> {
        let spec = table.get_ref();
        match spec.kind.as_deref() {
            None | Some("hub") => {
                let endpoint = self.endpoint(table, key, &HUB_TARGET_KEYS)?;
                Ok(TargetKind::Hub {
                    endpoint,
                    keep_partition: spec.keep_partition.unwrap_or(false),
                })
            }
            Some("postgres") => self.postgres_target(table, key),
            Some("kafka") => Ok(TargetKind::Hub {
                endpoint: self.kafka_endpoint(table, key, &HUB_TARGET_KEYS)?,
                keep_partition: spec.keep_partition.unwrap_or(false),
            }),
            Some(other) => Err(self.error(
                table.span(),
                &format!("{key}.kind"),
                format!("{other:?} is not \"hub\", \"kafka\" or \"postgres\""),
            )),
        }
    }

    #[cfg(feature = "postgres")]
    fn postgres_target(
        &self,
        table: &Spanned<EndpointSpec>,
        key: &str,
    ) -> Result<TargetKind, TaskError> {
        let spec = table.get_ref();
        let keys = crate::projection::config::KEYS;
        let hub_keys = [
            ("connection_string", spec.connection_string.is_some()),
            (
                "connection_string_env",
                spec.connection_string_env.is_some(),
            ),
            ("data_dir", spec.data_dir.is_some()),
            ("event_hub", spec.event_hub.is_some()),
            ("ca_file", spec.ca_file.is_some()),
        ];
        let alias_keys = Self::alias_keys(spec);
        let misplaced = hub_keys
            .into_iter()
            .find(|(_, set)| *set)
            .map(|(k, _)| k)
            .or_else(|| alias_keys.first().copied())
            .or_else(|| Self::misplaced(spec, &keys));
        if let Some(misplaced) = misplaced {
            return Err(self.error(
                table.span(),
                &format!("{key}.{misplaced}"),
                format!(
                    "{misplaced:?} does not belong in a postgres target; it takes {}",
                    keys.join(", ")
                ),
            ));
        }
        let config = self.projection(spec, table.span(), key)?;
        Ok(TargetKind::Postgres(Box::new(config)))
    }

    #[cfg(not(feature = "postgres"))]
    fn postgres_target(
        &self,
        table: &Spanned<EndpointSpec>,
        key: &str,
    ) -> Result<TargetKind, TaskError> {
        Err(self.error(
            table.span(),
            &format!("{key}.kind"),
            "this build has no PostgreSQL projection: build tributary-replicate with its postgres feature",
        ))
    }

    /// Compiles the `index`-th `[[step]]` table (reading the files it names).
    fn step(&self, index: usize, table: &Spanned<toml::Table>) -> Result<StepPlan, TaskError> {
        let span = table.span();
        let mut keys = table.get_ref().clone();
        let text = |key: &str, keys: &mut toml::Table| match keys.remove(key) {
            None => Ok(None),
            Some(toml::Value::String(text)) => Ok(Some(text)),
            Some(other) => Err(self.error(
                span.clone(),
                &format!("step[{index}].{key}"),
                format!("must be a string, not {}", other.type_str()),
            )),
        };
        let Some(kind) = text("kind", &mut keys)? else {
            return Err(self.error(
                span,
                &format!("step[{index}].kind"),
                format!(
                    "missing: name the step's kind, one of {} (or \"custom\")",
                    tributary_edit::KINDS.join(", ")
                ),
            ));
        };
        let name = text("name", &mut keys)?;
        let label = format!("step {:?}", name.as_deref().unwrap_or(&kind));
        if kind == "custom" {
            let Some(name) = name else {
                return Err(self.error(
                    span,
                    &format!("{label}.name"),
                    "a custom step is named: give the name its step is registered under",
                ));
            };
            if let Some(key) = keys.keys().next() {
                return Err(self.error(
                    span,
                    &format!("{label}.{key}"),
                    "a custom step takes only kind and name; configure it in code",
                ));
            }
            return Ok(StepPlan::Custom {
                name,
                line: self.line_of(span),
            });
        }
        let context = CompileContext::new(self.base_dir());
        tributary_edit::compile(&kind, name.as_deref(), toml::Value::Table(keys), &context)
            .map(StepPlan::BuiltIn)
            .map_err(|e| {
                let key = e
                    .key
                    .as_ref()
                    .map_or(label.clone(), |k| format!("{label}.{k}"));
                self.error(span, &key, e.message)
            })
    }

    fn dead_letter(&self, table: &Spanned<EndpointSpec>) -> Result<Endpoint, TaskError> {
        self.endpoint(table, "dead_letter", &[])
    }

    fn unmatched(
        &self,
        routing: &RoutingSpec,
        targets: &[TargetConfig],
        has_dead_letter: bool,
    ) -> Result<Unmatched, TaskError> {
        let Some(value) = &routing.unmatched else {
            return Ok(Unmatched::Drop);
        };
        match value.get_ref().as_str() {
            "drop" => Ok(Unmatched::Drop),
            "dead-letter" if has_dead_letter => Ok(Unmatched::DeadLetter),
            "dead-letter" => Err(self.error(
                value.span(),
                "routing.unmatched",
                "\"dead-letter\" needs a [dead_letter] table",
            )),
            name => targets
                .iter()
                .position(|t| t.name == name)
                .map(Unmatched::Target)
                .ok_or_else(|| {
                    let names: Vec<&str> = targets.iter().map(|t| t.name.as_str()).collect();
                    self.error(
                        value.span(),
                        "routing.unmatched",
                        format!(
                            "{name:?} is not \"drop\", \"dead-letter\" or a target's name ({})",
                            names.join(", ")
                        ),
                    )
                }),
        }
    }
}
