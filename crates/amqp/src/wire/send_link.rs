//! Send links: a client's messages into the broker.
//!
//! # Guarantees
//! - A link attaches only with a grant for `Send` (or `Manage`) on its entity, to an existing
//!   hub and a valid partition; otherwise it is refused (`amqp:unauthorized-access`,
//!   `amqp:not-found`, `com.microsoft:argument-out-of-range`). The grant is checked again for
//!   every delivery: once the token behind it expires without a renewal on `$cbs`, the next
//!   delivery is not appended and the link is closed with `amqp:unauthorized-access`.
//! - `max-message-size` is 1 MiB; a larger message detaches the link with
//!   `amqp:link:message-size-exceeded` (done by the engine).
//! - A delivery is settled `accepted` only after [`Broker::send`] returned, i.e. once the append
//!   is durable; otherwise it is `rejected` with the condition of the failure. A batched
//!   transfer is all or nothing.
//! - Deliveries of one link are appended in the order they arrived, so events with one
//!   partition key keep their order. Appends are pipelined: up to [`SEND_PIPELINE_MAX`]
//!   deliveries of a link are in flight at once (issued to the log in arrival order, each
//!   settled once its own append is durable, settlements in arrival order), so a client that
//!   does not wait for each settlement shares fsyncs instead of paying one per delivery.
//! - Under an ingress limit ([`tributary_broker::throttle`]) a delivery is appended once its
//!   turn comes, up to [`THROTTLE_WAIT_MAX`] later; one that would wait longer is rejected
//!   with `com.microsoft:server-busy` (Event Hubs' error 50002) and nothing of it is appended.
//!
//! [`Broker::send`]: tributary_broker::Broker::send

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use bytes::Bytes;
use tokio::sync::mpsc;
use tributary_amqp_codec::performative::ACCEPTED;
use tributary_amqp_engine::connection::Delivery;
use tributary_amqp_engine::{Connection, LinkId};
use tributary_broker::{Broker, SendTarget};
use tributary_event::names::parse_partition_id;

use super::nodes::rejected;
use super::{Command, ConnectionState, LinkRef, now_secs};
use crate::auth::SEND;
use crate::conditions::{self, Refusal};
use crate::limits::{SEND_LINK_CREDIT, SEND_PIPELINE_MAX, THROTTLE_WAIT_MAX};
use tributary_broker::throttle::{Admit, Cost, Direction};
use tributary_eventhubs::address::Node;
use tributary_eventhubs::ingest::{events_of, has_structured_body};

/// Where a send link's messages go.
#[derive(Debug, Clone)]
struct SendTo {
    hub: String,
    partition: Option<String>,
    /// The entity path the link's `Send` claim must cover, on attach and on every delivery.
    entity: String,
}

/// One message from the client, on its way to the link's task.
#[derive(Debug)]
struct Incoming {
    delivery_id: u32,
    settled: bool,
    format: u32,
    payload: Bytes,
}

/// The connection's side of a send link: deliveries go to the link's task, settlements come
/// back as [`Command::Settle`].
#[derive(Debug)]
pub(crate) struct SendLinkHandle {
    /// `None` once the link drains for shutdown: the task finishes what it has and ends.
    deliveries: Option<mpsc::UnboundedSender<Incoming>>,
    /// Deliveries handed to the task and not finished yet.
    in_task: u32,
}

impl SendLinkHandle {
    /// A message arrived on the link.
    pub(crate) fn deliver(&mut self, connection: &mut Connection, delivery: Delivery) {
        let incoming = Incoming {
            delivery_id: delivery.delivery_id,
            settled: delivery.settled,
            format: delivery.message_format,
            payload: delivery.payload,
        };
        // While draining, a message that still arrives is not appended; it stays unsettled, and
        // the detach that ends the drain tells the client to send it again.
        if let Some(deliveries) = &self.deliveries
            && deliveries.send(incoming).is_ok()
        {
            self.in_task += 1;
        }
        self.top_up(connection, delivery.link);
    }

