//! The general ingest path: a producer's message decoded strictly into `fe2o3-amqp`'s message,
//! then converted into an [`EventData`], faithfully.
//!
//! - One `data` section is the body. Several `data` sections, an `amqp-value` or
//!   `amqp-sequence` body are kept encoded (see below); several `data` sections are also
//!   concatenated into the body so other front doors see the bytes.
//! - Application properties of type null, bool, int, long, uint, ulong, float, double, string,
//!   binary, timestamp and uuid become typed [`PropertyValue`]s; a symbol becomes a string (and is
//!   also kept encoded, so AMQP receivers get a symbol back); any other type is kept encoded only.
//! - `message-id` / `correlation-id` (strings; uuids and ulongs as text, with the exact value kept
//!   encoded) and `content-type` map to their fields; `x-opt-partition-key` becomes the partition
//!   key when the send routes by key.
//! - Everything else — the header, other message annotations, other properties, the footer — is
//!   kept as encoded AMQP sections in [`EventData::protocol_sections`] (a partial AMQP message:
//!   the sections in their standard order, no body section unless the body was kept). Delivery
//!   annotations are kept too, as Event Hubs keeps a sender's and delivers them with the event;
//!   the runtime-metric ones (`last_enqueued_*`, `runtime_info_retrieval_time_utc`) and
//!   `x-opt-sequence-number`, `x-opt-offset` and `x-opt-enqueued-time` are the broker's to set
//!   on delivery and dropped.
//!
//! The way back — the kept sections merged with the event — is
//! [`deliver`](crate::deliver)'s general path.

use bytes::Bytes;
use fe2o3_amqp_types::messaging::annotations::OwnedKey;
use fe2o3_amqp_types::messaging::{
    AmqpValue, ApplicationProperties, Body, DeliveryAnnotations, Header, MessageAnnotations,
    MessageId, Properties,
};
use fe2o3_amqp_types::primitives::{OrderedMap, SimpleValue, Symbol, Value};
use tributary_event::{EventData, PropertyValue, SmolStr};

use crate::message::{AmqpMessage, MessageError};
use crate::names::annotation::{ENQUEUED_TIME, OFFSET, PARTITION_KEY, SEQUENCE_NUMBER};
use crate::names::runtime_metric::{
    LAST_ENQUEUED_OFFSET, LAST_ENQUEUED_SEQUENCE_NUMBER, LAST_ENQUEUED_TIME_UTC, RETRIEVAL_TIME_UTC,
};
use crate::scan::{canonical_bytes, scan_message};
use tributary_event::uuid_text;

/// The annotations the broker sets on delivery; dropped from what a producer sends.
pub(crate) const SYSTEM_ANNOTATIONS: [&str; 3] = [SEQUENCE_NUMBER, OFFSET, ENQUEUED_TIME];

/// The delivery annotations the broker sets on delivery to a link that asked for runtime
/// metrics; dropped from what a producer sends (a copy of a received event may carry them).
pub(crate) const RUNTIME_ANNOTATIONS: [&str; 4] = [
    LAST_ENQUEUED_SEQUENCE_NUMBER,
    LAST_ENQUEUED_OFFSET,
    LAST_ENQUEUED_TIME_UTC,
    RETRIEVAL_TIME_UTC,
];

/// A sender's delivery annotations as they are kept: without the runtime-metric ones; None
/// when nothing is left.
pub(crate) fn kept_delivery_annotations(
    annotations: Option<DeliveryAnnotations>,
) -> Option<DeliveryAnnotations> {
    let mut kept = annotations?.0;
    kept.as_inner_mut()
        .retain(|key, _| !symbol_key(key).is_some_and(|k| RUNTIME_ANNOTATIONS.contains(&k)));
    (!kept.is_empty()).then_some(DeliveryAnnotations(kept))
}

/// A message annotation's key as text, if it is a symbol.
pub(crate) fn symbol_key(key: &OwnedKey) -> Option<&str> {
    match key {
        OwnedKey::Symbol(s) => Some(s.as_str()),
        OwnedKey::Ulong(_) => None,
    }
}

/// Why a partition key annotation is refused.
fn not_a_string_key() -> MessageError {
    MessageError::Malformed("the x-opt-partition-key annotation must be a string".to_owned())
}

/// The partition key annotation of a message, if it has one. Not a string → error.
pub(crate) fn partition_key(message: &AmqpMessage) -> Result<Option<String>, MessageError> {
    let Some(annotations) = &message.message_annotations else {
        return Ok(None);
    };
    for (key, value) in annotations.0.iter() {
        if symbol_key(key) == Some(PARTITION_KEY) {
            return match value {
                Value::String(s) => Ok(Some(s.clone())),
                Value::Symbol(s) => Ok(Some(s.as_str().to_owned())),
                Value::Null => Ok(None),
                _ => Err(not_a_string_key()),
            };
        }
    }
    Ok(None)
}

