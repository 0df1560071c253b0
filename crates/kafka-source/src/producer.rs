//! [`KafkaProducer`]: sends events to a Kafka topic, a batch at a time, each batch acknowledged
//! by the cluster (`acks=all`) before `send` returns — what a replication task's target needs
//! to checkpoint its source only after the copy is stored.
//!
//! The event → record rule is the one of every Kafka path, `tributary_eventhubs::kafka_record`
//! (the Kafka door's Fetch applies it too): value = the body, key = the partition key (or the
//! bytes property [`KEY_PROPERTY`]), CreateTime = [`TIMESTAMP_PROPERTY`] when the event has it
//! (else the producer's clock), headers = the other properties, typed values as their text
//! (`TypedValues::Text`: what a Kafka producer writes, not the AMQP encoding Event Hubs' own
//! endpoint gives). Content type, message and correlation ids have no Kafka field and are not
//! sent.
//!
//! Where a record goes: to the partition a [`Destination::Partition`] names; with a key, where
//! Kafka's own default partitioner (murmur2, as the Java client) puts the key, so the copy of a
//! keyed event lands where a Kafka producer would put it and one key's records stay in order
//! (the producer is idempotent, so retries neither reorder nor duplicate); without either, a
//! random partition.

use bytes::Bytes;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tributary_event::EventData;
use tributary_eventhubs::kafka_record::{self, TypedValues};

#[cfg(doc)]
use crate::mapping::{KEY_PROPERTY, TIMESTAMP_PROPERTY};
use crate::options::KafkaOptions;

/// Where a batch goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination<'a> {
    /// This partition.
    Partition(i32),
    /// Where this key hashes (Kafka's default partitioner); every record carries it as key.
    Key(&'a str),
    /// Each record by its own key, or to a random partition when it has none.
    Any,
}

/// Why a send failed, by what the caller can do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProduceError {
    /// Worth retrying as it is (a lost connection, a timeout, a leader election).
    #[error("{0}")]
    Transient(String),
    /// The cluster refused the records themselves (too large, invalid): retrying fails again.
    #[error("{0}")]
    Refused(String),
    /// The configuration is wrong (no such topic or partition, no right to write).
    #[error("{0}")]
    Misconfigured(String),
}

impl ProduceError {
    fn from_kafka(error: &KafkaError) -> ProduceError {
        let text = error.to_string();
        match error.rdkafka_error_code() {
            Some(
                RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidRecord,
            ) => ProduceError::Refused(text),
            Some(
                RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownPartition
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
                | RDKafkaErrorCode::SaslAuthenticationFailed
                | RDKafkaErrorCode::Authentication,
            ) => ProduceError::Misconfigured(text),
            _ => ProduceError::Transient(text),
        }
    }
}

/// A producer to one topic; see the [module docs](self).
pub struct KafkaProducer {
    producer: FutureProducer,
    topic: String,
}

impl std::fmt::Debug for KafkaProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaProducer")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

/// A record's parts, owned, ready to be borrowed by a `FutureRecord`.
struct OwnedRecord {
    key: Option<Bytes>,
    value: Bytes,
    headers: OwnedHeaders,
    timestamp_ms: Option<i64>,
}

