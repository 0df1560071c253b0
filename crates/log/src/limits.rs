//! Every limit of the log in one place, each with its reason.

/// The largest event (its encoded record) accepted by default: 1 MiB, the Event Hubs limit for
/// an event or a batch.
pub const EVENT_BYTES_MAX_DEFAULT: u32 = 1024 * 1024;

/// The largest event any configuration may allow. 16 MiB keeps a whole batch in one read buffer
/// and far below the 4 GiB a `u32` segment position can address.
pub const EVENT_BYTES_MAX_LIMIT: u32 = 16 * 1024 * 1024;

/// The largest batch accepted in one append: 64 MiB. A batch is written with one `pwrite`, held
/// in memory while it is encoded, and must fit in one segment beyond its soft size limit.
pub const BATCH_BYTES_MAX: u32 = 64 * 1024 * 1024;

/// Default segment size: 128 MiB. Retention removes whole segments, so smaller segments free
/// space sooner; recovery rescans only the active segment, so this also bounds recovery work
/// (128 MiB at 400 MB/s cold is about 0.3 s).
pub const SEGMENT_BYTES_MAX_DEFAULT: u64 = 128 * 1024 * 1024;

/// Segment positions are `u32`s in the index, so a segment (its soft limit plus one batch) must
/// stay below 4 GiB.
pub const SEGMENT_BYTES_MAX_LIMIT: u64 = 2 * 1024 * 1024 * 1024;

/// The smallest segment size a configuration may ask for (tests use small segments to exercise
/// rolling).
pub const SEGMENT_BYTES_MAX_MIN: u64 = 4 * 1024;

/// Default distance between sparse index entries: 64 KiB. A lookup reads at most this much past
/// the entry it lands on; 5 GiB of log costs 80 Ki entries (1.3 MB) of index.
pub const INDEX_INTERVAL_BYTES_DEFAULT: u32 = 64 * 1024;

/// How much a reader asks the file for at once: big enough to amortise the system call over
/// many small events, small enough to keep a reader's memory bounded.
pub const READ_CHUNK_BYTES: u32 = 1024 * 1024;

/// How many read buffers (of up to a chunk each) a reader keeps between reads (see
/// `ReadCursor`). A read starts in the read-ahead the read before left and may fill two chunks
/// after it: a capture's read (1,024 events of about 1 KiB) is a little less than a chunk, but
/// a batch cut off at a chunk's end is read again at the start of the next chunk, so now and
/// then a read needs a second one while the read-ahead and the first are held.
pub const READ_BUFFERS_MAX: usize = 3;

/// The most bytes of its newest batches a partition keeps in memory while a reader follows
/// its end (`crate::TailFollower`): at 100 MB/s of ingest, the last third of a second. A
/// follower further behind reads the file.
pub const TAIL_BYTES_MAX: usize = 32 * 1024 * 1024;

/// How many bytes of buffers of batches no longer kept a followed partition holds for its next
/// batches (`crate::TailFollower`): the appender takes one per batch and the batches dropped
/// give one back each, so a few suffice; more absorb a follower's read holding many batches
/// at once (a capture's holds 1,024 events at most).
pub const TAIL_SPARE_BYTES_MAX: usize = 8 * 1024 * 1024;

/// A reader's first read asks for this much (or one whole batch, if larger); each further read
/// asks for twice the last, up to [`READ_CHUNK_BYTES`]. A reader that goes on reads ahead in
/// large chunks after a few reads; one that wants a single event where the page cache holds
/// nothing (a consumer starting deep in a cold log, a lookup by offset or time) waits for a
/// few hundred kilobytes from the disk, not a mebibyte each for the lookup and the read.
pub const READ_CHUNK_FIRST_BYTES: u32 = 256 * 1024;

/// The most a thread's encode buffer keeps between batches: the buffer of a larger batch is
/// freed after its write, so a rare large batch does not stay as memory.
pub const ENCODE_BUF_KEPT_BYTES: usize = 4 * 1024 * 1024;

/// Preallocation grows the active segment in steps between these sizes (doubling with the
/// segment's size), so `fdatasync` rarely has to persist a size change and an idle partition
/// costs only 1 MiB of disk.
pub const PREALLOCATE_BYTES_MIN: u64 = 1024 * 1024;
/// See [`PREALLOCATE_BYTES_MIN`].
pub const PREALLOCATE_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// Threads that run the partitions' sync chains (group commit). `fdatasync` waits on the
/// device, not the CPU, so threads are cheap; eight lets eight partitions sync at once, and the
/// chains of more partitions take turns, one sync each.
pub const SYNC_THREADS: usize = 8;

/// Compaction's key index costs at most this much per distinct key: a 16-byte key digest and an
/// 8-byte sequence number in a hash table that is at worst 7/16 full (just after it doubles),
/// with one control byte per slot: (16 + 8 + 1) × 16 / 7 ≈ 57 bytes.
pub const COMPACTION_KEY_INDEX_BYTES_PER_KEY: u64 = 64;

/// Default memory for one partition's compaction key index: 64 MiB, a million distinct keys
/// per pass; more keys than that are compacted in passes.
pub const COMPACTION_KEY_INDEX_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;

/// The smallest key index budget a configuration may ask for (tests use small ones to exercise
/// compaction in passes): 16 keys.
pub const COMPACTION_KEY_INDEX_BYTES_MIN: u64 = 16 * COMPACTION_KEY_INDEX_BYTES_PER_KEY;

/// Tombstones are kept for a day by default, as Kafka's `delete.retention.ms`.
pub const TOMBSTONE_RETENTION_MS_DEFAULT: i64 = 24 * 60 * 60 * 1000;

/// Compaction writes its output in pieces of this size: large enough to amortise the system
/// call, small enough to bound the memory of a run.
pub const COMPACTION_WRITE_BYTES: usize = 4 * 1024 * 1024;

const _: () = assert!(EVENT_BYTES_MAX_DEFAULT <= EVENT_BYTES_MAX_LIMIT);
const _: () = assert!(COMPACTION_KEY_INDEX_BYTES_MIN <= COMPACTION_KEY_INDEX_BYTES_DEFAULT);
const _: () = assert!(EVENT_BYTES_MAX_LIMIT < BATCH_BYTES_MAX);
const _: () = assert!(SEGMENT_BYTES_MAX_LIMIT + BATCH_BYTES_MAX as u64 <= u32::MAX as u64);
const _: () = assert!(SEGMENT_BYTES_MAX_DEFAULT <= SEGMENT_BYTES_MAX_LIMIT);
const _: () = assert!(READ_CHUNK_BYTES >= EVENT_BYTES_MAX_DEFAULT);
const _: () = assert!(READ_CHUNK_FIRST_BYTES <= READ_CHUNK_BYTES);
const _: () = assert!(PREALLOCATE_BYTES_MIN <= PREALLOCATE_BYTES_MAX);
