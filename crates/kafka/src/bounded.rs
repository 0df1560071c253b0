//! Bounded decoding: a request body is first decoded once with every claimed element count held
//! to what the bytes left could hold, and only a body that passes is decoded for real.
//!
//! # Why this exists
//! `kafka-protocol` 0.18 reserves a vector for the element count an array claims before it reads
//! any element (`Vec::with_capacity(n)` in its `Array` and `CompactArray` decoders). A few bytes
//! claiming two billion elements make it ask for hundreds of gigabytes, and a failed allocation
//! aborts the process: a panic cannot be caught and no error is returned. No release of the
//! crate bounds the count yet, and no other maintained crate decodes the Kafka protocol, so the
//! door guards the codec from outside instead of writing a second codec.
//!
//! # How
//! The probe decodes the body through [`CountClamp`], a buffer that changes what the decoder
//! reads, never how many bytes it consumes:
//! - An unsigned varint (in the flexible versions every unsigned varint of a request is a
//!   length, a count, or a tagged field's tag or size, so in a valid body each is at most the
//!   bytes left where it starts, plus one): the decoder reads a varint a byte at a time, so at
//!   every byte read alone the buffer decodes the varint the raw bytes hold from there. One
//!   over the bound marks the body as over-claiming and the byte reads as 0, which ends the
//!   varint at a value of at most what the earlier bytes made, within the bound of where it
//!   began (a byte inside a varint that starts earlier is checked on its own as well). A
//!   Boolean is also read alone: 0 and 1 are within any bound.
//! - An `int32` (an array's count in the non-flexible versions, and also many values that are
//!   not counts, such as timeouts and byte limits) is held to at most the bytes left after it,
//!   plus one. An array's element takes at least one byte, so a count held down to that still
//!   claims more elements than the bytes left and the probe fails; a value that is not a count
//!   changes no length, so no structure.
//!
//! A probe that neither fails nor marks the body decoded the same structure the real decode
//! will, with each count within the bytes left: the real decode then reserves at most about the
//! frame's size in elements per array.
//!
//! The records inside a Produce are not decoded here (they are a byte string to the request
//! codec); `crate::batches` bounds their counts before the record decoder runs.

use std::ops::Range;

use bytes::{Buf, Bytes, TryGetError};
use kafka_protocol::protocol::Decodable;
use kafka_protocol::protocol::buf::ByteBuf;

/// The most bytes an unsigned varint takes (32 bits in groups of seven).
const VARINT_BYTES_MAX: usize = 5;

/// A buffer over a request body that holds every claimed count to the bytes left (see the
/// module docs). Only for the probe: the values it returns are not the body's.
#[derive(Debug)]
pub struct CountClamp {
    bytes: Bytes,
    over_claimed: bool,
}

impl CountClamp {
    /// A probe buffer over `bytes`.
    pub fn new(bytes: Bytes) -> Self {
        CountClamp {
            bytes,
            over_claimed: false,
        }
    }

    /// Whether a varint claimed more than the bytes left (the body must be refused, whatever
    /// the probe's decode returned).
    pub fn over_claimed(&self) -> bool {
        self.over_claimed
    }

    /// The unsigned varint the raw bytes hold from the read position (as the codec decodes it:
    /// at most five bytes, fewer when the body ends).
    fn varint_ahead(&self) -> u64 {
        let mut value = 0u64;
        for (i, byte) in self.bytes.iter().take(VARINT_BYTES_MAX).enumerate() {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                break;
            }
        }
        value
    }

    /// One byte read alone: itself, or 0 when the varint from it claims more than the bytes
    /// left (and the body is marked).
    fn checked_byte(&mut self) -> Option<u8> {
        let bound = self.bytes.len() as u64 + 1;
        let over = self.varint_ahead() > bound;
        let byte = *self.bytes.first()?;
        self.bytes.advance(1);
        if over {
            self.over_claimed = true;
            return Some(0);
        }
        Some(byte)
    }

    /// An `int32` held to the bytes after it, plus one.
    fn held_i32(&self, value: i32) -> i32 {
        value.min(i32::try_from(self.bytes.len() + 1).unwrap_or(i32::MAX))
    }
}

impl Buf for CountClamp {
    fn remaining(&self) -> usize {
        self.bytes.remaining()
    }

    fn chunk(&self) -> &[u8] {
        self.bytes.chunk()
    }

    fn advance(&mut self, cnt: usize) {
        self.bytes.advance(cnt);
    }

    fn try_get_u8(&mut self) -> Result<u8, TryGetError> {
        self.checked_byte().ok_or(TryGetError {
            requested: 1,
            available: 0,
        })
    }

