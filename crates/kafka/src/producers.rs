//! Idempotent producers: the producer ids InitProducerId hands out, and per (producer id,
//! partition) the sequence checks Kafka brokers make, so a batch a producer retries after a
//! lost acknowledgement is acknowledged again instead of stored twice, across restarts too.
//!
//! # The rules (Kafka's, for a batch with producer id, epoch and base sequence)
//! Per partition, each producer's last [`PRODUCER_BATCHES_KEPT`] stored batches are kept: their
//! first and last sequence numbers and the offset their first record was stored at.
//! - A batch repeating one of them (same epoch, first and last sequence) is a retry whose
//!   acknowledgement was lost: it is acknowledged with the offset it was stored at, and not
//!   stored again.
//! - A batch continuing the newest one (its first sequence one past the newest's last, wrapping
//!   after `i32::MAX` to 0) is stored; any other sequence is OUT_OF_ORDER_SEQUENCE_NUMBER.
//! - An epoch below the producer's is INVALID_PRODUCER_EPOCH (what Kafka answers a Produce at
//!   every version; PRODUCER_FENCED is for transactional APIs). A higher epoch must start at
//!   sequence 0 (else OUT_OF_ORDER_SEQUENCE_NUMBER) and replaces the producer's batches.
//! - A producer id with no state here is accepted at any sequence, as Kafka does since 2.x once
//!   a producer's state expired, rather than answered UNKNOWN_PRODUCER_ID: librdkafka treats
//!   that error on a retried batch as fatal (it cannot know whether the batch was stored), and
//!   a restarted server is exactly where retries arrive. The state that would recognise those
//!   retries is rebuilt before any is judged (below), so "unknown" means "nothing of this
//!   producer in the partition's recent tail".
//!
//! Checks and appends of one partition's idempotent batches are serialized (an async mutex per
//! partition, held from the check to the acknowledged append), so two connections producing to
//! the same partition cannot both pass the check for the same sequence. Other partitions, and
//! batches without a producer id, are not held back.
//!
//! # Durability: exactly as durable as the events
//! The state is never written on its own. Each idempotent batch is appended with a door stamp
//! (`tributary_broker::door_stamp`) on its first event: producer id, epoch, first and last
//! sequence, in a property the broker stores with the event and hides from every reader, so no
//! Kafka, AMQP or HTTP consumer sees a new property and a replication task never copies it.
//! The stamp is written by the same append as the events, so there is no moment (kill -9
//! included) when events are stored but the stamp that recognises their retry is not, nor the
//! reverse. The in-memory state is only a cache of those stamps:
//! - it is updated only after the append is acknowledged (a failed append forgets the
//!   partition's state, which is rebuilt before its next idempotent batch);
//! - after a restart (of the door or the whole server) a partition's state is rebuilt from the
//!   stamps in the last [`PRODUCER_TAIL_SCAN_BYTES`] of the partition before its first
//!   idempotent batch is judged. The batches a producer retries after a crash are the ones it
//!   had in flight, appended just before the crash, so they are in that tail.
//!
//! Producer ids never repeat, restarts included: each is at least the wall clock's milliseconds
//! times [`PRODUCER_IDS_PER_MS`], and above every id a previous run could have handed out: ids
//! are reserved in blocks of [`PRODUCER_ID_BLOCK`] by writing the block's end, synced, to
//! `kafka/producer-ids` in the data directory before any id of the block is handed out. Every
//! door of one broker (plain and TLS listeners) shares one [`Producers`].
//!
//! # Bounded memory
//! At most [`PRODUCERS_PER_PARTITION_MAX`] producers are kept per partition (the least
//! recently appending one is forgotten first), and a producer that has not appended for
//! [`PRODUCER_IDLE_EXPIRATION_MS`] (Kafka's `producer.id.expiration.ms`) is forgotten. A
//! forgotten producer is one with no state: its next batch is accepted at any sequence.
//! Partitions whose producers have all expired are dropped once more than
//! [`PRODUCER_PARTITIONS_PRUNE_AT`] are kept, so hubs deleted and created do not accumulate.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::records::{NO_PRODUCER_ID, RecordBatchDecoder};
use tributary_broker::Broker;
use tributary_event::{EventData, EventPosition};

use crate::error;
use crate::limits::{
    PRODUCER_BATCHES_KEPT, PRODUCER_ID_BLOCK, PRODUCER_IDLE_EXPIRATION_MS, PRODUCER_IDS_PER_MS,
    PRODUCER_PARTITIONS_PRUNE_AT, PRODUCER_TAIL_SCAN_BYTES, PRODUCERS_PER_PARTITION_MAX,
};

