//! Writing the sections of an AMQP message (specification 3.2) straight into a buffer.
//!
//! A delivery's message is written where it will be sent — after its `transfer` performative
//! in the connection's buffer — without building a message value first and without a sizing
//! pass: a map's or list's size and count are patched in once its entries are written. Which
//! sections and annotations a message carries is the caller's business (the Event Hubs dialect
//! lives in `tributary-amqp`).
//!
//! Every value is written in the smallest encoding the specification allows for it (`smalllong`
//! for a `long` in -128..=127, `str8` for a string shorter than 256 bytes, …). That is what the
//! reference encoder (`serde_amqp`) writes too, byte for byte, but for two cases where ours is
//! smaller and reads back the same: a binary, string or symbol of exactly 255 bytes (the
//! reference switches to the 32-bit length form one byte early), and an empty list section
//! (written as a `list8` of no fields, where the reference writes `list0`).
//!
//! # Panics
//! None on any input a message can hold. A string, symbol or binary longer than `u32::MAX`
//! bytes has no AMQP encoding at all; writing one panics (no frame, and no stored event, can be
//! that large: the broker refuses events far smaller).

use crate::value::{LIST, MAP, finish_compound, start_compound};

/// A message's sections as a reader meets them: their descriptor codes as
/// [`Reader::descriptor`](crate::value::Reader::descriptor) reads them, in the order the
/// specification puts the sections in, and the fields of the two list sections.
pub mod section_code {
    /// `header`.
    pub const HEADER: u64 = 0x70;
    /// `delivery-annotations`.
    pub const DELIVERY_ANNOTATIONS: u64 = 0x71;
    /// `message-annotations`.
    pub const MESSAGE_ANNOTATIONS: u64 = 0x72;
    /// `properties`.
    pub const PROPERTIES: u64 = 0x73;
    /// `application-properties`.
    pub const APPLICATION_PROPERTIES: u64 = 0x74;
    /// `data`.
    pub const DATA: u64 = 0x75;
    /// Fields in a `header` list.
    pub const HEADER_FIELDS: u32 = 5;
    /// Fields in a `properties` list.
    pub const PROPERTIES_FIELDS: u32 = 13;
}

/// Descriptor codes of the message sections this module writes (the small-ulong form of
/// [`section_code`]'s).
pub mod section {
    use super::section_code as code;

    /// `delivery-annotations`.
    pub const DELIVERY_ANNOTATIONS: u8 = code::DELIVERY_ANNOTATIONS as u8;
    /// `message-annotations`.
    pub const MESSAGE_ANNOTATIONS: u8 = code::MESSAGE_ANNOTATIONS as u8;
    /// `properties` (a list, written with [`super::ListSection`]).
    pub const PROPERTIES: u8 = code::PROPERTIES as u8;
    /// `application-properties`.
    pub const APPLICATION_PROPERTIES: u8 = code::APPLICATION_PROPERTIES as u8;
    /// `data`.
    pub const DATA: u8 = code::DATA as u8;
}

/// Appends a `data` section holding `body`.
///
/// # Panics
/// If `body` is longer than `u32::MAX` bytes, which no AMQP encoding can hold.
pub fn write_data_section(out: &mut Vec<u8>, body: &[u8]) {
    write_data_section_header(out, body.len());
    out.extend_from_slice(body);
}

/// Appends the start of a `data` section whose body of `body_len` bytes follows it: what
/// [`write_data_section`] writes before the body, for a body the caller sends from where it is.
///
/// # Panics
/// If `body_len` is above `u32::MAX`, which no AMQP encoding can hold.
pub fn write_data_section_header(out: &mut Vec<u8>, body_len: usize) {
    out.extend_from_slice(&[0x00, 0x53, section::DATA]);
    write_variable_header(out, 0xa0, body_len);
}

