//! How fast compaction rewrites a partition of 1 KiB keyed events, and what it does to appends
//! running beside it.
//!
//! `cargo bench -p tributary-log --bench compaction` (set `TRIBUTARY_BENCH_MB` for another
//! partition size, 512 by default, and `TRIBUTARY_BENCH_SEGMENT_MB` for another segment size,
//! 64 by default; each replaced segment costs a few syncs). Three figures:
//! - **mostly superseded**: 16 rounds over one sixteenth as many keys; compaction keeps the last
//!   round. Reported as bytes of the range compacted per second (it reads the range twice:
//!   once to index the keys, once to rewrite) and bytes written per second.
//! - **half superseded**: two rounds over half as many keys; compaction writes half the range.
//! - **ingest beside compaction**: appends of one 1 KiB event, `fsync` durability, at half the
//!   rate one writer reaches alone, first alone, then while compaction runs over and over on
//!   the same partition; p50/p99/p999 of the append latency of each.
//!
//! The partition is written just before it is compacted, so its segments are read from the
//! page cache, as a broker compacting recently sealed segments mostly does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tributary_event::{Clock, EventData, SystemClock};
use tributary_log::{
    Cleanup, CleanupPolicy, CompactionOutcome, Durability, GroupCommitter, LogConfig, PartitionLog,
};

const EVENT_BYTES: usize = 1024;
const BATCH_EVENTS: usize = 64;
const MB: f64 = 1_000_000.0;

/// The segment size: `TRIBUTARY_BENCH_SEGMENT_MB` MiB, 64 by default (half the log's default,
/// so a 512 MB partition has a few segments to compact).
fn segment_bytes() -> u64 {
    std::env::var("TRIBUTARY_BENCH_SEGMENT_MB")
        .ok()
        .and_then(|mb| mb.parse::<u64>().ok())
        .unwrap_or(64)
        * 1024
        * 1024
}

fn config(durability: Durability) -> LogConfig {
    LogConfig {
        durability,
        segment_bytes_max: segment_bytes(),
        cleanup: Cleanup {
            policy: CleanupPolicy::Compact,
            ..Cleanup::default()
        },
        ..LogConfig::default()
    }
}

fn event(key: usize, round: usize) -> EventData {
    let mut event = EventData::new(format!("round {round} key {key} {:.<1$}", "", EVENT_BYTES));
    event.body.truncate(EVENT_BYTES);
    event.partition_key = Some(format!("key-{key}"));
    event
}

/// Appends `rounds` rounds of one event per key, in batches.
fn fill(log: &PartitionLog, keys: usize, rounds: usize) {
    for round in 0..rounds {
        let events: Vec<EventData> = (0..keys).map(|k| event(k, round)).collect();
        for batch in events.chunks(BATCH_EVENTS) {
            log.append(batch).expect("appended");
        }
    }
    log.flush().expect("flushed");
}

fn open(dir: &std::path::Path, durability: Durability) -> PartitionLog {
    PartitionLog::open(
        dir,
        config(durability),
        GroupCommitter::start(),
        Arc::new(SystemClock),
    )
    .expect("the log opens")
}

fn report(name: &str, outcome: &CompactionOutcome) {
    let seconds = outcome.duration.as_secs_f64();
    println!(
        "{name}: {:.0} MB compacted to {:.0} MB in {:.2} s: {:.0} MB/s compacted, {:.0} MB/s written ({} segments, {} rewritten, {} events removed, {} passes)",
        outcome.bytes_before as f64 / MB,
        outcome.bytes_after as f64 / MB,
        seconds,
        outcome.bytes_before as f64 / MB / seconds,
        outcome.bytes_after as f64 / MB / seconds,
        outcome.segments,
        outcome.segments_rewritten,
        outcome.events_removed,
        outcome.passes,
    );
}

fn rewrite_rate(name: &str, events: usize, rounds: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = open(dir.path(), Durability::None);
    fill(&log, events / rounds, rounds);
    // Seal the last round's segment too, with a segment's worth of events of other keys
    // (the compaction keeps them, and the active segment they end in is not compacted).
    let seal: Vec<EventData> = (0..segment_bytes() as usize / EVENT_BYTES)
        .map(|k| event(events + k, 0))
        .collect();
    for batch in seal.chunks(BATCH_EVENTS) {
        log.append(batch).expect("appended");
    }
    let outcome = log.compact(SystemClock.now_ms()).expect("compacted");
    report(name, &outcome);
}

/// Latencies of appends of one event, one every `interval` (or back to back if `None`), for
/// `length`; and the appends made.
fn ingest(log: &PartitionLog, interval: Option<Duration>, length: Duration) -> Vec<Duration> {
    let started = Instant::now();
    let mut latencies = Vec::new();
    let mut next = started;
    let mut i = 0;
    while started.elapsed() < length {
        if let Some(interval) = interval {
            next += interval;
            if let Some(wait) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        let at = Instant::now();
        log.append(&[event(i % 4096, 1_000 + i)]).expect("appended");
        latencies.push(at.elapsed());
        i += 1;
    }
    latencies
}

fn percentiles(latencies: &mut [Duration]) -> String {
    latencies.sort_unstable();
    let at = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize];
    format!(
        "{} appends, p50 {:?}, p99 {:?}, p999 {:?}",
        latencies.len(),
        at(0.5),
        at(0.99),
        at(0.999)
    )
}

fn ingest_beside_compaction(events: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = open(dir.path(), Durability::Fsync);
    fill(&log, events / 8, 8);
    let alone = ingest(&log, None, Duration::from_secs(3));
    let rate = alone.len() as f64 / 3.0;
    let interval = Duration::from_secs_f64(2.0 / rate);
    println!(
        "ingest, fsync, 1 event of 1 KiB per append, one writer flat out: {:.0} appends/s; at half that:",
        rate
    );
    let mut quiet = ingest(&log, Some(interval), Duration::from_secs(5));
    println!("  without compaction: {}", percentiles(&mut quiet));
    let running = Arc::new(AtomicBool::new(true));
    let compactor = {
        let log = log.clone();
        let running = running.clone();
        std::thread::spawn(move || {
            let mut runs = Vec::new();
            while running.load(Ordering::Relaxed) {
                runs.push(log.compact(SystemClock.now_ms()).expect("compacted"));
            }
            runs
        })
    };
    let mut busy = ingest(&log, Some(interval), Duration::from_secs(5));
    running.store(false, Ordering::Relaxed);
    let runs = compactor.join().expect("the compactor");
    let compacted: u64 = runs.iter().map(|r| r.bytes_before).sum();
    println!(
        "  with compaction running ({} runs, {:.0} MB compacted): {}",
        runs.len(),
        compacted as f64 / MB,
        percentiles(&mut busy)
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a test run (`cargo test --benches`) passes nothing and
    // gets a small, quick run.
    let benching = std::env::args().any(|a| a == "--bench");
    let megabytes: usize = std::env::var("TRIBUTARY_BENCH_MB")
        .ok()
        .and_then(|mb| mb.parse().ok())
        .unwrap_or(if benching { 512 } else { 8 });
    let events = megabytes * 1_000_000 / (EVENT_BYTES + 40);
    println!(
        "compaction of {megabytes} MB of {EVENT_BYTES}-byte keyed events ({events} events), segments of {} MiB, {} CPUs",
        segment_bytes() / 1024 / 1024,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    rewrite_rate("mostly superseded (16 rounds)", events, 16);
    rewrite_rate("half superseded (2 rounds)", events, 2);
    if benching {
        ingest_beside_compaction(events);
    }
}
