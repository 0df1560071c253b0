//! The crash soak (issue 18): a `tributary serve` killed with SIGKILL at random moments while
//! producers write to it and a processor fleet reads from it, restarted on the same data
//! directory and ports after every kill.
//!
//! Producers: the official Python SDK (`tests/soak/producer.py`, run by the `.venv` of
//! `scripts/setup-python-interop`) and the Rust client, each sending batches of 1–5 events under
//! random partition keys, one batch at a time, with no retries of their own. Each appends every
//! batch's outcome to a record file (fsynced before its next batch): acknowledged or failed. A
//! processor fleet (`tributary process` children sharing a SQLite checkpoint store) processes
//! the hub meanwhile; a watcher reads the store's checkpoints every 100 ms.
//!
//! Checked after every restart, on what is new since the last check (records read before the
//! log, so an acknowledgement recorded by then is for events the log must hold): every
//! acknowledged batch whole in the log, no failed batch partly stored, each key's events in one
//! partition, sequence numbers dense from 0 in every partition, the last event read before
//! still there unchanged. At the end, on everything: the whole log read again from the start is
//! what was read piece by piece; every acknowledged event is in it exactly once (but for the
//! whole batches the Python SDK itself sends a second time after a connection error, counted
//! apart: see [`RESENDING_PRODUCER`]); the acknowledged events of one producer and key are in
//! their order; every failed batch is stored whole or not at all; no event is there that no
//! producer recorded. The fleet's checkpoints never move backwards, and after the last restart
//! it processes every event in the log (at least once).
//!
//! `cargo test -p tributary-cli --test soak` runs a short soak (5 kill cycles); `scripts/soak`
//! a long one. Environment: `TRIBUTARY_SOAK_SECONDS` (keep killing for this long instead of 5
//! cycles), `TRIBUTARY_SOAK_CYCLES` (this many cycles), `TRIBUTARY_SOAK_SEED` (the seed of the
//! kill moments and the producers' choices, printed in the summary, to replay a run),
//! `TRIBUTARY_SOAK_REPORT` (also write the summary to this file). The kill moments are
//! replayable; what the processes were doing at those moments is up to the scheduler.

// Only `tributary` of the shared helpers is used here.
mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, BufReader};
use tributary_client::{ClientOptions, ConsumerClient, ProducerClient, SendTarget};
use tributary_event::{EventData, EventPosition, PropertyValue, SmolStr};
use tributary_processor::SqliteCheckpointStore;
use tributary_processor::store::CheckpointStore;

const HUB: &str = "soak";
const PARTITIONS: usize = 4;
/// The consumer group the checker reads with (the fleet's epoch receivers hold `$Default`).
const CHECK_GROUP: &str = "soak-check";
/// The namespace the fleet records its checkpoints under.
const NAMESPACE: &str = "soak";
const KEYS: [&str; 8] = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];
const BATCH_MAX: u64 = 5;
/// The producers' names (their events' bodies begin with them).
const PYTHON_PRODUCER: &str = "py";
const RUST_PRODUCER: &str = "rs";
const FLEET: usize = 2;
/// How long the server runs between a restart and the next kill: uniform in this range.
const UP_MS: std::ops::Range<u64> = 800..3_000;

/// What the environment asks of this run.
#[derive(Debug)]
struct Settings {
    cycles: Option<u64>,
    seconds: Option<u64>,
    seed: u64,
    report: Option<PathBuf>,
}

impl Settings {
    fn from_env() -> Settings {
        let number = |name: &str| {
            std::env::var(name).ok().map(|v| {
                v.parse::<u64>()
                    .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number"))
            })
        };
        let seconds = number("TRIBUTARY_SOAK_SECONDS");
        let cycles =
            number("TRIBUTARY_SOAK_CYCLES").or(if seconds.is_none() { Some(5) } else { None });
        let seed = number("TRIBUTARY_SOAK_SEED").unwrap_or_else(|| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            now.as_secs() ^ u64::from(now.subsec_nanos())
        });
        let report = std::env::var_os("TRIBUTARY_SOAK_REPORT").map(PathBuf::from);
        Settings {
            cycles,
            seconds,
            seed,
            report,
        }
    }

    /// Whether another kill cycle is due after `done` cycles since `started`.
    fn more(&self, done: u64, started: Instant) -> bool {
        self.cycles.is_none_or(|c| done < c)
            && self
                .seconds
                .is_none_or(|s| started.elapsed() < Duration::from_secs(s))
    }
}

/// A free port on 127.0.0.1 (the server binds it again at every restart).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A running `tributary serve` on fixed ports.
struct Server {
    child: tokio::process::Child,
}

