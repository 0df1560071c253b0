//! The flags of `tributary failover`: moving consumers to a replica hub.

use clap::{Args, Subcommand};

/// `tributary failover`.
#[derive(Debug, Args)]
pub struct FailoverArgs {
    #[command(subcommand)]
    pub command: FailoverCommand,
}

/// What `failover` does.
#[derive(Debug, Subcommand)]
pub enum FailoverCommand {
    /// Rewrite a consumer group's checkpoints on a source hub as checkpoints on its replica,
    /// from the offset map the replication task keeps, so processors moved to the replica
    /// resume where they stopped instead of from the start or a guessed time.
    ///
    /// Conservative: a translated checkpoint is never past an event the group has not
    /// processed; events it already processed may come again (at most about one offset-sync
    /// interval per partition). A replica partition the map cannot place starts from its
    /// beginning. Run it with the group's processors stopped on the replica.
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
