//! A checkpoint store in one SQLite file, shared safely by several processes on one machine.
//!
//! Guarantees, and how:
//! - **Atomic claims across processes.** All claims of one call run in one `BEGIN IMMEDIATE`
//!   transaction (which takes SQLite's write lock up front, so no two writers interleave), and
//!   each compares its etag in the `UPDATE … WHERE etag = ?` itself. A fenced checkpoint reads
//!   the owner and writes in one such transaction too.
//! - **Readers never block the writer.** The file is in WAL mode; a process that finds the
//!   write lock taken waits up to [`SQLITE_BUSY_TIMEOUT`](crate::limits::SQLITE_BUSY_TIMEOUT)
//!   before the call fails with [`StoreError::Backend`].
//! - **The async runtime never blocks.** Every SQLite call runs on the store's own thread,
//!   which holds its one connection and runs this process's calls one after the other; a call
//!   hands it its work through a channel and awaits the answer (no hop through tokio's
//!   blocking pool, which cost a replication task's checkpoint per batch more than the
//!   hand-off does). The thread ends when the store is dropped. Statements are prepared once per connection (`prepare_cached`): a
//!   replication task writes a checkpoint per batch, and parsing the same SQL every time was a
//!   visible part of its CPU.
//! - **Durability.** `synchronous = NORMAL`: a committed transaction survives a process crash;
//!   a power loss may take back the last few commits. For checkpoints that means some events are
//!   processed again (delivery is at-least-once anyway); for ownership it means a partition's
//!   record may step back one claim, which every host is restarting from after a power loss too.
//!
//! The file is not meant for network file systems: SQLite's locking is only as good as the file
//! system's.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use tokio::sync::oneshot;
use tributary_event::format::check_format_version;
use tributary_event::{Clock, SystemClock};

use super::{
    Checkpoint, CheckpointStore, HostRecord, Ownership, OwnershipFence, OwnershipListing, ScopeKey,
    StoreError, host_record_horizon_ms, new_etag, sql_offset, validate_checkpoint, validate_claim,
    validate_host,
};
use crate::limits::SQLITE_BUSY_TIMEOUT;

/// The schema this code writes (the file's format, its `user_version`; see
/// [`tributary_event::format`]); a file with a higher one came from newer code and is refused.
/// Version 2 added the host records (opening a version 1 file adds their table, in the same
/// transaction that sets the version); older code refuses such a file rather than renewing
/// every partition beside hosts that do not.
const SCHEMA_VERSION: i64 = 2;

