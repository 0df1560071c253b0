//! `tributary failover` (show and switch a file-based hub alias; translate checkpoints for a
//! replica) and the alias flags every command that connects to a remote hub takes
//! (`--alias-file`, `--alias-srv`, `--dns-server`), under the "Connection" help heading.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use tributary_client::{AliasEndpoint, FailoverOptions};

use super::parse_duration_ms;
use super::shared::CONNECTION_HEADING;

/// The default of --failover-failures.
const FAILOVER_FAILURES_DEFAULT: u32 = 3;

/// The default of --failover-after.
const FAILOVER_AFTER_DEFAULT: &str = "10s";

/// Where a remote hub's active endpoint comes from, instead of the connection string's
/// `Endpoint` (whose key is still the one used). See `tributary_client::failover`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = CONNECTION_HEADING)]
pub struct AliasArgs {
    /// Connect to the endpoint this file names (`host[:port]`, never a secret), and follow it
    /// when it changes (`tributary failover switch` rewrites it). With --connection-string,
    /// whose key is used on that endpoint.
    #[arg(long, global = true, value_name = "PATH")]
    pub alias_file: Option<PathBuf>,
    /// Connect where the DNS SRV records `_azure_eventhub._amqp.<NAME>` point: the lowest
    /// priority first, by weight within one; the next when one is unreachable. With
    /// --connection-string.
    #[arg(long, global = true, value_name = "NAME")]
    pub alias_srv: Option<String>,
    /// The DNS server that answers --alias-srv, `IP:PORT` (default: the system's).
    #[arg(long, global = true, value_name = "IP:PORT")]
    pub dns_server: Option<SocketAddr>,
    /// With an alias: consecutive failed connection attempts after which it is resolved again.
    #[arg(long, global = true, default_value_t = FAILOVER_FAILURES_DEFAULT)]
    pub failover_failures: u32,
    /// With an alias: how long without a working connection before it is resolved again.
    #[arg(long, global = true, default_value = FAILOVER_AFTER_DEFAULT, value_parser = parse_duration_ms)]
    pub failover_after: i64,
}

impl Default for AliasArgs {
    /// No alias, and the thresholds' defaults.
    fn default() -> AliasArgs {
        AliasArgs {
            alias_file: None,
            alias_srv: None,
            dns_server: None,
            failover_failures: FAILOVER_FAILURES_DEFAULT,
            failover_after: parse_duration_ms(FAILOVER_AFTER_DEFAULT)
                .expect("the default of --failover-after parses"),
        }
    }
}

impl AliasArgs {
    /// The client's failover options, if an alias is given; an error for contradictory flags.
    pub fn failover_options(&self) -> anyhow::Result<Option<FailoverOptions>> {
        let options = match (&self.alias_file, &self.alias_srv) {
            (Some(_), Some(_)) => anyhow::bail!("give --alias-file or --alias-srv, not both"),
            (Some(path), None) => FailoverOptions::file(path),
            (None, Some(name)) => FailoverOptions::srv(name, self.dns_server),
            (None, None) => {
                anyhow::ensure!(self.dns_server.is_none(), "--dns-server is for --alias-srv");
                return Ok(None);
            }
        };
        anyhow::ensure!(
            self.failover_failures >= 1,
            "--failover-failures must be at least 1"
        );
        let after = Duration::from_millis(u64::try_from(self.failover_after).unwrap_or(0));
        Ok(Some(
            options
                .with_failures_before_switch(self.failover_failures)
                .with_unavailable_after(after),
        ))
    }
}

/// `tributary failover`.
#[derive(Debug, Args)]
pub struct FailoverArgs {
    #[command(subcommand)]
    pub command: FailoverCommand,
}

/// `tributary failover …`.
#[derive(Debug, Subcommand)]
pub enum FailoverCommand {
    /// Show the endpoint the alias (--alias-file, or --alias-srv) names, when the file last
    /// changed, and whether each candidate accepts a TCP connection.
    Status {
        /// Other endpoints to check too (the other hubs of the failover pair), `host[:port]`.
        #[arg(long = "candidate", value_parser = parse_endpoint)]
        candidates: Vec<AliasEndpoint>,
        /// The port assumed for an endpoint that names none (5671 is AMQPS; 5672 is plain).
        #[arg(long, default_value_t = 5671)]
        default_port: u16,
        #[command(flatten)]
        alias: AliasArgs,
    },
    /// Point the alias file (--alias-file) at ENDPOINT: a temporary file renamed over it, so
    /// clients read the old or the new endpoint, never half of one. Clients following the
    /// file move within their poll interval.
    Switch {
        /// The new active endpoint, `host[:port]` (checked by the command, which never echoes
        /// a value that looks like a secret).
        endpoint: String,
        /// Switch even when ENDPOINT does not accept a TCP connection now.
        #[arg(long)]
        force: bool,
        /// The port assumed for checking an ENDPOINT that names none.
        #[arg(long, default_value_t = 5671)]
        default_port: u16,
        #[command(flatten)]
        alias: AliasArgs,
    },
    /// Rewrite a consumer group's checkpoints on a source hub as checkpoints on its replica,
    /// from the offset map the replication task keeps, so processors moved to the replica
    /// resume where they stopped instead of from the start or a guessed time.
    ///
    /// Conservative: a translated checkpoint is never past an event the group has not
    /// processed; events it already processed may come again (about one offset-sync interval
    /// per partition). A replica partition the map cannot place starts from its beginning;
    /// that widens no other partition's replay when the task kept partitions. Run it with the
    /// group's processors stopped on the replica.
    #[command(name = "translate-checkpoints")]
    Translate(TranslateArgs),
}

/// `tributary failover translate-checkpoints`.
#[derive(Debug, Args)]
pub struct TranslateArgs {
    /// The replication task's offset map: `<its checkpoint_store>.offsets` (by default
    /// `<task file name>.checkpoints.sqlite.offsets` beside the task file).
    #[arg(long, value_name = "PATH")]
    pub offset_map: std::path::PathBuf,
    /// The consumer group.
    #[arg(long, short, default_value = "$Default")]
    pub group: String,
    /// The checkpoint store holding the group's checkpoints on the source (a URL, as
    /// `process --store` takes it).
    #[arg(
        long,
        value_name = "URL",
        env = "TRIBUTARY_SOURCE_STORE",
        hide_env_values = true
    )]
    pub source_store: String,
    /// The source hub's namespace as the store records it.
    #[arg(long, default_value = "localhost")]
    pub source_namespace: String,
    /// The source hub.
    #[arg(long)]
    pub source_hub: String,
    /// Where the replica's checkpoints are written (default: --source-store).
    #[arg(
        long,
        value_name = "URL",
        env = "TRIBUTARY_TARGET_STORE",
        hide_env_values = true
    )]
    pub target_store: Option<String>,
    /// The replica's namespace as its processors record it (default: --source-namespace).
    #[arg(long)]
    pub target_namespace: Option<String>,
    /// The replica hub (default: --source-hub).
    #[arg(long)]
    pub target_hub: Option<String>,
    /// The task's target (its `[[target]] name`), when the map holds several.
    #[arg(long)]
    pub target: Option<String>,
    /// Print the translated checkpoints and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Write even though the group already has checkpoints or owners on the replica.
    #[arg(long)]
    pub force: bool,
}

fn parse_endpoint(text: &str) -> Result<AliasEndpoint, String> {
    text.parse()
        .map_err(|e: tributary_client::ClientError| e.to_string())
}
