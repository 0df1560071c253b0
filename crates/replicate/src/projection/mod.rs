//! Log projection: a target that turns events into rows of a PostgreSQL table (seed 002's "log
//! projection", what Stream Analytics or a Functions app writing to a database does).
//!
//! Two shapes ([`config::Shape`]): a *history* table holds one row per event, unique on (source
//! hub, source partition, sequence number, part); a *compacted* table one row per partition key,
//! the newest event of the key. Columns: [`config::FIXED_COLUMNS`] plus the mapped ones
//! ([`row`] says how values are written). Tables are created if absent.
//!
//! # Guarantees
//!
//! - **Exactly once, across `kill -9`.** Each batch of one source partition is written in one
//!   transaction together with the task's progress for that partition (the table
//!   `tributary_projection_progress`: task, table, source hub, partition → last sequence number
//!   and offset). The transaction first locks the progress row and skips every event at or
//!   below it, so a replayed batch, or a batch a former owner of the partition writes late,
//!   changes nothing. When a partition is claimed the task starts after the database's
//!   progress, not at the checkpoint store's position ([`Projection::resume_after`] through
//!   the processor host's start position override): a checkpoint store that lags only costs
//!   nothing, one that runs ahead (restored, or shared with another database) skips nothing.
//! - **A replay never regresses a compacted row.** A row is replaced only by an event of the
//!   same source hub and partition with a higher (sequence number, part), or by one of
//!   another source partition enqueued later. A key maps to one source partition while the
//!   partition count stays; after a repartition its events come from another partition, and
//!   the newer enqueued time wins.
//! - **Keyless events** go to the history table itself, or, for a compacted table, to
//!   `<table>_keyless` (history shape) or are refused (`keyless = "refuse"`) to the
//!   dead-letter target, as are events whose mapped field has the wrong type.
//! - A failed write (the database down, a lost connection) is retried without end, on a new
//!   connection; nothing of a failed transaction is kept. The pause between tries starts at the
//!   task's `[retry] backoff_min` and doubles up to the target's `backoff_max` (default: the
//!   task's `[retry] backoff_max`, itself 5 minutes by default), so a table back after an outage
//!   is written to at most that long later. The partition's batches wait meanwhile.
//!
//! A history table takes a batch's rows by one `COPY … FROM STDIN (FORMAT binary)` straight:
//! the locked progress row shuts out every other writer of the partition for this task and
//! the rows after it are new, so nothing in the batch can already be there — unless another
//! task projects the same source hub into the same table. Then the `COPY` fails on the
//! primary key, nothing of the transaction stays, and the batch is written again the careful
//! way, as a compacted table always is: one `INSERT … SELECT … FROM unnest(…) … ON CONFLICT`
//! with the batch's rows as one array parameter per column (binary, like the `COPY`).

pub mod config;
pub mod row;
pub mod sql;

use std::pin::pin;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_postgres::Client;
use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tributary_edit::Position;
use tributary_processor::store::describe_postgres_error;

use crate::forward::{Outgoing, Poison, RetryPolicy};
use config::{Keyless, ProjectionConfig, Shape};
use row::{Cell, Origin};
use sql::{Merge, Rows, Sql};

/// A projection target of a running task.
pub struct Projection {
    /// The route's name in the task file.
    pub name: String,
    config: ProjectionConfig,
    task: String,
    source_hub: String,
    sql: Sql,
    column_types: Vec<Type>,
    /// Idle connections; a batch takes one (or opens one) and gives it back.
    idle: Mutex<Vec<Client>>,
}

impl std::fmt::Debug for Projection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Projection")
            .field("name", &self.name)
            .field("table", &self.config.table)
            .finish_non_exhaustive()
    }
}

/// A failed attempt to write a batch.
struct Failure {
    /// What went wrong, for the log.
    message: String,
    /// Whether a row of the batch was already in the table (a direct `COPY` met a duplicate).
    duplicate: bool,
}

/// The pauses between tries of a failed write: the task's, capped at the target's own
/// `backoff_max` when it sets one (a cap below the task's first pause is the first pause too).
fn write_retry(task: RetryPolicy, backoff_max: Option<Duration>) -> RetryPolicy {
    match backoff_max {
        Some(backoff_max) => RetryPolicy {
            backoff_min: task.backoff_min.min(backoff_max),
            backoff_max,
        },
        None => task,
    }
}

/// A failed database call, described.
fn db(error: &tokio_postgres::Error) -> String {
    describe_postgres_error(error)
}

