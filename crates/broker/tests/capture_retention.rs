//! Retention and capture together, on a controlled clock: a captured hub's retention keeps every
//! segment holding an event its capture has not written (everything before the capture first
//! reports), and flags it; with `CaptureRetention::Proceed` it removes them and counts them.

use std::sync::Arc;

use tributary_broker::{Broker, BrokerConfig, CaptureRetention, HubCapture, HubSpec, LogConfig};
use tributary_event::{EventData, ManualClock, SendTarget};

const HOUR_MS: i64 = 3_600_000;
const EVENTS: i64 = 200;

/// A broker whose segments are sealed every 4 KiB, so the events fill many of them.
async fn broker(dir: &std::path::Path, mode: CaptureRetention) -> (Broker, Arc<ManualClock>) {
    let config = BrokerConfig {
        log: LogConfig {
            segment_bytes_max: tributary_log::limits::SEGMENT_BYTES_MAX_MIN,
            ..LogConfig::default()
        },
        capture_retention: mode,
        ..BrokerConfig::new(dir)
    };
    let clock = Arc::new(ManualClock::new(1_800_000_000_000));
    let broker = Broker::open_with_clock(config, clock.clone())
        .await
        .unwrap();
    let capture = HubCapture {
        destination: "file:/unused".into(),
        encoding: "Avro".into(),
        interval_secs: 60,
        size_bytes_max: 10 << 20,
        skip_empty: false,
        archive_name_format:
            "{Namespace}/{EventHub}/{PartitionId}/{Year}/{Month}/{Day}/{Hour}/{Minute}/{Second}"
                .into(),
        notify_hub: None,
        enabled_at_ms: 0,
    };
    let spec = HubSpec {
        retention_age_ms: Some(HOUR_MS),
        capture: Some(capture),
        ..HubSpec::new("captured", 1)
    };
    broker.create_hub(spec).await.unwrap();
    for n in 0..EVENTS {
        let event = EventData::new(format!("{n:0>200}"));
        let target = SendTarget::Partition("0".into());
        broker.send("captured", target, vec![event]).await.unwrap();
    }
    (broker, clock)
}

fn begin(broker: &Broker) -> i64 {
    broker
        .partition_properties("captured", "0")
        .unwrap()
        .begin_sequence_number
}

#[tokio::test]
async fn retention_holds_what_capture_has_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, clock) = broker(dir.path(), CaptureRetention::Hold).await;
    clock.advance_ms(2 * HOUR_MS);

    // Not reported yet: everything is kept.
    broker.enforce_retention().await.unwrap();
    assert_eq!(begin(&broker), 0);
    assert!(broker.capture_statuses("captured", 1)[0].retention_held);

    // Captured up to 120: the segments before it go, the one holding 120 stays.
    broker.report_capture("captured", 0, |s| s.captured_to = Some(120));
    broker.enforce_retention().await.unwrap();
    let kept_from = begin(&broker);
    assert!(kept_from > 0, "segments wholly captured are removed");
    assert!(kept_from <= 120, "event 120 is kept: begin {kept_from}");
    let status = &broker.capture_statuses("captured", 1)[0];
    assert!(status.retention_held);
    assert_eq!(status.uncaptured_events_removed, 0);
    assert_eq!(status.lag_events(EVENTS), EVENTS - 120);

    // Everything captured: retention removes what it is due to, the flag goes.
    broker.report_capture("captured", 0, |s| s.captured_to = Some(EVENTS));
    broker.enforce_retention().await.unwrap();
    assert!(begin(&broker) > 120);
    assert!(!broker.capture_statuses("captured", 1)[0].retention_held);
}

#[tokio::test]
async fn retention_told_to_proceed_removes_and_counts_uncaptured_events() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, clock) = broker(dir.path(), CaptureRetention::Proceed).await;
    broker.report_capture("captured", 0, |s| s.captured_to = Some(50));
    clock.advance_ms(2 * HOUR_MS);
    broker.enforce_retention().await.unwrap();
    let begin = begin(&broker);
    assert!(
        begin > 50,
        "retention proceeded past the capture: begin {begin}"
    );
    let status = &broker.capture_statuses("captured", 1)[0];
    assert_eq!(
        i64::try_from(status.uncaptured_events_removed).unwrap(),
        begin - 50,
        "every uncaptured event removed is counted"
    );
    assert!(!status.retention_held);
}
