//! Events ↔ AMQP messages in the Event Hubs dialect, link addresses and the selector filter.
//!
//! # Sending
//! An [`EventData`] becomes one AMQP message: the body as one `data` section, the application
//! properties with their AMQP types ([`PropertyValue`] ↔ AMQP simple type, one to one), message
//! id, correlation id (as strings) and content type (a symbol) in `properties`, and the partition
//! key as the `x-opt-partition-key` message annotation (with `header.durable = true`, as the
//! Python SDK sends it). More than one event travel as one batch: a transfer with message format
//! `0x80013700` whose `data` sections each hold one complete encoded message, with the partition
//! key also on the envelope. The hub stores a batch all or nothing.
//!
//! # Receiving
//! A delivered message becomes a [`ReceivedEvent`]: `x-opt-sequence-number` (long),
//! `x-opt-offset` (decimal string), `x-opt-enqueued-time` (timestamp) and `x-opt-partition-key`
//! (string) from the message annotations; a hub that leaves out any of the first three is
//! misbehaving ([`ClientError::Protocol`]). Bodies made of `data` sections are concatenated; an
//! `amqp-value` holding binary or a string gives those bytes; any other body (a sequence, another
//! value) is kept as its AMQP encoding. Application-property types with no [`PropertyValue`]
//! twin widen: `ubyte`/`ushort` to `UInt32`, `byte`/`short` to `Int32`, `char`/`symbol` to
//! `String`, decimals and described values to `Bytes` holding their AMQP encoding. Message ids
//! that are not strings arrive as text (`ulong` in decimal, `uuid` hyphenated, `binary` in hex).
//!
//! Nothing here panics on what a peer sends: every field is checked and a bad one is an error.

use bytes::Bytes;
use fe2o3_amqp::types::messaging::annotations::{Annotations, OwnedKey};
use fe2o3_amqp::types::messaging::{
    ApplicationProperties, Batch, Body, Data, DeliveryAnnotations, Header, Message,
    MessageAnnotations, MessageId, Properties,
};
use fe2o3_amqp::types::primitives::{Binary, SimpleValue, Symbol, Timestamp, Uuid, Value};
use serde_amqp::described::Described;
use serde_amqp::descriptor::Descriptor;
use tributary_event::{EventData, EventPosition, PropertyValue, ReceivedEvent};
use tributary_processor::LastEnqueuedEventProperties;

use crate::error::ClientError;

/// The transfer message format of a batch of events (Microsoft's, registered in the AMQP
/// message-format space).
pub const BATCH_MESSAGE_FORMAT: u32 = 0x8001_3700;

/// The filter-set key of the selector filter.
pub const SELECTOR_FILTER_KEY: &str = "apache.org:selector-filter:string";

/// The descriptor code of the selector filter's described value.
pub const SELECTOR_FILTER_CODE: u64 = 0x0000_468C_0000_0004;

/// Message annotation: the partition key.
pub const PARTITION_KEY_ANNOTATION: &str = "x-opt-partition-key";
/// Message annotation: the sequence number the hub assigned.
pub const SEQUENCE_NUMBER_ANNOTATION: &str = "x-opt-sequence-number";
/// Message annotation: the offset the hub assigned.
pub const OFFSET_ANNOTATION: &str = "x-opt-offset";
/// Message annotation: when the hub enqueued the event.
pub const ENQUEUED_TIME_ANNOTATION: &str = "x-opt-enqueued-time";

/// The link property carrying the owner level.
pub const EPOCH_PROPERTY: &str = "com.microsoft:epoch";
/// The link property naming the receiver (shown in the hub's quota errors).
pub const RECEIVER_NAME_PROPERTY: &str = "com.microsoft:receiver-name";
/// The capability asking for last-enqueued-event annotations on deliveries.
pub const RUNTIME_METRIC_CAPABILITY: &str = "com.microsoft:enable-receiver-runtime-metric";

