//! The Kafka source against real Kafka-compatible brokers — a Tansu broker and Tributary's own
//! Kafka door, each started once per test binary, every test run on both: the topic's
//! partitions and watermarks from metadata, records mapped to events as the Kafka door maps
//! them, every start position, the epoch rules among one source's receivers, and the errors a
//! missing topic or partition gives; events the producer sends read back with their keys (one
//! key, one partition, in order), headers and times.
//!
//! The door is reached as Event Hubs' Kafka endpoint is: SASL PLAIN with `$ConnectionString`
//! and a connection string of a policy with Manage (topics are created through the admin API).
#![cfg(feature = "kafka")]

use std::sync::OnceLock;
use std::time::Duration;

use tributary_amqp::{AccessPolicies, AccessPolicy, Right};
use tributary_broker::{Broker, BrokerConfig};
use tributary_event::{EventData, EventPosition, PropertyValue, ReceivedEvent};
use tributary_kafka::KafkaConfig;
use tributary_kafka_source::mapping::{KEY_PROPERTY, TIMESTAMP_PROPERTY};
use tributary_kafka_source::tansu::Tansu;
use tributary_kafka_source::test_cluster::{TestCluster, TestRecord};
use tributary_kafka_source::{
    Destination, KafkaOptions, KafkaProducer, KafkaSource, PartitionExtent, ProduceError,
};
use tributary_source::{PartitionReceiver, PartitionSource, ReceiverOptions, SourceError};

/// Runs each named test (an `async fn(&'static TestCluster)`) on Tansu and on the door.
macro_rules! on_every_cluster {
    ($($test:ident),* $(,)?) => {
        mod tansu {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::Tansu::shared()).await;
                }
            )*
        }
        mod door {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::door()).await;
                }
            )*
        }
    };
}

on_every_cluster!(
    partitions_and_watermarks_come_from_the_cluster,
    a_record_becomes_an_event_with_its_key_headers_and_create_time,
    every_start_position_is_resolved_against_the_partition,
    latest_is_what_is_appended_after_the_receiver_opened,
    a_higher_owner_level_disconnects_a_lower_one_of_the_same_source,
    the_last_enqueued_event_follows_the_high_watermark,
    a_missing_topic_or_partition_is_not_found,
    the_producer_sends_keys_headers_and_times_that_read_back,
    a_send_to_a_missing_partition_is_a_configuration_error,
);

/// Tributary's Kafka door over a broker of its own, started on first use on a thread (and
/// runtime) that lives as long as the test binary, as Tansu's process does.
fn door() -> &'static TestCluster {
    static DOOR: OnceLock<TestCluster> = OnceLock::new();
    DOOR.get_or_init(|| {
        let (started, cluster) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime for the door");
            runtime.block_on(async move {
                let dir = tempfile::tempdir().expect("a data directory");
                let broker = Broker::open(BrokerConfig::new(dir.path()))
                    .await
                    .expect("the broker opens");
                let rights = vec![Right::Manage, Right::Send, Right::Listen];
                let policy = AccessPolicy::generate("RootManageSharedAccessKey", rights).unwrap();
                let policies = AccessPolicies::new(vec![policy.clone()]).unwrap();
                let config = KafkaConfig::new("127.0.0.1:0".parse().unwrap(), policies);
                let door = tributary_kafka::start(broker, config)
                    .await
                    .expect("the Kafka door starts");
                let address = door.local_addr();
                let connection_string =
                    tributary_amqp::connection_string("127.0.0.1", address.port(), &policy);
                let mut options =
                    KafkaOptions::from_event_hubs_connection_string(&connection_string).unwrap();
                options.bootstrap_servers = address.to_string();
                started.send(TestCluster::new(options)).unwrap();
                // The door, its broker and their directory stay until the process ends.
                std::future::pending::<()>().await;
                drop((door, dir));
            });
        });
        cluster.recv().expect("the door started")
    })
}

/// How long a test waits for records it knows are there.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

async fn topic(cluster: &TestCluster, name: &str, partitions: i32) -> KafkaSource {
    cluster.create_topic(name, partitions).await;
    KafkaSource::new(cluster.options(), name).expect("a source")
}

fn bodies(prefix: &str, n: usize) -> Vec<TestRecord> {
    (0..n)
        .map(|i| TestRecord {
            value: format!("{prefix}-{i}").into_bytes(),
            ..TestRecord::default()
        })
        .collect()
}

