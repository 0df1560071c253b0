//! Deliveries (specification 2.6.12–2.6.13): `transfer` frames out and in, messages split
//! across frames and put back together, and settlement by `disposition` ranges.
//!
//! Sending writes the transfer frames of one message straight into the connection's output:
//! one frame when it fits the peer's `max-frame-size`, as many as it takes otherwise. The
//! session counts them against the peer's window (`session.rs`); the link spends one
//! credit per message (`link.rs`). Receiving gathers a delivery's frames in a
//! [`Partial`] until its last frame, then hands the application one [`Delivery`].
//!
//! # Guarantees
//! - A message leaves only with link credit; its delivery id is the session's next one, its
//!   tag the id's four bytes.
//! - Every frame written is within the peer's `max-frame-size`.
//! - A delivery counts against the receiving link's credit once, at its first frame; frames
//!   of one delivery arrive one after the other, and a peer that interleaves another
//!   delivery, exceeds the credit or the link's `max-message-size`, or sends a tag longer
//!   than 32 bytes gets an error, not a panic.
//! - Receiving a message that fits one frame allocates nothing: its payload is a view of the
//!   bytes read ([`Connection::receive_buf`]), its tag held in place.
//! - A message that fits one frame and the peer's window is written in place: sending it
//!   allocates nothing (a split message keeps the list of its frames; frames beyond the
//!   window are copied out to wait). One sent as a head and a body of at least
//!   [`SPLICE_MIN_BYTES`] ([`Connection::send_parts`]) is not even copied: its body goes to
//!   the socket from where the sender holds it. Nor is a message sent encoded whole
//!   ([`Connection::send_bytes`]) whose frames the peer's window takes: each frame's share of
//!   at least [`SPLICE_MIN_BYTES`] goes to the socket from the sender's bytes.

use bytes::Bytes;
use tributary_amqp_codec::frame::{self, FrameType};
use tributary_amqp_codec::performative::{DispositionFields, TransferFields};

use super::link::{LinkId, LinkRole};
use super::session::{Session, SessionId};
use super::{Connection, Event};
use crate::error::{ConnectionError, SendError, condition, decode_error};
use crate::output::Splice;

/// A complete message received on a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The link.
    pub link: LinkId,
    /// Its delivery id (session-wide; what a disposition names).
    pub delivery_id: u32,
    /// Its tag.
    pub tag: DeliveryTag,
    /// The message format (0: a plain AMQP message).
    pub message_format: u32,
    /// Whether the sender settled it already.
    pub settled: bool,
    /// The encoded message: a view of the bytes read when it came in one frame.
    pub payload: Bytes,
}

/// A delivery's tag: up to [`DeliveryTag::MAX`] bytes (specification 2.8.7), held in place so
/// that receiving a delivery allocates nothing for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryTag {
    len: u8,
    bytes: [u8; DeliveryTag::MAX],
}

impl DeliveryTag {
    /// The longest tag AMQP allows.
    pub const MAX: usize = 32;

    /// `tag`, if it is at most [`DeliveryTag::MAX`] bytes long.
    pub fn new(tag: &[u8]) -> Option<Self> {
        let mut bytes = [0; DeliveryTag::MAX];
        bytes.get_mut(..tag.len())?.copy_from_slice(tag);
        let len = u8::try_from(tag.len()).expect("at most 32");
        Some(DeliveryTag { len, bytes })
    }

    /// The tag's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// A delivery whose frames are arriving.
#[derive(Debug)]
pub(super) struct Partial {
    delivery_id: u32,
    tag: DeliveryTag,
    message_format: u32,
    settled: bool,
    payload: Vec<u8>,
}

impl Partial {
    /// A delivery's first transfer: it must name the delivery and its tag.
    fn first(transfer: &TransferFields<'_>) -> Result<Self, ConnectionError> {
        let (Some(delivery_id), Some(tag)) = (transfer.delivery_id, transfer.delivery_tag) else {
            return Err(ConnectionError::new(
                condition::INVALID_FIELD,
                "a delivery's first transfer needs a delivery-id and a tag",
            ));
        };
        let tag = DeliveryTag::new(tag).ok_or_else(|| {
            ConnectionError::new(
                condition::INVALID_FIELD,
                format!(
                    "a delivery-tag of {} bytes: at most {} are allowed",
                    tag.len(),
                    DeliveryTag::MAX
                ),
            )
        })?;
        Ok(Partial {
            delivery_id,
            tag,
            message_format: transfer.message_format.unwrap_or(0),
            settled: transfer.settled.unwrap_or(false),
            payload: Vec::new(),
        })
    }

