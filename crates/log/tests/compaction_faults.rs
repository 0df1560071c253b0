//! Compaction crashed at every step: a deterministic simulation over many seeds.
//!
//! Each seed builds a compacted partition on [`FaultyStorage`] (in memory; see
//! `tributary_log::faults`): random keyed events and tombstones over a few keys, in random
//! batches (some whose records refer to the one before), across several segments, with the
//! clock moving so some tombstones expire, compacted once half way (so the run that crashes
//! also merges the small segments that one left). It compacts a copy of it once without faults to
//! count the operations compaction makes (each write, sync, file creation, rename, removal),
//! then, for every one of them, compacts another copy with the machine crashing instead of
//! that operation (keeping any prefix of the directory changes not yet synced), powers it on,
//! reopens the partition and checks:
//!
//! 1. recovery succeeds and leaves no half-written segment behind;
//! 2. every event read is one that was appended, with its sequence number and offset, and the
//!    events are a superset of what the complete compaction keeps (nothing it keeps is lost);
//! 3. read as a table (the latest event of each key, a tombstone deleting it), the log gives
//!    exactly what the appended stream gives: no latest event lost, no deleted key back;
//! 4. every sequence number ever assigned resolves to the next event read, and the properties
//!    report the true last sequence number;
//! 5. compacting again completes the work: the result is the complete compaction's.
//!
//! A failure names its seed and step. `TRIBUTARY_SIM_SEED=<n>` replays one seed;
//! `TRIBUTARY_SIM_SEEDS=<count>` runs more (the default is 40).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use tributary_event::{Clock, EventData, EventPosition, PropertyValue};
use tributary_log::faults::{FaultConfig, FaultyStorage, SimRng};
use tributary_log::{
    Cleanup, CleanupPolicy, Durability, GroupCommitter, LogConfig, ManualClock, PartitionLog,
    ReadCursor,
};

const DIR: &str = "/sim/compacted/0";
const T0: i64 = 1_700_000_000_000;
const TOMBSTONE_RETENTION_MS: i64 = 1_000;
const DEFAULT_SEEDS: u64 = 40;

/// `(sequence number, offset, key, body)`.
type Event = (i64, u64, String, Vec<u8>);

struct Built {
    storage: FaultyStorage,
    clock: Arc<ManualClock>,
    config: LogConfig,
    committer: GroupCommitter,
    appended: Vec<Event>,
}

impl Built {
    fn new(seed: u64) -> Built {
        let mut rng = SimRng::new(seed);
        let config = LogConfig {
            durability: Durability::Fsync,
            segment_bytes_max: 4096,
            index_interval_bytes: 512,
            cleanup: Cleanup {
                policy: CleanupPolicy::Compact,
                tombstone_retention_ms: TOMBSTONE_RETENTION_MS,
                key_index_bytes_max: [16, 1 << 20][rng.below(2) as usize] * 64,
                ..Cleanup::default()
            },
            ..LogConfig::default()
        };
        let mut built = Built {
            storage: FaultyStorage::new(rng.next_u64(), FaultConfig::NONE),
            clock: Arc::new(ManualClock::new(T0)),
            config,
            committer: GroupCommitter::start(),
            appended: Vec::new(),
        };
        let log = built.open(&built.storage.clone());
        let keys = 3 + rng.below(20);
        let batches = 20 + rng.below(40);
        for batch in 0..batches {
            if batch == batches / 2 {
                // Compacted once already, so the run that crashes also merges the small
                // segments this one leaves.
                log.compact(built.clock.now_ms()).expect("compacted");
            }
            built.clock.advance_ms(rng.below(150) as i64);
            let shared = rng.below(2) == 0;
            let events: Vec<EventData> = (0..1 + rng.below(5))
                .map(|i| event(&mut rng, keys, batch, i, shared))
                .collect();
            let receipt = log.append(&events).expect("appended");
            for (i, e) in events.into_iter().enumerate() {
                let key = e.partition_key.expect("keyed");
                let seq = receipt.base_sequence + i as i64;
                built
                    .appended
                    .push((seq, receipt.offsets[i], key, e.body.to_vec()));
            }
        }
        drop(log);
        built
    }

    fn open(&self, storage: &FaultyStorage) -> PartitionLog {
        PartitionLog::open_on(
            Arc::new(storage.clone()),
            Path::new(DIR),
            self.config,
            self.committer.clone(),
            self.clock.clone(),
        )
        .expect("the partition opens")
    }
}

fn event(rng: &mut SimRng, keys: u64, batch: u64, i: u64, shared: bool) -> EventData {
    let len = if rng.below(5) == 0 {
        0
    } else {
        1 + rng.below(300)
    };
    let body = if len == 0 {
        Vec::new()
    } else {
        format!("b{batch} e{i} {:.<1$}", "", len as usize).into_bytes()
    };
    let mut event = EventData::new(body);
    event.partition_key = Some(format!("key-{}", rng.below(keys)));
    if shared {
        event = event.with_property("batch", PropertyValue::UInt64(batch));
    }
    event
}

