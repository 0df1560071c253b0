//! `batch` (many events → one event whose body is a JSON array) and `unbatch` (one event with
//! a JSON-array body → one event per element).
//!
//! ```toml
//! [[step]]
//! kind = "batch"
//! max_events = 100          # events per batch (1..=1000)
//! max_bytes = 983040        # bytes of the batch body (default 1 MiB less 64 KiB)
//! form = "envelopes"        # or "bodies" (default)
//!
//! [[step]]
//! kind = "unbatch"
//! form = "envelopes"        # as the batch step wrote it
//! not_array = "reject"      # or "pass": a body that is not a JSON array
//! ```
//!
//! # batch
//!
//! - **Within one call**: a batch is made of the events of one `apply` call (one source
//!   batch, after which the replicator checkpoints), never held across calls.
//! - **By partition key**: only events with the same partition key (or none) share a batch,
//!   which carries that key; per key the order is kept. Batches leave in the order of their
//!   first event, and each takes its first event's source position.
//! - **Bounded**: a batch closes at `max_events` events or when the next element would take
//!   its body past `max_bytes`; an event whose element alone would is refused.
//! - `form = "bodies"`: each element is the event's JSON body, byte for byte; a body that is
//!   not JSON is refused (as a base64 string it could not be told from a JSON string when
//!   unbatched). `form = "envelopes"`: each element is `{"body": <JSON> | "body_base64":
//!   "<base64>", "properties": {...}, "message_id", "correlation_id", "content_type",
//!   "partition_key", "protocol_sections_base64"}` (absent ids left out), so unbatch restores
//!   the event. Property values are JSON strings, booleans, 64-bit integers, finite doubles and
//!   null as they are; every other type is `{"type": "int32" | "uint32" | "uint64" | "float32"
//!   | "float64" | "bytes" | "timestamp" | "uuid", "value": ...}` (bytes base64, uuid hyphenated,
//!   timestamp in ms, non-finite floats as "NaN"/"inf"/"-inf").
//! - The batch's content type is `application/json`; its one property,
//!   `tributary-batch-count`, is how many events it holds.
//!
//! # unbatch
//!
//! - Each element becomes an event, in order, at the outer event's source position.
//!   `form = "bodies"`: the element is the body; the outer event's properties (less
//!   `tributary-batch-count`), partition key and correlation id are copied, the content type
//!   is `application/json`, and no message id is copied (one id on many events would make
//!   them duplicates). `form = "envelopes"`: the event is restored from its envelope —
//!   properties in their order, ids, key, content type; a non-JSON body byte for byte, a JSON
//!   body as equivalent (compact) JSON.
//! - All or nothing: an element that cannot be restored refuses the whole outer event.
//! - At most [`UNBATCH_ELEMENTS_MAX`] elements; an empty array is dropped (counted).

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use serde::Deserialize;
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Number, Value as Json};
use tributary_event::{EventData, PropertyValue};

use crate::item::{Item, Position};
use crate::limits::HUB_EVENT_BYTES_MAX;
use crate::spec::{CompileContext, SpecError};
use crate::step::{Context, Output, Step};

/// The property a batch carries: how many events it holds.
pub const BATCH_COUNT_PROPERTY: &str = "tributary-batch-count";

/// Events a batch holds by default: what Azure Functions' Event Hubs trigger hands a function
/// at once (`maxEventBatchSize`).
const BATCH_EVENTS_DEFAULT: usize = 100;

/// The most events a batch may be configured to hold: more would average under 1 KiB each in a
/// 1 MiB event, and a consumer handling one batch handles them all at once.
pub const BATCH_EVENTS_MAX: usize = 1000;

/// A batch body's size by default: a hub event's 1 MiB less 64 KiB for the batch's properties,
/// system properties and protocol framing.
pub const BATCH_BYTES_MAX_DEFAULT: usize = HUB_EVENT_BYTES_MAX - 64 * 1024;

/// The most elements `unbatch` splits one event into: every batch this step writes fits, with
/// room for arrays producers write themselves; more would turn one event into a source
/// batch's worth of events.
pub const UNBATCH_ELEMENTS_MAX: usize = 4 * BATCH_EVENTS_MAX;

const _: () = assert!(UNBATCH_ELEMENTS_MAX >= BATCH_EVENTS_MAX);
const _: () = assert!(BATCH_BYTES_MAX_DEFAULT < HUB_EVENT_BYTES_MAX);
const _: () = assert!(BATCH_EVENTS_DEFAULT <= BATCH_EVENTS_MAX);

const JSON_CONTENT_TYPE: &str = "application/json";

/// What each element of a batch is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Form {
    /// The event's JSON body.
    #[default]
    Bodies,
    /// The whole event: body, properties, ids, key, content type.
    Envelopes,
}

