//! The Kafka door with a real Kafka client: `confluent-kafka` (librdkafka), driven by
//! `tests/python/kafka_interop.py` with `<repo>/.venv/bin/python` (installed by
//! `scripts/setup-kafka-interop`; a missing client FAILS these tests, it never skips them).
//!
//! Each test starts a hub (broker and AMQP door, `TestHub`) and the Kafka door beside it on
//! 127.0.0.1:0, over the same broker and shared access policies.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tributary_broker::SendTarget;
use tributary_event::{EventData, PropertyValue};
use tributary_kafka::{KafkaConfig, RunningKafkaServer};
use tributary_testkit::TestHub;

/// The Kafka door over `hub`'s broker and policies, SASL required.
async fn kafka_door(hub: &TestHub) -> RunningKafkaServer {
    let config = KafkaConfig::new("127.0.0.1:0".parse().unwrap(), hub.policies.clone());
    tributary_kafka::start(hub.broker.clone(), config)
        .await
        .expect("the Kafka door starts")
}

async fn kafka(command: &str, args: Value) -> Value {
    tributary_testkit::run_python("kafka_interop.py", command, args).await
}

/// The records the acks test produces: (acks, records, more client settings): acks 1 with gzip,
/// acks all idempotent (InitProducerId) with snappy.
fn produced() -> Vec<(&'static str, Value, Value)> {
    let gzip = json!({"compression.type": "gzip"});
    let idempotent = json!({"compression.type": "snappy", "enable.idempotence": true});
    vec![
        (
            "0",
            json!([{"value": "zero-a", "partition": 0}, {"value": "zero-b", "partition": 0}]),
            json!({}),
        ),
        (
            "1",
            json!([{"value": "one", "key": "user-1", "partition": 1, "timestamp": 1_700_000_000_123_i64,
                    "headers": {"trace": "00ff10", "kind": "6f72646572"}}]),
            gzip,
        ),
        (
            "all",
            json!([{"value": "all-a", "key": "user-2", "partition": 2}, {"value": "all-b", "partition": 2}]),
            idempotent,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_produces_with_every_acks_and_consumes_by_assignment() {
    let hub = TestHub::start(&[("orders", 3)]).await;
    let door = kafka_door(&hub).await;
    let (bootstrap, conn) = (door.local_addr().to_string(), hub.conn(&hub.root));
    for (acks, records, extra) in produced() {
        let args = json!({"bootstrap": bootstrap, "conn": conn, "topic": "orders", "acks": acks,
                          "records": records, "extra": extra});
        let result = kafka("produce", args).await;
        assert_eq!(result["unflushed"], 0, "acks={acks}: {result}");
        for report in result["reports"].as_array().unwrap() {
            assert_eq!(report["error"], Value::Null, "acks={acks}: {result}");
        }
        if acks != "0" {
            // The base offset is the first event's sequence number.
            assert_eq!(result["reports"][0]["offset"], 0, "{result}");
        }
    }
    let args = json!({"bootstrap": bootstrap, "conn": conn, "topic": "orders", "partitions": [0, 1, 2],
                      "count": 5, "time": 0});
    let consumed = kafka("consume", args).await;
    assert_eq!(consumed["errors"], json!([]), "{consumed}");
    let mut records = consumed["records"].as_array().unwrap().clone();
    records.sort_by_key(|r| (r["partition"].as_i64(), r["offset"].as_i64()));
    let seen: Vec<_> = records
        .iter()
        .map(|r| {
            (
                r["partition"].clone(),
                r["offset"].clone(),
                r["value"].clone(),
                r["key"].clone(),
            )
        })
        .collect();
    let expected = [
        (0, 0, "zero-a", None),
        (0, 1, "zero-b", None),
        (1, 0, "one", Some("user-1")),
        (2, 0, "all-a", Some("user-2")),
        (2, 1, "all-b", None),
    ]
    .map(|(p, o, v, k)| (json!(p), json!(o), json!(v), json!(k)));
    assert_eq!(seen, expected, "{consumed}");
    let one = &records[2];
    assert_eq!(
        one["headers"],
        json!({"trace": "00ff10", "kind": "6f72646572"}),
        "{one}"
    );
    assert_eq!(one["timestamp"], 1_700_000_000_123_i64, "{one}");
    assert_eq!(
        consumed["watermarks"],
        json!({"0": [0, 2], "1": [0, 1], "2": [0, 2]})
    );
    assert_eq!(
        consumed["times"],
        json!({"0": 0, "1": 0, "2": 0}),
        "{consumed}"
    );
    door.shutdown().await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_record_reaches_the_broker_and_the_python_sdk_with_its_key_and_headers() {
    let hub = TestHub::start(&[("orders", 2)]).await;
    let door = kafka_door(&hub).await;
    let records = json!([{"value": "cross", "key": "user-9", "partition": 1, "timestamp": 1_700_000_000_000_i64,
                          "headers": {"trace": "00ff10"}}]);
    let args = json!({"bootstrap": door.local_addr().to_string(), "conn": hub.conn(&hub.root),
                      "topic": "orders", "acks": "all", "records": records});
    let result = kafka("produce", args).await;
    assert_eq!(result["reports"][0]["error"], Value::Null, "{result}");

    // Through the broker directly: the key is the partition key, headers are bytes properties,
    // the record's time is the timestamp property.
    let events = hub.read_all("orders", 1).await;
    assert_eq!(events.len(), 1);
    let event = &events[0].data;
    assert_eq!(&event.body[..], b"cross");
    assert_eq!(event.partition_key.as_deref(), Some("user-9"));
    let trace = event.property("trace");
    assert_eq!(
        trace,
        Some(&PropertyValue::Bytes(vec![0x00, 0xff, 0x10].into()))
    );
    let time = event.property(tributary_kafka::mapping::TIMESTAMP_PROPERTY);
    assert_eq!(time, Some(&PropertyValue::Timestamp(1_700_000_000_000)));

    // Through the AMQP door, to the official Python SDK.
    let args = json!({"conn": hub.conn(&hub.root), "hub": "orders", "partition": 1, "position": "earliest", "count": 1});
    let consumed = tributary_testkit::run_python("interop.py", "consume", args).await;
    let received = &consumed["events"][0];
    assert_eq!(received["body"], "cross", "{consumed}");
    assert_eq!(received["partition_key"], "user-9", "{consumed}");
    assert_eq!(
        received["properties"]["trace"],
        json!(["bytes", "00ff10"]),
        "{consumed}"
    );
    door.shutdown().await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_another_door_stored_is_consumed_over_kafka() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    let door = kafka_door(&hub).await;
    let event = EventData::new("from-amqp")
        .with_property("s", PropertyValue::String("hello".into()))
        .with_property("n", PropertyValue::Int64(42))
        .with_property("b", PropertyValue::Bytes(vec![0xff].into()));
    let event = EventData {
        partition_key: Some("user-3".into()),
        ..event
    };
    let target = SendTarget::PartitionKey("user-3".into());
    let receipt = hub
        .broker
        .send("orders", target, vec![event])
        .await
        .unwrap();
    let args = json!({"bootstrap": door.local_addr().to_string(), "conn": hub.conn(&hub.root),
                      "topic": "orders", "partitions": [0], "count": 1});
    let consumed = kafka("consume", args).await;
    let record = &consumed["records"][0];
    assert_eq!(record["value"], "from-amqp", "{consumed}");
    assert_eq!(record["key"], "user-3", "{consumed}");
    // As Event Hubs gives them: AMQP-typed values AMQP-encoded (str8 "hello", smalllong 42),
    // bytes as they are.
    let headers = json!({"s": "a10568656c6c6f", "n": "552a", "b": "ff"});
    assert_eq!(record["headers"], headers, "{consumed}");
    // No producer's time: the enqueued time.
    assert_eq!(record["timestamp"], receipt.enqueued_time_ms, "{consumed}");
    door.shutdown().await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_topics_bad_credentials_and_missing_rights_are_refused() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    let door = kafka_door(&hub).await;
    let bootstrap = door.local_addr().to_string();
    let args = json!({"bootstrap": bootstrap, "conn": hub.conn(&hub.root), "topic": "nope"});
    let meta = kafka("metadata", args).await;
    assert_eq!(
        meta["topics"]["nope"]["error"], "UNKNOWN_TOPIC_OR_PART",
        "{meta}"
    );
    assert_eq!(meta["brokers"], json!([bootstrap]), "{meta}");

    let records = json!([{"value": "x", "partition": 0}]);
    // librdkafka fails a record for a topic the cluster says does not exist once the topic's
    // metadata propagation time has passed.
    let extra = json!({"message.timeout.ms": 20_000, "topic.metadata.propagation.max.ms": 500});
    let args = json!({"bootstrap": bootstrap, "conn": hub.conn(&hub.root), "topic": "nope", "acks": "all",
                      "records": records, "extra": extra});
    let produced = kafka("produce", args).await;
    assert_eq!(
        produced["reports"][0]["error"], "UNKNOWN_TOPIC_OR_PART",
        "{produced}"
    );

    let bad = hub.with_key("not-the-key");
    let args = json!({"bootstrap": bootstrap, "conn": bad, "timeout": 5});
    let refused = kafka("metadata", args).await;
    assert!(
        refused["error"].is_string(),
        "bad credentials must fail: {refused}"
    );

    let args = json!({"bootstrap": bootstrap, "conn": hub.conn(&hub.listen), "topic": "orders", "acks": "all",
                      "records": records, "extra": {"message.timeout.ms": 5000}});
    let produced = kafka("produce", args).await;
    assert_eq!(
        produced["reports"][0]["error"], "TOPIC_AUTHORIZATION_FAILED",
        "{produced}"
    );
    assert!(hub.read_all("orders", 0).await.is_empty());
    door.shutdown().await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_polling_fetch_is_woken_by_an_append() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    let door = kafka_door(&hub).await;
    // The consumer's fetches wait up to 20 s; the record must arrive long before.
    let args = json!({"bootstrap": door.local_addr().to_string(), "conn": hub.conn(&hub.root),
                      "topic": "orders", "partition": 0, "wait_ms": 20_000});
    let woken = kafka("wake", args).await;
    assert_eq!(woken["received"]["value"], "wake", "{woken}");
    let seconds = woken["received"]["seconds"].as_f64().unwrap();
    assert!(seconds < 5.0, "the fetch waited {seconds} s: {woken}");
    door.shutdown().await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_development_door_serves_clients_without_sasl() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    let mut config = KafkaConfig::new("127.0.0.1:0".parse().unwrap(), hub.policies.clone());
    config.development_unauthenticated = true;
    let door = tributary_kafka::start(hub.broker.clone(), config)
        .await
        .unwrap();
    let plain = json!({"security.protocol": "PLAINTEXT"});
    let (bootstrap, records) = (
        door.local_addr().to_string(),
        json!([{"value": "open", "partition": 0}]),
    );
    let args = json!({"bootstrap": bootstrap, "conn": "", "topic": "orders", "acks": "1",
                      "records": records, "extra": plain});
    let produced = kafka("produce", args).await;
    assert_eq!(produced["reports"][0]["error"], Value::Null, "{produced}");
    let args = json!({"bootstrap": bootstrap, "conn": "", "topic": "orders", "partitions": [0],
                      "count": 1, "extra": plain});
    let consumed = kafka("consume", args).await;
    assert_eq!(consumed["records"][0]["value"], "open", "{consumed}");
    door.shutdown().await;
    hub.stop().await;
}

/// Writes one request frame and reads the response frame, or `None` when the door closed.
async fn exchange(stream: &mut tokio::net::TcpStream, request: &[u8]) -> Option<Vec<u8>> {
    let len = u32::try_from(request.len()).unwrap();
    stream.write_all(&len.to_be_bytes()).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut len = [0u8; 4];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut len)).await;
    read.expect("an answer or a close").ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut body).await.ok()?;
    Some(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_new_api_versions_gets_the_ranges_and_requests_before_sasl_close_the_connection() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    let door = kafka_door(&hub).await;
    let mut stream = tokio::net::TcpStream::connect(door.local_addr())
        .await
        .unwrap();
    // ApiVersions v99, request header v2: key, version, correlation id, null client id, no
    // tagged fields.
    let api_versions = [0, 18, 0, 99, 0, 0, 0, 7, 0xff, 0xff, 0];
    let answer = exchange(&mut stream, &api_versions)
        .await
        .expect("an answer");
    assert_eq!(
        &answer[..4],
        &[0, 0, 0, 7],
        "the correlation id (header v0)"
    );
    assert_eq!(&answer[4..6], &[0, 35], "UNSUPPORTED_VERSION");
    let count = u32::from_be_bytes(answer[6..10].try_into().unwrap());
    assert_eq!(
        count as usize,
        tributary_kafka::versions::ADVERTISED.len(),
        "a v0 list"
    );
    // Metadata v1 (header v1, null topics) before SASL: the door closes the connection.
    let metadata = [0, 3, 0, 1, 0, 0, 0, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
    assert_eq!(exchange(&mut stream, &metadata).await, None);
    door.shutdown().await;
    hub.stop().await;
}

/// Transactions are not served: a transactional producer is refused at once with an error it
/// reports, never left waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_producer_is_refused_not_left_hanging() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    let door = kafka_door(&hub).await;
    let args = json!({"bootstrap": door.local_addr().to_string(), "conn": hub.conn(&hub.root)});
    let refused = kafka("transactional", args).await;
    assert_eq!(
        refused["error"], "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
        "{refused}"
    );
    assert_eq!(refused["fatal"], true, "{refused}");
    assert!(refused["seconds"].as_f64().unwrap() < 10.0, "{refused}");
    door.shutdown().await;
    hub.stop().await;
}

/// The official Python SDK sends over AMQP; a Kafka consumer reads the same body, with the
/// properties as Event Hubs gives them to Kafka: strings AMQP-encoded, bytes as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_the_python_sdk_sent_over_amqp_is_consumed_over_kafka() {
    let hub = TestHub::start(&[("orders", 3)]).await;
    let door = kafka_door(&hub).await;
    let sent = tributary_testkit::run_python(
        "interop.py",
        "produce",
        json!({"conn": hub.connection_string, "hub": "orders"}),
    )
    .await;
    assert_eq!(sent["ok"], true, "{sent}");
    let args = json!({"bootstrap": door.local_addr().to_string(), "conn": hub.conn(&hub.root),
                      "topic": "orders", "partitions": [2], "count": 1});
    let consumed = kafka("consume", args).await;
    let record = &consumed["records"][0];
    assert_eq!(record["value"], "typed", "{consumed}");
    // str8 "text" with its constructor; the SDK's bytes as they are.
    assert_eq!(record["headers"]["str"], "a10474657874", "{consumed}");
    assert_eq!(record["headers"]["bytes"], "0001", "{consumed}");
    assert_eq!(record["headers"]["none"], Value::Null, "{consumed}");
    let stored = hub.broker.read("orders", "2", 0, 1, 0).unwrap();
    assert_eq!(
        record["timestamp"], stored[0].enqueued_time_ms,
        "{consumed}"
    );
    door.shutdown().await;
    hub.stop().await;
}
