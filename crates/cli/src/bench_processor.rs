//! `tributary bench --scenario processor`: the event processor host over the in-process hub,
//! on real time with the default options.
//!
//! * start-up: one host on a 32-partition hub with events waiting; time until every partition
//!   has delivered a batch;
//! * failover: two hosts share 16 partitions; one is aborted (a crash: no relinquish, no more
//!   renewals) or shut down gracefully; time until each of its partitions delivers again on the
//!   survivor;
//! * steady state: three hosts on 16 partitions; ownership changes over 100 balancing intervals;
//! * throughput: one host counting 100-byte events across 16 partitions.
//!
//! The failover run works over any source ([`Bench::over`]): `--scenario kafka` runs it over a
//! Kafka topic too.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use tributary_broker::{Broker, BrokerConfig, BrokerSource, Durability, HubSpec, SendTarget};
use tributary_event::{EventData, ReceivedEvent};
use tributary_processor::{
    CheckpointStore, EventProcessor, EventProcessorHost, InMemoryCheckpointStore, PartitionContext,
    PartitionSource, ProcessorOptions, RunningHost,
};

/// When each (host, partition) last delivered a batch, and how many events were counted.
#[derive(Default)]
struct Observed {
    last_delivery: Mutex<BTreeMap<(String, String), Instant>>,
    events: AtomicU64,
}

struct Counter {
    observed: Arc<Observed>,
    host: String,
    checkpoint_every: u32,
    batches: u32,
}

#[async_trait::async_trait]
impl EventProcessor for Counter {
    async fn process_events(&mut self, context: &PartitionContext, events: Vec<ReceivedEvent>) {
        self.observed
            .events
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        let key = (self.host.clone(), context.partition_id().to_owned());
        self.observed
            .last_delivery
            .lock()
            .expect("observed")
            .insert(key, Instant::now());
        self.batches += 1;
        if self.batches.is_multiple_of(self.checkpoint_every) {
            let _ = context.checkpoint().await;
        }
    }
}

/// Processor hosts over one source, sharing a checkpoint store and the observations.
pub(crate) struct Bench {
    source: Arc<dyn PartitionSource>,
    store: Arc<dyn CheckpointStore>,
    observed: Arc<Observed>,
}

impl Bench {
    /// Hosts reading `source`, with an in-memory checkpoint store.
    pub(crate) fn over(source: Arc<dyn PartitionSource>) -> Bench {
        Bench {
            source,
            store: Arc::new(InMemoryCheckpointStore::new()),
            observed: Arc::default(),
        }
    }

    fn host(&self, name: &str, batch: u32, checkpoint_every: u32) -> Result<RunningHost> {
        let (observed, host) = (self.observed.clone(), name.to_owned());
        let factory = move |_: &PartitionContext| Counter {
            observed: observed.clone(),
            host: host.clone(),
            checkpoint_every,
            batches: 0,
        };
        let options = ProcessorOptions {
            host_name: name.to_owned(),
            batch_events_max: batch,
            prefetch_count: batch.max(300),
            receive_timeout: Duration::from_secs(1),
            ..ProcessorOptions::default()
        };
        Ok(
            EventProcessorHost::builder(self.source.clone(), self.store.clone(), factory)
                .options(options)
                .build()?
                .start()?,
        )
    }

