//! Capture into Azure Blob Storage (Azurite), read back as Azure's readers would: the official
//! `azure-storage-blob` SDK lists and downloads the blobs, fastavro reads the Avro ones, pyarrow
//! and duckdb the Parquet ones (`tests/python/capture_blobs.py`), and every event must match
//! the hub's. Also: a window whose blocks were staged but never committed is invisible and is
//! written exactly once after recovery; bad destinations are clear errors.
//!
//! Azurite comes from `scripts/setup-js-interop`, the Python packages from
//! `scripts/setup-python-interop`; a missing one FAILS this test, it never skips it.

use std::io::Read;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Value, json};
use tributary_blob::ContainerClient;
use tributary_broker::{Broker, BrokerConfig, Durability, HubSpec};
use tributary_capture::{
    BlobDestination, CaptureConfig, CaptureError, CaptureFormat, CaptureTarget, Destination,
    PartitionCapture,
};
use tributary_event::{EventData, EventPosition, ManualClock, PropertyValue, ReceivedEvent};
use tributary_testkit::Azurite;
use tributary_testkit::azurite::{AZURITE_ACCOUNT, AZURITE_KEY};

/// 2023-09-15T14:42:31Z.
const T0_MS: i64 = 1_694_788_951_000;
const HUB: &str = "orders";

struct Hub {
    dir: tempfile::TempDir,
    clock: Arc<ManualClock>,
    broker: Broker,
}

impl Hub {
    async fn start() -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(T0_MS));
        let mut config = BrokerConfig::new(dir.path().join("data"));
        config.log.durability = Durability::None;
        let broker = Broker::open_with_clock(config, clock.clone())
            .await
            .unwrap();
        broker.create_hub(HubSpec::new(HUB, 1)).await.unwrap();
        Hub { dir, clock, broker }
    }

    fn capture(
        &self,
        destination: Arc<dyn Destination>,
        format: CaptureFormat,
    ) -> PartitionCapture {
        let config = CaptureConfig {
            format,
            ..CaptureConfig::default()
        };
        let target = CaptureTarget {
            namespace: "ns".into(),
            hub: HUB.into(),
            partition: "0".into(),
        };
        let state = self.dir.path().join(format!("state-{}", format.as_str()));
        PartitionCapture::new(
            self.broker.clone(),
            destination,
            self.clock.clone(),
            config,
            target,
            &state,
            EventPosition::Earliest,
        )
        .unwrap()
    }

    fn events(&self) -> Vec<ReceivedEvent> {
        self.broker.read(HUB, "0", 0, 10_000, u64::MAX).unwrap()
    }
}

fn events_to_send() -> Vec<EventData> {
    let mut keyed = EventData::new(vec![0_u8, 159, 146, 150])
        .with_property("n", PropertyValue::Int64(-3))
        .with_property("x", PropertyValue::Float64(0.25))
        .with_property("s", PropertyValue::String("tributary".into()))
        .with_property("b", PropertyValue::Bytes(Bytes::from_static(b"\x00\x01")))
        .with_property("z", PropertyValue::Null);
    keyed.partition_key = Some("device-7".into());
    let mut events = vec![keyed, EventData::new("plain")];
    events.extend((0..20).map(|i| EventData::new(format!("event {i}"))));
    events
}

/// What the Python script found in `container`.
async fn read_container(connection_string: &str, container: &str) -> Vec<Value> {
    let script = tributary_testkit::repo().join("crates/testkit/tests/python/capture_blobs.py");
    let mut command = tokio::process::Command::new(tributary_testkit::python());
    command.arg(script).arg(connection_string).arg(container);
    let found = tributary_testkit::run_json(command, "reading the capture container").await;
    found["blobs"].as_array().unwrap().clone()
}

/// The record Azure's readers should find for `event` (Parquet's time as epoch ms).
fn expected_record(event: &ReceivedEvent, parquet: bool) -> Value {
    let mut properties = serde_json::Map::new();
    for (key, value) in &event.data.properties {
        let value = match value {
            PropertyValue::Int64(v) => json!(v),
            PropertyValue::Float64(v) => json!(v),
            PropertyValue::String(s) => json!(s.as_str()),
            PropertyValue::Bytes(b) => json!(b.to_vec()),
            PropertyValue::Null => Value::Null,
            other => panic!("the test sends no {other:?}"),
        };
        properties.insert(key.to_string(), value);
    }
    let mut system = json!({"x-opt-enqueued-time": event.enqueued_time_ms});
    if let Some(key) = &event.data.partition_key {
        system["x-opt-partition-key"] = json!(key.as_str());
    }
    let time = if parquet {
        json!(event.enqueued_time_ms)
    } else {
        json!(tributary_capture::time_text::enqueued_time_utc(
            event.enqueued_time_ms
        ))
    };
    json!({
        "SequenceNumber": event.sequence_number,
        "Offset": event.offset.to_string(),
        "EnqueuedTimeUtc": time,
        "SystemProperties": system,
        "Properties": properties,
        "Body": event.data.body.to_vec(),
    })
}

