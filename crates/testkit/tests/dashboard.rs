//! The web dashboard of the HTTP door in a real headless browser: Debian's `chromium` driven by
//! `playwright-core` (`tests/browser/dashboard.js`; both installed by `scripts/setup-browser`).
//!
//! One server, with 32 hubs × 32 partitions and 50 server-side groups (the first-paint
//! target), signatures required on the API and the admin SAS check `tributary serve` uses. The
//! script checks that the page loads with nothing fetched from elsewhere, that it refuses
//! without a login (and a wrong key), shows the hubs and an epoch receiver, updates live while
//! events arrive, shows the ownership table of a running processor fleet (two hosts sharing a
//! consumer group through the hub-hosted checkpoint store, over an AMQP door on the same broker)
//! and moves the partitions of the host it asks this test to kill (as `kill -9` would) to the
//! other without a reload, and that the operator actions work (a consumer group made, a group
//! reset, a compacted hub created, a hub's capture turned on); this test then checks their
//! effect on the broker and the coordinator. It also checks what a reader sees: the login page
//! styled as the dashboard, the charts' time axis and value scale, the header's count of
//! consumer groups (processor and server-side), and singular forms ("lag 1 event", never
//! "1 events"). Screenshots go to `target/dashboard-screenshots/`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tributary_amqp::{AccessPolicies, AccessPolicy, AmqpConfig, Right, RunningAmqpServer};
use tributary_broker::{Broker, HubSpec, ReceiverSpec, SendTarget};
use tributary_client::{HubCheckpointStore, RemoteHub};
use tributary_event::{EventData, EventPosition};
use tributary_eventhubs::{address, connection_string, sas};
use tributary_groups::{JoinRequest, StartPosition};
use tributary_http::{AdminSas, AuthConfig, HttpConfig};
use tributary_processor::{EventProcessorHost, ProcessorOptions, RunningHost, processor_fn};
use tributary_testkit::{oci, repo};

const KEY_NAME: &str = "RootManageSharedAccessKey";
const KEY: &str = "dashboard-test-key-0123456789abcdef";
const HUBS: usize = 32;
const PARTITIONS: u32 = 32;
const OCI_GROUPS: usize = 50;
/// The hub and consumer group the processor fleet shares; its two hosts.
const FLEET_HUB: &str = "hub-01";
const FLEET_GROUP: &str = "fleet";
const FLEET_HOSTS: [&str; 2] = ["instance-a", "instance-b"];
/// The hub holding exactly one event, which its server-side group has not read.
const SINGLE_EVENT_HUB: &str = "hub-02";

/// The admin check of `tributary serve`: a valid token for the whole namespace.
fn admin_sas() -> AdminSas {
    AdminSas::new(|token| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap());
        sas::verify(token, |name| (name == KEY_NAME).then_some(KEY), now)
            .is_ok_and(|v| address::strip_host(&v.audience).is_empty())
    })
}

fn browser_tools() -> (PathBuf, PathBuf) {
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("chromium is not installed: run scripts/setup-browser"));
    let modules = repo().join(".browser/node_modules");
    assert!(
        modules.join("playwright-core/package.json").exists(),
        "playwright-core is not installed: run scripts/setup-browser (expected {})",
        modules.display()
    );
    (chromium, modules)
}

async fn populate(broker: &Broker, coordinator: &tributary_groups::GroupCoordinator) {
    for h in 0..HUBS {
        broker
            .create_hub(HubSpec::new(format!("hub-{h:02}"), PARTITIONS))
            .await
            .unwrap();
    }
    for g in 0..OCI_GROUPS {
        let hub = format!("hub-{:02}", g % HUBS);
        coordinator
            .join(JoinRequest {
                stream: hub,
                group: format!("readers-{g:02}"),
                instance: Some(format!("instance-{g:02}")),
                start: StartPosition::TrimHorizon,
                commit_on_get: true,
                timeout_ms: 300_000,
            })
            .await
            .unwrap();
    }
    // One event waits for `readers-02` on hub-02: its table says "lag 1 event".
    broker
        .send(
            SINGLE_EVENT_HUB,
            SendTarget::Partition("0".into()),
            vec![EventData::new(b"one".to_vec())],
        )
        .await
        .unwrap();
    for i in 0..20 {
        broker
            .send(
                "hub-00",
                SendTarget::Partition("0".into()),
                vec![EventData::new(format!("event {i}").into_bytes())],
            )
            .await
            .unwrap();
    }
}

