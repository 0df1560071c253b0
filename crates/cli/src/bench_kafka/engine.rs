//! The Kafka scenario's figures for a Kafka cluster as the engine of Tributary's replication tasks
//! and processors, measured against each server of the run after its produce and consume runs:
//!
//! * **copy**: a replication task — `tributary replicate` with a `kind = "kafka"` source, in a
//!   process of its own so that its CPU time (`/proc/<pid>/stat`) is its alone — copies the first
//!   record size's topic (everything the produce run wrote) into the event hub `copied` of a
//!   second Tributary child process, partition to partition, over AMQP. Timed from the task's
//!   start until the hub holds every record; the rate beside what the plain librdkafka consumers
//!   read from the same topic in the same run, and the task's CPU time per copied record.
//!   The source server's and the target hub's CPU time over the copy are read too: the three
//!   together are what a copy at half the plain consumers' rate would need of the machine's
//!   cores (the arithmetic of issue 33's copy-rate target). `--task-batch-events` and
//!   `--task-prefetch` set the task's batch and prefetch.
//! * **failover**: two event processor hosts in this process over the topic `failover-…` (16
//!   partitions, kept supplied by a librdkafka producer with a record per partition every
//!   20 ms), reading through `tributary-kafka-source` with an in-memory checkpoint store and the
//!   default options; one is aborted (a crash) or shut down (graceful), and the time until each
//!   of its partitions delivers on the other, as `--scenario processor` measures it over the
//!   in-process hub.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use tokio::io::AsyncWriteExt;
use tributary_kafka_source::{KafkaOptions, KafkaSource};

use super::{Server, thousands, verdict};
use crate::args::BenchArgs;
use crate::bench::cpu_ticks;
use crate::bench_processor::{Bench, failover_cause};

/// The event hub the copy writes.
pub(super) const COPY_HUB: &str = "copied";
/// Partitions of the failover runs' topics: two hosts of eight each.
const FAILOVER_PARTITIONS: usize = 16;
/// A copy with no new record in the target for this long has failed.
const COPY_STALL: Duration = Duration::from_secs(30);
/// How often the target's record count is asked for while a copy runs.
const COPY_POLL: Duration = Duration::from_millis(20);
/// How often the failover runs' producer sends a record to every partition.
const TRICKLE_EVERY: Duration = Duration::from_millis(20);

/// The targets of issue 33.
const TASK_US_TARGET: f64 = 1.0;
const COPY_SHARE_TARGET: f64 = 0.5;
const CRASH_FAILOVER_TARGET: Duration = Duration::from_secs(10);
const GRACEFUL_HANDOVER_TARGET: Duration = Duration::from_secs(1);

/// What a copy measured.
#[derive(Clone, Copy)]
pub(super) struct CopyRun {
    records: u64,
    /// Records per second from the task's start until the target held them all.
    rate: f64,
    /// Records per second from the first record in the target until the last.
    rate_from_first: f64,
    /// The task process's CPU time per copied record, µs.
    task_us: f64,
    /// The source server's CPU time over the copy per copied record, µs.
    source_us: f64,
    /// The target hub's CPU time over the copy per copied record, µs.
    target_us: f64,
}

/// The failover runs' times.
#[derive(Clone, Copy)]
pub(super) struct Failovers {
    crash: Duration,
    graceful: Duration,
}

