//! A strict structural reader of encoded AMQP 1.0 messages.
//!
//! [`scan_message`] walks the bytes of one encoded message and checks its shape before anything
//! decodes the contents: every section is a described type with a known message-section
//! descriptor (numeric or symbolic), sections come in the order the specification fixes (header,
//! delivery annotations, message annotations, properties, application properties, body, footer),
//! each non-body section at most once, the body is one or more `data` sections, one or more
//! `amqp-sequence` sections or exactly one `amqp-value`, every length stays inside the buffer,
//! and nothing trails the last section. It returns each section's extent, in the
//! specification's order, so the caller can decode them.
//!
//! One departure from the specification's order is accepted because a real client writes it
//! and the service takes it: pyamqp (the Python SDK) encodes the `delivery-annotations` section
//! *last*, after the body and footer. A message may carry delivery annotations either at their
//! place or as its final section, never both; [`scan_message`] returns them at their place, and
//! [`canonical_bytes`] gives the message re-encoded in that order for a decoder that insists on
//! it.
//!
//! Used for the messages inside a batched transfer (format `0x80013700`), which arrive as opaque
//! `data` sections. It never panics and never allocates in proportion to a length field (a
//! property test feeds it arbitrary bytes).

use crate::limits::DESCRIBED_DEPTH_MAX;

/// Why bytes are not a well-formed message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed AMQP message at byte {position}: {reason}")]
pub struct ScanError {
    /// Where the problem was found.
    pub position: usize,
    /// What it is.
    pub reason: &'static str,
}

/// The kind of a message section, in the order sections must appear.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SectionKind {
    /// `header` (0x70).
    Header,
    /// `delivery-annotations` (0x71).
    DeliveryAnnotations,
    /// `message-annotations` (0x72).
    MessageAnnotations,
    /// `properties` (0x73).
    Properties,
    /// `application-properties` (0x74).
    ApplicationProperties,
    /// `data` (0x75): the payload is the binary's contents.
    Data,
    /// `amqp-sequence` (0x76).
    AmqpSequence,
    /// `amqp-value` (0x77).
    AmqpValue,
    /// `footer` (0x78).
    Footer,
}

impl SectionKind {
    fn from_code(code: u64) -> Option<SectionKind> {
        Some(match code {
            0x70 => SectionKind::Header,
            0x71 => SectionKind::DeliveryAnnotations,
            0x72 => SectionKind::MessageAnnotations,
            0x73 => SectionKind::Properties,
            0x74 => SectionKind::ApplicationProperties,
            0x75 => SectionKind::Data,
            0x76 => SectionKind::AmqpSequence,
            0x77 => SectionKind::AmqpValue,
            0x78 => SectionKind::Footer,
            _ => return None,
        })
    }

    fn from_symbol(symbol: &[u8]) -> Option<SectionKind> {
        Some(match symbol {
            b"amqp:header:list" => SectionKind::Header,
            b"amqp:delivery-annotations:map" => SectionKind::DeliveryAnnotations,
            b"amqp:message-annotations:map" => SectionKind::MessageAnnotations,
            b"amqp:properties:list" => SectionKind::Properties,
            b"amqp:application-properties:map" => SectionKind::ApplicationProperties,
            b"amqp:data:binary" => SectionKind::Data,
            b"amqp:amqp-sequence:list" => SectionKind::AmqpSequence,
            b"amqp:amqp-value:*" => SectionKind::AmqpValue,
            b"amqp:footer:map" => SectionKind::Footer,
            _ => return None,
        })
    }

    fn is_body(self) -> bool {
        matches!(
            self,
            SectionKind::Data | SectionKind::AmqpSequence | SectionKind::AmqpValue
        )
    }
}

/// One section of a scanned message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section<'a> {
    /// Its kind.
    pub kind: SectionKind,
    /// The whole encoded section, descriptor included.
    pub encoded: &'a [u8],
    /// For `data` sections, the binary's contents; otherwise the encoded value.
    pub payload: &'a [u8],
}

/// The encoded section of `kind` in `bytes` (a message, or an event's kept protocol sections),
/// descriptor included; None when there is none or the bytes are not a well-formed message.
pub(crate) fn encoded_section(bytes: &[u8], kind: SectionKind) -> Option<&[u8]> {
    scan_message(bytes)
        .ok()?
        .into_iter()
        .find(|section| section.kind == kind)
        .map(|section| section.encoded)
}

