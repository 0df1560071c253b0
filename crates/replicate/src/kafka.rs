//! Kafka endpoints of a task (`kind = "kafka"`, [`crate::task::KafkaConnection`]): the topic as
//! the source the processor host reads, and [`KafkaTarget`], a topic as a target — both through
//! `tributary-kafka-source` (librdkafka), present with the `kafka` feature. Without it a task
//! file with a Kafka endpoint is still checked, and opening it says how to get the feature.
//!
//! A Kafka source is identified as `<first bootstrap server>/<topic>` (what `repl-origin` and
//! `repl-path` record), its partitions' newest sequence numbers are their high watermarks − 1,
//! so the offset map works with Kafka on either side.

use crate::endpoint::{OpenError, OpenedSource};
use crate::task::KafkaConnection;

#[cfg(feature = "kafka")]
mod engine {
    use std::sync::Arc;

    use tributary_event::{EventData, SendTarget};
    use tributary_eventhubs::limits::MESSAGE_BYTES_MAX;
    use tributary_kafka_source::{
        Destination, KafkaOptions, KafkaProducer, KafkaSource, ProduceError, Sasl, SaslMechanism,
        Tls,
    };

    use crate::endpoint::{OpenError, OpenedSource, SourceNewest};
    use crate::target::{BatchStamps, HubIdentity, Target, TargetError};
    use crate::task::KafkaConnection;

    /// The librdkafka settings a task's Kafka endpoint gives.
    pub(super) fn options(kafka: &KafkaConnection) -> Result<KafkaOptions, String> {
        let mut options = match &kafka.connection_string {
            Some(cs) => {
                KafkaOptions::from_event_hubs_connection_string(cs).map_err(|e| e.to_string())?
            }
            None => KafkaOptions::default(),
        };
        options.bootstrap_servers = kafka.bootstrap_servers.clone();
        if let Some((mechanism, username, password)) = &kafka.sasl {
            options.sasl = Some(Sasl {
                mechanism: match mechanism.as_str() {
                    "SCRAM-SHA-256" => SaslMechanism::ScramSha256,
                    "SCRAM-SHA-512" => SaslMechanism::ScramSha512,
                    _ => SaslMechanism::Plain,
                },
                username: username.clone(),
                password: password.clone(),
            });
        }
        if kafka.tls {
            let tls = options.tls.get_or_insert_with(Tls::default);
            tls.ca_file.clone_from(&kafka.ca_file);
        }
        options.client_id = Some("tributary-replicate".to_owned());
        Ok(options)
    }

    /// The id a Kafka topic is recorded under.
    pub(super) fn identity_id(kafka: &KafkaConnection, topic: &str) -> String {
        format!("{}/{topic}", kafka.namespace()).to_ascii_lowercase()
    }

    /// Opens the topic for reading; checks that it exists.
    pub(super) async fn open_source(
        kafka: &KafkaConnection,
        topic: &str,
    ) -> Result<OpenedSource, OpenError> {
        let source = KafkaSource::new(options(kafka).map_err(OpenError::refused)?, topic)
            .map_err(|e| OpenError::refused(e.to_string()))?;
        let partitions = source.partitions().await.map_err(|e| OpenError {
            unreachable: e.is_transient(),
            message: format!("cannot read the topic: {e}"),
        })?;
        let source = Arc::new(source);
        Ok(OpenedSource {
            identity: HubIdentity {
                id: identity_id(kafka, topic),
                partition_count: u32::try_from(partitions.len()).unwrap_or(u32::MAX),
            },
            newest: SourceNewest::Kafka(Arc::clone(&source)),
            source,
        })
    }

    /// A partition's newest sequence number (-1: empty), from its high watermark.
    pub(crate) async fn last_sequence_number(
        source: &KafkaSource,
        partition: &str,
    ) -> Result<i64, String> {
        let extent = source
            .partition_extent(partition)
            .await
            .map_err(|e| e.to_string())?;
        Ok(extent.end_offset - 1)
    }

    /// A Kafka topic a task sends to.
    pub struct KafkaTarget {
        producer: KafkaProducer,
        /// For metadata and watermarks.
        source: KafkaSource,
        id: String,
        description: String,
    }

