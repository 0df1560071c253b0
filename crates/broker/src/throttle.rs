//! Throughput limits: token buckets, and the namespace's and hubs' ingress and egress limits
//! that every front door applies (Event Hubs' throughput units).
//!
//! # The bucket
//! A [`TokenBucket`] refills continuously at its rate on tokio's monotonic clock (so tests run
//! it under paused time) and holds at most one second's worth ([`BURST`]): an idle client may
//! send one second's worth at once, and no more. A request takes its cost whole. It may drive
//! the bucket below zero — into debt — and then must wait until the debt is repaid: the wait a
//! request is given is the time until the bucket would have held its cost (capped at a second's
//! worth, so a request larger than a second's worth waits a second, not forever), which paces a
//! client that keeps sending at exactly the rate.
//!
//! # The limits
//! [`Throttle`] holds a bucket per configured limit: the namespace's ingress and egress, each in
//! bytes/s and events/s, and the same per hub ([`ThroughputLimits`]). A request is charged to
//! every bucket that applies to it, all or nothing, and waits for the slowest. How a door
//! answers depends on [`Admit`]:
//! - [`Admit::Now`]: refused unless every bucket holds its cost now (HTTP: 429 with
//!   `Retry-After`);
//! - [`Admit::Within`]: admitted if the wait is at most this long, else refused (AMQP: the
//!   disposition comes after the wait, beyond it `com.microsoft:server-busy`);
//! - [`Admit::Always`]: always admitted, after the time until what it took is repaid, however
//!   large (Kafka's `throttle_time_ms`, and every egress: reads are slowed, never refused; a
//!   read larger than a second's worth must not pass a full bucket for free).
//!
//! A refused request takes nothing and is told how long to wait before it would be admitted.
//! [`Throttle::throttled_counts`] counts throttled requests per door, hub and direction, for
//! `/metrics`.
//!
//! [`Buckets`] keys buckets of one rate by name, bounded in number (the HTTP door's OCI-style
//! per-partition limits use it).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tributary_event::names::name_key;

/// How much a bucket holds: this long at its rate. One second, as a throughput unit is stated
/// "per second": an idle namespace may take one second's worth at once.
pub const BURST: Duration = Duration::from_secs(1);

/// The most keyed buckets [`Buckets`] keeps; beyond this, idle (full) buckets are dropped first.
pub const RATE_BUCKETS_MAX: usize = 100_000;

/// The most (door, hub, direction) throttle counters kept; beyond, a hub's throttled requests
/// are counted under the hub name [`OTHER_HUBS`]. Hubs come and go; the counters must not grow
/// without bound.
pub const THROTTLE_COUNTERS_MAX: usize = 4096;

/// The hub name counters fall under once [`THROTTLE_COUNTERS_MAX`] is reached.
pub const OTHER_HUBS: &str = "(other)";

/// One throughput unit, as Event Hubs defines it: ingress up to 1 MB/s or 1000 events/s,
/// egress up to 2 MB/s or 4096 events/s (MB = 2^20 bytes).
pub const THROUGHPUT_UNIT: DirectionLimits = DirectionLimits {
    ingress: Rate {
        bytes_per_second: Some(1024 * 1024),
        events_per_second: Some(1000),
    },
    egress: Rate {
        bytes_per_second: Some(2 * 1024 * 1024),
        events_per_second: Some(4096),
    },
};

