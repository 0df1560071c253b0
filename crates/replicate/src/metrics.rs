//! What a task counts, per source partition: events in, out (per target), dead-lettered,
//! filtered (by reason), send retries, the replication lag, and the checkpoint; and for the
//! whole task, the source's health: the failures reaching it (an unreachable Kafka cluster, a
//! hub that stopped answering) and whether the latest attempt failed, since when, and why.
//!
//! Counting is a few relaxed atomic additions per batch. [`TaskMetrics::snapshot`] copies the
//! counters for `tributary replicate --status` and the progress line;
//! [`TaskMetrics::encode_prometheus`] writes them in the OpenMetrics text format under
//! `tributary_replicate_*`, labelled by task, partition and target.
//!
//! **Replication lag** is the time from an event's enqueued time in the source to the target's
//! acknowledgement of the send that carried it, measured when the acknowledgement arrives. The
//! source's clock stamps the first, this process's the second; on one machine (or with synced
//! clocks) it is the delay a consumer of the target sees. Enqueued times have millisecond
//! precision, so lags below a millisecond read as 0 or 1 ms.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tributary_log::{DurationCounts, DurationHistogram};

/// Why an event was not forwarded to a target (besides being dead-lettered).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FilterReason {
    /// An editor step dropped it.
    Editor,
    /// No route's condition matched it, and unmatched events are dropped.
    Unmatched,
    /// The target is already on its path, or an earlier hop sent it a copy directly:
    /// forwarding it would make a loop or a second copy.
    Loop,
    /// It was replicated into the source, and the task forwards only events produced there.
    Replicated,
}

impl FilterReason {
    const ALL: [FilterReason; 4] = [
        FilterReason::Editor,
        FilterReason::Unmatched,
        FilterReason::Loop,
        FilterReason::Replicated,
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            FilterReason::Editor => "editor",
            FilterReason::Unmatched => "unmatched",
            FilterReason::Loop => "loop",
            FilterReason::Replicated => "replicated",
        }
    }
}

/// One source partition's counters.
#[derive(Debug, Default)]
pub struct PartitionMetrics {
    events_in: AtomicU64,
    events_out: Mutex<BTreeMap<String, u64>>,
    dead_lettered: AtomicU64,
    lost: AtomicU64,
    filtered: [AtomicU64; 4],
    retries: AtomicU64,
    lag_last_ms: AtomicI64,
    checkpoint_sequence: AtomicI64,
}

impl PartitionMetrics {
    /// Counts events read from the source.
    pub fn received(&self, events: usize) {
        self.events_in.fetch_add(events as u64, Ordering::Relaxed);
    }

    /// Counts events a target acknowledged.
    pub fn sent(&self, target: &str, events: usize) {
        let mut out = self.events_out.lock().expect("events out");
        *out.entry(target.to_owned()).or_default() += events as u64;
    }

    /// Counts an event sent to the dead-letter target.
    pub fn dead_lettered(&self, events: usize) {
        self.dead_lettered
            .fetch_add(events as u64, Ordering::Relaxed);
    }

    /// Counts a poison event that even the dead-letter target refused (or that had none to go
    /// to): logged at error level with its position, and counted here.
    pub fn lost(&self, events: usize) {
        self.lost.fetch_add(events as u64, Ordering::Relaxed);
    }

    /// Counts events not forwarded, and why.
    pub fn filtered(&self, reason: FilterReason, events: u64) {
        self.filtered[reason.index()].fetch_add(events, Ordering::Relaxed);
    }

    /// Counts a send that will be tried again.
    pub fn retried(&self) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    /// Records the checkpoint written.
    pub fn checkpointed(&self, sequence_number: i64) {
        self.checkpoint_sequence
            .store(sequence_number, Ordering::Relaxed);
    }
}

/// The counters of one task, in one process.
#[derive(Debug)]
pub struct TaskMetrics {
    task: String,
    partitions: Mutex<BTreeMap<String, Arc<PartitionMetrics>>>,
    lag: DurationHistogram,
    source: SourceHealth,
}

/// The source's health as this process last saw it.
#[derive(Debug, Default)]
struct SourceHealth {
    /// Failures reaching the source so far.
    errors: AtomicU64,
    /// Whether `failure` holds one not yet followed by an answer (read on every batch, so the
    /// healthy path takes no lock).
    failing: AtomicBool,
    failure: Mutex<Option<SourceFailure>>,
}

