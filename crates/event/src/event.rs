//! Events as producers send them and as consumers receive them.

use bytes::Bytes;
pub use smol_str::SmolStr;

/// A typed application-property value.
///
/// The set covers what the Event Hubs SDKs put in application properties (AMQP simple types), so
/// a property written by one client comes back with the same type to another. Deliberately not
/// `#[non_exhaustive]`: every codec must handle every variant, so a new one should stop the build
/// until they do.
#[derive(Debug, Clone, PartialEq)]
pub enum PropertyValue {
    /// No value (AMQP null, JSON null).
    Null,
    /// A boolean.
    Bool(bool),
    /// A 32-bit signed integer (AMQP `int`).
    Int32(i32),
    /// A 64-bit signed integer (AMQP `long`, and every JSON integer).
    Int64(i64),
    /// A 32-bit unsigned integer (AMQP `uint`).
    UInt32(u32),
    /// A 64-bit unsigned integer (AMQP `ulong`).
    UInt64(u64),
    /// A 32-bit float (AMQP `float`).
    Float32(f32),
    /// A 64-bit float (AMQP `double`, JSON numbers with a fraction).
    Float64(f64),
    /// A UTF-8 string. Up to 23 bytes are held inline (no allocation); a longer one is shared,
    /// so cloning any string value is O(1).
    String(SmolStr),
    /// Raw bytes.
    Bytes(Bytes),
    /// A point in time, milliseconds since the Unix epoch (AMQP `timestamp`).
    Timestamp(i64),
    /// A UUID in its 16-byte big-endian form.
    Uuid([u8; 16]),
}

/// A [`PropertyValue`] borrowed from where it is stored (a log record read in place, without
/// copying it out): the same variants, with strings and bytes as slices.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PropertyValueRef<'a> {
    /// [`PropertyValue::Null`].
    Null,
    /// [`PropertyValue::Bool`].
    Bool(bool),
    /// [`PropertyValue::Int32`].
    Int32(i32),
    /// [`PropertyValue::Int64`].
    Int64(i64),
    /// [`PropertyValue::UInt32`].
    UInt32(u32),
    /// [`PropertyValue::UInt64`].
    UInt64(u64),
    /// [`PropertyValue::Float32`].
    Float32(f32),
    /// [`PropertyValue::Float64`].
    Float64(f64),
    /// [`PropertyValue::String`].
    String(&'a str),
    /// [`PropertyValue::Bytes`].
    Bytes(&'a [u8]),
    /// [`PropertyValue::Timestamp`].
    Timestamp(i64),
    /// [`PropertyValue::Uuid`].
    Uuid([u8; 16]),
}

impl<'a> From<&'a PropertyValue> for PropertyValueRef<'a> {
    fn from(value: &'a PropertyValue) -> PropertyValueRef<'a> {
        match value {
            PropertyValue::Null => PropertyValueRef::Null,
            PropertyValue::Bool(v) => PropertyValueRef::Bool(*v),
            PropertyValue::Int32(v) => PropertyValueRef::Int32(*v),
            PropertyValue::Int64(v) => PropertyValueRef::Int64(*v),
            PropertyValue::UInt32(v) => PropertyValueRef::UInt32(*v),
            PropertyValue::UInt64(v) => PropertyValueRef::UInt64(*v),
            PropertyValue::Float32(v) => PropertyValueRef::Float32(*v),
            PropertyValue::Float64(v) => PropertyValueRef::Float64(*v),
            PropertyValue::String(v) => PropertyValueRef::String(v),
            PropertyValue::Bytes(v) => PropertyValueRef::Bytes(v),
            PropertyValue::Timestamp(v) => PropertyValueRef::Timestamp(*v),
            PropertyValue::Uuid(v) => PropertyValueRef::Uuid(*v),
        }
    }
}

/// A UUID's 16 big-endian bytes as its hyphenated lower-case text (8-4-4-4-12 hexadecimal
/// digits), as every door and file format writes one.
pub fn uuid_text(bytes: &[u8; 16]) -> String {
    use std::fmt::Write as _;
    let mut text = String::with_capacity(36);
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            text.push('-');
        }
        let _ = write!(text, "{byte:02x}");
    }
    text
}

impl PropertyValue {
    /// A short, stable name of the value's type, for messages and JSON output.
    pub fn type_name(&self) -> &'static str {
        match self {
            PropertyValue::Null => "null",
            PropertyValue::Bool(_) => "bool",
            PropertyValue::Int32(_) => "int32",
            PropertyValue::Int64(_) => "int64",
            PropertyValue::UInt32(_) => "uint32",
            PropertyValue::UInt64(_) => "uint64",
            PropertyValue::Float32(_) => "float32",
            PropertyValue::Float64(_) => "float64",
            PropertyValue::String(_) => "string",
            PropertyValue::Bytes(_) => "bytes",
            PropertyValue::Timestamp(_) => "timestamp",
            PropertyValue::Uuid(_) => "uuid",
        }
    }
}

