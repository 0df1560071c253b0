//! OffsetCommit and OffsetFetch: a group's committed offsets, kept as the hub's checkpoints
//! ([`super::checkpoints`]).
//!
//! # OffsetCommit
//! Per partition, in this order: TOPIC_AUTHORIZATION_FAILED without Listen on the topic;
//! UNKNOWN_TOPIC_OR_PARTITION for a topic or partition the hub does not have;
//! OFFSET_METADATA_TOO_LARGE past [`OFFSET_METADATA_BYTES_MAX`]; then the group's verdict on
//! the committer (Kafka's): a member of the current generation commits while the group is
//! Stable or rebalancing (REBALANCE_IN_PROGRESS while it waits for the assignment), a
//! commit with generation −1 and no member id commits for a group without members, an
//! unknown member gets UNKNOWN_MEMBER_ID and a stale generation ILLEGAL_GENERATION. Nothing is
//! written for a partition that gets an error.
//!
//! # OffsetFetch
//! The committed offset of each partition asked for, −1 where there is none (an unknown
//! group, topic or partition included); for every partition of every readable hub with a
//! checkpoint when no topics are named. Leader epochs are −1 and metadata empty.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::{
    GroupId, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tributary_amqp::auth;

use super::api::group_name;
use super::checkpoints;
use super::state::Beat;
use crate::connection::{Context, Session};
use crate::limits::OFFSET_METADATA_BYTES_MAX;

/// One topic's answered partitions: index, committed offset, error code.
type TopicOffsets = (TopicName, Vec<(i32, i64, i16)>);

/// The OffsetCommit answer.
pub(crate) async fn offset_commit(
    request: OffsetCommitRequest,
    session: &Session,
    ctx: &Context,
) -> OffsetCommitResponse {
    let verdict = committer(&request, ctx);
    let name = request.group_id.0.as_str();
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in &request.topics {
        let hub = topic.name.0.as_str();
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for p in &topic.partitions {
            let error = commit_one(hub, p, name, &verdict, session, ctx).await;
            partitions.push(
                OffsetCommitResponsePartition::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(error),
            );
        }
        topics.push(
            OffsetCommitResponseTopic::default()
                .with_name(topic.name.clone())
                .with_partitions(partitions),
        );
    }
    OffsetCommitResponse::default().with_topics(topics)
}

/// Who commits: `Ok(Some(member))`, `Ok(None)` from outside the group, or the group's error.
fn committer(request: &OffsetCommitRequest, ctx: &Context) -> Result<Option<String>, i16> {
    let name = group_name(&request.group_id)?;
    let beat = Beat {
        member_id: request.member_id.to_string(),
        instance_id: request.group_instance_id.as_ref().map(|i| i.to_string()),
        generation: request.generation_id_or_member_epoch,
    };
    match ctx.groups.with_group(name, false, &[], |group, now| {
        group.check_commit(&beat, now)
    }) {
        Some(verdict) => verdict.map_err(|e| e.code()),
        // No members: a commit from outside the group, or a member of a generation gone.
        None if beat.generation < 0 => Ok(None),
        None => Err(ResponseError::IllegalGeneration.code()),
    }
}

async fn commit_one(
    hub: &str,
    partition: &kafka_protocol::messages::offset_commit_request::OffsetCommitRequestPartition,
    group: &str,
    verdict: &Result<Option<String>, i16>,
    session: &Session,
    ctx: &Context,
) -> i16 {
    if let Err(code) = session.authorize(hub, auth::LISTEN) {
        return code;
    }
    let index = partition.partition_index;
    let exists = u32::try_from(index)
        .ok()
        .is_some_and(|i| ctx.broker.partition_properties(hub, &i.to_string()).is_ok());
    if !exists {
        return ResponseError::UnknownTopicOrPartition.code();
    }
    if partition
        .committed_metadata
        .as_ref()
        .is_some_and(|m| m.len() > OFFSET_METADATA_BYTES_MAX)
    {
        return ResponseError::OffsetMetadataTooLarge.code();
    }
    let owner = match verdict {
        Ok(owner) => owner.as_deref(),
        Err(code) => return *code,
    };
    let offset = partition.committed_offset;
    match checkpoints::commit(&ctx.broker, hub, group, index, offset, owner).await {
        Ok(()) => 0,
        Err(code) => code,
    }
}

