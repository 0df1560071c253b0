//! The writer seam between a window and its file format: [`WindowWriter`] appends a window's
//! events to its file and finishes it; [`summarize`] reads a file of the format back. The
//! window logic in [`crate::partition`] knows nothing of the encodings.
//!
//! - Avro and AvroDeflate ([`crate::avro`]): one record per event. Without a codec each read's
//!   events are written a block at a time, each body straight from the read's buffer; with `deflate`
//!   each record is encoded into the open block, which is compressed and written whole.
//! - Parquet (feature `parquet`, [`crate::parquet`]): one column per field of Azure's record,
//!   row groups written as they fill, so a window of any size holds at most one row group in
//!   memory.

use std::io::Read;

use std::ops::Range;

use tributary_broker::RecordsRead;

use crate::avro::{AvroFileWriter, FileSummary};
use crate::config::CaptureFormat;
use crate::destination::PendingFile;
use crate::error::CaptureError;

/// A window's file being written in one format.
pub trait WindowWriter: Send {
    /// Appends the events at `range` of `records`, in order.
    fn append(&mut self, records: &RecordsRead, range: Range<usize>) -> Result<(), CaptureError>;
    /// Writes what the format keeps until the end (the last row group, the footer) and hands
    /// back the file, ready to publish.
    fn finish(self: Box<Self>) -> Result<Box<dyn PendingFile>, CaptureError>;
}

/// A writer of `format` into `file`, whose archive name is `name` (for errors).
pub fn window_writer(
    format: CaptureFormat,
    file: Box<dyn PendingFile>,
    name: &str,
) -> Result<Box<dyn WindowWriter>, CaptureError> {
    match format {
        CaptureFormat::Avro | CaptureFormat::AvroDeflate => {
            let writer =
                AvroFileWriter::new(file, format).map_err(|reason| CaptureError::Avro {
                    name: name.to_owned(),
                    reason,
                })?;
            Ok(Box::new(AvroWindow {
                writer,
                name: name.to_owned(),
            }))
        }
        #[cfg(feature = "parquet")]
        CaptureFormat::Parquet => crate::parquet::ParquetWindow::start(file, name)
            .map(|w| Box::new(w) as Box<dyn WindowWriter>),
        #[cfg(not(feature = "parquet"))]
        CaptureFormat::Parquet => Err(no_parquet()),
    }
}

/// Reads a file of `format` whole and summarises it; an error says what is not a capture file.
pub fn summarize(
    format: CaptureFormat,
    source: Box<dyn Read + Send>,
) -> Result<FileSummary, String> {
    match format {
        CaptureFormat::Avro | CaptureFormat::AvroDeflate => crate::avro::summarize(source),
        #[cfg(feature = "parquet")]
        CaptureFormat::Parquet => crate::parquet::summarize(source),
        #[cfg(not(feature = "parquet"))]
        CaptureFormat::Parquet => Err(no_parquet().to_string()),
    }
}

#[cfg(not(feature = "parquet"))]
fn no_parquet() -> CaptureError {
    CaptureError::InvalidConfig {
        setting: "capture-format",
        reason: "this build has no Parquet (tributary-capture's `parquet` feature)".into(),
    }
}

/// An Avro window: each event one record, written a block at a time.
struct AvroWindow {
    writer: AvroFileWriter<Box<dyn PendingFile>>,
    name: String,
}

impl WindowWriter for AvroWindow {
    fn append(&mut self, records: &RecordsRead, range: Range<usize>) -> Result<(), CaptureError> {
        self.writer
            .append_all(records, range)
            .map_err(|reason| CaptureError::Avro {
                name: self.name.clone(),
                reason,
            })
    }

    fn finish(self: Box<Self>) -> Result<Box<dyn PendingFile>, CaptureError> {
        let AvroWindow { writer, name } = *self;
        writer
            .finish()
            .map_err(|reason| CaptureError::Avro { name, reason })
    }
}

/// A pending file whose every `write` writes the whole buffer: the encoders do not retry short
/// writes, which `io::Write` allows (a file may take part of a buffer).
pub(crate) struct WholeWrites(pub(crate) Box<dyn PendingFile>);

impl std::io::Write for WholeWrites {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::{Arc, Mutex};

    use tributary_event::{EventData, PropertyValue, ReceivedEvent};

    use super::*;

    /// A pending file that keeps its bytes in memory.
    struct MemoryFile(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for MemoryFile {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl PendingFile for MemoryFile {
        fn publish(self: Box<Self>) -> Result<u64, CaptureError> {
            Ok(self.0.lock().unwrap().len() as u64)
        }
    }

    pub(crate) fn event(sequence_number: i64) -> ReceivedEvent {
        let data = EventData::new(format!("body {sequence_number}"))
            .with_property("n", PropertyValue::Int64(sequence_number))
            .with_property("z", PropertyValue::Null);
        ReceivedEvent {
            data,
            sequence_number,
            offset: sequence_number.unsigned_abs() * 100,
            enqueued_time_ms: 1_700_000_000_000 + sequence_number,
        }
    }

    /// Writes `events` in `format` and reads the file back through the seam.
    pub(crate) fn round_trip(
        format: CaptureFormat,
        events: &[ReceivedEvent],
    ) -> (Vec<u8>, FileSummary) {
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let file = Box::new(MemoryFile(Arc::clone(&bytes)));
        let mut writer = window_writer(format, file, "w").unwrap();
        writer
            .append(&RecordsRead::from_events(events), 0..events.len())
            .unwrap();
        let size = writer.finish().unwrap().publish().unwrap();
        let bytes = bytes.lock().unwrap().clone();
        assert_eq!(size, bytes.len() as u64);
        let summary = summarize(format, Box::new(std::io::Cursor::new(bytes.clone()))).unwrap();
        (bytes, summary)
    }

    #[test]
    fn every_format_writes_a_window_the_summary_reads_back() {
        let events: Vec<ReceivedEvent> = (7..12).map(event).collect();
        let mut formats = vec![CaptureFormat::Avro, CaptureFormat::AvroDeflate];
        if cfg!(feature = "parquet") {
            formats.push(CaptureFormat::Parquet);
        }
        for format in formats {
            let (_, summary) = round_trip(format, &events);
            assert_eq!(summary.event_count, 5, "{format:?}");
            assert_eq!(summary.first_sequence, Some(7), "{format:?}");
            assert_eq!(summary.last_sequence, Some(11), "{format:?}");
            let (_, empty) = round_trip(format, &[]);
            assert_eq!(empty.event_count, 0, "{format:?}");
            assert_eq!(empty.first_sequence, None, "{format:?}");
        }
        let garbage = Box::new(std::io::Cursor::new(b"not a capture file".to_vec()));
        assert!(summarize(CaptureFormat::Avro, garbage).is_err());
    }
}
