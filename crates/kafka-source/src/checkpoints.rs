//! The `kafka:` checkpoint store: a processor's checkpoints committed as the Kafka consumer
//! group's offsets as well, so Kafka's own tools (`kafka-consumer-groups`, confluent-kafka's
//! admin client, lag exporters) see the processor's progress, and a processor taking over from
//! a plain Kafka consumer group starts where that group had committed.
//!
//! # What it guarantees
//! - Ownership, and the fence every checkpoint passes, stay in the store it wraps (SQLite,
//!   PostgreSQL, blobs): Kafka offsets have no owner to fence with. A checkpoint is written there
//!   first; only once that store accepted it (its owner still owns the partition) is it
//!   committed to Kafka, as the offset of the next record to read (the checkpointed offset + 1),
//!   under the group id that is the processor's consumer group, for the topic that is the
//!   processor's event hub. A checkpoint refused by the fence is never committed.
//! - Reading resumes from the wrapped store's checkpoint. A partition with none there resumes
//!   from the group's committed Kafka offset, if any (the record before it is taken as the last
//!   processed), so a processor replaces a Kafka consumer group without reading it again.
//!   A committed offset of 0 means "nothing processed": the processor's initial position applies.
//! - A failed commit to Kafka fails the checkpoint (a [`StoreError::Backend`] naming the
//!   cluster); the wrapped store has it already, so the processor's next checkpoint commits the
//!   Kafka offset again. The Kafka offset may lag the wrapped store's, never run ahead of it.
//!
//! Commits come from a consumer that never joins the group (a "simple" commit with no
//! generation), as `kafka-consumer-groups --reset-offsets` does: brokers accept it while no
//! member of a Kafka consumer group holds the partition.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tributary_processor::{
    Checkpoint, CheckpointStore, Ownership, OwnershipFence, OwnershipListing, StoreError,
};

use crate::options::KafkaOptions;

/// How long a commit or a lookup of committed offsets may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Checkpoints kept by `ownership` (with every ownership record) and committed to the Kafka
/// cluster `options` reach as its consumer groups' offsets.
pub struct KafkaOffsetsStore {
    ownership: Arc<dyn CheckpointStore>,
    options: KafkaOptions,
    /// One consumer per group id, made on first use.
    consumers: Mutex<HashMap<String, Arc<BaseConsumer>>>,
}

impl std::fmt::Debug for KafkaOffsetsStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaOffsetsStore")
            .field("bootstrap_servers", &self.options.bootstrap_servers)
            .finish_non_exhaustive()
    }
}

impl KafkaOffsetsStore {
    /// Ownership and fenced checkpoints in `ownership`; checkpoints also committed to the
    /// cluster `options` reach.
    pub fn new(ownership: Arc<dyn CheckpointStore>, options: KafkaOptions) -> KafkaOffsetsStore {
        KafkaOffsetsStore {
            ownership,
            options,
            consumers: Mutex::default(),
        }
    }

