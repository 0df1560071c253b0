//! A property test of compaction against a model: random streams of keyed events and
//! tombstones (few keys, so they repeat), appended in random batches across segment rolls,
//! compacted at random points under a controlled clock, sometimes reopened.
//!
//! The model keeps the events that should be there. A run that compacted everything below
//! sequence number `C` (the log reports `C`) removes, among the model's events below `C`, each
//! one a later event of its key below `C` supersedes, and each tombstone that is the latest of
//! its key below `C` and older than the tombstone retention. After every step:
//! 1. reading from `earliest` yields exactly the model's events, with their sequence numbers,
//!    offsets, keys and bodies — so, below `C`, exactly the latest event of each key (and the
//!    retained tombstones), and reading the log as a table gives what the stream gives;
//! 2. every sequence number and offset ever assigned resolves to the next kept event, and a
//!    read from it starts there;
//! 3. the partition's properties report the true last sequence number and offset;
//! 4. reopening the log gives the same.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use tributary_event::{Clock, EventData, EventPosition, PropertyValue};
use tributary_log::faults::{FaultConfig, FaultyStorage};
use tributary_log::{
    Cleanup, CleanupPolicy, Durability, GroupCommitter, LogConfig, ManualClock, PartitionLog,
    ReadCursor,
};

const T0: i64 = 1_700_000_000_000;
const TOMBSTONE_RETENTION_MS: i64 = 1_000;

/// One event of the model: what a read must return.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Kept {
    seq: i64,
    offset: u64,
    key: String,
    body: Vec<u8>,
    time_ms: i64,
}

#[derive(Debug, Clone)]
enum Step {
    /// A batch of `(key, body length; 0 is a tombstone)`, its events sharing a property (so
    /// records refer to the one before) when the flag is set.
    Append(Vec<(u8, u16)>, bool),
    Advance(i64),
    Compact,
    Reopen,
}

fn step(keys: u8) -> impl Strategy<Value = Step> {
    let event = (0..keys, prop_oneof![3 => 1u16..300, 1 => Just(0u16)]);
    prop_oneof![
        6 => (proptest::collection::vec(event, 1..6), any::<bool>())
            .prop_map(|(events, shared)| Step::Append(events, shared)),
        2 => (0i64..700).prop_map(Step::Advance),
        2 => Just(Step::Compact),
        1 => Just(Step::Reopen),
    ]
}

struct Sim {
    storage: FaultyStorage,
    clock: Arc<ManualClock>,
    committer: GroupCommitter,
    config: LogConfig,
    log: Option<PartitionLog>,
    kept: Vec<Kept>,
    /// Every `(sequence number, offset)` ever assigned.
    assigned: Vec<(i64, u64)>,
    last_offset: Option<u64>,
    batches: u64,
}

impl Sim {
    fn new(key_budget: u64, lag_ms: i64) -> Sim {
        let config = LogConfig {
            durability: Durability::Fsync,
            segment_bytes_max: 4096,
            index_interval_bytes: 512,
            cleanup: Cleanup {
                policy: CleanupPolicy::Compact,
                min_compaction_lag_ms: lag_ms,
                tombstone_retention_ms: TOMBSTONE_RETENTION_MS,
                key_index_bytes_max: key_budget * 64,
            },
            ..LogConfig::default()
        };
        let mut sim = Sim {
            storage: FaultyStorage::new(0, FaultConfig::NONE),
            clock: Arc::new(ManualClock::new(T0)),
            committer: GroupCommitter::start(),
            config,
            log: None,
            kept: Vec::new(),
            assigned: Vec::new(),
            last_offset: None,
            batches: 0,
        };
        sim.reopen();
        sim
    }

    fn log(&self) -> &PartitionLog {
        self.log.as_ref().expect("open")
    }

    fn reopen(&mut self) {
        self.log = None;
        self.log = Some(
            PartitionLog::open_on(
                Arc::new(self.storage.clone()),
                Path::new("/model/0"),
                self.config,
                self.committer.clone(),
                self.clock.clone(),
            )
            .expect("the log opens"),
        );
    }

    fn append(&mut self, events: &[(u8, u16)], shared: bool) {
        let batch = self.batches;
        self.batches += 1;
        let data: Vec<EventData> = events
            .iter()
            .enumerate()
            .map(|(i, &(key, len))| {
                let text = format!("b{batch} e{i} {:.<1$}", "", usize::from(len));
                let body = if len == 0 {
                    Vec::new()
                } else {
                    text.into_bytes()
                };
                let mut event = EventData::new(body);
                event.partition_key = Some(format!("key-{key}"));
                if shared {
                    let value = PropertyValue::String(format!("batch {batch}").into());
                    event = event.with_property("batch", value);
                }
                event
            })
            .collect();
        let receipt = self.log().append(&data).expect("appended");
        for (i, event) in data.into_iter().enumerate() {
            let seq = receipt.base_sequence + i as i64;
            self.assigned.push((seq, receipt.offsets[i]));
            self.kept.push(Kept {
                seq,
                offset: receipt.offsets[i],
                key: event.partition_key.expect("keyed"),
                body: event.body.to_vec(),
                time_ms: receipt.enqueued_time_ms,
            });
        }
        self.last_offset = receipt.offsets.last().copied();
    }

