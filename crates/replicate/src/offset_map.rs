//! The offset map: a sparse record of where a task's source events landed in its targets, so a
//! consumer group's checkpoints on the source can be translated into checkpoints on a replica
//! (`tributary failover translate-checkpoints`) — what MirrorMaker 2's offset syncs do for
//! Kafka, and what Event Hubs' geo-disaster recovery does not offer.
//!
//! # Where it lives
//!
//! In a SQLite file beside the task's checkpoint store ([`path_for`]:
//! `<checkpoint store>.offsets`). The task's processes already share that directory, and a
//! replication task runs beside its target (Azure's advice, and where a mirror for failover
//! has to run), so the map survives the source's loss and is read without it. Keeping it out
//! of the target hub itself means a task needs no right to create hubs there, and it works
//! for every kind of target.
//!
//! # What a sync means
//!
//! A sync `(source partition s, sequence a) → (target partition t, sequence L)` is taken by the
//! owner of `s` when it has sent every event of `s` before `a` and none from `a` on: before a
//! batch that starts at `a`, or while the partition is idle (`a` is then the next sequence
//! number to read). `L` is `t`'s newest sequence number at that moment. It is kept only when it
//! guarantees:
//!
//! > **No copy of an event of `s` with a sequence number ≥ `a` was at or before `L` in `t`.**
//!
//! - The task's own earlier batches of `s` hold events `< a` (batches of one partition are
//!   forwarded one after another, each acknowledged before the next).
//! - An earlier owner of `s` may have sent events past the checkpoint it left before it lost
//!   the partition or crashed — at most what it had received: one batch and its prefetch.
//!   So no sync is taken before a batch until the owner is that far past where it started
//!   ([`SyncSetup::guard`]). An idle partition needs no such distance: its receive found no
//!   event from `a` on, and once this owner's receiver is open no earlier one can receive
//!   more, so no copy of an event from `a` on exists before this owner sends it.
//! - A later owner could start sending before this one notices it lost `s`; that is ruled out
//!   by writing the sync only after this owner proved it still owned `s` after reading `L`:
//!   the batch's checkpoint succeeded (the store fences checkpoints by ownership), or, for an
//!   idle sync, the ownership record still names it.
//!
//! So a partition has syncs from its first batch past that distance, then every
//! [`SyncPolicy::every_events`] events or [`SyncPolicy::every`], and every
//! [`SyncPolicy::every`] while it is idle: an empty partition has a sync at 0, a quiet one a
//! sync where it stopped, and their syncs keep up with what other partitions send into the
//! same target partitions.
//!
//! # Translation
//!
//! A consumer that processed `s` up to `c` (or nothing of it: `c` = -1) may skip, in `t`,
//! everything at or before `L` of any sync of `s` with `a ≤ c + 1`: by the guarantee, all of
//! it that came from `s` is events it processed. [`translate`] takes, per target
//! partition, the least of those positions over the source partitions that feed it: only
//! partition `t` when the task kept partitions ([`SyncRow::keeps_partitions`]), every source
//! partition when it routed by key or round-robin (one target partition then receives from
//! all of them). A target partition with a feeding source partition that has no usable sync
//! starts from its beginning; the other target partitions are not affected. So a translated
//! checkpoint is **never past an unprocessed event**: the consumer may see events again
//! (duplicates), never miss one.
//!
//! # Size
//!
//! Per (source partition, target) the newest [`RECENT_SYNCS_KEPT`] syncs are kept, and of older
//! ones the newest in each power-of-two distance from the newest, plus the oldest ([`kept`]):
//! an old checkpoint still translates, less precisely, and the file stays a few thousand rows.
//! A sync of an idle partition at the same `a` replaces the previous one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags, params};
use tributary_event::format::check_format_version;

use crate::forward::Destination;

/// The newest syncs kept per (source partition, target) before thinning to powers of two.
pub const RECENT_SYNCS_KEPT: usize = 16;

/// How often a source partition's sync is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncPolicy {
    /// After this many source events.
    pub every_events: i64,
    /// Or after this long, whichever comes first.
    pub every: Duration,
}

