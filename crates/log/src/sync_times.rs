//! How long the log's `fdatasync` calls take, and how long appends wait for them.
//!
//! With durability `fsync`, an append is acknowledged only after a sync of its file returns, so
//! the disk's sync time is the floor of every acknowledgement and of every end-to-end latency.
//! The group committer records each sync it makes, and each `fsync` append's wait from its
//! hand-off to its sync's return, into a [`SyncTimeRecorder`]; anyone can take
//! a [`SyncTimes`] snapshot at any moment (the broker's metrics do at each scrape, the benchmarks
//! before and after a run) and subtract an earlier one to see a window.
//!
//! # Guarantees
//! - Recording is a few relaxed atomic additions: no lock, no allocation on the sync path.
//! - A snapshot's counters never go down, so [`SyncTimes::since`] of a later and an earlier
//!   snapshot of one recorder is the window between them. (A snapshot taken while a sync is being
//!   recorded may count it in some fields and not yet in others; the next snapshot agrees.)
//! - Durations are kept in fixed buckets ([`SYNC_TIME_BOUNDS_MICROS`], six per decade from 50 µs
//!   to 10 s), so a quantile is known to within its bucket: [`SyncTimes::quantile`] answers with
//!   the bucket's upper bound.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the sync-time buckets in microseconds (a sync lands in the first bucket whose
/// bound it does not exceed; one more bucket holds the rest). Six per decade — 1, 1.5, 2, 3, 5,
/// 7.5 — fine enough to tell a 2 ms disk from a 3 ms one, few enough for a Prometheus histogram.
pub const SYNC_TIME_BOUNDS_MICROS: [u64; 30] = [
    50, 75, 100, 150, 200, 300, 500, 750, 1_000, 1_500, 2_000, 3_000, 5_000, 7_500, 10_000, 15_000,
    20_000, 30_000, 50_000, 75_000, 100_000, 150_000, 200_000, 300_000, 500_000, 750_000,
    1_000_000, 2_000_000, 5_000_000, 10_000_000,
];

const BUCKETS: usize = SYNC_TIME_BOUNDS_MICROS.len() + 1;

const _: () = {
    let mut i = 1;
    while i < SYNC_TIME_BOUNDS_MICROS.len() {
        assert!(SYNC_TIME_BOUNDS_MICROS[i - 1] < SYNC_TIME_BOUNDS_MICROS[i]);
        i += 1;
    }
};

/// The bucket `took` lands in: the first whose bound it does not exceed.
fn bucket_of(took: Duration) -> usize {
    let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    SYNC_TIME_BOUNDS_MICROS.partition_point(|&bound| bound < micros)
}

/// Durations counted into the buckets of [`SYNC_TIME_BOUNDS_MICROS`], with relaxed atomics:
/// the log's sync times, and any other latency measured against the same scale (replication
/// lag). Recording takes no lock and allocates nothing.
#[derive(Debug)]
pub struct DurationHistogram {
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
    nanos: AtomicU64,
}

impl Default for DurationHistogram {
    fn default() -> Self {
        DurationHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            nanos: AtomicU64::new(0),
        }
    }
}

