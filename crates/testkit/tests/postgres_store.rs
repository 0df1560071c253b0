//! The PostgreSQL checkpoint store against a real PostgreSQL (started by this test binary):
//! the store conformance suite, claim races between separate connections, and what survives a
//! reconnect; and how many requests idle processors make to it (and to SQLite) per partition
//! per minute.

use std::sync::Arc;
use std::time::Duration;

use tributary_event::ManualClock;
use tributary_processor::store::{
    Checkpoint, CheckpointStore, Ownership, OwnershipFence, PostgresCheckpointStore, StoreError,
    conformance, open_url,
};
use tributary_processor::{EventProcessorHost, ProcessorOptions, processor_fn};
use tributary_source::testing::InMemoryPartitionSource;
use tributary_testkit::{CountingStore, PostgresServer, StoreCalls};

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
            "fleet_a.tributary_host",
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
    let checkpoint = Checkpoint {
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

const HOSTS: usize = 4;
const PARTITIONS: u32 = 16;

/// Runs `HOSTS` hosts (default options: a 500 ms balancing interval) over `PARTITIONS` idle
/// partitions on `store` until they split them evenly, lets them settle, then counts the store
/// calls over `window`; returns them and the window in minutes.
async fn steady_state_calls(
    store: Arc<dyn CheckpointStore>,
    window: Duration,
) -> (StoreCalls, f64) {
    let counting = Arc::new(CountingStore::new(store));
    let source = Arc::new(InMemoryPartitionSource::new("ns", "hub", PARTITIONS));
    let hosts: Vec<_> = (0..HOSTS)
        .map(|_| {
            let factory = processor_fn(|_context, _events| async {});
            EventProcessorHost::builder(source.clone(), counting.clone(), factory)
                .options(ProcessorOptions::default())
                .build()
                .unwrap()
                .start()
                .unwrap()
        })
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !hosts
        .iter()
        .all(|host| host.owned_partitions().len() == PARTITIONS as usize / HOSTS)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no even split in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Pumps of the last partitions claimed may still be reading their checkpoints, and a
    // partition taken from another host starts only once that host has noticed, at the latest
    // an ownership expiration later.
    let settle = ProcessorOptions::default().ownership_expiration + Duration::from_secs(1);
    tokio::time::sleep(settle).await;
    let before = counting.calls();
    tokio::time::sleep(window).await;
    let calls = counting.calls().since(&before);
    for host in hosts {
        host.shutdown().await.unwrap();
    }
    (calls, window.as_secs_f64() / 60.0)
}

/// The benchmark figure, "store requests per partition per minute in steady state",
/// for PostgreSQL and SQLite: both keep host records, so an idle host makes one call per
/// balancing interval — its host renewal, which lists ownership too — and no claims at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_state_store_requests_per_partition_per_minute() {
    let window = Duration::from_secs(6);
    let postgres = open_url(&PostgresServer::shared().create_database("steady"))
        .await
        .unwrap();
    let directory = tempfile::tempdir().unwrap();
    let sqlite = open_url(directory.path().join("steady.db").to_str().unwrap())
        .await
        .unwrap();
    // One interval is 500 ms: 120 cycles a minute per host.
    let cycles_per_minute = 120.0;
    for (name, store) in [("postgres", postgres), ("sqlite", sqlite)] {
        assert!(store.keeps_host_records(), "{name}");
        let (calls, minutes) = steady_state_calls(store, window).await;
        #[allow(clippy::cast_precision_loss)] // Counts are small.
        let rate = |count: u64| count as f64 / minutes / f64::from(PARTITIONS);
        eprintln!(
            "{name}: per partition per minute: {:.1} store calls ({:.1} host renewals, {:.1} \
             claims, {:.1} listings without a renewal)",
            rate(calls.total()),
            rate(calls.renew_host),
            rate(calls.claims),
            rate(calls.list_ownership)
        );
        let host_cycles = cycles_per_minute * HOSTS as f64 / f64::from(PARTITIONS);
        // Timers may run a cycle late, never early: the counts stay at or under one per cycle
        // (a quarter over allows for a cycle straddling the window's edges).
        let renewals = rate(calls.renew_host);
        assert!(renewals <= host_cycles * 1.25, "{name}: {renewals}");
        assert!(
            renewals >= host_cycles * 0.5,
            "{name}: renewals stalled: {renewals}"
        );
        assert_eq!(calls.total(), calls.renew_host, "{name}: {calls:?}");
    }
}

/// Where an administrator made the tables, a user who may only read and write them uses the
/// store (no CREATE privilege needed).
#[tokio::test]
async fn a_user_without_create_privilege_uses_existing_tables() {
    let server = PostgresServer::shared();
    let url = server.create_database("least_privilege");
    drop(PostgresCheckpointStore::connect(&url).await.unwrap()); // The admin makes the tables.
    let database = url.rsplit('/').next().unwrap();
    server
        .sql(
            database,
            "CREATE ROLE processor LOGIN; \
             REVOKE CREATE ON SCHEMA public FROM PUBLIC; \
             REVOKE CREATE ON DATABASE least_privilege_placeholder FROM PUBLIC; \
             GRANT SELECT, INSERT, UPDATE, DELETE \
             ON tributary_ownership, tributary_checkpoint, tributary_host TO processor"
                .replace("least_privilege_placeholder", database)
                .as_str(),
        )
        .unwrap();
    let as_processor = url.replace("postgres://postgres@", "postgres://processor@");
    let clock = Arc::new(ManualClock::new(1_000));
    let store = PostgresCheckpointStore::connect_with_clock(&as_processor, clock.clone())
        .await
        .unwrap();
    conformance::run_all(&store, &clock).await;
    // And it really may not create anything.
    let denied = server.sql(database, "SET ROLE processor; CREATE TABLE nope (x int)");
    assert!(denied.is_err_and(|e| e.contains("permission denied")));
}
