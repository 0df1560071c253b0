//! The group coordinator: server-side consumer groups, as OCI Streaming has them.
//!
//! This crate owns the groups the OCI Streaming API of the HTTP front door (`tributary-http`)
//! serves: membership, partition assignment, cursors' fencing and committed offsets, with their
//! own SQLite database. It reads through the broker's public API and the broker knows nothing of
//! it: whoever serves these groups opens the coordinator over a [`Broker`].
//!
//! A [`GroupCoordinator`] runs over a [`Broker`] and keeps, per stream (event hub), up to
//! [`CoordinatorConfig::groups_per_stream_max`] groups. A group is created by the first
//! [`GroupCoordinator::join`] that names it, starting every partition at the trim horizon, the
//! latest message or a point in time; later joins ignore the start position and use the group's
//! committed offsets. The instances of a group share its partitions: each partition is held by
//! exactly one live instance, each instance holds `P/N ± 1` (see [`assignment`]), instances
//! beyond the partition count hold nothing and get empty answers.
//!
//! # Delivery guarantees
//! At least once, nothing lost. An answer to [`GroupCoordinator::get`] reads the instance's
//! partitions from where it last read; with commit-on-get (the default) the *next* get commits
//! the batch before it, so a batch is committed only after the instance asked for more. An
//! instance silent for longer than its timeout is removed on the next request that reaches the
//! group (any instance's get, commit, heartbeat, or a describe), and its partitions go to the
//! others from the last committed offset: whatever it had not committed is delivered again.
//! A request retried with the previous cursor (its answer was lost) gets that batch again rather
//! than losing it.
//!
//! # Fencing
//! Every [`Session`] carries the instance's member epoch (KIP-848 style). An instance's epoch
//! moves when it joins and whenever a partition is taken from it. A cursor of an instance that
//! was removed, or replaced by a newer group cursor for the same instance name, is refused with
//! [`CoordinatorError::Fenced`]; an explicit commit with a cursor from before a partition was
//! taken away is refused the same way and commits nothing; a get with such a cursor is served
//! and commits only the partitions the instance still holds, so no instance ever commits a
//! partition another instance holds.
//!
//! # Persistence and time
//! Groups, committed offsets and the epoch counter persist in `<data_dir>/groups.sqlite` (see
//! the `store` module); instances do not: after a restart an instance's next request rejoins.
//! Timeouts are judged on tokio's monotonic clock (tests pause and advance it); the broker's
//! [`Clock`] stamps last use, and a group unused for its stream's retention period is removed
//! by the periodic sweep. A group of a deleted (or deleted and recreated) stream goes with it.
//!
//! [`Clock`]: tributary_event::Clock

pub mod assignment;
mod state;
mod store;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tributary_event::names::name_key;
use tributary_event::{EventPosition, ReceivedEvent};

use state::{CursorAge, Delivered, GroupState};
use store::{Store, StoredGroup};
use tributary_broker::{Broker, BrokerError, HubDefinition};

/// At most this many groups read one stream by default (OCI's limit).
pub const GROUPS_PER_STREAM_MAX_DEFAULT: u32 = 50;

/// An instance's inactivity timeout when it does not say (OCI's default).
pub const INSTANCE_TIMEOUT_MS_DEFAULT: u32 = 30_000;

/// The shortest and longest inactivity timeout an instance may ask for: below a second a slow
/// consumer flaps in and out of its group; above an hour a dead one holds partitions too long.
pub const INSTANCE_TIMEOUT_MS_MIN: u32 = 1_000;
/// See [`INSTANCE_TIMEOUT_MS_MIN`].
pub const INSTANCE_TIMEOUT_MS_MAX: u32 = 3_600_000;

/// The longest group or instance name.
pub const NAME_CHARS_MAX: usize = 256;

/// Last-use stamps are written at most this often per group: group expiry is measured in the
/// stream's retention (hours), so a minute of imprecision costs nothing and saves a write per get.
const LAST_USED_SAVE_INTERVAL_MS: i64 = 60_000;

