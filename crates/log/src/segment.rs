//! One segment file of a partition: its header, its sparse index, and the scanner that
//! recovers it.
//!
//! A segment is named by its base offset (`00000000000000000000.log`) and starts with a 64-byte
//! header; batches follow back to back. The offset of any byte is the segment's base offset plus
//! the byte's position in the file, so offsets run on from one segment into the next.
//!
//! The sparse index maps a sequence number, a file position or an enqueued time to the batch
//! that starts at or before it: one entry for the first batch and then one whenever the log has
//! grown by the index interval. The active segment's index lives in memory and is rebuilt by
//! scanning at recovery; a sealed segment's index is written to `<base>.index` when it is
//! sealed, so reopening a partition scans only its active segment.
//!
//! A compacted segment (version 3, written by `compaction.rs`) holds the events compaction kept
//! with their original offsets and sequence numbers: between its batches they may skip, and a
//! batch's offset is no longer its base offset plus its position, so lookups by offset go by
//! each indexed batch's first event's offset, which its index file (version 2) stores.

use std::path::{Path, PathBuf};
use std::sync::RwLock;

use tributary_event::format::check_format_version;

use crate::LogError;
use crate::error::DecodeErrorOrText;
use crate::record::{BATCH_HEADER_BYTES, BatchHeader, Reader, record_offsets, verify_checksum};
use crate::storage::{OpenMode, Storage, StorageFile, read_whole};

const SEGMENT_MAGIC: [u8; 8] = *b"TRIBSEG\0";
/// The version new segments are written with. Version 2's batches may name properties of the
/// record before (the batch flag in `record.rs`); version 1's never do, and a log keeps
/// appending to a version 1 segment without them until it rolls, so that a build that reads
/// only version 1 refuses the new segments (an unsupported version, an error) instead of
/// cutting them off as a torn tail.
pub(crate) const SEGMENT_VERSION: u32 = 2;
/// The version of a segment compaction wrote: its batches keep the offsets and sequence
/// numbers their events were given, with gaps where compaction removed events, so a batch's
/// offset is no longer its segment's base offset plus its position. Never the active segment.
/// A build that knows only versions 1 and 2 refuses it rather than misreading the gaps.
pub(crate) const COMPACTED_SEGMENT_VERSION: u32 = 3;

/// The segment versions this build reads.
const SEGMENT_VERSIONS_READ: std::ops::RangeInclusive<u32> = 1..=COMPACTED_SEGMENT_VERSION;
const SEG_MAGIC_AT: usize = 0;
const SEG_VERSION_AT: usize = SEG_MAGIC_AT + 8;
const SEG_HEADER_LEN_AT: usize = SEG_VERSION_AT + 4;
const SEG_BASE_OFFSET_AT: usize = SEG_HEADER_LEN_AT + 4;
const SEG_BASE_SEQUENCE_AT: usize = SEG_BASE_OFFSET_AT + 8;
const SEG_CREATED_AT: usize = SEG_BASE_SEQUENCE_AT + 8;
const SEG_PREV_LAST_OFFSET_AT: usize = SEG_CREATED_AT + 8;
const SEG_PREV_LAST_TIME_AT: usize = SEG_PREV_LAST_OFFSET_AT + 8;
const SEG_REWRITE_ID_AT: usize = SEG_PREV_LAST_TIME_AT + 8;
const SEG_CRC_AT: usize = SEG_REWRITE_ID_AT + 4;
/// Bytes in a segment header; the first batch starts here.
pub(crate) const SEGMENT_HEADER_BYTES: usize = SEG_CRC_AT + 4;
const _: () = assert!(SEGMENT_HEADER_BYTES == 64);

const INDEX_MAGIC: [u8; 8] = *b"TRIBIDX\0";
const INDEX_VERSION: u32 = 1;
/// The index of a compacted segment: entries also hold their batch's first event's offset
/// (not derivable from the position there), and the header the segment's rewrite id.
const COMPACTED_INDEX_VERSION: u32 = 2;
const IDX_ENTRY_COUNT_AT: usize = 8 + 4;
const IDX_END_POSITION_AT: usize = IDX_ENTRY_COUNT_AT + 4;
const IDX_NEXT_SEQUENCE_AT: usize = IDX_END_POSITION_AT + 8;
const IDX_FIRST_TIME_AT: usize = IDX_NEXT_SEQUENCE_AT + 8;
const IDX_LAST_TIME_AT: usize = IDX_FIRST_TIME_AT + 8;
const IDX_LAST_OFFSET_AT: usize = IDX_LAST_TIME_AT + 8;
const IDX_CRC_AT: usize = IDX_LAST_OFFSET_AT + 8;
const INDEX_HEADER_BYTES: usize = IDX_CRC_AT + 4 + 4;
const INDEX_ENTRY_BYTES: usize = 16;
const COMPACTED_INDEX_ENTRY_BYTES: usize = 24;
/// In a compacted segment's index, the 4 bytes after the CRC hold the segment's rewrite id
/// (and the CRC covers them).
const IDX_REWRITE_ID_AT: usize = IDX_CRC_AT + 4;
const _: () = assert!(IDX_REWRITE_ID_AT + 4 == INDEX_HEADER_BYTES);

