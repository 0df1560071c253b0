//! The demo's processor instance (`tributary demo-worker`, a child process of `tributary demo`)
//! and the aggregates database it writes: per home, per minute, per sensor kind, a count and
//! the time of the last reading; per home, its latest reading.
//!
//! Exactly-once aggregation over an at-least-once feed: the database records, per partition,
//! the sequence number of the last event it applied, and that record is updated in the same
//! SQLite transaction as the aggregates the batch changed. A batch's events at or below it are
//! skipped. So a replay — after a crash, whose checkpoint is behind what was aggregated, or
//! after a rebalance, when the former owner still finishes a batch — never counts an event
//! twice, and the checkpoint store needs no transaction shared with the aggregates: it only
//! says where reading resumes, and may lag (it is written at most once a second per partition).
//!
//! Cheap at the seed's rate: a batch is summed in memory and written as one upsert per (home,
//! minute, kind) cell and one per home, and a partition's batches start at least
//! [`BATCH_INTERVAL`] apart, so that readings gather into few transactions.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rusqlite::{Connection, OptionalExtension, params};
use tokio::io::AsyncReadExt;
use tributary_event::ReceivedEvent;
use tributary_processor::store::StoreLocation;
use tributary_processor::{
    CloseReason, EventProcessor, EventProcessorHost, LoadBalancingStrategy, PartitionContext,
    ProcessorOptions,
};

use super::sensors::ReadingRef;
use crate::args::{DemoWorkerArgs, GlobalArgs};
use crate::hub_handle::HubHandle;

/// The least time between the starts of two batches of one partition: what a reading may wait
/// for its batch, traded for fewer, larger transactions.
const BATCH_INTERVAL: Duration = Duration::from_millis(200);

