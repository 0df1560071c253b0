//! A checkpoint store in an Azure Storage blob container, in exactly the layout the official
//! Event Hubs processors use, so Tributary hosts and .NET, Python and JavaScript
//! `EventProcessorClient`s can balance one consumer group together.
//!
//! # The layout (shared with the official SDKs)
//!
//! - Ownership: a zero-length block blob `{namespace}/{hub}/{group}/ownership/{partition}`,
//!   metadata `ownerid` (`""` once relinquished). Checkpoint: a zero-length block blob
//!   `{namespace}/{hub}/{group}/checkpoint/{partition}`, metadata `offset` and
//!   `sequencenumber` as decimal strings. Names are lower-cased whole, as Python does.
//! - A first claim is a Put Blob with `If-None-Match: *`; every later claim (renewal, steal,
//!   release) is a Set Blob Metadata with `If-Match: <etag>`. A 412 or 409 (or a 404 for a
//!   blob that vanished) means another claimant won: the claim is left out of the result, as
//!   the trait requires. The ETag is the record's etag; the server's `Last-Modified` is its
//!   modification time.
//! - Listing is List Blobs by prefix with `include=metadata`, following `NextMarker`.
//! - Reads take what other SDKs write: extra keys (.NET's client identifier), an empty or
//!   non-numeric `offset` (read as no offset), missing keys. A checkpoint with neither a usable
//!   offset nor a sequence number is skipped, as .NET does. We write `offset` and
//!   `sequencenumber` whenever the checkpoint has them, never as empty strings (the host's
//!   checkpoints always have both; a sequence-only checkpoint written through the trait has no
//!   `offset` key, which the JavaScript processor refuses to read).
//!
//! # Ownership versions on a layout that has none
//!
//! The trait's [`Ownership::version`] must grow with every claim and never go back: the host
//! opens its receiver with it as the epoch, and judges a record alive by watching it change.
//! The official SDKs know nothing of versions, and each of their claims replaces all of the
//! blob's metadata. So:
//!
//! - **Our claims carry the version** in one extra metadata key, `tributaryversion`, written
//!   atomically with `ownerid` by the same conditional request. The SDKs ignore the key.
//! - **A record without the key was last claimed by an official SDK.** Its version is the
//!   server's `Last-Modified` in milliseconds: a foreign claim carries no number, so the time
//!   it happened stands in for one. Our versions start at 1 and grow by one a claim (after a
//!   foreign record, from its time), so as long as a partition sees at most one claim per
//!   millisecond they stay below the server's clock, and a Tributary claim over a foreign
//!   record (version `t + 1`) outranks every epoch a Tributary host used before that foreign
//!   claim.
//! - **The ETag is the change signal.** Each store remembers the last (etag, version) it
//!   reported per partition; a record whose ETag changed is never reported with a version at
//!   or below the remembered one. So an SDK's renewals (same owner, new ETag, no key) move the
//!   version we report even within one second of `Last-Modified`, and other hosts see that
//!   owner as alive.
//!
//! The official SDKs open their receivers with owner level 0, so any Tributary claim fences
//! them at the hub; a Tributary host that loses a partition to an SDK is fenced by the SDK's
//! claim in the store (its checkpoints are refused) and stops its pump at the next balancing
//! round.
//!
//! # Limits
//!
//! - A fenced checkpoint reads the ownership blob and then writes the checkpoint blob: two
//!   requests, not one transaction (blob storage has none across blobs). A claim landing
//!   between them lets the former owner's checkpoint through once; the hub's epoch fence
//!   still keeps it from reading further.
//! - Two Tributary hosts can report different versions for a record last claimed by an SDK
//!   (each counts the ETag changes it saw); each host's own view never goes back, and what a
//!   Tributary claim writes is always above the foreign record's `Last-Modified`.
//! - Claims in one call run one after another (one or two requests each).
//!
//! Authentication is a Shared Key (requests signed as Azure Storage documents) or a SAS token
//! ([`BlobCredential`]); neither ever appears in logs or errors. The HTTP client, signing and
//! listing are `tributary-blob`'s; this module keeps only the layout and its rules.

mod records;
mod requests;

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use tributary_blob::{ContainerClient, ListedBlob, credential_from_environment};