impl Server {
    /// Starts `serve` on `data`; returns it and what it printed up to "press Ctrl-C". While a
    /// port is taken (for a moment a client's outgoing connection may hold the number the
    /// server listened on), tries again, for 30 s at most.
    async fn start(data: &Path, amqp: u16, http: u16) -> (Server, String) {
        let mut tries = 0;
        loop {
            match Server::start_once(data, amqp, http).await {
                Ok(started) => return started,
                Err(said) if said.contains(" in use") && tries < 300 => tries += 1,
                Err(said) => panic!("serve exited while starting: {said}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One start; what it printed when it exited before its banner was out.
    async fn start_once(data: &Path, amqp: u16, http: u16) -> Result<(Server, String), String> {
        let (amqp, http) = (amqp.to_string(), http.to_string());
        let args = [
            "serve",
            "--hub",
            HUB,
            "--partitions",
            "4",
            "--amqp-port",
            &amqp,
            "--http-port",
            &http,
        ];
        let mut cmd = tokio::process::Command::from(common::tributary(data, &args));
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("tributary serve starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut errors = child.stderr.take().unwrap();
        let mut banner = String::new();
        while !banner.contains("press Ctrl-C") {
            let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("serve printed no banner in 60 s: {banner}"))
                .unwrap();
            let Some(line) = line else {
                // It exited before its banner was out: why is on stderr.
                let mut said = String::new();
                let _ = tokio::io::AsyncReadExt::read_to_string(&mut errors, &mut said).await;
                let _ = child.wait().await;
                return Err(format!("{banner}{said}"));
            };
            banner.push_str(&line);
            banner.push('\n');
        }
        // Keep draining both so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut errors, &mut tokio::io::sink()).await;
        });
        Ok((Server { child }, banner))
    }

    /// SIGKILL, and wait for it to be gone.
    async fn kill(mut self) {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
    }
}

/// One batch's outcome, as a producer recorded it.
#[derive(Debug, Clone)]
struct Batch {
    /// The producer.
    p: String,
    /// The first event's sequence number in the producer's numbering.
    s: u64,
    /// How many events.
    n: u64,
    /// The partition key.
    k: String,
    /// Acknowledged by the hub.
    ok: bool,
}

impl Batch {
    /// A record line: `{"p": …, "s": …, "n": …, "k": …, "ok": …}`.
    fn parse(line: &str) -> Option<Batch> {
        let doc: serde_json::Value = serde_json::from_str(line).ok()?;
        Some(Batch {
            p: doc["p"].as_str()?.to_owned(),
            s: doc["s"].as_u64()?,
            n: doc["n"].as_u64()?,
            k: doc["k"].as_str()?.to_owned(),
            ok: doc["ok"].as_bool()?,
        })
    }
}

/// The record files (`*.records`) read so far: every complete line, each file read on from
/// where the last read stopped.
#[derive(Debug, Default)]
struct Records {
    read: HashMap<PathBuf, u64>,
    batches: Vec<Batch>,
}

impl Records {
    /// Reads what the record files in `dir` gained since the last call.
    fn refresh(&mut self, dir: &Path) -> &[Batch] {
        use std::io::{Read, Seek};
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "records") {
                continue;
            }
            let read = self.read.entry(path.clone()).or_default();
            let mut file = std::fs::File::open(&path).unwrap();
            file.seek(std::io::SeekFrom::Start(*read)).unwrap();
            let mut text = String::new();
            file.read_to_string(&mut text).unwrap();
            // A line still being written has no newline yet.
            let Some(end) = text.rfind('\n') else {
                continue;
            };
            for line in text[..end].lines() {
                let batch = Batch::parse(line)
                    .unwrap_or_else(|| panic!("{}: bad record {line:?}", path.display()));
                self.batches.push(batch);
            }
            *read += end as u64 + 1;
        }
        &self.batches
    }
}

/// Appends one record and syncs it to disk before the producer goes on.
fn write_record(out: &mut std::fs::File, batch: &Batch) {
    let line =
        serde_json::json!({"p": batch.p, "s": batch.s, "n": batch.n, "k": batch.k, "ok": batch.ok});
    writeln!(out, "{line}").unwrap();
    out.sync_data().unwrap();
}

/// A producer's batches, by outcome.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Sent {
    acknowledged: u64,
    failed: u64,
}

