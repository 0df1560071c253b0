//! The `$cbs` and `$management` request/response nodes.
//!
//! A client attaches a send link to the node (requests) and a receive link from it (responses)
//! on one session. Each response goes to the session's response link of that node: the one
//! whose name or target address equals the request's `reply-to` (JavaScript), else the node's
//! only one (Python sends no `reply-to`). A response carries the request's `message-id` as its
//! `correlation-id` and the status in `status-code` (int) / `status-description`.
//!
//! - `$cbs` `put-token`: verifies a SAS token and records its grant on the connection
//!   (202 Accepted, or 401 with the reason — never the token).
//! - `$management` `READ` of `com.microsoft:eventhub` / `com.microsoft:partition`: the hub's or
//!   partition's properties as an amqp-value map with the keys and types the SDKs read (404 for an
//!   unknown hub or partition, 401 without Listen, Send or Manage on the hub).

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use fe2o3_amqp::acceptor::{
    LinkAcceptor, LinkEndpoint, ListenerSessionHandle, SupportedReceiverSettleModes,
};
use fe2o3_amqp::link::RecvError;
use fe2o3_amqp::{Receiver, Sender};
use fe2o3_amqp_types::definitions::{ReceiverSettleMode, Role};
use fe2o3_amqp_types::messaging::{
    AmqpValue, ApplicationProperties, Body, Properties, TargetArchetype,
};
use fe2o3_amqp_types::performatives::Attach;
use fe2o3_amqp_types::primitives::{Array, OrderedMap, SimpleValue, Timestamp, Value};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tributary_broker::BrokerError;

use super::message::{AmqpMessage, value_body};
use super::{Connection, amqp_error, now_secs, shutting_down};
use crate::auth::{self, READ};
use crate::conditions::{self, Refusal};
use crate::limits::{CLOSE_TIMEOUT, NODE_QUEUE_MAX};

/// Which request/response node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NodeKind {
    /// `$cbs`.
    Cbs,
    /// `$management`.
    Management,
}

struct Route {
    id: u64,
    kind: NodeKind,
    name: String,
    target: Option<String>,
    tx: mpsc::Sender<AmqpMessage>,
}

/// The response links of one session.
#[derive(Default)]
pub(crate) struct ReplyRoutes {
    next_id: AtomicU64,
    routes: Mutex<Vec<Route>>,
}

impl ReplyRoutes {
    fn register(
        &self,
        kind: NodeKind,
        name: String,
        target: Option<String>,
    ) -> (u64, mpsc::Receiver<AmqpMessage>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(NODE_QUEUE_MAX);
        let route = Route {
            id,
            kind,
            name,
            target,
            tx,
        };
        self.routes.lock().expect("routes").push(route);
        (id, rx)
    }

    fn unregister(&self, id: u64) {
        self.routes.lock().expect("routes").retain(|r| r.id != id);
    }

    /// Queues `response` on the right response link; false if there is none or it is full.
    fn send(&self, kind: NodeKind, reply_to: Option<&str>, response: AmqpMessage) -> bool {
        let routes = self.routes.lock().expect("routes");
        let by_reply_to = reply_to.and_then(|to| {
            routes
                .iter()
                .find(|r| r.kind == kind && (r.name == to || r.target.as_deref() == Some(to)))
        });
        match by_reply_to.or_else(|| routes.iter().rev().find(|r| r.kind == kind)) {
            Some(route) => route.tx.try_send(response).is_ok(),
            None => false,
        }
    }
}

/// Attaches a client's link to a node: a send link carries requests, a receive link responses.
pub(crate) async fn attach(
    kind: NodeKind,
    attach: Attach,
    session: &mut ListenerSessionHandle,
    connection: &Arc<Connection>,
    routes: &Arc<ReplyRoutes>,
    links: &mut JoinSet<()>,
) -> Result<(), (Attach, Refusal)> {
    match attach.role {
        Role::Sender => attach_requests(kind, attach, session, connection, routes, links).await,
        Role::Receiver => attach_replies(kind, attach, session, connection, routes, links).await,
    }
}