impl Projection {
    /// Connects, creates the tables if absent and checks they have every column the task
    /// writes; the error says what is wrong (never the password).
    pub async fn open(
        name: &str,
        config: &ProjectionConfig,
        task: &str,
        source_hub: &str,
    ) -> Result<Projection, String> {
        let sql = Sql::new(config);
        let projection = Projection {
            name: name.to_owned(),
            config: config.clone(),
            task: task.to_owned(),
            source_hub: source_hub.to_owned(),
            column_types: row::FIXED_TYPES
                .iter()
                .cloned()
                .chain(config.columns.iter().map(|c| row::column_type(c.kind)))
                .collect(),
            sql,
            idle: Mutex::new(Vec::new()),
        };
        let client = projection.config.url.connect("a projection").await?;
        client
            .batch_execute(&projection.sql.create)
            .await
            .map_err(|e| format!("creating the tables: {}", db(&e)))?;
        client
            .batch_execute(&projection.sql.probe)
            .await
            .map_err(|e| {
                format!(
                    "the table {} lacks a column this task writes (it was made for another task file?): {}",
                    projection.sql.table,
                    db(&e)
                )
            })?;
        projection.idle.lock().await.push(client);
        Ok(projection)
    }

    /// Where the table is, for people.
    pub fn describe(&self) -> String {
        format!("table {} at {}", self.sql.table, self.config.url.location())
    }

    async fn take(&self) -> Result<Client, String> {
        let idle = self.idle.lock().await.pop();
        match idle.filter(|client| !client.is_closed()) {
            Some(client) => Ok(client),
            None => self.config.url.connect("a projection").await,
        }
    }

    async fn give_back(&self, client: Client) {
        if !client.is_closed() {
            self.idle.lock().await.push(client);
        }
    }

    /// The last sequence number of `partition` the table holds (`None`: nothing yet).
    pub async fn resume_after(&self, partition: &str) -> Result<Option<i64>, String> {
        let client = self.take().await?;
        let row = client
            .query_opt(
                &self.sql.read_progress,
                &[&self.task, &self.sql.table, &self.source_hub, &partition],
            )
            .await
            .map_err(|e| db(&e));
        self.give_back(client).await;
        Ok(row?.map(|row| row.get::<_, i64>(0)).filter(|seq| *seq >= 0))
    }

    /// Writes one batch of `partition` — `items`, and the progress `last` (the batch's last
    /// source event, whichever route its events took) — in one transaction, retrying without
    /// end (the task's `retry`, capped by the target's `backoff_max`); returns the events
    /// refused before writing (keyless in a refusing compacted table, a mapped field of the
    /// wrong type).
    pub async fn write(
        &self,
        partition: &str,
        items: Vec<Outgoing>,
        last: Position,
        retry: RetryPolicy,
    ) -> (usize, Vec<Poison>) {
        let (rows, poison) = self.rows(partition, items);
        let retry = write_retry(retry, self.config.backoff_max);
        let mut pause = retry.backoff_min;
        let mut attempt: u64 = 0;
        let mut direct = self.sql.copy_direct.is_some();
        loop {
            match self.write_once(partition, &rows, last, direct).await {
                Ok(written) => return (written, poison),
                Err(failure) if direct && failure.duplicate => {
                    // Rows past the progress are already there: another writer (another task
                    // from the same source hub) shares the table. Merge, skipping them.
                    tracing::info!(
                        target_name = %self.name,
                        partition,
                        error = %failure.message,
                        "{} already holds some of the batch's rows; merging instead of copying",
                        self.describe()
                    );
                    direct = false;
                }
                Err(failure) => {
                    attempt += 1;
                    tracing::warn!(
                        target_name = %self.name,
                        partition,
                        attempt,
                        retry_in_ms = pause.as_millis() as u64,
                        error = %failure.message,
                        "writing to {} failed; retrying",
                        self.describe()
                    );
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(retry.backoff_max);
                }
            }
        }
    }

    /// The rows of `items` (by source position) and the events refused.
    fn rows(&self, partition: &str, items: Vec<Outgoing>) -> (Vec<Vec<Cell>>, Vec<Poison>) {
        let mut rows = Vec::with_capacity(items.len());
        let mut poison = Vec::new();
        let mut previous: Option<(i64, i32)> = None;
        for outgoing in items {
            let sequence = outgoing.position.sequence_number;
            let part = match previous {
                Some((seq, part)) if seq == sequence => part + 1,
                _ => 0,
            };
            previous = Some((sequence, part));
            let keyless = outgoing.event.partition_key.is_none();
            if keyless
                && self.config.shape == Shape::Compacted
                && self.config.keyless == Keyless::Refuse
            {
                poison.push(Poison {
                    reason: format!(
                        "{} is compacted by partition key and refuses keyless events",
                        self.describe()
                    ),
                    outgoing,
                });
                continue;
            }
            let origin = Origin {
                source_hub: &self.source_hub,
                partition,
                position: outgoing.position,
                part,
            };
            match row::row(&outgoing.event, origin, &self.config.columns) {
                Ok(cells) => rows.push(cells),
                Err(reason) => poison.push(Poison { outgoing, reason }),
            }
        }
        (rows, poison)
    }

