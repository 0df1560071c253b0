//! [`CountingStore`]: a checkpoint store that counts the calls a processor makes to the store
//! it wraps, for the store-request benchmarks and tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tributary_processor::store::{
    Checkpoint, CheckpointStore, Ownership, OwnershipFence, OwnershipListing, StoreError,
};

/// How many calls of each kind a [`CountingStore`] passed on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreCalls {
    /// `list_ownership` and `list_ownership_and_hosts` calls.
    pub list_ownership: u64,
    /// `renew_host` calls (host renewals with their listing; listings where the store keeps no
    /// host records).
    pub renew_host: u64,
    /// `claim_ownership` calls.
    pub claim_calls: u64,
    /// Claims inside them.
    pub claims: u64,
    /// `list_checkpoints` calls.
    pub list_checkpoints: u64,
    /// `update_checkpoint` calls.
    pub update_checkpoint: u64,
    /// `remove_host` calls.
    pub remove_host: u64,
}

impl StoreCalls {
    /// Every call, whatever its kind.
    pub fn total(&self) -> u64 {
        self.list_ownership
            + self.renew_host
            + self.claim_calls
            + self.list_checkpoints
            + self.update_checkpoint
            + self.remove_host
    }

    /// The calls made between `earlier` and `self`.
    pub fn since(&self, earlier: &StoreCalls) -> StoreCalls {
        StoreCalls {
            list_ownership: self.list_ownership - earlier.list_ownership,
            renew_host: self.renew_host - earlier.renew_host,
            claim_calls: self.claim_calls - earlier.claim_calls,
            claims: self.claims - earlier.claims,
            list_checkpoints: self.list_checkpoints - earlier.list_checkpoints,
            update_checkpoint: self.update_checkpoint - earlier.update_checkpoint,
            remove_host: self.remove_host - earlier.remove_host,
        }
    }
}

/// Passes every call to the store it wraps (host records included) and counts it.
pub struct CountingStore {
    inner: Arc<dyn CheckpointStore>,
    counts: [AtomicU64; 7],
}

const LIST_OWNERSHIP: usize = 0;
const RENEW_HOST: usize = 1;
const CLAIM_CALLS: usize = 2;
const CLAIMS: usize = 3;
const LIST_CHECKPOINTS: usize = 4;
const UPDATE_CHECKPOINT: usize = 5;
const REMOVE_HOST: usize = 6;

impl std::fmt::Debug for CountingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingStore")
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

impl CountingStore {
    /// Counts the calls made to `inner`.
    pub fn new(inner: Arc<dyn CheckpointStore>) -> CountingStore {
        CountingStore {
            inner,
            counts: Default::default(),
        }
    }

    /// The calls so far.
    pub fn calls(&self) -> StoreCalls {
        let count = |index: usize| self.counts[index].load(Ordering::Relaxed);
        StoreCalls {
            list_ownership: count(LIST_OWNERSHIP),
            renew_host: count(RENEW_HOST),
            claim_calls: count(CLAIM_CALLS),
            claims: count(CLAIMS),
            list_checkpoints: count(LIST_CHECKPOINTS),
            update_checkpoint: count(UPDATE_CHECKPOINT),
            remove_host: count(REMOVE_HOST),
        }
    }

    fn count(&self, index: usize, by: u64) {
        self.counts[index].fetch_add(by, Ordering::Relaxed);
    }
}

#[async_trait::async_trait]
impl CheckpointStore for CountingStore {
    async fn list_ownership(
        &self,
        namespace: &str,
        hub: &str,
        group: &str,
    ) -> Result<Vec<Ownership>, StoreError> {
        self.count(LIST_OWNERSHIP, 1);
        self.inner.list_ownership(namespace, hub, group).await
    }

    async fn claim_ownership(&self, claims: Vec<Ownership>) -> Result<Vec<Ownership>, StoreError> {
        self.count(CLAIM_CALLS, 1);
        self.count(CLAIMS, claims.len() as u64);
        self.inner.claim_ownership(claims).await
    }

    async fn list_checkpoints(
        &self,
        namespace: &str,
        hub: &str,
        group: &str,
    ) -> Result<Vec<Checkpoint>, StoreError> {
        self.count(LIST_CHECKPOINTS, 1);
        self.inner.list_checkpoints(namespace, hub, group).await
    }

    async fn update_checkpoint(
        &self,
        checkpoint: Checkpoint,
        fence: &OwnershipFence,
    ) -> Result<(), StoreError> {
        self.count(UPDATE_CHECKPOINT, 1);
        self.inner.update_checkpoint(checkpoint, fence).await
    }

    fn keeps_host_records(&self) -> bool {
        self.inner.keeps_host_records()
    }

    async fn renew_host(
        &self,
        namespace: &str,
        hub: &str,
        group: &str,
        owner_id: &str,
    ) -> Result<OwnershipListing, StoreError> {
        self.count(RENEW_HOST, 1);
        self.inner.renew_host(namespace, hub, group, owner_id).await
    }

    async fn list_ownership_and_hosts(
        &self,
        namespace: &str,
        hub: &str,
        group: &str,
    ) -> Result<OwnershipListing, StoreError> {
        self.count(LIST_OWNERSHIP, 1);
        self.inner
            .list_ownership_and_hosts(namespace, hub, group)
            .await
    }

    async fn remove_host(
        &self,
        namespace: &str,
        hub: &str,
        group: &str,
        owner_id: &str,
    ) -> Result<(), StoreError> {
        self.count(REMOVE_HOST, 1);
        self.inner
            .remove_host(namespace, hub, group, owner_id)
            .await
    }
}
