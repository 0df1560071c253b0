//! How a record read from a Kafka cluster becomes a [`ReceivedEvent`].
//!
//! Key, value, headers and CreateTime map by the one rule of every Kafka path,
//! `tributary_eventhubs::kafka_record` (the Kafka door's too), so an event looks the same
//! whichever way it came from Kafka. What that rule does not cover, because a hub assigns it
//! there, comes from the cluster:
//! - **sequence number = offset**: Kafka offsets are dense from the log start, as sequence
//!   numbers are (a compacted topic has gaps; the processor never assumes density);
//! - **offset = the Kafka offset** too, so a checkpoint's offset is a Kafka offset, and a
//!   receiver opened at `Offset { offset, inclusive: false }` resumes at `offset + 1`;
//! - **enqueued time = the record's timestamp**: the broker's LogAppendTime where the topic
//!   uses it, else the producer's CreateTime (which, unlike a hub's enqueued time, may go
//!   backwards within a partition), and 0 when the record has none (pre-0.10 message format).

use bytes::Bytes;
use rdkafka::message::Timestamp;
use tributary_event::ReceivedEvent;
use tributary_eventhubs::kafka_record;

use crate::limits::PROPERTY_ROOM;

pub use tributary_eventhubs::kafka_record::{KEY_PROPERTY, TIMESTAMP_PROPERTY};

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
    let (create_time, enqueued_time_ms) = match record.timestamp {
        Timestamp::CreateTime(ms) if ms >= 0 => (Some(ms), ms),
        Timestamp::LogAppendTime(ms) if ms >= 0 => (None, ms),
        _ => (None, 0),
    };
    let data = kafka_record::event_from_record_with_room(
        record.key.map(Bytes::copy_from_slice),
        record.value.map(Bytes::copy_from_slice),
        headers
            .into_iter()
            .map(|(name, value)| (name, value.map(Bytes::copy_from_slice))),
        create_time,
        PROPERTY_ROOM,
    );
    ReceivedEvent {
        sequence_number: record.offset,
        offset: record.offset.unsigned_abs(),
        enqueued_time_ms,
        data,
    }
}

#[cfg(test)]
mod tests {
    use tributary_event::PropertyValue;

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
    fn the_property_list_has_room_for_a_replication_stamp() {
        let event = event_from_record(
            record(None, Timestamp::CreateTime(7)),
            [("h", Some(&b"v"[..]))],
        );
        let properties = &event.data.properties;
        assert_eq!(properties.len(), 2, "the header and the CreateTime");
        assert!(
            properties.capacity() >= properties.len() + PROPERTY_ROOM,
            "room for {PROPERTY_ROOM} more without growing: capacity {}",
            properties.capacity()
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
