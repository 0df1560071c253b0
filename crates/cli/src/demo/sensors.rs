//! The demo's simulated sensors: every home has a motion sensor, a door/window sensor and a
//! glass-break detector (and, once the script adds them, a carbon-monoxide detector); each
//! sensor sends `rate` readings a minute, the homes spread evenly over the minute. A reading is
//! a small JSON body sent to the embedded hub in this process with the home id as partition
//! key, so one home's readings stay in order on one partition.
//!
//! What was acknowledged by the hub is tallied (per sensor kind and minute; per home too for
//! small runs), so the demo can check the aggregates against it.
//!
//! The sensors can pause: once [`Sensors::pause`] returns, no reading is in flight and none
//! starts until [`Sensors::resume`], so the tallies hold still for a check; on resuming, each
//! sensor carries on its schedule from where it paused (no burst of readings missed meanwhile).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use tokio::task::JoinSet;
use tributary_broker::Broker;
use tributary_event::{EventData, SendTarget};

use super::aggregate::now_ms;

/// The sensor kinds, in the order they are installed; the last one comes with the script.
pub const KINDS: [&str; 4] = ["motion", "door", "glass", "co"];

/// Runs up to this many homes tally what they sent per home, for the demo's check.
pub const DETAILED_HOMES_MAX: u32 = 10_000;

/// One sensor reading, as its JSON body says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// The home id (also the partition key).
    pub home: u32,
    /// One of [`KINDS`].
    pub kind: &'static str,
    /// What the sensor says (`motion`, `open`, `broken`, `12 ppm`, …).
    pub state: String,
    /// When the sensor sent it, ms since the Unix epoch.
    pub at_ms: i64,
}

impl Reading {
    /// The JSON body.
    pub fn body(&self) -> Bytes {
        Bytes::from(
            json!({"home": self.home, "sensor": self.kind, "state": self.state, "t": self.at_ms})
                .to_string(),
        )
    }
}

/// A reading read from a body without copying its state out of it (what an instance uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadingRef<'a> {
    /// The home id.
    pub home: u32,
    /// One of [`KINDS`].
    pub kind: &'static str,
    /// What the sensor says; borrowed from the body unless it holds JSON escapes.
    pub state: Cow<'a, str>,
    /// When the sensor sent it, ms since the Unix epoch.
    pub at_ms: i64,
}

/// The JSON body's fields, as [`Reading::body`] writes them.
#[derive(Deserialize)]
struct Body<'a> {
    home: u32,
    #[serde(borrow)]
    sensor: Cow<'a, str>,
    #[serde(borrow)]
    state: Cow<'a, str>,
    t: i64,
}