const CREATE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS ownership (
    namespace TEXT NOT NULL,
    event_hub TEXT NOT NULL,
    consumer_group TEXT NOT NULL,
    partition_id TEXT NOT NULL,
    owner_id TEXT NOT NULL,
    last_modified_time_ms INTEGER NOT NULL,
    etag TEXT NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (namespace, event_hub, consumer_group, partition_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoint (
    namespace TEXT NOT NULL,
    event_hub TEXT NOT NULL,
    consumer_group TEXT NOT NULL,
    partition_id TEXT NOT NULL,
    event_offset INTEGER,
    sequence_number INTEGER,
    PRIMARY KEY (namespace, event_hub, consumer_group, partition_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS host (
    namespace TEXT NOT NULL,
    event_hub TEXT NOT NULL,
    consumer_group TEXT NOT NULL,
    owner_id TEXT NOT NULL,
    last_modified_time_ms INTEGER NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (namespace, event_hub, consumer_group, owner_id)
) WITHOUT ROWID;
";

/// A [`CheckpointStore`] in one SQLite file.
///
/// Open one per process (or share one with an `Arc`); every process that opens the same path
/// sees the same ownership and checkpoints.
pub struct SqliteCheckpointStore {
    path: PathBuf,
    clock: Arc<dyn Clock>,
    /// Work for the thread that holds the connection.
    jobs: mpsc::Sender<Job>,
}

/// Work on the store's connection, run on its thread.
type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// The error of a call whose work the connection's thread did not answer: it stopped (a
/// panic in an earlier call's work) or the work panicked.
fn connection_gone(operation: &'static str) -> StoreError {
    StoreError::Backend {
        operation,
        description: "the store's connection thread stopped".to_owned(),
    }
}

impl std::fmt::Debug for SqliteCheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteCheckpointStore")
            .field("path", &self.path)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

fn backend(operation: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |error| StoreError::Backend {
        operation,
        description: error.to_string(),
    }
}

impl SqliteCheckpointStore {
    /// Opens (creating if needed) the store at `path`, stamping records with the system clock.
    pub async fn open(path: impl Into<PathBuf>) -> Result<Self, StoreError> {
        SqliteCheckpointStore::open_with_clock(path, Arc::new(SystemClock)).await
    }

    /// Opens (creating if needed) the store at `path`, stamping `last_modified_time_ms` with
    /// `clock`.
    pub async fn open_with_clock(
        path: impl Into<PathBuf>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        let path = path.into();
        let open_path = path.clone();
        let (jobs, queue) = mpsc::channel::<Job>();
        let (opened, answer) = oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("sqlite-checkpoints".to_owned())
            .spawn(move || {
                let mut connection = match open_connection(&open_path) {
                    Ok(connection) => connection,
                    Err(error) => {
                        let _ = opened.send(Err(error));
                        return;
                    }
                };
                let _ = opened.send(Ok(()));
                while let Ok(job) = queue.recv() {
                    // A panic in `work` drops its open transaction, which rolls it back, and
                    // its answer, which its caller gets as an error: the connection stays
                    // consistent and serves the next call.
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(|| job(&mut connection)));
                }
            });
        spawned.map_err(|error| StoreError::Backend {
            operation: "opening the database",
            description: format!("cannot start the store's thread: {error}"),
        })?;
        answer
            .await
            .map_err(|_| connection_gone("opening the database"))??;
        Ok(SqliteCheckpointStore { path, clock, jobs })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `work` on this store's connection, on its thread.
    async fn with_connection<T, F>(&self, operation: &'static str, work: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(move |connection| {
            let _ = reply.send(work(connection));
        });
        self.jobs
            .send(job)
            .map_err(|_| connection_gone(operation))?;
        answer.await.map_err(|_| connection_gone(operation))?
    }
}

fn open_connection(path: &Path) -> Result<Connection, StoreError> {
    let opening = "opening the database";
    let with_path = |error: rusqlite::Error| StoreError::Backend {
        operation: opening,
        description: format!("{}: {error}", path.display()),
    };
    let mut connection = Connection::open(path).map_err(with_path)?;
    connection
        .busy_timeout(SQLITE_BUSY_TIMEOUT)
        .map_err(with_path)?;
    // Before anything changes the file: a newer build's file stays as it is.
    refuse_newer(&connection).map_err(|error| match error {
        StoreError::Backend { description, .. } => StoreError::Backend {
            operation: opening,
            description: format!("{}: {description}", path.display()),
        },
        other => other,
    })?;
    let journal_mode = switch_to_wal(&connection).map_err(with_path)?;
    if !journal_mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Backend {
            operation: opening,
            description: format!(
                "{}: SQLite refused WAL mode (journal mode is {journal_mode:?}); use a file on a \
                 local file system",
                path.display()
            ),
        });
    }
    connection
        .pragma_update(None, "synchronous", "NORMAL")
        .map_err(with_path)?;
    create_schema(&mut connection).map_err(|error| match error {
        StoreError::Backend { description, .. } => StoreError::Backend {
            operation: opening,
            description: format!("{}: {description}", path.display()),
        },
        other => other,
    })?;
    Ok(connection)
}

/// Puts the file in WAL mode (a no-op when it already is); returns the journal mode after.
///
/// SQLite answers `PRAGMA journal_mode = WAL` with `SQLITE_BUSY` at once, without calling the
/// busy handler, while another connection holds the file's lock to switch it itself; so
/// processes opening one fresh file together would fail. The switch is retried instead until
/// [`SQLITE_BUSY_TIMEOUT`] has passed.
fn switch_to_wal(connection: &Connection) -> Result<String, rusqlite::Error> {
    let deadline = std::time::Instant::now() + SQLITE_BUSY_TIMEOUT;
    loop {
        match connection.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)) {
            Err(rusqlite::Error::SqliteFailure(failure, _))
                if failure.code == rusqlite::ErrorCode::DatabaseBusy
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            result => return result,
        }
    }
}

/// Refuses a file written by a newer schema than [`SCHEMA_VERSION`].
fn refuse_newer(connection: &Connection) -> Result<(), StoreError> {
    let found_version: i64 = connection
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(backend("creating the schema"))?;
    let newest = SCHEMA_VERSION.unsigned_abs();
    check_format_version("the file", found_version.unsigned_abs(), newest).map_err(|too_new| {
        StoreError::Backend {
            operation: "creating the schema",
            description: too_new.to_string(),
        }
    })
}

