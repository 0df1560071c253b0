//! [`PartitionLog`]: one partition's segments, its writer, its readers and its recovery.
//!
//! # Invariants (asserted where they are maintained)
//! 1. Sequence numbers are assigned densely: batch `n + 1` starts where batch `n` ends. Only
//!    compaction leaves gaps, in the segments it rewrote (version 3), where they may skip but
//!    never go back.
//! 2. Offsets only grow: a batch's offset is its segment's base offset plus its file position,
//!    and segment `k + 1` starts at segment `k`'s end offset. In a compacted segment each
//!    batch's first event keeps the offset it was given, past the last event before it.
//! 3. Enqueued times never decrease: a batch is stamped `max(clock, previous stamp)`.
//! 4. Readers see only committed events: in `fsync` mode, events whose batch has been synced;
//!    otherwise, events whose batch has been written.
//! 5. The committed state only moves forward.
//! 6. A refused append changes nothing: it is validated before any byte is written, and a
//!    failed write leaves the end position where it was, with the file cut back to it.
//! 7. Nothing is acknowledged after a failed sync of the partition (of an append, a flush, or
//!    a segment being sealed): the partition is poisoned until it is reopened.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use bytes::{Bytes, BytesMut};
use tributary_event::{EventData, EventPosition, PAIRWISE_KEY_CHECK_MAX, ReceivedEvent};

use crate::LogError;
use crate::RecordsRead;
use crate::commit::{GroupCommitter, PendingSync};
use crate::compaction::{CompactionBook, CompactionOutcome, CompactionState};
use crate::config::{Cleanup, Durability, LogConfig, Retention};
use crate::limits::*;
use crate::record::{
    BATCH_HEADER_BYTES, BatchHeader, encode_batch, record_len, record_offsets, verify_checksum,
};
use crate::segment::*;
use crate::storage::{FileSystem, OpenMode, OsStorage, Storage};
use crate::tail::{TailCache, TailFollower};
use tributary_event::Clock;

/// Called once per append with its outcome: the receipt when the append is acknowledged, or the
/// error that stopped it after it was accepted (a failed sync).
pub type AppendCompletion = Box<dyn FnOnce(Result<AppendReceipt, LogError>) + Send + 'static>;

/// What the log assigned to an acknowledged append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendReceipt {
    /// The sequence number of the batch's first event; the rest follow densely.
    pub base_sequence: i64,
    /// Each event's offset, in batch order.
    pub offsets: Vec<u64>,
    /// The enqueued time shared by the batch's events.
    pub enqueued_time_ms: i64,
}

impl AppendReceipt {
    /// The sequence number of the batch's last event.
    pub fn last_sequence(&self) -> i64 {
        self.base_sequence + self.offsets.len() as i64 - 1
    }
}

/// The part of a partition readers may see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Committed {
    /// The sequence number the next event will get; every event below it is visible.
    pub next_sequence: i64,
    /// The partition's end offset (just past the last visible batch).
    pub end_offset: u64,
    /// The offset of the last visible event, if any was ever appended.
    pub last_offset: Option<u64>,
    /// The enqueued time of the last visible event, if any was ever appended.
    pub last_enqueued_time_ms: Option<i64>,
}

/// The properties Event Hubs reports for a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionProperties {
    /// The oldest retained sequence number (equals `last_enqueued_sequence_number + 1` when the
    /// partition is empty).
    pub begin_sequence_number: i64,
    /// The newest sequence number; -1 if nothing was ever appended.
    pub last_enqueued_sequence_number: i64,
    /// The newest event's offset, if any was ever appended.
    pub last_enqueued_offset: Option<u64>,
    /// The newest event's enqueued time, if any was ever appended.
    pub last_enqueued_time_ms: Option<i64>,
    /// Whether no event is retained.
    pub is_empty: bool,
}

/// What one retention pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    /// Segments deleted.
    pub segments_removed: u32,
    /// Bytes freed.
    pub bytes_removed: u64,
    /// Whether retention kept a segment it would have removed because it holds events not yet
    /// captured ([`Uncaptured::hold`]).
    pub held_for_uncaptured: bool,
    /// Events not yet captured that retention removed anyway (`hold` off).
    pub uncaptured_events_removed: u64,
}

/// The events of a partition a capture has not written yet: those from `from_sequence` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uncaptured {
    /// The first sequence number not yet captured.
    pub from_sequence: i64,
    /// Whether retention keeps the segments that hold them (else it removes them as due and
    /// counts them in [`RetentionOutcome::uncaptured_events_removed`]).
    pub hold: bool,
}

/// Where a reader is in a partition. Keeps a hint of the file position so sequential reads do
/// not consult the index, and its read buffers, which it reuses once the events read into them
/// have been dropped (fresh memory costs page faults; reused memory does not).
#[derive(Debug, Clone)]
pub struct ReadCursor {
    next_sequence: i64,
    hint: Option<ReadHint>,
    buffers: ReadBuffers,
    /// Bytes already read past what the last call consumed, and the id of their segment.
    /// Committed bytes of a segment file never change, so they stay valid (compaction writes a
    /// new file, with a new id).
    read_ahead: Option<(u64, Chunk)>,
    /// What the next read of the file asks for at most: small for a new reader, growing as it
    /// goes on.
    read_chunk: ReadChunk,
}

/// A reader's buffers, taking turns. The events of one read hold the memory of the buffers
/// they lie in until they are dropped, and a read usually starts in bytes the read before it
/// left (its read-ahead), so the buffer filled last is rarely free when the next read is due,
/// and a read may fill two chunks after its read-ahead (see [`READ_BUFFERS_MAX`]). Each read
/// that found no free buffer would take fresh memory for the kernel to fault in and clear, so
/// a reader keeps up to [`READ_BUFFERS_MAX`]: one that drops a read's events before the read
/// after next reads into memory it already has, and holds at most that many chunks until
/// [`ReadCursor::release_buffers`].
#[derive(Debug, Clone, Default)]
struct ReadBuffers {
    /// The first is what reads append to (handed out by `split`); the others were filled
    /// before it, most recently first, and are reused once nothing refers to them any more.
    buffers: Vec<BytesMut>,
    /// How many times no buffer could be reused and memory was allocated (so, when not zero,
    /// the buffers hold memory).
    fresh_allocations: u64,
}

