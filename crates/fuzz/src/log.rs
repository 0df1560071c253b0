//! Log targets: one batch as a segment scan and a read decode it, and recovery of a partition
//! directory whose files were damaged.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use arbitrary::{Arbitrary, Unstructured};
use tributary_event::{EventData, ReceivedEvent};
use tributary_log::fuzzing::{decode_batch_bytes, encode_batch_bytes, seal_checksum};
use tributary_log::{Durability, GroupCommitter, LogConfig, ManualClock, PartitionLog, ReadCursor};

/// A batch of records (its checksum made right first, so the records are reached). An accepted
/// batch holds dense sequence numbers; the log writes its events back as a batch that reads as
/// the same events, and writes those as the same bytes again (a batch may name properties of
/// the record before or write them out, so only the log's own encoding is unique).
pub fn batch(data: &[u8]) {
    let mut bytes = data.to_vec();
    seal_checksum(&mut bytes);
    let Ok((batch_offset, events)) = decode_batch_bytes(&bytes) else {
        return;
    };
    let first = events.first().expect("a batch holds at least one record");
    for (i, event) in (0..).zip(&events) {
        assert_eq!(event.sequence_number, first.sequence_number + i);
        assert_eq!(event.enqueued_time_ms, first.enqueued_time_ms);
        assert!(
            event.offset > batch_offset,
            "records follow the batch header"
        );
    }
    let data: Vec<EventData> = events.iter().map(|e| e.data.clone()).collect();
    let write = |events: &[EventData]| {
        encode_batch_bytes(
            batch_offset,
            first.sequence_number,
            first.enqueued_time_ms,
            events,
        )
    };
    let again = write(&data);
    let (_, reread) = decode_batch_bytes(&again).expect("the log reads the batches it writes");
    let reread: Vec<EventData> = reread.into_iter().map(|e| e.data).collect();
    // Bytes, not `==` of events: a NaN property is not `==` itself. Reading inverts writing, so
    // equal bytes mean the events read back are the ones written, bit for bit.
    assert!(
        write(&reread) == again,
        "the batch is written back holding the same events, as the same bytes"
    );
}

/// One change to one file of a partition directory (chosen among its files by `file`).
#[derive(Debug, Arbitrary)]
enum Damage {
    Truncate { file: u8, at: u16 },
    Flip { file: u8, at: u16, mask: u8 },
    Overwrite { file: u8, at: u16, bytes: Vec<u8> },
    Append { file: u8, bytes: Vec<u8> },
}

/// Batches appended to a partition (rolling over small segments), then damage to its files,
/// then recovery. Recovery never panics. When it succeeds, the log holds a prefix of what was
/// appended that ends on a batch boundary, appends continue after it, and opening it again
/// finds the same. Only damage to a segment (not to an index) may lose events or fail it.
pub fn recovery(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(count) = u.int_in_range(1..=12usize) else {
        return;
    };
    let batches: Vec<Vec<EventData>> = match (0..count)
        .map(|_| crate::arb::events(&mut u, 4))
        .collect::<arbitrary::Result<_>>()
    {
        Ok(batches) => batches,
        Err(_) => return,
    };
    let Ok(damages) = Vec::<Damage>::arbitrary(&mut u) else {
        return;
    };
    let dir = scratch_dir();
    let (appended, boundaries) = append_all(dir.path(), &batches);
    let segments_damaged = damages
        .iter()
        .map(|d| apply(dir.path(), d))
        .fold(false, |any, is_segment| any | is_segment);
    let Ok(log) = open(dir.path()) else {
        assert!(
            segments_damaged,
            "recovery failed with only index files damaged"
        );
        return;
    };
    let recovered = match read_until_damage(&log) {
        Ok(recovered) => recovered,
        Err((before, error)) => {
            damage_found_by_a_read(&log, &before, &error, &appended, segments_damaged);
            return;
        }
    };
    assert!(
        boundaries.contains(&recovered.len()),
        "recovery keeps whole batches"
    );
    assert!(
        same(&recovered, &appended[..recovered.len()]),
        "recovery keeps what was appended"
    );
    if !segments_damaged {
        assert_eq!(
            recovered.len(),
            appended.len(),
            "no event lost to index damage"
        );
    }
    let receipt = log
        .append(&[EventData::new(&b"after recovery"[..])])
        .expect("appends continue after recovery");
    assert_eq!(receipt.base_sequence, recovered.len() as i64);
    drop(log);
    let again = read_all(&open(dir.path()).expect("a recovered log opens again"));
    assert_eq!(again.len(), recovered.len() + 1);
    assert!(
        same(&again[..recovered.len()], &recovered),
        "reopening keeps the log"
    );
}

