//! Interop tests with the official Python SDK (`azure-eventhub`).
//!
//! Each test starts a broker on a temporary directory and the AMQP listener on 127.0.0.1:0 (and,
//! for AMQP over WebSockets, the HTTP door carrying them), then runs `tests/python/interop.py`
//! with `<repo>/.venv/bin/python` (or `$TRIBUTARY_PYTHON`) and asserts on the JSON it prints. Install the client first with `scripts/setup-python-interop`;
//! a missing client FAILS these tests, it never skips them.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};
use tributary_event::{PropertyValue, partition_for_key};
use tributary_testkit::{
    TestHub, bodies, join_all as futures_join_all, join_in_waves, wait_for_receivers,
};

async fn run_python(command: &str, args: Value) -> Value {
    tributary_testkit::run_python("interop.py", command, args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_producer_keys_partitions_batches_and_typed_properties() {
    let f = TestHub::start(&[("orders", 4)]).await;
    let result = run_python("produce", json!({"conn": f.conn(&f.root), "hub": "orders"})).await;
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["partition_ids"], json!(["0", "1", "2", "3"]));

    let alpha = partition_for_key("alpha", 4);
    let events = f.read_all("orders", alpha).await;
    let keyed: Vec<_> = events
        .iter()
        .filter(|e| e.data.partition_key.as_deref() == Some("alpha"))
        .collect();
    let keyed_bodies: Vec<_> = keyed.iter().map(|e| e.data.body.clone()).collect();
    assert_eq!(
        keyed_bodies,
        ["key-0", "key-1", "key-2"].map(bytes::Bytes::from)
    );
    let beta = f.read_all("orders", partition_for_key("beta", 4)).await;
    assert!(
        beta.iter().any(|e| &e.data.body[..] == b"single-keyed"
            && e.data.partition_key.as_deref() == Some("beta")),
        "{:?}",
        bodies(&beta)
    );
    let p1 = bodies(&f.read_all("orders", 1).await);
    assert!(
        p1.ends_with(&["p1-a".to_owned(), "p1-b".to_owned()]) || p1.contains(&"p1-b".to_owned()),
        "{p1:?}"
    );
    let p0 = bodies(&f.read_all("orders", 0).await);
    assert!(
        p0.contains(&"list-0".to_owned()) && p0.contains(&"list-1".to_owned()),
        "{p0:?}"
    );

    let p2 = f.read_all("orders", 2).await;
    let typed = p2
        .iter()
        .find(|e| &e.data.body[..] == b"typed")
        .expect("typed event stored");
    let prop = |k: &str| typed.data.property(k).cloned();
    assert_eq!(prop("str"), Some(PropertyValue::String("text".into())));
    assert_eq!(prop("int"), Some(PropertyValue::Int32(42)));
    assert_eq!(prop("negative"), Some(PropertyValue::Int32(-7)));
    assert_eq!(prop("float"), Some(PropertyValue::Float64(2.5)));
    assert_eq!(prop("bool"), Some(PropertyValue::Bool(true)));
    assert_eq!(
        prop("bytes"),
        Some(PropertyValue::Bytes(bytes::Bytes::from_static(b"\x00\x01")))
    );
    assert!(matches!(prop("uuid"), Some(PropertyValue::Uuid(_))));
    assert_eq!(
        prop("time"),
        Some(PropertyValue::Timestamp(1_714_979_289_000))
    );
    assert_eq!(prop("none"), Some(PropertyValue::Null));
    assert_eq!(typed.data.content_type.as_deref(), Some("application/json"));
    assert_eq!(typed.data.correlation_id.as_deref(), Some("corr-1"));
    assert_eq!(typed.data.message_id.as_deref(), Some("msg-1"));

    python_gets_typed_properties_back(&f, typed.sequence_number).await;
    f.stop().await;
}

/// The properties come back to a Python consumer with their types.
async fn python_gets_typed_properties_back(f: &TestHub, sequence_number: i64) {
    let args = json!({"conn": f.conn(&f.root), "hub": "orders", "partition": 2, "position": "sequence",
                      "value": sequence_number, "inclusive": true, "count": 1});
    let consumed = run_python("consume", args).await;
    let event = &consumed["events"][0];
    assert_eq!(event["body"], "typed", "{consumed}");
    let props = &event["properties"];
    // The SDK hands string properties to the application as bytes.
    assert_eq!(props["str"], json!(["bytes", "74657874"]));
    assert_eq!(props["int"], json!(["int", 42]));
    assert_eq!(props["float"], json!(["float", 2.5]));
    assert_eq!(props["bool"], json!(["bool", true]));
    assert_eq!(props["bytes"], json!(["bytes", "0001"]));
    assert_eq!(
        props["uuid"],
        json!(["uuid", "12345678-1234-5678-1234-567812345678"])
    );
    assert_eq!(props["time"][1], json!(1_714_979_289_000i64));
    assert_eq!(props["none"], json!(["NoneType", null]));
    assert_eq!(event["content_type"], "application/json");
    assert_eq!(event["correlation_id"], "corr-1");
    assert_eq!(event["message_id"], "msg-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_reads_hub_and_partition_properties() {
    let f = TestHub::start(&[("props", 3)]).await;
    f.send("props", "1", "a").await;
    let last = f.send("props", "1", "b").await;
    let result = run_python(
        "properties",
        json!({"conn": f.conn(&f.root), "hub": "props"}),
    )
    .await;
    let hub = &result["eventhub"];
    assert_eq!(hub["eventhub_name"], "props", "{result}");
    assert_eq!(hub["partition_ids"], json!(["0", "1", "2"]));
    let created = f.broker.describe_hub("props").unwrap().created_at_ms as f64 / 1000.0;
    assert!(
        (hub["created_at"].as_f64().unwrap() - created).abs() < 0.002,
        "{result}"
    );
    let p1 = &result["partitions"][1];
    assert_eq!(p1["id"], "1");
    assert_eq!(p1["beginning_sequence_number"], 0);
    assert_eq!(p1["last_enqueued_sequence_number"], 1);
    assert_eq!(p1["last_enqueued_offset"], last.offsets[0].to_string());
    assert_eq!(p1["is_empty"], false);
    let t = p1["last_enqueued_time_utc"].as_f64().unwrap();
    assert!(
        (t - last.enqueued_time_ms as f64 / 1000.0).abs() < 0.002,
        "{result}"
    );
    let p0 = &result["partitions"][0];
    assert_eq!(p0["is_empty"], true);
    assert_eq!(p0["beginning_sequence_number"], 0);
    assert_eq!(p0["last_enqueued_sequence_number"], -1);
    assert_eq!(p0["last_enqueued_offset"], "-1");
    // The SDK reads a management error's description from `statusDescription`: it names what
    // is missing instead of "Description: None".
    let missing = result["missing_partition"]["error"]
        .as_str()
        .unwrap_or_default();
    assert!(
        missing.contains("404") && missing.contains("\"99\"") && !missing.contains("None"),
        "{result}"
    );
    f.stop().await;
}

fn sequence_numbers(result: &Value) -> Vec<i64> {
    result["events"]
        .as_array()
        .unwrap_or_else(|| panic!("{result}"))
        .iter()
        .map(|e| e["sequence_number"].as_i64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_consumes_from_every_start_position() {
    let f = TestHub::start(&[("positions", 1)]).await;
    let mut receipts = Vec::new();
    for i in 0..5 {
        receipts.push(f.send("positions", "0", &format!("e{i}")).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let conn = f.conn(&f.listen);
    let at = |position: &str, value: Value, inclusive: bool, count: usize| {
        json!({"conn": conn, "hub": "positions", "partition": 0, "position": position,
               "value": value, "inclusive": inclusive, "count": count, "timeout": 20})
    };
    let offset1 = json!(receipts[1].offsets[0]);
    let time3 = json!(receipts[3].enqueued_time_ms);
    let cases = [
        (at("earliest", Value::Null, false, 5), vec![0, 1, 2, 3, 4]),
        (at("offset", offset1.clone(), false, 3), vec![2, 3, 4]),
        (at("offset", offset1, true, 4), vec![1, 2, 3, 4]),
        (at("sequence", json!(2), false, 2), vec![3, 4]),
        (at("sequence", json!(2), true, 3), vec![2, 3, 4]),
    ];
    let results = join_in_waves(cases.iter().map(|(args, _)| args.clone()), |args| {
        run_python("consume", args)
    })
    .await;
    for ((args, expected), result) in cases.iter().zip(&results) {
        assert_eq!(&sequence_numbers(result), expected, "{args} -> {result}");
        assert_eq!(result["errors"], json!([]), "{result}");
    }
    let first = &results[0]["events"][0];
    assert_eq!(first["offset"], receipts[0].offsets[0].to_string());
    assert_eq!(first["enqueued_ms"], receipts[0].enqueued_time_ms);
    assert_eq!(first["body"], "e0");
    let last = &results[0]["last_enqueued"];
    assert_eq!(last["sequence_number"], 4, "{last}");
    assert_eq!(last["offset"], receipts[4].offsets[0].to_string());

    let time_cases = [
        (at("time", time3.clone(), false, 1), vec![4]),
        (at("time", time3, true, 2), vec![3, 4]),
    ];
    let results = join_in_waves(time_cases.iter().map(|(args, _)| args.clone()), |args| {
        run_python("consume", args)
    })
    .await;
    for ((args, expected), result) in time_cases.iter().zip(results) {
        assert_eq!(&sequence_numbers(&result), expected, "{args} -> {result}");
    }

    // Latest: only what is sent after the receiver opened.
    let latest = tokio::spawn(run_python("consume", at("latest", Value::Null, false, 2)));
    wait_for_receivers(&f.broker, "positions", 1).await;
    f.send("positions", "0", "after-1").await;
    f.send("positions", "0", "after-2").await;
    let result = latest.await.unwrap();
    assert_eq!(sequence_numbers(&result), vec![5, 6], "{result}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_owner_level_receiver_steals_from_a_lower_one() {
    let f = TestHub::start(&[("epochs", 1)]).await;
    f.send("epochs", "0", "first").await;
    let result = run_python(
        "steal",
        json!({"conn": f.conn(&f.root), "hub": "epochs", "partition": 0}),
    )
    .await;
    assert_eq!(result["stolen"], true, "{result}");
    assert_eq!(result["high_received"], true, "{result}");
    let error = result["low"]["errors"][0].to_string();
    assert!(
        error.contains("stolen") || error.contains("higher epoch"),
        "{error}"
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sixth_non_epoch_receiver_is_refused() {
    let f = TestHub::start(&[("crowd", 1)]).await;
    f.send("crowd", "0", "first").await;
    let result = run_python(
        "sixth",
        json!({"conn": f.conn(&f.root), "hub": "crowd", "partition": 0}),
    )
    .await;
    assert_eq!(result["five_ready"], true, "{result}");
    assert_eq!(result["five_errors"], json!([]), "{result}");
    assert_eq!(result["sixth_refused"], true, "{result}");
    let error = result["sixth"]["errors"][0].to_string();
    assert!(
        error.contains("resource-limit-exceeded")
            || error.contains("maximum number of allowed receivers"),
        "{error}"
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_bad_credentials_are_refused() {
    let f = TestHub::start(&[("secure", 2)]).await;
    let mut wrong = f.root.clone();
    wrong.key = "not-the-key".into();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let expired = tributary_eventhubs::sas::sign(
        "sb://127.0.0.1/secure",
        &f.root.name,
        &f.root.key,
        now - 60,
    );
    let expired_conn = format!(
        "Endpoint=sb://127.0.0.1:{};SharedAccessSignature={expired};UseDevelopmentEmulator=true",
        f.port()
    );
    let send = |conn: String| run_python("send-expect", json!({"conn": conn, "hub": "secure"}));
    let runs = [
        send(f.conn(&wrong)),
        send(expired_conn),
        send(f.conn(&f.listen)),
        run_python(
            "properties-expect",
            json!({"conn": f.conn(&f.send), "hub": "secure"}),
        ),
        send(f.conn(&f.send)),
    ];
    let results = futures_join_all(runs.into_iter()).await;
    for (name, result) in ["wrong key", "expired token", "listen-only"]
        .iter()
        .zip(&results)
    {
        assert_eq!(result["sent"], false, "{name}: {result}");
        let text = result.to_string().to_lowercase();
        assert!(
            text.contains("unauthorized")
                || text.contains("authentication")
                || text.contains("401"),
            "{name}: {result}"
        );
    }
    assert!(
        results[2].to_string().contains("'Send' claim"),
        "{}",
        results[2]
    );
    assert_eq!(
        results[3]["ok"], true,
        "a send-only policy reads properties: {}",
        results[3]
    );
    assert_eq!(
        results[4]["sent"], true,
        "a send-only policy sends: {}",
        results[4]
    );
    let stored = f.read_all("secure", 0).await;
    assert_eq!(
        bodies(&stored),
        ["should-not-arrive"],
        "only the authorized send arrived"
    );
    f.stop().await;
}

/// A hub that does not exist is refused as Event Hubs refuses it, at the token for it
/// (`$cbs` answers 404 "The messaging entity … could not be found"): `create_batch` raises a
/// `ConnectError` (at its first try when retries are off) and a consumer's `on_error` gets an
/// `AuthenticationError`, as
/// azure-eventhub's live test `test_client_invalid_credential` expects of the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_raises_connect_error_for_a_hub_that_does_not_exist() {
    let f = TestHub::start(&[("real", 1)]).await;
    let fake = json!({"conn": f.conn(&f.root), "hub": "fakehub", "count": 1, "timeout": 8,
                      "position": "earliest"});
    let mut once = fake.clone();
    once["retry_total"] = json!(0);
    let (created, created_once, consumed) = tokio::join!(
        run_python("create-batch", fake),
        run_python("create-batch", once.clone()),
        run_python("consume", once)
    );
    assert_eq!(created["created"], false, "{created}");
    assert_eq!(created["connect_error"], true, "{created}");
    let error = created["error"].as_str().unwrap();
    assert!(
        error.contains("404") && error.contains("'sb://") && error.contains("fakehub"),
        "{created}"
    );
    // The SDK retries a refused token (0.8 s, 1.6 s, 3.2 s … apart); without retries the
    // refusal is the first answer.
    assert_eq!(created_once["connect_error"], true, "{created_once}");
    let elapsed = created_once["elapsed_s"].as_f64().unwrap();
    assert!(elapsed < 3.0, "raised after {elapsed} s: {created_once}");
    assert_eq!(
        consumed["errors"][0]["error_type"], "AuthenticationError",
        "{consumed}"
    );
    // A hub that exists opens as before.
    let real = run_python(
        "create-batch",
        json!({"conn": f.conn(&f.root), "hub": "real"}),
    )
    .await;
    assert_eq!(real["created"], true, "{real}");
    f.stop().await;
}

/// A refusal reaches the SDK as a raised error within its send timeout, and stores nothing: an
/// event over the hub's size limit, a partition key that is not a string, a policy without the
/// `Send` claim. (azure-eventhub 5.15.1 hung in `send_batch` when a rejection's error had two
/// fields instead of three.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_raises_every_refusal_within_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let f = TestHub::start_in(
        dir,
        &[("strict", 2)],
        |config| config.log.event_bytes_max = 64 * 1024,
        None,
    )
    .await;
    let refused = |conn: String, kind: &str, extra: Value| {
        let mut args = json!({"conn": conn, "hub": "strict", "kind": kind, "timeout": 20});
        args.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        run_python("send-refused", args)
    };
    let runs = [
        refused(
            f.conn(&f.root),
            "oversize",
            json!({"bytes": 200_000, "partition": "0"}),
        ),
        refused(f.conn(&f.root), "non-string-key", json!({})),
        refused(
            f.conn(&f.listen),
            "oversize",
            json!({"bytes": 10, "partition": "1"}),
        ),
    ];
    let results = futures_join_all(runs.into_iter()).await;
    let expected = [
        ("oversize", "LinkMessageSizeExceeded"),
        ("non-string-key", "must be a string"),
        ("unauthorized", "'Send' claim"),
    ];
    for ((name, text), result) in expected.iter().zip(&results) {
        assert_eq!(result["sent"], false, "{name}: {result}");
        let elapsed = result["elapsed_s"].as_f64().unwrap();
        assert!(elapsed < 20.0, "{name} took {elapsed} s: {result}");
        let error = result["error"].as_str().unwrap().to_lowercase();
        assert!(error.contains(&text.to_lowercase()), "{name}: {result}");
        assert!(
            result["error_type"].as_str().unwrap().ends_with("Error"),
            "{name}: {result}"
        );
    }
    for partition in 0..2 {
        assert_eq!(f.read_all("strict", partition).await.len(), 0);
    }
    f.stop().await;
}

/// pyamqp writes a message's delivery-annotations section after its body; the service takes
/// such a message, keeps everything, and delivers the sender's delivery annotations back (the
/// SDK's live test `test_send_amqp_annotated_message`), beside the runtime-metric ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_annotated_message_with_delivery_annotations_is_stored() {
    let f = TestHub::start(&[("annotated", 1)]).await;
    let result = run_python(
        "send-delivery-annotations",
        json!({"conn": f.conn(&f.root), "hub": "annotated", "timeout": 20}),
    )
    .await;
    assert_eq!(result["sent"], true, "{result}");
    let stored = f.read_all("annotated", 0).await;
    assert_eq!(bodies(&stored), ["annotated"]);
    assert_eq!(
        stored[0].data.property("source"),
        Some(&PropertyValue::String("pyamqp".into()))
    );
    let consume = json!({"conn": f.conn(&f.root), "hub": "annotated", "partition": 0,
                         "position": "earliest", "count": 1});
    let consumed = run_python("consume", consume).await;
    let delivered = &consumed["events"][0]["delivery_annotations"];
    assert_eq!(
        delivered["delann_key"],
        json!(["str", "delann_value"]),
        "{consumed}"
    );
    assert!(
        delivered.get("last_enqueued_sequence_number").is_some(),
        "the runtime metric the consumer asked for is there too: {consumed}"
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_low_level_receiver_without_a_filter_starts_at_the_beginning() {
    let f = TestHub::start(&[("early", 2)]).await;
    for body in ["first", "second", "third"] {
        f.send("early", "1", body).await;
    }
    let result = run_python(
        "low-level-receive",
        json!({"conn": f.conn(&f.root), "hub": "early", "partition": 1, "count": 3}),
    )
    .await;
    assert_eq!(
        result["bodies"],
        json!(["first", "second", "third"]),
        "{result}"
    );
    f.stop().await;
}

/// A tmpfs of a few MiB mounted on a fresh directory, unmounted when dropped: a disk that fills
/// up for real. Mounting needs root, which the test machines and CI run as.
struct SmallDisk {
    mount_point: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(mebibytes: u32) -> SmallDisk {
        let mount_point = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mebibytes}m"), "tmpfs"])
            .arg(mount_point.path())
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a tmpfs (needs root) failed: {status}"
        );
        SmallDisk { mount_point }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.mount_point.path())
            .status();
    }
}

/// What the server logs at `warn` and above while this test binary runs (installed once, for
/// every test; the tests that read it look for their own lines).
fn warnings() -> Arc<Mutex<Vec<u8>>> {
    static CAPTURED: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    CAPTURED
        .get_or_init(|| {
            let captured = Arc::new(Mutex::new(Vec::new()));
            let sink = captured.clone();
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::WARN)
                .with_ansi(false)
                .with_writer(move || Capture(sink.clone()))
                .init();
            captured
        })
        .clone()
}

/// A writer into a shared buffer.
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A full disk refuses the send that does not fit: the SDK raises within its timeout, every
/// acknowledged batch is stored whole, nothing of the refused one, and the server says why at
/// `warn`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_raises_when_the_disk_is_full() {
    let warned = warnings();
    let disk = SmallDisk::mount(8);
    let dir = tempfile::tempdir_in(disk.mount_point.path()).unwrap();
    let f = TestHub::start_in(dir, &[("full", 1)], |_| {}, None).await;
    let (events, bytes) = (8, 16_000);
    let result = run_python(
        "send-until-refused",
        json!({"conn": f.conn(&f.root), "hub": "full", "events": events, "bytes": bytes,
               "batches_max": 200, "timeout": 20}),
    )
    .await;
    assert_eq!(result["refused"], true, "{result}");
    assert!(result["elapsed_s"].as_f64().unwrap() < 20.0, "{result}");
    let acknowledged = result["acknowledged"].as_u64().unwrap();
    assert!(acknowledged > 0, "{result}");
    let stored = f.read_all("full", 0).await;
    assert_eq!(stored.len() as u64, acknowledged * events, "{result}");
    for (i, event) in stored.iter().enumerate() {
        assert_eq!(&event.data.body[..8], format!("{i:08}").as_bytes());
    }
    let logged = String::from_utf8_lossy(&warned.lock().unwrap()).into_owned();
    assert!(
        logged.contains("an append failed") && logged.contains("No space left on device"),
        "{logged}"
    );
    f.stop().await;
    drop(disk);
}

/// AMQPS, as the SDK speaks it without `UseDevelopmentEmulator`: a producer and a consumer that
/// trust the development authority (`connection_verify`) send and receive; one that trusts
/// another authority is refused, and nothing it sent arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_over_amqps_trusts_our_authority_and_no_other() {
    let certificates = tempfile::tempdir().unwrap();
    let hosts = ["localhost".to_owned(), "127.0.0.1".to_owned()];
    let ours = tributary_tls::write_development_certificates(certificates.path(), &hosts).unwrap();
    let other = tempfile::tempdir().unwrap();
    let theirs = tributary_tls::write_development_certificates(other.path(), &hosts).unwrap();
    let tls =
        tributary_tls::ServerTls::from_pem_files(&ours.server_cert, &ours.server_key).unwrap();
    let f = TestHub::start_in(
        tempfile::tempdir().unwrap(),
        &[("secure", 2)],
        |_| {},
        Some(tls),
    )
    .await;
    // The SDK's own form: the namespace host in the connection string, the port (not 5671
    // in a test) in `custom_endpoint_address`.
    let conn = format!(
        "Endpoint=sb://localhost/;SharedAccessKeyName={};SharedAccessKey={}",
        f.root.name, f.root.key
    );
    let endpoint = format!("sb://localhost:{}", f.port());
    let verify = |ca: &std::path::Path| ca.to_str().unwrap().to_owned();
    let sent = run_python(
        "send-expect",
        json!({"conn": conn, "hub": "secure", "endpoint": endpoint, "verify": verify(&ours.ca_cert)}),
    )
    .await;
    assert_eq!(sent["sent"], true, "{sent}");
    let consumed = run_python(
        "consume",
        json!({"conn": conn, "hub": "secure", "partition": 0, "position": "earliest", "count": 1,
               "endpoint": endpoint, "verify": verify(&ours.ca_cert)}),
    )
    .await;
    assert_eq!(
        consumed["events"][0]["body"], "should-not-arrive",
        "{consumed}"
    );
    let refused = run_python(
        "send-expect",
        json!({"conn": conn, "hub": "secure", "endpoint": endpoint, "verify": verify(&theirs.ca_cert)}),
    )
    .await;
    assert_eq!(refused["sent"], false, "{refused}");
    assert!(
        refused.to_string().contains("CERTIFICATE_VERIFY_FAILED"),
        "{refused}"
    );
    assert_eq!(
        bodies(&f.read_all("secure", 0).await),
        ["should-not-arrive"]
    );
    f.stop().await;
}

/// The bodies `<prefix>-0` … `<prefix>-<count - 1>`.
fn numbered(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}-{i}")).collect()
}

/// AMQP over WebSockets through the HTTP door (`TransportType.AmqpOverWebsocket`) over plain
/// HTTP, as the SDK speaks it with `UseDevelopmentEmulator=true` (`ws://`): a batch goes in and
/// comes back out; a wrong key is refused by the AMQP door's CBS exactly as over TCP — raised
/// promptly, not hung — and nothing it sent is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_over_websockets_sends_and_receives_and_a_wrong_key_is_refused() {
    let f = TestHub::start(&[("carried", 2)])
        .await
        .with_websockets(None)
        .await;
    let endpoint = format!("sb://127.0.0.1:{}", f.http_port());
    let sent = run_python(
        "send-batch",
        json!({"conn": f.conn(&f.send), "hub": "carried", "endpoint": endpoint,
               "websocket": true, "count": 5, "prefix": "ws"}),
    )
    .await;
    assert_eq!(sent["sent"], true, "{sent}");
    assert_eq!(bodies(&f.read_all("carried", 0).await), numbered("ws", 5));
    let consumed = run_python(
        "consume",
        json!({"conn": f.conn(&f.listen), "hub": "carried", "partition": 0,
               "position": "earliest", "count": 5, "endpoint": endpoint, "websocket": true}),
    )
    .await;
    let got: Vec<_> = consumed["events"]
        .as_array()
        .unwrap_or_else(|| panic!("{consumed}"))
        .iter()
        .map(|e| e["body"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(got, numbered("ws", 5), "{consumed}");

    let mut wrong = f.root.clone();
    wrong.key = "not-the-key".into();
    let started = std::time::Instant::now();
    let refused = run_python(
        "send-batch",
        json!({"conn": f.conn(&wrong), "hub": "carried", "endpoint": endpoint,
               "websocket": true, "count": 1, "prefix": "wrong", "timeout": 20}),
    )
    .await;
    assert_eq!(refused["sent"], false, "{refused}");
    let text = refused.to_string().to_lowercase();
    assert!(
        text.contains("unauthorized") || text.contains("authentication"),
        "{refused}"
    );
    assert!(started.elapsed() < Duration::from_secs(60), "{refused}");
    assert_eq!(f.read_all("carried", 0).await.len(), 5);
    f.stop().await;
}

/// AMQP over secure WebSockets (`wss://`, the SDK's form without `UseDevelopmentEmulator`)
/// through the HTTPS door: a client trusting the development authority (`connection_verify`)
/// sends a batch and receives it; one trusting another authority is refused; the path with a
/// trailing slash is served as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_over_secure_websockets_trusts_our_authority_and_no_other() {
    let certificates = tempfile::tempdir().unwrap();
    let hosts = ["localhost".to_owned(), "127.0.0.1".to_owned()];
    let ours = tributary_tls::write_development_certificates(certificates.path(), &hosts).unwrap();
    let other = tempfile::tempdir().unwrap();
    let theirs = tributary_tls::write_development_certificates(other.path(), &hosts).unwrap();
    let tls =
        tributary_tls::ServerTls::from_pem_files(&ours.server_cert, &ours.server_key).unwrap();
    let f = TestHub::start(&[("wss", 1)])
        .await
        .with_websockets(Some(tls))
        .await;
    let conn = format!(
        "Endpoint=sb://localhost/;SharedAccessKeyName={};SharedAccessKey={}",
        f.root.name, f.root.key
    );
    let endpoint = format!("sb://localhost:{}", f.http_port());
    let args = |verify: &std::path::Path, extra: Value| {
        let mut args = json!({"conn": conn, "hub": "wss", "endpoint": endpoint, "websocket": true,
                              "verify": verify.to_str().unwrap()});
        args.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        args
    };
    let batch = json!({"count": 3, "prefix": "secure"});
    let sent = run_python("send-batch", args(&ours.ca_cert, batch.clone())).await;
    assert_eq!(sent["sent"], true, "{sent}");
    let consume = json!({"partition": 0, "position": "earliest", "count": 3});
    let consumed = run_python("consume", args(&ours.ca_cert, consume)).await;
    let got: Vec<_> = consumed["events"]
        .as_array()
        .unwrap_or_else(|| panic!("{consumed}"))
        .iter()
        .map(|e| e["body"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(got, numbered("secure", 3), "{consumed}");
    let refused = run_python("send-batch", args(&theirs.ca_cert, batch)).await;
    assert_eq!(refused["sent"], false, "{refused}");
    assert!(
        refused.to_string().contains("CERTIFICATE_VERIFY_FAILED"),
        "{refused}"
    );
    assert_eq!(bodies(&f.read_all("wss", 0).await), numbered("secure", 3));
    // The path with a trailing slash, as pyamqp's own tests open it, is served over HTTPS too.
    let url = format!("wss://localhost:{}/$servicebus/websocket/", f.http_port());
    let verify = ours.ca_cert.to_str().unwrap();
    let opened = run_python("websocket-header", json!({"url": url, "verify": verify})).await;
    assert_eq!(opened["connected"], true, "{opened}");
    assert_eq!(
        opened["answer"],
        hex_of(b"AMQP\x03\x01\x00\x00"),
        "{opened}"
    );
    f.stop().await;
}

/// Bytes as lowercase hexadecimal, as Python's `bytes.hex()` writes them.
fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
