//! Compaction: keeping the latest event of each partition key, as Event Hubs' compacted event
//! hubs and Kafka's compacted topics do.
//!
//! [`compact`] rewrites a partition's sealed segments (never the active one) whose newest event
//! is older than the minimum compaction lag. An event is removed when a later event of the same
//! partition key is in that range; a tombstone (a key and an empty body) that is the latest of
//! its key is removed once it is older than the tombstone retention, and the earlier events of
//! its key with it. Events without a key (written before the policy compacted) are removed,
//! as Kafka's cleaner does.
//!
//! # What it guarantees
//! - **Positions are stable.** Kept events keep their sequence number, offset, enqueued time
//!   and content: a batch whose events are all kept is copied as it is; the kept runs of a batch
//!   become batches of their own whose header names the original offset and sequence number
//!   (a record that names properties of a removed record before it is re-encoded on its own,
//!   at its offset). Readers see gaps; every position in a gap resolves to the next kept event.
//! - **Crash safety.** Neighbouring segments that fit in one are rewritten into one (so the
//!   small segments a run leaves are merged by the next), written to `<base>.cleaned` and
//!   synced, then put in place by `swap.rs` behind a commit marker: a crash leaves either all
//!   the old segments of a group or the new one, never a mix. Groups are replaced oldest first,
//!   so a crash between two replacements never removes a tombstone whose key still has older
//!   events: the older events go first (a crash can leave them removed and the tombstone kept,
//!   never the reverse).
//! - **Appends never wait.** The rewrite reads immutable sealed segments without any lock;
//!   replacing one takes the segment list's lock for the time of a pointer swap. Readers that
//!   hold the old segment read it to its end from their open file.
//! - **Bounded memory.** The key index maps a 128-bit digest of each key to the sequence number
//!   of its latest event: at most [`crate::limits::COMPACTION_KEY_INDEX_BYTES_PER_KEY`] bytes a key. When more
//!   keys than [`Cleanup::key_index_bytes_max`] allows are in range, compaction works in
//!   passes: each indexes the keys of the next stretch of the range and rewrites the range up
//!   to its end; the result is the same as one pass over all keys.
//!
//! # Why a digest is safe
//! The index holds SipHash-1-3's 128-bit digest of each key, never the key, under a key drawn
//! at random for each run. Two keys share a digest with probability 2^-128 per pair, so a
//! partition with a billion distinct keys has about one chance in 10^21 of any collision in
//! a run, below the rate at which the disk itself corrupts bits undetected; and because the
//! SipHash key is secret and fresh per run, a producer cannot choose keys that collide (SipHash
//! is a keyed pseudo-random function designed against exactly that). A collision is the only
//! way an event that is the latest of its key could be removed.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::ops::{ControlFlow, Range};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use siphasher::sip128::{Hasher128, SipHasher13};

use crate::LogError;
use crate::config::Cleanup;
use crate::limits::COMPACTION_WRITE_BYTES;
use crate::partition::PartitionShared;
use crate::record::{
    BATCH_HEADER_BYTES, BatchHeader, RecordSummary, decode_batch, encode_batch, record_offsets,
    record_spans, seal_batch_header, summarize_record, verify_checksum,
};
use crate::segment::*;
use crate::storage::{OpenMode, StorageFile};
use crate::swap::Replacement;

/// What one compaction run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompactionOutcome {
    /// Sealed segments in the compacted range.
    pub segments: u32,
    /// Segments replaced by a rewritten one (a segment may be rewritten once per pass).
    pub segments_rewritten: u32,
    /// Bytes of the compacted range before the run.
    pub bytes_before: u64,
    /// Bytes of the compacted range after the run.
    pub bytes_after: u64,
    /// Events removed, of every kind below.
    pub events_removed: u64,
    /// Tombstones removed (superseded by a later event of their key, or expired).
    pub tombstones_removed: u64,
    /// Events without a partition key removed (written before the policy compacted).
    pub keyless_removed: u64,
    /// Passes the run took (more than one when the keys did not fit the key index budget).
    pub passes: u32,
    /// Distinct keys indexed, summed over the passes.
    pub keys_indexed: u64,
    /// How long the run took.
    pub duration: Duration,
}

