//! When the pump of a partition stolen from a live owner may start: [`Handoff`].
//!
//! A steal takes a partition from an owner that is still running, and that owner keeps
//! processing it until it notices. It notices in its next balancing cycle — unless it is cut off
//! from the store, in which case it keeps processing until its own fence stops it, up to an
//! ownership expiration after its last renewal. Starting the new pump after a fixed pause
//! would let both process the partition at once in that case.
//!
//! So the new owner waits until the former owner has provably noticed, judged from the
//! listings it reads anyway: the former owner wrote to the store — renewed its host record,
//! claimed, renewed or relinquished a partition — after a listing that already showed the
//! steal. Any such write came from a cycle that either listed the steal or tried to renew the
//! stolen partition with its old etag and lost; either way that cycle stopped its pump. Without
//! such a sign the new owner waits one ownership expiration from the steal: by then the former
//! owner's fence has stopped its pumps (it last renewed before the steal). In the usual case
//! the wait is about two balancing intervals.
//!
//! A partition stolen a second time while the first thief may still be waiting: the first
//! thief noticing says nothing of the owner before it, which may still be processing if it is
//! cut off from the store. That owner stops within an expiration of the first steal. So when
//! the partition may have changed hands within the last expiration — this host saw it move,
//! or, where the store keeps host records, has watched it for less than an expiration (a host
//! that just started cannot rule out a steal just before) — the former owner's notice is not
//! enough. The wait then also lasts until an expiration after that possible change of hands,
//! or, where the store keeps host records, until every other host listed after the steal has
//! noticed too: renewed its host record (which lists the group's ownership in the same
//! request, so its cycle stopped any pump of the partition) or removed it (it had stopped its
//! pumps first). A host that joins a running fleet thus starts the partitions it takes as soon
//! as today's owners have noticed, unless some host's record stands still (a crashed or
//! cut-off host): then an expiration after it started at the latest.
//!
//! What this wait cannot see: it relies on every host that may still process a partition being
//! listed. The hub-hosted store keeps host records in memory, so after the hub restarts a host
//! cut off from it since then is not; and with a store without host records (the Azure Blob
//! layout, shared with official processors that start a stolen partition at once) a second
//! thief that has just started could not have seen the first steal, and does not wait for it
//! (it would idle for an expiration whenever it joins a fleet). There the receiver epoch closes
//! the case: the new owner opens its receiver with a higher owner level, which disconnects
//! every former owner's receiver, and a pump whose receiver is taken over cancels the batch it
//! is processing (`PartitionReceiver::taken_over`, see `pump.rs`). So two hosts process a
//! partition at once at most from the moment the new owner's receiver opens until the former
//! owner hears of it — in one process (the broker's `BrokerSource`) before its pump runs
//! again, over AMQP (Tributary or Azure) the trip of the hub's detach to it — and the former
//! owner's processor stops at its next await point. Only a source that cannot report a
//! takeover apart from a receive (the Kafka source) lets the batch in progress run to its end.

use std::collections::BTreeMap;

use tokio::time::Instant;

use crate::store::OwnershipListing;

/// What one listing shows of an owner: its host record's version and its records' versions.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sighting {
    host_version: Option<i64>,
    /// By partition id.
    records: BTreeMap<String, i64>,
}

impl Sighting {
    fn of(owner_id: &str, listing: &OwnershipListing) -> Sighting {
        Sighting {
            host_version: listing
                .hosts
                .iter()
                .find(|host| host.owner_id == owner_id)
                .map(|host| host.version),
            records: listing
                .ownership
                .iter()
                .filter(|record| record.owner_id == owner_id)
                .map(|record| (record.partition_id.clone(), record.version))
                .collect(),
        }
    }
}

/// A stolen partition whose pump waits for its former owner to notice (see the module docs).
#[derive(Debug, Clone)]
pub(crate) struct Handoff {
    /// This host.
    me: String,
    from: String,
    /// When the pump may start even without a sign from the former owner.
    deadline: Instant,
    /// The former owner as the first listing after the steal showed it.
    baseline: Option<Sighting>,
    noticed: bool,
    /// When the owners before the former one have stopped at the latest, if that is not yet
    /// known to be past: the wait lasts until then, unless every other host noticed.
    earlier_owners_stop_by: Option<Instant>,
    /// The other hosts whose host records the first listing after the steal showed, and
    /// whose notice is still awaited; `None` before that listing, or where the store keeps no
    /// host records (then only `earlier_owners_stop_by` ends the wait for earlier owners).
    others_awaited: Option<BTreeMap<String, i64>>,
}

