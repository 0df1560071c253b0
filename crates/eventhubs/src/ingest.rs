//! Ingest: a producer's transfer bytes into [`EventData`]s — the server's half of what
//! [`send`](crate::send) writes.
//!
//! [`events_of`] takes one delivery's payload and message format: a plain message (format 0) is
//! one event; a batch ([`BATCH_MESSAGE_FORMAT`]) is an envelope whose `data` sections are whole
//! messages, one event each, routed by the envelope's partition key or else the first inner
//! one; another format is `amqp:not-implemented`. Its errors are [`Refusal`]s with the
//! condition the service sends (`amqp:decode-error` for bytes that are not a message of the
//! dialect, `com.microsoft:argument-error` for an envelope's partition key that is not a
//! string); a single message's error is a [`MessageError`].
//!
//! Each message goes straight into an [`EventData`], without building `fe2o3-amqp`'s generic
//! message first when it can: [`event_of`] gives what [`decode_strict`] and [`event_from_message`] give — the same event,
//! the same error — for every input, and `Envelope::fast` reads a batch's envelope as
//! `Envelope::decoded` reads the decoded one. Decoding into `Message<Body<Value>>` and
//! converting it was the ingest hot spot; the fast path reads the bytes once, borrowing, and
//! allocates only what the event keeps.
//!
//! # Fast path
//! A message is walked section by section with the strict
//! [`tributary_amqp_codec::value::Reader`]. It takes the shape the Azure SDKs and our client
//! send:
//! - an optional `header`, each field null or of its type: kept, encoded by
//!   `kept_header` exactly as the general path keeps it (the Python SDK and our client send
//!   `durable` with every keyed message);
//! - optional `delivery-annotations` with symbol keys and primitive values, holding only the
//!   runtime-metric annotations the broker sets (dropped, as the general path drops them; a
//!   sender's own are kept by the general path);
//! - optional `message-annotations` with symbol keys and primitive values, holding only
//!   `x-opt-partition-key` (when the send routes by key; a string, symbol or null) and the
//!   system annotations the broker sets (dropped);
//! - optional `properties` with message-id and correlation-id strings and a content-type
//!   symbol, every other field null;
//! - optional `application-properties`: string keys, each key once, values of the types that
//!   become a [`PropertyValue`] without being kept (null, boolean, int, long, uint, ulong, float,
//!   double, string, binary, timestamp, uuid);
//! - at most one `data` section; then the end of the bytes.
//!
//! Section descriptors are numeric (in any `ulong` encoding); every length, count and value is
//! checked. A batch's envelope (`Envelope::fast`) is an optional `header`, optional
//! `delivery-annotations` (any: the envelope is not stored), optional `message-annotations` holding only the partition key, then
//! one or more `data` sections and the end.
//!
//! # Fallback
//! Anything else — other annotations, non-string ids or other properties, symbols or other
//! types in the application properties, a repeated key, another body, a footer, symbolic
//! descriptors, a partition key the general path refuses, sections out of order, bytes that are
//! not well-formed — goes to the general path, which decides and words every error. The fast
//! path never errs: it returns only what the general path would return, or nothing. It never
//! panics and reserves memory only in proportion to the bytes it has, whatever they hold.
//!
//! The general path ([`decode_strict`], [`event_from_message`]) checks a message's structure
//! first with [`scan`](crate::scan) — which also takes the delivery annotations pyamqp writes
//! last and puts them in their place — and every value with
//! [`check_well_formed`](tributary_amqp_codec::value::check_well_formed), then decodes it with
//! `serde_amqp`. The scan stays a module of its own rather than a step of the fast path: the
//! fast path already checks everything it reads in its one pass, and a structural pass before
//! it would walk every message twice.

use std::sync::LazyLock;

use bytes::Bytes;
use fe2o3_amqp_types::messaging::{Body, Header};
use tributary_amqp_codec::message::section_code::{
    APPLICATION_PROPERTIES, DATA, DELIVERY_ANNOTATIONS, HEADER, MESSAGE_ANNOTATIONS, PROPERTIES,
    PROPERTIES_FIELDS,
};
use tributary_amqp_codec::value::{Primitive, Reader};
use tributary_event::{EventData, PropertyValue, SmolStr, repeats_a_property_key};

pub(crate) mod general;

use self::general::{RUNTIME_ANNOTATIONS, SYSTEM_ANNOTATIONS, kept_header, partition_key};
pub use self::general::{decode_strict, event_from_message, has_structured_body};
use crate::condition::{self as conditions, Refusal};
use crate::limits::BATCH_EVENTS_MAX;
use crate::message::{AmqpMessage, MessageError};
use crate::names::BATCH_MESSAGE_FORMAT;
use crate::names::annotation::PARTITION_KEY;
use crate::walk::{Fallback, header, map_entries, next_section};

/// `properties` fields the fast path maps: message-id, correlation-id, content-type.
const MESSAGE_ID: u32 = 0;
const CORRELATION_ID: u32 = 5;
const CONTENT_TYPE: u32 = 6;

/// The events of one delivery's payload and the partition key to route them by: a plain message
/// is one event; a batch (format `0x80013700`) is one event per data section, each decoded
/// strictly, routed by the envelope's key or else the first inner key. Messages and envelopes in
/// the common shapes take the fast path (see the module docs), with the same outcome.
pub fn events_of(
    payload: &[u8],
    format: u32,
    route_by_key: bool,
) -> Result<(Option<String>, Vec<EventData>), Refusal> {
    let decode = |e: String| Refusal::new(conditions::DECODE_ERROR, e);
    match format {
        0 => {
            let event = event_of(payload, route_by_key).map_err(|e| decode(e.to_string()))?;
            Ok((event.partition_key.clone(), vec![event]))
        }
        BATCH_MESSAGE_FORMAT => {
            // The envelope decoded by the general path, when it must be, for `envelope` to
            // borrow its messages from.
            let decoded;
            let envelope = match Envelope::fast(payload, route_by_key) {
                Some(envelope) => envelope,
                None => {
                    decoded = decode_strict(payload).map_err(|e| decode(e.to_string()))?;
                    Envelope::decoded(&decoded, route_by_key)?
                }
            };
            let count = envelope.messages.len();
            if count == 0 || count > BATCH_EVENTS_MAX {
                return Err(decode(format!(
                    "a batch holds 1 to {BATCH_EVENTS_MAX} messages, not {count}"
                )));
            }
            let mut events: Vec<EventData> = Vec::with_capacity(count);
            for (index, message) in envelope.messages.iter().enumerate() {
                let earlier = events.last().map_or(&[][..], |e| &e.properties[..]);
                let event = event_after(message, route_by_key, earlier)
                    .map_err(|e| decode(format!("batched message {index}: {e}")))?;
                events.push(event);
            }
            let key = envelope
                .key
                .or_else(|| events.iter().find_map(|e| e.partition_key.clone()));
            Ok((key, events))
        }
        other => {
            // A malformed message is a decode error whatever its format, as it always was.
            decode_strict(payload).map_err(|e| decode(e.to_string()))?;
            Err(Refusal::new(
                conditions::NOT_IMPLEMENTED,
                format!("message format {other:#x} is not supported"),
            ))
        }
    }
}

/// One message's event: the fast path's when it applies, else the general path's
/// ([`decode_strict`], then [`event_from_message`]), errors included.
pub fn event_of(bytes: &[u8], route_by_key: bool) -> Result<EventData, MessageError> {
    event_after(bytes, route_by_key, &[])
}

/// [`event_of`] for a message of a batch, given the application properties of the event
/// before it: the same event, but a key or string value equal to the one at the same place
/// there is that event's copy (see [`application_properties`]).
fn event_after(
    bytes: &[u8],
    route_by_key: bool,
    earlier: &[(SmolStr, PropertyValue)],
) -> Result<EventData, MessageError> {
    match fast(bytes, route_by_key, earlier) {
        Ok(event) => Ok(event),
        Err(Fallback) => event_from_message(decode_strict(bytes)?, route_by_key),
    }
}

/// The event the general path makes of `bytes`, if the message has the fast path's shape (see
/// the module docs); `None` otherwise, and then nothing is decided.
#[cfg(test)]
fn fast_event(bytes: &[u8], route_by_key: bool) -> Option<EventData> {
    fast(bytes, route_by_key, &[]).ok()
}

