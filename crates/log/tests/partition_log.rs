//! Behaviour of one partition log through its public API: appends, reads, positions, limits,
//! rolling, reopening and retention.

use std::sync::Arc;

use tributary_event::{EventData, EventPosition, PropertyValue};
use tributary_log::{
    Durability, GroupCommitter, LogConfig, LogError, ManualClock, PartitionLog, ReadCursor,
    Retention, SyncScope,
};

const T0: i64 = 1_700_000_000_000;

struct Fixture {
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    committer: GroupCommitter,
    config: LogConfig,
}

impl Fixture {
    fn new(durability: Durability, segment_bytes_max: u64) -> Fixture {
        Fixture {
            dir: tempfile::tempdir().unwrap(),
            clock: Arc::new(ManualClock::new(T0)),
            committer: GroupCommitter::start(),
            config: LogConfig {
                durability,
                segment_bytes_max,
                index_interval_bytes: 256,
                ..LogConfig::default()
            },
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

/// `n` events of about 100 bytes each, so a few dozen fill a 4 KiB test segment.
fn events(prefix: &str, n: usize) -> Vec<EventData> {
    (0..n)
        .map(|i| EventData::new(format!("{prefix}-{i}-{:.<90}", "")))
        .collect()
}

fn read_all(log: &PartitionLog, from: i64) -> Vec<tributary_event::ReceivedEvent> {
    let mut cursor = ReadCursor::new(from);
    let mut out = Vec::new();
    loop {
        let batch = log.read(&mut cursor, 7, 1 << 20).unwrap();
        if batch.is_empty() {
            return out;
        }
        out.extend(batch);
    }
}

#[test]
fn appends_get_dense_sequence_numbers_growing_offsets_and_monotonic_times() {
    let f = Fixture::new(Durability::Fsync, 1 << 20);
    let log = f.open();
    let a = log.append(&events("a", 3)).unwrap();
    f.clock.advance_ms(-5_000); // The clock going back must not make times go back.
    let b = log.append(&events("b", 2)).unwrap();
    assert_eq!(a.base_sequence, 0);
    assert_eq!(b.base_sequence, 3);
    assert_eq!(b.enqueued_time_ms, a.enqueued_time_ms);
    let all = read_all(&log, 0);
    assert_eq!(all.len(), 5);
    for (i, e) in all.iter().enumerate() {
        assert_eq!(e.sequence_number, i as i64);
    }
    assert!(all.windows(2).all(|w| w[0].offset < w[1].offset));
    assert!(
        all.windows(2)
            .all(|w| w[0].enqueued_time_ms <= w[1].enqueued_time_ms)
    );
    let offsets: Vec<u64> = a.offsets.iter().chain(&b.offsets).copied().collect();
    assert_eq!(offsets, all.iter().map(|e| e.offset).collect::<Vec<_>>());
    assert!(all[4].data.body.starts_with(b"b-1-"));
}

#[test]
fn typed_properties_and_system_fields_round_trip() {
    let f = Fixture::new(Durability::None, 1 << 20);
    let log = f.open();
    let mut event = EventData::new("payload")
        .with_property("count", PropertyValue::Int64(-3))
        .with_property("ok", PropertyValue::Bool(true))
        .with_property("id", PropertyValue::Uuid([7; 16]));
    event.partition_key = Some("device-1".into());
    event.content_type = Some("application/json".into());
    event.message_id = Some("m-1".into());
    log.append(std::slice::from_ref(&event)).unwrap();
    let got = read_all(&log, 0);
    assert_eq!(got[0].data, event);
}

#[test]
fn refused_appends_write_nothing() {
    let f = Fixture::new(Durability::Fsync, 1 << 20);
    let log = f.open();
    log.append(&events("ok", 2)).unwrap();
    let before = log.committed();
    let mut batch = events("x", 3);
    batch[1] = EventData::new(vec![0u8; 2 * 1024 * 1024]);
    match log.append(&batch) {
        Err(LogError::EventTooLarge { index, limit, .. }) => {
            assert_eq!(index, 1);
            assert_eq!(limit, 1024 * 1024);
        }
        other => panic!("expected EventTooLarge, got {other:?}"),
    }
    assert!(matches!(log.append(&[]), Err(LogError::EmptyBatch)));
    let dup = EventData::new("d")
        .with_property("k", PropertyValue::Null)
        .with_property("k", PropertyValue::Null);
    assert!(matches!(
        log.append(&[dup]),
        Err(LogError::InvalidEvent { index: 0, .. })
    ));
    // Many properties (past the pairwise check), one key repeated far apart.
    let many = (0..40).fold(EventData::new("m"), |event, i| {
        event.with_property(format!("p{}", i % 39), PropertyValue::Int64(i))
    });
    match log.append(&[EventData::new("ok"), many]) {
        Err(LogError::InvalidEvent { index, reason }) => {
            assert_eq!(index, 1);
            assert!(reason.contains("\"p0\""), "{reason}");
        }
        other => panic!("expected InvalidEvent, got {other:?}"),
    }
    assert_eq!(log.committed(), before);
    assert_eq!(read_all(&log, 0).len(), 2);
}

#[test]
fn reads_cross_segments_and_survive_reopening() {
    let f = Fixture::new(Durability::Fsync, 4096);
    let mut expected = Vec::new();
    {
        let log = f.open();
        for i in 0..60 {
            let batch = events(&format!("batch{i}"), 1 + i % 4);
            expected.extend(batch.iter().map(|e| e.body.clone()));
            log.append(&batch).unwrap();
            f.clock.advance_ms(10);
        }
    }
    let segments = std::fs::read_dir(f.dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "log")
        })
        .count();
    assert!(segments > 3, "expected several segments, found {segments}");
    let log = f.open();
    let all = read_all(&log, 0);
    assert_eq!(
        all.iter().map(|e| e.data.body.clone()).collect::<Vec<_>>(),
        expected
    );
    // Starting mid-way reads the same tail.
    let tail = read_all(&log, 77);
    assert_eq!(tail.len(), expected.len() - 77);
    assert_eq!(tail[0].sequence_number, 77);
    // Appends after reopening continue the sequence and offsets.
    let last = all.last().unwrap();
    let r = log.append(&events("after", 1)).unwrap();
    assert_eq!(r.base_sequence, last.sequence_number + 1);
    assert!(r.offsets[0] > last.offset);
    assert!(r.enqueued_time_ms >= last.enqueued_time_ms);
}

#[test]
fn positions_resolve_to_the_right_event() {
    let f = Fixture::new(Durability::Fsync, 4096);
    let log = f.open();
    for i in 0..40 {
        log.append(&events(&format!("b{i}"), 3)).unwrap();
        f.clock.advance_ms(100);
    }
    let all = read_all(&log, 0);
    let e = &all[50];
    let resolve = |p| log.resolve(&p).unwrap();
    assert_eq!(resolve(EventPosition::Earliest), 0);
    assert_eq!(resolve(EventPosition::Latest), 120);
    let seq = |s, inclusive| EventPosition::SequenceNumber {
        sequence_number: s,
        inclusive,
    };
    assert_eq!(resolve(seq(50, true)), 50);
    assert_eq!(resolve(seq(50, false)), 51);
    assert_eq!(resolve(seq(119, false)), 120);
    let off = |o, inclusive| EventPosition::Offset {
        offset: o,
        inclusive,
    };
    assert_eq!(resolve(off(e.offset, true)), 50);
    assert_eq!(resolve(off(e.offset, false)), 51);
    assert_eq!(
        resolve(off(e.offset + 1, true)),
        51,
        "an offset between events starts at the next"
    );
    assert_eq!(resolve(off(all[119].offset, false)), 120);
    let time = |t, inclusive| EventPosition::EnqueuedTime {
        enqueued_time_ms: t,
        inclusive,
    };
    assert_eq!(
        resolve(time(e.enqueued_time_ms, true)),
        48,
        "batch 16 starts at 48"
    );
    assert_eq!(resolve(time(e.enqueued_time_ms, false)), 51);
    assert_eq!(resolve(time(T0 - 1, false)), 0);
    assert_eq!(resolve(time(T0 + 1_000_000, false)), 120);
    assert!(matches!(
        log.resolve(&seq(500, true)),
        Err(LogError::SequenceNumberOutOfRange {
            requested: 500,
            next: 120
        })
    ));
    assert!(matches!(
        log.resolve(&off(u64::MAX / 2, true)),
        Err(LogError::OffsetOutOfRange { .. })
    ));
}

#[test]
fn partition_properties_track_the_log() {
    let f = Fixture::new(Durability::Fsync, 4096);
    let log = f.open();
    let p = log.properties();
    assert!(p.is_empty);
    assert_eq!(p.begin_sequence_number, 0);
    assert_eq!(p.last_enqueued_sequence_number, -1);
    assert_eq!(p.last_enqueued_offset, None);
    let r = log.append(&events("x", 4)).unwrap();
    let p = log.properties();
    assert!(!p.is_empty);
    assert_eq!(p.last_enqueued_sequence_number, 3);
    assert_eq!(p.last_enqueued_offset, Some(r.offsets[3]));
    assert_eq!(p.last_enqueued_time_ms, Some(T0));
}

#[test]
fn retention_by_age_removes_whole_segments_and_empties_an_idle_partition() {
    let f = Fixture::new(Durability::Fsync, 4096);
    let log = f.open();
    for i in 0..30 {
        log.append(&events(&format!("b{i}"), 5)).unwrap();
        f.clock.advance_ms(1_000);
    }
    let retention = Retention {
        age_ms_max: Some(10_000),
        bytes_max: None,
    };
    let outcome = log.enforce_retention(&retention).unwrap();
    assert!(outcome.segments_removed > 0);
    let p = log.properties();
    assert!(p.begin_sequence_number > 0);
    assert_eq!(p.last_enqueued_sequence_number, 149);
    // Reading below the retained start is a clear error, never garbage.
    let mut cursor = ReadCursor::new(0);
    assert!(matches!(
        log.read(&mut cursor, 10, 1 << 20),
        Err(LogError::Expired { .. })
    ));
    // Earliest now means the oldest retained event.
    assert_eq!(
        log.resolve(&EventPosition::Earliest).unwrap(),
        p.begin_sequence_number
    );
    // Once everything is old, the partition empties but keeps its last-enqueued facts.
    f.clock.advance_ms(60_000);
    log.enforce_retention(&retention).unwrap();
    let p = log.properties();
    assert!(p.is_empty);
    assert_eq!(p.begin_sequence_number, 150);
    assert_eq!(p.last_enqueued_sequence_number, 149);
    assert!(p.last_enqueued_offset.is_some());
    drop(log);
    let reopened = f.open();
    assert_eq!(reopened.properties(), p);
    assert_eq!(
        reopened.append(&events("new", 1)).unwrap().base_sequence,
        150
    );
}

#[test]
fn retention_by_size_keeps_the_partition_under_the_limit() {
    let f = Fixture::new(Durability::None, 4096);
    let log = f.open();
    for i in 0..100 {
        log.append(&events(&format!("b{i}"), 5)).unwrap();
    }
    let before = log.retained_bytes();
    let retention = Retention {
        age_ms_max: None,
        bytes_max: Some(10_000),
    };
    log.enforce_retention(&retention).unwrap();
    let after = log.retained_bytes();
    assert!(after < before);
    assert!(after <= 10_000 + 4096, "retained {after} bytes");
    assert_eq!(log.properties().last_enqueued_sequence_number, 499);
}

#[test]
fn a_second_open_of_the_same_partition_is_refused() {
    let f = Fixture::new(Durability::Fsync, 1 << 20);
    let _log = f.open();
    let err = PartitionLog::open(f.dir.path(), f.config, f.committer.clone(), f.clock.clone())
        .unwrap_err();
    assert!(err.to_string().contains("open in another process"), "{err}");
}

#[test]
fn concurrent_appenders_across_partitions_are_all_acknowledged_in_order() {
    let committer = GroupCommitter::start();
    let root = tempfile::tempdir().unwrap();
    let logs: Vec<PartitionLog> = (0..4)
        .map(|p| {
            PartitionLog::open(
                &root.path().join(p.to_string()),
                LogConfig {
                    segment_bytes_max: 64 * 1024,
                    ..LogConfig::default()
                },
                committer.clone(),
                Arc::new(tributary_log::SystemClock),
            )
            .unwrap()
        })
        .collect();
    std::thread::scope(|s| {
        for (t, log) in logs.iter().enumerate() {
            for writer in 0..2 {
                s.spawn(move || {
                    for i in 0..100 {
                        let body = format!("p{t}-w{writer}-{i}");
                        log.append(&[EventData::new(body)]).unwrap();
                    }
                });
            }
        }
    });
    for (t, log) in logs.iter().enumerate() {
        let all = read_all(log, 0);
        assert_eq!(all.len(), 200);
        for writer in 0..2 {
            // Each writer's events appear in the order it appended them.
            let mine: Vec<String> = all
                .iter()
                .map(|e| String::from_utf8(e.data.body.to_vec()).unwrap())
                .filter(|b| b.starts_with(&format!("p{t}-w{writer}-")))
                .collect();
            let expected: Vec<String> = (0..100).map(|i| format!("p{t}-w{writer}-{i}")).collect();
            assert_eq!(mine, expected);
        }
    }
}

/// More partitions than sync threads, each with many appends in flight at once: every
/// partition's chain of syncs makes progress (a busy partition does not keep a sync thread from
/// the others), and each partition acknowledges its appends in append order.
#[test]
fn more_partitions_than_sync_threads_all_acknowledge_in_append_order() {
    all_acknowledge_in_append_order(SyncScope::File);
}

/// The same with partitions sharing syncs of the whole file system (`syncfs`); the data is
/// all there after reopening with another committer.
#[test]
fn partitions_sharing_file_system_syncs_all_acknowledge_in_append_order() {
    let root = all_acknowledge_in_append_order(SyncScope::FileSystem);
    let committer = GroupCommitter::start();
    for p in 0..tributary_log::limits::SYNC_THREADS * 2 + 3 {
        let log = PartitionLog::open(
            &root.path().join(p.to_string()),
            LogConfig::default(),
            committer.clone(),
            Arc::new(tributary_log::SystemClock),
        )
        .unwrap();
        let bodies: Vec<String> = read_all(&log, 0)
            .iter()
            .map(|e| String::from_utf8(e.data.body.to_vec()).unwrap())
            .collect();
        let expected: Vec<String> = (0..60).map(|round| format!("{p}-{round}")).collect();
        assert_eq!(bodies, expected, "partition {p}");
    }
}

/// Appends 60 events to each of more partitions than there are sync threads, all in flight at
/// once, with syncs covering `scope`; checks each partition acknowledged them in order.
/// Returns the data directory.
fn all_acknowledge_in_append_order(scope: SyncScope) -> tempfile::TempDir {
    let committer = GroupCommitter::start_with(scope);
    let root = tempfile::tempdir().unwrap();
    let partitions = tributary_log::limits::SYNC_THREADS * 2 + 3;
    let logs: Vec<PartitionLog> = (0..partitions)
        .map(|p| {
            PartitionLog::open(
                &root.path().join(p.to_string()),
                LogConfig::default(),
                committer.clone(),
                Arc::new(tributary_log::SystemClock),
            )
            .unwrap()
        })
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    const APPENDS: usize = 60;
    for round in 0..APPENDS {
        for (p, log) in logs.iter().enumerate() {
            let tx = tx.clone();
            log.append_with(
                &[EventData::new(format!("{p}-{round}"))],
                Box::new(move |outcome| {
                    let _ = tx.send((p, outcome.map(|r| r.base_sequence)));
                }),
            )
            .unwrap();
        }
    }
    drop(tx);
    let mut acknowledged: Vec<Vec<i64>> = vec![Vec::new(); partitions];
    for (p, outcome) in rx.iter() {
        acknowledged[p].push(outcome.unwrap());
    }
    for (p, sequences) in acknowledged.iter().enumerate() {
        let expected: Vec<i64> = (0..APPENDS as i64).collect();
        assert_eq!(sequences, &expected, "partition {p}");
    }
    root
}

#[test]
fn the_commit_listener_sees_every_advance() {
    let f = Fixture::new(Durability::Fsync, 1 << 20);
    let log = f.open();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    log.set_commit_listener(move |c| sink.lock().unwrap().push(c.next_sequence));
    log.append(&events("a", 2)).unwrap();
    log.append(&events("b", 3)).unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![2, 5]);
}

