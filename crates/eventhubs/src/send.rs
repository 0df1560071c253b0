//! Send: events → the bytes of one transfer, as a producer sends them.
//!
//! An [`EventData`] becomes one AMQP message: the body as one `data` section, the application
//! properties with their AMQP types (the [`property`](crate::property) twins), message id,
//! correlation id (as strings) and content type (a symbol) in `properties`, and the partition
//! key as the `x-opt-partition-key` message annotation (with `header.durable = true`, as the
//! Python SDK sends it). More than one event travel as one batch: a transfer with message format
//! [`BATCH_MESSAGE_FORMAT`] whose `data` sections each hold one complete encoded message, with
//! the partition key also on the envelope. The hub stores a batch all or nothing. Delivery
//! annotations an event carries in its kept protocol sections (a received event's, which a
//! replication task forwards) are sent as its message's last section, where pyamqp writes them
//! and where Event Hubs and Tributary take them; nothing else of the kept sections is sent.
//! [`encode_outgoing`] writes these bytes directly, section by section, byte for byte what
//! `serde_amqp` makes of the same `fe2o3-amqp` message: building and serializing that message
//! cost the producer one to two microseconds of CPU per event, some twenty times what writing
//! the bytes takes.
//!
//! Nothing here panics: a value too long for AMQP is a [`MessageError::TooLong`].

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use tributary_amqp_codec::message::{ValueWriter, section};
use tributary_event::{EventData, PropertyValue, SmolStr, repeats_a_property_key};

use crate::message::MessageError;
use crate::names::BATCH_MESSAGE_FORMAT;
use crate::names::annotation::PARTITION_KEY as PARTITION_KEY_ANNOTATION;
use crate::scan::{SectionKind, encoded_section};

mod stamp;
pub use stamp::{Stamp, StampValue, StampValues, Stamped};

/// The stamp one message carries, with its values, if any.
pub type MessageStamp<'a> = Option<(&'a Stamp, &'a [StampValue])>;

/// The descriptor code of the `header` section (the codec's [`section`] codes are those the
/// server writes, and it writes no header).
const HEADER_SECTION: u8 = 0x70;

/// The `header` section of a message with a partition key, as `serde_amqp` writes
/// `Header { durable: true, .. }`: a `list8` of the one field before those left at their
/// defaults.
const DURABLE_HEADER: [u8; 7] = [0x00, 0x53, HEADER_SECTION, 0xc0, 0x02, 0x01, 0x41];

/// `null`.
const NULL: u8 = 0x40;
/// `vbin8`, `str8-utf8`, `sym8`: a binary, string or symbol with a one-byte length.
const VBIN8: u8 = 0xa0;
const STR8: u8 = 0xa1;
const SYM8: u8 = 0xa3;
/// `list8`, `map8`: a list or map with a one-byte size and count.
const LIST8: u8 = 0xc0;
const MAP8: u8 = 0xc1;
/// What turns a one-byte-length constructor above into its four-byte-length twin (`vbin32`,
/// `str32-utf8`, `sym32`, `list32`, `map32`).
const WIDE: u8 = 0x10;

/// The most bytes `serde_amqp` writes behind a one-byte length: of a binary, string or symbol,
/// or of a list's or map's elements. One fewer than the byte could say: for exactly 255 it takes
/// the four-byte form, and so must this encoder to write the same bytes.
const SHORT_MAX: usize = 254;

/// The most bytes `serde_amqp` encodes behind a four-byte length; it refuses more.
const LONG_MAX: u32 = u32::MAX - 4;

/// For reserving capacity: about what a message takes beyond its body, ids and properties
/// (section descriptors and headers, the four null fields of `properties`, the batch's `data`
/// section around it), and about what one application property takes.
const MESSAGE_OVERHEAD_ESTIMATE: usize = 64;
const PROPERTY_ESTIMATE: usize = 32;

/// The payload and message format of the transfer for `events` (one event: its own message,
/// format 0; more: the batch envelope, [`BATCH_MESSAGE_FORMAT`]), written straight into bytes.
///
/// The bytes are those `encode_message` makes of the message `outgoing` builds for the same
/// arguments, byte for byte (property-tested), without building it: each section is written in
/// turn, a list's or map's size and count patched in once its elements are written, and each
/// message of a batch is written straight into its envelope's `data` section, whose length is
/// patched in the same way. The header and partition-key annotation, the same for every message
/// of a batch and for its envelope, are written once and copied. Fixed-width values are written
/// with the `tributary-amqp-codec` [`ValueWriter`]; binaries, strings, symbols, lists and maps
/// with the helpers below, because the codec's writers differ from `serde_amqp` where it
/// matters here: a binary, string or symbol of exactly 255 bytes takes the codec's
/// one-byte-length form but `serde_amqp`'s four-byte one (and the codec's `MapSection` and
/// `ListSection` write keys and fields that way), and one too long for any AMQP encoding is a
/// panic there but must be an error here.
///
/// No event falls back to the serde path. Application properties that repeat a key (an
/// `EventData` whose keys are not unique) are written as the map `event_to_message` builds
/// holds them: each key once, where it first appears, with its last value.
///
/// # Errors
/// [`MessageError::TooLong`] where the serde path fails too: a string, body, section or
/// batched message longer than `u32::MAX - 4` bytes, which no AMQP encoding holds. Never panics.
pub fn encode_outgoing(
    events: &[EventData],
    partition_key: Option<&str>,
) -> Result<(Vec<u8>, u32), MessageError> {
    encode_outgoing_stamped(events, None, partition_key)
}

/// [`encode_outgoing`] for events sent with a [`Stamp`]: each message the events make carries,
/// after its event's own application properties, the stamp's, with the values
/// `stamped.values` gives for it (a message it gives none for carries its own only). The
/// bytes are those `encode_outgoing` writes for the events holding the stamp's properties
/// themselves, appended to their own.
///
/// # Errors
/// As [`encode_outgoing`].
pub fn encode_outgoing_stamped(
    events: &[EventData],
    stamped: Option<Stamped<'_>>,
    partition_key: Option<&str>,
) -> Result<(Vec<u8>, u32), MessageError> {
    let mut values = stamped
        .map(|stamped| stamped.value_slots())
        .unwrap_or_default();
    let stamp_estimate = stamped.map_or(0, |stamped| {
        let fixed = usize::try_from(stamped.stamp.bytes_at_most(0)).unwrap_or(usize::MAX);
        fixed.saturating_add(values.len().saturating_mul(PROPERTY_ESTIMATE))
    });
    let prefix_estimate = partition_key.map_or(0, |key| {
        key.len()
            .saturating_add(DURABLE_HEADER.len())
            .saturating_add(PARTITION_KEY_ANNOTATION.len() + 24)
    });
    let mut out = Vec::new();
    if let [event] = events {
        reserve(
            &mut out,
            prefix_estimate
                .saturating_add(estimated_len(event))
                .saturating_add(stamp_estimate),
        );
        write_prefix(&mut out, partition_key)?;
        write_message(&mut out, event, stamp_of(stamped, 0, &mut values))?;
        return Ok((out, 0));
    }
    let estimate = events.iter().fold(prefix_estimate, |sum, event| {
        sum.saturating_add(prefix_estimate)
            .saturating_add(estimated_len(event))
            .saturating_add(stamp_estimate)
    });
    reserve(&mut out, estimate);
    write_prefix(&mut out, partition_key)?;
    let prefix_len = out.len();
    for (index, event) in events.iter().enumerate() {
        let stamp = stamp_of(stamped, index, &mut values);
        write_batched(&mut out, event, stamp, prefix_len)?;
    }
    Ok((out, BATCH_MESSAGE_FORMAT))
}

