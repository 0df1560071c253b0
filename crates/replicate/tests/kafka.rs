//! Replication tasks with Kafka on either side, against real Kafka-compatible brokers — Tansu
//! (one per test binary) and Tributary's own Kafka door (reached with a connection string, as
//! Event Hubs' Kafka endpoint is): Kafka → hub → Kafka, every record arrives once per hop with
//! its key, headers and CreateTime, one key's records in order, the `repl-*` metadata stamped
//! as headers; and task files with a Kafka endpoint are checked like any other.
#![cfg(feature = "kafka")]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use tributary_amqp::{AccessPolicies, AccessPolicy, Right};
use tributary_broker::{Broker, BrokerConfig, HubSpec};
use tributary_event::{EventPosition, PropertyValue, ReceivedEvent};
use tributary_kafka_source::tansu::Tansu;
use tributary_kafka_source::test_cluster::{TestCluster, TestRecord};
use tributary_kafka_source::{KafkaOptions, KafkaSource};
use tributary_replicate::metadata::{ORIGIN, PATH};
use tributary_replicate::{Brokers, Replicator, StartOptions, TaskConfig};
use tributary_source::{PartitionSource, ReceiverOptions};

const PARTITIONS: i32 = 3;
const PER_KEY: usize = 5;

fn task(dir: &Path, name: &str, text: &str) -> TaskConfig {
    let file = dir.join(format!("{name}.toml"));
    std::fs::write(&file, text).unwrap();
    TaskConfig::load(&file).unwrap_or_else(|e| panic!("{e}"))
}

/// A cluster the tasks copy from and to, and the task file keys that log into it.
struct Cluster {
    test: TestCluster,
    login: String,
}

fn kafka_to_hub(dir: &Path, cluster: &Cluster) -> String {
    format!(
        r#"name = "kafka-to-hub"
[source]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
{login}
topic = "rt-source"
[[target]]
name = "hub"
data_dir = "{data}"
event_hub = "middle"
[processor]
load_balancing_interval = "200ms"
ownership_expiration = "2s"
"#,
        bootstrap = cluster.test.bootstrap_servers(),
        login = cluster.login,
        data = dir.join("hub").display()
    )
}

fn hub_to_kafka(dir: &Path, cluster: &Cluster) -> String {
    format!(
        r#"name = "hub-to-kafka"
[source]
data_dir = "{data}"
event_hub = "middle"
[[target]]
name = "back"
kind = "kafka"
bootstrap_servers = "{bootstrap}"
{login}
topic = "rt-back"
[processor]
load_balancing_interval = "200ms"
ownership_expiration = "2s"
"#,
        bootstrap = cluster.test.bootstrap_servers(),
        login = cluster.login,
        data = dir.join("hub").display()
    )
}

/// Five records for each of three keys, each key on its own partition.
async fn produce(cluster: &TestCluster) {
    for p in 0..PARTITIONS {
        let records: Vec<TestRecord> = (0..PER_KEY)
            .map(|i| TestRecord {
                key: Some(format!("key-{p}").into_bytes()),
                value: format!("key-{p}/{i}").into_bytes(),
                headers: vec![("trace".to_owned(), Some(format!("t{p}{i}").into_bytes()))],
                timestamp_ms: Some(1_700_000_000_000 + i64::from(p) * 100 + i as i64),
            })
            .collect();
        cluster.produce("rt-source", p, &records).await;
    }
}

/// Reads the topic's partitions until `n` records came; every record.
async fn read_topic(cluster: &TestCluster, topic: &str, n: usize) -> Vec<ReceivedEvent> {
    let source = KafkaSource::new(cluster.options(), topic).unwrap();
    let mut receivers = Vec::new();
    for p in 0..PARTITIONS {
        let options = ReceiverOptions {
            partition_id: p.to_string(),
            consumer_group: "$Default".to_owned(),
            start: EventPosition::Earliest,
            owner_level: None,
            prefetch: 100,
            track_last_enqueued: false,
        };
        receivers.push(source.open_receiver(options).await.unwrap());
    }
    let mut read = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while read.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {n}: {read:?}",
            read.len()
        );
        for receiver in &mut receivers {
            read.extend(
                receiver
                    .receive(100, Duration::from_millis(100))
                    .await
                    .unwrap(),
            );
        }
    }
    // Nothing more arrives: each record came once.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for receiver in &mut receivers {
        let more = receiver
            .receive(100, Duration::from_millis(200))
            .await
            .unwrap();
        assert!(more.is_empty(), "duplicates: {more:?}");
    }
    read
}

