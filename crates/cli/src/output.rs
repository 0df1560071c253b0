//! How events, receipts and hubs are printed.

use std::io::Write;

use base64::Engine;
use serde_json::{Map, Value, json};
use tributary_broker::{Broker, HubDefinition, SendReceipt};
use tributary_event::{PropertyValue, ReceivedEvent};

use crate::args::OutputFormat;

/// Milliseconds since the epoch as RFC 3339 (UTC), or the number if it is out of range.
pub fn rfc3339(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| ms.to_string())
}

/// A send receipt as one JSON line.
pub fn receipt_json(receipt: &SendReceipt) -> String {
    json!({
        "partition": receipt.partition.to_string(),
        "first_sequence_number": receipt.base_sequence,
        "count": receipt.offsets.len(),
        "offsets": receipt.offsets.iter().map(u64::to_string).collect::<Vec<_>>(),
        "enqueued_time": rfc3339(receipt.enqueued_time_ms),
    })
    .to_string()
}

fn property_json(value: &PropertyValue) -> Value {
    match value {
        PropertyValue::Null => Value::Null,
        PropertyValue::Bool(b) => json!(b),
        PropertyValue::Int32(v) => json!(v),
        PropertyValue::Int64(v) => json!(v),
        PropertyValue::UInt32(v) => json!(v),
        PropertyValue::UInt64(v) => json!(v),
        PropertyValue::Float32(v) => json!(v),
        PropertyValue::Float64(v) => json!(v),
        PropertyValue::String(s) => json!(s),
        PropertyValue::Bytes(b) => json!(base64::engine::general_purpose::STANDARD.encode(b)),
        PropertyValue::Timestamp(ms) => json!(rfc3339(*ms)),
        PropertyValue::Uuid(u) => json!(uuid_text(u)),
    }
}

fn uuid_text(u: &[u8; 16]) -> String {
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// One received event: its body as a line (text), or all of it as a JSON line.
pub fn write_event(
    out: &mut impl Write,
    format: OutputFormat,
    partition: &str,
    event: &ReceivedEvent,
) -> std::io::Result<()> {
    match format {
        OutputFormat::Text => {
            out.write_all(&event.data.body)?;
            out.write_all(b"\n")
        }
        OutputFormat::Json => {
            let mut o = Map::new();
            o.insert("partition".into(), json!(partition));
            o.insert("sequence_number".into(), json!(event.sequence_number));
            o.insert("offset".into(), json!(event.offset.to_string()));
            o.insert(
                "enqueued_time".into(),
                json!(rfc3339(event.enqueued_time_ms)),
            );
            let d = &event.data;
            for (name, field) in [
                ("partition_key", &d.partition_key),
                ("content_type", &d.content_type),
                ("correlation_id", &d.correlation_id),
                ("message_id", &d.message_id),
            ] {
                if let Some(v) = field {
                    o.insert(name.into(), json!(v));
                }
            }
            if !d.properties.is_empty() {
                let props: Map<String, Value> = d
                    .properties
                    .iter()
                    .map(|(k, v)| (k.clone(), property_json(v)))
                    .collect();
                o.insert("properties".into(), Value::Object(props));
            }
            match std::str::from_utf8(&d.body) {
                Ok(text) => o.insert("body".into(), json!(text)),
                Err(_) => o.insert(
                    "body_base64".into(),
                    json!(base64::engine::general_purpose::STANDARD.encode(&d.body)),
                ),
            };
            writeln!(out, "{}", Value::Object(o))
        }
    }
}

/// A hub's settings, groups and partitions, for `hub show`.
pub fn write_hub(out: &mut impl Write, broker: &Broker, hub: &HubDefinition) -> anyhow::Result<()> {
    writeln!(out, "event hub:      {}", hub.name)?;
    writeln!(out, "created:        {}", rfc3339(hub.created_at_ms))?;
    writeln!(out, "partitions:     {}", hub.partition_count)?;
    let age = hub.retention_age_ms.map_or("forever".to_owned(), |ms| {
        format!("{} h", ms as f64 / 3_600_000.0)
    });
    writeln!(out, "retention:      {age}")?;
    if let Some(bytes) = hub.retention_bytes_max {
        writeln!(out, "retention size: {bytes} bytes per partition")?;
    }
    let groups: Vec<_> = hub
        .consumer_groups
        .iter()
        .map(|g| g.name.as_str())
        .collect();
    writeln!(out, "consumer groups: {}", groups.join(", "))?;
    writeln!(
        out,
        "partition  begin  last  last offset  last enqueued  empty"
    )?;
    for p in 0..hub.partition_count {
        let props = broker.partition_properties(&hub.name, &p.to_string())?;
        writeln!(
            out,
            "{p:>9}  {:>5}  {:>4}  {:>11}  {:>13}  {}",
            props.begin_sequence_number,
            props.last_enqueued_sequence_number,
            props
                .last_enqueued_offset
                .map_or("-".into(), |o| o.to_string()),
            props.last_enqueued_time_ms.map_or("-".into(), rfc3339),
            props.is_empty
        )?;
    }
    Ok(())
}
