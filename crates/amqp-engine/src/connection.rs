//! One AMQP 1.0 connection as a sans-IO state machine: the connection layer, and the
//! public face of its sessions, links and deliveries.
//!
//! Feed it the bytes read from the peer ([`Connection::receive`]); take what it asks to send
//! ([`Connection::take_output`]) and what happened ([`Connection::poll_event`]); act on it with
//! [`Connection::begin`], [`Connection::attach`], [`Connection::send`], [`Connection::flow`],
//! [`Connection::disposition`], [`Connection::detach`], [`Connection::close`] and friends.
//!
//! # Layers (specification part 2), one module each
//! - **Connection** (here): the header, the `open` handshake (the peer's `max-frame-size`,
//!   `channel-max` and `idle-time-out`), `close`, reading frames and dispatching them by
//!   performative, and the output buffer. The clock is the driver's: it sends keep-alives at
//!   [`Connection::remote_idle_timeout_ms`] and judges the peer's silence.
//! - **Sessions** (`connection/session.rs`): channels mapped both ways; transfer ids and
//!   windows (2.5.6).
//! - **Links** (`connection/link.rs`): handles mapped both ways; delivery counts, credit and
//!   drain (2.6.7).
//! - **Deliveries** (`connection/transfer.rs`): transfers out and in, split and joined;
//!   dispositions.
//! - **Errors** ([`crate::error`]): what the peer or the application got wrong.
//!
//! Each layer's type keeps its own counters and asserts its invariants where it changes them;
//! the assertions stay on in release builds and guard only against this engine's own bugs.
//! What a peer gets wrong is judged first and ends as a [`ConnectionError`] (the connection is
//! closed with it) or a detached link — never as a panic.
//!
//! # Guarantees (connection layer)
//! - Nothing is read before the protocol header, no frame but `open` before the peer's
//!   `open`, and nothing after the peer's `close` or a protocol error.
//! - Nothing is written after this side's `close`: frames the peer's frames would call for
//!   (answers, flows) are dropped once it is sent.
//! - Every frame read is within this side's `max-frame-size`, judged from its header.

mod link;
mod session;
mod transfer;

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use fe2o3_amqp_types::definitions::{self, Fields};
use fe2o3_amqp_types::performatives::{Attach, ChannelMax, Close, MaxFrameSize, Open};
use tributary_amqp_codec::frame::{self, FrameType, MIN_MAX_FRAME_SIZE};
use tributary_amqp_codec::performative::{FlowFields, code, performative_code};

pub use self::link::{LinkId, LinkMap, LinkRole, attach_frame};
pub use self::session::SessionId;
pub use self::transfer::{Delivery, DeliveryTag, SPLICE_MIN_BYTES};
pub use crate::error::{ConnectionError, SendError, amqp_error, condition};

use self::link::Link;
use self::session::{Session, Sessions};
use crate::error::decode;
use crate::output::{Output, Splice};
use crate::pad::write_performative;

/// The protocol header of an AMQP connection (no security layer).
pub const AMQP_HEADER: [u8; 8] = *b"AMQP\x00\x01\x00\x00";

/// How a connection is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// This side's container id.
    pub container_id: String,
    /// The host the client connects to (clients only; sent in `open`).
    pub hostname: Option<String>,
    /// The largest frame this side reads (at least 512).
    pub max_frame_size: u32,
    /// The highest channel (session) number this side accepts.
    pub channel_max: u16,
    /// The highest link handle this side accepts per session.
    pub handle_max: u32,
    /// How long this side lets the peer be silent (the driver enforces it; `None`: forever).
    pub idle_timeout_ms: Option<u32>,
    /// The incoming window of each session, in transfer frames.
    pub session_window: u32,
    /// Connection properties sent in `open`.
    pub properties: Option<Fields>,
}

impl Config {
    /// A configuration with `container_id` and defaults: 256 KiB frames, 255 channels, 1024
    /// handles, 5,000-frame session windows, no idle timeout.
    pub fn new(container_id: impl Into<String>) -> Self {
        Config {
            container_id: container_id.into(),
            hostname: None,
            max_frame_size: 256 * 1024,
            channel_max: 255,
            handle_max: 1023,
            idle_timeout_ms: None,
            session_window: 5_000,
            properties: None,
        }
    }
}