/// The `batch` step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    /// Events per batch (default 100, at most 1000).
    #[serde(default)]
    pub max_events: Option<usize>,
    /// Bytes of a batch body (default 1 MiB less 64 KiB, at most 1 MiB).
    #[serde(default)]
    pub max_bytes: Option<usize>,
    /// bodies (default) or envelopes.
    #[serde(default)]
    pub form: Form,
}

pub(crate) fn compile_batch(
    name: String,
    spec: BatchSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let max_events = spec.max_events.unwrap_or(BATCH_EVENTS_DEFAULT);
    if !(1..=BATCH_EVENTS_MAX).contains(&max_events) {
        return Err(SpecError::at(
            "max_events",
            format!("{max_events} is out of range; use 1..={BATCH_EVENTS_MAX}"),
        ));
    }
    let max_bytes = spec.max_bytes.unwrap_or(BATCH_BYTES_MAX_DEFAULT);
    if !(2..=HUB_EVENT_BYTES_MAX).contains(&max_bytes) {
        return Err(SpecError::at(
            "max_bytes",
            format!(
                "{max_bytes} is out of range; use 2..={HUB_EVENT_BYTES_MAX} (a batch is one \
                 event, and a hub takes events up to 1 MiB)"
            ),
        ));
    }
    Ok(Arc::new(Batch {
        name,
        max_events,
        max_bytes,
        form: spec.form,
    }))
}

#[derive(Debug)]
struct Batch {
    name: String,
    max_events: usize,
    max_bytes: usize,
    form: Form,
}

/// A batch being filled.
struct Open {
    key: Option<String>,
    first_index: usize,
    position: Position,
    /// `[` and the elements so far, comma-separated.
    body: Vec<u8>,
    count: usize,
}

impl Open {
    fn new(key: Option<String>, first_index: usize, position: Position) -> Open {
        Open {
            key,
            first_index,
            position,
            body: vec![b'['],
            count: 0,
        }
    }

    /// The body's size with `element` added and the array closed.
    fn size_with(&self, element: &[u8]) -> usize {
        self.body.len() + usize::from(self.count > 0) + element.len() + 1
    }

    fn push(&mut self, element: &[u8]) {
        if self.count > 0 {
            self.body.push(b',');
        }
        self.body.extend_from_slice(element);
        self.count += 1;
    }

    fn into_item(mut self) -> Item {
        self.body.push(b']');
        let count = i64::try_from(self.count).unwrap_or(i64::MAX);
        let event = EventData {
            body: Bytes::from(self.body),
            properties: vec![(BATCH_COUNT_PROPERTY.into(), PropertyValue::Int64(count))],
            partition_key: self.key,
            content_type: Some(JSON_CONTENT_TYPE.to_owned()),
            ..EventData::default()
        };
        Item::new(event, self.position)
    }
}

/// The batches being filled, one per partition key.
#[derive(Default)]
struct Batches {
    open: Vec<Open>,
    keyed: HashMap<String, usize>,
    unkeyed: Option<usize>,
    closed: Vec<Open>,
}

impl Batches {
    /// The batch for `key`, opened at `index` if there is none.
    fn slot(&mut self, key: Option<&str>, index: usize, position: Position) -> usize {
        let found = match key {
            Some(key) => self.keyed.get(key).copied(),
            None => self.unkeyed,
        };
        if let Some(slot) = found {
            return slot;
        }
        let slot = self.open.len();
        self.open
            .push(Open::new(key.map(str::to_owned), index, position));
        match key {
            Some(key) => {
                self.keyed.insert(key.to_owned(), slot);
            }
            None => self.unkeyed = Some(slot),
        }
        slot
    }

    /// Closes the batch in `slot` and opens the next for the same key at `index`.
    fn roll(&mut self, slot: usize, index: usize, position: Position) {
        let key = self.open[slot].key.clone();
        let full = std::mem::replace(&mut self.open[slot], Open::new(key, index, position));
        self.closed.push(full);
    }

    /// Every batch, in the order of its first event.
    fn finish(mut self) -> Vec<Open> {
        self.closed
            .extend(self.open.into_iter().filter(|open| open.count > 0));
        self.closed.sort_by_key(|open| open.first_index);
        self.closed
    }
}

impl Batch {
    /// Writes `item`'s element into `element`.
    fn element(&self, item: &mut Item, element: &mut Vec<u8>) -> Result<(), String> {
        match self.form {
            Form::Bodies => {
                if item.json().is_none() {
                    return Err(
                        "the body is not JSON: form = \"bodies\" batches JSON bodies \
                                only (form = \"envelopes\" carries any body)"
                            .to_owned(),
                    );
                }
                element.extend_from_slice(item.body());
                Ok(())
            }
            Form::Envelopes => write_envelope(item, element).map_err(|e| e.to_string()),
        }
    }
}

