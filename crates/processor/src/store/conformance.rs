//! The behaviour every [`CheckpointStore`] must show, written once and run against each store.
//!
//! Each check works under its own event hub name, so all of them can share one store; a store
//! that outlives one run (a database) needs a fresh namespace, schema or database per run.
//! Public with the `conformance` feature, so a test that starts a real server (PostgreSQL, a
//! blob service) runs the same checks as this crate's own tests.

use std::collections::BTreeSet;
use std::sync::Arc;

use tributary_event::ManualClock;

use super::{
    Checkpoint, CheckpointStore, HostRecord, Ownership, OwnershipFence, OwnershipListing,
    StoreError,
};

/// The (namespace, hub, consumer group) the helpers below use.
pub const SCOPE: (&str, &str, &str) = ("ns.example.test", "hub", "$Default");

/// A claim for a partition nobody has claimed yet, under [`SCOPE`].
#[cfg(all(test, feature = "sqlite"))]
pub(crate) fn new_claim(partition_id: &str, owner_id: &str) -> Ownership {
    claim_in(SCOPE.1, partition_id, owner_id, None)
}

fn claim_in(hub: &str, partition_id: &str, owner_id: &str, etag: Option<&str>) -> Ownership {
    Ownership {
        fully_qualified_namespace: SCOPE.0.to_owned(),
        event_hub_name: hub.to_owned(),
        consumer_group: SCOPE.2.to_owned(),
        partition_id: partition_id.to_owned(),
        owner_id: owner_id.to_owned(),
        last_modified_time_ms: 0,
        etag: etag.map(str::to_owned),
        version: 0,
    }
}

/// A checkpoint under [`SCOPE`].
#[cfg(all(test, feature = "sqlite"))]
pub(crate) fn checkpoint(
    partition_id: &str,
    offset: Option<u64>,
    sequence_number: Option<i64>,
) -> Checkpoint {
    checkpoint_in(SCOPE.1, partition_id, offset, sequence_number)
}

fn checkpoint_in(
    hub: &str,
    partition_id: &str,
    offset: Option<u64>,
    sequence_number: Option<i64>,
) -> Checkpoint {
    Checkpoint {
        fully_qualified_namespace: SCOPE.0.to_owned(),
        event_hub_name: hub.to_owned(),
        consumer_group: SCOPE.2.to_owned(),
        partition_id: partition_id.to_owned(),
        offset,
        sequence_number,
    }
}

fn fence(owner_id: &str) -> OwnershipFence {
    OwnershipFence {
        owner_id: owner_id.to_owned(),
    }
}

async fn claim_one(store: &dyn CheckpointStore, claim: Ownership) -> Option<Ownership> {
    let mut won = store.claim_ownership(vec![claim]).await.unwrap();
    assert!(won.len() <= 1);
    won.pop()
}

async fn list(store: &dyn CheckpointStore, hub: &str) -> Vec<Ownership> {
    let mut records = store.list_ownership(SCOPE.0, hub, SCOPE.2).await.unwrap();
    records.sort_by(|a, b| a.partition_id.cmp(&b.partition_id));
    records
}

/// Runs every check against `store`, whose modification times come from `clock`.
pub async fn run_all(store: &dyn CheckpointStore, clock: &ManualClock) {
    clock.set_ms(123_456);
    a_first_claim_creates_version_one(store, Some(123_456)).await;
    run_the_rest(store).await;
    silent_hosts_are_forgotten_after_the_retention(store, clock).await;
}

/// Runs every check against `store`, whose modification times come from its server's clock
/// (they must be within ten minutes of this machine's).
pub async fn run_all_with_server_clock(store: &dyn CheckpointStore) {
    a_first_claim_creates_version_one(store, None).await;
    run_the_rest(store).await;
}

async fn run_the_rest(store: &dyn CheckpointStore) {
    a_second_first_claim_loses_quietly(store).await;
    claims_with_the_current_etag_win_and_stale_ones_lose(store).await;
    relinquishing_is_a_claim_that_leaves_no_owner(store).await;
    one_call_can_win_some_claims_and_lose_others(store).await;
    listing_is_scoped_and_case_insensitive(store).await;
    checkpoints_need_the_current_owner(store).await;
    checkpoints_overwrite_and_are_scoped(store).await;
    checkpoints_without_a_position_are_invalid(store).await;
    versions_never_go_back(store).await;
    host_records_are_renewed_listed_and_removed(store).await;
}

