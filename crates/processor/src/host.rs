//! The event processor host: balancing, ownership and pumps for one (hub, consumer group).
//!
//! [`EventProcessorHost`] is built from a [`PartitionSource`], a [`CheckpointStore`], an
//! [`EventProcessorFactory`] and [`ProcessorOptions`]; [`EventProcessorHost::start`] spawns its
//! coordinator task and returns a [`RunningHost`].
//!
//! The coordinator owns all of the host's state: the ownership records it holds, the expiry
//! tracker, and one pump task per owned partition (in a `JoinSet`, so aborting the coordinator
//! aborts every pump). Every balancing interval — the first one at once — it lists ownership
//! (renewing its host record in the same call where the store keeps host records), asks
//! [`plan_claims`] what to claim, sends renewals (only of records it does not hold as listed,
//! where its host record proves it alive) and acquisitions in one `claim_ownership` call, then:
//! - stops the pump of every partition it no longer owns (stolen, or its renewal lost a race),
//!   closing it with [`CloseReason::OwnershipLost`];
//! - starts a pump for every owned partition without one — a partition stolen from a live owner
//!   only once that owner has noticed (see `handoff`) — at the checkpoint (offset exclusive,
//!   else sequence number exclusive, else the initial position provider) with the won record's
//!   version as the receiver's owner level.
//!
//! Ownership changes are logged at INFO with the partition and the new owner: they are expected
//! events of a consumer group, not errors. Failures of the host's own store or source calls go to
//! the error notifier and the log; the host retries on the next interval. If it cannot renew for
//! a whole ownership expiration it stops its pumps itself, since others may own them by then.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;
use tributary_event::EventPosition;

use crate::balance::{
    BalanceInput, Claim, ClaimReason, ExpiryTracker, holds_more_than_its_share, plan_claims,
};
use crate::error::{HostError, InvalidOption};
use crate::handoff::Handoff;
use crate::limits::PARTITION_IDS_REFRESH_INTERVAL;
use crate::options::ProcessorOptions;
use crate::processor::{CloseReason, ContextScope, EventProcessorFactory, PartitionContext};
use crate::pump::{PumpConfig, PumpStart, run_pump};
use crate::store::{Checkpoint, CheckpointStore, Ownership, StoreError};
use tributary_source::{PartitionSource, SourceError};

/// A configured host, not yet running. See the [crate docs](crate) for an example.
pub struct EventProcessorHost {
    source: Arc<dyn PartitionSource>,
    store: Arc<dyn CheckpointStore>,
    factory: Arc<dyn EventProcessorFactory>,
    options: ProcessorOptions,
}

impl std::fmt::Debug for EventProcessorHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventProcessorHost")
            .field("event_hub_name", &self.source.event_hub_name())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Builds an [`EventProcessorHost`]; the options default to [`ProcessorOptions::default`].
pub struct EventProcessorHostBuilder {
    host: EventProcessorHost,
}

impl std::fmt::Debug for EventProcessorHostBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventProcessorHostBuilder")
            .field("host", &self.host)
            .finish()
    }
}

impl EventProcessorHostBuilder {
    /// Replaces the options.
    pub fn options(mut self, options: ProcessorOptions) -> Self {
        self.host.options = options;
        self
    }

    /// Validates the options and returns the host.
    pub fn build(self) -> Result<EventProcessorHost, InvalidOption> {
        self.host.options.validate()?;
        Ok(self.host)
    }
}

impl EventProcessorHost {
    /// Starts building a host that reads `source`, keeps ownership and checkpoints in `store`,
    /// and processes each owned partition with a processor from `factory`.
    pub fn builder(
        source: Arc<dyn PartitionSource>,
        store: Arc<dyn CheckpointStore>,
        factory: impl EventProcessorFactory,
    ) -> EventProcessorHostBuilder {
        EventProcessorHostBuilder {
            host: EventProcessorHost {
                source,
                store,
                factory: Arc::new(factory),
                options: ProcessorOptions::default(),
            },
        }
    }

