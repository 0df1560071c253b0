//! Compacted hubs (issue 35) through every door, with real clients: the official Python SDK
//! (`tests/python/compaction.py`) sends keyed events and tombstones, checkpoints with its
//! checkpoint store, has the hub compacted through the admin API, resumes and reads from the
//! start; confluent-kafka (`tests/python/kafka_admin.py`, `kafka_interop.py`) creates a compacted
//! topic, describes it, produces and consumes it; the HTTP door's admin API, PutMessages and
//! `/metrics` over raw HTTP. A keyless event is refused with a clear error on each door.
//!
//! Segments are sealed every 4 KiB here (compaction rewrites sealed segments only), so a few
//! dozen events fill several. The clients come from `<repo>/.venv` (scripts/setup-python-interop,
//! scripts/setup-kafka-interop); a missing client FAILS these tests, it never skips them.

use serde_json::{Value, json};
use tributary_broker::{BrokerConfig, CleanupPolicy, HubCleanup, HubSpec};
use tributary_event::ReceivedEvent;
use tributary_kafka::{KafkaConfig, RunningKafkaServer};
use tributary_testkit::TestHub;
use tributary_testkit::oci::{Server, Setup, request, start};

/// Sealed every 4 KiB.
fn small_segments(config: &mut BrokerConfig) {
    config.log.segment_bytes_max = tributary_log::limits::SEGMENT_BYTES_MAX_MIN;
}

fn compact_no_lag() -> HubCleanup {
    HubCleanup {
        policy: CleanupPolicy::Compact,
        min_compaction_lag_ms: 0,
        ..HubCleanup::default()
    }
}

/// A hub with small segments, its AMQP door and its HTTP door (admin API unauthenticated).
async fn hub_with_small_segments() -> TestHub {
    let dir = tempfile::tempdir().unwrap();
    TestHub::start_in(dir, &[], small_segments, None)
        .await
        .with_websockets(None)
        .await
}

fn pad(text: &str) -> String {
    format!("{text}-{}", "x".repeat(200))
}

/// Keys `k0..k4` in 6 rounds (bodies `k<i>-v<round>-xxx…`: sequence numbers 0 to 29), a
/// tombstone of `k1` (30), then 30 keys `f0..f29` once each (31 to 60): enough after the
/// tombstone that its segment is sealed.
fn table_events() -> Vec<(String, Option<String>)> {
    let mut events = Vec::new();
    for round in 0..6 {
        for k in 0..5 {
            events.push((format!("k{k}"), Some(pad(&format!("k{k}-v{round}")))));
        }
    }
    events.push(("k1".to_owned(), None));
    for f in 0..30 {
        events.push((format!("f{f}"), Some(pad(&format!("f{f}")))));
    }
    events
}

/// The latest event of each key of `events`, in sequence order: (sequence number, key, body;
/// "" for a tombstone).
fn latest_per_key(events: &[(String, Option<String>)]) -> Vec<(i64, String, String)> {
    let mut latest: Vec<(i64, String, String)> = Vec::new();
    for (seq, (key, body)) in events.iter().enumerate() {
        latest.retain(|(_, k, _)| k != key);
        let body = body.clone().unwrap_or_default();
        latest.push((i64::try_from(seq).unwrap(), key.clone(), body));
    }
    latest
}