/// `name` encoded as a `sym8`, at compile time: a map key for [`MapSection::entry_encoded`].
/// `N` is the name's length plus two; another `N`, or a name of 256 bytes or more, fails to
/// compile.
pub const fn sym8<const N: usize>(name: &str) -> [u8; N] {
    let name = name.as_bytes();
    assert!(name.len() + 2 == N && name.len() <= u8::MAX as usize);
    let mut encoded = [0; N];
    encoded[0] = 0xa3;
    encoded[1] = name.len() as u8;
    let mut i = 0;
    while i < name.len() {
        encoded[i + 2] = name[i];
        i += 1;
    }
    encoded
}

/// A map section being written: keys and values are appended in turn; [`MapSection::finish`]
/// patches in the size and count.
#[derive(Debug)]
pub struct MapSection<'a> {
    out: &'a mut Vec<u8>,
    header_at: usize,
    entries: u32,
}

impl<'a> MapSection<'a> {
    /// Starts a map section with descriptor `code` (see [`section`]).
    pub fn start(out: &'a mut Vec<u8>, code: u8) -> Self {
        out.extend_from_slice(&[0x00, 0x53, code]);
        let header_at = start_compound(out);
        MapSection {
            out,
            header_at,
            entries: 0,
        }
    }

    /// A symbol key (annotations) or string key (application properties) and then its value,
    /// written by `value` on the same buffer (see [`ValueWriter`]).
    pub fn entry(&mut self, key: &str, symbol_key: bool, value: impl FnOnce(ValueWriter<'_>)) {
        write_variable(
            self.out,
            if symbol_key { 0xa3 } else { 0xa1 },
            key.as_bytes(),
        );
        value(ValueWriter { out: self.out });
        self.entries += 1;
    }

    /// A key already encoded (see [`sym8`]) and then its value: for a key written on every
    /// message, copied in one piece.
    #[inline]
    pub fn entry_encoded(&mut self, key: &[u8], value: impl FnOnce(ValueWriter<'_>)) {
        self.out.extend_from_slice(key);
        value(ValueWriter { out: self.out });
        self.entries += 1;
    }

    /// Patches in the map's size and count; the section is complete.
    pub fn finish(self) {
        finish_compound(self.out, self.header_at, self.entries * 2, MAP);
    }
}

/// A list section (a described list, e.g. `properties`) being written: fields are appended in
/// turn; [`ListSection::finish`] patches in the size and count. Trailing null fields may simply
/// not be written (the specification lets a list end early; readers take the missing fields as
/// null).
#[derive(Debug)]
pub struct ListSection<'a> {
    out: &'a mut Vec<u8>,
    header_at: usize,
    fields: u32,
}

impl<'a> ListSection<'a> {
    /// Starts a list section with descriptor `code` (see [`section`]).
    pub fn start(out: &'a mut Vec<u8>, code: u8) -> Self {
        out.extend_from_slice(&[0x00, 0x53, code]);
        let header_at = start_compound(out);
        ListSection {
            out,
            header_at,
            fields: 0,
        }
    }

    /// The next field, written by `value` on the same buffer (see [`ValueWriter`]).
    pub fn field(&mut self, value: impl FnOnce(ValueWriter<'_>)) {
        value(ValueWriter { out: self.out });
        self.fields += 1;
    }

    /// Patches in the list's size and count; the section is complete.
    pub fn finish(self) {
        finish_compound(self.out, self.header_at, self.fields, LIST);
    }
}

/// Writes one value: of a map entry, of a list field, or (with [`ValueWriter::new`]) anywhere.
/// Each method writes the smallest encoding of its type that holds the value.
#[derive(Debug)]
pub struct ValueWriter<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> ValueWriter<'a> {
    /// A writer appending one value to `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        ValueWriter { out }
    }
}

