//! [`KafkaSource`]: one Kafka topic as a [`PartitionSource`].
//!
//! The topic plays the event hub: its partitions are the hub's partitions (ids `"0"`, `"1"`, …
//! as Kafka numbers them), its partition count comes from the cluster's metadata and is asked
//! again whenever the host asks, so partitions added to a topic are picked up. Each receiver
//! reads one partition by assignment, never by a Kafka consumer group's subscription: which
//! process reads which partition is the processor host's decision (ownership and balancing in
//! its checkpoint store), and Kafka's group coordinator plays no part. No offsets are committed
//! to Kafka by this source.
//!
//! Blocking librdkafka calls (metadata, watermarks, time lookups) run on Tokio's blocking pool,
//! bounded by [`CLUSTER_REQUEST_TIMEOUT`], never on the caller's task.

use std::sync::Arc;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tributary_event::EventPosition;
use tributary_source::{PartitionReceiver, PartitionSource, ReceiverOptions, SourceError};

use crate::epochs::{EpochClaim, Epochs};
use crate::error::source_error;
use crate::limits::CLUSTER_REQUEST_TIMEOUT;
use crate::options::KafkaOptions;
use crate::receiver::KafkaReceiver;

/// A partition's extent as the cluster reports it (its watermarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionExtent {
    /// The oldest offset still retained (the low watermark).
    pub beginning_offset: i64,
    /// The offset the next record will get (the high watermark): the partition holds
    /// `end_offset - beginning_offset` records, unless compacted or transactional.
    pub end_offset: i64,
}

impl PartitionExtent {
    /// The newest record's offset (its sequence number here), if the partition holds any.
    pub fn last_offset(&self) -> Option<i64> {
        (self.end_offset > self.beginning_offset).then(|| self.end_offset - 1)
    }
}

/// A Kafka topic as a partition source; see the [module docs](self).
pub struct KafkaSource {
    shared: Arc<Shared>,
}

/// What the source and its receivers share.
pub(crate) struct Shared {
    pub(crate) options: KafkaOptions,
    pub(crate) topic: String,
    namespace: String,
    /// For metadata, watermarks and time lookups; reads nothing.
    pub(crate) admin: BaseConsumer,
    pub(crate) epochs: Epochs,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("options", &self.shared.options)
            .field("topic", &self.shared.topic)
            .field("namespace", &self.shared.namespace)
            .finish_non_exhaustive()
    }
}

impl KafkaSource {
    /// The topic `topic` of the cluster `options` reach. Nothing is sent yet: a cluster that
    /// cannot be reached shows in the first call that needs it. The namespace ownership and
    /// checkpoints are recorded under is the first bootstrap server (`host:port`); see
    /// [`KafkaSource::with_namespace`].
    pub fn new(
        options: KafkaOptions,
        topic: impl Into<String>,
    ) -> Result<KafkaSource, SourceError> {
        let topic = topic.into();
        if topic.is_empty() {
            return Err(SourceError::Other {
                description: "a Kafka topic name cannot be empty".to_owned(),
            });
        }
        let admin: BaseConsumer = options
            .client_config()
            .create()
            .map_err(|e| source_error("cannot configure the Kafka client", &e))?;
        let namespace = options
            .bootstrap_servers
            .split(',')
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        Ok(KafkaSource {
            shared: Arc::new(Shared {
                options,
                topic,
                namespace,
                admin,
                epochs: Epochs::default(),
            }),
        })
    }

    /// Records ownership and checkpoints under `namespace` instead of the first bootstrap
    /// server: processors balance a topic together only when they all use one name, so give
    /// one when they list the bootstrap servers differently.
    pub fn with_namespace(self, namespace: impl Into<String>) -> KafkaSource {
        let shared = Arc::into_inner(self.shared).expect("not yet shared with a receiver");
        KafkaSource {
            shared: Arc::new(Shared {
                namespace: namespace.into(),
                ..shared
            }),
        }
    }

    /// The topic's name.
    pub fn topic(&self) -> &str {
        &self.shared.topic
    }