/// The stamp message `index` carries: `stamped`'s, with the values it gives for the message
/// written into `values`; none if it gives none.
fn stamp_of<'a>(
    stamped: Option<Stamped<'a>>,
    index: usize,
    values: &'a mut [StampValue],
) -> MessageStamp<'a> {
    let stamped = stamped?;
    stamped
        .values
        .values(index, values)
        .then_some((stamped.stamp, &*values))
}

/// Measures, exactly, how many bytes events take in a batch [`encode_outgoing`] writes for one
/// partition key, so a sender can cut batches by a hub's `max-message-size` before it sends
/// (as the SDKs' `EventDataBatch.try_add` does) instead of learning from a refusal.
///
/// [`BatchSizer::envelope_bytes`] plus the sum of [`BatchSizer::event_bytes`] over a batch's
/// events is the length of the payload `encode_outgoing` returns for two or more of them; for a
/// single event the payload is smaller (no envelope), so a cut made with these figures is never
/// too large.
#[derive(Debug)]
pub struct BatchSizer {
    prefix_len: usize,
    scratch: Vec<u8>,
}

impl BatchSizer {
    /// A sizer for batches sent with `partition_key` (or without one).
    ///
    /// # Errors
    /// [`MessageError::TooLong`] for a key no AMQP string holds.
    pub fn new(partition_key: Option<&str>) -> Result<BatchSizer, MessageError> {
        let mut scratch = Vec::new();
        write_prefix(&mut scratch, partition_key)?;
        Ok(BatchSizer {
            prefix_len: scratch.len(),
            scratch,
        })
    }

    /// The bytes of the batch envelope itself: its header and partition-key annotation.
    pub fn envelope_bytes(&self) -> u64 {
        self.prefix_len as u64
    }

    /// The bytes `event` adds to the batch: its `data` section holding its complete message.
    ///
    /// # Errors
    /// [`MessageError::TooLong`] where [`encode_outgoing`] fails for the event.
    pub fn event_bytes(&mut self, event: &EventData) -> Result<u64, MessageError> {
        self.event_bytes_stamped(event, None)
    }

    /// [`event_bytes`](Self::event_bytes) for `event` sent with `stamp` and its values.
    ///
    /// # Errors
    /// [`MessageError::TooLong`] where [`encode_outgoing_stamped`] fails for the event.
    pub fn event_bytes_stamped(
        &mut self,
        event: &EventData,
        stamp: MessageStamp<'_>,
    ) -> Result<u64, MessageError> {
        self.scratch.truncate(self.prefix_len);
        write_message(&mut self.scratch, event, stamp)?;
        let message_len = self.scratch.len();
        // The `data` descriptor (3 bytes) and a vbin8 (2) or vbin32 (5) header.
        let header_len = if message_len <= SHORT_MAX { 5 } else { 8 };
        Ok((message_len + header_len) as u64)
    }

    /// At least what [`event_bytes`](Self::event_bytes) gives for `event`, without encoding
    /// it: every length taken in its four-byte form and every value at its widest. A caller
    /// whose events fit a batch by these figures need not measure them one by one; where they
    /// do not, it measures (the bound is up to about 9 bytes a field too large).
    pub fn event_bytes_at_most(&self, event: &EventData) -> u64 {
        self.event_bytes_at_most_stamped(event, None)
    }

    /// [`event_bytes_at_most`](Self::event_bytes_at_most) for `event` sent with `stamp`, each
    /// of whose values' texts takes at most `stamp.1` bytes (the values themselves are not
    /// needed).
    pub fn event_bytes_at_most_stamped(
        &self,
        event: &EventData,
        stamp: Option<(&Stamp, usize)>,
    ) -> u64 {
        /// A section's descriptor (3 bytes), and a list's or map's widest header: constructor,
        /// size and count (9).
        const SECTION: u64 = 3;
        const COMPOUND: u64 = 9;
        /// A string's, symbol's or binary's widest header: constructor and four-byte length.
        const VARIABLE: u64 = 5;
        fn variable(len: usize) -> u64 {
            VARIABLE + len as u64
        }
        let optional = |text: &Option<String>| text.as_ref().map_or(1, |text| variable(text.len()));
        let mut bytes = self.prefix_len as u64;
        if event.message_id.is_some()
            || event.correlation_id.is_some()
            || event.content_type.is_some()
        {
            // message-id, user-id, to, subject, reply-to, correlation-id, content-type.
            bytes += SECTION + COMPOUND + 4 + optional(&event.message_id);
            bytes += optional(&event.correlation_id) + optional(&event.content_type);
        }
        if let Some((stamp, value_bytes_max)) = stamp {
            bytes = bytes.saturating_add(stamp.bytes_at_most(value_bytes_max));
        }
        if !event.properties.is_empty() || stamp.is_some() {
            bytes += SECTION + COMPOUND;
            for (key, value) in &event.properties {
                bytes += variable(key.len());
                bytes += match value {
                    PropertyValue::Null | PropertyValue::Bool(_) => 2,
                    PropertyValue::Int32(_)
                    | PropertyValue::UInt32(_)
                    | PropertyValue::Float32(_) => 5,
                    PropertyValue::Int64(_)
                    | PropertyValue::UInt64(_)
                    | PropertyValue::Float64(_)
                    | PropertyValue::Timestamp(_) => 9,
                    PropertyValue::Uuid(_) => 17,
                    PropertyValue::String(text) => variable(text.len()),
                    PropertyValue::Bytes(data) => variable(data.len()),
                };
            }
        }
        bytes += SECTION + variable(event.body.len());
        bytes += kept_delivery_annotations(event).len() as u64;
        // The `data` section holding the message in the batch: descriptor and vbin32 header.
        bytes + SECTION + VARIABLE
    }
}

/// About how many bytes `event`'s message takes beyond the header and annotations: a guess for
/// reserving capacity, not a bound (the buffer grows past it if need be).
fn estimated_len(event: &EventData) -> usize {
    let ids = [
        &event.message_id,
        &event.correlation_id,
        &event.content_type,
    ]
    .into_iter()
    .fold(0usize, |sum, id| {
        sum.saturating_add(id.as_ref().map_or(0, String::len))
    });
    event
        .body
        .len()
        .saturating_add(ids)
        .saturating_add(event.properties.len().saturating_mul(PROPERTY_ESTIMATE))
        .saturating_add(MESSAGE_OVERHEAD_ESTIMATE)
}

