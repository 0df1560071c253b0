//! The hub-hosted checkpoint store's `$management` operations (list and claim ownership, list
//! and update checkpoints, renew and remove host records; `tributary_eventhubs::checkpoint_store`),
//! answered from the broker's ownership registry.
//!
//! Every operation needs Listen (or Manage) on the hub: ownership and checkpoints are a
//! receiver's business, as with Event Hubs' roles, where a processor runs with the Data
//! Receiver role (Listen) — Send alone reads and writes none of it. The broker's work (a file
//! write for a claim or checkpoint) runs off the connection's task: the answer is a future, and
//! every answer carries `com.tributary:checkpoint-store` = 1 so a client can tell it from a hub
//! that refused an unknown operation.

use std::future::Future;
use std::pin::Pin;

use fe2o3_amqp_types::messaging::{AmqpValue, Body};
use fe2o3_amqp_types::primitives::{SimpleValue, Value};
use tributary_broker::{
    Broker, BrokerError, CheckpointRecord, OwnershipClaim, OwnershipRecord, ProcessorHostRecord,
};
use tributary_eventhubs::MessageError;
use tributary_eventhubs::checkpoint_store::{
    self as store, CheckpointEntry, HostEntry, OwnershipEntry, StoreCall, StoreRequest,
};
use tributary_eventhubs::message::AmqpMessage;
use tributary_eventhubs::names::checkpoint_store as n;

use super::ConnectionState;
use super::nodes::{failure, may, response};
use crate::auth::LISTEN;
use crate::conditions;

/// An answer still being worked out.
pub(crate) type PendingAnswer = Pin<Box<dyn Future<Output = AmqpMessage> + Send>>;

/// Answers `request`, whose operation is the store's: at once when it is refused, else later.
pub(crate) fn answer(
    request: &AmqpMessage,
    call: Result<StoreCall, MessageError>,
    connection: &ConnectionState,
) -> Result<AmqpMessage, PendingAnswer> {
    let call = match call {
        Ok(call) => call,
        Err(e) => {
            return Ok(marked(failure(
                request,
                400,
                conditions::DECODE_ERROR,
                &e.to_string(),
            )));
        }
    };
    if let Err(e) = may(request, connection, &call.hub, LISTEN) {
        return Ok(marked(failure(request, 401, e.condition, &e.description)));
    }
    let broker = connection.ctx.broker.clone();
    let request = request.clone();
    Err(Box::pin(async move {
        marked(match perform(&broker, call).await {
            Ok(body) => response(&request, 200, "OK", body),
            Err(e) => refused(&request, &e),
        })
    }))
}

/// Carries out one store call on the broker; the answer's body.
async fn perform(broker: &Broker, call: StoreCall) -> Result<Body<Value>, BrokerError> {
    let (hub, group) = (&call.hub, &call.consumer_group);
    match call.request {
        StoreRequest::ListOwnership => broker
            .list_ownership(hub, group)
            .await
            .map(|records| ownership_body(&records)),
        StoreRequest::ListCheckpoints => broker.list_checkpoints(hub, group).await.map(|records| {
            let entries: Vec<CheckpointEntry> = records
                .into_iter()
                .map(|c| CheckpointEntry {
                    partition_id: c.partition_id,
                    offset: c.offset,
                    sequence_number: c.sequence_number,
                })
                .collect();
            store::encode_checkpoints(&entries)
        }),
        StoreRequest::ClaimOwnership(claims) => {
            let claims = claims
                .into_iter()
                .map(|c| OwnershipClaim {
                    partition_id: c.partition_id,
                    owner_id: c.owner_id,
                    etag: c.etag,
                })
                .collect();
            broker
                .claim_ownership(hub, group, claims)
                .await
                .map(|records| ownership_body(&records))
        }
        StoreRequest::UpdateCheckpoint {
            checkpoint,
            fence_owner_id,
        } => {
            let record = CheckpointRecord {
                partition_id: checkpoint.partition_id,
                offset: checkpoint.offset,
                sequence_number: checkpoint.sequence_number,
            };
            broker
                .update_checkpoint(hub, group, record, &fence_owner_id)
                .await
                .map(|()| Body::Value(AmqpValue(Value::Null)))
        }
        StoreRequest::RenewHost { owner_id } => broker
            .renew_processor_host(hub, group, &owner_id)
            .await
            .map(|(ownership, hosts)| listing_body(&ownership, &hosts)),
        StoreRequest::ListHosts => broker
            .list_ownership_and_hosts(hub, group)
            .await
            .map(|(ownership, hosts)| listing_body(&ownership, &hosts)),
        StoreRequest::RemoveHost { owner_id } => broker
            .remove_processor_host(hub, group, &owner_id)
            .await
            .map(|()| Body::Value(AmqpValue(Value::Null))),
    }
}

fn ownership_entries(records: &[OwnershipRecord]) -> Vec<OwnershipEntry> {
    records
        .iter()
        .map(|r| OwnershipEntry {
            partition_id: r.partition_id.clone(),
            owner_id: r.owner_id.clone(),
            etag: Some(r.etag.clone()),
            version: r.version,
            last_modified_ms: r.last_modified_ms,
        })
        .collect()
}

fn ownership_body(records: &[OwnershipRecord]) -> Body<Value> {
    store::encode_ownership(&ownership_entries(records))
}

fn listing_body(ownership: &[OwnershipRecord], hosts: &[ProcessorHostRecord]) -> Body<Value> {
    let hosts: Vec<HostEntry> = hosts
        .iter()
        .map(|h| HostEntry {
            owner_id: h.owner_id.clone(),
            version: h.version,
            last_modified_ms: h.last_modified_ms,
        })
        .collect();
    store::encode_listing(&ownership_entries(ownership), &hosts)
}

/// The answer to a request the broker refused.
fn refused(request: &AmqpMessage, error: &BrokerError) -> AmqpMessage {
    let text = error.to_string();
    match error {
        BrokerError::HubNotFound { .. } | BrokerError::ConsumerGroupNotFound { .. } => {
            failure(request, 404, conditions::NOT_FOUND, &text)
        }
        BrokerError::OwnershipLost { current_owner, .. } => {
            let mut answer = failure(request, 412, conditions::PRECONDITION_FAILED, &text);
            if let Some(properties) = answer.application_properties.as_mut() {
                properties.0.insert(
                    n::CURRENT_OWNER_ID.to_owned(),
                    SimpleValue::String(current_owner.clone()),
                );
            }
            answer
        }
        e if e.is_caller_error() => failure(request, 400, conditions::ARGUMENT_ERROR, &text),
        e => {
            let refusal = conditions::from_broker(e, None);
            failure(request, 500, refusal.condition, &refusal.description)
        }
    }
}

/// `answer` with the store's version property.
fn marked(mut answer: AmqpMessage) -> AmqpMessage {
    if let Some(properties) = answer.application_properties.as_mut() {
        properties.0.insert(
            n::STORE_VERSION.to_owned(),
            SimpleValue::Int(store::STORE_VERSION),
        );
    }
    answer
}
