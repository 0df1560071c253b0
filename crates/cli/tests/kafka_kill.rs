//! `kill -9` of `tributary serve` while an idempotent Kafka producer (confluent-kafka,
//! `enable.idempotence`, acks all; `crates/testkit/tests/python/kafka_idempotence.py`) sends:
//! serve is killed twice mid-stream and started again on the same Kafka port, the producer
//! reconnects and retries what it had in flight, and in the end every acknowledged record is
//! stored exactly once, at the offset its acknowledgement gave, and no record twice.

mod common;

use std::process::Child;
use std::time::Duration;

use common::{ServeGuard, banner_addr, shown_connection_string, start_serve};
use serde_json::{Value, json};

/// SIGKILL: no shutdown, no final sync, whatever the process was doing.
fn kill_9(mut serve: Child) {
    serve.kill().expect("SIGKILL");
    let status = serve.wait().unwrap();
    assert!(!status.success(), "killed, not exited: {status}");
}

async fn kafka(command: &str, args: Value) -> Value {
    tributary_testkit::run_python("kafka_idempotence.py", command, args).await
}

const PARTITIONS: usize = 3;
const RECORDS: usize = 6000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_record_an_idempotent_producer_had_acknowledged_is_stored_once_across_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    let partitions = PARTITIONS.to_string();
    let hub = ["--hub", "orders", "--partitions", partitions.as_str()];
    let ports = ["--amqp-port", "0", "--http-port", "0"];
    let (serve, banner, _stderr) = start_serve(&d, &[&ports[..], &hub[..]].concat());
    let mut serve = ServeGuard::new(serve);
    let bootstrap = banner_addr(&banner, "kafka:");
    let port = bootstrap.rsplit(':').next().unwrap().to_owned();
    let conn = shown_connection_string(&banner);
    let args = json!({"bootstrap": bootstrap, "conn": conn, "topic": "orders",
                      "partitions": PARTITIONS, "count": RECORDS, "rounds": 60, "pause_ms": 50,
                      "message_timeout_ms": 120_000, "flush_s": 150});
    let producing = tokio::spawn(kafka("produce", args.clone()));
    for pause_ms in [900, 1300] {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        assert!(!producing.is_finished(), "the kill comes mid-stream");
        kill_9(serve.take());
        let again = [&ports[..], &hub[..], &["--kafka-port", port.as_str()]].concat();
        serve = ServeGuard::new(start_serve(&d, &again).0);
    }
    let produced = producing.await.unwrap();
    assert_eq!(produced["fatal"], json!([]), "{}", summary(&produced));
    assert_eq!(produced["errors"], json!([]), "{}", summary(&produced));
    assert_eq!(produced["delivered"], RECORDS, "{}", summary(&produced));

    let mut consume = args.clone();
    consume["records"] = json!(true);
    let consumed = kafka("consume", consume).await;
    assert_eq!(consumed["errors"], json!([]), "{}", summary(&consumed));
    assert_eq!(
        consumed["count"],
        RECORDS,
        "exactly once: {}",
        summary(&consumed)
    );
    assert_eq!(
        consumed["distinct"],
        RECORDS,
        "no duplicate: {}",
        summary(&consumed)
    );
    let stored: std::collections::HashSet<(String, i64, i64)> = consumed["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(triple)
        .collect();
    for acknowledged in produced["acknowledged"].as_array().unwrap() {
        let acknowledged = triple(acknowledged);
        assert!(
            stored.contains(&acknowledged),
            "{acknowledged:?} not where acknowledged"
        );
    }
    kill_9(serve.take());
}

/// (value, partition, offset) of a record as the script lists it.
fn triple(record: &Value) -> (String, i64, i64) {
    (
        record[0].as_str().unwrap().to_owned(),
        record[1].as_i64().unwrap(),
        record[2].as_i64().unwrap(),
    )
}

/// A result without its long record lists, for failure messages.
fn summary(result: &Value) -> Value {
    let mut short = result.clone();
    if let Some(map) = short.as_object_mut() {
        map.remove("acknowledged");
        map.remove("records");
    }
    short
}
