//! The `$cbs` and `$management` request/response nodes.
//!
//! A client attaches a send link to the node (requests) and a receive link from it (responses)
//! on one session. Each response goes to the session's response link of that node: the one
//! whose name or target address equals the request's `reply-to` (JavaScript), else the node's
//! only one (Python sends no `reply-to`). A response carries the request's `message-id` as its
//! `correlation-id` and the status in `status-code` (int) / `status-description`.
//!
//! - `$cbs` `put-token`: verifies a SAS token and records its grant on the connection
//!   (202 Accepted, or 401 with the reason — never the token). A token whose audience names an
//!   event hub that does not exist is answered 404 `amqp:not-found`, "The messaging entity …
//!   could not be found", as Event Hubs answers it: the SDKs raise that at once, before any
//!   link is attached.
//! - `$management` `READ` of `com.microsoft:eventhub` / `com.microsoft:partition`: the hub's or
//!   partition's properties as an amqp-value map with the keys and types the SDKs read (404 for an
//!   unknown hub or partition, 401 without Listen, Send or Manage on the hub).
//! - `$management` `com.tributary:*`: the hub-hosted checkpoint store (`store_node`).
//! - Any other operation: 400 with `amqp:not-implemented`.

use std::collections::VecDeque;

use fe2o3_amqp_types::definitions::SenderSettleMode;
use fe2o3_amqp_types::messaging::{
    AmqpValue, ApplicationProperties, Body, Properties, Rejected, TargetArchetype,
};
use fe2o3_amqp_types::performatives::Attach;
use fe2o3_amqp_types::primitives::{Array, OrderedMap, SimpleValue, Timestamp, Value};
use tributary_amqp_engine::{Connection, LinkId};
use tributary_broker::BrokerError;

use super::{ConnectionState, amqp_error, now_secs};
use crate::auth::{self, READ};
use crate::conditions::{self, Refusal};
use crate::limits::NODE_QUEUE_MAX;
use tributary_eventhubs::checkpoint_store::StoreCall;
use tributary_eventhubs::ingest::decode_strict;
use tributary_eventhubs::message::{AmqpMessage, empty_message, value_body};
use tributary_eventhubs::names::management as m;

/// Which request/response node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeKind {
    /// `$cbs`.
    Cbs,
    /// `$management`.
    Management,
}

/// A client's response link from a node: responses wait here for its credit.
#[derive(Debug)]
pub(crate) struct ReplyLink {
    pub(crate) kind: NodeKind,
    name: String,
    target: Option<String>,
    /// Whether the link's sender settle mode is `settled`.
    settled: bool,
    /// Encoded responses waiting for credit (at most [`NODE_QUEUE_MAX`]).
    queue: VecDeque<Vec<u8>>,
}

impl ReplyLink {
    /// The response link `attach` asks for.
    pub(crate) fn new(kind: NodeKind, attach: &Attach) -> Self {
        let target = match attach.target.as_deref() {
            Some(TargetArchetype::Target(t)) => t.address.clone(),
            _ => None,
        };
        ReplyLink {
            kind,
            name: attach.name.clone(),
            target,
            settled: attach.snd_settle_mode == SenderSettleMode::Settled,
            queue: VecDeque::new(),
        }
    }

    /// Whether this is the link a request's `reply-to` names.
    pub(crate) fn answers(&self, reply_to: Option<&str>) -> bool {
        reply_to.is_some_and(|to| self.name == to || self.target.as_deref() == Some(to))
    }

    /// Sends `response` (or queues it until the client gives credit).
    pub(crate) fn send(
        &mut self,
        connection: &mut Connection,
        link: LinkId,
        response: AmqpMessage,
    ) {
        if self.queue.len() >= NODE_QUEUE_MAX {
            tracing::debug!(kind = ?self.kind, "response link full; response dropped");
            return;
        }
        match tributary_eventhubs::message::encode_message(&response) {
            Ok(encoded) => self.queue.push_back(encoded),
            Err(e) => tracing::warn!(error = %e, "a response did not encode"),
        }
        self.flush(connection, link);
    }

    /// Sends queued responses as far as the credit goes. Settlement is the client's business;
    /// responses are not waited on.
    pub(crate) fn flush(&mut self, connection: &mut Connection, link: LinkId) {
        while connection.credit(link) > 0 {
            let Some(response) = self.queue.pop_front() else {
                return;
            };
            let sent = connection.send(link, self.settled, 0, |out| {
                out.extend_from_slice(&response)
            });
            if sent.is_err() {
                return;
            }
        }
    }
}

