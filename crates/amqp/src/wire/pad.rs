//! Pads the field lists of outgoing performatives to their full length.
//!
//! AMQP 1.0 lets an encoder omit trailing null fields of a described list, and the engine's
//! serializer does (it also omits trailing fields equal to their default). The Python SDK's
//! `pyamqp` does not accept that: it indexes performative fields by position (`open[9]`,
//! `attach[13]`, the payload of a `transfer` at index 11, …) and fails with `IndexError` on a
//! short list. So every frame the engine writes passes through a [`Framer`], which re-encodes
//! the performative's list with the omitted fields as explicit nulls — the same values, the
//! shape the Microsoft stack sends. Headers, empty frames and frame payloads pass unchanged;
//! a frame it does not understand passes unchanged too.
//!
//! A padded frame is at most [`PAD_BYTES_MAX`] bytes longer than the engine made it. The engine
//! sizes its frames to the peer's `max-frame-size`, so the padding could push a frame over it
//! (a peer with a strict decoder — the `fe2o3-amqp` client, for one — then drops the connection).
//! To keep every padded frame within the peer's limit, the peer's `open` is adjusted on its way
//! in ([`Inbound`]): the engine is told a `max-frame-size` [`PAD_BYTES_MAX`] smaller than the
//! peer's.
//!
//! The same inbound adjustment halves the peer's `idle-time-out`: the engine sends its empty
//! keep-alive frames at the peer's full idle timeout, where the specification asks for a frame
//! well within it (rhea, the JavaScript SDK's engine, tolerates twice its value, stricter peers
//! do not); at half, a keep-alive always arrives in time.

use fe2o3_amqp_types::definitions::MIN_MAX_FRAME_SIZE;
use fe2o3_amqp_types::performatives::{MaxFrameSize, Open};

/// The most bytes padding adds to a frame: a list0 or list8 header becomes a list32 one (+8 at
/// most) and at most 14 omitted fields become nulls (+14).
pub(crate) const PAD_BYTES_MAX: usize = 22;

/// The number of fields of each performative (AMQP frames) and SASL frame body.
fn arity(code: u64) -> Option<usize> {
    Some(match code {
        0x10 => 10, // open
        0x11 => 8,  // begin
        0x12 => 14, // attach
        0x13 => 11, // flow
        0x14 => 11, // transfer
        0x15 => 6,  // disposition
        0x16 => 3,  // detach
        0x17 => 1,  // end
        0x18 => 1,  // close
        0x40 => 1,  // sasl-mechanisms
        0x41 => 3,  // sasl-init
        0x42 => 1,  // sasl-challenge
        0x43 => 1,  // sasl-response
        0x44 => 2,  // sasl-outcome
        _ => return None,
    })
}

/// Appends one complete frame to `out`, its performative's list padded; returns false (and
/// appends nothing) when the frame needs no padding or is not understood.
pub(crate) fn pad_frame_into(frame: &[u8], out: &mut Vec<u8>) -> bool {
    let Some((code, doff, list_at)) = performative(frame) else {
        return false;
    };
    let body = &frame[doff..];
    let Some(fields) = arity(code) else {
        return false;
    };
    let Some((count, elements, after)) = read_list(body, list_at) else {
        return false;
    };
    if count >= fields {
        return false;
    }
    let missing = fields - count;
    let list_size = (4 + elements.len() + missing) as u32;
    let start = out.len();
    out.reserve(frame.len() + PAD_BYTES_MAX);
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&frame[4..doff]);
    out.extend_from_slice(&body[..list_at]);
    out.push(0xd0);
    out.extend_from_slice(&list_size.to_be_bytes());
    out.extend_from_slice(&(fields as u32).to_be_bytes());
    out.extend_from_slice(elements);
    out.extend(std::iter::repeat_n(0x40, missing));
    out.extend_from_slice(&body[after..]);
    let size = (out.len() - start) as u32;
    out[start..start + 4].copy_from_slice(&size.to_be_bytes());
    assert!(out.len() - start <= frame.len() + PAD_BYTES_MAX);
    true
}

/// The descriptor code of a frame's performative, its data offset and where its list starts.
fn performative(frame: &[u8]) -> Option<(u64, usize, usize)> {
    let doff = usize::from(*frame.get(4)?) * 4;
    if doff < 8 || frame.len() <= doff || frame.len() > u32::MAX as usize {
        return None;
    }
    match &frame[doff..] {
        [0x00, 0x53, code, ..] => Some((u64::from(*code), doff, 3)),
        [0x00, 0x80, rest @ ..] if rest.len() >= 8 => {
            Some((u64::from_be_bytes(rest[..8].try_into().ok()?), doff, 10))
        }
        _ => None,
    }
}

