//! An in-memory [`PartitionSource`] for tests, examples and demos.
//!
//! [`InMemoryPartitionSource`] keeps each partition's events in a vector and enforces the epoch
//! rules of Event Hubs per (consumer group, partition), as seed 000 states them:
//! - with no receiver, any owner level is allowed;
//! - a new receiver with owner level `e2 >= e1` disconnects the one with `e1`: that receiver's
//!   next `receive` (or the one it is waiting in) fails with [`SourceError::OwnershipLost`];
//! - a new receiver with `e2 < e1` is refused with [`SourceError::OwnershipLost`];
//! - a receiver without an owner level is refused while an epoch receiver is active, and a new
//!   epoch receiver disconnects every receiver without one; at most five of those at a time.
//!
//! A receiver dropped without `close` stays attached, like a link from a crashed process, until a
//! higher owner level replaces it. Tests can inject one-off failures with
//! [`InMemoryPartitionSource::fail_next_receive`] and [`InMemoryPartitionSource::fail_next_open`].
//! Time is Tokio's, so paused-clock tests are deterministic.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tributary_event::{Clock, EventData, EventPosition, ReceivedEvent, SystemClock};

use crate::{
    LastEnqueuedEventProperties, PartitionReceiver, PartitionSource, ReceiverOptions, SourceError,
};

/// The most receivers without an owner level per (consumer group, partition), as in Event Hubs.
const PLAIN_RECEIVERS_MAX: usize = 5;

/// Bytes every event adds to a partition's offset beyond its body, so offsets are not dense.
const EVENT_OVERHEAD_BYTES: u64 = 64;

/// An event hub in memory; see the [module docs](self).
pub struct InMemoryPartitionSource {
    fully_qualified_namespace: String,
    event_hub_name: String,
    clock: Arc<dyn Clock>,
    partitions: HashMap<String, Arc<Partition>>,
    open_failures: Mutex<VecDeque<SourceError>>,
}

impl std::fmt::Debug for InMemoryPartitionSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InMemoryPartitionSource")
            .field("fully_qualified_namespace", &self.fully_qualified_namespace)
            .field("event_hub_name", &self.event_hub_name)
            .field("partition_count", &self.partitions.len())
            .finish_non_exhaustive()
    }
}

struct Partition {
    state: Mutex<PartitionState>,
    /// Woken on every append and every receiver change.
    changed: Notify,
}

#[derive(Default)]
struct PartitionState {
    events: Vec<ReceivedEvent>,
    next_offset: u64,
    groups: HashMap<String, GroupReaders>,
    next_receiver_id: u64,
    receive_failures: VecDeque<SourceError>,
    receivers_opened: u64,
}

#[derive(Default)]
struct GroupReaders {
    epoch_reader: Option<(i64, u64)>,
    plain_readers: BTreeSet<u64>,
}

impl Partition {
    fn lock(&self) -> MutexGuard<'_, PartitionState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl InMemoryPartitionSource {
    /// A hub `event_hub_name` with partitions `"0"` to `partition_count - 1`, all empty.
    pub fn new(
        fully_qualified_namespace: impl Into<String>,
        event_hub_name: impl Into<String>,
        partition_count: u32,
    ) -> Self {
        let partitions = (0..partition_count)
            .map(|p| {
                let partition = Partition {
                    state: Mutex::new(PartitionState::default()),
                    changed: Notify::new(),
                };
                (p.to_string(), Arc::new(partition))
            })
            .collect();
        InMemoryPartitionSource {
            fully_qualified_namespace: fully_qualified_namespace.into(),
            event_hub_name: event_hub_name.into(),
            clock: Arc::new(SystemClock),
            partitions,
            open_failures: Mutex::new(VecDeque::new()),
        }
    }

    fn partition(&self, partition_id: &str) -> Result<&Arc<Partition>, SourceError> {
        self.partitions
            .get(partition_id)
            .ok_or_else(|| SourceError::NotFound {
                what: format!(
                    "partition {partition_id:?} of event hub {:?}",
                    self.event_hub_name
                ),
            })
    }

    /// Appends `events` to a partition; returns them as stored. Panics if the partition does not
    /// exist (a mistake in the test).
    pub fn append(&self, partition_id: &str, events: Vec<EventData>) -> Vec<ReceivedEvent> {
        let partition = self
            .partition(partition_id)
            .expect("append to an existing partition");
        let enqueued_time_ms = self.clock.now_ms();
        let mut state = partition.lock();
        let mut stored = Vec::with_capacity(events.len());
        for data in events {
            let sequence_number =
                i64::try_from(state.events.len()).expect("fewer than 2^63 events");
            let offset = state.next_offset;
            state.next_offset +=
                u64::try_from(data.body.len()).expect("a body fits in u64") + EVENT_OVERHEAD_BYTES;
            let event = ReceivedEvent {
                sequence_number,
                offset,
                enqueued_time_ms,
                data,
            };
            state.events.push(event.clone());
            stored.push(event);
        }
        drop(state);
        partition.changed.notify_waiters();
        stored
    }

