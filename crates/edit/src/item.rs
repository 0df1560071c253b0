//! An event on its way through the editor: the event, where it was read, and its body read as
//! JSON at most once however many steps look at it.
//!
//! Filter, transform and validate read the body lazily ([`crate::lazy`]): one scan of the
//! bytes, a `Value` made only of the fields a step names ([`Item::body_field`]), edits of
//! members (at any depth) kept beside the bytes and spliced in when the body is written out.
//! Steps that need the whole body share one parse ([`Item::json`]) and edit it in place
//! ([`Item::json_mut`]); the body is written out once, when a step needs the bytes
//! ([`Item::body`]) or the event leaves the editor ([`Item::into_event`]). Bodies the lazy
//! reader leaves to serde_json (see its docs) take the parse.

use std::sync::OnceLock;

use bytes::Bytes;
use serde_json::Value;
use tributary_event::{EventData, PropertyValue, ReceivedEvent};

use crate::field::{FieldPath, Segment};
use crate::lazy::{self, Doc, DocMut, Found, Overlay, Tape};

/// Where the event an item came from was stored in its source partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The source sequence number.
    pub sequence_number: i64,
    /// The source offset.
    pub offset: u64,
    /// The source enqueued time, ms since the Unix epoch.
    pub enqueued_time_ms: i64,
}

impl Position {
    /// Where `event` was stored.
    pub fn of(event: &ReceivedEvent) -> Position {
        Position {
            sequence_number: event.sequence_number,
            offset: event.offset,
            enqueued_time_ms: event.enqueued_time_ms,
        }
    }
}

/// One event in the editor.
///
/// Invariants: while `json_edited` is set, `json` holds a parsed value that is newer than
/// `event.body`; while `overlay` is set, it holds the edits of the object body `tape`
/// indexes, and `json` (when set) is its value. At most one of the two holds pending edits;
/// every accessor that hands out the body writes them out first.
#[derive(Debug, Clone)]
pub struct Item {
    event: EventData,
    position: Position,
    json: OnceLock<Option<Value>>,
    json_edited: bool,
    /// The body's tape, made on the first lazy read; `None` inside: the scanner left the body
    /// to serde_json.
    tape: OnceLock<Option<Box<Tape>>>,
    overlay: Option<Overlay>,
}

impl Item {
    /// An item for `event`, read at `position`.
    pub fn new(event: EventData, position: Position) -> Item {
        Item {
            event,
            position,
            json: OnceLock::new(),
            json_edited: false,
            tape: OnceLock::new(),
            overlay: None,
        }
    }
    /// An item for an event as the hub stored it.
    pub fn received(event: ReceivedEvent) -> Item {
        let position = Position::of(&event);
        Item::new(event.data, position)
    }

    /// Where the source event was stored (for an event a step made of several, the first's).
    pub fn position(&self) -> Position {
        self.position
    }

    /// The application properties, in order.
    pub fn properties(&self) -> &[(String, PropertyValue)] {
        &self.event.properties
    }

    /// The application property `key`.
    pub fn property(&self, key: &str) -> Option<&PropertyValue> {
        self.event.property(key)
    }

    /// Sets the application property `key` in place (appended when new), keeping keys unique.
    pub fn set_property(&mut self, key: &str, value: PropertyValue) {
        match self.event.properties.iter_mut().find(|(k, _)| k == key) {
            Some((_, slot)) => *slot = value,
            None => self.event.properties.push((key.to_owned(), value)),
        }
    }

    /// Removes the application property `key`, returning its value.
    pub fn remove_property(&mut self, key: &str) -> Option<PropertyValue> {
        let at = self.event.properties.iter().position(|(k, _)| k == key)?;
        Some(self.event.properties.remove(at).1)
    }

    /// The partition key.
    pub fn partition_key(&self) -> Option<&str> {
        self.event.partition_key.as_deref()
    }

    /// The content type.
    pub fn content_type(&self) -> Option<&str> {
        self.event.content_type.as_deref()
    }

    /// The message id.
    pub fn message_id(&self) -> Option<&str> {
        self.event.message_id.as_deref()
    }

    /// The correlation id.
    pub fn correlation_id(&self) -> Option<&str> {
        self.event.correlation_id.as_deref()
    }

    /// The body parsed as JSON, parsed on the first call; `None` when the body is not JSON.
    pub fn json(&self) -> Option<&Value> {
        self.json
            .get_or_init(|| match self.doc() {
                Some(doc) => Some(doc.to_value()),
                None => serde_json::from_slice(&self.event.body).ok(),
            })
            .as_ref()
    }

    /// The parsed body to edit in place; the body is rewritten from it when next needed.
    /// `None` when the body is not JSON.
    pub fn json_mut(&mut self) -> Option<&mut Value> {
        self.json();
        self.overlay = None;
        self.tape = OnceLock::new();
        let value = self.json.get_mut().expect("parsed above").as_mut()?;
        self.json_edited = true;
        Some(value)
    }

    /// Replaces the body with `value` (written out when next needed).
    pub fn set_json(&mut self, value: Value) {
        self.json = OnceLock::from(Some(value));
        self.json_edited = true;
        self.overlay = None;
        self.tape = OnceLock::new();
    }

    /// The body field at `path` (the whole body when empty); `None` when it is missing or
    /// the body is not JSON. Reads only the field when nothing has parsed the whole body.
    pub fn body_field(&self, path: &FieldPath) -> Option<&Value> {
        if let Some(parsed) = self.json.get() {
            return path.get(parsed.as_ref()?);
        }
        if path.is_empty() {
            return self.json();
        }
        if let Some(doc) = self.doc() {
            return doc.value(path.segments());
        }
        match self.tape() {
            Some(tape) => tape
                .find(&self.event.body, 0, path.segments())
                .map(|index| tape.value(&self.event.body, index)),
            None => path.get(self.json()?),
        }
    }

