//! A Produce's record batches into events: the format checks, the decompression (bounded) and
//! the size limits, each refusal with the error code Kafka clients expect.
//!
//! # Guarantees
//! - Only record batches v2 (magic 2) are read; older message sets, transactional and control
//!   batches are INVALID_RECORD. A batch that does not decode, or fails its CRC, is
//!   CORRUPT_MESSAGE.
//! - Uncompressed, gzip, snappy, lz4 (the LZ4 frame format) and zstd batches are read.
//! - Decompression stops at [`DECOMPRESSED_BATCH_BYTES_MAX`]: a small frame cannot make the
//!   server inflate gigabytes (gzip reaches ratios of 1000:1, lz4 and zstd more). A batch beyond
//!   it is MESSAGE_TOO_LARGE, as is any record over [`RECORD_BYTES_MAX`]. The decoders' own
//!   buffers are bounded too: lz4's by the frame's block size (4 MiB at most), zstd's window by
//!   [`ZSTD_WINDOW_LOG_MAX`].

use std::io::Read;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::compression::{Decompressor, Snappy};
use kafka_protocol::records::{Compression, RecordBatchDecoder};
use tributary_event::EventData;

use crate::limits::{DECOMPRESSED_BATCH_BYTES_MAX, RECORD_BYTES_MAX};
use crate::{bounded, mapping};

/// Where a v2 batch's header keeps its record count: after base offset (8), batch length (4),
/// leader epoch (4), magic (1), CRC (4), attributes (2), last offset delta (4), first and max
/// timestamps (8 + 8), producer id (8), producer epoch (2) and base sequence (4).
const RECORD_COUNT_OFFSET: usize = 57;

/// How many records a partition's batches say they hold, read from their headers without
/// decoding them (for the throughput limits, before the batches are checked): a batch whose
/// header is cut short or is not v2 counts as one.
pub fn record_count(records: &Bytes) -> u64 {
    let mut rest = &records[..];
    let mut count = 0u64;
    while rest.len() >= 12 {
        let length = i32::from_be_bytes(rest[8..12].try_into().expect("4 bytes"));
        let size = usize::try_from(length).unwrap_or(0).saturating_add(12);
        let header = rest.get(RECORD_COUNT_OFFSET..RECORD_COUNT_OFFSET + 4);
        let in_batch = match (rest.get(16), header) {
            (Some(2), Some(n)) => i32::from_be_bytes(n.try_into().expect("4 bytes")),
            _ => 1,
        };
        count += u64::try_from(in_batch).unwrap_or(0).max(1);
        rest = rest.get(size..).unwrap_or(&[]);
    }
    count
}

/// The events a partition's record batches hold (see [`crate::mapping`]), or the error code.
pub fn events(records: Option<Bytes>) -> Result<Vec<EventData>, i16> {
    let corrupt = ResponseError::CorruptMessage.code();
    let invalid = ResponseError::InvalidRecord.code();
    let mut bytes = records.ok_or(invalid)?;
    let batches = RecordBatchDecoder::decode_batch_info(&mut bytes.clone()).map_err(|_| corrupt)?;
    for batch in &batches {
        if batch.version != 2 || batch.transactional || batch.control {
            return Err(invalid);
        }
    }
    // The record decoder reserves the batch's claimed record count and each record's claimed
    // header count before reading them: each decompressed section is checked against its
    // claims first (`crate::bounded`). Batches are decoded in the order `batches` lists them.
    let next_batch = std::cell::Cell::new(0usize);
    let checked_decompress = |compressed: &mut Bytes, compression: Compression| {
        let section = decompress(compressed, compression)?;
        let claimed = batches.get(next_batch.get()).map_or(-1, |b| b.record_count);
        next_batch.set(next_batch.get() + 1);
        bounded::check_records(&section, claimed)?;
        Ok(section)
    };
    // Room for the records the batches claim, within what their bytes could hold (a record
    // takes at least 7 bytes): one allocation instead of one per doubling.
    let claimed: usize = batches
        .iter()
        .map(|b| usize::try_from(b.record_count).unwrap_or(0))
        .sum();
    let mut events = Vec::with_capacity(claimed.min(bytes.len() / 7 + 1));
    while !bytes.is_empty() {
        let set = RecordBatchDecoder::decode_with_custom_compression(
            &mut bytes,
            Some(checked_decompress),
        )
        .map_err(|e| {
            if e.downcast_ref::<TooLarge>().is_some() {
                ResponseError::MessageTooLarge.code()
            } else {
                corrupt
            }
        })?;
        for record in set.records {
            if mapping::record_bytes(&record) > RECORD_BYTES_MAX {
                return Err(ResponseError::MessageTooLarge.code());
            }
            events.push(mapping::event_from_record(record));
        }
    }
    if events.is_empty() {
        return Err(invalid);
    }
    Ok(events)
}

