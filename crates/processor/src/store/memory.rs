//! A checkpoint store in this process's memory.
//!
//! For tests, demos, and several hosts in one process. Everything is lost when the process
//! exits. Each call takes one lock for its whole duration, so every claim and every fenced
//! checkpoint is atomic.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tributary_event::{Clock, SystemClock};

use super::{
    Checkpoint, CheckpointStore, HostRecord, Ownership, OwnershipFence, OwnershipListing, ScopeKey,
    StoreError, host_record_horizon_ms, new_etag, validate_checkpoint, validate_claim,
    validate_host,
};

type RecordKey = (ScopeKey, String);

/// A [`CheckpointStore`] kept in memory; share it between hosts with an `Arc`.
#[derive(Debug)]
pub struct InMemoryCheckpointStore {
    clock: Arc<dyn Clock>,
    records: Mutex<Records>,
}

#[derive(Debug, Default)]
struct Records {
    ownership: BTreeMap<RecordKey, Ownership>,
    checkpoints: BTreeMap<RecordKey, Checkpoint>,
    /// Host records by (scope, owner id).
    hosts: BTreeMap<RecordKey, HostRecord>,
}

impl Default for InMemoryCheckpointStore {
    fn default() -> Self {
        InMemoryCheckpointStore::new()
    }
}

impl InMemoryCheckpointStore {
    /// An empty store stamping records with the system clock.
    pub fn new() -> Self {
        InMemoryCheckpointStore::with_clock(Arc::new(SystemClock))
    }