impl DurationHistogram {
    /// Counts one duration.
    pub fn record(&self, took: Duration) {
        self.buckets[bucket_of(took)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Counts every duration of `took`, adding to each counter once (a batch's worth of
    /// latencies costs a few atomic additions, not three per duration).
    pub fn record_all(&self, took: impl IntoIterator<Item = Duration>) {
        let (mut buckets, mut count, mut nanos) = ([0u64; BUCKETS], 0u64, 0u64);
        for took in took {
            buckets[bucket_of(took)] += 1;
            count += 1;
            nanos = nanos.saturating_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
        }
        if count == 0 {
            return;
        }
        for (bucket, counted) in self.buckets.iter().zip(buckets) {
            if counted > 0 {
                bucket.fetch_add(counted, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(count, Ordering::Relaxed);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// What has been counted so far.
    pub fn snapshot(&self) -> DurationCounts {
        DurationCounts {
            counts: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            count: self.count.load(Ordering::Relaxed),
            total: Duration::from_nanos(self.nanos.load(Ordering::Relaxed)),
        }
    }
}

/// Where the committer records its syncs and how long its appends waited. Shared by its
/// threads.
#[derive(Debug, Default)]
pub(crate) struct SyncTimeRecorder {
    pub(crate) syncs: DurationHistogram,
    pub(crate) waits: DurationHistogram,
}

impl SyncTimeRecorder {
    pub(crate) fn snapshot(&self) -> SyncTimes {
        SyncTimes {
            syncs: self.syncs.snapshot(),
            waits: self.waits.snapshot(),
        }
    }
}

/// What the [`GroupCommitter`](crate::GroupCommitter) of a data directory has spent on `fsync`
/// appends since it started (or, after [`SyncTimes::since`], within a window).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncTimes {
    /// Each sync for `fsync` appends (an `fdatasync`, or a `syncfs` that several partitions
    /// share), from its start to its return.
    pub syncs: DurationCounts,
    /// Each append, from its hand-off to the committer (its bytes written) to the return of the
    /// sync that made it durable: the disk's share of the append's acknowledgement. It includes
    /// waiting for the partition's sync already in flight, so a disk that stalls shows here once
    /// for every append that arrived during the stall, and among the syncs only once.
    pub waits: DurationCounts,
}

impl SyncTimes {
    /// What happened between `earlier` and this snapshot, of the same committer.
    pub fn since(&self, earlier: &SyncTimes) -> SyncTimes {
        SyncTimes {
            syncs: self.syncs.since(&earlier.syncs),
            waits: self.waits.since(&earlier.waits),
        }
    }
}

/// One line for a person: the syncs and the waits, each with its mean and quantiles (upper
/// bounds of buckets, written `<=`), and how many appends one sync covered on average.
impl std::fmt::Display for SyncTimes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.syncs.count == 0 && self.waits.count == 0 {
            return write!(f, "no syncs");
        }
        write!(
            f,
            "{} syncs ({}); {} appends waited for them ({}), {:.2} appends per sync",
            self.syncs.count,
            self.syncs,
            self.waits.count,
            self.waits,
            self.waits.count as f64 / self.syncs.count.max(1) as f64
        )
    }
}

/// The mean and the p50, p99 and p999 bucket bounds, in milliseconds.
impl std::fmt::Display for DurationCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        match self.mean() {
            Some(mean) => write!(f, "mean {:.2} ms", ms(mean))?,
            None => return write!(f, "none"),
        }
        for (name, q) in [("p50", 0.50), ("p99", 0.99), ("p999", 0.999)] {
            match self.quantile(q) {
                Some(bound) => write!(f, ", {name} <= {:.2} ms", ms(bound))?,
                None => write!(f, ", {name} > 10 s")?,
            }
        }
        Ok(())
    }
}

/// A histogram of durations over the buckets of [`SYNC_TIME_BOUNDS_MICROS`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurationCounts {
    /// Durations per bucket, the last one for those beyond the last bound.
    counts: [u64; BUCKETS],
    /// How many were recorded.
    pub count: u64,
    /// Their sum.
    pub total: Duration,
}

impl Default for DurationCounts {
    fn default() -> Self {
        DurationCounts {
            counts: [0; BUCKETS],
            count: 0,
            total: Duration::ZERO,
        }
    }
}

impl DurationCounts {
    /// What was recorded between `earlier` and this snapshot.
    pub fn since(&self, earlier: &DurationCounts) -> DurationCounts {
        DurationCounts {
            counts: std::array::from_fn(|i| self.counts[i].saturating_sub(earlier.counts[i])),
            count: self.count.saturating_sub(earlier.count),
            total: self.total.saturating_sub(earlier.total),
        }
    }

    /// The mean, if anything was recorded.
    pub fn mean(&self) -> Option<Duration> {
        let count = u32::try_from(self.count).unwrap_or(u32::MAX);
        (count > 0).then(|| self.total / count)
    }

