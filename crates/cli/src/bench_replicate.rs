//! `tributary bench --scenario replicate`: a replication task copying between two hubs over
//! AMQP, on this machine.
//!
//! Two hubs run in this process as `tributary serve` runs one: each its own broker on its own
//! data directory (the first of `--modes`, on both), its AMQP door on 127.0.0.1 (port 0), and
//! its own tokio runtime (threads named `source-hub` and `target-hub`), as two server processes
//! would. The producers (the Rust client, one connection each) have a runtime of their own
//! (`producers`). The replication task runs on the command's runtime and reaches both hubs over
//! AMQP with connection strings, as a deployed task does. All of them share the machine's cores
//! and its one disk; every run prints the CPU time each group of threads used (from
//! `/proc/self/task`), what other processes used meanwhile (`/proc/stat`: a busy machine makes
//! a run worthless), and each hub's `fdatasync` figures (the log's own timing).
//!
//! * **ingest** (the baseline): producers keep `--send-window` batches in flight per partition
//!   into a hub of the source (`ingest`) for `--seconds` after a 1 s warm-up → events/s
//!   acknowledged.
//! * **target ingest**: the same, into the target's hub `ingest`: what the target hub spends
//!   on an unstamped event, beside what it spends on a stamped one during the copy.
//! * **copy**: the same producers fill the source's hub `bench` with `--copy-events` events;
//!   then a task reading it from earliest copies them to the target's hub `bench-<transport>`
//!   (`keep_partition`), timed from `Replicator::start` until the target's partitions hold them
//!   all → events/s, and its ratio to the baseline. With `--task-transport amqp,local` one
//!   task copies them over AMQP and then another in process, each into a hub of its own. The
//!   target's log counts its appends, so the line gives the events per send the task made;
//!   offsets are byte positions, so the logs' bytes per event show what the task's stamps add.
//! * **ratios** (issue 38's replication targets, `ratios.rs`): the task's CPU per copied
//!   event / the source hub's per ingested event, each way (≤ 0.5), and the target hub's CPU per
//!   stamped event / per unstamped event (≤ 1.2), each with its two figures and a verdict.
//! * **rounds**: `--rounds N` runs the baselines and the copies N times, alternating, each
//!   round with event hubs of its own (`ingest-2` and `bench-2`, …), and prints each round's
//!   ratios and their medians: this machine's rates drift from one minute to the next (on a
//!   VM, memory the host has not backed makes the page cache's first touch slow), and a
//!   baseline and a copy taken side by side drift together.
//! * **lag**: after the last round, for each way the task reaches the hubs, a fresh task (its
//!   own consumer group, from latest) while the producers offer a fixed rate (`--lag-rates`: by
//!   default half the (median) copy throughput that way, and 10,000 events/s) for
//!   `--lag-seconds` after a 2 s warm-up; then the producers stop and the task catches up.
//!   The task's lag histogram (source enqueued time → target acknowledgement) over that
//!   window: p50, p99, p999 and max, as the upper bounds of its buckets, and the p99 of each
//!   second (a steady tail and a backlog draining look alike in one figure).
//!
//! Every result line states the durability, event size, batch size, partitions, producers and
//! the rates, so no figure is quoted without its conditions.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use tokio::task::{JoinHandle, JoinSet};
use tributary_amqp::{AccessPolicies, AccessPolicy, AmqpConfig, Right, RunningAmqpServer};
use tributary_broker::{
    Broker, BrokerConfig, Durability, HubSpec, PartitionProperties, SendTarget, SyncTimes,
};
use tributary_client::{ClientOptions, ProducerClient};
use tributary_event::EventData;
use tributary_log::DurationCounts;
use tributary_replicate::limits::BATCH_EVENTS_DEFAULT;
use tributary_replicate::{Replicator, StartOptions, TaskConfig};

use crate::args::{BenchArgs, LagRate, TaskTransport};
use crate::bench::{load_average, thousands};

mod ratios;

/// The event hub the copy and the lag runs read and write, on both hubs.
const HUB: &str = "bench";
/// The source's event hub the baseline writes, so the copy reads only what it was given.
const INGEST_HUB: &str = "ingest";
/// Sending before the ingest window opens.
const INGEST_WARM_UP: Duration = Duration::from_secs(1);
/// Offered load before a lag window opens: connections, credit and the disk settle.
const LAG_WARM_UP: Duration = Duration::from_secs(2);
/// A copy or catch-up that makes no progress this long has failed.
const STALL: Duration = Duration::from_secs(30);
/// How often the target's partitions are looked at while a copy runs.
const POLL: Duration = Duration::from_millis(5);

/// Runs the scenario under `root` and prints one line per result.
pub async fn run(args: &BenchArgs, root: &Path) -> Result<()> {
    let setup = Setup::from_args(args, &root.join("replicate"))?;
    std::fs::create_dir_all(&setup.dir)
        .with_context(|| format!("cannot create {}", setup.dir.display()))?;
    println!(
        "# replicate: source and target hubs each with its broker (own data directory, durability {}) and AMQP door on 127.0.0.1 in this process, each on its own tokio runtime; producers (Rust client) on a third; the task on the command's runtime, reading the source and writing the target over AMQP. All share {} cores and one disk; load average {}",
        setup.durability,
        cores(),
        load_average()
    );
    let source = Hub::start(Role::Source, &setup).await?;
    let target = Hub::start(Role::Target, &setup).await?;
    let outcome = measure(&setup, &source, &target).await;
    let stopped = (source.stop().await, target.stop().await);
    outcome?;
    stopped.0?;
    stopped.1
}

