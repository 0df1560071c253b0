//! Kafka consumer groups (the classic protocol): FindCoordinator, JoinGroup, SyncGroup,
//! Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups and
//! DeleteGroups, so that Kafka clients' consumer groups work unmodified.
//!
//! # What a Kafka group is here
//! A Kafka group is the hub's consumer group of the same name in each topic (event hub) it
//! reads: its committed offsets are that consumer group's checkpoints ([`checkpoints`]), its
//! members' assignments are its ownership records ([`ownership`]). So `tributary group`, the
//! admin API and the dashboard show a Kafka group's positions and owners, `tributary group
//! reset` moves them (refused while members are joined), and event processors and Kafka
//! consumers of one group resume where the other left off. Membership itself (members,
//! generations, the rebalance) lives in memory ([`state`]), as in a Kafka broker after a
//! restart every member rejoins.
//!
//! # Group ids
//! A group id is a consumer group name: 1 to 50 ASCII letters, digits, `.`, `-` and `_`,
//! starting and ending with a letter or digit, or `$Default`; it compares case-insensitively
//! (`Orders` and `orders` are one group). Any other id gets INVALID_GROUP_ID.
//!
//! # Rights
//! Joining needs Listen on every topic the member subscribes to (GROUP_AUTHORIZATION_FAILED);
//! committing and fetching offsets need Listen on the topic (TOPIC_AUTHORIZATION_FAILED per
//! partition); a group is described and listed to logins that may Listen on one of its topics;
//! deleting needs Manage on every hub that has the consumer group.
//!
//! # Guarantees
//! - The state machine follows Kafka's (see [`state`]); its timers run on tokio's clock in one
//!   task that sleeps until the next deadline of any group (no polling).
//! - A JoinGroup or SyncGroup that waits holds only its own connection: every connection is its
//!   own task, and the coordinator's lock is never held across an await.
//! - Bounded: at most [`GROUPS_MAX`] groups with members, [`GROUP_MEMBERS_MAX`] members and
//!   [`GROUP_METADATA_BYTES_MAX`] of metadata per group (`crate::limits`).
//! - Deleting a group deletes the consumer group in every hub that has it, with its
//!   checkpoints and ownership records; `$Default` cannot be deleted (INVALID_GROUP_ID).

mod api;
pub(crate) mod checkpoints;
mod commit;
pub(crate) mod ownership;
pub(crate) mod state;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use bytes::{Buf, Bytes};
use kafka_protocol::protocol::Decodable;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tributary_broker::Broker;
use tributary_event::names::name_key;

pub(crate) use api::{answer, answers};
use ownership::GroupEffect;
use state::Group;

use crate::limits::GROUPS_MAX;
#[cfg(doc)]
use crate::limits::{GROUP_MEMBERS_MAX, GROUP_METADATA_BYTES_MAX};

/// The groups of one door.
#[derive(Debug)]
pub(crate) struct Coordinator {
    inner: Mutex<Inner>,
    /// Wakes the timer task when a deadline earlier than the one it sleeps for appears.
    wake: Notify,
    effects: mpsc::Sender<GroupEffect>,
    /// The timer and ownership tasks, awaited by [`Coordinator::stopped`].
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The broker whose doors share it ([`Coordinator::of`]).
    broker: Broker,
    /// Stops the tasks once the last door sharing it is done ([`Coordinator::release`]).
    stop: watch::Sender<bool>,
}

/// The coordinators of the brokers whose Kafka doors run in this process, each with how many
/// doors use it: every door of one broker (its plain and TLS listeners) shares one, so a group
/// is one group whichever listener its members come through.
static SHARED: std::sync::OnceLock<Mutex<Shared>> = std::sync::OnceLock::new();

/// Each shared coordinator with the number of doors using it.
type Shared = Vec<(Arc<Coordinator>, usize)>;

fn shared() -> std::sync::MutexGuard<'static, Shared> {
    SHARED
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Debug, Default)]
struct Inner {
    groups: HashMap<String, Entry>,
    /// Each group's next deadline, by deadline.
    timers: BTreeSet<(Instant, String)>,
}

/// One group with members, under its key.
#[derive(Debug)]
struct Entry {
    /// The id as the first member gave it.
    name: String,
    group: Group,
    /// The topics its members subscribed to (for who may see it).
    topics: BTreeSet<String>,
    /// Its entry in [`Inner::timers`].
    scheduled: Option<Instant>,
}

