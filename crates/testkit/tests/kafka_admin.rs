//! Topic administration and lz4/zstd batches through the Kafka door with a real Kafka client:
//! confluent-kafka's AdminClient, Producer and Consumer (librdkafka), driven by
//! `tests/python/kafka_admin.py` with `<repo>/.venv/bin/python` (installed by
//! `scripts/setup-kafka-interop`; a missing client FAILS these tests, it never skips them).
//!
//! Each test starts a hub (broker and AMQP door, `TestHub`) and the Kafka door beside it on
//! 127.0.0.1:0, over the same broker and shared access policies.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tributary_kafka::{KafkaConfig, RunningKafkaServer};
use tributary_testkit::TestHub;

/// The Kafka door over `hub`'s broker and policies, SASL required.
async fn kafka_door(hub: &TestHub) -> RunningKafkaServer {
    let config = KafkaConfig::new("127.0.0.1:0".parse().unwrap(), hub.policies.clone());
    tributary_kafka::start(hub.broker.clone(), config)
        .await
        .expect("the Kafka door starts")
}

async fn admin(command: &str, args: Value) -> Value {
    tributary_testkit::run_python("kafka_admin.py", command, args).await
}

/// The arguments every scenario takes, with `more` merged in.
fn args(door: &RunningKafkaServer, conn: &str, more: Value) -> Value {
    let mut args = json!({"bootstrap": door.local_addr().to_string(), "conn": conn});
    args.as_object_mut()
        .unwrap()
        .extend(more.as_object().unwrap().clone());
    args
}

