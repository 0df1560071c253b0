//! [`CaptureRunner`]: the captures of every captured hub, run inside `serve`.
//!
//! Every [`TICK`] (on the broker's background runner, [`Broker::spawn_every`]) it compares the
//! hubs' captures in the catalog with the partition captures it runs: it starts one
//! [`PartitionCapture`] per partition of a hub that is now captured, restarts those whose
//! settings changed, and stops those of hubs no longer captured (whose progress it then
//! removes, so capture turned on again starts afresh, as on Azure; a deleted hub's progress
//! goes with it). Each partition is stepped
//! on the blocking pool, one step at a time per partition, at every tick and, between ticks,
//! [`STEP_SPACING`] after new events arrive; a step reads what was committed and closes the
//! window when its time or size is up. Stepped this soon, a window closed by its size is
//! published tens of milliseconds after its last event, not up to a tick later.
//!
//! # Guarantees
//! - Exactly once across crashes, as [`PartitionCapture`] gives it; a new capture starts with
//!   the events enqueued since capture was turned on (`HubCapture::enabled_at_ms`).
//! - A notification hub gets each file's `Microsoft.EventHub.CaptureFileCreated` (Event Grid
//!   schema, JSON, `application/json`) before the progress moves past the file: at least once.
//! - A failing step (destination not writable, disk full, notification hub missing) is
//!   reported ([`Broker::report_capture`]: status, metrics, dashboard) and logged, and the
//!   partition is retried with a backoff doubling from 1 s to [`RETRY_DELAY_MAX`]; nothing is
//!   skipped, and retention keeps what is not captured.
//! - [`CaptureRunner::stop`] stops stepping and waits for the steps under way.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tributary_broker::{Broker, HubCapture, SendTarget};
use tributary_event::names::name_key;
use tributary_event::{EventData, EventPosition};

use crate::error::CaptureError;
use crate::limits::STEP_SPACING;
use crate::notification::CaptureFileCreated;
use crate::partition::{CaptureTarget, OnFile, PartitionCapture};
use crate::spec::check;

/// How often the runner looks at the catalog and steps the partitions.
pub const TICK: Duration = Duration::from_secs(1);
/// The longest wait before a failing partition is tried again.
pub const RETRY_DELAY_MAX: Duration = Duration::from_secs(60);
/// The longest [`CaptureRunner::stop`] waits for the steps under way.
const STOP_WAIT_MAX: Duration = Duration::from_secs(30);

/// The partition captures of one broker's captured hubs.
#[derive(Debug)]
pub struct CaptureRunner {
    state: Arc<RunnerState>,
    ticker: tokio::task::JoinHandle<()>,
}

#[derive(Debug)]
struct RunnerState {
    namespace: String,
    state_dir: PathBuf,
    /// The connection string of the storage account `blob:` destinations are in.
    storage: Option<StorageSecret>,
    stopping: AtomicBool,
    /// By (hub name key, partition index).
    workers: Mutex<HashMap<(String, u32), Arc<Worker>>>,
}

/// A storage account's connection string: it holds the account key, so it is never shown.
struct StorageSecret(String);

impl std::fmt::Debug for StorageSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StorageSecret(..)")
    }
}

/// One partition's capture and its schedule.
struct Worker {
    hub: String,
    partition: u32,
    settings: HubCapture,
    /// Built at the first step (opening the destination may fail, and is retried).
    capture: Mutex<Option<PartitionCapture>>,
    busy: AtomicBool,
    failures: AtomicU32,
    retry_at_ms: AtomicI64,
    /// The sequence number the capture reads next, as of its last step: events at or past it
    /// wake the worker.
    read_next: AtomicI64,
    /// Set when the worker leaves the runner (its hub's capture ended or changed).
    retired: AtomicBool,
    /// The progress last reported and the enqueued time of its first uncaptured event: the
    /// progress moves only when a window closes, so most steps reuse it rather than read it.
    oldest_uncaptured: Mutex<Option<(i64, Option<i64>)>>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("hub", &self.hub)
            .field("partition", &self.partition)
            .finish_non_exhaustive()
    }
}

