//! The broker's ownership and checkpoint registry: conditional claims, fenced checkpoints,
//! refusals, and records that survive a restart and go with their hub or group.

use tributary_broker::{
    Broker, BrokerConfig, BrokerError, CheckpointRecord, HubSpec, OwnershipClaim,
};

async fn open(dir: &std::path::Path) -> Broker {
    Broker::open(BrokerConfig::new(dir)).await.unwrap()
}

fn claim(partition: &str, owner: &str, etag: Option<&str>) -> OwnershipClaim {
    OwnershipClaim {
        partition_id: partition.to_owned(),
        owner_id: owner.to_owned(),
        etag: etag.map(str::to_owned),
    }
}

fn checkpoint(partition: &str, offset: u64, sequence: i64) -> CheckpointRecord {
    CheckpointRecord {
        partition_id: partition.to_owned(),
        offset: Some(offset),
        sequence_number: Some(sequence),
    }
}

#[tokio::test]
async fn claims_are_conditional_and_checkpoints_fenced_and_both_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path()).await;
    broker.create_hub(HubSpec::new("Orders", 4)).await.unwrap();
    let won = broker
        .claim_ownership(
            "orders",
            "$Default",
            vec![claim("0", "a", None), claim("1", "a", None)],
        )
        .await
        .unwrap();
    assert_eq!(won.len(), 2);
    assert_eq!(won[0].version, 1);
    // A second first claim and a stale etag lose quietly.
    let lost = broker
        .claim_ownership(
            "ORDERS",
            "$default",
            vec![claim("0", "b", None), claim("1", "b", Some("stale"))],
        )
        .await
        .unwrap();
    assert!(lost.is_empty());
    let stolen = broker
        .claim_ownership(
            "orders",
            "$Default",
            vec![claim("1", "b", Some(&won[1].etag))],
        )
        .await
        .unwrap();
    assert_eq!(stolen[0].version, 2);
    assert_ne!(stolen[0].etag, won[1].etag);

    broker
        .update_checkpoint("orders", "$Default", checkpoint("0", 40, 4), "a")
        .await
        .unwrap();
    let refused = broker
        .update_checkpoint("orders", "$Default", checkpoint("1", 80, 8), "a")
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, BrokerError::OwnershipLost { current_owner, .. } if current_owner == "b"),
        "{refused}"
    );
    let no_position = CheckpointRecord {
        partition_id: "0".into(),
        offset: None,
        sequence_number: None,
    };
    assert!(matches!(
        broker
            .update_checkpoint("orders", "$Default", no_position, "a")
            .await,
        Err(BrokerError::InvalidProcessorRecord(_))
    ));

    broker.shutdown().await.unwrap();
    drop(broker);
    let kept = vec![won[0].clone(), stolen[0].clone()];
    records_survive_a_restart(dir.path(), kept).await;
}

async fn records_survive_a_restart(
    dir: &std::path::Path,
    kept: Vec<tributary_broker::OwnershipRecord>,
) {
    let broker = open(dir).await;
    let owners = broker.list_ownership("orders", "$Default").await.unwrap();
    assert_eq!(owners, kept);
    let checkpoints = broker.list_checkpoints("orders", "$Default").await.unwrap();
    assert_eq!(checkpoints, vec![checkpoint("0", 40, 4)]);
    let states = broker.processor_group_states("orders").unwrap();
    assert_eq!(states.len(), 1);
    let (group, partitions) = &states[0];
    assert_eq!(group, "$Default");
    assert_eq!(partitions.len(), 2);
    assert_eq!(partitions[0].owner_id, "a");
    assert_eq!(partitions[0].checkpoint_offset, Some(40));
    assert_eq!(partitions[0].checkpoint_sequence_number, Some(4));
    assert_eq!(partitions[1].owner_id, "b");
    assert_eq!(partitions[1].version, 2);
    assert_eq!(partitions[1].checkpoint_offset, None);
}