/// A response: ready now, or still being worked out (the checkpoint store's operations).
pub(crate) type Reply = Result<AmqpMessage, super::store_node::PendingAnswer>;

/// Answers one request to a node: the request's `reply-to` and the response (`Err` when the
/// request could not be read).
pub(crate) fn answer(
    kind: NodeKind,
    payload: &[u8],
    connection: &ConnectionState,
) -> (Option<String>, Result<Reply, ()>) {
    let request = match decode_strict(payload) {
        Ok(request) => request,
        Err(e) => {
            tracing::debug!(?kind, error = %e, "an unreadable request");
            return (None, Err(()));
        }
    };
    let reply_to = request.properties.as_ref().and_then(|p| p.reply_to.clone());
    let response = match kind {
        NodeKind::Cbs => Ok(put_token(&request, connection)),
        NodeKind::Management => match StoreCall::decode(&request) {
            Some(call) => super::store_node::answer(&request, call, connection),
            None => Ok(management(&request, connection)),
        },
    };
    (reply_to, Ok(response))
}

/// The `rejected` outcome carrying `refusal`, encoded for a disposition.
pub(crate) fn rejected(refusal: &Refusal) -> Vec<u8> {
    let outcome = Rejected {
        error: Some(amqp_error(refusal)),
    };
    serde_amqp::to_vec(&outcome).expect("an outcome always encodes")
}

fn text(value: &SimpleValue) -> Option<&str> {
    match value {
        SimpleValue::String(s) => Some(s),
        SimpleValue::Symbol(s) => Some(s.as_str()),
        SimpleValue::Binary(b) => std::str::from_utf8(b).ok(),
        _ => None,
    }
}

fn property<'a>(request: &'a AmqpMessage, key: &str) -> Option<&'a str> {
    request
        .application_properties
        .as_ref()?
        .0
        .get(key)
        .and_then(text)
}

pub(super) fn response(
    request: &AmqpMessage,
    status: i32,
    description: &str,
    body: Body<Value>,
) -> AmqpMessage {
    let correlation_id = request
        .properties
        .as_ref()
        .and_then(|p| p.message_id.clone());
    let mut application_properties = OrderedMap::new();
    application_properties.insert(m::STATUS_CODE.to_owned(), SimpleValue::Int(status));
    application_properties.insert(
        m::STATUS_DESCRIPTION.to_owned(),
        SimpleValue::String(description.to_owned()),
    );
    // Also as older services spell it, where pyamqp's `$management` client reads the
    // description (it reads the status under either name).
    application_properties.insert(
        m::STATUS_DESCRIPTION_CAMEL.to_owned(),
        SimpleValue::String(description.to_owned()),
    );
    AmqpMessage {
        properties: Some(Properties {
            correlation_id,
            ..Properties::default()
        }),
        application_properties: Some(ApplicationProperties(application_properties)),
        body,
        ..empty_message()
    }
}

pub(super) fn failure(
    request: &AmqpMessage,
    status: i32,
    condition: &str,
    description: &str,
) -> AmqpMessage {
    let mut message = response(
        request,
        status,
        description,
        Body::Value(AmqpValue(Value::Null)),
    );
    if let Some(ap) = message.application_properties.as_mut() {
        ap.0.insert(
            m::ERROR_CONDITION.to_owned(),
            SimpleValue::String(condition.to_owned()),
        );
    }
    message
}

fn put_token(request: &AmqpMessage, connection: &ConnectionState) -> AmqpMessage {
    if property(request, m::OPERATION) != Some(m::PUT_TOKEN) {
        return failure(
            request,
            400,
            conditions::NOT_IMPLEMENTED,
            "the only $cbs operation is put-token",
        );
    }
    let token = match &request.body {
        Body::Value(AmqpValue(Value::String(token))) => token.as_str(),
        _ => {
            return failure(
                request,
                400,
                conditions::DECODE_ERROR,
                "the token must be an amqp-value string",
            );
        }
    };
    let now = now_secs();
    let grant = match auth::verify(token, &connection.ctx.policies, now) {
        Ok(grant) => grant,
        Err(e) => {
            tracing::debug!(peer = %connection.peer, reason = %e, "put-token refused");
            return token_refused(request, 401, &e.to_string());
        }
    };
    if !audience_exists(&grant.audience, &connection.ctx.broker) {
        let description = format!(
            "The messaging entity '{}' could not be found.",
            grant.audience
        );
        return token_refused(request, 404, &description);
    }
    connection.grants.record(grant, now);
    response(
        request,
        202,
        "Accepted",
        Body::Value(AmqpValue(Value::Null)),
    )
}

