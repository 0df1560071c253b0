//! The byte layout of batches and records, and the one strict reader that decodes them.
//!
//! A batch is what one append writes: a fixed header followed by its records. Every field is a
//! fixed-size little-endian integer; offsets are derived from the previous field, never written
//! as literals (see `docs/design.md` for the table). The CRC32C in the header covers every byte
//! after itself, so a torn or corrupt batch is detected before any of it is believed.
//!
//! Decoding never trusts a length: each is checked against what is left before anything is
//! allocated or sliced, trailing bytes are an error, and unknown flag bits are an error rather
//! than silently ignored.

use std::ops::Range;

use bytes::Bytes;
use tributary_event::{EventData, PropertyValue, PropertyValueRef, ReceivedEvent, SmolStr};

/// "TRB1" read as a little-endian `u32`: marks the start of a batch. A zeroed (preallocated,
/// never written) region can never look like a batch.
pub(crate) const BATCH_MAGIC: u32 = u32::from_le_bytes(*b"TRB1");

const MAGIC_AT: usize = 0;
const BATCH_LEN_AT: usize = MAGIC_AT + 4;
pub(crate) const CRC_AT: usize = BATCH_LEN_AT + 4;
const BATCH_OFFSET_AT: usize = CRC_AT + 4;
const BASE_SEQUENCE_AT: usize = BATCH_OFFSET_AT + 8;
const RECORD_COUNT_AT: usize = BASE_SEQUENCE_AT + 8;
const ENQUEUED_TIME_AT: usize = RECORD_COUNT_AT + 4;
const FLAGS_AT: usize = ENQUEUED_TIME_AT + 8;
/// Bytes in a batch header.
pub(crate) const BATCH_HEADER_BYTES: usize = FLAGS_AT + 4;
/// The CRC covers the batch from the field after it to the batch's end.
pub(crate) const CRC_COVERS_FROM: usize = CRC_AT + 4;

// Record flags: which optional fields follow.
const HAS_PARTITION_KEY: u8 = 1 << 0;
const HAS_CONTENT_TYPE: u8 = 1 << 1;
const HAS_CORRELATION_ID: u8 = 1 << 2;
const HAS_MESSAGE_ID: u8 = 1 << 3;
const HAS_PROTOCOL_SECTIONS: u8 = 1 << 4;
const KNOWN_RECORD_FLAGS: u8 = HAS_PARTITION_KEY
    | HAS_CONTENT_TYPE
    | HAS_CORRELATION_ID
    | HAS_MESSAGE_ID
    | HAS_PROTOCOL_SECTIONS;

// Batch flags.
/// Records of the batch may name a property of the record before them instead of writing it
/// again (see [`SAME_PROPERTY`]).
const BATCH_PROPERTY_REFS: u32 = 1 << 0;
const KNOWN_BATCH_FLAGS: u32 = BATCH_PROPERTY_REFS;

// A property's key length field with its top bit set is a reference to the property at the same
// place in the record before (in a batch flagged `BATCH_PROPERTY_REFS`, never in its first
// record): `SAME_PROPERTY` takes that property's key and value, and nothing follows;
// `SAME_KEY` takes its key, and the value follows. Replicated events carry the same hub ids
// and property names event after event; naming them instead halves a stamped record. No key
// is 2 GiB long (a record fits a batch), so literal lengths never set the bit.
const SAME_PROPERTY: u32 = 0x8000_0000;
const SAME_KEY: u32 = 0x8000_0001;
const _: () = assert!(crate::limits::BATCH_BYTES_MAX < SAME_PROPERTY);

// Property value tags.
const TAG_NULL: u8 = 0;
const TAG_BOOL: u8 = 1;
const TAG_INT32: u8 = 2;
const TAG_INT64: u8 = 3;
const TAG_UINT32: u8 = 4;
const TAG_UINT64: u8 = 5;
const TAG_FLOAT32: u8 = 6;
const TAG_FLOAT64: u8 = 7;
const TAG_STRING: u8 = 8;
const TAG_BYTES: u8 = 9;
const TAG_TIMESTAMP: u8 = 10;
const TAG_UUID: u8 = 11;

/// Why bytes that should hold a batch or record do not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// A field runs past the end of the bytes that hold it.
    #[error("{field} needs {needed} bytes but only {left} are left")]
    Truncated {
        /// The field being read.
        field: &'static str,
        /// How many bytes it needs.
        needed: u64,
        /// How many were left.
        left: u64,
    },
    /// A field holds a value it may not hold.
    #[error("{field} has the invalid value {value}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// A string field is not UTF-8.
    #[error("{field} is not valid UTF-8")]
    NotUtf8 {
        /// The field.
        field: &'static str,
    },
    /// The checksum does not match the contents.
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// The CRC32C in the header.
        stored: u32,
        /// The CRC32C of the bytes.
        computed: u32,
    },
    /// Bytes are left over after the last field.
    #[error("{left} unexpected bytes after {after}")]
    Trailing {
        /// What was decoded completely.
        after: &'static str,
        /// How many bytes were left.
        left: u64,
    },
}

/// A batch header, decoded and range-checked (but its CRC not yet verified).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchHeader {
    /// Bytes in the whole batch, header included.
    pub batch_len: u32,
    /// CRC32C of the batch after the CRC field.
    pub crc: u32,
    /// The offset of the batch's first byte in the partition.
    pub batch_offset: u64,
    /// The sequence number of the first record.
    pub base_sequence: i64,
    /// How many records follow; at least one.
    pub record_count: u32,
    /// When the batch was appended; shared by its records.
    pub enqueued_time_ms: i64,
    /// Whether records may name properties of the record before them.
    pub property_refs: bool,
}

impl BatchHeader {
    /// Decodes the fixed header at the start of `bytes`.
    pub(crate) fn decode(bytes: &[u8]) -> Result<BatchHeader, DecodeError> {
        let mut r = Reader::new(bytes);
        let magic = r.u32("batch magic")?;
        if magic != BATCH_MAGIC {
            return Err(DecodeError::Invalid {
                field: "batch magic",
                value: u64::from(magic),
            });
        }
        let mut header = BatchHeader {
            batch_len: r.u32("batch length")?,
            crc: r.u32("batch crc")?,
            batch_offset: r.u64("batch offset")?,
            base_sequence: r.i64("batch base sequence")?,
            record_count: r.u32("batch record count")?,
            enqueued_time_ms: r.i64("batch enqueued time")?,
            property_refs: false,
        };
        let flags = r.u32("batch flags")?;
        debug_assert_eq!(r.position(), BATCH_HEADER_BYTES);
        let invalid = |field, value: u64| Err(DecodeError::Invalid { field, value });
        if flags & !KNOWN_BATCH_FLAGS != 0 {
            return invalid("batch flags", u64::from(flags));
        }
        header.property_refs = flags & BATCH_PROPERTY_REFS != 0;
        if (header.batch_len as usize) < BATCH_HEADER_BYTES + 4 {
            return invalid("batch length", u64::from(header.batch_len));
        }
        if header.record_count == 0 {
            return invalid("batch record count", 0);
        }
        if header.base_sequence < 0 {
            return invalid("batch base sequence", header.base_sequence as u64);
        }
        // The batch's offsets and sequence numbers must not wrap: every record's offset and
        // sequence number is computed from these by addition.
        if header
            .batch_offset
            .checked_add(u64::from(header.batch_len))
            .is_none()
        {
            return invalid("batch offset", header.batch_offset);
        }
        if header
            .base_sequence
            .checked_add(i64::from(header.record_count))
            .is_none()
        {
            return invalid("batch base sequence", header.base_sequence as u64);
        }
        Ok(header)
    }

