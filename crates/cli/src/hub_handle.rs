//! One event hub as the commands see it: in this process (the data directory) or remote (a
//! connection string to a Tributary hub or to Azure Event Hubs). Reading goes through the
//! `tributary_source::PartitionSource` in both cases, so `receive` and `process` have one code path.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use tokio::sync::OnceCell;
use tributary_broker::{Broker, BrokerConfig, BrokerSource, SendReceipt};
use tributary_client::{ClientOptions, ProducerClient, RemoteHub};
use tributary_event::{EventData, SendTarget};
use tributary_eventhubs::send::BatchSizer;
use tributary_log::LogConfig;
use tributary_source::PartitionSource;

use crate::args::GlobalArgs;
use crate::receipts::ReadBack;

/// An event hub, local or remote.
pub enum HubHandle {
    /// In this process, on the data directory.
    Local {
        /// The broker.
        broker: Broker,
        /// The hub's name as given.
        hub: String,
    },
    /// Over AMQP.
    Remote {
        /// Reading and properties.
        hub: RemoteHub,
        /// Sending; connected on first use.
        producer: OnceCell<ProducerClient>,
        /// The connection string, for the producer.
        connection_string: String,
        /// The hub's name.
        name: String,
        /// How the producer connects.
        options: ClientOptions,
        /// Reads batches back for their receipts; made on the first send that wants one.
        read_back: Box<tokio::sync::Mutex<Option<ReadBack>>>,
    },
}

impl HubHandle {
    /// Opens the hub: remote when a connection string is given or a `tributary serve` runs on
    /// the data directory (through its AMQP door), else in this process.
    pub async fn open(
        global: &GlobalArgs,
        hub: &str,
        connection_string: Option<&str>,
    ) -> Result<Self> {
        let local_server = match connection_string {
            Some(_) => None,
            None => crate::running::local_connection_string(&global.data_dir).transpose()?,
        };
        if global.alias.failover_options()?.is_some() && connection_string.is_none() {
            bail!(
                "--alias-file and --alias-srv name a remote hub's endpoint: give --connection-string for its key"
            );
        }
        match connection_string.or(local_server.as_deref()) {
            None => {
                let broker = open_broker(global).await?;
                broker.describe_hub(hub)?;
                Ok(HubHandle::Local {
                    broker,
                    hub: hub.to_owned(),
                })
            }
            Some(cs) => {
                let options = client_options(global)?;
                let remote = RemoteHub::connect_with_options(cs, Some(hub), options.clone())
                    .await
                    .with_context(|| format!("cannot connect to event hub {hub:?}"))?;
                Ok(HubHandle::Remote {
                    hub: remote,
                    producer: OnceCell::new(),
                    connection_string: cs.to_owned(),
                    name: hub.to_owned(),
                    options,
                    read_back: Box::default(),
                })
            }
        }
    }

    /// The hub's partition ids.
    pub async fn partition_ids(&self) -> Result<Vec<String>> {
        match self {
            HubHandle::Local { broker, hub } => {
                let count = broker.describe_hub(hub)?.partition_count;
                Ok((0..count).map(|p| p.to_string()).collect())
            }
            HubHandle::Remote { hub, .. } => Ok(hub.hub_properties().await?.partition_ids),
        }
    }

    /// The sequence number of a partition's newest event (-1 if it has none).
    pub async fn last_sequence(&self, partition: &str) -> Result<i64> {
        Ok(match self {
            HubHandle::Local { broker, hub } => {
                broker
                    .partition_properties(hub, partition)?
                    .last_enqueued_sequence_number
            }
            HubHandle::Remote { hub, .. } => {
                hub.partition_properties(partition)
                    .await?
                    .last_enqueued_sequence_number
            }
        })
    }

    /// Checks that `partition` is one of the hub's; the error names it and the hub's ids.
    pub async fn check_partition(&self, partition: &str) -> Result<()> {
        let ids = self.partition_ids().await?;
        if ids.iter().any(|id| id == partition) {
            return Ok(());
        }
        let name = match self {
            HubHandle::Local { hub, .. } => hub,
            HubHandle::Remote { name, .. } => name,
        };
        bail!(
            "event hub {name:?}: {}",
            crate::input::no_such_partition(partition, &ids)
        )
    }

    /// The hub as a partition source; `namespace` names it in checkpoint stores (a remote hub
    /// uses its host name when `namespace` is `None`).
    pub fn source(&self, namespace: Option<&str>) -> Arc<dyn PartitionSource> {
        match self {
            HubHandle::Local { broker, hub } => Arc::new(BrokerSource::new(
                broker.clone(),
                namespace.unwrap_or("localhost"),
                hub.clone(),
            )),
            HubHandle::Remote { hub, .. } => Arc::new(hub.clone()),
        }
    }

