//! Which partitions a host should claim this cycle: a pure, deterministic function.
//!
//! [`plan_claims`] takes every ownership record of the consumer group, this host's owner id, the
//! hub's partition ids, an [`ExpiryTracker`] and the caller's monotonic "now", and returns the
//! claims to send to the store. It does no I/O, reads no clock and uses no randomness, so a test
//! can replay any situation exactly.
//!
//! # Rules
//!
//! - **Expiry is local and monotonic.** The tracker remembers, per partition, the
//!   [`Instant`] at which this host last saw the record's `version` change. A record whose
//!   version has not moved for the ownership expiration is expired. Wall-clock
//!   `last_modified_time_ms` values from other machines are never compared (clock skew between
//!   hosts cannot make a live owner look dead). A record seen for the first time counts as just
//!   changed, so a new host waits a full expiration before declaring anyone dead.
//! - **Host records prove a whole host alive.** Where the store keeps [`HostRecord`]s, a record
//!   is expired only when its owner's host record has not moved for the expiration either: the
//!   host renews one record per cycle, not one per partition. An owner without a host record
//!   (or whose record the store forgot) is judged by its ownership records alone.
//! - **Free partitions** have no record, were relinquished (owner `""`), or are expired.
//! - **Active owners** own at least one unexpired record; this host is always one. With `P`
//!   partitions and `N` active owners every owner should hold `⌊P/N⌋` or `⌈P/N⌉`, and at most
//!   `P mod N` of them the larger share.
//! - **Free partitions first, all at once.** A host short of its share claims every free
//!   partition it is short of in one cycle (one host on a 32-partition hub claims all 32 on its
//!   first cycle).
//! - **Steal only when nothing is free.** With [`LoadBalancingStrategy::Balanced`] the hosts
//!   follow one plan, which each computes alike from the same records: every active owner's
//!   target is the smaller share, plus one for the `P mod N` owners holding the most (ties by
//!   owner id); owners above their target give up the partitions they prefer least, and owners
//!   below theirs take them in owner id order. Only partitions the even split needs moved change
//!   hands, all in one cycle, and hosts planning from one listing never reach for the same
//!   partition. A host owning nothing is in no one's plan (the others cannot see it), so it
//!   first steals one partition from the most loaded owner, and takes its part of the plan from
//!   the next cycle on. [`LoadBalancingStrategy::Greedy`] steals, each cycle, all it is short
//!   of from whichever owners hold at least two more than it — the most loaded first, an owner
//!   above the larger share when there is one, else one at the larger share while this host is
//!   below the smaller. Either way, once every owner is within one of the others nothing is
//!   ever stolen.
//! - **Renew what is mine.** Every record this host owns is re-claimed with its current etag each
//!   cycle; that bumps its version, which is how other hosts see this one is alive. In steady
//!   state renewals are the only claims. (A host whose store keeps host records sends only the
//!   renewals of records it does not hold as listed; its host record proves the rest.)
//! - **Spread the contention.** Hosts rank candidate partitions by a hash of (host, partition)
//!   (rendezvous hashing), so hosts starting together reach for different partitions first and
//!   few claims collide.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::options::LoadBalancingStrategy;
use crate::store::{HostRecord, Ownership};

/// Per partition, and per host record, when this host last saw its version change.
#[derive(Debug, Clone)]
pub struct ExpiryTracker {
    expiration: Duration,
    seen: HashMap<String, SeenVersion>,
    /// By owner id: the host records of the last listing.
    hosts: HashMap<String, SeenVersion>,
    /// By partition: its owner in the last listing, and when this host began to watch it or
    /// last saw it pass from one owner to another, whichever is later (see
    /// [`earlier_owners_stop_by`](Self::earlier_owners_stop_by)).
    owners: HashMap<String, OwnerSeen>,
}

#[derive(Debug, Clone)]
struct OwnerSeen {
    owner_id: String,
    /// From this instant on, this host has seen every change of hands of the partition.
    unchanged_since: Instant,
}

#[derive(Debug, Clone, Copy)]
struct SeenVersion {
    version: i64,
    changed_at: Instant,
}

impl ExpiryTracker {
    /// A tracker declaring records expired after `expiration` without a version change.
    pub fn new(expiration: Duration) -> Self {
        assert!(!expiration.is_zero());
        ExpiryTracker {
            expiration,
            seen: HashMap::new(),
            hosts: HashMap::new(),
            owners: HashMap::new(),
        }
    }

