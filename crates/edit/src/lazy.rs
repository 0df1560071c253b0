//! A JSON body read lazily: one scan indexes where every value lies in the body's bytes (a
//! tape), a value is turned into a `serde_json::Value` only when a step names it, and edits of
//! the body's members are kept beside the bytes and spliced in when the body is written out,
//! untouched members copied as they came. An edit below a member descends into the objects
//! on its way (their members are edited in turn); only an array or a
//! scalar on the way is made a `Value`.
//!
//! This is what lets a chain of filter, transform and validate cost a fraction of parsing the
//! body into a `Value` and writing it back: building the whole tree (every key and string an
//! allocation) is most of that cost.
//!
//! # Guarantees
//!
//! - **Only what serde_json accepts.** The scanner indexes a subset of JSON — bodies in UTF-8,
//!   nested at most [`SCAN_DEPTH_MAX`] deep, with no `\u` escape, no exponent and at most
//!   [`INT_DIGITS_MAX`] integer digits in a number — and refuses everything else, valid or
//!   not; the caller then parses the body with serde_json as before, which decides. So every
//!   body the tape indexes is one `serde_json::from_slice` accepts, and every value read from
//!   the tape equals what serde_json makes of it (numbers and escaped strings are parsed by
//!   serde_json itself, except integers, whose value the digits give exactly). Property
//!   tests and the fuzz corpus check the first claim.
//! - **Same meaning as a parse.** Duplicate keys read as serde_json reads them: the last one
//!   wins; a removal removes every copy.
//! - **No panic on any input**, and the scanner's recursion is bounded by its depth limit.
//! - Written out, an edited body parses to the same `Value` as editing the parsed body would
//!   have made; members keep the order they came in (the parsed body sorted them) and
//!   untouched members keep their bytes. Objects with an edit below them are written
//!   without whitespace, as before; untouched members that follow one another and were
//!   written without whitespace are copied in one piece.
//!
//! Hand-written because no crate gives this: serde_json's `RawValue` skips nested values
//! without checking numbers, surrogates or depth (so it accepts bodies its own `Value` parse
//! refuses), and the faster parsers build a whole tree or need CPU flags at build time.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use serde_json::{Map, Value};

use crate::field::{self, Segment};

/// The deepest nesting the scanner indexes; deeper bodies take serde_json's full parse (whose
/// own limit is 128).
pub const SCAN_DEPTH_MAX: usize = 64;

/// The most integer digits of a number the scanner indexes: any such number fits an `i64` or
/// `u64`, so serde_json takes it. Longer ones take serde_json's full parse.
pub const INT_DIGITS_MAX: usize = 18;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null,
    True,
    False,
    Number,
    /// A string without escapes: its bytes between the quotes are its text.
    Str,
    /// A string with escapes (serde_json unescapes it).
    EscapedStr,
    Array,
    Object,
}

/// One value of the tape: an object is followed by its key and value nodes in turn, an array
/// by its elements.
#[derive(Debug, Clone, Copy)]
struct Node {
    kind: Kind,
    /// Where the value starts in the body (a string's opening quote).
    start: u32,
    /// Where it ends (after a string's closing quote or a container's bracket).
    end: u32,
    /// The index of the node after this value and everything in it.
    next: u32,
    /// An object's members or an array's elements.
    len: u32,
    /// An object that may name a key twice (every object with an escaped key counts).
    repeats: bool,
}

/// The tape of one body, with each value's `Value` made at most once.
#[derive(Debug, Clone)]
pub(crate) struct Tape {
    nodes: Vec<Node>,
    values: Values,
}

/// How many values of one body are kept beside the tape before a slot for every node is made:
/// steps name a handful of fields, and a slot per node costs an allocation (and its drop) per
/// event that few fields would repay.
const VALUE_SLOTS: usize = 8;

/// The `Value`s made of a tape's nodes: the first few in slots tagged with their node, the
/// rest (rarely any) in a slot per node made when those are full.
#[derive(Debug, Clone, Default)]
struct Values {
    slots: [OnceLock<(usize, Value)>; VALUE_SLOTS],
    all: OnceLock<Box<[OnceLock<Value>]>>,
}

/// Indexes `body`, or `None` when it is not in the subset the scanner takes (see the module
/// docs): the caller then asks serde_json.
pub(crate) fn scan(body: &[u8]) -> Option<Tape> {
    // UTF-8 is checked string by string (`Scanner::string`): outside strings the scanner
    // takes ASCII bytes only, so a body whose strings are UTF-8 is UTF-8.
    if u32::try_from(body.len()).is_err() {
        return None;
    }
    let mut scanner = Scanner {
        bytes: body,
        at: 0,
        nodes: Vec::with_capacity(body.len() / 12 + 4),
        keys: KEYS_SCRATCH.take(),
    };
    let scanned = scanner.value(0).is_some() && {
        scanner.whitespace();
        scanner.at == body.len()
    };
    let mut keys = std::mem::take(&mut scanner.keys);
    if keys.capacity() <= KEYS_SCRATCH_KEPT_MAX {
        keys.clear();
        KEYS_SCRATCH.set(keys);
    }
    scanned.then(|| Tape {
        nodes: scanner.nodes,
        values: Values::default(),
    })
}

/// The most keys the scratch stack keeps room for between bodies (64 KiB): enough for any
/// usual body; a huge one's stack is freed rather than held by the thread.
const KEYS_SCRATCH_KEPT_MAX: usize = 4096;

thread_local! {
    /// The scanner's scratch stack of keys, kept from one body to the next of a batch.
    static KEYS_SCRATCH: std::cell::Cell<Vec<(u64, usize)>> = const {
        std::cell::Cell::new(Vec::new())
    };
}

struct Scanner<'b> {
    bytes: &'b [u8],
    at: usize,
    nodes: Vec<Node>,
    /// Scratch for [`Scanner::repeats`]: the keys of the objects being read, innermost last,
    /// as (fingerprint, key node).
    keys: Vec<(u64, usize)>,
}

/// The most keys of an object compared pair by pair for a repeat; more go through a table.
const KEYS_COMPARED_PAIRWISE: usize = 6;

/// The slots of the table [`Scanner::repeats`] puts an object's keys in, by fingerprint.
const KEY_TABLE_SLOTS: usize = 64;