async fn measure(setup: &Setup, source: &Hub, target: &Hub) -> Result<()> {
    let mut rounds = Vec::with_capacity(setup.rounds);
    for number in 1..=setup.rounds {
        let round = measure_round(setup, (source, target), number).await?;
        ratios::print_round(&round, number, setup.rounds);
        rounds.push(round);
    }
    ratios::print_medians(&rounds);
    let hub = copy_hub(setup.rounds);
    let producers = Producers::connect(setup, &source.connection_string, &hub).await?;
    let mut outcome = Ok(());
    for (index, &transport) in setup.transports.iter().enumerate() {
        let copy_rate = summarize(&rounds, index);
        let lagged = lags(
            setup,
            &producers,
            (source, target),
            (&hub, transport),
            copy_rate,
        );
        outcome = lagged.await;
        if outcome.is_err() {
            break;
        }
    }
    producers.close().await;
    outcome
}

/// One round: the source's ingest baseline, the target's ingest of unstamped events, the fill,
/// and a copy of it each way the task reaches the hubs.
async fn measure_round(
    setup: &Setup,
    (source, target): (&Hub, &Hub),
    number: usize,
) -> Result<Round> {
    let baseline = ingest(setup, source, &ingest_hub(number)).await?;
    let target_baseline = ingest(setup, target, &ingest_hub(number)).await?;
    let hub = copy_hub(number);
    let producers = Producers::connect(setup, &source.connection_string, &hub).await?;
    let filled = fill(setup, &producers, source, &hub).await;
    producers.close().await;
    filled?;
    let held = source.events(&hub, setup.partitions)?;
    let mut copies = Vec::with_capacity(setup.transports.len());
    for &transport in &setup.transports {
        let copied = copy(
            setup,
            (source, target),
            (number, transport),
            held,
            baseline.rate,
        );
        copies.push(copied.await?);
    }
    Ok(Round {
        baseline,
        target_baseline,
        copies,
    })
}

/// What one round measured.
struct Round {
    /// The source hub's ingest baseline.
    baseline: IngestRun,
    /// The target hub's ingest of unstamped events of the same size, the same way.
    target_baseline: IngestRun,
    /// A copy each way the task reaches the hubs, in the order of `--task-transport`.
    copies: Vec<CopyRun>,
}

/// An ingest run: its rate, and the CPU its threads used over the events acknowledged.
struct IngestRun {
    rate: f64,
    events: u64,
    cpu: CpuUse,
    /// The appends the hub's log made (one per send, or fewer where sends share a batch).
    appends: u64,
}

/// A copy: its rate, and the CPU its threads used over the events copied.
struct CopyRun {
    transport: TaskTransport,
    rate: f64,
    events: u64,
    cpu: CpuUse,
    /// The appends the target's log made: one per send of the task.
    appends: u64,
}

/// The source's event hub round `round` (from 1) fills and the copies read.
fn copy_hub(round: usize) -> String {
    hub_of_round(HUB, round)
}

/// The target's event hub round `round`'s copy over `transport` writes: one each way, so every
/// copy starts on an empty hub.
fn target_hub(round: usize, transport: TaskTransport) -> String {
    format!("{}-{}", copy_hub(round), transport.slug())
}

/// The source's event hub round `round`'s baseline writes: a fresh one each round, as in a
/// single round.
fn ingest_hub(round: usize) -> String {
    hub_of_round(INGEST_HUB, round)
}

fn hub_of_round(name: &str, round: usize) -> String {
    match round {
        1 => name.to_owned(),
        _ => format!("{name}-{round}"),
    }
}

/// With more than one round, prints each round's copy / baseline of the `index`th transport and
/// their median; returns the median copy rate (the lag runs' `half` is half of it).
fn summarize(rounds: &[Round], index: usize) -> f64 {
    let copy_rate = median(rounds.iter().map(|r| r.copies[index].rate).collect());
    if rounds.len() > 1 {
        let ratios: Vec<f64> = rounds
            .iter()
            .map(|r| 100.0 * r.copies[index].rate / r.baseline.rate)
            .collect();
        let listed: Vec<String> = ratios.iter().map(|ratio| format!("{ratio:.1}")).collect();
        println!(
            "replicate rounds, task {}: copy / baseline {} % in {} rounds, median {:.1} %; copy median {} events/s, baseline median {} events/s",
            rounds[0].copies[index].transport,
            listed.join(", "),
            rounds.len(),
            median(ratios),
            thousands(copy_rate),
            thousands(median(rounds.iter().map(|r| r.baseline.rate).collect()))
        );
    }
    copy_rate
}

/// The median of `values` (the mean of the middle two of an even count); NaN for none.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[middle],
        _ => (values[middle - 1] + values[middle]) / 2.0,
    }
}

/// The lag runs of a task reaching the hubs over `transport`, from the source's event hub
/// `hub`, after copies at `copy_rate` events/s.
async fn lags(
    setup: &Setup,
    producers: &Producers,
    hubs: (&Hub, &Hub),
    (hub, transport): (&str, TaskTransport),
    copy_rate: f64,
) -> Result<()> {
    for (index, rate) in setup.lag_rates.iter().enumerate() {
        let rate = match rate {
            LagRate::HalfCopy => ((copy_rate / 2.0) as u64).max(1),
            LagRate::EventsPerSecond(rate) => *rate,
        };
        lag(setup, producers, hubs, (hub, transport), (rate, index)).await?;
    }
    Ok(())
}

/// The scenario's conditions, from the flags.
struct Setup {
    dir: PathBuf,
    durability: Durability,
    event_bytes: usize,
    batch_events: usize,
    partitions: u32,
    producers: usize,
    send_window: usize,
    seconds: u64,
    copy_events: u64,
    rounds: usize,
    lag_rates: Vec<LagRate>,
    lag_seconds: u64,
    task_batch_events: Option<u32>,
    task_prefetch: Option<u32>,
    transports: Vec<TaskTransport>,
}

