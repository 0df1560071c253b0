//! The broker through its public API: hubs, consumer groups, sends, receivers and epochs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tributary_broker::{
    Broker, BrokerConfig, BrokerError, DisconnectReason, HubSpec, LogError, ReceiveError,
    ReceiverSpec, SendTarget,
};
use tributary_event::{EventData, EventPosition, partition_for_key};
use tributary_log::faults::{FaultConfig, FaultyStorage};

async fn broker(dir: &std::path::Path) -> Broker {
    Broker::open(BrokerConfig::new(dir)).await.unwrap()
}

fn events(prefix: &str, n: usize) -> Vec<EventData> {
    (0..n)
        .map(|i| EventData::new(format!("{prefix}-{i}")))
        .collect()
}

fn body(e: &tributary_event::ReceivedEvent) -> String {
    String::from_utf8(e.data.body.to_vec()).unwrap()
}

#[tokio::test]
async fn hubs_and_consumer_groups_persist_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    {
        let b = broker(dir.path()).await;
        b.create_hub(HubSpec::new("Orders", 4)).await.unwrap();
        b.create_consumer_group("orders", "billing").await.unwrap();
        b.send("orders", SendTarget::Partition("2".into()), events("x", 3))
            .await
            .unwrap();
        b.shutdown().await.unwrap();
    }
    let b = broker(dir.path()).await;
    let hubs = b.list_hubs();
    assert_eq!(hubs.len(), 1);
    assert_eq!(hubs[0].name, "Orders");
    assert_eq!(hubs[0].partition_count, 4);
    let groups: Vec<String> = b
        .list_consumer_groups("ORDERS")
        .unwrap()
        .into_iter()
        .map(|g| g.name)
        .collect();
    assert_eq!(groups, vec!["$Default", "billing"]);
    let p = b.partition_properties("orders", "2").unwrap();
    assert_eq!(p.last_enqueued_sequence_number, 2);
}

#[tokio::test]
async fn bad_hub_requests_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    assert!(matches!(
        b.create_hub(HubSpec::new("bad name", 4)).await,
        Err(BrokerError::InvalidName(_))
    ));
    assert!(matches!(
        b.create_hub(HubSpec::new("h", 0)).await,
        Err(BrokerError::InvalidPartitionCount {
            count: 0,
            max: 1024
        })
    ));
    assert!(matches!(
        b.create_hub(HubSpec::new("h", 1025)).await,
        Err(BrokerError::InvalidPartitionCount { .. })
    ));
    b.create_hub(HubSpec::new("h", 2)).await.unwrap();
    assert!(matches!(
        b.create_hub(HubSpec::new("H", 2)).await,
        Err(BrokerError::HubExists { .. })
    ));
    assert!(matches!(
        b.send("nope", SendTarget::RoundRobin, events("x", 1)).await,
        Err(BrokerError::HubNotFound { .. })
    ));
}

#[tokio::test]
async fn bad_sends_and_receivers_get_clear_errors_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    b.create_hub(HubSpec::new("h", 2)).await.unwrap();
    let err = b
        .send("h", SendTarget::Partition("2".into()), events("x", 1))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "event hub \"h\": invalid partition id \"2\": the hub has partitions 0 to 1"
    );
    let mut keyed = events("k", 1);
    keyed[0].partition_key = Some("a".into());
    assert!(matches!(
        b.send("h", SendTarget::Partition("0".into()), keyed.clone())
            .await,
        Err(BrokerError::InvalidSend(_))
    ));
    assert!(matches!(
        b.send("h", SendTarget::PartitionKey("b".into()), keyed)
            .await,
        Err(BrokerError::InvalidSend(_))
    ));
    let mut too_big = events("ok", 2);
    too_big.push(EventData::new(vec![0u8; 2 << 20]));
    assert!(matches!(
        b.send("h", SendTarget::Partition("0".into()), too_big)
            .await,
        Err(BrokerError::Log { .. })
    ));
    assert!(matches!(
        b.delete_consumer_group("h", "$default").await,
        Err(BrokerError::DefaultConsumerGroup)
    ));
    assert!(matches!(
        b.delete_consumer_group("h", "ghost").await,
        Err(BrokerError::ConsumerGroupNotFound { .. })
    ));
    let spec = ReceiverSpec {
        consumer_group: "ghost".into(),
        ..ReceiverSpec::new("h", "0", EventPosition::Earliest)
    };
    assert!(matches!(
        b.open_receiver(spec),
        Err(BrokerError::ConsumerGroupNotFound { .. })
    ));
    let seq = EventPosition::SequenceNumber {
        sequence_number: 10,
        inclusive: true,
    };
    assert!(matches!(
        b.open_receiver(ReceiverSpec::new("h", "0", seq)),
        Err(BrokerError::Log { .. })
    ));
    for p in ["0", "1"] {
        assert!(
            b.partition_properties("h", p).unwrap().is_empty,
            "nothing was written to {p}"
        );
    }
}

