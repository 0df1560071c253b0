//! `send --receipts` over AMQP: each batch's sequence numbers and offsets, read back from the hub.
//!
//! An AMQP acknowledgement tells a producer only that the hub stored its batch, not where. So
//! against a remote hub (the `tributary serve` of the data directory, or any hub named by a
//! connection string, Azure Event Hubs included) the CLI finds each batch again:
//!
//! 1. Before the first batch to a partition it asks the partition's last enqueued sequence
//!    number (`$management`) and opens a receiver just after it, in `$Default`.
//! 2. Every event without a message id is given one, unique to this run and event
//!    ([`Marker`]); events that have one keep it.
//! 3. After the hub accepts a transfer (to the partition given, the one its key hashes to, or the
//!    one the CLI chose round-robin), the receiver reads on until it meets the transfer's events
//!    in a row — a transfer is stored contiguously — matched by message id and body. Their
//!    sequence numbers, offsets and enqueued time are the receipt; events that other producers
//!    sent in between are skipped.
//!
//! # Guarantees
//!
//! - A receipt names only events read back from the partition; one not found within
//!   [`READ_BACK_WAIT`] is an error naming the partition, never a guess.
//! - Reading needs the Listen right besides Send; without it the error names the right before
//!   the first event is sent.
//! - Memory stays bounded: events that cannot start the transfer sought are dropped as they come,
//!   so at most one transfer's worth is held.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use tributary_broker::SendReceipt;
use tributary_client::{ClientError, EventReceiver, RemoteHub};
use tributary_event::{EventData, EventPosition, ReceivedEvent, SendTarget};

/// How long a transfer the hub accepted may take to be read back before the CLI gives up: a
/// stored batch is readable at once, so this allows for a slow hub and a long queue of other
/// producers' events before it, not for a normal case.
pub const READ_BACK_WAIT: Duration = Duration::from_secs(30);

/// How long the first receiver is given to be refused (Tributary completes the attach of a
/// receiver it refuses and detaches it at once), so a missing Listen right is found before
/// anything is sent: one round trip on a local hub, with room to spare.
const REFUSAL_WAIT: Duration = Duration::from_millis(300);

/// The events a receiver buffers ahead: a transfer is at most the hub's message size (1 MiB on
/// Event Hubs), a few thousand small events.
const PREFETCH: u32 = 1000;

/// The consumer group the receipts are read in: it always exists.
const GROUP: &str = "$Default";

/// Message ids for events that have none: 64 random bits for the run, then a counter, written
/// as a UUID, so no two events of one run share one and two runs almost surely do not.
#[derive(Debug)]
pub struct Marker {
    run: u64,
    next: u64,
}

impl Marker {
    /// A marker with a fresh random run id.
    pub fn new() -> Self {
        // Random without a dependency: std's hasher keys are random per process.
        let random = std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), 0u8);
        Marker {
            run: random,
            next: 0,
        }
    }

    /// Gives every event without a message id one.
    pub fn mark(&mut self, events: &mut [EventData]) {
        for event in events.iter_mut().filter(|e| e.message_id.is_none()) {
            let mut id = [0u8; 16];
            id[..8].copy_from_slice(&self.run.to_be_bytes());
            id[8..].copy_from_slice(&self.next.to_be_bytes());
            self.next += 1;
            event.message_id = Some(tributary_event::uuid_text(&id));
        }
    }
}

/// One partition's receiver and the events read from it not yet matched.
struct PartitionReader {
    receiver: EventReceiver,
    pending: VecDeque<ReceivedEvent>,
}

/// Reads the batches a `send` sends back from the hub; see the module docs.
pub struct ReadBack {
    hub: RemoteHub,
    partition_ids: Vec<String>,
    marker: Marker,
    readers: HashMap<String, PartitionReader>,
    /// Whether a receiver has been tried for a refusal (the rights are the same for every
    /// partition, so the first one tells).
    listen_checked: bool,
}

impl ReadBack {
    /// Reads back from `hub`, whose partitions are `partition_ids`.
    pub fn new(hub: RemoteHub, partition_ids: Vec<String>) -> Self {
        assert!(!partition_ids.is_empty());
        ReadBack {
            hub,
            partition_ids,
            marker: Marker::new(),
            readers: HashMap::new(),
            listen_checked: false,
        }
    }

    /// The partition a batch to `target` is stored in: the one named, or the one its key
    /// hashes to (the Event Hubs hash, as the hub routes it).
    pub fn partition_of(&self, target: &SendTarget) -> Result<String> {
        match target {
            SendTarget::Partition(partition) => Ok(partition.clone()),
            SendTarget::PartitionKey(key) => {
                let count = u32::try_from(self.partition_ids.len())?;
                let index = tributary_event::partition_for_key(key, count) as usize;
                Ok(self.partition_ids[index].clone())
            }
            // `send` picks a partition for each event itself (see `input::Spreader`), so that
            // its receipt can be found.
            SendTarget::RoundRobin => bail!("a receipt needs the batch's partition"),
        }
    }

