//! What a format fixture holds, and how `examples/write_format_fixtures.rs` writes one.
//!
//! A fixture is a directory `crates/testkit/fixtures/formats/<name>/` written once by the
//! build that defined its formats and never rewritten: `data/` is a broker data directory
//! (catalog, three hubs, hub-hosted ownership and checkpoint records, access policies, the
//! server-side groups' database) and `stores/` the processor's SQLite checkpoint stores and a
//! replication task's offset maps. What it holds is fixed here, so the test reading it
//! (`tests/formats.rs`) knows what to expect:
//!
//! - hub `orders`, 2 partitions, consumer groups `$Default` and `audit`, captured
//!   ([`orders_capture`]; from catalog format 3 on): partition 0 holds
//!   [`ORDERS_0`] events (sealed segments with index files, then the active one; each event
//!   carries the property `n`, so version 2 segments refer between records), partition 1
//!   [`ORDERS_1`]. Group `$Default`: both partitions owned by [`OWNER`], partition 0
//!   checkpointed at sequence number [`CHECKPOINT`].
//! - hub `legacy`, 1 partition: [`LEGACY`] events without properties in a version 1 segment.
//! - hub `compacted`, 1 partition: keys `k0`..`k3` written [`COMPACTED_ROUNDS`] times each
//!   with the round as body, compacted: version 3 segments with version 2 index files keep
//!   the last round of each key below the active segment.
//! - the OCI group `readers` of `orders`, which committed the first [`GROUP_COMMITTED`]
//!   events of partition 0.
//! - `stores/checkpoints.sqlite` (format 2) and `stores/checkpoints-format-1.sqlite` (format
//!   1, without host records): partition 0 of hub `orders` in namespace [`NAMESPACE`] owned
//!   by [`OWNER`] and checkpointed at [`CHECKPOINT`].
//! - `stores/task.offsets` (format 2) and `stores/task-format-1.offsets` (format 1, without
//!   `keeps_partitions`): one sync of source partition 0 at [`CHECKPOINT`] to target
//!   partition 0 at [`SYNC_TARGET_SEQUENCE`].

// Each test target uses part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tributary_broker::{
    Broker, BrokerConfig, CheckpointRecord, Durability, HubCapture, HubSpec, OwnershipClaim,
    SendTarget,
};
use tributary_event::{EventData, ManualClock, PropertyValue};
use tributary_groups::{CoordinatorConfig, GroupCoordinator, JoinRequest, StartPosition};
use tributary_log::{Cleanup, CleanupPolicy, GroupCommitter, LogConfig, PartitionLog};
use tributary_processor::store::{Checkpoint, Ownership, OwnershipFence};
use tributary_processor::{CheckpointStore, SqliteCheckpointStore};
use tributary_replicate::offset_map::{OffsetMap, SyncRow};

/// The broker clock's time while the fixture is written.
pub(crate) const T0_MS: i64 = 1_764_000_000_000;
/// Events in partition 0 of hub `orders`.
pub(crate) const ORDERS_0: i64 = 60;
/// Events in partition 1 of hub `orders`.
pub(crate) const ORDERS_1: i64 = 5;
/// Events in the version 1 segment of hub `legacy`.
pub(crate) const LEGACY: i64 = 6;
/// How many times each key of hub `compacted` was written.
pub(crate) const COMPACTED_ROUNDS: i64 = 40;
/// The processor host that owns partitions in the fixture's stores.
pub(crate) const OWNER: &str = "host-a";
/// The sequence number partition 0's checkpoints name.
pub(crate) const CHECKPOINT: i64 = 41;
/// The sequence number the offset maps' sync names in the target.
pub(crate) const SYNC_TARGET_SEQUENCE: i64 = 17;
/// How many events of partition 0 the OCI group committed.
pub(crate) const GROUP_COMMITTED: i64 = 10;
/// The namespace of the processor stores' records.
pub(crate) const NAMESPACE: &str = "fixture.local";