#[tokio::test]
async fn the_consumer_group_limit_counts_default() {
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        consumer_groups_max: 3,
        ..BrokerConfig::new(dir.path())
    };
    let b = Broker::open(config).await.unwrap();
    b.create_hub(HubSpec::new("h", 1)).await.unwrap();
    b.create_consumer_group("h", "a").await.unwrap();
    b.create_consumer_group("h", "b").await.unwrap();
    assert!(matches!(
        b.create_consumer_group("h", "c").await,
        Err(BrokerError::ConsumerGroupLimit { max: 3, .. })
    ));
    assert!(matches!(
        b.create_consumer_group("h", "A").await,
        Err(BrokerError::ConsumerGroupExists { .. })
    ));
}

#[tokio::test]
async fn keys_route_like_event_hubs_and_round_robin_spreads() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    b.create_hub(HubSpec::new("h", 8)).await.unwrap();
    for key in ["device-17", "abc", "sensor/kitchen/door"] {
        let r = b
            .send("h", SendTarget::PartitionKey(key.into()), events(key, 2))
            .await
            .unwrap();
        assert_eq!(r.partition, partition_for_key(key, 8));
        let mut rx = b
            .open_receiver(ReceiverSpec::new(
                "h",
                r.partition.to_string(),
                EventPosition::Earliest,
            ))
            .unwrap();
        let got = rx.receive(10, Duration::from_millis(10)).await.unwrap();
        assert!(
            got.iter()
                .all(|e| e.data.partition_key.as_deref() == Some(key))
        );
    }
    let mut hit = [0u32; 8];
    for _ in 0..16 {
        let r = b
            .send("h", SendTarget::RoundRobin, events("rr", 1))
            .await
            .unwrap();
        hit[r.partition as usize] += 1;
    }
    assert_eq!(hit, [2; 8]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_order_holds_under_concurrent_producers() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    b.create_hub(HubSpec::new("h", 4)).await.unwrap();
    let mut producers = Vec::new();
    for producer in 0..8 {
        let b = b.clone();
        producers.push(tokio::spawn(async move {
            for i in 0..50 {
                let key = format!("key-{}", producer % 4);
                let event = EventData::new(format!("{producer}:{i}"));
                b.send("h", SendTarget::PartitionKey(key), vec![event])
                    .await
                    .unwrap();
            }
        }));
    }
    for p in producers {
        p.await.unwrap();
    }
    let mut seen = 0;
    for partition in 0..4 {
        let mut rx = b
            .open_receiver(ReceiverSpec::new(
                "h",
                partition.to_string(),
                EventPosition::Earliest,
            ))
            .unwrap();
        let got = rx.receive(1000, Duration::from_millis(10)).await.unwrap();
        seen += got.len();
        for producer in 0..8 {
            let mine: Vec<u32> = got
                .iter()
                .map(body)
                .filter_map(|s| {
                    let (p, i) = s.split_once(':').unwrap();
                    (p == producer.to_string()).then(|| i.parse().unwrap())
                })
                .collect();
            assert!(
                mine.windows(2).all(|w| w[0] < w[1]),
                "producer {producer} out of order: {mine:?}"
            );
            if !mine.is_empty() {
                assert_eq!(mine.len(), 50, "a key's events all land in one partition");
                let key = format!("key-{}", producer % 4);
                assert_eq!(partition_for_key(&key, 4), partition);
            }
        }
    }
    assert_eq!(seen, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_receiver_is_woken_by_the_append() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    b.create_hub(HubSpec::new("h", 1)).await.unwrap();
    let mut rx = b
        .open_receiver(ReceiverSpec::new("h", "0", EventPosition::Latest))
        .unwrap();
    let sender = b.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        sender
            .send("h", SendTarget::RoundRobin, events("late", 1))
            .await
            .unwrap();
    });
    let started = Instant::now();
    let got = rx.receive(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "woken by the append, not the timeout"
    );
    // With nothing new, receive waits out its timeout and returns empty.
    let got = rx.receive(10, Duration::from_millis(50)).await.unwrap();
    assert!(got.is_empty());
    let last = rx.last_enqueued().unwrap();
    assert_eq!(last.sequence_number, 0);
}