    /// Gets ready to find batches sent to `partition` from now on (a receiver after its last
    /// event), and marks `events` so they can be found.
    pub async fn prepare(&mut self, partition: &str, events: &mut [EventData]) -> Result<()> {
        self.marker.mark(events);
        if self.readers.contains_key(partition) {
            return Ok(());
        }
        let last = self
            .hub
            .partition_properties(partition)
            .await
            .map_err(|e| read_error(partition, e))?
            .last_enqueued_sequence_number;
        let start = if last < 0 {
            EventPosition::Earliest
        } else {
            EventPosition::SequenceNumber {
                sequence_number: last,
                inclusive: false,
            }
        };
        let mut receiver = self
            .hub
            .consumer()
            .open_receiver(partition, GROUP, start, None, PREFETCH)
            .await
            .map_err(|e| read_error(partition, e))?;
        let mut pending = VecDeque::new();
        if !self.listen_checked {
            let events = receiver
                .receive(PREFETCH as usize, REFUSAL_WAIT)
                .await
                .map_err(|e| read_error(partition, e))?;
            pending.extend(events);
            self.listen_checked = true;
        }
        let reader = PartitionReader { receiver, pending };
        self.readers.insert(partition.to_owned(), reader);
        Ok(())
    }

    /// The receipt of `events`, which the hub accepted in one transfer to `partition` (prepared
    /// with [`ReadBack::prepare`]).
    pub async fn find(&mut self, partition: &str, events: &[EventData]) -> Result<SendReceipt> {
        assert!(!events.is_empty());
        let reader = self
            .readers
            .get_mut(partition)
            .expect("the partition was prepared before the send");
        let deadline = Instant::now() + READ_BACK_WAIT;
        loop {
            if let Some(found) = take_batch(&mut reader.pending, events) {
                return receipt(partition, &found);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "the hub accepted the batch but it was not found in partition {partition} within {} s \
                     (a hub that routes partition keys by another hash than Event Hubs' would store it elsewhere)",
                    READ_BACK_WAIT.as_secs()
                );
            }
            let more = reader
                .receiver
                .receive(PREFETCH as usize, left)
                .await
                .map_err(|e| read_error(partition, e))?;
            reader.pending.extend(more);
        }
    }
}

/// The error for a failed read of `partition`; a refusal names the Listen right.
fn read_error(partition: &str, error: ClientError) -> anyhow::Error {
    match error {
        ClientError::Unauthorized { .. } => anyhow!(
            "--receipts reads each batch back to learn its sequence numbers, which needs the Listen right besides Send \
             (use a policy with Listen or Manage, or send without --receipts): {error}"
        ),
        error => anyhow!(error).context(format!(
            "--receipts: cannot read partition {partition} back in consumer group {GROUP}"
        )),
    }
}

/// Whether a received event is `sent`: the same message id and body.
fn same(received: &ReceivedEvent, sent: &EventData) -> bool {
    received.data.message_id == sent.message_id && received.data.body == sent.body
}

/// Drops from the front of `pending` every event that cannot start `batch`, and takes the batch
/// once all its events are there in a row; `None` while they are not (yet).
fn take_batch(
    pending: &mut VecDeque<ReceivedEvent>,
    batch: &[EventData],
) -> Option<Vec<ReceivedEvent>> {
    loop {
        let matched = pending
            .iter()
            .zip(batch)
            .take_while(|(received, sent)| same(received, sent))
            .count();
        if matched == batch.len() {
            return Some(pending.drain(..batch.len()).collect());
        }
        if matched == pending.len() {
            // Everything so far starts the batch: wait for the rest (or nothing is pending).
            return None;
        }
        pending.pop_front();
    }
}

/// The receipt of a batch's events as read back.
fn receipt(partition: &str, found: &[ReceivedEvent]) -> Result<SendReceipt> {
    let first = found.first().expect("a batch has events");
    Ok(SendReceipt {
        partition: partition
            .parse()
            .map_err(|_| anyhow!("partition id {partition:?} is not a number"))?,
        base_sequence: first.sequence_number,
        offsets: found.iter().map(|e| e.offset).collect(),
        enqueued_time_ms: first.enqueued_time_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(sequence_number: i64, event: &EventData) -> ReceivedEvent {
        ReceivedEvent {
            sequence_number,
            offset: 100 * sequence_number as u64,
            enqueued_time_ms: 1_700_000_000_000,
            data: event.clone(),
        }
    }

    #[test]
    fn marks_only_events_without_a_message_id_and_never_twice_the_same() {
        let mut marker = Marker::new();
        let mut events = vec![EventData::new("a"), EventData::new("b")];
        events[1].message_id = Some("mine".into());
        marker.mark(&mut events);
        let mut more = vec![EventData::new("a")];
        marker.mark(&mut more);
        assert_eq!(events[1].message_id.as_deref(), Some("mine"));
        let first = events[0].message_id.clone().unwrap();
        let second = more[0].message_id.clone().unwrap();
        assert_ne!(first, second);
        assert_eq!(first.len(), 36, "a UUID's text: {first}");
    }

    #[test]
    fn a_batch_is_found_after_other_producers_events_even_when_it_arrives_in_parts() {
        let mut marker = Marker::new();
        let mut batch = vec![EventData::new("x"), EventData::new("y")];
        marker.mark(&mut batch);
        let mut other = batch.clone();
        other[1].body = "not y".into();
        let mut pending = VecDeque::from([
            received(5, &EventData::new("someone else")),
            received(6, &other[0]),
            received(7, &other[1]),
            received(8, &batch[0]),
        ]);
        assert!(take_batch(&mut pending, &batch).is_none());
        assert_eq!(pending.len(), 1, "what cannot start the batch is dropped");
        pending.push_back(received(9, &batch[1]));
        let found = take_batch(&mut pending, &batch).unwrap();
        let receipt = receipt("3", &found).unwrap();
        assert_eq!(receipt.partition, 3);
        assert_eq!(receipt.base_sequence, 8);
        assert_eq!(receipt.offsets, vec![800, 900]);
        assert!(pending.is_empty());
    }
}