    /// Whether reads may return nothing for a moment even with events available (a remote
    /// receiver's first credit round trip), so "nothing yet" is not "the end".
    pub fn is_remote(&self) -> bool {
        matches!(self, HubHandle::Remote { .. })
    }

    /// Sends one batch. With `receipts`, returns where its events were stored: one receipt in
    /// process (the broker's), one per transfer over AMQP (read back from the hub, see
    /// [`crate::receipts`]; the batch may be cut to the hub's message size); else none.
    pub async fn send(
        &self,
        target: SendTarget,
        mut events: Vec<EventData>,
        receipts: bool,
    ) -> Result<Vec<SendReceipt>> {
        match self {
            HubHandle::Local { broker, hub } => {
                let receipt = broker.send(hub, target, events).await?;
                Ok(if receipts { vec![receipt] } else { Vec::new() })
            }
            HubHandle::Remote {
                hub,
                producer,
                connection_string,
                name,
                options,
                read_back,
            } => {
                let producer = producer
                    .get_or_try_init(|| {
                        ProducerClient::connect_with_options(
                            connection_string,
                            Some(name),
                            options.clone(),
                        )
                    })
                    .await?;
                let mut read_back = read_back.lock().await;
                let mut partition = None;
                if receipts {
                    if read_back.is_none() {
                        let ids = hub.hub_properties().await?.partition_ids;
                        *read_back = Some(ReadBack::new(hub.clone(), ids));
                    }
                    let read_back = read_back.as_mut().expect("made above");
                    let p = read_back.partition_of(&target)?;
                    // Before the send: the receiver starts after what the partition holds now.
                    read_back.prepare(&p, &mut events).await?;
                    partition = Some(p);
                }
                // Cut by the hub's message size, as the SDKs' batches do, instead of failing.
                let bytes_max = producer.max_message_bytes(&target).await?;
                let mut found = Vec::new();
                for events in cut_by_size(events, &target, bytes_max)? {
                    producer.send(&events, target.clone()).await?;
                    if let (Some(read_back), Some(partition)) = (read_back.as_mut(), &partition) {
                        found.push(read_back.find(partition, &events).await?);
                    }
                }
                Ok(found)
            }
        }
    }
}

/// Splits `events` into batches whose encoding fits in `bytes_max` (an event too large alone
/// is a batch of its own, for the hub to refuse with its reason).
fn cut_by_size(
    events: Vec<EventData>,
    target: &SendTarget,
    bytes_max: u64,
) -> Result<Vec<Vec<EventData>>> {
    let key = match target {
        SendTarget::PartitionKey(key) => Some(key.as_str()),
        _ => None,
    };
    let mut sizer = BatchSizer::new(key)?;
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    let mut bytes = sizer.envelope_bytes();
    for event in events {
        let event_bytes = sizer.event_bytes(&event)?;
        if !batch.is_empty() && bytes + event_bytes > bytes_max {
            batches.push(std::mem::take(&mut batch));
            bytes = sizer.envelope_bytes();
        }
        bytes += event_bytes;
        batch.push(event);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    Ok(batches)
}

/// The options of the clients the CLI connects to a remote hub with (following the hub alias
/// the flags name, if any).
pub fn client_options(global: &GlobalArgs) -> Result<ClientOptions> {
    let mut options = ClientOptions::default().with_application_id("tributary-cli");
    if let Some(path) = &global.ca_file {
        options = options.with_trusted_certificates(path);
    }
    if let Some(failover) = global.alias.failover_options()? {
        options = options.with_failover(failover);
    }
    Ok(options)
}

/// Opens the broker on the data directory with the global settings.
pub async fn open_broker(global: &GlobalArgs) -> Result<Broker> {
    let config = BrokerConfig {
        log: LogConfig {
            durability: global.durability,
            event_bytes_max: global.event_bytes_max,
            ..LogConfig::default()
        },
        sync_scope: global.sync_scope,
        ..BrokerConfig::new(&global.data_dir)
    };
    Broker::open(config).await.with_context(|| {
        format!(
            "cannot open the data directory {}",
            global.data_dir.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_cut_to_fit_the_hub_message_size() {
        let events: Vec<EventData> = (0..500).map(|_| EventData::new("x".repeat(3000))).collect();
        let bytes_max = 256 * 1024;
        let batches = cut_by_size(events, &SendTarget::RoundRobin, bytes_max).unwrap();
        assert!(batches.len() > 1);
        assert_eq!(batches.iter().map(Vec::len).sum::<usize>(), 500);
        for batch in &batches {
            let (payload, _) = tributary_eventhubs::send::encode_outgoing(batch, None).unwrap();
            assert!(payload.len() as u64 <= bytes_max, "{}", payload.len());
        }
    }
}