/// The fast path (see the module docs); `earlier` as for [`application_properties`].
fn fast(
    bytes: &[u8],
    route_by_key: bool,
    earlier: &[(SmolStr, PropertyValue)],
) -> Result<EventData, Fallback> {
    let mut reader = Reader::new(bytes);
    let mut event = EventData::default();
    let mut partition = None;
    let kept_delivery_annotation = |name: &str, _| {
        // A sender's own delivery annotations are kept by the general path.
        if RUNTIME_ANNOTATIONS.contains(&name) {
            Ok(())
        } else {
            Err(Fallback)
        }
    };
    let (header, mut section) = leading(&mut reader, kept_delivery_annotation, |name, value| {
        if name == PARTITION_KEY && route_by_key {
            partition = Some(value);
            Ok(())
        } else if SYSTEM_ANNOTATIONS.contains(&name) {
            Ok(())
        } else {
            // Kept by the general path (as is the partition key of a send to a partition).
            Err(Fallback)
        }
    })?;
    event.partition_key = key_text(partition)?;
    if section == Some(PROPERTIES) {
        properties(&mut reader, &mut event)?;
        section = next_section(&mut reader)?;
    }
    if section == Some(APPLICATION_PROPERTIES) {
        event.properties = application_properties(&mut reader, earlier)?;
        section = next_section(&mut reader)?;
    }
    if section == Some(DATA) {
        event.body = Bytes::copy_from_slice(reader.binary()?);
        section = next_section(&mut reader)?;
    }
    // A second data section, another body, a footer, or a section out of order.
    if section.is_some() {
        return Err(Fallback);
    }
    if let Some(header) = header {
        event.protocol_sections = keep(header)?;
    }
    Ok(event)
}

/// What the general path keeps of a message whose only kept section is `header`. The durable
/// header, which the Python SDK and our client send with every keyed message, is encoded once:
/// encoding it with `serde_amqp` took more time than the rest of the fast path.
fn keep(header: Header) -> Result<Option<Bytes>, Fallback> {
    static DURABLE: LazyLock<Option<Vec<u8>>> =
        LazyLock::new(|| kept_header(durable()).ok().flatten().map(Vec::from));
    if header == durable()
        && let Some(kept) = DURABLE.as_deref()
    {
        return Ok(Some(Bytes::from_static(kept)));
    }
    kept_header(header).map_err(|_| Fallback)
}

/// A header that says `durable` and nothing else.
fn durable() -> Header {
    Header {
        durable: true,
        ..Header::default()
    }
}

/// A batch's envelope (message format `0x80013700`): the partition key to route its events by,
/// if any, and its messages, still encoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Envelope<'a> {
    /// The envelope's `x-opt-partition-key`, when the send routes by key.
    pub(crate) key: Option<String>,
    /// Each `data` section's contents: one encoded message.
    pub(crate) messages: Vec<&'a [u8]>,
}

impl<'a> Envelope<'a> {
    /// The envelope the general path reads from `bytes`, if it has the fast path's shape (see
    /// the module docs); `None` otherwise, and then nothing is decided.
    pub(crate) fn fast(bytes: &'a [u8], route_by_key: bool) -> Option<Self> {
        Self::read(bytes, route_by_key).ok()
    }

    fn read(bytes: &'a [u8], route_by_key: bool) -> Result<Self, Fallback> {
        let mut reader = Reader::new(bytes);
        let mut partition = None;
        // The header and other annotations of an envelope are not kept; only the key is read.
        let (_, mut section) = leading(
            &mut reader,
            |_, _| Ok(()),
            |name, value| {
                if name == PARTITION_KEY {
                    partition = Some(value);
                    Ok(())
                } else {
                    Err(Fallback)
                }
            },
        )?;
        let key = if route_by_key {
            key_text(partition)?
        } else {
            None
        };
        let mut messages = Vec::new();
        while section == Some(DATA) {
            messages.push(reader.binary()?);
            section = next_section(&mut reader)?;
        }
        // No body (which the general path refuses in its words), or more after it.
        if messages.is_empty() || section.is_some() {
            return Err(Fallback);
        }
        Ok(Envelope { key, messages })
    }

    /// The envelope of a batch decoded by the general path: its partition key (a key that is
    /// not a string is an `argument-error`) and its `data` sections (another body is a
    /// `decode-error`).
    pub(crate) fn decoded(message: &'a AmqpMessage, route_by_key: bool) -> Result<Self, Refusal> {
        let key = if route_by_key {
            partition_key(message)
                .map_err(|e| Refusal::new(conditions::ARGUMENT_ERROR, e.to_string()))?
        } else {
            None
        };
        let Body::Data(sections) = &message.body else {
            return Err(Refusal::new(
                conditions::DECODE_ERROR,
                "a batch's body must be data sections",
            ));
        };
        Ok(Envelope {
            key,
            messages: sections.iter().map(|data| &data.0[..]).collect(),
        })
    }
}

/// The sections before `properties`: an optional header (returned), optional delivery
/// annotations, each of whose entries goes to `delivery_annotation` (and is dropped), and
/// optional message annotations, each of whose entries goes to `annotation`. Returns the header
/// and the next section's code.
fn leading<'a>(
    reader: &mut Reader<'a>,
    delivery_annotation: impl FnMut(&'a str, Primitive<'a>) -> Result<(), Fallback>,
    annotation: impl FnMut(&'a str, Primitive<'a>) -> Result<(), Fallback>,
) -> Result<(Option<Header>, Option<u64>), Fallback> {
    // The general path refuses an empty message, in its words.
    if reader.is_at_end() {
        return Err(Fallback);
    }
    let mut section = next_section(reader)?;
    let mut kept = None;
    if section == Some(HEADER) {
        kept = Some(header(reader)?);
        section = next_section(reader)?;
    }
    if section == Some(DELIVERY_ANNOTATIONS) {
        annotations(reader, delivery_annotation)?;
        section = next_section(reader)?;
    }
    if section == Some(MESSAGE_ANNOTATIONS) {
        annotations(reader, annotation)?;
        section = next_section(reader)?;
    }
    Ok((kept, section))
}

/// An annotations map: symbol keys, primitive values, each entry given to `entry` in order.
fn annotations<'a>(
    reader: &mut Reader<'a>,
    mut entry: impl FnMut(&'a str, Primitive<'a>) -> Result<(), Fallback>,
) -> Result<(), Fallback> {
    let (entries, end) = map_entries(reader)?;
    for _ in 0..entries {
        let key = reader.symbol()?;
        entry(key, reader.primitive()?)?;
    }
    reader.expect_at(end, "annotations overrun the map")?;
    Ok(())
}

/// The partition key as [`event_from_message`] and [`partition_key`] take it: the annotation's
/// last value (a map keeps one value per key), a string or symbol, or null for none. Another
/// type falls back, for the general path to refuse.
fn key_text(value: Option<Primitive<'_>>) -> Result<Option<String>, Fallback> {
    match value {
        None | Some(Primitive::Null) => Ok(None),
        Some(Primitive::String(key) | Primitive::Symbol(key)) => Ok(Some(key.to_owned())),
        Some(_) => Err(Fallback),
    }
}

/// The `properties` list: message-id and correlation-id strings and a content-type symbol go to
/// `event`; any other field set falls back (the general path keeps it).
fn properties(reader: &mut Reader<'_>, event: &mut EventData) -> Result<(), Fallback> {
    let (count, end) = reader.list_header()?;
    if count > PROPERTIES_FIELDS {
        return Err(Fallback);
    }
    for field in 0..count {
        if reader.null()? {
            continue;
        }
        match field {
            MESSAGE_ID => event.message_id = Some(reader.string()?.to_owned()),
            CORRELATION_ID => event.correlation_id = Some(reader.string()?.to_owned()),
            CONTENT_TYPE => event.content_type = Some(reader.symbol()?.to_owned()),
            _ => return Err(Fallback),
        }
    }
    reader.expect_at(end, "properties overrun the list")?;
    Ok(())
}

/// The application properties: string keys, values mapped as `property_from_amqp` maps them
/// when it keeps nothing. A repeated key falls back: the general path's map merges it.
///
/// `earlier` is the previous event's of a batch (or nothing). A key, or a string value, whose
/// bytes are those of the one at the same place in `earlier` is taken as a copy of that one,
/// without checking and copying the text again: a replication task stamps every event with
/// the same names and mostly the same values, several of them too long to be stored inline,
/// and checking UTF-8 and allocating them was most of what the hub spent on a stamped event.
/// When every key is `earlier`'s, in its order, no key repeats: `earlier`'s did not.
fn application_properties(
    reader: &mut Reader<'_>,
    earlier: &[(SmolStr, PropertyValue)],
) -> Result<Vec<(SmolStr, PropertyValue)>, Fallback> {
    let (entries, end) = map_entries(reader)?;
    // An entry takes at least three bytes, so the input bounds what is reserved.
    let room = end.saturating_sub(reader.position()) / 3;
    let mut properties = Vec::with_capacity((entries as usize).min(room));
    let mut keys_as_earlier = entries as usize == earlier.len();
    for index in 0..entries as usize {
        let known = earlier.get(index);
        let key = match known {
            Some((key, _)) if reader.take_string_equal_to(key) => key.clone(),
            _ => {
                keys_as_earlier = false;
                SmolStr::new(reader.string()?)
            }
        };
        let value = match known {
            Some((_, PropertyValue::String(text))) if reader.take_string_equal_to(text) => {
                PropertyValue::String(text.clone())
            }
            _ => property(reader.primitive()?)?,
        };
        properties.push((key, value));
    }
    reader.expect_at(end, "application properties overrun the map")?;
    if keys_as_earlier {
        debug_assert!(
            !repeats_a_property_key(&properties),
            "an earlier event repeated a key"
        );
    } else if repeats_a_property_key(&properties) {
        return Err(Fallback);
    }
    Ok(properties)
}