#[test]
fn reads_starting_between_index_entries_start_at_the_cursor() {
    let mut f = Fixture::new(Durability::None, 1 << 20);
    f.config.index_interval_bytes = 64 * 1024; // Only the first batch is indexed.
    let log = f.open();
    for i in 0..10 {
        log.append(&events(&format!("b{i}"), 3)).unwrap();
    }
    for from in [0, 1, 4, 13, 29] {
        let got = read_all(&log, from);
        assert_eq!(got.first().map(|e| e.sequence_number), Some(from));
        assert_eq!(got.len() as i64, 30 - from);
    }
}

#[test]
fn interval_durability_acknowledges_on_write_and_syncs_in_the_background() {
    let f = Fixture::new(
        Durability::Interval(std::time::Duration::from_millis(20)),
        1 << 20,
    );
    let log = f.open();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = seen.clone();
    log.set_commit_listener(move |c| sink.lock().unwrap().push(c.next_sequence));
    // Acknowledged and visible as soon as it is written, before any sync.
    let receipt = log.append(&events("a", 3)).unwrap();
    assert_eq!(receipt.base_sequence, 0);
    assert_eq!(*seen.lock().unwrap(), vec![3]);
    assert_eq!(read_all(&log, 0).len(), 3);
    // The committer's periodic sync runs without blocking further appends.
    std::thread::sleep(std::time::Duration::from_millis(60));
    log.append(&events("b", 2)).unwrap();
    drop(log);
    assert_eq!(read_all(&f.open(), 0).len(), 5);
}

