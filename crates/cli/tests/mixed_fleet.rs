//! A mixed fleet on one Azurite container: two `tributary process` instances (this crate's
//! binary, `--store` the container's URL), the official Python processor and the official
//! JavaScript processor balance one consumer group of a 16-partition hub. Each owns four
//! partitions; no partition is ever read by two (the hub never has two receivers open on one,
//! and every event goes to its partition's owner only); one Tributary instance is killed with
//! SIGKILL and its partitions resume on the other three right after its last checkpoints.
//!
//! All four key their blobs by the namespace `localhost`. Python keys them by its connection
//! string's Endpoint as written (`host:port` when there is a port), the others by the bare host;
//! so Python gets `Endpoint=sb://localhost` with the real address as its custom endpoint (plain
//! AMQP in emulator mode), JavaScript `sb://localhost:PORT`, and the Tributary instances the
//! hub's `127.0.0.1:PORT` with `--namespace localhost`.
//!
//! The test binary starts the hub (in process, so the test sees its receivers) and Azurite once;
//! the official processors come from `scripts/setup-python-interop` and
//! `scripts/setup-js-interop`, and a missing one FAILS the test.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tributary_processor::{BlobCheckpointStore, CheckpointStore};
use tributary_testkit::azurite::AZURITE_KEY;
use tributary_testkit::official::{Events, STEP_TIMEOUT};
use tributary_testkit::{Azurite, OfficialProcessor, Sdk, TestHub};

const HUB: &str = "fleet";
const PARTITIONS: u32 = 16;
const GROUP: &str = "$Default";
const NAMESPACE: &str = "localhost";
const CONTAINER: &str = "mixed-fleet";
/// Every member balances each second and lets a silent owner's partitions go after ten.
const INTERVAL_SECONDS: u64 = 1;
const EXPIRATION_SECONDS: u64 = 10;

/// A `tributary process` instance, killed if the test ends first.
struct Instance {
    name: String,
    child: tokio::process::Child,
    out: PathBuf,
}

/// The hub, Azurite, the four members and a watch on the hub's receivers.
struct Fleet {
    hub: TestHub,
    store: BlobCheckpointStore,
    tributary: Vec<Instance>,
    official: Vec<OfficialProcessor>,
    /// Partitions the hub had two receivers open on at once, as seen.
    doubly_read: Arc<Mutex<Vec<String>>>,
    dir: tempfile::TempDir,
    _azurite: Azurite,
}

fn spawn_tributary(hub: &TestHub, azurite: &Azurite, dir: &Path, name: &str) -> Instance {
    let out = dir.join(format!("{name}-out"));
    let store = format!("{}/{CONTAINER}", azurite.blob_endpoint());
    let (interval, expiration) = (
        format!("{INTERVAL_SECONDS}s"),
        format!("{EXPIRATION_SECONDS}s"),
    );
    let args = [
        "process",
        HUB,
        "--connection-string",
        &hub.conn(&hub.root),
        "--namespace",
        NAMESPACE,
        "--store",
        &store,
        "--action",
        "file",
        "--output-dir",
        out.to_str().unwrap(),
        "--host-name",
        name,
        "--interval",
        &interval,
        "--expiration",
        &expiration,
    ];
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let child = tokio::process::Command::from(common::tributary(&dir.join(name), &args))
        .env("AZURE_STORAGE_KEY", AZURITE_KEY)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("tributary process starts");
    Instance {
        name: name.to_owned(),
        child,
        out,
    }
}

fn spawn_official(sdk: Sdk, hub: &TestHub, azurite: &Azurite) -> OfficialProcessor {
    let port = hub.port();
    let at_port = hub.conn(&hub.root);
    let conn = match sdk {
        Sdk::Python => at_port.replace(&format!("127.0.0.1:{port}"), NAMESPACE),
        Sdk::JavaScript => at_port.replace("127.0.0.1:", &format!("{NAMESPACE}:")),
    };
    assert_ne!(conn, at_port);
    let args = json!({
        "conn": conn,
        "custom_endpoint": (sdk == Sdk::Python).then(|| format!("sb://127.0.0.1:{port}")),
        "hub": HUB,
        "storage": azurite.connection_string(),
        "container": CONTAINER,
        "checkpoint_every": 5,
        "load_balancing_interval": INTERVAL_SECONDS as f64,
    });
    OfficialProcessor::spawn(sdk, &args)
}

