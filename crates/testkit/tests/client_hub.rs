//! The client against a real Tributary hub (broker + AMQP front door on 127.0.0.1).

use std::time::Duration;

use bytes::Bytes;
use tributary_client::{
    ClientError, ClientOptions, ConsumerClient, EventReceiver, ProducerClient, ReceiverOptions,
    SendTarget,
};
use tributary_event::{EventData, EventPosition, PropertyValue, ReceivedEvent, partition_for_key};
use tributary_testkit::{TestHub, within};

const WAIT: Duration = Duration::from_secs(5);

fn event(body: &str) -> EventData {
    EventData::new(body.to_owned())
}

/// Reads from `receiver` until `count` events arrived (or a quiet `WAIT`).
async fn receive_all(receiver: &mut EventReceiver, count: usize) -> Vec<ReceivedEvent> {
    let mut events = Vec::new();
    while events.len() < count {
        let batch = receiver
            .receive(count - events.len(), WAIT)
            .await
            .expect("receive");
        if batch.is_empty() {
            break;
        }
        events.extend(batch);
    }
    events
}

async fn read(
    consumer: &ConsumerClient,
    partition: &str,
    start: EventPosition,
    count: usize,
) -> Vec<ReceivedEvent> {
    let mut receiver = consumer
        .open_receiver(partition, "$Default", start, None, 100)
        .await
        .expect("receiver opens");
    let events = receive_all(&mut receiver, count).await;
    // Nothing more is there.
    let extra = receiver
        .receive(10, Duration::from_millis(200))
        .await
        .expect("receive");
    assert!(extra.is_empty(), "unexpected extra events: {extra:?}");
    receiver.close().await;
    events
}

/// Every event in the partition (as many as its properties say it holds).
async fn read_everything(consumer: &ConsumerClient, partition: &str) -> Vec<ReceivedEvent> {
    let properties = consumer
        .partition_properties(partition)
        .await
        .expect("properties");
    let count = usize::try_from(properties.last_enqueued_sequence_number + 1).expect("count");
    if count == 0 {
        return Vec::new();
    }
    let events = read(consumer, partition, EventPosition::Earliest, count).await;
    assert_eq!(events.len(), count, "partition {partition}");
    events
}

/// The error of a refused open: a hub may refuse the attach itself, or complete it and detach
/// at once, in which case the first receive reports it.
async fn refusal(opened: Result<EventReceiver, ClientError>) -> ClientError {
    match opened {
        Err(error) => error,
        Ok(mut receiver) => receiver.receive(10, WAIT).await.unwrap_err(),
    }
}

fn bodies(events: &[ReceivedEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| String::from_utf8_lossy(&e.data.body).into_owned())
        .collect()
}

