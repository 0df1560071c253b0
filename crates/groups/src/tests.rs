//! The coordinator over a real broker, with tokio's clock paused so timeouts are exact.

use std::sync::Arc;
use std::time::Duration;

use tributary_broker::{BrokerConfig, Durability, HubSpec, SendTarget};
use tributary_event::{EventData, ManualClock};

use super::*;

async fn open_broker(dir: &std::path::Path, clock: Arc<ManualClock>) -> Broker {
    let mut config = BrokerConfig::new(dir);
    // Acknowledged on write, so sends finish without the runtime going idle (and a paused
    // clock auto-advancing).
    config.log.durability = Durability::None;
    config.retention_check_interval = Duration::from_secs(3600 * 24);
    Broker::open_with_clock(config, clock).await.unwrap()
}

async fn setup(
    partitions: u32,
) -> (
    tempfile::TempDir,
    Broker,
    GroupCoordinator,
    Arc<ManualClock>,
) {
    tokio::time::pause();
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let broker = open_broker(dir.path(), clock.clone()).await;
    broker
        .create_hub(HubSpec::new("s", partitions))
        .await
        .unwrap();
    let config = CoordinatorConfig {
        sweep_interval: Duration::from_secs(3600 * 24),
        ..CoordinatorConfig::default()
    };
    let coordinator = GroupCoordinator::open(broker.clone(), config)
        .await
        .unwrap();
    (dir, broker, coordinator, clock)
}

async fn put(broker: &Broker, partition: u32, n: usize) {
    let events = (0..n).map(|i| EventData::new(format!("m{i}"))).collect();
    broker
        .send("s", SendTarget::Partition(partition.to_string()), events)
        .await
        .unwrap();
}

fn join_request(group: &str, instance: &str, timeout_ms: u32) -> JoinRequest {
    JoinRequest {
        stream: "s".into(),
        group: group.into(),
        instance: Some(instance.into()),
        start: StartPosition::TrimHorizon,
        commit_on_get: true,
        timeout_ms,
    }
}

fn sequences(batch: &GroupBatch) -> Vec<i64> {
    batch
        .events
        .iter()
        .map(|(_, e)| e.sequence_number)
        .collect()
}

async fn advance_ms(ms: u64) {
    tokio::time::advance(Duration::from_millis(ms)).await;
}

#[tokio::test]
async fn seed_scenario_a_falls_silent_and_b_gets_the_uncommitted_batch_again() {
    let (_dir, broker, c, _) = setup(1).await;
    put(&broker, 0, 300).await;
    let a = c.join(join_request("g", "a", 30_000)).await.unwrap();
    let first = c.get(&a, 100, u64::MAX).await.unwrap();
    assert_eq!(sequences(&first), (0..100).collect::<Vec<_>>());
    let second = c.get(&first.session, 100, u64::MAX).await.unwrap();
    assert_eq!(sequences(&second), (100..200).collect::<Vec<_>>());
    let described = c.describe("s", "g").await.unwrap();
    assert_eq!(described.reservations[0].committed_offset, Some(99));
    assert_eq!(described.reservations[0].instance.as_deref(), Some("a"));
    // B joins while A still holds the only partition: it gets nothing.
    let b = c.join(join_request("g", "b", 120_000)).await.unwrap();
    let idle = c.get(&b, 100, u64::MAX).await.unwrap();
    assert!(idle.events.is_empty());
    // A processes 15 and falls silent longer than its timeout.
    advance_ms(30_001).await;
    let taken = c.get(&idle.session, 100, u64::MAX).await.unwrap();
    assert_eq!(
        sequences(&taken),
        (100..200).collect::<Vec<_>>(),
        "B gets A's uncommitted batch"
    );
    // A comes back with its cursor: fenced, for get, commit and heartbeat alike.
    for result in [
        c.get(&second.session, 100, u64::MAX)
            .await
            .map(|b| b.session),
        c.commit(&second.session).await,
        c.heartbeat(&second.session).await,
    ] {
        assert!(
            matches!(result, Err(CoordinatorError::Fenced { .. })),
            "{result:?}"
        );
    }
    let next = c.get(&taken.session, 100, u64::MAX).await.unwrap();
    assert_eq!(sequences(&next), (200..300).collect::<Vec<_>>());
    let described = c.describe("s", "g").await.unwrap();
    assert_eq!(described.reservations[0].committed_offset, Some(199));
    assert_eq!(described.reservations[0].instance.as_deref(), Some("b"));
}