/// Reserves `estimate` bytes if it can. An estimate past what can be allocated is no error
/// here: the buffer grows as it is written.
fn reserve(out: &mut Vec<u8>, estimate: usize) {
    if out.try_reserve(estimate).is_err() {
        tracing::debug!(
            estimate,
            "cannot reserve the estimated size of the events' encoding"
        );
    }
}

/// The sections every message for `partition_key` starts with, the batch envelope too: the
/// durable header and the partition-key annotation, or nothing without a key.
fn write_prefix(out: &mut Vec<u8>, partition_key: Option<&str>) -> Result<(), MessageError> {
    let Some(key) = partition_key else {
        return Ok(());
    };
    out.extend_from_slice(&DURABLE_HEADER);
    let annotations = Compound::start(out, section::MESSAGE_ANNOTATIONS, MAP8);
    write_variable(
        out,
        SYM8,
        PARTITION_KEY_ANNOTATION.as_bytes(),
        "the annotation key",
    )?;
    write_variable(out, STR8, key.as_bytes(), "the partition key")?;
    annotations.finish(out, 2, "the message annotations")
}

/// Appends `event`'s message after its prefix: `properties` and `application-properties` when
/// it has any, its body as one `data` section, and its kept delivery annotations last.
fn write_message(
    out: &mut Vec<u8>,
    event: &EventData,
    stamp: MessageStamp<'_>,
) -> Result<(), MessageError> {
    write_properties(out, event)?;
    write_application_properties(out, &event.properties, stamp)?;
    out.extend_from_slice(&[0x00, 0x53, section::DATA]);
    write_variable(out, VBIN8, &event.body, "the body")?;
    out.extend_from_slice(kept_delivery_annotations(event));
    Ok(())
}

/// The encoded delivery-annotations section among `event`'s kept protocol sections, or nothing.
fn kept_delivery_annotations(event: &EventData) -> &[u8] {
    event
        .protocol_sections
        .as_deref()
        .and_then(|kept| encoded_section(kept, SectionKind::DeliveryAnnotations))
        .unwrap_or_default()
}

/// Appends `event`'s complete message as a `data` section of the batch envelope in `out`, whose
/// first `prefix_len` bytes are the prefix every message starts with (see [`write_prefix`]).
fn write_batched(
    out: &mut Vec<u8>,
    event: &EventData,
    stamp: MessageStamp<'_>,
    prefix_len: usize,
) -> Result<(), MessageError> {
    // Room for a vbin32 header; moved down to a vbin8 one if the message is short enough.
    out.extend_from_slice(&[0x00, 0x53, section::DATA, VBIN8 + WIDE, 0, 0, 0, 0]);
    let message_at = out.len();
    let header_at = message_at - 5;
    out.extend_from_within(..prefix_len);
    write_message(out, event, stamp)?;
    let length = out.len() - message_at;
    if length <= SHORT_MAX {
        out[header_at] = VBIN8;
        out[header_at + 1] = length as u8;
        out.copy_within(message_at.., header_at + 2);
        out.truncate(header_at + 2 + length);
    } else {
        let length = long_length(length, "an event's message")?;
        out[header_at + 1..message_at].copy_from_slice(&length.to_be_bytes());
    }
    Ok(())
}

/// The `properties` section, if the event has a message id, correlation id or content type: a
/// list ending at the last field set — message-id (0) and correlation-id (5) strings,
/// content-type (6) a symbol — as `serde_amqp` writes `Properties`.
fn write_properties(out: &mut Vec<u8>, event: &EventData) -> Result<(), MessageError> {
    let fields = if event.content_type.is_some() {
        7
    } else if event.correlation_id.is_some() {
        6
    } else if event.message_id.is_some() {
        1
    } else {
        return Ok(());
    };
    let list = Compound::start(out, section::PROPERTIES, LIST8);
    write_optional_string(out, event.message_id.as_deref(), "the message id")?;
    if fields >= 6 {
        out.extend_from_slice(&[NULL; 4]); // user-id, to, subject, reply-to.
        write_optional_string(out, event.correlation_id.as_deref(), "the correlation id")?;
    }
    if let Some(content_type) = &event.content_type {
        write_variable(out, SYM8, content_type.as_bytes(), "the content type")?;
    }
    list.finish(out, fields, "the properties")
}

fn write_optional_string(
    out: &mut Vec<u8>,
    value: Option<&str>,
    what: &'static str,
) -> Result<(), MessageError> {
    match value {
        Some(text) => write_variable(out, STR8, text.as_bytes(), what),
        None => {
            out.push(NULL);
            Ok(())
        }
    }
}

/// The `application-properties` section, if the event has any or a stamp adds some: string
/// keys, each value of the AMQP twin [`crate::property::to_amqp`] gives it, then the stamp's.
fn write_application_properties(
    out: &mut Vec<u8>,
    properties: &[(SmolStr, PropertyValue)],
    stamp: MessageStamp<'_>,
) -> Result<(), MessageError> {
    let stamp = stamp.filter(|(stamp, _)| !stamp.is_empty());
    if properties.is_empty() && stamp.is_none() {
        return Ok(());
    }
    if let Some((stamp, values)) = stamp
        && stamp.clashes_with(properties)
    {
        // A key in both: the map holds it once, as it does for an event holding both.
        let mut all = properties.to_vec();
        all.extend(stamp.properties(values));
        return write_application_properties(out, &all, None);
    }
    let map = Compound::start(out, section::APPLICATION_PROPERTIES, MAP8);
    let entries = if repeats_a_property_key(properties) {
        let merged = merge_repeated_keys(properties);
        for (key, value) in &merged {
            write_property(out, key, value)?;
        }
        merged.len()
    } else {
        for (key, value) in properties {
            write_property(out, key, value)?;
        }
        properties.len()
    };
    let entries = match stamp {
        Some((stamp, values)) => {
            stamp.write(out, values)?;
            entries.saturating_add(stamp.len())
        }
        None => entries,
    };
    map.finish(out, entries.saturating_mul(2), "the application properties")
}

/// One application property: its key (a string) and its value, of the AMQP type
/// [`crate::property::to_amqp`] gives it.
fn write_property(out: &mut Vec<u8>, key: &str, value: &PropertyValue) -> Result<(), MessageError> {
    write_variable(out, STR8, key.as_bytes(), "an application property's key")?;
    match value {
        PropertyValue::Null => ValueWriter::new(out).null(),
        PropertyValue::Bool(v) => ValueWriter::new(out).bool(*v),
        PropertyValue::Int32(v) => ValueWriter::new(out).int(*v),
        PropertyValue::Int64(v) => ValueWriter::new(out).long(*v),
        PropertyValue::UInt32(v) => ValueWriter::new(out).uint(*v),
        PropertyValue::UInt64(v) => ValueWriter::new(out).ulong(*v),
        PropertyValue::Float32(v) => ValueWriter::new(out).float(*v),
        PropertyValue::Float64(v) => ValueWriter::new(out).double(*v),
        PropertyValue::Timestamp(v) => ValueWriter::new(out).timestamp(*v),
        PropertyValue::Uuid(v) => ValueWriter::new(out).uuid(v),
        PropertyValue::String(v) => {
            return write_variable(out, STR8, v.as_bytes(), "an application property");
        }
        PropertyValue::Bytes(v) => {
            return write_variable(out, VBIN8, v, "an application property");
        }
    }
    Ok(())
}

