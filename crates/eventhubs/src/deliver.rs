//! Deliver: the message a receiver gets for a stored event, written straight into a byte
//! buffer — the server's half of what [`receive`](crate::receive) reads.
//!
//! [`write_delivery_message`] produces the bytes of the message [`message_for_delivery`] builds —
//! the same sections with the same values of the same AMQP types, in the order the
//! specification fixes — without building a `fe2o3-amqp` message and serializing it: the
//! sections are written with the `tributary-amqp-codec` writers, each map's size patched in
//! once its entries are written. The only allocation is the buffer's own growth.
//!
//! # Fast path and fallback
//! An event that came through another front door, or through this one as a plain message (one
//! `data` body, string ids, typed application properties), has no kept protocol sections; its
//! whole message is written by hand:
//! - delivery annotations, when the link asked for runtime metrics: `last_enqueued_*` and
//!   `runtime_info_retrieval_time_utc` (symbol keys);
//! - message annotations: `x-opt-partition-key` (string, if the event has one),
//!   `x-opt-sequence-number` (long), `x-opt-offset` (string), `x-opt-enqueued-time`
//!   (timestamp), in that order (symbol keys);
//! - properties, when the event has a message id, correlation id or content type: a list that
//!   ends at the last field set (message-id and correlation-id strings, content-type a symbol),
//!   as `fe2o3-amqp` writes it;
//! - application properties, when there are any (string keys; each value of the AMQP type an
//!   AMQP producer would have sent it as);
//! - one `data` section with the body.
//!
//! An event with kept protocol sections (a header, other annotations, a non-`data` body, …)
//! is rare and takes the general path: [`message_for_delivery`] merges them and `serde_amqp`
//! serializes the result. So does an event whose application properties repeat a key (no AMQP
//! front door stores one; an AMQP map cannot hold one — the general path keeps the key once,
//! where it first appears, with its last value).

use tributary_amqp_codec::message::{
    ListSection, MapSection, ValueWriter, section, sym8, write_data_section_header,
};
use tributary_event::{EventData, PropertyValue, ReceivedEvent, repeats_a_property_key};

pub(crate) mod general;

pub use self::general::message_for_delivery;
use crate::message::LastEnqueued;
use crate::names::annotation::{ENQUEUED_TIME, OFFSET, PARTITION_KEY, SEQUENCE_NUMBER};
use crate::names::runtime_metric::{
    LAST_ENQUEUED_OFFSET, LAST_ENQUEUED_SEQUENCE_NUMBER, LAST_ENQUEUED_TIME_UTC, RETRIEVAL_TIME_UTC,
};

/// Appends to `out` the encoded AMQP message (the transfer payload) a receiver gets for `event`.
/// `runtime` adds the last-enqueued delivery annotations (see [`message_for_delivery`]).
///
/// The bytes decode to the message [`message_for_delivery`] returns for the same arguments.
///
/// # Panics
/// Never for an event the broker can store: a string or body longer than `u32::MAX` bytes,
/// which has no AMQP encoding, would panic.
pub fn write_delivery_message(
    event: &ReceivedEvent,
    runtime: Option<&LastEnqueued>,
    out: &mut Vec<u8>,
) {
    if write_delivery_message_head(event, runtime, out) {
        out.extend_from_slice(&event.data.body);
    }
}

/// Appends to `out` what [`write_delivery_message`] writes, except, on the fast path, the
/// event's body: returns whether the body follows, i.e. whether the message is the bytes
/// appended to `out` followed by `event.data.body` (false: the message is whole in `out`).
/// A sender that writes the body from where the event holds it copies it once.
pub fn write_delivery_message_head(
    event: &ReceivedEvent,
    runtime: Option<&LastEnqueued>,
    out: &mut Vec<u8>,
) -> bool {
    if event.data.protocol_sections.is_some() || repeats_a_property_key(&event.data.properties) {
        write_through_engine(event, runtime, out);
        false
    } else {
        write_plain_head(event, runtime, out);
        true
    }
}

