//! Interop tests with the official JavaScript SDK (`@azure/event-hubs` 6.x, on rhea).
//!
//! Each test starts a broker on a temporary directory and the AMQP listener on 127.0.0.1:0 (and,
//! for AMQP over WebSockets, the HTTPS door carrying them), then runs `tests/js/interop.js` with
//! `node` and `NODE_PATH=<repo>/.interop/node_modules` (or `$TRIBUTARY_INTEROP_DIR/node_modules`),
//! and asserts on the JSON it prints. Install the client first with `scripts/setup-js-interop`; a missing
//! client FAILS these tests, it never skips them.

use serde_json::{Value, json};
use tributary_event::{PropertyValue, partition_for_key};
use tributary_testkit::{TestHub, bodies, run_node, run_node_with};

/// The JS SDK sends a string body as its JSON text (and parses it back on receipt).
fn js(text: &str) -> String {
    format!("\"{text}\"")
}

/// Sends by partition key, to partitions, round-robin, with typed properties, and 50 concurrent
/// sends on one link (rhea pipelines them); reads hub and partition properties.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_producer_sends_by_key_to_partitions_and_pipelined() {
    let f = TestHub::start(&[("orders", 4)]).await;
    let result = run_node("produce", json!({"conn": f.conn(&f.root), "hub": "orders"})).await;
    assert_eq!(result["ok"], true, "{result}");
    assert_eq!(result["name"], "orders");
    assert_eq!(result["partition_ids"], json!(["0", "1", "2", "3"]));
    let created = f.broker.describe_hub("orders").unwrap().created_at_ms;
    assert_eq!(result["created_ms"], json!(created));
    for p in result["partitions"].as_array().unwrap() {
        assert_eq!(p["empty"], true, "{p}");
        assert_eq!(p["last"], -1, "{p}");
        assert_eq!(p["offset"], "-1", "{p}");
    }

    stored_by_key_partition_and_round_robin(&f).await;
    stored_typed_and_pipelined(&f).await;
    f.stop().await;
}

/// The keyed, per-partition and round-robin sends of the `produce` scenario, where they belong.
async fn stored_by_key_partition_and_round_robin(f: &TestHub) {
    let alpha = f.read_all("orders", partition_for_key("alpha", 4)).await;
    let keyed: Vec<_> = alpha
        .iter()
        .filter(|e| e.data.partition_key.as_deref() == Some("alpha"))
        .map(|e| String::from_utf8_lossy(&e.data.body).into_owned())
        .collect();
    assert_eq!(keyed, ["key-0", "key-1", "key-2"].map(js));
    let beta = f.read_all("orders", partition_for_key("beta", 4)).await;
    assert!(
        beta.iter()
            .any(|e| &e.data.body[..] == js("single-keyed").as_bytes()
                && e.data.partition_key.as_deref() == Some("beta")),
        "{:?}",
        bodies(&beta)
    );
    let p1 = bodies(&f.read_all("orders", 1).await);
    let p1_sent: Vec<_> = p1.iter().filter(|b| b.contains("p1-")).collect();
    assert_eq!(
        p1_sent,
        ["p1-a", "p1-b"].map(js).iter().collect::<Vec<_>>(),
        "{p1:?}"
    );
    let p0 = bodies(&f.read_all("orders", 0).await);
    let lists: Vec<_> = p0.iter().filter(|b| b.contains("list-")).collect();
    assert_eq!(
        lists,
        ["list-0", "list-1"].map(js).iter().collect::<Vec<_>>(),
        "{p0:?}"
    );
    let mut everywhere = Vec::new();
    for p in 0..4 {
        everywhere.extend(bodies(&f.read_all("orders", p).await));
    }
    assert_eq!(
        everywhere.iter().filter(|b| **b == js("anywhere")).count(),
        1,
        "the round-robin send is stored once"
    );
}