fn stored(events: &[ReceivedEvent]) -> Vec<(i64, String, String)> {
    events
        .iter()
        .map(|e| {
            let key = e.data.partition_key.clone().unwrap_or_default();
            let body = String::from_utf8(e.data.body.to_vec()).unwrap();
            (e.sequence_number, key, body)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_reads_the_latest_event_of_each_key_and_resumes_its_checkpoint() {
    let f = hub_with_small_segments().await;
    let spec = HubSpec {
        cleanup: compact_no_lag(),
        ..HubSpec::new("table", 1)
    };
    f.broker.create_hub(spec).await.unwrap();
    let events = table_events();
    let sent: Vec<Value> = events
        .iter()
        .map(|(key, body)| json!({"key": key, "body": body}))
        .collect();
    let conn = f.conn(&f.root);
    let args = json!({"conn": conn, "hub": "table", "events": sent});
    let send = tributary_testkit::run_python("compaction.py", "send", args).await;
    assert_eq!(send["last_sequence"], 60, "{send}");
    // An amqp-value body would be stored empty: with its key, a tombstone. It is refused.
    let value_body = send["value_body"]["error"]
        .as_str()
        .expect("amqp-value body refused");
    assert!(
        value_body.contains("must be data sections") && value_body.contains("\"table\""),
        "{send}"
    );
    let keyless = send["keyless"]["error"]
        .as_str()
        .expect("keyless send refused");
    assert!(
        keyless.contains("no partition key") && keyless.contains("\"table\""),
        "{send}"
    );

    // A checkpoint on k2's second event (sequence number 7), which compaction removes.
    let admin = format!("http://127.0.0.1:{}", f.http_port());
    let args = json!({"conn": conn, "hub": "table", "admin": admin, "checkpoint_at": 7});
    let run =
        tributary_testkit::run_python("compaction.py", "checkpoint-compact-resume", args).await;
    assert_eq!(run["checkpointed"]["sequence_number"], 7, "{run}");
    let compacted = &run["compacted"]["partitions"][0];
    assert_eq!(compacted["eventsRemoved"], 26, "{}", run["compacted"]);

    let expected = latest_per_key(&events);
    let from_start: Vec<(i64, String, String)> = run["from_start"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let seq = e["sequence_number"].as_i64().unwrap();
            let key = e["partition_key"].as_str().unwrap().to_owned();
            (seq, key, e["body"].as_str().unwrap().to_owned())
        })
        .collect();
    assert_eq!(from_start, expected, "{run}");
    assert_eq!(stored(&f.read_all("table", 0).await), expected);
    // The checkpoint resumes at the next kept event: k0's latest, sequence number 25.
    assert_eq!(run["resumed_first"]["sequence_number"], 25, "{run}");
    assert_eq!(run["resumed_first"]["partition_key"], "k0", "{run}");
    let properties = f.broker.partition_properties("table", "0").unwrap();
    assert_eq!(properties.last_enqueued_sequence_number, 60);
    assert_eq!(properties.begin_sequence_number, 25);
    f.stop().await;
}

async fn kafka_door(hub: &TestHub) -> RunningKafkaServer {
    let config = KafkaConfig::new("127.0.0.1:0".parse().unwrap(), hub.policies.clone());
    tributary_kafka::start(hub.broker.clone(), config)
        .await
        .expect("the Kafka door starts")
}

async fn kafka(
    script: &str,
    command: &str,
    door: &RunningKafkaServer,
    conn: &str,
    more: Value,
) -> Value {
    let mut args = json!({"bootstrap": door.local_addr().to_string(), "conn": conn});
    args.as_object_mut()
        .unwrap()
        .extend(more.as_object().unwrap().clone());
    tributary_testkit::run_python(script, command, args).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_client_creates_describes_produces_and_consumes_a_compacted_topic() {
    let f = hub_with_small_segments().await;
    let door = kafka_door(&f).await;
    let conn = f.conn(&f.root);
    kafka_creates_and_describes_a_compacted_topic(&f, &door, &conn).await;

    let events = table_events();
    let records: Vec<Value> = events
        .iter()
        .map(|(key, value)| json!({"key": key, "value": value, "partition": 0}))
        .collect();
    // One record a batch, so that the records spread over several segments as they would
    // over time.
    let one_a_batch = json!({"linger.ms": 0, "batch.num.messages": 1});
    let more = json!({"topic": "ktable", "acks": 1, "records": records, "extra": one_a_batch});
    let produced = kafka("kafka_interop.py", "produce", &door, &conn, more).await;
    let reports = produced["reports"].as_array().unwrap();
    assert!(reports.iter().all(|r| r["error"].is_null()), "{produced}");
    let keyless =
        json!({"topic": "ktable", "acks": 1, "records": [{"value": "no key", "partition": 0}]});
    let refused = kafka("kafka_interop.py", "produce", &door, &conn, keyless).await;
    assert_eq!(
        refused["reports"][0]["error"], "INVALID_RECORD",
        "{refused}"
    );

    let outcome = f.broker.compact_hub("ktable").await.unwrap();
    assert_eq!(outcome[0].events_removed, 26);
    kafka_consumes_the_latest_of_each_key(&door, &conn, &latest_per_key(&events)).await;
    door.shutdown().await;
    f.stop().await;
}

/// CreateTopics with `cleanup.policy=compact` makes a compacted hub, and DescribeConfigs shows
/// its settings.
async fn kafka_creates_and_describes_a_compacted_topic(
    f: &TestHub,
    door: &RunningKafkaServer,
    conn: &str,
) {
    let config = json!({"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
                        "delete.retention.ms": "3600000"});
    let topics = json!([{"name": "ktable", "partitions": 1, "config": config}]);
    let created = kafka(
        "kafka_admin.py",
        "create_topics",
        door,
        conn,
        json!({"topics": topics}),
    )
    .await;
    assert_eq!(created["results"], json!({"ktable": null}), "{created}");
    let cleanup = f.broker.describe_hub("ktable").unwrap().cleanup;
    let expected_cleanup = HubCleanup {
        tombstone_retention_ms: 3_600_000,
        ..compact_no_lag()
    };
    assert_eq!(cleanup, expected_cleanup);
    let described = kafka(
        "kafka_admin.py",
        "describe_configs",
        door,
        conn,
        json!({"topic": "ktable"}),
    )
    .await;
    let configs = &described["configs"];
    for (name, value, source) in [
        ("cleanup.policy", "compact", "DYNAMIC_TOPIC_CONFIG"),
        ("min.compaction.lag.ms", "0", "DEFAULT_CONFIG"),
        ("delete.retention.ms", "3600000", "DYNAMIC_TOPIC_CONFIG"),
    ] {
        assert_eq!(configs[name]["value"], value, "{name}: {described}");
        assert_eq!(configs[name]["source"], source, "{name}: {described}");
    }
}

/// A consumer from the earliest offset gets `expected` (tombstones with null values); one
/// from a removed record's offset starts at the next kept one.
async fn kafka_consumes_the_latest_of_each_key(
    door: &RunningKafkaServer,
    conn: &str,
    expected: &[(i64, String, String)],
) {
    let more = json!({"topic": "ktable", "partitions": [0], "count": expected.len()});
    let consumed = kafka("kafka_interop.py", "consume", door, conn, more).await;
    let got: Vec<(i64, String, Value)> = consumed["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["offset"].as_i64().unwrap(),
                r["key"].as_str().unwrap().to_owned(),
                r["value"].clone(),
            )
        })
        .collect();
    let want: Vec<(i64, String, Value)> = expected
        .iter()
        .map(|(seq, key, body)| {
            let value = if body.is_empty() {
                Value::Null
            } else {
                json!(body)
            };
            (*seq, key.clone(), value)
        })
        .collect();
    assert_eq!(got, want, "{consumed}");
    // Before the first kept record (k2's second, 7) and between two kept ones (k1's last, 26).
    for (offset, next) in [(7, 25), (26, 27)] {
        let more = json!({"topic": "ktable", "partitions": [0], "count": 1, "offset": offset});
        let consumed = kafka("kafka_interop.py", "consume", door, conn, more).await;
        assert_eq!(
            consumed["records"][0]["offset"], next,
            "{offset}: {consumed}"
        );
    }
}

#[tokio::test]
async fn the_admin_api_puts_and_metrics_of_a_compacted_hub() {
    let s = start(Setup {
        signed: false,
        ..Setup::default()
    })
    .await;
    let body = br#"{"name": "table", "partitionCount": 1,
                    "retentionDescription": {"cleanupPolicy": "Compact", "minCompactionLagTimeInMinutes": 0,
                                             "tombstoneRetentionTimeInHours": 2}}"#;
    let created = request(&s, "POST", "/admin/v1/hubs", &[], body).await;
    assert_eq!(created.status, 201, "{}", created.text());
    let description = &created.json()["retentionDescription"];
    assert_eq!(
        description["cleanupPolicy"],
        "Compact",
        "{}",
        created.text()
    );
    assert_eq!(description["tombstoneRetentionTimeInHours"], 2.0);
    assert_eq!(description["retentionTimeInHours"], 24.0);
    let cleanup = s.broker.describe_hub("table").unwrap().cleanup;
    assert_eq!(cleanup.tombstone_retention_ms, 7_200_000);

    // A message without a key is refused, with a message naming the hub and the missing key.
    let answer = put_messages(&s, br#"{"messages": [{"value": "bm8ga2V5"}]}"#).await;
    assert_eq!(answer["failures"], 1, "{answer}");
    let message = answer["entries"][0]["errorMessage"].as_str().unwrap();
    assert!(
        message.contains("no partition key") && message.contains("\"table\""),
        "{message}"
    );
    assert!(
        s.broker
            .partition_properties("table", "0")
            .unwrap()
            .is_empty
    );
    let answer = put_messages(
        &s,
        br#"{"messages": [{"key": "azE=", "value": "djE="}, {"key": "azE=", "value": "djI="}]}"#,
    )
    .await;
    assert_eq!(answer["failures"], 0, "{answer}");

    compaction_shows_on_the_admin_api_and_metrics(&s).await;
    an_update_is_checked_and_applied(&s, cleanup).await;
    s.http.shutdown().await.unwrap();
}

/// PutMessages on "table"; its answer.
async fn put_messages(s: &Server, body: &[u8]) -> Value {
    let answer = request(s, "POST", "/20180418/streams/table/messages", &[], body).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()
}

async fn compaction_shows_on_the_admin_api_and_metrics(s: &Server) {
    let compacted = request(s, "POST", "/admin/v1/hubs/table/compact", &[], b"").await;
    assert_eq!(compacted.status, 200, "{}", compacted.text());
    let described = request(s, "GET", "/admin/v1/hubs/table", &[], b"").await;
    let partition = &described.json()["partitions"][0];
    assert!(
        partition["compaction"]["lastRun"].is_string(),
        "{}",
        described.text()
    );
    let metrics = request(s, "GET", "/metrics", &[], b"").await.text();
    for name in [
        "tributary_compaction_dirty_ratio{hub=\"table\",partition=\"0\"}",
        "tributary_compaction_last_run_timestamp_seconds{hub=\"table\",partition=\"0\"}",
        "tributary_compaction_bytes_before{hub=\"table\",partition=\"0\"}",
        "tributary_compaction_bytes_after{hub=\"table\",partition=\"0\"}",
    ] {
        assert!(metrics.contains(name), "{name} missing: {metrics}");
    }
}

/// Bad values change nothing; back to delete with retention forever, keyless puts are taken.
async fn an_update_is_checked_and_applied(s: &Server, cleanup: HubCleanup) {
    let bad = br#"{"retentionDescription": {"minCompactionLagTimeInMinutes": -1}}"#;
    let refused = request(s, "PATCH", "/admin/v1/hubs/table", &[], bad).await;
    refused.assert_error(400, "InvalidParameter");
    assert!(
        refused.text().contains("minCompactionLagTimeInMinutes"),
        "{}",
        refused.text()
    );
    let bad = br#"{"retentionDescription": {"cleanupPolicy": "Shred"}}"#;
    request(s, "PATCH", "/admin/v1/hubs/table", &[], bad)
        .await
        .assert_error(400, "InvalidParameter");
    assert_eq!(s.broker.describe_hub("table").unwrap().cleanup, cleanup);
    let update =
        br#"{"retentionForever": true, "retentionDescription": {"cleanupPolicy": "Delete"}}"#;
    let updated = request(s, "PATCH", "/admin/v1/hubs/table", &[], update).await;
    assert_eq!(updated.status, 200, "{}", updated.text());
    assert_eq!(
        updated.json()["retentionDescription"]["cleanupPolicy"],
        "Delete"
    );
    assert_eq!(
        updated.json()["retentionDescription"]["retentionTimeInHours"],
        -1.0
    );
    let answer = put_messages(s, br#"{"messages": [{"value": "bm8ga2V5"}]}"#).await;
    assert_eq!(answer["failures"], 0, "{answer}");
    request(s, "POST", "/admin/v1/hubs/table/compact", &[], b"")
        .await
        .assert_error(400, "InvalidParameter");
}

/// OCI cursors over HTTP at a removed offset, after one, and at the trim horizon read from the
/// next kept message.
#[tokio::test]
async fn http_cursors_at_removed_offsets_read_the_next_kept_message() {
    let s = start(Setup {
        signed: false,
        ..Setup::default()
    })
    .await;
    let spec = HubSpec {
        cleanup: compact_no_lag(),
        ..HubSpec::new("table", 1)
    };
    s.broker.create_hub(spec).await.unwrap();
    // k1 (offset 0), k2 (1), k1 again (2), k2 again (3), k3 (4), one a request so that they
    // are stored in this order: 0 and 1 go.
    let puts = [
        ("azE=", "MQ=="),
        ("azI=", "Mg=="),
        ("azE=", "Mw=="),
        ("azI=", "NA=="),
        ("azM=", "NQ=="),
    ];
    for (key, value) in puts {
        let put = format!(r#"{{"messages": [{{"key": "{key}", "value": "{value}"}}]}}"#);
        assert_eq!(put_messages(&s, put.as_bytes()).await["failures"], 0);
    }
    assert_eq!(
        s.broker.compact_hub("table").await.unwrap()[0].events_removed,
        2
    );
    for (cursor, first) in [
        (r#"{"partition": "0", "type": "TRIM_HORIZON"}"#, 2),
        (r#"{"partition": "0", "type": "AT_OFFSET", "offset": 0}"#, 2),
        (
            r#"{"partition": "0", "type": "AFTER_OFFSET", "offset": 0}"#,
            2,
        ),
        (r#"{"partition": "0", "type": "AT_OFFSET", "offset": 3}"#, 3),
    ] {
        let created = request(
            &s,
            "POST",
            "/20180418/streams/table/cursors",
            &[],
            cursor.as_bytes(),
        )
        .await;
        assert_eq!(created.status, 200, "{}", created.text());
        let value = created.json()["value"].as_str().unwrap().to_owned();
        let target = format!("/20180418/streams/table/messages?cursor={value}");
        let got = request(&s, "GET", &target, &[], b"").await.json();
        let offsets: Vec<i64> = got
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["offset"].as_i64().unwrap())
            .collect();
        assert_eq!(offsets.first(), Some(&first), "{cursor}: {got}");
        assert!(
            offsets.windows(2).all(|w| w[0] < w[1]) && offsets.last() == Some(&4),
            "{got}"
        );
    }
    s.http.shutdown().await.unwrap();
}
