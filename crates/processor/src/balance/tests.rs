use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

const EXPIRATION: Duration = Duration::from_secs(5);
const INTERVAL: Duration = Duration::from_millis(500);

fn ids(partition_count: usize) -> Vec<String> {
    (0..partition_count).map(|p| p.to_string()).collect()
}

fn record(partition_id: &str, owner_id: &str, version: i64) -> Ownership {
    Ownership {
        fully_qualified_namespace: "ns".to_owned(),
        event_hub_name: "hub".to_owned(),
        consumer_group: "$default".to_owned(),
        partition_id: partition_id.to_owned(),
        owner_id: owner_id.to_owned(),
        last_modified_time_ms: 0,
        etag: Some(format!("etag-{partition_id}-{version}")),
        version,
    }
}

/// Records giving each owner in `owners` the listed partitions, all at version 1.
fn records(owners: &[(&str, &[usize])]) -> Vec<Ownership> {
    owners
        .iter()
        .flat_map(|(owner, partitions)| {
            partitions
                .iter()
                .map(move |p| record(&p.to_string(), owner, 1))
        })
        .collect()
}

fn plan(
    records: &[Ownership],
    me: &str,
    partition_count: usize,
    strategy: LoadBalancingStrategy,
    tracker: &mut ExpiryTracker,
    now: Instant,
) -> Vec<Claim> {
    let partition_ids = ids(partition_count);
    let input = BalanceInput {
        records,
        hosts: &[],
        my_owner_id: me,
        partition_ids: &partition_ids,
        strategy,
    };
    plan_claims(&input, tracker, now)
}

fn plan_fresh(records: &[Ownership], me: &str, partition_count: usize) -> Vec<Claim> {
    let mut tracker = ExpiryTracker::new(EXPIRATION);
    plan(
        records,
        me,
        partition_count,
        LoadBalancingStrategy::Balanced,
        &mut tracker,
        Instant::now(),
    )
}

fn acquisitions(claims: &[Claim]) -> Vec<&Claim> {
    claims.iter().filter(|claim| !claim.is_renewal()).collect()
}

fn renewal_ids(claims: &[Claim]) -> BTreeSet<String> {
    claims
        .iter()
        .filter(|claim| claim.is_renewal())
        .map(|claim| claim.partition_id.clone())
        .collect()
}

#[test]
fn a_lone_host_claims_every_partition_in_its_first_cycle() {
    let claims = plan_fresh(&[], "a", 32);
    assert_eq!(claims.len(), 32);
    assert!(
        claims
            .iter()
            .all(|claim| claim.reason == ClaimReason::Unclaimed && claim.etag.is_none())
    );
    let claimed: BTreeSet<&str> = claims.iter().map(|c| c.partition_id.as_str()).collect();
    assert_eq!(claimed.len(), 32);
}

#[test]
fn in_steady_state_only_renewals_are_proposed_with_current_etags() {
    let mut all = records(&[("a", &[0, 1, 2, 3]), ("b", &[4, 5, 6, 7])]);
    all[2].version = 17;
    all[2].etag = Some("current".to_owned());
    let claims = plan_fresh(&all, "a", 8);
    assert_eq!(claims.len(), 4);
    assert!(claims.iter().all(Claim::is_renewal));
    let renewed = claims.iter().find(|c| c.partition_id == "2").unwrap();
    assert_eq!(renewed.etag.as_deref(), Some("current"));
}

#[test]
fn relinquished_partitions_are_free_at_once() {
    let all = records(&[("", &[0, 1, 2, 3]), ("b", &[4, 5, 6, 7])]);
    let claims = plan_fresh(&all, "b", 8);
    assert_eq!(renewal_ids(&claims).len(), 4);
    let taken = acquisitions(&claims);
    assert_eq!(taken.len(), 4);
    for claim in taken {
        assert_eq!(claim.reason, ClaimReason::Relinquished);
        assert_eq!(
            claim.etag.as_deref(),
            Some(format!("etag-{}-1", claim.partition_id).as_str())
        );
    }
}

