//! Window files as Parquet (`CaptureFormat::Parquet`, feature `parquet`): one column per field
//! of Azure's capture record, so the same queries run on Avro and Parquet captures.
//!
//! # The schema
//! ```text
//! message EventData {
//!   required int64 SequenceNumber;
//!   required binary Offset (STRING);                          -- decimal, as in Azure's Avro
//!   required int64 EnqueuedTimeUtc (TIMESTAMP(MILLIS,true));  -- UTC instant
//!   required group SystemProperties (MAP) { repeated group key_value {
//!     required binary key (STRING);
//!     required group value { optional int64 long; optional double double;
//!                            optional binary string (STRING); optional binary bytes; } } }
//!   required group Properties (MAP) { … the same … }
//!   optional binary Body;
//! }
//! ```
//! - `EnqueuedTimeUtc` is a timestamp, not Avro's `M/d/yyyy h:mm:ss tt` text: Azure's Parquet
//!   capture (the Stream Analytics no-code editor) writes its enqueued time as a datetime
//!   column, and a timestamp is what Parquet readers filter and sort on. Milliseconds, adjusted
//!   to UTC (pyarrow: `timestamp[ms, tz=UTC]`).
//! - The maps' values are Azure's Avro unions (`long`, `double`, `string`, `bytes`, `null`) as a
//!   group with one optional field per branch, exactly one set (none for `null`): Parquet has
//!   no unions, and this keeps each value's type. Keys and values map from an event as in
//!   [`crate::avro`] ([`crate::avro::FieldValue`]).
//! - Snappy compression (the default of Azure's and most Parquet writers); chunk statistics on
//!   `SequenceNumber` and `EnqueuedTimeUtc` only, so footers stay small.
//!
//! # Memory
//! Events are buffered column by column and written as a row group once they reach
//! [`PARQUET_ROW_GROUP_BYTES`]; a window of any size (up to 500 MiB) holds at most one row group.
//! Reading a file back ([`summarize`], at recovery) streams it and keeps only its last
//! [`PARQUET_FOOTER_BYTES_MAX`] bytes: the count and the first and last sequence numbers come
//! from the footer's row counts and `SequenceNumber` statistics.

use std::io::Read;
use std::ops::Range;
use std::sync::{Arc, LazyLock};

use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, DataType, DoubleType, Int64Type};
use parquet::errors::ParquetError;
use parquet::file::metadata::{FooterTail, ParquetMetaDataReader};
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::statistics::Statistics;
use parquet::file::writer::{SerializedFileWriter, SerializedRowGroupWriter};
use parquet::schema::parser::parse_message_type;
use parquet::schema::types::{ColumnPath, Type};
use tributary_broker::{RecordView, RecordsRead};

use crate::avro::{FieldValue, FileSummary, properties, record_bytes, system_properties};
use crate::destination::PendingFile;
use crate::error::CaptureError;
use crate::limits::{PARQUET_FOOTER_BYTES_MAX, PARQUET_ROW_GROUP_BYTES};
use crate::window::{WholeWrites, WindowWriter};

/// The Parquet type of a `SystemProperties` or `Properties` map, after its name: a string key,
/// and Azure's Avro union as one optional field per branch (see the module docs).
const MAP_GROUP: &str = "(MAP) {
    repeated group key_value {
      required binary key (STRING);
      required group value {
        optional int64 long;
        optional double double;
        optional binary string (STRING);
        optional binary bytes;
      }
    }
  }";

/// The Parquet schema of a capture file (see the module docs).
pub fn parquet_schema() -> String {
    format!(
        "message EventData {{
  required int64 SequenceNumber;
  required binary Offset (STRING);
  required int64 EnqueuedTimeUtc (TIMESTAMP(MILLIS,true));
  required group SystemProperties {MAP_GROUP}
  required group Properties {MAP_GROUP}
  optional binary Body;
}}"
    )
}

static SCHEMA: LazyLock<Arc<Type>> = LazyLock::new(|| {
    Arc::new(parse_message_type(&parquet_schema()).expect("the capture's Parquet schema parses"))
});

fn writer_properties() -> Arc<WriterProperties> {
    let numeric = EnabledStatistics::Chunk;
    Arc::new(
        WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_created_by("tributary capture".to_owned())
            .set_statistics_enabled(EnabledStatistics::None)
            .set_column_statistics_enabled(ColumnPath::from("SequenceNumber"), numeric)
            .set_column_statistics_enabled(ColumnPath::from("EnqueuedTimeUtc"), numeric)
            .build(),
    )
}

/// One map column's leaves: keys, the four value branches, and the levels that shape them.
#[derive(Debug, Default)]
struct MapColumn {
    /// Repetition levels, shared by all five leaves: 0 starts a row, 1 continues its map.
    repetition: Vec<i16>,
    keys: Vec<ByteArray>,
    /// 0: the row's map is empty; 1: an entry.
    key_levels: Vec<i16>,
    longs: Vec<i64>,
    doubles: Vec<f64>,
    strings: Vec<ByteArray>,
    bytes: Vec<ByteArray>,
    /// Per branch (long, double, string, bytes): 0 no entry, 1 entry without it, 2 it is set.
    branch_levels: [Vec<i16>; 4],
}

