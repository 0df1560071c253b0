//! A mixed fleet on one Azurite container: Tributary `EventProcessorHost`s with the blob store
//! and the official Python processor (`tests/python/processor.py`) balance one consumer group
//! of one hub, each owning its share with no partition read by two; when one side stops, the
//! other resumes its partitions from its checkpoints without a gap — in both directions.

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
const CONTAINER: &str = "mixed-fleet";
const PARTITIONS: u32 = 8;
const STEP_TIMEOUT: Duration = Duration::from_secs(90);
/// The Python processor checkpoints sequence numbers n with n % 5 == 4.
const PYTHON_CHECKPOINT_EVERY: i64 = 5;

/// Sequence numbers processed per partition, in order.
type Events = BTreeMap<String, Vec<i64>>;

/// What the Python processor reported.
#[derive(Default, Debug)]
struct PythonSeen {
    owned: BTreeSet<String>,
    events: Events,
    /// The last checkpoint written, per partition (a sequence number).
    checkpoints: BTreeMap<String, i64>,
    errors: Vec<Value>,
    stopped: bool,
}

struct Python {
    lines: JsonLines,
    seen: PythonSeen,
}

impl Python {
    fn spawn(f: &TestHub, azurite: &Azurite) -> Python {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/processor.py");
        let args = json!({
            "conn": f.conn(&f.root),
            "hub": HUB,
            "storage": azurite.connection_string(),
            "container": CONTAINER,
            "checkpoint_every": PYTHON_CHECKPOINT_EVERY,
            "load_balancing_interval": 1.0,
        });
        let mut command = tokio::process::Command::new(tributary_testkit::python());
        command.arg(script).arg(args.to_string());
        Python {
            lines: JsonLines::spawn("the Python processor", command),
            seen: PythonSeen::default(),
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
    async fn until(&mut self, what: &str, done: impl Fn(&PythonSeen) -> bool) {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        while !done(&self.seen) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}\nPython: {:?}\nstderr:\n{}",
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
        self.until("the Python processor to stop", |seen| seen.stopped)
            .await;
        self.lines.wait_success(STEP_TIMEOUT).await;
    }
}

/// The hub as the Python processor names it: it keys its blobs by the connection string's
/// `host:port` (on Azure there is no port, and every SDK uses the bare host name).
struct PythonNamed {
    hub: RemoteHub,
    namespace: String,
}

#[async_trait::async_trait]
impl PartitionSource for PythonNamed {
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

fn namespace(f: &TestHub) -> String {
    format!("127.0.0.1:{}", f.port())
}

/// A Tributary host on the blob store, and what it processed.
struct Tributary {
    host: RunningHost,
    events: Arc<Mutex<Events>>,
}

async fn start_tributary(f: &TestHub, azurite: &Azurite, name: &str) -> Tributary {
    let remote = Arc::new(PythonNamed {
        hub: RemoteHub::connect(&f.connection_string, HUB).await.unwrap(),
        namespace: namespace(f),
    });
    let store =
        BlobCheckpointStore::from_connection_string(&azurite.connection_string(), CONTAINER)
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
async fn wait_balanced(python: &mut Python, t: &Tributary) {
    let half = (PARTITIONS / 2) as usize;
    loop {
        python
            .until("an even split", |seen| {
                let ours = owned(t);
                seen.owned.len() == half && ours.len() == half && seen.owned.is_disjoint(&ours)
            })
            .await;
        let settle = tokio::time::Instant::now() + Duration::from_secs(3);
        while tokio::time::Instant::now() < settle {
            if let Ok(Some(doc)) =
                tokio::time::timeout(Duration::from_millis(100), python.lines.lines.recv()).await
            {
                python.apply(&doc);
            }
        }
        let ours = owned(t);
        if python.seen.owned.len() == half && ours.len() == half {
            return;
        }
    }
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
fn drain_balancing_errors(python: &mut Python) {
    for error in python.seen.errors.drain(..) {
        let text = error["error"].as_str().unwrap_or_default();
        assert!(
            text.contains("stolen") || text.contains("epoch") || text.contains("owner"),
            "the Python processor reported {error}"
        );
    }
}

/// Waits until the store holds a checkpoint at `seq` for each of `partitions`.
async fn wait_checkpointed(
    f: &TestHub,
    azurite: &Azurite,
    partitions: &BTreeSet<String>,
    seq: i64,
) {
    let store =
        BlobCheckpointStore::from_connection_string(&azurite.connection_string(), CONTAINER)
            .await
            .unwrap();
    tributary_testkit::within("checkpoints in the store", async {
        loop {
            let checkpoints = store
                .list_checkpoints(&namespace(f), HUB, "$Default")
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

/// Python and Tributary split the partitions; Tributary leaves and Python resumes its
/// partitions right after Tributary's checkpoints.
async fn tributary_hands_over_to_python(f: &TestHub, azurite: &Azurite, python: &mut Python) {
    let t = start_tributary(f, azurite, "tributary-a").await;
    wait_balanced(python, &t).await;
    drain_balancing_errors(python);
    let ours = owned(&t);
    let theirs = python.seen.owned.clone();
    send_round(f, "one", 20).await;
    python
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
            since(&python.seen.events, p, 0),
            Vec::<i64>::new(),
            "Python read {p}"
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
            since(&python.seen.events, p, 0),
            (0..20).collect::<Vec<_>>()
        );
    }
    wait_checkpointed(f, azurite, &ours, 19).await;
    t.host.shutdown().await.unwrap();
    send_round(f, "two", 10).await;
    python
        .until("Python processing everything", |seen| {
            (0..PARTITIONS).all(|p| processed(&seen.events, &p.to_string(), 29))
        })
        .await;
    for p in &ours {
        assert_eq!(
            since(&python.seen.events, p, 0),
            (20..30).collect::<Vec<_>>(),
            "Python's takeover of {p}: right after our checkpoint, no gap, no repeat"
        );
    }
}

/// A Tributary host joins Python (which owns everything), takes its share by stealing, and
/// resumes every partition from Python's checkpoints once Python leaves.
async fn python_hands_over_to_tributary(f: &TestHub, azurite: &Azurite, python: &mut Python) {
    let t = start_tributary(f, azurite, "tributary-b").await;
    wait_balanced(python, &t).await;
    drain_balancing_errors(python);
    let ours = owned(&t);
    let theirs = python.seen.owned.clone();
    send_round(f, "three", 10).await;
    python
        .until("round three processed", |seen| {
            let events = t.events.lock().unwrap();
            (0..PARTITIONS).all(|p| {
                let p = p.to_string();
                processed(&events, &p, 39) || processed(&seen.events, &p, 39)
            })
        })
        .await;
    for p in &ours {
        // We resumed each stolen partition right after Python's checkpoint at 29.
        assert_eq!(
            since(&t.events.lock().unwrap(), p, 0),
            (30..40).collect::<Vec<_>>()
        );
        assert_eq!(
            since(&python.seen.events, p, 30),
            Vec::<i64>::new(),
            "Python read {p}"
        );
    }
    let last_checkpoint = 39; // 39 % 5 == 4: Python's last checkpoint of round three.
    python
        .until("Python's checkpoints of round three", |seen| {
            theirs
                .iter()
                .all(|p| seen.checkpoints.get(p) == Some(&last_checkpoint))
        })
        .await;
    python.stop().await;
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
            "our takeover of {p}: right after Python's checkpoint, no gap"
        );
    }
    t.host.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tributary_and_the_python_processor_share_one_consumer_group() {
    let f = TestHub::start(&[(HUB, PARTITIONS)]).await;
    let azurite = Azurite::start().await;
    let mut python = Python::spawn(&f, &azurite);
    tributary_hands_over_to_python(&f, &azurite, &mut python).await;
    python_hands_over_to_tributary(&f, &azurite, &mut python).await;
    azurite.stop().await;
    f.stop().await;
}
