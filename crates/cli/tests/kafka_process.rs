//! `tributary process --kafka` on real Kafka-compatible brokers — Tansu (one per test binary) and
//! Tributary's own Kafka door (a `tributary serve` of the test's, logged into with SASL PLAIN
//! and its `$ConnectionString`, as Event Hubs' Kafka endpoint is): three processes share a
//! 12-partition topic evenly, one is `kill -9`ed, and the other two resume its partitions from
//! their checkpoints — nothing lost, nothing before a checkpoint read again; a missing topic or
//! an unreachable cluster stops `process` at once with a clear error.
#![cfg(feature = "kafka")]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::{ServeGuard, banner_addr, run, shown_connection_string, start_serve, tributary};
use tributary_kafka_source::KafkaOptions;
use tributary_kafka_source::tansu::Tansu;
use tributary_kafka_source::test_cluster::{TestCluster, TestRecord};

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 12;
const PER_PARTITION: usize = 10;

/// A child killed (SIGKILL) and reaped when dropped, so a failing test leaves none behind.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A cluster the processors read, and the flags that reach it.
struct Cluster {
    test: TestCluster,
    /// `--kafka BOOTSTRAP`, and the login where one is needed.
    flags: Vec<String>,
}

impl Cluster {
    fn tansu() -> Cluster {
        let tansu = Tansu::shared();
        Cluster {
            test: (**tansu).clone(),
            flags: vec!["--kafka".to_owned(), tansu.bootstrap_servers().to_owned()],
        }
    }

    /// A `tributary serve` of its own in `dir`/hub, its Kafka door as the cluster, and the
    /// server's standard error (kept while the server runs, so its pipe is drained).
    fn serve(dir: &Path) -> (ServeGuard, Cluster, Receiver<String>) {
        let ports = ["--amqp-port", "0", "--http-port", "0"];
        let (serve, banner, stderr) = start_serve(&dir.join("hub"), &ports);
        (ServeGuard::new(serve), Cluster::door(&banner), stderr)
    }

    /// The Kafka door of `serve`, whose banner is `banner`, with the connection string of the
    /// namespace's root policy (Manage, so topics can be created).
    fn door(banner: &str) -> Cluster {
        let bootstrap = banner_addr(banner, "kafka:");
        let connection_string = shown_connection_string(banner);
        let mut options =
            KafkaOptions::from_event_hubs_connection_string(&connection_string).unwrap();
        options.bootstrap_servers.clone_from(&bootstrap);
        let flags = [
            "--kafka",
            &bootstrap,
            "--kafka-username",
            "$ConnectionString",
        ];
        let mut flags: Vec<String> = flags.map(str::to_owned).to_vec();
        flags.extend(["--kafka-password".to_owned(), connection_string]);
        Cluster {
            test: TestCluster::new(options),
            flags,
        }
    }
}

/// The flags every command of this test names the cluster, the topic and its store with.
fn at(dir: &Path, cluster: &Cluster) -> Vec<String> {
    let store = format!("sqlite:{}", dir.join("checkpoints.sqlite").display());
    flags_for(cluster, TOPIC, &store)
}

/// The flags that name `cluster`, `topic` and `store`.
fn flags_for(cluster: &Cluster, topic: &str, store: &str) -> Vec<String> {
    let mut flags = cluster.flags.clone();
    flags.extend(["--topic", topic, "--store", store].map(str::to_owned));
    flags
}

fn start_processor(dir: &Path, cluster: &Cluster, host: &str) -> Reaped {
    start_processor_with(dir, host, at(dir, cluster))
}

