//! Failover through hub aliases: a producer and an event processor host follow an alias file and
//! DNS SRV records (answered by a small DNS responder in the test, built on `hickory-proto`'s
//! message types) from hub A to hub B, and no acknowledged event is lost on the way.
//!
//! Hub B plays A's replica: the test copies every event acknowledged on A into the same
//! partition of B, in order, so both hubs hold the same events at the same sequence numbers (as
//! a replication task with an empty target does), and a processor moved to B resumes where it
//! was.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, Metadata};
use hickory_proto::rr::rdata::{A, SRV};
use hickory_proto::rr::{Name, RData, Record};
use tokio::net::UdpSocket;
use tributary_client::failover::write_alias_file;
use tributary_client::{
    AliasEndpoint, ClientOptions, FailoverOptions, ProducerClient, RemoteHub, SendTarget,
};
use tributary_event::EventData;
use tributary_processor::{
    EventProcessorHost, InMemoryCheckpointStore, ProcessorOptions, RunningHost, processor_fn,
};
use tributary_testkit::{TestHub, within};

const HUB: &str = "orders";
const PARTITIONS: u32 = 2;
/// Events copied into both hubs before the clients start, per partition.
const MIRRORED: usize = 5;
/// The producer's target: one partition, so the copy into B keeps A's order.
const PARTITION: &str = "0";
/// The processor's consumer group (the tests read `$Default` in process).
const GROUP: &str = "processor";

/// Hub A and hub B with the same event hub and the same keys (failover pairs share their
/// authorization rules, so the connection string's key works on both).
async fn twin_hubs() -> (TestHub, TestHub) {
    let a = TestHub::start(&[(HUB, PARTITIONS)]).await;
    let b = a.start_sharing_keys(&[(HUB, PARTITIONS)]).await;
    for hub in [&a, &b] {
        hub.broker
            .create_consumer_group(HUB, GROUP)
            .await
            .expect("consumer group");
    }
    for partition in 0..PARTITIONS {
        for i in 0..MIRRORED {
            let body = format!("mirrored-{partition}-{i}");
            a.send(HUB, &partition.to_string(), &body).await;
            b.send(HUB, &partition.to_string(), &body).await;
        }
    }
    (a, b)
}

fn endpoint_of(hub: &TestHub) -> AliasEndpoint {
    AliasEndpoint::new("127.0.0.1", Some(hub.port()))
}

fn last_sequence_number(hub: &TestHub) -> i64 {
    hub.broker
        .partition_properties(HUB, PARTITION)
        .expect("partition")
        .last_enqueued_sequence_number
}

/// Every body a hub holds, over all partitions.
async fn bodies(hub: &TestHub) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for partition in 0..PARTITIONS {
        for event in hub.read_all(HUB, partition).await {
            all.insert(String::from_utf8_lossy(&event.data.body).into_owned());
        }
    }
    all
}

type Seen = Arc<Mutex<BTreeSet<String>>>;

/// A processor host over `hub` recording the bodies it processed and checkpointing each batch.
fn start_processor(hub: RemoteHub, seen: Seen) -> RunningHost {
    let factory = processor_fn(move |context, events| {
        let seen = Arc::clone(&seen);
        async move {
            seen.lock().unwrap().extend(
                events
                    .iter()
                    .map(|e| String::from_utf8_lossy(&e.data.body).into_owned()),
            );
            let _ = context.checkpoint().await;
        }
    });
    let store = Arc::new(InMemoryCheckpointStore::new());
    EventProcessorHost::builder(Arc::new(hub), store, factory)
        .options(ProcessorOptions {
            host_name: "failover-test".to_owned(),
            consumer_group: GROUP.to_owned(),
            receive_timeout: Duration::from_millis(200),
            ..ProcessorOptions::default()
        })
        .build()
        .expect("valid options")
        .start()
        .expect("host starts")
}

