//! One sample of everything the dashboard shows, and the rates between two samples.
//!
//! [`Sampler::sample`] reads the broker (hubs, partition activity, open receivers, the log's
//! sync times) and the group coordinator (server-side groups) once and turns them into a
//! [`Snapshot`]: plain rows, ready to render. Rates (events/s in and out) are differences of
//! counters between this sample and the previous one, divided by the time between them, so
//! they stay right whatever the tick interval. The lag in time of a group's partition is how
//! long its oldest unprocessed event has waited; that event's enqueued time is read once from
//! the log and cached (events never change), so a steady group costs no reads.

use std::collections::HashMap;
use std::time::Instant;

use tributary_broker::{
    Broker, CaptureStatus, CompactionState, HubCleanup, PartitionActivity, SyncTimes,
};
use tributary_groups::{GroupCoordinator, GroupSummary};

/// One partition's row.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PartitionRow {
    pub partition: u32,
    pub begin_sequence: i64,
    pub last_sequence: i64,
    pub last_enqueued_ms: Option<i64>,
    pub retained_bytes: u64,
    pub in_per_s: f64,
    pub out_per_s: f64,
    /// `group: epoch` (or `group: non-epoch ×n`) per open receiver.
    pub receivers: Vec<ReceiverRow>,
}

/// A receiver open on a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReceiverRow {
    pub consumer_group: String,
    pub epoch: Option<i64>,
    pub name: Option<String>,
}

/// One line of a group's table: partition → owner → checkpoint → last enqueued → lag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupRow {
    pub partition: u32,
    pub owner: Option<String>,
    /// The sequence number of the last event processed (checkpointed or committed).
    pub checkpoint: Option<i64>,
    pub last_enqueued: i64,
    pub lag_events: i64,
    /// When the oldest unprocessed event was enqueued (ms since the epoch): the lag in time is
    /// how long ago that was. `None` when nothing waits, or the event is no longer retained.
    /// A time, not an age, so a stuck group's row stays equal from one sample to the next.
    pub waiting_since_ms: Option<i64>,
}

/// A consumer group's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupTable {
    pub name: String,
    /// "processor" (checkpoints kept by the hub) or "server-side" (OCI groups).
    pub kind: &'static str,
    pub rows: Vec<GroupRow>,
}

/// One hub.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct HubRow {
    pub name: String,
    pub retention_ms: Option<i64>,
    pub cleanup: HubCleanup,
    /// Compaction's progress per partition, for a hub that compacts (else empty).
    pub compaction: Vec<CompactionState>,
    /// Its capture's destination and each partition's capture status and lag in events, for a
    /// captured hub (else `None`).
    pub capture: Option<CaptureRows>,
    pub consumer_groups: Vec<String>,
    pub partitions: Vec<PartitionRow>,
    pub groups: Vec<GroupTable>,
}

/// A captured hub's capture: where to, and per partition its status and lag in events.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CaptureRows {
    pub destination: String,
    pub partitions: Vec<(CaptureStatus, i64)>,
}

/// The log's sync latency.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct SyncLatency {
    /// Syncs since the previous sample, and their mean, p50 and p99 (ms).
    pub recent_count: u64,
    pub recent_mean_ms: Option<f64>,
    pub recent_p99_ms: Option<f64>,
    /// Since the broker opened.
    pub total_count: u64,
    pub total_mean_ms: Option<f64>,
    pub total_p50_ms: Option<f64>,
    pub total_p99_ms: Option<f64>,
}

/// Everything, at one moment.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Snapshot {
    pub time_ms: i64,
    pub hubs: Vec<HubRow>,
    pub sync: SyncLatency,
}

impl Snapshot {
    /// Events/s in and out, and the summed lag in events of every group, over all hubs.
    pub(crate) fn totals(&self) -> (f64, f64, i64) {
        let mut totals = (0.0, 0.0, 0);
        for hub in &self.hubs {
            for p in &hub.partitions {
                totals.0 += p.in_per_s;
                totals.1 += p.out_per_s;
            }
            for g in &hub.groups {
                totals.2 += g.rows.iter().map(|r| r.lag_events).sum::<i64>();
            }
        }
        totals
    }
}

/// A processor (Event Processor Host) group's ownership and checkpoint of one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProcessorOwnership {
    pub partition: u32,
    pub owner_id: String,
    pub checkpoint_sequence_number: Option<i64>,
}

