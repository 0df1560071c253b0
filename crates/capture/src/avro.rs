//! Azure's capture records: the schema, one event as one record, a window's file written and
//! read back.
//!
//! Every file has Azure's record schema, `EventData` in namespace
//! `Microsoft.ServiceBus.Messaging`: `SequenceNumber` (long), `Offset` (string, the decimal
//! offset), `EnqueuedTimeUtc` (string, `M/d/yyyy h:mm:ss tt`), `SystemProperties` (map of
//! long/double/string/bytes), `Properties` (map of long/double/string/bytes/null) and `Body`
//! (null or bytes; always bytes here). The codec is `null` (Avro) or `deflate` (AvroDeflate).
//!
//! `SystemProperties` holds `x-opt-enqueued-time` (long, ms), and when the event has them
//! `x-opt-partition-key`, `message-id`, `correlation-id` and `content-type` (strings).
//! Application properties map by type: integers and timestamps (ms) to long (a `u64` beyond
//! `i64` to its decimal string), floats to double, strings to string, bytes to bytes, null to
//! null, booleans to the strings `True`/`False` and UUIDs to their hyphenated string.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::sync::LazyLock;

use apache_avro::types::Value;
use apache_avro::{Codec, DeflateSettings, Schema};
use tributary_event::{PropertyValue, ReceivedEvent, uuid_text};

use crate::config::CaptureFormat;
use crate::time_text::enqueued_time_utc;

/// Azure's capture schema, as `avro-tools getschema` prints it for a file Azure wrote.
pub const CAPTURE_SCHEMA_JSON: &str = r#"{"type":"record","name":"EventData","namespace":"Microsoft.ServiceBus.Messaging","fields":[{"name":"SequenceNumber","type":"long"},{"name":"Offset","type":"string"},{"name":"EnqueuedTimeUtc","type":"string"},{"name":"SystemProperties","type":{"type":"map","values":["long","double","string","bytes"]}},{"name":"Properties","type":{"type":"map","values":["long","double","string","bytes","null"]}},{"name":"Body","type":["null","bytes"]}]}"#;

static SCHEMA: LazyLock<Schema> =
    LazyLock::new(|| Schema::parse_str(CAPTURE_SCHEMA_JSON).expect("Azure's schema parses"));

/// The parsed capture schema.
pub fn capture_schema() -> &'static Schema {
    &SCHEMA
}

/// The union branch indexes of `SystemProperties`' and `Properties`' values.
const LONG: u32 = 0;
const DOUBLE: u32 = 1;
const STRING: u32 = 2;
const BYTES: u32 = 3;
const NULL: u32 = 4;

/// Bytes a record costs beyond its body and properties (its fixed fields, roughly): what the
/// size window counts for each event besides its data.
const RECORD_OVERHEAD_BYTES: u64 = 64;

/// About how many bytes `event` takes as a record before compression; what the size window adds
/// up. It counts the body, each property's key and value, and a fixed overhead.
pub fn record_bytes(event: &ReceivedEvent) -> u64 {
    let properties: usize = event
        .data
        .properties
        .iter()
        .map(|(key, value)| key.len() + value_bytes(value))
        .sum();
    let system = event.data.partition_key.as_ref().map_or(0, String::len)
        + event.data.message_id.as_ref().map_or(0, String::len)
        + event.data.correlation_id.as_ref().map_or(0, String::len)
        + event.data.content_type.as_ref().map_or(0, String::len);
    RECORD_OVERHEAD_BYTES + (event.data.body.len() + properties + system) as u64
}

fn value_bytes(value: &PropertyValue) -> usize {
    match value {
        PropertyValue::String(text) => text.len() + 2,
        PropertyValue::Bytes(bytes) => bytes.len() + 2,
        _ => 9,
    }
}

/// `event` as one Azure capture record.
pub fn event_record(event: &ReceivedEvent) -> Value {
    Value::Record(vec![
        ("SequenceNumber".into(), Value::Long(event.sequence_number)),
        ("Offset".into(), Value::String(event.offset.to_string())),
        (
            "EnqueuedTimeUtc".into(),
            Value::String(enqueued_time_utc(event.enqueued_time_ms)),
        ),
        (
            "SystemProperties".into(),
            Value::Map(avro_map(system_property_values(event))),
        ),
        (
            "Properties".into(),
            Value::Map(avro_map(property_values(event))),
        ),
        (
            "Body".into(),
            Value::Union(1, Box::new(Value::Bytes(event.data.body.to_vec()))),
        ),
    ])
}

/// One value of a `SystemProperties` or `Properties` map, by the branch of Azure's union it
/// takes: what the Avro and Parquet writers both encode.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    /// `long`.
    Long(i64),
    /// `double`.
    Double(f64),
    /// `string`.
    String(String),
    /// `bytes`.
    Bytes(Vec<u8>),
    /// `null` (application properties only).
    Null,
}