#[test]
fn the_committer_counts_its_syncs_and_the_appends_they_cover() {
    let f = Fixture::new(Durability::Fsync, 1 << 20);
    let log = f.open();
    let before = f.committer.sync_times();
    for i in 0..5 {
        log.append(&events(&format!("a{i}"), 2)).unwrap();
    }
    let window = f.committer.sync_times().since(&before);
    // One append at a time: each waits for its own sync, and no less than the sync took.
    assert_eq!(window.waits.count, 5);
    assert_eq!(window.syncs.count, 5);
    assert!(window.syncs.total > std::time::Duration::ZERO);
    assert!(window.waits.total >= window.syncs.total);
    assert_eq!(
        window.syncs.buckets().map(|(_, n)| n).sum::<u64>(),
        5,
        "every sync is in a bucket"
    );
    // Appends that never sync are not counted.
    let none = Fixture::new(Durability::None, 1 << 20);
    none.open().append(&events("n", 2)).unwrap();
    assert_eq!(none.committer.sync_times(), Default::default());
}

/// A segment a newer build created last, holding nothing yet past its header, looks like the
/// leftover of an interrupted roll, which recovery removes; its version says otherwise, so the
/// partition is refused (naming both versions) and the segment kept.
#[test]
fn a_newer_build_s_empty_last_segment_is_refused_not_removed_as_torn() {
    let f = Fixture::new(Durability::None, 4096);
    let log = f.open();
    log.append(&events("a", 10)).unwrap();
    let end = log.committed().end_offset;
    drop(log);
    let first = f.dir.path().join("00000000000000000000.log");
    let mut header = std::fs::read(&first).unwrap()[..64].to_vec();
    header[8..12].copy_from_slice(&4u32.to_le_bytes());
    let crc = crc32c::crc32c(&header[..60]);
    header[60..64].copy_from_slice(&crc.to_le_bytes());
    let newer = f.dir.path().join(format!("{end:020}.log"));
    std::fs::write(&newer, &header).unwrap();

    let refused = PartitionLog::open(f.dir.path(), f.config, f.committer.clone(), f.clock.clone())
        .unwrap_err();
    assert!(matches!(refused, LogError::FormatTooNew(_)), "{refused}");
    let message = refused.to_string();
    assert!(
        message.contains("was written by format 4; this binary reads up to format 3"),
        "{message}"
    );
    assert_eq!(std::fs::read(&newer).unwrap(), header, "kept as it was");
}