/// Attaches a client's request link to a node.
async fn attach_requests(
    kind: NodeKind,
    attach: Attach,
    session: &mut ListenerSessionHandle,
    connection: &Arc<Connection>,
    routes: &Arc<ReplyRoutes>,
    links: &mut JoinSet<()>,
) -> Result<(), (Attach, Refusal)> {
    let acceptor = LinkAcceptor::builder()
        .supported_receiver_settle_modes(SupportedReceiverSettleModes::First)
        .fallback_receiver_settle_mode(ReceiverSettleMode::First)
        .build();
    match acceptor.accept_incoming_attach(attach, session).await {
        Ok(LinkEndpoint::Receiver(receiver)) => {
            links.spawn(serve_requests(
                kind,
                receiver,
                connection.clone(),
                routes.clone(),
            ));
        }
        Ok(LinkEndpoint::Sender(_)) => {
            tracing::warn!("the engine attached a client sender as a sender; dropped");
        }
        Err(e) => tracing::debug!(error = %e, "request link failed to attach"),
    }
    Ok(())
}

/// Attaches a client's response link from a node.
async fn attach_replies(
    kind: NodeKind,
    attach: Attach,
    session: &mut ListenerSessionHandle,
    connection: &Arc<Connection>,
    routes: &Arc<ReplyRoutes>,
    links: &mut JoinSet<()>,
) -> Result<(), (Attach, Refusal)> {
    let target = match attach.target.as_deref() {
        Some(TargetArchetype::Target(t)) => t.address.clone(),
        _ => None,
    };
    // Registered before the attach is answered, so no request can find it missing.
    let (id, rx) = routes.register(kind, attach.name.clone(), target);
    match LinkAcceptor::builder()
        .build()
        .accept_incoming_attach(attach, session)
        .await
    {
        Ok(LinkEndpoint::Sender(sender)) => {
            let routes = routes.clone();
            let shutdown = connection.ctx.shutdown.clone();
            links.spawn(async move {
                serve_replies(sender, rx, shutdown).await;
                routes.unregister(id);
            });
        }
        Ok(LinkEndpoint::Receiver(_)) => {
            routes.unregister(id);
            tracing::warn!("the engine attached a client receiver as a receiver; dropped");
        }
        Err(e) => {
            routes.unregister(id);
            tracing::debug!(error = %e, "response link failed to attach");
        }
    }
    Ok(())
}

async fn serve_replies(
    mut sender: Sender,
    mut rx: mpsc::Receiver<AmqpMessage>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            response = rx.recv() => {
                let Some(response) = response else { break };
                // Settlement is the client's business; the response is not waited on.
                if sender.send_batchable(response).await.is_err() {
                    return;
                }
            }
            _ = sender.on_detach() => return,
            () = shutting_down(&mut shutdown) => break,
        }
    }
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, sender.close()).await;
}

async fn serve_requests(
    kind: NodeKind,
    mut receiver: Receiver,
    connection: Arc<Connection>,
    routes: Arc<ReplyRoutes>,
) {
    let mut shutdown = connection.ctx.shutdown.clone();
    loop {
        let delivery = tokio::select! {
            delivery = receiver.recv::<Body<Value>>() => delivery,
            () = shutting_down(&mut shutdown) => break,
        };
        match delivery {
            Ok(delivery) => {
                let _ = receiver.accept(&delivery).await;
                let request = delivery.into_message();
                let reply_to = request.properties.as_ref().and_then(|p| p.reply_to.clone());
                let response = match kind {
                    NodeKind::Cbs => put_token(&request, &connection),
                    NodeKind::Management => management(&request, &connection),
                };
                if !routes.send(kind, reply_to.as_deref(), response) {
                    tracing::debug!(?kind, "no response link for a request; response dropped");
                }
            }
            Err(RecvError::MessageDecode(e)) => {
                let refusal = Refusal::new(conditions::DECODE_ERROR, e.source.to_string());
                let _ = receiver.reject(e.info, amqp_error(&refusal)).await;
            }
            Err(_) => return,
        }
    }
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, receiver.close()).await;
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

fn response(
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
    application_properties.insert("status-code".to_owned(), SimpleValue::Int(status));
    application_properties.insert(
        "status-description".to_owned(),
        SimpleValue::String(description.to_owned()),
    );
    AmqpMessage {
        properties: Some(Properties {
            correlation_id,
            ..Properties::default()
        }),
        application_properties: Some(ApplicationProperties(application_properties)),
        body,
        ..super::message::empty_message()
    }
}

