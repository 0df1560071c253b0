//! [`Broker`]: the in-process API of a Tributary namespace.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use tributary_event::names::{
    DEFAULT_CONSUMER_GROUP, is_default_consumer_group, name_key, validate_consumer_group_name,
    validate_hub_name,
};
use tributary_event::{Clock, EventData, EventPosition, SendTarget, SystemClock};
use tributary_log::{
    GroupCommitter, PartitionProperties, ReadCursor, RecordsRead, Retention, RetentionOutcome,
    SyncTimes,
};

use crate::catalog::{Catalog, ConsumerGroupDefinition, HubCapture, HubCleanup, HubDefinition};
use crate::config::{BrokerConfig, PARTITIONS_MAX};
use crate::door_stamp;
use crate::hub::Hub;
use crate::ownership_registry::OwnershipRegistry;
use crate::receiver::Receiver;
use crate::throttle::Throttle;
use crate::{BrokerError, DisconnectReason};

/// What the hub assigned to an acknowledged send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendReceipt {
    /// The partition the batch went to.
    pub partition: u32,
    /// The sequence number of the batch's first event.
    pub base_sequence: i64,
    /// Each event's offset, in batch order.
    pub offsets: Vec<u64>,
    /// The enqueued time shared by the batch.
    pub enqueued_time_ms: i64,
}

/// A batch written to its partition's log and waiting for its acknowledgement (with `fsync`
/// durability: its sync). Dropping it does not undo the append.
pub struct QueuedAppend {
    hub: Arc<Hub>,
    partition: u32,
    acknowledgement: tokio::sync::oneshot::Receiver<
        Result<tributary_log::AppendReceipt, tributary_log::LogError>,
    >,
}

impl std::fmt::Debug for QueuedAppend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuedAppend")
            .field("partition", &self.partition)
            .finish_non_exhaustive()
    }
}

impl QueuedAppend {
    /// Waits until the batch is acknowledged; the error says why it was not (and then whether
    /// it reached the disk is unknown, as for any failed append).
    pub async fn acknowledged(self) -> Result<SendReceipt, BrokerError> {
        let log_error = self.hub.log_error(self.partition);
        let receipt = self
            .acknowledgement
            .await
            .map_err(|_| BrokerError::ShuttingDown)?
            .map_err(&log_error)?;
        Ok(SendReceipt {
            partition: self.partition,
            base_sequence: receipt.base_sequence,
            offsets: receipt.offsets,
            enqueued_time_ms: receipt.enqueued_time_ms,
        })
    }
}

/// What to create an event hub with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubSpec {
    /// Its name.
    pub name: String,
    /// How many partitions (1 to 1024).
    pub partition_count: u32,
    /// How long events are kept; `None` forever.
    pub retention_age_ms: Option<i64>,
    /// How many bytes each partition keeps at most; `None`: no limit.
    pub retention_bytes_max: Option<u64>,
    /// Delete by age and size (the default), compact by key, or both.
    pub cleanup: HubCleanup,
    /// Its Event Hubs Capture, if any (checked by `tributary_capture::spec` first).
    pub capture: Option<HubCapture>,
}

impl HubSpec {
    /// A hub with `partition_count` partitions and the default retention (one day).
    pub fn new(name: impl Into<String>, partition_count: u32) -> Self {
        HubSpec {
            name: name.into(),
            partition_count,
            retention_age_ms: Some(crate::config::RETENTION_AGE_MS_DEFAULT),
            retention_bytes_max: None,
            cleanup: HubCleanup::default(),
            capture: None,
        }
    }
}

/// What a receiver opens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiverSpec {
    /// The event hub.
    pub hub: String,
    /// The consumer group (any case).
    pub consumer_group: String,
    /// The partition id.
    pub partition: String,
    /// Where to start.
    pub start: EventPosition,
    /// The epoch (owner level), if this is an epoch receiver.
    pub owner_level: Option<i64>,
    /// A name to show in the list of receivers when the five-receiver limit is hit.
    pub name: Option<String>,
}

impl ReceiverSpec {
    /// A non-epoch receiver in `$Default`.
    pub fn new(hub: impl Into<String>, partition: impl Into<String>, start: EventPosition) -> Self {
        ReceiverSpec {
            hub: hub.into(),
            consumer_group: DEFAULT_CONSUMER_GROUP.to_owned(),
            partition: partition.into(),
            start,
            owner_level: None,
            name: None,
        }
    }
}