#[test]
fn records_expire_only_after_their_version_stands_still_for_the_expiration() {
    let start = Instant::now();
    let mut tracker = ExpiryTracker::new(EXPIRATION);
    let all = records(&[("a", &[0, 1, 2, 3]), ("b", &[4, 5, 6, 7])]);
    let strategy = LoadBalancingStrategy::Balanced;
    let claims = plan(&all, "b", 8, strategy, &mut tracker, start);
    assert!(acquisitions(&claims).is_empty());
    let almost = start + EXPIRATION - Duration::from_millis(1);
    let claims = plan(&all, "b", 8, strategy, &mut tracker, almost);
    assert!(acquisitions(&claims).is_empty(), "{claims:?}");
    let claims = plan(&all, "b", 8, strategy, &mut tracker, start + EXPIRATION);
    let taken = acquisitions(&claims);
    assert_eq!(
        taken.len(),
        4,
        "a dead owner is not active, so b's share is all 8"
    );
    assert!(taken.iter().all(|c| c.reason
        == ClaimReason::Expired {
            previous_owner: "a".to_owned()
        }));
}

#[test]
fn a_moving_version_keeps_a_record_alive_whatever_its_wall_clock_says() {
    let start = Instant::now();
    let mut tracker = ExpiryTracker::new(EXPIRATION);
    let strategy = LoadBalancingStrategy::Balanced;
    // a's clock is years behind, but a renews every interval: never expired.
    for round in 0..40_i64 {
        let now = start + INTERVAL * u32::try_from(round).unwrap();
        let all: Vec<Ownership> = (0..4)
            .map(|p| {
                let mut r = record(&p.to_string(), "a", 1 + round);
                r.last_modified_time_ms = 1;
                r
            })
            .chain((4..8).map(|p| record(&p.to_string(), "b", 1 + round)))
            .collect();
        let claims = plan(&all, "b", 8, strategy, &mut tracker, now);
        assert!(
            acquisitions(&claims).is_empty(),
            "round {round}: {claims:?}"
        );
    }
    // A record stamped in the future but standing still does expire.
    let mut frozen = record("0", "a", 100);
    frozen.last_modified_time_ms = i64::MAX;
    let mut tracker = ExpiryTracker::new(EXPIRATION);
    tracker.observe(std::slice::from_ref(&frozen), start);
    assert!(!tracker.is_expired("0", "a", start + EXPIRATION / 2));
    assert!(tracker.is_expired("0", "a", start + EXPIRATION));
    assert!(!tracker.is_expired("never-seen", "a", start + EXPIRATION * 10));
}

#[test]
fn a_version_change_restarts_the_expiry_clock() {
    let start = Instant::now();
    let mut tracker = ExpiryTracker::new(EXPIRATION);
    tracker.observe(&[record("0", "a", 1)], start);
    let later = start + EXPIRATION - Duration::from_millis(10);
    tracker.observe(&[record("0", "a", 2)], later);
    assert!(!tracker.is_expired("0", "a", start + EXPIRATION));
    assert!(tracker.is_expired("0", "a", later + EXPIRATION));
}

fn host(owner_id: &str, version: i64) -> HostRecord {
    HostRecord {
        owner_id: owner_id.to_owned(),
        version,
        last_modified_time_ms: 0,
    }
}

#[test]
fn a_moving_host_record_keeps_its_still_partitions_alive() {
    let start = Instant::now();
    let mut tracker = ExpiryTracker::new(EXPIRATION);
    let still = records(&[("a", &[0, 1]), ("b", &[2, 3])]);
    // "a" renews its host record every interval, "b" stopped after the first listing.
    let mut now = start;
    for version in 1..=20 {
        tracker.observe(&still, now);
        tracker.observe_hosts(&[host("a", version), host("b", 1)], now);
        now += INTERVAL;
    }
    let now = now - INTERVAL;
    assert!(now >= start + EXPIRATION);
    assert!(!tracker.is_expired("0", "a", now));
    assert!(!tracker.is_expired("1", "a", now));
    assert!(tracker.is_expired("2", "b", now));
    assert!(tracker.is_expired("3", "b", now));
    // A host the listing no longer has is judged by its partitions' versions alone.
    tracker.observe_hosts(&[host("b", 1)], now);
    assert!(tracker.is_expired("0", "a", now));
}