    /// The server is shutting down: no more deliveries to the task, and no more credit (what
    /// the client holds is not revoked: a transfer it sent meanwhile would then exceed the
    /// link's credit, and the engine would detach the link before its settlements). The task
    /// finishes the appends it issued, settles them, and then asks for the link's detach (see
    /// [`run`]), so nothing appended goes unacknowledged.
    pub(crate) fn drain(&mut self) {
        self.deliveries = None;
    }

    /// The task finished `finished` deliveries; those of `delivery_ids` (the unsettled ones)
    /// are settled with `outcome`, in runs of consecutive ids.
    pub(crate) fn settle(
        &mut self,
        connection: &mut Connection,
        link: LinkId,
        delivery_ids: &[u32],
        finished: u32,
        outcome: Result<(), Refusal>,
    ) {
        let state = match &outcome {
            Ok(()) => ACCEPTED.to_vec(),
            Err(refusal) => {
                tracing::debug!(condition = refusal.condition, description = %refusal.description, "delivery rejected");
                rejected(refusal)
            }
        };
        let mut runs = delivery_ids.iter().copied().peekable();
        while let Some(first) = runs.next() {
            let mut last = first;
            while runs.peek() == Some(&last.wrapping_add(1)) {
                last = runs.next().expect("peeked");
            }
            let _ = connection.disposition(link.session, true, first, last, true, Some(&state));
        }
        self.in_task = self.in_task.saturating_sub(finished);
        self.top_up(connection, link);
    }

    /// Keeps credit plus deliveries in the task at [`SEND_LINK_CREDIT`], topped up once half
    /// is used: a client can keep that many deliveries in flight, and no more wait here.
    fn top_up(&mut self, connection: &mut Connection, link: LinkId) {
        let granted = connection.granted(link);
        if self.deliveries.is_some() && granted + self.in_task <= SEND_LINK_CREDIT / 2 {
            let _ = connection.flow(link, SEND_LINK_CREDIT.saturating_sub(self.in_task));
        }
    }
}

/// Checks a client's send link to `node` (a hub or one of its partitions) and starts its task.
pub(crate) fn attach(
    node: &Node,
    link: LinkRef,
    connection: &Arc<ConnectionState>,
    commands: &mpsc::UnboundedSender<Command>,
) -> Result<SendLinkHandle, Refusal> {
    let to = match node {
        Node::Hub { hub } => SendTo {
            hub: hub.clone(),
            partition: None,
            entity: node.entity_path(),
        },
        Node::HubPartition { hub, partition } => SendTo {
            hub: hub.clone(),
            partition: Some(partition.clone()),
            entity: node.entity_path(),
        },
        _ => return Err(Refusal::new(conditions::NOT_ALLOWED, "not a send entity")),
    };
    check(&to, connection)?;
    tracing::debug!(peer = %connection.peer, hub = %to.hub, partition = ?to.partition, "send link attached");
    let (deliveries, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(rx, to, link, connection.clone(), commands.clone()));
    Ok(SendLinkHandle {
        deliveries: Some(deliveries),
        in_task: 0,
    })
}

/// Authorization first (so an unauthorized client learns nothing about entities), then the
/// entity.
fn check(to: &SendTo, connection: &ConnectionState) -> Result<(), Refusal> {
    authorized(to, connection)?;
    let definition = connection
        .ctx
        .broker
        .describe_hub(&to.hub)
        .map_err(|e| conditions::from_broker(&e, None))?;
    if let Some(partition) = &to.partition {
        parse_partition_id(partition, definition.partition_count)
            .map_err(|e| Refusal::new(conditions::ARGUMENT_OUT_OF_RANGE, e.to_string()))?;
    }
    Ok(())
}

/// Whether the connection still holds a grant to send to the link's entity: checked on attach
/// and again for every delivery, so a link outlives its token only until the next message.
fn authorized(to: &SendTo, connection: &ConnectionState) -> Result<(), Refusal> {
    connection
        .grants
        .authorize(&to.entity, SEND, now_secs())
        .map(|_| ())
}

/// An append that was issued and is not settled yet.
type Append<'a> = Pin<Box<dyn Future<Output = Result<(), Refusal>> + Send + 'a>>;

/// One delivery between its arrival and its settlement.
struct InFlight<'a> {
    delivery_id: u32,
    settled: bool,
    /// The append's outcome once known; `None` while it is in flight.
    outcome: Option<Result<(), Refusal>>,
    append: Option<Append<'a>>,
}