fn destination(azurite: &Azurite, container: &str) -> Arc<BlobDestination> {
    let url = format!("blob:{}/{container}", azurite.blob_endpoint());
    Arc::new(BlobDestination::open(&url, Some(&azurite.connection_string())).unwrap())
}

async fn create_container(azurite: &Azurite, container: &str) {
    ContainerClient::from_connection_string(&azurite.connection_string(), container)
        .unwrap()
        .create_container_if_absent()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_to_blob_storage_reads_back_with_the_official_sdk_and_survives_a_crash() {
    let azurite = Azurite::start().await;
    windows_read_back_by_azures_readers(&azurite).await;
    staged_blocks_are_invisible_and_recovery_writes_each_event_once(&azurite).await;
    a_sas_in_the_url_is_a_credential(&azurite).await;
    bad_destinations_are_clear_errors(&azurite).await;
}

async fn windows_read_back_by_azures_readers(azurite: &Azurite) {
    let hub = Hub::start().await;
    hub.broker
        .send_to_partition_keyed(HUB, "0", &events_to_send())
        .await
        .unwrap();
    let sent = hub.events();
    for (format, container) in [
        (CaptureFormat::Avro, "capture-avro"),
        (CaptureFormat::Parquet, "capture-parquet"),
    ] {
        create_container(azurite, container).await;
        let destination = destination(azurite, container);
        let mut capture = hub.capture(destination.clone(), format);
        // The blocking capture calls run off the runtime's workers, as the module docs ask.
        let created = tokio::task::spawn_blocking(move || {
            capture.step().unwrap();
            capture
        })
        .await
        .unwrap();
        hub.clock.advance_ms(300_000);
        let mut capture = created;
        let files = tokio::task::spawn_blocking(move || capture.step().unwrap())
            .await
            .unwrap();
        // Back to the start: the next format's capture (progress of its own) opens its window
        // at the same second, so both files have the same name but for the extension.
        hub.clock.advance_ms(-300_000);
        assert_eq!(files.len(), 1, "{format:?}");
        let name = format!("ns/orders/0/2023/09/15/14/42/31{}", format.extension());
        assert_eq!(files[0].file_url, destination.url(&name));
        assert_eq!(files[0].file_type, "AzureBlockBlob");

        let blobs = read_container(&azurite.connection_string(), container).await;
        assert_eq!(blobs.len(), 1, "{format:?}: {blobs:?}");
        assert_eq!(blobs[0]["name"], name);
        assert_eq!(blobs[0]["size"], files[0].size_in_bytes);
        let parquet = format == CaptureFormat::Parquet;
        let expected: Vec<Value> = sent.iter().map(|e| expected_record(e, parquet)).collect();
        assert_eq!(
            blobs[0]["records"].as_array().unwrap(),
            &expected,
            "{format:?}"
        );
        if parquet {
            assert_eq!(
                blobs[0]["schema"]["EnqueuedTimeUtc"],
                "timestamp[ms, tz=UTC]"
            );
            assert_eq!(blobs[0]["schema"]["SequenceNumber"], "int64");
            assert_duckdb_rows(&blobs[0]["duckdb"], &sent);
        }
    }
}

/// duckdb's rows (sequence number, offset, enqueued ms, body, property keys) are the hub's.
fn assert_duckdb_rows(rows: &Value, sent: &[ReceivedEvent]) {
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), sent.len());
    for (row, event) in rows.iter().zip(sent) {
        let mut keys: Vec<String> = event
            .data
            .properties
            .iter()
            .map(|(k, _)| k.to_string())
            .collect();
        keys.sort();
        let expected = json!([
            event.sequence_number,
            event.offset.to_string(),
            event.enqueued_time_ms,
            event.data.body.to_vec(),
            keys
        ]);
        assert_eq!(row, &expected);
    }
}

