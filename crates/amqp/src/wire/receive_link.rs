//! Receive links: one partition of one consumer group, out of the broker to a client.
//!
//! # Guarantees
//! - A link attaches only with a grant for `Listen` (or `Manage`) on its entity; the start
//!   position comes from the selector filter (none: the end of the stream); the epoch from
//!   `com.microsoft:epoch`; the broker's epoch rules decide, and a refusal is the service's
//!   condition (`amqp:link:stolen`, `amqp:resource-limit-exceeded`, `amqp:not-found`, …).
//!   The grant is checked again before every batch the link delivers and when the grant's
//!   expiry passes while the link waits for events: once the token behind it expires without
//!   a renewal on `$cbs`, the link is closed with `amqp:unauthorized-access`.
//! - Deliveries are pre-settled (the link's sender settle mode is `settled`), sent only within
//!   the client's credit, in partition order, each stamped with `x-opt-sequence-number` (long),
//!   `x-opt-offset` (string), `x-opt-enqueued-time` (timestamp) and `x-opt-partition-key`; with
//!   the runtime-metric capability also the `last_enqueued_*` delivery annotations.
//! - A receiver displaced by a higher epoch is detached with `amqp:link:stolen` at once, whether
//!   it is waiting for events or for credit, and no event fetched before the displacement is
//!   delivered after it.

use std::collections::VecDeque;
use std::sync::Arc;

use fe2o3_amqp::Sender;
use fe2o3_amqp::acceptor::{
    LinkAcceptor, LinkEndpoint, ListenerSessionHandle, SupportedSenderSettleModes,
};
use fe2o3_amqp::link::delivery::Sendable;
use fe2o3_amqp_types::definitions::SenderSettleMode;
use fe2o3_amqp_types::messaging::Body;
use fe2o3_amqp_types::performatives::Attach;
use fe2o3_amqp_types::primitives::{Symbol, Value};
use serde_amqp::described::Described;
use serde_amqp::descriptor::Descriptor;
use tokio::task::JoinSet;
use tributary_broker::{ReceiveError, Receiver as BrokerReceiver, ReceiverSpec};
use tributary_event::{EventPosition, ReceivedEvent};

use super::message::message_for_delivery;
use super::{Connection, amqp_error, now_secs, shutting_down};
use crate::address::Node;
use crate::auth::LISTEN;
use crate::conditions::{self, Refusal};
use crate::limits::{CLOSE_TIMEOUT, RECEIVE_BATCH_EVENTS, RECEIVE_WAIT};
use crate::selector::parse_selector;

/// The capability a receiver desires to get last-enqueued-event delivery annotations.
pub(crate) const RUNTIME_METRIC: &str = "com.microsoft:enable-receiver-runtime-metric";
const EPOCH: &str = "com.microsoft:epoch";
const RECEIVER_NAME: &str = "com.microsoft:receiver-name";
const SELECTOR_NAME: &str = "apache.org:selector-filter:string";
const SELECTOR_CODE: u64 = 0x0000_468C_0000_0004;

/// The entity a receive link names.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    pub(crate) hub: String,
    pub(crate) group: String,
    pub(crate) partition: String,
}

impl Names {
    /// The entity path the link's `Listen` claim must cover.
    fn entity_path(&self) -> String {
        Node::ConsumerPartition {
            hub: self.hub.clone(),
            group: self.group.clone(),
            partition: self.partition.clone(),
        }
        .entity_path()
    }
}

/// What a receive link asked for in its attach.
#[derive(Debug)]
struct Request {
    start: EventPosition,
    epoch: Option<i64>,
    name: Option<String>,
    runtime_metric: bool,
}

fn is_selector(key: &Symbol, value: &Value) -> bool {
    if key.as_str() == SELECTOR_NAME {
        return true;
    }
    match value {
        Value::Described(d) => match &d.descriptor {
            Descriptor::Code(code) => *code == SELECTOR_CODE,
            Descriptor::Name(name) => name.as_str() == SELECTOR_NAME,
        },
        _ => false,
    }
}

