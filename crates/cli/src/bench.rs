//! `tributary bench`: measures the partition log in process.
//!
//! * `append`: appenders (threads) each keep up to `--in-flight` batches outstanding on their
//!   partition — as a producer with a send window does — and record, per batch, the time from
//!   the append call to its acknowledgement. Reports events/s, MB/s of event bodies and the
//!   p50/p99/p999 acknowledgement latency.
//! * `read`: reads back everything the append run wrote, one reader per partition in turn
//!   (page cache, warm).
//! * `recover`: writes a partition of `--recovery-gib` and times reopening it, with its index
//!   files and (worst case) without them.
//! * `memory`: appends `--memory-gib` of 1 KiB events and reports the process's resident set.
//! * `processor`, `replicate`, `silent-connections`, `scale`, `capture` and `kafka`: see
//!   `bench_processor.rs`, `bench_replicate.rs`, `bench_silent.rs`, `bench_scale.rs`,
//!   `bench_capture.rs` and `bench_kafka.rs` (built with the `kafka-bench` feature).
//!
//! Every result line states the durability, event size, batch size, partitions, appenders and
//! window, so numbers are never quoted without their conditions.

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use tributary_event::{EventData, SystemClock};
use tributary_log::{Durability, GroupCommitter, LogConfig, PartitionLog, ReadCursor, SyncScope};

use crate::args::{BenchArgs, GlobalArgs, Scenario};

/// Runs the chosen scenarios and prints one line per result.
pub async fn run(global: &GlobalArgs, args: &BenchArgs) -> Result<()> {
    let root = args.dir.clone().unwrap_or_else(|| {
        global
            .data_dir
            .join(format!("bench-{}", std::process::id()))
    });
    if args.scenario == Scenario::SilentConnections {
        let outcome = crate::bench_silent::run(args, &root).await;
        let _ = std::fs::remove_dir_all(&root);
        return outcome;
    }
    if args.scenario == Scenario::Scale {
        let outcome = crate::bench_scale::run(global, args, &root).await;
        let _ = std::fs::remove_dir_all(&root);
        return outcome;
    }
    if args.scenario == Scenario::Capture {
        let outcome = crate::bench_capture::run(args, &root).await;
        let _ = std::fs::remove_dir_all(&root);
        return outcome;
    }
    if args.scenario == Scenario::Kafka {
        #[cfg(feature = "kafka-bench")]
        return crate::bench_kafka::run(args, &root).await;
        #[cfg(not(feature = "kafka-bench"))]
        anyhow::bail!(
            "this tributary was built without the Kafka benchmark: build it with \
             `cargo build --release -p tributary-cli --features kafka-bench`"
        );
    }
    if !matches!(args.scenario, Scenario::Processor | Scenario::Replicate) {
        let args_root = (args.clone(), root.clone());
        tokio::task::spawn_blocking(move || {
            let (args, root) = args_root;
            let outcome = run_blocking(&args, &root);
            let _ = std::fs::remove_dir_all(&root);
            outcome
        })
        .await
        .context("the benchmark thread panicked")??;
    }
    if matches!(args.scenario, Scenario::Processor | Scenario::All) {
        let outcome = crate::bench_processor::run(&root).await;
        let _ = std::fs::remove_dir_all(&root);
        outcome?;
    }
    if matches!(args.scenario, Scenario::Replicate | Scenario::All) {
        // `all` warmed the memory before the log scenarios.
        if args.scenario == Scenario::Replicate && args.warm_memory_gib > 0 {
            warm_memory(args.warm_memory_gib);
        }
        let outcome = crate::bench_replicate::run(args, &root).await;
        let _ = std::fs::remove_dir_all(&root);
        outcome?;
    }
    Ok(())
}

