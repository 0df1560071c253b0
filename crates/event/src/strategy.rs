//! Proptest strategies for the data model, shared by the crates' property tests (feature
//! `arbitrary`, enabled only as a dev-dependency).
//!
//! # Guarantees
//! [`property_value`] yields every [`PropertyValue`] variant, with finite floats only, so a
//! value that went through an encoder and back compares equal to the original.
//! [`any_property_value`] yields the same and floats of every bit pattern (NaN, infinities,
//! negative zero), for codecs whose round trips are compared by their bytes or debug text.

use proptest::prelude::*;

use crate::PropertyValue;

/// Any [`PropertyValue`], strings of up to 40 characters and byte strings of up to 40 bytes;
/// floats are finite (a NaN is never equal to itself, so round trips could not be compared).
pub fn property_value() -> BoxedStrategy<PropertyValue> {
    with_floats((-1e30f32..1e30).boxed(), (-1e300f64..1e300).boxed())
}

/// [`property_value`] with floats of every bit pattern.
pub fn any_property_value() -> BoxedStrategy<PropertyValue> {
    with_floats(
        any::<u32>().prop_map(f32::from_bits).boxed(),
        any::<u64>().prop_map(f64::from_bits).boxed(),
    )
}

fn with_floats(f32s: BoxedStrategy<f32>, f64s: BoxedStrategy<f64>) -> BoxedStrategy<PropertyValue> {
    prop_oneof![
        Just(PropertyValue::Null),
        any::<bool>().prop_map(PropertyValue::Bool),
        any::<i32>().prop_map(PropertyValue::Int32),
        any::<i64>().prop_map(PropertyValue::Int64),
        any::<u32>().prop_map(PropertyValue::UInt32),
        any::<u64>().prop_map(PropertyValue::UInt64),
        f32s.prop_map(PropertyValue::Float32),
        f64s.prop_map(PropertyValue::Float64),
        ".{0,40}".prop_map(|s| PropertyValue::String(s.into())),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(|b| PropertyValue::Bytes(b.into())),
        any::<i64>().prop_map(PropertyValue::Timestamp),
        any::<[u8; 16]>().prop_map(PropertyValue::Uuid),
    ]
    .boxed()
}
