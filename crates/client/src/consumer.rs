//! [`ConsumerClient`] and its [`EventReceiver`]s: reading partitions from a start position, with
//! or without an owner level (epoch).
//!
//! # Flow control
//! A receiver grants the hub `prefetch` credits when it attaches. [`EventReceiver::receive`]
//! grants back what it took once that reaches half of `prefetch`, or whenever it has taken
//! everything that had arrived, so the events waiting in the client plus the hub's credit
//! never exceed `prefetch`: at most `prefetch` events are ever buffered ahead of the caller.
//!
//! # Epochs and ownership
//! A receiver opened with `owner_level = Some(e)` sends `com.microsoft:epoch = e` (a long). When
//! the hub detaches it with `amqp:link:stolen` — a receiver with an equal or higher owner level
//! took the partition, or this one was refused — `receive` returns
//! [`ClientError::OwnershipLost`], and so does every later call: the receiver is finished and
//! never re-attaches by itself. Any other failure is also final for that receiver; open a new
//! one (the connection underneath reconnects on its own). Events the hub had already
//! transferred before its detach (at most its outstanding credit) are still returned first, in order: AMQP
//! delivers frames in sequence, and the detach comes after them.
//!
//! # Refusals
//! A hub refuses a receiver (unknown consumer group, lower epoch, quota, …) either by failing
//! the attach — then [`ConsumerClient::open_receiver`] returns the error — or, as Tributary's
//! AMQP front door does, by completing the attach and detaching at once; then the first
//! [`EventReceiver::receive`] returns it. Callers must handle both; the processor host does.
//!
//! # Runtime metric
//! With `track_last_enqueued`, the receiver asks for `com.microsoft:enable-receiver-runtime-metric`
//! and [`EventReceiver::last_enqueued`] reports the partition's newest event as of the latest
//! delivery.
//!
//! # Memory
//! An event's body is not copied out of what the connection read: it is a view of one socket
//! read (up to 128 KiB), which stays allocated while any event read from it is held. An
//! application that keeps a few events for long, apart from the rest, can copy their bodies
//! (`Bytes::copy_from_slice`) to let the reads go.
//!
//! # Cancellation
//! Dropping a `receive` future part-way loses nothing: events that arrived stay buffered in
//! the receiver for the next call.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fe2o3_amqp_types::definitions::{Fields, Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{Source, Target as TargetTerminus};
use fe2o3_amqp_types::primitives::{Array, Symbol, Value};
use tributary_amqp_engine::connection::attach_frame;
use tributary_event::{Clock, EventPosition, ReceivedEvent, SystemClock};
use tributary_source::{LastEnqueuedEventProperties, ReceiverOptions};

use crate::amqp::{ReceiverEvent, ReceiverLink};
use serde_amqp::described::Described;
use serde_amqp::descriptor::Descriptor;
use tributary_eventhubs::address::receiver_address;
use tributary_eventhubs::names::link::{
    EPOCH as EPOCH_PROPERTY, RECEIVER_NAME as RECEIVER_NAME_PROPERTY, RUNTIME_METRIC_CAPABILITY,
    SELECTOR_FILTER_CODE, SELECTOR_FILTER_KEY,
};

use crate::connection::{ClientOptions, Connector, Target};
use crate::error::ClientError;
use crate::limits::PREFETCH_MAX;
use crate::management::{self, EventHubProperties, PartitionProperties};
use crate::producer::check_partition_id;
use tributary_eventhubs::receive::decode_received_owned;

/// Reads partitions of one event hub. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct ConsumerClient {
    pub(crate) connector: Arc<Connector>,
}

impl ConsumerClient {
    /// Connects to `event_hub` with the credentials of `connection_string` and checks them.
    pub async fn connect(connection_string: &str, event_hub: &str) -> Result<Self, ClientError> {
        Self::connect_with_options(connection_string, Some(event_hub), ClientOptions::default())
            .await
    }

