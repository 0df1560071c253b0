//! The AMQP 1.0 type encoding, as far as the hot performatives need it: a strict [`Reader`]
//! that can also skip any well-formed value, and writers for the primitives they carry.
//!
//! Skipping relies on the encoding's rule that a constructor's high nibble fixes the width of
//! what follows (`0x4_` nothing, `0x5_` one byte, … `0xa_`/`0xb_` a one- or four-byte length,
//! `0xc_`/`0xd_` a sized compound, `0xe_`/`0xf_` a sized array); only the constructors the
//! specification defines are accepted.

use thiserror::Error;

/// Bytes that are not the AMQP encoding expected here.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("malformed AMQP encoding at byte {at}: {reason}")]
pub struct CodecError {
    /// Offset into the input where the problem was found.
    pub at: usize,
    /// What was wrong.
    pub reason: &'static str,
}

/// How deep described values may nest inside descriptors while skipping.
const DESCRIBED_DEPTH_MAX: usize = 8;

/// A cursor over encoded AMQP values. Every read checks bounds and constructors.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, at: 0 }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.at
    }

    /// The bytes not yet consumed.
    pub fn rest(&self) -> &'a [u8] {
        &self.bytes[self.at..]
    }

    /// An error at the current position.
    pub fn error(&self, reason: &'static str) -> CodecError {
        CodecError {
            at: self.at,
            reason,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| self.error("value runs past the end of its frame"))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn byte(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }

    fn peek(&self) -> Result<u8, CodecError> {
        self.bytes
            .get(self.at)
            .copied()
            .ok_or_else(|| self.error("value expected, found the end of the frame"))
    }

    fn be_u32(&mut self) -> Result<u32, CodecError> {
        let bytes = self.take(4)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn be_u64(&mut self) -> Result<u64, CodecError> {
        let bytes = self.take(8)?;
        let mut array = [0; 8];
        array.copy_from_slice(bytes);
        Ok(u64::from_be_bytes(array))
    }

    /// Consumes a null if one is next; tells whether it did.
    pub fn null(&mut self) -> Result<bool, CodecError> {
        if self.peek()? == 0x40 {
            self.at += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// A `uint`.
    pub fn uint(&mut self) -> Result<u32, CodecError> {
        match self.byte()? {
            0x43 => Ok(0),
            0x52 => Ok(u32::from(self.byte()?)),
            0x70 => self.be_u32(),
            _ => Err(self.back(1, "a uint expected")),
        }
    }

    /// A `uint` or null.
    pub fn optional_uint(&mut self) -> Result<Option<u32>, CodecError> {
        if self.null()? {
            return Ok(None);
        }
        self.uint().map(Some)
    }

    /// A `ulong`.
    pub fn ulong(&mut self) -> Result<u64, CodecError> {
        match self.byte()? {
            0x44 => Ok(0),
            0x53 => Ok(u64::from(self.byte()?)),
            0x80 => self.be_u64(),
            _ => Err(self.back(1, "a ulong expected")),
        }
    }

    /// A `boolean` or null.
    pub fn optional_bool(&mut self) -> Result<Option<bool>, CodecError> {
        match self.byte()? {
            0x40 => Ok(None),
            0x41 => Ok(Some(true)),
            0x42 => Ok(Some(false)),
            0x56 => match self.byte()? {
                0 => Ok(Some(false)),
                1 => Ok(Some(true)),
                _ => Err(self.back(1, "a boolean byte must be 0 or 1")),
            },
            _ => Err(self.back(1, "a boolean expected")),
        }
    }

    /// A `ubyte` or null.
    pub fn optional_ubyte(&mut self) -> Result<Option<u8>, CodecError> {
        match self.byte()? {
            0x40 => Ok(None),
            0x50 => Ok(Some(self.byte()?)),
            _ => Err(self.back(1, "a ubyte expected")),
        }
    }

    /// A `binary` or null, borrowed.
    pub fn optional_binary(&mut self) -> Result<Option<&'a [u8]>, CodecError> {
        let length = match self.byte()? {
            0x40 => return Ok(None),
            0xa0 => usize::from(self.byte()?),
            0xb0 => self.be_u32()? as usize,
            _ => return Err(self.back(1, "a binary expected")),
        };
        self.take(length).map(Some)
    }

    /// Any one value or null, skipped; returns its encoding (`None` for null).
    pub fn optional_raw(&mut self) -> Result<Option<&'a [u8]>, CodecError> {
        if self.null()? {
            return Ok(None);
        }
        let start = self.at;
        self.skip(0)?;
        Ok(Some(&self.bytes[start..self.at]))
    }

    /// The header of a `list`: its element count, and the offset its elements end at.
    pub fn list_header(&mut self) -> Result<(u32, usize), CodecError> {
        let (size, count_width) = match self.byte()? {
            0x45 => return Ok((0, self.at)),
            0xc0 => (usize::from(self.byte()?), 1),
            0xd0 => (self.be_u32()? as usize, 4),
            _ => return Err(self.back(1, "a list expected")),
        };
        let end = self
            .at
            .checked_add(size)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| self.error("list runs past the end of its frame"))?;
        if size < count_width {
            return Err(self.error("list size smaller than its count"));
        }
        let count = if count_width == 1 {
            u32::from(self.byte()?)
        } else {
            self.be_u32()?
        };
        Ok((count, end))
    }

    /// The descriptor of a described value: its numeric code (symbolic descriptors of the
    /// performatives and delivery states are translated to theirs).
    pub fn descriptor(&mut self) -> Result<u64, CodecError> {
        if self.byte()? != 0x00 {
            return Err(self.back(1, "a described value expected"));
        }
        match self.peek()? {
            0xa3 | 0xb3 => {
                let length = if self.byte()? == 0xa3 {
                    usize::from(self.byte()?)
                } else {
                    self.be_u32()? as usize
                };
                let name = self.take(length)?;
                symbolic_code(name).ok_or_else(|| self.error("unknown symbolic descriptor"))
            }
            _ => self.ulong(),
        }
    }

    /// Skips one well-formed value of any type.
    pub fn skip(&mut self, depth: usize) -> Result<(), CodecError> {
        let constructor = self.byte()?;
        let fixed = match constructor {
            0x00 => {
                if depth >= DESCRIBED_DEPTH_MAX {
                    return Err(self.back(1, "described values nested too deeply"));
                }
                self.skip(depth + 1)?;
                return self.skip(depth + 1);
            }
            0x40..=0x45 => 0,
            0x50..=0x56 => 1,
            0x60 | 0x61 => 2,
            0x70..=0x74 => 4,
            0x80..=0x84 => 8,
            0x94 | 0x98 => 16,
            0xa0 | 0xa1 | 0xa3 | 0xc0 | 0xc1 | 0xe0 => usize::from(self.byte()?),
            0xb0 | 0xb1 | 0xb3 | 0xd0 | 0xd1 | 0xf0 => self.be_u32()? as usize,
            _ => return Err(self.back(1, "unknown type constructor")),
        };
        self.take(fixed).map(drop)
    }

    /// Fails unless every byte up to `end` has been consumed (a list's elements read whole).
    pub fn expect_at(&self, end: usize, reason: &'static str) -> Result<(), CodecError> {
        if self.at == end {
            Ok(())
        } else {
            Err(self.error(reason))
        }
    }

    /// Skips everything up to `end` (remaining list elements), each a well-formed value.
    pub fn skip_to(&mut self, end: usize) -> Result<(), CodecError> {
        while self.at < end {
            self.skip(0)?;
        }
        self.expect_at(end, "list elements overrun the list's size")
    }

    /// Steps back `n` bytes (to blame a constructor) and makes the error there.
    fn back(&mut self, n: usize, reason: &'static str) -> CodecError {
        self.at -= n;
        self.error(reason)
    }
}

