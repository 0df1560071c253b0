//! [`RemoteHub`]: a hub reached over AMQP as a [`PartitionSource`] for the processor host.
//!
//! This is what runs an event processor host (`tributary_processor::EventProcessorHost`) against
//! a Tributary server or Azure Event Hubs. Each `open_receiver` opens an [`EventReceiver`] (an
//! epoch receiver at the owner level the host passes); errors map to [`SourceError`] by meaning:
//!
//! | client error | source error |
//! |---|---|
//! | [`ClientError::OwnershipLost`] (`amqp:link:stolen`) | [`SourceError::OwnershipLost`] |
//! | [`ClientError::NotFound`] | [`SourceError::NotFound`] |
//! | [`ClientError::Unauthorized`] | [`SourceError::Unauthorized`] |
//! | connection lost, timeout, busy, cannot connect | [`SourceError::Transient`] |
//! | anything else | [`SourceError::Other`] |
//!
//! After a connection drop the receivers on it fail with `Transient`; the host reopens them and
//! the next `open_receiver` reconnects.

use async_trait::async_trait;
use tributary_source::{PartitionReceiver, PartitionSource, ReceiverOptions, SourceError};

use crate::connection::ClientOptions;
use crate::consumer::{ConsumerClient, EventReceiver};
use crate::error::ClientError;
use crate::management::{EventHubProperties, PartitionProperties};

/// A remote event hub as a [`PartitionSource`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RemoteHub {
    consumer: ConsumerClient,
}

impl RemoteHub {
    /// Connects to `event_hub` with the credentials of `connection_string` and checks them.
    pub async fn connect(connection_string: &str, event_hub: &str) -> Result<Self, ClientError> {
        Self::connect_with_options(connection_string, Some(event_hub), ClientOptions::default())
            .await
    }

    /// Like [`RemoteHub::connect`]; without `event_hub` the connection string's `EntityPath`
    /// names the hub.
    pub async fn connect_with_options(
        connection_string: &str,
        event_hub: Option<&str>,
        options: ClientOptions,
    ) -> Result<Self, ClientError> {
        Ok(RemoteHub {
            consumer: ConsumerClient::connect_with_options(connection_string, event_hub, options)
                .await?,
        })
    }

    /// A hub over an existing consumer client (sharing its connection).
    pub fn from_consumer(consumer: ConsumerClient) -> Self {
        RemoteHub { consumer }
    }

    /// The consumer client underneath.
    pub fn consumer(&self) -> &ConsumerClient {
        &self.consumer
    }

    /// The hub's name, creation time and partition ids.
    pub async fn hub_properties(&self) -> Result<EventHubProperties, ClientError> {
        self.consumer.hub_properties().await
    }

    /// One partition's properties.
    pub async fn partition_properties(
        &self,
        partition: &str,
    ) -> Result<PartitionProperties, ClientError> {
        self.consumer.partition_properties(partition).await
    }

    /// Opens a receiver as [`PartitionSource::open_receiver`] does, keeping the concrete type.
    pub async fn open_event_receiver(
        &self,
        options: &ReceiverOptions,
    ) -> Result<EventReceiver, ClientError> {
        self.consumer.open_receiver_with(options).await
    }
}

#[async_trait]
impl PartitionSource for RemoteHub {
    fn fully_qualified_namespace(&self) -> &str {
        self.consumer.fully_qualified_namespace()
    }

    fn event_hub_name(&self) -> &str {
        self.consumer.event_hub_name()
    }

    async fn partition_ids(&self) -> Result<Vec<String>, SourceError> {
        Ok(self.consumer.hub_properties().await?.partition_ids)
    }

    async fn open_receiver(
        &self,
        options: ReceiverOptions,
    ) -> Result<Box<dyn PartitionReceiver>, SourceError> {
        let receiver = self.consumer.open_receiver_with(&options).await?;
        Ok(Box::new(receiver))
    }
}