/// The processor groups of `hub` whose ownership and checkpoints the hub keeps, each with its
/// partitions' lines.
///
/// From the hub-hosted checkpoint store ([`Broker::processor_group_states`]): the groups with
/// at least one record (a group no processor has claimed in is not a processor group); a hub
/// whose records cannot be read shows none rather than failing the whole page.
pub(crate) fn processor_group_rows(
    broker: &Broker,
    hub: &str,
) -> Vec<(String, Vec<ProcessorOwnership>)> {
    let Ok(groups) = broker.processor_group_states(hub) else {
        return Vec::new();
    };
    groups
        .into_iter()
        .map(|(group, states)| {
            let lines = states
                .into_iter()
                .filter_map(|state| {
                    Some(ProcessorOwnership {
                        partition: state.partition_id.parse().ok()?,
                        owner_id: state.owner_id,
                        checkpoint_sequence_number: state.checkpoint_sequence_number,
                    })
                })
                .collect();
            (group, lines)
        })
        .filter(|(_, lines): &(String, Vec<ProcessorOwnership>)| !lines.is_empty())
        .collect()
}

/// Per (hub, partition): the last sequence number and the events delivered, at a sample.
type Counters = HashMap<(String, u32), (i64, u64)>;
/// The enqueued time of (hub, partition, sequence number), when still retained.
type EnqueuedTimes = HashMap<(String, u32, i64), Option<i64>>;

/// Keeps what rates and lag times need from one sample to the next.
#[derive(Debug, Default)]
pub(crate) struct Sampler {
    previous: Option<(Instant, Counters)>,
    previous_sync: Option<SyncTimes>,
    /// Enqueued time of (hub, partition, sequence number), for lag in time.
    enqueued: EnqueuedTimes,
}

fn ms(d: Option<std::time::Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64() * 1000.0)
}

impl Sampler {
    /// Reads everything once.
    pub(crate) fn sample(&mut self, broker: &Broker, coordinator: &GroupCoordinator) -> Snapshot {
        let now = Instant::now();
        let time_ms = broker.clock().now_ms();
        let elapsed = self
            .previous
            .as_ref()
            .map(|(at, _)| now.duration_since(*at).as_secs_f64())
            .filter(|s| *s > 0.0);
        let mut counters = HashMap::new();
        let mut oci: HashMap<String, Vec<GroupSummary>> = HashMap::new();
        for g in coordinator.list(None) {
            oci.entry(g.stream.to_ascii_lowercase())
                .or_default()
                .push(g);
        }
        let mut used = HashMap::new();
        let mut hubs = Vec::new();
        for definition in broker.list_hubs() {
            let Ok(activity) = broker.partition_activity(&definition.name) else {
                continue; // deleted since it was listed
            };
            let partitions =
                self.partition_rows(&definition.name, &activity, elapsed, &mut counters);
            let oci_groups = oci
                .remove(&definition.name.to_ascii_lowercase())
                .unwrap_or_default();
            let groups =
                self.group_tables(broker, &definition.name, &activity, &oci_groups, &mut used);
            hubs.push(HubRow {
                name: definition.name.clone(),
                retention_ms: definition.retention_age_ms,
                cleanup: definition.cleanup,
                compaction: if definition.cleanup.policy.compacts() {
                    broker
                        .compaction_states(&definition.name)
                        .unwrap_or_default()
                } else {
                    Vec::new()
                },
                capture: definition.capture.as_ref().map(|c| CaptureRows {
                    destination: c.destination.clone(),
                    partitions: broker
                        .capture_statuses(&definition.name, definition.partition_count)
                        .into_iter()
                        .zip(&partitions)
                        .map(|(status, p)| {
                            let lag = status.lag_events(p.last_sequence + 1);
                            (status, lag)
                        })
                        .collect(),
                }),
                consumer_groups: definition
                    .consumer_groups
                    .iter()
                    .map(|g| g.name.clone())
                    .collect(),
                partitions,
                groups,
            });
        }
        self.previous = Some((now, counters));
        self.enqueued = used;
        let sync = self.sync_latency(broker.sync_times());
        Snapshot {
            time_ms,
            hubs,
            sync,
        }
    }

    /// The processor groups' and server-side groups' tables of one hub.
    fn group_tables(
        &self,
        broker: &Broker,
        hub: &str,
        activity: &[PartitionActivity],
        oci_groups: &[GroupSummary],
        used: &mut EnqueuedTimes,
    ) -> Vec<GroupTable> {
        let mut groups = Vec::new();
        for (name, owned) in processor_group_rows(broker, hub) {
            let rows = owned
                .iter()
                .filter_map(|o| {
                    let a = activity.get(o.partition as usize)?;
                    let next = o.checkpoint_sequence_number.map_or(0, |c| c + 1);
                    let line = (o.partition, Some(o.owner_id.clone()), next);
                    Some(self.group_row(broker, hub, line, a, used))
                })
                .collect();
            groups.push(GroupTable {
                name,
                kind: "processor",
                rows,
            });
        }
        for g in oci_groups {
            groups.push(GroupTable {
                name: g.group.clone(),
                kind: "server-side",
                rows: self.oci_rows(broker, hub, g, activity, used),
            });
        }
        groups
    }