impl Default for SyncPolicy {
    /// Every 10,000 events or 10 s: at most 10,000 events replayed per partition after a
    /// translation (a failover is rare, and consumers see duplicates after one anyway). A sync
    /// costs one properties request per target partition before its batch is sent and a
    /// SQLite transaction after its checkpoint, so one every batch of a task's default 1,000
    /// events would be a large share of a busy task's CPU.
    fn default() -> Self {
        SyncPolicy {
            every_events: 10_000,
            every: Duration::from_secs(10),
        }
    }
}

/// Where the offset map of a task whose checkpoint store is `checkpoint_store` lives.
pub fn path_for(checkpoint_store: &Path) -> PathBuf {
    let mut name = checkpoint_store.as_os_str().to_owned();
    name.push(".offsets");
    PathBuf::from(name)
}

/// One sync for one target partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncRow {
    /// The source hub's id (as events' `repl-origin` names it).
    pub source_id: String,
    /// How many partitions the source has.
    pub source_partitions: u32,
    /// The source partition.
    pub source_partition: String,
    /// The first source sequence number the guarantee covers (`a`).
    pub source_sequence: i64,
    /// The target hub's id.
    pub target_id: String,
    /// The route's name in the task file.
    pub target_name: String,
    /// How many partitions the target has.
    pub target_partitions: u32,
    /// The target partition.
    pub target_partition: String,
    /// Its newest sequence number when the sync was taken (`L`; -1: it was empty).
    pub target_sequence: i64,
    /// When, in ms since the Unix epoch.
    pub recorded_at_ms: i64,
    /// Whether every event of a source partition lands in the target partition of its number:
    /// the route keeps partitions (`keep_partition`, equal partition counts) and no editor
    /// step can change a partition key. A keyless event then keeps its partition, and a keyed
    /// one goes by its key's hash, which placed it in the source partition of that number too
    /// (a hub refuses a keyed event sent to a partition).
    pub keeps_partitions: bool,
}

/// The offset map's file.
#[derive(Debug)]
pub struct OffsetMap {
    path: PathBuf,
    connection: Mutex<Connection>,
}

/// How long a statement waits for another process's lock on the file.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Puts the file in WAL mode with `synchronous = NORMAL`, as the checkpoint store beside it is:
/// a sync's commit is an append to the write-ahead log, not a rollback journal written, synced
/// and deleted. A committed sync survives a crash of the process; a power cut may lose the
/// newest ones, which only makes a translation start from an older sync (more duplicates,
/// never a gap; and the checkpoints it translates are kept the same way). SQLite answers the
/// switch with `SQLITE_BUSY` at once, without its busy handler, while another process switches
/// the file; it is retried until [`BUSY_TIMEOUT`]. A file system that refuses WAL keeps its
/// journal mode.
fn switch_to_wal(connection: &Connection) -> rusqlite::Result<()> {
    let deadline = Instant::now() + BUSY_TIMEOUT;
    loop {
        match connection.query_row("PRAGMA journal_mode = WAL", [], |row| {
            row.get::<_, String>(0)
        }) {
            Err(rusqlite::Error::SqliteFailure(failure, _))
                if failure.code == rusqlite::ErrorCode::DatabaseBusy
                    && Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            result => {
                result?;
                return connection.pragma_update(None, "synchronous", "NORMAL");
            }
        }
    }
}

const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS offset_sync (
    source_id TEXT NOT NULL, source_partitions INTEGER NOT NULL,
    source_partition TEXT NOT NULL, source_sequence INTEGER NOT NULL,
    target_id TEXT NOT NULL, target_name TEXT NOT NULL, target_partitions INTEGER NOT NULL,
    target_partition TEXT NOT NULL, target_sequence INTEGER NOT NULL,
    recorded_at_ms INTEGER NOT NULL, keeps_partitions INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (source_id, source_partition, target_id, source_sequence, target_partition))";