/// The Rust client's producer: the same protocol as `producer.py`, until `stop`.
async fn rust_producer(
    cs: String,
    name: String,
    seed: u64,
    record: PathBuf,
    stop: Arc<AtomicBool>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = std::fs::File::create(record).unwrap();
    let mut producer: Option<ProducerClient> = None;
    let mut sequence = 0;
    while !stop.load(Ordering::Relaxed) {
        let key = KEYS[rng.gen_range(0..KEYS.len())];
        let n = rng.gen_range(1..=BATCH_MAX);
        let events: Vec<EventData> = (sequence..sequence + n)
            .map(|s| {
                EventData::new(format!("{name}/{s}/{key}"))
                    .with_property(
                        PRODUCER_PROPERTY,
                        PropertyValue::String(name.as_str().into()),
                    )
                    .with_property(KEY_PROPERTY, PropertyValue::String(key.into()))
            })
            .collect();
        let ok = send_once(&mut producer, &cs, &events, key).await;
        let batch = Batch {
            p: name.clone(),
            s: sequence,
            n,
            k: key.to_owned(),
            ok,
        };
        write_record(&mut out, &batch);
        sequence += n;
        if !ok {
            if let Some(p) = producer.take() {
                p.close().await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    if let Some(p) = producer.take() {
        p.close().await;
    }
}

/// One send, connecting first when there is no client; whether the hub acknowledged it.
async fn send_once(
    producer: &mut Option<ProducerClient>,
    cs: &str,
    events: &[EventData],
    key: &str,
) -> bool {
    if producer.is_none() {
        let options = ClientOptions::default().with_operation_timeout(Duration::from_secs(10));
        match ProducerClient::connect_with_options(cs, Some(HUB), options).await {
            Ok(p) => *producer = Some(p),
            Err(_) => return false,
        }
    }
    let target = SendTarget::PartitionKey(key.to_owned());
    producer
        .as_ref()
        .expect("connected above")
        .send(events, target)
        .await
        .is_ok()
}

/// The Python SDK's producer (`tests/soak/producer.py`), running until `stop` exists.
fn python_producer(cs: &str, name: &str, seed: u64, dir: &Path) -> tokio::process::Child {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/soak/producer.py");
    let args = serde_json::json!({
        "conn": cs, "hub": HUB, "name": name, "keys": KEYS, "seed": seed,
        "batch_max": BATCH_MAX,
        "record": dir.join(format!("{name}.records")),
        "stop": dir.join("stop"),
    });
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    tokio::process::Command::new(tributary_testkit::python())
        .arg(script)
        .arg(args.to_string())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("the Python producer starts")
}

/// The log as the checker has read it so far: each partition's event bodies, indexed by
/// sequence number (dense from 0, or the read stopped with a violation).
#[derive(Debug, Default)]
struct Log {
    partitions: Vec<Vec<String>>,
}

impl Log {
    /// Reads what each partition holds beyond what was read before, re-reading the last event
    /// read to see it unchanged; violations (a gap, a changed or vanished event) in `found`.
    async fn read_new(&mut self, consumer: &ConsumerClient, found: &mut Vec<String>) {
        self.partitions.resize_with(PARTITIONS, Vec::new);
        for (p, events) in self.partitions.iter_mut().enumerate() {
            let id = p.to_string();
            let props = consumer.partition_properties(&id).await.unwrap();
            let known = i64::try_from(events.len()).unwrap();
            if props.beginning_sequence_number != 0 && !props.is_empty {
                found.push(format!(
                    "partition {p} begins at {}",
                    props.beginning_sequence_number
                ));
            }
            if props.last_enqueued_sequence_number < known - 1 {
                found.push(format!(
                    "partition {p} shrank: {known} events were read, its last is now {}",
                    props.last_enqueued_sequence_number
                ));
                continue;
            }
            if props.last_enqueued_sequence_number == known - 1 {
                continue; // Nothing new; the last event read is re-read when there is.
            }
            let start = if known == 0 {
                EventPosition::Earliest
            } else {
                EventPosition::SequenceNumber {
                    sequence_number: known - 1,
                    inclusive: true,
                }
            };
            let last = props.last_enqueued_sequence_number;
            read_partition(consumer, &id, start, last, events, found).await;
        }
    }

    /// Every body with its partition, in log order.
    fn events(&self) -> impl Iterator<Item = (usize, &str)> {
        self.partitions
            .iter()
            .enumerate()
            .flat_map(|(p, events)| events.iter().map(move |b| (p, b.as_str())))
    }

    fn len(&self) -> usize {
        self.partitions.iter().map(Vec::len).sum()
    }
}

/// The application properties every producer's event carries: its producer and key, as its
/// body says them. Every event of a batch repeats them, so the log writes them once per batch
/// and reads them back by reference to the record before: the soak checks that under SIGKILL.
const PRODUCER_PROPERTY: &str = "producer";
const KEY_PROPERTY: &str = "key";

/// Why an event's properties do not say what its body says (`None` when they do).
fn properties_disagree(body: &str, properties: &[(SmolStr, PropertyValue)]) -> Option<String> {
    let mut parts = body.splitn(3, '/');
    let (producer, key) = (parts.next()?, parts.nth(1)?);
    let text = |name: &str| {
        properties.iter().find_map(|(k, v)| match v {
            PropertyValue::String(v) if k == name => Some(v.as_str()),
            _ => None,
        })
    };
    let expected = [(PRODUCER_PROPERTY, producer), (KEY_PROPERTY, key)];
    (properties.len() != expected.len()
        || expected
            .iter()
            .any(|(name, value)| text(name) != Some(*value)))
    .then(|| format!("{body:?} carries the properties {properties:?}"))
}

/// Reads partition `id` from `start` through sequence number `last` into `events`.
async fn read_partition(
    consumer: &ConsumerClient,
    id: &str,
    start: EventPosition,
    last: i64,
    events: &mut Vec<String>,
    found: &mut Vec<String>,
) {
    let mut receiver = consumer
        .open_receiver(id, CHECK_GROUP, start, None, 1000)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut next = i64::try_from(events.len()).unwrap().max(1) - 1;
    let mut first = !events.is_empty();
    while next <= last {
        assert!(
            Instant::now() < deadline,
            "partition {id}: sequence numbers {next}..={last} not delivered in 60 s"
        );
        for event in receiver
            .receive(1000, Duration::from_secs(1))
            .await
            .unwrap()
        {
            let body = String::from_utf8_lossy(&event.data.body).into_owned();
            if let Some(problem) = properties_disagree(&body, &event.data.properties) {
                found.push(format!(
                    "partition {id}: event {}: {problem}",
                    event.sequence_number
                ));
            }
            if first {
                first = false;
                let before = events.last().expect("re-read only after one was read");
                if event.sequence_number != next || &body != before {
                    found.push(format!(
                        "partition {id}: event {next} was {before:?}, now {} is {body:?}",
                        event.sequence_number
                    ));
                }
                next += 1;
                continue;
            }
            if event.sequence_number != next {
                found.push(format!(
                    "partition {id}: sequence number {} after {}",
                    event.sequence_number,
                    next - 1
                ));
                receiver.close().await;
                return;
            }
            events.push(body);
            next += 1;
        }
    }
    receiver.close().await;
}

/// What the checker counted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Findings {
    /// Events in acknowledged batches.
    acknowledged: u64,
    /// Acknowledged events missing from the log.
    lost: u64,
    /// Extra copies of events in the log, but for [`RESENDING_PRODUCER`]'s whole batches.
    duplicated: u64,
    /// Events of [`RESENDING_PRODUCER`]'s batches stored twice, whole.
    resent: u64,
    /// Acknowledged events found before an earlier acknowledged event of their producer and key.
    reordered: u64,
    /// Events of one producer and key in another partition than the key's first.
    misrouted: u64,
    /// Failed batches: stored whole, not stored at all, partly stored.
    failed_whole: u64,
    failed_absent: u64,
    partly_stored: u64,
    /// Events in the log that no record accounts for (only counted at the end).
    unaccounted: u64,
    /// The first few violations, spelled out.
    examples: Vec<String>,
    /// Each producer's batches.
    sent: BTreeMap<String, Sent>,
}

impl Findings {
    fn example(&mut self, what: impl FnOnce() -> String) {
        if self.examples.len() < 20 {
            self.examples.push(what());
        }
    }
}

/// The producer whose re-sends are expected: the official Python SDK's `send_batch` sends a
/// batch once more, on a new connection, when the first attempt fails with a connection error
/// (`azure/eventhub/_producer_client.py`: `except (KeyError, AttributeError, EventHubError)`
/// rebuilds the producer and sends again, whatever `retry_total` says). A batch stored just
/// before a kill and not yet acknowledged is then stored twice and acknowledged once.
const RESENDING_PRODUCER: &str = PYTHON_PRODUCER;

/// Compares the log with the records. `all_recorded`: every batch sent has its record (the
/// producers stopped), so an event no record accounts for is a violation.
fn analyse(log: &Log, batches: &[Batch], all_recorded: bool) -> Findings {
    let mut outcome = HashMap::<(&str, u64), bool>::new();
    for b in batches {
        for s in b.s..b.s + b.n {
            outcome.insert((b.p.as_str(), s), b.ok);
        }
    }
    let mut f = Findings::default();
    let copies = scan_log(log, &outcome, all_recorded, &mut f);
    for b in batches {
        let counts: Vec<u64> = (b.s..b.s + b.n)
            .map(|s| copies.get(&(b.p.as_str(), s)).copied().unwrap_or(0))
            .collect();
        let present = counts.iter().filter(|c| **c > 0).count() as u64;
        let sent = f.sent.entry(b.p.clone()).or_default();
        if b.ok {
            sent.acknowledged += 1;
        } else {
            sent.failed += 1;
        }
        if counts.iter().any(|c| *c > 1) {
            if b.p == RESENDING_PRODUCER && counts.iter().all(|c| *c == 2) {
                f.resent += b.n;
            } else {
                f.duplicated += counts.iter().map(|c| c.saturating_sub(1)).sum::<u64>();
                f.example(|| format!("{b:?} stored {counts:?} times"));
            }
        }
        if b.ok {
            f.acknowledged += b.n;
            f.lost += b.n - present;
            if present < b.n {
                f.example(|| format!("acknowledged {b:?}: {present} events in the log"));
            }
        } else if present == 0 {
            f.failed_absent += 1;
        } else if present == b.n {
            f.failed_whole += 1;
        } else {
            f.partly_stored += 1;
            f.example(|| format!("failed {b:?}: {present} events in the log"));
        }
    }
    f
}

/// Goes through the log once: how many copies of each event it holds; the order of each
/// producer's acknowledged events per key (first copies only) and each key's partition go into
/// `f`, and so do events no record accounts for, when `all_recorded`.
fn scan_log<'a>(
    log: &'a Log,
    outcome: &HashMap<(&str, u64), bool>,
    all_recorded: bool,
    f: &mut Findings,
) -> HashMap<(&'a str, u64), u64> {
    let mut copies = HashMap::<(&str, u64), u64>::new();
    let mut last_acknowledged = HashMap::<(&str, &str), u64>::new();
    let mut home = HashMap::<&str, usize>::new();
    for (partition, body) in log.events() {
        let mut parts = body.splitn(3, '/');
        let (Some(p), Some(Ok(s)), Some(k)) = (
            parts.next(),
            parts.next().map(str::parse::<u64>),
            parts.next(),
        ) else {
            f.unaccounted += 1;
            f.example(|| format!("{body:?} is no producer's event"));
            continue;
        };
        let n = copies.entry((p, s)).or_default();
        *n += 1;
        if *home.entry(k).or_insert(partition) != partition {
            f.misrouted += 1;
            f.example(|| format!("{body} in partition {partition}"));
        }
        match outcome.get(&(p, s)) {
            Some(true) if *n == 1 => {
                let last = last_acknowledged.entry((p, k)).or_insert(s);
                if s < *last {
                    f.reordered += 1;
                    f.example(|| format!("{body} after {p}/{last}"));
                }
                *last = s.max(*last);
            }
            Some(_) => {}
            None if all_recorded && *n == 1 => {
                f.unaccounted += 1;
                f.example(|| format!("{body}: no record"));
            }
            None => {}
        }
    }
    copies
}

impl Findings {
    /// Whether anything the soak guarantees was broken.
    fn violated(&self) -> bool {
        self.lost
            + self.duplicated
            + self.reordered
            + self.misrouted
            + self.partly_stored
            + self.unaccounted
            > 0
    }
}

/// The processor fleet: `tributary process` children sharing a SQLite checkpoint store,
/// writing what they process to `<out>/<partition>.events`.
struct Fleet {
    dir: PathBuf,
    cs: String,
    instances: Vec<tokio::process::Child>,
    /// Instances that exited on their own and were started again.
    restarts: u64,
}

impl Fleet {
    fn start(dir: &Path, cs: &str) -> Fleet {
        let mut fleet = Fleet {
            dir: dir.to_owned(),
            cs: cs.to_owned(),
            instances: Vec::new(),
            restarts: 0,
        };
        for i in 0..FLEET {
            let child = fleet.spawn(i);
            fleet.instances.push(child);
        }
        fleet
    }

    fn store(&self) -> PathBuf {
        self.dir.join("checkpoints.sqlite")
    }

    fn out(&self) -> PathBuf {
        self.dir.join("out")
    }

    fn spawn(&self, i: usize) -> tokio::process::Child {
        let (store, out) = (self.store(), self.out());
        let args = [
            "process",
            HUB,
            "--connection-string",
            &self.cs,
            "--store",
            store.to_str().unwrap(),
            "--namespace",
            NAMESPACE,
            "--action",
            "file",
            "--output-dir",
            out.to_str().unwrap(),
            "--host-name",
            &format!("p{i}"),
        ];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("p{i}.log")))
            .unwrap();
        let client = self.dir.join("client"); // the hub's directory is the server's alone
        tokio::process::Command::from(common::tributary(&client, &args))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("tributary process starts")
    }

    /// Starts again every instance that exited (as a service manager would).
    fn revive(&mut self) {
        for i in 0..self.instances.len() {
            if self.instances[i].try_wait().unwrap().is_some() {
                self.instances[i] = self.spawn(i);
                self.restarts += 1;
            }
        }
    }

    /// Every line the fleet wrote: body → how many times it was processed.
    fn processed(&self) -> HashMap<String, u64> {
        let mut seen = HashMap::new();
        let Ok(entries) = std::fs::read_dir(self.out()) else {
            return seen;
        };
        for entry in entries {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            let complete = text.rfind('\n').map_or("", |end| &text[..end]);
            for line in complete.lines() {
                *seen.entry(line.to_owned()).or_default() += 1;
            }
        }
        seen
    }

    /// SIGTERM each instance (they release their partitions and checkpoint) and wait.
    async fn stop(mut self) {
        for child in &self.instances {
            if let Some(pid) = child.id() {
                let _ = std::process::Command::new("kill")
                    .arg(pid.to_string())
                    .status();
            }
        }
        for child in &mut self.instances {
            let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
        }
    }
}