#[tokio::test]
async fn one_to_twelve_instances_over_ten_partitions_rebalance_sticky_and_lose_nothing() {
    let (_dir, broker, c, _) = setup(10).await;
    for p in 0..10 {
        put(&broker, p, 5).await;
    }
    let mut sessions = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for n in 1..=12 {
        let s = c
            .join(join_request("g", &format!("i{n:02}"), 60_000))
            .await
            .unwrap();
        sessions.push(s);
        let holders = holders(&c).await;
        assert_eq!(holders.len(), 10, "every partition is held");
        let mut counts: std::collections::BTreeMap<String, u32> = Default::default();
        for h in holders {
            *counts.entry(h).or_default() += 1;
        }
        let (lo, hi) = (10 / n, 10_u32.div_ceil(n));
        assert!(
            counts.values().all(|c| (lo..=hi).contains(c)),
            "{n} instances: {counts:?}"
        );
        // Everyone reads what it holds.
        for s in &mut sessions {
            let batch = c.get(s, 1000, u64::MAX).await.unwrap();
            seen.extend(batch.events.iter().map(|(p, e)| (*p, e.sequence_number)));
            *s = batch.session;
        }
    }
    assert_eq!(seen.len(), 50, "every message delivered");
    // Eleven of twelve fall silent; the survivor ends up with all ten partitions.
    advance_ms(60_001).await;
    let survivor = c.join(join_request("g", "i12", 60_000)).await.unwrap();
    let batch = c.get(&survivor, 1000, u64::MAX).await.unwrap();
    assert!(batch.events.is_empty(), "everything was committed");
    let holders = holders(&c).await;
    assert!(holders.iter().all(|h| h == "i12"), "{holders:?}");
}

async fn holders(c: &GroupCoordinator) -> Vec<String> {
    c.describe("s", "g")
        .await
        .unwrap()
        .reservations
        .into_iter()
        .filter_map(|r| r.instance)
        .collect()
}

#[tokio::test]
async fn a_retried_get_gets_the_same_batch_and_an_older_cursor_is_refused() {
    let (_dir, broker, c, _) = setup(1).await;
    put(&broker, 0, 30).await;
    let a = c.join(join_request("g", "a", 30_000)).await.unwrap();
    let b1 = c.get(&a, 10, u64::MAX).await.unwrap();
    let b2 = c.get(&b1.session, 10, u64::MAX).await.unwrap();
    // The answer to b2 was lost; the client retries with the same cursor.
    let retried = c.get(&b1.session, 10, u64::MAX).await.unwrap();
    assert_eq!(sequences(&retried), sequences(&b2));
    assert_eq!(retried.session, b2.session);
    let b3 = c.get(&retried.session, 10, u64::MAX).await.unwrap();
    assert_eq!(sequences(&b3), (20..30).collect::<Vec<_>>());
    assert!(matches!(
        c.get(&a, 10, u64::MAX).await,
        Err(CoordinatorError::StaleCursor { .. })
    ));
}

