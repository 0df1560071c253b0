//! AMQP messages ↔ [`EventData`], faithfully both ways.
//!
//! # Into an event
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
//!   annotations are per hop and dropped; `x-opt-sequence-number`, `x-opt-offset` and
//!   `x-opt-enqueued-time` are the broker's to set and dropped.
//!
//! # Out of an event
//! The kept sections are decoded and merged back; the system annotations are added. A
//! receiver gets back the message the producer sent, plus the broker's annotations.

use bytes::Bytes;
use fe2o3_amqp_types::messaging::annotations::OwnedKey;
use fe2o3_amqp_types::messaging::{
    AmqpValue, ApplicationProperties, Body, Data, DeliveryAnnotations, Header, Message,
    MessageAnnotations, MessageId, Properties,
};
use fe2o3_amqp_types::primitives::{Binary, OrderedMap, SimpleValue, Symbol, Timestamp, Value};
use tributary_broker::LastEnqueuedEvent;
use tributary_event::{EventData, PropertyValue, ReceivedEvent};
use tributary_eventhubs::property::to_amqp as property_to_amqp;

/// A whole AMQP message as the engine decodes it.
pub(crate) type AmqpMessage = Message<Body<Value>>;

/// A message with no sections but an empty body.
pub(crate) fn empty_message() -> AmqpMessage {
    Message {
        header: None,
        delivery_annotations: None,
        message_annotations: None,
        properties: None,
        application_properties: None,
        body: Body::Empty,
        footer: None,
    }
}

/// The message annotation that carries a partition key.
pub(crate) use tributary_eventhubs::names::annotation::PARTITION_KEY;
use tributary_eventhubs::names::annotation::{ENQUEUED_TIME, OFFSET, SEQUENCE_NUMBER};
use tributary_eventhubs::names::runtime_metric::{
    LAST_ENQUEUED_OFFSET, LAST_ENQUEUED_SEQUENCE_NUMBER, LAST_ENQUEUED_TIME_UTC, RETRIEVAL_TIME_UTC,
};
/// The annotations the broker sets on delivery; dropped from what a producer sends.
pub(crate) const SYSTEM_ANNOTATIONS: [&str; 3] = [SEQUENCE_NUMBER, OFFSET, ENQUEUED_TIME];

fn symbol_key(key: &OwnedKey) -> Option<&str> {
    match key {
        OwnedKey::Symbol(s) => Some(s.as_str()),
        OwnedKey::Ulong(_) => None,
    }
}

/// The partition key annotation of a message, if it has one. Not a string → error.
pub(crate) fn partition_key(message: &AmqpMessage) -> Result<Option<String>, String> {
    let Some(annotations) = &message.message_annotations else {
        return Ok(None);
    };
    for (key, value) in annotations.0.iter() {
        if symbol_key(key) == Some(PARTITION_KEY) {
            return match value {
                Value::String(s) => Ok(Some(s.clone())),
                Value::Symbol(s) => Ok(Some(s.as_str().to_owned())),
                Value::Null => Ok(None),
                _ => Err("the x-opt-partition-key annotation must be a string".to_owned()),
            };
        }
    }
    Ok(None)
}

/// The parts of a message kept encoded.
#[derive(Default)]
struct Kept {
    header: Option<Header>,
    annotations: Option<MessageAnnotations>,
    properties: Option<Properties>,
    application_properties: OrderedMap<String, SimpleValue>,
    body: Option<Body<Value>>,
    footer: Option<fe2o3_amqp_types::messaging::Footer>,
}

impl Kept {
    fn encode(self) -> Result<Option<Bytes>, String> {
        let mut out = Vec::new();
        let mut put = |bytes: Result<Vec<u8>, serde_amqp::Error>| {
            bytes
                .map(|b| out.extend_from_slice(&b))
                .map_err(|e| format!("cannot encode a message section: {e}"))
        };
        if let Some(h) = &self.header {
            put(serde_amqp::to_vec(h))?;
        }
        if let Some(a) = &self.annotations {
            put(serde_amqp::to_vec(a))?;
        }
        if let Some(p) = &self.properties {
            put(serde_amqp::to_vec(p))?;
        }
        if !self.application_properties.is_empty() {
            put(serde_amqp::to_vec(&ApplicationProperties(
                self.application_properties,
            )))?;
        }
        if let Some(b) = &self.body {
            put(serde_amqp::to_vec(b))?;
        }
        if let Some(f) = &self.footer {
            put(serde_amqp::to_vec(f))?;
        }
        Ok((!out.is_empty()).then(|| Bytes::from(out)))
    }
}

