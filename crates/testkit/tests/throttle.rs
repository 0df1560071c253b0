//! Throughput limits through every door, with the official clients where there are some
//! (`tests/python/throttle.py`): one broker with per-hub limits, its AMQP, Kafka and HTTP doors,
//! started once for the binary (a single test drives the three doors side by side, each on a
//! hub of its own, so their limits do not interact):
//! - AMQP: three azure-eventhub Python producers sending well above a hub's ingress limit of
//!   200 events/s complete: deliveries beyond the allowed wait are rejected with
//!   `com.microsoft:server-busy` (which the SDK's pyamqp transport raises as
//!   `EventDataSendError` rather than retrying, so the script waits as the refusal says and
//!   sends again); every event is stored once, at a rate within 10 % of the limit.
//! - AMQP with the official JavaScript SDK, whose retry policy takes `ServerBusyError` as
//!   transient: without retries a producer over the limit meets the refusal as a retryable
//!   `ServerBusyError`; with them, producers well above the limit complete every batch, each
//!   event stored once.
//! - Kafka: confluent-kafka producing above a hub's 200 KiB/s ingress limit sees throttling
//!   (its throttle callback) and loses nothing; the stored rate is within 10 % of the limit.
//! - AMQP egress: a Python receiver reading five seconds' worth of stored events gets them all,
//!   in order and without an error, paced at the hub's egress limit.
//! - Kafka egress: a confluent-kafka consumer reading five seconds' worth gets every record in
//!   order, throttled (its callback) to the hub's egress limit.
//! - HTTP: a PutMessages over a hub's limit is answered 429 with `Retry-After` and writes
//!   nothing; a GetMessages over the egress limit is slowed, not refused.
//! - `/metrics` counts the throttled requests per door, hub and direction.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tributary_amqp::AccessPolicies;
use tributary_broker::SendTarget;
use tributary_broker::throttle::{DirectionLimits, Rate, ThroughputLimits};
use tributary_event::EventData;
use tributary_kafka::{KafkaConfig, RunningKafkaServer};
use tributary_testkit::oci::{Server, Setup, request, start_http};
use tributary_testkit::{TestHub, run_node, run_python, within};

/// The AMQP hub's ingress limit, in events a second.
const AMQP_EVENTS_PER_SECOND: u64 = 200;
/// The Kafka hub's ingress limit, in bytes a second.
const KAFKA_BYTES_PER_SECOND: u64 = 200 * 1024;
/// The AMQP receivers' hub's egress limit, in events a second.
const AMQP_EGRESS_EVENTS_PER_SECOND: u64 = 300;
/// The Kafka consumers' hub's egress limit, in bytes a second.
const KAFKA_EGRESS_BYTES_PER_SECOND: u64 = 100 * 1024;
/// The HTTP hub's ingress and egress limits, in events a second.
const HTTP_EVENTS_PER_SECOND: u64 = 10;

fn events_per_second(n: u64) -> Rate {
    Rate {
        bytes_per_second: None,
        events_per_second: Some(n),
    }
}

fn limits() -> ThroughputLimits {
    let mut hubs = BTreeMap::new();
    let ingress = |rate| DirectionLimits {
        ingress: rate,
        egress: Rate::default(),
    };
    for hub in ["py", "js", "js-once"] {
        hubs.insert(
            hub.to_owned(),
            ingress(events_per_second(AMQP_EVENTS_PER_SECOND)),
        );
    }
    let kafka = Rate {
        bytes_per_second: Some(KAFKA_BYTES_PER_SECOND),
        events_per_second: None,
    };
    hubs.insert("kf".to_owned(), ingress(kafka));
    hubs.insert(
        "kfo".to_owned(),
        DirectionLimits {
            ingress: Rate::default(),
            egress: Rate {
                bytes_per_second: Some(KAFKA_EGRESS_BYTES_PER_SECOND),
                events_per_second: None,
            },
        },
    );
    hubs.insert(
        "out".to_owned(),
        DirectionLimits {
            ingress: Rate::default(),
            egress: events_per_second(AMQP_EGRESS_EVENTS_PER_SECOND),
        },
    );
    hubs.insert(
        "web".to_owned(),
        DirectionLimits {
            ingress: events_per_second(HTTP_EVENTS_PER_SECOND),
            egress: events_per_second(HTTP_EVENTS_PER_SECOND),
        },
    );
    ThroughputLimits {
        namespace: DirectionLimits::default(),
        hubs,
    }
}