#[tokio::test]
async fn unknown_hubs_groups_and_partitions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path()).await;
    broker.create_hub(HubSpec::new("orders", 2)).await.unwrap();
    broker
        .create_consumer_group("orders", "audit")
        .await
        .unwrap();
    let refused = [
        broker
            .claim_ownership("nope", "$Default", vec![claim("0", "a", None)])
            .await,
        broker
            .claim_ownership("orders", "nope", vec![claim("0", "a", None)])
            .await,
        broker
            .claim_ownership("orders", "$Default", vec![claim("2", "a", None)])
            .await,
        broker
            .claim_ownership("orders", "$Default", vec![claim("", "a", None)])
            .await,
        broker
            .claim_ownership(
                "orders",
                "$Default",
                vec![claim("0", &"x".repeat(300), None)],
            )
            .await,
    ];
    for result in refused {
        let error = result.unwrap_err();
        assert!(error.is_caller_error(), "{error}");
    }
    assert!(
        broker
            .list_ownership("orders", "$Default")
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn deleting_a_group_or_hub_deletes_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open(dir.path()).await;
    broker.create_hub(HubSpec::new("orders", 2)).await.unwrap();
    broker
        .create_consumer_group("orders", "audit")
        .await
        .unwrap();
    broker
        .claim_ownership("orders", "audit", vec![claim("0", "a", None)])
        .await
        .unwrap();
    broker
        .delete_consumer_group("orders", "audit")
        .await
        .unwrap();
    broker
        .create_consumer_group("orders", "audit")
        .await
        .unwrap();
    assert!(
        broker
            .list_ownership("orders", "audit")
            .await
            .unwrap()
            .is_empty()
    );

    broker
        .claim_ownership("orders", "$Default", vec![claim("0", "a", None)])
        .await
        .unwrap();
    broker.delete_hub("orders").await.unwrap();
    assert!(matches!(
        broker.list_ownership("orders", "$Default").await,
        Err(BrokerError::HubNotFound { .. })
    ));
    broker.create_hub(HubSpec::new("orders", 2)).await.unwrap();
    assert!(
        broker
            .list_ownership("orders", "$Default")
            .await
            .unwrap()
            .is_empty()
    );
    let states = broker.processor_group_states("orders").unwrap();
    assert_eq!(states, vec![("$Default".to_owned(), Vec::new())]);
}

/// Sends `bodies` to one partition; the broker's clock stands still between sends.
async fn send(broker: &Broker, partition: &str, bodies: &[&str]) {
    let events = bodies
        .iter()
        .map(|b| tributary_event::EventData::new(b.as_bytes().to_vec()))
        .collect();
    broker
        .send(
            "readings",
            tributary_event::SendTarget::Partition(partition.into()),
            events,
        )
        .await
        .unwrap();
}

/// A broker on a manual clock with hub "readings" (2 partitions): three events on partition 0,
/// then ten seconds later two more there and one on partition 1.
async fn readings() -> (
    tempfile::TempDir,
    Broker,
    std::sync::Arc<tributary_event::ManualClock>,
) {
    let dir = tempfile::tempdir().unwrap();
    let clock = std::sync::Arc::new(tributary_event::ManualClock::new(1_000_000));
    let broker = Broker::open_with_clock(BrokerConfig::new(dir.path()), clock.clone())
        .await
        .unwrap();
    broker
        .create_hub(HubSpec::new("readings", 2))
        .await
        .unwrap();
    send(&broker, "0", &["a", "b", "c"]).await;
    clock.advance_ms(10_000);
    send(&broker, "0", &["d", "e"]).await;
    send(&broker, "1", &["x"]).await;
    (dir, broker, clock)
}

fn sequences(records: Vec<CheckpointRecord>) -> Vec<(String, Option<i64>)> {
    records
        .into_iter()
        .map(|c| (c.partition_id, c.sequence_number))
        .collect()
}

/// A reset is refused while an owner renewed within the last minute, allowed once it went
/// quiet (as after kill -9) or relinquished, and the ownership versions never go back.
#[tokio::test]
async fn a_processor_group_resets_only_when_no_owner_runs() {
    use tributary_event::EventPosition::{Earliest, Latest};
    let (_dir, broker, clock) = readings().await;
    let won = broker
        .claim_ownership("readings", "$Default", vec![claim("0", "host-a", None)])
        .await
        .unwrap();
    let error = broker
        .reset_processor_group("readings", "$Default", &Earliest)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, BrokerError::ProcessorGroupRunning { owners, .. } if owners == &["host-a on partitions 0"]),
        "{error}"
    );
    assert!(error.to_string().contains("stop them"), "{error}");
    let none = broker.list_checkpoints("readings", "$default").await;
    assert!(none.unwrap().is_empty());
    clock.advance_ms(tributary_broker::OWNER_RUNNING_WINDOW_MS);
    let earliest = broker.reset_processor_group("readings", "$Default", &Earliest);
    assert_eq!(sequences(earliest.await.unwrap()).len(), 2);
    // Renewed: running again; relinquished: not.
    let renewed = broker
        .claim_ownership(
            "readings",
            "$Default",
            vec![claim("0", "host-a", Some(&won[0].etag))],
        )
        .await
        .unwrap();
    let refused = broker.reset_processor_group("readings", "$Default", &Latest);
    assert!(refused.await.is_err());
    let relinquished = broker
        .claim_ownership(
            "readings",
            "$Default",
            vec![claim("0", "", Some(&renewed[0].etag))],
        )
        .await
        .unwrap();
    let latest = broker.reset_processor_group("readings", "$Default", &Latest);
    latest.await.unwrap();
    let again = broker
        .claim_ownership(
            "readings",
            "$Default",
            vec![claim("0", "host-b", Some(&relinquished[0].etag))],
        )
        .await
        .unwrap();
    assert_eq!(again[0].version, 4);
    let error = broker.reset_processor_group("readings", "nope", &Latest);
    let error = error.await.unwrap_err();
    assert!(
        matches!(error, BrokerError::ConsumerGroupNotFound { .. }),
        "{error}"
    );
}

