//! `kill -9` at any moment: a worker process (this test binary, run again with
//! `TRIBUTARY_CAPTURE_WORKER` set) sends events and captures them, a window a step; the test
//! kills it with SIGKILL after a random delay, again and again, then lets one run finish. Every
//! event the hub holds must be in exactly one file, and no temporary file may be left.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::{HUB, NAMESPACE, avro_files, captured_sequences};
use tributary_broker::{Broker, BrokerConfig, Durability, HubSpec};
use tributary_capture::{
    CaptureConfig, CaptureTarget, Destination, DirectoryDestination, PartitionCapture,
};
use tributary_event::{EventData, EventPosition, ManualClock};

const WORKER_ENV: &str = "TRIBUTARY_CAPTURE_WORKER";
/// How many events the hub ends with.
const EVENTS: i64 = 1500;

fn broker_config(dir: &Path) -> BrokerConfig {
    let mut config = BrokerConfig::new(dir.join("data"));
    config.log.durability = Durability::None;
    config
}

/// The worker: sends a few events, steps the capture, moves its clock past the window, until
/// the hub holds [`EVENTS`] events and all are captured. Does nothing unless run as a worker.
#[test]
fn worker() {
    let Some(dir) = std::env::var_os(WORKER_ENV) else {
        return;
    };
    let dir = Path::new(&dir);
    let clock_start_ms: i64 = std::env::var("CLOCK_START_MS").unwrap().parse().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let clock = Arc::new(ManualClock::new(clock_start_ms));
        let broker = Broker::open_with_clock(broker_config(dir), clock.clone())
            .await
            .unwrap();
        let destination: Arc<dyn Destination> =
            Arc::new(DirectoryDestination::new(dir.join("capture")).unwrap());
        let target = CaptureTarget {
            namespace: NAMESPACE.to_owned(),
            hub: HUB.to_owned(),
            partition: "0".to_owned(),
        };
        let config = CaptureConfig {
            interval: Duration::from_secs(60),
            ..CaptureConfig::default()
        };
        let mut capture = PartitionCapture::new(
            broker.clone(),
            destination,
            clock.clone(),
            config,
            target,
            &dir.join("state"),
            EventPosition::Earliest,
        )
        .unwrap();
        loop {
            let held = broker
                .partition_properties(HUB, "0")
                .unwrap()
                .last_enqueued_sequence_number
                + 1;
            if held < EVENTS {
                let n = (EVENTS - held).min(1 + held % 4);
                let batch: Vec<EventData> = (held..held + n)
                    .map(|s| EventData::new(format!("event {s}")))
                    .collect();
                broker
                    .send_to_partition_keyed(HUB, "0", &batch)
                    .await
                    .unwrap();
            }
            capture.step().unwrap();
            clock.advance_ms(61_000);
            if held >= EVENTS && capture.progress().unwrap().next_sequence == EVENTS {
                return;
            }
        }
    });
}

/// Runs the worker; kills it with SIGKILL after `kill_after` unless it is `None`. Whether the
/// worker finished by itself.
fn run_worker(dir: &Path, attempt: i64, kill_after: Option<Duration>) -> bool {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "worker", "--nocapture", "--test-threads=1"])
        .env(WORKER_ENV, dir)
        // Each run's clock starts a day after the last's, so windows keep moving forward.
        .env(
            "CLOCK_START_MS",
            (common::T0_MS + attempt * 86_400_000).to_string(),
        )
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    if let Some(delay) = kill_after {
        std::thread::sleep(delay);
        let _ = child.kill();
    }
    child.wait().unwrap().success()
}

#[tokio::test]
async fn after_kill_9_at_any_moment_every_event_is_in_exactly_one_file() {
    let dir = tempfile::tempdir().unwrap();
    {
        let broker = Broker::open(broker_config(dir.path())).await.unwrap();
        broker.create_hub(HubSpec::new(HUB, 1)).await.unwrap();
        broker.shutdown().await.unwrap();
    }
    let mut seed: u64 = 0x5eed;
    let mut killed = 0;
    for attempt in 0..30 {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let delay = Duration::from_millis(20 + (seed >> 33) % 150);
        if run_worker(dir.path(), attempt, Some(delay)) {
            break;
        }
        killed += 1;
    }
    assert!(run_worker(dir.path(), 100, None), "the last run finishes");
    assert!(killed > 0, "no run was killed");
    eprintln!("{killed} runs killed");

    let files = avro_files(&dir.path().join("capture"));
    eprintln!("{} files", files.len());
    assert!(
        files.keys().all(|n| n.ends_with(".avro")),
        "leftovers: {files:?}"
    );
    let mut captured = captured_sequences(&dir.path().join("capture"));
    captured.sort_unstable();
    assert_eq!(
        captured,
        (0..EVENTS).collect::<Vec<_>>(),
        "{killed} runs killed"
    );
}
