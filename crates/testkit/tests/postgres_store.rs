//! The PostgreSQL checkpoint store against a real PostgreSQL (started by this test binary):
//! the store conformance suite, claim races between separate connections, and what survives a
//! reconnect.

use std::sync::Arc;

use tributary_event::ManualClock;
use tributary_processor::store::{
    CheckpointStore, Ownership, OwnershipFence, PostgresCheckpointStore, StoreError, conformance,
    open_url,
};
use tributary_testkit::PostgresServer;

#[tokio::test]
async fn passes_the_conformance_suite() {
    let url = PostgresServer::shared().create_database("conformance");
    let clock = Arc::new(ManualClock::new(1_000));
    let store = PostgresCheckpointStore::connect_with_clock(&url, clock.clone())
        .await
        .unwrap();
    conformance::run_all(&store, &clock).await;
}

#[tokio::test]
async fn passes_the_conformance_suite_in_a_chosen_schema() {
    let server = PostgresServer::shared();
    let url = server.create_database("schema");
    let clock = Arc::new(ManualClock::new(1_000));
    let in_schema = format!("{url}?schema=fleet_a");
    let store = PostgresCheckpointStore::connect_with_clock(&in_schema, clock.clone())
        .await
        .unwrap();
    conformance::run_all(&store, &clock).await;
    let database = url.rsplit('/').next().unwrap();
    let tables = server
        .sql(
            database,
            "SELECT table_schema || '.' || table_name FROM information_schema.tables \
             WHERE table_name LIKE 'tributary_%' ORDER BY 1",
        )
        .unwrap();
    assert_eq!(
        tables.lines().collect::<Vec<_>>(),
        [
            "fleet_a.tributary_checkpoint",
            "fleet_a.tributary_ownership"
        ]
    );
}

/// Separate connections (as separate hosts have) race for one partition: exactly one wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn separate_connections_have_exactly_one_claim_winner() {
    let url = PostgresServer::shared().create_database("race");
    let mut stores: Vec<Arc<dyn CheckpointStore>> = Vec::new();
    for _ in 0..8 {
        stores.push(open_url(&url).await.unwrap());
    }
    conformance::exactly_one_concurrent_claim_wins(stores).await;
}

/// Many hosts starting together create the tables at once: every one of them connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_first_connections_at_once_all_succeed() {
    let url = PostgresServer::shared().create_database("first_connections");
    let mut connecting = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let url = url.clone();
        connecting.spawn(async move { PostgresCheckpointStore::connect(&url).await.map(drop) });
    }
    while let Some(result) = connecting.join_next().await {
        result.unwrap().unwrap();
    }
}

/// The store reconnects after the server drops its connection; records are the server's.
#[tokio::test]
async fn a_dropped_connection_is_reopened_and_records_stay() {
    let server = PostgresServer::shared();
    let url = server.create_database("reconnect");
    let store = PostgresCheckpointStore::connect(&url).await.unwrap();
    let claim = Ownership {
        fully_qualified_namespace: "ns".into(),
        event_hub_name: "hub".into(),
        consumer_group: "$Default".into(),
        partition_id: "0".into(),
        owner_id: "host-a".into(),
        last_modified_time_ms: 0,
        etag: None,
        version: 0,
    };
    let won = store.claim_ownership(vec![claim]).await.unwrap();
    assert_eq!(won.len(), 1);
    let database = url.rsplit('/').next().unwrap();
    server
        .sql(
            "postgres",
            &format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE datname = '{database}' AND pid <> pg_backend_pid()"
            ),
        )
        .unwrap();
    // The first call after the drop may fail (the host retries on its next cycle); a later
    // one reconnects.
    let mut listed = store.list_ownership("NS", "HUB", "$default").await;
    for _ in 0..20 {
        if listed.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        listed = store.list_ownership("NS", "HUB", "$default").await;
    }
    assert_eq!(listed.unwrap(), won);
    let fence = OwnershipFence {
        owner_id: "host-b".into(),
    };
    let checkpoint = tributary_processor::store::Checkpoint {
        fully_qualified_namespace: "ns".into(),
        event_hub_name: "hub".into(),
        consumer_group: "$default".into(),
        partition_id: "0".into(),
        offset: Some(1),
        sequence_number: Some(1),
    };
    let refused = store.update_checkpoint(checkpoint, &fence).await;
    assert!(
        matches!(&refused, Err(StoreError::OwnershipLost { current_owner, .. }) if current_owner == "host-a"),
        "{refused:?}"
    );
}

/// An unreachable server is a clear error naming where, without the password.
#[tokio::test]
async fn an_unreachable_server_is_a_clear_error_without_the_password() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let url = format!("postgres://app:s3cret@127.0.0.1:{port}/none?connect_timeout=5");
    let error = open_url(&url).await.err().expect("nothing listens there");
    let text = error.to_string();
    assert!(matches!(error, StoreError::Backend { .. }), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(!text.contains("s3cret"), "{text}");
}