/// The body of event `sequence_number` of `hub`'s `partition`.
pub(crate) fn body(hub: &str, partition: u32, sequence_number: i64) -> String {
    format!("{hub}/{partition}/{sequence_number} {}", "x".repeat(100))
}

/// The broker configuration the fixture is written and read with: small segments, so partition
/// 0 of `orders` has sealed segments.
pub(crate) fn broker_config(data_dir: &Path) -> BrokerConfig {
    let mut config = BrokerConfig::new(data_dir);
    config.log.segment_bytes_max = 4096;
    config.log.index_interval_bytes = 512;
    config.log.durability = Durability::None;
    config
}

/// Writes a fixture into `dir` (which must not hold one).
pub(crate) async fn write(dir: &Path) {
    let data = dir.join("data");
    let stores = dir.join("stores");
    std::fs::create_dir_all(&stores).unwrap();
    write_broker_data(&data).await;
    write_compacted_partition(&compacted_partition_dir(&data));
    set_segment_versions(&data.join("hubs/legacy/0"), 1);
    let (_, shown) = tributary_amqp::AccessPolicies::load_or_create(&data).unwrap();
    assert!(shown.is_some(), "a new policies file");
    write_checkpoint_store(&stores.join("checkpoints.sqlite")).await;
    write_checkpoint_store_format_1(&stores.join("checkpoints-format-1.sqlite"));
    OffsetMap::open(&stores.join("task.offsets"))
        .unwrap()
        .record(&[sync_row()])
        .unwrap();
    write_offset_map_format_1(&stores.join("task-format-1.offsets"));
}

/// The capture of hub `orders` (catalog format 3 on; turned on at [`T0_MS`]).
pub(crate) fn orders_capture() -> HubCapture {
    HubCapture {
        destination: "file:/var/lib/tributary-fixture-capture".to_owned(),
        encoding: "AvroDeflate".to_owned(),
        interval_secs: 120,
        size_bytes_max: 20 * 1024 * 1024,
        skip_empty: true,
        archive_name_format:
            "{Namespace}/{EventHub}/{PartitionId}/{Year}/{Month}/{Day}/{Hour}/{Minute}/{Second}"
                .to_owned(),
        notify_hub: Some("legacy".to_owned()),
        enabled_at_ms: 0,
    }
}

async fn write_broker_data(data: &Path) {
    let clock = Arc::new(ManualClock::new(T0_MS));
    let broker = Broker::open_with_clock(broker_config(data), clock)
        .await
        .unwrap();
    let orders = HubSpec {
        capture: Some(orders_capture()),
        ..HubSpec::new("orders", 2)
    };
    broker.create_hub(orders).await.unwrap();
    broker
        .create_consumer_group("orders", "audit")
        .await
        .unwrap();
    broker.create_hub(HubSpec::new("legacy", 1)).await.unwrap();
    broker
        .create_hub(HubSpec::new("compacted", 1))
        .await
        .unwrap();
    for (partition, count) in [(0, ORDERS_0), (1, ORDERS_1)] {
        for first in (0..count).step_by(5) {
            let events = (first..count.min(first + 5))
                .map(|n| {
                    let mut event = EventData::new(body("orders", partition, n));
                    event.properties.push(("n".into(), PropertyValue::Int64(n)));
                    event
                })
                .collect();
            let target = SendTarget::Partition(partition.to_string());
            broker.send("orders", target, events).await.unwrap();
        }
    }
    for n in 0..LEGACY {
        let event = EventData::new(body("legacy", 0, n));
        let target = SendTarget::Partition("0".to_owned());
        broker.send("legacy", target, vec![event]).await.unwrap();
    }
    write_hub_records(&broker).await;
    write_oci_group(&broker).await;
    broker.shutdown().await.unwrap();
}

