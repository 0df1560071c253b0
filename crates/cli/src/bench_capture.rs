//! `tributary bench --scenario capture`: what Event Hubs Capture costs beside ingest, and
//! whether it keeps up (the targets of issue 36).
//!
//! One process runs a hub of one partition (the first `--modes` durability) and a
//! [`PartitionCapture`] of it (Avro, no deflate, a `file:` destination in the bench directory
//! whose files are emptied between phases, interval 60 s, size window `--capture-size`, 10 MiB
//! by default so windows close by size) on a thread of its own named `capture`, as the runner steps it inside `serve`. Events
//! are 1 KiB, sent in batches of `--batch-events`, `--in-flight` batches outstanding. Five
//! phases, in one run:
//!
//! 1. **together**: sends as fast as the hub takes them for `--seconds` while the capture
//!    thread follows the partition as the runner does inside `serve`: a step once events past
//!    what it captured are there, [`STEP_SPACING`] apart, and one every [`TICK`]. The
//!    capture's CPU is the time of those steps (the capture thread's own clock) and of the
//!    window files' writer threads; the hub's is the process's CPU time less the capture's.
//!    Each per event (captured, ingested), their ratio is the first target, both measured in
//!    the same seconds. It runs first because on this machine a hub's writes grow slower as a
//!    run writes more. The capture then catches up (not measured).
//! 2. **served**: the same with the hub behind its AMQP door and the producers in a child
//!    process (`served`): the ratio against what a served hub spends per ingested event,
//!    its door included, as a deployment sees it. The capture then catches up again.
//! 3. **ingest**: sends as fast as the hub takes them for `--seconds`, capture idle. The
//!    process's CPU time over the phase, per event, is the hub's CPU per ingested event; the
//!    rate is the ingest maximum at that durability.
//! 4. **capture**: the capture thread steps once, catching up on everything phase 3 wrote,
//!    nothing else running. The process's CPU time over the phase (reading the log, building
//!    Avro records, writing and publishing files), per event in published files, is the
//!    capture's CPU per captured event when it fell behind and reads back from the file. It
//!    includes the events of the window left open (at most one window), so it errs high.
//! 5. **lag**: sends at half the phase-3 rate for `--lag-seconds`, the capture following as in
//!    phase 1. Each event's lag is the time its file was
//!    published (when `on_file` sees it) minus its enqueued time; its p99 is the second target
//!    (≤ interval + 5 s). When sending stops, the capture has [`LAG_SLACK`] (5 s) to publish
//!    everything but its open window; events published then count with their true lag. It
//!    **fell behind** if more than one size window's events are in no file after that: a
//!    capture that keeps up has at most the events since its last step and a step under way
//!    left when sending stops, which it publishes within about two ticks; one that
//!    captures a fraction `f` less than offered ends a run of `T` s with `f·T` s of events to
//!    catch up, more than 5 s of work once `f·T > 5·(1−f)` (30 s: `f` above 14 %; 10 s: above
//!    33 %), and its lag grows by `f` s every second. An event still in no file at the end (the
//!    open window's) counts with the time it has waited so far, a lower bound.
//!
//! Last, with the hub shut, the **floor** ([`floor`]): what copying a body from memory another
//! thread wrote costs this machine, the one part of a capture's work its code cannot remove,
//! beside phase 1's hub.
//!
//! CPU time is `CLOCK_PROCESS_CPUTIME_ID` for the process and `CLOCK_THREAD_CPUTIME_ID` for the
//! capture's threads (nanoseconds), so short runs still measure; CPU per event holds better
//! than rates on a busy machine.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use rustix::time::{ClockId, clock_gettime};
use tributary_broker::{Broker, BrokerConfig, HubSpec, SendReceipt};
use tributary_capture::limits::STEP_SPACING;
use tributary_capture::runner::TICK;
use tributary_capture::{
    CaptureConfig, CaptureFormat, CaptureTarget, Destination, DirectoryDestination,
    PartitionCapture,
};
use tributary_event::{EventData, EventPosition, SendTarget};

use crate::args::BenchArgs;
use crate::bench_silent::verdict;

mod floor;
mod served;

