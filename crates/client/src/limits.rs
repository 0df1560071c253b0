//! Every limit and default of the client in one place, each with its reason.
//!
//! The dialect's own limits, which the hub holds to as well, are `tributary_eventhubs::limits`;
//! those the client checks are re-exported here under the client's names.

use std::time::Duration;

pub use tributary_eventhubs::connection_string::{PORT_PLAIN, PORT_TLS};
pub use tributary_eventhubs::limits::{
    BATCH_EVENTS_MAX as SEND_EVENTS_MAX, CONNECTION_STRING_BYTES_MAX,
    MESSAGE_BYTES_MAX as MESSAGE_BYTES_MAX_DEFAULT,
};

/// How long a SAS token this client signs stays valid: one hour, the Azure SDKs' default. Long
/// enough that renewal traffic is negligible, short enough that a leaked token soon expires.
pub const SAS_TOKEN_LIFETIME: Duration = Duration::from_secs(60 * 60);

/// A token is renewed once this fraction (in percent) of its lifetime has passed — six minutes
/// before expiry for a one-hour token. The Python SDK renews with 10 % of the lifetime left; the
/// margin covers a slow `$cbs` round trip and clock skew between client and hub.
pub const TOKEN_RENEW_AT_PERCENT: u32 = 90;

/// The longest the renewal task sleeps between checks, so a token put with a short lifetime (a
/// `SharedAccessSignature` from the connection string) is looked at again in time.
pub const TOKEN_CHECK_INTERVAL_MAX: Duration = Duration::from_secs(60);

/// How long one network operation (connect, attach, send, management request) may take by
/// default before it fails with a timeout: the Azure SDKs' default try timeout.
pub const OPERATION_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);

/// How long closing a link, a session or the connection may wait for the hub's answer. Closing
/// is a courtesy (the hub cleans up after a dropped connection too), so a hub that does not
/// answer must not hold up the caller's shutdown.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The most events a receiver buffers ahead of `receive` (its link credit). Matches the
/// processor host's own prefetch limit, so every prefetch the host accepts can be honoured.
pub const PREFETCH_MAX: u32 = 100_000;

/// The receiver prefetch when a caller does not choose one: the Python SDK's default.
pub const PREFETCH_DEFAULT: u32 = 300;

/// The most sessions one connection may carry (the AMQP `channel-max` proposed). Each receiver
/// gets its own session, as in the Azure SDKs, so a processor host owning every partition of a
/// 1024-partition hub needs 1024 plus the control session; twice that leaves room.
pub const SESSIONS_MAX: u16 = 2048;

/// The largest frame this client reads (the AMQP `max-frame-size` it proposes): 256 KiB, so a
/// batch of deliveries fills few frames while one frame's buffer stays small. Larger messages
/// arrive split across frames.
pub const FRAME_BYTES_MAX: u32 = 256 * 1024;

/// The largest message a receiver link accepts (its `max-message-size`): 64 MiB, above every
/// Event Hubs tier's event size (1 MiB standard, 20 MiB dedicated), so no real event is refused,
/// while a broken or hostile hub cannot make a receiver assemble an unbounded message.
pub const DELIVERY_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// How long the hub may be silent before the connection is given up (the AMQP `idle-time-out`
/// this client proposes; the hub sends empty frames at half of it). Two minutes, as the Azure
/// SDKs propose: a half-open TCP connection is noticed without a busy keep-alive.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// How many responses a `$cbs` or `$management` reply link may have in flight (its credit).
/// One request is outstanding at a time; the rest absorbs stray responses.
pub const RESPONSE_CREDIT: u32 = 8;

/// The longest text kept from a description the hub sends (errors, status descriptions). The
/// text ends up in logs and error messages; a hostile or broken peer must not fill them.
pub const DESCRIPTION_CHARS_MAX: usize = 1024;

const _: () = assert!(TOKEN_RENEW_AT_PERCENT > 0 && TOKEN_RENEW_AT_PERCENT < 100);
const _: () = assert!(PREFETCH_DEFAULT <= PREFETCH_MAX);
const _: () = assert!(SAS_TOKEN_LIFETIME.as_secs() > TOKEN_CHECK_INTERVAL_MAX.as_secs());
const _: () = assert!(
    PREFETCH_MAX == tributary_source::PREFETCH_LIMIT,
    "the client must honour every prefetch a source may be asked for"
);