async fn write_hub_records(broker: &Broker) {
    let claims = ["0", "1"]
        .map(|partition_id| OwnershipClaim {
            partition_id: partition_id.to_owned(),
            owner_id: OWNER.to_owned(),
            etag: None,
        })
        .to_vec();
    broker
        .claim_ownership("orders", "$Default", claims)
        .await
        .unwrap();
    let checkpointed = broker.read("orders", "0", CHECKPOINT, 1, u64::MAX).unwrap();
    let checkpoint = CheckpointRecord {
        partition_id: "0".to_owned(),
        offset: Some(checkpointed[0].offset),
        sequence_number: Some(CHECKPOINT),
    };
    broker
        .update_checkpoint("orders", "$Default", checkpoint, OWNER)
        .await
        .unwrap();
}

async fn write_oci_group(broker: &Broker) {
    let coordinator = GroupCoordinator::open(broker.clone(), CoordinatorConfig::default())
        .await
        .unwrap();
    let join = JoinRequest {
        stream: "orders".to_owned(),
        group: "readers".to_owned(),
        instance: Some("reader-1".to_owned()),
        start: StartPosition::TrimHorizon,
        commit_on_get: false,
        timeout_ms: 30_000,
    };
    let session = coordinator.join(join).await.unwrap();
    let batch = coordinator
        .get(&session, GROUP_COMMITTED as u32, u64::MAX)
        .await
        .unwrap();
    let from_0 = batch.events.iter().filter(|(p, _)| *p == 0).count();
    assert_eq!(from_0 as i64, GROUP_COMMITTED, "{:?}", batch.events);
    coordinator.commit(&batch.session).await.unwrap();
}

/// The directory of partition 0 of hub `compacted`.
pub(crate) fn compacted_partition_dir(data: &Path) -> PathBuf {
    data.join("hubs/compacted/0")
}

/// Rewrites the empty partition the broker made with keyed events, and compacts it.
fn write_compacted_partition(dir: &Path) {
    std::fs::remove_dir_all(dir).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let config = LogConfig {
        durability: Durability::None,
        segment_bytes_max: 4096,
        index_interval_bytes: 256,
        cleanup: Cleanup {
            policy: CleanupPolicy::Compact,
            ..Cleanup::default()
        },
        ..LogConfig::default()
    };
    let clock = Arc::new(ManualClock::new(T0_MS));
    let log = PartitionLog::open(dir, config, GroupCommitter::start(), clock).unwrap();
    for round in 0..COMPACTED_ROUNDS {
        for key in 0..4 {
            let mut event = EventData::new(format!("{round} {}", "y".repeat(60)));
            event.partition_key = Some(format!("k{key}"));
            log.append(&[event]).unwrap();
        }
    }
    let outcome = log.compact(T0_MS).unwrap();
    assert!(outcome.events_removed > 0, "{outcome:?}");
}

/// Sets the version of every segment in `dir` to `version` (and its header checksum).
pub(crate) fn set_segment_versions(dir: &Path, version: u32) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "log") {
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[8..12].copy_from_slice(&version.to_le_bytes());
            let crc = crc32c::crc32c(&bytes[..60]);
            bytes[60..64].copy_from_slice(&crc.to_le_bytes());
            std::fs::write(&path, bytes).unwrap();
        }
    }
}

async fn write_checkpoint_store(path: &Path) {
    let store = SqliteCheckpointStore::open(path).await.unwrap();
    let claim = Ownership {
        fully_qualified_namespace: NAMESPACE.to_owned(),
        event_hub_name: "orders".to_owned(),
        consumer_group: "$Default".to_owned(),
        partition_id: "0".to_owned(),
        owner_id: OWNER.to_owned(),
        last_modified_time_ms: 0,
        etag: None,
        version: 0,
    };
    assert_eq!(store.claim_ownership(vec![claim]).await.unwrap().len(), 1);
    let fence = OwnershipFence {
        owner_id: OWNER.to_owned(),
    };
    store.update_checkpoint(checkpoint(), &fence).await.unwrap();
}

