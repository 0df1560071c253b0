//! A disk fault under a running hub, seen from an AMQP client: a partition whose `fdatasync`
//! failed refuses sends with `amqp:internal-error` and the log's reason, and the other
//! partitions go on.

use std::sync::Arc;

use tributary_client::{ClientError, ProducerClient, SendTarget};
use tributary_event::EventData;
use tributary_log::faults::{FaultConfig, FaultyStorage};
use tributary_testkit::{TestHub, within};

fn event(body: &str) -> EventData {
    EventData::new(body.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_partition_refuses_sends_with_an_internal_error() {
    let storage = FaultyStorage::new(11, FaultConfig::NONE);
    let faulty = storage.clone();
    let hub = TestHub::start_in(
        tempfile::tempdir().unwrap(),
        &[("orders", 2)],
        move |config| config.storage = Arc::new(faulty),
        None,
    )
    .await;
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
