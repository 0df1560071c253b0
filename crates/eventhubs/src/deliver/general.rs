//! The general delivery path: a stored event's kept protocol sections decoded and merged back,
//! the system annotations added, as `fe2o3-amqp`'s message. A receiver gets back the message
//! the producer sent, plus the broker's annotations: its delivery annotations too, as Event
//! Hubs delivers a sender's, beside the runtime-metric ones a link asked for.

use fe2o3_amqp_types::messaging::annotations::OwnedKey;
use fe2o3_amqp_types::messaging::{
    ApplicationProperties, Body, Data, DeliveryAnnotations, MessageAnnotations, MessageId,
    Properties,
};
use fe2o3_amqp_types::primitives::{Binary, OrderedMap, Symbol, Timestamp, Value};
use tributary_event::{EventData, ReceivedEvent};

use crate::ingest::decode_strict;
use crate::message::{AmqpMessage, LastEnqueued, empty_message};
use crate::names::annotation::{ENQUEUED_TIME, OFFSET, PARTITION_KEY, SEQUENCE_NUMBER};
use crate::names::runtime_metric::{
    LAST_ENQUEUED_OFFSET, LAST_ENQUEUED_SEQUENCE_NUMBER, LAST_ENQUEUED_TIME_UTC, RETRIEVAL_TIME_UTC,
};
use crate::property::to_amqp as property_to_amqp;

/// Builds the message a receiver gets for a stored event. `runtime` adds the last-enqueued
/// delivery annotations a link asked for with `com.microsoft:enable-receiver-runtime-metric`.
pub fn message_for_delivery(event: &ReceivedEvent, runtime: Option<&LastEnqueued>) -> AmqpMessage {
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
    message.delivery_annotations =
        merge_delivery_annotations(message.delivery_annotations, runtime);
    message
}

/// The sender's kept delivery annotations, then the runtime-metric ones (which the broker
/// alone sets: ingest drops a sender's).
fn merge_delivery_annotations(
    kept: Option<DeliveryAnnotations>,
    runtime: Option<&LastEnqueued>,
) -> Option<DeliveryAnnotations> {
    let Some(last) = runtime else { return kept };
    let mut merged = kept.map(|d| d.0).unwrap_or_default();
    for (key, value) in runtime_annotations(last).0.into_iter() {
        merged.insert(key, value);
    }
    Some(DeliveryAnnotations(merged))
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
            .swap_remove(key.as_str())
            .unwrap_or_else(|| property_to_amqp(value));
        out.insert(key.to_string(), amqp);
    }
    for (key, value) in kept.into_iter() {
        out.insert(key, value);
    }
    (!out.is_empty()).then_some(ApplicationProperties(out))
}

fn runtime_annotations(last: &LastEnqueued) -> DeliveryAnnotations {
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ingest::event_from_message;
    use crate::ingest::general::symbol_key;
    use crate::message::value_body;
    use bytes::Bytes;
    use fe2o3_amqp_types::messaging::AmqpSequence;
    use fe2o3_amqp_types::messaging::Header;
    use fe2o3_amqp_types::primitives::SimpleValue;
    use fe2o3_amqp_types::primitives::Uuid;
    use tributary_event::PropertyValue;

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

    pub(crate) fn full_message() -> AmqpMessage {
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

    /// A sender's delivery annotations are kept with the event and delivered, beside the
    /// runtime-metric ones the link asked for; runtime-metric annotations a sender wrote (a
    /// copy of a received event) are not kept.
    #[test]
    fn a_senders_delivery_annotations_are_delivered_beside_the_runtime_metric() {
        let mut sent = OrderedMap::new();
        sent.insert(
            OwnedKey::from("delann_key"),
            Value::String("delann_value".into()),
        );
        sent.insert(
            OwnedKey::from(LAST_ENQUEUED_SEQUENCE_NUMBER),
            Value::Long(-5),
        );
        let message = AmqpMessage {
            delivery_annotations: Some(DeliveryAnnotations(sent)),
            ..empty_message()
        };
        let event = event_from_message(message, false).unwrap();
        let delivered = |runtime| {
            message_for_delivery(&received(event.clone()), runtime)
                .delivery_annotations
                .map(|d| d.0.into_iter().collect::<Vec<_>>())
                .unwrap_or_default()
        };
        let kept = (
            OwnedKey::from("delann_key"),
            Value::String("delann_value".into()),
        );
        assert_eq!(delivered(None), std::slice::from_ref(&kept));
        let last = LastEnqueued {
            sequence_number: 9,
            offset: Some(4096),
            enqueued_time_ms: Some(1),
            retrieved_time_ms: 2,
        };
        let with_runtime = delivered(Some(&last));
        assert_eq!(with_runtime.len(), 5, "{with_runtime:?}");
        assert_eq!(with_runtime[0], kept);
        assert!(with_runtime.contains(&(
            OwnedKey::from(LAST_ENQUEUED_SEQUENCE_NUMBER),
            Value::Long(9)
        )));
        // Delivered through the fast writer's entry point too: the same bytes decode to it.
        let mut bytes = Vec::new();
        crate::deliver::write_delivery_message(&received(event.clone()), Some(&last), &mut bytes);
        let decoded = decode_strict(&bytes).unwrap();
        assert_eq!(
            decoded.delivery_annotations.unwrap().0.into_iter().next(),
            Some(kept)
        );
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
        let last = LastEnqueued {
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
}