/// A group as DescribeGroups and ListGroups show it.
#[derive(Debug, Clone)]
pub(crate) struct GroupView {
    pub(crate) name: String,
    pub(crate) state: &'static str,
    pub(crate) protocol_type: String,
    pub(crate) protocol: String,
    pub(crate) topics: BTreeSet<String>,
    /// Member id, instance id, client id, client host, metadata, assignment.
    pub(crate) members: Vec<MemberView>,
}

/// A member as DescribeGroups shows it.
#[derive(Debug, Clone)]
pub(crate) struct MemberView {
    pub(crate) id: String,
    pub(crate) instance_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    pub(crate) metadata: bytes::Bytes,
    pub(crate) assignment: bytes::Bytes,
}

impl Coordinator {
    /// A coordinator over `broker`'s hubs, with its timer and ownership tasks; both end at
    /// `shutdown`.
    #[cfg(test)]
    pub(crate) fn start(broker: &Broker, shutdown: watch::Receiver<bool>) -> Arc<Self> {
        let (stop, _) = watch::channel(false);
        Self::start_with(broker, shutdown, stop)
    }

    /// The coordinator `broker`'s doors share: the one its other doors use, or a new one. Each
    /// door that gets it must [`Coordinator::release`] it when it is done.
    pub(crate) fn of(broker: &Broker) -> Arc<Self> {
        let mut shared = shared();
        if let Some((coordinator, users)) =
            shared.iter_mut().find(|(c, _)| c.broker.same_as(broker))
        {
            *users += 1;
            return coordinator.clone();
        }
        let (stop, stopped) = watch::channel(false);
        let coordinator = Self::start_with(broker, stopped, stop);
        shared.push((coordinator.clone(), 1));
        coordinator
    }

    /// A door is done with the coordinator: the last one stops its tasks and waits for them,
    /// so that nothing of the doors still holds the broker.
    pub(crate) async fn release(self: &Arc<Self>) {
        let last = {
            let mut shared = shared();
            let at = shared.iter().position(|(c, _)| Arc::ptr_eq(c, self));
            match at {
                Some(at) if shared[at].1 > 1 => {
                    shared[at].1 -= 1;
                    false
                }
                Some(at) => {
                    shared.swap_remove(at);
                    true
                }
                None => true,
            }
        };
        if last {
            let _ = self.stop.send(true);
            self.stopped().await;
        }
    }

    fn start_with(
        broker: &Broker,
        shutdown: watch::Receiver<bool>,
        stop: watch::Sender<bool>,
    ) -> Arc<Self> {
        let (effects, worker) = ownership::start(broker.clone(), shutdown.clone());
        let coordinator = Arc::new(Coordinator {
            inner: Mutex::new(Inner::default()),
            wake: Notify::new(),
            effects,
            tasks: Mutex::new(vec![worker]),
            broker: broker.clone(),
            stop,
        });
        let timers = tokio::spawn(run_timers(coordinator.clone(), shutdown));
        coordinator
            .tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(timers);
        coordinator
    }