/// A batch that decompresses to more than [`DECOMPRESSED_BATCH_BYTES_MAX`].
#[derive(Debug, thiserror::Error)]
#[error("a record batch decompresses to more than {DECOMPRESSED_BATCH_BYTES_MAX} bytes")]
struct TooLarge;

/// The largest zstd window a batch may ask for, as a power of two: 16 MiB, the most a batch may
/// decompress to, so a frame claiming a bigger window (up to 2 GiB) cannot make the decoder
/// allocate it. A producer's zstd window is never larger than the batch it compresses.
pub const ZSTD_WINDOW_LOG_MAX: u32 = 24;

const _: () = assert!(1u64 << ZSTD_WINDOW_LOG_MAX == DECOMPRESSED_BATCH_BYTES_MAX);

/// At most [`DECOMPRESSED_BATCH_BYTES_MAX`] + 1 bytes of what `decoder` yields (one more than
/// allowed, so that a batch over the bound is seen to be).
fn read_bounded(decoder: impl Read) -> std::io::Result<Bytes> {
    let mut out = Vec::new();
    decoder
        .take(DECOMPRESSED_BATCH_BYTES_MAX + 1)
        .read_to_end(&mut out)?;
    Ok(Bytes::from(out))
}

/// One batch's records section, decompressed within the bound.
fn decompress(compressed: &mut Bytes, compression: Compression) -> anyhow::Result<Bytes> {
    let out = match compression {
        Compression::None => std::mem::take(compressed),
        Compression::Gzip => read_bounded(flate2::read::GzDecoder::new(&compressed[..]))?,
        Compression::Lz4 => read_bounded(lz4_flex::frame::FrameDecoder::new(&compressed[..]))?,
        Compression::Zstd => {
            let mut decoder = zstd::stream::read::Decoder::with_buffer(&compressed[..])?;
            decoder.window_log_max(ZSTD_WINDOW_LOG_MAX)?;
            read_bounded(decoder)?
        }
        // Snappy writes at most about 32 times its input (a copy of 64 bytes costs two bytes),
        // so a frame within the limit cannot inflate far; the length is checked after. (The
        // codec does reserve, zeroed, the length a block claims, up to 4 GiB: memory the system
        // hands out lazily, but a bound worth adding with the codec fixes noted in the crate
        // docs.)
        Compression::Snappy => Snappy::decompress(compressed, |out| Ok(std::mem::take(out)))?,
    };
    if out.len() as u64 > DECOMPRESSED_BATCH_BYTES_MAX {
        return Err(TooLarge.into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use kafka_protocol::records::{RecordBatchEncoder, RecordEncodeOptions};
    use tributary_event::ReceivedEvent;

    use super::*;

    fn batch(compression: Compression, body: Vec<u8>) -> Bytes {
        let event = ReceivedEvent {
            sequence_number: 0,
            offset: 0,
            enqueued_time_ms: 0,
            data: EventData::new(body),
        };
        let record = mapping::record_from_event(event, 0);
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression,
        };
        RecordBatchEncoder::encode_with_custom_compression(
            &mut buf,
            [&record],
            &options,
            Some(compress),
        )
        .unwrap();
        buf.freeze()
    }

    #[test]
    fn record_counts_come_from_batch_headers_and_garbage_counts_little() {
        let event = |n: i64| ReceivedEvent {
            sequence_number: n,
            offset: 0,
            enqueued_time_ms: 0,
            data: EventData::new(vec![b'x'; 10]),
        };
        let records: Vec<_> = (0..7)
            .map(|n| mapping::record_from_event(event(n), 0))
            .collect();
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut buf, &records, &options).unwrap();
        let one = buf.freeze();
        assert_eq!(record_count(&one), 7);
        let two = Bytes::from([one.clone(), batch(Compression::Gzip, b"y".to_vec())].concat());
        assert_eq!(record_count(&two), 8);
        assert_eq!(record_count(&Bytes::from_static(b"short")), 0);
        assert_eq!(record_count(&one.slice(..40)), 1, "a cut header counts one");
    }

    /// The compressors the codec has without its lz4 and zstd features (which build C).
    fn compress(
        records: &mut BytesMut,
        out: &mut BytesMut,
        compression: Compression,
    ) -> anyhow::Result<()> {
        use kafka_protocol::compression::{Compressor, Gzip, None as Plain};
        use std::io::Write;
        let copy = |to: &mut BytesMut| {
            to.extend_from_slice(records);
            Ok(())
        };
        match compression {
            Compression::None => Plain::compress(out, copy),
            Compression::Gzip => Gzip::compress(out, copy),
            Compression::Snappy => Snappy::compress(out, copy),
            Compression::Lz4 => {
                let mut encoder = lz4_flex::frame::FrameEncoder::new(Vec::new());
                encoder.write_all(records)?;
                out.extend_from_slice(&encoder.finish()?);
                Ok(())
            }
            Compression::Zstd => {
                out.extend_from_slice(&zstd::bulk::compress(records, 3)?);
                Ok(())
            }
        }
    }

    const EVERY_COMPRESSION: [Compression; 5] = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ];

    #[test]
    fn lz4_and_zstd_bombs_are_too_large_not_memory() {
        for compression in [Compression::Lz4, Compression::Zstd] {
            // 64 MiB of zeros compress to well under a MiB (lz4 about 250:1, zstd far more).
            let bomb = batch(compression, vec![0; 64 << 20]);
            assert!(bomb.len() < 1 << 20, "{compression:?}: {}", bomb.len());
            assert_eq!(
                events(Some(bomb)),
                Err(ResponseError::MessageTooLarge.code()),
                "{compression:?}"
            );
            // Just under the record limit still decodes.
            let body = vec![7; RECORD_BYTES_MAX - 64];
            let decoded = events(Some(batch(compression, body.clone()))).unwrap();
            assert_eq!(decoded[0].body.len(), body.len(), "{compression:?}");
        }
    }

    #[test]
    fn a_zstd_frame_asking_for_a_window_over_the_bound_is_refused() {
        use std::io::Write;
        // A streamed frame (no content size) keeps the window it was compressed with.
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        encoder.window_log(ZSTD_WINDOW_LOG_MAX + 2).unwrap();
        encoder.write_all(&vec![3u8; 1 << 20]).unwrap();
        let mut compressed = Bytes::from(encoder.finish().unwrap());
        let decoded = decompress(&mut compressed, Compression::Zstd);
        assert!(decoded.is_err(), "a 64 MiB window must be refused");
    }

    #[test]
    fn every_compression_decodes_and_bombs_and_garbage_are_refused() {
        for compression in EVERY_COMPRESSION {
            let decoded = events(Some(batch(compression, b"hello".to_vec()))).unwrap();
            assert_eq!(&decoded[0].body[..], b"hello", "{compression:?}");
        }
        // 20 MiB of zeros gzip to about 20 KiB: refused before it is all inflated.
        let bomb = batch(Compression::Gzip, vec![0; 20 << 20]);
        assert!(bomb.len() < 1 << 20);
        assert_eq!(
            events(Some(bomb)),
            Err(ResponseError::MessageTooLarge.code())
        );
        let big = batch(Compression::None, vec![1; RECORD_BYTES_MAX + 1]);
        assert_eq!(
            events(Some(big)),
            Err(ResponseError::MessageTooLarge.code())
        );
        let mut corrupt = batch(Compression::None, b"x".to_vec()).to_vec();
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0xff;
        assert_eq!(
            events(Some(corrupt.into())),
            Err(ResponseError::CorruptMessage.code())
        );
        assert_eq!(events(None), Err(ResponseError::InvalidRecord.code()));
        assert_eq!(
            events(Some(Bytes::from_static(b"\x01\x02"))),
            Err(ResponseError::CorruptMessage.code())
        );
    }
}
