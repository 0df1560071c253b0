//! The capture engine end to end: a hub's events captured to Avro files, read back with
//! apache-avro and compared with what the hub holds.

mod common;

use std::time::Duration;

use apache_avro::types::Value;
use bytes::Bytes;
use common::{
    Fixture, HUB, NAMESPACE, T0_MS, avro_files, body, captured_sequences, long, map, read_records,
    string,
};
use tributary_capture::time_text::enqueued_time_utc;
use tributary_capture::{ArchiveNameFormat, CaptureConfig, CaptureFormat};
use tributary_event::{EventData, PropertyValue};

fn typed_event(i: u32) -> EventData {
    let mut event = EventData::new(format!("body-{i}"))
        .with_property("int", PropertyValue::Int32(-7))
        .with_property("long", PropertyValue::Int64(i64::from(i) * 1_000_000_000))
        .with_property("double", PropertyValue::Float64(2.5))
        .with_property("text", PropertyValue::String("héllo".into()))
        .with_property(
            "raw",
            PropertyValue::Bytes(Bytes::from_static(&[0, 1, 255])),
        )
        .with_property("nothing", PropertyValue::Null)
        .with_property("flag", PropertyValue::Bool(true));
    event.partition_key = i.is_multiple_of(2).then(|| format!("key-{i}"));
    event.content_type = Some("application/json".into());
    event
}

#[tokio::test]
async fn every_event_comes_back_from_the_file_as_the_hub_holds_it() {
    for format in [CaptureFormat::Avro, CaptureFormat::AvroDeflate] {
        let f = Fixture::start(2).await;
        f.send("1", (0..5).map(typed_event).collect()).await;
        f.advance_secs(1);
        f.send("1", (5..8).map(typed_event).collect()).await;
        let config = CaptureConfig {
            format,
            ..CaptureConfig::default()
        };
        let mut capture = f.capture(config, "1");
        assert!(
            capture.step().unwrap().is_empty(),
            "the window is still open"
        );
        f.advance_secs(300);
        let created = capture.step().unwrap();
        assert_eq!(created.len(), 1);

        let files = avro_files(&f.files_root());
        // The capture started (its first window opened) one second after the first events.
        let name = "ns/orders/1/2023/09/15/14/42/32.avro";
        assert_eq!(files.keys().collect::<Vec<_>>(), [name]);
        let raw = std::fs::read(&files[name]).unwrap();
        let codec: &[u8] = match format {
            CaptureFormat::Avro => b"null",
            CaptureFormat::AvroDeflate => b"deflate",
            other => panic!("{other:?} is not an Avro format"),
        };
        assert!(
            raw.windows(codec.len()).any(|w| w == codec),
            "codec {format:?}"
        );

        let records = read_records(&files[name]);
        let held = f.hub_events("1");
        assert_eq!(records.len(), held.len());
        for (record, event) in records.iter().zip(&held) {
            assert_record_is_event(record, event);
        }
        let data = &created[0];
        assert_eq!(data.event_count, 8);
        assert_eq!(
            (data.first_sequence_number, data.last_sequence_number),
            (0, 7)
        );
        assert_eq!(data.size_in_bytes, raw.len() as u64);
        assert_eq!(data.partition_id, "1");
        assert_eq!(data.first_enqueue_time, "2023-09-15T14:42:31.000Z");
        assert_eq!(data.last_enqueue_time, "2023-09-15T14:42:32.000Z");
        assert!(data.file_url.starts_with("file://") && data.file_url.ends_with(name));
        assert!(
            avro_files(&f.files_root())
                .keys()
                .all(|n| !n.contains("/0/"))
        );
    }
}

fn assert_record_is_event(
    record: &std::collections::BTreeMap<String, Value>,
    event: &tributary_event::ReceivedEvent,
) {
    assert_eq!(long(record, "SequenceNumber"), event.sequence_number);
    assert_eq!(string(record, "Offset"), event.offset.to_string());
    assert_eq!(
        string(record, "EnqueuedTimeUtc"),
        enqueued_time_utc(event.enqueued_time_ms)
    );
    assert_eq!(body(record), event.data.body.to_vec());
    let system = map(record, "SystemProperties");
    assert_eq!(
        system["x-opt-enqueued-time"],
        Value::Long(event.enqueued_time_ms)
    );
    assert_eq!(
        system.get("x-opt-partition-key"),
        event.data.partition_key.clone().map(Value::String).as_ref()
    );
    assert_eq!(
        system["content-type"],
        Value::String("application/json".into())
    );
    let properties = map(record, "Properties");
    assert_eq!(properties.len(), event.data.properties.len());
    for (key, value) in &event.data.properties {
        let expected = match value {
            PropertyValue::Int32(v) => Value::Long(i64::from(*v)),
            PropertyValue::Int64(v) => Value::Long(*v),
            PropertyValue::Float64(v) => Value::Double(*v),
            PropertyValue::String(s) => Value::String(s.to_string()),
            PropertyValue::Bytes(b) => Value::Bytes(b.to_vec()),
            PropertyValue::Null => Value::Null,
            PropertyValue::Bool(b) => Value::String(if *b { "True" } else { "False" }.into()),
            other => panic!("not sent: {other:?}"),
        };
        assert_eq!(properties[key.as_str()], expected, "property {key}");
    }
}