/// The typed properties and the 50 pipelined sends of the `produce` scenario.
async fn stored_typed_and_pipelined(f: &TestHub) {
    let p2 = f.read_all("orders", 2).await;
    let typed = p2
        .iter()
        .find(|e| e.data.body[..] == *js("typed").as_bytes())
        .expect("typed event stored");
    let prop = |k: &str| typed.data.property(k).cloned();
    assert_eq!(prop("str"), Some(PropertyValue::String("text".into())));
    assert_eq!(prop("bool"), Some(PropertyValue::Bool(true)));
    // rhea encodes JavaScript numbers by value: 42 as a uint, 2.5 as a double.
    assert_eq!(prop("int"), Some(PropertyValue::UInt32(42)));
    assert_eq!(prop("float"), Some(PropertyValue::Float64(2.5)));
    assert_eq!(
        prop("time"),
        Some(PropertyValue::Timestamp(1_714_979_289_000))
    );
    assert_eq!(typed.data.content_type.as_deref(), Some("application/json"));
    assert_eq!(typed.data.correlation_id.as_deref(), Some("corr-1"));
    assert_eq!(typed.data.message_id.as_deref(), Some("msg-1"));

    // The 50 concurrent sends: all stored, in the order rhea put them on the link.
    let p3 = bodies(&f.read_all("orders", 3).await);
    let pipelined: Vec<_> = p3.iter().filter(|b| b.contains("pipelined-")).collect();
    let expected: Vec<_> = (0..50).map(|i| js(&format!("pipelined-{i}"))).collect();
    assert_eq!(pipelined, expected.iter().collect::<Vec<_>>());
}

fn sequence_numbers(result: &Value) -> Vec<i64> {
    result["events"]
        .as_array()
        .unwrap_or_else(|| panic!("{result}"))
        .iter()
        .map(|e| e["sequence_number"].as_i64().unwrap())
        .collect()
}

/// `subscribe` to one partition (group `$default`, lower-case as the JS SDK spells it) from
/// the start, a sequence number, an offset and an enqueued time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_consumer_receives_from_every_start_position() {
    let f = TestHub::start(&[("positions", 2)]).await;
    let mut receipts = Vec::new();
    for i in 0..5 {
        receipts.push(f.send("positions", "1", &format!("e{i}")).await);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let conn = f.conn(&f.listen);
    let at = |position: &str, value: Value, inclusive: bool, count: usize| {
        json!({"conn": conn, "hub": "positions", "partition": 1, "position": position,
               "value": value, "inclusive": inclusive, "count": count, "timeout_ms": 20000})
    };
    let offset1 = json!(receipts[1].offsets[0].to_string());
    let cases = [
        (at("earliest", Value::Null, false, 5), vec![0, 1, 2, 3, 4]),
        (at("sequence", json!(2), false, 2), vec![3, 4]),
        (at("sequence", json!(2), true, 3), vec![2, 3, 4]),
        (at("offset", offset1.clone(), false, 3), vec![2, 3, 4]),
        (at("offset", offset1, true, 4), vec![1, 2, 3, 4]),
        (
            at("time", json!(receipts[3].enqueued_time_ms), false, 1),
            vec![4],
        ),
    ];
    let results =
        tributary_testkit::join_in_waves(cases.iter().map(|(args, _)| args.clone()), |args| {
            run_node("receive", args)
        })
        .await;
    for ((args, expected), result) in cases.iter().zip(&results) {
        assert_eq!(&sequence_numbers(result), expected, "{args} -> {result}");
        assert_eq!(result["errors"], json!([]), "{result}");
    }
    let first = &results[0]["events"][0];
    assert_eq!(first["body"], "e0");
    assert_eq!(first["offset"], receipts[0].offsets[0].to_string());
    assert_eq!(first["enqueued_ms"], receipts[0].enqueued_time_ms);
    f.stop().await;
}

