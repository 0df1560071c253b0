//! Sessions (specification 2.5): channel numbers, transfer ids and windows, and the handle
//! maps of their links.
//!
//! [`Sessions`] owns the channel numbers: this side's channel of each session and the peer's
//! channel mapped to it. A [`Session`] owns its transfer-id counters and both windows, the
//! queue of transfer frames waiting for the peer's window, and its links by handle.
//!
//! # Guarantees (asserted where they change)
//! - A channel holds at most one session, and a remote channel maps to at most one session,
//!   which knows that channel as its own.
//! - `next-outgoing-id` counts exactly the transfer frames written, and only those within the
//!   peer's incoming window: the window this side may still use never goes below zero. Frames
//!   beyond it wait in order and are counted when written.
//! - Delivery ids are handed out one after the other (RFC 1982 order), one per delivery.
//! - A handle holds at most one link; a remote handle maps to at most one link, which knows it
//!   as its remote handle; both are freed together.
//!
//! What the peer gets wrong (a transfer beyond this side's window, a channel it already
//! uses) is judged before any of these and comes back as a [`ConnectionError`].

use std::collections::VecDeque;

use fe2o3_amqp_types::definitions;
use fe2o3_amqp_types::performatives::{Begin, End};
use tributary_amqp_codec::performative::FlowFields;

use super::link::{Link, LinkId, LinkRole};
use super::{Connection, Event};
use crate::error::{ConnectionError, SendError, condition, decode};
use crate::serial;

/// A session: this side's channel number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u16);

/// An unmapped entry of a remote-to-local map.
const NONE_U16: u16 = u16::MAX;
/// An unmapped entry of a remote-to-local handle map.
const NONE_U32: u32 = u32::MAX;

/// The sessions of a connection by this side's channel, and the peer's channels mapped to them.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    slots: Vec<Option<Session>>,
    /// Remote channel → local channel ([`NONE_U16`]: none).
    remote: Vec<u16>,
}

impl Sessions {
    pub(super) fn get(&self, local: u16) -> Option<&Session> {
        self.slots.get(usize::from(local))?.as_ref()
    }

    pub(super) fn get_mut(&mut self, local: u16) -> Option<&mut Session> {
        self.slots.get_mut(usize::from(local))?.as_mut()
    }

    /// The local channel the peer's `remote` channel is mapped to.
    pub(super) fn local_of(&self, remote: u16) -> Option<u16> {
        let local = *self.remote.get(usize::from(remote))?;
        (local != NONE_U16).then_some(local)
    }

    /// The lowest channel up to `max` that holds no session.
    pub(super) fn free_channel(&mut self, max: u16) -> Option<u16> {
        let free = (0..=max).find(|c| self.get(*c).is_none())?;
        if self.slots.len() <= usize::from(free) {
            self.slots.resize_with(usize::from(free) + 1, || None);
        }
        Some(free)
    }

    /// Puts a new session on the free channel `local`.
    pub(super) fn open(&mut self, local: u16, session: Session) {
        let slot = &mut self.slots[usize::from(local)];
        assert!(slot.is_none(), "a channel holds at most one session");
        *slot = Some(session);
    }

    /// Maps the peer's `remote` channel to the session on `local`.
    fn map_remote(&mut self, remote: u16, local: u16) {
        assert!(
            self.local_of(remote).is_none(),
            "a remote channel maps to at most one session"
        );
        if self.remote.len() <= usize::from(remote) {
            self.remote.resize(usize::from(remote) + 1, NONE_U16);
        }
        self.remote[usize::from(remote)] = local;
        let session = self
            .get_mut(local)
            .expect("a mapped channel holds a session");
        assert!(
            session.remote_channel.is_none(),
            "a session is mapped to one remote channel"
        );
        session.remote_channel = Some(remote);
    }