/// The general path: builds the message with [`message_for_delivery`] and serializes it.
fn write_through_engine(event: &ReceivedEvent, runtime: Option<&LastEnqueued>, out: &mut Vec<u8>) {
    let message = message_for_delivery(event, runtime);
    if let Err(e) = crate::message::write_message(&message, out) {
        // Not seen in practice (only a value too long for any AMQP encoding fails). Deliver
        // the event without its kept sections rather than not at all; `out` is as it was.
        tracing::warn!(sequence_number = event.sequence_number, error = %e, "cannot encode a message; delivering it without its kept sections");
        write_plain_head(event, runtime, out);
        out.extend_from_slice(&event.data.body);
    }
}

/// The fast path: every section written by hand, the kept protocol sections (if any) ignored;
/// all of the message but the body's bytes, which follow the returned bytes.
fn write_plain_head(event: &ReceivedEvent, runtime: Option<&LastEnqueued>, out: &mut Vec<u8>) {
    let data = &event.data;
    if let Some(last) = runtime {
        write_runtime_annotations(last, out);
    }
    // The keys are the same on every message: written from their encodings.
    const PARTITION_KEY_KEY: [u8; PARTITION_KEY.len() + 2] = sym8(PARTITION_KEY);
    const SEQUENCE_NUMBER_KEY: [u8; SEQUENCE_NUMBER.len() + 2] = sym8(SEQUENCE_NUMBER);
    const OFFSET_KEY: [u8; OFFSET.len() + 2] = sym8(OFFSET);
    const ENQUEUED_TIME_KEY: [u8; ENQUEUED_TIME.len() + 2] = sym8(ENQUEUED_TIME);
    let mut annotations = MapSection::start(out, section::MESSAGE_ANNOTATIONS);
    if let Some(key) = &data.partition_key {
        annotations.entry_encoded(&PARTITION_KEY_KEY, |v| v.string(key));
    }
    annotations.entry_encoded(&SEQUENCE_NUMBER_KEY, |v| v.long(event.sequence_number));
    annotations.entry_encoded(&OFFSET_KEY, |v| v.decimal_string(event.offset));
    annotations.entry_encoded(&ENQUEUED_TIME_KEY, |v| v.timestamp(event.enqueued_time_ms));
    annotations.finish();
    write_properties(data, out);
    if !data.properties.is_empty() {
        let mut application = MapSection::start(out, section::APPLICATION_PROPERTIES);
        for (key, value) in &data.properties {
            application.entry(key, false, |v| write_property(v, value));
        }
        application.finish();
    }
    write_data_section_header(out, data.body.len());
}

/// The runtime-metric delivery annotations, as `runtime_annotations` in [`general`] makes them.
fn write_runtime_annotations(last: &LastEnqueued, out: &mut Vec<u8>) {
    const SEQUENCE_NUMBER_KEY: [u8; LAST_ENQUEUED_SEQUENCE_NUMBER.len() + 2] =
        sym8(LAST_ENQUEUED_SEQUENCE_NUMBER);
    const OFFSET_KEY: [u8; LAST_ENQUEUED_OFFSET.len() + 2] = sym8(LAST_ENQUEUED_OFFSET);
    const ENQUEUED_TIME_KEY: [u8; LAST_ENQUEUED_TIME_UTC.len() + 2] = sym8(LAST_ENQUEUED_TIME_UTC);
    const RETRIEVAL_TIME_KEY: [u8; RETRIEVAL_TIME_UTC.len() + 2] = sym8(RETRIEVAL_TIME_UTC);
    let mut map = MapSection::start(out, section::DELIVERY_ANNOTATIONS);
    map.entry_encoded(&SEQUENCE_NUMBER_KEY, |v| v.long(last.sequence_number));
    map.entry_encoded(&OFFSET_KEY, |v| match last.offset {
        Some(offset) => v.decimal_string(offset),
        None => v.string("-1"),
    });
    map.entry_encoded(&ENQUEUED_TIME_KEY, |v| {
        v.timestamp(last.enqueued_time_ms.unwrap_or(0));
    });
    map.entry_encoded(&RETRIEVAL_TIME_KEY, |v| v.timestamp(last.retrieved_time_ms));
    map.finish();
}

