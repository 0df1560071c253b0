//! `tributary replicate` as a user runs it: two processes share one task file, one is killed
//! with SIGKILL mid-stream, and the other takes its partitions over from their checkpoints —
//! copying between hubs, and from a Kafka cluster that is itself killed and comes back.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use tributary_broker::SendTarget;
use tributary_event::EventData;
use tributary_testkit::{TestHub, within};

mod common;
use common::replicator;

const PARTITIONS: u32 = 4;
const BATCH: usize = 20;

/// Every (partition, sequence number) of the source the target holds, with how often.
async fn copies(target: &TestHub) -> BTreeMap<(String, i64), usize> {
    let mut seen = BTreeMap::new();
    for partition in 0..PARTITIONS {
        for event in target.read_all("orders", partition).await {
            let text = |key: &str| match event.data.property(key) {
                Some(tributary_event::PropertyValue::String(v)) => v.to_string(),
                other => panic!("{key}: {other:?}"),
            };
            let key = (
                text("repl-partition"),
                text("repl-sequence").parse().unwrap(),
            );
            *seen.entry(key).or_default() += 1;
        }
    }
    seen
}

/// Waits until `target` holds every (partition, sequence number) of `sent`; then asserts it
/// holds nothing else and at most one batch per partition twice.
async fn all_copied_once_or_a_batch_twice(target: &TestHub, sent: &BTreeSet<(String, i64)>) {
    let seen = within("the survivor to copy everything", async {
        loop {
            let seen = copies(target).await;
            if sent.iter().all(|key| seen.contains_key(key)) {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let stray: Vec<_> = seen.keys().filter(|key| !sent.contains(key)).collect();
    assert!(stray.is_empty(), "only source events: {stray:?}");
    let duplicates: usize = seen.values().map(|n| n - 1).sum();
    assert!(
        duplicates <= BATCH * PARTITIONS as usize,
        "{duplicates} duplicates; at most one batch per partition"
    );
}

/// `tributary replicate --status` shows `second` owning every partition.
fn assert_the_survivor_owns_everything(task: &Path) {
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_tributary"))
        .args(["replicate", "--status"])
        .arg(task)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert_eq!(
        table.matches("\tsecond").count(),
        PARTITIONS as usize,
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replicator_loses_nothing_and_duplicates_at_most_a_batch_per_partition() {
    let dir = tempfile::tempdir().unwrap();
    let source = TestHub::start(&[("orders", PARTITIONS)]).await;
    let target = TestHub::start(&[("orders", PARTITIONS)]).await;
    source
        .broker
        .create_consumer_group("orders", "replication")
        .await
        .unwrap();
    let task = dir.path().join("copy.toml");
    std::fs::write(
        &task,
        format!(
            "name = \"copy\"\n[source]\nconnection_string = \"{}\"\nevent_hub = \"orders\"\nconsumer_group = \"replication\"\nbatch_events_max = {BATCH}\n[[target]]\nname = \"backup\"\nconnection_string = \"{}\"\nevent_hub = \"orders\"\nkeep_partition = true\n[retry]\nbackoff_min = \"50ms\"\nbackoff_max = \"1s\"\n[processor]\nload_balancing_interval = \"200ms\"\nownership_expiration = \"2s\"\n",
            source.connection_string, target.connection_string
        ),
    )
    .unwrap();
    let mut first = replicator(&task, "first");
    let mut second = replicator(&task, "second");
    let mut sent: BTreeSet<(String, i64)> = BTreeSet::new();
    for round in 0..60 {
        for partition in 0..PARTITIONS {
            let events: Vec<EventData> = (0..5)
                .map(|i| EventData::new(format!("r{round}-{i}")))
                .collect();
            let to = SendTarget::Partition(partition.to_string());
            let receipt = source.broker.send("orders", to, events).await.unwrap();
            for i in 0..5 {
                sent.insert((partition.to_string(), receipt.base_sequence + i));
            }
        }
        if round == 30 {
            first.start_kill().expect("SIGKILL");
            first.wait().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    all_copied_once_or_a_batch_twice(&target, &sent).await;
    assert_the_survivor_owns_everything(&task);
    status_until(&task, "second sees it: answering", "the cluster back").await;
    second.start_kill().unwrap();
    second.wait().await.unwrap();
}

/// `tributary replicate --status` of `task`, once its output contains `wanted` (polled for up
/// to a minute).
async fn status_until(task: &Path, wanted: &str, what: &str) -> String {
    within(what, async {
        loop {
            let status = tokio::process::Command::new(env!("CARGO_BIN_EXE_tributary"))
                .args(["replicate", "--status"])
                .arg(task)
                .output()
                .await
                .unwrap();
            let text = String::from_utf8_lossy(&status.stdout).into_owned();
            if text.contains(wanted) {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await
}

/// The ports of the `serve`s whose Kafka door is a task's source: any free ones (the Kafka
/// door's is added, to come back on the port it had).
#[cfg(feature = "kafka")]
const SERVE_PORTS: [&str; 4] = ["--amqp-port", "0", "--http-port", "0"];

/// A `tributary serve` whose Kafka door is a task's source, with the topic `orders`.
#[cfg(feature = "kafka")]
struct KafkaDoor {
    serve: common::ServeGuard,
    /// `127.0.0.1:<port>`.
    bootstrap: String,
    port: String,
    /// The SASL PLAIN password.
    connection_string: String,
    cluster: tributary_kafka_source::test_cluster::TestCluster,
}

#[cfg(feature = "kafka")]
impl KafkaDoor {
    async fn start(data: &Path) -> KafkaDoor {
        use tributary_kafka_source::KafkaOptions;
        let (serve, banner, _stderr) = common::start_serve(data, &SERVE_PORTS);
        let serve = common::ServeGuard::new(serve);
        let bootstrap = common::banner_addr(&banner, "kafka:");
        let port = bootstrap.rsplit(':').next().unwrap().to_owned();
        let connection_string = common::shown_connection_string(&banner);
        let mut options =
            KafkaOptions::from_event_hubs_connection_string(&connection_string).unwrap();
        options.bootstrap_servers.clone_from(&bootstrap);
        let cluster = tributary_kafka_source::test_cluster::TestCluster::new(options);
        cluster.create_topic("orders", PARTITIONS as i32).await;
        KafkaDoor {
            serve,
            bootstrap,
            port,
            connection_string,
            cluster,
        }
    }
}

/// Five records to each partition of `orders`, their values `<prefix>-<i>`.
#[cfg(feature = "kafka")]
async fn produce_five_each(
    cluster: &tributary_kafka_source::test_cluster::TestCluster,
    prefix: &str,
) {
    use tributary_kafka_source::test_cluster::TestRecord;
    for partition in 0..PARTITIONS {
        let records: Vec<TestRecord> = (0..5)
            .map(|i| TestRecord {
                value: format!("{prefix}-{i}").into_bytes(),
                ..TestRecord::default()
            })
            .collect();
        cluster.produce("orders", partition as i32, &records).await;
    }
}

/// The body of `GET /metrics` at `addr` (none while nothing answers there).
#[cfg(feature = "kafka")]
fn metrics_at(addr: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

/// `tributary replicate` of `task` as `host`, and its log (standard error) line by line.
#[cfg(feature = "kafka")]
fn replicator_logging(
    task: &Path,
    host: &str,
) -> (tokio::process::Child, std::sync::mpsc::Receiver<String>) {
    let mut child = common::replicator_logging_to(task, host, std::process::Stdio::piped());
    let stderr = child.stderr.take().unwrap().into_owned_fd().unwrap();
    (child, common::lines_of(std::fs::File::from(stderr)))
}

/// The body of `GET /metrics` at `addr` once it contains `wanted` (polled for up to a minute).
#[cfg(feature = "kafka")]
async fn metrics_until(addr: &str, wanted: &str) -> String {
    within(wanted, async {
        loop {
            let body = metrics_at(addr).unwrap_or_default();
            if body.contains(wanted) {
                return body;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

/// A task whose Kafka cluster does not answer when it starts waits for it — logging each
/// failure, `--status` and `/metrics` saying the source fails — and copies everything once the
/// cluster is back, `/metrics` then saying the source is up.
#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_source_unreachable_at_start_is_reported_and_waited_for() {
    use common::{ServeGuard, start_serve};

    let dir = tempfile::tempdir().unwrap();
    let cluster_dir = dir.path().join("cluster");
    // A first start makes the cluster's keys and topic; then it goes away.
    let door = KafkaDoor::start(&cluster_dir).await;
    let (bootstrap, kafka_port, conn) = (&door.bootstrap, &door.port, &door.connection_string);
    let mut cluster_process = door.serve.take();
    cluster_process.kill().unwrap();
    cluster_process.wait().unwrap();

    let target = TestHub::start(&[("orders", PARTITIONS)]).await;
    let metrics_addr = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap().to_string()
    };
    let task = dir.path().join("waits.toml");
    std::fs::write(
        &task,
        format!(
            "name = \"waits\"\n[source]\nkind = \"kafka\"\nbootstrap_servers = \"{bootstrap}\"\nconnection_string = \"{conn}\"\ntopic = \"orders\"\n[[target]]\nname = \"hub\"\nconnection_string = \"{}\"\nevent_hub = \"orders\"\nkeep_partition = true\n[retry]\nbackoff_min = \"50ms\"\nbackoff_max = \"500ms\"\n[metrics]\nlisten = \"{metrics_addr}\"\n",
            target.connection_string
        ),
    )
    .unwrap();
    let (mut waiting, log) = replicator_logging(&task, "patient");
    let line = common::wait_for_line(&log, "the source does not answer", "replicate");
    assert!(
        line.contains(bootstrap.as_str()),
        "the log names the cluster: {line}"
    );
    let status = status_until(&task, "patient sees it: FAILING", "the status").await;
    assert!(status.contains(bootstrap.as_str()), "{status}");
    metrics_until(
        &metrics_addr,
        "tributary_replicate_source_up{task=\"waits\"} 0",
    )
    .await;

    let again = [&SERVE_PORTS[..], &["--kafka-port", kafka_port.as_str()]].concat();
    let serve = ServeGuard::new(start_serve(&cluster_dir, &again).0);
    produce_five_each(&door.cluster, "p").await;
    let sent: BTreeSet<(String, i64)> = (0..PARTITIONS)
        .flat_map(|p| (0..5).map(move |s| (p.to_string(), s)))
        .collect();
    all_copied_once_or_a_batch_twice(&target, &sent).await;
    metrics_until(
        &metrics_addr,
        "tributary_replicate_source_up{task=\"waits\"} 1",
    )
    .await;
    waiting.start_kill().unwrap();
    waiting.wait().await.unwrap();
    drop(serve);
}

/// A task copying from a Kafka cluster — a `tributary serve`'s Kafka door, logged into with its
/// connection string — to a hub, while one of its two processes is killed with SIGKILL and the
/// cluster itself is killed and comes back on the same port: the task (which logs the lost
/// cluster as a transient failure and retries) resumes; every record reaches the target, none
/// stray, at most a batch per partition twice.
#[cfg(feature = "kafka")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_source_lost_and_back_and_a_killed_replicator_lose_nothing() {
    use common::{ServeGuard, start_serve};

    let dir = tempfile::tempdir().unwrap();
    let cluster_dir = dir.path().join("cluster");
    let KafkaDoor {
        serve,
        bootstrap,
        port: kafka_port,
        connection_string: conn,
        cluster,
    } = KafkaDoor::start(&cluster_dir).await;
    let mut serve = serve;
    let target = TestHub::start(&[("orders", PARTITIONS)]).await;
    let task = dir.path().join("from-kafka.toml");
    std::fs::write(
        &task,
        format!(
            "name = \"from-kafka\"\n[source]\nkind = \"kafka\"\nbootstrap_servers = \"{bootstrap}\"\nconnection_string = \"{conn}\"\ntopic = \"orders\"\nbatch_events_max = {BATCH}\n[[target]]\nname = \"hub\"\nconnection_string = \"{}\"\nevent_hub = \"orders\"\nkeep_partition = true\n[retry]\nbackoff_min = \"50ms\"\nbackoff_max = \"1s\"\n[processor]\nload_balancing_interval = \"200ms\"\nownership_expiration = \"2s\"\n",
            target.connection_string
        ),
    )
    .unwrap();
    let mut first = replicator(&task, "first");
    let mut second = replicator(&task, "second");
    for round in 0..30 {
        produce_five_each(&cluster, &format!("r{round}")).await;
        if round == 10 {
            first.start_kill().expect("SIGKILL");
            first.wait().await.unwrap();
        }
        if round == 20 {
            // The cluster goes away (kill -9) while the task copies — `--status` says the
            // source fails — and comes back.
            let mut cluster_process = serve.take();
            cluster_process.kill().unwrap();
            cluster_process.wait().unwrap();
            status_until(&task, "FAILING", "the lost cluster reported").await;
            let again = [&SERVE_PORTS[..], &["--kafka-port", kafka_port.as_str()]].concat();
            serve = ServeGuard::new(start_serve(&cluster_dir, &again).0);
        }
    }
    let sent: BTreeSet<(String, i64)> = (0..PARTITIONS)
        .flat_map(|p| (0..150).map(move |s| (p.to_string(), s)))
        .collect();
    all_copied_once_or_a_batch_twice(&target, &sent).await;
    assert_the_survivor_owns_everything(&task);
    status_until(&task, "second sees it: answering", "the cluster back").await;
    second.start_kill().unwrap();
    second.wait().await.unwrap();
    drop(serve);
}
