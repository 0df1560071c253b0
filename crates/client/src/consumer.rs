//! [`ConsumerClient`] and its [`EventReceiver`]s: reading partitions from a start position, with
//! or without an owner level (epoch).
//!
//! # Flow control
//! A receiver grants the hub `prefetch` credits when it attaches and tops them up to `prefetch`
//! again once half have been consumed by [`EventReceiver::receive`], so at most one and a half
//! times `prefetch` events wait in the client ahead of the caller (the top-up comes while up to
//! half may still be buffered).
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
//! # Cancellation
//! Dropping a `receive` future part-way may lose events it had already taken off the link; after
//! that, reopen from the last event seen (the processor host does exactly this).

use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp::link::{CreditMode, Receiver};
use fe2o3_amqp::session::SessionHandle;
use fe2o3_amqp::types::definitions::{Fields, ReceiverSettleMode};
use fe2o3_amqp::types::messaging::{Body, Source};
use fe2o3_amqp::types::primitives::{Symbol, Value};
use tributary_event::{Clock, EventPosition, ReceivedEvent, SystemClock};
use tributary_processor::{LastEnqueuedEventProperties, ReceiverOptions};

use crate::codec::{
    EPOCH_PROPERTY, RECEIVER_NAME_PROPERTY, RUNTIME_METRIC_CAPABILITY, SELECTOR_FILTER_KEY,
    decode_received, last_enqueued, receiver_address, selector_filter,
};
use crate::connection::{ClientOptions, Connector, Target};
use crate::error::ClientError;
use crate::limits::{CLOSE_TIMEOUT, PREFETCH_MAX};
use crate::link_errors::{attach_receiver_error, recv_error};
use crate::management::{self, EventHubProperties, PartitionProperties};
use crate::producer::check_partition_id;

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
    /// `owner_level` is given; buffering at most about one and a half times `prefetch` events (see the module docs).
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
        let (session, receiver) = target
            .timed(
                "opening a receiver",
                attach(&self.connector, &address, options),
            )
            .await?;
        Ok(EventReceiver {
            address,
            partition_id: options.partition_id.clone(),
            session: Some(session),
            receiver: Some(receiver),
            last_enqueued: None,
            failure: None,
        })
    }

    /// Closes the connection; open receivers fail with [`ClientError::ConnectionLost`].
    pub async fn close(&self) {
        self.connector.close().await;
    }
}

async fn attach(
    connector: &Connector,
    address: &str,
    options: &ReceiverOptions,
) -> Result<(SessionHandle<()>, Receiver), ClientError> {
    let mut session = connector.live().await?.begin_session().await?;
    let name = format!("receiver-{}", uuid::Uuid::new_v4().simple());
    let source = Source::builder()
        .address(address)
        .add_to_filter(SELECTOR_FILTER_KEY, Some(selector_filter(&options.start)))
        .build();
    let mut properties = Fields::new();
    if let Some(epoch) = options.owner_level {
        properties.insert(Symbol::from(EPOCH_PROPERTY), Value::Long(epoch));
    }
    properties.insert(
        Symbol::from(RECEIVER_NAME_PROPERTY),
        Value::String(name.clone()),
    );
    let mut builder = Receiver::builder()
        .name(name.clone())
        .source(source)
        .target(name)
        .receiver_settle_mode(ReceiverSettleMode::First)
        .credit_mode(CreditMode::Auto(options.prefetch))
        .auto_accept(true)
        .verify_incoming_source(false)
        .properties(properties);
    if options.track_last_enqueued {
        builder = builder.add_desired_capabilities(Symbol::from(RUNTIME_METRIC_CAPABILITY));
    }
    match builder.attach(&mut session).await {
        Ok(receiver) => Ok((session, receiver)),
        Err(error) => {
            let error = attach_receiver_error(address, error);
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, session.end()).await;
            Err(error)
        }
    }
}

/// A reader of one partition, from [`ConsumerClient::open_receiver`]; see the module docs.
pub struct EventReceiver {
    address: String,
    partition_id: String,
    session: Option<SessionHandle<()>>,
    receiver: Option<Receiver>,
    last_enqueued: Option<LastEnqueuedEventProperties>,
    /// The error that finished this receiver, returned by every later call.
    failure: Option<ClientError>,
}

impl std::fmt::Debug for EventReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventReceiver")
            .field("address", &self.address)
            .field("open", &self.receiver.is_some())
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
    /// returns an empty batch if none came. Events already buffered are returned at once.
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
        let mut events = Vec::new();
        let mut wait = wait;
        while events.len() < max_events {
            match self.next(wait).await {
                Ok(Some(event)) => events.push(event),
                Ok(None) => break,
                Err(error) => {
                    self.failure = Some(error.clone());
                    if events.is_empty() {
                        return Err(error);
                    }
                    // Hand over what arrived first; the failure comes with the next call.
                    break;
                }
            }
            // After the first event, take only what is already here.
            wait = Duration::ZERO;
        }
        assert!(events.len() <= max_events);
        Ok(events)
    }

    /// The next event if one arrives within `wait`.
    async fn next(&mut self, wait: Duration) -> Result<Option<ReceivedEvent>, ClientError> {
        let Some(receiver) = self.receiver.as_mut() else {
            return Err(ClientError::InvalidArgument(
                "the receiver is closed".to_owned(),
            ));
        };
        let delivery = match tokio::time::timeout(wait, receiver.recv::<Body<Value>>()).await {
            Err(_elapsed) => return Ok(None),
            Ok(received) => received.map_err(|e| recv_error(&self.address, e))?,
        };
        let message = delivery.into_message();
        if let Some(latest) =
            last_enqueued(message.delivery_annotations.as_ref(), SystemClock.now_ms())
        {
            self.last_enqueued = Some(latest);
        }
        decode_received(message).map(Some)
    }

    /// The partition's last enqueued event as of the latest delivery, when opened with
    /// `track_last_enqueued` and the hub sent it.
    pub fn last_enqueued(&self) -> Option<LastEnqueuedEventProperties> {
        self.last_enqueued
    }

    /// Detaches the link and ends its session.
    pub async fn close(mut self) {
        if let Some(receiver) = self.receiver.take() {
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, receiver.close()).await;
        }
        if let Some(mut session) = self.session.take() {
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, session.end()).await;
        }
    }
}

#[async_trait::async_trait]
impl tributary_processor::PartitionReceiver for EventReceiver {
    async fn receive(
        &mut self,
        max_events: usize,
        wait: Duration,
    ) -> Result<Vec<ReceivedEvent>, tributary_processor::SourceError> {
        EventReceiver::receive(self, max_events, wait)
            .await
            .map_err(Into::into)
    }

    fn last_enqueued(&self) -> Option<LastEnqueuedEventProperties> {
        EventReceiver::last_enqueued(self)
    }

    async fn close(self: Box<Self>) {
        EventReceiver::close(*self).await;
    }
}
