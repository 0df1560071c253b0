//! Interop tests with the official Rust SDK (`azure_messaging_eventhubs` 0.16, on fe2o3-amqp),
//! used unmodified as an application would.
//!
//! The SDK takes the namespace's host from the connection string's `Endpoint` and always dials
//! `amqps://<host>` (port 5671); it has no emulator switch. Its documented
//! `with_custom_endpoint` (an AMQP proxy) carries the scheme and port it dials, so each client
//! here gets `amqp://127.0.0.1:<port>` — the AMQP door in plain AMQP, as the emulator serves —
//! while the AMQP `hostname` and the SAS token's audience stay the connection string's
//! (`amqps://127.0.0.1/<hub>`). It signs SAS tokens from the connection string's key itself
//! and puts them on `$cbs` as `servicebus.windows.net:sastoken`.
//!
//! Each test starts its own hub in process (a broker on a temporary directory and the AMQP door
//! on 127.0.0.1:0): starting one costs milliseconds, and no test sees another's events.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration as StdDuration, SystemTime, UNIX_EPOCH};

use azure_messaging_eventhubs::models::{
    AmqpSimpleValue, EventData, MessageId, ReceivedEventData, StartPositions,
};
use azure_messaging_eventhubs::processor::PartitionClient;
use azure_messaging_eventhubs::{
    CheckpointStore, ConsumerClient, EventDataBatchOptions, EventProcessor,
    InMemoryCheckpointStore, OpenReceiverOptions, ProcessorStrategy, ProducerClient,
    SendEventOptions, StartLocation, StartPosition,
};
use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::join_all;
use time::Duration;
use tributary_event::{EventData as StoredData, PropertyValue, ReceivedEvent, partition_for_key};
use tributary_testkit::{TestHub, within};

/// Where the SDK dials the hub: the AMQP door, in plain AMQP (see the module comment).
fn endpoint(f: &TestHub) -> String {
    format!("amqp://127.0.0.1:{}", f.port())
}

async fn producer(f: &TestHub, hub: &str) -> ProducerClient {
    let open = ProducerClient::builder()
        .with_custom_endpoint(endpoint(f))
        .open_with_connection_string(&f.connection_string, Some(hub));
    within("the SDK's producer opening", open)
        .await
        .expect("the SDK's producer opens")
}

async fn consumer(f: &TestHub, hub: &str) -> ConsumerClient {
    let open = ConsumerClient::builder()
        .with_custom_endpoint(endpoint(f))
        .open_with_connection_string(&f.connection_string, Some(hub));
    within("the SDK's consumer opening", open)
        .await
        .expect("the SDK's consumer opens")
}

/// What the SDK should hand an application for a property Tributary stored.
fn sdk_value(value: &PropertyValue) -> AmqpSimpleValue {
    match value {
        PropertyValue::Null => AmqpSimpleValue::Null,
        PropertyValue::Bool(b) => AmqpSimpleValue::Boolean(*b),
        PropertyValue::Int32(i) => AmqpSimpleValue::Int(*i),
        PropertyValue::Int64(i) => AmqpSimpleValue::Long(*i),
        PropertyValue::UInt32(u) => AmqpSimpleValue::UInt(*u),
        PropertyValue::UInt64(u) => AmqpSimpleValue::ULong(*u),
        PropertyValue::Float32(x) => AmqpSimpleValue::Float(*x),
        PropertyValue::Float64(x) => AmqpSimpleValue::Double(*x),
        PropertyValue::String(s) => AmqpSimpleValue::String(s.to_string()),
        PropertyValue::Bytes(b) => AmqpSimpleValue::Binary(b.to_vec()),
        PropertyValue::Timestamp(ms) => AmqpSimpleValue::TimeStamp(at_ms(*ms).into()),
        PropertyValue::Uuid(u) => AmqpSimpleValue::Uuid(uuid::Uuid::from_bytes(*u)),
    }
}

fn at_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + StdDuration::from_millis(u64::try_from(ms).expect("after 1970"))
}

fn sdk_properties(stored: &StoredData) -> HashMap<String, AmqpSimpleValue> {
    stored
        .properties
        .iter()
        .map(|(k, v)| (k.to_string(), sdk_value(v)))
        .collect()
}

