//! Replication tasks between real hubs, each with its own broker and AMQP door: copy with equal
//! and different partition counts, a second hop, mirrored hubs without loops, a dead-letter
//! target, the official Python SDK reading what a task wrote, and (in `edit`) the editor's
//! steps and routing conditions.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use tributary_broker::{HubSpec, SendTarget};
use tributary_event::{EventData, PropertyValue, ReceivedEvent, partition_for_key};
use tributary_replicate::metadata::{self, hops};
use tributary_replicate::{Replicator, StartOptions, TaskConfig};
use tributary_testkit::{TestHub, within};

#[path = "replicate/edit.rs"]
mod edit;
#[path = "replicate/mesh.rs"]
mod mesh;

/// A task file in `dir` with `text`, checked.
fn task(dir: &Path, name: &str, text: &str) -> TaskConfig {
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, text).expect("task file written");
    TaskConfig::load(&file).unwrap_or_else(|e| panic!("{e}"))
}

/// A copy task from `from`'s hub to `to`'s, reading in the consumer group `replication` (so a
/// test's own readers on `$Default` do not meet the task's epoch receivers).
async fn copy_task(
    dir: &Path,
    name: &str,
    from: &TestHub,
    to: &TestHub,
    extra: &str,
) -> TaskConfig {
    let _ = from
        .broker
        .create_consumer_group("orders", "replication")
        .await;
    let text = format!(
        r#"
name = "{name}"
[source]
connection_string = "{source}"
event_hub = "orders"
consumer_group = "replication"
batch_events_max = 50
[[target]]
name = "copy"
connection_string = "{target}"
event_hub = "orders"
{extra}
[retry]
backoff_min = "50ms"
backoff_max = "1s"
[processor]
load_balancing_interval = "100ms"
ownership_expiration = "1s"
"#,
        source = from.connection_string,
        target = to.connection_string,
    );
    task(dir, name, &text)
}

fn string(event: &EventData, key: &str) -> Option<String> {
    match event.property(key) {
        Some(PropertyValue::String(value)) => Some(value.to_string()),
        _ => None,
    }
}

/// Everything `hub` holds, by partition.
async fn contents(hub: &TestHub, partitions: u32) -> BTreeMap<u32, Vec<ReceivedEvent>> {
    let mut all = BTreeMap::new();
    for partition in 0..partitions {
        all.insert(partition, hub.read_all("orders", partition).await);
    }
    all
}