/// A receive waiting past the moment it gives its read buffers back still waits out its time,
/// is woken by the next append and reads on in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_waiting_past_its_buffer_release_reads_on_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    b.create_hub(HubSpec::new("h", 1)).await.unwrap();
    let mut rx = b
        .open_receiver(ReceiverSpec::new("h", "0", EventPosition::Earliest))
        .unwrap();
    b.send("h", SendTarget::RoundRobin, events("first", 2))
        .await
        .unwrap();
    let got = rx.receive(10, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.len(), 2);
    let quiet = tributary_broker::RELEASE_BUFFERS_AFTER;
    let started = Instant::now();
    let got = rx.receive(10, quiet * 2).await.unwrap();
    assert!(got.is_empty());
    assert!(
        started.elapsed() >= quiet * 2,
        "the whole wait, not only until the release"
    );
    let sender = b.clone();
    tokio::spawn(async move {
        tokio::time::sleep(quiet * 2).await;
        sender
            .send("h", SendTarget::RoundRobin, events("later", 1))
            .await
            .unwrap();
    });
    let got = rx.receive(10, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        got.iter().map(|e| e.sequence_number).collect::<Vec<_>>(),
        [2]
    );
}

#[tokio::test]
async fn receivers_start_at_every_kind_of_position() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    b.create_hub(HubSpec::new("h", 1)).await.unwrap();
    let mut offsets = Vec::new();
    for i in 0..5 {
        offsets.extend(
            b.send("h", SendTarget::RoundRobin, events(&format!("b{i}"), 2))
                .await
                .unwrap()
                .offsets,
        );
    }
    async fn first_seq_from(b: &Broker, start: EventPosition) -> Option<i64> {
        let mut rx = b.open_receiver(ReceiverSpec::new("h", "0", start)).unwrap();
        rx.receive(1, Duration::from_millis(10))
            .await
            .unwrap()
            .first()
            .map(|e| e.sequence_number)
    }
    let first_seq = |start| first_seq_from(&b, start);
    assert_eq!(first_seq(EventPosition::Earliest).await, Some(0));
    assert_eq!(first_seq(EventPosition::Latest).await, None);
    assert_eq!(
        first_seq(EventPosition::Offset {
            offset: offsets[4],
            inclusive: true
        })
        .await,
        Some(4)
    );
    assert_eq!(
        first_seq(EventPosition::Offset {
            offset: offsets[4],
            inclusive: false
        })
        .await,
        Some(5)
    );
    assert_eq!(
        first_seq(EventPosition::SequenceNumber {
            sequence_number: 7,
            inclusive: true
        })
        .await,
        Some(7)
    );
    assert_eq!(
        first_seq(EventPosition::SequenceNumber {
            sequence_number: 7,
            inclusive: false
        })
        .await,
        Some(8)
    );
    assert_eq!(
        first_seq(EventPosition::EnqueuedTime {
            enqueued_time_ms: 0,
            inclusive: false
        })
        .await,
        Some(0)
    );
}

