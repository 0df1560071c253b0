//! Receive: a delivered message's bytes straight into a [`ReceivedEvent`], without building
//! `fe2o3-amqp`'s generic message first.
//!
//! [`decode_received_bytes`] gives what decoding the bytes into a `Message<Body<Value>>` and
//! calling [`decode_received`] and [`last_enqueued`] on it gives — the same event, the same
//! runtime metric, the same error — for every well-formed message.
//!
//! # Fast path
//! The message a hub sends is walked section by section with the strict
//! [`tributary_amqp_codec::value::Reader`], borrowing from the payload and allocating only what
//! the event keeps:
//! - an optional `header` (checked, ignored);
//! - optional `delivery-annotations`: `last_enqueued_sequence_number`, `last_enqueued_offset`,
//!   `last_enqueued_time_utc`, `runtime_info_retrieval_time_utc` (a sender's own delivery
//!   annotations, which the general path keeps with the event, fall back);
//! - `message-annotations`: `x-opt-sequence-number`, `x-opt-offset`, `x-opt-enqueued-time`
//!   (each of the types the general path accepts for it), `x-opt-partition-key`; laid out as
//!   the hub writes them, they are read key by key in that order, any other layout walked;
//! - optional `properties`: every field checked, message id, correlation id (of any of the four
//!   message-id types) and content type kept;
//! - optional `application-properties`: string keys, values of any primitive type but the
//!   decimals, mapped as [`widen`](crate::property::widen) maps them (a
//!   repeated key keeps its first place and its last value, as the general path's map does);
//! - zero or more `data` sections, concatenated; then the end of the payload.
//!
//! Every section descriptor is a numeric one; the other keys and values in the maps are checked
//! like the ones kept.
//!
//! # Fallback
//! Anything else — an `amqp-value` or `amqp-sequence` body, a footer, compound or described
//! values in annotations or properties, decimals, symbolic descriptors, sections out of order,
//! a missing or unusable system annotation (whose error the general path words) — goes to the
//! general path: `fe2o3-amqp` decodes the bytes and [`decode_received`] and [`last_enqueued`]
//! convert the message.
//!
//! Before that, the bytes are checked to be well-formed AMQP values all the way down
//! ([`Reader::skip_checked_with`], [`ArrayRule::Primitive`]), because `serde_amqp` trusts the
//! sizes and counts it reads and frames some arrays differently from the specification: on
//! bytes that lie it can panic (an odd map count underflows in debug builds) or, once
//! misframed, read a binary's contents as values nested deeply enough to overflow the stack.
//! Bytes that fail the check are a [`MessageError::Malformed`], as bytes `fe2o3-amqp` cannot
//! decode are. Besides bytes that are not AMQP (sizes and counts that disagree, which
//! `fe2o3-amqp` may read anyway by the counts), the check refuses only values nested more than
//! [`NESTING_DEPTH_MAX`](tributary_amqp_codec::value::NESTING_DEPTH_MAX) deep and arrays
//! `fe2o3-amqp` fails on or misreads (of lists, maps, arrays or described values, or empty
//! with an element constructor).

use std::collections::HashMap;

use bytes::Bytes;
use fe2o3_amqp_types::messaging::message::DecodeIntoMessage;
use fe2o3_amqp_types::messaging::{Body, Message};
use fe2o3_amqp_types::primitives::Value;
use serde_amqp::read::SliceReader;
use tributary_amqp_codec::message::section_code::{
    APPLICATION_PROPERTIES, DATA, DELIVERY_ANNOTATIONS, HEADER, MESSAGE_ANNOTATIONS, PROPERTIES,
    PROPERTIES_FIELDS,
};
use tributary_amqp_codec::value::{Primitive, Reader, check_well_formed};
use tributary_event::{EventData, PropertyValue, ReceivedEvent, SmolStr};

pub(crate) mod general;

use self::general::{decode_received, last_enqueued};
use crate::message::{LastEnqueued, MessageError};
use crate::names::annotation::{
    ENQUEUED_TIME as ENQUEUED_TIME_ANNOTATION, OFFSET as OFFSET_ANNOTATION,
    PARTITION_KEY as PARTITION_KEY_ANNOTATION, SEQUENCE_NUMBER as SEQUENCE_NUMBER_ANNOTATION,
};
use crate::names::runtime_metric::{
    LAST_ENQUEUED_OFFSET, LAST_ENQUEUED_SEQUENCE_NUMBER, LAST_ENQUEUED_TIME_UTC, RETRIEVAL_TIME_UTC,
};
use crate::walk::{Fallback, header, map_entries, next_section};

/// A delivered event, and the partition's last-enqueued event when the delivery carried the
/// runtime-metric annotations complete.
pub type Received = (ReceivedEvent, Option<LastEnqueued>);

/// Decodes a delivered message's bytes (a transfer's payload) into its event and, when the
/// delivery annotations carry it complete, the partition's last-enqueued event; `now_ms`
/// stands in for a missing `runtime_info_retrieval_time_utc`, as in [`last_enqueued`].
///
/// Equals decoding the bytes with `fe2o3-amqp` and calling [`decode_received`] and
/// [`last_enqueued`]; see the module docs for which messages take the fast path.
pub fn decode_received_bytes(payload: &[u8], now_ms: i64) -> Result<Received, MessageError> {
    match fast(payload, now_ms) {
        Ok(received) => Ok(received),
        Err(Fallback) => general(payload, now_ms),
    }
}

/// [`decode_received_bytes`] for a payload the caller owns: a body of one `data` section (what
/// the hub sends) is a slice of `payload` instead of a copy, so receiving an event copies its
/// body only once, from the socket's buffer into `payload`. The slice keeps the message's few
/// other bytes (its annotations) alive with the body.
pub fn decode_received_owned(payload: Bytes, now_ms: i64) -> Result<Received, MessageError> {
    match fast_with(&payload, now_ms, |only| payload.slice_ref(only)) {
        Ok(received) => Ok(received),
        Err(Fallback) => general(&payload, now_ms),
    }
}

/// The general path: the bytes checked to be well-formed, decoded by `fe2o3-amqp`, converted
/// by [`decode_received`] and [`last_enqueued`].
fn general(payload: &[u8], now_ms: i64) -> Result<Received, MessageError> {
    let message = decode_message(payload)?;
    let last = last_enqueued(message.delivery_annotations.as_ref(), now_ms);
    Ok((decode_received(message)?, last))
}

/// Decodes a message the hub sent (a delivery, a `$cbs` or `$management` response) into
/// `fe2o3-amqp`'s generic message, after [`check_well_formed`].
pub fn decode_message(payload: &[u8]) -> Result<Message<Body<Value>>, MessageError> {
    check_well_formed(payload)
        .map_err(|e| MessageError::Malformed(format!("the hub sent a malformed message: {e}")))?;
    <Body<Value> as DecodeIntoMessage>::decode_message_from_reader(SliceReader::new(payload))
        .map_err(|e| {
            MessageError::Malformed(format!(
                "the hub sent a message that could not be decoded: {e}"
            ))
        })
}

/// The fast path (see the module docs), copying the body.
fn fast(payload: &[u8], now_ms: i64) -> Result<Received, Fallback> {
    fast_with(payload, now_ms, Bytes::copy_from_slice)
}