const HUB: &str = "captured";
const EVENT_BYTES: usize = 1024;
const INTERVAL: Duration = Duration::from_secs(60);
/// The targets of issue 36.
const CPU_RATIO_TARGET: f64 = 0.30;
const LAG_SLACK: Duration = Duration::from_secs(5);
/// At most how many events the open window holds (a window closes once its records, each
/// more than the body, reach the size window `size_window`): what may be in no file at the end.
fn open_window_events(size_window: u64) -> u64 {
    size_window / EVENT_BYTES as u64
}

/// The capture the bench runs: Avro, no deflate, empty windows skipped, size window
/// `size_window`.
fn capture_config(size_window: u64) -> CaptureConfig {
    CaptureConfig {
        interval: INTERVAL,
        size_bytes_max: size_window,
        skip_empty: true,
        format: CaptureFormat::Avro,
        ..CaptureConfig::default()
    }
}

/// Runs the scenario under `root` (a fresh directory).
pub async fn run(args: &BenchArgs, root: &Path) -> Result<()> {
    anyhow::ensure!(
        args.batch_events > 0 && args.in_flight > 0,
        "batch events and in-flight must be above 0"
    );
    if let Ok(conn) = std::env::var(served::PRODUCER_ENV) {
        return served::produce_child(args, &conn).await;
    }
    let capture_config = capture_config(args.capture_size);
    capture_config
        .validate()
        .context("--capture-size must be 10 MiB to 500 MiB, as Azure's size window")?;
    let durability = *args.modes.first().context("give a durability mode")?;
    let (ingest_for, lag_for) = if args.quick {
        (Duration::from_millis(1500), Duration::from_secs(2))
    } else {
        (
            Duration::from_secs(args.seconds),
            Duration::from_secs(args.lag_seconds),
        )
    };
    let mut config = BrokerConfig::new(root.join("hub"));
    config.log.durability = durability;
    let broker = Broker::open(config).await.context("cannot open the hub")?;
    broker
        .create_hub(HubSpec::new(HUB, 1))
        .await
        .context("cannot create the hub")?;
    let capture = CaptureThread::start(&broker, root, capture_config)?;
    print_conditions(args, durability);
    // First, while the machine's memory and the log are as fresh as they will be for the
    // phases after it: on this machine a hub's writes grow slower as a run writes more (see
    // BENCHMARKS.md), which would flatter a capture measured later against it.
    let live = together(&broker, args, &capture, ingest_for).await?;
    capture.catch_up().await?;
    capture.empty_published_files().await;
    served::served(&broker, args, &capture, ingest_for).await?;
    capture.catch_up().await?;
    capture.empty_published_files().await;
    let ingest = send_for(&broker, args, ingest_for, None).await?;
    let ingest_cpu = ingest.cpu_ns / ingest.events as f64;
    println!(
        "capture ingest  {} events in {:.1} s: {:.0} events/s (the ingest maximum), hub CPU {:.2} µs per ingested event (process CPU time, capture idle)",
        ingest.events,
        ingest.elapsed.as_secs_f64(),
        ingest.rate(),
        ingest_cpu / 1e3
    );
    let caught_up = capture.catch_up().await?;
    anyhow::ensure!(
        caught_up.events > 0,
        "the catch-up published no file: phase 3 (ingest) wrote less than one size window ({} MiB)",
        args.capture_size >> 20
    );
    let capture_cpu = caught_up.cpu_ns / caught_up.events as f64;
    let ratio = capture_cpu / ingest_cpu;
    println!(
        "capture cpu     {} events captured in {} files in {:.1} s, from the file (a capture that fell behind): capture CPU {:.2} µs per captured event = {:.1} % of the hub's per ingested event",
        caught_up.events,
        caught_up.files,
        caught_up.elapsed.as_secs_f64(),
        capture_cpu / 1e3,
        ratio * 100.0,
    );
    capture.empty_published_files().await;
    lag(&broker, args, &capture, ingest.rate() / 2.0, lag_for).await?;
    capture.empty_published_files().await;
    capture.stop().await;
    broker.shutdown().await?;
    print_copy_floor(&live, args.quick);
    Ok(())
}