/// The application properties as inserting them in turn into `ApplicationProperties` (an
/// insertion-ordered map) leaves them: each key once, where it first appears, with its last
/// value.
fn merge_repeated_keys(properties: &[(SmolStr, PropertyValue)]) -> Vec<(&str, &PropertyValue)> {
    let mut merged: Vec<(&str, &PropertyValue)> = Vec::with_capacity(properties.len());
    let mut places: HashMap<&str, usize> = HashMap::with_capacity(properties.len());
    for (key, value) in properties {
        match places.entry(key.as_str()) {
            Entry::Occupied(place) => merged[*place.get()].1 = value,
            Entry::Vacant(place) => {
                place.insert(merged.len());
                merged.push((key, value));
            }
        }
    }
    merged
}

/// Appends a binary (`constructor8` [`VBIN8`]), string ([`STR8`]) or symbol ([`SYM8`]) in the
/// form `serde_amqp` chooses: a one-byte length up to [`SHORT_MAX`] bytes, else four bytes.
fn write_variable(
    out: &mut Vec<u8>,
    constructor8: u8,
    bytes: &[u8],
    what: &'static str,
) -> Result<(), MessageError> {
    match u8::try_from(bytes.len()) {
        Ok(length) if usize::from(length) <= SHORT_MAX => {
            out.extend_from_slice(&[constructor8, length]);
        }
        _ => {
            let length = long_length(bytes.len(), what)?;
            out.push(constructor8 + WIDE);
            out.extend_from_slice(&length.to_be_bytes());
        }
    }
    out.extend_from_slice(bytes);
    Ok(())
}

/// A length for a four-byte length field, or the error the serde path gives for one too long.
fn long_length(length: usize, what: &'static str) -> Result<u32, MessageError> {
    u32::try_from(length)
        .ok()
        .filter(|length| *length <= LONG_MAX)
        .ok_or(MessageError::TooLong {
            what,
            length,
            max: LONG_MAX,
        })
}

/// A described list or map section being written: room for a `list32`/`map32` header is
/// reserved and its elements appended after it; [`Compound::finish`] patches in the size and
/// count, or moves the elements down behind a `list8`/`map8` header, as `serde_amqp` chooses.
/// (An empty list would differ: `serde_amqp` writes `list0`. No list written here is empty.)
#[derive(Debug)]
struct Compound {
    header_at: usize,
    constructor8: u8,
}

impl Compound {
    /// Starts a section with descriptor `code`, a list (`constructor8` [`LIST8`]) or a map
    /// ([`MAP8`]).
    fn start(out: &mut Vec<u8>, code: u8, constructor8: u8) -> Self {
        out.extend_from_slice(&[
            0x00,
            0x53,
            code,
            constructor8 + WIDE,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
        ]);
        Compound {
            header_at: out.len() - 9,
            constructor8,
        }
    }

    /// Patches in the size and `count` (a list's fields; a map's keys and values) once the
    /// elements are written.
    fn finish(
        self,
        out: &mut Vec<u8>,
        count: usize,
        what: &'static str,
    ) -> Result<(), MessageError> {
        let header_at = self.header_at;
        let elements_at = header_at + 9;
        let elements = out.len() - elements_at;
        if elements <= SHORT_MAX {
            // Every element takes a byte at least, so the count fits a byte too.
            out[header_at..header_at + 3].copy_from_slice(&[
                self.constructor8,
                (elements + 1) as u8,
                count as u8,
            ]);
            out.copy_within(elements_at.., header_at + 3);
            out.truncate(header_at + 3 + elements);
        } else {
            let size = long_length(elements, what)? + 4;
            let count = long_length(count, what)?;
            out[header_at + 1..header_at + 5].copy_from_slice(&size.to_be_bytes());
            out[header_at + 5..elements_at].copy_from_slice(&count.to_be_bytes());
        }
        Ok(())
    }
}

/// The reference encoding the producer's writer is checked against: the events built as
/// `fe2o3-amqp` messages and serialized by `serde_amqp` (what the producer sent before
/// [`encode_outgoing`]; about 20 times slower).
#[cfg(test)]
pub(crate) mod serde_reference {
    use super::*;
    use fe2o3_amqp_types::messaging::annotations::{Annotations, OwnedKey};
    use fe2o3_amqp_types::messaging::{
        ApplicationProperties, Batch, Data, Header, Message, MessageAnnotations, MessageId,
        Properties,
    };
    use fe2o3_amqp_types::primitives::{Binary, Symbol, Value};

    /// The AMQP message for one event, carrying `partition_key` if given.
    pub(crate) fn event_to_message(
        event: &EventData,
        partition_key: Option<&str>,
    ) -> Message<Batch<Data>> {
        let properties = (event.message_id.is_some()
            || event.correlation_id.is_some()
            || event.content_type.is_some())
        .then(|| Properties {
            message_id: event.message_id.clone().map(MessageId::String),
            correlation_id: event.correlation_id.clone().map(MessageId::String),
            content_type: event.content_type.clone().map(Symbol::from),
            ..Properties::default()
        });
        let application_properties = (!event.properties.is_empty()).then(|| {
            let mut map = ApplicationProperties::default();
            for (key, value) in &event.properties {
                map.0
                    .insert(key.to_string(), crate::property::to_amqp(value));
            }
            map
        });
        Message {
            header: partition_key.map(|_| Header {
                durable: true,
                ..Header::default()
            }),
            delivery_annotations: event
                .protocol_sections
                .as_deref()
                .and_then(|kept| crate::ingest::decode_strict(kept).ok())
                .and_then(|kept| kept.delivery_annotations),
            message_annotations: partition_key.map(partition_key_annotations),
            properties,
            application_properties,
            body: Batch::from(vec![Data(Binary::from(event.body.to_vec()))]),
            footer: None,
        }
    }

    fn partition_key_annotations(key: &str) -> MessageAnnotations {
        let mut annotations = Annotations::new();
        annotations.insert(
            OwnedKey::Symbol(Symbol::from(PARTITION_KEY_ANNOTATION)),
            Value::String(key.to_owned()),
        );
        MessageAnnotations(annotations)
    }