/// One event as a producer hands it to the hub.
///
/// Only `body` is required. The hub assigns the system properties (sequence number, offset,
/// enqueued time) when it appends the event; see [`ReceivedEvent`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventData {
    /// The payload. Opaque to the hub.
    pub body: Bytes,
    /// Application properties, in the order the producer gave them. Keys are unique. A key
    /// is a [`SmolStr`]: inline up to 23 bytes, shared beyond, so decoding or cloning an
    /// event's properties allocates nothing per short string.
    pub properties: Vec<(SmolStr, PropertyValue)>,
    /// The partition key the event was routed by, if any. Kept so consumers can see it.
    pub partition_key: Option<String>,
    /// The MIME type of the body, if the producer gave one.
    pub content_type: Option<String>,
    /// The correlation id, if the producer gave one.
    pub correlation_id: Option<String>,
    /// The message id, if the producer gave one.
    pub message_id: Option<String>,
    /// Opaque bytes a front door stores so it can re-emit parts of a protocol message that have
    /// no field here (for AMQP: annotations and message properties beyond the ones above). Other
    /// front doors pass them through untouched.
    pub protocol_sections: Option<Bytes>,
}

impl EventData {
    /// An event with this body and nothing else.
    pub fn new(body: impl Into<Bytes>) -> Self {
        EventData {
            body: body.into(),
            ..EventData::default()
        }
    }

    /// Adds an application property (builder style).
    pub fn with_property(mut self, key: impl Into<SmolStr>, value: PropertyValue) -> Self {
        self.properties.push((key.into(), value));
        self
    }

    /// The value of the application property `key`, if present.
    pub fn property(&self, key: &str) -> Option<&PropertyValue> {
        self.properties
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }
}

/// An event as the hub stored it: the producer's data plus the system properties assigned on
/// append.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedEvent {
    /// Dense from 0 within a partition; the n-th event appended has sequence number n.
    pub sequence_number: i64,
    /// The event's byte position in the partition log. Grows with every event but is not dense.
    /// On the wire it is a decimal string, as Event Hubs sends it.
    pub offset: u64,
    /// When the hub appended the event, in milliseconds since the Unix epoch. Never decreases
    /// within a partition.
    pub enqueued_time_ms: i64,
    /// What the producer sent.
    pub data: EventData,
}

/// Up to this many application properties, [`repeats_a_property_key`] compares keys pairwise;
/// beyond, it uses a set.
pub const PAIRWISE_KEY_CHECK_MAX: usize = 16;

/// Whether a key appears twice among `properties`: an event breaking [`EventData`]'s "keys
/// are unique", which an AMQP map (what the AMQP front door and client write) cannot say.
pub fn repeats_a_property_key(properties: &[(SmolStr, PropertyValue)]) -> bool {
    if properties.len() < 2 {
        false
    } else if properties.len() <= PAIRWISE_KEY_CHECK_MAX {
        // Lengths first: keys of different lengths differ, and comparing two numbers is
        // cheaper than comparing two texts (the check runs for every event sent or received).
        let mut lengths = [0; PAIRWISE_KEY_CHECK_MAX];
        for (length, (key, _)) in lengths.iter_mut().zip(properties) {
            *length = key.len();
        }
        (1..properties.len())
            .any(|i| (0..i).any(|j| lengths[j] == lengths[i] && properties[j].0 == properties[i].0))
    } else {
        let mut seen = std::collections::HashSet::with_capacity(properties.len());
        !properties.iter().all(|(key, _)| seen.insert(key.as_str()))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_uuid_is_written_8_4_4_4_12_in_lower_case() {
        let bytes = [
            0x12, 0x3e, 0x45, 0x67, 0xe8, 0x9b, 0x12, 0xd3, 0xa4, 0x56, 0x42, 0x66, 0x14, 0x17,
            0x40, 0xFF,
        ];
        assert_eq!(uuid_text(&bytes), "123e4567-e89b-12d3-a456-4266141740ff");
    }

    proptest! {
        /// Whatever the number of keys (either side of the pairwise limit) and however alike
        /// they are (equal lengths, shared prefixes), a repeat is found exactly when a set of
        /// the keys is smaller than the list.
        #[test]
        fn a_repeated_key_is_found_exactly_when_there_is_one(
            keys in vec("[ab]{0,3}|repl-[a-z]{1,12}|[a-z0-9]{24,30}", 0..24),
        ) {
            let properties: Vec<(SmolStr, PropertyValue)> =
                keys.iter().map(|key| (SmolStr::new(key), PropertyValue::Null)).collect();
            let distinct: HashSet<&String> = keys.iter().collect();
            prop_assert_eq!(repeats_a_property_key(&properties), distinct.len() < keys.len());
        }

        /// Distinct keys have no repeat; one key copied to any place, first or last or beside
        /// itself, is one.
        #[test]
        fn one_key_copied_anywhere_is_a_repeat(
            keys in proptest::collection::hash_set("[a-z]{1,3}|repl-[a-z]{1,12}", 1..24),
            from in any::<prop::sample::Index>(),
            to in any::<prop::sample::Index>(),
        ) {
            let mut properties: Vec<(SmolStr, PropertyValue)> =
                keys.iter().map(|key| (SmolStr::new(key), PropertyValue::Null)).collect();
            prop_assert!(!repeats_a_property_key(&properties));
            let copy = properties[from.index(properties.len())].clone();
            let at = to.index(properties.len() + 1);
            properties.insert(at, copy);
            prop_assert!(repeats_a_property_key(&properties));
        }
    }
}
