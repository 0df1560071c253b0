//! How a Kafka record and an event map to each other: the one rule every Kafka path of
//! Tributary applies (the Kafka door's Produce and Fetch, and a Kafka cluster read or written
//! by the processor and replication tasks), as Event Hubs applies it between its Kafka and AMQP
//! endpoints. The callers translate their own record types (`kafka-protocol`'s, librdkafka's)
//! to and from the parts here.
//!
//! # Kafka record → event
//! - **value** → the body (a null value, a tombstone, becomes an empty body).
//! - **key** → the partition key, so an AMQP consumer sees it where Event Hubs puts a Kafka key
//!   (the partition key annotation). A key that is not UTF-8 cannot be a partition key (a
//!   string); it is kept as the bytes property [`KEY_PROPERTY`] instead.
//! - **headers** → application properties with bytes values (a null header value becomes a
//!   null property), as Event Hubs documents: an AMQP consumer reads each header as a byte
//!   array. Kafka allows a name twice, a property name is unique: the last one wins. Headers
//!   named [`KEY_PROPERTY`] or [`TIMESTAMP_PROPERTY`] are dropped (they would read back as the
//!   record's own key or time).
//! - **CreateTime** → the timestamp property [`TIMESTAMP_PROPERTY`]: the event model has no
//!   field for a producer's time, and a hub's enqueued time is its own.
//!
//! # Event → Kafka record
//! - **value** = the body; **key** = the partition key's UTF-8 bytes, or [`KEY_PROPERTY`].
//! - **timestamp** = [`TIMESTAMP_PROPERTY`] when the event has it (CreateTime), else the
//!   caller's (a hub's enqueued time for the Kafka door, the producer's clock for a Kafka
//!   target).
//! - **headers** = the other application properties. Bytes (what a Kafka producer's headers
//!   become, and an AMQP binary) as they are; null as a null header; every other value —
//!   string, number, boolean, timestamp, UUID, as an AMQP or HTTPS producer sets them — as
//!   [`TypedValues`] says:
//!   - [`TypedValues::AmqpEncoded`] where Tributary stands in for Event Hubs' Kafka endpoint
//!     (the Kafka door's Fetch): the AMQP encoding, type constructor included (a string
//!     `hello` is `a1 05 68 65 6c 6c 6f`), as Event Hubs documents for exchanging events
//!     between protocols: "a Kafka consumer sees the raw AMQP-encoded byte sequence, including
//!     the AMQP type information", to be read with an AMQP deserializer. (Event Hubs would
//!     encode an AMQP binary too; here it is given raw, since a stored bytes property does not
//!     record which protocol wrote it, and a Kafka header must come back unchanged.)
//!   - [`TypedValues::Text`] where Tributary writes to a Kafka cluster as any Kafka producer
//!     would (a replication task's Kafka target, MirrorMaker's place): strings as their UTF-8
//!     bytes and other scalars as their text (`42`, `true`, a timestamp as milliseconds, a UUID
//!     hyphenated), what Kafka tools and headers elsewhere carry.

use bytes::Bytes;
use tributary_event::{EventData, PropertyValue, SmolStr, uuid_text};

use crate::deliver::encoded_property;

/// The application property holding a record's CreateTime (a timestamp value).
pub const TIMESTAMP_PROPERTY: &str = "x-opt-kafka-timestamp";

/// The application property holding a key that is not UTF-8 (a bytes value).
pub const KEY_PROPERTY: &str = "x-opt-kafka-key";

/// How typed property values become header bytes (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypedValues {
    /// Their AMQP encoding, as Event Hubs' Kafka endpoint gives them.
    AmqpEncoded,
    /// Their text, as a Kafka producer writes headers.
    Text,
}

/// What a record written to Kafka carries, from an event (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordFields {
    /// The record's key.
    pub key: Option<Bytes>,
    /// The record's value.
    pub value: Bytes,
    /// The CreateTime the event carries ([`TIMESTAMP_PROPERTY`]), in milliseconds since the
    /// Unix epoch; `None` when it has none.
    pub create_time_ms: Option<i64>,
    /// The record's headers, in the event's property order.
    pub headers: Vec<(SmolStr, Option<Bytes>)>,
}

/// The event a record becomes (see the module docs); `create_time_ms` is the record's
/// CreateTime when it has one.
pub fn event_from_record<'a>(
    key: Option<Bytes>,
    value: Option<Bytes>,
    headers: impl IntoIterator<Item = (&'a str, Option<Bytes>)>,
    create_time_ms: Option<i64>,
) -> EventData {
    event_from_record_with_room(key, value, headers, create_time_ms, 0)
}

/// [`event_from_record`], its property list made with room for `spare_properties` more, which
/// the caller adds next (a replication task's stamp): growing the list would copy it.
pub fn event_from_record_with_room<'a>(
    key: Option<Bytes>,
    value: Option<Bytes>,
    headers: impl IntoIterator<Item = (&'a str, Option<Bytes>)>,
    create_time_ms: Option<i64>,
    spare_properties: usize,
) -> EventData {
    let headers = headers.into_iter();
    // Each header, the key (when not UTF-8) and the CreateTime may take one.
    let own = headers.size_hint().0.saturating_add(2);
    let mut event = EventData::new(value.unwrap_or_default());
    event.properties = Vec::with_capacity(own.saturating_add(spare_properties));
    for (name, value) in headers {
        if name == TIMESTAMP_PROPERTY || name == KEY_PROPERTY {
            continue;
        }
        let name = SmolStr::new(name);
        let value = value.map_or(PropertyValue::Null, PropertyValue::Bytes);
        event.properties.retain(|(k, _)| *k != name);
        event.properties.push((name, value));
    }
    if let Some(key) = key {
        match std::str::from_utf8(&key) {
            Ok(text) => event.partition_key = Some(text.to_owned()),
            Err(_) => event
                .properties
                .push((SmolStr::new_static(KEY_PROPERTY), PropertyValue::Bytes(key))),
        }
    }
    if let Some(ms) = create_time_ms.filter(|ms| *ms >= 0) {
        event.properties.push((
            SmolStr::new_static(TIMESTAMP_PROPERTY),
            PropertyValue::Timestamp(ms),
        ));
    }
    event
}

