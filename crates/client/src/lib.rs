//! The Tributary client: AMQP 1.0 in the Azure Event Hubs dialect, for a Tributary hub's AMQP
//! front door and for Azure Event Hubs alike.
//!
//! This crate owns everything between an application and a hub reached over the network:
//!
//! - [`ConnectionString`]: the `Endpoint=sb://…;SharedAccessKeyName=…;SharedAccessKey=…` strings
//!   the portal, the emulator and `tributary` hand out (`UseDevelopmentEmulator=true` for plain
//!   TCP on 5672; otherwise TLS on 5671).
//! - [`sas`]: shared access signature tokens, signed as the Azure SDKs sign them; a background
//!   task renews the token on `$cbs` before it expires.
//! - [`ProducerClient`]: sends events to a partition, by partition key, or round-robin; one call
//!   is one transfer (a batch for more than one event) and returns once the hub accepted it;
//!   concurrent calls pipeline on one link, which is how a producer gets past one round trip
//!   per batch.
//! - [`ConsumerClient`] and [`EventReceiver`]: read a partition from any [`EventPosition`], with
//!   an owner level (epoch) or without, with credit-based prefetch and the runtime metric.
//! - Hub and partition properties through `$management`.
//! - [`HubCheckpointStore`]: the processor's checkpoint store that a Tributary hub hosts,
//!   over the same connection (Azure Event Hubs refuses it with a clear error).
//! - [`failover`]: a hub named through an alias — a file holding the active endpoint, or DNS SRV
//!   records — that the client follows when it changes or the active endpoint keeps failing.
//! - [`RemoteHub`]: a [`tributary_source::PartitionSource`], so the event processor host
//!   (`tributary-processor`) runs against a remote hub. The client depends on the source traits
//!   and the processor's store trait (none of its store backends), not on the broker or SQLite.
//!
//! The AMQP protocol runs on Tributary's own engine (`tributary-amqp-engine`, one task per
//! connection; see `amqp.rs`), TLS on rustls, and the data model is `tributary-event`'s.
//!
//! # Guarantees
//!
//! - **A send is acknowledged or it failed.** [`ProducerClient::send`] returns `Ok` only after
//!   the hub settled the transfer as accepted; the events of one call land together in one
//!   partition, in order.
//! - **Ownership loss is loud.** A receiver taken over by a higher owner level fails with
//!   [`ClientError::OwnershipLost`] (never a silent reconnect), which [`RemoteHub`] passes to the
//!   processor host as [`SourceError::OwnershipLost`](tributary_source::SourceError).
//! - **Nothing is retried behind the caller's back.** A dropped connection surfaces as
//!   [`ClientError::ConnectionLost`] on the operations that were using it; the next operation
//!   reconnects.
//! - **Secrets stay secret.** Keys and tokens never appear in `Debug`, `Display` or errors.
//! - **The network cannot crash the client.** Whatever a peer sends becomes a value or a
//!   [`ClientError::Protocol`], never a panic.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use tributary_client::{ConsumerClient, ProducerClient, SendTarget};
//! use tributary_event::{EventData, EventPosition, PropertyValue};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tributary_client::ClientError> {
//! let connection_string = "Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;\
//!     SharedAccessKey=...;UseDevelopmentEmulator=true";
//!
//! let producer = ProducerClient::connect(connection_string, "orders").await?;
//! let event = EventData::new("order placed").with_property("amount", PropertyValue::Int64(42));
//! producer
//!     .send(&[event], SendTarget::PartitionKey("customer-17".to_owned()))
//!     .await?;
//!
//! let consumer = ConsumerClient::connect(connection_string, "orders").await?;
//! for partition in consumer.hub_properties().await?.partition_ids {
//!     let mut receiver = consumer
//!         .open_receiver(&partition, "$Default", EventPosition::Earliest, None, 300)
//!         .await?;
//!     for event in receiver.receive(100, Duration::from_secs(1)).await? {
//!         println!("{partition}/{}: {:?}", event.sequence_number, event.data.body);
//!     }
//!     receiver.close().await;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Running the processor host against a remote hub:
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use tributary_client::RemoteHub;
//! use tributary_processor::{EventProcessorHost, InMemoryCheckpointStore, processor_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let connection_string = "";
//! let hub = Arc::new(RemoteHub::connect(connection_string, "orders").await?);
//! let store = Arc::new(InMemoryCheckpointStore::new());
//! let factory = processor_fn(|context, events| async move {
//!     println!("{} events from partition {}", events.len(), context.partition_id());
//!     let _ = context.checkpoint().await;
//! });
//! let host = EventProcessorHost::builder(hub, store, factory).build()?.start()?;
//! # host.shutdown().await?;
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

mod amqp;
mod checkpoint_store;
mod connection;
pub use tributary_eventhubs::connection_string;
mod consumer;
mod error;
pub mod failover;
pub mod limits;
mod management;
mod producer;
mod remote;
mod request_response;
pub mod sas;
mod tls;

pub use checkpoint_store::HubCheckpointStore;
pub use connection::ClientOptions;
pub use connection_string::{ConnectionString, ConnectionStringError, Credential};
pub use consumer::{ConsumerClient, EventReceiver};
pub use error::ClientError;
pub use failover::{AliasEndpoint, FailoverOptions, HubAlias};
pub use management::{EventHubProperties, PartitionProperties};
pub use producer::ProducerClient;
pub use remote::RemoteHub;
pub use tls::TlsError;
#[cfg(feature = "tls")]
pub use tls::tls_handshake;
pub use tributary_event::SendTarget;
pub use tributary_event::{EventData, EventPosition, PropertyValue, ReceivedEvent};
pub use tributary_source::{LastEnqueuedEventProperties, ReceiverOptions};
