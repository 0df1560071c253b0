//! AMQP 1.0 frames and the per-message performatives, parsed strictly and encoded by hand.
//!
//! This crate is the hot path of Tributary's own AMQP engine (`tributary-amqp-engine`), which
//! both the hub's front door and the Rust client run on. It replaced `fe2o3-amqp` on the data
//! path, where delivering a 100-byte event cost about 13 µs of CPU (client and server together;
//! BENCHMARKS.md): a serde pass that sized every message before writing it, frames moved
//! through three channels per direction, and every annotation decoded into a generic value.
//! The frames a stream of events consists of are few and simple: `transfer` (one per event),
//! `flow` and `disposition`. This crate reads and writes exactly those, splits a byte stream
//! into frames, reads AMQP values strictly, and writes a message's sections straight into the
//! buffer they are sent from; everything rarer (`open`, `attach`, …) stays with a general AMQP
//! type codec.
//!
//! # Guarantees
//! - **Strict and total on untrusted bytes.** Every function that reads bytes returns a
//!   [`CodecError`] naming what was wrong and where; none panics, allocates in proportion to
//!   a length field, or reads past its input (property-tested with arbitrary bytes).
//! - **A frame is never larger than the negotiated maximum**: [`frame::split_frame`] refuses it
//!   from its 8-byte header alone, before the body is buffered.
//! - **What it writes is what the reference decoder reads.** Every encoder is property-tested
//!   against `serde_amqp` (the `fe2o3-amqp` types): encode by hand, decode with the reference,
//!   get the same values; and the other way round.
//! - **Full-length field lists.** Performatives are written with every field, trailing nulls
//!   included, because the Python SDK's decoder indexes fields by position.
//!
//! No `unsafe`; no dependency beyond `thiserror`.

pub mod frame;
pub mod message;
pub mod performative;
#[cfg(feature = "testing")]
pub mod testing;
pub mod value;

pub use frame::{Frame, FrameError, FrameType};
pub use performative::{DispositionFields, FlowFields, TransferFields};
pub use value::CodecError;
