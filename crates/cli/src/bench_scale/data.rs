//! The scale scenario's data sweep: a hub of four partitions grows from 1 GiB (doubling) to the
//! plan's `data_max` (50 GiB at most) of 1 KiB events, written in this process straight into
//! the broker (durability `none`, the fastest way to get the bytes on disk); at each size a
//! fresh server child opens the directory and is timed from its start until a client's first
//! read returns an event; its resident set beyond an empty server's is what opening the data
//! costs (the indexes and the rest); then reads deep in the log (in its older half), by offset
//! and by enqueued time, are timed from opening the receiver to its first event. Last,
//! retention: ingest p99 into a hub whose partitions are bounded (so segments are deleted every
//! second while it runs) beside one that is not.
//!
//! The steps' figures are taken with the page cache as the fill left it (a directory that fits
//! in memory and was just written). The biggest directory is then measured again cold: its
//! files are dropped from the page cache before the server starts and before each series of
//! deep reads, as after a reboot or where the data is larger than memory; the targets judge
//! the cold figures.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use tokio::task::JoinSet;
use tributary_broker::{Broker, BrokerConfig, Durability, HubSpec};
use tributary_client::ConsumerClient;
use tributary_event::{EventData, EventPosition, SendTarget};

use super::Plan;
use super::load::{self, Producers};
use super::report::{Chart, Table, Target};
use super::server::{ServerOptions, ServerProcess};
use super::sweeps::{finish, fresh_server, settle};
use crate::args::Sweep;

const HUB: &str = "data";
const PARTITIONS: u32 = 4;
const EVENT_BYTES: usize = 1024;
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;
/// A position recorded every this many batches while filling.
const SAMPLE_EVERY: u64 = 64;

/// The sizes the sweep grows the data to, in bytes.
pub fn steps(plan: &Plan) -> Vec<u64> {
    if plan.quick {
        return vec![2 * MIB, 4 * MIB];
    }
    let sizes: Vec<u64> = [1, 2, 4, 8, 16, 32, 50]
        .iter()
        .map(|g| g * GIB)
        .filter(|&b| b <= plan.data_max)
        .collect();
    if sizes.is_empty() {
        vec![plan.data_max.max(MIB)]
    } else {
        sizes
    }
}

/// Where an event was written: a position to read from later.
#[derive(Debug, Clone, Copy)]
struct Sample {
    partition: u32,
    offset: u64,
    enqueued_time_ms: i64,
}

/// Runs the sweep.
pub async fn sweep(plan: &Plan, progress: &ProgressBar) -> Result<Table> {
    let mut table = Table::new(
        Sweep::Data,
        "Data on disk (one hub of 4 partitions, 1 KiB events)",
        &[
            "data_gib",
            "open_and_serve_ms",
            "server_ready_ms",
            "rss_beyond_empty_mib",
            "read_by_offset_p99_ms",
            "read_by_time_p99_ms",
        ],
        Chart::new(1, "open and serve, ms").right(3, "deep read by offset p99, ms"),
    );
    let empty = fresh_server(plan, "data-empty").await?;
    settle(plan).await;
    let empty_kib = empty.rss_kib();
    finish(plan, empty, "data-empty").await?;
    let dir = plan.work.join("data");
    let _ = std::fs::remove_dir_all(&dir);
    let mut samples = Vec::new();
    let mut written = 0;
    for size in steps(plan) {
        progress.set_message(format!(
            "data: filling to {:.2} GiB",
            size as f64 / GIB as f64
        ));
        written += fill(&dir, size.saturating_sub(written), &mut samples).await?;
        progress.set_message(format!("data: opening {:.2} GiB", size as f64 / GIB as f64));
        let row = open_and_read(plan, &dir, &samples, empty_kib, PageCache::AsFilled).await?;
        table.push(&[written as f64 / GIB as f64], &row);
        progress.inc(1);
    }
    progress.set_message(format!(
        "data: opening {:.2} GiB, page cache dropped",
        written as f64 / GIB as f64
    ));
    let cold = open_and_read(plan, &dir, &samples, empty_kib, PageCache::Dropped).await?;
    let _ = std::fs::remove_dir_all(&dir);
    cold_targets(&mut table, written, &cold);
    retention(plan, progress, &mut table).await?;
    table.note("open and serve: from starting the server process until a new client's first read (receiver on partition 0 from the start) returned an event; a deep read: a new receiver at a position in the older half of the log, until its first event (one link attach and one delivery); steps with the page cache as the fill left it; RSS beyond empty: the server's resident set after the first read minus an empty server's");
    if let Some(capped) = &plan.data_capped {
        table.note(capped);
    }
    Ok(table)
}

