//! A mixed fleet on one Azurite container: Tributary `EventProcessorHost`s with the blob store
//! and an official processor — Python (`tests/python/processor.py`) or JavaScript
//! (`tests/js/processor.js`) — balance one consumer group of one hub, each owning its share with
//! no partition read by two; when one side stops, the other resumes its partitions from its
//! checkpoints without a gap — in both directions.
//!
//! The official processor's connection string names `127.0.0.1:PORT`: JavaScript keys its blobs
//! by the bare host, Python by `host:port` (on Azure there is no port, and every SDK uses the
//! host name). Our hosts take the namespace the official processor reports
//! (`ProcessorOptions::fully_qualified_namespace`). The CLI's `mixed_fleet` test runs all of
//! them on one container instead, each keyed by `localhost`.
//!
//! Each test starts the broker and the AMQP listener, Azurite and the official processor's
//! process. Install them with `scripts/setup-python-interop` and `scripts/setup-js-interop`; a
//! missing client FAILS these tests, it never skips them.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tributary_client::RemoteHub;
use tributary_processor::{
    BlobCheckpointStore, CheckpointStore, EventProcessorHost, ProcessorOptions, RunningHost,
    processor_fn,
};
use tributary_testkit::official::Events;
use tributary_testkit::{Azurite, OfficialProcessor, Sdk, TestHub};

const HUB: &str = "mixed";
const PARTITIONS: u32 = 8;
/// The official processors checkpoint sequence numbers n with n % 5 == 4.
const OFFICIAL_CHECKPOINT_EVERY: i64 = 5;

fn container(sdk: Sdk) -> &'static str {
    match sdk {
        Sdk::Python => "fleet-python",
        Sdk::JavaScript => "fleet-javascript",
    }
}

/// An official processor's process, and the namespace its blobs are keyed by.
struct Official {
    process: OfficialProcessor,
    namespace: String,
}

impl std::ops::Deref for Official {
    type Target = OfficialProcessor;
    fn deref(&self) -> &OfficialProcessor {
        &self.process
    }
}

impl std::ops::DerefMut for Official {
    fn deref_mut(&mut self) -> &mut OfficialProcessor {
        &mut self.process
    }
}

impl Official {
    async fn spawn(sdk: Sdk, f: &TestHub, azurite: &Azurite) -> Official {
        let args = json!({
            "conn": f.conn(&f.root),
            "hub": HUB,
            "storage": azurite.connection_string(),
            "container": container(sdk),
            "checkpoint_every": OFFICIAL_CHECKPOINT_EVERY,
            "load_balancing_interval": 1.0,
        });
        let mut process = OfficialProcessor::spawn(sdk, &args);
        let namespace = process.ready().await;
        let expected = match sdk {
            Sdk::Python => format!("127.0.0.1:{}", f.port()),
            Sdk::JavaScript => "127.0.0.1".to_owned(),
        };
        assert_eq!(namespace, expected, "the {sdk:?} processor's namespace");
        Official { process, namespace }
    }
}

/// A Tributary host on the blob store, and what it processed.
struct Tributary {
    host: RunningHost,
    events: Arc<Mutex<Events>>,
}

async fn start_tributary(
    f: &TestHub,
    azurite: &Azurite,
    official: &Official,
    name: &str,
) -> Tributary {
    let remote = Arc::new(RemoteHub::connect(&f.connection_string, HUB).await.unwrap());
    let store = BlobCheckpointStore::from_connection_string(
        &azurite.connection_string(),
        container(official.sdk),
    )
    .await
    .unwrap();
    let events: Arc<Mutex<Events>> = Arc::default();
    let seen = Arc::clone(&events);
    let factory = processor_fn(move |context, batch| {
        let seen = Arc::clone(&seen);
        async move {
            {
                let mut seen = seen.lock().unwrap();
                let entry = seen.entry(context.partition_id().to_owned()).or_default();
                entry.extend(batch.iter().map(|e| e.sequence_number));
            }
            // A checkpoint refused after a steal is the fence working, not a failure.
            let _ = context.checkpoint().await;
        }
    });
    let host = EventProcessorHost::builder(remote, Arc::new(store), factory)
        .options(ProcessorOptions {
            host_name: name.to_owned(),
            fully_qualified_namespace: Some(official.namespace.clone()),
            receive_timeout: Duration::from_millis(500),
            load_balancing_interval: Duration::from_secs(1),
            ownership_expiration: Duration::from_secs(10),
            ..ProcessorOptions::default()
        })
        .build()
        .expect("valid options")
        .start()
        .expect("host starts");
    Tributary { host, events }
}

