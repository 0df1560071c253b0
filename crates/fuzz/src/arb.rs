//! Structured inputs carved from a fuzzer's bytes with `arbitrary`: events as producers send
//! them.

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use tributary_event::{EventData, PropertyValue};

/// An application-property value of any type.
#[derive(Debug, Arbitrary)]
enum Value {
    Null,
    Bool(bool),
    Int32(i32),
    Int64(i64),
    UInt32(u32),
    UInt64(u64),
    Float32(f32),
    Float64(f64),
    String(String),
    Bytes(Vec<u8>),
    Timestamp(i64),
    Uuid([u8; 16]),
}

impl From<Value> for PropertyValue {
    fn from(value: Value) -> Self {
        match value {
            Value::Null => PropertyValue::Null,
            Value::Bool(v) => PropertyValue::Bool(v),
            Value::Int32(v) => PropertyValue::Int32(v),
            Value::Int64(v) => PropertyValue::Int64(v),
            Value::UInt32(v) => PropertyValue::UInt32(v),
            Value::UInt64(v) => PropertyValue::UInt64(v),
            Value::Float32(v) => PropertyValue::Float32(v),
            Value::Float64(v) => PropertyValue::Float64(v),
            Value::String(v) => PropertyValue::String(v.into()),
            Value::Bytes(v) => PropertyValue::Bytes(v.into()),
            Value::Timestamp(v) => PropertyValue::Timestamp(v),
            Value::Uuid(v) => PropertyValue::Uuid(v),
        }
    }
}

/// An event a producer could send: any body, properties with unique keys, the optional fields.
#[derive(Debug, Arbitrary)]
struct Event {
    body: Vec<u8>,
    properties: Vec<(String, Value)>,
    content_type: Option<String>,
    correlation_id: Option<String>,
    message_id: Option<String>,
}

/// Up to `max` events (at least one), with no partition key and no protocol sections.
pub(crate) fn events(u: &mut Unstructured<'_>, max: usize) -> arbitrary::Result<Vec<EventData>> {
    let count = u.int_in_range(1..=max)?;
    (0..count).map(|_| event(u)).collect()
}

fn event(u: &mut Unstructured<'_>) -> arbitrary::Result<EventData> {
    let event = Event::arbitrary(u)?;
    let mut properties: Vec<(tributary_event::SmolStr, PropertyValue)> = Vec::new();
    for (key, value) in event.properties {
        if properties.iter().all(|(k, _)| *k != key) {
            properties.push((key.into(), value.into()));
        }
    }
    Ok(EventData {
        body: Bytes::from(event.body),
        properties,
        partition_key: None,
        content_type: event.content_type,
        correlation_id: event.correlation_id,
        message_id: event.message_id,
        protocol_sections: None,
    })
}
