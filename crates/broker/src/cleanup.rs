//! A hub's retention and cleanup policy after it is created, and compaction in the background.
//!
//! [`Broker::update_hub`] changes a hub's retention, cleanup and capture settings: durably first (the
//! catalog is saved, or nothing changes), then live on every partition log, so appends follow
//! the new policy at once (a hub that now compacts refuses events without a partition key).
//!
//! [`Broker::compact_due`] compacts the partitions of compacted hubs that are due; the
//! background task the broker starts calls it every
//! [`crate::BrokerConfig::compaction_check_interval`]. A partition is due when sealed segments
//! hold events compaction has not seen (and, if a run found them younger than the minimum
//! compaction lag, once that lag has passed), or when its last run is as old as the tombstone
//! retention (at most [`SWEEP_INTERVAL_MS_MAX`]), so expired tombstones go. Before that, an
//! active segment holding events is sealed once it is
//! [`crate::BrokerConfig::compaction_segment_age_max`] old, so a partition written slowly is
//! compacted too. [`Broker::compact_hub`] compacts one hub's partitions now, due or not, its
//! active segments sealed first.
//!
//! # Guarantees
//! - Compaction runs on the blocking pool, one partition after another; it rewrites sealed
//!   segments only, so appends never wait for it (see `tributary_log::PartitionLog::compact`).
//! - A partition whose run fails is logged and skipped; the others are still compacted.

use std::sync::atomic::{AtomicI64, Ordering};

use tributary_event::names::name_key;
use tributary_log::{CleanupPolicy, CompactionOutcome, CompactionState};

use crate::broker::check_retention;
use crate::catalog::{HubCapture, HubCleanup, HubDefinition};
use crate::hub::Hub;
use crate::{Broker, BrokerError};

/// The longest a compacted partition goes without a run (so that expired tombstones go) when
/// its tombstone retention is longer: an hour.
pub const SWEEP_INTERVAL_MS_MAX: i64 = 60 * 60 * 1000;

/// What to change in an event hub: each `Some` replaces the setting, each `None` keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HubUpdate {
    /// How long events are kept (`Some(None)`: forever).
    pub retention_age_ms: Option<Option<i64>>,
    /// How many bytes each partition keeps at most (`Some(None)`: no limit).
    pub retention_bytes_max: Option<Option<u64>>,
    /// Delete, compact, or both.
    pub cleanup_policy: Option<CleanupPolicy>,
    /// The minimum compaction lag.
    pub min_compaction_lag_ms: Option<i64>,
    /// The tombstone retention.
    pub tombstone_retention_ms: Option<i64>,
    /// The capture (`Some(None)`: capture turned off).
    pub capture: Option<Option<HubCapture>>,
}

impl HubUpdate {
    /// `definition` with this update applied and checked, as [`Broker::update_hub`] would
    /// apply it; nothing is saved (a caller asked only to validate uses this).
    pub fn apply(&self, definition: &HubDefinition) -> Result<HubDefinition, BrokerError> {
        let mut updated = definition.clone();
        if let Some(age) = self.retention_age_ms {
            updated.retention_age_ms = age;
        }
        if let Some(bytes) = self.retention_bytes_max {
            updated.retention_bytes_max = bytes;
        }
        let cleanup = &mut updated.cleanup;
        cleanup.policy = self.cleanup_policy.unwrap_or(cleanup.policy);
        cleanup.min_compaction_lag_ms = self
            .min_compaction_lag_ms
            .unwrap_or(cleanup.min_compaction_lag_ms);
        cleanup.tombstone_retention_ms = self
            .tombstone_retention_ms
            .unwrap_or(cleanup.tombstone_retention_ms);
        if let Some(capture) = &self.capture {
            updated.capture.clone_from(capture);
        }
        check_retention(updated.retention_age_ms, updated.retention_bytes_max)?;
        updated.cleanup.validate()?;
        Ok(updated)
    }
}

/// When a partition is next due for compaction (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct CompactionSchedule {
    /// Sealed events compaction has not seen are left alone until then: the last run found
    /// them younger than the minimum compaction lag.
    lag_wait_until_ms: AtomicI64,
    /// A run is due then even without unseen events, so expired tombstones go.
    sweep_at_ms: AtomicI64,
}

impl CompactionSchedule {
    fn due(&self, state: &CompactionState, now_ms: i64) -> bool {
        let unseen = state.sealed_dirty_bytes > 0
            && now_ms >= self.lag_wait_until_ms.load(Ordering::Relaxed);
        unseen || now_ms >= self.sweep_at_ms.load(Ordering::Relaxed)
    }

    /// Records a run at `now_ms` that left `after`.
    fn ran(&self, after: &CompactionState, cleanup: HubCleanup, now_ms: i64) {
        let lag_wait_until = if after.sealed_dirty_bytes > 0 {
            now_ms.saturating_add(cleanup.min_compaction_lag_ms)
        } else {
            0
        };
        self.lag_wait_until_ms
            .store(lag_wait_until, Ordering::Relaxed);
        let sweep = cleanup.tombstone_retention_ms.min(SWEEP_INTERVAL_MS_MAX);
        self.sweep_at_ms
            .store(now_ms.saturating_add(sweep), Ordering::Relaxed);
    }
}