/// The most keys of an object checked through the table (at most half full, so a key finds a
/// free slot within a few steps); more are sorted first.
const KEYS_TABLED_MAX: usize = KEY_TABLE_SLOTS / 2;

impl Scanner<'_> {
    #[inline(always)]
    fn whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.at) {
            self.at += 1;
        }
    }

    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn open(&mut self, kind: Kind) -> usize {
        let index = self.nodes.len();
        // Offsets fit: `scan` refuses bodies over u32::MAX bytes.
        let start = u32::try_from(self.at).unwrap_or(u32::MAX);
        self.nodes.push(Node {
            kind,
            start,
            end: start,
            next: 0,
            len: 0,
            repeats: false,
        });
        index
    }

    fn close(&mut self, index: usize) -> Option<()> {
        let next = u32::try_from(self.nodes.len()).ok()?;
        let end = u32::try_from(self.at).ok()?;
        let node = self.nodes.get_mut(index)?;
        node.end = end;
        node.next = next;
        Some(())
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        self.whitespace();
        match self.peek()? {
            b'{' => self.container(depth, Kind::Object),
            b'[' => self.container(depth, Kind::Array),
            b'"' => self.string(),
            b't' => self.literal(b"true", Kind::True),
            b'f' => self.literal(b"false", Kind::False),
            b'n' => self.literal(b"null", Kind::Null),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    #[inline(always)]
    fn literal(&mut self, text: &[u8], kind: Kind) -> Option<()> {
        if !self.bytes[self.at..].starts_with(text) {
            return None;
        }
        let start = self.at;
        self.at += text.len();
        self.leaf(kind, start);
        Some(())
    }

    /// Records the value of `kind` that starts at `start` and ends here (not a container).
    #[inline(always)]
    fn leaf(&mut self, kind: Kind, start: usize) {
        // Offsets and node counts fit: `scan` refuses bodies over u32::MAX bytes, and every
        // node takes at least one byte.
        let offset = |at: usize| u32::try_from(at).unwrap_or(u32::MAX);
        self.nodes.push(Node {
            kind,
            start: offset(start),
            end: offset(self.at),
            next: offset(self.nodes.len() + 1),
            len: 0,
            repeats: false,
        });
    }

    #[inline(always)]
    fn string(&mut self) -> Option<()> {
        let start = self.at;
        let mut kind = Kind::Str;
        // Whether a byte above ASCII was met: then the string's bytes are checked as UTF-8
        // once its end is found (the scan looks for them only until the first).
        let mut ascii = true;
        self.at += 1;
        loop {
            self.at += if ascii {
                special::<true>(&self.bytes[self.at..])?
            } else {
                special::<false>(&self.bytes[self.at..])?
            };
            if self.bytes[self.at] >= 0x80 {
                ascii = false;
                continue;
            }
            // JSON strings hold no raw control characters (serde_json refuses them).
            if self.bytes[self.at] < 0x20 {
                return None;
            }
            if self.bytes[self.at] == b'"' {
                self.at += 1;
                break;
            }
            // `\u` escapes (and their surrogate pairs) are left to serde_json.
            match self.bytes.get(self.at + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.at += 2,
                _ => return None,
            }
            kind = Kind::EscapedStr;
        }
        if !ascii && std::str::from_utf8(&self.bytes[start + 1..self.at - 1]).is_err() {
            return None;
        }
        self.leaf(kind, start);
        Some(())
    }

    #[inline(always)]
    fn digits(&mut self) -> usize {
        let from = self.at;
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
        self.at - from
    }

    #[inline(always)]
    fn number(&mut self) -> Option<()> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek()? {
            b'0' => self.at += 1,
            b'1'..=b'9' => {
                if self.digits() > INT_DIGITS_MAX {
                    return None;
                }
            }
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return None;
            }
        }
        // Exponents may overflow; serde_json decides those.
        if let Some(b'e' | b'E') = self.peek() {
            return None;
        }
        self.leaf(Kind::Number, start);
        Some(())
    }

    fn container(&mut self, depth: usize, kind: Kind) -> Option<()> {
        if depth >= SCAN_DEPTH_MAX {
            return None;
        }
        let index = self.open(kind);
        let close = if kind == Kind::Object { b'}' } else { b']' };
        self.at += 1;
        self.whitespace();
        let mut len = 0u32;
        // This object's keys go on the scratch stack above `keys_base` (nested objects push
        // and pop their own above them); an escaped key makes the object count as repeating.
        let keys_base = self.keys.len();
        let mut escaped = false;
        if self.peek() == Some(close) {
            self.at += 1;
        } else {
            loop {
                if kind == Kind::Object {
                    let key = self.member_key()?;
                    match self.nodes[key].kind {
                        Kind::Str => self.keys.push((fingerprint(self.key_bytes(key)), key)),
                        _ => escaped = true,
                    }
                }
                self.value(depth + 1)?;
                len = len.checked_add(1)?;
                self.whitespace();
                match self.peek()? {
                    b',' => self.at += 1,
                    b if b == close => {
                        self.at += 1;
                        break;
                    }
                    _ => return None,
                }
            }
        }
        self.nodes[index].len = len;
        self.close(index)?;
        if kind == Kind::Object {
            self.nodes[index].repeats = escaped || self.repeats(keys_base);
            self.keys.truncate(keys_base);
        }
        Some(())
    }

    /// Whether two of the keys on the scratch stack from `base` are the same. Exact: keys
    /// whose fingerprints match are compared byte for byte.
    ///
    /// A few keys are compared pair by pair. Up to [`KEYS_TABLED_MAX`] go into an
    /// open-addressing table, each at the first free slot from the one its fingerprint picks:
    /// a key passes every earlier key of the same fingerprint on its way (slots are never
    /// freed, so the run between that key's first slot and its place is still full), and is
    /// compared with the keys it passes. More are sorted.
    fn repeats(&mut self, base: usize) -> bool {
        let (nodes, bytes) = (&self.nodes, self.bytes);
        let key_bytes = |index: usize| key_bytes(nodes, bytes, index);
        let same = |a: &(u64, usize), b: &(u64, usize)| {
            a.0 == b.0 && same_bytes(key_bytes(a.1), key_bytes(b.1))
        };
        let keys = &mut self.keys[base..];
        if keys.len() <= KEYS_COMPARED_PAIRWISE {
            return keys
                .iter()
                .enumerate()
                .any(|(i, a)| keys[i + 1..].iter().any(|b| same(a, b)));
        }
        if keys.len() <= KEYS_TABLED_MAX {
            // A key's place in `keys`, or EMPTY.
            const EMPTY: u8 = u8::MAX;
            let mut table = [EMPTY; KEY_TABLE_SLOTS];
            for (i, key) in keys.iter().enumerate() {
                // The fingerprint's bits mixed into the top six: the first slot.
                let mut slot = (key.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize;
                loop {
                    match table[slot] {
                        EMPTY => {
                            // At most KEYS_TABLED_MAX keys: the place fits a byte.
                            table[slot] = u8::try_from(i).unwrap_or(EMPTY);
                            break;
                        }
                        earlier if same(&keys[usize::from(earlier)], key) => return true,
                        _ => slot = (slot + 1) % KEY_TABLE_SLOTS,
                    }
                }
            }
            return false;
        }
        keys.sort_unstable_by(|a, b| {
            a.0.cmp(&b.0)
                .then_with(|| key_bytes(a.1).cmp(key_bytes(b.1)))
        });
        keys.windows(2).any(|pair| same(&pair[0], &pair[1]))
    }

    /// The bytes between the quotes of the string node `index`.
    fn key_bytes(&self, index: usize) -> &[u8] {
        key_bytes(&self.nodes, self.bytes, index)
    }

    /// Reads an object member's key and its colon; returns the key's node.
    #[inline(always)]
    fn member_key(&mut self) -> Option<usize> {
        self.whitespace();
        if self.peek()? != b'"' {
            return None;
        }
        let key = self.nodes.len();
        self.string()?;
        self.whitespace();
        if self.peek()? != b':' {
            return None;
        }
        self.at += 1;
        Some(key)
    }
}

