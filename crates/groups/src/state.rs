//! One server-side group in memory: its committed offsets, its live instances and what each
//! holds, and the rules that move them (expiry, rebalancing, fencing, commits).
//!
//! Everything here is synchronous and takes the current monotonic time as an argument, so the
//! rules are tested without sleeping; [`super::GroupCoordinator`] adds persistence and reads.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use super::assignment::{Assignment, assign};
use super::{CoordinatorError, Session};

/// A partition an instance holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Held {
    /// The instance's epoch when it was given the partition.
    pub since_epoch: u64,
    /// The next sequence number this instance reads from it.
    pub fetch: i64,
}

/// What one answer delivered from one partition: sequence numbers `from..to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Delivered {
    pub partition: u32,
    pub from: i64,
    pub to: i64,
    /// The instance's epoch when it was delivered.
    pub epoch: u64,
}

/// A live instance of a group.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    /// The epoch it joined with; cursors from before (an earlier instance of the same name) are
    /// fenced.
    pub join_epoch: u64,
    /// Its current epoch: moves on joining and whenever a partition is taken from it.
    pub epoch: u64,
    pub held: BTreeMap<u32, Held>,
    /// The last answer's batch, to read again if the request is retried.
    pub delivered: Vec<Delivered>,
    /// How many answers it has had; a cursor carries the count it was issued with.
    pub token: u64,
    pub deadline: Instant,
    pub timeout: Duration,
    pub commit_on_get: bool,
    /// Where the next read starts among its partitions, so none starves.
    pub rotation: u32,
}

/// How a request's cursor relates to the instance's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CursorAge {
    /// The cursor of the latest answer.
    Current,
    /// The cursor the latest answer was asked with: a retry of a request whose answer was lost.
    Retry,
}

/// A group.
#[derive(Debug)]
pub(crate) struct GroupState {
    pub stream: String,
    pub group: String,
    pub hub_created_ms: i64,
    /// The next sequence number to read per partition, as committed.
    pub committed: Vec<i64>,
    /// The last epoch handed out (persisted).
    pub epoch: u64,
    /// `epoch` when the group was loaded: cursors at or below it may be from before a restart.
    pub epoch_at_load: u64,
    pub members: BTreeMap<String, Member>,
    pub created_ms: i64,
    pub last_used_ms: i64,
    pub last_used_saved_ms: i64,
    /// Set when the group was deleted while someone held it.
    pub deleted: bool,
}

impl GroupState {
    pub(crate) fn partition_count(&self) -> u32 {
        u32::try_from(self.committed.len()).expect("at most 1024 partitions")
    }

    fn next_epoch(&mut self) -> u64 {
        self.epoch += 1;
        self.epoch
    }

