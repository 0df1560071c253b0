//! Checkpoint store requests per partition per minute in steady state, side by side over the
//! same minutes: the official Python processor on an Azurite container with its default timing
//! (30 s balancing interval, ownership expiring after 180 s), and Tributary hosts with the same
//! ownership expiration — so the same failover time — on each of our stores: the Azure Blob
//! store on the same container (at the longest interval our options allow, a third of the
//! expiration, and at our usual ratio, a tenth), and the stores that keep host records (the
//! hub-hosted store, PostgreSQL, SQLite) at Python's 30 s interval.
//!
//! Each processor owns a 16-partition hub of its own (one consumer group each, so none balances
//! with another) and sees no events: the requests are ownership listing and renewal only.
//! Python's requests are counted in Azurite's debug log (one line per request, with the
//! client's user agent); our blob store's by `BlobCheckpointStore::requests_sent`; the other
//! stores' by a `CountingStore` around them (every store call is one request: one AMQP
//! request, one SQL statement, one SQLite transaction). Counting starts once every processor
//! owns its 16 partitions.
//!
//! Run with `cargo bench -p tributary-testkit --bench store_requests` (or, as a debug build,
//! `cargo test -p tributary-testkit --bench store_requests -- --bench`: the counts do not depend
//! on the build); `STORE_REQUESTS_MINUTES` sets the measured minutes (default 4).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tributary_client::{HubCheckpointStore, RemoteHub};
use tributary_processor::store::open_url;
use tributary_processor::{
    BlobCheckpointStore, CheckpointStore, EventProcessorHost, ProcessorOptions, RunningHost,
    processor_fn,
};
use tributary_testkit::{Azurite, CountingStore, OfficialProcessor, PostgresServer, Sdk, TestHub};

const PARTITIONS: u32 = 16;
const CONTAINER: &str = "store-requests";
/// The official processors' default ownership expiration: 6 × the 30 s interval.
const EXPIRATION: Duration = Duration::from_secs(180);
/// The official processors' default balancing interval.
const PYTHON_INTERVAL: Duration = Duration::from_secs(30);

/// Counts one Tributary host's store requests.
enum Requests {
    Blob(Arc<BlobCheckpointStore>),
    Counted(Arc<CountingStore>),
}

impl Requests {
    fn sent(&self) -> u64 {
        match self {
            Requests::Blob(store) => store.requests_sent(),
            Requests::Counted(store) => store.calls().total(),
        }
    }
}

/// A Tributary host on its own hub, with its own store (so its requests are its own).
struct Ours {
    label: String,
    requests: Requests,
    host: RunningHost,
}

/// Which store a host of ours uses.
enum StoreKind<'a> {
    Blob(&'a Azurite),
    Hub,
    Url(String),
}

async fn start_ours(hub: &TestHub, kind: StoreKind<'_>, name: &str, interval: Duration) -> Ours {
    let remote = Arc::new(
        RemoteHub::connect(&hub.connection_string, name)
            .await
            .unwrap(),
    );
    let (store, requests, store_name): (Arc<dyn CheckpointStore>, Requests, &str) = match kind {
        StoreKind::Blob(azurite) => {
            let store = Arc::new(
                BlobCheckpointStore::from_connection_string(
                    &azurite.connection_string(),
                    CONTAINER,
                )
                .await
                .unwrap(),
            );
            (store.clone(), Requests::Blob(store), "Azure Blob (Azurite)")
        }
        StoreKind::Hub => counted(
            Arc::new(HubCheckpointStore::new(remote.consumer())),
            "hub-hosted",
        ),
        StoreKind::Url(url) => {
            let name = if url.starts_with("postgres") {
                "PostgreSQL"
            } else {
                "SQLite"
            };
            counted(open_url(&url).await.unwrap(), name)
        }
    };
    let factory = processor_fn(|_, _| async {});
    let host = EventProcessorHost::builder(remote, store, factory)
        .options(ProcessorOptions {
            host_name: name.to_owned(),
            load_balancing_interval: interval,
            ownership_expiration: EXPIRATION,
            ..ProcessorOptions::default()
        })
        .build()
        .expect("valid options")
        .start()
        .expect("in a runtime");
    Ours {
        label: format!(
            "Tributary, {store_name} store, interval {interval:?}, expiration {EXPIRATION:?}"
        ),
        requests,
        host,
    }
}