/// The bytes between the quotes of the string node `index` of `nodes`.
fn key_bytes<'b>(nodes: &[Node], bytes: &'b [u8], index: usize) -> &'b [u8] {
    let node = nodes[index];
    bytes
        .get(node.start as usize + 1..(node.end as usize).saturating_sub(1))
        .unwrap_or_default()
}

/// Where the first quote, backslash or control character of `bytes` is (and with `HIGH`, the
/// first byte above ASCII): the bytes that end or interrupt a string's plain text.
///
/// Eight bytes a step (SWAR), one pass for the tests: `memchr` finds two given bytes, not a
/// class, and serde_json's own scan of this kind is private. The flags of each test are exact
/// at the lowest match (a false one only follows a true one), so the lowest flag of all is the
/// first special byte.
#[inline(always)]
fn special<const HIGH: bool>(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::from_le_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_le_bytes([0x80; 8]);
    let zero_in = |word: u64| word.wrapping_sub(ONES) & !word & HIGHS;
    let mut chunks = bytes.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
        let flags = zero_in(word ^ (ONES * u64::from(b'"')))
            | zero_in(word ^ (ONES * u64::from(b'\\')))
            | (word.wrapping_sub(ONES * 0x20) & !word & HIGHS)
            | if HIGH { word & HIGHS } else { 0 };
        if flags != 0 {
            return Some(at + (flags.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20 || (HIGH && b >= 0x80))
        .map(|i| at + i)
}

/// The members of an object of a tape: `(key node, value node)` in body order.
#[derive(Debug, Clone)]
pub(crate) struct MembersOf<'t> {
    tape: &'t Tape,
    at: usize,
    left: u32,
}

impl Iterator for MembersOf<'_> {
    type Item = (usize, usize);

    fn next(&mut self) -> Option<(usize, usize)> {
        self.left = self.left.checked_sub(1)?;
        let (key, value) = (self.at, self.at + 1);
        self.at = self.tape.nodes[value].next as usize;
        Some((key, value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left as usize, Some(self.left as usize))
    }
}

impl ExactSizeIterator for MembersOf<'_> {}

/// A cheap fingerprint of a key's bytes (its length and first and last bytes, eight or four
/// of each): keys with different fingerprints differ.
fn fingerprint(bytes: &[u8]) -> u64 {
    let n = bytes.len();
    let word = if let (Some(head), Some(tail)) = (bytes.first_chunk(), bytes.last_chunk()) {
        u64::from_le_bytes(*head) ^ u64::from_le_bytes(*tail).rotate_left(29)
    } else if let (Some(head), Some(tail)) = (bytes.first_chunk(), bytes.last_chunk()) {
        u64::from(u32::from_le_bytes(*head)) | (u64::from(u32::from_le_bytes(*tail)) << 32)
    } else {
        bytes
            .iter()
            .fold(0u64, |word, &b| (word << 8) | u64::from(b))
    };
    word ^ (n as u64).rotate_right(8)
}

/// Whether two keys' bytes are equal: the first and last bytes decide most unequal keys of
/// one length without a call to `memcmp`.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.first() == b.first() && a.last() == b.last() && a == b
}

impl Tape {
    fn node(&self, index: usize) -> Node {
        self.nodes[index]
    }

