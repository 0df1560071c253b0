//! Produce requests through the Kafka door, written byte by byte where a real client cannot be
//! made to send what a case needs:
//! - pipelining: a producer's requests are read and written to the log while the first waits
//!   for its sync, and answered in order once synced;
//! - idempotent producers: the sequence checks (a retry of any of the last five batches
//!   acknowledged with its offset and not stored again, a gap, an old epoch, an unknown
//!   producer id), their serialization across connections, and a retried batch recognised
//!   after the door and the broker restart over the same data directory.
//!
//! The Produce requests carry record batches built here with the producer id, epoch and
//! sequence numbers each case needs (a real client only sends those on its own schedule);
//! `tests/python/kafka_idempotence.py` drives librdkafka (confluent-kafka with
//! `enable.idempotence`) and kafka-python 3 (idempotent by default) across a door restart.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, InitProducerIdRequest, InitProducerIdResponse, MetadataRequest, MetadataResponse,
    ProduceRequest, ProduceResponse, ProducerId, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tributary_amqp::AccessPolicies;
use tributary_broker::{
    Broker, BrokerConfig, CleanupPolicy, DOOR_STAMP_PROPERTY, HubCleanup, HubSpec,
};
use tributary_kafka::mapping::TIMESTAMP_PROPERTY;
use tributary_kafka::{KafkaConfig, RunningKafkaServer};
use tributary_log::faults::{FaultConfig, FaultyStorage};
use tributary_testkit::{TestHub, within};

const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const PRODUCE_VERSION: i16 = 9;
const METADATA_VERSION: i16 = 9;
const INIT_PRODUCER_ID_VERSION: i16 = 4;

/// The Kafka door over `broker`, without SASL (development mode: these tests are about
/// sequence numbers, not logins).
async fn open_door(broker: &Broker) -> RunningKafkaServer {
    let policies = AccessPolicies::new(Vec::new()).expect("no policies");
    let mut config = KafkaConfig::new("127.0.0.1:0".parse().unwrap(), policies);
    config.development_unauthenticated = true;
    tributary_kafka::start(broker.clone(), config)
        .await
        .expect("the Kafka door starts")
}

/// A bare Kafka connection: one request, one response, in order.
struct Connection {
    stream: TcpStream,
    correlation_id: i32,
}

impl Connection {
    async fn open(door: &RunningKafkaServer) -> Connection {
        let stream = TcpStream::connect(door.local_addr())
            .await
            .expect("connects");
        Connection {
            stream,
            correlation_id: 0,
        }
    }

    /// Sends `body` as API `key` at `version` and returns the response body's bytes.
    async fn call(&mut self, key: ApiKey, version: i16, body: &impl Encodable) -> Bytes {
        let correlation_id = self.send(key, version, body).await;
        self.receive(key, version, correlation_id).await
    }

