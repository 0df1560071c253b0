//! The three performatives a stream of messages consists of — `transfer`, `flow`,
//! `disposition` — read from and written to a frame body by hand.
//!
//! Reading follows the specification's composite-type rules: a list may stop early (the
//! omitted trailing fields take their defaults), a mandatory field may not be null, fields
//! beyond the known ones are skipped (each must still be a well-formed value), and the list
//! must end exactly where its size says. Delivery states and `flow` properties are returned
//! still encoded, for the caller to decode with a general codec when it needs them.
//!
//! Writing always produces every field (see the crate docs).

use crate::value::{
    CodecError, Reader, write_bool, write_described_list, write_optional_binary,
    write_optional_bool, write_optional_raw, write_optional_ubyte, write_optional_uint, write_uint,
};

/// Descriptor codes of the performatives (specification 2.7).
pub mod code {
    /// `open`.
    pub const OPEN: u64 = 0x10;
    /// `begin`.
    pub const BEGIN: u64 = 0x11;
    /// `attach`.
    pub const ATTACH: u64 = 0x12;
    /// `flow`.
    pub const FLOW: u64 = 0x13;
    /// `transfer`.
    pub const TRANSFER: u64 = 0x14;
    /// `disposition`.
    pub const DISPOSITION: u64 = 0x15;
    /// `detach`.
    pub const DETACH: u64 = 0x16;
    /// `end`.
    pub const END: u64 = 0x17;
    /// `close`.
    pub const CLOSE: u64 = 0x18;
}

/// The `accepted` outcome, encoded (a described empty list).
pub const ACCEPTED: &[u8] = &[0x00, 0x53, 0x24, 0x45];

/// The descriptor code of the performative at the start of a frame body.
pub fn performative_code(body: &[u8]) -> Result<u64, CodecError> {
    Reader::new(body).descriptor()
}

/// A performative's list being read field by field.
struct Fields<'a> {
    reader: Reader<'a>,
    left: u32,
    end: usize,
}

impl<'a> Fields<'a> {
    /// Opens the performative at the start of `body`, which must have descriptor `expected`.
    fn open(body: &'a [u8], expected: u64, wrong: &'static str) -> Result<Self, CodecError> {
        let mut reader = Reader::new(body);
        if reader.descriptor()? != expected {
            return Err(CodecError {
                at: 0,
                reason: wrong,
            });
        }
        let (left, end) = reader.list_header()?;
        Ok(Fields { reader, left, end })
    }

    /// Reads the next field with `read`, or gives `None` if the list has ended.
    fn next<T>(
        &mut self,
        read: impl FnOnce(&mut Reader<'a>) -> Result<Option<T>, CodecError>,
    ) -> Result<Option<T>, CodecError> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        read(&mut self.reader)
    }

    /// Reads the next field, which may not be absent or null.
    fn mandatory<T>(
        &mut self,
        read: impl FnOnce(&mut Reader<'a>) -> Result<Option<T>, CodecError>,
        missing: &'static str,
    ) -> Result<T, CodecError> {
        let at = self.reader.position();
        self.next(read)?.ok_or(CodecError {
            at,
            reason: missing,
        })
    }

    /// A transfer's last seven fields when the list holds exactly those and each is one byte,
    /// as a transfer of a message usually carries them (every one the hub delivers does):
    /// `settled` and `more` (null, `true` or `false`), `rcv-settle-mode` and `state` null,
    /// `resume`, `aborted` and `batchable` (null, `true` or `false`). Gives the five booleans,
    /// consumed, for one look at seven bytes instead of seven typed reads; `None`, with nothing
    /// consumed, for any other ending, which the typed reads then take field by field.
    fn flags_without_mode_or_state(&mut self) -> Option<[Option<bool>; 5]> {
        const NULL: u8 = 0x40;
        let flag = |byte: u8| match byte {
            NULL => Some(None),
            0x41 => Some(Some(true)),
            0x42 => Some(Some(false)),
            _ => None,
        };
        if self.left != 7 {
            return None;
        }
        let &[settled, more, NULL, NULL, resume, aborted, batchable] =
            self.reader.rest().first_chunk::<7>()?
        else {
            return None;
        };
        let flags = [
            flag(settled)?,
            flag(more)?,
            flag(resume)?,
            flag(aborted)?,
            flag(batchable)?,
        ];
        self.reader.take(7).ok()?;
        self.left = 0;
        Some(flags)
    }

    /// [`Fields::close`] for a performative that may not be followed by a payload.
    fn close_without_payload(self, reason: &'static str) -> Result<(), CodecError> {
        let end = self.end;
        if self.close()?.is_empty() {
            Ok(())
        } else {
            Err(CodecError { at: end, reason })
        }
    }

    /// Skips fields beyond the known ones and checks the list ends where its size says;
    /// returns what follows the performative (a transfer's payload).
    fn close(mut self) -> Result<&'a [u8], CodecError> {
        if self.reader.position() > self.end {
            return Err(self.reader.error("fields overrun the list's size"));
        }
        for _ in 0..self.left {
            self.reader.skip(0)?;
        }
        self.reader
            .expect_at(self.end, "the list's size disagrees with its fields")?;
        Ok(self.reader.rest())
    }
}