/// Samples the hub's receivers every 20 ms; a partition with two open in the group is recorded.
fn watch_receivers(hub: &TestHub) -> Arc<Mutex<Vec<String>>> {
    let doubly_read = Arc::new(Mutex::new(Vec::new()));
    let (seen, broker) = (Arc::clone(&doubly_read), hub.broker.clone());
    tokio::spawn(async move {
        loop {
            for partition in broker.partition_activity(HUB).unwrap_or_default() {
                let open: Vec<_> = partition
                    .receivers
                    .iter()
                    .filter(|r| r.consumer_group == GROUP)
                    .collect();
                if open.len() > 1 {
                    let what = format!("partition {}: {open:?}", partition.partition);
                    seen.lock().unwrap().push(what);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    doubly_read
}

impl Fleet {
    async fn start() -> Fleet {
        let hub = TestHub::start(&[(HUB, PARTITIONS)]).await;
        let azurite = Azurite::start().await;
        let store =
            BlobCheckpointStore::from_connection_string(&azurite.connection_string(), CONTAINER)
                .await
                .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let doubly_read = watch_receivers(&hub);
        let mut official: Vec<_> = [Sdk::Python, Sdk::JavaScript]
            .into_iter()
            .map(|sdk| spawn_official(sdk, &hub, &azurite))
            .collect();
        for process in &mut official {
            assert_eq!(process.ready().await, NAMESPACE, "{:?}", process.sdk);
        }
        let tributary = ["p0", "p1"]
            .into_iter()
            .map(|name| spawn_tributary(&hub, &azurite, dir.path(), name))
            .collect();
        Fleet {
            hub,
            store,
            tributary,
            official,
            doubly_read,
            dir,
            _azurite: azurite,
        }
    }

    fn member_name(sdk: Sdk) -> &'static str {
        match sdk {
            Sdk::Python => "python",
            Sdk::JavaScript => "javascript",
        }
    }

    /// Member → the partitions the store says it owns. Tributary instances own records by
    /// their host names; an official processor (a random owner id) by the partitions it
    /// reports owning.
    async fn owners(&mut self) -> BTreeMap<String, BTreeSet<String>> {
        let mut by_id = BTreeMap::<String, BTreeSet<String>>::new();
        let records = self.store.list_ownership(NAMESPACE, HUB, GROUP).await;
        for record in records.unwrap() {
            if !record.owner_id.is_empty() {
                by_id
                    .entry(record.owner_id)
                    .or_default()
                    .insert(record.partition_id);
            }
        }
        for official in &mut self.official {
            official.pump();
        }
        let mut owners = BTreeMap::new();
        for (id, partitions) in by_id {
            let official = self.official.iter().find(|o| o.seen.owned == partitions);
            let name = official.map_or(id, |o| Fleet::member_name(o.sdk).to_owned());
            owners.insert(name, partitions);
        }
        owners
    }

    /// Waits until the store's owners are `members`, with `shares` partitions each (in
    /// order of size), for three balancing intervals in a row; the owners then.
    async fn wait_split(
        &mut self,
        members: &[&str],
        shares: &[usize],
    ) -> BTreeMap<String, BTreeSet<String>> {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        let mut stable_since: Option<tokio::time::Instant> = None;
        loop {
            let owners = self.owners().await;
            let mut sizes: Vec<usize> = owners.values().map(BTreeSet::len).collect();
            sizes.sort_unstable();
            let names: Vec<&str> = owners.keys().map(String::as_str).collect();
            let split = names == members && sizes == shares;
            let now = tokio::time::Instant::now();
            match (split, stable_since) {
                (true, Some(since)) if now - since >= Duration::from_secs(3 * INTERVAL_SECONDS) => {
                    return owners;
                }
                (true, None) => stable_since = Some(now),
                (true, Some(_)) => {}
                (false, _) => stable_since = None,
            }
            assert!(
                now < deadline,
                "no split {shares:?} among {members:?}: {owners:?}\n{}",
                self.explain()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until each partition has exactly one receiver open in the group: its owner's (the
    /// watch on the receivers is not looking at an empty hub).
    async fn wait_one_receiver_each(&self) {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        loop {
            let activity = self.hub.broker.partition_activity(HUB).unwrap();
            let open: Vec<usize> = activity
                .iter()
                .map(|p| {
                    p.receivers
                        .iter()
                        .filter(|r| r.consumer_group == GROUP)
                        .count()
                })
                .collect();
            if open.iter().all(|&n| n == 1) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "receivers per partition: {open:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Each member's processed events, by partition.
    fn processed(&mut self) -> BTreeMap<String, Events> {
        let mut all = BTreeMap::new();
        for instance in &self.tributary {
            all.insert(instance.name.clone(), events_in(&instance.out));
        }
        for official in &mut self.official {
            official.pump();
            all.insert(
                Fleet::member_name(official.sdk).to_owned(),
                official.seen.events.clone(),
            );
        }
        all
    }

    /// Appends `count` events to every partition, numbered from `from` (their sequence numbers).
    async fn send(&self, from: i64, count: i64) {
        for p in 0..PARTITIONS {
            for seq in from..from + count {
                let receipt = self.hub.send(HUB, &p.to_string(), &seq.to_string()).await;
                assert_eq!(receipt.base_sequence, seq);
            }
        }
    }

    /// Waits until every partition's events `from..end` were processed by a member still
    /// running.
    async fn wait_processed(&mut self, from: i64, end: i64) -> BTreeMap<String, Events> {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        loop {
            let processed = self.processed();
            let done = (0..PARTITIONS).all(|p| {
                let p = p.to_string();
                (from..end).all(|seq| {
                    processed
                        .values()
                        .any(|e| e.get(&p).is_some_and(|s| s.contains(&seq)))
                })
            });
            if done {
                return processed;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "not every event of {from}..{end} was processed: {processed:?}\n{}",
                self.explain()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// What each Tributary instance logged and each official processor wrote on stderr.
    fn explain(&self) -> String {
        let mut said = String::new();
        for instance in &self.tributary {
            let log = self.dir.path().join(format!("{}.log", instance.name));
            let log = std::fs::read_to_string(log).unwrap_or_default();
            said += &format!("--- {} logged:\n{log}\n", instance.name);
        }
        for official in &self.official {
            said += &format!(
                "--- {:?}: {:?}\nstderr:\n{}\n",
                official.sdk,
                official.seen.owned,
                official.lines.stderr()
            );
        }
        said
    }

    /// Waits until the store holds a checkpoint at `seq` for each of `partitions`.
    async fn wait_checkpointed(&self, partitions: &BTreeSet<String>, seq: i64) {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        loop {
            let checkpoints = self.store.list_checkpoints(NAMESPACE, HUB, GROUP).await;
            let at: BTreeMap<String, Option<i64>> = checkpoints
                .unwrap()
                .into_iter()
                .map(|c| (c.partition_id, c.sequence_number))
                .collect();
            if partitions.iter().all(|p| at.get(p) == Some(&Some(seq))) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "checkpoints {at:?}, not {seq} on {partitions:?}\n{}",
                self.explain()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The sequence numbers in a Tributary instance's output files (`<partition>.events`, one
/// event body — its sequence number — a line).
fn events_in(out: &Path) -> Events {
    let mut events = Events::new();
    for entry in std::fs::read_dir(out).into_iter().flatten().flatten() {
        let path = entry.path();
        let partition = path.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let seqs = text.lines().map(|l| l.parse().expect("a sequence number"));
        events.insert(partition, seqs.collect());
    }
    events
}

/// The sequence numbers `member` processed on `partition`.
fn of(processed: &BTreeMap<String, Events>, member: &str, partition: &str) -> Vec<i64> {
    processed
        .get(member)
        .and_then(|e| e.get(partition))
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tributary_instances_and_the_official_python_and_javascript_processors_share_a_group() {
    let started = std::time::Instant::now();
    let mut fleet = Fleet::start().await;
    let members = ["javascript", "p0", "p1", "python"];
    let owners = fleet.wait_split(&members, &[4, 4, 4, 4]).await;
    eprintln!("an even split, stable, after {:?}", started.elapsed());
    fleet.wait_one_receiver_each().await;
    // Every member keyed its blobs by `localhost`: none are under the hub's address.
    let port = fleet.hub.port();
    for namespace in ["127.0.0.1".to_owned(), format!("127.0.0.1:{port}")] {
        let elsewhere = fleet
            .store
            .list_ownership(&namespace, HUB, GROUP)
            .await
            .unwrap();
        assert_eq!(elsewhere, Vec::new(), "ownership under {namespace}");
    }

    // Each partition's events go to its owner, once, in order, and to nobody else.
    fleet.send(0, 20).await;
    let before = fleet.wait_processed(0, 20).await;
    for (owner, partitions) in &owners {
        for p in partitions {
            for member in members {
                let expected: Vec<i64> = if member == owner {
                    (0..20).collect()
                } else {
                    Vec::new()
                };
                assert_eq!(
                    of(&before, member, p),
                    expected,
                    "{member} on partition {p} (owner {owner})"
                );
            }
        }
    }

    // The victim checkpoints after each batch; once its checkpoints are in the store, kill -9
    // it: no relinquishing, nothing more written.
    let victims_partitions = &owners["p1"];
    fleet.wait_checkpointed(victims_partitions, 19).await;
    let mut victim = fleet.tributary.remove(1);
    assert_eq!(victim.name, "p1");
    victim.child.start_kill().unwrap();
    victim.child.wait().await.unwrap();
    let killed = std::time::Instant::now();
    fleet.send(20, 10).await;
    let survivors = ["javascript", "p0", "python"];
    fleet.wait_split(&survivors, &[5, 5, 6]).await;
    fleet.wait_one_receiver_each().await;
    let processed = fleet.wait_processed(20, 30).await;
    eprintln!(
        "the victim's partitions resumed and the split stable {:?} after the kill",
        killed.elapsed()
    );
    assert_eq!(events_in(&victim.out), before["p1"]);
    for p in victims_partitions {
        // Resumed right after the checkpoint at 19: no gap, nothing processed twice.
        let mut resumed: Vec<i64> = survivors
            .iter()
            .flat_map(|m| of(&processed, m, p))
            .collect();
        resumed.sort_unstable();
        assert_eq!(resumed, (20..30).collect::<Vec<_>>(), "partition {p}");
    }
    for official in &mut fleet.official {
        official.drain_balancing_errors();
    }
    let doubly_read = fleet.doubly_read.lock().unwrap().clone();
    assert_eq!(
        doubly_read,
        Vec::<String>::new(),
        "partitions with two receivers at once"
    );
}
