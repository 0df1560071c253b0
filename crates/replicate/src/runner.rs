//! A running replication task: a processor host on the source whose processor forwards each
//! batch to the task's routes and checkpoints after the targets acknowledged it.
//!
//! For each batch of one source partition, in order:
//!
//! 1. events replicated into the source are set aside if the task forwards only events produced
//!    there;
//! 2. the editor's steps run ([`tributary_edit::Editor`]): they may change, drop, refuse, split
//!    or merge events;
//! 3. every event is matched against each route's condition; an event goes to every route it
//!    matches (none: [`Unmatched`]), unless the route's target already has it or is getting it
//!    directly from an earlier hop ([`metadata::reached`]: a loop, or a second copy);
//! 4. each route's events are stamped (service metadata, origin, path, and the other routes'
//!    hubs as the fan-out) and forwarded, all routes at once ([`crate::forward`]);
//! 5. events a step or a target refused go to the dead-letter target with the reason;
//! 6. only then is the batch checkpointed. A crash anywhere before this point replays the batch
//!    from the previous checkpoint: **at least once, nothing skipped**, and the duplicates are
//!    at most the batch in flight per partition.
//!
//! Now and then a batch also records an offset sync ([`crate::offset_map`]): the targets'
//! newest sequence numbers are read before step 4 and written to the map after step 6.

use std::sync::Arc;

use tributary_edit::{Condition, Context, Editor, Item, Position, Rejected, Step};
use tributary_event::{EventData, PropertyValue, ReceivedEvent, SmolStr};
use tributary_processor::{
    CheckpointStore, CloseReason, EventProcessor, EventProcessorHost, HostError, PartitionContext,
    PartitionError, ProcessorOptions, RunningHost, SqliteCheckpointStore,
};

use crate::endpoint::{Brokers, OpenedSource, SourceNewest, open_source, open_target};
use crate::forward::{Counting, Destination, Outgoing, Outgoings, Poison, RetryPolicy, forward};
use crate::limits::TARGETS_MAX;
use crate::metadata::{self, FirstHopStamp, HopIds};
use crate::metrics::{FilterReason, PartitionMetrics, TaskMetrics};
use crate::offset_map::{self, OffsetMap, PartitionSyncs, SyncSetup, SyncTarget};
use crate::status;
use crate::task::{Endpoint, StepPlan, TargetKind, TaskConfig, TaskError, Unmatched};

/// Why an event went to the dead-letter target (application property).
pub const DEAD_LETTER_REASON: &str = "dead-letter-reason";
/// The task that dead-lettered it.
pub const DEAD_LETTER_TASK: &str = "dead-letter-task";
/// The route whose target refused it (absent for unmatched events).
pub const DEAD_LETTER_ROUTE: &str = "dead-letter-route";
/// The editor step that refused it (absent for events a target refused).
pub const DEAD_LETTER_STEP: &str = "dead-letter-step";

/// Routes are matched into a bit set of one word.
const _: () = assert!(TARGETS_MAX <= u64::BITS as usize);

/// One route: a target and the condition for taking it.
#[derive(Clone)]
struct Route {
    sink: Sink,
    condition: Option<Condition>,
    /// The target hub's name, for Azure's merge marker (none for a table).
    hub_name: Option<SmolStr>,
    /// The ids this route's stamps write (none for a table); each partition's processor
    /// stamps with its own copy ([`HopIds::own_copy`]).
    ids: Option<HopIds>,
}

/// Where a route's events go.
#[derive(Clone)]
enum Sink {
    /// An event hub.
    Hub(Destination),
    /// A PostgreSQL table.
    #[cfg(feature = "postgres")]
    Table(Arc<crate::projection::Projection>),
}

impl Sink {
    /// The hub's id, for loop checks and stamps (a table has none: nothing loops through it).
    fn hub_id(&self) -> Option<&str> {
        match self {
            Sink::Hub(destination) => Some(&destination.identity.id),
            #[cfg(feature = "postgres")]
            Sink::Table(_) => None,
        }
    }
}

/// One edited batch, routed.
struct Routed {
    /// Each route's events, stamped for its target.
    per_route: Vec<Outgoings>,
    /// The events no route matched, as the editor left them, for the dead-letter target.
    unmatched: Vec<(EventData, Position)>,
}

/// What every partition's processor of one task shares.
struct TaskRuntime {
    name: String,
    source_id: String,
    /// The ids a dead letter's stamp writes (the dead-letter hub's, or `-` without one); each
    /// partition's processor stamps with its own copy.
    dead_letter_ids: HopIds,
    /// The source hub's name, to recognise events Azure's merge sample copied into it.
    source_hub_name: String,
    editor: Editor,
    routes: Vec<Route>,
    unmatched: Unmatched,
    dead_letter: Option<Destination>,
    forward_replicated: bool,
    azure_marker: bool,
    retry: RetryPolicy,
    metrics: Arc<TaskMetrics>,
    syncs: SyncSetup,
    /// Where an idle partition's sync reads the source's newest sequence number.
    source_newest: SourceNewest,
}