    /// This host's owner id.
    pub fn host_name(&self) -> &str {
        &self.options.host_name
    }

    /// The options the host runs with.
    pub fn options(&self) -> &ProcessorOptions {
        &self.options
    }

    /// Spawns the host on the current Tokio runtime; its first balancing cycle runs at once.
    pub fn start(self) -> Result<RunningHost, HostError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| HostError::NoRuntime)?;
        let host_name = self.options.host_name.clone();
        let (owned_sender, owned) = watch::channel(Vec::new());
        let (shutdown_sender, shutdown) = oneshot::channel();
        let coordinator = Coordinator::new(self, owned_sender);
        tracing::info!(
            host_name = host_name.as_str(),
            event_hub = coordinator.scope.event_hub_name.as_str(),
            consumer_group = coordinator.scope.consumer_group.as_str(),
            "event processor host starting"
        );
        let task = runtime.spawn(coordinator.run(shutdown));
        Ok(RunningHost {
            host_name,
            owned,
            shutdown: Some(shutdown_sender),
            task,
        })
    }
}

/// A running host. Dropping it starts a graceful shutdown in the background; call
/// [`shutdown`](Self::shutdown) to wait for it.
#[derive(Debug)]
pub struct RunningHost {
    host_name: String,
    owned: watch::Receiver<Vec<String>>,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), HostError>>,
}

impl RunningHost {
    /// This host's owner id.
    pub fn host_name(&self) -> &str {
        &self.host_name
    }

    /// The partitions this host owns as of its last balancing cycle, in partition order.
    pub fn owned_partitions(&self) -> Vec<String> {
        self.owned.borrow().clone()
    }

    /// Stops gracefully: stops every pump (each processor's `close(Shutdown)` may write a final
    /// checkpoint), then relinquishes every owned partition so other hosts take them over on
    /// their next cycle instead of waiting for the ownership to expire. Errors of the final
    /// relinquish are returned (the partitions then expire normally).
    pub async fn shutdown(mut self) -> Result<(), HostError> {
        if let Some(shutdown) = self.shutdown.take() {
            // The coordinator may have ended already (a panic); the join below reports that.
            let _ = shutdown.send(());
        }
        match (&mut self.task).await {
            Ok(result) => result,
            Err(join_error) if join_error.is_panic() => {
                std::panic::resume_unwind(join_error.into_panic())
            }
            Err(_) => Ok(()),
        }
    }

    /// Stops everything at once without closing processors or relinquishing anything — what
    /// `kill -9` does to a host. Other hosts take the partitions over after the ownership
    /// expiration; each receiver is left for the hub to notice (a new owner's higher owner level
    /// disconnects it). For failover tests and drills.
    pub fn abort(mut self) {
        self.task.abort();
        // Dropping the sender now cannot start a graceful shutdown: the task is cancelled.
        self.shutdown.take();
    }
}

/// (namespace, hub, consumer group) of every record this host reads and writes.
#[derive(Debug, Clone)]
struct HubScope {
    fully_qualified_namespace: String,
    event_hub_name: String,
    consumer_group: String,
}

/// A pump the coordinator started and has not yet seen end.
struct PumpSlot {
    stop: watch::Sender<Option<CloseReason>>,
    /// Whether the coordinator told it to stop already.
    stopping: bool,
}