/// "No value" in a fixed-width field.
const NO_OFFSET: u64 = u64::MAX;
const NO_TIME: i64 = i64::MIN;

/// The fixed facts of a segment, written once when it is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    /// The segment's format version ([`SEGMENT_VERSION`] for new segments).
    pub version: u32,
    /// The offset of the segment's first byte.
    pub base_offset: u64,
    /// The sequence number of the segment's first event.
    pub base_sequence: i64,
    /// When the segment was created (ms since the epoch).
    pub created_ms: i64,
    /// The offset of the last event before this segment, if there was one. Lets a partition
    /// whose older segments were all removed still report its last enqueued event.
    pub prev_last_offset: Option<u64>,
    /// The enqueued time of the last event before this segment, if there was one.
    pub prev_last_time_ms: Option<i64>,
    /// A compacted segment's random id (0 in other segments), repeated in its index file: an
    /// index file left from an earlier rewrite of the same segment never matches it.
    pub rewrite_id: u32,
}

impl SegmentHeader {
    /// Whether batches in this segment may name properties of the record before.
    pub(crate) fn allows_property_refs(&self) -> bool {
        self.version >= 2
    }

    /// Whether compaction wrote this segment (its offsets and sequence numbers have gaps).
    pub(crate) fn is_compacted(&self) -> bool {
        self.version == COMPACTED_SEGMENT_VERSION
    }

    pub(crate) fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        assert!(SEGMENT_VERSIONS_READ.contains(&self.version));
        let mut b = [0u8; SEGMENT_HEADER_BYTES];
        b[SEG_MAGIC_AT..SEG_VERSION_AT].copy_from_slice(&SEGMENT_MAGIC);
        b[SEG_VERSION_AT..SEG_HEADER_LEN_AT].copy_from_slice(&self.version.to_le_bytes());
        b[SEG_HEADER_LEN_AT..SEG_BASE_OFFSET_AT]
            .copy_from_slice(&(SEGMENT_HEADER_BYTES as u32).to_le_bytes());
        b[SEG_BASE_OFFSET_AT..SEG_BASE_SEQUENCE_AT]
            .copy_from_slice(&self.base_offset.to_le_bytes());
        b[SEG_BASE_SEQUENCE_AT..SEG_CREATED_AT].copy_from_slice(&self.base_sequence.to_le_bytes());
        b[SEG_CREATED_AT..SEG_PREV_LAST_OFFSET_AT].copy_from_slice(&self.created_ms.to_le_bytes());
        b[SEG_PREV_LAST_OFFSET_AT..SEG_PREV_LAST_TIME_AT]
            .copy_from_slice(&self.prev_last_offset.unwrap_or(NO_OFFSET).to_le_bytes());
        b[SEG_PREV_LAST_TIME_AT..SEG_REWRITE_ID_AT]
            .copy_from_slice(&self.prev_last_time_ms.unwrap_or(NO_TIME).to_le_bytes());
        b[SEG_REWRITE_ID_AT..SEG_CRC_AT].copy_from_slice(&self.rewrite_id.to_le_bytes());
        let crc = crate::checksum::crc32c(&b[..SEG_CRC_AT]);
        b[SEG_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8], path: &Path) -> Result<SegmentHeader, LogError> {
        let corrupt = |at: usize, what: String| LogError::corrupted(path, at as u64, what);
        if b.len() < SEGMENT_HEADER_BYTES {
            return Err(corrupt(
                0,
                format!("segment header is {} bytes, expected 64", b.len()),
            ));
        }
        if b[SEG_MAGIC_AT..SEG_VERSION_AT] != SEGMENT_MAGIC {
            return Err(corrupt(0, "not a Tributary segment (bad magic)".into()));
        }
        let mut r = Reader::new(&b[SEG_VERSION_AT..SEGMENT_HEADER_BYTES]);
        let field = |r: &mut Reader<'_>, name| r.u64(name).map_err(|e| corrupt(0, e.to_string()));
        let version = r
            .u32("segment version")
            .map_err(|e| corrupt(0, e.to_string()))?;
        let newest = *SEGMENT_VERSIONS_READ.end();
        let what = format_args!("segment {}", path.display());
        check_format_version(what, version.into(), newest.into())?;
        if !SEGMENT_VERSIONS_READ.contains(&version) {
            return Err(corrupt(
                SEG_VERSION_AT,
                format!("unsupported segment version {version}"),
            ));
        }
        let header_len = r
            .u32("header length")
            .map_err(|e| corrupt(0, e.to_string()))?;
        let stored_crc =
            u32::from_le_bytes(b[SEG_CRC_AT..SEGMENT_HEADER_BYTES].try_into().unwrap());
        let computed = crate::checksum::crc32c(&b[..SEG_CRC_AT]);
        if header_len as usize != SEGMENT_HEADER_BYTES || stored_crc != computed {
            return Err(corrupt(0, "segment header checksum mismatch".into()));
        }
        let base_offset = field(&mut r, "base offset")?;
        let base_sequence = field(&mut r, "base sequence")? as i64;
        let created_ms = field(&mut r, "created time")? as i64;
        let prev_last_offset = field(&mut r, "previous last offset")?;
        let prev_last_time = field(&mut r, "previous last time")? as i64;
        let rewrite_id = r
            .u32("rewrite id")
            .map_err(|e| corrupt(SEG_REWRITE_ID_AT, e.to_string()))?;
        Ok(SegmentHeader {
            rewrite_id,
            version,
            base_offset,
            base_sequence,
            created_ms,
            prev_last_offset: (prev_last_offset != NO_OFFSET).then_some(prev_last_offset),
            prev_last_time_ms: (prev_last_time != NO_TIME).then_some(prev_last_time),
        })
    }
}