/// The real file system, counting the reads of files and the bytes they read.
#[derive(Debug, Default)]
struct CountingStorage {
    read: Arc<std::sync::atomic::AtomicU64>,
    reads: Arc<std::sync::atomic::AtomicU64>,
}

#[derive(Debug)]
struct CountingFile {
    file: Box<dyn tributary_log::storage::StorageFile>,
    read: Arc<std::sync::atomic::AtomicU64>,
    reads: Arc<std::sync::atomic::AtomicU64>,
}

impl tributary_log::storage::StorageFile for CountingFile {
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> std::io::Result<()> {
        self.read
            .fetch_add(buf.len() as u64, std::sync::atomic::Ordering::Relaxed);
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.file.read_exact_at(buf, at)
    }
    fn write_all_at(&self, buf: &[u8], at: u64) -> std::io::Result<()> {
        self.file.write_all_at(buf, at)
    }
    fn size(&self) -> std::io::Result<u64> {
        self.file.size()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.file.set_len(len)
    }
    fn allocate(&self, len: u64) -> std::io::Result<()> {
        self.file.allocate(len)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.file.sync_data()
    }
    fn sync_all(&self) -> std::io::Result<()> {
        self.file.sync_all()
    }
}

impl tributary_log::storage::Storage for CountingStorage {
    fn create_dir_all(&self, dir: &std::path::Path) -> std::io::Result<()> {
        tributary_log::storage::OsStorage.create_dir_all(dir)
    }
    fn open(
        &self,
        path: &std::path::Path,
        mode: tributary_log::storage::OpenMode,
    ) -> std::io::Result<Box<dyn tributary_log::storage::StorageFile>> {
        let file = tributary_log::storage::OsStorage.open(path, mode)?;
        Ok(Box::new(CountingFile {
            file,
            read: Arc::clone(&self.read),
            reads: Arc::clone(&self.reads),
        }))
    }
    fn list_dir(&self, dir: &std::path::Path) -> std::io::Result<Vec<String>> {
        tributary_log::storage::OsStorage.list_dir(dir)
    }
    fn remove_file(&self, path: &std::path::Path) -> std::io::Result<()> {
        tributary_log::storage::OsStorage.remove_file(path)
    }
    fn rename(&self, from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
        tributary_log::storage::OsStorage.rename(from, to)
    }
    fn sync_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        tributary_log::storage::OsStorage.sync_dir(dir)
    }
    fn lock_file(
        &self,
        path: &std::path::Path,
    ) -> std::io::Result<Box<dyn std::fmt::Debug + Send + Sync>> {
        tributary_log::storage::OsStorage.lock_file(path)
    }
    fn file_system(
        &self,
        dir: &std::path::Path,
    ) -> std::io::Result<Box<dyn tributary_log::storage::FileSystem>> {
        tributary_log::storage::OsStorage.file_system(dir)
    }
}

