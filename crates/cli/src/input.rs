//! Turning `send`'s input lines into events and batches.
//!
//! A line is checked completely — JSON syntax, known fields, property types — before it becomes
//! an event, and errors name the line. Events without a partition or key are spread one by one
//! over the partitions ([`Spreader`]); events with the same destination form batches (each
//! appended atomically), up to the batch size, in input order per destination ([`Batcher`]).

use bytes::Bytes;
use serde_json::{Map, Value};
use tributary_broker::SendTarget;
use tributary_event::{EventData, PropertyValue, SmolStr};

use crate::args::InputFormat;

/// What applies to every line unless the line says otherwise.
#[derive(Debug, Clone)]
pub struct LineDefaults {
    /// Where events go.
    pub target: SendTarget,
    /// Properties added to every event (a line's own property of the same name wins).
    pub properties: Vec<(SmolStr, PropertyValue)>,
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

/// Batches collected at once, one per destination: input with many keys sends the oldest
/// batch early rather than holding a batch for every key.
const PENDING_BATCHES_MAX: usize = 64;

/// Collects events into one batch per destination (a partition or a partition key), each up
/// to the batch size. Events to one destination leave in input order.
#[derive(Debug)]
pub struct Batcher {
    batch_size: usize,
    /// Batches being collected with their body bytes, oldest first.
    pending: Vec<(Batch, usize)>,
}

impl Batcher {
    /// Batches of at most `batch_size` events.
    pub fn new(batch_size: usize) -> Self {
        assert!(batch_size > 0);
        Batcher {
            batch_size,
            pending: Vec::new(),
        }
    }

    /// Adds an event; returns a batch that is complete: its destination's, when this event
    /// does not fit in it, or the oldest, when this event needs a new one and too many are open.
    pub fn push(&mut self, line: u64, input: InputEvent) -> Option<Batch> {
        let body_len = input.event.body.len();
        let mut full = None;
        let index = self
            .pending
            .iter()
            .position(|(b, _)| b.target == input.target);
        if let Some(i) = index {
            let (batch, bytes) = &self.pending[i];
            if batch.events.len() >= self.batch_size || bytes + body_len > BATCH_BODY_BYTES_MAX {
                full = Some(self.pending.remove(i).0);
            }
        } else if self.pending.len() >= PENDING_BATCHES_MAX {
            full = Some(self.pending.remove(0).0);
        }
        let i = match self
            .pending
            .iter()
            .position(|(b, _)| b.target == input.target)
        {
            Some(i) => i,
            None => {
                self.pending.push((
                    Batch {
                        target: input.target.clone(),
                        events: Vec::new(),
                        last_line: line,
                    },
                    0,
                ));
                self.pending.len() - 1
            }
        };
        let (batch, bytes) = &mut self.pending[i];
        *bytes += body_len;
        batch.events.push(input.event);
        batch.last_line = line;
        assert!(self.pending.len() <= PENDING_BATCHES_MAX);
        full
    }

    /// The oldest batch being collected, if any; call until `None` to take them all.
    pub fn flush(&mut self) -> Option<Batch> {
        (!self.pending.is_empty()).then(|| self.pending.remove(0).0)
    }
}

/// Spreads events sent to no partition or key across the hub's partitions one event at a
/// time (not one batch at a time), starting at a random partition so that successive runs do
/// not all load the first.
#[derive(Debug)]
pub struct Spreader {
    partitions: Vec<String>,
    next: usize,
}

impl Spreader {
    /// Spreads over `partitions` (not empty).
    pub fn new(partitions: Vec<String>) -> Self {
        assert!(!partitions.is_empty());
        // A random start without a dependency: std's hasher keys are random per process.
        let random = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), 0u8);
        let next = (random % partitions.len() as u64) as usize;
        Spreader { partitions, next }
    }

    /// Where `target` sends: round-robin becomes the next partition; anything else stays.
    pub fn route(&mut self, target: SendTarget) -> SendTarget {
        if target != SendTarget::RoundRobin {
            return target;
        }
        let partition = self.partitions[self.next].clone();
        self.next = (self.next + 1) % self.partitions.len();
        SendTarget::Partition(partition)
    }

    /// Checks that an explicit partition id is one of the hub's.
    pub fn check(&self, target: &SendTarget) -> Result<(), String> {
        match target {
            SendTarget::Partition(p) if !self.partitions.contains(p) => {
                Err(no_such_partition(p, &self.partitions))
            }
            _ => Ok(()),
        }
    }
}