impl CaptureRunner {
    /// Starts capturing `broker`'s captured hubs, as namespace `namespace` (`{Namespace}` in
    /// archive names), keeping each partition's progress below `state_dir`; `blob:`
    /// destinations are reached with `storage`, their account's connection string.
    pub fn start(
        broker: &Broker,
        namespace: &str,
        state_dir: &Path,
        storage: Option<String>,
    ) -> CaptureRunner {
        let state = Arc::new(RunnerState {
            namespace: namespace.to_owned(),
            state_dir: state_dir.to_path_buf(),
            storage: storage.map(StorageSecret),
            stopping: AtomicBool::new(false),
            workers: Mutex::new(HashMap::new()),
        });
        let state_dir = state.state_dir.clone();
        broker.on_hub_deleted(move |hub| {
            // A hub made later under this name starts its capture afresh.
            let _ = std::fs::remove_dir_all(state_dir.join(name_key(hub)));
        });
        let ticking = state.clone();
        let ticker = broker.spawn_every(TICK, move |broker| {
            let state = ticking.clone();
            async move { state.tick(&broker) }
        });
        CaptureRunner { state, ticker }
    }

    /// Stops stepping, and waits (up to 30 s) for the steps under way to end.
    pub async fn stop(self) {
        self.state.stopping.store(true, Ordering::Release);
        self.ticker.abort();
        let deadline = tokio::time::Instant::now() + STOP_WAIT_MAX;
        while self.state.any_busy() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl RunnerState {
    fn any_busy(&self) -> bool {
        let workers = self.workers.lock().expect("workers");
        workers.values().any(|w| w.busy.load(Ordering::Acquire))
    }

    /// Brings the workers in line with the catalog and steps those that are due.
    fn tick(self: &Arc<Self>, broker: &Broker) {
        if self.stopping.load(Ordering::Acquire) {
            return;
        }
        let hubs = broker.list_hubs();
        let mut wanted = HashMap::new();
        for hub in &hubs {
            match &hub.capture {
                Some(settings) => {
                    for p in 0..hub.partition_count {
                        wanted.insert((name_key(&hub.name), p), (hub.name.clone(), settings));
                    }
                }
                None => self.forget(broker, &hub.name),
            }
        }
        let now_ms = broker.clock().now_ms();
        let due = {
            let mut workers = self.workers.lock().expect("workers");
            workers.retain(|key, w| {
                let keep = wanted.get(key).is_some_and(|(_, s)| **s == w.settings);
                w.retired.store(!keep, Ordering::Release);
                keep
            });
            for (key, (hub, settings)) in wanted {
                workers.entry(key.clone()).or_insert_with(|| {
                    let worker = Arc::new(Worker::new(hub, key.1, settings.clone()));
                    tokio::spawn(worker.clone().follow(self.clone(), broker.clone()));
                    worker
                });
            }
            workers
                .values()
                .filter(|w| w.retry_at_ms.load(Ordering::Relaxed) <= now_ms)
                .filter(|w| !w.busy.swap(true, Ordering::AcqRel))
                .cloned()
                .collect::<Vec<_>>()
        };
        for worker in due {
            let state = self.clone();
            let broker = broker.clone();
            let runtime = tokio::runtime::Handle::current();
            tokio::task::spawn_blocking(move || {
                worker.step(&state, &broker, &runtime);
                worker.busy.store(false, Ordering::Release);
            });
        }
    }

    /// Drops what is left of `hub`'s capture once it is off: its status and, when no step of
    /// it runs, its progress (so capture turned on again starts from then).
    fn forget(&self, broker: &Broker, hub: &str) {
        let dir = self.state_dir.join(name_key(hub));
        let key = name_key(hub);
        let running = {
            let workers = self.workers.lock().expect("workers");
            workers
                .iter()
                .any(|((h, _), w)| *h == key && w.busy.load(Ordering::Acquire))
        };
        if running || !dir.exists() {
            return;
        }
        broker.forget_capture(hub);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => tracing::info!(hub, "capture turned off: its progress is removed"),
            Err(e) => {
                tracing::warn!(hub, error = %e, "cannot remove the progress of a capture turned off")
            }
        }
    }
}

impl Worker {
    fn new(hub: String, partition: u32, settings: HubCapture) -> Worker {
        Worker {
            hub,
            partition,
            settings,
            capture: Mutex::new(None),
            busy: AtomicBool::new(false),
            failures: AtomicU32::new(0),
            retry_at_ms: AtomicI64::new(0),
            read_next: AtomicI64::new(0),
            retired: AtomicBool::new(false),
            oldest_uncaptured: Mutex::new(None),
        }
    }