/// A subscriber with a higher owner level takes the partition: the first sees
/// `ReceiverDisconnectedError` and its partition closes with `OwnershipLost`; a later one with
/// a lower level is refused the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_higher_owner_level_takes_over() {
    let f = TestHub::start(&[("epochs", 2)]).await;
    f.send("epochs", "0", "first").await;
    let result = run_node(
        "steal",
        json!({"conn": f.conn(&f.root), "hub": "epochs", "partition": 0}),
    )
    .await;
    assert_eq!(result["stolen"], true, "{result}");
    assert_eq!(result["high_received"], true, "{result}");
    assert_eq!(result["low_events_after_steal"], 0, "{result}");
    let low = &result["low"];
    assert_eq!(
        low["errors"][0]["code"], "ReceiverDisconnectedError",
        "{result}"
    );
    assert_eq!(low["errors"][0]["retryable"], false, "{result}");
    assert!(
        low["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("higher epoch of '2'"),
        "{result}"
    );
    assert_eq!(low["closes"], json!(["OwnershipLost"]), "{result}");
    assert_eq!(result["high"]["errors"], json!([]), "{result}");
    assert_eq!(result["late_refused"], true, "{result}");
    let late = &result["late"];
    assert_eq!(
        late["errors"][0]["code"], "ReceiverDisconnectedError",
        "{result}"
    );
    assert_eq!(late["events"], json!([]), "{result}");
    f.stop().await;
}

/// A 1,000,000-byte event each way: rhea splits its transfer at the server's frame size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_large_event_round_trips() {
    let f = TestHub::start(&[("large", 1)]).await;
    let size = 1_000_000;
    let result = run_node(
        "large",
        json!({"conn": f.conn(&f.root), "hub": "large", "size": size}),
    )
    .await;
    assert_eq!(result["errors"], json!([]), "{result}");
    assert_eq!(result["received"], 1, "{result}");
    assert_eq!(result["size"], size, "{result}");
    assert_eq!(result["equal"], true, "{result}");
    let stored = f.read_all("large", 0).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].data.body.len(), size);
    f.stop().await;
}

