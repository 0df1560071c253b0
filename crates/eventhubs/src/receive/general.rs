//! Receive, the general path: a delivered message decoded by `fe2o3-amqp` into a
//! [`ReceivedEvent`], for what the fast path in [`super`] leaves to it.
//!
//! `x-opt-sequence-number` (long), `x-opt-offset` (decimal string), `x-opt-enqueued-time`
//! (timestamp) and `x-opt-partition-key` (string) come from the message annotations; a hub that
//! leaves out any of the first three is misbehaving ([`MessageError::Malformed`]). Bodies made
//! of `data` sections are concatenated; an `amqp-value` holding binary or a string gives those
//! bytes; any other body (a sequence, another value) is kept as its AMQP encoding.
//! Application-property types with no [`PropertyValue`](tributary_event::PropertyValue) twin
//! widen ([`crate::property::widen`]). Message ids that are not strings arrive as text (`ulong`
//! in decimal, `uuid` hyphenated, `binary` in hex).
//!
//! Nothing here panics on what a peer sends: every field is checked and a bad one is an error.

use bytes::Bytes;
use fe2o3_amqp_types::messaging::annotations::{Annotations, OwnedKey};
use fe2o3_amqp_types::messaging::{Body, Data, DeliveryAnnotations, Message, MessageId};
use fe2o3_amqp_types::primitives::Value;
use tributary_event::{EventData, ReceivedEvent, SmolStr, uuid_text};

use crate::message::{LastEnqueued, MessageError};
use crate::names::annotation::{
    ENQUEUED_TIME as ENQUEUED_TIME_ANNOTATION, OFFSET as OFFSET_ANNOTATION,
    PARTITION_KEY as PARTITION_KEY_ANNOTATION, SEQUENCE_NUMBER as SEQUENCE_NUMBER_ANNOTATION,
};
use crate::names::runtime_metric::{
    LAST_ENQUEUED_OFFSET, LAST_ENQUEUED_SEQUENCE_NUMBER, LAST_ENQUEUED_TIME_UTC, RETRIEVAL_TIME_UTC,
};

pub(crate) fn annotation<'a>(annotations: &'a Annotations, name: &str) -> Option<&'a Value> {
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
) -> Result<T, MessageError> {
    match annotation(annotations, name) {
        Some(value) => read(value).ok_or_else(|| {
            MessageError::Malformed(format!(
                "the hub sent annotation {name} with an unusable value {value:?}"
            ))
        }),
        None => Err(MessageError::Malformed(format!(
            "the hub sent an event without the {name} annotation"
        ))),
    }
}