    /// A further transfer of this delivery: it may not name another.
    fn continues(self, transfer: &TransferFields<'_>) -> Result<Self, ConnectionError> {
        if transfer
            .delivery_id
            .is_some_and(|id| id != self.delivery_id)
        {
            return Err(ConnectionError::new(
                condition::NOT_ALLOWED,
                "a new delivery before the last one was complete",
            ));
        }
        Ok(self)
    }

    /// The delivery, with `last` the payload of its last frame, a slice of `input`.
    fn finish(mut self, link: LinkId, last: &[u8], input: &Bytes) -> Delivery {
        let payload = if self.payload.is_empty() {
            input.slice_ref(last)
        } else {
            self.payload.extend_from_slice(last);
            Bytes::from(self.payload)
        };
        Delivery {
            link,
            delivery_id: self.delivery_id,
            tag: self.tag,
            message_format: self.message_format,
            settled: self.settled,
            payload,
        }
    }
}

/// The connection's delivery frames: `transfer` and `disposition`.
impl Connection {
    pub(super) fn on_transfer(
        &mut self,
        channel: u16,
        body: &[u8],
        input: &Bytes,
    ) -> Result<(), ConnectionError> {
        let local_channel = self.session_of(channel)?;
        let (transfer, payload) = TransferFields::decode(body).map_err(decode_error)?;
        let handle = self.link_of(local_channel, transfer.handle)?;
        let id = LinkId {
            session: SessionId(local_channel),
            handle,
        };
        let window = self.config.session_window;
        let session = self.session_mut(local_channel);
        session.take_incoming(window)?;
        let link = session.link_mut(handle).expect("mapped handles have links");
        if link.role() != LinkRole::Receiver {
            return Err(ConnectionError::new(
                condition::NOT_ALLOWED,
                "a transfer on a link the peer receives on",
            ));
        }
        if link.detach_sent() {
            return Ok(()); // in flight while this side detached: dropped
        }
        let mut partial = match link.take_partial() {
            Some(partial) => partial.continues(&transfer)?,
            None => {
                let partial = Partial::first(&transfer)?;
                if link.credit() == 0 {
                    let description = "a transfer beyond the link's credit";
                    self.fail_link(id, condition::TRANSFER_LIMIT_EXCEEDED, description);
                    return Ok(());
                }
                link.accept_delivery();
                partial
            }
        };
        if transfer.aborted {
            return Ok(()); // the sender gave it up; it used its credit all the same
        }
        partial.settled |= transfer.settled.unwrap_or(false);
        let size = (partial.payload.len() + payload.len()) as u64;
        let max = link.max_message_size();
        if max > 0 && size > max {
            let description =
                format!("a message larger than the link's max-message-size of {max} bytes");
            self.fail_link(id, condition::MESSAGE_SIZE_EXCEEDED, &description);
            return Ok(());
        }
        if transfer.more {
            partial.payload.extend_from_slice(payload);
            link.keep_partial(partial);
            return Ok(());
        }
        self.events
            .push_back(Event::Delivery(partial.finish(id, payload, input)));
        Ok(())
    }

    pub(super) fn on_disposition(
        &mut self,
        channel: u16,
        body: &[u8],
    ) -> Result<(), ConnectionError> {
        let local_channel = self.session_of(channel)?;
        let disposition = DispositionFields::decode(body).map_err(decode_error)?;
        self.events.push_back(Event::Disposition {
            session: SessionId(local_channel),
            role_is_receiver: disposition.role_is_receiver,
            first: disposition.first,
            last: disposition.last.unwrap_or(disposition.first),
            settled: disposition.settled,
            state: disposition.state.map(<[u8]>::to_vec),
        });
        Ok(())
    }

