//! One consumer group's membership: the classic Kafka group state machine, without I/O.
//!
//! States: **Empty** (no members), **PreparingRebalance** (collecting JoinGroups),
//! **CompletingRebalance** (waiting for the leader's SyncGroup), **Stable**. A group that is
//! Empty with nobody waiting is dropped by the coordinator (its committed offsets live in the
//! hub, not here): that is Kafka's Dead.
//!
//! # Guarantees
//! - A rebalance completes once every known member (and every member id handed out with
//!   MEMBER_ID_REQUIRED) has rejoined, not before the initial delay of a new group, or at the
//!   rebalance deadline (the largest rebalance timeout of the members), when members that did
//!   not rejoin are removed. Each completion moves the generation on by one.
//! - The protocol chosen is one every member supports (the members' first preferences vote);
//!   a member whose protocols share none with the group's is refused
//!   (INCONSISTENT_GROUP_PROTOCOL) and changes nothing.
//! - Only the leader gets the members' metadata; every member gets the assignment the leader
//!   sent for it, and no member gets an assignment of another generation.
//! - A member silent for its session timeout is removed and the others rebalance; a member
//!   waiting in JoinGroup or SyncGroup is not silent. In CompletingRebalance, members that have
//!   not sent SyncGroup by the rebalance deadline are removed.
//! - Static members (`group.instance.id`): a join with a known instance id and no member id
//!   takes the old member's place under a new member id; the old id is fenced
//!   (FENCED_INSTANCE_ID).
//!
//! Every method takes `now` (tokio's clock) and never waits: a JoinGroup or SyncGroup that must
//! wait gets a receiver the group answers when the rebalance moves on.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::limits::{GROUP_INITIAL_REBALANCE_DELAY, GROUP_MEMBERS_MAX, GROUP_METADATA_BYTES_MAX};

/// Where a group is in the rebalance protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupState {
    /// No members.
    Empty,
    /// Collecting JoinGroups.
    PreparingRebalance,
    /// Waiting for the leader's assignment.
    CompletingRebalance,
    /// Every member has its assignment.
    Stable,
}

impl GroupState {
    /// The name Kafka's DescribeGroups and ListGroups use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

/// One protocol (assignor) a member supports, with its metadata (the subscription).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Protocol {
    /// Its name: `range`, `roundrobin`, `cooperative-sticky`, …
    pub(crate) name: String,
    /// The member's metadata for it.
    pub(crate) metadata: Bytes,
}

/// A JoinGroup, as the group sees it.
#[derive(Debug, Clone)]
pub(crate) struct Join {
    /// `""` on a first join.
    pub(crate) member_id: String,
    /// The static member's `group.instance.id`.
    pub(crate) instance_id: Option<String>,
    /// The client's id (the request header's), for new member ids and DescribeGroups.
    pub(crate) client_id: String,
    /// The client's address, for DescribeGroups.
    pub(crate) client_host: String,
    /// How long the member may be silent.
    pub(crate) session_timeout: Duration,
    /// How long a rebalance waits for the member to rejoin.
    pub(crate) rebalance_timeout: Duration,
    /// `consumer` for consumers.
    pub(crate) protocol_type: String,
    /// In the member's order of preference.
    pub(crate) protocols: Vec<Protocol>,
    /// JoinGroup v4+: a first join gets MEMBER_ID_REQUIRED and a member id to rejoin with.
    pub(crate) member_id_required: bool,
}

/// A JoinGroup's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct JoinAnswer {
    /// The error code (0: joined).
    pub(crate) error: i16,
    /// The generation joined.
    pub(crate) generation: i32,
    /// The group's protocol type.
    pub(crate) protocol_type: Option<String>,
    /// The protocol chosen.
    pub(crate) protocol_name: Option<String>,
    /// The leader's member id.
    pub(crate) leader: String,
    /// The member's id.
    pub(crate) member_id: String,
    /// For the leader only: every member's id, instance id and metadata.
    pub(crate) members: Vec<(String, Option<String>, Bytes)>,
}

impl JoinAnswer {
    fn error(code: ResponseError, member_id: &str) -> Self {
        JoinAnswer {
            error: code.code(),
            generation: -1,
            member_id: member_id.to_owned(),
            ..JoinAnswer::default()
        }
    }
}

