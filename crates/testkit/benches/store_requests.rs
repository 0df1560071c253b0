//! Blob store requests per partition per minute in steady state, side by side on one Azurite
//! container over the same minutes: the official Python processor with its default timing
//! (30 s balancing interval, ownership expiring after 180 s) and Tributary hosts with the same
//! ownership expiration, at the longest interval our options allow (a third of it) and at our
//! usual ratio (a tenth of it).
//!
//! Each processor owns a 16-partition hub of its own (one consumer group each, so none balances
//! with another) and sees no events: the requests are ownership listing and renewal only.
//! Python's requests are counted in Azurite's debug log (one line per request, with the
//! client's user agent); ours by `BlobCheckpointStore::requests_sent`. Counting starts once
//! every processor owns its 16 partitions.
//!
//! Run with `cargo bench -p tributary-testkit --bench store_requests` (or, as a debug build,
//! `cargo test -p tributary-testkit --bench store_requests -- --bench`: the counts do not depend
//! on the build); `STORE_REQUESTS_MINUTES` sets the measured minutes (default 4).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tributary_client::RemoteHub;
use tributary_processor::{
    BlobCheckpointStore, EventProcessorHost, ProcessorOptions, RunningHost, processor_fn,
};
use tributary_testkit::{Azurite, OfficialProcessor, Sdk, TestHub};

const PARTITIONS: u32 = 16;
const CONTAINER: &str = "store-requests";
/// The official processors' default ownership expiration: 6 × the 30 s interval.
const EXPIRATION: Duration = Duration::from_secs(180);

/// A Tributary host on its own hub, with its own store (so its requests are its own).
struct Ours {
    label: String,
    store: Arc<BlobCheckpointStore>,
    host: RunningHost,
}

async fn start_ours(hub: &TestHub, azurite: &Azurite, name: &str, interval: Duration) -> Ours {
    let remote = Arc::new(
        RemoteHub::connect(&hub.connection_string, name)
            .await
            .unwrap(),
    );
    let store = Arc::new(
        BlobCheckpointStore::from_connection_string(&azurite.connection_string(), CONTAINER)
            .await
            .unwrap(),
    );
    let factory = processor_fn(|_, _| async {});
    let host = EventProcessorHost::builder(remote, store.clone(), factory)
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
        label: format!("Tributary, interval {interval:?}, expiration {EXPIRATION:?}"),
        store,
        host,
    }
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

async fn measure(minutes: u64) {
    let hubs = [
        ("python", PARTITIONS),
        ("third", PARTITIONS),
        ("tenth", PARTITIONS),
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
    let ours = [
        start_ours(&hub, &azurite, "third", EXPIRATION / 3).await,
        start_ours(&hub, &azurite, "tenth", EXPIRATION / 10).await,
    ];
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
    let ours_before: Vec<u64> = ours.iter().map(|o| o.store.requests_sent()).collect();
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
        let rate = per_partition_per_minute(o.store.requests_sent() - before, elapsed);
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
