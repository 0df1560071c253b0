//! Every limit of the Kafka front door in one place, each with its reason.
//!
//! The connection caps and the pre-authentication deadline are the AMQP door's defaults
//! (`tributary_amqp::limits`): one namespace, one budget of sockets, whatever the protocol.

use std::time::Duration;

pub use tributary_amqp::limits::{
    AUTH_TIMEOUT_DEFAULT, CONNECTIONS_MAX_DEFAULT, CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
    UNAUTHENTICATED_BYTES_MAX,
};

/// The largest event a producer may send: Event Hubs' 1 MiB (Standard tier), counted over a
/// record's value, key and headers. A bigger record is refused with MESSAGE_TOO_LARGE.
pub const RECORD_BYTES_MAX: usize = 1024 * 1024;

/// The most bytes one record batch may decompress to: a producer's batch is at most about
/// 1 MB before compression (librdkafka's `batch.size`, kafka-python's 16 KiB), so 16 MiB
/// refuses only bombs (gzip inflates 1000:1), never a real batch.
pub const DECOMPRESSED_BATCH_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// The largest request frame by default. Kafka clients cap a produce request at
/// `message.max.bytes` (librdkafka: 1,000,000) or `max_request_size` (kafka-python: 1 MiB)
/// plus a little framing; 8 MiB leaves room for clients configured above that while bounding
/// what one connection makes the server buffer.
pub const FRAME_BYTES_MAX_DEFAULT: u32 = 8 * 1024 * 1024;

/// The most bytes a fetch response carries, whatever the client asks for (Kafka's
/// `fetch.max.bytes` default is 50 MiB; a hub's partition rarely has that much unread, and a
/// smaller cap bounds the memory of one long poll).
pub const FETCH_RESPONSE_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// The most events read from one partition for one fetch: about a MiB of small events.
pub const FETCH_PARTITION_EVENTS_MAX: usize = 10_000;

/// The longest a fetch waits for `min_bytes` (clients ask for 100 ms to 500 ms; Kafka caps
/// nothing, but a fetch holds its connection, so a client asking for more is answered by this).
pub const FETCH_WAIT_MAX: Duration = Duration::from_secs(30);

/// How long an authenticated connection may stay silent before it is closed: Kafka's
/// `connections.max.idle.ms` default (9 minutes). Clients reconnect on their own.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(9 * 60);

/// How long shutdown waits for connections to finish the request they are answering.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the door lets connections hold (configurable; the defaults are the constants above).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KafkaLimits {
    /// The most connections at once.
    pub connections_max: usize,
    /// The most connections at once from one source IP address.
    pub connections_per_address_max: usize,
    /// From accept to a successful SASL authentication; then the connection is closed.
    pub auth_timeout: Duration,
    /// The largest request frame; a bigger one closes the connection.
    pub frame_bytes_max: u32,
}

impl Default for KafkaLimits {
    fn default() -> Self {
        KafkaLimits {
            connections_max: CONNECTIONS_MAX_DEFAULT,
            connections_per_address_max: CONNECTIONS_PER_ADDRESS_MAX_DEFAULT,
            auth_timeout: AUTH_TIMEOUT_DEFAULT,
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
        }
    }
}

const _: () = assert!(FRAME_BYTES_MAX_DEFAULT as usize > RECORD_BYTES_MAX);
const _: () = assert!(FETCH_RESPONSE_BYTES_MAX > RECORD_BYTES_MAX as u64);
const _: () = assert!(FETCH_PARTITION_EVENTS_MAX > 0);
const _: () = assert!(DECOMPRESSED_BATCH_BYTES_MAX > RECORD_BYTES_MAX as u64);
const _: () = assert!(UNAUTHENTICATED_BYTES_MAX < FRAME_BYTES_MAX_DEFAULT as u64);
