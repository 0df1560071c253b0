//! What a processor fleet did, as recorded by a test, and the checks run on it after a
//! nemesis schedule: no partition processed by two hosts at once beyond a window
//! ([`overlaps`]), no checkpoint moving backwards ([`Checkpoints`]), no acknowledged event
//! missing ([`missing`]).
//!
//! The checks only read the records; each returns every violation it finds (empty when
//! clean), described well enough to debug from a test's failure message.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// One event as a host processed it.
#[derive(Debug, Clone)]
pub struct Processed {
    /// The host's name.
    pub host: String,
    /// The partition id.
    pub partition: String,
    /// The event's sequence number in the partition.
    pub sequence_number: i64,
    /// The event's body, as text.
    pub body: String,
    /// When the host reported it.
    pub at: Instant,
}

/// A host's uninterrupted reading of a partition: consecutive sequence numbers, no gap longer
/// than the tenure gap between two of them.
#[derive(Debug, Clone)]
struct Tenure {
    host: String,
    first: Instant,
    last: Instant,
    sequence_numbers: (i64, i64),
}

/// Two hosts processing one partition at once.
#[derive(Debug, Clone)]
pub struct Overlap {
    /// The partition id.
    pub partition: String,
    /// The two hosts.
    pub hosts: (String, String),
    /// Their tenures' sequence numbers, first to last.
    pub sequence_numbers: ((i64, i64), (i64, i64)),
    /// From the run's start to the overlap's start.
    pub from: Duration,
    /// How long both processed it.
    pub length: Duration,
}

/// Every pair of tenures of different hosts on one partition that overlap in time by more than
/// `window`. A tenure is a run of one host's records on a partition with consecutive sequence
/// numbers, each within `gap_max` of the one before: one receiver reading without a restart
/// (a host that gets a partition back resumes from a checkpoint, which starts a new tenure).
pub fn overlaps(
    records: &[Processed],
    started: Instant,
    gap_max: Duration,
    window: Duration,
) -> Vec<Overlap> {
    let mut found = Vec::new();
    for (partition, tenures) in tenures(records, gap_max) {
        for (i, x) in tenures.iter().enumerate() {
            for y in tenures.iter().skip(i + 1).filter(|y| y.host != x.host) {
                let (from, to) = (x.first.max(y.first), x.last.min(y.last));
                if to > from && to - from > window {
                    found.push(Overlap {
                        partition: partition.clone(),
                        hosts: (x.host.clone(), y.host.clone()),
                        sequence_numbers: (x.sequence_numbers, y.sequence_numbers),
                        from: from - started,
                        length: to - from,
                    });
                }
            }
        }
    }
    found
}

/// How many times a partition's reading started anew (a host's first read of it, a hand-over,
/// a reconnect): its tenures, over all partitions.
pub fn tenure_count(records: &[Processed], gap_max: Duration) -> usize {
    tenures(records, gap_max).values().map(Vec::len).sum()
}

/// Partition → its tenures.
fn tenures(records: &[Processed], gap_max: Duration) -> BTreeMap<String, Vec<Tenure>> {
    let mut by_stream: BTreeMap<(&str, &str), Vec<&Processed>> = BTreeMap::new();
    for record in records {
        by_stream
            .entry((&record.partition, &record.host))
            .or_default()
            .push(record);
    }
    let mut tenures: BTreeMap<String, Vec<Tenure>> = BTreeMap::new();
    for ((partition, host), mut stream) in by_stream {
        stream.sort_by_key(|r| r.at);
        let mut current: Option<Tenure> = None;
        for record in stream {
            let continues = current.as_ref().is_some_and(|t| {
                record.sequence_number == t.sequence_numbers.1 + 1 && record.at - t.last <= gap_max
            });
            if continues {
                let tenure = current.as_mut().expect("continued");
                tenure.last = record.at;
                tenure.sequence_numbers.1 = record.sequence_number;
                continue;
            }
            let next = Tenure {
                host: host.to_owned(),
                first: record.at,
                last: record.at,
                sequence_numbers: (record.sequence_number, record.sequence_number),
            };
            if let Some(done) = current.replace(next) {
                tenures.entry(partition.to_owned()).or_default().push(done);
            }
        }
        if let Some(done) = current {
            tenures.entry(partition.to_owned()).or_default().push(done);
        }
    }
    tenures
}