pub(crate) struct BrokerInner {
    pub(crate) config: BrokerConfig,
    pub(crate) clock: Arc<dyn Clock>,
    committer: GroupCommitter,
    /// Serialises catalog changes (and the file work that goes with them).
    pub(crate) catalog: Mutex<Catalog>,
    pub(crate) hubs: RwLock<HashMap<String, Arc<Hub>>>,
    next_receiver_id: AtomicU64,
    /// Event processors' ownership records and checkpoints.
    registry: OwnershipRegistry,
    pub(crate) shutting_down: AtomicBool,
    /// Called with a hub's name once it is deleted (see [`Broker::on_hub_deleted`]).
    hub_deleted: Mutex<Vec<HubDeleted>>,
    /// The throughput limits every front door applies.
    throttle: Throttle,
    /// What the capture running in `serve` reports of each captured partition.
    pub(crate) capture: Mutex<crate::capture::CaptureStatuses>,
    _lock: File,
}

/// What [`Broker::on_hub_deleted`] calls.
type HubDeleted = Arc<dyn Fn(&str) + Send + Sync>;

/// A Tributary namespace in this process: its event hubs, their partitions and consumer
/// groups, and the receivers open on them. Cheap to clone; clones share the broker.
#[derive(Clone)]
pub struct Broker {
    pub(crate) inner: Arc<BrokerInner>,
}

impl Broker {
    /// Whether `other` is a handle to this same broker (not another one, even on the same
    /// data directory).
    pub fn same_as(&self, other: &Broker) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("data_dir", &self.inner.config.data_dir)
            .finish_non_exhaustive()
    }
}

fn storage(op: &str, path: &Path, e: impl std::fmt::Display) -> BrokerError {
    BrokerError::Storage(format!("{op} {}: {e}", path.display()))
}

impl Broker {
    /// Opens the broker on `config.data_dir` with the system clock; see [`Broker::open_with_clock`].
    pub async fn open(config: BrokerConfig) -> Result<Broker, BrokerError> {
        Self::open_with_clock(config, Arc::new(SystemClock)).await
    }