fn failure(request: &AmqpMessage, status: i32, condition: &str, description: &str) -> AmqpMessage {
    let mut message = response(
        request,
        status,
        description,
        Body::Value(AmqpValue(Value::Null)),
    );
    if let Some(ap) = message.application_properties.as_mut() {
        ap.0.insert(
            "error-condition".to_owned(),
            SimpleValue::String(condition.to_owned()),
        );
    }
    message
}

fn put_token(request: &AmqpMessage, connection: &Connection) -> AmqpMessage {
    if property(request, "operation") != Some("put-token") {
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
    let policies = &connection.ctx.policies;
    match connection.grants.put_token(token, policies, now_secs()) {
        Ok(()) => response(
            request,
            202,
            "Accepted",
            Body::Value(AmqpValue(Value::Null)),
        ),
        Err(e) => {
            tracing::debug!(peer = %connection.peer, reason = %e, "put-token refused");
            failure(request, 401, conditions::UNAUTHORIZED, &e.to_string())
        }
    }
}

/// Whether the request may read `hub`: its own `security_token`, or the connection's grants.
fn may_read(request: &AmqpMessage, connection: &Connection, hub: &str) -> Result<(), String> {
    let entity = hub.to_ascii_lowercase();
    let now = now_secs();
    if let Some(token) = property(request, "security_token") {
        let verified = crate::sas::verify(token, &connection.ctx.policies, now)
            .map_err(|e| e.to_string())
            .and_then(|grant| auth::check(&grant, &entity, READ, now));
        if verified.is_ok() {
            return Ok(());
        }
    }
    connection.grants.authorize(&entity, READ, now).map(|_| ())
}

fn management(request: &AmqpMessage, connection: &Connection) -> AmqpMessage {
    if !property(request, "operation").is_some_and(|o| o.eq_ignore_ascii_case("READ")) {
        return failure(
            request,
            400,
            conditions::NOT_IMPLEMENTED,
            "the only $management operation is READ",
        );
    }
    let Some(hub) = property(request, "name") else {
        return failure(
            request,
            400,
            conditions::ARGUMENT_ERROR,
            "the request names no event hub",
        );
    };
    if let Err(e) = may_read(request, connection, hub) {
        return failure(request, 401, conditions::UNAUTHORIZED, &e);
    }
    let broker = &connection.ctx.broker;
    let result = match property(request, "type") {
        Some("com.microsoft:eventhub") => broker.describe_hub(hub).map(|d| hub_map(&d)),
        Some("com.microsoft:partition") => {
            let Some(partition) = property(request, "partition") else {
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
    map.insert(key("name"), Value::String(definition.name.clone()));
    map.insert(key("type"), key("com.microsoft:eventhub"));
    map.insert(
        key("created_at"),
        Value::Timestamp(Timestamp::from_milliseconds(definition.created_at_ms)),
    );
    map.insert(
        key("partition_count"),
        Value::Int(i32::try_from(definition.partition_count).unwrap_or(i32::MAX)),
    );
    map.insert(key("partition_ids"), Value::Array(Array::from(ids)));
    map
}

fn partition_map(
    hub: &str,
    partition: &str,
    p: &tributary_broker::PartitionProperties,
) -> OrderedMap<Value, Value> {
    let mut map = OrderedMap::new();
    map.insert(key("name"), Value::String(hub.to_owned()));
    map.insert(key("type"), key("com.microsoft:partition"));
    map.insert(key("partition"), Value::String(partition.to_owned()));
    map.insert(
        key("begin_sequence_number"),
        Value::Long(p.begin_sequence_number),
    );
    map.insert(
        key("last_enqueued_sequence_number"),
        Value::Long(p.last_enqueued_sequence_number),
    );
    map.insert(
        key("last_enqueued_offset"),
        Value::String(
            p.last_enqueued_offset
                .map_or_else(|| "-1".to_owned(), |o| o.to_string()),
        ),
    );
    map.insert(
        key("last_enqueued_time_utc"),
        Value::Timestamp(Timestamp::from_milliseconds(
            p.last_enqueued_time_ms.unwrap_or(0),
        )),
    );
    map.insert(key("is_partition_empty"), Value::Bool(p.is_empty));
    map
}