/// A processor host of the fleet: reads `FLEET_HUB` over AMQP and keeps ownership and
/// checkpoints in the hub-hosted store, checkpointing every batch.
async fn fleet_host(connection_string: &str, host_name: &str) -> RunningHost {
    let hub = Arc::new(
        RemoteHub::connect(connection_string, FLEET_HUB)
            .await
            .unwrap(),
    );
    let store = Arc::new(HubCheckpointStore::new(hub.consumer()));
    let factory = processor_fn(|context, _events| async move {
        let _ = context.checkpoint().await;
    });
    EventProcessorHost::builder(hub, store, factory)
        .options(ProcessorOptions {
            host_name: host_name.to_owned(),
            consumer_group: FLEET_GROUP.to_owned(),
            receive_timeout: Duration::from_millis(500),
            load_balancing_interval: Duration::from_millis(250),
            ownership_expiration: Duration::from_secs(2),
            ..ProcessorOptions::default()
        })
        .build()
        .unwrap()
        .start()
        .unwrap()
}

/// An AMQP door on `broker` and the fleet's hosts on it, once they split `FLEET_HUB` evenly.
async fn start_fleet(broker: &Broker) -> (RunningAmqpServer, Vec<RunningHost>) {
    broker
        .create_consumer_group(FLEET_HUB, FLEET_GROUP)
        .await
        .unwrap();
    let root = AccessPolicy::generate(KEY_NAME, vec![Right::Manage]).unwrap();
    let policies = AccessPolicies::new(vec![root.clone()]).unwrap();
    let config = AmqpConfig::new("127.0.0.1:0".parse().unwrap(), policies);
    let door = tributary_amqp::start(broker.clone(), config).await.unwrap();
    let conn = tributary_amqp::connection_string("127.0.0.1", door.local_addr().port(), &root);
    let mut hosts = Vec::new();
    for name in FLEET_HOSTS {
        hosts.push(fleet_host(&conn, name).await);
    }
    let even = PARTITIONS as usize / FLEET_HOSTS.len();
    tributary_testkit::within("the fleet's even split", async {
        while !hosts.iter().all(|h| h.owned_partitions().len() == even) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    (door, hosts)
}

/// Kills `host` (no close, no relinquishing) once the browser script writes `marker`.
fn kill_on_marker(host: RunningHost, marker: PathBuf) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !Path::new(&marker).exists() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        host.abort();
    })
}

