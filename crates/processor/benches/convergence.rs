//! How many balancing intervals hosts take to reach an even split: 1,024 partitions of the
//! in-process source, the in-memory store, the default options (500 ms interval, 5 s
//! expiration, balanced strategy) and a processor that does nothing.
//!
//! The hosts run on tokio's paused clock, so an interval costs no real time and the count does
//! not depend on the machine's load. Each scenario runs with store calls that take no time
//! (each host's cycle then sees every earlier claim) and with a 20 ms round trip (hosts whose
//! cycles overlap plan from the same listing and race for the same records, as against a
//! remote store).
//!
//! Scenarios:
//! - **start together**: 32 hosts start at the same instant on an empty store;
//! - **scale out**: one host owns every partition, then 31 more start at one instant;
//! - **one at a time**: 32 hosts join one interval apart (counted from the last one's start).
//!
//! Every scenario runs twice: with a store that keeps host records (as the hub-hosted,
//! PostgreSQL and SQLite stores do: one renewal per host per cycle) and with one that does not
//! (as the Azure Blob store: every owned partition renewed each cycle).
//!
//! The split counts as reached when every host owns exactly 32 partitions and no partition is
//! owned twice; it must then hold for 20 more intervals. Run with
//! `cargo bench -p tributary-processor --bench convergence`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tributary_processor::{
    Checkpoint, CheckpointStore, EventProcessorHost, InMemoryCheckpointStore,
    LoadBalancingStrategy, Ownership, OwnershipFence, OwnershipListing, ProcessorOptions,
    RunningHost, StoreError, processor_fn,
};
use tributary_source::PartitionSource;
use tributary_source::testing::InMemoryPartitionSource;

const PARTITIONS: u32 = 1024;
const HOSTS: usize = 32;
/// How long the split must hold once reached, in intervals.
const HOLD_INTERVALS: u32 = 20;
/// How long a scenario may take before it counts as not converging, in intervals.
const GIVE_UP_INTERVALS: u32 = 400;

/// The in-memory store behind a fixed round trip: each call takes effect after `latency`, so
/// hosts that start together plan from the same listing, as against a remote store.
struct Remote {
    store: InMemoryCheckpointStore,
    latency: Duration,
    /// Whether hosts renew a host record instead of each partition.
    host_records: bool,
}

#[async_trait::async_trait]
impl CheckpointStore for Remote {
    async fn list_ownership(
        &self,
        ns: &str,
        hub: &str,
        group: &str,
    ) -> Result<Vec<Ownership>, StoreError> {
        tokio::time::sleep(self.latency).await;
        self.store.list_ownership(ns, hub, group).await
    }

    async fn claim_ownership(&self, claims: Vec<Ownership>) -> Result<Vec<Ownership>, StoreError> {
        tokio::time::sleep(self.latency).await;
        self.store.claim_ownership(claims).await
    }

    async fn list_checkpoints(
        &self,
        ns: &str,
        hub: &str,
        group: &str,
    ) -> Result<Vec<Checkpoint>, StoreError> {
        tokio::time::sleep(self.latency).await;
        self.store.list_checkpoints(ns, hub, group).await
    }

    async fn update_checkpoint(
        &self,
        checkpoint: Checkpoint,
        fence: &OwnershipFence,
    ) -> Result<(), StoreError> {
        tokio::time::sleep(self.latency).await;
        self.store.update_checkpoint(checkpoint, fence).await
    }

    fn keeps_host_records(&self) -> bool {
        self.host_records
    }

    async fn renew_host(
        &self,
        ns: &str,
        hub: &str,
        group: &str,
        owner_id: &str,
    ) -> Result<OwnershipListing, StoreError> {
        if !self.host_records {
            let ownership = self.list_ownership(ns, hub, group).await?;
            return Ok(OwnershipListing::without_hosts(ownership));
        }
        tokio::time::sleep(self.latency).await;
        self.store.renew_host(ns, hub, group, owner_id).await
    }
}

struct Fleet {
    source: Arc<dyn PartitionSource>,
    store: Arc<dyn CheckpointStore>,
    strategy: LoadBalancingStrategy,
    hosts: Vec<RunningHost>,
}

impl Fleet {
    fn new(scenario: &Scenario) -> Fleet {
        Fleet {
            source: Arc::new(InMemoryPartitionSource::new("ns", "hub", PARTITIONS)),
            store: Arc::new(Remote {
                store: InMemoryCheckpointStore::new(),
                latency: scenario.latency,
                host_records: scenario.host_records,
            }),
            strategy: scenario.strategy,
            hosts: Vec::new(),
        }
    }

    fn interval() -> Duration {
        ProcessorOptions::default().load_balancing_interval
    }