/// How far compaction has got in a partition, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CompactionState {
    /// Bytes of segments holding events compaction has not yet seen (the active segment's
    /// always among them).
    pub dirty_bytes: u64,
    /// Bytes of sealed segments holding events compaction has not yet seen: what the next run
    /// may rewrite once their newest event is older than the minimum compaction lag (0: a run
    /// now would only re-read what is compacted, or expire tombstones).
    pub sealed_dirty_bytes: u64,
    /// Bytes of all segments.
    pub total_bytes: u64,
    /// `dirty_bytes / total_bytes` (0 for an empty partition).
    pub dirty_ratio: f64,
    /// Every event below this sequence number has been compacted.
    pub compacted_through_sequence: i64,
    /// When the last run was (its `now_ms`), if one ran since the log was opened.
    pub last_run_ms: Option<i64>,
    /// What the last run did.
    pub last_outcome: Option<CompactionOutcome>,
}

/// Compaction's progress in a partition.
#[derive(Debug)]
pub(crate) struct CompactionBook {
    compacted_through: i64,
    last_run_ms: Option<i64>,
    last_outcome: Option<CompactionOutcome>,
}

impl CompactionBook {
    /// The progress a reopened partition shows: its leading compacted segments.
    pub(crate) fn recovered(segments: &[Arc<Segment>]) -> CompactionBook {
        let leading = segments
            .iter()
            .take_while(|s| s.header.is_compacted())
            .count();
        let compacted_through = segments
            .get(leading)
            .or(segments.last())
            .map_or(0, |s| s.header.base_sequence);
        CompactionBook {
            compacted_through,
            last_run_ms: None,
            last_outcome: None,
        }
    }

    /// The state to report for `segments`.
    pub(crate) fn state(&self, segments: &[Arc<Segment>]) -> CompactionState {
        let mut total_bytes = 0;
        let mut dirty_bytes = 0;
        let mut sealed_dirty_bytes = 0;
        for (i, segment) in segments.iter().enumerate() {
            let bytes = segment.contents.read().expect("segment lock").end_position;
            total_bytes += bytes;
            let end = segments.get(i + 1).map(|next| next.header.base_sequence);
            if end.is_none_or(|end| end > self.compacted_through) {
                dirty_bytes += bytes;
                if end.is_some() {
                    sealed_dirty_bytes += bytes;
                }
            }
        }
        #[allow(clippy::cast_precision_loss)]
        let dirty_ratio = if total_bytes == 0 {
            0.0
        } else {
            dirty_bytes as f64 / total_bytes as f64
        };
        CompactionState {
            dirty_bytes,
            sealed_dirty_bytes,
            total_bytes,
            dirty_ratio,
            compacted_through_sequence: self.compacted_through,
            last_run_ms: self.last_run_ms,
            last_outcome: self.last_outcome,
        }
    }
}

/// Compacts `shared`'s sealed segments as of `now_ms` under `cleanup` (see the module doc).
pub(crate) fn compact(
    shared: &PartitionShared,
    cleanup: Cleanup,
    now_ms: i64,
) -> Result<CompactionOutcome, LogError> {
    let started = Instant::now();
    let _maintenance = shared.maintenance.lock().expect("maintenance lock");
    let mut outcome = CompactionOutcome::default();
    let mut compacted_through = None;
    if cleanup.policy.compacts() {
        shared.check_poisoned()?;
        let snapshot = shared.segments.read().expect("segments lock").clone();
        let lag_cutoff_ms = now_ms.saturating_sub(cleanup.min_compaction_lag_ms);
        let eligible = snapshot[..snapshot.len() - 1]
            .iter()
            .take_while(|s| s.contents().last_time_ms.is_none_or(|t| t <= lag_cutoff_ms))
            .count();
        if eligible > 0 {
            let end = snapshot[eligible].header.base_sequence;
            let range = snapshot[..eligible].to_vec();
            let tombstone_cutoff_ms = now_ms.saturating_sub(cleanup.tombstone_retention_ms);
            compact_range(
                shared,
                range,
                end,
                tombstone_cutoff_ms,
                &cleanup,
                &mut outcome,
            )?;
            compacted_through = Some(end);
        }
    }
    outcome.duration = started.elapsed();
    let mut book = shared.compaction_book.lock().expect("compaction book lock");
    if let Some(end) = compacted_through {
        book.compacted_through = book.compacted_through.max(end);
    }
    book.last_run_ms = Some(now_ms);
    book.last_outcome = Some(outcome);
    Ok(outcome)
}

