//! Compacted hubs through the broker's public API: the cleanup policy on create and update,
//! keyless sends refused, compaction now and in the background, positions in the gaps it
//! leaves, and compaction's progress.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tributary_broker::{
    Broker, BrokerConfig, BrokerError, CleanupPolicy, HubCleanup, HubSpec, HubUpdate, LogConfig,
    LogError, ReceiverSpec, SendTarget,
};
use tributary_event::{EventData, EventPosition, ManualClock, ReceivedEvent};

/// A broker whose segments are sealed every 4 KiB, so a few events fill several of them.
fn config(dir: &std::path::Path) -> BrokerConfig {
    BrokerConfig {
        log: LogConfig {
            segment_bytes_max: tributary_log::limits::SEGMENT_BYTES_MAX_MIN,
            ..LogConfig::default()
        },
        ..BrokerConfig::new(dir)
    }
}

fn compacted() -> HubCleanup {
    HubCleanup {
        policy: CleanupPolicy::Compact,
        min_compaction_lag_ms: 0,
        ..HubCleanup::default()
    }
}

async fn compacted_hub(b: &Broker, name: &str) {
    let spec = HubSpec {
        cleanup: compacted(),
        ..HubSpec::new(name, 1)
    };
    b.create_hub(spec).await.unwrap();
}

/// Sends `rounds` versions of keys `k0..k{keys}` (bodies `k<i>-v<round>` padded to ~200
/// bytes), one event a send; returns the last sequence number.
async fn send_versions(b: &Broker, hub: &str, keys: usize, rounds: usize) -> i64 {
    let mut last = -1;
    for round in 0..rounds {
        for k in 0..keys {
            let body = format!("k{k}-v{round}-{}", "x".repeat(200));
            last = send_keyed(b, hub, &format!("k{k}"), body).await;
        }
    }
    last
}

async fn send_keyed(b: &Broker, hub: &str, key: &str, body: String) -> i64 {
    let target = SendTarget::PartitionKey(key.to_owned());
    let receipt = b
        .send(hub, target, vec![EventData::new(body)])
        .await
        .unwrap();
    receipt.base_sequence
}

fn read_all(b: &Broker, hub: &str, from: i64) -> Vec<ReceivedEvent> {
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let batch = b.read(hub, "0", next, 100, 1 << 20).unwrap();
        let Some(last) = batch.last() else {
            return out;
        };
        next = last.sequence_number + 1;
        out.extend(batch);
    }
}

/// (key, body prefix before the padding) of each event.
fn keys_and_versions(events: &[ReceivedEvent]) -> Vec<(String, String)> {
    events
        .iter()
        .map(|e| {
            let body = String::from_utf8(e.data.body.to_vec()).unwrap();
            let version = body.split('-').take(2).collect::<Vec<_>>().join("-");
            (e.data.partition_key.clone().unwrap(), version)
        })
        .collect()
}

