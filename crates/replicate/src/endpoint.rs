//! Opening a task's endpoints: the source as a [`PartitionSource`] for the processor host, the
//! targets as [`Target`]s, each with the identity events record.
//!
//! A hub named by a data directory runs in this process; every endpoint on one directory
//! shares one broker ([`Brokers`]), since a data directory is opened by one broker at a time. A
//! hub named by a connection string is reached over AMQP (TLS unless the string says
//! `UseDevelopmentEmulator=true`), or, when the task file names an alias for it, wherever the
//! alias says ([`tributary_client::failover`]: the client follows the alias, and switches on its
//! change or on persistent errors). A Kafka topic (`kind = "kafka"`) is read and written
//! through [`crate::kafka`]. Opening checks that the hub exists and the credentials
//! work, so a task with a misconfigured endpoint fails before it reads anything; a source that
//! does not answer at all is an [`OpenError`] marked `unreachable`, which
//! [`Replicator::start`](crate::Replicator::start) waits out when told to.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Mutex;
use tributary_broker::{Broker, BrokerConfig, BrokerSource};
use tributary_client::{ClientOptions, FailoverOptions, ProducerClient, RemoteHub};
use tributary_source::PartitionSource;

use crate::limits::CONNECT_TIMEOUT;
use crate::target::{HubIdentity, LocalTarget, RemoteTarget, Target};
use crate::task::{Connection, Endpoint};

/// The brokers of this process, one per data directory: those the caller gave
/// ([`Brokers::adopt`]) and those the task opened.
#[derive(Debug, Default, Clone)]
pub struct Brokers {
    open: Arc<Mutex<HashMap<PathBuf, (Broker, Opener)>>>,
}

/// Who opened a broker, and so who closes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opener {
    /// The caller: it stays open when the task stops.
    Caller,
    /// The task: [`Brokers::shutdown`] closes it.
    Task,
}

impl Brokers {
    /// Brokers the caller already has (e.g. the hub `tributary serve` runs), so endpoints on
    /// their data directories use them instead of opening the directory a second time. They
    /// stay open when the task stops.
    pub async fn adopt(&self, broker: Broker) {
        let dir = canonical(&broker.config().data_dir);
        self.open.lock().await.insert(dir, (broker, Opener::Caller));
    }

    async fn open(&self, dir: &Path) -> Result<Broker, String> {
        let key = canonical(dir);
        let mut open = self.open.lock().await;
        if let Some((broker, _)) = open.get(&key) {
            return Ok(broker.clone());
        }
        let broker = Broker::open(BrokerConfig::new(dir))
            .await
            .map_err(|e| format!("cannot open the data directory {}: {e}", dir.display()))?;
        open.insert(key, (broker.clone(), Opener::Task));
        Ok(broker)
    }

    /// Shuts every broker the task opened down (syncing their logs); adopted ones stay open.
    pub async fn shutdown(&self) {
        let brokers: Vec<Broker> = {
            let mut open = self.open.lock().await;
            let opened: Vec<PathBuf> = open
                .iter()
                .filter(|(_, (_, opener))| *opener == Opener::Task)
                .map(|(dir, _)| dir.clone())
                .collect();
            opened
                .iter()
                .filter_map(|dir| open.remove(dir).map(|(broker, _)| broker))
                .collect()
        };
        for broker in brokers {
            if let Err(error) = broker.shutdown().await {
                tracing::warn!(%error, "closing a data directory failed");
            }
        }
    }
}

fn canonical(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned())
}

fn client_options(ca_file: Option<&PathBuf>, failover: Option<&FailoverOptions>) -> ClientOptions {
    let mut options = ClientOptions::default().with_application_id("tributary-replicate");
    if let Some(path) = ca_file {
        options = options.with_trusted_certificates(path);
    }
    if let Some(failover) = failover {
        options = options.with_failover(failover.clone());
    }
    options
}

/// Runs `future` under the connect timeout, naming what it waited for.
async fn timed<T>(
    what: &str,
    future: impl Future<Output = Result<T, OpenError>>,
) -> Result<T, OpenError> {
    tokio::time::timeout(CONNECT_TIMEOUT, future)
        .await
        .map_err(|_| OpenError {
            message: format!("{what} did not answer within {CONNECT_TIMEOUT:?}"),
            unreachable: true,
        })?
}

/// Why an endpoint did not open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenError {
    /// What went wrong, for a person.
    pub message: String,
    /// The endpoint did not answer (an unreachable cluster, no answer in time): trying again
    /// later may succeed. Otherwise it answered and refused (a missing topic, bad credentials).
    pub unreachable: bool,
}