/// The floor under the capture's CPU per event on this machine (see [`floor`]), against the
/// phase-1 hub's CPU per ingested event and the target's share of it.
fn print_copy_floor(live: &CpuRatio, quick: bool) {
    let floor = floor::measure(quick);
    let bar_ns = live.hub_ns * CPU_RATIO_TARGET;
    println!(
        "capture floor   a {EVENT_BYTES} B body copied into a write buffer from memory another thread wrote: {:.2} µs of CPU ({:.2} µs from this thread's own writes) = {:.1} % of the phase-1 hub's per ingested event; the target leaves {:.2} µs a captured event, {:.2} µs of it beyond that copy, for reading, encoding and writing",
        floor.other_thread_ns / 1e3,
        floor.own_ns / 1e3,
        floor.other_thread_ns / live.hub_ns * 100.0,
        bar_ns / 1e3,
        (bar_ns - floor.other_thread_ns) / 1e3,
    );
}

/// The run's conditions, before its first figure.
fn print_conditions(args: &BenchArgs, durability: tributary_log::Durability) {
    println!(
        "# capture: in process, 1 partition, durability {durability}, events {EVENT_BYTES} B in batches of {}, {} in flight; Avro (no deflate) to file:, interval {} s, size {} MiB{}",
        args.batch_events,
        args.in_flight,
        INTERVAL.as_secs(),
        args.capture_size >> 20,
        if args.quick {
            " (quick: figures mean nothing)"
        } else {
            ""
        }
    );
    if let Some(note) = crate::bench::host_memory_note() {
        println!("{note}");
    }
}

/// Phase 1: sends as fast as the hub takes them for `duration` with the capture following;
/// reports the capture's CPU per captured event against the hub's per ingested event, both in
/// this phase, and returns both.
async fn together(
    broker: &Broker,
    args: &BenchArgs,
    capture: &CaptureThread,
    duration: Duration,
) -> Result<CpuRatio> {
    let cpu_before = process_cpu_ns();
    let before = capture.following_cost();
    capture.set_stepping(true).await?;
    let sent = send_for(broker, args, duration, None).await?;
    capture.set_stepping(false).await?;
    let cost = capture.following_cost().since(&before);
    let ratio = CpuRatio::of(&cost, process_cpu_ns() - cpu_before, sent.events)?;
    println!(
        "capture live    {} events sent in {:.1} s ({:.0} events/s) with the capture following, {} of them captured: {}",
        sent.events,
        sent.elapsed.as_secs_f64(),
        sent.rate(),
        cost.events,
        ratio.describe("the process's less the capture's"),
    );
    Ok(ratio)
}

/// The capture's CPU per captured event against the hub's per ingested event over one phase,
/// in nanoseconds: the process's CPU time less the capture's is the hub's.
struct CpuRatio {
    capture_ns: f64,
    hub_ns: f64,
}

impl CpuRatio {
    /// From what following cost, the process's CPU time and the events ingested in the phase.
    fn of(cost: &FollowCostNow, process_cpu_ns: i128, ingested: u64) -> Result<CpuRatio> {
        anyhow::ensure!(cost.events > 0, "the capture read nothing while following");
        anyhow::ensure!(ingested > 0, "nothing was ingested");
        Ok(CpuRatio {
            capture_ns: cost.cpu_ns as f64 / cost.events as f64,
            hub_ns: (process_cpu_ns as f64 - cost.cpu_ns as f64) / ingested as f64,
        })
    }

    /// Both figures, their ratio and its verdict against the target; `hub` says whose CPU the
    /// hub's is.
    fn describe(&self, hub: &str) -> String {
        let ratio = self.capture_ns / self.hub_ns;
        format!(
            "hub CPU {:.2} µs per ingested event ({hub}), capture CPU {:.2} µs per captured event (its thread and its files' writer threads) = {:.1} % of the hub's (target <= {:.0} %: {})",
            self.hub_ns / 1e3,
            self.capture_ns / 1e3,
            ratio * 100.0,
            CPU_RATIO_TARGET * 100.0,
            verdict(ratio <= CPU_RATIO_TARGET)
        )
    }
}

