//! Azure's capture records: the schema, one event as one record, a window's file written
//! ([`AvroFileWriter`]) and read back ([`summarize`]).
//!
//! Every file has Azure's record schema, `EventData` in namespace
//! `Microsoft.ServiceBus.Messaging`: `SequenceNumber` (long), `Offset` (string, the decimal
//! offset), `EnqueuedTimeUtc` (string, `M/d/yyyy h:mm:ss tt`), `SystemProperties` (map of
//! long/double/string/bytes), `Properties` (map of long/double/string/bytes/null) and `Body`
//! (null or bytes; always bytes here). The codec is `null` (Avro) or `deflate` (AvroDeflate).
//!
//! `SystemProperties` holds `x-opt-enqueued-time` (long, ms), and when the event has them
//! `x-opt-partition-key`, `message-id`, `correlation-id` and `content-type` (strings).
//! Application properties map by type: integers and timestamps (ms) to long (a `u64` beyond
//! `i64` to its decimal string), floats to double, strings to string, bytes to bytes, null to
//! null, booleans to the strings `True`/`False` and UUIDs to their hyphenated string.

use std::borrow::Cow;
use std::io::{IoSlice, Read, Write};
use std::ops::Range;
use std::sync::LazyLock;

use apache_avro::types::Value;
use apache_avro::{Codec, DeflateSettings, Schema};
use tributary_broker::{RecordView, RecordsRead};
use tributary_event::{PropertyValueRef, uuid_text};

use crate::config::CaptureFormat;
use crate::limits::AVRO_BLOCK_BYTES;
use crate::time_text::enqueued_time_utc;

/// Azure's capture schema, as `avro-tools getschema` prints it for a file Azure wrote.
pub const CAPTURE_SCHEMA_JSON: &str = r#"{"type":"record","name":"EventData","namespace":"Microsoft.ServiceBus.Messaging","fields":[{"name":"SequenceNumber","type":"long"},{"name":"Offset","type":"string"},{"name":"EnqueuedTimeUtc","type":"string"},{"name":"SystemProperties","type":{"type":"map","values":["long","double","string","bytes"]}},{"name":"Properties","type":{"type":"map","values":["long","double","string","bytes","null"]}},{"name":"Body","type":["null","bytes"]}]}"#;

static SCHEMA: LazyLock<Schema> =
    LazyLock::new(|| Schema::parse_str(CAPTURE_SCHEMA_JSON).expect("Azure's schema parses"));

/// The parsed capture schema.
pub fn capture_schema() -> &'static Schema {
    &SCHEMA
}

/// The union branch indexes of `SystemProperties`' and `Properties`' values.
const LONG: i64 = 0;
const DOUBLE: i64 = 1;
const STRING: i64 = 2;
const BYTES: i64 = 3;
const NULL: i64 = 4;

/// Bytes a record costs beyond its body and properties (its fixed fields, roughly): what the
/// size window counts for each event besides its data.
const RECORD_OVERHEAD_BYTES: u64 = 64;

/// About how many bytes `record` takes as a record before compression; what the size window
/// adds up. It counts the body, each property's key and value, and a fixed overhead.
pub fn record_bytes(record: &RecordView<'_>) -> u64 {
    let properties: usize = record
        .properties()
        .map(|(key, value)| key.len() + value_bytes(value))
        .sum();
    let system = [
        record.partition_key(),
        record.message_id(),
        record.correlation_id(),
        record.content_type(),
    ]
    .into_iter()
    .map(|text| text.map_or(0, str::len))
    .sum::<usize>();
    RECORD_OVERHEAD_BYTES + (record.body().len() + properties + system) as u64
}

fn value_bytes(value: PropertyValueRef<'_>) -> usize {
    match value {
        PropertyValueRef::String(text) => text.len() + 2,
        PropertyValueRef::Bytes(bytes) => bytes.len() + 2,
        _ => 9,
    }
}

