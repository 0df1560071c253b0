//! The flags of `tributary replicate`.

use std::path::PathBuf;

use clap::Args;

/// `tributary replicate`.
#[derive(Debug, Args)]
pub struct ReplicateArgs {
    /// The task file (TOML): source, targets, routing, editor steps, dead-letter target.
    pub task: PathBuf,
    /// Print the task's state — each source partition's owner, checkpoint, events in and out,
    /// dead-lettered, filtered and lag, from the checkpoint store and every process's status
    /// file — and exit.
    #[arg(long)]
    pub status: bool,
    /// Check the task file (and that every endpoint answers) and exit without replicating.
    #[arg(long, conflicts_with = "status")]
    pub check: bool,
    /// This process's name among the task's processes (default: the task file's, else
    /// generated).
    #[arg(long)]
    pub host_name: Option<String>,
}