/// Partition 0's checkpoint in the processor stores.
pub(crate) fn checkpoint() -> Checkpoint {
    Checkpoint {
        fully_qualified_namespace: NAMESPACE.to_owned(),
        event_hub_name: "orders".to_owned(),
        consumer_group: "$Default".to_owned(),
        partition_id: "0".to_owned(),
        offset: None,
        sequence_number: Some(CHECKPOINT),
    }
}

/// Format 1 of the processor's SQLite store, as commit a591b41^ created it (its schema, its
/// `user_version`), holding what `write_checkpoint_store` writes.
fn write_checkpoint_store_format_1(path: &Path) {
    let connection = rusqlite::Connection::open(path).unwrap();
    connection
        .execute_batch(&format!(
            "CREATE TABLE ownership (namespace TEXT NOT NULL, event_hub TEXT NOT NULL,
                consumer_group TEXT NOT NULL, partition_id TEXT NOT NULL, owner_id TEXT NOT NULL,
                last_modified_time_ms INTEGER NOT NULL, etag TEXT NOT NULL,
                version INTEGER NOT NULL,
                PRIMARY KEY (namespace, event_hub, consumer_group, partition_id)) WITHOUT ROWID;
             CREATE TABLE checkpoint (namespace TEXT NOT NULL, event_hub TEXT NOT NULL,
                consumer_group TEXT NOT NULL, partition_id TEXT NOT NULL, event_offset INTEGER,
                sequence_number INTEGER,
                PRIMARY KEY (namespace, event_hub, consumer_group, partition_id)) WITHOUT ROWID;
             INSERT INTO ownership VALUES ('{NAMESPACE}', 'orders', '$default', '0', '{OWNER}',
                {T0_MS}, 'etag-1', 1);
             INSERT INTO checkpoint VALUES ('{NAMESPACE}', 'orders', '$default', '0', NULL,
                {CHECKPOINT});
             PRAGMA user_version = 1;"
        ))
        .unwrap();
}

/// The offset maps' one sync.
pub(crate) fn sync_row() -> SyncRow {
    SyncRow {
        source_id: "source-hub-id".to_owned(),
        source_partitions: 2,
        source_partition: "0".to_owned(),
        source_sequence: CHECKPOINT,
        target_id: "target-hub-id".to_owned(),
        target_name: "replica".to_owned(),
        target_partitions: 2,
        target_partition: "0".to_owned(),
        target_sequence: SYNC_TARGET_SEQUENCE,
        recorded_at_ms: T0_MS,
        keeps_partitions: true,
    }
}

/// An offset map as written before it had `keeps_partitions` (format 1, `user_version` 0).
fn write_offset_map_format_1(path: &Path) {
    let row = sync_row();
    let connection = rusqlite::Connection::open(path).unwrap();
    connection
        .execute_batch(&format!(
            "CREATE TABLE offset_sync (source_id TEXT NOT NULL,
                source_partitions INTEGER NOT NULL, source_partition TEXT NOT NULL,
                source_sequence INTEGER NOT NULL, target_id TEXT NOT NULL,
                target_name TEXT NOT NULL, target_partitions INTEGER NOT NULL,
                target_partition TEXT NOT NULL, target_sequence INTEGER NOT NULL,
                recorded_at_ms INTEGER NOT NULL,
                PRIMARY KEY (source_id, source_partition, target_id, source_sequence,
                    target_partition));
             INSERT INTO offset_sync VALUES ('{}', {}, '{}', {}, '{}', '{}', {}, '{}', {}, {});",
            row.source_id,
            row.source_partitions,
            row.source_partition,
            row.source_sequence,
            row.target_id,
            row.target_name,
            row.target_partitions,
            row.target_partition,
            row.target_sequence,
            row.recorded_at_ms
        ))
        .unwrap();
}
