//! `tributary process` (one event processor host) and `tributary ownership` (the tracking table).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tributary_event::ReceivedEvent;
use tributary_processor::store::{CheckpointStore, StoreLocation};
use tributary_processor::{
    CloseReason, EventProcessor, EventProcessorHost, LoadBalancingStrategy, PartitionContext,
    ProcessorOptions,
};

use crate::args::{Action, GlobalArgs, GroupStore, OwnershipArgs, ProcessArgs, Strategy};
use crate::hub_handle::HubHandle;
use crate::output;

impl GroupStore {
    /// The hub's name: with --kafka, the topic (--topic, else the hub argument).
    pub(crate) fn hub_name(&self) -> &str {
        self.kafka.topic.as_deref().unwrap_or(&self.hub)
    }

    pub(crate) fn namespace(&self) -> Result<String> {
        if let (None, Some(bootstrap)) = (&self.namespace, &self.kafka.kafka) {
            return Ok(crate::kafka::default_namespace(bootstrap));
        }
        Ok(
            match (&self.namespace, &self.connection.connection_string) {
                (Some(namespace), _) => namespace.clone(),
                (None, Some(cs)) => tributary_client::ConnectionString::parse(cs)?
                    .host()
                    .to_owned(),
                (None, None) => "localhost".to_owned(),
            },
        )
    }

    /// The `--store` URL, parsed (`hub:` is the hub's own store). By default the hub's own
    /// store when the hub is remote (a connection string, or a running `serve` on the data
    /// directory), else the data directory's SQLite file.
    fn store_choice(&self, global: &GlobalArgs) -> Result<StoreChoice> {
        let kafka = self.kafka.kafka.is_some();
        match &self.store {
            Some(url) if kafka && url.eq_ignore_ascii_case(HUB_STORE) => anyhow::bail!(
                "--store hub: is a Tributary hub's own store; with --kafka give sqlite:PATH, \
                 postgres://... or a blob container"
            ),
            Some(url) if url.eq_ignore_ascii_case(HUB_STORE) => Ok(StoreChoice::Hub),
            Some(url) if starts_with_ignoring_case(url, KAFKA_STORE) => {
                anyhow::ensure!(
                    kafka,
                    "--store kafka: commits checkpoints as a Kafka consumer group's offsets: \
                     it needs --kafka"
                );
                let ownership = &url[KAFKA_STORE.len()..];
                Ok(StoreChoice::KafkaOffsets(if ownership.is_empty() {
                    StoreLocation::Sqlite(global.data_dir.join("checkpoints.sqlite"))
                } else {
                    StoreLocation::parse(ownership)?
                }))
            }
            Some(url) => Ok(StoreChoice::Url(StoreLocation::parse(url)?)),
            None if !kafka
                && (self.connection.connection_string.is_some()
                    || crate::running::local_connection_string(&global.data_dir).is_some()) =>
            {
                Ok(StoreChoice::Hub)
            }
            None => Ok(StoreChoice::Url(StoreLocation::Sqlite(
                global.data_dir.join("checkpoints.sqlite"),
            ))),
        }
    }
}

/// The `--store` that names the checkpoint store the hub itself hosts.
const HUB_STORE: &str = "hub:";

/// The `--store` prefix of checkpoints committed to the Kafka group's offsets too.
const KAFKA_STORE: &str = "kafka:";

fn starts_with_ignoring_case(text: &str, prefix: &str) -> bool {
    text.get(..prefix.len())
        .is_some_and(|start| start.eq_ignore_ascii_case(prefix))
}

/// Where ownership and checkpoints live: a store named by URL, or the hub's own.
enum StoreChoice {
    Url(StoreLocation),
    /// The store a Tributary hub hosts, over its AMQP connection (`hub:`).
    Hub,
    /// Ownership and checkpoints in a store named by URL, checkpoints committed to the Kafka
    /// consumer group's offsets as well (`kafka:`).
    KafkaOffsets(StoreLocation),
}

impl std::fmt::Display for StoreChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreChoice::Url(location) => location.fmt(f),
            StoreChoice::Hub => f.write_str("the hub (hub:)"),
            StoreChoice::KafkaOffsets(location) => write!(f, "{KAFKA_STORE}{location}"),
        }
    }
}