/// The aggregates schema; created by `tributary demo` before any instance starts.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS applied (
    partition TEXT PRIMARY KEY,
    sequence INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS home_minute (
    home INTEGER NOT NULL,
    minute INTEGER NOT NULL,
    kind TEXT NOT NULL,
    count INTEGER NOT NULL,
    last_ms INTEGER NOT NULL,
    PRIMARY KEY (home, minute, kind)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS latest (
    home INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    stored_ms INTEGER NOT NULL,
    instance TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS latest_by_stored ON latest (stored_ms);
CREATE TABLE IF NOT EXISTS instance_events (
    instance TEXT PRIMARY KEY,
    events INTEGER NOT NULL
);
";

/// Opens the aggregates database (WAL, so the page reads while instances write; a writer waits
/// up to 10 s for another's transaction).
pub fn open(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path)
        .with_context(|| format!("cannot open the aggregates database {}", path.display()))?;
    conn.busy_timeout(Duration::from_secs(10))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    Ok(conn)
}

/// Creates the database and its tables.
pub fn create(path: &Path) -> Result<()> {
    open(path)?
        .execute_batch(SCHEMA)
        .context("cannot create the aggregates tables")
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// One batch's readings summed in memory, so that each (home, minute, kind) cell and each
/// home's latest reading is written once per batch however many readings touch it.
#[derive(Default)]
struct Summed<'a> {
    /// (home, minute, kind) → (readings, the latest reading's time).
    minutes: HashMap<(u32, i64, &'static str), (i64, i64)>,
    /// Home → its latest reading in the batch (a later one wins a tie, as on the database).
    latest: HashMap<u32, ReadingRef<'a>>,
    /// Readings summed.
    readings: usize,
}

impl<'a> Summed<'a> {
    /// Sums the events after sequence number `applied`; bodies that are not readings are
    /// logged and skipped.
    fn of(partition: &str, events: &'a [ReceivedEvent], applied: i64) -> Summed<'a> {
        let mut summed = Summed::default();
        for event in events.iter().filter(|e| e.sequence_number > applied) {
            let Some(reading) = ReadingRef::parse(&event.data.body) else {
                tracing::warn!(
                    partition,
                    sequence = event.sequence_number,
                    "not a sensor reading; skipped"
                );
                continue;
            };
            let minute = reading.at_ms.div_euclid(60_000);
            let cell = summed
                .minutes
                .entry((reading.home, minute, reading.kind))
                .or_insert((0, reading.at_ms));
            cell.0 += 1;
            cell.1 = cell.1.max(reading.at_ms);
            match summed.latest.entry(reading.home) {
                Entry::Occupied(mut held) if reading.at_ms >= held.get().at_ms => {
                    held.insert(reading);
                }
                Entry::Occupied(_) => {}
                Entry::Vacant(slot) => {
                    slot.insert(reading);
                }
            }
            summed.readings += 1;
        }
        summed
    }

    /// Writes the sums (one upsert per cell and per home) in `tx`.
    fn write(&self, tx: &rusqlite::Transaction<'_>, instance: &str) -> Result<()> {
        let mut minute = tx.prepare(
            "INSERT INTO home_minute (home, minute, kind, count, last_ms) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (home, minute, kind) DO UPDATE
             SET count = count + excluded.count, last_ms = max(last_ms, excluded.last_ms)",
        )?;
        for ((home, at_minute, kind), (count, last_ms)) in &self.minutes {
            minute.execute(params![home, at_minute, kind, count, last_ms])?;
        }
        let mut latest = tx.prepare(
            "INSERT INTO latest (home, kind, state, at_ms, stored_ms, instance)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (home) DO UPDATE
             SET kind = excluded.kind, state = excluded.state, at_ms = excluded.at_ms,
                 stored_ms = excluded.stored_ms, instance = excluded.instance
             WHERE excluded.at_ms >= latest.at_ms",
        )?;
        let stored_ms = now_ms();
        for reading in self.latest.values() {
            latest.execute(params![
                reading.home,
                reading.kind,
                reading.state.as_ref(),
                reading.at_ms,
                stored_ms,
                instance
            ])?;
        }
        Ok(())
    }
}

/// Applies one batch of one partition: the events after the partition's applied sequence
/// number, and the new applied sequence number, in one transaction. Returns how many events
/// were applied (skipped replays and unreadable bodies are not).
pub fn apply(
    conn: &mut Connection,
    instance: &str,
    partition: &str,
    events: &[ReceivedEvent],
) -> Result<usize> {
    let Some(last) = events.last() else {
        return Ok(0);
    };
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    let applied: i64 = tx
        .query_row(
            "SELECT sequence FROM applied WHERE partition = ?1",
            [partition],
            |row| row.get(0),
        )
        .optional()?
        .unwrap_or(-1);
    if last.sequence_number <= applied {
        return Ok(0);
    }
    let summed = Summed::of(partition, events, applied);
    summed.write(&tx, instance)?;
    tx.execute(
        "INSERT INTO applied (partition, sequence) VALUES (?1, ?2)
         ON CONFLICT (partition) DO UPDATE SET sequence = excluded.sequence",
        params![partition, last.sequence_number],
    )?;
    tx.execute(
        "INSERT INTO instance_events (instance, events) VALUES (?1, ?2)
         ON CONFLICT (instance) DO UPDATE SET events = events + excluded.events",
        params![instance, i64::try_from(summed.readings)?],
    )?;
    tx.commit()?;
    Ok(summed.readings)
}

/// One partition's aggregator inside an instance.
struct Aggregator {
    path: Arc<PathBuf>,
    conn: Option<Connection>,
    last_checkpoint: Option<Instant>,
    pending: bool,
}

impl Aggregator {
    fn apply(&mut self, context: &PartitionContext, events: &[ReceivedEvent]) -> Result<usize> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            None => self.conn.insert(open(&self.path)?),
        };
        // SQLite is blocking; the instance's runtime has other workers for the pumps.
        tokio::task::block_in_place(|| {
            apply(conn, context.owner_id(), context.partition_id(), events)
        })
    }

    async fn checkpoint(&mut self, context: &PartitionContext) {
        match context.checkpoint().await {
            Ok(()) => {
                self.last_checkpoint = Some(Instant::now());
                self.pending = false;
            }
            Err(e) => {
                tracing::info!(partition = context.partition_id(), error = %e, "checkpoint not written");
            }
        }
    }
}

#[async_trait::async_trait]
impl EventProcessor for Aggregator {
    async fn process_events(&mut self, context: &PartitionContext, events: Vec<ReceivedEvent>) {
        if events.is_empty() {
            return;
        }
        let started = Instant::now();
        if let Err(e) = self.apply(context, &events) {
            // Not checkpointing: the next owner (or the next start) reads these again.
            eprintln!(
                "tributary demo-worker: partition {}: {e:#}",
                context.partition_id()
            );
            self.conn = None;
            return;
        }
        self.pending = true;
        if self
            .last_checkpoint
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(1))
        {
            self.checkpoint(context).await;
        }
        // A partition's events arrive one by one; not asking for the next batch at once lets
        // them gather, so a transaction carries many readings instead of a few.
        tokio::time::sleep_until((started + BATCH_INTERVAL).into()).await;
    }

    async fn close(&mut self, context: &PartitionContext, reason: CloseReason) {
        if reason == CloseReason::Shutdown && self.pending {
            self.checkpoint(context).await;
        }
    }
}