/// The fast path; `single_body` makes the body of a message with one `data` section.
fn fast_with<'a>(
    payload: &'a [u8],
    now_ms: i64,
    single_body: impl FnOnce(&'a [u8]) -> Bytes,
) -> Result<Received, Fallback> {
    let mut reader = Reader::new(payload);
    let mut section = next_section(&mut reader)?;
    if section == Some(HEADER) {
        header(&mut reader)?;
        section = next_section(&mut reader)?;
    }
    let mut last = None;
    if section == Some(DELIVERY_ANNOTATIONS) {
        last = delivery_annotations(&mut reader, now_ms)?;
        section = next_section(&mut reader)?;
    }
    if section != Some(MESSAGE_ANNOTATIONS) {
        // No system annotations: the general path words the error.
        return Err(Fallback);
    }
    let system = message_annotations(&mut reader)?;
    section = next_section(&mut reader)?;
    let mut ids = Ids::default();
    if section == Some(PROPERTIES) {
        ids = properties(&mut reader)?;
        section = next_section(&mut reader)?;
    }
    let mut application = Vec::new();
    if section == Some(APPLICATION_PROPERTIES) {
        application = application_properties(&mut reader)?;
        section = next_section(&mut reader)?;
    }
    // One `data` section (what the hub sends) is the body as it is; more are joined.
    let mut first: Option<&[u8]> = None;
    let mut joined: Option<Vec<u8>> = None;
    while section == Some(DATA) {
        let data = reader.binary()?;
        match (first, &mut joined) {
            (None, _) => first = Some(data),
            (Some(only), None) => joined = Some([only, data].concat()),
            (Some(_), Some(all)) => all.extend_from_slice(data),
        }
        section = next_section(&mut reader)?;
    }
    if section.is_some() {
        return Err(Fallback);
    }
    let body = match (first, joined) {
        (None, _) => Bytes::new(),
        (Some(only), None) => single_body(only),
        (Some(_), Some(all)) => Bytes::from(all),
    };
    let event = ReceivedEvent {
        sequence_number: system.sequence_number,
        offset: system.offset,
        enqueued_time_ms: system.enqueued_time_ms,
        data: EventData {
            body,
            properties: application,
            partition_key: system.partition_key,
            content_type: ids.content_type,
            correlation_id: ids.correlation_id,
            message_id: ids.message_id,
            protocol_sections: None,
        },
    };
    Ok((event, last))
}

/// Where the offset stands among the names [`delivery_annotations`] and
/// [`message_annotations`] look for: second in both.
const OFFSET_AT: usize = 1;

/// Walks an annotations map (`delivery-annotations`, `message-annotations`): symbol or ulong
/// keys, primitive values; calls `entry` with each key and its value, in order: `Some(Ok(i))`
/// for the symbol `known[i]`, `Some(Err(text))` for another symbol, `None` for a ulong. The
/// value of `known[offset]` is an offset: a string of decimal digits comes as the `ulong` it
/// spells, which [`as_u64`] takes alike.
fn annotations<'a>(
    reader: &mut Reader<'a>,
    known: &[&str],
    offset: usize,
    mut entry: impl FnMut(Option<Result<usize, &'a str>>, Primitive<'a>),
) -> Result<(), Fallback> {
    let (entries, end) = map_entries(reader)?;
    for _ in 0..entries {
        let key = match reader.rest().first() {
            Some(0xa3 | 0xb3) => Some(reader.symbol_in(known)?),
            _ => {
                reader.ulong()?;
                None
            }
        };
        let digits = match key {
            Some(Ok(i)) if i == offset => reader.take_decimal_string(),
            _ => None,
        };
        let value = match digits {
            Some(number) => Primitive::Ulong(number),
            None => reader.primitive()?,
        };
        entry(key, value);
    }
    reader.expect_at(end, "annotations overrun the map")?;
    Ok(())
}

/// The runtime metric from the delivery annotations, as [`last_enqueued`] reads it: the last
/// value of each key counts. Any other key falls back: the general path keeps a sender's
/// delivery annotations with the event.
fn delivery_annotations(
    reader: &mut Reader<'_>,
    now_ms: i64,
) -> Result<Option<LastEnqueued>, Fallback> {
    const RUNTIME_METRIC: [&str; 4] = [
        LAST_ENQUEUED_SEQUENCE_NUMBER,
        LAST_ENQUEUED_OFFSET,
        LAST_ENQUEUED_TIME_UTC,
        RETRIEVAL_TIME_UTC,
    ];
    let mut values = [None; RUNTIME_METRIC.len()];
    let mut senders = false;
    annotations(reader, &RUNTIME_METRIC, OFFSET_AT, |key, value| match key {
        Some(Ok(i)) => values[i] = Some(value),
        _ => senders = true,
    })?;
    let [sequence, offset, enqueued, retrieved] = values;
    if senders {
        return Err(Fallback);
    }
    let last = (|| {
        Some(LastEnqueued {
            sequence_number: as_i64(sequence?)?,
            offset: Some(as_u64(offset?)?),
            enqueued_time_ms: Some(as_i64(enqueued?)?),
            retrieved_time_ms: retrieved.and_then(as_i64).unwrap_or(now_ms),
        })
    })();
    Ok(last)
}

/// What the message annotations say about the event.
#[derive(Debug, PartialEq)]
struct SystemAnnotations {
    sequence_number: i64,
    offset: u64,
    enqueued_time_ms: i64,
    partition_key: Option<String>,
}

/// The system annotations, as [`decode_received`] reads them; a missing or unusable one falls
/// back (the general path words the error).
fn message_annotations(reader: &mut Reader<'_>) -> Result<SystemAnnotations, Fallback> {
    match message_annotations_as_delivered(reader) {
        Some(system) => Ok(system),
        None => message_annotations_walked(reader),
    }
}

/// [`message_annotations`] in any layout: the walker of [`annotations`].
fn message_annotations_walked(reader: &mut Reader<'_>) -> Result<SystemAnnotations, Fallback> {
    const SYSTEM: [&str; 4] = [
        SEQUENCE_NUMBER_ANNOTATION,
        OFFSET_ANNOTATION,
        ENQUEUED_TIME_ANNOTATION,
        PARTITION_KEY_ANNOTATION,
    ];
    let mut values = [None; SYSTEM.len()];
    annotations(reader, &SYSTEM, OFFSET_AT, |name, value| {
        if let Some(Ok(i)) = name {
            values[i] = Some(value);
        }
    })?;
    let [sequence, offset, enqueued, key] = values;
    Ok(SystemAnnotations {
        sequence_number: sequence.and_then(as_i64).ok_or(Fallback)?,
        offset: offset.and_then(as_u64).ok_or(Fallback)?,
        enqueued_time_ms: enqueued.and_then(as_i64).ok_or(Fallback)?,
        partition_key: match key {
            Some(Primitive::String(key) | Primitive::Symbol(key)) => Some(key.to_owned()),
            _ => None,
        },
    })
}