/// `expected_time_ms`: the modification time the store must stamp; `None` for "about now".
async fn a_first_claim_creates_version_one(
    store: &dyn CheckpointStore,
    expected_time_ms: Option<i64>,
) {
    let hub = "first-claim";
    let mut claim = claim_in(hub, "0", "host-a", None);
    claim.version = 99; // The store assigns versions; what the claimant sends is ignored.
    claim.last_modified_time_ms = 5;
    let won = claim_one(store, claim).await.expect("the first claim wins");
    assert_eq!(won.owner_id, "host-a");
    assert_eq!(won.partition_id, "0");
    assert_eq!(won.version, 1);
    if let Some(expected) = expected_time_ms {
        assert_eq!(won.last_modified_time_ms, expected);
    } else {
        let now_ms = i64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap();
        assert!(
            (won.last_modified_time_ms - now_ms).abs() < 600_000,
            "modified at {} ms, now is {now_ms} ms",
            won.last_modified_time_ms
        );
    }
    assert!(won.etag.as_deref().is_some_and(|etag| !etag.is_empty()));
    assert_eq!(won.consumer_group, "$default");
    assert_eq!(list(store, hub).await, vec![won]);
}

async fn a_second_first_claim_loses_quietly(store: &dyn CheckpointStore) {
    let hub = "second-first-claim";
    let first = claim_one(store, claim_in(hub, "0", "host-a", None)).await;
    assert!(first.is_some());
    let second = claim_one(store, claim_in(hub, "0", "host-b", None)).await;
    assert_eq!(second, None);
    let records = list(store, hub).await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].owner_id, "host-a");
}

async fn claims_with_the_current_etag_win_and_stale_ones_lose(store: &dyn CheckpointStore) {
    let hub = "etag-claims";
    let first = claim_one(store, claim_in(hub, "0", "host-a", None))
        .await
        .unwrap();
    let first_etag = first.etag.as_deref();
    // A renewal by the same owner is a claim like any other: new etag, next version.
    let renewed = claim_one(store, claim_in(hub, "0", "host-a", first_etag))
        .await
        .expect("a claim with the current etag wins");
    assert_eq!(renewed.version, 2);
    assert_ne!(renewed.etag, first.etag);
    // The old etag is stale now, whoever uses it.
    assert_eq!(
        claim_one(store, claim_in(hub, "0", "host-b", first_etag)).await,
        None
    );
    assert_eq!(
        claim_one(store, claim_in(hub, "0", "host-a", first_etag)).await,
        None
    );
    // With the current etag, another host takes it over.
    let stolen = claim_one(store, claim_in(hub, "0", "host-b", renewed.etag.as_deref()))
        .await
        .expect("a steal with the current etag wins");
    assert_eq!(stolen.owner_id, "host-b");
    assert_eq!(stolen.version, 3);
    // An etag for a partition that has no record never matches.
    assert_eq!(
        claim_one(store, claim_in(hub, "1", "host-a", renewed.etag.as_deref())).await,
        None
    );
    assert_eq!(list(store, hub).await, vec![stolen]);
}

async fn relinquishing_is_a_claim_that_leaves_no_owner(store: &dyn CheckpointStore) {
    let hub = "relinquish";
    let owned = claim_one(store, claim_in(hub, "0", "host-a", None))
        .await
        .unwrap();
    let released = claim_one(store, claim_in(hub, "0", "", owned.etag.as_deref()))
        .await
        .expect("the owner can relinquish with its etag");
    assert!(released.is_relinquished());
    assert_eq!(released.version, owned.version + 1);
    assert!(list(store, hub).await[0].is_relinquished());
    let taken = claim_one(
        store,
        claim_in(hub, "0", "host-b", released.etag.as_deref()),
    )
    .await
    .expect("a relinquished partition can be claimed with its etag");
    assert_eq!(taken.version, released.version + 1);
}

