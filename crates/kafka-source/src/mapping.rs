//! How a record read from a Kafka cluster becomes a [`ReceivedEvent`].
//!
//! The record → event rule is the one Tributary's Kafka door applies to a produced record
//! (`tributary-kafka`'s `mapping` module), so an event looks the same whichever way it came from
//! Kafka:
//! - **value** → the body (a tombstone, a null value, becomes an empty body);
//! - **key** → the partition key when it is UTF-8, else the bytes property [`KEY_PROPERTY`];
//! - **headers** → application properties with bytes values (a null header value is a null
//!   property; a header named twice keeps its last value; headers named [`KEY_PROPERTY`] or
//!   [`TIMESTAMP_PROPERTY`] are dropped, since they would read back as the record's own key or
//!   time);
//! - **CreateTime** → the timestamp property [`TIMESTAMP_PROPERTY`].
//!
//! What the door's rule does not cover, because a hub assigns it there, comes from the cluster:
//! - **sequence number = offset**: Kafka offsets are dense from the log start, as sequence
//!   numbers are (a compacted topic has gaps; the processor never assumes density);
//! - **offset = the Kafka offset** too, so a checkpoint's offset is a Kafka offset, and a
//!   receiver opened at `Offset { offset, inclusive: false }` resumes at `offset + 1`;
//! - **enqueued time = the record's timestamp**: the broker's LogAppendTime where the topic
//!   uses it, else the producer's CreateTime (which, unlike a hub's enqueued time, may go
//!   backwards within a partition), and 0 when the record has none (pre-0.10 message format).

use bytes::Bytes;
use rdkafka::Message;
use rdkafka::message::{BorrowedMessage, Headers, Timestamp};
use tributary_event::{EventData, PropertyValue, ReceivedEvent, SmolStr};

/// The application property holding a record's CreateTime (a timestamp value); the same name
/// as the Kafka door's.
pub const TIMESTAMP_PROPERTY: &str = "x-opt-kafka-timestamp";

/// The application property holding a key that is not UTF-8 (a bytes value); the same name as
/// the Kafka door's.
pub const KEY_PROPERTY: &str = "x-opt-kafka-key";

/// A record's parts, borrowed from wherever it was read.
#[derive(Debug, Clone, Copy)]
pub struct RecordParts<'a> {
    /// The record's offset in its partition.
    pub offset: i64,
    /// The key, if any.
    pub key: Option<&'a [u8]>,
    /// The value, if any.
    pub value: Option<&'a [u8]>,
    /// The timestamp and its kind.
    pub timestamp: Timestamp,
}

/// The event a record read from Kafka becomes (see the module docs); `headers` in record order.
pub fn event_from_record<'a>(
    record: RecordParts<'_>,
    headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
) -> ReceivedEvent {
    assert!(record.offset >= 0, "a record read has a real offset");
    let mut data = EventData::new(Bytes::copy_from_slice(record.value.unwrap_or_default()));
    for (name, value) in headers {
        if name == TIMESTAMP_PROPERTY || name == KEY_PROPERTY {
            continue;
        }
        let name = SmolStr::new(name);
        let value = value.map_or(PropertyValue::Null, |v| {
            PropertyValue::Bytes(Bytes::copy_from_slice(v))
        });
        data.properties.retain(|(k, _)| *k != name);
        data.properties.push((name, value));
    }
    if let Some(key) = record.key {
        match std::str::from_utf8(key) {
            Ok(key) => data.partition_key = Some(key.to_owned()),
            Err(_) => data.properties.push((
                KEY_PROPERTY.into(),
                PropertyValue::Bytes(Bytes::copy_from_slice(key)),
            )),
        }
    }
    let enqueued_time_ms = match record.timestamp {
        Timestamp::CreateTime(ms) if ms >= 0 => {
            data.properties
                .push((TIMESTAMP_PROPERTY.into(), PropertyValue::Timestamp(ms)));
            ms
        }
        Timestamp::LogAppendTime(ms) if ms >= 0 => ms,
        _ => 0,
    };
    ReceivedEvent {
        sequence_number: record.offset,
        offset: record.offset.unsigned_abs(),
        enqueued_time_ms,
        data,
    }
}

/// The event a message librdkafka delivered becomes.
pub(crate) fn event_from_message(message: &BorrowedMessage<'_>) -> ReceivedEvent {
    let parts = RecordParts {
        offset: message.offset(),
        key: message.key(),
        value: message.payload(),
        timestamp: message.timestamp(),
    };
    match message.headers() {
        Some(headers) => event_from_record(parts, headers.iter().map(|h| (h.key, h.value))),
        None => event_from_record(parts, std::iter::empty()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(key: Option<&'static [u8]>, timestamp: Timestamp) -> RecordParts<'static> {
        RecordParts {
            offset: 41,
            key,
            value: Some(b"body"),
            timestamp,
        }
    }

    #[test]
    fn key_headers_and_create_time_map_as_the_kafka_door_maps_them() {
        let headers = [
            ("h", Some(&b"\xff\x00"[..])),
            ("n", None),
            ("h", Some(&b"last"[..])),
            (TIMESTAMP_PROPERTY, Some(&b"forged"[..])),
        ];
        let event = event_from_record(
            record(Some(b"user-1"), Timestamp::CreateTime(1_700_000_000_123)),
            headers,
        );
        assert_eq!(event.sequence_number, 41);
        assert_eq!(event.offset, 41);
        assert_eq!(event.enqueued_time_ms, 1_700_000_000_123);
        assert_eq!(&event.data.body[..], b"body");
        assert_eq!(event.data.partition_key.as_deref(), Some("user-1"));
        assert_eq!(
            event.data.properties,
            vec![
                ("n".into(), PropertyValue::Null),
                (
                    "h".into(),
                    PropertyValue::Bytes(Bytes::from_static(b"last"))
                ),
                (
                    TIMESTAMP_PROPERTY.into(),
                    PropertyValue::Timestamp(1_700_000_000_123)
                ),
            ]
        );
    }

    #[test]
    fn a_binary_key_is_a_property_and_log_append_time_is_only_the_enqueued_time() {
        let event = event_from_record(record(Some(b"\xff\xfe"), Timestamp::LogAppendTime(5)), []);
        assert_eq!(event.data.partition_key, None);
        assert_eq!(event.enqueued_time_ms, 5);
        assert_eq!(
            event.data.properties,
            vec![(
                KEY_PROPERTY.into(),
                PropertyValue::Bytes(Bytes::from_static(b"\xff\xfe"))
            )]
        );
    }

    #[test]
    fn a_tombstone_is_an_empty_body_and_a_missing_time_is_zero() {
        let parts = RecordParts {
            value: None,
            ..record(None, Timestamp::NotAvailable)
        };
        let event = event_from_record(parts, []);
        assert!(event.data.body.is_empty());
        assert_eq!(event.enqueued_time_ms, 0);
        assert!(event.data.properties.is_empty());
    }
}