/// Compacts `range` (the sealed segments holding every event below `end`) in passes.
fn compact_range(
    shared: &PartitionShared,
    mut range: Vec<Arc<Segment>>,
    end: i64,
    tombstone_cutoff_ms: i64,
    cleanup: &Cleanup,
    outcome: &mut CompactionOutcome,
) -> Result<(), LogError> {
    outcome.segments = u32::try_from(range.len()).unwrap_or(u32::MAX);
    outcome.bytes_before = range.iter().map(|s| s.contents().end_position).sum();
    let digests = KeyDigests::new();
    let mut start = range[0].header.base_sequence;
    loop {
        let (index, pass_end) = index_keys(&range, start, end, cleanup.keys_per_pass(), &digests)?;
        assert!(
            pass_end > start || start >= end,
            "every pass makes progress"
        );
        outcome.passes += 1;
        outcome.keys_indexed += index.len() as u64;
        let pass = Pass {
            index: &index,
            digests: &digests,
            start,
            end: pass_end,
            tombstone_cutoff_ms,
        };
        range = rewrite_pass(shared, range, &pass, outcome)?;
        if pass_end >= end {
            break;
        }
        start = pass_end;
    }
    outcome.bytes_after = range.iter().map(|s| s.contents().end_position).sum();
    Ok(())
}

/// Rewrites the segments of `range` the pass reaches, oldest first, merging neighbours whose
/// sizes add up to at most a segment; returns the range as it is after.
fn rewrite_pass(
    shared: &PartitionShared,
    range: Vec<Arc<Segment>>,
    pass: &Pass<'_>,
    outcome: &mut CompactionOutcome,
) -> Result<Vec<Arc<Segment>>, LogError> {
    let groups = groups(&range, pass.end, shared.config.segment_bytes_max);
    let rest = groups.last().map_or(0, |g| g.end);
    let mut after = Vec::with_capacity(range.len());
    for group in groups {
        let inputs = &range[group];
        match rewrite(shared, inputs, pass, outcome)? {
            Some(output) => {
                let replacement = Replacement {
                    cleaned: output.path,
                    file: output.file,
                    header: output.header,
                    contents: output.contents,
                };
                after.push(crate::swap::replace(shared, inputs, replacement)?);
                outcome.segments_rewritten += u32::try_from(inputs.len()).unwrap_or(u32::MAX);
            }
            None => after.extend(inputs.iter().cloned()),
        }
    }
    after.extend(range[rest..].iter().cloned());
    Ok(after)
}