/// The epoch rules through the broker: who is refused, and who is disconnected with which
/// typed error.
#[tokio::test]
async fn epoch_rules_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    b.create_hub(HubSpec::new("h", 2)).await.unwrap();
    let spec = |epoch: Option<i64>| ReceiverSpec {
        owner_level: epoch,
        ..ReceiverSpec::new("h", "0", EventPosition::Earliest)
    };
    // Five non-epoch receivers open; the sixth is refused with the receivers listed.
    let mut plain: Vec<_> = (0..5)
        .map(|_| b.open_receiver(spec(None)).unwrap())
        .collect();
    match b.open_receiver(spec(None)) {
        Err(BrokerError::TooManyReceivers { max: 5, names, .. }) => {
            assert_eq!(names, "nil, nil, nil, nil, nil");
        }
        other => panic!("expected the sixth receiver to be refused: {other:?}"),
    }
    // Another partition is separate.
    let _other_partition = b
        .open_receiver(ReceiverSpec::new("h", "1", EventPosition::Earliest))
        .unwrap();
    // An epoch receiver disconnects all five.
    let mut e1 = b.open_receiver(spec(Some(1))).unwrap();
    for rx in &mut plain {
        match rx.receive(1, Duration::from_millis(1)).await {
            Err(ReceiveError::Disconnected(DisconnectReason::Stolen { new_epoch: 1 })) => {}
            other => panic!("expected Stolen, got {other:?}"),
        }
    }
    drop(plain);
    // Non-epoch refused while it is open; lower epoch refused.
    assert!(matches!(
        b.open_receiver(spec(None)),
        Err(BrokerError::EpochReceiverActive { current: 1, .. })
    ));
    assert!(matches!(
        b.open_receiver(spec(Some(0))),
        Err(BrokerError::EpochTooLow {
            current: 1,
            requested: 0,
            ..
        })
    ));
    // Equal epoch steals; a waiting receiver is woken by the steal.
    let waiter = tokio::spawn(async move { e1.receive(1, Duration::from_secs(30)).await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let e1b = b.open_receiver(spec(Some(1))).unwrap();
    match tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap()
    {
        Err(ReceiveError::Disconnected(DisconnectReason::Stolen { new_epoch: 1 })) => {}
        other => panic!("expected the waiting receiver to be stolen from, got {other:?}"),
    }
    // Once the epoch receiver closes, a non-epoch receiver may open again.
    drop(e1b);
    let _plain_again = b.open_receiver(spec(None)).unwrap();
    assert_eq!(b.open_receiver_count("h").unwrap(), 2);
}

#[tokio::test]
async fn deleting_a_group_or_hub_disconnects_its_receivers() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    b.create_hub(HubSpec::new("h", 1)).await.unwrap();
    b.create_consumer_group("h", "g").await.unwrap();
    let mut in_group = b
        .open_receiver(ReceiverSpec {
            consumer_group: "G".into(),
            ..ReceiverSpec::new("h", "0", EventPosition::Earliest)
        })
        .unwrap();
    let mut in_default = b
        .open_receiver(ReceiverSpec::new("h", "0", EventPosition::Earliest))
        .unwrap();
    b.delete_consumer_group("h", "g").await.unwrap();
    assert!(matches!(
        in_group.receive(1, Duration::from_millis(1)).await,
        Err(ReceiveError::Disconnected(
            DisconnectReason::ConsumerGroupDeleted
        ))
    ));
    assert!(
        in_default
            .receive(1, Duration::from_millis(1))
            .await
            .unwrap()
            .is_empty()
    );
    b.delete_hub("h").await.unwrap();
    assert!(matches!(
        in_default.receive(1, Duration::from_millis(1)).await,
        Err(ReceiveError::Disconnected(DisconnectReason::HubDeleted))
    ));
    assert!(b.list_hubs().is_empty());
    assert!(!dir.path().join("hubs").join("h").exists());
    // The name is free again.
    b.create_hub(HubSpec::new("h", 3)).await.unwrap();
}

#[tokio::test]
async fn a_second_broker_on_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _b = broker(dir.path()).await;
    let err = Broker::open(BrokerConfig::new(dir.path()))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("in use by another Tributary process"),
        "{err}"
    );
}

#[tokio::test]
async fn stateless_reads_for_cursor_based_readers() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    b.create_hub(HubSpec::new("h", 2)).await.unwrap();
    b.send("h", SendTarget::Partition("1".into()), events("e", 5))
        .await
        .unwrap();
    let got = b.read("h", "1", 2, 10, 1 << 20).unwrap();
    assert_eq!(
        got.iter().map(|e| e.sequence_number).collect::<Vec<_>>(),
        vec![2, 3, 4]
    );
    assert!(b.read("h", "1", 5, 10, 1 << 20).unwrap().is_empty());
    assert!(b.read("h", "0", 0, 10, 1 << 20).unwrap().is_empty());
    assert_eq!(
        b.resolve_position("h", "1", &EventPosition::Latest)
            .unwrap(),
        5
    );
    assert!(
        !b.wait_for_sequence("h", "1", 5, Duration::from_millis(20))
            .await
            .unwrap()
    );
    assert!(
        b.wait_for_sequence("h", "1", 4, Duration::from_millis(20))
            .await
            .unwrap()
    );
    assert!(matches!(
        b.read("h", "7", 0, 1, 1),
        Err(BrokerError::InvalidPartition { .. })
    ));
}