    /// How many partitions the hub has.
    pub fn partition_count(&self) -> u32 {
        u32::try_from(self.partitions.len()).expect("created from a u32 count")
    }

    /// Every event of a partition.
    pub fn events(&self, partition_id: &str) -> Vec<ReceivedEvent> {
        self.partition(partition_id)
            .map(|partition| partition.lock().events.clone())
            .unwrap_or_default()
    }

    /// The owner level of the active epoch receiver on (consumer group, partition), if any.
    pub fn active_owner_level(&self, partition_id: &str, consumer_group: &str) -> Option<i64> {
        let partition = self.partition(partition_id).ok()?;
        let state = partition.lock();
        state
            .groups
            .get(&group_key(consumer_group))?
            .epoch_reader
            .map(|(owner_level, _)| owner_level)
    }

    /// How many receivers were opened on a partition so far.
    pub fn receivers_opened(&self, partition_id: &str) -> u64 {
        self.partition(partition_id)
            .map(|partition| partition.lock().receivers_opened)
            .unwrap_or(0)
    }

    /// Makes the next `receive` on the partition (by any receiver) fail with `error`.
    pub fn fail_next_receive(&self, partition_id: &str, error: SourceError) {
        let partition = self.partition(partition_id).expect("an existing partition");
        partition.lock().receive_failures.push_back(error);
        partition.changed.notify_waiters();
    }

    /// Makes the next `open_receiver` (on any partition) fail with `error`.
    pub fn fail_next_open(&self, error: SourceError) {
        self.open_failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push_back(error);
    }
}

fn group_key(consumer_group: &str) -> String {
    tributary_event::names::name_key(consumer_group)
}

/// Applies the epoch rules for a new receiver; returns its id.
fn attach(
    state: &mut PartitionState,
    group: &str,
    owner_level: Option<i64>,
) -> Result<u64, SourceError> {
    let receiver_id = state.next_receiver_id;
    let readers = state.groups.entry(group_key(group)).or_default();
    match owner_level {
        Some(level) => {
            if let Some((current, _)) = readers.epoch_reader
                && level < current
            {
                return Err(SourceError::OwnershipLost {
                    description: format!(
                        "a receiver with owner level {current} is active; owner level {level} is \
                         refused"
                    ),
                });
            }
            readers.epoch_reader = Some((level, receiver_id));
            readers.plain_readers.clear();
        }
        None => {
            if let Some((current, _)) = readers.epoch_reader {
                return Err(SourceError::OwnershipLost {
                    description: format!(
                        "a receiver with owner level {current} is active; receivers without an \
                         owner level are refused"
                    ),
                });
            }
            if readers.plain_readers.len() >= PLAIN_RECEIVERS_MAX {
                return Err(SourceError::Other {
                    description: format!(
                        "at most {PLAIN_RECEIVERS_MAX} receivers without an owner level \
                         (amqp:resource-limit-exceeded)"
                    ),
                });
            }
            readers.plain_readers.insert(receiver_id);
        }
    }
    state.next_receiver_id += 1;
    state.receivers_opened += 1;
    Ok(receiver_id)
}

/// The index of the first event at or after `position`.
fn resolve(events: &[ReceivedEvent], position: EventPosition) -> usize {
    let first = |keep: &dyn Fn(&ReceivedEvent) -> bool| {
        events.iter().position(keep).unwrap_or(events.len())
    };
    match position {
        EventPosition::Earliest => 0,
        EventPosition::Latest => events.len(),
        EventPosition::Offset { offset, inclusive } => {
            first(&|e| e.offset > offset || (inclusive && e.offset == offset))
        }
        EventPosition::SequenceNumber {
            sequence_number,
            inclusive,
        } => first(&|e| {
            e.sequence_number > sequence_number
                || (inclusive && e.sequence_number == sequence_number)
        }),
        EventPosition::EnqueuedTime {
            enqueued_time_ms,
            inclusive,
        } => first(&|e| {
            e.enqueued_time_ms > enqueued_time_ms
                || (inclusive && e.enqueued_time_ms == enqueued_time_ms)
        }),
    }
}

#[async_trait::async_trait]
impl PartitionSource for InMemoryPartitionSource {
    fn fully_qualified_namespace(&self) -> &str {
        &self.fully_qualified_namespace
    }

    fn event_hub_name(&self) -> &str {
        &self.event_hub_name
    }

    async fn partition_ids(&self) -> Result<Vec<String>, SourceError> {
        let mut ids: Vec<String> = self.partitions.keys().cloned().collect();
        ids.sort_by_key(|id| id.parse::<u64>().unwrap_or(u64::MAX));
        Ok(ids)
    }