    /// The sequence number the batch after this one starts with.
    pub(crate) fn next_sequence(&self) -> i64 {
        self.base_sequence + i64::from(self.record_count)
    }
}

/// Checks the CRC of a whole batch (header included) against its header.
pub(crate) fn verify_checksum(batch: &[u8], header: &BatchHeader) -> Result<(), DecodeError> {
    assert_eq!(batch.len(), header.batch_len as usize);
    let computed = crate::checksum::crc32c(&batch[CRC_COVERS_FROM..]);
    if computed != header.crc {
        return Err(DecodeError::Checksum {
            stored: header.crc,
            computed,
        });
    }
    Ok(())
}

/// The encoded size of one record on its own (no property written as a reference to the
/// record before), length prefix included: what limits apply to, and the most
/// [`encode_record`] writes.
pub(crate) fn record_len(event: &EventData) -> u64 {
    let str_len = |s: &Option<String>| s.as_ref().map_or(0, |s| 4 + s.len() as u64);
    let mut len = 4 + 1; // record length, flags
    len += str_len(&event.partition_key);
    len += str_len(&event.content_type);
    len += str_len(&event.correlation_id);
    len += str_len(&event.message_id);
    len += event
        .protocol_sections
        .as_ref()
        .map_or(0, |b| 4 + b.len() as u64);
    len += 4; // property count
    for (key, value) in &event.properties {
        len += 4 + key.len() as u64 + 1 + value_len(value);
    }
    len + 4 + event.body.len() as u64
}

fn value_len(value: &PropertyValue) -> u64 {
    match value {
        PropertyValue::Null => 0,
        PropertyValue::Bool(_) => 1,
        PropertyValue::Int32(_) | PropertyValue::UInt32(_) | PropertyValue::Float32(_) => 4,
        PropertyValue::Int64(_)
        | PropertyValue::UInt64(_)
        | PropertyValue::Float64(_)
        | PropertyValue::Timestamp(_) => 8,
        PropertyValue::String(s) => 4 + s.len() as u64,
        PropertyValue::Bytes(b) => 4 + b.len() as u64,
        PropertyValue::Uuid(_) => 16,
    }
}

/// Encodes a whole batch into `out` (cleared first) and pushes each record's offset to
/// `offsets`; records name properties of the record before only if `property_refs_allowed`
/// (the segment's version allows it). The caller has checked every size against the limits.
pub(crate) fn encode_batch(
    out: &mut Vec<u8>,
    batch_offset: u64,
    base_sequence: i64,
    enqueued_time_ms: i64,
    events: &[EventData],
    property_refs_allowed: bool,
    offsets: &mut Vec<u64>,
) {
    assert!(!events.is_empty());
    assert!(base_sequence >= 0);
    out.clear();
    out.resize(BATCH_HEADER_BYTES, 0);
    let mut property_refs = false;
    let mut previous: &[(SmolStr, PropertyValue)] = &[];
    for event in events {
        offsets.push(batch_offset + out.len() as u64);
        property_refs |= encode_record(out, event, previous);
        if property_refs_allowed {
            previous = &event.properties;
        }
    }
    let record_count = u32::try_from(events.len()).expect("record count fits in u32");
    seal_batch_header(
        out,
        batch_offset,
        base_sequence,
        record_count,
        enqueued_time_ms,
        property_refs,
    );
    // Pair assertion: what we are about to write decodes back to what we meant to write.
    let header = BatchHeader::decode(out).expect("freshly encoded batch header decodes");
    assert_eq!(header.batch_offset, batch_offset);
    assert_eq!(header.base_sequence, base_sequence);
    assert_eq!(header.record_count, record_count);
    assert_eq!(header.property_refs, property_refs);
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_len_prefixed(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(
        out,
        u32::try_from(bytes.len()).expect("field length checked against limits"),
    );
    out.extend_from_slice(bytes);
}

/// Encodes `event`'s record; properties equal to those at the same place in `previous` (the
/// record before in the batch) are written as references to them. Returns whether any was.
fn encode_record(
    out: &mut Vec<u8>,
    event: &EventData,
    previous: &[(SmolStr, PropertyValue)],
) -> bool {
    let start = out.len();
    put_u32(out, 0); // patched below
    let mut flags = 0u8;
    let optional = [
        (
            HAS_PARTITION_KEY,
            event.partition_key.as_deref().map(str::as_bytes),
        ),
        (
            HAS_CONTENT_TYPE,
            event.content_type.as_deref().map(str::as_bytes),
        ),
        (
            HAS_CORRELATION_ID,
            event.correlation_id.as_deref().map(str::as_bytes),
        ),
        (
            HAS_MESSAGE_ID,
            event.message_id.as_deref().map(str::as_bytes),
        ),
        (HAS_PROTOCOL_SECTIONS, event.protocol_sections.as_deref()),
    ];
    for (flag, field) in &optional {
        if field.is_some() {
            flags |= flag;
        }
    }
    out.push(flags);
    for (_, field) in optional {
        if let Some(bytes) = field {
            put_len_prefixed(out, bytes);
        }
    }
    put_u32(
        out,
        u32::try_from(event.properties.len()).expect("property count fits in u32"),
    );
    let mut referred = false;
    for (index, (key, value)) in event.properties.iter().enumerate() {
        match previous.get(index) {
            Some((before_key, before_value)) if same_text(before_key, key) => {
                referred = true;
                if same_value(before_value, value) {
                    put_u32(out, SAME_PROPERTY);
                } else {
                    put_u32(out, SAME_KEY);
                    encode_value(out, value);
                }
            }
            _ => {
                put_len_prefixed(out, key.as_bytes());
                encode_value(out, value);
            }
        }
    }
    put_len_prefixed(out, &event.body);
    let len = u32::try_from(out.len() - start - 4).expect("record length fits in u32");
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    debug_assert!((out.len() - start) as u64 <= record_len(event));
    referred
}

/// Whether `a` and `b` are the same value, bit for bit: a reference must decode to exactly what
/// was given (`0.0 == -0.0` as floats, but they are two values).
fn same_value(a: &PropertyValue, b: &PropertyValue) -> bool {
    match (a, b) {
        (PropertyValue::String(a), PropertyValue::String(b)) => same_text(a, b),
        (PropertyValue::Float32(a), PropertyValue::Float32(b)) => a.to_bits() == b.to_bits(),
        (PropertyValue::Float64(a), PropertyValue::Float64(b)) => a.to_bits() == b.to_bits(),
        _ => a == b,
    }
}

/// Whether `a` and `b` are the same text. Texts shared between records (a static key, a long
/// value cloned from one event to the next, as a replication task's stamps are) are one
/// allocation: equal addresses and lengths answer without reading the bytes.
fn same_text(a: &str, b: &str) -> bool {
    (a.as_ptr() == b.as_ptr() && a.len() == b.len()) || a == b
}

fn encode_value(out: &mut Vec<u8>, value: &PropertyValue) {
    match value {
        PropertyValue::Null => out.push(TAG_NULL),
        PropertyValue::Bool(b) => out.extend_from_slice(&[TAG_BOOL, u8::from(*b)]),
        PropertyValue::Int32(v) => {
            out.push(TAG_INT32);
            out.extend_from_slice(&v.to_le_bytes());
        }
        PropertyValue::Int64(v) => {
            out.push(TAG_INT64);
            out.extend_from_slice(&v.to_le_bytes());
        }
        PropertyValue::UInt32(v) => {
            out.push(TAG_UINT32);
            out.extend_from_slice(&v.to_le_bytes());
        }
        PropertyValue::UInt64(v) => {
            out.push(TAG_UINT64);
            out.extend_from_slice(&v.to_le_bytes());
        }
        PropertyValue::Float32(v) => {
            out.push(TAG_FLOAT32);
            out.extend_from_slice(&v.to_bits().to_le_bytes());
        }
        PropertyValue::Float64(v) => {
            out.push(TAG_FLOAT64);
            out.extend_from_slice(&v.to_bits().to_le_bytes());
        }
        PropertyValue::String(s) => {
            out.push(TAG_STRING);
            put_len_prefixed(out, s.as_bytes());
        }
        PropertyValue::Bytes(b) => {
            out.push(TAG_BYTES);
            put_len_prefixed(out, b);
        }
        PropertyValue::Timestamp(v) => {
            out.push(TAG_TIMESTAMP);
            out.extend_from_slice(&v.to_le_bytes());
        }
        PropertyValue::Uuid(u) => {
            out.push(TAG_UUID);
            out.extend_from_slice(u);
        }
    }
}

/// Decodes every record of a checksummed batch into received events.
///
/// `batch` holds exactly the batch (header included); bodies and byte fields are slices of it,
/// not copies. Events with a sequence number below `from_sequence` are skipped; decoding stops
/// once `out` holds `max_events` events. The records are indexed first ([`index_batch`], the
/// one reader of records), then copied out of the index.
pub(crate) fn decode_batch(
    batch: &Bytes,
    header: &BatchHeader,
    from_sequence: i64,
    max_events: usize,
    out: &mut Vec<ReceivedEvent>,
) -> Result<(), DecodeError> {
    let mut records = Vec::new();
    let mut properties = Vec::new();
    let wanted = max_events.saturating_sub(out.len());
    index_batch(
        batch,
        header,
        0,
        from_sequence,
        wanted,
        &mut records,
        &mut properties,
    )?;
    out.extend(
        records
            .iter()
            .map(|record| owned_event(batch, record, &properties)),
    );
    Ok(())
}

/// Where a field lies in its batch: `start..start + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    start: u32,
    len: u32,
}

