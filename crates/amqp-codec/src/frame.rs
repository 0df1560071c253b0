//! AMQP 1.0 frames (specification part 2.3): an 8-byte header — size, data offset, type,
//! channel — then an extended header, then the body.
//!
//! [`split_frame`] takes the first frame off a buffer of received bytes. It judges the header
//! before the rest has arrived, so a peer announcing a frame larger than the negotiated
//! `max-frame-size` is refused at once instead of being buffered.

use thiserror::Error;

/// The fixed frame header.
pub const HEADER_BYTES: usize = 8;

/// The smallest `max-frame-size` a peer may announce (specification 2.7.1).
pub const MIN_MAX_FRAME_SIZE: u32 = 512;

/// Which layer a frame belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameType {
    /// A connection, session or link performative (type 0x00).
    Amqp,
    /// A SASL frame (type 0x01).
    Sasl,
}

/// One frame, borrowed from the buffer it was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// Its layer.
    pub frame_type: FrameType,
    /// The channel (the session, for AMQP frames; unused by SASL).
    pub channel: u16,
    /// Everything after the data offset: a performative and its payload. Empty for the
    /// keep-alive frames a peer sends against its idle timeout.
    pub body: &'a [u8],
}

/// A frame header that breaks the rules.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    /// The size field is smaller than the header.
    #[error("frame size {size} is smaller than the 8-byte frame header")]
    SizeBelowHeader {
        /// The size field.
        size: u32,
    },
    /// The frame is larger than the negotiated maximum.
    #[error("frame of {size} bytes is larger than the negotiated max-frame-size of {max}")]
    TooLarge {
        /// The size field.
        size: u32,
        /// The negotiated maximum.
        max: u32,
    },
    /// The data offset points inside the header or past the frame.
    #[error("frame data offset {doff} (in 4-byte words) is not between 2 and the frame's size")]
    BadDataOffset {
        /// The data offset field.
        doff: u8,
    },
    /// Neither AMQP nor SASL.
    #[error("unknown frame type {frame_type:#04x}")]
    UnknownType {
        /// The type field.
        frame_type: u8,
    },
}

/// Takes the first frame off `buffer`. `Ok(None)`: the frame is not complete yet (read more
/// bytes). `Ok(Some((frame, consumed)))`: the frame and how many bytes it occupied.
pub fn split_frame(
    buffer: &[u8],
    max_frame_size: u32,
) -> Result<Option<(Frame<'_>, usize)>, FrameError> {
    let Some(header) = buffer.get(..HEADER_BYTES) else {
        return Ok(None);
    };
    let size = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    if (size as usize) < HEADER_BYTES {
        return Err(FrameError::SizeBelowHeader { size });
    }
    if size > max_frame_size {
        return Err(FrameError::TooLarge {
            size,
            max: max_frame_size,
        });
    }
    let doff = header[4];
    let body_at = usize::from(doff) * 4;
    if body_at < HEADER_BYTES || body_at > size as usize {
        return Err(FrameError::BadDataOffset { doff });
    }
    let frame_type = match header[5] {
        0x00 => FrameType::Amqp,
        0x01 => FrameType::Sasl,
        other => return Err(FrameError::UnknownType { frame_type: other }),
    };
    let channel = u16::from_be_bytes([header[6], header[7]]);
    let Some(frame) = buffer.get(..size as usize) else {
        return Ok(None);
    };
    Ok(Some((
        Frame {
            frame_type,
            channel,
            body: &frame[body_at..],
        },
        size as usize,
    )))
}

/// Starts a frame in `out` (header with a placeholder size, no extended header); returns where
/// it starts, for [`finish_frame`].
pub fn start_frame(out: &mut Vec<u8>, frame_type: FrameType, channel: u16) -> usize {
    let start = out.len();
    let type_byte = match frame_type {
        FrameType::Amqp => 0x00,
        FrameType::Sasl => 0x01,
    };
    out.extend_from_slice(&[0, 0, 0, 0, 2, type_byte]);
    out.extend_from_slice(&channel.to_be_bytes());
    start
}

/// Writes the size of the frame started at `start`, which ends at the end of `out`.
///
/// Panics if the frame is longer than `u32::MAX` bytes: callers size frames to the peer's
/// `max-frame-size` first.
pub fn finish_frame(out: &mut [u8], start: usize) {
    finish_frame_followed(out, start, 0);
}

