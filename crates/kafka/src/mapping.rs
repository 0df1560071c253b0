//! How a Kafka record and a hub event map to each other: the one place that rule lives.
//!
//! # Kafka record → event (Produce)
//! - **value** → the event's body (a null value, a tombstone, becomes an empty body).
//! - **key** → the event's partition key, so an AMQP consumer sees it where Event Hubs puts a
//!   Kafka key (the partition key annotation). A key that is not UTF-8 cannot be a partition key
//!   (a string); it is kept as the bytes property [`KEY_PROPERTY`] instead.
//! - **headers** → application properties with bytes values (a null header value becomes a
//!   null property), as Event Hubs documents for exchanging events between Kafka and AMQP: an
//!   AMQP consumer reads each header as a byte array.
//! - **timestamp** (CreateTime) → the timestamp property [`TIMESTAMP_PROPERTY`]: the event model
//!   has no field for a producer's time, and the hub's enqueued time is its own.
//!
//! # Event → Kafka record (Fetch)
//! - **offset** = the event's sequence number (dense from 0, as Kafka offsets are).
//! - **value** = the body; **key** = the partition key's UTF-8 bytes, or [`KEY_PROPERTY`].
//! - **timestamp** = [`TIMESTAMP_PROPERTY`] when the event has it (CreateTime), else the
//!   enqueued time.
//! - **headers** = the other application properties. Bytes (what a Kafka producer's headers
//!   become, and an AMQP binary) as they are; null as a null header; every other value —
//!   string, number, boolean, timestamp, UUID, as an AMQP or HTTPS producer sets them — as its
//!   AMQP encoding, type constructor included (a string `hello` is `a1 05 68 65 6c 6c 6f`), as
//!   Event Hubs documents for exchanging events between protocols: "a Kafka consumer sees the
//!   raw AMQP-encoded byte sequence, including the AMQP type information", to be read with an
//!   AMQP deserializer. (Event Hubs would encode an AMQP binary too; here it is given raw, since
//!   a stored bytes property does not record which door wrote it, and a Kafka header must come
//!   back to a Kafka consumer unchanged.)

use bytes::Bytes;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    NO_PARTITION_LEADER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, Record, TimestampType,
};
use tributary_event::{EventData, PropertyValue, ReceivedEvent, SmolStr};

/// The application property holding a record's CreateTime (a timestamp value).
pub const TIMESTAMP_PROPERTY: &str = "x-opt-kafka-timestamp";

/// The application property holding a key that is not UTF-8 (a bytes value).
pub const KEY_PROPERTY: &str = "x-opt-kafka-key";

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

/// The event a produced record becomes (see the module docs).
pub fn event_from_record(record: Record) -> EventData {
    let mut event = EventData::new(record.value.unwrap_or_default());
    for (name, value) in record.headers {
        let name = SmolStr::new(name.as_str());
        if name == TIMESTAMP_PROPERTY || name == KEY_PROPERTY {
            // Reserved for this mapping: a header of that name would be read back as the
            // record's own timestamp or key.
            continue;
        }
        let value = value.map_or(PropertyValue::Null, PropertyValue::Bytes);
        // Kafka allows a header name twice; a property key is unique: the last one wins.
        event.properties.retain(|(k, _)| *k != name);
        event.properties.push((name, value));
    }
    if let Some(key) = record.key {
        match String::from_utf8(key.to_vec()) {
            Ok(key) => event.partition_key = Some(key),
            Err(_) => event
                .properties
                .push((KEY_PROPERTY.into(), PropertyValue::Bytes(key))),
        }
    }
    if record.timestamp_type == TimestampType::Creation && record.timestamp >= 0 {
        event.properties.push((
            TIMESTAMP_PROPERTY.into(),
            PropertyValue::Timestamp(record.timestamp),
        ));
    }
    event
}

/// The record a stored event is fetched as (see the module docs). `first_sequence` is the
/// sequence number of the first record of its batch.
pub fn record_from_event(event: ReceivedEvent, first_sequence: i64) -> Record {
    let data = event.data;
    let mut timestamp = event.enqueued_time_ms;
    let mut key = data.partition_key.map(Bytes::from);
    let mut record = Record {
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
        timestamp: 0,
        key: None,
        value: Some(data.body),
        headers: Default::default(),
    };
    for (name, value) in data.properties {
        match (name.as_str(), value) {
            (TIMESTAMP_PROPERTY, PropertyValue::Timestamp(ms)) => timestamp = ms,
            (KEY_PROPERTY, PropertyValue::Bytes(bytes)) if key.is_none() => key = Some(bytes),
            (_, value) => {
                let name = StrBytes::from_string(name.to_string());
                record.headers.insert(name, header_value(value));
            }
        }
    }
    record.timestamp = timestamp;
    record.key = key;
    record
}

/// A property's value as a header's bytes (see the module docs).
fn header_value(value: PropertyValue) -> Option<Bytes> {
    match value {
        PropertyValue::Null => None,
        PropertyValue::Bytes(bytes) => Some(bytes),
        typed => Some(Bytes::from(tributary_eventhubs::deliver::encoded_property(
            &typed,
        ))),
    }
}

#[cfg(test)]
mod tests {
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
    fn a_record_round_trips_through_an_event() {
        for key in [Some(&b"user-1"[..]), Some(&b"\xff\xfe"[..]), None] {
            let event = event_from_record(produced(key, 1_700_000_000_123));
            assert_eq!(&event.body[..], b"body");
            let key_is_text = key.is_some_and(|k| std::str::from_utf8(k).is_ok());
            assert_eq!(event.partition_key.is_some(), key_is_text);
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
    fn events_from_other_doors_get_amqp_encoded_headers_and_their_enqueued_time() {
        let data = EventData::new("x")
            .with_property("s", PropertyValue::String("hello".into()))
            .with_property("i", PropertyValue::Int64(-3))
            .with_property("t", PropertyValue::Bool(true))
            .with_property("u", PropertyValue::Uuid([0xab; 16]));
        let event = ReceivedEvent {
            sequence_number: 3,
            offset: 0,
            enqueued_time_ms: 42,
            data,
        };
        let record = record_from_event(event, 0);
        assert_eq!(record.timestamp, 42);
        assert_eq!(record.sequence, 2);
        let header = |name: &'static str| record.headers[&StrBytes::from_static_str(name)].clone();
        // str8-utf8, smalllong, true, uuid: the AMQP constructors and their data.
        assert_eq!(header("s").as_deref(), Some(&b"\xa1\x05hello"[..]));
        assert_eq!(header("i").as_deref(), Some(&[0x55, 0xfd][..]));
        assert_eq!(header("t").as_deref(), Some(&[0x41][..]));
        let mut uuid = vec![0x98];
        uuid.extend([0xab; 16]);
        assert_eq!(header("u").as_deref(), Some(&uuid[..]));
    }
}
