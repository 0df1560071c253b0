//! Seed inputs for every target, made by Tributary's own encoders (plus a few hand-made edge
//! cases), so a fuzzer starts from inputs that reach deep into each decoder. The corpus files
//! `fuzz/corpus/<target>/seed-*` are these, written by the `write_seeds` example.

use tributary_amqp_codec::frame::{FrameType, finish_frame, start_frame, write_empty_frame};
use tributary_amqp_codec::{DispositionFields, FlowFields, TransferFields};
use tributary_amqp_engine::connection::attach_frame;
use tributary_amqp_engine::types::definitions::{Role, SenderSettleMode};
use tributary_amqp_engine::types::messaging::{Source, Target};
use tributary_amqp_engine::{Config, Connection};
use tributary_event::{EventData, PropertyValue, ReceivedEvent};
use tributary_eventhubs::LastEnqueued;
use tributary_eventhubs::connection_string::{emulator_connection_string, tls_connection_string};
use tributary_eventhubs::deliver::write_delivery_message;
use tributary_eventhubs::sas;
use tributary_eventhubs::send::encode_outgoing;
use tributary_http::fuzzing::sign_cursor;
use tributary_log::fuzzing::encode_batch_bytes;

/// The seeds of the target called `name` (none for an unknown name).
pub fn seeds(name: &str) -> Vec<Vec<u8>> {
    match name {
        "amqp_frame" => frames(),
        "amqp_performative" => performatives(),
        "amqp_value" | "eventhubs_receive" => deliveries(),
        "amqp_connection" => connections(),
        "eventhubs_ingest" => producer_payloads(),
        "connection_string" => connection_strings(),
        "sas_token" => sas_tokens(),
        "http_cursor" => cursors(),
        "http_json" => json_bodies(),
        "edit_json" => edit_bodies(),
        "http_signature" => signatures(),
        "kafka_request" => kafka_requests(),
        "kafka_authenticated" => kafka_authenticated_requests(),
        "kafka_consumer_protocol" => kafka_consumer_protocol_messages(),
        "log_batch" => batches(),
        "eventhubs_send" | "log_recovery" => carved(),
        _ => Vec::new(),
    }
}

/// Events with every optional field and every property type.
fn sample_events() -> Vec<EventData> {
    let full = EventData {
        content_type: Some("application/json".into()),
        correlation_id: Some("corr-1".into()),
        message_id: Some("msg-1".into()),
        ..EventData::new(&b"{\"temperature\": 21.5}"[..])
    }
    .with_property("null", PropertyValue::Null)
    .with_property("bool", PropertyValue::Bool(true))
    .with_property("int32", PropertyValue::Int32(-7))
    .with_property("int64", PropertyValue::Int64(1 << 40))
    .with_property("uint32", PropertyValue::UInt32(7))
    .with_property("uint64", PropertyValue::UInt64(u64::MAX))
    .with_property("float32", PropertyValue::Float32(1.5))
    .with_property("float64", PropertyValue::Float64(-0.25))
    .with_property("string", PropertyValue::String("héllo".into()))
    .with_property("bytes", PropertyValue::Bytes(vec![0, 1, 255].into()))
    .with_property("timestamp", PropertyValue::Timestamp(1_700_000_000_000))
    .with_property("uuid", PropertyValue::Uuid([0xab; 16]));
    vec![
        full,
        EventData::new(&b""[..]),
        EventData::new(vec![0x42; 300]),
    ]
}

fn producer_payloads() -> Vec<Vec<u8>> {
    let events = sample_events();
    let mut seeds = Vec::new();
    for key in [None, Some("device-7")] {
        for one in &events {
            let (payload, _) = encode_outgoing(std::slice::from_ref(one), key).expect("encodes");
            seeds.push([&[0x80][..], &payload].concat());
        }
        let (batch, _) = encode_outgoing(&events, key).expect("encodes");
        seeds.push([&[0x81][..], &batch].concat());
    }
    seeds
}

fn deliveries() -> Vec<Vec<u8>> {
    let runtime = LastEnqueued {
        sequence_number: 41,
        offset: Some(8192),
        enqueued_time_ms: Some(1_700_000_000_000),
        retrieved_time_ms: 1_700_000_000_500,
    };
    let mut seeds = Vec::new();
    for (sequence_number, data) in (0..).zip(sample_events()) {
        let event = ReceivedEvent {
            sequence_number,
            offset: 4096,
            enqueued_time_ms: 1_700_000_000_000,
            data: EventData {
                partition_key: Some("device-7".into()),
                ..data
            },
        };
        for last in [None, Some(&runtime)] {
            let mut out = Vec::new();
            write_delivery_message(&event, last, &mut out);
            seeds.push(out);
        }
    }
    seeds
}