impl ReadBuffers {
    /// A buffer with room for `len` more bytes: the first one that has the room or can take
    /// its memory back, else a fresh allocation, which replaces the least recently filled
    /// buffer once the reader holds [`READ_BUFFERS_MAX`]. A fresh one is rounded up to a power
    /// of two, so reads of other lengths (a read-ahead's size follows what is left to read) fit
    /// it later.
    fn with_room(&mut self, len: usize) -> &mut BytesMut {
        match self.buffers.iter_mut().position(|b| b.try_reclaim(len)) {
            Some(free) => self.buffers[..=free].rotate_right(1),
            None => {
                if self.buffers.len() == READ_BUFFERS_MAX {
                    self.buffers.pop();
                }
                self.buffers
                    .insert(0, BytesMut::with_capacity(len.next_power_of_two()));
                self.fresh_allocations += 1;
            }
        }
        &mut self.buffers[0]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ReadHint {
    segment_id: u64,
    position: u64,
    batch_sequence: i64,
}

impl ReadCursor {
    /// A cursor whose next event is `next_sequence` (see [`PartitionLog::resolve`]).
    pub fn new(next_sequence: i64) -> ReadCursor {
        assert!(next_sequence >= 0);
        ReadCursor {
            next_sequence,
            hint: None,
            buffers: ReadBuffers::default(),
            read_ahead: None,
            read_chunk: ReadChunk::default(),
        }
    }

    /// Gives back the memory of the bytes last read (a reader going idle); the next read
    /// allocates again.
    pub fn release_buffers(&mut self) {
        self.buffers = ReadBuffers::default();
        self.read_ahead = None;
    }

    /// Whether the cursor holds memory for reads: a buffer read into, or read-ahead bytes.
    /// False for a new cursor and after [`ReadCursor::release_buffers`].
    pub fn holds_buffers(&self) -> bool {
        self.buffers.fresh_allocations > 0 || self.read_ahead.is_some()
    }

    /// The sequence number of the next event this cursor reads.
    pub fn next_sequence(&self) -> i64 {
        self.next_sequence
    }
}

/// The writer's state; guarded by one mutex, so appends to a partition are serialised.
pub(crate) struct Writer {
    active: Arc<Segment>,
    /// The active file's length, preallocation included.
    allocated_len: u64,
    /// Whether the file system supports preallocation.
    preallocate: bool,
    next_sequence: i64,
    last_time_ms: Option<i64>,
    last_offset: Option<u64>,
}

thread_local! {
    /// The buffer a batch is encoded into before its write: one per thread, not one per
    /// partition. A partition's own buffer would keep its largest batch for as long as the
    /// partition lives, and with many partitions each would be cold in the caches when its
    /// partition next appends.
    static ENCODE_BUF: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// State shared between a [`PartitionLog`], its readers and the committer.
pub(crate) struct PartitionShared {
    pub(crate) dir: PathBuf,
    pub(crate) config: LogConfig,
    clock: Arc<dyn Clock>,
    committer: GroupCommitter,
    /// The file system the committer syncs whole for this partition
    /// ([`crate::SyncScope::FileSystem`]); none when each file syncs on its own.
    pub(crate) file_system: Option<Arc<dyn FileSystem>>,
    writer: Mutex<Writer>,
    pub(crate) segments: RwLock<Vec<Arc<Segment>>>,
    committed: Mutex<Committed>,
    poisoned: Mutex<Option<String>>,
    listener: RwLock<Option<CommitListener>>,
    /// Where the files are.
    pub(crate) storage: Arc<dyn Storage>,
    /// The cleanup policy now in force (the configuration's until changed).
    cleanup: RwLock<Cleanup>,
    /// Held by compaction and retention, which both replace or remove sealed segments, so
    /// they never work on the same segment at once.
    pub(crate) maintenance: Mutex<()>,
    /// Compaction's progress (a lock of its own, so metrics never wait for a run).
    pub(crate) compaction_book: Mutex<CompactionBook>,
    /// The newest batches, kept while a reader follows the end (see `crate::tail`).
    tail: Arc<TailCache>,
    /// Holds the partition directory's lock file open (and so locked) while the log is open.
    _lock: Box<dyn std::fmt::Debug + Send + Sync>,
}

type CommitListener = Arc<dyn Fn(&Committed) + Send + Sync>;

/// One partition of an event hub: an append-only, segmented, checksummed log.
///
/// Cloning is cheap and shares the log.
#[derive(Clone)]
pub struct PartitionLog {
    shared: Arc<PartitionShared>,
}

impl std::fmt::Debug for PartitionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionLog")
            .field("dir", &self.shared.dir)
            .field("committed", &self.committed())
            .finish_non_exhaustive()
    }
}

impl PartitionShared {
    /// Makes `committed` visible to readers (if it is ahead of what they see) and tells the
    /// listener.
    pub(crate) fn publish(&self, committed: Committed) {
        let mut current = self.committed.lock().expect("committed lock");
        if committed.next_sequence <= current.next_sequence {
            return;
        }
        assert!(
            committed.end_offset > current.end_offset,
            "offsets only grow"
        );
        *current = committed;
        drop(current);
        if let Some(listener) = self.listener.read().expect("listener lock").as_ref() {
            listener(&committed);
        }
    }

    /// Stops the partition from accepting appends; returns the error appends now get.
    pub(crate) fn poison(&self, cause: &str) -> LogError {
        let mut poisoned = self.poisoned.lock().expect("poison lock");
        if poisoned.is_none() {
            tracing::error!(partition = %self.dir.display(), cause, "partition log poisoned");
            *poisoned = Some(cause.to_owned());
        }
        LogError::Poisoned {
            path: self.dir.clone(),
            cause: poisoned.clone().unwrap_or_default(),
        }
    }

    /// After a failed sync (the partition already poisoned): cuts the active segment back to
    /// the end of what was acknowledged and syncs it. The page cache may still show bytes whose
    /// sync failed though the disk never gets them (Linux drops the error with the pages); a
    /// restart that keeps the page cache (of the process, not the machine) would recover them
    /// and build on them. Best effort: if this fails too, the error is logged and only a
    /// restart of the machine guarantees that recovery reads what the disk holds.
    pub(crate) fn cut_unacknowledged(&self, writer: &Writer) {
        if self.config.durability != Durability::Fsync {
            return; // Acknowledged on write: there is nothing unacknowledged to cut.
        }
        let committed = self.committed.lock().expect("committed lock").end_offset;
        let active = &writer.active;
        let keep = committed
            .saturating_sub(active.header.base_offset)
            .max(SEGMENT_HEADER_BYTES as u64);
        let cut = active
            .file
            .set_len(keep)
            .and_then(|()| active.file.sync_all());
        if let Err(e) = cut {
            tracing::error!(
                segment = %active.path.display(),
                error = %e,
                "cannot cut the unacknowledged tail after a failed sync; restart the machine, not only the process"
            );
        }
    }

    /// [`PartitionShared::cut_unacknowledged`], for a caller not holding the writer.
    pub(crate) fn cut_unacknowledged_now(&self) {
        let writer = self.writer.lock().expect("writer lock");
        self.cut_unacknowledged(&writer);
    }

    pub(crate) fn check_poisoned(&self) -> Result<(), LogError> {
        match &*self.poisoned.lock().expect("poison lock") {
            None => Ok(()),
            Some(cause) => Err(LogError::Poisoned {
                path: self.dir.clone(),
                cause: cause.clone(),
            }),
        }
    }
}

impl PartitionLog {
    /// Opens (creating if needed) the partition log in `dir`, recovering it: sealed segments are
    /// checked against their index files, the active segment is scanned and any torn or corrupt
    /// tail is cut off and synced away.
    ///
    /// Fails with [`LogError::Corrupted`] if a sealed segment is found damaged (acknowledged data
    /// would be lost, so it is not silently dropped), and with an I/O error if another process
    /// has the partition open. A sealed segment whose index agrees with its length is not
    /// scanned: damage inside one of its batches is found by that batch's checksum when a read
    /// reaches it, which fails with [`LogError::Corrupted`] — damaged events are never served.
    pub fn open(
        dir: &Path,
        config: LogConfig,
        committer: GroupCommitter,
        clock: Arc<dyn Clock>,
    ) -> Result<PartitionLog, LogError> {
        Self::open_on(Arc::new(OsStorage), dir, config, committer, clock)
    }

    /// [`PartitionLog::open`] on another [`Storage`] than the real file system (for example a
    /// fault-injecting one in tests).
    pub fn open_on(
        storage: Arc<dyn Storage>,
        dir: &Path,
        config: LogConfig,
        committer: GroupCommitter,
        clock: Arc<dyn Clock>,
    ) -> Result<PartitionLog, LogError> {
        config.validate()?;
        storage
            .create_dir_all(dir)
            .map_err(|e| LogError::io("create directory", dir, e))?;
        let lock = lock_directory(storage.as_ref(), dir)?;
        let segments =
            crate::recovery::recover_segments(storage.as_ref(), dir, &config, clock.as_ref())?;
        let active = segments
            .last()
            .expect("recovery leaves an active segment")
            .clone();
        let contents = active.contents();
        let (last_offset, last_time_ms) = last_event(&segments);
        let book = CompactionBook::recovered(&segments);
        let committed = Committed {
            next_sequence: contents.next_sequence,
            end_offset: active.header.base_offset + contents.end_position,
            last_offset,
            last_enqueued_time_ms: last_time_ms,
        };
        let writer = Writer {
            allocated_len: contents.end_position,
            preallocate: true,
            active,
            next_sequence: committed.next_sequence,
            last_time_ms,
            last_offset,
        };
        let file_system = committer.file_system_of(storage.as_ref(), dir);
        Ok(PartitionLog {
            shared: Arc::new(PartitionShared {
                dir: dir.to_owned(),
                config,
                clock,
                committer,
                file_system,
                writer: Mutex::new(writer),
                segments: RwLock::new(segments),
                committed: Mutex::new(committed),
                poisoned: Mutex::new(None),
                listener: RwLock::new(None),
                storage,
                cleanup: RwLock::new(config.cleanup),
                maintenance: Mutex::new(()),
                compaction_book: Mutex::new(book),
                tail: Arc::default(),
                _lock: lock,
            }),
        })
    }