fn owned(t: &Tributary) -> BTreeSet<String> {
    t.host.owned_partitions().into_iter().collect()
}

/// Waits for an even split that holds for three balancing rounds.
async fn wait_balanced(official: &mut Official, t: &Tributary) {
    let half = (PARTITIONS / 2) as usize;
    loop {
        official
            .until("an even split", |seen| {
                let ours = owned(t);
                seen.owned.len() == half && ours.len() == half && seen.owned.is_disjoint(&ours)
            })
            .await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        official.pump();
        let ours = owned(t);
        if official.seen.owned.len() == half && ours.len() == half {
            return;
        }
    }
}

/// Each partition ends up with exactly one open receiver at the hub: nobody reads a partition
/// beside its owner, and no former owner's receiver lingers.
async fn one_receiver_per_partition(f: &TestHub) {
    let mut open = 0;
    for _ in 0..50 {
        open = f.broker.open_receiver_count(HUB).unwrap();
        if open == PARTITIONS as usize {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{open} receivers open on {PARTITIONS} partitions");
}

async fn send_round(f: &TestHub, round: &str, count: i64) {
    for p in 0..PARTITIONS {
        for i in 0..count {
            f.send(HUB, &p.to_string(), &format!("{round}-{p}-{i}"))
                .await;
        }
    }
}

fn processed(events: &Events, partition: &str, seq: i64) -> bool {
    events.get(partition).is_some_and(|s| s.contains(&seq))
}

/// The events of `partition` processed at or after `from`.
fn since(events: &Events, partition: &str, from: i64) -> Vec<i64> {
    events
        .get(partition)
        .map(|s| s.iter().copied().filter(|&n| n >= from).collect())
        .unwrap_or_default()
}

/// Waits until the store holds a checkpoint at `seq` for each of `partitions`.
async fn wait_checkpointed(
    official: &Official,
    azurite: &Azurite,
    partitions: &BTreeSet<String>,
    seq: i64,
) {
    let store = BlobCheckpointStore::from_connection_string(
        &azurite.connection_string(),
        container(official.sdk),
    )
    .await
    .unwrap();
    tributary_testkit::within("checkpoints in the store", async {
        loop {
            let checkpoints = store
                .list_checkpoints(&official.namespace, HUB, "$Default")
                .await
                .unwrap();
            let done = partitions.iter().all(|p| {
                checkpoints
                    .iter()
                    .any(|c| &c.partition_id == p && c.sequence_number == Some(seq))
            });
            if done {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
}

/// The official processor and Tributary split the partitions; Tributary leaves and the official processor resumes its
/// partitions right after Tributary's checkpoints.
async fn tributary_hands_over_to_official(f: &TestHub, azurite: &Azurite, official: &mut Official) {
    let t = start_tributary(f, azurite, official, "tributary-a").await;
    wait_balanced(official, &t).await;
    official.drain_balancing_errors();
    one_receiver_per_partition(f).await;
    let ours = owned(&t);
    let theirs = official.seen.owned.clone();
    send_round(f, "one", 20).await;
    official
        .until("round one processed", |seen| {
            let events = t.events.lock().unwrap();
            (0..PARTITIONS).all(|p| {
                let p = p.to_string();
                processed(&events, &p, 19) || processed(&seen.events, &p, 19)
            })
        })
        .await;
    // No partition read by two: each event of round one went to its partition's owner only.
    for p in &ours {
        assert_eq!(
            since(&official.seen.events, p, 0),
            Vec::<i64>::new(),
            "the official processor read {p}"
        );
        assert_eq!(
            since(&t.events.lock().unwrap(), p, 0),
            (0..20).collect::<Vec<_>>()
        );
    }
    for p in &theirs {
        assert_eq!(
            since(&t.events.lock().unwrap(), p, 0),
            Vec::<i64>::new(),
            "we read {p}"
        );
        assert_eq!(
            since(&official.seen.events, p, 0),
            (0..20).collect::<Vec<_>>()
        );
    }
    wait_checkpointed(official, azurite, &ours, 19).await;
    t.host.shutdown().await.unwrap();
    send_round(f, "two", 10).await;
    official
        .until("the official processor processing everything", |seen| {
            (0..PARTITIONS).all(|p| processed(&seen.events, &p.to_string(), 29))
        })
        .await;
    for p in &ours {
        assert_eq!(
            since(&official.seen.events, p, 0),
            (20..30).collect::<Vec<_>>(),
            "the official processor's takeover of {p}: right after our checkpoint, no gap, no repeat"
        );
    }
}

/// A Tributary host joins the official processor (which owns everything), takes its share by stealing, and
/// resumes every partition from the official processor's checkpoints once it leaves.
async fn official_hands_over_to_tributary(f: &TestHub, azurite: &Azurite, official: &mut Official) {
    let t = start_tributary(f, azurite, official, "tributary-b").await;
    wait_balanced(official, &t).await;
    official.drain_balancing_errors();
    one_receiver_per_partition(f).await;
    let ours = owned(&t);
    let theirs = official.seen.owned.clone();
    send_round(f, "three", 10).await;
    official
        .until("round three processed", |seen| {
            let events = t.events.lock().unwrap();
            (0..PARTITIONS).all(|p| {
                let p = p.to_string();
                processed(&events, &p, 39) || processed(&seen.events, &p, 39)
            })
        })
        .await;
    for p in &ours {
        // We resumed each stolen partition right after the official processor's checkpoint at 29.
        assert_eq!(
            since(&t.events.lock().unwrap(), p, 0),
            (30..40).collect::<Vec<_>>()
        );
        assert_eq!(
            since(&official.seen.events, p, 30),
            Vec::<i64>::new(),
            "the official processor read {p}"
        );
    }
    let last_checkpoint = 39; // 39 % 5 == 4: the official processor's last checkpoint of round three.
    official
        .until(
            "the official processor's checkpoints of round three",
            |seen| {
                theirs
                    .iter()
                    .all(|p| seen.checkpoints.get(p) == Some(&last_checkpoint))
            },
        )
        .await;
    official.stop().await;
    send_round(f, "four", 10).await;
    tributary_testkit::within("Tributary processing everything", async {
        while !(0..PARTITIONS).all(|p| processed(&t.events.lock().unwrap(), &p.to_string(), 49)) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    for p in &theirs {
        assert_eq!(
            since(&t.events.lock().unwrap(), p, 0),
            ((last_checkpoint + 1)..50).collect::<Vec<_>>(),
            "our takeover of {p}: right after the official processor's checkpoint, no gap"
        );
    }
    t.host.shutdown().await.unwrap();
}

async fn mixed_fleet(sdk: Sdk) {
    let f = TestHub::start(&[(HUB, PARTITIONS)]).await;
    let azurite = Azurite::start().await;
    let mut official = Official::spawn(sdk, &f, &azurite).await;
    tributary_hands_over_to_official(&f, &azurite, &mut official).await;
    official_hands_over_to_tributary(&f, &azurite, &mut official).await;
    azurite.stop().await;
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tributary_and_the_python_processor_share_one_consumer_group() {
    mixed_fleet(Sdk::Python).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tributary_and_the_javascript_processor_share_one_consumer_group() {
    mixed_fleet(Sdk::JavaScript).await;
}
