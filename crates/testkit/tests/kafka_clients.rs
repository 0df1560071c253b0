//! The Kafka door with the other Kafka clients, unmodified and configured as for Event Hubs'
//! Kafka endpoint (SASL_PLAINTEXT, PLAIN, user `$ConnectionString`, a connection string or a
//! SAS token as the password): kafka-python 2.x and 3.x and aiokafka
//! (`tests/python/kafka_clients.py`), kafkajs (`tests/js/kafka_clients.js`) and Debian's kcat.
//! `scripts/setup-kafka-interop` installs them all; a missing client FAILS these tests, it
//! never skips them. (librdkafka through confluent-kafka is `tests/kafka.rs`'s.)
//!
//! One hub and one Kafka door serve every test of this binary (started on first use, on a
//! runtime of their own); each client has its own topics, so the tests run side by side. Each
//! client runs once, doing every check in one process, and the test asserts on what it reports:
//! - produce with acks 0, 1 and all, with each compression the door reads (kafkajs all but
//!   zstd, whose kafkajs codec is a native addon this setup does not build), idempotent with
//!   acks all;
//! - consume by assignment from the beginning (logged in with a SAS token): every record with
//!   its offset, key, headers and CreateTime, and nothing a refused produce sent;
//! - find an offset by time (ListOffsets by timestamp) and read from there;
//! - refusals, each raised by the client within seconds: a record over 1 MiB
//!   (MESSAGE_TOO_LARGE), a produce without Send and a fetch without Listen
//!   (TOPIC_AUTHORIZATION_FAILED), a wrong key (the SASL login fails, its reason reaching the
//!   client);
//! - a consumer group: subscribe, read every record, commit, and the commits read back
//!   (kafkajs reads its records this way: it has no assignment without a group; kcat's group
//!   resumes at its commits);
//! - kafka-python's KafkaAdminClient (2.x and 3.x) creates, describes and deletes a topic, and
//!   is refused the creation without Manage.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};
use tributary_kafka::KafkaConfig;
use tributary_testkit::TestHub;
use tributary_testkit::sdk::{python, repo, run_json};

/// Every client's topics: `<client>` with three partitions, `<client>-time` with one.
const CLIENTS: [&str; 5] = [
    "kafka-python-2",
    "kafka-python-3",
    "aiokafka",
    "kafkajs",
    "kcat",
];

/// The compressions every client produces with (those the door reads: crates/kafka/src/
/// batches.rs).
const COMPRESSIONS: [&str; 5] = ["none", "gzip", "snappy", "lz4", "zstd"];

/// The shared door: where it listens, the passwords the clients log in with.
struct Door {
    bootstrap: String,
    /// root (Manage), token (a SAS token signed with the root key), listen (listen-only),
    /// send (send-only), bad (the root connection string with a wrong key).
    conns: Value,
}

/// The door of this test binary, started on first use on a runtime that lives as long as the
/// process (its broker's data directory outlives it too: [`data_dir`]).
fn door() -> &'static Door {
    static DOOR: OnceLock<Door> = OnceLock::new();
    DOOR.get_or_init(|| {
        let (started, door) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime for the door");
            runtime.block_on(async move {
                let (hub, bootstrap) = start_hub().await;
                let conns = passwords(&hub);
                started
                    .send(Door { bootstrap, conns })
                    .expect("the test waits");
                // Serve until the test process exits.
                std::future::pending::<()>().await;
            });
        });
        door.recv().expect("the hub and its Kafka door start")
    })
}

/// What this binary's data directories are called: the prefix, then the process id.
const DATA_DIR_PREFIX: &str = "kafka-clients-";

/// The broker's data directory, under the target directory's tmp. The process exits without
/// dropping it, so each run first removes those of earlier runs whose process is gone.
fn data_dir() -> tempfile::TempDir {
    let tmp = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    for entry in std::fs::read_dir(tmp).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(DATA_DIR_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        if pid.is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists()) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    tempfile::Builder::new()
        .prefix(&format!("{DATA_DIR_PREFIX}{}-", std::process::id()))
        .tempdir_in(tmp)
        .expect("a data directory")
}