/// An application property's value, for the types `property_from_amqp` maps without keeping
/// the AMQP value too; the others (symbols, the narrow integers, chars, decimals) fall back.
fn property(value: Primitive<'_>) -> Result<PropertyValue, Fallback> {
    Ok(match value {
        Primitive::Null => PropertyValue::Null,
        Primitive::Bool(v) => PropertyValue::Bool(v),
        Primitive::Int(v) => PropertyValue::Int32(v),
        Primitive::Long(v) => PropertyValue::Int64(v),
        Primitive::Uint(v) => PropertyValue::UInt32(v),
        Primitive::Ulong(v) => PropertyValue::UInt64(v),
        Primitive::Float(v) => PropertyValue::Float32(v),
        Primitive::Double(v) => PropertyValue::Float64(v),
        Primitive::String(v) => PropertyValue::String(SmolStr::new(v)),
        Primitive::Binary(v) => PropertyValue::Bytes(Bytes::copy_from_slice(v)),
        Primitive::Timestamp(v) => PropertyValue::Timestamp(v),
        Primitive::Uuid(v) => PropertyValue::Uuid(v),
        _ => return Err(Fallback),
    })
}

#[cfg(test)]
mod tests {
    use std::fmt::Debug;
    use std::panic::{AssertUnwindSafe, catch_unwind};

    use fe2o3_amqp_types::messaging::annotations::OwnedKey;
    use fe2o3_amqp_types::messaging::{
        ApplicationProperties, Data, MessageAnnotations, MessageId, Properties,
    };
    use fe2o3_amqp_types::primitives::{
        Binary, Dec32, OrderedMap, SimpleValue, Symbol, Timestamp, Uuid, Value,
    };
    use proptest::collection::vec;
    use proptest::option;
    use proptest::prelude::*;
    use proptest::sample::Index;
    use tributary_amqp_codec::message::{ListSection, MapSection, section, write_data_section};

    use super::*;
    use crate::message::empty_message;
    use crate::names::BATCH_MESSAGE_FORMAT as BATCH_FORMAT;
    use tributary_amqp_codec::testing::{damage, text};

    /// A delivery's outcome: the partition key and events, or the refusal.
    type Events = Result<(Option<String>, Vec<EventData>), Refusal>;

    /// The general path alone: what [`event_of`] must equal, and the fast path when it answers.
    fn general(bytes: &[u8], route_by_key: bool) -> Result<EventData, MessageError> {
        event_from_message(decode_strict(bytes)?, route_by_key)
    }

    /// `append`'s decoding and `events_of` as they were before the fast path, verbatim: what the
    /// new `events_of` must equal for every delivery.
    fn reference_events_of(payload: &[u8], format: u32, route_by_key: bool) -> Events {
        let decode = |e: String| Refusal::new(conditions::DECODE_ERROR, e);
        let message = decode_strict(payload).map_err(|e| decode(e.to_string()))?;
        match format {
            0 => {
                let event =
                    event_from_message(message, route_by_key).map_err(|e| decode(e.to_string()))?;
                Ok((event.partition_key.clone(), vec![event]))
            }
            BATCH_FORMAT => {
                let envelope_key = if route_by_key {
                    partition_key(&message)
                        .map_err(|e| Refusal::new(conditions::ARGUMENT_ERROR, e.to_string()))?
                } else {
                    None
                };
                let Body::Data(sections) = message.body else {
                    return Err(decode("a batch's body must be data sections".into()));
                };
                let sections: Vec<_> = sections.into();
                if sections.is_empty() || sections.len() > BATCH_EVENTS_MAX {
                    return Err(decode(format!(
                        "a batch holds 1 to {BATCH_EVENTS_MAX} messages, not {}",
                        sections.len()
                    )));
                }
                let mut events = Vec::with_capacity(sections.len());
                for (index, data) in sections.iter().enumerate() {
                    let inner = decode_strict(&data.0)
                        .map_err(|e| decode(format!("batched message {index}: {e}")))?;
                    let event = event_from_message(inner, route_by_key)
                        .map_err(|e| decode(format!("batched message {index}: {e}")))?;
                    events.push(event);
                }
                let key =
                    envelope_key.or_else(|| events.iter().find_map(|e| e.partition_key.clone()));
                Ok((key, events))
            }
            other => Err(Refusal::new(
                conditions::NOT_IMPLEMENTED,
                format!("message format {other:#x} is not supported"),
            )),
        }
    }

    /// Equal, or equal through `Debug` (which lets a NaN property equal itself).
    fn same<T: PartialEq + Debug>(ours: &T, theirs: &T) -> bool {
        ours == theirs || format!("{ours:?}") == format!("{theirs:?}")
    }

    /// `f`'s result. Nothing may panic on any bytes: `decode_strict` checks every value before
    /// `serde_amqp` reads it (unchecked, an odd map count underflowed in debug builds, and a
    /// misframed array could overflow the stack).
    fn outcome<T>(f: impl FnOnce() -> T) -> Option<T> {
        let result = catch_unwind(AssertUnwindSafe(f));
        assert!(result.is_ok(), "decoding panicked");
        result.ok()
    }

    #[test]
    fn ingest_hostile_values_are_decode_errors_not_crashes() {
        // An annotation holding a list whose empty array's stray constructor (list32) has
        // `serde_amqp` read the binary after it as thousands of nested lists.
        let mut content = vec![0, 0, 1];
        while content.len() < 40 * 256 - 3 {
            content.extend_from_slice(&[0xc0, 0x01, 0x01]);
        }
        content.resize(40 * 256, 0x40);
        let mut list_items = vec![0xe0, 2, 0, 0xd0, 0xb0];
        list_items.extend_from_slice(&u32::try_from(content.len()).unwrap().to_be_bytes());
        list_items.extend_from_slice(&content);
        let mut bomb = vec![0xd0];
        bomb.extend_from_slice(&u32::try_from(list_items.len() + 4).unwrap().to_be_bytes());
        bomb.extend_from_slice(&2u32.to_be_bytes());
        bomb.extend_from_slice(&list_items);
        // Lists nested far deeper than the checked depth.
        let mut deep = vec![0x40];
        for _ in 0..5_000 {
            let mut outer = vec![0xd0];
            outer.extend_from_slice(&u32::try_from(deep.len() + 4).unwrap().to_be_bytes());
            outer.extend_from_slice(&1u32.to_be_bytes());
            outer.extend(deep);
            deep = outer;
        }
        for value in [bomb, deep] {
            let mut message = Vec::new();
            let mut annotations = MapSection::start(&mut message, section::MESSAGE_ANNOTATIONS);
            annotations.entry("x-hostile", true, |v| v.encoded(&value));
            annotations.finish();
            write_data_section(&mut message, b"body");
            let error = event_of(&message, true).unwrap_err().to_string();
            assert!(
                error.contains("empty array") || error.contains("nested too deeply"),
                "{error}"
            );
            let refused = events_of(&message, 0, true).unwrap_err();
            assert_eq!(refused.condition, conditions::DECODE_ERROR);
        }
    }

    // ---- Messages, described section by section and encoded by hand from `serde_amqp`'s
    // encoding of each value, so that sections, keys and fields can also be repeated,
    // misordered, mistyped and written in their wide forms.

    #[derive(Debug, Clone)]
    enum Section {
        Header(Vec<Value>),
        DeliveryAnnotations(Vec<(Value, Value)>),
        MessageAnnotations(Vec<(Value, Value)>),
        Properties(Vec<Value>),
        ApplicationProperties(Vec<(Value, Value)>),
        Data(Vec<u8>),
        AmqpSequence(Vec<Value>),
        AmqpValue(Value),
        Footer(Vec<(Value, Value)>),
    }