/// [`finish_frame`] for a frame whose last `following` bytes are not in `out`: the caller sends
/// them right after it (a message body sent from where it is).
///
/// Panics as [`finish_frame`] does.
pub fn finish_frame_followed(out: &mut [u8], start: usize, following: usize) {
    let size =
        u32::try_from(out.len() - start + following).expect("frames are sized to max-frame-size");
    out[start..start + 4].copy_from_slice(&size.to_be_bytes());
}

/// Appends an empty frame (the keep-alive sent against the peer's idle timeout).
pub fn write_empty_frame(out: &mut Vec<u8>) {
    out.extend_from_slice(&[0, 0, 0, 8, 2, 0, 0, 0]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame_bytes(doff: u8, frame_type: u8, channel: u16, body: &[u8]) -> Vec<u8> {
        let size = (usize::from(doff) * 4).max(8) + body.len();
        let mut bytes = (size as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(&[doff, frame_type]);
        bytes.extend_from_slice(&channel.to_be_bytes());
        bytes.resize(usize::from(doff) * 4, 0xee); // extended header, ignored
        bytes.extend_from_slice(body);
        bytes
    }

    #[test]
    fn a_frame_is_split_off_with_its_channel_and_body() {
        let mut buffer = frame_bytes(2, 0, 7, b"performative");
        buffer.extend_from_slice(b"next frame's bytes");
        let (frame, consumed) = split_frame(&buffer, 512).unwrap().unwrap();
        assert_eq!(consumed, 20);
        assert_eq!(frame.channel, 7);
        assert_eq!(frame.frame_type, FrameType::Amqp);
        assert_eq!(frame.body, b"performative");
    }

    #[test]
    fn the_extended_header_is_skipped() {
        let buffer = frame_bytes(4, 1, 0, b"sasl");
        let (frame, consumed) = split_frame(&buffer, 512).unwrap().unwrap();
        assert_eq!(
            (consumed, frame.body, frame.frame_type),
            (20, &b"sasl"[..], FrameType::Sasl)
        );
    }

    #[test]
    fn an_incomplete_frame_asks_for_more() {
        let buffer = frame_bytes(2, 0, 0, b"0123456789");
        for cut in 0..buffer.len() {
            assert_eq!(split_frame(&buffer[..cut], 512), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn bad_headers_are_refused_from_the_header_alone() {
        let header = |size: u32, doff: u8, frame_type: u8| {
            let mut bytes = size.to_be_bytes().to_vec();
            bytes.extend_from_slice(&[doff, frame_type, 0, 0]);
            bytes
        };
        assert_eq!(
            split_frame(&header(7, 2, 0), 512),
            Err(FrameError::SizeBelowHeader { size: 7 })
        );
        assert_eq!(
            split_frame(&header(1 << 20, 2, 0), 65_536),
            Err(FrameError::TooLarge {
                size: 1 << 20,
                max: 65_536
            })
        );
        assert_eq!(
            split_frame(&header(16, 1, 0), 512),
            Err(FrameError::BadDataOffset { doff: 1 })
        );
        assert_eq!(
            split_frame(&header(16, 5, 0), 512),
            Err(FrameError::BadDataOffset { doff: 5 })
        );
        assert_eq!(
            split_frame(&header(16, 2, 2), 512),
            Err(FrameError::UnknownType { frame_type: 2 })
        );
    }

    #[test]
    fn written_frames_split_back() {
        let mut out = Vec::new();
        write_empty_frame(&mut out);
        let start = start_frame(&mut out, FrameType::Amqp, 3);
        out.extend_from_slice(b"body");
        finish_frame(&mut out, start);
        let (empty, consumed) = split_frame(&out, 512).unwrap().unwrap();
        assert_eq!((empty.body.len(), consumed), (0, 8));
        let (frame, _) = split_frame(&out[consumed..], 512).unwrap().unwrap();
        assert_eq!((frame.channel, frame.body), (3, &b"body"[..]));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic_and_never_overrun(bytes in proptest::collection::vec(any::<u8>(), 0..64), max in 0u32..100) {
            if let Ok(Some((frame, consumed))) = split_frame(&bytes, max) {
                prop_assert!(consumed <= bytes.len() && consumed as u32 <= max);
                prop_assert!(frame.body.len() + HEADER_BYTES <= consumed);
            }
        }
    }
}
