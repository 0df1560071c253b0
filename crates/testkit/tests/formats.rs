//! Upgrades keep data: every fixture under `crates/testkit/fixtures/formats/` — data directories
//! and stores written by earlier builds in the formats they defined (`fixtures/formats/README.md`
//! says which) — is opened by this build and serves what it holds, upgraded in place where the
//! layout changed; and a version field from the future is refused with a message naming both
//! versions, leaving the file as it was.

#[path = "formats/fixture.rs"]
mod fixture;

use std::path::Path;

use fixture::{
    CHECKPOINT, COMPACTED_ROUNDS, GROUP_COMMITTED, LEGACY, NAMESPACE, ORDERS_0, ORDERS_1, OWNER,
};
use tributary_amqp::AccessPolicies;
use tributary_broker::{Broker, SendTarget};
use tributary_event::{EventData, PropertyValue, ReceivedEvent};
use tributary_groups::{CoordinatorConfig, GroupCoordinator};
use tributary_processor::{CheckpointStore, SqliteCheckpointStore};
use tributary_replicate::offset_map::OffsetMap;
use tributary_testkit::formats::{copy_of, format_fixtures as fixtures};

fn read_all(broker: &Broker, hub: &str, partition: &str) -> Vec<ReceivedEvent> {
    let mut events: Vec<ReceivedEvent> = Vec::new();
    loop {
        let from = events.last().map_or(0, |e| e.sequence_number + 1);
        let read = broker.read(hub, partition, from, 10_000, u64::MAX).unwrap();
        if read.is_empty() {
            return events;
        }
        events.extend(read);
    }
}

fn body(event: &ReceivedEvent) -> String {
    String::from_utf8(event.data.body.to_vec()).unwrap()
}

#[tokio::test]
async fn every_fixture_data_directory_is_opened_and_served() {
    for fixture in fixtures() {
        let copy = copy_of(&fixture);
        let data = copy.path().join("data");
        let broker = Broker::open(fixture::broker_config(&data)).await.unwrap();
        check_hubs(&broker, &fixture).await;
        check_hub_records(&broker).await;
        check_oci_group(&broker).await;
        broker.shutdown().await.unwrap();
        let (policies, created) = AccessPolicies::load_or_create(&data).unwrap();
        assert!(
            created.is_none(),
            "{}: the policies file loads",
            fixture.display()
        );
        assert!(policies.get("RootManageSharedAccessKey").is_some());
        check_checkpoint_stores(&copy.path().join("stores")).await;
        check_offset_maps(&copy.path().join("stores"));
    }
}

/// Every event of every hub, as the fixture wrote it; and the log appends on.
async fn check_hubs(broker: &Broker, fixture: &Path) {
    let mut hubs: Vec<String> = broker.list_hubs().into_iter().map(|h| h.name).collect();
    hubs.sort();
    assert_eq!(
        hubs,
        ["compacted", "legacy", "orders"],
        "{}",
        fixture.display()
    );
    let orders = broker.describe_hub("orders").unwrap();
    assert!(orders.consumer_group("audit").is_some());
    let catalog = std::fs::read(fixture.join("data/catalog.json")).unwrap();
    let captured = tributary_broker::json_format_version(&catalog).is_some_and(|v| v >= 3);
    let capture = captured.then(|| tributary_broker::HubCapture {
        enabled_at_ms: fixture::T0_MS,
        ..fixture::orders_capture()
    });
    assert_eq!(orders.capture, capture, "{}", fixture.display());
    for (hub, partition, count) in [("orders", 0, ORDERS_0), ("orders", 1, ORDERS_1)] {
        let events = read_all(broker, hub, &partition.to_string());
        assert_eq!(events.len() as i64, count, "{hub}/{partition}");
        for (n, event) in (0..).zip(&events) {
            assert_eq!(event.sequence_number, n);
            assert_eq!(body(event), fixture::body(hub, partition, n));
            assert_eq!(
                event.data.properties,
                [("n".into(), PropertyValue::Int64(n))]
            );
        }
    }
    let legacy = read_all(broker, "legacy", "0");
    let bodies: Vec<String> = legacy.iter().map(body).collect();
    let expected: Vec<String> = (0..LEGACY).map(|n| fixture::body("legacy", 0, n)).collect();
    assert_eq!(bodies, expected);
    check_compacted(&read_all(broker, "compacted", "0"));
    // Served, not only read: appends go on after the last event, in the old segments' hubs too.
    for (hub, next) in [("orders", ORDERS_0), ("legacy", LEGACY)] {
        let target = SendTarget::Partition("0".to_owned());
        let receipt = broker
            .send(hub, target, vec![EventData::new("after the upgrade")])
            .await
            .unwrap();
        assert_eq!(receipt.base_sequence, next, "{hub}");
    }
}