#[test]
fn a_live_host_record_is_no_excuse_for_a_moving_partition_to_be_judged_still() {
    // The partition's own version moving also proves its owner alive (a host without host
    // records among hosts with them, or a claim in between).
    let start = Instant::now();
    let mut tracker = ExpiryTracker::new(EXPIRATION);
    tracker.observe(&[record("0", "a", 1)], start);
    tracker.observe_hosts(&[host("a", 1)], start);
    let later = start + EXPIRATION - INTERVAL;
    tracker.observe(&[record("0", "a", 2)], later);
    tracker.observe_hosts(&[host("a", 1)], later);
    assert!(!tracker.is_expired("0", "a", start + EXPIRATION));
    assert!(tracker.is_expired("0", "a", later + EXPIRATION));
}

#[test]
fn with_host_records_a_dead_hosts_partitions_are_taken_after_the_expiration() {
    let partition_ids = ids(4);
    let all = records(&[("a", &[0, 1]), ("b", &[2, 3])]);
    let mut tracker = ExpiryTracker::new(EXPIRATION);
    let start = Instant::now();
    let mut now = start;
    let mut claims = Vec::new();
    // "a" is alive (its host record moves), "b" crashed (its record stands still).
    for version in 1.. {
        let hosts = [host("a", version), host("b", 7)];
        let input = BalanceInput {
            records: &all,
            hosts: &hosts,
            my_owner_id: "a",
            partition_ids: &partition_ids,
            strategy: LoadBalancingStrategy::Balanced,
        };
        claims = plan_claims(&input, &mut tracker, now);
        if !acquisitions(&claims).is_empty() {
            break;
        }
        now += INTERVAL;
    }
    assert_eq!(now - start, EXPIRATION);
    let taken: BTreeSet<&str> = acquisitions(&claims)
        .iter()
        .map(|claim| claim.partition_id.as_str())
        .collect();
    assert_eq!(taken, BTreeSet::from(["2", "3"]));
}

#[test]
fn free_partitions_are_taken_before_anything_is_stolen() {
    // a holds 6 of 8 and 2 have no record. b's share is 4, but it takes only the 2 free ones.
    let all = records(&[("a", &[0, 1, 2, 3, 4, 5])]);
    let claims = plan_fresh(&all, "b", 8);
    let taken = acquisitions(&claims);
    let taken_ids: BTreeSet<&str> = taken.iter().map(|c| c.partition_id.as_str()).collect();
    assert_eq!(taken_ids, BTreeSet::from(["6", "7"]));
    assert!(taken.iter().all(|c| c.reason == ClaimReason::Unclaimed));
}

#[test]
fn a_host_takes_only_the_free_partitions_it_is_short_of() {
    // a holds 4 of 8, 4 are free: b's share is 4, and nothing is left over for later hosts to
    // fight about.
    let all = records(&[("a", &[0, 1, 2, 3])]);
    let claims = plan_fresh(&all, "b", 8);
    assert_eq!(acquisitions(&claims).len(), 4);
    // With three active owners on 8 partitions a host takes at most the larger share (3).
    let all = records(&[("a", &[0, 1]), ("c", &[2, 3])]);
    let claims = plan_fresh(&all, "b", 8);
    assert_eq!(acquisitions(&claims).len(), 3);
}