impl Step for Batch {
    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, _context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        let mut batches = Batches::default();
        let mut element = Vec::new();
        for (index, mut item) in items.into_iter().enumerate() {
            element.clear();
            if let Err(reason) = self.element(&mut item, &mut element) {
                out.reject(item, reason);
                continue;
            }
            if element.len() + 2 > self.max_bytes {
                let reason = format!(
                    "the event takes {} bytes in a batch, more than max_bytes = {} allows",
                    element.len(),
                    self.max_bytes
                );
                out.reject(item, reason);
                continue;
            }
            let position = item.position();
            let slot = batches.slot(item.partition_key(), index, position);
            let open = &batches.open[slot];
            if open.count == self.max_events || open.size_with(&element) > self.max_bytes {
                batches.roll(slot, index, position);
            }
            batches.open[slot].push(&element);
        }
        for batch in batches.finish() {
            out.pass(batch.into_item());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// envelopes

/// Writes `{"body": ..., "properties": {...}, ...}` for `item`.
fn write_envelope(item: &mut Item, out: &mut Vec<u8>) -> serde_json::Result<()> {
    if item.json().is_some() {
        out.extend_from_slice(b"{\"body\":");
        out.extend_from_slice(item.body());
    } else {
        out.extend_from_slice(b"{\"body_base64\":");
        append_base64(out, item.body());
    }
    out.extend_from_slice(b",\"properties\":{");
    for (i, (key, value)) in item.properties().iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut *out, key.as_str())?;
        out.push(b':');
        serde_json::to_writer(&mut *out, &property_json(value))?;
    }
    out.push(b'}');
    let ids = [
        ("message_id", item.message_id()),
        ("correlation_id", item.correlation_id()),
        ("content_type", item.content_type()),
        ("partition_key", item.partition_key()),
    ];
    for (name, value) in ids {
        if let Some(value) = value {
            out.extend_from_slice(b",\"");
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\":");
            serde_json::to_writer(&mut *out, value)?;
        }
    }
    // The item is used up by the batch, so forgetting its parse (event_mut) costs nothing.
    if let Some(sections) = &item.event_mut().protocol_sections {
        out.extend_from_slice(b",\"protocol_sections_base64\":");
        append_base64(out, sections);
    }
    out.push(b'}');
    Ok(())
}

/// Appends `bytes` as a quoted base64 JSON string.
fn append_base64(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'"');
    let start = out.len();
    // base64 of an event body (under 1 MiB) has a length; `encode_slice` fills exactly it.
    let len = base64::encoded_len(bytes.len(), true).unwrap_or(0);
    out.resize(start + len, 0);
    let written = BASE64.encode_slice(bytes, &mut out[start..]).unwrap_or(0);
    out.truncate(start + written);
    out.push(b'"');
}

fn tagged(kind: &str, value: Json) -> Json {
    let mut object = serde_json::Map::new();
    object.insert("type".to_owned(), Json::String(kind.to_owned()));
    object.insert("value".to_owned(), value);
    Json::Object(object)
}

/// A float's JSON: the number when finite, else "NaN", "inf" or "-inf".
fn float_json(f: f64) -> Json {
    Number::from_f64(f).map_or_else(|| Json::String(f.to_string()), Json::Number)
}

/// A property value's JSON form (see the module doc): plain JSON for booleans, `i64`s, finite
/// `f64`s and strings, `{"type": …, "value": …}` for the rest. Replication's PostgreSQL
/// projection stores application properties this way too.
pub fn property_json(value: &PropertyValue) -> Json {
    match value {
        PropertyValue::Null => Json::Null,
        PropertyValue::Bool(b) => Json::Bool(*b),
        PropertyValue::Int64(n) => Json::from(*n),
        PropertyValue::Float64(f) if f.is_finite() => float_json(*f),
        PropertyValue::String(s) => Json::String(s.to_string()),
        PropertyValue::Float64(f) => tagged("float64", float_json(*f)),
        PropertyValue::Int32(n) => tagged("int32", Json::from(*n)),
        PropertyValue::UInt32(n) => tagged("uint32", Json::from(*n)),
        PropertyValue::UInt64(n) => tagged("uint64", Json::from(*n)),
        // Through its shortest decimal form, so 0.1f32 reads 0.1.
        PropertyValue::Float32(f) => tagged(
            "float32",
            float_json(f.to_string().parse().unwrap_or(f64::from(*f))),
        ),
        PropertyValue::Bytes(b) => tagged("bytes", Json::String(BASE64.encode(b))),
        PropertyValue::Timestamp(ms) => tagged("timestamp", Json::from(*ms)),
        PropertyValue::Uuid(bytes) => tagged(
            "uuid",
            Json::String(
                apache_avro::Uuid::from_bytes(*bytes)
                    .hyphenated()
                    .to_string(),
            ),
        ),
    }
}

