//! The partition log: where Tributary keeps events.
//!
//! A [`PartitionLog`] is one partition of an event hub: an append-only sequence of batches in
//! segment files. It assigns each event its system properties — a sequence number dense from 0,
//! an offset that is the event's byte position (growing, not dense), an enqueued time that never
//! decreases — and finds events again by any of the three through a sparse index, without
//! scanning the partition. The properties never change once assigned; compaction removes
//! events but never renumbers or moves the ones it keeps.
//!
//! # Reading
//! [`PartitionLog::read`] returns owned events; [`PartitionLog::read_records`] keeps the
//! records as stored and reads each field in place ([`RecordsRead`], [`RecordView`]), for a
//! reader that only passes events on. Both check every batch's CRC32C and every record whole
//! before handing anything out. While a [`TailFollower`] lives ([`PartitionLog::follow_tail`]:
//! a capture), the partition keeps its newest batches in memory as written, and reads take
//! them from there rather than the file (and need not check their CRC32C again).
//!
//! # Durability
//! [`Durability::Fsync`] (the default) acknowledges an append only after `fdatasync` has covered
//! it. One [`GroupCommitter`] serves every partition of a data directory: each partition has at
//! most one sync in flight, and the appends that wait on it share the next. `Interval` and `None` acknowledge on write. Readers see
//! only acknowledged events, so no reader ever sees an event a crash could take back.
//! [`GroupCommitter::sync_times`] tells how long the syncs took and how long appends waited for
//! them: the disk's share of every acknowledgement.
//!
//! # Recovery
//! [`PartitionLog::open`] verifies what is on disk: every batch carries a CRC32C, and the scan of
//! the active segment stops at the first torn or corrupt batch and cuts the tail off. Every
//! acknowledged batch survives; damage to a sealed segment is reported, never hidden.
//!
//! # Cleanup: retention and compaction
//! A partition's [`Cleanup`] policy ([`CleanupPolicy`]: `Delete`, the default; `Compact`;
//! `DeleteOrCompact`) decides what goes. Deleting removes whole segments by age and size
//! ([`PartitionLog::enforce_retention`]). Compacting ([`PartitionLog::compact`], run by the
//! caller on a thread that may block) keeps the latest event of each partition key in the
//! sealed segments older than the minimum compaction lag, and removes tombstones (a key and an
//! empty body) once older than the tombstone retention; a compacting partition refuses events
//! without a partition key ([`LogError::MissingPartitionKey`], nothing written). What it
//! guarantees:
//! - kept events keep their sequence number, offset and enqueued time; readers see gaps, and
//!   every position in a gap (a sequence number or offset of a removed event, an offset between
//!   two kept events, `Earliest`) resolves to the next kept event;
//! - [`PartitionProperties`] keep reporting the true last sequence number and offset;
//! - appends never wait for it, and readers go on reading what they started;
//! - a crash at any point leaves each segment either as it was or as compacted (neighbouring
//!   small segments are merged into one, all or nothing), never loses the latest event of a
//!   key, and never brings back a key whose tombstone was still kept;
//! - its key index takes at most 64 bytes per key, and a configured budget in all: beyond it,
//!   compaction works in passes.
//!
//! [`PartitionLog::compaction_state`] tells the dirty ratio (bytes compaction has not seen over
//! all) and the last run's [`CompactionOutcome`], for metrics.
//!
//! # Faults below the log
//! Every file operation goes through the [`storage::Storage`] seam ([`storage::OsStorage`], the
//! file system, by default). A failed `fdatasync` poisons the partition: the appends it covered
//! and every append waiting behind it fail (never an acknowledgement on a file whose state is
//! unknown), later appends are refused with [`LogError::Poisoned`], and reopening — recovery —
//! clears it. A failed write (a full disk, a short write) refuses its batch, logged at `warn`,
//! and leaves the end of the log where it was. With the `fault-injection` feature, `faults`
//! provides an in-memory storage that injects these faults from a seed and simulates crashes;
//! `tests/faults.rs` drives it.
//!
//! # What it delegates
//! Nothing here is async or knows about networks: the broker wraps appends in futures through
//! [`PartitionLog::append_with`]'s completion and wakes readers through the commit listener.
//! The byte layout is in `docs/design.md`.

mod checksum;
mod commit;
mod compaction;
mod config;
mod error;
#[cfg(feature = "fault-injection")]
pub mod faults;
#[doc(hidden)]
pub mod fuzzing;
pub mod limits;
mod partition;
mod record;
mod records;
mod recovery;
mod segment;
pub mod storage;
mod swap;
mod sync_times;
mod tail;

pub use commit::GroupCommitter;
pub use compaction::{CompactionOutcome, CompactionState};
pub use config::{Cleanup, CleanupPolicy, Durability, LogConfig, Retention, SyncScope};
pub use error::{DecodeErrorOrText, LogError};
pub use partition::{
    AppendCompletion, AppendReceipt, Committed, PartitionLog, PartitionProperties, ReadCursor,
    RetentionOutcome, Uncaptured,
};
pub use record::DecodeError;
pub use records::{RecordView, RecordsRead};
pub use sync_times::{DurationCounts, DurationHistogram, SYNC_TIME_BOUNDS_MICROS, SyncTimes};
pub use tail::TailFollower;
pub use tributary_event::{Clock, ManualClock, SystemClock};