/// The system annotations if they are laid out exactly as the hub writes them
/// ([`write_delivery_message`](crate::deliver::write_delivery_message)): a map of the partition
/// key (a string, if the event has one), then the sequence number (a long), the offset (a
/// decimal string) and the enqueued time (a timestamp), each key a `sym8`. Each key is then
/// one comparison and each value one typed read, where the walker of [`annotations`] matches
/// every key against every name and reads every value as any primitive. `None`, with `reader`
/// untouched, for any other layout (another broker's, more annotations): the walker reads it,
/// to the same result.
fn message_annotations_as_delivered(reader: &mut Reader<'_>) -> Option<SystemAnnotations> {
    let mut at = reader.clone();
    let (entries, end) = map_entries(&mut at).ok()?;
    let partition_key = match entries {
        3 => None,
        4 if at.take_symbol_equal_to(PARTITION_KEY_ANNOTATION) => {
            Some(at.string().ok()?.to_owned())
        }
        _ => return None,
    };
    if !at.take_symbol_equal_to(SEQUENCE_NUMBER_ANNOTATION) {
        return None;
    }
    let sequence_number = at.long().ok()?;
    if !at.take_symbol_equal_to(OFFSET_ANNOTATION) {
        return None;
    }
    let offset = at.take_decimal_string()?;
    if !at.take_symbol_equal_to(ENQUEUED_TIME_ANNOTATION) {
        return None;
    }
    let enqueued_time_ms = at.timestamp().ok()?;
    at.expect_at(end, "annotations overrun the map").ok()?;
    *reader = at;
    Some(SystemAnnotations {
        sequence_number,
        offset,
        enqueued_time_ms,
        partition_key,
    })
}

/// An annotation as a signed number, where the general path takes one (`value_as_i64`).
fn as_i64(value: Primitive<'_>) -> Option<i64> {
    match value {
        Primitive::Long(v) | Primitive::Timestamp(v) => Some(v),
        Primitive::Int(v) => Some(i64::from(v)),
        Primitive::Uint(v) => Some(i64::from(v)),
        Primitive::Ulong(v) => i64::try_from(v).ok(),
        Primitive::String(v) => v.parse().ok(),
        _ => None,
    }
}

/// An annotation as an unsigned number, where the general path takes one (`value_as_u64`).
fn as_u64(value: Primitive<'_>) -> Option<u64> {
    match value {
        Primitive::String(v) => v.parse().ok(),
        Primitive::Ulong(v) => Some(v),
        Primitive::Long(v) => u64::try_from(v).ok(),
        Primitive::Int(v) => u64::try_from(v).ok(),
        Primitive::Uint(v) => Some(u64::from(v)),
        _ => None,
    }
}

/// The ids kept from the `properties` section.
#[derive(Debug, Default)]
struct Ids {
    message_id: Option<String>,
    correlation_id: Option<String>,
    content_type: Option<String>,
}

/// The `properties` list: every field null or of its type; the ids and content type kept.
fn properties(reader: &mut Reader<'_>) -> Result<Ids, Fallback> {
    let (count, end) = reader.list_header()?;
    if count > PROPERTIES_FIELDS {
        return Err(Fallback);
    }
    let mut ids = Ids::default();
    for field in 0..count {
        if reader.null()? {
            continue;
        }
        match field {
            0 => ids.message_id = Some(message_id_text(reader)?),
            1 => {
                reader.binary()?;
            }
            // to, subject, reply-to, group-id, reply-to-group-id.
            2 | 3 | 4 | 10 | 12 => {
                reader.string()?;
            }
            5 => ids.correlation_id = Some(message_id_text(reader)?),
            6 => ids.content_type = Some(reader.symbol()?.to_owned()),
            7 => {
                reader.symbol()?;
            }
            8 | 9 => {
                reader.timestamp()?;
            }
            _ => {
                reader.uint()?;
            }
        }
    }
    reader.expect_at(end, "properties overrun the list")?;
    Ok(ids)
}

/// A message id (`ulong`, `uuid`, `binary` or `string`) as text, as the general path writes
/// it: a ulong in decimal, a uuid hyphenated, a binary in lowercase hex.
fn message_id_text(reader: &mut Reader<'_>) -> Result<String, Fallback> {
    Ok(match reader.primitive()? {
        Primitive::String(id) => id.to_owned(),
        Primitive::Ulong(id) => id.to_string(),
        Primitive::Uuid(id) => tributary_event::uuid_text(&id),
        Primitive::Binary(id) => {
            use std::fmt::Write as _;
            let mut text = String::with_capacity(id.len() * 2);
            for byte in id {
                let _ = write!(text, "{byte:02x}");
            }
            text
        }
        _ => return Err(Fallback),
    })
}

/// The application properties: string keys, primitive values mapped as `property_from_amqp`
/// maps them. A repeated key keeps its first place and its last value, as the general path's
/// ordered map does.
fn application_properties(
    reader: &mut Reader<'_>,
) -> Result<Vec<(SmolStr, PropertyValue)>, Fallback> {
    let (entries, end) = map_entries(reader)?;
    let entries = entries as usize;
    // An entry takes at least three bytes, so the input bounds what is reserved.
    let room = end.saturating_sub(reader.position()) / 3;
    let mut properties: Vec<(SmolStr, PropertyValue)> = Vec::with_capacity(entries.min(room));
    let mut index: Option<HashMap<SmolStr, usize>> = None;
    for _ in 0..entries {
        let key = reader.string()?;
        let value = property(reader.primitive()?)?;
        if properties.len() < tributary_event::PAIRWISE_KEY_CHECK_MAX {
            match properties.iter_mut().find(|(existing, _)| existing == key) {
                Some((_, slot)) => *slot = value,
                None => properties.push((SmolStr::new(key), value)),
            }
            continue;
        }
        let index = index.get_or_insert_with(|| {
            properties
                .iter()
                .enumerate()
                .map(|(at, (key, _))| (key.clone(), at))
                .collect()
        });
        match index.get(key) {
            Some(&at) => properties[at].1 = value,
            None => {
                let key = SmolStr::new(key);
                index.insert(key.clone(), properties.len());
                properties.push((key, value));
            }
        }
    }
    reader.expect_at(end, "application properties overrun the map")?;
    Ok(properties)
}