    /// Compacts the log, then the model as the log says far it went.
    fn compact(&mut self) {
        let now = self.clock.now_ms();
        self.log().compact(now).expect("compacted");
        let through = self.log().compaction_state().compacted_through_sequence;
        let cutoff = now - TOMBSTONE_RETENTION_MS;
        let mut latest: BTreeMap<&str, i64> = BTreeMap::new();
        for e in self.kept.iter().filter(|e| e.seq < through) {
            latest.insert(&e.key, e.seq);
        }
        let removed: Vec<i64> = self
            .kept
            .iter()
            .filter(|e| e.seq < through)
            .filter(|e| {
                let last = latest[e.key.as_str()];
                last > e.seq || (e.body.is_empty() && e.time_ms <= cutoff)
            })
            .map(|e| e.seq)
            .collect();
        self.kept.retain(|e| !removed.contains(&e.seq));
    }

    fn run(&mut self, step: &Step) {
        match step {
            Step::Append(events, shared) => self.append(events, *shared),
            Step::Advance(ms) => self.clock.advance_ms(*ms),
            Step::Compact => self.compact(),
            Step::Reopen => self.reopen(),
        }
    }

    fn read_all(&self, from: i64) -> Vec<Kept> {
        let mut cursor = ReadCursor::new(from);
        let mut out = Vec::new();
        loop {
            let events = self.log().read(&mut cursor, 5, 1 << 20).expect("read");
            if events.is_empty() {
                return out;
            }
            out.extend(events.into_iter().map(|e| Kept {
                seq: e.sequence_number,
                offset: e.offset,
                key: e.data.partition_key.clone().expect("keyed"),
                body: e.data.body.to_vec(),
                time_ms: e.enqueued_time_ms,
            }));
        }
    }

    fn check(&self) -> Result<(), TestCaseError> {
        prop_assert_eq!(&self.read_all(0), &self.kept);
        let log = self.log();
        let next = log.committed().next_sequence;
        prop_assert_eq!(next, self.assigned.len() as i64);
        let properties = log.properties();
        prop_assert_eq!(properties.last_enqueued_sequence_number, next - 1);
        prop_assert_eq!(properties.last_enqueued_offset, self.last_offset);
        let begin = self.kept.first().map_or(next, |e| e.seq);
        prop_assert_eq!(properties.begin_sequence_number, begin);
        prop_assert_eq!(log.resolve(&EventPosition::Earliest).unwrap(), begin);
        for &(seq, offset) in &self.assigned {
            let at_or_after = self
                .kept
                .iter()
                .find(|e| e.seq >= seq)
                .map_or(next, |e| e.seq);
            let after = self
                .kept
                .iter()
                .find(|e| e.seq > seq)
                .map_or(next, |e| e.seq);
            let position = |sequence_number, inclusive| EventPosition::SequenceNumber {
                sequence_number,
                inclusive,
            };
            prop_assert_eq!(log.resolve(&position(seq, true)).unwrap(), at_or_after);
            prop_assert_eq!(log.resolve(&position(seq, false)).unwrap(), after);
            let by_offset = |offset, inclusive| EventPosition::Offset { offset, inclusive };
            prop_assert_eq!(log.resolve(&by_offset(offset, true)).unwrap(), at_or_after);
            prop_assert_eq!(log.resolve(&by_offset(offset, false)).unwrap(), after);
            // An offset between two events (inside this one's record) resolves to the next.
            prop_assert_eq!(log.resolve(&by_offset(offset + 1, true)).unwrap(), after);
            let first = self.read_all(seq).first().map(|e| e.seq);
            prop_assert_eq!(
                first,
                self.kept.iter().find(|e| e.seq >= seq).map(|e| e.seq)
            );
        }
        Ok(())
    }
}

proptest! {
    // 48 cases unless PROPTEST_CASES says otherwise.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(48),
        ..ProptestConfig::default()
    })]

    #[test]
    fn compaction_keeps_the_latest_event_of_each_key_and_every_position_resolves(
        (_keys, steps) in prop_oneof![Just(3u8), Just(24u8)]
            .prop_flat_map(|keys| (Just(keys), proptest::collection::vec(step(keys), 1..60))),
        key_budget in prop_oneof![Just(16u64), Just(1u64 << 20)],
        lag_ms in prop_oneof![Just(0i64), Just(500i64)],
    ) {
        let mut sim = Sim::new(key_budget, lag_ms);
        for step in &steps {
            sim.run(step);
            sim.check()?;
        }
        // With everything old enough, one more run leaves exactly the latest event of each key
        // below where it compacted.
        sim.clock.advance_ms(TOMBSTONE_RETENTION_MS + lag_ms);
        sim.compact();
        sim.check()?;
        sim.reopen();
        sim.check()?;
    }
}
