//! Naming a piece of an event: a system property (`sys.sequence_number`), an application
//! property (`user.kind`) or a JSON body field (`body.reading.temperature`, `body.items[0]`).
//! Conditions, transforms, lookups and de-duplication all name fields this way.
//!
//! A body path is a list of object keys and array indexes. Keys are written bare when they are
//! identifiers (letters, digits, `_`, `-`, `$`), quoted otherwise (`body."device id"`).

use std::fmt;

use serde_json::Value;
use tributary_event::PropertyValue;

use crate::item::Item;
use crate::step::Context;

/// The deepest body path accepted: deeper JSON is possible but no real field name is 32 levels
/// down, and the bound keeps every walk short.
pub const PATH_DEPTH_MAX: usize = 32;

/// One step of a body path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Segment {
    /// An object key.
    Key(String),
    /// An array index.
    Index(usize),
}

/// A path into a JSON body (empty: the whole body).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct FieldPath {
    segments: Vec<Segment>,
}

/// A system property of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SystemProperty {
    /// The source sequence number.
    SequenceNumber,
    /// The source offset.
    Offset,
    /// The source enqueued time (ms since the Unix epoch).
    EnqueuedTime,
    /// The source partition id.
    PartitionId,
    /// The partition key.
    PartitionKey,
    /// The content type.
    ContentType,
    /// The message id.
    MessageId,
    /// The correlation id.
    CorrelationId,
}

impl SystemProperty {
    /// Every system property with its name after `sys.`.
    pub const ALL: [(&'static str, SystemProperty); 8] = [
        ("sequence_number", SystemProperty::SequenceNumber),
        ("offset", SystemProperty::Offset),
        ("enqueued_time", SystemProperty::EnqueuedTime),
        ("partition_id", SystemProperty::PartitionId),
        ("partition_key", SystemProperty::PartitionKey),
        ("content_type", SystemProperty::ContentType),
        ("message_id", SystemProperty::MessageId),
        ("correlation_id", SystemProperty::CorrelationId),
    ];

    /// The property named `name` (after `sys.`); Azure's PascalCase names are accepted too
    /// (`SequenceNumber`), since the Functions samples write them.
    pub fn named(name: &str) -> Option<SystemProperty> {
        let folded: String = name
            .chars()
            .filter(|c| *c != '_')
            .flat_map(char::to_lowercase)
            .collect();
        SystemProperty::ALL
            .iter()
            .find(|(known, _)| known.replace('_', "") == folded)
            .map(|(_, property)| *property)
    }

    /// The name after `sys.`.
    pub fn name(self) -> &'static str {
        SystemProperty::ALL
            .iter()
            .find(|(_, p)| *p == self)
            .map(|(name, _)| *name)
            .expect("every property is listed")
    }
}

/// A field of an event.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Field {
    /// `sys.<name>`.
    System(SystemProperty),
    /// `user.<name>`: an application property.
    User(String),
    /// `body.<path>` (or `body`): a JSON body field.
    Body(FieldPath),
}

/// A field name that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a field: {message}")]
pub struct FieldError {
    /// The text as written.
    pub text: String,
    /// What is wrong and what would be accepted.
    pub message: String,
}

