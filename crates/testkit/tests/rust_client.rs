//! The server with AMQP clients built on the same engine (`fe2o3-amqp`): the Tributary Rust
//! client, and a bare engine sender that pipelines deliveries without waiting for each
//! settlement.

use std::time::Duration;

use fe2o3_amqp::connection::Connection;
use fe2o3_amqp::link::Sender;
use fe2o3_amqp::sasl_profile::SaslProfile;
use fe2o3_amqp::session::Session;
use fe2o3_amqp_types::messaging::annotations::OwnedKey;
use fe2o3_amqp_types::messaging::{Data, Message, MessageAnnotations, Outcome};
use fe2o3_amqp_types::primitives::{Binary, OrderedMap, Value};
use tributary_client::{ConsumerClient, ProducerClient};
use tributary_event::{EventData, EventPosition, SendTarget, partition_for_key};
use tributary_testkit::TestHub;

/// The server splits a large event into frames sized to the client's `max-frame-size` (the
/// Rust client's is the engine's default, 256 KiB) and pads each performative; the padded
/// frames must still fit, or the client's decoder drops the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_larger_than_the_clients_frame_size_arrive_whole() {
    let f = TestHub::start(&[("large", 1)]).await;
    let conn = f.conn(&f.root);
    let producer = ProducerClient::connect(&conn, "large").await.unwrap();
    let sizes = [300 * 1024, 256 * 1024 - 100, 900 * 1024];
    for (i, size) in sizes.iter().enumerate() {
        let body: Vec<u8> = (0..*size).map(|j| (i + j) as u8).collect();
        producer
            .send(&[EventData::new(body)], SendTarget::Partition("0".into()))
            .await
            .unwrap();
    }
    let consumer = ConsumerClient::connect(&conn, "large").await.unwrap();
    let mut receiver = consumer
        .open_receiver("0", "$Default", EventPosition::Earliest, None, 10)
        .await
        .unwrap();
    let mut got = Vec::new();
    while got.len() < sizes.len() {
        let batch = receiver
            .receive(10, Duration::from_secs(10))
            .await
            .expect("large events arrive");
        assert!(!batch.is_empty(), "no event within 10 s");
        got.extend(batch);
    }
    for (i, (event, size)) in got.iter().zip(sizes).enumerate() {
        assert_eq!(event.data.body.len(), size);
        assert!(
            event
                .data
                .body
                .iter()
                .enumerate()
                .all(|(j, b)| *b == (i + j) as u8)
        );
    }
    receiver.close().await;
    consumer.close().await;
    producer.close().await;
    f.stop().await;
}

fn keyed(key: &str, body: String) -> Message<Data> {
    let mut annotations = OrderedMap::new();
    annotations.insert(
        OwnedKey::from("x-opt-partition-key"),
        Value::String(key.to_owned()),
    );
    Message::builder()
        .message_annotations(MessageAnnotations(annotations))
        .data(Binary::from(body.into_bytes()))
        .build()
}

/// Far more unsettled deliveries than the server's pipeline holds, on one link, alternating two
/// partition keys: every one is accepted, and each key's events are stored in send order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelining_sender_keeps_per_key_order() {
    let f = TestHub::start(&[("piped", 4)]).await;
    let url = format!("amqp://127.0.0.1:{}", f.port());
    let mut connection = Connection::builder()
        .container_id("pipelining-test")
        .sasl_profile(SaslProfile::Plain {
            username: f.root.name.clone(),
            password: f.root.key.clone(),
        })
        .open(url.as_str())
        .await
        .unwrap();
    let mut session = Session::begin(&mut connection).await.unwrap();
    let mut sender = Sender::attach(&mut session, "piped-sender", "piped")
        .await
        .unwrap();
    const COUNT: usize = 500;
    let keys = ["red", "blue"];
    let mut settlements = Vec::with_capacity(COUNT);
    for i in 0..COUNT {
        let key = keys[i % 2];
        let fut = sender
            .send_batchable(keyed(key, format!("{key}-{i}")))
            .await
            .unwrap();
        settlements.push(fut);
    }
    for (i, fut) in settlements.into_iter().enumerate() {
        let outcome = tokio::time::timeout(Duration::from_secs(30), fut)
            .await
            .expect("settled in time")
            .unwrap();
        assert!(matches!(outcome, Outcome::Accepted(_)), "{i}: {outcome:?}");
    }
    for key in keys {
        let partition = partition_for_key(key, 4);
        let stored: Vec<String> = tributary_testkit::bodies(&f.read_all("piped", partition).await)
            .into_iter()
            .filter(|b| b.starts_with(key))
            .collect();
        let expected: Vec<String> = (0..COUNT)
            .filter(|i| keys[i % 2] == key)
            .map(|i| format!("{key}-{i}"))
            .collect();
        assert_eq!(stored, expected, "{key}");
    }
    sender.close().await.unwrap();
    session.end().await.unwrap();
    connection.close().await.unwrap();
    f.stop().await;
}