fn create_schema(connection: &mut Connection) -> Result<(), StoreError> {
    let sql = backend("creating the schema");
    let transaction = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(&sql)?;
    // Again inside the transaction: another process may have created the file meanwhile.
    refuse_newer(&transaction)?;
    transaction.execute_batch(CREATE_SCHEMA).map_err(&sql)?;
    transaction
        .pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(&sql)?;
    transaction.commit().map_err(&sql)
}

/// Tries one claim inside the caller's transaction; returns the stored record if it won.
fn try_claim(
    transaction: &rusqlite::Transaction<'_>,
    claim: Ownership,
    now_ms: i64,
) -> Result<Option<Ownership>, StoreError> {
    let sql = backend("claiming ownership");
    let scope = ScopeKey::new(
        &claim.fully_qualified_namespace,
        &claim.event_hub_name,
        &claim.consumer_group,
    );
    let etag = new_etag();
    let won_version: Option<i64> = match &claim.etag {
        None => {
            let inserted = transaction
                .prepare_cached(
                    "INSERT INTO ownership (namespace, event_hub, consumer_group, partition_id, \
                     owner_id, last_modified_time_ms, etag, version) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 1) ON CONFLICT DO NOTHING",
                )
                .and_then(|mut statement| {
                    statement.execute(params![
                        scope.namespace,
                        scope.hub,
                        scope.consumer_group,
                        claim.partition_id,
                        claim.owner_id,
                        now_ms,
                        etag
                    ])
                })
                .map_err(&sql)?;
            (inserted == 1).then_some(1)
        }
        Some(expected_etag) => transaction
            .prepare_cached(
                "UPDATE ownership SET owner_id = ?5, last_modified_time_ms = ?6, etag = ?7, \
                 version = version + 1 \
                 WHERE namespace = ?1 AND event_hub = ?2 AND consumer_group = ?3 \
                 AND partition_id = ?4 AND etag = ?8 RETURNING version",
            )
            .and_then(|mut statement| {
                statement.query_row(
                    params![
                        scope.namespace,
                        scope.hub,
                        scope.consumer_group,
                        claim.partition_id,
                        claim.owner_id,
                        now_ms,
                        etag,
                        expected_etag
                    ],
                    |row| row.get(0),
                )
            })
            .optional()
            .map_err(&sql)?,
    };
    Ok(won_version.map(|version| {
        assert!(version >= 1);
        Ownership {
            fully_qualified_namespace: scope.namespace,
            event_hub_name: scope.hub,
            consumer_group: scope.consumer_group,
            partition_id: claim.partition_id,
            owner_id: claim.owner_id,
            last_modified_time_ms: now_ms,
            etag: Some(etag),
            version,
        }
    }))
}

fn claim_all(
    connection: &mut Connection,
    claims: Vec<Ownership>,
    now_ms: i64,
) -> Result<Vec<Ownership>, StoreError> {
    let sql = backend("claiming ownership");
    let transaction = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(&sql)?;
    let mut won = Vec::with_capacity(claims.len());
    for claim in claims {
        if let Some(record) = try_claim(&transaction, claim, now_ms)? {
            won.push(record);
        }
    }
    transaction.commit().map_err(&sql)?;
    Ok(won)
}

fn list_ownership_rows(
    connection: &Connection,
    scope: &ScopeKey,
) -> Result<Vec<Ownership>, StoreError> {
    let sql = backend("listing ownership");
    let mut statement = connection
        .prepare_cached(
            "SELECT partition_id, owner_id, last_modified_time_ms, etag, version FROM ownership \
             WHERE namespace = ?1 AND event_hub = ?2 AND consumer_group = ?3 \
             ORDER BY partition_id",
        )
        .map_err(&sql)?;
    let rows = statement
        .query_map(
            params![scope.namespace, scope.hub, scope.consumer_group],
            |row| {
                Ok(Ownership {
                    fully_qualified_namespace: scope.namespace.clone(),
                    event_hub_name: scope.hub.clone(),
                    consumer_group: scope.consumer_group.clone(),
                    partition_id: row.get(0)?,
                    owner_id: row.get(1)?,
                    last_modified_time_ms: row.get(2)?,
                    etag: Some(row.get(3)?),
                    version: row.get(4)?,
                })
            },
        )
        .map_err(&sql)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(&sql)
}