/// What the checkpoint watcher saw: how often it read the store, the highest checkpoint of
/// each partition, and every time one moved backwards.
#[derive(Debug, Default)]
struct Checkpoints {
    reads: u64,
    highest: BTreeMap<String, i64>,
    backwards: Vec<String>,
}

/// Reads the fleet's checkpoints every 100 ms until `stop`.
async fn watch_checkpoints(store: PathBuf, seen: Arc<Mutex<Checkpoints>>, stop: Arc<AtomicBool>) {
    let mut opened = None;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if opened.is_none() && store.exists() {
            opened = SqliteCheckpointStore::open(&store).await.ok();
        }
        let Some(s) = &opened else { continue };
        let Ok(list) = s.list_checkpoints(NAMESPACE, HUB, "$Default").await else {
            continue; // Busy: a processor is writing.
        };
        let mut guard = seen.lock().unwrap();
        let seen = &mut *guard;
        seen.reads += 1;
        for c in list {
            let Some(sequence) = c.sequence_number else {
                continue;
            };
            let highest = seen
                .highest
                .entry(c.partition_id.clone())
                .or_insert(sequence);
            if sequence < *highest {
                seen.backwards.push(format!(
                    "partition {}: checkpoint {sequence} after {highest}",
                    c.partition_id
                ));
            }
            *highest = sequence.max(*highest);
        }
    }
}