/// A hub with every client's topics and the Kafka door beside it, SASL required.
async fn start_hub() -> (TestHub, String) {
    let names: Vec<(String, u32)> = CLIENTS
        .iter()
        .flat_map(|c| [(c.to_string(), 3), (format!("{c}-time"), 1)])
        .collect();
    let hubs: Vec<(&str, u32)> = names.iter().map(|(n, p)| (n.as_str(), *p)).collect();
    let dir = data_dir();
    let hub = TestHub::start_in(dir, &hubs, |_| {}, None).await;
    let config = KafkaConfig::new("127.0.0.1:0".parse().unwrap(), hub.policies.clone());
    let door = tributary_kafka::start(hub.broker.clone(), config)
        .await
        .expect("the Kafka door starts");
    let bootstrap = door.local_addr().to_string();
    // Kept running: the door stops when dropped.
    std::mem::forget(door);
    (hub, bootstrap)
}

/// The passwords of [`Door::conns`].
fn passwords(hub: &TestHub) -> Value {
    let expiry = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    let token = tributary_eventhubs::sas::sign(
        &format!("sb://127.0.0.1:{}/", hub.port()),
        &hub.root.name,
        &hub.root.key,
        expiry,
    );
    json!({
        "root": hub.conn(&hub.root),
        "token": token,
        "listen": hub.conn(&hub.listen),
        "send": hub.conn(&hub.send),
        "bad": hub.with_key("bm90LXRoZS1rZXk="),
    })
}

/// The arguments every client's run gets.
fn arguments(client: &str) -> Value {
    let door = door();
    json!({
        "bootstrap": door.bootstrap,
        "conns": door.conns,
        "topic": client,
        "time_topic": format!("{client}-time"),
        "compressions": COMPRESSIONS,
        "group": format!("{client}-group"),
        "admin_topic": format!("{client}-admin"),
    })
}

/// Runs `kafka_clients.py <client>` with `<repo>/.venv`'s Python and `python_path` first on
/// its path.
async fn run_python_client(client: &str, python_path: Option<PathBuf>, args: Value) -> Value {
    let script = repo().join("crates/testkit/tests/python/kafka_clients.py");
    let mut command = tokio::process::Command::new(python());
    if let Some(path) = python_path {
        assert!(
            path.exists(),
            "kafka-python 2 is not installed: run scripts/setup-kafka-interop (expected {})",
            path.display()
        );
        command.env("PYTHONPATH", path);
    }
    command.arg(script).arg(client).arg(args.to_string());
    run_json(command, &format!("kafka_clients.py {client}")).await
}

/// Runs kcat with the SASL settings for `password`, `args` after them, `stdin` as its input;
/// returns its exit code (None when it had to be stopped after `seconds`), stdout and stderr.
async fn kcat(
    password: &Value,
    args: &[&str],
    stdin: &[u8],
    seconds: u64,
) -> (Option<i32>, String, String) {
    use tokio::io::AsyncWriteExt;
    let password = format!("sasl.password={}", password.as_str().unwrap());
    let mut command = tokio::process::Command::new("timeout");
    command
        .args([&seconds.to_string(), "kcat", "-b", &door().bootstrap])
        .args([
            "-X",
            "security.protocol=SASL_PLAINTEXT",
            "-X",
            "sasl.mechanisms=PLAIN",
        ])
        .args(["-X", "sasl.username=$ConnectionString", "-X", &password])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .expect("kcat is not installed: run scripts/setup-kafka-interop");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).await.unwrap();
    drop(input);
    let output = child.wait_with_output().await.unwrap();
    let code = output.status.code().filter(|c| *c != 124);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (code, text(&output.stdout), text(&output.stderr))
}