/// The source failing: since when (the first failure since it last answered) and the latest
/// error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceFailure {
    /// The first failure since the source last answered, ms since the epoch.
    pub since_ms: i64,
    /// The latest failure's error.
    pub error: String,
}

/// A copy of one partition's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionSnapshot {
    /// Events read from the source.
    pub events_in: u64,
    /// Events each target acknowledged.
    pub events_out: BTreeMap<String, u64>,
    /// Events sent to the dead-letter target.
    pub dead_lettered: u64,
    /// Poison events neither the target nor the dead-letter target took (each logged).
    pub lost: u64,
    /// Events not forwarded, by reason.
    pub filtered: BTreeMap<FilterReason, u64>,
    /// Sends tried again.
    pub retries: u64,
    /// The lag of the latest acknowledged send, in ms.
    pub lag_last_ms: i64,
    /// The sequence number of the latest checkpoint this process wrote (-1: none).
    pub checkpoint_sequence: i64,
}

/// A copy of a task's counters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskSnapshot {
    /// The task's name.
    pub task: String,
    /// Per source partition.
    pub partitions: BTreeMap<String, PartitionSnapshot>,
    /// Acknowledged events whose lag was measured.
    pub lag_count: u64,
    /// Lag percentiles in ms (upper bounds of their buckets), when any was measured.
    pub lag_p50_ms: Option<f64>,
    /// 99th percentile.
    pub lag_p99_ms: Option<f64>,
    /// Failures reaching the source so far.
    #[serde(default)]
    pub source_errors: u64,
    /// The source failing now: its latest attempt failed (none: it answered).
    #[serde(default)]
    pub source_failure: Option<SourceFailure>,
}

impl TaskSnapshot {
    /// Totals over the partitions: (in, out over all targets, dead-lettered, filtered).
    pub fn totals(&self) -> (u64, u64, u64, u64) {
        self.partitions
            .values()
            .fold((0, 0, 0, 0), |(i, o, d, f), p| {
                (
                    i + p.events_in,
                    o + p.events_out.values().sum::<u64>(),
                    d + p.dead_lettered,
                    f + p.filtered.values().sum::<u64>(),
                )
            })
    }
}

impl TaskMetrics {
    /// Counters for the task `task`.
    pub fn new(task: impl Into<String>) -> TaskMetrics {
        TaskMetrics {
            task: task.into(),
            partitions: Mutex::default(),
            lag: DurationHistogram::default(),
            source: SourceHealth::default(),
        }
    }

    /// Records a failure reaching the source at `now_ms`.
    pub fn source_failed(&self, error: &str, now_ms: i64) {
        self.source.errors.fetch_add(1, Ordering::Relaxed);
        let mut failure = self.source.failure.lock().expect("source failure");
        let since_ms = failure.as_ref().map_or(now_ms, |f| f.since_ms);
        *failure = Some(SourceFailure {
            since_ms,
            error: error.to_owned(),
        });
        self.source.failing.store(true, Ordering::Release);
    }

    /// Records that the source answered (a batch, or a receive that waited its time out).
    pub fn source_answered(&self) {
        if self.source.failing.swap(false, Ordering::AcqRel) {
            *self.source.failure.lock().expect("source failure") = None;
        }
    }

    /// The counters of one source partition (made on first use).
    pub fn partition(&self, partition_id: &str) -> Arc<PartitionMetrics> {
        let mut partitions = self.partitions.lock().expect("partitions");
        let entry = partitions
            .entry(partition_id.to_owned())
            .or_insert_with(|| {
                let fresh = PartitionMetrics::default();
                fresh.checkpoint_sequence.store(-1, Ordering::Relaxed);
                Arc::new(fresh)
            });
        Arc::clone(entry)
    }

    /// Records the lag of `events` acknowledged at `now_ms`, each enqueued in the source at the
    /// time given.
    pub fn acknowledged(
        &self,
        partition: &PartitionMetrics,
        enqueued_times_ms: impl Iterator<Item = i64>,
        now_ms: i64,
    ) {
        let mut last = None;
        self.lag.record_all(enqueued_times_ms.map(|enqueued| {
            let lag_ms = now_ms.saturating_sub(enqueued).max(0);
            last = Some(lag_ms);
            Duration::from_millis(u64::try_from(lag_ms).unwrap_or(0))
        }));
        if let Some(lag_ms) = last {
            partition.lag_last_ms.store(lag_ms, Ordering::Relaxed);
        }
    }