/// Checks the shape of an encoded message and returns its sections in the specification's order
/// (delivery annotations written last, as pyamqp does, are returned second or first).
pub fn scan_message(bytes: &[u8]) -> Result<Vec<Section<'_>>, ScanError> {
    let mut sections: Vec<Section<'_>> = Vec::new();
    let mut position = 0;
    let mut trailing_delivery_annotations = false;
    while position < bytes.len() {
        let start = position;
        let (kind, value_start) = read_section_descriptor(bytes, position)?;
        let value_end = skip_value(bytes, value_start, 0)?;
        if trailing_delivery_annotations {
            return fail(start, "a section follows delivery annotations written last");
        }
        trailing_delivery_annotations = is_trailing_delivery_annotations(&sections, kind, start)?;
        if !trailing_delivery_annotations {
            check_order(&sections, kind, start)?;
        }
        let payload = if kind == SectionKind::Data {
            binary_contents(bytes, value_start, value_end)?
        } else {
            &bytes[value_start..value_end]
        };
        sections.push(Section {
            kind,
            encoded: &bytes[start..value_end],
            payload,
        });
        position = value_end;
    }
    if trailing_delivery_annotations {
        // Put them at their place: after the header, if there is one.
        let annotations = sections
            .pop()
            .expect("the trailing section was just pushed");
        let at = usize::from(sections[0].kind == SectionKind::Header);
        sections.insert(at, annotations);
    }
    if !sections.iter().any(|s| s.kind.is_body()) && sections.is_empty() {
        return Err(ScanError {
            position: 0,
            reason: "an empty message",
        });
    }
    Ok(sections)
}

/// Whether a `kind` section read after `sections` is delivery annotations written after sections
/// that come after them in the specification's order (pyamqp's order). Repeated delivery
/// annotations are refused.
fn is_trailing_delivery_annotations(
    sections: &[Section<'_>],
    kind: SectionKind,
    position: usize,
) -> Result<bool, ScanError> {
    if kind != SectionKind::DeliveryAnnotations {
        return Ok(false);
    }
    if sections.iter().any(|s| s.kind == kind) {
        return fail(position, "a section is out of order or repeated");
    }
    Ok(sections
        .last()
        .is_some_and(|last| last.kind > SectionKind::DeliveryAnnotations))
}

/// The message's bytes with its sections in the specification's order: borrowed when they are
/// already (the common case), re-assembled when delivery annotations were written last.
/// `sections` is what [`scan_message`] returned for `bytes`.
pub fn canonical_bytes<'a>(
    bytes: &'a [u8],
    sections: &[Section<'a>],
) -> std::borrow::Cow<'a, [u8]> {
    let in_place = sections
        .windows(2)
        .all(|pair| pair[0].encoded.as_ptr() < pair[1].encoded.as_ptr());
    if in_place {
        return std::borrow::Cow::Borrowed(bytes);
    }
    let mut ordered = Vec::with_capacity(bytes.len());
    for section in sections {
        ordered.extend_from_slice(section.encoded);
    }
    debug_assert_eq!(ordered.len(), bytes.len());
    std::borrow::Cow::Owned(ordered)
}

fn fail<T>(position: usize, reason: &'static str) -> Result<T, ScanError> {
    Err(ScanError { position, reason })
}