    /// Encodes a message section by section, as it travels in a transfer.
    pub(crate) fn encode_message(message: &Message<Batch<Data>>) -> Result<Vec<u8>, MessageError> {
        let fail = |e: serde_amqp::Error| MessageError::Encode(e.to_string());
        let mut out = Vec::new();
        if let Some(header) = &message.header {
            out.extend(crate::foreign::to_vec(header).map_err(fail)?);
        }
        if let Some(annotations) = &message.message_annotations {
            out.extend(crate::foreign::to_vec(annotations).map_err(fail)?);
        }
        if let Some(properties) = &message.properties {
            out.extend(crate::foreign::to_vec(properties).map_err(fail)?);
        }
        if let Some(application_properties) = &message.application_properties {
            out.extend(crate::foreign::to_vec(application_properties).map_err(fail)?);
        }
        for data in message.body.iter() {
            out.extend(crate::foreign::to_vec(data).map_err(fail)?);
        }
        // Last, where pyamqp writes them.
        if let Some(annotations) = &message.delivery_annotations {
            out.extend(crate::foreign::to_vec(annotations).map_err(fail)?);
        }
        Ok(out)
    }

    /// What one `send` transfers: a single message, or a batch envelope.
    #[derive(Debug)]
    pub(crate) struct Outgoing {
        pub(crate) message: Message<Batch<Data>>,
        pub(crate) message_format: u32,
    }

    impl Outgoing {
        /// The encoded size the hub counts against its message size: the message, or the sum of
        /// the envelope's sections. Encodes the message, so it is computed only when the link did
        /// not advertise a maximum (the engine checks an advertised one on the bytes it sends).
        pub(crate) fn encoded_len(&self) -> Result<u64, MessageError> {
            Ok(encode_message(&self.message)?.len() as u64)
        }
    }

    /// The transfer for `events`: the message itself for one event, a batch envelope for more.
    pub(crate) fn outgoing(
        events: &[EventData],
        partition_key: Option<&str>,
    ) -> Result<Outgoing, MessageError> {
        if let [event] = events {
            return Ok(Outgoing {
                message: event_to_message(event, partition_key),
                message_format: 0,
            });
        }
        let messages: Vec<Message<Batch<Data>>> = events
            .iter()
            .map(|event| event_to_message(event, partition_key))
            .collect();
        let mut sections = Vec::with_capacity(messages.len());
        for message in &messages {
            sections.push(Data(Binary::from(encode_message(message)?)));
        }
        let envelope = Message {
            header: partition_key.map(|_| Header {
                durable: true,
                ..Header::default()
            }),
            delivery_annotations: None,
            message_annotations: partition_key.map(partition_key_annotations),
            properties: None,
            application_properties: None,
            body: Batch::from(sections),
            footer: None,
        };
        Ok(Outgoing {
            message: envelope,
            message_format: BATCH_MESSAGE_FORMAT,
        })
    }
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp_types::messaging::MessageAnnotations;
    use fe2o3_amqp_types::messaging::annotations::{Annotations, OwnedKey};
    use fe2o3_amqp_types::messaging::message::DecodeIntoMessage;
    use fe2o3_amqp_types::primitives::Timestamp;
    use serde_amqp::read::SliceReader;

    use bytes::Bytes;
    use fe2o3_amqp_types::messaging::{Body, Message};
    use fe2o3_amqp_types::primitives::Value;
    use tributary_event::PropertyValue;

    use super::serde_reference::*;
    use super::*;
    use crate::names::annotation::{
        ENQUEUED_TIME as ENQUEUED_TIME_ANNOTATION, OFFSET as OFFSET_ANNOTATION,
        SEQUENCE_NUMBER as SEQUENCE_NUMBER_ANNOTATION,
    };
    use crate::receive::general::{annotation, decode_received};

    fn decode(bytes: &[u8]) -> Message<Body<Value>> {
        <Body<Value> as DecodeIntoMessage>::decode_message_from_reader(SliceReader::new(bytes))
            .expect("decodes")
    }

    fn stamped(mut message: Message<Body<Value>>, seq: i64, offset: &str) -> Message<Body<Value>> {
        let annotations = message
            .message_annotations
            .get_or_insert_with(|| MessageAnnotations(Annotations::new()));
        annotations
            .0
            .insert(OwnedKey::from(SEQUENCE_NUMBER_ANNOTATION), Value::Long(seq));
        annotations.0.insert(
            OwnedKey::from(OFFSET_ANNOTATION),
            Value::String(offset.to_owned()),
        );
        annotations.0.insert(
            OwnedKey::from(ENQUEUED_TIME_ANNOTATION),
            Value::Timestamp(Timestamp::from_milliseconds(1_700_000_000_123)),
        );
        message
    }

    fn every_property() -> EventData {
        EventData::new("hello")
            .with_property("null", PropertyValue::Null)
            .with_property("bool", PropertyValue::Bool(true))
            .with_property("i32", PropertyValue::Int32(-7))
            .with_property("i64", PropertyValue::Int64(1 << 40))
            .with_property("u32", PropertyValue::UInt32(7))
            .with_property("u64", PropertyValue::UInt64(u64::MAX))
            .with_property("f32", PropertyValue::Float32(1.5))
            .with_property("f64", PropertyValue::Float64(-2.25))
            .with_property("string", PropertyValue::String("ü".into()))
            .with_property(
                "bytes",
                PropertyValue::Bytes(Bytes::from_static(b"\x00\x01")),
            )
            .with_property("time", PropertyValue::Timestamp(1_700_000_000_000))
            .with_property("uuid", PropertyValue::Uuid([9; 16]))
    }

    #[test]
    fn an_event_round_trips_through_its_encoding() {
        let mut event = every_property();
        event.message_id = Some("m-1".to_owned());
        event.correlation_id = Some("c-1".to_owned());
        event.content_type = Some("text/plain".to_owned());
        let message = event_to_message(&event, Some("device-17"));
        let bytes = encode_message(&message).unwrap();
        let received = decode_received(stamped(decode(&bytes), 5, "4096")).unwrap();
        assert_eq!(received.sequence_number, 5);
        assert_eq!(received.offset, 4096);
        assert_eq!(received.enqueued_time_ms, 1_700_000_000_123);
        event.partition_key = Some("device-17".to_owned());
        assert_eq!(received.data, event);
    }

    #[test]
    fn a_single_event_is_a_plain_message_and_several_are_a_batch() {
        let one = outgoing(&[EventData::new("a")], None).unwrap();
        assert_eq!(one.message_format, 0);
        assert_eq!(one.message.body.len(), 1);
        let events: Vec<EventData> = (0..3).map(|i| EventData::new(format!("e{i}"))).collect();
        let batch = outgoing(&events, Some("k")).unwrap();
        assert_eq!(batch.message_format, BATCH_MESSAGE_FORMAT);
        assert_eq!(batch.message.body.len(), 3);
        assert!(
            annotation(
                &batch.message.message_annotations.as_ref().unwrap().0,
                PARTITION_KEY_ANNOTATION
            )
            .is_some()
        );
        // Each data section is a complete message of its own, carrying the key too.
        for (i, section) in batch.message.body.iter().enumerate() {
            let inner = decode(&section.0);
            let event = decode_received(stamped(inner, 0, "0")).unwrap();
            assert_eq!(event.data.body, Bytes::from(format!("e{i}")));
            assert_eq!(event.data.partition_key.as_deref(), Some("k"));
        }
        let sections: usize = batch
            .message
            .body
            .iter()
            .map(|section| serde_amqp::to_vec(section).unwrap().len())
            .sum();
        assert!(batch.encoded_len().unwrap() > sections as u64);
    }