    impl Section {
        /// The section's descriptor code and symbolic name.
        fn descriptor(&self) -> (u8, &'static str) {
            match self {
                Section::Header(_) => (0x70, "amqp:header:list"),
                Section::DeliveryAnnotations(_) => (0x71, "amqp:delivery-annotations:map"),
                Section::MessageAnnotations(_) => (0x72, "amqp:message-annotations:map"),
                Section::Properties(_) => (0x73, "amqp:properties:list"),
                Section::ApplicationProperties(_) => (0x74, "amqp:application-properties:map"),
                Section::Data(_) => (0x75, "amqp:data:binary"),
                Section::AmqpSequence(_) => (0x76, "amqp:amqp-sequence:list"),
                Section::AmqpValue(_) => (0x77, "amqp:amqp-value:*"),
                Section::Footer(_) => (0x78, "amqp:footer:map"),
            }
        }
    }

    /// How a message is written.
    #[derive(Debug, Clone, Copy)]
    struct Form {
        /// Values, lists and maps in their widest encodings (`str32`, `uint` for 0, `list32`,
        /// `boolean` as a byte, ...) instead of `serde_amqp`'s shortest ones.
        wide: bool,
        /// Section descriptors as eight-byte `ulong`s.
        long_descriptors: bool,
        /// Section descriptors as symbols (which the fast path leaves to the general path).
        symbolic: bool,
    }

    #[derive(Debug, Clone)]
    struct Message {
        sections: Vec<Section>,
        form: Form,
    }

    impl Message {
        fn encode(&self) -> Vec<u8> {
            let mut out = Vec::new();
            for section in &self.sections {
                encode_section(section, self.form, &mut out);
            }
            out
        }
    }

    fn encode_section(section: &Section, form: Form, out: &mut Vec<u8>) {
        let (code, name) = section.descriptor();
        if form.symbolic {
            out.extend_from_slice(&[0x00, 0xa3, u8::try_from(name.len()).unwrap()]);
            out.extend_from_slice(name.as_bytes());
        } else if form.long_descriptors {
            out.extend_from_slice(&[0x00, 0x80, 0, 0, 0, 0, 0, 0, 0, code]);
        } else {
            out.extend_from_slice(&[0x00, 0x53, code]);
        }
        let value = |v: &Value| encode_value(v, form.wide);
        let list = |items: &[Value]| {
            let elements: Vec<u8> = items.iter().flat_map(value).collect();
            framed(0xc0, items.len(), &elements, form.wide)
        };
        let map = |entries: &[(Value, Value)]| {
            let elements: Vec<u8> = entries
                .iter()
                .flat_map(|(k, v)| value(k).into_iter().chain(value(v)))
                .collect();
            framed(0xc1, entries.len() * 2, &elements, form.wide)
        };
        out.extend(match section {
            Section::Header(fields) | Section::Properties(fields) => list(fields),
            Section::AmqpSequence(items) => list(items),
            Section::DeliveryAnnotations(entries)
            | Section::MessageAnnotations(entries)
            | Section::ApplicationProperties(entries)
            | Section::Footer(entries) => map(entries),
            Section::Data(bytes) => value(&Value::Binary(Binary::from(bytes.clone()))),
            Section::AmqpValue(v) => value(v),
        });
    }

    /// `serde_amqp`'s encoding of `value`, or with `wide` its widest form.
    fn encode_value(value: &Value, wide: bool) -> Vec<u8> {
        let bytes = serde_amqp::to_vec(value).unwrap();
        if !wide {
            return bytes;
        }
        let (code, rest) = (bytes[0], &bytes[1..]);
        let mut out = Vec::new();
        match code {
            0x41 => out.extend_from_slice(&[0x56, 1]),
            0x42 => out.extend_from_slice(&[0x56, 0]),
            0x43 | 0x52 => {
                out.push(0x70);
                out.extend_from_slice(&u32::from(rest.first().copied().unwrap_or(0)).to_be_bytes());
            }
            0x44 | 0x53 => {
                out.push(0x80);
                out.extend_from_slice(&u64::from(rest.first().copied().unwrap_or(0)).to_be_bytes());
            }
            0x54 => {
                out.push(0x71);
                out.extend_from_slice(&i32::from(i8::from_be_bytes([rest[0]])).to_be_bytes());
            }
            0x55 => {
                out.push(0x81);
                out.extend_from_slice(&i64::from(i8::from_be_bytes([rest[0]])).to_be_bytes());
            }
            0xa0 | 0xa1 | 0xa3 => {
                out.push(code + 0x10);
                out.extend_from_slice(&u32::from(rest[0]).to_be_bytes());
                out.extend_from_slice(&rest[1..]);
            }
            _ => return bytes,
        }
        out
    }

    /// Frames encoded `elements` as a list (`0xc0`) or map (`0xc1`) of `count` elements: the
    /// short form when it fits and `wide` is not asked, an empty list as `list0`.
    fn framed(constructor8: u8, count: usize, elements: &[u8], wide: bool) -> Vec<u8> {
        let mut out = Vec::new();
        if constructor8 == 0xc0 && count == 0 && !wide {
            return vec![0x45];
        }
        match (u8::try_from(elements.len() + 1), u8::try_from(count)) {
            (Ok(size), Ok(count)) if !wide => out.extend_from_slice(&[constructor8, size, count]),
            _ => {
                out.push(constructor8 + 0x10);
                out.extend_from_slice(&u32::try_from(elements.len() + 4).unwrap().to_be_bytes());
                out.extend_from_slice(&u32::try_from(count).unwrap().to_be_bytes());
            }
        }
        out.extend_from_slice(elements);
        out
    }

    // ---- Which messages the fast path must take: computed from the description, the module
    // docs' list in code.

    fn is_primitive(value: &Value) -> bool {
        !matches!(
            value,
            Value::List(_) | Value::Map(_) | Value::Array(_) | Value::Described(_)
        )
    }

    /// The application-property types `property_from_amqp` maps without keeping.
    fn is_mapped(value: &Value) -> bool {
        matches!(
            value,
            Value::Null
                | Value::Bool(_)
                | Value::Int(_)
                | Value::Long(_)
                | Value::Uint(_)
                | Value::Ulong(_)
                | Value::Float(_)
                | Value::Double(_)
                | Value::String(_)
                | Value::Binary(_)
                | Value::Timestamp(_)
                | Value::Uuid(_)
        )
    }

    fn is_symbol(value: &Value, name: &str) -> bool {
        matches!(value, Value::Symbol(s) if s.as_str() == name)
    }

    fn usual_key(value: Option<&Value>) -> bool {
        matches!(
            value,
            None | Some(Value::String(_) | Value::Symbol(_) | Value::Null)
        )
    }

    /// The last value of the partition key among `entries`: the one a map keeps.
    fn last_key(entries: &[(Value, Value)]) -> Option<&Value> {
        entries
            .iter()
            .rev()
            .find(|(k, _)| is_symbol(k, PARTITION_KEY))
            .map(|(_, v)| v)
    }

    fn usual_header(fields: &[Value]) -> bool {
        fields.len() <= 5
            && fields.iter().enumerate().all(|(at, v)| {
                matches!(
                    (at, v),
                    (_, Value::Null)
                        | (0 | 3, Value::Bool(_))
                        | (1, Value::Ubyte(_))
                        | (2 | 4, Value::Uint(_))
                )
            })
    }

    fn usual_annotations(entries: &[(Value, Value)]) -> bool {
        entries
            .iter()
            .all(|(k, v)| matches!(k, Value::Symbol(_)) && is_primitive(v))
    }

    /// The leading sections (header, delivery and message annotations) both shapes share, each
    /// delivery annotation accepted by `delivery_annotation` and each message annotation by
    /// `annotation`; returns the rest.
    fn usual_leading(
        mut sections: &[Section],
        delivery_annotation: impl Fn(&Value) -> bool,
        annotation: impl Fn(&Value) -> bool,
        route_by_key: bool,
    ) -> Option<&[Section]> {
        if let [Section::Header(fields), rest @ ..] = sections {
            usual_header(fields).then_some(())?;
            sections = rest;
        }
        if let [Section::DeliveryAnnotations(entries), rest @ ..] = sections {
            let keys = entries.iter().all(|(k, _)| delivery_annotation(k));
            (usual_annotations(entries) && keys).then_some(())?;
            sections = rest;
        }
        if let [Section::MessageAnnotations(entries), rest @ ..] = sections {
            let keys = entries.iter().all(|(k, _)| annotation(k));
            let key = !route_by_key || usual_key(last_key(entries));
            (usual_annotations(entries) && keys && key).then_some(())?;
            sections = rest;
        }
        Some(sections)
    }