const _: () = assert!(INSTANCE_TIMEOUT_MS_MIN <= INSTANCE_TIMEOUT_MS_DEFAULT);
const _: () = assert!(INSTANCE_TIMEOUT_MS_DEFAULT <= INSTANCE_TIMEOUT_MS_MAX);

/// How the coordinator is configured.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// The most groups one stream may have.
    pub groups_per_stream_max: u32,
    /// How often unused groups and groups of deleted streams are removed.
    pub sweep_interval: Duration,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            groups_per_stream_max: GROUPS_PER_STREAM_MAX_DEFAULT,
            sweep_interval: Duration::from_secs(60),
        }
    }
}

/// Where a new group starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartPosition {
    /// The oldest retained message of each partition.
    TrimHorizon,
    /// Only messages published after the group is created.
    Latest,
    /// The first message at or after this time (ms since the epoch).
    AtTime(i64),
}

impl StartPosition {
    /// Where a reader starting here begins in each partition.
    pub fn event_position(self) -> EventPosition {
        match self {
            StartPosition::TrimHorizon => EventPosition::Earliest,
            StartPosition::Latest => EventPosition::Latest,
            StartPosition::AtTime(ms) => EventPosition::EnqueuedTime {
                enqueued_time_ms: ms,
                inclusive: true,
            },
        }
    }
}

/// A request to join a group (creating it if needed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinRequest {
    /// The stream (event hub).
    pub stream: String,
    /// The group.
    pub group: String,
    /// The instance; `None` generates a UUID.
    pub instance: Option<String>,
    /// Where the group starts if it is new; ignored otherwise.
    pub start: StartPosition,
    /// Whether each get commits the batch before it.
    pub commit_on_get: bool,
    /// How long the instance may be silent before it is removed.
    pub timeout_ms: u32,
}

/// What an instance's cursor stands for. The front door makes it tamper-proof; the coordinator
/// trusts its fields only as far as the rules in the crate docs allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The stream.
    pub stream: String,
    /// The group.
    pub group: String,
    /// The instance.
    pub instance: String,
    /// The member epoch it was issued under.
    pub epoch: u64,
    /// How many answers the instance had when it was issued.
    pub token: u64,
    /// The instance's commit-on-get setting (to rejoin with after a restart).
    pub commit_on_get: bool,
    /// The instance's timeout (to rejoin with after a restart).
    pub timeout_ms: u32,
}

/// One answer to a group get.
#[derive(Debug, Clone)]
pub struct GroupBatch {
    /// The stream's name as created.
    pub stream: String,
    /// The messages, with their partition.
    pub events: Vec<(u32, ReceivedEvent)>,
    /// The session for the next request.
    pub session: Session,
}

/// One partition's line in a group description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The partition.
    pub partition: u32,
    /// The last committed offset (sequence number); `None` if nothing before the start.
    pub committed_offset: Option<i64>,
    /// The instance holding it, if any.
    pub instance: Option<String>,
    /// Until when (ms since the epoch) it is held unless the instance speaks again.
    pub reserved_until_ms: Option<i64>,
}

/// A group as GetGroup shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    /// The stream's name as created.
    pub stream: String,
    /// The group's name as created.
    pub group: String,
    /// One line per partition.
    pub reservations: Vec<Reservation>,
}

/// A group in a listing (admin API, metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSummary {
    /// The stream's name as created.
    pub stream: String,
    /// The group's name as created.
    pub group: String,
    /// The next sequence number to read per partition, as committed.
    pub committed: Vec<i64>,
    /// The live instances and the partitions each holds.
    pub instances: Vec<(String, Vec<u32>)>,
    /// When it was created (ms since the epoch).
    pub created_ms: i64,
    /// When it was last used (ms since the epoch).
    pub last_used_ms: i64,
}