impl Handoff {
    /// A partition just stolen by `me` from `from`; the wait ends by itself after
    /// `expiration`, and earlier when `from` notices — but not before
    /// `earlier_owners_stop_by`, when the owners before `from` have stopped, unless every other
    /// host noticed the steal too (see the module docs).
    pub(crate) fn new(
        me: &str,
        from: &str,
        stolen_at: Instant,
        expiration: std::time::Duration,
        earlier_owners_stop_by: Option<Instant>,
    ) -> Self {
        let deadline = stolen_at + expiration;
        assert!(
            earlier_owners_stop_by.is_none_or(|at| at <= deadline),
            "an earlier owner stops within an expiration of a change of hands before this steal"
        );
        Handoff {
            me: me.to_owned(),
            from: from.to_owned(),
            deadline,
            baseline: None,
            noticed: false,
            earlier_owners_stop_by,
            others_awaited: None,
        }
    }

    /// Looks at a listing read after the steal.
    pub(crate) fn watch(&mut self, listing: &OwnershipListing) {
        let Some(baseline) = &self.baseline else {
            self.baseline = Some(Sighting::of(&self.from, listing));
            if !listing.hosts.is_empty() {
                let others = listing
                    .hosts
                    .iter()
                    .filter(|host| host.owner_id != self.me && host.owner_id != self.from)
                    .map(|host| (host.owner_id.clone(), host.version))
                    .collect();
                self.others_awaited = Some(others);
            }
            return;
        };
        let now = Sighting::of(&self.from, listing);
        let renewed_or_claimed = now
            .records
            .iter()
            .any(|(partition_id, version)| baseline.records.get(partition_id) != Some(version));
        let relinquished = listing.ownership.iter().any(|record| {
            record.is_relinquished()
                && baseline
                    .records
                    .get(&record.partition_id)
                    .is_some_and(|version| *version != record.version)
        });
        if now.host_version != baseline.host_version || renewed_or_claimed || relinquished {
            self.noticed = true;
        }
        if let Some(others) = &mut self.others_awaited {
            let listed: BTreeMap<&str, i64> = listing
                .hosts
                .iter()
                .map(|host| (host.owner_id.as_str(), host.version))
                .collect();
            // Renewed since (its cycle listed the steal), or removed (it had stopped first).
            others.retain(|owner_id, version| listed.get(owner_id.as_str()) == Some(version));
        }
    }

