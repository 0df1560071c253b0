//! The demo's main line: start the hub, the page and the instances, play the script, then
//! check, summarise and stop everything.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use rusqlite::Connection;
use serde_json::{Value, json};
use tributary_amqp::{AccessPolicies, AmqpConfig, RunningAmqpServer};
use tributary_broker::{Broker, BrokerConfig, HubSpec};
use tributary_processor::store::{CheckpointStore, StoreLocation};

use super::aggregate::{self, now_ms};
use super::fleet::{Fleet, Launch};
use super::sensors::{KINDS, Sensors};
use super::{HUB, PARTITIONS, page};
use crate::args::{DemoArgs, GlobalArgs};

/// The script's length when no `--duration` is given (the demo then runs until Ctrl-C).
const DEFAULT_SCRIPT_MS: i64 = 8 * 60_000;

/// Without `--duration`, how long after the last step (an instance killed) the script ends and
/// the aggregates are checked: the killed instance's ownership expires after 4 s, the others
/// claim its partitions on their next balancing cycle (1 s) and resume from its checkpoints —
/// while the sensors still send, so the page shows it.
const RECOVERY_MS: u64 = 10_000;

/// How long the instances get to aggregate what was sent before the check, at the end of the
/// script or of `--duration`; after Ctrl-C before the script ended, [`INTERRUPTED_CATCH_UP_MS`].
const CATCH_UP_MS: u64 = 30_000;
/// See [`CATCH_UP_MS`].
const INTERRUPTED_CATCH_UP_MS: u64 = 10_000;

/// One instance as the page shows it.
#[derive(Debug, Clone)]
pub struct InstanceView {
    /// Host name.
    pub name: String,
    /// Process id.
    pub pid: u32,
    /// Running or not.
    pub alive: bool,
}

/// What the page, the watcher and the script share.
pub struct Shared {
    /// Homes simulated.
    pub homes: u32,
    /// The sensors.
    pub sensors: Arc<Sensors>,
    /// The page's connection to the aggregates database.
    pub db: Mutex<Connection>,
    /// Every announcement so far: `{"at_ms", "text"}`.
    pub announcements: Mutex<Vec<Value>>,
    /// The instances.
    pub instances: Mutex<Vec<InstanceView>>,
    /// Partition → owner, from the checkpoint store.
    pub owners: Mutex<BTreeMap<u32, String>>,
    /// Events aggregated, per instance.
    pub per_instance: Mutex<BTreeMap<String, u64>>,
    /// Events aggregated, in all.
    pub stored: AtomicU64,
    /// Sensor → page latency (ms) of every reading seen, since the start.
    pub latency: Mutex<Histogram<u64>>,
    /// The same since the last [`Shared::reset_window`].
    pub window: Mutex<Histogram<u64>>,
}

impl Shared {
    fn new(homes: u32, sensors: Arc<Sensors>, aggregates: &Path) -> Result<Shared> {
        Ok(Shared {
            homes,
            sensors,
            db: Mutex::new(aggregate::open(aggregates)?),
            announcements: Mutex::default(),
            instances: Mutex::default(),
            owners: Mutex::default(),
            per_instance: Mutex::default(),
            stored: AtomicU64::new(0),
            latency: Mutex::new(histogram()),
            window: Mutex::new(histogram()),
        })
    }

    /// Says something on the terminal and on the page.
    pub fn announce(&self, text: &str) {
        let at = now_ms();
        println!("[{}] {text}", clock(at));
        self.announcements
            .lock()
            .expect("announcements")
            .push(json!({"at_ms": at, "text": text}));
    }

    /// Waits until the instances have aggregated `sent` readings, or `patience` has passed.
    async fn caught_up(&self, sent: u64, patience: Duration) {
        let deadline = Instant::now() + patience;
        while self.stored.load(Ordering::Relaxed) < sent && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn reset_window(&self) {
        self.window.lock().expect("window").reset();
    }
}

/// `HH:MM:SS` (UTC) of a time in ms since the epoch.
fn clock(ms: i64) -> String {
    let s = ms.div_euclid(1000).rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000, 3).expect("histogram bounds")
}