fn check_order(
    sections: &[Section<'_>],
    kind: SectionKind,
    position: usize,
) -> Result<(), ScanError> {
    let Some(last) = sections.last() else {
        return Ok(());
    };
    let repeatable = matches!(kind, SectionKind::Data | SectionKind::AmqpSequence);
    if last.kind == kind && repeatable {
        return Ok(());
    }
    if kind <= last.kind {
        return fail(position, "a section is out of order or repeated");
    }
    if kind.is_body() && last.kind.is_body() {
        return fail(
            position,
            "a body mixes data, amqp-sequence and amqp-value sections",
        );
    }
    Ok(())
}

/// Reads `0x00 <descriptor>` at `position`; returns the section kind and where its value starts.
fn read_section_descriptor(
    bytes: &[u8],
    position: usize,
) -> Result<(SectionKind, usize), ScanError> {
    if bytes.get(position) != Some(&0x00) {
        return fail(position, "a section must be a described type");
    }
    let at = position + 1;
    let unknown = || ScanError {
        position: at,
        reason: "unknown section descriptor",
    };
    match bytes.get(at) {
        Some(0x53) => {
            let code = *bytes.get(at + 1).ok_or_else(unknown)?;
            let kind = SectionKind::from_code(u64::from(code)).ok_or_else(unknown)?;
            Ok((kind, at + 2))
        }
        Some(0x80) => {
            let raw = bytes.get(at + 1..at + 9).ok_or_else(unknown)?;
            let code = u64::from_be_bytes(raw.try_into().expect("8 bytes"));
            Ok((SectionKind::from_code(code).ok_or_else(unknown)?, at + 9))
        }
        Some(0xa3) | Some(0xb3) => {
            let end = skip_value(bytes, at, 0)?;
            let header = if bytes[at] == 0xa3 { 2 } else { 5 };
            let kind = SectionKind::from_symbol(&bytes[at + header..end]).ok_or_else(unknown)?;
            Ok((kind, end))
        }
        _ => Err(unknown()),
    }
}

fn binary_contents(bytes: &[u8], start: usize, end: usize) -> Result<&[u8], ScanError> {
    match bytes[start] {
        0xa0 => Ok(&bytes[start + 2..end]),
        0xb0 => Ok(&bytes[start + 5..end]),
        _ => fail(start, "a data section must hold a binary"),
    }
}

/// Reads a big-endian length of `width` (1 or 4) bytes at `at`.
fn read_len(bytes: &[u8], at: usize, width: usize) -> Result<usize, ScanError> {
    let raw = bytes.get(at..at + width).ok_or(ScanError {
        position: at,
        reason: "truncated length",
    })?;
    let mut len = 0usize;
    for b in raw {
        len = (len << 8) | usize::from(*b);
    }
    Ok(len)
}

/// The end of `len` bytes starting at `from`, if they are inside the buffer.
fn extent(bytes: &[u8], from: usize, len: usize) -> Result<usize, ScanError> {
    match from.checked_add(len) {
        Some(end) if end <= bytes.len() => Ok(end),
        _ => fail(from, "a length runs past the end"),
    }
}

/// Returns the position just past the encoded value starting at `at`.
pub(crate) fn skip_value(bytes: &[u8], at: usize, depth: u32) -> Result<usize, ScanError> {
    let code = *bytes.get(at).ok_or(ScanError {
        position: at,
        reason: "truncated value",
    })?;
    let body = at + 1;
    match code {
        0x00 => {
            if depth >= DESCRIBED_DEPTH_MAX {
                return fail(at, "described types nest too deeply");
            }
            let after_descriptor = skip_value(bytes, body, depth + 1)?;
            skip_value(bytes, after_descriptor, depth + 1)
        }
        0x40..=0x45 => Ok(body),
        0x50..=0x56 => extent(bytes, body, 1),
        0x60 | 0x61 => extent(bytes, body, 2),
        0x70..=0x74 => extent(bytes, body, 4),
        0x80..=0x84 => extent(bytes, body, 8),
        0x94 | 0x98 => extent(bytes, body, 16),
        0xa0 | 0xa1 | 0xa3 => extent(bytes, body + 1, read_len(bytes, body, 1)?),
        0xb0 | 0xb1 | 0xb3 => extent(bytes, body + 4, read_len(bytes, body, 4)?),
        0xc0 | 0xc1 | 0xe0 => compound_end(bytes, body, 1),
        0xd0 | 0xd1 | 0xf0 => compound_end(bytes, body, 4),
        _ => fail(at, "unknown type constructor"),
    }
}

/// A list, map or array: `size` covers the count and the elements, which the caller's decoder
/// checks; here only the extent and that the count fits inside it.
fn compound_end(bytes: &[u8], at: usize, width: usize) -> Result<usize, ScanError> {
    let size = read_len(bytes, at, width)?;
    if size < width {
        return fail(at, "a compound value is smaller than its count");
    }
    extent(bytes, at + width, size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// header(durable), message-annotations{}, data("hi")
    const GOOD: &[u8] = &[
        0x00, 0x53, 0x70, 0xc0, 0x02, 0x01, 0x41, // header [true]
        0x00, 0x53, 0x72, 0xc1, 0x01, 0x00, // message annotations {}
        0x00, 0x53, 0x75, 0xa0, 0x02, b'h', b'i', // data "hi"
    ];

    #[test]
    fn a_well_formed_message_scans() {
        let sections = scan_message(GOOD).unwrap();
        let kinds: Vec<_> = sections.iter().map(|s| s.kind).collect();
        assert_eq!(
            kinds,
            [
                SectionKind::Header,
                SectionKind::MessageAnnotations,
                SectionKind::Data
            ]
        );
        assert_eq!(sections[2].payload, b"hi");
        assert_eq!(sections[0].encoded, &GOOD[..7]);
    }

    #[test]
    fn symbolic_and_ulong_descriptors_are_accepted() {
        let mut msg = vec![0x00, 0xa3, 16];
        msg.extend_from_slice(b"amqp:data:binary");
        msg.extend_from_slice(&[0xa0, 0x01, b'x']);
        msg.extend_from_slice(&[0x00, 0x80, 0, 0, 0, 0, 0, 0, 0, 0x75, 0xa0, 0x00]);
        let sections = scan_message(&msg).unwrap();
        assert_eq!(sections.len(), 2);
        assert_eq!(sections[0].payload, b"x");
    }

    #[test]
    fn malformed_messages_are_refused() {
        let mut trailing = GOOD.to_vec();
        trailing.push(0x40);
        let mut reordered = GOOD[7..13].to_vec();
        reordered.extend_from_slice(&GOOD[..7]);
        let mixed = [0x00, 0x53, 0x75, 0xa0, 0x00, 0x00, 0x53, 0x77, 0x40];
        let two_values = [0x00, 0x53, 0x77, 0x40, 0x00, 0x53, 0x77, 0x40];
        let data_not_binary = [0x00, 0x53, 0x75, 0xa1, 0x00];
        let too_long = [0x00, 0x53, 0x75, 0xb0, 0xff, 0xff, 0xff, 0xff, 0x00];
        let unknown = [0x00, 0x53, 0x79, 0x40];
        for bad in [
            &trailing[..],
            &reordered,
            &mixed,
            &two_values,
            &data_not_binary,
            &too_long,
            &unknown,
            &GOOD[..GOOD.len() - 1],
            &[],
        ] {
            assert!(scan_message(bad).is_err(), "{bad:x?}");
        }
    }

    /// delivery-annotations {"k": 1}
    const DELIVERY_ANNOTATIONS: &[u8] = &[
        0x00, 0x53, 0x71, 0xc1, 0x06, 0x02, 0xa3, 0x01, b'k', 0x54, 0x01,
    ];

    #[test]
    fn delivery_annotations_written_last_are_put_in_their_place() {
        // pyamqp's order: header, message annotations, data, then delivery annotations.
        let mut pyamqp = GOOD.to_vec();
        pyamqp.extend_from_slice(DELIVERY_ANNOTATIONS);
        let sections = scan_message(&pyamqp).unwrap();
        let kinds: Vec<_> = sections.iter().map(|s| s.kind).collect();
        assert_eq!(
            kinds,
            [
                SectionKind::Header,
                SectionKind::DeliveryAnnotations,
                SectionKind::MessageAnnotations,
                SectionKind::Data
            ]
        );
        let mut expected = GOOD[..7].to_vec();
        expected.extend_from_slice(DELIVERY_ANNOTATIONS);
        expected.extend_from_slice(&GOOD[7..]);
        assert_eq!(&*canonical_bytes(&pyamqp, &sections), &expected[..]);
        // Already in order: the same bytes, borrowed.
        let in_order = scan_message(&expected).unwrap();
        assert!(matches!(
            canonical_bytes(&expected, &in_order),
            std::borrow::Cow::Borrowed(b) if b == &expected[..]
        ));
        // Without a header they go first.
        let mut headless = GOOD[7..].to_vec();
        headless.extend_from_slice(DELIVERY_ANNOTATIONS);
        let sections = scan_message(&headless).unwrap();
        assert_eq!(sections[0].kind, SectionKind::DeliveryAnnotations);
    }

    #[test]
    fn delivery_annotations_stay_single_and_last_when_written_last() {
        let mut twice = GOOD[..7].to_vec();
        twice.extend_from_slice(DELIVERY_ANNOTATIONS);
        twice.extend_from_slice(&GOOD[7..]);
        twice.extend_from_slice(DELIVERY_ANNOTATIONS);
        let mut then_more = GOOD.to_vec();
        then_more.extend_from_slice(DELIVERY_ANNOTATIONS);
        then_more.extend_from_slice(&GOOD[13..]);
        for bad in [twice, then_more] {
            assert!(scan_message(&bad).is_err(), "{bad:x?}");
        }
    }

    #[test]
    fn deep_nesting_is_bounded() {
        let mut deep = vec![0x00, 0x53, 0x77];
        deep.extend(std::iter::repeat_n(0x00, 10_000));
        assert!(scan_message(&deep).is_err());
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = scan_message(&bytes);
        }

        #[test]
        fn never_panics_on_mutated_messages(index in 0usize..20, byte in proptest::num::u8::ANY, cut in 0usize..21) {
            let mut bytes = GOOD.to_vec();
            bytes[index % GOOD.len()] = byte;
            bytes.truncate(cut);
            let _ = scan_message(&bytes);
        }
    }
}