    /// An empty store stamping `last_modified_time_ms` with `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        InMemoryCheckpointStore {
            clock,
            records: Mutex::new(Records::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Records> {
        // A panic while holding the lock cannot leave a half-written record: every update is a
        // single map insert. So a poisoned lock is still consistent.
        self.records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn ownership_key(record: &Ownership) -> RecordKey {
    (
        ScopeKey::new(
            &record.fully_qualified_namespace,
            &record.event_hub_name,
            &record.consumer_group,
        ),
        record.partition_id.clone(),
    )
}

fn checkpoint_key(checkpoint: &Checkpoint) -> RecordKey {
    (
        ScopeKey::new(
            &checkpoint.fully_qualified_namespace,
            &checkpoint.event_hub_name,
            &checkpoint.consumer_group,
        ),
        checkpoint.partition_id.clone(),
    )
}

/// Applies one claim to `records` if its etag matches; returns the stored record if it won.
fn try_claim(records: &mut Records, claim: Ownership, now_ms: i64) -> Option<Ownership> {
    let key = ownership_key(&claim);
    let current = records.ownership.get(&key);
    let previous_version = match (current, &claim.etag) {
        (None, None) => 0,
        (Some(current), Some(etag)) if current.etag.as_ref() == Some(etag) => current.version,
        _ => return None,
    };
    let stored = Ownership {
        fully_qualified_namespace: key.0.namespace.clone(),
        event_hub_name: key.0.hub.clone(),
        consumer_group: key.0.consumer_group.clone(),
        partition_id: claim.partition_id,
        owner_id: claim.owner_id,
        last_modified_time_ms: now_ms,
        etag: Some(new_etag()),
        version: previous_version + 1,
    };
    assert!(stored.version > previous_version);
    records.ownership.insert(key, stored.clone());
    Some(stored)
}

impl Records {
    fn ownership_of(&self, scope: &ScopeKey) -> Vec<Ownership> {
        self.ownership
            .iter()
            .filter(|((record_scope, _), _)| record_scope == scope)
            .map(|(_, record)| record.clone())
            .collect()
    }

    /// The ownership and host records of `scope`, without hosts renewed at or before
    /// `horizon_ms` (see [`host_record_horizon_ms`]).
    fn listing_of(&self, scope: &ScopeKey, horizon_ms: i64) -> OwnershipListing {
        let hosts = self
            .hosts
            .iter()
            .filter(|((host_scope, _), host)| {
                host_scope == scope && host.last_modified_time_ms > horizon_ms
            })
            .map(|(_, host)| host.clone())
            .collect();
        OwnershipListing {
            ownership: self.ownership_of(scope),
            hosts,
        }
    }
}

#[async_trait::async_trait]
impl CheckpointStore for InMemoryCheckpointStore {
    async fn list_ownership(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<Vec<Ownership>, StoreError> {
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        Ok(self.lock().ownership_of(&scope))
    }

    fn keeps_host_records(&self) -> bool {
        true
    }

    async fn renew_host(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
        owner_id: &str,
    ) -> Result<OwnershipListing, StoreError> {
        validate_host(owner_id)?;
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        let now_ms = self.clock.now_ms();
        let horizon_ms = host_record_horizon_ms(now_ms);
        let mut records = self.lock();
        records.hosts.retain(|(host_scope, _), host| {
            *host_scope != scope || host.last_modified_time_ms > horizon_ms
        });
        let host = records
            .hosts
            .entry((scope.clone(), owner_id.to_owned()))
            .or_insert_with(|| HostRecord {
                owner_id: owner_id.to_owned(),
                version: 0,
                last_modified_time_ms: now_ms,
            });
        host.version += 1;
        host.last_modified_time_ms = now_ms;
        Ok(records.listing_of(&scope, horizon_ms))
    }

    async fn list_ownership_and_hosts(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<OwnershipListing, StoreError> {
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        let horizon_ms = host_record_horizon_ms(self.clock.now_ms());
        Ok(self.lock().listing_of(&scope, horizon_ms))
    }

    async fn remove_host(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
        owner_id: &str,
    ) -> Result<(), StoreError> {
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        self.lock().hosts.remove(&(scope, owner_id.to_owned()));
        Ok(())
    }

    async fn claim_ownership(&self, claims: Vec<Ownership>) -> Result<Vec<Ownership>, StoreError> {
        claims.iter().try_for_each(validate_claim)?;
        let now_ms = self.clock.now_ms();
        let mut records = self.lock();
        Ok(claims
            .into_iter()
            .filter_map(|claim| try_claim(&mut records, claim, now_ms))
            .collect())
    }

    async fn list_checkpoints(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<Vec<Checkpoint>, StoreError> {
        let scope = ScopeKey::new(fully_qualified_namespace, event_hub_name, consumer_group);
        let records = self.lock();
        Ok(records
            .checkpoints
            .iter()
            .filter(|((record_scope, _), _)| *record_scope == scope)
            .map(|(_, checkpoint)| checkpoint.clone())
            .collect())
    }

    async fn update_checkpoint(
        &self,
        checkpoint: Checkpoint,
        fence: &OwnershipFence,
    ) -> Result<(), StoreError> {
        validate_checkpoint(&checkpoint)?;
        let key = checkpoint_key(&checkpoint);
        let mut records = self.lock();
        let current_owner = records
            .ownership
            .get(&key)
            .map_or("", |record| record.owner_id.as_str());
        if fence.owner_id.is_empty() || current_owner != fence.owner_id {
            return Err(StoreError::OwnershipLost {
                partition_id: checkpoint.partition_id,
                current_owner: current_owner.to_owned(),
                fence_owner: fence.owner_id.clone(),
            });
        }
        let stored = Checkpoint {
            fully_qualified_namespace: key.0.namespace.clone(),
            event_hub_name: key.0.hub.clone(),
            consumer_group: key.0.consumer_group.clone(),
            ..checkpoint
        };
        records.checkpoints.insert(key, stored);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance;

    #[tokio::test]
    async fn passes_the_conformance_suite() {
        let clock = Arc::new(tributary_event::ManualClock::new(1_000));
        let store = InMemoryCheckpointStore::with_clock(clock.clone());
        conformance::run_all(&store, &clock).await;
    }

    #[tokio::test]
    async fn concurrent_claims_on_one_etag_have_exactly_one_winner() {
        let store = Arc::new(InMemoryCheckpointStore::new());
        conformance::exactly_one_concurrent_claim_wins(vec![
            store.clone()
                as Arc<dyn CheckpointStore>;
            8
        ])
        .await;
    }
}