/// Opens the checkpoint store `choice` names; the hub's own is reached through `hub`, and
/// checked with one request, so a hub that hosts none (Azure Event Hubs) fails here, with the
/// hub's reason and what to do, rather than in every balancing cycle.
async fn open_store(
    global: &GlobalArgs,
    choice: &StoreChoice,
    hub: Option<&HubHandle>,
    at: &GroupStore,
) -> Result<Arc<dyn CheckpointStore>> {
    let location = match choice {
        StoreChoice::Url(location) => location,
        StoreChoice::KafkaOffsets(location) => {
            let ownership = location
                .open()
                .await
                .with_context(|| format!("cannot open the checkpoint store {location}"))?;
            return crate::kafka::offsets_store(global, at, ownership);
        }
        StoreChoice::Hub => {
            let Some(HubHandle::Remote { hub: remote, .. }) = hub else {
                anyhow::bail!(
                    "--store hub: needs a hub reached over AMQP: give --connection-string, \
                     or run `tributary serve` on the data directory"
                );
            };
            let store = tributary_client::HubCheckpointStore::new(remote.consumer());
            store
                .list_ownership(&at.namespace()?, at.hub_name(), &at.group)
                .await
                .context("cannot use the hub's checkpoint store")?;
            return Ok(Arc::new(store));
        }
    };
    location
        .open()
        .await
        .with_context(|| format!("cannot open the checkpoint store {location}"))
}

/// Where events go, shared by the processors of one instance.
struct Sink {
    action: Action,
    output_dir: Option<PathBuf>,
    counts: Mutex<BTreeMap<u32, u64>>,
    total: AtomicU64,
}

impl Sink {
    fn write(
        &self,
        partition: &str,
        events: &[ReceivedEvent],
        file: &mut Option<std::fs::File>,
    ) -> Result<()> {
        match self.action {
            Action::Print => {
                let mut out = std::io::stdout().lock();
                for event in events {
                    output::write_event(
                        &mut out,
                        crate::args::OutputFormat::Json,
                        partition,
                        event,
                    )?;
                }
                out.flush()?;
            }
            Action::Count => {
                let p: u32 = partition.parse().unwrap_or(u32::MAX);
                *self.counts.lock().expect("counts").entry(p).or_default() += events.len() as u64;
            }
            Action::File => {
                let file = match file {
                    Some(file) => file,
                    None => file.insert(self.open_file(partition)?),
                };
                // One write per batch: lines of one batch are never split by another process.
                let mut lines = Vec::new();
                for event in events {
                    lines.extend_from_slice(&event.data.body);
                    lines.push(b'\n');
                }
                file.write_all(&lines)?;
            }
        }
        self.total.fetch_add(events.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn open_file(&self, partition: &str) -> Result<std::fs::File> {
        let dir = self
            .output_dir
            .as_ref()
            .expect("required with --action file");
        let path = dir.join(format!("{partition}.events"));
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))
    }
}

struct CliProcessor {
    sink: Arc<Sink>,
    file: Option<std::fs::File>,
    checkpoint_every: u32,
    batches_since_checkpoint: u32,
}

#[async_trait::async_trait]
impl EventProcessor for CliProcessor {
    async fn process_events(&mut self, context: &PartitionContext, events: Vec<ReceivedEvent>) {
        if let Err(e) = self
            .sink
            .write(context.partition_id(), &events, &mut self.file)
        {
            // Not checkpointing keeps these events for the next owner or the next start.
            eprintln!("tributary: partition {}: {e:#}", context.partition_id());
            return;
        }
        self.batches_since_checkpoint += 1;
        if self.batches_since_checkpoint >= self.checkpoint_every {
            self.checkpoint(context).await;
        }
    }

    async fn close(&mut self, context: &PartitionContext, reason: CloseReason) {
        if reason == CloseReason::Shutdown && self.batches_since_checkpoint > 0 {
            self.checkpoint(context).await;
        }
    }
}

impl CliProcessor {
    async fn checkpoint(&mut self, context: &PartitionContext) {
        match context.checkpoint().await {
            Ok(()) => self.batches_since_checkpoint = 0,
            Err(e) => {
                tracing::info!(partition = context.partition_id(), error = %e, "checkpoint not written")
            }
        }
    }
}

