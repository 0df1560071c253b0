//! What is happening in a hub's partitions right now, for monitoring (the dashboard of the
//! HTTP front door): each partition's properties, retained bytes, the events handed to readers
//! since the broker opened, and the receivers open on it with their epochs.
//!
//! Everything here is read from in-memory state (the log's committed position, its segment
//! lengths, counters, the receiver table) — no file is read — so it is cheap enough to sample
//! every second for every partition.

use std::sync::atomic::Ordering;

use tributary_log::PartitionProperties;

use crate::{Broker, BrokerError};

/// One receiver open on a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenReceiverInfo {
    /// Its consumer group, as created.
    pub consumer_group: String,
    /// Its epoch (owner level), if it is an epoch receiver.
    pub epoch: Option<i64>,
    /// The name it gave, if any.
    pub name: Option<String>,
}

/// One partition's activity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionActivity {
    /// The partition.
    pub partition: u32,
    /// Its Event Hubs properties.
    pub properties: PartitionProperties,
    /// Log bytes retained on disk.
    pub retained_bytes: u64,
    /// Events handed to readers since the broker opened (a counter: rates are its differences).
    pub events_delivered: u64,
    /// The receivers open on it, by consumer group.
    pub receivers: Vec<OpenReceiverInfo>,
}

impl Broker {
    /// The activity of every partition of `hub`, in partition order.
    pub fn partition_activity(&self, hub: &str) -> Result<Vec<PartitionActivity>, BrokerError> {
        let hub = self.hub(hub)?;
        let group_names: Vec<(String, String)> = hub
            .definition
            .read()
            .expect("hub definition")
            .consumer_groups
            .iter()
            .map(|g| (tributary_event::names::name_key(&g.name), g.name.clone()))
            .collect();
        let name_of = |key: String| {
            group_names
                .iter()
                .find(|(k, _)| *k == key)
                .map_or(key.clone(), |(_, name)| name.clone())
        };
        Ok(hub
            .partitions
            .iter()
            .enumerate()
            .map(|(p, partition)| {
                let p = u32::try_from(p).expect("at most 1024 partitions");
                PartitionActivity {
                    partition: p,
                    properties: partition.log.properties(),
                    retained_bytes: partition.log.retained_bytes(),
                    events_delivered: partition.delivered.load(Ordering::Relaxed),
                    receivers: hub
                        .receivers_of(p)
                        .into_iter()
                        .map(|(group, epoch, name)| OpenReceiverInfo {
                            consumer_group: name_of(group),
                            epoch,
                            name,
                        })
                        .collect(),
                }
            })
            .collect())
    }
}
