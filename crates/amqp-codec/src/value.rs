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

/// How deeply lists, maps, arrays and described values may nest in a value that
/// [`Reader::skip_checked`] walks (the value itself is at depth 0).
pub const NESTING_DEPTH_MAX: usize = 32;

/// Which arrays [`Reader::skip_checked_with`] accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrayRule {
    /// Every array the specification allows.
    Any,
    /// Only arrays of primitive elements (no lists, maps, arrays or described values), and an
    /// empty array only without an element constructor: the arrays `serde_amqp` 0.18 frames
    /// as the specification does. It misframes the others — it reads past the first element
    /// of an array of lists, leaves an empty array's constructor to be read as the next value
    /// — and a misframed value can have it read a binary's contents as nested values, deeply
    /// enough to overflow the stack.
    Primitive,
}

/// Checks that `bytes` are a sequence of well-formed AMQP values all the way down, with only
/// the arrays [`ArrayRule::Primitive`] allows: what untrusted bytes must pass before they reach
/// `serde_amqp` (0.18), which trusts the sizes and counts it reads. On bytes that lie it can
/// panic (an odd map count), or misframe an array and read a binary's contents as values nested
/// deeply enough to overflow the stack. Bytes that pass it reads as the specification does.
pub fn check_well_formed(bytes: &[u8]) -> Result<(), CodecError> {
    let mut reader = Reader::new(bytes);
    while !reader.is_at_end() {
        reader.skip_checked_with(0, ArrayRule::Primitive)?;
    }
    Ok(())
}