/// The event a delivered message carries.
pub(crate) fn decode_received(
    message: Message<Body<Value>>,
) -> Result<ReceivedEvent, MessageError> {
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
                .map(|(key, value)| (SmolStr::from(key), crate::property::widen(value)))
                .collect()
        })
        .unwrap_or_default();
    let data = EventData {
        body: body_bytes(message.body)?,
        properties,
        partition_key,
        content_type,
        correlation_id,
        message_id,
        // A sender's delivery annotations, kept as the hub keeps them: a copy of the event
        // (a replication task's) carries them on.
        protocol_sections: crate::ingest::general::delivery_annotations_section(
            message.delivery_annotations,
        )?,
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
        MessageId::Uuid(uuid) => uuid_text(uuid.as_inner()),
        MessageId::Binary(bytes) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

fn body_bytes(body: Body<Value>) -> Result<Bytes, MessageError> {
    let encode = |e: serde_amqp::Error| MessageError::Encode(format!("the message's body: {e}"));
    Ok(match body {
        Body::Data(sections) => {
            let mut sections: Vec<Data> = sections.into_inner();
            if sections.len() == 1 {
                return Ok(Bytes::from(
                    sections.pop().map(|d| d.0.into_vec()).unwrap_or_default(),
                ));
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
            other => {
                crate::foreign::check(&other).map_err(encode)?;
                Bytes::from(crate::foreign::to_vec(&other).map_err(encode)?)
            }
        },
        Body::Sequence(sequences) => {
            let mut out = Vec::new();
            for sequence in sequences.into_inner() {
                sequence
                    .0
                    .iter()
                    .try_for_each(crate::foreign::check)
                    .map_err(encode)?;
                out.extend(crate::foreign::to_vec(&sequence).map_err(encode)?);
            }
            Bytes::from(out)
        }
        Body::Empty => Bytes::new(),
    })
}

/// The partition's last-enqueued event from a delivery's annotations (the runtime metric),
/// when the hub sent it complete.
pub(crate) fn last_enqueued(
    annotations: Option<&DeliveryAnnotations>,
    now_ms: i64,
) -> Option<LastEnqueued> {
    let annotations = &annotations?.0;
    let sequence_number =
        annotation(annotations, LAST_ENQUEUED_SEQUENCE_NUMBER).and_then(value_as_i64)?;
    let offset = annotation(annotations, LAST_ENQUEUED_OFFSET).and_then(value_as_u64)?;
    let enqueued_time_ms =
        annotation(annotations, LAST_ENQUEUED_TIME_UTC).and_then(value_as_i64)?;
    let retrieved_time_ms = annotation(annotations, RETRIEVAL_TIME_UTC)
        .and_then(value_as_i64)
        .unwrap_or(now_ms);
    Some(LastEnqueued {
        sequence_number,
        offset: Some(offset),
        enqueued_time_ms: Some(enqueued_time_ms),
        retrieved_time_ms,
    })
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp_types::messaging::message::DecodeIntoMessage;
    use fe2o3_amqp_types::messaging::{Batch, MessageId};
    use fe2o3_amqp_types::primitives::{Binary, SimpleValue, Symbol, Timestamp, Uuid};
    use serde_amqp::read::SliceReader;
    use tributary_event::PropertyValue;

    use super::*;
    use crate::send::serde_reference::*;

    fn decode(bytes: &[u8]) -> Message<Body<Value>> {
        <Body<Value> as DecodeIntoMessage>::decode_message_from_reader(SliceReader::new(bytes))
            .expect("decodes")
    }

    #[test]
    fn missing_system_annotations_are_a_protocol_error() {
        let message =
            decode(&encode_message(&event_to_message(&EventData::new("x"), None)).unwrap());
        let err = decode_received(message).unwrap_err();
        assert!(matches!(err, MessageError::Malformed(_)), "{err}");
    }

    #[test]
    fn bodies_of_every_kind_become_bytes() {
        use fe2o3_amqp_types::messaging::{AmqpSequence, AmqpValue};
        let bytes = |body| body_bytes(body).unwrap();
        assert_eq!(bytes(Body::Empty), Bytes::new());
        assert_eq!(
            bytes(Body::Value(AmqpValue(Value::String("text".to_owned())))),
            Bytes::from_static(b"text")
        );
        assert_eq!(
            bytes(Body::Data(Batch::from(vec![
                Data(Binary::from(b"ab".to_vec())),
                Data(Binary::from(b"cd".to_vec())),
            ]))),
            Bytes::from_static(b"abcd")
        );
        let sequence = bytes(Body::Sequence(Batch::from(vec![AmqpSequence(vec![
            Value::Int(1),
        ])])));
        assert!(!sequence.is_empty());
    }

    /// A body the AMQP encoder cannot write again (a map with a timestamp key and a string
    /// value) is an error, not a panic and not an empty body.
    #[test]
    fn a_body_that_cannot_be_encoded_again_is_an_error() {
        use fe2o3_amqp_types::messaging::AmqpValue;
        use fe2o3_amqp_types::primitives::{OrderedMap, Timestamp};
        let mut map = OrderedMap::new();
        map.insert(
            Value::Timestamp(Timestamp::from_milliseconds(5)),
            Value::String("x".into()),
        );
        let error = body_bytes(Body::Value(AmqpValue(Value::Map(map)))).unwrap_err();
        assert!(matches!(error, MessageError::Encode(_)), "{error}");
    }

    #[test]
    fn received_types_without_a_twin_widen() {
        assert_eq!(
            crate::property::widen(SimpleValue::Ubyte(3)),
            PropertyValue::UInt32(3)
        );
        assert_eq!(
            crate::property::widen(SimpleValue::Short(-3)),
            PropertyValue::Int32(-3)
        );
        assert_eq!(
            crate::property::widen(SimpleValue::Symbol(Symbol::from("s"))),
            PropertyValue::String("s".into())
        );
        assert_eq!(
            crate::property::widen(SimpleValue::Char('x')),
            PropertyValue::String("x".into())
        );
        assert_eq!(message_id_text(MessageId::Ulong(42)), "42");
        assert_eq!(
            message_id_text(MessageId::Uuid(Uuid::from([0x11; 16]))),
            "11111111-1111-1111-1111-111111111111"
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
            LastEnqueued {
                sequence_number: 9,
                offset: Some(900),
                enqueued_time_ms: Some(5),
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
