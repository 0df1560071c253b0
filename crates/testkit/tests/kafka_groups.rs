//! Kafka consumer groups through real clients: `confluent-kafka` (librdkafka), driven by
//! `tests/python/kafka_groups.py` with `<repo>/.venv/bin/python`, and kafkajs, driven by
//! `tests/js/kafka_groups.js` (both installed by `scripts/setup-kafka-interop`; a missing client
//! FAILS these tests, it never skips them).
//!
//! Each test opens a broker on its own data directory and starts the Kafka door over it on
//! 127.0.0.1:0 (the restart test stops both and opens them again over the same directory).

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;
use tributary_amqp::{AccessPolicies, AccessPolicy, Right};
use tributary_broker::{Broker, BrokerConfig, BrokerError, HubSpec};
use tributary_event::EventPosition;
use tributary_kafka::{KafkaConfig, RunningKafkaServer};
use tributary_testkit::JsonLines;
use tributary_testkit::oci::{Server, Setup, request};

/// A broker, its Kafka door and two logins: every right, and Send only.
struct Door {
    broker: Broker,
    door: RunningKafkaServer,
    root: AccessPolicy,
    send: AccessPolicy,
}

impl Door {
    /// Opens the broker in `dir` (creating `hubs` if it has none) and starts the door on a free
    /// port.
    async fn start(
        dir: &Path,
        hubs: &[(&str, u32)],
        keys: Option<(AccessPolicy, AccessPolicy)>,
    ) -> Door {
        Door::start_at(dir, hubs, keys, 0).await
    }