/// Damage inside a sealed segment's batch that recovery's index check did not reach: the read
/// that reaches it fails with the batch's checksum and never serves it; what reads before it is
/// what was appended, and appends continue.
fn damage_found_by_a_read(
    log: &PartitionLog,
    before: &[ReceivedEvent],
    error: &tributary_log::LogError,
    appended: &[ReceivedEvent],
    segments_damaged: bool,
) {
    assert!(
        segments_damaged,
        "a read failed with only index files damaged: {error}"
    );
    assert!(
        matches!(error, tributary_log::LogError::Corrupted { .. }),
        "damage reads as corruption: {error}"
    );
    assert!(
        same(before, &appended[..before.len()]),
        "what reads before the damage is what was appended"
    );
    log.append(&[EventData::new(&b"after recovery"[..])])
        .expect("appends continue past a damaged sealed segment");
}

/// Whether two runs of events are the same, a NaN property equal to itself.
fn same(a: &[ReceivedEvent], b: &[ReceivedEvent]) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

/// A fresh directory, in memory where the machine has `/dev/shm` (recovery syncs files).
fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::tempdir_in(shm)
    {
        return dir;
    }
    tempfile::tempdir().expect("a temporary directory")
}

fn open(dir: &Path) -> Result<PartitionLog, tributary_log::LogError> {
    static COMMITTER: OnceLock<GroupCommitter> = OnceLock::new();
    let config = LogConfig {
        durability: Durability::None,
        segment_bytes_max: 4096,
        index_interval_bytes: 512,
        ..LogConfig::default()
    };
    let committer = COMMITTER.get_or_init(GroupCommitter::start).clone();
    PartitionLog::open(dir, config, committer, Arc::new(ManualClock::new(1_000)))
}

/// Appends the batches; returns the events as stored and the event counts at batch ends.
fn append_all(dir: &Path, batches: &[Vec<EventData>]) -> (Vec<ReceivedEvent>, Vec<usize>) {
    let log = open(dir).expect("a new partition opens");
    let mut boundaries = vec![0];
    for batch in batches {
        log.append(batch).expect("small batches append");
        boundaries.push(boundaries.last().expect("not empty") + batch.len());
    }
    let appended = read_all(&log);
    assert_eq!(appended.len(), *boundaries.last().expect("not empty"));
    (appended, boundaries)
}

fn read_all(log: &PartitionLog) -> Vec<ReceivedEvent> {
    read_until_damage(log).unwrap_or_else(|(_, error)| panic!("the log reads: {error}"))
}

/// Every event of the log; or, if a read fails, the events before it and the error.
fn read_until_damage(
    log: &PartitionLog,
) -> Result<Vec<ReceivedEvent>, (Vec<ReceivedEvent>, tributary_log::LogError)> {
    let mut cursor = ReadCursor::new(0);
    let mut out = Vec::new();
    loop {
        match log.read(&mut cursor, 64, 1 << 20) {
            Ok(events) if events.is_empty() => return Ok(out),
            Ok(events) => out.extend(events),
            Err(error) => return Err((out, error)),
        }
    }
}

/// Applies the damage; returns whether it hit a segment file.
fn apply(dir: &Path, damage: &Damage) -> bool {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the partition directory lists")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "log" || e == "index"))
        .collect();
    files.sort();
    let file = match damage {
        Damage::Truncate { file, .. }
        | Damage::Flip { file, .. }
        | Damage::Overwrite { file, .. }
        | Damage::Append { file, .. } => *file,
    };
    let Some(path) = files.get(usize::from(file) % files.len().max(1)) else {
        return false;
    };
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("a partition file opens");
    let len = handle.metadata().expect("file metadata").len();
    let at = |at: u16| u64::from(at) % len.max(1);
    match damage {
        Damage::Truncate { at: to, .. } => handle.set_len(at(*to)).expect("truncate"),
        Damage::Flip { at: pos, mask, .. } => {
            let mut byte = [0u8];
            if len > 0 {
                handle
                    .read_exact_at(&mut byte, at(*pos))
                    .expect("read a byte");
                byte[0] ^= mask.max(&1);
                handle.write_all_at(&byte, at(*pos)).expect("write a byte");
            }
        }
        Damage::Overwrite { at: pos, bytes, .. } => {
            handle.write_all_at(bytes, at(*pos)).expect("overwrite");
        }
        Damage::Append { bytes, .. } => handle.write_all_at(bytes, len).expect("append"),
    }
    path.extension().is_some_and(|e| e == "log")
}
