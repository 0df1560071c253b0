//! The PostgreSQL checkpoint store against a real PostgreSQL (started by this test binary):
//! the store conformance suite, claim races between separate connections, and what survives a
//! reconnect; and how many requests idle processors make to it (and to SQLite) per partition
//! per minute.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tributary_event::ManualClock;
use tributary_processor::store::{
    Checkpoint, CheckpointStore, Ownership, OwnershipFence, PostgresCheckpointStore, StoreError,
    conformance, open_url,
};
use tributary_processor::{EventProcessorHost, ProcessorOptions, processor_fn};
use tributary_source::testing::InMemoryPartitionSource;
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

/// Counts the calls a processor makes to a store, and the claims inside them.
struct Counting {
    inner: Arc<dyn CheckpointStore>,
    list_ownership: AtomicU64,
    claim_calls: AtomicU64,
    claims: AtomicU64,
    list_checkpoints: AtomicU64,
    update_checkpoint: AtomicU64,
}

impl Counting {
    fn new(inner: Arc<dyn CheckpointStore>) -> Counting {
        Counting {
            inner,
            list_ownership: AtomicU64::new(0),
            claim_calls: AtomicU64::new(0),
            claims: AtomicU64::new(0),
            list_checkpoints: AtomicU64::new(0),
            update_checkpoint: AtomicU64::new(0),
        }
    }

    /// (list ownership, claim calls, claims, list checkpoints, checkpoint writes) so far.
    fn counts(&self) -> [u64; 5] {
        [
            &self.list_ownership,
            &self.claim_calls,
            &self.claims,
            &self.list_checkpoints,
            &self.update_checkpoint,
        ]
        .map(|count| count.load(Ordering::Relaxed))
    }
}

#[async_trait::async_trait]
impl CheckpointStore for Counting {
    async fn list_ownership(
        &self,
        namespace: &str,
        hub: &str,
        group: &str,
    ) -> Result<Vec<Ownership>, StoreError> {
        self.list_ownership.fetch_add(1, Ordering::Relaxed);
        self.inner.list_ownership(namespace, hub, group).await
    }

    async fn claim_ownership(&self, claims: Vec<Ownership>) -> Result<Vec<Ownership>, StoreError> {
        self.claim_calls.fetch_add(1, Ordering::Relaxed);
        self.claims
            .fetch_add(claims.len() as u64, Ordering::Relaxed);
        self.inner.claim_ownership(claims).await
    }

    async fn list_checkpoints(
        &self,
        namespace: &str,
        hub: &str,
        group: &str,
    ) -> Result<Vec<Checkpoint>, StoreError> {
        self.list_checkpoints.fetch_add(1, Ordering::Relaxed);
        self.inner.list_checkpoints(namespace, hub, group).await
    }

    async fn update_checkpoint(
        &self,
        checkpoint: Checkpoint,
        fence: &OwnershipFence,
    ) -> Result<(), StoreError> {
        self.update_checkpoint.fetch_add(1, Ordering::Relaxed);
        self.inner.update_checkpoint(checkpoint, fence).await
    }
}

const HOSTS: usize = 4;
const PARTITIONS: u32 = 16;

/// Runs `HOSTS` hosts (default options: a 500 ms balancing interval) over `PARTITIONS` idle
/// partitions on `store` until they split them evenly, lets them settle, then counts the store calls over
/// `window`; returns the counts per partition per minute.
async fn steady_state_per_partition_per_minute(
    store: Arc<dyn CheckpointStore>,
    window: Duration,
) -> [f64; 5] {
    let counting = Arc::new(Counting::new(store));
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
    // Pumps of the last partitions claimed may still be reading their checkpoints.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = counting.counts();
    tokio::time::sleep(window).await;
    let after = counting.counts();
    for host in hosts {
        host.shutdown().await.unwrap();
    }
    let minutes = window.as_secs_f64() / 60.0;
    let mut rates = [0.0; 5];
    for (rate, (a, b)) in rates.iter_mut().zip(after.iter().zip(before)) {
        #[allow(clippy::cast_precision_loss)] // Counts are small.
        let delta = (a - b) as f64;
        *rate = delta / minutes / f64::from(PARTITIONS);
    }
    rates
}

/// The benchmark figure, "store requests per partition per minute in steady state",
/// for PostgreSQL and SQLite: idle hosts renew every owned partition once per balancing
/// interval in one claim call and list ownership once, and make no other calls.
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
        let [lists, claim_calls, claims, checkpoint_lists, checkpoints] =
            steady_state_per_partition_per_minute(store, window).await;
        eprintln!(
            "{name}: per partition per minute: {:.1} store calls ({lists:.1} list ownership, \
             {claim_calls:.1} claim calls carrying {claims:.1} claims, {checkpoint_lists:.1} \
             list checkpoints, {checkpoints:.1} checkpoints)",
            lists + claim_calls + checkpoint_lists + checkpoints
        );
        let host_cycles = cycles_per_minute * HOSTS as f64 / f64::from(PARTITIONS);
        // Timers may run a cycle late, never early: the counts stay at or under one per cycle
        // (a quarter over allows for a cycle straddling the window's edges).
        assert!(lists <= host_cycles * 1.25, "{name}: {lists}");
        assert!(claim_calls <= host_cycles * 1.25, "{name}: {claim_calls}");
        assert!(claims <= cycles_per_minute * 1.25, "{name}: {claims}");
        assert!(
            claims >= cycles_per_minute * 0.5,
            "{name}: renewals stalled: {claims}"
        );
        assert!(
            checkpoints == 0.0,
            "{name}: idle processors wrote checkpoints"
        );
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
             GRANT SELECT, INSERT, UPDATE ON tributary_ownership, tributary_checkpoint \
             TO processor"
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
