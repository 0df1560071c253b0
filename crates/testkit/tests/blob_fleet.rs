//! A mixed fleet on one Azurite container: Tributary `EventProcessorHost`s with the blob store
//! and an official processor — Python (`tests/python/processor.py`) or JavaScript
//! (`tests/js/processor.js`) — balance one consumer group of one hub, each owning its share with
//! no partition read by two; when one side stops, the other resumes its partitions from its
//! checkpoints without a gap — in both directions.
//!
//! Each test starts the broker and the AMQP listener, Azurite and the official processor's
//! process. Install them with `scripts/setup-python-interop` and `scripts/setup-js-interop`; a
//! missing client FAILS these tests, it never skips them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tributary_client::RemoteHub;
use tributary_processor::{
    BlobCheckpointStore, CheckpointStore, EventProcessorHost, PartitionReceiver, PartitionSource,
    ProcessorOptions, ReceiverOptions, RunningHost, SourceError, processor_fn,
};
use tributary_testkit::{Azurite, JsonLines, TestHub};

const HUB: &str = "mixed";
const PARTITIONS: u32 = 8;
const STEP_TIMEOUT: Duration = Duration::from_secs(90);
/// The official processors checkpoint sequence numbers n with n % 5 == 4.
const OFFICIAL_CHECKPOINT_EVERY: i64 = 5;

/// Sequence numbers processed per partition, in order.
type Events = BTreeMap<String, Vec<i64>>;

/// Which official processor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sdk {
    Python,
    JavaScript,
}

impl Sdk {
    fn container(self) -> &'static str {
        match self {
            Sdk::Python => "fleet-python",
            Sdk::JavaScript => "fleet-javascript",
        }
    }
}

/// What the official processor reported.
#[derive(Default, Debug)]
struct OfficialSeen {
    owned: BTreeSet<String>,
    events: Events,
    /// The last checkpoint written, per partition (a sequence number).
    checkpoints: BTreeMap<String, i64>,
    errors: Vec<Value>,
    stopped: bool,
}

/// An official processor's process, and the namespace its blobs are keyed by.
struct Official {
    sdk: Sdk,
    namespace: String,
    lines: JsonLines,
    seen: OfficialSeen,
}

impl Official {
    fn spawn(sdk: Sdk, f: &TestHub, azurite: &Azurite) -> Official {
        let tests = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests");
        let args = json!({
            "conn": f.conn(&f.root),
            "hub": HUB,
            "storage": azurite.connection_string(),
            "container": sdk.container(),
            "checkpoint_every": OFFICIAL_CHECKPOINT_EVERY,
            "load_balancing_interval": 1.0,
        });
        // Python keys its blobs by the connection string's `host:port`, JavaScript by the bare
        // host (on Azure there is no port, and every SDK uses the host name).
        let (mut command, namespace) = match sdk {
            Sdk::Python => {
                let mut command = tokio::process::Command::new(tributary_testkit::python());
                command.arg(tests.join("python/processor.py"));
                (command, format!("127.0.0.1:{}", f.port()))
            }
            Sdk::JavaScript => {
                let mut command = tokio::process::Command::new("node");
                command
                    .env("NODE_PATH", tributary_testkit::node_modules())
                    .arg(tests.join("js/processor.js"));
                (command, "127.0.0.1".to_owned())
            }
        };
        command.arg(args.to_string());
        Official {
            sdk,
            namespace,
            lines: JsonLines::spawn(&format!("the {sdk:?} processor"), command),
            seen: OfficialSeen::default(),
        }
    }

    fn apply(&mut self, doc: &Value) {
        let partition = doc["partition"].as_str().unwrap_or_default().to_owned();
        match doc["kind"].as_str().unwrap_or_default() {
            "init" => {
                self.seen.owned.insert(partition);
            }
            "close" => {
                self.seen.owned.remove(&partition);
            }
            "event" => self
                .seen
                .events
                .entry(partition)
                .or_default()
                .push(doc["seq"].as_i64().unwrap()),
            "checkpoint" => {
                self.seen
                    .checkpoints
                    .insert(partition, doc["seq"].as_i64().unwrap());
            }
            "error" => self.seen.errors.push(doc.clone()),
            "stopped" => self.seen.stopped = true,
            _ => {}
        }
    }

    /// Reads the processor's reports until `done` holds; panics after [`STEP_TIMEOUT`].
    async fn until(&mut self, what: &str, done: impl Fn(&OfficialSeen) -> bool) {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        while !done(&self.seen) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}\nofficial: {:?}\nstderr:\n{}",
                self.seen,
                self.lines.stderr()
            );
            if let Ok(Some(doc)) =
                tokio::time::timeout(Duration::from_millis(100), self.lines.lines.recv()).await
            {
                self.apply(&doc);
            }
        }
    }

    async fn stop(&mut self) {
        self.lines.write_line("stop").await;
        self.until("the official processor to stop", |seen| seen.stopped)
            .await;
        self.lines.wait_success(STEP_TIMEOUT).await;
    }
}

/// The hub under the namespace the official processor keys its blobs by.
struct NamedAsOfficial {
    hub: RemoteHub,
    namespace: String,
}

#[async_trait::async_trait]
impl PartitionSource for NamedAsOfficial {
    fn fully_qualified_namespace(&self) -> &str {
        &self.namespace
    }

    fn event_hub_name(&self) -> &str {
        self.hub.event_hub_name()
    }

    async fn partition_ids(&self) -> Result<Vec<String>, SourceError> {
        self.hub.partition_ids().await
    }

    async fn open_receiver(
        &self,
        options: ReceiverOptions,
    ) -> Result<Box<dyn PartitionReceiver>, SourceError> {
        self.hub.open_receiver(options).await
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
    let remote = Arc::new(NamedAsOfficial {
        hub: RemoteHub::connect(&f.connection_string, HUB).await.unwrap(),
        namespace: official.namespace.clone(),
    });
    let store = BlobCheckpointStore::from_connection_string(
        &azurite.connection_string(),
        official.sdk.container(),
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
        let settle = tokio::time::Instant::now() + Duration::from_secs(3);
        while tokio::time::Instant::now() < settle {
            if let Ok(Some(doc)) =
                tokio::time::timeout(Duration::from_millis(100), official.lines.lines.recv()).await
            {
                official.apply(&doc);
            }
        }
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

/// While balancing, partitions change hands; the loser's receiver is detached by the winner's
/// higher epoch (or refused while the former owner's is open). Nothing else may go wrong.
fn drain_balancing_errors(official: &mut Official) {
    for error in official.seen.errors.drain(..) {
        let text = error["error"].as_str().unwrap_or_default();
        assert!(
            text.contains("stolen") || text.contains("epoch") || text.contains("owner"),
            "the official processor reported {error}"
        );
    }
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
        official.sdk.container(),
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
    drain_balancing_errors(official);
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
    drain_balancing_errors(official);
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
    let mut official = Official::spawn(sdk, &f, &azurite);
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