    fn start(&mut self, count: usize) {
        for _ in 0..count {
            let options = ProcessorOptions {
                host_name: format!("host-{:02}", self.hosts.len()),
                load_balancing_strategy: self.strategy,
                ..ProcessorOptions::default()
            };
            let factory = processor_fn(|_, _| async {});
            let host =
                EventProcessorHost::builder(self.source.clone(), self.store.clone(), factory)
                    .options(options)
                    .build()
                    .expect("valid options")
                    .start()
                    .expect("in a runtime");
            self.hosts.push(host);
        }
    }

    /// Whether every host owns its exact share and no partition is owned twice.
    fn is_even(&self) -> bool {
        let share = PARTITIONS as usize / self.hosts.len();
        let mut all = BTreeSet::new();
        for host in &self.hosts {
            let owned = host.owned_partitions();
            if owned.len() != share {
                return false;
            }
            all.extend(owned);
        }
        all.len() == PARTITIONS as usize
    }

    /// Intervals from now until the split is even (and then holds); `None` if it never is.
    async fn intervals_to_even(&self) -> Option<f64> {
        let step = Fleet::interval() / 20;
        let started = tokio::time::Instant::now();
        let give_up = started + Fleet::interval() * GIVE_UP_INTERVALS;
        while !self.is_even() {
            if tokio::time::Instant::now() >= give_up {
                return None;
            }
            tokio::time::sleep(step).await;
        }
        let reached = started.elapsed();
        let hold_until = tokio::time::Instant::now() + Fleet::interval() * HOLD_INTERVALS;
        while tokio::time::Instant::now() < hold_until {
            tokio::time::sleep(step).await;
            assert!(self.is_even(), "the even split did not hold");
        }
        Some(reached.as_secs_f64() / Fleet::interval().as_secs_f64())
    }

    async fn shutdown(self) {
        for host in self.hosts {
            host.abort();
        }
    }
}

async fn start_together(scenario: &Scenario) -> Option<f64> {
    let mut fleet = Fleet::new(scenario);
    fleet.start(HOSTS);
    let intervals = fleet.intervals_to_even().await;
    fleet.shutdown().await;
    intervals
}

async fn scale_out(scenario: &Scenario) -> Option<f64> {
    let mut fleet = Fleet::new(scenario);
    fleet.start(1);
    tokio::time::sleep(Fleet::interval() * 4).await;
    assert_eq!(fleet.hosts[0].owned_partitions().len(), PARTITIONS as usize);
    fleet.start(HOSTS - 1);
    let intervals = fleet.intervals_to_even().await;
    fleet.shutdown().await;
    intervals
}

async fn one_at_a_time(scenario: &Scenario) -> Option<f64> {
    let mut fleet = Fleet::new(scenario);
    for _ in 0..HOSTS {
        fleet.start(1);
        tokio::time::sleep(Fleet::interval()).await;
    }
    let intervals = fleet.intervals_to_even().await;
    fleet.shutdown().await;
    intervals.map(|n| n + 1.0)
}

/// How the hosts balance and what their store is like.
struct Scenario {
    strategy: LoadBalancingStrategy,
    latency: Duration,
    host_records: bool,
}

fn report(name: &str, scenario: &Scenario, intervals: Option<f64>) {
    let renewals = if scenario.host_records {
        "host records"
    } else {
        "partition renewals"
    };
    let what = format!(
        "{name:<16} {:?}, {renewals}, store round trip {:?}:",
        scenario.strategy, scenario.latency
    );
    match intervals {
        Some(n) => println!("{what} even split after {n:.2} intervals"),
        None => println!("{what} no even split within {GIVE_UP_INTERVALS} intervals"),
    }
}

fn main() {
    // `cargo test --all-targets` runs bench targets without `--bench`: this is a measurement.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("convergence: a benchmark; run it with `cargo bench`");
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    println!(
        "{HOSTS} hosts, {PARTITIONS} partitions, interval {:?}, in-memory store",
        Fleet::interval()
    );
    let strategies = [
        LoadBalancingStrategy::Balanced,
        LoadBalancingStrategy::Greedy,
    ];
    for host_records in [true, false] {
        for latency in [Duration::ZERO, Duration::from_millis(20)] {
            for strategy in strategies {
                let scenario = Scenario {
                    strategy,
                    latency,
                    host_records,
                };
                let n = runtime.block_on(start_together(&scenario));
                report("start together", &scenario, n);
                let n = runtime.block_on(scale_out(&scenario));
                report("scale out", &scenario, n);
                let n = runtime.block_on(one_at_a_time(&scenario));
                report("one at a time", &scenario, n);
            }
        }
    }
}