async fn kafka_door(f: &TestHub) -> RunningKafkaServer {
    let policies = AccessPolicies::new(Vec::new()).expect("no policies");
    let mut config = KafkaConfig::new("127.0.0.1:0".parse().unwrap(), policies);
    config.development_unauthenticated = true;
    tributary_kafka::start(f.broker.clone(), config)
        .await
        .expect("the Kafka door starts")
}

/// The rate at which `enqueued_ms` (one per event) were stored while the clients kept the
/// hub busy: the events stored after the 25th percentile of their times and up to the 90th,
/// over that span (the first second's burst, and what clients had in flight when it ended,
/// and the last stragglers' backoffs are left out;
/// a batch's events share one time, so a batch is counted whole or not at all).
fn stored_rate(mut enqueued_ms: Vec<i64>) -> f64 {
    enqueued_ms.sort_unstable();
    let n = enqueued_ms.len();
    let (low, high) = (enqueued_ms[n / 4], enqueued_ms[n * 9 / 10]);
    let stored = enqueued_ms
        .iter()
        .filter(|t| **t > low && **t <= high)
        .count();
    stored as f64 / ((high - low) as f64 / 1000.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_door_throttles_at_its_limit_and_clients_complete() {
    let dir = tempfile::tempdir().unwrap();
    let f = TestHub::start_in(
        dir,
        &[
            ("py", 3),
            ("js", 3),
            ("js-once", 3),
            ("kf", 1),
            ("web", 1),
            ("out", 1),
            ("kfo", 1),
        ],
        |c| {
            c.log.durability = tributary_broker::Durability::None;
            c.throughput = limits();
        },
        None,
    )
    .await;
    let kafka = kafka_door(&f).await;
    let setup = Setup {
        signed: false,
        ..Setup::default()
    };
    let http = start_http(&f.broker, &setup).await;
    let web = Server {
        dir: tempfile::tempdir().unwrap(),
        broker: f.broker.clone(),
        url: format!("http://{}", http.local_addr()),
        http,
    };
    within("every door's scenario", async {
        tokio::join!(
            amqp_scenario(&f),
            amqp_js_scenario(&f),
            amqp_egress_scenario(&f),
            kafka_scenario(&f, &kafka),
            kafka_egress_scenario(&f, &kafka),
            http_scenario(&web)
        )
    })
    .await;
    let metrics = request(&web, "GET", "/metrics", &[], b"").await.text();
    let throttled = [
        ("amqp", "py", "ingress"),
        ("amqp", "js", "ingress"),
        ("amqp", "out", "egress"),
        ("kafka", "kf", "ingress"),
        ("kafka", "kfo", "egress"),
        ("http", "web", "ingress"),
    ];
    for (door, hub, direction) in throttled {
        let line = format!(
            r#"tributary_throttled_total{{door="{door}",hub="{hub}",direction="{direction}"}}"#
        );
        assert!(metrics.contains(&line), "{line} missing in:\n{metrics}");
    }
    let egress = r#"tributary_throttled_total{door="http",hub="web",direction="egress"} 1"#;
    assert!(metrics.contains(egress), "{egress} missing in:\n{metrics}");
}

async fn amqp_scenario(f: &TestHub) {
    let (threads, batches, batch_events) = (3u64, 7u64, 100u64);
    let result: Value = run_python(
        "throttle.py",
        "amqp-send",
        json!({
            "conn": f.conn(&f.root), "hub": "py", "threads": threads, "batches": batches,
            "batch_events": batch_events,
        }),
    )
    .await;
    let sent = result["threads"].as_array().expect("threads");
    assert!(sent.iter().all(|t| t["ok"] == true), "{result}");
    // Producers that together keep more than the allowed wait in flight are refused with the
    // service's condition and words, wait as told, and send again.
    let busy: u64 = sent
        .iter()
        .map(|t| t["server_busy"].as_u64().unwrap())
        .sum();
    assert!(busy > 0, "no send was refused: {result}");
    let refusal = sent
        .iter()
        .find_map(|t| t["first_refusal"][0].as_str())
        .unwrap();
    assert!(refusal.contains("Error code : 50002"), "{refusal}");
    let mut bodies = HashSet::new();
    let mut enqueued = Vec::new();
    for p in 0..threads {
        for e in f.read_all("py", p as u32).await {
            assert!(
                bodies.insert(e.data.body.clone()),
                "stored twice: {:?}",
                e.data.body
            );
            enqueued.push(e.enqueued_time_ms);
        }
    }
    assert_eq!(
        bodies.len() as u64,
        threads * batches * batch_events,
        "{result}"
    );
    let rate = stored_rate(enqueued);
    let limit = AMQP_EVENTS_PER_SECOND as f64;
    eprintln!("AMQP: stored {rate:.1} events/s under a limit of {limit}; {busy} sends refused");
    assert!(
        (rate - limit).abs() <= limit * 0.1,
        "stored at {rate:.1} events/s, limit {limit}: {result}"
    );
}

async fn amqp_js_scenario(f: &TestHub) {
    let (producers, batches, batch_events) = (3u64, 7u64, 100u64);
    let args = |hub: &str, max_retries: u64| {
        json!({
            "conn": f.conn(&f.root), "hub": hub, "producers": producers, "batches": batches,
            "batch_events": batch_events, "max_retries": max_retries, "retry_delay_ms": 300,
        })
    };
    // Without retries, a producer over the limit meets the refusal: a retryable ServerBusyError.
    let once = run_node("send-busy", args("js-once", 0)).await;
    let errors: Vec<&Value> = once["producers"]
        .as_array()
        .expect("producers")
        .iter()
        .filter_map(|p| p.get("error"))
        .collect();
    assert!(!errors.is_empty(), "no send was refused: {once}");
    for error in errors {
        assert_eq!(error["code"], "ServerBusyError", "{once}");
        assert_eq!(error["retryable"], true, "{once}");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("Error code : 50002"),
            "{once}"
        );
    }
    // With the SDK's retries, every batch goes through and each event is stored once. The SDK
    // retries at a fixed 300 ms; while the other two producers keep the hub's second of queue
    // full, a third can lose every race (the limit working, not a fault), so its retries must
    // outlast their work: 2 × 7 × 100 events at 200 events/s is 7 s, 60 retries are 18 s.
    let result = run_node("send-busy", args("js", 60)).await;
    for producer in result["producers"].as_array().expect("producers") {
        assert_eq!(producer["sent"], batches, "{result}");
        assert!(producer.get("error").is_none(), "{result}");
    }
    let mut bodies = HashSet::new();
    for p in 0..producers {
        for e in f.read_all("js", p as u32).await {
            assert!(
                bodies.insert(e.data.body.clone()),
                "stored twice: {:?}",
                e.data.body
            );
        }
    }
    assert_eq!(
        bodies.len() as u64,
        producers * batches * batch_events,
        "{result}"
    );
}

async fn amqp_egress_scenario(f: &TestHub) {
    let count = 5 * AMQP_EGRESS_EVENTS_PER_SECOND;
    let events = (0..count)
        .map(|i| EventData::new(format!("e{i}").into_bytes()))
        .collect();
    let target = SendTarget::Partition("0".to_owned());
    f.broker.send("out", target, events).await.expect("stored");
    let started = Instant::now();
    let args = json!({"conn": f.conn(&f.root), "hub": "out", "partition": 0, "position": "earliest", "count": count});
    let result = run_python("interop.py", "consume", args).await;
    let elapsed = started.elapsed();
    let received = result["events"].as_array().expect("events");
    assert_eq!(received.len() as u64, count, "{result}");
    assert!(
        received
            .iter()
            .enumerate()
            .all(|(i, e)| e["body"] == format!("e{i}")),
        "{result}"
    );
    // A second's worth at once, then the egress rate: the receiver is slowed, not refused.
    let paced = Duration::from_secs(count / AMQP_EGRESS_EVENTS_PER_SECOND - 1);
    assert!(elapsed >= paced, "{count} events received in {elapsed:?}");
    assert_eq!(result["errors"], json!([]), "{result}");
    eprintln!(
        "AMQP egress: {count} events at {AMQP_EGRESS_EVENTS_PER_SECOND} events/s received in {elapsed:?}"
    );
}

async fn kafka_scenario(f: &TestHub, door: &RunningKafkaServer) {
    let (count, size) = (1600u64, 1000u64);
    let result: Value = run_python(
        "throttle.py",
        "kafka-produce",
        json!({
            "bootstrap": door.local_addr().to_string(), "topic": "kf", "count": count,
            "size": size, "batch_bytes": 64 * 1024,
        }),
    )
    .await;
    assert_eq!(result["unflushed"], 0, "{result}");
    assert_eq!(result["errors"], json!([]), "{result}");
    assert!(
        result["throttles"].as_u64().unwrap() > 0,
        "no throttle callback: {result}"
    );
    let events = f.read_all("kf", 0).await;
    let keys: HashSet<_> = events.iter().map(|e| e.data.body.len()).collect();
    assert_eq!(events.len() as u64, count, "{result}");
    assert_eq!(keys, HashSet::from([size as usize]));
    // Payload bytes per second; the limit counts the record batches, a few percent more.
    let rate = stored_rate(events.iter().map(|e| e.enqueued_time_ms).collect()) * size as f64;
    let limit = KAFKA_BYTES_PER_SECOND as f64;
    eprintln!("Kafka: stored {rate:.0} payload B/s under a limit of {limit} B/s; {result}");
    assert!(
        rate <= limit * 1.1 && rate >= limit * 0.8,
        "stored at {rate:.0} B/s, limit {limit}: {result}"
    );
}

async fn kafka_egress_scenario(f: &TestHub, door: &RunningKafkaServer) {
    // Five seconds' worth of 1000-byte events (a little more in record batches), stored in
    // batches of 16: the log reads whole batches, and a fetch gets at least one.
    let count = 5 * KAFKA_EGRESS_BYTES_PER_SECOND / 1000;
    for _ in 0..count / 16 {
        let events = (0..16).map(|_| EventData::new(vec![b'k'; 1000])).collect();
        let target = SendTarget::Partition("0".to_owned());
        f.broker.send("kfo", target, events).await.expect("stored");
    }
    let result: Value = run_python(
        "throttle.py",
        "kafka-consume",
        json!({
            "bootstrap": door.local_addr().to_string(), "topic": "kfo", "count": count,
            "fetch_bytes": 64 * 1024,
        }),
    )
    .await;
    assert_eq!(result["received"], count, "{result}");
    assert_eq!(result["in_order"], true, "{result}");
    assert_eq!(result["errors"], json!([]), "{result}");
    assert!(
        result["throttles"].as_u64().unwrap() > 0,
        "no throttle callback: {result}"
    );
    // A second's worth at once, then the egress rate: fetches are slowed, not refused.
    let elapsed = result["elapsed_s"].as_f64().unwrap();
    assert!(
        elapsed >= 3.5,
        "{count} records fetched in {elapsed:.1} s: {result}"
    );
    eprintln!(
        "Kafka egress: {count} records of 1000 B at {KAFKA_EGRESS_BYTES_PER_SECOND} B/s: {result}"
    );
}

fn put_body(n: usize) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let messages: Vec<Value> = (0..n)
        .map(|i| json!({"value": b64(&format!("m{i}"))}))
        .collect();
    json!({ "messages": messages }).to_string()
}