/// The records a run's produce check sent, as the consumer must read them back: per
/// partition, offsets dense from 0 in the order sent. Also asserts every send succeeded and,
/// where the client learns it (acks 1 and all), got that offset.
fn expected_records(out: &Value) -> Vec<Value> {
    let who = &out["client"];
    let produced = &out["produced"];
    assert_eq!(produced["error"], Value::Null, "{who}: {produced}");
    let results = produced["result"].as_array().unwrap();
    let plan = out["plan"].as_array().unwrap();
    assert_eq!(results.len(), plan.len(), "{who}: {produced}");
    let mut next = [0_i64; 3];
    let mut expected = Vec::new();
    for (record, result) in plan.iter().zip(results) {
        let partition = record["partition"].as_u64().unwrap() as usize;
        assert_eq!(result["error"], Value::Null, "{who}: {record} {result}");
        if record["acks"] != "0" {
            assert_eq!(result["offset"], next[partition], "{who}: {record}");
        }
        expected.push(json!({
            "partition": partition, "offset": next[partition], "value": record["value"],
            "key": record["key"], "headers": record["headers"], "timestamp": record["timestamp"],
        }));
        next[partition] += 1;
    }
    expected
}

/// Sorts records by partition and offset.
fn in_order(records: &Value) -> Vec<Value> {
    let mut records = records.as_array().cloned().unwrap_or_default();
    records.sort_by_key(|r| (r["partition"].as_i64(), r["offset"].as_i64()));
    records
}

/// Asserts that check `name` of a run failed with an error naming one of `expected`, within
/// `seconds` (a refusal, not a hang).
fn assert_refused(out: &Value, name: &str, expected: &[&str], seconds: f64) {
    let check = &out[name];
    let who = &out["client"];
    let error = check["error"].as_str().unwrap_or_default();
    assert!(
        expected.iter().any(|e| error.contains(e)),
        "{who}: {name} should fail with one of {expected:?}: {check}"
    );
    let took = check["seconds"].as_f64().unwrap();
    assert!(took < seconds, "{who}: {name} took {took} s: {check}");
}

/// The checks both Python clients report the same way.
fn assert_python_client(out: &Value, version: &str) {
    let who = &out["client"];
    assert!(
        who.as_str().unwrap().starts_with(version),
        "{who} is not {version}"
    );
    let expected = expected_records(out);
    let consumed = &out["consumed"];
    assert_eq!(consumed["error"], Value::Null, "{who}: {consumed}");
    let records = in_order(&consumed["result"]["records"]);
    assert_eq!(records, expected, "{who}: what was produced, read back");
    let ends = json!({
        "0": produced_to(&expected, 0), "1": produced_to(&expected, 1), "2": produced_to(&expected, 2),
    });
    assert_eq!(consumed["result"]["end_offsets"], ends, "{who}: {consumed}");

    let by_time = &out["by_time"];
    assert_eq!(by_time["error"], Value::Null, "{who}: {by_time}");
    assert_eq!(by_time["result"]["offset"], 1, "{who}: {by_time}");
    assert_eq!(
        by_time["result"]["after_the_end"],
        Value::Null,
        "{who}: {by_time}"
    );
    assert_eq!(
        by_time["result"]["read"][0]["value"], "after",
        "{who}: {by_time}"
    );

    assert_refused(out, "oversize", &["MessageSizeTooLarge"], 15.0);
    assert_refused(out, "no_send_right", &["TopicAuthorizationFailed"], 15.0);
    assert_refused(out, "no_listen_right", &["TopicAuthorizationFailed"], 15.0);
    assert_login_refused(out);
    assert_group_read(out, &expected);
}