/// One value of a `SystemProperties` or `Properties` map, by the branch of Azure's union it
/// takes: what the Avro and Parquet writers both encode. Borrowed from the event where it can
/// be, so mapping an event allocates only for the values that need new text (a `u64` beyond
/// `i64`, a UUID).
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue<'a> {
    /// `long`.
    Long(i64),
    /// `double`.
    Double(f64),
    /// `string`.
    String(Cow<'a, str>),
    /// `bytes`.
    Bytes(&'a [u8]),
    /// `null` (application properties only).
    Null,
}

/// `record`'s `SystemProperties`: `x-opt-enqueued-time` and the texts the event has, in that
/// order.
pub fn system_properties<'a>(
    record: &RecordView<'a>,
) -> impl Iterator<Item = (&'static str, FieldValue<'a>)> + Clone + use<'a> {
    let texts = [
        ("x-opt-partition-key", record.partition_key()),
        ("message-id", record.message_id()),
        ("correlation-id", record.correlation_id()),
        ("content-type", record.content_type()),
    ];
    std::iter::once((
        "x-opt-enqueued-time",
        FieldValue::Long(record.enqueued_time_ms()),
    ))
    .chain(texts.into_iter().filter_map(|(key, value)| {
        value.map(|value| (key, FieldValue::String(Cow::Borrowed(value))))
    }))
}

/// `record`'s application `Properties`, each mapped by type (see the module docs).
pub fn properties<'a>(
    record: &RecordView<'a>,
) -> impl ExactSizeIterator<Item = (&'a str, FieldValue<'a>)> + use<'a> {
    record
        .properties()
        .map(|(key, value)| (key, field_value(value)))
}

/// One application property as a branch of `["long","double","string","bytes","null"]`.
fn field_value(value: PropertyValueRef<'_>) -> FieldValue<'_> {
    match value {
        PropertyValueRef::Null => FieldValue::Null,
        PropertyValueRef::Bool(b) => {
            FieldValue::String(Cow::Borrowed(if b { "True" } else { "False" }))
        }
        PropertyValueRef::Int32(v) => FieldValue::Long(i64::from(v)),
        PropertyValueRef::Int64(v) | PropertyValueRef::Timestamp(v) => FieldValue::Long(v),
        PropertyValueRef::UInt32(v) => FieldValue::Long(i64::from(v)),
        PropertyValueRef::UInt64(v) => match i64::try_from(v) {
            Ok(v) => FieldValue::Long(v),
            Err(_) => FieldValue::String(Cow::Owned(v.to_string())),
        },
        PropertyValueRef::Float32(v) => FieldValue::Double(f64::from(v)),
        PropertyValueRef::Float64(v) => FieldValue::Double(v),
        PropertyValueRef::String(s) => FieldValue::String(Cow::Borrowed(s)),
        PropertyValueRef::Bytes(b) => FieldValue::Bytes(b),
        PropertyValueRef::Uuid(u) => FieldValue::String(Cow::Owned(uuid_text(&u))),
    }
}

/// The Avro codec of a capture format (`null` for the formats that are not Avro).
pub fn codec(format: CaptureFormat) -> Codec {
    match format {
        CaptureFormat::Avro | CaptureFormat::Parquet => Codec::Null,
        CaptureFormat::AvroDeflate => Codec::Deflate(DeflateSettings::default()),
    }
}

/// A file's header up to its sync marker (magic, then the metadata map: `avro.schema`,
/// `avro.codec`), as apache-avro writes it. It is the same for every file of a codec, so it is
/// made once per codec rather than once per window file.
fn header_before_marker(format: CaptureFormat) -> Result<&'static [u8], String> {
    static NULL: LazyLock<Result<Vec<u8>, String>> =
        LazyLock::new(|| header_of(CaptureFormat::Avro));
    static DEFLATE: LazyLock<Result<Vec<u8>, String>> =
        LazyLock::new(|| header_of(CaptureFormat::AvroDeflate));
    let header = match codec(format) {
        Codec::Null => &*NULL,
        _ => &*DEFLATE,
    };
    header.as_deref().map_err(Clone::clone)
}