/// A refused `put-token`: the status and its description, without the `error-condition` that
/// other refusals carry, as Event Hubs answers it — pyamqp reports a token refusal that has
/// one as "Status code: None", dropping the status and the description.
fn token_refused(request: &AmqpMessage, status: i32, description: &str) -> AmqpMessage {
    response(
        request,
        status,
        description,
        Body::Value(AmqpValue(Value::Null)),
    )
}

/// Whether the entity a token's audience names exists: the namespace, a `$` node, or an event
/// hub (and what lies below it, which its links check themselves).
fn audience_exists(audience: &str, broker: &tributary_broker::Broker) -> bool {
    let path = tributary_eventhubs::address::strip_host(audience);
    let hub = path.split('/').next().unwrap_or_default();
    if hub.is_empty() || hub.starts_with('$') {
        return true;
    }
    !matches!(
        broker.describe_hub(hub),
        Err(BrokerError::HubNotFound { .. })
    )
}

/// Whether the request has one of the rights `needed` on `hub`: by its own `security_token`,
/// or by the connection's grants.
pub(super) fn may(
    request: &AmqpMessage,
    connection: &ConnectionState,
    hub: &str,
    needed: auth::Needed,
) -> Result<(), Refusal> {
    let entity = hub.to_ascii_lowercase();
    let now = now_secs();
    if let Some(token) = property(request, m::SECURITY_TOKEN) {
        let verified = auth::verify(token, &connection.ctx.policies, now)
            .map_err(|e| Refusal::new(conditions::UNAUTHORIZED, e.to_string()))
            .and_then(|grant| auth::check(&grant, &entity, needed, now));
        if verified.is_ok() {
            return Ok(());
        }
    }
    connection
        .grants
        .authorize(&entity, needed, now)
        .map(|_| ())
}

fn management(request: &AmqpMessage, connection: &ConnectionState) -> AmqpMessage {
    if !property(request, m::OPERATION).is_some_and(|o| o.eq_ignore_ascii_case(m::READ)) {
        return failure(
            request,
            400,
            conditions::NOT_IMPLEMENTED,
            "the $management operations are READ and Tributary's checkpoint store's \
             (com.tributary:list-ownership, claim-ownership, list-checkpoints, update-checkpoint)",
        );
    }
    let Some(hub) = property(request, m::NAME) else {
        return failure(
            request,
            400,
            conditions::ARGUMENT_ERROR,
            "the request names no event hub",
        );
    };
    if let Err(e) = may(request, connection, hub, READ) {
        return failure(request, 401, e.condition, &e.description);
    }
    let broker = &connection.ctx.broker;
    let result = match property(request, m::TYPE) {
        Some(m::EVENTHUB_TYPE) => broker.describe_hub(hub).map(|d| hub_map(&d)),
        Some(m::PARTITION_TYPE) => {
            let Some(partition) = property(request, m::PARTITION) else {
                return failure(
                    request,
                    400,
                    conditions::ARGUMENT_ERROR,
                    "the request names no partition",
                );
            };
            broker
                .partition_properties(hub, partition)
                .map(|p| partition_map(hub, partition, &p))
        }
        _ => {
            return failure(
                request,
                400,
                conditions::NOT_IMPLEMENTED,
                "the type must be com.microsoft:eventhub or com.microsoft:partition",
            );
        }
    };
    match result {
        Ok(map) => response(request, 200, "OK", value_body(Value::Map(map))),
        Err(e @ (BrokerError::HubNotFound { .. } | BrokerError::InvalidPartition { .. })) => {
            failure(request, 404, conditions::NOT_FOUND, &e.to_string())
        }
        Err(e) => {
            let refusal = conditions::from_broker(&e, None);
            failure(request, 500, refusal.condition, &refusal.description)
        }
    }
}

fn key(k: &str) -> Value {
    Value::String(k.to_owned())
}