    async fn open_receiver(
        &self,
        options: ReceiverOptions,
    ) -> Result<Box<dyn PartitionReceiver>, SourceError> {
        let injected = self
            .open_failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop_front();
        if let Some(error) = injected {
            return Err(error);
        }
        let partition = Arc::clone(self.partition(&options.partition_id)?);
        let mut state = partition.lock();
        let receiver_id = attach(&mut state, &options.consumer_group, options.owner_level)?;
        let next_index = resolve(&state.events, options.start);
        drop(state);
        // Wake a receiver this one displaced, so it learns at once.
        partition.changed.notify_waiters();
        Ok(Box::new(InMemoryReceiver {
            partition,
            group: group_key(&options.consumer_group),
            receiver_id,
            next_index,
            track_last_enqueued: options.track_last_enqueued,
            last_enqueued: None,
            clock: Arc::clone(&self.clock),
        }))
    }
}

struct InMemoryReceiver {
    partition: Arc<Partition>,
    group: String,
    receiver_id: u64,
    next_index: usize,
    track_last_enqueued: bool,
    last_enqueued: Option<LastEnqueuedEventProperties>,
    clock: Arc<dyn Clock>,
}

impl InMemoryReceiver {
    fn is_attached(&self, state: &PartitionState) -> bool {
        state.groups.get(&self.group).is_some_and(|readers| {
            readers.epoch_reader.map(|(_, id)| id) == Some(self.receiver_id)
                || readers.plain_readers.contains(&self.receiver_id)
        })
    }

    /// Events ready now, a failure, or `None` to wait.
    fn try_take(&mut self, max_events: usize) -> Option<Result<Vec<ReceivedEvent>, SourceError>> {
        let mut state = self.partition.lock();
        if !self.is_attached(&state) {
            return Some(Err(SourceError::OwnershipLost {
                description: "a receiver with a higher owner level took the partition \
                              (amqp:link:stolen)"
                    .to_owned(),
            }));
        }
        if let Some(error) = state.receive_failures.pop_front() {
            return Some(Err(error));
        }
        if self.next_index >= state.events.len() {
            return None;
        }
        let end = state.events.len().min(self.next_index + max_events);
        let batch = state.events[self.next_index..end].to_vec();
        self.next_index = end;
        if self.track_last_enqueued {
            let newest = state.events.last().expect("the partition has events");
            self.last_enqueued = Some(LastEnqueuedEventProperties {
                sequence_number: newest.sequence_number,
                offset: newest.offset,
                enqueued_time_ms: newest.enqueued_time_ms,
                retrieved_time_ms: self.clock.now_ms(),
            });
        }
        Some(Ok(batch))
    }
}