/// A `transfer` (specification 2.7.5). Borrowed from the frame it was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TransferFields<'a> {
    /// The link.
    pub handle: u32,
    /// The delivery; may be omitted on continuation frames.
    pub delivery_id: Option<u32>,
    /// The delivery's tag; may be omitted on continuation frames.
    pub delivery_tag: Option<&'a [u8]>,
    /// The message format (0 for AMQP messages).
    pub message_format: Option<u32>,
    /// Whether the sender settled the delivery.
    pub settled: Option<bool>,
    /// Whether more frames of this delivery follow.
    pub more: bool,
    /// The receiver settle mode for this delivery.
    pub rcv_settle_mode: Option<u8>,
    /// The delivery state, encoded.
    pub state: Option<&'a [u8]>,
    /// Whether this resumes an earlier delivery.
    pub resume: bool,
    /// Whether the delivery is aborted.
    pub aborted: bool,
    /// Whether the sender would accept a delayed disposition.
    pub batchable: bool,
}

impl<'a> TransferFields<'a> {
    /// Reads the `transfer` at the start of a frame body; returns it and its payload.
    pub fn decode(body: &'a [u8]) -> Result<(Self, &'a [u8]), CodecError> {
        let mut f = Fields::open(body, code::TRANSFER, "not a transfer")?;
        let handle = f.mandatory(|r| r.optional_uint(), "a transfer needs a handle")?;
        let delivery_id = f.next(|r| r.optional_uint())?;
        let delivery_tag = f.next(|r| r.optional_binary())?;
        let message_format = f.next(|r| r.optional_uint())?;
        let transfer = match f.flags_without_mode_or_state() {
            Some([settled, more, resume, aborted, batchable]) => TransferFields {
                handle,
                delivery_id,
                delivery_tag,
                message_format,
                settled,
                more: more.unwrap_or(false),
                rcv_settle_mode: None,
                state: None,
                resume: resume.unwrap_or(false),
                aborted: aborted.unwrap_or(false),
                batchable: batchable.unwrap_or(false),
            },
            None => TransferFields {
                handle,
                delivery_id,
                delivery_tag,
                message_format,
                settled: f.next(|r| r.optional_bool())?,
                more: f.next(|r| r.optional_bool())?.unwrap_or(false),
                rcv_settle_mode: f.next(|r| r.optional_ubyte())?,
                state: f.next(|r| r.optional_raw())?,
                resume: f.next(|r| r.optional_bool())?.unwrap_or(false),
                aborted: f.next(|r| r.optional_bool())?.unwrap_or(false),
                batchable: f.next(|r| r.optional_bool())?.unwrap_or(false),
            },
        };
        let payload = f.close()?;
        Ok((transfer, payload))
    }

    /// Appends the performative (all 11 fields); the caller appends the payload after it.
    /// Leaving off the trailing null and `false` fields would be valid AMQP and save the peer
    /// work, but the Python SDK's `pyamqp` finds a transfer's payload after exactly 11 fields
    /// and fails to open a link ("list index out of range") when the list is shorter.
    pub fn encode(&self, out: &mut Vec<u8>) {
        write_described_list(out, code::TRANSFER as u8, 11, |out| {
            write_uint(out, self.handle);
            write_optional_uint(out, self.delivery_id);
            write_optional_binary(out, self.delivery_tag);
            write_optional_uint(out, self.message_format);
            write_optional_bool(out, self.settled);
            write_bool(out, self.more);
            write_optional_ubyte(out, self.rcv_settle_mode);
            write_optional_raw(out, self.state);
            write_bool(out, self.resume);
            write_bool(out, self.aborted);
            write_bool(out, self.batchable);
        });
    }
}