/// An application property's value as `property_from_amqp` maps it; decimals (kept there as
/// their encoding) fall back.
fn property(value: Primitive<'_>) -> Result<PropertyValue, Fallback> {
    Ok(match value {
        Primitive::Null => PropertyValue::Null,
        Primitive::Bool(v) => PropertyValue::Bool(v),
        Primitive::Ubyte(v) => PropertyValue::UInt32(u32::from(v)),
        Primitive::Ushort(v) => PropertyValue::UInt32(u32::from(v)),
        Primitive::Uint(v) => PropertyValue::UInt32(v),
        Primitive::Ulong(v) => PropertyValue::UInt64(v),
        Primitive::Byte(v) => PropertyValue::Int32(i32::from(v)),
        Primitive::Short(v) => PropertyValue::Int32(i32::from(v)),
        Primitive::Int(v) => PropertyValue::Int32(v),
        Primitive::Long(v) => PropertyValue::Int64(v),
        Primitive::Float(v) => PropertyValue::Float32(v),
        Primitive::Double(v) => PropertyValue::Float64(v),
        Primitive::Char(v) => PropertyValue::String(SmolStr::new(v.encode_utf8(&mut [0; 4]))),
        Primitive::Timestamp(v) => PropertyValue::Timestamp(v),
        Primitive::Uuid(v) => PropertyValue::Uuid(v),
        Primitive::Binary(v) => PropertyValue::Bytes(Bytes::copy_from_slice(v)),
        Primitive::String(v) | Primitive::Symbol(v) => PropertyValue::String(SmolStr::new(v)),
        Primitive::Decimal32(_) | Primitive::Decimal64(_) | Primitive::Decimal128(_) => {
            return Err(Fallback);
        }
    })
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp_types::messaging::annotations::{Annotations, OwnedKey};
    use fe2o3_amqp_types::messaging::{
        AmqpSequence, AmqpValue, ApplicationProperties, Data, DeliveryAnnotations, Footer, Header,
        MessageAnnotations, MessageId, Priority, Properties,
    };
    use fe2o3_amqp_types::primitives::{
        Binary, Dec32, SimpleValue, Symbol, Timestamp, Uuid, Value,
    };
    use proptest::collection::vec;
    use proptest::option;
    use proptest::prelude::*;
    use serde_amqp::described::Described;
    use serde_amqp::descriptor::Descriptor;
    use tributary_amqp_codec::message::{MapSection, ValueWriter, section, write_data_section};

    use super::*;
    use crate::send::serde_reference::event_to_message;
    use tributary_amqp_codec::testing::{damage, text};
    use tributary_amqp_codec::value::ArrayRule;
    use tributary_event::strategy::any_property_value;

    const NOW: i64 = 1_700_000_000_999;

    /// The existing path: `fe2o3-amqp` decodes, `decode_received` and `last_enqueued` convert.
    fn existing(payload: &[u8]) -> Result<Received, MessageError> {
        let message = <Body<Value> as DecodeIntoMessage>::decode_message_from_reader(
            SliceReader::new(payload),
        )
        .map_err(|e| {
            MessageError::Malformed(format!(
                "the hub sent a message that could not be decoded: {e}"
            ))
        })?;
        let last = last_enqueued(message.delivery_annotations.as_ref(), NOW);
        Ok((decode_received(message)?, last))
    }

    /// Results compared through `Debug`, which tells every value apart but lets a NaN equal
    /// itself.
    fn same(
        ours: &Result<Received, MessageError>,
        theirs: &Result<Received, MessageError>,
    ) -> bool {
        format!("{ours:?}") == format!("{theirs:?}")
    }

    /// Whether the payload is a sequence of well-formed values.
    fn well_formed(payload: &[u8]) -> bool {
        let mut reader = Reader::new(payload);
        while !reader.is_at_end() {
            if reader.skip_checked_with(0, ArrayRule::Primitive).is_err() {
                return false;
            }
        }
        true
    }

    /// An event as a producer sends it: any body, properties of every type, ids.
    fn event() -> BoxedStrategy<EventData> {
        (
            vec(any::<u8>(), 0..300),
            vec((text(), any_property_value()), 0..10),
            option::of(text()),
            option::of(text()),
            option::of(text()),
        )
            .prop_map(
                |(body, properties, message_id, correlation_id, content_type)| EventData {
                    body: Bytes::from(body),
                    properties: properties
                        .into_iter()
                        .map(|(k, v): (String, _)| (k.into(), v))
                        .collect(),
                    message_id,
                    correlation_id,
                    content_type,
                    ..EventData::default()
                },
            )
            .boxed()
    }

    /// A primitive annotation value of any type.
    fn primitive() -> BoxedStrategy<Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<u8>().prop_map(Value::Ubyte),
            any::<u16>().prop_map(Value::Ushort),
            any::<u32>().prop_map(Value::Uint),
            any::<u64>().prop_map(Value::Ulong),
            any::<i8>().prop_map(Value::Byte),
            any::<i16>().prop_map(Value::Short),
            any::<i32>().prop_map(Value::Int),
            any::<i64>().prop_map(Value::Long),
            any::<f32>().prop_map(|v| Value::Float(v.into())),
            any::<f64>().prop_map(|v| Value::Double(v.into())),
            any::<char>().prop_map(Value::Char),
            any::<i64>().prop_map(|v| Value::Timestamp(Timestamp::from_milliseconds(v))),
            any::<[u8; 16]>().prop_map(|v| Value::Uuid(Uuid::from(v))),
            vec(any::<u8>(), 0..20).prop_map(|v| Value::Binary(Binary::from(v))),
            text().prop_map(Value::String),
            text().prop_map(|v| Value::Symbol(Symbol::from(v))),
        ]
        .boxed()
    }

    /// A simple value the fast path leaves to the general path: described, decimal.
    fn unusual_simple() -> BoxedStrategy<Value> {
        prop_oneof![
            (any::<u64>(), primitive()).prop_map(|(code, value)| {
                Value::Described(Box::new(Described {
                    descriptor: Descriptor::Code(code),
                    value,
                }))
            }),
            any::<[u8; 4]>().prop_map(|v| Value::Decimal32(Dec32::from(v))),
        ]
        .boxed()
    }

    /// A value the fast path leaves to the general path: compound, described, decimal.
    fn unusual() -> BoxedStrategy<Value> {
        prop_oneof![
            vec(primitive(), 0..4).prop_map(Value::List),
            unusual_simple(),
        ]
        .boxed()
    }

    /// A signed system annotation of a type the general path takes, or not.
    fn signed_annotation() -> BoxedStrategy<Option<Value>> {
        prop_oneof![
            30 => prop_oneof![
                4 => any::<i64>().prop_map(Value::Long),
                1 => any::<i32>().prop_map(Value::Int),
                1 => any::<u32>().prop_map(Value::Uint),
                1 => (0..=i64::MAX.unsigned_abs()).prop_map(Value::Ulong),
                4 => any::<i64>().prop_map(|v| Value::Timestamp(Timestamp::from_milliseconds(v))),
                1 => any::<i64>().prop_map(|v| Value::String(v.to_string())),
            ]
            .prop_map(Some),
            1 => Just(None),
            1 => primitive().prop_map(Some),
        ]
        .boxed()
    }

    /// An unsigned system annotation of a type the general path takes, or not.
    fn unsigned_annotation() -> BoxedStrategy<Option<Value>> {
        prop_oneof![
            30 => prop_oneof![
                6 => any::<u64>().prop_map(|v| Value::String(v.to_string())),
                // Leading zeros and signs, too many digits, none: decimal text `parse` may
                // take or refuse.
                1 => "[+0-9]{0,22}".prop_map(Value::String),
                1 => any::<u64>().prop_map(Value::Ulong),
                1 => (0..=i64::MAX).prop_map(Value::Long),
                1 => (0..=i32::MAX).prop_map(Value::Int),
                1 => any::<u32>().prop_map(Value::Uint),
            ]
            .prop_map(Some),
            1 => Just(None),
            1 => primitive().prop_map(Some),
        ]
        .boxed()
    }

    /// An annotation key: mostly symbols, sometimes ulongs.
    fn key() -> BoxedStrategy<OwnedKey> {
        prop_oneof![
            4 => text().prop_map(|k| OwnedKey::Symbol(Symbol::from(k))),
            1 => any::<u64>().prop_map(OwnedKey::Ulong),
        ]
        .boxed()
    }

    fn message_id() -> BoxedStrategy<MessageId> {
        prop_oneof![
            text().prop_map(MessageId::String),
            any::<u64>().prop_map(MessageId::Ulong),
            any::<[u8; 16]>().prop_map(|v| MessageId::Uuid(Uuid::from(v))),
            vec(any::<u8>(), 0..20).prop_map(|v| MessageId::Binary(Binary::from(v))),
        ]
        .boxed()
    }

    fn header() -> BoxedStrategy<Header> {
        (
            any::<bool>(),
            any::<u8>(),
            option::of(any::<u32>()),
            any::<bool>(),
            any::<u32>(),
        )
            .prop_map(
                |(durable, priority, ttl, first_acquirer, delivery_count)| Header {
                    durable,
                    priority: Priority(priority),
                    ttl,
                    first_acquirer,
                    delivery_count,
                },
            )
            .boxed()
    }

    /// The properties fields `event_to_message` leaves out, and ids of other types.
    fn properties_fields() -> BoxedStrategy<Properties> {
        (
            (
                option::of(message_id()),
                option::of(vec(any::<u8>(), 0..8).prop_map(Binary::from)),
                option::of(text()),
                option::of(text()),
                option::of(text()),
                option::of(message_id()),
            ),
            (
                option::of(text().prop_map(Symbol::from)),
                option::of(any::<i64>().prop_map(Timestamp::from_milliseconds)),
                option::of(any::<i64>().prop_map(Timestamp::from_milliseconds)),
                option::of(text()),
                option::of(any::<u32>()),
                option::of(text()),
            ),
        )
            .prop_map(
                |(
                    (message_id, user_id, to, subject, reply_to, correlation_id),
                    (
                        content_encoding,
                        absolute_expiry_time,
                        creation_time,
                        group_id,
                        group_sequence,
                        reply_to_group_id,
                    ),
                )| Properties {
                    message_id,
                    user_id,
                    to,
                    subject,
                    reply_to,
                    correlation_id,
                    content_type: None,
                    content_encoding,
                    absolute_expiry_time,
                    creation_time,
                    group_id,
                    group_sequence,
                    reply_to_group_id,
                },
            )
            .boxed()
    }

    /// The body sections.
    #[derive(Debug, Clone)]
    enum BodyShape {
        Data(Vec<Vec<u8>>),
        Value(Value),
        Sequence(Vec<Vec<Value>>),
    }

    fn body() -> BoxedStrategy<BodyShape> {
        prop_oneof![
            12 => vec(vec(any::<u8>(), 0..200), 0..4).prop_map(BodyShape::Data),
            1 => prop_oneof![primitive(), unusual()].prop_map(BodyShape::Value),
            1 => vec(vec(primitive(), 0..3), 1..3).prop_map(BodyShape::Sequence),
        ]
        .boxed()
    }

    /// A delivered message in the shapes a hub sends, and variations on them; its bytes, and
    /// whether it holds something the fast path leaves to the general path.
    #[derive(Debug)]
    struct Delivery {
        bytes: Vec<u8>,
        unusual: bool,
    }

    /// Any extra annotations or application properties: mostly primitives, sometimes a value
    /// the fast path leaves to the general path.
    fn extras() -> BoxedStrategy<Vec<(OwnedKey, Value, bool)>> {
        vec(
            prop_oneof![
                12 => (key(), primitive()).prop_map(|(k, v)| (k, v, false)),
                1 => (key(), unusual()).prop_map(|(k, v)| (k, v, true)),
            ],
            0..4,
        )
        .boxed()
    }

    prop_compose! {
        fn delivery()(
            event in event(),
            partition_key in option::of(text()),
            header in option::of(option::of(header())),
            ids in option::of(properties_fields()),
            (sequence, offset, enqueued) in (signed_annotation(), unsigned_annotation(), signed_annotation()),
            partition_key_value in option::of(primitive()),
            delivery_annotations in option::of((
                signed_annotation(), unsigned_annotation(), signed_annotation(), signed_annotation(),
            )),
            extra_message in extras(),
            extra_delivery in extras(),
            extra_application in vec((text(), prop_oneof![8 => primitive(), 1 => unusual_simple()]), 0..4),
            body in body(),
            footer in proptest::bool::weighted(0.05),
            order in Just((0..12).collect::<Vec<usize>>()).prop_shuffle(),
        ) -> Delivery {
            let mut message = event_to_message(&event, partition_key.as_deref());
            let mut unusual = false;
            // The header: as `event_to_message` made it, none, or any.
            if let Some(header) = header {
                message.header = header;
            }
            // Message annotations: the partition key as `event_to_message` wrote it (or of
            // another type), the system annotations, extras, in a shuffled order.
            let mut entries: Vec<(OwnedKey, Value)> = Vec::new();
            if let Some(annotations) = message.message_annotations.take() {
                entries.extend(annotations.0);
            }
            if let Some(value) = partition_key_value {
                entries.push((OwnedKey::from(PARTITION_KEY_ANNOTATION), value));
            }
            for (name, value) in [
                (SEQUENCE_NUMBER_ANNOTATION, sequence),
                (OFFSET_ANNOTATION, offset),
                (ENQUEUED_TIME_ANNOTATION, enqueued),
            ] {
                if let Some(value) = value {
                    entries.push((OwnedKey::from(name), value));
                }
            }
            for (key, value, odd) in extra_message {
                unusual |= odd;
                entries.push((key, value));
            }
            let mut shuffled: Vec<(OwnedKey, Value)> = Vec::new();
            for at in order {
                if let Some(entry) = entries.get(at) {
                    shuffled.push(entry.clone());
                }
            }
            shuffled.extend(entries.into_iter().skip(12));
            let message_annotations = (!shuffled.is_empty())
                .then(|| MessageAnnotations(shuffled.into_iter().collect::<Annotations>()));
            // Delivery annotations: the runtime metric, complete or not, and extras (a sender's
            // own, which the general path keeps with the event: never the fast path).
            let delivery_annotations = delivery_annotations.map(|(sequence, offset, time, retrieved)| {
                let mut annotations = Annotations::new();
                for (name, value) in [
                    ("last_enqueued_sequence_number", sequence),
                    ("last_enqueued_offset", offset),
                    ("last_enqueued_time_utc", time),
                    ("runtime_info_retrieval_time_utc", retrieved),
                ] {
                    if let Some(value) = value {
                        annotations.insert(OwnedKey::from(name), value);
                    }
                }
                for (key, value, _) in &extra_delivery {
                    unusual = true;
                    annotations.insert(key.clone(), value.clone());
                }
                DeliveryAnnotations(annotations)
            });
            // Properties: the ids `event_to_message` wrote, or every field set otherwise.
            if let Some(mut fields) = ids {
                fields.content_type = message
                    .properties
                    .as_ref()
                    .and_then(|p| p.content_type.clone());
                message.properties = Some(fields);
            }
            // Application properties of the types `event_to_message` leaves out too.
            for (key, value) in extra_application {
                let value = SimpleValue::try_from(value).expect("no compound values here");
                unusual |= matches!(value, SimpleValue::Described(_) | SimpleValue::Decimal32(_));
                message
                    .application_properties
                    .get_or_insert_with(ApplicationProperties::default)
                    .0
                    .insert(key, value);
            }
            let mut bytes = Vec::new();
            let mut put = |section: Vec<u8>| bytes.extend(section);
            if let Some(header) = &message.header {
                put(serde_amqp::to_vec(header).unwrap());
            }
            if let Some(annotations) = &delivery_annotations {
                put(serde_amqp::to_vec(annotations).unwrap());
            }
            if let Some(annotations) = &message_annotations {
                put(serde_amqp::to_vec(annotations).unwrap());
            }
            if let Some(properties) = &message.properties {
                put(serde_amqp::to_vec(properties).unwrap());
            }
            if let Some(application) = &message.application_properties {
                put(serde_amqp::to_vec(application).unwrap());
            }
            match body {
                BodyShape::Data(sections) => {
                    for section in sections {
                        put(serde_amqp::to_vec(&Data(Binary::from(section))).unwrap());
                    }
                }
                BodyShape::Value(value) => {
                    unusual = true;
                    put(serde_amqp::to_vec(&AmqpValue(value)).unwrap());
                }
                BodyShape::Sequence(sequences) => {
                    unusual = true;
                    for sequence in sequences {
                        put(serde_amqp::to_vec(&AmqpSequence(sequence)).unwrap());
                    }
                }
            }
            if footer {
                unusual = true;
                let mut annotations = Annotations::new();
                annotations.insert(OwnedKey::from("x-footer"), Value::Int(1));
                put(serde_amqp::to_vec(&Footer(annotations)).unwrap());
            }
            Delivery { bytes, unusual }
        }
    }

    /// The property every input must have: no panic; well-formed bytes decode as the existing
    /// path decodes them; bytes that are not are an error.
    fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
        let ours = decode_received_bytes(bytes, NOW);
        if well_formed(bytes) {
            let theirs = existing(bytes);
            prop_assert!(same(&ours, &theirs), "ours {:?}\ntheirs {:?}", ours, theirs);
        } else {
            prop_assert!(
                matches!(ours, Err(MessageError::Malformed(_))),
                "{:?}",
                ours
            );
        }
        Ok(())
    }

    /// Frames `elements` (already encoded) as a list, a map (the same bytes: the caller makes
    /// the count even) or an array (`element` is then the element constructor, which the
    /// elements do not repeat), in the short form when it fits.
    fn framed(constructor8: u8, count: usize, element: &[u8], elements: &[u8]) -> Vec<u8> {
        let body = element.len() + elements.len();
        let mut out = Vec::new();
        match (u8::try_from(body + 1), u8::try_from(count)) {
            (Ok(size), Ok(count)) => out.extend_from_slice(&[constructor8, size, count]),
            _ => {
                out.push(constructor8 + 0x10);
                out.extend_from_slice(&u32::try_from(body + 4).unwrap().to_be_bytes());
                out.extend_from_slice(&u32::try_from(count).unwrap().to_be_bytes());
            }
        }
        out.extend_from_slice(element);
        out.extend_from_slice(elements);
        out
    }

    /// Any encoded value, framed by hand: primitives, lists, maps, described values, and arrays
    /// of every kind — including those `serde_amqp` misframes (of lists, of described values,
    /// empty with an element constructor).
    fn raw_value() -> BoxedStrategy<Vec<u8>> {
        let leaf = primitive().prop_map(|v| serde_amqp::to_vec(&v).unwrap());
        let array_of_longs = vec(any::<i64>(), 0..4).prop_map(|longs| {
            let bytes: Vec<u8> = longs.iter().flat_map(|v| v.to_be_bytes()).collect();
            framed(0xe0, longs.len(), &[0x81], &bytes)
        });
        let array_of_strings = vec("[a-z]{0,5}", 1..4).prop_map(|strings| {
            let mut bytes = Vec::new();
            for s in &strings {
                bytes.push(u8::try_from(s.len()).unwrap());
                bytes.extend_from_slice(s.as_bytes());
            }
            framed(0xe0, strings.len(), &[0xa1], &bytes)
        });
        let array_of_described = vec(any::<i8>(), 1..4).prop_map(|bytes| {
            let bytes: Vec<u8> = bytes.iter().map(|b| b.to_be_bytes()[0]).collect();
            framed(0xe0, bytes.len(), &[0x00, 0x53, 0x09, 0x55], &bytes)
        });
        let empty_with_constructor = prop_oneof![Just(0x40u8), Just(0x55), Just(0xa1), Just(0xc0)]
            .prop_map(|element| framed(0xe0, 0, &[element], &[]));
        let leaf = prop_oneof![
            8 => leaf,
            1 => array_of_longs,
            1 => array_of_strings,
            1 => array_of_described,
            1 => empty_with_constructor,
            1 => Just(vec![0xe0, 1, 0]),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..4).prop_map(|items| framed(
                    0xc0,
                    items.len(),
                    &[],
                    &items.concat()
                )),
                vec((inner.clone(), inner.clone()), 0..3).prop_map(|entries| {
                    let count = entries.len() * 2;
                    let bytes: Vec<u8> = entries
                        .into_iter()
                        .flat_map(|(k, v)| k.into_iter().chain(v))
                        .collect();
                    framed(0xc1, count, &[], &bytes)
                }),
                (any::<u8>(), inner.clone()).prop_map(|(code, value)| {
                    let mut out = vec![0x00, 0x53, code];
                    out.extend(value);
                    out
                }),
                // An array of lists.
                vec(vec(inner, 0..3), 1..3).prop_map(|lists| {
                    let mut bytes = Vec::new();
                    for items in &lists {
                        let list = framed(0xc0, items.len(), &[], &items.concat());
                        bytes.extend_from_slice(&list[1..]);
                    }
                    framed(0xe0, lists.len(), &[0xc0], &bytes)
                }),
            ]
        })
        .boxed()
    }

    #[test]
    fn an_owned_payload_decodes_alike_and_lends_its_single_data_section_as_the_body() {
        let mut out = Vec::new();
        let mut map = MapSection::start(&mut out, section::MESSAGE_ANNOTATIONS);
        map.entry(SEQUENCE_NUMBER_ANNOTATION, true, |v| v.long(7));
        map.entry(OFFSET_ANNOTATION, true, |v| v.string("70"));
        map.entry(ENQUEUED_TIME_ANNOTATION, true, |v| v.timestamp(100));
        map.finish();
        write_data_section(&mut out, b"the body");
        let payload = Bytes::from(out.clone());
        let owned = decode_received_owned(payload.clone(), NOW);
        assert!(same(&owned, &decode_received_bytes(&out, NOW)));
        let (event, _) = owned.unwrap();
        assert_eq!(&event.data.body[..], b"the body");
        assert!(
            payload.as_ptr_range().contains(&event.data.body.as_ptr()),
            "the body was copied"
        );
        // Two data sections are one body: joined, so copied.
        write_data_section(&mut out, b", more");
        let (event, _) = decode_received_owned(Bytes::from(out), NOW).unwrap();
        assert_eq!(&event.data.body[..], b"the body, more");
    }

    /// A hub's message with `raw` as the value of an extra message annotation.
    fn with_raw_annotation(raw: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut map = MapSection::start(&mut out, section::MESSAGE_ANNOTATIONS);
        map.entry(SEQUENCE_NUMBER_ANNOTATION, true, |v| v.long(1));
        map.entry("x-raw", true, |v| v.encoded(raw));
        map.entry(OFFSET_ANNOTATION, true, |v| v.string("10"));
        map.entry(ENQUEUED_TIME_ANNOTATION, true, |v| v.timestamp(100));
        map.finish();
        write_data_section(&mut out, b"body");
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        /// Every message decodes as the existing path decodes it; the ones in the shapes the
        /// hub sends take the fast path.
        #[test]
        fn received_bytes_decode_as_the_existing_path_does(delivery in delivery()) {
            let ours = decode_received_bytes(&delivery.bytes, NOW);
            let theirs = existing(&delivery.bytes);
            prop_assert!(same(&ours, &theirs), "ours {:?}\ntheirs {:?}", ours, theirs);
            prop_assert!(well_formed(&delivery.bytes));
            if !delivery.unusual && theirs.is_ok() {
                prop_assert!(fast(&delivery.bytes, NOW).is_ok(), "{:x?}", delivery.bytes);
            }
        }

        /// Damaged messages never panic: the well-formed ones decode as the existing path
        /// decodes them, the others are errors.
        #[test]
        fn received_bytes_damaged_never_panic(
            delivery in delivery(),
            damages in vec(damage(), 1..3),
        ) {
            let mut bytes = delivery.bytes;
            for damage in &damages {
                damage.apply(&mut bytes);
            }
            check(&bytes)?;
        }

        /// Values of every shape, arrays `serde_amqp` misframes included, in an annotation
        /// and damaged: never a panic, never a disagreement on well-formed bytes.
        #[test]
        fn received_bytes_values_of_every_shape_never_panic(
            raw in raw_value(),
            damages in vec(damage(), 0..3),
        ) {
            let mut bytes = with_raw_annotation(&raw);
            for damage in &damages {
                damage.apply(&mut bytes);
            }
            check(&bytes)?;
        }

        /// Arbitrary bytes never panic either.
        #[test]
        fn received_bytes_arbitrary_never_panic(bytes in vec(any::<u8>(), 0..512)) {
            check(&bytes)?;
            // Behind a valid section descriptor, so more of them get past the first byte.
            let mut prefixed = vec![0x00, 0x53, 0x72];
            prefixed.extend(&bytes);
            check(&prefixed)?;
        }
    }

    /// A message annotation: its name, and what writes its value.
    type Annotation<'a> = (&'a str, &'a dyn Fn(ValueWriter<'_>));

    /// A hub's message: these message annotations, two application properties, one data
    /// section.
    fn hub_message(annotations: &[Annotation<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut map = MapSection::start(&mut out, section::MESSAGE_ANNOTATIONS);
        for (name, value) in annotations {
            map.entry(name, true, value);
        }
        map.finish();
        let mut application = MapSection::start(&mut out, section::APPLICATION_PROPERTIES);
        application.entry("kind", false, |v| v.string("order"));
        application.entry("amount", false, |v| v.long(42));
        application.finish();
        write_data_section(&mut out, b"hello");
        out
    }

    #[test]
    fn received_bytes_missing_or_unusable_system_annotations_fail_as_the_existing_path_fails() {
        let sequence = |v: ValueWriter<'_>| v.long(5);
        let offset = |v: ValueWriter<'_>| v.string("4096");
        let time = |v: ValueWriter<'_>| v.timestamp(7);
        let bad_string = |v: ValueWriter<'_>| v.string("x");
        let bad_bool = |v: ValueWriter<'_>| v.encoded(&[0x41]);
        let negative = |v: ValueWriter<'_>| v.long(-1);
        let cases: Vec<Vec<u8>> = vec![
            hub_message(&[
                (OFFSET_ANNOTATION, &offset),
                (ENQUEUED_TIME_ANNOTATION, &time),
            ]),
            hub_message(&[
                (SEQUENCE_NUMBER_ANNOTATION, &sequence),
                (ENQUEUED_TIME_ANNOTATION, &time),
            ]),
            hub_message(&[
                (SEQUENCE_NUMBER_ANNOTATION, &sequence),
                (OFFSET_ANNOTATION, &offset),
            ]),
            hub_message(&[
                (SEQUENCE_NUMBER_ANNOTATION, &bad_bool),
                (OFFSET_ANNOTATION, &offset),
                (ENQUEUED_TIME_ANNOTATION, &time),
            ]),
            hub_message(&[
                (SEQUENCE_NUMBER_ANNOTATION, &bad_string),
                (OFFSET_ANNOTATION, &offset),
                (ENQUEUED_TIME_ANNOTATION, &time),
            ]),
            hub_message(&[
                (SEQUENCE_NUMBER_ANNOTATION, &sequence),
                (OFFSET_ANNOTATION, &negative),
                (ENQUEUED_TIME_ANNOTATION, &time),
            ]),
            hub_message(&[
                (SEQUENCE_NUMBER_ANNOTATION, &sequence),
                (OFFSET_ANNOTATION, &offset),
                (ENQUEUED_TIME_ANNOTATION, &bad_string),
            ]),
            // No message annotations at all.
            {
                let mut out = Vec::new();
                write_data_section(&mut out, b"x");
                out
            },
            // Nothing at all.
            Vec::new(),
        ];
        for bytes in cases {
            let ours = decode_received_bytes(&bytes, NOW).unwrap_err();
            let theirs = existing(&bytes).unwrap_err();
            assert!(matches!(ours, MessageError::Malformed(_)), "{ours}");
            assert_eq!(ours.to_string(), theirs.to_string());
        }
    }

    #[test]
    fn received_bytes_complete_system_annotations_take_the_fast_path() {
        let sequence = |v: ValueWriter<'_>| v.long(5);
        let offset = |v: ValueWriter<'_>| v.string("4096");
        let time = |v: ValueWriter<'_>| v.timestamp(7);
        let complete = hub_message(&[
            (PARTITION_KEY_ANNOTATION, &|v| v.string("device-1")),
            (SEQUENCE_NUMBER_ANNOTATION, &sequence),
            (OFFSET_ANNOTATION, &offset),
            (ENQUEUED_TIME_ANNOTATION, &time),
        ]);
        let (event, last) = fast(&complete, NOW).unwrap();
        assert!(same(&Ok((event.clone(), last)), &existing(&complete)));
        assert_eq!(
            (event.sequence_number, event.offset, event.enqueued_time_ms),
            (5, 4096, 7)
        );
        assert_eq!(event.data.partition_key.as_deref(), Some("device-1"));
        assert_eq!(event.data.body, Bytes::from_static(b"hello"));
        assert_eq!(
            event.data.properties,
            vec![
                ("kind".into(), PropertyValue::String("order".into())),
                ("amount".into(), PropertyValue::Int64(42)),
            ]
        );
    }

    proptest! {
        /// The annotations the hub writes are read as laid out, to what the walker reads and
        /// with the reader left where the walker leaves it.
        #[test]
        fn the_hubs_annotations_are_read_as_delivered(
            data in event(),
            partition_key in option::of(text()),
            sequence_number in any::<i64>(),
            offset in any::<u64>(),
            enqueued_time_ms in any::<i64>(),
        ) {
            // The hub stores each property key once.
            let mut data = data;
            let mut seen = std::collections::HashSet::new();
            data.properties.retain(|(key, _)| seen.insert(key.clone()));
            let event = ReceivedEvent {
                sequence_number,
                offset,
                enqueued_time_ms,
                data: EventData { partition_key, ..data },
            };
            let mut bytes = Vec::new();
            crate::deliver::write_delivery_message(&event, None, &mut bytes);
            let mut reader = Reader::new(&bytes);
            prop_assert_eq!(next_section(&mut reader).ok(), Some(Some(MESSAGE_ANNOTATIONS)));
            let mut walked = reader.clone();
            let as_delivered = message_annotations_as_delivered(&mut reader);
            let walked_annotations = message_annotations_walked(&mut walked).ok();
            prop_assert_eq!(&as_delivered, &walked_annotations);
            prop_assert!(as_delivered.is_some());
            prop_assert_eq!(reader.position(), walked.position());
            let (decoded, _) = decode_received_bytes(&bytes, NOW).unwrap();
            prop_assert_eq!(
                (decoded.sequence_number, decoded.offset, decoded.enqueued_time_ms),
                (sequence_number, offset, enqueued_time_ms)
            );
            prop_assert_eq!(decoded.data.partition_key, event.data.partition_key);
        }
    }

    /// Annotations of another layout leave the reader where it was, for the walker.
    #[test]
    fn annotations_in_another_order_are_walked() {
        let sequence = |v: ValueWriter<'_>| v.long(5);
        let offset = |v: ValueWriter<'_>| v.string("4096");
        let time = |v: ValueWriter<'_>| v.timestamp(7);
        let reordered = hub_message(&[
            (OFFSET_ANNOTATION, &offset),
            (SEQUENCE_NUMBER_ANNOTATION, &sequence),
            (ENQUEUED_TIME_ANNOTATION, &time),
        ]);
        let mut reader = Reader::new(&reordered);
        assert_eq!(
            next_section(&mut reader).ok(),
            Some(Some(MESSAGE_ANNOTATIONS))
        );
        let before = reader.position();
        assert_eq!(message_annotations_as_delivered(&mut reader), None);
        assert_eq!(reader.position(), before);
        let (event, _) = fast(&reordered, NOW).unwrap();
        assert_eq!(
            (event.sequence_number, event.offset, event.enqueued_time_ms),
            (5, 4096, 7)
        );
    }

    #[test]
    fn received_bytes_repeated_keys_keep_their_first_place_and_last_value() {
        let mut out = Vec::new();
        let mut map = MapSection::start(&mut out, section::MESSAGE_ANNOTATIONS);
        map.entry(SEQUENCE_NUMBER_ANNOTATION, true, |v| v.long(1));
        map.entry(OFFSET_ANNOTATION, true, |v| v.string("10"));
        map.entry(ENQUEUED_TIME_ANNOTATION, true, |v| v.timestamp(100));
        map.entry(SEQUENCE_NUMBER_ANNOTATION, true, |v| v.long(2));
        map.finish();
        let mut application = MapSection::start(&mut out, section::APPLICATION_PROPERTIES);
        for i in 0..40 {
            application.entry(&format!("k{}", i % 20), false, |v| v.long(i));
        }
        application.entry("k3", false, |v| v.string("last"));
        application.finish();
        write_data_section(&mut out, b"a");
        write_data_section(&mut out, b"b");
        let ours = fast(&out, NOW).unwrap();
        assert!(same(&Ok(ours.clone()), &existing(&out)));
        let (event, _) = ours;
        assert_eq!(event.sequence_number, 2);
        assert_eq!(event.data.properties.len(), 20);
        assert_eq!(
            event.data.properties[3],
            ("k3".into(), PropertyValue::String("last".into()))
        );
        assert_eq!(
            event.data.properties[4],
            ("k4".into(), PropertyValue::Int64(24))
        );
        assert_eq!(event.data.body, Bytes::from_static(b"ab"));
    }

    #[test]
    fn received_bytes_runtime_metric_and_long_descriptors() {
        let mut out = Vec::new();
        let mut map = MapSection::start(&mut out, section::DELIVERY_ANNOTATIONS);
        map.entry("last_enqueued_sequence_number", true, |v| v.long(9));
        map.entry("last_enqueued_offset", true, |v| v.string("900"));
        map.entry("last_enqueued_time_utc", true, |v| v.timestamp(5));
        map.finish();
        let mut map = MapSection::start(&mut out, section::MESSAGE_ANNOTATIONS);
        map.entry(SEQUENCE_NUMBER_ANNOTATION, true, |v| v.long(1));
        map.entry(OFFSET_ANNOTATION, true, |v| v.string("10"));
        map.entry(ENQUEUED_TIME_ANNOTATION, true, |v| v.timestamp(100));
        map.finish();
        // A data section whose descriptor is a full-width ulong.
        out.extend_from_slice(&[0x00, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x75, 0xa0, 1, b'z']);
        let ours = fast(&out, NOW).unwrap();
        assert!(same(&Ok(ours.clone()), &existing(&out)));
        assert_eq!(
            ours.1,
            Some(LastEnqueued {
                sequence_number: 9,
                offset: Some(900),
                enqueued_time_ms: Some(5),
                retrieved_time_ms: NOW,
            })
        );
        assert_eq!(ours.0.data.body, Bytes::from_static(b"z"));
    }

    #[test]
    fn received_bytes_arrays_the_reference_misframes_are_errors() {
        let misframed: &[&[u8]] = &[
            // Two lists, two maps, two described longs, two arrays.
            &[0xe0, 10, 2, 0xc0, 3, 1, 0x55, 1, 3, 1, 0x55, 2],
            &[
                0xe0, 14, 2, 0xc1, 5, 2, 0xa3, 1, b'k', 0x41, 5, 2, 0xa3, 1, b'j', 0x42,
            ],
            &[0xe0, 7, 2, 0x00, 0x53, 0x09, 0x55, 1, 2],
            &[0xe0, 11, 2, 0xe0, 4, 1, 0x55, 1, 4, 1, 0x55, 2],
            // Empty, with an element constructor.
            &[0xe0, 2, 0, 0x55],
        ];
        for raw in misframed {
            let bytes = with_raw_annotation(raw);
            let ours = decode_received_bytes(&bytes, NOW);
            assert!(
                matches!(ours, Err(MessageError::Malformed(_))),
                "{raw:x?}: {ours:?}"
            );
            // The existing path fails on them too (or panics: it is not asked here).
        }
        // In a list, an empty array whose stray constructor (list32) has `serde_amqp` read
        // the binary after it as a list — of thousands of nested lists, were it not refused.
        let mut content = vec![0, 0, 1];
        while content.len() < 40 * 256 - 3 {
            content.extend_from_slice(&[0xc0, 0x01, 0x01]);
        }
        content.resize(40 * 256, 0x40);
        let mut binary = vec![0xb0];
        binary.extend_from_slice(&u32::try_from(content.len()).unwrap().to_be_bytes());
        binary.extend_from_slice(&content);
        let mut items = vec![0xe0, 2, 0, 0xd0];
        items.extend_from_slice(&binary);
        let bomb = framed(0xc0, 2, &[], &items);
        let out = with_raw_annotation(&bomb);
        let ours = decode_received_bytes(&out, NOW).unwrap_err();
        assert!(ours.to_string().contains("empty array"), "{ours}");
        // Arrays of primitives decode as the existing path decodes them.
        let fine = with_raw_annotation(&[0xe0, 4, 2, 0x55, 1, 2]);
        let ours = decode_received_bytes(&fine, NOW);
        assert!(ours.is_ok(), "{ours:?}");
        assert!(same(&ours, &existing(&fine)));
    }

    #[test]
    fn received_bytes_deep_nesting_is_refused_without_overflowing_the_stack() {
        let nested = |depth: usize| {
            let mut value = vec![0x40];
            for _ in 0..depth {
                let mut outer = vec![0xd0];
                outer.extend_from_slice(&u32::try_from(value.len() + 4).unwrap().to_be_bytes());
                outer.extend_from_slice(&1u32.to_be_bytes());
                outer.extend(value);
                value = outer;
            }
            let mut out = Vec::new();
            let mut map = MapSection::start(&mut out, section::MESSAGE_ANNOTATIONS);
            map.entry(SEQUENCE_NUMBER_ANNOTATION, true, |v| v.long(1));
            map.entry(OFFSET_ANNOTATION, true, |v| v.string("10"));
            map.entry(ENQUEUED_TIME_ANNOTATION, true, |v| v.timestamp(100));
            map.entry("x-deep", true, |v| v.encoded(&value));
            map.finish();
            out
        };
        // As deep as the check allows, the general path decodes it.
        let deepest = nested(tributary_amqp_codec::value::NESTING_DEPTH_MAX - 2);
        let ours = decode_received_bytes(&deepest, NOW);
        assert!(ours.is_ok(), "{ours:?}");
        assert!(same(&ours, &existing(&deepest)));
        // Far deeper is an error, not a stack overflow in the general path.
        let ours = decode_received_bytes(&nested(5_000), NOW).unwrap_err();
        assert!(ours.to_string().contains("nested too deeply"), "{ours}");
    }
}