/// A replication task running in this process.
pub struct Replicator {
    host: Arc<RunningHost>,
    metrics: Arc<TaskMetrics>,
    brokers: Brokers,
    namespace: String,
    status_writer: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Replicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicator")
            .field("host", &self.host.host_name())
            .finish_non_exhaustive()
    }
}

/// Ways to start a task beyond its file.
#[derive(Clone, Default)]
pub struct StartOptions {
    /// Brokers already open in this process (endpoints on their data directories use them).
    pub brokers: Brokers,
    /// Steps of the library user's own, by the name a task file's `kind = "custom"` step
    /// gives.
    pub steps: Vec<(String, Arc<dyn Step>)>,
    /// While the source does not answer (an unreachable Kafka cluster or hub), keep trying —
    /// with the task's retry backoff, each failure logged, counted in the metrics and written
    /// to this process's status file — instead of failing. A source that answers and refuses
    /// (a missing topic, bad credentials) fails at once either way.
    pub wait_for_source: bool,
    /// The counters to keep, so that a caller can serve them (`/metrics`) while the task waits
    /// for its source; `None`: fresh ones.
    pub metrics: Option<Arc<TaskMetrics>>,
}

impl std::fmt::Debug for StartOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StartOptions").finish_non_exhaustive()
    }
}

/// Now, in ms since the Unix epoch.
pub fn wall_clock_ms() -> i64 {
    time::OffsetDateTime::now_utc().unix_timestamp_nanos() as i64 / 1_000_000
}

impl Replicator {
    /// Opens every endpoint of `config` (failing with the task file's line and key if one
    /// cannot be reached), then starts the processor host on the source.
    pub async fn start(
        config: &TaskConfig,
        options: StartOptions,
    ) -> Result<Replicator, TaskError> {
        let brokers = options.brokers.clone();
        let endpoint_error = |endpoint: &Endpoint, message: String| TaskError {
            file: config.file.clone(),
            line: Some(endpoint.line),
            key: endpoint.key.clone(),
            message,
        };
        let source_endpoint = &config.source.endpoint;
        let (config, metrics) = &named_and_counted(config, &options);
        let host_name = config.host_name.as_deref().unwrap_or_default();
        let waiting = options.wait_for_source.then_some((host_name, &**metrics));
        let source = open_source_waiting(config, &brokers, waiting)
            .await
            .map_err(|m| endpoint_error(source_endpoint, m))?;
        let editor = editor(config, &options)?;
        let source_id = config
            .source
            .origin_id
            .clone()
            .unwrap_or(source.identity.id.clone());
        let routes = open_routes(config, &source, &source_id, &brokers).await?;
        let dead_letter = match &config.dead_letter {
            Some(endpoint) => Some(
                destination("dead-letter", endpoint, false, &brokers)
                    .await
                    .map_err(|m| endpoint_error(endpoint, m))?,
            ),
            None => None,
        };
        let syncs = sync_setup(config, &source, &source_id)?;
        let dead_letter_ids = HopIds::new(
            &source_id,
            dead_letter.as_ref().map_or("-", |d| d.identity.id.as_str()),
        );
        let runtime = Arc::new(TaskRuntime {
            name: config.name.clone(),
            source_id,
            dead_letter_ids,
            source_hub_name: source_endpoint.event_hub.clone(),
            editor,
            routes,
            unmatched: config.unmatched.clone(),
            dead_letter,
            forward_replicated: config.forward_replicated,
            azure_marker: config.azure_marker,
            retry: RetryPolicy {
                backoff_min: config.backoff_min,
                backoff_max: config.backoff_max,
            },
            metrics: Arc::clone(metrics),
            syncs,
            source_newest: source.newest.clone(),
        });
        let namespace = source.source.fully_qualified_namespace().to_owned();
        let host = Arc::new(start_host(config, source, runtime).await?);
        let status_writer = tokio::spawn(write_status(
            status::status_dir(&config.source.checkpoint_store),
            Arc::clone(&host),
            Arc::clone(metrics),
        ));
        Ok(Replicator {
            host,
            metrics: Arc::clone(metrics),
            brokers,
            namespace,
            status_writer,
        })
    }

    /// The source's namespace as the checkpoint store records it (for
    /// [`TaskStatus::read`](crate::status::TaskStatus::read)).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// This process's name among the task's processes.
    pub fn host_name(&self) -> &str {
        self.host.host_name()
    }

    /// The source partitions this process replicates now.
    pub fn owned_partitions(&self) -> Vec<String> {
        self.host.owned_partitions()
    }

    /// The task's counters.
    pub fn metrics(&self) -> &Arc<TaskMetrics> {
        &self.metrics
    }

    /// Stops between batches (the batch in flight is finished and checkpointed), hands the
    /// partitions back, and closes the data directories this task opened.
    pub async fn shutdown(self) -> Result<(), String> {
        self.status_writer.abort();
        let _ = self.status_writer.await;
        let host = Arc::into_inner(self.host).expect("the status writer has stopped");
        let outcome = host.shutdown().await.map_err(|e| e.to_string());
        self.brokers.shutdown().await;
        outcome
    }
}