    /// Records the versions in `records` as seen at `now`.
    pub fn observe(&mut self, records: &[Ownership], now: Instant) {
        for record in records {
            see(&mut self.seen, &record.partition_id, record.version, now);
            let owner = &record.owner_id;
            match self.owners.get_mut(&record.partition_id) {
                Some(seen) if seen.owner_id != *owner => {
                    // Taken after a release is not a change of hands: the releaser had stopped.
                    if !seen.owner_id.is_empty() && !owner.is_empty() {
                        seen.unchanged_since = now;
                    }
                    seen.owner_id.clone_from(owner);
                }
                Some(_) => {}
                None => {
                    let seen = OwnerSeen {
                        owner_id: owner.clone(),
                        unchanged_since: now,
                    };
                    self.owners.insert(record.partition_id.clone(), seen);
                }
            }
        }
    }

    /// When every owner of `partition_id` before its current one has stopped processing it at
    /// the latest, if that may still be after `now`.
    ///
    /// An owner that lost the partition to a steal stops within an expiration of the steal (its
    /// fence stops it, as it last renewed before). This host knows of every steal since it
    /// began to watch the partition, so the owners before the current one have stopped an
    /// expiration after the later of the last change of hands it saw and the first listing it
    /// saw the partition in: a host that just started cannot rule out a steal just before.
    /// `None` for a partition this host never saw (it has no record, so no owner).
    pub fn earlier_owners_stop_by(&self, partition_id: &str, now: Instant) -> Option<Instant> {
        let seen = self.owners.get(partition_id)?;
        let stopped_by = seen.unchanged_since + self.expiration;
        (stopped_by > now).then_some(stopped_by)
    }

    /// Records the versions of the host records of a listing as seen at `now`, and forgets
    /// hosts the listing no longer has.
    pub fn observe_hosts(&mut self, hosts: &[HostRecord], now: Instant) {
        let listed: HashSet<&str> = hosts.iter().map(|host| host.owner_id.as_str()).collect();
        self.hosts
            .retain(|owner_id, _| listed.contains(owner_id.as_str()));
        for host in hosts {
            see(&mut self.hosts, &host.owner_id, host.version, now);
        }
    }

    /// Whether the record of `partition_id`, owned by `owner_id`, is expired: it has kept one
    /// version for the whole expiration, and so has its owner's host record, if there is one.
    /// A partition never observed is not expired (it has no record to expire).
    pub fn is_expired(&self, partition_id: &str, owner_id: &str, now: Instant) -> bool {
        let still =
            |seen: &SeenVersion| now.saturating_duration_since(seen.changed_at) >= self.expiration;
        self.seen.get(partition_id).is_some_and(still) && self.hosts.get(owner_id).is_none_or(still)
    }
}

/// Notes `version` for `key` as seen at `now`: a new key or a changed version counts as just
/// changed.
fn see(seen: &mut HashMap<String, SeenVersion>, key: &str, version: i64, now: Instant) {
    let entry = seen.entry(key.to_owned()).or_insert(SeenVersion {
        version,
        changed_at: now,
    });
    if entry.version != version {
        entry.version = version;
        entry.changed_at = now;
    }
    assert!(entry.changed_at <= now, "the caller's clock went backwards");
}

/// What the balancer looks at.
#[derive(Debug, Clone, Copy)]
pub struct BalanceInput<'a> {
    /// Every ownership record of the consumer group on the hub.
    pub records: &'a [Ownership],
    /// Every host record of the consumer group (empty where the store keeps none).
    pub hosts: &'a [HostRecord],
    /// This host's owner id (never empty).
    pub my_owner_id: &'a str,
    /// The hub's partition ids.
    pub partition_ids: &'a [String],
    /// How eagerly to steal.
    pub strategy: LoadBalancingStrategy,
}

/// One claim to send to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The partition.
    pub partition_id: String,
    /// The etag to claim against (`None`: the partition has no record yet).
    pub etag: Option<String>,
    /// Why the claim is made.
    pub reason: ClaimReason,
}

/// Why a [`Claim`] is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimReason {
    /// This host owns the partition and proves it is alive.
    Renew,
    /// No record exists for the partition.
    Unclaimed,
    /// The previous owner released the partition.
    Relinquished,
    /// The owner's record has not been renewed for the ownership expiration.
    Expired {
        /// Who had it.
        previous_owner: String,
    },
    /// Taken from an owner with more than its share.
    Steal {
        /// Who has it.
        from: String,
    },
}

