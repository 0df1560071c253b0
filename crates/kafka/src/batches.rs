//! A Produce's record batches into events: the format checks, the decompression (bounded) and
//! the size limits, each refusal with the error code Kafka clients expect.
//!
//! # Guarantees
//! - Only record batches v2 (magic 2) are read; older message sets, transactional and control
//!   batches are INVALID_RECORD. A batch that does not decode, or fails its CRC, is
//!   CORRUPT_MESSAGE.
//! - Uncompressed, gzip and snappy batches are read; lz4 and zstd are
//!   UNSUPPORTED_COMPRESSION_TYPE for now.
//! - Decompression stops at [`DECOMPRESSED_BATCH_BYTES_MAX`]: a small frame cannot make the
//!   server inflate gigabytes (gzip reaches ratios of 1000:1). A batch beyond it is
//!   MESSAGE_TOO_LARGE, as is any record over [`RECORD_BYTES_MAX`].

use std::io::Read;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::compression::{Decompressor, Snappy};
use kafka_protocol::records::{Compression, RecordBatchDecoder};
use tributary_event::EventData;

use crate::limits::{DECOMPRESSED_BATCH_BYTES_MAX, RECORD_BYTES_MAX};
use crate::{bounded, mapping};

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
        if !matches!(
            batch.compression,
            Compression::None | Compression::Gzip | Compression::Snappy
        ) {
            return Err(ResponseError::UnsupportedCompressionType.code());
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
    let mut events = Vec::new();
    while !bytes.is_empty() {
        let set =
            RecordBatchDecoder::decode_with_custom_compression(&mut bytes, Some(checked_decompress))
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

/// One batch's records section, decompressed within the bound.
fn decompress(compressed: &mut Bytes, compression: Compression) -> anyhow::Result<Bytes> {
    let out = match compression {
        Compression::None => std::mem::take(compressed),
        Compression::Gzip => {
            let mut out = Vec::new();
            let decoder = flate2::read::GzDecoder::new(&compressed[..]);
            decoder
                .take(DECOMPRESSED_BATCH_BYTES_MAX + 1)
                .read_to_end(&mut out)?;
            Bytes::from(out)
        }
        // Snappy writes at most about 32 times its input (a copy of 64 bytes costs two bytes),
        // so a frame within the limit cannot inflate far; the length is checked after. (The
        // codec does reserve, zeroed, the length a block claims, up to 4 GiB: memory the system
        // hands out lazily, but a bound worth adding with the codec fixes noted in the crate
        // docs.)
        Compression::Snappy => Snappy::decompress(compressed, |out| Ok(std::mem::take(out)))?,
        other => anyhow::bail!("{other:?} is not supported"),
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
        RecordBatchEncoder::encode(&mut buf, [&record], &options).unwrap();
        buf.freeze()
    }

    #[test]
    fn plain_gzip_and_snappy_batches_decode_and_bombs_and_garbage_are_refused() {
        for compression in [Compression::None, Compression::Gzip, Compression::Snappy] {
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