    fn get_u8(&mut self) -> u8 {
        // As `Bytes::get_u8`: reading past the end is the caller's bug.
        self.checked_byte()
            .expect("get_u8 past the end of a probe buffer")
    }

    fn try_get_i32(&mut self) -> Result<i32, TryGetError> {
        let value = self.bytes.try_get_i32()?;
        Ok(self.held_i32(value))
    }

    fn get_i32(&mut self) -> i32 {
        let value = self.bytes.get_i32();
        self.held_i32(value)
    }
}

impl ByteBuf for CountClamp {
    fn peek_bytes(&mut self, r: Range<usize>) -> Bytes {
        self.bytes.slice(r)
    }

    fn get_bytes(&mut self, size: usize) -> Bytes {
        self.bytes.split_to(size)
    }
}

/// Decodes `body` as `T` at `version` through [`CountClamp`], throwing the result away: an
/// error when it does not decode with its counts held to its bytes, or when a length or count
/// claims more than the bytes left. Only a body that passes may be decoded for real.
pub fn probe<T: Decodable>(body: &Bytes, version: i16) -> anyhow::Result<()> {
    let mut buf = CountClamp::new(body.clone());
    let decoded = T::decode(&mut buf, version).map(drop);
    if buf.over_claimed() {
        anyhow::bail!("a length or count claims more than the bytes left");
    }
    decoded
}

/// Why a batch's records section is refused before the record decoder sees it.
#[derive(Debug, thiserror::Error)]
pub enum RecordsRefused {
    /// The batch header's record count is not the number of records the section holds.
    #[error("the batch claims {claimed} records and holds {held}")]
    Count {
        /// The count the batch header gives.
        claimed: i32,
        /// The records the section holds.
        held: usize,
    },
    /// A record claims more headers than its bytes could hold, or its lengths overrun it.
    #[error("record {index} is malformed: {what}")]
    Record {
        /// The record's index in its batch.
        index: usize,
        /// What is wrong with it.
        what: &'static str,
    },
}

/// Checks a batch's (decompressed) records section against the two counts the record decoder
/// reserves memory for before reading: the batch header's record count must be the number of
/// records the section holds, and each record's header count must fit in the bytes left in
/// the record (a header takes at least two). Reads only the lengths the record format (v2)
/// puts before the headers, and allocates nothing.
///
/// Written by hand because the codec's own varint decoders are private to it, and this walk
/// is what stands between a claimed count and the codec's reservation of it.
pub fn check_records(section: &[u8], claimed: i32) -> Result<(), RecordsRefused> {
    let mut rest = section;
    let mut held = 0usize;
    while !rest.is_empty() {
        let refused = |what| RecordsRefused::Record { index: held, what };
        let length = zigzag_varint(&mut rest).ok_or(refused("its length does not decode"))?;
        let length = usize::try_from(length).map_err(|_| refused("a negative length"))?;
        if length > rest.len() {
            return Err(refused("it is longer than the batch"));
        }
        let (mut record, after) = rest.split_at(length);
        rest = after;
        // attributes, timestamp delta, offset delta
        let skipped = record.len() > 1 && {
            record = &record[1..];
            zigzag_varint(&mut record).is_some() && zigzag_varint(&mut record).is_some()
        };
        if !skipped {
            return Err(refused("it ends before its key"));
        }
        for what in ["its key overruns it", "its value overruns it"] {
            let len = zigzag_varint(&mut record).ok_or(refused(what))?;
            let len = usize::try_from(len.max(0)).map_err(|_| refused(what))?;
            record = record.get(len..).ok_or(refused(what))?;
        }
        let headers = zigzag_varint(&mut record).ok_or(refused("no header count"))?;
        if headers < 0 || headers as u64 > (record.len() / 2) as u64 {
            return Err(refused("it claims more headers than its bytes hold"));
        }
        held += 1;
    }
    if usize::try_from(claimed).ok() != Some(held) {
        return Err(RecordsRefused::Count { claimed, held });
    }
    Ok(())
}