    /// Like [`ConsumerClient::connect`]; without `event_hub` the connection string's
    /// `EntityPath` names the hub.
    pub async fn connect_with_options(
        connection_string: &str,
        event_hub: Option<&str>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        let target = Target::new(connection_string, event_hub, options)?;
        Ok(ConsumerClient {
            connector: Connector::connect(target).await?,
        })
    }

    /// The event hub's name.
    pub fn event_hub_name(&self) -> &str {
        &self.connector.target.hub
    }

    /// The namespace's host name.
    pub fn fully_qualified_namespace(&self) -> &str {
        self.connector.target.connection_string.host()
    }

    /// With a hub alias ([`crate::failover`]), the endpoint in use or tried next; `None`
    /// without one.
    pub async fn active_endpoint(&self) -> Option<crate::AliasEndpoint> {
        self.connector.active_endpoint().await
    }

    /// The hub's name, creation time and partition ids.
    pub async fn hub_properties(&self) -> Result<EventHubProperties, ClientError> {
        management::hub_properties(&self.connector).await
    }

    /// One partition's sequence numbers, last offset and enqueued time.
    pub async fn partition_properties(
        &self,
        partition: &str,
    ) -> Result<PartitionProperties, ClientError> {
        management::partition_properties(&self.connector, partition).await
    }

    /// Opens a receiver on `partition` in `consumer_group` from `start`; an epoch receiver if
    /// `owner_level` is given; buffering at most `prefetch` events (see the module docs).
    pub async fn open_receiver(
        &self,
        partition: &str,
        consumer_group: &str,
        start: EventPosition,
        owner_level: Option<i64>,
        prefetch: u32,
    ) -> Result<EventReceiver, ClientError> {
        self.open_receiver_with(&ReceiverOptions {
            partition_id: partition.to_owned(),
            consumer_group: consumer_group.to_owned(),
            start,
            owner_level,
            prefetch,
            track_last_enqueued: false,
        })
        .await
    }

    /// Opens a receiver as `options` say (including `track_last_enqueued`).
    pub async fn open_receiver_with(
        &self,
        options: &ReceiverOptions,
    ) -> Result<EventReceiver, ClientError> {
        check_partition_id(&options.partition_id)?;
        tributary_event::names::validate_consumer_group_name(&options.consumer_group)
            .map_err(|e| ClientError::InvalidArgument(e.to_string()))?;
        if options.prefetch == 0 || options.prefetch > PREFETCH_MAX {
            return Err(ClientError::InvalidArgument(format!(
                "prefetch {} is out of range; choose 1 to {PREFETCH_MAX}",
                options.prefetch
            )));
        }
        let address = receiver_address(
            &self.connector.target.hub,
            &options.consumer_group,
            &options.partition_id,
        );
        let target = &self.connector.target;
        let link = target
            .timed(
                "opening a receiver",
                attach(&self.connector, &address, options),
            )
            .await?;
        Ok(EventReceiver {
            address,
            partition_id: options.partition_id.clone(),
            link: Some(link),
            prefetch: options.prefetch,
            arrived: VecDeque::new(),
            taken: 0,
            ended: None,
            last_enqueued: None,
            failure: None,
        })
    }

    /// Closes the connection; open receivers fail with [`ClientError::ConnectionLost`].
    pub async fn close(&self) {
        self.connector.close().await;
    }
}