fn options(partition: &str, start: EventPosition, owner_level: Option<i64>) -> ReceiverOptions {
    ReceiverOptions {
        partition_id: partition.to_owned(),
        consumer_group: "$Default".to_owned(),
        start,
        owner_level,
        prefetch: 300,
        track_last_enqueued: false,
    }
}

/// Receives until `n` events came (failing after [`READ_TIMEOUT`]).
async fn read_n(receiver: &mut dyn PartitionReceiver, n: usize) -> Vec<ReceivedEvent> {
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + READ_TIMEOUT;
    while events.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {} of {n} events within {READ_TIMEOUT:?}",
            events.len()
        );
        let batch = receiver
            .receive(n - events.len(), Duration::from_millis(500))
            .await
            .expect("receive");
        events.extend(batch);
    }
    events
}

fn body(event: &ReceivedEvent) -> &str {
    std::str::from_utf8(&event.data.body).expect("UTF-8 body")
}

async fn partitions_and_watermarks_come_from_the_cluster(cluster: &TestCluster) {
    let source = topic(cluster, "metadata", 3).await;
    assert_eq!(
        source.fully_qualified_namespace(),
        cluster.bootstrap_servers()
    );
    assert_eq!(source.event_hub_name(), "metadata");
    assert_eq!(source.partition_ids().await.unwrap(), ["0", "1", "2"]);
    let offsets = cluster.produce("metadata", 1, &bodies("m", 5)).await;
    assert_eq!(offsets, [0, 1, 2, 3, 4]);
    let extent = source.partition_extent("1").await.unwrap();
    assert_eq!(
        extent,
        PartitionExtent {
            beginning_offset: 0,
            end_offset: 5
        }
    );
    assert_eq!(extent.last_offset(), Some(4));
    assert_eq!(
        source.partition_extent("0").await.unwrap().last_offset(),
        None
    );
}

async fn a_record_becomes_an_event_with_its_key_headers_and_create_time(cluster: &TestCluster) {
    let source = topic(cluster, "mapping", 1).await;
    let records = [
        TestRecord {
            key: Some(b"user-1".to_vec()),
            value: b"first".to_vec(),
            headers: vec![
                ("trace".to_owned(), Some(b"\x00\xff".to_vec())),
                ("empty".to_owned(), None),
            ],
            timestamp_ms: Some(1_700_000_000_123),
        },
        TestRecord {
            key: Some(b"\xff\xfe".to_vec()),
            value: b"second".to_vec(),
            headers: vec![],
            timestamp_ms: Some(1_700_000_000_456),
        },
    ];
    // Twice over: a batch's first record and the ones librdkafka already holds after it are
    // read by different calls, and each pair checks both ways.
    let twice: Vec<TestRecord> = records.iter().chain(&records).cloned().collect();
    cluster.produce("mapping", 0, &twice).await;
    let mut receiver = source
        .open_receiver(options("0", EventPosition::Earliest, Some(0)))
        .await
        .unwrap();
    let events = read_n(receiver.as_mut(), 4).await;
    assert_eq!(events.len(), 4, "{events:?}");
    for (pair, events) in events.chunks(2).enumerate() {
        let [first, second] = events else {
            panic!("two events: {events:?}")
        };
        let at = 2 * pair as i64;
        assert_eq!(
            (first.sequence_number, first.offset),
            (at, at.unsigned_abs())
        );
        assert_eq!(
            (second.sequence_number, second.offset),
            (at + 1, (at + 1).unsigned_abs())
        );
        assert_eq!(body(first), "first");
        assert_eq!(first.data.partition_key.as_deref(), Some("user-1"));
        assert_eq!(first.enqueued_time_ms, 1_700_000_000_123);
        assert_eq!(
            first.data.property("trace"),
            Some(&PropertyValue::Bytes(b"\x00\xff"[..].into()))
        );
        assert_eq!(first.data.property("empty"), Some(&PropertyValue::Null));
        assert_eq!(
            first.data.property(TIMESTAMP_PROPERTY),
            Some(&PropertyValue::Timestamp(1_700_000_000_123))
        );
        assert_eq!(body(second), "second");
        assert_eq!(second.enqueued_time_ms, 1_700_000_000_456);
        assert_eq!(second.data.partition_key, None);
        assert_eq!(
            second.data.property(KEY_PROPERTY),
            Some(&PropertyValue::Bytes(b"\xff\xfe"[..].into()))
        );
    }
    receiver.close().await;
}