    /// The topic's partition ids as numbers, in order.
    pub async fn partitions(&self) -> Result<Vec<i32>, SourceError> {
        let shared = Arc::clone(&self.shared);
        blocking(move || shared.partitions()).await
    }

    /// A partition's watermarks, asked of its leader.
    pub async fn partition_extent(
        &self,
        partition_id: &str,
    ) -> Result<PartitionExtent, SourceError> {
        let partition = parse_partition(partition_id)?;
        let shared = Arc::clone(&self.shared);
        blocking(move || shared.extent(partition)).await
    }
}

impl Shared {
    /// The topic's partitions, from the cluster's metadata.
    fn partitions(&self) -> Result<Vec<i32>, SourceError> {
        let metadata = self
            .admin
            .fetch_metadata(Some(&self.topic), CLUSTER_REQUEST_TIMEOUT)
            .map_err(|e| {
                let what = format!(
                    "cannot read the metadata of the Kafka cluster at {}",
                    self.options.bootstrap_servers
                );
                source_error(&what, &e)
            })?;
        let Some(topic) = metadata.topics().iter().find(|t| t.name() == self.topic) else {
            return Err(self.topic_not_found());
        };
        if let Some(error) = topic.error() {
            let error = rdkafka::error::KafkaError::MetadataFetch(error.into());
            return Err(match source_error("cannot read the topic", &error) {
                SourceError::NotFound { .. } => self.topic_not_found(),
                other => other,
            });
        }
        let mut ids: Vec<i32> = topic.partitions().iter().map(|p| p.id()).collect();
        ids.sort_unstable();
        if ids.is_empty() {
            return Err(self.topic_not_found());
        }
        Ok(ids)
    }

    fn topic_not_found(&self) -> SourceError {
        SourceError::NotFound {
            what: format!(
                "Kafka topic {:?} at {}",
                self.topic, self.options.bootstrap_servers
            ),
        }
    }

    /// A partition's watermarks.
    pub(crate) fn extent(&self, partition: i32) -> Result<PartitionExtent, SourceError> {
        let (low, high) = self
            .admin
            .fetch_watermarks(&self.topic, partition, CLUSTER_REQUEST_TIMEOUT)
            .map_err(|e| source_error("cannot read the partition's watermarks", &e))?;
        Ok(PartitionExtent {
            beginning_offset: low,
            end_offset: high,
        })
    }

    /// Where a receiver starting at `position` starts, as librdkafka takes it.
    fn start_at(&self, partition: i32, position: EventPosition) -> Result<StartAt, SourceError> {
        let after = |n: i64, inclusive: bool| Offset::Offset(if inclusive { n } else { n + 1 });
        let offset = match position {
            EventPosition::Earliest => Offset::Beginning,
            EventPosition::Latest => Offset::End,
            EventPosition::Offset { offset, inclusive } => {
                after(i64::try_from(offset).unwrap_or(i64::MAX - 1), inclusive)
            }
            EventPosition::SequenceNumber {
                sequence_number,
                inclusive,
            } => after(sequence_number.max(-1), inclusive),
            EventPosition::EnqueuedTime {
                enqueued_time_ms,
                inclusive,
            } => {
                let from_ms = if inclusive {
                    enqueued_time_ms
                } else {
                    enqueued_time_ms + 1
                };
                return Ok(StartAt {
                    offset: self.offset_for_time(partition, from_ms)?,
                    skip_before_ms: Some(from_ms),
                });
            }
        };
        Ok(StartAt {
            offset,
            skip_before_ms: None,
        })
    }

    /// The first offset whose timestamp is at or after `from_ms` (the end when none is).
    fn offset_for_time(&self, partition: i32, from_ms: i64) -> Result<Offset, SourceError> {
        let mut query = TopicPartitionList::new();
        query
            .add_partition_offset(&self.topic, partition, Offset::Offset(from_ms.max(0)))
            .map_err(|e| source_error("cannot look up an offset by time", &e))?;
        let answer = self
            .admin
            .offsets_for_times(query, CLUSTER_REQUEST_TIMEOUT)
            .map_err(|e| source_error("cannot look up an offset by time", &e))?;
        let element = answer
            .find_partition(&self.topic, partition)
            .ok_or_else(|| SourceError::Other {
                description: "the cluster's time lookup left out the partition".to_owned(),
            })?;
        element
            .error()
            .map_err(|e| source_error("cannot look up an offset by time", &e))?;
        Ok(match element.offset() {
            Offset::Offset(offset) if offset >= 0 => Offset::Offset(offset),
            _ => Offset::End,
        })
    }