/// One primitive value — anything but a list, map, array or described value — as
/// [`Reader::primitive`] reads it. Variable-width values are borrowed from the input.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Primitive<'a> {
    /// `null`.
    Null,
    /// `boolean`.
    Bool(bool),
    /// `ubyte`.
    Ubyte(u8),
    /// `ushort`.
    Ushort(u16),
    /// `uint`, from any of its encodings.
    Uint(u32),
    /// `ulong`, from any of its encodings.
    Ulong(u64),
    /// `byte`.
    Byte(i8),
    /// `short`.
    Short(i16),
    /// `int`, from any of its encodings.
    Int(i32),
    /// `long`, from any of its encodings.
    Long(i64),
    /// `float`.
    Float(f32),
    /// `double`.
    Double(f64),
    /// `decimal32`, its bytes as encoded.
    Decimal32([u8; 4]),
    /// `decimal64`, its bytes as encoded.
    Decimal64([u8; 8]),
    /// `decimal128`, its bytes as encoded.
    Decimal128([u8; 16]),
    /// `char`: a Unicode scalar value.
    Char(char),
    /// `timestamp`: milliseconds since the Unix epoch.
    Timestamp(i64),
    /// `uuid`, its 16 bytes as encoded.
    Uuid([u8; 16]),
    /// `binary`.
    Binary(&'a [u8]),
    /// `string`, checked to be UTF-8.
    String(&'a str),
    /// `symbol`, checked to be UTF-8 (see [`Reader::symbol`]).
    Symbol(&'a str),
}

/// A cursor over encoded AMQP values. Every read checks bounds and constructors.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

/// A `symbol`'s bytes (found at `start`) as text, checked to be UTF-8. (The specification limits
/// symbols to ASCII; the reference decoder does not, and producers do send UTF-8 content types,
/// so refusing them would fail messages the rest of the world reads.)
#[inline]
fn symbol_text(start: usize, bytes: &[u8]) -> Result<&str, CodecError> {
    std::str::from_utf8(bytes).map_err(|_| CodecError {
        at: start,
        reason: "a symbol must be UTF-8",
    })
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
    #[inline]
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

    #[inline]
    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| self.error("value runs past the end of its frame"))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    #[inline]
    fn octet(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }

    #[inline]
    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let bytes = self.take(N)?;
        let mut array = [0; N];
        array.copy_from_slice(bytes);
        Ok(array)
    }

    #[inline]
    fn peek(&self) -> Result<u8, CodecError> {
        self.bytes
            .get(self.at)
            .copied()
            .ok_or_else(|| self.error("value expected, found the end of the frame"))
    }

    #[inline]
    fn be_u32(&mut self) -> Result<u32, CodecError> {
        let bytes = self.take(4)?;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    #[inline]
    fn be_u64(&mut self) -> Result<u64, CodecError> {
        let bytes = self.take(8)?;
        let mut array = [0; 8];
        array.copy_from_slice(bytes);
        Ok(u64::from_be_bytes(array))
    }

    /// Consumes a null if one is next; tells whether it did.
    #[inline]
    pub fn null(&mut self) -> Result<bool, CodecError> {
        if self.peek()? == 0x40 {
            self.at += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// A `uint`.
    #[inline]
    pub fn uint(&mut self) -> Result<u32, CodecError> {
        match self.octet()? {
            0x43 => Ok(0),
            0x52 => Ok(u32::from(self.octet()?)),
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
    #[inline]
    pub fn ulong(&mut self) -> Result<u64, CodecError> {
        match self.octet()? {
            0x44 => Ok(0),
            0x53 => Ok(u64::from(self.octet()?)),
            0x80 => self.be_u64(),
            _ => Err(self.back(1, "a ulong expected")),
        }
    }

    /// A `boolean` or null.
    pub fn optional_bool(&mut self) -> Result<Option<bool>, CodecError> {
        match self.octet()? {
            0x40 => Ok(None),
            0x41 => Ok(Some(true)),
            0x42 => Ok(Some(false)),
            0x56 => self.boolean_octet().map(Some),
            _ => Err(self.back(1, "a boolean expected")),
        }
    }

    /// A `ubyte` or null.
    pub fn optional_ubyte(&mut self) -> Result<Option<u8>, CodecError> {
        match self.octet()? {
            0x40 => Ok(None),
            0x50 => Ok(Some(self.octet()?)),
            _ => Err(self.back(1, "a ubyte expected")),
        }
    }

    /// A `binary` or null, borrowed.
    pub fn optional_binary(&mut self) -> Result<Option<&'a [u8]>, CodecError> {
        let length = match self.octet()? {
            0x40 => return Ok(None),
            0xa0 => usize::from(self.octet()?),
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
    #[inline]
    pub fn list_header(&mut self) -> Result<(u32, usize), CodecError> {
        match self.octet()? {
            0x45 => Ok((0, self.at)),
            0xc0 => self.compound_header(1),
            0xd0 => self.compound_header(4),
            _ => Err(self.back(1, "a list expected")),
        }
    }

    /// The header of a `map`: its count (keys and values together, so always even), and the
    /// offset its entries end at.
    #[inline]
    pub fn map_header(&mut self) -> Result<(u32, usize), CodecError> {
        let start = self.at;
        let (count, end) = match self.octet()? {
            0xc1 => self.compound_header(1)?,
            0xd1 => self.compound_header(4)?,
            _ => return Err(self.back(1, "a map expected")),
        };
        if count % 2 != 0 {
            return Err(CodecError {
                at: start,
                reason: "a map's count must be even",
            });
        }
        Ok((count, end))
    }

    /// After a list's or map's constructor: its size and count (each `count_width` bytes wide);
    /// returns the count and the offset the elements end at.
    #[inline]
    fn compound_header(&mut self, count_width: usize) -> Result<(u32, usize), CodecError> {
        let size = if count_width == 1 {
            usize::from(self.octet()?)
        } else {
            self.be_u32()? as usize
        };
        let end = self
            .at
            .checked_add(size)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| self.error("compound value runs past the end of its frame"))?;
        if size < count_width {
            return Err(self.error("compound value's size smaller than its count"));
        }
        let count = if count_width == 1 {
            u32::from(self.octet()?)
        } else {
            self.be_u32()?
        };
        Ok((count, end))
    }

    /// The descriptor of a described value: its numeric code (symbolic descriptors of the
    /// performatives and delivery states are translated to theirs).
    #[inline]
    pub fn descriptor(&mut self) -> Result<u64, CodecError> {
        if self.octet()? != 0x00 {
            return Err(self.back(1, "a described value expected"));
        }
        match self.peek()? {
            0xa3 | 0xb3 => {
                let length = if self.octet()? == 0xa3 {
                    usize::from(self.octet()?)
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
        let constructor = self.octet()?;
        let fixed = match constructor {
            0x00 => {
                // The limit `skip_checked` applies, so every value it passes skips.
                if depth >= NESTING_DEPTH_MAX {
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
            0xa0 | 0xa1 | 0xa3 | 0xc0 | 0xc1 | 0xe0 => usize::from(self.octet()?),
            0xb0 | 0xb1 | 0xb3 | 0xd0 | 0xd1 | 0xf0 => self.be_u32()? as usize,
            _ => return Err(self.back(1, "unknown type constructor")),
        };
        self.take(fixed).map(drop)
    }

    /// Fails unless every byte up to `end` has been consumed (a list's elements read whole).
    #[inline]
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

    /// The octet of a one-byte `boolean` (0x56): 0 or 1.
    fn boolean_octet(&mut self) -> Result<bool, CodecError> {
        match self.octet()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(self.back(1, "a boolean byte must be 0 or 1")),
        }
    }

    /// The length of a variable-width value after its constructor: one byte for the `0xa_`
    /// constructors, four for the `0xb_` ones.
    #[inline]
    fn variable_length(&mut self, constructor: u8) -> Result<usize, CodecError> {
        if constructor & 0xf0 == 0xa0 {
            Ok(usize::from(self.octet()?))
        } else {
            Ok(self.be_u32()? as usize)
        }
    }

    /// The UTF-8 text of a `string` after its constructor.
    #[inline]
    fn string_body(&mut self, constructor: u8) -> Result<&'a str, CodecError> {
        let length = self.variable_length(constructor)?;
        let start = self.at;
        let bytes = self.take(length)?;
        std::str::from_utf8(bytes).map_err(|_| CodecError {
            at: start,
            reason: "a string must be UTF-8",
        })
    }

    /// The text of a `symbol` after its constructor, checked as [`symbol_text`] checks it.
    #[inline]
    fn symbol_body(&mut self, constructor: u8) -> Result<&'a str, CodecError> {
        let (start, bytes) = self.symbol_bytes(constructor)?;
        symbol_text(start, bytes)
    }

    /// Where a `symbol`'s bytes start after its constructor, and the bytes, unchecked.
    #[inline]
    fn symbol_bytes(&mut self, constructor: u8) -> Result<(usize, &'a [u8]), CodecError> {
        let length = self.variable_length(constructor)?;
        let start = self.at;
        Ok((start, self.take(length)?))
    }

    /// A `char`'s four bytes, checked to be a Unicode scalar value.
    fn char_body(&mut self) -> Result<char, CodecError> {
        let code = self.be_u32()?;
        char::from_u32(code).ok_or_else(|| self.back(4, "a char must be a Unicode scalar value"))
    }

    /// The value after a primitive type's constructor; `None` (nothing consumed) if
    /// `constructor` is not a primitive one.
    #[inline]
    fn primitive_body(&mut self, constructor: u8) -> Result<Option<Primitive<'a>>, CodecError> {
        Ok(Some(match constructor {
            0x40 => Primitive::Null,
            0x41 => Primitive::Bool(true),
            0x42 => Primitive::Bool(false),
            0x56 => Primitive::Bool(self.boolean_octet()?),
            0x50 => Primitive::Ubyte(self.octet()?),
            0x60 => Primitive::Ushort(u16::from_be_bytes(self.fixed()?)),
            0x43 => Primitive::Uint(0),
            0x52 => Primitive::Uint(u32::from(self.octet()?)),
            0x70 => Primitive::Uint(self.be_u32()?),
            0x44 => Primitive::Ulong(0),
            0x53 => Primitive::Ulong(u64::from(self.octet()?)),
            0x80 => Primitive::Ulong(self.be_u64()?),
            0x51 => Primitive::Byte(i8::from_be_bytes(self.fixed()?)),
            0x61 => Primitive::Short(i16::from_be_bytes(self.fixed()?)),
            0x54 => Primitive::Int(i32::from(i8::from_be_bytes(self.fixed()?))),
            0x71 => Primitive::Int(i32::from_be_bytes(self.fixed()?)),
            0x55 => Primitive::Long(i64::from(i8::from_be_bytes(self.fixed()?))),
            0x81 => Primitive::Long(i64::from_be_bytes(self.fixed()?)),
            0x72 => Primitive::Float(f32::from_be_bytes(self.fixed()?)),
            0x82 => Primitive::Double(f64::from_be_bytes(self.fixed()?)),
            0x74 => Primitive::Decimal32(self.fixed()?),
            0x84 => Primitive::Decimal64(self.fixed()?),
            0x94 => Primitive::Decimal128(self.fixed()?),
            0x73 => Primitive::Char(self.char_body()?),
            0x83 => Primitive::Timestamp(i64::from_be_bytes(self.fixed()?)),
            0x98 => Primitive::Uuid(self.fixed()?),
            0xa0 | 0xb0 => {
                let length = self.variable_length(constructor)?;
                Primitive::Binary(self.take(length)?)
            }
            0xa1 | 0xb1 => Primitive::String(self.string_body(constructor)?),
            0xa3 | 0xb3 => Primitive::Symbol(self.symbol_body(constructor)?),
            _ => return Ok(None),
        }))
    }

    /// Any one primitive value (not a list, map, array or described value), checked: a boolean
    /// byte is 0 or 1, a char a Unicode scalar value, a string or symbol UTF-8.
    #[inline]
    pub fn primitive(&mut self) -> Result<Primitive<'a>, CodecError> {
        let constructor = self.octet()?;
        match self.primitive_body(constructor)? {
            Some(value) => Ok(value),
            None => Err(self.back(1, "a primitive value expected")),
        }
    }

    /// A `boolean`.
    #[inline]
    pub fn boolean(&mut self) -> Result<bool, CodecError> {
        match self.octet()? {
            0x41 => Ok(true),
            0x42 => Ok(false),
            0x56 => self.boolean_octet(),
            _ => Err(self.back(1, "a boolean expected")),
        }
    }

    /// A `ubyte`.
    #[inline]
    pub fn ubyte(&mut self) -> Result<u8, CodecError> {
        match self.octet()? {
            0x50 => self.octet(),
            _ => Err(self.back(1, "a ubyte expected")),
        }
    }

    /// A `ushort`.
    pub fn ushort(&mut self) -> Result<u16, CodecError> {
        match self.octet()? {
            0x60 => Ok(u16::from_be_bytes(self.fixed()?)),
            _ => Err(self.back(1, "a ushort expected")),
        }
    }

    /// A `byte` (signed).
    pub fn byte(&mut self) -> Result<i8, CodecError> {
        match self.octet()? {
            0x51 => Ok(i8::from_be_bytes(self.fixed()?)),
            _ => Err(self.back(1, "a byte expected")),
        }
    }

    /// A `short`.
    pub fn short(&mut self) -> Result<i16, CodecError> {
        match self.octet()? {
            0x61 => Ok(i16::from_be_bytes(self.fixed()?)),
            _ => Err(self.back(1, "a short expected")),
        }
    }

    /// An `int` (`int` or `smallint`).
    pub fn int(&mut self) -> Result<i32, CodecError> {
        match self.octet()? {
            0x54 => Ok(i32::from(i8::from_be_bytes(self.fixed()?))),
            0x71 => Ok(i32::from_be_bytes(self.fixed()?)),
            _ => Err(self.back(1, "an int expected")),
        }
    }

    /// A `long` (`long` or `smalllong`).
    #[inline]
    pub fn long(&mut self) -> Result<i64, CodecError> {
        match self.octet()? {
            0x55 => Ok(i64::from(i8::from_be_bytes(self.fixed()?))),
            0x81 => Ok(i64::from_be_bytes(self.fixed()?)),
            _ => Err(self.back(1, "a long expected")),
        }
    }

    /// A `float`.
    pub fn float(&mut self) -> Result<f32, CodecError> {
        match self.octet()? {
            0x72 => Ok(f32::from_be_bytes(self.fixed()?)),
            _ => Err(self.back(1, "a float expected")),
        }
    }

    /// A `double`.
    pub fn double(&mut self) -> Result<f64, CodecError> {
        match self.octet()? {
            0x82 => Ok(f64::from_be_bytes(self.fixed()?)),
            _ => Err(self.back(1, "a double expected")),
        }
    }

    /// A `char`: a Unicode scalar value.
    pub fn char(&mut self) -> Result<char, CodecError> {
        match self.octet()? {
            0x73 => self.char_body(),
            _ => Err(self.back(1, "a char expected")),
        }
    }

    /// A `timestamp`: milliseconds since the Unix epoch.
    #[inline]
    pub fn timestamp(&mut self) -> Result<i64, CodecError> {
        match self.octet()? {
            0x83 => Ok(i64::from_be_bytes(self.fixed()?)),
            _ => Err(self.back(1, "a timestamp expected")),
        }
    }

    /// A `uuid`: its 16 bytes.
    pub fn uuid(&mut self) -> Result<[u8; 16], CodecError> {
        match self.octet()? {
            0x98 => self.fixed(),
            _ => Err(self.back(1, "a uuid expected")),
        }
    }

    /// A `binary`, borrowed.
    #[inline]
    pub fn binary(&mut self) -> Result<&'a [u8], CodecError> {
        match self.octet()? {
            constructor @ (0xa0 | 0xb0) => {
                let length = self.variable_length(constructor)?;
                self.take(length)
            }
            _ => Err(self.back(1, "a binary expected")),
        }
    }

    /// A `string` (`str8` or `str32`), borrowed and checked to be UTF-8.
    #[inline]
    pub fn string(&mut self) -> Result<&'a str, CodecError> {
        match self.octet()? {
            constructor @ (0xa1 | 0xb1) => self.string_body(constructor),
            _ => Err(self.back(1, "a string expected")),
        }
    }

    /// Consumes the next value if it is a `string` (`str8` or `str32`) of exactly `known`'s
    /// bytes, and says whether it did; otherwise nothing is consumed, whatever the next bytes
    /// are. No UTF-8 check is needed: the bytes are a `str`'s. A decoder that expects the value
    /// an earlier message had (a property repeated on every event of a batch) keeps that
    /// message's copy instead of checking and copying the same text again.
    #[inline]
    pub fn take_string_equal_to(&mut self, known: &str) -> bool {
        self.take_variable_equal_to(STRING, known)
    }

    /// Consumes the next value if it is a `symbol` (`sym8` or `sym32`) of exactly `known`'s
    /// bytes, and says whether it did; otherwise nothing is consumed, whatever the next bytes
    /// are. A decoder that expects a map's keys in the order a known writer puts them (the
    /// hub's annotations) checks each with one comparison.
    #[inline]
    pub fn take_symbol_equal_to(&mut self, known: &str) -> bool {
        self.take_variable_equal_to(SYMBOL, known)
    }

    /// [`Reader::take_string_equal_to`] and [`Reader::take_symbol_equal_to`], for the type
    /// whose constructors are `constructors`.
    #[inline]
    fn take_variable_equal_to(&mut self, constructors: VariableConstructors, known: &str) -> bool {
        match self.peek_variable_bytes(constructors) {
            Some((taken, text)) if text == known.as_bytes() => {
                self.at += taken;
                true
            }
            _ => false,
        }
    }

    /// If the next value is of the variable-width type whose constructors are `(short, long)`,
    /// how many bytes it takes and its bytes, unchecked and not consumed: for the `take_*`
    /// readers, whose texts need no UTF-8 check.
    #[inline]
    fn peek_variable_bytes(
        &self,
        (short, long): VariableConstructors,
    ) -> Option<(usize, &'a [u8])> {
        let rest = &self.bytes[self.at..];
        let (header, length) = match rest {
            [code, length, ..] if *code == short => (2, usize::from(*length)),
            [code, a, b, c, d, ..] if *code == long => {
                (5, u32::from_be_bytes([*a, *b, *c, *d]) as usize)
            }
            _ => return None,
        };
        let text = rest.get(header..header + length)?;
        Some((header + length, text))
    }

    /// A `symbol` (`sym8` or `sym32`), borrowed and checked to be UTF-8: the specification
    /// limits symbols to ASCII, but the reference decoder accepts UTF-8 and producers send it
    /// (a content type, say), so this reader does too.
    #[inline]
    pub fn symbol(&mut self) -> Result<&'a str, CodecError> {
        match self.octet()? {
            constructor @ (0xa3 | 0xb3) => self.symbol_body(constructor),
            _ => Err(self.back(1, "a symbol expected")),
        }
    }

    /// Consumes the next value if it is a `string` (`str8` or `str32`) of ASCII decimal digits
    /// whose number fits a `u64` (after any number of leading zeros, as `u64::from_str` takes
    /// them), and returns the number; otherwise nothing is consumed, whatever the next bytes
    /// are. The reading side of
    /// [`ValueWriter::decimal_string`](crate::message::ValueWriter::decimal_string): Event Hubs
    /// sends offsets so. Digits are ASCII, so no UTF-8 check is needed; any other text (a sign,
    /// a space) is left for [`Reader::primitive`] and the caller's own parsing.
    #[inline]
    pub fn take_decimal_string(&mut self) -> Option<u64> {
        let (taken, digits) = self.peek_variable_bytes(STRING)?;
        if digits.is_empty() {
            return None;
        }
        // Leading zeros add nothing to the number, however many there are (`u64::from_str`
        // takes them too); what is left must be digits, at most twenty of them.
        let zeros = digits.iter().take_while(|&&digit| digit == b'0').count();
        let digits = &digits[zeros..];
        if digits.len() > 20 {
            return None;
        }
        // Nineteen digits cannot overflow a `u64` (10^19 - 1 < 2^64), so only a twentieth
        // needs the checked step.
        let (first, last) = digits.split_at(digits.len().min(19));
        let mut value: u64 = 0;
        for &digit in first {
            let digit = digit.wrapping_sub(b'0');
            if digit > 9 {
                return None;
            }
            value = value * 10 + u64::from(digit);
        }
        if let &[digit] = last {
            let digit = digit.wrapping_sub(b'0');
            if digit > 9 {
                return None;
            }
            value = value.checked_mul(10)?.checked_add(u64::from(digit))?;
        }
        self.at += taken;
        Some(value)
    }

    /// A `symbol` that may be one of `known`: `Ok(i)` when its bytes are `known[i]`'s (no UTF-8
    /// check is needed: they are a `str`'s), else `Err` with its text, checked as
    /// [`Reader::symbol`] checks it. A decoder looking for a few names among a map's keys skips
    /// checking the keys it knows, most of them on a typical message.
    #[inline]
    pub fn symbol_in(&mut self, known: &[&str]) -> Result<Result<usize, &'a str>, CodecError> {
        let constructor = self.octet()?;
        if !matches!(constructor, 0xa3 | 0xb3) {
            return Err(self.back(1, "a symbol expected"));
        }
        let (start, bytes) = self.symbol_bytes(constructor)?;
        match known.iter().position(|name| name.as_bytes() == bytes) {
            Some(i) => Ok(Ok(i)),
            None => symbol_text(start, bytes).map(Err),
        }
    }

    /// Whether every byte has been consumed.
    #[inline]
    pub fn is_at_end(&self) -> bool {
        self.at == self.bytes.len()
    }

    /// Skips one value like [`Reader::skip`], but checks all of it instead of trusting sizes:
    /// every primitive inside is read as [`Reader::primitive`] reads it, a list's or map's
    /// elements are exactly its count and fill exactly its size, a map's count is even, an
    /// array's elements all follow its one element constructor and fill exactly its size, and
    /// lists, maps, arrays and described values nest at most [`NESTING_DEPTH_MAX`] deep
    /// (`depth` is the nesting the value starts at). Recursion is bounded by that depth, and
    /// the work by the input's length.
    pub fn skip_checked(&mut self, depth: usize) -> Result<(), CodecError> {
        self.skip_checked_with(depth, ArrayRule::Any)
    }

    /// [`Reader::skip_checked`], accepting only the arrays `arrays` allows.
    pub fn skip_checked_with(&mut self, depth: usize, arrays: ArrayRule) -> Result<(), CodecError> {
        let constructor = self.octet()?;
        self.checked_body(constructor, depth, arrays)
    }

    /// What follows `constructor` (already consumed), checked as [`Reader::skip_checked`] says.
    fn checked_body(
        &mut self,
        constructor: u8,
        depth: usize,
        arrays: ArrayRule,
    ) -> Result<(), CodecError> {
        match constructor {
            0x00 => {
                self.nest(depth)?;
                self.skip_checked_with(depth + 1, arrays)?;
                self.skip_checked_with(depth + 1, arrays)
            }
            0x45 => Ok(()),
            0xc0 | 0xd0 | 0xc1 | 0xd1 => {
                self.nest(depth)?;
                let start = self.at;
                let (count, end) =
                    self.compound_header(if constructor & 0xf0 == 0xc0 { 1 } else { 4 })?;
                if constructor & 0x0f == 1 && count % 2 != 0 {
                    return Err(CodecError {
                        at: start,
                        reason: "a map's count must be even",
                    });
                }
                let mut elements = self.bounded(end);
                for _ in 0..count {
                    // Each element takes at least its constructor's byte, so this loop ends
                    // within the compound's size.
                    elements.skip_checked_with(depth + 1, arrays)?;
                }
                elements.expect_at(end, "compound value's elements do not fill its size")?;
                self.at = end;
                Ok(())
            }
            0xe0 | 0xf0 => {
                self.nest(depth)?;
                self.checked_array(if constructor == 0xe0 { 1 } else { 4 }, depth, arrays)
            }
            _ => match self.primitive_body(constructor)? {
                Some(_) => Ok(()),
                None => Err(self.back(1, "unknown type constructor")),
            },
        }
    }

    /// An array's body after its constructor, checked.
    fn checked_array(
        &mut self,
        count_width: usize,
        depth: usize,
        arrays: ArrayRule,
    ) -> Result<(), CodecError> {
        let (count, end) = self.compound_header(count_width)?;
        let mut elements = self.bounded(end);
        if count == 0 && elements.is_at_end() {
            // An empty array written without an element constructor.
            self.at = end;
            return Ok(());
        }
        if count == 0 && arrays == ArrayRule::Primitive {
            return Err(elements.error("an empty array with an element constructor"));
        }
        // The element constructor, which may itself be described.
        let mut element = elements.octet()?;
        let mut element_depth = depth + 1;
        while element == 0x00 {
            if arrays == ArrayRule::Primitive {
                return Err(elements.back(1, "an array of described values"));
            }
            elements.nest(element_depth)?;
            elements.skip_checked_with(element_depth + 1, arrays)?;
            element_depth += 1;
            element = elements.octet()?;
        }
        match element {
            0x45 | 0xc0 | 0xc1 | 0xd0 | 0xd1 | 0xe0 | 0xf0 if arrays == ArrayRule::Primitive => {
                return Err(elements.back(1, "an array of compound values"));
            }
            // Zero-width elements: the count costs nothing to check.
            0x40..=0x45 => {}
            _ => {
                for _ in 0..count {
                    // Every other element takes at least one byte, so this loop ends within
                    // the array's size.
                    elements.checked_body(element, element_depth, arrays)?;
                }
            }
        }
        elements.expect_at(end, "array elements do not fill its size")?;
        self.at = end;
        Ok(())
    }

    /// Fails if a compound or described value at `depth` would nest too deeply.
    fn nest(&self, depth: usize) -> Result<(), CodecError> {
        if depth >= NESTING_DEPTH_MAX {
            return Err(self.error("values nested too deeply"));
        }
        Ok(())
    }

    /// A reader over the same bytes, from the current position, that ends at `end`.
    fn bounded(&self, end: usize) -> Reader<'a> {
        Reader {
            bytes: &self.bytes[..end],
            at: self.at,
        }
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
    let header_at = start_compound(out);
    fields(out);
    finish_compound(out, header_at, u32::from(count), LIST);
}

/// A list's or a map's constructors: the compound8 one and the compound32 one.
pub(crate) type CompoundConstructors = (u8, u8);
/// `list8` and `list32`.
pub(crate) const LIST: CompoundConstructors = (0xc0, 0xd0);
/// `map8` and `map32`.
pub(crate) const MAP: CompoundConstructors = (0xc1, 0xd1);

/// A variable-width type's constructors: the one with a one-byte length and the one with four.
type VariableConstructors = (u8, u8);
/// `str8-utf8` and `str32-utf8`.
const STRING: VariableConstructors = (0xa1, 0xb1);
/// `sym8` and `sym32`.
const SYMBOL: VariableConstructors = (0xa3, 0xb3);

/// Reserves a compound8 header (constructor, size, count) for a list or map whose elements
/// follow; returns where it is, for [`finish_compound`].
#[inline]
pub(crate) fn start_compound(out: &mut Vec<u8>) -> usize {
    let header_at = out.len();
    out.extend_from_slice(&[0, 0, 0]);
    header_at
}

/// Writes the header reserved at `header_at` for the `count` elements written after it: a
/// compound8 one where size and count fit a byte (nearly always: a performative, a message's
/// annotations), else a compound32 one, the elements moved up to make room.
pub(crate) fn finish_compound(
    out: &mut Vec<u8>,
    header_at: usize,
    count: u32,
    (small, large): CompoundConstructors,
) {
    let elements = out.len() - (header_at + 3);
    if elements < usize::from(u8::MAX) && count <= u32::from(u8::MAX) {
        out[header_at] = small;
        out[header_at + 1] = (elements + 1) as u8;
        out[header_at + 2] = count as u8;
    } else {
        let size = u32::try_from(elements + 4).expect("a compound fits a message or frame");
        let mut header = [0u8; 9];
        header[0] = large;
        header[1..5].copy_from_slice(&size.to_be_bytes());
        header[5..9].copy_from_slice(&count.to_be_bytes());
        out.splice(header_at..header_at + 3, header);
    }
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp_types::primitives::{
        Array, Binary, Dec32, Dec64, Dec128, OrderedMap, Symbol, Timestamp, Uuid, Value,
    };
    use proptest::collection::vec;
    use proptest::prelude::*;
    use serde_amqp::described::Described;
    use serde_amqp::descriptor::Descriptor;

    use super::*;

    /// `text` as a `str32`, the wide form the reference writes only for long strings.
    fn str32(text: &str) -> Vec<u8> {
        let mut wide = vec![0xb1];
        wide.extend_from_slice(&(text.len() as u32).to_be_bytes());
        wide.extend_from_slice(text.as_bytes());
        wide
    }

    /// The reference value a primitive stands for.
    fn as_value(primitive: Primitive<'_>) -> Value {
        match primitive {
            Primitive::Null => Value::Null,
            Primitive::Bool(v) => Value::Bool(v),
            Primitive::Ubyte(v) => Value::Ubyte(v),
            Primitive::Ushort(v) => Value::Ushort(v),
            Primitive::Uint(v) => Value::Uint(v),
            Primitive::Ulong(v) => Value::Ulong(v),
            Primitive::Byte(v) => Value::Byte(v),
            Primitive::Short(v) => Value::Short(v),
            Primitive::Int(v) => Value::Int(v),
            Primitive::Long(v) => Value::Long(v),
            Primitive::Float(v) => Value::Float(v.into()),
            Primitive::Double(v) => Value::Double(v.into()),
            Primitive::Decimal32(v) => Value::Decimal32(Dec32::from(v)),
            Primitive::Decimal64(v) => Value::Decimal64(Dec64::from(v)),
            Primitive::Decimal128(v) => Value::Decimal128(Dec128::from(v)),
            Primitive::Char(v) => Value::Char(v),
            Primitive::Timestamp(v) => Value::Timestamp(Timestamp::from_milliseconds(v)),
            Primitive::Uuid(v) => Value::Uuid(Uuid::from(v)),
            Primitive::Binary(v) => Value::Binary(Binary::from(v.to_vec())),
            Primitive::String(v) => Value::String(v.to_owned()),
            Primitive::Symbol(v) => Value::Symbol(Symbol::from(v)),
        }
    }

    /// Every primitive the reference can hold.
    fn primitive_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<u8>().prop_map(Value::Ubyte),
            any::<u16>().prop_map(Value::Ushort),
            any::<u32>().prop_map(Value::Uint),
            any::<u64>().prop_map(Value::Ulong),
            any::<i8>().prop_map(Value::Byte),
            any::<i16>().prop_map(Value::Short),
            any::<i32>().prop_map(Value::Int),
            any::<i64>().prop_map(Value::Long),
            any::<f32>().prop_map(|v| Value::Float(v.into())),
            any::<f64>().prop_map(|v| Value::Double(v.into())),
            any::<[u8; 4]>().prop_map(|v| Value::Decimal32(Dec32::from(v))),
            any::<[u8; 8]>().prop_map(|v| Value::Decimal64(Dec64::from(v))),
            any::<[u8; 16]>().prop_map(|v| Value::Decimal128(Dec128::from(v))),
            any::<char>().prop_map(Value::Char),
            any::<i64>().prop_map(|v| Value::Timestamp(Timestamp::from_milliseconds(v))),
            any::<[u8; 16]>().prop_map(|v| Value::Uuid(Uuid::from(v))),
            vec(any::<u8>(), 0..300).prop_map(|v| Value::Binary(Binary::from(v))),
            ".{0,300}".prop_map(Value::String),
            ".{0,300}".prop_map(|v| Value::Symbol(Symbol::from(v))),
        ]
    }

    /// An array of one primitive type. Never empty and its strings ASCII: serde_amqp 0.18
    /// writes a string's length in an array in chars rather than bytes, and writes the values
    /// after an array inside a list or map wrongly (and after an empty one, as arrays too).
    fn array_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            vec(any::<i64>().prop_map(Value::Long), 1..20),
            vec(any::<bool>().prop_map(Value::Bool), 1..20),
            vec(any::<char>().prop_map(Value::Char), 1..20),
            vec(
                "[a-z]{0,20}".prop_map(|s| Value::Symbol(Symbol::from(s))),
                1..20
            ),
            vec("[ -~]{0,20}".prop_map(Value::String), 1..20),
        ]
        .prop_map(|elements| Value::Array(Array(elements)))
    }

    /// A map key of a type maps are keyed by (serde_amqp 0.18 writes the entry after some
    /// others, a timestamp key for one, wrongly or not at all).
    fn map_key() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<u64>().prop_map(Value::Ulong),
            any::<i64>().prop_map(Value::Long),
            any::<i32>().prop_map(Value::Int),
            ".{0,20}".prop_map(Value::String),
            "[ -~]{0,20}".prop_map(|v| Value::Symbol(Symbol::from(v))),
        ]
    }

    /// Any value nested in lists, maps and described values (arrays stand alone; see
    /// [`array_value`]).
    fn nested_value() -> impl Strategy<Value = Value> {
        primitive_value().prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..8).prop_map(Value::List),
                vec((map_key(), inner.clone()), 0..8).prop_map(|entries| Value::Map(
                    entries.into_iter().collect::<OrderedMap<_, _>>()
                )),
                (any::<u64>(), inner).prop_map(|(code, value)| {
                    Value::Described(Box::new(Described {
                        descriptor: Descriptor::Code(code),
                        value,
                    }))
                }),
            ]
        })
    }

    /// A primitive encoded by hand in any of the forms the specification allows — including
    /// invalid contents (a boolean byte of 2, a surrogate char, bytes that are not UTF-8).
    fn hand_encoded() -> impl Strategy<Value = Vec<u8>> {
        let fixed = prop_oneof![
            Just((0x40u8, 0usize)),
            Just((0x41, 0)),
            Just((0x42, 0)),
            Just((0x43, 0)),
            Just((0x44, 0)),
            Just((0x56, 1)),
            Just((0x50, 1)),
            Just((0x51, 1)),
            Just((0x52, 1)),
            Just((0x53, 1)),
            Just((0x54, 1)),
            Just((0x55, 1)),
            Just((0x60, 2)),
            Just((0x61, 2)),
            Just((0x70, 4)),
            Just((0x71, 4)),
            Just((0x72, 4)),
            Just((0x73, 4)),
            Just((0x74, 4)),
            Just((0x80, 8)),
            Just((0x81, 8)),
            Just((0x82, 8)),
            Just((0x83, 8)),
            Just((0x84, 8)),
            Just((0x94, 16)),
            Just((0x98, 16)),
        ]
        .prop_flat_map(|(constructor, width)| {
            vec(any::<u8>(), width).prop_map(move |body| {
                let mut out = vec![constructor];
                out.extend(body);
                out
            })
        });
        let variable = (
            prop_oneof![Just(0xa0u8), Just(0xa1), Just(0xa3)],
            any::<bool>(),
            prop_oneof![
                vec(any::<u8>(), 0..40),
                ".{0,40}".prop_map(String::into_bytes),
                "[ -~]{0,40}".prop_map(String::into_bytes),
            ],
        )
            .prop_map(|(constructor, wide, body)| {
                let mut out = Vec::new();
                if wide {
                    out.push(constructor + 0x10);
                    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
                } else {
                    out.push(constructor);
                    out.push(body.len() as u8);
                }
                out.extend(body);
                out
            });
        prop_oneof![fixed, variable]
    }

    /// Reads `value`'s encoding with the typed reader for its type.
    fn read_typed(reader: &mut Reader<'_>, value: &Value) -> Result<Value, CodecError> {
        Ok(match value {
            Value::Null => {
                assert!(reader.null()?);
                Value::Null
            }
            Value::Bool(_) => Value::Bool(reader.boolean()?),
            Value::Ubyte(_) => Value::Ubyte(reader.ubyte()?),
            Value::Ushort(_) => Value::Ushort(reader.ushort()?),
            Value::Uint(_) => Value::Uint(reader.uint()?),
            Value::Ulong(_) => Value::Ulong(reader.ulong()?),
            Value::Byte(_) => Value::Byte(reader.byte()?),
            Value::Short(_) => Value::Short(reader.short()?),
            Value::Int(_) => Value::Int(reader.int()?),
            Value::Long(_) => Value::Long(reader.long()?),
            Value::Float(_) => Value::Float(reader.float()?.into()),
            Value::Double(_) => Value::Double(reader.double()?.into()),
            Value::Char(_) => Value::Char(reader.char()?),
            Value::Timestamp(_) => {
                Value::Timestamp(Timestamp::from_milliseconds(reader.timestamp()?))
            }
            Value::Uuid(_) => Value::Uuid(Uuid::from(reader.uuid()?)),
            Value::Binary(_) => Value::Binary(Binary::from(reader.binary()?.to_vec())),
            Value::String(_) => Value::String(reader.string()?.to_owned()),
            Value::Symbol(_) => Value::Symbol(Symbol::from(reader.symbol()?)),
            // Decimals have no typed reader; `primitive` covers them.
            _ => as_value(reader.primitive()?),
        })
    }

    proptest! {
        /// What the reference writes, the reader reads as the same value, through `primitive`
        /// and through the typed reader; `skip` and `skip_checked` step over exactly it.
        #[test]
        fn primitives_read_what_the_reference_writes(value in primitive_value()) {
            let bytes = serde_amqp::to_vec(&value).unwrap();
            let mut reader = Reader::new(&bytes);
            prop_assert_eq!(as_value(reader.primitive().unwrap()), value.clone());
            prop_assert!(reader.is_at_end());
            let mut typed = Reader::new(&bytes);
            prop_assert_eq!(read_typed(&mut typed, &value).unwrap(), value.clone());
            prop_assert!(typed.is_at_end());
            let mut skipped = Reader::new(&bytes);
            skipped.skip_checked(0).unwrap();
            prop_assert!(skipped.is_at_end());
            let mut skipped = Reader::new(&bytes);
            skipped.skip(0).unwrap();
            prop_assert!(skipped.is_at_end());
        }

        /// Whatever the reader accepts, in any encoding, the reference reads as the same value;
        /// whatever the reference refuses, the reader refuses.
        #[test]
        fn the_reference_agrees_with_every_primitive_the_reader_accepts(bytes in hand_encoded()) {
            let reference: Result<Value, _> = serde_amqp::from_slice(&bytes);
            let mut reader = Reader::new(&bytes);
            match reader.primitive() {
                Ok(read) => {
                    prop_assert!(reader.is_at_end());
                    prop_assert_eq!(Ok(as_value(read)), reference.map_err(|e| e.to_string()));
                    let mut checked = Reader::new(&bytes);
                    prop_assert_eq!(checked.skip_checked(0), Ok(()));
                }
                Err(_) => {
                    let mut checked = Reader::new(&bytes);
                    prop_assert!(checked.skip_checked(0).is_err());
                    prop_assert!(reference.is_err(), "{:?}", reference);
                }
            }
        }

        /// `skip_checked` steps over exactly any value the reference writes, however nested.
        #[test]
        fn skip_checked_steps_over_any_reference_value(
            value in prop_oneof![nested_value(), array_value()]
        ) {
            let bytes = serde_amqp::to_vec(&value).unwrap();
            let mut reader = Reader::new(&bytes);
            reader.skip_checked(0).unwrap();
            prop_assert!(reader.is_at_end());
        }

        /// `take_string_equal_to` takes exactly the strings `string` reads as `known`, in
        /// either width, and leaves everything else, any bytes at all, where it was; and
        /// `take_symbol_equal_to` the symbols `symbol` reads so.
        #[test]
        fn take_string_or_symbol_equal_to_takes_what_string_or_symbol_reads_as_the_same_text(
            as_symbol in any::<bool>(),
            known in ".{0,40}",
            bytes in prop_oneof![
                ".{0,40}".prop_map(|text| serde_amqp::to_vec(&Value::String(text)).unwrap()),
                ".{0,40}".prop_map(|text| str32(&text)),
                vec(any::<u8>(), 0..48),
            ],
            same in any::<bool>(),
        ) {
            // Half the time the bytes are `known` itself, in one width or the other.
            let bytes = if same {
                let mut narrow = vec![0xa1];
                if known.len() <= 255 && bytes.first() != Some(&0xb1) {
                    narrow.push(known.len() as u8);
                } else {
                    narrow[0] = 0xb1;
                    narrow.extend_from_slice(&(known.len() as u32).to_be_bytes());
                }
                narrow.extend_from_slice(known.as_bytes());
                narrow
            } else {
                bytes
            };
            // A symbol's constructors are a string's plus two.
            let mut bytes = bytes;
            if as_symbol && matches!(bytes.first(), Some(0xa1 | 0xb1)) {
                bytes[0] += 2;
            }
            let mut plain = Reader::new(&bytes);
            let read = if as_symbol { plain.symbol() } else { plain.string() }.ok();
            let mut reader = Reader::new(&bytes);
            let took = if as_symbol {
                reader.take_symbol_equal_to(&known)
            } else {
                reader.take_string_equal_to(&known)
            };
            prop_assert_eq!(took, read == Some(known.as_str()));
            prop_assert_eq!(reader.position(), if took { plain.position() } else { 0 });
            if same {
                prop_assert!(took);
            }
        }

        /// `take_decimal_string` takes exactly the strings `string` reads as text that parses
        /// as a `u64` of digits only, with that number, and leaves everything else where it was.
        #[test]
        fn take_decimal_string_takes_what_string_reads_as_digits(
            bytes in prop_oneof![
                any::<u64>().prop_map(|n| serde_amqp::to_vec(&Value::String(n.to_string())).unwrap()),
                "[0-9+ -]{0,22}".prop_map(|text| serde_amqp::to_vec(&Value::String(text)).unwrap()),
                "[0-9]{0,22}".prop_map(|text| str32(&text)),
                vec(any::<u8>(), 0..24),
            ],
        ) {
            let mut plain = Reader::new(&bytes);
            let expected = plain
                .string()
                .ok()
                .filter(|text| text.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|text| text.parse::<u64>().ok());
            let mut reader = Reader::new(&bytes);
            let took = reader.take_decimal_string();
            prop_assert_eq!(took, expected);
            prop_assert_eq!(reader.position(), if took.is_some() { plain.position() } else { 0 });
        }

        /// `symbol_in` reads what `symbol` reads and fails where it fails, naming the known
        /// symbol it found by its index; bytes that are not UTF-8 are refused even when they
        /// are not among the known names.
        #[test]
        fn symbol_in_reads_what_symbol_reads(
            known in vec(".{0,12}", 0..4),
            bytes in prop_oneof![
                ".{0,12}".prop_map(|text| serde_amqp::to_vec(&Value::Symbol(text.into())).unwrap()),
                vec(any::<u8>(), 0..20).prop_map(|raw| {
                    let mut symbol = vec![0xa3, raw.len() as u8];
                    symbol.extend_from_slice(&raw);
                    symbol
                }),
                vec(any::<u8>(), 0..20),
            ],
            pick in any::<prop::sample::Index>(),
            take_known in any::<bool>(),
        ) {
            // Half the time the bytes are one of the known names.
            let bytes = match known.get(pick.index(known.len().max(1))) {
                Some(name) if take_known => {
                    let mut symbol = vec![0xa3, name.len() as u8];
                    symbol.extend_from_slice(name.as_bytes());
                    symbol
                }
                _ => bytes,
            };
            let names: Vec<&str> = known.iter().map(String::as_str).collect();
            let mut plain = Reader::new(&bytes);
            let mut reader = Reader::new(&bytes);
            match (plain.symbol(), reader.symbol_in(&names)) {
                (Ok(text), Ok(Ok(i))) => {
                    prop_assert_eq!(names[i], text);
                    prop_assert!(names[..i].iter().all(|name| *name != text));
                }
                (Ok(text), Ok(Err(other))) => {
                    prop_assert_eq!(text, other);
                    prop_assert!(!names.contains(&text));
                }
                (Err(expected), Err(got)) => prop_assert_eq!(expected, got),
                (plain, found) => prop_assert!(false, "symbol {plain:?}, symbol_in {found:?}"),
            }
            prop_assert_eq!(reader.position(), plain.position());
        }

        /// No reader panics or reads past its input, whatever the bytes.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..64)) {
            type Read = fn(&mut Reader<'_>) -> bool;
            let reads: [Read; 22] = [
                |r| r.primitive().is_ok(),
                |r| r.skip_checked(0).is_ok(),
                |r| r.skip_checked_with(0, ArrayRule::Primitive).is_ok(),
                |r| r.skip(0).is_ok(),
                |r| r.map_header().is_ok(),
                |r| r.list_header().is_ok(),
                |r| r.boolean().is_ok(),
                |r| r.ubyte().is_ok(),
                |r| r.ushort().is_ok(),
                |r| r.uint().is_ok(),
                |r| r.ulong().is_ok(),
                |r| r.byte().is_ok(),
                |r| r.short().is_ok(),
                |r| r.int().is_ok(),
                |r| r.long().is_ok(),
                |r| r.float().is_ok() && r.double().is_ok(),
                |r| r.char().is_ok(),
                |r| r.timestamp().is_ok(),
                |r| r.uuid().is_ok(),
                |r| r.binary().is_ok(),
                |r| r.string().is_ok(),
                |r| r.symbol().is_ok(),
            ];
            for read in reads {
                let mut reader = Reader::new(&bytes);
                let _ = read(&mut reader);
                prop_assert!(reader.position() <= bytes.len());
            }
        }
    }

    #[test]
    fn typed_readers_accept_every_form_and_refuse_other_types_in_place() {
        assert_eq!(Reader::new(&[0x55, 0xff]).long(), Ok(-1));
        assert_eq!(Reader::new(&[0x81, 0, 0, 0, 0, 0, 0, 1, 0]).long(), Ok(256));
        assert_eq!(Reader::new(&[0x54, 0x80]).int(), Ok(-128));
        assert_eq!(Reader::new(&[0x71, 0xff, 0xff, 0xff, 0xfe]).int(), Ok(-2));
        assert_eq!(Reader::new(&[0x44]).ulong(), Ok(0));
        assert_eq!(Reader::new(&[0x53, 7]).ulong(), Ok(7));
        assert_eq!(Reader::new(&[0x56, 0x01]).boolean(), Ok(true));
        assert_eq!(Reader::new(&[0x42]).boolean(), Ok(false));
        assert_eq!(Reader::new(&[0xa1, 2, b'h', b'i']).string(), Ok("hi"));
        assert_eq!(Reader::new(&[0xb1, 0, 0, 0, 1, b'x']).string(), Ok("x"));
        assert_eq!(Reader::new(&[0xa3, 1, b's']).symbol(), Ok("s"));
        assert_eq!(Reader::new(&[0xb3, 0, 0, 0, 0]).symbol(), Ok(""));
        assert_eq!(Reader::new(&[0xa0, 1, 9]).binary(), Ok(&[9u8][..]));
        assert_eq!(Reader::new(&[0x73, 0, 0, 0, 0x41]).char(), Ok('A'));
        // The wrong type is refused at its constructor, which stays unconsumed.
        let bytes = [0x81, 0, 0, 0, 0, 0, 0, 0, 1];
        let mut reader = Reader::new(&bytes);
        assert_eq!(reader.int().unwrap_err().at, 0);
        assert_eq!(reader.string().unwrap_err().reason, "a string expected");
        assert_eq!(reader.position(), 0);
        assert_eq!(reader.long(), Ok(1));
        // Bad contents are refused where they are.
        assert_eq!(Reader::new(&[0x56, 2]).boolean().unwrap_err().at, 1);
        assert_eq!(
            Reader::new(&[0x73, 0, 0, 0xd8, 0])
                .char()
                .unwrap_err()
                .reason,
            "a char must be a Unicode scalar value"
        );
        assert_eq!(
            Reader::new(&[0xa1, 1, 0xff]).string().unwrap_err(),
            CodecError {
                at: 2,
                reason: "a string must be UTF-8"
            }
        );
        assert_eq!(Reader::new(&[0xa3, 2, 0xc3, 0xa9]).symbol(), Ok("é"));
        assert_eq!(
            Reader::new(&[0xa3, 1, 0xc3]).symbol().unwrap_err().reason,
            "a symbol must be UTF-8"
        );
        // Lengths past the input are refused before anything is taken.
        assert!(
            Reader::new(&[0xb0, 0xff, 0xff, 0xff, 0xff, 1])
                .binary()
                .is_err()
        );
        assert!(Reader::new(&[0x98, 1, 2]).uuid().is_err());
        assert!(Reader::new(&[]).primitive().is_err());
        assert_eq!(
            Reader::new(&[0xc0, 1, 0]).primitive().unwrap_err().reason,
            "a primitive value expected"
        );
    }

    #[test]
    fn map_headers_are_checked() {
        assert_eq!(Reader::new(&[0xc1, 1, 0]).map_header(), Ok((0, 3)));
        assert_eq!(
            Reader::new(&[0xd1, 0, 0, 0, 4, 0, 0, 0, 0]).map_header(),
            Ok((0, 9))
        );
        assert_eq!(
            Reader::new(&[0xc1, 3, 1, 0x40, 0x40])
                .map_header()
                .unwrap_err()
                .reason,
            "a map's count must be even"
        );
        assert!(Reader::new(&[0xc1, 5, 2, 0x40]).map_header().is_err());
        assert!(Reader::new(&[0xc1, 0]).map_header().is_err());
        assert!(Reader::new(&[0xd1, 0, 0, 0, 2, 0, 0]).map_header().is_err());
        assert_eq!(
            Reader::new(&[0xc0, 1, 0]).map_header().unwrap_err().reason,
            "a map expected"
        );
    }

    #[test]
    fn skip_checked_refuses_what_skip_trusts() {
        let refused: &[&[u8]] = &[
            // A list claiming more elements than it holds.
            &[0xc0, 2, 2, 0x40],
            // A list whose elements overrun its size.
            &[0xc0, 2, 1, 0x55, 1],
            // A list whose elements stop short of its size.
            &[0xc0, 3, 1, 0x40, 0x40],
            // A map with an odd count.
            &[0xc1, 2, 1, 0x40],
            // A string inside a list that is not UTF-8.
            &[0xc0, 4, 1, 0xa1, 1, 0xff],
            // A boolean byte of 2 inside a described value.
            &[0x00, 0x53, 0x01, 0x56, 2],
            // An array whose elements do not fill it.
            &[0xe0, 4, 2, 0x55, 1],
            // An array of booleans with a bad byte.
            &[0xe0, 4, 2, 0x56, 1, 2],
            // An unknown constructor.
            &[0xc0, 2, 1, 0x57],
        ];
        for bytes in refused {
            let mut reader = Reader::new(bytes);
            assert!(reader.skip_checked(0).is_err(), "{bytes:x?}");
            let mut shallow = Reader::new(bytes);
            let _ = shallow.skip(0);
        }
        let accepted: &[&[u8]] = &[
            &[0x45],
            &[0xc0, 3, 2, 0x40, 0x41],
            &[0xc1, 5, 2, 0xa3, 1, b'k', 0x40],
            // An empty array, with and without its element constructor.
            &[0xe0, 2, 0, 0x40],
            &[0xe0, 1, 0],
            // An array of described longs.
            &[0xe0, 7, 2, 0x00, 0x53, 0x09, 0x55, 1, 2],
            // A list holding an array of two strings, and a null.
            &[
                0xc0, 12, 2, 0xe0, 8, 2, 0xa1, 2, b'a', b'b', 2, 0xc3, 0xa9, 0x40,
            ][..],
            // An array of lists.
            &[0xe0, 7, 2, 0xc0, 2, 1, 0x40, 1, 0],
            // Many zero-width elements cost nothing.
            &[0xf0, 0, 0, 0, 5, 0xff, 0xff, 0xff, 0xff, 0x40],
        ];
        for bytes in accepted {
            let mut reader = Reader::new(bytes);
            assert_eq!(reader.skip_checked(0), Ok(()), "{bytes:x?}");
            assert!(reader.is_at_end(), "{bytes:x?}");
        }
    }

    #[test]
    fn the_primitive_array_rule_refuses_arrays_of_compound_values() {
        let refused: &[&[u8]] = &[
            // Described elements.
            &[0xe0, 7, 2, 0x00, 0x53, 0x09, 0x55, 1, 2],
            // Lists.
            &[0xe0, 7, 2, 0xc0, 2, 1, 0x40, 1, 0],
            // Maps, and empty lists.
            &[0xe0, 6, 2, 0xc1, 1, 0, 1, 0],
            &[0xe0, 2, 3, 0x45],
            // Arrays.
            &[0xe0, 5, 1, 0xe0, 2, 1, 0x40],
            // An empty array with an element constructor.
            &[0xe0, 2, 0, 0x55],
            // Any of them inside a list.
            &[0xc0, 6, 2, 0x40, 0xe0, 2, 0, 0x40],
        ];
        for bytes in refused {
            let mut any = Reader::new(bytes);
            assert_eq!(any.skip_checked(0), Ok(()), "{bytes:x?}");
            assert!(any.is_at_end());
            let mut primitive = Reader::new(bytes);
            assert!(
                primitive
                    .skip_checked_with(0, ArrayRule::Primitive)
                    .is_err(),
                "{bytes:x?}"
            );
        }
        let accepted: &[&[u8]] = &[
            &[0xe0, 1, 0],
            &[0xe0, 4, 2, 0x55, 1, 2],
            &[0xe0, 2, 9, 0x40],
            &[0xc0, 8, 2, 0xe0, 4, 2, 0x56, 1, 0, 0x40],
        ];
        for bytes in accepted {
            let mut primitive = Reader::new(bytes);
            assert_eq!(
                primitive.skip_checked_with(0, ArrayRule::Primitive),
                Ok(()),
                "{bytes:x?}"
            );
            assert!(primitive.is_at_end());
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let nested = |depth: usize| {
            let mut bytes = vec![0x40];
            for _ in 0..depth {
                let size = u32::try_from(bytes.len() + 4).unwrap();
                let mut outer = vec![0xd0];
                outer.extend_from_slice(&size.to_be_bytes());
                outer.extend_from_slice(&1u32.to_be_bytes());
                outer.extend(bytes);
                bytes = outer;
            }
            bytes
        };
        let fits = nested(NESTING_DEPTH_MAX);
        assert_eq!(Reader::new(&fits).skip_checked(0), Ok(()));
        let deep = nested(NESTING_DEPTH_MAX + 1);
        assert_eq!(
            Reader::new(&deep).skip_checked(0).unwrap_err().reason,
            "values nested too deeply"
        );
        let mut described = vec![0x40];
        for _ in 0..=NESTING_DEPTH_MAX {
            let mut outer = vec![0x00, 0x53, 0x01];
            outer.extend(described);
            described = outer;
        }
        assert!(Reader::new(&described).skip_checked(0).is_err());
    }

    /// Found by the `amqp_value` fuzz target: descriptors nested 9 deep passed `skip_checked`
    /// but `skip` refused them (it had a limit of its own, 8).
    #[test]
    fn what_skip_checked_passes_skip_skips() {
        for levels in [9, NESTING_DEPTH_MAX] {
            // A described value whose descriptor is a described value, `levels` deep.
            let mut bytes = vec![0x00; levels];
            bytes.push(0x53);
            bytes.push(0x01);
            bytes.extend(std::iter::repeat_n(0x40, levels));
            let mut checked = Reader::new(&bytes);
            assert_eq!(checked.skip_checked(0), Ok(()), "{levels} levels");
            let mut trusting = Reader::new(&bytes);
            assert_eq!(trusting.skip(0), Ok(()), "{levels} levels");
            assert!(checked.is_at_end() && trusting.is_at_end());
        }
    }

    #[test]
    fn an_empty_reference_array_is_accepted() {
        let bytes = serde_amqp::to_vec(&Value::Array(Array(Vec::new()))).unwrap();
        let mut reader = Reader::new(&bytes);
        assert_eq!(reader.skip_checked(0), Ok(()), "{bytes:x?}");
        assert!(reader.is_at_end());
    }
}