/// One complete frame padded; `None` when it needs no padding or is not understood.
#[cfg(test)]
pub(crate) fn pad_frame(frame: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    pad_frame_into(frame, &mut out).then_some(out)
}

/// The longest frame read before the peer's `open` (SASL frames, the `open` itself). Real ones
/// are under 1 KiB; anything longer is passed to the engine unchanged, which judges it.
const INBOUND_SCAN_BYTES_MAX: usize = 64 * 1024;

/// The peer's `open` frame, adjusted for the engine (see the module docs); `None` if `frame` is
/// not an `open` or does not decode (then it passes unchanged and the engine judges it).
pub(crate) fn adjust_open(frame: &[u8]) -> Option<Vec<u8>> {
    let doff = usize::from(*frame.get(4)?) * 4;
    if doff < 8 || frame.len() <= doff || frame[5] != 0 {
        return None;
    }
    let body = &frame[doff..];
    if !body.starts_with(&[0x00, 0x53, 0x10]) {
        return None;
    }
    let mut open: Open = serde_amqp::from_slice(body).ok()?;
    let peer_max = usize::try_from(open.max_frame_size.0).ok()?;
    let room = peer_max
        .saturating_sub(PAD_BYTES_MAX)
        .max(MIN_MAX_FRAME_SIZE);
    open.max_frame_size = MaxFrameSize(u32::try_from(room).ok()?);
    open.idle_time_out = open
        .idle_time_out
        .map(|ms| if ms > 1 { ms / 2 } else { ms });
    let body = serde_amqp::to_vec(&open).ok()?;
    let mut out = Vec::with_capacity(8 + body.len());
    let size = u32::try_from(8 + body.len()).ok()?;
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&[2, 0]);
    out.extend_from_slice(&frame[6..8]);
    out.extend_from_slice(&body);
    Some(out)
}

/// Reads the list at `at`: its element count, its element bytes, and where it ends.
fn read_list(body: &[u8], at: usize) -> Option<(usize, &[u8], usize)> {
    match *body.get(at)? {
        0x45 => Some((0, &[], at + 1)),
        0xc0 => {
            let size = usize::from(*body.get(at + 1)?);
            let count = usize::from(*body.get(at + 2)?);
            let end = (at + 2).checked_add(size)?;
            let elements = body.get(at + 3..end)?;
            Some((count, elements, end))
        }
        0xd0 => {
            let size = u32::from_be_bytes(body.get(at + 1..at + 5)?.try_into().ok()?);
            let count = u32::from_be_bytes(body.get(at + 5..at + 9)?.try_into().ok()?);
            let end = (at + 5).checked_add(usize::try_from(size).ok()?)?;
            let elements = body.get(at + 9..end)?;
            Some((usize::try_from(count).ok()?, elements, end))
        }
        _ => None,
    }
}

/// The engine's outgoing bytes, cut into headers and frames and padded.
#[derive(Debug, Default)]
pub(crate) struct Framer {
    /// Bytes written by the engine, not yet a complete frame or header.
    pending: Vec<u8>,
}

impl Framer {
    /// Appends every complete header or frame of `pending` + `bytes` to `out`, padded; keeps
    /// the incomplete rest.
    pub(crate) fn push(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        if self.pending.is_empty() {
            // The engine writes whole frames: nothing is copied twice.
            let used = Self::frames(bytes, out);
            self.pending.extend_from_slice(&bytes[used..]);
        } else {
            self.pending.extend_from_slice(bytes);
            let used = Self::frames(&self.pending, out);
            self.pending.drain(..used);
        }
    }

    /// Moves the complete headers and frames at the start of `bytes` to `out`; returns how many
    /// bytes they took.
    fn frames(bytes: &[u8], out: &mut Vec<u8>) -> usize {
        let mut at = 0;
        loop {
            let rest = &bytes[at..];
            if rest.len() < 8 {
                return at;
            }
            let len = if rest.starts_with(b"AMQP") {
                8
            } else {
                let size = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes"));
                // A size below the header is the engine's bug, not the peer's; pass it on.
                (usize::try_from(size).unwrap_or(usize::MAX)).max(8)
            };
            if rest.len() < len {
                return at;
            }
            let frame = &rest[..len];
            if !pad_frame_into(frame, out) {
                out.extend_from_slice(frame);
            }
            at += len;
        }
    }
}

/// The peer's incoming bytes until its `open` has passed: headers and frames are cut out and
/// the `open` adjusted (see the module docs); afterwards everything passes unchanged.
#[derive(Debug)]
pub(crate) struct Inbound {
    /// Whether incoming bytes are still scanned for the peer's `open`.
    pub(crate) scanning: bool,
    /// Incoming bytes read but not yet scanned (an incomplete header or frame).
    scan: Vec<u8>,
    /// Incoming bytes scanned, not yet handed to the engine.
    ready: Vec<u8>,
    /// How much of `ready` the engine took already.
    taken: usize,
}