fn performatives() -> Vec<Vec<u8>> {
    let (payload, _) = encode_outgoing(&sample_events()[..1], None).expect("encodes");
    let mut transfer = vec![0];
    TransferFields {
        handle: 1,
        delivery_id: Some(7),
        delivery_tag: Some(b"tag"),
        message_format: Some(0),
        settled: Some(false),
        ..TransferFields::default()
    }
    .encode(&mut transfer);
    transfer.extend_from_slice(&payload);
    let mut flow = vec![1];
    FlowFields {
        next_incoming_id: Some(1),
        incoming_window: 5000,
        next_outgoing_id: 1,
        outgoing_window: 5000,
        handle: Some(0),
        delivery_count: Some(0),
        link_credit: Some(300),
        ..FlowFields::default()
    }
    .encode(&mut flow);
    let mut disposition = vec![2];
    DispositionFields {
        role_is_receiver: true,
        first: 3,
        last: Some(9),
        settled: true,
        state: Some(&[0x00, 0x53, 0x24, 0x45]),
        batchable: false,
    }
    .encode(&mut disposition);
    vec![transfer, flow, disposition]
}

fn frames() -> Vec<Vec<u8>> {
    let mut stream = vec![0x01, 0x00];
    for body in performatives() {
        let start = start_frame(&mut stream, FrameType::Amqp, 1);
        stream.extend_from_slice(&body[1..]);
        finish_frame(&mut stream, start);
    }
    write_empty_frame(&mut stream);
    let start = start_frame(&mut stream, FrameType::Sasl, 0);
    finish_frame(&mut stream, start);
    // A frame larger than the smallest maximum, and one whose size is below its header.
    let too_large = [&[0x00, 0x00][..], &[0, 0, 4, 0, 2, 0, 0, 0]].concat();
    let too_small = [&[0x00, 0x40][..], &[0, 0, 0, 7, 2, 0, 0, 0]].concat();
    vec![stream, too_large, too_small]
}

/// A client's side of a conversation: its header and `open`, then `begin` and a sender and a
/// receiver link, then two transfers (which a server that granted credit in time reads as
/// deliveries).
fn connections() -> Vec<Vec<u8>> {
    let mut client = Connection::client(Config::new("fuzz-client"));
    let opening = client.take_output();
    let session = client.begin().expect("a session begins");
    let mut sender = attach_frame("send", Role::Sender, SenderSettleMode::Unsettled);
    sender.target = Some(Box::new(Target::builder().address("hub").build().into()));
    client.attach(session, sender).expect("a link attaches");
    let mut receiver = attach_frame("receive", Role::Receiver, SenderSettleMode::Unsettled);
    receiver.source = Some(Box::new(
        Source::builder()
            .address("hub/ConsumerGroups/$Default/Partitions/0")
            .build(),
    ));
    client.attach(session, receiver).expect("a link attaches");
    let links = client.take_output();
    let (payload, _) = encode_outgoing(&sample_events()[..1], None).expect("encodes");
    let mut transfers = Vec::new();
    for (id, more) in [(0u32, false), (1, true)] {
        let start = start_frame(&mut transfers, FrameType::Amqp, 0);
        TransferFields {
            handle: 0,
            delivery_id: Some(id),
            delivery_tag: Some(&[1, 2]),
            message_format: Some(0),
            more,
            ..TransferFields::default()
        }
        .encode(&mut transfers);
        transfers.extend_from_slice(&payload);
        finish_frame(&mut transfers, start);
    }
    // Odd first byte: the bytes carry their own protocol header.
    vec![
        [&[0x01][..], &opening].concat(),
        [&[0x20][..], &opening].concat(),
        [&[0x01][..], &opening, &links].concat(),
        [&[0xfe][..], &opening[8..], &links, &transfers].concat(),
    ]
}

