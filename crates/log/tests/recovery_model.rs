//! Crash recovery checked against a model.
//!
//! Random batches are appended (rolling through several small segments), then the process
//! "crashes": the active segment is cut at a random byte, or the tail after a random byte is
//! replaced by garbage, or one byte is flipped. Nothing after the last sync was promised, so the
//! recovered log must be exactly the batches that lie wholly before the damage — plus every
//! sealed segment — with the same sequence numbers, offsets and contents, and appends must
//! continue from there. A batch that was acknowledged under `fsync` lies before any damage a
//! crash can do, so it always survives.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use proptest::prelude::*;
use tributary_event::{EventData, PropertyValue, ReceivedEvent};
use tributary_log::{Durability, GroupCommitter, LogConfig, ManualClock, PartitionLog, ReadCursor};

#[derive(Debug, Clone)]
enum Damage {
    /// The file ends at this fraction of the written tail.
    Truncate(f64),
    /// Everything from this fraction on is replaced by these bytes.
    Garbage(f64, Vec<u8>),
    /// One byte at this fraction is flipped.
    Flip(f64),
}

fn arb_batch() -> impl Strategy<Value = Vec<EventData>> {
    proptest::collection::vec(
        (proptest::collection::vec(any::<u8>(), 0..400), any::<i64>())
            .prop_map(|(body, n)| EventData::new(body).with_property("n", PropertyValue::Int64(n))),
        1..6,
    )
}

fn arb_damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (0.0..=1.0).prop_map(Damage::Truncate),
        ((0.0..=1.0), proptest::collection::vec(any::<u8>(), 1..200))
            .prop_map(|(at, g)| Damage::Garbage(at, g)),
        (0.0..1.0).prop_map(Damage::Flip),
    ]
}

struct Appended {
    events: Vec<ReceivedEvent>,
    /// Each batch's end offset, with the index of its first event.
    batch_ends: Vec<(u64, usize)>,
}

fn open(dir: &Path, committer: &GroupCommitter, durability: Durability) -> PartitionLog {
    let config = LogConfig {
        durability,
        segment_bytes_max: 4096,
        index_interval_bytes: 512,
        ..LogConfig::default()
    };
    PartitionLog::open(
        dir,
        config,
        committer.clone(),
        Arc::new(ManualClock::new(1_000)),
    )
    .unwrap()
}

fn append_all(log: &PartitionLog, batches: &[Vec<EventData>]) -> Appended {
    let mut appended = Appended {
        events: Vec::new(),
        batch_ends: Vec::new(),
    };
    for batch in batches {
        let first = appended.events.len();
        let receipt = log.append(batch).unwrap();
        for (i, event) in batch.iter().enumerate() {
            appended.events.push(ReceivedEvent {
                sequence_number: receipt.base_sequence + i as i64,
                offset: receipt.offsets[i],
                enqueued_time_ms: receipt.enqueued_time_ms,
                data: event.clone(),
            });
        }
        appended
            .batch_ends
            .push((log.committed().end_offset, first));
    }
    appended
}

fn read_all(log: &PartitionLog) -> Vec<ReceivedEvent> {
    let mut cursor = ReadCursor::new(0);
    let mut out = Vec::new();
    loop {
        let batch = log.read(&mut cursor, 50, 1 << 16).unwrap();
        if batch.is_empty() {
            return out;
        }
        out.extend(batch);
    }
}

/// The active (last) segment file and its base offset.
fn active_segment(dir: &Path) -> (PathBuf, u64) {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    let path = logs.pop().unwrap();
    let base = path.file_stem().unwrap().to_str().unwrap().parse().unwrap();
    (path, base)
}

