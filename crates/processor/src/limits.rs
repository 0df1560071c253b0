//! Every limit of the processor host in one place, each with its reason.

use std::time::Duration;

/// The most events one `process_events` call may be given. A batch is held in memory while the
/// processor works on it; 10 000 events of 1 MiB (the Event Hubs maximum) would already be
/// 10 GiB, so larger batches are a configuration mistake.
pub const BATCH_EVENTS_LIMIT: u32 = 10_000;

/// The most events a receiver may buffer ahead of the processor: what every source honours
/// ([`tributary_source::PREFETCH_LIMIT`]), ten times [`BATCH_EVENTS_LIMIT`] — room for a few
/// batches of prefetch at the largest batch size.
pub const PREFETCH_COUNT_LIMIT: u32 = tributary_source::PREFETCH_LIMIT;

/// The longest host name: the name is stored in every ownership record and written into logs,
/// and Azure blob metadata keeps values well under this.
pub const HOST_NAME_CHARS_MAX: usize = 256;

/// An ownership record must stay still for at least this many balancing intervals before it
/// counts as expired. An observer samples once per interval, and the owner renews once per
/// interval, so a live owner's renewal can look up to two intervals old (it renewed just after
/// the observer's read, then the observer reads one interval later); the third interval is the
/// margin for a slow store call. Below this, live owners are declared dead and partitions thrash
/// (azure-sdk-for-rust#3851 shipped with expiration < interval).
pub const EXPIRATION_INTERVALS_MIN: u32 = 3;

/// How long a store keeps the host record of a host it has not heard from. A live host renews
/// its record every balancing interval; a record this old belongs to a host that crashed (a
/// host stopping gracefully removes its own), kept meanwhile only so the listing shows it.
/// Forgetting a live host's record would be safe anyway (its partitions would then be judged by
/// their own versions, and receiver epochs fence whoever loses them).
pub const HOST_RECORD_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);

/// The shortest balancing interval accepted. Every host lists and claims once per interval;
/// below 50 ms a store shared by a few hosts spends its time on renewals.
pub const LOAD_BALANCING_INTERVAL_MIN: Duration = Duration::from_millis(50);

/// How often the host asks the source for the hub's partition ids again, so partitions added
/// to a hub are balanced. Partition counts change rarely and only upwards.
pub const PARTITION_IDS_REFRESH_INTERVAL: Duration = Duration::from_secs(30);

/// The first pause before a pump reopens a receiver after an error; doubled after each further
/// error in a row.
pub const RECEIVE_RETRY_BACKOFF_MIN: Duration = Duration::from_millis(100);

/// The longest pause between a pump's retries: a hub that comes back is noticed within this.
pub const RECEIVE_RETRY_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// How long a SQLite call waits for another process's write lock before failing. Claims and
/// checkpoints are single small transactions (well under a millisecond of lock time each), so
/// waiting this long means something holds the file, and a failed balancing cycle is retried on
/// the next interval anyway.
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The most List Blobs pages the blob store follows for one listing. A page holds up to 5,000
/// blobs and a consumer group has one blob per partition (at most 1,024 in Event Hubs), so more
/// pages than this means a container full of something else.
pub const BLOB_LIST_PAGES_MAX: u32 = 64;

const _: () = assert!(PREFETCH_COUNT_LIMIT >= BATCH_EVENTS_LIMIT);
const _: () =
    assert!(RECEIVE_RETRY_BACKOFF_MAX.as_millis() > RECEIVE_RETRY_BACKOFF_MIN.as_millis());
const _: () = assert!(EXPIRATION_INTERVALS_MIN >= 2);