/// A zigzag-encoded varint of up to 64 bits (the record format's `varint` and `varlong`),
/// advancing `bytes` past it; `None` when it runs past the end or over ten bytes.
fn zigzag_varint(bytes: &mut &[u8]) -> Option<i64> {
    let mut raw = 0u64;
    for i in 0..10 {
        let byte = *bytes.get(i)?;
        raw |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *bytes = &bytes[i + 1..];
            return Some((raw >> 1) as i64 ^ -((raw & 1) as i64));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use bytes::BufMut;

    use super::*;

    fn varint(mut value: u32) -> Vec<u8> {
        let mut out = Vec::new();
        while value >= 0x80 {
            out.push((value as u8) | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
        out
    }

    /// Reads a varint a byte at a time, as the codec does; the value and the bytes it took.
    fn read_varint(buf: &mut CountClamp) -> (u64, usize) {
        let (mut value, mut taken) = (0u64, 0);
        for shift in (0..35).step_by(7) {
            let byte = buf.try_get_u8().unwrap();
            taken += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        (value, taken)
    }

    #[test]
    fn a_varint_within_the_bytes_left_reads_unchanged() {
        for value in [0u32, 1, 127, 128, 300, 16_383, 16_384] {
            let mut body = varint(value);
            body.extend(std::iter::repeat_n(0u8, 20_000));
            let mut buf = CountClamp::new(Bytes::from(body));
            assert_eq!(
                read_varint(&mut buf),
                (u64::from(value), varint(value).len())
            );
            assert!(!buf.over_claimed());
        }
    }

    #[test]
    fn a_varint_claiming_more_than_the_bytes_left_marks_the_body_and_reads_small() {
        for value in [200u32, 70_000, u32::MAX] {
            let mut body = varint(value);
            body.extend([0u8; 10]);
            let left_before = body.len() as u64;
            let mut buf = CountClamp::new(Bytes::from(body));
            let (read, taken) = read_varint(&mut buf);
            assert!(read <= left_before + 1, "{value} read as {read}");
            assert!(taken <= varint(value).len(), "{value}");
            assert!(buf.over_claimed(), "{value}");
        }
    }

    #[test]
    fn a_big_varint_inside_another_run_of_single_bytes_is_caught_where_it_starts() {
        // A Boolean byte with its high bit set, then a varint claiming 2^31: the run from the
        // Boolean looks small, the varint from the next byte does not.
        let mut body = vec![0x81];
        body.extend(varint(1 << 31));
        body.extend([0u8; 8]);
        let mut buf = CountClamp::new(Bytes::from(body));
        let _boolean = buf.try_get_u8().unwrap();
        let (read, _) = read_varint(&mut buf);
        assert!(read <= 14, "read {read}");
        assert!(buf.over_claimed());
    }

    /// A records section of `records` built by the codec's own encoder.
    fn section(records: &[kafka_protocol::records::Record]) -> (Bytes, i32) {
        use kafka_protocol::records::{
            Compression, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
        };
        let mut batch = bytes::BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut batch, records, &options).unwrap();
        let mut batch = batch.freeze();
        let info = RecordBatchDecoder::decode_batch_info(&mut batch.clone()).unwrap();
        // The records start after the 61-byte batch header of format v2.
        (batch.split_off(61), info[0].record_count)
    }

    fn record(headers: usize) -> kafka_protocol::records::Record {
        use kafka_protocol::records::{Record, TimestampType};
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: -1,
            timestamp: 1_700_000_000_000,
            key: Some(Bytes::from_static(b"key")),
            value: Some(Bytes::from_static(b"value")),
            headers: (0..headers)
                .map(|i| (i.to_string().into(), Some(Bytes::from_static(b"v"))))
                .collect(),
        }
    }

    #[test]
    fn records_the_codec_wrote_pass_the_check() {
        let (section, claimed) = section(&[record(0), record(3), record(1)]);
        assert_eq!(claimed, 3);
        check_records(&section, claimed).unwrap();
    }

    #[test]
    fn a_claimed_record_count_or_header_count_beyond_the_bytes_is_refused() {
        let (section, claimed) = section(&[record(2)]);
        for wrong in [0, 2, i32::MAX, -1] {
            assert!(check_records(&section, wrong).is_err(), "{wrong}");
        }
        // The header count is the byte after the value; make it claim 2^30 headers.
        let mut forged = section.to_vec();
        let at = forged.len() - (2 * 3 + 2) - 1;
        assert_eq!(forged[at], 4, "the zigzag header count of 2");
        let mut tail = forged.split_off(at + 1);
        forged.truncate(at);
        forged.extend([0x80, 0x80, 0x80, 0x80, 0x08]);
        forged.append(&mut tail);
        forged[0] += 8; // the record's length grows by the four bytes added (zigzag: 2 per 1)
        let refused = check_records(&forged, claimed).unwrap_err();
        assert!(refused.to_string().contains("headers"), "{refused}");
    }

    #[test]
    fn an_int32_is_held_to_the_bytes_after_it_and_other_reads_are_untouched() {
        let mut body = bytes::BytesMut::new();
        body.put_i32(i32::MAX);
        body.put_i16(-7);
        body.put_i32(-1);
        body.put_i32(2);
        let mut buf = CountClamp::new(body.freeze());
        assert_eq!(buf.try_get_i32().unwrap(), 11);
        assert_eq!(buf.try_get_i16().unwrap(), -7);
        assert_eq!(buf.try_get_i32().unwrap(), -1);
        assert_eq!(buf.try_get_i32().unwrap(), 1);
    }
}