/// Waits until `hub` holds at least `count` events.
async fn wait_for(
    hub: &TestHub,
    partitions: u32,
    count: usize,
) -> BTreeMap<u32, Vec<ReceivedEvent>> {
    within("the target to fill", async {
        loop {
            let all = contents(hub, partitions).await;
            if all.values().map(Vec::len).sum::<usize>() >= count {
                return all;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

/// 40 events over 8 keys and 20 keyless ones, with every field a producer can set.
async fn produce(hub: &TestHub, tag: &str) -> usize {
    for i in 0..40 {
        let key = format!("home-{}", i % 8);
        let mut event = EventData::new(format!("{tag}-{i}"))
            .with_property("n", PropertyValue::Int64(i))
            .with_property("kind", PropertyValue::String("motion".into()));
        event.content_type = Some("text/plain".into());
        event.message_id = Some(format!("{tag}-m{i}"));
        event.correlation_id = Some(format!("c{i}"));
        hub.broker
            .send("orders", SendTarget::PartitionKey(key), vec![event])
            .await
            .expect("sent");
    }
    for i in 0..20 {
        let mut event = EventData::new(format!("{tag}-free-{i}"));
        if i % 5 == 0 {
            event.protocol_sections = with_delivery_annotation(&format!("{tag}-{i}"));
        }
        let events = vec![event];
        let to = SendTarget::Partition((i % 4).to_string());
        hub.broker.send("orders", to, events).await.expect("sent");
    }
    60
}

/// The kept protocol sections of an event whose producer sent the delivery annotation
/// `delann_key` = `value` (as Event Hubs keeps and delivers it).
fn with_delivery_annotation(value: &str) -> Option<bytes::Bytes> {
    use fe2o3_amqp_types::messaging::DeliveryAnnotations;
    use fe2o3_amqp_types::messaging::annotations::{Annotations, OwnedKey};
    use fe2o3_amqp_types::primitives::Value;
    let mut annotations = Annotations::new();
    annotations.insert(OwnedKey::from("delann_key"), Value::String(value.into()));
    let message = tributary_eventhubs::message::AmqpMessage {
        delivery_annotations: Some(DeliveryAnnotations(annotations)),
        ..tributary_eventhubs::message::empty_message()
    };
    tributary_eventhubs::ingest::event_from_message(message, false)
        .expect("a message with delivery annotations")
        .protocol_sections
}

/// The delivery annotations an event keeps, as its debug text (empty for none).
fn delivery_annotations(event: &EventData) -> String {
    event
        .protocol_sections
        .as_deref()
        .and_then(|kept| tributary_eventhubs::ingest::decode_strict(kept).ok())
        .and_then(|kept| kept.delivery_annotations)
        .map(|d| format!("{:?}", d.0))
        .unwrap_or_default()
}

fn hub_id(hub: &TestHub) -> String {
    hub.broker.describe_hub("orders").expect("hub").id
}

/// `to` holds what `from` (one source partition) held, per-key in order, unmodified, stamped.
fn assert_copied(
    partition: u32,
    from: &[ReceivedEvent],
    to: &[ReceivedEvent],
    source: &TestHub,
    target: &TestHub,
) {
    assert_eq!(
        from.len(),
        to.len(),
        "partition {partition} keeps its events"
    );
    // Per-key order (and keyless order, one group per partition) is kept; events of
    // different keys may interleave differently.
    let order = |events: &[ReceivedEvent]| {
        let mut per_key: BTreeMap<Option<String>, Vec<bytes::Bytes>> = BTreeMap::new();
        for e in events {
            per_key
                .entry(e.data.partition_key.clone())
                .or_default()
                .push(e.data.body.clone());
        }
        per_key
    };
    assert_eq!(
        order(from),
        order(to),
        "partition {partition}: per-key order"
    );
    for b in to {
        let a = from
            .iter()
            .find(|a| a.data.body == b.data.body)
            .expect("copied from the source");
        assert_eq!(a.data.body, b.data.body);
        assert_eq!(a.data.partition_key, b.data.partition_key);
        assert_eq!(a.data.content_type, b.data.content_type);
        assert_eq!(a.data.message_id, b.data.message_id);
        assert_eq!(a.data.correlation_id, b.data.correlation_id);
        assert_eq!(
            delivery_annotations(&a.data),
            delivery_annotations(&b.data),
            "a producer's delivery annotations travel with the event"
        );
        assert_eq!(
            &b.data.properties[..a.data.properties.len()],
            &a.data.properties[..]
        );
        assert_eq!(
            string(&b.data, metadata::SEQUENCE),
            Some(a.sequence_number.to_string())
        );
        assert_eq!(
            string(&b.data, metadata::OFFSET),
            Some(a.offset.to_string())
        );
        let time = metadata::format_enqueued_time(a.enqueued_time_ms);
        assert_eq!(
            string(&b.data, metadata::ENQUEUED_TIME),
            Some(time.to_string())
        );
        assert_eq!(string(&b.data, metadata::ORIGIN), Some(hub_id(source)));
        let path = format!("{};{}", hub_id(source), hub_id(target));
        assert_eq!(string(&b.data, metadata::PATH), Some(path));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_between_equal_hubs_keeps_partitions_order_properties_and_adds_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let (source, target) = (
        TestHub::start(&[("orders", 4)]).await,
        TestHub::start(&[("orders", 4)]).await,
    );
    let sent = produce(&source, "a").await;
    let config = copy_task(
        dir.path(),
        "equal",
        &source,
        &target,
        "keep_partition = true",
    )
    .await;
    let replicator = Replicator::start(&config, StartOptions::default())
        .await
        .expect("starts");
    let copied = wait_for(&target, 4, sent).await;
    let original = contents(&source, 4).await;
    let annotated = original.values().flatten();
    assert_eq!(
        annotated
            .filter(|e| !delivery_annotations(&e.data).is_empty())
            .count(),
        4,
        "the source holds the events produced with delivery annotations"
    );
    for partition in 0..4 {
        assert_copied(
            partition,
            &original[&partition],
            &copied[&partition],
            &source,
            &target,
        );
    }
    let snapshot = replicator.metrics().snapshot();
    assert_eq!(snapshot.totals().0, sent as u64);
    assert_eq!(snapshot.totals().1, sent as u64);
    assert!(snapshot.lag_count >= sent as u64);
    python_reads_the_metadata_as_strings(&target).await;
    replicator.shutdown().await.expect("stops");
}

/// The official SDK sees the stamps as string properties.
async fn python_reads_the_metadata_as_strings(target: &TestHub) {
    let args = json!({"conn": target.connection_string, "hub": "orders", "partition": 0,
                      "position": "earliest", "count": 1});
    let consumed = tributary_testkit::run_python("interop.py", "consume", args).await;
    let properties = &consumed["events"][0]["properties"];
    for key in [
        metadata::ENQUEUED_TIME,
        metadata::OFFSET,
        metadata::SEQUENCE,
        metadata::ORIGIN,
    ] {
        // The SDK hands string properties to the application as bytes.
        assert_eq!(properties[key][0], "bytes", "{key}: {consumed}");
    }
    let sequence = hex_text(properties[metadata::SEQUENCE][1].as_str().unwrap());
    assert!(sequence.parse::<i64>().is_ok(), "{sequence}");
}

fn hex_text(hex: &str) -> String {
    let bytes: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    String::from_utf8(bytes).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_to_fewer_partitions_routes_by_key_and_a_second_hop_appends() {
    let dir = tempfile::tempdir().unwrap();
    let source = TestHub::start(&[("orders", 4)]).await;
    let middle = TestHub::start(&[("orders", 3)]).await;
    let last = TestHub::start(&[("orders", 2)]).await;
    let sent = produce(&source, "b").await;
    let first = Replicator::start(
        &copy_task(dir.path(), "first", &source, &middle, "").await,
        StartOptions::default(),
    )
    .await
    .expect("starts");
    let second = Replicator::start(
        &copy_task(dir.path(), "second", &middle, &last, "").await,
        StartOptions::default(),
    )
    .await
    .expect("starts");
    let copied = wait_for(&middle, 3, sent).await;
    for (partition, events) in &copied {
        let mut per_key: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        for event in events {
            if let Some(key) = &event.data.partition_key {
                assert_eq!(
                    partition_for_key(key, 3),
                    *partition,
                    "{key} goes by its hash"
                );
                let n = match event.data.property("n") {
                    Some(PropertyValue::Int64(n)) => *n,
                    other => panic!("{other:?}"),
                };
                per_key.entry(key).or_default().push(n);
            }
        }
        for (key, order) in per_key {
            assert!(
                order.windows(2).all(|w| w[0] < w[1]),
                "{key} in order: {order:?}"
            );
        }
    }
    let twice = wait_for(&last, 2, sent).await;
    for event in twice.values().flatten() {
        let hops = hops(&event.data);
        assert_eq!(hops.len(), 2, "{:?}", event.data.properties);
        assert!(
            hops.iter()
                .all(|h| h.sequence_number.is_some() && h.enqueued_time_ms.is_some())
        );
        let path = string(&event.data, metadata::PATH).unwrap();
        assert_eq!(path.split(';').count(), 3, "{path}");
        assert_eq!(string(&event.data, metadata::ORIGIN), Some(hub_id(&source)));
    }
    first.shutdown().await.unwrap();
    second.shutdown().await.unwrap();
}

/// What makes an event unique across hubs: its origin, and its partition and sequence number
/// there.
fn identity(hub: &TestHub, partition: u32, event: &ReceivedEvent) -> (String, String, i64) {
    match metadata::origin(&event.data) {
        Some(origin) => {
            let first = &hops(&event.data)[0];
            (
                origin.to_owned(),
                first.partition_id.clone().unwrap(),
                first.sequence_number.unwrap(),
            )
        }
        None => (hub_id(hub), partition.to_string(), event.sequence_number),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_hub_mesh_holds_every_event_once_per_hub_and_never_loops() {
    let dir = tempfile::tempdir().unwrap();
    let hubs = [
        TestHub::start(&[("orders", 2)]).await,
        TestHub::start(&[("orders", 2)]).await,
        TestHub::start(&[("orders", 2)]).await,
    ];
    let mut replicators = Vec::new();
    for (i, from) in hubs.iter().enumerate() {
        for (j, to) in hubs.iter().enumerate() {
            if i != j {
                let name = format!("mesh-{i}-{j}");
                let config = copy_task(dir.path(), &name, from, to, "").await;
                // A consumer group per task, as each reading application has its own: two
                // tasks in one group would take each other's partitions with their owner levels.
                from.broker
                    .create_consumer_group("orders", &name)
                    .await
                    .unwrap();
                let mut text = std::fs::read_to_string(&config.file).unwrap().replace(
                    "consumer_group = \"replication\"",
                    &format!("consumer_group = \"{name}\""),
                );
                text.push_str("[merge]\nforward_replicated = false\n");
                let config = task(dir.path(), &name, &text);
                replicators.push(
                    Replicator::start(&config, StartOptions::default())
                        .await
                        .expect("starts"),
                );
            }
        }
    }
    let mut produced = 0;
    for (i, hub) in hubs.iter().enumerate() {
        for n in 0..30 {
            let event = EventData::new(format!("hub{i}-{n}"));
            let to = SendTarget::PartitionKey(format!("k{n}"));
            hub.broker.send("orders", to, vec![event]).await.unwrap();
            produced += 1;
        }
    }
    for hub in &hubs {
        let all = wait_for(hub, 2, produced).await;
        let identities: BTreeSet<_> = all
            .iter()
            .flat_map(|(p, events)| events.iter().map(|e| identity(hub, *p, e)))
            .collect();
        let bodies: BTreeSet<_> = all
            .values()
            .flatten()
            .map(|e| e.data.body.clone())
            .collect();
        assert_eq!(bodies.len(), produced, "every event reached every hub");
        assert_eq!(identities.len(), produced, "every event reached every hub");
    }
    // Replication is idle once every hub has everything: nothing more arrives (no loop).
    tokio::time::sleep(Duration::from_secs(1)).await;
    for hub in &hubs {
        let held: usize = contents(hub, 2).await.values().map(Vec::len).sum();
        assert_eq!(
            held, produced,
            "each event once per hub (no retries happened here)"
        );
    }
    for replicator in replicators {
        replicator.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_mirrored_hubs_forwarding_replicated_events_still_do_not_loop() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (
        TestHub::start(&[("orders", 2)]).await,
        TestHub::start(&[("orders", 2)]).await,
    );
    let there = Replicator::start(
        &copy_task(dir.path(), "ab", &a, &b, "").await,
        StartOptions::default(),
    )
    .await
    .unwrap();
    let back = Replicator::start(
        &copy_task(dir.path(), "ba", &b, &a, "").await,
        StartOptions::default(),
    )
    .await
    .unwrap();
    for n in 0..20 {
        a.send("orders", &(n % 2).to_string(), &format!("a{n}"))
            .await;
        b.send("orders", &(n % 2).to_string(), &format!("b{n}"))
            .await;
    }
    wait_for(&a, 2, 40).await;
    wait_for(&b, 2, 40).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        contents(&a, 2).await.values().map(Vec::len).sum::<usize>(),
        40
    );
    assert_eq!(
        contents(&b, 2).await.values().map(Vec::len).sum::<usize>(),
        40
    );
    let loops: u64 = back
        .metrics()
        .snapshot()
        .partitions
        .values()
        .map(|p| p.filtered.values().sum::<u64>())
        .sum();
    assert_eq!(loops, 20, "b's copies of a's events are not sent back");
    there.shutdown().await.unwrap();
    back.shutdown().await.unwrap();
}

async fn mirror_contents(hub: &TestHub) -> Vec<ReceivedEvent> {
    let mut held = Vec::new();
    for partition in 0..2 {
        held.extend(hub.read_all("mirror", partition).await);
    }
    held
}

/// Copies `orders` from `source` to `mirror` on `target`, forwarding only events produced at
/// the source and writing Azure's merge marker.
async fn azure_mesh_task(dir: &Path, source: &TestHub, target: &TestHub) -> TaskConfig {
    let _ = source
        .broker
        .create_consumer_group("orders", "replication")
        .await;
    let text = format!(
        r#"
name = "azure-mesh"
[source]
connection_string = "{source}"
event_hub = "orders"
consumer_group = "replication"
[[target]]
name = "mirror"
connection_string = "{target}"
event_hub = "mirror"
[merge]
forward_replicated = false
azure_marker = true
[processor]
load_balancing_interval = "100ms"
ownership_expiration = "1s"
"#,
        source = source.connection_string,
        target = target.connection_string,
    );
    task(dir, "azure-mesh", &text)
}

/// A task in a mesh with Azure's `EventHubMerge` functions: what they copied into the source
/// (`repl-target` = the source hub's name) is not copied back out, and what the task forwards
/// carries `repl-target` = the target hub's name, so their function does not copy it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_shares_a_mesh_with_azures_merge_functions() {
    let dir = tempfile::tempdir().unwrap();
    let (source, target) = (
        TestHub::start(&[("orders", 2)]).await,
        TestHub::start(&[("mirror", 2)]).await,
    );
    let config = azure_mesh_task(dir.path(), &source, &target).await;
    let replicator = Replicator::start(&config, StartOptions::default())
        .await
        .unwrap();
    for n in 0..10 {
        let native = EventData::new(format!("native-{n}"));
        // As Azure's function writes it, in another case: hub names compare case-insensitively.
        let copied_in = EventData::new(format!("copied-in-{n}")).with_property(
            metadata::AZURE_MERGE_TARGET,
            PropertyValue::String("Orders".into()),
        );
        let to = SendTarget::PartitionKey(format!("k{n}"));
        source
            .broker
            .send("orders", to, vec![native, copied_in])
            .await
            .unwrap();
    }
    within("the mirror to fill", async {
        while mirror_contents(&target).await.len() < 10 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = mirror_contents(&target).await;
    let bodies: BTreeSet<_> = held.iter().map(|e| e.data.body.clone()).collect();
    let expected: BTreeSet<_> = (0..10)
        .map(|n| format!("native-{n}").into_bytes().into())
        .collect();
    assert_eq!(
        bodies, expected,
        "only the events produced at the source are copied"
    );
    for event in &held {
        assert_eq!(
            string(&event.data, metadata::AZURE_MERGE_TARGET).as_deref(),
            Some("mirror")
        );
    }
    replicator.shutdown().await.unwrap();
}

async fn wait_for_dead_letters(hub: &TestHub) -> Vec<ReceivedEvent> {
    within("the dead letter", async {
        loop {
            let dead = hub.read_all("dead", 0).await;
            if !dead.is_empty() {
                return dead;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_the_target_refuses_goes_to_the_dead_letter_hub_and_the_rest_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let source = TestHub::start(&[("orders", 1)]).await;
    let target = TestHub::start_in(
        tempfile::tempdir().unwrap(),
        &[("orders", 1)],
        |config| {
            config.log.event_bytes_max = 2048;
        },
        None,
    )
    .await;
    source
        .broker
        .create_hub(HubSpec::new("dead", 1))
        .await
        .unwrap();
    for n in 0..10 {
        let body = if n == 4 {
            "x".repeat(4000)
        } else {
            format!("ok-{n}")
        };
        source.send("orders", "0", &body).await;
    }
    let extra = format!(
        "[dead_letter]\nconnection_string = \"{}\"\nevent_hub = \"dead\"\n",
        source.connection_string
    );
    let mut text =
        std::fs::read_to_string(copy_task(dir.path(), "dl", &source, &target, "").await.file)
            .unwrap();
    text.push_str(&extra);
    let config = task(dir.path(), "dl", &text);
    let replicator = Replicator::start(&config, StartOptions::default())
        .await
        .unwrap();
    let copied = wait_for(&target, 1, 9).await;
    let bodies: Vec<String> = copied[&0]
        .iter()
        .map(|e| String::from_utf8_lossy(&e.data.body).into_owned())
        .collect();
    let expected: Vec<String> = (0..10)
        .filter(|n| *n != 4)
        .map(|n| format!("ok-{n}"))
        .collect();
    assert_eq!(bodies, expected, "everything else, in order");
    let dead = wait_for_dead_letters(&source).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].data.body.len(), 4000);
    let reason = string(&dead[0].data, tributary_replicate::DEAD_LETTER_REASON).unwrap();
    assert!(
        reason.contains("too large") || reason.contains("2048"),
        "{reason}"
    );
    assert_eq!(
        string(&dead[0].data, tributary_replicate::DEAD_LETTER_ROUTE).as_deref(),
        Some("copy")
    );
    assert_eq!(
        string(&dead[0].data, metadata::SEQUENCE).as_deref(),
        Some("4")
    );
    let snapshot = replicator.metrics().snapshot();
    assert_eq!(snapshot.partitions["0"].dead_lettered, 1);
    assert_eq!(snapshot.partitions["0"].checkpoint_sequence, 9);
    replicator.shutdown().await.unwrap();
}

#[test]
fn a_task_file_error_names_the_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    let cases = [
        (
            "name = \"x\"\n[source]\ndata_dir = \".\"\nevent_hub = \"o\"\nbogus = 1\n",
            ":5",
            "source.bogus: unknown key \"bogus\"",
        ),
        (
            "name = \"x\"\n[source]\ndata_dir = \".\"\nevent_hub = \"o\"\n[[target]]\nname = \"t\"\ndata_dir = \".\"\nevent_hub = \"o\"\nconsumer_group = \"g\"\n",
            ":5",
            "target \"t\".consumer_group",
        ),
        (
            "name = \"x\"\n[source]\ndata_dir = \".\"\nevent_hub = \"o\"\n[[target]]\nname = \"t\"\ndata_dir = \".\"\nevent_hub = \"o\"\n[retry]\nbackoff_max = \"soon\"\n",
            ":10",
            "retry.backoff_max",
        ),
        (
            "name = \"x\"\n[source]\nconnection_string_env = \"TRIBUTARY_NOT_SET_ANYWHERE\"\nevent_hub = \"o\"\n[[target]]\nname = \"t\"\ndata_dir = \".\"\nevent_hub = \"o\"\n",
            ":2",
            "source.connection_string_env",
        ),
        (
            "name = \"x\"\n[source]\ndata_dir = \".\"\nevent_hub = \"o\"\n[[target]]\nname = \"t\"\ndata_dir = \".\"\nevent_hub = \"o\"\n[routing]\nunmatched = \"elsewhere\"\n",
            ":10",
            "routing.unmatched",
        ),
        (
            "name = \"x\"\n[source]\ndata_dir = \".\"\nevent_hub = \"o\"\n[[target]]\nname = \"t\"\ndata_dir = \".\"\nevent_hub = \"o\"\n[offset_map]\nevery_events = 0\n",
            ":10",
            "offset_map.every_events",
        ),
        (
            "name = \"x\"\n[source]\ndata_dir = \".\"\nevent_hub = \"o\"\n[[target]]\nname = \"t\"\ndata_dir = \".\"\nevent_hub = \"o\"\n[offset_map]\nevery = \"0s\"\n",
            ":10",
            "offset_map.every",
        ),
    ];
    for (text, line, key) in cases {
        std::fs::write(&file, text).unwrap();
        let error = TaskConfig::load(&file).expect_err(text).to_string();
        assert!(
            error.starts_with(&format!("{}{line}:", file.display())),
            "{error}"
        );
        assert!(error.contains(key), "{error}");
    }
}

/// An unknown key is named by its dotted path, answered with the keys its table takes in its
/// role (a source's, not a target's), and with the key it was probably meant to be.
#[test]
fn an_unknown_key_is_named_with_its_path_and_the_keys_its_table_takes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("typo-key.toml");
    let source = "name = \"x\"\n[source]\ndata_dir = \".\"\nevent_hub = \"o\"\n";
    let target = "[[target]]\nname = \"t\"\ndata_dir = \".\"\nevent_hub = \"o\"\n";
    let error = |text: String| {
        std::fs::write(&file, &text).unwrap();
        TaskConfig::load(&file).expect_err(&text)
    };

    let typo = error(format!("{source}consumer_gruop = \"g\"\n{target}"));
    assert_eq!(
        (typo.line, typo.key.as_str()),
        (Some(5), "source.consumer_gruop")
    );
    assert!(typo.message.contains("[source] takes"), "{typo}");
    assert!(typo.message.contains("initial_position"), "{typo}");
    assert!(
        !typo.message.contains("keep_partition"),
        "only a source's keys: {typo}"
    );
    assert!(
        !typo.message.contains("shape"),
        "only a source's keys: {typo}"
    );
    assert!(
        typo.message.ends_with("(did you mean consumer_group?)"),
        "{typo}"
    );

    let second = error(format!("{source}{target}{target}kep_partition = true\n"));
    assert_eq!(second.key, "target[1].kep_partition", "{second}");
    assert!(second.message.contains("a [[target]] takes"), "{second}");
    assert!(
        second.message.contains("(did you mean keep_partition?)"),
        "{second}"
    );

    let dead = error(format!(
        "{source}{target}[dead_letter]\ndata_dir = \".\"\nevent_hub = \"d\"\nwhen = \"true\"\n"
    ));
    assert_eq!(dead.key, "dead_letter.when", "{dead}");
    assert!(!dead.message.contains("consumer_group"), "{dead}");

    let top = error(format!("{source}{target}[retyr]\nbackoff_min = \"1s\"\n"));
    assert_eq!(top.key, "retyr", "{top}");
    assert!(top.message.contains("(did you mean retry?)"), "{top}");

    let nested = error(format!(
        "{source}{target}[retry]\nbackoff_maximum = \"1s\"\n"
    ));
    assert_eq!(nested.key, "retry.backoff_maximum", "{nested}");
    assert!(
        nested.message.contains("(did you mean backoff_max?)"),
        "{nested}"
    );

    let wrong_type = error(format!(
        "{source}{target}[offset_map]\nevery_events = \"ten\"\n"
    ));
    assert_eq!(wrong_type.key, "offset_map.every_events", "{wrong_type}");
}

/// A task file whose target `t` has `keys` (and no way to reach it yet).
fn alias_task(keys: &str) -> String {
    format!(
        "name = \"x\"\n[source]\ndata_dir = \".\"\nevent_hub = \"o\"\n[[target]]\nname = \"t\"\nevent_hub = \"o\"\n{keys}\n"
    )
}

/// [`alias_task`] with a connection string (its key is `v`) and `keys`.
fn aliased_remote(keys: &str) -> String {
    let cs = "Endpoint=sb://127.0.0.1:1/;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true";
    alias_task(&format!("connection_string = \"{cs}\"\n{keys}"))
}

#[test]
fn a_task_file_checks_its_aliases_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("aliases.toml");
    std::fs::write(dir.path().join("good.alias"), "127.0.0.1:5672\n").unwrap();
    let secret = "Endpoint=sb://x/;SharedAccessKey=k\n";
    std::fs::write(dir.path().join("secret.alias"), secret).unwrap();
    let remote = aliased_remote;
    let t = "target \"t\"";
    let cases = [
        (
            alias_task("data_dir = \".\"\nalias_file = \"good.alias\""),
            "alias_file",
            "give a connection string",
        ),
        (
            remote("alias_file = \"missing.alias\""),
            "alias_file",
            "missing.alias",
        ),
        (
            remote("alias_file = \"secret.alias\""),
            "alias_file",
            "looks like a connection string",
        ),
        (
            remote("alias_file = \"good.alias\"\nalias_srv = \"eh.example.com\""),
            "alias_srv",
            "not both",
        ),
        (
            remote("alias_srv = \"bad name\""),
            "alias_srv",
            "not a DNS name",
        ),
        (
            remote("alias_srv = \"eh.example.com\"\ndns_server = \"nowhere\""),
            "dns_server",
            "not an address",
        ),
        (
            remote("alias_file = \"good.alias\"\ndns_server = \"127.0.0.1:53\""),
            "dns_server",
            "for alias_srv",
        ),
        (
            remote("alias_file = \"good.alias\"\nfailover_failures = 0"),
            "failover_failures",
            "at least 1",
        ),
        (
            remote("alias_file = \"good.alias\"\nfailover_after = \"soon\""),
            "failover_after",
            "duration",
        ),
        (
            remote("failover_failures = 2"),
            "failover_failures",
            "needs alias_file or alias_srv",
        ),
    ];
    for (text, key, message) in cases {
        std::fs::write(&file, &text).unwrap();
        let error = TaskConfig::load(&file).expect_err(&text).to_string();
        // The table's line, or the value's own for a value with a place (a duration).
        let line = if key == "failover_after" { 10 } else { 5 };
        assert!(
            error.starts_with(&format!("{}:{line}: {t}.{key}: ", file.display())),
            "{error}"
        );
        assert!(error.contains(message), "{error}");
        assert!(!error.contains("SharedAccessKey="), "no secret: {error}");
    }
}

#[test]
fn a_task_file_alias_reaches_the_endpoint_with_its_thresholds() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("aliases.toml");
    std::fs::write(dir.path().join("good.alias"), "127.0.0.1:5672\n").unwrap();
    let keys = "alias_file = \"good.alias\"\nfailover_failures = 2\nfailover_after = \"3s\"";
    std::fs::write(&file, aliased_remote(keys)).unwrap();
    let config = TaskConfig::load(&file).unwrap();
    let endpoint = match &config.targets[0].kind {
        tributary_replicate::task::TargetKind::Hub { endpoint, .. } => endpoint,
        // Only with the postgres feature is there another kind.
        #[allow(unreachable_patterns)]
        other => panic!("a hub target: {other:?}"),
    };
    let tributary_replicate::task::Connection::Remote {
        failover: Some(failover),
        ..
    } = &endpoint.connection
    else {
        panic!("an aliased hub: {endpoint:?}");
    };
    let expected = tributary_client::FailoverOptions::file(dir.path().join("good.alias"))
        .with_failures_before_switch(2)
        .with_unavailable_after(Duration::from_secs(3));
    assert_eq!(failover, &expected);
}

/// Every body `hub` holds.
async fn all_bodies(hub: &TestHub, partitions: u32) -> BTreeSet<String> {
    contents(hub, partitions)
        .await
        .into_values()
        .flatten()
        .map(|e| String::from_utf8_lossy(&e.data.body).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_follows_its_target_alias_file_from_one_hub_to_the_other_losing_nothing() {
    use tributary_client::AliasEndpoint;
    use tributary_client::failover::write_alias_file;
    let dir = tempfile::tempdir().unwrap();
    let source = TestHub::start(&[("orders", 4)]).await;
    let b = TestHub::start(&[("orders", 4)]).await;
    let c = b.start_sharing_keys(&[("orders", 4)]).await;
    let alias = dir.path().join("backup.alias");
    let at = |hub: &TestHub| AliasEndpoint::new("127.0.0.1", Some(hub.port()));
    write_alias_file(&alias, &at(&b)).unwrap();
    let config = copy_task(
        dir.path(),
        "aliased",
        &source,
        &b,
        "alias_file = \"backup.alias\"\nfailover_failures = 1\nfailover_after = \"2s\"",
    )
    .await;
    let replicator = Replicator::start(&config, StartOptions::default())
        .await
        .expect("starts");
    let before = produce(&source, "before").await;
    wait_for(&b, 4, before).await;

    // Switch while events keep coming, until C has some; then one more round.
    write_alias_file(&alias, &at(&c)).unwrap();
    within("the task moving to C", async {
        for round in 0.. {
            produce(&source, &format!("during{round}")).await;
            if !all_bodies(&c, 4).await.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    produce(&source, "after").await;
    let sent = all_bodies(&source, 4).await;
    within("every event in B or C", async {
        loop {
            let mut landed = all_bodies(&b, 4).await;
            landed.extend(all_bodies(&c, 4).await);
            if landed.is_superset(&sent) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let on_c = all_bodies(&c, 4).await;
    assert!(
        on_c.iter().all(|body| !body.starts_with("before-")),
        "C got only what was sent after the switch: {on_c:?}"
    );
    let after: BTreeSet<String> = sent
        .iter()
        .filter(|body| body.starts_with("after-"))
        .cloned()
        .collect();
    assert!(on_c.is_superset(&after), "after the switch, C gets it all");
    replicator.shutdown().await.expect("stops");
}