fn text(value: Option<&PropertyValue>) -> String {
    match value {
        Some(PropertyValue::Bytes(bytes)) => String::from_utf8(bytes.to_vec()).unwrap(),
        Some(PropertyValue::String(s)) => s.to_string(),
        other => panic!("not text: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tansu_to_hub_to_tansu_keeps_keys_headers_times_and_order() {
    let cluster = Cluster {
        test: (**Tansu::shared()).clone(),
        login: String::new(),
    };
    kafka_to_hub_to_kafka_keeps_keys_headers_times_and_order(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_door_to_hub_to_kafka_door_keeps_keys_headers_times_and_order() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::open(BrokerConfig::new(dir.path())).await.unwrap();
    let rights = vec![Right::Manage, Right::Send, Right::Listen];
    let policy = AccessPolicy::generate("RootManageSharedAccessKey", rights).unwrap();
    let policies = AccessPolicies::new(vec![policy.clone()]).unwrap();
    let config = tributary_kafka::KafkaConfig::new("127.0.0.1:0".parse().unwrap(), policies);
    let door = tributary_kafka::start(broker, config).await.unwrap();
    let address = door.local_addr();
    let connection_string = tributary_amqp::connection_string("127.0.0.1", address.port(), &policy);
    let mut options = KafkaOptions::from_event_hubs_connection_string(&connection_string).unwrap();
    options.bootstrap_servers = address.to_string();
    let cluster = Cluster {
        test: TestCluster::new(options),
        login: format!("connection_string = \"{connection_string}\""),
    };
    kafka_to_hub_to_kafka_keeps_keys_headers_times_and_order(&cluster).await;
    door.shutdown().await;
}

/// Kafka → hub → Kafka through two tasks, on `cluster`.
async fn kafka_to_hub_to_kafka_keeps_keys_headers_times_and_order(cluster: &Cluster) {
    cluster.test.create_topic("rt-source", PARTITIONS).await;
    cluster.test.create_topic("rt-back", PARTITIONS).await;
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::open(BrokerConfig::new(dir.path().join("hub")))
        .await
        .unwrap();
    broker.create_hub(HubSpec::new("middle", 3)).await.unwrap();
    let brokers = Brokers::default();
    brokers.adopt(broker.clone()).await;
    produce(&cluster.test).await;
    let mut running = Vec::new();
    for text in [
        kafka_to_hub(dir.path(), cluster),
        hub_to_kafka(dir.path(), cluster),
    ] {
        let name = if running.is_empty() { "one" } else { "two" };
        let config = task(dir.path(), name, &text);
        let options = StartOptions {
            brokers: brokers.clone(),
            ..StartOptions::default()
        };
        running.push(Replicator::start(&config, options).await.expect("starts"));
    }

    let total = PARTITIONS as usize * PER_KEY;
    let back = read_topic(&cluster.test, "rt-back", total).await;
    assert_eq!(back.len(), total);
    let mut by_key: BTreeMap<String, Vec<&ReceivedEvent>> = BTreeMap::new();
    for event in &back {
        let key = event.data.partition_key.clone().expect("the key is kept");
        by_key.entry(key).or_default().push(event);
    }
    assert_eq!(by_key.len(), PARTITIONS as usize);
    for (key, events) in &by_key {
        let p: i64 = key.trim_start_matches("key-").parse().unwrap();
        // One key's records stay in order (they all went to one partition).
        let bodies: Vec<String> = events
            .iter()
            .map(|e| String::from_utf8(e.data.body.to_vec()).unwrap())
            .collect();
        let expected: Vec<String> = (0..PER_KEY).map(|i| format!("{key}/{i}")).collect();
        assert_eq!(bodies, expected);
        for (i, event) in events.iter().enumerate() {
            assert_eq!(text(event.data.property("trace")), format!("t{p}{i}"));
            assert_eq!(
                event.enqueued_time_ms,
                1_700_000_000_000 + p * 100 + i as i64
            );
            let origin = text(event.data.property(ORIGIN));
            assert!(origin.ends_with("/rt-source"), "{origin}");
            let path = text(event.data.property(PATH));
            assert!(path.contains("/rt-source"), "{path}");
        }
    }
    // The hub in the middle holds each record once too.
    let mut in_hub = 0;
    for p in 0..3 {
        in_hub += broker
            .read("middle", &p.to_string(), 0, 1000, 1 << 20)
            .unwrap()
            .len();
    }
    assert_eq!(in_hub, total);
    for replicator in running {
        replicator.shutdown().await.expect("stops");
    }
}

#[test]
fn a_kafka_endpoint_is_checked_like_any_other() {
    let dir = tempfile::tempdir().unwrap();
    let check = |source: &str| {
        let text = format!(
            "name = \"t\"\n[source]\n{source}\n[[target]]\nname = \"x\"\ndata_dir = \"d\"\nevent_hub = \"h\"\n"
        );
        let file = dir.path().join("t.toml");
        std::fs::write(&file, text).unwrap();
        TaskConfig::load(&file).map(drop).map_err(|e| e.to_string())
    };
    let fine = "kind = \"kafka\"\nbootstrap_servers = \"k:9092\"\ntopic = \"orders\"";
    assert_eq!(check(fine), Ok(()));
    let error = check("kind = \"kafka\"\ntopic = \"orders\"").unwrap_err();
    assert!(error.contains("source.bootstrap_servers"), "{error}");
    let error = check(&format!("{fine}\ndata_dir = \"d\"")).unwrap_err();
    assert!(
        error.contains("\"data_dir\" does not belong in a Kafka endpoint"),
        "{error}"
    );
    let error =
        check("kind = \"kafka\"\nbootstrap_servers = \"k:1\"\ntopic = \"a b\"").unwrap_err();
    assert!(error.contains("not a Kafka topic name"), "{error}");
    let error = check(&format!("{fine}\nsasl_username = \"u\"")).unwrap_err();
    assert!(error.contains("source.sasl_password_env"), "{error}");
    let error = check(&format!(
        "{fine}\nsasl_mechanism = \"GSSAPI\"\nsasl_username = \"u\"\nsasl_password_env = \"PATH\""
    ))
    .unwrap_err();
    assert!(
        error.contains("not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
        "{error}"
    );
    let error =
        check("bootstrap_servers = \"k:9092\"\nevent_hub = \"h\"\ndata_dir = \"d\"").unwrap_err();
    assert!(
        error.contains("\"bootstrap_servers\" does not belong"),
        "{error}"
    );
}
