//! DescribeCluster: this node, the cluster's only broker and its controller, under the cluster
//! id Metadata gives.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::{BrokerId, DescribeClusterRequest, DescribeClusterResponse};
use kafka_protocol::protocol::StrBytes;
use tributary_amqp::auth;

use super::{authorize_cluster, text};
use crate::connection::{Context, Session};
use crate::metadata::{CLUSTER_ID, NODE_ID};

/// DescribeCluster's endpoint type for brokers (2 asks for controllers, which clients reach
/// at a controller listener this node does not have).
const ENDPOINT_BROKERS: i8 = 1;

/// Kafka's ACL operations, as bits of `cluster_authorized_operations`.
const CREATE: i32 = 5;
const ALTER: i32 = 7;
const DESCRIBE: i32 = 8;
const DESCRIBE_CONFIGS: i32 = 10;
const IDEMPOTENT_WRITE: i32 = 12;

/// The DescribeCluster answer.
pub(crate) fn describe(
    request: &DescribeClusterRequest,
    session: &Session,
    ctx: &Context,
) -> DescribeClusterResponse {
    let response = DescribeClusterResponse::default().with_endpoint_type(request.endpoint_type);
    if let Err(refusal) = authorize_cluster(session, auth::LISTEN) {
        return response
            .with_error_code(refusal.code)
            .with_error_message(text(refusal.message));
    }
    if request.endpoint_type != ENDPOINT_BROKERS {
        return response
            .with_error_code(ResponseError::MismatchedEndpointType.code())
            .with_error_message(text(
                "this node serves brokers' endpoints only (endpoint type 1)".into(),
            ));
    }
    let broker = DescribeClusterBroker::default()
        .with_broker_id(BrokerId(NODE_ID))
        .with_host(StrBytes::from_string(ctx.advertised_host.clone()))
        .with_port(i32::from(ctx.advertised_port));
    let operations = if request.include_cluster_authorized_operations {
        authorized_operations(session)
    } else {
        i32::MIN
    };
    response
        .with_cluster_id(StrBytes::from_static_str(CLUSTER_ID))
        .with_controller_id(BrokerId(NODE_ID))
        .with_brokers(vec![broker])
        .with_cluster_authorized_operations(operations)
}

/// What this login may do on the cluster, as Kafka's operation bits (DescribeCluster's and
/// Metadata's `cluster_authorized_operations`): describe with Listen, write idempotently with
/// Send, everything of these and create and alter topics with Manage.
pub(crate) fn authorized_operations(session: &Session) -> i32 {
    let has = |needed: auth::Needed| session.authorize("", needed).is_ok();
    let mut bits = 0;
    if has(auth::LISTEN) {
        bits |= (1 << DESCRIBE) | (1 << DESCRIBE_CONFIGS);
    }
    if has(auth::SEND) {
        bits |= 1 << IDEMPOTENT_WRITE;
    }
    if has(super::MANAGE) {
        bits |= (1 << CREATE) | (1 << ALTER);
    }
    bits
}
