//! Forwarding one source batch to one target: group by partition key, cut by the target's
//! size limit, send with retries, and isolate what the target refuses.
//!
//! # Guarantees
//!
//! - **Nothing skipped.** [`forward`] returns only when every event was acknowledged by the
//!   target or returned as [`Poison`] (for the dead-letter target). A send that fails for a
//!   reason other than its events is retried, with exponential backoff and without end; the
//!   task's checkpoint waits for it. (If the partition moves to another process meanwhile, the
//!   processor host cancels the call and the new owner resumes from the last checkpoint.)
//! - **Per-key order.** Events with one partition key go out as one group, in source order, one
//!   send after the other; different keys' groups go out concurrently
//!   ([`SENDS_IN_FLIGHT_MAX`]). Keyless events keep their partition number when the route says
//!   so (one group, in order), else they go round-robin.
//! - **No send that must fail.** Batches are cut with [`BatchSizer`] against the target's
//!   `max-message-size` before they are sent. An event too large on its own is poison at once.
//! - **Poison is isolated, not guessed.** When the target refuses a batch as invalid, the batch
//!   is halved until the refused events stand alone; everything else is sent, in order.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tributary_edit::Position;
use tributary_event::{EventData, SendTarget};
use tributary_eventhubs::limits::BATCH_EVENTS_MAX;
use tributary_eventhubs::message::MessageError;
use tributary_eventhubs::send::BatchSizer;

use crate::limits::SENDS_IN_FLIGHT_MAX;
use crate::metadata::{FirstHopStamp, Undo};
use crate::metrics::{PartitionMetrics, TaskMetrics};
use crate::target::{BatchStamps, HubIdentity, Target, TargetError};

/// An event on its way, with where it was read.
#[derive(Debug, Clone, PartialEq)]
pub struct Outgoing {
    /// The event as it will be sent (stamped).
    pub event: EventData,
    /// Where it was read from.
    pub position: Position,
    /// What takes the stamp back off (a dead letter is stamped for its own hub).
    pub undo: Undo,
}

/// Events on their way, in source order: the events side by side, as a target sends them, and
/// beside them where each was read and what takes its stamp off. An event is moved into its
/// route's list once and sent from there; it is never moved again between stages (each move
/// of an event copies a few hundred bytes).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outgoings {
    /// The events as they will be sent (stamped, or sent with `stamp`).
    pub events: Vec<EventData>,
    /// Each event's position and undo, at the event's index.
    pub places: Vec<(Position, Undo)>,
    /// The stamp the events whose undo is [deferred](Undo::is_deferred) are sent with.
    pub stamp: Option<Arc<FirstHopStamp>>,
}

impl Outgoings {
    /// An empty list with room for `capacity` events.
    pub fn with_capacity(capacity: usize) -> Outgoings {
        Outgoings {
            events: Vec::with_capacity(capacity),
            places: Vec::with_capacity(capacity),
            stamp: None,
        }
    }

    /// An empty list whose events are sent with `stamp`, as the list it is cut from.
    fn sharing_stamp(stamp: &Option<Arc<FirstHopStamp>>) -> Outgoings {
        Outgoings {
            stamp: stamp.clone(),
            ..Outgoings::default()
        }
    }

    /// The stamps of the events `places` of this list.
    fn stamps<'a>(&'a self, places: &'a [(Position, Undo)]) -> Option<BatchStamps<'a>> {
        let stamp = self.stamp.as_deref()?;
        Some(BatchStamps { stamp, places })
    }

    /// How many events the list holds.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the list holds no event.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Adds `outgoing` at the end.
    pub fn push(&mut self, outgoing: Outgoing) {
        self.events.push(outgoing.event);
        self.places.push((outgoing.position, outgoing.undo));
    }

    /// The events one by one, each with its place.
    pub fn into_items(self) -> impl Iterator<Item = Outgoing> {
        self.events
            .into_iter()
            .zip(self.places)
            .map(|(event, (position, undo))| Outgoing {
                event,
                position,
                undo,
            })
    }
}