impl<'a> ReadingRef<'a> {
    /// Reads a body; `None` when it is not a reading.
    pub fn parse(body: &'a [u8]) -> Option<ReadingRef<'a>> {
        let body: Body<'a> = serde_json::from_slice(body).ok()?;
        Some(ReadingRef {
            home: body.home,
            kind: KINDS.into_iter().find(|k| *k == body.sensor)?,
            state: body.state,
            at_ms: body.t,
        })
    }
}

/// A made-up but plausible state for the `n`-th reading of a kind.
fn state(kind: usize, n: u64) -> String {
    match kind {
        0 if n.is_multiple_of(5) => "motion".into(),
        0 => "still".into(),
        1 if n.is_multiple_of(11) => "open".into(),
        1 => "closed".into(),
        2 if n.is_multiple_of(4999) => "broken".into(),
        2 => "intact".into(),
        _ => format!("{} ppm", n % 9),
    }
}

/// What the hub acknowledged.
#[derive(Debug, Default)]
pub struct Tallies {
    /// Per (kind, minute).
    pub per_minute: BTreeMap<(&'static str, i64), u64>,
    /// Per (home, kind, minute), for runs of up to [`DETAILED_HOMES_MAX`] homes.
    pub per_home: Option<HashMap<(u32, &'static str, i64), u64>>,
}

/// The simulated sensors of every home.
pub struct Sensors {
    broker: Broker,
    hub: String,
    homes: u32,
    rate: u32,
    kinds: AtomicUsize,
    /// Readings acknowledged by the hub.
    pub sent: AtomicU64,
    /// Readings the hub refused (should stay 0).
    pub failed: AtomicU64,
    tallies: Mutex<Tallies>,
    /// Whether sending is paused. Held while a round of readings is started, so a pause waits
    /// for that round to be counted in `in_flight`.
    paused: Mutex<bool>,
    /// Readings started and not yet tallied (acknowledged or refused).
    in_flight: AtomicU64,
}

impl Sensors {
    /// Sensors of `homes` homes, each sending `rate` readings a minute per sensor; three kinds.
    pub fn new(broker: Broker, hub: &str, homes: u32, rate: u32) -> Sensors {
        Sensors {
            broker,
            hub: hub.to_owned(),
            homes,
            rate,
            kinds: AtomicUsize::new(3),
            sent: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            tallies: Mutex::new(Tallies {
                per_home: (homes <= DETAILED_HOMES_MAX).then(HashMap::new),
                ..Tallies::default()
            }),
            paused: Mutex::new(false),
            in_flight: AtomicU64::new(0),
        }
    }

    /// Stops starting readings and waits until every reading in flight is tallied.
    pub async fn pause(&self) {
        *self.paused.lock().expect("paused") = true;
        while self.in_flight.load(Ordering::Acquire) > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Starts sending again after [`Sensors::pause`].
    pub fn resume(&self) {
        *self.paused.lock().expect("paused") = false;
    }

    /// Installs the carbon-monoxide detectors (the fourth kind).
    pub fn add_carbon_monoxide(&self) {
        self.kinds.store(KINDS.len(), Ordering::Relaxed);
    }

    /// How many kinds of sensor send now.
    pub fn kinds(&self) -> usize {
        self.kinds.load(Ordering::Relaxed)
    }

    /// Readings per second at the current number of kinds.
    pub fn events_per_second(&self) -> f64 {
        f64::from(self.homes) * f64::from(self.rate) * self.kinds() as f64 / 60.0
    }

    /// A copy of the tallies.
    pub fn tallies(&self) -> Tallies {
        let tallies = self.tallies.lock().expect("tallies");
        Tallies {
            per_minute: tallies.per_minute.clone(),
            per_home: tallies.per_home.clone(),
        }
    }

    fn record(&self, reading: &Reading) {
        let minute = reading.at_ms.div_euclid(60_000);
        let mut tallies = self.tallies.lock().expect("tallies");
        *tallies
            .per_minute
            .entry((reading.kind, minute))
            .or_default() += 1;
        if let Some(per_home) = &mut tallies.per_home {
            *per_home
                .entry((reading.home, reading.kind, minute))
                .or_default() += 1;
        }
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Sends readings as they fall due until `stop` turns true, then waits for the sends in
    /// flight. While paused it sends nothing, and moves each sensor's schedule on by the pause.
    pub async fn run(self: std::sync::Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        // Per kind: when it was installed (moved on by pauses) and how many readings it sent.
        let mut started: [Option<(Instant, u64)>; KINDS.len()] = [None; KINDS.len()];
        let mut in_flight = JoinSet::new();
        let mut paused_at: Option<Instant> = None;
        let mut ticker = tokio::time::interval(Duration::from_millis(20));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.changed() => break,
            }
            self.round(&mut started, &mut in_flight, &mut paused_at);
            while in_flight.try_join_next().is_some() {}
        }
        while in_flight.join_next().await.is_some() {}
    }

    /// One tick: unless paused, starts what has fallen due — first moving the schedules on by
    /// a pause that just ended. The pause flag stays locked throughout, so [`Sensors::pause`]
    /// returns only after this round's readings are counted in flight.
    fn round(
        self: &std::sync::Arc<Self>,
        started: &mut [Option<(Instant, u64)>; KINDS.len()],
        in_flight: &mut JoinSet<()>,
        paused_at: &mut Option<Instant>,
    ) {
        let paused = self.paused.lock().expect("paused");
        if *paused {
            paused_at.get_or_insert_with(Instant::now);
            return;
        }
        if let Some(at) = paused_at.take() {
            for (since, _) in started.iter_mut().flatten() {
                *since += at.elapsed();
            }
        }
        self.start_due(started, in_flight);
        drop(paused);
    }

    /// Starts the readings that have fallen due for each installed kind.
    fn start_due(
        self: &std::sync::Arc<Self>,
        started: &mut [Option<(Instant, u64)>; KINDS.len()],
        in_flight: &mut JoinSet<()>,
    ) {
        let per_ms = f64::from(self.homes) * f64::from(self.rate) / 60_000.0;
        for (kind, slot) in started.iter_mut().enumerate().take(self.kinds()) {
            let (since, sent) = slot.get_or_insert((Instant::now(), 0));
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let due = (since.elapsed().as_secs_f64() * 1000.0 * per_ms) as u64;
            for n in *sent..due {
                // Each kind starts a quarter of the homes further on, so one home's
                // sensors do not all send at once.
                let offset = u64::from(self.homes) * kind as u64 / 4;
                let home = u32::try_from((n + offset) % u64::from(self.homes)).unwrap_or(0);
                let reading = Reading {
                    home,
                    kind: KINDS[kind],
                    state: state(kind, n),
                    at_ms: now_ms(),
                };
                let sensors = self.clone();
                self.in_flight.fetch_add(1, Ordering::AcqRel);
                in_flight.spawn(async move { sensors.send(reading).await });
            }
            *sent = due.max(*sent);
        }
    }

    async fn send(&self, reading: Reading) {
        let event = EventData::new(reading.body());
        let target = SendTarget::PartitionKey(reading.home.to_string());
        match self.broker.send(&self.hub, target, vec![event]).await {
            Ok(_) => self.record(&reading),
            Err(e) => {
                if self.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!("tributary demo: a reading was refused: {e}");
                }
            }
        }
        // After the tally: a pause that sees no reading in flight sees every tally.
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reading_reads_back_from_its_body() {
        let reading = Reading {
            home: 4711,
            kind: "co",
            state: "3 ppm".into(),
            at_ms: 1_764_000_000_123,
        };
        let body = reading.body();
        let read = ReadingRef::parse(&body).unwrap();
        assert_eq!(
            (read.home, read.kind, read.state.as_ref(), read.at_ms),
            (4711, "co", "3 ppm", 1_764_000_000_123)
        );
    }

    #[test]
    fn a_state_is_borrowed_from_the_body_unless_it_holds_escapes() {
        let body = br#"{"t":5,"state":"open","home":3,"sensor":"door","extra":[1]}"#;
        let reading = ReadingRef::parse(body).unwrap();
        assert!(
            matches!(reading.state, Cow::Borrowed("open")),
            "{reading:?}"
        );
        assert_eq!((reading.home, reading.kind, reading.at_ms), (3, "door", 5));
        let escaped = br#"{"home":3,"sensor":"c\u006f","state":"2 \"ppm\"","t":5}"#;
        let reading = ReadingRef::parse(escaped).unwrap();
        assert_eq!((reading.kind, reading.state.as_ref()), ("co", "2 \"ppm\""));
    }

    #[test]
    fn other_bodies_are_not_readings() {
        for body in [
            &b"hello"[..],
            br#"{"home":1,"sensor":"smoke","state":"x","t":1}"#,
            br#"{"home":-1,"sensor":"co","state":"x","t":1}"#,
            br#"{"home":1,"sensor":"co","t":1}"#,
            br#"{"home":4294967296,"sensor":"co","state":"x","t":1}"#,
            br#"{"home":1,"sensor":"co","state":"x","t":1.5}"#,
        ] {
            assert_eq!(ReadingRef::parse(body), None);
        }
    }
}