/// Writes this process's status file every [`status::WRITE_INTERVAL`] until aborted.
async fn write_status(dir: std::path::PathBuf, host: Arc<RunningHost>, metrics: Arc<TaskMetrics>) {
    let mut ticker = tokio::time::interval(status::WRITE_INTERVAL);
    loop {
        ticker.tick().await;
        let snapshot = status::ProcessStatus {
            host_name: host.host_name().to_owned(),
            written_at_ms: wall_clock_ms(),
            owned_partitions: host.owned_partitions(),
            counters: metrics.snapshot(),
        };
        let dir = dir.clone();
        let written = tokio::task::spawn_blocking(move || status::write(&dir, &snapshot)).await;
        if let Ok(Err(error)) = written {
            tracing::warn!(%error, "cannot write the task's status file");
        }
    }
}

/// `config` with this process's host name settled (the status file and the processor host must
/// use one name), and the counters to keep.
fn named_and_counted(
    config: &TaskConfig,
    options: &StartOptions,
) -> (TaskConfig, Arc<TaskMetrics>) {
    let mut config = config.clone();
    config
        .host_name
        .get_or_insert_with(|| ProcessorOptions::default().host_name);
    let metrics = options
        .metrics
        .clone()
        .unwrap_or_else(|| Arc::new(TaskMetrics::new(&config.name)));
    (config, metrics)
}

/// Opens the task's source. While it does not answer and `waiting` names this process and its
/// counters, tries again with the task's backoff: each failure is logged, counted, and written to
/// this process's status file (so `--status` shows it before the task runs).
async fn open_source_waiting(
    config: &TaskConfig,
    brokers: &Brokers,
    waiting: Option<(&str, &TaskMetrics)>,
) -> Result<OpenedSource, String> {
    let mut backoff = config.backoff_min;
    loop {
        let error = match open_source(&config.source.endpoint, brokers).await {
            Ok(source) => return Ok(source),
            Err(error) => error,
        };
        let Some((host_name, metrics)) = waiting.filter(|_| error.unreachable) else {
            return Err(error.message);
        };
        metrics.source_failed(&error.message, wall_clock_ms());
        tracing::warn!(
            task = %config.name,
            %error,
            retry_in_ms = backoff.as_millis() as u64,
            "the source does not answer; waiting for it"
        );
        let status = status::ProcessStatus {
            host_name: host_name.to_owned(),
            written_at_ms: wall_clock_ms(),
            owned_partitions: Vec::new(),
            counters: metrics.snapshot(),
        };
        let dir = status::status_dir(&config.source.checkpoint_store);
        if let Err(error) = status::write(&dir, &status) {
            tracing::warn!(%error, "cannot write the task's status file");
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(config.backoff_max);
    }
}

/// Opens the task's offset map beside its checkpoint store.
fn sync_setup(
    config: &TaskConfig,
    source: &OpenedSource,
    source_id: &str,
) -> Result<SyncSetup, TaskError> {
    let path = offset_map::path_for(&config.source.checkpoint_store);
    let map = OffsetMap::open(&path).map_err(|message| TaskError {
        file: config.file.clone(),
        line: None,
        key: "source.checkpoint_store".to_owned(),
        message,
    })?;
    Ok(SyncSetup {
        map: Arc::new(map),
        policy: config.offset_sync,
        guard: i64::from(config.source.batch_events_max) + i64::from(config.source.prefetch),
        source_id: source_id.to_owned(),
        source_partitions: source.identity.partition_count,
    })
}

/// The task's editor: its built-in steps and the custom ones `options` registers.
fn editor(config: &TaskConfig, options: &StartOptions) -> Result<Editor, TaskError> {
    let steps = config.steps.iter().map(|plan| match plan {
        StepPlan::BuiltIn(step) => Ok(Arc::clone(step)),
        StepPlan::Custom { name, line } => options
            .steps
            .iter()
            .find(|(registered, _)| registered == name)
            .map(|(_, step)| Arc::clone(step))
            .ok_or_else(|| TaskError {
                file: config.file.clone(),
                line: Some(*line),
                key: format!("step {name:?}.name"),
                message: format!(
                    "no custom step is registered under {name:?}; register it with StartOptions::steps"
                ),
            }),
    });
    Ok(Editor::new(steps.collect::<Result<_, _>>()?))
}

// Without the postgres feature the source id and the batch's last position go unused.
#[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
async fn open_routes(
    config: &TaskConfig,
    source: &OpenedSource,
    source_id: &str,
    brokers: &Brokers,
) -> Result<Vec<Route>, TaskError> {
    let mut routes = Vec::with_capacity(config.targets.len());
    for target in &config.targets {
        let error = |message: String| TaskError {
            file: config.file.clone(),
            line: Some(target.line),
            key: target.key.clone(),
            message,
        };
        let sink = match &target.kind {
            TargetKind::Hub {
                endpoint,
                keep_partition,
            } => {
                let destination = destination(&target.name, endpoint, *keep_partition, brokers)
                    .await
                    .map_err(error)?;
                if *keep_partition
                    && destination.identity.partition_count != source.identity.partition_count
                {
                    return Err(error(format!(
                        "keep_partition needs equal partition counts, but the source has {} and the target {}; drop keep_partition to route keyless events round-robin",
                        source.identity.partition_count, destination.identity.partition_count
                    )));
                }
                Sink::Hub(destination)
            }
            #[cfg(feature = "postgres")]
            TargetKind::Postgres(projection) => Sink::Table(Arc::new(
                crate::projection::Projection::open(
                    &target.name,
                    projection,
                    &config.name,
                    source_id,
                )
                .await
                .map_err(error)?,
            )),
        };
        let ids = sink
            .hub_id()
            .map(|target_id| HopIds::new(source_id, target_id));
        routes.push(Route {
            sink,
            condition: target.when.clone(),
            ids,
            hub_name: match &target.kind {
                TargetKind::Hub { endpoint, .. } => Some(SmolStr::new(&endpoint.event_hub)),
                #[cfg(feature = "postgres")]
                TargetKind::Postgres(_) => None,
            },
        });
    }
    Ok(routes)
}

async fn destination(
    name: &str,
    endpoint: &Endpoint,
    keep_partition: bool,
    brokers: &Brokers,
) -> Result<Destination, String> {
    let (target, identity) = open_target(endpoint, brokers).await?;
    let batch_bytes_max = target
        .batch_bytes_max(&tributary_event::SendTarget::RoundRobin)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Destination {
        name: name.to_owned(),
        target,
        identity,
        batch_bytes_max,
        keep_partition,
        follows_alias: matches!(
            &endpoint.connection,
            crate::task::Connection::Remote {
                failover: Some(_),
                ..
            }
        ),
    })
}

