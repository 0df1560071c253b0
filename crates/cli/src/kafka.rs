//! `--kafka`: a Kafka topic as the hub `process` and `ownership` work on (glue over
//! `tributary-kafka-source`, present with the `kafka` feature; without it these say how to get
//! it).

use std::sync::Arc;

use anyhow::Result;
use tributary_processor::CheckpointStore;
use tributary_source::PartitionSource;

use crate::args::{GlobalArgs, GroupStore};

/// The namespace ownership and checkpoints are recorded under for a Kafka cluster when
/// --namespace gives none: its first bootstrap server, as the source names it.
pub(crate) fn default_namespace(bootstrap: &str) -> String {
    bootstrap
        .split(',')
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned()
}

#[cfg(feature = "kafka")]
mod engine {
    use std::sync::Arc;

    use anyhow::{Context, Result};
    use tributary_kafka_source::{
        KafkaOffsetsStore, KafkaOptions, KafkaSource, Sasl, SaslMechanism, Tls,
    };
    use tributary_processor::CheckpointStore;

    use crate::args::{GlobalArgs, GroupStore, KafkaSasl};

    /// The connection settings the flags give.
    fn options(global: &GlobalArgs, at: &GroupStore) -> Result<KafkaOptions> {
        let kafka = &at.kafka;
        let bootstrap = kafka.kafka.clone().context("--kafka is given")?;
        let mut options = match &at.connection.connection_string {
            Some(cs) => KafkaOptions::from_event_hubs_connection_string(cs)?,
            None => KafkaOptions::default(),
        };
        options.bootstrap_servers = bootstrap;
        if let (Some(username), Some(password)) = (&kafka.kafka_username, &kafka.kafka_password) {
            options.sasl = Some(Sasl {
                mechanism: match kafka.kafka_sasl_mechanism {
                    KafkaSasl::Plain => SaslMechanism::Plain,
                    KafkaSasl::ScramSha256 => SaslMechanism::ScramSha256,
                    KafkaSasl::ScramSha512 => SaslMechanism::ScramSha512,
                },
                username: username.clone(),
                password: password.clone(),
            });
        }
        if kafka.kafka_tls || global.ca_file.is_some() {
            let tls = options.tls.get_or_insert_with(Tls::default);
            tls.ca_file.clone_from(&global.ca_file);
        }
        options.client_id = Some(format!("tributary-{}", env!("CARGO_PKG_VERSION")));
        Ok(options)
    }

    /// `kafka:`: `ownership` with checkpoints committed to the cluster's group offsets too.
    pub(super) fn offsets_store(
        global: &GlobalArgs,
        at: &GroupStore,
        ownership: Arc<dyn CheckpointStore>,
    ) -> Result<KafkaOffsetsStore> {
        Ok(KafkaOffsetsStore::new(ownership, options(global, at)?))
    }

    /// The topic as a source, recorded under the namespace the flags give.
    pub(super) fn source(global: &GlobalArgs, at: &GroupStore) -> Result<KafkaSource> {
        let source = KafkaSource::new(options(global, at)?, at.hub_name())?;
        Ok(source.with_namespace(at.namespace()?))
    }
}

/// The Kafka topic `at` names, as the processor's source.
#[cfg(feature = "kafka")]
pub(crate) fn source(global: &GlobalArgs, at: &GroupStore) -> Result<Arc<dyn PartitionSource>> {
    Ok(Arc::new(engine::source(global, at)?))
}

/// The `kafka:` store: `ownership`, with checkpoints committed to the Kafka group's offsets too.
#[cfg(feature = "kafka")]
pub(crate) fn offsets_store(
    global: &GlobalArgs,
    at: &GroupStore,
    ownership: Arc<dyn CheckpointStore>,
) -> Result<Arc<dyn CheckpointStore>> {
    Ok(Arc::new(engine::offsets_store(global, at, ownership)?))
}

/// Fails when the Kafka topic `at` names cannot be read (missing, or the cluster unreachable).
#[cfg(feature = "kafka")]
pub(crate) async fn check_topic(global: &GlobalArgs, at: &GroupStore) -> Result<()> {
    use anyhow::Context;
    let source = engine::source(global, at)?;
    source
        .partition_ids()
        .await
        .with_context(|| format!("cannot read Kafka topic {:?}", at.hub_name()))?;
    Ok(())
}

/// Without the `kafka` feature: what to do instead.
#[cfg(not(feature = "kafka"))]
pub(crate) fn source(_: &GlobalArgs, _: &GroupStore) -> Result<Arc<dyn PartitionSource>> {
    anyhow::bail!(NOT_BUILT)
}

/// Without the `kafka` feature: what to do instead.
#[cfg(not(feature = "kafka"))]
pub(crate) fn offsets_store(
    _: &GlobalArgs,
    _: &GroupStore,
    _: Arc<dyn CheckpointStore>,
) -> Result<Arc<dyn CheckpointStore>> {
    anyhow::bail!(NOT_BUILT)
}

/// Without the `kafka` feature: what to do instead.
#[cfg(not(feature = "kafka"))]
pub(crate) async fn check_topic(_: &GlobalArgs, _: &GroupStore) -> Result<()> {
    anyhow::bail!(NOT_BUILT)
}

#[cfg(not(feature = "kafka"))]
const NOT_BUILT: &str = "this tributary was built without Kafka support: build it with \
                         `cargo build --release --features kafka` (librdkafka is compiled from source)";