/// The parts of a message kept encoded.
#[derive(Default)]
struct Kept {
    header: Option<Header>,
    delivery_annotations: Option<DeliveryAnnotations>,
    annotations: Option<MessageAnnotations>,
    properties: Option<Properties>,
    application_properties: OrderedMap<String, SimpleValue>,
    body: Option<Body<Value>>,
    footer: Option<fe2o3_amqp_types::messaging::Footer>,
}

impl Kept {
    fn encode(self) -> Result<Option<Bytes>, MessageError> {
        let mut out = Vec::new();
        let mut put = |bytes: Result<Vec<u8>, serde_amqp::Error>| {
            bytes
                .map(|b| out.extend_from_slice(&b))
                .map_err(|e| MessageError::Encode(format!("a message section: {e}")))
        };
        if let Some(h) = &self.header {
            put(crate::foreign::to_vec(h))?;
        }
        if let Some(d) = &self.delivery_annotations {
            put(crate::foreign::check_annotations(&d.0).and_then(|()| crate::foreign::to_vec(d)))?;
        }
        if let Some(a) = &self.annotations {
            put(crate::foreign::check_annotations(&a.0).and_then(|()| crate::foreign::to_vec(a)))?;
        }
        if let Some(p) = &self.properties {
            put(crate::foreign::to_vec(p))?;
        }
        if !self.application_properties.is_empty() {
            put(crate::foreign::to_vec(&ApplicationProperties(
                self.application_properties,
            )))?;
        }
        if let Some(b) = &self.body {
            put(crate::foreign::check_body(b).and_then(|()| crate::foreign::to_vec(b)))?;
        }
        if let Some(f) = &self.footer {
            put(crate::foreign::check_annotations(&f.0).and_then(|()| crate::foreign::to_vec(f)))?;
        }
        Ok((!out.is_empty()).then(|| Bytes::from(out)))
    }
}

/// What [`event_from_message`] keeps of a message whose delivery annotations are the only thing
/// it keeps (a received event's, which a copy carries on): the encoded section, or None when
/// only runtime-metric annotations (or none) were there.
pub(crate) fn delivery_annotations_section(
    annotations: Option<DeliveryAnnotations>,
) -> Result<Option<Bytes>, MessageError> {
    Kept {
        delivery_annotations: kept_delivery_annotations(annotations),
        ..Kept::default()
    }
    .encode()
}

/// What [`event_from_message`] stores as [`EventData::protocol_sections`] for a message whose
/// header is the only thing it keeps: the fast path asks here, so the encoding of
/// what is kept stays in one place.
pub(crate) fn kept_header(header: Header) -> Result<Option<Bytes>, MessageError> {
    Kept {
        header: Some(header),
        ..Kept::default()
    }
    .encode()
}

/// Converts a decoded message into an event. With `route_by_key`, `x-opt-partition-key`
/// becomes the event's partition key; otherwise (a send to a partition) it stays an annotation.
pub fn event_from_message(
    message: AmqpMessage,
    route_by_key: bool,
) -> Result<EventData, MessageError> {
    let mut event = EventData::default();
    let mut kept = Kept {
        header: message.header,
        delivery_annotations: kept_delivery_annotations(message.delivery_annotations),
        footer: message.footer,
        ..Kept::default()
    };
    if let Some(annotations) = message.message_annotations {
        let mut rest = OrderedMap::new();
        for (key, value) in annotations.0.into_iter() {
            match symbol_key(&key) {
                Some(PARTITION_KEY) if route_by_key => {
                    event.partition_key = match value {
                        Value::String(s) => Some(s),
                        Value::Symbol(s) => Some(s.into_inner()),
                        Value::Null => None,
                        _ => return Err(not_a_string_key()),
                    };
                }
                Some(k) if SYSTEM_ANNOTATIONS.contains(&k) => {}
                _ => {
                    rest.insert(key, value);
                }
            }
        }
        kept.annotations = (!rest.is_empty()).then_some(MessageAnnotations(rest));
    }
    if let Some(properties) = message.properties {
        kept.properties = map_properties(properties, &mut event);
    }
    if let Some(application_properties) = message.application_properties {
        // Keys are unique here: the decoded map keeps a repeated key once (its first place,
        // its last value), as the fast path's fallback relies on.
        for (key, value) in application_properties.0.into_iter() {
            let (typed, keep) = property_from_amqp(&value);
            if let Some(typed) = typed {
                event.properties.push((SmolStr::new(&key), typed));
            }
            if keep {
                kept.application_properties.insert(key, value);
            }
        }
    }
    map_body(message.body, &mut event, &mut kept);
    event.protocol_sections = kept.encode()?;
    Ok(event)
}

fn message_id_text(id: &MessageId) -> Option<String> {
    match id {
        MessageId::String(s) => Some(s.clone()),
        MessageId::Ulong(n) => Some(n.to_string()),
        MessageId::Uuid(u) => Some(uuid_text(u.as_inner())),
        MessageId::Binary(_) => None,
    }
}