    /// The lag histogram so far.
    pub fn lag(&self) -> DurationCounts {
        self.lag.snapshot()
    }

    /// A copy of every counter.
    pub fn snapshot(&self) -> TaskSnapshot {
        let partitions = self.partitions.lock().expect("partitions");
        let lag = self.lag.snapshot();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        TaskSnapshot {
            task: self.task.clone(),
            partitions: partitions
                .iter()
                .map(|(id, p)| (id.clone(), snapshot_of(p)))
                .collect(),
            lag_count: lag.count,
            lag_p50_ms: lag.quantile(0.5).map(ms),
            lag_p99_ms: lag.quantile(0.99).map(ms),
            source_errors: self.source.errors.load(Ordering::Relaxed),
            source_failure: self.source.failure.lock().expect("source failure").clone(),
        }
    }

    /// The counters in the OpenMetrics text format.
    pub fn encode_prometheus(&self) -> String {
        let snapshot = self.snapshot();
        let mut out = String::new();
        let task = escape(&snapshot.task);
        let mut family = |name: &str, kind: &str, help: &str| {
            let _ = writeln!(out, "# HELP tributary_replicate_{name} {help}");
            let _ = writeln!(out, "# TYPE tributary_replicate_{name} {kind}");
        };
        family("events_in", "counter", "Events read from the source.");
        family("events_out", "counter", "Events a target acknowledged.");
        family(
            "events_dead_lettered",
            "counter",
            "Events sent to the dead-letter target.",
        );
        family(
            "events_lost",
            "counter",
            "Poison events no target took (each logged at error level).",
        );
        family(
            "events_filtered",
            "counter",
            "Events not forwarded, by reason.",
        );
        family("send_retries", "counter", "Sends tried again.");
        family(
            "lag_last_seconds",
            "gauge",
            "Lag of the latest acknowledged send.",
        );
        family(
            "checkpoint_sequence_number",
            "gauge",
            "The latest checkpoint written.",
        );
        family(
            "source_errors",
            "counter",
            "Failures reaching the source (each logged).",
        );
        family(
            "source_up",
            "gauge",
            "1 when the source answered its latest request, 0 while it fails.",
        );
        for (partition, p) in &snapshot.partitions {
            let labels = format!("task=\"{task}\",partition=\"{}\"", escape(partition));
            encode_partition(&mut out, &labels, p);
        }
        let _ = writeln!(
            out,
            "tributary_replicate_source_errors_total{{task=\"{task}\"}} {}",
            snapshot.source_errors
        );
        let _ = writeln!(
            out,
            "tributary_replicate_source_up{{task=\"{task}\"}} {}",
            u8::from(snapshot.source_failure.is_none())
        );
        encode_lag(&mut out, &task, &self.lag.snapshot());
        out.push_str("# EOF\n");
        out
    }
}

fn snapshot_of(p: &PartitionMetrics) -> PartitionSnapshot {
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    PartitionSnapshot {
        events_in: load(&p.events_in),
        events_out: p.events_out.lock().expect("events out").clone(),
        dead_lettered: load(&p.dead_lettered),
        lost: load(&p.lost),
        filtered: FilterReason::ALL
            .iter()
            .map(|reason| (*reason, load(&p.filtered[reason.index()])))
            .filter(|(_, n)| *n > 0)
            .collect(),
        retries: load(&p.retries),
        lag_last_ms: p.lag_last_ms.load(Ordering::Relaxed),
        checkpoint_sequence: p.checkpoint_sequence.load(Ordering::Relaxed),
    }
}