async fn start_host(
    config: &TaskConfig,
    source: OpenedSource,
    runtime: Arc<TaskRuntime>,
) -> Result<RunningHost, TaskError> {
    let file_error = |key: &str, message: String| TaskError {
        file: config.file.clone(),
        line: None,
        key: key.to_owned(),
        message,
    };
    let path = &config.source.checkpoint_store;
    let store: Arc<dyn CheckpointStore> =
        Arc::new(SqliteCheckpointStore::open(path).await.map_err(|e| {
            file_error(
                "source.checkpoint_store",
                format!("cannot open {}: {e}", path.display()),
            )
        })?);
    let initial = config.source.initial_position;
    let metrics = Arc::clone(&runtime.metrics);
    let mut options = ProcessorOptions {
        consumer_group: config.source.consumer_group.clone(),
        batch_events_max: config.source.batch_events_max,
        prefetch_count: config.source.prefetch,
        // An idle partition's processor is called every sync interval, to sync it.
        invoke_processor_after_receive_timeout: true,
        receive_timeout: config.offset_sync.every,
        ..ProcessorOptions::default()
    }
    .with_initial_position(move |_| initial)
    .with_error_notifier(move |error| {
        if let HostError::ListPartitions(error) = error {
            metrics.source_failed(&error.to_string(), wall_clock_ms());
        }
    });
    if let Some(interval) = config.load_balancing_interval {
        options.load_balancing_interval = interval;
    }
    if let Some(expiration) = config.ownership_expiration {
        options.ownership_expiration = expiration;
    }
    if let Some(name) = &config.host_name {
        options.host_name = name.clone();
    }
    #[cfg(feature = "postgres")]
    {
        options.start_position_override = resume_from_tables(&runtime.routes, initial);
    }
    let ownership_store = Arc::clone(&store);
    let factory = move |context: &PartitionContext| {
        ReplicationProcessor::new(&runtime, context, Arc::clone(&ownership_store))
    };
    EventProcessorHost::builder(source.source, store, factory)
        .options(options)
        .build()
        .map_err(|e| file_error("source", e.to_string()))?
        .start()
        .map_err(|e| file_error("source", e.to_string()))
}

/// With tables among the routes, partitions start where the tables' own progress says (the
/// earliest of them), not at the checkpoint store's position; with hubs among them too, at
/// the checkpoint when it is earlier still, so the hubs miss nothing. A table with nothing
/// of the partition yet starts it at the task's initial position.
#[cfg(feature = "postgres")]
fn resume_from_tables(
    routes: &[Route],
    initial: tributary_event::EventPosition,
) -> Option<tributary_processor::StartPositionOverride> {
    use tributary_event::EventPosition;
    let tables: Vec<Arc<crate::projection::Projection>> = routes
        .iter()
        .filter_map(|route| match &route.sink {
            Sink::Table(projection) => Some(Arc::clone(projection)),
            Sink::Hub(_) => None,
        })
        .collect();
    if tables.is_empty() {
        return None;
    }
    let with_hubs = tables.len() < routes.len();
    Some(Arc::new(move |partition, checkpoint| {
        let tables = tables.clone();
        let partition = partition.to_owned();
        let checkpointed = checkpoint.map(|c| c.sequence_number);
        Box::pin(async move {
            let mut earliest = i64::MAX;
            for table in &tables {
                match table.resume_after(&partition).await? {
                    Some(sequence_number) => earliest = earliest.min(sequence_number),
                    None => return Ok(Some(initial)),
                }
            }
            let hubs_need_earlier = match checkpointed {
                None => true,
                Some(sequence) => sequence.is_some_and(|sequence| sequence <= earliest),
            };
            if with_hubs && hubs_need_earlier {
                return Ok(None);
            }
            Ok(Some(EventPosition::SequenceNumber {
                sequence_number: earliest,
                inclusive: false,
            }))
        })
    }))
}