/// What the checks after each restart keep between cycles, so that each looks only at what
/// is new: the events read so far (producer, sequence), each key's partition, how many of
/// each partition's events and of the records were taken in.
#[derive(Debug, Default)]
struct Seen {
    events: HashSet<(String, u64)>,
    home: HashMap<String, usize>,
    read: Vec<usize>,
    checked: usize,
}

impl Seen {
    /// Takes in the events read since the last call, then checks the records added since:
    /// each acknowledged batch whole in the log, no failed batch partly, each key's events in
    /// one partition. (Order and duplicates are checked at the end, on everything.)
    fn check_new(&mut self, log: &Log, batches: &[Batch], found: &mut Vec<String>) {
        self.read.resize(log.partitions.len(), 0);
        for (p, events) in log.partitions.iter().enumerate() {
            for body in &events[self.read[p]..] {
                let mut parts = body.splitn(3, '/');
                let (Some(producer), Some(Ok(s)), Some(k)) = (
                    parts.next(),
                    parts.next().map(str::parse::<u64>),
                    parts.next(),
                ) else {
                    found.push(format!("{body:?} is no producer's event"));
                    continue;
                };
                self.events.insert((producer.to_owned(), s));
                let home = *self.home.entry(k.to_owned()).or_insert(p);
                if home != p {
                    found.push(format!("{body} in partition {p}, its key's in {home}"));
                }
            }
            self.read[p] = events.len();
        }
        for b in &batches[self.checked..] {
            let present = (b.s..b.s + b.n)
                .filter(|s| self.events.contains(&(b.p.clone(), *s)))
                .count() as u64;
            if b.ok && present < b.n {
                found.push(format!("acknowledged {b:?}: {present} events in the log"));
            } else if !b.ok && present > 0 && present < b.n {
                found.push(format!("failed {b:?}: {present} of its events in the log"));
            }
        }
        self.checked = batches.len();
    }
}