fn header_of(format: CaptureFormat) -> Result<Vec<u8>, String> {
    let mut writer = apache_avro::Writer::with_codec(capture_schema(), Vec::new(), codec(format));
    writer.flush().map_err(|e| e.to_string())?;
    let mut header = writer.into_inner().map_err(|e| e.to_string())?;
    // What apache-avro ends the header with is its own sync marker; each file draws its own.
    let Some(without_marker) = header.len().checked_sub(16) else {
        return Err("apache-avro wrote a header shorter than a sync marker".into());
    };
    header.truncate(without_marker);
    Ok(header)
}

/// A capture Avro object container file being written to `W`.
///
/// The header (magic, `avro.schema`, `avro.codec`) is apache-avro's, with a sync marker of the
/// file's own. The records are encoded here: the schema is fixed, and apache-avro's generic
/// path (an owned `Value` tree per event, a `HashMap` per map, the schema walked per value) cost
/// about 1.3 µs per 1 KiB event, most of the capture's CPU (BENCHMARKS.md, "Capture's CPU and
/// lag"). A block holds about [`AVRO_BLOCK_BYTES`] of records.
///
/// [`AvroFileWriter::append`] encodes a record into the open block, which is written whole
/// (compressed first with `deflate`). [`AvroFileWriter::append_all`] without a codec writes
/// each body from the read's buffer straight to the sink: it encodes the block's record heads
/// (every field before the body's bytes) first, so the block's length is known before its first
/// byte goes out, and each body is copied once, into the sink, not twice.
pub struct AvroFileWriter<W: Write> {
    sink: W,
    codec: Codec,
    marker: [u8; 16],
    /// The open block's records, encoded (uncompressed).
    block: Vec<u8>,
    block_records: i64,
    /// Block header bytes (record count, byte length), kept to reuse their memory.
    block_header: Vec<u8>,
    /// The record heads of a block [`AvroFileWriter::append_all`] writes, and where each ends.
    heads: Vec<u8>,
    head_ends: Vec<usize>,
    enqueued_time: EnqueuedTimeText,
}

impl<W: Write> std::fmt::Debug for AvroFileWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AvroFileWriter")
            .field("codec", &self.codec)
            .field("block_records", &self.block_records)
            .finish_non_exhaustive()
    }
}

impl<W: Write> AvroFileWriter<W> {
    /// Writes the header of a file in `format` to `sink` at once (so an empty window is a
    /// valid file with no records): the header of the format's codec (made once) and a sync
    /// marker of the file's own, drawn from the system's random source.
    pub fn new(mut sink: W, format: CaptureFormat) -> Result<AvroFileWriter<W>, String> {
        let mut marker = [0_u8; 16];
        rustix::rand::getrandom(&mut marker, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| format!("no random sync marker: {e}"))?;
        sink.write_all(header_before_marker(format)?)
            .and_then(|()| sink.write_all(&marker))
            .map_err(|e| e.to_string())?;
        Ok(AvroFileWriter {
            sink,
            codec: codec(format),
            marker,
            // Reserved on the first record appended one by one: an uncompressed file's
            // records go from their events straight to the sink and never use it.
            block: Vec::new(),
            block_records: 0,
            block_header: Vec::with_capacity(20),
            heads: Vec::new(),
            head_ends: Vec::new(),
            enqueued_time: EnqueuedTimeText::default(),
        })
    }

    /// Appends `record` as one record; writes the block once it holds [`AVRO_BLOCK_BYTES`].
    pub fn append(&mut self, record: &RecordView<'_>) -> Result<(), String> {
        if self.block.capacity() == 0 {
            self.block.reserve(AVRO_BLOCK_BYTES + AVRO_BLOCK_BYTES / 8);
        }
        encode_record(&mut self.block, record, &mut self.enqueued_time);
        self.block_records += 1;
        if self.block.len() >= AVRO_BLOCK_BYTES {
            self.write_block()?;
        }
        Ok(())
    }