/// Why an event is dead-lettered.
#[derive(Debug, Clone, Copy)]
enum Mark<'a> {
    /// The route's target refused it, for this reason.
    Route(&'a str, &'a str),
    /// No route matched it.
    Unmatched,
    /// The editor step refused it, for this reason.
    Step(&'a str, &'a str),
}

/// The processor of one source partition.
struct ReplicationProcessor {
    task: Arc<TaskRuntime>,
    metrics: Arc<PartitionMetrics>,
    syncs: PartitionSyncs,
    /// The task's checkpoint store, where an idle sync checks the partition is still ours.
    store: Arc<dyn CheckpointStore>,
    /// The sequence number after the last event this owner forwarded (none yet: `None`).
    next_sequence: Option<i64>,
    /// Each route's ids (none for a table), this partition's own copy.
    route_ids: Vec<Option<HopIds>>,
    /// Each route's first-hop stamp for this partition, encoded once, when its target writes
    /// it into the messages it sends ([`Target::encodes_stamps`](crate::target::Target)).
    route_stamps: Vec<Option<Arc<FirstHopStamp>>>,
    /// The dead-letter stamp's ids, this partition's own copy.
    dead_letter_ids: HopIds,
    /// The source partition's id, as stamps record it.
    partition: SmolStr,
}

#[async_trait::async_trait]
impl EventProcessor for ReplicationProcessor {
    async fn open(&mut self, context: &PartitionContext) {
        self.task.editor.open_partition(context.partition_id());
    }

    async fn process_events(&mut self, context: &PartitionContext, mut events: Vec<ReceivedEvent>) {
        self.task.metrics.source_answered();
        if events.is_empty() {
            self.sync_while_idle(context).await;
            return;
        }
        let first_sequence = events[0].sequence_number;
        let last = Position::of(&events[events.len() - 1]);
        let last_sequence = last.sequence_number;
        self.metrics.received(events.len());
        let partition = context.partition_id();
        let edit_context = Context {
            partition,
            now_ms: wall_clock_ms(),
        };
        self.admit(&mut events);
        let admitted = events.into_iter();
        let (routed, rejected) = match self.unconditional_routes() {
            // No step to run and no condition to test: events go to their routes as they were
            // read, never made into editor items (each move of an item copies it).
            Some(mask) => {
                let events = admitted.map(|event| {
                    let position = Position::of(&event);
                    (event.data, position, mask)
                });
                (self.route(events), Vec::new())
            }
            None => {
                let items = admitted.map(Item::received).collect();
                let edited = self.task.editor.apply(&edit_context, items);
                let dropped: u64 = edited.dropped.iter().map(|(_, count)| count).sum();
                self.metrics.filtered(FilterReason::Editor, dropped);
                let events = edited.passed.into_iter().map(|item| {
                    let (position, mask) =
                        (item.position(), self.matching_routes(&edit_context, &item));
                    (item.into_event(), position, mask)
                });
                (self.route(events), edited.rejected)
            }
        };
        let sync = self
            .syncs
            .before_batch(first_sequence, &Self::sync_targets(&self.task))
            .await;
        let poison = self.forward_routes(partition, routed.per_route, last).await;
        self.dead_letter(partition, routed.unmatched, poison, rejected)
            .await;
        self.next_sequence = Some(last_sequence.saturating_add(1));
        match context.checkpoint().await {
            Ok(()) => {
                self.metrics.checkpointed(last_sequence);
                if let Some(sync) = sync {
                    self.syncs.write(sync).await;
                }
            }
            Err(error) => tracing::info!(
                task = %self.task.name,
                partition,
                %error,
                "checkpoint not written; the next owner replays this batch"
            ),
        }
    }

    /// A failure reading the source (the pump retries on its own): logged, and counted where
    /// `--status` and `/metrics` show it.
    async fn process_error(&mut self, context: &PartitionContext, error: &PartitionError) {
        tracing::warn!(
            task = %self.task.name,
            partition = context.partition_id(),
            %error,
            "cannot read the source; retrying"
        );
        self.task
            .metrics
            .source_failed(&error.to_string(), wall_clock_ms());
    }

    async fn close(&mut self, context: &PartitionContext, reason: CloseReason) {
        self.task.editor.close_partition(context.partition_id());
        tracing::debug!(task = %self.task.name, partition = context.partition_id(), ?reason, "partition closed");
    }
}

/// `event`, read at `position`, stamped for forwarding from the hub `ids.source()` to the hub
/// `ids.target()`.
fn stamped(
    mut event: EventData,
    position: Position,
    partition: &SmolStr,
    ids: &HopIds,
) -> Outgoing {
    let undo = metadata::stamp_with(&mut event, partition, position, ids);
    Outgoing {
        event,
        position,
        undo,
    }
}