async fn staged_blocks_are_invisible_and_recovery_writes_each_event_once(azurite: &Azurite) {
    let container = "capture-crash";
    create_container(azurite, container).await;
    let hub = Hub::start().await;
    // Twelve events of 512 KiB: the first eight fill a 4 MiB block, staged while the window is
    // still open.
    for i in 0..12_u8 {
        let event = EventData::new(vec![i; 512 * 1024]);
        hub.broker
            .send_to_partition_keyed(HUB, "0", &[event])
            .await
            .unwrap();
    }
    let name = "ns/orders/0/2023/09/15/14/42/31.avro";
    let first = destination(azurite, container);
    let mut capture = hub.capture(first.clone(), CaptureFormat::Avro);
    let first_check = first.clone();
    tokio::task::spawn_blocking(move || {
        assert!(capture.step().unwrap().is_empty());
        // The crash: the capture goes away with its window's blocks staged, never committed.
        drop(capture);
        assert!(!first_check.exists(name).unwrap());
        assert_eq!(first_check.leftovers().unwrap(), [name]);
    })
    .await
    .unwrap();
    let listed = read_container(&azurite.connection_string(), container).await;
    assert!(
        listed.is_empty(),
        "uncommitted blocks are invisible: {listed:?}"
    );

    hub.clock.advance_ms(300_000);
    let again = destination(azurite, container);
    let mut capture = hub.capture(again.clone(), CaptureFormat::Avro);
    let files = tokio::task::spawn_blocking(move || {
        let files = capture.step().unwrap();
        assert!(again.leftovers().unwrap().is_empty());
        files
    })
    .await
    .unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].event_count, 12);
    let blobs = read_container(&azurite.connection_string(), container).await;
    assert_eq!(
        blobs.len(),
        1,
        "{:?}",
        blobs.iter().map(|b| &b["name"]).collect::<Vec<_>>()
    );
    assert_eq!(blobs[0]["name"], name);
    let sequence_numbers: Vec<i64> = blobs[0]["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["SequenceNumber"].as_i64().unwrap())
        .collect();
    assert_eq!(sequence_numbers, (0..12).collect::<Vec<_>>());
    let bodies_ok = blobs[0]["records"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .all(|(i, r)| {
            let body = r["Body"].as_array().unwrap();
            body.len() == 512 * 1024 && body.iter().all(|b| b.as_u64() == Some(i as u64))
        });
    assert!(bodies_ok, "every body is whole and in its place");
}

/// An account SAS for Azurite's account, signed by the official SDK.
async fn account_sas() -> String {
    let script = format!(
        "from azure.storage.blob import generate_account_sas, ResourceTypes, AccountSasPermissions\n\
         import datetime, json\n\
         print(json.dumps(generate_account_sas('{AZURITE_ACCOUNT}', '{AZURITE_KEY}', \
         ResourceTypes(container=True, object=True), \
         AccountSasPermissions(read=True, write=True, list=True, create=True), \
         datetime.datetime.utcnow() + datetime.timedelta(hours=1))))\n"
    );
    let mut command = tokio::process::Command::new(tributary_testkit::python());
    command.arg("-c").arg(script);
    let sas = tributary_testkit::run_json(command, "making a SAS token").await;
    sas.as_str().unwrap().to_owned()
}

/// The Avro window of the first scenario, reached with a SAS instead of the key and read back
/// through the destination (ranged reads) as recovery reads it.
async fn a_sas_in_the_url_is_a_credential(azurite: &Azurite) {
    let url = format!(
        "blob:{}/capture-avro?{}",
        azurite.blob_endpoint(),
        account_sas().await
    );
    let blobs = read_container(&azurite.connection_string(), "capture-avro").await;
    let size = blobs[0]["size"].as_u64().unwrap();
    tokio::task::spawn_blocking(move || {
        let destination = BlobDestination::open(&url, None).unwrap();
        assert!(!format!("{destination:?}").contains("sig="));
        let name = "ns/orders/0/2023/09/15/14/42/31.avro";
        assert!(destination.exists(name).unwrap());
        assert_eq!(destination.size(name).unwrap(), size);
        let mut bytes = Vec::new();
        destination
            .open(name)
            .unwrap()
            .read_to_end(&mut bytes)
            .unwrap();
        assert_eq!(bytes.len() as u64, size);
        let summary = tributary_capture::avro::summarize(&bytes[..]).unwrap();
        assert_eq!(summary.event_count, 22);
        assert!(!destination.exists("ns/orders/0/none.avro").unwrap());
    })
    .await
    .unwrap();
}

async fn bad_destinations_are_clear_errors(azurite: &Azurite) {
    let endpoint = azurite.blob_endpoint();
    let connection_string = azurite.connection_string();
    let wrong_key = format!("AccountName={AZURITE_ACCOUNT};AccountKey=d3Jvbmcta2V5");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    tokio::task::spawn_blocking(move || {
        let error = |url: &str, cs: Option<&str>| BlobDestination::open(url, cs).unwrap_err();
        let missing = error(
            &format!("blob:{endpoint}/no-such-container"),
            Some(&connection_string),
        );
        assert!(
            matches!(missing, CaptureError::Destination { .. }),
            "{missing}"
        );
        assert!(missing.to_string().contains("does not exist"), "{missing}");
        let refused = error(&format!("blob:{endpoint}/capture-avro"), Some(&wrong_key));
        assert!(refused.to_string().contains("403"), "{refused}");
        assert!(!refused.to_string().contains("d3Jvbmcta2V5"), "{refused}");
        let down = format!("blob:http://127.0.0.1:{closed_port}/{AZURITE_ACCOUNT}/capture");
        let unreachable = error(&down, Some(&connection_string));
        assert!(
            unreachable.to_string().contains("did not answer"),
            "{unreachable}"
        );
        let no_credential = error(&format!("blob:{endpoint}/capture-avro"), None);
        assert!(
            matches!(no_credential, CaptureError::InvalidConfig { .. }),
            "{no_credential}"
        );
    })
    .await
    .unwrap();
}