/// An error from the coordinator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoordinatorError {
    /// The broker refused (for example, no such stream).
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// A group or instance name breaks the rules.
    #[error("invalid {what} name {name:?}: {reason}")]
    InvalidName {
        /// "group" or "instance".
        what: &'static str,
        /// The name given.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// An argument out of range.
    #[error("{0}")]
    InvalidArgument(String),
    /// No such group (never created, deleted, or expired).
    #[error(
        "group {group:?} does not exist in stream {stream:?} (groups disappear when unused for the stream's retention period)"
    )]
    GroupNotFound {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
    },
    /// The stream has as many groups as it may.
    #[error("stream {stream:?} already has the maximum of {max} consumer groups")]
    GroupLimit {
        /// The stream.
        stream: String,
        /// The limit.
        max: u32,
    },
    /// The cursor's instance no longer holds what the cursor stands for.
    #[error(
        "instance {instance:?} of group {group:?} in stream {stream:?} is fenced: {reason}; create a new group cursor to rejoin"
    )]
    Fenced {
        /// The stream.
        stream: String,
        /// The group.
        group: String,
        /// The instance.
        instance: String,
        /// What happened.
        reason: String,
    },
    /// The cursor is older than the previous answer's; use the latest cursor.
    #[error(
        "the cursor of instance {instance:?} of group {group:?} is not the latest one; use the cursor of the latest response"
    )]
    StaleCursor {
        /// The group.
        group: String,
        /// The instance.
        instance: String,
    },
    /// The group database failed.
    #[error("{0}")]
    Storage(String),
}

impl CoordinatorError {
    /// Whether the caller's request was at fault.
    pub fn is_caller_error(&self) -> bool {
        match self {
            CoordinatorError::Broker(e) => e.is_caller_error(),
            CoordinatorError::Storage(_) => false,
            _ => true,
        }
    }
}