/// Applies the damage to the written part `[64, data_end)` of the active segment; returns the
/// file position from which nothing can be trusted.
fn damage(path: &Path, data_end: u64, damage: &Damage) -> u64 {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let header = 64u64;
    let at = |f: f64| header + ((data_end - header) as f64 * f) as u64;
    match damage {
        Damage::Truncate(f) => {
            let cut = at(*f);
            file.set_len(cut).unwrap();
            cut
        }
        Damage::Garbage(f, garbage) => {
            let cut = at(*f);
            file.set_len(cut).unwrap();
            file.write_all_at(garbage, cut).unwrap();
            cut
        }
        Damage::Flip(f) => {
            let pos = at(*f).min(data_end - 1);
            let mut b = [0u8; 1];
            std::os::unix::fs::FileExt::read_exact_at(&file, &mut b, pos).unwrap();
            file.write_all_at(&[b[0] ^ 0x5a], pos).unwrap();
            pos
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn recovery_keeps_exactly_the_undamaged_prefix(
        batches in proptest::collection::vec(arb_batch(), 1..40),
        crash in arb_damage(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let committer = GroupCommitter::start();
        let log = open(dir.path(), &committer, Durability::None);
        let appended = append_all(&log, &batches);
        let (path, base) = active_segment(dir.path());
        let data_end = log.committed().end_offset - base;
        drop(log);
        if data_end <= 64 {
            return Ok(()); // The last batch exactly filled the previous segment; nothing to damage.
        }
        let trusted_until = base + damage(&path, data_end, &crash);
        let survivors = appended
            .batch_ends
            .iter()
            .take_while(|(end, _)| *end <= trusted_until)
            .count();
        let expected: Vec<ReceivedEvent> = match appended.batch_ends.get(survivors) {
            Some(&(_, first_lost)) => appended.events[..first_lost].to_vec(),
            None => appended.events.clone(),
        };

        let log = open(dir.path(), &committer, Durability::None);
        prop_assert_eq!(&read_all(&log), &expected);
        let next = expected.len() as i64;
        prop_assert_eq!(log.properties().last_enqueued_sequence_number, next - 1);
        // Appends continue right after what survived, and survive a clean reopen.
        let receipt = log.append(&[EventData::new("after")]).unwrap();
        prop_assert_eq!(receipt.base_sequence, next);
        prop_assert!(expected.last().is_none_or(|e| e.offset < receipt.offsets[0]));
        drop(log);
        let log = open(dir.path(), &committer, Durability::None);
        let all = read_all(&log);
        prop_assert_eq!(all.len() as i64, next + 1);
        prop_assert_eq!(&all[..expected.len()], &expected[..]);
    }

    /// Under fsync, everything acknowledged is on disk before the crash can touch it: damage can
    /// only fall after the acknowledged end, and nothing acknowledged is lost.
    #[test]
    fn acknowledged_batches_survive_any_crash_after_them(
        batches in proptest::collection::vec(arb_batch(), 1..20),
        garbage in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let committer = GroupCommitter::start();
        let log = open(dir.path(), &committer, Durability::Fsync);
        let appended = append_all(&log, &batches);
        let (path, base) = active_segment(dir.path());
        let data_end = log.committed().end_offset - base;
        drop(log);
        // A torn write of an unacknowledged batch after the acknowledged end.
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&garbage, data_end).unwrap();
        let log = open(dir.path(), &committer, Durability::Fsync);
        prop_assert_eq!(read_all(&log), appended.events);
    }
}

#[test]
fn damage_inside_a_sealed_segment_is_reported_not_hidden() {
    let dir = tempfile::tempdir().unwrap();
    let committer = GroupCommitter::start();
    let log = open(dir.path(), &committer, Durability::Fsync);
    for i in 0..40 {
        log.append(&[EventData::new(vec![i as u8; 300])]).unwrap();
    }
    drop(log);
    let first = dir.path().join(format!("{:020}.log", 0));
    let index = dir.path().join(format!("{:020}.index", 0));
    std::fs::remove_file(index).unwrap(); // Force a scan of the sealed segment.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&first)
        .unwrap();
    file.write_all_at(&[0xff], 500).unwrap();
    let config = LogConfig {
        segment_bytes_max: 4096,
        ..LogConfig::default()
    };
    let err = PartitionLog::open(dir.path(), config, committer, Arc::new(ManualClock::new(0)))
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("00000000000000000000.log"), "{msg}");
    assert!(msg.contains("corrupt"), "{msg}");
}

#[test]
fn an_interrupted_roll_leaves_a_log_that_opens() {
    let dir = tempfile::tempdir().unwrap();
    let committer = GroupCommitter::start();
    let log = open(dir.path(), &committer, Durability::Fsync);
    for i in 0..30 {
        log.append(&[EventData::new(vec![i as u8; 300])]).unwrap();
    }
    let end = log.committed().end_offset;
    drop(log);
    // A crash between creating the next segment file and writing its header.
    std::fs::write(dir.path().join(format!("{end:020}.log")), [0u8; 10]).unwrap();
    let log = open(dir.path(), &committer, Durability::Fsync);
    assert_eq!(read_all(&log).len(), 30);
    assert_eq!(
        log.append(&[EventData::new("next")]).unwrap().base_sequence,
        30
    );
}