fn counted(
    store: Arc<dyn CheckpointStore>,
    name: &str,
) -> (Arc<dyn CheckpointStore>, Requests, &str) {
    let counting = Arc::new(CountingStore::new(store));
    (counting.clone(), Requests::Counted(counting), name)
}

/// Requests in Azurite's debug log whose user agent is the Python SDK's.
fn python_requests(log: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let requests = text
        .lines()
        .filter(|line| line.contains("BlobStorageContextMiddleware: RequestMethod="))
        .filter(|line| line.contains("azsdk-python"));
    requests.count() as u64
}

fn per_partition_per_minute(requests: u64, elapsed: Duration) -> f64 {
    requests as f64 / f64::from(PARTITIONS) / (elapsed.as_secs_f64() / 60.0)
}

/// Our hosts: two on the blob store beside Python, one on each store with host records.
/// The SQLite store's file goes into `dir`.
async fn start_all_ours(hub: &TestHub, azurite: &Azurite, dir: &std::path::Path) -> Vec<Ours> {
    let postgres_url = PostgresServer::shared().create_database("store_requests");
    let sqlite_url = dir.join("store.db").display().to_string();
    let kinds = [
        (StoreKind::Blob(azurite), "third", EXPIRATION / 3),
        (StoreKind::Blob(azurite), "tenth", EXPIRATION / 10),
        (StoreKind::Hub, "hub-store", PYTHON_INTERVAL),
        (
            StoreKind::Url(postgres_url),
            "postgres-store",
            PYTHON_INTERVAL,
        ),
        (StoreKind::Url(sqlite_url), "sqlite-store", PYTHON_INTERVAL),
    ];
    let mut ours = Vec::new();
    for (kind, name, interval) in kinds {
        ours.push(start_ours(hub, kind, name, interval).await);
    }
    ours
}

async fn measure(minutes: u64) {
    let hubs = [
        ("python", PARTITIONS),
        ("third", PARTITIONS),
        ("tenth", PARTITIONS),
        ("hub-store", PARTITIONS),
        ("postgres-store", PARTITIONS),
        ("sqlite-store", PARTITIONS),
    ];
    let hub = TestHub::start(&hubs).await;
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("azurite-debug.log");
    let azurite = Azurite::start_with_debug_log(&log).await;
    let mut python = OfficialProcessor::spawn(
        Sdk::Python,
        &json!({
            "conn": hub.conn(&hub.root),
            "hub": "python",
            "storage": azurite.connection_string(),
            "container": CONTAINER,
            "load_balancing_interval": null,
        }),
    );
    python.ready().await;
    let ours = start_all_ours(&hub, &azurite, log_dir.path()).await;
    python
        .until("Python owning its 16 partitions", |seen| {
            seen.owned.len() == PARTITIONS as usize
        })
        .await;
    while ours
        .iter()
        .any(|o| o.host.owned_partitions().len() != PARTITIONS as usize)
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let started = Instant::now();
    let python_before = python_requests(&log);
    let ours_before: Vec<u64> = ours.iter().map(|o| o.requests.sent()).collect();
    tokio::time::sleep(Duration::from_secs(60 * minutes)).await;
    let elapsed = started.elapsed();
    let python_rate = per_partition_per_minute(python_requests(&log) - python_before, elapsed);
    println!(
        "{minutes} min, {PARTITIONS} partitions per processor, no events, one Azurite container"
    );
    println!(
        "Python azure-eventhub, defaults (interval 30 s, expiration 180 s): \
         {python_rate:.2} requests per partition per minute"
    );
    for (o, before) in ours.iter().zip(ours_before) {
        let rate = per_partition_per_minute(o.requests.sent() - before, elapsed);
        let share = rate / python_rate;
        println!(
            "{}: {rate:.2} requests per partition per minute ({share:.2} of Python's)",
            o.label
        );
    }
    python.pump();
    assert!(
        python.seen.errors.is_empty(),
        "Python reported errors: {:?}",
        python.seen.errors
    );
    for o in ours {
        o.host.shutdown().await.unwrap();
    }
}

fn main() {
    // `cargo test --all-targets` runs bench targets without `--bench`: this is a measurement
    // of several minutes, not a test (the blob store's behaviour is tested in tests/).
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("store_requests: a benchmark; run it with `cargo bench`");
        return;
    }
    let minutes = std::env::var("STORE_REQUESTS_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(4);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(measure(minutes));
}
