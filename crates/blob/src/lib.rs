//! Tributary's client for Azure Blob Storage (and Azurite): one container, the few operations
//! Tributary's blob users need, nothing of any caller's layout.
//!
//! - [`ContainerClient`]: a container named by its URL
//!   (`https://{account}.blob.core.windows.net/{container}`, or path-style
//!   `http://127.0.0.1:10000/{account}/{container}` as Azurite serves), with a [`BlobCredential`]:
//!   a Shared Key (every request signed as Azure Storage documents) or a SAS token. Connection
//!   strings as the portal and Azurite print them are read by
//!   [`BlobCredential::from_connection_string`].
//! - Requests: [`ContainerClient::send`] signs and sends any Blob service request; on top of it
//!   List Blobs (following `NextMarker`), Get Blob Properties, ranged Get Blob, Put Block and
//!   Put Block List.
//! - Transport: HTTP/1.1 on a few kept-alive connections; `https` through rustls with the
//!   webpki roots (the default feature `tls`).
//!
//! # Guarantees
//! Every request ends within 30 s (connecting included). A request that fails on a kept
//! connection is sent once more on a new one, so every request must be safe to repeat (the
//! callers' writes are conditional or idempotent). Errors name the host, path and the service's
//! status and error code, never the query (a SAS token) or a key. Nothing here panics on what the
//! network sends.
//!
//! All calls are async and need a Tokio runtime with I/O and time enabled.

mod auth;
mod client;
mod error;
mod http;
mod listing;

pub use auth::{BlobCredential, ConnectionString};
pub use client::{
    BlobProperties, ContainerClient, SERVICE_VERSION, block_id, credential_from_environment,
    http_date_ms, refused, unquote,
};
pub use error::BlobError;
pub use http::Response;
pub use listing::{ListedBlob, Page};
