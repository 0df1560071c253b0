//! Every limit of the HTTP front door, each with its reason.

use std::time::Duration;

/// The most bytes of keys and values one PutMessages request may carry after base64 decoding,
/// and so the largest single message: 1 MiB, OCI Streaming's limit per message and per request.
pub const PUT_REQUEST_BYTES_MAX: u64 = 1024 * 1024;

/// The longest message key: 256 bytes, OCI's limit.
pub const KEY_BYTES_MAX: usize = 256;

/// The largest request body read at all: base64 inflates 1 MiB of messages by 4/3, and JSON
/// punctuation adds a few bytes per message; 2 MiB leaves room for both while still refusing a
/// body that cannot possibly fit before buffering it.
pub const REQUEST_BODY_BYTES_MAX: usize = 2 * 1024 * 1024;

/// How much of a too-large body is still read (and dropped) before answering 413, so a client
/// that is still sending reads the answer rather than a reset connection; beyond this the
/// connection is cut.
pub const BODY_DRAIN_BYTES_MAX: usize = 16 * 1024 * 1024;

/// The most messages one GetMessages answer may be asked for: OCI's `limit` range.
pub const GET_LIMIT_MAX: u32 = 10_000;

/// About how many bytes of keys and values one GetMessages answer carries at most (a single
/// larger message is still delivered alone): OCI's read throughput is 2 MB/s per partition, and
/// 1 MiB keeps an answer's JSON under 1.5 MB.
pub const GET_RESPONSE_BYTES_MAX: u64 = 1024 * 1024;

/// How long a cursor stays valid: five minutes, as OCI documents.
pub const CURSOR_TTL_MS: i64 = 5 * 60 * 1000;

/// How far a signed request's `date` may be from the server's clock by default: five minutes,
/// as OCI's request-signing documentation allows.
pub const CLOCK_SKEW_MS_MAX_DEFAULT: i64 = 5 * 60 * 1000;

/// The longest `opc-request-id` echoed back; longer ones are replaced with a generated id.
pub const REQUEST_ID_CHARS_MAX: usize = 98;

/// The cursor HMAC key's length: SHA-256's block-sized security, 256 bits.
pub const CURSOR_KEY_BYTES: usize = 32;

/// Bytes of HMAC-SHA256 kept in a cursor: 128 bits is the standard truncation (RFC 2104 §5 allows
/// half the output) and keeps cursors short in query strings.
pub const CURSOR_TAG_BYTES: usize = 16;

/// The largest WebSocket message (and frame) AMQP over WebSockets accepts: the AMQP door's
/// largest frame (1 MiB, `tributary_amqp::limits::FRAME_BYTES_MAX`; the SDKs send one frame per
/// message) plus 64 KiB of headroom for clients that put a few small frames beside it. A larger
/// message closes the connection instead of being buffered.
pub const WEBSOCKET_MESSAGE_BYTES_MAX: usize = 1024 * 1024 + 64 * 1024;

const _: () = assert!(REQUEST_BODY_BYTES_MAX as u64 >= PUT_REQUEST_BYTES_MAX * 4 / 3);
const _: () = assert!(GET_RESPONSE_BYTES_MAX >= PUT_REQUEST_BYTES_MAX);
const _: () = assert!(BODY_DRAIN_BYTES_MAX > REQUEST_BODY_BYTES_MAX);
const _: () = assert!(CURSOR_TAG_BYTES * 2 <= CURSOR_KEY_BYTES);

/// TLS handshakes run at once on the HTTPS port. A handshake costs a few hundred microseconds
/// of CPU and waits on its peer for the rest; 256 at once keeps a burst of reconnecting
/// clients moving while a crowd of stalled peers (each held at most the handshake deadline)
/// cannot hold more sockets than this.
pub const HANDSHAKES_IN_FLIGHT_MAX: usize = 256;

/// How long, by default, a client has to send a request's headers — from the connection's start,
/// or from the end of its previous response on a kept-alive connection (so it is also the idle
/// timeout between requests). A request's headers are one packet or a few; 30 s is hyper's own
/// default and as patient as Apache's `RequestReadTimeout header=20-40`, while a peer trickling
/// headers a byte at a time (slowloris) or saying nothing holds its connection 30 s at most.
pub const HEADER_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// How long, by default, a client has to send a request's body once its headers are in. The
/// largest body read is [`REQUEST_BODY_BYTES_MAX`] (2 MiB): 60 s allows 35 KB/s, slower than any
/// link a client of a streaming service uses; a peer that stalls mid-body is answered 408.
pub const BODY_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);

/// The most connections the door holds at once by default (as the AMQP door): each costs a file
/// descriptor and a task; beyond this a connection is answered 503 and closed.
pub const CONNECTIONS_MAX_DEFAULT: usize = 5_000;

/// The most connections one source address may hold at once by default; beyond this a
/// connection is answered 429 and closed. The OCI SDKs pool a handful of connections per client.
pub const CONNECTIONS_PER_ADDRESS_MAX_DEFAULT: usize = 1_000;

/// The most refused connections being answered at once; beyond this a connection over a cap is
/// closed without an answer. Each is held at most [`REFUSAL_TIMEOUT`].
pub const REFUSALS_IN_FLIGHT_MAX: usize = 64;

/// How long a refused connection is held: its 503 or 429 written, and what the client was
/// sending read and dropped, so the client reads the answer rather than a reset connection.
pub const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);

/// The HTTP door's connection caps and read timeouts (configurable; the defaults are the
/// constants above).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// The most connections at once.
    pub connections_max: usize,
    /// The most connections at once from one source IP address.
    pub connections_per_address_max: usize,
    /// See [`HEADER_READ_TIMEOUT_DEFAULT`].
    pub header_read_timeout: Duration,
    /// See [`BODY_READ_TIMEOUT_DEFAULT`].
    pub body_read_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            connections_max: CONNECTIONS_MAX_DEFAULT,
            connections_per_address_max: CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
            header_read_timeout: HEADER_READ_TIMEOUT_DEFAULT,
            body_read_timeout: BODY_READ_TIMEOUT_DEFAULT,
        }
    }
}