/// What [`event_from_message`] stores as [`EventData::protocol_sections`] for a message whose
/// header is the only thing it keeps: the fast path in `ingest` asks here, so the encoding of
/// what is kept stays in one place.
pub(crate) fn kept_header(header: Header) -> Result<Option<Bytes>, String> {
    Kept {
        header: Some(header),
        ..Kept::default()
    }
    .encode()
}

/// Converts a decoded message into an event. With `route_by_key`, `x-opt-partition-key`
/// becomes the event's partition key; otherwise (a send to a partition) it stays an annotation.
pub(crate) fn event_from_message(
    message: AmqpMessage,
    route_by_key: bool,
) -> Result<EventData, String> {
    let mut event = EventData::default();
    let mut kept = Kept {
        header: message.header,
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
                        _ => {
                            return Err(
                                "the x-opt-partition-key annotation must be a string".into()
                            );
                        }
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
                event.properties.push((key.clone(), typed));
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

fn uuid_text(b: &[u8; 16]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
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
/// the twin alone for the twin types ([`tributary_eventhubs::property::twin`]); a symbol as a
/// string and kept, so AMQP receivers get a symbol back; any other type kept only.
fn property_from_amqp(value: &SimpleValue) -> (Option<PropertyValue>, bool) {
    match value {
        SimpleValue::Symbol(s) => (Some(PropertyValue::String(s.as_str().to_owned())), true),
        other => match tributary_eventhubs::property::twin(other) {
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

/// Decodes an encoded message (or the kept sections of an event) after checking its shape
/// strictly with [`tributary_eventhubs::scan::scan_message`], and every value in it with
/// [`check_well_formed`](tributary_amqp_codec::value::check_well_formed): `serde_amqp` trusts
/// the sizes and counts inside, and bytes that lie could otherwise panic it or overflow the
/// stack — from any peer, before it has authenticated (`$cbs` messages come here too).
pub(crate) fn decode_strict(sections: &[u8]) -> Result<AmqpMessage, String> {
    use fe2o3_amqp_types::messaging::message::DecodeIntoMessage;
    let scanned = tributary_eventhubs::scan::scan_message(sections).map_err(|e| e.to_string())?;
    tributary_amqp_codec::value::check_well_formed(sections).map_err(|e| e.to_string())?;
    // serde_amqp reads sections only in the specification's order.
    let ordered = tributary_eventhubs::scan::canonical_bytes(sections, &scanned);
    let reader = serde_amqp::read::SliceReader::new(&ordered);
    <Body<Value> as DecodeIntoMessage>::decode_message_from_reader(reader)
        .map_err(|e| e.to_string())
}

/// Builds the message a receiver gets for a stored event. `runtime` adds the last-enqueued
/// delivery annotations a link asked for with `com.microsoft:enable-receiver-runtime-metric`.
pub(crate) fn message_for_delivery(
    event: &ReceivedEvent,
    runtime: Option<&LastEnqueuedEvent>,
) -> AmqpMessage {
    let data = &event.data;
    let mut message = match data.protocol_sections.as_deref().map(decode_strict) {
        Some(Ok(kept)) => kept,
        Some(Err(e)) => {
            tracing::warn!(sequence_number = event.sequence_number, error = %e, "ignoring undecodable protocol sections");
            empty_message()
        }
        None => empty_message(),
    };
    let mut annotations = message
        .message_annotations
        .take()
        .map(|a| a.0)
        .unwrap_or_default();
    if let Some(key) = &data.partition_key {
        annotations.insert(OwnedKey::from(PARTITION_KEY), Value::String(key.clone()));
    }
    annotations.insert(
        OwnedKey::from(SEQUENCE_NUMBER),
        Value::Long(event.sequence_number),
    );
    annotations.insert(
        OwnedKey::from(OFFSET),
        Value::String(event.offset.to_string()),
    );
    annotations.insert(
        OwnedKey::from(ENQUEUED_TIME),
        Value::Timestamp(Timestamp::from_milliseconds(event.enqueued_time_ms)),
    );
    message.message_annotations = Some(MessageAnnotations(annotations));
    message.properties = merge_properties(message.properties.take(), data);
    message.application_properties =
        merge_application_properties(message.application_properties.take(), data);
    if message.body.is_empty() {
        message.body = Body::Data(vec![Data(Binary::from(data.body.to_vec()))].into());
    }
    message.delivery_annotations = runtime.map(runtime_annotations);
    message
}

fn merge_properties(kept: Option<Properties>, data: &EventData) -> Option<Properties> {
    let mut p = kept.unwrap_or_default();
    if p.message_id.is_none() {
        p.message_id = data.message_id.clone().map(MessageId::String);
    }
    if p.correlation_id.is_none() {
        p.correlation_id = data.correlation_id.clone().map(MessageId::String);
    }
    if p.content_type.is_none() {
        p.content_type = data.content_type.clone().map(Symbol::from);
    }
    (p != Properties::default()).then_some(p)
}

fn merge_application_properties(
    kept: Option<ApplicationProperties>,
    data: &EventData,
) -> Option<ApplicationProperties> {
    let mut kept = kept.map(|a| a.0).unwrap_or_default();
    let mut out = OrderedMap::new();
    for (key, value) in &data.properties {
        let amqp = kept
            .swap_remove(key)
            .unwrap_or_else(|| property_to_amqp(value));
        out.insert(key.clone(), amqp);
    }
    for (key, value) in kept.into_iter() {
        out.insert(key, value);
    }
    (!out.is_empty()).then_some(ApplicationProperties(out))
}

fn runtime_annotations(last: &LastEnqueuedEvent) -> DeliveryAnnotations {
    let mut map = OrderedMap::new();
    let timestamp = |ms: i64| Value::Timestamp(Timestamp::from_milliseconds(ms));
    map.insert(
        OwnedKey::from(LAST_ENQUEUED_SEQUENCE_NUMBER),
        Value::Long(last.sequence_number),
    );
    map.insert(
        OwnedKey::from(LAST_ENQUEUED_OFFSET),
        Value::String(
            last.offset
                .map_or_else(|| "-1".to_owned(), |o| o.to_string()),
        ),
    );
    map.insert(
        OwnedKey::from(LAST_ENQUEUED_TIME_UTC),
        timestamp(last.enqueued_time_ms.unwrap_or(0)),
    );
    map.insert(
        OwnedKey::from(RETRIEVAL_TIME_UTC),
        timestamp(last.retrieved_time_ms),
    );
    DeliveryAnnotations(map)
}

/// An amqp-value body holding `value`.
pub(crate) fn value_body(value: Value) -> Body<Value> {
    Body::Value(AmqpValue(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp_types::messaging::AmqpSequence;
    use fe2o3_amqp_types::primitives::Uuid;

    fn received(data: EventData) -> ReceivedEvent {
        ReceivedEvent {
            sequence_number: 7,
            offset: 4096,
            enqueued_time_ms: 1_700_000_000_123,
            data,
        }
    }

    fn annotation<'a>(m: &'a AmqpMessage, key: &str) -> Option<&'a Value> {
        m.message_annotations
            .as_ref()?
            .0
            .iter()
            .find(|(k, _)| symbol_key(k) == Some(key))
            .map(|(_, v)| v)
    }

    fn full_message() -> AmqpMessage {
        let mut ma = OrderedMap::new();
        ma.insert(OwnedKey::from(PARTITION_KEY), Value::String("k".into()));
        ma.insert(OwnedKey::from("x-custom"), Value::Int(5));
        ma.insert(OwnedKey::from(SEQUENCE_NUMBER), Value::Long(999));
        let mut ap = OrderedMap::new();
        ap.insert("s".to_owned(), SimpleValue::String("v".into()));
        ap.insert("i".to_owned(), SimpleValue::Int(-3));
        ap.insert("l".to_owned(), SimpleValue::Long(1 << 40));
        ap.insert("sym".to_owned(), SimpleValue::Symbol(Symbol::from("abc")));
        ap.insert("short".to_owned(), SimpleValue::Short(12));
        ap.insert("f".to_owned(), SimpleValue::Double(1.5.into()));
        ap.insert("u".to_owned(), SimpleValue::Uuid(Uuid::from([9u8; 16])));
        AmqpMessage {
            header: Some(Header {
                durable: true,
                ..Header::default()
            }),
            delivery_annotations: None,
            message_annotations: Some(MessageAnnotations(ma)),
            properties: Some(Properties {
                message_id: Some(MessageId::Uuid(Uuid::from([1u8; 16]))),
                correlation_id: Some(MessageId::String("corr".into())),
                content_type: Some(Symbol::from("application/json")),
                subject: Some("subj".into()),
                ..Properties::default()
            }),
            application_properties: Some(ApplicationProperties(ap)),
            body: Body::Data(vec![Data(Binary::from(b"payload".to_vec()))].into()),
            footer: None,
        }
    }

    #[test]
    fn a_message_maps_to_an_event_and_back_unchanged() {
        let original = full_message();
        let event = event_from_message(original.clone(), true).unwrap();
        assert_eq!(&event.body[..], b"payload");
        assert_eq!(event.partition_key.as_deref(), Some("k"));
        assert_eq!(event.content_type.as_deref(), Some("application/json"));
        assert_eq!(event.correlation_id.as_deref(), Some("corr"));
        assert_eq!(
            event.message_id.as_deref(),
            Some("01010101-0101-0101-0101-010101010101")
        );
        assert_eq!(event.property("i"), Some(&PropertyValue::Int32(-3)));
        assert_eq!(event.property("l"), Some(&PropertyValue::Int64(1 << 40)));
        assert_eq!(
            event.property("sym"),
            Some(&PropertyValue::String("abc".into()))
        );
        assert_eq!(event.property("f"), Some(&PropertyValue::Float64(1.5)));
        assert_eq!(event.property("u"), Some(&PropertyValue::Uuid([9u8; 16])));
        assert_eq!(event.property("short"), None, "kept encoded only");

        let back = message_for_delivery(&received(event), None);
        assert_eq!(back.header, original.header);
        assert_eq!(back.properties, original.properties);
        // The same map; a property kept only encoded moves to the end (map order carries no
        // meaning in AMQP).
        let sorted = |m: &Option<ApplicationProperties>| {
            let mut v: Vec<_> = m
                .as_ref()
                .unwrap()
                .0
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        assert_eq!(
            sorted(&back.application_properties),
            sorted(&original.application_properties)
        );
        assert_eq!(back.body, original.body);
        assert_eq!(annotation(&back, "x-custom"), Some(&Value::Int(5)));
        assert_eq!(
            annotation(&back, PARTITION_KEY),
            Some(&Value::String("k".into()))
        );
        assert_eq!(annotation(&back, SEQUENCE_NUMBER), Some(&Value::Long(7)));
        assert_eq!(
            annotation(&back, OFFSET),
            Some(&Value::String("4096".into()))
        );
        assert_eq!(
            annotation(&back, ENQUEUED_TIME),
            Some(&Value::Timestamp(Timestamp::from_milliseconds(
                1_700_000_000_123
            )))
        );
        assert_eq!(back.delivery_annotations, None);
    }

    #[test]
    fn value_and_sequence_bodies_round_trip() {
        for body in [
            value_body(Value::String("hello".into())),
            Body::Sequence(vec![AmqpSequence(vec![Value::Int(1), Value::Bool(true)])].into()),
            Body::Data(vec![Data(Binary::from(vec![1])), Data(Binary::from(vec![2, 3]))].into()),
        ] {
            let message = AmqpMessage {
                body: body.clone(),
                ..empty_message()
            };
            let event = event_from_message(message, false).unwrap();
            assert!(event.protocol_sections.is_some());
            let back = message_for_delivery(&received(event), None);
            assert_eq!(back.body, body);
        }
    }

    #[test]
    fn a_partition_send_keeps_the_key_as_an_annotation() {
        let event = event_from_message(full_message(), false).unwrap();
        assert_eq!(event.partition_key, None);
        let back = message_for_delivery(&received(event), None);
        assert_eq!(
            annotation(&back, PARTITION_KEY),
            Some(&Value::String("k".into()))
        );
    }

    #[test]
    fn events_from_other_front_doors_become_plain_messages() {
        let data = EventData::new(&b"x"[..])
            .with_property("n", PropertyValue::Int64(1))
            .with_property("t", PropertyValue::Timestamp(5))
            .with_property("b", PropertyValue::Bytes(Bytes::from_static(b"\x00")));
        let last = LastEnqueuedEvent {
            sequence_number: 10,
            offset: Some(20),
            enqueued_time_ms: Some(30),
            retrieved_time_ms: 40,
        };
        let back = message_for_delivery(&received(data), Some(&last));
        assert_eq!(
            back.body,
            Body::Data(vec![Data(Binary::from(b"x".to_vec()))].into())
        );
        let ap = back.application_properties.unwrap().0;
        assert_eq!(ap.get("n"), Some(&SimpleValue::Long(1)));
        assert_eq!(
            ap.get("t"),
            Some(&SimpleValue::Timestamp(Timestamp::from_milliseconds(5)))
        );
        let da = back.delivery_annotations.unwrap().0;
        assert_eq!(
            da.get(&OwnedKey::from("last_enqueued_offset")),
            Some(&Value::String("20".into()))
        );
        assert_eq!(back.properties, None);
    }

    #[test]
    fn bad_partition_keys_and_duplicate_properties_are_refused() {
        let mut m = full_message();
        let ma = m.message_annotations.as_mut().unwrap();
        ma.0.insert(OwnedKey::from(PARTITION_KEY), Value::Int(1));
        assert!(event_from_message(m.clone(), true).is_err());
        assert!(partition_key(&m).is_err());
    }
}