struct Coordinator {
    source: Arc<dyn PartitionSource>,
    store: Arc<dyn CheckpointStore>,
    factory: Arc<dyn EventProcessorFactory>,
    options: ProcessorOptions,
    scope: HubScope,
    pump_config: Arc<PumpConfig>,
    tracker: ExpiryTracker,
    partition_ids: Vec<String>,
    partition_ids_fetched_at: Option<Instant>,
    /// The record of every partition this host owns, as its last successful claim returned it.
    owned: BTreeMap<String, Ownership>,
    pumps: HashMap<String, PumpSlot>,
    pump_tasks: JoinSet<CloseReason>,
    pump_partitions: HashMap<tokio::task::Id, String>,
    last_renewed_at: Instant,
    /// Partitions stolen from a live owner, whose pumps wait until the former owner has
    /// noticed and stopped processing (see [`Handoff`]).
    handoffs: HashMap<String, Handoff>,
    /// Whether the next cycle comes after a quarter interval: this host holds more than its
    /// share, so others are taking partitions from it.
    cycle_soon: bool,
    owned_sender: watch::Sender<Vec<String>>,
}

impl Coordinator {
    fn new(host: EventProcessorHost, owned_sender: watch::Sender<Vec<String>>) -> Self {
        let EventProcessorHost {
            source,
            store,
            factory,
            options,
        } = host;
        let scope = HubScope {
            fully_qualified_namespace: options
                .fully_qualified_namespace
                .clone()
                .unwrap_or_else(|| source.fully_qualified_namespace().to_owned()),
            event_hub_name: source.event_hub_name().to_owned(),
            consumer_group: options.consumer_group.clone(),
        };
        let pump_config = Arc::new(PumpConfig {
            source: Arc::clone(&source),
            consumer_group: options.consumer_group.clone(),
            batch_events_max: usize::try_from(options.batch_events_max)
                .expect("validated: batch_events_max fits in memory"),
            prefetch_count: options.prefetch_count,
            receive_timeout: options.receive_timeout,
            invoke_processor_after_receive_timeout: options.invoke_processor_after_receive_timeout,
            track_last_enqueued: options.track_last_enqueued_event_properties,
        });
        Coordinator {
            tracker: ExpiryTracker::new(options.ownership_expiration),
            source,
            store,
            factory,
            options,
            scope,
            pump_config,
            partition_ids: Vec::new(),
            partition_ids_fetched_at: None,
            owned: BTreeMap::new(),
            pumps: HashMap::new(),
            pump_tasks: JoinSet::new(),
            pump_partitions: HashMap::new(),
            last_renewed_at: Instant::now(),
            handoffs: HashMap::new(),
            cycle_soon: false,
            owned_sender,
        }
    }

    fn me(&self) -> &str {
        &self.options.host_name
    }