    /// `encode_outgoing` against the serde path it replaces.
    mod encode_outgoing {
        use super::super::serde_reference::{encode_message, outgoing};
        use proptest::collection::vec;
        use proptest::option;
        use proptest::prelude::*;

        use super::super::*;
        use super::decode;
        use bytes::Bytes;
        use fe2o3_amqp_types::messaging::Body;
        use fe2o3_amqp_types::primitives::SimpleValue;

        /// What the serde path sends for the same arguments: the oracle.
        fn serde_path(events: &[EventData], partition_key: Option<&str>) -> (Vec<u8>, u32) {
            let outgoing = outgoing(events, partition_key).expect("the serde path builds it");
            let bytes = encode_message(&outgoing.message).expect("the serde path encodes it");
            (bytes, outgoing.message_format)
        }

        fn check(events: &[EventData], partition_key: Option<&str>) -> (Vec<u8>, u32) {
            let ours = encode_outgoing(events, partition_key).expect("encodes");
            assert_eq!(ours, serde_path(events, partition_key));
            ours
        }

        /// Strings short and long: empty, multi-byte UTF-8, and around 255 bytes.
        fn text() -> BoxedStrategy<String> {
            prop_oneof![
                4 => "[a-z0-9-]{0,12}",
                2 => "(?s).{0,40}",
                1 => "[a-z]{250,260}",
                1 => "(?s).{0,300}",
            ]
            .boxed()
        }

        fn bytes() -> BoxedStrategy<Bytes> {
            prop_oneof![
                4 => vec(any::<u8>(), 0..64),
                1 => vec(any::<u8>(), 250..260),
                1 => vec(any::<u8>(), 0..2000),
            ]
            .prop_map(Bytes::from)
            .boxed()
        }

        /// Every variant, with the values at the edges of their encodings.
        fn property_value() -> BoxedStrategy<PropertyValue> {
            prop_oneof![
                Just(PropertyValue::Null),
                any::<bool>().prop_map(PropertyValue::Bool),
                prop_oneof![any::<i32>(), -130i32..130, Just(i32::MIN), Just(i32::MAX)]
                    .prop_map(PropertyValue::Int32),
                prop_oneof![any::<i64>(), -130i64..130, Just(i64::MIN), Just(i64::MAX)]
                    .prop_map(PropertyValue::Int64),
                prop_oneof![any::<u32>(), 0u32..300, Just(u32::MAX)]
                    .prop_map(PropertyValue::UInt32),
                prop_oneof![any::<u64>(), 0u64..300, Just(u64::MAX)]
                    .prop_map(PropertyValue::UInt64),
                prop_oneof![
                    any::<u32>().prop_map(f32::from_bits),
                    Just(f32::NAN),
                    Just(-0.0f32)
                ]
                .prop_map(PropertyValue::Float32),
                prop_oneof![
                    any::<u64>().prop_map(f64::from_bits),
                    Just(f64::NAN),
                    Just(-0.0f64)
                ]
                .prop_map(PropertyValue::Float64),
                text().prop_map(|s| PropertyValue::String(s.into())),
                bytes().prop_map(PropertyValue::Bytes),
                prop_oneof![any::<i64>(), Just(0)].prop_map(PropertyValue::Timestamp),
                any::<[u8; 16]>().prop_map(PropertyValue::Uuid),
            ]
            .boxed()
        }

        /// A few properties; or many (a map32, and more than are checked pairwise for repeated
        /// keys); or keys from a tiny alphabet, so that some repeat.
        fn properties() -> BoxedStrategy<Vec<(SmolStr, PropertyValue)>> {
            prop_oneof![
                6 => vec((text(), property_value()), 0..8),
                1 => vec(("[a-z0-9]{1,12}", property_value()), 20..140),
                1 => vec(("[a-c]", property_value()), 2..30),
            ]
            .prop_map(|entries| entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
            .boxed()
        }

        /// An event with every field set or not. Its own partition key and protocol sections
        /// are not sent (the serde path ignores them too).
        fn event() -> BoxedStrategy<EventData> {
            (
                bytes(),
                properties(),
                option::of(text()),
                option::of(text()),
                option::of(text()),
                option::of(text()),
                option::of(vec(any::<u8>(), 0..8)),
            )
                .prop_map(
                    |(
                        body,
                        properties,
                        message_id,
                        correlation_id,
                        content_type,
                        partition_key,
                        protocol_sections,
                    )| EventData {
                        body,
                        properties,
                        partition_key,
                        content_type,
                        correlation_id,
                        message_id,
                        protocol_sections: protocol_sections.map(Bytes::from),
                    },
                )
                .boxed()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(512))]

            /// One to five events, keyed or not, are written as the serde path writes them.
            #[test]
            fn encode_outgoing_writes_the_serde_paths_bytes(
                events in vec(event(), 1..=5),
                partition_key in option::of(text()),
            ) {
                let ours = encode_outgoing(&events, partition_key.as_deref()).expect("encodes");
                prop_assert_eq!(ours, serde_path(&events, partition_key.as_deref()));
            }

            /// The bound a caller may cut batches by is never below the measured size.
            #[test]
            fn event_bytes_at_most_is_never_below_event_bytes(
                event in event(),
                partition_key in option::of(text()),
            ) {
                let mut sizer = BatchSizer::new(partition_key.as_deref()).expect("a short key");
                let at_most = sizer.event_bytes_at_most(&event);
                let measured = sizer.event_bytes(&event).expect("encodes");
                prop_assert!(at_most >= measured, "{at_most} < {measured}");
                // Loose by at most 9 bytes a field, and 20 for the sections (unless a repeated
                // property key is written once).
                let fields = 2 * event.properties.len() as u64 + 8;
                prop_assert!(
                    repeats_a_property_key(&event.properties)
                        || at_most <= measured + 9 * fields + 20,
                    "{at_most} vs {measured}"
                );
            }
        }

        /// A stamp's values per message, as a test gives them: none for a message that
        /// carries no stamp.
        struct GivenValues(Vec<Option<Vec<StampValue>>>);

        impl StampValues for GivenValues {
            fn values(&self, index: usize, values: &mut [StampValue]) -> bool {
                match &self.0[index] {
                    Some(given) => {
                        values.clone_from_slice(given);
                        true
                    }
                    None => false,
                }
            }
        }

        fn stamp_value() -> BoxedStrategy<StampValue> {
            prop_oneof![
                text().prop_map(|text| StampValue::Text(text.into())),
                any::<i64>().prop_map(StampValue::Signed),
                any::<u64>().prop_map(StampValue::Unsigned),
            ]
            .boxed()
        }