    /// Unmaps the peer's `remote` channel and frees its session's channel.
    fn remove(&mut self, remote: u16) -> (u16, Session) {
        let local = self.local_of(remote).expect("the channel is mapped");
        self.remote[usize::from(remote)] = NONE_U16;
        let session = self.slots[usize::from(local)]
            .take()
            .expect("a mapped channel holds a session");
        assert_eq!(
            session.remote_channel,
            Some(remote),
            "a session and its remote channel agree"
        );
        (local, session)
    }

    /// Every channel that has held a session so far.
    fn channels(&self) -> impl Iterator<Item = u16> + use<> {
        (0..self.slots.len()).map(|at| u16::try_from(at).expect("channels are u16"))
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Session> {
        self.slots.iter().flatten()
    }
}

/// One session's state: its windows, transfer ids and links.
#[derive(Debug)]
pub(super) struct Session {
    remote_channel: Option<u16>,
    end_sent: bool,
    next_outgoing_id: u32,
    next_incoming_id: u32,
    incoming_window: u32,
    /// How many more transfer frames the peer accepts: this side's usable outgoing window.
    remote_incoming_window: u32,
    next_delivery_id: u32,
    remote_handle_max: u32,
    links: Vec<Option<Link>>,
    /// Remote handle → local handle ([`NONE_U32`]: none).
    remote_handles: Vec<u32>,
    /// Transfer frames waiting for the peer's window, in order.
    blocked: VecDeque<Vec<u8>>,
    /// Whether the incoming window needs topping up (sent after the current read).
    window_low: bool,
}

impl Session {
    pub(super) fn new(window: u32) -> Self {
        Session {
            remote_channel: None,
            end_sent: false,
            next_outgoing_id: 0,
            next_incoming_id: 0,
            incoming_window: window,
            remote_incoming_window: 0,
            next_delivery_id: 0,
            remote_handle_max: u32::MAX,
            links: Vec::new(),
            remote_handles: Vec::new(),
            blocked: VecDeque::new(),
            window_low: false,
        }
    }

    /// Whether the peer's `begin` for it has arrived.
    pub(super) fn is_mapped(&self) -> bool {
        self.remote_channel.is_some()
    }

    /// Whether this side sent its `end`.
    pub(super) fn is_ending(&self) -> bool {
        self.end_sent
    }

    /// This side sent its `end`: frames waiting for the window are dropped.
    fn end_sent(&mut self) {
        self.end_sent = true;
        self.blocked.clear();
    }

    /// The peer's `begin` arrived (its `next-outgoing-id`, `incoming-window`, `handle-max`).
    fn begun_by_peer(&mut self, begin: &Begin) {
        self.next_incoming_id = begin.next_outgoing_id;
        self.remote_incoming_window = begin.incoming_window;
        self.remote_handle_max = begin.handle_max.0;
    }

    // ----- transfer ids and windows -----

    /// One transfer frame arrived: it takes one of this side's incoming window, or breaks it.
    pub(super) fn take_incoming(&mut self, window: u32) -> Result<(), ConnectionError> {
        if self.incoming_window == 0 {
            return Err(ConnectionError::new(
                condition::WINDOW_VIOLATION,
                "a transfer beyond the session's incoming window",
            ));
        }
        self.incoming_window -= 1;
        self.next_incoming_id = self.next_incoming_id.wrapping_add(1);
        // Half used: top it up (rounded up, so that a window of one frame is topped up too).
        if self.incoming_window < window.div_ceil(2) {
            self.window_low = true;
        }
        Ok(())
    }

    /// Whether the incoming window ran low; if so it is reset to `window` (the caller tells
    /// the peer).
    fn take_top_up(&mut self, window: u32) -> bool {
        if !self.window_low || self.end_sent {
            return false;
        }
        self.window_low = false;
        self.incoming_window = window;
        true
    }

    /// Whether transfers wait (or would wait) for the peer's window.
    pub(super) fn is_blocked(&self) -> bool {
        self.remote_incoming_window == 0 || !self.blocked.is_empty()
    }

    /// Whether `frames` transfer frames written now would all leave at once: nothing waits
    /// and the peer's window takes them all.
    pub(super) fn takes_frames(&self, frames: usize) -> bool {
        self.blocked.is_empty() && frames <= self.remote_incoming_window as usize
    }