/// A float from its JSON form (a number, or "NaN", "inf", "-inf").
fn float_of(json: &Json) -> Option<f64> {
    match json {
        Json::Number(n) => n.as_f64(),
        Json::String(text) => text.parse().ok(),
        _ => None,
    }
}

/// A property value from its JSON form.
fn property_value(json: Json) -> Result<PropertyValue, String> {
    Ok(match json {
        Json::Null => PropertyValue::Null,
        Json::Bool(b) => PropertyValue::Bool(b),
        Json::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => PropertyValue::Int64(i),
            (None, Some(u), _) => PropertyValue::UInt64(u),
            (None, None, Some(f)) => PropertyValue::Float64(f),
            _ => return Err(format!("{n} is not a number a property holds")),
        },
        Json::String(s) => PropertyValue::String(s.into()),
        Json::Array(_) => return Err("an array is not a property value".to_owned()),
        Json::Object(object) => {
            let kind = object.get("type").and_then(Json::as_str);
            match (kind, object.get("value"), object.len()) {
                (Some(kind), Some(value), 2) => tagged_value(kind, value)?,
                _ => {
                    return Err(
                        "an object property value is {\"type\": ..., \"value\": ...}".to_owned(),
                    );
                }
            }
        }
    })
}

fn tagged_value(kind: &str, value: &Json) -> Result<PropertyValue, String> {
    let bad = || format!("{value} is not a {kind} value");
    let int = || value.as_i64().ok_or_else(bad);
    let unsigned = || value.as_u64().ok_or_else(bad);
    Ok(match kind {
        "int32" => PropertyValue::Int32(i32::try_from(int()?).map_err(|_| bad())?),
        "int64" => PropertyValue::Int64(int()?),
        "uint32" => PropertyValue::UInt32(u32::try_from(unsigned()?).map_err(|_| bad())?),
        "uint64" => PropertyValue::UInt64(unsigned()?),
        // The nearest f32 to the written value is the f32 that was written.
        "float32" => PropertyValue::Float32(float_of(value).ok_or_else(bad)? as f32),
        "float64" => PropertyValue::Float64(float_of(value).ok_or_else(bad)?),
        "timestamp" => PropertyValue::Timestamp(int()?),
        "bytes" => {
            let text = value.as_str().ok_or_else(bad)?;
            PropertyValue::Bytes(Bytes::from(BASE64.decode(text).map_err(|_| bad())?))
        }
        "uuid" => {
            let text = value.as_str().ok_or_else(bad)?;
            let uuid = apache_avro::Uuid::parse_str(text).map_err(|_| bad())?;
            PropertyValue::Uuid(*uuid.as_bytes())
        }
        other => {
            return Err(format!(
                "{other:?} is not a property type (int32, int64, uint32, uint64, float32, \
                 float64, timestamp, bytes, uuid)"
            ));
        }
    })
}

// ---------------------------------------------------------------------------------------------
// unbatch

/// What `unbatch` does with a body that is not a JSON array.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NotArray {
    /// Refuse it (for the dead-letter target).
    #[default]
    Reject,
    /// Pass it on unchanged.
    Pass,
}

/// The `unbatch` step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnbatchSpec {
    /// bodies (default) or envelopes: as the batch step wrote it.
    #[serde(default)]
    pub form: Form,
    /// What to do with a body that is not a JSON array (default: reject).
    #[serde(default)]
    pub not_array: NotArray,
}

pub(crate) fn compile_unbatch(
    name: String,
    spec: UnbatchSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    Ok(Arc::new(Unbatch {
        name,
        form: spec.form,
        not_array: spec.not_array,
    }))
}

#[derive(Debug)]
struct Unbatch {
    name: String,
    form: Form,
    not_array: NotArray,
}

/// An event as `form = "envelopes"` writes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope {
    #[serde(default, deserialize_with = "present")]
    body: Option<Json>,
    #[serde(default)]
    body_base64: Option<String>,
    #[serde(default)]
    properties: Properties,
    #[serde(default)]
    message_id: Option<String>,
    #[serde(default)]
    correlation_id: Option<String>,
    #[serde(default)]
    content_type: Option<String>,
    #[serde(default)]
    partition_key: Option<String>,
    #[serde(default)]
    protocol_sections_base64: Option<String>,
}

/// A field that is present, even when it is `null` (a JSON body may be `null`).
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Json>, D::Error> {
    Json::deserialize(deserializer).map(Some)
}

/// Properties in the order they were written (a JSON map would sort them).
#[derive(Debug, Default)]
struct Properties(Vec<(String, Json)>);