/// What happened on the connection.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The peer's `open` arrived.
    Opened(Box<Open>),
    /// A session began: the peer began it (this side answered already) or answered ours.
    SessionBegun(SessionId),
    /// The peer attached a link (`answer == false`: answer with [`Connection::attach_answer`])
    /// or answered this side's attach (`answer == true`; a refusal comes with a null terminus
    /// and is followed by a detach).
    Attached {
        /// The link.
        link: LinkId,
        /// The peer's attach.
        attach: Box<Attach>,
        /// Whether it answers this side's attach.
        answer: bool,
    },
    /// A message arrived.
    Delivery(Delivery),
    /// The peer changed a sending link's credit (or the session's window opened): see
    /// [`Connection::credit`] and [`Connection::drain_requested`].
    Credit(LinkId),
    /// The peer settled or updated deliveries (delivery ids `first..=last` of the session).
    Disposition {
        /// The session.
        session: SessionId,
        /// Whether the peer is the receiver of those deliveries.
        role_is_receiver: bool,
        /// The first delivery id.
        first: u32,
        /// The last delivery id.
        last: u32,
        /// Whether they are settled.
        settled: bool,
        /// Their state, encoded.
        state: Option<Vec<u8>>,
    },
    /// A link is gone: the peer detached it (this side answered), or this side detached it
    /// for breaking the protocol (the error says why).
    Detached {
        /// The link.
        link: LinkId,
        /// Whether it was closed (not just detached).
        closed: bool,
        /// The error, if any.
        error: Option<definitions::Error>,
    },
    /// A session ended, and with it its links.
    SessionEnded {
        /// The session.
        session: SessionId,
        /// The error, if any.
        error: Option<definitions::Error>,
    },
    /// The peer closed the connection (this side answered).
    Closed {
        /// The error, if any.
        error: Option<definitions::Error>,
    },
}

/// One AMQP connection's protocol state (see the module docs).
#[derive(Debug)]
pub struct Connection {
    config: Config,
    is_server: bool,
    header_received: bool,
    open_received: bool,
    close_sent: bool,
    close_received: bool,
    remote_max_frame: u32,
    remote_channel_max: u16,
    remote_idle_timeout_ms: Option<u32>,
    sessions: Sessions,
    out: Vec<u8>,
    /// Bodies sent after `out[..at]` without being copied into it ([`Self::send_parts`]).
    spliced: Vec<Splice>,
    events: VecDeque<Event>,
}

impl Connection {
    /// The client side: its header and `open` are queued at once.
    pub fn client(config: Config) -> Self {
        let mut connection = Connection::new(config, false);
        connection.out.extend_from_slice(&AMQP_HEADER);
        connection.write_open();
        connection
    }

    /// The server side: it answers the client's header with its own header and `open`.
    pub fn server(config: Config) -> Self {
        Connection::new(config, true)
    }

    fn new(config: Config, is_server: bool) -> Self {
        assert!(
            config.max_frame_size >= MIN_MAX_FRAME_SIZE,
            "max-frame-size is at least 512"
        );
        assert!(config.session_window > 0, "a session window is not empty");
        Connection {
            config,
            is_server,
            header_received: false,
            open_received: false,
            close_sent: false,
            close_received: false,
            remote_max_frame: MIN_MAX_FRAME_SIZE,
            remote_channel_max: 0,
            remote_idle_timeout_ms: None,
            sessions: Sessions::default(),
            out: Vec::new(),
            spliced: Vec::new(),
            events: VecDeque::new(),
        }
    }

    fn write_open(&mut self) {
        let open = Open {
            container_id: self.config.container_id.clone(),
            hostname: self.config.hostname.clone(),
            max_frame_size: MaxFrameSize(self.config.max_frame_size),
            channel_max: ChannelMax(self.config.channel_max),
            idle_time_out: self.config.idle_timeout_ms,
            outgoing_locales: None,
            incoming_locales: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: self.config.properties.clone(),
        };
        self.write_cold(0, &open);
    }