impl Setup {
    fn from_args(args: &BenchArgs, dir: &Path) -> Result<Setup> {
        anyhow::ensure!(
            args.partitions > 0 && args.producers > 0 && args.send_window > 0,
            "partitions, producers and send window must be above 0"
        );
        anyhow::ensure!(args.batch_events > 0, "batch events must be above 0");
        anyhow::ensure!(args.seconds > 0, "seconds must be above 0");
        anyhow::ensure!(
            !args.task_transport.is_empty(),
            "give a task transport (amqp, local)"
        );
        Ok(Setup {
            dir: dir.to_owned(),
            durability: *args.modes.first().context("give a durability mode")?,
            event_bytes: usize::try_from(*args.event_bytes.first().context("give an event size")?)
                .context("the event size does not fit in memory")?,
            batch_events: args.batch_events,
            partitions: u32::try_from(args.partitions).context("too many partitions")?,
            producers: args.producers,
            send_window: args.send_window,
            seconds: args.seconds,
            copy_events: args.copy_events.max(1),
            rounds: args.rounds.max(1),
            lag_rates: args.lag_rates.clone(),
            lag_seconds: args.lag_seconds.max(1),
            task_batch_events: args.task_batch_events,
            task_prefetch: args.task_prefetch,
            transports: dedup(&args.task_transport),
        })
    }

    /// The conditions every line states.
    fn conditions(&self) -> String {
        format!(
            "durability {} on both hubs, {}-byte events, batches of {}, {} partitions",
            self.durability, self.event_bytes, self.batch_events, self.partitions
        )
    }

    /// How a task reaching the hubs over `transport` reads.
    fn task_note(&self, transport: TaskTransport) -> String {
        let batch = self.task_batch_events.unwrap_or(BATCH_EVENTS_DEFAULT);
        let prefetch = self.task_prefetch.unwrap_or(batch.saturating_mul(2));
        format!(
            "task {transport}, batches of up to {batch} events, prefetch {prefetch}, keep_partition"
        )
    }

    /// A copy task `name` of the source's event hub `from` to the target's `to`, reaching the
    /// hubs over `transport`, reading in `group` from `position`, with its checkpoint store
    /// beside its (never written) task file.
    fn task(
        &self,
        (name, group, position): (&str, &str, &str),
        hubs: (&Hub, &Hub),
        (from, to, transport): (&str, &str, TaskTransport),
    ) -> Result<TaskConfig> {
        let mut text = format!(
            "name = \"{name}\"\n[source]\n{}\nevent_hub = \"{from}\"\nconsumer_group = \"{group}\"\ninitial_position = \"{position}\"\ncheckpoint_store = \"{name}.sqlite\"\n",
            self.endpoint(hubs.0, transport)
        );
        if let Some(batch) = self.task_batch_events {
            text.push_str(&format!("batch_events_max = {batch}\n"));
        }
        if let Some(prefetch) = self.task_prefetch {
            text.push_str(&format!("prefetch = {prefetch}\n"));
        }
        text.push_str(&format!(
            "[[target]]\nname = \"copy\"\n{}\nevent_hub = \"{to}\"\nkeep_partition = true\n",
            self.endpoint(hubs.1, transport)
        ));
        TaskConfig::parse(&self.dir.join(format!("{name}.toml")), &text)
            .map_err(|e| anyhow!("the bench's task file is wrong: {e}"))
    }
}

impl Setup {
    /// How a task file names `hub`: by connection string or by data directory.
    fn endpoint(&self, hub: &Hub, transport: TaskTransport) -> String {
        match transport {
            TaskTransport::Amqp => format!("connection_string = \"{}\"", hub.connection_string),
            TaskTransport::Local => {
                let dir = &hub.broker.config().data_dir;
                format!(
                    "data_dir = {:?}",
                    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.clone())
                )
            }
        }
    }

    /// What the task starts with: in process, both hubs' brokers (so it opens neither data
    /// directory a second time).
    async fn start_options(&self, hubs: (&Hub, &Hub), transport: TaskTransport) -> StartOptions {
        let options = StartOptions::default();
        if transport == TaskTransport::Local {
            options.brokers.adopt(hubs.0.broker.clone()).await;
            options.brokers.adopt(hubs.1.broker.clone()).await;
        }
        options
    }
}

/// A tokio runtime of the bench's own, shut down in the background when dropped (a runtime may
/// not be dropped from within another one otherwise).
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl OwnRuntime {
    /// A multi-threaded runtime (a worker per core, as a process of its own would have) whose
    /// threads are named `name`.
    fn new(name: &str) -> Result<OwnRuntime> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .thread_name(name)
            .enable_all()
            .build()
            .with_context(|| format!("cannot start the {name} runtime"))?;
        Ok(OwnRuntime(Some(runtime)))
    }

    fn handle(&self) -> Result<&tokio::runtime::Handle> {
        Ok(self
            .0
            .as_ref()
            .context("the runtime is shut down")?
            .handle())
    }

    /// Runs `future` on this runtime and waits for it.
    async fn run<T: Send + 'static>(
        &self,
        future: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        self.handle()?
            .spawn(future)
            .await
            .context("a task of the bench panicked")?
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// The event hubs each hub holds: every round's (both sides make them all, most stay empty on
/// one side).
fn hubs_of(setup: &Setup) -> Vec<String> {
    let mut hubs = Vec::new();
    for round in 1..=setup.rounds {
        hubs.extend([copy_hub(round), ingest_hub(round)]);
        hubs.extend(setup.transports.iter().map(|&t| target_hub(round, t)));
    }
    hubs
}

