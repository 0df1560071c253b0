//! Encoding AMQP values that came from a peer, without panicking.
//!
//! The general paths decode what the fast paths leave to them with `fe2o3-amqp`'s types and
//! encode parts of it again with `serde_amqp` (sections an ingested event keeps, a body or an
//! application property with no plain twin). `serde_amqp` 0.18 panics on some values it decodes
//! itself: written as a map key, a timestamp leaves its state in the serializer, so a string
//! value after it (`{<timestamp>: "x"}`, which a peer may put in an `amqp-value` body or an
//! application property) reaches an `unreachable!()`. The same happens when the timestamp is
//! wrapped in the key: a described value's value is written by the same serializer, so
//! `{<described timestamp>: "x"}` leaves the state behind just the same. A peer's message must
//! never take a connection down, so every
//! encode of a value that came from outside goes through [`to_vec`], which turns such a panic
//! into an error the caller reports like any other encoding refusal, and the values a peer
//! controls are first checked by [`check`], which refuses the shape before the encoder sees it
//! (a timestamp key with a long value is not a panic but is written back as two timestamps, and
//! a fuzzer, whose panic hook aborts, must not stop at a panic that is caught).

use std::panic::{AssertUnwindSafe, catch_unwind};

use fe2o3_amqp_types::messaging::Body;
use fe2o3_amqp_types::messaging::annotations::Annotations;
use fe2o3_amqp_types::primitives::Value;
use serde::Serialize;

fn cannot_write() -> serde_amqp::Error {
    <serde_amqp::Error as serde::ser::Error>::custom(
        "the AMQP encoder cannot write a map with a timestamp key",
    )
}

/// `serde_amqp::to_vec`, with a panic inside the encoder returned as an error.
pub fn to_vec<T: Serialize>(value: &T) -> Result<Vec<u8>, serde_amqp::Error> {
    catch_unwind(AssertUnwindSafe(|| serde_amqp::to_vec(value)))
        .unwrap_or_else(|_| Err(cannot_write()))
}

/// Refuses a value `serde_amqp` cannot write back faithfully: one holding, at any depth, a map
/// with a key that holds a timestamp anywhere in it. Only a bare or described timestamp key
/// is known to leave the encoder's state behind; a list or array key holding one is refused
/// too, as the encoder's handling of those is no better tested and no client sends such keys.
pub fn check(value: &Value) -> Result<(), serde_amqp::Error> {
    match value {
        Value::Map(map) => {
            for (key, value) in map.iter() {
                if holds_timestamp(key) {
                    return Err(cannot_write());
                }
                check(key)?;
                check(value)?;
            }
            Ok(())
        }
        Value::List(items) => items.iter().try_for_each(check),
        Value::Array(items) => items.0.iter().try_for_each(check),
        Value::Described(described) => check(&described.value),
        _ => Ok(()),
    }
}

/// Whether `value` is, or holds at any depth, a timestamp.
fn holds_timestamp(value: &Value) -> bool {
    match value {
        Value::Timestamp(_) => true,
        Value::Map(map) => map
            .iter()
            .any(|(key, value)| holds_timestamp(key) || holds_timestamp(value)),
        Value::List(items) => items.iter().any(holds_timestamp),
        Value::Array(items) => items.0.iter().any(holds_timestamp),
        Value::Described(described) => holds_timestamp(&described.value),
        _ => false,
    }
}

/// [`check`] on every value of a body.
pub fn check_body(body: &Body<Value>) -> Result<(), serde_amqp::Error> {
    match body {
        Body::Value(value) => check(&value.0),
        Body::Sequence(sequences) => sequences
            .iter()
            .try_for_each(|sequence| sequence.0.iter().try_for_each(check)),
        Body::Data(_) | Body::Empty => Ok(()),
    }
}

/// [`check`] on every value of message annotations or a footer.
pub fn check_annotations(annotations: &Annotations) -> Result<(), serde_amqp::Error> {
    annotations.values().try_for_each(check)
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp_types::primitives::{OrderedMap, Timestamp, Value};
    use serde_amqp::described::Described;
    use serde_amqp::descriptor::Descriptor;

    use super::*;

    /// The value that makes `serde_amqp` panic is an error here, and a value it handles is
    /// encoded exactly as `serde_amqp` encodes it.
    #[test]
    fn a_value_the_encoder_panics_on_is_an_error() {
        let mut map = OrderedMap::new();
        map.insert(
            Value::Timestamp(Timestamp::from_milliseconds(1)),
            Value::String("x".into()),
        );
        let troublesome = Value::Map(map);
        let panicked = catch_unwind(|| serde_amqp::to_vec(&troublesome)).is_err();
        assert!(
            panicked,
            "serde_amqp still panics here (else this module can go)"
        );
        let error = to_vec(&troublesome).unwrap_err();
        assert!(error.to_string().contains("cannot write"), "{error}");
        let nested = Value::List(vec![Value::Null, troublesome]);
        assert!(check(&nested).is_err());
        // The fuzzer's second shape: the timestamp key wrapped in a described value.
        let mut map = OrderedMap::new();
        map.insert(
            Value::Described(Box::new(Described {
                descriptor: Descriptor::Code(52),
                value: Value::Timestamp(Timestamp::from_milliseconds(1)),
            })),
            Value::String("x".into()),
        );
        let described_key = Value::Map(map);
        assert!(catch_unwind(|| serde_amqp::to_vec(&described_key)).is_err());
        assert!(check(&described_key).is_err());
        let mut map = OrderedMap::new();
        map.insert(
            Value::String("at".into()),
            Value::Timestamp(Timestamp::from_milliseconds(1)),
        );
        let timestamp_value = Value::Map(map);
        assert!(check(&timestamp_value).is_ok(), "a timestamp value is fine");
        let fine = Value::List(vec![Value::String("x".into()), Value::Long(-7)]);
        assert_eq!(to_vec(&fine).unwrap(), serde_amqp::to_vec(&fine).unwrap());
        assert!(check(&fine).is_ok());
    }
}
