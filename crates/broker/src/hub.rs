//! One open event hub: its partition logs, its routing, and its open receivers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::watch;
use tributary_event::names::{name_key, parse_partition_id};
use tributary_event::{Clock, partition_for_key};
use tributary_log::storage::Storage;
use tributary_log::{GroupCommitter, LogConfig, PartitionLog};

use crate::catalog::{HubCleanup, HubDefinition};
use crate::cleanup::CompactionSchedule;
use crate::epochs::{EpochRegistry, NON_EPOCH_RECEIVERS_MAX, OpenRefusal, ReceiverId};
use crate::receiver::ReceiverControl;
use crate::{BrokerError, DisconnectReason, SendTarget};

/// One partition of an open hub.
pub(crate) struct HubPartition {
    pub log: PartitionLog,
    /// Moves to the partition's next sequence number whenever appends become visible.
    pub commits: watch::Receiver<i64>,
    /// Events handed to readers (receivers and receiver-less reads) since the broker opened.
    pub delivered: AtomicU64,
    /// When compaction is next due (for hubs that compact).
    pub compaction: CompactionSchedule,
}

#[derive(Default)]
struct ReceiverTable {
    /// Per (consumer group key, partition).
    registries: HashMap<(String, u32), EpochRegistry>,
    controls: HashMap<ReceiverId, Arc<ReceiverControl>>,
}

/// An open event hub.
pub(crate) struct Hub {
    pub definition: RwLock<HubDefinition>,
    pub partitions: Vec<HubPartition>,
    pub clock: Arc<dyn Clock>,
    pub dir: PathBuf,
    round_robin: AtomicU32,
    receivers: Mutex<ReceiverTable>,
}

impl Hub {
    /// Opens (creating if needed) every partition log of the hub.
    pub(crate) fn open(
        dir: &Path,
        definition: HubDefinition,
        log_config: LogConfig,
        storage: &Arc<dyn Storage>,
        committer: &GroupCommitter,
        clock: Arc<dyn Clock>,
    ) -> Result<Hub, BrokerError> {
        let mut partitions = Vec::with_capacity(definition.partition_count as usize);
        let log_config = LogConfig {
            cleanup: definition.cleanup.on(log_config.cleanup),
            ..log_config
        };
        for partition in 0..definition.partition_count {
            let log = PartitionLog::open_on(
                storage.clone(),
                &dir.join(partition.to_string()),
                log_config,
                committer.clone(),
                clock.clone(),
            )
            .map_err(|source| BrokerError::Log {
                hub: definition.name.clone(),
                partition,
                source,
            })?;
            let (tx, commits) = watch::channel(log.committed().next_sequence);
            log.set_commit_listener(move |c| {
                tx.send_replace(c.next_sequence);
            });
            partitions.push(HubPartition {
                log,
                commits,
                delivered: AtomicU64::new(0),
                compaction: CompactionSchedule::default(),
            });
        }
        Ok(Hub {
            definition: RwLock::new(definition),
            partitions,
            clock,
            dir: dir.to_owned(),
            round_robin: AtomicU32::new(0),
            receivers: Mutex::new(ReceiverTable::default()),
        })
    }