/// The start position the link's selector filter names (none: latest).
fn start_position(attach: &Attach) -> Result<EventPosition, Refusal> {
    let argument = |e: String| Refusal::new(conditions::ARGUMENT_ERROR, e);
    let Some(filters) = attach.source.as_ref().and_then(|s| s.filter.as_ref()) else {
        return Ok(EventPosition::Latest);
    };
    let mut selectors = filters.iter().filter(|(k, v)| is_selector(k, v));
    let Some((_, value)) = selectors.next() else {
        return Ok(EventPosition::Latest);
    };
    if selectors.next().is_some() {
        return Err(argument(
            "the link has more than one selector filter".into(),
        ));
    }
    let expression = match value {
        Value::Described(d) => match &**d {
            Described {
                value: Value::String(s),
                ..
            } => s.as_str(),
            _ => return Err(argument("the selector filter must hold a string".into())),
        },
        Value::String(s) => s.as_str(),
        _ => return Err(argument("the selector filter must hold a string".into())),
    };
    parse_selector(expression).map_err(argument)
}

fn request(attach: &Attach) -> Result<Request, Refusal> {
    let start = start_position(attach)?;
    let property = |key: &str| {
        attach
            .properties
            .as_ref()
            .and_then(|p| p.get(&Symbol::from(key)).cloned())
    };
    let epoch = match property(EPOCH) {
        None | Some(Value::Null) => None,
        Some(Value::Long(e)) => Some(e),
        Some(Value::Int(e)) => Some(i64::from(e)),
        Some(_) => {
            let refusal = Refusal::new(
                conditions::ARGUMENT_ERROR,
                "com.microsoft:epoch must be a long",
            );
            return Err(refusal);
        }
    };
    let name = match property(RECEIVER_NAME) {
        Some(Value::String(s)) => Some(s),
        Some(Value::Symbol(s)) => Some(s.into_inner()),
        _ => None,
    };
    let runtime_metric = attach
        .desired_capabilities
        .as_ref()
        .is_some_and(|caps| caps.0.iter().any(|c| c.as_str() == RUNTIME_METRIC));
    Ok(Request {
        start,
        epoch,
        name,
        runtime_metric,
    })
}

/// Checks and attaches a client's receive link.
pub(crate) async fn attach(
    names: Names,
    attach: Attach,
    session: &mut ListenerSessionHandle,
    connection: &Arc<Connection>,
    links: &mut JoinSet<()>,
) -> Result<(), (Attach, Refusal)> {
    let (request, receiver) = match open(&names, &attach, connection) {
        Ok(opened) => opened,
        Err(refusal) => return Err((attach, refusal)),
    };
    let mut acceptor = LinkAcceptor::builder()
        .supported_sender_settle_modes(SupportedSenderSettleModes::Settled)
        .fallback_sender_settle_mode(SenderSettleMode::Settled);
    if request.runtime_metric {
        acceptor = acceptor.add_offered_capabilities(Symbol::from(RUNTIME_METRIC));
    }
    match acceptor
        .build()
        .accept_incoming_attach(attach, session)
        .await
    {
        Ok(LinkEndpoint::Sender(sender)) => {
            tracing::debug!(peer = %connection.peer, hub = %names.hub, group = %names.group, partition = %names.partition, epoch = ?request.epoch, "receive link attached");
            let link = ReceiveLink {
                sender,
                receiver,
                request,
                entity: names.entity_path(),
                connection: connection.clone(),
                shutdown: connection.ctx.shutdown.clone(),
            };
            links.spawn(link.run());
        }
        Ok(LinkEndpoint::Receiver(_)) => {
            tracing::warn!("a client receiver attached as a receiver; dropped")
        }
        Err(e) => tracing::debug!(error = %e, "receive link failed to attach"),
    }
    Ok(())
}

/// Whether the connection still holds a grant to listen on `entity`, and until when (Unix
/// seconds).
fn authorized(entity: &str, connection: &Connection) -> Result<i64, Refusal> {
    connection
        .grants
        .authorize(entity, LISTEN, now_secs())
        .map_err(|e| Refusal::new(conditions::UNAUTHORIZED, e))
}

/// Resolves once the grant valid until `until_secs` (Unix seconds) has expired, or after a day
/// at most (the caller checks again either way; SASL PLAIN grants never expire).
async fn grant_expired(until_secs: i64) {
    const CHECK_AT_LEAST_EVERY_S: i64 = 24 * 60 * 60;
    let left = until_secs
        .saturating_sub(now_secs())
        .clamp(0, CHECK_AT_LEAST_EVERY_S);
    tokio::time::sleep(std::time::Duration::from_secs(left.unsigned_abs())).await;
}