/// The segments of `range` that hold events below `pass_end`, in groups of neighbours to be
/// rewritten into one segment each: as many as their sizes now add up to at most a segment,
/// and whose sequence numbers span less than 2^32 (the index holds them relative, in 32 bits).
fn groups(range: &[Arc<Segment>], pass_end: i64, segment_bytes_max: u64) -> Vec<Range<usize>> {
    let reached = range
        .iter()
        .take_while(|s| s.header.base_sequence < pass_end)
        .count();
    let mut groups = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for i in 0..reached {
        let contents = range[i].contents();
        let size = contents.end_position - SEGMENT_HEADER_BYTES as u64;
        let span = contents.next_sequence - range[start].header.base_sequence;
        if i > start && (bytes + size > segment_bytes_max || span >= i64::from(u32::MAX)) {
            groups.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    if start < reached {
        groups.push(start..reached);
    }
    groups
}

/// A [`Hasher`] for keys that are already uniform digests: it passes their low bits through
/// instead of hashing them again.
#[derive(Debug, Default)]
struct DigestPassThrough(u64);

impl Hasher for DigestPassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u128(&mut self, digest: u128) {
        self.0 = digest as u64;
    }
}

/// Key digest → sequence number of the key's latest event in the pass.
type KeyIndex = HashMap<u128, i64, BuildHasherDefault<DigestPassThrough>>;

/// SipHash-1-3 (128 bits) under a key drawn at random for the run (see the module doc).
struct KeyDigests {
    key0: u64,
    key1: u64,
}

impl KeyDigests {
    fn new() -> KeyDigests {
        let random = || std::collections::hash_map::RandomState::new().hash_one(Instant::now());
        KeyDigests {
            key0: random(),
            key1: random(),
        }
    }

    fn digest(&self, key: &[u8]) -> u128 {
        let mut hasher = SipHasher13::new_with_keys(self.key0, self.key1);
        hasher.write(key);
        hasher.finish128().into()
    }
}

/// Visits the verified batches of a sealed segment from file position `start`, with their
/// positions: each batch's checksum, and that it does not go back in sequence number, offset
/// or time from the one before, is checked before it is visited.
fn for_each_batch(
    segment: &Segment,
    start: u64,
    mut visit: impl FnMut(u64, &BatchHeader, &[u8]) -> Result<ControlFlow<()>, LogError>,
) -> Result<(), LogError> {
    let (end, segment_end_sequence) = {
        let contents = segment.contents.read().expect("segment lock");
        (contents.end_position, contents.next_sequence)
    };
    let mut reader = ChunkReader::new(segment.file.as_ref(), &segment.path, end);
    let mut position = start;
    let mut next_sequence = segment.header.base_sequence;
    let mut last_offset: Option<u64> = None;
    let mut last_time_ms: Option<i64> = None;
    while position < end {
        let corrupt = |e: crate::DecodeErrorOrText| LogError::corrupted(&segment.path, position, e);
        let head = reader
            .get(position, BATCH_HEADER_BYTES)?
            .ok_or_else(|| corrupt("a batch header runs past the end of the segment".into()))?;
        let header = BatchHeader::decode(head).map_err(|e| corrupt(e.into()))?;
        let bytes = reader
            .get(position, header.batch_len as usize)?
            .ok_or_else(|| corrupt("a batch runs past the end of the segment".into()))?;
        verify_checksum(bytes, &header).map_err(|e| corrupt(e.into()))?;
        let offsets = record_offsets(bytes, &header).map_err(|e| corrupt(e.into()))?;
        let first_offset = offsets[0];
        let goes_back = header.base_sequence < next_sequence
            || header.next_sequence() > segment_end_sequence
            || header.batch_offset < segment.header.base_offset
            || last_offset.is_some_and(|last| first_offset <= last)
            || last_time_ms.is_some_and(|t| header.enqueued_time_ms < t);
        if goes_back {
            // Checked here, not only at recovery: a sealed segment trusted by its index file
            // was not scanned, and the rewrite asserts what it writes.
            return Err(corrupt(
                "a batch goes back in sequence number, offset or time, or past the segment's end"
                    .into(),
            ));
        }
        next_sequence = header.next_sequence();
        last_offset = offsets.last().copied();
        last_time_ms = Some(header.enqueued_time_ms);
        if visit(position, &header, bytes)?.is_break() {
            return Ok(());
        }
        position += u64::from(header.batch_len);
    }
    Ok(())
}

/// The records of a batch: where each lies in it, and its summary.
type BatchRecords<'b> = (Vec<(usize, usize)>, Vec<RecordSummary<'b>>);

/// The records of a batch: their spans and summaries.
fn summarize_batch<'b>(
    segment: &Segment,
    position: u64,
    header: &BatchHeader,
    bytes: &'b [u8],
) -> Result<BatchRecords<'b>, LogError> {
    let corrupt = |e: crate::DecodeError| LogError::corrupted(&segment.path, position, e);
    let spans = record_spans(bytes, header).map_err(corrupt)?;
    let summaries = spans
        .iter()
        .map(|&(from, to)| summarize_record(&bytes[from..to]))
        .collect::<Result<Vec<_>, _>>()
        .map_err(corrupt)?;
    Ok((spans, summaries))
}

