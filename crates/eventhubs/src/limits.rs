//! The limits of the Event Hubs dialect that both ends hold to, each with its reason.
//!
//! The server refuses what exceeds them; the client checks them before it sends, so a caller
//! gets a clear argument error instead of a refusal from the hub.

/// The largest message (one transfer, batch or not): 1 MiB, the Event Hubs limit for an event or
/// a batch on the basic and standard tiers and the emulator's. The server advertises it as
/// `max-message-size` on every link a client sends on; the client assumes it when a hub
/// advertises none.
pub const MESSAGE_BYTES_MAX: u64 = 1024 * 1024;

/// About the fewest bytes one event of a batch takes as the SDKs write it: the `data` section
/// around the message, its own `data` section and the usual properties. Only relates
/// [`BATCH_EVENTS_MAX`] to [`MESSAGE_BYTES_MAX`].
const SDK_BATCHED_EVENT_BYTES_MIN: u64 = 32;

/// The most events one batched transfer ([`BATCH_MESSAGE_FORMAT`](crate::names::BATCH_MESSAGE_FORMAT))
/// may carry: 32 Ki. A 1 MiB batch of the smallest events the SDKs write holds fewer, so this
/// refuses nothing a client can legitimately fit, and it bounds the work one transfer causes.
/// Event Hubs itself counts only bytes; the client checks it before encoding anything.
pub const BATCH_EVENTS_MAX: usize = 32 * 1024;

/// The longest selector filter expression (see [`crate::selector`]). The SDKs' filters are
/// under 100 bytes; the bound keeps parsing cheap.
pub const SELECTOR_BYTES_MAX: usize = 1024;

/// The longest SAS token accepted (see [`crate::sas`]). Real tokens are about 200 bytes; 4 KiB
/// leaves room for long audiences and bounds the parsing work.
pub const TOKEN_BYTES_MAX: usize = 4096;

/// How deeply described types may nest inside a message the strict scanner
/// ([`crate::scan`]) walks. AMQP messages from the SDKs nest at most two levels; 32 bounds
/// recursion on hostile input.
pub const DESCRIBED_DEPTH_MAX: u32 = 32;

/// The longest connection string accepted (see [`crate::connection_string`]). Real ones are a
/// few hundred bytes; the cap keeps a mistaken argument (a file's contents) from being echoed in
/// full in an error.
pub const CONNECTION_STRING_BYTES_MAX: usize = 16 * 1024;

const _: () = assert!(
    BATCH_EVENTS_MAX as u64 * SDK_BATCHED_EVENT_BYTES_MIN >= MESSAGE_BYTES_MAX,
    "the batch limit must not refuse a batch that fits the message size"
);
const _: () = assert!((SELECTOR_BYTES_MAX as u64) < MESSAGE_BYTES_MAX);
const _: () = assert!((TOKEN_BYTES_MAX as u64) < MESSAGE_BYTES_MAX);