/// Attaches a receiver for `address` on a session of its own, as the Azure SDKs do.
async fn attach(
    connector: &Connector,
    address: &str,
    options: &ReceiverOptions,
) -> Result<ReceiverLink, ClientError> {
    let connection = connector.live().await?.connection.clone();
    let session = connection.begin().await?;
    let name = format!("receiver-{}", uuid::Uuid::new_v4().simple());
    let mut attach = attach_frame(name.clone(), Role::Receiver, SenderSettleMode::Mixed);
    attach.source = Some(Box::new(
        Source::builder()
            .address(address.to_owned())
            .add_to_filter(SELECTOR_FILTER_KEY, Some(selector_filter(&options.start)))
            .build(),
    ));
    attach.target = Some(Box::new(
        TargetTerminus::builder()
            .address(name.clone())
            .build()
            .into(),
    ));
    let mut properties = Fields::new();
    if let Some(epoch) = options.owner_level {
        properties.insert(Symbol::from(EPOCH_PROPERTY), Value::Long(epoch));
    }
    properties.insert(Symbol::from(RECEIVER_NAME_PROPERTY), Value::String(name));
    attach.properties = Some(properties);
    if options.track_last_enqueued {
        attach.desired_capabilities =
            Some(Array::from(vec![Symbol::from(RUNTIME_METRIC_CAPABILITY)]));
    }
    let attached = connection
        .attach_receiver(session, attach, address, options.prefetch, true)
        .await;
    if attached.is_err() {
        connection.end(session);
    }
    attached
}

/// A reader of one partition, from [`ConsumerClient::open_receiver`]; see the module docs.
pub struct EventReceiver {
    address: String,
    partition_id: String,
    link: Option<ReceiverLink>,
    prefetch: u32,
    /// Messages that arrived and were not taken yet, oldest first.
    arrived: VecDeque<Bytes>,
    /// Messages taken since credit was last granted back.
    taken: u32,
    /// How the link ended, once it has; reported after the messages before it.
    ended: Option<ClientError>,
    last_enqueued: Option<LastEnqueuedEventProperties>,
    /// The error that finished this receiver, returned by every later call.
    failure: Option<ClientError>,
}

impl std::fmt::Debug for EventReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventReceiver")
            .field("address", &self.address)
            .field("open", &self.link.is_some())
            .field("buffered", &self.arrived.len())
            .field("last_enqueued", &self.last_enqueued)
            .field("failure", &self.failure)
            .finish()
    }
}

impl EventReceiver {
    /// The partition this receiver reads.
    pub fn partition_id(&self) -> &str {
        &self.partition_id
    }

    /// Up to `max_events` events, in partition order; waits up to `wait` for the first and
    /// returns an empty batch if none came. Events already buffered are returned at once, and
    /// so are those that arrived with the first one waited for.
    pub async fn receive(
        &mut self,
        max_events: usize,
        wait: Duration,
    ) -> Result<Vec<ReceivedEvent>, ClientError> {
        if let Some(failure) = &self.failure {
            return Err(failure.clone());
        }
        if max_events == 0 {
            return Err(ClientError::InvalidArgument(
                "max_events must be at least 1".to_owned(),
            ));
        }
        let Some(link) = self.link.as_mut() else {
            return Err(ClientError::InvalidArgument(
                "the receiver is closed".to_owned(),
            ));
        };
        drain(link, &mut self.arrived, &mut self.ended);
        if self.arrived.is_empty()
            && self.ended.is_none()
            && let Ok(event) = tokio::time::timeout(wait, link.next()).await
        {
            take(event, &mut self.arrived, &mut self.ended);
            // What came with the first (a batch arrives as one read): one call, not two.
            drain(link, &mut self.arrived, &mut self.ended);
        }
        let mut events = Vec::with_capacity(max_events.min(self.arrived.len()));
        let now_ms = SystemClock.now_ms();
        while events.len() < max_events {
            let Some(payload) = self.arrived.pop_front() else {
                break;
            };
            self.taken += 1;
            // The event's body is a slice of the delivery's bytes: not copied again.
            match decode_received_owned(payload, now_ms) {
                Ok((event, last)) => {
                    // `receive` reports a metric only with an offset and a time.
                    if let Some(last) = last
                        && let (Some(offset), Some(enqueued_time_ms)) =
                            (last.offset, last.enqueued_time_ms)
                    {
                        self.last_enqueued = Some(LastEnqueuedEventProperties {
                            sequence_number: last.sequence_number,
                            offset,
                            enqueued_time_ms,
                            retrieved_time_ms: last.retrieved_time_ms,
                        });
                    }
                    events.push(event);
                }
                Err(error) => {
                    self.failure = Some(ClientError::from(error));
                    break;
                }
            }
        }
        // Credit back what was taken: at half the prefetch, or when nothing is left to take
        // (so a receiver about to wait never waits on credit it owes the hub).
        if self.taken > 0 && (self.taken * 2 >= self.prefetch || self.arrived.is_empty()) {
            link.grant(self.taken);
            self.taken = 0;
        }
        if self.failure.is_none() && self.arrived.is_empty() {
            self.failure = self.ended.take();
        }
        assert!(events.len() <= max_events);
        match (&self.failure, events.is_empty()) {
            // Hand over what arrived first; the failure comes with the next call.
            (Some(failure), true) => Err(failure.clone()),
            _ => Ok(events),
        }
    }

