//! Event Hubs Capture inside `tributary serve`, as a user runs it: a hub captured through the
//! CLI, events sent with the official Python SDK (azure-eventhub), `serve` killed with SIGKILL
//! again and again while it captures, the files read back with fastavro, the notifications read
//! with the SDK, a destination that cannot be written reported, then caught up; and a hub
//! captured as Parquet into an Azure Storage container (Azurite), the blobs listed and
//! downloaded with the official azure-storage-blob SDK and read with pyarrow.

mod common;

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use common::{ServeGuard, run_err, run_ok, start_serve};
use serde_json::{Value, json};

/// Events per send: about 3.8 MiB, so a 10 MiB window closes within three sends.
const EVENTS_PER_SEND: i64 = 60;
/// The padding of each event's body.
const BODY_BYTES: i64 = 64 * 1024;
/// Kill cycles.
const CYCLES: i64 = 4;

fn serve(data: &Path, more: &[&str]) -> (ServeGuard, String) {
    let mut args = vec![
        "--amqp-port",
        "0",
        "--http-port",
        "0",
        "--hub",
        "files",
        "--partitions",
        "1",
    ];
    args.extend_from_slice(more);
    let (child, _banner, stderr) = start_serve(data, &args);
    let guard = ServeGuard::new(child);
    // Drained, so that its log never fills the pipe and blocks it.
    std::thread::spawn(move || for _ in stderr {});
    let conn = run_ok(data, &["connection-string"]).trim().to_owned();
    (guard, conn)
}

fn kill_9(guard: ServeGuard) {
    let mut child: Child = guard.take();
    child.kill().unwrap();
    child.wait().unwrap();
}

async fn python(command: &str, args: Value) -> Value {
    tributary_testkit::run_python("capture.py", command, args).await
}

async fn send(conn: &str, hub: &str, start: i64, count: i64) {
    let sent = python(
        "send",
        json!({"conn": conn, "hub": hub, "partition": 0, "count": count, "bytes": BODY_BYTES, "start": start}),
    )
    .await;
    assert_eq!(sent["sent"], count, "{sent}");
}