    /// The directory the log lives in.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The configuration the log was opened with.
    pub fn config(&self) -> &LogConfig {
        &self.shared.config
    }

    /// The cleanup policy in force.
    pub fn cleanup(&self) -> Cleanup {
        *self.shared.cleanup.read().expect("cleanup lock")
    }

    /// Changes the cleanup policy (a hub's policy was updated). From now on appends follow it
    /// (a compacting policy refuses events without a partition key), and so do
    /// [`PartitionLog::compact`] and [`PartitionLog::enforce_retention`].
    pub fn set_cleanup(&self, cleanup: Cleanup) -> Result<(), LogError> {
        cleanup.validate()?;
        *self.shared.cleanup.write().expect("cleanup lock") = cleanup;
        Ok(())
    }

    /// Compacts the partition's sealed segments as of `now_ms` (see the `compaction` module):
    /// keeps the latest event of each partition key, removes superseded events and tombstones
    /// older than the tombstone retention. Blocks for as long as the rewrite takes, so call it
    /// from a thread that may block; appends and reads go on meanwhile. A partition whose
    /// policy does not compact is left alone (an empty outcome).
    pub fn compact(&self, now_ms: i64) -> Result<CompactionOutcome, LogError> {
        crate::compaction::compact(&self.shared, self.cleanup(), now_ms)
    }

    /// How much of the partition compaction has not yet seen, and what its last run did.
    pub fn compaction_state(&self) -> CompactionState {
        let segments = self.segments_snapshot();
        let book = self
            .shared
            .compaction_book
            .lock()
            .expect("compaction book lock");
        book.state(&segments)
    }

    /// Sets the function called (on the committing thread) every time the committed state
    /// moves forward. It must be quick: waking a waiter, not doing work.
    pub fn set_commit_listener(&self, listener: impl Fn(&Committed) + Send + Sync + 'static) {
        *self.shared.listener.write().expect("listener lock") = Some(Arc::new(listener));
    }

    /// What readers can currently see.
    pub fn committed(&self) -> Committed {
        *self.shared.committed.lock().expect("committed lock")
    }

    /// Keeps the batches appended from now on in memory, the newest
    /// [`crate::limits::TAIL_BYTES_MAX`] of them, until the follower is dropped: for a reader
    /// that follows the end of the log (a capture), which then reads them from memory instead
    /// of the file (see `crate::tail`).
    pub fn follow_tail(&self) -> TailFollower {
        self.shared.tail.follow()
    }

    /// Appends `events` as one batch and blocks until it is acknowledged under the configured
    /// durability.
    pub fn append(&self, events: &[EventData]) -> Result<AppendReceipt, LogError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.append_with(
            events,
            Box::new(move |outcome| {
                let _ = tx.send(outcome);
            }),
        )?;
        rx.recv().unwrap_or(Err(LogError::Closed))
    }

    /// Appends `events` as one batch; `completion` is called once the append is acknowledged
    /// (possibly before this returns, on this thread).
    ///
    /// An `Err` return means the append was refused and nothing was written; `completion` is
    /// then never called.
    pub fn append_with(
        &self,
        events: &[EventData],
        completion: AppendCompletion,
    ) -> Result<(), LogError> {
        let batch_len_at_most = self.validate(events)?;
        let shared = &self.shared;
        shared.check_poisoned()?;
        let mut writer = shared.writer.lock().expect("writer lock");
        shared.check_poisoned()?;
        let now = shared.clock.now_ms();
        let time_ms = writer.last_time_ms.map_or(now, |last| last.max(now));
        let active_end = writer
            .active
            .contents
            .read()
            .expect("segment lock")
            .end_position;
        if active_end > SEGMENT_HEADER_BYTES as u64
            && active_end + batch_len_at_most > shared.config.segment_bytes_max
        {
            self.roll(&mut writer)?;
        }
        let (receipt, committed) =
            self.write_batch(&mut writer, events, time_ms, batch_len_at_most)?;
        match shared.config.durability {
            Durability::Fsync => {
                shared.committer.enqueue(PendingSync {
                    partition: shared.clone(),
                    segment: writer.active.clone(),
                    committed,
                    receipt,
                    completion,
                    handed_over: std::time::Instant::now(),
                });
            }
            Durability::Interval(interval) => {
                shared.publish(committed);
                shared
                    .committer
                    .mark_dirty(shared.clone(), writer.active.clone(), interval);
                drop(writer);
                completion(Ok(receipt));
            }
            Durability::None => {
                shared.publish(committed);
                drop(writer);
                completion(Ok(receipt));
            }
        }
        Ok(())
    }

    /// Checks a batch against every limit before anything is written; returns the most it
    /// takes encoded (each record on its own; references between records only shrink it).
    fn validate(&self, events: &[EventData]) -> Result<u64, LogError> {
        if events.is_empty() {
            return Err(LogError::EmptyBatch);
        }
        let limit = self.shared.config.event_bytes_max;
        let policy = self.cleanup().policy;
        let mut total = BATCH_HEADER_BYTES as u64;
        for (index, event) in events.iter().enumerate() {
            if policy.compacts() && event.partition_key.is_none() {
                return Err(LogError::MissingPartitionKey { index, policy });
            }
            let bytes = record_len(event);
            if bytes > u64::from(limit) {
                return Err(LogError::EventTooLarge {
                    index,
                    bytes,
                    limit,
                });
            }
            if let Some(key) = duplicate_property_key(event) {
                return Err(LogError::InvalidEvent {
                    index,
                    reason: format!("the property {key:?} is given more than once"),
                });
            }
            total += bytes;
        }
        if total > u64::from(BATCH_BYTES_MAX) {
            return Err(LogError::BatchTooLarge {
                bytes: total,
                limit: BATCH_BYTES_MAX,
            });
        }
        Ok(total)
    }

    /// Encodes and writes one batch at the end of the active segment.
    fn write_batch(
        &self,
        writer: &mut Writer,
        events: &[EventData],
        time_ms: i64,
        batch_len_at_most: u64,
    ) -> Result<(AppendReceipt, Committed), LogError> {
        let active = writer.active.clone();
        let position = active.contents.read().expect("segment lock").end_position;
        let batch_offset = active.header.base_offset + position;
        let mut offsets = Vec::with_capacity(events.len());
        // A followed partition keeps the batch's buffer (see `crate::tail`): one of its own
        // spare ones, sized for the batch, instead of the thread's.
        let keep = self.shared.tail.is_followed();
        let mut buf = if keep {
            let len = usize::try_from(batch_len_at_most).expect("a batch fits memory");
            self.shared.tail.buffer(len)
        } else {
            ENCODE_BUF.take()
        };
        encode_batch(
            &mut buf,
            batch_offset,
            writer.next_sequence,
            time_ms,
            events,
            active.header.allows_property_refs(),
            &mut offsets,
        );
        let batch_len = buf.len() as u64;
        assert!(
            batch_len <= batch_len_at_most,
            "a batch is never longer than validated"
        );
        self.preallocate(writer, position + batch_len);
        let written = active.file.write_all_at(&buf, position);
        let header = BatchHeader::decode(&buf).expect("encoded header decodes");
        if keep {
            if written.is_ok() {
                self.shared.tail.keep(active.id, position, buf);
            }
        } else if buf.capacity() <= ENCODE_BUF_KEPT_BYTES {
            ENCODE_BUF.set(buf);
        }
        if let Err(e) = written {
            tracing::warn!(
                segment = %active.path.display(),
                position,
                bytes = batch_len,
                error = %e,
                "append refused: the write failed (is the disk full?)"
            );
            let error = LogError::io("write", &active.path, e);
            self.discard_partial_write(writer, position, &error);
            return Err(error);
        }
        let last_offset = *offsets.last().expect("non-empty batch");
        active.contents.write().expect("segment lock").push_batch(
            &active.header,
            &header,
            position,
            last_offset,
            self.shared.config.index_interval_bytes,
        );
        let receipt = AppendReceipt {
            base_sequence: writer.next_sequence,
            offsets,
            enqueued_time_ms: time_ms,
        };
        writer.next_sequence = header.next_sequence();
        writer.last_time_ms = Some(time_ms);
        writer.last_offset = Some(last_offset);
        let committed = Committed {
            next_sequence: writer.next_sequence,
            end_offset: batch_offset + batch_len,
            last_offset: Some(last_offset),
            last_enqueued_time_ms: Some(time_ms),
        };
        Ok((receipt, committed))
    }