impl<'de> Deserialize<'de> for Properties {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Properties, D::Error> {
        struct InOrder;
        impl<'de> Visitor<'de> for InOrder {
            type Value = Properties;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of properties")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Properties, A::Error> {
                let mut properties = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    properties.push(entry);
                }
                Ok(Properties(properties))
            }
        }
        deserializer.deserialize_map(InOrder)
    }
}

/// A JSON array of at most [`UNBATCH_ELEMENTS_MAX`] elements, refused as soon as it has more.
struct Bounded<T>(Vec<T>);

impl<'de, T: DeserializeOwned> Deserialize<'de> for Bounded<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Bounded<T>, D::Error> {
        struct Elements<T>(PhantomData<T>);
        impl<'de, T: DeserializeOwned> Visitor<'de> for Elements<T> {
            type Value = Bounded<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON array of envelopes")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bounded<T>, A::Error> {
                let mut elements = Vec::new();
                while let Some(element) = seq.next_element()? {
                    if elements.len() == UNBATCH_ELEMENTS_MAX {
                        return Err(de::Error::custom(format!(
                            "more than {UNBATCH_ELEMENTS_MAX} elements"
                        )));
                    }
                    elements.push(element);
                }
                Ok(Bounded(elements))
            }
        }
        deserializer.deserialize_seq(Elements(PhantomData))
    }
}