/// A token bucket: `per_second` tokens a second, at most [`BURST`]'s worth held.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    per_second: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// A full bucket of `per_second` tokens a second.
    pub fn new(per_second: u64, now: Instant) -> Self {
        assert!(per_second > 0, "a rate of 0 is configured as no limit");
        let per_second = per_second as f64;
        TokenBucket {
            per_second,
            tokens: per_second * BURST.as_secs_f64(),
            at: now,
        }
    }

    fn capacity(&self) -> f64 {
        self.per_second * BURST.as_secs_f64()
    }

    /// The tokens held at `now` (negative while in debt).
    fn tokens_at(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        (self.tokens + elapsed * self.per_second).min(self.capacity())
    }

    /// How long a request of `cost` would wait if it took its tokens at `now`: until the
    /// bucket would have held its cost, capped at a second's worth.
    pub fn wait(&self, cost: u64, now: Instant) -> Duration {
        self.wait_for((cost as f64).min(self.capacity()), now)
    }

    /// How long until the debt a request of `cost` taken at `now` leaves is repaid: the wait
    /// of a request already served (Kafka's throttle time), which no cap may shorten.
    pub fn repaid(&self, cost: u64, now: Instant) -> Duration {
        self.wait_for(cost as f64, now)
    }

    fn wait_for(&self, need: f64, now: Instant) -> Duration {
        let short = need - self.tokens_at(now);
        if short <= 0.0 {
            return Duration::ZERO;
        }
        // Whole microseconds: a wait is a timer's duration, and the rounding keeps float noise
        // out of it.
        Duration::from_micros((short / self.per_second * 1e6).round() as u64)
    }

    /// Takes `cost` tokens at `now`, going into debt if there are too few.
    pub fn take(&mut self, cost: u64, now: Instant) {
        self.tokens = self.tokens_at(now) - cost as f64;
        self.at = now;
    }

    fn full_at(&self, now: Instant) -> bool {
        self.tokens_at(now) >= self.capacity()
    }
}

/// Token buckets of one rate, keyed by what the limit applies to; a request is refused whole
/// unless every bucket it names holds its cost now.
#[derive(Debug)]
pub struct Buckets {
    per_second: u64,
    buckets: Mutex<HashMap<String, TokenBucket>>,
}

impl Buckets {
    /// Buckets of `per_second` tokens a second each.
    pub fn new(per_second: u64) -> Self {
        assert!(per_second > 0, "a rate of 0 is configured as no limit");
        Buckets {
            per_second,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes `cost` tokens from each of `keys` if every one has them; otherwise takes none and
    /// returns the first key that had too few.
    pub fn take_all<'a>(&self, keys: &[(&'a str, u64)], now: Instant) -> Result<(), &'a str> {
        let mut buckets = self.buckets.lock().expect("rate buckets");
        if buckets.len() + keys.len() > RATE_BUCKETS_MAX {
            buckets.retain(|_, b| !b.full_at(now));
        }
        let fresh = TokenBucket::new(self.per_second, now);
        for &(key, cost) in keys {
            let bucket = buckets.get(key).unwrap_or(&fresh);
            if bucket.wait(cost, now) > Duration::ZERO {
                return Err(key);
            }
        }
        for &(key, cost) in keys {
            // A request of more than a second's worth passes a full bucket and empties it; it
            // leaves no debt here, as OCI's limits refuse rather than pace.
            let bucket = buckets.entry(key.to_owned()).or_insert(fresh);
            bucket.take(cost, now);
            bucket.tokens = bucket.tokens.max(0.0);
        }
        Ok(())
    }
}

/// A rate limit in bytes and in events a second; `None` is no limit of that kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rate {
    /// Bytes a second.
    pub bytes_per_second: Option<u64>,
    /// Events a second.
    pub events_per_second: Option<u64>,
}

impl Rate {
    /// Whether this limits anything.
    pub fn is_limited(&self) -> bool {
        self.bytes_per_second.is_some() || self.events_per_second.is_some()
    }

    /// `n` times this rate.
    pub fn times(self, n: u64) -> Rate {
        Rate {
            bytes_per_second: self.bytes_per_second.map(|r| r.saturating_mul(n)),
            events_per_second: self.events_per_second.map(|r| r.saturating_mul(n)),
        }
    }
}

/// Ingress and egress limits of one scope (the namespace, or one hub).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirectionLimits {
    /// What producers may send: events appended.
    pub ingress: Rate,
    /// What consumers may read: events delivered.
    pub egress: Rate,
}

impl DirectionLimits {
    /// `units` throughput units ([`THROUGHPUT_UNIT`]).
    pub fn throughput_units(units: u64) -> Self {
        DirectionLimits {
            ingress: THROUGHPUT_UNIT.ingress.times(units),
            egress: THROUGHPUT_UNIT.egress.times(units),
        }
    }

    fn rate(&self, direction: Direction) -> Rate {
        match direction {
            Direction::Ingress => self.ingress,
            Direction::Egress => self.egress,
        }
    }
}