/// `transports` once each, in their first order.
fn dedup(transports: &[TaskTransport]) -> Vec<TaskTransport> {
    let mut once = Vec::with_capacity(transports.len());
    for &transport in transports {
        if !once.contains(&transport) {
            once.push(transport);
        }
    }
    once
}

/// Which of the two hubs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Source,
    Target,
}

impl Role {
    /// Its name: its data directory's, its threads' (`<name>-hub`), its lines'.
    fn name(self) -> &'static str {
        match self {
            Role::Source => "source",
            Role::Target => "target",
        }
    }
}

/// A hub as `tributary serve` runs it: a broker and its AMQP door, on a runtime of its own.
struct Hub {
    role: Role,
    runtime: OwnRuntime,
    broker: Broker,
    server: Option<RunningAmqpServer>,
    connection_string: String,
}

impl Hub {
    async fn start(role: Role, setup: &Setup) -> Result<Hub> {
        let runtime = OwnRuntime::new(&format!("{}-hub", role.name()))?;
        let dir = setup.dir.join(role.name());
        let (durability, partitions) = (setup.durability, setup.partitions);
        let hubs = hubs_of(setup);
        let (broker, server, connection_string) = runtime
            .run(async move {
                let mut config = BrokerConfig::new(&dir);
                config.log.durability = durability;
                let broker = Broker::open(config)
                    .await
                    .with_context(|| format!("cannot open {}", dir.display()))?;
                for hub in hubs {
                    broker
                        .create_hub(HubSpec::new(hub, partitions))
                        .await
                        .context("cannot create a hub")?;
                }
                let root = AccessPolicy::generate("RootManageSharedAccessKey", vec![Right::Manage])
                    .context("cannot make an access policy")?;
                let policies = AccessPolicies::new(vec![root.clone()])
                    .context("cannot make the access policies")?;
                let bind = SocketAddr::from(([127, 0, 0, 1], 0));
                let server = tributary_amqp::start(broker.clone(), AmqpConfig::new(bind, policies))
                    .await
                    .context("cannot start the AMQP door")?;
                let port = server.local_addr().port();
                let connection_string = tributary_amqp::connection_string("127.0.0.1", port, &root);
                Ok((broker, server, connection_string))
            })
            .await
            .with_context(|| format!("the {} hub did not start", role.name()))?;
        Ok(Hub {
            role,
            runtime,
            broker,
            server: Some(server),
            connection_string,
        })
    }

    /// The events the event hub `hub` holds: its partitions' end sequence numbers + 1 (nothing
    /// expires within a run).
    fn events(&self, hub: &str, partitions: u32) -> Result<u64> {
        self.sum_over_partitions(hub, partitions, |p| {
            u64::try_from(p.last_enqueued_sequence_number + 1).unwrap_or(0)
        })
    }

    /// The bytes the event hub `hub`'s logs hold, about: offsets are byte positions, so the
    /// partitions' last offsets (each short of its last record).
    fn log_bytes(&self, hub: &str, partitions: u32) -> Result<u64> {
        self.sum_over_partitions(hub, partitions, |p| p.last_enqueued_offset.unwrap_or(0))
    }

    /// `figure` of each of `hub`'s partitions' properties, summed.
    fn sum_over_partitions(
        &self,
        hub: &str,
        partitions: u32,
        figure: impl Fn(&PartitionProperties) -> u64,
    ) -> Result<u64> {
        let mut total = 0;
        for partition in 0..partitions {
            let properties = self
                .broker
                .partition_properties(hub, &partition.to_string())
                .context("cannot read a partition's properties")?;
            total += figure(&properties);
        }
        Ok(total)
    }

    async fn stop(mut self) -> Result<()> {
        let (server, broker) = (self.server.take(), self.broker.clone());
        self.runtime
            .run(async move {
                if let Some(server) = server {
                    server.shutdown().await;
                }
                broker
                    .shutdown()
                    .await
                    .context("a hub did not shut down cleanly")
            })
            .await
    }
}

/// The producers: Rust clients, one connection each, on a runtime of their own.
struct Producers {
    runtime: OwnRuntime,
    clients: Vec<ProducerClient>,
    batch: Vec<EventData>,
    partitions: u32,
}

impl Producers {
    /// `setup.producers` clients of the event hub `hub`.
    async fn connect(setup: &Setup, connection_string: &str, hub: &str) -> Result<Producers> {
        let runtime = OwnRuntime::new("producers")?;
        let mut clients = Vec::with_capacity(setup.producers);
        for _ in 0..setup.producers {
            let (connection_string, hub) = (connection_string.to_owned(), hub.to_owned());
            let client = runtime
                .run(async move {
                    ProducerClient::connect_with_options(
                        &connection_string,
                        Some(&hub),
                        ClientOptions::default(),
                    )
                    .await
                    .context("a producer cannot connect to the source hub")
                })
                .await?;
            clients.push(client);
        }
        let body = Bytes::from(vec![0x5a; setup.event_bytes]);
        Ok(Producers {
            runtime,
            clients,
            batch: (0..setup.batch_events)
                .map(|_| EventData::new(body.clone()))
                .collect(),
            partitions: setup.partitions,
        })
    }

    fn events_per_batch(&self) -> u64 {
        self.batch.len() as u64
    }

    async fn close(&self) {
        for client in &self.clients {
            client.close().await;
        }
    }
}

/// Waits for every sending task; the first failure, if any.
async fn join_all(tasks: Vec<JoinHandle<Result<()>>>) -> Result<()> {
    let mut outcome = Ok(());
    for task in tasks {
        let result = task
            .await
            .context("a sending task panicked")
            .and_then(|r| r);
        if outcome.is_ok() {
            outcome = result;
        }
    }
    outcome
}

