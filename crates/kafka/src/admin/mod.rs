//! Topic administration over Kafka, as Event Hubs' Kafka endpoint and a one-node Kafka broker
//! answer it: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs, AlterConfigs,
//! IncrementalAlterConfigs and DescribeCluster. A topic is an event hub, so creating a topic creates a hub (with its
//! `$Default` consumer group) and deleting one deletes the hub and its events.
//!
//! # Rights
//! - Creating, deleting, growing and altering topics need the Manage right on the topic (a namespace-wide
//!   policy covers every name); without it a topic's answer is TOPIC_AUTHORIZATION_FAILED, and
//!   nothing changes.
//! - Describing a topic's configs needs Listen or Manage on it (TOPIC_AUTHORIZATION_FAILED);
//!   describing the broker or the cluster needs Listen or Manage on the whole namespace
//!   (CLUSTER_AUTHORIZATION_FAILED).
//!
//! # What a hub can honour
//! The topic configs a hub keeps are `retention.ms` (the hub's retention age; −1 keeps events
//! forever), `retention.bytes` (each partition's byte limit; −1 none), `cleanup.policy`
//! (`delete`, `compact` or `compact,delete`: a compacted hub keeps the latest event of each
//! key), `min.compaction.lag.ms` and `delete.retention.ms` (the hub's minimum compaction lag
//! and tombstone retention). The others a client may set are fixed by the hub and accepted
//! only at their value: `max.message.bytes=1048576` (Event Hubs' 1 MiB), `message.timestamp.type=CreateTime`,
//! `min.insync.replicas=1`, `compression.type` `producer` or `uncompressed` (fetches answer
//! uncompressed batches). Any other value, or a config this door does not know, is
//! INVALID_CONFIG with a message naming it. This node is the only replica: a replication
//! factor above 1 is INVALID_REPLICATION_FACTOR, as a one-broker Kafka cluster answers.
//!
//! A hub's partition count is fixed when it is created (as on Event Hubs' Basic and Standard
//! tiers), so CreatePartitions is refused with INVALID_PARTITIONS and a message saying so.
//!
//! # Guarantees
//! - Every topic of a request gets its own answer; one refused topic does not stop the others.
//!   A topic named twice in one request is INVALID_REQUEST for both entries, as Kafka answers.
//! - `validate_only` runs every check and changes nothing.
//! - Error messages name the topic and the rule, never a key or token.

mod alter;
mod cluster;
mod configs;
mod topics;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::{RequestKind, ResponseKind};
use kafka_protocol::protocol::StrBytes;
use tributary_amqp::Right;
use tributary_amqp::auth::Needed;

use crate::connection::{Context, Session};

pub(crate) use cluster::authorized_operations as cluster_operations;

/// What creating, deleting, growing or altering a topic needs.
const MANAGE: Needed = &[Right::Manage];

/// Whether `request` is one of the administration requests this module answers.
pub(crate) fn answers(request: &RequestKind) -> bool {
    matches!(
        request,
        RequestKind::CreateTopics(_)
            | RequestKind::DeleteTopics(_)
            | RequestKind::CreatePartitions(_)
            | RequestKind::DescribeConfigs(_)
            | RequestKind::AlterConfigs(_)
            | RequestKind::IncrementalAlterConfigs(_)
            | RequestKind::DescribeCluster(_)
    )
}

/// Answers one administration request (see [`answers`]); any other is an error.
pub(crate) async fn answer(
    request: RequestKind,
    session: &Session,
    ctx: &Context,
) -> Result<ResponseKind, String> {
    let response = match request {
        RequestKind::CreateTopics(request) => {
            ResponseKind::CreateTopics(topics::create(request, session, ctx).await)
        }
        RequestKind::DeleteTopics(request) => {
            ResponseKind::DeleteTopics(topics::delete(request, session, ctx).await)
        }
        RequestKind::CreatePartitions(request) => {
            ResponseKind::CreatePartitions(topics::create_partitions(&request, session, ctx))
        }
        RequestKind::DescribeConfigs(request) => {
            ResponseKind::DescribeConfigs(configs::describe(&request, session, ctx))
        }
        RequestKind::AlterConfigs(request) => {
            ResponseKind::AlterConfigs(alter::alter(request, session, ctx).await)
        }
        RequestKind::IncrementalAlterConfigs(request) => ResponseKind::IncrementalAlterConfigs(
            alter::incremental_alter(request, session, ctx).await,
        ),
        RequestKind::DescribeCluster(request) => {
            ResponseKind::DescribeCluster(cluster::describe(&request, session, ctx))
        }
        other => return Err(format!("not an administration request: {other:?}")),
    };
    Ok(response)
}

/// A refused topic (or resource): its error code and the message the client shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) code: i16,
    pub(crate) message: String,
}

impl Refusal {
    pub(crate) fn new(error: ResponseError, message: impl Into<String>) -> Self {
        Refusal {
            code: error.code(),
            message: message.into(),
        }
    }
}

/// The namespace-wide check of the broker and cluster descriptions: `needed` on every entity
/// (the empty path); refused with CLUSTER_AUTHORIZATION_FAILED.
pub(crate) fn authorize_cluster(session: &Session, needed: Needed) -> Result<(), Refusal> {
    session.authorize("", needed).map_err(|_| {
        Refusal::new(
            ResponseError::ClusterAuthorizationFailed,
            "describing the cluster needs the Listen or Manage right on the whole namespace",
        )
    })
}

/// A message for a response's nullable string.
fn text(message: String) -> Option<StrBytes> {
    Some(StrBytes::from_string(message))
}

/// The names (compared as hubs are: case-insensitively) that occur more than once.
fn duplicated<'a>(names: impl Iterator<Item = &'a str>) -> std::collections::HashSet<String> {
    let mut seen = std::collections::HashSet::new();
    let mut twice = std::collections::HashSet::new();
    for name in names {
        let key = name.to_ascii_lowercase();
        if !seen.insert(key.clone()) {
            twice.insert(key);
        }
    }
    twice
}
