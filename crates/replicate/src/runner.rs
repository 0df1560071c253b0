//! A running replication task: a processor host on the source whose processor forwards each
//! batch to the task's routes and checkpoints after the targets acknowledged it.
//!
//! For each batch of one source partition, in order:
//!
//! 1. every event is matched against each route's condition; an event goes to every route it
//!    matches (none: [`Unmatched`]), unless the route's target is already on its path (a loop)
//!    or the task forwards only events produced at the source and this one was replicated in;
//! 2. each route's events are stamped (service metadata, origin, path) and forwarded, all
//!    routes at once ([`crate::forward`]);
//! 3. events a target refused go to the dead-letter target with the reason;
//! 4. only then is the batch checkpointed. A crash anywhere before this point replays the batch
//!    from the previous checkpoint: **at least once, nothing skipped**, and the duplicates are
//!    at most the batch in flight per partition.

use std::sync::Arc;

use tributary_event::{EventData, PropertyValue, ReceivedEvent};
use tributary_processor::{
    CheckpointStore, CloseReason, EventProcessor, EventProcessorHost, PartitionContext,
    ProcessorOptions, RunningHost, SqliteCheckpointStore,
};

use crate::endpoint::{Brokers, OpenedSource, open_source, open_target};
use crate::forward::{Counting, Destination, Outgoing, Poison, RetryPolicy, forward};
use crate::metadata::{self, SourcePosition};
use crate::metrics::{FilterReason, PartitionMetrics, TaskMetrics};
use crate::status;
use crate::task::{Endpoint, TaskConfig, TaskError, Unmatched};

/// Why an event went to the dead-letter target (application property).
pub const DEAD_LETTER_REASON: &str = "dead-letter-reason";
/// The task that dead-lettered it.
pub const DEAD_LETTER_TASK: &str = "dead-letter-task";
/// The route whose target refused it (absent for unmatched events).
pub const DEAD_LETTER_ROUTE: &str = "dead-letter-route";

/// A condition deciding whether an event takes a route.
pub type RouteCondition = Arc<dyn Fn(&ReceivedEvent) -> bool + Send + Sync>;

/// One route: a target and the condition for taking it.
#[derive(Clone)]
struct Route {
    destination: Destination,
    condition: Option<RouteCondition>,
}