/// `err` is the log's refusal of an event without a partition key, the caller's fault.
fn assert_missing_key(err: &BrokerError) {
    assert!(
        matches!(
            err,
            BrokerError::Log {
                source: LogError::MissingPartitionKey { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_caller_error());
}

/// Every position of an event of `before` that is not in `after` resolves to the next event of
/// `after`, by sequence number and by offset.
fn assert_removed_positions_resolve(b: &Broker, before: &[ReceivedEvent], after: &[ReceivedEvent]) {
    let kept = |seq: i64| after.iter().any(|e| e.sequence_number == seq);
    for removed in before.iter().filter(|o| !kept(o.sequence_number)) {
        let next = after
            .iter()
            .find(|e| e.sequence_number > removed.sequence_number)
            .unwrap();
        let sequence_number = removed.sequence_number;
        let by_sequence = EventPosition::SequenceNumber {
            sequence_number,
            inclusive: true,
        };
        let by_offset = EventPosition::Offset {
            offset: removed.offset,
            inclusive: true,
        };
        for position in [by_sequence, by_offset] {
            let resolved = b.resolve_position("table", "0", &position).unwrap();
            assert_eq!(resolved, next.sequence_number, "{position:?}");
        }
    }
}

#[tokio::test]
async fn a_compacted_hub_keeps_the_latest_event_of_each_key_and_its_tombstones() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::open(config(dir.path())).await.unwrap();
    compacted_hub(&b, "table").await;
    send_versions(&b, "table", 5, 6).await;
    let tombstone = send_keyed(&b, "table", "k1", String::new()).await;
    // Fill the active segment so that the tombstone's segment is sealed.
    let last = send_versions(&b, "table", 1, 25).await;
    let before = read_all(&b, "table", 0);
    let properties = b.partition_properties("table", "0").unwrap();

    let outcome = b.compact_hub("table").await.unwrap()[0];
    assert!(outcome.events_removed > 20, "{outcome:?}");
    assert!(outcome.bytes_after < outcome.bytes_before, "{outcome:?}");

    let after = read_all(&b, "table", 0);
    let sealed: Vec<_> = keys_and_versions(&after)
        .into_iter()
        .filter(|(key, _)| key != "k0")
        .collect();
    let expected: Vec<_> = [("k2", "k2-v5"), ("k3", "k3-v5"), ("k4", "k4-v5")]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    assert_eq!(&sealed[..3], &expected[..], "{sealed:?}");
    let kept_tombstone = after
        .iter()
        .find(|e| e.data.partition_key.as_deref() == Some("k1"))
        .expect("the tombstone of k1 is kept");
    assert_eq!(kept_tombstone.sequence_number, tombstone);
    assert!(kept_tombstone.data.body.is_empty());
    // Positions stay: kept events keep their sequence numbers, the last is still the last.
    assert_eq!(after.last().unwrap().sequence_number, last);
    assert_eq!(
        b.partition_properties("table", "0")
            .unwrap()
            .last_enqueued_sequence_number,
        properties.last_enqueued_sequence_number
    );
    for e in &after {
        let old = before
            .iter()
            .find(|o| o.sequence_number == e.sequence_number);
        assert_eq!(old.map(|o| &o.data.body), Some(&e.data.body));
    }
    // Every removed position resolves to the next kept event, for a receiver too.
    assert_removed_positions_resolve(&b, &before, &after);
    let mut receiver = b
        .open_receiver(ReceiverSpec::new("table", "0", EventPosition::Earliest))
        .unwrap();
    let first = receiver.receive(10, Duration::from_secs(5)).await.unwrap();
    assert_eq!(first[0].sequence_number, after[0].sequence_number);
    let states = b.compaction_states("table").unwrap();
    assert_eq!(states[0].last_outcome, Some(outcome));
    assert_eq!(states[0].sealed_dirty_bytes, 0, "{:?}", states[0]);
}

#[tokio::test]
async fn a_compacted_hub_refuses_an_event_without_a_partition_key_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::open(config(dir.path())).await.unwrap();
    compacted_hub(&b, "table").await;
    for target in [SendTarget::RoundRobin, SendTarget::Partition("0".into())] {
        let err = b
            .send("table", target, vec![EventData::new("no key")])
            .await
            .unwrap_err();
        assert_missing_key(&err);
        let text = err.to_string();
        assert!(
            text.contains("\"table\"") && text.contains("no partition key"),
            "{text}"
        );
    }
    assert!(b.partition_properties("table", "0").unwrap().is_empty);
}

#[tokio::test]
async fn update_hub_changes_retention_and_cleanup_durably_and_live() {
    let dir = tempfile::tempdir().unwrap();
    {
        let b = Broker::open(config(dir.path())).await.unwrap();
        b.create_hub(HubSpec::new("h", 2)).await.unwrap();
        b.send("h", SendTarget::RoundRobin, vec![EventData::new("keyless")])
            .await
            .unwrap();
        let update = HubUpdate {
            retention_age_ms: Some(None),
            retention_bytes_max: Some(Some(1 << 30)),
            cleanup_policy: Some(CleanupPolicy::DeleteOrCompact),
            min_compaction_lag_ms: Some(60_000),
            tombstone_retention_ms: Some(3_600_000),
            capture: None,
        };
        let updated = b.update_hub("h", update).await.unwrap();
        assert_eq!(updated.retention_age_ms, None);
        assert_eq!(updated.retention_bytes_max, Some(1 << 30));
        let cleanup = HubCleanup {
            policy: CleanupPolicy::DeleteOrCompact,
            min_compaction_lag_ms: 60_000,
            tombstone_retention_ms: 3_600_000,
        };
        assert_eq!(updated.cleanup, cleanup);
        // Live: keyless events are refused from now on.
        let err = b
            .send("h", SendTarget::RoundRobin, vec![EventData::new("keyless")])
            .await
            .unwrap_err();
        assert_missing_key(&err);
        // Bad settings change nothing.
        for bad in [
            HubUpdate {
                min_compaction_lag_ms: Some(-1),
                ..HubUpdate::default()
            },
            HubUpdate {
                tombstone_retention_ms: Some(-5),
                ..HubUpdate::default()
            },
            HubUpdate {
                retention_age_ms: Some(Some(0)),
                cleanup_policy: Some(CleanupPolicy::Delete),
                ..HubUpdate::default()
            },
        ] {
            let err = b.update_hub("h", bad).await.unwrap_err();
            assert!(matches!(err, BrokerError::InvalidRetention(_)), "{err:?}");
        }
        assert_eq!(b.describe_hub("h").unwrap(), updated);
        assert!(matches!(
            b.update_hub("nope", HubUpdate::default()).await,
            Err(BrokerError::HubNotFound { .. })
        ));
        b.shutdown().await.unwrap();
    }
    let b = Broker::open(config(dir.path())).await.unwrap();
    let reopened = b.describe_hub("h").unwrap();
    assert_eq!(reopened.cleanup.policy, CleanupPolicy::DeleteOrCompact);
    assert_eq!(reopened.cleanup.min_compaction_lag_ms, 60_000);
    assert_eq!(reopened.retention_age_ms, None);
    let err = b
        .send("h", SendTarget::RoundRobin, vec![EventData::new("keyless")])
        .await
        .unwrap_err();
    assert_missing_key(&err);
}

#[tokio::test]
async fn bad_cleanup_settings_on_create_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let b = Broker::open(config(dir.path())).await.unwrap();
    let spec = HubSpec {
        cleanup: HubCleanup {
            min_compaction_lag_ms: -1,
            ..compacted()
        },
        ..HubSpec::new("h", 1)
    };
    let err = b.create_hub(spec).await.unwrap_err();
    assert!(err.to_string().contains("minimum compaction lag"), "{err}");
    assert!(b.list_hubs().is_empty());
}