    async fn run(mut self, mut shutdown: oneshot::Receiver<()>) -> Result<(), HostError> {
        let mut next_cycle_at = Instant::now();
        loop {
            let fence_at = self.fence_deadline();
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                Some(joined) = self.pump_tasks.join_next_with_id() => self.reap(joined),
                () = sleep_until_some(fence_at) => self.fence_if_renewal_expired(Instant::now()),
                () = tokio::time::sleep_until(next_cycle_at) => {
                    self.run_cycle().await;
                    let interval = self.options.load_balancing_interval;
                    let pause = if self.cycle_soon { interval / 4 } else { interval };
                    next_cycle_at = Instant::now() + pause;
                }
            }
        }
        self.shut_down().await
    }

    /// When this host must stop processing if it has not renewed by then: one balancing
    /// interval before any other host may consider its ownership expired (others count the
    /// expiration from when they saw the renewal, which is after this host made it).
    fn fence_deadline(&self) -> Option<Instant> {
        if self.owned.is_empty() {
            return None;
        }
        let margin = self.options.load_balancing_interval;
        Some(self.last_renewed_at + self.options.ownership_expiration - margin)
    }

    /// One balancing cycle: renew, rebalance, stop lost pumps, start missing ones.
    async fn run_cycle(&mut self) {
        let now = Instant::now();
        self.refresh_partition_ids(now).await;
        let host_records = self.store.keeps_host_records();
        let operation = if host_records {
            "renewing the host record"
        } else {
            "listing ownership"
        };
        let listed = self
            .store_call(
                operation,
                self.store.renew_host(
                    &self.scope.fully_qualified_namespace,
                    &self.scope.event_hub_name,
                    &self.scope.consumer_group,
                    &self.options.host_name,
                ),
            )
            .await;
        let Some(listing) = listed else {
            self.fence_if_renewal_expired(Instant::now());
            return;
        };
        if host_records {
            self.last_renewed_at = now;
        }
        for handoff in self.handoffs.values_mut() {
            handoff.watch(&listing);
        }
        self.drop_partitions_owned_by_others(&listing.ownership);
        let input = BalanceInput {
            records: &listing.ownership,
            hosts: &listing.hosts,
            my_owner_id: &self.options.host_name,
            partition_ids: &self.partition_ids,
            strategy: self.options.load_balancing_strategy,
        };
        let mut claims = plan_claims(&input, &mut self.tracker, now);
        // While others' plans are taking partitions from this host, it looks again after a
        // quarter interval: it stops processing what it lost sooner (with a host record it
        // learns of a steal only from a listing), and the hand-over ends sooner.
        self.cycle_soon = holds_more_than_its_share(&input, &self.tracker, now);
        if host_records {
            // The host record just renewed proves this host alive; a record it holds exactly
            // as listed needs no claim of its own.
            claims.retain(|claim| !self.holds_as_listed(claim));
        }
        let requests: Vec<Ownership> = claims.iter().map(|c| self.claim_request(c)).collect();
        let claimed = if requests.is_empty() {
            Some(Vec::new())
        } else {
            self.store_call("claiming ownership", self.store.claim_ownership(requests))
                .await
        };
        let Some(won) = claimed else {
            self.fence_if_renewal_expired(Instant::now());
            return;
        };
        self.last_renewed_at = now;
        self.apply_claim_results(&claims, won);
        self.start_missing_pumps().await;
        self.publish_owned();
    }

    /// Whether `claim` renews a record this host holds with the listed etag.
    fn holds_as_listed(&self, claim: &Claim) -> bool {
        claim.is_renewal()
            && self
                .owned
                .get(&claim.partition_id)
                .is_some_and(|held| held.etag == claim.etag)
    }

    async fn refresh_partition_ids(&mut self, now: Instant) {
        let due = self
            .partition_ids_fetched_at
            .is_none_or(|fetched_at| now - fetched_at >= PARTITION_IDS_REFRESH_INTERVAL);
        if !due {
            return;
        }
        let timeout = self.store_timeout();
        let listed = match tokio::time::timeout(timeout, self.source.partition_ids()).await {
            Ok(listed) => listed,
            Err(_) => Err(SourceError::Transient {
                description: format!("no answer within {} ms", timeout.as_millis()),
            }),
        };
        match listed {
            Ok(mut partition_ids) => {
                partition_ids.sort_by(|a, b| partition_order(a, b));
                partition_ids.dedup();
                self.partition_ids = partition_ids;
                self.partition_ids_fetched_at = Some(now);
            }
            Err(error) => self.report(HostError::ListPartitions(error)),
        }
    }

    /// How long one store or source call of a cycle may take: a third of the expiration, so a
    /// hung call cannot keep the host from renewing long enough for its ownership to expire.
    fn store_timeout(&self) -> Duration {
        self.options.ownership_expiration / 3
    }

    /// Runs a store call with the cycle's time limit; reports failures and returns `None`.
    async fn store_call<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Option<T> {
        let timeout = self.store_timeout();
        // Never wait past the fence deadline: a host that cannot reach the store must stop its
        // pumps on time, not after a slow call returns.
        let deadline = match self.fence_deadline() {
            Some(fence_at) => fence_at.min(Instant::now() + timeout),
            None => Instant::now() + timeout,
        };
        match tokio::time::timeout_at(deadline, call).await {
            Ok(Ok(value)) => Some(value),
            Ok(Err(error)) => {
                self.report(HostError::Store(error));
                None
            }
            Err(_) => {
                self.report(HostError::StoreTimeout {
                    operation,
                    timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                });
                None
            }
        }
    }

    fn claim_request(&self, claim: &Claim) -> Ownership {
        Ownership {
            fully_qualified_namespace: self.scope.fully_qualified_namespace.clone(),
            event_hub_name: self.scope.event_hub_name.clone(),
            consumer_group: self.scope.consumer_group.clone(),
            partition_id: claim.partition_id.clone(),
            owner_id: self.me().to_owned(),
            last_modified_time_ms: 0,
            etag: claim.etag.clone(),
            version: 0,
        }
    }

    /// Stops the pumps of partitions the store now shows with another owner.
    fn drop_partitions_owned_by_others(&mut self, records: &[Ownership]) {
        let moved: Vec<(String, String)> = records
            .iter()
            .filter(|record| {
                record.owner_id != self.me() && self.owned.contains_key(&record.partition_id)
            })
            .map(|record| (record.partition_id.clone(), record.owner_id.clone()))
            .collect();
        for (partition_id, new_owner) in moved {
            self.lose_partition(&partition_id, &new_owner);
        }
    }

    fn lose_partition(&mut self, partition_id: &str, new_owner: &str) {
        let new_owner = if new_owner.is_empty() {
            "nobody"
        } else {
            new_owner
        };
        tracing::info!(
            host_name = self.me(),
            partition_id,
            new_owner,
            "partition ownership moved to another owner; stopping its pump"
        );
        self.owned.remove(partition_id);
        self.stop_pump(partition_id, CloseReason::OwnershipLost);
    }

    fn stop_pump(&mut self, partition_id: &str, reason: CloseReason) {
        if let Some(slot) = self.pumps.get_mut(partition_id)
            && !slot.stopping
        {
            slot.stopping = true;
            slot.stop.send_replace(Some(reason));
        }
    }

    /// Records what the claims won, and treats a lost renewal as a lost partition.
    fn apply_claim_results(&mut self, claims: &[Claim], won: Vec<Ownership>) {
        // A store is someone else's code: records it returns for claims this host did not make,
        // or with another owner, are ignored rather than trusted.
        let mut won: HashMap<String, Ownership> = won
            .into_iter()
            .filter(|record| record.owner_id == self.me())
            .map(|record| (record.partition_id.clone(), record))
            .collect();
        for claim in claims {
            match won.remove(&claim.partition_id) {
                Some(record) => {
                    if !claim.is_renewal() || !self.owned.contains_key(&claim.partition_id) {
                        log_acquisition(self.me(), claim, &record);
                    }
                    if let ClaimReason::Steal { from } = &claim.reason {
                        let now = Instant::now();
                        let expiration = self.options.ownership_expiration;
                        // Before its own first expiration a host cannot rule out a steal
                        // just before it started. It waits for that only where the store
                        // keeps host records, which let every other host's notice end the
                        // wait; elsewhere (the Azure Blob layout, shared with processors
                        // that start stolen partitions at once) a joining host would idle
                        // for an expiration, so only steals it saw count there, and its
                        // receiver taking the partition over stops an owner it could not
                        // see (see `handoff.rs`).
                        let unseen_history = self.store.keeps_host_records();
                        let earlier_owners_stop_by = self.tracker.earlier_owners_stop_by(
                            &claim.partition_id,
                            now,
                            unseen_history,
                        );
                        let handoff =
                            Handoff::new(self.me(), from, now, expiration, earlier_owners_stop_by);
                        self.handoffs.insert(claim.partition_id.clone(), handoff);
                    }
                    self.owned.insert(claim.partition_id.clone(), record);
                }
                None if claim.is_renewal() => {
                    let new_owner = "another host (the renewal lost a race)";
                    if self.owned.contains_key(&claim.partition_id) {
                        self.lose_partition(&claim.partition_id, new_owner);
                    }
                }
                None => tracing::debug!(
                    partition_id = claim.partition_id.as_str(),
                    "another host claimed the partition first"
                ),
            }
        }
        if !won.is_empty() {
            tracing::warn!(
                unclaimed = won.len(),
                "the checkpoint store returned records for partitions this host did not claim"
            );
        }
    }

    /// Starts a pump for every owned partition without one, at its checkpoint.
    async fn start_missing_pumps(&mut self) {
        let now = Instant::now();
        self.handoffs.retain(|partition_id, handoff| {
            !handoff.is_over(now) && self.owned.contains_key(partition_id)
        });
        let missing: Vec<String> = self
            .owned
            .keys()
            .filter(|partition_id| !self.pumps.contains_key(*partition_id))
            .filter(|partition_id| !self.handoffs.contains_key(*partition_id))
            .cloned()
            .collect();
        if missing.is_empty() {
            return;
        }
        let listed = self
            .store_call(
                "listing checkpoints",
                self.store.list_checkpoints(
                    &self.scope.fully_qualified_namespace,
                    &self.scope.event_hub_name,
                    &self.scope.consumer_group,
                ),
            )
            .await;
        let Some(checkpoints) = listed else { return };
        let checkpoints: HashMap<&str, &Checkpoint> = checkpoints
            .iter()
            .map(|checkpoint| (checkpoint.partition_id.as_str(), checkpoint))
            .collect();
        for partition_id in missing {
            let checkpoint = checkpoints.get(partition_id.as_str()).copied();
            let mut position = match checkpoint {
                Some(checkpoint) => resume_position(checkpoint),
                None => (self.options.initial_position_provider)(&partition_id),
            };
            if let Some(ask) = &self.options.start_position_override {
                let asked =
                    tokio::time::timeout(self.store_timeout(), ask(&partition_id, checkpoint))
                        .await;
                match asked {
                    Ok(Ok(Some(chosen))) => position = chosen,
                    Ok(Ok(None)) => {}
                    Ok(Err(reason)) => {
                        tracing::warn!(partition_id = partition_id.as_str(), %reason, "the start position override failed; the partition waits for the next cycle");
                        continue;
                    }
                    Err(_) => {
                        tracing::warn!(
                            partition_id = partition_id.as_str(),
                            "the start position override timed out; the partition waits for the next cycle"
                        );
                        continue;
                    }
                }
            }
            self.spawn_pump(partition_id, position);
        }
    }

    fn spawn_pump(&mut self, partition_id: String, position: EventPosition) {
        let owner_level = self.owned[&partition_id].version;
        let scope = ContextScope {
            fully_qualified_namespace: self.scope.fully_qualified_namespace.clone(),
            event_hub_name: self.scope.event_hub_name.clone(),
            consumer_group: self.scope.consumer_group.clone(),
            partition_id: partition_id.clone(),
            owner_id: self.me().to_owned(),
        };
        let context = PartitionContext::new(scope, Arc::clone(&self.store));
        let processor = self.factory.create_processor(&context);
        let (stop, stop_signal) = watch::channel(None);
        let start = PumpStart {
            context,
            processor,
            position,
            owner_level,
        };
        let task =
            self.pump_tasks
                .spawn(run_pump(Arc::clone(&self.pump_config), start, stop_signal));
        tracing::info!(
            host_name = self.me(),
            partition_id = partition_id.as_str(),
            owner_level,
            start = %position,
            "partition pump started"
        );
        self.pump_partitions.insert(task.id(), partition_id.clone());
        let slot = PumpSlot {
            stop,
            stopping: false,
        };
        assert!(self.pumps.insert(partition_id, slot).is_none());
    }

    /// Forgets a pump that ended. A pump that ended on its own lost the partition, or
    /// panicked; the next cycle renews and restarts what the store still shows as ours.
    fn reap(&mut self, joined: Result<(tokio::task::Id, CloseReason), JoinError>) {
        let task_id = match &joined {
            Ok((task_id, _)) => *task_id,
            Err(join_error) => join_error.id(),
        };
        let partition_id = self
            .pump_partitions
            .remove(&task_id)
            .expect("every pump task is registered");
        let slot = self
            .pumps
            .remove(&partition_id)
            .expect("every pump task has a slot");
        match joined {
            Ok((_, CloseReason::OwnershipLost)) if !slot.stopping => {
                // The hub disconnected the receiver or the store refused a checkpoint: someone
                // else owns the partition now (the next listing shows who).
                self.owned.remove(&partition_id);
                self.publish_owned();
            }
            Ok(_) => {}
            Err(join_error) if join_error.is_panic() => {
                let message = panic_message(join_error.into_panic());
                self.report(HostError::ProcessorPanicked {
                    partition_id,
                    message,
                });
            }
            Err(_) => {}
        }
    }

    /// Stops every pump (cancelling batches in progress) once the fence deadline has passed
    /// without a renewal; see [`Coordinator::fence_deadline`].
    fn fence_if_renewal_expired(&mut self, now: Instant) {
        let expiration = self.options.ownership_expiration;
        if self.fence_deadline().is_none_or(|fence_at| now < fence_at) {
            return;
        }
        let partition_ids: Vec<String> = self.owned.keys().cloned().collect();
        for partition_id in &partition_ids {
            self.stop_pump(partition_id, CloseReason::OwnershipLost);
        }
        self.owned.clear();
        self.publish_owned();
        self.report(HostError::RenewalExpired {
            expiration_ms: u64::try_from(expiration.as_millis()).unwrap_or(u64::MAX),
            partition_count: partition_ids.len(),
        });
    }

    fn publish_owned(&self) {
        let mut owned: Vec<String> = self.owned.keys().cloned().collect();
        owned.sort_by(|a, b| partition_order(a, b));
        self.owned_sender.send_if_modified(|published| {
            let changed = *published != owned;
            if changed {
                *published = owned;
            }
            changed
        });
    }

    fn report(&self, error: HostError) {
        tracing::warn!(host_name = self.me(), %error, "event processor host error");
        if let Some(notifier) = &self.options.error_notifier {
            notifier(&error);
        }
    }

    /// Graceful shutdown: close every pump, then relinquish every owned partition (but those
    /// still in a hand-over).
    async fn shut_down(mut self) -> Result<(), HostError> {
        let partition_ids: Vec<String> = self.pumps.keys().cloned().collect();
        for partition_id in &partition_ids {
            self.stop_pump(partition_id, CloseReason::Shutdown);
        }
        while let Some(joined) = self.pump_tasks.join_next_with_id().await {
            self.reap(joined);
        }
        assert!(self.pumps.is_empty());
        // A partition still waiting for its former owner to notice the steal is not released:
        // whoever claimed a released partition would start at once, while the former owner may
        // still be processing it. Left to expire, it is taken only after that owner's fence.
        let now = Instant::now();
        let releases: Vec<Ownership> = self
            .owned
            .values()
            .filter(|record| {
                self.handoffs
                    .get(&record.partition_id)
                    .is_none_or(|handoff| handoff.is_over(now))
            })
            .map(|record| Ownership {
                owner_id: String::new(),
                ..record.clone()
            })
            .collect();
        let release_count = releases.len();
        let result =
            match tokio::time::timeout(self.store_timeout(), self.store.claim_ownership(releases))
                .await
            {
                Ok(Ok(released)) => {
                    tracing::info!(
                        host_name = self.me(),
                        released = released.len(),
                        owned = release_count,
                        "event processor host stopped; relinquished its partitions"
                    );
                    Ok(())
                }
                Ok(Err(error)) => Err(HostError::Store(error)),
                Err(_) => Err(HostError::StoreTimeout {
                    operation: "relinquishing ownership",
                    timeout_ms: u64::try_from(self.store_timeout().as_millis()).unwrap_or(u64::MAX),
                }),
            };
        let result = match result {
            Ok(()) => self.remove_host_record().await,
            Err(error) => Err(error),
        };
        if let Err(error) = &result {
            self.report(error.clone());
        }
        self.owned.clear();
        self.publish_owned();
        result
    }

    /// Forgets this host's host record, once its partitions are relinquished.
    async fn remove_host_record(&self) -> Result<(), HostError> {
        if !self.store.keeps_host_records() {
            return Ok(());
        }
        let removal = self.store.remove_host(
            &self.scope.fully_qualified_namespace,
            &self.scope.event_hub_name,
            &self.scope.consumer_group,
            &self.options.host_name,
        );
        match tokio::time::timeout(self.store_timeout(), removal).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(HostError::Store(error)),
            Err(_) => Err(HostError::StoreTimeout {
                operation: "removing the host record",
                timeout_ms: u64::try_from(self.store_timeout().as_millis()).unwrap_or(u64::MAX),
            }),
        }
    }
}