    /// Sends `body` as API `key` at `version` without waiting for the response; returns the
    /// request's correlation id.
    async fn send(&mut self, key: ApiKey, version: i16, body: &impl Encodable) -> i32 {
        self.correlation_id += 1;
        let mut frame = BytesMut::new();
        frame.put_u32(0);
        RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("produce-test")))
            .encode(&mut frame, key.request_header_version(version))
            .unwrap();
        body.encode(&mut frame, version).unwrap();
        let len = u32::try_from(frame.len() - 4).unwrap();
        frame[..4].copy_from_slice(&len.to_be_bytes());
        self.stream.write_all(&frame).await.unwrap();
        self.correlation_id
    }

    /// Reads the next response, which must be the one to request `correlation_id`; returns its
    /// body's bytes.
    async fn receive(&mut self, key: ApiKey, version: i16, correlation_id: i32) -> Bytes {
        let len = self.stream.read_u32().await.expect("a response");
        let mut response = vec![0; len as usize];
        self.stream.read_exact(&mut response).await.unwrap();
        let mut response = Bytes::from(response);
        let header =
            ResponseHeader::decode(&mut response, key.response_header_version(version)).unwrap();
        assert_eq!(
            header.correlation_id, correlation_id,
            "answers come in order"
        );
        response
    }

    /// A new producer id (epoch 0).
    async fn init_producer_id(&mut self) -> i64 {
        let request = InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(-1)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
        let mut body = self
            .call(ApiKey::InitProducerId, INIT_PRODUCER_ID_VERSION, &request)
            .await;
        let response = InitProducerIdResponse::decode(&mut body, INIT_PRODUCER_ID_VERSION).unwrap();
        assert_eq!(response.error_code, 0);
        assert_eq!(response.producer_epoch, 0);
        response.producer_id.0
    }

    /// Produces `batch` to `topic`'s `partition` with acks all; returns (error code, base
    /// offset).
    async fn produce(&mut self, topic: &str, partition: i32, batch: Bytes) -> (i16, i64) {
        let correlation_id = self.send_produce(topic, partition, batch).await;
        self.receive_produce(correlation_id).await
    }

    /// Sends a produce request of `batch` to `topic`'s `partition` with acks all, without
    /// waiting for its answer; returns its correlation id.
    async fn send_produce(&mut self, topic: &str, partition: i32, batch: Bytes) -> i32 {
        let data = PartitionProduceData::default()
            .with_index(partition)
            .with_records(Some(batch));
        let topic_data = TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
            .with_partition_data(vec![data]);
        let request = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(10_000)
            .with_topic_data(vec![topic_data]);
        self.send(ApiKey::Produce, PRODUCE_VERSION, &request).await
    }

    /// The answer to produce request `correlation_id`: (error code, base offset).
    async fn receive_produce(&mut self, correlation_id: i32) -> (i16, i64) {
        let mut body = self
            .receive(ApiKey::Produce, PRODUCE_VERSION, correlation_id)
            .await;
        let response = ProduceResponse::decode(&mut body, PRODUCE_VERSION).unwrap();
        let partition = &response.responses[0].partition_responses[0];
        (partition.error_code, partition.base_offset)
    }
}

/// Which batch: producer id, epoch, first sequence and record count.
#[derive(Debug, Clone, Copy)]
struct Batch {
    producer_id: i64,
    epoch: i16,
    first_sequence: i32,
    count: i32,
}

impl Batch {
    fn new(producer_id: i64, epoch: i16, first_sequence: i32, count: i32) -> Batch {
        Batch {
            producer_id,
            epoch,
            first_sequence,
            count,
        }
    }

    /// The record batch v2, values `p<id>-e<epoch>-s<sequence>`.
    fn encode(&self) -> Bytes {
        let records: Vec<Record> = (0..self.count)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id: self.producer_id,
                producer_epoch: self.epoch,
                timestamp_type: TimestampType::Creation,
                offset: i64::from(i),
                sequence: self.first_sequence + i,
                timestamp: 1_700_000_000_000,
                key: None,
                value: Some(Bytes::from(format!(
                    "p{}-e{}-s{}",
                    self.producer_id,
                    self.epoch,
                    self.first_sequence + i
                ))),
                headers: Default::default(),
            })
            .collect();
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut buf, &records, &options).unwrap();
        buf.freeze()
    }
}

/// The events of partition `partition` of `hub`, as values; asserts no reader sees a stamp.
fn values(broker: &Broker, hub: &str, partition: &str) -> Vec<String> {
    let events = broker.read(hub, partition, 0, 10_000, 64 << 20).unwrap();
    for event in &events {
        assert!(
            event.data.property(DOOR_STAMP_PROPERTY).is_none(),
            "{event:?}"
        );
        assert!(
            event
                .data
                .properties
                .iter()
                .all(|(k, _)| k != DOOR_STAMP_PROPERTY)
        );
    }
    events
        .iter()
        .map(|e| String::from_utf8(e.data.body.to_vec()).unwrap())
        .collect()
}