/// Copies `records` records of `topic` on `server` into a fresh Tributary's hub with a
/// replication task process; see the [module docs](self).
pub(super) async fn copy(
    args: &BenchArgs,
    root: &Path,
    server: &Server,
    topic: &str,
    records: u64,
) -> Result<CopyRun> {
    let dir = root.join(format!("copy-from-{}", server.name()));
    let mut target = Server::start_tributary(args, &dir.join("target"), &[COPY_HUB]).await?;
    let task = write_task(args, &dir, (server, &target), topic)?;
    let log = std::fs::File::create(dir.join("task.log"))?;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .arg("replicate")
        .arg(&task)
        .args(["--host-name", "bench-copy"])
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("cannot start the replication task's process")?;
    let pid = child.id().context("the task's pid")?.to_string();
    let (source_pid, target_pid) = (server.pid.to_string(), target.pid.to_string());
    let (source_before, target_before) = (cpu_ticks(&source_pid), cpu_ticks(&target_pid));
    let waited = wait_for_copy(&mut target, records, started).await;
    let took = started.elapsed();
    let task_s = cpu_ticks(&pid) as f64 / 100.0;
    let source_s = cpu_ticks(&source_pid).saturating_sub(source_before) as f64 / 100.0;
    let target_s = cpu_ticks(&target_pid).saturating_sub(target_before) as f64 / 100.0;
    child.start_kill()?;
    child.wait().await?;
    target.stop().await?;
    let first = waited.with_context(|| format!("see {}", dir.join("task.log").display()))?;
    let per_record = |cpu_s: f64| cpu_s * 1e6 / records.max(1) as f64;
    let run = CopyRun {
        records,
        rate: records as f64 / took.as_secs_f64(),
        rate_from_first: records as f64 / took.saturating_sub(first).as_secs_f64().max(1e-9),
        task_us: per_record(task_s),
        source_us: per_record(source_s),
        target_us: per_record(target_s),
    };
    let core_share = |cpu_s: f64| cpu_s * 100.0 / took.as_secs_f64();
    println!(
        "{} copy: a replication task (its own process) copied {} records of {topic} into a Tributary hub in {:.2} s = {} records/s (the first after {:.0} ms; {} records/s from then); the task's CPU {task_s:.2} s = {:.2} µs per record ({:.0} % of a core); meanwhile the source server {:.2} µs per record ({:.0} %), the target hub {:.2} µs ({:.0} %)",
        server.name(),
        thousands(records as f64),
        took.as_secs_f64(),
        thousands(run.rate),
        first.as_secs_f64() * 1e3,
        thousands(run.rate_from_first),
        run.task_us,
        core_share(task_s),
        run.source_us,
        core_share(source_s),
        run.target_us,
        core_share(target_s),
    );
    Ok(run)
}

/// The task file: `topic` of `server` to the hub [`COPY_HUB`] of `target`, partition to
/// partition, with the replication defaults but `--task-batch-events` and `--task-prefetch`.
fn write_task(
    args: &BenchArgs,
    dir: &Path,
    (server, target): (&Server, &Server),
    topic: &str,
) -> Result<PathBuf> {
    let mut source_keys = server
        .connection_string
        .as_ref()
        .map(|c| format!("connection_string = \"{c}\"\n"))
        .unwrap_or_default();
    if let Some(batch) = args.task_batch_events {
        source_keys.push_str(&format!("batch_events_max = {batch}\n"));
    }
    if let Some(prefetch) = args.task_prefetch {
        source_keys.push_str(&format!("prefetch = {prefetch}\n"));
    }
    let target_login = target
        .connection_string
        .as_ref()
        .context("the target's connection string")?;
    let task = dir.join("copy.toml");
    std::fs::write(
        &task,
        format!(
            "name = \"copy\"\n[source]\nkind = \"kafka\"\nbootstrap_servers = \"{}\"\n{source_keys}topic = \"{topic}\"\n[[target]]\nname = \"hub\"\nconnection_string = \"{target_login}\"\nevent_hub = \"{COPY_HUB}\"\nkeep_partition = true\n",
            server.bootstrap
        ),
    )
    .with_context(|| format!("cannot write {}", task.display()))?;
    Ok(task)
}

/// Waits until `target`'s hub holds `records` records; returns when the first arrived.
async fn wait_for_copy(target: &mut Server, records: u64, since: Instant) -> Result<Duration> {
    let (mut first, mut seen, mut progress) = (None, 0, Instant::now());
    loop {
        let now = target.events(COPY_HUB).await?;
        if now > 0 && first.is_none() {
            first = Some(since.elapsed());
        }
        if now >= records {
            return Ok(first.unwrap_or_default());
        }
        if now > seen {
            (seen, progress) = (now, Instant::now());
        } else if progress.elapsed() > COPY_STALL {
            anyhow::bail!("the task stopped copying: the hub holds {now} of {records} records");
        }
        tokio::time::sleep(COPY_POLL).await;
    }
}

/// Crash failover and graceful hand-over of processor hosts over a topic of `server`.
pub(super) async fn failovers(server: &Server) -> Result<Failovers> {
    let mut times = [Duration::ZERO; 2];
    for (time, crash) in times.iter_mut().zip([true, false]) {
        let topic = format!("failover-{}", if crash { "crash" } else { "graceful" });
        create_topic(server, &topic).await?;
        let mut options = match &server.connection_string {
            Some(login) => KafkaOptions::from_event_hubs_connection_string(login)?,
            None => KafkaOptions::new(server.bootstrap.to_string()),
        };
        options.bootstrap_servers = server.bootstrap.to_string();
        let source = KafkaSource::new(options, &topic)?;
        let stop = Arc::new(AtomicBool::new(false));
        let trickle = trickle(server, &topic, stop.clone())?;
        let took = Bench::over(Arc::new(source))
            .failover(FAILOVER_PARTITIONS, crash)
            .await;
        stop.store(true, Ordering::Relaxed);
        tokio::task::spawn_blocking(move || trickle.join())
            .await?
            .map_err(|_| anyhow::anyhow!("the failover run's producer panicked"))??;
        *time = took?;
        println!(
            "{} processor failover after {}: all {} of its partitions processing on the other instance after {:.0} ms (interval 500 ms, expiration 5 s)",
            server.name(),
            failover_cause(crash),
            FAILOVER_PARTITIONS / 2,
            time.as_secs_f64() * 1e3,
        );
    }
    Ok(Failovers {
        crash: times[0],
        graceful: times[1],
    })
}