/// The throughput limits of a broker: part of the server's configuration, not of the hub
/// catalog. The default limits nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThroughputLimits {
    /// Shared by every hub of the namespace, as throughput units are.
    pub namespace: DirectionLimits,
    /// Per hub, by name (compared case-insensitively), on top of the namespace's.
    pub hubs: BTreeMap<String, DirectionLimits>,
}

/// Which way events flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    /// Into the broker: sends and produces.
    Ingress,
    /// Out of the broker: receives, fetches and reads.
    Egress,
}

impl Direction {
    /// `ingress` or `egress`, as `/metrics` labels it.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

/// How long a door lets a request wait for its turn before refusing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Only if nothing needs to wait.
    Now,
    /// If the wait is at most this long.
    Within(Duration),
    /// Always, however long the wait.
    Always,
}

/// A refused request: nothing was taken; this long from now it would be admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Throttled {
    /// How long the client should wait before trying again.
    pub retry_after: Duration,
}

/// What a request costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    /// Events in the request.
    pub events: u64,
    /// Bytes of the request.
    pub bytes: u64,
}

/// The buckets of one scope and direction.
#[derive(Debug, Default)]
struct ScopeBuckets {
    bytes: Option<TokenBucket>,
    events: Option<TokenBucket>,
}

impl ScopeBuckets {
    fn new(rate: Rate, now: Instant) -> Self {
        ScopeBuckets {
            bytes: rate.bytes_per_second.map(|r| TokenBucket::new(r, now)),
            events: rate.events_per_second.map(|r| TokenBucket::new(r, now)),
        }
    }

    fn wait(&self, cost: Cost, now: Instant, admit: Admit) -> Duration {
        let wait = |b: &TokenBucket, cost| match admit {
            Admit::Always => b.repaid(cost, now),
            Admit::Now | Admit::Within(_) => b.wait(cost, now),
        };
        let bytes = self.bytes.map_or(Duration::ZERO, |b| wait(&b, cost.bytes));
        let events = self
            .events
            .map_or(Duration::ZERO, |b| wait(&b, cost.events));
        bytes.max(events)
    }

    fn take(&mut self, cost: Cost, now: Instant) {
        if let Some(b) = &mut self.bytes {
            b.take(cost.bytes, now);
        }
        if let Some(b) = &mut self.events {
            b.take(cost.events, now);
        }
    }
}

/// The buckets of both directions of one scope.
#[derive(Debug, Default)]
struct Scope {
    ingress: ScopeBuckets,
    egress: ScopeBuckets,
}

impl Scope {
    fn new(limits: &DirectionLimits, now: Instant) -> Self {
        Scope {
            ingress: ScopeBuckets::new(limits.ingress, now),
            egress: ScopeBuckets::new(limits.egress, now),
        }
    }

    fn direction(&mut self, direction: Direction) -> &mut ScopeBuckets {
        match direction {
            Direction::Ingress => &mut self.ingress,
            Direction::Egress => &mut self.egress,
        }
    }
}