/// `tributary process`.
pub async fn process(global: &GlobalArgs, args: &ProcessArgs) -> Result<()> {
    let at = &args.at;
    let location = at.store_choice(global)?;
    let (source, store) = if at.kafka.kafka.is_some() {
        // A missing topic or an unreachable cluster fails here, not in every balancing cycle.
        crate::kafka::check_topic(global, at).await?;
        let source = crate::kafka::source(global, at)?;
        (source, open_store(global, &location, None, at).await?)
    } else {
        let hub =
            HubHandle::open(global, &at.hub, at.connection.connection_string.as_deref()).await?;
        let source = hub.source(Some(&at.namespace()?));
        (source, open_store(global, &location, Some(&hub), at).await?)
    };
    if let Some(dir) = &args.output_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let sink = Arc::new(Sink {
        action: args.action,
        output_dir: args.output_dir.clone(),
        counts: Mutex::default(),
        total: AtomicU64::new(0),
    });
    let factory = {
        let (sink, every) = (sink.clone(), args.checkpoint_every);
        move |_: &PartitionContext| CliProcessor {
            sink: sink.clone(),
            file: None,
            checkpoint_every: every,
            batches_since_checkpoint: 0,
        }
    };
    let host = EventProcessorHost::builder(source, store, factory)
        .options(options(args))
        .build()?
        .start()?;
    eprintln!(
        "processing {}/{} as {} (checkpoints in {}); Ctrl-C to stop",
        args.at.hub_name(),
        args.at.group,
        host.host_name(),
        location
    );
    wait_for_stop(&sink).await?;
    host.shutdown().await?;
    if args.action == Action::Count {
        report_counts(&sink);
    }
    Ok(())
}

fn options(args: &ProcessArgs) -> ProcessorOptions {
    let initial = args.initial_position.to_position(false);
    let mut options = ProcessorOptions {
        consumer_group: args.at.group.clone(),
        // For a remote hub the source's namespace is the connection string's host; `--namespace`
        // replaces it (a local hub's source is named by it already).
        fully_qualified_namespace: args.at.namespace.clone(),
        batch_events_max: args.batch_size,
        prefetch_count: args.batch_size.max(300),
        load_balancing_strategy: match args.strategy {
            Strategy::Balanced => LoadBalancingStrategy::Balanced,
            Strategy::Greedy => LoadBalancingStrategy::Greedy,
        },
        load_balancing_interval: Duration::from_millis(args.interval as u64),
        ownership_expiration: Duration::from_millis(args.expiration as u64),
        ..ProcessorOptions::default()
    }
    .with_initial_position(move |_| initial);
    if let Some(name) = &args.host_name {
        options.host_name = name.clone();
    }
    options
}

/// Waits for Ctrl-C or SIGTERM, printing counts every few seconds in count mode.
async fn wait_for_stop(sink: &Sink) -> Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    let mut ticker = tokio::time::interval(Duration::from_secs(5));
    ticker.tick().await;
    loop {
        tokio::select! {
            result = tokio::signal::ctrl_c() => return result.context("waiting for Ctrl-C"),
            _ = terminate.recv() => return Ok(()),
            _ = ticker.tick() => if sink.action == Action::Count { report_counts(sink) },
        }
    }
}

fn report_counts(sink: &Sink) {
    let counts = sink.counts.lock().expect("counts");
    let per_partition: Vec<String> = counts.iter().map(|(p, n)| format!("{p}:{n}")).collect();
    eprintln!(
        "processed {} ({})",
        crate::output::count(sink.total.load(Ordering::Relaxed), "event"),
        per_partition.join(" ")
    );
}

/// Fails when the hub does not exist, if that can be told: with a connection string the hub
/// is asked; else an existing data directory is looked in (unless a running `serve` holds it).
async fn check_hub_exists(global: &GlobalArgs, at: &GroupStore) -> Result<()> {
    if at.kafka.kafka.is_some() {
        return crate::kafka::check_topic(global, at).await;
    }
    if at.connection.connection_string.is_some() {
        let hub =
            HubHandle::open(global, &at.hub, at.connection.connection_string.as_deref()).await?;
        hub.partition_ids()
            .await
            .with_context(|| format!("cannot read event hub {:?}", at.hub))?;
        return Ok(());
    }
    if !global.data_dir.exists() {
        return Ok(()); // No hub here to ask: only the store's records can be shown.
    }
    match crate::hub_handle::open_broker(global).await {
        Ok(broker) => {
            let described = broker.describe_hub(&at.hub);
            broker.shutdown().await?;
            match described {
                Err(tributary_broker::BrokerError::HubNotFound { .. }) => anyhow::bail!(
                    "event hub {:?} does not exist in the data directory {}",
                    at.hub,
                    global.data_dir.display()
                ),
                other => other.map(drop)?,
            }
        }
        Err(e) => eprintln!(
            "tributary: cannot check that event hub {:?} exists: {e:#}",
            at.hub
        ),
    }
    Ok(())
}

