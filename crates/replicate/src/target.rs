//! Where a task sends: the [`Target`] trait and its two implementations, a hub in this process
//! ([`LocalTarget`], the broker on a data directory) and a hub reached over AMQP
//! ([`RemoteTarget`]: a Tributary hub or Azure Event Hubs).
//!
//! A send is one batch to one [`SendTarget`]; it is acknowledged (stored, all of it) or it
//! failed. Failures are sorted by what the forwarder can do about them ([`TargetError`]):
//! retry after a pause, isolate and dead-letter the event the hub refuses, or keep retrying
//! while an operator fixes the task's configuration.

use std::borrow::Cow;
use std::fmt;

use tributary_broker::{Broker, BrokerError};
use tributary_client::{ClientError, ProducerClient};
use tributary_edit::Position;
use tributary_event::{EventData, SendTarget};
use tributary_eventhubs::limits::MESSAGE_BYTES_MAX;
use tributary_eventhubs::send::{MessageStamp, Stamp, StampValue, StampValues, Stamped};

use crate::metadata::{FirstHopStamp, Undo};

/// The first-hop stamp a batch's events are sent with without holding it: the events whose
/// place says so ([`Undo::is_deferred`]) carry `stamp` with the values of their position.
#[derive(Debug, Clone, Copy)]
pub struct BatchStamps<'a> {
    /// The route's stamp for the source partition.
    pub stamp: &'a FirstHopStamp,
    /// Each event's position and undo, at the event's index.
    pub places: &'a [(Position, Undo)],
}

impl BatchStamps<'_> {
    /// The stamp and values for the AMQP encoder.
    pub fn stamped(&self) -> Stamped<'_> {
        Stamped {
            stamp: self.stamp.encoded(),
            values: self,
        }
    }

    /// Room for one event's values, for [`BatchStamps::of`].
    pub fn value_slots(&self) -> Vec<StampValue> {
        vec![StampValue::Signed(0); self.stamp.encoded().varying_len()]
    }

    /// The stamp event `index` is sent with, and the most bytes each of its values takes, for
    /// [`BatchSizer::event_bytes_at_most_stamped`](tributary_eventhubs::send::BatchSizer).
    pub fn bound_of(&self, index: usize) -> Option<(&Stamp, usize)> {
        let (_, undo) = self.places.get(index)?;
        undo.is_deferred()
            .then(|| (self.stamp.encoded(), FirstHopStamp::VALUE_BYTES_MAX))
    }

    /// The stamp event `index` is sent with, its values written into `values`.
    pub fn of<'v>(&'v self, index: usize, values: &'v mut [StampValue]) -> MessageStamp<'v> {
        StampValues::values(self, index, values).then_some((self.stamp.encoded(), &*values))
    }

    /// `events` each holding the stamp `stamps` sends it with (a copy, when there is one):
    /// for a target that stores events as they are.
    pub fn held<'e>(stamps: Option<Self>, events: &'e [EventData]) -> Cow<'e, [EventData]> {
        let Some(stamps) = stamps else {
            return Cow::Borrowed(events);
        };
        let mut held = events.to_vec();
        for (event, (position, undo)) in held.iter_mut().zip(stamps.places) {
            if undo.is_deferred() {
                stamps.stamp.apply(event, *position);
            }
        }
        Cow::Owned(held)
    }
}

impl StampValues for BatchStamps<'_> {
    fn values(&self, index: usize, values: &mut [StampValue]) -> bool {
        match self.places.get(index) {
            Some((position, undo)) if undo.is_deferred() => {
                FirstHopStamp::values(*position, values);
                true
            }
            _ => false,
        }
    }
}

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

    /// Whether the target writes a first-hop stamp into each message it encodes
    /// ([`Target::send`]'s `stamps`) cheaper than events holding it: one that stores events as
    /// they are has them hold it.
    fn encodes_stamps(&self) -> bool {
        false
    }

    /// Sends `events` to `to` as one batch and waits for the acknowledgement; the events
    /// `stamps` covers are sent with its stamp.
    async fn send(
        &self,
        events: &[EventData],
        stamps: Option<BatchStamps<'_>>,
        to: &SendTarget,
    ) -> Result<(), TargetError>;

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

    async fn send(
        &self,
        events: &[EventData],
        stamps: Option<BatchStamps<'_>>,
        to: &SendTarget,
    ) -> Result<(), TargetError> {
        let events = BatchStamps::held(stamps, events);
        self.broker
            .send_borrowed(&self.hub, to.clone(), &events)
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

    fn encodes_stamps(&self) -> bool {
        true
    }

    async fn send(
        &self,
        events: &[EventData],
        stamps: Option<BatchStamps<'_>>,
        to: &SendTarget,
    ) -> Result<(), TargetError> {
        let stamped = stamps.as_ref().map(BatchStamps::stamped);
        self.producer
            .send_stamped(events, stamped, to.clone())
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

#[cfg(test)]
mod tests {
    use tributary_event::{PropertyValue, SmolStr};
    use tributary_eventhubs::send::{encode_outgoing, encode_outgoing_stamped};

    use super::*;
    use crate::metadata::{self, HopIds};

    #[test]
    fn a_stamp_sent_beside_its_events_is_the_stamp_they_would_hold() {
        let ids = HopIds::new(
            "0f8fad5b-d9cb-469f-a165-70867728950e",
            "7c9e6679-7425-40de-944b-e07fc1f90ae7",
        );
        let partition = SmolStr::new("3");
        let stamp = FirstHopStamp::new(&partition, &ids).expect("short ids");
        let at = |sequence_number: i64, offset: u64| Position {
            sequence_number,
            offset,
            enqueued_time_ms: 1_714_568_523_000 + sequence_number,
        };
        // A hub's event, a Kafka record's (sequence number = offset), and an event a first
        // hop stamped already, which holds its second hop's stamp itself.
        let mut relayed = EventData::new("z");
        metadata::stamp(&mut relayed, "0", at(1, 1), "hub-x", "hub-y");
        let mut events = vec![
            EventData::new("x").with_property("kind", PropertyValue::Int64(1)),
            EventData::new("y"),
            relayed,
        ];
        let undo = metadata::stamp_with(&mut events[2], &partition, at(9, 4096), &ids);
        let places = vec![
            (at(7, 8192), Undo::deferred()),
            (at(8, 8), Undo::deferred()),
            (at(9, 4096), undo),
        ];
        let mut holding = events.clone();
        for (event, (position, undo)) in holding.iter_mut().zip(&places) {
            if undo.is_deferred() {
                metadata::stamp_with(event, &partition, *position, &ids);
            }
        }
        let stamps = BatchStamps {
            stamp: &stamp,
            places: &places,
        };
        assert_eq!(BatchStamps::held(Some(stamps), &events).as_ref(), holding);
        for ms in [i64::MIN, 0, 1_714_568_523_000, i64::MAX] {
            let time = metadata::format_enqueued_time(ms);
            assert!(time.len() <= FirstHopStamp::VALUE_BYTES_MAX, "{time}");
        }
        for key in [None, Some("k")] {
            assert_eq!(
                encode_outgoing_stamped(&events, Some(stamps.stamped()), key).unwrap(),
                encode_outgoing(&holding, key).unwrap(),
                "the messages carry the stamp's bytes as the events would"
            );
            assert_eq!(
                encode_outgoing_stamped(&events[..1], Some(stamps.stamped()), key).unwrap(),
                encode_outgoing(&holding[..1], key).unwrap(),
                "a single message too"
            );
        }
    }
}