#[tokio::test]
async fn windows_close_by_time_and_each_file_is_named_for_its_start() {
    let f = Fixture::start(1).await;
    let config = CaptureConfig {
        interval: Duration::from_secs(60),
        ..CaptureConfig::default()
    };
    let mut capture = f.capture(config, "0");
    f.send("0", vec![EventData::new("a"), EventData::new("b")])
        .await;
    capture.step().unwrap();
    f.advance_secs(30);
    f.send("0", vec![EventData::new("c")]).await;
    assert!(capture.step().unwrap().is_empty());
    f.advance_secs(30);
    assert_eq!(capture.step().unwrap().len(), 1, "60 s after it opened");
    f.send("0", vec![EventData::new("d")]).await;
    f.advance_secs(59);
    assert!(capture.step().unwrap().is_empty());
    f.advance_secs(1);
    assert_eq!(capture.step().unwrap().len(), 1);

    let files = avro_files(&f.files_root());
    let names: Vec<&String> = files.keys().collect();
    assert_eq!(
        names,
        [
            "ns/orders/0/2023/09/15/14/42/31.avro",
            "ns/orders/0/2023/09/15/14/43/31.avro"
        ]
    );
    let bodies =
        |name: &str| -> Vec<Vec<u8>> { read_records(&files[name]).iter().map(body).collect() };
    assert_eq!(
        bodies(names[0]),
        [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]
    );
    assert_eq!(bodies(names[1]), [b"d".to_vec()]);
}

#[tokio::test]
async fn a_window_closes_once_its_events_reach_the_size_window() {
    let f = Fixture::start(1).await;
    let config = CaptureConfig {
        size_bytes_max: 10 * 1024 * 1024,
        ..CaptureConfig::default()
    };
    let mut capture = f.capture(config, "0");
    let body = vec![7_u8; 512 * 1024];
    for _ in 0..5 {
        f.send("0", (0..10).map(|_| EventData::new(body.clone())).collect())
            .await;
    }
    let created = capture.step().unwrap();
    let counts: Vec<u64> = created.iter().map(|c| c.event_count).collect();
    assert_eq!(counts, [20, 20], "20 events of 512 KiB reach 10 MiB");
    // The third window opened two seconds on (names one second apart), so it closes at 302 s.
    f.advance_secs(301);
    assert!(capture.step().unwrap().is_empty());
    f.advance_secs(1);
    let last = capture.step().unwrap();
    assert_eq!(last.iter().map(|c| c.event_count).collect::<Vec<_>>(), [10]);

    // Windows closed within one second still get names of their own, one second apart.
    let names: Vec<String> = avro_files(&f.files_root()).into_keys().collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(
        captured_sequences(&f.files_root()),
        (0..50).collect::<Vec<_>>()
    );
}

/// A partition's capture keeps its read buffers while events come, and gives them back at the
/// first step that finds nothing new: a hub's quiet partitions hold no read memory.
#[tokio::test]
async fn a_quiet_partition_s_capture_holds_no_read_buffers() {
    let f = Fixture::start(1).await;
    let mut capture = f.capture(CaptureConfig::default(), "0");
    assert!(capture.step().unwrap().is_empty());
    assert!(!capture.holds_read_buffers());
    f.send("0", (0..10).map(typed_event).collect()).await;
    capture.step().unwrap();
    assert_eq!(capture.read_next(), 10);
    assert!(capture.holds_read_buffers(), "it read ten events");
    f.send("0", (10..20).map(typed_event).collect()).await;
    capture.step().unwrap();
    assert!(capture.holds_read_buffers(), "it read ten more");
    capture.step().unwrap();
    assert!(!capture.holds_read_buffers(), "nothing new since");

    // It reads on from where it was, into new buffers.
    f.send("0", (20..25).map(typed_event).collect()).await;
    capture.step().unwrap();
    assert_eq!(capture.read_next(), 25);
    f.advance_secs(300);
    let files = capture.step().unwrap();
    assert_eq!(files.iter().map(|c| c.event_count).sum::<u64>(), 25);
    assert_eq!(
        captured_sequences(&f.files_root()),
        (0..25).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn an_empty_window_writes_an_empty_file_unless_skip_empty() {
    let f = Fixture::start(2).await;
    let mut writes = f.capture(CaptureConfig::default(), "0");
    let skips = f.capture(
        CaptureConfig {
            skip_empty: true,
            ..CaptureConfig::default()
        },
        "1",
    );
    let mut skips = skips;
    writes.step().unwrap();
    skips.step().unwrap();
    f.advance_secs(300);
    let created = writes.step().unwrap();
    assert!(skips.step().unwrap().is_empty());
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].event_count, 0);
    assert_eq!(created[0].first_sequence_number, -1);
    assert_eq!(created[0].first_enqueue_time, "0001-01-01T00:00:00");

    let files = avro_files(&f.files_root());
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        ["ns/orders/0/2023/09/15/14/42/31.avro"]
    );
    let path = files.values().next().unwrap();
    assert!(read_records(path).is_empty(), "a header and no records");
    assert_eq!(
        created[0].size_in_bytes,
        std::fs::metadata(path).unwrap().len()
    );

    // The skipped window moved on: an event now goes to a window named for a later time.
    f.send("1", vec![EventData::new("late")]).await;
    f.advance_secs(300);
    assert_eq!(skips.step().unwrap().len(), 1);
    assert!(avro_files(&f.files_root()).contains_key("ns/orders/1/2023/09/15/14/47/31.avro"));
}