/// The record an event is written to Kafka as (see the module docs).
pub fn record_from_event(data: EventData, typed: TypedValues) -> RecordFields {
    let mut record = RecordFields {
        key: data.partition_key.map(Bytes::from),
        value: data.body,
        create_time_ms: None,
        headers: Vec::with_capacity(data.properties.len()),
    };
    for (name, value) in data.properties {
        match (name.as_str(), value) {
            (TIMESTAMP_PROPERTY, PropertyValue::Timestamp(ms)) => record.create_time_ms = Some(ms),
            (KEY_PROPERTY, PropertyValue::Bytes(bytes)) if record.key.is_none() => {
                record.key = Some(bytes);
            }
            (_, value) => record.headers.push((name, header_value(value, typed))),
        }
    }
    record
}

/// A property's value as a header's bytes (see the module docs).
fn header_value(value: PropertyValue, typed: TypedValues) -> Option<Bytes> {
    let text = match (value, typed) {
        (PropertyValue::Null, _) => return None,
        (PropertyValue::Bytes(bytes), _) => return Some(bytes),
        (value, TypedValues::AmqpEncoded) => return Some(Bytes::from(encoded_property(&value))),
        (PropertyValue::String(s), TypedValues::Text) => s.to_string(),
        (PropertyValue::Bool(v), TypedValues::Text) => v.to_string(),
        (PropertyValue::Int32(v), TypedValues::Text) => v.to_string(),
        (PropertyValue::Int64(v), TypedValues::Text) => v.to_string(),
        (PropertyValue::UInt32(v), TypedValues::Text) => v.to_string(),
        (PropertyValue::UInt64(v), TypedValues::Text) => v.to_string(),
        (PropertyValue::Float32(v), TypedValues::Text) => v.to_string(),
        (PropertyValue::Float64(v), TypedValues::Text) => v.to_string(),
        (PropertyValue::Timestamp(ms), TypedValues::Text) => ms.to_string(),
        (PropertyValue::Uuid(u), TypedValues::Text) => uuid_text(&u),
    };
    Some(Bytes::from(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(record: &RecordFields, name: &str) -> Option<Bytes> {
        record
            .headers
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.clone())
    }

    #[test]
    fn a_record_round_trips_through_an_event() {
        for key in [Some(&b"user-1"[..]), Some(&b"\xff\xfe"[..]), None] {
            let headers = [
                ("h", Some(Bytes::from_static(b"\xff\x00"))),
                ("n", None),
                ("h", Some(Bytes::from_static(b"last"))),
                (TIMESTAMP_PROPERTY, Some(Bytes::from_static(b"forged"))),
            ];
            let key = key.map(Bytes::from_static);
            let body = Some(Bytes::from_static(b"body"));
            let event = event_from_record(key.clone(), body, headers, Some(1_700_000_000_123));
            assert_eq!(&event.body[..], b"body");
            let key_is_text = key.as_ref().is_some_and(|k| std::str::from_utf8(k).is_ok());
            assert_eq!(event.partition_key.is_some(), key_is_text);
            let back = record_from_event(event, TypedValues::AmqpEncoded);
            assert_eq!(back.create_time_ms, Some(1_700_000_000_123));
            assert_eq!(back.key, key);
            assert_eq!(back.headers.len(), 2, "{:?}", back.headers);
            assert_eq!(header(&back, "h").as_deref(), Some(&b"last"[..]));
            assert_eq!(header(&back, "n"), None);
        }
    }

    #[test]
    fn a_tombstone_is_an_empty_body_without_a_create_time() {
        let event = event_from_record(None, None, [], None);
        assert!(event.body.is_empty() && event.properties.is_empty());
        assert_eq!(
            record_from_event(event, TypedValues::Text).create_time_ms,
            None
        );
    }

    #[test]
    fn typed_values_are_amqp_encoded_for_the_door_and_text_for_a_kafka_cluster() {
        let data = EventData::new("x")
            .with_property("s", PropertyValue::String("hello".into()))
            .with_property("i", PropertyValue::Int64(-3))
            .with_property("t", PropertyValue::Bool(true))
            .with_property("u", PropertyValue::Uuid([0xab; 16]));
        let text = record_from_event(data.clone(), TypedValues::Text);
        assert_eq!(header(&text, "s").as_deref(), Some(&b"hello"[..]));
        assert_eq!(header(&text, "i").as_deref(), Some(&b"-3"[..]));
        assert_eq!(
            header(&text, "u").as_deref(),
            Some(&b"abababab-abab-abab-abab-abababababab"[..])
        );
        let record = record_from_event(data, TypedValues::AmqpEncoded);
        assert_eq!(record.create_time_ms, None);
        // str8-utf8, smalllong, true, uuid: the AMQP constructors and their data.
        assert_eq!(header(&record, "s").as_deref(), Some(&b"\xa1\x05hello"[..]));
        assert_eq!(header(&record, "i").as_deref(), Some(&[0x55, 0xfd][..]));
        assert_eq!(header(&record, "t").as_deref(), Some(&[0x41][..]));
        let mut uuid = vec![0x98];
        uuid.extend([0xab; 16]);
        assert_eq!(header(&record, "u").as_deref(), Some(&uuid[..]));
    }
}
