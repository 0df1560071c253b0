//! A file this crate wrote, read by Python's `fastavro` (`tests/read_capture.py`): Azure's
//! schema name, namespace and fields, and every record as the hub holds it. Runs
//! `<repo>/.venv/bin/python` (or `$TRIBUTARY_PYTHON`); install `fastavro` with
//! `scripts/setup-python-interop`. A missing Python or `fastavro` FAILS this test.

mod common;

use std::path::PathBuf;
use std::process::Command;

use bytes::Bytes;
use common::{Fixture, avro_files};
use serde_json::{Value, json};
use tributary_capture::time_text::enqueued_time_utc;
use tributary_capture::{CaptureConfig, CaptureFormat};
use tributary_event::{EventData, PropertyValue};

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("TRIBUTARY_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    assert!(
        venv.exists(),
        "Python with fastavro is not installed: run scripts/setup-python-interop (expected {})",
        venv.display()
    );
    venv
}

fn read_with_fastavro(path: &std::path::Path) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/read_capture.py");
    let output = Command::new(python())
        .arg(script)
        .arg(path)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "read_capture.py failed (is fastavro installed? run scripts/setup-python-interop): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[tokio::test]
async fn fastavro_reads_azures_schema_and_every_record() {
    for (format, codec) in [
        (CaptureFormat::Avro, "null"),
        (CaptureFormat::AvroDeflate, "deflate"),
    ] {
        let f = Fixture::start(1).await;
        let mut keyed = EventData::new(vec![0_u8, 159, 146, 150])
            .with_property("n", PropertyValue::Int64(-3))
            .with_property("x", PropertyValue::Float64(0.25))
            .with_property("s", PropertyValue::String("tributary".into()))
            .with_property("b", PropertyValue::Bytes(Bytes::from_static(b"\x00\x01")))
            .with_property("z", PropertyValue::Null);
        keyed.partition_key = Some("device-7".into());
        f.send("0", vec![keyed, EventData::new("plain")]).await;
        let config = CaptureConfig {
            format,
            ..CaptureConfig::default()
        };
        let mut capture = f.capture(config, "0");
        capture.step().unwrap();
        f.advance_secs(300);
        capture.step().unwrap();
        let files = avro_files(&f.files_root());
        let file = read_with_fastavro(files.values().next().unwrap());

        assert_eq!(file["codec"], codec);
        assert_azures_schema(&file["schema"]);
        // The header's own text names the record as Azure's does: a name and a namespace.
        assert_eq!(file["header_schema"]["name"], "EventData");
        assert_eq!(
            file["header_schema"]["namespace"],
            "Microsoft.ServiceBus.Messaging"
        );

        let held = f.hub_events("0");
        let records = file["records"].as_array().unwrap();
        assert_eq!(records.len(), held.len());
        for (record, event) in records.iter().zip(&held) {
            assert_eq!(record["SequenceNumber"], event.sequence_number);
            assert_eq!(record["Offset"], event.offset.to_string());
            assert_eq!(
                record["EnqueuedTimeUtc"],
                enqueued_time_utc(event.enqueued_time_ms)
            );
            assert_eq!(record["Body"], json!(event.data.body.to_vec()));
            assert_eq!(
                record["SystemProperties"]["x-opt-enqueued-time"],
                event.enqueued_time_ms
            );
        }
        assert_eq!(
            records[0]["SystemProperties"]["x-opt-partition-key"],
            "device-7"
        );
        assert_eq!(
            records[0]["Properties"],
            json!({"n": -3, "x": 0.25, "s": "tributary", "b": [0, 1], "z": null})
        );
        assert_eq!(records[1]["Properties"], json!({}));
        assert!(
            records[1]["SystemProperties"]
                .get("x-opt-partition-key")
                .is_none()
        );
    }
}

fn assert_azures_schema(schema: &Value) {
    assert_eq!(schema["type"], "record");
    assert_eq!(schema["name"], "Microsoft.ServiceBus.Messaging.EventData");
    let fields: Vec<Value> = schema["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| json!([f["name"], f["type"]]))
        .collect();
    assert_eq!(
        fields,
        [
            json!(["SequenceNumber", "long"]),
            json!(["Offset", "string"]),
            json!(["EnqueuedTimeUtc", "string"]),
            json!(["SystemProperties", {"type": "map", "values": ["long", "double", "string", "bytes"]}]),
            json!(["Properties", {"type": "map", "values": ["long", "double", "string", "bytes", "null"]}]),
            json!(["Body", ["null", "bytes"]]),
        ]
    );
}