    /// Waits, after shutdown, for the timer and ownership tasks to end.
    async fn stopped(&self) {
        let tasks = std::mem::take(
            &mut *self
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for task in tasks {
            let _ = task.await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `work` on group `name` at tokio's now; `None` when the group has no members and
    /// `create` is false, or there are [`GROUPS_MAX`] groups already. Afterwards the group's
    /// timer is set again, its effects are queued, and a dead group is forgotten.
    pub(crate) fn with_group<R>(
        &self,
        name: &str,
        create: bool,
        topics: &[String],
        work: impl FnOnce(&mut Group, Instant) -> R,
    ) -> Option<R> {
        let key = name_key(name);
        let now = Instant::now();
        let mut inner = self.lock();
        if !inner.groups.contains_key(&key) {
            if !create || inner.groups.len() >= GROUPS_MAX {
                return None;
            }
            let entry = Entry {
                name: name.to_owned(),
                group: Group::new(),
                topics: BTreeSet::new(),
                scheduled: None,
            };
            inner.groups.insert(key.clone(), entry);
        }
        let entry = inner.groups.get_mut(&key)?;
        entry.topics.extend(topics.iter().cloned());
        let result = work(&mut entry.group, now);
        self.settle(&mut inner, &key);
        Some(result)
    }

    /// After a change to group `key`: its effects queued, its timer set, forgotten if dead.
    fn settle(&self, inner: &mut Inner, key: &str) {
        let Some(entry) = inner.groups.get_mut(key) else {
            return;
        };
        for effect in entry.group.take_effects() {
            let effect = GroupEffect {
                group: entry.name.clone(),
                effect,
            };
            if self.effects.try_send(effect).is_err() {
                tracing::debug!(group = %entry.name, "a Kafka group's ownership update was dropped (queue full)");
            }
        }
        let old = entry.scheduled.take();
        let dead = entry.group.is_dead();
        let next = if dead {
            None
        } else {
            entry.group.next_deadline()
        };
        entry.scheduled = next;
        if dead {
            inner.groups.remove(key);
        }
        if let Some(old) = old {
            inner.timers.remove(&(old, key.to_owned()));
        }
        if let Some(next) = next {
            inner.timers.insert((next, key.to_owned()));
            if inner
                .timers
                .first()
                .is_some_and(|(first, _)| *first == next)
            {
                self.wake.notify_one();
            }
        }
    }

    /// Runs every due timer; returns the next deadline.
    fn run_due(&self, now: Instant) -> Option<Instant> {
        let mut inner = self.lock();
        while let Some((deadline, key)) = inner.timers.first().cloned() {
            if deadline > now {
                return Some(deadline);
            }
            inner.timers.remove(&(deadline, key.clone()));
            if let Some(entry) = inner.groups.get_mut(&key) {
                entry.scheduled = None;
                entry.group.tick(now);
            }
            self.settle(&mut inner, &key);
        }
        None
    }

    /// Group `name` as DescribeGroups shows it, if it has members.
    pub(crate) fn view(&self, name: &str) -> Option<GroupView> {
        self.lock().groups.get(&name_key(name)).map(view)
    }

    /// Every group with members.
    pub(crate) fn views(&self) -> Vec<GroupView> {
        self.lock().groups.values().map(view).collect()
    }

    /// Whether group `name` has members (or member ids handed out).
    pub(crate) fn has_members(&self, name: &str) -> bool {
        self.lock()
            .groups
            .get(&name_key(name))
            .is_some_and(|e| e.group.has_members())
    }
}

/// Decodes consumer-protocol bytes (a version, then the body: a subscription or an
/// assignment) as `T`, reading versions above `max_version` as `max_version` (later versions
/// only add fields at the end). The body is first probed with every claimed count held to its
/// bytes (`crate::bounded`), so a few bytes claiming billions of topics are refused rather
/// than reserved for. `None` when it is not such a message.
pub fn decode_consumer_protocol<T: Decodable>(mut bytes: Bytes, max_version: i16) -> Option<T> {
    if bytes.remaining() < 2 {
        return None;
    }
    let version = bytes.get_i16();
    if version < 0 {
        return None;
    }
    let version = version.min(max_version);
    crate::bounded::probe::<T>(&bytes, version).ok()?;
    T::decode(&mut bytes, version).ok()
}

fn view(entry: &Entry) -> GroupView {
    let group = &entry.group;
    let stable = group.state() == state::GroupState::Stable;
    let protocol = group.protocol().unwrap_or_default().to_owned();
    GroupView {
        name: entry.name.clone(),
        state: group.state().name(),
        protocol_type: group.protocol_type().unwrap_or_default().to_owned(),
        protocol: protocol.clone(),
        topics: entry.topics.clone(),
        members: group
            .members()
            .map(|m| MemberView {
                id: m.id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: if stable {
                    m.protocols
                        .iter()
                        .find(|p| p.name == protocol)
                        .map(|p| p.metadata.clone())
                        .unwrap_or_default()
                } else {
                    bytes::Bytes::new()
                },
                assignment: if stable {
                    m.assignment.clone()
                } else {
                    bytes::Bytes::new()
                },
            })
            .collect(),
    }
}

/// The timer task: sleeps until the earliest deadline of any group (or until woken for an
/// earlier one), runs what is due, and ends at shutdown.
async fn run_timers(coordinator: Arc<Coordinator>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let next = coordinator.run_due(Instant::now());
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = sleep => {}
            () = coordinator.wake.notified() => {}
            () = crate::connection::stopping(&mut shutdown) => return,
        }
    }
}
