//! Every limit of the AMQP front door in one place, each with its reason.
//!
//! The dialect's own limits — message and batch size, selector and token length — are
//! `tributary_eventhubs::limits`, shared with the client and re-exported here.

use std::time::Duration;

pub use tributary_eventhubs::limits::{
    BATCH_EVENTS_MAX, DESCRIBED_DEPTH_MAX, MESSAGE_BYTES_MAX, SELECTOR_BYTES_MAX, TOKEN_BYTES_MAX,
};

/// The largest AMQP frame: 1 MiB, what the Python SDK (`MAX_FRAME_SIZE_BYTES`) asks for. Larger
/// messages span frames, so this bounds memory per frame, not message size.
pub const FRAME_BYTES_MAX: u32 = 1024 * 1024;

/// Credit given to a client's send link, topped up once credit and unsettled deliveries
/// together fall to half of it. What waits in memory per send link — queued for its task or in
/// flight (see [`SEND_PIPELINE_MAX`]) — is bounded by this many messages of at most
/// [`MESSAGE_BYTES_MAX`] each.
pub const SEND_LINK_CREDIT: u32 = 200;

/// The most deliveries of one send link whose appends are in flight at once (issued to the log,
/// not yet settled). A group-committed fsync takes about 1 to 5 ms; 64 deliveries of a 100-event
/// batch each per fsync keep one link above 1 M events/s, and a client sending single events
/// without waiting for each settlement (the JavaScript SDK's concurrent `sendBatch`) shares one
/// fsync among 64 of them instead of paying one each. At most [`SEND_LINK_CREDIT`], since the
/// client cannot have more unsettled deliveries than credit.
pub const SEND_PIPELINE_MAX: usize = 64;

/// The longest a send waits for its turn under an ingress limit before it is refused with
/// `com.microsoft:server-busy` instead: a second, one bucket's worth of debt. A client that
/// waits for each settlement is then paced at the limit and never refused; clients that
/// together keep more than a second's worth in flight are told to back off (the SDKs wait
/// seconds before retrying), as Event Hubs throttles.
pub const THROTTLE_WAIT_MAX: Duration = Duration::from_secs(1);

/// The most events a receive link reads from the broker at once before handing them to the
/// client as its credit allows: the Python SDK's default prefetch.
pub const RECEIVE_BATCH_EVENTS: usize = 300;

/// How long a receive link waits for new events in one broker call before checking again.
/// Appends wake it at once; this only bounds how long a quiet link sleeps.
pub const RECEIVE_WAIT: Duration = Duration::from_secs(30);

/// How long, by default, a connection has from its accept to its `open` (TLS, protocol header,
/// SASL exchange and `open`). A handshake needs a few round trips — milliseconds locally, about a
/// second across continents — and the SDKs send `open` right after SASL; 10 s absorbs a slow or
/// lossy link while a socket that never speaks costs its slot for 10 s only.
pub const HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// How long, by default, a connection may stay unauthenticated (no SASL PLAIN login and no token
/// accepted on `$cbs`), counted from its accept. The SDKs put their first token right after
/// `open`, within milliseconds; the service gives about a minute. Half that still leaves a
/// client retrying a refused token (the SDKs back off 0.8 s, 1.6 s, 3.2 s …) plenty of room,
/// and halves what a crowd of anonymous sockets can hold. Authenticated connections are never
/// timed by this: only their idle timeout applies.
pub const AUTH_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// The most connections the door holds at once by default, authenticated or not: the Event
/// Hubs Standard tier's quota of AMQP connections per namespace. Each costs a file descriptor
/// and a few KiB; beyond this, connections are refused (see [`ConnectionLimits`]).
pub const CONNECTIONS_MAX_DEFAULT: usize = 5_000;

/// The most connections one source address may hold at once by default: a thousand SDK
/// clients behind one NAT address is already a large deployment, and no single host needs more.
pub const CONNECTIONS_PER_ADDRESS_MAX_DEFAULT: usize = 1_000;

/// The most connections being refused (answered with `amqp:resource-limit-exceeded`) at once.
/// Each is held at most [`REFUSAL_TIMEOUT`]; beyond this, a connection over a cap is closed
/// at once without a frame, so refusing costs a bounded amount too.
pub const REFUSALS_IN_FLIGHT_MAX: usize = 64;