    fn raw<'b>(&self, body: &'b [u8], index: usize) -> &'b [u8] {
        let node = self.node(index);
        body.get(node.start as usize..node.end as usize)
            .unwrap_or_default()
    }

    /// The body's bytes from the start of node `first` to the end of node `last`.
    fn span<'b>(&self, body: &'b [u8], first: usize, last: usize) -> &'b [u8] {
        body.get(self.node(first).start as usize..self.node(last).end as usize)
            .unwrap_or_default()
    }

    /// The bytes a member whose key is node `key` takes written as `"key":value`.
    fn member_bytes(&self, key: usize) -> usize {
        let (key, value) = (self.node(key), self.node(key + 1));
        (key.end - key.start + 1 + value.end - value.start) as usize
    }

    /// Whether node `next` is the one right after the value at node `value` and everything in
    /// it (in an object: the next member's key).
    fn follows(&self, value: usize, next: usize) -> bool {
        self.node(value).next as usize == next
    }

    /// Whether the body is a JSON object.
    pub(crate) fn is_object(&self) -> bool {
        self.nodes.first().is_some_and(|n| n.kind == Kind::Object)
    }

    /// `(key node, value node)` of each member of the object at `index`, in body order.
    pub(crate) fn members(&self, index: usize) -> MembersOf<'_> {
        let node = self.node(index);
        let left = if node.kind == Kind::Object {
            node.len
        } else {
            0
        };
        MembersOf {
            tape: self,
            at: index + 1,
            left,
        }
    }

    /// The element nodes of the array at `index`, in order.
    pub(crate) fn elements(&self, index: usize) -> impl Iterator<Item = usize> + '_ {
        let node = self.node(index);
        let count = if node.kind == Kind::Array {
            node.len
        } else {
            0
        };
        let mut at = index + 1;
        (0..count).map(move |_| {
            let element = at;
            at = self.nodes[element].next as usize;
            element
        })
    }

    /// Whether the key node `index` spells `key`.
    #[inline]
    pub(crate) fn key_is(&self, body: &[u8], index: usize, key: &str) -> bool {
        let node = self.node(index);
        if node.kind != Kind::Str {
            let raw = self.raw(body, index);
            return serde_json::from_slice::<String>(raw).is_ok_and(|text| text == key);
        }
        // The length first: it tells most keys apart without reading them.
        (node.end - node.start) as usize == key.len() + 2
            && body
                .get(node.start as usize + 1..node.end as usize - 1)
                .is_some_and(|text| same_bytes(text, key.as_bytes()))
    }

    /// The text of the string node `index` of the body whose text is `body`.
    pub(crate) fn text_in<'b>(&self, body: &'b str, index: usize) -> Option<Cow<'b, str>> {
        let node = self.node(index);
        match node.kind {
            Kind::Str => body
                .get(node.start as usize + 1..(node.end as usize).saturating_sub(1))
                .map(Cow::Borrowed),
            Kind::EscapedStr => body
                .get(node.start as usize..node.end as usize)
                .and_then(|raw| serde_json::from_str(raw).ok())
                .map(Cow::Owned),
            _ => None,
        }
    }

    /// The text of the string node `index`.
    pub(crate) fn text<'b>(&self, body: &'b [u8], index: usize) -> Option<Cow<'b, str>> {
        let raw = self.raw(body, index);
        match self.node(index).kind {
            Kind::Str => std::str::from_utf8(raw.get(1..raw.len().saturating_sub(1))?)
                .ok()
                .map(Cow::Borrowed),
            Kind::EscapedStr => serde_json::from_slice(raw).ok().map(Cow::Owned),
            _ => None,
        }
    }

    /// The value node of the last member `key` of the object at `index` (the one a parse
    /// keeps).
    pub(crate) fn member(&self, body: &[u8], index: usize, key: &str) -> Option<usize> {
        let mut members = self.members(index);
        if !self.repeats(index) {
            return members
                .find(|&(k, _)| self.key_is(body, k, key))
                .map(|(_, v)| v);
        }
        members
            .filter(|&(k, _)| self.key_is(body, k, key))
            .last()
            .map(|(_, v)| v)
    }

    /// Whether the object at `index` may name a key twice (`false` for anything else).
    pub(crate) fn repeats(&self, index: usize) -> bool {
        self.node(index).repeats
    }

    /// The node at `path` below `index`.
    pub(crate) fn find(&self, body: &[u8], index: usize, path: &[Segment]) -> Option<usize> {
        path.iter().try_fold(index, |at, segment| match segment {
            Segment::Key(key) => self.member(body, at, key),
            Segment::Index(i) => self.elements(at).nth(*i),
        })
    }

    /// The value at node `index`, made on the first call.
    pub(crate) fn value(&self, body: &[u8], index: usize) -> &Value {
        for slot in &self.values.slots {
            let (at, value) = slot.get_or_init(|| (index, self.to_value(body, index)));
            if *at == index {
                return value;
            }
        }
        let all = self.values.all.get_or_init(|| {
            std::iter::repeat_with(OnceLock::new)
                .take(self.nodes.len())
                .collect()
        });
        all[index].get_or_init(|| self.to_value(body, index))
    }

    /// The value at node `index`, made anew.
    pub(crate) fn to_value(&self, body: &[u8], index: usize) -> Value {
        match self.node(index).kind {
            Kind::Null => Value::Null,
            Kind::True => Value::Bool(true),
            Kind::False => Value::Bool(false),
            Kind::Str | Kind::EscapedStr => self
                .text(body, index)
                .map_or(Value::Null, |t| Value::String(t.into_owned())),
            Kind::Number => self.number(body, index).map_or(Value::Null, Value::Number),
            Kind::Array => Value::Array(
                self.elements(index)
                    .map(|e| self.to_value(body, e))
                    .collect(),
            ),
            Kind::Object => {
                let mut map = Map::new();
                for (key, value) in self.members(index) {
                    let key = self.text(body, key).unwrap_or_default().into_owned();
                    map.insert(key, self.to_value(body, value));
                }
                Value::Object(map)
            }
        }
    }

    /// The JSON type's name of node `index`.
    pub(crate) fn kind_name(&self, index: usize) -> &'static str {
        match self.node(index).kind {
            Kind::Null => "null",
            Kind::True | Kind::False => "boolean",
            Kind::Number => "number",
            Kind::Str | Kind::EscapedStr => "string",
            Kind::Array => "array",
            Kind::Object => "object",
        }
    }

    pub(crate) fn is_object_at(&self, index: usize) -> bool {
        self.node(index).kind == Kind::Object
    }

    pub(crate) fn is_array_at(&self, index: usize) -> bool {
        self.node(index).kind == Kind::Array
    }

    pub(crate) fn boolean(&self, index: usize) -> Option<bool> {
        match self.node(index).kind {
            Kind::True => Some(true),
            Kind::False => Some(false),
            _ => None,
        }
    }

    pub(crate) fn is_null(&self, index: usize) -> bool {
        self.node(index).kind == Kind::Null
    }

    pub(crate) fn is_string(&self, index: usize) -> bool {
        matches!(self.node(index).kind, Kind::Str | Kind::EscapedStr)
    }

    /// The number at node `index`, as serde_json reads it.
    pub(crate) fn number(&self, body: &[u8], index: usize) -> Option<serde_json::Number> {
        if self.node(index).kind != Kind::Number {
            return None;
        }
        let raw = self.raw(body, index);
        integer(raw).or_else(|| serde_json::from_slice(raw).ok())
    }

    pub(crate) fn len(&self, index: usize) -> usize {
        self.node(index).len as usize
    }
}