/// One sparse index entry: a batch that starts at `position` in the file, with the first
/// sequence number `base_sequence + relative_sequence`, enqueued at `time_ms`, whose first
/// event's offset is `first_offset` (in memory only; index files derive it). Lookups by offset
/// compare the first event's offset, not the batch's: in a compacted segment a batch's header
/// may lie before the last event of the batch before it (the header is placed so that the
/// batch's first event keeps its offset), but first events' offsets always grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexEntry {
    pub relative_sequence: u32,
    pub position: u32,
    pub time_ms: i64,
    pub first_offset: u64,
}

/// What a segment holds, as far as it has been written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SegmentContents {
    /// Sparse index, ordered by position (and so by sequence number and time).
    pub index: Vec<IndexEntry>,
    /// The file position just past the last batch.
    pub end_position: u64,
    /// The sequence number the next event in this segment would get (in a compacted segment:
    /// one past its last kept event; the next segment's base sequence may be higher).
    pub next_sequence: i64,
    /// The sequence number of the segment's first event, if it holds any (a compacted
    /// segment's may lie past its base sequence, or it may hold none).
    pub first_sequence: Option<i64>,
    /// Enqueued time of the first and last batch, if any.
    pub first_time_ms: Option<i64>,
    /// See `first_time_ms`.
    pub last_time_ms: Option<i64>,
    /// The offset of the segment's last event, if any.
    pub last_offset: Option<u64>,
    /// The position of the last batch added to the index (to space entries).
    pub last_indexed_position: Option<u64>,
}

impl SegmentContents {
    pub(crate) fn empty(header: &SegmentHeader) -> Self {
        SegmentContents {
            index: Vec::new(),
            end_position: SEGMENT_HEADER_BYTES as u64,
            next_sequence: header.base_sequence,
            first_sequence: None,
            first_time_ms: None,
            last_time_ms: None,
            last_offset: None,
            last_indexed_position: None,
        }
    }

    /// Records a batch appended at `position`.
    pub(crate) fn push_batch(
        &mut self,
        header: &SegmentHeader,
        batch: &BatchHeader,
        position: u64,
        last_offset: u64,
        index_interval_bytes: u32,
    ) {
        assert_eq!(position, self.end_position, "batches are contiguous");
        if header.is_compacted() {
            assert!(
                batch.base_sequence >= self.next_sequence,
                "sequence numbers only grow"
            );
            assert!(
                self.last_offset
                    .is_none_or(|last| batch.batch_offset + BATCH_HEADER_BYTES as u64 > last),
                "offsets only grow"
            );
            assert!(batch.batch_offset >= header.base_offset);
        } else {
            assert_eq!(
                batch.base_sequence, self.next_sequence,
                "sequence numbers are dense"
            );
            assert_eq!(batch.batch_offset, header.base_offset + position);
        }
        assert!(
            self.last_time_ms
                .is_none_or(|t| t <= batch.enqueued_time_ms)
        );
        let due = self
            .last_indexed_position
            .is_none_or(|p| position - p >= u64::from(index_interval_bytes));
        if due {
            self.index.push(IndexEntry {
                relative_sequence: u32::try_from(batch.base_sequence - header.base_sequence)
                    .expect("a segment holds fewer than 2^32 events"),
                position: u32::try_from(position).expect("segment positions fit in u32"),
                time_ms: batch.enqueued_time_ms,
                first_offset: batch.batch_offset + BATCH_HEADER_BYTES as u64,
            });
            self.last_indexed_position = Some(position);
        }
        self.end_position = position + u64::from(batch.batch_len);
        self.next_sequence = batch.next_sequence();
        self.first_sequence.get_or_insert(batch.base_sequence);
        self.first_time_ms.get_or_insert(batch.enqueued_time_ms);
        self.last_time_ms = Some(batch.enqueued_time_ms);
        self.last_offset = Some(last_offset);
    }