pub use tributary_blob::{BlobCredential, ConnectionString};

use super::{
    Checkpoint, CheckpointStore, Ownership, OwnershipFence, ScopeKey, StoreError,
    validate_checkpoint, validate_claim,
};
use requests::store_error;

/// Our metadata key for the ownership version; the official SDKs ignore and drop it.
pub const VERSION_KEY: &str = "tributaryversion";

/// What the store last reported for one partition's ownership record.
#[derive(Debug, Clone)]
struct Seen {
    etag: String,
    version: i64,
}

/// A [`CheckpointStore`] in an Azure Storage (or Azurite) blob container.
pub struct BlobCheckpointStore {
    client: ContainerClient,
    seen: Mutex<HashMap<(ScopeKey, String), Seen>>,
}

impl std::fmt::Debug for BlobCheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobCheckpointStore")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

fn backend(operation: &'static str, description: impl Into<String>) -> StoreError {
    StoreError::Backend {
        operation,
        description: description.into(),
    }
}

/// The outcome of a write: done (new etag and time), or lost to another writer.
enum Write {
    Done { etag: String, last_modified_ms: i64 },
    Conflict,
    NotFound,
}

impl BlobCheckpointStore {
    /// Opens the container at `url` (`https://{account}.blob.core.windows.net/{container}`, or
    /// path-style `http://127.0.0.1:10000/{account}/{container}` for Azurite), creating it if
    /// absent. The credential is a SAS in the URL's query (`?sv=…&sig=…`) or `credential`
    /// (a Shared Key for the URL's account); exactly one of the two.
    pub async fn from_url(
        url: &str,
        credential: Option<BlobCredential>,
    ) -> Result<Self, StoreError> {
        let client = ContainerClient::from_url(url, credential).map_err(store_error)?;
        client
            .create_container_if_absent()
            .await
            .map_err(store_error)?;
        Ok(BlobCheckpointStore {
            client,
            seen: Mutex::new(HashMap::new()),
        })
    }

    /// [`from_url`](Self::from_url) with the credential from the environment when the URL has
    /// no SAS: `AZURE_STORAGE_CONNECTION_STRING` (its key), else `AZURE_STORAGE_KEY` (the key
    /// of the URL's account). For a command line's `--store https://…`.
    pub async fn from_url_and_environment(url: &str) -> Result<Self, StoreError> {
        let credential = credential_from_environment(
            url,
            std::env::var("AZURE_STORAGE_CONNECTION_STRING").ok(),
            std::env::var("AZURE_STORAGE_KEY").ok(),
        )
        .map_err(store_error)?;
        BlobCheckpointStore::from_url(url, credential).await
    }

    /// Opens `container` at the endpoint and with the credential a storage connection string
    /// gives, creating the container if absent.
    pub async fn from_connection_string(
        connection_string: &str,
        container: &str,
    ) -> Result<Self, StoreError> {
        let parsed =
            BlobCredential::from_connection_string(connection_string).map_err(store_error)?;
        let url = format!("{}/{container}", parsed.blob_endpoint);
        BlobCheckpointStore::from_url(&url, Some(parsed.credential)).await
    }

    /// How many requests this store has sent to the service (retries included): what the
    /// store costs, for benchmarks and metrics.
    pub fn requests_sent(&self) -> u64 {
        self.client.requests_sent()
    }

    /// The container's URL, without any SAS token.
    pub fn container_url(&self) -> String {
        self.client.container_url()
    }
}

/// Metadata values travel as header values: printable ASCII only.
fn validate_value(what: &'static str, value: &str) -> Result<(), StoreError> {
    if value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        Ok(())
    } else {
        Err(StoreError::Invalid {
            what,
            reason: format!("{value:?} is not printable ASCII, which blob metadata requires"),
        })
    }
}

fn blob_name(scope: &ScopeKey, kind: &str, partition_id: &str) -> String {
    format!(
        "{}/{}/{}/{kind}/{}",
        scope.namespace,
        scope.hub,
        scope.consumer_group,
        partition_id.to_lowercase()
    )
}

fn prefix(scope: &ScopeKey, kind: &str) -> String {
    format!(
        "{}/{}/{}/{kind}/",
        scope.namespace, scope.hub, scope.consumer_group
    )
}