async fn create_topic(server: &Server, topic: &str) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = server.client_config().create()?;
    let partitions = i32::try_from(FAILOVER_PARTITIONS)?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics([&new], &options).await? {
        result.map_err(|(topic, code)| anyhow::anyhow!("cannot create {topic}: {code}"))?;
    }
    Ok(())
}

/// A producer thread sending a record to every partition of `topic` every [`TRICKLE_EVERY`]
/// until `stop`.
fn trickle(
    server: &Server,
    topic: &str,
    stop: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<Result<()>>> {
    let producer: ThreadedProducer<DefaultProducerContext> = server
        .client_config()
        .set("linger.ms", "1")
        .create()
        .context("cannot make the failover run's producer")?;
    let topic = topic.to_owned();
    Ok(std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            for partition in 0..i32::try_from(FAILOVER_PARTITIONS)? {
                let record = BaseRecord::<(), [u8]>::to(&topic)
                    .partition(partition)
                    .payload(b"t");
                producer
                    .send(record)
                    .map_err(|(e, _)| anyhow::anyhow!("a failover run's send failed: {e}"))?;
            }
            std::thread::sleep(TRICKLE_EVERY);
        }
        producer.flush(Duration::from_secs(30))?;
        Ok(())
    }))
}

/// The targets of issue 33 for one server's figures; `consume_rate` is what the plain consumers
/// read from the copied topic in the same run.
pub(super) fn summarize(server: &str, copy: CopyRun, consume_rate: f64, failovers: Failovers) {
    let share = copy.rate / consume_rate;
    println!(
        "target: copy from {server}, task CPU per record {:.2} µs (<= {TASK_US_TARGET} µs: {}); copy rate {} / plain consumers' {} records/s = {:.0} % (>= {:.0} %: {}) over {} records",
        copy.task_us,
        verdict(copy.task_us <= TASK_US_TARGET),
        thousands(copy.rate),
        thousands(consume_rate),
        share * 100.0,
        COPY_SHARE_TARGET * 100.0,
        verdict(share >= COPY_SHARE_TARGET),
        thousands(copy.records as f64),
    );
    // What a copy at the target share would need of the machine: every copied record costs the
    // source server, the task and the target hub their CPU per record.
    let copy_us = copy.source_us + copy.task_us + copy.target_us;
    let wanted = consume_rate * COPY_SHARE_TARGET;
    println!(
        "  copy rate from the first record {} records/s = {:.0} % of the plain consumers'; a copy at {:.0} % ({} records/s) × ({:.2} source + {:.2} task + {:.2} target = {copy_us:.2} µs per record) needs {:.2} cores of this machine's {}",
        thousands(copy.rate_from_first),
        copy.rate_from_first / consume_rate * 100.0,
        COPY_SHARE_TARGET * 100.0,
        thousands(wanted),
        copy.source_us,
        copy.task_us,
        copy.target_us,
        wanted * copy_us / 1e6,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!(
        "target: processor over {server}, crash failover {:.2} s (<= {} s: {}), graceful hand-over {:.0} ms (<= {} ms: {})",
        failovers.crash.as_secs_f64(),
        CRASH_FAILOVER_TARGET.as_secs(),
        verdict(failovers.crash <= CRASH_FAILOVER_TARGET),
        failovers.graceful.as_secs_f64() * 1e3,
        GRACEFUL_HANDOVER_TARGET.as_millis(),
        verdict(failovers.graceful <= GRACEFUL_HANDOVER_TARGET),
    );
}

impl Server {
    /// The records Tributary's child holds in the event hub `hub`.
    async fn events(&mut self, hub: &str) -> Result<u64> {
        let (stdin, lines) = self.control.as_mut().context("not Tributary's child")?;
        stdin
            .write_all(format!("events {hub}\n").as_bytes())
            .await?;
        let answer = lines.next_line().await?.context("the child ended")?;
        answer
            .parse()
            .with_context(|| format!("the child answered {answer:?}"))
    }
}