/// The p50, p99 and max of a latency histogram, as JSON.
pub fn percentiles(h: &Histogram<u64>) -> Value {
    json!({
        "count": h.len(),
        "p50_ms": h.value_at_quantile(0.5),
        "p99_ms": h.value_at_quantile(0.99),
        "max_ms": h.max(),
    })
}

/// The embedded hub: the broker and its AMQP door on a free port.
struct Hub {
    broker: Broker,
    amqp: RunningAmqpServer,
    connection_string: String,
    namespace: String,
}

async fn start_hub(global: &GlobalArgs, dir: &Path) -> Result<Hub> {
    let mut config = BrokerConfig::new(dir);
    config.log.durability = global.durability;
    config.sync_scope = global.sync_scope;
    let broker = Broker::open(config)
        .await
        .with_context(|| format!("cannot open the hub's directory {}", dir.display()))?;
    if broker.describe_hub(HUB).is_err() {
        broker
            .create_hub(HubSpec::new(HUB, PARTITIONS))
            .await
            .context("cannot create the demo's hub")?;
    }
    let (policies, _) =
        AccessPolicies::load_or_create(dir).context("cannot load the shared access policies")?;
    let policy = policies
        .get("RootManageSharedAccessKey")
        .context("the hub has no RootManageSharedAccessKey policy")?
        .clone();
    let config = AmqpConfig::new(([127, 0, 0, 1], 0).into(), policies);
    let amqp = tributary_amqp::start(broker.clone(), config)
        .await
        .context("cannot start the hub's AMQP door")?;
    let port = amqp.local_addr().port();
    let connection_string = tributary_amqp::connection_string("127.0.0.1", port, &policy);
    let namespace = tributary_client::ConnectionString::parse(&connection_string)?
        .host()
        .to_owned();
    Ok(Hub {
        broker,
        amqp,
        connection_string,
        namespace,
    })
}

/// Where the demo keeps its files: `--data`, or a temporary directory (removed when dropped).
fn data_dir(args: &DemoArgs) -> Result<(PathBuf, Option<tempfile::TempDir>)> {
    match &args.data {
        Some(dir) => {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            Ok((dir.clone(), None))
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix("tributary-demo-")
                .tempdir()
                .context("cannot create a temporary directory")?;
            Ok((temp.path().to_owned(), Some(temp)))
        }
    }
}