/// The sequence number partition 0 of `hub` is captured to, as `hub show` (through the running
/// server) says, and the whole line.
fn capture_state(data: &Path, hub: &str) -> (i64, String) {
    let shown = run_ok(data, &["hub", "show", hub]);
    let line = shown
        .lines()
        .find(|l| l.starts_with("capture of partition 0:"))
        .unwrap_or_else(|| panic!("no capture state in:\n{shown}"))
        .to_owned();
    let to = line
        .split("captured to sequence number ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1);
    (to, line)
}

/// Calls `check` until it gives `Ok`, failing after `within` with the last `Err`.
fn wait_until(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Result<String, String>,
) -> String {
    let deadline = Instant::now() + within;
    loop {
        let last = match check() {
            Ok(found) => return found,
            Err(last) => last,
        };
        assert!(
            Instant::now() < deadline,
            "{what}: not within {within:?}; last: {last}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Every event the hub holds, by sequence number: (offset, enqueued time in Azure's text).
fn hub_events(data: &Path, hub: &str, count: i64) -> Vec<(String, String)> {
    let out = run_ok(
        data,
        &[
            "receive",
            hub,
            "-p",
            "0",
            "-n",
            &count.to_string(),
            "--format",
            "json",
        ],
    );
    out.lines()
        .map(|line| {
            let event: Value = serde_json::from_str(line).unwrap();
            let time = time::OffsetDateTime::parse(
                event["enqueued_time"].as_str().unwrap(),
                &time::format_description::well_known::Rfc3339,
            )
            .unwrap();
            let ms = i64::try_from(time.unix_timestamp_nanos() / 1_000_000).unwrap();
            (
                event["offset"].as_str().unwrap().to_owned(),
                tributary_capture::time_text::enqueued_time_utc(ms),
            )
        })
        .collect()
}

/// Checks that the files hold events 0..`captured_to` exactly once each, as sent and as the
/// hub holds them; returns the files.
fn check_files(files: &Value, captured_to: i64, hub: &[(String, String)]) -> Vec<Value> {
    let files = files["files"].as_array().unwrap().clone();
    let mut seen: Vec<i64> = Vec::new();
    for file in &files {
        for record in file["records"].as_array().unwrap() {
            let n = record["SequenceNumber"].as_i64().unwrap();
            seen.push(n);
            let (offset, time) = &hub[usize::try_from(n).unwrap()];
            assert_eq!(record["Offset"], *offset, "offset of {n}");
            assert_eq!(record["EnqueuedTimeUtc"], *time, "enqueued time of {n}");
            assert_eq!(
                record["Properties"],
                json!({"n": n, "tag": format!("t{}", n % 3)})
            );
            use base64::Engine;
            let body = base64::engine::general_purpose::STANDARD
                .decode(record["Body"].as_str().unwrap())
                .unwrap();
            let mut expected = format!("capture-{n}-").into_bytes();
            expected.extend(std::iter::repeat_n(
                b'x',
                usize::try_from(BODY_BYTES).unwrap(),
            ));
            assert!(body == expected, "body of {n}");
        }
    }
    let expected: Vec<i64> = (0..captured_to).collect();
    assert_eq!(seen, expected, "each captured event exactly once, in order");
    files
}

/// The notification hub `files` and the captured hub `capserve`, through the CLI on the data
/// directory; settings Azure would refuse are refused.
fn create_hubs(data: &Path, dest: &str) {
    run_ok(data, &["hub", "create", "files", "-p", "1"]);
    let refused = run_err(
        data,
        &[
            "hub",
            "create",
            "capserve",
            "--capture",
            "blob:https://account.example",
        ],
    );
    assert!(refused.contains("a container's URL"), "{refused}");
    let refused = run_err(
        data,
        &[
            "hub",
            "create",
            "capserve",
            "--capture",
            dest,
            "--capture-interval",
            "30s",
        ],
    );
    assert!(refused.contains("capture-interval"), "{refused}");
    run_ok(
        data,
        &[
            "hub",
            "create",
            "capserve",
            "-p",
            "1",
            "--capture",
            dest,
            "--capture-interval",
            "60s",
            "--capture-size",
            "10MiB",
            "--capture-notify",
            "files",
        ],
    );
}

/// Each file's notification, at least once, read with the SDK from hub `files`.
async fn check_notifications(conn: &str, files: &[Value]) {
    let notified = python(
        "consume",
        json!({"conn": conn, "hub": "files", "count": files.len()}),
    )
    .await;
    let events = notified["events"].as_array().unwrap();
    for file in files {
        let path = file["path"].as_str().unwrap();
        let count = file["records"].as_array().unwrap().len();
        let event = events
            .iter()
            .find(|e| e["data"]["fileUrl"].as_str().unwrap().ends_with(path))
            .unwrap_or_else(|| panic!("no notification of {path}: {notified}"));
        assert_eq!(event["eventType"], "Microsoft.EventHub.CaptureFileCreated");
        assert_eq!(event["data"]["eventCount"], count);
        assert_eq!(event["data"]["partitionId"], "0");
    }
    assert!(
        notified["content_types"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c == "application/json"),
        "{notified}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_captures_exactly_once_across_kill_9_notifies_and_survives_a_bad_destination() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let files_dir = dir.path().join("capture");
    let dest = format!("file:{}", files_dir.display());
    create_hubs(&data, &dest);

    // Send, and kill the server while it captures, again and again.
    let mut sent = 0;
    for cycle in 0..CYCLES {
        let (guard, conn) = serve(&data, &[]);
        send(&conn, "capserve", sent, EVENTS_PER_SEND).await;
        sent += EVENTS_PER_SEND;
        std::thread::sleep(Duration::from_millis(
            300 + 400 * u64::try_from(cycle).unwrap(),
        ));
        kill_9(guard);
    }

    let azurite = tributary_testkit::Azurite::start().await;
    let storage = azurite.connection_string();
    let (guard, conn) = serve(&data, &["--capture-storage", &storage]);
    let line = wait_until("a capture file", Duration::from_secs(30), || {
        let (to, line) = capture_state(&data, "capserve");
        if to > 0 { Ok(line) } else { Err(line) }
    });
    let (captured_to, _) = capture_state(&data, "capserve");
    assert!(line.contains("0 errors"), "{line}");
    let hub = hub_events(&data, "capserve", sent);
    assert_eq!(hub.len(), usize::try_from(sent).unwrap());
    let files = check_files(
        &python("files", json!({"dir": files_dir})).await,
        captured_to,
        &hub,
    );
    assert!(!files.is_empty());

    check_notifications(&conn, &files).await;

    bad_destination_is_reported_then_caught_up(&data, dir.path(), &conn).await;
    blob_storage_as_parquet(&data, &conn, &azurite).await;
    drop(guard);
    azurite.stop().await;
}

/// A hub captured as Parquet into a container of Azurite: every event of the closed windows
/// in exactly one blob, read back as the hub holds it.
async fn blob_storage_as_parquet(data: &Path, conn: &str, azurite: &tributary_testkit::Azurite) {
    let storage = azurite.connection_string();
    let container = json!({"connection_string": storage, "container": "lake"});
    python("blob-container", container.clone()).await;
    let dest = format!("blob:{}/lake", azurite.blob_endpoint());
    let with_key = format!("{dest}?sv=2024&sig=SECRET");
    let refused = run_err(data, &["hub", "create", "lake", "--capture", &with_key]);
    assert!(refused.contains("--capture-storage"), "{refused}");
    assert!(!refused.contains("SECRET"), "{refused}");
    let settings = [
        "--capture-format",
        "parquet",
        "--capture-interval",
        "60s",
        "--capture-size",
        "10MiB",
    ];
    let mut create = vec!["hub", "create", "lake", "-p", "1", "--capture", &dest];
    create.extend_from_slice(&settings);
    run_ok(data, &create);
    send(conn, "lake", 0, 3 * EVENTS_PER_SEND).await;
    wait_until("a Parquet blob", Duration::from_secs(40), || {
        let (to, line) = capture_state(data, "lake");
        if to > 0 { Ok(line) } else { Err(line) }
    });
    let (captured_to, _) = capture_state(data, "lake");
    let hub = hub_events(data, "lake", 3 * EVENTS_PER_SEND);
    let mut blobs = python("blobs", container).await;
    for blob in blobs["files"].as_array_mut().unwrap() {
        let name = blob["path"].as_str().unwrap();
        assert!(
            name.starts_with("tributary/lake/0/") && name.ends_with(".parquet"),
            "{name}"
        );
        for record in blob["records"].as_array_mut().unwrap() {
            let ms = record["EnqueuedTimeUtc"].as_i64().unwrap();
            record["EnqueuedTimeUtc"] = json!(tributary_capture::time_text::enqueued_time_utc(ms));
        }
    }
    assert!(!check_files(&blobs, captured_to, &hub).is_empty());
}

/// A destination that cannot be created (a file stands where its directory should be) fails
/// the capture, in status; once fixed, the capture writes every event, none skipped.
async fn bad_destination_is_reported_then_caught_up(data: &Path, dir: &Path, conn: &str) {
    let blocked = dir.join("blocked");
    std::fs::write(&blocked, b"not a directory").unwrap();
    let dest = format!("file:{}", blocked.join("files").display());
    run_ok(data, &["hub", "create", "blocked", "-p", "1"]);
    run_ok(
        data,
        &[
            "hub",
            "update",
            "blocked",
            "--capture",
            &dest,
            "--capture-interval",
            "60s",
            "--capture-size",
            "10MiB",
        ],
    );
    let failing = wait_until("the failure in status", Duration::from_secs(20), || {
        let (_, line) = capture_state(data, "blocked");
        if line.contains("failing:") {
            Ok(line)
        } else {
            Err(line)
        }
    });
    assert!(failing.contains("blocked"), "{failing}");
    send(conn, "blocked", 0, 3 * EVENTS_PER_SEND).await;
    std::fs::remove_file(&blocked).unwrap();
    let caught_up = wait_until("the capture catching up", Duration::from_secs(40), || {
        let (to, line) = capture_state(data, "blocked");
        if to > 0 && !line.contains("failing:") {
            Ok(line)
        } else {
            Err(line)
        }
    });
    let (captured_to, _) = capture_state(data, "blocked");
    let hub = hub_events(data, "blocked", 3 * EVENTS_PER_SEND);
    let files = python("files", json!({"dir": blocked.join("files")})).await;
    check_files(&files, captured_to, &hub);
    let _ = caught_up;
}