fn connection_strings() -> Vec<Vec<u8>> {
    let key = "c2VjcmV0LWtleS1mb3ItdGVzdHM=";
    let token = sas::sign("sb://localhost/orders", "send", key, 1_900_000_000);
    [
        emulator_connection_string("localhost", 5672, "RootManageSharedAccessKey", key),
        tls_connection_string("ns.example.com", 5671, "send", key),
        format!("Endpoint=sb://ns.example.com/;SharedAccessSignature={token};EntityPath=orders"),
        format!("endpoint=amqp://[::1]:5672;sharedaccesskeyname=a;sharedaccesskey={key};;"),
    ]
    .into_iter()
    .map(String::into_bytes)
    .collect()
}

fn sas_tokens() -> Vec<Vec<u8>> {
    let token = sas::sign(
        "sb://ns.example.com/orders/Partitions/0",
        "listen",
        "k",
        1_900_000_000,
    );
    vec![
        [&[0x00][..], token.as_bytes()].concat(),
        [
            &[0x01][..],
            b"sb://h/hub\0policy\0key\0\x01\x02\x03\x04\x05\x06\x07\x08",
        ]
        .concat(),
    ]
}

fn cursors() -> Vec<Vec<u8>> {
    // The layout of cursor.rs, version 1: a partition cursor and a group cursor.
    let name = |out: &mut Vec<u8>, s: &str| {
        out.extend_from_slice(&u16::try_from(s.len()).expect("short").to_be_bytes());
        out.extend_from_slice(s.as_bytes());
    };
    let mut partition = vec![0x00, 1, 1];
    partition.extend_from_slice(&1_900_000_000_000i64.to_be_bytes());
    name(&mut partition, "orders");
    partition.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
    partition.extend_from_slice(&3u32.to_be_bytes());
    partition.extend_from_slice(&42i64.to_be_bytes());
    let mut group = vec![0x00, 1, 2];
    group.extend_from_slice(&1_900_000_000_000i64.to_be_bytes());
    for s in ["orders", "billing", "instance-1"] {
        name(&mut group, s);
    }
    group.extend_from_slice(&5u64.to_be_bytes());
    group.extend_from_slice(&9u64.to_be_bytes());
    group.push(1);
    group.extend_from_slice(&30_000u32.to_be_bytes());
    let text = [&[0x01][..], sign_cursor(&partition[1..]).as_bytes()].concat();
    vec![partition, group, text]
}