/// 16 MiB appended to `f`'s partition on `storage` in batches of 100 events of 1 KiB, each
/// batch a millisecond after the last, index entries 64 KiB apart; the log reopened (so no
/// reader holds anything of it) and each batch's receipt.
fn sixteen_mib_reopened(
    f: &Fixture,
    storage: &Arc<CountingStorage>,
) -> (PartitionLog, Vec<tributary_log::AppendReceipt>) {
    let config = LogConfig {
        index_interval_bytes: 64 * 1024,
        ..f.config
    };
    let open = || {
        PartitionLog::open_on(
            storage.clone(),
            f.dir.path(),
            config,
            f.committer.clone(),
            f.clock.clone(),
        )
        .unwrap()
    };
    let log = open();
    let batch: Vec<EventData> = (0..100).map(|_| EventData::new(vec![7_u8; 1024])).collect();
    let mut receipts = Vec::new();
    for _ in 0..160 {
        receipts.push(log.append(&batch).unwrap());
        f.clock.advance_ms(1);
    }
    drop(log);
    (open(), receipts)
}

/// A reader that wants one event deep in a partition (found by offset, by time or by sequence
/// number) reads less than the largest chunk from the file: on a cold page cache what it waits
/// for is the disk. A reader that goes on reads ahead in chunks that grow to the largest.
#[test]
fn a_reader_starting_deep_in_the_log_reads_little_and_one_that_goes_on_reads_ahead() {
    use tributary_log::limits::{READ_CHUNK_BYTES, READ_CHUNK_FIRST_BYTES};
    let f = Fixture::new(Durability::None, 64 << 20);
    let storage = Arc::new(CountingStorage::default());
    let (log, receipts) = sixteen_mib_reopened(&f, &storage);
    let deep = &receipts[57];
    let positions = [
        EventPosition::Offset {
            offset: deep.offsets[50],
            inclusive: true,
        },
        EventPosition::EnqueuedTime {
            enqueued_time_ms: deep.enqueued_time_ms,
            inclusive: true,
        },
        EventPosition::SequenceNumber {
            sequence_number: deep.base_sequence + 50,
            inclusive: true,
        },
    ];
    let first_chunk = u64::from(READ_CHUNK_FIRST_BYTES);
    for position in positions {
        let before = storage.read.load(std::sync::atomic::Ordering::Relaxed);
        let mut cursor = ReadCursor::new(log.resolve(&position).unwrap());
        let events = log.read(&mut cursor, 1, 4 << 20).unwrap();
        let read = storage.read.load(std::sync::atomic::Ordering::Relaxed) - before;
        assert_eq!(events.len(), 1, "{position:?}");
        assert!(
            (deep.base_sequence..deep.base_sequence + 100).contains(&events[0].sequence_number),
            "{position:?}: {events:?}"
        );
        assert!(
            read <= 2 * first_chunk && read < u64::from(READ_CHUNK_BYTES),
            "{position:?}: {read} bytes read for one event"
        );
    }
    // Going on from there, the chunks grow to the largest: 8 MiB takes a few reads of the file
    // (a few a chunk: each call stops at its byte budget, and a batch that runs past a chunk's
    // end is read on its own). Chunks that stayed at the first size would take twice as many.
    let reads_before = storage.reads.load(std::sync::atomic::Ordering::Relaxed);
    let mut cursor = ReadCursor::new(deep.base_sequence);
    let mut events = 0;
    while events < 8 * 1024 {
        let read = log.read(&mut cursor, 1024, 1 << 20).unwrap();
        assert!(!read.is_empty());
        events += read.len();
    }
    let reads = storage.reads.load(std::sync::atomic::Ordering::Relaxed) - reads_before;
    let largest_chunks = 8 * 1024 * 1024 / u64::from(READ_CHUNK_BYTES);
    let ramp = u64::from((READ_CHUNK_BYTES / READ_CHUNK_FIRST_BYTES).ilog2());
    assert!(
        reads <= 4 * (largest_chunks + ramp),
        "{reads} reads of the file for 8 MiB"
    );
}