/// A position inside a batch as a `u32`: a batch is shorter than 4 GiB (its length field is
/// a `u32`), so every position fits.
fn position(n: usize) -> u32 {
    u32::try_from(n).expect("a position inside a batch")
}

impl Span {
    fn new(start: usize, len: usize) -> Span {
        Span {
            start: position(start),
            len: position(len),
        }
    }

    pub(crate) fn range(self) -> Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }
}

/// A record of a checksummed batch, indexed in place: where each of its fields lies in the
/// batch, every length and text already checked, so reading a field cannot fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IndexedRecord {
    pub sequence_number: i64,
    pub offset: u64,
    pub enqueued_time_ms: i64,
    /// Which batch of the read holds the record (see `crate::RecordsRead`).
    pub batch: u32,
    pub partition_key: Option<Span>,
    pub content_type: Option<Span>,
    pub correlation_id: Option<Span>,
    pub message_id: Option<Span>,
    pub protocol_sections: Option<Span>,
    /// The record's properties: a range of the read's [`IndexedProperty`]s.
    pub properties: Range<u32>,
    pub body: Span,
}

/// An application property of an indexed record: its key, and where its value (tag first)
/// lies. A property that refers to the record before takes that record's key (and value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexedProperty {
    pub key: Span,
    pub value_at: u32,
}

/// Indexes the records of a checksummed batch, from `from_sequence` on, into `records` (until
/// it holds `max_events`), their properties into `properties`; `batch_index` is what
/// [`IndexedRecord::batch`] says. The one reader of records: every length, flag, tag and text
/// is checked here, and a record that breaks a rule is refused.
pub(crate) fn index_batch(
    batch: &[u8],
    header: &BatchHeader,
    batch_index: u32,
    from_sequence: i64,
    max_events: usize,
    records: &mut Vec<IndexedRecord>,
    properties: &mut Vec<IndexedProperty>,
) -> Result<(), DecodeError> {
    let mut position = BATCH_HEADER_BYTES;
    // The properties of the record before, which a record may refer to (in a batch flagged
    // for it). A record before `from_sequence` is indexed only for that; its properties stay
    // in `properties`, referred to by no record.
    let mut previous = header
        .property_refs
        .then_some(properties.len()..properties.len());
    for i in 0..header.record_count {
        if records.len() >= max_events {
            return Ok(());
        }
        let sequence_number = header.base_sequence + i64::from(i);
        let record_start = position;
        let record = record_span(batch, &mut position)?;
        let kept = sequence_number >= from_sequence;
        if !kept && previous.is_none() {
            continue;
        }
        let properties_start = properties.len();
        let fields = index_record(batch, record, previous.clone(), properties)?;
        if previous.is_some() {
            previous = Some(properties_start..properties.len());
        }
        if kept {
            records.push(IndexedRecord {
                sequence_number,
                offset: header.batch_offset + record_start as u64,
                enqueued_time_ms: header.enqueued_time_ms,
                batch: batch_index,
                ..fields
            });
        }
    }
    if position != batch.len() {
        return Err(DecodeError::Trailing {
            after: "the last record of a batch",
            left: (batch.len() - position) as u64,
        });
    }
    Ok(())
}