impl MapColumn {
    fn push_row<'k, 'v>(&mut self, entries: impl Iterator<Item = (&'k str, FieldValue<'v>)>) {
        let mut entries = entries.peekable();
        if entries.peek().is_none() {
            self.repetition.push(0);
            self.key_levels.push(0);
            self.branch_levels.iter_mut().for_each(|l| l.push(0));
            return;
        }
        for (i, (key, value)) in entries.enumerate() {
            self.repetition.push(i16::from(i > 0));
            self.keys.push(ByteArray::from(key));
            self.key_levels.push(1);
            let set = match value {
                FieldValue::Long(v) => {
                    self.longs.push(v);
                    Some(0)
                }
                FieldValue::Double(v) => {
                    self.doubles.push(v);
                    Some(1)
                }
                FieldValue::String(v) => {
                    self.strings.push(ByteArray::from(v.as_ref()));
                    Some(2)
                }
                FieldValue::Bytes(v) => {
                    self.bytes.push(ByteArray::from(v));
                    Some(3)
                }
                FieldValue::Null => None,
            };
            for (branch, levels) in self.branch_levels.iter_mut().enumerate() {
                levels.push(if set == Some(branch) { 2 } else { 1 });
            }
        }
    }

    fn write<W: std::io::Write + Send>(
        &self,
        group: &mut SerializedRowGroupWriter<'_, W>,
    ) -> Result<(), ParquetError> {
        let reps = Some(&self.repetition[..]);
        let [longs, doubles, strings, bytes] = &self.branch_levels;
        write_column::<ByteArrayType, W>(group, &self.keys, Some(&self.key_levels), reps)?;
        write_column::<Int64Type, W>(group, &self.longs, Some(longs), reps)?;
        write_column::<DoubleType, W>(group, &self.doubles, Some(doubles), reps)?;
        write_column::<ByteArrayType, W>(group, &self.strings, Some(strings), reps)?;
        write_column::<ByteArrayType, W>(group, &self.bytes, Some(bytes), reps)
    }
}

/// Writes the next leaf column of `group`.
fn write_column<T: DataType, W: std::io::Write + Send>(
    group: &mut SerializedRowGroupWriter<'_, W>,
    values: &[T::T],
    definition: Option<&[i16]>,
    repetition: Option<&[i16]>,
) -> Result<(), ParquetError> {
    let mut column = group
        .next_column()?
        .ok_or_else(|| ParquetError::General("the schema has fewer columns".to_owned()))?;
    column
        .typed::<T>()
        .write_batch(values, definition, repetition)?;
    column.close()
}

/// The rows of the row group being filled, column by column.
#[derive(Debug, Default)]
struct Rows {
    sequence_numbers: Vec<i64>,
    offsets: Vec<ByteArray>,
    enqueued_times: Vec<i64>,
    system: MapColumn,
    properties: MapColumn,
    bodies: Vec<ByteArray>,
    /// The events' bytes as the size window counts them.
    bytes: u64,
}

impl Rows {
    fn push(&mut self, record: &RecordView<'_>) {
        self.sequence_numbers.push(record.sequence_number());
        self.offsets
            .push(ByteArray::from(record.offset().to_string().into_bytes()));
        self.enqueued_times.push(record.enqueued_time_ms());
        self.system.push_row(system_properties(record));
        self.properties.push_row(properties(record));
        // A slice of the log's read buffer, not a copy.
        self.bodies.push(ByteArray::from(record.body_bytes()));
        self.bytes += record_bytes(record);
    }

    fn write<W: std::io::Write + Send>(
        &self,
        file: &mut SerializedFileWriter<W>,
    ) -> Result<(), ParquetError> {
        let mut group = file.next_row_group()?;
        let body_levels = vec![1; self.bodies.len()];
        write_column::<Int64Type, W>(&mut group, &self.sequence_numbers, None, None)?;
        write_column::<ByteArrayType, W>(&mut group, &self.offsets, None, None)?;
        write_column::<Int64Type, W>(&mut group, &self.enqueued_times, None, None)?;
        self.system.write(&mut group)?;
        self.properties.write(&mut group)?;
        write_column::<ByteArrayType, W>(&mut group, &self.bodies, Some(&body_levels), None)?;
        group.close().map(drop)
    }
}

/// A Parquet window: rows buffered, a row group written each time they fill one.
pub(crate) struct ParquetWindow {
    file: SerializedFileWriter<WholeWrites>,
    rows: Rows,
    name: String,
}

impl ParquetWindow {
    /// Starts the file `name` (its magic bytes are written when the file ends).
    pub(crate) fn start(
        file: Box<dyn PendingFile>,
        name: &str,
    ) -> Result<ParquetWindow, CaptureError> {
        let file =
            SerializedFileWriter::new(WholeWrites(file), Arc::clone(&SCHEMA), writer_properties())
                .map_err(|e| parquet_error(name, &e))?;
        Ok(ParquetWindow {
            file,
            rows: Rows::default(),
            name: name.to_owned(),
        })
    }