    /// Sends one message on a sending link: `write` appends the encoded message. Uses one
    /// credit; returns the delivery id (what the peer's disposition will name). The delivery
    /// tag is the delivery id's four bytes. Frames beyond the peer's session window wait for it.
    pub fn send(
        &mut self,
        link: LinkId,
        settled: bool,
        message_format: u32,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> Result<u32, SendError> {
        self.deliver(link, settled, message_format, |d| {
            write_transfer(d.out, d.session, d.channel, d.fields, d.max_frame, write);
        })
    }

    /// [`Self::send`] for a message encoded as `head` followed by `body`. When the body is at
    /// least [`SPLICE_MIN_BYTES`] long and the message fits one frame and the peer's window,
    /// the body is not copied: it follows the frame's other bytes to the socket as it is (see
    /// [`crate::output`]). Otherwise it is copied as [`Self::send`] copies a message.
    pub fn send_parts(
        &mut self,
        link: LinkId,
        settled: bool,
        message_format: u32,
        head: &[u8],
        body: &Bytes,
    ) -> Result<u32, SendError> {
        self.deliver(link, settled, message_format, |d| {
            if body.len() >= SPLICE_MIN_BYTES && !d.session.is_blocked() {
                let start = frame::start_frame(d.out, FrameType::Amqp, d.channel);
                d.fields.encode(d.out);
                d.out.extend_from_slice(head);
                if d.out.len() - start + body.len() <= d.max_frame {
                    frame::finish_frame_followed(d.out, start, body.len());
                    d.spliced.push(Splice {
                        at: d.out.len(),
                        body: body.clone(),
                    });
                    // The window is open: the frame is counted and leaves, nothing is split off.
                    d.session.send_frames(d.out, &[start]);
                    return;
                }
                d.out.truncate(start);
            }
            let write = |out: &mut Vec<u8>| {
                out.extend_from_slice(head);
                out.extend_from_slice(body);
            };
            write_transfer(d.out, d.session, d.channel, d.fields, d.max_frame, write);
        })
    }

    /// [`Self::send`] for a message already encoded whole, as a producer holds it. When the
    /// peer's window takes all of the message's frames, each frame's share of `payload` of at
    /// least [`SPLICE_MIN_BYTES`] is not copied but follows the frame's other bytes to the
    /// socket (see [`crate::output`]); otherwise each share is copied once, into its frame.
    pub fn send_bytes(
        &mut self,
        link: LinkId,
        settled: bool,
        message_format: u32,
        payload: &Bytes,
    ) -> Result<u32, SendError> {
        self.deliver(link, settled, message_format, |d| {
            let Outgoing {
                out,
                spliced,
                session,
                channel,
                mut fields,
                max_frame,
            } = d;
            let first = frame::start_frame(out, FrameType::Amqp, channel);
            fields.more = true;
            fields.encode(out);
            let head_bytes = out.len() - first;
            out.truncate(first);
            let room = max_frame - head_bytes;
            let frames = payload.len().div_ceil(room).max(1);
            let splice = session.takes_frames(frames);
            let mut starts = Vec::with_capacity(frames);
            let mut at = 0;
            for index in 0..frames {
                let share = payload.slice(at..(at + room).min(payload.len()));
                at += share.len();
                fields.more = index + 1 < frames;
                let start = frame::start_frame(out, FrameType::Amqp, channel);
                fields.encode(out);
                assert!(
                    out.len() - start + share.len() <= max_frame,
                    "every frame fits the peer's max-frame-size"
                );
                if splice && share.len() >= SPLICE_MIN_BYTES {
                    frame::finish_frame_followed(out, start, share.len());
                    spliced.push(Splice {
                        at: out.len(),
                        body: share,
                    });
                } else {
                    out.extend_from_slice(&share);
                    frame::finish_frame(out, start);
                }
                starts.push(start);
            }
            assert_eq!(at, payload.len(), "the frames carry the whole message");
            session.send_frames(out, &starts);
        })
    }

    /// What every send shares: checks and spends the link's credit ([`Self::start_delivery`]),
    /// makes the first transfer's fields, and hands `write_frames` where the message's frames
    /// go; returns the delivery id.
    fn deliver(
        &mut self,
        link: LinkId,
        settled: bool,
        message_format: u32,
        write_frames: impl FnOnce(Outgoing<'_>),
    ) -> Result<u32, SendError> {
        let delivery_id = self.start_delivery(link)?;
        let tag = delivery_id.to_be_bytes();
        let session = self
            .sessions
            .get_mut(link.session.0)
            .expect("start_delivery found the session");
        write_frames(Outgoing {
            out: &mut self.out,
            spliced: &mut self.spliced,
            session,
            channel: link.session.0,
            fields: transfer_fields(link, delivery_id, &tag, settled, message_format),
            max_frame: self.remote_max_frame as usize,
        });
        Ok(delivery_id)
    }

    /// Checks that `link` may send a message now, spends one of its credits and takes the
    /// session's next delivery id for it.
    fn start_delivery(&mut self, link: LinkId) -> Result<u32, SendError> {
        if self.close_sent {
            return Err(SendError::Closed);
        }
        let session = self.mapped_session(link.session)?;
        let state = match session.link_mut(link.handle) {
            Some(l) if l.is_attached() => l,
            _ => return Err(SendError::NotAttached),
        };
        if state.role() != LinkRole::Sender {
            return Err(SendError::WrongRole);
        }
        if state.credit() == 0 {
            return Err(SendError::NoCredit);
        }
        state.consume_credit();
        Ok(session.take_delivery_id())
    }

    /// Settles or updates deliveries `first..=last` of `session` (this side received them:
    /// `role_is_receiver` true; or sent them: false).
    pub fn disposition(
        &mut self,
        session: SessionId,
        role_is_receiver: bool,
        first: u32,
        last: u32,
        settled: bool,
        state: Option<&[u8]>,
    ) -> Result<(), SendError> {
        if self.close_sent {
            return Err(SendError::Closed);
        }
        self.mapped_session(session)?;
        let fields = DispositionFields {
            role_is_receiver,
            first,
            last: (last != first).then_some(last),
            settled,
            state,
            batchable: false,
        };
        let start = frame::start_frame(&mut self.out, FrameType::Amqp, session.0);
        fields.encode(&mut self.out);
        frame::finish_frame(&mut self.out, start);
        Ok(())
    }
}

/// Bodies shorter than this are copied into the frame even by [`Connection::send_parts`]:
/// copying a few hundred bytes costs less than one more slice in a vectored write.
pub const SPLICE_MIN_BYTES: usize = 512;

/// Where a message's transfer frames go, and what they start with.
struct Outgoing<'a> {
    /// The connection's output.
    out: &'a mut Vec<u8>,
    /// Bodies that follow frames in `out` uncopied.
    spliced: &'a mut Vec<Splice>,
    /// The link's session, whose window counts the frames.
    session: &'a mut Session,
    /// The session's channel.
    channel: u16,
    /// The first transfer's fields.
    fields: TransferFields<'a>,
    /// The peer's max-frame-size.
    max_frame: usize,
}

/// The first transfer of a message: its delivery id, its tag (the id's bytes), settled or not.
fn transfer_fields(
    link: LinkId,
    delivery_id: u32,
    tag: &[u8; 4],
    settled: bool,
    message_format: u32,
) -> TransferFields<'_> {
    TransferFields {
        handle: link.handle,
        delivery_id: Some(delivery_id),
        delivery_tag: Some(tag),
        message_format: Some(message_format),
        settled: Some(settled),
        ..TransferFields::default()
    }
}

/// Writes one message's transfer frames on `channel` to `out` and passes them through the
/// session's window. Frames carry the sender's own channel and handle (specification 2.5.1,
/// 2.6.2).
fn write_transfer(
    out: &mut Vec<u8>,
    session: &mut Session,
    channel: u16,
    mut fields: TransferFields<'_>,
    max_frame: usize,
    write: impl FnOnce(&mut Vec<u8>),
) {
    let start = frame::start_frame(out, FrameType::Amqp, channel);
    fields.encode(out);
    let payload_at = out.len();
    write(out);
    if out.len() - start <= max_frame {
        frame::finish_frame(out, start);
        session.send_frames(out, &[start]);
        return;
    }
    // Too large for one frame: cut the message into as many as it takes.
    let payload = out.split_off(payload_at);
    out.truncate(start);
    let room = max_frame - (payload_at - start);
    let mut starts = Vec::with_capacity(payload.len().div_ceil(room));
    let mut chunks = payload.chunks(room).peekable();
    while let Some(chunk) = chunks.next() {
        fields.more = chunks.peek().is_some();
        let at = frame::start_frame(out, FrameType::Amqp, channel);
        fields.encode(out);
        out.extend_from_slice(chunk);
        frame::finish_frame(out, at);
        assert!(
            out.len() - at <= max_frame,
            "every frame fits the peer's max-frame-size"
        );
        starts.push(at);
    }
    session.send_frames(out, &starts);
}
