//! Turning `send`'s input lines into events and batches.
//!
//! A line is checked completely — JSON syntax, known fields, property types — before it becomes
//! an event, and errors name the line. Consecutive events with the same destination form one
//! batch (appended atomically), up to the batch size.

use bytes::Bytes;
use serde_json::{Map, Value};
use tributary_broker::SendTarget;
use tributary_event::{EventData, PropertyValue};

use crate::args::InputFormat;

/// What applies to every line unless the line says otherwise.
#[derive(Debug, Clone)]
pub struct LineDefaults {
    /// Where events go.
    pub target: SendTarget,
    /// Properties added to every event (a line's own property of the same name wins).
    pub properties: Vec<(String, PropertyValue)>,
}

/// One parsed input line.
#[derive(Debug, Clone, PartialEq)]
pub struct InputEvent {
    /// Where it goes.
    pub target: SendTarget,
    /// The event.
    pub event: EventData,
}

/// A batch ready to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Where it goes.
    pub target: SendTarget,
    /// Its events.
    pub events: Vec<EventData>,
    /// The input line of its last event.
    pub last_line: u64,
}

/// Batches larger than this many body bytes are cut, so one batch stays well inside the log's
/// batch limit.
const BATCH_BODY_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Collects consecutive events with the same target into batches.
#[derive(Debug)]
pub struct Batcher {
    batch_size: usize,
    current: Option<Batch>,
    body_bytes: usize,
}

impl Batcher {
    /// Batches of at most `batch_size` events.
    pub fn new(batch_size: usize) -> Self {
        assert!(batch_size > 0);
        Batcher {
            batch_size,
            current: None,
            body_bytes: 0,
        }
    }

    /// Adds an event; returns a full batch when this one does not fit with it.
    pub fn push(&mut self, line: u64, input: InputEvent) -> Option<Batch> {
        let fits = self.current.as_ref().is_some_and(|b| {
            b.target == input.target
                && b.events.len() < self.batch_size
                && self.body_bytes + input.event.body.len() <= BATCH_BODY_BYTES_MAX
        });
        let full = if fits { None } else { self.flush() };
        let batch = self.current.get_or_insert_with(|| Batch {
            target: input.target.clone(),
            events: Vec::new(),
            last_line: line,
        });
        self.body_bytes += input.event.body.len();
        batch.events.push(input.event);
        batch.last_line = line;
        full
    }

    /// The batch being collected, if any.
    pub fn flush(&mut self) -> Option<Batch> {
        self.body_bytes = 0;
        self.current.take()
    }
}

/// Parses one input line (without its newline).
pub fn parse_line(
    line: &str,
    format: InputFormat,
    defaults: &LineDefaults,
) -> Result<InputEvent, String> {
    let mut input = match format {
        InputFormat::Lines => InputEvent {
            target: defaults.target.clone(),
            event: EventData::new(Bytes::copy_from_slice(line.as_bytes())),
        },
        InputFormat::Json => parse_json_line(line, &defaults.target)?,
    };
    for (name, value) in &defaults.properties {
        if input.event.property(name).is_none() {
            input.event.properties.push((name.clone(), value.clone()));
        }
    }
    Ok(input)
}

fn parse_json_line(line: &str, default_target: &SendTarget) -> Result<InputEvent, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let Value::Object(mut fields) = value else {
        return Err("expected a JSON object with at least a \"body\"".into());
    };
    let body = match fields.remove("body") {
        Some(Value::String(s)) => Bytes::from(s),
        Some(Value::Null) | None => return Err("the object has no \"body\"".into()),
        Some(other) => Bytes::from(other.to_string()),
    };
    let mut event = EventData::new(body);
    event.content_type = take_string(&mut fields, "content_type")?;
    event.correlation_id = take_string(&mut fields, "correlation_id")?;
    event.message_id = take_string(&mut fields, "message_id")?;
    let key = take_string(&mut fields, "partition_key")?;
    let partition = match fields.remove("partition") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(Value::Number(n)) if n.is_u64() => Some(n.to_string()),
        Some(_) => return Err("\"partition\" must be a partition id like \"0\"".into()),
    };
    if let Some(props) = fields.remove("properties") {
        event.properties = json_properties(props)?;
    }
    if let Some(unknown) = fields.keys().next() {
        return Err(format!(
            "unknown field {unknown:?} (known: body, partition_key, partition, properties, content_type, correlation_id, message_id)"
        ));
    }
    let target = match (key, partition) {
        (Some(_), Some(_)) => {
            return Err("give either \"partition_key\" or \"partition\", not both".into());
        }
        (Some(key), None) => SendTarget::PartitionKey(key),
        (None, Some(partition)) => SendTarget::Partition(partition),
        (None, None) => default_target.clone(),
    };
    Ok(InputEvent { target, event })
}