/// Whether the map's table has the `keeps_partitions` column (a map written before it was
/// added has not: its syncs read as routed, which only widens a translation).
fn keeps_partitions_column(connection: &Connection) -> rusqlite::Result<bool> {
    let mut statement = connection.prepare("SELECT name FROM pragma_table_info('offset_sync')")?;
    let names = statement.query_map([], |row| row.get::<_, String>(0))?;
    for name in names {
        if name? == "keeps_partitions" {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Adds the `keeps_partitions` column to a map written before it existed.
fn add_keeps_partitions(connection: &Connection) -> rusqlite::Result<()> {
    if keeps_partitions_column(connection)? {
        return Ok(());
    }
    connection.execute_batch(
        "ALTER TABLE offset_sync ADD COLUMN keeps_partitions INTEGER NOT NULL DEFAULT 0",
    )
}

/// The map's format (its `user_version`; see [`tributary_event::format`]): 2 has the
/// `keeps_partitions` column. A map written before formats were recorded says 0: it is format 1
/// without that column, 2 with it, and opening it for writing upgrades it in place (adding the
/// column is one SQLite statement, atomic; the version is set after it, and setting it again
/// after a crash between the two is harmless).
const OFFSET_MAP_VERSION: i64 = 2;

/// Refuses a map written by a newer format than this build reads.
fn check_version(connection: &Connection, path: &Path) -> Result<(), String> {
    let found: i64 = connection
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(|e| describe(path, &e))?;
    let what = format_args!("offset map {}", path.display());
    let newest = OFFSET_MAP_VERSION.unsigned_abs();
    check_format_version(what, found.unsigned_abs(), newest).map_err(|e| e.to_string())
}

impl OffsetMap {
    /// Opens the map at `path`, creating it if needed (a task's processes share it).
    pub fn open(path: &Path) -> Result<OffsetMap, String> {
        let connection = Connection::open(path).map_err(|e| describe(path, &e))?;
        connection
            .busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| describe(path, &e))?;
        check_version(&connection, path)?;
        switch_to_wal(&connection)
            .and_then(|()| connection.execute_batch(SCHEMA))
            .and_then(|()| add_keeps_partitions(&connection))
            .and_then(|()| connection.pragma_update(None, "user_version", OFFSET_MAP_VERSION))
            .map_err(|e| describe(path, &e))?;
        Ok(OffsetMap {
            path: path.to_owned(),
            connection: Mutex::new(connection),
        })
    }

    /// Opens an existing map read-only (what translation does); a missing file is an error.
    pub fn open_existing(path: &Path) -> Result<OffsetMap, String> {
        if !path.is_file() {
            return Err(format!(
                "no offset map at {}: a replication task writes it beside its checkpoint store \
                 (<checkpoint_store>.offsets)",
                path.display()
            ));
        }
        let connection = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| describe(path, &e))?;
        connection
            .busy_timeout(BUSY_TIMEOUT)
            .map_err(|e| describe(path, &e))?;
        check_version(&connection, path)?;
        Ok(OffsetMap {
            path: path.to_owned(),
            connection: Mutex::new(connection),
        })
    }

    /// Writes the rows of one sync (one source position, every partition of one target), then
    /// thins that (source partition, target)'s syncs to what [`kept`] keeps. The statements
    /// are prepared once per connection: a sync is written as often as every batch.
    pub fn record(&self, rows: &[SyncRow]) -> Result<(), String> {
        let Some(first) = rows.first() else {
            return Ok(());
        };
        let mut connection = self.connection.lock().expect("offset map connection");
        let transaction = connection
            .transaction()
            .map_err(|e| describe(&self.path, &e))?;
        let mut insert = transaction
            .prepare_cached(
                "INSERT OR REPLACE INTO offset_sync VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11)",
            )
            .map_err(|e| describe(&self.path, &e))?;
        for row in rows {
            insert
                .execute(params![
                    row.source_id,
                    row.source_partitions,
                    row.source_partition,
                    row.source_sequence,
                    row.target_id,
                    row.target_name,
                    row.target_partitions,
                    row.target_partition,
                    row.target_sequence,
                    row.recorded_at_ms,
                    row.keeps_partitions
                ])
                .map_err(|e| describe(&self.path, &e))?;
        }
        drop(insert);
        thin(&transaction, first).map_err(|e| describe(&self.path, &e))?;
        transaction.commit().map_err(|e| describe(&self.path, &e))
    }

    /// Every row, by source partition, target and source sequence.
    pub fn rows(&self) -> Result<Vec<SyncRow>, String> {
        let connection = self.connection.lock().expect("offset map connection");
        let read = || -> rusqlite::Result<Vec<SyncRow>> {
            let keeps = if keeps_partitions_column(&connection)? {
                "keeps_partitions"
            } else {
                "0"
            };
            let mut statement = connection.prepare(&format!(
                "SELECT source_id, source_partitions, source_partition, source_sequence, \
                 target_id, target_name, target_partitions, target_partition, target_sequence, \
                 recorded_at_ms, {keeps} FROM offset_sync ORDER BY source_id, source_partition, \
                 target_id, source_sequence, target_partition"
            ))?;
            let rows = statement.query_map([], |row| {
                Ok(SyncRow {
                    source_id: row.get(0)?,
                    source_partitions: row.get(1)?,
                    source_partition: row.get(2)?,
                    source_sequence: row.get(3)?,
                    target_id: row.get(4)?,
                    target_name: row.get(5)?,
                    target_partitions: row.get(6)?,
                    target_partition: row.get(7)?,
                    target_sequence: row.get(8)?,
                    recorded_at_ms: row.get(9)?,
                    keeps_partitions: row.get(10)?,
                })
            })?;
            rows.collect()
        };
        read().map_err(|e| describe(&self.path, &e))
    }
}

fn describe(path: &Path, error: &rusqlite::Error) -> String {
    format!("offset map {}: {error}", path.display())
}

/// Deletes the syncs of `row`'s (source partition, target) that [`kept`] drops.
fn thin(transaction: &rusqlite::Transaction<'_>, row: &SyncRow) -> rusqlite::Result<()> {
    let key = params![row.source_id, row.source_partition, row.target_id];
    let sequences: BTreeSet<i64> = transaction
        .prepare_cached(
            "SELECT DISTINCT source_sequence FROM offset_sync \
             WHERE source_id = ?1 AND source_partition = ?2 AND target_id = ?3",
        )?
        .query_map(key, |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let keep = kept(&sequences);
    let mut delete = transaction.prepare_cached(
        "DELETE FROM offset_sync WHERE source_id = ?1 AND source_partition = ?2 \
         AND target_id = ?3 AND source_sequence = ?4",
    )?;
    for dropped in sequences.difference(&keep) {
        delete.execute(params![
            row.source_id,
            row.source_partition,
            row.target_id,
            dropped
        ])?;
    }
    Ok(())
}

/// Which of one (source partition, target)'s sync positions to keep: the newest
/// [`RECENT_SYNCS_KEPT`], the oldest, and for each power of two the newest position whose
/// distance from the newest has that highest bit. At most `RECENT_SYNCS_KEPT + 65`.
pub fn kept(sequences: &BTreeSet<i64>) -> BTreeSet<i64> {
    let (Some(&oldest), Some(&newest)) = (sequences.first(), sequences.last()) else {
        return BTreeSet::new();
    };
    let mut keep: BTreeSet<i64> = sequences
        .iter()
        .rev()
        .take(RECENT_SYNCS_KEPT)
        .copied()
        .collect();
    keep.insert(oldest);
    let mut buckets: HashMap<u32, i64> = HashMap::new();
    for &sequence in sequences {
        let distance = newest.abs_diff(sequence);
        if distance > 0 {
            let bucket = u64::BITS - distance.leading_zeros();
            let best = buckets.entry(bucket).or_insert(sequence);
            *best = (*best).max(sequence);
        }
    }
    keep.extend(buckets.into_values());
    keep
}

/// One target partition's translated checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Translated {
    /// The target partition.
    pub partition: String,
    /// Resume after this sequence number; -1: from the partition's beginning.
    pub sequence_number: i64,
    /// Why this position, for the operator.
    pub reason: String,
}

/// Translates a consumer group's checkpoints on the source (`processed`: source partition →
/// sequence number of the last processed event; a partition without one counts as nothing
/// processed) into one resume position per partition of a target, from that target's syncs
/// (see the module docs for the rule and why it is never past an unprocessed event).
///
/// `source_partitions` and `target_partitions` are the hubs' partition counts; partitions are
/// numbered from 0.
pub fn translate(
    syncs: &[SyncRow],
    processed: &HashMap<String, i64>,
    source_partitions: u32,
    target_partitions: u32,
) -> Vec<Translated> {
    // (target partition, source partition) → [(a, L)]
    let mut by_pair: BTreeMap<(&str, &str), Vec<(i64, i64)>> = BTreeMap::new();
    for row in syncs {
        by_pair
            .entry((&row.target_partition, &row.source_partition))
            .or_default()
            .push((row.source_sequence, row.target_sequence));
    }
    // One routed sync makes every source partition a possible sender to every target one.
    let keeps_partitions = source_partitions == target_partitions
        && !syncs.is_empty()
        && syncs.iter().all(|row| row.keeps_partitions);
    (0..target_partitions)
        .map(|t| {
            let feeding = if keeps_partitions {
                t..t + 1
            } else {
                0..source_partitions
            };
            let t = t.to_string();
            let mut result = Translated {
                partition: t.clone(),
                sequence_number: i64::MAX,
                reason: String::new(),
            };
            for s in feeding.map(|s| s.to_string()) {
                let pairs = by_pair.get(&(t.as_str(), s.as_str()));
                let (position, reason) = safe_position(&s, processed.get(&s).copied(), pairs);
                if position < result.sequence_number {
                    result.sequence_number = position;
                    result.reason = reason;
                }
            }
            if result.sequence_number == i64::MAX {
                result.sequence_number = -1;
                result.reason = "the source has no partitions".to_owned();
            }
            result
        })
        .collect()
}

/// Where a target partition may resume for source partition `s` alone, with the reason.
fn safe_position(
    s: &str,
    processed: Option<i64>,
    pairs: Option<&Vec<(i64, i64)>>,
) -> (i64, String) {
    let checkpoint = match processed {
        Some(processed) => format!("checkpoint {processed}"),
        None => "no checkpoint (nothing processed)".to_owned(),
    };
    let processed = processed.unwrap_or(-1);
    let best = pairs
        .into_iter()
        .flatten()
        .filter(|(a, _)| *a <= processed.saturating_add(1))
        .max_by_key(|(_, l)| *l);
    match best {
        Some(&(a, l)) => (
            l,
            format!("source partition {s}: {checkpoint}, sync at {a} → {l}"),
        ),
        None => (
            -1,
            format!(
                "source partition {s}: {checkpoint}, no sync at or before it: from the beginning"
            ),
        ),
    }
}

/// What one source partition's processor needs to take syncs.
#[derive(Debug, Clone)]
pub(crate) struct SyncSetup {
    pub(crate) map: Arc<OffsetMap>,
    pub(crate) policy: SyncPolicy,
    /// How far past where it started an owner reads before its first sync before a batch:
    /// what an earlier owner may have sent past its checkpoint (one batch and the prefetch).
    pub(crate) guard: i64,
    pub(crate) source_id: String,
    pub(crate) source_partitions: u32,
}

/// A target a sync covers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SyncTarget<'a> {
    pub(crate) destination: &'a Destination,
    /// See [`SyncRow::keeps_partitions`]: then only the target partition of the source
    /// partition's number is asked and recorded.
    pub(crate) keeps_partitions: bool,
}