/// Senders at full speed: every producer keeps `send_window` batches in flight per partition
/// until `stop` is set or `acked` reaches `limit`.
fn flood(
    setup: &Setup,
    producers: &Producers,
    acked: &Arc<AtomicU64>,
    stop: &Arc<AtomicBool>,
    limit: u64,
) -> Result<Vec<JoinHandle<Result<()>>>> {
    let handle = producers.runtime.handle()?;
    let mut tasks = Vec::new();
    for client in &producers.clients {
        for partition in 0..setup.partitions {
            for _ in 0..setup.send_window {
                let (client, acked, stop) = (client.clone(), acked.clone(), stop.clone());
                let events = producers.batch.clone();
                let to = SendTarget::Partition(partition.to_string());
                tasks.push(handle.spawn(async move {
                    while !stop.load(Ordering::Relaxed) && acked.load(Ordering::Relaxed) < limit {
                        client
                            .send(&events, to.clone())
                            .await
                            .context("a producer's send failed")?;
                        acked.fetch_add(events.len() as u64, Ordering::Relaxed);
                    }
                    Ok(())
                }));
            }
        }
    }
    Ok(tasks)
}

/// Raw ingest of unstamped events into the event hub `event_hub` of `hub`, over AMQP: the
/// copy's baseline into the source, and the stamped events' baseline into the target.
async fn ingest(setup: &Setup, hub: &Hub, event_hub: &str) -> Result<IngestRun> {
    let producers = Producers::connect(setup, &hub.connection_string, event_hub).await?;
    let run = ingest_with(setup, &producers, hub).await;
    producers.close().await;
    let (run, syncs) = run?;
    let what = match hub.role {
        Role::Source => "replicate ingest (baseline)",
        Role::Target => {
            "replicate ingest into the target (unstamped events, the target ratio's baseline)"
        }
    };
    println!(
        "{what}: {} events/s into the {} hub over AMQP ({}, {} producers (one connection each) with {} concurrent sends per partition, {} s after {} s warm-up; {})",
        thousands(run.rate),
        hub.role.name(),
        setup.conditions(),
        setup.producers,
        setup.send_window,
        setup.seconds,
        INGEST_WARM_UP.as_secs(),
        per_append(run.events, run.appends),
    );
    println!("  {}", run.cpu.line(run.events));
    println!("  {} disk: {syncs}", hub.role.name());
    Ok(run)
}

/// The producers flood `hub` for `--seconds` after a warm-up; the run and the hub's syncs.
async fn ingest_with(
    setup: &Setup,
    producers: &Producers,
    hub: &Hub,
) -> Result<(IngestRun, SyncTimes)> {
    let (acked, stop) = (Arc::default(), Arc::default());
    let tasks = flood(setup, producers, &acked, &stop, u64::MAX)?;
    tokio::time::sleep(INGEST_WARM_UP).await;
    let (cpu, syncs) = (ThreadCpu::now(), hub.broker.sync_times());
    let (before, started) = (acked.load(Ordering::Relaxed), Instant::now());
    tokio::time::sleep(Duration::from_secs(setup.seconds)).await;
    let (after, elapsed) = (acked.load(Ordering::Relaxed), started.elapsed());
    stop.store(true, Ordering::Relaxed);
    let (cpu, syncs) = (cpu.since(), hub.broker.sync_times().since(&syncs));
    join_all(tasks).await?;
    let events = after - before;
    let run = IngestRun {
        rate: events as f64 / elapsed.as_secs_f64(),
        events,
        cpu,
        appends: syncs.waits.count,
    };
    Ok((run, syncs))
}

/// Fills the source's event hub `hub` with `copy_events` events (a little more: the sends in
/// flight when the count is reached), the same way.
async fn fill(setup: &Setup, producers: &Producers, source: &Hub, hub: &str) -> Result<()> {
    let (acked, stop) = (Arc::default(), Arc::default());
    let started = Instant::now();
    let tasks = flood(setup, producers, &acked, &stop, setup.copy_events)?;
    join_all(tasks).await?;
    let held = source.events(hub, setup.partitions)?;
    println!(
        "replicate fill: {held} events into the source hub in {:.2} s = {} events/s (the same producers; the copy's input)",
        started.elapsed().as_secs_f64(),
        thousands(held as f64 / started.elapsed().as_secs_f64())
    );
    Ok(())
}