fn take_string(fields: &mut Map<String, Value>, name: &str) -> Result<Option<String>, String> {
    match fields.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(format!("{name:?} must be a string")),
    }
}

/// Converts a JSON object of properties to typed values.
pub fn json_properties(value: Value) -> Result<Vec<(String, PropertyValue)>, String> {
    let Value::Object(map) = value else {
        return Err("\"properties\" must be an object".into());
    };
    map.into_iter()
        .map(|(name, value)| {
            let typed = match value {
                Value::Null => PropertyValue::Null,
                Value::Bool(b) => PropertyValue::Bool(b),
                Value::String(s) => PropertyValue::String(s),
                Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                    (Some(i), _, _) => PropertyValue::Int64(i),
                    (None, Some(u), _) => PropertyValue::UInt64(u),
                    (None, None, Some(f)) => PropertyValue::Float64(f),
                    _ => return Err(format!("property {name:?}: unsupported number {n}")),
                },
                Value::Array(_) | Value::Object(_) => {
                    return Err(format!(
                        "property {name:?}: values must be strings, numbers, booleans or null"
                    ));
                }
            };
            Ok((name, typed))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> LineDefaults {
        LineDefaults {
            target: SendTarget::RoundRobin,
            properties: vec![("source".into(), PropertyValue::String("cli".into()))],
        }
    }

    #[test]
    fn plain_lines_become_bodies_with_the_default_properties() {
        let e = parse_line("hello", InputFormat::Lines, &defaults()).unwrap();
        assert_eq!(e.event.body, "hello");
        assert_eq!(e.target, SendTarget::RoundRobin);
        assert_eq!(
            e.event.property("source"),
            Some(&PropertyValue::String("cli".into()))
        );
    }

    #[test]
    fn json_lines_carry_routing_and_typed_properties() {
        let line = r#"{"body": {"t": 21.5}, "partition_key": "dev-1", "properties": {"n": 3, "ok": true, "source": "sensor"}, "content_type": "application/json"}"#;
        let e = parse_line(line, InputFormat::Json, &defaults()).unwrap();
        assert_eq!(e.event.body, r#"{"t":21.5}"#);
        assert_eq!(e.target, SendTarget::PartitionKey("dev-1".into()));
        assert_eq!(e.event.property("n"), Some(&PropertyValue::Int64(3)));
        assert_eq!(e.event.property("ok"), Some(&PropertyValue::Bool(true)));
        assert_eq!(
            e.event.property("source"),
            Some(&PropertyValue::String("sensor".into()))
        );
        assert_eq!(e.event.content_type.as_deref(), Some("application/json"));
        let e = parse_line(
            r#"{"body": "x", "partition": 3}"#,
            InputFormat::Json,
            &defaults(),
        )
        .unwrap();
        assert_eq!(e.target, SendTarget::Partition("3".into()));
    }

    #[test]
    fn bad_json_lines_say_what_is_wrong() {
        for (line, expected) in [
            ("{", "invalid JSON"),
            ("[1]", "expected a JSON object"),
            (r#"{"x": 1}"#, "no \"body\""),
            (r#"{"body": "a", "colour": 1}"#, "unknown field \"colour\""),
            (
                r#"{"body": "a", "properties": {"a": [1]}}"#,
                "values must be strings",
            ),
            (
                r#"{"body": "a", "partition_key": "k", "partition": "1"}"#,
                "not both",
            ),
            (r#"{"body": "a", "partition": -1}"#, "partition id"),
        ] {
            let err = parse_line(line, InputFormat::Json, &defaults()).unwrap_err();
            assert!(err.contains(expected), "{line}: {err}");
        }
    }

    #[test]
    fn batches_split_on_target_and_size() {
        let mut b = Batcher::new(2);
        let ev = |target: SendTarget| InputEvent {
            target,
            event: EventData::new("x"),
        };
        assert!(b.push(1, ev(SendTarget::RoundRobin)).is_none());
        assert!(b.push(2, ev(SendTarget::RoundRobin)).is_none());
        let full = b.push(3, ev(SendTarget::RoundRobin)).unwrap();
        assert_eq!((full.events.len(), full.last_line), (2, 2));
        let switched = b.push(4, ev(SendTarget::PartitionKey("k".into()))).unwrap();
        assert_eq!((switched.events.len(), switched.last_line), (1, 3));
        let rest = b.flush().unwrap();
        assert_eq!(rest.target, SendTarget::PartitionKey("k".into()));
        assert!(b.flush().is_none());
    }
}