/// The offsets of the records of a batch, in order, without decoding them.
pub(crate) fn record_offsets(batch: &[u8], header: &BatchHeader) -> Result<Vec<u64>, DecodeError> {
    // Each record takes at least its 4-byte length, so a count the batch cannot hold is corrupt
    // (the CRC is no MAC: a damaged or crafted batch can carry any count); this bounds the
    // allocation below.
    if u64::from(header.record_count) * 4 > batch.len().saturating_sub(BATCH_HEADER_BYTES) as u64 {
        return Err(DecodeError::Invalid {
            field: "batch record count",
            value: u64::from(header.record_count),
        });
    }
    let mut offsets = Vec::with_capacity(header.record_count as usize);
    let mut position = BATCH_HEADER_BYTES;
    for _ in 0..header.record_count {
        offsets.push(header.batch_offset + position as u64);
        let mut r = Reader::new(&batch[position..]);
        let len = r.u32("record length")? as usize;
        r.skip(len, "record")?;
        position += 4 + len;
    }
    if position != batch.len() {
        return Err(DecodeError::Trailing {
            after: "the last record of a batch",
            left: (batch.len() - position) as u64,
        });
    }
    Ok(offsets)
}

/// Where each record of a batch lies: `(start, end)` positions in the batch, the start being
/// the record's length field (so its offset is the batch offset plus `start`).
pub(crate) fn record_spans(
    batch: &[u8],
    header: &BatchHeader,
) -> Result<Vec<(usize, usize)>, DecodeError> {
    let offsets = record_offsets(batch, header)?;
    let mut spans = Vec::with_capacity(offsets.len());
    for (i, &offset) in offsets.iter().enumerate() {
        let start = (offset - header.batch_offset) as usize;
        let end = offsets
            .get(i + 1)
            .map_or(batch.len(), |&next| (next - header.batch_offset) as usize);
        spans.push((start, end));
    }
    Ok(spans)
}

/// What compaction needs to know of a record, read without decoding it: its partition key,
/// whether its body is empty (a tombstone, when it has a key) and whether it names properties
/// of the record before it (so it cannot start a batch as it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordSummary<'a> {
    /// The partition key's bytes, if the record has one.
    pub key: Option<&'a [u8]>,
    /// Whether the body is empty.
    pub empty_body: bool,
    /// Whether a property refers to the record before.
    pub refers: bool,
}

/// Summarises the record whose length field starts `record` (which holds exactly the record),
/// checking every length as [`decode_record`] does.
pub(crate) fn summarize_record(record: &[u8]) -> Result<RecordSummary<'_>, DecodeError> {
    let mut r = Reader::new(record);
    let len = r.u32("record length")? as usize;
    if len != r.left() {
        return Err(DecodeError::Invalid {
            field: "record length",
            value: len as u64,
        });
    }
    let flags = r.u8("record flags")?;
    if flags & !KNOWN_RECORD_FLAGS != 0 {
        return Err(DecodeError::Invalid {
            field: "record flags",
            value: u64::from(flags),
        });
    }
    let mut key = None;
    for (flag, field) in [
        (HAS_PARTITION_KEY, "partition key"),
        (HAS_CONTENT_TYPE, "content type"),
        (HAS_CORRELATION_ID, "correlation id"),
        (HAS_MESSAGE_ID, "message id"),
        (HAS_PROTOCOL_SECTIONS, "protocol sections"),
    ] {
        if flags & flag != 0 {
            let n = r.u32(field)? as usize;
            let bytes = r.take(n, field)?;
            if flag == HAS_PARTITION_KEY {
                key = Some(bytes);
            }
        }
    }
    let property_count = r.u32("property count")?;
    let mut refers = false;
    for _ in 0..property_count {
        let key_len = r.u32("property key")?;
        match key_len {
            SAME_PROPERTY => refers = true,
            SAME_KEY => {
                refers = true;
                skip_value(&mut r)?;
            }
            n if n & SAME_PROPERTY != 0 => {
                return Err(DecodeError::Invalid {
                    field: "property reference",
                    value: u64::from(n),
                });
            }
            n => {
                r.skip(n as usize, "property key")?;
                skip_value(&mut r)?;
            }
        }
    }
    let body_len = r.u32("body")? as usize;
    r.skip(body_len, "body")?;
    r.finish("a record")?;
    Ok(RecordSummary {
        key,
        empty_body: body_len == 0,
        refers,
    })
}

/// Steps over a property value (its tag and bytes).
fn skip_value(r: &mut Reader<'_>) -> Result<(), DecodeError> {
    let fixed = match r.u8("property tag")? {
        TAG_NULL => 0,
        TAG_BOOL => 1,
        TAG_INT32 | TAG_UINT32 | TAG_FLOAT32 => 4,
        TAG_INT64 | TAG_UINT64 | TAG_FLOAT64 | TAG_TIMESTAMP => 8,
        TAG_UUID => 16,
        TAG_STRING | TAG_BYTES => r.u32("property value")? as usize,
        other => {
            return Err(DecodeError::Invalid {
                field: "property tag",
                value: u64::from(other),
            });
        }
    };
    r.skip(fixed, "property value")
}

/// Writes the header of the batch in `out`: its records (whole, length fields included) lie
/// back to back after a header-sized gap, and the CRC covers them. An append's batch, and
/// compaction's way to keep a run of records with their original offsets (the records must
/// not refer to a record before the first of them).
pub(crate) fn seal_batch_header(
    out: &mut [u8],
    batch_offset: u64,
    base_sequence: i64,
    record_count: u32,
    enqueued_time_ms: i64,
    property_refs: bool,
) {
    assert!(record_count >= 1);
    assert!(base_sequence >= 0);
    let batch_len = u32::try_from(out.len()).expect("a batch is shorter than 4 GiB");
    let flags = if property_refs {
        BATCH_PROPERTY_REFS
    } else {
        0
    };
    out[MAGIC_AT..BATCH_LEN_AT].copy_from_slice(&BATCH_MAGIC.to_le_bytes());
    out[BATCH_LEN_AT..CRC_AT].copy_from_slice(&batch_len.to_le_bytes());
    out[BATCH_OFFSET_AT..BASE_SEQUENCE_AT].copy_from_slice(&batch_offset.to_le_bytes());
    out[BASE_SEQUENCE_AT..RECORD_COUNT_AT].copy_from_slice(&base_sequence.to_le_bytes());
    out[RECORD_COUNT_AT..ENQUEUED_TIME_AT].copy_from_slice(&record_count.to_le_bytes());
    out[ENQUEUED_TIME_AT..FLAGS_AT].copy_from_slice(&enqueued_time_ms.to_le_bytes());
    out[FLAGS_AT..BATCH_HEADER_BYTES].copy_from_slice(&flags.to_le_bytes());
    let crc = crate::checksum::crc32c(&out[CRC_COVERS_FROM..]);
    out[CRC_AT..CRC_COVERS_FROM].copy_from_slice(&crc.to_le_bytes());
}