/// The group check: a member of group `<client>-group` read every record, was assigned every
/// partition, and its commits (read back through OffsetFetch) are each partition's end.
fn assert_group_read(out: &Value, expected: &[Value]) {
    let who = &out["client"];
    let group = &out["group"];
    assert_eq!(group["error"], Value::Null, "{who}: {group}");
    let records = in_order(&group["result"]["records"]);
    assert_eq!(records, expected, "{who}: what the group member read");
    if let Some(assigned) = group["result"].get("assigned") {
        assert_eq!(assigned, &json!([0, 1, 2]), "{who}: {group}");
    }
    let ends = json!({
        "0": produced_to(expected, 0), "1": produced_to(expected, 1), "2": produced_to(expected, 2),
    });
    assert_eq!(group["result"]["committed"], ends, "{who}: {group}");
}

/// How many of `records` went to `partition`.
fn produced_to(records: &[Value], partition: i64) -> usize {
    records
        .iter()
        .filter(|r| r["partition"] == partition)
        .count()
}

/// kafka-python's KafkaAdminClient created the topic (two partitions), listed and described it
/// and deleted it; without Manage the creation was refused.
fn assert_admin(out: &Value) {
    let who = &out["client"];
    let admin = &out["admin"];
    assert_eq!(admin["error"], Value::Null, "{who}: {admin}");
    let result = &admin["result"];
    assert_eq!(result["listed"], true, "{who}: {admin}");
    assert_eq!(result["partitions"], 2, "{who}: {admin}");
    assert_eq!(result["deleted"], true, "{who}: {admin}");
    let refused = result["refused"]["error"].as_str().unwrap_or_default();
    assert!(
        refused.contains("AuthorizationFailed"),
        "{who}: a creation without Manage: {admin}"
    );
}