/// Compaction kept the last round of each key (and the active segment's events) with their
/// sequence numbers, and removed earlier rounds below it.
fn check_compacted(events: &[ReceivedEvent]) {
    assert!((events.len() as i64) < 4 * COMPACTED_ROUNDS, "compacted");
    assert!(
        events
            .windows(2)
            .all(|w| w[0].sequence_number < w[1].sequence_number)
    );
    let last_round = format!("{} ", COMPACTED_ROUNDS - 1);
    for key in 0..4 {
        let key = format!("k{key}");
        let last = events
            .iter()
            .rfind(|e| e.data.partition_key.as_deref() == Some(key.as_str()))
            .unwrap();
        assert!(body(last).starts_with(&last_round), "{key}: {}", body(last));
        assert_eq!(
            last.sequence_number,
            4 * (COMPACTED_ROUNDS - 1) + last_key_index(&key)
        );
    }
}

fn last_key_index(key: &str) -> i64 {
    key[1..].parse().unwrap()
}

/// The hub-hosted store's records of group `$Default`.
async fn check_hub_records(broker: &Broker) {
    let checkpoints = broker.list_checkpoints("orders", "$Default").await.unwrap();
    let zero = checkpoints.iter().find(|c| c.partition_id == "0").unwrap();
    assert_eq!(zero.sequence_number, Some(CHECKPOINT));
    let checkpointed = broker.read("orders", "0", CHECKPOINT, 1, u64::MAX).unwrap();
    assert_eq!(zero.offset, Some(checkpointed[0].offset));
    let owners = broker.list_ownership("orders", "$Default").await.unwrap();
    assert_eq!(owners.len(), 2);
    assert!(owners.iter().all(|o| o.owner_id == OWNER), "{owners:?}");
}

/// The server-side group's committed offsets.
async fn check_oci_group(broker: &Broker) {
    let coordinator = GroupCoordinator::open(broker.clone(), CoordinatorConfig::default())
        .await
        .unwrap();
    let groups = coordinator.list(Some("orders"));
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0].group, "readers");
    assert_eq!(groups[0].committed[0], GROUP_COMMITTED);
}

/// Both formats of the processor's SQLite store; format 1 gets the host records' table.
async fn check_checkpoint_stores(stores: &Path) {
    for file in ["checkpoints.sqlite", "checkpoints-format-1.sqlite"] {
        let path = stores.join(file);
        let store = SqliteCheckpointStore::open(&path).await.unwrap();
        let checkpoints = store
            .list_checkpoints(NAMESPACE, "orders", "$Default")
            .await
            .unwrap();
        // Stores file names by their lower-case keys.
        let expected = tributary_processor::Checkpoint {
            consumer_group: "$default".to_owned(),
            ..fixture::checkpoint()
        };
        assert_eq!(checkpoints, [expected], "{file}");
        let listing = store
            .renew_host(NAMESPACE, "orders", "$Default", OWNER)
            .await
            .unwrap();
        assert_eq!(listing.ownership.len(), 1, "{file}");
        assert_eq!(listing.ownership[0].owner_id, OWNER, "{file}");
        assert_eq!(listing.hosts.len(), 1, "{file}: host records work");
        assert_eq!(user_version(&path), 2, "{file}");
    }
}

/// Both formats of a replication task's offset map; format 1 gets `keeps_partitions` (false:
/// its syncs read as routed).
fn check_offset_maps(stores: &Path) {
    let current = OffsetMap::open(&stores.join("task.offsets")).unwrap();
    assert_eq!(current.rows().unwrap(), [fixture::sync_row()]);
    let path = stores.join("task-format-1.offsets");
    let upgraded = OffsetMap::open(&path).unwrap();
    let expected = tributary_replicate::offset_map::SyncRow {
        keeps_partitions: false,
        ..fixture::sync_row()
    };
    assert_eq!(upgraded.rows().unwrap(), [expected]);
    assert_eq!(user_version(&path), 2);
}

fn user_version(path: &Path) -> i64 {
    let connection = rusqlite::Connection::open(path).unwrap();
    connection
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap()
}

fn set_user_version(path: &Path, version: i64) {
    let connection = rusqlite::Connection::open(path).unwrap();
    connection
        .pragma_update(None, "user_version", version)
        .unwrap();
}

/// Sets the top-level `version` of a JSON file.
fn set_json_version(path: &Path, version: u64) {
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    json["version"] = version.into();
    std::fs::write(path, serde_json::to_vec(&json).unwrap()).unwrap();
}

fn assert_refused(error: &str, found: u64, newest: u64) {
    let expected =
        format!("was written by format {found}; this binary reads up to format {newest}");
    assert!(error.contains(&expected), "{error}");
}

