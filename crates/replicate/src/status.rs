//! A task's state across all its processes, for `tributary replicate --status`.
//!
//! Each running [`Replicator`](crate::Replicator) writes its counters every second to
//! `<checkpoint store>.status/<host name>.json` (written to a temporary file and renamed, so a
//! reader never sees half a file). [`TaskStatus::read`] joins those files with the checkpoint
//! store's ownership and checkpoint records: per source partition its owner, its checkpoint, and
//! the counters of the process that owns it. A file not rewritten for [`STALE_AFTER`] belongs to
//! a process that stopped or crashed; its counters are shown but marked stale.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tributary_processor::{CheckpointStore, SqliteCheckpointStore};

use crate::metrics::TaskSnapshot;
use crate::task::{TaskConfig, TaskError};

/// How often a running task writes its status file.
pub const WRITE_INTERVAL: Duration = Duration::from_secs(1);

/// A status file older than this belongs to a process that is gone.
pub const STALE_AFTER: Duration = Duration::from_secs(10);

/// One process's status file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessStatus {
    /// The process's host name (its name among the task's processes).
    pub host_name: String,
    /// When it wrote this, ms since the epoch.
    pub written_at_ms: i64,
    /// The partitions it owned then.
    pub owned_partitions: Vec<String>,
    /// Its counters.
    pub counters: TaskSnapshot,
}

/// Where the status files of the task with this checkpoint store live.
pub fn status_dir(checkpoint_store: &Path) -> PathBuf {
    let mut name = checkpoint_store.as_os_str().to_owned();
    name.push(".status");
    PathBuf::from(name)
}

/// Writes `status` atomically into `dir`.
pub fn write(dir: &Path, status: &ProcessStatus) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let file = dir.join(format!("{}.json", sanitize(&status.host_name)));
    let temporary = file.with_extension("json.tmp");
    let bytes = serde_json::to_vec(status).map_err(std::io::Error::other)?;
    std::fs::write(&temporary, bytes)?;
    std::fs::rename(&temporary, &file)
}

/// A host name as a file name: anything but letters, digits, `-`, `_` and `.` becomes `_`.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// One source partition's row.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct PartitionStatus {
    /// Who owns it (empty: released or never claimed).
    pub owner: String,
    /// The checkpointed sequence number.
    pub checkpoint_sequence: Option<i64>,
    /// Events read, forwarded (all targets), dead-lettered, filtered by the owner so far.
    pub events_in: u64,
    /// Events forwarded, over all targets.
    pub events_out: u64,
    /// Events dead-lettered.
    pub dead_lettered: u64,
    /// Events filtered.
    pub filtered: u64,
    /// The latest send's lag in ms.
    pub lag_last_ms: i64,
    /// Whether the owner's status file is stale.
    pub stale: bool,
}

/// The task's state.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct TaskStatus {
    /// Per source partition.
    pub partitions: BTreeMap<String, PartitionStatus>,
    /// Each process's file, fresh or stale.
    pub processes: Vec<(ProcessStatus, bool)>,
}

impl TaskStatus {
    /// Reads the checkpoint store and the status files of `config`'s task. `namespace` is the
    /// source's namespace as the store records it (the host name of its connection string, or
    /// `localhost` for a hub in a data directory).
    pub async fn read(
        config: &TaskConfig,
        namespace: &str,
        now_ms: i64,
    ) -> Result<TaskStatus, TaskError> {
        let store_path = &config.source.checkpoint_store;
        let error = |message: String| TaskError {
            file: config.file.clone(),
            line: None,
            key: "source.checkpoint_store".to_owned(),
            message,
        };
        if !store_path.exists() {
            // A process waiting for its source has written its status, not yet its store.
            let processes = read_processes(&status_dir(store_path), now_ms);
            if processes.is_empty() {
                return Err(error(format!(
                    "{} does not exist: has the task run yet?",
                    store_path.display()
                )));
            }
            return Ok(TaskStatus {
                partitions: BTreeMap::new(),
                processes,
            });
        }
        let store = SqliteCheckpointStore::open(store_path)
            .await
            .map_err(|e| error(format!("cannot open {}: {e}", store_path.display())))?;
        let (hub, group) = (
            &config.source.endpoint.event_hub,
            &config.source.consumer_group,
        );
        let owners = store
            .list_ownership(namespace, hub, group)
            .await
            .map_err(|e| error(e.to_string()))?;
        let checkpoints = store
            .list_checkpoints(namespace, hub, group)
            .await
            .map_err(|e| error(e.to_string()))?;
        let processes = read_processes(&status_dir(store_path), now_ms);
        let mut partitions: BTreeMap<String, PartitionStatus> = BTreeMap::new();
        for owner in owners {
            partitions
                .entry(owner.partition_id.clone())
                .or_default()
                .owner = owner.owner_id;
        }
        for checkpoint in checkpoints {
            partitions
                .entry(checkpoint.partition_id.clone())
                .or_default()
                .checkpoint_sequence = checkpoint.sequence_number;
        }
        for (id, row) in partitions.iter_mut() {
            let Some((process, stale)) = processes.iter().find(|(p, _)| p.host_name == row.owner)
            else {
                continue;
            };
            let Some(counters) = process.counters.partitions.get(id) else {
                continue;
            };
            row.events_in = counters.events_in;
            row.events_out = counters.events_out.values().sum();
            row.dead_lettered = counters.dead_lettered;
            row.filtered = counters.filtered.values().sum();
            row.lag_last_ms = counters.lag_last_ms;
            row.stale = *stale;
        }
        Ok(TaskStatus {
            partitions,
            processes,
        })
    }
}

fn read_processes(dir: &Path, now_ms: i64) -> Vec<(ProcessStatus, bool)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let stale_ms = STALE_AFTER.as_millis() as i64;
    entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|bytes| serde_json::from_slice::<ProcessStatus>(&bytes).ok())
        .map(|status| {
            let stale = now_ms.saturating_sub(status.written_at_ms) > stale_ms;
            (status, stale)
        })
        .collect()
}