/// A SyncGroup's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SyncAnswer {
    /// The error code (0: here is the assignment).
    pub(crate) error: i16,
    /// The group's protocol type.
    pub(crate) protocol_type: Option<String>,
    /// The protocol chosen.
    pub(crate) protocol_name: Option<String>,
    /// The member's assignment.
    pub(crate) assignment: Bytes,
}

impl SyncAnswer {
    fn error(code: ResponseError) -> Self {
        SyncAnswer {
            error: code.code(),
            ..SyncAnswer::default()
        }
    }
}

/// What the group asks its owner to do outside the state machine (the hub's ownership records).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    /// The member got this assignment (a `ConsumerProtocolAssignment` for consumers).
    Assigned {
        /// The member.
        member: String,
        /// Its assignment, as the leader sent it.
        assignment: Bytes,
    },
    /// The member left or was removed.
    Released {
        /// The member.
        member: String,
    },
    /// The member proved it is alive (a heartbeat or a commit).
    Alive {
        /// The member.
        member: String,
    },
}

/// One member.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    pub(crate) protocols: Vec<Protocol>,
    pub(crate) assignment: Bytes,
    join_waiter: Option<oneshot::Sender<JoinAnswer>>,
    sync_waiter: Option<oneshot::Sender<SyncAnswer>>,
    session_deadline: Instant,
}

impl Member {
    fn metadata_bytes(&self) -> usize {
        self.protocols
            .iter()
            .map(|p| p.metadata.len())
            .sum::<usize>()
            + self.assignment.len()
    }

    fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|p| p.name == protocol)
            .map(|p| p.metadata.clone())
            .unwrap_or_default()
    }
}

/// One group's membership (see the module docs).
#[derive(Debug)]
pub(crate) struct Group {
    state: GroupState,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    /// Member ids handed out with MEMBER_ID_REQUIRED, until when they may join.
    pending: HashMap<String, Instant>,
    /// Static members: instance id → member id.
    instances: HashMap<String, String>,
    /// PreparingRebalance: when members that did not rejoin are removed; CompletingRebalance:
    /// when members that did not sync are.
    rebalance_deadline: Option<Instant>,
    /// A new group's first rebalance completes no earlier than this.
    join_not_before: Option<Instant>,
    effects: Vec<Effect>,
}

/// The outcome of checking a member's request against the group.
type Checked = Result<(), ResponseError>;

impl Group {
    /// An Empty group.
    pub(crate) fn new() -> Self {
        Group {
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            pending: HashMap::new(),
            instances: HashMap::new(),
            rebalance_deadline: None,
            join_not_before: None,
            effects: Vec::new(),
        }
    }

    /// Where it is.
    pub(crate) fn state(&self) -> GroupState {
        self.state
    }

    /// Its generation.
    #[cfg(test)]
    pub(crate) fn generation(&self) -> i32 {
        self.generation
    }

    /// Its protocol type, once a member joined.
    pub(crate) fn protocol_type(&self) -> Option<&str> {
        self.protocol_type.as_deref()
    }

    /// The protocol chosen at the last rebalance.
    pub(crate) fn protocol(&self) -> Option<&str> {
        self.protocol.as_deref()
    }

    /// Its members.
    pub(crate) fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// Whether it has members (or member ids handed out).
    pub(crate) fn has_members(&self) -> bool {
        !self.members.is_empty() || !self.pending.is_empty()
    }

    /// Whether the coordinator may forget it: Empty, with nobody joined or about to.
    pub(crate) fn is_dead(&self) -> bool {
        self.state == GroupState::Empty && !self.has_members()
    }

