//! How events, receipts and hubs are printed.

use std::io::Write;

use base64::Engine;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tributary_broker::{Broker, HubCapture, HubCleanup, HubDefinition, SendReceipt};
use tributary_capture::CaptureDescription;
use tributary_event::{PropertyValue, ReceivedEvent, uuid_text};
use tributary_http::retention::RetentionDescription;

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

/// `n` and `noun` in the number it agrees with: "1 partition", "4 partitions".
pub fn count(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
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
        PropertyValue::String(s) => json!(s.as_str()),
        PropertyValue::Bytes(b) => json!(base64::engine::general_purpose::STANDARD.encode(b)),
        PropertyValue::Timestamp(ms) => json!(rfc3339(*ms)),
        PropertyValue::Uuid(u) => json!(uuid_text(u)),
    }
}

/// A body in an event's JSON line, and the field it goes in: JSON text that is not a string
/// (object, array, number, boolean, null) as that JSON under "body"; other UTF-8 text as a
/// string under "body" (a JSON string too, quotes and all, which `send --format json` sends back
/// unchanged); anything else in base64 under "body_base64".
fn body_json(body: &[u8]) -> (&'static str, Value) {
    let Ok(text) = std::str::from_utf8(body) else {
        let encoded = base64::engine::general_purpose::STANDARD.encode(body);
        return ("body_base64", json!(encoded));
    };
    match serde_json::from_str::<Value>(text) {
        Ok(value) if !value.is_string() => ("body", value),
        _ => ("body", json!(text)),
    }
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
                    .map(|(k, v)| (k.to_string(), property_json(v)))
                    .collect();
                o.insert("properties".into(), Value::Object(props));
            }
            let (name, body) = body_json(&d.body);
            o.insert(name.into(), body);
            writeln!(out, "{}", Value::Object(o))
        }
    }
}

/// A hub as `hub show` prints it, from the broker or from a running server's admin API.
#[derive(Debug, Clone, PartialEq)]
pub struct HubView {
    /// Its name.
    pub name: String,
    /// When it was created (RFC 3339).
    pub created: String,
    /// Its retention by age, in ms; `None` is forever.
    pub retention_ms: Option<i64>,
    /// Its retention by size per partition.
    pub retention_bytes: Option<u64>,
    /// Its cleanup policy and compaction settings.
    pub cleanup: HubCleanup,
    /// Its consumer groups.
    pub groups: Vec<String>,
    /// Its capture, if it is captured.
    pub capture: Option<HubCapture>,
    /// Its partitions.
    pub partitions: Vec<PartitionView>,
}

/// One partition's row of `hub show`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionView {
    /// The partition id.
    pub id: String,
    /// The oldest retained sequence number.
    pub begin: i64,
    /// The newest sequence number (-1: none).
    pub last: i64,
    /// The newest event's offset.
    pub last_offset: Option<String>,
    /// When the newest event was enqueued (RFC 3339).
    pub last_time: Option<String>,
    /// Whether it holds no events.
    pub empty: bool,
    /// Its capture's state, as a running server reports it (`None` on the data directory).
    pub capture: Option<String>,
}

impl HubView {
    /// The hub as the broker in this process describes it.
    pub fn local(broker: &Broker, hub: &HubDefinition) -> anyhow::Result<Self> {
        let mut partitions = Vec::new();
        for p in 0..hub.partition_count {
            let props = broker.partition_properties(&hub.name, &p.to_string())?;
            partitions.push(PartitionView {
                id: p.to_string(),
                begin: props.begin_sequence_number,
                last: props.last_enqueued_sequence_number,
                last_offset: props.last_enqueued_offset.map(|o| o.to_string()),
                last_time: props.last_enqueued_time_ms.map(rfc3339),
                empty: props.is_empty,
                capture: None,
            });
        }
        Ok(HubView {
            name: hub.name.clone(),
            created: rfc3339(hub.created_at_ms),
            retention_ms: hub.retention_age_ms,
            retention_bytes: hub.retention_bytes_max,
            cleanup: hub.cleanup,
            groups: hub.consumer_groups.iter().map(|g| g.name.clone()).collect(),
            capture: hub.capture.clone(),
            partitions,
        })
    }

