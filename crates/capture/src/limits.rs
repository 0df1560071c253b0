//! The limits of a capture, each with its reason.

use std::time::Duration;

/// The shortest capture window Event Hubs accepts (`intervalInSeconds` 60..900).
pub const INTERVAL_MIN: Duration = Duration::from_secs(60);
/// The longest capture window Event Hubs accepts.
pub const INTERVAL_MAX: Duration = Duration::from_secs(900);
/// Event Hubs' default capture window: five minutes.
pub const INTERVAL_DEFAULT: Duration = Duration::from_secs(300);

/// The smallest size window Event Hubs accepts (`sizeLimitInBytes` 10485760..524288000).
pub const SIZE_BYTES_MIN: u64 = 10 * 1024 * 1024;
/// The largest size window Event Hubs accepts.
pub const SIZE_BYTES_MAX: u64 = 500 * 1024 * 1024;
/// Event Hubs' default size window: 300 MiB.
pub const SIZE_BYTES_DEFAULT: u64 = 300 * 1024 * 1024;

/// How many events one read of the partition asks for: large enough that a busy partition is
/// read in few calls, small enough that a step holds little memory (the events go straight into
/// the window's file).
pub const READ_EVENTS_MAX: usize = 1024;
/// About how many bytes one read of the partition returns at most (4 MiB: well under the
/// smallest size window, so a window overshoots its size by at most one read's last event).
pub const READ_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// The least time between two steps of a partition's capture that events woke: a few commits
/// gather, so a busy partition is stepped at most 200 times a second, not once per commit, and
/// what a step reads was written so recently that it is still in the page cache and in the
/// processor's caches (5 ms of a partition taking 400 MB/s is 2 MB).
pub const STEP_SPACING: Duration = Duration::from_millis(5);

/// About how many bytes of records an Avro block holds: large enough that block headers and
/// sync markers cost nothing and a `deflate` block compresses well, small enough that a reader
/// (fastavro, Azure's) holds little of it at once.
pub const AVRO_BLOCK_BYTES: usize = 1024 * 1024;

/// How many bytes of a window's file a `file:` destination writes through the page cache
/// between two `fdatasync`s (only where the file system refuses `O_DIRECT`; see
/// `crate::file_writer`): the disk writes the file while the capture encodes the rest, so
/// publishing it waits for at most about this much.
pub const SYNC_AHEAD_BYTES: u64 = 4 * 1024 * 1024;

/// The bytes a `file:` destination's window file is written in, each with one `pwrite` by the
/// file's writer thread (`crate::file_writer`): one huge page ([`HUGE_PAGE_BYTES`]), so the
/// kernel pins one page per write rather than 512 (an `O_DIRECT` write cost less than half the
/// CPU from huge pages, BENCHMARKS.md, "Capture: write buffers in huge pages"), and the device
/// sees few large writes; small enough that a file's [`WRITE_BUFFERS`] hold little memory.
pub const WRITE_CHUNK_BYTES: usize = HUGE_PAGE_BYTES;
/// The size (and alignment) of a transparent huge page on x86-64 and of the usual one on
/// aarch64 with 4 KiB pages: a write buffer asks the kernel for one.
pub const HUGE_PAGE_BYTES: usize = 2 * 1024 * 1024;
/// How many chunk buffers a window file uses at most: one being filled while the other is
/// written (double buffering), so the encoder waits only when the device is slower.
pub const WRITE_BUFFERS: usize = 2;
/// How many chunk buffers a `file:` destination keeps between files (each window's file would
/// otherwise fault in fresh memory): enough for a few partitions' files at once.
pub const POOLED_BUFFERS_MAX: usize = 8;
/// How many idle writer threads a `file:` destination keeps between files (each window's file
/// would otherwise start one): one per partition whose window is being written at once, for a
/// few partitions.
pub const POOLED_WRITERS_MAX: usize = 4;
/// The alignment of `O_DIRECT` writes (memory address, file offset and length): the largest
/// logical block size of common devices (512 B or 4 KiB) and the page size.
pub const DIRECT_ALIGN_BYTES: usize = 4096;

/// The most bytes an archive name format may have: Azure Blob names are at most 1024
/// characters, and a format renders to about its own length.
pub const ARCHIVE_NAME_FORMAT_BYTES_MAX: usize = 1024;

/// The most bytes a progress file may have; a larger one is not ours.
pub const PROGRESS_FILE_BYTES_MAX: u64 = 64 * 1024;

/// The bytes a Blob Storage destination stages per block (Put Block): a window's file is held in
/// memory at most this much at a time, and the service's 50,000 blocks a blob at this size hold
/// far more than the largest size window.
pub const BLOB_BLOCK_BYTES: usize = 4 * 1024 * 1024;
/// The bytes one ranged read of a blob asks for when a file is read back at recovery.
pub const BLOB_READ_BYTES: u64 = 4 * 1024 * 1024;
/// The most List Blobs pages (5,000 blobs each) a search for leftovers follows.
pub const BLOB_LIST_PAGES_MAX: u32 = 1024;

/// About how many bytes of events (as the size window counts them) a Parquet row group holds
/// before it is written: what a Parquet window keeps in memory at most, whatever its size.
pub const PARQUET_ROW_GROUP_BYTES: u64 = 32 * 1024 * 1024;
/// The most bytes a Parquet file's footer may have when it is read back; the capture's own
/// footers are a few kilobytes (statistics only on the two numeric columns).
pub const PARQUET_FOOTER_BYTES_MAX: usize = 8 * 1024 * 1024;

const _: () = assert!(READ_BYTES_MAX < SIZE_BYTES_MIN);
const _: () = assert!(WRITE_CHUNK_BYTES.is_multiple_of(DIRECT_ALIGN_BYTES));
const _: () = assert!(HUGE_PAGE_BYTES.is_multiple_of(DIRECT_ALIGN_BYTES));
const _: () = assert!(WRITE_CHUNK_BYTES.is_multiple_of(HUGE_PAGE_BYTES));
const _: () = assert!(WRITE_BUFFERS >= 2);
const _: () = assert!(SYNC_AHEAD_BYTES.is_multiple_of(WRITE_CHUNK_BYTES as u64));
const _: () = assert!(SIZE_BYTES_MAX / (BLOB_BLOCK_BYTES as u64) < 50_000);
const _: () = assert!(SIZE_BYTES_MIN <= SIZE_BYTES_DEFAULT);
const _: () = assert!(SIZE_BYTES_DEFAULT <= SIZE_BYTES_MAX);
const _: () = assert!(INTERVAL_MIN.as_secs() <= INTERVAL_DEFAULT.as_secs());
const _: () = assert!(INTERVAL_DEFAULT.as_secs() <= INTERVAL_MAX.as_secs());