fn encode_partition(out: &mut String, labels: &str, p: &PartitionSnapshot) {
    let prefix = "tributary_replicate";
    let _ = writeln!(out, "{prefix}_events_in_total{{{labels}}} {}", p.events_in);
    for (target, n) in &p.events_out {
        let _ = writeln!(
            out,
            "{prefix}_events_out_total{{{labels},target=\"{}\"}} {n}",
            escape(target)
        );
    }
    let _ = writeln!(
        out,
        "{prefix}_events_dead_lettered_total{{{labels}}} {}",
        p.dead_lettered
    );
    let _ = writeln!(out, "{prefix}_events_lost_total{{{labels}}} {}", p.lost);
    for (reason, n) in &p.filtered {
        let _ = writeln!(
            out,
            "{prefix}_events_filtered_total{{{labels},reason=\"{}\"}} {n}",
            reason.as_str()
        );
    }
    let _ = writeln!(out, "{prefix}_send_retries_total{{{labels}}} {}", p.retries);
    let _ = writeln!(
        out,
        "{prefix}_lag_last_seconds{{{labels}}} {}",
        p.lag_last_ms as f64 / 1000.0
    );
    let _ = writeln!(
        out,
        "{prefix}_checkpoint_sequence_number{{{labels}}} {}",
        p.checkpoint_sequence
    );
}

fn encode_lag(out: &mut String, task: &str, lag: &DurationCounts) {
    let name = "tributary_replicate_lag_seconds";
    let _ = writeln!(
        out,
        "# HELP {name} Source enqueued time to target acknowledgement."
    );
    let _ = writeln!(out, "# TYPE {name} histogram");
    let mut cumulative = 0;
    for (bound, n) in lag.buckets() {
        cumulative += n;
        let le = bound.map_or("+Inf".to_owned(), |b| b.as_secs_f64().to_string());
        let _ = writeln!(
            out,
            "{name}_bucket{{task=\"{task}\",le=\"{le}\"}} {cumulative}"
        );
    }
    let _ = writeln!(
        out,
        "{name}_sum{{task=\"{task}\"}} {}",
        lag.total.as_secs_f64()
    );
    let _ = writeln!(out, "{name}_count{{task=\"{task}\"}} {}", lag.count);
}

/// A label value with `\`, `"` and newlines escaped, as the text format requires.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_fails_since_its_first_failure_until_it_answers() {
        let metrics = TaskMetrics::new("t");
        metrics.source_answered();
        assert_eq!(metrics.snapshot().source_failure, None);
        assert!(
            metrics
                .encode_prometheus()
                .contains("tributary_replicate_source_up{task=\"t\"} 1")
        );
        metrics.source_failed("all brokers down", 1_000);
        metrics.source_failed("connection refused", 2_000);
        let snapshot = metrics.snapshot();
        let failure = snapshot.source_failure.expect("failing");
        assert_eq!(
            (failure.since_ms, failure.error.as_str()),
            (1_000, "connection refused")
        );
        assert_eq!(snapshot.source_errors, 2);
        let text = metrics.encode_prometheus();
        assert!(text.contains("tributary_replicate_source_up{task=\"t\"} 0"));
        assert!(text.contains("tributary_replicate_source_errors_total{task=\"t\"} 2"));
        metrics.source_answered();
        let snapshot = metrics.snapshot();
        assert_eq!((snapshot.source_failure, snapshot.source_errors), (None, 2));
        metrics.source_failed("again", 5_000);
        assert_eq!(metrics.snapshot().source_failure.unwrap().since_ms, 5_000);
    }

    #[test]
    fn counters_add_up_and_are_exported() {
        let metrics = TaskMetrics::new("copy \"a\"");
        let p0 = metrics.partition("0");
        p0.received(10);
        p0.sent("backup", 7);
        p0.dead_lettered(1);
        p0.filtered(FilterReason::Loop, 2);
        metrics.acknowledged(&p0, [1_000, 1_003].into_iter(), 1_005);
        p0.checkpointed(9);
        let snapshot = metrics.snapshot();
        assert_eq!(snapshot.totals(), (10, 7, 1, 2));
        assert_eq!(snapshot.partitions["0"].lag_last_ms, 2);
        assert_eq!(snapshot.lag_count, 2);
        let text = metrics.encode_prometheus();
        assert!(text.contains(
            "tributary_replicate_events_out_total{task=\"copy \\\"a\\\"\",partition=\"0\",target=\"backup\"} 7"
        ));
        assert!(text.contains("reason=\"loop\"} 2"));
        assert!(text.contains("tributary_replicate_lag_seconds_count{task=\"copy \\\"a\\\"\"} 2"));
        assert!(text.ends_with("# EOF\n"));
    }
}