/// An idempotent batch's identity: who sent it, and which sequence numbers it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchIdentity {
    /// The producer id InitProducerId handed out.
    pub(crate) producer_id: i64,
    /// The producer's epoch.
    pub(crate) epoch: i16,
    /// The sequence number of the batch's first record.
    pub(crate) first_sequence: i32,
    /// The sequence number of its last record (wrapped past `i32::MAX` to 0, as Kafka's).
    pub(crate) last_sequence: i32,
}

/// The version byte a door stamp starts with; a stamp of another version is ignored.
const STAMP_VERSION: u8 = 1;
/// Bytes in a stamp: version, producer id, epoch, first and last sequence (big-endian).
const STAMP_BYTES: usize = 1 + 8 + 2 + 4 + 4;

impl BatchIdentity {
    /// The identity of the idempotent batch in `records`, or `None` when it has no producer id
    /// (an ordinary batch). An idempotent produce carries exactly one batch, as Kafka requires;
    /// more, or a negative sequence, is INVALID_RECORD. Batches that do not decode are left to
    /// [`crate::batches::events`], which refuses them.
    pub(crate) fn of(records: Option<&Bytes>) -> Result<Option<BatchIdentity>, i16> {
        let invalid = ResponseError::InvalidRecord.code();
        let Some(records) = records else {
            return Ok(None);
        };
        let Ok(batches) = RecordBatchDecoder::decode_batch_info(&mut records.clone()) else {
            return Ok(None);
        };
        let Some(first) = batches.first() else {
            return Ok(None);
        };
        if first.producer_id == NO_PRODUCER_ID {
            return Ok(None);
        }
        if batches.len() != 1 || first.base_sequence < 0 || first.record_count < 1 {
            return Err(invalid);
        }
        let last = (i64::from(first.base_sequence) + i64::from(first.record_count) - 1)
            % (i64::from(i32::MAX) + 1);
        Ok(Some(BatchIdentity {
            producer_id: first.producer_id,
            epoch: first.producer_epoch,
            first_sequence: first.base_sequence,
            last_sequence: i32::try_from(last).expect("reduced modulo 2^31"),
        }))
    }

    /// The door stamp stored with the batch's first event.
    pub(crate) fn stamp(&self) -> [u8; STAMP_BYTES] {
        let mut out = [0u8; STAMP_BYTES];
        out[0] = STAMP_VERSION;
        out[1..9].copy_from_slice(&self.producer_id.to_be_bytes());
        out[9..11].copy_from_slice(&self.epoch.to_be_bytes());
        out[11..15].copy_from_slice(&self.first_sequence.to_be_bytes());
        out[15..19].copy_from_slice(&self.last_sequence.to_be_bytes());
        out
    }

    /// The identity a stamp holds; `None` for bytes that are not a stamp of this version.
    pub(crate) fn from_stamp(stamp: &[u8]) -> Option<BatchIdentity> {
        let stamp: &[u8; STAMP_BYTES] = stamp.try_into().ok()?;
        if stamp[0] != STAMP_VERSION {
            return None;
        }
        let identity = BatchIdentity {
            producer_id: i64::from_be_bytes(stamp[1..9].try_into().ok()?),
            epoch: i16::from_be_bytes(stamp[9..11].try_into().ok()?),
            first_sequence: i32::from_be_bytes(stamp[11..15].try_into().ok()?),
            last_sequence: i32::from_be_bytes(stamp[15..19].try_into().ok()?),
        };
        (identity.producer_id >= 0 && identity.first_sequence >= 0 && identity.last_sequence >= 0)
            .then_some(identity)
    }
}

/// Whether `next` follows `last` (Kafka's sequences wrap from `i32::MAX` to 0).
fn in_sequence(last: i32, next: i32) -> bool {
    (last == i32::MAX && next == 0) || i64::from(next) == i64::from(last) + 1
}

/// One stored batch of a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StoredBatch {
    first_sequence: i32,
    last_sequence: i32,
    /// The sequence number (Kafka offset) of its first event.
    base_offset: i64,
}

/// One producer's state in one partition.
#[derive(Debug)]
struct ProducerState {
    epoch: i16,
    /// Oldest first; never empty, at most [`PRODUCER_BATCHES_KEPT`].
    batches: VecDeque<StoredBatch>,
    /// When it last appended (or was read back from the log), ms since the epoch.
    last_append_ms: i64,
}