/// The configs of "events" (created with retention.ms 3600000) as librdkafka reports them.
fn assert_events_configs(described: &Value) {
    let configs = &described["configs"];
    let expected = [
        ("retention.ms", "3600000", "DYNAMIC_TOPIC_CONFIG"),
        ("retention.bytes", "-1", "DEFAULT_CONFIG"),
        ("cleanup.policy", "delete", "DEFAULT_CONFIG"),
        ("max.message.bytes", "1048576", "DEFAULT_CONFIG"),
        ("message.timestamp.type", "CreateTime", "DEFAULT_CONFIG"),
        ("min.insync.replicas", "1", "DEFAULT_CONFIG"),
        ("compression.type", "producer", "DEFAULT_CONFIG"),
    ];
    for (name, value, source) in expected {
        assert_eq!(configs[name]["value"], value, "{name}: {described}");
        assert_eq!(configs[name]["source"], source, "{name}: {described}");
        assert_eq!(configs[name]["read_only"], false, "{name}: {described}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_client_creates_describes_and_deletes_a_topic() {
    let hub = TestHub::start(&[]).await;
    let door = kafka_door(&hub).await;
    let root = hub.conn(&hub.root);
    let topics = json!([{"name": "events", "partitions": 3, "replication": 1,
                         "config": {"retention.ms": "3600000", "cleanup.policy": "delete"}},
                        {"name": "defaults"}]);
    let created = admin(
        "create_topics",
        args(&door, &root, json!({"topics": topics})),
    )
    .await;
    assert_eq!(
        created["results"],
        json!({"events": null, "defaults": null}),
        "{created}"
    );
    let events = hub.broker.describe_hub("events").unwrap();
    assert_eq!(events.partition_count, 3);
    assert_eq!(events.retention_age_ms, Some(3_600_000));
    // -1 partitions: Kafka's num.partitions default, 1.
    assert_eq!(
        hub.broker.describe_hub("defaults").unwrap().partition_count,
        1
    );
    let listed = admin("partitions", args(&door, &root, json!({"topic": "events"}))).await;
    assert_eq!(listed["partitions"], 3, "{listed}");

    let described = admin(
        "describe_configs",
        args(&door, &root, json!({"topic": "events"})),
    )
    .await;
    assert_events_configs(&described);

    let grown = admin(
        "create_partitions",
        args(&door, &root, json!({"topic": "events", "count": 6})),
    )
    .await;
    let refusal = &grown["results"]["events"];
    assert_eq!(refusal["error"], "INVALID_PARTITIONS", "{grown}");
    assert!(
        refusal["message"]
            .as_str()
            .unwrap()
            .contains("fixed when it is created"),
        "{grown}"
    );
    assert_eq!(
        hub.broker.describe_hub("events").unwrap().partition_count,
        3
    );

    let deleted = admin(
        "delete_topics",
        args(&door, &root, json!({"topics": ["events"]})),
    )
    .await;
    assert_eq!(deleted["results"], json!({"events": null}), "{deleted}");
    assert!(hub.broker.describe_hub("events").is_err());
    let again = admin(
        "delete_topics",
        args(&door, &root, json!({"topics": ["events"]})),
    )
    .await;
    assert_eq!(
        again["results"]["events"]["error"], "UNKNOWN_TOPIC_OR_PART",
        "{again}"
    );
    door.shutdown().await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_a_hub_cannot_honour_or_that_exist_are_refused_and_validate_only_changes_nothing() {
    let hub = TestHub::start(&[("orders", 2)]).await;
    let door = kafka_door(&hub).await;
    let root = hub.conn(&hub.root);
    let topics = json!([
        {"name": "orders", "partitions": 2},
        {"name": "shredded", "partitions": 1, "config": {"cleanup.policy": "shred"}},
        {"name": "replicated", "partitions": 1, "replication": 3},
        {"name": "empty", "partitions": 0},
    ]);
    let refused = admin(
        "create_topics",
        args(&door, &root, json!({"topics": topics})),
    )
    .await;
    let results = &refused["results"];
    assert_eq!(
        results["orders"]["error"], "TOPIC_ALREADY_EXISTS",
        "{refused}"
    );
    assert_eq!(results["shredded"]["error"], "INVALID_CONFIG", "{refused}");
    assert!(
        results["shredded"]["message"]
            .as_str()
            .unwrap()
            .contains("cleanup.policy=shred"),
        "{refused}"
    );
    assert_eq!(
        results["replicated"]["error"], "INVALID_REPLICATION_FACTOR",
        "{refused}"
    );
    assert_eq!(results["empty"]["error"], "INVALID_PARTITIONS", "{refused}");
    for name in ["shredded", "replicated", "empty"] {
        assert!(hub.broker.describe_hub(name).is_err(), "{name} was created");
    }
    assert_eq!(
        hub.broker.describe_hub("orders").unwrap().partition_count,
        2
    );

    let dry = json!({"topics": [{"name": "dry", "partitions": 4}], "validate_only": true});
    let validated = admin("create_topics", args(&door, &root, dry)).await;
    assert_eq!(validated["results"], json!({"dry": null}), "{validated}");
    assert!(hub.broker.describe_hub("dry").is_err());
    door.shutdown().await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logins_without_manage_may_describe_but_not_create_delete_or_grow() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    let door = kafka_door(&hub).await;
    let listen = hub.conn(&hub.listen);
    let topics = json!({"topics": [{"name": "mine", "partitions": 1}]});
    let created = admin("create_topics", args(&door, &listen, topics)).await;
    assert_eq!(
        created["results"]["mine"]["error"], "TOPIC_AUTHORIZATION_FAILED",
        "{created}"
    );
    assert!(hub.broker.describe_hub("mine").is_err());
    let deleted = admin(
        "delete_topics",
        args(&door, &listen, json!({"topics": ["orders"]})),
    )
    .await;
    assert_eq!(
        deleted["results"]["orders"]["error"], "TOPIC_AUTHORIZATION_FAILED",
        "{deleted}"
    );
    assert!(hub.broker.describe_hub("orders").is_ok());
    let grown = admin(
        "create_partitions",
        args(&door, &listen, json!({"topic": "orders", "count": 2})),
    )
    .await;
    assert_eq!(
        grown["results"]["orders"]["error"], "TOPIC_AUTHORIZATION_FAILED",
        "{grown}"
    );

    // Listen describes; Send alone does not.
    let described = admin(
        "describe_configs",
        args(&door, &listen, json!({"topic": "orders"})),
    )
    .await;
    assert_eq!(
        described["configs"]["retention.ms"]["value"], "86400000",
        "{described}"
    );
    let cluster = admin("describe_cluster", args(&door, &listen, json!({}))).await;
    assert_eq!(
        cluster["operations"],
        json!(["DESCRIBE", "DESCRIBE_CONFIGS"]),
        "{cluster}"
    );
    let send = hub.conn(&hub.send);
    let described = admin(
        "describe_configs",
        args(&door, &send, json!({"topic": "orders"})),
    )
    .await;
    assert_eq!(
        described["error"], "TOPIC_AUTHORIZATION_FAILED",
        "{described}"
    );
    let broker = admin(
        "describe_configs",
        args(&door, &send, json!({"broker": "0"})),
    )
    .await;
    assert_eq!(broker["error"], "CLUSTER_AUTHORIZATION_FAILED", "{broker}");
    let cluster = admin("describe_cluster", args(&door, &send, json!({}))).await;
    assert_eq!(
        cluster["operations"],
        json!(["IDEMPOTENT_WRITE"]),
        "{cluster}"
    );
    door.shutdown().await;
    hub.stop().await;
}

/// `ops` applied to topic "orders" by IncrementalAlterConfigs with login `conn`: the outcome.
async fn alter_orders(door: &RunningKafkaServer, conn: &str, ops: Value, validate: bool) -> Value {
    let more = json!({"topic": "orders", "ops": ops, "validate_only": validate});
    admin("incremental_alter_configs", args(door, conn, more)).await["result"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_client_alters_a_topics_configs_incrementally_or_whole() {
    use tributary_broker::CleanupPolicy;
    let hub = TestHub::start(&[("orders", 2)]).await;
    let door = kafka_door(&hub).await;
    let root = hub.conn(&hub.root);
    let orders = || hub.broker.describe_hub("orders").unwrap();

    let ops = json!([
        ["SET", "retention.ms", "7200000"],
        ["APPEND", "cleanup.policy", "compact"],
        ["SET", "min.compaction.lag.ms", "60000"]
    ]);
    assert_eq!(alter_orders(&door, &root, ops, false).await, Value::Null);
    let altered = orders();
    assert_eq!(altered.retention_age_ms, Some(7_200_000));
    assert_eq!(altered.cleanup.policy, CleanupPolicy::DeleteOrCompact);
    assert_eq!(altered.cleanup.min_compaction_lag_ms, 60_000);
    let described = admin(
        "describe_configs",
        args(&door, &root, json!({"topic": "orders"})),
    )
    .await;
    let policy = &described["configs"]["cleanup.policy"];
    assert_eq!(policy["value"], "delete,compact", "{described}");
    assert_eq!(policy["source"], "DYNAMIC_TOPIC_CONFIG", "{described}");

    // SUBTRACT leaves compact; DELETE takes retention.ms back to its default, one day.
    let ops = json!([
        ["SUBTRACT", "cleanup.policy", "delete"],
        ["DELETE", "retention.ms"]
    ]);
    assert_eq!(alter_orders(&door, &root, ops, false).await, Value::Null);
    assert_eq!(orders().cleanup.policy, CleanupPolicy::Compact);
    assert_eq!(orders().retention_age_ms, Some(86_400_000));

    // AlterConfigs replaces the whole set: what it does not name goes back to its default.
    let more = json!({"topic": "orders", "configs": {"retention.ms": "3600000"}});
    let replaced = admin("alter_configs", args(&door, &root, more)).await;
    assert_eq!(replaced["result"], Value::Null, "{replaced}");
    let replaced = orders();
    assert_eq!(replaced.retention_age_ms, Some(3_600_000));
    assert_eq!(replaced.cleanup.policy, CleanupPolicy::Delete);
    assert_eq!(replaced.cleanup.min_compaction_lag_ms, 0);
    door.shutdown().await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn altering_configs_a_hub_cannot_honour_or_without_manage_changes_nothing() {
    let hub = TestHub::start(&[("orders", 2)]).await;
    let door = kafka_door(&hub).await;
    let root = hub.conn(&hub.root);
    let orders = || hub.broker.describe_hub("orders").unwrap();
    // Refused whole: a fixed config at another value, APPEND on a config that is no list, an
    // unknown config, a login without Manage, the broker's configs. Nothing changes.
    let before = orders();
    let refusals = [
        (
            json!([
                ["SET", "retention.ms", "1000"],
                ["SET", "max.message.bytes", "5"]
            ]),
            &root,
            "INVALID_CONFIG",
            "max.message.bytes=5",
        ),
        (
            json!([["APPEND", "retention.ms", "5"]]),
            &root,
            "INVALID_CONFIG",
            "list configs",
        ),
        (
            json!([["SET", "segment.jitter.ms", "5"]]),
            &root,
            "INVALID_CONFIG",
            "segment.jitter.ms",
        ),
        (
            json!([["SET", "retention.ms", "1000"]]),
            &hub.conn(&hub.listen),
            "TOPIC_AUTHORIZATION_FAILED",
            "Manage",
        ),
    ];
    for (ops, conn, error, says) in refusals {
        let refused = alter_orders(&door, conn, ops.clone(), false).await;
        assert_eq!(refused["error"], error, "{ops}: {refused}");
        assert!(
            refused["message"].as_str().unwrap().contains(says),
            "{ops}: {refused}"
        );
        assert_eq!(orders(), before, "{ops}");
    }
    let more = json!({"broker": "0", "ops": [["SET", "log.retention.ms", "5"]]});
    let broker = admin("incremental_alter_configs", args(&door, &root, more)).await;
    assert_eq!(broker["result"]["error"], "INVALID_REQUEST", "{broker}");

    // validate_only checks and changes nothing; a bad value is still refused.
    let ops = json!([["SET", "retention.ms", "1000"]]);
    assert_eq!(alter_orders(&door, &root, ops, true).await, Value::Null);
    assert_eq!(orders(), before);
    let bad = alter_orders(&door, &root, json!([["SET", "retention.ms", "0"]]), true).await;
    assert_eq!(bad["error"], "INVALID_CONFIG", "{bad}");

    door.shutdown().await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_is_this_one_node_with_its_broker_configs() {
    let hub = TestHub::start(&[]).await;
    let door = kafka_door(&hub).await;
    let root = hub.conn(&hub.root);
    let cluster = admin("describe_cluster", args(&door, &root, json!({}))).await;
    assert_eq!(
        cluster["cluster_id"],
        tributary_kafka::metadata::CLUSTER_ID,
        "{cluster}"
    );
    assert_eq!(cluster["controller"], 0, "{cluster}");
    let node = format!("0@{}", door.local_addr());
    assert_eq!(cluster["nodes"], json!([node]), "{cluster}");
    let operations = json!([
        "ALTER",
        "CREATE",
        "DESCRIBE",
        "DESCRIBE_CONFIGS",
        "IDEMPOTENT_WRITE"
    ]);
    assert_eq!(cluster["operations"], operations, "{cluster}");

    let broker = admin(
        "describe_configs",
        args(&door, &root, json!({"broker": "0"})),
    )
    .await;
    let configs = &broker["configs"];
    assert_eq!(configs["num.partitions"]["value"], "1", "{broker}");
    assert_eq!(configs["message.max.bytes"]["value"], "1048576", "{broker}");
    assert_eq!(
        configs["auto.create.topics.enable"]["value"], "false",
        "{broker}"
    );
    assert_eq!(configs["num.partitions"]["read_only"], true, "{broker}");
    door.shutdown().await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lz4_and_zstd_batches_are_stored_and_consumed_back_byte_for_byte() {
    let hub = TestHub::start(&[("packed", 2)]).await;
    let door = kafka_door(&hub).await;
    let root = hub.conn(&hub.root);
    // Repetitive values so the codecs really compress, one per partition and codec.
    let value = |codec: &str, i: usize| format!("{codec}-{i}-{}", "abcdefgh".repeat(64));
    for (partition, codec) in ["lz4", "zstd"].into_iter().enumerate() {
        let records: Vec<Value> = (0..20)
            .map(|i| json!({"value": value(codec, i), "key": format!("k{i}"), "partition": partition}))
            .collect();
        let more = json!({"topic": "packed", "acks": "all", "records": records,
                          "extra": {"compression.type": codec, "linger.ms": 50}});
        let produced = admin("produce", args(&door, &root, more)).await;
        assert_eq!(produced["unflushed"], 0, "{codec}: {produced}");
        for report in produced["reports"].as_array().unwrap() {
            assert_eq!(report["error"], Value::Null, "{codec}: {produced}");
        }
        let stored = hub.read_all("packed", partition as u32).await;
        assert_eq!(stored.len(), 20, "{codec}");
        assert_eq!(&stored[7].data.body[..], value(codec, 7).as_bytes());
    }
    let more = json!({"topic": "packed", "partitions": [0, 1], "count": 40});
    let consumed = admin("consume", args(&door, &root, more)).await;
    assert_eq!(consumed["errors"], json!([]), "{consumed}");
    let records = consumed["records"].as_array().unwrap();
    assert_eq!(records.len(), 40, "{consumed}");
    for record in records {
        let codec = if record["partition"] == 0 {
            "lz4"
        } else {
            "zstd"
        };
        let i = record["offset"].as_u64().unwrap() as usize;
        assert_eq!(record["value"], value(codec, i), "{record}");
        assert_eq!(record["key"], format!("k{i}"), "{record}");
    }
    door.shutdown().await;
    hub.stop().await;
}

/// Writes one request frame and reads the response frame.
async fn exchange(stream: &mut tokio::net::TcpStream, request: &[u8]) -> Vec<u8> {
    let len = u32::try_from(request.len()).unwrap();
    stream.write_all(&len.to_be_bytes()).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut len = [0u8; 4];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut len)).await;
    read.expect("an answer in time").expect("an answer");
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut body).await.unwrap();
    body
}

/// librdkafka describes the cluster through Metadata; Java's AdminClient (and newer clients)
/// send DescribeCluster itself, written here byte by byte to a development door.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_cluster_itself_names_this_node_as_broker_and_controller() {
    let hub = TestHub::start(&[]).await;
    let mut config = KafkaConfig::new("127.0.0.1:0".parse().unwrap(), hub.policies.clone());
    config.development_unauthenticated = true;
    let door = tributary_kafka::start(hub.broker.clone(), config)
        .await
        .unwrap();
    let mut stream = tokio::net::TcpStream::connect(door.local_addr())
        .await
        .unwrap();
    // DescribeCluster (60) v0, header v2: key, version, correlation id 9, null client id, no
    // tagged fields; body: include_cluster_authorized_operations true, no tagged fields.
    let request = [0, 60, 0, 0, 0, 0, 0, 9, 0xff, 0xff, 0, 1, 0];
    let answer = exchange(&mut stream, &request).await;
    // Header v1: correlation id, no tagged fields.
    assert_eq!(&answer[..5], &[0, 0, 0, 9, 0], "{answer:?}");
    let body = &answer[5..];
    assert_eq!(&body[4..6], &[0, 0], "error code: {answer:?}");
    assert_eq!(body[6], 0, "a null error message: {answer:?}");
    // The cluster id, a compact string: its length plus one, then its bytes.
    let id = tributary_kafka::metadata::CLUSTER_ID.as_bytes();
    assert_eq!(usize::from(body[7]), id.len() + 1, "{answer:?}");
    assert_eq!(&body[8..8 + id.len()], id, "{answer:?}");
    let rest = &body[8 + id.len()..];
    assert_eq!(&rest[..4], &[0, 0, 0, 0], "controller 0: {answer:?}");
    assert_eq!(rest[4], 2, "one broker: {answer:?}");
    assert_eq!(&rest[5..9], &[0, 0, 0, 0], "broker 0: {answer:?}");
    let host = b"127.0.0.1";
    assert_eq!(&rest[10..10 + host.len()], host, "{answer:?}");
    let port = &rest[10 + host.len()..14 + host.len()];
    let port = u32::from_be_bytes(port.try_into().unwrap());
    assert_eq!(port, u32::from(door.local_addr().port()), "{answer:?}");
    door.shutdown().await;
    hub.stop().await;
}