    impl std::fmt::Debug for KafkaTarget {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("KafkaTarget")
                .field("description", &self.description)
                .finish_non_exhaustive()
        }
    }

    impl KafkaTarget {
        /// The topic `topic` of the cluster `kafka` names (nothing is sent yet).
        pub fn new(kafka: &KafkaConnection, topic: &str) -> Result<KafkaTarget, String> {
            let options = options(kafka)?;
            Ok(KafkaTarget {
                producer: KafkaProducer::new(&options, topic).map_err(|e| e.to_string())?,
                source: KafkaSource::new(options, topic).map_err(|e| e.to_string())?,
                id: identity_id(kafka, topic),
                description: format!("Kafka topic {topic:?} at {}", kafka.bootstrap_servers),
            })
        }
    }

    fn target_error(error: ProduceError) -> TargetError {
        match error {
            ProduceError::Transient(text) => TargetError::Transient(text),
            ProduceError::Refused(text) => TargetError::Refused(text),
            ProduceError::Misconfigured(text) => TargetError::Misconfigured(text),
        }
    }

    fn source_error(error: tributary_source::SourceError) -> TargetError {
        match error {
            tributary_source::SourceError::NotFound { .. }
            | tributary_source::SourceError::Unauthorized { .. } => {
                TargetError::Misconfigured(error.to_string())
            }
            _ => TargetError::Transient(error.to_string()),
        }
    }

    #[async_trait::async_trait]
    impl Target for KafkaTarget {
        fn describe(&self) -> &str {
            &self.description
        }

        async fn identity(&self) -> Result<HubIdentity, TargetError> {
            let partitions = self.source.partitions().await.map_err(source_error)?;
            Ok(HubIdentity {
                id: self.id.clone(),
                partition_count: u32::try_from(partitions.len()).unwrap_or(u32::MAX),
            })
        }

        async fn batch_bytes_max(&self, _to: &SendTarget) -> Result<u64, TargetError> {
            // Kafka's default message.max.bytes is about 1 MB, as a hub's transfer limit.
            Ok(MESSAGE_BYTES_MAX)
        }

        async fn send(
            &self,
            events: &[EventData],
            stamps: Option<BatchStamps<'_>>,
            to: &SendTarget,
        ) -> Result<(), TargetError> {
            // A Kafka record holds its stamp as headers: the events hold it.
            let events = BatchStamps::held(stamps, events);
            let events = events.as_ref();
            let destination = match to {
                SendTarget::Partition(id) => Destination::Partition(id.parse().map_err(|_| {
                    TargetError::Misconfigured(format!("{id:?} is not a Kafka partition"))
                })?),
                SendTarget::PartitionKey(key) => Destination::Key(key),
                SendTarget::RoundRobin => Destination::Any,
            };
            self.producer
                .send(events, destination)
                .await
                .map_err(target_error)
        }

        async fn last_sequence_number(&self, partition: &str) -> Result<Option<i64>, TargetError> {
            let extent = self
                .source
                .partition_extent(partition)
                .await
                .map_err(source_error)?;
            Ok(Some(extent.end_offset - 1))
        }
    }
}

#[cfg(feature = "kafka")]
pub use engine::KafkaTarget;
#[cfg(feature = "kafka")]
pub(crate) use engine::last_sequence_number;

/// Opens a Kafka topic as the task's source.
pub(crate) async fn open_source(
    kafka: &KafkaConnection,
    topic: &str,
) -> Result<OpenedSource, OpenError> {
    #[cfg(feature = "kafka")]
    return engine::open_source(kafka, topic).await;
    #[cfg(not(feature = "kafka"))]
    {
        let _ = (kafka, topic);
        Err(OpenError::refused(NOT_BUILT))
    }
}

/// Opens a Kafka topic as a target.
pub(crate) fn open_target(
    kafka: &KafkaConnection,
    topic: &str,
) -> Result<std::sync::Arc<dyn crate::target::Target>, String> {
    #[cfg(feature = "kafka")]
    return Ok(std::sync::Arc::new(KafkaTarget::new(kafka, topic)?));
    #[cfg(not(feature = "kafka"))]
    {
        let _ = (kafka, topic);
        Err(NOT_BUILT.to_owned())
    }
}

#[cfg(not(feature = "kafka"))]
const NOT_BUILT: &str = "this build has no Kafka support: build tributary (or tributary-replicate) \
                         with the `kafka` feature (librdkafka is compiled from source)";