    /// The position of the last indexed batch starting at or before sequence number `seq`.
    pub(crate) fn position_for_sequence(&self, header: &SegmentHeader, seq: i64) -> u64 {
        let rel = seq - header.base_sequence;
        let i = self
            .index
            .partition_point(|e| i64::from(e.relative_sequence) <= rel);
        i.checked_sub(1).map_or(SEGMENT_HEADER_BYTES as u64, |i| {
            u64::from(self.index[i].position)
        })
    }

    /// The position of the last indexed batch whose first event's offset is at or before
    /// `offset` (any event at or after `offset` is at or past this position).
    pub(crate) fn position_for_offset(&self, offset: u64) -> u64 {
        let i = self.index.partition_point(|e| e.first_offset <= offset);
        i.checked_sub(1).map_or(SEGMENT_HEADER_BYTES as u64, |i| {
            u64::from(self.index[i].position)
        })
    }

    /// The position of the last indexed batch enqueued strictly before `time_ms` (any batch
    /// at or after it is at or past this position).
    pub(crate) fn position_for_time(&self, time_ms: i64) -> u64 {
        let i = self.index.partition_point(|e| e.time_ms < time_ms);
        i.checked_sub(1).map_or(SEGMENT_HEADER_BYTES as u64, |i| {
            u64::from(self.index[i].position)
        })
    }
}

/// A segment file and what it holds.
#[derive(Debug)]
pub(crate) struct Segment {
    /// Unique in the process: tells a segment from the compacted one that replaced it under
    /// the same name (a reader's position hint is only valid in the file it was taken in).
    pub id: u64,
    pub path: PathBuf,
    pub file: Box<dyn StorageFile>,
    pub header: SegmentHeader,
    pub contents: RwLock<SegmentContents>,
}

/// A new [`Segment::id`].
pub(crate) fn next_segment_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

pub(crate) fn segment_path(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}.log"))
}

/// The ending of a compacted segment being written, before it replaces the segment.
pub(crate) const CLEANED_SUFFIX: &str = ".cleaned";

/// Where compaction writes the replacement of the segment at `base_offset`.
pub(crate) fn cleaned_path(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}{CLEANED_SUFFIX}"))
}

pub(crate) fn index_path(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}.index"))
}

/// Parses a segment file name back to its base offset.
pub(crate) fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".log")?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

impl Segment {
    pub(crate) fn contents(&self) -> SegmentContents {
        self.contents.read().expect("segment lock").clone()
    }
}

/// How much a reader's next read of a file asks for: [`READ_CHUNK_FIRST_BYTES`] first, twice
/// the last after each read, at most [`READ_CHUNK_BYTES`] (see the first's docs for why).
///
/// [`READ_CHUNK_FIRST_BYTES`]: crate::limits::READ_CHUNK_FIRST_BYTES
/// [`READ_CHUNK_BYTES`]: crate::limits::READ_CHUNK_BYTES
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReadChunk(u64);

impl Default for ReadChunk {
    fn default() -> Self {
        ReadChunk(u64::from(crate::limits::READ_CHUNK_FIRST_BYTES))
    }
}

impl ReadChunk {
    /// The size of this read; the next one asks for twice as much, up to the largest.
    pub(crate) fn take(&mut self) -> u64 {
        let size = self.0;
        self.0 = (size * 2).min(u64::from(crate::limits::READ_CHUNK_BYTES));
        size
    }
}

/// Reads a file front to back in large chunks, so scanning many small batches costs few system
/// calls. The chunks grow from [`READ_CHUNK_FIRST_BYTES`](crate::limits::READ_CHUNK_FIRST_BYTES)
/// to [`READ_CHUNK_BYTES`](crate::limits::READ_CHUNK_BYTES): a scan that stops after a batch
/// or two (a lookup) reads little of a file the page cache does not hold.
pub(crate) struct ChunkReader<'f> {
    file: &'f dyn StorageFile,
    path: &'f Path,
    file_len: u64,
    buf: Vec<u8>,
    buf_start: u64,
    /// What the next read asks for at least.
    chunk: ReadChunk,
}

