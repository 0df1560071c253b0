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

/// The most bytes an archive name format may have: Azure Blob names are at most 1024
/// characters, and a format renders to about its own length.
pub const ARCHIVE_NAME_FORMAT_BYTES_MAX: usize = 1024;

/// The most bytes a progress file may have; a larger one is not ours.
pub const PROGRESS_FILE_BYTES_MAX: u64 = 64 * 1024;

const _: () = assert!(READ_BYTES_MAX < SIZE_BYTES_MIN);
const _: () = assert!(SIZE_BYTES_MIN <= SIZE_BYTES_DEFAULT);
const _: () = assert!(SIZE_BYTES_DEFAULT <= SIZE_BYTES_MAX);
const _: () = assert!(INTERVAL_MIN.as_secs() <= INTERVAL_DEFAULT.as_secs());
const _: () = assert!(INTERVAL_DEFAULT.as_secs() <= INTERVAL_MAX.as_secs());