    /// Whether the pump may start at `now`.
    pub(crate) fn is_over(&self, now: Instant) -> bool {
        let earlier_owners_stopped = self.earlier_owners_stop_by.is_none_or(|at| now >= at)
            || self.others_awaited.as_ref().is_some_and(BTreeMap::is_empty);
        (self.noticed && earlier_owners_stopped) || now >= self.deadline
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::store::{HostRecord, Ownership};

    fn record(partition_id: &str, owner_id: &str, version: i64) -> Ownership {
        Ownership {
            fully_qualified_namespace: "ns".into(),
            event_hub_name: "hub".into(),
            consumer_group: "$default".into(),
            partition_id: partition_id.into(),
            owner_id: owner_id.into(),
            last_modified_time_ms: 0,
            etag: Some(format!("{partition_id}-{version}")),
            version,
        }
    }

    fn listing(records: &[(&str, &str, i64)], hosts: &[(&str, i64)]) -> OwnershipListing {
        OwnershipListing {
            ownership: records
                .iter()
                .map(|(p, owner, version)| record(p, owner, *version))
                .collect(),
            hosts: hosts
                .iter()
                .map(|(owner, version)| HostRecord {
                    owner_id: (*owner).into(),
                    version: *version,
                    last_modified_time_ms: 0,
                })
                .collect(),
        }
    }

    const EXPIRATION: Duration = Duration::from_secs(5);

    #[test]
    fn a_former_owner_cut_off_from_the_store_is_waited_out() {
        let stolen_at = Instant::now();
        let mut handoff = Handoff::new("me", "a", stolen_at, EXPIRATION, None);
        // "a" never writes again: its records and host record stand still.
        let still = listing(&[("0", "b", 5), ("1", "a", 3)], &[("a", 7), ("b", 2)]);
        for _ in 0..10 {
            handoff.watch(&still);
        }
        assert!(!handoff.is_over(stolen_at + EXPIRATION - Duration::from_millis(1)));
        assert!(handoff.is_over(stolen_at + EXPIRATION));
    }

    #[test]
    fn a_host_record_renewed_after_the_first_listing_ends_the_wait() {
        let stolen_at = Instant::now();
        let mut handoff = Handoff::new("me", "a", stolen_at, EXPIRATION, None);
        // A renewal between the steal and the first listing proves nothing: it is the baseline.
        handoff.watch(&listing(&[("0", "b", 5)], &[("a", 8)]));
        assert!(!handoff.is_over(stolen_at));
        handoff.watch(&listing(&[("0", "b", 5)], &[("a", 9)]));
        assert!(handoff.is_over(stolen_at));
    }

    #[test]
    fn a_partition_that_just_changed_hands_waits_for_the_owner_before() {
        let stolen_at = Instant::now();
        let earlier_stop_by = stolen_at + EXPIRATION / 2;
        let new = || Handoff::new("me", "a", stolen_at, EXPIRATION, Some(earlier_stop_by));
        // "c", whose host record stands still, may be the owner before "a", cut off.
        let mut handoff = new();
        handoff.watch(&listing(&[("0", "b", 5)], &[("a", 8), ("c", 4), ("me", 1)]));
        handoff.watch(&listing(&[("0", "b", 5)], &[("a", 9), ("c", 4), ("me", 2)]));
        // "a" noticed, but "c" may still be processing.
        assert!(!handoff.is_over(earlier_stop_by - Duration::from_millis(1)));
        assert!(handoff.is_over(earlier_stop_by));
        // Without a notice from "a", the whole expiration.
        let mut silent = new();
        silent.watch(&listing(&[("0", "b", 5)], &[("a", 8), ("c", 4)]));
        silent.watch(&listing(&[("0", "b", 5)], &[("a", 8), ("c", 5)]));
        assert!(!silent.is_over(stolen_at + EXPIRATION - Duration::from_millis(1)));
        assert!(silent.is_over(stolen_at + EXPIRATION));
        // Every other host renewed or removed its record since the steal: each has stopped
        // any pump of the partition, so "a"'s notice is enough.
        let mut everyone = new();
        everyone.watch(&listing(&[], &[("a", 8), ("c", 4), ("d", 7), ("me", 1)]));
        everyone.watch(&listing(&[], &[("a", 9), ("c", 5), ("d", 7), ("me", 2)]));
        assert!(!everyone.is_over(stolen_at));
        everyone.watch(&listing(&[], &[("a", 9), ("c", 5), ("me", 3)]));
        assert!(everyone.is_over(stolen_at));
        // Without host records nobody else can be seen: the earlier owners' time is waited.
        let mut blind = new();
        blind.watch(&listing(&[("0", "a", 5)], &[]));
        blind.watch(&listing(&[("0", "a", 6)], &[]));
        assert!(!blind.is_over(stolen_at));
        assert!(blind.is_over(earlier_stop_by));
    }

    #[test]
    fn renewals_claims_and_releases_of_the_former_owner_end_the_wait_but_others_do_not() {
        let stolen_at = Instant::now();
        let baseline = listing(&[("0", "b", 5), ("1", "a", 3), ("2", "c", 1)], &[]);
        let cases = [
            // Someone else stole another of its partitions: not a sign from "a".
            (
                listing(&[("0", "b", 5), ("1", "c", 4), ("2", "c", 1)], &[]),
                false,
            ),
            // Another owner renewed: not a sign from "a".
            (
                listing(&[("0", "b", 6), ("1", "a", 3), ("2", "c", 2)], &[]),
                false,
            ),
            // "a" renewed partition 1.
            (
                listing(&[("0", "b", 5), ("1", "a", 4), ("2", "c", 1)], &[]),
                true,
            ),
            // "a" claimed partition 2.
            (
                listing(&[("0", "b", 5), ("1", "a", 3), ("2", "a", 2)], &[]),
                true,
            ),
            // "a" shut down and relinquished partition 1.
            (
                listing(&[("0", "b", 5), ("1", "", 4), ("2", "c", 1)], &[]),
                true,
            ),
        ];
        for (index, (later, noticed)) in cases.into_iter().enumerate() {
            let mut handoff = Handoff::new("me", "a", stolen_at, EXPIRATION, None);
            handoff.watch(&baseline);
            handoff.watch(&later);
            assert_eq!(handoff.is_over(stolen_at), noticed, "case {index}");
        }
    }
}