async fn one_call_can_win_some_claims_and_lose_others(store: &dyn CheckpointStore) {
    let hub = "mixed";
    let taken = claim_one(store, claim_in(hub, "1", "host-b", None))
        .await
        .unwrap();
    let won = store
        .claim_ownership(vec![
            claim_in(hub, "0", "host-a", None),
            claim_in(hub, "1", "host-a", None),
            claim_in(hub, "2", "host-a", None),
        ])
        .await
        .unwrap();
    let won_ids: Vec<&str> = won.iter().map(|r| r.partition_id.as_str()).collect();
    assert_eq!(won_ids, ["0", "2"]);
    let records = list(store, hub).await;
    assert_eq!(records.len(), 3);
    assert_eq!(records[1], taken);
    assert!(store.claim_ownership(Vec::new()).await.unwrap().is_empty());
}

async fn listing_is_scoped_and_case_insensitive(store: &dyn CheckpointStore) {
    let hub = "scoped";
    let mut claim = claim_in(hub, "0", "host-a", None);
    claim.consumer_group = "$DEFAULT".to_owned();
    claim.event_hub_name = "SCOPED".to_owned();
    let won = claim_one(store, claim).await.unwrap();
    // The same key in other spellings is the same record.
    let listed = store
        .list_ownership(&SCOPE.0.to_uppercase(), hub, "$default")
        .await
        .unwrap();
    assert_eq!(listed, vec![won.clone()]);
    let mut again = claim_in(hub, "0", "host-b", None);
    again.consumer_group = "$Default".to_owned();
    assert_eq!(claim_one(store, again).await, None);
    // Another consumer group or hub is another set of records.
    assert!(
        store
            .list_ownership(SCOPE.0, hub, "audit")
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .list_ownership(SCOPE.0, "scoped-other", SCOPE.2)
            .await
            .unwrap()
            .is_empty()
    );
    let mut other_group = claim_in(hub, "0", "host-b", None);
    other_group.consumer_group = "audit".to_owned();
    assert!(claim_one(store, other_group).await.is_some());
    assert_eq!(list(store, hub).await, vec![won]);
}

async fn checkpoints_need_the_current_owner(store: &dyn CheckpointStore) {
    let hub = "fenced";
    let not_claimed = store
        .update_checkpoint(checkpoint_in(hub, "0", Some(10), Some(1)), &fence("host-a"))
        .await;
    assert!(matches!(not_claimed, Err(StoreError::OwnershipLost { .. })));

    let owned = claim_one(store, claim_in(hub, "0", "host-a", None))
        .await
        .unwrap();
    store
        .update_checkpoint(checkpoint_in(hub, "0", Some(10), Some(1)), &fence("host-a"))
        .await
        .expect("the owner may checkpoint");
    let stolen = claim_one(store, claim_in(hub, "0", "host-b", owned.etag.as_deref()))
        .await
        .unwrap();
    let error = store
        .update_checkpoint(checkpoint_in(hub, "0", Some(20), Some(2)), &fence("host-a"))
        .await
        .unwrap_err();
    match &error {
        StoreError::OwnershipLost {
            partition_id,
            current_owner,
            fence_owner,
        } => {
            assert_eq!(partition_id, "0");
            assert_eq!(current_owner, "host-b");
            assert_eq!(fence_owner, "host-a");
        }
        other => panic!("expected OwnershipLost, got {other:?}"),
    }
    assert!(error.to_string().contains("\"host-b\""), "{error}");
    // The refused checkpoint left the stored one alone.
    let stored = store.list_checkpoints(SCOPE.0, hub, SCOPE.2).await.unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].offset, Some(10));

    // A relinquished partition has no owner, and the empty owner id is never a valid fence.
    claim_one(store, claim_in(hub, "0", "", stolen.etag.as_deref()))
        .await
        .unwrap();
    for owner in ["host-b", ""] {
        let refused = store
            .update_checkpoint(checkpoint_in(hub, "0", Some(30), Some(3)), &fence(owner))
            .await;
        assert!(matches!(refused, Err(StoreError::OwnershipLost { .. })));
    }
}