async fn run(
    mut deliveries: mpsc::UnboundedReceiver<Incoming>,
    to: SendTo,
    link: LinkRef,
    connection: Arc<ConnectionState>,
    commands: mpsc::UnboundedSender<Command>,
) {
    let broker = &connection.ctx.broker;
    let mut in_flight: VecDeque<InFlight<'_>> = VecDeque::with_capacity(SEND_PIPELINE_MAX);
    loop {
        let room = in_flight.len() < SEND_PIPELINE_MAX;
        let busy = !in_flight.is_empty();
        tokio::select! {
            incoming = deliveries.recv(), if room => {
                let Some(incoming) = incoming else { break };
                if let Err(refusal) = authorized(&to, &connection) {
                    // The token expired (or was never renewed): nothing of this delivery is
                    // appended; the link is closed with the reason.
                    let _ = commands.send(Command::Detach { link, refusal });
                    break;
                }
                let Incoming { delivery_id, settled, format, payload } = incoming;
                let append = append(broker, &to, format, payload);
                in_flight.push_back(issue(delivery_id, settled, append).await);
            }
            () = front_done(&mut in_flight), if busy => {
                settle_done(link, &commands, &mut in_flight).await;
            }
        }
    }
    // The link is gone, lost its grant or drains for shutdown: what was issued is finished
    // (its events stay in the log) and settled if the link still stands.
    while !in_flight.is_empty() {
        front_done(&mut in_flight).await;
        settle_done(link, &commands, &mut in_flight).await;
    }
    if *connection.ctx.shutdown.borrow() {
        // Drained: the settlements above go out before this detach (one command queue).
        let refusal = Refusal::new(conditions::DETACH_FORCED, "the broker is shutting down");
        let _ = commands.send(Command::Detach { link, refusal });
    }
}

/// Polls a new append once, which issues it to the log (`Broker::send` appends before its first
/// await), so appends are issued in the order the deliveries arrived.
async fn issue<'a>(
    delivery_id: u32,
    settled: bool,
    append: impl Future<Output = Result<(), Refusal>> + Send + 'a,
) -> InFlight<'a> {
    let mut append: Append<'a> = Box::pin(append);
    let first = std::future::poll_fn(|cx| Poll::Ready(append.as_mut().poll(cx))).await;
    let (outcome, append) = match first {
        Poll::Ready(outcome) => (Some(outcome), None),
        Poll::Pending => (None, Some(append)),
    };
    InFlight {
        delivery_id,
        settled,
        outcome,
        append,
    }
}

/// Waits until the oldest delivery's append has an outcome. Cancel-safe: the append stays in
/// the queue.
async fn front_done(in_flight: &mut VecDeque<InFlight<'_>>) {
    let Some(front) = in_flight.front_mut() else {
        return std::future::pending().await;
    };
    if front.outcome.is_none() {
        let append = front
            .append
            .as_mut()
            .expect("an unsettled append is in flight");
        let outcome = append.await;
        front.outcome = Some(outcome);
        front.append = None;
    }
}

/// Settles, in arrival order, every delivery at the front whose append has an outcome: runs of
/// accepted ones with one command, rejected ones one by one.
async fn settle_done(
    link: LinkRef,
    commands: &mpsc::UnboundedSender<Command>,
    in_flight: &mut VecDeque<InFlight<'_>>,
) {
    let settle = |delivery_ids: Vec<u32>, finished: u32, outcome: Result<(), Refusal>| {
        let _ = commands.send(Command::Settle {
            link,
            delivery_ids,
            finished,
            outcome,
        });
    };
    // The run of accepted deliveries not settled yet: the unsettled ones' ids, and how many
    // deliveries it covers (pre-settled ones included).
    let mut accepted = Vec::new();
    let mut finished = 0u32;
    while let Some(front) = in_flight.front_mut() {
        if front.outcome.is_none() {
            // Appends complete in order per partition, not across partitions: look again.
            let Some(append) = front.append.as_mut() else {
                break;
            };
            match std::future::poll_fn(|cx| Poll::Ready(append.as_mut().poll(cx))).await {
                Poll::Ready(outcome) => front.outcome = Some(outcome),
                Poll::Pending => break,
            }
        }
        let done = in_flight.pop_front().expect("the front exists");
        match done.outcome.expect("the outcome is known") {
            Ok(()) => {
                finished += 1;
                if !done.settled {
                    accepted.push(done.delivery_id);
                }
            }
            Err(refusal) => {
                if finished > 0 {
                    settle(std::mem::take(&mut accepted), finished, Ok(()));
                    finished = 0;
                }
                let ids = if done.settled {
                    vec![]
                } else {
                    vec![done.delivery_id]
                };
                settle(ids, 1, Err(refusal));
            }
        }
    }
    if finished > 0 {
        settle(accepted, finished, Ok(()));
    }
}