/// Reset to earliest, latest or a time, a checkpoint names the event before the first one to
/// process, by sequence number.
#[tokio::test]
async fn a_processor_group_resets_to_earliest_latest_or_a_time() {
    use tributary_event::EventPosition;
    let (_dir, broker, _clock) = readings().await;
    let reset = |position: EventPosition| {
        let broker = broker.clone();
        async move {
            let reset = broker.reset_processor_group("readings", "$Default", &position);
            sequences(reset.await.unwrap())
        }
    };
    let earliest = reset(EventPosition::Earliest).await;
    assert_eq!(earliest, [("0".into(), Some(-1)), ("1".into(), Some(-1))]);
    let latest = reset(EventPosition::Latest).await;
    assert_eq!(latest, [("0".into(), Some(4)), ("1".into(), Some(0))]);
    let by_time = reset(EventPosition::EnqueuedTime {
        enqueued_time_ms: 1_005_000,
        inclusive: true,
    })
    .await;
    // Partition 0: "d" (sequence 3) is the first at or after the time; partition 1's only
    // event came at 1,010,000.
    assert_eq!(by_time, [("0".into(), Some(2)), ("1".into(), Some(-1))]);
    let stored = broker
        .list_checkpoints("readings", "$Default")
        .await
        .unwrap();
    assert_eq!(sequences(stored), by_time);
}

/// Host records: a renewal lists the group's ownership and hosts, versions grow, a removed
/// host is gone; a host renewing its record keeps its group "running" for a reset although its
/// ownership records stand still.
#[tokio::test]
async fn host_records_are_renewed_listed_and_keep_a_group_running() {
    use tributary_event::EventPosition::Earliest;
    let (_dir, broker, clock) = readings().await;
    broker
        .claim_ownership("readings", "$Default", vec![claim("0", "host-a", None)])
        .await
        .unwrap();
    let (ownership, hosts) = broker
        .renew_processor_host("readings", "$Default", "host-a")
        .await
        .unwrap();
    assert_eq!(ownership.len(), 1);
    assert_eq!(hosts[0].owner_id, "host-a");
    assert_eq!(hosts[0].version, 1);
    clock.advance_ms(tributary_broker::OWNER_RUNNING_WINDOW_MS);
    // The claim is a minute old, but the host renewed its record just now.
    let (_, hosts) = broker
        .renew_processor_host("readings", "$DEFAULT", "host-a")
        .await
        .unwrap();
    assert_eq!(hosts[0].version, 2);
    let refused = broker.reset_processor_group("readings", "$Default", &Earliest);
    assert!(matches!(
        refused.await,
        Err(BrokerError::ProcessorGroupRunning { .. })
    ));
    broker
        .remove_processor_host("readings", "$Default", "host-a")
        .await
        .unwrap();
    let (_, hosts) = broker
        .renew_processor_host("readings", "$Default", "host-b")
        .await
        .unwrap();
    assert_eq!(hosts.len(), 1);
    assert_eq!(hosts[0].owner_id, "host-b");
    let reset = broker.reset_processor_group("readings", "$Default", &Earliest);
    assert_eq!(sequences(reset.await.unwrap()).len(), 2);
    // Silent for the retention: forgotten by the next renewal of anyone.
    clock.advance_ms(tributary_broker::PROCESSOR_HOST_RETENTION_MS);
    let (_, hosts) = broker
        .renew_processor_host("readings", "$Default", "host-c")
        .await
        .unwrap();
    assert_eq!(hosts.len(), 1);
    assert_eq!(hosts[0].owner_id, "host-c");
    let unknown = broker
        .renew_processor_host("readings", "nope", "host-a")
        .await;
    assert!(matches!(
        unknown,
        Err(BrokerError::ConsumerGroupNotFound { .. })
    ));
}