/// The sender link address for a whole hub (the hub routes) or one partition.
pub fn sender_address(hub: &str, partition: Option<&str>) -> String {
    match partition {
        Some(partition) => format!("{hub}/Partitions/{partition}"),
        None => hub.to_owned(),
    }
}

/// The receiver link address of a partition in a consumer group.
pub fn receiver_address(hub: &str, consumer_group: &str, partition: &str) -> String {
    format!("{hub}/ConsumerGroups/{consumer_group}/Partitions/{partition}")
}

/// The selector-filter expression for a start position, as the Azure SDKs write it.
pub fn selector_expression(position: &EventPosition) -> String {
    let op = |inclusive: bool| if inclusive { ">=" } else { ">" };
    match position {
        EventPosition::Earliest => "amqp.annotation.x-opt-offset > '-1'".to_owned(),
        EventPosition::Latest => "amqp.annotation.x-opt-offset > '@latest'".to_owned(),
        EventPosition::Offset { offset, inclusive } => {
            format!("amqp.annotation.x-opt-offset {} '{offset}'", op(*inclusive))
        }
        EventPosition::SequenceNumber {
            sequence_number,
            inclusive,
        } => format!(
            "amqp.annotation.x-opt-sequence-number {} '{sequence_number}'",
            op(*inclusive)
        ),
        EventPosition::EnqueuedTime {
            enqueued_time_ms,
            inclusive,
        } => format!(
            "amqp.annotation.x-opt-enqueued-time {} '{enqueued_time_ms}'",
            op(*inclusive)
        ),
    }
}

/// The selector filter value for a start position: the expression described by
/// [`SELECTOR_FILTER_CODE`].
pub(crate) fn selector_filter(position: &EventPosition) -> Described<Value> {
    Described {
        descriptor: Descriptor::Code(SELECTOR_FILTER_CODE),
        value: Value::String(selector_expression(position)),
    }
}

/// A property value as the AMQP simple type it maps to.
pub(crate) fn property_to_amqp(value: &PropertyValue) -> SimpleValue {
    match value {
        PropertyValue::Null => SimpleValue::Null,
        PropertyValue::Bool(v) => SimpleValue::Bool(*v),
        PropertyValue::Int32(v) => SimpleValue::Int(*v),
        PropertyValue::Int64(v) => SimpleValue::Long(*v),
        PropertyValue::UInt32(v) => SimpleValue::Uint(*v),
        PropertyValue::UInt64(v) => SimpleValue::Ulong(*v),
        PropertyValue::Float32(v) => SimpleValue::Float((*v).into()),
        PropertyValue::Float64(v) => SimpleValue::Double((*v).into()),
        PropertyValue::String(v) => SimpleValue::String(v.clone()),
        PropertyValue::Bytes(v) => SimpleValue::Binary(Binary::from(v.to_vec())),
        PropertyValue::Timestamp(v) => SimpleValue::Timestamp(Timestamp::from_milliseconds(*v)),
        PropertyValue::Uuid(v) => SimpleValue::Uuid(Uuid::from(*v)),
    }
}

