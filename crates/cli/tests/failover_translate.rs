//! Consumer failover by checkpoint translation, as an operator runs it: a replication task
//! copies a source hub into a replica (over AMQP, keeping its offset map); a processor on the
//! source processes part of the stream and checkpoints; the source goes away;
//! `tributary failover translate-checkpoints` rewrites the group's checkpoints for the replica;
//! a processor on the replica resumes — never after an event it had not processed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tributary_broker::{BrokerSource, SendTarget};
use tributary_event::{EventData, EventPosition, PropertyValue, ReceivedEvent, partition_for_key};
use tributary_processor::{
    CheckpointStore, EventProcessorHost, ProcessorOptions, SqliteCheckpointStore, processor_fn,
};
use tributary_replicate::offset_map::{self, SyncPolicy};
use tributary_replicate::{Replicator, StartOptions, TaskConfig};
use tributary_testkit::{TestHub, within};

const SOURCE_PARTITIONS: u32 = 4;
const EVENTS_PER_PARTITION: i64 = 150;
const BATCH: u32 = 10;
const GROUP: &str = "app";
const SOURCE_NS: &str = "source.example";
const REPLICA_NS: &str = "replica.example";

/// How far the source processor gets in each source partition that holds events (inclusive):
/// 40 % of the way in partition 0, 50 % in 1, …, so the replica's partitions mix events from
/// partitions at different points.
fn limits(ends: &HashMap<u32, i64>) -> HashMap<u32, i64> {
    ends.iter()
        .filter(|(_, end)| **end >= 0)
        .map(|(p, end)| (*p, end * (4 + i64::from(*p)) / 10))
        .collect()
}

/// Starts the task copying `orders` from `source` to `replica`, syncing offsets often.
async fn start_task(dir: &Path, source: &TestHub, replica: &TestHub, keyed: bool) -> Replicator {
    source
        .broker
        .create_consumer_group("orders", "replication")
        .await
        .unwrap();
    let task = dir.join("copy.toml");
    let text = format!(
        "name = \"copy\"\n[source]\nconnection_string = \"{}\"\nevent_hub = \"orders\"\n\
         consumer_group = \"replication\"\nbatch_events_max = {BATCH}\nprefetch = {BATCH}\n\
         checkpoint_store = \"{}\"\n[[target]]\nname = \"replica\"\nconnection_string = \"{}\"\n\
         event_hub = \"orders\"\nkeep_partition = {}\n[processor]\nload_balancing_interval = \"200ms\"\n\
         [offset_map]\nevery_events = 7\nevery = \"300ms\"\n",
        source.connection_string,
        dir.join("task.sqlite").display(),
        replica.connection_string,
        !keyed
    );
    std::fs::write(&task, &text).unwrap();
    let config = TaskConfig::parse(&task, &text).unwrap();
    assert_eq!(
        config.offset_sync,
        SyncPolicy {
            every_events: 7,
            every: Duration::from_millis(300),
        }
    );
    Replicator::start(&config, StartOptions::default())
        .await
        .unwrap()
}