/// Authorizes the link and opens its broker receiver (which applies the epoch rules).
fn open(
    names: &Names,
    attach: &Attach,
    connection: &Connection,
) -> Result<(Request, BrokerReceiver), Refusal> {
    authorized(&names.entity_path(), connection)?;
    let request = request(attach)?;
    let spec = ReceiverSpec {
        hub: names.hub.clone(),
        consumer_group: names.group.clone(),
        partition: names.partition.clone(),
        start: request.start,
        owner_level: request.epoch,
        name: request.name.clone(),
    };
    let receiver = connection
        .ctx
        .broker
        .open_receiver(spec)
        .map_err(|e| conditions::from_broker(&e, request.name.as_deref()))?;
    Ok((request, receiver))
}

struct ReceiveLink {
    sender: Sender,
    receiver: BrokerReceiver,
    request: Request,
    /// The entity path, whose grant is checked again while the link lives.
    entity: String,
    connection: Arc<Connection>,
    shutdown: tokio::sync::watch::Receiver<bool>,
}

/// Why a receive link stops.
enum Stop {
    /// The client detached or the connection went away: nothing to send.
    Gone,
    /// Detach with this error.
    Detach(Refusal),
}

impl ReceiveLink {
    async fn run(mut self) {
        let stop = self.pump().await;
        if let Stop::Detach(refusal) = stop {
            tracing::debug!(condition = refusal.condition, description = %refusal.description, "detaching receive link");
            let close = self.sender.close_with_error(amqp_error(&refusal));
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, close).await;
        }
    }

    fn receive_failed(&self, error: ReceiveError) -> Stop {
        let name = self.request.name.as_deref();
        Stop::Detach(match error {
            ReceiveError::Disconnected(reason) => {
                conditions::from_disconnect(&reason, name, self.request.epoch)
            }
            ReceiveError::Broker(e) => conditions::from_broker(&e, name),
            other => Refusal::new(conditions::INTERNAL_ERROR, other.to_string()),
        })
    }

    async fn pump(&mut self) -> Stop {
        let mut pending: VecDeque<ReceivedEvent> = VecDeque::new();
        loop {
            let authorized_until = match authorized(&self.entity, &self.connection) {
                Ok(until) => until,
                Err(refusal) => return Stop::Detach(refusal),
            };
            let step = if pending.is_empty() {
                self.fill(&mut pending, authorized_until).await
            } else {
                self.deliver(&mut pending).await
            };
            if let Err(stop) = step {
                return stop;
            }
        }
    }

    /// Waits for events (or a displacement, a detach, shutdown, or the expiry of the grant
    /// valid until `authorized_until`, after which the caller checks the grants again).
    async fn fill(
        &mut self,
        pending: &mut VecDeque<ReceivedEvent>,
        authorized_until: i64,
    ) -> Result<(), Stop> {
        let shutdown = Refusal::new(conditions::DETACH_FORCED, "the broker is shutting down");
        tokio::select! {
            received = self.receiver.receive(RECEIVE_BATCH_EVENTS, RECEIVE_WAIT) => match received {
                Ok(events) => {
                    pending.extend(events);
                    Ok(())
                }
                Err(e) => Err(self.receive_failed(e)),
            },
            _ = self.sender.on_detach() => Err(Stop::Gone),
            () = shutting_down(&mut self.shutdown) => Err(Stop::Detach(shutdown)),
            () = grant_expired(authorized_until) => Ok(()),
        }
    }

    /// Sends the pending events as the client's credit allows, stopping the moment the broker
    /// disconnects the receiver (checked before every event and while waiting for credit).
    async fn deliver(&mut self, pending: &mut VecDeque<ReceivedEvent>) -> Result<(), Stop> {
        // Events already fetched from the broker are not delivered once a higher epoch has taken
        // the partition: the displaced client gets at most what was already on the wire.
        if let Some(reason) = self.receiver.disconnect_reason() {
            return Err(self.receive_failed(ReceiveError::Disconnected(reason)));
        }
        let runtime_metric = self.request.runtime_metric;
        let outcome = tokio::select! {
            biased;
            reason = self.receiver.disconnected() => Err(Some(reason)),
            sent = send_pending(&mut self.sender, &self.receiver, pending, runtime_metric) => sent,
            () = shutting_down(&mut self.shutdown) => {
                let refusal = Refusal::new(conditions::DETACH_FORCED, "the broker is shutting down");
                return Err(Stop::Detach(refusal));
            }
        };
        match outcome {
            Ok(()) => Ok(()),
            Err(Some(reason)) => Err(self.receive_failed(ReceiveError::Disconnected(reason))),
            Err(None) => Err(Stop::Gone),
        }
    }
}