impl<'f> ChunkReader<'f> {
    pub(crate) fn new(file: &'f dyn StorageFile, path: &'f Path, file_len: u64) -> Self {
        ChunkReader {
            file,
            path,
            file_len,
            buf: Vec::new(),
            buf_start: 0,
            chunk: ReadChunk::default(),
        }
    }

    /// The bytes `[position, position + len)`, or `None` if the file ends first.
    pub(crate) fn get(&mut self, position: u64, len: usize) -> Result<Option<&[u8]>, LogError> {
        if position + len as u64 > self.file_len {
            return Ok(None);
        }
        let buf_end = self.buf_start + self.buf.len() as u64;
        if position < self.buf_start || position + len as u64 > buf_end {
            let want = (len as u64).max(self.chunk.take());
            let n = want.min(self.file_len - position) as usize;
            // Room for the largest chunk at once: growing chunk by chunk would leave each
            // smaller buffer behind in the allocator. Memory not yet written costs nothing.
            let room = n.max(crate::limits::READ_CHUNK_BYTES as usize);
            self.buf.reserve_exact(room.saturating_sub(self.buf.len()));
            self.buf.resize(n, 0);
            self.file
                .read_exact_at(&mut self.buf, position)
                .map_err(|e| LogError::io("read", self.path, e))?;
            self.buf_start = position;
        }
        let at = (position - self.buf_start) as usize;
        Ok(Some(&self.buf[at..at + len]))
    }
}

/// What scanning a segment found.
#[derive(Debug)]
pub(crate) struct ScanOutcome {
    pub contents: SegmentContents,
    /// Where and why the scan stopped before the end of the file, if it did. A zeroed tail
    /// (preallocated space) is not a reason.
    pub stopped: Option<(u64, DecodeErrorOrText)>,
}

/// Scans the batches of a segment from its first byte after the header, verifying each one:
/// magic, contiguous offsets and sequence numbers, non-decreasing time, length inside the file,
/// and CRC. Stops at the first batch that fails.
pub(crate) fn scan_segment(
    file: &dyn StorageFile,
    path: &Path,
    header: &SegmentHeader,
    file_len: u64,
    index_interval_bytes: u32,
) -> Result<ScanOutcome, LogError> {
    let mut contents = SegmentContents::empty(header);
    let mut reader = ChunkReader::new(file, path, file_len);
    let mut position = SEGMENT_HEADER_BYTES as u64;
    let stopped = loop {
        let Some(head) = reader.get(position, BATCH_HEADER_BYTES)? else {
            break (position < file_len).then(|| {
                (
                    position,
                    DecodeErrorOrText::from("a batch header runs past the end of the file"),
                )
            });
        };
        if head.iter().all(|&b| b == 0) {
            break None; // Preallocated, never written.
        }
        let batch = match BatchHeader::decode(head) {
            Ok(batch) => batch,
            Err(e) => break Some((position, e.into())),
        };
        if let Some(reason) = continuity_problem(&contents, header, &batch, position) {
            break Some((position, reason.into()));
        }
        let Some(bytes) = reader.get(position, batch.batch_len as usize)? else {
            break Some((position, "the batch runs past the end of the file".into()));
        };
        if let Err(e) = verify_checksum(bytes, &batch) {
            break Some((position, e.into()));
        }
        let offsets = match record_offsets(bytes, &batch) {
            Ok(offsets) => offsets,
            Err(e) => break Some((position, e.into())),
        };
        let last_offset = *offsets.last().expect("a batch has at least one record");
        contents.push_batch(header, &batch, position, last_offset, index_interval_bytes);
        position = contents.end_position;
    };
    Ok(ScanOutcome { contents, stopped })
}

fn continuity_problem(
    contents: &SegmentContents,
    header: &SegmentHeader,
    batch: &BatchHeader,
    position: u64,
) -> Option<String> {
    if header.is_compacted() {
        return compacted_continuity_problem(contents, header, batch);
    }
    if batch.batch_offset != header.base_offset + position {
        return Some(format!(
            "batch offset {} where {} was expected",
            batch.batch_offset,
            header.base_offset + position
        ));
    }
    if batch.base_sequence != contents.next_sequence {
        return Some(format!(
            "batch starts at sequence number {} where {} was expected",
            batch.base_sequence, contents.next_sequence
        ));
    }
    if contents
        .last_time_ms
        .is_some_and(|t| batch.enqueued_time_ms < t)
    {
        return Some("batch enqueued time goes backwards".into());
    }
    None
}