/// Where in `batch` the record starting at `*position` lies (after its length prefix); advances
/// past it.
fn record_span(batch: &[u8], position: &mut usize) -> Result<Range<usize>, DecodeError> {
    let mut r = Reader::new(&batch[*position..]);
    let len = r.u32("record length")? as usize;
    r.skip(len, "record")?;
    let span = *position + 4..*position + 4 + len;
    *position = span.end;
    Ok(span)
}

/// Indexes the record at `span` of `batch` (after its length prefix), pushing its properties
/// to `properties`. `previous` is where the properties of the record before lie in
/// `properties`, where the batch allows references to them (`None` where it does not: a
/// reference is then invalid). The returned record's sequence number, offset, time and batch
/// are left for the caller.
fn index_record(
    batch: &[u8],
    span: Range<usize>,
    previous: Option<Range<usize>>,
    properties: &mut Vec<IndexedProperty>,
) -> Result<IndexedRecord, DecodeError> {
    let (base, mut r) = (span.start, Reader::new(&batch[span]));
    let flags = r.u8("record flags")?;
    if flags & !KNOWN_RECORD_FLAGS != 0 {
        return Err(DecodeError::Invalid {
            field: "record flags",
            value: u64::from(flags),
        });
    }
    let mut optional = |flag, field, text| -> Result<Option<Span>, DecodeError> {
        if flags & flag == 0 {
            return Ok(None);
        }
        r.span(base, field, text).map(Some)
    };
    let partition_key = optional(HAS_PARTITION_KEY, "partition key", true)?;
    let content_type = optional(HAS_CONTENT_TYPE, "content type", true)?;
    let correlation_id = optional(HAS_CORRELATION_ID, "correlation id", true)?;
    let message_id = optional(HAS_MESSAGE_ID, "message id", true)?;
    let protocol_sections = optional(HAS_PROTOCOL_SECTIONS, "protocol sections", false)?;
    let property_count = r.u32("property count")?;
    // Each property takes at least 4 bytes, so a count the record cannot hold is corrupt; this
    // bounds the reservation below.
    if u64::from(property_count) * 4 > r.left() as u64 {
        return Err(DecodeError::Invalid {
            field: "property count",
            value: u64::from(property_count),
        });
    }
    let first_property = properties.len();
    index_properties(&mut r, base, property_count, previous, properties)?;
    let body = r.span(base, "body", false)?;
    r.finish("a record")?;
    let fit = |n: usize| u32::try_from(n).expect("a count of properties read into memory");
    Ok(IndexedRecord {
        sequence_number: 0,
        offset: 0,
        enqueued_time_ms: 0,
        batch: 0,
        partition_key,
        content_type,
        correlation_id,
        message_id,
        protocol_sections,
        properties: fit(first_property)..fit(properties.len()),
        body,
    })
}

/// Indexes the `count` properties `r` reads next (its bytes start at `base` of the batch),
/// pushing them to `properties`; `previous` as for [`index_record`].
fn index_properties(
    r: &mut Reader<'_>,
    base: usize,
    count: u32,
    previous: Option<Range<usize>>,
    properties: &mut Vec<IndexedProperty>,
) -> Result<(), DecodeError> {
    properties.reserve(count as usize);
    for index in 0..count as usize {
        let key_len = r.u32("property key")?;
        if key_len & SAME_PROPERTY == 0 {
            let key_at = base + r.position();
            let key = r.take(key_len as usize, "property key")?;
            std::str::from_utf8(key).map_err(|_| DecodeError::NotUtf8 {
                field: "property key",
            })?;
            let value_at = base + r.position();
            decode_value(r)?;
            properties.push(IndexedProperty {
                key: Span::new(key_at, key.len()),
                value_at: position(value_at),
            });
            continue;
        }
        let before = previous
            .as_ref()
            .filter(|previous| index < previous.len())
            .map(|previous| properties[previous.start + index]);
        let Some(before) = before else {
            return Err(DecodeError::Invalid {
                field: "property reference (no such property in the record before)",
                value: u64::from(key_len),
            });
        };
        let property = match key_len {
            SAME_PROPERTY => before,
            SAME_KEY => {
                let value_at = base + r.position();
                decode_value(r)?;
                IndexedProperty {
                    key: before.key,
                    value_at: position(value_at),
                }
            }
            other => {
                return Err(DecodeError::Invalid {
                    field: "property reference",
                    value: u64::from(other),
                });
            }
        };
        properties.push(property);
    }
    Ok(())
}

/// The text at `span` of `batch`, which indexing checked is UTF-8.
pub(crate) fn text_at(batch: &[u8], span: Span) -> &str {
    std::str::from_utf8(&batch[span.range()]).expect("a text checked when indexed")
}

/// The property value whose tag is at `at` in `batch`, which indexing checked.
pub(crate) fn value_at(batch: &[u8], at: u32) -> PropertyValueRef<'_> {
    decode_value(&mut Reader::new(&batch[at as usize..])).expect("a value checked when indexed")
}

/// `record`, indexed in `batch` with its `properties`, as an owned event: texts copied, byte
/// fields sliced from `batch` (no copy).
pub(crate) fn owned_event(
    batch: &Bytes,
    record: &IndexedRecord,
    properties: &[IndexedProperty],
) -> ReceivedEvent {
    let text = |span: Option<Span>| span.map(|span| text_at(batch, span).to_owned());
    let range = record.properties.start as usize..record.properties.end as usize;
    let properties = properties[range]
        .iter()
        .map(|p| {
            let key = SmolStr::new(text_at(batch, p.key));
            (key, owned_value(batch, value_at(batch, p.value_at)))
        })
        .collect();
    ReceivedEvent {
        sequence_number: record.sequence_number,
        offset: record.offset,
        enqueued_time_ms: record.enqueued_time_ms,
        data: EventData {
            body: batch.slice(record.body.range()),
            properties,
            partition_key: text(record.partition_key),
            content_type: text(record.content_type),
            correlation_id: text(record.correlation_id),
            message_id: text(record.message_id),
            protocol_sections: record.protocol_sections.map(|s| batch.slice(s.range())),
        },
    }
}