#[test]
fn a_balanced_host_owning_nothing_steals_one_partition_from_the_most_loaded_owner() {
    let all = records(&[("a", &[0, 1, 2, 3, 4]), ("c", &[5, 6, 7])]);
    let claims = plan_fresh(&all, "b", 8);
    let taken = acquisitions(&claims);
    assert_eq!(taken.len(), 1);
    assert_eq!(
        taken[0].reason,
        ClaimReason::Steal {
            from: "a".to_owned()
        }
    );
    let victim_partitions = ["0", "1", "2", "3", "4"];
    assert!(victim_partitions.contains(&taken[0].partition_id.as_str()));
    assert_eq!(
        taken[0].etag.as_deref(),
        Some(format!("etag-{}-1", taken[0].partition_id).as_str())
    );
}

#[test]
fn balanced_hosts_take_disjoint_parts_of_one_plan_in_one_cycle() {
    // 12 partitions, 3 owners: 4 each. a gives 6; b and c, planning from the same records, take
    // 3 each, none twice, and leave a exactly 4.
    let all = records(&[
        ("a", &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
        ("b", &[10]),
        ("c", &[11]),
    ]);
    let taken: Vec<Vec<String>> = ["b", "c"]
        .iter()
        .map(|me| {
            let claims = plan_fresh(&all, me, 12);
            let taken = acquisitions(&claims);
            assert!(taken.iter().all(|c| c.reason
                == ClaimReason::Steal {
                    from: "a".to_owned()
                }));
            taken.iter().map(|c| c.partition_id.clone()).collect()
        })
        .collect();
    assert_eq!((taken[0].len(), taken[1].len()), (3, 3), "{taken:?}");
    let distinct: BTreeSet<&String> = taken.iter().flatten().collect();
    assert_eq!(distinct.len(), 6, "{taken:?}");
    // a, above its target, plans no steal; a plan's part is stable across cycles.
    assert!(acquisitions(&plan_fresh(&all, "a", 12)).is_empty());
    assert_eq!(acquisitions(&plan_fresh(&all, "b", 12)).len(), 3);
}

#[test]
fn greedy_steals_everything_it_is_short_of_in_one_cycle() {
    // 8 partitions, 3 owners: shares 3/3/2. a is above the larger share; b has nothing.
    let all = records(&[("a", &[0, 1, 2, 3, 4]), ("c", &[5, 6, 7])]);
    let mut tracker = ExpiryTracker::new(EXPIRATION);
    let claims = plan(
        &all,
        "b",
        8,
        LoadBalancingStrategy::Greedy,
        &mut tracker,
        Instant::now(),
    );
    let taken = acquisitions(&claims);
    assert_eq!(taken.len(), 2, "{taken:?}");
    assert!(taken.iter().all(|c| c.reason
        == ClaimReason::Steal {
            from: "a".to_owned()
        }));
    let distinct: BTreeSet<&str> = taken.iter().map(|c| c.partition_id.as_str()).collect();
    assert_eq!(distinct.len(), 2);
}

#[test]
fn an_owner_at_the_larger_share_is_robbed_only_by_a_host_below_the_smaller() {
    // 4 partitions, 3 owners: shares 2/1/1. a and b hold 2 each, c holds none: c steals one.
    let all = records(&[("a", &[0, 1]), ("b", &[2, 3])]);
    let taken_by_c = plan_fresh(&all, "c", 4);
    assert_eq!(acquisitions(&taken_by_c).len(), 1);
    // 3 partitions, 2 owners: a holds 2 (the larger share), b holds 1: b steals nothing.
    let all = records(&[("a", &[0, 1]), ("b", &[2])]);
    assert!(acquisitions(&plan_fresh(&all, "b", 3)).is_empty());
}

#[test]
fn nothing_is_stolen_when_the_spread_is_even() {
    type Owners<'a> = &'a [(&'a str, &'a [usize])];
    let cases: &[(Owners<'_>, &str, usize)] = &[
        (
            &[("a", &[0, 1, 2]), ("b", &[3, 4, 5]), ("c", &[6, 7])],
            "c",
            8,
        ),
        (
            &[("a", &[0, 1, 2]), ("b", &[3, 4, 5]), ("c", &[6, 7])],
            "a",
            8,
        ),
        (&[("a", &[0, 1]), ("b", &[2]), ("c", &[3])], "b", 4),
        (&[("a", &[0]), ("b", &[1])], "c", 2),
        (&[("a", &[0])], "b", 1),
    ];
    for (owners, me, partition_count) in cases {
        let claims = plan_fresh(&records(owners), me, *partition_count);
        assert!(
            acquisitions(&claims).is_empty(),
            "{me} in {owners:?}: {claims:?}"
        );
    }
}

#[test]
fn records_of_unknown_partitions_and_dead_owners_do_not_count() {
    let start = Instant::now();
    let mut tracker = ExpiryTracker::new(EXPIRATION);
    // "dead" stopped renewing long ago; "ghost" owns a partition the hub does not have.
    let mut all = records(&[("dead", &[0, 1, 2, 3]), ("b", &[4, 5])]);
    all.push(record("99", "ghost", 1));
    let strategy = LoadBalancingStrategy::Balanced;
    plan(&all, "a", 8, strategy, &mut tracker, start);
    // b renews; dead and ghost do not.
    for renewed in all.iter_mut().filter(|r| r.owner_id == "b") {
        *renewed = record(&renewed.partition_id, "b", 2);
    }
    let claims = plan(&all, "a", 8, strategy, &mut tracker, start + EXPIRATION);
    // Active owners are a and b (ghost's partition is not the hub's; dead's records expired),
    // so a's share is 4 of the 6 free partitions (0–3 expired, 6–7 unclaimed).
    let taken = acquisitions(&claims);
    assert_eq!(taken.len(), 4, "{taken:?}");
    assert!(taken.iter().all(|c| c.partition_id != "99"));
}

#[test]
fn my_own_records_are_always_renewed() {
    let start = Instant::now();
    let mut tracker = ExpiryTracker::new(EXPIRATION);
    // Even records of mine that look expired (my renewals failed for a while) are renewed, and a
    // host holding more than its share keeps them (others steal; it does not give away).
    let all = records(&[("a", &[0, 1, 2, 3, 4, 5]), ("b", &[6, 7])]);
    let strategy = LoadBalancingStrategy::Balanced;
    plan(&all, "a", 8, strategy, &mut tracker, start);
    let claims = plan(&all, "a", 8, strategy, &mut tracker, start + EXPIRATION * 2);
    assert_eq!(
        renewal_ids(&claims),
        ["0", "1", "2", "3", "4", "5"].map(str::to_owned).into()
    );
    // b's records expired in a's eyes, so a takes them too: a is the only active owner.
    assert_eq!(acquisitions(&claims).len(), 2);
}

#[test]
fn planning_is_deterministic_and_hosts_prefer_different_partitions() {
    let all = records(&[("x", &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])]);
    let first = plan_fresh(&all, "a", 24);
    assert_eq!(first, plan_fresh(&all, "a", 24));
    // 24 partitions, 3 owners in view (x, y, me): a host wants 8 of the 11 free ones, and a and
    // b rank them differently, so they reach for different sets.
    let all = records(&[("x", &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]), ("y", &[12])]);
    let a: BTreeSet<String> = acquisitions(&plan_fresh(&all, "a", 24))
        .iter()
        .map(|c| c.partition_id.clone())
        .collect();
    let b: BTreeSet<String> = acquisitions(&plan_fresh(&all, "b", 24))
        .iter()
        .map(|c| c.partition_id.clone())
        .collect();
    assert_eq!(a.len(), 8);
    assert_eq!(b.len(), 8);
    assert_ne!(a, b);
}