    /// After a failed write, cuts the file back to the end of the log, so the bytes the write
    /// did put down (a short write) never sit past the end: the partial bytes of two refused
    /// batches could otherwise add up to a whole one that recovery would find. Cutting needs no
    /// space; if it fails anyway, the file's state is unknown and the partition is poisoned.
    fn discard_partial_write(&self, writer: &mut Writer, position: u64, cause: &LogError) {
        writer.allocated_len = position;
        if let Err(e) = writer.active.file.set_len(position) {
            tracing::error!(
                segment = %writer.active.path.display(),
                error = %e,
                "cannot cut off a failed write"
            );
            self.shared
                .poison(&format!("{cause}; cutting it off failed too: {e}"));
        }
    }

    /// Grows the active file ahead of the writer so most syncs need not persist a size change.
    fn preallocate(&self, writer: &mut Writer, needed_len: u64) {
        if !writer.preallocate || needed_len <= writer.allocated_len {
            return;
        }
        let step = writer
            .allocated_len
            .clamp(PREALLOCATE_BYTES_MIN, PREALLOCATE_BYTES_MAX);
        let cap = self.shared.config.segment_bytes_max.max(needed_len);
        let new_len = (writer.allocated_len + step).max(needed_len).min(cap);
        match writer.active.file.allocate(new_len) {
            Ok(()) => writer.allocated_len = new_len,
            // Not every file system preallocates; writing without it is only slower.
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                tracing::debug!(error = %e, "preallocation unsupported; continuing without");
                writer.preallocate = false;
            }
            // A full disk: the write that follows may still fit (it decides, and says so).
            Err(e) => tracing::warn!(
                segment = %writer.active.path.display(),
                bytes = new_len,
                error = %e,
                "cannot preallocate the segment (is the disk full?)"
            ),
        }
    }

    /// Seals the active segment and starts a new one at its end.
    fn roll(&self, writer: &mut Writer) -> Result<(), LogError> {
        let shared = &self.shared;
        // A poisoned partition's segment may hold bytes no sync vouched for: never seal it.
        shared.check_poisoned()?;
        let old = writer.active.clone();
        let contents = old.contents();
        assert_eq!(contents.next_sequence, writer.next_sequence);
        let sealed = (|| {
            old.file
                .set_len(contents.end_position)
                .and_then(|()| old.file.sync_all())
                .map_err(|e| LogError::io("seal", &old.path, e))?;
            let index = index_path(&shared.dir, old.header.base_offset);
            write_index_file(shared.storage.as_ref(), &index, &old.header, &contents)
        })();
        if let Err(e) = sealed {
            shared.poison(&e.to_string());
            shared.cut_unacknowledged(writer);
            return Err(e);
        }
        let header = SegmentHeader {
            version: SEGMENT_VERSION,
            base_offset: old.header.base_offset + contents.end_position,
            base_sequence: contents.next_sequence,
            created_ms: shared.clock.now_ms(),
            prev_last_offset: writer.last_offset,
            prev_last_time_ms: writer.last_time_ms,
            rewrite_id: 0,
        };
        let segment = match create_segment(shared.storage.as_ref(), &shared.dir, header) {
            Ok(segment) => Arc::new(segment),
            Err(e) => {
                shared.poison(&e.to_string());
                return Err(e);
            }
        };
        shared
            .segments
            .write()
            .expect("segments lock")
            .push(segment.clone());
        writer.active = segment;
        writer.allocated_len = SEGMENT_HEADER_BYTES as u64;
        writer.preallocate = true;
        Ok(())
    }

    /// The sequence number a reader starting at `position` reads first.
    ///
    /// Positions before the oldest retained event start at the oldest; `Latest` and positions
    /// just past the newest event start with the next event appended. A sequence number or
    /// offset beyond that is an error.
    pub fn resolve(&self, position: &EventPosition) -> Result<i64, LogError> {
        let committed = self.committed();
        let begin = self.begin_sequence(&committed);
        match *position {
            EventPosition::Earliest => Ok(begin),
            EventPosition::Latest => Ok(committed.next_sequence),
            EventPosition::SequenceNumber {
                sequence_number,
                inclusive,
            } => {
                let first = if inclusive {
                    sequence_number
                } else {
                    sequence_number.saturating_add(1)
                };
                if first > committed.next_sequence {
                    return Err(LogError::SequenceNumberOutOfRange {
                        requested: sequence_number,
                        next: committed.next_sequence,
                    });
                }
                self.next_kept(first, &committed)
            }
            EventPosition::Offset { offset, inclusive } => {
                self.resolve_offset(&committed, offset, inclusive)
            }
            EventPosition::EnqueuedTime {
                enqueued_time_ms,
                inclusive,
            } => {
                let from = if inclusive {
                    enqueued_time_ms
                } else {
                    enqueued_time_ms.saturating_add(1)
                };
                self.resolve_time(&committed, from)
            }
        }
    }

    fn resolve_offset(
        &self,
        committed: &Committed,
        offset: u64,
        inclusive: bool,
    ) -> Result<i64, LogError> {
        if offset > committed.end_offset {
            return Err(LogError::OffsetOutOfRange {
                requested: offset,
                end: committed.end_offset,
            });
        }
        let segments = self.segments_snapshot();
        let first = &segments[0];
        if offset < first.header.base_offset {
            return Ok(self.begin_sequence(committed));
        }
        let i = segments.partition_point(|s| s.header.base_offset <= offset) - 1;
        for segment in &segments[i..] {
            let contents = segment.contents();
            let limit = limit_position(segment, &contents, committed);
            let start = contents.position_for_offset(offset);
            let found = scan_batches(segment, start, limit, |batch, bytes| {
                if batch.batch_offset + u64::from(batch.batch_len) <= offset {
                    return Ok(None);
                }
                let offsets = record_offsets(bytes, batch)?;
                Ok(offsets
                    .iter()
                    .position(|&o| if inclusive { o >= offset } else { o > offset })
                    .map(|i| batch.base_sequence + i as i64))
            })?;
            if let Some(seq) = found {
                return Ok(seq);
            }
        }
        Ok(committed.next_sequence)
    }

    fn resolve_time(&self, committed: &Committed, from_ms: i64) -> Result<i64, LogError> {
        for segment in self.segments_snapshot() {
            let contents = segment.contents();
            if contents.last_time_ms.is_none_or(|t| t < from_ms) {
                continue;
            }
            let limit = limit_position(&segment, &contents, committed);
            let start = contents.position_for_time(from_ms);
            let found = scan_batches(&segment, start, limit, |batch, _| {
                Ok((batch.enqueued_time_ms >= from_ms).then_some(batch.base_sequence))
            })?;
            if let Some(seq) = found {
                return Ok(seq.max(self.begin_sequence(committed)));
            }
        }
        Ok(committed.next_sequence)
    }

    /// Reads up to `max_events` committed events (and roughly at most `max_bytes` of batches,
    /// but always at least one event if one is available) from `cursor`, advancing it.
    ///
    /// Returns an empty vector when the cursor is at the end. Fails with
    /// [`LogError::Expired`] if retention has removed the cursor's next event.
    pub fn read(
        &self,
        cursor: &mut ReadCursor,
        max_events: usize,
        max_bytes: u64,
    ) -> Result<Vec<ReceivedEvent>, LogError> {
        if max_events == 0 || cursor.next_sequence >= self.committed().next_sequence {
            // Nothing to read: no allocation (a waiting receiver holds this empty vector).
            return Ok(Vec::new());
        }
        let mut records = RecordsRead::with_capacity(max_events.min(1024));
        self.read_into(cursor, max_events, max_bytes, &mut records)?;
        Ok(records.iter().map(|record| record.to_event()).collect())
    }

    /// [`PartitionLog::read`] into `into` (cleared first), each record kept as the log stores
    /// it and read in place ([`RecordsRead`]) rather than copied into an owned event. (`read`
    /// reads so too, then copies each record out.)
    pub fn read_records(
        &self,
        cursor: &mut ReadCursor,
        max_events: usize,
        max_bytes: u64,
        into: &mut RecordsRead,
    ) -> Result<(), LogError> {
        into.clear();
        if max_events == 0 {
            return Ok(());
        }
        self.read_into(cursor, max_events, max_bytes, into)
    }

    fn read_into(
        &self,
        cursor: &mut ReadCursor,
        max_events: usize,
        max_bytes: u64,
        out: &mut RecordsRead,
    ) -> Result<(), LogError> {
        let committed = self.committed();
        while out.is_empty() && cursor.next_sequence < committed.next_sequence {
            let (segment, next_base) =
                self.segment_for_sequence(cursor.next_sequence, &committed)?;
            let before = cursor.next_sequence;
            let (limit, start) = {
                let contents = segment.contents.read().expect("segment lock");
                let start = match cursor.hint {
                    Some(h)
                        if h.segment_id == segment.id
                            && h.batch_sequence <= cursor.next_sequence =>
                    {
                        h.position
                    }
                    _ => contents.position_for_sequence(&segment.header, cursor.next_sequence),
                };
                (limit_position(&segment, &contents, &committed), start)
            };
            let tail = &self.shared.tail;
            read_segment(
                &segment, tail, start, limit, cursor, max_events, max_bytes, out,
            )?;
            if out.is_empty() && cursor.next_sequence == before {
                // Nothing at or after the cursor in this segment: compaction removed the rest
                // of it. Go on at the next segment (or stop, at the end of the log).
                match next_base {
                    Some(base) if base > before => {
                        cursor.next_sequence = base;
                        cursor.hint = None;
                    }
                    _ => break,
                }
            }
        }
        Ok(())
    }

    /// The properties Event Hubs reports for the partition.
    pub fn properties(&self) -> PartitionProperties {
        let committed = self.committed();
        let begin = self.begin_sequence(&committed);
        PartitionProperties {
            begin_sequence_number: begin,
            last_enqueued_sequence_number: committed.next_sequence - 1,
            last_enqueued_offset: committed.last_offset,
            last_enqueued_time_ms: committed.last_enqueued_time_ms,
            is_empty: begin >= committed.next_sequence,
        }
    }

    /// Bytes of log retained on disk (segments' written lengths).
    pub fn retained_bytes(&self) -> u64 {
        self.segments_snapshot()
            .iter()
            .map(|s| s.contents.read().expect("segment lock").end_position)
            .sum()
    }

    /// Removes whole segments older than the retention age or beyond the retention size.
    /// When everything in the active segment has expired it is sealed first, so an idle
    /// partition empties too.
    ///
    /// A partition whose cleanup policy is [`crate::CleanupPolicy::Compact`] keeps everything
    /// compaction keeps: retention removes nothing there. While a compaction runs, retention
    /// does nothing (it never waits for one) and removes what it should the next time.
    pub fn enforce_retention(&self, retention: &Retention) -> Result<RetentionOutcome, LogError> {
        self.enforce_retention_keeping(retention, None)
    }

    /// [`PartitionLog::enforce_retention`], keeping (or counting) the events a capture has not
    /// written yet: a segment holding any of them is not removed while `uncaptured.hold`.
    pub fn enforce_retention_keeping(
        &self,
        retention: &Retention,
        uncaptured: Option<Uncaptured>,
    ) -> Result<RetentionOutcome, LogError> {
        if !self.cleanup().policy.deletes() {
            return Ok(RetentionOutcome::default());
        }
        let _maintenance = match self.shared.maintenance.try_lock() {
            Ok(guard) => guard,
            Err(std::sync::TryLockError::WouldBlock) => return Ok(RetentionOutcome::default()),
            Err(std::sync::TryLockError::Poisoned(e)) => panic!("maintenance lock: {e}"),
        };
        let mut writer = self.shared.writer.lock().expect("writer lock");
        let cutoff = retention
            .age_ms_max
            .map(|age| self.shared.clock.now_ms().saturating_sub(age.max(1)));
        let active = writer.active.contents();
        let committed = self.committed();
        let active_expired = cutoff.is_some_and(|c| active.last_time_ms.is_some_and(|t| t < c));
        // Only roll what readers already see, so a sealed segment never holds unsynced batches.
        if active_expired && committed.next_sequence == active.next_sequence {
            self.roll(&mut writer)?;
        }
        let mut outcome = RetentionOutcome::default();
        let removed = {
            let mut segments = self.shared.segments.write().expect("segments lock");
            expired_segments(&mut segments, retention, cutoff, uncaptured, &mut outcome)
        };
        drop(writer);
        for segment in removed {
            outcome.segments_removed += 1;
            outcome.bytes_removed += segment.contents().end_position;
            let index = index_path(&self.shared.dir, segment.header.base_offset);
            let storage = self.shared.storage.as_ref();
            storage
                .remove_file(&segment.path)
                .map_err(|e| LogError::io("remove", &segment.path, e))?;
            let _ = storage.remove_file(&index);
        }
        if outcome.segments_removed > 0 {
            sync_dir(self.shared.storage.as_ref(), &self.shared.dir)?;
        }
        Ok(outcome)
    }

    /// Seals the active segment if it holds events, everything in it is visible to readers,
    /// and it was started at least `age_ms` ago; returns whether it did. Compaction rewrites
    /// sealed segments only, so a compacted partition that is written slowly is sealed by age
    /// (as Kafka rolls a segment after `segment.ms`) for compaction to reach its newest events.
    pub fn seal_if_older(&self, age_ms: i64) -> Result<bool, LogError> {
        assert!(age_ms >= 0, "a segment age is not negative");
        let mut writer = self.shared.writer.lock().expect("writer lock");
        let active = writer.active.contents();
        let holds_events = active.next_sequence > writer.active.header.base_sequence;
        let started_ms = writer.active.header.created_ms;
        let old = self.shared.clock.now_ms().saturating_sub(started_ms) >= age_ms;
        // Only seal what readers already see, so a sealed segment never holds unsynced batches.
        let visible = self.committed().next_sequence == active.next_sequence;
        if !(holds_events && old && visible) {
            return Ok(false);
        }
        self.roll(&mut writer)?;
        assert!(writer.active.header.base_sequence == writer.next_sequence);
        Ok(true)
    }

    /// Syncs the active segment (whatever the durability mode), e.g. before a clean shutdown.
    /// A failure poisons the partition, as a failed sync of an append does.
    pub fn flush(&self) -> Result<(), LogError> {
        let writer = self.shared.writer.lock().expect("writer lock");
        writer.active.file.sync_data().map_err(|e| {
            let error = LogError::io("sync", &writer.active.path, e);
            self.shared.poison(&error.to_string());
            self.shared.cut_unacknowledged(&writer);
            error
        })
    }

    pub(crate) fn segments_snapshot(&self) -> Vec<Arc<Segment>> {
        self.shared.segments.read().expect("segments lock").clone()
    }

    /// The sequence number of the oldest retained event (the next one appended if there is
    /// none): the first segment's base, or past it where compaction removed events.
    fn begin_sequence(&self, committed: &Committed) -> i64 {
        let segments = self.shared.segments.read().expect("segments lock");
        let first = segments
            .iter()
            .find_map(|s| {
                if s.header.is_compacted() {
                    s.contents.read().expect("segment lock").first_sequence
                } else {
                    Some(s.header.base_sequence)
                }
            })
            .unwrap_or(committed.next_sequence);
        first.min(committed.next_sequence)
    }

    /// The sequence number of the first event at or after `seq` that is still in the log
    /// (past the gaps compaction left), or the next one to be appended.
    fn next_kept(&self, seq: i64, committed: &Committed) -> Result<i64, LogError> {
        let segments = self.segments_snapshot();
        let mut seq = seq.max(segments[0].header.base_sequence);
        let i = segments.partition_point(|s| s.header.base_sequence <= seq) - 1;
        for (j, segment) in segments.iter().enumerate().skip(i) {
            if !segment.header.is_compacted() {
                return Ok(seq
                    .max(segment.header.base_sequence)
                    .min(committed.next_sequence));
            }
            let contents = segment.contents();
            if contents.next_sequence > seq {
                let start = contents.position_for_sequence(&segment.header, seq);
                let limit = limit_position(segment, &contents, committed);
                let found = scan_batches(segment, start, limit, |batch, _| {
                    Ok((batch.next_sequence() > seq).then_some(batch.base_sequence))
                })?;
                if let Some(base) = found {
                    return Ok(base.max(seq));
                }
            }
            seq = segments
                .get(j + 1)
                .map_or(committed.next_sequence, |next| next.header.base_sequence);
        }
        Ok(seq.min(committed.next_sequence))
    }

    /// The segment a read of `seq` starts in, and the base sequence of the segment after it.
    fn segment_for_sequence(
        &self,
        seq: i64,
        committed: &Committed,
    ) -> Result<(Arc<Segment>, Option<i64>), LogError> {
        let segments = self.shared.segments.read().expect("segments lock");
        let begin = segments[0].header.base_sequence;
        if seq < begin {
            return Err(LogError::Expired {
                requested: seq,
                begin: begin.min(committed.next_sequence),
            });
        }
        let i = segments.partition_point(|s| s.header.base_sequence <= seq) - 1;
        // An empty segment shares its base sequence with the next one; read the later.
        let next_base = segments.get(i + 1).map(|s| s.header.base_sequence);
        Ok((segments[i].clone(), next_base))
    }
}

