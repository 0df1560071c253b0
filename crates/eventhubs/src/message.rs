//! What the four message directions have in common: their one error, and the runtime metric.
//!
//! Each direction has its module — [`send`](crate::send) (client → bytes),
//! [`ingest`](crate::ingest) (bytes → server), [`deliver`](crate::deliver) (server → bytes),
//! [`receive`](crate::receive) (bytes → client) — and fails with [`MessageError`]; the
//! property-value mapping they share is [`property`](crate::property). [`write_message`]
//! encodes a whole `fe2o3-amqp` message (requests, responses and the general paths) through
//! `serde_amqp`'s public API, section by section.

use fe2o3_amqp_types::messaging::{AmqpValue, Body, Message};
use fe2o3_amqp_types::primitives::Value;
use serde::Serialize;

/// Why a message could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MessageError {
    /// The bytes are not a message of the dialect, or one missing what it must carry: the
    /// peer's fault.
    #[error("{0}")]
    Malformed(String),
    /// A value is longer than any AMQP encoding holds: the caller's fault.
    #[error(
        "an event could not be encoded: {what} takes {length} bytes, more than the {max} AMQP can encode"
    )]
    TooLong {
        /// What is too long.
        what: &'static str,
        /// Its length in bytes.
        length: usize,
        /// The most AMQP encodes.
        max: u32,
    },
    /// The AMQP encoder refused a message (a reference or fallback path).
    #[error("an event could not be encoded: {0}")]
    Encode(String),
}

/// The partition's last-enqueued event, as a delivery's runtime-metric annotations carry it
/// ([`names::runtime_metric`](crate::names::runtime_metric)).
///
/// A partition that never had an event has sequence number -1, no offset (written `-1`) and no
/// enqueued time (written as the epoch); [`deliver`](crate::deliver) writes that, and
/// [`receive`](crate::receive) reports a metric only when the hub sent a numeric offset, so
/// what it returns always has both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastEnqueued {
    /// Its sequence number (-1 if the partition never had an event).
    pub sequence_number: i64,
    /// Its offset, if the partition ever had an event.
    pub offset: Option<u64>,
    /// When it was enqueued, milliseconds since the Unix epoch, if the partition ever had an
    /// event.
    pub enqueued_time_ms: Option<i64>,
    /// When the hub read these figures, milliseconds since the Unix epoch.
    pub retrieved_time_ms: i64,
}

/// A whole AMQP message as `fe2o3-amqp` decodes it: what the general paths build and read.
pub type AmqpMessage = Message<Body<Value>>;

/// A message with no sections but an empty body.
pub fn empty_message() -> AmqpMessage {
    Message {
        header: None,
        delivery_annotations: None,
        message_annotations: None,
        properties: None,
        application_properties: None,
        body: Body::Empty,
        footer: None,
    }
}

/// An `amqp-value` body holding `value`.
pub fn value_body(value: Value) -> Body<Value> {
    Body::Value(AmqpValue(value))
}

/// Appends `message` to `out`, its sections in the standard order: the bytes `fe2o3-amqp`'s
/// own message serializer writes (checked in the tests). On error `out` is left as it was.
pub fn write_message(
    message: &Message<Body<Value>>,
    out: &mut Vec<u8>,
) -> Result<(), MessageError> {
    let start = out.len();
    let written = write_sections(message, out);
    if written.is_err() {
        out.truncate(start);
    }
    written.map_err(|e| MessageError::Encode(e.to_string()))
}

/// `message` encoded (see [`write_message`]).
pub fn encode_message(message: &Message<Body<Value>>) -> Result<Vec<u8>, MessageError> {
    let mut out = Vec::new();
    write_message(message, &mut out)?;
    Ok(out)
}

fn write_sections(
    message: &Message<Body<Value>>,
    out: &mut Vec<u8>,
) -> Result<(), serde_amqp::Error> {
    let mut serializer = serde_amqp::ser::Serializer::new(&mut *out);
    if let Some(header) = &message.header {
        header.serialize(&mut serializer)?;
    }
    if let Some(annotations) = &message.delivery_annotations {
        annotations.serialize(&mut serializer)?;
    }
    if let Some(annotations) = &message.message_annotations {
        annotations.serialize(&mut serializer)?;
    }
    if let Some(properties) = &message.properties {
        properties.serialize(&mut serializer)?;
    }
    if let Some(properties) = &message.application_properties {
        properties.serialize(&mut serializer)?;
    }
    match &message.body {
        Body::Data(sections) => {
            for data in sections.iter() {
                data.serialize(&mut serializer)?;
            }
        }
        Body::Sequence(sections) => {
            for sequence in sections.iter() {
                sequence.serialize(&mut serializer)?;
            }
        }
        Body::Value(value) => value.serialize(&mut serializer)?,
        Body::Empty => AmqpValue(()).serialize(&mut serializer)?,
    }
    if let Some(footer) = &message.footer {
        footer.serialize(&mut serializer)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp_types::messaging::message::DecodeIntoMessage;
    use fe2o3_amqp_types::messaging::{
        AmqpSequence, ApplicationProperties, Batch, Data, Header, Properties,
    };
    use fe2o3_amqp_types::primitives::{Binary, SimpleValue};
    use serde_amqp::read::SliceReader;

    use super::*;

    fn decode(bytes: &[u8]) -> Message<Body<Value>> {
        <Body<Value> as DecodeIntoMessage>::decode_message_from_reader(SliceReader::new(bytes))
            .expect("decodes")
    }

    #[test]
    fn every_body_kind_encodes_and_decodes_back() {
        let data = |b: &[u8]| Data(Binary::from(b.to_vec()));
        let bodies = [
            Body::Empty,
            Body::Value(AmqpValue(Value::String("v".into()))),
            Body::Data(Batch::from(vec![data(b"a"), data(b"bc")])),
            Body::Sequence(Batch::from(vec![AmqpSequence(vec![Value::Int(1)])])),
        ];
        for body in bodies {
            let mut properties = ApplicationProperties::default();
            properties.0.insert("k".into(), SimpleValue::Long(5));
            let message = Message {
                header: Some(Header {
                    durable: true,
                    ..Header::default()
                }),
                delivery_annotations: None,
                message_annotations: None,
                properties: Some(Properties::default()),
                application_properties: Some(properties),
                body,
                footer: None,
            };
            let bytes = encode_message(&message).unwrap();
            let back = decode(&bytes);
            let expected = match message.body {
                Body::Empty => Body::Value(AmqpValue(Value::Null)),
                ref other => other.clone(),
            };
            assert_eq!(back.body, expected);
            assert_eq!(back.header, message.header);
            assert_eq!(back.application_properties, message.application_properties);
        }
    }
}