    /// Waits until every listed partition has delivered on `host` after `since`.
    async fn delivered_since(&self, host: &str, partitions: &[String], since: Instant) -> Duration {
        loop {
            let done = {
                let last = self.observed.last_delivery.lock().expect("observed");
                partitions.iter().all(|p| {
                    last.get(&(host.to_owned(), p.clone()))
                        .is_some_and(|t| *t > since)
                })
            };
            if done {
                return since.elapsed();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// A hub of the in-process broker, and its processor hosts.
struct LocalHub {
    broker: Broker,
    bench: Bench,
}

impl LocalHub {
    async fn new(dir: &std::path::Path, hub: &str, partitions: u32) -> Result<LocalHub> {
        let mut config = BrokerConfig::new(dir);
        config.log.durability = Durability::None;
        let broker = Broker::open(config).await?;
        broker.create_hub(HubSpec::new(hub, partitions)).await?;
        let source = Arc::new(BrokerSource::new(broker.clone(), "bench", hub));
        Ok(LocalHub {
            broker,
            bench: Bench::over(source),
        })
    }

    async fn fill(
        &self,
        hub: &str,
        partitions: u32,
        per_partition: usize,
        size: usize,
    ) -> Result<()> {
        let body = bytes::Bytes::from(vec![0x5a; size]);
        for p in 0..partitions {
            let mut left = per_partition;
            while left > 0 {
                let n = left.min(1000);
                let events = (0..n).map(|_| EventData::new(body.clone())).collect();
                self.broker
                    .send(hub, SendTarget::Partition(p.to_string()), events)
                    .await?;
                left -= n;
            }
        }
        Ok(())
    }

    /// Keeps every partition supplied with a trickle of events until `stop` is set.
    fn trickle(&self, hub: &str, partitions: u32, stop: Arc<AtomicBool>) {
        let (broker, hub) = (self.broker.clone(), hub.to_owned());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                for p in 0..partitions {
                    let _ = broker
                        .send(
                            &hub,
                            SendTarget::Partition(p.to_string()),
                            vec![EventData::new("t")],
                        )
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
}

pub async fn run(root: &std::path::Path) -> Result<()> {
    startup(&root.join("startup")).await?;
    failover(&root.join("failover-crash"), true).await?;
    failover(&root.join("failover-graceful"), false).await?;
    steady_state(&root.join("steady")).await?;
    throughput(&root.join("throughput")).await
}

async fn startup(dir: &std::path::Path) -> Result<()> {
    let hub = LocalHub::new(dir, "h", 32).await?;
    hub.fill("h", 32, 10, 100).await?;
    let started = Instant::now();
    let host = hub.bench.host("solo", 100, 1)?;
    let all: Vec<String> = (0..32).map(|p| p.to_string()).collect();
    let took = hub.bench.delivered_since("solo", &all, started).await;
    println!(
        "processor start-up: one instance on a 32-partition hub processing all 32 partitions after {:.0} ms",
        took.as_secs_f64() * 1000.0
    );
    host.shutdown().await?;
    Ok(())
}

async fn failover(dir: &std::path::Path, crash: bool) -> Result<()> {
    let hub = LocalHub::new(dir, "h", 16).await?;
    let stop = Arc::new(AtomicBool::new(false));
    hub.trickle("h", 16, stop.clone());
    let took = hub.bench.failover(16, crash).await;
    stop.store(true, Ordering::Relaxed);
    println!(
        "processor failover after {}: all 8 of its partitions processing on the other instance after {:.0} ms (interval 500 ms, expiration 5 s)",
        failover_cause(crash),
        took?.as_secs_f64() * 1000.0
    );
    Ok(())
}

/// How the first of two hosts stops in a failover run.
pub(crate) fn failover_cause(crash: bool) -> &'static str {
    if crash {
        "a crash (abort: no relinquish)"
    } else {
        "a graceful shutdown"
    }
}

impl Bench {
    /// Two hosts share `partitions` (kept supplied with events by the caller); once balanced
    /// the first is aborted (`crash`) or shut down: the time until each of its partitions
    /// delivers again on the second.
    pub(crate) async fn failover(&self, partitions: usize, crash: bool) -> Result<Duration> {
        let a = self.host("a", 100, 1)?;
        let b = self.host("b", 100, 1)?;
        let half = partitions / 2;
        while a.owned_partitions().len() != half || b.owned_partitions().len() != partitions - half
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let moved = a.owned_partitions();
        let at = Instant::now();
        if crash {
            a.abort()
        } else {
            a.shutdown().await?
        }
        let took = self.delivered_since("b", &moved, at).await;
        b.shutdown().await?;
        Ok(took)
    }
}

async fn steady_state(dir: &std::path::Path) -> Result<()> {
    let hub = LocalHub::new(dir, "h", 16).await?;
    let hosts: Vec<RunningHost> = ["a", "b", "c"]
        .iter()
        .map(|n| hub.bench.host(n, 100, 1))
        .collect::<Result<_>>()?;
    let owned = |hosts: &[RunningHost]| {
        hosts
            .iter()
            .map(RunningHost::owned_partitions)
            .collect::<Vec<_>>()
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = owned(&hosts);
    let mut changes = 0;
    let mut last = before.clone();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = owned(&hosts);
        changes += now.iter().zip(&last).filter(|(a, b)| a != b).count();
        last = now;
    }
    let counts: Vec<usize> = before.iter().map(Vec::len).collect();
    println!(
        "processor steady state: 3 instances on 16 partitions (shares {counts:?}): {changes} ownership changes over 100 balancing intervals"
    );
    for host in hosts {
        host.shutdown().await?;
    }
    Ok(())
}

async fn throughput(dir: &std::path::Path) -> Result<()> {
    for (batch, checkpoint_every) in [(100, 10), (1000, 100)] {
        let hub = LocalHub::new(&dir.join(batch.to_string()), "h", 16).await?;
        let per_partition = 250_000;
        hub.fill("h", 16, per_partition, 100).await?;
        let total = 16 * per_partition as u64;
        let started = Instant::now();
        let host = hub.bench.host("counter", batch, checkpoint_every)?;
        while hub.bench.observed.events.load(Ordering::Relaxed) < total {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "processor throughput: one instance counting {total} events of 100 B across 16 partitions: {:.0} events/s (batches of {batch}, checkpoint every {checkpoint_every} batches)",
            total as f64 / secs
        );
        host.shutdown().await?;
    }
    Ok(())
}