/// The check after a restart: reads the records, then what the log holds beyond what was read
/// before, and compares what is new. The records are read first: an acknowledgement recorded
/// by then was for events already in the log, so the log read after it must hold them.
async fn check_cycle(
    cs: &str,
    log: &mut Log,
    records: &mut Records,
    seen: &mut Seen,
    dir: &Path,
) -> Vec<String> {
    let batches = records.refresh(dir);
    let consumer = ConsumerClient::connect(cs, HUB).await.unwrap();
    let mut found = Vec::new();
    log.read_new(&consumer, &mut found).await;
    consumer.close().await;
    seen.check_new(log, batches, &mut found);
    found
}

/// The check at the end, with every record in: the rest of the log, then all of it compared
/// with all the records; and the whole log read again from the start must be what was read
/// piece by piece across the restarts.
async fn check_all(
    cs: &str,
    log: &mut Log,
    records: &mut Records,
    dir: &Path,
) -> (Findings, Vec<String>) {
    let batches = records.refresh(dir);
    let consumer = ConsumerClient::connect(cs, HUB).await.unwrap();
    let mut found = Vec::new();
    log.read_new(&consumer, &mut found).await;
    let mut again = Log::default();
    again.read_new(&consumer, &mut found).await;
    consumer.close().await;
    for (p, (before, now)) in log.partitions.iter().zip(&again.partitions).enumerate() {
        if let Some(i) = (0..before.len().max(now.len())).find(|i| before.get(*i) != now.get(*i)) {
            found.push(format!(
                "partition {p}, event {i}: read as {:?} after a restart, as {:?} at the end",
                before.get(i),
                now.get(i)
            ));
        }
    }
    (analyse(log, batches, true), found)
}

/// The root connection string from the first start's banner.
fn connection_string(banner: &str) -> String {
    banner
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("Endpoint=sb://"))
        .unwrap_or_else(|| panic!("no connection string in the banner: {banner}"))
        .to_owned()
}

