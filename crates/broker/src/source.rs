//! [`BrokerSource`]: a [`PartitionSource`] over an in-process [`Broker`].
//!
//! This is how an event processor host (`tributary-processor`) reads a hub of this process.
//! Receivers are the broker's own, so the epoch rules are the broker's: a pump's receiver opened
//! with its ownership version as owner level disconnects any former owner's receiver, which then
//! sees [`SourceError::OwnershipLost`] — and at once, in a batch it is processing, resolves
//! [`PartitionReceiver::taken_over`].

use std::time::Duration;

use tributary_event::ReceivedEvent;
use tributary_source::{
    LastEnqueuedEventProperties, PartitionReceiver, PartitionSource, ReceiverOptions, SourceError,
};

use crate::{Broker, BrokerError, DisconnectReason, ReceiveError, Receiver, ReceiverSpec};

/// One event hub of an in-process broker, as a [`PartitionSource`].
#[derive(Debug, Clone)]
pub struct BrokerSource {
    broker: Broker,
    namespace: String,
    hub: String,
}

impl BrokerSource {
    /// The hub `hub` of `broker`. `namespace` is the name ownership and checkpoints are stored
    /// under (e.g. the data directory's path, or the host name clients use).
    pub fn new(broker: Broker, namespace: impl Into<String>, hub: impl Into<String>) -> Self {
        BrokerSource {
            broker,
            namespace: namespace.into(),
            hub: hub.into(),
        }
    }
}

fn source_error(error: BrokerError) -> SourceError {
    let description = error.to_string();
    match error {
        BrokerError::HubNotFound { .. }
        | BrokerError::ConsumerGroupNotFound { .. }
        | BrokerError::InvalidPartition { .. } => SourceError::NotFound { what: description },
        BrokerError::EpochTooLow { .. } | BrokerError::EpochReceiverActive { .. } => {
            SourceError::OwnershipLost { description }
        }
        BrokerError::ShuttingDown => SourceError::Transient { description },
        _ => SourceError::Other { description },
    }
}

#[async_trait::async_trait]
impl PartitionSource for BrokerSource {
    fn fully_qualified_namespace(&self) -> &str {
        &self.namespace
    }

    fn event_hub_name(&self) -> &str {
        &self.hub
    }

    async fn partition_ids(&self) -> Result<Vec<String>, SourceError> {
        let hub = self.broker.describe_hub(&self.hub).map_err(source_error)?;
        Ok((0..hub.partition_count).map(|p| p.to_string()).collect())
    }

    async fn open_receiver(
        &self,
        options: ReceiverOptions,
    ) -> Result<Box<dyn PartitionReceiver>, SourceError> {
        let spec = ReceiverSpec {
            hub: self.hub.clone(),
            consumer_group: options.consumer_group,
            partition: options.partition_id,
            start: options.start,
            owner_level: options.owner_level,
            name: None,
        };
        let receiver = self.broker.open_receiver(spec).map_err(source_error)?;
        Ok(Box::new(BrokerReceiver {
            receiver,
            track_last_enqueued: options.track_last_enqueued,
        }))
    }
}

struct BrokerReceiver {
    receiver: Receiver,
    track_last_enqueued: bool,
}

#[async_trait::async_trait]
impl PartitionReceiver for BrokerReceiver {
    async fn receive(
        &mut self,
        max_events: usize,
        wait: Duration,
    ) -> Result<Vec<ReceivedEvent>, SourceError> {
        self.receiver
            .receive(max_events, wait)
            .await
            .map_err(|error| match error {
                ReceiveError::Disconnected(reason) => {
                    let description = reason.to_string();
                    match reason {
                        DisconnectReason::Stolen { .. } => {
                            SourceError::OwnershipLost { description }
                        }
                        DisconnectReason::Shutdown => SourceError::Transient { description },
                        _ => SourceError::NotFound { what: description },
                    }
                }
                ReceiveError::Broker(error) => source_error(error),
            })
    }

    fn last_enqueued(&self) -> Option<LastEnqueuedEventProperties> {
        if !self.track_last_enqueued {
            return None;
        }
        let last = self.receiver.last_enqueued()?;
        Some(LastEnqueuedEventProperties {
            sequence_number: last.sequence_number,
            offset: last.offset?,
            enqueued_time_ms: last.enqueued_time_ms?,
            retrieved_time_ms: last.retrieved_time_ms,
        })
    }

    async fn taken_over(&mut self) {
        match self.receiver.disconnected().await {
            DisconnectReason::Stolen { .. } => {}
            // Anything else is reported by the next receive.
            _ => std::future::pending::<()>().await,
        }
    }

    async fn close(self: Box<Self>) {
        drop(self.receiver);
    }
}