/// An integer the scanner took (at most [`INT_DIGITS_MAX`] digits, so it fits) read as
/// serde_json reads it: a `u64` when not negative, an `i64` when negative. `None` for a
/// fraction, and for `-0`, which serde_json reads as the float -0.0.
fn integer(raw: &[u8]) -> Option<serde_json::Number> {
    let (negative, digits) = match raw.split_first()? {
        (b'-', digits) => (true, digits),
        _ => (false, raw),
    };
    if digits.is_empty() || digits.len() > INT_DIGITS_MAX || !digits.iter().all(u8::is_ascii_digit)
    {
        return None;
    }
    let magnitude = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    match (negative, magnitude) {
        (false, n) => Some(n.into()),
        (true, 0) => None,
        // At most 18 digits: below i64::MAX.
        (true, n) => i64::try_from(n).ok().map(|n| (-n).into()),
    }
}

/// An edited object's member key: as the body wrote it, or new.
#[derive(Debug, Clone)]
pub(crate) enum Key {
    /// The key node in the tape.
    Raw(RawKey),
    /// A key a step added.
    New(Box<str>),
}

/// A key of the body in an edited object: its node, and where its text lies in the body, so
/// a lookup tells most keys apart by length and compares the rest without reading the tape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawKey {
    node: u32,
    /// Where the bytes between the quotes start.
    text: u32,
    /// How many bytes lie between the quotes; [`RawKey::ESCAPED`] for a key with escapes,
    /// whose text only a parse gives.
    len: u32,
}

impl RawKey {
    const ESCAPED: u32 = u32::MAX;

    /// The key node `index` of `tape`.
    fn of(tape: &Tape, index: usize) -> RawKey {
        let node = tape.node(index);
        // Node indices and offsets fit: `scan` refuses bodies over u32::MAX bytes.
        RawKey {
            node: u32::try_from(index).unwrap_or(u32::MAX),
            text: node.start + 1,
            len: match node.kind {
                Kind::Str => node.end - node.start - 2,
                _ => RawKey::ESCAPED,
            },
        }
    }

    /// The key's node in the tape.
    pub(crate) fn node(self) -> usize {
        self.node as usize
    }

    /// Whether the key spells `text`.
    #[inline]
    fn is(self, tape: &Tape, body: &[u8], text: &str) -> bool {
        if self.len == RawKey::ESCAPED {
            return tape.key_is(body, self.node(), text);
        }
        self.len as usize == text.len()
            && body
                .get(self.text as usize..self.text as usize + text.len())
                .is_some_and(|bytes| same_bytes(bytes, text.as_bytes()))
    }
}

/// An edited object's member value: as the body wrote it, a value a step made, or an object
/// of the body with edited members of its own.
#[derive(Debug, Clone)]
pub(crate) enum Member {
    /// The value node in the tape.
    Raw(usize),
    /// A value a step made (or took out of the body to change); boxed, as few members hold
    /// one, to keep every member small.
    Value(Box<Value>),
    /// An object of the body (a tape node) whose members are edited in turn.
    Object(Box<Overlay>),
    /// A value a step writes into every body, shared and written out once.
    Shared(Arc<Shared>),
}

/// A value a step writes into every body it edits, with its JSON text made once.
#[derive(Debug)]
pub(crate) struct Shared {
    value: Value,
    json: Box<[u8]>,
}

impl Shared {
    /// The value.
    pub(crate) fn value(&self) -> &Value {
        &self.value
    }

    pub(crate) fn new(value: Value) -> Arc<Shared> {
        let mut json = Vec::new();
        write_json(&mut json, &value);
        Arc::new(Shared {
            value,
            json: json.into_boxed_slice(),
        })
    }
}

/// The edited members of one object of the body, in order (duplicate keys kept as they came;
/// the last counts).
#[derive(Debug, Clone)]
pub(crate) struct Overlay {
    pub(crate) members: Vec<(Key, Member)>,
    /// Some key may appear twice (the tape object's [`Tape::repeats`]; edits never add a
    /// repeat: a write to a key that is there replaces its value).
    pub(crate) repeats: bool,
    /// The object as a `Value`, made when a reader asks for it and forgotten on every edit.
    value: OnceLock<Value>,
}

/// A value in a document being edited: in the tape, made by a step, or an edited object.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Found<'d> {
    Tape(usize),
    Value(&'d Value),
    Object(&'d Overlay),
}

/// An edited object of a body (the body itself, or one nested in it): the tape, its body and
/// the object's members.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Doc<'d> {
    pub(crate) tape: &'d Tape,
    pub(crate) body: &'d [u8],
    pub(crate) overlay: &'d Overlay,
}

/// An object body to change.
#[derive(Debug)]
pub(crate) struct DocMut<'d> {
    pub(crate) tape: &'d Tape,
    pub(crate) body: &'d [u8],
    pub(crate) overlay: &'d mut Overlay,
}

impl Overlay {
    /// Every member of the object body the tape indexes, untouched.
    pub(crate) fn of(tape: &Tape) -> Overlay {
        Overlay::of_node(tape, 0)
    }

    /// Every member of the object at node `index`, untouched.
    fn of_node(tape: &Tape, index: usize) -> Overlay {
        Overlay {
            members: tape
                .members(index)
                .map(|(k, v)| (Key::Raw(RawKey::of(tape, k)), Member::Raw(v)))
                .collect(),
            repeats: tape.repeats(index),
            value: OnceLock::new(),
        }
    }
}

#[inline]
fn key_is(tape: &Tape, body: &[u8], key: &Key, text: &str) -> bool {
    match key {
        Key::Raw(raw) => raw.is(tape, body, text),
        Key::New(new) => same_bytes(new.as_bytes(), text.as_bytes()),
    }
}

