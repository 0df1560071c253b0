//! What the capture tests share: a broker on a manual clock, a hub, and the files read back.

#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use apache_avro::types::Value;
use tributary_broker::{Broker, BrokerConfig, Durability, HubSpec};
use tributary_capture::{
    CaptureConfig, CaptureTarget, Destination, DirectoryDestination, PartitionCapture,
};
use tributary_event::{EventData, EventPosition, ManualClock, ReceivedEvent};

/// 2023-09-15T14:42:31Z: the clock's start in every test.
pub const T0_MS: i64 = 1_694_788_951_000;
pub const HUB: &str = "orders";
pub const NAMESPACE: &str = "ns";

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub clock: Arc<ManualClock>,
    pub broker: Broker,
}

impl Fixture {
    pub async fn start(partitions: u32) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(T0_MS));
        let mut config = BrokerConfig::new(dir.path().join("data"));
        config.log.durability = Durability::None;
        let broker = Broker::open_with_clock(config, clock.clone())
            .await
            .unwrap();
        broker
            .create_hub(HubSpec::new(HUB, partitions))
            .await
            .unwrap();
        Fixture { dir, clock, broker }
    }

    pub fn files_root(&self) -> PathBuf {
        self.dir.path().join("capture")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn destination(&self) -> DirectoryDestination {
        DirectoryDestination::new(self.files_root()).unwrap()
    }

    pub async fn send(&self, partition: &str, events: Vec<EventData>) {
        self.broker
            .send_to_partition_keyed(HUB, partition, &events)
            .await
            .unwrap();
    }

    pub fn capture_with(
        &self,
        destination: Arc<dyn Destination>,
        config: CaptureConfig,
        partition: &str,
    ) -> PartitionCapture {
        PartitionCapture::new(
            self.broker.clone(),
            destination,
            self.clock.clone(),
            config,
            CaptureTarget {
                namespace: NAMESPACE.to_owned(),
                hub: HUB.to_owned(),
                partition: partition.to_owned(),
            },
            &self.state_dir(),
            EventPosition::Earliest,
        )
        .unwrap()
    }

    pub fn capture(&self, config: CaptureConfig, partition: &str) -> PartitionCapture {
        self.capture_with(Arc::new(self.destination()), config, partition)
    }

    /// Every event the partition holds.
    pub fn hub_events(&self, partition: &str) -> Vec<ReceivedEvent> {
        self.broker
            .read(HUB, partition, 0, 100_000, u64::MAX)
            .unwrap()
    }

    pub fn advance_secs(&self, secs: i64) {
        self.clock.advance_ms(secs * 1000);
    }
}

/// Every `.avro` file below `root`, by relative name, in name order.
pub fn avro_files(root: &Path) -> BTreeMap<String, PathBuf> {
    let mut found = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let name = path
                    .strip_prefix(root)
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_owned();
                found.insert(name, path);
            }
        }
    }
    found
}

/// The records of one Avro file, read with apache-avro, and its header's codec.
pub fn read_records(path: &Path) -> Vec<BTreeMap<String, Value>> {
    let file = std::fs::File::open(path).unwrap();
    let reader = apache_avro::Reader::new(file).unwrap();
    let schema = reader.writer_schema().clone();
    let canonical = schema.canonical_form();
    assert!(
        canonical.contains(r#""name":"Microsoft.ServiceBus.Messaging.EventData""#),
        "{canonical}"
    );
    reader
        .map(|record| match record.unwrap() {
            Value::Record(fields) => fields.into_iter().collect(),
            other => panic!("not a record: {other:?}"),
        })
        .collect()
}

pub fn long(record: &BTreeMap<String, Value>, field: &str) -> i64 {
    match &record[field] {
        Value::Long(v) => *v,
        other => panic!("{field} is {other:?}"),
    }
}

pub fn string(record: &BTreeMap<String, Value>, field: &str) -> String {
    match &record[field] {
        Value::String(v) => v.clone(),
        other => panic!("{field} is {other:?}"),
    }
}

/// A map field's entries with their union wrappers removed.
pub fn map(record: &BTreeMap<String, Value>, field: &str) -> BTreeMap<String, Value> {
    match &record[field] {
        Value::Map(entries) => entries
            .iter()
            .map(|(k, v)| match v {
                Value::Union(_, inner) => (k.clone(), (**inner).clone()),
                other => (k.clone(), other.clone()),
            })
            .collect(),
        other => panic!("{field} is {other:?}"),
    }
}

pub fn body(record: &BTreeMap<String, Value>) -> Vec<u8> {
    match &record["Body"] {
        Value::Union(1, inner) => match &**inner {
            Value::Bytes(b) => b.clone(),
            other => panic!("Body is {other:?}"),
        },
        other => panic!("Body is {other:?}"),
    }
}

/// The sequence numbers of every record of every file below `root`.
pub fn captured_sequences(root: &Path) -> Vec<i64> {
    let mut all = Vec::new();
    for path in avro_files(root).values() {
        assert!(
            path.extension().is_some_and(|e| e == "avro"),
            "a file that is not a capture file: {}",
            path.display()
        );
        all.extend(read_records(path).iter().map(|r| long(r, "SequenceNumber")));
    }
    all
}
