//! A Kafka record of the wire codec and a hub event, each way: the codec's [`Record`] to and
//! from the parts of the one rule of every Kafka path, `tributary_eventhubs::kafka_record`
//! (key, value, headers, CreateTime; AMQP-typed properties AMQP-encoded for Kafka consumers,
//! as Event Hubs does).
//!
//! What the door adds: a fetched record's **offset** is the event's sequence number (dense from
//! 0, as Kafka offsets are, with gaps where a compacted hub removed events), a keyed event with
//! an empty body (a tombstone) has a null value, its timestamp type is CreateTime, and a produced record's size is
//! counted for the 1 MiB limit over its value, key and headers.

use bytes::Bytes;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    NO_PARTITION_LEADER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, Record, TimestampType,
};
use tributary_event::{EventData, ReceivedEvent};
use tributary_eventhubs::kafka_record::{self, TypedValues};

pub use tributary_eventhubs::kafka_record::{KEY_PROPERTY, TIMESTAMP_PROPERTY};

/// A record's size as the 1 MiB limit counts it: value, key and headers.
pub fn record_bytes(record: &Record) -> usize {
    let len = |b: &Option<Bytes>| b.as_ref().map_or(0, Bytes::len);
    let headers: usize = record
        .headers
        .iter()
        .map(|(name, value)| name.len() + len(value))
        .sum();
    len(&record.value) + len(&record.key) + headers
}

/// The event a produced record becomes.
pub fn event_from_record(record: Record) -> EventData {
    let create_time =
        (record.timestamp_type == TimestampType::Creation).then_some(record.timestamp);
    let headers = record
        .headers
        .iter()
        .map(|(name, value)| (name.as_str(), value.clone()));
    kafka_record::event_from_record(record.key, record.value, headers, create_time)
}

/// The record a stored event is fetched as. `first_sequence` is the sequence number of the
/// first record of its batch.
pub fn record_from_event(event: ReceivedEvent, first_sequence: i64) -> Record {
    let fields = kafka_record::record_from_event(event.data, TypedValues::AmqpEncoded);
    // A key and an empty body is a tombstone (as the log defines it, and as a Kafka producer's
    // null value is stored): Kafka consumers get it with a null value, as from a compacted topic.
    let tombstone = fields.key.is_some() && fields.value.is_empty();
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
        producer_id: NO_PRODUCER_ID,
        producer_epoch: NO_PRODUCER_EPOCH,
        timestamp_type: TimestampType::Creation,
        offset: event.sequence_number,
        // With no producer id the batch's base sequence is -1; the encoder keeps records in one
        // batch while offset − sequence is constant.
        sequence: (event.sequence_number - first_sequence - 1) as i32,
        timestamp: fields.create_time_ms.unwrap_or(event.enqueued_time_ms),
        key: fields.key,
        value: (!tombstone).then_some(fields.value),
        headers: fields
            .headers
            .into_iter()
            .map(|(name, value)| (StrBytes::from_string(name.to_string()), value))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use tributary_event::PropertyValue;

    use super::*;

    fn produced(key: Option<&[u8]>, timestamp: i64) -> Record {
        let mut record = record_from_event(
            ReceivedEvent {
                sequence_number: 0,
                offset: 0,
                enqueued_time_ms: 0,
                data: EventData::new("body"),
            },
            0,
        );
        record.key = key.map(Bytes::copy_from_slice);
        record.timestamp = timestamp;
        record
            .headers
            .insert("h".into(), Some(Bytes::from_static(b"\xff\x00")));
        record.headers.insert("n".into(), None);
        record
    }

    #[test]
    fn a_record_round_trips_through_an_event_at_its_sequence_number() {
        for key in [Some(&b"user-1"[..]), Some(&b"\xff\xfe"[..]), None] {
            let event = event_from_record(produced(key, 1_700_000_000_123));
            assert_eq!(&event.body[..], b"body");
            let stored = ReceivedEvent {
                sequence_number: 7,
                offset: 99,
                enqueued_time_ms: 5,
                data: event,
            };
            let back = record_from_event(stored, 7);
            assert_eq!(back.offset, 7);
            assert_eq!(back.sequence, -1);
            assert_eq!(back.timestamp, 1_700_000_000_123);
            assert_eq!(back.key.as_deref(), key);
            assert_eq!(back.headers.len(), 2);
            assert_eq!(
                back.headers[&StrBytes::from_static_str("h")].as_deref(),
                Some(&b"\xff\x00"[..])
            );
            assert_eq!(back.headers[&StrBytes::from_static_str("n")], None);
        }
    }

    #[test]
    fn a_tombstone_round_trips_with_a_null_value_and_an_empty_keyless_body_stays_empty() {
        let mut tombstone = produced(Some(b"user-1"), 0);
        tombstone.value = None;
        let event = event_from_record(tombstone);
        assert!(event.body.is_empty());
        let stored = |data| ReceivedEvent {
            sequence_number: 0,
            offset: 0,
            enqueued_time_ms: 0,
            data,
        };
        assert_eq!(record_from_event(stored(event), 0).value, None);
        let keyless = EventData::new(Bytes::new());
        assert_eq!(
            record_from_event(stored(keyless), 0).value.as_deref(),
            Some(&b""[..])
        );
    }

    #[test]
    fn events_from_other_doors_get_their_enqueued_time_and_encoded_headers() {
        let data = EventData::new("x").with_property("s", PropertyValue::String("hi".into()));
        let event = ReceivedEvent {
            sequence_number: 3,
            offset: 0,
            enqueued_time_ms: 42,
            data,
        };
        let record = record_from_event(event, 0);
        assert_eq!(record.timestamp, 42);
        assert_eq!(record.sequence, 2);
        assert_eq!(
            record.headers[&StrBytes::from_static_str("s")].as_deref(),
            Some(&b"\xa1\x02hi"[..])
        );
    }
}