async fn checkpoints_overwrite_and_are_scoped(store: &dyn CheckpointStore) {
    let hub = "overwrite";
    for partition_id in ["0", "1"] {
        claim_one(store, claim_in(hub, partition_id, "host-a", None))
            .await
            .unwrap();
    }
    let writes = [
        ("0", Some(10), Some(1)),
        ("1", None, Some(5)),
        ("0", Some(20), Some(2)),
    ];
    for (partition_id, offset, sequence_number) in writes {
        let mut checkpoint = checkpoint_in(hub, partition_id, offset, sequence_number);
        checkpoint.consumer_group = "$DEFAULT".to_owned();
        store
            .update_checkpoint(checkpoint, &fence("host-a"))
            .await
            .unwrap();
    }
    let mut stored = store
        .list_checkpoints(SCOPE.0, hub, "$default")
        .await
        .unwrap();
    stored.sort_by(|a, b| a.partition_id.cmp(&b.partition_id));
    let positions: Vec<_> = stored
        .iter()
        .map(|c| (c.partition_id.as_str(), c.offset, c.sequence_number))
        .collect();
    assert_eq!(positions, [("0", Some(20), Some(2)), ("1", None, Some(5))]);
    assert_eq!(stored[0].consumer_group, "$default");
    assert!(
        store
            .list_checkpoints(SCOPE.0, hub, "audit")
            .await
            .unwrap()
            .is_empty()
    );
}

async fn checkpoints_without_a_position_are_invalid(store: &dyn CheckpointStore) {
    let hub = "invalid";
    claim_one(store, claim_in(hub, "0", "host-a", None))
        .await
        .unwrap();
    let error = store
        .update_checkpoint(checkpoint_in(hub, "0", None, None), &fence("host-a"))
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::Invalid { .. }), "{error}");
    let empty_partition = store
        .claim_ownership(vec![claim_in(hub, "", "host-a", None)])
        .await;
    assert!(matches!(empty_partition, Err(StoreError::Invalid { .. })));
}

async fn versions_never_go_back(store: &dyn CheckpointStore) {
    let hub = "versions";
    let mut current = claim_one(store, claim_in(hub, "0", "host-a", None))
        .await
        .unwrap();
    let owners = ["host-a", "host-b", "", "host-c", "host-a"];
    for round in 0..20 {
        let owner = owners[round % owners.len()];
        // A stale claim in between changes nothing.
        assert_eq!(
            claim_one(store, claim_in(hub, "0", "host-z", Some("stale-etag"))).await,
            None
        );
        let next = claim_one(store, claim_in(hub, "0", owner, current.etag.as_deref()))
            .await
            .unwrap();
        assert_eq!(next.version, current.version + 1);
        current = next;
    }
    assert_eq!(list(store, hub).await, vec![current]);
}

/// The host records of `listing`, by owner, after checking it holds the hub's ownership too.
async fn hosts_of(
    store: &dyn CheckpointStore,
    hub: &str,
    listing: OwnershipListing,
) -> Vec<HostRecord> {
    let mut ownership = listing.ownership;
    ownership.sort_by(|a, b| a.partition_id.cmp(&b.partition_id));
    assert_eq!(ownership, list(store, hub).await, "a listing has ownership");
    let mut hosts = listing.hosts;
    hosts.sort_by(|a, b| a.owner_id.cmp(&b.owner_id));
    hosts
}

/// The host records a renewal of `owner_id` answers.
async fn renew(store: &dyn CheckpointStore, hub: &str, owner_id: &str) -> Vec<HostRecord> {
    let listing = store.renew_host(SCOPE.0, hub, SCOPE.2, owner_id).await;
    hosts_of(store, hub, listing.unwrap()).await
}

/// The host records `list_ownership_and_hosts` shows.
async fn listed_hosts(store: &dyn CheckpointStore, hub: &str) -> Vec<HostRecord> {
    let listing = store.list_ownership_and_hosts(SCOPE.0, hub, SCOPE.2).await;
    hosts_of(store, hub, listing.unwrap()).await
}

fn versions(hosts: &[HostRecord]) -> Vec<(&str, i64)> {
    hosts
        .iter()
        .map(|host| (host.owner_id.as_str(), host.version))
        .collect()
}

