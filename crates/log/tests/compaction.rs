//! Compaction through the public API: the cleanup policy, keyless appends refused, the latest
//! event of each key kept with its position, tombstones, gaps that resolve to the next kept
//! event, reopening, and compaction beside appends.

use std::sync::Arc;

use tributary_event::{Clock, EventData, EventPosition};
use tributary_log::{
    Cleanup, CleanupPolicy, Durability, GroupCommitter, LogConfig, LogError, ManualClock,
    PartitionLog, ReadCursor, Retention,
};

const T0: i64 = 1_700_000_000_000;
const HOUR_MS: i64 = 3_600_000;

fn compacting(policy: CleanupPolicy) -> LogConfig {
    LogConfig {
        durability: Durability::None,
        segment_bytes_max: 4096,
        index_interval_bytes: 256,
        cleanup: Cleanup {
            policy,
            tombstone_retention_ms: HOUR_MS,
            ..Cleanup::default()
        },
        ..LogConfig::default()
    }
}

struct Fixture {
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    committer: GroupCommitter,
    config: LogConfig,
}

impl Fixture {
    fn new(config: LogConfig) -> Fixture {
        Fixture {
            dir: tempfile::tempdir().unwrap(),
            clock: Arc::new(ManualClock::new(T0)),
            committer: GroupCommitter::start(),
            config,
        }
    }

    fn open(&self) -> PartitionLog {
        PartitionLog::open(
            self.dir.path(),
            self.config,
            self.committer.clone(),
            self.clock.clone(),
        )
        .unwrap()
    }
}

fn keyed(key: &str, body: &str) -> EventData {
    let mut event = EventData::new(body.to_owned());
    event.partition_key = Some(key.to_owned());
    event
}

fn tombstone(key: &str) -> EventData {
    keyed(key, "")
}

/// `(sequence number, offset, key, body)` of an event.
type Event = (i64, u64, String, String);

/// Every event from `from`.
fn read_all(log: &PartitionLog, from: i64) -> Vec<Event> {
    let mut cursor = ReadCursor::new(from);
    let mut out = Vec::new();
    loop {
        let events = log.read(&mut cursor, 7, 1 << 20).unwrap();
        if events.is_empty() {
            return out;
        }
        out.extend(events.into_iter().map(|e| {
            (
                e.sequence_number,
                e.offset,
                e.data.partition_key.clone().unwrap_or_default(),
                String::from_utf8_lossy(&e.data.body).into_owned(),
            )
        }));
    }
}

#[test]
fn a_compacting_log_refuses_an_event_without_a_key_and_writes_nothing() {
    let f = Fixture::new(compacting(CleanupPolicy::Compact));
    let log = f.open();
    log.append(&[keyed("a", "1")]).unwrap();
    let before = log.committed();
    let refused = log
        .append(&[keyed("b", "2"), EventData::new("no key")])
        .unwrap_err();
    assert!(
        matches!(
            refused,
            LogError::MissingPartitionKey {
                index: 1,
                policy: CleanupPolicy::Compact
            }
        ),
        "{refused:?}"
    );
    assert!(refused.is_caller_error());
    assert!(
        refused.to_string().contains("no partition key"),
        "{refused}"
    );
    assert_eq!(log.committed(), before);
    assert_eq!(read_all(&log, 0).len(), 1);
    // The same event is fine once the policy only deletes.
    log.set_cleanup(Cleanup::default()).unwrap();
    log.append(&[EventData::new("no key")]).unwrap();
    assert_eq!(log.properties().last_enqueued_sequence_number, 1);
}

/// Appends `rounds` rounds of one event per key (`k0`..), each round's bodies naming the round,
/// with enough bytes that the log rolls every few rounds.
fn append_rounds(log: &PartitionLog, keys: usize, rounds: usize) {
    for round in 0..rounds {
        let events: Vec<EventData> = (0..keys)
            .map(|k| keyed(&format!("k{k}"), &format!("round {round} {:.<200}", "")))
            .collect();
        log.append(&events).unwrap();
    }
}

