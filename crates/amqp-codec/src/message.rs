//! Writing the sections of an AMQP message (specification 3.2) straight into a buffer.
//!
//! A delivery's message is written where it will be sent — after its `transfer` performative
//! in the connection's buffer — without building a message value first and without a sizing
//! pass: a map's size and count are patched in once its entries are written. Which sections and
//! annotations a message carries is the caller's business (the Event Hubs dialect lives in
//! `tributary-amqp`).

/// Descriptor codes of the message sections this module writes.
pub mod section {
    /// `delivery-annotations`.
    pub const DELIVERY_ANNOTATIONS: u8 = 0x71;
    /// `message-annotations`.
    pub const MESSAGE_ANNOTATIONS: u8 = 0x72;
    /// `application-properties`.
    pub const APPLICATION_PROPERTIES: u8 = 0x74;
    /// `data`.
    pub const DATA: u8 = 0x75;
}

/// Appends a `data` section holding `body`.
pub fn write_data_section(out: &mut Vec<u8>, body: &[u8]) {
    out.extend_from_slice(&[0x00, 0x53, section::DATA]);
    crate::value::write_optional_binary(out, Some(body));
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
        let header_at = out.len();
        // Room for a map32 header (constructor, size, count); moved down if map8 suffices.
        out.extend_from_slice(&[0xd1, 0, 0, 0, 0, 0, 0, 0, 0]);
        MapSection {
            out,
            header_at,
            entries: 0,
        }
    }

    /// A symbol key (annotations) or string key (application properties) and then its value,
    /// written by `value` on the same buffer (see [`ValueWriter`]).
    pub fn entry(&mut self, key: &str, symbol_key: bool, value: impl FnOnce(ValueWriter<'_>)) {
        write_string_like(self.out, if symbol_key { 0xa3 } else { 0xa1 }, key);
        value(ValueWriter { out: self.out });
        self.entries += 1;
    }

    /// Patches in the map's size and count; the section is complete.
    pub fn finish(self) {
        let elements_at = self.header_at + 9;
        let elements = self.out.len() - elements_at;
        let count = self.entries * 2;
        if elements < usize::from(u8::MAX) && count <= u32::from(u8::MAX) {
            let at = self.header_at;
            self.out[at] = 0xc1;
            self.out[at + 1] = (elements + 1) as u8;
            self.out[at + 2] = count as u8;
            self.out.copy_within(elements_at.., at + 3);
            self.out.truncate(at + 3 + elements);
        } else {
            let size = u32::try_from(elements + 4).expect("a section fits a message");
            let at = self.header_at;
            self.out[at + 1..at + 5].copy_from_slice(&size.to_be_bytes());
            self.out[at + 5..at + 9].copy_from_slice(&count.to_be_bytes());
        }
    }
}

/// Writes one value of a map entry.
#[derive(Debug)]
pub struct ValueWriter<'a> {
    out: &'a mut Vec<u8>,
}

impl ValueWriter<'_> {
    /// A `long`.
    pub fn long(self, value: i64) {
        match i8::try_from(value) {
            Ok(small) => self.out.extend_from_slice(&[0x55, small as u8]),
            Err(_) => {
                self.out.push(0x81);
                self.out.extend_from_slice(&value.to_be_bytes());
            }
        }
    }

    /// A `string`.
    pub fn string(self, value: &str) {
        write_string_like(self.out, 0xa1, value);
    }

    /// A `timestamp`: milliseconds since the Unix epoch.
    pub fn timestamp(self, unix_ms: i64) {
        self.out.push(0x83);
        self.out.extend_from_slice(&unix_ms.to_be_bytes());
    }

    /// A value already encoded.
    pub fn encoded(self, value: &[u8]) {
        self.out.extend_from_slice(value);
    }
}

/// Writes a string (`0xa1`) or symbol (`0xa3`) in its short or long form.
fn write_string_like(out: &mut Vec<u8>, short_constructor: u8, text: &str) {
    match u8::try_from(text.len()) {
        Ok(length) => out.extend_from_slice(&[short_constructor, length]),
        Err(_) => {
            let length = u32::try_from(text.len()).expect("a string fits a message");
            out.push(short_constructor + 0x10); // str32 / sym32
            out.extend_from_slice(&length.to_be_bytes());
        }
    }
    out.extend_from_slice(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp_types::messaging::annotations::OwnedKey;
    use fe2o3_amqp_types::messaging::message::__private::Deserializable;
    use fe2o3_amqp_types::messaging::{Body, Message};
    use fe2o3_amqp_types::primitives::{SimpleValue, Symbol, Timestamp, Value};
    use proptest::prelude::*;

    use super::*;

    fn decode(bytes: &[u8]) -> Message<Body<Value>> {
        let decoded: Deserializable<Message<Body<Value>>> =
            serde_amqp::from_slice(bytes).expect("the reference decodes the message");
        decoded.0
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