/// Refuses an `amqp-value` or `amqp-sequence` body on a compacted hub: the event's body would
/// be empty, and with its key it would read as a tombstone and remove the key's events.
fn refuse_structured_body_if_compacted(broker: &Broker, hub: &str) -> Result<(), Refusal> {
    match broker.describe_hub(hub) {
        Ok(definition) if definition.cleanup.policy.compacts() => Err(Refusal::new(
            conditions::ARGUMENT_ERROR,
            format!(
                "event hub {:?} is compacted: an event's body must be data sections (an amqp-value or amqp-sequence body would be stored as an empty body, which with a key is a tombstone)",
                definition.name
            ),
        )),
        // A hub that does not compact, or that the send will find missing and say so.
        _ => Ok(()),
    }
}

/// The door's name in the throttle's counters.
pub(crate) const DOOR: &str = "amqp";

/// Charges a delivery to the namespace's and the hub's ingress limits
/// ([`tributary_broker::throttle`]). Within them, or within [`THROTTLE_WAIT_MAX`] of them,
/// returns once the delivery's turn comes (so a client sending faster than the limit is paced
/// by its settlements); beyond, refuses it with `com.microsoft:server-busy` in the service's
/// words, which the SDKs retry after a pause of their own (the Python SDK's: 4 s).
async fn throttle_ingress(broker: &Broker, hub: &str, cost: Cost) -> Result<(), Refusal> {
    let throttle = broker.throttle();
    if !throttle.limits_hub(hub, Direction::Ingress) {
        return Ok(());
    }
    let now = tokio::time::Instant::now();
    let admit = Admit::Within(THROTTLE_WAIT_MAX);
    match throttle.admit(DOOR, hub, Direction::Ingress, cost, admit, now) {
        Ok(wait) => {
            tokio::time::sleep(wait).await;
            Ok(())
        }
        Err(throttled) => {
            let secs = throttled.retry_after.as_secs() + 1;
            Err(Refusal::new(
                conditions::SERVER_BUSY,
                format!(
                    "The request was terminated because the entity is being throttled. Error code : 50002. Please wait {secs} seconds and try again."
                ),
            ))
        }
    }
}

/// Appends one delivery's events; returns once they are durable.
async fn append(broker: &Broker, to: &SendTo, format: u32, payload: Bytes) -> Result<(), Refusal> {
    let route_by_key = to.partition.is_none();
    let (key, events) = events_of(&payload, format, route_by_key)?;
    let cost = Cost {
        events: events.len() as u64,
        bytes: payload.len() as u64,
    };
    drop(payload);
    throttle_ingress(broker, &to.hub, cost).await?;
    if events.iter().any(has_structured_body) {
        refuse_structured_body_if_compacted(broker, &to.hub)?;
    }
    let target = match (&to.partition, key) {
        (Some(partition), _) => SendTarget::Partition(partition.clone()),
        (None, Some(key)) => SendTarget::PartitionKey(key),
        (None, None) => SendTarget::RoundRobin,
    };
    broker
        .send(&to.hub, target, events)
        .await
        .map(|_| ())
        .map_err(|e| {
            let refusal = conditions::from_broker(&e, None);
            if refusal.condition == tributary_eventhubs::condition::INTERNAL_ERROR {
                // The log could not write (a full disk, a failed sync): the client gets the
                // refusal, and the operator must see it too.
                tracing::warn!(hub = %to.hub, error = %e, "an append failed; the send was refused");
            }
            refusal
        })
}