fn read_all(log: &PartitionLog) -> Result<Vec<Event>, String> {
    let mut cursor = ReadCursor::new(0);
    let mut out = Vec::new();
    loop {
        let events = log
            .read(&mut cursor, 16, 1 << 20)
            .map_err(|e| format!("read failed: {e}"))?;
        if events.is_empty() {
            return Ok(out);
        }
        out.extend(events.into_iter().map(|e| {
            let key = e.data.partition_key.clone().unwrap_or_default();
            (e.sequence_number, e.offset, key, e.data.body.to_vec())
        }));
    }
}

/// The log read as a table: each key's latest body, a tombstone deleting the key.
fn table(events: &[Event]) -> BTreeMap<String, Vec<u8>> {
    let mut table = BTreeMap::new();
    for (_, _, key, body) in events {
        if body.is_empty() {
            table.remove(key);
        } else {
            table.insert(key.clone(), body.clone());
        }
    }
    table
}

fn check(log: &PartitionLog, built: &Built, complete: &[Event]) -> Result<Vec<Event>, String> {
    let events = read_all(log)?;
    if let Some(e) = events.iter().find(|e| !built.appended.contains(e)) {
        return Err(format!("read an event never appended as it is: {e:?}"));
    }
    if let Some(e) = complete.iter().find(|e| !events.contains(e)) {
        return Err(format!(
            "lost an event the complete compaction keeps: {e:?}"
        ));
    }
    if table(&events) != table(&built.appended) {
        return Err("the log read as a table differs from the stream".into());
    }
    let next = built.appended.len() as i64;
    if log.properties().last_enqueued_sequence_number != next - 1 {
        return Err(format!("properties: {:?}", log.properties()));
    }
    for (seq, ..) in &built.appended {
        let expected = events.iter().find(|e| e.0 >= *seq).map_or(next, |e| e.0);
        let position = EventPosition::SequenceNumber {
            sequence_number: *seq,
            inclusive: true,
        };
        let resolved = log.resolve(&position).map_err(|e| e.to_string())?;
        if resolved != expected {
            return Err(format!("{seq} resolves to {resolved}, not {expected}"));
        }
    }
    Ok(events)
}

/// One seed: every crash point of one compaction.
fn run(seed: u64) -> Result<u64, String> {
    let built = Built::new(seed);
    let now = built.clock.now_ms() + TOMBSTONE_RETENTION_MS / 2;
    let reference = built.storage.fork();
    let log = built.open(&reference);
    let before = reference.ops();
    let outcome = log
        .compact(now)
        .map_err(|e| format!("compaction failed: {e}"))?;
    let steps = reference.ops() - before;
    let complete = read_all(&log)?;
    if outcome.segments_rewritten == 0 {
        return Ok(0);
    }
    for step in 1..=steps {
        let fork = built.storage.fork();
        let log = built.open(&fork);
        fork.keep_directory_prefixes();
        fork.crash_at_op(step);
        let crashed = log.compact(now);
        drop(log);
        if !fork.is_down() {
            return Err(format!("step {step}: no crash ({crashed:?})"));
        }
        fork.power_on();
        let log = PartitionLog::open_on(
            Arc::new(fork.clone()),
            Path::new(DIR),
            built.config,
            built.committer.clone(),
            built.clock.clone(),
        )
        .map_err(|e| format!("step {step}: recovery failed: {e}"))?;
        if let Some(p) = fork.paths().iter().find(|p| {
            !p.ends_with("LOCK") && {
                let name = p.to_string_lossy();
                !name.ends_with(".log") && !name.ends_with(".index")
            }
        }) {
            return Err(format!("step {step}: recovery left {}", p.display()));
        }
        check(&log, &built, &complete).map_err(|e| format!("step {step}: {e}"))?;
        log.compact(now).map_err(|e| format!("step {step}: {e}"))?;
        let again = check(&log, &built, &complete).map_err(|e| format!("step {step}: {e}"))?;
        if again != complete {
            return Err(format!(
                "step {step}: compacting again does not finish the work"
            ));
        }
    }
    Ok(steps)
}

#[test]
fn a_crash_at_any_step_of_compaction_leaves_the_old_or_the_new_segments() {
    let seeds: Vec<u64> = match std::env::var("TRIBUTARY_SIM_SEED") {
        Ok(seed) => vec![seed.parse().expect("TRIBUTARY_SIM_SEED is a number")],
        Err(_) => {
            let count = std::env::var("TRIBUTARY_SIM_SEEDS")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(DEFAULT_SEEDS);
            (0..count).collect()
        }
    };
    let mut crashes = 0;
    for &seed in &seeds {
        match run(seed) {
            Ok(steps) => crashes += steps,
            Err(e) => panic!("seed {seed}: {e} (replay with TRIBUTARY_SIM_SEED={seed})"),
        }
    }
    // The seeds really crashed compactions, at many points.
    assert!(crashes >= 10 * seeds.len() as u64, "{crashes} crashes");
}
