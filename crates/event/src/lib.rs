//! The event data model every Tributary layer shares.
//!
//! This crate owns the vocabulary, not the behaviour: what an event is ([`EventData`], with typed
//! [`PropertyValue`]s, and [`PropertyValueRef`] to read one in place; property keys and string values are [`SmolStr`]s, inline when short and
//! shared when long), what a stored event carries once the log has accepted it
//! ([`ReceivedEvent`]: sequence number, offset, enqueued time), where a reader starts
//! ([`EventPosition`]), how a partition key picks a partition ([`partition_for_key`], the same
//! hash Azure Event Hubs uses), and which names are legal for event hubs, consumer groups and
//! partitions ([`names`]), and how a file written by a newer format than this build reads is
//! refused ([`format`]).
//!
//! It has no I/O and no async runtime, so the log, the broker, every front door and the client can
//! all depend on it without pulling each other in.

mod clock;
mod event;
pub mod format;
pub mod names;
mod partition_key;
mod position;
#[cfg(feature = "arbitrary")]
pub mod strategy;

pub use clock::{Clock, ManualClock, SystemClock};
pub use event::{
    EventData, PAIRWISE_KEY_CHECK_MAX, PropertyValue, PropertyValueRef, ReceivedEvent, SmolStr,
    repeats_a_property_key, uuid_text,
};
pub use partition_key::{partition_for_key, partition_key_hash};
pub use position::{EventPosition, SendTarget};