/// Appends about `bytes` of 1 KiB events to the hub under `dir` (creating it), recording a
/// position every [`SAMPLE_EVERY`] batches. Returns the bytes written.
async fn fill(dir: &Path, bytes: u64, samples: &mut Vec<Sample>) -> Result<u64> {
    let mut config = BrokerConfig::new(dir);
    config.log.durability = Durability::None;
    let broker = Broker::open(config)
        .await
        .context("cannot open the data hub")?;
    if broker.describe_hub(HUB).is_err() {
        let mut spec = HubSpec::new(HUB, PARTITIONS);
        spec.retention_age_ms = None;
        broker.create_hub(spec).await?;
    }
    let batch: Arc<[EventData]> = (0..load::BATCH_EVENTS)
        .map(|_| EventData::new(vec![b'd'; EVENT_BYTES]))
        .collect();
    let batches = bytes / (EVENT_BYTES * load::BATCH_EVENTS) as u64;
    let writers = u64::from(PARTITIONS) * 4;
    let mut tasks = JoinSet::new();
    for w in 0..writers {
        let (broker, batch) = (broker.clone(), batch.clone());
        let partition = (w % u64::from(PARTITIONS)) as u32;
        tasks.spawn(async move {
            let mut found = Vec::new();
            for n in (w..batches).step_by(writers as usize) {
                let target = SendTarget::Partition(partition.to_string());
                let receipt = broker.send_borrowed(HUB, target, &batch).await?;
                if n % SAMPLE_EVERY < writers {
                    found.push(Sample {
                        partition,
                        offset: receipt.offsets[0],
                        enqueued_time_ms: receipt.enqueued_time_ms,
                    });
                }
            }
            anyhow::Ok(found)
        });
    }
    while let Some(found) = tasks.join_next().await {
        samples.extend(found.context("a writer panicked")??);
    }
    broker.shutdown().await?;
    Ok(batches * (EVENT_BYTES * load::BATCH_EVENTS) as u64)
}

/// The targets, judged on the biggest directory with its page cache dropped (`cold`, a row as
/// [`open_and_read`] returns it), and the note beside them.
fn cold_targets(table: &mut Table, written: u64, cold: &[f64]) {
    let [serve_ms, ready_ms, _, by_offset, by_time] = cold[..] else {
        unreachable!("open_and_read returns five figures")
    };
    table.target(Target::at_most(
        "the biggest data directory opens and serves, page cache dropped",
        serve_ms,
        1000.0,
        "ms",
    ));
    table.target(Target::at_most(
        "a deep read's p99 in it, page cache dropped",
        by_offset.max(by_time),
        5.0,
        "ms",
    ));
    table.note(&format!(
        "cold, {:.2} GiB: its files written back and dropped from the page cache (posix_fadvise DONTNEED) before the server started and before each series of deep reads: opened and served in {serve_ms:.1} ms (server ready in {ready_ms:.1} ms); deep read p99 {by_offset:.2} ms by offset, {by_time:.2} ms by time",
        written as f64 / GIB as f64
    ));
}

/// Whether a step reads `dir` as the fill left it in the page cache or from the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PageCache {
    /// As the fill left it (a directory smaller than memory is then mostly cached).
    AsFilled,
    /// Dropped before the server starts and before each series of deep reads.
    Dropped,
}

/// One step: a server on `dir`, timed to its first read; its memory; the deep reads.
async fn open_and_read(
    plan: &Plan,
    dir: &Path,
    samples: &[Sample],
    empty_kib: u64,
    cache: PageCache,
) -> Result<Vec<f64>> {
    let drop_cache = || -> Result<()> {
        if cache == PageCache::Dropped {
            drop_from_page_cache(dir)?;
        }
        Ok(())
    };
    drop_cache()?;
    let started = Instant::now();
    let server = ServerProcess::start(plan, dir, ServerOptions::default()).await?;
    let consumer = ConsumerClient::connect(&server.conn, HUB).await?;
    read_one(&consumer, 0, EventPosition::Earliest).await?;
    let serve_ms = started.elapsed().as_secs_f64() * 1000.0;
    let ready_ms = server.started_in.as_secs_f64() * 1000.0;
    settle(plan).await;
    let rss_mib = server.rss_kib().saturating_sub(empty_kib) as f64 / 1024.0;
    let reads = if plan.quick { 3 } else { 50 };
    // The older half, in the order written: what a reader catching up from far back asks for.
    let mut deep: Vec<Sample> = samples.to_vec();
    deep.sort_by_key(|s| s.enqueued_time_ms);
    deep.truncate(deep.len().div_ceil(2));
    drop_cache()?;
    let by_offset = timed_reads(&consumer, &deep, reads, |s| EventPosition::Offset {
        offset: s.offset,
        inclusive: true,
    })
    .await?;
    drop_cache()?;
    let by_time = timed_reads(&consumer, &deep, reads, |s| EventPosition::EnqueuedTime {
        enqueued_time_ms: s.enqueued_time_ms,
        inclusive: true,
    })
    .await?;
    consumer.close().await;
    server.stop().await?;
    Ok(vec![serve_ms, ready_ms, rss_mib, by_offset, by_time])
}