/// Moves message-id, correlation-id and content-type into the event; returns what is left to
/// keep (non-string ids stay, exactly typed).
fn map_properties(mut p: Properties, event: &mut EventData) -> Option<Properties> {
    if let Some(id) = p.message_id.take() {
        event.message_id = message_id_text(&id);
        if !matches!(id, MessageId::String(_)) {
            p.message_id = Some(id);
        }
    }
    if let Some(id) = p.correlation_id.take() {
        event.correlation_id = message_id_text(&id);
        if !matches!(id, MessageId::String(_)) {
            p.correlation_id = Some(id);
        }
    }
    event.content_type = p.content_type.take().map(Symbol::into_inner);
    (p != Properties::default()).then_some(p)
}

/// The typed value of an application property, and whether the AMQP value must also be kept:
/// the twin alone for the twin types ([`crate::property::twin`]); a symbol as a
/// string and kept, so AMQP receivers get a symbol back; any other type kept only.
fn property_from_amqp(value: &SimpleValue) -> (Option<PropertyValue>, bool) {
    match value {
        SimpleValue::Symbol(s) => (Some(PropertyValue::String(SmolStr::new(s.as_str()))), true),
        other => match crate::property::twin(other) {
            Some(typed) => (Some(typed), false),
            None => (None, true),
        },
    }
}

fn map_body(body: Body<Value>, event: &mut EventData, kept: &mut Kept) {
    match body {
        Body::Data(sections) if sections.len() == 1 => {
            let data = sections.into_iter().next().expect("one section");
            event.body = Bytes::from(data.0.into_vec());
        }
        Body::Data(sections) => {
            let joined: Vec<u8> = sections.iter().flat_map(|d| d.0.iter().copied()).collect();
            event.body = Bytes::from(joined);
            kept.body = Some(Body::Data(sections));
        }
        Body::Empty => {}
        other => kept.body = Some(other),
    }
}

/// Whether `event` came from a message whose body is an `amqp-value` (other than null) or
/// `amqp-sequence`: such a body is kept in its protocol sections and its `body` is empty, so a
/// compacted hub would take it, with a key, for a tombstone (a key and an empty body).
pub fn has_structured_body(event: &EventData) -> bool {
    let Some(sections) = event.protocol_sections.as_ref() else {
        return false;
    };
    if !event.body.is_empty() {
        return false;
    }
    decode_strict(sections).is_ok_and(|message| match message.body {
        Body::Value(AmqpValue(Value::Null)) | Body::Empty | Body::Data(_) => false,
        Body::Value(_) | Body::Sequence(_) => true,
    })
}

/// Decodes an encoded message (or the kept sections of an event) after checking its shape
/// strictly with [`scan_message`] (which also takes delivery annotations written last, as
/// pyamqp writes them, and puts them in their place), and every value in it with
/// [`check_well_formed`](tributary_amqp_codec::value::check_well_formed): `serde_amqp` trusts
/// the sizes and counts inside, and bytes that lie could otherwise panic it or overflow the
/// stack — from any peer, before it has authenticated (`$cbs` messages come here too).
pub fn decode_strict(sections: &[u8]) -> Result<AmqpMessage, MessageError> {
    use fe2o3_amqp_types::messaging::message::DecodeIntoMessage;
    let malformed = |e: &dyn std::fmt::Display| MessageError::Malformed(e.to_string());
    let scanned = scan_message(sections).map_err(|e| malformed(&e))?;
    tributary_amqp_codec::value::check_well_formed(sections).map_err(|e| malformed(&e))?;
    // serde_amqp reads sections only in the specification's order.
    let ordered = canonical_bytes(sections, &scanned);
    let reader = serde_amqp::read::SliceReader::new(&ordered);
    <Body<Value> as DecodeIntoMessage>::decode_message_from_reader(reader)
        .map_err(|e| malformed(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deliver::general::tests::full_message;

    #[test]
    fn bad_partition_keys_are_refused() {
        let mut m = full_message();
        let ma = m.message_annotations.as_mut().unwrap();
        ma.0.insert(OwnedKey::from(PARTITION_KEY), Value::Int(1));
        assert!(event_from_message(m.clone(), true).is_err());
        assert!(partition_key(&m).is_err());
    }

    #[test]
    fn an_amqp_value_or_sequence_body_is_structured_and_a_null_or_data_body_is_not() {
        use fe2o3_amqp_types::messaging::{AmqpSequence, Data};
        let with_body = |body: Body<Value>| {
            let mut m = crate::message::empty_message();
            m.body = body;
            event_from_message(m, true).unwrap()
        };
        let text = with_body(Body::Value(AmqpValue(Value::String("x".into()))));
        assert!(text.body.is_empty());
        assert!(has_structured_body(&text));
        let sequence = with_body(Body::Sequence(
            vec![AmqpSequence(vec![Value::Int(1)])].into(),
        ));
        assert!(has_structured_body(&sequence));
        for plain in [
            Body::Value(AmqpValue(Value::Null)),
            Body::Empty,
            Body::Data(vec![Data(Vec::new().into())].into()),
        ] {
            assert!(!has_structured_body(&with_body(plain)));
        }
    }
}
