//! The checkpoint store a Tributary hub hosts, over AMQP: the store conformance suite through
//! `HubCheckpointStore`, claim races between separate connections, and its refusals (unknown
//! consumer groups, a policy without Listen, an operation the hub does not know).

use std::sync::Arc;

use tributary_client::{ConsumerClient, HubCheckpointStore};
use tributary_processor::store::{CheckpointStore, StoreError, conformance};
use tributary_testkit::TestHub;

/// Every hub the conformance checks use (each 4 partitions), and the groups beyond `$Default`.
const HUBS: [&str; 14] = [
    "first-claim",
    "second-first-claim",
    "etag-claims",
    "relinquish",
    "mixed",
    "scoped",
    "scoped-other",
    "fenced",
    "overwrite",
    "invalid",
    "versions",
    "race",
    "hosts",
    "other-hub",
];

async fn hub() -> TestHub {
    let hubs: Vec<(&str, u32)> = HUBS.iter().map(|h| (*h, 4)).collect();
    let hub = TestHub::start(&hubs).await;
    for name in ["scoped", "overwrite"] {
        hub.broker
            .create_consumer_group(name, "audit")
            .await
            .unwrap();
    }
    hub
}

async fn open_store(connection_string: &str, hub: &str) -> HubCheckpointStore {
    let consumer = ConsumerClient::connect(connection_string, hub)
        .await
        .unwrap();
    HubCheckpointStore::new(&consumer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_conformance_suite_over_amqp() {
    let hub = hub().await;
    // A Listen-only policy is all a processor needs.
    let store = open_store(&hub.conn(&hub.listen), "first-claim").await;
    conformance::run_all_with_server_clock(&store).await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_connections_have_exactly_one_claim_winner() {
    let hub = hub().await;
    let mut stores: Vec<Arc<dyn CheckpointStore>> = Vec::new();
    for _ in 0..6 {
        stores.push(Arc::new(open_store(&hub.connection_string, "race").await));
    }
    conformance::exactly_one_concurrent_claim_wins(stores).await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_groups_and_send_only_policies_are_refused() {
    let hub = hub().await;
    let store = open_store(&hub.connection_string, "mixed").await;
    let error = store
        .list_ownership("ns", "mixed", "no-such-group")
        .await
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::Invalid { reason, .. } if reason.contains("no-such-group")),
        "{error}"
    );
    let error = store
        .list_checkpoints("ns", "no-such-hub", "$Default")
        .await
        .unwrap_err();
    assert!(error.to_string().contains("no-such-hub"), "{error}");

    let send_only = open_store(&hub.conn(&hub.send), "mixed").await;
    let error = send_only
        .list_ownership("ns", "mixed", "$Default")
        .await
        .unwrap_err();
    assert!(error.to_string().contains("status 401"), "{error}");
    hub.stop().await;
}