fn json_kind(json: &Json) -> &'static str {
    match json {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

impl Envelope {
    /// The event this envelope holds.
    fn restore(self, position: Position) -> Result<Item, String> {
        let mut properties = Vec::with_capacity(self.properties.0.len());
        for (key, value) in self.properties.0 {
            let value = property_value(value).map_err(|e| format!("property {key:?}: {e}"))?;
            properties.push((key.into(), value));
        }
        let protocol_sections = match self.protocol_sections_base64 {
            Some(text) => Some(Bytes::from(
                BASE64
                    .decode(text)
                    .map_err(|e| format!("protocol_sections_base64: {e}"))?,
            )),
            None => None,
        };
        let mut event = EventData {
            body: Bytes::new(),
            properties,
            partition_key: self.partition_key,
            content_type: self.content_type,
            correlation_id: self.correlation_id,
            message_id: self.message_id,
            protocol_sections,
        };
        match (self.body, self.body_base64) {
            (Some(json), None) => {
                let mut item = Item::new(event, position);
                item.set_json(json);
                Ok(item)
            }
            (None, Some(text)) => {
                event.body = Bytes::from(
                    BASE64
                        .decode(text)
                        .map_err(|e| format!("body_base64: {e}"))?,
                );
                Ok(Item::new(event, position))
            }
            _ => Err("an envelope has one of body and body_base64".to_owned()),
        }
    }
}

impl Unbatch {
    fn not_an_array(&self, item: Item, what: &str, out: &mut Output) {
        match self.not_array {
            NotArray::Pass => out.pass(item),
            NotArray::Reject => out.reject(item, format!("the body is {what}, not a JSON array")),
        }
    }

    fn bodies(&self, mut item: Item, out: &mut Output) {
        match item.json() {
            Some(Json::Array(elements)) if elements.len() > UNBATCH_ELEMENTS_MAX => {
                let reason = format!(
                    "the array has {} elements, more than the {UNBATCH_ELEMENTS_MAX} unbatch splits",
                    elements.len()
                );
                return out.reject(item, reason);
            }
            Some(Json::Array(_)) => {}
            Some(other) => {
                let what = json_kind(other);
                return self.not_an_array(item, what, out);
            }
            None => return self.not_an_array(item, "not JSON", out),
        }
        let elements = match item.json_mut() {
            Some(Json::Array(elements)) => std::mem::take(elements),
            _ => Vec::new(),
        };
        if elements.is_empty() {
            return out.drop_item(item);
        }
        let position = item.position();
        let mut template = EventData {
            properties: item.properties().to_vec(),
            partition_key: item.partition_key().map(str::to_owned),
            correlation_id: item.correlation_id().map(str::to_owned),
            content_type: Some(JSON_CONTENT_TYPE.to_owned()),
            ..EventData::default()
        };
        template
            .properties
            .retain(|(key, _)| key != BATCH_COUNT_PROPERTY);
        for element in elements {
            let mut unbatched = Item::new(template.clone(), position);
            unbatched.set_json(element);
            out.pass(unbatched);
        }
    }

    fn envelopes(&self, mut item: Item, out: &mut Output) {
        let body = item.body().clone();
        if !body.trim_ascii_start().starts_with(b"[") {
            let what = match item.json() {
                Some(json) => json_kind(json),
                None => "not JSON",
            };
            return self.not_an_array(item, what, out);
        }
        let envelopes = match serde_json::from_slice::<Bounded<Envelope>>(&body) {
            Ok(Bounded(envelopes)) => envelopes,
            Err(e) => return out.reject(item, format!("not an array of envelopes: {e}")),
        };
        if envelopes.is_empty() {
            return out.drop_item(item);
        }
        let position = item.position();
        let mut restored = Vec::with_capacity(envelopes.len());
        for (index, envelope) in envelopes.into_iter().enumerate() {
            match envelope.restore(position) {
                Ok(event) => restored.push(event),
                Err(reason) => return out.reject(item, format!("envelope {index}: {reason}")),
            }
        }
        for event in restored {
            out.pass(event);
        }
    }
}

impl Step for Unbatch {
    fn edits_each_event_alone(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, _context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        for item in items {
            match self.form {
                Form::Bodies => self.bodies(item, out),
                Form::Envelopes => self.envelopes(item, out),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::step::{Edited, Editor};

    fn compile(kind: &str, keys: Json) -> Result<Arc<dyn Step>, SpecError> {
        crate::spec::compile(kind, None, keys, &CompileContext::new("."))
    }

    fn step(kind: &str, keys: Json) -> Arc<dyn Step> {
        compile(kind, keys).expect("compiles")
    }

    fn position(n: usize) -> Position {
        Position {
            sequence_number: n as i64,
            offset: 10 * n as u64,
            enqueued_time_ms: 1000 + n as i64,
        }
    }

    fn run(step: &Arc<dyn Step>, items: Vec<Item>) -> Edited {
        let context = Context {
            partition: "0",
            now_ms: 0,
        };
        Editor::new(vec![step.clone()]).apply(&context, items)
    }

    fn items(events: Vec<EventData>) -> Vec<Item> {
        events
            .into_iter()
            .enumerate()
            .map(|(n, event)| Item::new(event, position(n)))
            .collect()
    }

    fn keyed(body: &str, key: Option<&str>) -> EventData {
        EventData {
            partition_key: key.map(str::to_owned),
            ..EventData::new(body.to_owned())
        }
    }

    fn every_property() -> Vec<(tributary_event::SmolStr, PropertyValue)> {
        let uuid = *b"\x67\xe5\x50\x44\x10\xb1\x42\x6f\x92\x47\xbb\x68\x0e\x5f\xe0\xc8";
        [
            ("z-first", PropertyValue::String("kept in order".into())),
            ("null", PropertyValue::Null),
            ("bool", PropertyValue::Bool(true)),
            ("int32", PropertyValue::Int32(-7)),
            ("int64", PropertyValue::Int64(i64::MIN)),
            ("uint32", PropertyValue::UInt32(u32::MAX)),
            ("uint64", PropertyValue::UInt64(u64::MAX)),
            ("float32", PropertyValue::Float32(0.1)),
            ("float64", PropertyValue::Float64(2.5)),
            ("integral", PropertyValue::Float64(2.0)),
            ("nan", PropertyValue::Float64(f64::NEG_INFINITY)),
            (
                "bytes",
                PropertyValue::Bytes(Bytes::from_static(b"\x00\xffraw")),
            ),
            ("timestamp", PropertyValue::Timestamp(1_714_564_800_123)),
            ("uuid", PropertyValue::Uuid(uuid)),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), v))
        .collect()
    }

    fn originals() -> Vec<EventData> {
        vec![
            EventData {
                properties: every_property(),
                partition_key: Some("k1".into()),
                content_type: Some("application/json".into()),
                correlation_id: Some("corr-1".into()),
                message_id: Some("m-1".into()),
                protocol_sections: Some(Bytes::from_static(b"\x00\x53\x70amqp")),
                ..EventData::new(r#"{"reading":{"temperature":21.5},"tags":["a"]}"#)
            },
            EventData {
                partition_key: Some("k1".into()),
                content_type: Some("application/octet-stream".into()),
                message_id: Some("m-2".into()),
                ..EventData::new(Bytes::from_static(b"\x1f\x8b not json \xff"))
            },
            EventData {
                partition_key: Some("k1".into()),
                ..EventData::new("null")
            },
        ]
    }

    #[test]
    fn envelopes_batch_and_unbatch_back_to_the_same_events_in_order() {
        let batched = run(
            &step("batch", json!({"form": "envelopes"})),
            items(originals()),
        );
        assert!(batched.rejected.is_empty(), "{:?}", batched.rejected);
        assert_eq!(batched.passed.len(), 1);
        let batch = &batched.passed[0];
        assert_eq!(batch.position(), position(0));
        assert_eq!(batch.partition_key(), Some("k1"));
        assert_eq!(batch.content_type(), Some("application/json"));
        assert_eq!(
            batch.property(BATCH_COUNT_PROPERTY),
            Some(&PropertyValue::Int64(3))
        );
        let array = batch.json().and_then(Json::as_array).expect("a JSON array");
        assert_eq!(array[1]["body_base64"], json!("H4sgbm90IGpzb24g/w=="));
        let unbatched = run(
            &step("unbatch", json!({"form": "envelopes"})),
            batched.passed,
        );
        assert!(unbatched.rejected.is_empty(), "{:?}", unbatched.rejected);
        let events: Vec<EventData> = unbatched.passed.into_iter().map(Item::into_event).collect();
        assert_eq!(events, originals());
    }

    #[test]
    fn different_keys_go_to_different_batches_in_order_of_their_first_event() {
        let events = vec![
            keyed(r#"{"n":0}"#, Some("a")),
            keyed(r#"{"n":1}"#, Some("b")),
            keyed(r#"{"n":2}"#, Some("a")),
            keyed(r#"{"n":3}"#, None),
            keyed(r#"{"n":4}"#, Some("b")),
        ];
        let edited = run(&step("batch", json!({})), items(events));
        let batches: Vec<(Option<String>, Position, String)> = edited
            .passed
            .into_iter()
            .map(|item| {
                let position = item.position();
                let event = item.into_event();
                let body = String::from_utf8(event.body.to_vec()).expect("utf-8");
                (event.partition_key, position, body)
            })
            .collect();
        assert_eq!(
            batches,
            vec![
                (Some("a".into()), position(0), r#"[{"n":0},{"n":2}]"#.into()),
                (Some("b".into()), position(1), r#"[{"n":1},{"n":4}]"#.into()),
                (None, position(3), r#"[{"n":3}]"#.into()),
            ]
        );
    }

    #[test]
    fn batches_close_at_max_events_and_max_bytes() {
        let events = (0..5)
            .map(|n| keyed(&format!("{{\"n\":{n}}}"), Some("k")))
            .collect();
        let edited = run(&step("batch", json!({"max_events": 2})), items(events));
        let counts: Vec<_> = edited
            .passed
            .iter()
            .map(|i| i.property(BATCH_COUNT_PROPERTY).cloned())
            .collect();
        let count = |n| Some(PropertyValue::Int64(n));
        assert_eq!(counts, vec![count(2), count(2), count(1)]);
        assert_eq!(edited.passed[1].position(), position(2));
        // Each element is 7 bytes: "[a,b]" of two is 17, three would be 25.
        let events = (0..4)
            .map(|n| keyed(&format!("{{\"n\":{n}}}"), None))
            .collect();
        let mut edited = run(&step("batch", json!({"max_bytes": 24})), items(events));
        let bodies: Vec<Bytes> = edited
            .passed
            .drain(..)
            .map(|i| i.into_event().body)
            .collect();
        assert_eq!(
            bodies,
            vec![
                Bytes::from(r#"[{"n":0},{"n":1}]"#),
                Bytes::from(r#"[{"n":2},{"n":3}]"#)
            ]
        );
        let big = keyed(&format!("\"{}\"", "x".repeat(30)), None);
        let edited = run(&step("batch", json!({"max_bytes": 24})), items(vec![big]));
        assert!(
            edited.rejected[0]
                .reason
                .contains("more than max_bytes = 24")
        );
    }

    #[test]
    fn a_body_that_is_not_json_is_refused_in_bodies_form() {
        let events = vec![keyed("{\"ok\":1}", None), keyed("not json", None)];
        let edited = run(&step("batch", json!({})), items(events));
        assert_eq!(edited.passed.len(), 1);
        assert_eq!(edited.rejected.len(), 1);
        assert!(edited.rejected[0].reason.contains("form = \"envelopes\""));
        assert_eq!(edited.rejected[0].item.position(), position(1));
    }

    #[test]
    fn unbatching_bodies_copies_the_outer_event_but_not_its_id() {
        let outer = EventData {
            properties: vec![
                ("site".into(), PropertyValue::String("north".into())),
                (BATCH_COUNT_PROPERTY.into(), PropertyValue::Int64(2)),
            ],
            partition_key: Some("k".into()),
            message_id: Some("batch-1".into()),
            correlation_id: Some("c".into()),
            ..EventData::new(r#"[{"n":1}, "two"]"#)
        };
        let edited = run(&step("unbatch", json!({})), items(vec![outer]));
        let events: Vec<EventData> = edited.passed.into_iter().map(Item::into_event).collect();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].body.as_ref(), br#"{"n":1}"#);
        assert_eq!(events[1].body.as_ref(), br#""two""#);
        for event in &events {
            assert_eq!(
                event.properties,
                vec![("site".into(), PropertyValue::String("north".into()))]
            );
            assert_eq!(event.partition_key.as_deref(), Some("k"));
            assert_eq!(event.correlation_id.as_deref(), Some("c"));
            assert_eq!(event.content_type.as_deref(), Some("application/json"));
            assert_eq!(event.message_id, None);
        }
    }

    #[test]
    fn unbatch_refuses_passes_or_drops_what_is_not_a_batch() {
        let reject = step("unbatch", json!({}));
        let edited = run(
            &reject,
            items(vec![keyed(r#"{"a":1}"#, None), keyed("text", None)]),
        );
        let reasons: Vec<&str> = edited.rejected.iter().map(|r| r.reason.as_str()).collect();
        assert_eq!(
            reasons,
            [
                "the body is an object, not a JSON array",
                "the body is not JSON, not a JSON array"
            ]
        );
        let pass = step("unbatch", json!({"not_array": "pass", "form": "envelopes"}));
        let edited = run(
            &pass,
            items(vec![keyed(r#"{"a":1}"#, None), keyed("[]", None)]),
        );
        assert_eq!(edited.passed.len(), 1);
        assert_eq!(edited.dropped, vec![("unbatch".to_owned(), 1)]);
        for (form, element) in [("bodies", "0"), ("envelopes", r#"{"body":0}"#)] {
            let huge = format!(
                "[{}{element}]",
                format!("{element},").repeat(UNBATCH_ELEMENTS_MAX)
            );
            let edited = run(
                &step("unbatch", json!({"form": form})),
                items(vec![keyed(&huge, None)]),
            );
            assert!(
                edited.rejected[0]
                    .reason
                    .contains(&UNBATCH_ELEMENTS_MAX.to_string()),
                "{form}"
            );
        }
    }

    #[test]
    fn a_bad_envelope_refuses_the_whole_batch() {
        let unbatch = step("unbatch", json!({"form": "envelopes"}));
        let cases = [
            (
                r#"[{"body":1},{"properties":{}}]"#,
                "envelope 1: an envelope has one of body",
            ),
            (
                r#"[{"body":1,"properties":{"p":{"type":"int32","value":1e10}}}]"#,
                "envelope 0: property \"p\"",
            ),
            (
                r#"[{"body":1,"properties":{"p":[1]}}]"#,
                "envelope 0: property \"p\": an array",
            ),
            (r#"[{"body_base64":"!!"}]"#, "envelope 0: body_base64"),
            (
                r#"[{"body":1,"extra":2}]"#,
                "not an array of envelopes: unknown field `extra`",
            ),
            (r#"[{"body":1}"#, "not an array of envelopes"),
        ];
        for (body, wanted) in cases {
            let edited = run(&unbatch, items(vec![keyed(body, None)]));
            assert!(edited.passed.is_empty(), "{body}");
            assert!(
                edited.rejected[0].reason.starts_with(wanted),
                "{body}: {}",
                edited.rejected[0].reason
            );
        }
    }

    #[test]
    fn every_property_type_survives_its_json_form() {
        for (key, value) in every_property() {
            let json: Json =
                serde_json::from_str(&property_json(&value).to_string()).expect("JSON");
            assert_eq!(property_value(json).expect(&key), value, "{key}");
        }
        let nan = property_value(property_json(&PropertyValue::Float32(f32::NAN))).expect("NaN");
        assert!(matches!(nan, PropertyValue::Float32(f) if f.is_nan()));
    }

    #[test]
    fn bad_tables_are_refused() {
        let error = |kind: &str, keys: Json| compile(kind, keys).expect_err("refused").to_string();
        assert!(error("batch", json!({"max_events": 0})).starts_with("max_events: 0"));
        assert!(error("batch", json!({"max_events": 1001})).contains("1..=1000"));
        assert!(error("batch", json!({"max_bytes": 2_000_000})).starts_with("max_bytes: "));
        assert!(error("batch", json!({"form": "lines"})).contains("unknown variant"));
        assert!(error("unbatch", json!({"not_array": "drop"})).contains("unknown variant"));
    }

    proptest! {
        #[test]
        fn unbatch_never_panics_on_arbitrary_bodies(
            body in proptest::collection::vec(any::<u8>(), 0..256),
            text in r#"\[(\{"body(_base64)?":("[A-Za-z0-9+/=]*"|[0-9]|null),"properties":\{("p":("x"|1|\{"type":"(int32|uuid|float32|bytes)","value":("[a-f0-9-]*"|[0-9.e-]+)\}))?\}\},?){0,3}\]"#,
        ) {
            for form in ["bodies", "envelopes"] {
                for not_array in ["pass", "reject"] {
                    let unbatch = step("unbatch", json!({"form": form, "not_array": not_array}));
                    for bytes in [body.clone(), text.clone().into_bytes()] {
                        let edited = run(&unbatch, items(vec![EventData::new(bytes)]));
                        prop_assert!(edited.rejected.len() <= 1);
                    }
                }
            }
        }
    }
}