impl OpenError {
    /// The endpoint answered and refused.
    pub fn refused(message: impl Into<String>) -> OpenError {
        OpenError {
            message: message.into(),
            unreachable: false,
        }
    }
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<OpenError> for String {
    fn from(error: OpenError) -> String {
        error.message
    }
}

/// An opened source.
#[derive(Clone)]
pub struct OpenedSource {
    /// What the processor host reads.
    pub source: Arc<dyn PartitionSource>,
    /// Its identity and partitions.
    pub identity: HubIdentity,
    /// Where its partitions' newest sequence numbers are read.
    pub newest: SourceNewest,
}

/// Reads a source partition's newest sequence number over the source's own connection (an
/// idle partition's offset sync needs it when its owner has read nothing yet).
#[derive(Debug, Clone)]
pub enum SourceNewest {
    /// A hub in this process.
    Local {
        /// Its broker.
        broker: Broker,
        /// The hub.
        hub: String,
    },
    /// A hub over AMQP.
    Remote(RemoteHub),
    /// A Kafka topic (its high watermarks).
    #[cfg(feature = "kafka")]
    Kafka(Arc<tributary_kafka_source::KafkaSource>),
}

impl SourceNewest {
    /// The newest sequence number of `partition` (-1: it never held an event).
    pub async fn last_sequence_number(&self, partition: &str) -> Result<i64, String> {
        match self {
            SourceNewest::Local { broker, hub } => broker
                .partition_properties(hub, partition)
                .map(|p| p.last_enqueued_sequence_number)
                .map_err(|e| e.to_string()),
            SourceNewest::Remote(remote) => remote
                .partition_properties(partition)
                .await
                .map(|p| p.last_enqueued_sequence_number)
                .map_err(|e| e.to_string()),
            #[cfg(feature = "kafka")]
            SourceNewest::Kafka(source) => {
                crate::kafka::last_sequence_number(source, partition).await
            }
        }
    }
}

impl std::fmt::Debug for OpenedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedSource")
            .field("hub", &self.source.event_hub_name())
            .field("identity", &self.identity)
            .finish()
    }
}

/// Opens `endpoint` for reading.
pub async fn open_source(
    endpoint: &Endpoint,
    brokers: &Brokers,
) -> Result<OpenedSource, OpenError> {
    let hub = &endpoint.event_hub;
    match &endpoint.connection {
        Connection::Local { data_dir } => {
            let broker = brokers.open(data_dir).await.map_err(OpenError::refused)?;
            let definition = broker
                .describe_hub(hub)
                .map_err(|e| OpenError::refused(e.to_string()))?;
            Ok(OpenedSource {
                source: Arc::new(BrokerSource::new(broker.clone(), "localhost", hub.clone())),
                identity: HubIdentity {
                    id: definition.id,
                    partition_count: definition.partition_count,
                },
                newest: SourceNewest::Local {
                    broker,
                    hub: hub.clone(),
                },
            })
        }
        Connection::Remote {
            connection_string,
            ca_file,
            failover,
        } => {
            let what = format!("event hub {hub:?}");
            let failed = |what: &str, e: tributary_client::ClientError| OpenError {
                unreachable: e.is_transient(),
                message: format!("{what}: {e}"),
            };
            timed(&what, async {
                let remote = RemoteHub::connect_with_options(
                    connection_string,
                    Some(hub),
                    client_options(ca_file.as_ref(), failover.as_ref()),
                )
                .await
                .map_err(|e| failed("cannot connect", e))?;
                let properties = remote
                    .hub_properties()
                    .await
                    .map_err(|e| failed("cannot read the hub's properties", e))?;
                let id = properties.hub_id.unwrap_or_else(|| {
                    format!("{}/{}", remote.fully_qualified_namespace(), hub).to_ascii_lowercase()
                });
                Ok(OpenedSource {
                    identity: HubIdentity {
                        id,
                        partition_count: properties.partition_ids.len() as u32,
                    },
                    newest: SourceNewest::Remote(remote.clone()),
                    source: Arc::new(remote),
                })
            })
            .await
        }
        Connection::Kafka(kafka) => {
            let what = format!("Kafka topic {hub:?} at {}", kafka.bootstrap_servers);
            timed(&what, crate::kafka::open_source(kafka, hub)).await
        }
    }
}

/// Opens `endpoint` for sending, and reads its identity.
pub async fn open_target(
    endpoint: &Endpoint,
    brokers: &Brokers,
) -> Result<(Arc<dyn Target>, HubIdentity), String> {
    let hub = &endpoint.event_hub;
    let target: Arc<dyn Target> = match &endpoint.connection {
        Connection::Local { data_dir } => {
            Arc::new(LocalTarget::new(brokers.open(data_dir).await?, hub.clone()))
        }
        Connection::Remote {
            connection_string,
            ca_file,
            failover,
        } => {
            let producer = timed(&format!("event hub {hub:?}"), async {
                ProducerClient::connect_with_options(
                    connection_string,
                    Some(hub),
                    client_options(ca_file.as_ref(), failover.as_ref()),
                )
                .await
                .map_err(|e| OpenError::refused(format!("cannot connect: {e}")))
            })
            .await
            .map_err(String::from)?;
            Arc::new(RemoteTarget::new(producer))
        }
        Connection::Kafka(kafka) => crate::kafka::open_target(kafka, hub)?,
    };
    let identity = timed(target.describe(), async {
        target
            .identity()
            .await
            .map_err(|e| OpenError::refused(e.to_string()))
    })
    .await
    .map_err(String::from)?;
    Ok((target, identity))
}
