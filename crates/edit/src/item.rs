//! An event on its way through the editor: the event, where it was read, and its body parsed as
//! JSON at most once however many steps look at it.
//!
//! Steps that read JSON fields share one parse ([`Item::json`]); steps that edit them change the
//! parsed value ([`Item::json_mut`]) and the body is written out once, when a step needs the
//! bytes ([`Item::body`]) or the event leaves the editor ([`Item::into_event`]). So a chain of
//! filter, transform and validate parses and serialises a JSON body once each, not once a step.

use std::sync::OnceLock;

use bytes::Bytes;
use serde_json::Value;
use tributary_event::{EventData, PropertyValue, ReceivedEvent};

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
/// Invariant: while `json_edited` is set, `json` holds a parsed value that is newer than
/// `event.body`; every accessor that hands out the body writes it out first.
#[derive(Debug)]
pub struct Item {
    event: EventData,
    position: Position,
    json: OnceLock<Option<Value>>,
    json_edited: bool,
}

impl Clone for Item {
    fn clone(&self) -> Item {
        Item {
            event: self.event.clone(),
            position: self.position,
            json: self.json.clone(),
            json_edited: self.json_edited,
        }
    }
}

impl Item {
    /// An item for `event`, read at `position`.
    pub fn new(event: EventData, position: Position) -> Item {
        Item {
            event,
            position,
            json: OnceLock::new(),
            json_edited: false,
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
            .get_or_init(|| serde_json::from_slice(&self.event.body).ok())
            .as_ref()
    }

    /// The parsed body to edit in place; the body is rewritten from it when next needed.
    /// `None` when the body is not JSON.
    pub fn json_mut(&mut self) -> Option<&mut Value> {
        self.json();
        let value = self.json.get_mut().expect("parsed above").as_mut()?;
        self.json_edited = true;
        Some(value)
    }

    /// Replaces the body with `value` (written out when next needed).
    pub fn set_json(&mut self, value: Value) {
        self.json = OnceLock::from(Some(value));
        self.json_edited = true;
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
    }

    /// The whole event to change freely (pending JSON edits written out first; a JSON parse is
    /// forgotten, since the body may change).
    pub fn event_mut(&mut self) -> &mut EventData {
        self.write_out_json();
        self.json = OnceLock::new();
        &mut self.event
    }

    /// The event as it leaves the editor.
    pub fn into_event(mut self) -> EventData {
        self.write_out_json();
        self.event
    }

    fn write_out_json(&mut self) {
        if !self.json_edited {
            return;
        }
        self.json_edited = false;
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