    fn partition_rows(
        &self,
        hub: &str,
        activity: &[PartitionActivity],
        elapsed: Option<f64>,
        counters: &mut Counters,
    ) -> Vec<PartitionRow> {
        activity
            .iter()
            .map(|a| {
                let key = (hub.to_owned(), a.partition);
                let now = (
                    a.properties.last_enqueued_sequence_number,
                    a.events_delivered,
                );
                let before = self.previous.as_ref().and_then(|(_, c)| c.get(&key));
                let (in_per_s, out_per_s) = match (before, elapsed) {
                    (Some(b), Some(s)) => (
                        (now.0 - b.0).max(0) as f64 / s,
                        now.1.saturating_sub(b.1) as f64 / s,
                    ),
                    _ => (0.0, 0.0),
                };
                counters.insert(key, now);
                PartitionRow {
                    partition: a.partition,
                    begin_sequence: a.properties.begin_sequence_number,
                    last_sequence: a.properties.last_enqueued_sequence_number,
                    last_enqueued_ms: a.properties.last_enqueued_time_ms,
                    retained_bytes: a.retained_bytes,
                    in_per_s,
                    out_per_s,
                    receivers: a
                        .receivers
                        .iter()
                        .map(|r| ReceiverRow {
                            consumer_group: r.consumer_group.clone(),
                            epoch: r.epoch,
                            name: r.name.clone(),
                        })
                        .collect(),
                }
            })
            .collect()
    }

    fn oci_rows(
        &self,
        broker: &Broker,
        hub: &str,
        group: &GroupSummary,
        activity: &[PartitionActivity],
        used: &mut EnqueuedTimes,
    ) -> Vec<GroupRow> {
        activity
            .iter()
            .map(|a| {
                let p = a.partition;
                let next = group.committed.get(p as usize).copied().unwrap_or(0);
                let owner = group
                    .instances
                    .iter()
                    .find(|(_, ps)| ps.contains(&p))
                    .map(|(name, _)| name.clone());
                self.group_row(broker, hub, (p, owner, next), a, used)
            })
            .collect()
    }

    /// A group's line for one partition whose next event to process is `next`.
    fn group_row(
        &self,
        broker: &Broker,
        hub: &str,
        (partition, owner, next): (u32, Option<String>, i64),
        activity: &PartitionActivity,
        used: &mut EnqueuedTimes,
    ) -> GroupRow {
        let last = activity.properties.last_enqueued_sequence_number;
        // Events removed by retention are not waiting for anyone.
        let next = next.max(activity.properties.begin_sequence_number);
        let lag_events = (last + 1 - next).max(0);
        let waiting_since_ms = if lag_events == 0 {
            None
        } else {
            let key = (hub.to_owned(), partition, next);
            let enqueued = match self.enqueued.get(&key) {
                Some(cached) => *cached,
                None => broker
                    .read(hub, &partition.to_string(), next, 1, 1 << 20)
                    .ok()
                    .and_then(|events| events.first().map(|e| e.enqueued_time_ms)),
            };
            used.insert(key, enqueued);
            enqueued
        };
        GroupRow {
            partition,
            owner,
            checkpoint: (next > 0).then(|| next - 1),
            last_enqueued: last,
            lag_events,
            waiting_since_ms,
        }
    }

    fn sync_latency(&mut self, now: SyncTimes) -> SyncLatency {
        let recent = self.previous_sync.as_ref().map(|before| now.since(before));
        let latency = SyncLatency {
            recent_count: recent.as_ref().map_or(0, |r| r.syncs.count),
            recent_mean_ms: recent.as_ref().and_then(|r| ms(r.syncs.mean())),
            recent_p99_ms: recent.as_ref().and_then(|r| ms(r.syncs.quantile(0.99))),
            total_count: now.syncs.count,
            total_mean_ms: ms(now.syncs.mean()),
            total_p50_ms: ms(now.syncs.quantile(0.5)),
            total_p99_ms: ms(now.syncs.quantile(0.99)),
        };
        self.previous_sync = Some(now);
        latency
    }
}
