//! A Kafka cluster for tests and benchmarks to write to and read back from: any broker reachable
//! with [`KafkaOptions`] — a Tansu broker ([`crate::tansu`]), Tributary's own Kafka door, or a
//! real cluster. Topics are created with the admin API and records produced with librdkafka,
//! so what a test sets up goes through the same protocol as what it checks.
//!
//! [`TestCluster::produce`] sends one record per batch, waiting for each acknowledgement before
//! the next: Tansu 0.6.0 reports a wrong high watermark after multi-record batches, and one
//! record per batch keeps every broker's watermarks right.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};

use crate::options::KafkaOptions;

/// How long a produce or topic creation may take before the test fails.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A record for [`TestCluster::produce`].
#[derive(Debug, Clone, Default)]
pub struct TestRecord {
    /// The key, if any.
    pub key: Option<Vec<u8>>,
    /// The value.
    pub value: Vec<u8>,
    /// Headers (name, value), in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    /// The CreateTime, in ms since the Unix epoch; the producer's clock when `None`.
    pub timestamp_ms: Option<i64>,
}

/// A cluster reached with `options`; its helpers panic (failing the test) when the cluster
/// refuses.
#[derive(Debug, Clone)]
pub struct TestCluster {
    options: KafkaOptions,
}

impl TestCluster {
    /// The cluster `options` reach.
    pub fn new(options: KafkaOptions) -> TestCluster {
        TestCluster { options }
    }

    /// The options that reach the cluster.
    pub fn options(&self) -> KafkaOptions {
        self.options.clone()
    }

    /// The cluster's bootstrap servers (`host:port`).
    pub fn bootstrap_servers(&self) -> &str {
        &self.options.bootstrap_servers
    }

    /// Creates a topic with `partitions` partitions; panics if the broker refuses.
    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        let admin: AdminClient<DefaultClientContext> = self
            .options()
            .client_config()
            .create()
            .expect("an admin client");
        let new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
        let results = admin
            .create_topics([&new_topic], &options)
            .await
            .expect("CreateTopics answered");
        for result in results {
            result.unwrap_or_else(|(name, code)| panic!("topic {name} not created: {code}"));
        }
    }

    /// A producer that acknowledges each record before the next is sent (`acks=all`).
    pub fn producer(&self) -> FutureProducer {
        self.options()
            .client_config()
            .set("acks", "all")
            .set("linger.ms", "0")
            .create()
            .expect("a producer")
    }

    /// Appends `records` to one partition, one record per batch (see the module docs); returns
    /// their offsets.
    pub async fn produce(&self, topic: &str, partition: i32, records: &[TestRecord]) -> Vec<i64> {
        let producer = self.producer();
        let mut offsets = Vec::with_capacity(records.len());
        for record in records {
            let mut headers = OwnedHeaders::new();
            for (key, value) in &record.headers {
                headers = headers.insert(Header {
                    key,
                    value: value.as_deref(),
                });
            }
            let mut kafka_record = FutureRecord::<[u8], [u8]>::to(topic)
                .partition(partition)
                .payload(&record.value[..])
                .headers(headers);
            if let Some(key) = &record.key {
                kafka_record = kafka_record.key(&key[..]);
            }
            if let Some(ms) = record.timestamp_ms {
                kafka_record = kafka_record.timestamp(ms);
            }
            let delivery = producer
                .send(kafka_record, REQUEST_TIMEOUT)
                .await
                .unwrap_or_else(|(e, _)| panic!("produce to {topic}/{partition}: {e}"));
            offsets.push(delivery.offset);
        }
        offsets
    }

    /// Group `group`'s committed offsets of `topic`'s partitions `0..partitions` (-1 where it
    /// has none), read as Kafka's tools read them (OffsetFetch).
    pub async fn committed_offsets(&self, group: &str, topic: &str, partitions: i32) -> Vec<i64> {
        let consumer = self.group_consumer(group);
        let mut wanted = TopicPartitionList::new();
        for partition in 0..partitions {
            wanted.add_partition(topic, partition);
        }
        let committed = tokio::task::spawn_blocking(move || {
            consumer.committed_offsets(wanted, REQUEST_TIMEOUT)
        })
        .await
        .expect("the lookup runs")
        .unwrap_or_else(|e| panic!("committed offsets of {group}: {e}"));
        committed
            .elements()
            .iter()
            .map(|element| match element.offset() {
                Offset::Offset(next) => next,
                _ => -1,
            })
            .collect()
    }

    /// Commits `offsets` (partition, next offset to read) of `topic` for group `group`, from
    /// outside the group, as `kafka-consumer-groups --reset-offsets` does.
    pub async fn commit_offsets(&self, group: &str, topic: &str, offsets: &[(i32, i64)]) {
        let consumer = self.group_consumer(group);
        let mut list = TopicPartitionList::new();
        for &(partition, next) in offsets {
            list.add_partition_offset(topic, partition, Offset::Offset(next))
                .expect("a valid offset");
        }
        tokio::task::spawn_blocking(move || consumer.commit(&list, CommitMode::Sync))
            .await
            .expect("the commit runs")
            .unwrap_or_else(|e| panic!("commit for {group}: {e}"));
    }

    /// A consumer of group `group` that never joins it.
    fn group_consumer(&self, group: &str) -> BaseConsumer {
        self.options
            .client_config()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .expect("a consumer")
    }
}
