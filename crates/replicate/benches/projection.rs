//! The PostgreSQL projection's throughput: 1 KiB JSON events from a hub in this process into a
//! history table (rows/s) and a compacted table with a distinct key per event (keys/s).
//!
//! ```text
//! TRIBUTARY_BENCH_POSTGRES_URL=postgres://user@127.0.0.1:5432/db \
//!     cargo bench -p tributary-replicate --features postgres --bench projection [EVENTS]
//! ```
//!
//! Each shape gets a fresh table (its name carries the run's time); the time runs from the
//! task's start to the database's progress showing every event, so it includes the reads from
//! the hub. Options: EVENTS (default 200000), `TRIBUTARY_BENCH_BATCH` (events per batch,
//! default 1000).

use std::time::{Duration, Instant};

use tributary_broker::{Broker, BrokerConfig, HubSpec, SendTarget};
use tributary_event::EventData;
use tributary_replicate::{Brokers, Replicator, StartOptions, TaskConfig};

const HUB: &str = "events";
const PARTITIONS: u32 = 4;

fn body(n: u64) -> String {
    let mut text = format!(
        r#"{{"n": {n}, "device": "sensor-{}", "reading": {{"temperature": {}.25, "ok": true}}, "pad": ""#,
        n % 1000,
        n % 40
    );
    let pad = 1024 - text.len() - 2;
    text.push_str(&"x".repeat(pad));
    text.push_str("\"}");
    text
}

async fn fill(broker: &Broker, events: u64) {
    // One send per event: the broker takes a keyed event only by its key.
    for n in 0..events {
        let key = format!("key-{n}");
        broker
            .send(
                HUB,
                SendTarget::PartitionKey(key),
                vec![EventData::new(body(n))],
            )
            .await
            .expect("the hub takes the events");
    }
}

/// How many events the table's progress covers, over every partition.
async fn progress(database: &tokio_postgres::Client, table: &str) -> i64 {
    let sql = "SELECT coalesce(sum(sequence_number + 1), 0)::bigint \
               FROM tributary_projection_progress WHERE table_name = $1";
    database
        .query_one(sql, &[&format!("public.{table}")])
        .await
        .map_or(0, |row| row.get(0))
}

async fn run(dir: &std::path::Path, brokers: &Brokers, url: &str, shape: &str, events: u64) {
    let batch: u32 = std::env::var("TRIBUTARY_BENCH_BATCH")
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(1000);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let table = format!("bench_{shape}_{stamp}");
    let task = format!(
        "name = \"bench-{shape}\"\n[source]\ndata_dir = \"{}\"\nevent_hub = \"{HUB}\"\nbatch_events_max = {batch}\nprefetch = {}\ncheckpoint_store = \"{shape}-{stamp}.sqlite\"\n[[target]]\nname = \"table\"\nkind = \"postgres\"\nurl = \"{url}\"\ntable = \"{table}\"\nshape = \"{shape}\"\n",
        dir.join("data").display(),
        batch * 3
    );
    let config = TaskConfig::parse(&dir.join("bench.toml"), &task).expect("the task file");
    let start = Instant::now();
    let replicator = Replicator::start(
        &config,
        StartOptions {
            brokers: brokers.clone(),
            ..StartOptions::default()
        },
    )
    .await
    .expect("the task starts");
    let (database, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("the database answers");
    tokio::spawn(connection);
    let total = i64::try_from(events).unwrap();
    while progress(&database, &table).await < total {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = start.elapsed();
    let what = if shape == "history" {
        "rows/s"
    } else {
        "keys/s"
    };
    println!(
        "{shape:9} {events} events of 1 KiB JSON, batches of {batch}: {:.2} s, {:.0} {what}",
        elapsed.as_secs_f64(),
        events as f64 / elapsed.as_secs_f64()
    );
    replicator.shutdown().await.expect("the task stops");
}

fn main() {
    // `cargo test --all-targets` runs bench targets without `--bench`: this one is a
    // measurement against a database the caller names, not a test (the projection's behaviour
    // is tested in `crates/cli/tests/projection.rs` against a private PostgreSQL).
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!(
            "projection: a benchmark; run it with `cargo bench` and TRIBUTARY_BENCH_POSTGRES_URL"
        );
        return;
    }
    let Ok(url) = std::env::var("TRIBUTARY_BENCH_POSTGRES_URL") else {
        eprintln!(
            "set TRIBUTARY_BENCH_POSTGRES_URL to a PostgreSQL database (postgres://user@host:port/db)"
        );
        std::process::exit(2);
    };
    let events: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(200_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let broker = Broker::open(BrokerConfig::new(dir.path().join("data")))
            .await
            .unwrap();
        broker
            .create_hub(HubSpec::new(HUB, PARTITIONS))
            .await
            .unwrap();
        fill(&broker, events).await;
        let brokers = Brokers::default();
        brokers.adopt(broker).await;
        for shape in ["history", "compacted"] {
            run(dir.path(), &brokers, &url, shape, events).await;
        }
    });
}
