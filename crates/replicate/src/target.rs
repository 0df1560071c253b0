//! Where a task sends: the [`Target`] trait and its two implementations, a hub in this process
//! ([`LocalTarget`], the broker on a data directory) and a hub reached over AMQP
//! ([`RemoteTarget`]: a Tributary hub or Azure Event Hubs).
//!
//! A send is one batch to one [`SendTarget`]; it is acknowledged (stored, all of it) or it
//! failed. Failures are sorted by what the forwarder can do about them ([`TargetError`]):
//! retry after a pause, isolate and dead-letter the event the hub refuses, or keep retrying
//! while an operator fixes the task's configuration.

use std::fmt;

use tributary_broker::{Broker, BrokerError};
use tributary_client::{ClientError, ProducerClient};
use tributary_event::{EventData, SendTarget};
use tributary_eventhubs::limits::MESSAGE_BYTES_MAX;

/// What a target hub is: the identity events record as their origin and path, and its
/// partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubIdentity {
    /// A stable id unique to the hub: a Tributary hub's UUID, or `<namespace host>/<hub>` for a
    /// hub that reports none (Azure Event Hubs, where that pair is unique).
    pub id: String,
    /// How many partitions it has.
    pub partition_count: u32,
}

/// Why a send failed, by what can be done about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// Worth retrying as it is: a lost connection, a timeout, a busy or full hub.
    #[error("{0}")]
    Transient(String),
    /// The hub refused the events themselves (malformed, too large, a value it cannot store):
    /// sending them again fails again. One event refused on its own is poison.
    #[error("{0}")]
    Refused(String),
    /// The task's configuration is wrong (no such hub, no right to send): nothing the events
    /// can change; retried slowly so the task resumes once an operator fixes it.
    #[error("{0}")]
    Misconfigured(String),
}

impl TargetError {
    fn from_client(error: ClientError) -> TargetError {
        let text = error.to_string();
        match error {
            ClientError::Refused { .. }
            | ClientError::MessageTooLarge { .. }
            | ClientError::InvalidArgument(_) => TargetError::Refused(text),
            ClientError::Unauthorized { .. }
            | ClientError::NotFound { .. }
            | ClientError::InvalidConnectionString(_) => TargetError::Misconfigured(text),
            _ => TargetError::Transient(text),
        }
    }

    fn from_broker(error: BrokerError) -> TargetError {
        let text = error.to_string();
        match error {
            BrokerError::HubNotFound { .. } => TargetError::Misconfigured(text),
            error if error.is_caller_error() => TargetError::Refused(text),
            _ => TargetError::Transient(text),
        }
    }
}

/// A hub a task sends to.
#[async_trait::async_trait]
pub trait Target: Send + Sync + fmt::Debug + 'static {
    /// What it is, for logs and metrics: the hub's name and where it is.
    fn describe(&self) -> &str;

    /// Its identity and partition count (asked once when the task starts).
    async fn identity(&self) -> Result<HubIdentity, TargetError>;

    /// The most bytes a batch to `to` may take, as `tributary_eventhubs::send::BatchSizer`
    /// measures them.
    async fn batch_bytes_max(&self, to: &SendTarget) -> Result<u64, TargetError>;

    /// Sends `events` to `to` as one batch and waits for the acknowledgement.
    async fn send(&self, events: &[EventData], to: &SendTarget) -> Result<(), TargetError>;

    /// The sequence number of the newest event in `partition` (-1 when it has none), for the
    /// task's [offset map](crate::offset_map); `None` for a target without sequence numbers
    /// (no sync is taken then).
    async fn last_sequence_number(&self, partition: &str) -> Result<Option<i64>, TargetError> {
        let _ = partition;
        Ok(None)
    }
}

/// A hub in this process: appends go straight to the broker's log.
#[derive(Clone)]
pub struct LocalTarget {
    broker: Broker,
    hub: String,
    description: String,
}

impl fmt::Debug for LocalTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalTarget")
            .field("hub", &self.hub)
            .finish_non_exhaustive()
    }
}

impl LocalTarget {
    /// The hub `hub` of `broker`.
    pub fn new(broker: Broker, hub: impl Into<String>) -> LocalTarget {
        let hub = hub.into();
        let description = format!(
            "event hub {hub:?} in {}",
            broker.config().data_dir.display()
        );
        LocalTarget {
            broker,
            hub,
            description,
        }
    }
}

#[async_trait::async_trait]
impl Target for LocalTarget {
    fn describe(&self) -> &str {
        &self.description
    }

    async fn identity(&self) -> Result<HubIdentity, TargetError> {
        let definition = self
            .broker
            .describe_hub(&self.hub)
            .map_err(TargetError::from_broker)?;
        Ok(HubIdentity {
            id: definition.id,
            partition_count: definition.partition_count,
        })
    }

    async fn batch_bytes_max(&self, _to: &SendTarget) -> Result<u64, TargetError> {
        // What the hub's AMQP door takes in one transfer: a batch a remote producer could send.
        Ok(MESSAGE_BYTES_MAX)
    }

    async fn send(&self, events: &[EventData], to: &SendTarget) -> Result<(), TargetError> {
        self.broker
            .send_borrowed(&self.hub, to.clone(), events)
            .await
            .map(|_| ())
            .map_err(TargetError::from_broker)
    }

    async fn last_sequence_number(&self, partition: &str) -> Result<Option<i64>, TargetError> {
        self.broker
            .partition_properties(&self.hub, partition)
            .map(|p| Some(p.last_enqueued_sequence_number))
            .map_err(TargetError::from_broker)
    }
}

/// A hub over AMQP: a Tributary hub's front door or Azure Event Hubs.
#[derive(Debug, Clone)]
pub struct RemoteTarget {
    producer: ProducerClient,
    description: String,
}

impl RemoteTarget {
    /// Sends through `producer`.
    pub fn new(producer: ProducerClient) -> RemoteTarget {
        let description = format!(
            "event hub {:?} at {}",
            producer.event_hub_name(),
            producer.fully_qualified_namespace()
        );
        RemoteTarget {
            producer,
            description,
        }
    }
}

#[async_trait::async_trait]
impl Target for RemoteTarget {
    fn describe(&self) -> &str {
        &self.description
    }

    async fn identity(&self) -> Result<HubIdentity, TargetError> {
        let properties = self
            .producer
            .hub_properties()
            .await
            .map_err(TargetError::from_client)?;
        let id = properties.hub_id.unwrap_or_else(|| {
            format!(
                "{}/{}",
                self.producer.fully_qualified_namespace(),
                properties.name
            )
            .to_ascii_lowercase()
        });
        Ok(HubIdentity {
            id,
            partition_count: u32::try_from(properties.partition_ids.len()).unwrap_or(u32::MAX),
        })
    }

    async fn batch_bytes_max(&self, to: &SendTarget) -> Result<u64, TargetError> {
        self.producer
            .max_message_bytes(to)
            .await
            .map_err(TargetError::from_client)
    }

    async fn send(&self, events: &[EventData], to: &SendTarget) -> Result<(), TargetError> {
        self.producer
            .send(events, to.clone())
            .await
            .map_err(TargetError::from_client)
    }

    async fn last_sequence_number(&self, partition: &str) -> Result<Option<i64>, TargetError> {
        self.producer
            .partition_properties(partition)
            .await
            .map(|p| Some(p.last_enqueued_sequence_number))
            .map_err(TargetError::from_client)
    }
}