/// One property of every type both Tributary and the SDK name.
fn typed_properties() -> Vec<(tributary_event::SmolStr, PropertyValue)> {
    let props = [
        ("str", PropertyValue::String("text".into())),
        ("int", PropertyValue::Int32(-7)),
        ("long", PropertyValue::Int64(1 << 40)),
        ("uint", PropertyValue::UInt32(7)),
        ("ulong", PropertyValue::UInt64(u64::MAX)),
        ("float", PropertyValue::Float32(1.5)),
        ("double", PropertyValue::Float64(2.5)),
        ("bool", PropertyValue::Bool(true)),
        (
            "bytes",
            PropertyValue::Bytes(Bytes::from_static(b"\x00\xff")),
        ),
        ("time", PropertyValue::Timestamp(1_714_979_289_000)),
        ("uuid", PropertyValue::Uuid([0x12; 16])),
        ("none", PropertyValue::Null),
    ];
    props.into_iter().map(|(k, v)| (k.into(), v)).collect()
}

/// An SDK event carrying `typed_properties`, a content type and correlation and message ids.
fn sdk_typed_event(body: &str) -> EventData {
    let mut builder = EventData::builder()
        .with_body(body.as_bytes().to_vec())
        .with_content_type("application/json".to_owned())
        .with_correlation_id("corr-1")
        .with_message_id(format!("msg-{body}"));
    for (key, value) in typed_properties() {
        builder = builder.add_property(key.to_string(), sdk_value(&value));
    }
    builder.build()
}