/// A `tributary process` named `host` writing each partition's events to `dir`/out, reading
/// what `flags` name.
fn start_processor_with(dir: &Path, host: &str, flags: Vec<String>) -> Reaped {
    let out = dir.join("out");
    let mut args: Vec<String> = ["process", "--host-name", host, "--action", "file"]
        .map(str::to_owned)
        .to_vec();
    args.extend(["--output-dir".to_owned(), out.display().to_string()]);
    args.extend(["--interval", "300ms", "--expiration", "3s"].map(str::to_owned));
    args.extend(flags);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let child = tributary(&dir.join("data"), &args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("tributary process starts");
    Reaped(child)
}

/// `tributary ownership`: partition → (owner, checkpointed sequence number).
fn ownership(dir: &Path, cluster: &Cluster) -> BTreeMap<u32, (String, Option<i64>)> {
    if !dir.join("checkpoints.sqlite").exists() {
        return BTreeMap::new(); // No processor has opened the store yet.
    }
    let mut args = vec!["ownership".to_owned()];
    args.extend(at(dir, cluster));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let output = run(&dir.join("data"), &args);
    assert!(
        output.status.success(),
        "ownership: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let table = String::from_utf8(output.stdout).unwrap();
    table
        .lines()
        .skip(1)
        .map(|row| {
            let cols: Vec<&str> = row.split('\t').collect();
            let partition = cols[1].parse().expect("a partition number");
            (partition, (cols[2].to_owned(), cols[5].parse().ok()))
        })
        .collect()
}

/// How many partitions each owner holds.
fn owners(table: &BTreeMap<u32, (String, Option<i64>)>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (owner, _) in table.values() {
        *counts.entry(owner.clone()).or_default() += 1;
    }
    counts
}

/// Each partition's output file, line by line.
fn processed(dir: &Path) -> BTreeMap<i32, Vec<String>> {
    (0..PARTITIONS)
        .map(|p| {
            let path = dir.join("out").join(format!("{p}.events"));
            let text = std::fs::read_to_string(path).unwrap_or_default();
            (p, text.lines().map(str::to_owned).collect())
        })
        .collect()
}

fn expected(p: i32, records: std::ops::Range<usize>) -> Vec<String> {
    records.map(|i| format!("p{p}-{i:03}")).collect()
}

/// The lines in the order each first appeared. At least once: a partition that moves while a
/// batch of it is processed is delivered again to its next owner from the last checkpoint, as
/// over Event Hubs (the balancing at start moves partitions).
fn first_appearances(lines: &[String]) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    lines
        .iter()
        .filter(|line| seen.insert(line.as_str()))
        .cloned()
        .collect()
}

async fn produce(cluster: &Cluster, round: usize) {
    for p in 0..PARTITIONS {
        let records: Vec<TestRecord> = (round * PER_PARTITION..(round + 1) * PER_PARTITION)
            .map(|i| TestRecord {
                key: Some(format!("key-{p}").into_bytes()),
                value: format!("p{p}-{i:03}").into_bytes(),
                ..TestRecord::default()
            })
            .collect();
        cluster.test.produce(TOPIC, p, &records).await;
    }
}

/// Polls until `done` holds, failing after a minute with what `explain` says then.
async fn wait_until(what: &str, done: impl Fn() -> bool, explain: impl Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "not within 60 s: {what}\n{}",
            explain()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processors_share_a_tansu_topic_and_a_killed_ones_partitions_resume() {
    let dir = tempfile::tempdir().unwrap();
    three_processors_share_a_topic_and_a_killed_ones_partitions_resume(
        dir.path(),
        Cluster::tansu(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processors_share_a_topic_of_the_kafka_door_and_a_killed_ones_partitions_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (serve, cluster, _stderr) = Cluster::serve(dir.path());
    three_processors_share_a_topic_and_a_killed_ones_partitions_resume(dir.path(), cluster).await;
    drop(serve);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kafka_store_commits_tansu_group_offsets_and_resumes_from_them() {
    let dir = tempfile::tempdir().unwrap();
    the_kafka_store_commits_group_offsets_and_resumes_from_them(dir.path(), Cluster::tansu()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kafka_store_commits_the_kafka_doors_group_offsets_and_resumes_from_them() {
    let dir = tempfile::tempdir().unwrap();
    let (serve, cluster, _stderr) = Cluster::serve(dir.path());
    the_kafka_store_commits_group_offsets_and_resumes_from_them(dir.path(), cluster).await;
    drop(serve);
}

/// `--store kafka:`: a processor's checkpoints are the group's committed offsets as Kafka's
/// tools read them, and a partition the group had committed before (a Kafka consumer that
/// processed part of it) is processed from there, not again from the beginning.
async fn the_kafka_store_commits_group_offsets_and_resumes_from_them(d: &Path, cluster: Cluster) {
    const LEDGER: &str = "ledger";
    const RECORDS: i64 = 8;
    let cluster = &cluster;
    cluster.test.create_topic(LEDGER, 2).await;
    for p in 0..2 {
        let records: Vec<TestRecord> = (0..RECORDS)
            .map(|i| TestRecord {
                value: format!("p{p}-{i:03}").into_bytes(),
                ..TestRecord::default()
            })
            .collect();
        cluster.test.produce(LEDGER, p, &records).await;
    }
    // A Kafka consumer of the group had processed three records of partition 0.
    cluster
        .test
        .commit_offsets("$Default", LEDGER, &[(0, 3)])
        .await;
    // Ownership and the fenced checkpoints in a SQLite file, checkpoints in Kafka too.
    let store = format!("kafka:sqlite:{}", d.join("ownership.sqlite").display());
    let processor = start_processor_with(d, "k1", flags_for(cluster, LEDGER, &store));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let committed = cluster.test.committed_offsets("$Default", LEDGER, 2).await;
        if committed == [RECORDS, RECORDS] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every record committed within 60 s: {committed:?}; processed {:?}",
            processed(d)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let processed = processed(d);
    assert_eq!(first_appearances(&processed[&0]), expected(0, 3..8));
    assert_eq!(first_appearances(&processed[&1]), expected(1, 0..8));
    drop(processor);
}

/// Three processors share a topic of `cluster` evenly; one is killed and the other two take
/// its partitions over from their checkpoints.
async fn three_processors_share_a_topic_and_a_killed_ones_partitions_resume(
    d: &Path,
    cluster: Cluster,
) {
    let cluster = &cluster;
    cluster.test.create_topic(TOPIC, PARTITIONS).await;
    produce(cluster, 0).await;
    let mut hosts: BTreeMap<&str, Reaped> = ["p1", "p2", "p3"]
        .into_iter()
        .map(|host| (host, start_processor(d, cluster, host)))
        .collect();

    // Even shares, every record processed once and checkpointed at its partition's last one.
    let first_round = |table: &BTreeMap<u32, (String, Option<i64>)>| {
        owners(table) == BTreeMap::from([("p1".into(), 4), ("p2".into(), 4), ("p3".into(), 4)])
            && table
                .values()
                .all(|(_, seq)| *seq == Some(PER_PARTITION as i64 - 1))
    };
    wait_until(
        "4 partitions each, all checkpointed",
        || first_round(&ownership(d, cluster)),
        || format!("{:?}", ownership(d, cluster)),
    )
    .await;
    let before_kill = processed(d);
    for (p, lines) in &before_kill {
        assert_eq!(
            first_appearances(lines),
            expected(*p, 0..PER_PARTITION),
            "partition {p}"
        );
    }

    // kill -9 one of them; more records arrive meanwhile.
    let killed: Vec<u32> = ownership(d, cluster)
        .into_iter()
        .filter(|(_, (owner, _))| owner == "p1")
        .map(|(p, _)| p)
        .collect();
    drop(hosts.remove("p1"));
    produce(cluster, 1).await;

    let second_round = |table: &BTreeMap<u32, (String, Option<i64>)>| {
        owners(table) == BTreeMap::from([("p2".into(), 6), ("p3".into(), 6)])
            && table
                .values()
                .all(|(_, seq)| *seq == Some(2 * PER_PARTITION as i64 - 1))
    };
    wait_until(
        "the killed processor's partitions taken over and caught up",
        || second_round(&ownership(d, cluster)),
        || format!("{:?}", ownership(d, cluster)),
    )
    .await;
    // Every partition, the killed one's too, got every new record, in order, and none it had
    // before the kill: the new owners started after the checkpoints, not from the beginning.
    for (p, lines) in processed(d) {
        let since_kill = &lines[before_kill[&p].len()..];
        assert_eq!(
            first_appearances(since_kill),
            expected(p, PER_PARTITION..2 * PER_PARTITION),
            "partition {p} (killed: {killed:?})"
        );
    }
    for (host, mut child) in hosts {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &child.0.id().to_string()])
            .status();
        let status = child.0.wait().unwrap();
        assert!(status.success(), "{host} stopped with {status}");
    }
}

#[test]
fn a_missing_topic_or_an_unreachable_cluster_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let store = format!("sqlite:{}", d.join("checkpoints.sqlite").display());
    let bootstrap = Tansu::shared().bootstrap_servers().to_owned();
    let missing = [
        "process",
        "--kafka",
        &bootstrap,
        "--topic",
        "no-such-topic",
        "--store",
        &store,
    ];
    let error = common::run_err(d, &missing);
    assert!(
        error.contains("cannot read Kafka topic \"no-such-topic\"")
            && error.contains("not found: Kafka topic \"no-such-topic\""),
        "{error}"
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let unreachable = [
        "process", "--kafka", &closed, "--topic", "t", "--store", &store,
    ];
    let error = common::run_err(d, &unreachable);
    assert!(
        error.contains("transient failure") && error.contains(&closed),
        "{error}"
    );
}