/// What the browser script is told: where the page is, the credentials, what to look for.
fn script_args(
    port: u16,
    chromium: &Path,
    kill_marker: &Path,
    capture_dir: &Path,
) -> serde_json::Value {
    let screenshots = repo().join("target/dashboard-screenshots");
    // Only this run's pictures.
    let _ = std::fs::remove_dir_all(&screenshots);
    std::fs::create_dir_all(&screenshots).unwrap();
    serde_json::json!({
        "url": format!("http://127.0.0.1:{port}"),
        "chromium": chromium,
        "credential": connection_string::emulator_connection_string("127.0.0.1", 5672, KEY_NAME, KEY),
        "wrongCredential": connection_string::emulator_connection_string("127.0.0.1", 5672, KEY_NAME, "wrong"),
        "screenshots": screenshots,
        "hubCount": HUBS,
        "liveHub": "hub-00",
        "livePartition": 1,
        "groupHub": "hub-00",
        "newGroup": "made-in-the-browser",
        "ociGroup": "readers-00",
        "fleetHub": FLEET_HUB,
        "fleetGroup": FLEET_GROUP,
        "fleetHosts": FLEET_HOSTS,
        "fleetPartitions": PARTITIONS,
        "killMarker": kill_marker,
        "processorGroups": 1,
        "serverSideGroups": OCI_GROUPS,
        "singleEventHub": SINGLE_EVENT_HUB,
        "singleEventGroup": "readers-02",
        "compactedHub": "compacted-in-the-browser",
        "capturedHub": "hub-01",
        "captureDir": capture_dir,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_in_a_browser() {
    let (chromium, modules) = browser_tools();
    let dir = tempfile::tempdir().unwrap();
    let broker = oci::open_broker(dir.path(), &oci::Setup::default()).await;
    tributary_http::write_key_file(&dir.path().join("oci-api-keys.json"), b"{}").unwrap();
    let mut config = HttpConfig::new("127.0.0.1:0".parse().unwrap(), AuthConfig::signatures());
    config.admin_sas = Some(admin_sas());
    let http = tributary_http::start(broker.clone(), config).await.unwrap();
    let coordinator = http.coordinator().clone();
    populate(&broker, &coordinator).await;
    let (amqp, mut hosts) = start_fleet(&broker).await;
    let survivor = hosts.remove(0);
    let kill_marker = dir.path().join("kill-instance-b");
    let killer = kill_on_marker(hosts.remove(0), kill_marker.clone());
    // An epoch receiver the page must show.
    let mut spec = ReceiverSpec::new("hub-00", "1", EventPosition::Latest);
    spec.owner_level = Some(3);
    let _receiver = broker.open_receiver(spec).unwrap();
    // Events keep arriving on hub-00/1 while the page is open.
    let sender = {
        let broker = broker.clone();
        tokio::spawn(async move {
            loop {
                let event = EventData::new(b"live".to_vec());
                let _ = broker
                    .send("hub-00", SendTarget::Partition("1".into()), vec![event])
                    .await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let capture_dir = tempfile::tempdir().unwrap();
    let args = script_args(
        http.local_addr().port(),
        &chromium,
        &kill_marker,
        capture_dir.path(),
    );
    let mut command = tokio::process::Command::new("node");
    command
        .arg(repo().join("crates/testkit/tests/browser/dashboard.js"))
        .arg(args.to_string())
        .env("NODE_PATH", &modules);
    let measured = tributary_testkit::run_json(command, "the dashboard browser script").await;
    sender.abort();
    println!("dashboard in the browser: {measured}");

    operator_actions_took_effect(&broker, &coordinator, capture_dir.path());
    let first_paint = measured["firstPaintMs"]
        .as_f64()
        .expect("first paint measured");
    assert!(
        first_paint <= 500.0,
        "first paint {first_paint} ms with {HUBS} hubs × {PARTITIONS} partitions and {OCI_GROUPS} groups"
    );
    killer.await.unwrap();
    assert_eq!(
        survivor.owned_partitions().len(),
        PARTITIONS as usize,
        "the surviving host took the killed one's partitions"
    );
    survivor.shutdown().await.unwrap();
    amqp.shutdown().await;
    http.shutdown().await.unwrap();
    broker.shutdown().await.unwrap();
}

/// What the browser's operator actions changed in the broker and the coordinator.
fn operator_actions_took_effect(
    broker: &Broker,
    coordinator: &tributary_groups::GroupCoordinator,
    capture_dir: &Path,
) {
    let groups = broker.list_consumer_groups("hub-00").unwrap();
    assert!(
        groups.iter().any(|g| g.name == "made-in-the-browser"),
        "{groups:?}"
    );
    let compacted = broker.describe_hub("compacted-in-the-browser").unwrap();
    assert_eq!(
        compacted.cleanup.policy,
        tributary_broker::CleanupPolicy::Compact
    );
    let capture = broker.describe_hub("hub-01").unwrap().capture;
    let capture = capture.expect("hub-01 captured from the form");
    assert_eq!(
        capture.destination,
        format!("file:{}", capture_dir.display())
    );
    assert_eq!(
        (capture.encoding.as_str(), capture.interval_secs),
        ("AvroDeflate", 120)
    );
    let readers = coordinator.list(Some("hub-00"));
    let readers = readers.iter().find(|g| g.group == "readers-00").unwrap();
    assert_eq!(
        readers.committed[0], 20,
        "reset to latest: after the 20 events of partition 0"
    );
}