/// Phase 5: ingest at `rate` for `duration` with the capture following; reports the lag.
async fn lag(
    broker: &Broker,
    args: &BenchArgs,
    capture: &CaptureThread,
    rate: f64,
    duration: Duration,
) -> Result<()> {
    capture.published.lock().expect("published").clear();
    capture.set_stepping(true).await?;
    let sent = send_for(broker, args, duration, Some(rate)).await?;
    let last_sent = sent.batches.iter().map(|b| b.first + b.count - 1).max();
    capture
        .wait_for_published(
            last_sent.unwrap_or(0) - open_window_events(args.capture_size) as i64,
            LAG_SLACK,
        )
        .await;
    capture.set_stepping(false).await?;
    let files = capture.published.lock().expect("published").clone();
    let end_ms = broker.clock().now_ms();
    let (lag_ms, uncaptured) = event_lags(&sent.batches, &files, end_ms)?;
    anyhow::ensure!(
        !lag_ms.is_empty(),
        "no file was published during the lag run ({} events sent)",
        sent.events
    );
    let p99_s = lag_ms.value_at_quantile(0.99) as f64 / 1e3;
    let target = INTERVAL + LAG_SLACK;
    // More than the open window's events in no file 5 s after sending stopped: the capture
    // fell behind (see the module docs).
    let kept_up = uncaptured <= open_window_events(args.capture_size);
    println!(
        "capture lag     offered {rate:.0} events/s (half the ingest maximum), sent {:.0} events/s for {:.1} s: {} files; lag (enqueued -> its file published) p50 {:.2} s p99 {p99_s:.2} s max {:.2} s over {} events, {uncaptured} of them in no file {} s after sending stopped, counted with their wait so far{} (target p99 <= {} s and keeping up: {})",
        sent.rate(),
        sent.elapsed.as_secs_f64(),
        files.len(),
        lag_ms.value_at_quantile(0.50) as f64 / 1e3,
        lag_ms.max() as f64 / 1e3,
        lag_ms.len(),
        LAG_SLACK.as_secs(),
        if kept_up { "" } else { "; capture FELL BEHIND" },
        target.as_secs(),
        verdict(kept_up && p99_s <= target.as_secs_f64())
    );
    Ok(())
}

/// Each sent event's lag in ms (for an event in none of `files`, its wait until `end_ms`); and
/// how many sent events are in none.
fn event_lags(
    batches: &[SentBatch],
    files: &[PublishedFile],
    end_ms: i64,
) -> Result<(Histogram<u64>, u64)> {
    let mut files = files.to_vec();
    files.sort_by_key(|f| f.first);
    let mut lag_ms = Histogram::<u64>::new(3).context("a histogram")?;
    let mut uncaptured = 0;
    for batch in batches {
        for sequence in batch.first..batch.first + batch.count {
            let after = files.partition_point(|f| f.first <= sequence);
            let file = after
                .checked_sub(1)
                .map(|i| &files[i])
                .filter(|f| sequence <= f.last);
            let until_ms = file.map_or(end_ms, |f| f.published_ms);
            uncaptured += u64::from(file.is_none());
            let ms = until_ms.saturating_sub(batch.enqueued_ms).max(1);
            lag_ms.record(ms as u64).context("recording a lag")?;
        }
    }
    Ok((lag_ms, uncaptured))
}

/// What one batch got: its first sequence number, size and enqueued time.
struct SentBatch {
    first: i64,
    count: i64,
    enqueued_ms: i64,
}

struct Sent {
    events: u64,
    elapsed: Duration,
    cpu_ns: f64,
    batches: Vec<SentBatch>,
}

impl Sent {
    fn rate(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64()
    }
}

/// Sends batches of 1 KiB events for `duration`, `--in-flight` at once, as fast as the hub
/// takes them or at `rate` events/s.
async fn send_for(
    broker: &Broker,
    args: &BenchArgs,
    duration: Duration,
    rate: Option<f64>,
) -> Result<Sent> {
    let body = Bytes::from(vec![0x5a; EVENT_BYTES]);
    let batch: Vec<EventData> = (0..args.batch_events)
        .map(|_| EventData::new(body.clone()))
        .collect();
    let window = Arc::new(tokio::sync::Semaphore::new(args.in_flight));
    let mut sends = tokio::task::JoinSet::new();
    let cpu_before = process_cpu_ns();
    let started = Instant::now();
    let mut batches_sent = 0u64;
    while started.elapsed() < duration {
        if let Some(rate) = rate {
            let due = Duration::from_secs_f64(batches_sent as f64 * batch.len() as f64 / rate);
            tokio::time::sleep_until((started + due).into()).await;
        }
        let permit = window.clone().acquire_owned().await?;
        let (broker, batch) = (broker.clone(), batch.clone());
        sends.spawn(async move {
            let receipt = broker.send(HUB, SendTarget::RoundRobin, batch).await;
            drop(permit);
            receipt
        });
        batches_sent += 1;
    }
    let mut batches = Vec::with_capacity(sends.len());
    while let Some(sent) = sends.join_next().await {
        let receipt: SendReceipt = sent.context("a send task failed")??;
        batches.push(SentBatch {
            first: receipt.base_sequence,
            count: receipt.offsets.len() as i64,
            enqueued_ms: receipt.enqueued_time_ms,
        });
    }
    Ok(Sent {
        events: batches_sent * args.batch_events as u64,
        elapsed: started.elapsed(),
        cpu_ns: (process_cpu_ns() - cpu_before) as f64,
        batches,
    })
}