/// Renews `owner_id`'s host record, forgets the scope's silent ones, and lists the scope's
/// ownership and host records, in one transaction.
fn renew_host_row(
    connection: &mut Connection,
    scope: &ScopeKey,
    owner_id: &str,
    now_ms: i64,
) -> Result<OwnershipListing, StoreError> {
    let sql = backend("renewing the host record");
    let transaction = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(&sql)?;
    transaction
        .prepare_cached(
            "DELETE FROM host WHERE namespace = ?1 AND event_hub = ?2 AND consumer_group = ?3 \
             AND last_modified_time_ms <= ?4",
        )
        .and_then(|mut statement| {
            statement.execute(params![
                scope.namespace,
                scope.hub,
                scope.consumer_group,
                host_record_horizon_ms(now_ms)
            ])
        })
        .map_err(&sql)?;
    transaction
        .prepare_cached(
            "INSERT INTO host (namespace, event_hub, consumer_group, owner_id, \
             last_modified_time_ms, version) VALUES (?1, ?2, ?3, ?4, ?5, 1) \
             ON CONFLICT (namespace, event_hub, consumer_group, owner_id) DO UPDATE SET \
             last_modified_time_ms = excluded.last_modified_time_ms, version = version + 1",
        )
        .and_then(|mut statement| {
            statement.execute(params![
                scope.namespace,
                scope.hub,
                scope.consumer_group,
                owner_id,
                now_ms
            ])
        })
        .map_err(&sql)?;
    let hosts = list_host_rows(&transaction, scope, now_ms)?;
    let ownership = list_ownership_rows(&transaction, scope)?;
    transaction.commit().map_err(&sql)?;
    Ok(OwnershipListing { ownership, hosts })
}

/// The scope's host records, but those past [`host_record_horizon_ms`] at `now_ms`.
fn list_host_rows(
    connection: &Connection,
    scope: &ScopeKey,
    now_ms: i64,
) -> Result<Vec<HostRecord>, StoreError> {
    let sql = backend("listing host records");
    let mut statement = connection
        .prepare_cached(
            "SELECT owner_id, version, last_modified_time_ms FROM host \
             WHERE namespace = ?1 AND event_hub = ?2 AND consumer_group = ?3 \
             AND last_modified_time_ms > ?4",
        )
        .map_err(&sql)?;
    let rows = statement
        .query_map(
            params![
                scope.namespace,
                scope.hub,
                scope.consumer_group,
                host_record_horizon_ms(now_ms)
            ],
            |row| {
                Ok(HostRecord {
                    owner_id: row.get(0)?,
                    version: row.get(1)?,
                    last_modified_time_ms: row.get(2)?,
                })
            },
        )
        .map_err(&sql)?;
    rows.collect::<Result<Vec<_>, _>>().map_err(&sql)
}

fn list_checkpoint_rows(
    connection: &Connection,
    scope: &ScopeKey,
) -> Result<Vec<Checkpoint>, StoreError> {
    let sql = backend("listing checkpoints");
    let mut statement = connection
        .prepare_cached(
            "SELECT partition_id, event_offset, sequence_number FROM checkpoint \
             WHERE namespace = ?1 AND event_hub = ?2 AND consumer_group = ?3 \
             ORDER BY partition_id",
        )
        .map_err(&sql)?;
    let rows = statement
        .query_map(
            params![scope.namespace, scope.hub, scope.consumer_group],
            |row| {
                let offset: Option<i64> = row.get(1)?;
                Ok((row.get::<_, String>(0)?, offset, row.get(2)?))
            },
        )
        .map_err(&sql)?;
    let mut checkpoints = Vec::new();
    for row in rows {
        let (partition_id, offset, sequence_number) = row.map_err(&sql)?;
        let offset = offset
            .map(|offset| {
                u64::try_from(offset).map_err(|_| StoreError::Backend {
                    operation: "listing checkpoints",
                    description: format!(
                        "partition {partition_id} has a negative stored offset {offset}; the \
                         file was not written by this store"
                    ),
                })
            })
            .transpose()?;
        checkpoints.push(Checkpoint {
            fully_qualified_namespace: scope.namespace.clone(),
            event_hub_name: scope.hub.clone(),
            consumer_group: scope.consumer_group.clone(),
            partition_id,
            offset,
            sequence_number,
        });
    }
    Ok(checkpoints)
}

