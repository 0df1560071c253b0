//! Metadata: the event hubs as topics, their partitions, and this node as every partition's
//! leader at the advertised host and port.
//!
//! Leader epochs are −1 (unknown): clients then skip OffsetForLeaderEpoch validation, which
//! this door does not answer. Topics are never created on demand, as Event Hubs creates none:
//! an unknown name gets UNKNOWN_TOPIC_OR_PARTITION, one the login may not read
//! TOPIC_AUTHORIZATION_FAILED. Asked for every topic, only the readable ones are listed.
//!
//! Asked for them (v8 to v10), each topic carries the operations the login may do on it
//! ([`topic_operations`]); kafka-python's admin client asks, and reads the bits.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use tributary_amqp::Right;
use tributary_amqp::auth::{self, Needed};

use crate::connection::{Context, Session};

/// This node's id: the only broker of the cluster.
pub const NODE_ID: i32 = 0;

/// The cluster id clients see.
pub const CLUSTER_ID: &str = "tributary";

/// The Metadata answer.
pub(crate) fn answer(
    request: &MetadataRequest,
    session: &Session,
    ctx: &Context,
) -> MetadataResponse {
    let broker = MetadataResponseBroker::default()
        .with_node_id(BrokerId(NODE_ID))
        .with_host(StrBytes::from_string(ctx.advertised_host.clone()))
        .with_port(i32::from(ctx.advertised_port));
    let operations = request.include_topic_authorized_operations;
    let topics = match &request.topics {
        None => ctx
            .broker
            .list_hubs()
            .into_iter()
            .filter(|hub| session.authorize(&hub.name, auth::READ).is_ok())
            .map(|hub| topic(&hub.name, operations, session, ctx))
            .collect(),
        Some(asked) => asked
            .iter()
            .filter_map(|t| t.name.as_ref())
            .map(|name| topic(name.0.as_str(), operations, session, ctx))
            .collect(),
    };
    // librdkafka's DescribeCluster asks Metadata (v8 to v10) for this login's operations.
    let operations = if request.include_cluster_authorized_operations {
        crate::admin::cluster_operations(session)
    } else {
        i32::MIN
    };
    MetadataResponse::default()
        .with_cluster_authorized_operations(operations)
        .with_brokers(vec![broker])
        .with_cluster_id(Some(StrBytes::from_static_str(CLUSTER_ID)))
        .with_controller_id(BrokerId(NODE_ID))
        .with_topics(topics)
}

/// One topic's entry, under the name the client asked for, with the login's operations on it
/// when `operations` (else Kafka's "not asked", `i32::MIN`).
fn topic(name: &str, operations: bool, session: &Session, ctx: &Context) -> MetadataResponseTopic {
    let entry = MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(name.to_owned()))));
    let hub = match ctx.broker.describe_hub(name) {
        Ok(hub) => hub,
        Err(_) => return entry.with_error_code(ResponseError::UnknownTopicOrPartition.code()),
    };
    if let Err(code) = session.authorize(name, auth::READ) {
        return entry.with_error_code(code);
    }
    let partitions = (0..hub.partition_count)
        .map(|index| {
            MetadataResponsePartition::default()
                .with_partition_index(index as i32)
                .with_leader_id(BrokerId(NODE_ID))
                .with_leader_epoch(-1)
                .with_replica_nodes(vec![BrokerId(NODE_ID)])
                .with_isr_nodes(vec![BrokerId(NODE_ID)])
        })
        .collect();
    let operations = if operations {
        topic_operations(|needed| session.authorize(name, needed).is_ok())
    } else {
        i32::MIN
    };
    entry
        .with_partitions(partitions)
        .with_topic_authorized_operations(operations)
}

/// The right topic administration needs.
const MANAGE: Needed = &[Right::Manage];

/// Kafka's ACL operations, as bits of `topic_authorized_operations`.
const READ: i32 = 3;
const WRITE: i32 = 4;
const CREATE: i32 = 5;
const DELETE: i32 = 6;
const ALTER: i32 = 7;
const DESCRIBE: i32 = 8;
const DESCRIBE_CONFIGS: i32 = 10;
const ALTER_CONFIGS: i32 = 11;

/// What a login may do on a topic, as Kafka's operation bits, given whether it `has` a right:
/// describe it with any right, read with Listen, write with Send, describe its configs with
/// Listen, and create, delete and alter it with Manage (which grants every right).
pub fn topic_operations(has: impl Fn(Needed) -> bool) -> i32 {
    let mut bits = 0;
    if has(auth::READ) {
        bits |= 1 << DESCRIBE;
    }
    if has(auth::LISTEN) {
        bits |= (1 << READ) | (1 << DESCRIBE_CONFIGS);
    }
    if has(auth::SEND) {
        bits |= 1 << WRITE;
    }
    if has(MANAGE) {
        bits |= (1 << CREATE) | (1 << DELETE) | (1 << ALTER) | (1 << ALTER_CONFIGS);
    }
    bits
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operations of a login with `rights` (Manage implies the others, as the policies'
    /// rules say).
    fn operations_of(rights: &[Right]) -> i32 {
        topic_operations(|needed| needed.iter().any(|r| rights.contains(r)))
    }

    #[test]
    fn each_right_grants_its_topic_operations() {
        let bits = |ops: &[i32]| ops.iter().fold(0, |all, op| all | (1 << op));
        assert_eq!(
            operations_of(&[Right::Listen]),
            bits(&[DESCRIBE, READ, DESCRIBE_CONFIGS])
        );
        assert_eq!(operations_of(&[Right::Send]), bits(&[DESCRIBE, WRITE]));
        let every = [
            READ,
            WRITE,
            CREATE,
            DELETE,
            ALTER,
            DESCRIBE,
            DESCRIBE_CONFIGS,
        ];
        assert_eq!(
            operations_of(&[Right::Manage]),
            bits(&every) | bits(&[ALTER_CONFIGS])
        );
        assert_eq!(operations_of(&[]), 0);
        // Never the sign bit that means "not asked" (kafka-python 2 fails on it).
        assert!(operations_of(&[Right::Manage]) > 0);
    }
}