/// The file position readers may read up to in `segment`.
fn limit_position(segment: &Segment, contents: &SegmentContents, committed: &Committed) -> u64 {
    let committed_local = committed
        .end_offset
        .saturating_sub(segment.header.base_offset);
    contents.end_position.min(committed_local)
}

/// Bytes of a segment read at once: a stretch of its file, or a batch kept in memory as
/// written (see `crate::tail`).
#[derive(Debug, Clone, Default)]
struct Chunk {
    /// The file position of its first byte.
    start: u64,
    bytes: Bytes,
    /// Whether it is a kept batch, whose checksum is not computed again: its bytes never came
    /// from the disk.
    kept: bool,
}

impl Chunk {
    fn end(&self) -> u64 {
        self.start + self.bytes.len() as u64
    }
}

/// Reads batches from `start` to `limit` in one segment into `out`, advancing `cursor`.
#[allow(clippy::too_many_arguments)]
fn read_segment(
    segment: &Segment,
    tail: &TailCache,
    start: u64,
    limit: u64,
    cursor: &mut ReadCursor,
    max_events: usize,
    max_bytes: u64,
    out: &mut RecordsRead,
) -> Result<(), LogError> {
    let mut position = start;
    let mut bytes_read = 0u64;
    let mut chunk = take_read_ahead(cursor, segment, position);
    while position < limit && out.len() < max_events && (out.is_empty() || bytes_read < max_bytes) {
        // Each read of the file starts at a batch: where the bytes read end inside a batch's
        // header or body, the next read starts again at that batch, so the batches of a call
        // come from at most a few reads, whose buffers `ReadBuffers` can take back.
        let room = max_bytes.saturating_sub(bytes_read);
        if position + BATCH_HEADER_BYTES as u64 > chunk.end() {
            chunk = chunk_at(
                tail,
                cursor,
                segment,
                position,
                limit,
                room,
                BATCH_HEADER_BYTES as u64,
            )?;
        }
        let at = (position - chunk.start) as usize;
        let header = BatchHeader::decode(&chunk.bytes[at..])
            .map_err(|e| LogError::corrupted(&segment.path, position, e))?;
        let len = u64::from(header.batch_len);
        if position + len > limit {
            return Err(LogError::corrupted(
                &segment.path,
                position,
                "batch runs past the committed end",
            ));
        }
        if position + len > chunk.end() {
            chunk = chunk_at(tail, cursor, segment, position, limit, room, len)?;
        }
        let at = (position - chunk.start) as usize;
        let batch = chunk.bytes.slice(at..at + len as usize);
        if !chunk.kept {
            verify_checksum(&batch, &header)
                .map_err(|e| LogError::corrupted(&segment.path, position, e))?;
        }
        if header.next_sequence() <= cursor.next_sequence {
            // A batch before the cursor (the index entry lies before it): step over it.
            position += len;
            continue;
        }
        out.take_batch(&batch, &header, cursor.next_sequence, max_events)
            .map_err(|e| LogError::corrupted(&segment.path, position, e))?;
        bytes_read += len;
        let done_with_batch = out
            .last_sequence()
            .is_none_or(|last| last + 1 == header.next_sequence());
        if done_with_batch {
            cursor.next_sequence = header.next_sequence();
            position += len;
            cursor.hint = Some(ReadHint {
                segment_id: segment.id,
                position,
                batch_sequence: cursor.next_sequence,
            });
        } else {
            let last = out.last_sequence().expect("events were read");
            cursor.next_sequence = last + 1;
            cursor.hint = Some(ReadHint {
                segment_id: segment.id,
                position,
                batch_sequence: header.base_sequence,
            });
            break;
        }
    }
    if position < chunk.end() {
        cursor.read_ahead = Some((segment.id, chunk));
    }
    Ok(())
}