    /// Checks the partition exists, claims its epoch and resolves where to start.
    fn prepare(
        &self,
        options: &ReceiverOptions,
    ) -> Result<(i32, EpochClaim, StartAt), SourceError> {
        let partition = parse_partition(&options.partition_id)?;
        if !self.partitions()?.contains(&partition) {
            return Err(SourceError::NotFound {
                what: format!("partition {partition} of Kafka topic {:?}", self.topic),
            });
        }
        let start = self.start_at(partition, options.start)?;
        let claim = match options.owner_level {
            Some(level) => {
                self.epochs
                    .claim(&options.consumer_group, &options.partition_id, level)?
            }
            None => EpochClaim::plain(),
        };
        Ok((partition, claim, start))
    }
}

/// Where a receiver starts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StartAt {
    /// The offset librdkafka is assigned.
    pub(crate) offset: Offset,
    /// For a start by time: records before this time are skipped until the first at or after
    /// it. The cluster's time lookup (ListOffsets by timestamp) already starts there; this
    /// guards against a broker that answers with an earlier offset (Tansu 0.6.0 answers 0 for
    /// every time).
    pub(crate) skip_before_ms: Option<i64>,
}

/// A partition id as Kafka numbers partitions.
fn parse_partition(partition_id: &str) -> Result<i32, SourceError> {
    partition_id
        .parse::<i32>()
        .ok()
        .filter(|p| *p >= 0 && partition_id == p.to_string())
        .ok_or_else(|| SourceError::NotFound {
            what: format!("partition {partition_id:?} (Kafka partitions are numbered 0, 1, …)"),
        })
}

/// Runs a blocking librdkafka call on Tokio's blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, SourceError> + Send + 'static,
) -> Result<T, SourceError> {
    tokio::task::spawn_blocking(call).await.unwrap_or_else(|e| {
        Err(SourceError::Other {
            description: format!("a Kafka client call failed: {e}"),
        })
    })
}

#[async_trait::async_trait]
impl PartitionSource for KafkaSource {
    fn fully_qualified_namespace(&self) -> &str {
        &self.shared.namespace
    }

    fn event_hub_name(&self) -> &str {
        &self.shared.topic
    }

    async fn partition_ids(&self) -> Result<Vec<String>, SourceError> {
        let ids = self.partitions().await?;
        Ok(ids.iter().map(i32::to_string).collect())
    }

    async fn open_receiver(
        &self,
        options: ReceiverOptions,
    ) -> Result<Box<dyn PartitionReceiver>, SourceError> {
        let shared = Arc::clone(&self.shared);
        let prepared = {
            let options = options.clone();
            blocking(move || shared.prepare(&options)).await?
        };
        let (partition, claim, start) = prepared;
        let receiver =
            KafkaReceiver::open(Arc::clone(&self.shared), options, partition, claim, start)?;
        Ok(Box::new(receiver))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_ids_are_kafka_partition_numbers() {
        assert_eq!(parse_partition("0").unwrap(), 0);
        assert_eq!(parse_partition("11").unwrap(), 11);
        for bad in ["-1", "01", "x", "", "2147483648"] {
            assert!(
                matches!(parse_partition(bad), Err(SourceError::NotFound { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn an_extent_knows_its_last_offset() {
        let empty = PartitionExtent {
            beginning_offset: 5,
            end_offset: 5,
        };
        assert_eq!(empty.last_offset(), None);
        let three = PartitionExtent {
            beginning_offset: 0,
            end_offset: 3,
        };
        assert_eq!(three.last_offset(), Some(2));
    }
}