/// The numeric code of a symbolic descriptor this crate understands.
fn symbolic_code(name: &[u8]) -> Option<u64> {
    Some(match name {
        b"amqp:open:list" => 0x10,
        b"amqp:begin:list" => 0x11,
        b"amqp:attach:list" => 0x12,
        b"amqp:flow:list" => 0x13,
        b"amqp:transfer:list" => 0x14,
        b"amqp:disposition:list" => 0x15,
        b"amqp:detach:list" => 0x16,
        b"amqp:end:list" => 0x17,
        b"amqp:close:list" => 0x18,
        b"amqp:received:list" => 0x23,
        b"amqp:accepted:list" => 0x24,
        b"amqp:rejected:list" => 0x25,
        b"amqp:released:list" => 0x26,
        b"amqp:modified:list" => 0x27,
        _ => return None,
    })
}

/// Writes a `uint` in its shortest form.
pub fn write_uint(out: &mut Vec<u8>, value: u32) {
    match value {
        0 => out.push(0x43),
        1..=255 => out.extend_from_slice(&[0x52, value as u8]),
        _ => {
            out.push(0x70);
            out.extend_from_slice(&value.to_be_bytes());
        }
    }
}

/// Writes a `uint` or null.
pub fn write_optional_uint(out: &mut Vec<u8>, value: Option<u32>) {
    match value {
        Some(value) => write_uint(out, value),
        None => out.push(0x40),
    }
}