impl KafkaProducer {
    /// A producer to `topic` on the cluster `options` reach (nothing is sent yet).
    pub fn new(
        options: &KafkaOptions,
        topic: impl Into<String>,
    ) -> Result<KafkaProducer, ProduceError> {
        let producer = options
            .client_config()
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("partitioner", "murmur2_random")
            .set("linger.ms", "5")
            .create()
            .map_err(|e| {
                ProduceError::Misconfigured(format!("cannot make the Kafka producer: {e}"))
            })?;
        Ok(KafkaProducer {
            producer,
            topic: topic.into(),
        })
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Sends `events` to `to` and waits until the cluster acknowledged every one; on an error
    /// some of them may be stored (a retry duplicates those).
    pub async fn send(
        &self,
        events: &[EventData],
        to: Destination<'_>,
    ) -> Result<(), ProduceError> {
        let records: Vec<OwnedRecord> = events.iter().map(|e| record_of(e, to)).collect();
        let mut deliveries = Vec::with_capacity(records.len());
        for record in &records {
            let mut kafka_record = FutureRecord::<[u8], [u8]>::to(&self.topic)
                .payload(&record.value[..])
                .headers(record.headers.clone());
            if let Destination::Partition(partition) = to {
                kafka_record = kafka_record.partition(partition);
            }
            if let Some(key) = &record.key {
                kafka_record = kafka_record.key(&key[..]);
            }
            if let Some(ms) = record.timestamp_ms {
                kafka_record = kafka_record.timestamp(ms);
            }
            let delivery = self
                .producer
                .send_result(kafka_record)
                .map_err(|(e, _)| ProduceError::from_kafka(&e))?;
            deliveries.push(delivery);
        }
        // Every record is queued before the first wait: librdkafka batches them.
        for delivery in deliveries {
            match delivery.await {
                Ok(Ok(_)) => {}
                Ok(Err((error, _))) => return Err(ProduceError::from_kafka(&error)),
                Err(_canceled) => {
                    return Err(ProduceError::Transient("the producer stopped".to_owned()));
                }
            }
        }
        Ok(())
    }
}

/// The record an event becomes (see the module docs); a [`Destination::Key`] is the record's
/// key, whatever the event's own.
fn record_of(event: &EventData, to: Destination<'_>) -> OwnedRecord {
    let mut event = event.clone();
    if let Destination::Key(key) = to {
        event.partition_key = Some(key.to_owned());
    }
    let fields = kafka_record::record_from_event(event, TypedValues::Text);
    let mut headers = OwnedHeaders::new_with_capacity(fields.headers.len());
    for (name, value) in &fields.headers {
        headers = headers.insert(Header {
            key: name.as_str(),
            value: value.as_deref(),
        });
    }
    OwnedRecord {
        key: fields.key,
        value: fields.value,
        headers,
        timestamp_ms: fields.create_time_ms,
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::message::Headers;
    use tributary_event::PropertyValue;

    use super::*;
    use crate::mapping::{KEY_PROPERTY, TIMESTAMP_PROPERTY};

    #[test]
    fn an_event_becomes_a_record_as_the_kafka_door_fetches_it() {
        let event = EventData {
            partition_key: Some("user-1".to_owned()),
            ..EventData::new("body")
        }
        .with_property(TIMESTAMP_PROPERTY, PropertyValue::Timestamp(7))
        .with_property("n", PropertyValue::Int64(-3))
        .with_property("b", PropertyValue::Bytes(Bytes::from_static(b"\xff")))
        .with_property("z", PropertyValue::Null)
        .with_property("u", PropertyValue::Uuid([0xab; 16]));
        let record = record_of(&event, Destination::Any);
        assert_eq!(record.key.as_deref(), Some(&b"user-1"[..]));
        assert_eq!(record.timestamp_ms, Some(7));
        assert_eq!(&record.value[..], b"body");
        let headers: Vec<(&str, Option<&[u8]>)> =
            record.headers.iter().map(|h| (h.key, h.value)).collect();
        assert_eq!(
            headers,
            [
                ("n", Some(&b"-3"[..])),
                ("b", Some(&b"\xff"[..])),
                ("z", None),
                ("u", Some(&b"abababab-abab-abab-abab-abababababab"[..])),
            ]
        );
    }

    #[test]
    fn a_binary_key_property_is_the_key_and_a_destination_key_wins() {
        let event = EventData::new("x").with_property(
            KEY_PROPERTY,
            PropertyValue::Bytes(Bytes::from_static(b"\x00")),
        );
        assert_eq!(
            record_of(&event, Destination::Any).key.as_deref(),
            Some(&b"\x00"[..])
        );
        let keyed = record_of(&event, Destination::Key("k"));
        assert_eq!(keyed.key.as_deref(), Some(&b"k"[..]));
        // The property that could not be the key stays a header.
        assert_eq!(keyed.headers.count(), 1);
    }
}
