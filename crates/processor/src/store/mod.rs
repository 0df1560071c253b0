//! Where ownership and checkpoints live: the [`CheckpointStore`] trait and its two stores.
//!
//! This module owns the records every host of a consumer group shares. It follows the Azure
//! SDKs' checkpoint-store shape (list and claim ownership, list and update checkpoints), with two
//! additions that turn leases into fences:
//!
//! - **Ownership versions.** Every successful claim of a partition — a take-over, a renewal, a
//!   release — adds one to its [`Ownership::version`], which never goes back. The host opens its
//!   receiver with that version as the epoch, so a newer owner always outranks an older one at
//!   the hub, and other hosts judge liveness by watching the version move on their own monotonic
//!   clocks, never by comparing wall clocks.
//! - **Fenced checkpoints.** [`CheckpointStore::update_checkpoint`] takes an [`OwnershipFence`]
//!   and refuses ([`StoreError::OwnershipLost`]) a checkpoint from anyone but the partition's
//!   current owner, so a host that lost a partition cannot move its checkpoint.
//!
//! - **Host records.** Stores only Tributary processors read (memory, SQLite, PostgreSQL, the
//!   hub-hosted store) also keep one liveness record per host ([`HostRecord`]). A host then
//!   proves it is alive with one [`CheckpointStore::renew_host`] per balancing cycle — which
//!   also lists the group's ownership — instead of re-claiming every partition it owns, so a
//!   fleet's steady state costs one store request per host per cycle whatever the partition
//!   count. The Azure Blob store keeps none: the official processors sharing its container judge
//!   each ownership blob by its own modification time, so every partition must be renewed there.
//!
//! A claim is conditional on the etag the claimant last saw: `None` means "only if no record
//! exists", `Some(etag)` means "only if the record still has this etag". Losing that race is a
//! normal outcome, not an error: the lost claim is simply missing from the result.
//!
//! Records are keyed by (namespace, event hub, consumer group, partition). The first three
//! compare case-insensitively, as they do in Event Hubs; stores keep and return them in
//! lowercase (the blob layout of the Azure SDKs does the same).
//!
//! Stores: [`InMemoryCheckpointStore`] (one process); with the `sqlite` feature,
//! `SqliteCheckpointStore` (one file that several processes on a machine share); with the
//! `postgres` feature, `PostgresCheckpointStore` (three tables — ownership, checkpoints and
//! hosts — that processors on many machines share); with the `blob` feature,
//! `BlobCheckpointStore` (an Azure Storage container, in the layout the official Event Hubs
//! processors share). All pass one conformance suite
//! (`conformance`, public with the `conformance` feature for tests that bring their own server).
//! [`open_url`] opens any of them from a URL.

#[cfg(feature = "blob")]
pub mod blob;
mod location;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

use thiserror::Error;

#[cfg(feature = "blob")]
pub use blob::{BlobCheckpointStore, BlobCredential};
pub use location::{StoreLocation, open_url};
pub use memory::InMemoryCheckpointStore;
#[cfg(feature = "postgres")]
pub use postgres::{
    PostgresCheckpointStore, PostgresUrl, describe_error as describe_postgres_error,
};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteCheckpointStore;

/// Who owns one partition for one consumer group, as the store last recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    /// The namespace's host name.
    pub fully_qualified_namespace: String,
    /// The event hub.
    pub event_hub_name: String,
    /// The consumer group.
    pub consumer_group: String,
    /// The partition.
    pub partition_id: String,
    /// The owning host's name; `""` when the partition was relinquished.
    pub owner_id: String,
    /// When the store last changed the record, in milliseconds since the Unix epoch (the
    /// store's clock). For people reading the table; never used to judge expiry.
    pub last_modified_time_ms: i64,
    /// The record's current etag; `None` in a claim means "only if no record exists".
    pub etag: Option<String>,
    /// Grows by one with every successful claim of this partition and never goes back. Assigned
    /// by the store; ignored in a claim.
    pub version: i64,
}

impl Ownership {
    /// Whether nobody owns the partition (it was relinquished).
    pub fn is_relinquished(&self) -> bool {
        self.owner_id.is_empty()
    }
}