    /// [`Door::start`] on `port` (retried while the previous listener's port is not yet free).
    async fn start_at(
        dir: &Path,
        hubs: &[(&str, u32)],
        keys: Option<(AccessPolicy, AccessPolicy)>,
        port: u16,
    ) -> Door {
        let broker = Broker::open(BrokerConfig::new(dir))
            .await
            .expect("broker opens");
        for (name, partitions) in hubs {
            if broker.describe_hub(name).is_err() {
                broker
                    .create_hub(HubSpec::new(*name, *partitions))
                    .await
                    .expect("hub created");
            }
        }
        let (root, send) = keys.unwrap_or_else(|| {
            let policy = |name: &str, right| AccessPolicy::generate(name, vec![right]).unwrap();
            (
                policy("RootManageSharedAccessKey", Right::Manage),
                policy("send-only", Right::Send),
            )
        });
        let policies = AccessPolicies::new(vec![root.clone(), send.clone()]).unwrap();
        let config = KafkaConfig::new(([127, 0, 0, 1], port).into(), policies);
        let mut attempts = 0;
        let door = loop {
            match tributary_kafka::start(broker.clone(), config.clone()).await {
                Ok(door) => break door,
                Err(_) if attempts < 50 => attempts += 1,
                Err(e) => panic!("the Kafka door does not start: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        Door {
            broker,
            door,
            root,
            send,
        }
    }

    fn conn(&self, policy: &AccessPolicy) -> String {
        tributary_amqp::connection_string("127.0.0.1", 5672, policy)
    }

    /// The arguments every scenario takes, as the root login.
    fn args(&self, topic: &str, partitions: u32, group: &str) -> Value {
        json!({"bootstrap": self.door.local_addr().to_string(), "conn": self.conn(&self.root),
               "topic": topic, "partitions": partitions, "group": group})
    }

    async fn stop(self) -> (AccessPolicy, AccessPolicy) {
        self.door.shutdown().await;
        self.broker.shutdown().await.expect("broker shuts down");
        (self.root, self.send)
    }
}

async fn groups(command: &str, args: Value) -> Value {
    tributary_testkit::run_python("kafka_groups.py", command, args).await
}

fn with(mut args: Value, more: Value) -> Value {
    for (k, v) in more.as_object().unwrap() {
        args[k] = v.clone();
    }
    args
}

/// Three members, a fourth joining, the first leaving: after each step the members hold
/// disjoint sets of partitions covering all six, and every record is read once, by the member
/// holding its partition.
async fn rebalance_with(strategy: &str) {
    let dir = TempDir::new().unwrap();
    let door = Door::start(dir.path(), &[("orders", 6)], None).await;
    let args = with(
        door.args("orders", 6, &format!("{strategy}-group")),
        json!({"strategy": strategy, "records": 60}),
    );
    assert_rebalanced(&groups("rebalance", args).await);
    door.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafkajs_consumers_share_six_partitions_as_members_join_and_leave() {
    let dir = TempDir::new().unwrap();
    let door = Door::start(dir.path(), &[("orders", 6)], None).await;
    let args = with(
        door.args("orders", 6, "kafkajs-group"),
        json!({"records": 60}),
    );
    let args = args.to_string();
    let result = tributary_testkit::run_kafkajs("kafka_groups.js", &["rebalance", &args]).await;
    assert_rebalanced(&result);
    door.stop().await;
}

/// What a rebalance scenario reported: three, four, then three members, each holding one or
/// two of the six partitions, the newcomer `d` some, the leaver `a` none; 180 records read
/// once, each by its partition's holder.
fn assert_rebalanced(result: &Value) {
    assert_eq!(result["violations"], json!([]), "{result}");
    assert_eq!(result["errors"], json!([]), "{result}");
    assert_eq!(result["read"], 180, "{result}");
    let phases = result["phases"].as_array().unwrap();
    let sizes: Vec<usize> = phases
        .iter()
        .map(|p| p.as_object().unwrap().len())
        .collect();
    assert_eq!(sizes, [3, 4, 3], "{result}");
    assert!(
        phases[1]["d"].as_array().is_some_and(|d| !d.is_empty()),
        "{result}"
    );
    assert!(phases[2].get("a").is_none(), "{result}");
    for phase in phases {
        for partitions in phase.as_object().unwrap().values() {
            let held = partitions.as_array().unwrap().len();
            assert!((1..=2).contains(&held), "balanced: {result}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_consumers_share_six_partitions_as_members_join_and_leave() {
    rebalance_with("range").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_sticky_consumers_share_six_partitions_as_members_join_and_leave() {
    rebalance_with("cooperative-sticky").await;
}

/// Sends `count` events to each of `partitions` partitions, in process.
async fn fill(broker: &Broker, hub: &str, partitions: u32, count: usize) {
    for p in 0..partitions {
        let events = (0..count)
            .map(|i| tributary_event::EventData::new(format!("{p}-{i}")))
            .collect();
        let target = tributary_broker::SendTarget::Partition(p.to_string());
        broker.send(hub, target, events).await.expect("sent");
    }
}

/// The (partition, offset) of each record a scenario read.
fn partitions_and_offsets(read: &Value) -> Vec<(i64, i64)> {
    read.as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_i64().unwrap(), r[1].as_i64().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_offsets_survive_a_restart_and_are_the_hubs_checkpoints() {
    let dir = TempDir::new().unwrap();
    let door = Door::start(dir.path(), &[("orders", 3)], None).await;
    fill(&door.broker, "orders", 3, 4).await;
    let args = door.args("orders", 3, "billing");
    let unknown = groups("committed", with(args.clone(), json!({"group": "nobody"}))).await;
    assert_eq!(
        unknown["committed"],
        json!({"0": -1001, "1": -1001, "2": -1001}),
        "{unknown}"
    );
    let first = groups(
        "consume_and_commit",
        with(args.clone(), json!({"expect": 12})),
    )
    .await;
    assert_eq!(first["read"].as_array().unwrap().len(), 12, "{first}");
    assert_eq!(
        first["committed"],
        json!({"0": 4, "1": 4, "2": 4}),
        "{first}"
    );
    // The commits are the hub's consumer group's checkpoints: the last sequence number read.
    let checkpoints = door
        .broker
        .list_checkpoints("orders", "billing")
        .await
        .unwrap();
    let sequences: Vec<_> = checkpoints.iter().map(|c| c.sequence_number).collect();
    assert_eq!(sequences, [Some(3), Some(3), Some(3)]);
    let keys = door.stop().await;

    let door = Door::start(dir.path(), &[("orders", 3)], Some(keys)).await;
    let args = door.args("orders", 3, "billing");
    fill(&door.broker, "orders", 3, 2).await;
    let after = groups("committed", args.clone()).await;
    assert_eq!(
        after["committed"],
        json!({"0": 4, "1": 4, "2": 4}),
        "{after}"
    );
    let resumed = groups(
        "consume_and_commit",
        with(args.clone(), json!({"expect": 6, "linger_s": 1})),
    )
    .await;
    let offsets = partitions_and_offsets(&resumed["read"]);
    assert_eq!(
        offsets,
        [(0, 4), (0, 5), (1, 4), (1, 5), (2, 4), (2, 5)],
        "{resumed}"
    );
    assert_eq!(
        resumed["committed"],
        json!({"0": 6, "1": 6, "2": 6}),
        "{resumed}"
    );
    let states = door.broker.processor_group_states("orders").unwrap();
    let billing = states
        .iter()
        .find(|(g, _)| g == "billing")
        .expect("a consumer group");
    assert!(
        billing
            .1
            .iter()
            .all(|p| p.checkpoint_sequence_number == Some(5)),
        "{billing:?}"
    );
    door.stop().await;
}

/// The admin API over `broker` (the HTTP door, development mode: no signatures).
async fn admin_api(broker: &Broker) -> Server {
    let setup = Setup {
        signed: false,
        ..Setup::default()
    };
    let http = tributary_testkit::oci::start_http(broker, &setup).await;
    Server {
        dir: TempDir::new().unwrap(),
        broker: broker.clone(),
        url: format!("http://{}", http.local_addr()),
        http,
    }
}

const AUDIT_PARTITIONS: &str = "/admin/v1/hubs/orders/consumergroups/audit/partitions";
const AUDIT_RESET: &str = "/admin/v1/hubs/orders/consumergroups/audit/reset";
const TRIM_HORIZON: &[u8] = br#"{"type": "TRIM_HORIZON"}"#;

/// `tributary group reset`'s request (the admin API's reset, the broker's
/// `reset_processor_group`) is refused while a Kafka member holds the group and works once it
/// left; meanwhile the admin API (and so the dashboard) shows the member as each partition's
/// owner and the committed offsets as checkpoints with their lag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_is_refused_while_members_are_joined_and_moves_the_offsets_after() {
    let dir = TempDir::new().unwrap();
    let door = Door::start(dir.path(), &[("orders", 2)], None).await;
    let api = admin_api(&door.broker).await;
    fill(&door.broker, "orders", 2, 3).await;
    let args = door.args("orders", 2, "audit");
    let first = groups(
        "consume_and_commit",
        with(args.clone(), json!({"expect": 6})),
    )
    .await;
    assert_eq!(first["committed"], json!({"0": 3, "1": 3}), "{first}");
    let mut member = holder(&args);
    let joined = member.next(Duration::from_secs(60)).await;
    assert_eq!(joined["joined"], json!([0, 1]), "{joined}");
    until_owned_and_hosted(&door.broker, "orders", "audit", 2).await;
    let shown = request(&api, "GET", AUDIT_PARTITIONS, &[], b"")
        .await
        .json();
    let partitions = shown["partitions"].as_array().unwrap();
    let owner = &partitions[0]["ownerId"];
    assert!(owner.as_str().is_some_and(|o| !o.is_empty()), "{shown}");
    for partition in partitions {
        assert_eq!(
            &partition["ownerId"], owner,
            "one member holds both: {shown}"
        );
        assert_eq!(partition["checkpoint"]["sequenceNumber"], 2, "{shown}");
        assert_eq!(partition["lagEvents"], 0, "{shown}");
    }
    let refused = request(&api, "POST", AUDIT_RESET, &[], TRIM_HORIZON).await;
    assert_eq!(refused.status, 409, "{}", refused.text());
    let refused = door
        .broker
        .reset_processor_group("orders", "audit", &EventPosition::Earliest)
        .await;
    assert!(
        matches!(refused, Err(BrokerError::ProcessorGroupRunning { .. })),
        "{refused:?}"
    );
    member.write_line("leave").await;
    assert_eq!(member.next(Duration::from_secs(30)).await["left"], true);
    member.wait_success(Duration::from_secs(30)).await;
    // The member's leave lets go of its partitions (asynchronously, just after the answer).
    let mut status = 0;
    for _ in 0..50 {
        status = request(&api, "POST", AUDIT_RESET, &[], TRIM_HORIZON)
            .await
            .status;
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 200, "reset once the member left");
    let after = groups("committed", args).await;
    assert_eq!(after["committed"], json!({"0": 0, "1": 0}), "{after}");
    api.http.shutdown().await.unwrap();
    door.stop().await;
}

/// A consumer that stays up while the door and the broker restart under it rejoins (its member
/// id is unknown to the new coordinator) and carries on from its committed offsets: nothing
/// read again, nothing skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_rejoins_after_a_restart_and_carries_on_from_its_commits() {
    let dir = TempDir::new().unwrap();
    let door = Door::start(dir.path(), &[("orders", 2)], None).await;
    let port = door.door.local_addr().port();
    fill(&door.broker, "orders", 2, 3).await;
    let args = door.args("orders", 2, "steady");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/kafka_groups.py");
    let mut command = tokio::process::Command::new(tributary_testkit::python());
    command.arg(script).arg("ride").arg(args.to_string());
    let mut rider = JsonLines::spawn("kafka_groups.py ride", command);
    let mut read = Vec::new();
    while read.len() < 6 {
        let line = rider.next(Duration::from_secs(60)).await;
        if let Some(record) = line.get("committed") {
            read.push((record[0].as_i64().unwrap(), record[1].as_i64().unwrap()));
        }
    }
    let keys = door.stop().await;
    let door = Door::start_at(dir.path(), &[("orders", 2)], Some(keys), port).await;
    fill(&door.broker, "orders", 2, 2).await;
    while read.len() < 10 {
        let line = rider.next(Duration::from_secs(60)).await;
        if let Some(record) = line.get("committed") {
            read.push((record[0].as_i64().unwrap(), record[1].as_i64().unwrap()));
        }
    }
    read.sort_unstable();
    let expected: Vec<(i64, i64)> = (0..2).flat_map(|p| (0..5).map(move |o| (p, o))).collect();
    assert_eq!(read, expected, "each record read and committed once");
    rider.write_line("stop").await;
    rider.wait_success(Duration::from_secs(30)).await;
    let checkpoints = door
        .broker
        .list_checkpoints("orders", "steady")
        .await
        .unwrap();
    let sequences: Vec<_> = checkpoints.iter().map(|c| c.sequence_number).collect();
    assert_eq!(sequences, [Some(4), Some(4)]);
    door.stop().await;
}

/// Waits until the door has recorded a member's assignment where the hub shows it: an owner
/// on each of `partitions` partitions and that owner's host record. The door writes these
/// after the member has its answer (visibility never holds up the group protocol), so a test
/// that looks right after `joined` must wait for them.
async fn until_owned_and_hosted(broker: &Broker, hub: &str, group: &str, partitions: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (owned, hosts) = broker.list_ownership_and_hosts(hub, group).await.unwrap();
        let owners: Vec<_> = owned.iter().filter(|r| !r.owner_id.is_empty()).collect();
        let hosted = owners
            .iter()
            .all(|r| hosts.iter().any(|h| h.owner_id == r.owner_id));
        if owners.len() == partitions && hosted {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the assignment never showed: {owned:?} {hosts:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A member of the group that `kafka_groups.py hold` runs, with `args`.
fn holder(args: &Value) -> JsonLines {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/kafka_groups.py");
    let mut command = tokio::process::Command::new(tributary_testkit::python());
    command.arg(script).arg("hold").arg(args.to_string());
    JsonLines::spawn("kafka_groups.py hold", command)
}

/// Reads `member`'s lines until it reports holding `partitions`.
async fn until_assigned(member: &mut JsonLines, partitions: Value) {
    loop {
        let line = member.next(Duration::from_secs(60)).await;
        if line["assigned"] == partitions || line["joined"] == partitions {
            return;
        }
    }
}

/// A member killed without a LeaveGroup is removed once its session times out (6 s here), and
/// its partitions go to the member left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_without_leaving_loses_its_partitions_after_its_session_timeout() {
    let dir = TempDir::new().unwrap();
    let door = Door::start(dir.path(), &[("orders", 2)], None).await;
    let args = door.args("orders", 2, "fragile");
    let mut survivor = holder(&args);
    until_assigned(&mut survivor, json!([0, 1])).await;
    let mut doomed = holder(&args);
    let joined = doomed.next(Duration::from_secs(60)).await;
    assert_eq!(
        joined["joined"].as_array().map(Vec::len),
        Some(1),
        "{joined}"
    );
    until_assigned(
        &mut survivor,
        json!([1 - joined["joined"][0].as_i64().unwrap()]),
    )
    .await;
    let killed = std::time::Instant::now();
    drop(doomed); // SIGKILL: no LeaveGroup
    until_assigned(&mut survivor, json!([0, 1])).await;
    let waited = killed.elapsed();
    assert!(
        waited >= Duration::from_secs(4),
        "moved after {waited:?}, before the session timed out"
    );
    survivor.write_line("leave").await;
    survivor.wait_success(Duration::from_secs(30)).await;
    door.stop().await;
}

/// Static membership: a consumer restarted with the same `group.instance.id` takes its
/// predecessor's place at once (the predecessor sent no LeaveGroup), without waiting for the
/// old member's session to time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_member_restarted_takes_its_place_without_waiting_for_its_session() {
    let dir = TempDir::new().unwrap();
    let door = Door::start(dir.path(), &[("orders", 2)], None).await;
    let args = with(
        door.args("orders", 2, "static"),
        json!({"extra": {"group.instance.id": "worker-1", "session.timeout.ms": 30000}}),
    );
    let mut first = holder(&args);
    until_assigned(&mut first, json!([0, 1])).await;
    drop(first); // SIGKILL
    let restarted = std::time::Instant::now();
    let mut second = holder(&args);
    until_assigned(&mut second, json!([0, 1])).await;
    let waited = restarted.elapsed();
    assert!(
        waited < Duration::from_secs(20),
        "took {waited:?}: waited for the old session"
    );
    second.write_line("leave").await;
    second.wait_success(Duration::from_secs(30)).await;
    door.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_client_lists_describes_and_deletes_groups() {
    let dir = TempDir::new().unwrap();
    let door = Door::start(dir.path(), &[("orders", 2)], None).await;
    fill(&door.broker, "orders", 2, 1).await;
    let args = door.args("orders", 2, "finished");
    let done = groups(
        "consume_and_commit",
        with(args.clone(), json!({"expect": 2})),
    )
    .await;
    assert_eq!(done["committed"], json!({"0": 1, "1": 1}), "{done}");
    let mut member = holder(&with(args.clone(), json!({"group": "active"})));
    member.next(Duration::from_secs(60)).await;
    let admin = groups(
        "admin",
        with(
            args,
            json!({"describe": ["active", "finished", "nobody"], "delete": ["finished", "active", "nobody"]}),
        ),
    )
    .await;
    assert_eq!(admin["groups"], json!(["active", "finished"]), "{admin}");
    let described = &admin["described"];
    assert_eq!(
        described["active"]["state"], "ConsumerGroupState.STABLE",
        "{admin}"
    );
    assert_eq!(described["active"]["assignor"], "range", "{admin}");
    assert_eq!(described["active"]["members"], json!([[0, 1]]), "{admin}");
    assert_eq!(
        described["active"]["clients"],
        json!(["consumer-of-active"]),
        "{admin}"
    );
    assert_eq!(
        described["finished"]["state"], "ConsumerGroupState.EMPTY",
        "{admin}"
    );
    assert_eq!(
        described["nobody"]["state"], "ConsumerGroupState.DEAD",
        "{admin}"
    );
    assert_eq!(
        admin["deleted"],
        json!({"finished": null, "active": "NON_EMPTY_GROUP", "nobody": "GROUP_ID_NOT_FOUND"}),
        "{admin}"
    );
    let names: Vec<String> = door
        .broker
        .list_consumer_groups("orders")
        .unwrap()
        .into_iter()
        .map(|g| g.name)
        .collect();
    assert!(!names.iter().any(|n| n == "finished"), "{names:?}");
    member.write_line("leave").await;
    member.wait_success(Duration::from_secs(30)).await;
    door.stop().await;
}

/// A commit from outside the group (generation −1, as an admin tool or a consumer with manual
/// assignment sends it) is written per partition: unknown topics and partitions get
/// UNKNOWN_TOPIC_OR_PARTITION and change nothing, the others are read back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_from_outside_the_group_are_checked_per_partition() {
    let dir = TempDir::new().unwrap();
    let door = Door::start(dir.path(), &[("orders", 2)], None).await;
    let offsets = json!([["orders", 1, 5], ["nowhere", 0, 1], ["orders", 7, 1]]);
    let args = with(
        door.args("orders", 2, "manual"),
        json!({"offsets": offsets}),
    );
    let result = groups("commit", args).await;
    // confluent-kafka raises the first partition's error for the whole commit.
    assert_eq!(
        result["errors"],
        json!(["UNKNOWN_TOPIC_OR_PART"]),
        "{result}"
    );
    assert_eq!(
        result["fetched"],
        json!([[5, null], [-1001, null], [-1001, null]]),
        "{result}"
    );
    let checkpoints = door
        .broker
        .list_checkpoints("orders", "manual")
        .await
        .unwrap();
    assert_eq!(checkpoints.len(), 1, "{checkpoints:?}");
    assert_eq!(checkpoints[0].sequence_number, Some(4));
    // A commit from outside the group holds no partition afterwards.
    let owners = door
        .broker
        .list_ownership("orders", "manual")
        .await
        .unwrap();
    assert!(owners.iter().all(|o| o.owner_id.is_empty()), "{owners:?}");
    door.stop().await;
}

/// A group id that is no consumer group name gets INVALID_GROUP_ID (joining and committing),
/// a session timeout outside 6 s to 30 min INVALID_SESSION_TIMEOUT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_group_ids_and_session_timeouts_are_refused() {
    let dir = TempDir::new().unwrap();
    let door = Door::start(dir.path(), &[("orders", 2)], None).await;
    let bad_id = groups("refused", door.args("orders", 2, "no spaces allowed")).await;
    assert_eq!(bad_id["errors"][0], "INVALID_GROUP_ID", "{bad_id}");
    assert_eq!(bad_id["commit_error"], "INVALID_GROUP_ID", "{bad_id}");
    let short = with(
        door.args("orders", 2, "hasty"),
        json!({"extra": {"session.timeout.ms": 3000, "heartbeat.interval.ms": 1000}}),
    );
    let short = groups("refused", short).await;
    assert_eq!(short["errors"][0], "INVALID_SESSION_TIMEOUT", "{short}");
    door.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_without_listen_cannot_join_or_commit() {
    let dir = TempDir::new().unwrap();
    let door = Door::start(dir.path(), &[("orders", 2)], None).await;
    let args = with(
        door.args("orders", 2, "sneaky"),
        json!({"conn": door.conn(&door.send)}),
    );
    let refused = groups("refused", args).await;
    assert_eq!(
        refused["errors"][0], "GROUP_AUTHORIZATION_FAILED",
        "{refused}"
    );
    assert_eq!(
        refused["commit_error"], "TOPIC_AUTHORIZATION_FAILED",
        "{refused}"
    );
    let fetch = with(
        door.args("orders", 2, "sneaky"),
        json!({"conn": door.conn(&door.send), "offsets": [["orders", 0, 1]]}),
    );
    let fetched = groups("commit", fetch).await;
    assert_eq!(
        fetched["fetched"][0][1], "TOPIC_AUTHORIZATION_FAILED",
        "{fetched}"
    );
    assert!(
        door.broker
            .list_checkpoints("orders", "sneaky")
            .await
            .is_err()
    );
    door.stop().await;
}

/// Two listeners over one broker (as `serve`'s plain and TLS Kafka doors) share their groups:
/// a member that joined through one is the group's member seen through the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doors_of_one_broker_share_their_groups() {
    let dir = TempDir::new().unwrap();
    let door = Door::start(dir.path(), &[("orders", 2)], None).await;
    let policies = AccessPolicies::new(vec![door.root.clone(), door.send.clone()]).unwrap();
    let config = KafkaConfig::new(([127, 0, 0, 1], 0).into(), policies);
    let other = tributary_kafka::start(door.broker.clone(), config)
        .await
        .unwrap();
    let args = door.args("orders", 2, "shared");
    let mut member = holder(&args);
    member.next(Duration::from_secs(60)).await;
    let through_other = with(
        args,
        json!({"bootstrap": other.local_addr().to_string(), "describe": ["shared"], "delete": ["nobody"]}),
    );
    let admin = groups("admin", through_other).await;
    let described = &admin["described"]["shared"];
    assert_eq!(described["state"], "ConsumerGroupState.STABLE", "{admin}");
    assert_eq!(described["members"], json!([[0, 1]]), "{admin}");
    member.write_line("leave").await;
    member.wait_success(Duration::from_secs(30)).await;
    other.shutdown().await;
    door.stop().await;
}