    /// The effects since the last call.
    pub(crate) fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// The next moment [`Group::tick`] has something to do.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let sessions = self
            .members
            .values()
            .filter(|m| m.join_waiter.is_none() && m.sync_waiter.is_none())
            .map(|m| m.session_deadline);
        let rebalance = match self.state {
            GroupState::PreparingRebalance => [self.rebalance_deadline, self.join_not_before],
            GroupState::CompletingRebalance => [self.rebalance_deadline, None],
            _ => [None, None],
        };
        sessions
            .chain(self.pending.values().copied())
            .chain(rebalance.into_iter().flatten())
            .min()
    }

    /// A JoinGroup; the receiver gets the answer, now or when the rebalance completes.
    pub(crate) fn join(&mut self, join: Join, now: Instant) -> oneshot::Receiver<JoinAnswer> {
        let (tx, rx) = oneshot::channel();
        let admitted = self
            .check_protocols(&join)
            .and_then(|()| self.check_metadata_size(&join))
            .and_then(|()| self.admit(&join, now));
        match admitted {
            Ok(Admission::Member(id)) => {
                self.join_known(&id, join, tx, now);
                self.maybe_complete_join(now);
            }
            Ok(Admission::IdRequired(id)) => {
                let _ = tx.send(JoinAnswer::error(ResponseError::MemberIdRequired, &id));
            }
            Err(code) => {
                let _ = tx.send(JoinAnswer::error(code, &join.member_id));
            }
        }
        rx
    }

    /// The protocols every member but `except` supports; `None` when there is no such member.
    fn candidates(&self, except: &str) -> Option<Vec<&str>> {
        let mut others = self.members.values().filter(|m| m.id != except);
        let first = others.next()?;
        let mut names: Vec<&str> = first.protocols.iter().map(|p| p.name.as_str()).collect();
        for member in others {
            names.retain(|name| member.protocols.iter().any(|p| p.name == *name));
        }
        Some(names)
    }

    /// INCONSISTENT_GROUP_PROTOCOL unless the join's protocol type is the group's and one of its
    /// protocols is supported by every other member.
    fn check_protocols(&self, join: &Join) -> Checked {
        let inconsistent = Err(ResponseError::InconsistentGroupProtocol);
        if join.protocol_type.is_empty() || join.protocols.is_empty() {
            return inconsistent;
        }
        let Some(candidates) = self.candidates(&join.member_id) else {
            return Ok(());
        };
        let same_type = self.protocol_type.as_deref() == Some(join.protocol_type.as_str());
        if !same_type
            || !join
                .protocols
                .iter()
                .any(|p| candidates.contains(&p.name.as_str()))
        {
            return inconsistent;
        }
        Ok(())
    }

    /// GROUP_MAX_SIZE_REACHED if the join would make the group's metadata too large.
    fn check_metadata_size(&self, join: &Join) -> Checked {
        let others: usize = self
            .members
            .values()
            .filter(|m| m.id != join.member_id)
            .map(Member::metadata_bytes)
            .sum();
        let joining: usize = join.protocols.iter().map(|p| p.metadata.len()).sum();
        if others + joining > GROUP_METADATA_BYTES_MAX {
            return Err(ResponseError::GroupMaxSizeReached);
        }
        Ok(())
    }

    /// A member id for a new member: its instance id or client id, a dash and a UUID.
    fn new_member_id(join: &Join) -> String {
        let prefix = join.instance_id.as_deref().unwrap_or(&join.client_id);
        let mut end = prefix.len().min(MEMBER_ID_PREFIX_BYTES_MAX);
        while !prefix.is_char_boundary(end) {
            end -= 1;
        }
        let prefix = if end == 0 { "member" } else { &prefix[..end] };
        format!("{prefix}-{}", uuid::Uuid::new_v4())
    }

    /// Who the join is from: a known member, a new one, or a refusal.
    fn admit(&mut self, join: &Join, now: Instant) -> Result<Admission, ResponseError> {
        if !join.member_id.is_empty() {
            let id = join.member_id.clone();
            self.check_instance(&id, join.instance_id.as_deref())?;
            if self.pending.remove(&id).is_some() {
                self.add_member(&id, join, now);
            } else if !self.members.contains_key(&id) {
                return Err(ResponseError::UnknownMemberId);
            }
            return Ok(Admission::Member(id));
        }
        let id = Self::new_member_id(join);
        if let Some(instance) = &join.instance_id {
            if let Some(old) = self.instances.get(instance).cloned() {
                self.replace_static_member(&old, &id);
            } else {
                self.check_room()?;
                self.add_member(&id, join, now);
            }
            self.instances.insert(instance.clone(), id.clone());
            return Ok(Admission::Member(id));
        }
        self.check_room()?;
        if join.member_id_required {
            self.pending.insert(id.clone(), now + join.session_timeout);
            return Ok(Admission::IdRequired(id));
        }
        self.add_member(&id, join, now);
        Ok(Admission::Member(id))
    }

    /// GROUP_MAX_SIZE_REACHED when the group is full.
    fn check_room(&self) -> Checked {
        if self.members.len() + self.pending.len() >= GROUP_MEMBERS_MAX {
            return Err(ResponseError::GroupMaxSizeReached);
        }
        Ok(())
    }

    /// FENCED_INSTANCE_ID when `instance` belongs to another member id.
    fn check_instance(&self, id: &str, instance: Option<&str>) -> Checked {
        match instance.and_then(|i| self.instances.get(i)) {
            Some(owner) if owner != id => Err(ResponseError::FencedInstanceId),
            _ => Ok(()),
        }
    }

    /// UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID unless `id` is a member (with that instance).
    fn check_member(&self, id: &str, instance: Option<&str>) -> Checked {
        self.check_instance(id, instance)?;
        if !self.members.contains_key(id) {
            return Err(ResponseError::UnknownMemberId);
        }
        Ok(())
    }

    fn add_member(&mut self, id: &str, join: &Join, now: Instant) {
        let member = Member {
            id: id.to_owned(),
            instance_id: join.instance_id.clone(),
            client_id: join.client_id.clone(),
            client_host: join.client_host.clone(),
            session_timeout: join.session_timeout,
            rebalance_timeout: join.rebalance_timeout,
            protocols: Vec::new(),
            assignment: Bytes::new(),
            join_waiter: None,
            sync_waiter: None,
            session_deadline: now + join.session_timeout,
        };
        self.members.insert(id.to_owned(), member);
    }

    /// A static member rejoined without its member id: `new` takes `old`'s place, and whatever
    /// `old` was waiting for is answered FENCED_INSTANCE_ID.
    fn replace_static_member(&mut self, old: &str, new: &str) {
        let Some(mut member) = self.members.remove(old) else {
            return;
        };
        if let Some(waiter) = member.join_waiter.take() {
            let _ = waiter.send(JoinAnswer::error(ResponseError::FencedInstanceId, old));
        }
        if let Some(waiter) = member.sync_waiter.take() {
            let _ = waiter.send(SyncAnswer::error(ResponseError::FencedInstanceId));
        }
        member.id = new.to_owned();
        if self.leader.as_deref() == Some(old) {
            self.leader = Some(new.to_owned());
        }
        self.members.insert(new.to_owned(), member);
        self.effects.push(Effect::Released {
            member: old.to_owned(),
        });
    }

    /// A known member's join: answered now when nothing changes, else it waits for the
    /// rebalance (starting one if needed).
    fn join_known(&mut self, id: &str, join: Join, tx: oneshot::Sender<JoinAnswer>, now: Instant) {
        let Some(member) = self.members.get_mut(id) else {
            let _ = tx.send(JoinAnswer::error(ResponseError::UnknownMemberId, id));
            return;
        };
        let changed = member.protocols != join.protocols;
        member.protocols = join.protocols;
        member.session_timeout = join.session_timeout;
        member.rebalance_timeout = join.rebalance_timeout;
        member.client_id = join.client_id;
        member.client_host = join.client_host;
        member.session_deadline = now + member.session_timeout;
        if let Some(earlier) = member.join_waiter.take() {
            let _ = earlier.send(JoinAnswer::error(ResponseError::RebalanceInProgress, id));
        }
        if self.protocol_type.is_none() {
            self.protocol_type = Some(join.protocol_type);
        }
        let is_leader = self.leader.as_deref() == Some(id);
        let unchanged_now = match self.state {
            GroupState::Stable => !changed && !is_leader,
            GroupState::CompletingRebalance => !changed,
            _ => false,
        };
        if unchanged_now {
            let _ = tx.send(self.join_answer(id));
            return;
        }
        if let Some(member) = self.members.get_mut(id) {
            member.join_waiter = Some(tx);
        }
        if self.state != GroupState::PreparingRebalance {
            self.prepare_rebalance(now);
        }
    }

    /// The answer for `id` at the current generation (the leader gets the members).
    fn join_answer(&self, id: &str) -> JoinAnswer {
        let protocol = self.protocol.clone().unwrap_or_default();
        let leader = self.leader.clone().unwrap_or_default();
        let members = if leader == id {
            self.members
                .values()
                .map(|m| (m.id.clone(), m.instance_id.clone(), m.metadata(&protocol)))
                .collect()
        } else {
            Vec::new()
        };
        JoinAnswer {
            error: 0,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: Some(protocol),
            leader,
            member_id: id.to_owned(),
            members,
        }
    }

    /// The longest rebalance timeout of the members.
    fn rebalance_timeout(&self) -> Duration {
        self.members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Starts a rebalance: waiting syncs are told to rejoin, assignments are dropped.
    fn prepare_rebalance(&mut self, now: Instant) {
        for member in self.members.values_mut() {
            if let Some(waiter) = member.sync_waiter.take() {
                let _ = waiter.send(SyncAnswer::error(ResponseError::RebalanceInProgress));
            }
            member.assignment = Bytes::new();
        }
        let was_empty = self.state == GroupState::Empty;
        self.state = GroupState::PreparingRebalance;
        let timeout = self.rebalance_timeout();
        self.rebalance_deadline = Some(now + timeout);
        self.join_not_before = was_empty.then(|| now + GROUP_INITIAL_REBALANCE_DELAY.min(timeout));
    }

    /// Completes the rebalance when everyone rejoined (after a new group's initial delay) or
    /// its deadline passed.
    fn maybe_complete_join(&mut self, now: Instant) {
        if self.state != GroupState::PreparingRebalance {
            return;
        }
        let all_joined =
            self.pending.is_empty() && self.members.values().all(|m| m.join_waiter.is_some());
        let delay_over = self.join_not_before.is_none_or(|t| now >= t);
        let deadline_passed = self.rebalance_deadline.is_some_and(|t| now >= t);
        if (all_joined && delay_over) || deadline_passed {
            self.complete_join(now);
        }
    }

    /// The next generation: members that did not rejoin are removed, a protocol is chosen and
    /// every joined member is answered (the leader with the members' metadata).
    fn complete_join(&mut self, now: Instant) {
        let gone: Vec<String> = self
            .members
            .values()
            .filter(|m| m.join_waiter.is_none())
            .map(|m| m.id.clone())
            .collect();
        for id in gone {
            self.remove_member(&id);
        }
        self.generation = self.generation.wrapping_add(1).max(1);
        self.join_not_before = None;
        if self.members.is_empty() {
            self.state = GroupState::Empty;
            self.rebalance_deadline = None;
            self.protocol = None;
            self.leader = None;
            return;
        }
        self.protocol = self.select_protocol();
        if !self
            .leader
            .as_ref()
            .is_some_and(|l| self.members.contains_key(l))
        {
            self.leader = self.members.keys().next().cloned();
        }
        self.state = GroupState::CompletingRebalance;
        self.rebalance_deadline = Some(now + self.rebalance_timeout());
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let answer = self.join_answer(&id);
            if let Some(member) = self.members.get_mut(&id) {
                member.session_deadline = now + member.session_timeout;
                if let Some(waiter) = member.join_waiter.take() {
                    let _ = waiter.send(answer);
                }
            }
        }
    }

    /// The protocol every member supports that most members prefer.
    fn select_protocol(&self) -> Option<String> {
        let candidates = self.candidates("")?;
        let mut votes: Vec<(&str, usize)> = candidates.iter().map(|c| (*c, 0)).collect();
        for member in self.members.values() {
            let choice = member
                .protocols
                .iter()
                .find(|p| candidates.contains(&p.name.as_str()));
            if let Some(vote) = choice.and_then(|p| votes.iter_mut().find(|(n, _)| *n == p.name)) {
                vote.1 += 1;
            }
        }
        // The first of the most voted, in the first member's order of preference.
        let most = votes.iter().map(|(_, n)| *n).max()?;
        votes
            .iter()
            .find(|(_, n)| *n == most)
            .map(|(name, _)| (*name).to_owned())
    }

    /// Removes a member; whatever it waits for is answered UNKNOWN_MEMBER_ID.
    fn remove_member(&mut self, id: &str) {
        let Some(mut member) = self.members.remove(id) else {
            return;
        };
        if let Some(waiter) = member.join_waiter.take() {
            let _ = waiter.send(JoinAnswer::error(ResponseError::UnknownMemberId, id));
        }
        if let Some(waiter) = member.sync_waiter.take() {
            let _ = waiter.send(SyncAnswer::error(ResponseError::UnknownMemberId));
        }
        self.instances.retain(|_, member| member != id);
        if self.leader.as_deref() == Some(id) {
            self.leader = None;
        }
        self.effects.push(Effect::Released {
            member: id.to_owned(),
        });
    }

    /// After members left: the others rebalance.
    fn members_gone(&mut self, now: Instant) {
        if matches!(
            self.state,
            GroupState::Stable | GroupState::CompletingRebalance
        ) {
            self.prepare_rebalance(now);
        }
        self.maybe_complete_join(now);
    }

    /// A SyncGroup; the receiver gets the member's assignment, now or once the leader sent it.
    pub(crate) fn sync(&mut self, sync: Sync, now: Instant) -> oneshot::Receiver<SyncAnswer> {
        let (tx, rx) = oneshot::channel();
        if let Err(code) = self.check_sync(&sync) {
            let _ = tx.send(SyncAnswer::error(code));
            return rx;
        }
        let id = sync.member_id;
        if let Some(member) = self.members.get_mut(&id) {
            member.session_deadline = now + member.session_timeout;
        }
        match self.state {
            GroupState::Stable => {
                let _ = tx.send(self.sync_answer(&id));
            }
            GroupState::CompletingRebalance => {
                if let Some(member) = self.members.get_mut(&id)
                    && let Some(earlier) = member.sync_waiter.replace(tx)
                {
                    let _ = earlier.send(SyncAnswer::error(ResponseError::RebalanceInProgress));
                }
                if self.leader.as_deref() == Some(id.as_str()) {
                    self.assign(sync.assignments);
                }
            }
            GroupState::Empty => {
                let _ = tx.send(SyncAnswer::error(ResponseError::UnknownMemberId));
            }
            GroupState::PreparingRebalance => {
                let _ = tx.send(SyncAnswer::error(ResponseError::RebalanceInProgress));
            }
        }
        rx
    }

    fn check_sync(&self, sync: &Sync) -> Checked {
        self.check_member(&sync.member_id, sync.instance_id.as_deref())?;
        if sync.generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        let differs = |asked: &Option<String>, ours: &Option<String>| {
            asked.as_ref().is_some_and(|a| Some(a) != ours.as_ref())
        };
        if differs(&sync.protocol_type, &self.protocol_type)
            || differs(&sync.protocol_name, &self.protocol)
        {
            return Err(ResponseError::InconsistentGroupProtocol);
        }
        Ok(())
    }

    fn sync_answer(&self, id: &str) -> SyncAnswer {
        SyncAnswer {
            error: 0,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            assignment: self
                .members
                .get(id)
                .map(|m| m.assignment.clone())
                .unwrap_or_default(),
        }
    }

    /// The leader's assignments: the group is Stable and every waiting member is answered.
    fn assign(&mut self, assignments: Vec<(String, Bytes)>) {
        for (id, assignment) in assignments {
            if let Some(member) = self.members.get_mut(&id) {
                member.assignment = assignment;
            }
        }
        self.state = GroupState::Stable;
        self.rebalance_deadline = None;
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let answer = self.sync_answer(&id);
            if let Some(member) = self.members.get_mut(&id) {
                if let Some(waiter) = member.sync_waiter.take() {
                    let _ = waiter.send(answer.clone());
                }
                self.effects.push(Effect::Assigned {
                    member: id,
                    assignment: answer.assignment,
                });
            }
        }
    }

    /// A Heartbeat's error code.
    pub(crate) fn heartbeat(&mut self, beat: &Beat, now: Instant) -> i16 {
        let checked = self
            .check_member(&beat.member_id, beat.instance_id.as_deref())
            .and_then(|()| {
                (beat.generation == self.generation)
                    .then_some(())
                    .ok_or(ResponseError::IllegalGeneration)
            });
        if let Err(code) = checked {
            return code.code();
        }
        self.alive(&beat.member_id, now);
        match self.state {
            GroupState::Empty => ResponseError::UnknownMemberId.code(),
            GroupState::PreparingRebalance => ResponseError::RebalanceInProgress.code(),
            GroupState::CompletingRebalance | GroupState::Stable => 0,
        }
    }

    /// A member proved it is alive: its session starts again.
    fn alive(&mut self, id: &str, now: Instant) {
        if let Some(member) = self.members.get_mut(id) {
            member.session_deadline = now + member.session_timeout;
            self.effects.push(Effect::Alive {
                member: id.to_owned(),
            });
        }
    }

    /// A LeaveGroup of one member (by member id, or by instance id alone); its error code.
    pub(crate) fn leave(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        now: Instant,
    ) -> i16 {
        let id = match (member_id, instance_id) {
            ("", Some(instance)) => match self.instances.get(instance) {
                Some(id) => id.clone(),
                None => return ResponseError::UnknownMemberId.code(),
            },
            (id, instance) => {
                if let Err(code) = self.check_instance(id, instance) {
                    return code.code();
                }
                id.to_owned()
            }
        };
        if self.pending.remove(&id).is_some() {
            return 0;
        }
        if !self.members.contains_key(&id) {
            return ResponseError::UnknownMemberId.code();
        }
        self.remove_member(&id);
        self.members_gone(now);
        0
    }

    /// Whether an OffsetCommit may commit: `Ok(None)` for a commit from outside the group
    /// (generation −1, no member id, the group Empty), `Ok(Some(member))` for a member's.
    pub(crate) fn check_commit(
        &mut self,
        beat: &Beat,
        now: Instant,
    ) -> Result<Option<String>, ResponseError> {
        if beat.generation < 0 && beat.member_id.is_empty() && self.state == GroupState::Empty {
            return Ok(None);
        }
        self.check_member(&beat.member_id, beat.instance_id.as_deref())?;
        if beat.generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        match self.state {
            GroupState::CompletingRebalance => Err(ResponseError::RebalanceInProgress),
            GroupState::Empty => Err(ResponseError::UnknownMemberId),
            GroupState::Stable | GroupState::PreparingRebalance => {
                self.alive(&beat.member_id, now);
                Ok(Some(beat.member_id.clone()))
            }
        }
    }

    /// Removes silent members, members that missed a rebalance deadline and expired member
    /// ids, and moves the rebalance on.
    pub(crate) fn tick(&mut self, now: Instant) {
        self.pending.retain(|_, deadline| *deadline > now);
        let silent: Vec<String> = self
            .members
            .values()
            .filter(|m| m.join_waiter.is_none() && m.sync_waiter.is_none())
            .filter(|m| m.session_deadline <= now)
            .map(|m| m.id.clone())
            .collect();
        let mut gone = !silent.is_empty();
        for id in silent {
            self.remove_member(&id);
        }
        let deadline_passed = self.rebalance_deadline.is_some_and(|t| now >= t);
        if self.state == GroupState::CompletingRebalance && deadline_passed {
            let unsynced: Vec<String> = self
                .members
                .values()
                .filter(|m| m.sync_waiter.is_none())
                .map(|m| m.id.clone())
                .collect();
            gone |= !unsynced.is_empty();
            for id in unsynced {
                self.remove_member(&id);
            }
        }
        if gone {
            self.members_gone(now);
        } else {
            self.maybe_complete_join(now);
        }
    }
}

/// The longest client id or instance id a new member id starts with.
const MEMBER_ID_PREFIX_BYTES_MAX: usize = 64;

/// Who a join is from.
enum Admission {
    /// A member (known, or new and admitted).
    Member(String),
    /// A new member given this id, to rejoin with (MEMBER_ID_REQUIRED).
    IdRequired(String),
}

/// A SyncGroup, as the group sees it.
#[derive(Debug, Clone)]
pub(crate) struct Sync {
    pub(crate) member_id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) generation: i32,
    pub(crate) protocol_type: Option<String>,
    pub(crate) protocol_name: Option<String>,
    /// The leader's assignments, by member id.
    pub(crate) assignments: Vec<(String, Bytes)>,
}

/// Who a Heartbeat or an OffsetCommit is from.
#[derive(Debug, Clone)]
pub(crate) struct Beat {
    pub(crate) member_id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) generation: i32,
}