/// One host's liveness record, in stores that keep one per host (see
/// [`CheckpointStore::renew_host`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRecord {
    /// The host's owner id, as its ownership records name it.
    pub owner_id: String,
    /// Grows with every renewal; other hosts judge the host alive while they see it move. A
    /// store may start it again from 1 when it loses its host records (the hub-hosted store
    /// keeps them in memory): any change counts as a renewal.
    pub version: i64,
    /// When the store last renewed the record, ms since the Unix epoch (its clock). For people
    /// reading the table, and for the store to forget hosts silent for
    /// [`HOST_RECORD_RETENTION`](crate::limits::HOST_RECORD_RETENTION); never used to judge
    /// expiry.
    pub last_modified_time_ms: i64,
}

/// A consumer group's ownership records and, where the store keeps them, its host records.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OwnershipListing {
    /// Every ownership record of the group's partitions.
    pub ownership: Vec<Ownership>,
    /// Every host record of the group (empty in stores that keep none).
    pub hosts: Vec<HostRecord>,
}

impl OwnershipListing {
    /// The listing of a store that keeps no host records.
    pub fn without_hosts(ownership: Vec<Ownership>) -> OwnershipListing {
        OwnershipListing {
            ownership,
            hosts: Vec::new(),
        }
    }
}

/// How far one consumer group has processed one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The namespace's host name.
    pub fully_qualified_namespace: String,
    /// The event hub.
    pub event_hub_name: String,
    /// The consumer group.
    pub consumer_group: String,
    /// The partition.
    pub partition_id: String,
    /// The offset of the last processed event; reading resumes after it.
    pub offset: Option<u64>,
    /// The sequence number of the last processed event; used to resume when there is no offset.
    pub sequence_number: Option<i64>,
}

/// Who claims to own a partition when writing its checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnershipFence {
    /// The host name the store's ownership record must show.
    pub owner_id: String,
}

/// Why a store operation failed.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StoreError {
    /// The checkpoint was refused: the partition's current owner is not the fence's owner.
    #[error(
        "checkpoint for partition {partition_id} refused: it is owned by {current}, not by \
         {fence_owner:?}",
        current = owner_display(current_owner)
    )]
    OwnershipLost {
        /// The partition.
        partition_id: String,
        /// The owner the store has on record (`""` for nobody).
        current_owner: String,
        /// The owner the fence named.
        fence_owner: String,
    },
    /// The request itself is wrong (a caller's mistake, not the store's).
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What was wrong, e.g. "checkpoint".
        what: &'static str,
        /// Why, in words a person can act on.
        reason: String,
    },
    /// The store could not do its job (I/O, a locked or corrupt database file).
    #[error("checkpoint store failed while {operation}: {description}")]
    Backend {
        /// What the store was doing, e.g. "claiming ownership".
        operation: &'static str,
        /// What went wrong.
        description: String,
    },
}

fn owner_display(owner_id: &str) -> String {
    if owner_id.is_empty() {
        "nobody".to_owned()
    } else {
        format!("{owner_id:?}")
    }
}