/// The CPU time this process has used, in nanoseconds.
fn process_cpu_ns() -> i128 {
    let t = clock_gettime(ClockId::ProcessCPUTime);
    i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
}

/// The CPU time the calling thread has used, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// A published file: the sequence numbers it holds and when it was published (ms).
#[derive(Clone)]
struct PublishedFile {
    first: i64,
    last: i64,
    published_ms: i64,
}

/// What a catch-up step did.
struct CaughtUp {
    events: u64,
    files: usize,
    elapsed: Duration,
    cpu_ns: f64,
}

/// What the capture thread's steps while following cost so far: its own CPU time, and the
/// events they read.
#[derive(Default)]
struct FollowCost {
    cpu_ns: AtomicU64,
    events: AtomicU64,
}

/// A reading of what following cost: the stepping thread's CPU time and that of the window
/// files' writer threads, and the events the steps read.
struct FollowCostNow {
    cpu_ns: u64,
    events: u64,
}

impl FollowCostNow {
    fn since(&self, before: &FollowCostNow) -> FollowCostNow {
        FollowCostNow {
            cpu_ns: self.cpu_ns - before.cpu_ns,
            events: self.events - before.events,
        }
    }
}

/// The partition's capture on its own thread, named `capture`.
struct CaptureThread {
    commands: std::sync::mpsc::Sender<Command>,
    published: Arc<Mutex<Vec<PublishedFile>>>,
    /// The files published and not yet emptied.
    published_files: Arc<Mutex<Vec<PathBuf>>>,
    following: Arc<FollowCost>,
    thread: std::thread::JoinHandle<()>,
}

enum Command {
    /// Step once now, and answer with what it did.
    CatchUp(tokio::sync::oneshot::Sender<Result<CaughtUp>>),
    /// Follow the partition (true) or not (false); answered once taken.
    Stepping(bool, tokio::sync::oneshot::Sender<()>),
}

impl CaptureThread {
    fn start(broker: &Broker, root: &Path, config: CaptureConfig) -> Result<CaptureThread> {
        let destination: Arc<dyn Destination> =
            Arc::new(DirectoryDestination::new(root.join("capture"))?);
        let target = CaptureTarget {
            namespace: "bench".into(),
            hub: HUB.into(),
            partition: "0".into(),
        };
        let mut capture = PartitionCapture::new(
            broker.clone(),
            destination,
            broker.clock(),
            config,
            target,
            &root.join("capture-state"),
            EventPosition::Earliest,
        )?;
        let published = Arc::new(Mutex::new(Vec::new()));
        let (seen, clock) = (published.clone(), broker.clock());
        let published_files = Arc::new(Mutex::new(Vec::new()));
        let emptied_later = published_files.clone();
        capture.on_file(Box::new(move |file| {
            seen.lock().expect("published").push(PublishedFile {
                first: file.first_sequence_number,
                last: file.last_sequence_number,
                published_ms: clock.now_ms(),
            });
            // Nothing reads the files back; they are emptied between phases (see
            // `empty_published_files`), not here, where the capture's CPU is counted: a
            // capture never removes its files, and on a file system mounted with `discard`
            // freeing their blocks waits for the device.
            if let Some(path) = file.file_url.strip_prefix("file://") {
                emptied_later
                    .lock()
                    .expect("published files")
                    .push(PathBuf::from(path));
            }
            Ok(())
        }));
        let (commands, received) = std::sync::mpsc::channel();
        let broker = broker.clone();
        let following = Arc::new(FollowCost::default());
        let cost = following.clone();
        let thread = std::thread::Builder::new()
            .name("capture".into())
            .spawn(move || serve_commands(capture, &broker, &received, &cost))
            .context("cannot start the capture thread")?;
        Ok(CaptureThread {
            commands,
            published,
            published_files,
            following,
            thread,
        })
    }