fn write_fenced_checkpoint(
    connection: &mut Connection,
    scope: &ScopeKey,
    checkpoint: Checkpoint,
    offset: Option<i64>,
    fence_owner: String,
) -> Result<(), StoreError> {
    let sql = backend("updating a checkpoint");
    let transaction = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(&sql)?;
    let current_owner: String = transaction
        .prepare_cached(
            "SELECT owner_id FROM ownership WHERE namespace = ?1 AND event_hub = ?2 \
             AND consumer_group = ?3 AND partition_id = ?4",
        )
        .and_then(|mut statement| {
            statement.query_row(
                params![
                    scope.namespace,
                    scope.hub,
                    scope.consumer_group,
                    checkpoint.partition_id
                ],
                |row| row.get(0),
            )
        })
        .optional()
        .map_err(&sql)?
        .unwrap_or_default();
    if fence_owner.is_empty() || current_owner != fence_owner {
        return Err(StoreError::OwnershipLost {
            partition_id: checkpoint.partition_id,
            current_owner,
            fence_owner,
        });
    }
    transaction
        .prepare_cached(
            "INSERT INTO checkpoint (namespace, event_hub, consumer_group, partition_id, \
             event_offset, sequence_number) VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
             ON CONFLICT (namespace, event_hub, consumer_group, partition_id) DO UPDATE SET \
             event_offset = excluded.event_offset, sequence_number = excluded.sequence_number",
        )
        .and_then(|mut statement| {
            statement.execute(params![
                scope.namespace,
                scope.hub,
                scope.consumer_group,
                checkpoint.partition_id,
                offset,
                checkpoint.sequence_number
            ])
        })
        .map_err(&sql)?;
    transaction.commit().map_err(&sql)
}