/// What every partition's processor of one task shares.
struct TaskRuntime {
    name: String,
    source_id: String,
    routes: Vec<Route>,
    unmatched: Unmatched,
    dead_letter: Option<Destination>,
    forward_replicated: bool,
    retry: RetryPolicy,
    metrics: Arc<TaskMetrics>,
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
    /// Each target's routing condition, by target name, compiled by the caller from the task
    /// file's `when`. A target with a `when` and no condition here fails to start.
    pub conditions: Vec<(String, RouteCondition)>,
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
        let source = open_source(source_endpoint, &brokers)
            .await
            .map_err(|m| endpoint_error(source_endpoint, m))?;
        let routes = open_routes(config, &options, &source, &brokers).await?;
        let dead_letter = match &config.dead_letter {
            Some(endpoint) => Some(
                destination("dead-letter", endpoint, false, &brokers)
                    .await
                    .map_err(|m| endpoint_error(endpoint, m))?,
            ),
            None => None,
        };
        let metrics = Arc::new(TaskMetrics::new(&config.name));
        let runtime = Arc::new(TaskRuntime {
            name: config.name.clone(),
            source_id: config
                .source
                .origin_id
                .clone()
                .unwrap_or(source.identity.id.clone()),
            routes,
            unmatched: config.unmatched.clone(),
            dead_letter,
            forward_replicated: config.forward_replicated,
            retry: RetryPolicy {
                backoff_min: config.backoff_min,
                backoff_max: config.backoff_max,
            },
            metrics: Arc::clone(&metrics),
        });
        let namespace = source.source.fully_qualified_namespace().to_owned();
        let host = Arc::new(start_host(config, source, runtime).await?);
        let status_writer = tokio::spawn(write_status(
            status::status_dir(&config.source.checkpoint_store),
            Arc::clone(&host),
            Arc::clone(&metrics),
        ));
        Ok(Replicator {
            host,
            metrics,
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

async fn open_routes(
    config: &TaskConfig,
    options: &StartOptions,
    source: &OpenedSource,
    brokers: &Brokers,
) -> Result<Vec<Route>, TaskError> {
    let mut routes = Vec::with_capacity(config.targets.len());
    for target in &config.targets {
        let error = |message: String| TaskError {
            file: config.file.clone(),
            line: Some(target.endpoint.line),
            key: target.endpoint.key.clone(),
            message,
        };
        let destination = destination(
            &target.name,
            &target.endpoint,
            target.keep_partition,
            brokers,
        )
        .await
        .map_err(error)?;
        if target.keep_partition
            && destination.identity.partition_count != source.identity.partition_count
        {
            return Err(error(format!(
                "keep_partition needs equal partition counts, but the source has {} and the target {}; drop keep_partition to route keyless events round-robin",
                source.identity.partition_count, destination.identity.partition_count
            )));
        }
        let condition = options
            .conditions
            .iter()
            .find(|(name, _)| *name == target.name)
            .map(|(_, condition)| Arc::clone(condition));
        if let (Some((_, line)), None) = (&target.when, &condition) {
            return Err(TaskError {
                file: config.file.clone(),
                line: Some(*line),
                key: format!("{}.when", target.endpoint.key),
                message: "routing conditions in the task file are not supported yet; remove `when`, or start the task from Rust with StartOptions::conditions".to_owned(),
            });
        }
        routes.push(Route {
            destination,
            condition,
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
    let mut options = ProcessorOptions {
        consumer_group: config.source.consumer_group.clone(),
        batch_events_max: config.source.batch_events_max,
        prefetch_count: config.source.prefetch,
        ..ProcessorOptions::default()
    }
    .with_initial_position(move |_| initial);
    if let Some(interval) = config.load_balancing_interval {
        options.load_balancing_interval = interval;
    }
    if let Some(expiration) = config.ownership_expiration {
        options.ownership_expiration = expiration;
    }
    if let Some(name) = &config.host_name {
        options.host_name = name.clone();
    }
    let factory = move |context: &PartitionContext| ReplicationProcessor {
        metrics: runtime.metrics.partition(context.partition_id()),
        task: Arc::clone(&runtime),
    };
    EventProcessorHost::builder(source.source, store, factory)
        .options(options)
        .build()
        .map_err(|e| file_error("source", e.to_string()))?
        .start()
        .map_err(|e| file_error("source", e.to_string()))
}

/// The processor of one source partition.
struct ReplicationProcessor {
    task: Arc<TaskRuntime>,
    metrics: Arc<PartitionMetrics>,
}

#[async_trait::async_trait]
impl EventProcessor for ReplicationProcessor {
    async fn process_events(&mut self, context: &PartitionContext, events: Vec<ReceivedEvent>) {
        if events.is_empty() {
            return;
        }
        let last_sequence = events[events.len() - 1].sequence_number;
        self.metrics.received(events.len());
        let partition = context.partition_id();
        let (per_route, unmatched) = self.route(partition, &events);
        let poison = self.forward_routes(partition, per_route).await;
        self.dead_letter(partition, &events, poison, unmatched)
            .await;
        match context.checkpoint().await {
            Ok(()) => self.metrics.checkpointed(last_sequence),
            Err(error) => tracing::info!(
                task = %self.task.name,
                partition,
                %error,
                "checkpoint not written; the next owner replays this batch"
            ),
        }
    }

    async fn close(&mut self, context: &PartitionContext, reason: CloseReason) {
        tracing::debug!(task = %self.task.name, partition = context.partition_id(), ?reason, "partition closed");
    }
}

/// `event` stamped for forwarding from the hub `source_id` to the hub `target_id`.
fn stamped(event: &ReceivedEvent, partition: &str, source_id: &str, target_id: &str) -> Outgoing {
    let mut data = event.data.clone();
    metadata::stamp(&mut data, partition, position(event), source_id, target_id);
    Outgoing {
        event: data,
        position: position(event),
    }
}

fn position(event: &ReceivedEvent) -> SourcePosition {
    SourcePosition {
        sequence_number: event.sequence_number,
        offset: event.offset,
        enqueued_time_ms: event.enqueued_time_ms,
    }
}

impl ReplicationProcessor {
    /// Each route's events (stamped for it), and the events no route matched (to be
    /// dead-lettered).
    fn route<'e>(
        &self,
        partition: &str,
        events: &'e [ReceivedEvent],
    ) -> (Vec<Vec<Outgoing>>, Vec<&'e ReceivedEvent>) {
        let task = &self.task;
        let mut per_route: Vec<Vec<Outgoing>> = vec![Vec::new(); task.routes.len()];
        let mut unmatched = Vec::new();
        for event in events {
            if !task.forward_replicated
                && metadata::origin(&event.data).is_some_and(|origin| origin != task.source_id)
            {
                self.metrics.filtered(FilterReason::Replicated, 1);
                continue;
            }
            let mut matched = false;
            for (route, outgoing) in task.routes.iter().zip(per_route.iter_mut()) {
                if route
                    .condition
                    .as_ref()
                    .is_some_and(|condition| !condition(event))
                {
                    continue;
                }
                matched = true;
                let target_id = &route.destination.identity.id;
                if metadata::has_passed_through(&event.data, target_id) {
                    self.metrics.filtered(FilterReason::Loop, 1);
                    continue;
                }
                outgoing.push(stamped(event, partition, &task.source_id, target_id));
            }
            if !matched {
                match task.unmatched {
                    Unmatched::Target(index) => {
                        let route = &task.routes[index];
                        let target_id = &route.destination.identity.id;
                        if metadata::has_passed_through(&event.data, target_id) {
                            self.metrics.filtered(FilterReason::Loop, 1);
                        } else {
                            per_route[index].push(stamped(
                                event,
                                partition,
                                &task.source_id,
                                target_id,
                            ));
                        }
                    }
                    Unmatched::Drop => self.metrics.filtered(FilterReason::Unmatched, 1),
                    Unmatched::DeadLetter => unmatched.push(event),
                }
            }
        }
        (per_route, unmatched)
    }

    async fn forward_routes(
        &self,
        partition: &str,
        per_route: Vec<Vec<Outgoing>>,
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
                    if items.is_empty() {
                        return Vec::new();
                    }
                    let destination = &route.destination;
                    forward(destination, partition, items, self.task.retry, &counting)
                        .await
                        .into_iter()
                        .map(|poison| (destination.name.clone(), poison))
                        .collect()
                }
            });
        futures_util::future::join_all(sends)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// Sends refused and unmatched events to the dead-letter target, as they were read (stamped
    /// for the dead-letter hub, not for the target that refused them); what it cannot take is
    /// logged at error level, one line per event, and counted as lost.
    async fn dead_letter(
        &self,
        partition: &str,
        events: &[ReceivedEvent],
        poison: Vec<(String, Poison)>,
        unmatched: Vec<&ReceivedEvent>,
    ) {
        if poison.is_empty() && unmatched.is_empty() {
            return;
        }
        let task = &self.task;
        let dead_letter_id = task
            .dead_letter
            .as_ref()
            .map_or("-", |d| d.identity.id.as_str());
        let original = |sequence_number: i64| {
            let at = events.partition_point(|e| e.sequence_number < sequence_number);
            assert_eq!(
                events[at].sequence_number, sequence_number,
                "a poison event comes from the batch"
            );
            &events[at]
        };
        let mut letters = Vec::with_capacity(poison.len() + unmatched.len());
        for (route, refused) in poison {
            let event = original(refused.outgoing.position.sequence_number);
            let mut letter = stamped(event, partition, &task.source_id, dead_letter_id);
            letter.event = self.letter(letter.event, Some(&route), &refused.reason);
            letters.push(letter);
        }
        for event in unmatched {
            let mut letter = stamped(event, partition, &task.source_id, dead_letter_id);
            letter.event = self.letter(letter.event, None, "no route matched the event");
            letters.push(letter);
        }
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

    fn letter(&self, mut event: EventData, route: Option<&str>, reason: &str) -> EventData {
        let mut put = |key: &str, value: &str| {
            event.properties.retain(|(k, _)| k != key);
            event
                .properties
                .push((key.to_owned(), PropertyValue::String(value.to_owned())));
        };
        put(DEAD_LETTER_REASON, reason);
        put(DEAD_LETTER_TASK, &self.task.name);
        if let Some(route) = route {
            put(DEAD_LETTER_ROUTE, route);
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