/// The `properties` section, if the event has a message id, correlation id or content type.
/// Its list ends at the last field set: message-id (0), correlation-id (5), content-type (6).
fn write_properties(data: &EventData, out: &mut Vec<u8>) {
    let fields = if data.content_type.is_some() {
        7
    } else if data.correlation_id.is_some() {
        6
    } else if data.message_id.is_some() {
        1
    } else {
        return;
    };
    let mut list = ListSection::start(out, section::PROPERTIES);
    for field in 0..fields {
        list.field(|v| match field {
            0 => optional_string(v, data.message_id.as_deref()),
            5 => optional_string(v, data.correlation_id.as_deref()),
            6 => match &data.content_type {
                Some(content_type) => v.symbol(content_type),
                None => v.null(),
            },
            // user-id, to, subject, reply-to.
            _ => v.null(),
        });
    }
    list.finish();
}

fn optional_string(v: ValueWriter<'_>, value: Option<&str>) {
    match value {
        Some(text) => v.string(text),
        None => v.null(),
    }
}

/// An application property's value alone, AMQP-encoded with its type constructor, as a Kafka
/// consumer of Event Hubs receives a property an AMQP or HTTPS producer set (Event Hubs'
/// "exchange events between protocols": the raw AMQP encoding, type information included).
pub fn encoded_property(value: &PropertyValue) -> Vec<u8> {
    let mut out = Vec::new();
    write_property(ValueWriter::new(&mut out), value);
    out
}