impl FromIterator<Outgoing> for Outgoings {
    fn from_iter<I: IntoIterator<Item = Outgoing>>(items: I) -> Outgoings {
        let items = items.into_iter();
        let mut list = Outgoings::with_capacity(items.size_hint().0);
        items.for_each(|outgoing| list.push(outgoing));
        list
    }
}

/// An event a target refused on its own.
#[derive(Debug, Clone, PartialEq)]
pub struct Poison {
    /// The event.
    pub outgoing: Outgoing,
    /// Why, as the target said it.
    pub reason: String,
}

/// One target of a task, ready to send to.
#[derive(Debug, Clone)]
pub struct Destination {
    /// The route's name in the task file.
    pub name: String,
    /// The hub.
    pub target: Arc<dyn Target>,
    /// Its identity and partitions.
    pub identity: HubIdentity,
    /// The largest batch it takes.
    pub batch_bytes_max: u64,
    /// Whether keyless events keep their source partition number.
    pub keep_partition: bool,
    /// Whether an alias names the hub: it can move to another hub, whose sequence numbers
    /// are not this one's, so the offset map records no syncs for it.
    pub follows_alias: bool,
}

/// How failed sends are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The first pause.
    pub backoff_min: Duration,
    /// The longest pause; pauses double up to it.
    pub backoff_max: Duration,
}

/// What a forward counts into.
#[derive(Debug, Clone)]
pub struct Counting<'a> {
    /// The task's metrics (lag).
    pub task: &'a TaskMetrics,
    /// The source partition's counters.
    pub partition: &'a PartitionMetrics,
    /// The wall clock, ms since the epoch, for the lag.
    pub now_ms: fn() -> i64,
}

/// Sends `items`, read from source partition `source_partition`, to `destination`; returns the
/// events it refused on their own (see the module docs).
pub async fn forward(
    destination: &Destination,
    source_partition: &str,
    items: Outgoings,
    retry: RetryPolicy,
    counting: &Counting<'_>,
) -> Vec<Poison> {
    let groups = group(items, destination.keep_partition, source_partition);
    let sends = groups
        .into_iter()
        .map(|(to, items)| send_group(destination, to, items, retry, counting));
    let mut poison = Vec::new();
    let mut results = futures_util::stream::iter(sends).buffer_unordered(SENDS_IN_FLIGHT_MAX);
    while let Some(refused) = results.next().await {
        poison.extend(refused);
    }
    poison
}

/// Splits `items` by where they are sent, keeping source order within each group: one group
/// per partition key; keyless events in one group for their source partition (`keep_partition`)
/// or round-robin.
fn group(
    items: Outgoings,
    keep_partition: bool,
    source_partition: &str,
) -> Vec<(SendTarget, Outgoings)> {
    let Some(first) = items.events.first() else {
        return Vec::new();
    };
    let key = &first.partition_key;
    if (key.is_some() || keep_partition) && items.events.iter().all(|e| &e.partition_key == key) {
        // One group (one key, or keyless events kept in their partition): the batch as it is.
        let to = match key {
            Some(key) => SendTarget::PartitionKey(key.clone()),
            None => SendTarget::Partition(source_partition.to_owned()),
        };
        return vec![(to, items)];
    }
    let mut groups: Vec<(SendTarget, Outgoings)> = Vec::new();
    let mut places: HashMap<Option<String>, usize> = HashMap::new();
    let stamp = items.stamp.clone();
    for item in items.into_items() {
        let key = item.event.partition_key.clone();
        let place = *places.entry(key.clone()).or_insert_with(|| {
            let to = match key {
                Some(key) => SendTarget::PartitionKey(key),
                None if keep_partition => SendTarget::Partition(source_partition.to_owned()),
                None => SendTarget::RoundRobin,
            };
            groups.push((to, Outgoings::sharing_stamp(&stamp)));
            groups.len() - 1
        });
        groups[place].1.push(item);
    }
    groups
}

