//! The batches a partition appended last, kept in memory for a reader that follows its end
//! ([`TailFollower`]): such a reader takes them as they were written instead of reading them
//! back from the file.
//!
//! # Why
//! A capture reads every event the hub appends, a few milliseconds after it is appended. Read
//! from the file, each batch is copied out of the page cache and its checksum computed again:
//! about a third of the capture thread's time. The appender has the batch's bytes in memory
//! anyway; keeping them costs memory and no copy (BENCHMARKS.md, "Capture: the batches it
//! follows kept in memory").
//!
//! # What it holds, and for how long
//! Only while at least one [`TailFollower`] of the partition lives: the appender then keeps
//! each batch it wrote, the newest [`TAIL_BYTES_MAX`] of them (a batch larger than that is not
//! kept), and the buffers of batches dropped since, for its next batches (at most
//! [`TAIL_SPARE_BYTES_MAX`] of them). When the last follower is dropped all of it goes, so a
//! partition nobody follows holds nothing, and a follower further behind than the kept
//! batches reads the file until it reaches them.
//!
//! # Guarantees
//! A kept batch is the exact bytes written at its place (a segment's id and the batch's
//! position in it): the appender keeps it only after its write succeeded, committed bytes of a
//! segment never change (compaction writes a new segment, with a new id), and positions are
//! never reused in a segment. A reader still reads only below the committed end, so a kept
//! batch that is not yet durable is never read. Not computing a kept batch's checksum again
//! skips no check of the disk: its bytes never came from there.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;

use crate::limits::{TAIL_BYTES_MAX, TAIL_SPARE_BYTES_MAX};

/// A batch as written: where, and its bytes.
#[derive(Debug)]
struct KeptBatch {
    segment_id: u64,
    position: u64,
    bytes: Bytes,
}

/// The newest batches of a partition (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct TailCache {
    /// How many [`TailFollower`]s live: batches are kept while there is one.
    followers: AtomicUsize,
    kept: Mutex<KeptBatches>,
    /// The buffers of batches dropped by the cache and by every reader, for the appender's
    /// next batches: memory it has, not fresh memory to fault in (at most
    /// [`TAIL_SPARE_BYTES_MAX`] of them; none while nobody follows).
    spare: Mutex<SpareBuffers>,
}

/// A kept batch's memory: back to its cache's spare buffers once the last reference to the
/// batch is dropped.
struct KeptBuffer {
    bytes: Vec<u8>,
    cache: Weak<TailCache>,
}

impl AsRef<[u8]> for KeptBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for KeptBuffer {
    fn drop(&mut self) {
        if let Some(cache) = self.cache.upgrade() {
            cache.give_back(std::mem::take(&mut self.bytes));
        }
    }
}

#[derive(Debug, Default)]
struct SpareBuffers {
    buffers: Vec<Vec<u8>>,
    /// Their capacities, summed.
    bytes: usize,
}

#[derive(Debug, Default)]
struct KeptBatches {
    /// In the order written: by segment id (a later segment has a larger one), then position.
    batches: VecDeque<KeptBatch>,
    bytes: usize,
}

impl TailCache {
    /// Whether a follower wants the batches the appender writes.
    pub(crate) fn is_followed(&self) -> bool {
        self.followers.load(Ordering::Acquire) > 0
    }

    /// An empty buffer for the next batch, with room for `len` bytes: a spare one if it has
    /// the room.
    pub(crate) fn buffer(&self, len: usize) -> Vec<u8> {
        let mut spare = self.spare.lock().expect("spare lock");
        if let Some(buffer) = spare.buffers.pop() {
            spare.bytes -= buffer.capacity();
            if buffer.capacity() >= len {
                return buffer;
            }
        }
        Vec::with_capacity(len)
    }

    fn give_back(&self, mut buffer: Vec<u8>) {
        let mut spare = self.spare.lock().expect("spare lock");
        if self.is_followed() && spare.bytes + buffer.capacity() <= TAIL_SPARE_BYTES_MAX {
            buffer.clear();
            spare.bytes += buffer.capacity();
            spare.buffers.push(buffer);
        }
    }

    /// Keeps `batch`, the batch just written at `position` of segment `segment_id`, dropping
    /// the oldest batches beyond [`TAIL_BYTES_MAX`].
    pub(crate) fn keep(self: &Arc<Self>, segment_id: u64, position: u64, batch: Vec<u8>) {
        let bytes = Bytes::from_owner(KeptBuffer {
            bytes: batch,
            cache: Arc::downgrade(self),
        });
        let mut kept = self.kept.lock().expect("tail lock");
        if bytes.len() > TAIL_BYTES_MAX || !self.is_followed() {
            // Not kept; nor are older batches needed by anyone reading on from this one.
            kept.clear();
            return;
        }
        debug_assert!(
            kept.batches
                .back()
                .is_none_or(|last| (last.segment_id, last.position) < (segment_id, position)),
            "batches are kept in the order written"
        );
        kept.bytes += bytes.len();
        kept.batches.push_back(KeptBatch {
            segment_id,
            position,
            bytes,
        });
        while kept.bytes > TAIL_BYTES_MAX {
            let oldest = kept.batches.pop_front().expect("bytes counted are held");
            kept.bytes -= oldest.bytes.len();
        }
    }