/// The key's text, in the body whose text is `body`.
pub(crate) fn key_text_in<'b>(tape: &Tape, body: &'b str, key: &'b Key) -> Cow<'b, str> {
    match key {
        Key::Raw(raw) if raw.len != RawKey::ESCAPED => body
            .get(raw.text as usize..raw.text as usize + raw.len as usize)
            .map(Cow::Borrowed)
            .unwrap_or_default(),
        Key::Raw(raw) => tape.text_in(body, raw.node()).unwrap_or_default(),
        Key::New(new) => Cow::Borrowed(new),
    }
}

/// The key's text.
pub(crate) fn key_text<'b>(tape: &Tape, body: &'b [u8], key: &'b Key) -> Cow<'b, str> {
    match key {
        Key::Raw(raw) => tape.text(body, raw.node()).unwrap_or_default(),
        Key::New(new) => Cow::Borrowed(new),
    }
}

fn member_value(tape: &Tape, body: &[u8], member: Member) -> Value {
    match member {
        Member::Raw(index) => tape.to_value(body, index),
        Member::Value(value) => *value,
        Member::Shared(shared) => shared.value.clone(),
        Member::Object(overlay) => Doc {
            tape,
            body,
            overlay: &overlay,
        }
        .to_value(),
    }
}

impl<'d> Doc<'d> {
    /// The position of the member `key` a parse keeps (the last).
    pub(crate) fn position(&self, key: &str) -> Option<usize> {
        position(self.tape, self.body, self.overlay, key)
    }

    /// The document of a nested edited object.
    pub(crate) fn nested(&self, overlay: &'d Overlay) -> Doc<'d> {
        Doc { overlay, ..*self }
    }

    /// The value at `path` (not empty).
    pub(crate) fn get(&self, path: &[Segment]) -> Option<Found<'d>> {
        let (Segment::Key(first), rest) = path.split_first()? else {
            return None;
        };
        let at = self.position(first)?;
        match &self.overlay.members[at].1 {
            Member::Raw(index) => self.tape.find(self.body, *index, rest).map(Found::Tape),
            Member::Value(value) => field::get_in(rest, value).map(Found::Value),
            Member::Shared(shared) => field::get_in(rest, &shared.value).map(Found::Value),
            Member::Object(overlay) if rest.is_empty() => Some(Found::Object(overlay)),
            Member::Object(overlay) => self.nested(overlay).get(rest),
        }
    }

    /// The value at `path` as a `Value` (made once for a tape node or an edited object).
    pub(crate) fn value(&self, path: &[Segment]) -> Option<&'d Value> {
        match self.get(path)? {
            Found::Tape(index) => Some(self.tape.value(self.body, index)),
            Found::Value(value) => Some(value),
            Found::Object(overlay) => Some(
                overlay
                    .value
                    .get_or_init(|| self.nested(overlay).to_value()),
            ),
        }
    }

    /// The whole object as a `Value`.
    pub(crate) fn to_value(self) -> Value {
        let mut map = Map::new();
        for (key, member) in &self.overlay.members {
            let value = match member {
                Member::Raw(index) => self.tape.to_value(self.body, *index),
                Member::Value(value) => Value::clone(value),
                Member::Shared(shared) => shared.value.clone(),
                Member::Object(overlay) => self.nested(overlay).to_value(),
            };
            map.insert(key_text(self.tape, self.body, key).into_owned(), value);
        }
        Value::Object(map)
    }

    /// The object written out: members in order, untouched ones as they came.
    pub(crate) fn write(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.body.len() + 64);
        self.write_to(&mut out);
        out
    }

    fn write_to(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        let members = &self.overlay.members;
        let mut i = 0;
        while i < members.len() {
            if i > 0 {
                out.push(b',');
            }
            let (run, compact) = self.raw_run(&members[i..]);
            if run > 0 {
                if compact {
                    // Untouched members that follow one another in the body, which wrote
                    // them as this writes them (no whitespace), are copied in one piece.
                    out.extend_from_slice(self.run_bytes(&members[i..i + run]));
                } else {
                    for (j, member) in members[i..i + run].iter().enumerate() {
                        if j > 0 {
                            out.push(b',');
                        }
                        self.write_member(out, member);
                    }
                }
                i += run;
                continue;
            }
            self.write_member(out, &members[i]);
            i += 1;
        }
        out.push(b'}');
    }

    /// How many members from the first of `members` are untouched and follow one another in
    /// the body (0 when the first is not such a member), and whether the body wrote them as
    /// [`Doc::write`] does, without whitespace.
    fn raw_run(&self, members: &[(Key, Member)]) -> (usize, bool) {
        let mut run = 0;
        let mut written = 0;
        let mut last = None;
        for (key, member) in members {
            let (Key::Raw(key), Member::Raw(value)) = (key, member) else {
                break;
            };
            let key = key.node();
            if *value != key + 1 || last.is_some_and(|last| !self.tape.follows(last, key)) {
                break;
            }
            written += usize::from(run > 0) + self.tape.member_bytes(key);
            run += 1;
            last = Some(*value);
        }
        let compact = run > 0 && self.run_bytes(&members[..run]).len() == written;
        (run, compact)
    }

    /// The body's bytes from the first member's key to the last one's value.
    fn run_bytes(&self, run: &[(Key, Member)]) -> &'d [u8] {
        match (run.first(), run.last()) {
            (Some((Key::Raw(first), _)), Some((_, Member::Raw(last)))) => {
                self.tape.span(self.body, first.node(), *last)
            }
            _ => &[],
        }
    }

    fn write_member(&self, out: &mut Vec<u8>, (key, member): &(Key, Member)) {
        match key {
            Key::Raw(raw) => out.extend_from_slice(self.tape.raw(self.body, raw.node())),
            Key::New(text) => write_key(out, text),
        }
        out.push(b':');
        match member {
            Member::Raw(index) => out.extend_from_slice(self.tape.raw(self.body, *index)),
            Member::Value(value) => write_json(out, value),
            Member::Shared(shared) => out.extend_from_slice(&shared.json),
            Member::Object(overlay) => self.nested(overlay).write_to(out),
        }
    }
}

/// The JSON type's name of `value`.
pub(crate) fn value_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Writes `key` as a JSON string: as it is between quotes when nothing in it needs an escape
/// (what serde_json escapes: quotes, backslashes and control characters), else by serde_json.
fn write_key(out: &mut Vec<u8>, key: &str) {
    if key.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push(b'"');
        out.extend_from_slice(key.as_bytes());
        out.push(b'"');
    } else {
        write_json(out, key);
    }
}

fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Strings and `Value`s always serialise (map keys are strings); writing to a Vec does
    // not fail.
    let _ = serde_json::to_writer(out, value);
}

fn position(tape: &Tape, body: &[u8], overlay: &Overlay, key: &str) -> Option<usize> {
    overlay
        .members
        .iter()
        .rposition(|(k, _)| key_is(tape, body, k, key))
}

/// The member in `slot` made ready to edit below: an object of the tape becomes an overlay
/// of its members when `rest` names a key in it; anything else of the tape, and a shared
/// value, becomes a `Value` of its own.
fn open<'m>(tape: &Tape, body: &[u8], slot: &'m mut Member, rest: &[Segment]) -> &'m mut Member {
    match slot {
        Member::Raw(index) => {
            let index = *index;
            *slot = match rest.first() {
                Some(Segment::Key(_)) if tape.is_object_at(index) => {
                    Member::Object(Box::new(Overlay::of_node(tape, index)))
                }
                _ => Member::Value(Box::new(tape.to_value(body, index))),
            };
        }
        Member::Shared(shared) => *slot = Member::Value(Box::new(shared.value.clone())),
        Member::Value(_) | Member::Object(_) => {}
    }
    slot
}

/// Removes the member at `path` below `overlay` (not empty; a key of `overlay` itself: every
/// copy of it).
fn remove_in(tape: &Tape, body: &[u8], overlay: &mut Overlay, path: &[Segment]) -> Option<Member> {
    let (Segment::Key(first), rest) = path.split_first()? else {
        return None;
    };
    overlay.value = OnceLock::new();
    if rest.is_empty() {
        let mut taken = None;
        overlay.members.retain_mut(|(key, member)| {
            if !key_is(tape, body, key, first) {
                return true;
            }
            // The member is removed: what is left in its place is never read.
            taken = Some(std::mem::replace(member, Member::Raw(0)));
            false
        });
        return taken;
    }
    let at = position(tape, body, overlay, first)?;
    let slot = &mut overlay.members[at].1;
    if let Member::Raw(index) = *slot
        && tape.find(body, index, rest).is_none()
    {
        // Nothing to remove: leave the member as it came.
        return None;
    }
    match open(tape, body, slot, rest) {
        Member::Object(nested) => remove_in(tape, body, nested, rest),
        Member::Value(value) => field::remove_in(rest, value).map(|v| Member::Value(Box::new(v))),
        Member::Raw(_) | Member::Shared(_) => unreachable!("opened above"),
    }
}

/// Puts `new` at `path` below `overlay` (not empty), making objects on the way; fails where
/// the way passes through a value that is not an object, as [`FieldPath::set`] does.
///
/// [`FieldPath::set`]: crate::field::FieldPath::set
fn set_in(
    tape: &Tape,
    body: &[u8],
    overlay: &mut Overlay,
    path: &[Segment],
    new: Member,
) -> Result<(), ()> {
    let Some((Segment::Key(first), rest)) = path.split_first() else {
        return Err(());
    };
    overlay.value = OnceLock::new();
    let at = position(tape, body, overlay, first);
    match (at, rest.is_empty()) {
        (Some(at), true) => overlay.members[at].1 = new,
        (None, true) => overlay.members.push((Key::New(first.as_str().into()), new)),
        (Some(at), false) => match open(tape, body, &mut overlay.members[at].1, rest) {
            Member::Object(nested) => set_in(tape, body, nested, rest, new)?,
            Member::Value(value) => {
                let new = member_value(tape, body, new);
                field::set_in(rest, value, new).map_err(|_| ())?;
            }
            Member::Raw(_) | Member::Shared(_) => unreachable!("opened above"),
        },
        (None, false) => {
            let mut value = Value::Object(Map::new());
            let new = member_value(tape, body, new);
            let result = field::set_in(rest, &mut value, new).map_err(|_| ());
            overlay.members.push((
                Key::New(first.as_str().into()),
                Member::Value(Box::new(value)),
            ));
            result?;
        }
    }
    Ok(())
}