/// `route`'s first-hop stamp for source partition `partition`, if its target writes stamps into
/// the messages it sends.
fn route_stamp(route: &Route, partition: &str) -> Option<Arc<FirstHopStamp>> {
    let destination = match &route.sink {
        Sink::Hub(destination) => destination,
        #[cfg(feature = "postgres")]
        Sink::Table(_) => return None,
    };
    let ids = route.ids.as_ref()?.own_copy();
    destination
        .target
        .encodes_stamps()
        .then(|| FirstHopStamp::new(&SmolStr::new(partition), &ids))
        .flatten()
        .map(Arc::new)
}

/// The routes (bits) in `mask`.
fn routes_in(mut mask: u64) -> impl Iterator<Item = usize> {
    // One step per set bit (lowest first), not one per bit of the mask: this runs per event.
    std::iter::from_fn(move || {
        let bit = mask.trailing_zeros() as usize;
        mask &= mask.checked_sub(1)?;
        Some(bit)
    })
}

impl ReplicationProcessor {
    /// The processor of the partition `context` is about, for the task `runtime`.
    fn new(
        runtime: &Arc<TaskRuntime>,
        context: &PartitionContext,
        store: Arc<dyn CheckpointStore>,
    ) -> ReplicationProcessor {
        let partition = context.partition_id();
        ReplicationProcessor {
            metrics: runtime.metrics.partition(partition),
            syncs: PartitionSyncs::new(runtime.syncs.clone(), partition),
            store,
            next_sequence: None,
            route_ids: (runtime.routes.iter())
                .map(|route| route.ids.as_ref().map(HopIds::own_copy))
                .collect(),
            route_stamps: (runtime.routes.iter())
                .map(|route| route_stamp(route, partition))
                .collect(),
            dead_letter_ids: runtime.dead_letter_ids.own_copy(),
            partition: SmolStr::new(partition),
            task: Arc::clone(runtime),
        }
    }