/// A value read from `batch` as an owned one: a string copied (inline up to 23 bytes), bytes
/// sliced from `batch`.
fn owned_value(batch: &Bytes, value: PropertyValueRef<'_>) -> PropertyValue {
    match value {
        PropertyValueRef::Null => PropertyValue::Null,
        PropertyValueRef::Bool(v) => PropertyValue::Bool(v),
        PropertyValueRef::Int32(v) => PropertyValue::Int32(v),
        PropertyValueRef::Int64(v) => PropertyValue::Int64(v),
        PropertyValueRef::UInt32(v) => PropertyValue::UInt32(v),
        PropertyValueRef::UInt64(v) => PropertyValue::UInt64(v),
        PropertyValueRef::Float32(v) => PropertyValue::Float32(v),
        PropertyValueRef::Float64(v) => PropertyValue::Float64(v),
        PropertyValueRef::String(v) => PropertyValue::String(SmolStr::new(v)),
        PropertyValueRef::Bytes(v) => PropertyValue::Bytes(batch.slice_ref(v)),
        PropertyValueRef::Timestamp(v) => PropertyValue::Timestamp(v),
        PropertyValueRef::Uuid(v) => PropertyValue::Uuid(v),
    }
}

/// Decodes one record, `record` holding exactly its bytes (after its length prefix), with
/// `previous` the properties of the record before where references to them are allowed.
#[cfg(test)]
fn decode_record(
    record: &Bytes,
    previous: Option<&[(SmolStr, PropertyValue)]>,
) -> Result<EventData, DecodeError> {
    // The record before, written out whole, then this record: one buffer to index in.
    let mut bytes = Vec::new();
    if let Some(previous) = previous {
        let mut before = EventData::new("");
        before.properties = previous.to_vec();
        encode_record(&mut bytes, &before, &[]);
    }
    let mut properties = Vec::new();
    let before = previous.map(|_| {
        index_record(&bytes, 4..bytes.len(), None, &mut properties).expect("a record written here");
        0..properties.len()
    });
    let start = bytes.len();
    bytes.extend_from_slice(record);
    let bytes = Bytes::from(bytes);
    let indexed = index_record(&bytes, start..bytes.len(), before, &mut properties)?;
    Ok(owned_event(&bytes, &indexed, &properties).data)
}

/// Decodes a property value, its bytes borrowed from what `r` reads.
fn decode_value<'a>(r: &mut Reader<'a>) -> Result<PropertyValueRef<'a>, DecodeError> {
    let tag = r.u8("property tag")?;
    Ok(match tag {
        TAG_NULL => PropertyValueRef::Null,
        TAG_BOOL => match r.u8("bool property")? {
            0 => PropertyValueRef::Bool(false),
            1 => PropertyValueRef::Bool(true),
            v => {
                return Err(DecodeError::Invalid {
                    field: "bool property",
                    value: u64::from(v),
                });
            }
        },
        TAG_INT32 => PropertyValueRef::Int32(r.u32("int32 property")? as i32),
        TAG_INT64 => PropertyValueRef::Int64(r.i64("int64 property")?),
        TAG_UINT32 => PropertyValueRef::UInt32(r.u32("uint32 property")?),
        TAG_UINT64 => PropertyValueRef::UInt64(r.u64("uint64 property")?),
        TAG_FLOAT32 => PropertyValueRef::Float32(f32::from_bits(r.u32("float32 property")?)),
        TAG_FLOAT64 => PropertyValueRef::Float64(f64::from_bits(r.u64("float64 property")?)),
        TAG_STRING => PropertyValueRef::String(r.text("string property")?),
        TAG_BYTES => {
            let len = r.u32("bytes property")? as usize;
            PropertyValueRef::Bytes(r.take(len, "bytes property")?)
        }
        TAG_TIMESTAMP => PropertyValueRef::Timestamp(r.i64("timestamp property")?),
        TAG_UUID => {
            let mut uuid = [0u8; 16];
            uuid.copy_from_slice(r.take(16, "uuid property")?);
            PropertyValueRef::Uuid(uuid)
        }
        other => {
            return Err(DecodeError::Invalid {
                field: "property tag",
                value: u64::from(other),
            });
        }
    })
}

