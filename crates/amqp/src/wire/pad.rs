//! Pads the field lists of outgoing performatives to their full length.
//!
//! AMQP 1.0 lets an encoder omit trailing null fields of a described list, and the engine's
//! serializer does (it also omits trailing fields equal to their default). The Python SDK's
//! `pyamqp` does not accept that: it indexes performative fields by position (`open[9]`,
//! `attach[13]`, the payload of a `transfer` at index 11, …) and fails with `IndexError` on a
//! short list. So every frame the engine writes passes through [`PaddedStream`], which re-encodes
//! the performative's list with the omitted fields as explicit nulls — the same values, the
//! shape the Microsoft stack sends. Headers, empty frames and frame payloads pass unchanged;
//! a frame it does not understand passes unchanged too.
//!
//! A padded frame is at most [`PAD_BYTES_MAX`] bytes longer than the engine made it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most bytes padding adds to a frame: a list8 header becomes a list32 one (+6) and at most
/// 14 omitted fields become nulls (+14).
pub(crate) const PAD_BYTES_MAX: usize = 20;

/// Above this many bytes waiting for the socket, writes wait for it to drain.
const OUT_BYTES_MAX: usize = 4 * 1024 * 1024;

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

/// Rewrites one complete frame, padding its performative's list; `None` leaves it unchanged.
pub(crate) fn pad_frame(frame: &[u8]) -> Option<Vec<u8>> {
    let doff = usize::from(*frame.get(4)?) * 4;
    if doff < 8 || frame.len() <= doff {
        return None;
    }
    let body = &frame[doff..];
    let (code, list_at) = match body {
        [0x00, 0x53, code, ..] => (u64::from(*code), 3),
        [0x00, 0x80, rest @ ..] if rest.len() >= 8 => {
            (u64::from_be_bytes(rest[..8].try_into().ok()?), 10)
        }
        _ => return None,
    };
    let fields = arity(code)?;
    let (count, elements, after) = read_list(body, list_at)?;
    if count >= fields {
        return None;
    }
    let missing = fields - count;
    let list_size = u32::try_from(4 + elements.len() + missing).ok()?;
    let mut out = Vec::with_capacity(frame.len() + PAD_BYTES_MAX);
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&frame[4..doff]);
    out.extend_from_slice(&body[..list_at]);
    out.push(0xd0);
    out.extend_from_slice(&list_size.to_be_bytes());
    out.extend_from_slice(&u32::try_from(fields).ok()?.to_be_bytes());
    out.extend_from_slice(elements);
    out.extend(std::iter::repeat_n(0x40, missing));
    out.extend_from_slice(&body[after..]);
    let size = u32::try_from(out.len()).ok()?;
    out[..4].copy_from_slice(&size.to_be_bytes());
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

/// A stream whose outgoing frames get their performatives padded; reads pass through.
#[derive(Debug)]
pub(crate) struct PaddedStream<S> {
    inner: S,
    /// Bytes written by the engine, not yet a complete frame or header.
    pending: Vec<u8>,
    /// Bytes ready for the socket.
    out: Vec<u8>,
    /// How much of `out` the socket took already.
    written: usize,
}

impl<S> PaddedStream<S> {
    pub(crate) fn new(inner: S) -> Self {
        PaddedStream {
            inner,
            pending: Vec::new(),
            out: Vec::new(),
            written: 0,
        }
    }

    /// Moves every complete header or frame from `pending` to `out`, padded.
    fn process(&mut self) {
        let mut at = 0;
        loop {
            let rest = &self.pending[at..];
            if rest.len() < 8 {
                break;
            }
            let len = if rest.starts_with(b"AMQP") {
                8
            } else {
                let size = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes"));
                // A size below the header is the engine's bug, not the peer's; pass it on.
                (usize::try_from(size).unwrap_or(usize::MAX)).max(8)
            };
            if rest.len() < len {
                break;
            }
            let frame = &rest[..len];
            match pad_frame(frame) {
                Some(padded) => self.out.extend_from_slice(&padded),
                None => self.out.extend_from_slice(frame),
            }
            at += len;
        }
        self.pending.drain(..at);
    }
}

impl<S: AsyncWrite + Unpin> PaddedStream<S> {
    /// Writes `out` to the socket until it is empty or the socket would block.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.out.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.out.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for PaddedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for PaddedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.out.len() - this.written >= OUT_BYTES_MAX {
            ready!(this.poll_drain(cx))?;
        }
        this.pending.extend_from_slice(buf);
        this.process();
        // Push what is ready; the rest goes on the next write or flush.
        if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_shutdown(cx)
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
    fn the_stream_splits_headers_and_frames() {
        let mut stream = PaddedStream::new(Vec::<u8>::new());
        let mut input = b"AMQP\x00\x01\x00\x00".to_vec();
        input.extend_from_slice(&CLOSE_EMPTY);
        for chunk in input.chunks(5) {
            stream.pending.extend_from_slice(chunk);
            stream.process();
        }
        assert!(stream.pending.is_empty());
        assert_eq!(&stream.out[..8], b"AMQP\x00\x01\x00\x00");
        assert_eq!(stream.out.len(), 8 + 21);
    }

    proptest::proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64)) {
            let _ = pad_frame(&bytes);
            let mut stream = PaddedStream::new(Vec::<u8>::new());
            stream.pending.extend_from_slice(&bytes);
            stream.process();
        }
    }
}