/// Checks a group or instance name: 1 to 256 letters, digits, `.`, `-`, `_`.
pub fn validate_name(what: &'static str, name: &str) -> Result<(), CoordinatorError> {
    let invalid = |reason| {
        Err(CoordinatorError::InvalidName {
            what,
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return invalid("the name is empty");
    }
    if name.len() > NAME_CHARS_MAX {
        return invalid("the name is longer than 256 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    {
        return invalid("only letters, digits, '.', '-' and '_' are allowed");
    }
    Ok(())
}

type GroupKey = (String, String);

struct Inner {
    broker: Broker,
    config: CoordinatorConfig,
    store: Mutex<Store>,
    groups: Mutex<HashMap<GroupKey, Arc<Mutex<GroupState>>>>,
}

/// The server-side consumer groups of a broker. Cheap to clone; clones share the state.
#[derive(Clone)]
pub struct GroupCoordinator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for GroupCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCoordinator")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

fn group_key(stream: &str, group: &str) -> GroupKey {
    (name_key(stream), name_key(group))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock()
        .expect("coordinator state is never left half-changed by a panic")
}

impl GroupCoordinator {
    /// Opens the group database in the broker's data directory, loads every group, and starts
    /// the periodic sweep of unused groups.
    pub async fn open(
        broker: Broker,
        config: CoordinatorConfig,
    ) -> Result<GroupCoordinator, CoordinatorError> {
        let dir = broker.config().data_dir.clone();
        let (store, stored) = tokio::task::spawn_blocking(move || {
            let store = Store::open(&dir)?;
            let stored = store.load()?;
            Ok::<_, CoordinatorError>((store, stored))
        })
        .await
        .expect("opening the group database does not panic")?;
        let groups = stored
            .into_iter()
            .map(|g| {
                let key = group_key(&g.stream, &g.group);
                (key, Arc::new(Mutex::new(state_from_stored(g))))
            })
            .collect();
        let coordinator = GroupCoordinator {
            inner: Arc::new(Inner {
                broker,
                config,
                store: Mutex::new(store),
                groups: Mutex::new(groups),
            }),
        };
        tokio::spawn(sweep_task(
            Arc::downgrade(&coordinator.inner),
            coordinator.inner.config.sweep_interval,
        ));
        Ok(coordinator)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        op: impl FnOnce(&Inner, Instant) -> Result<T, CoordinatorError> + Send + 'static,
    ) -> Result<T, CoordinatorError> {
        let now = Instant::now();
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || op(&inner, now))
            .await
            .expect("group operations do not panic")
    }

    /// Joins an instance to a group, creating the group if it is new; returns its first session.
    pub async fn join(&self, request: JoinRequest) -> Result<Session, CoordinatorError> {
        validate_name("group", &request.group)?;
        if let Some(instance) = &request.instance {
            validate_name("instance", instance)?;
        }
        if !(INSTANCE_TIMEOUT_MS_MIN..=INSTANCE_TIMEOUT_MS_MAX).contains(&request.timeout_ms) {
            return Err(CoordinatorError::InvalidArgument(format!(
                "timeoutInMs {} is outside {INSTANCE_TIMEOUT_MS_MIN} to {INSTANCE_TIMEOUT_MS_MAX}",
                request.timeout_ms
            )));
        }
        self.blocking(move |inner, now| inner.join(request, now))
            .await
    }

    /// Reads the next messages of the instance's partitions (at most `limit` messages and about
    /// `bytes_max` bytes of keys and values), after rebalancing and (with commit-on-get)
    /// committing the previous batch.
    pub async fn get(
        &self,
        session: &Session,
        limit: u32,
        bytes_max: u64,
    ) -> Result<GroupBatch, CoordinatorError> {
        let session = session.clone();
        self.blocking(move |inner, now| inner.get(&session, limit, bytes_max, now))
            .await
    }

    /// Commits the batch of the get that issued `session`.
    pub async fn commit(&self, session: &Session) -> Result<Session, CoordinatorError> {
        let session = session.clone();
        self.blocking(move |inner, now| inner.commit(&session, now))
            .await
    }

    /// Tells the group the instance is alive, extending its reservations by its timeout.
    pub async fn heartbeat(&self, session: &Session) -> Result<Session, CoordinatorError> {
        let session = session.clone();
        self.blocking(move |inner, now| inner.heartbeat(&session, now))
            .await
    }

    /// Describes a group: per partition, its committed offset and who holds it until when.
    pub async fn describe(
        &self,
        stream: &str,
        group: &str,
    ) -> Result<GroupDescription, CoordinatorError> {
        let (stream, group) = (stream.to_owned(), group.to_owned());
        self.blocking(move |inner, now| inner.describe(&stream, &group, now))
            .await
    }

    /// Moves the whole group to `position`: every partition's committed offset, and every
    /// instance's next read.
    pub async fn reset(
        &self,
        stream: &str,
        group: &str,
        position: StartPosition,
    ) -> Result<(), CoordinatorError> {
        let (stream, group) = (stream.to_owned(), group.to_owned());
        self.blocking(move |inner, now| inner.reset(&stream, &group, position, now))
            .await
    }

    /// Deletes a group.
    pub async fn delete(&self, stream: &str, group: &str) -> Result<(), CoordinatorError> {
        let (stream, group) = (stream.to_owned(), group.to_owned());
        self.blocking(move |inner, _| {
            inner.lookup(&stream, &group)?;
            inner.remove(&stream, &group)
        })
        .await
    }

    /// The groups of one stream, or of every stream when `stream` is `None`, ordered by name.
    pub fn list(&self, stream: Option<&str>) -> Vec<GroupSummary> {
        let groups: Vec<Arc<Mutex<GroupState>>> = lock(&self.inner.groups)
            .iter()
            .filter(|((s, _), _)| stream.is_none_or(|want| name_key(want) == *s))
            .map(|(_, g)| g.clone())
            .collect();
        let mut out: Vec<GroupSummary> = groups.iter().map(|g| summary(&lock(g))).collect();
        out.sort_by(|a, b| (&a.stream, &a.group).cmp(&(&b.stream, &b.group)));
        out
    }

    /// Removes groups unused for their stream's retention period and groups whose stream is
    /// gone; returns how many went. The background sweep calls this periodically.
    pub async fn sweep(&self) -> Result<usize, CoordinatorError> {
        self.blocking(|inner, _| inner.sweep()).await
    }
}

fn state_from_stored(g: StoredGroup) -> GroupState {
    GroupState {
        stream: g.stream,
        group: g.group,
        hub_created_ms: g.hub_created_ms,
        committed: g.committed,
        epoch: g.epoch,
        epoch_at_load: g.epoch,
        members: Default::default(),
        created_ms: g.created_ms,
        last_used_ms: g.last_used_ms,
        last_used_saved_ms: g.last_used_ms,
        deleted: false,
    }
}

fn summary(g: &GroupState) -> GroupSummary {
    GroupSummary {
        stream: g.stream.clone(),
        group: g.group.clone(),
        committed: g.committed.clone(),
        instances: g
            .members
            .iter()
            .map(|(n, m)| (n.clone(), m.held.keys().copied().collect()))
            .collect(),
        created_ms: g.created_ms,
        last_used_ms: g.last_used_ms,
    }
}

fn session_of(g: &GroupState, instance: &str) -> Session {
    let m = &g.members[instance];
    Session {
        stream: g.stream.clone(),
        group: g.group.clone(),
        instance: instance.to_owned(),
        epoch: m.epoch,
        token: m.token,
        commit_on_get: m.commit_on_get,
        timeout_ms: u32::try_from(m.timeout.as_millis()).unwrap_or(u32::MAX),
    }
}

async fn sweep_task(inner: Weak<Inner>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let coordinator = GroupCoordinator { inner };
        match coordinator.sweep().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(groups = n, "removed unused consumer groups"),
            Err(e) => tracing::error!(error = %e, "sweeping consumer groups failed"),
        }
    }
}