/// The one-paragraph summary.
fn summary(run: &Run, f: &Findings, found: &[String], fleet: &str) -> String {
    format!(
        "soak (seed {seed}): {cycles} SIGKILL cycles in {secs:.0} s ({per_hour:.0} cycles/h); \
         {ack} events acknowledged in {py} Python SDK and {rs} Rust client batches, \
         {failed} batches failed ({whole} stored whole, {absent} not stored, {partly} partly \
         stored); {lost} lost, {dup} duplicated (besides {resent} events in whole batches the \
         Python SDK sent again after a kill), {reordered} reordered, {misrouted} in another \
         partition than their key's, {unaccounted} unaccounted for, {gaps} sequence-number \
         violations; {events} events in the log. {fleet}",
        seed = run.seed,
        cycles = run.cycles,
        secs = run.elapsed.as_secs_f64(),
        per_hour = run.cycles as f64 * 3600.0 / run.elapsed.as_secs_f64().max(1.0),
        ack = f.acknowledged,
        py = f
            .sent
            .get(PYTHON_PRODUCER)
            .copied()
            .unwrap_or_default()
            .acknowledged,
        rs = f
            .sent
            .get(RUST_PRODUCER)
            .copied()
            .unwrap_or_default()
            .acknowledged,
        failed = f.sent.values().map(|s| s.failed).sum::<u64>(),
        whole = f.failed_whole,
        absent = f.failed_absent,
        partly = f.partly_stored,
        lost = f.lost,
        dup = f.duplicated,
        resent = f.resent,
        reordered = f.reordered,
        misrouted = f.misrouted,
        unaccounted = f.unaccounted,
        gaps = found.len(),
        events = run.events,
    )
}

/// What the run did, for the summary.
#[derive(Debug, Default)]
struct Run {
    seed: u64,
    cycles: u64,
    elapsed: Duration,
    events: usize,
}

/// Fails with the summary when a check found a violation.
fn assert_clean(run: &Run, f: &Findings, found: &[String], when: &str) {
    assert!(
        !f.violated() && found.is_empty(),
        "{when}: {}\n{f:?}\n{}",
        summary(run, f, found, ""),
        found.join("\n")
    );
}

/// The processes under test: the server, the producers, the fleet and the watcher.
struct Rig {
    dir: PathBuf,
    data: PathBuf,
    ports: (u16, u16),
    cs: String,
    server: Option<Server>,
    python: tokio::process::Child,
    rust: tokio::task::JoinHandle<()>,
    fleet: Fleet,
    checkpoints: Arc<Mutex<Checkpoints>>,
    watcher: tokio::task::JoinHandle<()>,
    stop: Arc<AtomicBool>,
}

impl Rig {
    async fn start(dir: &Path, rng: &mut StdRng) -> Rig {
        let data = dir.join("data");
        let ports = (free_port(), free_port());
        let (server, banner) = Server::start(&data, ports.0, ports.1).await;
        let cs = connection_string(&banner);
        let group = common::tributary(&data, &["group", "create", HUB, CHECK_GROUP])
            .output()
            .unwrap();
        assert!(group.status.success(), "{group:?}");
        let stop = Arc::new(AtomicBool::new(false));
        let python = python_producer(&cs, PYTHON_PRODUCER, rng.r#gen(), dir);
        let record = dir.join(format!("{RUST_PRODUCER}.records"));
        let rust = rust_producer(
            cs.clone(),
            RUST_PRODUCER.into(),
            rng.r#gen(),
            record,
            stop.clone(),
        );
        let fleet = Fleet::start(dir, &cs);
        let checkpoints = Arc::new(Mutex::new(Checkpoints::default()));
        let watch = watch_checkpoints(fleet.store(), checkpoints.clone(), stop.clone());
        Rig {
            dir: dir.to_owned(),
            data,
            ports,
            cs,
            server: Some(server),
            python,
            rust: tokio::spawn(rust),
            fleet,
            checkpoints,
            watcher: tokio::spawn(watch),
            stop,
        }
    }

    /// Waits (60 s at most) until both producers have had a batch acknowledged, so that the
    /// kills find both at work (the Python SDK takes a few seconds to start).
    async fn producers_at_work(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut records = Records::default();
            let batches = records.refresh(&self.dir);
            let working = |p: &str| batches.iter().any(|b| b.ok && b.p == p);
            if working(PYTHON_PRODUCER) && working(RUST_PRODUCER) {
                return;
            }
            let log = std::fs::read_to_string(self.dir.join(format!("{PYTHON_PRODUCER}.log")));
            assert!(
                Instant::now() < deadline,
                "the producers had no batch acknowledged in 60 s; the Python one logged: {}",
                log.unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One cycle: let it run, SIGKILL the server, leave it down a moment, start it again.
    async fn cycle(&mut self, rng: &mut StdRng) {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(UP_MS))).await;
        self.server.take().expect("running").kill().await;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..500))).await;
        let (server, _) = Server::start(&self.data, self.ports.0, self.ports.1).await;
        self.server = Some(server);
        self.fleet.revive();
    }

    /// Stops the producers and waits for them to finish their last batch.
    async fn stop_producers(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        std::fs::write(self.dir.join("stop"), b"").unwrap();
        (&mut self.rust).await.unwrap();
        let python = tokio::time::timeout(Duration::from_secs(60), self.python.wait())
            .await
            .expect("the Python producer stops within 60 s")
            .unwrap();
        let log = std::fs::read_to_string(self.dir.join(format!("{PYTHON_PRODUCER}.log")))
            .unwrap_or_default();
        assert!(python.success(), "the Python producer failed: {log}");
    }
}