/// The bytes at `position` of `segment` on, at least `at_least` of them: the batch kept there
/// in memory, if it is, else what [`read_chunk`] reads of the file. A read of the file ends
/// where its chunk does, usually inside a batch; looking the batch there up among the kept
/// ones first lets a reader that read the file go back to the kept batches once it reaches
/// them.
fn chunk_at(
    tail: &TailCache,
    cursor: &mut ReadCursor,
    segment: &Segment,
    position: u64,
    limit: u64,
    room: u64,
    at_least: u64,
) -> Result<Chunk, LogError> {
    if let Some(batch) = tail
        .batch_at(segment.id, position)
        .filter(|batch| batch.len() as u64 >= at_least)
    {
        return Ok(Chunk {
            start: position,
            bytes: batch,
            kept: true,
        });
    }
    let bytes = read_chunk(cursor, segment, position, limit, room, at_least)?;
    Ok(Chunk {
        start: position,
        bytes,
        kept: false,
    })
}

/// The cursor's read-ahead bytes, if they cover `position` in `segment`; else an empty chunk
/// there.
fn take_read_ahead(cursor: &mut ReadCursor, segment: &Segment, position: u64) -> Chunk {
    match cursor.read_ahead.take() {
        Some((id, chunk))
            if id == segment.id && chunk.start <= position && position < chunk.end() =>
        {
            chunk
        }
        _ => Chunk {
            start: position,
            ..Chunk::default()
        },
    }
}

/// Reads the file from `position` on: what the cursor's read chunk asks for, no more than
/// `room` (the bytes the caller still wants; at least 64 KiB) and at least `at_least`, up to
/// `limit`.
fn read_chunk(
    cursor: &mut ReadCursor,
    segment: &Segment,
    position: u64,
    limit: u64,
    room: u64,
    at_least: u64,
) -> Result<Bytes, LogError> {
    let want = cursor
        .read_chunk
        .take()
        .min(room.max(1 << 16))
        .max(at_least);
    read_at(
        &mut cursor.buffers,
        segment,
        position,
        want.min(limit - position),
    )
}

/// Reads `[position, position + len)` into one of `buffers`' memory and hands it out as `Bytes`.
fn read_at(
    buffers: &mut ReadBuffers,
    segment: &Segment,
    position: u64,
    len: u64,
) -> Result<Bytes, LogError> {
    let len = usize::try_from(len).expect("reads are bounded by the batch size limit");
    let buf = buffers.with_room(len);
    debug_assert!(buf.is_empty(), "split hands out every byte read");
    segment
        .file
        .read_exact_appending(buf, len, position)
        .map_err(|e| LogError::io("read", &segment.path, e))?;
    Ok(buf.split().freeze())
}