    /// Appends the records at `range` of `records`, in order. Without a codec each body goes
    /// from the read's buffer straight to the sink, in blocks of their own; with `deflate` this
    /// is [`AvroFileWriter::append`] for each.
    pub fn append_all(&mut self, records: &RecordsRead, range: Range<usize>) -> Result<(), String> {
        if !matches!(self.codec, Codec::Null) {
            return records
                .range(range)
                .try_for_each(|record| self.append(&record));
        }
        // Records appended one by one before go first, in their own block.
        self.write_block()?;
        let mut next = range.start;
        while next < range.end {
            next += self.write_direct_block(records, next..range.end)?;
        }
        Ok(())
    }

    /// Writes the first records at `range` of `records`, about [`AVRO_BLOCK_BYTES`] of them (at
    /// least one), as one uncompressed block from their encoded heads and their bodies. Returns
    /// how many.
    fn write_direct_block(
        &mut self,
        records: &RecordsRead,
        range: Range<usize>,
    ) -> Result<usize, String> {
        self.heads.clear();
        self.head_ends.clear();
        let mut body_bytes = 0;
        for record in records.range(range.clone()) {
            encode_head(&mut self.heads, &record, &mut self.enqueued_time);
            self.head_ends.push(self.heads.len());
            body_bytes += record.body().len();
            if self.heads.len() + body_bytes >= AVRO_BLOCK_BYTES {
                break;
            }
        }
        let count = self.head_ends.len();
        self.block_header.clear();
        put_long(&mut self.block_header, count as i64);
        put_long(
            &mut self.block_header,
            (self.heads.len() + body_bytes) as i64,
        );
        // The block as one list of slices, handed to the sink at once: a call through the
        // sink's `dyn` per block rather than two per record.
        let taken = records.range(range.start..range.start + count);
        let mut slices = Vec::with_capacity(2 * count + 2);
        slices.push(IoSlice::new(&self.block_header));
        let mut head_start = 0;
        for (record, &head_end) in taken.zip(&self.head_ends) {
            slices.push(IoSlice::new(&self.heads[head_start..head_end]));
            slices.push(IoSlice::new(record.body()));
            head_start = head_end;
        }
        slices.push(IoSlice::new(&self.marker));
        let written = write_all_slices(&mut self.sink, &mut slices);
        written.map_err(|e| e.to_string())?;
        Ok(count)
    }

    /// Writes the open block, if it holds records, and hands back the sink.
    pub fn finish(mut self) -> Result<W, String> {
        self.write_block()?;
        self.sink.flush().map_err(|e| e.to_string())?;
        Ok(self.sink)
    }

    fn write_block(&mut self) -> Result<(), String> {
        if self.block_records == 0 {
            return Ok(());
        }
        let mut data = std::mem::take(&mut self.block);
        // `null` leaves the bytes as they are; `deflate` replaces them with raw deflate.
        self.codec.compress(&mut data).map_err(|e| e.to_string())?;
        self.block_header.clear();
        put_long(&mut self.block_header, self.block_records);
        put_long(&mut self.block_header, data.len() as i64);
        let written = self
            .sink
            .write_all(&self.block_header)
            .and_then(|()| self.sink.write_all(&data))
            .and_then(|()| self.sink.write_all(&self.marker));
        data.clear();
        data.reserve(AVRO_BLOCK_BYTES + AVRO_BLOCK_BYTES / 8);
        self.block = data;
        self.block_records = 0;
        written.map_err(|e| e.to_string())
    }
}

