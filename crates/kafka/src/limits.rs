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

/// How many of an idempotent producer's latest batches each partition remembers, to recognise
/// a retry of any of them: Kafka's (a producer has at most 5 requests in flight per partition
/// with idempotence on: librdkafka's and Java's `max.in.flight` limit).
pub const PRODUCER_BATCHES_KEPT: usize = 5;

/// The most idempotent producers remembered per partition; beyond, the one that appended least
/// recently is forgotten. Each costs about 200 bytes (five batches and the map's entry), so a
/// partition holds at most about 400 KiB; a producer appends from one process for its life, so
/// 2048 at once in one partition is far more than applications run.
pub const PRODUCERS_PER_PARTITION_MAX: usize = 2048;

/// How many partitions' producer states are kept before those whose producers all expired are
/// dropped: a namespace with a few hubs of up to 1,024 partitions each stays below it, and
/// dropping scans the map once per partition added past it (well under a microsecond an entry).
pub const PRODUCER_PARTITIONS_PRUNE_AT: usize = 4096;

/// How long a producer that stopped appending is remembered: Kafka's
/// `producer.id.expiration.ms` default (one day).
pub const PRODUCER_IDLE_EXPIRATION_MS: i64 = 24 * 60 * 60 * 1000;

/// How much of a partition's tail is read back, after a restart, to rebuild its producers'
/// state before their first batch is judged. A retry after a crash is of a batch that was in
/// flight at the crash, appended moments before it: behind it in the log are only the other
/// appends in flight then (at most a frame per connection). 64 MiB reads in well under a second
/// from the page cache, once per partition.
pub const PRODUCER_TAIL_SCAN_BYTES: u64 = 64 * 1024 * 1024;

/// Producer ids handed out per millisecond of wall clock at most before ids run ahead of it:
/// each id is at least the clock in milliseconds times this, so a data directory started afresh
/// still never repeats an id (InitProducerId comes at most thousands of times a second).
pub const PRODUCER_IDS_PER_MS: i64 = 1 << 12;

/// How many producer ids one durable write of `kafka/producer-ids` reserves: one synced write per
/// 65,536 InitProducerId requests.
pub const PRODUCER_ID_BLOCK: i64 = 1 << 16;

/// The most consumer groups with members at once. A group lives in memory only while it has
/// members (its committed offsets are the hub's checkpoints); each holds at most
/// [`GROUP_METADATA_BYTES_MAX`], so this bounds the coordinator's memory. A JoinGroup for one
/// more gets COORDINATOR_NOT_AVAILABLE, which clients retry.
pub const GROUPS_MAX: usize = 1_000;

/// The most members (and member ids handed out) of one group: a hub has at most 1,024
/// partitions, and members beyond the partitions they share hold nothing. One more gets
/// GROUP_MAX_SIZE_REACHED, as Kafka's `group.max.size`.
pub const GROUP_MEMBERS_MAX: usize = 1_024;

/// The most protocol metadata and assignment bytes one group holds: a consumer's subscription
/// is its topics and, for cooperative-sticky, the partitions it owns (a few kilobytes), so a
/// mebibyte fits a full group of ordinary members. A join past it gets GROUP_MAX_SIZE_REACHED.
pub const GROUP_METADATA_BYTES_MAX: usize = 1024 * 1024;

/// The most protocols (assignors) one JoinGroup may offer: clients offer one to three.
pub const GROUP_PROTOCOLS_MAX: usize = 16;

/// How long a new group's first rebalance waits for more members: Kafka's
/// `group.initial.rebalance.delay.ms` default. Consumers started together then get one
/// rebalance rather than one per member.
pub const GROUP_INITIAL_REBALANCE_DELAY: Duration = Duration::from_secs(3);

/// The shortest and longest session timeout a member may ask for: Kafka's
/// `group.min.session.timeout.ms` and `group.max.session.timeout.ms` defaults. Outside them a
/// JoinGroup gets INVALID_SESSION_TIMEOUT.
pub const GROUP_SESSION_TIMEOUT_MIN: Duration = Duration::from_secs(6);
/// See [`GROUP_SESSION_TIMEOUT_MIN`].
pub const GROUP_SESSION_TIMEOUT_MAX: Duration = Duration::from_secs(30 * 60);

/// The longest a rebalance waits for a member to rejoin, whatever it asks (librdkafka asks for
/// its `max.poll.interval.ms`, 5 minutes by default): a member that asks for a day would hold
/// its whole group for a day.
pub const GROUP_REBALANCE_TIMEOUT_MAX: Duration = Duration::from_secs(30 * 60);

/// The longest metadata string an OffsetCommit may carry: Kafka's `offset.metadata.max.bytes`.
/// A longer one gets OFFSET_METADATA_TOO_LARGE. (The hub's checkpoints keep no metadata:
/// OffsetFetch answers an empty one.)
pub const OFFSET_METADATA_BYTES_MAX: usize = 4096;

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
const _: () = assert!(PRODUCER_BATCHES_KEPT >= 5);
const _: () = assert!(PRODUCER_TAIL_SCAN_BYTES >= FRAME_BYTES_MAX_DEFAULT as u64);
// Ids stay below i64::MAX for centuries: 2^41 ms (year 2039) times 2^12 is 2^53.
const _: () = assert!(PRODUCER_IDS_PER_MS <= 1 << 20);
const _: () = assert!(GROUP_SESSION_TIMEOUT_MIN.as_secs() < GROUP_SESSION_TIMEOUT_MAX.as_secs());
const _: () = assert!(GROUP_MEMBERS_MAX > 0 && GROUPS_MAX > 0 && GROUP_PROTOCOLS_MAX > 0);