/// Visits verified batches from `start` up to `limit` until `visit` returns a value.
pub(crate) fn scan_batches<T>(
    segment: &Segment,
    start: u64,
    limit: u64,
    mut visit: impl FnMut(&BatchHeader, &[u8]) -> Result<Option<T>, crate::record::DecodeError>,
) -> Result<Option<T>, LogError> {
    let mut reader = ChunkReader::new(segment.file.as_ref(), &segment.path, limit);
    let mut position = start;
    while position < limit {
        let corrupt = |e| LogError::corrupted(&segment.path, position, e);
        let head = reader.get(position, BATCH_HEADER_BYTES)?.ok_or_else(|| {
            corrupt(crate::record::DecodeError::Truncated {
                field: "batch header",
                needed: BATCH_HEADER_BYTES as u64,
                left: limit - position,
            })
        })?;
        let header = BatchHeader::decode(head).map_err(corrupt)?;
        let bytes = reader
            .get(position, header.batch_len as usize)?
            .ok_or_else(|| {
                LogError::corrupted(&segment.path, position, "batch runs past the committed end")
            })?;
        verify_checksum(bytes, &header)
            .map_err(|e| LogError::corrupted(&segment.path, position, e))?;
        if let Some(found) =
            visit(&header, bytes).map_err(|e| LogError::corrupted(&segment.path, position, e))?
        {
            return Ok(Some(found));
        }
        position += u64::from(header.batch_len);
    }
    Ok(None)
}

/// The offset and time of the newest event in the partition, looking back past empty segments
/// to the facts a segment header carries about its predecessors.
fn last_event(segments: &[Arc<Segment>]) -> (Option<u64>, Option<i64>) {
    for segment in segments.iter().rev() {
        let contents = segment.contents();
        if contents.last_offset.is_some() {
            return (contents.last_offset, contents.last_time_ms);
        }
        if segment.header.prev_last_offset.is_some() {
            return (
                segment.header.prev_last_offset,
                segment.header.prev_last_time_ms,
            );
        }
    }
    (None, None)
}

/// A key `event`'s properties repeat, if any: compared pairwise, without allocating, for the
/// usual handful of properties; sorted beyond [`PAIRWISE_KEY_CHECK_MAX`].
fn duplicate_property_key(event: &EventData) -> Option<&str> {
    let props = &event.properties;
    if props.len() <= PAIRWISE_KEY_CHECK_MAX {
        return props.iter().enumerate().find_map(|(i, (key, _))| {
            props[..i]
                .iter()
                .any(|(earlier, _)| earlier == key)
                .then_some(key.as_str())
        });
    }
    let mut keys: Vec<&str> = props.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    keys.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// Creates a new segment file with its header, synced along with its directory entry.
pub(crate) fn create_segment(
    storage: &dyn Storage,
    dir: &Path,
    header: SegmentHeader,
) -> Result<Segment, LogError> {
    let path = segment_path(dir, header.base_offset);
    let file = storage
        .open(&path, OpenMode::CreateNew)
        .map_err(|e| LogError::io("create segment", &path, e))?;
    file.write_all_at(&header.encode(), 0)
        .and_then(|()| file.sync_all())
        .map_err(|e| LogError::io("write segment header", &path, e))?;
    sync_dir(storage, dir)?;
    Ok(Segment {
        id: next_segment_id(),
        path,
        file,
        contents: RwLock::new(SegmentContents::empty(&header)),
        header,
    })
}

fn lock_directory(
    storage: &dyn Storage,
    dir: &Path,
) -> Result<Box<dyn std::fmt::Debug + Send + Sync>, LogError> {
    let path = dir.join("LOCK");
    storage.lock_file(&path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            LogError::io("lock", dir, e)
        } else {
            LogError::io("lock", &path, e)
        }
    })
}

/// Takes the oldest segments out of `segments` while they are older than `cutoff` or the
/// partition is larger than the retention size (never the last, active one), keeping one that
/// holds events not yet captured while `uncaptured.hold` (and counting such events otherwise).
fn expired_segments(
    segments: &mut Vec<Arc<Segment>>,
    retention: &Retention,
    cutoff: Option<i64>,
    uncaptured: Option<Uncaptured>,
    outcome: &mut RetentionOutcome,
) -> Vec<Arc<Segment>> {
    let mut total: u64 = segments.iter().map(|s| s.contents().end_position).sum();
    let mut removed = Vec::new();
    while segments.len() > 1 {
        let oldest = segments[0].contents();
        let too_old = cutoff.is_some_and(|c| oldest.last_time_ms.is_none_or(|t| t < c));
        let too_big = retention.bytes_max.is_some_and(|max| total > max);
        if !too_old && !too_big {
            break;
        }
        if let Some(u) = uncaptured.filter(|u| oldest.next_sequence > u.from_sequence) {
            if u.hold {
                outcome.held_for_uncaptured = true;
                break;
            }
            let first = oldest.first_sequence.unwrap_or(oldest.next_sequence);
            let skipped = oldest.next_sequence - first.max(u.from_sequence);
            outcome.uncaptured_events_removed += u64::try_from(skipped).unwrap_or(0);
        }
        total -= oldest.end_position;
        removed.push(segments.remove(0));
    }
    removed
}

#[cfg(test)]
mod tests {
    use tributary_event::{ManualClock, PropertyValue};

    use super::*;

    const T0: i64 = 1_700_000_000_000;

    /// An event with a property every event repeats and one that changes.
    fn stamped(i: usize) -> EventData {
        let origin = "5f0c7a52-2b7e-4b7c-9d43-6f1b3c2a9e10";
        EventData::new(format!("event {i} {:.<100}", ""))
            .with_property("repl-origin", PropertyValue::String(origin.into()))
            .with_property("repl-sequence", PropertyValue::String(i.to_string().into()))
    }

