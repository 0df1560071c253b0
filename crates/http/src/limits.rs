//! Every limit of the HTTP front door, each with its reason.

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

/// The most rate-limit buckets kept; beyond this, idle (full) buckets are dropped first.
pub const RATE_BUCKETS_MAX: usize = 100_000;

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