impl Default for Inbound {
    fn default() -> Self {
        Inbound {
            scanning: true,
            scan: Vec::new(),
            ready: Vec::new(),
            taken: 0,
        }
    }
}

impl Inbound {
    /// Scanned bytes not yet handed to the engine.
    pub(crate) fn ready(&self) -> &[u8] {
        &self.ready[self.taken..]
    }

    /// The engine took `n` of the ready bytes.
    pub(crate) fn take(&mut self, n: usize) {
        self.taken += n;
        assert!(self.taken <= self.ready.len());
        if self.taken == self.ready.len() {
            self.ready = Vec::new();
            self.taken = 0;
        }
    }

    /// Bytes read from the peer while scanning.
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.scan.extend_from_slice(bytes);
        self.scan_frames();
    }

    /// The peer closed its side: whatever was read is handed over as it is.
    pub(crate) fn end(&mut self) {
        self.scanning = false;
        self.ready.append(&mut self.scan);
    }

    /// Moves every complete header or frame from `scan` to `ready`, adjusting the peer's
    /// `open`; after the `open` (or anything unexpected) the rest passes unchanged and scanning
    /// stops.
    fn scan_frames(&mut self) {
        let mut at = 0;
        while self.scanning {
            let rest = &self.scan[at..];
            if rest.starts_with(b"AMQP") && rest.len() >= 8 {
                self.ready.extend_from_slice(&rest[..8]);
                at += 8;
                continue;
            }
            if rest.len() < 8 {
                break;
            }
            let size = usize::try_from(u32::from_be_bytes(rest[..4].try_into().expect("4 bytes")))
                .unwrap_or(usize::MAX);
            if !(8..=INBOUND_SCAN_BYTES_MAX).contains(&size) {
                self.scanning = false;
                break;
            }
            if rest.len() < size {
                break;
            }
            let frame = &rest[..size];
            if frame[5] == 0 {
                // The first AMQP frame: the peer's open (adjusted), or not (left to the engine).
                match adjust_open(frame) {
                    Some(adjusted) => self.ready.extend_from_slice(&adjusted),
                    None => self.ready.extend_from_slice(frame),
                }
                self.scanning = false;
            } else {
                self.ready.extend_from_slice(frame);
            }
            at += size;
        }
        if self.scanning {
            self.scan.drain(..at);
        } else {
            self.ready.extend_from_slice(&self.scan[at..]);
            self.scan = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A close frame with no fields: `00 00 00 0c 02 00 00 00 | 00 53 18 45`.
    const CLOSE_EMPTY: [u8; 12] = [0, 0, 0, 12, 2, 0, 0, 0, 0x00, 0x53, 0x18, 0x45];

    #[test]
    fn short_lists_are_padded_with_nulls() {
        let padded = pad_frame(&CLOSE_EMPTY).unwrap();
        let expected = [
            0, 0, 0, 21, 2, 0, 0, 0, 0x00, 0x53, 0x18, 0xd0, 0, 0, 0, 5, 0, 0, 0, 1, 0x40,
        ];
        assert_eq!(padded, expected);
    }

    #[test]
    fn a_transfer_keeps_its_payload() {
        // transfer [handle=0] (list8), then payload "xy".
        let mut frame = vec![
            0, 0, 0, 0, 2, 0, 0, 1, 0x00, 0x53, 0x14, 0xc0, 0x02, 0x01, 0x43,
        ];
        frame.extend_from_slice(b"xy");
        let size = frame.len() as u32;
        frame[..4].copy_from_slice(&size.to_be_bytes());
        let padded = pad_frame(&frame).unwrap();
        assert_eq!(padded.len(), frame.len() + 6 + 10);
        assert_eq!(&padded[padded.len() - 2..], b"xy");
        assert_eq!(&padded[11..20], &[0xd0, 0, 0, 0, 15, 0, 0, 0, 11]);
        assert_eq!(
            u32::from_be_bytes(padded[..4].try_into().unwrap()) as usize,
            padded.len()
        );
        assert!(padded.len() - frame.len() <= PAD_BYTES_MAX);
    }

    #[test]
    fn full_lists_empty_frames_and_garbage_pass_unchanged() {
        let empty = [0, 0, 0, 8, 2, 0, 0, 0];
        assert_eq!(pad_frame(&empty), None);
        let full_close = [
            0, 0, 0, 13, 2, 0, 0, 0, 0x00, 0x53, 0x18, 0xc0, 0x01, 0x01, 0x40,
        ];
        assert_eq!(pad_frame(&full_close[..]), None);
        assert_eq!(pad_frame(&[0, 0, 0, 10, 2, 0, 0, 0, 0x00, 0x53]), None);
        assert_eq!(
            pad_frame(&[0, 0, 0, 12, 2, 0, 0, 0, 0x00, 0x53, 0x99, 0x45]),
            None
        );
        assert_eq!(
            pad_frame(&[0, 0, 0, 12, 1, 0, 0, 0, 0x00, 0x53, 0x18, 0xc0]),
            None
        );
    }

    #[test]
    fn the_framer_splits_headers_and_frames() {
        let mut framer = Framer::default();
        let mut out = Vec::new();
        let mut input = b"AMQP\x00\x01\x00\x00".to_vec();
        input.extend_from_slice(&CLOSE_EMPTY);
        input.extend_from_slice(&CLOSE_EMPTY);
        for chunk in input.chunks(5) {
            framer.push(chunk, &mut out);
        }
        assert!(framer.pending.is_empty());
        assert_eq!(&out[..8], b"AMQP\x00\x01\x00\x00");
        assert_eq!(out.len(), 8 + 21 + 21);
        let mut whole = Vec::new();
        framer.push(&input, &mut whole);
        assert_eq!(whole, out);
    }

    fn open_frame(max_frame_size: Option<u32>, idle_ms: Option<u32>) -> Vec<u8> {
        let open = Open {
            container_id: "peer".into(),
            hostname: Some("localhost".into()),
            max_frame_size: max_frame_size.map_or_else(MaxFrameSize::default, MaxFrameSize),
            channel_max: Default::default(),
            idle_time_out: idle_ms,
            outgoing_locales: None,
            incoming_locales: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        };
        let body = serde_amqp::to_vec(&open).unwrap();
        let mut frame = ((8 + body.len()) as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&[2, 0, 0, 0]);
        frame.extend_from_slice(&body);
        frame
    }

    fn decoded_open(frame: &[u8]) -> Open {
        assert_eq!(
            u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize,
            frame.len()
        );
        serde_amqp::from_slice(&frame[8..]).unwrap()
    }

    #[test]
    fn the_peers_open_leaves_room_for_padding_and_halves_the_idle_timeout() {
        let adjusted = adjust_open(&open_frame(Some(65_536), Some(60_000))).unwrap();
        let open = decoded_open(&adjusted);
        assert_eq!(open.max_frame_size.0 as usize, 65_536 - PAD_BYTES_MAX);
        assert_eq!(open.idle_time_out, Some(30_000));
        assert_eq!(open.container_id, "peer");
        assert_eq!(open.hostname.as_deref(), Some("localhost"));

        let open = decoded_open(&adjust_open(&open_frame(None, None)).unwrap());
        assert_eq!(
            open.max_frame_size.0 as usize,
            u32::MAX as usize - PAD_BYTES_MAX
        );
        assert_eq!(open.idle_time_out, None);
        let open = decoded_open(&adjust_open(&open_frame(Some(512), Some(0))).unwrap());
        assert_eq!(open.max_frame_size.0 as usize, MIN_MAX_FRAME_SIZE);
        assert_eq!(open.idle_time_out, Some(0));
        assert_eq!(adjust_open(&CLOSE_EMPTY), None);
    }

    #[test]
    fn inbound_adjusts_only_the_first_open() {
        // SASL header, a SASL frame, AMQP header, open, then an open-like frame that is data.
        let sasl_init = [0, 0, 0, 12, 2, 1, 0, 0, 0x00, 0x53, 0x41, 0x45];
        let open = open_frame(Some(100_000), Some(120_000));
        let mut input = b"AMQP\x03\x01\x00\x00".to_vec();
        input.extend_from_slice(&sasl_init);
        input.extend_from_slice(b"AMQP\x00\x01\x00\x00");
        input.extend_from_slice(&open);
        input.extend_from_slice(&open);
        let mut inbound = Inbound::default();
        let mut read = Vec::new();
        for chunk in input.chunks(7) {
            if inbound.scanning {
                inbound.push(chunk);
                read.extend_from_slice(inbound.ready());
                inbound.take(inbound.ready().len());
            } else {
                read.extend_from_slice(chunk);
            }
        }
        assert_eq!(&read[..8], b"AMQP\x03\x01\x00\x00");
        assert_eq!(&read[8..20], &sasl_init);
        assert_eq!(&read[20..28], b"AMQP\x00\x01\x00\x00");
        let adjusted = adjust_open(&open).unwrap();
        assert_eq!(&read[28..28 + adjusted.len()], &adjusted[..]);
        assert_eq!(decoded_open(&adjusted).idle_time_out, Some(60_000));
        assert_eq!(&read[28 + adjusted.len()..], &open[..]);
    }

    proptest::proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let _ = pad_frame(&bytes);
            let mut out = Vec::new();
            Framer::default().push(&bytes, &mut out);
            let _ = adjust_open(&bytes);
            let mut inbound = Inbound::default();
            inbound.push(&bytes);
            inbound.end();
        }
    }
}