    /// Resolves once the hub has detached this receiver because a receiver with a higher owner
    /// level took the partition (`amqp:link:stolen`), learnt without receiving: events that
    /// arrive meanwhile are kept for [`receive`](Self::receive), which reports the takeover
    /// after them. Never resolves while the link lives, nor after it ended for another reason.
    /// Cancel-safe.
    pub async fn taken_over(&mut self) {
        loop {
            let end = self.failure.as_ref().or(self.ended.as_ref());
            let Some(link) = self.link.as_mut().filter(|_| end.is_none()) else {
                if end.is_some_and(ClientError::is_ownership_lost) {
                    return;
                }
                return std::future::pending().await;
            };
            let event = link.next().await;
            take(event, &mut self.arrived, &mut self.ended);
        }
    }

    /// The partition's last enqueued event as of the latest delivery, when opened with
    /// `track_last_enqueued` and the hub sent it.
    pub fn last_enqueued(&self) -> Option<LastEnqueuedEventProperties> {
        self.last_enqueued
    }

    /// Detaches the link and ends its session.
    pub async fn close(mut self) {
        self.link = None;
    }
}

/// Files a link event: messages to take, or the link's end.
/// Takes what `link` holds already, without waiting.
fn drain(link: &mut ReceiverLink, arrived: &mut VecDeque<Bytes>, ended: &mut Option<ClientError>) {
    while ended.is_none() {
        match link.try_next() {
            Some(event) => take(event, arrived, ended),
            None => break,
        }
    }
}

fn take(event: ReceiverEvent, arrived: &mut VecDeque<Bytes>, ended: &mut Option<ClientError>) {
    match event {
        ReceiverEvent::Messages(messages) => arrived.extend(messages),
        ReceiverEvent::Ended(error) => *ended = Some(error),
    }
}

#[async_trait::async_trait]
impl tributary_source::PartitionReceiver for EventReceiver {
    async fn receive(
        &mut self,
        max_events: usize,
        wait: Duration,
    ) -> Result<Vec<ReceivedEvent>, tributary_source::SourceError> {
        EventReceiver::receive(self, max_events, wait)
            .await
            .map_err(Into::into)
    }

    fn last_enqueued(&self) -> Option<LastEnqueuedEventProperties> {
        EventReceiver::last_enqueued(self)
    }

    async fn taken_over(&mut self) {
        EventReceiver::taken_over(self).await;
    }

    async fn close(self: Box<Self>) {
        EventReceiver::close(*self).await;
    }
}

/// The selector filter value for a start position: the expression
/// ([`tributary_eventhubs::selector::write`]) described by [`SELECTOR_FILTER_CODE`].
fn selector_filter(position: &EventPosition) -> Described<Value> {
    Described {
        descriptor: Descriptor::Code(SELECTOR_FILTER_CODE),
        value: Value::String(tributary_eventhubs::selector::write(position)),
    }
}