/// In a compacted segment offsets and sequence numbers may skip, but never go back.
fn compacted_continuity_problem(
    contents: &SegmentContents,
    header: &SegmentHeader,
    batch: &BatchHeader,
) -> Option<String> {
    let first_offset = batch.batch_offset + BATCH_HEADER_BYTES as u64;
    if batch.batch_offset < header.base_offset
        || contents
            .last_offset
            .is_some_and(|last| first_offset <= last)
    {
        return Some(format!(
            "batch offset {} goes back (the event before is at {:?})",
            batch.batch_offset, contents.last_offset
        ));
    }
    if batch.base_sequence < contents.next_sequence {
        return Some(format!(
            "batch starts at sequence number {}, before {}",
            batch.base_sequence, contents.next_sequence
        ));
    }
    // The index holds sequence numbers relative to the segment's base, in 32 bits.
    if batch.next_sequence() - header.base_sequence > i64::from(u32::MAX) {
        return Some(format!(
            "batch ends at sequence number {}, too far past the segment's base {}",
            batch.next_sequence(),
            header.base_sequence
        ));
    }
    if contents
        .last_time_ms
        .is_some_and(|t| batch.enqueued_time_ms < t)
    {
        return Some("batch enqueued time goes backwards".into());
    }
    None
}

/// Writes a sealed segment's index file and syncs it.
pub(crate) fn write_index_file(
    storage: &dyn Storage,
    path: &Path,
    header: &SegmentHeader,
    contents: &SegmentContents,
) -> Result<(), LogError> {
    let compacted = header.is_compacted();
    let version = if compacted {
        COMPACTED_INDEX_VERSION
    } else {
        INDEX_VERSION
    };
    let mut b = vec![0u8; INDEX_HEADER_BYTES];
    b[..8].copy_from_slice(&INDEX_MAGIC);
    b[8..IDX_ENTRY_COUNT_AT].copy_from_slice(&version.to_le_bytes());
    let count = u32::try_from(contents.index.len()).expect("index entries fit in u32");
    b[IDX_ENTRY_COUNT_AT..IDX_END_POSITION_AT].copy_from_slice(&count.to_le_bytes());
    b[IDX_END_POSITION_AT..IDX_NEXT_SEQUENCE_AT]
        .copy_from_slice(&contents.end_position.to_le_bytes());
    b[IDX_NEXT_SEQUENCE_AT..IDX_FIRST_TIME_AT]
        .copy_from_slice(&contents.next_sequence.to_le_bytes());
    b[IDX_FIRST_TIME_AT..IDX_LAST_TIME_AT]
        .copy_from_slice(&contents.first_time_ms.unwrap_or(NO_TIME).to_le_bytes());
    b[IDX_LAST_TIME_AT..IDX_LAST_OFFSET_AT]
        .copy_from_slice(&contents.last_time_ms.unwrap_or(NO_TIME).to_le_bytes());
    b[IDX_LAST_OFFSET_AT..IDX_CRC_AT]
        .copy_from_slice(&contents.last_offset.unwrap_or(NO_OFFSET).to_le_bytes());
    for e in &contents.index {
        b.extend_from_slice(&e.relative_sequence.to_le_bytes());
        b.extend_from_slice(&e.position.to_le_bytes());
        b.extend_from_slice(&e.time_ms.to_le_bytes());
        if compacted {
            b.extend_from_slice(&e.first_offset.to_le_bytes());
        }
    }
    if compacted {
        b[IDX_REWRITE_ID_AT..INDEX_HEADER_BYTES].copy_from_slice(&header.rewrite_id.to_le_bytes());
    }
    let covered_from = if compacted {
        IDX_REWRITE_ID_AT
    } else {
        INDEX_HEADER_BYTES
    };
    let mut crc = crate::checksum::crc32c(&b[..IDX_CRC_AT]);
    crc = crate::checksum::crc32c_append(crc, &b[covered_from..]);
    b[IDX_CRC_AT..IDX_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    let tmp = path.with_extension("index.tmp");
    storage
        .open(&tmp, OpenMode::Replace)
        .and_then(|f| f.write_all_at(&b, 0).and_then(|()| f.sync_all()))
        .map_err(|e| LogError::io("write", &tmp, e))?;
    storage
        .rename(&tmp, path)
        .map_err(|e| LogError::io("rename", path, e))
}

/// Reads a sealed segment's index file. `None` when it is missing, damaged or does not match
/// the segment (then the segment is scanned instead).
pub(crate) fn read_index_file(
    storage: &dyn Storage,
    path: &Path,
    header: &SegmentHeader,
    segment_len: u64,
) -> Option<SegmentContents> {
    let b = read_whole(storage, path).ok()?;
    if b.len() < INDEX_HEADER_BYTES || b[..8] != INDEX_MAGIC {
        return None;
    }
    let compacted = header.is_compacted();
    let (want_version, entry_bytes, covered_from) = if compacted {
        (
            COMPACTED_INDEX_VERSION,
            COMPACTED_INDEX_ENTRY_BYTES,
            IDX_REWRITE_ID_AT,
        )
    } else {
        (INDEX_VERSION, INDEX_ENTRY_BYTES, INDEX_HEADER_BYTES)
    };
    let mut r = Reader::new(&b[8..INDEX_HEADER_BYTES]);
    let version = r.u32("index version").ok()?;
    let count = r.u32("index entries").ok()? as usize;
    let end_position = r.u64("end position").ok()?;
    let next_sequence = r.i64("next sequence").ok()?;
    let first_time = r.i64("first time").ok()?;
    let last_time = r.i64("last time").ok()?;
    let last_offset = r.u64("last offset").ok()?;
    let stored_crc = r.u32("index crc").ok()?;
    let rewrite_id = r.u32("rewrite id").ok()?;
    let entries = &b[INDEX_HEADER_BYTES..];
    let crc = crate::checksum::crc32c_append(
        crate::checksum::crc32c(&b[..IDX_CRC_AT]),
        &b[covered_from..],
    );
    if version != want_version
        || crc != stored_crc
        || (compacted && rewrite_id != header.rewrite_id)
        || entries.len() != count.checked_mul(entry_bytes)?
        || end_position != segment_len
        || next_sequence < header.base_sequence
    {
        return None;
    }
    let index = read_index_entries(entries, count, header, compacted)?;
    if index
        .last()
        .is_some_and(|e| u64::from(e.position) >= end_position)
        || (count == 0) != (end_position == SEGMENT_HEADER_BYTES as u64)
    {
        return None;
    }
    let first_sequence = if compacted {
        index
            .first()
            .map(|e| header.base_sequence + i64::from(e.relative_sequence))
    } else {
        (next_sequence > header.base_sequence).then_some(header.base_sequence)
    };
    Some(SegmentContents {
        last_indexed_position: index.last().map(|e| u64::from(e.position)),
        index,
        end_position,
        next_sequence,
        first_sequence,
        first_time_ms: (first_time != NO_TIME).then_some(first_time),
        last_time_ms: (last_time != NO_TIME).then_some(last_time),
        last_offset: (last_offset != NO_OFFSET).then_some(last_offset),
    })
}

/// The entries of an index file, if they are in order by position, sequence number, time and
/// (in a compacted segment's index) first event offset.
fn read_index_entries(
    entries: &[u8],
    count: usize,
    header: &SegmentHeader,
    compacted: bool,
) -> Option<Vec<IndexEntry>> {
    let mut index = Vec::with_capacity(count);
    let mut r = Reader::new(entries);
    for _ in 0..count {
        let relative_sequence = r.u32("entry sequence").ok()?;
        let position = r.u32("entry position").ok()?;
        let time_ms = r.i64("entry time").ok()?;
        let first_offset = if compacted {
            r.u64("entry offset").ok()?
        } else {
            header.base_offset + u64::from(position) + BATCH_HEADER_BYTES as u64
        };
        index.push(IndexEntry {
            relative_sequence,
            position,
            time_ms,
            first_offset,
        });
    }
    let ordered = index.windows(2).all(|w| {
        w[0].position < w[1].position
            && w[0].relative_sequence < w[1].relative_sequence
            && w[0].time_ms <= w[1].time_ms
            && w[0].first_offset < w[1].first_offset
    });
    ordered.then_some(index)
}

/// Makes a directory entry change (a created, renamed or removed file) durable.
pub(crate) fn sync_dir(storage: &dyn Storage, dir: &Path) -> Result<(), LogError> {
    storage
        .sync_dir(dir)
        .map_err(|e| LogError::io("sync directory", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_header_round_trips_and_detects_damage() {
        let h = SegmentHeader {
            version: SEGMENT_VERSION,
            base_offset: 12345,
            base_sequence: 99,
            created_ms: 1_700_000_000_000,
            prev_last_offset: Some(12000),
            prev_last_time_ms: None,
            rewrite_id: 0,
        };
        let b = h.encode();
        let p = Path::new("x.log");
        assert_eq!(SegmentHeader::decode(&b, p).unwrap(), h);
        // Version 1 segments (written before batches could refer between records) still read;
        // a version this build does not know is refused.
        let v1 = SegmentHeader { version: 1, ..h };
        assert_eq!(SegmentHeader::decode(&v1.encode(), p).unwrap(), v1);
        let v3 = SegmentHeader {
            version: COMPACTED_SEGMENT_VERSION,
            rewrite_id: 0x5eed,
            ..h
        };
        assert!(
            SegmentHeader::decode(&v3.encode(), p)
                .unwrap()
                .is_compacted()
        );
        let mut v4 = v1.encode();
        v4[SEG_VERSION_AT..SEG_HEADER_LEN_AT].copy_from_slice(&4u32.to_le_bytes());
        let crc = crate::checksum::crc32c(&v4[..SEG_CRC_AT]);
        v4[SEG_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        let refused = SegmentHeader::decode(&v4, p).unwrap_err();
        assert!(matches!(refused, LogError::FormatTooNew(_)), "{refused}");
        let refused = refused.to_string();
        assert!(
            refused.starts_with(
                "segment x.log was written by format 4; this binary reads up to format 3"
            ),
            "{refused}"
        );
        let mut damaged = b;
        damaged[20] ^= 1;
        assert!(SegmentHeader::decode(&damaged, p).is_err());
        assert!(SegmentHeader::decode(&b[..10], p).is_err());
    }

    /// A compacted segment's index keeps each entry's first event offset, and is trusted only
    /// by the segment whose rewrite id it names.
    #[test]
    fn a_compacted_segment_s_index_round_trips_and_names_its_segment() {
        let storage = crate::storage::OsStorage;
        let dir = tempfile::tempdir().unwrap();
        let header = SegmentHeader {
            version: COMPACTED_SEGMENT_VERSION,
            base_offset: 4096,
            base_sequence: 10,
            created_ms: 1_700_000_000_000,
            prev_last_offset: Some(4000),
            prev_last_time_ms: Some(1_700_000_000_000),
            rewrite_id: 77,
        };
        let mut contents = SegmentContents::empty(&header);
        contents.index = vec![
            IndexEntry {
                relative_sequence: 3,
                position: 64,
                time_ms: 5,
                first_offset: 4300,
            },
            IndexEntry {
                relative_sequence: 9,
                position: 700,
                time_ms: 6,
                first_offset: 4310,
            },
        ];
        contents.end_position = 900;
        contents.next_sequence = 25;
        contents.first_sequence = Some(13);
        contents.first_time_ms = Some(5);
        contents.last_time_ms = Some(6);
        contents.last_offset = Some(4400);
        contents.last_indexed_position = Some(700);
        let path = &index_path(dir.path(), header.base_offset);
        write_index_file(&storage, path, &header, &contents).unwrap();
        assert_eq!(
            read_index_file(&storage, path, &header, 900),
            Some(contents.clone())
        );
        let other = SegmentHeader {
            rewrite_id: 78,
            ..header
        };
        assert_eq!(read_index_file(&storage, path, &other, 900), None);
        let uncompacted = SegmentHeader {
            version: SEGMENT_VERSION,
            rewrite_id: 0,
            ..header
        };
        assert_eq!(read_index_file(&storage, path, &uncompacted, 900), None);
    }

    /// A compacted segment's sequence numbers may skip, but a batch so far past the segment's
    /// base that the index cannot hold it is damage, reported, not a panic.
    #[test]
    fn a_compacted_segment_s_batch_too_far_past_its_base_stops_the_scan() {
        use crate::storage::Storage;
        let dir = tempfile::tempdir().unwrap();
        let header = SegmentHeader {
            version: COMPACTED_SEGMENT_VERSION,
            base_offset: 0,
            base_sequence: 0,
            created_ms: 0,
            prev_last_offset: None,
            prev_last_time_ms: None,
            rewrite_id: 1,
        };
        let mut bytes = header.encode().to_vec();
        let mut batch = Vec::new();
        let event = [tributary_event::EventData::new("e")];
        let far = 1i64 << 33;
        crate::record::encode_batch(&mut batch, 64, far, 0, &event, false, &mut Vec::new());
        bytes.extend_from_slice(&batch);
        let path = dir.path().join("00000000000000000000.log");
        std::fs::write(&path, &bytes).unwrap();
        let file = crate::storage::OsStorage
            .open(&path, OpenMode::Read)
            .unwrap();
        let scan = scan_segment(file.as_ref(), &path, &header, bytes.len() as u64, 512).unwrap();
        assert!(scan.stopped.is_some(), "{scan:?}");
        assert!(scan.contents.index.is_empty());
    }

    #[test]
    fn segment_names_parse() {
        assert_eq!(parse_segment_name("00000000000000000064.log"), Some(64));
        assert_eq!(parse_segment_name("64.log"), None);
        assert_eq!(parse_segment_name("00000000000000000064.index"), None);
    }
}