/// An AMQP simple value as the property value it maps to (widening types with no twin; see the
/// module docs).
pub(crate) fn property_from_amqp(value: SimpleValue) -> PropertyValue {
    match value {
        SimpleValue::Null => PropertyValue::Null,
        SimpleValue::Bool(v) => PropertyValue::Bool(v),
        SimpleValue::Ubyte(v) => PropertyValue::UInt32(u32::from(v)),
        SimpleValue::Ushort(v) => PropertyValue::UInt32(u32::from(v)),
        SimpleValue::Uint(v) => PropertyValue::UInt32(v),
        SimpleValue::Ulong(v) => PropertyValue::UInt64(v),
        SimpleValue::Byte(v) => PropertyValue::Int32(i32::from(v)),
        SimpleValue::Short(v) => PropertyValue::Int32(i32::from(v)),
        SimpleValue::Int(v) => PropertyValue::Int32(v),
        SimpleValue::Long(v) => PropertyValue::Int64(v),
        SimpleValue::Float(v) => PropertyValue::Float32(v.0),
        SimpleValue::Double(v) => PropertyValue::Float64(v.0),
        SimpleValue::Char(v) => PropertyValue::String(v.to_string()),
        SimpleValue::Timestamp(v) => PropertyValue::Timestamp(v.milliseconds()),
        SimpleValue::Uuid(v) => PropertyValue::Uuid(v.into_inner()),
        SimpleValue::Binary(v) => PropertyValue::Bytes(Bytes::from(v.into_vec())),
        SimpleValue::String(v) => PropertyValue::String(v),
        SimpleValue::Symbol(v) => PropertyValue::String(v.0),
        other => PropertyValue::Bytes(Bytes::from(serde_amqp::to_vec(&other).unwrap_or_default())),
    }
}

/// The AMQP message for one event, carrying `partition_key` if given.
pub(crate) fn event_to_message(
    event: &EventData,
    partition_key: Option<&str>,
) -> Message<Batch<Data>> {
    let properties = (event.message_id.is_some()
        || event.correlation_id.is_some()
        || event.content_type.is_some())
    .then(|| Properties {
        message_id: event.message_id.clone().map(MessageId::String),
        correlation_id: event.correlation_id.clone().map(MessageId::String),
        content_type: event.content_type.clone().map(Symbol::from),
        ..Properties::default()
    });
    let application_properties = (!event.properties.is_empty()).then(|| {
        let mut map = ApplicationProperties::default();
        for (key, value) in &event.properties {
            map.0.insert(key.clone(), property_to_amqp(value));
        }
        map
    });
    Message {
        header: partition_key.map(|_| Header {
            durable: true,
            ..Header::default()
        }),
        delivery_annotations: None,
        message_annotations: partition_key.map(partition_key_annotations),
        properties,
        application_properties,
        body: Batch::from(vec![Data(Binary::from(event.body.to_vec()))]),
        footer: None,
    }
}

fn partition_key_annotations(key: &str) -> MessageAnnotations {
    let mut annotations = Annotations::new();
    annotations.insert(
        OwnedKey::Symbol(Symbol::from(PARTITION_KEY_ANNOTATION)),
        Value::String(key.to_owned()),
    );
    MessageAnnotations(annotations)
}

/// Encodes a message section by section, as it travels in a transfer.
pub(crate) fn encode_message(message: &Message<Batch<Data>>) -> Result<Vec<u8>, ClientError> {
    let fail = |e: serde_amqp::Error| {
        ClientError::InvalidArgument(format!("an event could not be encoded: {e}"))
    };
    let mut out = Vec::new();
    if let Some(header) = &message.header {
        out.extend(serde_amqp::to_vec(header).map_err(fail)?);
    }
    if let Some(annotations) = &message.message_annotations {
        out.extend(serde_amqp::to_vec(annotations).map_err(fail)?);
    }
    if let Some(properties) = &message.properties {
        out.extend(serde_amqp::to_vec(properties).map_err(fail)?);
    }
    if let Some(application_properties) = &message.application_properties {
        out.extend(serde_amqp::to_vec(application_properties).map_err(fail)?);
    }
    for data in message.body.iter() {
        out.extend(serde_amqp::to_vec(data).map_err(fail)?);
    }
    Ok(out)
}

/// What one `send` transfers: a single message, or a batch envelope.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub(crate) message: Message<Batch<Data>>,
    pub(crate) message_format: u32,
}

impl Outgoing {
    /// The encoded size the hub counts against its message size: the message, or the sum of
    /// the envelope's sections. Encodes the message, so it is computed only when the link did
    /// not advertise a maximum (the engine checks an advertised one on the bytes it sends).
    pub(crate) fn encoded_len(&self) -> Result<u64, ClientError> {
        Ok(encode_message(&self.message)?.len() as u64)
    }
}