/// Sends the stream in rounds (so the task reads it in many batches); keyed events go by key.
/// Nothing goes to the source partition `empty`, if one is named (keys that hash there are
/// left out). Returns each source partition's last sequence number.
async fn send_stream(source: &TestHub, keyed: bool, empty: Option<u32>) -> HashMap<u32, i64> {
    let free = |key: &String| Some(partition_for_key(key, SOURCE_PARTITIONS)) != empty;
    for round in 0..EVENTS_PER_PARTITION / 10 {
        for partition in (0..SOURCE_PARTITIONS).filter(|p| Some(*p) != empty) {
            let events: Vec<EventData> = (0..10)
                .map(|i| {
                    let mut event = EventData::new(format!("r{round}-p{partition}-{i}"));
                    if keyed {
                        let key = (0..)
                            .map(|n| format!("key-{}", (i * 7 + round + n) % 23))
                            .find(free);
                        event.partition_key = key;
                    }
                    event
                })
                .collect();
            if keyed {
                for event in events {
                    let key = event.partition_key.clone().unwrap();
                    let to = SendTarget::PartitionKey(key);
                    source.broker.send("orders", to, vec![event]).await.unwrap();
                }
            } else {
                let to = SendTarget::Partition(partition.to_string());
                source.broker.send("orders", to, events).await.unwrap();
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (0..SOURCE_PARTITIONS)
        .map(|p| {
            let properties = source.broker.partition_properties("orders", &p.to_string());
            (p, properties.unwrap().last_enqueued_sequence_number)
        })
        .collect()
}

fn text(event: &ReceivedEvent, key: &str) -> String {
    match event.data.property(key) {
        Some(PropertyValue::String(v)) => v.to_string(),
        other => panic!("{key}: {other:?}"),
    }
}

/// The source position (partition, sequence number) a replicated event came from.
fn origin(event: &ReceivedEvent) -> (u32, i64) {
    (
        text(event, "repl-partition").parse().unwrap(),
        text(event, "repl-sequence").parse().unwrap(),
    )
}

/// Waits until the replica holds every one of the source's `sent` events.
async fn wait_replicated(replica: &TestHub, partitions: u32, sent: usize) {
    within("the task to copy everything", async {
        loop {
            let mut copied = BTreeSet::new();
            for t in 0..partitions {
                copied.extend(replica.read_all("orders", t).await.iter().map(origin));
            }
            if copied.len() >= sent {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
}

/// A processor on the source that processes each partition up to its limit and checkpoints
/// there; returns the checkpoints it left.
async fn process_part_of_source(
    source: &TestHub,
    store: &Path,
    limits: &HashMap<u32, i64>,
) -> HashMap<String, i64> {
    source
        .broker
        .create_consumer_group("orders", GROUP)
        .await
        .unwrap();
    let store = Arc::new(SqliteCheckpointStore::open(store).await.unwrap());
    let shared = Arc::new(limits.clone());
    let factory = processor_fn(move |context, events: Vec<ReceivedEvent>| {
        let limit = shared[&context.partition_id().parse::<u32>().unwrap()];
        async move {
            if let Some(last) = events.iter().rev().find(|e| e.sequence_number <= limit) {
                context.checkpoint_at(last).await.unwrap();
            }
        }
    });
    let host = host(
        BrokerSource::new(source.broker.clone(), SOURCE_NS, "orders"),
        EventPosition::Earliest,
        store.clone(),
        factory,
    );
    let checkpoints = within("the source processor to reach its limits", async {
        loop {
            let listed = store
                .list_checkpoints(SOURCE_NS, "orders", GROUP)
                .await
                .unwrap();
            let at: HashMap<String, i64> = listed
                .iter()
                .map(|c| (c.partition_id.clone(), c.sequence_number.unwrap()))
                .collect();
            if limits
                .iter()
                .all(|(p, limit)| at.get(&p.to_string()) == Some(limit))
            {
                return at;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    host.shutdown().await.unwrap();
    checkpoints
}

/// A processor host of the group on `source`; partitions without a checkpoint start at
/// `initial`.
fn host(
    source: BrokerSource,
    initial: EventPosition,
    store: Arc<SqliteCheckpointStore>,
    factory: impl tributary_processor::EventProcessorFactory,
) -> tributary_processor::RunningHost {
    let options = ProcessorOptions {
        consumer_group: GROUP.to_owned(),
        batch_events_max: 25,
        load_balancing_interval: Duration::from_millis(100),
        ..ProcessorOptions::default()
    }
    .with_initial_position(move |_| initial);
    EventProcessorHost::builder(Arc::new(source), store, factory)
        .options(options)
        .build()
        .unwrap()
        .start()
        .unwrap()
}

fn translate(dir: &Path, extra: &[&str]) -> String {
    let map = offset_map::path_for(&dir.join("task.sqlite"));
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tributary"))
        .args(["failover", "translate-checkpoints", "--offset-map"])
        .arg(&map)
        .args(["--group", GROUP, "--source-hub", "orders"])
        .args([
            "--source-namespace",
            SOURCE_NS,
            "--target-namespace",
            REPLICA_NS,
        ])
        .arg("--source-store")
        .arg(dir.join("source-groups.sqlite"))
        .arg("--target-store")
        .arg(dir.join("replica-groups.sqlite"))
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// Runs a processor on the replica from the translated checkpoints until it has read every
/// partition to its end; returns the source positions of what it processed.
async fn process_replica(replica: &TestHub, partitions: u32, store: &Path) -> Vec<(u32, i64)> {
    replica
        .broker
        .create_consumer_group("orders", GROUP)
        .await
        .unwrap();
    let store = Arc::new(SqliteCheckpointStore::open(store).await.unwrap());
    let seen: Arc<Mutex<Vec<(u32, i64)>>> = Arc::default();
    let sink = Arc::clone(&seen);
    let factory = processor_fn(move |context, events: Vec<ReceivedEvent>| {
        sink.lock().unwrap().extend(events.iter().map(origin));
        async move {
            if let Some(last) = events.last() {
                context.checkpoint_at(last).await.unwrap();
            }
        }
    });
    let source = BrokerSource::new(replica.broker.clone(), REPLICA_NS, "orders");
    // A partition left without a checkpoint would miss everything: translation must cover all.
    let host = host(source, EventPosition::Latest, store.clone(), factory);
    let ends: BTreeMap<String, i64> = (0..partitions)
        .map(|t| {
            let last = replica
                .broker
                .partition_properties("orders", &t.to_string());
            (t.to_string(), last.unwrap().last_enqueued_sequence_number)
        })
        .collect();
    within(
        "the replica processor to reach every partition's end",
        async {
            loop {
                let listed = store
                    .list_checkpoints(REPLICA_NS, "orders", GROUP)
                    .await
                    .unwrap();
                let at: BTreeMap<String, i64> = listed
                    .iter()
                    .map(|c| (c.partition_id.clone(), c.sequence_number.unwrap()))
                    .collect();
                if at == ends {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        },
    )
    .await;
    host.shutdown().await.unwrap();
    seen.lock().unwrap().clone()
}

/// What a failover left: the source's ends and the group's checkpoints there, the translation
/// table, and the source positions the processor on the replica processed.
struct FailedOver {
    ends: HashMap<u32, i64>,
    checkpoints: HashMap<String, i64>,
    table: String,
    seen: Vec<(u32, i64)>,
}

impl FailedOver {
    /// Never after an unprocessed event: everything past each source checkpoint (all of a
    /// partition the group never checkpointed) came again.
    fn assert_nothing_skipped(&self) {
        let seen: BTreeSet<(u32, i64)> = self.seen.iter().copied().collect();
        for partition in 0..SOURCE_PARTITIONS {
            let done = self.checkpoints.get(&partition.to_string()).copied();
            for sequence in done.unwrap_or(-1) + 1..=self.ends[&partition] {
                assert!(
                    seen.contains(&(partition, sequence)),
                    "source event {partition}/{sequence} (after checkpoint {done:?}) was skipped on the replica\n{}",
                    self.table
                );
            }
        }
    }

    /// How many events of each source partition the group had processed came again.
    fn replayed(&self) -> BTreeMap<u32, usize> {
        let mut replayed = BTreeMap::new();
        for (partition, sequence) in &self.seen {
            if *sequence <= self.checkpoints[&partition.to_string()] {
                *replayed.entry(*partition).or_default() += 1;
            }
        }
        replayed
    }

    fn processed(&self) -> i64 {
        self.checkpoints.values().map(|c| c + 1).sum()
    }
}

async fn fail_over(replica_partitions: u32, keyed: bool, empty: Option<u32>) -> FailedOver {
    let dir = tempfile::tempdir().unwrap();
    let source = TestHub::start(&[("orders", SOURCE_PARTITIONS)]).await;
    let replica = TestHub::start(&[("orders", replica_partitions)]).await;
    let task = start_task(dir.path(), &source, &replica, keyed).await;
    let ends = send_stream(&source, keyed, empty).await;
    let sent = ends.values().map(|end| end + 1).sum::<i64>() as usize;
    wait_replicated(&replica, replica_partitions, sent).await;
    let source_groups = dir.path().join("source-groups.sqlite");
    let checkpoints = process_part_of_source(&source, &source_groups, &limits(&ends)).await;
    // Long enough for an idle partition's sync (every 300 ms) to be taken.
    tokio::time::sleep(Duration::from_secs(1)).await;
    task.shutdown().await.unwrap();
    source.stop().await; // the source is gone: translation reads only the map and the stores

    let table = translate(dir.path(), &["--dry-run"]);
    assert_eq!(
        table.lines().count(),
        replica_partitions as usize + 1,
        "{table}"
    );
    let placed = |line: &&str| empty.is_none_or(|p| !line.starts_with(&format!("replica\t{p}\t")));
    assert!(
        !table
            .lines()
            .filter(placed)
            .any(|line| line.contains("(beginning)")),
        "every partition that holds events translates\n{table}"
    );
    assert!(
        !dir.path().join("replica-groups.sqlite").exists(),
        "--dry-run writes nothing"
    );
    translate(dir.path(), &[]);
    let replica_store = dir.path().join("replica-groups.sqlite");
    let seen = process_replica(&replica, replica_partitions, &replica_store).await;
    replica.stop().await;
    FailedOver {
        ends,
        checkpoints,
        table,
        seen,
    }
}

/// Every source partition bounds every replica partition (a key may route anywhere), so the
/// replay reaches back to the least advanced partition's checkpoint: a share, not all.
fn assert_keyed_replay_is_a_share(failed: &FailedOver) {
    let replayed: usize = failed.replayed().values().sum();
    let processed = failed.processed();
    assert!(
        (replayed as i64) < processed * 3 / 4,
        "{replayed} of {processed} processed events came again\n{}",
        failed.table
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processor_moved_to_a_mirror_resumes_without_skipping() {
    let failed = fail_over(SOURCE_PARTITIONS, false, None).await;
    failed.assert_nothing_skipped();
    assert_keyed_replay_is_a_share(&failed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_routing_into_fewer_partitions_resumes_without_skipping() {
    let failed = fail_over(3, true, None).await;
    failed.assert_nothing_skipped();
    assert_keyed_replay_is_a_share(&failed);
}

/// A source partition that never received an event (no checkpoint, no sync from a batch)
/// neither sends the mirror's other partitions back to their beginning nor widens their
/// replay: each replays at most about one sync's worth (a sync every 7 events, batches of 10).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_source_partition_leaves_the_others_replaying_one_sync_at_most() {
    let failed = fail_over(SOURCE_PARTITIONS, false, Some(3)).await;
    failed.assert_nothing_skipped();
    let replayed = failed.replayed();
    assert!(
        replayed.values().all(|n| *n <= 2 * BATCH as usize),
        "replayed per source partition: {replayed:?}\n{}",
        failed.table
    );
}

/// The same when the task routes by key: the empty partition's idle sync places it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_routing_with_an_empty_source_partition_resumes_without_replaying_everything() {
    let failed = fail_over(3, true, Some(3)).await;
    failed.assert_nothing_skipped();
    assert_keyed_replay_is_a_share(&failed);
}
