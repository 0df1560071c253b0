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

use bytes::Bytes;
use fe2o3_amqp_types::performatives::Attach;
use fe2o3_amqp_types::primitives::{Symbol, Value};
use serde_amqp::described::Described;
use serde_amqp::descriptor::Descriptor;
use tokio::sync::{mpsc, oneshot, watch};
use tributary_amqp_engine::{Connection, LinkId};
use tributary_broker::throttle::{Admit, Cost, Direction};
use tributary_broker::{
    DisconnectWatch, LastEnqueuedEvent, ReceiveError, Receiver as BrokerReceiver, ReceiverSpec,
};
use tributary_event::EventPosition;

use super::send_link::DOOR;

use super::{Command, ConnectionState, LinkRef, now_secs, shutting_down};
use crate::auth::LISTEN;
use crate::conditions::{self, Refusal};
use crate::limits::{RECEIVE_BATCH_EVENTS, RECEIVE_WAIT};
use tributary_eventhubs::LastEnqueued;
use tributary_eventhubs::address::Node;
use tributary_eventhubs::deliver::write_delivery_message_head;
use tributary_eventhubs::names::link::{
    EPOCH, RECEIVER_NAME, RUNTIME_METRIC_CAPABILITY as RUNTIME_METRIC,
    SELECTOR_FILTER_CODE as SELECTOR_CODE, SELECTOR_FILTER_KEY as SELECTOR_NAME,
};
use tributary_eventhubs::selector;

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

