//! Metadata: the event hubs as topics, their partitions, and this node as every partition's
//! leader at the advertised host and port.
//!
//! Leader epochs are −1 (unknown): clients then skip OffsetForLeaderEpoch validation, which
//! this door does not answer. Topics are never created on demand, as Event Hubs creates none:
//! an unknown name gets UNKNOWN_TOPIC_OR_PARTITION, one the login may not read
//! TOPIC_AUTHORIZATION_FAILED. Asked for every topic, only the readable ones are listed.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, MetadataRequest, MetadataResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use tributary_amqp::auth;

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
    let topics = match &request.topics {
        None => ctx
            .broker
            .list_hubs()
            .into_iter()
            .filter(|hub| session.authorize(&hub.name, auth::READ).is_ok())
            .map(|hub| topic(&hub.name, session, ctx))
            .collect(),
        Some(asked) => asked
            .iter()
            .filter_map(|t| t.name.as_ref())
            .map(|name| topic(name.0.as_str(), session, ctx))
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

/// One topic's entry, under the name the client asked for.
fn topic(name: &str, session: &Session, ctx: &Context) -> MetadataResponseTopic {
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
    entry.with_partitions(partitions)
}