// ---------------------------------------------------------------------------------------------
// Convergence: many rounds of many hosts against a simulated store.

/// A store that applies claims the way real stores do (etag compare, version bump).
#[derive(Debug, Default, Clone)]
struct SimStore {
    records: BTreeMap<String, Ownership>,
}

impl SimStore {
    fn snapshot(&self) -> Vec<Ownership> {
        self.records.values().cloned().collect()
    }

    fn apply(&mut self, owner: &str, claims: &[Claim]) {
        for claim in claims {
            let current = self.records.get(&claim.partition_id);
            let version = match (current, &claim.etag) {
                (None, None) => 0,
                (Some(r), Some(etag)) if r.etag.as_ref() == Some(etag) => r.version,
                _ => continue,
            };
            self.records.insert(
                claim.partition_id.clone(),
                record(&claim.partition_id, owner, version + 1),
            );
        }
    }

    fn owners(&self) -> BTreeMap<String, String> {
        self.records
            .iter()
            .map(|(p, r)| (p.clone(), r.owner_id.clone()))
            .collect()
    }
}

#[derive(Debug, Clone)]
struct Scenario {
    live_hosts: usize,
    dead_hosts: usize,
    partition_count: usize,
    /// Per partition: an index into live ++ dead hosts, or past the end for "no record".
    initial_owner: Vec<usize>,
    strategy: LoadBalancingStrategy,
    order_seed: u64,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (1usize..=5, 0usize..=2, 1usize..=24).prop_flat_map(|(live, dead, partitions)| {
        (
            Just(live),
            Just(dead),
            Just(partitions),
            proptest::collection::vec(0..=live + dead, partitions),
            prop_oneof![
                Just(LoadBalancingStrategy::Balanced),
                Just(LoadBalancingStrategy::Greedy)
            ],
            any::<u64>(),
        )
            .prop_map(
                |(live_hosts, dead_hosts, partition_count, initial_owner, strategy, order_seed)| {
                    Scenario {
                        live_hosts,
                        dead_hosts,
                        partition_count,
                        initial_owner,
                        strategy,
                        order_seed,
                    }
                },
            )
    })
}