/// The start position the link's selector filter names. A link with no selector starts at the
/// beginning of the partition, as Event Hubs does: the SDKs' low-level receivers attach their link
/// only at the first receive and must still see what was sent before it.
fn start_position(attach: &Attach) -> Result<EventPosition, Refusal> {
    let argument = |e: String| Refusal::new(conditions::ARGUMENT_ERROR, e);
    let Some(filters) = attach.source.as_ref().and_then(|s| s.filter.as_ref()) else {
        return Ok(EventPosition::Earliest);
    };
    let mut selectors = filters.iter().filter(|(k, v)| is_selector(k, v));
    let Some((_, value)) = selectors.next() else {
        return Ok(EventPosition::Earliest);
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
    selector::parse(expression).map_err(|e| argument(e.to_string()))
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
                format!("{EPOCH} must be a long"),
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

/// Checks a client's receive link, opens its broker receiver (which applies the epoch rules)
/// and starts the link's task; returns the connection's side of it and whether the client asked
/// for the runtime metric.
pub(crate) fn attach(
    names: Names,
    attach: &Attach,
    link: LinkRef,
    connection: &Arc<ConnectionState>,
    commands: &mpsc::UnboundedSender<Command>,
) -> Result<(ReceiveLinkHandle, bool), Refusal> {
    let (request, receiver) = open(&names, attach, connection)?;
    tracing::debug!(peer = %connection.peer, hub = %names.hub, group = %names.group, partition = %names.partition, epoch = ?request.epoch, "receive link attached");
    let (allowed, allowed_rx) = watch::channel(0);
    let (gone, gone_rx) = oneshot::channel();
    let handle = ReceiveLinkHandle {
        pending: VecDeque::new(),
        handed: 0,
        allowed,
        disconnect: receiver.disconnect_watch(),
        _gone: gone,
        _place: receiver.place(),
    };
    let runtime_metric = request.runtime_metric;
    let pump = Pump {
        receiver,
        request,
        entity: names.entity_path(),
        hub: names.hub.clone(),
        link,
        connection: connection.clone(),
        commands: commands.clone(),
        allowed: allowed_rx,
        gone: gone_rx,
    };
    tokio::spawn(pump.run());
    Ok((handle, runtime_metric))
}

/// Messages the link's task fetched and encoded: message `i` is `heads[ends[i-1]..ends[i]]`
/// followed by `bodies[i]` (empty when its head holds all of it). A body stays where the log's
/// read left it: the connection hands it to the socket as it is (or, if short, copies it into
/// the frame; [`Connection::send_parts`]).
#[derive(Debug)]
pub(crate) struct Encoded {
    heads: Vec<u8>,
    ends: Vec<usize>,
    bodies: Vec<Bytes>,
}

impl Encoded {
    /// The bytes of every message together: what the egress limits count.
    fn bytes(&self) -> u64 {
        (self.heads.len() + self.bodies.iter().map(Bytes::len).sum::<usize>()) as u64
    }
}

/// Encoded messages waiting for credit, sent from `next`.
#[derive(Debug)]
struct Fetched {
    encoded: Encoded,
    next: usize,
}

/// The connection's side of a receive link: what the task fetched waits here for credit, and
/// the task learns how far it may read ahead (`allowed`: handed out + credit).
#[derive(Debug)]
pub(crate) struct ReceiveLinkHandle {
    pending: VecDeque<Fetched>,
    /// Messages handed to the engine so far.
    handed: u64,
    /// How many messages the task may have fetched in all.
    allowed: watch::Sender<u64>,
    /// Whether the broker disconnected the receiver (a higher epoch took the partition).
    disconnect: DisconnectWatch,
    /// Dropped with the handle: the task stops.
    _gone: oneshot::Sender<()>,
    /// Dropped with the handle (the link is gone): the receiver's place is free at once, before
    /// the task has stopped, so the client's next receiver is counted without it.
    _place: tributary_broker::ReceiverPlace,
}

impl ReceiveLinkHandle {
    /// Messages the task fetched, in order.
    pub(crate) fn queue(&mut self, encoded: Encoded) {
        if !encoded.ends.is_empty() {
            self.pending.push_back(Fetched { encoded, next: 0 });
        }
    }

    /// Sends what is pending as far as the credit and the session's window go (what the
    /// window does not take yet waits here, uncopied, for [`tributary_amqp_engine::Event::Credit`]),
    /// answers a drain, and tells the task how far it may read. Once the broker has disconnected
    /// the receiver nothing more is sent (the task detaches the link with the reason).
    pub(crate) fn flush(&mut self, connection: &mut Connection, link: LinkId) {
        if self.disconnect.reason().is_some() {
            self.pending.clear();
            return;
        }
        while connection.credit(link) > 0 && connection.window_open(link.session) {
            let Some(fetched) = self.pending.front_mut() else {
                break;
            };
            let encoded = &fetched.encoded;
            let start = fetched.next.checked_sub(1).map_or(0, |i| encoded.ends[i]);
            let head = &encoded.heads[start..encoded.ends[fetched.next]];
            let body = &encoded.bodies[fetched.next];
            if connection.send_parts(link, true, 0, head, body).is_err() {
                return;
            }
            self.handed += 1;
            fetched.next += 1;
            if fetched.next == encoded.ends.len() {
                self.pending.pop_front();
            }
        }
        if self.pending.is_empty() && connection.drain_requested(link) {
            let _ = connection.drained(link);
        }
        let allowed = self.handed + u64::from(connection.credit(link));
        self.allowed.send_if_modified(|current| {
            let changed = *current != allowed;
            *current = allowed;
            changed
        });
    }
}

/// Whether the connection still holds a grant to listen on `entity`, and until when (Unix
/// seconds).
fn authorized(entity: &str, connection: &ConnectionState) -> Result<i64, Refusal> {
    connection.grants.authorize(entity, LISTEN, now_secs())
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
    connection: &ConnectionState,
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

/// A receive link's task: reads the partition within the client's credit and hands the
/// encoded messages to the connection.
struct Pump {
    receiver: BrokerReceiver,
    request: Request,
    /// The entity path, whose grant is checked again while the link lives.
    entity: String,
    /// The hub read, whose egress limits pace the deliveries.
    hub: String,
    link: LinkRef,
    connection: Arc<ConnectionState>,
    commands: mpsc::UnboundedSender<Command>,
    allowed: watch::Receiver<u64>,
    gone: oneshot::Receiver<()>,
}

impl Pump {
    async fn run(mut self) {
        if let Some(refusal) = self.pump().await {
            let _ = self.commands.send(Command::Detach {
                link: self.link,
                refusal,
            });
        }
    }

    fn receive_failed(&self, error: ReceiveError) -> Refusal {
        let name = self.request.name.as_deref();
        match error {
            ReceiveError::Disconnected(reason) => {
                conditions::from_disconnect(&reason, name, self.request.epoch)
            }
            ReceiveError::Broker(e) => conditions::from_broker(&e, name),
            other => Refusal::new(conditions::INTERNAL_ERROR, other.to_string()),
        }
    }

    /// The events as delivery messages: each one's head encoded, its body kept as it is.
    fn encode(&self, events: Vec<tributary_event::ReceivedEvent>) -> Encoded {
        let runtime = if self.request.runtime_metric {
            self.receiver.last_enqueued().map(runtime_metric)
        } else {
            None
        };
        // A plain event's head (three annotations and the data section's header) takes about
        // 100 bytes: room for that up front, so the buffer rarely grows (and copies) meanwhile.
        let mut heads = Vec::with_capacity(events.len() * 128);
        let mut ends = Vec::with_capacity(events.len());
        let mut bodies = Vec::with_capacity(events.len());
        for mut event in events {
            let body_follows = write_delivery_message_head(&event, runtime.as_ref(), &mut heads);
            ends.push(heads.len());
            bodies.push(if body_follows {
                std::mem::take(&mut event.data.body)
            } else {
                Bytes::new()
            });
        }
        Encoded {
            heads,
            ends,
            bodies,
        }
    }

    /// Charges a batch about to be delivered to the hub's and namespace's egress limits and
    /// waits until it is within them (reads are slowed, never refused). Ends early, with what
    /// [`Pump::pump`] returns, if the link goes, is displaced or the broker shuts down: no
    /// event is delivered after a displacement.
    async fn pace(&mut self, events: u64, bytes: u64) -> Result<(), Option<Refusal>> {
        let throttle = self.connection.ctx.broker.throttle();
        if !throttle.limits_hub(&self.hub, Direction::Egress) {
            return Ok(());
        }
        let cost = Cost { events, bytes };
        let now = tokio::time::Instant::now();
        let Ok(wait) = throttle.admit(DOOR, &self.hub, Direction::Egress, cost, Admit::Always, now)
        else {
            return Ok(());
        };
        if wait.is_zero() {
            return Ok(());
        }
        let mut shutdown = self.connection.ctx.shutdown.clone();
        tokio::select! {
            () = tokio::time::sleep(wait) => Ok(()),
            _ = &mut self.gone => Err(None),
            reason = self.receiver.disconnected() => {
                Err(Some(self.receive_failed(ReceiveError::Disconnected(reason))))
            }
            () = shutting_down(&mut shutdown) => Err(Some(Refusal::new(
                conditions::DETACH_FORCED,
                "the broker is shutting down",
            ))),
        }
    }

    /// Runs until the link is gone (`None`) or must be detached with a refusal.
    async fn pump(&mut self) -> Option<Refusal> {
        let mut shutdown = self.connection.ctx.shutdown.clone();
        let forced = || Refusal::new(conditions::DETACH_FORCED, "the broker is shutting down");
        let mut fetched: u64 = 0;
        loop {
            let authorized_until = match authorized(&self.entity, &self.connection) {
                Ok(until) => until,
                Err(refusal) => return Some(refusal),
            };
            let allowed = *self.allowed.borrow_and_update();
            if fetched >= allowed {
                // Waiting for credit: also for a displacement, the link's end, shutdown, or the
                // grant's expiry (then the grants are checked again).
                tokio::select! {
                    changed = self.allowed.changed() => if changed.is_err() { return None },
                    _ = &mut self.gone => return None,
                    reason = self.receiver.disconnected() => {
                        return Some(self.receive_failed(ReceiveError::Disconnected(reason)));
                    }
                    () = shutting_down(&mut shutdown) => return Some(forced()),
                    () = grant_expired(authorized_until) => {}
                }
                continue;
            }
            let want = usize::try_from(allowed - fetched)
                .unwrap_or(usize::MAX)
                .min(RECEIVE_BATCH_EVENTS);
            tokio::select! {
                received = self.receiver.receive(want, RECEIVE_WAIT) => match received {
                    Ok(events) if events.is_empty() => {}
                    Ok(events) => {
                        fetched += events.len() as u64;
                        let encoded = self.encode(events);
                        if let Err(end) = self.pace(encoded.ends.len() as u64, encoded.bytes()).await {
                            return end;
                        }
                        let deliver = Command::Deliver { link: self.link, encoded };
                        if self.commands.send(deliver).is_err() {
                            return None;
                        }
                    }
                    Err(e) => return Some(self.receive_failed(e)),
                },
                _ = &mut self.gone => return None,
                () = shutting_down(&mut shutdown) => return Some(forced()),
                () = grant_expired(authorized_until) => {}
            }
        }
    }
}

/// The broker's last-enqueued event as the runtime-metric annotations carry it.
fn runtime_metric(last: LastEnqueuedEvent) -> LastEnqueued {
    LastEnqueued {
        sequence_number: last.sequence_number,
        offset: last.offset,
        enqueued_time_ms: last.enqueued_time_ms,
        retrieved_time_ms: last.retrieved_time_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp_types::definitions::SenderSettleMode;
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
            EventPosition::Earliest
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
