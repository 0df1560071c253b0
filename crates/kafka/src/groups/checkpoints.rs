//! A Kafka group's committed offsets are the hub's checkpoints: Kafka group `G` reading topic
//! `T` is consumer group `G` of event hub `T`, and its committed offset for a partition is that
//! consumer group's checkpoint there (the broker's ownership and checkpoint registry, the one
//! event processors, `tributary group`, the admin API and the dashboard use).
//!
//! # The rule
//! - A committed offset `o` (the next record to read) is the checkpoint "sequence number
//!   `o − 1` processed", as a processor writes it; reading back gives `sequence + 1`, and no
//!   checkpoint gives −1. So a group reset by `tributary group reset`, or checkpointed by an
//!   event processor, is where a Kafka consumer of that group resumes, and back.
//! - The consumer group is created in the hub by the first commit (or assignment) that needs
//!   it, within the hub's consumer-group limit (a hub at its limit refuses the commit with
//!   POLICY_VIOLATION); it then lives as any consumer group does.
//! - A checkpoint is fenced by ownership (the registry's rule): a member commits as the owner
//!   of the partition, taking the ownership record over when it is not (a Kafka assignment is
//!   the Kafka group's to make). A commit from outside the group (generation −1) is written as
//!   [`SIMPLE_COMMIT_OWNER`], which lets go of the partition again at once.
//!
//! # Guarantees
//! A commit is answered only once the checkpoint is on disk (the registry writes its file
//! durably before returning); a failed write is an error code for that partition, never an
//! acknowledged commit.

use kafka_protocol::ResponseError;
use tributary_broker::{Broker, BrokerError, CheckpointRecord, OwnershipClaim};
use tributary_event::names::name_key;

use crate::error;

/// The owner id a commit from outside the group writes under, for the moment of the write.
pub(crate) const SIMPLE_COMMIT_OWNER: &str = "kafka-offset-commit";

/// Makes sure consumer group `group` exists in `hub`.
pub(crate) async fn ensure_group(broker: &Broker, hub: &str, group: &str) -> Result<(), i16> {
    let groups = broker.list_consumer_groups(hub).map_err(|e| code(&e))?;
    let key = name_key(group);
    if groups.iter().any(|g| name_key(&g.name) == key) {
        return Ok(());
    }
    match broker.create_consumer_group(hub, group).await {
        Ok(_) | Err(BrokerError::ConsumerGroupExists { .. }) => Ok(()),
        Err(e) => Err(code(&e)),
    }
}

/// The Kafka code of a broker error met while committing.
fn code(error: &BrokerError) -> i16 {
    match error {
        BrokerError::ConsumerGroupLimit { .. } => ResponseError::PolicyViolation.code(),
        BrokerError::InvalidName(_) => ResponseError::InvalidGroupId.code(),
        other => error::code(other),
    }
}

/// Commits `offset` (the next record to read) for `partition` of `hub` in `group`, as `owner`
/// (a member id) or from outside the group (`None`).
pub(crate) async fn commit(
    broker: &Broker,
    hub: &str,
    group: &str,
    partition: i32,
    offset: i64,
    owner: Option<&str>,
) -> Result<(), i16> {
    if offset < 0 {
        return Err(ResponseError::InvalidCommitOffsetSize.code());
    }
    let partition_id = u32::try_from(partition)
        .map_err(|_| ResponseError::UnknownTopicOrPartition.code())?
        .to_string();
    broker
        .partition_properties(hub, &partition_id)
        .map_err(|e| code(&e))?;
    ensure_group(broker, hub, group).await?;
    let checkpoint = CheckpointRecord {
        partition_id: partition_id.clone(),
        offset: None,
        sequence_number: Some(offset - 1),
    };
    let fence = owner.unwrap_or(SIMPLE_COMMIT_OWNER);
    if owner.is_some() {
        match broker
            .update_checkpoint(hub, group, checkpoint.clone(), fence)
            .await
        {
            Ok(()) => return Ok(()),
            Err(BrokerError::OwnershipLost { .. }) => {}
            Err(e) => return Err(code(&e)),
        }
    }
    take_over(broker, hub, group, &partition_id, fence).await?;
    let written = broker
        .update_checkpoint(hub, group, checkpoint, fence)
        .await
        .map_err(|e| code(&e));
    if owner.is_none() {
        // Nobody holds the partition after a commit from outside the group.
        let _ = take_over(broker, hub, group, &partition_id, "").await;
    }
    written
}

/// Claims `partition_id` for `owner` from whoever holds it now.
async fn take_over(
    broker: &Broker,
    hub: &str,
    group: &str,
    partition_id: &str,
    owner: &str,
) -> Result<(), i16> {
    // Two tries: a processor sharing the group's name may claim in between.
    for _ in 0..2 {
        let records = broker
            .list_ownership(hub, group)
            .await
            .map_err(|e| code(&e))?;
        let etag = records
            .iter()
            .find(|r| r.partition_id == partition_id)
            .map(|r| r.etag.clone());
        let claim = OwnershipClaim {
            partition_id: partition_id.to_owned(),
            owner_id: owner.to_owned(),
            etag,
        };
        let won = broker
            .claim_ownership(hub, group, vec![claim])
            .await
            .map_err(|e| code(&e))?;
        if !won.is_empty() {
            return Ok(());
        }
    }
    Err(ResponseError::CoordinatorLoadInProgress.code())
}

/// The committed offsets of `group` in `hub` for `partitions` (every checkpointed partition
/// when `None`): −1 where there is none, or the group or hub does not exist.
pub(crate) async fn fetch(
    broker: &Broker,
    hub: &str,
    group: &str,
    partitions: Option<&[i32]>,
) -> Result<Vec<(i32, i64)>, i16> {
    let checkpoints = match broker.list_checkpoints(hub, group).await {
        Ok(checkpoints) => checkpoints,
        Err(BrokerError::ConsumerGroupNotFound { .. } | BrokerError::HubNotFound { .. }) => {
            Vec::new()
        }
        Err(BrokerError::InvalidName(_)) => Vec::new(),
        Err(e) => return Err(code(&e)),
    };
    let committed = |partition: i32| {
        checkpoints
            .iter()
            .find(|c| c.partition_id == partition.to_string())
            .and_then(|c| c.sequence_number)
            .map_or(-1, |sequence| sequence + 1)
    };
    Ok(match partitions {
        Some(asked) => asked.iter().map(|p| (*p, committed(*p))).collect(),
        None => checkpoints
            .iter()
            .filter_map(|c| {
                let partition = c.partition_id.parse::<i32>().ok()?;
                Some((partition, c.sequence_number? + 1))
            })
            .collect(),
    })
}

/// The hubs (by name as created) in which consumer group `group` has a checkpoint.
pub(crate) async fn hubs_with_offsets(broker: &Broker, group: &str) -> Vec<String> {
    let mut found = Vec::new();
    for hub in broker.list_hubs() {
        if let Ok(checkpoints) = broker.list_checkpoints(&hub.name, group).await
            && checkpoints.iter().any(|c| c.sequence_number.is_some())
        {
            found.push(hub.name);
        }
    }
    found
}