    async fn write_once(
        &self,
        partition: &str,
        rows: &[Vec<Cell>],
        last: Position,
        direct: bool,
    ) -> Result<usize, Failure> {
        let mut client = self.take().await.map_err(|message| Failure {
            message,
            duplicate: false,
        })?;
        let result = self
            .transaction(&mut client, partition, rows, last, direct)
            .await;
        self.give_back(client).await;
        result.map_err(|e| Failure {
            message: db(&e),
            duplicate: e.code() == Some(&SqlState::UNIQUE_VIOLATION),
        })
    }

    /// The transaction: lock the progress, write the rows after it — `direct`ly into a
    /// history table, else staged and merged — and move it.
    async fn transaction(
        &self,
        client: &mut Client,
        partition: &str,
        rows: &[Vec<Cell>],
        last: Position,
        direct: bool,
    ) -> Result<usize, tokio_postgres::Error> {
        let transaction = client.transaction().await?;
        let key: [&(dyn ToSql + Sync); 4] =
            [&self.task, &self.sql.table, &self.source_hub, &partition];
        let done: i64 = transaction
            .query_one(&self.sql.lock_progress, &key)
            .await?
            .get(0);
        if last.sequence_number <= done {
            // A replay of what the table holds.
            return Ok(0);
        }
        let fresh: Vec<&Vec<Cell>> = rows
            .iter()
            .filter(|cells| matches!(cells[2], Cell::Bigint(seq) if seq > done))
            .collect();
        let mut written = 0;
        match &self.sql.copy_direct {
            _ if fresh.is_empty() => {}
            Some(copy) if direct => written = self.copy(&transaction, copy, &fresh).await?,
            _ => {
                for merge in &self.sql.merges {
                    written += self.merge(&transaction, merge, &fresh).await?;
                }
            }
        }
        let offset = i64::try_from(last.offset).unwrap_or(i64::MAX);
        transaction
            .execute(
                &self.sql.save_progress,
                &[
                    key[0],
                    key[1],
                    key[2],
                    key[3],
                    &last.sequence_number,
                    &offset,
                ],
            )
            .await?;
        transaction.commit().await?;
        Ok(usize::try_from(written).unwrap_or(usize::MAX))
    }

    /// Runs `merge` on the rows of `rows` it takes, one array parameter per column; returns
    /// how many rows it wrote.
    async fn merge(
        &self,
        transaction: &tokio_postgres::Transaction<'_>,
        merge: &Merge,
        rows: &[&Vec<Cell>],
    ) -> Result<u64, tokio_postgres::Error> {
        let taken: Vec<&Vec<Cell>> = rows
            .iter()
            .copied()
            .filter(|cells| match merge.rows {
                Rows::All => true,
                Rows::Keyed => cells[row::KEY_COLUMN] != Cell::Null,
                Rows::Keyless => cells[row::KEY_COLUMN] == Cell::Null,
            })
            .collect();
        if taken.is_empty() {
            return Ok(0);
        }
        let columns: Vec<Vec<&Cell>> = (0..self.column_types.len())
            .map(|column| taken.iter().map(|cells| &cells[column]).collect())
            .collect();
        let params: Vec<&(dyn ToSql + Sync)> = columns
            .iter()
            .map(|column| column as &(dyn ToSql + Sync))
            .collect();
        transaction.execute(&merge.sql, &params).await
    }

    /// `COPY`s `rows` by `statement`; returns how many rows it took.
    async fn copy(
        &self,
        transaction: &tokio_postgres::Transaction<'_>,
        statement: &str,
        rows: &[&Vec<Cell>],
    ) -> Result<u64, tokio_postgres::Error> {
        let sink = transaction.copy_in(statement).await?;
        let mut writer = pin!(BinaryCopyInWriter::new(sink, &self.column_types));
        for cells in rows {
            writer.as_mut().write_raw(cells.iter()).await?;
        }
        writer.finish().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_targets_backoff_max_caps_the_tasks_retry_pause() {
        let task = RetryPolicy {
            backoff_min: Duration::from_millis(200),
            backoff_max: Duration::from_secs(300),
        };
        let own = |max| write_retry(task, max);
        assert_eq!(own(None), task, "the task's pauses by default");
        let capped = own(Some(Duration::from_secs(30)));
        assert_eq!(capped.backoff_min, Duration::from_millis(200));
        assert_eq!(capped.backoff_max, Duration::from_secs(30));
        let below = own(Some(Duration::from_millis(50)));
        assert_eq!(below.backoff_min, Duration::from_millis(50));
        assert_eq!(below.backoff_max, Duration::from_millis(50));
    }
}