/// The error for a partition id the hub does not have, naming it and the hub's ids.
pub fn no_such_partition(partition: &str, partitions: &[String]) -> String {
    let known = match (partitions.first(), partitions.last()) {
        (Some(first), Some(last)) if partitions.len() > 1 => format!("{first} to {last}"),
        (Some(only), _) => only.clone(),
        _ => "none".to_owned(),
    };
    format!("there is no partition {partition:?} (the hub's partitions are {known})")
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
pub fn json_properties(value: Value) -> Result<Vec<(SmolStr, PropertyValue)>, String> {
    let Value::Object(map) = value else {
        return Err("\"properties\" must be an object".into());
    };
    map.into_iter()
        .map(|(name, value)| {
            let typed = match value {
                Value::Null => PropertyValue::Null,
                Value::Bool(b) => PropertyValue::Bool(b),
                Value::String(s) => PropertyValue::String(s.into()),
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
            Ok((name.into(), typed))
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
        // Another destination collects its own batch alongside.
        assert!(
            b.push(4, ev(SendTarget::PartitionKey("k".into())))
                .is_none()
        );
        assert!(b.push(5, ev(SendTarget::RoundRobin)).is_none());
        let full = b.push(6, ev(SendTarget::RoundRobin)).unwrap();
        assert_eq!((full.events.len(), full.last_line), (2, 5));
        let oldest = b.flush().unwrap();
        assert_eq!(oldest.target, SendTarget::PartitionKey("k".into()));
        assert_eq!(b.flush().unwrap().last_line, 6);
        assert!(b.flush().is_none());
    }

    #[test]
    fn many_keys_send_the_oldest_batch_early() {
        let mut b = Batcher::new(100);
        for i in 0..PENDING_BATCHES_MAX as u64 {
            let input = InputEvent {
                target: SendTarget::PartitionKey(i.to_string()),
                event: EventData::new("x"),
            };
            assert!(b.push(i + 1, input).is_none());
        }
        let input = InputEvent {
            target: SendTarget::PartitionKey("new".into()),
            event: EventData::new("x"),
        };
        let early = b.push(1000, input).unwrap();
        assert_eq!(early.target, SendTarget::PartitionKey("0".into()));
    }

    #[test]
    fn round_robin_spreads_events_from_a_random_start() {
        let ids: Vec<String> = (0..4).map(|p| p.to_string()).collect();
        let mut starts = std::collections::BTreeSet::new();
        for _ in 0..64 {
            let mut s = Spreader::new(ids.clone());
            let first = s.route(SendTarget::RoundRobin);
            let SendTarget::Partition(p) = &first else {
                panic!("{first:?}")
            };
            let p: usize = p.parse().unwrap();
            starts.insert(p);
            for k in 1..8 {
                let next = (p + k) % 4;
                assert_eq!(
                    s.route(SendTarget::RoundRobin),
                    SendTarget::Partition(next.to_string())
                );
            }
            let keyed = SendTarget::PartitionKey("k".into());
            assert_eq!(s.route(keyed.clone()), keyed);
        }
        assert!(starts.len() > 1, "64 runs all started at {starts:?}");
        let s = Spreader::new(ids);
        assert!(s.check(&SendTarget::Partition("3".into())).is_ok());
        let err = s.check(&SendTarget::Partition("99".into())).unwrap_err();
        assert_eq!(
            err,
            "there is no partition \"99\" (the hub's partitions are 0 to 3)"
        );
    }
}
