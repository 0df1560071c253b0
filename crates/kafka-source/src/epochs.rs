//! The epoch rules of `tributary-source`, kept by one [`KafkaSource`](crate::KafkaSource) for
//! the receivers it opened.
//!
//! Kafka has no epoch receivers: a partition read by assignment (not by a consumer group's
//! subscription) can be read by any number of clients, and the cluster fences none of them. So
//! the rules hold among the receivers of one source — a receiver opened with owner level `e2`
//! disconnects this source's receiver with `e1 <= e2` on the same (consumer group, partition),
//! and `e2 < e1` is refused — and not across processes. Across processes the processor host
//! fences itself: it starts a partition taken from a live owner only once that owner has
//! provably noticed (its `handoff` rule), stops its own pumps when it cannot renew, and the
//! checkpoint store refuses a former owner's checkpoint.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tributary_source::SourceError;

/// The owner levels of one source's open receivers.
#[derive(Debug, Default)]
pub(crate) struct Epochs {
    /// By (consumer group's name key, partition id): the active owner level and its receiver's
    /// stolen flag.
    active: Mutex<HashMap<ReaderKey, (i64, Arc<AtomicBool>)>>,
}

/// (consumer group's name key, partition id).
type ReaderKey = (String, String);

/// A receiver's place in [`Epochs`]: it reads while `stolen` is false.
#[derive(Debug, Clone)]
pub(crate) struct EpochClaim {
    pub(crate) stolen: Arc<AtomicBool>,
}

impl EpochClaim {
    /// A receiver without an owner level: never disconnected by this source.
    pub(crate) fn plain() -> EpochClaim {
        EpochClaim {
            stolen: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether a receiver with a higher owner level took the partition.
    pub(crate) fn is_stolen(&self) -> bool {
        self.stolen.load(Ordering::Acquire)
    }
}

impl Epochs {
    /// Registers a receiver with `owner_level` on (group, partition), disconnecting the one
    /// there if its level is not higher; refuses it if the one there has a higher level.
    pub(crate) fn claim(
        &self,
        consumer_group: &str,
        partition_id: &str,
        owner_level: i64,
    ) -> Result<EpochClaim, SourceError> {
        let key = (
            tributary_event::names::name_key(consumer_group),
            partition_id.to_owned(),
        );
        let mut active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((current, stolen)) = active.get(&key) {
            if *current > owner_level && !stolen.load(Ordering::Acquire) {
                return Err(SourceError::OwnershipLost {
                    description: format!(
                        "partition {partition_id} of consumer group {consumer_group:?} is read \
                         with owner level {current}, higher than {owner_level}"
                    ),
                });
            }
            stolen.store(true, Ordering::Release);
        }
        let claim = EpochClaim::plain();
        active.insert(key, (owner_level, Arc::clone(&claim.stolen)));
        Ok(claim)
    }

    /// Forgets a closed receiver's claim, unless a newer one replaced it.
    pub(crate) fn release(&self, consumer_group: &str, partition_id: &str, claim: &EpochClaim) {
        let key = (
            tributary_event::names::name_key(consumer_group),
            partition_id.to_owned(),
        );
        let mut active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        if active
            .get(&key)
            .is_some_and(|(_, stolen)| Arc::ptr_eq(stolen, &claim.stolen))
        {
            active.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_higher_level_disconnects_and_a_lower_one_is_refused() {
        let epochs = Epochs::default();
        let first = epochs.claim("$Default", "0", 1).unwrap();
        let second = epochs.claim("$default", "0", 2).unwrap();
        assert!(first.is_stolen());
        assert!(!second.is_stolen());
        assert!(
            epochs
                .claim("$Default", "0", 1)
                .unwrap_err()
                .is_ownership_lost()
        );
        // Other partitions and groups are separate.
        assert!(!epochs.claim("$Default", "1", 0).unwrap().is_stolen());
        assert!(!epochs.claim("audit", "0", 0).unwrap().is_stolen());
        // A closed receiver's level no longer counts; a stale release changes nothing.
        epochs.release("$Default", "0", &first);
        assert!(
            epochs
                .claim("$Default", "0", 1)
                .unwrap_err()
                .is_ownership_lost()
        );
        epochs.release("$Default", "0", &second);
        assert!(epochs.claim("$Default", "0", 1).is_ok());
    }
}