    /// Whether the fast path must take `message` (see the module docs).
    fn takes_fast_path(message: &Message, route_by_key: bool) -> bool {
        let annotation = |k: &Value| {
            (route_by_key && is_symbol(k, PARTITION_KEY))
                || SYSTEM_ANNOTATIONS.iter().any(|name| is_symbol(k, name))
        };
        if message.form.symbolic || message.sections.is_empty() {
            return false;
        }
        let runtime = |k: &Value| RUNTIME_ANNOTATIONS.iter().any(|name| is_symbol(k, name));
        let Some(mut rest) = usual_leading(&message.sections, runtime, annotation, route_by_key)
        else {
            return false;
        };
        if let [Section::Properties(fields), tail @ ..] = rest {
            let usual = fields.len() <= 13
                && fields.iter().enumerate().all(|(at, v)| {
                    matches!(
                        (at, v),
                        (_, Value::Null) | (0 | 5, Value::String(_)) | (6, Value::Symbol(_))
                    )
                });
            if !usual {
                return false;
            }
            rest = tail;
        }
        if let [Section::ApplicationProperties(entries), tail @ ..] = rest {
            let keys: Vec<_> = entries.iter().map(|(k, _)| k).collect();
            let usual = entries
                .iter()
                .all(|(k, v)| matches!(k, Value::String(_)) && is_mapped(v))
                && keys
                    .iter()
                    .enumerate()
                    .all(|(at, k)| !keys[..at].contains(k));
            if !usual {
                return false;
            }
            rest = tail;
        }
        matches!(rest, [] | [Section::Data(_)])
    }

    /// Whether `Envelope::fast` must take the envelope `message` (see the module docs).
    fn takes_fast_envelope(message: &Message, route_by_key: bool) -> bool {
        if message.form.symbolic {
            return false;
        }
        let annotation = |k: &Value| is_symbol(k, PARTITION_KEY);
        match usual_leading(&message.sections, |_| true, annotation, route_by_key) {
            Some(rest) => !rest.is_empty() && rest.iter().all(|s| matches!(s, Section::Data(_))),
            None => false,
        }
    }

    // ---- Strategies.

    fn symbol(text: String) -> Value {
        Value::Symbol(Symbol::from(text))
    }