/// Copies the `events` round `round` filled the source with to the target's (empty) hub for
/// `transport`, with a task reaching the hubs over `transport`; the copy's rate (from the
/// task's start to the last event acknowledged) and CPU.
async fn copy(
    setup: &Setup,
    (source, target): (&Hub, &Hub),
    (round, transport): (usize, TaskTransport),
    events: u64,
    baseline: f64,
) -> Result<CopyRun> {
    let (from, to) = (copy_hub(round), target_hub(round, transport));
    let hub = from.as_str();
    let name = format!("copy-{to}");
    let group = format!("copy-{}", transport.slug());
    source
        .broker
        .create_consumer_group(hub, &group)
        .await
        .context("cannot create the copy's consumer group")?;
    let config = setup.task(
        (&name, &group, "earliest"),
        (source, target),
        (hub, &to, transport),
    )?;
    let goal = target.events(&to, setup.partitions)? + events;
    let (cpu, syncs) = (ThreadCpu::now(), target.broker.sync_times());
    let started = Instant::now();
    let options = setup.start_options((source, target), transport).await;
    let replicator = Replicator::start(&config, options)
        .await
        .context("the copy task did not start")?;
    let first = wait_for((target, &to), setup.partitions, goal, started).await?;
    let took = started.elapsed();
    let (cpu, syncs) = (cpu.since(), target.broker.sync_times().since(&syncs));
    let snapshot = replicator.metrics().snapshot();
    replicator
        .shutdown()
        .await
        .map_err(|e| anyhow!("the copy task did not stop cleanly: {e}"))?;
    let run = CopyRun {
        transport,
        rate: events as f64 / took.as_secs_f64(),
        events,
        cpu,
        appends: syncs.waits.count,
    };
    let retries = snapshot.partitions.values().map(|p| p.retries).sum();
    println!(
        "replicate copy: {events} events source → target in {:.2} s = {} events/s, {:.1} % of the ingest baseline ({}; {}; the first event reached the target {:.0} ms after the start, {} events/s from then)",
        took.as_secs_f64(),
        thousands(run.rate),
        100.0 * run.rate / baseline,
        setup.conditions(),
        setup.task_note(transport),
        first.as_secs_f64() * 1e3,
        thousands(events as f64 / took.saturating_sub(first).as_secs_f64().max(1e-9)),
    );
    println!("  {}", run.cpu.line(events));
    println!("  {}", sends_note(&syncs, events, retries));
    println!("  target disk: {syncs}");
    println!(
        "  log bytes per event: source {:.0}, target {:.0} (the stamps the task adds)",
        source.log_bytes(hub, setup.partitions)? as f64 / events.max(1) as f64,
        target.log_bytes(&to, setup.partitions)? as f64 / events.max(1) as f64,
    );
    Ok(run)
}

/// `events` over the `appends` a log made: how many events each append carried.
fn per_append(events: u64, appends: u64) -> String {
    match appends {
        0 => "appends not counted: the log syncs none".to_owned(),
        _ => format!("{:.0} events per append", events as f64 / appends as f64),
    }
}

/// What the task's sends were, from the target log's appends (one per send in fsync mode).
fn sends_note(syncs: &SyncTimes, events: u64, retries: u64) -> String {
    let appends = syncs.waits.count;
    if appends == 0 {
        return format!(
            "task sends: not counted (the target's log syncs no appends); {retries} retries"
        );
    }
    format!(
        "task sends: {appends} appends in the target's log = {:.0} events per send; {retries} retries",
        events as f64 / appends as f64
    )
}