impl ValueWriter<'_> {
    /// A `null`.
    pub fn null(self) {
        self.out.push(0x40);
    }

    /// A `boolean` (`true` 0x41, `false` 0x42).
    pub fn bool(self, value: bool) {
        self.out.push(if value { 0x41 } else { 0x42 });
    }

    /// An `int` (`smallint` 0x54 for -128..=127).
    pub fn int(self, value: i32) {
        match i8::try_from(value) {
            Ok(small) => self.out.extend_from_slice(&[0x54, small as u8]),
            Err(_) => {
                self.out.push(0x71);
                self.out.extend_from_slice(&value.to_be_bytes());
            }
        }
    }

    /// A `uint` (`uint0` 0x43 for 0, `smalluint` 0x52 for 1..=255).
    pub fn uint(self, value: u32) {
        match value {
            0 => self.out.push(0x43),
            1..=255 => self.out.extend_from_slice(&[0x52, value as u8]),
            _ => {
                self.out.push(0x70);
                self.out.extend_from_slice(&value.to_be_bytes());
            }
        }
    }

    /// A `long` (`smalllong` 0x55 for -128..=127).
    pub fn long(self, value: i64) {
        match i8::try_from(value) {
            Ok(small) => self.out.extend_from_slice(&[0x55, small as u8]),
            Err(_) => {
                self.out.push(0x81);
                self.out.extend_from_slice(&value.to_be_bytes());
            }
        }
    }

    /// A `ulong` (`ulong0` 0x44 for 0, `smallulong` 0x53 for 1..=255).
    pub fn ulong(self, value: u64) {
        match value {
            0 => self.out.push(0x44),
            1..=255 => self.out.extend_from_slice(&[0x53, value as u8]),
            _ => {
                self.out.push(0x80);
                self.out.extend_from_slice(&value.to_be_bytes());
            }
        }
    }

    /// A `float` (IEEE 754 binary32; the bits as given, NaN payloads and -0 included).
    pub fn float(self, value: f32) {
        self.out.push(0x72);
        self.out.extend_from_slice(&value.to_be_bytes());
    }

    /// A `double` (IEEE 754 binary64; the bits as given, NaN payloads and -0 included).
    pub fn double(self, value: f64) {
        self.out.push(0x82);
        self.out.extend_from_slice(&value.to_be_bytes());
    }

    /// A `timestamp`: milliseconds since the Unix epoch.
    pub fn timestamp(self, unix_ms: i64) {
        self.out.push(0x83);
        self.out.extend_from_slice(&unix_ms.to_be_bytes());
    }

    /// A `uuid`: its 16 bytes in network order.
    pub fn uuid(self, value: &[u8; 16]) {
        self.out.push(0x98);
        self.out.extend_from_slice(value);
    }

    /// A `binary` (`vbin8` 0xa0 when shorter than 256 bytes, else `vbin32`).
    ///
    /// # Panics
    /// If `value` is longer than `u32::MAX` bytes, which no AMQP encoding can hold.
    pub fn binary(self, value: &[u8]) {
        write_variable(self.out, 0xa0, value);
    }

    /// A `string` (`str8-utf8` 0xa1 when shorter than 256 bytes, else `str32-utf8`).
    ///
    /// # Panics
    /// If `value` is longer than `u32::MAX` bytes, which no AMQP encoding can hold.
    pub fn string(self, value: &str) {
        write_variable(self.out, 0xa1, value.as_bytes());
    }

    /// A `string` holding `value` in decimal, written without formatting it into a `String`
    /// first.
    pub fn decimal_string(self, value: u64) {
        let mut digits = itoa::Buffer::new();
        write_variable(self.out, 0xa1, digits.format(value).as_bytes());
    }

    /// A `symbol` (`sym8` 0xa3 when shorter than 256 bytes, else `sym32`). Symbols are ASCII by
    /// the specification; the bytes of `value` are written as given.
    ///
    /// # Panics
    /// If `value` is longer than `u32::MAX` bytes, which no AMQP encoding can hold.
    pub fn symbol(self, value: &str) {
        write_variable(self.out, 0xa3, value.as_bytes());
    }

    /// A value already encoded.
    pub fn encoded(self, value: &[u8]) {
        self.out.extend_from_slice(value);
    }
}

/// Writes a variable-width value — binary (`0xa0`), string (`0xa1`) or symbol (`0xa3`) — in its
/// one-byte-length form when it fits, else its four-byte-length one (constructor + 0x10).
fn write_variable(out: &mut Vec<u8>, short_constructor: u8, bytes: &[u8]) {
    write_variable_header(out, short_constructor, bytes.len());
    out.extend_from_slice(bytes);
}