async fn http_scenario(web: &Server) {
    let path = "/20180418/streams/web/messages";
    let burst = HTTP_EVENTS_PER_SECOND as usize;
    let first = request(web, "POST", path, &[], put_body(burst).as_bytes()).await;
    assert_eq!(first.status, 200, "{}", first.text());
    let refused = request(web, "POST", path, &[], put_body(burst).as_bytes()).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.json()["code"], "TooManyRequests");
    assert_eq!(refused.header("retry-after"), Some("1"));
    let stored = web.broker.partition_properties("web", "0").unwrap();
    assert_eq!(
        stored.last_enqueued_sequence_number + 1,
        burst as i64,
        "a refused put wrote nothing"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let second = request(web, "POST", path, &[], put_body(burst).as_bytes()).await;
    assert_eq!(second.status, 200, "{}", second.text());

    // Egress: the first read of a second's worth passes, the next waits for the bucket.
    let cursor = request(
        web,
        "POST",
        "/20180418/streams/web/cursors",
        &[],
        br#"{"partition": "0", "type": "TRIM_HORIZON"}"#,
    )
    .await;
    let mut value = cursor.json()["value"].as_str().unwrap().to_owned();
    let mut read = 0;
    let mut durations = Vec::new();
    for _ in 0..2 {
        let started = Instant::now();
        let got = request(
            web,
            "GET",
            &format!("{path}?cursor={value}&limit={burst}"),
            &[],
            b"",
        )
        .await;
        durations.push(started.elapsed());
        assert_eq!(got.status, 200, "{}", got.text());
        read += got.json().as_array().unwrap().len();
        value = got.header("opc-next-cursor").unwrap().to_owned();
    }
    assert_eq!(read, 2 * burst);
    assert!(durations[0] < Duration::from_millis(500), "{durations:?}");
    assert!(
        durations[1] >= Duration::from_millis(900),
        "the second read was not slowed: {durations:?}"
    );
}