    /// The targets an offset sync covers: every hub route but those named through an alias
    /// (the hub behind one may change, with other sequence numbers).
    fn sync_targets(task: &TaskRuntime) -> Vec<SyncTarget<'_>> {
        // An editor step may change a partition key, and so send an event elsewhere.
        let keys_unchanged = task.editor.is_empty();
        task.routes
            .iter()
            .filter_map(|route| match &route.sink {
                Sink::Hub(destination) if !destination.follows_alias => Some(SyncTarget {
                    destination,
                    keeps_partitions: destination.keep_partition && keys_unchanged,
                }),
                Sink::Hub(_) => None,
                #[cfg(feature = "postgres")]
                Sink::Table(_) => None,
            })
            .collect()
    }

    /// Syncs an idle partition when one is due ([`PartitionSyncs::idle_due`]), at the sequence
    /// number after the last event this owner forwarded, or, before it forwarded any, after
    /// the source partition's newest (never before where this owner started). Written only if
    /// the ownership record still names this owner after the targets were read.
    async fn sync_while_idle(&mut self, context: &PartitionContext) {
        if !self.syncs.idle_due() {
            return;
        }
        let next = match self.next_sequence {
            Some(next) => next,
            None => match self
                .task
                .source_newest
                .last_sequence_number(context.partition_id())
                .await
            {
                Ok(newest) => newest.saturating_add(1),
                Err(error) => {
                    tracing::debug!(partition = context.partition_id(), %error, "no idle offset sync");
                    return;
                }
            },
        };
        let Some(sync) = self.syncs.take(next, &Self::sync_targets(&self.task)).await else {
            return;
        };
        if self.still_owns(context).await {
            self.syncs.write(sync).await;
        }
    }

    /// Whether the checkpoint store's ownership record of the partition names this owner.
    async fn still_owns(&self, context: &PartitionContext) -> bool {
        let owners = self
            .store
            .list_ownership(
                context.fully_qualified_namespace(),
                context.event_hub_name(),
                context.consumer_group(),
            )
            .await;
        owners.is_ok_and(|owners| {
            owners.iter().any(|o| {
                o.partition_id == context.partition_id() && o.owner_id == context.owner_id()
            })
        })
    }

    /// Keeps the events the task forwards at all: with `forward_replicated` off, those produced
    /// at the source (not replicated into it by a task of ours, nor by Azure's merge sample).
    /// In place: an event kept where nothing before it was dropped is not moved (each move of
    /// an event copies a few hundred bytes).
    fn admit(&self, events: &mut Vec<ReceivedEvent>) {
        let task = &self.task;
        if task.forward_replicated {
            return;
        }
        events.retain(|event| {
            let replicated = metadata::origin(&event.data)
                .is_some_and(|origin| origin != task.source_id)
                || metadata::azure_merge_copied_into(&event.data, &task.source_hub_name);
            if replicated {
                self.metrics.filtered(FilterReason::Replicated, 1);
            }
            !replicated
        });
    }

    /// The routes (bits) every event takes when nothing about an event can change them: the
    /// editor has no steps and no route has a condition. `None` when an event's routes depend
    /// on it.
    fn unconditional_routes(&self) -> Option<u64> {
        let routes = &self.task.routes;
        let unconditional = self.task.editor.is_empty()
            && !routes.is_empty()
            && routes.iter().all(|route| route.condition.is_none());
        unconditional.then(|| u64::MAX >> (u64::BITS as usize - routes.len()))
    }

    /// The routes `item` takes (a bit each): those whose condition it meets, else the task's
    /// [`Unmatched`] choice (0: none).
    fn matching_routes(&self, context: &Context<'_>, item: &Item) -> u64 {
        let task = &self.task;
        let matched = task
            .routes
            .iter()
            .enumerate()
            .filter(|(_, route)| {
                route
                    .condition
                    .as_ref()
                    .is_none_or(|condition| condition.matches(context, item))
            })
            .fold(0u64, |mask, (index, _)| mask | (1 << index));
        match (matched, &task.unmatched) {
            (0, Unmatched::Target(index)) => 1 << index,
            _ => matched,
        }
    }

    /// Routes events (as the editor left them, or as read when there is nothing to edit), each
    /// with the routes (bits) it matched: each route's events (stamped for it), and the events
    /// no route matched (to be dead-lettered).
    fn route(&self, events: impl Iterator<Item = (EventData, Position, u64)>) -> Routed {
        let task = &self.task;
        let mut routed = Routed {
            per_route: vec![Outgoings::default(); task.routes.len()],
            unmatched: Vec::new(),
        };
        if let ([only], Some(most)) = (routed.per_route.as_mut_slice(), events.size_hint().1) {
            // Room for the whole batch at once: growing a vector of events copies them.
            *only = Outgoings::with_capacity(most);
        }
        for (list, stamp) in routed.per_route.iter_mut().zip(&self.route_stamps) {
            list.stamp.clone_from(stamp);
        }
        for (event, position, mut mask) in events {
            if mask == 0 {
                match task.unmatched {
                    Unmatched::DeadLetter => routed.unmatched.push((event, position)),
                    _ => self.metrics.filtered(FilterReason::Unmatched, 1),
                }
                continue;
            }
            for route_index in routes_in(mask) {
                let Some(target_id) = task.routes[route_index].sink.hub_id() else {
                    continue;
                };
                if metadata::reached(&event, target_id) {
                    self.metrics.filtered(FilterReason::Loop, 1);
                    mask &= !(1 << route_index);
                }
            }
            if mask == 0 {
                continue;
            }
            // Each route but the last gets a copy; the last takes the event itself.
            let last_route = (u64::BITS - 1 - mask.leading_zeros()) as usize;
            for route_index in routes_in(mask & !(1 << last_route)) {
                self.push_for_route(&mut routed, route_index, mask, event.clone(), position);
            }
            self.push_for_route(&mut routed, last_route, mask, event, position);
        }
        routed
    }

    /// Adds `event` to the events for route `route_index`, stamped for its hub, with the other
    /// hubs of `mask` (the routes the event takes) as its fan-out. Pushed first and stamped
    /// where it lies, and sent from there: an event is a few hundred bytes, and each move of it
    /// is a copy.
    #[inline(always)]
    fn push_for_route(
        &self,
        routed: &mut Routed,
        route_index: usize,
        mask: u64,
        event: EventData,
        position: Position,
    ) {
        let list = &mut routed.per_route[route_index];
        list.events.push(event);
        let event = list.events.last_mut().expect("just pushed");
        let mut undo = metadata::Undo::default();
        let alone = mask == 1 << route_index && !self.task.azure_marker;
        if alone && self.route_stamps[route_index].is_some() && metadata::is_first_hop(event) {
            // The common case: a first hop to one hub, whose stamp the target writes into
            // the event's message from bytes encoded once per batch.
            list.places.push((position, metadata::Undo::deferred()));
            return;
        }
        // A table keeps the source position in its own columns: no stamp.
        if let Some(ids) = &self.route_ids[route_index] {
            undo = metadata::stamp_with(event, &self.partition, position, ids);
            // The other hubs get their copies from this hop directly: a later hop skips them.
            for sibling in routes_in(mask & !(1 << route_index)) {
                if let Some(sibling_ids) = &self.route_ids[sibling] {
                    metadata::mark_fanout(event, &mut undo, sibling_ids);
                }
            }
        }
        if self.task.azure_marker
            && let Some(hub_name) = &self.task.routes[route_index].hub_name
        {
            metadata::mark_azure_merge_target(event, &mut undo, hub_name);
        }
        list.places.push((position, undo));
    }

    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    async fn forward_routes(
        &self,
        partition: &str,
        per_route: Vec<Outgoings>,
        last: Position,
    ) -> Vec<(String, Poison)> {
        let counting = Counting {
            task: &self.task.metrics,
            partition: &self.metrics,
            now_ms: wall_clock_ms,
        };
        let sends = self
            .task
            .routes
            .iter()
            .zip(per_route)
            .map(|(route, items)| {
                let counting = counting.clone();
                async move {
                    match &route.sink {
                        Sink::Hub(destination) => {
                            if items.is_empty() {
                                return Vec::new();
                            }
                            forward(destination, partition, items, self.task.retry, &counting)
                                .await
                                .into_iter()
                                .map(|poison| (destination.name.clone(), poison))
                                .collect()
                        }
                        #[cfg(feature = "postgres")]
                        Sink::Table(projection) => {
                            // Even a batch with no rows for the table moves its progress.
                            let items = items.into_items().collect();
                            let (written, refused) = projection
                                .write(partition, items, last, self.task.retry)
                                .await;
                            self.metrics.sent(&projection.name, written);
                            refused
                                .into_iter()
                                .map(|poison| (projection.name.clone(), poison))
                                .collect()
                        }
                    }
                }
            });
        futures_util::future::join_all(sends)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// The dead letters of one batch: events a target refused (with their stamp for it taken
    /// off) and events no route matched (as the editor left them), and events a step refused
    /// (as they reached it) — each stamped for the dead-letter hub, not for the target that
    /// refused it, and marked with the reason.
    fn letters(
        &self,
        unmatched: Vec<(EventData, Position)>,
        poison: Vec<(String, Poison)>,
        rejected: Vec<Rejected>,
    ) -> Vec<Outgoing> {
        let mut letters = Vec::with_capacity(poison.len() + unmatched.len() + rejected.len());
        let mut add = |event: EventData, position: Position, mark: Mark<'_>| {
            let mut letter = stamped(event, position, &self.partition, &self.dead_letter_ids);
            letter.event = self.letter(letter.event, mark);
            letters.push(letter);
        };
        for (route, refused) in poison {
            let Outgoing {
                mut event,
                position,
                undo,
            } = refused.outgoing;
            undo.apply(&mut event);
            add(event, position, Mark::Route(&route, &refused.reason));
        }
        for (event, position) in unmatched {
            add(event, position, Mark::Unmatched);
        }
        for refusal in rejected {
            let reason = format!("step {:?}: {}", refusal.step, refusal.reason);
            let position = refusal.item.position();
            add(
                refusal.item.into_event(),
                position,
                Mark::Step(&refusal.step, &reason),
            );
        }
        letters
    }

    /// Sends a batch's dead letters (see [`Self::letters`]); what the dead-letter target cannot
    /// take is logged at error level, one line per event, and counted as lost.
    async fn dead_letter(
        &self,
        partition: &str,
        unmatched: Vec<(EventData, Position)>,
        poison: Vec<(String, Poison)>,
        rejected: Vec<Rejected>,
    ) {
        if poison.is_empty() && unmatched.is_empty() && rejected.is_empty() {
            return;
        }
        let letters = self.letters(unmatched, poison, rejected);
        let task = &self.task;
        let Some(destination) = &task.dead_letter else {
            self.lose(partition, &letters, "the task has no [dead_letter] target");
            return;
        };
        let total = letters.len();
        let counting = Counting {
            task: &task.metrics,
            partition: &self.metrics,
            now_ms: wall_clock_ms,
        };
        let letters = letters.into_iter().collect();
        let refused = forward(destination, partition, letters, task.retry, &counting).await;
        self.metrics.dead_lettered(total - refused.len());
        for poison in refused {
            self.lose(
                partition,
                std::slice::from_ref(&poison.outgoing),
                &poison.reason,
            );
        }
    }

    fn letter(&self, mut event: EventData, mark: Mark<'_>) -> EventData {
        let mut put = |key: &'static str, value: &str| {
            event.properties.retain(|(k, _)| k != key);
            event.properties.push((
                SmolStr::new_static(key),
                PropertyValue::String(SmolStr::new(value)),
            ));
        };
        put(DEAD_LETTER_TASK, &self.task.name);
        match mark {
            Mark::Route(route, reason) => {
                put(DEAD_LETTER_REASON, reason);
                put(DEAD_LETTER_ROUTE, route);
            }
            Mark::Unmatched => put(DEAD_LETTER_REASON, "no route matched the event"),
            Mark::Step(step, reason) => {
                put(DEAD_LETTER_REASON, reason);
                put(DEAD_LETTER_STEP, step);
            }
        }
        event
    }

    fn lose(&self, partition: &str, letters: &[Outgoing], why: &str) {
        for letter in letters {
            let reason = letter.event.property(DEAD_LETTER_REASON);
            tracing::error!(
                task = %self.task.name,
                partition,
                sequence_number = letter.position.sequence_number,
                offset = letter.position.offset,
                ?reason,
                why,
                "an event was refused and could not be dead-lettered; it is not forwarded"
            );
        }
        self.metrics.lost(letters.len());
    }
}

#[cfg(test)]
mod tests {
    use super::routes_in;

    #[test]
    fn routes_in_names_every_set_bit_lowest_first() {
        let masks = [0, 1, 2, 0b1011, 1 << 63, u64::MAX, 0x8000_0000_0000_0001];
        for mask in masks {
            let want: Vec<usize> = (0..64).filter(|bit| mask & (1 << bit) != 0).collect();
            assert_eq!(routes_in(mask).collect::<Vec<_>>(), want, "mask {mask:#x}");
        }
    }
}