impl Inner {
    /// The group and its stream, dropping the group if its stream was deleted or recreated.
    fn lookup(
        &self,
        stream: &str,
        group: &str,
    ) -> Result<(HubDefinition, Arc<Mutex<GroupState>>), CoordinatorError> {
        let hub = self.broker.describe_hub(stream)?;
        let found = lock(&self.groups).get(&group_key(stream, group)).cloned();
        let not_found = || CoordinatorError::GroupNotFound {
            stream: hub.name.clone(),
            group: group.to_owned(),
        };
        let Some(state) = found else {
            return Err(not_found());
        };
        if lock(&state).hub_created_ms != hub.created_at_ms {
            self.remove(stream, group)?;
            return Err(not_found());
        }
        Ok((hub, state))
    }

    fn remove(&self, stream: &str, group: &str) -> Result<(), CoordinatorError> {
        let removed = lock(&self.groups).remove(&group_key(stream, group));
        if let Some(state) = removed {
            lock(&state).deleted = true;
        }
        lock(&self.store).delete(stream, group)
    }

    /// Locks a group for an operation: checks it was not deleted meanwhile, stamps its use,
    /// and removes the instances that timed out.
    fn enter<'a>(
        &self,
        state: &'a Mutex<GroupState>,
        now: Instant,
    ) -> Result<std::sync::MutexGuard<'a, GroupState>, CoordinatorError> {
        let mut g = lock(state);
        if g.deleted {
            return Err(CoordinatorError::GroupNotFound {
                stream: g.stream.clone(),
                group: g.group.clone(),
            });
        }
        g.last_used_ms = self.broker.clock().now_ms();
        for gone in g.expire(now) {
            tracing::info!(stream = %g.stream, group = %g.group, instance = %gone, "instance timed out; its partitions were reassigned");
        }
        Ok(g)
    }

    /// Persists commits, and the epoch and last use when they moved.
    fn save(
        &self,
        g: &mut GroupState,
        commits: &[(u32, i64)],
        epoch_before: u64,
    ) -> Result<(), CoordinatorError> {
        let stale = g.last_used_ms - g.last_used_saved_ms >= LAST_USED_SAVE_INTERVAL_MS;
        if commits.is_empty() && g.epoch == epoch_before && !stale {
            return Ok(());
        }
        lock(&self.store).update(&g.stream, &g.group, commits, g.epoch, g.last_used_ms)?;
        g.last_used_saved_ms = g.last_used_ms;
        Ok(())
    }

    fn join(&self, request: JoinRequest, now: Instant) -> Result<Session, CoordinatorError> {
        let hub = self.broker.describe_hub(&request.stream)?;
        let state = self.find_or_create(&hub, &request)?;
        let mut g = self.enter(&state, now)?;
        let epoch_before = g.epoch;
        let instance = request
            .instance
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let timeout = Duration::from_millis(u64::from(request.timeout_ms));
        g.join(&instance, timeout, request.commit_on_get, now);
        // The new epoch is stored before a cursor carrying it is handed out.
        self.save(&mut g, &[], epoch_before)?;
        tracing::info!(stream = %g.stream, group = %g.group, %instance, "instance joined");
        Ok(session_of(&g, &instance))
    }

    fn find_or_create(
        &self,
        hub: &HubDefinition,
        request: &JoinRequest,
    ) -> Result<Arc<Mutex<GroupState>>, CoordinatorError> {
        match self.lookup(&hub.name, &request.group) {
            Ok((_, state)) => return Ok(state),
            Err(CoordinatorError::GroupNotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        let mut groups = lock(&self.groups);
        let key = group_key(&hub.name, &request.group);
        if let Some(state) = groups.get(&key) {
            return Ok(state.clone());
        }
        let count = groups.keys().filter(|(s, _)| *s == key.0).count();
        let max = self.config.groups_per_stream_max;
        if count >= max as usize {
            return Err(CoordinatorError::GroupLimit {
                stream: hub.name.clone(),
                max,
            });
        }
        let committed = self.resolve_all(hub, request.start)?;
        let now_ms = self.broker.clock().now_ms();
        let stored = StoredGroup {
            stream: hub.name.clone(),
            group: request.group.clone(),
            hub_created_ms: hub.created_at_ms,
            created_ms: now_ms,
            last_used_ms: now_ms,
            epoch: 0,
            committed,
        };
        lock(&self.store).create(&stored)?;
        tracing::info!(stream = %hub.name, group = %request.group, start = ?request.start, "consumer group created");
        let state = Arc::new(Mutex::new(state_from_stored(stored)));
        groups.insert(key, state.clone());
        Ok(state)
    }

    /// Every partition's position for `start`.
    fn resolve_all(
        &self,
        hub: &HubDefinition,
        start: StartPosition,
    ) -> Result<Vec<i64>, CoordinatorError> {
        let position = start.event_position();
        (0..hub.partition_count)
            .map(|p| {
                self.broker
                    .resolve_position(&hub.name, &p.to_string(), &position)
                    .map_err(CoordinatorError::from)
            })
            .collect()
    }

    fn get(
        &self,
        session: &Session,
        limit: u32,
        bytes_max: u64,
        now: Instant,
    ) -> Result<GroupBatch, CoordinatorError> {
        let (hub, state) = self.lookup(&session.stream, &session.group)?;
        let mut g = self.enter(&state, now)?;
        let epoch_before = g.epoch;
        let age = g.member_for(session, now)?;
        let instance = session.instance.as_str();
        let commit_on_get = {
            let m = g.members.get_mut(instance).expect("member_for found it");
            m.deadline = now + m.timeout;
            m.commit_on_get
        };
        let commits = match age {
            CursorAge::Current if commit_on_get => g.uncommitted(instance),
            CursorAge::Current => Vec::new(),
            CursorAge::Retry => {
                g.rewind(instance);
                Vec::new()
            }
        };
        self.save(&mut g, &commits, epoch_before)?;
        g.apply_commits(&commits);
        let events = self.read(&hub.name, &mut g, instance, limit, bytes_max)?;
        if age == CursorAge::Current {
            g.members.get_mut(instance).expect("still a member").token += 1;
        }
        Ok(GroupBatch {
            stream: hub.name,
            events,
            session: session_of(&g, instance),
        })
    }

    /// Reads the instance's partitions, starting one further along each time, and records the
    /// batch as delivered.
    fn read(
        &self,
        hub: &str,
        g: &mut GroupState,
        instance: &str,
        limit: u32,
        bytes_max: u64,
    ) -> Result<Vec<(u32, ReceivedEvent)>, CoordinatorError> {
        let member = g.members.get_mut(instance).expect("a live member");
        let partitions: Vec<u32> = member.held.keys().copied().collect();
        let mut out = Vec::new();
        member.delivered.clear();
        if partitions.is_empty() {
            return Ok(out);
        }
        let n = partitions.len();
        let start = member.rotation as usize % n;
        member.rotation = u32::try_from((start + 1) % n).expect("at most 1024 partitions");
        let (mut events_left, mut bytes_left) = (limit as usize, bytes_max);
        for k in 0..n {
            if events_left == 0 || bytes_left == 0 {
                break;
            }
            let p = partitions[(start + k) % n];
            let from = member.held[&p].fetch;
            let mut events = self.read_partition(hub, p, from, events_left, bytes_left)?;
            // The log reads whole batches, so it can overshoot `bytes_left` by up to a batch.
            let read = events.len();
            events.truncate(fitting(&events, bytes_left, out.is_empty()));
            if events.is_empty() && read > 0 {
                break; // The answer is full.
            }
            let Some(last) = events.last() else { continue };
            let to = last.sequence_number + 1;
            member.held.get_mut(&p).expect("held").fetch = to;
            member.delivered.push(Delivered {
                partition: p,
                from,
                to,
                epoch: member.epoch,
            });
            events_left -= events.len();
            let bytes: u64 = events.iter().map(message_bytes).sum();
            bytes_left = bytes_left.saturating_sub(bytes);
            out.extend(events.into_iter().map(|e| (p, e)));
        }
        Ok(out)
    }

    /// Reads one partition; a position retention has removed moves up to the oldest retained.
    fn read_partition(
        &self,
        hub: &str,
        partition: u32,
        from: i64,
        events_max: usize,
        bytes_max: u64,
    ) -> Result<Vec<ReceivedEvent>, CoordinatorError> {
        let id = partition.to_string();
        match self.broker.read(hub, &id, from, events_max, bytes_max) {
            Err(BrokerError::Log {
                source: tributary_broker::LogError::Expired { begin, .. },
                ..
            }) => {
                tracing::warn!(
                    hub,
                    partition,
                    from,
                    begin,
                    "retention removed messages a group had not read; continuing at the oldest retained"
                );
                Ok(self.broker.read(hub, &id, begin, events_max, bytes_max)?)
            }
            other => Ok(other?),
        }
    }

    fn commit(&self, session: &Session, now: Instant) -> Result<Session, CoordinatorError> {
        let (_, state) = self.lookup(&session.stream, &session.group)?;
        let mut g = self.enter(&state, now)?;
        let epoch_before = g.epoch;
        let age = g.member_for(session, now)?;
        let instance = session.instance.as_str();
        if age == CursorAge::Retry {
            return Err(CoordinatorError::StaleCursor {
                group: g.group.clone(),
                instance: instance.to_owned(),
            });
        }
        let member = g.members.get_mut(instance).expect("member_for found it");
        member.deadline = now + member.timeout;
        if session.epoch != member.epoch && member.join_epoch <= session.epoch {
            return Err(CoordinatorError::Fenced {
                stream: g.stream.clone(),
                group: g.group.clone(),
                instance: instance.to_owned(),
                reason: "partitions of its last batch were reassigned to other instances since this cursor was issued, so nothing was committed (the next GetMessages continues with the new assignment)".to_owned(),
            });
        }
        let commits = g.uncommitted(instance);
        self.save(&mut g, &commits, epoch_before)?;
        g.apply_commits(&commits);
        Ok(session_of(&g, instance))
    }

    fn heartbeat(&self, session: &Session, now: Instant) -> Result<Session, CoordinatorError> {
        let (_, state) = self.lookup(&session.stream, &session.group)?;
        let mut g = self.enter(&state, now)?;
        let epoch_before = g.epoch;
        g.member_for(session, now)?;
        let member = g
            .members
            .get_mut(&session.instance)
            .expect("member_for found it");
        member.deadline = now + member.timeout;
        let rejoined = member.join_epoch > session.epoch;
        self.save(&mut g, &[], epoch_before)?;
        // A heartbeat never moves a cursor to a newer epoch: that would let its commit through.
        Ok(if rejoined {
            session_of(&g, &session.instance)
        } else {
            session.clone()
        })
    }

    fn describe(
        &self,
        stream: &str,
        group: &str,
        now: Instant,
    ) -> Result<GroupDescription, CoordinatorError> {
        let (hub, state) = self.lookup(stream, group)?;
        let g = self.enter(&state, now)?;
        let now_ms = self.broker.clock().now_ms();
        let mut reservations: Vec<Reservation> = g
            .committed
            .iter()
            .enumerate()
            .map(|(p, next)| Reservation {
                partition: p as u32,
                committed_offset: (*next > 0).then_some(next - 1),
                instance: None,
                reserved_until_ms: None,
            })
            .collect();
        for (name, m) in &g.members {
            let left = m.deadline.saturating_duration_since(now);
            let until = now_ms.saturating_add(i64::try_from(left.as_millis()).unwrap_or(i64::MAX));
            for p in m.held.keys() {
                let r = &mut reservations[*p as usize];
                r.instance = Some(name.clone());
                r.reserved_until_ms = Some(until);
            }
        }
        Ok(GroupDescription {
            stream: hub.name,
            group: g.group.clone(),
            reservations,
        })
    }

    fn reset(
        &self,
        stream: &str,
        group: &str,
        position: StartPosition,
        now: Instant,
    ) -> Result<(), CoordinatorError> {
        let (hub, state) = self.lookup(stream, group)?;
        let positions = self.resolve_all(&hub, position)?;
        let mut g = self.enter(&state, now)?;
        let epoch_before = g.epoch;
        let commits: Vec<(u32, i64)> = positions
            .iter()
            .enumerate()
            .map(|(p, next)| (p as u32, *next))
            .collect();
        self.save(&mut g, &commits, epoch_before)?;
        g.reset(&positions);
        tracing::info!(stream = %g.stream, group = %g.group, ?position, "group position reset");
        Ok(())
    }

    fn sweep(&self) -> Result<usize, CoordinatorError> {
        let now_ms = self.broker.clock().now_ms();
        let groups: Vec<(GroupKey, Arc<Mutex<GroupState>>)> = lock(&self.groups)
            .iter()
            .map(|(k, g)| (k.clone(), g.clone()))
            .collect();
        let mut removed = 0;
        for (_, state) in groups {
            let (stream, group, hub_created_ms, last_used_ms) = {
                let g = lock(&state);
                (
                    g.stream.clone(),
                    g.group.clone(),
                    g.hub_created_ms,
                    g.last_used_ms,
                )
            };
            let expired = match self.broker.describe_hub(&stream) {
                Ok(hub) if hub.created_at_ms != hub_created_ms => true,
                Ok(hub) => hub
                    .retention_age_ms
                    .is_some_and(|age| now_ms.saturating_sub(last_used_ms) >= age),
                Err(BrokerError::HubNotFound { .. }) => true,
                Err(e) => return Err(e.into()),
            };
            if expired {
                tracing::info!(%stream, %group, "removing a consumer group unused for the stream's retention period (or whose stream is gone)");
                self.remove(&stream, &group)?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// The bytes a message costs an answer: its key and value.
fn message_bytes(e: &ReceivedEvent) -> u64 {
    e.data.body.len() as u64 + e.data.partition_key.as_ref().map_or(0, |k| k.len() as u64)
}

/// How many leading `events` fit in `bytes_max`; at least one if `at_least_one` (an answer
/// always makes progress, even past a message larger than the whole budget).
fn fitting(events: &[ReceivedEvent], bytes_max: u64, at_least_one: bool) -> usize {
    let mut total = 0u64;
    let fit = events
        .iter()
        .take_while(|e| {
            total += message_bytes(e);
            total <= bytes_max
        })
        .count();
    if at_least_one && !events.is_empty() {
        fit.max(1)
    } else {
        fit
    }
}

#[cfg(test)]
mod tests;