impl Claim {
    /// Whether this claim renews a partition this host already owns.
    pub fn is_renewal(&self) -> bool {
        self.reason == ClaimReason::Renew
    }
}

/// How the partitions look to this host this cycle.
struct Landscape<'a> {
    mine: Vec<&'a Ownership>,
    free: Vec<Claim>,
    /// Other active owners and their unexpired records.
    others: BTreeMap<&'a str, Vec<&'a Ownership>>,
    partition_count: usize,
}

/// The claims this host should make now: renewals of everything it owns, then whatever it takes.
///
/// Updates `tracker` with the versions in `input.records` and `input.hosts` as seen at `now`
/// first.
pub fn plan_claims(
    input: &BalanceInput<'_>,
    tracker: &mut ExpiryTracker,
    now: Instant,
) -> Vec<Claim> {
    assert!(!input.my_owner_id.is_empty());
    tracker.observe(input.records, now);
    tracker.observe_hosts(input.hosts, now);
    let mut landscape = survey(input, tracker, now);
    let mut claims: Vec<Claim> = landscape
        .mine
        .iter()
        .map(|record| Claim {
            partition_id: record.partition_id.clone(),
            etag: record.etag.clone(),
            reason: ClaimReason::Renew,
        })
        .collect();
    let short = my_target(&landscape).saturating_sub(landscape.mine.len());
    if short == 0 {
        return claims;
    }
    if !landscape.free.is_empty() {
        let me = input.my_owner_id;
        landscape
            .free
            .sort_by_key(|claim| std::cmp::Reverse(preference(me, &claim.partition_id)));
        claims.extend(landscape.free.into_iter().take(short));
        return claims;
    }
    let me = input.my_owner_id;
    let taken = match input.strategy {
        // Owning nothing, this host is invisible to the others' plans: one steal makes it seen.
        LoadBalancingStrategy::Balanced if landscape.mine.is_empty() => {
            plan_steals(me, &mut landscape, 1)
        }
        LoadBalancingStrategy::Balanced => planned_hand_over(me, &landscape),
        LoadBalancingStrategy::Greedy => plan_steals(me, &mut landscape, short),
    };
    claims.extend(taken);
    claims
}

/// Whether this host holds more partitions than an even split gives any owner (⌈P/N⌉ with N
/// active owners): the others' plans take the excess from it, and it learns which at its next
/// listing. Call after [`plan_claims`] has updated `tracker` with the same records.
pub fn holds_more_than_its_share(
    input: &BalanceInput<'_>,
    tracker: &ExpiryTracker,
    now: Instant,
) -> bool {
    let landscape = survey(input, tracker, now);
    let owners = landscape.others.len() + 1;
    landscape.mine.len() > landscape.partition_count.div_ceil(owners)
}

/// This host's part of the hand-over every host with the same records plans alike: each active
/// owner's target is the smaller share, plus one for the `P mod N` owners holding the most
/// (ties by owner id); owners above their target give the partitions they prefer least, and the
/// owners below theirs take them in owner id order. Only partitions the even split needs moved
/// change hands, and hosts planning from one listing never reach for the same partition.
fn planned_hand_over(me: &str, landscape: &Landscape<'_>) -> Vec<Claim> {
    let mut owners: Vec<(&str, Vec<&Ownership>)> = landscape
        .others
        .iter()
        .map(|(owner, records)| (*owner, records.clone()))
        .collect();
    owners.push((me, landscape.mine.clone()));
    owners.sort_by(|(a, a_records), (b, b_records)| {
        b_records.len().cmp(&a_records.len()).then(a.cmp(b))
    });
    let share_floor = landscape.partition_count / owners.len();
    let extra = landscape.partition_count % owners.len();
    let mut given: Vec<&Ownership> = Vec::new();
    let mut needs: Vec<(&str, usize)> = Vec::new();
    for (rank, (owner, records)) in owners.iter_mut().enumerate() {
        let target = share_floor + usize::from(rank < extra);
        if records.len() > target {
            records.sort_by_key(|record| preference(owner, &record.partition_id));
            let excess = records.len() - target;
            given.extend(records.drain(..).take(excess));
        } else if records.len() < target {
            needs.push((owner, target - records.len()));
        }
    }
    given.sort_by(|a, b| a.owner_id.cmp(&b.owner_id));
    needs.sort_unstable();
    let before_me: usize = needs
        .iter()
        .take_while(|(o, _)| *o != me)
        .map(|(_, n)| n)
        .sum();
    let mine = needs.iter().find(|(o, _)| *o == me).map_or(0, |(_, n)| *n);
    given
        .into_iter()
        .skip(before_me)
        .take(mine)
        .map(|record| Claim {
            partition_id: record.partition_id.clone(),
            etag: record.etag.clone(),
            reason: ClaimReason::Steal {
                from: record.owner_id.clone(),
            },
        })
        .collect()
}