    /// Empties the files published so far (between phases, outside what is measured), so a
    /// long run does not fill the disk. They are cut to nothing rather than removed: where
    /// ext4 has no journal (this project's machine), creating a file steps over every inode
    /// freed in the last seconds, which would charge the capture's next files for the
    /// bench's removals. The run's directory goes at its end.
    async fn empty_published_files(&self) {
        let paths = std::mem::take(&mut *self.published_files.lock().expect("published files"));
        let _ = tokio::task::spawn_blocking(move || {
            for path in paths {
                let _ = std::fs::OpenOptions::new()
                    .write(true)
                    .open(path)
                    .and_then(|file| file.set_len(0));
            }
        })
        .await;
    }

    async fn catch_up(&self) -> Result<CaughtUp> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.commands
            .send(Command::CatchUp(answer))
            .context("the capture thread ended")?;
        answered.await.context("the capture thread ended")?
    }

    /// Waits until a published file holds `sequence`, or `limit` has passed.
    async fn wait_for_published(&self, sequence: i64, limit: Duration) {
        let started = Instant::now();
        while started.elapsed() < limit {
            let published = {
                let files = self.published.lock().expect("published");
                files.iter().any(|f| f.last >= sequence)
            };
            if published {
                return;
            }
            tokio::time::sleep(TICK / 20).await;
        }
    }

    /// What the steps taken while following have cost so far, with the writer threads' CPU.
    fn following_cost(&self) -> FollowCostNow {
        let writers =
            u64::try_from(tributary_capture::writer_threads_cpu().as_nanos()).unwrap_or(u64::MAX);
        FollowCostNow {
            cpu_ns: self
                .following
                .cpu_ns
                .load(Ordering::Relaxed)
                .saturating_add(writers),
            events: self.following.events.load(Ordering::Relaxed),
        }
    }

    /// Starts or stops following; returns once the thread has taken the order (after the step
    /// under way, if any).
    async fn set_stepping(&self, on: bool) -> Result<()> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.commands
            .send(Command::Stepping(on, answer))
            .context("the capture thread ended")?;
        answered.await.context("the capture thread ended")
    }

    async fn stop(self) {
        drop(self.commands);
        let _ = tokio::task::spawn_blocking(move || self.thread.join()).await;
    }
}

/// The capture thread: steps on command, or while told to as the runner does in `serve`: once
/// events past what it captured are there ([`STEP_SPACING`] apart), and at every tick; ends
/// with its channel.
fn serve_commands(
    mut capture: PartitionCapture,
    broker: &Broker,
    commands: &std::sync::mpsc::Receiver<Command>,
    following: &FollowCost,
) {
    let mut stepping = false;
    let mut stepped = Instant::now();
    loop {
        let command = if stepping {
            match commands.recv_timeout(STEP_SPACING) {
                Ok(command) => Some(command),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    let head = broker
                        .partition_properties(HUB, "0")
                        .map_or(-1, |p| p.last_enqueued_sequence_number);
                    if head < capture.read_next() && stepped.elapsed() < TICK {
                        continue;
                    }
                    stepped = Instant::now();
                    None
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
            }
        } else {
            match commands.recv() {
                Ok(command) => Some(command),
                Err(_) => return,
            }
        };
        match command {
            None => {
                let (cpu_before, read_before) = (thread_cpu_ns(), capture.read_next());
                if let Err(e) = capture.step() {
                    tracing::warn!(error = %e, "a capture step failed in the bench");
                }
                following
                    .cpu_ns
                    .fetch_add(thread_cpu_ns() - cpu_before, Ordering::Relaxed);
                let read = capture.read_next().saturating_sub(read_before);
                following
                    .events
                    .fetch_add(u64::try_from(read).unwrap_or(0), Ordering::Relaxed);
            }
            Some(Command::Stepping(on, answer)) => {
                stepping = on;
                let _ = answer.send(());
            }
            Some(Command::CatchUp(answer)) => {
                let cpu_before = process_cpu_ns();
                let started = Instant::now();
                let outcome = capture.step().map(|files| CaughtUp {
                    events: files.iter().map(|f| f.event_count).sum(),
                    files: files.len(),
                    elapsed: started.elapsed(),
                    cpu_ns: (process_cpu_ns() - cpu_before) as f64,
                });
                let _ = answer.send(outcome.map_err(anyhow::Error::from));
            }
        }
    }
}