    /// The peer's session flow state (specification 2.5.6): what it still accepts, counted
    /// from the transfers it has seen.
    fn peer_flow(&mut self, next_incoming_id: Option<u32>, incoming_window: u32) {
        let accepts = serial::distance(
            self.next_outgoing_id,
            next_incoming_id.unwrap_or(0).wrapping_add(incoming_window),
        );
        // next-incoming-id ahead of what was sent: a confused peer; trust its window only.
        self.remote_incoming_window = accepts.min(incoming_window);
    }

    /// The id of the next delivery sent on this session.
    pub(super) fn take_delivery_id(&mut self) -> u32 {
        let id = self.next_delivery_id;
        self.next_delivery_id = id.wrapping_add(1);
        assert!(
            serial::precedes(id, self.next_delivery_id),
            "delivery ids are handed out in order"
        );
        id
    }

    /// Transfer frames just written to `out` at `starts` (in order, the last running to the
    /// end): those within the peer's window stay and are counted; the rest move to the wait
    /// queue, behind any already waiting.
    pub(super) fn send_frames(&mut self, out: &mut Vec<u8>, starts: &[usize]) {
        let fits = if self.blocked.is_empty() {
            starts.len().min(self.remote_incoming_window as usize)
        } else {
            0
        };
        self.count_outgoing(u32::try_from(fits).expect("fits in the window"));
        if fits < starts.len() {
            let tail = out.split_off(starts[fits]);
            let base = starts[fits];
            for pair in starts[fits..].windows(2) {
                self.blocked
                    .push_back(tail[pair[0] - base..pair[1] - base].to_vec());
            }
            let last = starts[starts.len() - 1] - base;
            self.blocked.push_back(tail[last..].to_vec());
        }
    }

    /// Writes the waiting frames the peer's window now takes.
    fn flush_blocked(&mut self, out: &mut Vec<u8>) {
        while self.remote_incoming_window > 0 {
            let Some(frame) = self.blocked.pop_front() else {
                break;
            };
            self.count_outgoing(1);
            out.extend_from_slice(&frame);
        }
    }

    /// `frames` transfer frames were written: each takes one transfer id and one of the peer's
    /// incoming window.
    fn count_outgoing(&mut self, frames: u32) {
        assert!(
            frames <= self.remote_incoming_window,
            "the outgoing window never goes below zero"
        );
        let before = self.next_outgoing_id;
        self.remote_incoming_window -= frames;
        self.next_outgoing_id = before.wrapping_add(frames);
        assert_eq!(
            serial::distance(before, self.next_outgoing_id),
            frames,
            "next-outgoing-id advances by exactly the frames written"
        );
    }

    /// Bytes of transfer frames waiting for the peer's window.
    fn blocked_bytes(&self) -> usize {
        self.blocked.iter().map(Vec::len).sum()
    }

    /// The session part of a `flow`.
    pub(super) fn flow_fields(&self) -> FlowFields<'static> {
        FlowFields {
            next_incoming_id: Some(self.next_incoming_id),
            incoming_window: self.incoming_window,
            next_outgoing_id: self.next_outgoing_id,
            outgoing_window: u32::MAX,
            ..FlowFields::default()
        }
    }

    // ----- links by handle -----

    pub(super) fn link(&self, handle: u32) -> Option<&Link> {
        self.links.get(usize::try_from(handle).ok()?)?.as_ref()
    }

    pub(super) fn link_mut(&mut self, handle: u32) -> Option<&mut Link> {
        self.links.get_mut(usize::try_from(handle).ok()?)?.as_mut()
    }

    /// The local handle the peer's `remote` handle is mapped to.
    pub(super) fn local_handle(&self, remote: u32) -> Option<u32> {
        let local = *self.remote_handles.get(usize::try_from(remote).ok()?)?;
        (local != NONE_U32).then_some(local)
    }