#[test]
fn compaction_keeps_the_latest_event_of_each_key_at_its_position() {
    let f = Fixture::new(compacting(CleanupPolicy::Compact));
    let log = f.open();
    append_rounds(&log, 4, 30);
    let before = read_all(&log, 0);
    let last = log.properties();
    let outcome = log.compact(f.clock.now_ms()).unwrap();
    assert!(outcome.segments > 1, "{outcome:?}");
    assert!(outcome.events_removed > 0, "{outcome:?}");
    assert!(outcome.bytes_after < outcome.bytes_before, "{outcome:?}");
    let after = read_all(&log, 0);
    // Every event read is one that was there, with its sequence number and offset.
    for event in &after {
        assert!(before.contains(event), "{event:?}");
    }
    // The active segment is untouched; in the compacted range each key appears once.
    let compacted_through = log.compaction_state().compacted_through_sequence;
    assert!(compacted_through > 0);
    let mut keys: Vec<&str> = after
        .iter()
        .filter(|e| e.0 < compacted_through)
        .map(|e| e.2.as_str())
        .collect();
    keys.sort_unstable();
    let unique = keys.len();
    keys.dedup();
    assert_eq!(
        unique,
        keys.len(),
        "one event per key below {compacted_through}"
    );
    assert_eq!(
        log.properties().last_enqueued_sequence_number,
        last.last_enqueued_sequence_number
    );
    assert_eq!(
        log.properties().last_enqueued_offset,
        last.last_enqueued_offset
    );
    assert_positions_resolve(&log, &before, &after);
    assert_eq!(log.resolve(&EventPosition::Earliest).unwrap(), after[0].0);
    assert_eq!(log.properties().begin_sequence_number, after[0].0);
    let state = log.compaction_state();
    assert!(
        state.dirty_ratio < 1.0 && state.dirty_ratio > 0.0,
        "{state:?}"
    );
    assert_eq!(state.last_outcome, Some(outcome));
    drop(log);
    let reopened = f.open();
    assert_eq!(read_all(&reopened, 0), after);
    assert_eq!(reopened.properties(), {
        let mut p = last;
        p.begin_sequence_number = after[0].0;
        p
    });
}

/// Every sequence number and offset of `before` (what was ever assigned) resolves to the next
/// event of `after` (what is kept), and a read from it starts there.
fn assert_positions_resolve(log: &PartitionLog, before: &[Event], after: &[Event]) {
    for (seq, offset, ..) in before {
        let next = after
            .iter()
            .find(|e| e.0 >= *seq)
            .map_or(log.committed().next_sequence, |e| e.0);
        let by_seq = EventPosition::SequenceNumber {
            sequence_number: *seq,
            inclusive: true,
        };
        assert_eq!(log.resolve(&by_seq).unwrap(), next, "sequence number {seq}");
        let by_offset = EventPosition::Offset {
            offset: *offset,
            inclusive: true,
        };
        assert_eq!(log.resolve(&by_offset).unwrap(), next, "offset {offset}");
        assert_eq!(
            read_all(log, *seq).first().map(|e| e.0),
            after.iter().find(|e| e.0 >= *seq).map(|e| e.0)
        );
    }
}

#[test]
fn a_tombstone_removes_its_key_and_goes_itself_after_the_retention() {
    let f = Fixture::new(compacting(CleanupPolicy::Compact));
    let log = f.open();
    append_rounds(&log, 3, 10);
    log.append(&[tombstone("k1")]).unwrap();
    append_rounds(&log, 1, 40); // k0 only: seals the tombstone's segment
    log.compact(f.clock.now_ms()).unwrap();
    let keys = |log: &PartitionLog| -> Vec<(String, bool)> {
        read_all(log, 0)
            .into_iter()
            .map(|e| (e.2, e.3.is_empty()))
            .collect()
    };
    let now = keys(&log);
    assert!(
        now.contains(&("k1".into(), true)),
        "the tombstone is retained: {now:?}"
    );
    assert!(
        !now.contains(&("k1".into(), false)),
        "k1's values are gone: {now:?}"
    );
    assert!(now.contains(&("k2".into(), false)));
    f.clock.advance_ms(HOUR_MS);
    let outcome = log.compact(f.clock.now_ms()).unwrap();
    assert_eq!(outcome.tombstones_removed, 1, "{outcome:?}");
    let later = keys(&log);
    assert!(!later.iter().any(|(k, _)| k == "k1"), "{later:?}");
    assert!(later.contains(&("k2".into(), false)));
}

#[test]
fn the_minimum_lag_keeps_recent_events_and_delete_policy_does_not_compact() {
    let mut config = compacting(CleanupPolicy::Compact);
    config.cleanup.min_compaction_lag_ms = HOUR_MS;
    let f = Fixture::new(config);
    let log = f.open();
    append_rounds(&log, 2, 30);
    let before = read_all(&log, 0);
    let outcome = log.compact(f.clock.now_ms()).unwrap();
    assert_eq!(outcome.events_removed, 0, "{outcome:?}");
    assert_eq!(read_all(&log, 0), before);
    f.clock.advance_ms(HOUR_MS);
    assert!(log.compact(f.clock.now_ms()).unwrap().events_removed > 0);
    // Retention by age and size removes nothing on a compact-only partition.
    let retention = Retention {
        age_ms_max: Some(1),
        bytes_max: Some(1),
    };
    assert_eq!(
        log.enforce_retention(&retention).unwrap().segments_removed,
        0
    );
    // A delete-only partition is never compacted.
    let d = Fixture::new(compacting(CleanupPolicy::Delete));
    let log = d.open();
    append_rounds(&log, 2, 30);
    assert_eq!(log.compact(d.clock.now_ms()).unwrap().events_removed, 0);
}