fn json_bodies() -> Vec<Vec<u8>> {
    [
        (0u8, r#"{"messages":[{"key":"a2V5","value":"dmFsdWU="},{"value":"eA"},{"key":null,"value":""}]}"#),
        (1, r#"{"partition":"0","type":"AT_OFFSET","offset":5}"#),
        (1, r#"{"partition":"1","type":"AT_TIME","time":"2024-01-02T03:04:05.123Z"}"#),
        (2, r#"{"type":"TRIM_HORIZON","groupName":"g","instanceName":"i","commitOnGet":true,"timeoutInMs":30000}"#),
        (3, r#"{"type":"AT_TIME","time":"2024-01-02T03:04:05Z"}"#),
    ]
    .into_iter()
    .map(|(choice, body)| [&[choice][..], body.as_bytes()].concat())
    .collect()
}

/// Bodies for the editor: plain ones the lazy reader indexes, and ones it leaves to
/// serde_json (escapes, exponents, deep nesting, duplicate keys, not JSON).
fn edit_bodies() -> Vec<Vec<u8>> {
    [
        r#"{"a":7,"b":{"c":"abc","d":[1,2.5,null],"e":true},"t":"x","x":{}}"#,
        r#"{ "a" : 70 , "b" : { "c" : "A\"b" } , "e" : [ ] , "a" : 1 }"#,
        r#"{"a":{"b":1},"b":{"c":"\u00e9"},"t":[1],"s":1e3}"#,
        r#"{"a":12345678901234567890123,"b":{"c":"x\ny"}}"#,
        r#"[[[[[[[[[[{"a":1}]]]]]]]]]]"#,
        r#"{"a":1,"b":{"c":"ok","c":"OK"},"b":{"c":"z"}}"#,
        "{\"a\":1,}",
        "not json",
    ]
    .into_iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

fn signatures() -> Vec<Vec<u8>> {
    [
        r#"Signature version="1",keyId="ocid1.tenancy.oc1..t/ocid1.user.oc1..u/20:3b:97",algorithm="rsa-sha256",headers="date (request-target) host content-length content-type x-content-sha256",signature="AbC+/=""#,
        r#"signature keyId="k" , headers="Date",signature="s""#,
    ]
    .into_iter()
    .map(|s| s.as_bytes().to_vec())
    .collect()
}

fn batches() -> Vec<Vec<u8>> {
    let events = sample_events();
    // Records that repeat the properties of the record before (written as references to them),
    // one value changed in the middle one.
    let full = &events[0];
    let mut changed = full.clone();
    changed.properties[2].1 = PropertyValue::Int32(8);
    let repeating = [full.clone(), changed, full.clone()];
    vec![
        encode_batch_bytes(0, 0, 1_700_000_000_000, &events),
        encode_batch_bytes(4096, 17, -1, &events[1..2]),
        encode_batch_bytes(8192, 18, 1_700_000_000_001, &repeating),
    ]
}

/// Inputs for the targets that carve structure out of their bytes: any bytes will do.
fn carved() -> Vec<Vec<u8>> {
    let ramp: Vec<u8> = (0..=255).collect();
    vec![
        ramp.clone(),
        ramp.iter().rev().copied().collect(),
        ramp.repeat(4),
        vec![7; 64],
    ]
}

/// A Kafka request header: API key, version, correlation id, client id; with the tagged-field
/// count of header v2 when `flexible`. (Seeds only: the door decodes with `kafka-protocol`.)
fn kafka_header(key: i16, version: i16, correlation: i32, flexible: bool) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&key.to_be_bytes());
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(&correlation.to_be_bytes());
    out.extend_from_slice(&7i16.to_be_bytes());
    out.extend_from_slice(b"rdkafka");
    if flexible {
        out.push(0);
    }
    out
}

/// The requests a Kafka client sends before SASL (and one it may not), as librdkafka frames
/// them, without their length prefix.
fn kafka_requests() -> Vec<Vec<u8>> {
    let good = "\0$ConnectionString\0Endpoint=sb://localhost/;SharedAccessKeyName=sender;SharedAccessKey=fuzz-secret-key-0123456789";
    let bad = good.replace("fuzz-secret", "wrong-secret");
    let mut v3 = kafka_header(18, 3, 2, true);
    v3.extend_from_slice(b"\x0blibrdkafka\x072.16.0\x00");
    let mut handshake = kafka_header(17, 1, 4, false);
    handshake.extend_from_slice(&5i16.to_be_bytes());
    handshake.extend_from_slice(b"PLAIN");
    let mut login = kafka_header(36, 0, 5, false);
    login.extend_from_slice(&u32::try_from(good.len()).unwrap().to_be_bytes());
    login.extend_from_slice(good.as_bytes());
    let mut flexible_login = kafka_header(36, 2, 6, true);
    flexible_login.push(u8::try_from(bad.len() + 1).unwrap());
    flexible_login.extend_from_slice(bad.as_bytes());
    flexible_login.push(0);
    let mut metadata = kafka_header(3, 1, 7, false);
    metadata.extend_from_slice(&(-1i32).to_be_bytes());
    vec![
        kafka_header(18, 0, 1, false),
        v3,
        kafka_header(18, 99, 3, true),
        handshake,
        login,
        flexible_login,
        metadata,
    ]
}

/// A request frame (without its length prefix) as the codec encodes it.
fn kafka_frame<R: kafka_protocol::protocol::Encodable>(
    key: kafka_protocol::messages::ApiKey,
    version: i16,
    request: &R,
) -> Vec<u8> {
    use kafka_protocol::messages::RequestHeader;
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let mut buf = bytes::BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(11)
        .with_client_id(Some(StrBytes::from_static_str("rdkafka")))
        .encode(&mut buf, key.request_header_version(version))
        .expect("a header encodes");
    request
        .encode(&mut buf, version)
        .expect("a request encodes");
    buf.to_vec()
}

/// The topic the Kafka seeds name.
fn kafka_seed_topic() -> kafka_protocol::messages::TopicName {
    kafka_protocol::messages::TopicName(kafka_protocol::protocol::StrBytes::from_static_str(
        "orders",
    ))
}

/// A Produce of one record batch of two records (key, headers) to partition 0, acks all.
fn kafka_seed_produce() -> kafka_protocol::messages::ProduceRequest {
    use kafka_protocol::messages;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };
    let topic = kafka_seed_topic;
    let record = |i: i64| Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: i,
        sequence: -1,
        timestamp: 1_700_000_000_000 + i,
        key: Some(bytes::Bytes::from_static(b"device-1")),
        value: Some(bytes::Bytes::from_static(b"{\"reading\":21.5}")),
        headers: [("source".into(), Some(bytes::Bytes::from_static(b"fuzz")))]
            .into_iter()
            .collect(),
    };
    let mut batch = bytes::BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    RecordBatchEncoder::encode(&mut batch, [&record(0), &record(1)], &options)
        .expect("a batch encodes");
    let partition = messages::produce_request::PartitionProduceData::default()
        .with_index(0)
        .with_records(Some(batch.freeze()));
    messages::ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![
            messages::produce_request::TopicProduceData::default()
                .with_name(topic())
                .with_partition_data(vec![partition]),
        ])
}

/// What an authenticated client sends: a Produce with a record batch of two records (key,
/// headers), a Fetch, a Metadata and a ListOffsets, at the versions librdkafka 2.x uses.
fn kafka_authenticated_requests() -> Vec<Vec<u8>> {
    use kafka_protocol::messages::{self, ApiKey};
    let topic = kafka_seed_topic;
    let produce = kafka_seed_produce();
    let fetch_partition = messages::fetch_request::FetchPartition::default()
        .with_partition(0)
        .with_fetch_offset(0)
        .with_partition_max_bytes(1 << 20);
    let fetch = messages::FetchRequest::default()
        .with_max_wait_ms(500)
        .with_min_bytes(1)
        .with_max_bytes(50 << 20)
        .with_topics(vec![
            messages::fetch_request::FetchTopic::default()
                .with_topic(topic())
                .with_partitions(vec![fetch_partition]),
        ]);
    let metadata = messages::MetadataRequest::default().with_topics(Some(vec![
        messages::metadata_request::MetadataRequestTopic::default().with_name(Some(topic())),
    ]));
    let list_offsets = messages::ListOffsetsRequest::default()
        .with_replica_id(messages::BrokerId(-1))
        .with_topics(vec![
            messages::list_offsets_request::ListOffsetsTopic::default()
                .with_name(topic())
                .with_partitions(vec![
                    messages::list_offsets_request::ListOffsetsPartition::default()
                        .with_partition_index(0)
                        .with_timestamp(-2),
                ]),
        ]);
    vec![
        kafka_frame(ApiKey::Produce, 9, &produce),
        kafka_frame(ApiKey::Produce, 3, &produce),
        kafka_frame(ApiKey::Fetch, 12, &fetch),
        kafka_frame(ApiKey::Fetch, 4, &fetch),
        kafka_frame(ApiKey::Metadata, 12, &metadata),
        kafka_frame(ApiKey::Metadata, 4, &metadata),
        kafka_frame(ApiKey::ListOffsets, 7, &list_offsets),
    ]
}

/// A subscription (two topics, owned partitions) and an assignment, as a consumer group's
/// members send them, each after its version (3).
fn kafka_consumer_protocol_messages() -> Vec<Vec<u8>> {
    use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as Assigned;
    use kafka_protocol::messages::consumer_protocol_subscription::TopicPartition as Owned;
    use kafka_protocol::messages::{ConsumerProtocolAssignment, ConsumerProtocolSubscription};
    use kafka_protocol::protocol::{Encodable, StrBytes};
    let encode = |value: &dyn Fn(&mut bytes::BytesMut)| {
        let mut out = bytes::BytesMut::new();
        out.extend_from_slice(&3i16.to_be_bytes());
        value(&mut out);
        out.to_vec()
    };
    let subscription = ConsumerProtocolSubscription::default()
        .with_topics(vec![
            StrBytes::from_static_str("orders"),
            StrBytes::from_static_str("payments"),
        ])
        .with_owned_partitions(vec![
            Owned::default()
                .with_topic(kafka_seed_topic())
                .with_partitions(vec![0, 2]),
        ])
        .with_generation_id(4);
    let assignment = ConsumerProtocolAssignment::default().with_assigned_partitions(vec![
        Assigned::default()
            .with_topic(kafka_seed_topic())
            .with_partitions(vec![1, 3]),
    ]);
    vec![
        encode(&|out| subscription.encode(out, 3).expect("encodes")),
        encode(&|out| assignment.encode(out, 3).expect("encodes")),
    ]
}
