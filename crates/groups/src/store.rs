//! Where groups and their committed offsets are kept: `<data_dir>/groups.sqlite`.
//!
//! SQLite in WAL mode with `synchronous = NORMAL`: a commit survives a crash of the process at
//! once, and a power failure once the WAL is checkpointed. Losing the newest commits to a power
//! failure only moves a group back to offsets it had committed before, so messages after them
//! are delivered again: at-least-once holds. Losing a group's newest epoch can only turn an older
//! cursor from "rejoin after restart" into "fenced", which is safe.
//! Instances and what they hold are not stored: after a restart, each instance's next request
//! rejoins (see [`super::state::GroupState::member_for`]).

use std::path::Path;

use rusqlite::{Connection, params};
use tributary_event::format::check_format_version;

use super::CoordinatorError;

/// The file's format (its `user_version`; see [`tributary_event::format`]).
const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS groups (
    stream_key TEXT NOT NULL,
    group_key TEXT NOT NULL,
    stream_name TEXT NOT NULL,
    group_name TEXT NOT NULL,
    hub_created_ms INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    last_used_ms INTEGER NOT NULL,
    epoch INTEGER NOT NULL,
    PRIMARY KEY (stream_key, group_key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS offsets (
    stream_key TEXT NOT NULL,
    group_key TEXT NOT NULL,
    partition INTEGER NOT NULL,
    next_sequence INTEGER NOT NULL,
    PRIMARY KEY (stream_key, group_key, partition)
) WITHOUT ROWID;
";

/// A group as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredGroup {
    pub stream: String,
    pub group: String,
    pub hub_created_ms: i64,
    pub created_ms: i64,
    pub last_used_ms: i64,
    pub epoch: u64,
    pub committed: Vec<i64>,
}

fn storage(e: impl std::fmt::Display) -> CoordinatorError {
    CoordinatorError::Storage(format!("groups.sqlite: {e}"))
}

fn key(name: &str) -> String {
    tributary_event::names::name_key(name)
}

fn to_i64(epoch: u64) -> i64 {
    i64::try_from(epoch).expect("epochs stay far below 2^63")
}

/// The open database.
#[derive(Debug)]
pub(crate) struct Store {
    conn: Connection,
}

impl Store {
    /// Opens (creating if needed) the database in `data_dir`.
    pub(crate) fn open(data_dir: &Path) -> Result<Store, CoordinatorError> {
        let path = data_dir.join("groups.sqlite");
        let conn = Connection::open(&path).map_err(storage)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(storage)?;
        // Before anything changes the file: a newer build's file stays as it is.
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(storage)?;
        check_format_version(
            format_args!("server-side group state {}", path.display()),
            version.unsigned_abs(),
            SCHEMA_VERSION.unsigned_abs(),
        )
        .map_err(|too_new| CoordinatorError::Storage(too_new.to_string()))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(storage)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(storage)?;
        conn.execute_batch(SCHEMA).map_err(storage)?;
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(storage)?;
        Ok(Store { conn })
    }

    /// Every stored group.
    pub(crate) fn load(&self) -> Result<Vec<StoredGroup>, CoordinatorError> {
        let mut stmt = self
            .conn
            .prepare("SELECT stream_key, group_key, stream_name, group_name, hub_created_ms, created_ms, last_used_ms, epoch FROM groups")
            .map_err(storage)?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    StoredGroup {
                        stream: r.get(2)?,
                        group: r.get(3)?,
                        hub_created_ms: r.get(4)?,
                        created_ms: r.get(5)?,
                        last_used_ms: r.get(6)?,
                        epoch: u64::try_from(r.get::<_, i64>(7)?).unwrap_or(0),
                        committed: Vec::new(),
                    },
                ))
            })
            .map_err(storage)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(storage)?;
        let mut out = Vec::with_capacity(rows.len());
        for (stream_key, group_key, mut group) in rows {
            group.committed = self.offsets(&stream_key, &group_key)?;
            out.push(group);
        }
        Ok(out)
    }

    fn offsets(&self, stream_key: &str, group_key: &str) -> Result<Vec<i64>, CoordinatorError> {
        let mut stmt = self
            .conn
            .prepare("SELECT partition, next_sequence FROM offsets WHERE stream_key = ?1 AND group_key = ?2 ORDER BY partition")
            .map_err(storage)?;
        let rows = stmt
            .query_map(params![stream_key, group_key], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
            })
            .map_err(storage)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(storage)?;
        let mut committed = Vec::with_capacity(rows.len());
        for (i, (partition, next)) in rows.into_iter().enumerate() {
            if partition != i as i64 || next < 0 {
                return Err(storage(format!(
                    "group {group_key:?} of stream {stream_key:?}: damaged offsets (partition {partition}, position {next})"
                )));
            }
            committed.push(next);
        }
        Ok(committed)
    }

    /// Stores a new group (replacing any leftover of the same name).
    pub(crate) fn create(&mut self, g: &StoredGroup) -> Result<(), CoordinatorError> {
        let (sk, gk) = (key(&g.stream), key(&g.group));
        let tx = self.conn.transaction().map_err(storage)?;
        tx.execute(
            "DELETE FROM offsets WHERE stream_key = ?1 AND group_key = ?2",
            params![sk, gk],
        )
        .map_err(storage)?;
        tx.execute(
            "INSERT OR REPLACE INTO groups VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                sk,
                gk,
                g.stream,
                g.group,
                g.hub_created_ms,
                g.created_ms,
                g.last_used_ms,
                to_i64(g.epoch)
            ],
        )
        .map_err(storage)?;
        for (p, next) in g.committed.iter().enumerate() {
            tx.execute(
                "INSERT INTO offsets VALUES (?1, ?2, ?3, ?4)",
                params![sk, gk, p as i64, next],
            )
            .map_err(storage)?;
        }
        tx.commit().map_err(storage)
    }

    /// Updates committed positions, the epoch and the last use in one transaction.
    pub(crate) fn update(
        &mut self,
        stream: &str,
        group: &str,
        commits: &[(u32, i64)],
        epoch: u64,
        last_used_ms: i64,
    ) -> Result<(), CoordinatorError> {
        let (sk, gk) = (key(stream), key(group));
        let tx = self.conn.transaction().map_err(storage)?;
        let changed = tx
            .execute(
                "UPDATE groups SET epoch = ?3, last_used_ms = ?4 WHERE stream_key = ?1 AND group_key = ?2",
                params![sk, gk, to_i64(epoch), last_used_ms],
            )
            .map_err(storage)?;
        if changed != 1 {
            return Err(storage(format!(
                "group {group:?} of stream {stream:?} is not stored"
            )));
        }
        for &(p, next) in commits {
            tx.execute(
                "UPDATE offsets SET next_sequence = ?4 WHERE stream_key = ?1 AND group_key = ?2 AND partition = ?3",
                params![sk, gk, i64::from(p), next],
            )
            .map_err(storage)?;
        }
        tx.commit().map_err(storage)
    }

    /// Removes a group and its offsets.
    pub(crate) fn delete(&mut self, stream: &str, group: &str) -> Result<(), CoordinatorError> {
        let (sk, gk) = (key(stream), key(group));
        let tx = self.conn.transaction().map_err(storage)?;
        tx.execute(
            "DELETE FROM offsets WHERE stream_key = ?1 AND group_key = ?2",
            params![sk, gk],
        )
        .map_err(storage)?;
        tx.execute(
            "DELETE FROM groups WHERE stream_key = ?1 AND group_key = ?2",
            params![sk, gk],
        )
        .map_err(storage)?;
        tx.commit().map_err(storage)
    }
}