#[tokio::test]
async fn a_catalog_written_before_cleanup_policies_opens_with_delete() {
    let dir = tempfile::tempdir().unwrap();
    {
        let b = Broker::open(config(dir.path())).await.unwrap();
        b.create_hub(HubSpec::new("old", 1)).await.unwrap();
        b.shutdown().await.unwrap();
    }
    let path = dir.path().join("catalog.json");
    let mut catalog: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    catalog["hubs"][0]
        .as_object_mut()
        .unwrap()
        .remove("cleanup")
        .expect("written today");
    std::fs::write(&path, serde_json::to_vec(&catalog).unwrap()).unwrap();
    let b = Broker::open(config(dir.path())).await.unwrap();
    assert_eq!(
        b.describe_hub("old").unwrap().cleanup,
        HubCleanup::default()
    );
}

#[tokio::test]
async fn compaction_runs_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let config = BrokerConfig {
        compaction_check_interval: Duration::from_millis(50),
        ..config(dir.path())
    };
    let b = Broker::open(config).await.unwrap();
    compacted_hub(&b, "table").await;
    send_versions(&b, "table", 3, 40).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let state = b.compaction_states("table").unwrap()[0];
        if state.last_outcome.is_some_and(|o| o.events_removed > 0) {
            assert!(state.last_run_ms.is_some());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no background compaction: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let kept = read_all(&b, "table", 0).len();
    assert!(kept < 120, "{kept} events kept of 120");
}

#[tokio::test]
async fn a_slowly_written_compacted_partition_is_sealed_by_age_and_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let config = BrokerConfig {
        compaction_segment_age_max: Duration::from_secs(60),
        ..config(dir.path())
    };
    let b = Broker::open_with_clock(config, clock.clone())
        .await
        .unwrap();
    compacted_hub(&b, "table").await;
    for v in 0..3 {
        send_keyed(&b, "table", "a", format!("v{v}")).await;
    }
    b.compact_due().await;
    assert_eq!(
        read_all(&b, "table", 0).len(),
        3,
        "the active segment is young"
    );
    clock.advance_ms(60_000);
    assert_eq!(b.compact_due().await, 1);
    let kept = keys_and_versions(&read_all(&b, "table", 0));
    assert_eq!(kept, [("a".to_owned(), "v2".to_owned())]);
    // A hub that does not compact is left alone, even asked to compact now.
    b.create_hub(HubSpec::new("plain", 1)).await.unwrap();
    b.send("plain", SendTarget::RoundRobin, vec![EventData::new("x")])
        .await
        .unwrap();
    let outcomes = b.compact_hub("plain").await.unwrap();
    assert_eq!(outcomes, [tributary_broker::CompactionOutcome::default()]);
    assert_eq!(b.compaction_states("plain").unwrap()[0].last_run_ms, None);
}