/// An application property's value, of the AMQP type [`crate::property::to_amqp`] gives it.
fn write_property(v: ValueWriter<'_>, value: &PropertyValue) {
    match value {
        PropertyValue::Null => v.null(),
        PropertyValue::Bool(b) => v.bool(*b),
        PropertyValue::Int32(n) => v.int(*n),
        PropertyValue::Int64(n) => v.long(*n),
        PropertyValue::UInt32(n) => v.uint(*n),
        PropertyValue::UInt64(n) => v.ulong(*n),
        PropertyValue::Float32(f) => v.float(*f),
        PropertyValue::Float64(f) => v.double(*f),
        PropertyValue::String(s) => v.string(s),
        PropertyValue::Bytes(b) => v.binary(b),
        PropertyValue::Timestamp(ms) => v.timestamp(*ms),
        PropertyValue::Uuid(u) => v.uuid(u),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use fe2o3_amqp_types::messaging::annotations::OwnedKey;
    use fe2o3_amqp_types::messaging::{
        AmqpSequence, ApplicationProperties, Body, Data, Footer, Header, MessageAnnotations,
        MessageId, Properties,
    };
    use fe2o3_amqp_types::primitives::{Binary, OrderedMap, SimpleValue, Symbol, Value};
    use proptest::prelude::*;

    use super::*;
    use crate::ingest::{decode_strict, event_from_message};
    use crate::message::{AmqpMessage, value_body};
    use tributary_event::SmolStr;

    /// What the engine path writes for the message.
    fn engine_bytes(message: &AmqpMessage) -> Vec<u8> {
        crate::message::encode_message(message).expect("the engine encodes the message")
    }

    /// Writes the message after some bytes already in the buffer, checks those are untouched
    /// and that its head and body ([`write_delivery_message_head`]) make the same bytes, and
    /// decodes what was appended — strictly, as a received message is decoded.
    fn written(event: &ReceivedEvent, runtime: Option<&LastEnqueued>) -> AmqpMessage {
        let prefix = [0xde, 0xad, 0xbe, 0xef];
        let mut out = prefix.to_vec();
        write_delivery_message(event, runtime, &mut out);
        assert_eq!(
            out[..prefix.len()],
            prefix,
            "bytes before the message are kept"
        );
        let mut split = prefix.to_vec();
        let plain = event.data.protocol_sections.is_none()
            && !repeats_a_property_key(&event.data.properties);
        let body_follows = write_delivery_message_head(event, runtime, &mut split);
        assert_eq!(
            body_follows, plain,
            "only the fast path leaves the body out"
        );
        if body_follows {
            split.extend_from_slice(&event.data.body);
        }
        assert_eq!(
            split, out,
            "the head and then the body are the whole message"
        );
        decode_strict(&out[prefix.len()..]).expect("the written message decodes")
    }

    /// Checks that what [`write_delivery_message`] writes decodes to [`message_for_delivery`],
    /// and to what the engine's own encoding of it decodes to.
    fn check(event: &ReceivedEvent, runtime: Option<&LastEnqueued>) {
        let expected = message_for_delivery(event, runtime);
        let ours = written(event, runtime);
        assert_eq!(ours, expected);
        let engine = decode_strict(&engine_bytes(&expected)).expect("the engine's bytes decode");
        assert_eq!(ours, engine);
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => "[a-z0-9-]{0,12}",
            2 => "(?s).{0,40}",
            1 => "[a-z]{250,260}",
            1 => "(?s).{0,300}",
        ]
    }

    fn property_value() -> impl Strategy<Value = PropertyValue> {
        prop_oneof![
            Just(PropertyValue::Null),
            any::<bool>().prop_map(PropertyValue::Bool),
            prop_oneof![any::<i32>(), -130i32..130, Just(i32::MIN), Just(i32::MAX)]
                .prop_map(PropertyValue::Int32),
            prop_oneof![any::<i64>(), -130i64..130, Just(i64::MIN), Just(i64::MAX)]
                .prop_map(PropertyValue::Int64),
            prop_oneof![any::<u32>(), 0u32..300, Just(u32::MAX)].prop_map(PropertyValue::UInt32),
            prop_oneof![any::<u64>(), 0u64..300, Just(u64::MAX)].prop_map(PropertyValue::UInt64),
            prop_oneof![
                any::<u32>().prop_map(f32::from_bits),
                Just(f32::NAN),
                Just(-0.0f32),
                Just(f32::INFINITY),
                Just(f32::MIN_POSITIVE)
            ]
            .prop_map(PropertyValue::Float32),
            prop_oneof![
                any::<u64>().prop_map(f64::from_bits),
                Just(f64::NAN),
                Just(-0.0f64),
                Just(f64::NEG_INFINITY),
                Just(f64::MAX)
            ]
            .prop_map(PropertyValue::Float64),
            text().prop_map(|s| PropertyValue::String(s.into())),
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..16),
                proptest::collection::vec(any::<u8>(), 250..300),
            ]
            .prop_map(|b| PropertyValue::Bytes(Bytes::from(b))),
            prop_oneof![any::<i64>(), Just(i64::MIN), Just(0)].prop_map(PropertyValue::Timestamp),
            any::<[u8; 16]>().prop_map(PropertyValue::Uuid),
        ]
    }

    /// Application properties with distinct keys (the `EventData` invariant), sometimes
    /// enough of them for a map32.
    fn properties() -> impl Strategy<Value = Vec<(SmolStr, PropertyValue)>> {
        let entries = prop_oneof![
            6 => proptest::collection::vec((text(), property_value()), 0..10),
            1 => proptest::collection::vec((text(), property_value()), 120..140),
        ];
        entries.prop_map(|entries| {
            let mut seen = std::collections::HashSet::new();
            entries
                .into_iter()
                .filter(|(key, _)| seen.insert(key.clone()))
                .map(|(key, value)| (SmolStr::from(key), value))
                .collect()
        })
    }

    fn last_enqueued() -> impl Strategy<Value = LastEnqueued> {
        (
            prop_oneof![any::<i64>(), Just(-1), 0i64..200],
            proptest::option::of(prop_oneof![any::<u64>(), Just(0), Just(u64::MAX)]),
            proptest::option::of(any::<i64>()),
            any::<i64>(),
        )
            .prop_map(
                |(sequence_number, offset, enqueued_time_ms, retrieved_time_ms)| LastEnqueued {
                    sequence_number,
                    offset,
                    enqueued_time_ms,
                    retrieved_time_ms,
                },
            )
    }

    prop_compose! {
        fn plain_event()(
            sequence_number in prop_oneof![any::<i64>(), 0i64..200],
            offset in prop_oneof![any::<u64>(), 0u64..100_000, Just(u64::MAX)],
            enqueued_time_ms in any::<i64>(),
            body in prop_oneof![
                4 => proptest::collection::vec(any::<u8>(), 0..64),
                1 => proptest::collection::vec(any::<u8>(), 250..260),
                1 => proptest::collection::vec(any::<u8>(), 0..2000),
            ],
            partition_key in proptest::option::of(text()),
            message_id in proptest::option::of(text()),
            correlation_id in proptest::option::of(text()),
            content_type in proptest::option::of(text()),
            properties in properties(),
        ) -> ReceivedEvent {
            ReceivedEvent {
                sequence_number,
                offset,
                enqueued_time_ms,
                data: EventData {
                    body: Bytes::from(body),
                    properties,
                    partition_key,
                    content_type,
                    correlation_id,
                    message_id,
                    protocol_sections: None,
                },
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// An event without kept sections (the fast path) is written as the message
        /// `message_for_delivery` builds for it, with and without runtime metrics.
        #[test]
        fn a_plain_event_is_written_as_message_for_delivery_builds_it(
            event in plain_event(),
            runtime in proptest::option::of(last_enqueued()),
        ) {
            prop_assert!(!repeats_a_property_key(&event.data.properties));
            let expected = message_for_delivery(&event, runtime.as_ref());
            let ours = written(&event, runtime.as_ref());
            prop_assert_eq!(&ours, &expected);
            let engine = decode_strict(&engine_bytes(&expected)).expect("the engine's bytes decode");
            prop_assert_eq!(&ours, &engine);
        }

        /// An event with kept sections (the general path) is written as the message
        /// `message_for_delivery` builds for it.
        #[test]
        fn an_event_with_kept_sections_is_written_as_message_for_delivery_builds_it(
            event in plain_event(),
            runtime in proptest::option::of(last_enqueued()),
            priority in any::<u8>(),
            subject in proptest::option::of(text()),
            symbol_property in proptest::option::of("[a-z]{0,8}"),
            value_body_text in proptest::option::of(text()),
        ) {
            // The producer's message for the event, with parts only kept sections can carry.
            let mut sent = message_for_delivery(&event, None);
            sent.header = Some(Header { durable: true, priority: priority.into(), ..Header::default() });
            let mut properties = sent.properties.take().unwrap_or_default();
            properties.subject = subject;
            sent.properties = Some(properties);
            if let Some(symbol) = symbol_property {
                let mut application = sent.application_properties.take().map(|a| a.0).unwrap_or_default();
                application.insert("a-symbol".to_owned(), SimpleValue::Symbol(Symbol::from(symbol)));
                sent.application_properties = Some(ApplicationProperties(application));
            }
            if let Some(text) = value_body_text {
                sent.body = value_body(Value::String(text));
            }
            let data = event_from_message(sent, true).expect("the message maps to an event");
            prop_assert!(data.protocol_sections.is_some());
            let event = ReceivedEvent { data, ..event };
            let expected = message_for_delivery(&event, runtime.as_ref());
            prop_assert!(expected.header.is_some());
            prop_assert_eq!(&written(&event, runtime.as_ref()), &expected);
        }
    }

    fn received(data: EventData) -> ReceivedEvent {
        ReceivedEvent {
            sequence_number: 42,
            offset: 8192,
            enqueued_time_ms: 1_700_000_000_000,
            data,
        }
    }

    const LAST: LastEnqueued = LastEnqueued {
        sequence_number: 99,
        offset: Some(123_456),
        enqueued_time_ms: Some(1_700_000_000_999),
        retrieved_time_ms: 1_700_000_001_000,
    };

    #[test]
    fn a_message_with_a_header_and_a_value_body_takes_the_general_path() {
        let mut annotations = OrderedMap::new();
        annotations.insert(OwnedKey::from("x-custom"), Value::Int(5));
        annotations.insert(OwnedKey::from(PARTITION_KEY), Value::String("pk".into()));
        let mut application = OrderedMap::new();
        application.insert("n".to_owned(), SimpleValue::Long(-3));
        application.insert("sym".to_owned(), SimpleValue::Symbol(Symbol::from("abc")));
        application.insert("short".to_owned(), SimpleValue::Short(12));
        let mut footer = OrderedMap::new();
        footer.insert(OwnedKey::from("x-footer"), Value::Bool(true));
        let sent = AmqpMessage {
            header: Some(Header {
                durable: true,
                ttl: Some(60_000),
                ..Header::default()
            }),
            delivery_annotations: None,
            message_annotations: Some(MessageAnnotations(annotations)),
            properties: Some(Properties {
                message_id: Some(MessageId::Ulong(7)),
                subject: Some("subject".into()),
                content_type: Some(Symbol::from("text/plain")),
                ..Properties::default()
            }),
            application_properties: Some(ApplicationProperties(application)),
            body: value_body(Value::String("hello".into())),
            footer: Some(Footer(footer)),
        };
        let event = received(event_from_message(sent.clone(), true).unwrap());
        assert!(event.data.protocol_sections.is_some());
        for runtime in [None, Some(&LAST)] {
            check(&event, runtime);
            let ours = written(&event, runtime);
            assert_eq!(ours.header, sent.header);
            assert_eq!(ours.body, sent.body);
            assert_eq!(ours.footer, sent.footer);
            assert_eq!(ours.properties, sent.properties);
            assert_eq!(ours.delivery_annotations.is_some(), runtime.is_some());
        }
    }

    #[test]
    fn sequence_and_multi_data_bodies_take_the_general_path() {
        for body in [
            Body::Sequence(vec![AmqpSequence(vec![Value::Int(1), Value::Bool(true)])].into()),
            Body::Data(vec![Data(Binary::from(vec![1])), Data(Binary::from(vec![2, 3]))].into()),
        ] {
            let sent = AmqpMessage {
                body: body.clone(),
                ..crate::message::empty_message()
            };
            let event = received(event_from_message(sent, false).unwrap());
            check(&event, Some(&LAST));
            assert_eq!(written(&event, None).body, body);
        }
    }

    #[test]
    fn undecodable_kept_sections_are_dropped_as_message_for_delivery_drops_them() {
        let mut data = EventData::new(&b"body"[..]).with_property("k", PropertyValue::Int32(1));
        data.protocol_sections = Some(Bytes::from_static(b"\x00\x53\x70\xff"));
        check(&received(data), Some(&LAST));
    }

    #[test]
    fn repeated_property_keys_take_the_general_path() {
        for count in [3, tributary_event::PAIRWISE_KEY_CHECK_MAX + 5] {
            let mut data = EventData::new(&b"body"[..]);
            for i in 0..count {
                data = data.with_property(format!("k{i}"), PropertyValue::UInt32(i as u32));
            }
            data = data.with_property("k1", PropertyValue::Bool(true));
            assert!(repeats_a_property_key(&data.properties));
            let event = received(data);
            check(&event, None);
            let application = written(&event, None).application_properties.unwrap().0;
            assert_eq!(application.len(), count);
            assert_eq!(application.get("k1"), Some(&SimpleValue::Bool(true)));
        }
        let distinct: Vec<(SmolStr, _)> = (0..tributary_event::PAIRWISE_KEY_CHECK_MAX + 5)
            .map(|i| (format!("k{i}").into(), PropertyValue::Null))
            .collect();
        assert!(!repeats_a_property_key(&distinct));
    }

    #[test]
    fn a_bare_event_gets_annotations_and_an_empty_data_section() {
        let event = received(EventData::default());
        check(&event, None);
        let ours = written(&event, None);
        assert_eq!(ours.properties, None);
        assert_eq!(ours.application_properties, None);
        assert_eq!(ours.delivery_annotations, None);
        assert_eq!(
            ours.body,
            Body::Data(vec![Data(Binary::from(Vec::new()))].into())
        );
    }

    #[test]
    fn a_typical_event_is_written_as_the_engine_writes_it() {
        let mut data = EventData::new(&b"{\"temperature\": 21.5}"[..])
            .with_property("source", PropertyValue::String("sensor-7".into()))
            .with_property("reading", PropertyValue::Int64(1234));
        data.partition_key = Some("device-7".into());
        data.message_id = Some("m-1".into());
        data.content_type = Some("application/json".into());
        let event = received(data);
        for runtime in [None, Some(&LAST)] {
            let mut out = Vec::new();
            write_delivery_message(&event, runtime, &mut out);
            assert_eq!(out, engine_bytes(&message_for_delivery(&event, runtime)));
        }
    }
}