/// Sends one group in order, cut into batches that fit; returns its poison.
async fn send_group(
    destination: &Destination,
    to: SendTarget,
    items: Outgoings,
    retry: RetryPolicy,
    counting: &Counting<'_>,
) -> Vec<Poison> {
    let key = match &to {
        SendTarget::PartitionKey(key) => Some(key.as_str()),
        _ => None,
    };
    let mut poison = Vec::new();
    let mut sizer = match BatchSizer::new(key) {
        Ok(sizer) => sizer,
        Err(error) => {
            let reason = format!("the partition key cannot be sent: {error}");
            return refuse_all(items, &reason);
        }
    };
    let max = destination.batch_bytes_max;
    if fits_one_batch_at_most(&sizer, &items, max) {
        // The common case: the whole group is one send by the bound alone (nothing encoded
        // to measure it), its items not moved into a batch.
        return send_isolating(destination, &to, items, retry, counting).await;
    }
    let sizes = exact_sizes(&mut sizer, &items);
    if fits_one_batch(&sizes, sizer.envelope_bytes(), max) {
        // The common case: the whole group is one send, its items not moved into a batch.
        return send_isolating(destination, &to, items, retry, counting).await;
    }
    let mut batch = Outgoings::sharing_stamp(&items.stamp);
    let mut batch_bytes = sizer.envelope_bytes();
    let items_stamp = items.stamp.clone();
    for (item, size) in items.into_items().zip(sizes) {
        let bytes = match size {
            Ok(bytes) if sizer.envelope_bytes() + bytes <= max => bytes,
            Ok(bytes) => {
                let reason = format!(
                    "the event takes {bytes} bytes; {} accepts at most {max} per send",
                    destination.target.describe()
                );
                poison.push(Poison {
                    outgoing: item,
                    reason,
                });
                continue;
            }
            Err(error) => {
                let reason = format!("the event cannot be encoded: {error}");
                poison.push(Poison {
                    outgoing: item,
                    reason,
                });
                continue;
            }
        };
        if !batch.is_empty() && (batch_bytes + bytes > max || batch.len() == BATCH_EVENTS_MAX) {
            let full = std::mem::replace(&mut batch, Outgoings::sharing_stamp(&items_stamp));
            poison.extend(send_isolating(destination, &to, full, retry, counting).await);
            batch_bytes = sizer.envelope_bytes();
        }
        batch_bytes += bytes;
        batch.push(item);
    }
    if !batch.is_empty() {
        poison.extend(send_isolating(destination, &to, batch, retry, counting).await);
    }
    poison
}

/// What each of `items` adds to a batch, measured by encoding it (with its stamp).
fn exact_sizes(sizer: &mut BatchSizer, items: &Outgoings) -> Vec<Result<u64, MessageError>> {
    let stamps = items.stamps(&items.places);
    let mut values = stamps
        .map(|stamps| stamps.value_slots())
        .unwrap_or_default();
    (items.events.iter().enumerate())
        .map(|(index, event)| {
            let stamp = stamps
                .as_ref()
                .and_then(|stamps| stamps.of(index, &mut values));
            sizer.event_bytes_stamped(event, stamp)
        })
        .collect()
}

/// Whether `items` go out as one batch by [`BatchSizer::event_bytes_at_most`]: at most
/// [`BATCH_EVENTS_MAX`] of them, within `max` bytes with the envelope even at their widest.
/// An event that cannot be encoded at all takes more than 4 GiB by the bound, so none passes
/// under a `max` below that.
fn fits_one_batch_at_most(sizer: &BatchSizer, items: &Outgoings, max: u64) -> bool {
    let events = &items.events;
    let stamps = items.stamps(&items.places);
    let mut total = sizer.envelope_bytes();
    max < u64::from(u32::MAX)
        && !events.is_empty()
        && events.len() <= BATCH_EVENTS_MAX
        && events.iter().enumerate().all(|(index, event)| {
            // The bound needs no values: a stamp's take a known most.
            let stamp = stamps.as_ref().and_then(|stamps| stamps.bound_of(index));
            total = total.saturating_add(sizer.event_bytes_at_most_stamped(event, stamp));
            total <= max
        })
}