#[async_trait::async_trait]
impl CheckpointStore for SqliteCheckpointStore {
    async fn list_ownership(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<Vec<Ownership>, StoreError> {
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        self.with_connection("listing ownership", move |connection| {
            list_ownership_rows(connection, &scope)
        })
        .await
    }

    async fn claim_ownership(&self, claims: Vec<Ownership>) -> Result<Vec<Ownership>, StoreError> {
        claims.iter().try_for_each(validate_claim)?;
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let now_ms = self.clock.now_ms();
        self.with_connection("claiming ownership", move |connection| {
            claim_all(connection, claims, now_ms)
        })
        .await
    }

    fn keeps_host_records(&self) -> bool {
        true
    }

    async fn renew_host(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
        owner_id: &str,
    ) -> Result<OwnershipListing, StoreError> {
        validate_host(owner_id)?;
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        let owner_id = owner_id.to_owned();
        let now_ms = self.clock.now_ms();
        self.with_connection("renewing the host record", move |connection| {
            renew_host_row(connection, &scope, &owner_id, now_ms)
        })
        .await
    }

    async fn list_ownership_and_hosts(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<OwnershipListing, StoreError> {
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        let now_ms = self.clock.now_ms();
        self.with_connection("listing ownership and hosts", move |connection| {
            // One read transaction, so both lists are of one moment.
            let transaction = connection
                .transaction()
                .map_err(backend("listing ownership and hosts"))?;
            let hosts = list_host_rows(&transaction, &scope, now_ms)?;
            let ownership = list_ownership_rows(&transaction, &scope)?;
            Ok(OwnershipListing { ownership, hosts })
        })
        .await
    }

    async fn remove_host(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
        owner_id: &str,
    ) -> Result<(), StoreError> {
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        let owner_id = owner_id.to_owned();
        self.with_connection("removing the host record", move |connection| {
            connection
                .prepare_cached(
                    "DELETE FROM host WHERE namespace = ?1 AND event_hub = ?2 \
                     AND consumer_group = ?3 AND owner_id = ?4",
                )
                .and_then(|mut statement| {
                    statement.execute(params![
                        scope.namespace,
                        scope.hub,
                        scope.consumer_group,
                        owner_id
                    ])
                })
                .map(drop)
                .map_err(backend("removing the host record"))
        })
        .await
    }

    async fn list_checkpoints(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<Vec<Checkpoint>, StoreError> {
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        self.with_connection("listing checkpoints", move |connection| {
            list_checkpoint_rows(connection, &scope)
        })
        .await
    }

    async fn update_checkpoint(
        &self,
        checkpoint: Checkpoint,
        fence: &OwnershipFence,
    ) -> Result<(), StoreError> {
        validate_checkpoint(&checkpoint)?;
        let offset = sql_offset(&checkpoint)?;
        let scope = ScopeKey::new(
            &checkpoint.fully_qualified_namespace,
            &checkpoint.event_hub_name,
            &checkpoint.consumer_group,
        );
        let fence_owner = fence.owner_id.clone();
        self.with_connection("updating a checkpoint", move |connection| {
            write_fenced_checkpoint(connection, &scope, checkpoint, offset, fence_owner)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance;

    #[tokio::test]
    async fn passes_the_conformance_suite() {
        let directory = tempfile::tempdir().unwrap();
        let clock = Arc::new(tributary_event::ManualClock::new(1_000));
        let store = SqliteCheckpointStore::open_with_clock(
            directory.path().join("store.db"),
            clock.clone(),
        )
        .await
        .unwrap();
        conformance::run_all(&store, &clock).await;
    }

    #[tokio::test]
    async fn separate_connections_to_one_file_have_exactly_one_claim_winner() {
        // Each store has its own connection, so they contend through SQLite's file locks just
        // as separate processes do.
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("shared.db");
        let mut stores: Vec<Arc<dyn CheckpointStore>> = Vec::new();
        for _ in 0..6 {
            stores.push(Arc::new(SqliteCheckpointStore::open(&path).await.unwrap()));
        }
        conformance::exactly_one_concurrent_claim_wins(stores).await;
    }

    #[tokio::test]
    async fn records_survive_reopening_the_file() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("durable.db");
        let store = SqliteCheckpointStore::open(&path).await.unwrap();
        let won = store
            .claim_ownership(vec![conformance::new_claim("0", "host-a")])
            .await
            .unwrap();
        assert_eq!(won.len(), 1);
        let checkpoint = conformance::checkpoint("0", Some(42), Some(7));
        let fence = OwnershipFence {
            owner_id: "host-a".to_owned(),
        };
        store
            .update_checkpoint(checkpoint.clone(), &fence)
            .await
            .unwrap();
        drop(store);

        let reopened = SqliteCheckpointStore::open(&path).await.unwrap();
        let (ns, hub, group) = conformance::SCOPE;
        let ownership = reopened.list_ownership(ns, hub, group).await.unwrap();
        assert_eq!(ownership, won);
        let checkpoints = reopened.list_checkpoints(ns, hub, group).await.unwrap();
        assert_eq!(checkpoints.len(), 1);
        assert_eq!(checkpoints[0].offset, Some(42));
        assert_eq!(checkpoints[0].sequence_number, Some(7));
    }

    #[tokio::test]
    async fn offsets_beyond_i64_are_refused_with_a_reason() {
        let directory = tempfile::tempdir().unwrap();
        let store = SqliteCheckpointStore::open(directory.path().join("big.db"))
            .await
            .unwrap();
        store
            .claim_ownership(vec![conformance::new_claim("0", "host-a")])
            .await
            .unwrap();
        let fence = OwnershipFence {
            owner_id: "host-a".to_owned(),
        };
        let error = store
            .update_checkpoint(conformance::checkpoint("0", Some(u64::MAX), None), &fence)
            .await
            .unwrap_err();
        assert!(matches!(error, StoreError::Invalid { .. }), "{error}");
    }

    #[tokio::test]
    async fn a_file_from_a_newer_schema_is_refused() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("future.db");
        {
            let connection = Connection::open(&path).unwrap();
            connection
                .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
                .unwrap();
        }
        let error = SqliteCheckpointStore::open(&path).await.unwrap_err();
        assert!(
            error
                .to_string()
                .contains("the file was written by format 3; this binary reads up to format 2"),
            "{error}"
        );
    }

    /// Several processes starting together open one fresh file at once: every one of them
    /// gets a working store (WAL mode, schema) — none fails because another is mid-setup.
    #[test]
    fn many_first_opens_at_once_all_succeed() {
        for round in 0..50 {
            let directory = tempfile::tempdir().unwrap();
            let path = directory.path().join("together.db");
            let start = std::sync::Arc::new(std::sync::Barrier::new(6));
            let openers: Vec<_> = (0..6)
                .map(|_| {
                    let (path, start) = (path.clone(), start.clone());
                    std::thread::spawn(move || {
                        start.wait();
                        open_connection(&path).map(drop)
                    })
                })
                .collect();
            for opener in openers {
                if let Err(error) = opener.join().unwrap() {
                    panic!("round {round}: {error}");
                }
            }
        }
    }
}