/// One source partition's syncs while this process owns it.
#[derive(Debug)]
pub(crate) struct PartitionSyncs {
    setup: SyncSetup,
    partition: String,
    /// The first sequence number this owner read.
    started_at: Option<i64>,
    /// The last sync written: its source sequence and when.
    last: Option<(i64, Instant)>,
}

/// A sync taken, to be written once the owner proved it still owned the partition.
#[derive(Debug)]
pub(crate) struct PendingSync(Vec<Vec<SyncRow>>);

impl PartitionSyncs {
    pub(crate) fn new(setup: SyncSetup, partition: &str) -> PartitionSyncs {
        PartitionSyncs {
            setup,
            partition: partition.to_owned(),
            started_at: None,
            last: None,
        }
    }

    /// Whether a batch starting at `first` takes a sync: the first batch past
    /// [`SyncSetup::guard`] does, then one every [`SyncPolicy::every_events`] events or
    /// [`SyncPolicy::every`].
    fn due(&mut self, first: i64) -> bool {
        let started_at = *self.started_at.get_or_insert(first);
        if first < started_at.saturating_add(self.setup.guard) {
            return false;
        }
        self.last.is_none_or(|(sequence, at)| {
            first.saturating_sub(sequence) >= self.setup.policy.every_events
                || at.elapsed() >= self.setup.policy.every
        })
    }