    /// The enqueued time of the first event not yet in a file, `captured_to`.
    fn oldest_uncaptured(&self, broker: &Broker, captured_to: Option<i64>) -> Option<i64> {
        let captured_to = captured_to?;
        let mut known = self.oldest_uncaptured.lock().expect("oldest uncaptured");
        match *known {
            // An event not yet there when last looked up may be there now.
            Some((sequence, Some(oldest))) if sequence == captured_to => Some(oldest),
            _ => {
                let oldest = enqueued_time(broker, &self.hub, self.partition, captured_to);
                *known = Some((captured_to, oldest));
                oldest
            }
        }
    }

    /// Steps the capture as events arrive, [`STEP_SPACING`] after they wake it; the ticks step
    /// it besides (a window's time closes it without events). Ends once the worker is retired
    /// or the runner stops.
    async fn follow(self: Arc<Self>, state: Arc<RunnerState>, broker: Broker) {
        let partition = self.partition.to_string();
        while !self.retired.load(Ordering::Acquire) && !state.stopping.load(Ordering::Acquire) {
            let next = self.read_next.load(Ordering::Acquire);
            let arrived = broker
                .wait_for_sequence(&self.hub, &partition, next, TICK)
                .await;
            match arrived {
                Ok(true) => tokio::time::sleep(STEP_SPACING).await,
                Ok(false) => continue,
                // The hub is going away; the tick retires the worker.
                Err(_) => {
                    tokio::time::sleep(TICK).await;
                    continue;
                }
            }
            let failing_for_ms = self.retry_at_ms.load(Ordering::Relaxed) - broker.clock().now_ms();
            if failing_for_ms > 0 {
                // The tick retries a failing capture when its backoff is over.
                let wait = Duration::from_millis(failing_for_ms.unsigned_abs()).min(TICK);
                tokio::time::sleep(wait).await;
                continue;
            }
            if state.stopping.load(Ordering::Acquire) || self.busy.swap(true, Ordering::AcqRel) {
                // Stepped by the tick right now.
                tokio::time::sleep(STEP_SPACING).await;
                continue;
            }
            let (worker, state, broker) = (self.clone(), state.clone(), broker.clone());
            let runtime = tokio::runtime::Handle::current();
            let stepped = tokio::task::spawn_blocking(move || {
                worker.step(&state, &broker, &runtime);
                worker.busy.store(false, Ordering::Release);
            });
            let _ = stepped.await;
        }
    }

