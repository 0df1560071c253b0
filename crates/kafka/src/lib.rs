//! Tributary's Kafka front door: Kafka clients (librdkafka and the clients on it, kafka-python,
//! …) produce to and fetch from the hub's event hubs unmodified, as they do with Event Hubs'
//! Kafka endpoint: a topic is an event hub, a Kafka partition a partition, a Kafka offset an
//! event's sequence number.
//!
//! `tributary serve` starts it on `--kafka-port` (SASL_PLAINTEXT, 9092) and, with a
//! certificate, `--kafka-tls-port` (SASL_SSL, 9093), as Event Hubs serves Kafka clients; see
//! [`KafkaConfig`].
//!
//! # What it serves
//! - **ApiVersions**, with the UNSUPPORTED_VERSION fallback ([`versions`] lists what is
//!   advertised).
//! - **SASL PLAIN** with the user `$ConnectionString` and a connection string (or a SAS token)
//!   as the password, checked against the shared access policies (`tributary_amqp`'s, reused;
//!   see [`sasl`]). The login's rights are enforced per request: Send to produce, Listen to
//!   fetch and list offsets; a missing right answers TOPIC_AUTHORIZATION_FAILED.
//! - **Metadata** (this node leads every partition, at the advertised host and port),
//!   **Produce** (acks 0, 1 and all; record batches v2, uncompressed, gzip, snappy, lz4 or
//!   zstd), **InitProducerId**, **ListOffsets** and **Fetch** (long polls woken by appends).
//! - **Idempotent producers**: a batch with a producer id is checked against its producer's
//!   sequence numbers as Kafka checks them, so a retry is acknowledged once and never stored
//!   twice, across restarts and `kill -9` too (see `producers`).
//! - **Topic administration**: CreateTopics, DeleteTopics, CreatePartitions (refused: a hub's
//!   partition count is fixed), DescribeConfigs and DescribeCluster, Manage needed to change
//!   anything (see `admin`).
//! - **Consumer groups** (the classic protocol): FindCoordinator, JoinGroup, SyncGroup,
//!   Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups and
//!   DeleteGroups. A Kafka group is the hub's consumer group of that name in each topic it
//!   reads: its committed offsets are that consumer group's checkpoints, its assignment its
//!   ownership records, so `tributary group`, the admin API and the dashboard show them and
//!   they survive a restart (see `groups`).
//!
//! - **Transactions** are refused: FindCoordinator for a transaction and InitProducerId with a
//!   transactional id answer TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which a transactional
//!   producer reports at once as fatal.
//!
//! How a record's value, key, headers and timestamp become an event's body, partition key and
//! application properties, and back, is `tributary_eventhubs::kafka_record`, the one rule of
//! every Kafka path; [`mapping`] adapts the codec's records to it.
//!
//! # Guarantees
//! - Authentication is on unless [`KafkaConfig::development_unauthenticated`] is set: before a
//!   login only ApiVersions and SASL are answered, within a deadline (which over TLS also
//!   bounds the handshake) and a byte allowance, and connections are capped in total and per
//!   address ([`limits`]).
//! - A request that does not decode closes its connection; a bad record batch is an error code
//!   for its partition (see below for how the codec's allocations are bounded).
//! - A produce is acknowledged only once stored; no key or token is ever logged.
//!
//! # The codec's up-front allocations
//! `kafka-protocol` 0.18.0 sizes a vector by the element count a request claims before reading
//! any element (`Array`/`CompactArray` decoding, a record batch's record count, a record's
//! header count): a few bytes claiming two billion elements would make it ask for tens of
//! gigabytes, and a failed allocation aborts the process. The door keeps every claim within
//! the bytes that carry it before the codec sees it: request bodies through a bounded probe
//! ([`bounded`]), record batches through a check of their records ([`batches`]). The fuzz
//! targets `kafka_request` and `kafka_authenticated` (`crates/fuzz`) run [`request::decode`]
//! as the door does, before and after a login.

#![forbid(unsafe_code)]

mod admin;
pub mod batches;
pub mod bounded;
mod connection;
pub mod error;
mod fetch;
mod groups;
pub mod limits;
pub mod mapping;
pub mod metadata;
mod offsets;
mod produce;
mod producers;
pub mod request;
pub mod sasl;
mod server;
pub mod versions;

pub use error::KafkaError;
pub use groups::decode_consumer_protocol;
pub use limits::KafkaLimits;
pub use server::{KafkaConfig, RunningKafkaServer, start};