        /// A stamp's varying keys, and its fixed keys with their values.
        type StampKeys = (Vec<String>, Vec<(String, String)>);

        /// A stamp of up to three varying and three fixed properties, whose keys may clash
        /// with an event's own.
        fn stamp() -> BoxedStrategy<StampKeys> {
            let key = prop_oneof![3 => "repl-[a-z]{1,8}", 1 => text()];
            (vec(key.clone(), 0..=3), vec((key, text()), 0..=3))
                .prop_filter("distinct keys", |(varying, fixed)| {
                    let keys: std::collections::HashSet<_> = varying
                        .iter()
                        .chain(fixed.iter().map(|(key, _)| key))
                        .collect();
                    keys.len() == varying.len() + fixed.len()
                })
                .boxed()
        }

        proptest! {
            /// A stamped batch is byte for byte the batch of the same events holding the
            /// stamp's properties after their own, and the sizer measures it so.
            #[test]
            fn a_stamp_is_written_as_the_properties_it_stands_for(
                events in vec(event(), 1..=4),
                (varying, fixed) in stamp(),
                values in vec(option::of(vec(stamp_value(), 3)), 4),
                partition_key in option::of(text()),
            ) {
                let varying_keys: Vec<&str> = varying.iter().map(String::as_str).collect();
                let fixed_pairs: Vec<(&str, &str)> =
                    fixed.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                let stamp = Stamp::new(&varying_keys, &fixed_pairs).expect("short keys");
                let given = GivenValues(
                    values
                        .into_iter()
                        .map(|v| v.map(|mut v| { v.truncate(varying.len()); v }))
                        .collect(),
                );
                let holding: Vec<EventData> = events
                    .iter()
                    .zip(&given.0)
                    .map(|(event, values)| {
                        let mut event = event.clone();
                        if let Some(values) = values {
                            event.properties.extend(stamp.properties(values));
                        }
                        event
                    })
                    .collect();
                let stamped = Stamped { stamp: &stamp, values: &given };
                let key = partition_key.as_deref();
                prop_assert_eq!(
                    encode_outgoing_stamped(&events, Some(stamped), key).expect("encodes"),
                    encode_outgoing(&holding, key).expect("encodes")
                );
                let mut sizer = BatchSizer::new(key).expect("a short key");
                for (index, event) in events.iter().enumerate() {
                    let values = given.0[index].as_deref();
                    let with = values.map(|values| (&stamp, values));
                    let measured = sizer.event_bytes_stamped(event, with).expect("encodes");
                    prop_assert_eq!(measured, sizer.event_bytes(&holding[index]).expect("encodes"));
                    let longest = values
                        .unwrap_or_default()
                        .iter()
                        .map(|value| value.text().len())
                        .max()
                        .unwrap_or(0);
                    let bound = values.map(|_| (&stamp, longest));
                    prop_assert!(sizer.event_bytes_at_most_stamped(event, bound) >= measured);
                }
            }
        }

        #[test]
        fn a_keyed_event_is_written_as_these_bytes() {
            let mut event = EventData::new("hi").with_property("n", PropertyValue::Int32(5));
            event.message_id = Some("m".to_owned());
            let (bytes, format) = check(&[event], Some("k"));
            assert_eq!(format, 0);
            let mut expected = vec![0x00, 0x53, 0x70, 0xc0, 0x02, 0x01, 0x41]; // durable header
            expected.extend_from_slice(&[0x00, 0x53, 0x72, 0xc1, 25, 2, 0xa3, 19]);
            expected.extend_from_slice(b"x-opt-partition-key");
            expected.extend_from_slice(&[0xa1, 1, b'k']);
            expected.extend_from_slice(&[0x00, 0x53, 0x73, 0xc0, 4, 1, 0xa1, 1, b'm']);
            expected.extend_from_slice(&[0x00, 0x53, 0x74, 0xc1, 6, 2, 0xa1, 1, b'n', 0x54, 5]);
            expected.extend_from_slice(&[0x00, 0x53, 0x75, 0xa0, 2, b'h', b'i']);
            assert_eq!(bytes, expected);
        }

        /// Each one-byte length (of a body, a string, a symbol, a list's or map's elements, a
        /// batched message) takes the four-byte form from 255 bytes on, one byte early, as
        /// `serde_amqp` has it.
        #[test]
        fn every_length_around_255_bytes_is_written_as_serde_amqp_writes_it() {
            for length in 240..=262 {
                let text = "x".repeat(length);
                let mut event = EventData::new(text.clone().into_bytes())
                    .with_property(text.clone(), PropertyValue::String(text.clone().into()));
                event.message_id = Some(text.clone());
                check(std::slice::from_ref(&event), Some(&text));
                event.correlation_id = Some(text.clone());
                event.content_type = Some(text.clone());
                check(&[event.clone(), event], Some(&text));

                // Compounds of about 255 bytes of elements, and batched messages too.
                let short = "y".repeat(length - 240);
                let mut event = EventData::new(short.clone().into_bytes())
                    .with_property("k", PropertyValue::String("z".repeat(length - 8).into()));
                check(std::slice::from_ref(&event), Some(&short));
                check(&[event.clone(), EventData::default()], None);
                event.properties.clear();
                event.message_id = Some("z".repeat(length - 2));
                check(std::slice::from_ref(&event), None);
                event.message_id = Some(short.clone());
                event.content_type = Some("z".repeat(length - 13));
                check(&[event.clone(), event], Some("p"));
            }
            let (bytes, _) = check(&[EventData::new(vec![7u8; 255])], None);
            assert_eq!(bytes[..8], [0x00, 0x53, 0x75, 0xb0, 0, 0, 0, 255]);
            let (bytes, _) = check(&[EventData::new(vec![7u8; 254])], None);
            assert_eq!(bytes[..5], [0x00, 0x53, 0x75, 0xa0, 254]);
        }

        /// A map of many properties is a map32 (its count past a byte too).
        #[test]
        fn many_properties_are_a_map32() {
            let mut event = EventData::new("body");
            for i in 0..200 {
                event = event.with_property(format!("p{i}"), PropertyValue::UInt32(i));
            }
            let (bytes, _) = check(std::slice::from_ref(&event), None);
            assert_eq!(bytes[..4], [0x00, 0x53, 0x74, 0xd1]);
            assert_eq!(bytes[8..12], 400u32.to_be_bytes());
            check(&[event.clone(), event], Some("k"));
        }