/// The constructor and length of a variable-width value of `len` bytes (see [`write_variable`]).
fn write_variable_header(out: &mut Vec<u8>, short_constructor: u8, len: usize) {
    match u8::try_from(len) {
        Ok(length) => out.extend_from_slice(&[short_constructor, length]),
        Err(_) => {
            let length = u32::try_from(len).expect("a value fits a message");
            out.push(short_constructor + 0x10); // vbin32 / str32 / sym32
            out.extend_from_slice(&length.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp_types::messaging::annotations::OwnedKey;
    use fe2o3_amqp_types::messaging::message::DecodeIntoMessage;
    use fe2o3_amqp_types::messaging::{Body, Message};
    use fe2o3_amqp_types::primitives::{SimpleValue, Symbol, Timestamp, Value};
    use proptest::prelude::*;

    use super::*;

    fn decode(bytes: &[u8]) -> Message<Body<Value>> {
        <Body<Value> as DecodeIntoMessage>::decode_message_from_reader(
            serde_amqp::read::SliceReader::new(bytes),
        )
        .expect("the reference decodes the message")
    }

    proptest! {
        /// What the section writers produce is the message the reference decoder reads.
        #[test]
        fn sections_read_back_in_the_reference(
            sequence in any::<i64>(),
            offset in "[0-9]{1,20}",
            enqueued in any::<i64>(),
            key in proptest::option::of("[a-z]{0,300}"),
            properties in proptest::collection::btree_map("[a-z]{1,12}", any::<i64>(), 0..40),
            body in proptest::collection::vec(any::<u8>(), 0..400),
        ) {
            let mut out = Vec::new();
            let mut annotations = MapSection::start(&mut out, section::MESSAGE_ANNOTATIONS);
            annotations.entry("x-opt-sequence-number", true, |v| v.long(sequence));
            annotations.entry("x-opt-offset", true, |v| v.string(&offset));
            annotations.entry("x-opt-enqueued-time", true, |v| v.timestamp(enqueued));
            if let Some(key) = &key {
                annotations.entry("x-opt-partition-key", true, |v| v.string(key));
            }
            annotations.finish();
            let mut application = MapSection::start(&mut out, section::APPLICATION_PROPERTIES);
            for (name, value) in &properties {
                application.entry(name, false, |v| v.long(*value));
            }
            application.finish();
            write_data_section(&mut out, &body);

            let message = decode(&out);
            let annotations = message.message_annotations.expect("annotations");
            let get = |name: &str| annotations.0.get(&OwnedKey::Symbol(Symbol::from(name))).cloned();
            prop_assert_eq!(get("x-opt-sequence-number"), Some(Value::Long(sequence)));
            prop_assert_eq!(get("x-opt-offset"), Some(Value::String(offset.clone())));
            prop_assert_eq!(
                get("x-opt-enqueued-time"),
                Some(Value::Timestamp(Timestamp::from_milliseconds(enqueued)))
            );
            prop_assert_eq!(get("x-opt-partition-key"), key.clone().map(Value::String));
            let application = message.application_properties.expect("application properties");
            prop_assert_eq!(application.0.len(), properties.len());
            for (name, value) in &properties {
                prop_assert_eq!(application.0.get(name), Some(&SimpleValue::Long(*value)));
            }
            match message.body {
                Body::Data(data) => {
                    prop_assert_eq!(data.len(), 1);
                    let section = data.into_iter().next().unwrap();
                    prop_assert_eq!(section.0.as_ref(), &body[..]);
                }
                other => prop_assert!(false, "a data body expected, got {:?}", other),
            }
        }
    }

    /// Encodes one value with `write`.
    fn encoded(write: impl FnOnce(ValueWriter<'_>)) -> Vec<u8> {
        let mut out = Vec::new();
        write(ValueWriter::new(&mut out));
        out
    }

    /// Decodes one value with the reference decoder, and checks that the reference encoder
    /// writes exactly these bytes for it (so nothing trails the value, and ours is the same
    /// smallest encoding) — but for one known difference: the reference writes a binary,
    /// string or symbol of exactly 255 bytes in its 32-bit-length form, where the 8-bit one
    /// (which we write) holds it.
    fn reference(bytes: &[u8]) -> Value {
        let value: Value = serde_amqp::from_slice(bytes).expect("the reference decodes the value");
        let again = serde_amqp::to_vec(&value).expect("the reference encodes the value");
        if again != bytes {
            assert!(
                matches!(bytes[..2], [0xa0 | 0xa1 | 0xa3, 255])
                    && again[..5] == [bytes[0] + 0x10, 0, 0, 0, 255]
                    && again[5..] == bytes[2..],
                "the reference encodes {value:?} differently: {again:02x?} vs {bytes:02x?}"
            );
        }
        value
    }

    proptest! {
        /// Every writer's bytes read back in the reference as the same value of the same type,
        /// and are the bytes the reference encoder writes for it (smallest encoding first; see
        /// `reference` for the one exception).
        #[test]
        fn value_writers_read_back_in_the_reference(
            b in any::<bool>(),
            i in prop_oneof![any::<i32>(), -130i32..130],
            u in prop_oneof![any::<u32>(), 0u32..300],
            l in prop_oneof![any::<i64>(), -130i64..130],
            ul in prop_oneof![any::<u64>(), 0u64..300],
            f_bits in any::<u32>(),
            d_bits in any::<u64>(),
            ms in any::<i64>(),
            id in any::<[u8; 16]>(),
            bytes in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..20),
                proptest::collection::vec(any::<u8>(), 250..260),
                proptest::collection::vec(any::<u8>(), 0..600),
            ],
            text in prop_oneof!["(?s).{0,20}", "[a-z]{250,260}", "(?s).{0,300}"],
            symbol in prop_oneof!["[ -~]{0,20}", "[a-z]{250,260}"],
            n in prop_oneof![any::<u64>(), 0u64..1000, Just(u64::MAX)],
        ) {
            use fe2o3_amqp_types::primitives::{Binary, Uuid};
            prop_assert_eq!(reference(&encoded(|v| v.null())), Value::Null);
            prop_assert_eq!(reference(&encoded(|v| v.bool(b))), Value::Bool(b));
            prop_assert_eq!(reference(&encoded(|v| v.int(i))), Value::Int(i));
            prop_assert_eq!(reference(&encoded(|v| v.uint(u))), Value::Uint(u));
            prop_assert_eq!(reference(&encoded(|v| v.long(l))), Value::Long(l));
            prop_assert_eq!(reference(&encoded(|v| v.ulong(ul))), Value::Ulong(ul));
            let f = f32::from_bits(f_bits);
            match reference(&encoded(|v| v.float(f))) {
                Value::Float(back) => prop_assert_eq!(back.into_inner().to_bits(), f_bits),
                other => prop_assert!(false, "a float expected, got {:?}", other),
            }
            let d = f64::from_bits(d_bits);
            match reference(&encoded(|v| v.double(d))) {
                Value::Double(back) => prop_assert_eq!(back.into_inner().to_bits(), d_bits),
                other => prop_assert!(false, "a double expected, got {:?}", other),
            }
            prop_assert_eq!(
                reference(&encoded(|v| v.timestamp(ms))),
                Value::Timestamp(Timestamp::from_milliseconds(ms))
            );
            prop_assert_eq!(reference(&encoded(|v| v.uuid(&id))), Value::Uuid(Uuid::from(id)));
            prop_assert_eq!(
                reference(&encoded(|v| v.binary(&bytes))),
                Value::Binary(Binary::from(bytes.clone()))
            );
            prop_assert_eq!(reference(&encoded(|v| v.string(&text))), Value::String(text.clone()));
            prop_assert_eq!(
                reference(&encoded(|v| v.symbol(&symbol))),
                Value::Symbol(Symbol::from(symbol.as_str()))
            );
            prop_assert_eq!(
                reference(&encoded(|v| v.decimal_string(n))),
                Value::String(n.to_string())
            );
        }

        /// A list section reads back in the reference as the `properties` it spells, in its
        /// list8 and list32 forms, with trailing fields left out.
        #[test]
        fn a_list_section_reads_back_as_properties(
            message_id in proptest::option::of("(?s).{0,300}"),
            subject in proptest::option::of("[a-z]{0,300}"),
            content_type in proptest::option::of("[ -~]{0,20}"),
            group_sequence in proptest::option::of(any::<u32>()),
        ) {
            use fe2o3_amqp_types::messaging::{MessageId, Properties};
            let mut out = Vec::new();
            let mut list = ListSection::start(&mut out, section::PROPERTIES);
            list.field(|v| match &message_id {
                Some(id) => v.string(id),
                None => v.null(),
            });
            for _ in 0..2 {
                list.field(|v| v.null()); // user-id, to
            }
            list.field(|v| match &subject {
                Some(s) => v.string(s),
                None => v.null(),
            });
            for _ in 0..2 {
                list.field(|v| v.null()); // reply-to, correlation-id
            }
            list.field(|v| match &content_type {
                Some(t) => v.symbol(t),
                None => v.null(),
            });
            if let Some(n) = group_sequence {
                for _ in 0..4 {
                    list.field(|v| v.null()); // content-encoding … group-id
                }
                list.field(|v| v.uint(n));
            }
            list.finish();
            write_data_section(&mut out, b"");
            let expected = Properties {
                message_id: message_id.clone().map(MessageId::String),
                subject: subject.clone(),
                content_type: content_type.as_deref().map(Symbol::from),
                group_sequence,
                ..Properties::default()
            };
            prop_assert_eq!(decode(&out).properties, Some(expected));
        }
    }

    #[test]
    fn values_take_their_smallest_encoding() {
        let cases: Vec<(Vec<u8>, &[u8])> = vec![
            (encoded(|v| v.int(-128)), &[0x54, 0x80]),
            (encoded(|v| v.int(127)), &[0x54, 0x7f]),
            (encoded(|v| v.int(128)), &[0x71, 0, 0, 0, 0x80]),
            (encoded(|v| v.int(-129)), &[0x71, 0xff, 0xff, 0xff, 0x7f]),
            (encoded(|v| v.uint(0)), &[0x43]),
            (encoded(|v| v.uint(255)), &[0x52, 0xff]),
            (encoded(|v| v.uint(256)), &[0x70, 0, 0, 1, 0]),
            (encoded(|v| v.long(-128)), &[0x55, 0x80]),
            (encoded(|v| v.long(128)), &[0x81, 0, 0, 0, 0, 0, 0, 0, 0x80]),
            (encoded(|v| v.ulong(0)), &[0x44]),
            (encoded(|v| v.ulong(255)), &[0x53, 0xff]),
            (encoded(|v| v.ulong(256)), &[0x80, 0, 0, 0, 0, 0, 0, 1, 0]),
            (encoded(|v| v.bool(true)), &[0x41]),
            (encoded(|v| v.bool(false)), &[0x42]),
            (encoded(|v| v.null()), &[0x40]),
            (encoded(|v| v.float(1.0)), &[0x72, 0x3f, 0x80, 0, 0]),
            (
                encoded(|v| v.double(-0.0)),
                &[0x82, 0x80, 0, 0, 0, 0, 0, 0, 0],
            ),
            (encoded(|v| v.binary(b"")), &[0xa0, 0]),
            (encoded(|v| v.string("ab")), &[0xa1, 2, b'a', b'b']),
            (encoded(|v| v.symbol("ab")), &[0xa3, 2, b'a', b'b']),
            (encoded(|v| v.decimal_string(0)), &[0xa1, 1, b'0']),
            (
                encoded(|v| v.decimal_string(907)),
                &[0xa1, 3, b'9', b'0', b'7'],
            ),
        ];
        for (bytes, expected) in cases {
            assert_eq!(bytes, expected);
        }
        let long = "x".repeat(255);
        assert_eq!(&encoded(|v| v.string(&long))[..2], &[0xa1, 255]);
        assert_eq!(&encoded(|v| v.symbol(&long))[..2], &[0xa3, 255]);
        assert_eq!(&encoded(|v| v.binary(long.as_bytes()))[..2], &[0xa0, 255]);
        let longer = "x".repeat(256);
        assert_eq!(&encoded(|v| v.string(&longer))[..5], &[0xb1, 0, 0, 1, 0]);
        assert_eq!(&encoded(|v| v.symbol(&longer))[..5], &[0xb3, 0, 0, 1, 0]);
        assert_eq!(
            &encoded(|v| v.binary(longer.as_bytes()))[..5],
            &[0xb0, 0, 0, 1, 0]
        );
        assert_eq!(
            encoded(|v| v.decimal_string(u64::MAX))[2..],
            *u64::MAX.to_string().as_bytes()
        );
    }

    #[test]
    fn a_list_section_takes_list8_or_list32() {
        let mut out = Vec::new();
        let mut list = ListSection::start(&mut out, section::PROPERTIES);
        list.field(|v| v.string("id"));
        list.finish();
        assert_eq!(
            out,
            [0x00, 0x53, 0x73, 0xc0, 0x05, 0x01, 0xa1, 0x02, b'i', b'd']
        );

        // 254 bytes of elements still fit a list8 (its size byte counts the count byte too);
        // 255 do not.
        for (text_length, list8) in [(250, true), (251, false)] {
            let mut out = Vec::new();
            let mut list = ListSection::start(&mut out, section::PROPERTIES);
            list.field(|v| v.string(&"x".repeat(text_length)));
            list.field(|v| v.null());
            list.field(|v| v.null());
            list.finish();
            assert_eq!(out[3], if list8 { 0xc0 } else { 0xd0 }, "{text_length}");
            write_data_section(&mut out, b"");
            let properties = decode(&out).properties.expect("properties");
            assert_eq!(
                properties.message_id,
                Some(fe2o3_amqp_types::messaging::MessageId::String(
                    "x".repeat(text_length)
                ))
            );
        }
    }

    #[test]
    fn a_map_section_of_many_entries_takes_map32() {
        // 128 entries: 256 keys and values, more than a map8's count byte can say (and more
        // than its size byte, as each takes at least a byte).
        let mut out = Vec::new();
        let mut map = MapSection::start(&mut out, section::APPLICATION_PROPERTIES);
        for i in 0..128 {
            map.entry(&i.to_string(), false, |v| v.null());
        }
        map.finish();
        assert_eq!(out[3], 0xd1);
        assert_eq!(out[8..12], 256u32.to_be_bytes());
        write_data_section(&mut out, b"");
        let properties = decode(&out).application_properties.unwrap().0;
        assert_eq!(properties.len(), 128);
        assert_eq!(properties.get("127"), Some(&SimpleValue::Null));
    }

    #[test]
    fn a_key_encoded_ahead_is_written_as_entry_writes_it() {
        const KEY: [u8; 15] = sym8("x-opt-example");
        assert_eq!(&KEY[..2], &[0xa3, 13]);
        let mut by_entry = Vec::new();
        let mut map = MapSection::start(&mut by_entry, section::MESSAGE_ANNOTATIONS);
        map.entry("x-opt-example", true, |v| v.long(1));
        map.finish();
        let mut encoded_ahead = Vec::new();
        let mut map = MapSection::start(&mut encoded_ahead, section::MESSAGE_ANNOTATIONS);
        map.entry_encoded(&KEY, |v| v.long(1));
        map.finish();
        assert_eq!(by_entry, encoded_ahead);
    }

    #[test]
    fn an_empty_map_section_is_an_empty_map() {
        let mut out = Vec::new();
        MapSection::start(&mut out, section::APPLICATION_PROPERTIES).finish();
        write_data_section(&mut out, b"x");
        assert_eq!(&out[..6], &[0x00, 0x53, 0x74, 0xc1, 0x01, 0x00]);
        let message = decode(&out);
        assert!(message.application_properties.unwrap().0.is_empty());
    }
}
