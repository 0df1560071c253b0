//! Merging hubs at the task file's defaults: a full mesh whose hubs each run one task with
//! every other hub as a target holds every event once on every hub (the fan-out stamp tells a
//! later hop which hubs an earlier one sent the event to directly), and a chain out of the
//! mesh still relays every event.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use tributary_broker::SendTarget;
use tributary_event::EventData;
use tributary_replicate::{Replicator, StartOptions, TaskConfig};
use tributary_testkit::TestHub;

use super::{contents, identity, task, wait_for};

/// A task reading `from`'s hub in the consumer group `replication`, with one target per hub
/// of `to`, and nothing else set: every `[merge]` key at its default.
async fn merge_task(dir: &Path, name: &str, from: &TestHub, to: &[&TestHub]) -> TaskConfig {
    // A consumer group per task, as each application reading a hub has its own: two tasks in
    // one group would take each other's partitions with their owner levels.
    let group = format!("replication-{name}");
    let _ = from.broker.create_consumer_group("orders", &group).await;
    let mut text = format!(
        "name = \"{name}\"\n[source]\nconnection_string = \"{}\"\nevent_hub = \"orders\"\n\
         consumer_group = \"{group}\"\n",
        from.connection_string
    );
    for (index, hub) in to.iter().enumerate() {
        text.push_str(&format!(
            "[[target]]\nname = \"to-{index}\"\nconnection_string = \"{}\"\nevent_hub = \"orders\"\n",
            hub.connection_string
        ));
    }
    text.push_str("[processor]\nload_balancing_interval = \"100ms\"\n");
    task(dir, name, &text)
}

/// How many copies of each event (by its identity: origin, partition, sequence) `hub` holds.
async fn copies(hub: &TestHub) -> BTreeMap<(String, String, i64), usize> {
    let mut count = BTreeMap::new();
    for (partition, events) in contents(hub, 2).await {
        for event in &events {
            *count.entry(identity(hub, partition, event)).or_default() += 1;
        }
    }
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_mesh_at_the_defaults_holds_each_event_once_per_hub_and_a_chain_relays() {
    let dir = tempfile::tempdir().unwrap();
    let hubs = [
        TestHub::start(&[("orders", 2)]).await,
        TestHub::start(&[("orders", 2)]).await,
        TestHub::start(&[("orders", 2)]).await,
    ];
    let downstream = TestHub::start(&[("orders", 2)]).await;
    let mut replicators = Vec::new();
    for (i, from) in hubs.iter().enumerate() {
        let others: Vec<&TestHub> = (0..hubs.len())
            .filter(|j| *j != i)
            .map(|j| &hubs[j])
            .collect();
        let config = merge_task(dir.path(), &format!("merge-{i}"), from, &others).await;
        replicators.push(
            Replicator::start(&config, StartOptions::default())
                .await
                .unwrap(),
        );
    }
    // A chain out of the mesh: the third hub's copies go on to a hub outside it.
    let chain = merge_task(dir.path(), "chain", &hubs[2], &[&downstream]).await;
    replicators.push(
        Replicator::start(&chain, StartOptions::default())
            .await
            .unwrap(),
    );

    let mut produced = 0;
    for (i, hub) in hubs.iter().enumerate() {
        for n in 0..30 {
            let event = EventData::new(format!("hub{i}-{n}"));
            let to = SendTarget::PartitionKey(format!("k{n}"));
            hub.broker.send("orders", to, vec![event]).await.unwrap();
            produced += 1;
        }
    }
    for hub in hubs.iter().chain([&downstream]) {
        wait_for(hub, 2, produced).await;
    }
    // Let any second copy in flight land before counting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (name, hub) in ["first", "second", "third", "downstream"]
        .iter()
        .zip(hubs.iter().chain([&downstream]))
    {
        let held = copies(hub).await;
        assert_eq!(held.len(), produced, "the {name} hub has every event");
        let twice: Vec<_> = held.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "the {name} hub holds {} events more than once, e.g. {:?}",
            twice.len(),
            twice.first()
        );
    }
    for replicator in replicators {
        replicator.shutdown().await.unwrap();
    }
}
