//! Entry points for the fuzz targets of `tributary-fuzz` into the log's private batch codec; not
//! part of the API (hidden from the docs). They add no behaviour: each runs the functions
//! recovery and reads run, in the same order.

use bytes::Bytes;
use tributary_event::{EventData, ReceivedEvent};

use crate::record::{
    BATCH_HEADER_BYTES, BatchHeader, CRC_AT, CRC_COVERS_FROM, decode_batch, encode_batch,
    record_offsets, verify_checksum,
};

/// Decodes one whole batch as a segment scan and a read do: header, length, checksum, record
/// offsets, records. Returns the batch's offset and its events; the error is the decoder's
/// message.
pub fn decode_batch_bytes(batch: &[u8]) -> Result<(u64, Vec<ReceivedEvent>), String> {
    let head = batch
        .get(..BATCH_HEADER_BYTES)
        .ok_or("shorter than a batch header")?;
    let header = BatchHeader::decode(head).map_err(|e| e.to_string())?;
    if header.batch_len as usize != batch.len() {
        return Err("the batch length disagrees with the bytes".into());
    }
    verify_checksum(batch, &header).map_err(|e| e.to_string())?;
    let offsets = record_offsets(batch, &header).map_err(|e| e.to_string())?;
    let mut events = Vec::new();
    let bytes = Bytes::copy_from_slice(batch);
    decode_batch(&bytes, &header, 0, usize::MAX, &mut events).map_err(|e| e.to_string())?;
    assert_eq!(offsets.len(), events.len(), "one offset per decoded record");
    Ok((header.batch_offset, events))
}

/// The batch the log writes for `events` (at least one) at `batch_offset`.
pub fn encode_batch_bytes(
    batch_offset: u64,
    base_sequence: i64,
    enqueued_time_ms: i64,
    events: &[EventData],
) -> Vec<u8> {
    let mut out = Vec::new();
    encode_batch(
        &mut out,
        batch_offset,
        base_sequence,
        enqueued_time_ms,
        events,
        true,
        &mut Vec::new(),
    );
    out
}

/// Writes the right checksum into bytes laid out as a batch (if they are long enough), so a
/// fuzzer gets past the CRC to the record decoder.
pub fn seal_checksum(batch: &mut [u8]) {
    if batch.len() >= BATCH_HEADER_BYTES {
        let crc = crate::checksum::crc32c(&batch[CRC_COVERS_FROM..]);
        batch[CRC_AT..CRC_COVERS_FROM].copy_from_slice(&crc.to_le_bytes());
    }
}