    /// The batch written at `position` of segment `segment_id`, if it is kept.
    pub(crate) fn batch_at(&self, segment_id: u64, position: u64) -> Option<Bytes> {
        if !self.is_followed() {
            return None;
        }
        let kept = self.kept.lock().expect("tail lock");
        let place = (segment_id, position);
        kept.batches
            .binary_search_by(|b| (b.segment_id, b.position).cmp(&place))
            .ok()
            .map(|at| kept.batches[at].bytes.clone())
    }

    /// A follower: batches are kept from now on until it and every other one are dropped.
    pub(crate) fn follow(self: &Arc<Self>) -> TailFollower {
        self.followers.fetch_add(1, Ordering::AcqRel);
        TailFollower {
            cache: self.clone(),
        }
    }

    fn unfollow(&self) {
        let mut kept = self.kept.lock().expect("tail lock");
        if self.followers.fetch_sub(1, Ordering::AcqRel) == 1 {
            kept.clear();
            drop(kept);
            *self.spare.lock().expect("spare lock") = SpareBuffers::default();
        }
    }

    /// How many bytes the spare buffers hold.
    #[cfg(test)]
    pub(crate) fn spare_bytes(&self) -> usize {
        self.spare.lock().expect("spare lock").bytes
    }

    /// How many bytes of batches are kept.
    #[cfg(test)]
    pub(crate) fn kept_bytes(&self) -> usize {
        self.kept.lock().expect("tail lock").bytes
    }
}

impl KeptBatches {
    fn clear(&mut self) {
        self.batches.clear();
        self.bytes = 0;
    }
}

/// A reader's wish that its partition keep the batches it appends in memory for it (see the
/// module docs), from [`crate::PartitionLog::follow_tail`]; dropping it ends the wish.
#[derive(Debug)]
pub struct TailFollower {
    cache: Arc<TailCache>,
}

impl Drop for TailFollower {
    fn drop(&mut self) {
        self.cache.unfollow();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(len: usize) -> Vec<u8> {
        vec![7; len]
    }

    #[test]
    fn batches_are_kept_only_while_followed_and_the_newest_within_the_bound() {
        let cache = Arc::new(TailCache::default());
        cache.keep(1, 64, batch(100));
        assert_eq!(cache.batch_at(1, 64), None, "nobody follows");
        assert_eq!(cache.kept_bytes(), 0);

        let follower = cache.follow();
        let second = cache.follow();
        let third = TAIL_BYTES_MAX / 3;
        for i in 0..4_u64 {
            cache.keep(1, 64 + i * third as u64, batch(third));
        }
        assert_eq!(
            cache.batch_at(1, 64),
            None,
            "the oldest went beyond the bound"
        );
        assert!(
            cache.buffer(third).capacity() >= third,
            "its memory is the next batch's"
        );
        assert_eq!(
            cache.batch_at(1, 64 + third as u64).map(|b| b.len()),
            Some(third)
        );
        assert_eq!(cache.batch_at(1, 65), None, "no batch starts there");
        cache.keep(2, 64, batch(10));
        assert_eq!(cache.batch_at(2, 64).map(|b| b.len()), Some(10));
        assert!(cache.kept_bytes() <= TAIL_BYTES_MAX);

        drop(follower);
        assert_eq!(
            cache.batch_at(2, 64).map(|b| b.len()),
            Some(10),
            "one follows yet"
        );
        drop(second);
        assert_eq!(cache.kept_bytes(), 0, "the last follower took them with it");
        assert_eq!(cache.buffer(1).capacity(), 1, "and the spare buffers");
        assert_eq!(cache.batch_at(2, 64), None);
    }

    #[test]
    fn the_spare_buffers_hold_at_most_their_bound() {
        let cache = Arc::new(TailCache::default());
        let _follower = cache.follow();
        let len = 1024 * 1024;
        let batches = 2 * (TAIL_BYTES_MAX + TAIL_SPARE_BYTES_MAX) / len;
        for i in 0..batches as u64 {
            // Fresh memory each time, as if a reader held every spare buffer.
            cache.keep(1, i * len as u64, batch(len));
        }
        let spare = cache.spare_bytes();
        assert!(
            spare > 0 && spare <= TAIL_SPARE_BYTES_MAX,
            "{spare} bytes of spare buffers"
        );
        assert!(cache.kept_bytes() <= TAIL_BYTES_MAX);
        let reused = cache.buffer(len);
        assert!(reused.capacity() >= len && reused.is_empty());
        assert_eq!(cache.spare_bytes(), spare - reused.capacity());
    }

    #[test]
    fn a_batch_larger_than_the_bound_is_not_kept_and_drops_the_rest() {
        let cache = Arc::new(TailCache::default());
        let _follower = cache.follow();
        cache.keep(1, 64, batch(10));
        cache.keep(1, 74, batch(TAIL_BYTES_MAX + 1));
        assert_eq!(cache.kept_bytes(), 0);
        assert_eq!(cache.batch_at(1, 64), None);
    }
}