/// Whether events of these `sizes` go out as one batch, as [`send_group`]'s loop would cut
/// them: at least one, at most [`BATCH_EVENTS_MAX`], every one encodable, and all of them with
/// the envelope within `max` bytes (so none is too large on its own either).
fn fits_one_batch(sizes: &[Result<u64, MessageError>], envelope_bytes: u64, max: u64) -> bool {
    let mut total = envelope_bytes;
    !sizes.is_empty()
        && sizes.len() <= BATCH_EVENTS_MAX
        && sizes.iter().all(|size| match size {
            Ok(bytes) => {
                total += bytes;
                total <= max
            }
            Err(_) => false,
        })
}

fn refuse_all(items: Outgoings, reason: &str) -> Vec<Poison> {
    items
        .into_items()
        .map(|outgoing| Poison {
            outgoing,
            reason: reason.to_owned(),
        })
        .collect()
}

/// Sends `batch`; if the target refuses it, halves it until the refused events stand alone.
/// The events are sent from where they lie (no copy); where each was read travels beside them.
async fn send_isolating(
    destination: &Destination,
    to: &SendTarget,
    batch: Outgoings,
    retry: RetryPolicy,
    counting: &Counting<'_>,
) -> Vec<Poison> {
    let mut poison = Vec::new();
    let stamp = batch.stamp.as_deref();
    let mut pending = VecDeque::from([(batch.events, batch.places)]);
    while let Some((mut events, mut places)) = pending.pop_front() {
        assert!(!events.is_empty(), "a batch is never empty");
        assert_eq!(events.len(), places.len(), "every event has its place");
        let stamps = stamp.map(|stamp| BatchStamps {
            stamp,
            places: &places,
        });
        match send_retrying(destination, to, &events, stamps, retry, counting.partition).await {
            Ok(()) => {
                counting.partition.sent(&destination.name, events.len());
                let now_ms = (counting.now_ms)();
                let enqueued = places.iter().map(|(p, _)| p.enqueued_time_ms);
                counting
                    .task
                    .acknowledged(counting.partition, enqueued, now_ms);
            }
            Err(reason) if events.len() == 1 => {
                let (event, (position, undo)) = (events.remove(0), places.remove(0));
                let outgoing = Outgoing {
                    event,
                    position,
                    undo,
                };
                poison.push(Poison { outgoing, reason });
            }
            Err(_) => {
                let half = events.len() / 2;
                let second = (events.split_off(half), places.split_off(half));
                pending.push_front(second);
                pending.push_front((events, places));
            }
        }
    }
    poison
}

