//! The Azure Event Hubs AMQP dialect, written once for Tributary's server and its client.
//!
//! `tributary-amqp` (the server) and `tributary-client` both speak Event Hubs over AMQP 1.0; what
//! makes that dialect — names, conditions, limits, addresses, filters, tokens — lives here, so
//! the two ends cannot drift apart. Neither defines a dialect constant of its own.
//!
//! # What it owns
//! - **Names** ([`names`]): the `x-opt-*` message annotations, the runtime-metric delivery
//!   annotations, the receive link's properties, capability and filter, the `$cbs` and
//!   `$management` request and answer fields, and the batch message format `0x80013700`.
//! - **Conditions** ([`condition`]): the `amqp:*` and `com.microsoft:*` error symbols, and
//!   [`Refusal`], a condition with its description.
//! - **Addresses** ([`address`]): `$cbs`, `$management`, `<hub>`, `<hub>/Partitions/<id>`,
//!   `<hub>/ConsumerGroups/<group>/Partitions/<id>`, parsed and written.
//! - **Limits** ([`limits`]): batch size, message size, selector and token length, each with its
//!   reason, related by compile-time assertions where they relate.
//! - **Selectors** ([`selector`]): the start-position filter, parsed and written.
//! - **SAS tokens** ([`sas`]) and **connection strings** ([`connection_string`]).
//! - **Messages**, one module per direction, failing with one [`MessageError`], each a fast
//!   path checked against a general `fe2o3-amqp` path by property tests:
//!   - the client's: [`send`] (events → a producer's transfer bytes) and [`receive`] (a
//!     delivery's bytes → the client's event and the runtime metric);
//!   - the server's: [`ingest`] (a producer's transfer bytes, plain or a batch of format
//!     `0x80013700`, → [`EventData`](tributary_event::EventData)s, refusing with the service's
//!     conditions) and [`deliver`] (a stored event → a delivery's bytes, with the runtime-metric
//!     delivery annotations when the link asked for them).
//!
//!   The [`PropertyValue`](tributary_event::PropertyValue) ↔ AMQP mapping they share is
//!   [`property`]; [`scan`] is the strict structural check of a message the general paths
//!   run before `serde_amqp` reads it; the generic message type and its encoder are
//!   [`message`].
//!
//! - **Kafka records** ([`kafka_record`]): how a Kafka record and an event map to each other,
//!   as Event Hubs maps them between its Kafka and AMQP endpoints; the one rule of every Kafka
//!   path (the Kafka door, Kafka sources and targets).
//! - **The hub-hosted checkpoint store** ([`checkpoint_store`]): Tributary's own `$management`
//!   operations (list and claim ownership, list and update checkpoints), their requests and
//!   answers, encoded and decoded here for both ends.
//!
//! # What it does not own
//! Links, sessions, nodes and the broker: the server (`tributary-amqp`) and the client
//! (`tributary-client`) translate between the AMQP engine and these functions. Nothing here
//! depends on the broker, the log or the processor.
//!
//! # Guarantees
//! - Nothing a peer sends can panic a parser here: every error is a typed value with a sentence
//!   for the peer or the caller.
//! - No key or token is ever logged, printed by `Debug` or echoed in an error.
//! - What one end writes, the other parses back: addresses, selectors and tokens are
//!   round-trip tested.

#![forbid(unsafe_code)]

pub mod address;
pub mod checkpoint_store;
pub mod condition;
pub mod connection_string;
pub mod deliver;
pub mod foreign;
pub mod ingest;
pub mod kafka_record;
pub mod limits;
pub mod message;
pub mod names;
pub mod property;
pub mod receive;
pub mod sas;
pub mod scan;
pub mod selector;
pub mod send;
mod walk;

pub use condition::Refusal;
pub use connection_string::{ConnectionString, ConnectionStringError, Credential};
pub use message::{LastEnqueued, MessageError};