/// How long a refused connection is held for its refusal: its handshake, its `open`, and this
/// side's `close` carrying the condition.
pub const REFUSAL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a refused connection that has opened may take to attach its first link, which is
/// refused with the condition; then the connection is closed with it. An SDK attaches within
/// milliseconds of its `open`.
pub const REFUSAL_LINK_WAIT: Duration = Duration::from_secs(1);

/// The most bytes an unauthenticated connection may send. SASL, `open`, a `begin`, the four
/// attaches of `$cbs` and `$management` and a put-token (its token at most
/// [`TOKEN_BYTES_MAX`]) take under 8 KiB; beyond 64 KiB the connection is cut. This bounds what
/// an anonymous peer makes the server buffer (frames may otherwise be [`FRAME_BYTES_MAX`]).
pub const UNAUTHENTICATED_BYTES_MAX: u64 = 64 * 1024;

/// The most sessions an unauthenticated connection may begin; the SDKs use one or two.
pub const UNAUTHENTICATED_SESSIONS_MAX: usize = 4;

/// The most links an unauthenticated connection may attach (counting refused ones); the SDKs
/// attach four (`$cbs` and `$management`, requests and replies) before their first token.
pub const UNAUTHENTICATED_LINKS_MAX: usize = 16;

/// What the door lets connections hold, and for how long before they authenticate
/// (configurable; the defaults are the constants above).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// The most connections at once.
    pub connections_max: usize,
    /// The most connections at once from one source IP address.
    pub connections_per_address_max: usize,
    /// From accept to `open` (see [`HANDSHAKE_TIMEOUT_DEFAULT`]).
    pub handshake_timeout: Duration,
    /// From accept to the first valid token or PLAIN login (see [`AUTH_TIMEOUT_DEFAULT`]).
    pub auth_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            connections_max: CONNECTIONS_MAX_DEFAULT,
            connections_per_address_max: CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
            handshake_timeout: HANDSHAKE_TIMEOUT_DEFAULT,
            auth_timeout: AUTH_TIMEOUT_DEFAULT,
        }
    }
}

/// How long closing a link or a connection waits for the peer's answer.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The most sessions one connection may begin (channel-max + 1). The SDKs use one or two per
/// client; 256 leaves room for many clients sharing a connection.
pub const CHANNEL_MAX: u16 = 255;

/// The most links a session may attach. The SDKs use a handful per session.
pub const HANDLE_MAX: u32 = 1023;

/// The most credit-based requests ($cbs, $management) waiting for their response link at once
/// per session. A client sends one request at a time per node.
pub const NODE_QUEUE_MAX: usize = 64;

/// How many grants (accepted tokens) one connection remembers. A client puts one token per
/// entity it uses and refreshes it; the oldest grants are dropped beyond this.
pub const GRANTS_PER_CONNECTION_MAX: usize = 256;

/// The idle timeout advertised in `open` when the configuration gives none: the peer must send
/// something (an empty frame will do) at least this often. The SDKs send heartbeats.
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(120);

/// Connections another front door handed over (AMQP over WebSockets) that wait for the accept
/// loop at once. The loop takes each at once, so a handful suffices; beyond this a handover
/// waits, holding back only the door that hands it over.
pub const HANDOVERS_QUEUED_MAX: usize = 64;

const _: () = assert!(MESSAGE_BYTES_MAX >= FRAME_BYTES_MAX as u64);
const _: () = assert!(SEND_LINK_CREDIT > 0);
const _: () = assert!(SEND_PIPELINE_MAX > 0);
const _: () = assert!(SEND_PIPELINE_MAX <= SEND_LINK_CREDIT as usize);
const _: () = assert!(RECEIVE_BATCH_EVENTS > 0);
const _: () = assert!(UNAUTHENTICATED_BYTES_MAX > 2 * TOKEN_BYTES_MAX as u64);

/// Shared access policies per scope (the namespace, or one event hub): Event Hubs allows 12
/// authorization rules per namespace and per entity, and every login tries the policies of its
/// name only, so this bounds the policies file, not the cost of a login.
pub const POLICIES_PER_SCOPE_MAX: usize = 12;