/// A wrong key: the client raises within seconds, and the door's reason reached it.
fn assert_login_refused(out: &Value) {
    let who = &out["client"];
    let reason =
        "Authentication failed: no shared access policy \"RootManageSharedAccessKey\" has that key";
    {
        // kafka-python retries a refused login until its timeout, as against any Kafka broker;
        // aiokafka gives up at once. Both raise their own error and log the door's reason.
        let raised = [
            "KafkaTimeoutError",
            "KafkaConnectionError: Unable to bootstrap",
        ];
        assert_refused(out, "bad_credentials", &raised, 15.0);
        let lines = out["auth_log"].as_array().unwrap();
        let logged: Vec<&str> = lines.iter().filter_map(Value::as_str).collect();
        let logged = logged.join("\n");
        assert!(logged.contains(reason), "{who}: {logged}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_3_produces_consumes_and_is_refused_as_kafka_refuses() {
    let out = run_python_client("kafka-python", None, arguments("kafka-python-3")).await;
    assert_python_client(&out, "kafka-python 3.");
    assert_admin(&out);
    println!("{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_2_produces_consumes_and_is_refused_as_kafka_refuses() {
    let path = repo().join(".interop/kafka-python-2");
    let out = run_python_client("kafka-python", Some(path), arguments("kafka-python-2")).await;
    assert_python_client(&out, "kafka-python 2.");
    assert_admin(&out);
    println!("{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aiokafka_produces_consumes_and_is_refused_as_kafka_refuses() {
    let out = run_python_client("aiokafka", None, arguments("aiokafka")).await;
    assert_python_client(&out, "aiokafka ");
    println!("{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafkajs_produces_consumes_in_a_group_and_is_refused_as_kafka_refuses() {
    let args = arguments("kafkajs").to_string();
    let out = tributary_testkit::run_kafkajs("kafka_clients.js", &[&args]).await;
    let who = &out["client"];
    assert_eq!(who, "kafkajs 2.2.4");
    let expected = expected_records(&out);
    // kafkajs reads records only through a group (its check logs in with a SAS token).
    assert_group_read(&out, &expected);
    let offsets = &out["offsets"];
    assert_eq!(offsets["error"], Value::Null, "{offsets}");
    for p in 0..3 {
        let count = produced_to(&expected, p);
        assert_eq!(
            offsets["result"][p.to_string()],
            json!([0, count]),
            "{offsets}"
        );
    }
    let by_time = &out["by_time"];
    assert_eq!(by_time["error"], Value::Null, "{by_time}");
    // kafkajs answers the end offset where the door finds no record after the time.
    // Read from there by a consumer that seeks to it.
    let expected = json!({"offset": 1, "after_the_end": 2, "read": "after"});
    assert_eq!(by_time["result"], expected, "{by_time}");
    assert_refused(&out, "oversize", &["MESSAGE_TOO_LARGE"], 15.0);
    assert_refused(&out, "no_send_right", &["TOPIC_AUTHORIZATION_FAILED"], 15.0);
    assert_refused(
        &out,
        "no_listen_right",
        &["TOPIC_AUTHORIZATION_FAILED"],
        15.0,
    );
    let sasl = "KafkaJSSASLAuthenticationError: SASL PLAIN authentication failed: Authentication failed: no shared access policy";
    assert_refused(&out, "bad_credentials", &[sasl], 15.0);
}

/// kcat's produce of one acks setting and compression to its partition (acks 0 to 0, 1 to 1,
/// all to 2, idempotent): two records with keys and a header naming the batch; returns the
/// records as `kcat -J` prints them back.
async fn kcat_produce(conns: &Value, acks: &str, compression: &str, first: usize) -> Vec<Value> {
    let partition = ["0", "1", "all"].iter().position(|a| *a == acks).unwrap();
    let batch = format!("{acks}-{compression}");
    let lines = format!("key-{first}|{batch}-0\nkey-{}|{batch}-1\n", first + 1);
    let (partition_arg, acks_arg) = (partition.to_string(), format!("acks={acks}"));
    let idempotence = format!("enable.idempotence={}", acks == "all");
    let header = format!("batch={batch}");
    let args = [
        "-P",
        "-t",
        "kcat",
        "-p",
        &partition_arg,
        "-K",
        "|",
        "-H",
        &header,
        "-z",
        compression,
        "-X",
        &acks_arg,
        "-X",
        &idempotence,
    ];
    let (code, _, stderr) = kcat(&conns["root"], &args, lines.as_bytes(), 30).await;
    assert_eq!(code, Some(0), "kcat -P {acks} {compression}: {stderr}");
    (0..2)
        .map(|i| {
            json!({"topic": "kcat", "partition": partition, "key": format!("key-{}", first + i),
                   "payload": format!("{batch}-{i}"), "headers": ["batch", batch]})
        })
        .collect()
}

/// kcat's records of `topic` from the beginning to the end, logged in with a SAS token.
async fn kcat_consume(conns: &Value) -> Vec<Value> {
    let args = ["-C", "-t", "kcat", "-o", "beginning", "-e", "-J"];
    let (code, stdout, stderr) = kcat(&conns["token"], &args, b"", 30).await;
    assert_eq!(code, Some(0), "kcat -C: {stderr}");
    let records: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("kcat -J prints JSON"))
        .collect();
    in_order(&Value::Array(records))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcat_produces_consumes_and_is_refused_as_kafka_refuses() {
    let conns = door().conns.clone();
    let mut produced = Vec::new();
    for acks in ["0", "1", "all"] {
        for compression in COMPRESSIONS {
            produced.extend(kcat_produce(&conns, acks, compression, produced.len()).await);
        }
    }
    let consumed = kcat_consume(&conns).await;
    let mut offsets = [0_i64; 3];
    let expected: Vec<Value> = in_order(&Value::Array(produced));
    assert_eq!(consumed.len(), expected.len(), "{consumed:#?}");
    for (got, want) in consumed.iter().zip(&expected) {
        let partition = got["partition"].as_u64().unwrap() as usize;
        assert_eq!(got["offset"], offsets[partition], "dense offsets: {got}");
        offsets[partition] += 1;
        for field in ["partition", "key", "payload", "headers"] {
            assert_eq!(got[field], want[field], "{got} should be {want}");
        }
        assert_eq!(got["tstype"], "create", "{got}");
    }
    kcat_reads_in_a_group(&conns, &consumed).await;
    kcat_finds_by_time(&conns).await;
    kcat_is_refused(&conns).await;
}

/// `kcat -G` (a balanced consumer, group `kcat-group`) reads every record and commits on its
/// way out; run again, the group resumes at its commits and reads nothing more.
async fn kcat_reads_in_a_group(conns: &Value, all: &[Value]) {
    let args = [
        "-G",
        "kcat-group",
        "kcat",
        "-X",
        "auto.offset.reset=earliest",
        "-e",
        "-J",
    ];
    let (code, stdout, stderr) = kcat(&conns["root"], &args, b"", 60).await;
    assert_eq!(code, Some(0), "kcat -G: {stderr}");
    let read: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("kcat -J prints JSON"))
        .collect();
    assert_eq!(in_order(&Value::Array(read)), all, "kcat -G: {stderr}");
    let (code, stdout, stderr) = kcat(&conns["root"], &args, b"", 60).await;
    assert_eq!(
        (code, stdout.as_str()),
        (Some(0), ""),
        "kcat -G again: {stderr}"
    );
}

/// `kcat -Q` (ListOffsets by time) and `kcat -o s@<time>` find the first record at or after a
/// time.
async fn kcat_finds_by_time(conns: &Value) {
    let produce = |value: &'static str| {
        let conns = conns.clone();
        async move {
            let args = ["-P", "-t", "kcat-time", "-p", "0", "-X", "acks=all"];
            let (code, _, stderr) = kcat(&conns["root"], &args, value.as_bytes(), 30).await;
            assert_eq!(code, Some(0), "{stderr}");
        }
    };
    produce("before").await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let between = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    tokio::time::sleep(Duration::from_millis(50)).await;
    produce("after").await;
    let query = format!("kcat-time:0:{between}");
    let (code, stdout, stderr) = kcat(&conns["root"], &["-Q", "-t", &query], b"", 30).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(stdout.trim(), "kcat-time [0] offset 1", "{stderr}");
    let from = format!("s@{between}");
    let args = [
        "-C",
        "-t",
        "kcat-time",
        "-p",
        "0",
        "-o",
        &from,
        "-c",
        "1",
        "-e",
    ];
    let (code, stdout, stderr) = kcat(&conns["root"], &args, b"", 30).await;
    assert_eq!((code, stdout.trim()), (Some(0), "after"), "{stderr}");
}

/// A wrong key, a produce without Send, a fetch without Listen and a record over 1 MiB: kcat
/// exits with the door's reason, within seconds.
async fn kcat_is_refused(conns: &Value) {
    let (code, _, stderr) = kcat(&conns["bad"], &["-L", "-m", "5"], b"", 20).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr
            .contains("SASL authentication error: Authentication failed: no shared access policy"),
        "{stderr}"
    );
    let produce = ["-P", "-t", "kcat", "-p", "0"];
    let (code, _, stderr) = kcat(&conns["listen"], &produce, b"refused", 20).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("Topic authorization failed"), "{stderr}");
    let fetch = ["-C", "-t", "kcat", "-p", "0", "-o", "beginning", "-e"];
    let (code, _, stderr) = kcat(&conns["send"], &fetch, b"", 20).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("Topic authorization failed"), "{stderr}");
    // librdkafka's own limit raised, so the door is the one to refuse.
    let big = [
        "-P",
        "-t",
        "kcat",
        "-p",
        "0",
        "-X",
        "message.max.bytes=4000000",
    ];
    let mut record = vec![b'x'; 1024 * 1024 + 1];
    record.push(b'\n');
    let (code, _, stderr) = kcat(&conns["root"], &big, &record, 20).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("Message size too large"), "{stderr}");
}