#[tokio::test]
async fn a_commit_after_a_partition_was_taken_away_is_refused() {
    let (_dir, broker, c, _) = setup(2).await;
    put(&broker, 0, 10).await;
    put(&broker, 1, 10).await;
    let mut request = join_request("g", "a", 30_000);
    request.commit_on_get = false;
    let a = c.join(request).await.unwrap();
    let batch = c.get(&a, 100, u64::MAX).await.unwrap();
    assert_eq!(batch.events.len(), 20);
    c.join(join_request("g", "b", 30_000)).await.unwrap();
    let refused = c.commit(&batch.session).await;
    assert!(
        matches!(refused, Err(CoordinatorError::Fenced { .. })),
        "{refused:?}"
    );
    let d = c.describe("s", "g").await.unwrap();
    assert!(
        d.reservations.iter().all(|r| r.committed_offset.is_none()),
        "nothing committed"
    );
    // A get with that cursor is served and moves to the new epoch; a commit then works, for
    // the partition A still holds only.
    let next = c.get(&batch.session, 100, u64::MAX).await.unwrap();
    assert!(next.events.is_empty());
    c.commit(&next.session).await.unwrap();
    let d = c.describe("s", "g").await.unwrap();
    let a_holds = d
        .reservations
        .iter()
        .find(|r| r.instance.as_deref() == Some("a"))
        .unwrap();
    assert_eq!(a_holds.committed_offset, Some(9));
    let b_holds = d
        .reservations
        .iter()
        .find(|r| r.instance.as_deref() == Some("b"))
        .unwrap();
    assert_eq!(b_holds.committed_offset, None);
}

#[tokio::test]
async fn heartbeats_keep_an_instance_and_a_new_cursor_fences_the_old_one() {
    let (_dir, broker, c, _) = setup(1).await;
    put(&broker, 0, 10).await;
    let a = c.join(join_request("g", "a", 10_000)).await.unwrap();
    for _ in 0..5 {
        advance_ms(8_000).await;
        c.heartbeat(&a).await.unwrap();
    }
    let batch = c.get(&a, 100, u64::MAX).await.unwrap();
    assert_eq!(batch.events.len(), 10);
    let again = c.join(join_request("g", "a", 10_000)).await.unwrap();
    assert!(matches!(
        c.get(&batch.session, 100, u64::MAX).await,
        Err(CoordinatorError::Fenced { .. })
    ));
    let redelivered = c.get(&again, 100, u64::MAX).await.unwrap();
    assert_eq!(
        redelivered.events.len(),
        10,
        "the new incarnation starts at the committed offset"
    );
}

#[tokio::test]
async fn groups_and_offsets_survive_a_restart_and_old_cursors_rejoin() {
    let (dir, broker, c, clock) = setup(1).await;
    put(&broker, 0, 50).await;
    let a = c.join(join_request("g", "a", 30_000)).await.unwrap();
    let b1 = c.get(&a, 20, u64::MAX).await.unwrap();
    let b2 = c.get(&b1.session, 20, u64::MAX).await.unwrap();
    drop(c);
    broker.shutdown().await.unwrap();
    drop(broker);
    let broker = open_broker(dir.path(), clock).await;
    let c = GroupCoordinator::open(broker.clone(), CoordinatorConfig::default())
        .await
        .unwrap();
    let d = c.describe("s", "g").await.unwrap();
    assert_eq!(d.reservations[0].committed_offset, Some(19));
    assert_eq!(d.reservations[0].instance, None, "instances are not kept");
    let resumed = c.get(&b2.session, 20, u64::MAX).await.unwrap();
    assert_eq!(
        sequences(&resumed),
        (20..40).collect::<Vec<_>>(),
        "uncommitted batch delivered again"
    );
    assert!(resumed.session.epoch > b2.session.epoch);
}

#[tokio::test]
async fn start_positions_apply_only_to_a_new_group_and_reset_moves_everyone() {
    let (_dir, broker, c, _) = setup(1).await;
    put(&broker, 0, 10).await;
    let mut latest = join_request("g", "a", 30_000);
    latest.start = StartPosition::Latest;
    let a = c.join(latest).await.unwrap();
    put(&broker, 0, 5).await;
    let batch = c.get(&a, 100, u64::MAX).await.unwrap();
    assert_eq!(sequences(&batch), (10..15).collect::<Vec<_>>());
    // Joining with TRIM_HORIZON now changes nothing: the group exists.
    let b = c.join(join_request("g", "b", 30_000)).await.unwrap();
    assert!(c.get(&b, 100, u64::MAX).await.unwrap().events.is_empty());
    c.reset("s", "g", StartPosition::TrimHorizon).await.unwrap();
    let again = c.get(&batch.session, 100, u64::MAX).await.unwrap();
    assert_eq!(sequences(&again), (0..15).collect::<Vec<_>>());
}

