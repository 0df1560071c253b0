//! A disk fault under a running hub, seen from an AMQP client and from a Kafka producer: a
//! partition whose `fdatasync` failed refuses sends (`amqp:internal-error` with the log's
//! reason; KAFKA_STORAGE_ERROR), and the other partitions go on.

use std::sync::Arc;

use tributary_client::{ClientError, ProducerClient, SendTarget};
use tributary_event::EventData;
use tributary_log::faults::{FaultConfig, FaultyStorage};
use tributary_testkit::{TestHub, within};

fn event(body: &str) -> EventData {
    EventData::new(body.to_owned())
}

/// A hub with event hub "orders" (2 partitions) over storage whose faults the test injects.
async fn hub_over_faulty_storage(seed: u64) -> (FaultyStorage, TestHub) {
    let storage = FaultyStorage::new(seed, FaultConfig::NONE);
    let faulty = storage.clone();
    let hub = TestHub::start_in(
        tempfile::tempdir().unwrap(),
        &[("orders", 2)],
        move |config| config.storage = Arc::new(faulty),
        None,
    )
    .await;
    (storage, hub)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_partition_refuses_sends_with_an_internal_error() {
    let (storage, hub) = hub_over_faulty_storage(11).await;
    within("the test", async {
        let producer = ProducerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        let zero = || SendTarget::Partition("0".to_owned());
        producer.send(&[event("before")], zero()).await.unwrap();
        storage.fail_next_sync();
        for attempt in ["its sync fails", "after the failure"] {
            let error = producer.send(&[event(attempt)], zero()).await.unwrap_err();
            assert!(
                matches!(&error, ClientError::ServerBusy { condition, description }
                    if condition == "amqp:internal-error"
                        && description.contains("stopped accepting appends")),
                "{attempt}: {error}"
            );
        }
        producer
            .send(&[event("elsewhere")], SendTarget::Partition("1".to_owned()))
            .await
            .unwrap();
    })
    .await;
}

/// The same fault seen from a Kafka producer (confluent-kafka): the poisoned partition answers
/// KAFKA_STORAGE_ERROR, which librdkafka retries until its delivery timeout, so nothing is
/// acknowledged that is not stored; the other partition goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_partition_is_a_storage_error_a_kafka_producer_retries() {
    use serde_json::json;
    let (storage, hub) = hub_over_faulty_storage(12).await;
    let config =
        tributary_kafka::KafkaConfig::new("127.0.0.1:0".parse().unwrap(), hub.policies.clone());
    let door = tributary_kafka::start(hub.broker.clone(), config)
        .await
        .unwrap();
    let produce = |partition: i32, value: &str| {
        json!({
            "bootstrap": door.local_addr().to_string(),
            "conn": hub.connection_string,
            "topic": "orders",
            "acks": "all",
            "records": [{"value": value, "partition": partition}],
            "extra": {"message.timeout.ms": 3000, "retry.backoff.ms": 100},
        })
    };
    let run = |args| tributary_testkit::run_python("kafka_interop.py", "produce", args);
    let before = run(produce(0, "before")).await;
    assert!(before["reports"][0]["error"].is_null(), "{before}");
    storage.fail_next_sync();
    let refused = run(produce(0, "refused")).await;
    assert_eq!(
        refused["reports"][0]["error"], "_MSG_TIMED_OUT",
        "{refused}"
    );
    let elsewhere = run(produce(1, "elsewhere")).await;
    assert!(elsewhere["reports"][0]["error"].is_null(), "{elsewhere}");
    let stored = hub.broker.read("orders", "0", 0, 10, 0).unwrap();
    let bodies: Vec<&[u8]> = stored.iter().map(|e| e.data.body.as_ref()).collect();
    assert_eq!(
        bodies,
        [b"before".as_slice()],
        "only the acknowledged event is stored"
    );
    door.shutdown().await;
    hub.stop().await;
}