    /// Removes the instances silent past their timeout and rebalances if any went. Returns the
    /// names removed.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<String> {
        let gone: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| now > m.deadline)
            .map(|(name, _)| name.clone())
            .collect();
        for name in &gone {
            self.members.remove(name);
        }
        if !gone.is_empty() {
            self.rebalance();
        }
        gone
    }

    /// Recomputes the assignment for the live instances; an instance that loses a partition
    /// moves to a new epoch (fencing its older cursors' commits), one that gains a partition
    /// starts it at the committed offset.
    pub(crate) fn rebalance(&mut self) {
        let instances: BTreeSet<String> = self.members.keys().cloned().collect();
        let current: Assignment = self
            .members
            .iter()
            .map(|(n, m)| (n.clone(), m.held.keys().copied().collect()))
            .collect();
        let target = assign(self.partition_count(), &instances, &current);
        for (name, partitions) in target {
            let lost: Vec<u32> = {
                let member = &self.members[&name];
                member
                    .held
                    .keys()
                    .filter(|p| !partitions.contains(p))
                    .copied()
                    .collect()
            };
            let epoch = if lost.is_empty() {
                None
            } else {
                Some(self.next_epoch())
            };
            let committed = &self.committed;
            let member = self
                .members
                .get_mut(&name)
                .expect("target names live members");
            if let Some(epoch) = epoch {
                member.epoch = epoch;
            }
            for p in &lost {
                member.held.remove(p);
            }
            member.delivered.retain(|d| !lost.contains(&d.partition));
            for p in partitions {
                member.held.entry(p).or_insert(Held {
                    since_epoch: member.epoch,
                    fetch: committed[p as usize],
                });
            }
        }
        self.assert_exclusive();
    }

    fn assert_exclusive(&self) {
        let mut seen = BTreeSet::new();
        for m in self.members.values() {
            for p in m.held.keys() {
                assert!(seen.insert(*p), "partition {p} is held by two instances");
            }
        }
        if !self.members.is_empty() {
            assert_eq!(seen.len(), self.committed.len(), "every partition is held");
        }
    }

    /// Adds `instance` (or starts a new incarnation of it) with a fresh epoch and rebalances.
    pub(crate) fn join(
        &mut self,
        instance: &str,
        timeout: Duration,
        commit_on_get: bool,
        now: Instant,
    ) {
        let epoch = self.next_epoch();
        let committed = &self.committed;
        let member = self
            .members
            .entry(instance.to_owned())
            .or_insert_with(|| Member {
                join_epoch: epoch,
                epoch,
                held: BTreeMap::new(),
                delivered: Vec::new(),
                token: 0,
                deadline: now,
                timeout,
                commit_on_get,
                rotation: 0,
            });
        // A new incarnation keeps its partitions (sticky) but not its predecessor's reads.
        member.join_epoch = epoch;
        member.epoch = epoch;
        member.delivered.clear();
        member.token = 0;
        member.timeout = timeout;
        member.commit_on_get = commit_on_get;
        member.deadline = now + timeout;
        for (p, held) in &mut member.held {
            held.since_epoch = epoch;
            held.fetch = committed[*p as usize];
        }
        self.rebalance();
    }

    /// Finds the live instance a cursor speaks for, or says why it is fenced. An instance that is
    /// not a member but whose cursor predates the group's loading (a restart) rejoins.
    pub(crate) fn member_for(
        &mut self,
        session: &Session,
        now: Instant,
    ) -> Result<CursorAge, CoordinatorError> {
        if !self.members.contains_key(&session.instance) {
            if session.epoch > self.epoch_at_load {
                return Err(self.fenced(session, "it was removed from the group after being inactive longer than its timeout, and its partitions were reassigned"));
            }
            let timeout = Duration::from_millis(u64::from(session.timeout_ms));
            self.join(&session.instance, timeout, session.commit_on_get, now);
            return Ok(CursorAge::Current);
        }
        let member = &self.members[&session.instance];
        if session.epoch < member.join_epoch || session.epoch > member.epoch {
            return Err(self.fenced(
                session,
                "a newer group cursor was created for this instance",
            ));
        }
        match member.token.checked_sub(session.token) {
            Some(0) => Ok(CursorAge::Current),
            Some(1) => Ok(CursorAge::Retry),
            _ => Err(CoordinatorError::StaleCursor {
                group: self.group.clone(),
                instance: session.instance.clone(),
            }),
        }
    }

    fn fenced(&self, session: &Session, reason: &str) -> CoordinatorError {
        CoordinatorError::Fenced {
            stream: self.stream.clone(),
            group: self.group.clone(),
            instance: session.instance.clone(),
            reason: reason.to_owned(),
        }
    }

    /// What committing the instance's reads so far means: for every partition it holds, its
    /// read position where that is past the committed one. Partitions taken away are not
    /// among them (their new holder reads them again from the committed offset), and a
    /// partition given back later starts again at the committed offset.
    pub(crate) fn uncommitted(&self, instance: &str) -> Vec<(u32, i64)> {
        let member = &self.members[instance];
        member
            .held
            .iter()
            .filter(|(p, h)| {
                let committed = self.committed[**p as usize];
                assert!(
                    h.fetch >= committed,
                    "an instance never reads behind the committed offset"
                );
                h.fetch > committed
            })
            .map(|(p, h)| (*p, h.fetch))
            .collect()
    }

    /// Records commits (already persisted).
    pub(crate) fn apply_commits(&mut self, commits: &[(u32, i64)]) {
        for &(p, next) in commits {
            assert!(next >= 0, "a committed position is a sequence number");
            self.committed[p as usize] = next;
        }
    }

    /// For a retried request: reads the last batch again from where it started.
    pub(crate) fn rewind(&mut self, instance: &str) {
        let member = self.members.get_mut(instance).expect("a live member");
        let delivered = std::mem::take(&mut member.delivered);
        for d in delivered {
            let committed = self.committed[d.partition as usize];
            if let Some(h) = member.held.get_mut(&d.partition)
                && h.since_epoch <= d.epoch
            {
                // Never behind the committed offset: an explicit commit may have covered it.
                h.fetch = d.from.max(committed);
            }
        }
    }

    /// Sets every partition's committed position and makes every instance read from there.
    pub(crate) fn reset(&mut self, positions: &[i64]) {
        assert_eq!(positions.len(), self.committed.len());
        self.committed.copy_from_slice(positions);
        for m in self.members.values_mut() {
            m.delivered.clear();
            for (p, h) in &mut m.held {
                h.fetch = positions[*p as usize];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(partitions: usize) -> GroupState {
        GroupState {
            stream: "s".into(),
            group: "g".into(),
            hub_created_ms: 0,
            committed: vec![0; partitions],
            epoch: 0,
            epoch_at_load: 0,
            members: BTreeMap::new(),
            created_ms: 0,
            last_used_ms: 0,
            last_used_saved_ms: 0,
            deleted: false,
        }
    }

    fn session(g: &GroupState, instance: &str) -> Session {
        let m = &g.members[instance];
        Session {
            stream: "s".into(),
            group: "g".into(),
            instance: instance.into(),
            epoch: m.epoch,
            token: m.token,
            commit_on_get: true,
            timeout_ms: 1000,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_removed_instance_is_fenced_and_a_newer_incarnation_fences_the_older() {
        let mut g = group(2);
        let now = Instant::now();
        g.join("a", Duration::from_secs(1), true, now);
        let old = session(&g, "a");
        g.join("a", Duration::from_secs(1), true, now);
        assert!(matches!(
            g.member_for(&old, now),
            Err(CoordinatorError::Fenced { .. })
        ));
        let current = session(&g, "a");
        assert_eq!(g.member_for(&current, now).unwrap(), CursorAge::Current);
        assert_eq!(
            g.expire(now + Duration::from_millis(1001)),
            vec!["a".to_owned()]
        );
        assert!(matches!(
            g.member_for(&current, now),
            Err(CoordinatorError::Fenced { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cursor_from_before_a_restart_rejoins() {
        let mut g = group(2);
        g.epoch = 7;
        g.epoch_at_load = 7;
        let s = Session {
            stream: "s".into(),
            group: "g".into(),
            instance: "a".into(),
            epoch: 5,
            token: 3,
            commit_on_get: true,
            timeout_ms: 1000,
        };
        assert_eq!(
            g.member_for(&s, Instant::now()).unwrap(),
            CursorAge::Current
        );
        assert_eq!(g.members["a"].epoch, 8);
        assert_eq!(g.members["a"].held.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn commits_skip_partitions_taken_away() {
        let mut g = group(2);
        let now = Instant::now();
        g.join("a", Duration::from_secs(10), true, now);
        let epoch = g.members["a"].epoch;
        for h in g.members.get_mut("a").unwrap().held.values_mut() {
            h.fetch = 5;
        }
        g.join("b", Duration::from_secs(10), true, now);
        let kept: Vec<u32> = g.members["a"].held.keys().copied().collect();
        assert_eq!(kept.len(), 1);
        assert!(
            g.members["a"].epoch > epoch,
            "losing a partition moves the epoch"
        );
        assert_eq!(g.uncommitted("a"), vec![(kept[0], 5)]);
        assert_eq!(
            g.uncommitted("b"),
            vec![],
            "the new holder starts at the committed offset"
        );
    }
}
