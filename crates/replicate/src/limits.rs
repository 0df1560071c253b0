//! Every limit and default of a replication task in one place, each with its reason.

use std::time::Duration;

/// How many sends of one source batch may be in flight at once to one target: the groups of
/// different partition keys go out concurrently (each key's sends stay in order), so a batch of
/// many keys is not a round trip per key. 64 transfers pipeline on one link and keep a remote
/// hub busy; the bound keeps a batch of thousands of keys from opening thousands of futures.
pub const SENDS_IN_FLIGHT_MAX: usize = 64;

/// The first pause before a failed send is tried again. A dropped connection usually comes back
/// within a second; 200 ms retries soon without spinning.
pub const BACKOFF_MIN_DEFAULT: Duration = Duration::from_millis(200);

/// The longest pause between tries: five minutes, the ceiling of Azure's replication samples
/// (`ExponentialBackoffRetry(-1, 00:00:05, 00:05:00)`). Sends are retried without end — the
/// checkpoint waits for them, so nothing is skipped — and this caps how late a task notices the
/// target is back.
pub const BACKOFF_MAX_DEFAULT: Duration = Duration::from_secs(300);

/// Events per source batch by default: large enough that a checkpoint per batch costs little,
/// small enough that a batch's events reach the target within milliseconds at low rates.
pub const BATCH_EVENTS_DEFAULT: u32 = 1000;

/// Events the source receiver buffers ahead by default: two batches, so the next batch is
/// ready while one is being sent.
pub const PREFETCH_DEFAULT: u32 = 2 * BATCH_EVENTS_DEFAULT;

/// The longest task name: it names metrics, status files and (by default) nothing on the wire,
/// so it only has to stay readable.
pub const TASK_NAME_CHARS_MAX: usize = 128;

/// The most routes (targets) one task may have. Each event is matched against every route's
/// condition; a few dozen keeps that cheap, and more is better served by a second task.
pub const TARGETS_MAX: usize = 32;

/// How long `tributary replicate` waits, when it starts, for each endpoint to answer (connect,
/// authenticate, read the hub's properties) before reporting it unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

const _: () = assert!(PREFETCH_DEFAULT >= BATCH_EVENTS_DEFAULT);
const _: () = assert!(BACKOFF_MIN_DEFAULT.as_millis() < BACKOFF_MAX_DEFAULT.as_millis());
const _: () = assert!(
    BATCH_EVENTS_DEFAULT <= tributary_processor::limits::BATCH_EVENTS_LIMIT,
    "the default batch must be one the processor host accepts"
);