#[tokio::test]
async fn a_custom_archive_name_format_places_the_files() {
    let f = Fixture::start(1).await;
    let config = CaptureConfig {
        archive_name_format: ArchiveNameFormat::parse(
            "capture-{EventHub}/{Year}-{Month}-{Day}/{Namespace}_{PartitionId}_{Hour}{Minute}{Second}",
        )
        .unwrap(),
        ..CaptureConfig::default()
    };
    let mut capture = f.capture(config, "0");
    f.send("0", vec![EventData::new("x")]).await;
    capture.step().unwrap();
    f.advance_secs(300);
    capture.step().unwrap();
    let files: Vec<String> = avro_files(&f.files_root()).into_keys().collect();
    assert_eq!(
        files,
        [format!(
            "capture-{HUB}/2023-09-15/{NAMESPACE}_0_144231.avro"
        )]
    );
    assert_eq!(T0_MS % 1000, 0);
}

#[tokio::test]
async fn progress_is_kept_across_restarts_and_nothing_is_written_twice() {
    let f = Fixture::start(1).await;
    f.send("0", vec![EventData::new("1"), EventData::new("2")])
        .await;
    {
        let mut capture = f.capture(CaptureConfig::default(), "0");
        capture.step().unwrap();
        f.advance_secs(300);
        capture.step().unwrap();
    }
    f.send("0", vec![EventData::new("3")]).await;
    let mut again = f.capture(CaptureConfig::default(), "0");
    again.step().unwrap();
    f.advance_secs(300);
    again.step().unwrap();
    assert_eq!(captured_sequences(&f.files_root()), [0, 1, 2]);
    assert_eq!(avro_files(&f.files_root()).len(), 2);
}

#[tokio::test]
async fn the_runner_publishes_a_window_its_size_closed_without_waiting_for_a_tick() {
    let f = Fixture::start(1).await;
    let files = f.dir.path().join("followed-files");
    std::fs::create_dir_all(&files).unwrap();
    let settings = tributary_broker::HubCapture {
        destination: format!("file:{}", files.display()),
        encoding: "Avro".to_owned(),
        interval_secs: 900,
        size_bytes_max: 10 * 1024 * 1024,
        skip_empty: true,
        archive_name_format: tributary_capture::DEFAULT_ARCHIVE_NAME_FORMAT.to_owned(),
        notify_hub: None,
        enabled_at_ms: 0,
    };
    let spec = tributary_broker::HubSpec {
        capture: Some(settings),
        ..tributary_broker::HubSpec::new("followed", 1)
    };
    f.broker.create_hub(spec).await.unwrap();
    let runner = tributary_capture::CaptureRunner::start(
        &f.broker,
        NAMESPACE,
        &f.dir.path().join("runner-state"),
        None,
    );
    // The first tick (after one) starts the partition's worker.
    tokio::time::sleep(tributary_capture::runner::TICK + Duration::from_millis(500)).await;
    let published = || {
        avro_files(&files)
            .keys()
            .filter(|name| name.ends_with(".avro"))
            .count()
    };
    // Windows of eleven events of 1,000 KiB each, closed by their size: with a step only
    // every tick (1 s), a window's file would come half a tick after its last event on
    // average; stepped as events arrive, within a few of STEP_SPACING.
    let body = Bytes::from(vec![7u8; 1000 * 1024]);
    let mut delays = Vec::new();
    for window in 0..5 {
        for _ in 0..11 {
            let event = EventData::new(body.clone());
            f.broker
                .send_to_partition_keyed("followed", "0", &[event])
                .await
                .unwrap();
        }
        let sent = std::time::Instant::now();
        while published() <= window {
            assert!(sent.elapsed() < Duration::from_secs(30), "no file");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        delays.push(sent.elapsed());
    }
    runner.stop().await;
    delays.sort();
    assert!(
        delays[2] < Duration::from_millis(300),
        "a file came {:?} after its window's last event (median; all: {delays:?})",
        delays[2]
    );
}