    /// Bytes waiting to be sent; the caller sends all of them, in order.
    pub fn take_output(&mut self) -> Vec<u8> {
        let mut output = Vec::new();
        self.move_output_to(&mut output);
        output
    }

    /// Whether bytes wait to be sent.
    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// Appends the bytes waiting to be sent to `buffer` (cheaper than [`Self::take_output`]
    /// when the caller keeps its own buffer).
    /// Bodies sent from where they are ([`Self::send_parts`]) are copied in here.
    pub fn move_output_to(&mut self, buffer: &mut Vec<u8>) {
        if !self.spliced.is_empty() {
            let mut at = 0;
            for splice in self.spliced.drain(..) {
                buffer.extend_from_slice(&self.out[at..splice.at]);
                buffer.extend_from_slice(&splice.body);
                at = splice.at;
            }
            buffer.extend_from_slice(&self.out[at..]);
            self.out.clear();
        } else if buffer.is_empty() {
            std::mem::swap(buffer, &mut self.out);
        } else {
            buffer.append(&mut self.out);
        }
    }

    /// Moves the bytes waiting to be sent to the driver's `output`: with the bodies to send
    /// from where they are if `splice`, else with those bodies copied in.
    pub(crate) fn move_output_into(&mut self, output: &mut Output, splice: bool) {
        if !splice && !self.spliced.is_empty() {
            let mut flat = Vec::new();
            self.move_output_to(&mut flat);
            output.append(&mut flat, &mut Vec::new());
        } else {
            output.append(&mut self.out, &mut self.spliced);
        }
    }

    /// Gives back the capacity of the output buffer and the event queue if they are empty:
    /// for a connection gone quiet (busy ones keep theirs, to reuse).
    pub fn release_spare_memory(&mut self) {
        if self.out.is_empty() {
            self.out = Vec::new();
        }
        if self.events.is_empty() {
            self.events = VecDeque::new();
        }
    }

    /// The next event, oldest first.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The peer's idle timeout: send something at least this often (the driver sends empty
    /// frames at half of it).
    pub fn remote_idle_timeout_ms(&self) -> Option<u32> {
        self.remote_idle_timeout_ms.filter(|ms| *ms > 0)
    }

    /// This side's idle timeout.
    pub fn local_idle_timeout_ms(&self) -> Option<u32> {
        self.config.idle_timeout_ms.filter(|ms| *ms > 0)
    }

    /// Whether the peer's protocol header has arrived (a server has then sent its header and
    /// `open`, so it may send `close`).
    pub fn header_received(&self) -> bool {
        self.header_received
    }

    /// Whether the peer's `open` has arrived.
    pub fn open_received(&self) -> bool {
        self.open_received
    }

    /// Whether the peer closed, or this side closed and nothing more may be sent.
    pub fn is_closed(&self) -> bool {
        self.close_received || self.close_sent
    }

    /// Whether both sides have closed.
    pub fn is_finished(&self) -> bool {
        self.close_received && self.close_sent
    }

    // ----- reading -----

    /// Reads the complete frames at the start of `input`; returns how many bytes were used
    /// (the caller keeps the rest for the next call). On a protocol error the connection is
    /// closed with the error (queued in the output) and the error returned; nothing more is
    /// read after that, nor after the peer's `close`.
    ///
    /// The payloads of the deliveries it reads are copies; [`Self::receive_buf`] reads without
    /// copying them.
    pub fn receive(&mut self, input: &[u8]) -> Result<usize, ConnectionError> {
        self.receive_bytes(&Bytes::copy_from_slice(input))
    }

    /// [`Self::receive`] from a buffer the caller reads into: takes the protocol header and the
    /// whole frames off the front of `input` (what stays is the start of a frame: read more
    /// into it) and reads them. A delivery's payload is a view of these bytes, not a copy: the
    /// bytes of one read are freed once the last delivery read from them is dropped.
    pub fn receive_buf(&mut self, input: &mut BytesMut) -> Result<(), ConnectionError> {
        let whole = self.whole_frames_len(input);
        if whole == 0 {
            return Ok(());
        }
        let frames = input.split_to(whole).freeze();
        self.receive_bytes(&frames).map(|_| ())
    }