    fn write_rows(&mut self) -> Result<(), CaptureError> {
        if self.rows.sequence_numbers.is_empty() {
            return Ok(());
        }
        let rows = std::mem::take(&mut self.rows);
        rows.write(&mut self.file)
            .map_err(|e| parquet_error(&self.name, &e))
    }
}

fn parquet_error(name: &str, error: &ParquetError) -> CaptureError {
    CaptureError::Parquet {
        name: name.to_owned(),
        reason: error.to_string(),
    }
}

impl WindowWriter for ParquetWindow {
    fn append(&mut self, records: &RecordsRead, range: Range<usize>) -> Result<(), CaptureError> {
        for record in records.range(range) {
            self.rows.push(&record);
            if self.rows.bytes >= PARQUET_ROW_GROUP_BYTES {
                self.write_rows()?;
            }
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<Box<dyn PendingFile>, CaptureError> {
        self.write_rows()?;
        let ParquetWindow { file, name, .. } = *self;
        let sink = file.into_inner().map_err(|e| parquet_error(&name, &e))?;
        Ok(sink.0)
    }
}

/// Reads a capture's Parquet file and summarises it from its footer; an error says what is not
/// a capture file.
pub fn summarize<R: Read>(source: R) -> Result<FileSummary, String> {
    let tail = read_tail(source)?;
    let footer: &[u8; 8] = tail
        .get(tail.len().saturating_sub(8)..)
        .and_then(|t| t.try_into().ok())
        .ok_or("shorter than a Parquet footer")?;
    let footer = FooterTail::try_from(*footer).map_err(|e| e.to_string())?;
    let start = (tail.len() - 8)
        .checked_sub(footer.metadata_length())
        .ok_or("the footer is larger than the file or than a capture's")?;
    let metadata = ParquetMetaDataReader::decode_metadata(&tail[start..tail.len() - 8])
        .map_err(|e| e.to_string())?;
    let columns = metadata.file_metadata().schema_descr();
    if columns.num_columns() == 0 || columns.column(0).name() != "SequenceNumber" {
        return Err("its first column is not SequenceNumber".to_owned());
    }
    let mut summary = FileSummary {
        event_count: 0,
        first_sequence: None,
        last_sequence: None,
    };
    for group in metadata.row_groups() {
        let rows = u64::try_from(group.num_rows()).map_err(|_| "a negative row count")?;
        if rows == 0 {
            continue;
        }
        let (first, last) = match group.column(0).statistics() {
            Some(Statistics::Int64(s)) => (s.min_opt().copied(), s.max_opt().copied()),
            _ => (None, None),
        };
        let (Some(first), Some(last)) = (first, last) else {
            return Err("a row group has no SequenceNumber statistics".to_owned());
        };
        let follows = summary.last_sequence.map_or(first, |l| l + 1);
        if first != follows || u64::try_from(last - first + 1).ok() != Some(rows) {
            return Err(format!(
                "sequence numbers {first}..={last} in {rows} rows: not one window of one partition"
            ));
        }
        summary.first_sequence.get_or_insert(first);
        summary.last_sequence = Some(last);
        summary.event_count += rows;
    }
    Ok(summary)
}

/// The last [`PARQUET_FOOTER_BYTES_MAX`] bytes of `source` (all of it if shorter).
fn read_tail<R: Read>(mut source: R) -> Result<Vec<u8>, String> {
    let mut tail = Vec::new();
    let mut chunk = vec![0_u8; 64 * 1024];
    loop {
        let read = source.read(&mut chunk).map_err(|e| e.to_string())?;
        if read == 0 {
            return Ok(tail);
        }
        tail.extend_from_slice(&chunk[..read]);
        if tail.len() > 2 * PARQUET_FOOTER_BYTES_MAX {
            tail.drain(..tail.len() - PARQUET_FOOTER_BYTES_MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use tributary_event::ReceivedEvent;

    use super::*;
    use crate::config::CaptureFormat;
    use crate::window::tests::{event, round_trip};

    #[test]
    fn the_schema_parses_and_a_big_window_writes_several_row_groups() {
        assert_eq!(SCHEMA.get_fields().len(), 6);
        // Bodies of 1 MiB: 40 events make two row groups and part of a third.
        let events: Vec<ReceivedEvent> = (0..40)
            .map(|n| {
                let mut e = event(n);
                e.data.body = vec![n as u8; 1024 * 1024].into();
                e
            })
            .collect();
        let (bytes, summary) = round_trip(CaptureFormat::Parquet, &events);
        assert_eq!(summary.event_count, 40);
        assert_eq!(
            (summary.first_sequence, summary.last_sequence),
            (Some(0), Some(39))
        );
        let metadata = ParquetMetaDataReader::new()
            .parse_and_finish(&bytes::Bytes::from(bytes))
            .unwrap();
        assert_eq!(metadata.num_row_groups(), 2);
        assert!(summarize(&b"PAR1 not parquet PAR1"[..]).is_err());
    }
}
