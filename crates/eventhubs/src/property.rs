//! Application property values ↔ AMQP simple values: the one mapping every direction uses.
//!
//! Each [`PropertyValue`] has one AMQP twin ([`to_amqp`]): `Null` null, `Bool` boolean, `Int32`
//! int, `Int64` long, `UInt32` uint, `UInt64` ulong, `Float32` float, `Float64` double, `String`
//! string, `Bytes` binary, `Timestamp` timestamp, `Uuid` uuid. Reading back, [`twin`] gives the
//! property of exactly those types; the other AMQP types have none, and what a reader does with
//! them is its choice: the server keeps them encoded beside the event, the client [`widen`]s
//! them (`ubyte`/`ushort` to `UInt32`, `byte`/`short` to `Int32`, `char`/`symbol` to `String`,
//! decimals and described values to `Bytes` holding their AMQP encoding).

use bytes::Bytes;
use fe2o3_amqp_types::primitives::{Binary, SimpleValue, Timestamp, Uuid};
use tributary_event::{PropertyValue, SmolStr};

/// A property value as its AMQP twin.
pub fn to_amqp(value: &PropertyValue) -> SimpleValue {
    match value {
        PropertyValue::Null => SimpleValue::Null,
        PropertyValue::Bool(v) => SimpleValue::Bool(*v),
        PropertyValue::Int32(v) => SimpleValue::Int(*v),
        PropertyValue::Int64(v) => SimpleValue::Long(*v),
        PropertyValue::UInt32(v) => SimpleValue::Uint(*v),
        PropertyValue::UInt64(v) => SimpleValue::Ulong(*v),
        PropertyValue::Float32(v) => SimpleValue::Float((*v).into()),
        PropertyValue::Float64(v) => SimpleValue::Double((*v).into()),
        PropertyValue::String(v) => SimpleValue::String(v.to_string()),
        PropertyValue::Bytes(v) => SimpleValue::Binary(Binary::from(v.to_vec())),
        PropertyValue::Timestamp(v) => SimpleValue::Timestamp(Timestamp::from_milliseconds(*v)),
        PropertyValue::Uuid(v) => SimpleValue::Uuid(Uuid::from(*v)),
    }
}

/// The property value whose twin `value` is, if it is one.
pub fn twin(value: &SimpleValue) -> Option<PropertyValue> {
    Some(match value {
        SimpleValue::Null => PropertyValue::Null,
        SimpleValue::Bool(v) => PropertyValue::Bool(*v),
        SimpleValue::Int(v) => PropertyValue::Int32(*v),
        SimpleValue::Long(v) => PropertyValue::Int64(*v),
        SimpleValue::Uint(v) => PropertyValue::UInt32(*v),
        SimpleValue::Ulong(v) => PropertyValue::UInt64(*v),
        SimpleValue::Float(v) => PropertyValue::Float32(v.into_inner()),
        SimpleValue::Double(v) => PropertyValue::Float64(v.into_inner()),
        SimpleValue::String(v) => PropertyValue::String(SmolStr::new(v)),
        SimpleValue::Binary(v) => PropertyValue::Bytes(Bytes::copy_from_slice(v)),
        SimpleValue::Timestamp(v) => PropertyValue::Timestamp(v.milliseconds()),
        SimpleValue::Uuid(v) => PropertyValue::Uuid(*v.as_inner()),
        _ => return None,
    })
}

/// The property value `value` maps to, widening a type with no twin (see the module docs).
pub fn widen(value: SimpleValue) -> PropertyValue {
    if let Some(twin) = twin(&value) {
        return twin;
    }
    match value {
        SimpleValue::Ubyte(v) => PropertyValue::UInt32(u32::from(v)),
        SimpleValue::Ushort(v) => PropertyValue::UInt32(u32::from(v)),
        SimpleValue::Byte(v) => PropertyValue::Int32(i32::from(v)),
        SimpleValue::Short(v) => PropertyValue::Int32(i32::from(v)),
        SimpleValue::Char(v) => PropertyValue::String(SmolStr::new(v.encode_utf8(&mut [0; 4]))),
        SimpleValue::Symbol(v) => PropertyValue::String(SmolStr::from(v.0)),
        other => PropertyValue::Bytes(Bytes::from(
            crate::foreign::to_vec(&other).unwrap_or_default(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp_types::primitives::Symbol;

    #[test]
    fn every_property_value_round_trips_through_its_twin() {
        let values = [
            PropertyValue::Null,
            PropertyValue::Bool(true),
            PropertyValue::Int32(-7),
            PropertyValue::Int64(1 << 40),
            PropertyValue::UInt32(7),
            PropertyValue::UInt64(u64::MAX),
            PropertyValue::Float32(1.5),
            PropertyValue::Float64(-2.25),
            PropertyValue::String("ü".into()),
            PropertyValue::Bytes(Bytes::from_static(b"\x00\x01")),
            PropertyValue::Timestamp(1_700_000_000_000),
            PropertyValue::Uuid([9; 16]),
        ];
        for value in values {
            assert_eq!(twin(&to_amqp(&value)), Some(value.clone()));
            assert_eq!(widen(to_amqp(&value)), value);
        }
    }

    #[test]
    fn types_without_a_twin_widen() {
        assert_eq!(twin(&SimpleValue::Ubyte(3)), None);
        assert_eq!(widen(SimpleValue::Ubyte(3)), PropertyValue::UInt32(3));
        assert_eq!(widen(SimpleValue::Short(-3)), PropertyValue::Int32(-3));
        assert_eq!(
            widen(SimpleValue::Symbol(Symbol::from("s"))),
            PropertyValue::String("s".into())
        );
        assert_eq!(
            widen(SimpleValue::Char('x')),
            PropertyValue::String("x".into())
        );
    }
}
