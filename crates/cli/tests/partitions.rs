//! Network partitions, for real: two hubs, three `tributary process` hosts and a replication
//! task, each in a network namespace of its own (`tributary_testkit::netns`), while a seeded
//! nemesis (`tributary_testkit::nemesis`) cuts, slows and drops the links between them. The
//! producer, in this process in the root namespace, keeps sending to hub A throughout and
//! records what A acknowledged; the hosts print every event they process (host, partition,
//! sequence number, body), timestamped here as it arrives. After each schedule heals:
//!
//! (a) no partition was processed by two hosts at once for longer than the window the
//!     processor's docs state (`crates/processor/src/handoff.rs`: a partition taken from a
//!     live owner starts only once that owner has noticed or its fence has passed; where the
//!     epoch closes the case instead, the overlap lasts until the hub's detach reaches the
//!     former owner) — here [`TIMESTAMP_SLACK`] plus the longest a message to a host could
//!     wait in the schedule's slow-link queues, plus [`RETRANSMISSION_ALLOWANCE`] where a
//!     link was lossy;
//! (b) no checkpoint moved backwards (the hosts' and the replication task's stores polled
//!     every [`POLL`]);
//! (c) every acknowledged event was processed at least once and replicated to hub B;
//! (d) within [`CONVERGENCE`] of the heal, every partition is owned by a live host and no lag
//!     is left (checkpoints at each partition's last event, on both groups).
//!
//! The hosts keep ownership and checkpoints in hub A itself (`hub:`, so a host cut from the hub
//! loses its store too), or, on every third seed, in one SQLite file they share (the file
//! system is not cut: a host cut from the hub keeps its leases). Seeds: 1, 2, 3, or
//! `TRIBUTARY_PARTITION_SEEDS` (`7`, `1,5,9` or `1..100`); `scripts/partition-scan` runs many.
//! A failure prints the seed and its schedule, which replays it; `TRIBUTARY_PARTITION_LOGS=DIR`
//! keeps each seed's process logs and every host's readings in DIR/seed-N. Needs root
//! (`ip netns`); a network that cannot be made fails the test.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{ServeGuard, lines_of, run_ok, shown_connection_string, tributary_via, wait_for_line};
use tributary_client::{EventData, HubCheckpointStore, ProducerClient, RemoteHub, SendTarget};
use tributary_processor::store::{CheckpointStore, StoreLocation};
use tributary_testkit::history::{Checkpoints, Processed, missing, overlaps, tenure_count};
use tributary_testkit::nemesis::Schedule;
use tributary_testkit::netns::Network;

const HUB: &str = "orders";
const PARTITIONS: u32 = 4;
const HOSTS: [&str; 3] = ["p0", "p1", "p2"];
const GROUP: &str = "$Default";
const REPLICATION_GROUP: &str = "replication";
/// The hosts' and the task's balancing interval and ownership expiration.
const INTERVAL: &str = "250ms";
const EXPIRATION: &str = "2500ms";
/// From the hosts' start to the nemesis's: the fleet settles.
const SETTLE: Duration = Duration::from_secs(2);
/// Faults start within this span; each lasts up to [`FAULT_MS_MAX`].
const SPAN: Duration = Duration::from_secs(9);
const FAULT_MS_MAX: u64 = 6_000;
/// Between two sends of the producer (one event, partitions in turn).
const SEND_EVERY: Duration = Duration::from_millis(20);
/// How often the stores' checkpoints are read.
const POLL: Duration = Duration::from_millis(100);
/// The fleet must have converged this long after the last heal at the latest: an expiration
/// and a hand-over wait (two at most), plus TCP's retransmission backoff after a long silent
/// cut and the AMQP reconnect.
const CONVERGENCE: Duration = Duration::from_secs(25);
/// Timestamps are taken here, as each host's output is read, on a shared machine.
const TIMESTAMP_SLACK: Duration = Duration::from_millis(250);
/// Three retransmission timeouts in a row (200 + 400 + 800 ms): a frame lost three times on a
/// lossy link, before the former owner hears of a takeover.
const RETRANSMISSION_ALLOWANCE: Duration = Duration::from_millis(1_400);
/// A host's records on a partition further apart than this are two tenures.
const TENURE_GAP_MAX: Duration = Duration::from_secs(1);