/// Host records (stores that keep them): a renewal creates or bumps the host's record and lists
/// the group's ownership and hosts in one call; a listing shows both and renews nothing;
/// records are scoped and removable. A store that keeps none lists ownership and no hosts.
async fn host_records_are_renewed_listed_and_removed(store: &dyn CheckpointStore) {
    let hub = "hosts";
    claim_one(store, claim_in(hub, "0", "host-a", None))
        .await
        .unwrap();
    if !store.keeps_host_records() {
        assert_eq!(renew(store, hub, "host-a").await, vec![]);
        assert_eq!(listed_hosts(store, hub).await, vec![]);
        return;
    }
    assert_eq!(listed_hosts(store, hub).await, vec![]);
    assert_eq!(
        versions(&renew(store, hub, "host-a").await),
        [("host-a", 1)]
    );
    assert_eq!(
        versions(&renew(store, hub, "host-a").await),
        [("host-a", 2)]
    );
    let hosts = renew(store, "HOSTS", "host-b").await;
    assert_eq!(versions(&hosts), [("host-a", 2), ("host-b", 1)]);
    assert!(hosts.iter().all(|host| host.last_modified_time_ms > 0));
    // Listing shows the records as they are and renews none of them.
    assert_eq!(listed_hosts(store, hub).await, hosts);
    assert_eq!(listed_hosts(store, hub).await, hosts);
    assert_eq!(
        versions(&renew(store, "other-hub", "host-c").await),
        [("host-c", 1)]
    );
    store
        .remove_host(SCOPE.0, hub, SCOPE.2, "host-a")
        .await
        .unwrap();
    assert_eq!(
        versions(&renew(store, hub, "host-b").await),
        [("host-b", 2)]
    );
    let empty = store.renew_host(SCOPE.0, hub, SCOPE.2, "").await;
    assert!(
        matches!(empty, Err(StoreError::Invalid { .. })),
        "{empty:?}"
    );
}

/// A host record not renewed for the retention is forgotten by the next renewal of any host.
async fn silent_hosts_are_forgotten_after_the_retention(
    store: &dyn CheckpointStore,
    clock: &ManualClock,
) {
    if !store.keeps_host_records() {
        return;
    }
    let hub = "retention";
    renew(store, hub, "crashed").await;
    let retention = crate::limits::HOST_RECORD_RETENTION;
    clock.advance_ms(i64::try_from(retention.as_millis()).unwrap() - 1);
    let hosts = renew(store, hub, "alive").await;
    assert_eq!(versions(&hosts), [("alive", 1), ("crashed", 1)]);
    clock.advance_ms(1);
    // A listing leaves out what the next renewal forgets.
    assert_eq!(versions(&listed_hosts(store, hub).await), [("alive", 1)]);
    assert_eq!(versions(&renew(store, hub, "alive").await), [("alive", 2)]);
}

/// Many claimants race for one partition with the same etag; exactly one may win. Give each
/// claimant its own connection to the one store, as separate hosts have.
pub async fn exactly_one_concurrent_claim_wins(stores: Vec<Arc<dyn CheckpointStore>>) {
    let hub = "race";
    let seed = claim_one(stores[0].as_ref(), claim_in(hub, "0", "seed", None))
        .await
        .unwrap();
    let mut racers = tokio::task::JoinSet::new();
    for (index, store) in stores.iter().enumerate() {
        let store = Arc::clone(store);
        let claims = vec![
            claim_in(hub, "0", &format!("host-{index}"), seed.etag.as_deref()),
            claim_in(hub, "1", &format!("host-{index}"), None),
        ];
        racers.spawn(async move { store.claim_ownership(claims).await.unwrap() });
    }
    let mut winners = Vec::new();
    while let Some(won) = racers.join_next().await {
        winners.extend(won.unwrap());
    }
    let won_partitions: Vec<&str> = winners.iter().map(|r| r.partition_id.as_str()).collect();
    let distinct: BTreeSet<&str> = won_partitions.iter().copied().collect();
    assert_eq!(won_partitions.len(), 2, "winners: {winners:?}");
    assert_eq!(distinct.len(), 2, "winners: {winners:?}");
    let records = list(stores[0].as_ref(), hub).await;
    for record in &records {
        let winner = winners
            .iter()
            .find(|w| w.partition_id == record.partition_id)
            .unwrap();
        assert_eq!(record, winner);
    }
    assert_eq!(records[0].version, 2);
    assert_eq!(records[1].version, 1);
}