/// Sends `pending` in order, each once the client gives credit; stops early with the reason if
/// the broker disconnects the receiver, or with `None` if the link is gone. Cancel-safe: an
/// event leaves `pending` only once it was handed to the engine.
async fn send_pending(
    sender: &mut Sender,
    receiver: &BrokerReceiver,
    pending: &mut VecDeque<ReceivedEvent>,
    runtime_metric: bool,
) -> Result<(), Option<tributary_broker::DisconnectReason>> {
    while let Some(event) = pending.front() {
        if let Some(reason) = receiver.disconnect_reason() {
            return Err(Some(reason));
        }
        let runtime = runtime_metric.then(|| receiver.last_enqueued()).flatten();
        let message = message_for_delivery(event, runtime.as_ref());
        let sendable: Sendable<Body<Value>> =
            Sendable::builder().message(message).settled(true).build();
        if let Err(e) = sender.send_ref(&sendable).await {
            tracing::debug!(error = %e, "receive link ended while sending");
            return Err(None);
        }
        pending.pop_front();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp_types::messaging::Source;
    use fe2o3_amqp_types::primitives::{Array, OrderedMap};

    fn attach_with(filter: Option<(Symbol, Value)>, properties: Vec<(&str, Value)>) -> Attach {
        let mut source = Source::default();
        if let Some((k, v)) = filter {
            let mut set = OrderedMap::new();
            set.insert(k, v);
            source.filter = Some(set);
        }
        let mut fields = OrderedMap::new();
        for (k, v) in properties {
            fields.insert(Symbol::from(k), v);
        }
        Attach {
            name: "l".into(),
            handle: 0.into(),
            role: fe2o3_amqp_types::definitions::Role::Receiver,
            snd_settle_mode: SenderSettleMode::Unsettled,
            rcv_settle_mode: fe2o3_amqp_types::definitions::ReceiverSettleMode::First,
            source: Some(Box::new(source)),
            target: None,
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: None,
            max_message_size: None,
            offered_capabilities: None,
            desired_capabilities: Some(Array::from(vec![Symbol::from(RUNTIME_METRIC)])),
            properties: Some(fields),
        }
    }

    fn described(descriptor: Descriptor, text: &str) -> Value {
        Value::Described(Box::new(Described {
            descriptor,
            value: Value::String(text.into()),
        }))
    }

    #[test]
    fn filters_epochs_and_capabilities_are_read() {
        let code = described(
            Descriptor::Code(SELECTOR_CODE),
            "amqp.annotation.x-opt-offset > '-1'",
        );
        let a = attach_with(
            Some((Symbol::from(SELECTOR_NAME), code)),
            vec![
                (EPOCH, Value::Long(3)),
                (RECEIVER_NAME, Value::String("r".into())),
            ],
        );
        let r = request(&a).unwrap();
        assert_eq!(r.start, EventPosition::Earliest);
        assert_eq!(r.epoch, Some(3));
        assert_eq!(r.name.as_deref(), Some("r"));
        assert!(r.runtime_metric);

        let named = described(
            Descriptor::Name(Symbol::from(SELECTOR_NAME)),
            "amqp.annotation.x-opt-sequence-number >= '5'",
        );
        let a = attach_with(Some((Symbol::from("other-key"), named)), vec![]);
        assert_eq!(
            request(&a).unwrap().start,
            EventPosition::SequenceNumber {
                sequence_number: 5,
                inclusive: true
            }
        );
        assert_eq!(
            request(&attach_with(None, vec![])).unwrap().start,
            EventPosition::Latest
        );
    }

    #[test]
    fn bad_filters_and_epochs_are_argument_errors() {
        let bad = described(
            Descriptor::Code(SELECTOR_CODE),
            "amqp.annotation.x-opt-offset < '1'",
        );
        let a = attach_with(Some((Symbol::from(SELECTOR_NAME), bad)), vec![]);
        assert_eq!(
            request(&a).unwrap_err().condition,
            conditions::ARGUMENT_ERROR
        );
        let a = attach_with(None, vec![(EPOCH, Value::String("1".into()))]);
        assert_eq!(
            request(&a).unwrap_err().condition,
            conditions::ARGUMENT_ERROR
        );
    }
}