/// Indexes the keys of the events from `start` up to `end` until the index holds `keys_max`
/// keys; returns it and the sequence number where the pass ends (`end` if every key fit).
fn index_keys(
    range: &[Arc<Segment>],
    start: i64,
    end: i64,
    keys_max: usize,
    digests: &KeyDigests,
) -> Result<(KeyIndex, i64), LogError> {
    let mut index = KeyIndex::default();
    index.reserve(keys_max.min(1 << 16));
    let mut pass_end = end;
    for segment in range {
        let contents = segment.contents();
        if contents.next_sequence <= start {
            continue;
        }
        let from = contents.position_for_sequence(&segment.header, start);
        for_each_batch(segment, from, |position, header, bytes| {
            if header.next_sequence() <= start {
                return Ok(ControlFlow::Continue(()));
            }
            let (_, summaries) = summarize_batch(segment, position, header, bytes)?;
            for (i, summary) in summaries.iter().enumerate() {
                let seq = header.base_sequence + i as i64;
                let Some(key) = summary.key.filter(|_| seq >= start && seq < end) else {
                    continue;
                };
                let digest = digests.digest(key);
                if index.len() >= keys_max && !index.contains_key(&digest) {
                    pass_end = seq;
                    return Ok(ControlFlow::Break(()));
                }
                index.insert(digest, seq);
            }
            Ok(ControlFlow::Continue(()))
        })?;
        if pass_end < end {
            break;
        }
    }
    Ok((index, pass_end))
}

/// What one pass knows: the latest event of each key from `start` to `end`.
struct Pass<'a> {
    index: &'a KeyIndex,
    digests: &'a KeyDigests,
    start: i64,
    end: i64,
    tombstone_cutoff_ms: i64,
}

/// What happens to one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Keep,
    /// A later event of its key is in the pass.
    Superseded,
    /// The latest of its key, a tombstone, older than the tombstone retention.
    Expired,
    /// No key.
    Keyless,
}

impl Pass<'_> {
    fn fate(&self, seq: i64, summary: &RecordSummary<'_>, time_ms: i64) -> Fate {
        if seq >= self.end {
            return Fate::Keep;
        }
        let Some(key) = summary.key else {
            return Fate::Keyless;
        };
        let latest = self.index.get(&self.digests.digest(key)).copied();
        if latest.is_some_and(|latest| latest > seq) {
            return Fate::Superseded;
        }
        // Not superseded, the event is the latest of its key: indexed in this pass, or (before
        // the pass's start) the latest of its key in an earlier pass of this run, which
        // removed the key's older events. An expired tombstone can go with them.
        debug_assert!(latest == Some(seq) || (latest.is_none() && seq < self.start));
        if summary.empty_body && time_ms <= self.tombstone_cutoff_ms {
            Fate::Expired
        } else {
            Fate::Keep
        }
    }
}

/// The rewritten segment, written and synced to its `.cleaned` file.
struct Output {
    path: PathBuf,
    file: Box<dyn StorageFile>,
    header: SegmentHeader,
    contents: SegmentContents,
    index_interval_bytes: u32,
    buf: Vec<u8>,
    /// The file position of `buf`'s first byte.
    flushed: u64,
    scratch: Vec<u8>,
}

impl Output {
    fn create(shared: &PartitionShared, old: &Segment) -> Result<Output, LogError> {
        let header = SegmentHeader {
            version: COMPACTED_SEGMENT_VERSION,
            rewrite_id: rewrite_id(),
            ..old.header
        };
        let path = cleaned_path(&shared.dir, header.base_offset);
        let file = shared
            .storage
            .open(&path, OpenMode::Replace)
            .map_err(|e| LogError::io("create compacted segment", &path, e))?;
        Ok(Output {
            path,
            file,
            contents: SegmentContents::empty(&header),
            header,
            index_interval_bytes: shared.config.index_interval_bytes,
            buf: header.encode().to_vec(),
            flushed: 0,
            scratch: Vec::new(),
        })
    }