#[tokio::test]
async fn at_most_fifty_groups_per_stream_and_bad_names_are_refused() {
    let (_dir, _broker, c, _) = setup(1).await;
    for i in 0..50 {
        c.join(join_request(&format!("g{i}"), "a", 30_000))
            .await
            .unwrap();
    }
    assert!(matches!(
        c.join(join_request("g50", "a", 30_000)).await,
        Err(CoordinatorError::GroupLimit { max: 50, .. })
    ));
    c.join(join_request("G7", "b", 30_000)).await.unwrap();
    assert_eq!(c.list(Some("s")).len(), 50);
    for (group, instance) in [("bad group", "a"), ("", "a"), ("g", "in/stance")] {
        assert!(matches!(
            c.join(join_request(group, instance, 30_000)).await,
            Err(CoordinatorError::InvalidName { .. })
        ));
    }
    assert!(matches!(
        c.join(join_request("g", "a", 10)).await,
        Err(CoordinatorError::InvalidArgument(_))
    ));
    assert!(matches!(
        c.describe("nope", "g0").await,
        Err(CoordinatorError::Broker(BrokerError::HubNotFound { .. }))
    ));
}

#[tokio::test]
async fn an_unused_group_disappears_after_the_retention_period_and_with_its_stream() {
    let (_dir, broker, c, clock) = setup(1).await;
    c.join(join_request("old", "a", 30_000)).await.unwrap();
    clock.advance_ms(23 * 3600 * 1000);
    c.join(join_request("young", "a", 30_000)).await.unwrap();
    assert_eq!(c.sweep().await.unwrap(), 0);
    clock.advance_ms(2 * 3600 * 1000);
    assert_eq!(c.sweep().await.unwrap(), 1);
    assert!(matches!(
        c.describe("s", "old").await,
        Err(CoordinatorError::GroupNotFound { .. })
    ));
    broker.delete_hub("s").await.unwrap();
    broker.create_hub(HubSpec::new("s", 1)).await.unwrap();
    assert!(matches!(
        c.describe("s", "young").await,
        Err(CoordinatorError::GroupNotFound { .. })
    ));
    assert!(c.list(None).is_empty());
}

#[tokio::test]
async fn an_answer_keeps_to_its_byte_budget_inside_a_batch() {
    let (_dir, broker, c, _) = setup(2).await;
    // One batch of ten 100-byte messages per partition: the log reads whole batches.
    for p in 0..2u32 {
        let events = (0..10).map(|_| EventData::new(vec![b'x'; 100])).collect();
        broker
            .send("s", SendTarget::Partition(p.to_string()), events)
            .await
            .unwrap();
    }
    let a = c.join(join_request("g", "a", 30_000)).await.unwrap();
    let first = c.get(&a, 100, 350).await.unwrap();
    assert_eq!(
        sequences(&first),
        [0, 1, 2],
        "350 bytes hold three messages"
    );
    let second = c.get(&first.session, 100, 50).await.unwrap();
    assert_eq!(second.events.len(), 1, "one message even beyond the budget");
    let mut seen: Vec<(u32, i64)> = first
        .events
        .iter()
        .chain(&second.events)
        .map(|(p, e)| (*p, e.sequence_number))
        .collect();
    let mut session = second.session;
    loop {
        let batch = c.get(&session, 100, 250).await.unwrap();
        assert!(batch.events.len() <= 2, "250 bytes hold two messages");
        if batch.events.is_empty() {
            break;
        }
        seen.extend(batch.events.iter().map(|(p, e)| (*p, e.sequence_number)));
        session = batch.session;
    }
    seen.sort_unstable();
    let all: Vec<(u32, i64)> = (0..2).flat_map(|p| (0..10).map(move |s| (p, s))).collect();
    assert_eq!(seen, all, "every message once, none skipped");
}