    /// One step, reported; a failure schedules the retry.
    fn step(&self, state: &RunnerState, broker: &Broker, runtime: &tokio::runtime::Handle) {
        let mut slot = self.capture.lock().expect("capture");
        let outcome = match slot.as_mut() {
            Some(capture) => capture.step(),
            None => self.build(state, broker, runtime).and_then(|mut capture| {
                let created = capture.step();
                *slot = Some(capture);
                created
            }),
        };
        if let Some(capture) = slot.as_ref() {
            self.read_next.store(capture.read_next(), Ordering::Release);
        }
        let now_ms = broker.clock().now_ms();
        match outcome {
            Ok(created) => {
                self.failures.store(0, Ordering::Relaxed);
                let captured_to = slot
                    .as_ref()
                    .and_then(|c| c.progress())
                    .map(|p| p.next_sequence);
                let oldest = self.oldest_uncaptured(broker, captured_to);
                broker.report_capture(&self.hub, self.partition, |status| {
                    status.files_written += created.len() as u64;
                    status.bytes_written += created.iter().map(|c| c.size_in_bytes).sum::<u64>();
                    status.last_error = None;
                    status.last_success_ms = Some(now_ms);
                    status.captured_to = captured_to;
                    status.oldest_uncaptured_ms = oldest;
                });
            }
            Err(e) => self.failed(broker, &e, now_ms),
        }
    }

    fn failed(&self, broker: &Broker, error: &CaptureError, now_ms: i64) {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let delay =
            Duration::from_secs(1u64 << failures.min(6).saturating_sub(1)).min(RETRY_DELAY_MAX);
        let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
        self.retry_at_ms
            .store(now_ms.saturating_add(delay_ms), Ordering::Relaxed);
        tracing::warn!(hub = %self.hub, partition = self.partition, error = %error, retry_in_s = delay.as_secs(), "capture failed; it is retried, nothing is skipped");
        let message = error.to_string();
        broker.report_capture(&self.hub, self.partition, |status| {
            status.errors += 1;
            status.last_error = Some(message);
        });
    }

    /// The partition's capture: its destination opened, its notifications wired.
    fn build(
        &self,
        state: &RunnerState,
        broker: &Broker,
        runtime: &tokio::runtime::Handle,
    ) -> Result<PartitionCapture, CaptureError> {
        let spec = check(&self.hub, &self.settings)?;
        let storage = state.storage.as_ref().map(|s| s.0.as_str());
        let destination = spec.destination.open(storage)?;
        let target = CaptureTarget {
            namespace: state.namespace.clone(),
            hub: self.hub.clone(),
            partition: self.partition.to_string(),
        };
        let start = EventPosition::EnqueuedTime {
            enqueued_time_ms: self.settings.enabled_at_ms,
            inclusive: true,
        };
        let mut capture = PartitionCapture::new(
            broker.clone(),
            destination,
            broker.clock(),
            spec.config,
            target,
            &state.state_dir,
            start,
        )?;
        if let Some(notify) = spec.notify_hub {
            capture.on_file(notifier(
                broker,
                runtime,
                &state.namespace,
                &self.hub,
                notify,
            ));
        }
        Ok(capture)
    }
}

/// Appends each file's notification to hub `notify` as an Event Grid event.
fn notifier(
    broker: &Broker,
    runtime: &tokio::runtime::Handle,
    namespace: &str,
    hub: &str,
    notify: String,
) -> OnFile {
    let broker = broker.clone();
    let runtime = runtime.clone();
    let (namespace, hub) = (namespace.to_owned(), hub.to_owned());
    Box::new(move |created: &CaptureFileCreated| {
        let event = created.event_grid_event(&namespace, &hub, broker.clock().now_ms());
        let body = serde_json::to_vec(&event).expect("a notification serialises");
        let mut data = EventData::new(Bytes::from(body));
        data.content_type = Some("application/json".to_owned());
        runtime
            .block_on(broker.send(&notify, SendTarget::RoundRobin, vec![data]))
            .map(drop)
            .map_err(|e| CaptureError::Destination {
                destination: format!("notification hub {notify}"),
                reason: e.to_string(),
            })
    })
}

/// The enqueued time of event `sequence` of a partition, if it holds it.
fn enqueued_time(broker: &Broker, hub: &str, partition: u32, sequence: i64) -> Option<i64> {
    let events = broker
        .read(hub, &partition.to_string(), sequence, 1, 64 * 1024)
        .ok()?;
    events.first().map(|e| e.enqueued_time_ms)
}