/// Waits until the event hub `name` of `hub` holds `goal` events; returns when the first new one
/// arrived, from `since`.
async fn wait_for(
    (hub, name): (&Hub, &str),
    partitions: u32,
    goal: u64,
    since: Instant,
) -> Result<Duration> {
    let at_start = hub.events(name, partitions)?;
    let (mut first, mut seen, mut progress) = (None, at_start, Instant::now());
    loop {
        let now = hub.events(name, partitions)?;
        if now > at_start && first.is_none() {
            first = Some(since.elapsed());
        }
        if now >= goal {
            return Ok(first.unwrap_or_default());
        }
        if now > seen {
            (seen, progress) = (now, Instant::now());
        } else if progress.elapsed() > STALL {
            bail!("the task stopped copying: the target holds {now} of {goal} events");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until the task has acknowledged `goal` events, making progress at least every
/// [`STALL`].
async fn caught_up(replicator: &Replicator, goal: u64) -> Result<()> {
    let (mut seen, mut progress) = (0, Instant::now());
    loop {
        let (_, out, _, _) = replicator.metrics().snapshot().totals();
        if out >= goal {
            return Ok(());
        }
        if out > seen {
            (seen, progress) = (out, Instant::now());
        } else if progress.elapsed() > STALL {
            bail!("the task stopped forwarding: {out} of {goal} events acknowledged");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The lag at `rate` events/s offered, with a fresh task from latest.
async fn lag(
    setup: &Setup,
    producers: &Producers,
    (source, target): (&Hub, &Hub),
    (hub, transport): (&str, TaskTransport),
    (rate, index): (u64, usize),
) -> Result<()> {
    let replicator = start_lag_task(setup, (source, target), (hub, transport), index).await?;
    let acked = Arc::new(AtomicU64::new(0));
    let pacers = pace(
        producers,
        rate,
        LAG_WARM_UP + Duration::from_secs(setup.lag_seconds),
        &acked,
    )?;
    tokio::time::sleep(LAG_WARM_UP).await;
    let lag_before = replicator.metrics().lag();
    let (cpu, syncs) = (ThreadCpu::now(), target.broker.sync_times());
    let source_syncs = source.broker.sync_times();
    let (offered_before, started) = (acked.load(Ordering::Relaxed), Instant::now());
    let mut by_second = Vec::new();
    tokio::select! {
        paced = join_all(pacers) => paced?,
        () = lag_by_second(&replicator, &mut by_second) => unreachable!("watches until stopped"),
    }
    let (offered, elapsed) = (
        acked.load(Ordering::Relaxed) - offered_before,
        started.elapsed(),
    );
    caught_up(&replicator, acked.load(Ordering::Relaxed)).await?;
    let lag = replicator.metrics().lag().since(&lag_before);
    let (cpu, syncs) = (cpu.since(), target.broker.sync_times().since(&syncs));
    let source_syncs = source.broker.sync_times().since(&source_syncs);
    replicator
        .shutdown()
        .await
        .map_err(|e| anyhow!("the lag run's task did not stop cleanly: {e}"))?;
    println!(
        "replicate lag at {} events/s offered ({} acknowledged by the source; {}, {} producers pacing, {}; {} s after {} s warm-up): {}",
        thousands(rate as f64),
        thousands(offered as f64 / elapsed.as_secs_f64()),
        setup.conditions(),
        setup.producers,
        setup.task_note(transport),
        setup.lag_seconds,
        LAG_WARM_UP.as_secs(),
        lag_line(&lag)
    );
    println!("  lag p99 second by second: {}", p99_series(&by_second));
    println!("  {}", cpu.line(lag.count));
    println!("  {}", sends_note(&syncs, lag.count, 0));
    println!("  source disk: {source_syncs}");
    println!("  target disk: {syncs}");
    Ok(())
}

/// Starts the `index`th lag run's task over `transport`: a fresh consumer group of the source's
/// `hub` from latest, into the target's hub of the last round's copy over `transport`; returns
/// once it reads every partition.
async fn start_lag_task(
    setup: &Setup,
    (source, target): (&Hub, &Hub),
    (hub, transport): (&str, TaskTransport),
    index: usize,
) -> Result<Replicator> {
    let group = format!("lag-{}-{index}", transport.slug());
    source
        .broker
        .create_consumer_group(hub, &group)
        .await
        .context("cannot create the lag run's consumer group")?;
    let to = target_hub(setup.rounds, transport);
    let config = setup.task(
        (&group, &group, "latest"),
        (source, target),
        (hub, &to, transport),
    )?;
    let options = setup.start_options((source, target), transport).await;
    let replicator = Replicator::start(&config, options)
        .await
        .context("the lag run's task did not start")?;
    receiving(&replicator, setup.partitions).await?;
    Ok(replicator)
}

/// Waits until the task owns every partition, and a moment for its receivers to open at the
/// end of the source (from latest: events sent before would not be read).
async fn receiving(replicator: &Replicator, partitions: u32) -> Result<()> {
    let started = Instant::now();
    while replicator.owned_partitions().len() < partitions as usize {
        if started.elapsed() > STALL {
            bail!("the lag run's task did not claim every partition within {STALL:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(())
}

/// Producers each send a batch every interval (spread over the partitions, each from its own
/// phase) for `run_for`, so that together they offer `rate` events/s; `acked` counts the events
/// the source acknowledged.
fn pace(
    producers: &Producers,
    rate: u64,
    run_for: Duration,
    acked: &Arc<AtomicU64>,
) -> Result<Vec<JoinHandle<Result<()>>>> {
    let count = producers.clients.len();
    let batches_per_second = rate as f64 / producers.events_per_batch() as f64 / count as f64;
    let interval = Duration::from_secs_f64(1.0 / batches_per_second.max(1e-3));
    let deadline = tokio::time::Instant::now() + run_for;
    let partitions = producers.partitions as usize;
    let mut pacers = Vec::with_capacity(count);
    for (p, client) in producers.clients.iter().enumerate() {
        let (client, acked, batch) = (client.clone(), acked.clone(), producers.batch.clone());
        let phase = interval.mul_f64(p as f64 / count as f64);
        pacers.push(producers.runtime.handle()?.spawn(async move {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + phase, interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let (mut next, mut in_flight) = (p, JoinSet::new());
            while tokio::time::Instant::now() < deadline {
                ticks.tick().await;
                let to = SendTarget::Partition((next % partitions).to_string());
                next += count;
                let (client, acked, batch) = (client.clone(), acked.clone(), batch.clone());
                in_flight.spawn(async move {
                    client
                        .send(&batch, to)
                        .await
                        .context("a paced send failed")?;
                    acked.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    anyhow::Ok(())
                });
                while let Some(sent) = in_flight.try_join_next() {
                    sent.context("a paced send panicked")??;
                }
            }
            while let Some(sent) = in_flight.join_next().await {
                sent.context("a paced send panicked")??;
            }
            Ok(())
        }));
    }
    Ok(pacers)
}

/// Pushes the lag of each whole second onto `seconds` until dropped (a last, partial second is
/// left out; the window's own figures cover it): one p99 over a run hides whether its tail is a
/// steady state or a backlog that one disturbance left and that takes seconds to drain.
async fn lag_by_second(replicator: &Replicator, seconds: &mut Vec<DurationCounts>) {
    let mut before = replicator.metrics().lag();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = replicator.metrics().lag();
        seconds.push(now.since(&before));
        before = now;
    }
}

/// Each second's lag p99 (its bucket's upper bound) as "20, 150, 30 ms": `-` for a second
/// with no event acknowledged, `>10000` beyond the last bucket.
fn p99_series(seconds: &[DurationCounts]) -> String {
    let figures: Vec<String> = seconds
        .iter()
        .map(|second| match second.quantile(0.99) {
            Some(bound) => bound.as_millis().to_string(),
            None if second.count == 0 => "-".to_owned(),
            None => ">10000".to_owned(),
        })
        .collect();
    format!("{} ms", figures.join(", "))
}

/// The lag quantiles and maximum (bucket upper bounds), and the mean.
fn lag_line(lag: &DurationCounts) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let bound = |q: f64| match lag.quantile(q) {
        Some(bound) => format!("≤ {:.1} ms", ms(bound)),
        None => "> 10 s".to_owned(),
    };
    let max = match lag.buckets().filter(|(_, n)| *n > 0).last() {
        Some((Some(bound), _)) => format!("≤ {:.1} ms", ms(bound)),
        Some((None, _)) => "> 10 s".to_owned(),
        None => "-".to_owned(),
    };
    format!(
        "lag p50 {}, p99 {}, p999 {}, max {}, mean {:.2} ms over {} events (source enqueued time → target acknowledgement; millisecond clocks)",
        bound(0.5),
        bound(0.99),
        bound(0.999),
        max,
        lag.mean().map_or(0.0, ms),
        lag.count
    )
}

/// CPU time of this process's threads by thread, read from `/proc/self/task`, and of the
/// whole machine, from `/proc/stat`.
struct ThreadCpu {
    at: Instant,
    ticks: BTreeMap<String, (String, u64)>,
    machine: u64,
}

/// CPU seconds per group of threads over a window, and what other processes used.
struct CpuUse {
    wall: Duration,
    groups: BTreeMap<&'static str, f64>,
    others: f64,
}

/// The machine's busy clock ticks (every CPU time but idle and iowait) from `/proc/stat`.
fn machine_busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return 0;
    };
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal …
    fields.iter().take(8).sum::<u64>()
        - fields.get(3).copied().unwrap_or(0)
        - fields.get(4).copied().unwrap_or(0)
}

impl ThreadCpu {
    fn now() -> ThreadCpu {
        let mut ticks = BTreeMap::new();
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for task in tasks.flatten() {
                let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
                    continue;
                };
                if let Some(parsed) = parse_stat(&stat) {
                    ticks.insert(task.file_name().to_string_lossy().into_owned(), parsed);
                }
            }
        }
        ThreadCpu {
            at: Instant::now(),
            ticks,
            machine: machine_busy_ticks(),
        }
    }

    fn since(&self) -> CpuUse {
        let now = ThreadCpu::now();
        let mut groups: BTreeMap<&'static str, f64> = BTreeMap::new();
        for (tid, (name, ticks)) in &now.ticks {
            let before = self.ticks.get(tid).map_or(0, |(_, t)| *t);
            // Clock ticks are 1/100 s on Linux.
            *groups.entry(group_of(name)).or_default() +=
                ticks.saturating_sub(before) as f64 / 100.0;
        }
        let ours: f64 = groups.values().sum();
        let machine = now.machine.saturating_sub(self.machine) as f64 / 100.0;
        CpuUse {
            wall: now.at.duration_since(self.at),
            groups,
            others: (machine - ours).max(0.0),
        }
    }
}

/// A thread's name and its user + system clock ticks, from its `stat` line.
fn parse_stat(stat: &str) -> Option<(String, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_owned();
    let fields: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line; 12 and 13 after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

/// The source hub's threads (its runtime).
const SOURCE_HUB: &str = "source hub";
/// The target hub's threads (its runtime).
const TARGET_HUB: &str = "target hub";
/// Both hubs' logs' `fdatasync` threads: in a run only one hub writes, so they are its.
const LOG_SYNCS: &str = "log sync threads (both hubs)";
/// The command's runtime, which runs the task alone.
const TASK: &str = "task";

/// The group a thread's CPU is counted in, by its name.
fn group_of(name: &str) -> &'static str {
    match name {
        "source-hub" => SOURCE_HUB,
        "target-hub" => TARGET_HUB,
        "producers" => "producers",
        n if n.starts_with("tributary-sync") || n.starts_with("tributary-comm") => LOG_SYNCS,
        // The command's runtime (`tokio-rt-worker`, `tokio-runtime-w`): the task alone.
        n if n.starts_with("tokio-r") => TASK,
        "tributary" => "main thread (the bench's driver)",
        _ => "other",
    }
}

impl CpuUse {
    /// The CPU seconds the thread groups `groups` used, in all.
    fn seconds(&self, groups: &[&str]) -> f64 {
        groups
            .iter()
            .filter_map(|group| self.groups.get(group))
            .sum()
    }

    fn line(&self, events: u64) -> String {
        let total: f64 = self.groups.values().sum();
        let wall = self.wall.as_secs_f64();
        let parts: Vec<String> = self
            .groups
            .iter()
            .filter(|(_, s)| **s > 0.0)
            .map(|(group, s)| {
                format!(
                    "{group} {s:.2} s ({:.2} µs/event)",
                    s * 1e6 / events.max(1) as f64
                )
            })
            .collect();
        let share = |s: f64| 100.0 * s / (wall * cores() as f64).max(1e-9);
        format!(
            "CPU {total:.2} s over {wall:.2} s wall on {} cores ({:.0} % of them; other processes {:.0} %), {:.2} µs per event: {}",
            cores(),
            share(total),
            share(self.others),
            total * 1e6 / events.max(1) as f64,
            parts.join(", ")
        )
    }
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_way_the_task_reaches_the_hubs_copies_into_a_hub_of_its_own() {
        let hubs = [TaskTransport::Amqp, TaskTransport::Local].map(|t| target_hub(2, t));
        assert_eq!(hubs, ["bench-2-amqp", "bench-2-local"]);
        let once = dedup(&[
            TaskTransport::Local,
            TaskTransport::Amqp,
            TaskTransport::Local,
        ]);
        assert_eq!(once, [TaskTransport::Local, TaskTransport::Amqp]);
    }

    #[test]
    fn the_median_is_the_middle_value_or_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(vec![7.5]), 7.5);
        assert!(median(Vec::new()).is_nan());
    }

    #[test]
    fn each_round_writes_and_copies_event_hubs_of_its_own() {
        let hubs: Vec<String> = (1..=3).map(copy_hub).collect();
        assert_eq!(hubs, ["bench", "bench-2", "bench-3"]);
        let ingest: Vec<String> = (1..=3).map(ingest_hub).collect();
        assert_eq!(ingest, ["ingest", "ingest-2", "ingest-3"]);
    }

    #[test]
    fn each_seconds_p99_is_its_bucket_bound_or_says_why_there_is_none() {
        let second = |lags_ms: &[u64]| {
            let histogram = tributary_log::DurationHistogram::default();
            histogram.record_all(lags_ms.iter().map(|&ms| Duration::from_millis(ms)));
            histogram.snapshot()
        };
        let seconds = [
            second(&[1, 2, 140]),
            second(&[]),
            second(&[3; 200]),
            second(&[20_000]),
        ];
        assert_eq!(p99_series(&seconds), "150, -, 3, >10000 ms");
    }
}