    /// The lowest handle up to `handle_max` (and the peer's) that holds no link.
    pub(super) fn free_handle(&self, handle_max: u32) -> Option<u32> {
        (0..=handle_max.min(self.remote_handle_max)).find(|h| self.link(*h).is_none())
    }

    /// Puts `link` on the free handle `handle`.
    pub(super) fn install_link(&mut self, handle: u32, link: Link) {
        let at = handle as usize;
        if self.links.len() <= at {
            self.links.resize_with(at + 1, || None);
        }
        assert!(self.links[at].is_none(), "a handle holds at most one link");
        self.links[at] = Some(link);
    }

    /// This side's link named `name` that still waits for the peer's attach.
    pub(super) fn awaiting_answer(&self, name: &str) -> Option<u32> {
        let at = self
            .links
            .iter()
            .position(|slot| slot.as_ref().is_some_and(|l| l.awaits_answer(name)))?;
        Some(u32::try_from(at).expect("handles are u32"))
    }

    /// Maps the peer's `remote` handle to the link on `local`.
    pub(super) fn map_remote_handle(&mut self, remote: u32, local: u32) {
        assert!(
            self.local_handle(remote).is_none(),
            "a remote handle maps to at most one link"
        );
        let at = remote as usize;
        if self.remote_handles.len() <= at {
            self.remote_handles.resize(at + 1, NONE_U32);
        }
        self.remote_handles[at] = local;
        self.link_mut(local)
            .expect("a mapped handle holds a link")
            .map_remote(remote);
    }

    /// Both sides detached the link on `handle`: its handle and its remote handle are free.
    pub(super) fn free_link(&mut self, handle: u32) {
        let Some(link) = self.links.get_mut(handle as usize).and_then(Option::take) else {
            return;
        };
        if let Some(remote) = link.remote_handle() {
            assert_eq!(
                self.local_handle(remote),
                Some(handle),
                "a link and its remote handle agree"
            );
            self.remote_handles[remote as usize] = NONE_U32;
        }
    }

    /// The handles of this side's sending links.
    fn sender_handles(&self) -> impl Iterator<Item = u32> + '_ {
        self.links.iter().enumerate().filter_map(|(handle, slot)| {
            let sender = slot.as_ref().is_some_and(|l| l.role() == LinkRole::Sender);
            sender.then(|| u32::try_from(handle).expect("handles are u32"))
        })
    }

    #[cfg(test)]
    pub(super) fn widen_remote_window_for_test(&mut self, window: u32) {
        self.remote_incoming_window = window;
    }
}

/// The connection's session frames: `begin`, `end` and the session part of `flow`.
impl Connection {
    pub(super) fn on_begin(&mut self, channel: u16, body: &[u8]) -> Result<(), ConnectionError> {
        let begin: Begin = decode(body, "begin")?;
        if self.sessions.local_of(channel).is_some() {
            return Err(ConnectionError::new(
                condition::NOT_ALLOWED,
                format!("channel {channel} already has a session"),
            ));
        }
        if channel > self.config.channel_max {
            return Err(ConnectionError::new(
                condition::RESOURCE_LIMIT_EXCEEDED,
                format!("channel {channel} is above channel-max"),
            ));
        }
        let local = match begin.remote_channel {
            Some(local) => {
                let ours = self.sessions.get(local).is_some_and(|s| !s.is_mapped());
                if !ours {
                    return Err(ConnectionError::new(
                        condition::NOT_ALLOWED,
                        format!("begin answers channel {local}, which began no session"),
                    ));
                }
                local
            }
            None => {
                let Some(local) = self.free_channel() else {
                    return Err(ConnectionError::new(
                        condition::RESOURCE_LIMIT_EXCEEDED,
                        "no channel is free",
                    ));
                };
                let session = Session::new(self.config.session_window);
                self.sessions.open(local, session);
                local
            }
        };
        self.sessions.map_remote(channel, local);
        self.session_mut(local).begun_by_peer(&begin);
        if begin.remote_channel.is_none() {
            let answer = self.begin_frame(local, Some(channel));
            self.write_cold(local, &answer);
        }
        self.events.push_back(Event::SessionBegun(SessionId(local)));
        Ok(())
    }