    /// How many bytes at the start of `input` a receive can use: the protocol header (while it
    /// is expected) and whole frames. All of them if the framing is broken: reading them then
    /// reports the error.
    fn whole_frames_len(&self, input: &[u8]) -> usize {
        let mut at = 0;
        if !self.header_received {
            if input.len() < AMQP_HEADER.len() {
                return 0;
            }
            at = AMQP_HEADER.len();
        }
        loop {
            match frame::split_frame(&input[at..], self.config.max_frame_size) {
                Ok(Some((_, size))) => at += size,
                Ok(None) => return at,
                Err(_) => return input.len(),
            }
        }
    }

    /// Reads the complete frames at the start of `input` (see [`Self::receive`]); deliveries'
    /// payloads are slices of `input`.
    fn receive_bytes(&mut self, input: &Bytes) -> Result<usize, ConnectionError> {
        let mut used = 0;
        let result = self.receive_frames(input, &mut used);
        self.top_up_windows();
        match result {
            Ok(()) => Ok(used),
            Err(error) => {
                self.close(Some(error.to_amqp()));
                self.close_received = true;
                Err(error)
            }
        }
    }

    fn receive_frames(&mut self, input: &Bytes, used: &mut usize) -> Result<(), ConnectionError> {
        while !self.close_received {
            let rest = &input[*used..];
            if !self.header_received {
                if rest.len() < AMQP_HEADER.len() {
                    return Ok(());
                }
                if rest[..AMQP_HEADER.len()] != AMQP_HEADER {
                    return Err(ConnectionError::new(
                        condition::NOT_ALLOWED,
                        "expected the AMQP 1.0.0 protocol header",
                    ));
                }
                self.header_received = true;
                *used += AMQP_HEADER.len();
                if self.is_server {
                    self.out.extend_from_slice(&AMQP_HEADER);
                    self.write_open();
                }
                continue;
            }
            let split = frame::split_frame(rest, self.config.max_frame_size)
                .map_err(|e| ConnectionError::new(condition::FRAMING_ERROR, e.to_string()))?;
            let Some((frame, size)) = split else {
                return Ok(());
            };
            *used += size;
            if frame.frame_type != FrameType::Amqp {
                return Err(ConnectionError::new(
                    condition::FRAMING_ERROR,
                    "a SASL frame after the security layer",
                ));
            }
            if frame.body.is_empty() {
                continue; // a keep-alive
            }
            self.on_frame(frame.channel, frame.body, input)?;
        }
        Ok(())
    }

    /// Dispatches a frame to its layer by performative. `input`: the bytes `body` lies in
    /// (a delivery's payload is a slice of them).
    fn on_frame(
        &mut self,
        channel: u16,
        body: &[u8],
        input: &Bytes,
    ) -> Result<(), ConnectionError> {
        let performative = performative_code(body).map_err(crate::error::decode_error)?;
        if !self.open_received && performative != code::OPEN {
            return Err(ConnectionError::new(
                condition::NOT_ALLOWED,
                "the first frame must be open",
            ));
        }
        match performative {
            code::TRANSFER => self.on_transfer(channel, body, input),
            code::FLOW => self.on_flow(channel, body),
            code::DISPOSITION => self.on_disposition(channel, body),
            code::OPEN => self.on_open(body),
            code::BEGIN => self.on_begin(channel, body),
            code::ATTACH => self.on_attach(channel, body),
            code::DETACH => self.on_detach(channel, body),
            code::END => self.on_end(channel, body),
            code::CLOSE => self.on_close(body),
            other => Err(ConnectionError::new(
                condition::FRAMING_ERROR,
                format!("unknown performative {other:#x}"),
            )),
        }
    }