    /// The hub as the admin API's `GET /admin/v1/hubs/{name}` describes it.
    pub fn from_admin(hub: &Value) -> anyhow::Result<Self> {
        let text = |v: &Value, key: &str| v[key].as_str().map(str::to_owned);
        let bad = || anyhow::anyhow!("the admin API described the hub in an unexpected form");
        let partitions = hub["partitions"].as_array().ok_or_else(bad)?;
        let partitions = partitions
            .iter()
            .map(|p| {
                Some(PartitionView {
                    id: text(p, "id")?,
                    begin: p["beginSequenceNumber"].as_i64()?,
                    last: p["lastEnqueuedSequenceNumber"].as_i64()?,
                    last_offset: text(p, "lastEnqueuedOffset"),
                    last_time: text(p, "lastEnqueuedTime"),
                    empty: p["isEmpty"].as_bool()?,
                    capture: p.get("capture").map(capture_state),
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)?;
        let groups = hub["consumerGroups"].as_array().ok_or_else(bad)?;
        let cleanup = match hub.get("retentionDescription") {
            Some(description) => RetentionDescription::deserialize(description)
                .map_err(|_| bad())?
                .cleanup_over(HubCleanup::default())
                .map_err(|_| bad())?,
            None => HubCleanup::default(),
        };
        let capture = match hub.get("captureDescription") {
            Some(description) => CaptureDescription::deserialize(description)
                .map_err(|_| bad())?
                .apply(hub["name"].as_str().unwrap_or_default(), None)
                .map_err(|_| bad())?,
            None => None,
        };
        Ok(HubView {
            capture,
            name: text(hub, "name").ok_or_else(bad)?,
            created: text(hub, "createdAt").unwrap_or_default(),
            retention_ms: hub["retentionMs"].as_i64(),
            retention_bytes: hub["retentionBytesMax"].as_u64(),
            cleanup,
            groups: groups
                .iter()
                .filter_map(|g| g.as_str().map(str::to_owned))
                .collect(),
            partitions,
        })
    }
}

/// A hub's settings, groups and partitions, for `hub show`.
pub fn write_hub(out: &mut impl Write, hub: &HubView) -> anyhow::Result<()> {
    writeln!(out, "event hub:      {}", hub.name)?;
    writeln!(out, "created:        {}", hub.created)?;
    writeln!(out, "partitions:     {}", hub.partitions.len())?;
    let age = hub.retention_ms.map_or("forever".to_owned(), |ms| {
        format!("{} h", ms as f64 / 3_600_000.0)
    });
    writeln!(out, "retention:      {age}")?;
    if let Some(bytes) = hub.retention_bytes {
        writeln!(out, "retention size: {bytes} bytes per partition")?;
    }
    let cleanup = &hub.cleanup;
    write!(out, "cleanup:        {}", cleanup.policy)?;
    if cleanup.policy.compacts() {
        write!(
            out,
            " (min compaction lag {} s, tombstone retention {} h)",
            cleanup.min_compaction_lag_ms as f64 / 1_000.0,
            cleanup.tombstone_retention_ms as f64 / 3_600_000.0
        )?;
    }
    writeln!(out)?;
    if let Some(c) = &hub.capture {
        write!(
            out,
            "capture:        {} ({}, every {} s or {} bytes{}, names {})",
            c.destination,
            c.encoding,
            c.interval_secs,
            c.size_bytes_max,
            if c.skip_empty {
                ", empty windows skipped"
            } else {
                ""
            },
            c.archive_name_format
        )?;
        if let Some(notify) = &c.notify_hub {
            write!(out, ", notifications to {notify}")?;
        }
        writeln!(out)?;
    }
    writeln!(out, "consumer groups: {}", hub.groups.join(", "))?;
    writeln!(
        out,
        "partition  begin  last  last offset  last enqueued  empty"
    )?;
    for p in &hub.partitions {
        writeln!(
            out,
            "{:>9}  {:>5}  {:>4}  {:>11}  {:>13}  {}",
            p.id,
            p.begin,
            p.last,
            p.last_offset.as_deref().unwrap_or("-"),
            p.last_time.as_deref().unwrap_or("-"),
            p.empty
        )?;
    }
    for p in &hub.partitions {
        if let Some(state) = &p.capture {
            writeln!(out, "capture of partition {}: {state}", p.id)?;
        }
    }
    Ok(())
}

/// A partition's capture state in one line, from the admin API's `capture` object.
fn capture_state(c: &Value) -> String {
    let mut line = format!(
        "captured to sequence number {}, lag {} events ({} s), {} files ({} bytes), {} errors",
        c["capturedTo"]
            .as_i64()
            .map_or("-".to_owned(), |s| s.to_string()),
        c["lagEvents"].as_i64().unwrap_or(0),
        c["lagSeconds"].as_f64().unwrap_or(0.0),
        c["filesWritten"].as_u64().unwrap_or(0),
        c["bytesWritten"].as_u64().unwrap_or(0),
        c["errors"].as_u64().unwrap_or(0),
    );
    if let Some(error) = c["lastError"].as_str() {
        line.push_str(&format!("; failing: {error}"));
    }
    if c["retentionHeld"].as_bool() == Some(true) {
        line.push_str("; retention held for it");
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_body_is_embedded_and_anything_else_stays_a_string() {
        let field = |body: &[u8]| body_json(body);
        assert_eq!(
            field(br#"{"t": 21.5, "ok": [true]}"#),
            ("body", json!({"t": 21.5, "ok": [true]}))
        );
        assert_eq!(field(b"42"), ("body", json!(42)));
        assert_eq!(field(b"hello"), ("body", json!("hello")));
        assert_eq!(field(br#"{"t": "#), ("body", json!(r#"{"t": "#)));
        assert_eq!(
            field(br#""quoted""#),
            ("body", json!(r#""quoted""#)),
            "a JSON string keeps its quotes, so it comes back as it was sent"
        );
        assert_eq!(field(&[0xff, 0x00]), ("body_base64", json!("/wA=")));
    }
}