    /// This side's `begin` of the session on `local` (`remote_channel`: answering the peer's).
    fn begin_frame(&self, local: u16, remote_channel: Option<u16>) -> Begin {
        let session = self.sessions.get(local).expect("the session was made");
        Begin {
            remote_channel,
            next_outgoing_id: session.next_outgoing_id,
            incoming_window: session.incoming_window,
            outgoing_window: u32::MAX,
            handle_max: self.config.handle_max.into(),
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        }
    }

    pub(super) fn on_end(&mut self, channel: u16, body: &[u8]) -> Result<(), ConnectionError> {
        self.session_of(channel)?;
        let end: End = decode(body, "end")?;
        let (local, session) = self.sessions.remove(channel);
        if !session.is_ending() {
            self.write_cold(local, &End { error: None });
            self.events.push_back(Event::SessionEnded {
                session: SessionId(local),
                error: end.error,
            });
        }
        Ok(())
    }

    pub(super) fn on_flow(&mut self, channel: u16, body: &[u8]) -> Result<(), ConnectionError> {
        let local = self.session_of(channel)?;
        let flow = FlowFields::decode(body).map_err(crate::error::decode_error)?;
        let handle = match flow.handle {
            Some(remote) => Some(self.link_of(local, remote)?),
            None => None,
        };
        let session = self
            .sessions
            .get_mut(local)
            .expect("mapped channels have sessions");
        let was_blocked = session.is_blocked();
        session.peer_flow(flow.next_incoming_id, flow.incoming_window);
        if !self.close_sent {
            session.flush_blocked(&mut self.out);
        }
        let window_opened = was_blocked && session.remote_incoming_window > 0;
        let mut credit_changed = None;
        if let Some(handle) = handle {
            let link = LinkId {
                session: SessionId(local),
                handle,
            };
            if self.on_link_flow(link, &flow) {
                credit_changed = Some(handle);
            }
        } else if flow.echo {
            self.write_session_flow(local);
        }
        if window_opened {
            // Every sending link may send again; each is told once, in handle order.
            let session = self
                .sessions
                .get(local)
                .expect("mapped channels have sessions");
            self.events.extend(session.sender_handles().map(|handle| {
                Event::Credit(LinkId {
                    session: SessionId(local),
                    handle,
                })
            }));
        } else if let Some(handle) = credit_changed {
            self.events.push_back(Event::Credit(LinkId {
                session: SessionId(local),
                handle,
            }));
        }
        Ok(())
    }

    /// Tops up the incoming windows that ran low during the last read.
    pub(super) fn top_up_windows(&mut self) {
        let window = self.config.session_window;
        for local in self.sessions.channels() {
            if self
                .sessions
                .get_mut(local)
                .is_some_and(|s| s.take_top_up(window))
            {
                self.write_session_flow(local);
            }
        }
    }

    /// Whether a message sent on `session` now leaves at once rather than waiting, copied,
    /// for the peer's session window (false for a session that is not mapped). A sender with
    /// its messages at hand keeps them until [`Event::Credit`] says the window opened.
    pub fn window_open(&self, session: SessionId) -> bool {
        self.sessions
            .get(session.0)
            .is_some_and(|s| !s.is_blocked())
    }

    /// Bytes of transfer frames waiting for the peer's session windows.
    pub fn blocked_bytes(&self) -> usize {
        self.sessions.iter().map(Session::blocked_bytes).sum()
    }

    /// Begins a session (clients; the server side answers the peer's begins itself).
    pub fn begin(&mut self) -> Result<SessionId, SendError> {
        if self.close_sent {
            return Err(SendError::Closed);
        }
        // Before the peer's open its channel-max is unknown: assume only channel 0.
        let local = self.free_channel().ok_or(SendError::Exhausted)?;
        self.sessions
            .open(local, Session::new(self.config.session_window));
        let begin = self.begin_frame(local, None);
        self.write_cold(local, &begin);
        Ok(SessionId(local))
    }