/// A small deterministic generator for the order hosts run in.
fn next_random(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1);
    *state >> 33
}

fn shuffled(count: usize, state: &mut u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..count).collect();
    for i in (1..count).rev() {
        let j = usize::try_from(next_random(state)).unwrap() % (i + 1);
        order.swap(i, j);
    }
    order
}

struct Simulation {
    store: SimStore,
    hosts: Vec<String>,
    trackers: Vec<ExpiryTracker>,
    partition_ids: Vec<String>,
    strategy: LoadBalancingStrategy,
    now: Instant,
    random: u64,
}

impl Simulation {
    fn new(s: &Scenario) -> Self {
        let hosts: Vec<String> = (0..s.live_hosts).map(|h| format!("live-{h}")).collect();
        let dead: Vec<String> = (0..s.dead_hosts).map(|h| format!("dead-{h}")).collect();
        let everyone: Vec<&String> = hosts.iter().chain(dead.iter()).collect();
        let mut store = SimStore::default();
        for (partition, owner_index) in s.initial_owner.iter().enumerate() {
            if let Some(owner) = everyone.get(*owner_index) {
                let id = partition.to_string();
                store.records.insert(id.clone(), record(&id, owner, 1));
            }
        }
        Simulation {
            store,
            trackers: vec![ExpiryTracker::new(EXPIRATION); hosts.len()],
            hosts,
            partition_ids: ids(s.partition_count),
            strategy: s.strategy,
            now: Instant::now(),
            random: s.order_seed,
        }
    }

    /// One balancing interval. `simultaneous`: every host plans from the same snapshot (their
    /// cycles overlap) before the claims reach the store in random order.
    fn round(&mut self, simultaneous: bool) -> Vec<Claim> {
        self.now += INTERVAL;
        let order = shuffled(self.hosts.len(), &mut self.random);
        let snapshot = self.store.snapshot();
        let mut all_claims = Vec::new();
        let mut planned = Vec::new();
        for host in order {
            let records = if simultaneous {
                snapshot.clone()
            } else {
                self.store.snapshot()
            };
            let input = BalanceInput {
                records: &records,
                hosts: &[],
                my_owner_id: &self.hosts[host],
                partition_ids: &self.partition_ids,
                strategy: self.strategy,
            };
            let claims = plan_claims(&input, &mut self.trackers[host], self.now);
            if simultaneous {
                planned.push((host, claims));
            } else {
                self.store.apply(&self.hosts[host], &claims);
                all_claims.extend(claims);
            }
        }
        for (host, claims) in planned {
            self.store.apply(&self.hosts[host], &claims);
            all_claims.extend(claims);
        }
        all_claims
    }