/// Children killed when dropped.
struct Children(Vec<ServeGuard>);

/// What one seed's run saw.
#[derive(Default)]
struct Seen {
    processed: Mutex<Vec<Processed>>,
    acknowledged: Mutex<BTreeSet<String>>,
    checkpoints: Mutex<Checkpoints>,
}

/// Hub A and B's connection strings, the task's store, the logs' directory.
/// (Fields drop in order: the children are killed before their namespaces go.)
struct Cluster {
    children: Children,
    network: Network,
    a: String,
    b: String,
    dir: tempfile::TempDir,
}

/// `cs` with its endpoint's host and port replaced by `ip:5672`.
fn at_address(cs: &str, ip: &str) -> String {
    cs.split(';')
        .map(|part| match part.strip_prefix("Endpoint=") {
            Some(_) => format!("Endpoint=sb://{ip}:5672/"),
            None => part.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(";")
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_tributary")
}

/// A hub in `node`'s namespace with the event hub and groups made: its connection string.
fn start_hub(cluster: &mut Cluster, node: &str) -> String {
    let data = cluster.dir.path().join(node);
    run_ok(
        &data,
        &[
            "hub",
            "create",
            HUB,
            "--partitions",
            &PARTITIONS.to_string(),
        ],
    );
    run_ok(&data, &["group", "create", HUB, REPLICATION_GROUP]);
    let launcher = cluster.network.command(node, bin());
    let args = ["serve", "--listen", "0.0.0.0", "--http-port", "0"];
    let mut child = tributary_via(launcher, &data, &args)
        .stdout(Stdio::piped())
        .stderr(log_file(cluster.dir.path(), node))
        .spawn()
        .expect("ip netns exec tributary serve");
    let stdout = lines_of(child.stdout.take().unwrap());
    cluster.children.0.push(ServeGuard::new(child));
    let banner = wait_for_line(&stdout, "press Ctrl-C", node);
    std::thread::spawn(move || for _ in stdout {});
    at_address(&shown_connection_string(&banner), &cluster.network.ip(node))
}

/// `name`'s log file in `dir`; with `TRIBUTARY_PARTITION_LOGS=DIR`, a copy of every log is
/// also kept in DIR/seed-N (see [`keep_logs`]).
fn log_file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::File::create(dir.join(format!("{name}.log"))).unwrap()
}

/// Copies the seed's logs to `TRIBUTARY_PARTITION_LOGS`/seed-N, if set, with `readings.txt`:
/// each host's readings of each partition (run time in ms, sequence number), a line each.
fn keep_logs(cluster: &Cluster, seed: u64, seen: &Seen, t0: Instant) {
    let Some(to) = std::env::var_os("TRIBUTARY_PARTITION_LOGS") else {
        return;
    };
    let to = Path::new(&to).join(format!("seed-{seed}"));
    std::fs::create_dir_all(&to).unwrap();
    for name in ["hub", "backup", "p0", "p1", "p2", "rep"] {
        let log = format!("{name}.log");
        let _ = std::fs::copy(cluster.dir.path().join(&log), to.join(log));
    }
    let mut readings = String::new();
    for p in seen.processed.lock().unwrap().iter() {
        let ms = (p.at - t0).as_millis();
        readings += &format!("{} {} {ms} {}\n", p.partition, p.host, p.sequence_number);
    }
    std::fs::write(to.join("readings.txt"), readings).unwrap();
}

/// A `tributary process` host printing what it processes; each line recorded in `seen`.
fn start_host(cluster: &mut Cluster, host: &str, store: Option<&Path>, seen: &Arc<Seen>) {
    let data = cluster.dir.path().join(host);
    let store = store.map_or("hub:".to_owned(), |path| {
        format!("sqlite:{}", path.display())
    });
    let args = [
        "process",
        HUB,
        "--connection-string",
        &cluster.a,
        "--action",
        "print",
        "--host-name",
        host,
        "--interval",
        INTERVAL,
        "--expiration",
        EXPIRATION,
        "--store",
        &store,
    ];
    let launcher = cluster.network.command(host, bin());
    let mut child: Child = tributary_via(launcher, &data, &args)
        .stdout(Stdio::piped())
        .stderr(log_file(cluster.dir.path(), host))
        .spawn()
        .expect("ip netns exec tributary process");
    let lines = lines_of(child.stdout.take().unwrap());
    cluster.children.0.push(ServeGuard::new(child));
    let (seen, host) = (Arc::clone(seen), host.to_owned());
    std::thread::spawn(move || {
        for line in lines {
            let at = Instant::now();
            let event: serde_json::Value = serde_json::from_str(&line).expect("a JSON event");
            seen.processed.lock().unwrap().push(Processed {
                host: host.clone(),
                partition: event["partition"].as_str().expect("partition").to_owned(),
                sequence_number: event["sequence_number"].as_i64().expect("sequence number"),
                body: event["body"].as_str().expect("a text body").to_owned(),
                at,
            });
        }
    });
}

/// The replication task A → B in the `rep` namespace: its checkpoint store's path.
fn start_replicator(cluster: &mut Cluster) -> PathBuf {
    let task = cluster.dir.path().join("copy.toml");
    std::fs::write(
        &task,
        format!(
            "name = \"copy\"\n[source]\nconnection_string = \"{}\"\nevent_hub = \"{HUB}\"\nconsumer_group = \"{REPLICATION_GROUP}\"\nbatch_events_max = 20\n[[target]]\nname = \"b\"\nconnection_string = \"{}\"\nevent_hub = \"{HUB}\"\nkeep_partition = true\n[retry]\nbackoff_min = \"50ms\"\nbackoff_max = \"1s\"\n[processor]\nload_balancing_interval = \"{INTERVAL}\"\nownership_expiration = \"{EXPIRATION}\"\n",
            cluster.a, cluster.b
        ),
    )
    .unwrap();
    let child = cluster
        .network
        .command("rep", bin())
        .args(["--log", "warn", "replicate"])
        .arg(&task)
        .args(["--host-name", "r0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_file(cluster.dir.path(), "rep"))
        .spawn()
        .expect("ip netns exec tributary replicate");
    cluster.children.0.push(ServeGuard::new(child));
    cluster.dir.path().join("copy.checkpoints.sqlite")
}

/// Sends one event at a time to the partitions in turn until `stop`, recording each body hub A
/// acknowledged.
async fn produce(a: String, seen: Arc<Seen>, stop: Arc<AtomicBool>, seed: u64) {
    let producer = ProducerClient::connect(&a, HUB).await.expect("producer");
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let body = format!("s{seed}-e{i}");
        let target = SendTarget::Partition((i % u64::from(PARTITIONS)).to_string());
        let event = [EventData::new(body.clone())];
        let sent = producer.send(&event, target);
        if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(5), sent).await {
            seen.acknowledged.lock().unwrap().insert(body);
        }
        i += 1;
        tokio::time::sleep(SEND_EVERY).await;
    }
}

/// The stores a poller reads: (consumer group, store, namespace the records are under).
type Stores = Vec<(&'static str, Arc<dyn CheckpointStore>, String)>;

/// Reads every store's checkpoints each [`POLL`] until `stop`.
async fn poll_checkpoints(stores: Stores, seen: Arc<Seen>, stop: Arc<AtomicBool>, t0: Instant) {
    while !stop.load(Ordering::Relaxed) {
        for (group, store, namespace) in &stores {
            if let Ok(list) = store.list_checkpoints(namespace, HUB, group).await {
                let mut checkpoints = seen.checkpoints.lock().unwrap();
                for c in list {
                    if let Some(seq) = c.sequence_number {
                        checkpoints.saw(group, &c.partition_id, seq, t0.elapsed());
                    }
                }
            }
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The seeds to run: `TRIBUTARY_PARTITION_SEEDS` (`7`, `1,5,9`, `1..100`), else 1, 2, 3.
fn seeds() -> Vec<u64> {
    let Ok(text) = std::env::var("TRIBUTARY_PARTITION_SEEDS") else {
        return vec![1, 2, 3];
    };
    if let Some((from, to)) = text.split_once("..") {
        return (from.trim().parse().unwrap()..to.trim().parse().unwrap()).collect();
    }
    text.split(',')
        .map(|s| s.trim().parse().expect("a seed"))
        .collect()
}

/// What a clean schedule checked.
#[derive(Debug, Default, Clone, Copy)]
struct Figures {
    schedules: usize,
    acknowledged: usize,
    processings: usize,
    /// Partition readings started beyond one per partition and host: hand-overs and
    /// reconnects the nemesis caused.
    restarts: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_under_a_seeded_nemesis_keeps_its_guarantees() {
    let mut totals = Figures::default();
    for seed in seeds() {
        let started = Instant::now();
        let figures = one_schedule(seed).await;
        totals.schedules += figures.schedules;
        totals.acknowledged += figures.acknowledged;
        totals.processings += figures.processings;
        totals.restarts += figures.restarts;
        eprintln!("seed {seed} clean in {:?}", started.elapsed());
    }
    eprintln!(
        "partition scan: {} schedules, {} acknowledged events checked ({} processings, {} \
         partition readings restarted), violations: 0",
        totals.schedules, totals.acknowledged, totals.processings, totals.restarts
    );
    // A nemesis that changes nothing would pass every check: the faults must have moved
    // partitions or broken connections.
    assert!(totals.restarts > 0, "no partition reading ever restarted");
}

/// The pairs the nemesis may fault: each host and the task with hub A, the task with hub B.
fn faulty_pairs() -> Vec<(&'static str, &'static str)> {
    let mut pairs: Vec<_> = HOSTS.iter().map(|h| ("hub", *h)).collect();
    pairs.extend([("hub", "rep"), ("rep", "backup")]);
    pairs
}

/// Runs seed's schedule and checks it.
async fn one_schedule(seed: u64) -> Figures {
    let mut cluster = start_hubs();
    let seen = Arc::new(Seen::default());
    let sqlite = seed
        .is_multiple_of(3)
        .then(|| cluster.dir.path().join("fleet.sqlite"));
    let isolatable = ["p0", "p1", "p2", "rep"];
    let schedule = Schedule::generate(seed, &faulty_pairs(), &isolatable, SPAN, FAULT_MS_MAX);
    let replay = format!(
        "store: {}; the nemesis starts {} ms into the run (the checks' times are the run's)\n\
         {schedule}",
        if sqlite.is_some() { "sqlite" } else { "hub:" },
        SETTLE.as_millis()
    );
    eprintln!("{replay}");
    let t0 = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let (a, to_seen, to_stop) = (cluster.a.clone(), Arc::clone(&seen), Arc::clone(&stop));
    let producer = tokio::spawn(produce(a, to_seen, to_stop, seed));
    for host in HOSTS {
        start_host(&mut cluster, host, sqlite.as_deref(), &seen);
    }
    let task_store = start_replicator(&mut cluster);
    let stores = stores(&cluster, sqlite.as_deref(), &task_store).await;
    let stop_polling = Arc::new(AtomicBool::new(false));
    let (to_seen, to_stop) = (Arc::clone(&seen), Arc::clone(&stop_polling));
    let poller = tokio::spawn(poll_checkpoints(stores.clone(), to_seen, to_stop, t0));
    tokio::time::sleep_until((t0 + SETTLE).into()).await;
    // Blocking this worker for the schedule: the producer and the poller go on on the other.
    let nemesis = tokio::task::block_in_place(|| schedule.run(&cluster.network));
    let healed = Instant::now();
    nemesis.unwrap_or_else(|e| panic!("the nemesis failed: {e}\n{replay}"));
    stop.store(true, Ordering::Relaxed);
    producer.await.unwrap();
    let converged = converge(&cluster, &stores, &seen, healed).await;
    keep_logs(&cluster, seed, &seen, t0);
    let converged = converged.unwrap_or_else(|why| panic!("{why}\n{replay}\n{}", logs(&cluster)));
    stop_polling.store(true, Ordering::Relaxed);
    poller.await.unwrap();
    let figures = check(&cluster, &seen, &schedule, t0, &replay);
    eprintln!(
        "seed {seed}: {} acknowledged, {} processings, {} readings restarted, converged \
         {converged:?} after the heal",
        figures.acknowledged, figures.processings, figures.restarts
    );
    figures
}

/// The network, hub A and hub B (nothing else started yet).
fn start_hubs() -> Cluster {
    let nodes = ["hub", "backup", "p0", "p1", "p2", "rep"];
    let network = Network::create(&nodes).unwrap_or_else(|e| {
        panic!("cannot make the test network (run as root, with `ip` and `tc`): {e}")
    });
    let mut cluster = Cluster {
        children: Children(Vec::new()),
        network,
        a: String::new(),
        b: String::new(),
        dir: tempfile::tempdir().unwrap(),
    };
    cluster.a = start_hub(&mut cluster, "hub");
    cluster.b = start_hub(&mut cluster, "backup");
    cluster
}

/// The stores to poll: the hosts' (`hub:` over AMQP from here, or their SQLite file) and the
/// task's SQLite file, each under the namespace its records are kept by (hub A's address).
async fn stores(cluster: &Cluster, sqlite: Option<&Path>, task_store: &Path) -> Stores {
    let namespace = cluster.network.ip("hub");
    let hosts: Arc<dyn CheckpointStore> = match sqlite {
        Some(path) => open_sqlite(path).await,
        None => {
            let remote = RemoteHub::connect(&cluster.a, HUB).await.expect("hub A");
            Arc::new(HubCheckpointStore::new(remote.consumer()))
        }
    };
    let task = open_sqlite(task_store).await;
    vec![
        (GROUP, hosts, namespace.clone()),
        (REPLICATION_GROUP, task, namespace),
    ]
}

/// Opens a SQLite store once some process has created it.
async fn open_sqlite(path: &Path) -> Arc<dyn CheckpointStore> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never created",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let location = StoreLocation::parse(&format!("sqlite:{}", path.display())).unwrap();
    location.open().await.expect("the SQLite store")
}

/// Waits until the fleet has converged (see the module docs, (d)); how long after the heal.
async fn converge(
    cluster: &Cluster,
    stores: &Stores,
    seen: &Seen,
    healed: Instant,
) -> Result<Duration, String> {
    let producer = ProducerClient::connect(&cluster.a, HUB)
        .await
        .expect("producer");
    let namespace = cluster.network.ip("hub");
    loop {
        let why = match not_converged(cluster, stores, seen, &producer, &namespace).await {
            None => return Ok(healed.elapsed()),
            Some(why) => why,
        };
        if healed.elapsed() > CONVERGENCE {
            return Err(format!(
                "not converged {CONVERGENCE:?} after the heal: {why}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Why the fleet has not converged yet, if it has not.
async fn not_converged(
    cluster: &Cluster,
    stores: &Stores,
    seen: &Seen,
    producer: &ProducerClient,
    namespace: &str,
) -> Option<String> {
    let owners = match stores[0].1.list_ownership(namespace, HUB, GROUP).await {
        Ok(list) => list,
        Err(e) => return Some(format!("cannot list ownership: {e}")),
    };
    let owned: BTreeMap<String, String> = owners
        .into_iter()
        .map(|o| (o.partition_id, o.owner_id))
        .collect();
    if owned.len() != PARTITIONS as usize || owned.values().any(|o| !HOSTS.contains(&o.as_str())) {
        return Some(format!("owners {owned:?}"));
    }
    for partition in 0..PARTITIONS {
        let p = partition.to_string();
        let last = match producer.partition_properties(&p).await {
            Ok(props) => props.last_enqueued_sequence_number,
            Err(e) => return Some(format!("partition {p}: {e}")),
        };
        for (group, ..) in stores {
            let at = seen.checkpoints.lock().unwrap().latest(group, &p);
            if at != Some(last) {
                return Some(format!(
                    "{group} partition {p}: checkpoint {at:?}, last event {last}"
                ));
            }
        }
    }
    let replicated = replicated(cluster);
    let lost = missing(
        &seen.acknowledged.lock().unwrap(),
        replicated.iter().map(String::as_str),
    );
    (!lost.is_empty()).then(|| format!("{} acknowledged events not on hub B yet", lost.len()))
}

/// The bodies hub B holds.
fn replicated(cluster: &Cluster) -> Vec<String> {
    let data = cluster.dir.path().join("reader");
    let out = run_ok(
        &data,
        &[
            "receive",
            HUB,
            "--connection-string",
            &cluster.b,
            "--from",
            "earliest",
            "--format",
            "json",
        ],
    );
    out.lines()
        .map(|line| {
            let event: serde_json::Value = serde_json::from_str(line).expect("a JSON event");
            event["body"].as_str().expect("a text body").to_owned()
        })
        .collect()
}

/// Checks (a)–(c) of the module docs, panicking with the replay text.
fn check(
    cluster: &Cluster,
    seen: &Seen,
    schedule: &Schedule,
    t0: Instant,
    replay: &str,
) -> Figures {
    let processed = seen.processed.lock().unwrap().clone();
    let acknowledged = seen.acknowledged.lock().unwrap().clone();
    let checkpoints = seen.checkpoints.lock().unwrap();
    let window = HOSTS
        .iter()
        .map(|host| {
            let loss = schedule.has_loss("hub", host);
            schedule.queue_delay_max("hub", host)
                + if loss {
                    RETRANSMISSION_ALLOWANCE
                } else {
                    Duration::ZERO
                }
        })
        .max()
        .unwrap_or_default()
        + TIMESTAMP_SLACK;
    let doubly = overlaps(&processed, t0, TENURE_GAP_MAX, window);
    let unprocessed = missing(&acknowledged, processed.iter().map(|p| p.body.as_str()));
    let mut violations = Vec::new();
    for overlap in &doubly {
        violations.push(format!(
            "processed by two hosts at once beyond {window:?}: {overlap:?}"
        ));
    }
    for backwards in &checkpoints.backwards {
        violations.push(format!("checkpoint moved backwards: {backwards}"));
    }
    if !unprocessed.is_empty() {
        violations.push(format!(
            "{} acknowledged events never processed: {:?}",
            unprocessed.len(),
            &unprocessed[..unprocessed.len().min(10)]
        ));
    }
    for group in [GROUP, REPLICATION_GROUP] {
        for p in 0..PARTITIONS {
            if checkpoints.latest(group, &p.to_string()).is_none() {
                violations.push(format!(
                    "no checkpoint of {group} on partition {p} was ever seen"
                ));
            }
        }
    }
    assert!(
        acknowledged.len() > 100,
        "the producer got too few acknowledgements: {}\n{replay}",
        acknowledged.len()
    );
    assert!(
        violations.is_empty(),
        "{}\n{replay}\n{}",
        violations.join("\n"),
        logs(cluster)
    );
    // Each host's first reading of each partition is no restart.
    let firsts: BTreeSet<(&str, &str)> = processed
        .iter()
        .map(|p| (p.host.as_str(), p.partition.as_str()))
        .collect();
    Figures {
        schedules: 1,
        acknowledged: acknowledged.len(),
        processings: processed.len(),
        restarts: tenure_count(&processed, TENURE_GAP_MAX) - firsts.len(),
    }
}

/// The last lines of every process's log.
fn logs(cluster: &Cluster) -> String {
    let mut said = String::new();
    for name in ["hub", "backup", "p0", "p1", "p2", "rep"] {
        let text = std::fs::read_to_string(cluster.dir.path().join(format!("{name}.log")))
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(15)..];
        said += &format!(
            "--- {name} (last {} lines):\n{}\n",
            tail.len(),
            tail.join("\n")
        );
    }
    said
}