impl DocMut<'_> {
    /// Removes and returns the value at `path` (a key of the body itself: every copy of it).
    /// Objects of the body on the way are edited member by member.
    pub(crate) fn remove(&mut self, path: &[Segment]) -> Option<Member> {
        remove_in(self.tape, self.body, self.overlay, path)
    }

    /// Puts `new` at `path` (not empty), making objects on the way; fails where the way
    /// passes through a value that is not an object, as [`FieldPath::set`] does.
    ///
    /// [`FieldPath::set`]: crate::field::FieldPath::set
    pub(crate) fn set(&mut self, path: &[Segment], new: Member) -> Result<(), ()> {
        set_in(self.tape, self.body, self.overlay, path, new)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn tape(text: &str) -> Option<Tape> {
        scan(text.as_bytes())
    }

    #[test]
    fn the_scanner_indexes_plain_json_and_leaves_the_rest_to_serde_json() {
        for good in [
            r#"{"a":1,"b":[true,false,null],"c":{"d":"x\"y"},"e":-0.5}"#,
            " [ ] ",
            "0",
            r#""""#,
            r#"{"a":{}}"#,
        ] {
            let tape = tape(good).unwrap_or_else(|| panic!("{good}"));
            let parsed: Value = serde_json::from_str(good).expect("JSON");
            assert_eq!(tape.to_value(good.as_bytes(), 0), parsed, "{good}");
        }
        for left in [
            "",
            " ",
            "1e5",
            "01",
            "1.",
            "-",
            "[1,]",
            "{\"a\":1,}",
            r#""\u00e9""#,
            "[1 2]",
            "{\"a\" 1}",
            "nul",
            "\"\t\"",
            "123456789012345678901",
            "[1]x",
            "{1:2}",
        ] {
            assert!(tape(left).is_none(), "{left:?}");
        }
        let deep = format!(
            "{}{}",
            "[".repeat(SCAN_DEPTH_MAX + 1),
            "]".repeat(SCAN_DEPTH_MAX + 1)
        );
        assert!(tape(&deep).is_none());
        let ok = format!(
            "{}{}",
            "[".repeat(SCAN_DEPTH_MAX),
            "]".repeat(SCAN_DEPTH_MAX)
        );
        assert!(tape(&ok).is_some());
    }

    #[test]
    fn duplicate_keys_read_as_a_parse_reads_them() {
        let body = r#"{"a":1,"b":{"c":1,"c":2},"a":3}"#;
        let tape = tape(body).expect("indexed");
        let overlay = Overlay::of(&tape);
        let doc = Doc {
            tape: &tape,
            body: body.as_bytes(),
            overlay: &overlay,
        };
        let path = |t: &str| crate::field::FieldPath::parse(t).expect(t);
        assert_eq!(doc.value(path("a").segments()), Some(&Value::from(3)));
        assert_eq!(doc.value(path("b.c").segments()), Some(&Value::from(2)));
        let parsed: Value = serde_json::from_str(body).expect("JSON");
        assert_eq!(doc.to_value(), parsed);
    }

    proptest! {
        #[test]
        fn what_the_scanner_takes_serde_json_takes_alike(
            text in "[\\[\\]{}\",:0-9a-eE\\.\\-+ \\\\nut]{0,40}",
        ) {
            if let Some(tape) = tape(&text) {
                let parsed: Value = serde_json::from_str(&text)
                    .map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
                prop_assert_eq!(tape.to_value(text.as_bytes(), 0), parsed);
            }
        }

        #[test]
        fn an_object_repeats_exactly_when_a_key_appears_twice_or_is_escaped(
            outer in proptest::collection::vec("[ab/]{0,2}", 0..40),
            inner in proptest::collection::vec("[ab]{0,2}", 0..24),
            escape in any::<bool>(),
        ) {
            let member = |key: &str| {
                let key = if escape { key.replace('/', "\\/") } else { key.to_owned() };
                format!("\"{key}\":1")
            };
            let inner: Vec<String> = inner.iter().map(|k| member(k)).collect();
            let mut members: Vec<String> = outer.iter().map(|k| member(k)).collect();
            members.insert(members.len() / 2, format!("\"in\":{{{}}}", inner.join(",")));
            let body = format!("{{{}}}", members.join(","));
            let tape = scan(body.as_bytes()).expect("indexed");
            for index in (0..tape.nodes.len()).filter(|&i| tape.is_object_at(i)) {
                let keys: Vec<(Kind, String)> = tape
                    .members(index)
                    .map(|(k, _)| (tape.node(k).kind, tape.text(body.as_bytes(), k).unwrap_or_default().into_owned()))
                    .collect();
                let escaped = keys.iter().any(|(kind, _)| *kind != Kind::Str);
                let twice = keys.iter().enumerate().any(|(i, a)| keys[i + 1..].iter().any(|b| a.1 == b.1));
                prop_assert_eq!(tape.repeats(index), escaped || twice, "{}", body);
            }
        }

        #[test]
        fn repeats_are_found_exactly_among_keys_of_equal_fingerprints(
            middles in proptest::collection::vec("[ab]{0,3}", 0..40),
            short in any::<bool>(),
        ) {
            // Long keys with one head and tail share a fingerprint unless their lengths differ.
            let keys: Vec<String> = middles
                .iter()
                .map(|m| if short { m.clone() } else { format!("head-of-key{m}tail-of-key") })
                .collect();
            let members: Vec<String> = keys.iter().map(|k| format!("\"{k}\":0")).collect();
            let body = format!("{{{}}}", members.join(","));
            let tape = scan(body.as_bytes()).expect("indexed");
            let twice = keys.iter().enumerate().any(|(i, a)| keys[i + 1..].contains(a));
            prop_assert_eq!(tape.repeats(0), twice, "{}", body);
        }

        #[test]
        fn the_string_scan_finds_the_first_quote_backslash_or_control_character(
            bytes in proptest::collection::vec(
                prop_oneof![Just(b'"'), Just(b'\\'), 0u8..0x20, any::<u8>(), 0x20u8..0x7f],
                0..40,
            ),
        ) {
            let expected = bytes.iter().position(|&b| b == b'"' || b == b'\\' || b < 0x20);
            prop_assert_eq!(special::<false>(&bytes), expected);
            let expected = bytes
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || !(0x20..0x80).contains(&b));
            prop_assert_eq!(special::<true>(&bytes), expected);
        }

        #[test]
        fn plain_utf_8_strings_are_indexed_and_every_indexed_one_reads_as_serde_json_reads_it(
            text in proptest::collection::vec(
                prop_oneof![any::<u8>(), 0x80u8..=0xff, 0x20u8..0x7f, Just(b'\\')],
                0..40,
            ),
            multibyte in "[a-zé€😀]{0,8}",
        ) {
            let mut inner = multibyte.into_bytes();
            inner.extend_from_slice(&text);
            let mut body = b"{\"k\":\"".to_vec();
            body.extend_from_slice(&inner);
            body.extend_from_slice(b"\"}");
            let plain = std::str::from_utf8(&inner).is_ok()
                && !inner.iter().any(|&b| b == b'"' || b == b'\\' || b < 0x20);
            match scan(&body) {
                Some(tape) => {
                    let parsed: Value = serde_json::from_slice(&body)
                        .map_err(|e| TestCaseError::fail(format!("{body:?}: {e}")))?;
                    prop_assert_eq!(tape.to_value(&body, 0), parsed);
                }
                None => prop_assert!(!plain, "{:?}", body),
            }
        }

        #[test]
        fn integers_read_as_serde_json_reads_them(
            n in prop_oneof![any::<i64>(), -1000i64..1000, Just(0)],
            negative_zero in any::<bool>(),
        ) {
            let text = if negative_zero { "-0".to_owned() } else { n.to_string() };
            if text.trim_start_matches('-').len() <= INT_DIGITS_MAX {
                let parsed: Value = serde_json::from_str(&text).expect("a number");
                let tape = scan(text.as_bytes()).expect("indexed");
                prop_assert_eq!(tape.to_value(text.as_bytes(), 0), parsed);
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            if let Some(tape) = scan(&bytes) {
                let parsed: Value = serde_json::from_slice(&bytes)
                    .map_err(|e| TestCaseError::fail(format!("{bytes:?}: {e}")))?;
                prop_assert_eq!(tape.to_value(&bytes, 0), parsed);
            }
        }
    }
}