/// A `flow` (specification 2.7.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowFields<'a> {
    /// The next transfer id the sender of this flow expects (null before it has seen `begin`).
    pub next_incoming_id: Option<u32>,
    /// How many more transfers it accepts.
    pub incoming_window: u32,
    /// The id of its next outgoing transfer.
    pub next_outgoing_id: u32,
    /// How many transfers it may send.
    pub outgoing_window: u32,
    /// The link, for link flow state.
    pub handle: Option<u32>,
    /// The link's delivery count.
    pub delivery_count: Option<u32>,
    /// The link's credit.
    pub link_credit: Option<u32>,
    /// Messages available at the sender.
    pub available: Option<u32>,
    /// Whether the sender should use up or drop the credit.
    pub drain: bool,
    /// Whether the peer should answer with its own flow.
    pub echo: bool,
    /// Link state properties, encoded.
    pub properties: Option<&'a [u8]>,
}

impl<'a> FlowFields<'a> {
    /// Reads the `flow` at the start of a frame body.
    pub fn decode(body: &'a [u8]) -> Result<Self, CodecError> {
        let mut f = Fields::open(body, code::FLOW, "not a flow")?;
        let flow = FlowFields {
            next_incoming_id: f.next(|r| r.optional_uint())?,
            incoming_window: f.mandatory(|r| r.optional_uint(), "a flow needs incoming-window")?,
            next_outgoing_id: f
                .mandatory(|r| r.optional_uint(), "a flow needs next-outgoing-id")?,
            outgoing_window: f.mandatory(|r| r.optional_uint(), "a flow needs outgoing-window")?,
            handle: f.next(|r| r.optional_uint())?,
            delivery_count: f.next(|r| r.optional_uint())?,
            link_credit: f.next(|r| r.optional_uint())?,
            available: f.next(|r| r.optional_uint())?,
            drain: f.next(|r| r.optional_bool())?.unwrap_or(false),
            echo: f.next(|r| r.optional_bool())?.unwrap_or(false),
            properties: f.next(|r| r.optional_raw())?,
        };
        f.close_without_payload("a flow carries no payload")?;
        Ok(flow)
    }

    /// Appends the performative (all 11 fields).
    pub fn encode(&self, out: &mut Vec<u8>) {
        write_described_list(out, code::FLOW as u8, 11, |out| {
            write_optional_uint(out, self.next_incoming_id);
            write_uint(out, self.incoming_window);
            write_uint(out, self.next_outgoing_id);
            write_uint(out, self.outgoing_window);
            write_optional_uint(out, self.handle);
            write_optional_uint(out, self.delivery_count);
            write_optional_uint(out, self.link_credit);
            write_optional_uint(out, self.available);
            write_bool(out, self.drain);
            write_bool(out, self.echo);
            write_optional_raw(out, self.properties);
        });
    }
}

/// A `disposition` (specification 2.7.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DispositionFields<'a> {
    /// `true` when sent by the receiving end of the links.
    pub role_is_receiver: bool,
    /// The first delivery id of the range.
    pub first: u32,
    /// The last delivery id of the range (`None`: just `first`).
    pub last: Option<u32>,
    /// Whether the deliveries are settled.
    pub settled: bool,
    /// Their state (an outcome), encoded.
    pub state: Option<&'a [u8]>,
    /// Whether the peer may delay its reply.
    pub batchable: bool,
}

impl<'a> DispositionFields<'a> {
    /// Reads the `disposition` at the start of a frame body.
    pub fn decode(body: &'a [u8]) -> Result<Self, CodecError> {
        let mut f = Fields::open(body, code::DISPOSITION, "not a disposition")?;
        let disposition = DispositionFields {
            role_is_receiver: f.mandatory(|r| r.optional_bool(), "a disposition needs a role")?,
            first: f.mandatory(|r| r.optional_uint(), "a disposition needs first")?,
            last: f.next(|r| r.optional_uint())?,
            settled: f.next(|r| r.optional_bool())?.unwrap_or(false),
            state: f.next(|r| r.optional_raw())?,
            batchable: f.next(|r| r.optional_bool())?.unwrap_or(false),
        };
        f.close_without_payload("a disposition carries no payload")?;
        Ok(disposition)
    }

    /// Appends the performative (all 6 fields).
    pub fn encode(&self, out: &mut Vec<u8>) {
        write_described_list(out, code::DISPOSITION as u8, 6, |out| {
            write_bool(out, self.role_is_receiver);
            write_uint(out, self.first);
            write_optional_uint(out, self.last);
            write_bool(out, self.settled);
            write_optional_raw(out, self.state);
            write_bool(out, self.batchable);
        });
    }
}

#[cfg(test)]
mod tests;