/// AMQPS: the JS SDK, trusting our development authority through Node's NODE_EXTRA_CA_CERTS,
/// sends and receives with a connection string without emulator mode; trusting another
/// authority, it is refused and nothing arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_sdk_over_amqps_trusts_our_authority_and_no_other() {
    let hosts = ["localhost".to_owned(), "127.0.0.1".to_owned()];
    let (ours, theirs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let ours = tributary_tls::write_development_certificates(ours.path(), &hosts).unwrap();
    let theirs = tributary_tls::write_development_certificates(theirs.path(), &hosts).unwrap();
    let tls =
        tributary_tls::ServerTls::from_pem_files(&ours.server_cert, &ours.server_key).unwrap();
    let f = TestHub::start_in(
        tempfile::tempdir().unwrap(),
        &[("secure", 1)],
        |_| {},
        Some(tls),
    )
    .await;
    let conn = tributary_amqp::tls_connection_string("localhost", f.port(), &f.root);
    let round_trip = |ca: &std::path::Path, bodies: Value| {
        let args = json!({"conn": conn, "hub": "secure", "bodies": bodies});
        let ca = ca.to_str().unwrap().to_owned();
        async move { run_node_with("round-trip", args, &[("NODE_EXTRA_CA_CERTS", &ca)]).await }
    };
    let trusted = round_trip(&ours.ca_cert, json!(["a", "b"])).await;
    assert_eq!(trusted["sent"], true, "{trusted}");
    let got: Vec<&Value> = trusted["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["body"])
        .collect();
    assert_eq!(got, [&json!("a"), &json!("b")], "{trusted}");
    let refused = round_trip(&theirs.ca_cert, json!(["never"])).await;
    assert_eq!(refused["sent"], false, "{refused}");
    assert!(refused.to_string().contains("certificate"), "{refused}");
    assert_eq!(bodies(&f.read_all("secure", 0).await).len(), 2);
    f.stop().await;
}

/// AMQP over WebSockets with `ws` (the SDK's `webSocketOptions`; it always opens `wss://`)
/// through the HTTPS door, trusting the development authority: a batch goes in and comes back
/// out; a wrong key is refused by the AMQP door's CBS as over TCP — raised, not hung — and
/// nothing it sent is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_sdk_over_websockets_sends_and_receives_and_a_wrong_key_is_refused() {
    let certificates = tempfile::tempdir().unwrap();
    let hosts = ["localhost".to_owned(), "127.0.0.1".to_owned()];
    let ours = tributary_tls::write_development_certificates(certificates.path(), &hosts).unwrap();
    let tls =
        tributary_tls::ServerTls::from_pem_files(&ours.server_cert, &ours.server_key).unwrap();
    let f = TestHub::start(&[("carried", 2)])
        .await
        .with_websockets(Some(tls))
        .await;
    let conn = |policy: &tributary_amqp::AccessPolicy| {
        format!(
            "Endpoint=sb://localhost/;SharedAccessKeyName={};SharedAccessKey={}",
            policy.name, policy.key
        )
    };
    let over_ws = |conn: String, extra: Value| {
        let mut args = json!({"conn": conn, "hub": "carried", "websocket": true,
                              "endpoint": format!("sb://localhost:{}", f.http_port()),
                              "verify": ours.ca_cert.to_str().unwrap()});
        args.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        args
    };
    let batch = json!({"count": 5, "prefix": "ws"});
    let sent = run_node("send-batch", over_ws(conn(&f.send), batch)).await;
    assert_eq!(sent["sent"], true, "{sent}");
    let expected: Vec<_> = (0..5).map(|i| js(&format!("ws-{i}"))).collect();
    assert_eq!(bodies(&f.read_all("carried", 0).await), expected);
    let receive = json!({"partition": 0, "position": "earliest", "count": 5, "timeout_ms": 20000});
    let received = run_node("receive", over_ws(conn(&f.listen), receive)).await;
    assert_eq!(received["errors"], json!([]), "{received}");
    let got: Vec<_> = received["events"]
        .as_array()
        .unwrap_or_else(|| panic!("{received}"))
        .iter()
        .map(|e| e["body"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(got, (0..5).map(|i| format!("ws-{i}")).collect::<Vec<_>>());

    let mut wrong = f.root.clone();
    wrong.key = "not-the-key".into();
    let started = std::time::Instant::now();
    // The SDK retries UnauthorizedError (credentials may have been rotated) three times, 30 s
    // apart by default, over TCP as here: without retries the refusal is raised at once.
    let batch = json!({"count": 1, "prefix": "wrong", "max_retries": 0});
    let refused = run_node("send-batch", over_ws(conn(&wrong), batch)).await;
    assert_eq!(refused["sent"], false, "{refused}");
    assert_eq!(refused["code"], "UnauthorizedError", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap()
            .contains("signature matches neither the primary nor the secondary key"),
        "{refused}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "{refused}"
    );
    assert_eq!(f.read_all("carried", 0).await.len(), 5);
    f.stop().await;
}

/// A 1,000,000-byte event each way over AMQP over WebSockets: rhea puts each frame (at most the
/// server's 1 MiB frame size) in its own WebSocket message, within the door's message limit;
/// the server's frames reach it in pieces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_large_event_round_trips_over_websockets() {
    let certificates = tempfile::tempdir().unwrap();
    let hosts = ["localhost".to_owned()];
    let ours = tributary_tls::write_development_certificates(certificates.path(), &hosts).unwrap();
    let tls =
        tributary_tls::ServerTls::from_pem_files(&ours.server_cert, &ours.server_key).unwrap();
    let f = TestHub::start(&[("large", 1)])
        .await
        .with_websockets(Some(tls))
        .await;
    let conn = format!(
        "Endpoint=sb://localhost/;SharedAccessKeyName={};SharedAccessKey={}",
        f.root.name, f.root.key
    );
    let size = 1_000_000;
    let result = run_node(
        "large",
        json!({"conn": conn, "hub": "large", "size": size, "websocket": true,
               "endpoint": format!("sb://localhost:{}", f.http_port()),
               "verify": ours.ca_cert.to_str().unwrap()}),
    )
    .await;
    assert_eq!(result["errors"], json!([]), "{result}");
    assert_eq!(result["received"], 1, "{result}");
    assert_eq!(result["equal"], true, "{result}");
    let stored = f.read_all("large", 0).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].data.body.len(), size);
    f.stop().await;
}
