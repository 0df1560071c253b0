//! A Kafka group's assignment shown where the hub shows who reads a partition: the ownership
//! records of the hub's consumer group (the dashboard's owner column, `tributary ownership`),
//! and processor host records that keep `tributary group reset` refused while members are
//! joined (the registry refuses a reset while a partition's owner renewed its host record in
//! the last minute).
//!
//! # What it does
//! - When a member gets its assignment (a `ConsumerProtocolAssignment`), it claims each
//!   assigned partition in each topic's hub (creating the consumer group there if needed) and
//!   lets go of the partitions it held before and no longer holds; it renews its host record in
//!   those hubs.
//! - While it heartbeats or commits, it renews those host records, at most every
//!   [`HOST_RENEW_INTERVAL`].
//! - When it leaves or is removed, it lets go of its partitions and its host records go.
//!
//! # Guarantees
//! This is visibility only: the group protocol never waits for it and never fails because of
//! it (a failed write is logged at debug level). The work runs on one task, in the order the
//! groups asked for it, over a bounded queue (an effect that finds it full is dropped and
//! logged; ownership then catches up with the member's next assignment).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::ConsumerProtocolAssignment;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tributary_broker::{Broker, OwnershipClaim};
use tributary_event::names::name_key;

use super::checkpoints;
use super::state::Effect;

/// How often a member's host records are renewed while it heartbeats: well inside the
/// registry's one-minute window, and at most one write per member every few heartbeats.
pub(crate) const HOST_RENEW_INTERVAL: Duration = Duration::from_secs(10);

/// How many effects may wait for the worker.
const QUEUE: usize = 4096;

/// One effect of one group.
#[derive(Debug)]
pub(crate) struct GroupEffect {
    /// The group, as its members name it.
    pub(crate) group: String,
    /// What happened.
    pub(crate) effect: Effect,
}

/// What one member holds: partitions by hub, and when its host records were last renewed.
#[derive(Debug)]
struct Held {
    partitions: BTreeMap<String, Vec<i32>>,
    renewed: Instant,
}

/// Starts the worker; effects go to the returned sender. It ends when every sender is dropped
/// or at `shutdown` (effects still queued then are dropped: the records they would write
/// expire on their own), and the returned handle says when.
pub(crate) fn start(
    broker: Broker,
    mut shutdown: watch::Receiver<bool>,
) -> (mpsc::Sender<GroupEffect>, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(QUEUE);
    let worker = tokio::spawn(async move {
        tokio::select! {
            () = run(broker, rx) => {}
            () = crate::connection::stopping(&mut shutdown) => {}
        }
    });
    (tx, worker)
}

async fn run(broker: Broker, mut rx: mpsc::Receiver<GroupEffect>) {
    let mut held: HashMap<(String, String), Held> = HashMap::new();
    while let Some(GroupEffect { group, effect }) = rx.recv().await {
        match effect {
            Effect::Assigned { member, assignment } => {
                let key = (name_key(&group), member.clone());
                let before = held.remove(&key).map(|h| h.partitions).unwrap_or_default();
                let after = assigned_partitions(assignment);
                release(&broker, &group, &member, &before, Some(&after)).await;
                claim(&broker, &group, &member, &after).await;
                renew(&broker, &group, &member, &after).await;
                let renewed = Instant::now();
                held.insert(
                    key,
                    Held {
                        partitions: after,
                        renewed,
                    },
                );
            }
            Effect::Released { member } => {
                if let Some(gone) = held.remove(&(name_key(&group), member.clone())) {
                    release(&broker, &group, &member, &gone.partitions, None).await;
                    for hub in gone.partitions.keys() {
                        let _ = broker.remove_processor_host(hub, &group, &member).await;
                    }
                }
            }
            Effect::Alive { member } => {
                if let Some(h) = held.get_mut(&(name_key(&group), member.clone()))
                    && h.renewed.elapsed() >= HOST_RENEW_INTERVAL
                {
                    h.renewed = Instant::now();
                    renew(&broker, &group, &member, &h.partitions).await;
                }
            }
        }
    }
}

/// The partitions of a consumer assignment by topic; nothing if it is not one.
fn assigned_partitions(assignment: Bytes) -> BTreeMap<String, Vec<i32>> {
    let mut partitions: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    let Some(decoded) =
        super::decode_consumer_protocol::<ConsumerProtocolAssignment>(assignment, 3)
    else {
        return partitions;
    };
    for topic in decoded.assigned_partitions {
        partitions
            .entry(topic.topic.0.to_string())
            .or_default()
            .extend(topic.partitions);
    }
    partitions
}

/// Claims every partition of `partitions` for `member`.
async fn claim(
    broker: &Broker,
    group: &str,
    member: &str,
    partitions: &BTreeMap<String, Vec<i32>>,
) {
    for (hub, indexes) in partitions {
        if checkpoints::ensure_group(broker, hub, group).await.is_err() {
            continue;
        }
        let Ok(records) = broker.list_ownership(hub, group).await else {
            continue;
        };
        let claims = indexes
            .iter()
            .map(|p| {
                let partition_id = p.to_string();
                let current = records.iter().find(|r| r.partition_id == partition_id);
                OwnershipClaim {
                    etag: current.map(|r| r.etag.clone()),
                    partition_id,
                    owner_id: member.to_owned(),
                }
            })
            .filter(|c| {
                !records
                    .iter()
                    .any(|r| r.partition_id == c.partition_id && r.owner_id == member)
            })
            .collect::<Vec<_>>();
        if claims.is_empty() {
            continue;
        }
        if let Err(e) = broker.claim_ownership(hub, group, claims).await {
            tracing::debug!(%hub, %group, error = %e, "a Kafka assignment was not recorded as ownership");
        }
    }
}

/// Lets go of the partitions of `before` that `member` still owns and `after` does not hold.
async fn release(
    broker: &Broker,
    group: &str,
    member: &str,
    before: &BTreeMap<String, Vec<i32>>,
    after: Option<&BTreeMap<String, Vec<i32>>>,
) {
    for (hub, indexes) in before {
        let kept = after.and_then(|a| a.get(hub));
        let Ok(records) = broker.list_ownership(hub, group).await else {
            continue;
        };
        let claims: Vec<OwnershipClaim> = records
            .iter()
            .filter(|r| r.owner_id == member)
            .filter(|r| indexes.iter().any(|p| p.to_string() == r.partition_id))
            .filter(|r| !kept.is_some_and(|k| k.iter().any(|p| p.to_string() == r.partition_id)))
            .map(|r| OwnershipClaim {
                partition_id: r.partition_id.clone(),
                owner_id: String::new(),
                etag: Some(r.etag.clone()),
            })
            .collect();
        if !claims.is_empty() {
            let _ = broker.claim_ownership(hub, group, claims).await;
        }
    }
}

/// Renews `member`'s host record in every hub it holds partitions of.
async fn renew(
    broker: &Broker,
    group: &str,
    member: &str,
    partitions: &BTreeMap<String, Vec<i32>>,
) {
    for hub in partitions.keys() {
        let _ = broker.renew_processor_host(hub, group, member).await;
    }
}