    /// A value of a type `property_from_amqp` maps without keeping.
    fn mapped() -> BoxedStrategy<Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(Value::Int),
            any::<i64>().prop_map(Value::Long),
            any::<u32>().prop_map(Value::Uint),
            any::<u64>().prop_map(Value::Ulong),
            any::<f32>().prop_map(|v| Value::Float(v.into())),
            any::<f64>().prop_map(|v| Value::Double(v.into())),
            text().prop_map(Value::String),
            vec(any::<u8>(), 0..300).prop_map(|v| Value::Binary(Binary::from(v))),
            any::<i64>().prop_map(|v| Value::Timestamp(Timestamp::from_milliseconds(v))),
            any::<[u8; 16]>().prop_map(|v| Value::Uuid(Uuid::from(v))),
        ]
        .boxed()
    }

    /// A primitive value of a type `property_from_amqp` keeps.
    fn kept() -> BoxedStrategy<Value> {
        prop_oneof![
            text().prop_map(symbol),
            any::<u8>().prop_map(Value::Ubyte),
            any::<u16>().prop_map(Value::Ushort),
            any::<i8>().prop_map(Value::Byte),
            any::<i16>().prop_map(Value::Short),
            any::<char>().prop_map(Value::Char),
            any::<[u8; 4]>().prop_map(|v| Value::Decimal32(Dec32::from(v))),
        ]
        .boxed()
    }

    /// Any primitive value.
    fn primitive() -> BoxedStrategy<Value> {
        prop_oneof![3 => mapped(), 1 => kept()].boxed()
    }

    /// A value that is not a primitive.
    fn compound() -> BoxedStrategy<Value> {
        prop_oneof![
            vec(primitive(), 0..3).prop_map(Value::List),
            primitive().prop_map(|v| Value::Described(Box::new(
                serde_amqp::described::Described {
                    descriptor: serde_amqp::descriptor::Descriptor::Code(9),
                    value: v,
                }
            ))),
        ]
        .boxed()
    }

    /// An annotation value: mostly a primitive.
    fn annotation_value() -> BoxedStrategy<Value> {
        prop_oneof![12 => primitive(), 1 => compound()].boxed()
    }

    /// An annotation key: a symbol, or (the general path keeps or refuses them) a ulong or a
    /// string.
    fn annotation_key() -> BoxedStrategy<Value> {
        prop_oneof![
            8 => prop_oneof![
                Just(symbol("x-custom".into())),
                Just(symbol(PARTITION_KEY.into())),
                text().prop_map(symbol),
            ],
            1 => any::<u64>().prop_map(Value::Ulong),
            1 => Just(Value::String(PARTITION_KEY.into())),
        ]
        .boxed()
    }

    fn header() -> BoxedStrategy<Section> {
        let fields = (
            any::<bool>(),
            any::<u8>(),
            option::of(any::<u32>()),
            any::<bool>(),
            any::<u32>(),
            vec(any::<bool>(), 6),
            prop_oneof![8 => 0usize..=5, 1 => Just(6)],
        )
            .prop_map(|(durable, priority, ttl, first, count, nulls, len)| {
                // Six fields are one too many.
                let fields = [
                    Value::Bool(durable),
                    Value::Ubyte(priority),
                    ttl.map_or(Value::Null, Value::Uint),
                    Value::Bool(first),
                    Value::Uint(count),
                    Value::Null,
                ];
                fields
                    .into_iter()
                    .zip(nulls)
                    .map(|(v, null)| if null { Value::Null } else { v })
                    .take(len)
                    .collect()
            });
        prop_oneof![
            // What our client and the Python SDK send with a partition key.
            4 => Just(vec![Value::Bool(true)]),
            3 => fields,
            // Wrong types, or a field too many.
            1 => vec(primitive(), 0..7),
        ]
        .prop_map(Section::Header)
        .boxed()
    }

    fn annotations() -> BoxedStrategy<Vec<(Value, Value)>> {
        let key_value = prop_oneof![
            8 => text().prop_map(Value::String),
            2 => text().prop_map(symbol),
            2 => Just(Value::Null),
            1 => annotation_value(),
        ];
        let system = prop_oneof![
            Just(SYSTEM_ANNOTATIONS[0]),
            Just(SYSTEM_ANNOTATIONS[1]),
            Just(SYSTEM_ANNOTATIONS[2]),
        ];
        (
            option::weighted(0.8, key_value.clone()),
            option::weighted(0.1, key_value),
            vec((system, annotation_value()), 0..3),
            prop_oneof![6 => Just(vec![]), 1 => vec((annotation_key(), annotation_value()), 1..3)],
        )
            .prop_flat_map(|(key, again, system, extra)| {
                let mut entries: Vec<(Value, Value)> = Vec::new();
                for value in [key, again].into_iter().flatten() {
                    entries.push((symbol(PARTITION_KEY.into()), value));
                }
                for (name, value) in system {
                    entries.push((symbol(name.into()), value));
                }
                entries.extend(extra);
                Just(entries).prop_shuffle()
            })
            .boxed()
    }

    fn properties() -> BoxedStrategy<Section> {
        let id = prop_oneof![
            12 => text().prop_map(Value::String),
            1 => any::<u64>().prop_map(Value::Ulong),
            1 => any::<[u8; 16]>().prop_map(|v| Value::Uuid(Uuid::from(v))),
            1 => vec(any::<u8>(), 0..8).prop_map(|v| Value::Binary(Binary::from(v))),
        ];
        // Fields the general path keeps, each of its type.
        let other = prop_oneof![
            vec(any::<u8>(), 0..8).prop_map(|v| (1, Value::Binary(Binary::from(v)))),
            (
                prop_oneof![Just(2usize), Just(3), Just(4), Just(10), Just(12)],
                text()
            )
                .prop_map(|(at, v)| (at, Value::String(v))),
            text().prop_map(|v| (7, symbol(v))),
            (prop_oneof![Just(8usize), Just(9)], any::<i64>())
                .prop_map(|(at, v)| (at, Value::Timestamp(Timestamp::from_milliseconds(v)))),
            any::<u32>().prop_map(|v| (11, Value::Uint(v))),
        ];
        (
            option::of(id.clone()),
            option::of(id),
            option::of(
                prop_oneof![12 => text().prop_map(symbol), 1 => text().prop_map(Value::String)],
            ),
            prop_oneof![16 => Just(vec![]), 1 => vec(other, 1..3)],
            prop_oneof![8 => Just(0usize), 1 => Just(13), 1 => Just(14)],
        )
            .prop_map(|(message_id, correlation_id, content_type, others, len)| {
                let mut fields = vec![Value::Null; 14];
                fields[0] = message_id.unwrap_or(Value::Null);
                fields[5] = correlation_id.unwrap_or(Value::Null);
                fields[6] = content_type.unwrap_or(Value::Null);
                for (at, value) in others {
                    fields[at] = value;
                }
                // As `serde_amqp` writes it (up to the last field set), or all 13, or one too
                // many.
                let written = fields
                    .iter()
                    .rposition(|v| *v != Value::Null)
                    .map_or(0, |at| at + 1);
                fields.truncate(if len == 0 { written } else { len.max(written) });
                Section::Properties(fields)
            })
            .boxed()
    }

    fn application_properties() -> BoxedStrategy<Section> {
        application_entries()
            .prop_map(Section::ApplicationProperties)
            .boxed()
    }

    fn application_entries() -> BoxedStrategy<Vec<(Value, Value)>> {
        let key = prop_oneof![
            16 => text().prop_map(Value::String),
            // Repeated keys.
            2 => "[a-c]".prop_map(Value::String),
            1 => text().prop_map(symbol),
        ];
        let value = prop_oneof![24 => mapped(), 1 => kept(), 1 => compound()];
        vec((key, value), 0..6).boxed()
    }

    /// A batch's messages whose application properties repeat one another's entry by entry,
    /// a key or a value changed here and there, as a replication task's stamps do: what the
    /// decoder that takes the previous event's copies sees.
    fn repeating_messages() -> BoxedStrategy<Vec<Message>> {
        let change = (any::<Index>(), any::<bool>(), text());
        let changes = vec(vec(change, 0..3), 4);
        (vec(message(), 1..4), application_entries(), changes)
            .prop_map(|(mut messages, shared, changes)| {
                for (message, changes) in messages.iter_mut().zip(changes) {
                    let mut entries = shared.clone();
                    for (at, key, text) in changes {
                        if entries.is_empty() {
                            break;
                        }
                        let at = at.index(entries.len());
                        let entry = &mut entries[at];
                        if key {
                            entry.0 = Value::String(text);
                        } else {
                            entry.1 = Value::String(text);
                        }
                    }
                    let section = Section::ApplicationProperties(entries);
                    let sections = &mut message.sections;
                    if let Some(own) = sections
                        .iter_mut()
                        .find(|s| matches!(s, Section::ApplicationProperties(_)))
                    {
                        *own = section;
                    } else {
                        // Before the body, where application properties belong.
                        let at = sections
                            .iter()
                            .position(|s| {
                                matches!(
                                    s,
                                    Section::Data(_)
                                        | Section::AmqpSequence(_)
                                        | Section::AmqpValue(_)
                                        | Section::Footer(_)
                                )
                            })
                            .unwrap_or(sections.len());
                        sections.insert(at, section);
                    }
                }
                messages
            })
            .boxed()
    }

    fn body() -> BoxedStrategy<Vec<Section>> {
        let data = || vec(any::<u8>(), 0..300).prop_map(Section::Data);
        prop_oneof![
            2 => Just(vec![]),
            12 => data().prop_map(|d| vec![d]),
            1 => vec(data(), 2..4),
            1 => annotation_value().prop_map(|v| vec![Section::AmqpValue(v)]),
            1 => vec(vec(primitive(), 0..3).prop_map(Section::AmqpSequence), 1..3),
        ]
        .boxed()
    }

    fn form() -> BoxedStrategy<Form> {
        (
            proptest::bool::weighted(0.3),
            proptest::bool::weighted(0.2),
            proptest::bool::weighted(0.03),
        )
            .prop_map(|(wide, long_descriptors, symbolic)| Form {
                wide,
                long_descriptors,
                symbolic,
            })
            .boxed()
    }

    prop_compose! {
        /// A message in the shapes producers send, and near them: every section optional, their
        /// contents sometimes of the types or keys the fast path leaves to the general path,
        /// rarely a footer or two sections swapped.
        fn message()(
            header in option::weighted(0.5, header()),
            delivery in option::weighted(0.1, annotations().prop_map(Section::DeliveryAnnotations)),
            annotations in option::weighted(0.6, annotations().prop_map(Section::MessageAnnotations)),
            properties in option::weighted(0.4, properties()),
            application in option::weighted(0.5, application_properties()),
            body in body(),
            footer in option::weighted(0.05, annotations().prop_map(Section::Footer)),
            swap in option::weighted(0.05, (any::<Index>(), any::<Index>())),
            form in form(),
        ) -> Message {
            let mut sections: Vec<Section> =
                [header, delivery, annotations, properties, application].into_iter().flatten().collect();
            sections.extend(body);
            sections.extend(footer);
            if let (Some((a, b)), false) = (swap, sections.is_empty()) {
                let (a, b) = (a.index(sections.len()), b.index(sections.len()));
                sections.swap(a, b);
            }
            Message { sections, form }
        }
    }

    /// An envelope's partition-key annotations: mostly one, sometimes none or two (the last
    /// one counts).
    fn envelope_keys() -> BoxedStrategy<Vec<(Value, Value)>> {
        let value = prop_oneof![
            6 => text().prop_map(Value::String),
            1 => text().prop_map(symbol),
            1 => Just(Value::Null),
            1 => annotation_value(),
        ]
        .boxed();
        prop_oneof![
            1 => Just(vec![]),
            8 => vec(value.clone(), 1..=1),
            2 => vec(value, 2..=2),
        ]
        .prop_map(|values| {
            values
                .into_iter()
                .map(|v| (symbol(PARTITION_KEY.into()), v))
                .collect()
        })
        .boxed()
    }

    prop_compose! {
        /// A batch's envelope in the shapes producers send (an optional durable header and
        /// partition key), and near them, holding `messages`.
        fn envelope(messages: Vec<Vec<u8>>)(
            header in option::weighted(0.5, header()),
            delivery in option::weighted(0.05, annotations().prop_map(Section::DeliveryAnnotations)),
            annotations in option::weighted(0.6, prop_oneof![
                6 => envelope_keys(),
                1 => annotations(),
            ].prop_map(Section::MessageAnnotations)),
            properties in option::weighted(0.05, properties()),
            body in prop_oneof![
                12 => Just(messages.into_iter().map(Section::Data).collect::<Vec<_>>()),
                1 => Just(vec![]),
                1 => annotation_value().prop_map(|v| vec![Section::AmqpValue(v)]),
            ],
            footer in option::weighted(0.03, annotations().prop_map(Section::Footer)),
            form in form(),
        ) -> Message {
            let mut sections: Vec<Section> =
                [header, delivery, annotations, properties].into_iter().flatten().collect();
            sections.extend(body);
            sections.extend(footer);
            Message { sections, form }
        }
    }

    /// The property every message must have: the fast path answers only what the general path
    /// answers, and [`event_of`] always answers it; neither panics.
    fn check_message(bytes: &[u8], route_by_key: bool) -> Result<Option<EventData>, TestCaseError> {
        let fast = fast_event(bytes, route_by_key);
        let theirs = outcome(|| general(bytes, route_by_key));
        if let Some(event) = &fast {
            prop_assert!(
                matches!(&theirs, Some(Ok(e)) if same(e, event)),
                "fast {:?}\ngeneral {:?}\nbytes {:x?}",
                fast,
                theirs,
                bytes
            );
        }
        let ours = outcome(|| event_of(bytes, route_by_key));
        prop_assert!(same(&ours, &theirs), "ours {:?}\ntheirs {:?}", ours, theirs);
        Ok(fast)
    }

    /// The property every delivery must have: the new `events_of` answers what the old one
    /// answered — the same events and key, or the same condition and description.
    fn check_delivery(
        payload: &[u8],
        format: u32,
        route_by_key: bool,
    ) -> Result<(), TestCaseError> {
        let ours = outcome(|| events_of(payload, format, route_by_key));
        let theirs = outcome(|| reference_events_of(payload, format, route_by_key));
        prop_assert!(
            same(&ours, &theirs),
            "ours {:?}\ntheirs {:?}\npayload {:x?}",
            ours,
            theirs,
            payload
        );
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// Messages in the common shape and near it: the fast path takes exactly the ones in
        /// the shape, and agrees with the general path on them.
        #[test]
        fn ingest_messages_decode_as_the_general_path_does(
            message in message(),
            route_by_key in any::<bool>(),
        ) {
            let bytes = message.encode();
            let fast = check_message(&bytes, route_by_key)?;
            prop_assert_eq!(
                fast.is_some(),
                takes_fast_path(&message, route_by_key),
                "{:?}\n{:x?}",
                message,
                bytes
            );
        }

        /// Damaged messages: never a panic on the fast path, never an answer the general path
        /// does not give.
        #[test]
        fn ingest_damaged_messages_never_disagree(
            message in message(),
            damages in vec(damage(), 1..3),
            route_by_key in any::<bool>(),
        ) {
            let mut bytes = message.encode();
            for damage in &damages {
                damage.apply(&mut bytes);
            }
            check_message(&bytes, route_by_key)?;
        }

        /// Whole deliveries — plain, batched, of an unsupported format, damaged or not — come
        /// out of `events_of` as they did before the fast path.
        #[test]
        fn ingest_deliveries_come_out_as_before(
            (messages, envelope) in prop_oneof![
                vec(message(), 0..4),
                repeating_messages(),
            ].prop_flat_map(|messages| {
                let encoded: Vec<Vec<u8>> = messages.iter().map(Message::encode).collect();
                (Just(messages), envelope(encoded))
            }),
            format in prop_oneof![4 => Just(BATCH_FORMAT), 3 => Just(0u32), 1 => Just(7u32)],
            damage in option::weighted(0.15, damage()),
            route_by_key in any::<bool>(),
        ) {
            let mut payload = match (format, messages.first()) {
                (0, Some(message)) => message.encode(),
                _ => envelope.encode(),
            };
            if let Some(damage) = &damage {
                damage.apply(&mut payload);
            }
            check_delivery(&payload, format, route_by_key)?;
            if format == BATCH_FORMAT && damage.is_none() {
                prop_assert_eq!(
                    Envelope::fast(&payload, route_by_key).is_some(),
                    takes_fast_envelope(&envelope, route_by_key),
                    "{:?}",
                    envelope
                );
            }
        }

        /// Messages as `serde_amqp` encodes a producer's `fe2o3-amqp` message (the way the
        /// other tests here encode them) take the fast path whenever they are in its shape.
        #[test]
        fn ingest_serde_encoded_messages_take_the_fast_path(
            body in vec(any::<u8>(), 0..300),
            key in option::of(text()),
            durable in any::<bool>(),
            message_id in option::of(text()),
            correlation_id in option::of(text()),
            content_type in option::of(text()),
            application in vec((text(), mapped()), 0..6),
            route_by_key in any::<bool>(),
        ) {
            let mut message = AmqpMessage {
                header: durable.then(|| fe2o3_amqp_types::messaging::Header {
                    durable: true,
                    ..Default::default()
                }),
                body: Body::Data(vec![Data(Binary::from(body))].into()),
                ..empty_message()
            };
            if let Some(key) = &key {
                let mut annotations = OrderedMap::new();
                annotations.insert(OwnedKey::from(PARTITION_KEY), Value::String(key.clone()));
                message.message_annotations = Some(MessageAnnotations(annotations));
            }
            if message_id.is_some() || correlation_id.is_some() || content_type.is_some() {
                message.properties = Some(Properties {
                    message_id: message_id.map(MessageId::String),
                    correlation_id: correlation_id.map(MessageId::String),
                    content_type: content_type.map(Symbol::from),
                    ..Properties::default()
                });
            }
            if !application.is_empty() {
                let map = application
                    .into_iter()
                    .map(|(k, v)| (k, SimpleValue::try_from(v).unwrap()))
                    .collect::<OrderedMap<_, _>>();
                message.application_properties = Some(ApplicationProperties(map));
            }
            let bytes = crate::message::encode_message(&message).unwrap();
            let fast = check_message(&bytes, route_by_key)?;
            prop_assert_eq!(fast.is_some(), route_by_key || key.is_none());
            if let Some(event) = fast {
                prop_assert_eq!(event.protocol_sections.is_some(), durable);
            }
        }

        /// Arbitrary bytes never panic the fast paths, and come out of `events_of` as before.
        #[test]
        fn ingest_arbitrary_bytes_never_panic(
            bytes in vec(any::<u8>(), 0..512),
            prefix in prop_oneof![Just(&[][..]), Just(&[0x00, 0x53, 0x70][..]), Just(&[0x00, 0x53, 0x72][..]), Just(&[0x00, 0x53, 0x75][..])],
            route_by_key in any::<bool>(),
        ) {
            let mut payload = prefix.to_vec();
            payload.extend(bytes);
            check_message(&payload, route_by_key)?;
            let _ = Envelope::fast(&payload, route_by_key);
            check_delivery(&payload, BATCH_FORMAT, route_by_key)?;
        }
    }

    /// What our client writes first for a partition key, in a message and an envelope (the
    /// Python SDK's shape too): the durable header and the key.
    fn client_prefix(key: &str) -> Vec<u8> {
        let mut out = vec![0x00, 0x53, 0x70, 0xc0, 0x02, 0x01, 0x41];
        let mut annotations = MapSection::start(&mut out, section::MESSAGE_ANNOTATIONS);
        annotations.entry(PARTITION_KEY, true, |v| v.string(key));
        annotations.finish();
        out
    }

    /// A message as our client writes one with a partition key: its prefix, ids, application
    /// properties, one data section.
    fn client_message(key: &str) -> Vec<u8> {
        let mut out = client_prefix(key);
        let mut properties = ListSection::start(&mut out, section::PROPERTIES);
        properties.field(|v| v.string("id-1"));
        for _ in 0..4 {
            properties.field(|v| v.null());
        }
        properties.field(|v| v.string("corr"));
        properties.field(|v| v.symbol("application/json"));
        properties.finish();
        let mut application = MapSection::start(&mut out, section::APPLICATION_PROPERTIES);
        application.entry("kind", false, |v| v.string("order"));
        application.entry("amount", false, |v| v.long(42));
        application.finish();
        write_data_section(&mut out, &[7; 100]);
        out
    }

    #[test]
    fn ingest_a_clients_keyed_message_takes_the_fast_path_with_its_header_kept() {
        let bytes = client_message("device-1");
        let event = fast_event(&bytes, true).expect("the fast path takes it");
        assert_eq!(Ok(event.clone()), general(&bytes, true));
        assert_eq!(event.partition_key.as_deref(), Some("device-1"));
        assert_eq!(event.message_id.as_deref(), Some("id-1"));
        assert_eq!(event.correlation_id.as_deref(), Some("corr"));
        assert_eq!(event.content_type.as_deref(), Some("application/json"));
        assert_eq!(
            event.properties[1],
            ("amount".into(), PropertyValue::Int64(42))
        );
        assert_eq!(&event.body[..], &[7; 100]);
        // The general path keeps the header; so does the fast path, in the same bytes.
        assert_eq!(
            event.protocol_sections.as_deref(),
            Some(&[0x00, 0x53, 0x70, 0xc0, 0x02, 0x01, 0x41][..])
        );
        // Sent to a partition, the key is kept as an annotation: the general path's business.
        assert_eq!(fast_event(&bytes, false), None);
        assert_eq!(event_of(&bytes, false), general(&bytes, false));
        // A batch of them, in the envelope our client writes, takes the fast path throughout.
        let mut payload = client_prefix("device-1");
        for _ in 0..3 {
            write_data_section(&mut payload, &bytes);
        }
        let envelope = Envelope::fast(&payload, true).expect("the fast path takes it");
        assert_eq!(envelope.key.as_deref(), Some("device-1"));
        assert_eq!(envelope.messages, vec![&bytes[..]; 3]);
        let (key, events) = events_of(&payload, BATCH_FORMAT, true).unwrap();
        assert_eq!(key.as_deref(), Some("device-1"));
        assert_eq!(events, vec![event; 3]);
        assert_eq!(
            events_of(&payload, BATCH_FORMAT, true),
            reference_events_of(&payload, BATCH_FORMAT, true)
        );
    }

    #[test]
    fn ingest_a_batch_takes_the_previous_events_copy_of_a_repeated_long_string() {
        // Events stamped as a replication task stamps them: the same long origin on each, a
        // time that changes, and on the last a key of its own in the origin's place.
        let origin = "hub-0123456789abcdef0123456789abcdef";
        let stamped = |time: &str, origin_key: &str| {
            let mut event = EventData::new(Bytes::from_static(b"{}"));
            event.properties = vec![
                (origin_key.into(), PropertyValue::String(origin.into())),
                (
                    "repl-enqueued-time".into(),
                    PropertyValue::String(time.into()),
                ),
                ("n".into(), PropertyValue::Int64(1)),
            ];
            event
        };
        let sent = vec![
            stamped("2026-11-28T05:00:00.0000000Z", "repl-origin"),
            stamped("2026-11-28T05:00:00.0000000Z", "repl-origin"),
            stamped("2026-11-28T05:00:01.0000000Z", "repl-origin"),
            stamped("2026-11-28T05:00:01.0000000Z", "another-origin"),
        ];
        let (payload, format) = crate::send::encode_outgoing(&sent, None).unwrap();
        let (_, events) = events_of(&payload, format, true).unwrap();
        assert_eq!(events, sent);
        assert_eq!(
            Ok((None, events.clone())),
            reference_events_of(&payload, format, true)
        );
        let text_at = |event: usize, at: usize| match &events[event].properties[at].1 {
            PropertyValue::String(text) => text.as_ptr(),
            other => panic!("not a string: {other:?}"),
        };
        // The origin is the first event's copy throughout, even after another key; the time
        // is shared while it repeats, and a new copy once it changes.
        for event in 1..4 {
            assert_eq!(text_at(event, 0), text_at(0, 0), "event {event}");
        }
        assert_eq!(text_at(1, 1), text_at(0, 1));
        assert_ne!(text_at(2, 1), text_at(1, 1));
        assert_eq!(text_at(3, 1), text_at(2, 1));
    }

    #[test]
    fn ingest_a_batch_of_too_many_messages_is_refused_as_before() {
        let mut payload = Vec::new();
        for _ in 0..=BATCH_EVENTS_MAX {
            write_data_section(&mut payload, &[0x00, 0x53, 0x75, 0xa0, 0x00]);
        }
        let envelope = Envelope::fast(&payload, true).expect("the fast path reads it");
        assert_eq!(envelope.messages.len(), BATCH_EVENTS_MAX + 1);
        let refusal = events_of(&payload, BATCH_FORMAT, true).unwrap_err();
        assert_eq!(
            Err(refusal.clone()),
            reference_events_of(&payload, BATCH_FORMAT, true)
        );
        assert_eq!(refusal.condition, conditions::DECODE_ERROR);
        assert!(
            refusal.description.contains("not 32769"),
            "{}",
            refusal.description
        );
    }

    #[test]
    fn ingest_a_map_larger_than_serde_amqp_reads_is_left_to_it() {
        // `serde_amqp` refuses a map32 of more than `MAX_ARRAY_COUNT` keys and values, however
        // well-formed; so must the fast path (by falling back).
        let entries = serde_amqp::de::MAX_ARRAY_COUNT / 2 + 1;
        let mut map = Vec::new();
        for n in 0..entries {
            let key = format!("{n:05}");
            map.extend_from_slice(&[0xa1, 5]);
            map.extend_from_slice(key.as_bytes());
            map.push(0x40);
        }
        let mut bytes = vec![0x00, 0x53, 0x74, 0xd1];
        bytes.extend_from_slice(&u32::try_from(map.len() + 4).unwrap().to_be_bytes());
        bytes.extend_from_slice(&u32::try_from(entries * 2).unwrap().to_be_bytes());
        bytes.extend_from_slice(&map);
        assert_eq!(fast_event(&bytes, true), None);
        assert!(general(&bytes, true).is_err());
        assert_eq!(event_of(&bytes, true), general(&bytes, true));
        // One entry fewer is read, by both. (Converting it the general way costs seconds in a
        // debug build: `event_from_message` looks for each key among those before it.)
        let fewer = entries - 1;
        let mut bytes = vec![0x00, 0x53, 0x74, 0xd1];
        bytes.extend_from_slice(&u32::try_from(fewer * 8 + 4).unwrap().to_be_bytes());
        bytes.extend_from_slice(&u32::try_from(fewer * 2).unwrap().to_be_bytes());
        bytes.extend_from_slice(&map[..fewer * 8]);
        let event = fast_event(&bytes, true).expect("the fast path reads it");
        assert_eq!(event.properties.len(), fewer);
        let decoded = decode_strict(&bytes).expect("the general path decodes it");
        assert_eq!(decoded.application_properties.unwrap().0.len(), fewer);
    }

    #[test]
    fn ingest_what_the_fast_path_leaves_to_the_general_path() {
        let data = [0x00, 0x53, 0x75, 0xa0, 0x01, b'z'];
        let with = |section: &[u8]| [section, &data[..]].concat();
        let cases: Vec<Vec<u8>> = vec![
            // Nothing at all.
            vec![],
            // Another annotation, kept.
            with(&[0x00, 0x53, 0x72, 0xc1, 0x05, 0x02, 0xa3, 0x01, b'x', 0x41]),
            // A partition key of another type, refused.
            with(&[
                0x00, 0x53, 0x72, 0xc1, 0x16, 0x02, 0xa3, 0x13, b'x', b'-', b'o', b'p', b't', b'-',
                b'p', b'a', b'r', b't', b'i', b't', b'i', b'o', b'n', b'-', b'k', b'e', b'y', 0x41,
            ]),
            // A ulong message id, kept exactly.
            with(&[0x00, 0x53, 0x73, 0xc0, 0x03, 0x01, 0x53, 0x07]),
            // A subject, kept.
            with(&[
                0x00, 0x53, 0x73, 0xc0, 0x06, 0x04, 0x40, 0x40, 0x40, 0xa1, 0x01, b's',
            ]),
            // A symbol property, kept too.
            with(&[
                0x00, 0x53, 0x74, 0xc1, 0x07, 0x02, 0xa1, 0x01, b'k', 0xa3, 0x01, b'v',
            ]),
            // A repeated key, merged by the general path's map.
            with(&[
                0x00, 0x53, 0x74, 0xc1, 0x09, 0x04, 0xa1, 0x01, b'a', 0x41, 0xa1, 0x01, b'a', 0x42,
            ]),
            // Two data sections.
            [&data[..], &data[..]].concat(),
            // An amqp-value body; a footer.
            vec![0x00, 0x53, 0x77, 0xa1, 0x01, b'v'],
            [&data[..], &[0x00, 0x53, 0x78, 0xc1, 0x01, 0x00][..]].concat(),
            // An odd map count (which `serde_amqp` itself mishandles).
            vec![0x00, 0x53, 0x72, 0xc1, 0x02, 0x01, 0x40],
            // A symbolic descriptor.
            [&[0x00, 0xa3, 0x10][..], b"amqp:data:binary", &[0xa0, 0x00]].concat(),
        ];
        for bytes in cases {
            assert_eq!(fast_event(&bytes, true), None, "{bytes:x?}");
            let ours = outcome(|| event_of(&bytes, true));
            let theirs = outcome(|| general(&bytes, true));
            assert!(same(&ours, &theirs), "{bytes:x?}");
        }
    }
}