    fn on_open(&mut self, body: &[u8]) -> Result<(), ConnectionError> {
        if self.open_received {
            return Err(ConnectionError::new(
                condition::NOT_ALLOWED,
                "a second open",
            ));
        }
        let open: Open = decode(body, "open")?;
        if open.max_frame_size.0 < MIN_MAX_FRAME_SIZE {
            return Err(ConnectionError::new(
                condition::INVALID_FIELD,
                format!("max-frame-size {} is below 512", open.max_frame_size.0),
            ));
        }
        self.open_received = true;
        self.remote_max_frame = open.max_frame_size.0;
        self.remote_channel_max = open.channel_max.0;
        self.remote_idle_timeout_ms = open.idle_time_out;
        self.events.push_back(Event::Opened(Box::new(open)));
        Ok(())
    }

    fn on_close(&mut self, body: &[u8]) -> Result<(), ConnectionError> {
        let close: Close = decode(body, "close")?;
        self.close_received = true;
        self.close(None);
        self.events.push_back(Event::Closed { error: close.error });
        Ok(())
    }

    // ----- finding sessions and links -----

    /// The local channel of the session the peer's `channel` is mapped to.
    fn session_of(&self, channel: u16) -> Result<u16, ConnectionError> {
        self.sessions.local_of(channel).ok_or_else(|| {
            ConnectionError::new(
                condition::NOT_ALLOWED,
                format!("channel {channel} has no session"),
            )
        })
    }

    /// The session on `local`, known to exist (a mapped channel's).
    fn session_mut(&mut self, local: u16) -> &mut Session {
        self.sessions
            .get_mut(local)
            .expect("mapped channels have sessions")
    }

    /// The lowest free channel within both sides' channel-max.
    fn free_channel(&mut self) -> Option<u16> {
        let max = self.config.channel_max.min(self.remote_channel_max);
        self.sessions.free_channel(max)
    }

    /// The local handle the peer's `remote` handle on session `local_channel` is mapped to.
    fn link_of(&self, local_channel: u16, remote: u32) -> Result<u32, ConnectionError> {
        self.sessions
            .get(local_channel)
            .and_then(|s| s.local_handle(remote))
            .ok_or_else(|| {
                ConnectionError::new(
                    condition::UNATTACHED_HANDLE,
                    format!("handle {remote} is not attached"),
                )
            })
    }

    /// A session the application may act on: it exists and this side has not ended it.
    fn mapped_session(&mut self, session: SessionId) -> Result<&mut Session, SendError> {
        match self.sessions.get_mut(session.0) {
            Some(s) if !s.is_ending() => Ok(s),
            _ => Err(SendError::NoSession),
        }
    }

    /// A link the application may act on: its session may be, and this side has not
    /// detached it.
    fn link_mut(&mut self, link: LinkId) -> Result<&mut Link, SendError> {
        let session = self.mapped_session(link.session)?;
        match session.link_mut(link.handle) {
            Some(l) if !l.detach_sent() => Ok(l),
            _ => Err(SendError::NotAttached),
        }
    }

    /// A link, whatever its state.
    fn peek_link(&self, link: LinkId) -> Option<&Link> {
        self.sessions.get(link.session.0)?.link(link.handle)
    }

    // ----- acting -----

    /// Closes the connection with an optional error. Nothing more is sent after it.
    pub fn close(&mut self, error: Option<definitions::Error>) {
        if self.close_sent {
            return;
        }
        self.write_cold(0, &Close { error });
        self.close_sent = true;
    }

    /// Queues an empty frame (a keep-alive).
    pub fn keep_alive(&mut self) {
        if !self.close_sent {
            frame::write_empty_frame(&mut self.out);
        }
    }

    // ----- writing -----

    /// Writes a rare performative, with all its fields; nothing after this side's `close`.
    fn write_cold<T: serde::Serialize>(&mut self, local_channel: u16, value: &T) {
        if self.close_sent {
            return;
        }
        let start = frame::start_frame(&mut self.out, FrameType::Amqp, local_channel);
        write_performative(value, &mut self.out);
        frame::finish_frame(&mut self.out, start);
    }

    /// Writes a `flow`.
    fn write_flow(&mut self, local_channel: u16, fields: &FlowFields<'_>) {
        assert!(!self.close_sent, "no flow is written after close");
        let start = frame::start_frame(&mut self.out, FrameType::Amqp, local_channel);
        fields.encode(&mut self.out);
        frame::finish_frame(&mut self.out, start);
    }
}

#[cfg(test)]
mod tests;