        /// An event breaking the unique-keys rule is written as the map the serde path builds
        /// holds it: each key once, in its first place, with its last value.
        #[test]
        fn repeated_property_keys_keep_their_first_place_and_last_value() {
            for count in [
                2,
                tributary_event::PAIRWISE_KEY_CHECK_MAX,
                tributary_event::PAIRWISE_KEY_CHECK_MAX + 5,
            ] {
                let mut event = EventData::new("body");
                for i in 0..count {
                    event = event.with_property(format!("k{i}"), PropertyValue::Int64(i as i64));
                }
                event = event
                    .with_property("k1", PropertyValue::Bool(true))
                    .with_property("k0", PropertyValue::Null)
                    .with_property("k1", PropertyValue::String("last".into()));
                assert!(repeats_a_property_key(&event.properties));
                let (bytes, _) = check(std::slice::from_ref(&event), None);
                let decoded = decode(&bytes).application_properties.unwrap().0;
                assert_eq!(decoded.len(), count);
                let keys: Vec<&String> = decoded.keys().collect();
                assert_eq!(keys[..2], ["k0", "k1"]);
                assert_eq!(decoded.get("k0"), Some(&SimpleValue::Null));
                assert_eq!(
                    decoded.get("k1"),
                    Some(&SimpleValue::String("last".to_owned()))
                );
                check(&[event.clone(), event], Some("k"));
            }
            let distinct: Vec<(SmolStr, _)> = (0..tributary_event::PAIRWISE_KEY_CHECK_MAX + 5)
                .map(|i| (format!("k{i}").into(), PropertyValue::Null))
                .collect();
            assert!(!repeats_a_property_key(&distinct));
        }

        /// No events: an envelope of no data sections, as the serde path makes it (the
        /// producer refuses an empty send before it encodes).
        #[test]
        fn no_events_are_an_envelope_without_data_sections() {
            assert_eq!(check(&[], None), (Vec::new(), BATCH_MESSAGE_FORMAT));
            let (bytes, format) = check(&[], Some("k"));
            assert_eq!(format, BATCH_MESSAGE_FORMAT);
            assert_eq!(bytes[..7], DURABLE_HEADER);
        }

        /// A received event keeps the sender's delivery annotations (not the runtime-metric
        /// ones the receive link asked for); sent again, alone or in a batch, they travel as its
        /// message's last section, and the hub keeps them: a replication task carries them on.
        #[test]
        fn a_received_events_delivery_annotations_travel_on_when_it_is_sent_again() {
            use crate::message::{AmqpMessage, LastEnqueued};
            use fe2o3_amqp_types::messaging::DeliveryAnnotations;
            use fe2o3_amqp_types::messaging::annotations::{Annotations, OwnedKey};
            use fe2o3_amqp_types::primitives::Value;
            use tributary_event::ReceivedEvent;

            let mut sent = Annotations::new();
            sent.insert(
                OwnedKey::from("delann_key"),
                Value::String("delann_value".into()),
            );
            let stored = crate::ingest::event_from_message(
                AmqpMessage {
                    delivery_annotations: Some(DeliveryAnnotations(sent.clone())),
                    ..crate::message::empty_message()
                },
                false,
            )
            .unwrap();
            let delivered = ReceivedEvent {
                sequence_number: 3,
                offset: 512,
                enqueued_time_ms: 1_700_000_000_000,
                data: stored,
            };
            let last = LastEnqueued {
                sequence_number: 3,
                offset: Some(512),
                enqueued_time_ms: Some(1_700_000_000_000),
                retrieved_time_ms: 1_700_000_000_001,
            };
            let mut payload = Vec::new();
            crate::deliver::write_delivery_message(&delivered, Some(&last), &mut payload);
            let (received, metric) =
                crate::receive::decode_received_bytes(&payload, 0).expect("decodes");
            assert_eq!(metric, Some(last));
            let kept = |event: &EventData| {
                let sections = event.protocol_sections.as_deref().expect("kept sections");
                crate::ingest::decode_strict(sections)
                    .unwrap()
                    .delivery_annotations
                    .map(|d| d.0)
            };
            assert_eq!(
                kept(&received.data),
                Some(sent.clone()),
                "runtime ones dropped"
            );

            let again = [received.data.clone(), received.data];
            for events in [&again[..1], &again[..]] {
                let (bytes, format) = check(events, Some("key"));
                let (_, ingested) = crate::ingest::events_of(&bytes, format, true).unwrap();
                assert_eq!(ingested.len(), events.len());
                for event in &ingested {
                    assert_eq!(kept(event), Some(sent.clone()));
                }
                let mut sizer = BatchSizer::new(Some("key")).unwrap();
                let exact = sizer.event_bytes(&events[0]).unwrap();
                assert!(sizer.event_bytes_at_most(&events[0]) >= exact);
            }
        }

        /// Each data section of a batch is the complete message of its event.
        #[test]
        fn a_batch_holds_each_event_as_its_own_message() {
            let events: Vec<EventData> = (0..3)
                .map(|i| {
                    EventData::new(format!("e{i}")).with_property("i", PropertyValue::UInt32(i))
                })
                .collect();
            let (bytes, format) = check(&events, Some("key"));
            assert_eq!(format, BATCH_MESSAGE_FORMAT);
            let envelope = decode(&bytes);
            assert!(envelope.header.unwrap().durable);
            let Body::Data(sections) = envelope.body else {
                panic!("a data body expected");
            };
            assert_eq!(sections.len(), 3);
            for ((i, section), event) in sections.into_iter().enumerate().zip(&events) {
                let (alone, _) = check(std::slice::from_ref(event), Some("key"));
                assert_eq!(section.0.as_ref(), &alone[..], "event {i}");
            }
        }

        /// What no AMQP encoding holds (more than `u32::MAX - 4` bytes, which cannot be
        /// allocated in a test) is an invalid argument, as in the serde path.
        #[test]
        fn lengths_past_what_amqp_encodes_are_invalid_arguments() {
            assert_eq!(long_length(255, "x").unwrap(), 255);
            assert_eq!(long_length(LONG_MAX as usize, "x").unwrap(), LONG_MAX);
            for length in [LONG_MAX as usize + 1, u32::MAX as usize, usize::MAX] {
                let err = long_length(length, "the body").unwrap_err();
                assert!(
                    matches!(
                        &err,
                        MessageError::TooLong {
                            what: "the body",
                            ..
                        }
                    ),
                    "{err}"
                );
            }
        }
    }

    #[test]
    fn the_batch_sizer_measures_what_encode_outgoing_writes() {
        let small = EventData::new("x").with_property("k", PropertyValue::Int64(1));
        let mut large = EventData::new(vec![7u8; 300]);
        large.message_id = Some("id-1".to_owned());
        large.content_type = Some("application/json".to_owned());
        for key in [None, Some("home-17")] {
            let mut sizer = BatchSizer::new(key).unwrap();
            let events = [small.clone(), large.clone(), small.clone()];
            let measured = events.iter().fold(sizer.envelope_bytes(), |sum, event| {
                sum + sizer.event_bytes(event).unwrap()
            });
            let (payload, format) = encode_outgoing(&events, key).unwrap();
            assert_eq!(format, BATCH_MESSAGE_FORMAT);
            assert_eq!(measured, payload.len() as u64, "key {key:?}");
            let (single, _) = encode_outgoing(&events[1..2], key).unwrap();
            assert!(
                (single.len() as u64) < sizer.envelope_bytes() + sizer.event_bytes(&large).unwrap()
            );
        }
    }
}