/// The store `tributary ownership` reads: a shared one (never `memory:`).
async fn ownership_store(
    global: &GlobalArgs,
    args: &OwnershipArgs,
) -> Result<Arc<dyn CheckpointStore>> {
    let location = args.at.store_choice(global)?;
    Ok(match &location {
        StoreChoice::Url(StoreLocation::Memory) => anyhow::bail!(
            "memory: is one process's own store; `ownership` can only read a shared one \
             (hub:, sqlite:PATH, postgres://... or a blob container)"
        ),
        StoreChoice::Url(url) | StoreChoice::KafkaOffsets(url) => {
            check_hub_exists(global, &args.at).await?;
            if let StoreLocation::Sqlite(path) = url {
                anyhow::ensure!(
                    path.exists(),
                    "there is no checkpoint store at {}",
                    path.display()
                );
            }
            open_store(global, &location, None, &args.at).await?
        }
        StoreChoice::Hub => {
            let hub = HubHandle::open(
                global,
                &args.at.hub,
                args.at.connection.connection_string.as_deref(),
            )
            .await?;
            open_store(global, &location, Some(&hub), &args.at).await?
        }
    })
}

/// `tributary ownership`: the tracking table of the Event Processor Host documentation.
pub async fn ownership(global: &GlobalArgs, args: &OwnershipArgs) -> Result<()> {
    let store = ownership_store(global, args).await?;
    let namespace = args.at.namespace()?;
    let listing = store
        .list_ownership_and_hosts(&namespace, args.at.hub_name(), &args.at.group)
        .await?;
    let owners = listing.ownership;
    let last_seen: BTreeMap<String, i64> = listing
        .hosts
        .into_iter()
        .map(|host| (host.owner_id, host.last_modified_time_ms))
        .collect();
    let checkpoints = store
        .list_checkpoints(&namespace, args.at.hub_name(), &args.at.group)
        .await?;
    let mut rows: BTreeMap<u32, (Option<_>, Option<_>)> = BTreeMap::new();
    for o in owners {
        let partition = o.partition_id.parse().unwrap_or(u32::MAX);
        rows.entry(partition).or_default().0 = Some(o);
    }
    for c in checkpoints {
        let partition = c.partition_id.parse().unwrap_or(u32::MAX);
        rows.entry(partition).or_default().1 = Some(c);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "consumer group\tpartition\towner\townership last claimed\tcheckpoint offset\tcheckpoint sequence number\towner last seen"
    )?;
    for (partition, (owner, checkpoint)) in rows {
        let owner_name = owner.as_ref().map_or("-".to_owned(), |o| {
            if o.owner_id.is_empty() {
                "(released)".into()
            } else {
                o.owner_id.clone()
            }
        });
        let since = owner
            .as_ref()
            .map_or("-".into(), |o| output::rfc3339(o.last_modified_time_ms));
        let offset = checkpoint
            .as_ref()
            .and_then(|c| c.offset)
            .map_or("-".into(), |o| o.to_string());
        let seq = checkpoint
            .as_ref()
            .and_then(|c| c.sequence_number)
            .map_or("-".into(), |s| s.to_string());
        // When the owner's host record was last renewed: stores that keep host records
        // renew it every balancing interval while the host runs ("-" where there is none).
        let seen = owner
            .as_ref()
            .and_then(|o| last_seen.get(&o.owner_id))
            .map_or("-".into(), |ms| output::rfc3339(*ms));
        writeln!(
            out,
            "{}\t{partition}\t{owner_name}\t{since}\t{offset}\t{seq}\t{seen}",
            args.at.group
        )?;
    }
    Ok(())
}