/// What to do with an idempotent batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Store it.
    Append,
    /// Already stored at this offset: acknowledge it again.
    Duplicate(i64),
    /// Refuse it with this error code.
    Refuse(i16),
}

/// The producers of one partition.
#[derive(Debug, Default)]
pub(crate) struct PartitionProducers {
    /// Whether the state was rebuilt from the partition's tail since this door started.
    loaded: bool,
    producers: HashMap<i64, ProducerState>,
}

impl PartitionProducers {
    /// What the rules (module docs) say of `batch`.
    pub(crate) fn check(&self, batch: &BatchIdentity) -> Verdict {
        let out_of_order = ResponseError::OutOfOrderSequenceNumber.code();
        let Some(producer) = self.producers.get(&batch.producer_id) else {
            return Verdict::Append;
        };
        if batch.epoch < producer.epoch {
            return Verdict::Refuse(ResponseError::InvalidProducerEpoch.code());
        }
        if batch.epoch > producer.epoch {
            return if batch.first_sequence == 0 {
                Verdict::Append
            } else {
                Verdict::Refuse(out_of_order)
            };
        }
        let repeated = producer.batches.iter().find(|stored| {
            stored.first_sequence == batch.first_sequence
                && stored.last_sequence == batch.last_sequence
        });
        if let Some(stored) = repeated {
            return Verdict::Duplicate(stored.base_offset);
        }
        let newest = producer.batches.back().expect("a producer has a batch");
        if in_sequence(newest.last_sequence, batch.first_sequence) {
            Verdict::Append
        } else {
            Verdict::Refuse(out_of_order)
        }
    }

    /// Records `batch` as stored at `base_offset` (appended now, or read back from the log).
    pub(crate) fn record(&mut self, batch: &BatchIdentity, base_offset: i64, now_ms: i64) {
        let stored = StoredBatch {
            first_sequence: batch.first_sequence,
            last_sequence: batch.last_sequence,
            base_offset,
        };
        let producer = self
            .producers
            .entry(batch.producer_id)
            .or_insert_with(|| ProducerState {
                epoch: batch.epoch,
                batches: VecDeque::with_capacity(PRODUCER_BATCHES_KEPT),
                last_append_ms: now_ms,
            });
        if batch.epoch != producer.epoch {
            producer.epoch = batch.epoch;
            producer.batches.clear();
        }
        if producer.batches.len() == PRODUCER_BATCHES_KEPT {
            producer.batches.pop_front();
        }
        producer.batches.push_back(stored);
        producer.last_append_ms = producer.last_append_ms.max(now_ms);
        assert!(producer.batches.len() <= PRODUCER_BATCHES_KEPT);
        self.evict_over_cap();
    }

    /// Forgets producers idle for longer than [`PRODUCER_IDLE_EXPIRATION_MS`].
    pub(crate) fn expire(&mut self, now_ms: i64) {
        self.producers.retain(|_, producer| {
            now_ms.saturating_sub(producer.last_append_ms) <= PRODUCER_IDLE_EXPIRATION_MS
        });
    }

    /// Forgets the least recently appending producers beyond [`PRODUCERS_PER_PARTITION_MAX`].
    fn evict_over_cap(&mut self) {
        while self.producers.len() > PRODUCERS_PER_PARTITION_MAX {
            let oldest = self
                .producers
                .iter()
                .min_by_key(|(_, producer)| producer.last_append_ms)
                .map(|(id, _)| *id)
                .expect("over the cap, so not empty");
            self.producers.remove(&oldest);
        }
    }

    /// How many producers are kept.
    pub(crate) fn len(&self) -> usize {
        self.producers.len()
    }
}

/// Where producer ids come from (see the module docs).
#[derive(Debug)]
struct IdSource {
    /// Where the end of the reserved block is kept.
    path: PathBuf,
    next: i64,
    /// Ids below this are reserved (written to `path`); `next` may reach it, not pass it.
    reserved_end: i64,
}