/// `tributary demo-worker`: runs one instance until its standard input closes (the demo
/// stopped it, or died) or it gets SIGTERM, then shuts down gracefully.
pub async fn worker(global: &GlobalArgs, args: &DemoWorkerArgs) -> Result<()> {
    let hub = HubHandle::open(global, &args.hub, Some(&args.connection_string)).await?;
    let namespace = tributary_client::ConnectionString::parse(&args.connection_string)?
        .host()
        .to_owned();
    let source = hub.source(Some(&namespace));
    let store = StoreLocation::Sqlite(args.store.clone())
        .open()
        .await
        .context("cannot open the checkpoint store")?;
    let path = Arc::new(args.aggregates.clone());
    let factory = move |_: &PartitionContext| Aggregator {
        path: path.clone(),
        conn: None,
        last_checkpoint: None,
        pending: false,
    };
    let options = ProcessorOptions {
        host_name: args.host_name.clone(),
        batch_events_max: 500,
        prefetch_count: 1000,
        load_balancing_strategy: LoadBalancingStrategy::Balanced,
        load_balancing_interval: Duration::from_millis(u64::try_from(args.interval)?),
        ownership_expiration: Duration::from_millis(u64::try_from(args.expiration)?),
        ..ProcessorOptions::default()
    }
    .with_initial_position(|_| tributary_event::EventPosition::Earliest);
    let host = EventProcessorHost::builder(source, store, factory)
        .options(options)
        .build()?
        .start()?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 64];
    loop {
        tokio::select! {
            read = stdin.read(&mut buf) => if matches!(read, Ok(0) | Err(_)) { break },
            _ = terminate.recv() => break,
        }
    }
    host.shutdown().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use tributary_event::EventData;

    use super::*;
    use crate::demo::sensors::Reading;

    fn event(sequence_number: i64, home: u32, kind: &'static str, at_ms: i64) -> ReceivedEvent {
        let reading = Reading {
            home,
            kind,
            state: "x".into(),
            at_ms,
        };
        ReceivedEvent {
            sequence_number,
            offset: u64::try_from(sequence_number).unwrap() * 100,
            enqueued_time_ms: at_ms,
            data: EventData::new(reading.body()),
        }
    }

    fn count(conn: &Connection, home: u32, kind: &str) -> i64 {
        conn.query_row(
            "SELECT coalesce(sum(count), 0) FROM home_minute WHERE home = ?1 AND kind = ?2",
            params![home, kind],
            |row| row.get(0),
        )
        .unwrap()
    }

    #[test]
    fn a_replayed_batch_is_counted_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aggregates.sqlite");
        create(&path).unwrap();
        let mut conn = open(&path).unwrap();
        let batch: Vec<_> = (0..3).map(|s| event(s, 7, "door", 60_000 + s)).collect();
        assert_eq!(apply(&mut conn, "a", "0", &batch).unwrap(), 3);
        // The same batch again (a new owner resuming from an older checkpoint), then one that
        // overlaps it: only the new event counts.
        assert_eq!(apply(&mut conn, "b", "0", &batch).unwrap(), 0);
        let overlap: Vec<_> = (2..4).map(|s| event(s, 7, "door", 60_000 + s)).collect();
        assert_eq!(apply(&mut conn, "b", "0", &overlap).unwrap(), 1);
        assert_eq!(count(&conn, 7, "door"), 4);
        // Another partition's sequence numbers are its own.
        assert_eq!(
            apply(&mut conn, "b", "1", &[event(0, 8, "co", 1)]).unwrap(),
            1
        );
        assert_eq!(count(&conn, 8, "co"), 1);
        let latest: (String, i64) = conn
            .query_row(
                "SELECT instance, at_ms FROM latest WHERE home = 7",
                [],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap();
        assert_eq!(latest, ("b".to_owned(), 60_003));
    }

    #[test]
    fn a_batch_is_summed_per_cell_and_keeps_each_homes_newest_reading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aggregates.sqlite");
        create(&path).unwrap();
        let mut conn = open(&path).unwrap();
        // Home 7: two minutes of door readings, out of order; the newest (a tie, so the later
        // one) is its latest. Home 8: one reading in another batch before.
        apply(&mut conn, "a", "1", &[event(0, 8, "co", 120_500)]).unwrap();
        let mut batch = vec![
            event(0, 7, "door", 60_100),
            event(1, 7, "door", 120_200),
            event(2, 7, "door", 60_300),
            event(3, 8, "co", 120_000),
            event(4, 7, "motion", 120_200),
        ];
        batch[1].data = EventData::new(
            Reading {
                home: 7,
                kind: "door",
                state: "first".into(),
                at_ms: 120_200,
            }
            .body(),
        );
        assert_eq!(apply(&mut conn, "a", "0", &batch).unwrap(), 5);
        let cells: Vec<(i64, String, i64, i64)> = conn
            .prepare(
                "SELECT minute, kind, count, last_ms FROM home_minute WHERE home = 7 ORDER BY 1, 2",
            )
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            cells,
            [
                (1, "door".to_owned(), 2, 60_300),
                (2, "door".to_owned(), 1, 120_200),
                (2, "motion".to_owned(), 1, 120_200)
            ]
        );
        let latest = |home: u32| -> (String, i64) {
            conn.query_row(
                "SELECT kind, at_ms FROM latest WHERE home = ?1",
                [home],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap()
        };
        assert_eq!(latest(7), ("motion".to_owned(), 120_200));
        // An older reading does not replace a newer one from an earlier batch.
        assert_eq!(latest(8), ("co".to_owned(), 120_500));
        assert_eq!(count(&conn, 8, "co"), 2);
    }

    #[test]
    fn a_body_that_is_not_a_reading_is_skipped_but_passed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("aggregates.sqlite");
        create(&path).unwrap();
        let mut conn = open(&path).unwrap();
        let junk = ReceivedEvent {
            sequence_number: 0,
            offset: 0,
            enqueued_time_ms: 0,
            data: EventData::new(bytes::Bytes::from_static(b"not json")),
        };
        assert_eq!(
            apply(&mut conn, "a", "0", &[junk, event(1, 1, "co", 5)]).unwrap(),
            1
        );
        let applied: i64 = conn
            .query_row(
                "SELECT sequence FROM applied WHERE partition = '0'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(applied, 1);
    }
}