#[async_trait::async_trait]
impl PartitionReceiver for InMemoryReceiver {
    async fn receive(
        &mut self,
        max_events: usize,
        wait: Duration,
    ) -> Result<Vec<ReceivedEvent>, SourceError> {
        assert!(max_events > 0);
        let deadline = Instant::now() + wait;
        let partition = Arc::clone(&self.partition);
        loop {
            let changed = partition.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(result) = self.try_take(max_events) {
                return result;
            }
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(deadline) => return Ok(Vec::new()),
            }
        }
    }

    fn last_enqueued(&self) -> Option<LastEnqueuedEventProperties> {
        self.last_enqueued
    }

    async fn taken_over(&mut self) {
        let partition = Arc::clone(&self.partition);
        loop {
            let changed = partition.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if !self.is_attached(&partition.lock()) {
                return;
            }
            changed.await;
        }
    }

    async fn close(self: Box<Self>) {
        let mut state = self.partition.lock();
        if let Some(readers) = state.groups.get_mut(&self.group) {
            if readers.epoch_reader.map(|(_, id)| id) == Some(self.receiver_id) {
                readers.epoch_reader = None;
            }
            readers.plain_readers.remove(&self.receiver_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(owner_level: Option<i64>, start: EventPosition) -> ReceiverOptions {
        ReceiverOptions {
            partition_id: "0".to_owned(),
            consumer_group: "$Default".to_owned(),
            start,
            owner_level,
            prefetch: 10,
            track_last_enqueued: true,
        }
    }

    fn bodies(events: &[ReceivedEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| String::from_utf8_lossy(&e.data.body).into_owned())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn receivers_read_from_their_start_position_and_time_out_empty() {
        let source = InMemoryPartitionSource::new("ns", "hub", 2);
        let stored = source.append("0", ["a", "b", "c"].map(EventData::new).to_vec());
        assert!(
            stored[1].offset > stored[0].offset + 1,
            "offsets are not dense"
        );
        let mut receiver = source
            .open_receiver(options(
                Some(1),
                EventPosition::Offset {
                    offset: stored[0].offset,
                    inclusive: false,
                },
            ))
            .await
            .unwrap();
        let batch = receiver.receive(10, Duration::from_secs(1)).await.unwrap();
        assert_eq!(bodies(&batch), ["b", "c"]);
        assert_eq!(receiver.last_enqueued().unwrap().sequence_number, 2);
        let started = Instant::now();
        let empty = receiver.receive(10, Duration::from_secs(1)).await.unwrap();
        assert!(empty.is_empty());
        assert_eq!(started.elapsed(), Duration::from_secs(1));
        for (position, expected) in [
            (EventPosition::Earliest, 3),
            (EventPosition::Latest, 0),
            (
                EventPosition::SequenceNumber {
                    sequence_number: 1,
                    inclusive: true,
                },
                2,
            ),
        ] {
            let mut plain = source
                .open_receiver(options(Some(1), position))
                .await
                .unwrap();
            let got = plain.receive(10, Duration::from_millis(1)).await.unwrap();
            assert_eq!(got.len(), expected, "{position}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_higher_owner_level_disconnects_and_a_lower_one_is_refused() {
        let source = InMemoryPartitionSource::new("ns", "hub", 1);
        let mut first = source
            .open_receiver(options(Some(5), EventPosition::Earliest))
            .await
            .unwrap();
        let lower = source
            .open_receiver(options(Some(4), EventPosition::Earliest))
            .await;
        assert!(lower.is_err_and(|e| e.is_ownership_lost()));
        let plain = source
            .open_receiver(options(None, EventPosition::Earliest))
            .await;
        assert!(plain.is_err_and(|e| e.is_ownership_lost()));
        let _second = source
            .open_receiver(options(Some(5), EventPosition::Earliest))
            .await
            .unwrap();
        assert_eq!(source.active_owner_level("0", "$default"), Some(5));
        let error = first.receive(1, Duration::from_secs(1)).await.unwrap_err();
        assert!(error.is_ownership_lost(), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_receiver_learns_at_once_that_it_was_displaced() {
        let source = Arc::new(InMemoryPartitionSource::new("ns", "hub", 1));
        let mut first = source
            .open_receiver(options(Some(1), EventPosition::Earliest))
            .await
            .unwrap();
        let waiting = tokio::spawn(async move {
            let started = Instant::now();
            let result = first.receive(1, Duration::from_secs(60)).await;
            (result, started.elapsed())
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let _second = source
            .open_receiver(options(Some(2), EventPosition::Earliest))
            .await
            .unwrap();
        let (result, waited) = waiting.await.unwrap();
        assert!(result.is_err_and(|e| e.is_ownership_lost()));
        assert!(waited < Duration::from_secs(1), "{waited:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn plain_receivers_are_limited_and_displaced_by_an_epoch_receiver() {
        let source = InMemoryPartitionSource::new("ns", "hub", 1);
        let mut plain = Vec::new();
        for _ in 0..PLAIN_RECEIVERS_MAX {
            plain.push(
                source
                    .open_receiver(options(None, EventPosition::Earliest))
                    .await
                    .unwrap(),
            );
        }
        let sixth = source
            .open_receiver(options(None, EventPosition::Earliest))
            .await;
        assert!(matches!(sixth, Err(SourceError::Other { .. })));
        let _epoch = source
            .open_receiver(options(Some(0), EventPosition::Earliest))
            .await
            .unwrap();
        let error = plain[0]
            .receive(1, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(error.is_ownership_lost());
    }

    #[tokio::test(start_paused = true)]
    async fn injected_failures_happen_once_and_closing_detaches() {
        let source = InMemoryPartitionSource::new("ns", "hub", 1);
        source.fail_next_open(SourceError::Transient {
            description: "injected".to_owned(),
        });
        let failed = source
            .open_receiver(options(Some(1), EventPosition::Earliest))
            .await;
        assert!(failed.is_err_and(|e| e.is_transient()));
        let mut receiver = source
            .open_receiver(options(Some(1), EventPosition::Earliest))
            .await
            .unwrap();
        source.fail_next_receive(
            "0",
            SourceError::Transient {
                description: "injected".to_owned(),
            },
        );
        assert!(receiver.receive(1, Duration::from_secs(1)).await.is_err());
        assert!(
            receiver
                .receive(1, Duration::from_millis(1))
                .await
                .unwrap()
                .is_empty()
        );
        receiver.close().await;
        assert_eq!(source.active_owner_level("0", "$Default"), None);
        assert_eq!(source.receivers_opened("0"), 1);
        let missing = ReceiverOptions {
            partition_id: "9".to_owned(),
            ..options(Some(1), EventPosition::Earliest)
        };
        assert!(matches!(
            source.open_receiver(missing).await,
            Err(SourceError::NotFound { .. })
        ));
    }
}