/// Produce requests sent one after another on one connection while the first waits for its
/// sync: the door reads and writes every one of them to the log before that sync ends (so the
/// next sync covers them together), answers them in order once synced, with the offsets of
/// their order, and answers a metadata request behind them only after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_requests_behind_a_held_sync_are_written_at_once_and_answered_in_order() {
    const REQUESTS: i32 = 12;
    const RECORDS: i32 = 3;
    let storage = FaultyStorage::new(32, FaultConfig::NONE);
    let faulty = storage.clone();
    let hub = TestHub::start_in(
        tempfile::tempdir().unwrap(),
        &[("pipelined", 1)],
        move |config| config.storage = Arc::new(faulty),
        None,
    )
    .await;
    let door = open_door(&hub.broker).await;
    let mut connection = Connection::open(&door).await;
    // Batches without a producer id, values `p-1-e-1-s<sequence>`.
    let batch = |i: i32| Batch::new(-1, -1, i * RECORDS, RECORDS).encode();
    storage.hold_next_sync(true);
    let mut sent = vec![connection.send_produce("pipelined", 0, batch(0)).await];
    let held = storage.clone();
    within(
        "the first batch's sync",
        tokio::task::spawn_blocking(move || held.wait_until_held()),
    )
    .await
    .unwrap();
    for i in 1..REQUESTS {
        sent.push(connection.send_produce("pipelined", 0, batch(i)).await);
    }
    let metadata = MetadataRequest::default().with_topics(None);
    let metadata_sent = connection
        .send(ApiKey::Metadata, METADATA_VERSION, &metadata)
        .await;
    let last_value = format!("p-1-e-1-s{}", REQUESTS * RECORDS - 1);
    within("every batch written while the first sync is held", async {
        while !written(&storage, last_value.as_bytes()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let syncs_before = hub.broker.sync_times().syncs.count;
    storage.release();
    for (i, correlation_id) in (0i64..).zip(sent) {
        let answered = within(
            "a produce answer",
            connection.receive_produce(correlation_id),
        )
        .await;
        assert_eq!(answered, (0, i * i64::from(RECORDS)), "request {i}");
    }
    let mut body = connection
        .receive(ApiKey::Metadata, METADATA_VERSION, metadata_sent)
        .await;
    let topics = MetadataResponse::decode(&mut body, METADATA_VERSION)
        .unwrap()
        .topics;
    assert_eq!(topics.len(), 1);
    let expected: Vec<String> = (0..REQUESTS * RECORDS)
        .map(|s| format!("p-1-e-1-s{s}"))
        .collect();
    assert_eq!(values(&hub.broker, "pipelined", "0"), expected);
    // The held sync and, at most, one more for the eleven batches written during it.
    let syncs = hub.broker.sync_times().syncs.count - syncs_before;
    assert!(
        syncs <= 2,
        "{syncs} syncs after the held one for {REQUESTS} requests"
    );
    door.shutdown().await;
    hub.stop().await;
}

/// Whether some file of `storage` holds `needle` (written, synced or not).
fn written(storage: &FaultyStorage, needle: &[u8]) -> bool {
    storage.paths().iter().any(|path| {
        storage
            .contents(path)
            .is_some_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_of_the_last_five_batches_are_acknowledged_once_and_gaps_and_old_epochs_refused() {
    let hub = TestHub::start(&[("orders", 2)]).await;
    let door = open_door(&hub.broker).await;
    let mut connection = Connection::open(&door).await;
    let producer = connection.init_producer_id().await;
    assert!(connection.init_producer_id().await > producer);
    // Six batches of two records: offsets 0, 2, … 10.
    for i in 0..6 {
        let batch = Batch::new(producer, 0, i * 2, 2).encode();
        let stored = connection.produce("orders", 0, batch).await;
        assert_eq!(stored, (0, i64::from(i) * 2), "batch {i}");
    }
    // A retry of each of the last five: acknowledged with its offset, not stored again.
    for i in 1..6 {
        let retry = Batch::new(producer, 0, i * 2, 2).encode();
        let answered = connection.produce("orders", 0, retry).await;
        assert_eq!(answered, (0, i64::from(i) * 2), "retry of batch {i}");
    }
    assert_eq!(values(&hub.broker, "orders", "0").len(), 12);
    // The first batch is no longer among the last five: its sequence is simply out of order.
    let oldest = connection.produce("orders", 0, Batch::new(producer, 0, 0, 2).encode());
    assert_eq!(oldest.await.0, OUT_OF_ORDER_SEQUENCE_NUMBER);
    let gap = connection.produce("orders", 0, Batch::new(producer, 0, 13, 1).encode());
    assert_eq!(gap.await.0, OUT_OF_ORDER_SEQUENCE_NUMBER);
    let next = connection.produce("orders", 0, Batch::new(producer, 0, 12, 1).encode());
    assert_eq!(next.await, (0, 12));
    // A bumped epoch starts again at 0; the old epoch is fenced.
    let bumped_late = connection.produce("orders", 0, Batch::new(producer, 1, 3, 1).encode());
    assert_eq!(bumped_late.await.0, OUT_OF_ORDER_SEQUENCE_NUMBER);
    let bumped = connection.produce("orders", 0, Batch::new(producer, 1, 0, 1).encode());
    assert_eq!(bumped.await, (0, 13));
    let old = connection.produce("orders", 0, Batch::new(producer, 0, 13, 1).encode());
    assert_eq!(old.await.0, INVALID_PRODUCER_EPOCH);
    // A producer id this door has no state for is accepted at any sequence (Kafka's rule
    // once a producer's state expired; librdkafka cannot recover from UNKNOWN_PRODUCER_ID on
    // a retried batch).
    let unknown = connection.produce("orders", 0, Batch::new(producer + 99, 0, 7, 1).encode());
    assert_eq!(unknown.await, (0, 14));
    // The other partition keeps its own sequence for the same producer.
    let other = connection.produce("orders", 1, Batch::new(producer, 0, 0, 1).encode());
    assert_eq!(other.await, (0, 0));
    let stored = values(&hub.broker, "orders", "0");
    assert_eq!(stored.len(), 15);
    assert_eq!(stored[12], format!("p{producer}-e0-s12"));
    assert_eq!(stored[13], format!("p{producer}-e1-s0"));
    // An AMQP consumer (the official Python SDK) sees the same properties on a batch's first
    // event, which carries the stamp, as on the others: the stamp is not shown.
    let args = json!({"conn": hub.conn(&hub.root), "hub": "orders", "partition": 0,
                      "position": "earliest", "count": 15});
    let consumed = tributary_testkit::run_python("interop.py", "consume", args).await;
    let events = consumed["events"].as_array().expect("events");
    assert_eq!(events.len(), 15, "{consumed}");
    for event in events {
        let properties = event["properties"].as_object().unwrap();
        let names: Vec<&String> = properties.keys().collect();
        assert_eq!(names, [TIMESTAMP_PROPERTY], "{event}");
        let annotations = event["delivery_annotations"].as_object().unwrap();
        assert!(annotations.get(DOOR_STAMP_PROPERTY).is_none(), "{event}");
    }
    door.shutdown().await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_batch_on_several_connections_at_once_is_stored_once() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    let door = open_door(&hub.broker).await;
    let producer = Connection::open(&door).await.init_producer_id().await;
    for round in 0..5 {
        let batch = Batch::new(producer, 0, round * 3, 3).encode();
        let mut sends = Vec::new();
        for _ in 0..4 {
            let mut connection = Connection::open(&door).await;
            let batch = batch.clone();
            sends.push(tokio::spawn(async move {
                connection.produce("orders", 0, batch).await
            }));
        }
        for send in sends {
            let answered = within("a concurrent produce", send).await.unwrap();
            assert_eq!(answered, (0, i64::from(round) * 3), "round {round}");
        }
    }
    assert_eq!(values(&hub.broker, "orders", "0").len(), 15);
    door.shutdown().await;
    hub.stop().await;
}

/// A broker over `dir` with hub `orders` (created if new). A restart waits for the door's
/// last tasks (the group coordinator's) to let go of the previous broker and its lock.
async fn open_broker(dir: &std::path::Path) -> Broker {
    let mut attempts = 0;
    let broker = loop {
        match Broker::open(BrokerConfig::new(dir)).await {
            Ok(broker) => break broker,
            Err(e) if attempts < 100 => {
                attempts += 1;
                tracing::debug!(error = %e, "the data directory is not free yet");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the broker does not open again: {e}"),
        }
    };
    if broker.describe_hub("orders").is_err() {
        broker.create_hub(HubSpec::new("orders", 1)).await.unwrap();
    }
    broker
}

/// A keyless record on a compacted hub: INVALID_RECORD, with the broker's words in the
/// partition's error message (which librdkafka does not show), and nothing stored.
#[tokio::test]
async fn a_keyless_record_on_a_compacted_hub_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open_broker(dir.path()).await;
    let cleanup = HubCleanup {
        policy: CleanupPolicy::Compact,
        ..HubCleanup::default()
    };
    let spec = HubSpec {
        cleanup,
        ..HubSpec::new("table", 1)
    };
    broker.create_hub(spec).await.unwrap();
    let door = open_door(&broker).await;
    let mut connection = Connection::open(&door).await;
    let keyless = Batch::new(-1, -1, -1, 1).encode();
    let id = connection.send_produce("table", 0, keyless).await;
    let mut body = connection
        .receive(ApiKey::Produce, PRODUCE_VERSION, id)
        .await;
    let response = ProduceResponse::decode(&mut body, PRODUCE_VERSION).unwrap();
    let partition = &response.responses[0].partition_responses[0];
    assert_eq!(partition.error_code, 87, "INVALID_RECORD: {partition:?}");
    let message = partition.error_message.as_deref().unwrap_or_default();
    assert!(
        message.contains("no partition key") && message.contains("\"table\""),
        "{message}"
    );
    assert!(broker.partition_properties("table", "0").unwrap().is_empty);
    door.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_batch_is_recognised_after_the_door_and_the_broker_restart() {
    let dir = tempfile::tempdir().unwrap();
    let broker = open_broker(dir.path()).await;
    let door = open_door(&broker).await;
    let mut connection = Connection::open(&door).await;
    let producer = connection.init_producer_id().await;
    for i in 0..3 {
        let stored = connection.produce("orders", 0, Batch::new(producer, 0, i * 4, 4).encode());
        assert_eq!(stored.await, (0, i64::from(i) * 4));
    }
    // Another producer's batches after them, as a busy partition has.
    let other = connection.init_producer_id().await;
    let stored = connection.produce("orders", 0, Batch::new(other, 0, 0, 2).encode());
    assert_eq!(stored.await, (0, 12));
    drop(connection);
    door.shutdown().await;
    broker.shutdown().await.unwrap();
    drop(broker);

    let broker = open_broker(dir.path()).await;
    let door = open_door(&broker).await;
    let mut connection = Connection::open(&door).await;
    // Every one of the producer's batches, retried as if their acknowledgements were lost.
    for i in 0..3 {
        let retry = connection.produce("orders", 0, Batch::new(producer, 0, i * 4, 4).encode());
        assert_eq!(retry.await, (0, i64::from(i) * 4), "retry of batch {i}");
    }
    let gap = connection.produce("orders", 0, Batch::new(producer, 0, 13, 1).encode());
    assert_eq!(gap.await.0, OUT_OF_ORDER_SEQUENCE_NUMBER);
    let next = connection.produce("orders", 0, Batch::new(producer, 0, 12, 1).encode());
    assert_eq!(next.await, (0, 14));
    let retry_other = connection.produce("orders", 0, Batch::new(other, 0, 0, 2).encode());
    assert_eq!(retry_other.await, (0, 12));
    assert_eq!(values(&broker, "orders", "0").len(), 15);
    // Ids handed out after the restart are new.
    assert!(connection.init_producer_id().await > other);
    door.shutdown().await;
    broker.shutdown().await.unwrap();
}

/// The Python half: librdkafka with `enable.idempotence` against the door.
async fn kafka(command: &str, args: Value) -> Value {
    tributary_testkit::run_python("kafka_idempotence.py", command, args).await
}

/// The door over `hub` on `addr` (port 0: any), SASL required; retried while the old
/// listener's port is not free yet.
async fn door_on(hub: &TestHub, addr: SocketAddr) -> RunningKafkaServer {
    for _ in 0..50 {
        let config = KafkaConfig::new(addr, hub.policies.clone());
        match tributary_kafka::start(hub.broker.clone(), config).await {
            Ok(door) => return door,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("the Kafka door did not start on {addr}");
}

/// `client` (a `kafka_idempotence.py` produce command) sends 3000 records with idempotence
/// on while the door restarts under it; every record is then stored once, where its
/// acknowledgement said, and no consumer sees a stamp.
async fn idempotent_client_across_a_door_restart(client: &'static str) {
    let hub = TestHub::start(&[("orders", 3)]).await;
    let door = door_on(&hub, "127.0.0.1:0".parse().unwrap()).await;
    let addr = door.local_addr();
    let count = 3000;
    let args = json!({"bootstrap": addr.to_string(), "conn": hub.conn(&hub.root),
                      "topic": "orders", "count": count, "rounds": 30, "pause_ms": 50});
    let producing = tokio::spawn(kafka(client, args.clone()));
    // Restart the door while the producer has batches in flight: it reconnects and retries
    // them, and the door's state is rebuilt from the partitions' tails.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(
        !producing.is_finished(),
        "{client}: the restart comes mid-stream"
    );
    door.shutdown().await;
    let door = door_on(&hub, addr).await;
    let produced = within("the producer", producing).await.unwrap();
    let summary = json!({"errors": produced["errors"], "fatal": produced["fatal"],
                         "delivered": produced["delivered"]});
    assert_eq!(produced["errors"], json!([]), "{client}: {summary}");
    assert_eq!(produced["fatal"], json!([]), "{client}: {summary}");
    assert_eq!(produced["delivered"], count, "{client}: {summary}");
    let consumed = within("librdkafka consumes", kafka("consume", args)).await;
    assert_eq!(consumed["errors"], json!([]), "{client}: {consumed}");
    assert_eq!(consumed["count"], count, "{client}: {consumed}");
    assert_eq!(consumed["distinct"], count, "{client}: {consumed}");
    assert_eq!(
        consumed["headers"],
        json!([]),
        "no record shows a stamp: {consumed}"
    );
    for record in produced["acknowledged"].as_array().unwrap() {
        let (value, partition, offset) = (&record[0], &record[1], &record[2]);
        let partition = partition.as_i64().unwrap().to_string();
        let offset = offset.as_i64().unwrap();
        let stored = hub
            .broker
            .read("orders", &partition, offset, 1, 1 << 20)
            .unwrap();
        assert_eq!(
            stored[0].data.body,
            value.as_str().unwrap().as_bytes(),
            "{client}"
        );
    }
    door.shutdown().await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_with_idempotence_stores_every_record_once_across_a_door_restart() {
    idempotent_client_across_a_door_restart("produce").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_3_idempotent_by_default_stores_every_record_once_across_a_door_restart() {
    idempotent_client_across_a_door_restart("produce_kafka_python").await;
}