    /// The segment files of `dir`, by base offset: each one's version and whether each of its
    /// batches may refer to the record before.
    fn segments(dir: &Path) -> Vec<(u32, Vec<bool>)> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("the partition directory")
            .map(|entry| entry.expect("an entry").path())
            .filter(|path| path.extension().is_some_and(|e| e == "log"))
            .collect();
        paths.sort();
        paths
            .iter()
            .map(|path| {
                let bytes = std::fs::read(path).expect("a segment file");
                let header = SegmentHeader::decode(&bytes, path).expect("a segment header");
                let mut at = SEGMENT_HEADER_BYTES;
                let mut flags = Vec::new();
                while bytes.len() >= at + BATCH_HEADER_BYTES && bytes[at..at + 4] != [0; 4] {
                    let batch = BatchHeader::decode(&bytes[at..]).expect("a batch header");
                    flags.push(batch.property_refs);
                    at += batch.batch_len as usize;
                }
                (header.version, flags)
            })
            .collect()
    }

    /// A log written before segments had version 2 is appended to as it was (a build that
    /// reads only version 1 can still read it all); the segments it rolls to are version 2.
    #[test]
    fn a_version_1_segment_is_appended_to_without_references_and_the_next_with_them() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let v1 = SegmentHeader {
            version: 1,
            base_offset: 0,
            base_sequence: 0,
            created_ms: T0,
            prev_last_offset: None,
            prev_last_time_ms: None,
            rewrite_id: 0,
        };
        create_segment(&OsStorage, dir.path(), v1).expect("a version 1 segment");
        let config = LogConfig {
            durability: Durability::None,
            segment_bytes_max: 4096,
            ..LogConfig::default()
        };
        let clock = Arc::new(ManualClock::new(T0));
        let log = PartitionLog::open(dir.path(), config, GroupCommitter::start(), clock)
            .expect("the log opens");
        let mut appended = Vec::new();
        for round in 0..12 {
            let events: Vec<EventData> = (0..4).map(|i| stamped(round * 4 + i)).collect();
            log.append(&events).expect("appended");
            appended.extend(events);
        }

        let found = segments(dir.path());
        assert!(found.len() >= 2, "the log rolled: {found:?}");
        let (version, flags) = &found[0];
        assert_eq!(*version, 1);
        assert!(flags.iter().all(|refers| !refers), "{found:?}");
        for (version, flags) in &found[1..] {
            assert_eq!(*version, SEGMENT_VERSION);
            assert!(flags.iter().all(|refers| *refers), "{found:?}");
        }
        let mut cursor = ReadCursor::new(0);
        let mut read = Vec::new();
        loop {
            let events = log.read(&mut cursor, 5, 1 << 20).expect("read");
            if events.is_empty() {
                break;
            }
            read.extend(events.into_iter().map(|e| e.data));
        }
        assert_eq!(read, appended);
    }

    /// A log in a temporary directory (removed when the first is dropped), durability `none`.
    fn log_without_syncs() -> (tempfile::TempDir, PartitionLog) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = LogConfig {
            durability: Durability::None,
            ..LogConfig::default()
        };
        let clock = Arc::new(ManualClock::new(T0));
        let log = PartitionLog::open(dir.path(), config, GroupCommitter::start(), clock)
            .expect("the log opens");
        (dir, log)
    }

    /// A reader at the end allocates nothing while it waits, and one that gives its buffers
    /// back reads on from where it was.
    #[test]
    fn a_reader_at_the_end_holds_no_memory_and_reads_on_after_releasing_its_buffers() {
        let (_dir, log) = log_without_syncs();
        let mut cursor = ReadCursor::new(0);
        assert_eq!(
            log.read(&mut cursor, 300, 1 << 20)
                .expect("read")
                .capacity(),
            0
        );
        log.append(&[stamped(0), stamped(1)]).expect("appended");
        assert_eq!(log.read(&mut cursor, 1, 1 << 20).expect("read").len(), 1);
        assert!(cursor.holds_buffers());
        cursor.release_buffers();
        assert!(!cursor.holds_buffers());
        let rest = log.read(&mut cursor, 300, 1 << 20).expect("read");
        assert_eq!(
            rest.iter().map(|e| e.sequence_number).collect::<Vec<_>>(),
            [1]
        );
        assert_eq!(
            log.read(&mut cursor, 300, 1 << 20)
                .expect("read")
                .capacity(),
            0
        );
    }

    /// A reader that drops each read's events before the read after next (a capture, a
    /// receiver) reads into memory it already has: a few allocations while its reads grow to
    /// full size, then none, however many reads follow and wherever they end inside a batch.
    #[test]
    fn a_reader_that_drops_its_events_reads_into_the_memory_it_has() {
        let (_dir, log) = log_without_syncs();
        let body = |i: usize| format!("{i:08}{:.<1000}", "");
        const BATCHES: usize = 1_600;
        const BATCH_EVENTS: usize = 10;
        for batch in 0..BATCHES {
            let events: Vec<EventData> = (0..BATCH_EVENTS)
                .map(|i| EventData::new(body(batch * BATCH_EVENTS + i)))
                .collect();
            log.append(&events).expect("appended");
        }

        let mut cursor = ReadCursor::new(0);
        let (mut next, mut reads) = (0, 0);
        loop {
            // 333 events end most reads inside a batch, so the next starts in its read-ahead.
            let events = log.read(&mut cursor, 333, 1 << 20).expect("read");
            if events.is_empty() {
                break;
            }
            for event in &events {
                assert_eq!(event.sequence_number, next as i64);
                assert_eq!(event.data.body, body(next).as_bytes());
                next += 1;
            }
            reads += 1;
        }
        assert_eq!(next, BATCHES * BATCH_EVENTS);
        assert!(reads > 40, "{reads} reads");
        let fresh = cursor.buffers.fresh_allocations;
        assert!(fresh <= 5, "{fresh} allocations for {reads} reads of 16 MB");
    }

    /// Flips the last committed byte (the last batch's last body) in the file of the log's
    /// only segment, behind the log's back.
    fn damage_last_byte(dir: &Path, log: &PartitionLog) {
        let segment = std::fs::read_dir(dir)
            .expect("the log's directory")
            .map(|e| e.expect("an entry").path())
            .find(|p| p.extension().is_some_and(|x| x == "log"))
            .expect("a segment file");
        let end = log.committed().end_offset;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&segment)
            .expect("opens");
        std::os::unix::fs::FileExt::write_all_at(&file, b"X", end - 1).expect("damaged");
    }

    /// While a reader follows the end, the batches appended since are read from memory as
    /// written: damage to the file under them goes unseen (the file is not read there) until
    /// the follower is gone, when a read of them finds it.
    #[test]
    fn a_follower_reads_the_batches_appended_since_from_memory() {
        let (dir, log) = log_without_syncs();
        let batch = |from: usize| -> Vec<EventData> {
            (from..from + 10)
                .map(|i| EventData::new(format!("event {i:04}")))
                .collect()
        };
        let read_on = |log: &PartitionLog, cursor: &mut ReadCursor| {
            let mut records = RecordsRead::new();
            let mut bodies = Vec::new();
            loop {
                log.read_records(cursor, 7, 1 << 20, &mut records)?;
                if records.is_empty() {
                    return Ok::<_, LogError>(bodies);
                }
                bodies.extend(records.iter().map(|r| r.body().to_vec()));
            }
        };
        let bodies = |range: std::ops::Range<usize>| -> Vec<Vec<u8>> {
            range
                .map(|i| format!("event {i:04}").into_bytes())
                .collect()
        };
        log.append(&batch(0)).expect("appended");
        let mut follower_cursor = ReadCursor::new(0);
        assert_eq!(
            read_on(&log, &mut follower_cursor).expect("read"),
            bodies(0..10)
        );

        let follower = log.follow_tail();
        log.append(&batch(10)).expect("appended");
        log.append(&batch(20)).expect("appended");
        damage_last_byte(dir.path(), &log);
        assert_eq!(
            read_on(&log, &mut follower_cursor).expect("read from memory"),
            bodies(10..30)
        );

        drop(follower);
        assert!(
            matches!(
                read_on(&log, &mut ReadCursor::new(10)),
                Err(LogError::Corrupted { .. })
            ),
            "read from the file, the damage is found"
        );
    }

    /// A reader whose read of the file ends inside a kept batch (a chunk's end rarely falls
    /// between batches) takes that batch and the ones after it from memory: it does not stay
    /// on the file until it catches up with the end.
    #[test]
    fn a_read_of_the_file_goes_on_in_the_kept_batches() {
        let (dir, log) = log_without_syncs();
        let body = |i: usize| format!("{i:04}").repeat(750).into_bytes();
        let batch = |from: usize| -> Vec<EventData> {
            (from..from + 10).map(|i| EventData::new(body(i))).collect()
        };
        // About 30 KiB a batch: the first read of the file (64 KiB, what the reads below ask
        // for) holds the batch written before the follower came and part of the next.
        log.append(&batch(0)).expect("appended");
        let _follower = log.follow_tail();
        for from in [10, 20, 30, 40] {
            log.append(&batch(from)).expect("appended");
        }
        damage_last_byte(dir.path(), &log);

        let mut cursor = ReadCursor::new(0);
        let mut records = RecordsRead::new();
        let mut bodies = Vec::new();
        loop {
            log.read_records(&mut cursor, 1_000, 64 * 1024, &mut records)
                .expect("the damaged batch is read from memory, not the file");
            if records.is_empty() {
                break;
            }
            bodies.extend(records.iter().map(|r| r.body().to_vec()));
        }
        assert_eq!(bodies, (0..50).map(body).collect::<Vec<_>>());
    }

    /// A read that starts in the read-ahead of the read before and fills two chunks after it
    /// (now and then a capture's: see [`READ_BUFFERS_MAX`]) holds three buffers at once: the reader allocates
    /// each once, then reuses them, and never holds more than [`READ_BUFFERS_MAX`].
    #[test]
    fn reads_that_hold_three_buffers_at_once_reuse_them() {
        const CHUNK: usize = READ_CHUNK_BYTES as usize;
        let mut buffers = ReadBuffers::default();
        let fill = |buffers: &mut ReadBuffers| {
            let buf = buffers.with_room(CHUNK);
            buf.resize(CHUNK, 0);
            buf.split().freeze()
        };
        // What the last read left as read-ahead, then a read of two chunks after it, whose
        // events hold all three until the next read; a read of one chunk in between.
        let mut read_ahead = fill(&mut buffers);
        for read in 0..100 {
            let chunks = if read % 3 == 0 { 1 } else { 2 };
            let held: Vec<Bytes> = (0..chunks).map(|_| fill(&mut buffers)).collect();
            read_ahead = held.last().expect("a chunk read").clone();
            drop(held);
            assert!(buffers.buffers.len() <= READ_BUFFERS_MAX);
        }
        drop(read_ahead);
        assert_eq!(
            buffers.fresh_allocations, 3,
            "three buffers, each allocated once"
        );
    }
}