fn hub_map(definition: &tributary_broker::HubDefinition) -> OrderedMap<Value, Value> {
    let ids: Vec<Value> = (0..definition.partition_count)
        .map(|p| Value::String(p.to_string()))
        .collect();
    let mut map = OrderedMap::new();
    map.insert(key(m::NAME), Value::String(definition.name.clone()));
    map.insert(key(m::TYPE), key(m::EVENTHUB_TYPE));
    map.insert(
        key(m::CREATED_AT),
        Value::Timestamp(Timestamp::from_milliseconds(definition.created_at_ms)),
    );
    map.insert(
        key(m::PARTITION_COUNT),
        Value::Int(i32::try_from(definition.partition_count).unwrap_or(i32::MAX)),
    );
    map.insert(key(m::PARTITION_IDS), Value::Array(Array::from(ids)));
    map.insert(key(m::HUB_ID), Value::String(definition.id.clone()));
    map
}

fn partition_map(
    hub: &str,
    partition: &str,
    p: &tributary_broker::PartitionProperties,
) -> OrderedMap<Value, Value> {
    let mut map = OrderedMap::new();
    map.insert(key(m::NAME), Value::String(hub.to_owned()));
    map.insert(key(m::TYPE), key(m::PARTITION_TYPE));
    map.insert(key(m::PARTITION), Value::String(partition.to_owned()));
    map.insert(
        key(m::BEGIN_SEQUENCE_NUMBER),
        Value::Long(p.begin_sequence_number),
    );
    map.insert(
        key(m::LAST_ENQUEUED_SEQUENCE_NUMBER),
        Value::Long(p.last_enqueued_sequence_number),
    );
    map.insert(
        key(m::LAST_ENQUEUED_OFFSET),
        Value::String(
            p.last_enqueued_offset
                .map_or_else(|| "-1".to_owned(), |o| o.to_string()),
        ),
    );
    map.insert(
        key(m::LAST_ENQUEUED_TIME_UTC),
        Value::Timestamp(Timestamp::from_milliseconds(
            p.last_enqueued_time_ms.unwrap_or(0),
        )),
    );
    map.insert(key(m::IS_PARTITION_EMPTY), Value::Bool(p.is_empty));
    // A partition's sequence numbers never restart and are never replicated from another
    // namespace: one epoch, 0, for both ends. Azure sends both keys; the Rust SDK
    // (`azure_messaging_eventhubs`) refuses a partition answer without the second.
    map.insert(key(m::BEGIN_SEQUENCE_NUMBER_EPOCH), Value::Int(0));
    map.insert(key(m::LAST_ENQUEUED_SEQUENCE_NUMBER_EPOCH), Value::Int(0));
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'a>(map: &'a OrderedMap<Value, Value>, k: &str) -> &'a Value {
        map.get(&key(k)).unwrap_or_else(|| panic!("{k} is missing"))
    }

    /// Every key an official SDK reads from a partition's answer, with the type it reads it as.
    #[test]
    fn a_partition_answer_has_every_key_the_sdks_read_with_its_type() {
        let properties = tributary_broker::PartitionProperties {
            begin_sequence_number: 3,
            last_enqueued_sequence_number: 9,
            last_enqueued_offset: Some(4096),
            last_enqueued_time_ms: Some(1_714_979_289_000),
            is_empty: false,
        };
        let map = partition_map("orders", "2", &properties);
        assert_eq!(get(&map, m::NAME), &Value::String("orders".into()));
        assert_eq!(get(&map, m::TYPE), &key(m::PARTITION_TYPE));
        assert_eq!(get(&map, m::PARTITION), &Value::String("2".into()));
        assert_eq!(get(&map, m::BEGIN_SEQUENCE_NUMBER), &Value::Long(3));
        assert_eq!(get(&map, m::LAST_ENQUEUED_SEQUENCE_NUMBER), &Value::Long(9));
        assert_eq!(
            get(&map, m::LAST_ENQUEUED_OFFSET),
            &Value::String("4096".into())
        );
        assert_eq!(
            get(&map, m::LAST_ENQUEUED_TIME_UTC),
            &Value::Timestamp(Timestamp::from_milliseconds(1_714_979_289_000))
        );
        assert_eq!(get(&map, m::IS_PARTITION_EMPTY), &Value::Bool(false));
        assert_eq!(get(&map, m::BEGIN_SEQUENCE_NUMBER_EPOCH), &Value::Int(0));
        assert_eq!(
            get(&map, m::LAST_ENQUEUED_SEQUENCE_NUMBER_EPOCH),
            &Value::Int(0)
        );
    }
}