/// Sorts each partition into mine, free or another active owner's.
fn survey<'a>(input: &BalanceInput<'a>, tracker: &ExpiryTracker, now: Instant) -> Landscape<'a> {
    let records: HashMap<&str, &Ownership> = input
        .records
        .iter()
        .map(|record| (record.partition_id.as_str(), record))
        .collect();
    let partition_ids: BTreeSet<&str> = input.partition_ids.iter().map(String::as_str).collect();
    let mut landscape = Landscape {
        mine: Vec::new(),
        free: Vec::new(),
        others: BTreeMap::new(),
        partition_count: partition_ids.len(),
    };
    for partition_id in partition_ids {
        let free = |etag: Option<String>, reason| Claim {
            partition_id: partition_id.to_owned(),
            etag,
            reason,
        };
        match records.get(partition_id) {
            None => landscape.free.push(free(None, ClaimReason::Unclaimed)),
            Some(record) if record.is_relinquished() => landscape
                .free
                .push(free(record.etag.clone(), ClaimReason::Relinquished)),
            Some(record) if record.owner_id == input.my_owner_id => landscape.mine.push(record),
            Some(record) if tracker.is_expired(partition_id, &record.owner_id, now) => {
                landscape.free.push(free(
                    record.etag.clone(),
                    ClaimReason::Expired {
                        previous_owner: record.owner_id.clone(),
                    },
                ));
            }
            Some(record) => landscape
                .others
                .entry(record.owner_id.as_str())
                .or_default()
                .push(record),
        }
    }
    landscape
}

/// How many partitions this host should hold: the larger share while fewer than `P mod N`
/// other owners hold more than the smaller share, else the smaller share.
fn my_target(landscape: &Landscape<'_>) -> usize {
    let owner_count = landscape.others.len() + 1;
    let share_floor = landscape.partition_count / owner_count;
    let extra = landscape.partition_count % owner_count;
    let others_above_floor = landscape
        .others
        .values()
        .filter(|records| records.len() > share_floor)
        .count();
    if extra > 0 && others_above_floor < extra {
        share_floor + 1
    } else {
        share_floor
    }
}

/// Up to `steals_max` steals, each from the most loaded owner holding at least two more
/// partitions than this host at that point.
fn plan_steals(me: &str, landscape: &mut Landscape<'_>, steals_max: usize) -> Vec<Claim> {
    let mut mine_count = landscape.mine.len();
    let mut steals = Vec::new();
    while steals.len() < steals_max {
        let victim = landscape
            .others
            .iter()
            .filter(|(_, records)| records.len() >= mine_count + 2)
            .max_by(|(a_owner, a), (b_owner, b)| a.len().cmp(&b.len()).then(b_owner.cmp(a_owner)))
            .map(|(owner, _)| *owner);
        let Some(victim) = victim else { break };
        let records = landscape
            .others
            .get_mut(victim)
            .expect("the victim was just found among the owners");
        let index = records
            .iter()
            .enumerate()
            .max_by_key(|(_, record)| preference(me, &record.partition_id))
            .map(|(index, _)| index)
            .expect("a victim holds at least two partitions");
        let record = records.swap_remove(index);
        steals.push(Claim {
            partition_id: record.partition_id.clone(),
            etag: record.etag.clone(),
            reason: ClaimReason::Steal {
                from: record.owner_id.clone(),
            },
        });
        mine_count += 1;
    }
    steals
}

/// How much `owner` prefers `partition_id`: a well-mixed hash of both (rendezvous hashing).
fn preference(owner: &str, partition_id: &str) -> u64 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let bytes = owner
        .bytes()
        .chain(std::iter::once(0xff))
        .chain(partition_id.bytes());
    let hash = bytes.fold(FNV_OFFSET, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME)
    });
    // splitmix64's finaliser, so similar inputs land far apart.
    let mut mixed = hash;
    mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    mixed ^ (mixed >> 31)
}

#[cfg(test)]
mod tests;