/// Sleeps until `at`, or forever when there is no `at`.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn log_acquisition(me: &str, claim: &Claim, record: &Ownership) {
    let (reason, previous_owner) = match &claim.reason {
        ClaimReason::Renew => ("renewed", me),
        ClaimReason::Unclaimed => ("never claimed", ""),
        ClaimReason::Relinquished => ("relinquished", ""),
        ClaimReason::Expired { previous_owner } => ("expired", previous_owner.as_str()),
        ClaimReason::Steal { from } => ("balancing", from.as_str()),
    };
    tracing::info!(
        partition_id = record.partition_id.as_str(),
        new_owner = me,
        previous_owner,
        reason,
        version = record.version,
        "claimed partition"
    );
}

/// Where to resume after a checkpoint: after its offset, else after its sequence number.
fn resume_position(checkpoint: &Checkpoint) -> EventPosition {
    match (checkpoint.offset, checkpoint.sequence_number) {
        (Some(offset), _) => EventPosition::Offset {
            offset,
            inclusive: false,
        },
        (None, Some(sequence_number)) => EventPosition::SequenceNumber {
            sequence_number,
            inclusive: false,
        },
        (None, None) => unreachable!("stores refuse checkpoints without a position"),
    }
}

/// Numeric ids in numeric order ("2" before "10"), then anything else by text.
fn partition_order(a: &str, b: &str) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(a), Ok(b)) => a.cmp(&b),
        (Ok(_), Err(_)) => Ordering::Less,
        (Err(_), Ok(_)) => Ordering::Greater,
        (Err(_), Err(_)) => a.cmp(b),
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(message) = payload.downcast_ref::<&str>() {
        (*message).to_owned()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_resume_after_the_checkpointed_event() {
        let mut checkpoint = Checkpoint {
            fully_qualified_namespace: "ns".to_owned(),
            event_hub_name: "hub".to_owned(),
            consumer_group: "$default".to_owned(),
            partition_id: "0".to_owned(),
            offset: Some(4096),
            sequence_number: Some(12),
        };
        assert_eq!(
            resume_position(&checkpoint),
            EventPosition::Offset {
                offset: 4096,
                inclusive: false
            }
        );
        checkpoint.offset = None;
        assert_eq!(
            resume_position(&checkpoint),
            EventPosition::SequenceNumber {
                sequence_number: 12,
                inclusive: false
            }
        );
    }

    #[test]
    fn partitions_sort_numerically() {
        let mut ids = vec!["10", "2", "b", "1", "a", "0"];
        ids.sort_by(|a, b| partition_order(a, b));
        assert_eq!(ids, ["0", "1", "2", "10", "a", "b"]);
    }

    #[test]
    fn panic_messages_are_extracted() {
        assert_eq!(panic_message(Box::new("static")), "static");
        assert_eq!(panic_message(Box::new(String::from("owned"))), "owned");
        assert_eq!(panic_message(Box::new(7_u8)), "a non-string panic payload");
    }
}