/// Writes every byte of `slices`, in order: `Write::write_all_vectored`, which is not stable
/// yet. A sink that does not write vectored takes one slice a call.
fn write_all_slices<W: Write>(sink: &mut W, mut slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    while !slices.is_empty() {
        match sink.write_vectored(slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(written) => IoSlice::advance_slices(&mut slices, written),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Encodes `record` as one `EventData` record (Avro binary encoding, fields in schema order).
fn encode_record(out: &mut Vec<u8>, record: &RecordView<'_>, time: &mut EnqueuedTimeText) {
    encode_head(out, record, time);
    out.extend_from_slice(record.body());
}

/// Encodes `record` up to its body's bytes: every field, then the body's union branch and
/// length.
fn encode_head(out: &mut Vec<u8>, record: &RecordView<'_>, time: &mut EnqueuedTimeText) {
    put_long(out, record.sequence_number());
    put_decimal(out, record.offset());
    put_bytes(out, time.text(record.enqueued_time_ms()).as_bytes());
    // A map is written as one block of its entries and the empty block that ends it (none
    // before the end for an empty map), as apache-avro and Azure write them.
    // The texts are read once, when the iterator is made; its clone only counts them.
    let system = system_properties(record);
    put_map(out, system.clone().count(), system);
    let data = properties(record);
    put_map(out, data.len(), data);
    // `Body`: branch 1 of `["null","bytes"]`.
    put_long(out, 1);
    put_long(out, record.body().len() as i64);
}

fn put_map<'k, 'v>(
    out: &mut Vec<u8>,
    count: usize,
    entries: impl Iterator<Item = (&'k str, FieldValue<'v>)>,
) {
    if count > 0 {
        put_long(out, count as i64);
        for (key, value) in entries {
            put_bytes(out, key.as_bytes());
            put_field_value(out, &value);
        }
    }
    put_long(out, 0);
}

/// A map value as its branch of `["long","double","string","bytes","null"]` and its value.
fn put_field_value(out: &mut Vec<u8>, value: &FieldValue<'_>) {
    match value {
        FieldValue::Long(v) => {
            put_long(out, LONG);
            put_long(out, *v);
        }
        FieldValue::Double(v) => {
            put_long(out, DOUBLE);
            out.extend_from_slice(&v.to_le_bytes());
        }
        FieldValue::String(v) => {
            put_long(out, STRING);
            put_bytes(out, v.as_bytes());
        }
        FieldValue::Bytes(v) => {
            put_long(out, BYTES);
            put_bytes(out, v);
        }
        FieldValue::Null => put_long(out, NULL),
    }
}

/// An Avro `long`: zig-zag, then variable length, 7 bits a byte, low bits first.
fn put_long(out: &mut Vec<u8>, value: i64) {
    let mut zigzag = ((value << 1) ^ (value >> 63)) as u64;
    while zigzag >= 0x80 {
        out.push((zigzag as u8) | 0x80);
        zigzag >>= 7;
    }
    out.push(zigzag as u8);
}

/// Avro `bytes` or `string`: the length as a `long`, then the bytes.
fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_long(out, bytes.len() as i64);
    out.extend_from_slice(bytes);
}

/// `value` in decimal as an Avro `string`.
fn put_decimal(out: &mut Vec<u8>, value: u64) {
    put_bytes(out, itoa::Buffer::new().format(value).as_bytes());
}

/// `EnqueuedTimeUtc`'s text of the last second asked for: the events of one second share it,
/// so it is formatted once a second, not once an event.
#[derive(Debug, Default)]
struct EnqueuedTimeText {
    second: Option<i64>,
    text: String,
}

impl EnqueuedTimeText {
    fn text(&mut self, ms: i64) -> &str {
        let second = ms.div_euclid(1000);
        if self.second != Some(second) {
            self.text = enqueued_time_utc(ms);
            self.second = Some(second);
        }
        &self.text
    }
}

/// What a capture file holds, as read back: its record count and first and last sequence
/// numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSummary {
    /// How many records.
    pub event_count: u64,
    /// The first record's sequence number, if any.
    pub first_sequence: Option<i64>,
    /// The last record's sequence number, if any.
    pub last_sequence: Option<i64>,
}

/// Reads a capture file whole and summarises it; an error says what is not a capture file.
pub fn summarize<R: Read>(source: R) -> Result<FileSummary, String> {
    let reader = apache_avro::Reader::new(source).map_err(|e| e.to_string())?;
    let mut summary = FileSummary {
        event_count: 0,
        first_sequence: None,
        last_sequence: None,
    };
    for record in reader {
        let record = record.map_err(|e| e.to_string())?;
        let sequence = sequence_number(&record)?;
        if summary
            .last_sequence
            .is_some_and(|last| sequence != last + 1)
        {
            return Err(format!(
                "sequence number {sequence} follows {}: not one window of one partition",
                summary.last_sequence.unwrap_or_default()
            ));
        }
        summary.first_sequence.get_or_insert(sequence);
        summary.last_sequence = Some(sequence);
        summary.event_count += 1;
    }
    Ok(summary)
}

fn sequence_number(record: &Value) -> Result<i64, String> {
    let Value::Record(fields) = record else {
        return Err("a value is not a record".to_owned());
    };
    match fields.iter().find(|(name, _)| name == "SequenceNumber") {
        Some((_, Value::Long(sequence))) => Ok(*sequence),
        _ => Err("a record has no long SequenceNumber".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;
    use tributary_event::strategy::property_value;
    use tributary_event::{EventData, ReceivedEvent};

    use super::*;

    /// `event` as one record through apache-avro's generic path: the reference the hand
    /// encoder is checked against.
    fn generic_record(record: &RecordView<'_>) -> Value {
        let map = |entries: Vec<(&str, FieldValue<'_>)>| {
            Value::Map(
                entries
                    .into_iter()
                    .map(|(key, value)| (key.to_owned(), generic_value(value)))
                    .collect::<HashMap<_, _>>(),
            )
        };
        Value::Record(vec![
            (
                "SequenceNumber".into(),
                Value::Long(record.sequence_number()),
            ),
            ("Offset".into(), Value::String(record.offset().to_string())),
            (
                "EnqueuedTimeUtc".into(),
                Value::String(enqueued_time_utc(record.enqueued_time_ms())),
            ),
            (
                "SystemProperties".into(),
                map(system_properties(record).collect()),
            ),
            ("Properties".into(), map(properties(record).collect())),
            (
                "Body".into(),
                Value::Union(1, Box::new(Value::Bytes(record.body().to_vec()))),
            ),
        ])
    }

    fn generic_value(value: FieldValue<'_>) -> Value {
        let (branch, value) = match value {
            FieldValue::Long(v) => (LONG, Value::Long(v)),
            FieldValue::Double(v) => (DOUBLE, Value::Double(v)),
            FieldValue::String(v) => (STRING, Value::String(v.into_owned())),
            FieldValue::Bytes(v) => (BYTES, Value::Bytes(v.to_vec())),
            FieldValue::Null => (NULL, Value::Null),
        };
        Value::Union(branch as u32, Box::new(value))
    }

    /// The records of `events` written by apache-avro's generic writer.
    fn generic_file(events: &[ReceivedEvent], format: CaptureFormat) -> Vec<u8> {
        let mut writer =
            apache_avro::Writer::with_codec(capture_schema(), Vec::new(), codec(format));
        for record in RecordsRead::from_events(events).iter() {
            writer.append_value_ref(&generic_record(&record)).unwrap();
        }
        writer.into_inner().unwrap()
    }

    /// The records of `events` written by the hand encoder: the first `one_by_one` with
    /// `append`, the rest with `append_all`.
    fn hand_file(events: &[ReceivedEvent], format: CaptureFormat, one_by_one: usize) -> Vec<u8> {
        let mut writer = AvroFileWriter::new(Vec::new(), format).unwrap();
        let records = RecordsRead::from_events(events);
        let one_by_one = one_by_one.min(events.len());
        for record in records.range(0..one_by_one) {
            writer.append(&record).unwrap();
        }
        writer
            .append_all(&records, one_by_one..events.len())
            .unwrap();
        writer.finish().unwrap()
    }

    fn decoded(file: &[u8]) -> Vec<Value> {
        apache_avro::Reader::new(file)
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    fn event() -> impl Strategy<Value = ReceivedEvent> {
        let text = || proptest::option::of(".{0,30}");
        (
            (0..i64::MAX, any::<u64>(), any::<i64>()),
            (text(), text(), text(), text()),
            proptest::collection::btree_map("[a-z-]{1,12}", property_value(), 0..5),
            proptest::collection::vec(any::<u8>(), 0..2000),
        )
            .prop_map(
                |((sequence_number, offset, enqueued_time_ms), texts, properties, body)| {
                    let mut data = EventData::new(body);
                    (
                        data.partition_key,
                        data.message_id,
                        data.correlation_id,
                        data.content_type,
                    ) = texts;
                    data.properties = properties.into_iter().map(|(k, v)| (k.into(), v)).collect();
                    ReceivedEvent {
                        data,
                        sequence_number,
                        offset,
                        enqueued_time_ms,
                    }
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn the_hand_encoder_decodes_to_the_generic_paths_records(
            events in proptest::collection::vec(event(), 0..12),
            deflate in any::<bool>(),
            one_by_one in 0..13_usize,
        ) {
            let format = if deflate { CaptureFormat::AvroDeflate } else { CaptureFormat::Avro };
            let expected: Vec<Value> = RecordsRead::from_events(&events)
                .iter()
                .map(|record| generic_record(&record))
                .collect();
            prop_assert_eq!(&decoded(&generic_file(&events, format)), &expected);
            prop_assert_eq!(&decoded(&hand_file(&events, format, one_by_one)), &expected);
        }
    }

    #[test]
    fn a_file_of_several_blocks_reads_back_whole_in_both_codecs() {
        // 2.5 blocks of 1 KiB bodies, enqueued across seconds.
        let count = AVRO_BLOCK_BYTES * 5 / 2 / 1024;
        let events: Vec<ReceivedEvent> = (0..count as i64)
            .map(|n| ReceivedEvent {
                data: EventData::new(vec![(n % 251) as u8; 1024]),
                sequence_number: n,
                offset: n as u64 * 1100,
                enqueued_time_ms: 1_700_000_000_000 + n * 7,
            })
            .collect();
        let formats = [CaptureFormat::Avro, CaptureFormat::AvroDeflate];
        // One by one, all at once, and half and half.
        for (format, one_by_one) in formats
            .into_iter()
            .flat_map(|f| [count, 0, count / 2].map(|n| (f, n)))
        {
            let file = hand_file(&events, format, one_by_one);
            let summary = summarize(&file[..]).unwrap();
            assert_eq!(summary.event_count, count as u64, "{format:?}");
            assert_eq!(summary.last_sequence, Some(count as i64 - 1), "{format:?}");
            let records = decoded(&file);
            let read = RecordsRead::from_events(&events);
            for n in [0, count / 2, count - 1] {
                assert_eq!(
                    records[n],
                    generic_record(&read.get(n).unwrap()),
                    "{format:?} record {n}, {one_by_one} one by one"
                );
            }
            // Blocks of about `AVRO_BLOCK_BYTES`: 3 (2.7 blocks' worth), 4 when, without a
            // codec, the half appended one by one ends its own block. The file's sync marker
            // ends the header and every block.
            let marker = &file[file.len() - 16..];
            let blocks = file.windows(16).filter(|w| *w == marker).count() - 1;
            let own_block = format == CaptureFormat::Avro && one_by_one == count / 2;
            let expected = if own_block { 4 } else { 3 };
            assert_eq!(blocks, expected, "{format:?}, {one_by_one} one by one");
        }
        // Deflate compresses the repeated bodies: the codec was applied to the blocks.
        assert!(hand_file(&events, CaptureFormat::AvroDeflate, 0).len() < count * 1024 / 4);
    }

    #[test]
    fn each_file_has_its_own_sync_marker_after_the_same_header() {
        for format in [CaptureFormat::Avro, CaptureFormat::AvroDeflate] {
            let [a, b] = [(); 2].map(|()| hand_file(&[], format, 0));
            let header = header_before_marker(format).unwrap();
            assert!(a.starts_with(header) && b.starts_with(header), "{format:?}");
            assert_eq!(a.len(), header.len() + 16, "an empty file is its header");
            assert_ne!(a[header.len()..], b[header.len()..], "{format:?}");
            assert!(decoded(&a).is_empty() && decoded(&b).is_empty());
            let codec = apache_avro::Reader::new(&a[..]).unwrap();
            assert_eq!(codec.writer_schema(), capture_schema());
        }
    }
}