async fn every_start_position_is_resolved_against_the_partition(cluster: &TestCluster) {
    let source = topic(cluster, "positions", 1).await;
    let records: Vec<TestRecord> = (0..6)
        .map(|i| TestRecord {
            value: format!("p-{i}").into_bytes(),
            timestamp_ms: Some(1_700_000_000_000 + i * 1_000),
            ..TestRecord::default()
        })
        .collect();
    cluster.produce("positions", 0, &records).await;
    let cases = [
        (EventPosition::Earliest, "p-0"),
        (
            EventPosition::Offset {
                offset: 2,
                inclusive: false,
            },
            "p-3",
        ),
        (
            EventPosition::Offset {
                offset: 2,
                inclusive: true,
            },
            "p-2",
        ),
        (
            EventPosition::SequenceNumber {
                sequence_number: 4,
                inclusive: true,
            },
            "p-4",
        ),
        (
            EventPosition::SequenceNumber {
                sequence_number: 4,
                inclusive: false,
            },
            "p-5",
        ),
        (
            EventPosition::EnqueuedTime {
                enqueued_time_ms: 1_700_000_001_000,
                inclusive: true,
            },
            "p-1",
        ),
        (
            EventPosition::EnqueuedTime {
                enqueued_time_ms: 1_700_000_001_000,
                inclusive: false,
            },
            "p-2",
        ),
    ];
    for (position, first) in cases {
        let mut receiver = source
            .open_receiver(options("0", position, None))
            .await
            .unwrap();
        let events = read_n(receiver.as_mut(), 1).await;
        assert_eq!(body(&events[0]), first, "from {position}");
        receiver.close().await;
    }
}

async fn latest_is_what_is_appended_after_the_receiver_opened(cluster: &TestCluster) {
    let source = topic(cluster, "latest", 1).await;
    cluster.produce("latest", 0, &bodies("early", 6)).await;
    let mut receiver = source
        .open_receiver(options("0", EventPosition::Latest, None))
        .await
        .unwrap();
    let nothing = receiver.receive(10, Duration::from_secs(2)).await.unwrap();
    assert!(nothing.is_empty(), "{nothing:?}");
    cluster.produce("latest", 0, &bodies("late", 1)).await;
    let events = read_n(receiver.as_mut(), 1).await;
    assert_eq!(body(&events[0]), "late-0");
    assert_eq!(events[0].sequence_number, 6);
}