/// `event`'s `SystemProperties`: `x-opt-enqueued-time` and the texts the event has.
pub fn system_property_values(event: &ReceivedEvent) -> Vec<(String, FieldValue)> {
    let mut values = vec![(
        "x-opt-enqueued-time".to_owned(),
        FieldValue::Long(event.enqueued_time_ms),
    )];
    let data = &event.data;
    let texts = [
        ("x-opt-partition-key", &data.partition_key),
        ("message-id", &data.message_id),
        ("correlation-id", &data.correlation_id),
        ("content-type", &data.content_type),
    ];
    for (key, value) in texts {
        if let Some(value) = value {
            values.push((key.to_owned(), FieldValue::String(value.to_string())));
        }
    }
    values
}

/// `event`'s application `Properties`, each mapped by type (see the module docs).
pub fn property_values(event: &ReceivedEvent) -> Vec<(String, FieldValue)> {
    event
        .data
        .properties
        .iter()
        .map(|(key, value)| (key.to_string(), field_value(value)))
        .collect()
}

/// One application property as a branch of `["long","double","string","bytes","null"]`.
fn field_value(value: &PropertyValue) -> FieldValue {
    match value {
        PropertyValue::Null => FieldValue::Null,
        PropertyValue::Bool(b) => FieldValue::String(if *b { "True" } else { "False" }.into()),
        PropertyValue::Int32(v) => FieldValue::Long(i64::from(*v)),
        PropertyValue::Int64(v) | PropertyValue::Timestamp(v) => FieldValue::Long(*v),
        PropertyValue::UInt32(v) => FieldValue::Long(i64::from(*v)),
        PropertyValue::UInt64(v) => match i64::try_from(*v) {
            Ok(v) => FieldValue::Long(v),
            Err(_) => FieldValue::String(v.to_string()),
        },
        PropertyValue::Float32(v) => FieldValue::Double(f64::from(*v)),
        PropertyValue::Float64(v) => FieldValue::Double(*v),
        PropertyValue::String(s) => FieldValue::String(s.to_string()),
        PropertyValue::Bytes(b) => FieldValue::Bytes(b.to_vec()),
        PropertyValue::Uuid(u) => FieldValue::String(uuid_text(u)),
    }
}

/// A map value as its Avro union branch.
fn avro_value(value: FieldValue) -> Value {
    let (branch, value) = match value {
        FieldValue::Long(v) => (LONG, Value::Long(v)),
        FieldValue::Double(v) => (DOUBLE, Value::Double(v)),
        FieldValue::String(v) => (STRING, Value::String(v)),
        FieldValue::Bytes(v) => (BYTES, Value::Bytes(v)),
        FieldValue::Null => (NULL, Value::Null),
    };
    Value::Union(branch, Box::new(value))
}

fn avro_map(values: Vec<(String, FieldValue)>) -> HashMap<String, Value> {
    values
        .into_iter()
        .map(|(key, value)| (key, avro_value(value)))
        .collect()
}

/// The Avro codec of a capture format (`null` for the formats that are not Avro).
pub fn codec(format: CaptureFormat) -> Codec {
    match format {
        CaptureFormat::Avro | CaptureFormat::Parquet => Codec::Null,
        CaptureFormat::AvroDeflate => Codec::Deflate(DeflateSettings::default()),
    }
}

/// An Avro object container file being written to `W`.
pub type RecordWriter<W> = apache_avro::Writer<'static, W>;

/// A writer of capture records to `sink`, the header written at once (so an empty window is a
/// valid file with no records).
pub fn record_writer<W: Write>(sink: W, format: CaptureFormat) -> Result<RecordWriter<W>, String> {
    let mut writer = apache_avro::Writer::with_codec(capture_schema(), sink, codec(format));
    writer.flush().map_err(|e| e.to_string())?;
    Ok(writer)
}

/// What a capture file holds, as read back: its record count and first and last sequence
/// numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSummary {
    /// How many records.
    pub event_count: u64,
    /// The first record's sequence number, if any.
    pub first_sequence: Option<i64>,
    /// The last record's sequence number, if any.
    pub last_sequence: Option<i64>,
}

/// Reads a capture file whole and summarises it; an error says what is not a capture file.
pub fn summarize<R: Read>(source: R) -> Result<FileSummary, String> {
    let reader = apache_avro::Reader::new(source).map_err(|e| e.to_string())?;
    let mut summary = FileSummary {
        event_count: 0,
        first_sequence: None,
        last_sequence: None,
    };
    for record in reader {
        let record = record.map_err(|e| e.to_string())?;
        let sequence = sequence_number(&record)?;
        if summary
            .last_sequence
            .is_some_and(|last| sequence != last + 1)
        {
            return Err(format!(
                "sequence number {sequence} follows {}: not one window of one partition",
                summary.last_sequence.unwrap_or_default()
            ));
        }
        summary.first_sequence.get_or_insert(sequence);
        summary.last_sequence = Some(sequence);
        summary.event_count += 1;
    }
    Ok(summary)
}

fn sequence_number(record: &Value) -> Result<i64, String> {
    let Value::Record(fields) = record else {
        return Err("a value is not a record".to_owned());
    };
    match fields.iter().find(|(name, _)| name == "SequenceNumber") {
        Some((_, Value::Long(sequence))) => Ok(*sequence),
        _ => Err("a record has no long SequenceNumber".to_owned()),
    }
}