/// Every body in `acknowledged` that is not among `seen`.
pub fn missing<'a>(
    acknowledged: &BTreeSet<String>,
    seen: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    let seen: BTreeSet<&str> = seen.into_iter().collect();
    acknowledged
        .iter()
        .filter(|body| !seen.contains(body.as_str()))
        .cloned()
        .collect()
}

/// Checkpoints as a poller saw them, by (consumer group, partition): the latest sequence number
/// and every move backwards.
#[derive(Debug, Default)]
pub struct Checkpoints {
    latest: BTreeMap<(String, String), i64>,
    samples: u64,
    /// Each move backwards, described.
    pub backwards: Vec<String>,
}

impl Checkpoints {
    /// Records one sample of `group`'s checkpoint on `partition`.
    pub fn saw(&mut self, group: &str, partition: &str, sequence_number: i64, at: Duration) {
        self.samples += 1;
        let key = (group.to_owned(), partition.to_owned());
        if let Some(&before) = self.latest.get(&key)
            && sequence_number < before
        {
            self.backwards.push(format!(
                "{group} partition {partition}: checkpoint {before} -> {sequence_number} at +{} ms",
                at.as_millis()
            ));
        }
        let latest = self.latest.entry(key).or_insert(sequence_number);
        *latest = (*latest).max(sequence_number);
    }

    /// The latest checkpoint seen of `group` on `partition`.
    pub fn latest(&self, group: &str, partition: &str) -> Option<i64> {
        self.latest
            .get(&(group.to_owned(), partition.to_owned()))
            .copied()
    }

    /// How many samples were taken.
    pub fn samples(&self) -> u64 {
        self.samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(host: &str, sequence_number: i64, at: Instant) -> Processed {
        Processed {
            host: host.to_owned(),
            partition: "0".to_owned(),
            sequence_number,
            body: sequence_number.to_string(),
            at,
        }
    }

    #[test]
    fn a_handover_is_no_overlap_and_interleaving_is() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let handover = [
            record("a", 0, t),
            record("a", 1, t + ms(100)),
            record("b", 1, t + ms(3_000)),
            record("b", 2, t + ms(3_100)),
        ];
        let (gap, window) = (ms(1_000), ms(50));
        assert!(overlaps(&handover, t, gap, window).is_empty());
        let both = [
            record("a", 0, t),
            record("a", 1, t + ms(100)),
            record("b", 1, t + ms(150)),
            record("a", 2, t + ms(300)),
            record("b", 2, t + ms(400)),
        ];
        let found = overlaps(&both, t, gap, window);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].length, ms(150));
        // Within the window it passes.
        assert!(overlaps(&both, t, gap, ms(200)).is_empty());
    }

    #[test]
    fn a_checkpoint_going_back_is_reported() {
        let mut checkpoints = Checkpoints::default();
        checkpoints.saw("g", "0", 5, Duration::ZERO);
        checkpoints.saw("g", "0", 7, Duration::ZERO);
        assert!(checkpoints.backwards.is_empty());
        checkpoints.saw("g", "0", 6, Duration::from_millis(9));
        assert_eq!(checkpoints.backwards.len(), 1);
        assert_eq!(checkpoints.latest("g", "0"), Some(7));
        assert_eq!(checkpoints.samples(), 3);
    }

    #[test]
    fn missing_lists_what_was_never_seen() {
        let acknowledged: BTreeSet<String> = ["x", "y"].map(String::from).into();
        assert_eq!(missing(&acknowledged, ["y", "z"]), ["x"]);
    }
}