/// A field's value, borrowed from the event where it can be.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue<'a> {
    /// An application property.
    Property(&'a PropertyValue),
    /// A JSON body field.
    Json(&'a Value),
    /// A string system property.
    Str(&'a str),
    /// A numeric system property.
    Int(i64),
    /// A time system property, ms since the Unix epoch.
    Time(i64),
}

impl FieldValue<'_> {
    /// The value as text, for keys of lookups and de-duplication: strings as they are, numbers
    /// and booleans in their usual spelling, JSON objects and arrays as compact JSON; `None`
    /// for null and bytes.
    pub fn to_key(&self) -> Option<String> {
        match self {
            FieldValue::Str(s) => Some((*s).to_owned()),
            FieldValue::Int(n) | FieldValue::Time(n) => Some(n.to_string()),
            FieldValue::Json(Value::Null) => None,
            FieldValue::Json(Value::String(s)) => Some(s.clone()),
            FieldValue::Json(value) => Some(value.to_string()),
            FieldValue::Property(value) => property_key(value),
        }
    }
}

fn property_key(value: &PropertyValue) -> Option<String> {
    Some(match value {
        PropertyValue::Null | PropertyValue::Bytes(_) => return None,
        PropertyValue::Bool(b) => b.to_string(),
        PropertyValue::Int32(n) => n.to_string(),
        PropertyValue::Int64(n) | PropertyValue::Timestamp(n) => n.to_string(),
        PropertyValue::UInt32(n) => n.to_string(),
        PropertyValue::UInt64(n) => n.to_string(),
        PropertyValue::Float32(n) => n.to_string(),
        PropertyValue::Float64(n) => n.to_string(),
        PropertyValue::String(s) => s.to_string(),
        PropertyValue::Uuid(bytes) => bytes.iter().map(|b| format!("{b:02x}")).collect(),
    })
}

impl Field {
    /// Reads `sys.<name>`, `user.<name>`, `body` or `body.<path>`.
    pub fn parse(text: &str) -> Result<Field, FieldError> {
        let error = |message: &str| FieldError {
            text: text.to_owned(),
            message: message.to_owned(),
        };
        if text == "body" {
            return Ok(Field::Body(FieldPath::default()));
        }
        let (scope, rest) = text.split_once('.').ok_or_else(|| {
            error("write sys.<name>, user.<name>, body or body.<path> (such as body.reading.temperature)")
        })?;
        match scope {
            "sys" => SystemProperty::named(rest)
                .map(Field::System)
                .ok_or_else(|| {
                    let names: Vec<&str> = SystemProperty::ALL.iter().map(|(n, _)| *n).collect();
                    error(&format!("sys. takes one of {}", names.join(", ")))
                }),
            "user" if !rest.is_empty() => Ok(Field::User(unquote(rest).to_owned())),
            "body" => FieldPath::parse(rest)
                .map(Field::Body)
                .map_err(|m| error(&m)),
            _ => Err(error(
                "a field starts with sys., user. or body. (application properties are user.<name>)",
            )),
        }
    }

    /// The field's value in `item`, read from `context.partition`; `None` when absent.
    pub fn get<'a>(&self, context: &Context<'a>, item: &'a Item) -> Option<FieldValue<'a>> {
        match self {
            Field::System(property) => system_value(*property, context, item),
            Field::User(name) => item.property(name).map(FieldValue::Property),
            Field::Body(path) => item.body_field(path).map(FieldValue::Json),
        }
    }
}

fn system_value<'a>(
    property: SystemProperty,
    context: &Context<'a>,
    item: &'a Item,
) -> Option<FieldValue<'a>> {
    let position = item.position();
    Some(match property {
        SystemProperty::SequenceNumber => FieldValue::Int(position.sequence_number),
        SystemProperty::Offset => FieldValue::Int(i64::try_from(position.offset).ok()?),
        SystemProperty::EnqueuedTime => FieldValue::Time(position.enqueued_time_ms),
        SystemProperty::PartitionId => FieldValue::Str(context.partition),
        SystemProperty::PartitionKey => FieldValue::Str(item.partition_key()?),
        SystemProperty::ContentType => FieldValue::Str(item.content_type()?),
        SystemProperty::MessageId => FieldValue::Str(item.message_id()?),
        SystemProperty::CorrelationId => FieldValue::Str(item.correlation_id()?),
    })
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::System(property) => write!(f, "sys.{}", property.name()),
            Field::User(name) => write!(f, "user.{name}"),
            Field::Body(path) if path.is_empty() => write!(f, "body"),
            Field::Body(path) => write!(f, "body.{path}"),
        }
    }
}

fn unquote(text: &str) -> &str {
    text.strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or(text)
}