    /// Appends a whole, checksummed batch.
    fn push(&mut self, batch: &[u8]) -> Result<(), LogError> {
        // Pair assertion: what is written decodes and verifies as what was meant.
        let header = BatchHeader::decode(batch).expect("compaction writes valid batches");
        verify_checksum(batch, &header).expect("compaction writes checksummed batches");
        let offsets = record_offsets(batch, &header).expect("compaction writes whole records");
        let last_offset = *offsets.last().expect("a batch has a record");
        let position = self.flushed + self.buf.len() as u64;
        if position + batch.len() as u64 > u64::from(u32::MAX) {
            // Events re-encoded without references can outgrow what they replace; a segment's
            // positions must stay in 32 bits.
            return Err(LogError::InvalidConfig(format!(
                "{}: the compacted segment would pass 4 GiB; use smaller segments",
                self.path.display()
            )));
        }
        self.contents.push_batch(
            &self.header,
            &header,
            position,
            last_offset,
            self.index_interval_bytes,
        );
        self.buf.extend_from_slice(batch);
        if self.buf.len() >= COMPACTION_WRITE_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    /// Appends the records `records` (whole, back to back) as one batch whose first record
    /// keeps `first_offset` and `base_sequence`.
    fn push_run(
        &mut self,
        records: &[u8],
        first_offset: u64,
        base_sequence: i64,
        record_count: u32,
        time_ms: i64,
        property_refs: bool,
    ) -> Result<(), LogError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.resize(BATCH_HEADER_BYTES, 0);
        scratch.extend_from_slice(records);
        let batch_offset = first_offset - BATCH_HEADER_BYTES as u64;
        let count = record_count;
        seal_batch_header(
            &mut scratch,
            batch_offset,
            base_sequence,
            count,
            time_ms,
            property_refs,
        );
        let pushed = self.push(&scratch);
        self.scratch = scratch;
        pushed
    }

    fn flush(&mut self) -> Result<(), LogError> {
        self.file
            .write_all_at(&self.buf, self.flushed)
            .map_err(|e| LogError::io("write", &self.path, e))?;
        self.flushed += self.buf.len() as u64;
        self.buf.clear();
        Ok(())
    }

    /// Writes what is left and syncs the file.
    fn finish(mut self) -> Result<Output, LogError> {
        self.flush()?;
        self.file
            .sync_all()
            .map_err(|e| LogError::io("sync", &self.path, e))?;
        assert_eq!(self.flushed, self.contents.end_position);
        Ok(self)
    }
}

/// Rewrites `inputs` into one segment without the events `pass` removes; `None` if there is
/// one input and it loses none of them.
fn rewrite(
    shared: &PartitionShared,
    inputs: &[Arc<Segment>],
    pass: &Pass<'_>,
    outcome: &mut CompactionOutcome,
) -> Result<Option<Output>, LogError> {
    let mut output: Option<Output> = None;
    let written = (|| {
        if inputs.len() > 1 {
            output = Some(Output::create(shared, &inputs[0])?);
        }
        for old in inputs {
            rewrite_one(shared, old, pass, outcome, &mut output)?;
        }
        Ok(())
    })();
    if let Err(e) = written {
        if output.is_some() {
            let cleaned = cleaned_path(&shared.dir, inputs[0].header.base_offset);
            let _ = shared.storage.remove_file(&cleaned);
        }
        return Err(e);
    }
    output.map(Output::finish).transpose()
}

/// Adds what `old` keeps to `output`, starting it (with the batches before) at the first
/// batch that loses an event if there is none yet.
fn rewrite_one(
    shared: &PartitionShared,
    old: &Segment,
    pass: &Pass<'_>,
    outcome: &mut CompactionOutcome,
    output: &mut Option<Output>,
) -> Result<(), LogError> {
    for_each_batch(
        old,
        SEGMENT_HEADER_BYTES as u64,
        |position, header, bytes| {
            let (spans, summaries) = summarize_batch(old, position, header, bytes)?;
            let fates: Vec<Fate> = summaries
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    pass.fate(header.base_sequence + i as i64, s, header.enqueued_time_ms)
                })
                .collect();
            let all_kept = fates.iter().all(|f| *f == Fate::Keep);
            if all_kept && output.is_none() {
                return Ok(ControlFlow::Continue(()));
            }
            let out = match output.as_mut() {
                Some(out) => out,
                None => output.insert(start_output(shared, old, position)?),
            };
            if all_kept {
                out.push(bytes)?;
            } else {
                count_removed(&fates, &summaries, outcome);
                push_kept(
                    out, old, position, header, bytes, &spans, &summaries, &fates,
                )?;
            }
            Ok(ControlFlow::Continue(()))
        },
    )
}