/// The one strict reader over untrusted bytes: every read checks what is left first.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    pub(crate) fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if n > self.left() {
            return Err(DecodeError::Truncated {
                field,
                needed: n as u64,
                left: self.left() as u64,
            });
        }
        let slice = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(slice)
    }

    fn skip(&mut self, n: usize, field: &'static str) -> Result<(), DecodeError> {
        self.take(n, field).map(|_| ())
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, field)?[0])
    }

    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        let b = self.take(4, field)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let b = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    pub(crate) fn i64(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        self.u64(field).map(|v| v as i64)
    }

    /// A length-prefixed UTF-8 field, borrowed from the buffer.
    fn text(&mut self, field: &'static str) -> Result<&'a str, DecodeError> {
        let len = self.u32(field)? as usize;
        let bytes = self.take(len, field)?;
        std::str::from_utf8(bytes).map_err(|_| DecodeError::NotUtf8 { field })
    }

    /// A length-prefixed field: where its bytes lie in the buffer this reader's bytes start at
    /// `base` of; checked as UTF-8 if it is a `text`.
    fn span(&mut self, base: usize, field: &'static str, text: bool) -> Result<Span, DecodeError> {
        let len = self.u32(field)? as usize;
        let start = base + self.pos;
        let bytes = self.take(len, field)?;
        if text {
            std::str::from_utf8(bytes).map_err(|_| DecodeError::NotUtf8 { field })?;
        }
        Ok(Span::new(start, len))
    }

    pub(crate) fn finish(&self, after: &'static str) -> Result<(), DecodeError> {
        if self.left() != 0 {
            return Err(DecodeError::Trailing {
                after,
                left: self.left() as u64,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tributary_event::strategy::property_value;

    pub(crate) fn arb_event() -> impl Strategy<Value = EventData> {
        (
            proptest::collection::vec(any::<u8>(), 0..300),
            proptest::collection::btree_map("[a-z]{1,8}", property_value(), 0..4),
            proptest::option::of("[a-z0-9]{1,12}"),
            proptest::option::of("[a-z/]{1,12}"),
            proptest::option::of(".{0,8}"),
            proptest::option::of(".{0,8}"),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16)),
        )
            .prop_map(|(body, props, key, ct, corr, mid, sections)| EventData {
                body: body.into(),
                properties: props
                    .into_iter()
                    .map(|(k, v): (String, _)| (k.into(), v))
                    .collect(),
                partition_key: key,
                content_type: ct,
                correlation_id: corr,
                message_id: mid,
                protocol_sections: sections.map(Into::into),
            })
    }

    fn encode(events: &[EventData]) -> (Bytes, Vec<u64>) {
        let mut out = Vec::new();
        let mut offsets = Vec::new();
        encode_batch(
            &mut out,
            1000,
            7,
            1_700_000_000_000,
            events,
            true,
            &mut offsets,
        );
        (Bytes::from(out), offsets)
    }

    proptest! {
        #[test]
        fn batches_round_trip(events in proptest::collection::vec(arb_event(), 1..8)) {
            let (batch, offsets) = encode(&events);
            let at_most: u64 = BATCH_HEADER_BYTES as u64 + events.iter().map(record_len).sum::<u64>();
            let header = BatchHeader::decode(&batch).unwrap();
            if header.property_refs {
                prop_assert!((batch.len() as u64) < at_most);
            } else {
                prop_assert_eq!(batch.len() as u64, at_most);
            }
            verify_checksum(&batch, &header).unwrap();
            let mut out = Vec::new();
            decode_batch(&batch, &header, 0, usize::MAX, &mut out).unwrap();
            prop_assert_eq!(out.len(), events.len());
            let mut read = crate::RecordsRead::new();
            read.take_batch(&batch, &header, 0, usize::MAX).unwrap();
            views_read_as(&read, &out)?;
            prop_assert_eq!(record_offsets(&batch, &header).unwrap(), offsets.clone());
            for (i, (got, want)) in out.iter().zip(&events).enumerate() {
                prop_assert_eq!(&got.data, want);
                prop_assert_eq!(got.sequence_number, 7 + i as i64);
                prop_assert_eq!(got.offset, offsets[i]);
            }
        }

        /// Flipping any byte after the header's CRC field is caught by the checksum; no input
        /// makes decoding panic.
        #[test]
        fn corruption_is_detected(events in proptest::collection::vec(arb_event(), 1..4), at in any::<prop::sample::Index>(), xor in 1u8..) {
            let (batch, _) = encode(&events);
            let mut bytes = batch.to_vec();
            let i = CRC_COVERS_FROM + at.index(bytes.len() - CRC_COVERS_FROM);
            bytes[i] ^= xor;
            let bytes = Bytes::from(bytes);
            if let Ok(header) = BatchHeader::decode(&bytes)
                && header.batch_len as usize == bytes.len()
            {
                prop_assert!(verify_checksum(&bytes, &header).is_err());
            }
        }

        /// Events that repeat the properties of the event before them (as replicated events
        /// do) decode to exactly what was appended, whichever record a read starts at.
        #[test]
        fn repeated_properties_round_trip_from_every_record(
            base in proptest::collection::vec(property_value(), 0..6),
            events in proptest::collection::vec(
                (
                    proptest::collection::vec(any::<u8>(), 0..40),
                    proptest::collection::vec((0u8..4, property_value()), 6),
                ),
                1..8,
            ),
        ) {
            // Each of the base properties is, per event: the same key and value (0), the same
            // key with another value (1), another key (2), or left out (3).
            let events: Vec<EventData> = events
                .into_iter()
                .map(|(body, choices)| {
                    let mut event = EventData::new(body);
                    for (j, (value, (choice, other))) in base.iter().zip(choices).enumerate() {
                        match choice {
                            0 => event.properties.push((format!("k{j}").into(), value.clone())),
                            1 => event.properties.push((format!("k{j}").into(), other)),
                            2 => event.properties.push((format!("x{j}").into(), other)),
                            _ => {}
                        }
                    }
                    event
                })
                .collect();
            let (batch, offsets) = encode(&events);
            let header = BatchHeader::decode(&batch).unwrap();
            verify_checksum(&batch, &header).unwrap();
            prop_assert_eq!(record_offsets(&batch, &header).unwrap(), offsets);
            for from in 0..events.len() {
                let mut out = Vec::new();
                decode_batch(&batch, &header, 7 + from as i64, usize::MAX, &mut out).unwrap();
                let got: Vec<&EventData> = out.iter().map(|e| &e.data).collect();
                let want: Vec<&EventData> = events[from..].iter().collect();
                prop_assert_eq!(got, want);
                // Read in place, the records read as the same events, field by field.
                let mut read = crate::RecordsRead::new();
                read.take_batch(&batch, &header, 7 + from as i64, usize::MAX).unwrap();
                views_read_as(&read, &out)?;
                // At most `max_events`, counted over the whole read.
                read.take_batch(&batch, &header, 7 + from as i64, out.len() + 1).unwrap();
                prop_assert_eq!(read.len(), out.len() + 1);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let bytes = Bytes::from(bytes);
            let _ = BatchHeader::decode(&bytes);
            let _ = decode_record(&bytes, None);
            let previous = [(SmolStr::new("k"), PropertyValue::Int32(1))];
            let _ = decode_record(&bytes, Some(&previous));
        }
    }

    /// Checks that the records of `read` read, field by field, as `events`.
    fn views_read_as(
        read: &crate::RecordsRead,
        events: &[ReceivedEvent],
    ) -> Result<(), TestCaseError> {
        prop_assert_eq!(read.len(), events.len());
        for (view, event) in read.iter().zip(events) {
            prop_assert_eq!(&view.to_event(), event);
            prop_assert_eq!(view.sequence_number(), event.sequence_number);
            prop_assert_eq!(view.offset(), event.offset);
            prop_assert_eq!(view.enqueued_time_ms(), event.enqueued_time_ms);
            let data = &event.data;
            prop_assert_eq!(view.body(), &data.body[..]);
            prop_assert_eq!(view.partition_key(), data.partition_key.as_deref());
            prop_assert_eq!(view.content_type(), data.content_type.as_deref());
            prop_assert_eq!(view.correlation_id(), data.correlation_id.as_deref());
            prop_assert_eq!(view.message_id(), data.message_id.as_deref());
            prop_assert_eq!(view.protocol_sections(), data.protocol_sections.as_deref());
            let got: Vec<_> = view.properties().collect();
            let want: Vec<_> = data
                .properties
                .iter()
                .map(|(key, value)| (key.as_str(), PropertyValueRef::from(value)))
                .collect();
            prop_assert_eq!(got, want);
        }
        Ok(())
    }

    /// What a replication task's stamps cost in the log: the same six properties on every event,
    /// four of them with the same value.
    fn stamped(i: u64) -> EventData {
        let origin = "5f0c7a52-2b7e-4b7c-9d43-6f1b3c2a9e10";
        let path = format!("{origin};0e1d2c3b-4a59-4687-9a8b-7c6d5e4f3a21");
        EventData::new(vec![b'x'; 100])
            .with_property(
                "repl-enqueued-time",
                PropertyValue::String(format!("2026-11-28T03:0{}:00.000Z", i % 10).into()),
            )
            .with_property(
                "repl-offset",
                PropertyValue::String((i * 113).to_string().into()),
            )
            .with_property("repl-sequence", PropertyValue::String(i.to_string().into()))
            .with_property("repl-partition", PropertyValue::String("0".into()))
            .with_property("repl-origin", PropertyValue::String(origin.into()))
            .with_property("repl-path", PropertyValue::String(path.into()))
    }

    #[test]
    fn repeated_properties_are_written_once_per_batch() {
        let events: Vec<EventData> = (1_000_000..1_000_100).map(stamped).collect();
        let alone: u64 = events.iter().map(record_len).sum();
        let (batch, _) = encode(&events);
        let header = BatchHeader::decode(&batch).unwrap();
        assert!(header.property_refs);
        let written = (batch.len() - BATCH_HEADER_BYTES) as u64;
        // 393 bytes a record on its own; 192 after the first.
        assert!(
            written * 2 < alone,
            "{written} bytes against {alone} written alone"
        );
        let mut out = Vec::new();
        decode_batch(&batch, &header, 0, usize::MAX, &mut out).unwrap();
        let got: Vec<EventData> = out.into_iter().map(|e| e.data).collect();
        assert_eq!(got, events);
        // A batch of events that share nothing is written as before, without the flag.
        let (batch, _) = encode(&[EventData::new("a"), EventData::new("b")]);
        assert!(!BatchHeader::decode(&batch).unwrap().property_refs);
    }

    #[test]
    fn a_reference_keeps_a_float_s_sign_and_its_bits() {
        let events = [
            EventData::new("a").with_property("t", PropertyValue::Float64(0.0)),
            EventData::new("b").with_property("t", PropertyValue::Float64(-0.0)),
            EventData::new("c").with_property("t", PropertyValue::Float64(-0.0)),
        ];
        let (batch, _) = encode(&events);
        let header = BatchHeader::decode(&batch).unwrap();
        let mut out = Vec::new();
        decode_batch(&batch, &header, 0, usize::MAX, &mut out).unwrap();
        let bits: Vec<u64> = out
            .iter()
            .map(|e| match e.data.properties[0].1 {
                PropertyValue::Float64(v) => v.to_bits(),
                ref other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            bits,
            [0.0f64.to_bits(), (-0.0f64).to_bits(), (-0.0f64).to_bits()]
        );
    }

    #[test]
    fn a_reference_with_nothing_to_refer_to_is_refused() {
        // A record naming property 0 of the record before: invalid without the batch's flag,
        // and in a batch's first record, and where the record before has no property 0.
        let mut record = vec![0u8]; // no optional fields
        record.extend_from_slice(&1u32.to_le_bytes()); // one property
        record.extend_from_slice(&SAME_PROPERTY.to_le_bytes());
        record.extend_from_slice(&0u32.to_le_bytes()); // empty body
        let record = Bytes::from(record);
        let refused = Err(DecodeError::Invalid {
            field: "property reference (no such property in the record before)",
            value: u64::from(SAME_PROPERTY),
        });
        assert_eq!(decode_record(&record, None), refused);
        assert_eq!(decode_record(&record, Some(&[])), refused);
        let previous = [(SmolStr::new("k"), PropertyValue::Bool(true))];
        let decoded = decode_record(&record, Some(&previous)).unwrap();
        assert_eq!(decoded.properties, previous);
    }

    #[test]
    fn short_property_strings_decode_inline_and_long_ones_shared() {
        let long = "l".repeat(40);
        let event = EventData::new("x")
            .with_property("repl-enqueued-time", PropertyValue::String("short".into()))
            .with_property(long.as_str(), PropertyValue::String(long.as_str().into()));
        let (batch, _) = encode(std::slice::from_ref(&event));
        let header = BatchHeader::decode(&batch).unwrap();
        let mut out = Vec::new();
        decode_batch(&batch, &header, 0, usize::MAX, &mut out).unwrap();
        let properties = &out[0].data.properties;
        assert_eq!(properties, &event.properties);
        assert!(!properties[0].0.is_heap_allocated(), "a 18-byte key");
        let PropertyValue::String(short) = &properties[0].1 else {
            panic!("a string value");
        };
        assert!(!short.is_heap_allocated(), "a 5-byte value");
        assert!(properties[1].0.is_heap_allocated(), "a 40-byte key");
        let copy = out[0].data.clone();
        assert_eq!(
            copy.properties[1].0.as_ptr(),
            properties[1].0.as_ptr(),
            "a clone shares a long string"
        );
    }

    #[test]
    fn decode_skips_and_limits() {
        let events: Vec<_> = (0..5).map(|i| EventData::new(format!("e{i}"))).collect();
        let (batch, _) = encode(&events);
        let header = BatchHeader::decode(&batch).unwrap();
        let mut out = Vec::new();
        decode_batch(&batch, &header, 9, 2, &mut out).unwrap();
        let seqs: Vec<_> = out.iter().map(|e| e.sequence_number).collect();
        assert_eq!(seqs, vec![9, 10]);
    }

    /// Found by the `log_batch` fuzz target: a count far beyond what the batch holds, under a
    /// valid CRC, once sized an allocation of 32 GiB.
    #[test]
    fn a_record_count_the_batch_cannot_hold_is_refused_before_allocating() {
        let (batch, _) = encode(&[EventData::new("e")]);
        let mut bytes = batch.to_vec();
        bytes[RECORD_COUNT_AT..ENQUEUED_TIME_AT].copy_from_slice(&u32::MAX.to_le_bytes());
        let crc = crate::checksum::crc32c(&bytes[CRC_COVERS_FROM..]);
        bytes[CRC_AT..CRC_COVERS_FROM].copy_from_slice(&crc.to_le_bytes());
        let header = BatchHeader::decode(&bytes).unwrap();
        verify_checksum(&bytes, &header).unwrap();
        assert_eq!(
            record_offsets(&bytes, &header),
            Err(DecodeError::Invalid {
                field: "batch record count",
                value: u64::from(u32::MAX)
            })
        );
    }

    /// Found by the `log_batch` fuzz target: a batch offset near `u64::MAX` overflowed the
    /// record offsets computed from it (a panic in debug builds, wrapped offsets in release).
    #[test]
    fn a_batch_whose_offsets_or_sequence_numbers_would_wrap_is_refused() {
        let (batch, _) = encode(&[EventData::new("e")]);
        let mut bytes = batch.to_vec();
        bytes[BATCH_OFFSET_AT..BASE_SEQUENCE_AT].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
        assert_eq!(
            BatchHeader::decode(&bytes),
            Err(DecodeError::Invalid {
                field: "batch offset",
                value: u64::MAX - 8
            })
        );
        let mut bytes = batch.to_vec();
        bytes[BASE_SEQUENCE_AT..RECORD_COUNT_AT].copy_from_slice(&i64::MAX.to_le_bytes());
        assert_eq!(
            BatchHeader::decode(&bytes),
            Err(DecodeError::Invalid {
                field: "batch base sequence",
                value: i64::MAX as u64
            })
        );
    }

    #[test]
    fn unknown_record_flags_are_refused() {
        let record = Bytes::from_static(&[0x80, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            decode_record(&record, None),
            Err(DecodeError::Invalid {
                field: "record flags",
                value: 0x80
            })
        );
    }
}