fn run_blocking(args: &BenchArgs, root: &Path) -> Result<()> {
    anyhow::ensure!(
        args.partitions > 0 && args.appenders > 0,
        "partitions and appenders must be above 0"
    );
    anyhow::ensure!(
        args.in_flight > 0 && args.batch_events > 0,
        "in-flight and batch events must be above 0"
    );
    if args.warm_memory_gib > 0 {
        warm_memory(args.warm_memory_gib);
    }
    println!(
        "# cores: {}, in-process partition log",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    if let Some(note) = host_memory_note() {
        println!("{note}");
    }
    let all = args.scenario == Scenario::All;
    if all || args.scenario == Scenario::Append {
        for &mode in &args.modes {
            for &size in &args.event_bytes {
                let dir = root.join(format!("append-{mode}-{size}").replace(':', "-"));
                append_and_read(args, &dir, mode, size as usize)?;
                std::fs::remove_dir_all(&dir).ok();
            }
        }
    }
    if all || args.scenario == Scenario::Recover {
        recover(args, &root.join("recover"))?;
    }
    if all || args.scenario == Scenario::Memory {
        memory(args, &root.join("memory"))?;
    }
    Ok(())
}

/// Allocates and touches `gib` GiB, then frees it.
fn warm_memory(gib: u64) {
    let started = Instant::now();
    for _ in 0..gib {
        let block = vec![1u8; 1 << 30];
        std::hint::black_box(&block);
    }
    println!(
        "# warmed {gib} GiB of memory in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

fn open_logs(
    dir: &Path,
    partitions: usize,
    durability: Durability,
    scope: SyncScope,
) -> Result<(GroupCommitter, Vec<PartitionLog>)> {
    let committer = GroupCommitter::start_with(scope);
    let logs = (0..partitions)
        .map(|p| {
            let config = LogConfig {
                durability,
                ..LogConfig::default()
            };
            PartitionLog::open(
                &dir.join(p.to_string()),
                config,
                committer.clone(),
                Arc::new(SystemClock),
            )
            .with_context(|| format!("cannot open a partition under {}", dir.display()))
        })
        .collect::<Result<_>>()?;
    Ok((committer, logs))
}

fn batch_of(events: usize, size: usize) -> Vec<EventData> {
    let body = Bytes::from(vec![0x5a; size]);
    (0..events).map(|_| EventData::new(body.clone())).collect()
}

/// A counting semaphore for one appender's window of unacknowledged batches.
#[derive(Default)]
struct Window {
    in_flight: Mutex<usize>,
    changed: Condvar,
}

impl Window {
    fn acquire(&self, max: usize) {
        let mut n = self.in_flight.lock().expect("window");
        while *n >= max {
            n = self.changed.wait(n).expect("window");
        }
        *n += 1;
    }

    fn release(&self) {
        *self.in_flight.lock().expect("window") -= 1;
        self.changed.notify_all();
    }

    fn drain(&self) {
        let mut n = self.in_flight.lock().expect("window");
        while *n > 0 {
            n = self.changed.wait(n).expect("window");
        }
    }
}

struct AppendOutcome {
    events: u64,
    elapsed: Duration,
    latency_us: Histogram<u64>,
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

/// One appender: keeps up to `in_flight` batches unacknowledged until the deadline; returns
/// how many events it appended and its acknowledgement latencies (µs).
fn append_for(
    log: &PartitionLog,
    batch: &[EventData],
    in_flight: usize,
    deadline: Instant,
) -> Result<(u64, Histogram<u64>)> {
    let window = Arc::new(Window::default());
    let latencies = Arc::new(Mutex::new(new_histogram()));
    let failure: Arc<Mutex<Option<String>>> = Arc::default();
    let mut appended = 0u64;
    while Instant::now() < deadline {
        window.acquire(in_flight);
        let started = Instant::now();
        let (window_done, failed, latencies) = (window.clone(), failure.clone(), latencies.clone());
        log.append_with(
            batch,
            Box::new(move |outcome| {
                match outcome {
                    Ok(_) => {
                        let us = started.elapsed().as_micros() as u64;
                        latencies
                            .lock()
                            .expect("histogram")
                            .saturating_record(us.max(1));
                    }
                    Err(e) => *failed.lock().expect("failure") = Some(e.to_string()),
                }
                window_done.release();
            }),
        )?;
        appended += batch.len() as u64;
    }
    window.drain();
    if let Some(e) = failure.lock().expect("failure").take() {
        anyhow::bail!("an append failed: {e}");
    }
    let histogram = latencies.lock().expect("histogram").clone();
    Ok((appended, histogram))
}

fn run_appenders(logs: &[PartitionLog], args: &BenchArgs, size: usize) -> Result<AppendOutcome> {
    let batch = batch_of(args.batch_events, size);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.seconds);
    let results: Vec<Result<(u64, Histogram<u64>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..args.appenders)
            .map(|i| {
                let (log, batch) = (&logs[i % logs.len()], &batch);
                s.spawn(move || append_for(log, batch, args.in_flight, deadline))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("appender panicked"))
            .collect()
    });
    let elapsed = started.elapsed();
    let mut latency_us = new_histogram();
    let mut events = 0;
    for result in results {
        let (n, h) = result?;
        events += n;
        latency_us.add(h).expect("same bounds");
    }
    Ok(AppendOutcome {
        events,
        elapsed,
        latency_us,
    })
}

fn append_and_read(args: &BenchArgs, dir: &Path, mode: Durability, size: usize) -> Result<()> {
    let (committer, logs) = open_logs(dir, args.partitions, mode, args.sync_scope.sync_scope)?;
    let outcome = run_appenders(&logs, args, size)?;
    let secs = outcome.elapsed.as_secs_f64();
    let h = &outcome.latency_us;
    println!(
        "append  durability={mode:<12} event={size}B batch={} partitions={} appenders={} in-flight={}  {:>10.0} events/s  {:>7.1} MB/s  ack p50={:.3} ms p99={:.3} ms p999={:.3} ms",
        args.batch_events,
        args.partitions,
        args.appenders,
        args.in_flight,
        outcome.events as f64 / secs,
        outcome.events as f64 * size as f64 / secs / 1e6,
        h.value_at_quantile(0.50) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.value_at_quantile(0.999) as f64 / 1000.0,
    );
    println!("        disk: {}", committer.sync_times());
    read_back(&logs, size)
}

/// Reads every partition from the start, one at a time, and reports the rate.
fn read_back(logs: &[PartitionLog], size: usize) -> Result<()> {
    let started = Instant::now();
    let mut events = 0u64;
    for log in logs {
        let mut cursor = ReadCursor::new(0);
        loop {
            let batch = log.read(&mut cursor, 1000, 4 << 20)?;
            if batch.is_empty() {
                break;
            }
            events += batch.len() as u64;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "read    event={size}B one reader at a time, page cache                       {:>10.0} events/s  {:>7.1} MB/s",
        events as f64 / secs,
        events as f64 * size as f64 / secs / 1e6
    );
    Ok(())
}

fn fill(log: &PartitionLog, bytes: u64, size: usize) -> Result<u64> {
    let batch = batch_of(100, size);
    let mut written = 0;
    while written < bytes {
        log.append(&batch)?;
        written += (100 * size) as u64;
    }
    log.flush()?;
    Ok(written)
}

fn recover(args: &BenchArgs, dir: &Path) -> Result<()> {
    let committer = GroupCommitter::start();
    let config = LogConfig {
        durability: Durability::None,
        ..LogConfig::default()
    };
    let open = || PartitionLog::open(dir, config, committer.clone(), Arc::new(SystemClock));
    let written = fill(&open()?, args.recovery_gib << 30, 1024)?;
    let started = Instant::now();
    let log = open()?;
    let with_index = started.elapsed();
    let events = log.properties().last_enqueued_sequence_number + 1;
    drop(log);
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "index") {
            std::fs::remove_file(path)?;
        }
    }
    let started = Instant::now();
    drop(open()?);
    let without_index = started.elapsed();
    println!(
        "recover partition of {:.2} GiB ({events} events of 1 KiB, 128 MiB segments): {:.3} s with index files, {:.3} s rebuilding every index (page cache warm)",
        written as f64 / (1u64 << 30) as f64,
        with_index.as_secs_f64(),
        without_index.as_secs_f64()
    );
    Ok(())
}

fn memory(args: &BenchArgs, dir: &Path) -> Result<()> {
    let (_committer, logs) = open_logs(dir, 4, Durability::None, SyncScope::File)?;
    // Reset the peak (VmHWM) so it covers this scenario only, not the warm-up or earlier runs.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let before = resident_kib();
    let per_partition = (args.memory_gib << 30) / 4;
    std::thread::scope(|s| {
        let handles: Vec<_> = logs
            .iter()
            .map(|log| s.spawn(move || fill(log, per_partition, 1024)))
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("appender panicked").map(|_| ()))
    })?;
    let after = resident_kib();
    println!(
        "memory  appended {} GiB of 1 KiB events to 4 partitions: resident set {} MiB before, {} MiB after (peak {} MiB)",
        args.memory_gib,
        before.0 / 1024,
        after.0 / 1024,
        after.1 / 1024
    );
    Ok(())
}