/// `tributary demo`.
pub async fn run(global: &GlobalArgs, args: &DemoArgs) -> Result<()> {
    let (data, _temp) = data_dir(args)?;
    let hub = start_hub(global, &data.join("hub")).await?;
    let aggregates = data.join("aggregates.sqlite");
    aggregate::create(&aggregates)?;
    let store_path = data.join("checkpoints.sqlite");
    let store = StoreLocation::Sqlite(store_path.clone())
        .open()
        .await
        .context("cannot open the checkpoint store")?;
    let sensors = Arc::new(Sensors::new(hub.broker.clone(), HUB, args.homes, args.rate));
    let shared = Arc::new(Shared::new(args.homes, sensors.clone(), &aggregates)?);
    let page = page::start(shared.clone(), args.port).await?;
    println!("residents' page: http://{}/", page.local_addr());
    let mut fleet = Fleet::new(Launch {
        connection_string: hub.connection_string.clone(),
        hub: HUB.to_owned(),
        store: store_path,
        aggregates: aggregates.clone(),
        log: global.log.clone(),
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn(watch(
        shared.clone(),
        aggregates.clone(),
        store.clone(),
        hub.namespace.clone(),
        stopped.clone(),
    ));
    let mut script = Script {
        shared: shared.clone(),
        stops: tokio::sync::Mutex::new(Stops::new()?),
        store,
        namespace: hub.namespace.clone(),
        started: Instant::now(),
        length_ms: args
            .duration
            .or(args.script_length)
            .unwrap_or(DEFAULT_SCRIPT_MS),
        report: serde_json::Map::new(),
        cpu_start: None,
    };
    let played = async {
        for _ in 0..args.instances {
            fleet.spawn()?;
        }
        publish_instances(&fleet, &shared);
        let sensing = tokio::spawn(sensors.clone().run(stopped));
        let mut outcome = script.play(&mut fleet, args).await;
        if args.duration.is_none() && matches!(outcome, Ok(Waited::Due)) {
            outcome = script.check_and_carry_on(&fleet, &data, &aggregates).await;
        }
        let _ = stop.send(true);
        sensing.await?;
        outcome
    }
    .await;
    let finished = script.conclude(played, &fleet, &data, &aggregates).await;
    fleet.stop_all().await;
    watcher.abort();
    page.shutdown().await;
    hub.amqp.shutdown().await;
    hub.broker.shutdown().await?;
    finished
}

/// Shows the fleet on the page.
fn publish_instances(fleet: &Fleet, shared: &Shared) {
    *shared.instances.lock().expect("instances") = fleet
        .instances
        .iter()
        .map(|i| InstanceView {
            name: i.name.clone(),
            pid: i.pid,
            alive: i.alive,
        })
        .collect();
}

/// Partition → owner, from the checkpoint store.
async fn owners(
    store: &Arc<dyn CheckpointStore>,
    namespace: &str,
) -> Result<BTreeMap<u32, String>> {
    Ok(store
        .list_ownership(namespace, HUB, "$Default")
        .await?
        .into_iter()
        .filter(|o| !o.owner_id.is_empty())
        .filter_map(|o| Some((o.partition_id.parse().ok()?, o.owner_id)))
        .collect())
}

/// Every 250 ms: the readings newly stored (their sensor → page latency); every second: the
/// owners and the per-instance counts.
async fn watch(
    shared: Arc<Shared>,
    aggregates: PathBuf,
    store: Arc<dyn CheckpointStore>,
    namespace: String,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let conn = aggregate::open(&aggregates)?;
    let mut seen_ms = 0i64;
    let mut ticker = tokio::time::interval(Duration::from_millis(250));
    for round in 0u64.. {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stopped.changed() => {}
        }
        seen_ms = tokio::task::block_in_place(|| observe(&shared, &conn, seen_ms))?;
        if round % 4 == 0 {
            if let Ok(owners) = owners(&store, &namespace).await {
                *shared.owners.lock().expect("owners") = owners;
            }
            let counts = tokio::task::block_in_place(|| per_instance(&conn))?;
            shared
                .stored
                .store(counts.values().sum(), Ordering::Relaxed);
            *shared.per_instance.lock().expect("per instance") = counts;
        }
    }
    Ok(())
}

/// Records the latency of the readings stored since `seen_ms`; returns the new mark.
fn observe(shared: &Shared, conn: &Connection, seen_ms: i64) -> Result<i64> {
    let mut statement = conn.prepare("SELECT at_ms, stored_ms FROM latest WHERE stored_ms > ?1")?;
    let now = now_ms();
    let mut mark = seen_ms;
    let mut latency = shared.latency.lock().expect("latency");
    let mut window = shared.window.lock().expect("window");
    let mut rows = statement.query([seen_ms])?;
    while let Some(row) = rows.next()? {
        let (at_ms, stored_ms): (i64, i64) = (row.get(0)?, row.get(1)?);
        mark = mark.max(stored_ms);
        let ms = u64::try_from(now - at_ms).unwrap_or(0).max(1);
        let _ = latency.record(ms);
        let _ = window.record(ms);
    }
    Ok(mark)
}

fn per_instance(conn: &Connection) -> Result<BTreeMap<String, u64>> {
    let mut statement = conn.prepare("SELECT instance, events FROM instance_events")?;
    let rows = statement.query_map([], |row| {
        Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
    })?;
    let mut counts = BTreeMap::new();
    for row in rows {
        let (instance, events) = row?;
        counts.insert(instance, u64::try_from(events).unwrap_or(0));
    }
    Ok(counts)
}

/// Ctrl-C (SIGINT) and SIGTERM, listened for from the script's start to the demo's end, so one
/// that arrives between waits (during a step, or the check) is kept for the next wait.
struct Stops {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl Stops {
    fn new() -> Result<Stops> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Stops {
            interrupt: signal(SignalKind::interrupt()).context("cannot listen for Ctrl-C")?,
            terminate: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
        })
    }

    /// The next Ctrl-C or SIGTERM (or one that came since the last call).
    async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// The script and what it observed.
struct Script {
    shared: Arc<Shared>,
    stops: tokio::sync::Mutex<Stops>,
    store: Arc<dyn CheckpointStore>,
    namespace: String,
    started: Instant,
    length_ms: i64,
    report: serde_json::Map<String, Value>,
    cpu_start: Option<(Instant, f64)>,
}

/// How a wait (or the script) ended.
#[derive(PartialEq, Eq)]
enum Waited {
    Due,
    Interrupted,
    /// The aggregates were checked when the script ended; then came Ctrl-C or SIGTERM.
    Checked,
}

impl Script {
    /// The moment `fraction` of the script's length after the start.
    fn at(&self, fraction: f64) -> Instant {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let ms = (self.length_ms as f64 * fraction) as u64;
        self.started + Duration::from_millis(ms)
    }

    /// Waits until `when` (`None`: for ever), printing a status line every 10 s; stops early on
    /// Ctrl-C/SIGTERM.
    async fn wait_until(&self, when: Option<Instant>) -> Result<Waited> {
        let mut stops = self.stops.lock().await;
        let mut status = tokio::time::interval_at(
            tokio::time::Instant::now() + Duration::from_secs(10),
            Duration::from_secs(10),
        );
        let due = async {
            match when {
                Some(when) => tokio::time::sleep_until(when.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(due);
        loop {
            tokio::select! {
                () = &mut due => return Ok(Waited::Due),
                () = stops.recv() => return Ok(Waited::Interrupted),
                _ = status.tick() => self.print_status(),
            }
        }
    }

    fn print_status(&self) {
        let shared = &self.shared;
        let sent = shared.sensors.sent.load(Ordering::Relaxed);
        let stored = shared.stored.load(Ordering::Relaxed);
        let p99 = shared
            .window
            .lock()
            .expect("window")
            .value_at_quantile(0.99);
        let mut per_owner: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for (partition, owner) in shared.owners.lock().expect("owners").iter() {
            per_owner.entry(owner.clone()).or_default().push(*partition);
        }
        let owners: Vec<String> = per_owner
            .iter()
            .map(|(owner, partitions)| format!("{owner}: {}", partitions.len()))
            .collect();
        println!(
            "[{}]   sent {sent}, aggregated {stored} (behind {}), {:.0} readings/s, sensor → page p99 {p99} ms; partitions per instance: {}",
            clock(now_ms()),
            sent.saturating_sub(stored),
            shared.sensors.events_per_second(),
            owners.join(", ")
        );
    }

    async fn owners_json(&self) -> Value {
        match owners(&self.store, &self.namespace).await {
            Ok(owners) => json!(owners),
            Err(e) => json!({"error": e.to_string()}),
        }
    }

    /// The three steps, then the end (or Ctrl-C at any point): `--duration` after the start,
    /// or without it [`RECOVERY_MS`] after the last step.
    async fn play(&mut self, fleet: &mut Fleet, args: &DemoArgs) -> Result<Waited> {
        let shared = self.shared.clone();
        shared.announce(&format!(
            "the demo runs: {} homes × 3 sensors × {}/min = {:.0} readings/s into hub {HUB:?} ({PARTITIONS} partitions, key = home id); {} processor instances (child processes) share the partitions and aggregate per home per minute. Look for: every partition gets an owner; aggregated follows sent.",
            args.homes,
            args.rate,
            shared.sensors.events_per_second(),
            args.instances
        ));
        if self.wait_until(Some(self.at(0.25))).await? == Waited::Interrupted {
            return Ok(Waited::Interrupted);
        }
        self.carbon_monoxide(fleet);
        if self.wait_until(Some(self.at(0.45))).await? == Waited::Interrupted {
            return Ok(Waited::Interrupted);
        }
        self.add_instance(fleet).await?;
        if self.wait_until(Some(self.at(0.65))).await? == Waited::Interrupted {
            return Ok(Waited::Interrupted);
        }
        self.kill_instance(fleet).await?;
        let end = match args.duration {
            Some(_) => self.at(1.0),
            None => Instant::now() + Duration::from_millis(RECOVERY_MS),
        };
        self.wait_until(Some(end)).await
    }

    /// Without `--duration`, when the script has ended: pauses the sensors, checks (the
    /// verdict), resumes them and runs until Ctrl-C or SIGTERM. Fails if the check does.
    async fn check_and_carry_on(
        &mut self,
        fleet: &Fleet,
        data: &Path,
        aggregates: &Path,
    ) -> Result<Waited> {
        let shared = self.shared.clone();
        shared.sensors.pause().await;
        shared.announce(&format!(
            "the script is over: the sensors pause after {} readings while the instances aggregate the rest, for the check",
            shared.sensors.sent.load(Ordering::Relaxed)
        ));
        self.record_pids(fleet);
        let agree = self
            .check(data, aggregates, Duration::from_millis(CATCH_UP_MS))
            .await?;
        anyhow::ensure!(agree, "the aggregates do not match what the sensors sent");
        shared.sensors.resume();
        shared.announce(
            "the sensors resume; the demo keeps running until Ctrl-C (the check is not repeated)",
        );
        self.wait_until(None).await?;
        Ok(Waited::Checked)
    }

    /// Once the sensors have stopped: the verdict, unless it was given when the script ended
    /// (it is not given again).
    async fn conclude(
        &mut self,
        played: Result<Waited>,
        fleet: &Fleet,
        data: &Path,
        aggregates: &Path,
    ) -> Result<()> {
        match played? {
            Waited::Checked => {
                self.stopped();
                Ok(())
            }
            waited => {
                self.record_pids(fleet);
                self.finish(data, aggregates, waited == Waited::Interrupted)
                    .await
            }
        }
    }

    /// After Ctrl-C that followed the check at the end of the script.
    fn stopped(&self) {
        self.shared.announce(&format!(
            "the sensors stopped after {} readings; the demo stops (its check was made when the script ended)",
            self.shared.sensors.sent.load(Ordering::Relaxed)
        ));
    }

    /// The instances' process ids, for the summary.
    fn record_pids(&mut self, fleet: &Fleet) {
        let pids: Vec<u32> = fleet.instances.iter().map(|i| i.pid).collect();
        self.report.insert("pids".into(), json!(pids));
    }

    fn carbon_monoxide(&mut self, fleet: &Fleet) {
        let before = self.shared.sensors.events_per_second();
        self.shared.sensors.add_carbon_monoxide();
        self.shared.announce(&format!(
            "step 1/3: carbon-monoxide detectors installed in every home: {before:.0} → {:.0} readings/s (a third more). Look for: \"co\" in a home's minutes; the instances keep up (aggregated follows sent).",
            self.shared.sensors.events_per_second()
        ));
        self.shared.reset_window();
        self.cpu_start = Some((Instant::now(), fleet.cpu_seconds()));
    }
}

impl Script {
    /// Step 2: one more instance; first the steady-state figures of the fleet as it was.
    async fn add_instance(&mut self, fleet: &mut Fleet) -> Result<()> {
        if let Some((since, cpu)) = self.cpu_start {
            let wall = since.elapsed().as_secs_f64();
            let percent = (fleet.cpu_seconds() - cpu) / wall * 100.0;
            let latency = percentiles(&self.shared.window.lock().expect("window"));
            self.shared.announce(&format!(
                "steady state with {} instances and 4 sensors per home, over the last {wall:.0} s: the instances used {percent:.1} % of one core together; sensor → page p99 {} ms",
                fleet.instances.len(),
                latency["p99_ms"]
            ));
            self.report.insert(
                "steady".into(),
                json!({"instances": fleet.instances.len(), "seconds": wall, "cpu_percent_of_a_core": percent, "latency": latency, "readings_per_second": self.shared.sensors.events_per_second()}),
            );
        }
        let before = self.owners_json().await;
        self.report.insert("owners_before_add".into(), before);
        let name = fleet.spawn()?;
        publish_instances(fleet, &self.shared);
        self.shared.announce(&format!(
            "step 2/3: the operator adds {name} (pid {}). Look for: the pool rebalances — {name} steals one partition from the busiest instance, then takes the rest of its share from those above theirs on the next balancing interval (1 s), until each has 2 or 3.",
            fleet.instances.last().map_or(0, |i| i.pid)
        ));
        self.report.insert("added".into(), json!(name));
        Ok(())
    }

    /// Step 3: SIGKILL the running instance that owns the most partitions.
    async fn kill_instance(&mut self, fleet: &mut Fleet) -> Result<()> {
        let owners = owners(&self.store, &self.namespace).await?;
        let alive: Vec<String> = fleet
            .instances
            .iter()
            .filter(|i| i.alive)
            .map(|i| i.name.clone())
            .collect();
        let owned = |name: &String| owners.values().filter(|o| *o == name).count();
        let victim = alive
            .iter()
            .max_by_key(|name| (owned(name), std::cmp::Reverse((*name).clone())))
            .context("no instance runs")?
            .clone();
        let partitions: Vec<u32> = owners
            .iter()
            .filter(|(_, o)| **o == victim)
            .map(|(p, _)| *p)
            .collect();
        self.report
            .insert("owners_before_kill".into(), json!(owners));
        let pid = fleet.kill(&victim).await?;
        publish_instances(fleet, &self.shared);
        self.shared.announce(&format!(
            "step 3/3: {victim} (pid {pid}) killed with SIGKILL; it owned partitions {partitions:?}. Look for: they stay with the dead instance until its ownership expires (4 s), then the others claim them and resume from its last checkpoints; no reading is counted twice."
        ));
        self.report.insert("killed".into(), json!(victim));
        Ok(())
    }

    /// Once the sensors have stopped: the check, which must agree unless interrupted.
    ///
    /// After Ctrl-C the wait is shorter and a difference (readings still on their way) is
    /// reported, not an error.
    async fn finish(&mut self, data: &Path, aggregates: &Path, interrupted: bool) -> Result<()> {
        let shared = self.shared.clone();
        shared.announce(&format!(
            "the sensors stopped after {} readings; waiting for the instances to aggregate the rest",
            shared.sensors.sent.load(Ordering::Relaxed)
        ));
        let patience = if interrupted {
            INTERRUPTED_CATCH_UP_MS
        } else {
            CATCH_UP_MS
        };
        let agree = self
            .check(data, aggregates, Duration::from_millis(patience))
            .await?;
        anyhow::ensure!(
            agree || interrupted,
            "the aggregates do not match what the sensors sent"
        );
        Ok(())
    }

    /// With the sensors stopped or paused: waits (up to `patience`) for the instances to
    /// aggregate everything the hub acknowledged, compares, writes `summary.json` (and
    /// `sent.json` with per-home tallies on small runs) and announces the verdict. Whether the
    /// aggregates agree with what was sent.
    async fn check(&mut self, data: &Path, aggregates: &Path, patience: Duration) -> Result<bool> {
        let shared = self.shared.clone();
        let sent = shared.sensors.sent.load(Ordering::Relaxed);
        shared.caught_up(sent, patience).await;
        let conn = aggregate::open(aggregates)?;
        let tallies = shared.sensors.tallies();
        let detailed = tallies.per_home.is_some();
        let stored = tokio::task::block_in_place(|| stored_tallies(&conn, detailed))?;
        let per_minute = |map: &BTreeMap<(&str, i64), u64>| -> Vec<Value> {
            map.iter().map(|((k, m), n)| json!([k, m, n])).collect()
        };
        let stored_total: u64 = stored.per_minute.values().sum();
        let mismatches = tallies
            .per_home
            .as_ref()
            .map(|sent_per_home| differing_cells(sent_per_home, &stored.per_home));
        if let Some(per_home) = &tallies.per_home {
            let rows: Vec<Value> = per_home
                .iter()
                .map(|((home, kind, minute), n)| json!([home, kind, minute, n]))
                .collect();
            std::fs::write(data.join("sent.json"), Value::Array(rows).to_string())?;
        }
        let agree = stored.per_minute == tallies.per_minute && mismatches.unwrap_or(0) == 0;
        self.report.insert("sent".into(), json!(sent));
        self.report.insert("aggregated".into(), json!(stored_total));
        self.report.insert(
            "failed_sends".into(),
            json!(shared.sensors.failed.load(Ordering::Relaxed)),
        );
        self.report.insert(
            "sent_per_minute".into(),
            json!(per_minute(&tallies.per_minute)),
        );
        self.report.insert(
            "aggregated_per_minute".into(),
            json!(per_minute(&stored.per_minute)),
        );
        self.report
            .insert("per_home_mismatches".into(), json!(mismatches));
        self.report.insert("agree".into(), json!(agree));
        self.report
            .insert("owners_end".into(), self.owners_json().await);
        self.report.insert(
            "latency".into(),
            percentiles(&shared.latency.lock().expect("latency")),
        );
        self.report.insert(
            "announcements".into(),
            json!(*shared.announcements.lock().expect("announcements")),
        );
        let summary = data.join("summary.json");
        std::fs::write(&summary, Value::Object(self.report.clone()).to_string())
            .with_context(|| format!("cannot write {}", summary.display()))?;
        shared.announce(&format!(
            "check: the hub acknowledged {sent} readings; the aggregates count {stored_total}{}: {}",
            mismatches.map_or(String::new(), |n| format!(", {n} (home, sensor, minute) cells differ")),
            if agree { "they agree, every reading counted exactly once" } else { "THEY DIFFER" }
        ));
        Ok(agree)
    }
}

/// What the aggregates database counts.
struct Stored {
    per_minute: BTreeMap<(&'static str, i64), u64>,
    per_home: HashMap<(u32, &'static str, i64), u64>,
}

fn stored_tallies(conn: &Connection, detailed: bool) -> Result<Stored> {
    let mut stored = Stored {
        per_minute: BTreeMap::new(),
        per_home: HashMap::new(),
    };
    let mut statement = conn.prepare("SELECT home, kind, minute, count FROM home_minute")?;
    let mut rows = statement.query([])?;
    while let Some(row) = rows.next()? {
        let kind: String = row.get(1)?;
        let kind = KINDS
            .into_iter()
            .find(|k| *k == kind)
            .context("an unknown sensor kind in the aggregates")?;
        let (home, minute, count): (u32, i64, i64) = (row.get(0)?, row.get(2)?, row.get(3)?);
        let count = u64::try_from(count)?;
        *stored.per_minute.entry((kind, minute)).or_default() += count;
        if detailed {
            stored.per_home.insert((home, kind, minute), count);
        }
    }
    Ok(stored)
}

/// How many (home, sensor, minute) cells have different counts in the two tallies.
fn differing_cells(
    sent: &HashMap<(u32, &'static str, i64), u64>,
    stored: &HashMap<(u32, &'static str, i64), u64>,
) -> usize {
    let keys: std::collections::HashSet<_> = sent.keys().chain(stored.keys()).collect();
    keys.into_iter()
        .filter(|key| sent.get(key) != stored.get(key))
        .count()
}
