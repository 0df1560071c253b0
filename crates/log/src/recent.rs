//! [`RecentBatches`]: the batches a partition wrote last, kept in memory for readers that
//! follow close behind the writer.
//!
//! A reader at the end of the log (a capture stepped as events arrive, a receiver waiting for
//! the next event) reads what was written moments ago. From the file that costs a copy out of
//! the page cache, the read buffer's zeroing and a checksum per batch, while the writer had
//! the same bytes in memory. A partition told to keep them
//! ([`crate::PartitionLog::keep_recent`]) holds its last batches, up to a byte budget, as the
//! writer put them down, and a read that reaches one takes it from here instead.
//!
//! # Guarantees
//! - A batch is kept only once its write succeeded, under the segment id and file position it
//!   was written at, so a kept batch is byte for byte what the file holds there. Readers still
//!   never go past the committed end: that check is the read path's, as for bytes from the file.
//! - A batch is found only in the segment it was written to: compaction's rewrite of a sealed
//!   segment has a new id, so a read of it never gets the batches compaction replaced.
//! - At most the budget is held (past it, the oldest batches go first), and a budget of 0 (the
//!   default) holds nothing and costs the writer nothing. The reader that asked for the batches
//!   releases those it has read, so a reader that keeps up holds little.

use std::collections::VecDeque;

use bytes::Bytes;

/// One batch as written: its segment, its offset (the segment's base offset plus the batch's
/// position in the file), its bytes.
#[derive(Debug)]
struct RecentBatch {
    segment_id: u64,
    offset: u64,
    bytes: Bytes,
}

/// The last batches written, oldest first, within a byte budget.
#[derive(Debug, Default)]
pub(crate) struct RecentBatches {
    batches: VecDeque<RecentBatch>,
    /// The bytes of `batches`.
    held: u64,
    budget: u64,
}

impl RecentBatches {
    /// Whether batches are kept at all.
    pub(crate) fn keeps(&self) -> bool {
        self.budget > 0
    }

    /// Keeps up to `budget` bytes of batches from now on (dropping the oldest past it).
    pub(crate) fn set_budget(&mut self, budget: u64) {
        self.budget = budget;
        self.trim();
    }

    /// Keeps the batch just written at `offset` in segment `segment_id`. Appends only go
    /// forward (the log's invariant 2), so the kept batches are ordered by offset.
    pub(crate) fn push(&mut self, segment_id: u64, offset: u64, bytes: Bytes) {
        if !self.keeps() {
            return;
        }
        if let Some(last) = self.batches.back() {
            assert!(
                last.offset + last.bytes.len() as u64 <= offset,
                "batches are kept in the order they were written"
            );
        }
        self.held += bytes.len() as u64;
        self.batches.push_back(RecentBatch {
            segment_id,
            offset,
            bytes,
        });
        self.trim();
    }

    /// The batch written at `offset` in segment `segment_id`, if it is still kept.
    pub(crate) fn find(&self, segment_id: u64, offset: u64) -> Option<Bytes> {
        let i = self.batches.partition_point(|b| b.offset < offset);
        self.batches
            .get(i)
            .filter(|b| b.offset == offset && b.segment_id == segment_id)
            .map(|b| b.bytes.clone())
    }

    /// Drops the batches that end at or before `offset`.
    pub(crate) fn release_before(&mut self, offset: u64) {
        while let Some(oldest) = self.batches.front() {
            if oldest.offset + oldest.bytes.len() as u64 > offset {
                break;
            }
            self.held -= oldest.bytes.len() as u64;
            self.batches.pop_front();
        }
    }

    /// The bytes kept now.
    pub(crate) fn held(&self) -> u64 {
        self.held
    }

    fn trim(&mut self) {
        while self.held > self.budget {
            let oldest = self.batches.pop_front().expect("held bytes are in batches");
            self.held -= oldest.bytes.len() as u64;
        }
        if self.budget == 0 {
            // Give the queue's memory back too: a partition no longer asked to keep batches
            // costs nothing.
            self.batches = VecDeque::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(len: usize) -> Bytes {
        Bytes::from(vec![7u8; len])
    }

    #[test]
    fn finds_a_kept_batch_only_in_its_own_segment_and_at_its_own_offset() {
        let mut recent = RecentBatches::default();
        recent.set_budget(1000);
        recent.push(1, 100, batch(50));
        recent.push(1, 150, batch(50));
        recent.push(2, 200, batch(50));
        assert_eq!(recent.find(1, 150).map(|b| b.len()), Some(50));
        assert_eq!(recent.find(2, 200).map(|b| b.len()), Some(50));
        assert!(recent.find(1, 120).is_none(), "not a batch's start");
        assert!(
            recent.find(3, 200).is_none(),
            "a rewrite of the segment has another id"
        );
        assert!(recent.find(1, 250).is_none());
    }

    #[test]
    fn holds_at_most_its_budget_dropping_the_oldest() {
        let mut recent = RecentBatches::default();
        assert!(!recent.keeps());
        recent.push(1, 0, batch(10));
        assert_eq!(recent.held(), 0, "no budget, nothing kept");
        recent.set_budget(100);
        for i in 0..10 {
            recent.push(1, i * 40, batch(40));
        }
        assert_eq!(recent.held(), 80);
        assert!(recent.find(1, 320).is_some() && recent.find(1, 360).is_some());
        assert!(recent.find(1, 280).is_none());
        recent.set_budget(0);
        assert_eq!(recent.held(), 0);
        assert!(recent.find(1, 360).is_none());
    }

    #[test]
    fn releases_the_batches_a_reader_is_done_with() {
        let mut recent = RecentBatches::default();
        recent.set_budget(1000);
        for i in 0..4 {
            recent.push(1, i * 10, batch(10));
        }
        recent.release_before(25);
        assert_eq!(recent.held(), 20, "the batch at 20 is read only in part");
        assert!(recent.find(1, 10).is_none() && recent.find(1, 20).is_some());
        recent.release_before(40);
        assert_eq!(recent.held(), 0);
    }

    #[test]
    #[should_panic(expected = "in the order they were written")]
    fn refuses_a_batch_behind_the_last() {
        let mut recent = RecentBatches::default();
        recent.set_budget(1000);
        recent.push(1, 100, batch(50));
        recent.push(1, 120, batch(50));
    }
}