    /// Opens the broker: locks the data directory (one broker per directory), loads the
    /// catalog, opens and recovers every partition, and starts the retention task.
    pub async fn open_with_clock(
        config: BrokerConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Broker, BrokerError> {
        config
            .log
            .validate()
            .map_err(|e| BrokerError::Storage(e.to_string()))?;
        let broker = tokio::task::spawn_blocking(move || Self::open_blocking(config, clock))
            .await
            .expect("opening the broker does not panic")?;
        let weak = Arc::downgrade(&broker.inner);
        let interval = broker.inner.config.retention_check_interval;
        tokio::spawn(every(interval, weak.clone(), |broker| async move {
            if let Err(e) = broker.enforce_retention().await {
                tracing::error!(error = %e, "retention failed");
            }
        }));
        let interval = broker.inner.config.compaction_check_interval;
        tokio::spawn(every(interval, weak, |broker| async move {
            broker.compact_due().await;
        }));
        Ok(broker)
    }

    fn open_blocking(config: BrokerConfig, clock: Arc<dyn Clock>) -> Result<Broker, BrokerError> {
        let dir = &config.data_dir;
        std::fs::create_dir_all(dir.join("hubs")).map_err(|e| storage("create", dir, e))?;
        let lock = lock_data_dir(dir)?;
        let catalog = Catalog::load(dir)?;
        remove_orphan_hub_dirs(dir, &catalog);
        let committer = GroupCommitter::start_with(config.sync_scope);
        let mut hubs = HashMap::new();
        for (key, definition) in &catalog.hubs {
            let hub_dir = dir.join("hubs").join(key);
            let hub = Hub::open(
                &hub_dir,
                definition.clone(),
                config.log,
                &config.storage,
                &committer,
                clock.clone(),
            )?;
            hubs.insert(key.clone(), Arc::new(hub));
        }
        tracing::info!(data_dir = %dir.display(), hubs = hubs.len(), "broker opened");
        let throttle = Throttle::new(config.throughput.clone());
        Ok(Broker {
            inner: Arc::new(BrokerInner {
                config,
                clock,
                committer,
                catalog: Mutex::new(catalog),
                hubs: RwLock::new(hubs),
                next_receiver_id: AtomicU64::new(1),
                registry: OwnershipRegistry::default(),
                shutting_down: AtomicBool::new(false),
                hub_deleted: Mutex::new(Vec::new()),
                throttle,
                capture: Mutex::new(Default::default()),
                _lock: lock,
            }),
        })
    }

    pub(crate) fn registry(&self) -> &OwnershipRegistry {
        &self.inner.registry
    }

    /// The broker's configuration.
    pub fn config(&self) -> &BrokerConfig {
        &self.inner.config
    }

    /// The namespace's and hubs' throughput limits, which the front doors apply.
    pub fn throttle(&self) -> &Throttle {
        &self.inner.throttle
    }

    /// How long the log's `fdatasync` calls have taken since the broker opened, and how many
    /// `fsync` appends they covered: the disk's share of every acknowledgement.
    pub fn sync_times(&self) -> SyncTimes {
        self.inner.committer.sync_times()
    }

    pub(crate) fn hub(&self, name: &str) -> Result<Arc<Hub>, BrokerError> {
        if self.inner.shutting_down.load(Ordering::Acquire) {
            return Err(BrokerError::ShuttingDown);
        }
        self.inner
            .hubs
            .read()
            .expect("hub map")
            .get(&name_key(name))
            .cloned()
            .ok_or_else(|| BrokerError::HubNotFound {
                name: name.to_owned(),
            })
    }

    /// Creates an event hub with `$Default` as its only consumer group.
    pub async fn create_hub(&self, spec: HubSpec) -> Result<HubDefinition, BrokerError> {
        validate_hub_name(&spec.name)?;
        if !(1..=PARTITIONS_MAX).contains(&spec.partition_count) {
            return Err(BrokerError::InvalidPartitionCount {
                count: spec.partition_count,
                max: PARTITIONS_MAX,
            });
        }
        check_retention(spec.retention_age_ms, spec.retention_bytes_max)?;
        spec.cleanup.validate()?;
        let broker = self.clone();
        tokio::task::spawn_blocking(move || broker.create_hub_blocking(spec))
            .await
            .expect("creating a hub does not panic")
    }

    fn create_hub_blocking(&self, spec: HubSpec) -> Result<HubDefinition, BrokerError> {
        let inner = &self.inner;
        let mut catalog = inner.catalog.lock().expect("catalog");
        let key = name_key(&spec.name);
        if catalog.hubs.contains_key(&key) {
            return Err(BrokerError::HubExists { name: spec.name });
        }
        let now = inner.clock.now_ms();
        let definition = HubDefinition {
            name: spec.name,
            id: crate::catalog::new_hub_id(),
            partition_count: spec.partition_count,
            retention_age_ms: spec.retention_age_ms,
            retention_bytes_max: spec.retention_bytes_max,
            created_at_ms: now,
            cleanup: spec.cleanup,
            capture: spec.capture.map(|c| HubCapture {
                enabled_at_ms: now,
                ..c
            }),
            consumer_groups: vec![ConsumerGroupDefinition {
                name: DEFAULT_CONSUMER_GROUP.to_owned(),
                created_at_ms: now,
            }],
        };
        let hub_dir = inner.config.data_dir.join("hubs").join(&key);
        // A directory left by an earlier failed create is not in the catalog; start afresh.
        let _ = std::fs::remove_dir_all(&hub_dir);
        let hub = Hub::open(
            &hub_dir,
            definition.clone(),
            inner.config.log,
            &inner.config.storage,
            &inner.committer,
            inner.clock.clone(),
        )?;
        catalog.hubs.insert(key.clone(), definition.clone());
        if let Err(e) = catalog.save() {
            catalog.hubs.remove(&key);
            drop(hub);
            let _ = std::fs::remove_dir_all(&hub_dir);
            return Err(e);
        }
        inner
            .hubs
            .write()
            .expect("hub map")
            .insert(key, Arc::new(hub));
        tracing::info!(hub = %definition.name, partitions = definition.partition_count, "event hub created");
        Ok(definition)
    }

    /// Every event hub, ordered by name.
    pub fn list_hubs(&self) -> Vec<HubDefinition> {
        let catalog = self.inner.catalog.lock().expect("catalog");
        catalog.hubs.values().cloned().collect()
    }

    /// One event hub's definition.
    pub fn describe_hub(&self, name: &str) -> Result<HubDefinition, BrokerError> {
        Ok(self
            .hub(name)?
            .definition
            .read()
            .expect("hub definition")
            .clone())
    }

    /// Calls `deleted` with a hub's name (as the hub spelt it) each time a hub is deleted, from
    /// whichever door or command deleted it: what belongs to a hub outside the broker (its
    /// shared access policies) goes with it. It runs while the catalog is locked, so it must
    /// not call back into the broker's hub or group changes.
    pub fn on_hub_deleted(&self, deleted: impl Fn(&str) + Send + Sync + 'static) {
        let mut callbacks = self
            .inner
            .hub_deleted
            .lock()
            .expect("hub deletion callbacks");
        callbacks.push(Arc::new(deleted));
    }

    /// Deletes an event hub and all its events; its receivers are disconnected.
    pub async fn delete_hub(&self, name: &str) -> Result<(), BrokerError> {
        let broker = self.clone();
        let name = name.to_owned();
        tokio::task::spawn_blocking(move || broker.delete_hub_blocking(&name))
            .await
            .expect("deleting a hub does not panic")
    }

    fn delete_hub_blocking(&self, name: &str) -> Result<(), BrokerError> {
        let inner = &self.inner;
        let mut catalog = inner.catalog.lock().expect("catalog");
        let key = name_key(name);
        let Some(definition) = catalog.hubs.remove(&key) else {
            return Err(BrokerError::HubNotFound {
                name: name.to_owned(),
            });
        };
        if let Err(e) = catalog.save() {
            catalog.hubs.insert(key, definition);
            return Err(e);
        }
        let hub = inner.hubs.write().expect("hub map").remove(&key);
        // After the hub left the map, so no claim can write its records again.
        inner.registry.lock().forget_hub(&key);
        // A hub made later under this name is not taken for captured by this one's capture.
        self.forget_capture(name);
        let callbacks = inner
            .hub_deleted
            .lock()
            .expect("hub deletion callbacks")
            .clone();
        for deleted in callbacks {
            deleted(&definition.name);
        }
        if let Some(hub) = hub {
            hub.disconnect(None, &DisconnectReason::HubDeleted);
            // Open readers keep their file handles; the files go once they let go.
            std::fs::remove_dir_all(&hub.dir).map_err(|e| storage("remove", &hub.dir, e))?;
        }
        tracing::info!(hub = %definition.name, "event hub deleted");
        Ok(())
    }

    /// Creates a consumer group in an event hub.
    pub async fn create_consumer_group(
        &self,
        hub: &str,
        group: &str,
    ) -> Result<ConsumerGroupDefinition, BrokerError> {
        validate_consumer_group_name(group)?;
        let hub = self.hub(hub)?;
        let mut catalog = self.inner.catalog.lock().expect("catalog");
        let key = name_key(&hub.name());
        let definition = catalog
            .hubs
            .get_mut(&key)
            .expect("an open hub is in the catalog");
        if definition.consumer_group(group).is_some() {
            return Err(BrokerError::ConsumerGroupExists {
                hub: definition.name.clone(),
                group: group.to_owned(),
            });
        }
        let max = self.inner.config.consumer_groups_max;
        if definition.consumer_groups.len() as u32 >= max {
            return Err(BrokerError::ConsumerGroupLimit {
                hub: definition.name.clone(),
                max,
            });
        }
        let created = ConsumerGroupDefinition {
            name: group.to_owned(),
            created_at_ms: self.inner.clock.now_ms(),
        };
        definition.consumer_groups.push(created.clone());
        let updated = definition.clone();
        if let Err(e) = catalog.save() {
            catalog
                .hubs
                .get_mut(&key)
                .expect("still there")
                .consumer_groups
                .pop();
            return Err(e);
        }
        *hub.definition.write().expect("hub definition") = updated;
        Ok(created)
    }

    /// The consumer groups of an event hub, `$Default` first.
    pub fn list_consumer_groups(
        &self,
        hub: &str,
    ) -> Result<Vec<ConsumerGroupDefinition>, BrokerError> {
        Ok(self.describe_hub(hub)?.consumer_groups)
    }

    /// Deletes a consumer group; its receivers are disconnected. `$Default` cannot be deleted.
    pub async fn delete_consumer_group(&self, hub: &str, group: &str) -> Result<(), BrokerError> {
        if is_default_consumer_group(group) {
            return Err(BrokerError::DefaultConsumerGroup);
        }
        let hub = self.hub(hub)?;
        let mut catalog = self.inner.catalog.lock().expect("catalog");
        let key = name_key(&hub.name());
        let definition = catalog
            .hubs
            .get_mut(&key)
            .expect("an open hub is in the catalog");
        let before = definition.clone();
        definition
            .consumer_groups
            .retain(|g| !g.name.eq_ignore_ascii_case(group));
        if definition.consumer_groups.len() == before.consumer_groups.len() {
            return Err(BrokerError::ConsumerGroupNotFound {
                hub: before.name,
                group: group.to_owned(),
            });
        }
        let updated = definition.clone();
        if let Err(e) = catalog.save() {
            catalog.hubs.insert(key, before);
            return Err(e);
        }
        *hub.definition.write().expect("hub definition") = updated;
        hub.disconnect(Some(group), &DisconnectReason::ConsumerGroupDeleted);
        // After the group left the definition, so no claim can write its records again.
        self.inner.registry.lock().delete_group(&hub, group)
    }

    /// Appends `events` as one batch to the partition `target` picks, and waits until the
    /// batch is acknowledged (with `fsync` durability: synced to disk).
    ///
    /// A batch is all or nothing: if any event is refused, none is written.
    pub async fn send(
        &self,
        hub: &str,
        target: SendTarget,
        events: Vec<EventData>,
    ) -> Result<SendReceipt, BrokerError> {
        self.send_events(hub, target, Cow::Owned(events)).await
    }

    /// [`Broker::send`] of events the caller keeps: they are not copied unless the batch's
    /// partition key must be written into them.
    pub async fn send_borrowed(
        &self,
        hub: &str,
        target: SendTarget,
        events: &[EventData],
    ) -> Result<SendReceipt, BrokerError> {
        self.send_events(hub, target, Cow::Borrowed(events)).await
    }

    async fn send_events(
        &self,
        hub: &str,
        target: SendTarget,
        mut events: Cow<'_, [EventData]>,
    ) -> Result<SendReceipt, BrokerError> {
        let hub = self.hub(hub)?;
        stamp_partition_key(&target, &mut events)?;
        door_stamp::drop_forged(&mut events);
        let partition = hub.route(&target)?;
        Self::append(hub, partition, &events).await
    }

    /// Appends `events` as one batch to partition `partition`, keeping each event's own
    /// partition key, and waits until the batch is acknowledged as [`Broker::send`] does.
    ///
    /// For front doors whose protocol lets a client pick the partition and also carry a key:
    /// a Kafka producer's partitioner picks the partition and the record's key is kept as the
    /// event's partition key, as Event Hubs' Kafka endpoint keeps it. The events' keys need not
    /// hash to `partition`, nor agree with each other.
    pub async fn send_to_partition_keyed(
        &self,
        hub: &str,
        partition: &str,
        events: &[EventData],
    ) -> Result<SendReceipt, BrokerError> {
        self.queue_to_partition_keyed(hub, partition, events)?
            .acknowledged()
            .await
    }

    /// [`Broker::send_to_partition_keyed`] in two steps: the batch is written to the
    /// partition's log before this returns, so batches queued one after another by one caller
    /// are stored in that order, and the returned [`QueuedAppend`] waits for its
    /// acknowledgement. For front doors that read a client's next request while earlier ones
    /// wait for their sync (Kafka producers keep several requests in flight), so that one sync
    /// covers them all.
    pub fn queue_to_partition_keyed(
        &self,
        hub: &str,
        partition: &str,
        events: &[EventData],
    ) -> Result<QueuedAppend, BrokerError> {
        let hub = self.hub(hub)?;
        let partition = hub.partition(partition)?;
        let mut events = Cow::Borrowed(events);
        door_stamp::drop_forged(&mut events);
        Self::queue(hub, partition, &events)
    }

    /// [`Broker::send_to_partition_keyed`] with a front door's private `stamp` kept with the
    /// batch's first event (see [`crate::door_stamp`]): stored by the same append, so durable
    /// exactly when the events are, and never shown to a reader. [`Broker::read_door_stamps`]
    /// reads it back.
    pub async fn send_to_partition_stamped(
        &self,
        hub: &str,
        partition: &str,
        mut events: Vec<EventData>,
        stamp: &[u8],
    ) -> Result<SendReceipt, BrokerError> {
        let hub = self.hub(hub)?;
        let partition = hub.partition(partition)?;
        door_stamp::stamp(&mut events, stamp);
        Self::append(hub, partition, &events).await
    }

    /// Appends one batch to one partition of `hub` and waits for its acknowledgement.
    async fn append(
        hub: Arc<Hub>,
        partition: u32,
        events: &[EventData],
    ) -> Result<SendReceipt, BrokerError> {
        Self::queue(hub, partition, events)?.acknowledged().await
    }

    /// Writes one batch to one partition's log; the acknowledgement is awaited through the
    /// returned [`QueuedAppend`].
    fn queue(
        hub: Arc<Hub>,
        partition: u32,
        events: &[EventData],
    ) -> Result<QueuedAppend, BrokerError> {
        let log = &hub.partitions[partition as usize].log;
        let (tx, acknowledgement) = tokio::sync::oneshot::channel();
        log.append_with(
            events,
            Box::new(move |outcome| {
                let _ = tx.send(outcome);
            }),
        )
        .map_err(hub.log_error(partition))?;
        Ok(QueuedAppend {
            hub,
            partition,
            acknowledgement,
        })
    }

    /// The properties of one partition.
    pub fn partition_properties(
        &self,
        hub: &str,
        partition: &str,
    ) -> Result<PartitionProperties, BrokerError> {
        let hub = self.hub(hub)?;
        let partition = hub.partition(partition)?;
        Ok(hub.partitions[partition as usize].log.properties())
    }

    /// Opens a receiver, applying the epoch rules of its (hub, group, partition): it may
    /// disconnect other receivers, or be refused.
    pub fn open_receiver(&self, spec: ReceiverSpec) -> Result<Receiver, BrokerError> {
        let hub = self.hub(&spec.hub)?;
        let group = {
            let definition = hub.definition.read().expect("hub definition");
            definition
                .consumer_group(&spec.consumer_group)
                .map(|g| g.name.clone())
                .ok_or_else(|| BrokerError::ConsumerGroupNotFound {
                    hub: definition.name.clone(),
                    group: spec.consumer_group.clone(),
                })?
        };
        let partition = hub.partition(&spec.partition)?;
        let hub_partition = &hub.partitions[partition as usize];
        let start = hub_partition
            .log
            .resolve(&spec.start)
            .map_err(hub.log_error(partition))?;
        let id = self.inner.next_receiver_id.fetch_add(1, Ordering::Relaxed);
        let control = hub.register_receiver(&group, partition, id, spec.owner_level, spec.name)?;
        Ok(Receiver {
            commits: hub_partition.commits.clone(),
            cursor: ReadCursor::new(start),
            hub,
            group,
            partition,
            id,
            epoch: spec.owner_level,
            control,
            last_enqueued: None,
        })
    }

    /// The sequence number a reader starting at `position` in one partition reads first (see
    /// [`tributary_log::PartitionLog::resolve`]). For stateless readers such as cursor-based
    /// HTTP APIs; receivers resolve their own start.
    pub fn resolve_position(
        &self,
        hub: &str,
        partition: &str,
        position: &EventPosition,
    ) -> Result<i64, BrokerError> {
        let hub = self.hub(hub)?;
        let p = hub.partition(partition)?;
        hub.partitions[p as usize]
            .log
            .resolve(position)
            .map_err(hub.log_error(p))
    }

    /// Reads up to `max_events` committed events of one partition from sequence number
    /// `from_sequence`, without a receiver (no epoch rules, no waiting). Returns an empty vector
    /// at the end of the partition; an error if retention removed `from_sequence`.
    pub fn read(
        &self,
        hub: &str,
        partition: &str,
        from_sequence: i64,
        max_events: usize,
        max_bytes: u64,
    ) -> Result<Vec<tributary_event::ReceivedEvent>, BrokerError> {
        if from_sequence < 0 {
            return Err(BrokerError::InvalidSend(format!(
                "sequence number {from_sequence} is negative"
            )));
        }
        let mut cursor = ReadCursor::new(from_sequence);
        self.read_from(hub, partition, &mut cursor, max_events, max_bytes)
    }

    /// [`Broker::read`] from `cursor`, advancing it. A sequential reader (a capture) keeps its
    /// cursor across calls: each read goes on where the last ended without consulting the
    /// index, and reuses the cursor's read buffers once the events read into them are dropped.
    pub fn read_from(
        &self,
        hub: &str,
        partition: &str,
        cursor: &mut ReadCursor,
        max_events: usize,
        max_bytes: u64,
    ) -> Result<Vec<tributary_event::ReceivedEvent>, BrokerError> {
        let (hub, p, mut events) = self.read_log(hub, partition, |log| {
            log.read(cursor, max_events, max_bytes)
        })?;
        hub.count_delivered(p, events.len());
        door_stamp::hide(&mut events);
        Ok(events)
    }

    /// [`Broker::read_from`] into `into` (cleared first), each record read in place rather than
    /// copied into an owned event: for a reader that only passes events on (the capture).
    pub fn read_records_from(
        &self,
        hub: &str,
        partition: &str,
        cursor: &mut ReadCursor,
        max_events: usize,
        max_bytes: u64,
        into: &mut RecordsRead,
    ) -> Result<(), BrokerError> {
        let (hub, p, ()) = self.read_log(hub, partition, |log| {
            log.read_records(cursor, max_events, max_bytes, into)
        })?;
        hub.count_delivered(p, into.len());
        door_stamp::hide_in_records(into);
        Ok(())
    }

    /// The door stamps ([`Broker::send_to_partition_stamped`]) of one partition's events from
    /// sequence number `from_sequence`, reading up to `max_events` events (about `max_bytes`).
    /// Counts no delivery.
    pub fn read_door_stamps(
        &self,
        hub: &str,
        partition: &str,
        from_sequence: i64,
        max_events: usize,
        max_bytes: u64,
    ) -> Result<door_stamp::DoorStamps, BrokerError> {
        let mut cursor = ReadCursor::new(from_sequence.max(0));
        let (_, _, events) = self.read_log(hub, partition, |log| {
            log.read(&mut cursor, max_events, max_bytes)
        })?;
        let stamps = events
            .iter()
            .filter_map(|e| door_stamp::stamp_of(&e.data).map(|s| (e.sequence_number, s.to_vec())))
            .collect();
        Ok(door_stamp::DoorStamps {
            stamps,
            next_sequence: cursor.next_sequence(),
        })
    }

    /// Runs `read` on the log of one partition: events as stored (door stamps included); with
    /// the hub and partition index, for the caller's accounting.
    fn read_log<T>(
        &self,
        hub: &str,
        partition: &str,
        read: impl FnOnce(&tributary_log::PartitionLog) -> Result<T, tributary_log::LogError>,
    ) -> Result<(Arc<Hub>, u32, T), BrokerError> {
        let hub = self.hub(hub)?;
        let p = hub.partition(partition)?;
        let read = read(&hub.partitions[p as usize].log).map_err(hub.log_error(p))?;
        Ok((hub, p, read))
    }

    /// Keeps the batches partition `partition` of `hub` appends from now on in memory for a
    /// reader that follows its end, until the follower is dropped
    /// ([`tributary_log::PartitionLog::follow_tail`]).
    pub fn follow_tail(
        &self,
        hub: &str,
        partition: &str,
    ) -> Result<tributary_log::TailFollower, BrokerError> {
        let hub = self.hub(hub)?;
        let p = hub.partition(partition)?;
        Ok(hub.partitions[p as usize].log.follow_tail())
    }

    /// Waits until partition `partition` of `hub` has an event at or after `sequence`, or
    /// `wait` passes. Returns whether one is there. For long-polling readers without a receiver.
    pub async fn wait_for_sequence(
        &self,
        hub: &str,
        partition: &str,
        sequence: i64,
        wait: Duration,
    ) -> Result<bool, BrokerError> {
        let hub = self.hub(hub)?;
        let p = hub.partition(partition)?;
        let mut commits = hub.partitions[p as usize].commits.clone();
        let arrived = tokio::time::timeout(wait, commits.wait_for(|next| *next > sequence)).await;
        Ok(matches!(arrived, Ok(Ok(_))))
    }

    /// The broker's wall clock (ms since the epoch), for stamping things consistently with
    /// enqueued times.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    /// How many receivers are open on an event hub.
    pub fn open_receiver_count(&self, hub: &str) -> Result<usize, BrokerError> {
        Ok(self.hub(hub)?.open_receivers())
    }

    /// The hubs open now that `wanted` picks (a snapshot: the map is not held).
    pub(crate) fn hubs_where(&self, wanted: impl Fn(&Hub) -> bool) -> Vec<Arc<Hub>> {
        self.inner
            .hubs
            .read()
            .expect("hub map")
            .values()
            .filter(|hub| wanted(hub))
            .cloned()
            .collect()
    }

    /// Enforces every hub's retention now (the background task does this periodically).
    pub async fn enforce_retention(&self) -> Result<(), BrokerError> {
        let hubs = self.hubs_where(|_| true);
        let broker = self.clone();
        tokio::task::spawn_blocking(move || broker.enforce_retention_blocking(&hubs))
            .await
            .expect("retention does not panic")
    }

    /// Stops accepting work, disconnects every receiver and syncs every partition.
    pub async fn shutdown(&self) -> Result<(), BrokerError> {
        self.inner.shutting_down.store(true, Ordering::Release);
        let hubs: Vec<Arc<Hub>> = self
            .inner
            .hubs
            .read()
            .expect("hub map")
            .values()
            .cloned()
            .collect();
        for hub in &hubs {
            hub.disconnect(None, &DisconnectReason::Shutdown);
        }
        tokio::task::spawn_blocking(move || {
            for hub in &hubs {
                for (partition, p) in hub.partitions.iter().enumerate() {
                    p.log.flush().map_err(hub.log_error(partition as u32))?;
                }
            }
            Ok(())
        })
        .await
        .expect("flushing does not panic")
    }
}

/// Checks a hub's retention age and size: each above 0, or absent for no limit.
pub(crate) fn check_retention(
    age_ms: Option<i64>,
    bytes_max: Option<u64>,
) -> Result<(), BrokerError> {
    if age_ms.is_some_and(|a| a <= 0) || bytes_max == Some(0) {
        return Err(BrokerError::InvalidRetention(
            "retention age and size must be above 0 (or absent for no limit)".into(),
        ));
    }
    Ok(())
}

/// Makes the events of a batch agree with its target: a key batch stamps its key on every
/// event; a partition or round-robin batch may carry none.
/// Checks every event's own partition key against the batch's `target`, and gives the keyless
/// ones the batch's key (copying the events only then).
fn stamp_partition_key(
    target: &SendTarget,
    events: &mut Cow<'_, [EventData]>,
) -> Result<(), BrokerError> {
    let mut keyless = false;
    for (index, event) in events.iter().enumerate() {
        match (target, &event.partition_key) {
            (SendTarget::PartitionKey(_), None) => keyless = true,
            (SendTarget::PartitionKey(key), Some(own)) if own == key => {}
            (SendTarget::PartitionKey(key), Some(own)) => {
                return Err(BrokerError::InvalidSend(format!(
                    "event {index} has the partition key {own:?} but the batch is sent with the key {key:?}"
                )));
            }
            (_, Some(own)) => {
                return Err(BrokerError::InvalidSend(format!(
                    "event {index} has the partition key {own:?}; send it with that key instead of to a partition or round-robin"
                )));
            }
            (_, None) => {}
        }
    }
    if let (true, SendTarget::PartitionKey(key)) = (keyless, target) {
        for event in events.to_mut() {
            event.partition_key.get_or_insert_with(|| key.clone());
        }
    }
    Ok(())
}

impl Broker {
    /// Retention over `hubs`, keeping what captured hubs' captures have not written (see
    /// [`crate::capture`]).
    fn enforce_retention_blocking(&self, hubs: &[Arc<Hub>]) -> Result<(), BrokerError> {
        for hub in hubs {
            let definition = hub.definition.read().expect("hub definition").clone();
            let retention = Retention {
                age_ms_max: definition.retention_age_ms,
                bytes_max: definition.retention_bytes_max,
            };
            for (partition, p) in hub.partitions.iter().enumerate() {
                let index = partition as u32;
                let uncaptured = definition
                    .capture
                    .as_ref()
                    .map(|_| self.uncaptured(&definition.name, index));
                let outcome = p
                    .log
                    .enforce_retention_keeping(&retention, uncaptured)
                    .map_err(hub.log_error(index))?;
                if outcome.segments_removed > 0 {
                    tracing::info!(hub = %definition.name, partition, segments = outcome.segments_removed, bytes = outcome.bytes_removed, "retention removed segments");
                }
                if uncaptured.is_some() {
                    self.note_capture_retention(&definition.name, index, &outcome);
                }
            }
        }
        Ok(())
    }