/// (door, hub, direction) → requests throttled.
type Counters = BTreeMap<(&'static str, String, Direction), u64>;

/// The namespace's and hubs' throughput limits, applied by every front door.
#[derive(Debug)]
pub struct Throttle {
    limits: ThroughputLimits,
    namespace: Mutex<Scope>,
    /// Keyed by [`name_key`]; fixed when the broker opens.
    hubs: HashMap<String, Mutex<Scope>>,
    counters: Mutex<Counters>,
}

impl Throttle {
    /// The buckets of `limits`, full.
    pub fn new(limits: ThroughputLimits) -> Self {
        let now = Instant::now();
        let hubs = limits
            .hubs
            .iter()
            .map(|(hub, l)| (name_key(hub), Mutex::new(Scope::new(l, now))))
            .collect();
        Throttle {
            namespace: Mutex::new(Scope::new(&limits.namespace, now)),
            hubs,
            limits,
            counters: Mutex::new(BTreeMap::new()),
        }
    }

    /// The limits configured.
    pub fn limits(&self) -> &ThroughputLimits {
        &self.limits
    }

    /// Whether any limit applies to `hub` in `direction`: if not, doors need not count costs.
    pub fn limits_hub(&self, hub: &str, direction: Direction) -> bool {
        // No hub limits (the usual case): no name to fold on a send's path.
        self.limits.namespace.rate(direction).is_limited()
            || (!self.hubs.is_empty() && self.hubs.contains_key(&name_key(hub)))
    }

    /// Charges a request of `cost` on `hub` to every limit that applies, at `now`. Admitted
    /// (per `admit`): how long the request must wait before it is served. Refused: nothing was
    /// taken, and the request is counted as throttled for `door`.
    pub fn admit(
        &self,
        door: &'static str,
        hub: &str,
        direction: Direction,
        cost: Cost,
        admit: Admit,
        now: Instant,
    ) -> Result<Duration, Throttled> {
        let mut namespace = self.namespace.lock().expect("throttle");
        let mut hub_scope = self
            .hubs
            .get(&name_key(hub))
            .map(|s| s.lock().expect("throttle"));
        let wait = namespace.direction(direction).wait(cost, now, admit).max(
            hub_scope.as_mut().map_or(Duration::ZERO, |s| {
                s.direction(direction).wait(cost, now, admit)
            }),
        );
        let allowed = match admit {
            Admit::Now => Duration::ZERO,
            Admit::Within(d) => d,
            Admit::Always => Duration::MAX,
        };
        if wait > allowed {
            drop((namespace, hub_scope));
            self.count(door, hub, direction);
            return Err(Throttled {
                retry_after: wait - allowed,
            });
        }
        namespace.direction(direction).take(cost, now);
        if let Some(s) = hub_scope.as_mut() {
            s.direction(direction).take(cost, now);
        }
        drop((namespace, hub_scope));
        if wait > Duration::ZERO {
            self.count(door, hub, direction);
        }
        Ok(wait)
    }

    fn count(&self, door: &'static str, hub: &str, direction: Direction) {
        let mut counters = self.counters.lock().expect("throttle counters");
        let mut key = (door, hub.to_owned(), direction);
        if !counters.contains_key(&key) && counters.len() >= THROTTLE_COUNTERS_MAX {
            key.1 = OTHER_HUBS.to_owned();
        }
        *counters.entry(key).or_default() += 1;
    }

    /// Requests throttled (refused, or made to wait) so far: (door, hub, direction, count).
    pub fn throttled_counts(&self) -> Vec<(&'static str, String, Direction, u64)> {
        let counters = self.counters.lock().expect("throttle counters");
        counters
            .iter()
            .map(|((door, hub, direction), n)| (*door, hub.clone(), *direction, *n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(bytes: Option<u64>, events: Option<u64>) -> Rate {
        Rate {
            bytes_per_second: bytes,
            events_per_second: events,
        }
    }

    fn cost(events: u64, bytes: u64) -> Cost {
        Cost { events, bytes }
    }

    #[tokio::test(start_paused = true)]
    async fn keyed_buckets_refuse_beyond_the_rate_and_refill() {
        let b = Buckets::new(5);
        let now = Instant::now();
        for _ in 0..5 {
            b.take_all(&[("p0", 1)], now).unwrap();
        }
        assert_eq!(b.take_all(&[("p0", 1)], now), Err("p0"));
        b.take_all(&[("p1", 1)], now).unwrap();
        assert_eq!(b.take_all(&[("p1", 1), ("p0", 1)], now), Err("p0"));
        let later = now + Duration::from_millis(200);
        b.take_all(&[("p0", 1)], later).unwrap();
        assert_eq!(b.take_all(&[("p0", 1)], later), Err("p0"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_keyed_request_takes_nothing() {
        let b = Buckets::new(10);
        let now = Instant::now();
        b.take_all(&[("a", 8)], now).unwrap();
        assert_eq!(b.take_all(&[("b", 5), ("a", 5)], now), Err("a"));
        b.take_all(&[("b", 10)], now).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_bucket_in_debt_paces_requests_to_its_rate() {
        let now = Instant::now();
        let mut b = TokenBucket::new(100, now);
        assert_eq!(
            b.wait(100, now),
            Duration::ZERO,
            "a full second's worth at once"
        );
        b.take(100, now);
        assert_eq!(b.wait(10, now), Duration::from_millis(100));
        b.take(10, now);
        // The next request waits for the debt and its own cost: 20 tokens at 100/s.
        assert_eq!(b.wait(10, now), Duration::from_millis(200));
        let later = now + Duration::from_millis(200);
        b.take(10, later);
        assert_eq!(b.wait(10, later), Duration::from_millis(100));
        // A request larger than a second's worth waits for a full bucket, not forever.
        let idle = later + Duration::from_secs(10);
        assert_eq!(b.wait(1000, idle), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn admission_waits_refuses_or_always_admits() {
        let limits = ThroughputLimits {
            namespace: DirectionLimits {
                ingress: rate(Some(1000), Some(10)),
                egress: Rate::default(),
            },
            hubs: BTreeMap::new(),
        };
        let t = Throttle::new(limits);
        let now = Instant::now();
        let ingress = Direction::Ingress;
        assert_eq!(
            t.admit("amqp", "h", ingress, cost(10, 100), Admit::Now, now),
            Ok(Duration::ZERO)
        );
        // The events bucket is empty: one event waits 100 ms.
        let refused = t.admit("http", "h", ingress, cost(1, 1), Admit::Now, now);
        assert_eq!(
            refused,
            Err(Throttled {
                retry_after: Duration::from_millis(100)
            })
        );
        let refused = t.admit(
            "amqp",
            "h",
            ingress,
            cost(5, 1),
            Admit::Within(Duration::from_millis(400)),
            now,
        );
        assert_eq!(
            refused,
            Err(Throttled {
                retry_after: Duration::from_millis(100)
            })
        );
        let admitted = t.admit(
            "amqp",
            "h",
            ingress,
            cost(5, 1),
            Admit::Within(Duration::from_millis(500)),
            now,
        );
        assert_eq!(admitted, Ok(Duration::from_millis(500)));
        let admitted = t.admit("kafka", "h", ingress, cost(10, 1), Admit::Always, now);
        assert_eq!(admitted, Ok(Duration::from_millis(1500)));
        // Already served, a request larger than a second's worth waits for all of it.
        let later = now + Duration::from_secs(10);
        let served = t.admit("kafka", "h", ingress, cost(30, 1), Admit::Always, later);
        assert_eq!(served, Ok(Duration::from_secs(2)));
        // Egress has no limit here.
        let egress = t.admit(
            "amqp",
            "h",
            Direction::Egress,
            cost(1_000_000, 1),
            Admit::Now,
            now,
        );
        assert_eq!(egress, Ok(Duration::ZERO));
        let counts = t.throttled_counts();
        assert_eq!(
            counts,
            vec![
                ("amqp", "h".to_owned(), ingress, 2),
                ("http", "h".to_owned(), ingress, 1),
                ("kafka", "h".to_owned(), ingress, 2),
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_hub_limit_adds_to_the_namespace_limit_and_a_refusal_takes_nothing() {
        let mut hubs = BTreeMap::new();
        hubs.insert(
            "Slow".to_owned(),
            DirectionLimits {
                ingress: Rate::default(),
                egress: rate(Some(100), None),
            },
        );
        let t = Throttle::new(ThroughputLimits {
            namespace: DirectionLimits::throughput_units(1),
            hubs,
        });
        let now = Instant::now();
        let egress = Direction::Egress;
        assert!(t.limits_hub("slow", egress));
        assert_eq!(
            t.admit("amqp", "slow", egress, cost(1, 100), Admit::Now, now),
            Ok(Duration::ZERO)
        );
        assert!(
            t.admit("amqp", "SLOW", egress, cost(1, 50), Admit::Now, now)
                .is_err()
        );
        // The refusal took nothing from the namespace: a whole TU's egress is still there.
        let whole = cost(4095, 2 * 1024 * 1024 - 100);
        assert_eq!(
            t.admit("amqp", "other", egress, whole, Admit::Now, now),
            Ok(Duration::ZERO)
        );
        let later = now + Duration::from_millis(500);
        assert_eq!(
            t.admit("amqp", "slow", egress, cost(0, 50), Admit::Now, later),
            Ok(Duration::ZERO)
        );
    }

    #[test]
    fn a_throughput_unit_is_what_event_hubs_says() {
        let tu = DirectionLimits::throughput_units(2);
        assert_eq!(tu.ingress, rate(Some(2 * 1024 * 1024), Some(2000)));
        assert_eq!(tu.egress, rate(Some(4 * 1024 * 1024), Some(8192)));
    }
}