async fn a_higher_owner_level_disconnects_a_lower_one_of_the_same_source(cluster: &TestCluster) {
    let source = topic(cluster, "epochs", 2).await;
    cluster.produce("epochs", 0, &bodies("e", 3)).await;
    let mut first = source
        .open_receiver(options("0", EventPosition::Earliest, Some(1)))
        .await
        .unwrap();
    read_n(first.as_mut(), 1).await;
    let mut second = source
        .open_receiver(options("0", EventPosition::Earliest, Some(2)))
        .await
        .unwrap();
    let lost = first
        .receive(10, Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(lost.is_ownership_lost(), "{lost}");
    let refused = source
        .open_receiver(options("0", EventPosition::Earliest, Some(1)))
        .await
        .err()
        .expect("a lower owner level is refused");
    assert!(refused.is_ownership_lost(), "{refused}");
    // The partition next door is not affected.
    let other = source
        .open_receiver(options("1", EventPosition::Earliest, Some(0)))
        .await;
    assert!(other.is_ok());
    assert_eq!(read_n(second.as_mut(), 3).await.len(), 3);
}

async fn the_last_enqueued_event_follows_the_high_watermark(cluster: &TestCluster) {
    let source = topic(cluster, "last-enqueued", 1).await;
    cluster.produce("last-enqueued", 0, &bodies("l", 4)).await;
    let mut receiver = source
        .open_receiver(ReceiverOptions {
            track_last_enqueued: true,
            ..options("0", EventPosition::Earliest, None)
        })
        .await
        .unwrap();
    let events = receiver.receive(2, READ_TIMEOUT).await.unwrap();
    assert!(!events.is_empty());
    let last = receiver
        .last_enqueued()
        .expect("reported with the first batch");
    assert_eq!(last.sequence_number, 3);
    assert_eq!(last.offset, 3);
    assert!(last.retrieved_time_ms > 0);
}

async fn a_missing_topic_or_partition_is_not_found(cluster: &TestCluster) {
    let missing = KafkaSource::new(cluster.options(), "no-such-topic").unwrap();
    let error = missing.partition_ids().await.unwrap_err();
    assert!(matches!(error, SourceError::NotFound { .. }), "{error}");
    assert!(error.to_string().contains("no-such-topic"), "{error}");
    let source = topic(cluster, "two-partitions", 2).await;
    for partition in ["2", "x"] {
        let error = source
            .open_receiver(options(partition, EventPosition::Earliest, Some(0)))
            .await
            .err()
            .expect("refused");
        assert!(
            matches!(error, SourceError::NotFound { .. }),
            "{partition}: {error}"
        );
    }
}

/// Reads every partition of `source` until `n` events came in all; by partition.
async fn read_all(source: &KafkaSource, partitions: i32, n: usize) -> Vec<Vec<ReceivedEvent>> {
    let mut receivers = Vec::new();
    for p in 0..partitions {
        let options = options(&p.to_string(), EventPosition::Earliest, None);
        receivers.push(source.open_receiver(options).await.unwrap());
    }
    let mut read: Vec<Vec<ReceivedEvent>> = vec![Vec::new(); receivers.len()];
    let deadline = tokio::time::Instant::now() + READ_TIMEOUT;
    while read.iter().map(Vec::len).sum::<usize>() < n {
        assert!(tokio::time::Instant::now() < deadline, "read {read:?}");
        for (receiver, events) in receivers.iter_mut().zip(&mut read) {
            events.extend(
                receiver
                    .receive(100, Duration::from_millis(100))
                    .await
                    .unwrap(),
            );
        }
    }
    read
}

async fn the_producer_sends_keys_headers_and_times_that_read_back(cluster: &TestCluster) {
    let source = topic(cluster, "produced", 4).await;
    let producer = KafkaProducer::new(&cluster.options(), "produced").unwrap();
    let events: Vec<EventData> = (0..6)
        .map(|i| {
            EventData {
                partition_key: Some(format!("key-{}", i % 2)),
                ..EventData::new(format!("e{i}"))
            }
            .with_property("n", PropertyValue::Int64(i))
            .with_property(
                TIMESTAMP_PROPERTY,
                PropertyValue::Timestamp(1_700_000_000_000 + i),
            )
        })
        .collect();
    producer.send(&events, Destination::Any).await.unwrap();
    let pinned = [EventData::new("pinned")];
    producer
        .send(&pinned, Destination::Partition(2))
        .await
        .unwrap();

    let read = read_all(&source, 4, 7).await;
    assert!(read[2].iter().any(|e| body(e) == "pinned"), "{read:?}");
    for key in ["key-0", "key-1"] {
        // One key, one partition, in the order sent.
        let holding: Vec<&Vec<ReceivedEvent>> = read
            .iter()
            .filter(|events| {
                events
                    .iter()
                    .any(|e| e.data.partition_key.as_deref() == Some(key))
            })
            .collect();
        assert_eq!(holding.len(), 1, "{key} in one partition: {read:?}");
        let of_key: Vec<&ReceivedEvent> = holding[0]
            .iter()
            .filter(|e| e.data.partition_key.as_deref() == Some(key))
            .collect();
        let first = if key == "key-0" { 0 } else { 1 };
        let bodies: Vec<&str> = of_key.iter().map(|e| body(e)).collect();
        let expected: Vec<String> = (0..3).map(|j| format!("e{}", first + 2 * j)).collect();
        assert_eq!(bodies, expected);
        for (j, event) in of_key.iter().enumerate() {
            let i = first + 2 * j as i64;
            assert_eq!(event.enqueued_time_ms, 1_700_000_000_000 + i);
            let n = event.data.property("n");
            assert_eq!(
                n,
                Some(&PropertyValue::Bytes(i.to_string().into_bytes().into()))
            );
        }
    }
}

async fn a_send_to_a_missing_partition_is_a_configuration_error(cluster: &TestCluster) {
    topic(cluster, "one-partition", 1).await;
    let producer = KafkaProducer::new(&cluster.options(), "one-partition").unwrap();
    let error = producer
        .send(&[EventData::new("x")], Destination::Partition(5))
        .await
        .unwrap_err();
    assert!(matches!(error, ProduceError::Misconfigured(_)), "{error:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_is_a_transient_failure_naming_it() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let source = KafkaSource::new(tributary_kafka_source::KafkaOptions::new(&closed), "t").unwrap();
    let error = source.partition_ids().await.unwrap_err();
    assert!(error.is_transient(), "{error:?}");
    assert!(error.to_string().contains(&closed), "{error}");
}