    /// Records (and logs) what retention did to a captured partition's uncaptured events.
    fn note_capture_retention(&self, hub: &str, partition: u32, outcome: &RetentionOutcome) {
        if outcome.held_for_uncaptured {
            tracing::warn!(
                hub,
                partition,
                "capture is behind retention: keeping segments past the retention until they are captured (serve --capture-retention)"
            );
        }
        if outcome.uncaptured_events_removed > 0 {
            tracing::warn!(
                hub,
                partition,
                events = outcome.uncaptured_events_removed,
                "capture is behind retention: removed events not yet captured (serve --capture-retention proceed)"
            );
        }
        self.report_capture(hub, partition, |status| {
            status.retention_held = outcome.held_for_uncaptured;
            status.uncaptured_events_removed += outcome.uncaptured_events_removed;
        });
    }

    /// Runs `work` on this broker every `interval` (the first after one interval) until the
    /// broker is dropped or shuts down, as retention and compaction run: for background work
    /// that lives above the broker (capture).
    pub fn spawn_every<W, F>(&self, interval: Duration, work: W) -> tokio::task::JoinHandle<()>
    where
        W: Fn(Broker) -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        tokio::spawn(every(interval, Arc::downgrade(&self.inner), work))
    }
}

/// Runs `work` on the broker every `interval` (the first after one interval) until the broker
/// is dropped or shuts down: retention and compaction in the background.
async fn every<W, F>(interval: Duration, broker: Weak<BrokerInner>, work: W)
where
    W: Fn(Broker) -> F,
    F: Future<Output = ()>,
{
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let Some(inner) = broker.upgrade() else {
            return;
        };
        if inner.shutting_down.load(Ordering::Acquire) {
            return;
        }
        work(Broker { inner }).await;
    }
}

fn lock_data_dir(dir: &Path) -> Result<File, BrokerError> {
    let path = dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| storage("open", &path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(BrokerError::Storage(format!(
            "the data directory {} is in use by another Tributary process (is `tributary serve` running there?)",
            dir.display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(storage("lock", &path, e)),
    }
}

/// Removes hub directories the catalog does not know (a create or delete cut short).
fn remove_orphan_hub_dirs(dir: &Path, catalog: &Catalog) {
    let Ok(entries) = std::fs::read_dir(dir.join("hubs")) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !catalog.hubs.contains_key(&name) {
            tracing::warn!(dir = %entry.path().display(), "removing a hub directory that is not in the catalog");
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