    /// The consumer that commits and looks up group `group`'s offsets.
    fn consumer(
        &self,
        group: &str,
        operation: &'static str,
    ) -> Result<Arc<BaseConsumer>, StoreError> {
        let mut consumers = self.consumers.lock().expect("consumers");
        if let Some(consumer) = consumers.get(group) {
            return Ok(consumer.clone());
        }
        let consumer: BaseConsumer = self
            .options
            .client_config()
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| self.failed(operation, &e))?;
        let consumer = Arc::new(consumer);
        consumers.insert(group.to_owned(), consumer.clone());
        Ok(consumer)
    }

    fn failed(&self, operation: &'static str, error: &rdkafka::error::KafkaError) -> StoreError {
        StoreError::Backend {
            operation,
            description: format!("Kafka cluster {}: {error}", self.options.bootstrap_servers),
        }
    }

    /// Commits `checkpoint` as its group's offset: the next record to read.
    async fn commit(&self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        const OPERATION: &str = "committing a Kafka offset";
        let invalid = |reason: String| StoreError::Invalid {
            what: "checkpoint",
            reason,
        };
        let last = match (checkpoint.offset, checkpoint.sequence_number) {
            (Some(offset), _) => {
                i64::try_from(offset).map_err(|_| invalid(format!("offset {offset}")))?
            }
            (None, Some(sequence)) => sequence,
            (None, None) => return Err(invalid("neither an offset nor a sequence number".into())),
        };
        let partition: i32 = checkpoint.partition_id.parse().map_err(|_| {
            invalid(format!(
                "partition {:?} is not a Kafka partition",
                checkpoint.partition_id
            ))
        })?;
        let mut offsets = TopicPartitionList::new();
        offsets
            .add_partition_offset(
                &checkpoint.event_hub_name,
                partition,
                Offset::Offset(last + 1),
            )
            .map_err(|e| self.failed(OPERATION, &e))?;
        let consumer = self.consumer(&checkpoint.consumer_group, OPERATION)?;
        let committed =
            tokio::task::spawn_blocking(move || consumer.commit(&offsets, CommitMode::Sync))
                .await
                .map_err(|e| StoreError::Backend {
                    operation: OPERATION,
                    description: e.to_string(),
                })?;
        committed.map_err(|e| self.failed(OPERATION, &e))
    }

    /// The group's committed offsets of `partitions` of `topic`, as checkpoints of the record
    /// before each.
    async fn committed(
        &self,
        (namespace, topic, group): (&str, &str, &str),
        partitions: Vec<i32>,
    ) -> Result<Vec<Checkpoint>, StoreError> {
        const OPERATION: &str = "reading committed Kafka offsets";
        if partitions.is_empty() {
            return Ok(Vec::new());
        }
        let mut wanted = TopicPartitionList::new();
        for partition in partitions {
            wanted.add_partition(topic, partition);
        }
        let consumer = self.consumer(group, OPERATION)?;
        let committed = tokio::task::spawn_blocking(move || {
            consumer.committed_offsets(wanted, REQUEST_TIMEOUT)
        })
        .await
        .map_err(|e| StoreError::Backend {
            operation: OPERATION,
            description: e.to_string(),
        })?
        .map_err(|e| self.failed(OPERATION, &e))?;
        Ok(committed
            .elements()
            .iter()
            .filter_map(|element| match element.offset() {
                Offset::Offset(next) if next > 0 => Some(Checkpoint {
                    fully_qualified_namespace: namespace.to_owned(),
                    event_hub_name: topic.to_owned(),
                    consumer_group: group.to_owned(),
                    partition_id: element.partition().to_string(),
                    offset: u64::try_from(next - 1).ok(),
                    sequence_number: Some(next - 1),
                }),
                _ => None,
            })
            .collect())
    }
}

#[async_trait::async_trait]
impl CheckpointStore for KafkaOffsetsStore {
    async fn list_ownership(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<Vec<Ownership>, StoreError> {
        self.ownership
            .list_ownership(fully_qualified_namespace, event_hub_name, consumer_group)
            .await
    }

    async fn claim_ownership(&self, claims: Vec<Ownership>) -> Result<Vec<Ownership>, StoreError> {
        self.ownership.claim_ownership(claims).await
    }

    /// The wrapped store's checkpoints, and for the partitions owned or once owned that have
    /// none there, the group's committed Kafka offsets.
    async fn list_checkpoints(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<Vec<Checkpoint>, StoreError> {
        let place = (fully_qualified_namespace, event_hub_name, consumer_group);
        let mut checkpoints = self
            .ownership
            .list_checkpoints(fully_qualified_namespace, event_hub_name, consumer_group)
            .await?;
        let ownership = self
            .ownership
            .list_ownership(fully_qualified_namespace, event_hub_name, consumer_group)
            .await?;
        let missing: Vec<i32> = ownership
            .iter()
            .filter(|o| !checkpoints.iter().any(|c| c.partition_id == o.partition_id))
            .filter_map(|o| o.partition_id.parse().ok())
            .collect();
        checkpoints.extend(self.committed(place, missing).await?);
        Ok(checkpoints)
    }

    async fn update_checkpoint(
        &self,
        checkpoint: Checkpoint,
        fence: &OwnershipFence,
    ) -> Result<(), StoreError> {
        self.ownership
            .update_checkpoint(checkpoint.clone(), fence)
            .await?;
        self.commit(&checkpoint).await
    }

    fn keeps_host_records(&self) -> bool {
        self.ownership.keeps_host_records()
    }

    async fn renew_host(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
        owner_id: &str,
    ) -> Result<OwnershipListing, StoreError> {
        self.ownership
            .renew_host(
                fully_qualified_namespace,
                event_hub_name,
                consumer_group,
                owner_id,
            )
            .await
    }

    async fn list_ownership_and_hosts(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<OwnershipListing, StoreError> {
        self.ownership
            .list_ownership_and_hosts(fully_qualified_namespace, event_hub_name, consumer_group)
            .await
    }

    async fn remove_host(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
        owner_id: &str,
    ) -> Result<(), StoreError> {
        self.ownership
            .remove_host(
                fully_qualified_namespace,
                event_hub_name,
                consumer_group,
                owner_id,
            )
            .await
    }
}