/// An event with every property type and every optional field set.
fn typed_event() -> EventData {
    let mut event = event("e0")
        .with_property("i64", PropertyValue::Int64(-5))
        .with_property("str", PropertyValue::String("ü".into()))
        .with_property("f64", PropertyValue::Float64(2.5))
        .with_property("bool", PropertyValue::Bool(true))
        .with_property(
            "bytes",
            PropertyValue::Bytes(Bytes::from_static(b"\x00\xff")),
        )
        .with_property("time", PropertyValue::Timestamp(1_700_000_000_000))
        .with_property("uuid", PropertyValue::Uuid([7; 16]))
        .with_property("u32", PropertyValue::UInt32(3))
        .with_property("i32", PropertyValue::Int32(-3))
        .with_property("f32", PropertyValue::Float32(0.5))
        .with_property("u64", PropertyValue::UInt64(u64::MAX))
        .with_property("null", PropertyValue::Null);
    event.message_id = Some("msg-0".to_owned());
    event.correlation_id = Some("corr-0".to_owned());
    event.content_type = Some("application/json".to_owned());
    event
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_come_back_exactly_and_from_every_start_position() {
    let hub = TestHub::start(&[("orders", 4)]).await;
    within("the test", async {
        let producer = ProducerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        let consumer = ConsumerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        let to_1 = || SendTarget::Partition("1".to_owned());
        // A batch of three events, then a single one, to partition 1.
        let first = typed_event();
        producer
            .send(&[first.clone(), event("e1"), event("e2")], to_1())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        producer.send(&[event("e3")], to_1()).await.unwrap();

        let all = read(&consumer, "1", EventPosition::Earliest, 4).await;
        assert_eq!(bodies(&all), ["e0", "e1", "e2", "e3"]);
        let sequence: Vec<i64> = all.iter().map(|e| e.sequence_number).collect();
        assert_eq!(sequence, [0, 1, 2, 3]);
        assert!(all.windows(2).all(|w| w[0].offset < w[1].offset));
        assert_eq!(
            all[0].data, first,
            "an event comes back exactly as it was sent"
        );
        assert!(all[3].enqueued_time_ms > all[2].enqueued_time_ms);

        let from = |start, count| read(&consumer, "1", start, count);
        let seq = |n, inclusive| EventPosition::SequenceNumber {
            sequence_number: n,
            inclusive,
        };
        assert_eq!(bodies(&from(seq(1, true), 3).await), ["e1", "e2", "e3"]);
        assert_eq!(bodies(&from(seq(1, false), 2).await), ["e2", "e3"]);
        let offset = |offset, inclusive| EventPosition::Offset { offset, inclusive };
        assert_eq!(
            bodies(&from(offset(all[2].offset, true), 2).await),
            ["e2", "e3"]
        );
        assert_eq!(bodies(&from(offset(all[2].offset, false), 1).await), ["e3"]);
        let time = |t, inclusive| EventPosition::EnqueuedTime {
            enqueued_time_ms: t,
            inclusive,
        };
        assert_eq!(from(time(all[0].enqueued_time_ms, true), 4).await.len(), 4);
        assert_eq!(
            bodies(&from(time(all[0].enqueued_time_ms, false), 1).await),
            ["e3"]
        );

        // Latest: only what is sent after the receiver opened.
        let mut latest = consumer
            .open_receiver("1", "$Default", EventPosition::Latest, None, 10)
            .await
            .unwrap();
        let nothing = latest
            .receive(10, Duration::from_millis(200))
            .await
            .unwrap();
        assert!(nothing.is_empty());
        producer.send(&[event("e4")], to_1()).await.unwrap();
        assert_eq!(bodies(&receive_all(&mut latest, 1).await), ["e4"]);
        latest.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_keys_and_round_robin_route_like_event_hubs() {
    let hub = TestHub::start(&[("orders", 4)]).await;
    within("the test", async {
        let producer = ProducerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        let consumer = ConsumerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        // By key: the Event Hubs hash picks the partition, and the key comes back.
        let key = "device-17";
        let keyed = vec![event("k0"), event("k1")];
        producer
            .send(&keyed, SendTarget::PartitionKey(key.to_owned()))
            .await
            .unwrap();
        let keyed_partition = partition_for_key(key, 4).to_string();
        let on_key_partition = read_everything(&consumer, &keyed_partition).await;
        assert_eq!(bodies(&on_key_partition), ["k0", "k1"]);
        assert!(
            on_key_partition
                .iter()
                .all(|e| e.data.partition_key.as_deref() == Some(key))
        );

        // Round robin: every event lands somewhere, spread over more than one partition.
        for i in 0..8 {
            producer
                .send(&[event(&format!("r{i}"))], SendTarget::RoundRobin)
                .await
                .unwrap();
        }
        let mut partitions_used = 0;
        let mut round_robin_events = 0;
        for partition in ["0", "1", "2", "3"] {
            let events = read_everything(&consumer, partition).await;
            let count = events
                .iter()
                .filter(|e| e.data.body.starts_with(b"r"))
                .count();
            assert!(
                events
                    .iter()
                    .all(|e| e.data.partition_key.is_none() || e.data.body.starts_with(b"k"))
            );
            round_robin_events += count;
            partitions_used += usize::from(count > 0);
        }
        assert_eq!(round_robin_events, 8);
        assert!(partitions_used > 1, "round robin used one partition only");
        producer.close().await;
        consumer.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_hub_and_partition_properties() {
    let hub = TestHub::start(&[("telemetry", 3)]).await;
    within("the test", async {
        let consumer = ConsumerClient::connect(&hub.connection_string, "telemetry")
            .await
            .unwrap();
        let properties = consumer.hub_properties().await.unwrap();
        assert_eq!(properties.name, "telemetry");
        assert_eq!(properties.partition_ids, ["0", "1", "2"]);
        assert!(properties.created_at_ms > 1_600_000_000_000);

        let empty = consumer.partition_properties("2").await.unwrap();
        assert!(empty.is_empty);
        assert_eq!(empty.last_enqueued_sequence_number, -1);
        assert_eq!(empty.last_enqueued_offset, None);
        assert_eq!(empty.event_hub_name, "telemetry");
        assert_eq!(empty.id, "2");

        let producer = ProducerClient::connect(&hub.connection_string, "telemetry")
            .await
            .unwrap();
        producer
            .send(
                &[event("a"), event("b")],
                SendTarget::Partition("2".to_owned()),
            )
            .await
            .unwrap();
        let filled = producer.partition_properties("2").await.unwrap();
        let events = read(&consumer, "2", EventPosition::Earliest, 2).await;
        assert!(!filled.is_empty);
        assert_eq!(filled.beginning_sequence_number, 0);
        assert_eq!(filled.last_enqueued_sequence_number, 1);
        assert_eq!(filled.last_enqueued_offset, Some(events[1].offset));
        assert_eq!(filled.last_enqueued_time_ms, events[1].enqueued_time_ms);

        let missing = consumer.partition_properties("7").await.unwrap_err();
        assert!(matches!(missing, ClientError::NotFound { .. }), "{missing}");

        // A hub that does not exist: refused at its token, as Event Hubs refuses it.
        let missing = ConsumerClient::connect(&hub.connection_string, "nowhere")
            .await
            .unwrap_err();
        assert!(matches!(missing, ClientError::NotFound { .. }), "{missing}");
        assert!(
            missing.to_string().contains("could not be found"),
            "{missing}"
        );
        let missing = ProducerClient::connect(&hub.connection_string, "nowhere")
            .await
            .unwrap_err();
        assert!(matches!(missing, ClientError::NotFound { .. }), "{missing}");
        let missing = refusal(
            consumer
                .open_receiver("0", "no-such-group", EventPosition::Earliest, None, 10)
                .await,
        )
        .await;
        assert!(matches!(missing, ClientError::NotFound { .. }), "{missing}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_epoch_steals_the_partition_with_a_typed_error() {
    let hub = TestHub::start(&[("orders", 2)]).await;
    within("the test", async {
        let producer = ProducerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        producer
            .send(&[event("a")], SendTarget::Partition("0".to_owned()))
            .await
            .unwrap();
        let consumer = ConsumerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();

        let mut first = consumer
            .open_receiver("0", "$Default", EventPosition::Earliest, Some(1), 10)
            .await
            .unwrap();
        assert_eq!(receive_all(&mut first, 1).await.len(), 1);

        let mut second = consumer
            .open_receiver("0", "$Default", EventPosition::Earliest, Some(2), 10)
            .await
            .unwrap();
        // Learnt without receiving: what a processor watches while it processes a batch.
        tokio::time::timeout(WAIT, first.taken_over())
            .await
            .expect("the takeover is reported without a receive");
        let stolen = first.receive(10, WAIT).await.unwrap_err();
        assert!(stolen.is_ownership_lost(), "{stolen}");
        // The receiver is finished: it says so again rather than reconnecting.
        let again = first
            .receive(10, Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(again.is_ownership_lost(), "{again}");
        first.close().await;
        assert_eq!(receive_all(&mut second, 1).await.len(), 1);

        // A lower epoch is refused, and so is a non-epoch receiver while an epoch one reads.
        for owner_level in [Some(1), None] {
            let refused = refusal(
                consumer
                    .open_receiver("0", "$Default", EventPosition::Earliest, owner_level, 10)
                    .await,
            )
            .await;
            assert!(refused.is_ownership_lost(), "{owner_level:?}: {refused}");
        }

        // The same through the processor's PartitionSource interface.
        let remote = tributary_client::RemoteHub::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        use tributary_source::PartitionSource;
        let options = |owner_level| ReceiverOptions {
            partition_id: "1".to_owned(),
            consumer_group: "$Default".to_owned(),
            start: EventPosition::Earliest,
            owner_level: Some(owner_level),
            prefetch: 10,
            track_last_enqueued: false,
        };
        let mut old = remote.open_receiver(options(5)).await.unwrap();
        let mut new = remote.open_receiver(options(6)).await.unwrap();
        tokio::time::timeout(WAIT, old.taken_over())
            .await
            .expect("the takeover is reported without a receive");
        let lost = old.receive(10, WAIT).await.unwrap_err();
        assert!(lost.is_ownership_lost(), "{lost}");
        // The new owner's receiver is not taken over.
        let still = tokio::time::timeout(Duration::from_millis(200), new.taken_over()).await;
        assert!(
            still.is_err(),
            "the current owner's receiver reports no takeover"
        );
        second.close().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_equal_epoch_steals_and_an_epoch_receiver_displaces_non_epoch_ones() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    within("the test", async {
        let consumer = ConsumerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        let open = |owner_level| {
            consumer.open_receiver("0", "$Default", EventPosition::Latest, owner_level, 10)
        };
        let mut plain_a = open(None).await.unwrap();
        let mut plain_b = open(None).await.unwrap();
        let mut first = open(Some(3)).await.unwrap();
        for plain in [&mut plain_a, &mut plain_b] {
            let displaced = plain.receive(10, WAIT).await.unwrap_err();
            assert!(displaced.is_ownership_lost(), "{displaced}");
        }
        // At an equal epoch the later attacher wins.
        let mut second = open(Some(3)).await.unwrap();
        let stolen = first.receive(10, WAIT).await.unwrap_err();
        assert!(stolen.is_ownership_lost(), "{stolen}");
        assert!(
            second
                .receive(1, Duration::from_millis(300))
                .await
                .unwrap()
                .is_empty()
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sixth_non_epoch_receiver_is_refused() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    within("the test", async {
        let consumer = ConsumerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        let mut receivers = Vec::new();
        for _ in 0..5 {
            receivers.push(
                consumer
                    .open_receiver("0", "$Default", EventPosition::Latest, None, 10)
                    .await
                    .unwrap(),
            );
        }
        let refused = refusal(
            consumer
                .open_receiver("0", "$Default", EventPosition::Latest, None, 10)
                .await,
        )
        .await;
        assert!(
            matches!(refused, ClientError::QuotaExceeded { .. }),
            "{refused}"
        );
        // Closing one makes room again.
        receivers.pop().unwrap().close().await;
        let mut again = consumer
            .open_receiver("0", "$Default", EventPosition::Latest, None, 10)
            .await
            .unwrap();
        assert!(
            again
                .receive(1, Duration::from_millis(300))
                .await
                .unwrap()
                .is_empty()
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_refused() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    within("the test", async {
        let wrong_key = hub.with_key("bm90LXRoZS1yaWdodC1rZXk=");
        let refused = ProducerClient::connect(&wrong_key, "orders")
            .await
            .unwrap_err();
        assert!(
            matches!(refused, ClientError::Unauthorized { .. }),
            "{refused}"
        );
        assert!(!refused.to_string().contains("bm90LXRoZS1yaWdodC1rZXk="));

        let wrong_name = hub
            .connection_string
            .replace("RootManageSharedAccessKey", "NoSuchPolicy");
        let refused = ConsumerClient::connect(&wrong_name, "orders")
            .await
            .unwrap_err();
        assert!(
            matches!(refused, ClientError::Unauthorized { .. }),
            "{refused}"
        );

        let garbled = ProducerClient::connect("Endpoint=localhost;SharedAccessKey=x", "orders")
            .await
            .unwrap_err();
        assert!(
            matches!(garbled, ClientError::InvalidConnectionString(_)),
            "{garbled}"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_sends_and_bad_arguments_are_refused() {
    let hub = TestHub::start(&[("orders", 2)]).await;
    within("the test", async {
        let producer = ProducerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        let big = EventData::new(vec![b'x'; 2 * 1024 * 1024]);
        let too_large = producer
            .send(&[big], SendTarget::RoundRobin)
            .await
            .unwrap_err();
        assert!(
            matches!(too_large, ClientError::MessageTooLarge { .. }),
            "{too_large}"
        );
        // The producer still works afterwards.
        producer
            .send(&[event("ok")], SendTarget::RoundRobin)
            .await
            .unwrap();

        let none = producer
            .send(&[], SendTarget::RoundRobin)
            .await
            .unwrap_err();
        assert!(matches!(none, ClientError::InvalidArgument(_)), "{none}");
        let bad_id = producer
            .send(&[event("x")], SendTarget::Partition("1/../x".to_owned()))
            .await
            .unwrap_err();
        assert!(
            matches!(bad_id, ClientError::InvalidArgument(_)),
            "{bad_id}"
        );
        let out_of_range = producer
            .send(&[event("x")], SendTarget::Partition("9".to_owned()))
            .await
            .unwrap_err();
        assert!(
            matches!(&out_of_range, ClientError::Refused { condition, .. } if condition == "com.microsoft:argument-out-of-range"),
            "{out_of_range}"
        );
        let mut keyed = event("x");
        keyed.partition_key = Some("a".to_owned());
        let mismatch = producer
            .send(&[keyed], SendTarget::RoundRobin)
            .await
            .unwrap_err();
        assert!(
            matches!(mismatch, ClientError::InvalidArgument(_)),
            "{mismatch}"
        );

        let consumer = ConsumerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        let zero = consumer
            .open_receiver("0", "$Default", EventPosition::Earliest, None, 0)
            .await
            .unwrap_err();
        assert!(matches!(zero, ClientError::InvalidArgument(_)), "{zero}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_the_last_enqueued_event_when_asked() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    within("the test", async {
        let producer = ProducerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        let events: Vec<EventData> = (0..5).map(|i| event(&format!("e{i}"))).collect();
        producer
            .send(&events, SendTarget::Partition("0".to_owned()))
            .await
            .unwrap();
        let consumer = ConsumerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        let mut receiver = consumer
            .open_receiver_with(&ReceiverOptions {
                partition_id: "0".to_owned(),
                consumer_group: "$Default".to_owned(),
                start: EventPosition::Earliest,
                owner_level: None,
                prefetch: 2,
                track_last_enqueued: true,
            })
            .await
            .unwrap();
        assert_eq!(receiver.last_enqueued(), None);
        let first = receiver.receive(1, WAIT).await.unwrap();
        assert_eq!(first.len(), 1);
        let latest = receiver.last_enqueued().expect("runtime metric");
        assert_eq!(latest.sequence_number, 4);
        // With a prefetch of 2 the rest still arrives, credit being topped up as it is used.
        let rest = receive_all(&mut receiver, 4).await;
        assert_eq!(bodies(&rest), ["e1", "e2", "e3", "e4"]);
        assert_eq!(receiver.last_enqueued().unwrap().offset, rest[3].offset);

        // Without asking, nothing is reported.
        let mut plain = consumer
            .open_receiver("0", "$Default", EventPosition::Earliest, None, 10)
            .await
            .unwrap();
        assert_eq!(receive_all(&mut plain, 5).await.len(), 5);
        assert_eq!(plain.last_enqueued(), None);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_is_transient_and_the_next_call_reconnects() {
    let mut hub = TestHub::start(&[("orders", 1)]).await;
    within("the test", async {
        let options = ClientOptions::default().with_operation_timeout(Duration::from_secs(10));
        let consumer = ConsumerClient::connect_with_options(
            &hub.connection_string,
            Some("orders"),
            options.clone(),
        )
        .await
        .unwrap();
        let producer =
            ProducerClient::connect_with_options(&hub.connection_string, Some("orders"), options)
                .await
                .unwrap();
        producer
            .send(&[event("before")], SendTarget::RoundRobin)
            .await
            .unwrap();
        let mut receiver = consumer
            .open_receiver("0", "$Default", EventPosition::Earliest, Some(1), 10)
            .await
            .unwrap();
        assert_eq!(receive_all(&mut receiver, 1).await.len(), 1);

        hub.stop_server().await;
        let lost = receiver.receive(10, WAIT).await.unwrap_err();
        assert!(lost.is_transient(), "{lost}");
        let source_error: tributary_source::SourceError = lost.into();
        assert!(source_error.is_transient());
        let down = producer
            .send(&[event("while down")], SendTarget::RoundRobin)
            .await
            .unwrap_err();
        assert!(down.is_transient(), "{down}");

        hub.restart_server().await;
        producer
            .send(&[event("after")], SendTarget::RoundRobin)
            .await
            .unwrap();
        let mut reopened = consumer
            .open_receiver("0", "$Default", EventPosition::Earliest, Some(2), 10)
            .await
            .unwrap();
        assert_eq!(
            bodies(&receive_all(&mut reopened, 2).await),
            ["before", "after"]
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_renewed_before_they_expire() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    within("the test", async {
        // Control: a signature that cannot be renewed stops working once it expires.
        let root = hub.policies.get("RootManageSharedAccessKey").unwrap();
        let token = tributary_client::sas::token_for(
            &tributary_client::Credential::SharedAccessKey {
                key_name: root.name.clone(),
                key: root.key.clone(),
            },
            "sb://127.0.0.1/orders",
            now_s(),
            Duration::from_secs(2),
        );
        let fixed = format!(
            "Endpoint=sb://127.0.0.1:{};SharedAccessSignature={};UseDevelopmentEmulator=true",
            hub.addr.port(),
            token.value
        );
        let short_lived = ConsumerClient::connect(&fixed, "orders").await.unwrap();
        // Links attached while the token was valid do not outlive it.
        let mut attached = short_lived
            .open_receiver("0", "$Default", EventPosition::Latest, None, 10)
            .await
            .unwrap();
        let short_producer = ProducerClient::connect(&fixed, "orders").await.unwrap();
        let to_0 = || SendTarget::Partition("0".to_owned());
        short_producer
            .send(&[event("before")], to_0())
            .await
            .unwrap();
        assert_eq!(bodies(&receive_all(&mut attached, 1).await), ["before"]);
        // A client signing its own two-second tokens renews them on the connection.
        let options = ClientOptions::default().with_token_lifetime(Duration::from_secs(2));
        let renewing =
            ConsumerClient::connect_with_options(&hub.connection_string, Some("orders"), options)
                .await
                .unwrap();
        let mut renewed = renewing
            .open_receiver("0", "$Default", EventPosition::Latest, None, 10)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(4)).await;

        let cut = attached.receive(10, WAIT).await.unwrap_err();
        assert!(matches!(cut, ClientError::Unauthorized { .. }), "{cut}");
        let refused = short_producer
            .send(&[event("after expiry")], to_0())
            .await
            .unwrap_err();
        assert!(
            matches!(refused, ClientError::Unauthorized { .. }),
            "{refused}"
        );
        // The renewing client's link lived on through its renewals.
        let producer = ProducerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        producer.send(&[event("renewed")], to_0()).await.unwrap();
        assert_eq!(bodies(&receive_all(&mut renewed, 1).await), ["renewed"]);
        new_links_after_expiry(&short_lived, &renewing).await;
    })
    .await;
}

/// After its token expired, `short_lived` cannot attach a link; `renewing`, which renews its
/// own tokens, can, and its management requests work.
async fn new_links_after_expiry(short_lived: &ConsumerClient, renewing: &ConsumerClient) {
    let expired = refusal(
        short_lived
            .open_receiver("0", "$Default", EventPosition::Latest, None, 10)
            .await,
    )
    .await;
    assert!(
        matches!(expired, ClientError::Unauthorized { .. }),
        "{expired}"
    );

    let mut receiver = renewing
        .open_receiver("0", "$Default", EventPosition::Latest, None, 10)
        .await
        .unwrap();
    assert!(
        receiver
            .receive(1, Duration::from_millis(300))
            .await
            .unwrap()
            .is_empty()
    );
    renewing.hub_properties().await.unwrap();
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Event Hubs detaches a displaced receiver at once, so it sees at most what was already in
/// flight to it (its credit), not what the server had fetched for it from the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_displaced_receiver_sees_at_most_its_prefetch() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    within("the test", async {
        let producer = ProducerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        let batch: Vec<EventData> = (0..100).map(|i| event(&format!("{i}"))).collect();
        producer
            .send(&batch, SendTarget::Partition("0".to_owned()))
            .await
            .unwrap();
        let consumer = ConsumerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        let prefetch = 2;
        let mut old = consumer
            .open_receiver("0", "$Default", EventPosition::Earliest, Some(1), prefetch)
            .await
            .unwrap();
        assert_eq!(old.receive(1, WAIT).await.unwrap().len(), 1);
        let _new = consumer
            .open_receiver("0", "$Default", EventPosition::Earliest, Some(2), 10)
            .await
            .unwrap();
        let mut after_steal = 0;
        let error = loop {
            match old.receive(1, WAIT).await {
                Ok(events) if events.is_empty() => panic!("neither events nor an error"),
                Ok(events) => after_steal += events.len(),
                Err(error) => break error,
            }
        };
        assert!(error.is_ownership_lost(), "{error}");
        // At the steal, what waits in the receiver plus its credit is at most its prefetch.
        assert!(
            after_steal <= prefetch as usize,
            "{after_steal} events read after the steal"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_a_plain_endpoint_fails_with_a_clear_error() {
    let hub = TestHub::start(&[("orders", 1)]).await;
    within("the test", async {
        // Without UseDevelopmentEmulator=true the client speaks TLS, which this hub does not.
        let tls = hub
            .connection_string
            .replace(";UseDevelopmentEmulator=true", "");
        let error = ProducerClient::connect(&tls, "orders").await.unwrap_err();
        assert!(matches!(error, ClientError::Connect { .. }), "{error}");
        assert!(error.to_string().contains("TLS"), "{error}");
        assert!(error.is_transient());
        // Nothing listens here: a connect error naming the endpoint.
        let port = hub.addr.port();
        let closed = hub.connection_string.replace(&format!(":{port}"), ":1");
        let error = ProducerClient::connect(&closed, "orders")
            .await
            .unwrap_err();
        assert!(error.to_string().contains("127.0.0.1:1"), "{error}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sends_to_one_partition_pipeline_and_land_whole() {
    let hub = TestHub::start(&[("orders", 2)]).await;
    within("the test", async {
        let producer = ProducerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        // 32 batches of 10 sent at once on one link, with oversize sends mixed in: those fail
        // alone and the others still land.
        let mut sends = tokio::task::JoinSet::new();
        for b in 0..32 {
            let producer = producer.clone();
            sends.spawn(async move {
                let events: Vec<EventData> = (0..10).map(|i| event(&format!("b{b}-{i}"))).collect();
                let to_0 = SendTarget::Partition("0".to_owned());
                if b % 8 == 3 {
                    let big = EventData::new(vec![b'x'; 2 * 1024 * 1024]);
                    let refused = producer.send(&[big], to_0.clone()).await.unwrap_err();
                    assert!(matches!(refused, ClientError::MessageTooLarge { .. }));
                }
                producer.send(&events, to_0).await.map(|()| b)
            });
        }
        let mut sent = 0;
        while let Some(outcome) = sends.join_next().await {
            outcome.unwrap().unwrap();
            sent += 1;
        }
        assert_eq!(sent, 32);
        let consumer = ConsumerClient::connect(&hub.connection_string, "orders")
            .await
            .unwrap();
        let events = read_everything(&consumer, "0").await;
        assert_eq!(events.len(), 320);
        // Each batch landed whole: ten consecutive events, in the order given.
        let bodies = bodies(&events);
        let mut batches = std::collections::BTreeSet::new();
        for chunk in bodies.chunks(10) {
            let batch = chunk[0].split('-').next().unwrap().to_owned();
            let expected: Vec<String> = (0..10).map(|i| format!("{batch}-{i}")).collect();
            assert_eq!(chunk, expected.as_slice());
            assert!(batches.insert(batch), "a batch landed twice");
        }
        assert_eq!(batches.len(), 32);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_acknowledges_every_send_that_reached_the_log() {
    let mut hub = TestHub::start(&[("orders", 2)]).await;
    within("the test", async {
        let options = ClientOptions::default().with_operation_timeout(Duration::from_secs(5));
        let producer =
            ProducerClient::connect_with_options(&hub.connection_string, Some("orders"), options)
                .await
                .unwrap();
        // Sixteen senders keep batches in flight on both partitions until the server stops.
        let acknowledged = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let mut senders = tokio::task::JoinSet::new();
        for s in 0..16 {
            let (producer, acknowledged) = (producer.clone(), acknowledged.clone());
            senders.spawn(async move {
                let to = SendTarget::Partition((s % 2).to_string());
                for b in 0.. {
                    let events: Vec<EventData> =
                        (0..10).map(|i| event(&format!("s{s}-b{b}-{i}"))).collect();
                    if producer.send(&events, to.clone()).await.is_err() {
                        return;
                    }
                    acknowledged.fetch_add(10, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
        while acknowledged.load(std::sync::atomic::Ordering::SeqCst) < 200 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        hub.stop_server().await;
        while senders.join_next().await.is_some() {}
        // Every batch in the log was acknowledged: the links drained before they detached, so
        // no client is left to send again what is already stored.
        let stored: i64 = ["0", "1"]
            .iter()
            .map(|p| {
                let props = hub.broker.partition_properties("orders", p).unwrap();
                props.last_enqueued_sequence_number + 1
            })
            .sum();
        let acknowledged = acknowledged.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(stored as u64, acknowledged);
    })
    .await;
}