#[tokio::test]
async fn a_displaced_receiver_can_be_watched_without_receiving() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    b.create_hub(HubSpec::new("h", 1)).await.unwrap();
    let spec = |epoch| ReceiverSpec {
        owner_level: Some(epoch),
        ..ReceiverSpec::new("h", "0", EventPosition::Earliest)
    };
    let old = b.open_receiver(spec(1)).unwrap();
    assert_eq!(old.disconnect_reason(), None);
    let watcher = async { old.disconnected().await };
    let steal = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        b.open_receiver(spec(2)).unwrap()
    };
    let (reason, _new) = tokio::join!(watcher, steal);
    assert_eq!(reason, DisconnectReason::Stolen { new_epoch: 2 });
    assert_eq!(
        old.disconnect_reason(),
        Some(DisconnectReason::Stolen { new_epoch: 2 })
    );
}

#[tokio::test]
async fn a_failed_sync_poisons_the_partition_and_senders_get_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let storage = FaultyStorage::new(7, FaultConfig::NONE);
    let config = BrokerConfig {
        storage: Arc::new(storage.clone()),
        ..BrokerConfig::new(dir.path())
    };
    let b = Broker::open(config).await.unwrap();
    b.create_hub(HubSpec::new("h", 2)).await.unwrap();
    let to = |p: &str| SendTarget::Partition(p.into());
    b.send("h", to("0"), events("before", 1)).await.unwrap();
    storage.fail_next_sync();
    let failed = b.send("h", to("0"), events("lost", 1)).await.unwrap_err();
    let refused = b.send("h", to("0"), events("after", 1)).await.unwrap_err();
    for error in [&failed, &refused] {
        assert!(
            matches!(
                error,
                BrokerError::Log {
                    partition: 0,
                    source: LogError::Poisoned { .. },
                    ..
                }
            ),
            "{error}"
        );
        assert!(!error.is_caller_error(), "{error}");
        assert!(
            error.to_string().contains("stopped accepting appends"),
            "{error}"
        );
    }
    // The other partition is not affected, and readers of the poisoned one see only what was
    // acknowledged.
    b.send("h", to("1"), events("elsewhere", 1)).await.unwrap();
    assert_eq!(
        b.partition_properties("h", "0")
            .unwrap()
            .last_enqueued_sequence_number,
        0
    );
}

#[tokio::test]
async fn partition_activity_shows_receivers_with_epochs_deliveries_and_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let b = broker(dir.path()).await;
    b.create_hub(HubSpec::new("Orders", 2)).await.unwrap();
    b.create_consumer_group("orders", "Billing").await.unwrap();
    b.send("orders", SendTarget::Partition("1".into()), events("x", 5))
        .await
        .unwrap();
    let mut epoch = ReceiverSpec::new("orders", "1", EventPosition::Earliest);
    epoch.consumer_group = "billing".into();
    epoch.owner_level = Some(7);
    let mut epoch = b.open_receiver(epoch).unwrap();
    let mut named = ReceiverSpec::new("orders", "1", EventPosition::Earliest);
    named.name = Some("tail".into());
    let _named = b.open_receiver(named).unwrap();
    assert_eq!(epoch.receive(3, Duration::ZERO).await.unwrap().len(), 3);
    assert_eq!(b.read("orders", "1", 0, 2, 1 << 20).unwrap().len(), 2);

    let activity = b.partition_activity("ORDERS").unwrap();
    assert_eq!(activity.len(), 2);
    let (idle, busy) = (&activity[0], &activity[1]);
    assert_eq!((idle.partition, idle.events_delivered), (0, 0));
    assert!(idle.receivers.is_empty());
    assert_eq!(busy.properties.last_enqueued_sequence_number, 4);
    assert_eq!(busy.events_delivered, 5, "3 received + 2 read");
    assert!(busy.retained_bytes > 0);
    let receivers: Vec<(String, Option<i64>, Option<String>)> = busy
        .receivers
        .iter()
        .map(|r| (r.consumer_group.clone(), r.epoch, r.name.clone()))
        .collect();
    assert_eq!(
        receivers,
        vec![
            ("$Default".to_owned(), None, Some("tail".to_owned())),
            ("Billing".to_owned(), Some(7), None),
        ],
        "group names as created, with epochs and names"
    );
    drop(epoch);
    let after = b.partition_activity("orders").unwrap();
    assert_eq!(after[1].receivers.len(), 1, "a closed receiver is gone");
    assert!(matches!(
        b.partition_activity("nosuch"),
        Err(BrokerError::HubNotFound { .. })
    ));
}