fn is_bare(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '$')
}

impl FieldPath {
    /// A path of these segments.
    pub fn new(segments: Vec<Segment>) -> Result<FieldPath, String> {
        if segments.len() > PATH_DEPTH_MAX {
            return Err(format!("a path has at most {PATH_DEPTH_MAX} segments"));
        }
        Ok(FieldPath { segments })
    }

    /// Reads `a.b[2]."c d"` (the part after `body.`).
    pub fn parse(text: &str) -> Result<FieldPath, String> {
        let mut segments = Vec::new();
        let mut rest = text;
        let mut expect_key = true;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('[') {
                let (digits, tail) = after.split_once(']').ok_or("an index [ has no closing ]")?;
                let index = digits
                    .parse()
                    .map_err(|_| format!("[{digits}] is not an array index such as [0]"))?;
                segments.push(Segment::Index(index));
                rest = tail;
                expect_key = false;
                continue;
            }
            if !expect_key {
                rest = rest
                    .strip_prefix('.')
                    .ok_or("path segments are separated by '.'")?;
            }
            expect_key = false;
            if let Some(after) = rest.strip_prefix('"') {
                let (key, tail) = after
                    .split_once('"')
                    .ok_or("a quoted key has no closing \"")?;
                segments.push(Segment::Key(key.to_owned()));
                rest = tail;
            } else {
                let end = rest.find(|c| !is_bare(c)).unwrap_or(rest.len());
                if end == 0 {
                    return Err(format!(
                        "{rest:?}: a key is letters, digits, '_', '-' or '$', or quoted"
                    ));
                }
                segments.push(Segment::Key(rest[..end].to_owned()));
                rest = &rest[end..];
            }
        }
        if segments.is_empty() {
            return Err("the path is empty".to_owned());
        }
        FieldPath::new(segments)
    }

    /// The segments, outermost first.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Whether this is the whole body.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// The value at this path.
    pub fn get<'a>(&self, value: &'a Value) -> Option<&'a Value> {
        get_in(&self.segments, value)
    }

    /// The value at this path, to change.
    pub fn get_mut<'a>(&self, value: &'a mut Value) -> Option<&'a mut Value> {
        get_mut_in(&self.segments, value)
    }

    /// Removes and returns the value at this path.
    pub fn remove(&self, value: &mut Value) -> Option<Value> {
        remove_in(&self.segments, value)
    }

    /// Puts `new` at this path, making the objects on the way where there are none; fails
    /// (giving `new` back) where the way passes through a value that is not an object, or an
    /// array index beyond the array's end.
    pub fn set(&self, value: &mut Value, new: Value) -> Result<(), Value> {
        set_in(&self.segments, value, new)
    }
}

/// The value at `segments` below `value` ([`FieldPath::get`]).
pub(crate) fn get_in<'a>(segments: &[Segment], value: &'a Value) -> Option<&'a Value> {
    segments
        .iter()
        .try_fold(value, |value, segment| match segment {
            Segment::Key(key) => value.as_object()?.get(key),
            Segment::Index(index) => value.as_array()?.get(*index),
        })
}

fn get_mut_in<'a>(segments: &[Segment], value: &'a mut Value) -> Option<&'a mut Value> {
    segments
        .iter()
        .try_fold(value, |value, segment| match segment {
            Segment::Key(key) => value.as_object_mut()?.get_mut(key),
            Segment::Index(index) => value.as_array_mut()?.get_mut(*index),
        })
}

/// [`FieldPath::remove`] for `segments`.
pub(crate) fn remove_in(segments: &[Segment], value: &mut Value) -> Option<Value> {
    let (last, parents) = segments.split_last()?;
    let parent = get_mut_in(parents, value)?;
    match last {
        Segment::Key(key) => parent.as_object_mut()?.remove(key),
        Segment::Index(index) => {
            let array = parent.as_array_mut()?;
            (*index < array.len()).then(|| array.remove(*index))
        }
    }
}