    /// Wraps a log error of one of this hub's partitions with the hub and partition it is about.
    pub(crate) fn log_error(
        &self,
        partition: u32,
    ) -> impl Fn(tributary_log::LogError) -> BrokerError + '_ {
        move |source| BrokerError::Log {
            hub: self.name(),
            partition,
            source,
        }
    }

    pub(crate) fn name(&self) -> String {
        self.definition.read().expect("hub definition").name.clone()
    }

    pub(crate) fn cleanup(&self) -> HubCleanup {
        self.definition.read().expect("hub definition").cleanup
    }

    pub(crate) fn partition_count(&self) -> u32 {
        self.partitions.len() as u32
    }

    /// Parses a partition id of this hub.
    pub(crate) fn partition(&self, id: &str) -> Result<u32, BrokerError> {
        parse_partition_id(id, self.partition_count()).map_err(|source| {
            BrokerError::InvalidPartition {
                hub: self.name(),
                source,
            }
        })
    }

    /// Which partition a send goes to.
    pub(crate) fn route(&self, target: &SendTarget) -> Result<u32, BrokerError> {
        match target {
            SendTarget::Partition(id) => self.partition(id),
            SendTarget::PartitionKey(key) => Ok(partition_for_key(key, self.partition_count())),
            SendTarget::RoundRobin => {
                Ok(self.round_robin.fetch_add(1, Ordering::Relaxed) % self.partition_count())
            }
        }
    }

    /// Applies the epoch rules to a new receiver and disconnects whom it displaces.
    pub(crate) fn register_receiver(
        &self,
        group: &str,
        partition: u32,
        id: ReceiverId,
        epoch: Option<i64>,
        name: Option<String>,
    ) -> Result<Arc<ReceiverControl>, BrokerError> {
        let group_key = name_key(group);
        let mut table = self.receivers.lock().expect("receiver table");
        let registry = table.registries.entry((group_key, partition)).or_default();
        let displaced = registry
            .open(id, epoch, name)
            .map_err(|refusal| self.refusal_error(group, partition, refusal))?;
        for displaced_id in displaced.receivers {
            if let Some(control) = table.controls.remove(&displaced_id) {
                let new_epoch = epoch.expect("only an epoch receiver displaces others");
                control.disconnect(DisconnectReason::Stolen { new_epoch });
            }
        }
        let control = Arc::new(ReceiverControl::default());
        table.controls.insert(id, control.clone());
        Ok(control)
    }

    fn refusal_error(&self, group: &str, partition: u32, refusal: OpenRefusal) -> BrokerError {
        let (hub, group) = (self.name(), group.to_owned());
        match refusal {
            OpenRefusal::EpochTooLow { current, requested } => BrokerError::EpochTooLow {
                hub,
                group,
                partition,
                current,
                requested,
            },
            OpenRefusal::EpochReceiverActive { current } => BrokerError::EpochReceiverActive {
                hub,
                group,
                partition,
                current,
            },
            OpenRefusal::TooManyReceivers { open } => BrokerError::TooManyReceivers {
                hub,
                group,
                partition,
                max: NON_EPOCH_RECEIVERS_MAX,
                names: open
                    .iter()
                    .map(|n| n.as_deref().unwrap_or("nil"))
                    .collect::<Vec<_>>()
                    .join(", "),
            },
        }
    }

    /// Forgets a receiver that closed.
    pub(crate) fn close_receiver(&self, group: &str, partition: u32, id: ReceiverId) {
        let mut table = self.receivers.lock().expect("receiver table");
        table.controls.remove(&id);
        let key = (name_key(group), partition);
        if let Some(registry) = table.registries.get_mut(&key) {
            registry.close(id);
            if registry.is_empty() {
                table.registries.remove(&key);
            }
        }
    }

    /// Disconnects every receiver of one consumer group, or of all groups when `group` is
    /// `None`.
    pub(crate) fn disconnect(&self, group: Option<&str>, reason: &DisconnectReason) {
        let mut table = self.receivers.lock().expect("receiver table");
        let group_key = group.map(name_key);
        let keys: Vec<_> = table
            .registries
            .keys()
            .filter(|(g, _)| group_key.as_ref().is_none_or(|k| k == g))
            .cloned()
            .collect();
        for key in keys {
            let ids = table.registries.remove(&key).map(|mut r| r.take_all());
            for id in ids.into_iter().flatten() {
                if let Some(control) = table.controls.remove(&id) {
                    control.disconnect(reason.clone());
                }
            }
        }
    }

    /// The receivers open on `partition`: (consumer group key, epoch, name), by group.
    pub(crate) fn receivers_of(
        &self,
        partition: u32,
    ) -> Vec<(String, Option<i64>, Option<String>)> {
        let table = self.receivers.lock().expect("receiver table");
        let mut out: Vec<_> = table
            .registries
            .iter()
            .filter(|((_, p), _)| *p == partition)
            .flat_map(|((group, _), registry)| {
                registry
                    .receivers()
                    .map(|(epoch, name)| (group.clone(), epoch, name.map(str::to_owned)))
            })
            .collect();
        out.sort();
        out
    }

    /// Counts events handed to a reader of `partition`.
    pub(crate) fn count_delivered(&self, partition: u32, events: usize) {
        self.partitions[partition as usize]
            .delivered
            .fetch_add(events as u64, Ordering::Relaxed);
    }

    /// How many receivers are open, over all groups and partitions.
    pub(crate) fn open_receivers(&self) -> usize {
        self.receivers
            .lock()
            .expect("receiver table")
            .controls
            .len()
    }
}