fn body_text(event: &ReceivedEvent) -> String {
    String::from_utf8_lossy(&event.data.body).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_producer_sends_batches_by_partition_and_key_and_single_events() {
    let f = TestHub::start(&[("orders", 4)]).await;
    let producer = producer(&f, "orders").await;

    let to_partition = EventDataBatchOptions {
        partition_id: Some("1".to_owned()),
        ..Default::default()
    };
    let batch = within("create_batch", producer.create_batch(Some(to_partition)))
        .await
        .expect("a batch for partition 1");
    for body in ["p1-a", "p1-b", "p1-c"] {
        assert!(
            batch
                .try_add_event_data(sdk_typed_event(body), None)
                .unwrap()
        );
    }
    within("send_batch", producer.send_batch(batch, None))
        .await
        .expect("the batch is accepted");

    let keyed = EventDataBatchOptions {
        partition_key: Some("alpha".to_owned()),
        ..Default::default()
    };
    let batch = within("create_batch", producer.create_batch(Some(keyed)))
        .await
        .expect("a keyed batch");
    for body in ["key-0", "key-1", "key-2"] {
        assert!(batch.try_add_event_data(body, None).unwrap());
    }
    within("send_batch", producer.send_batch(batch, None))
        .await
        .expect("the keyed batch is accepted");

    let to_2 = SendEventOptions {
        partition_id: Some("2".to_owned()),
    };
    within("send_event", producer.send_event("single", Some(to_2)))
        .await
        .expect("the single event is accepted");
    within("close", producer.close()).await.unwrap();

    stored_as_sent(&f).await;
    f.stop().await;
}

/// What `sdk_producer_sends_…` sent is stored where it was sent, in order, exactly.
async fn stored_as_sent(f: &TestHub) {
    // "alpha" may hash to partition 1 too: only the batch sent to the partition is checked here.
    let p1: Vec<_> = f
        .read_all("orders", 1)
        .await
        .into_iter()
        .filter(|e| e.data.partition_key.is_none())
        .collect();
    assert_eq!(
        p1.iter().map(body_text).collect::<Vec<_>>(),
        ["p1-a", "p1-b", "p1-c"]
    );
    for event in &p1 {
        let data = &event.data;
        // The SDK keeps an event's properties in a `HashMap`: their order is its hasher's.
        let mut properties = data.properties.clone();
        properties.sort_by(|a, b| a.0.cmp(&b.0));
        let mut sent = typed_properties();
        sent.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(properties, sent, "{}", body_text(event));
        assert_eq!(data.content_type.as_deref(), Some("application/json"));
        assert_eq!(data.correlation_id.as_deref(), Some("corr-1"));
        assert_eq!(data.message_id, Some(format!("msg-{}", body_text(event))));
        assert_eq!(data.partition_key, None);
    }

    let alpha = f.read_all("orders", partition_for_key("alpha", 4)).await;
    let keyed: Vec<_> = alpha
        .iter()
        .filter(|e| e.data.partition_key.as_deref() == Some("alpha"))
        .map(body_text)
        .collect();
    assert_eq!(keyed, ["key-0", "key-1", "key-2"]);

    let p2 = f.read_all("orders", 2).await;
    let single = p2
        .iter()
        .find(|e| &e.data.body[..] == b"single")
        .expect("the single event is in partition 2");
    assert_eq!(single.data.partition_key, None);
    assert!(single.data.properties.is_empty());
}

/// Events Tributary stored (appended in process, so the consumer is the only SDK code involved)
/// in the partition the key `alpha` hashes to: a typed one, a keyed one, a plain one.
async fn seed_typed(f: &TestHub, hub: &str, partitions: u32) -> (String, Vec<ReceivedEvent>) {
    use tributary_event::SendTarget;
    let partition = partition_for_key("alpha", partitions).to_string();
    let mut typed = StoredData::new(&b"typed"[..]);
    typed.properties = typed_properties();
    typed.content_type = Some("application/json".into());
    typed.correlation_id = Some("corr-1".into());
    typed.message_id = Some("msg-1".into());
    let sends = [
        (SendTarget::Partition(partition.clone()), typed),
        (
            SendTarget::PartitionKey("alpha".into()),
            StoredData::new(&b"keyed"[..]),
        ),
        (
            SendTarget::Partition(partition.clone()),
            StoredData::new(&b"plain"[..]),
        ),
    ];
    for (target, event) in sends {
        f.broker
            .send(hub, target, vec![event])
            .await
            .expect("seeded");
    }
    let stored = f.read_all(hub, partition.parse().unwrap()).await;
    assert_eq!(stored[1].data.partition_key.as_deref(), Some("alpha"));
    (partition, stored)
}

/// Reads `count` events with the SDK's receiver from `start`; `to_the_end`: and then no more.
async fn sdk_read(
    consumer: &ConsumerClient,
    partition: &str,
    start: StartPosition,
    count: usize,
    to_the_end: bool,
) -> Vec<ReceivedEventData> {
    let options = OpenReceiverOptions {
        start_position: Some(start),
        ..Default::default()
    };
    let open = consumer.open_receiver_on_partition(partition.to_owned(), Some(options));
    let receiver = within("open_receiver_on_partition", open)
        .await
        .expect("the SDK's receiver opens");
    let mut events = Vec::new();
    {
        let mut stream = receiver.stream_events();
        while events.len() < count {
            let event = within("an event", stream.next())
                .await
                .expect("the stream goes on");
            events.push(event.expect("an event"));
        }
        if to_the_end {
            // Nothing after the partition's last event: no duplicate, nothing made up.
            let more = tokio::time::timeout(StdDuration::from_millis(300), stream.next()).await;
            assert!(more.is_err(), "an event past the end: {more:?}");
        }
    }
    within("receiver close", receiver.close()).await.unwrap();
    events
}

/// The SDK's view of an event equals what Tributary stored.
fn assert_same(got: &ReceivedEventData, stored: &ReceivedEvent) {
    let what = body_text(stored);
    let data = got.event_data();
    assert_eq!(data.body(), Some(&stored.data.body[..]), "{what}");
    assert_eq!(
        got.sequence_number(),
        Some(stored.sequence_number),
        "{what}"
    );
    assert_eq!(got.offset(), &Some(stored.offset.to_string()), "{what}");
    assert_eq!(
        got.enqueued_time(),
        Some(at_ms(stored.enqueued_time_ms)),
        "{what}"
    );
    assert_eq!(got.partition_key(), &stored.data.partition_key, "{what}");
    let properties = data.properties().cloned().unwrap_or_default();
    assert_eq!(properties, sdk_properties(&stored.data), "{what}");
    assert_eq!(
        data.content_type(),
        stored.data.content_type.as_deref(),
        "{what}"
    );
    let id = |s: &Option<String>| s.clone().map(MessageId::String);
    assert_eq!(
        data.correlation_id(),
        id(&stored.data.correlation_id).as_ref(),
        "{what}"
    );
    assert_eq!(
        data.message_id(),
        id(&stored.data.message_id).as_ref(),
        "{what}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_consumer_reads_what_tributary_stored_from_each_start_position() {
    let f = TestHub::start(&[("reads", 2)]).await;
    let (p, stored) = seed_typed(&f, "reads", 2).await;
    let consumer = consumer(&f, "reads").await;

    let earliest = StartPosition {
        location: StartLocation::Earliest,
        inclusive: false,
    };
    let got = sdk_read(&consumer, &p, earliest, stored.len(), true).await;
    assert_eq!(got.len(), stored.len());
    for (got, stored) in got.iter().zip(&stored) {
        assert_same(got, stored);
    }

    // After a sequence number (exclusive), from an offset (inclusive), from an enqueued time.
    let after_first = StartPosition {
        location: StartLocation::SequenceNumber(stored[0].sequence_number),
        inclusive: false,
    };
    let got = sdk_read(&consumer, &p, after_first, 1, false).await;
    assert_same(&got[0], &stored[1]);
    let at_last = StartPosition {
        location: StartLocation::Offset(stored[2].offset.to_string()),
        inclusive: true,
    };
    let got = sdk_read(&consumer, &p, at_last, 1, true).await;
    assert_same(&got[0], &stored[2]);
    let from_time = StartPosition {
        location: StartLocation::EnqueuedTime(at_ms(stored[0].enqueued_time_ms)),
        inclusive: true,
    };
    let got = sdk_read(&consumer, &p, from_time, 1, false).await;
    assert_same(&got[0], &stored[0]);

    let other = if p == "0" { "1" } else { "0" };
    sdk_message_id_round_trips(&f, &consumer, other).await;
    within("close", consumer.close()).await.unwrap();
    f.stop().await;
}

/// `send_event` gives an event without a message id a UUID one: it comes back as a UUID.
async fn sdk_message_id_round_trips(f: &TestHub, consumer: &ConsumerClient, partition: &str) {
    let producer = producer(f, "reads").await;
    let to_empty = SendEventOptions {
        partition_id: Some(partition.to_owned()),
    };
    within("send_event", producer.send_event("no id", Some(to_empty)))
        .await
        .expect("accepted");
    within("close", producer.close()).await.unwrap();
    let earliest = StartPosition {
        location: StartLocation::Earliest,
        inclusive: false,
    };
    let got = sdk_read(consumer, partition, earliest, 1, true).await;
    assert_eq!(got[0].event_data().body(), Some(&b"no id"[..]));
    assert!(
        matches!(got[0].event_data().message_id(), Some(MessageId::Uuid(_))),
        "{:?}",
        got[0].event_data().message_id()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_reads_hub_and_partition_properties() {
    let f = TestHub::start(&[("props", 3)]).await;
    f.send("props", "1", "a").await;
    let last = f.send("props", "1", "b").await;
    let producer = producer(&f, "props").await;

    let hub = within(
        "get_eventhub_properties",
        producer.get_eventhub_properties(),
    )
    .await
    .expect("hub properties");
    assert_eq!(hub.name, "props");
    assert_eq!(hub.partition_ids, ["0", "1", "2"]);
    let created = f.broker.describe_hub("props").unwrap().created_at_ms;
    assert_eq!(hub.created_on, Some(at_ms(created)));

    let p1 = within("partition 1", producer.get_partition_properties("1"))
        .await
        .expect("partition 1's properties");
    assert_eq!((p1.id.as_str(), p1.eventhub.as_str()), ("1", "props"));
    assert_eq!(p1.beginning_sequence_number, 0);
    assert_eq!(p1.last_enqueued_sequence_number, 1);
    assert_eq!(p1.last_enqueued_offset, last.offsets[0].to_string());
    assert_eq!(
        p1.last_enqueued_time_utc,
        Some(at_ms(last.enqueued_time_ms))
    );
    assert!(!p1.is_empty);

    // An empty partition, as Event Hubs describes one: nothing enqueued, offset "-1".
    let p0 = within("partition 0", producer.get_partition_properties("0"))
        .await
        .expect("partition 0's properties");
    assert!(p0.is_empty);
    assert_eq!(p0.last_enqueued_sequence_number, -1);
    assert_eq!(p0.last_enqueued_offset, "-1");

    // A partition the hub does not have is an error, not a hang or a made-up answer.
    let missing = within("partition 9", producer.get_partition_properties("9")).await;
    assert!(missing.is_err(), "{missing:?}");
    within("close", producer.close()).await.unwrap();
    f.stop().await;
}

/// A wrong key and an unknown policy sending, and a send-only policy reading: each refused with
/// an error the application sees (not a hang, not retried forever); nothing stored or read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_with_a_wrong_key_is_refused_with_an_error() {
    let f = TestHub::start(&[("locked", 1)]).await;
    let wrong_key = f.with_key("d3Jvbmcta2V5");
    let wrong_policy = f
        .connection_string
        .replace("RootManageSharedAccessKey", "no-such-policy");
    for conn in [&wrong_key, &wrong_policy] {
        let open = ProducerClient::builder()
            .with_custom_endpoint(endpoint(&f))
            .open_with_connection_string(conn, Some("locked"));
        let outcome = match within("opening with a wrong key", open).await {
            Ok(producer) => within("send", producer.send_event("nope", None)).await,
            Err(e) => Err(e),
        };
        let error = outcome.expect_err("a wrong key is refused");
        // The SDK puts its token on `$cbs` as it opens; it words the node's 401 answer as a
        // "Management API" status.
        let text = format!("{error:?}");
        assert!(text.contains("status code: 401"), "{text}");
    }
    assert!(f.read_all("locked", 0).await.is_empty());

    // Rights are checked at attach: a send-only policy may not read. (Not a listen-only policy
    // sending: the SDK's AMQP engine, fe2o3-amqp 0.16.2, records a delivery as unsettled only
    // after handing its transfer to the session, so a disposition that comes back within that
    // gap — the door rejects a refused link's deliveries at once — is lost and the send waits
    // forever. fe2o3-amqp 0.18 registers the delivery first.)
    let send_only = f.conn(&f.send);
    f.send("locked", "0", "secret").await;
    let open = ConsumerClient::builder()
        .with_custom_endpoint(endpoint(&f))
        .open_with_connection_string(&send_only, Some("locked"));
    let consumer = within("opening with send rights", open)
        .await
        .expect("a send-only policy may connect");
    let options = OpenReceiverOptions {
        start_position: Some(StartPosition {
            location: StartLocation::Earliest,
            inclusive: false,
        }),
        ..Default::default()
    };
    let outcome: Result<(), _> = match within(
        "open_receiver_on_partition",
        consumer.open_receiver_on_partition("0".to_owned(), Some(options)),
    )
    .await
    {
        Ok(receiver) => match within("receive", receiver.stream_events().next()).await {
            Some(Ok(event)) => panic!("send rights read {:?}", event.event_data().body()),
            Some(Err(e)) => Err(e),
            None => panic!("the stream ended without an error"),
        },
        Err(e) => Err(e),
    };
    let text = format!("{:?}", outcome.expect_err("send rights cannot read"));
    assert!(text.contains("UnauthorizedAccess"), "{text}");
    assert!(text.contains("'Listen' claim(s) are required"), "{text}");
    f.stop().await;
}

/// The processor's timing, short so a test takes seconds: ownership is renewed every 300 ms and
/// lapses after 2 s (the SDK refuses an expiry not above the interval).
const UPDATE_INTERVAL: Duration = Duration::milliseconds(300);
const OWNERSHIP_EXPIRY: Duration = Duration::seconds(2);

/// Runs an SDK `EventProcessor` on `hub` until it has processed `per_partition` events from
/// each of its `partitions` partitions, checkpointing each partition's last one in `store`.
/// Returns the (sequence number, body) pairs each partition client saw.
async fn process(
    f: &TestHub,
    hub: &str,
    partitions: usize,
    per_partition: usize,
    store: Arc<InMemoryCheckpointStore>,
) -> HashMap<String, Vec<(i64, String)>> {
    let earliest = StartPosition {
        location: StartLocation::Earliest,
        inclusive: false,
    };
    let build = EventProcessor::builder()
        .with_update_interval(UPDATE_INTERVAL)
        .with_partition_expiration_duration(OWNERSHIP_EXPIRY)
        .with_load_balancing_strategy(ProcessorStrategy::Greedy)
        .with_start_positions(StartPositions {
            default: earliest,
            ..Default::default()
        })
        .build(consumer(f, hub).await, store);
    let processor = within("the processor's build", build)
        .await
        .expect("the processor builds");
    let running = tokio::spawn({
        let processor = processor.clone();
        async move { processor.run().await }
    });
    let mut clients = Vec::new();
    for _ in 0..partitions {
        let client = within("next_partition_client", processor.next_partition_client())
            .await
            .expect("a partition is assigned");
        clients.push(client);
    }
    // The SDK's event streams are not `Send`: the partitions are read concurrently on this task.
    let readers = clients
        .into_iter()
        .map(|client| process_partition(client, per_partition));
    let mut seen = HashMap::new();
    for (partition, events) in within("the partitions' events", join_all(readers)).await {
        assert!(
            seen.insert(partition, events).is_none(),
            "a partition assigned twice"
        );
    }
    processor.shutdown().await.expect("shutdown");
    within("the processor's loop", running)
        .await
        .unwrap()
        .expect("the processor ran without an error");
    let Ok(processor) = Arc::try_unwrap(processor) else {
        panic!("the processor's last reference is held elsewhere");
    };
    within("the processor's close", processor.close())
        .await
        .expect("closed");
    seen
}

/// One partition client's share of `process`: `count` events, then a checkpoint at the last.
async fn process_partition(
    client: Arc<PartitionClient>,
    count: usize,
) -> (String, Vec<(i64, String)>) {
    let mut seen = Vec::new();
    let mut last = None;
    {
        let mut events = client.stream_events();
        while seen.len() < count {
            let event = events
                .next()
                .await
                .expect("the stream goes on")
                .expect("an event");
            let body = String::from_utf8_lossy(event.event_data().body().unwrap()).into_owned();
            seen.push((event.sequence_number().expect("a sequence number"), body));
            last = Some(event);
        }
    }
    let last = last.expect("at least one event");
    client.update_checkpoint(&last).await.expect("checkpointed");
    let partition = client.get_partition_id().to_owned();
    let Ok(client) = Arc::try_unwrap(client) else {
        panic!("the partition client's last reference is held elsewhere");
    };
    client.close().await.expect("the partition client closes");
    (partition, seen)
}

async fn seed(f: &TestHub, hub: &str, partitions: usize, round: &str, count: usize) {
    for p in 0..partitions {
        for i in 0..count {
            f.send(hub, &p.to_string(), &format!("{round}-{p}-{i}"))
                .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_event_processor_processes_every_event_once_and_resumes_from_checkpoints() {
    const PARTITIONS: usize = 3;
    let f = TestHub::start(&[("work", PARTITIONS as u32)]).await;
    let store = Arc::new(InMemoryCheckpointStore::new());

    seed(&f, "work", PARTITIONS, "first", 5).await;
    let seen = process(&f, "work", PARTITIONS, 5, store.clone()).await;
    assert_processed(&seen, PARTITIONS, "first", 0..5);
    let checkpoints = store
        .list_checkpoints("127.0.0.1", "work", "$Default")
        .await
        .expect("checkpoints");
    assert_eq!(checkpoints.len(), PARTITIONS);
    for checkpoint in &checkpoints {
        let stored = f
            .read_all("work", checkpoint.partition_id.parse().unwrap())
            .await;
        assert_eq!(checkpoint.sequence_number, Some(4), "{checkpoint:?}");
        assert_eq!(checkpoint.offset, Some(stored[4].offset.to_string()));
    }

    // A processor started once the first one's ownership lapsed resumes after each checkpoint
    // (the SDK starts from the checkpoint's offset): only the new events, each once.
    tokio::time::sleep(StdDuration::from_millis(2500)).await;
    seed(&f, "work", PARTITIONS, "second", 2).await;
    let seen = process(&f, "work", PARTITIONS, 2, store.clone()).await;
    assert_processed(&seen, PARTITIONS, "second", 5..7);
    f.stop().await;
}

/// Each partition's events of `round`, with sequence numbers `range`, each exactly once.
fn assert_processed(
    seen: &HashMap<String, Vec<(i64, String)>>,
    partitions: usize,
    round: &str,
    range: std::ops::Range<i64>,
) {
    assert_eq!(seen.len(), partitions, "{seen:?}");
    for p in 0..partitions {
        let expected: Vec<_> = range
            .clone()
            .zip(0..)
            .map(|(sequence, i)| (sequence, format!("{round}-{p}-{i}")))
            .collect();
        assert_eq!(seen[&p.to_string()], expected);
    }
}