/// `reads` reads spread over `samples`, each a new receiver at `position(sample)` until its
/// first event; the p99 in milliseconds.
async fn timed_reads(
    consumer: &ConsumerClient,
    samples: &[Sample],
    reads: usize,
    position: impl Fn(&Sample) -> EventPosition,
) -> Result<f64> {
    anyhow::ensure!(
        !samples.is_empty(),
        "no position was recorded while filling"
    );
    let mut latency = Histogram::<u64>::new(3)?;
    for i in 0..reads {
        let sample = &samples[i * samples.len() / reads];
        let started = Instant::now();
        read_one(consumer, sample.partition, position(sample)).await?;
        let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        latency.record(us.max(1))?;
    }
    Ok(latency.value_at_quantile(0.99) as f64 / 1000.0)
}

/// Opens a receiver at `start` on `partition`, waits for one event and closes it.
async fn read_one(consumer: &ConsumerClient, partition: u32, start: EventPosition) -> Result<()> {
    let mut receiver = consumer
        .open_receiver(&partition.to_string(), "$Default", start, None, 1)
        .await?;
    let events = receiver.receive(1, Duration::from_secs(30)).await?;
    receiver.close().await;
    anyhow::ensure!(
        !events.is_empty(),
        "no event came from partition {partition}"
    );
    Ok(())
}

/// Ingest p99 into a hub whose partitions are bounded to a few segments (retention deletes
/// segments every second while it runs) beside one that keeps everything; added to `table` as
/// a target (at most 1.5× the p99 without) and a note.
async fn retention(plan: &Plan, progress: &ProgressBar, table: &mut Table) -> Result<()> {
    let (segment, bound) = if plan.quick {
        (256 << 10, MIB)
    } else {
        (8 * MIB, 32 * MIB)
    };
    let dir = plan.work.join("retention");
    let _ = std::fs::remove_dir_all(&dir);
    let options = ServerOptions {
        segment_bytes: Some(segment),
    };
    let mut server = ServerProcess::start(plan, &dir, options).await?;
    server.command(&format!("hub keep {PARTITIONS}")).await?;
    server
        .command(&format!("hub trim {PARTITIONS} {bound}"))
        .await?;
    let mut runs = Vec::new();
    for hub in ["keep", "trim"] {
        progress.set_message(format!("data: ingest into {hub} (retention)"));
        let producers = Producers {
            event_bytes: EVENT_BYTES,
            ..Producers::new(vec![hub.into()], PARTITIONS, 4, 16)
        };
        runs.push(load::ingest(plan, &server, &producers).await?);
        progress.inc(1);
    }
    let kept = directory_bytes(&dir.join("hubs").join("keep"));
    let trimmed = directory_bytes(&dir.join("hubs").join("trim"));
    server.stop().await?;
    let _ = std::fs::remove_dir_all(&dir);
    let (keep, trim) = (&runs[0], &runs[1]);
    table.target(Target::at_most(
        "ingest p99 while retention deletes segments, vs without (ratio)",
        trim.p99_ms / keep.p99_ms.max(0.001),
        1.5,
        "×",
    ));
    table.note(&format!(
        "retention: 1 KiB events, 4 producers × 16 sends in flight, {:.2} MiB segments; without retention {} events/s, ack p99 {:.2} ms ({:.0} MiB on disk after); bounded to {} MiB per partition (checked every second) {} events/s, ack p99 {:.2} ms ({:.0} MiB of the hub on disk after)",
        segment as f64 / MIB as f64,
        crate::bench::thousands(keep.rate),
        keep.p99_ms,
        kept as f64 / MIB as f64,
        bound / MIB,
        crate::bench::thousands(trim.rate),
        trim.p99_ms,
        trimmed as f64 / MIB as f64,
    ));
    Ok(())
}

/// Drops every file under `dir` from the page cache: each is written back first (`fsync`: only
/// clean pages can be dropped), then `posix_fadvise(DONTNEED)` evicts its pages, whoever has it
/// open. The server keeps its files open; what it holds in its own memory stays.
fn drop_from_page_cache(dir: &Path) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            drop_from_page_cache(&path)?;
            continue;
        }
        let file = match std::fs::File::open(&path) {
            Ok(file) => file,
            // Gone since the listing (a temporary file renamed): nothing of it to drop.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot open {}", path.display())),
        };
        file.sync_all()
            .and_then(|()| {
                rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)
                    .map_err(std::io::Error::from)
            })
            .with_context(|| format!("cannot drop {} from the page cache", path.display()))?;
    }
    Ok(())
}

/// The bytes of every file under `dir`.
fn directory_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => directory_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}