#[test]
fn compaction_in_passes_gives_the_same_result_as_one_pass() {
    let run = |budget_keys: u64| {
        let mut config = compacting(CleanupPolicy::Compact);
        config.cleanup.key_index_bytes_max = budget_keys * 64;
        let f = Fixture::new(config);
        let log = f.open();
        append_rounds(&log, 40, 6);
        let outcome = log.compact(f.clock.now_ms()).unwrap();
        (read_all(&log, 0), outcome.passes)
    };
    let (one, passes) = run(1 << 20);
    assert_eq!(passes, 1);
    let (many, passes) = run(16);
    assert!(passes > 1, "{passes}");
    assert_eq!(one, many);
}

#[test]
fn appends_and_reads_go_on_while_compaction_runs() {
    let f = Fixture::new(compacting(CleanupPolicy::DeleteOrCompact));
    let log = f.open();
    append_rounds(&log, 8, 40);
    let writer = {
        let log = log.clone();
        std::thread::spawn(move || append_rounds(&log, 8, 40))
    };
    for _ in 0..5 {
        log.compact(f.clock.now_ms()).unwrap();
        let events = read_all(&log, 0);
        assert!(
            events
                .windows(2)
                .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1)
        );
    }
    writer.join().unwrap();
    log.compact(f.clock.now_ms()).unwrap();
    assert_eq!(log.properties().last_enqueued_sequence_number, 8 * 80 - 1);
    drop(log);
    let events = read_all(&f.open(), 0);
    assert!(events.iter().any(|e| e.3.starts_with("round 39 ")));
}

#[test]
fn damage_in_a_sealed_segment_stops_compaction_with_an_error_and_changes_nothing() {
    let f = Fixture::new(compacting(CleanupPolicy::Compact));
    let log = f.open();
    append_rounds(&log, 4, 30);
    drop(log);
    let first = f.dir.path().join(format!("{:020}.log", 0));
    let mut bytes = std::fs::read(&first).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(&first, &bytes).unwrap();
    // The index file vouches for the segment's length, so opening does not scan it.
    let log = f.open();
    let error = log.compact(f.clock.now_ms()).unwrap_err();
    assert!(matches!(error, LogError::Corrupted { .. }), "{error:?}");
    assert_eq!(std::fs::read(&first).unwrap(), bytes);
    let leftovers: Vec<_> = std::fs::read_dir(f.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".cleaned"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn small_compacted_segments_are_merged_and_keep_their_positions() {
    let f = Fixture::new(compacting(CleanupPolicy::Compact));
    let log = f.open();
    append_rounds(&log, 4, 60);
    let logs = |f: &Fixture| {
        std::fs::read_dir(f.dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "log")
            })
            .count()
    };
    let before = read_all(&log, 0);
    let segments = logs(&f);
    let first = log.compact(f.clock.now_ms()).unwrap();
    assert_eq!(logs(&f), segments, "full segments are rewritten one by one");
    let compacted = read_all(&log, 0);
    let second = log.compact(f.clock.now_ms()).unwrap();
    assert!(second.segments_rewritten > 1, "{first:?} {second:?}");
    assert_eq!(logs(&f), 2, "one compacted segment and the active one");
    assert_eq!(read_all(&log, 0), compacted);
    assert_positions_resolve(&log, &before, &compacted);
    drop(log);
    let reopened = f.open();
    assert_eq!(read_all(&reopened, 0), compacted);
    assert_positions_resolve(&reopened, &before, &compacted);
}

/// An active segment holding events is sealed once it is old enough, never before, never
/// empty; compaction then reaches its events, which keep their positions.
#[test]
fn an_old_active_segment_is_sealed_for_compaction() {
    let f = Fixture::new(compacting(CleanupPolicy::Compact));
    let log = f.open();
    assert!(
        !log.seal_if_older(0).unwrap(),
        "nothing to seal in an empty segment"
    );
    for body in ["v1", "v2", "v3"] {
        log.append(&[keyed("a", body)]).unwrap();
    }
    assert!(!log.seal_if_older(HOUR_MS).unwrap(), "started just now");
    assert_eq!(log.compact(f.clock.now_ms()).unwrap().events_removed, 0);
    f.clock.advance_ms(HOUR_MS);
    assert!(log.seal_if_older(HOUR_MS).unwrap());
    assert!(
        !log.seal_if_older(0).unwrap(),
        "the new active segment is empty"
    );
    assert_eq!(log.compact(f.clock.now_ms()).unwrap().events_removed, 2);
    let kept = read_all(&log, 0);
    assert_eq!(kept.len(), 1);
    assert_eq!((kept[0].0, kept[0].3.as_str()), (2, "v3"));
    assert_eq!(log.properties().last_enqueued_sequence_number, 2);
    log.append(&[keyed("a", "v4")]).unwrap();
    assert_eq!(read_all(&log, 0).last().unwrap().0, 3);
}
