//! A stamp: string application properties a sender adds to every message of a batch after the
//! event's own (a replication task's `repl-*` metadata), without the events holding them.
//!
//! A [`Stamp`] is encoded once: the keys of the properties whose values differ per message
//! (the *varying* ones, such as a source offset), and the complete key–value entries of those
//! whose values are the same for the whole batch (the *fixed* ones, such as the source
//! partition). Each message then gets a copy of those bytes with its own values written in,
//! through [`StampValues`]. The bytes are exactly those [`encode_outgoing`](super::encode_outgoing)
//! writes for the same events with the stamp's properties appended to their own, varying ones
//! first (property-tested), so a receiver cannot tell the two apart.
//!
//! Nothing here panics: a key or value too long for AMQP is a [`MessageError::TooLong`].

use tributary_event::{PropertyValue, SmolStr};

use super::{STR8, write_variable};
use crate::message::MessageError;

/// One varying value of one message's stamp, written as an AMQP string (an integer in decimal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StampValue {
    /// A string as it is.
    Text(SmolStr),
    /// A signed integer, in decimal.
    Signed(i64),
    /// An unsigned integer, in decimal.
    Unsigned(u64),
}

impl StampValue {
    /// The most bytes [`StampValue::text`] gives for an integer (`-9223372036854775808`).
    pub const INTEGER_BYTES_MAX: usize = 20;

    /// Calls `f` with the value's text.
    fn with_text<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        match self {
            StampValue::Text(text) => f(text),
            StampValue::Signed(n) => f(itoa::Buffer::new().format(*n)),
            StampValue::Unsigned(n) => f(itoa::Buffer::new().format(*n)),
        }
    }

    /// The value's text, as a string of its own (for an event that holds the stamp itself).
    pub fn text(&self) -> SmolStr {
        match self {
            StampValue::Text(text) => text.clone(),
            _ => self.with_text(|text| SmolStr::new(text)),
        }
    }
}

/// Each message's varying values of a batch's stamp.
pub trait StampValues: Send + Sync {
    /// Writes the values of the batch's message `index` into `values`, one per varying key of
    /// the stamp in its order; `false` when that message carries no stamp (it is sent with its
    /// own properties only).
    fn values(&self, index: usize, values: &mut [StampValue]) -> bool;
}

/// The stamp properties of a batch, encoded once (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// Every key, the varying ones first.
    keys: Vec<SmolStr>,
    /// The varying keys, each encoded as an AMQP string, back to back.
    varying_keys: Vec<u8>,
    /// Where each encoded varying key ends in `varying_keys`.
    varying_ends: Vec<usize>,
    /// The fixed properties' values, in key order after the varying keys.
    fixed_values: Vec<SmolStr>,
    /// The fixed properties encoded: key, value, key, value, ...
    fixed: Vec<u8>,
}

impl Stamp {
    /// A stamp of the properties `varying` (values given per message) followed by `fixed`
    /// (key, value: the same for every message). Keys are expected to be distinct.
    ///
    /// # Errors
    /// [`MessageError::TooLong`] for a key or value no AMQP string holds.
    pub fn new(varying: &[&str], fixed: &[(&str, &str)]) -> Result<Stamp, MessageError> {
        let mut varying_keys = Vec::new();
        let mut varying_ends = Vec::with_capacity(varying.len());
        for key in varying {
            write_variable(&mut varying_keys, STR8, key.as_bytes(), "a stamp's key")?;
            varying_ends.push(varying_keys.len());
        }
        let mut encoded_fixed = Vec::new();
        for (key, value) in fixed {
            write_variable(&mut encoded_fixed, STR8, key.as_bytes(), "a stamp's key")?;
            write_variable(
                &mut encoded_fixed,
                STR8,
                value.as_bytes(),
                "a stamp's value",
            )?;
        }
        let keys = varying
            .iter()
            .copied()
            .chain(fixed.iter().map(|(key, _)| *key))
            .map(SmolStr::new)
            .collect();
        Ok(Stamp {
            keys,
            varying_keys,
            varying_ends,
            fixed_values: fixed.iter().map(|(_, value)| SmolStr::new(value)).collect(),
            fixed: encoded_fixed,
        })
    }

    /// How many properties the stamp adds to a message.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the stamp adds no property.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// How many values each message gives ([`StampValues::values`] fills this many).
    pub fn varying_len(&self) -> usize {
        self.varying_ends.len()
    }

    /// The stamp's properties for a message with `values`, as an event holding them itself
    /// carries them (in the order they are encoded).
    pub fn properties(&self, values: &[StampValue]) -> Vec<(SmolStr, PropertyValue)> {
        let texts = values
            .iter()
            .map(StampValue::text)
            .chain(self.fixed_values.iter().cloned());
        self.keys
            .iter()
            .cloned()
            .zip(texts.map(PropertyValue::String))
            .collect()
    }

    /// Whether one of `properties` has a key of the stamp: the message's map then holds it
    /// once, as an event holding both would have it.
    pub(super) fn clashes_with(&self, properties: &[(SmolStr, PropertyValue)]) -> bool {
        properties
            .iter()
            .any(|(key, _)| self.keys.iter().any(|stamp_key| stamp_key == key))
    }

    /// Appends the stamp's map entries with `values` (one per varying key).
    pub(super) fn write(
        &self,
        out: &mut Vec<u8>,
        values: &[StampValue],
    ) -> Result<(), MessageError> {
        let mut start = 0;
        for (&end, value) in self.varying_ends.iter().zip(values) {
            out.extend_from_slice(&self.varying_keys[start..end]);
            start = end;
            value
                .with_text(|text| write_variable(out, STR8, text.as_bytes(), "a stamp's value"))?;
        }
        out.extend_from_slice(&self.fixed);
        Ok(())
    }

    /// At least the bytes [`Stamp::write`] appends for values whose texts take at most
    /// `value_bytes_max` bytes each.
    pub(super) fn bytes_at_most(&self, value_bytes_max: usize) -> u64 {
        /// A string's widest header: constructor and four-byte length.
        const VARIABLE: usize = 5;
        let varying = VARIABLE
            .saturating_add(value_bytes_max)
            .saturating_mul(self.varying_len());
        (self.varying_keys.len() + self.fixed.len()).saturating_add(varying) as u64
    }
}

/// A batch's stamp and its messages' values, as a sender passes them to
/// [`encode_outgoing_stamped`](super::encode_outgoing_stamped).
#[derive(Clone, Copy)]
pub struct Stamped<'a> {
    /// The stamp.
    pub stamp: &'a Stamp,
    /// Each message's values.
    pub values: &'a dyn StampValues,
}

impl std::fmt::Debug for Stamped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stamped")
            .field("stamp", self.stamp)
            .finish_non_exhaustive()
    }
}

impl Stamped<'_> {
    /// Room for one message's values.
    pub(super) fn value_slots(&self) -> Vec<StampValue> {
        vec![StampValue::Signed(0); self.stamp.varying_len()]
    }
}
