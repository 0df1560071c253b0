//! Kafka as an engine for Tributary's processor host and replication tasks: a
//! [`PartitionSource`](tributary_source::PartitionSource) over a Kafka cluster — Apache Kafka,
//! Redpanda, Azure Event Hubs' Kafka endpoint, Tributary's own Kafka door, Tansu — through
//! librdkafka (the `rdkafka` crate).
//!
//! [`KafkaSource`] makes a topic look like an event hub, so nothing above it knows which engine
//! it reads: the host balances the topic's partitions, keeps ownership and checkpoints in any
//! Tributary checkpoint store, and resumes each partition after its checkpoint. What it maps:
//! - topic → event hub, partition `n` → partition id `"n"`, partition count from metadata;
//! - a record's **offset** → both the event's sequence number and its offset (a checkpoint is
//!   a Kafka offset);
//! - **key**, **headers**, **CreateTime** → partition key, properties and a timestamp property,
//!   by the rule Tributary's Kafka door uses ([`mapping`]);
//! - the partition's **watermarks** → [`KafkaSource::partition_extent`] and the receivers'
//!   last-enqueued properties.
//!
//! Partitions are read by assignment, not through a Kafka consumer group: the processor's own
//! ownership decides who reads what, and the epoch rules hold among one source's receivers (see
//! `epochs` for how fencing works across processes). Connection settings — bootstrap servers,
//! SASL PLAIN or SCRAM, TLS, Event Hubs' `$ConnectionString` convention — are [`KafkaOptions`].
//!
//! [`KafkaProducer`] sends events to a topic (a replication task's Kafka target), mapping them
//! back to records by the same rule.
//!
//! [`KafkaOffsetsStore`] is the processor's `kafka:` checkpoint store: checkpoints committed as
//! the Kafka consumer group's offsets too, so Kafka's tools see a processor's progress.
//!
//! [`tansu`] starts a Tansu broker for tests and benchmarks; [`test_cluster`] creates topics and
//! produces records on any cluster (Tansu, Tributary's Kafka door) for them.
//!
//! Everything here is behind the `kafka` feature, off by default, because librdkafka is built
//! from C source: without it the crate is empty, and a workspace build does not compile
//! librdkafka.

#[cfg(feature = "kafka")]
mod checkpoints;
#[cfg(feature = "kafka")]
mod epochs;
#[cfg(feature = "kafka")]
mod error;
#[cfg(feature = "kafka")]
pub mod limits;
#[cfg(feature = "kafka")]
pub mod mapping;
#[cfg(feature = "kafka")]
mod options;
#[cfg(feature = "kafka")]
mod producer;
#[cfg(feature = "kafka")]
mod ready;
#[cfg(feature = "kafka")]
mod receiver;
#[cfg(feature = "kafka")]
mod source;
#[cfg(feature = "kafka")]
pub mod tansu;
#[cfg(feature = "kafka")]
pub mod test_cluster;

#[cfg(feature = "kafka")]
pub use checkpoints::KafkaOffsetsStore;
#[cfg(feature = "kafka")]
pub use options::{
    CONNECTION_STRING_USER, ConnectionStringError, EVENT_HUBS_KAFKA_TLS_PORT, KAFKA_PLAINTEXT_PORT,
    KafkaOptions, Sasl, SaslMechanism, Tls,
};
#[cfg(feature = "kafka")]
pub use producer::{Destination, KafkaProducer, ProduceError};
#[cfg(feature = "kafka")]
pub use source::{KafkaSource, PartitionExtent};

#[cfg(feature = "kafka")]
/// The librdkafka version this build links, e.g. `"2.12.1"`.
pub fn librdkafka_version() -> String {
    rdkafka::util::get_rdkafka_version().1
}