/// [`FieldPath::set`] for `segments`.
pub(crate) fn set_in(segments: &[Segment], value: &mut Value, new: Value) -> Result<(), Value> {
    let Some((last, parents)) = segments.split_last() else {
        *value = new;
        return Ok(());
    };
    let mut at = value;
    for segment in parents {
        at = match segment {
            Segment::Key(key) => match at {
                Value::Object(map) => map
                    .entry(key.clone())
                    .or_insert_with(|| Value::Object(serde_json::Map::new())),
                _ => return Err(new),
            },
            Segment::Index(index) => match at.as_array_mut().and_then(|a| a.get_mut(*index)) {
                Some(element) => element,
                None => return Err(new),
            },
        };
    }
    match (last, at) {
        (Segment::Key(key), Value::Object(map)) => {
            map.insert(key.clone(), new);
            Ok(())
        }
        (Segment::Index(index), Value::Array(array)) if *index < array.len() => {
            array[*index] = new;
            Ok(())
        }
        _ => Err(new),
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.segments.iter().enumerate() {
            match segment {
                Segment::Key(key) if key.chars().all(is_bare) && !key.is_empty() => {
                    if i > 0 {
                        write!(f, ".")?;
                    }
                    write!(f, "{key}")?;
                }
                Segment::Key(key) => {
                    if i > 0 {
                        write!(f, ".")?;
                    }
                    write!(f, "\"{key}\"")?;
                }
                Segment::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use tributary_event::EventData;

    use super::*;
    use crate::item::Position;

    #[test]
    fn fields_read_and_print_back() {
        for text in [
            "sys.sequence_number",
            "user.kind",
            "body",
            "body.reading.temperature",
            "body.items[0].id",
            "body.\"device id\"",
        ] {
            assert_eq!(Field::parse(text).expect(text).to_string(), text);
        }
        assert_eq!(
            Field::parse("sys.SequenceNumber").expect("Azure's spelling"),
            Field::System(SystemProperty::SequenceNumber)
        );
        for bad in [
            "kind",
            "sys.nope",
            "body.",
            "body.a..b",
            "body.a[x]",
            "other.a",
        ] {
            assert!(Field::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn fields_read_an_event() {
        let event = EventData::new(r#"{"a":{"b":[1,{"c":"x"}]}}"#)
            .with_property("kind", PropertyValue::String("alarm".into()));
        let position = Position {
            sequence_number: 5,
            offset: 50,
            enqueued_time_ms: 9,
        };
        let item = Item::new(event, position);
        let context = Context {
            partition: "3",
            now_ms: 0,
        };
        let get = |text: &str| {
            Field::parse(text)
                .expect(text)
                .get(&context, &item)
                .and_then(|v| v.to_key())
        };
        assert_eq!(get("body.a.b[1].c").as_deref(), Some("x"));
        assert_eq!(get("body.a.b[0]").as_deref(), Some("1"));
        assert_eq!(get("user.kind").as_deref(), Some("alarm"));
        assert_eq!(get("sys.partition_id").as_deref(), Some("3"));
        assert_eq!(get("sys.sequence_number").as_deref(), Some("5"));
        assert_eq!(get("sys.message_id"), None);
        assert_eq!(get("body.a.missing"), None);
    }

    #[test]
    fn paths_set_and_remove() {
        let mut value = json!({"a": {"b": 1}, "list": [1, 2]});
        let path = |t: &str| FieldPath::parse(t).expect(t);
        path("x.y")
            .set(&mut value, json!(2))
            .expect("made on the way");
        assert_eq!(value["x"]["y"], 2);
        assert_eq!(path("a.b").remove(&mut value), Some(json!(1)));
        assert!(path("list[5]").set(&mut value, json!(0)).is_err());
        assert!(path("a.b.c").set(&mut value["list"], json!(0)).is_err());
        assert_eq!(path("list[0]").remove(&mut value), Some(json!(1)));
        assert_eq!(value["list"], json!([2]));
    }
}