/// Writes a `boolean`.
pub fn write_bool(out: &mut Vec<u8>, value: bool) {
    out.push(if value { 0x41 } else { 0x42 });
}

/// Writes a `boolean` or null.
pub fn write_optional_bool(out: &mut Vec<u8>, value: Option<bool>) {
    match value {
        Some(value) => write_bool(out, value),
        None => out.push(0x40),
    }
}

/// Writes a `ubyte` or null.
pub fn write_optional_ubyte(out: &mut Vec<u8>, value: Option<u8>) {
    match value {
        Some(value) => out.extend_from_slice(&[0x50, value]),
        None => out.push(0x40),
    }
}

/// Writes a `binary` or null.
pub fn write_optional_binary(out: &mut Vec<u8>, value: Option<&[u8]>) {
    match value {
        None => out.push(0x40),
        Some(bytes) => {
            match u8::try_from(bytes.len()) {
                Ok(length) => out.extend_from_slice(&[0xa0, length]),
                Err(_) => {
                    let length = u32::try_from(bytes.len()).expect("a binary fits a frame");
                    out.push(0xb0);
                    out.extend_from_slice(&length.to_be_bytes());
                }
            }
            out.extend_from_slice(bytes);
        }
    }
}

/// Writes an already-encoded value, or null.
pub fn write_optional_raw(out: &mut Vec<u8>, value: Option<&[u8]>) {
    match value {
        Some(encoded) => out.extend_from_slice(encoded),
        None => out.push(0x40),
    }
}

/// Writes a described list with descriptor `code`: `fields` writes exactly `count` elements.
/// The list is a `list8` when it fits, else a `list32`.
pub fn write_described_list(
    out: &mut Vec<u8>,
    code: u8,
    count: u8,
    fields: impl FnOnce(&mut Vec<u8>),
) {
    out.extend_from_slice(&[0x00, 0x53, code]);
    let header_at = out.len();
    // Room for a list32 header (constructor, size, count); moved down if list8 suffices.
    out.extend_from_slice(&[0xd0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let elements_at = out.len();
    fields(out);
    let elements = out.len() - elements_at;
    if elements < usize::from(u8::MAX) {
        out[header_at] = 0xc0;
        out[header_at + 1] = (elements + 1) as u8;
        out[header_at + 2] = count;
        out.copy_within(elements_at.., header_at + 3);
        out.truncate(header_at + 3 + elements);
    } else {
        let size = u32::try_from(elements + 4).expect("a performative fits a frame");
        out[header_at + 1..header_at + 5].copy_from_slice(&size.to_be_bytes());
        out[header_at + 5..header_at + 9].copy_from_slice(&u32::from(count).to_be_bytes());
    }
}
