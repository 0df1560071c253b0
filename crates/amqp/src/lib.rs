//! Tributary's AMQP 1.0 front door: the Azure Event Hubs dialect over the broker.
//!
//! The official Event Hubs SDKs (Python `azure-eventhub` ≥ 5.12, JavaScript `@azure/event-hubs`)
//! work against it unmodified, given a connection string such as
//! `Endpoint=sb://localhost:5672;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=…;UseDevelopmentEmulator=true`
//! (see [`connection_string`]).
//!
//! # What it serves
//! - **Connections**: plain TCP or TLS (AMQPS), with the SASL header (`ANONYMOUS`, `MSSBCBS`, or
//!   `PLAIN` with a policy's name and key) or the bare AMQP header; and byte streams another
//!   front door accepted and hands over through [`AmqpConnections`] (AMQP over WebSockets,
//!   carried by the HTTP door), served and authenticated the same way.
//! - **Security** ([`policies`], `tributary_eventhubs::sas`): named shared access policies with Listen, Send and
//!   Manage rights, each with a primary and a secondary key, on the namespace or on one event
//!   hub, persisted in `<data_dir>/access-policies.json` and changed live (a regenerated key is
//!   refused from the next token or login on). Clients put SAS tokens on `$cbs`; each verified
//!   token grants its audience on that connection. No link attaches without a grant covering
//!   its entity with the needed right.
//! - **`$management`**: `READ` of `com.microsoft:eventhub` and `com.microsoft:partition`.
//! - **Send links** to `<hub>` and `<hub>/Partitions/<id>`: single and batched messages, partition
//!   keys, settled `accepted` only once the append is durable; a link's deliveries are appended
//!   in arrival order with several in flight ([`limits::SEND_PIPELINE_MAX`]).
//! - **Receive links** from `<hub>/ConsumerGroups/<group>/Partitions/<id>`: selector-filter start
//!   positions, epochs, the five-receiver limit, runtime metrics, credit-based flow.
//!
//! # Structure
//! [`start`] binds the listener (the private `server` module). Connections run on Tributary's
//! own AMQP engine (`tributary-amqp-engine`: a sans-IO connection state machine and its tokio
//! driver), used only by the private `wire` module; the rare performatives keep the
//! `fe2o3-amqp-types` types. This crate only translates: it attaches links to nodes, answers
//! `$cbs` and `$management`, checks grants, calls the broker and maps its errors to conditions
//! ([`conditions`]). The dialect itself is `tributary-eventhubs`, shared with the client: names,
//! link addresses, selector filters, tokens, error conditions, and both of the server's message
//! directions — `tributary_eventhubs::ingest` (a producer's transfer, plain or batched, into
//! events) and `tributary_eventhubs::deliver` (a stored event into a delivery's bytes). Limits
//! and their reasons are in [`limits`].
//!
//! # Guarantees
//! - Nothing a peer sends can panic the server: peer errors become AMQP errors (a rejected
//!   delivery, a detach, a CBS status, a closed connection).
//! - No key or token is ever logged or echoed in an error.
//! - Connections are capped in total and per source address, and a connection that has not
//!   authenticated must open and put a valid token within short deadlines, with a small
//!   allowance of bytes, sessions and links meanwhile ([`limits::ConnectionLimits`]; refusals
//!   are `amqp:resource-limit-exceeded` and `amqp:unauthorized-access` closes). Authenticated
//!   connections keep only their idle timeout.

#![forbid(unsafe_code)]

pub mod auth;
mod budget;
pub mod conditions;
mod error;
pub mod limits;
pub mod policies;
mod server;
mod wire;

pub use error::AmqpError;
pub use policies::{AccessPolicies, AccessPolicy, Right, connection_string, tls_connection_string};
pub use server::{AmqpConfig, AmqpConnections, RunningAmqpServer, start};