#[cfg(test)]
mod events_of_tests {
    use super::*;
    use crate::message::{AmqpMessage, empty_message};
    use crate::names::BATCH_MESSAGE_FORMAT as BATCH_FORMAT;
    use fe2o3_amqp_types::messaging::annotations::OwnedKey;
    use fe2o3_amqp_types::messaging::{Body, Data, MessageAnnotations};
    use fe2o3_amqp_types::primitives::{Binary, OrderedMap, Value};

    fn to_bytes(message: AmqpMessage) -> Vec<u8> {
        crate::message::encode_message(&message).unwrap()
    }

    fn encoded(body: &[u8], key: Option<&str>) -> Vec<u8> {
        let mut message = AmqpMessage {
            body: Body::Data(vec![Data(Binary::from(body.to_vec()))].into()),
            ..empty_message()
        };
        if let Some(key) = key {
            let mut ma = OrderedMap::new();
            ma.insert(
                OwnedKey::from("x-opt-partition-key"),
                Value::String(key.into()),
            );
            message.message_annotations = Some(MessageAnnotations(ma));
        }
        to_bytes(message)
    }

    fn batch(sections: Vec<Vec<u8>>) -> Vec<u8> {
        to_bytes(AmqpMessage {
            body: Body::Data(
                sections
                    .into_iter()
                    .map(|s| Data(Binary::from(s)))
                    .collect::<Vec<_>>()
                    .into(),
            ),
            ..empty_message()
        })
    }