/// Stores ownership and checkpoints for the hosts of a consumer group.
///
/// Implementations must make each claim atomic (compare the etag and write in one step), assign
/// a fresh etag, the next version and the modification time on every successful claim, and check
/// the fence and write a checkpoint in one step.
#[async_trait::async_trait]
pub trait CheckpointStore: Send + Sync + 'static {
    /// Every ownership record of the consumer group's partitions on this hub.
    async fn list_ownership(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<Vec<Ownership>, StoreError>;

    /// Tries every claim; returns the records of the claims that won, as now stored. A claim
    /// whose etag no longer matches is left out of the result: that is not an error.
    async fn claim_ownership(&self, claims: Vec<Ownership>) -> Result<Vec<Ownership>, StoreError>;

    /// Every checkpoint of the consumer group on this hub.
    async fn list_checkpoints(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<Vec<Checkpoint>, StoreError>;

    /// Writes a checkpoint if `fence.owner_id` is the partition's current owner; otherwise
    /// returns [`StoreError::OwnershipLost`] and writes nothing.
    async fn update_checkpoint(
        &self,
        checkpoint: Checkpoint,
        fence: &OwnershipFence,
    ) -> Result<(), StoreError>;

    /// Whether the store keeps a [`HostRecord`] per host, so that hosts prove they are alive
    /// with [`CheckpointStore::renew_host`] instead of re-claiming each partition. Only for
    /// stores no other kind of processor reads. Default: `false`.
    fn keeps_host_records(&self) -> bool {
        false
    }

    /// Renews `owner_id`'s host record (creating it at version 1; forgetting other hosts'
    /// records silent for [`HOST_RECORD_RETENTION`](crate::limits::HOST_RECORD_RETENTION)) and
    /// returns the group's ownership and host records, the renewed one included — in one
    /// request where the store can. Stores without host records (the default) only list
    /// ownership.
    async fn renew_host(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
        owner_id: &str,
    ) -> Result<OwnershipListing, StoreError> {
        let _ = owner_id;
        self.list_ownership_and_hosts(fully_qualified_namespace, event_hub_name, consumer_group)
            .await
    }

    /// The group's ownership records and, where the store keeps them, its host records,
    /// renewing nothing: for people and tools looking at a group. Stores without host records
    /// (the default) list ownership only.
    async fn list_ownership_and_hosts(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<OwnershipListing, StoreError> {
        let ownership = self
            .list_ownership(fully_qualified_namespace, event_hub_name, consumer_group)
            .await?;
        Ok(OwnershipListing::without_hosts(ownership))
    }

    /// Forgets `owner_id`'s host record, when a host stops gracefully after relinquishing its
    /// partitions. Default (stores without host records): nothing.
    async fn remove_host(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
        owner_id: &str,
    ) -> Result<(), StoreError> {
        let _ = (
            fully_qualified_namespace,
            event_hub_name,
            consumer_group,
            owner_id,
        );
        Ok(())
    }
}

/// The horizon of host records at `now_ms`: a record last renewed at or before it has been
/// silent for [`HOST_RECORD_RETENTION`](crate::limits::HOST_RECORD_RETENTION) and is forgotten.
pub(crate) fn host_record_horizon_ms(now_ms: i64) -> i64 {
    let retention = crate::limits::HOST_RECORD_RETENTION;
    now_ms.saturating_sub(i64::try_from(retention.as_millis()).unwrap_or(i64::MAX))
}

/// Refuses a host record a store cannot keep.
pub(crate) fn validate_host(owner_id: &str) -> Result<(), StoreError> {
    if owner_id.is_empty() {
        return Err(StoreError::Invalid {
            what: "host record",
            reason: "the owner id is empty".to_owned(),
        });
    }
    Ok(())
}

/// The case-insensitive key of (namespace, hub, consumer group): what stores index by.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ScopeKey {
    pub(crate) namespace: String,
    pub(crate) hub: String,
    pub(crate) consumer_group: String,
}

impl ScopeKey {
    pub(crate) fn new(namespace: &str, hub: &str, consumer_group: &str) -> Self {
        ScopeKey {
            namespace: tributary_event::names::name_key(namespace),
            hub: tributary_event::names::name_key(hub),
            consumer_group: tributary_event::names::name_key(consumer_group),
        }
    }
}

/// Refuses a claim a store cannot file under a partition.
pub(crate) fn validate_claim(claim: &Ownership) -> Result<(), StoreError> {
    if claim.partition_id.is_empty() {
        return Err(StoreError::Invalid {
            what: "ownership claim",
            reason: "the partition id is empty".to_owned(),
        });
    }
    if claim.consumer_group.is_empty() {
        return Err(StoreError::Invalid {
            what: "ownership claim",
            reason: format!(
                "the consumer group for partition {} is empty",
                claim.partition_id
            ),
        });
    }
    Ok(())
}

/// Refuses a checkpoint that does not say where to resume.
/// A checkpoint's offset as an SQL `BIGINT` holds it; an offset above `i64::MAX` is refused.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn sql_offset(checkpoint: &Checkpoint) -> Result<Option<i64>, StoreError> {
    checkpoint
        .offset
        .map(|offset| {
            i64::try_from(offset).map_err(|_| StoreError::Invalid {
                what: "checkpoint",
                reason: format!(
                    "offset {offset} of partition {} is above {}, the largest this store can keep",
                    checkpoint.partition_id,
                    i64::MAX
                ),
            })
        })
        .transpose()
}

pub(crate) fn validate_checkpoint(checkpoint: &Checkpoint) -> Result<(), StoreError> {
    if checkpoint.offset.is_none() && checkpoint.sequence_number.is_none() {
        return Err(StoreError::Invalid {
            what: "checkpoint",
            reason: format!(
                "the checkpoint for partition {} has neither an offset nor a sequence number",
                checkpoint.partition_id
            ),
        });
    }
    if checkpoint.partition_id.is_empty() {
        return Err(StoreError::Invalid {
            what: "checkpoint",
            reason: "the partition id is empty".to_owned(),
        });
    }
    Ok(())
}

/// A new etag: unique across processes sharing a store.
pub(crate) fn new_etag() -> String {
    uuid::Uuid::new_v4().to_string()
}