impl Broker {
    /// Changes an event hub's retention and cleanup settings (see [`HubUpdate`]); returns its
    /// definition as updated. Bad settings are refused with nothing changed.
    pub async fn update_hub(
        &self,
        name: &str,
        update: HubUpdate,
    ) -> Result<HubDefinition, BrokerError> {
        let hub = self.hub(name)?;
        update.apply(&hub.definition.read().expect("hub definition"))?;
        let broker = self.clone();
        tokio::task::spawn_blocking(move || broker.update_hub_blocking(&hub, &update))
            .await
            .expect("updating a hub does not panic")
    }

    fn update_hub_blocking(
        &self,
        hub: &Hub,
        update: &HubUpdate,
    ) -> Result<HubDefinition, BrokerError> {
        let inner = &self.inner;
        let mut catalog = inner.catalog.lock().expect("catalog");
        let key = name_key(&hub.name());
        let Some(before) = catalog.hubs.get(&key).cloned() else {
            return Err(BrokerError::HubNotFound { name: hub.name() });
        };
        let mut updated = update.apply(&before)?;
        if let Some(capture) = &mut updated.capture {
            capture.enabled_at_ms = match &before.capture {
                Some(kept) => kept.enabled_at_ms,
                None => inner.clock.now_ms(),
            };
        }
        catalog.hubs.insert(key.clone(), updated.clone());
        if let Err(e) = catalog.save() {
            catalog.hubs.insert(key, before);
            return Err(e);
        }
        *hub.definition.write().expect("hub definition") = updated.clone();
        for p in &hub.partitions {
            let cleanup = updated.cleanup.on(p.log.cleanup());
            p.log
                .set_cleanup(cleanup)
                .expect("the cleanup settings were validated above");
        }
        tracing::info!(hub = %updated.name, policy = %updated.cleanup.policy, "event hub updated");
        Ok(updated)
    }

    /// Compaction's progress in each partition of an event hub, by partition.
    pub fn compaction_states(&self, hub: &str) -> Result<Vec<CompactionState>, BrokerError> {
        let hub = self.hub(hub)?;
        Ok(hub
            .partitions
            .iter()
            .map(|p| p.log.compaction_state())
            .collect())
    }

    /// Compacts every partition of `hub` now, whether due or not, sealing its active segment
    /// first so that every event is compacted (a hub that does not compact is left as it is);
    /// returns each partition's outcome.
    pub async fn compact_hub(&self, hub: &str) -> Result<Vec<CompactionOutcome>, BrokerError> {
        let hub = self.hub(hub)?;
        if !hub.cleanup().policy.compacts() {
            return Ok(vec![CompactionOutcome::default(); hub.partitions.len()]);
        }
        let now_ms = self.inner.clock.now_ms();
        tokio::task::spawn_blocking(move || {
            (0..hub.partition_count())
                .map(|p| {
                    let log = &hub.partitions[p as usize].log;
                    log.seal_if_older(0).map_err(hub.log_error(p))?;
                    compact_partition(&hub, p, now_ms)
                })
                .collect()
        })
        .await
        .expect("compaction does not panic")
    }

    /// Compacts the partitions of compacted hubs that are due (see the module doc), sealing
    /// active segments older than [`crate::BrokerConfig::compaction_segment_age_max`] first.
    /// Failures are logged; returns how many partitions were compacted.
    pub async fn compact_due(&self) -> usize {
        let hubs = self.hubs_where(|hub| hub.cleanup().policy.compacts());
        let clock = self.inner.clock.clone();
        let age = self.inner.config.compaction_segment_age_max;
        let age_ms = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        tokio::task::spawn_blocking(move || {
            let mut compacted = 0;
            for hub in &hubs {
                for p in 0..hub.partition_count() {
                    match compact_if_due(hub, p, age_ms, clock.now_ms()) {
                        Ok(ran) => compacted += usize::from(ran),
                        Err(e) => tracing::error!(error = %e, "compaction failed"),
                    }
                }
            }
            compacted
        })
        .await
        .expect("compaction does not panic")
    }
}

/// Seals the partition's active segment if it is `age_ms` old, then compacts the partition if
/// it is due; returns whether it compacted.
fn compact_if_due(
    hub: &Hub,
    partition: u32,
    age_ms: i64,
    now_ms: i64,
) -> Result<bool, BrokerError> {
    let p = &hub.partitions[partition as usize];
    p.log
        .seal_if_older(age_ms)
        .map_err(hub.log_error(partition))?;
    if !p.compaction.due(&p.log.compaction_state(), now_ms) {
        return Ok(false);
    }
    compact_partition(hub, partition, now_ms).map(|_| true)
}

/// Compacts one partition as of `now_ms` and records the run in its schedule.
fn compact_partition(
    hub: &Hub,
    partition: u32,
    now_ms: i64,
) -> Result<CompactionOutcome, BrokerError> {
    let p = &hub.partitions[partition as usize];
    let outcome = p.log.compact(now_ms).map_err(hub.log_error(partition))?;
    p.compaction
        .ran(&p.log.compaction_state(), hub.cleanup(), now_ms);
    if outcome.events_removed > 0 {
        tracing::info!(
            hub = %hub.name(),
            partition,
            events_removed = outcome.events_removed,
            bytes_before = outcome.bytes_before,
            bytes_after = outcome.bytes_after,
            "compacted"
        );
    }
    Ok(outcome)
}