/// The transfer for `events`: the message itself for one event, a batch envelope for more.
pub(crate) fn outgoing(
    events: &[EventData],
    partition_key: Option<&str>,
) -> Result<Outgoing, ClientError> {
    if let [event] = events {
        return Ok(Outgoing {
            message: event_to_message(event, partition_key),
            message_format: 0,
        });
    }
    let messages: Vec<Message<Batch<Data>>> = events
        .iter()
        .map(|event| event_to_message(event, partition_key))
        .collect();
    let mut sections = Vec::with_capacity(messages.len());
    for message in &messages {
        sections.push(Data(Binary::from(encode_message(message)?)));
    }
    let envelope = Message {
        header: partition_key.map(|_| Header {
            durable: true,
            ..Header::default()
        }),
        delivery_annotations: None,
        message_annotations: partition_key.map(partition_key_annotations),
        properties: None,
        application_properties: None,
        body: Batch::from(sections),
        footer: None,
    };
    Ok(Outgoing {
        message: envelope,
        message_format: BATCH_MESSAGE_FORMAT,
    })
}

fn annotation<'a>(annotations: &'a Annotations, name: &str) -> Option<&'a Value> {
    annotations
        .iter()
        .find(|(key, _)| matches!(key, OwnedKey::Symbol(symbol) if symbol.0 == name))
        .map(|(_, value)| value)
}

fn value_as_i64(value: &Value) -> Option<i64> {
    match value {
        Value::Long(v) => Some(*v),
        Value::Int(v) => Some(i64::from(*v)),
        Value::Uint(v) => Some(i64::from(*v)),
        Value::Ulong(v) => i64::try_from(*v).ok(),
        Value::Timestamp(v) => Some(v.milliseconds()),
        Value::String(v) => v.parse().ok(),
        _ => None,
    }
}

fn value_as_u64(value: &Value) -> Option<u64> {
    match value {
        Value::String(v) => v.parse().ok(),
        Value::Ulong(v) => Some(*v),
        Value::Long(v) => u64::try_from(*v).ok(),
        Value::Int(v) => u64::try_from(*v).ok(),
        Value::Uint(v) => Some(u64::from(*v)),
        _ => None,
    }
}

fn required<T>(
    annotations: &Annotations,
    name: &str,
    read: fn(&Value) -> Option<T>,
) -> Result<T, ClientError> {
    match annotation(annotations, name) {
        Some(value) => read(value).ok_or_else(|| ClientError::Protocol {
            description: format!("the hub sent annotation {name} with an unusable value {value:?}"),
        }),
        None => Err(ClientError::Protocol {
            description: format!("the hub sent an event without the {name} annotation"),
        }),
    }
}

/// The event a delivered message carries.
pub(crate) fn decode_received(message: Message<Body<Value>>) -> Result<ReceivedEvent, ClientError> {
    let empty = Annotations::new();
    let annotations = message
        .message_annotations
        .as_ref()
        .map_or(&empty, |a| &a.0);
    let sequence_number = required(annotations, SEQUENCE_NUMBER_ANNOTATION, value_as_i64)?;
    let offset = required(annotations, OFFSET_ANNOTATION, value_as_u64)?;
    let enqueued_time_ms = required(annotations, ENQUEUED_TIME_ANNOTATION, value_as_i64)?;
    let partition_key = match annotation(annotations, PARTITION_KEY_ANNOTATION) {
        Some(Value::String(key)) => Some(key.clone()),
        Some(Value::Symbol(key)) => Some(key.0.clone()),
        _ => None,
    };
    let (message_id, correlation_id, content_type) = match message.properties {
        Some(p) => (
            p.message_id.map(message_id_text),
            p.correlation_id.map(message_id_text),
            p.content_type.map(|s| s.0),
        ),
        None => (None, None, None),
    };
    let properties = message
        .application_properties
        .map(|p| {
            p.0.into_iter()
                .map(|(key, value)| (key, property_from_amqp(value)))
                .collect()
        })
        .unwrap_or_default();
    let data = EventData {
        body: body_bytes(message.body),
        properties,
        partition_key,
        content_type,
        correlation_id,
        message_id,
        protocol_sections: None,
    };
    Ok(ReceivedEvent {
        sequence_number,
        offset,
        enqueued_time_ms,
        data,
    })
}