    fn is_balanced(&self) -> bool {
        let owners = self.store.owners();
        let mut counts: BTreeMap<&str, usize> =
            self.hosts.iter().map(|h| (h.as_str(), 0)).collect();
        for partition_id in &self.partition_ids {
            match owners
                .get(partition_id)
                .and_then(|o| counts.get_mut(o.as_str()))
            {
                Some(count) => *count += 1,
                None => return false,
            }
        }
        let max = counts.values().max().copied().unwrap_or(0);
        let min = counts.values().min().copied().unwrap_or(0);
        max - min <= 1
    }
}

fn converges_then_stays_put(scenario: &Scenario, simultaneous: bool, rounds_max: usize) {
    let mut simulation = Simulation::new(scenario);
    let mut rounds = 0;
    while !simulation.is_balanced() {
        rounds += 1;
        assert!(
            rounds <= rounds_max,
            "no even spread after {rounds_max} rounds: {:?}",
            simulation.store.owners()
        );
        simulation.round(simultaneous);
    }
    let settled = simulation.store.owners();
    for _ in 0..30 {
        let claims = simulation.round(simultaneous);
        assert!(
            claims.iter().all(Claim::is_renewal),
            "settled, yet proposed {:?}",
            acquisitions(&claims)
        );
        assert_eq!(simulation.store.owners(), settled);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn hosts_taking_turns_converge_to_an_even_spread_and_stop(s in scenario()) {
        // Dead records expire after 10 rounds; after that every round moves at least one
        // partition towards the even spread.
        converges_then_stays_put(&s, false, 10 + 2 * s.partition_count + 10);
    }

    #[test]
    fn hosts_with_overlapping_cycles_converge_too(s in scenario()) {
        converges_then_stays_put(&s, true, 400);
    }
}

#[test]
fn earlier_owners_are_known_stopped_an_expiration_after_the_last_change_of_hands_seen() {
    let start = Instant::now();
    let mut tracker = ExpiryTracker::new(EXPIRATION);
    // First seen: a steal just before is possible, so an expiration from the first listing.
    tracker.observe(&[record("0", "a", 1), record("1", "", 2)], start);
    assert_eq!(
        tracker.earlier_owners_stop_by("0", start),
        Some(start + EXPIRATION)
    );
    assert_eq!(
        tracker.earlier_owners_stop_by("0", start + EXPIRATION),
        None
    );
    assert_eq!(tracker.earlier_owners_stop_by("never-seen", start), None);
    // Renewed and taken after a release: no change of hands (the releaser had stopped).
    let later = start + EXPIRATION;
    tracker.observe(&[record("0", "a", 2), record("1", "b", 3)], later);
    assert_eq!(tracker.earlier_owners_stop_by("0", later), None);
    assert_eq!(tracker.earlier_owners_stop_by("1", later), None);
    // From one owner to another: for one expiration from when it was seen.
    let moved = later + INTERVAL;
    tracker.observe(&[record("0", "c", 3), record("1", "b", 4)], moved);
    assert_eq!(
        tracker.earlier_owners_stop_by("0", moved),
        Some(moved + EXPIRATION)
    );
    assert_eq!(
        tracker.earlier_owners_stop_by("0", moved + EXPIRATION - INTERVAL),
        Some(moved + EXPIRATION)
    );
    assert_eq!(
        tracker.earlier_owners_stop_by("0", moved + EXPIRATION),
        None
    );
    assert_eq!(tracker.earlier_owners_stop_by("1", moved), None);
}