/// Sends until the target acknowledges or refuses the events themselves (the refusal's text).
async fn send_retrying(
    destination: &Destination,
    to: &SendTarget,
    events: &[EventData],
    stamps: Option<BatchStamps<'_>>,
    retry: RetryPolicy,
    partition: &PartitionMetrics,
) -> Result<(), String> {
    let mut pause = retry.backoff_min;
    let mut attempt: u64 = 0;
    loop {
        let error = match destination.target.send(events, stamps, to).await {
            Ok(()) => return Ok(()),
            Err(TargetError::Refused(reason)) => return Err(reason),
            Err(error) => error,
        };
        attempt += 1;
        partition.retried();
        match &error {
            TargetError::Misconfigured(_) => tracing::error!(
                target_name = %destination.name,
                attempt,
                retry_in_ms = pause.as_millis() as u64,
                %error,
                "cannot send to {}; fix the task's target, sends are retried",
                destination.target.describe()
            ),
            _ => tracing::warn!(
                target_name = %destination.name,
                attempt,
                retry_in_ms = pause.as_millis() as u64,
                %error,
                "sending to {} failed; retrying",
                destination.target.describe()
            ),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(retry.backoff_max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(key: Option<&str>, seq: i64) -> Outgoing {
        let mut event = EventData::new(format!("{seq}"));
        event.partition_key = key.map(str::to_owned);
        Outgoing {
            event,
            position: Position {
                sequence_number: seq,
                offset: seq as u64,
                enqueued_time_ms: 0,
            },
            undo: Undo::default(),
        }
    }

    #[test]
    fn outgoings_keep_each_event_beside_its_place() {
        let items: Vec<_> = (0..4).map(|seq| item(Some("k"), seq)).collect();
        let list: Outgoings = items.iter().cloned().collect();
        assert_eq!(list.len(), 4);
        for (event, (position, _)) in list.events.iter().zip(&list.places) {
            assert_eq!(
                &event.body[..],
                position.sequence_number.to_string().as_bytes()
            );
        }
        assert_eq!(list.into_items().collect::<Vec<_>>(), items);
        assert!(Outgoings::with_capacity(8).is_empty());
    }

    #[test]
    fn groups_keep_source_order_per_key() {
        let items = vec![
            item(Some("a"), 0),
            item(None, 1),
            item(Some("b"), 2),
            item(Some("a"), 3),
            item(None, 4),
        ];
        let groups = group(items.iter().cloned().collect(), true, "3");
        let seqs: Vec<(SendTarget, Vec<i64>)> = groups
            .into_iter()
            .map(|(to, g)| {
                (
                    to,
                    g.places.iter().map(|(p, _)| p.sequence_number).collect(),
                )
            })
            .collect();
        assert_eq!(
            seqs,
            vec![
                (SendTarget::PartitionKey("a".into()), vec![0, 3]),
                (SendTarget::Partition("3".into()), vec![1, 4]),
                (SendTarget::PartitionKey("b".into()), vec![2]),
            ]
        );
        let spread = group(items.into_iter().collect(), false, "3");
        assert_eq!(spread[1].0, SendTarget::RoundRobin);
    }

    #[test]
    fn a_batch_of_one_key_or_of_kept_keyless_events_is_one_group() {
        let keyed: Outgoings = (0..3).map(|seq| item(Some("a"), seq)).collect();
        let groups = group(keyed.clone(), false, "3");
        assert_eq!(groups, vec![(SendTarget::PartitionKey("a".into()), keyed)]);
        let keyless: Outgoings = (0..3).map(|seq| item(None, seq)).collect();
        let groups = group(keyless.clone(), true, "3");
        assert_eq!(
            groups,
            vec![(SendTarget::Partition("3".into()), keyless.clone())]
        );
        let spread = group(keyless, false, "3");
        assert_eq!(spread.len(), 1);
        assert_eq!(spread[0].0, SendTarget::RoundRobin);
        assert!(group(Outgoings::default(), true, "3").is_empty());
    }

    #[test]
    fn one_batch_only_when_the_loop_would_not_cut() {
        let ok = |sizes: &[u64]| -> Vec<Result<u64, MessageError>> {
            sizes.iter().map(|&bytes| Ok(bytes)).collect()
        };
        assert!(fits_one_batch(&ok(&[10, 20, 30]), 5, 65));
        assert!(!fits_one_batch(&ok(&[10, 20, 30]), 5, 64), "over the limit");
        assert!(!fits_one_batch(&ok(&[]), 5, 64), "empty");
        assert!(!fits_one_batch(&ok(&[70]), 5, 64), "one too large");
        assert!(!fits_one_batch(
            &ok(&[1; BATCH_EVENTS_MAX + 1]),
            0,
            u64::MAX
        ));
        assert!(fits_one_batch(&ok(&[1; BATCH_EVENTS_MAX]), 0, u64::MAX));
        let mut sizes = ok(&[10]);
        sizes.push(Err(MessageError::TooLong {
            what: "the body",
            length: 1,
            max: 0,
        }));
        assert!(!fits_one_batch(&sizes, 5, 1000), "one not encodable");
    }
}