/// A `# note:` line for a benchmark's header when this machine is a virtual machine whose
/// balloon device reports free memory to its host (virtio-balloon free page reporting): memory
/// freed for a few seconds (a deleted file's page cache, an allocator's purged pages) is then
/// given back and slow to touch again, so figures that write fresh page cache, ingest above
/// all, move with it (BENCHMARKS.md, "The machine"). `None` elsewhere.
pub(crate) fn host_memory_note() -> Option<&'static str> {
    free_page_reporting().then_some(
        "# note: this VM reports free memory to its host (virtio-balloon free page reporting): \
         page cache grown into memory freed seconds before is faulted in from the host, so \
         CPU per event of writes into fresh page cache (ingest) moves between runs",
    )
}

/// Whether a virtio balloon device here negotiated `VIRTIO_BALLOON_F_REPORTING` (its sysfs
/// `features` file holds one `0` or `1` per feature bit, bit 0 first).
fn free_page_reporting() -> bool {
    const VIRTIO_BALLOON_F_REPORTING: usize = 5;
    let Ok(devices) = std::fs::read_dir("/sys/bus/virtio/drivers/virtio_balloon") else {
        return false;
    };
    devices.flatten().any(|device| {
        std::fs::read(device.path().join("features"))
            .is_ok_and(|bits| bits.get(VIRTIO_BALLOON_F_REPORTING) == Some(&b'1'))
    })
}

/// (VmRSS, VmHWM) of this process in KiB.
pub(crate) fn resident_kib() -> (u64, u64) {
    resident_kib_of("self")
}

/// (VmRSS, VmHWM) in KiB of the process `pid` (a number, or `self`); zeros once it is gone.
pub(crate) fn resident_kib_of(pid: &str) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU clock ticks (user + system, 1/100 s) of a process so far.
pub(crate) fn cpu_ticks(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some(close) = stat.rfind(')') else {
        return 0;
    };
    let fields: Vec<u64> = stat[close + 1..]
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    fields.iter().sum()
}

/// The 1-minute load average: other work on the machine competes with the run.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// `value` rounded to a whole number with commas between thousands (1,234,567), as the
/// benchmarks print rates; shared by every `bench` scenario.
pub(crate) fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