fn message_id_text(id: MessageId) -> String {
    match id {
        MessageId::String(s) => s,
        MessageId::Ulong(n) => n.to_string(),
        MessageId::Uuid(uuid) => uuid::Uuid::from_bytes(uuid.into_inner())
            .hyphenated()
            .to_string(),
        MessageId::Binary(bytes) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

fn body_bytes(body: Body<Value>) -> Bytes {
    match body {
        Body::Data(sections) => {
            let mut sections: Vec<Data> = sections.into_inner();
            if sections.len() == 1 {
                return Bytes::from(sections.pop().map(|d| d.0.into_vec()).unwrap_or_default());
            }
            let mut out = Vec::new();
            for section in sections {
                out.extend_from_slice(&section.0);
            }
            Bytes::from(out)
        }
        Body::Value(value) => match value.0 {
            Value::Binary(bytes) => Bytes::from(bytes.into_vec()),
            Value::String(text) => Bytes::from(text.into_bytes()),
            other => Bytes::from(serde_amqp::to_vec(&other).unwrap_or_default()),
        },
        Body::Sequence(sequences) => {
            let mut out = Vec::new();
            for sequence in sequences.into_inner() {
                out.extend(serde_amqp::to_vec(&sequence).unwrap_or_default());
            }
            Bytes::from(out)
        }
        Body::Empty => Bytes::new(),
    }
}

/// The partition's last-enqueued event from a delivery's annotations (the runtime metric),
/// when the hub sent it complete.
pub(crate) fn last_enqueued(
    annotations: Option<&DeliveryAnnotations>,
    now_ms: i64,
) -> Option<LastEnqueuedEventProperties> {
    let annotations = &annotations?.0;
    let sequence_number =
        annotation(annotations, "last_enqueued_sequence_number").and_then(value_as_i64)?;
    let offset = annotation(annotations, "last_enqueued_offset").and_then(value_as_u64)?;
    let enqueued_time_ms =
        annotation(annotations, "last_enqueued_time_utc").and_then(value_as_i64)?;
    let retrieved_time_ms = annotation(annotations, "runtime_info_retrieval_time_utc")
        .and_then(value_as_i64)
        .unwrap_or(now_ms);
    Some(LastEnqueuedEventProperties {
        sequence_number,
        offset,
        enqueued_time_ms,
        retrieved_time_ms,
    })
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp::types::messaging::message::DecodeIntoMessage;
    use serde_amqp::read::SliceReader;

    use super::*;

    fn decode(bytes: &[u8]) -> Message<Body<Value>> {
        <Body<Value> as DecodeIntoMessage>::decode_message_from_reader(SliceReader::new(bytes))
            .expect("decodes")
    }

    fn stamped(mut message: Message<Body<Value>>, seq: i64, offset: &str) -> Message<Body<Value>> {
        let annotations = message
            .message_annotations
            .get_or_insert_with(|| MessageAnnotations(Annotations::new()));
        annotations
            .0
            .insert(OwnedKey::from(SEQUENCE_NUMBER_ANNOTATION), Value::Long(seq));
        annotations.0.insert(
            OwnedKey::from(OFFSET_ANNOTATION),
            Value::String(offset.to_owned()),
        );
        annotations.0.insert(
            OwnedKey::from(ENQUEUED_TIME_ANNOTATION),
            Value::Timestamp(Timestamp::from_milliseconds(1_700_000_000_123)),
        );
        message
    }

    fn every_property() -> EventData {
        EventData::new("hello")
            .with_property("null", PropertyValue::Null)
            .with_property("bool", PropertyValue::Bool(true))
            .with_property("i32", PropertyValue::Int32(-7))
            .with_property("i64", PropertyValue::Int64(1 << 40))
            .with_property("u32", PropertyValue::UInt32(7))
            .with_property("u64", PropertyValue::UInt64(u64::MAX))
            .with_property("f32", PropertyValue::Float32(1.5))
            .with_property("f64", PropertyValue::Float64(-2.25))
            .with_property("string", PropertyValue::String("ü".to_owned()))
            .with_property(
                "bytes",
                PropertyValue::Bytes(Bytes::from_static(b"\x00\x01")),
            )
            .with_property("time", PropertyValue::Timestamp(1_700_000_000_000))
            .with_property("uuid", PropertyValue::Uuid([9; 16]))
    }

    #[test]
    fn an_event_round_trips_through_its_encoding() {
        let mut event = every_property();
        event.message_id = Some("m-1".to_owned());
        event.correlation_id = Some("c-1".to_owned());
        event.content_type = Some("text/plain".to_owned());
        let message = event_to_message(&event, Some("device-17"));
        let bytes = encode_message(&message).unwrap();
        let received = decode_received(stamped(decode(&bytes), 5, "4096")).unwrap();
        assert_eq!(received.sequence_number, 5);
        assert_eq!(received.offset, 4096);
        assert_eq!(received.enqueued_time_ms, 1_700_000_000_123);
        event.partition_key = Some("device-17".to_owned());
        assert_eq!(received.data, event);
    }

    #[test]
    fn a_single_event_is_a_plain_message_and_several_are_a_batch() {
        let one = outgoing(&[EventData::new("a")], None).unwrap();
        assert_eq!(one.message_format, 0);
        assert_eq!(one.message.body.len(), 1);
        let events: Vec<EventData> = (0..3).map(|i| EventData::new(format!("e{i}"))).collect();
        let batch = outgoing(&events, Some("k")).unwrap();
        assert_eq!(batch.message_format, BATCH_MESSAGE_FORMAT);
        assert_eq!(batch.message.body.len(), 3);
        assert!(
            annotation(
                &batch.message.message_annotations.as_ref().unwrap().0,
                PARTITION_KEY_ANNOTATION
            )
            .is_some()
        );
        // Each data section is a complete message of its own, carrying the key too.
        for (i, section) in batch.message.body.iter().enumerate() {
            let inner = decode(&section.0);
            let event = decode_received(stamped(inner, 0, "0")).unwrap();
            assert_eq!(event.data.body, Bytes::from(format!("e{i}")));
            assert_eq!(event.data.partition_key.as_deref(), Some("k"));
        }
        let sections: usize = batch
            .message
            .body
            .iter()
            .map(|section| serde_amqp::to_vec(section).unwrap().len())
            .sum();
        assert!(batch.encoded_len().unwrap() > sections as u64);
    }

    #[test]
    fn missing_system_annotations_are_a_protocol_error() {
        let message =
            decode(&encode_message(&event_to_message(&EventData::new("x"), None)).unwrap());
        let err = decode_received(message).unwrap_err();
        assert!(matches!(err, ClientError::Protocol { .. }), "{err}");
    }

    #[test]
    fn bodies_of_every_kind_become_bytes() {
        use fe2o3_amqp::types::messaging::{AmqpSequence, AmqpValue};
        assert_eq!(body_bytes(Body::Empty), Bytes::new());
        assert_eq!(
            body_bytes(Body::Value(AmqpValue(Value::String("text".to_owned())))),
            Bytes::from_static(b"text")
        );
        assert_eq!(
            body_bytes(Body::Data(Batch::from(vec![
                Data(Binary::from(b"ab".to_vec())),
                Data(Binary::from(b"cd".to_vec())),
            ]))),
            Bytes::from_static(b"abcd")
        );
        let sequence = body_bytes(Body::Sequence(Batch::from(vec![AmqpSequence(vec![
            Value::Int(1),
        ])])));
        assert!(!sequence.is_empty());
    }

    #[test]
    fn received_types_without_a_twin_widen() {
        assert_eq!(
            property_from_amqp(SimpleValue::Ubyte(3)),
            PropertyValue::UInt32(3)
        );
        assert_eq!(
            property_from_amqp(SimpleValue::Short(-3)),
            PropertyValue::Int32(-3)
        );
        assert_eq!(
            property_from_amqp(SimpleValue::Symbol(Symbol::from("s"))),
            PropertyValue::String("s".to_owned())
        );
        assert_eq!(
            property_from_amqp(SimpleValue::Char('x')),
            PropertyValue::String("x".to_owned())
        );
        assert_eq!(message_id_text(MessageId::Ulong(42)), "42");
        assert_eq!(
            message_id_text(MessageId::Uuid(Uuid::from([0x11; 16]))),
            "11111111-1111-1111-1111-111111111111"
        );
    }

    #[test]
    fn selector_expressions_match_the_sdks() {
        let cases = [
            (
                EventPosition::Earliest,
                "amqp.annotation.x-opt-offset > '-1'",
            ),
            (
                EventPosition::Latest,
                "amqp.annotation.x-opt-offset > '@latest'",
            ),
            (
                EventPosition::Offset {
                    offset: 42,
                    inclusive: true,
                },
                "amqp.annotation.x-opt-offset >= '42'",
            ),
            (
                EventPosition::Offset {
                    offset: 42,
                    inclusive: false,
                },
                "amqp.annotation.x-opt-offset > '42'",
            ),
            (
                EventPosition::SequenceNumber {
                    sequence_number: 7,
                    inclusive: true,
                },
                "amqp.annotation.x-opt-sequence-number >= '7'",
            ),
            (
                EventPosition::EnqueuedTime {
                    enqueued_time_ms: 1_700_000_000_000,
                    inclusive: false,
                },
                "amqp.annotation.x-opt-enqueued-time > '1700000000000'",
            ),
        ];
        for (position, expected) in cases {
            assert_eq!(selector_expression(&position), expected);
        }
        let described = selector_filter(&EventPosition::Earliest);
        assert_eq!(described.descriptor, Descriptor::Code(0x468C_0000_0004));
    }

    #[test]
    fn addresses() {
        assert_eq!(sender_address("orders", None), "orders");
        assert_eq!(sender_address("orders", Some("3")), "orders/Partitions/3");
        assert_eq!(
            receiver_address("orders", "$Default", "0"),
            "orders/ConsumerGroups/$Default/Partitions/0"
        );
    }

    #[test]
    fn runtime_metric_annotations() {
        let mut annotations = Annotations::new();
        annotations.insert(
            OwnedKey::from("last_enqueued_sequence_number"),
            Value::Long(9),
        );
        annotations.insert(
            OwnedKey::from("last_enqueued_offset"),
            Value::String("900".to_owned()),
        );
        annotations.insert(
            OwnedKey::from("last_enqueued_time_utc"),
            Value::Timestamp(Timestamp::from_milliseconds(5)),
        );
        let props = last_enqueued(Some(&DeliveryAnnotations(annotations)), 77).unwrap();
        assert_eq!(
            props,
            LastEnqueuedEventProperties {
                sequence_number: 9,
                offset: 900,
                enqueued_time_ms: 5,
                retrieved_time_ms: 77
            }
        );
        assert_eq!(last_enqueued(None, 0), None);
    }

    #[test]
    fn decoding_arbitrary_messages_never_panics() {
        proptest::proptest!(|(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256))| {
            if let Ok(message) = <Body<Value> as DecodeIntoMessage>::decode_message_from_reader(SliceReader::new(&bytes)) {
                let _ = decode_received(message);
            }
        });
    }
}
