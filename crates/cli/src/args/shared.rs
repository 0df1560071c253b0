//! The flags several commands share, each defined once and flattened into the commands that read
//! it, under a help heading of its own: "Data directory" (`--data-dir`, `--durability`,
//! `--event-bytes-max`) and "Connection" (`--connection-string`, `--ca-file`, the alias flags).
//! A command's `--help` lists only the groups it uses.
//!
//! [`GlobalArgs`] is what a command runs with: the groups it took, and for the groups it did not
//! take their defaults (it never reads them). Scripts written when these flags were global put
//! them before the command (`tributary --data-dir D send …`); [`super::command`] still accepts
//! that, for the commands that take the flag.

use std::path::PathBuf;

use clap::Args;
use tributary_log::{Durability, SyncScope};

use super::AliasArgs;
use super::parse_durability;

/// The data directory when neither --data-dir nor TRIBUTARY_DATA_DIR names one.
pub const DATA_DIR_DEFAULT: &str = "tributary-data";

/// The help heading of the data directory's flags.
pub const DATA_HEADING: &str = "Data directory";

/// The help heading of the flags that say how to reach a remote hub.
pub const CONNECTION_HEADING: &str = "Connection";

/// `--data-dir`, alone: for the commands that only find files there.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = DATA_HEADING)]
pub struct DataDirArgs {
    /// The data directory: the catalog, every hub's partitions. Only one process may use it.
    #[arg(long, global = true, env = "TRIBUTARY_DATA_DIR", default_value = DATA_DIR_DEFAULT)]
    pub data_dir: PathBuf,
}

/// `--durability` and `--sync-scope`: for `demo`, whose hub lives in a directory of its own,
/// and (through [`DataArgs`]) every command that opens the data directory.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = DATA_HEADING)]
pub struct DurabilityArgs {
    /// When appends are acknowledged: `fsync` (after fdatasync, group-committed; survives power
    /// loss), `interval:<ms>` (synced every <ms>), or `none` (left to the OS).
    #[arg(long, global = true, env = "TRIBUTARY_DURABILITY", default_value_t = Durability::Fsync, value_parser = parse_durability)]
    pub durability: Durability,
    #[command(flatten)]
    pub sync_scope: SyncScopeArgs,
}

/// `--sync-scope`: what one sync of `fsync` appends covers.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = DATA_HEADING)]
pub struct SyncScopeArgs {
    /// What one sync covers with `--durability fsync`: `file` (an fdatasync per partition's
    /// file) or `filesystem` (when more partitions' appends wait at the same moment than there
    /// are sync threads, they share one syncfs of the data directory's file system: far fewer
    /// device flushes across hundreds of partitions; it also flushes every other program's
    /// files on that file system, so give the data directory a file system of its own).
    #[arg(long, global = true, env = "TRIBUTARY_SYNC_SCOPE", default_value_t = SyncScope::File)]
    pub sync_scope: SyncScope,
}

/// The data directory and how its partitions are written: for the commands that open it (or
/// reach the `tributary serve` running on it).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = DATA_HEADING)]
pub struct DataArgs {
    #[command(flatten)]
    pub dir: DataDirArgs,
    #[command(flatten)]
    pub durability: DurabilityArgs,
    /// The largest event accepted, in bytes.
    #[arg(long, global = true, default_value_t = tributary_log::limits::EVENT_BYTES_MAX_DEFAULT)]
    pub event_bytes_max: u32,
}

/// `--ca-file`: for every command that may connect to a hub over TLS.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = CONNECTION_HEADING)]
pub struct TrustArgs {
    /// A PEM file of certificate authorities to trust, besides the usual roots, when connecting
    /// to a hub over TLS (`--connection-string` without UseDevelopmentEmulator, or an
    /// `--admin-url https://…`): a local hub's development authority from `tributary cert`,
    /// for instance.
    #[arg(long, global = true, env = "TRIBUTARY_CA_FILE", value_name = "PEM")]
    pub ca_file: Option<PathBuf>,
}

/// How `send`, `receive`, `process` and `ownership` reach a remote hub instead of the data
/// directory's.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = CONNECTION_HEADING)]
pub struct ConnectionArgs {
    /// Use a remote hub — a Tributary hub's AMQP front door or Azure Event Hubs — instead of
    /// the data directory's (or the `tributary serve` running on it).
    #[arg(long, env = "TRIBUTARY_CONNECTION_STRING", hide_env_values = true)]
    pub connection_string: Option<String>,
    #[command(flatten)]
    pub trust: TrustArgs,
    #[command(flatten)]
    pub alias: AliasArgs,
}

/// What a command runs with: the shared flags it takes, and the defaults of those it does not.
#[derive(Debug, Clone)]
pub struct GlobalArgs {
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// `--durability`.
    pub durability: Durability,
    /// `--sync-scope`.
    pub sync_scope: SyncScope,
    /// `--event-bytes-max`.
    pub event_bytes_max: u32,
    /// `--log`.
    pub log: String,
    /// `--ca-file`.
    pub ca_file: Option<PathBuf>,
    /// The alias flags.
    pub alias: AliasArgs,
}

impl GlobalArgs {
    /// Every shared flag at its default, with the log filter `log`.
    pub fn new(log: &str) -> GlobalArgs {
        GlobalArgs {
            data_dir: PathBuf::from(DATA_DIR_DEFAULT),
            durability: Durability::default(),
            sync_scope: SyncScope::default(),
            event_bytes_max: tributary_log::limits::EVENT_BYTES_MAX_DEFAULT,
            log: log.to_owned(),
            ca_file: None,
            alias: AliasArgs::default(),
        }
    }

    /// With the data directory `dir`.
    pub fn with_dir(mut self, dir: &DataDirArgs) -> GlobalArgs {
        self.data_dir.clone_from(&dir.data_dir);
        self
    }

    /// With the durability `durability`.
    pub fn with_durability(mut self, durability: &DurabilityArgs) -> GlobalArgs {
        self.durability = durability.durability;
        self.sync_scope = durability.sync_scope.sync_scope;
        self
    }

    /// With the data directory's flags `data`.
    pub fn with_data(self, data: &DataArgs) -> GlobalArgs {
        let mut with = self.with_dir(&data.dir).with_durability(&data.durability);
        with.event_bytes_max = data.event_bytes_max;
        with
    }

    /// With the authorities `trust`.
    pub fn with_trust(mut self, trust: &TrustArgs) -> GlobalArgs {
        self.ca_file.clone_from(&trust.ca_file);
        self
    }

    /// With the alias flags `alias`.
    pub fn with_alias(mut self, alias: &AliasArgs) -> GlobalArgs {
        self.alias = alias.clone();
        self
    }

    /// With the connection flags `connection` (the connection string stays with the command).
    pub fn with_connection(self, connection: &ConnectionArgs) -> GlobalArgs {
        self.with_trust(&connection.trust)
            .with_alias(&connection.alias)
    }
}