/// Waits until the processor has processed every body in `wanted`.
async fn processed_all(seen: &Seen, wanted: &BTreeSet<String>) {
    within("the processor catching up", async {
        loop {
            let missing = wanted.difference(&seen.lock().unwrap()).count();
            if missing == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
}

/// Sends `body` until the hub acknowledges it (a failed send is retried, as an application
/// does on a reconnect: a retry may store it twice, never zero times).
async fn send_until_acknowledged(producer: &ProducerClient, body: &str) {
    within("a send", async {
        loop {
            let event = EventData::new(body.to_owned());
            let target = SendTarget::Partition(PARTITION.to_owned());
            match producer.send(&[event], target).await {
                Ok(()) => return,
                Err(error) => {
                    eprintln!("sending {body} failed ({error}); retrying");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    })
    .await;
}

/// Sends ten events named `prefix-i` through `producer` (on A), copying each acknowledged one
/// into B.
async fn send_replicated(producer: &ProducerClient, b: &TestHub, prefix: &str) {
    for i in 0..10 {
        let body = format!("{prefix}-{i}");
        send_until_acknowledged(producer, &body).await;
        b.send(HUB, PARTITION, &body).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_and_a_processor_follow_the_alias_file() {
    let (a, b) = twin_hubs().await;
    let dir = tempfile::tempdir().unwrap();
    let alias = dir.path().join("orders.alias");
    write_alias_file(&alias, &endpoint_of(&a)).unwrap();
    let failover = FailoverOptions::file(&alias).with_poll_interval(Duration::from_millis(100));
    let options = ClientOptions::default().with_failover(failover);
    // The connection string names neither hub: the alias decides.
    let connection_string = a.connection_string.replace(&format!(":{}", a.port()), ":1");
    let producer =
        ProducerClient::connect_with_options(&connection_string, Some(HUB), options.clone())
            .await
            .unwrap();
    assert_eq!(producer.active_endpoint().await, Some(endpoint_of(&a)));
    let seen = Seen::default();
    let remote = RemoteHub::connect_with_options(&connection_string, Some(HUB), options)
        .await
        .unwrap();
    let host = start_processor(remote, Arc::clone(&seen));

    within("the test", async {
        send_replicated(&producer, &b, "before").await;
        processed_all(&seen, &bodies(&a).await).await;

        // Switch, and keep sending: an event acknowledged by A is copied to B (replication);
        // the first acknowledged by B marks the switch.
        let switched_at = Instant::now();
        write_alias_file(&alias, &endpoint_of(&b)).unwrap();
        let mut first_on_b = None;
        let mut on_b = 0;
        let mut i = 0;
        while on_b < 10 {
            let body = format!("after-{i}");
            let a_before = last_sequence_number(&a);
            send_until_acknowledged(&producer, &body).await;
            if last_sequence_number(&a) == a_before {
                first_on_b.get_or_insert_with(|| switched_at.elapsed());
                on_b += 1;
            } else {
                assert!(
                    first_on_b.is_none(),
                    "{body} went back to A after the switch"
                );
                b.send(HUB, PARTITION, &body).await;
            }
            i += 1;
        }
        let switch = first_on_b.unwrap();
        eprintln!(
            "failover by file: the first event acknowledged by hub B {} ms after the alias changed",
            switch.as_millis()
        );
        assert!(switch < Duration::from_secs(2), "{switch:?}");
        assert_eq!(producer.active_endpoint().await, Some(endpoint_of(&b)));

        // Every acknowledged event is on B, and the processor, moved to B, processed them all.
        let on_b = bodies(&b).await;
        for sent in 0..i {
            assert!(
                on_b.contains(&format!("after-{sent}")),
                "after-{sent} is lost"
            );
        }
        processed_all(&seen, &on_b).await;
    })
    .await;
    host.shutdown().await.unwrap();
}

/// A DNS server for the test: answers SRV and A queries from `records`, NOERROR with no answer
/// for anything else.
async fn dns_responder(records: Arc<Mutex<Vec<Record>>>) -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buffer = vec![0; 4096];
        loop {
            let Ok((length, peer)) = socket.recv_from(&mut buffer).await else {
                return;
            };
            let Ok(query) = Message::from_vec(&buffer[..length]) else {
                continue;
            };
            let mut response = Message::new(
                query.metadata.id,
                hickory_proto::op::MessageType::Response,
                query.metadata.op_code,
            );
            response.metadata = Metadata::response_from_request(&query.metadata);
            response.metadata.authoritative = true;
            for question in &query.queries {
                response.add_query(question.clone());
                let records = records.lock().unwrap();
                for record in records.iter().filter(|record| {
                    record.name == *question.name() && record.record_type() == question.query_type()
                }) {
                    response.add_answer(record.clone());
                }
            }
            let _ = socket.send_to(&response.to_vec().unwrap(), peer).await;
        }
    });
    addr
}

fn name(text: &str) -> Name {
    Name::from_ascii(text).unwrap()
}

/// `_azure_eventhub._amqp.eh.failover.test`: hub A at priority 1, hub B at priority 2, both
/// targets on 127.0.0.1.
fn srv_records(a: &TestHub, b: &TestHub) -> Vec<Record> {
    let srv = name("_azure_eventhub._amqp.eh.failover.test.");
    let localhost = RData::A(A(Ipv4Addr::LOCALHOST));
    vec![
        Record::from_rdata(
            srv.clone(),
            5,
            RData::SRV(SRV::new(2, 10, b.port(), name("hub-b.failover.test."))),
        ),
        Record::from_rdata(
            srv.clone(),
            5,
            RData::SRV(SRV::new(1, 10, a.port(), name("hub-a.failover.test."))),
        ),
        // A WebSockets record is skipped even at the lowest priority.
        Record::from_rdata(
            srv,
            5,
            RData::SRV(SRV::new(0, 10, 443, name("hub-a.failover.test."))),
        ),
        Record::from_rdata(name("hub-a.failover.test."), 5, localhost.clone()),
        Record::from_rdata(name("hub-b.failover.test."), 5, localhost),
    ]
}

fn srv_endpoint(host: &str, hub: &TestHub) -> AliasEndpoint {
    AliasEndpoint {
        host: host.to_owned(),
        port: Some(hub.port()),
        addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_and_a_processor_follow_dns_srv_records_by_priority() {
    let (mut a, b) = twin_hubs().await;
    let dns = dns_responder(Arc::new(Mutex::new(srv_records(&a, &b)))).await;
    let failover =
        FailoverOptions::srv("eh.failover.test", Some(dns)).with_failures_before_switch(1);
    let options = ClientOptions::default()
        .with_failover(failover)
        .with_operation_timeout(Duration::from_secs(5));
    let connection_string = a.connection_string.clone();
    // The lower priority wins.
    let producer =
        ProducerClient::connect_with_options(&connection_string, Some(HUB), options.clone())
            .await
            .unwrap();
    assert_eq!(
        producer.active_endpoint().await,
        Some(srv_endpoint("hub-a.failover.test", &a))
    );
    let seen = Seen::default();
    let remote = RemoteHub::connect_with_options(&connection_string, Some(HUB), options.clone())
        .await
        .unwrap();
    let host = start_processor(remote, Arc::clone(&seen));

    within("the test", async {
        send_replicated(&producer, &b, "before").await;
        processed_all(&seen, &bodies(&a).await).await;

        // Hub A goes away: the clients fail once, resolve again and take priority 2.
        a.stop_server().await;
        for i in 0..10 {
            send_until_acknowledged(&producer, &format!("after-{i}")).await;
        }
        assert_eq!(
            producer.active_endpoint().await,
            Some(srv_endpoint("hub-b.failover.test", &b))
        );
        let on_b = bodies(&b).await;
        for i in 0..10 {
            assert!(on_b.contains(&format!("after-{i}")), "after-{i} is lost");
        }
        processed_all(&seen, &on_b).await;

        // A client that starts while priority 1 is unreachable uses priority 2.
        let late = ProducerClient::connect_with_options(&connection_string, Some(HUB), options)
            .await
            .unwrap();
        assert_eq!(
            late.active_endpoint().await,
            Some(srv_endpoint("hub-b.failover.test", &b))
        );
    })
    .await;
    host.shutdown().await.unwrap();
}