/// A file of a fixture, how to make it from the future, the version that makes it so, and the
/// newest this build reads.
type FutureFile = (&'static str, fn(&Path), u64, u64);

/// Each broker file from the future stops the broker from opening, and stays as it was.
#[tokio::test]
async fn a_broker_file_from_a_future_format_is_refused_naming_both_versions() {
    let fixture = fixtures().pop().unwrap();
    let cases: [FutureFile; 4] = [
        ("catalog.json", |p| set_json_version(p, 7), 7, 3),
        (
            "hubs/orders/processor/$default.json",
            |p| set_json_version(p, 7),
            7,
            1,
        ),
        (
            "hubs/orders/0/00000000000000000000.log",
            set_first_segment_version,
            9,
            3,
        ),
        (
            "hubs/legacy/0/00000000000000000000.log",
            set_first_segment_version,
            9,
            3,
        ),
    ];
    for (file, from_the_future, found, newest) in cases {
        let copy = copy_of(&fixture);
        let data = copy.path().join("data");
        let path = data.join(file);
        from_the_future(&path);
        let before = std::fs::read(&path).unwrap();
        let opened = Broker::open(fixture::broker_config(&data)).await;
        let error = match opened {
            Ok(broker) => first_refusal(&broker).await,
            Err(error) => error.to_string(),
        };
        assert_refused(&error, found, newest);
        assert!(
            error.contains(&path.display().to_string()),
            "{file}: {error}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), before, "{file} untouched");
    }
}

/// What a broker that opened refuses when the files are used: group records are read when
/// first used.
async fn first_refusal(broker: &Broker) -> String {
    let listed = broker.list_checkpoints("orders", "$Default").await.err();
    let read = ["orders", "legacy"]
        .into_iter()
        .find_map(|hub| broker.read(hub, "0", 0, 1, u64::MAX).err());
    broker.shutdown().await.unwrap();
    listed
        .or(read)
        .expect("a file from the future is refused")
        .to_string()
}

fn set_first_segment_version(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[8..12].copy_from_slice(&9u32.to_le_bytes());
    let crc = crc32c::crc32c(&bytes[..60]);
    bytes[60..64].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(path, bytes).unwrap();
}

/// The access policies, the server-side groups' database and the processor's and replication's
/// SQLite stores from the future are refused the same way.
#[tokio::test]
async fn a_store_from_a_future_format_is_refused_naming_both_versions() {
    let fixture = fixtures().pop().unwrap();
    let copy = copy_of(&fixture);
    let (data, stores) = (copy.path().join("data"), copy.path().join("stores"));

    set_json_version(&data.join("access-policies.json"), 5);
    let error = AccessPolicies::load_or_create(&data)
        .unwrap_err()
        .to_string();
    assert_refused(&error, 5, 1);

    let groups = data.join("groups.sqlite");
    set_user_version(&groups, 5);
    let broker = Broker::open(fixture::broker_config(&data)).await.unwrap();
    let opened = GroupCoordinator::open(broker.clone(), CoordinatorConfig::default()).await;
    assert_refused(&opened.unwrap_err().to_string(), 5, 1);
    broker.shutdown().await.unwrap();
    assert_eq!(user_version(&groups), 5, "untouched");

    let path = stores.join("checkpoints.sqlite");
    set_user_version(&path, 5);
    let error = SqliteCheckpointStore::open(&path).await.unwrap_err();
    assert_refused(&error.to_string(), 5, 2);
    assert_eq!(user_version(&path), 5, "untouched");

    let path = stores.join("task.offsets");
    set_user_version(&path, 5);
    assert_refused(&OffsetMap::open(&path).unwrap_err(), 5, 2);
    assert_refused(&OffsetMap::open_existing(&path).unwrap_err(), 5, 2);
    assert_eq!(user_version(&path), 5, "untouched");
}

/// A catalog written before hubs had ids (still format 1: the field is optional) gets them when
/// opened, saved at once.
#[tokio::test]
async fn a_catalog_from_before_hub_ids_gets_them_when_opened() {
    let copy = copy_of(&fixtures().pop().unwrap());
    let data = copy.path().join("data");
    let catalog = data.join("catalog.json");
    let read = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(&catalog).unwrap()).unwrap()
    };
    let mut json = read();
    for hub in json["hubs"].as_array_mut().unwrap() {
        hub.as_object_mut().unwrap().remove("id").unwrap();
    }
    std::fs::write(&catalog, json.to_string()).unwrap();
    let broker = Broker::open(fixture::broker_config(&data)).await.unwrap();
    let mut ids: Vec<String> = broker.list_hubs().into_iter().map(|h| h.id).collect();
    broker.shutdown().await.unwrap();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(ids.iter().all(|id| !id.is_empty()));
    let saved = read();
    for hub in saved["hubs"].as_array().unwrap() {
        let id = hub["id"].as_str().unwrap();
        assert!(ids.iter().any(|known| known == id), "{id} saved");
    }
}