    /// Ends a session (its links go with it).
    pub fn end(&mut self, session: SessionId, error: Option<definitions::Error>) {
        if self.close_sent {
            return;
        }
        let Ok(s) = self.mapped_session(session) else {
            return;
        };
        s.end_sent();
        self.write_cold(session.0, &End { error });
    }

    /// Writes a session `flow` (nothing before the peer's `begin` or after this side's
    /// `close`).
    pub(super) fn write_session_flow(&mut self, local: u16) {
        let session = self.sessions.get(local).expect("checked");
        if !session.is_mapped() || self.close_sent {
            return;
        }
        let fields = session.flow_fields();
        self.write_flow(local, &fields);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session_with_window(window: u32) -> Session {
        let mut session = Session::new(100);
        session.remote_incoming_window = window;
        session
    }

    /// Frames beyond the peer's window wait, in order, and are counted only once written.
    #[test]
    fn frames_beyond_the_window_wait_and_are_counted_when_written() {
        let mut session = session_with_window(2);
        let mut out = b"aaabbbcc".to_vec();
        session.send_frames(&mut out, &[0, 3, 6]);
        assert_eq!(out, b"aaabbb");
        assert_eq!(session.next_outgoing_id, 2);
        assert_eq!(session.remote_incoming_window, 0);
        assert_eq!(session.blocked_bytes(), 2);
        let mut more = b"dd".to_vec();
        session.send_frames(&mut more, &[0]);
        assert!(
            more.is_empty(),
            "behind waiting frames, a new one waits too"
        );
        session.peer_flow(Some(2), 5);
        let mut out = Vec::new();
        session.flush_blocked(&mut out);
        assert_eq!(out, b"ccdd");
        assert_eq!(session.next_outgoing_id, 4);
        assert_eq!(session.remote_incoming_window, 3);
    }

    /// A peer's next-incoming-id ahead of what was sent is not trusted beyond its window.
    #[test]
    fn a_peer_flow_ahead_of_what_was_sent_gives_its_window_only() {
        let mut session = session_with_window(0);
        session.peer_flow(Some(1_000), 10);
        assert_eq!(session.remote_incoming_window, 10);
        session.next_outgoing_id = u32::MAX - 1;
        session.peer_flow(Some(u32::MAX - 1), 10);
        assert_eq!(session.remote_incoming_window, 10, "across the wrap");
    }

    #[test]
    fn a_transfer_beyond_the_incoming_window_is_an_error_not_a_panic() {
        let mut session = Session::new(1);
        session.take_incoming(1).unwrap();
        let error = session.take_incoming(1).unwrap_err();
        assert_eq!(error.condition, condition::WINDOW_VIOLATION);
    }

    #[test]
    #[should_panic(expected = "the outgoing window never goes below zero")]
    fn counting_beyond_the_window_is_our_bug() {
        session_with_window(1).count_outgoing(2);
    }

    #[test]
    #[should_panic(expected = "a handle holds at most one link")]
    fn a_handle_holds_one_link() {
        let mut session = Session::new(1);
        session.install_link(0, Link::ours("a".into(), LinkRole::Sender, 0));
        session.install_link(0, Link::ours("b".into(), LinkRole::Sender, 0));
    }

    #[test]
    #[should_panic(expected = "a remote handle maps to at most one link")]
    fn a_remote_handle_maps_to_one_link() {
        let mut session = Session::new(1);
        session.install_link(0, Link::ours("a".into(), LinkRole::Sender, 0));
        session.install_link(1, Link::ours("b".into(), LinkRole::Sender, 0));
        session.map_remote_handle(7, 0);
        session.map_remote_handle(7, 1);
    }

    #[test]
    fn delivery_ids_run_on_across_the_wrap() {
        let mut session = Session::new(1);
        session.next_delivery_id = u32::MAX;
        assert_eq!(session.take_delivery_id(), u32::MAX);
        assert_eq!(session.take_delivery_id(), 0);
    }
}