/// Waits (up to 120 s) until the fleet has processed every event in `log`; what it says about
/// the fleet, or `Err` with what it missed.
async fn fleet_catches_up(rig: &mut Rig, log: &Log) -> Result<String, String> {
    let since = Instant::now();
    loop {
        let processed = rig.fleet.processed();
        let missing: Vec<&str> = log
            .events()
            .map(|(_, body)| body)
            .filter(|body| !processed.contains_key(*body))
            .collect();
        let known: HashSet<&str> = log.events().map(|(_, body)| body).collect();
        if missing.is_empty() {
            let again: u64 = processed.values().map(|c| c - 1).sum();
            let foreign = processed
                .keys()
                .filter(|b| !known.contains(b.as_str()))
                .count();
            let checkpoints = rig.checkpoints.lock().unwrap();
            let said = format!(
                "Processor fleet ({FLEET} `tributary process` instances, SQLite checkpoints, \
                 {restarts} restarted after exiting): caught up {:.1} s after the producers \
                 stopped and the log was checked, every one of {} events processed at least \
                 once ({again} more than once, {foreign} not in the log); checkpoints read {} \
                 times, moved backwards {} times.",
                since.elapsed().as_secs_f64(),
                log.len(),
                checkpoints.reads,
                checkpoints.backwards.len(),
                restarts = rig.fleet.restarts,
            );
            if foreign > 0 || !checkpoints.backwards.is_empty() {
                return Err(format!("{said}\n{}", checkpoints.backwards.join("\n")));
            }
            return Ok(said);
        }
        if since.elapsed() > Duration::from_secs(120) {
            return Err(format!(
                "the fleet did not process {} of {} events in 120 s, e.g. {:?}",
                missing.len(),
                log.len(),
                &missing[..missing.len().min(5)]
            ));
        }
        rig.fleet.revive();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The soak (see the module docs): SIGKILL cycles under load, checked after each restart and
/// at the end; the summary goes to stderr and to `TRIBUTARY_SOAK_REPORT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_events_survive_sigkill_cycles() {
    let settings = Settings::from_env();
    eprintln!("soak: seed {} ({settings:?})", settings.seed);
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(settings.seed);
    let mut rig = Rig::start(dir.path(), &mut rng).await;
    rig.producers_at_work().await;
    let (mut log, mut records) = (Log::default(), Records::default());
    let mut seen = Seen::default();
    let mut run = Run {
        seed: settings.seed,
        ..Run::default()
    };
    let started = Instant::now();
    while settings.more(run.cycles, started) {
        rig.cycle(&mut rng).await;
        run.cycles += 1;
        let found = check_cycle(&rig.cs, &mut log, &mut records, &mut seen, &rig.dir).await;
        run.elapsed = started.elapsed();
        run.events = log.len();
        assert!(
            found.is_empty(),
            "after cycle {} (seed {}): {}",
            run.cycles,
            run.seed,
            found.join("\n")
        );
        if run.cycles.is_multiple_of(50) {
            eprintln!(
                "soak: {} cycles in {:.0} s, {} events in the log, {} batch records checked",
                run.cycles,
                run.elapsed.as_secs_f64(),
                run.events,
                seen.checked
            );
        }
    }
    rig.stop_producers().await;
    run.elapsed = started.elapsed();
    let (findings, found) = check_all(&rig.cs, &mut log, &mut records, &rig.dir).await;
    run.events = log.len();
    assert_clean(&run, &findings, &found, "at the end");
    let fleet = fleet_catches_up(&mut rig, &log).await;
    rig.stop.store(true, Ordering::Relaxed);
    (&mut rig.watcher).await.unwrap();
    let said = summary(
        &run,
        &findings,
        &found,
        fleet.as_ref().unwrap_or_else(|e| e),
    );
    eprintln!("{said}");
    if let Some(report) = &settings.report {
        std::fs::write(report, format!("{said}\n")).unwrap();
    }
    let Rig {
        fleet: f, server, ..
    } = rig;
    f.stop().await;
    if let Some(server) = server {
        server.kill().await;
    }
    assert!(fleet.is_ok(), "{said}");
    let acknowledged = |p: &str| findings.sent.get(p).is_some_and(|s| s.acknowledged > 0);
    assert!(
        run.cycles > 0 && acknowledged(PYTHON_PRODUCER) && acknowledged(RUST_PRODUCER),
        "both producers had batches acknowledged: {said}"
    );
}