impl IdSource {
    /// Reads the end of the block a previous run reserved, if any.
    fn open(data_dir: &Path) -> IdSource {
        let path = data_dir.join("kafka").join("producer-ids");
        let recorded = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| text.trim().parse::<i64>().ok())
            .unwrap_or(0);
        IdSource {
            path,
            next: recorded.max(0),
            reserved_end: recorded.max(0),
        }
    }

    /// The next producer id, reserving (durably) a new block when this one is used up.
    fn next(&mut self, now_ms: i64) -> std::io::Result<i64> {
        let floor = now_ms.max(0).saturating_mul(PRODUCER_IDS_PER_MS);
        self.next = self.next.max(floor);
        if self.next >= self.reserved_end {
            let end = self.next.saturating_add(PRODUCER_ID_BLOCK);
            write_synced(&self.path, &end.to_string())?;
            self.reserved_end = end;
        }
        let id = self.next;
        self.next += 1;
        assert!(id < self.reserved_end);
        Ok(id)
    }
}

/// Replaces `path`'s contents with `text`, synced, through a renamed temporary file so a crash
/// leaves the old contents or the new, never a torn file.
fn write_synced(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path.parent().expect("the id file is in a directory");
    std::fs::create_dir_all(dir)?;
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// A partition's producers, behind the mutex that serializes its idempotent appends.
type PartitionSlot = Arc<tokio::sync::Mutex<PartitionProducers>>;

/// The producer ids and the per-partition producer state of one broker's Kafka doors.
#[derive(Debug)]
pub(crate) struct Producers {
    ids: Mutex<IdSource>,
    /// Keyed by the hub's id (a hub deleted and created again under its name starts afresh)
    /// and the partition.
    partitions: Mutex<HashMap<(String, u32), PartitionSlot>>,
}

/// The [`Producers`] of each data directory in this process, so that every door of a broker
/// shares one.
static SHARED: OnceLock<Mutex<HashMap<PathBuf, Weak<Producers>>>> = OnceLock::new();

impl Producers {
    /// The producers of `broker`'s doors: the one its other doors use, or a new one.
    pub(crate) fn of(broker: &Broker) -> Arc<Producers> {
        let data_dir = broker.config().data_dir.clone();
        let mut shared = SHARED
            .get_or_init(Mutex::default)
            .lock()
            .expect("producers registry");
        shared.retain(|_, producers| producers.strong_count() > 0);
        if let Some(producers) = shared.get(&data_dir).and_then(Weak::upgrade) {
            return producers;
        }
        let producers = Arc::new(Producers {
            ids: Mutex::new(IdSource::open(&data_dir)),
            partitions: Mutex::default(),
        });
        shared.insert(data_dir, Arc::downgrade(&producers));
        producers
    }

    /// A new producer id; the error code when the block it needs cannot be reserved.
    pub(crate) fn new_id(&self, now_ms: i64) -> Result<i64, i16> {
        let mut ids = self.ids.lock().expect("producer ids");
        ids.next(now_ms).map_err(|e| {
            tracing::warn!(path = %ids.path.display(), error = %e, "cannot reserve Kafka producer ids");
            ResponseError::CoordinatorLoadInProgress.code()
        })
    }

    /// The slot of (`hub_id`, `partition`). A new slot past [`PRODUCER_PARTITIONS_PRUNE_AT`]
    /// first drops the ones nobody is using whose producers have all expired (a deleted hub's,
    /// a partition no idempotent producer writes to any more).
    fn slot(&self, hub_id: &str, partition: u32, now_ms: i64) -> PartitionSlot {
        let mut partitions = self.partitions.lock().expect("producer partitions");
        let key = (hub_id.to_owned(), partition);
        if let Some(slot) = partitions.get(&key) {
            return slot.clone();
        }
        if partitions.len() >= PRODUCER_PARTITIONS_PRUNE_AT {
            partitions.retain(|_, slot| {
                // Only the map holds it, and the map is locked: nobody can start using it.
                if Arc::strong_count(slot) > 1 {
                    return true;
                }
                let Ok(mut state) = slot.try_lock() else {
                    return true;
                };
                state.expire(now_ms);
                state.len() > 0
            });
        }
        partitions.entry(key).or_default().clone()
    }

    /// Checks `batch` against the rules and appends `events` to `partition` of `hub` if they
    /// say so; returns the offset the batch is (or already was) stored at, or the error code.
    pub(crate) async fn append(
        &self,
        broker: &Broker,
        (hub, hub_id, partition): (&str, &str, u32),
        batch: BatchIdentity,
        events: Vec<EventData>,
    ) -> Result<i64, i16> {
        let slot = self.slot(hub_id, partition, broker.clock().now_ms());
        let mut state = slot.lock().await;
        let partition_id = partition.to_string();
        if !state.loaded {
            *state = rebuild(broker, hub, &partition_id).await?;
        }
        let now_ms = broker.clock().now_ms();
        state.expire(now_ms);
        match state.check(&batch) {
            Verdict::Append => {}
            Verdict::Duplicate(base_offset) => {
                tracing::debug!(
                    hub,
                    partition,
                    producer_id = batch.producer_id,
                    first_sequence = batch.first_sequence,
                    base_offset,
                    "a retried idempotent batch acknowledged again, not stored twice"
                );
                return Ok(base_offset);
            }
            Verdict::Refuse(code) => return Err(code),
        }
        let appended = broker
            .send_to_partition_stamped(hub, &partition_id, events, &batch.stamp())
            .await;
        match appended {
            Ok(receipt) => {
                state.record(&batch, receipt.base_sequence, now_ms);
                Ok(receipt.base_sequence)
            }
            Err(e) => {
                // Whether a failed append reached the disk is not known here: read it back
                // from the log before the next batch is judged.
                state.loaded = false;
                tracing::debug!(hub, partition, error = %e, "an idempotent Kafka produce was refused");
                Err(error::code(&e))
            }
        }
    }
}

/// The producers of partition `partition` of `hub` as the stamps in its last
/// [`PRODUCER_TAIL_SCAN_BYTES`] record them. Reads the log on the blocking pool.
async fn rebuild(broker: &Broker, hub: &str, partition: &str) -> Result<PartitionProducers, i16> {
    let (broker, hub, partition) = (broker.clone(), hub.to_owned(), partition.to_owned());
    let storage_error = ResponseError::KafkaStorageError.code();
    tokio::task::spawn_blocking(move || rebuild_blocking(&broker, &hub, &partition))
        .await
        .map_err(|_| storage_error)?
        .map_err(|e| error::code(&e))
}

fn rebuild_blocking(
    broker: &Broker,
    hub: &str,
    partition: &str,
) -> Result<PartitionProducers, tributary_broker::BrokerError> {
    /// Events read per call while scanning.
    const SCAN_EVENTS: usize = 4096;
    const SCAN_READ_BYTES: u64 = 4 * 1024 * 1024;
    let mut state = PartitionProducers {
        loaded: true,
        ..PartitionProducers::default()
    };
    let properties = broker.partition_properties(hub, partition)?;
    let Some(last_offset) = properties.last_enqueued_offset else {
        return Ok(state);
    };
    if properties.is_empty {
        return Ok(state);
    }
    let end = properties.last_enqueued_sequence_number + 1;
    let tail = EventPosition::Offset {
        offset: last_offset.saturating_sub(PRODUCER_TAIL_SCAN_BYTES),
        inclusive: true,
    };
    let mut from = broker.resolve_position(hub, partition, &tail)?;
    let now_ms = broker.clock().now_ms();
    let mut stamps = 0usize;
    while from < end {
        let found = broker.read_door_stamps(hub, partition, from, SCAN_EVENTS, SCAN_READ_BYTES)?;
        let next = found.next_sequence;
        for (sequence, stamp) in found.stamps {
            if let Some(batch) = BatchIdentity::from_stamp(&stamp) {
                state.record(&batch, sequence, now_ms);
                stamps += 1;
            }
        }
        if next <= from {
            break;
        }
        from = next;
    }
    tracing::debug!(
        hub,
        partition,
        stamps,
        producers = state.len(),
        "Kafka producer state rebuilt from the partition's tail"
    );
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(producer_id: i64, epoch: i16, first: i32, count: i32) -> BatchIdentity {
        BatchIdentity {
            producer_id,
            epoch,
            first_sequence: first,
            last_sequence: first + count - 1,
        }
    }

    #[test]
    fn retries_of_the_last_five_batches_are_duplicates_and_gaps_and_old_epochs_refused() {
        let mut state = PartitionProducers::default();
        let out_of_order = Verdict::Refuse(ResponseError::OutOfOrderSequenceNumber.code());
        assert_eq!(state.check(&batch(7, 0, 40, 2)), Verdict::Append, "unknown");
        for i in 0..6 {
            let b = batch(7, 0, i * 2, 2);
            assert_eq!(state.check(&b), Verdict::Append);
            state.record(&b, 100 + i64::from(i) * 10, 0);
        }
        // The first batch fell out of the last five; the others are each recognised.
        assert_eq!(state.check(&batch(7, 0, 0, 2)), out_of_order);
        for i in 1..6 {
            let expected = Verdict::Duplicate(100 + i64::from(i) * 10);
            assert_eq!(state.check(&batch(7, 0, i * 2, 2)), expected);
        }
        assert_eq!(state.check(&batch(7, 0, 10, 1)), out_of_order, "same start");
        assert_eq!(state.check(&batch(7, 0, 13, 1)), out_of_order, "a gap");
        assert_eq!(state.check(&batch(7, 0, 12, 1)), Verdict::Append);
        let invalid_epoch = ResponseError::InvalidProducerEpoch.code();
        state.record(&batch(7, 1, 0, 1), 200, 0);
        assert_eq!(
            state.check(&batch(7, 0, 12, 1)),
            Verdict::Refuse(invalid_epoch)
        );
        assert_eq!(state.check(&batch(7, 2, 5, 1)), out_of_order);
        assert_eq!(state.check(&batch(7, 2, 0, 1)), Verdict::Append);
    }

    #[test]
    fn sequences_wrap_and_stamps_round_trip() {
        assert!(in_sequence(i32::MAX, 0));
        assert!(!in_sequence(i32::MAX, 1));
        let b = batch(1 << 50, 3, 9, 4);
        assert_eq!(BatchIdentity::from_stamp(&b.stamp()), Some(b));
        assert_eq!(BatchIdentity::from_stamp(&b.stamp()[1..]), None);
        let mut other_version = b.stamp();
        other_version[0] = 2;
        assert_eq!(BatchIdentity::from_stamp(&other_version), None);
    }

    #[test]
    fn idle_producers_expire_and_the_cap_forgets_the_least_recent() {
        let mut state = PartitionProducers::default();
        state.record(&batch(1, 0, 0, 1), 0, 0);
        state.record(&batch(2, 0, 0, 1), 0, 10);
        state.expire(PRODUCER_IDLE_EXPIRATION_MS + 5);
        assert_eq!(state.len(), 1);
        assert_eq!(state.check(&batch(2, 0, 0, 1)), Verdict::Duplicate(0));
        for id in 0..PRODUCERS_PER_PARTITION_MAX as i64 + 1 {
            state.record(&batch(100 + id, 0, 0, 1), 0, 20 + id);
        }
        assert_eq!(state.len(), PRODUCERS_PER_PARTITION_MAX);
        assert_eq!(
            state.check(&batch(2, 0, 5, 1)),
            Verdict::Append,
            "forgotten"
        );
    }

    #[test]
    fn partitions_whose_producers_all_expired_are_dropped_past_the_prune_point() {
        let producers = Producers {
            ids: Mutex::new(IdSource::open(Path::new("unused"))),
            partitions: Mutex::default(),
        };
        let held = producers.slot("hub", 0, 0);
        producers
            .slot("hub", 1, 0)
            .try_lock()
            .unwrap()
            .record(&batch(1, 0, 0, 1), 0, 0);
        for partition in 2..PRODUCER_PARTITIONS_PRUNE_AT as u32 {
            producers.slot("hub", partition, 0);
        }
        let count = || producers.partitions.lock().unwrap().len();
        assert_eq!(count(), PRODUCER_PARTITIONS_PRUNE_AT);
        // The next new partition drops the idle empty ones; the one in use and the one with a
        // live producer stay.
        producers.slot("other", 0, 1);
        assert_eq!(count(), 3);
        assert!(Arc::ptr_eq(&held, &producers.slot("hub", 0, 1)));
        // Once its producer expired, partition 1 goes too at the next prune.
        for partition in 0..PRODUCER_PARTITIONS_PRUNE_AT as u32 {
            producers.slot("more", partition, PRODUCER_IDLE_EXPIRATION_MS + 1);
        }
        let kept = producers.partitions.lock().unwrap();
        assert!(kept.contains_key(&("hub".to_owned(), 0)));
        assert!(!kept.contains_key(&("hub".to_owned(), 1)));
    }

    #[test]
    fn producer_ids_never_repeat_across_restarts_even_when_the_clock_goes_back() {
        let dir = std::env::temp_dir().join(format!("tributary-ids-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut first = IdSource::open(&dir);
        let a = first.next(1_000).unwrap();
        let b = first.next(1_000).unwrap();
        assert_eq!(b, a + 1);
        assert_eq!(a, 1_000 * PRODUCER_IDS_PER_MS);
        drop(first);
        let mut second = IdSource::open(&dir);
        let c = second.next(500).unwrap();
        assert!(c > b, "{c} after {b}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