    /// The duration at or below which a fraction `q` (0 to 1) of the recorded ones lie: the
    /// upper bound of the bucket the quantile falls in. `None` when nothing was recorded, or when
    /// the quantile lies beyond the last bound (10 s).
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return None;
        }
        // The rank of the quantile, 1-based: the smallest count that covers `q` of them.
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bound, count) in SYNC_TIME_BOUNDS_MICROS.iter().zip(self.counts) {
            seen += count;
            if seen >= rank {
                return Some(Duration::from_micros(*bound));
            }
        }
        None
    }

    /// Each bucket's upper bound and how many fell in it (above the previous bound), in order;
    /// the last bucket, with no bound, holds those beyond 10 s.
    pub fn buckets(&self) -> impl Iterator<Item = (Option<Duration>, u64)> + '_ {
        let bounds = SYNC_TIME_BOUNDS_MICROS
            .iter()
            .map(|&micros| Some(Duration::from_micros(micros)))
            .chain(std::iter::once(None));
        bounds.zip(self.counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: f64) -> Duration {
        Duration::from_secs_f64(n / 1000.0)
    }

    #[test]
    fn syncs_land_in_the_first_bucket_whose_bound_they_do_not_exceed() {
        let histogram = DurationHistogram::default();
        histogram.record(Duration::from_micros(50)); // on a bound: that bucket
        histogram.record(Duration::from_micros(51)); // just above: the next
        histogram.record(Duration::from_secs(20)); // beyond the last bound
        let times = histogram.snapshot();
        assert_eq!(times.count, 3);
        let first_two: Vec<_> = times.buckets().take(2).collect();
        assert_eq!(
            first_two,
            [
                (Some(Duration::from_micros(50)), 1),
                (Some(Duration::from_micros(75)), 1)
            ]
        );
        assert_eq!(times.buckets().last(), Some((None, 1)));
        assert_eq!(times.buckets().map(|(_, n)| n).sum::<u64>(), times.count);
        assert_eq!(times.quantile(0.5), Some(Duration::from_micros(75)));
        assert_eq!(times.quantile(1.0), None, "the slowest is beyond 10 s");
    }

    #[test]
    fn recording_all_at_once_counts_as_recording_each() {
        let (each, all) = (DurationHistogram::default(), DurationHistogram::default());
        let took: Vec<Duration> = [0.01, 0.4, 0.4, 2.5, 40.0, 20_000.0]
            .into_iter()
            .map(ms)
            .collect();
        for t in &took {
            each.record(*t);
        }
        all.record_all(took.iter().copied());
        all.record_all(std::iter::empty());
        assert_eq!(each.snapshot(), all.snapshot());
    }

    #[test]
    fn quantiles_answer_with_the_bucket_bound() {
        let histogram = DurationHistogram::default();
        assert_eq!(histogram.snapshot().quantile(0.99), None, "nothing yet");
        assert_eq!(histogram.snapshot().mean(), None);
        for _ in 0..98 {
            histogram.record(ms(0.4));
        }
        histogram.record(ms(2.5));
        histogram.record(ms(40.0));
        let times = histogram.snapshot();
        assert_eq!(times.quantile(0.5), Some(ms(0.5)));
        assert_eq!(times.quantile(0.98), Some(ms(0.5)));
        assert_eq!(times.quantile(0.99), Some(ms(3.0)));
        assert_eq!(times.quantile(0.999), Some(ms(50.0)));
        let mean = times.mean().unwrap();
        assert!(mean > ms(0.8) && mean < ms(0.9), "{mean:?}");
    }

    #[test]
    fn a_window_is_the_difference_of_two_snapshots() {
        let recorder = SyncTimeRecorder::default();
        recorder.syncs.record(Duration::from_millis(30));
        recorder.waits.record(Duration::from_millis(31));
        let before = recorder.snapshot();
        recorder.syncs.record(Duration::from_micros(1_000));
        recorder.syncs.record(Duration::from_micros(1_200));
        recorder.waits.record(Duration::from_micros(1_300));
        let window = recorder.snapshot().since(&before);
        assert_eq!(window.syncs.count, 2);
        assert_eq!(window.waits.count, 1);
        assert_eq!(window.syncs.total, Duration::from_micros(2_200));
        assert_eq!(
            window.waits.quantile(0.5),
            Some(Duration::from_micros(1_500))
        );
        assert_eq!(
            window.to_string(),
            "2 syncs (mean 1.10 ms, p50 <= 1.00 ms, p99 <= 1.50 ms, p999 <= 1.50 ms); \
             1 appends waited for them (mean 1.30 ms, p50 <= 1.50 ms, p99 <= 1.50 ms, p999 <= 1.50 ms), \
             0.50 appends per sync"
        );
        assert_eq!(SyncTimes::default().to_string(), "no syncs");
        assert_eq!(
            window.syncs.quantile(1.0),
            Some(Duration::from_micros(1_500)),
            "the 30 ms sync before the window is not in it"
        );
    }
}