/// Starts the rewrite of `old` at the first batch that loses an event (at `position`): the
/// batches before it are copied as they are.
fn start_output(
    shared: &PartitionShared,
    old: &Segment,
    position: u64,
) -> Result<Output, LogError> {
    let mut out = Output::create(shared, old)?;
    for_each_batch(old, SEGMENT_HEADER_BYTES as u64, |at, _, bytes| {
        if at >= position {
            return Ok(ControlFlow::Break(()));
        }
        out.push(bytes)?;
        Ok(ControlFlow::Continue(()))
    })?;
    Ok(out)
}

fn count_removed(fates: &[Fate], summaries: &[RecordSummary<'_>], outcome: &mut CompactionOutcome) {
    for (fate, summary) in fates.iter().zip(summaries) {
        if *fate == Fate::Keep {
            continue;
        }
        outcome.events_removed += 1;
        if summary.key.is_some() && summary.empty_body {
            outcome.tombstones_removed += 1;
        }
        if *fate == Fate::Keyless {
            outcome.keyless_removed += 1;
        }
    }
}

/// Writes the kept records of a batch that lost some: each run of kept records as one batch
/// (copied as they are, so their offsets hold), except that a record naming properties of the
/// record before it, which the run does not hold, is decoded and re-encoded on its own.
#[allow(clippy::too_many_arguments)]
fn push_kept(
    out: &mut Output,
    old: &Segment,
    position: u64,
    header: &BatchHeader,
    bytes: &[u8],
    spans: &[(usize, usize)],
    summaries: &[RecordSummary<'_>],
    fates: &[Fate],
) -> Result<(), LogError> {
    let mut decoded = None;
    let offset_of = |k: usize| header.batch_offset + spans[k].0 as u64;
    let mut k = 0;
    while k < fates.len() {
        if fates[k] != Fate::Keep {
            k += 1;
            continue;
        }
        let seq = header.base_sequence + k as i64;
        if summaries[k].refers {
            let events = match decoded.as_ref() {
                Some(events) => events,
                None => decoded.insert(decode_all(old, position, header, bytes)?),
            };
            let event: &tributary_event::ReceivedEvent = &events[k];
            debug_assert_eq!(event.offset, offset_of(k));
            let mut buf = Vec::new();
            let mut offsets = Vec::with_capacity(1);
            let batch_offset = offset_of(k) - BATCH_HEADER_BYTES as u64;
            let time = header.enqueued_time_ms;
            let data = std::slice::from_ref(&event.data);
            encode_batch(&mut buf, batch_offset, seq, time, data, false, &mut offsets);
            assert_eq!(
                offsets,
                [offset_of(k)],
                "a re-encoded event keeps its offset"
            );
            out.push(&buf)?;
            k += 1;
            continue;
        }
        let mut j = k + 1;
        while j < fates.len() && fates[j] == Fate::Keep {
            j += 1;
        }
        let records = &bytes[spans[k].0..spans[j - 1].1];
        let count = u32::try_from(j - k).expect("a batch's record count fits in u32");
        let time = header.enqueued_time_ms;
        out.push_run(
            records,
            offset_of(k),
            seq,
            count,
            time,
            header.property_refs,
        )?;
        k = j;
    }
    Ok(())
}

fn decode_all(
    old: &Segment,
    position: u64,
    header: &BatchHeader,
    bytes: &[u8],
) -> Result<Vec<tributary_event::ReceivedEvent>, LogError> {
    let mut events = Vec::with_capacity(header.record_count as usize);
    let batch = Bytes::copy_from_slice(bytes);
    decode_batch(&batch, header, 0, usize::MAX, &mut events)
        .map_err(|e| LogError::corrupted(&old.path, position, e))?;
    Ok(events)
}

/// A random, non-zero id for a compacted segment (see [`SegmentHeader::rewrite_id`]).
fn rewrite_id() -> u32 {
    let random = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    (random as u32).max(1)
}