    /// The body's tape, scanned on the first call; `None` when the body is left to serde_json
    /// (not JSON, or outside what the scanner indexes) or already parsed and edited.
    pub(crate) fn tape(&self) -> Option<&Tape> {
        if self.json_edited {
            return None;
        }
        self.tape
            .get_or_init(|| lazy::scan(&self.event.body).map(Box::new))
            .as_deref()
    }

    /// The JSON type of the body field at `path` (not empty), read lazily: `None` when the
    /// body is not read lazily, `Some(None)` when the field is missing.
    pub(crate) fn lazy_kind(&self, path: &[Segment]) -> Option<Option<&'static str>> {
        if let Some(doc) = self.doc() {
            return Some(doc.get(path).map(|found| match found {
                Found::Tape(index) => doc.tape.kind_name(index),
                Found::Value(value) => lazy::value_kind(value),
                Found::Object(_) => "object",
            }));
        }
        let tape = self.tape()?;
        Some(
            tape.find(&self.event.body, 0, path)
                .map(|index| tape.kind_name(index)),
        )
    }

    /// The parse of the body, when one was made.
    pub(crate) fn parsed(&self) -> Option<&Option<Value>> {
        self.json.get()
    }

    /// The body's bytes as they are (without pending edits).
    pub(crate) fn raw_body(&self) -> &[u8] {
        &self.event.body
    }

    /// The pending edits of an object body, as a document to read.
    pub(crate) fn doc(&self) -> Option<Doc<'_>> {
        let overlay = self.overlay.as_ref()?;
        Some(Doc {
            tape: self.tape.get()?.as_deref()?,
            body: &self.event.body,
            overlay,
        })
    }

    /// The object body as a document to edit member by member, when the body is an object
    /// the scanner indexed and no step edits it as a parsed value; `None` otherwise (then use
    /// [`Item::json_mut`]).
    pub(crate) fn doc_mut(&mut self) -> Option<DocMut<'_>> {
        if self.json_edited || !self.tape()?.is_object() {
            return None;
        }
        // Any parse made before is of the body as it was.
        self.json = OnceLock::new();
        let tape = self.tape.get()?.as_deref()?;
        let overlay = self.overlay.get_or_insert_with(|| Overlay::of(tape));
        Some(DocMut {
            tape,
            body: &self.event.body,
            overlay,
        })
    }

    /// The body as bytes, with every pending JSON edit written out.
    pub fn body(&mut self) -> &Bytes {
        self.write_out_json();
        &self.event.body
    }

    /// Replaces the body; a JSON parse of the old body is forgotten.
    pub fn set_body(&mut self, body: Bytes) {
        self.event.body = body;
        self.json = OnceLock::new();
        self.json_edited = false;
        self.tape = OnceLock::new();
        self.overlay = None;
    }

    /// The whole event to change freely (pending JSON edits written out first; a JSON parse is
    /// forgotten, since the body may change).
    pub fn event_mut(&mut self) -> &mut EventData {
        self.write_out_json();
        self.json = OnceLock::new();
        self.tape = OnceLock::new();
        &mut self.event
    }

    /// The event as it leaves the editor.
    pub fn into_event(mut self) -> EventData {
        self.write_out_json();
        self.event
    }

    fn write_out_json(&mut self) {
        if let Some(doc) = self.doc() {
            let bytes = doc.write();
            self.overlay = None;
            self.tape = OnceLock::new();
            // `json`, when set, is the value of the edited document: still the body's.
            self.event.body = Bytes::from(bytes);
            return;
        }
        if !self.json_edited {
            return;
        }
        self.json_edited = false;
        self.tape = OnceLock::new();
        let value = self
            .json
            .get()
            .and_then(Option::as_ref)
            .expect("an edited body holds a parsed value");
        // A `Value` always serialises: its map keys are strings.
        let bytes = serde_json::to_vec(value).expect("a JSON value serialises");
        self.event.body = Bytes::from(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(body: &str) -> Item {
        Item::new(
            EventData::new(body.to_owned()),
            Position {
                sequence_number: 7,
                offset: 70,
                enqueued_time_ms: 1,
            },
        )
    }

    #[test]
    fn a_json_edit_reaches_the_body_once_it_is_asked_for() {
        let mut item = item(r#"{"a":1}"#);
        item.json_mut().expect("JSON")["b"] = Value::from(2);
        assert_eq!(item.body().as_ref(), br#"{"a":1,"b":2}"#);
        assert_eq!(item.json().expect("still parsed")["b"], 2);
        assert_eq!(item.into_event().body.as_ref(), br#"{"a":1,"b":2}"#);
    }

    #[test]
    fn a_body_that_is_not_json_has_no_json_and_is_left_alone() {
        let mut item = item("not json");
        assert!(item.json().is_none());
        assert!(item.json_mut().is_none());
        assert_eq!(item.into_event().body.as_ref(), b"not json");
    }

    #[test]
    fn a_new_body_forgets_the_old_parse() {
        let mut item = item(r#"{"a":1}"#);
        assert_eq!(item.json().expect("JSON")["a"], 1);
        item.set_body(Bytes::from_static(br#"{"a":2}"#));
        assert_eq!(item.json().expect("JSON")["a"], 2);
    }

    #[test]
    fn properties_stay_unique_when_set() {
        let mut item = item("x");
        item.set_property("k", PropertyValue::Int64(1));
        item.set_property("k", PropertyValue::Int64(2));
        assert_eq!(item.properties().len(), 1);
        assert_eq!(item.remove_property("k"), Some(PropertyValue::Int64(2)));
        assert!(item.property("k").is_none());
    }
}