    /// Whether an idle partition takes a sync: when it has none yet, or its last one is
    /// [`SyncPolicy::every`] old.
    pub(crate) fn idle_due(&self) -> bool {
        self.last
            .is_none_or(|(_, at)| at.elapsed() >= self.setup.policy.every)
    }

    /// Before a batch starting at `first` goes to `targets`: a sync, if one is due and every
    /// target could say.
    pub(crate) async fn before_batch(
        &mut self,
        first: i64,
        targets: &[SyncTarget<'_>],
    ) -> Option<PendingSync> {
        if !self.due(first) {
            return None;
        }
        self.take(first, targets).await
    }

    /// A sync at `next` (every event before it sent, none from it on): the targets' newest
    /// sequence numbers, if every target could say.
    pub(crate) async fn take(&self, next: i64, targets: &[SyncTarget<'_>]) -> Option<PendingSync> {
        let now_ms = crate::wall_clock_ms();
        let mut pending = Vec::with_capacity(targets.len());
        for target in targets {
            let destination = target.destination;
            let count = destination.identity.partition_count;
            let ids: Vec<String> = if target.keeps_partitions {
                vec![self.partition.clone()]
            } else {
                (0..count).map(|t| t.to_string()).collect()
            };
            let newest = futures_util::future::join_all(
                ids.iter()
                    .map(|t| destination.target.last_sequence_number(t)),
            )
            .await;
            let mut rows = Vec::with_capacity(newest.len());
            for (t, newest) in ids.into_iter().zip(newest) {
                let target_sequence = match newest {
                    Ok(Some(sequence)) => sequence,
                    Ok(None) => return None,
                    Err(error) => {
                        tracing::debug!(partition = %self.partition, %error, "no offset sync now");
                        return None;
                    }
                };
                rows.push(SyncRow {
                    source_id: self.setup.source_id.clone(),
                    source_partitions: self.setup.source_partitions,
                    source_partition: self.partition.clone(),
                    source_sequence: next,
                    target_id: destination.identity.id.clone(),
                    target_name: destination.name.clone(),
                    target_partitions: count,
                    target_partition: t,
                    target_sequence,
                    recorded_at_ms: now_ms,
                    keeps_partitions: target.keeps_partitions,
                });
            }
            pending.push(rows);
        }
        Some(PendingSync(pending))
    }

    /// Writes `pending`: its owner has since proved it still owned the partition (its batch's
    /// checkpoint succeeded, or the ownership record still names it).
    pub(crate) async fn write(&mut self, pending: PendingSync) {
        let Some(first) = pending.0.first().and_then(|rows| rows.first()) else {
            return;
        };
        let sequence = first.source_sequence;
        let map = Arc::clone(&self.setup.map);
        let written = tokio::task::spawn_blocking(move || {
            pending.0.iter().try_for_each(|rows| map.record(rows))
        })
        .await
        .unwrap_or_else(|e| Err(e.to_string()));
        match written {
            Ok(()) => self.last = Some((sequence, Instant::now())),
            Err(error) => {
                tracing::warn!(partition = %self.partition, %error, "cannot write the offset map");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(s: u32, a: i64, t: u32, l: i64) -> SyncRow {
        SyncRow {
            source_id: "src".into(),
            source_partitions: 2,
            source_partition: s.to_string(),
            source_sequence: a,
            target_id: "dst".into(),
            target_name: "replica".into(),
            target_partitions: 3,
            target_partition: t.to_string(),
            target_sequence: l,
            recorded_at_ms: 0,
            keeps_partitions: false,
        }
    }

    /// Deterministic pseudo-random numbers below `n` (no extra crate for property tests).
    fn generator() -> impl FnMut(u64) -> u64 {
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        move |n| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        }
    }

    /// What [`replicate`] made: each target partition's log of (source partition, sequence),
    /// the syncs, and how many events each source partition had.
    struct Model {
        logs: Vec<Vec<(u32, i64)>>,
        syncs: Vec<SyncRow>,
        sent: Vec<i64>,
    }

    /// A tiny replication model: source partition events sent to target partitions (by
    /// partition number when `keep`, else anywhere), syncs taken before some batches and while
    /// idle (an empty batch), some source partitions never synced.
    fn replicate(
        next: &mut impl FnMut(u64) -> u64,
        sources: u32,
        targets: u32,
        keep: bool,
    ) -> Model {
        let mut model = Model {
            logs: vec![Vec::new(); targets as usize],
            syncs: Vec::new(),
            sent: vec![0; sources as usize],
        };
        let synced: Vec<bool> = (0..sources).map(|_| next(4) != 0).collect();
        for _ in 0..next(60) {
            let s = next(u64::from(sources)) as u32;
            let first = model.sent[s as usize];
            let batch = if next(4) == 0 { 0 } else { 1 + next(5) as i64 };
            if synced[s as usize] && next(2) == 0 {
                for t in (0..targets).filter(|t| !keep || *t == s) {
                    let l = model.logs[t as usize].len() as i64 - 1;
                    let mut sync = row(s, first, t, l);
                    sync.keeps_partitions = keep;
                    model.syncs.push(sync);
                }
            }
            for seq in first..first + batch {
                let t = if keep {
                    s as usize
                } else {
                    next(u64::from(targets)) as usize
                };
                model.logs[t].push((s, seq));
            }
            model.sent[s as usize] += batch;
        }
        model
    }

    /// Checks translations of random checkpoints (some partitions without one) against
    /// [`replicate`]'s logs: no target partition resumes after an event not processed, and
    /// with kept partitions each translates from its own source partition alone.
    fn check_translation(keep: bool) {
        let mut next = generator();
        for _ in 0..400 {
            let sources = 1 + next(4) as u32;
            let targets = if keep { sources } else { 1 + next(4) as u32 };
            let Model { logs, syncs, sent } = replicate(&mut next, sources, targets, keep);
            let mut processed: HashMap<String, i64> = HashMap::new();
            for s in 0..sources {
                if next(5) != 0 {
                    let c = next(sent[s as usize] as u64 + 1) as i64 - 1;
                    processed.insert(s.to_string(), c);
                }
            }
            let translated = translate(&syncs, &processed, sources, targets);
            for (t, position) in translated.iter().enumerate() {
                for (index, (s, seq)) in logs[t].iter().enumerate() {
                    let done = processed.get(&s.to_string()).is_some_and(|c| seq <= c);
                    assert!(
                        index as i64 > position.sequence_number || done,
                        "target {t} resumes after {} but event {s}/{seq} at {index} was not processed",
                        position.sequence_number
                    );
                }
                if keep && !syncs.is_empty() {
                    let c = processed.get(&t.to_string()).copied().unwrap_or(-1);
                    let own = syncs
                        .iter()
                        .filter(|r| r.source_partition == t.to_string())
                        .filter(|r| r.source_sequence <= c + 1)
                        .map(|r| r.target_sequence)
                        .max()
                        .unwrap_or(-1);
                    assert_eq!(position.sequence_number, own, "{position:?}");
                }
            }
        }
    }

    #[test]
    fn translation_never_skips_an_unprocessed_event_when_routing() {
        check_translation(false);
    }

    #[test]
    fn translation_never_skips_an_unprocessed_event_when_keeping_partitions() {
        check_translation(true);
    }

    /// The failover of issue "found from outside": one source partition never received an
    /// event, so the group has no checkpoint there; the others were processed and synced.
    #[test]
    fn an_empty_partition_does_not_send_the_others_back_to_the_beginning() {
        let processed = HashMap::from([("0".to_owned(), 99), ("1".to_owned(), 99)]);
        let keeping = |s: u32, a: i64, l: i64| SyncRow {
            keeps_partitions: true,
            ..row(s, a, s, l)
        };
        // Kept partitions, the empty one never synced: only its own partition is unplaced.
        let syncs = vec![keeping(0, 90, 89), keeping(1, 95, 94)];
        let out = translate(&syncs, &processed, 3, 3);
        let positions: Vec<i64> = out.iter().map(|t| t.sequence_number).collect();
        assert_eq!(positions, [89, 94, -1], "{out:?}");
        // Routed, with the empty partition's idle sync at 0: it bounds nothing below the others.
        let syncs = vec![
            row(0, 90, 0, 180),
            row(0, 90, 1, 170),
            row(1, 95, 0, 185),
            row(1, 95, 1, 178),
            row(2, 0, 0, 199),
            row(2, 0, 1, 199),
        ];
        let out = translate(&syncs, &processed, 3, 2);
        let positions: Vec<i64> = out.iter().map(|t| t.sequence_number).collect();
        assert_eq!(positions, [180, 170], "{out:?}");
        // Routed, without it: nothing says where the empty partition's events went.
        let out = translate(&syncs[..4], &processed, 3, 2);
        assert!(out.iter().all(|t| t.sequence_number == -1), "{out:?}");
    }

    #[test]
    fn batches_sync_past_the_guard_then_by_policy_and_idle_partitions_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let setup = SyncSetup {
            map: Arc::new(OffsetMap::open(&dir.path().join("map")).unwrap()),
            policy: SyncPolicy {
                every_events: 100,
                every: Duration::from_secs(3600),
            },
            guard: 30,
            source_id: "src".into(),
            source_partitions: 1,
        };
        let mut syncs = PartitionSyncs::new(setup, "0");
        assert!(
            syncs.idle_due(),
            "an idle partition without a sync, wherever it is"
        );
        assert!(!syncs.due(4_970), "where the owner starts");
        assert!(!syncs.due(4_999));
        assert!(syncs.due(5_000), "the first batch past the guard");
        syncs.last = Some((5_000, Instant::now()));
        assert!(!syncs.due(5_099));
        assert!(syncs.due(5_100));
        assert!(!syncs.idle_due());
        syncs.last = Some((5_000, Instant::now() - Duration::from_secs(3600)));
        assert!(syncs.due(5_001), "or after `every`");
        assert!(syncs.idle_due());
    }

    #[test]
    fn translation_takes_the_best_sync_per_source_and_the_least_across_sources() {
        let syncs = vec![
            row(0, 0, 0, -1),
            row(0, 10, 0, 4),
            row(0, 20, 0, 9),
            row(1, 5, 0, 6),
        ];
        let processed = HashMap::from([("0".to_owned(), 15), ("1".to_owned(), 7)]);
        let out = translate(&syncs, &processed, 2, 1);
        assert_eq!(out[0].sequence_number, 4, "{}", out[0].reason);
        let processed = HashMap::from([("0".to_owned(), 25), ("1".to_owned(), 7)]);
        assert_eq!(translate(&syncs, &processed, 2, 1)[0].sequence_number, 6);
        let processed = HashMap::from([("0".to_owned(), 25)]);
        let out = translate(&syncs, &processed, 2, 1);
        assert_eq!(out[0].sequence_number, -1);
        assert!(out[0].reason.contains("no checkpoint"), "{}", out[0].reason);
        let processed = HashMap::from([("0".to_owned(), 25), ("1".to_owned(), 2)]);
        assert_eq!(translate(&syncs, &processed, 2, 1)[0].sequence_number, -1);
    }

    #[test]
    fn thinning_keeps_recent_oldest_and_powers_of_two() {
        let all: BTreeSet<i64> = (0..10_000).map(|i| i * 10).collect();
        let keep = kept(&all);
        assert!(keep.len() <= RECENT_SYNCS_KEPT + 65, "{}", keep.len());
        assert!(keep.contains(&0) && keep.contains(&99_990));
        assert!(
            all.iter()
                .rev()
                .take(RECENT_SYNCS_KEPT)
                .all(|s| keep.contains(s))
        );
        // Every checkpoint finds a kept sync within about four times its distance.
        for c in [100, 5_000, 50_000, 99_000] {
            let best = keep.range(..=c).next_back().unwrap();
            assert!(99_990 - best <= 4 * (99_990 - c) + 10, "{c} → {best}");
        }
    }

    #[test]
    fn the_map_records_thins_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = path_for(&dir.path().join("task.sqlite"));
        assert!(OffsetMap::open_existing(&path).is_err());
        let map = OffsetMap::open(&path).unwrap();
        for a in 0..40 {
            map.record(&[row(0, a * 3, 0, a), row(0, a * 3, 1, a * 2)])
                .unwrap();
        }
        let read = OffsetMap::open_existing(&path).unwrap().rows().unwrap();
        let positions: BTreeSet<i64> = read.iter().map(|r| r.source_sequence).collect();
        // Thinned on every write: the oldest, the newest few, a bounded number in all.
        assert!(positions.len() <= RECENT_SYNCS_KEPT + 65, "{positions:?}");
        assert!(positions.contains(&0), "{positions:?}");
        assert!(
            (40 - 16..40).all(|a| positions.contains(&(a * 3))),
            "{positions:?}"
        );
        assert_eq!(
            read.len(),
            positions.len() * 2,
            "both target partitions of each"
        );
        assert!(read.contains(&row(0, 117, 1, 78)));
    }
}