/// The committed offsets of one group for the topics asked (all when `None`): per topic, its
/// partitions with offset and error code; or the group's error.
async fn fetch_group(
    id: &GroupId,
    topics: Option<Vec<(TopicName, Vec<i32>)>>,
    session: &Session,
    ctx: &Context,
) -> Result<Vec<TopicOffsets>, i16> {
    let name = group_name(id)?;
    let topics = match topics {
        Some(topics) => topics,
        None => checkpoints::hubs_with_offsets(&ctx.broker, name)
            .await
            .into_iter()
            .filter(|hub| session.authorize(hub, auth::LISTEN).is_ok())
            .map(|hub| (TopicName(StrBytes::from_string(hub)), Vec::new()))
            .collect(),
    };
    let mut answered = Vec::with_capacity(topics.len());
    for (topic, partitions) in topics {
        let hub = topic.0.as_str();
        let asked = (!partitions.is_empty()).then_some(partitions.as_slice());
        let found = match session.authorize(hub, auth::LISTEN) {
            Err(code) => partitions.iter().map(|p| (*p, -1, code)).collect(),
            Ok(()) => match checkpoints::fetch(&ctx.broker, hub, name, asked).await {
                Ok(offsets) => offsets.into_iter().map(|(p, o)| (p, o, 0)).collect(),
                Err(code) => partitions.iter().map(|p| (*p, -1, code)).collect(),
            },
        };
        answered.push((topic, found));
    }
    Ok(answered)
}

/// The OffsetFetch answer (one group up to v7, several from v8).
pub(crate) async fn offset_fetch(
    request: OffsetFetchRequest,
    version: i16,
    session: &Session,
    ctx: &Context,
) -> OffsetFetchResponse {
    if version >= 8 {
        let mut groups = Vec::with_capacity(request.groups.len());
        for group in request.groups {
            let topics = group.topics.map(|topics| {
                topics
                    .into_iter()
                    .map(|t| (t.name, t.partition_indexes))
                    .collect()
            });
            let answered = fetch_group(&group.group_id, topics, session, ctx).await;
            groups.push(group_v8(group.group_id, answered));
        }
        return OffsetFetchResponse::default().with_groups(groups);
    }
    let topics = request.topics.map(|topics| {
        topics
            .into_iter()
            .map(|t| (t.name, t.partition_indexes))
            .collect()
    });
    let (error, topics) = match fetch_group(&request.group_id, topics, session, ctx).await {
        Ok(topics) => (0, topics),
        Err(code) => (code, Vec::new()),
    };
    let topics = topics
        .into_iter()
        .map(|(name, partitions)| {
            let partitions = partitions
                .into_iter()
                .map(|(index, offset, error)| {
                    let partition = OffsetFetchResponsePartition::default()
                        .with_partition_index(index)
                        .with_committed_offset(offset)
                        .with_metadata(Some(StrBytes::default()))
                        .with_error_code(error);
                    if version >= 5 {
                        partition.with_committed_leader_epoch(-1)
                    } else {
                        partition
                    }
                })
                .collect();
            OffsetFetchResponseTopic::default()
                .with_name(name)
                .with_partitions(partitions)
        })
        .collect();
    let response = OffsetFetchResponse::default().with_topics(topics);
    if version >= 2 {
        response.with_error_code(error)
    } else {
        response
    }
}

fn group_v8(id: GroupId, answered: Result<Vec<TopicOffsets>, i16>) -> OffsetFetchResponseGroup {
    let (error, topics) = match answered {
        Ok(topics) => (0, topics),
        Err(code) => (code, Vec::new()),
    };
    let topics = topics
        .into_iter()
        .map(|(name, partitions)| {
            let partitions = partitions
                .into_iter()
                .map(|(index, offset, error)| {
                    OffsetFetchResponsePartitions::default()
                        .with_partition_index(index)
                        .with_committed_offset(offset)
                        .with_committed_leader_epoch(-1)
                        .with_metadata(Some(StrBytes::default()))
                        .with_error_code(error)
                })
                .collect();
            OffsetFetchResponseTopics::default()
                .with_name(name)
                .with_partitions(partitions)
        })
        .collect();
    OffsetFetchResponseGroup::default()
        .with_group_id(id)
        .with_topics(topics)
        .with_error_code(error)
}