    #[test]
    fn a_batch_becomes_one_event_per_message() {
        let payload = batch(vec![encoded(b"a", Some("k")), encoded(b"b", Some("k"))]);
        let (key, events) = events_of(&payload, BATCH_FORMAT, true).unwrap();
        assert_eq!(key.as_deref(), Some("k"));
        assert_eq!(events.len(), 2);
        assert_eq!(&events[1].body[..], b"b");
    }

    #[test]
    fn malformed_batches_are_rejected_with_decode_error() {
        let mut trailing = encoded(b"a", None);
        trailing.push(0x40);
        for payload in [
            batch(vec![]),
            batch(vec![vec![0x00, 0x53]]),
            batch(vec![trailing]),
            to_bytes(empty_message()),
            vec![0x00, 0x53],
        ] {
            let refusal = events_of(&payload, BATCH_FORMAT, true).unwrap_err();
            assert_eq!(
                refusal.condition,
                conditions::DECODE_ERROR,
                "{}",
                refusal.description
            );
        }
        let refusal = events_of(&to_bytes(empty_message()), 7, true).unwrap_err();
        assert_eq!(refusal.condition, conditions::NOT_IMPLEMENTED);
        // A malformed message is a decode error whatever its format.
        let refusal = events_of(&[0x00, 0x53], 7, true).unwrap_err();
        assert_eq!(refusal.condition, conditions::DECODE_ERROR);
    }
}
