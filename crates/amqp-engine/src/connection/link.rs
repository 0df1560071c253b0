//! Links (specification 2.6): attach and detach, roles and handles, and link flow control —
//! credit, delivery-count and drain.
//!
//! A [`Link`] owns its flow state. A sending link spends credit as it sends
//! ([`Link::consume_credit`]) and takes new credit from the receiver's `flow`; a receiving
//! link grants credit ([`Link::grant`]) and spends it as deliveries arrive
//! ([`Link::accept_delivery`]).
//!
//! # Guarantees (asserted where they change)
//! - Credit never goes below zero: a delivery is counted only with credit left.
//! - Delivery-count advances by exactly the deliveries sent or received (a drain counts the
//!   credit it gives up as sent), and such a step moves credit into delivery-count: the link's
//!   limit (delivery-count + credit, RFC 1982 arithmetic) stays where the last grant put it.
//! - A link knows at most one remote handle, set once by the peer's attach.
//! - Only a sending link spends credit by sending or drains; only a receiving link grants.
//!
//! A transfer beyond the credit this side granted is the peer's fault: the link is detached
//! with `amqp:link:transfer-limit-exceeded`, never asserted on.

use fe2o3_amqp_types::definitions::{self, ReceiverSettleMode, Role, SenderSettleMode};
use fe2o3_amqp_types::performatives::{Attach, Detach};
use tributary_amqp_codec::performative::FlowFields;

use super::session::SessionId;
use super::transfer::Partial;
use super::{Connection, Event};
use crate::error::{ConnectionError, SendError, amqp_error, condition, decode};
use crate::serial;

/// A link: its session and this side's handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkId {
    /// The session.
    pub session: SessionId,
    /// This side's handle.
    pub handle: u32,
}

/// A map keyed by link, for what an application keeps per link. Its keys are this side's own
/// session numbers and handles, never chosen by the peer, so a fast hasher without a random
/// seed (`foldhash`) serves: SipHash cost about 2 % of a delivery's CPU in these lookups.
pub type LinkMap<V> = std::collections::HashMap<LinkId, V, foldhash::fast::FixedState>;

/// Which end of a link this side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkRole {
    /// This side sends messages on it.
    Sender,
    /// This side receives messages on it.
    Receiver,
}

impl LinkRole {
    fn of(role: Role) -> Self {
        match role {
            Role::Sender => LinkRole::Sender,
            Role::Receiver => LinkRole::Receiver,
        }
    }

    fn opposite(self) -> Self {
        match self {
            LinkRole::Sender => LinkRole::Receiver,
            LinkRole::Receiver => LinkRole::Sender,
        }
    }
}

/// The delivery-count a sending link of this side starts from.
const INITIAL_DELIVERY_COUNT: u32 = 0;

/// One link's state.
#[derive(Debug)]
pub(super) struct Link {
    name: String,
    role: LinkRole,
    remote_handle: Option<u32>,
    /// This side sent its attach.
    attach_sent: bool,
    /// This side sent its detach.
    detach_sent: bool,
    delivery_count: u32,
    /// Sender: what this side may send. Receiver: what it granted.
    credit: u32,
    drain: bool,
    /// Receiver: the largest message accepted (0: any).
    max_message_size: u64,
    /// Receiver: the delivery whose frames are arriving.
    partial: Option<Partial>,
}

impl Link {
    /// A link this side attaches (its attach is being sent).
    pub(super) fn ours(name: String, role: LinkRole, max_message_size: u64) -> Self {
        let mut link = Link::theirs(name, role);
        link.attach_sent = true;
        link.max_message_size = max_message_size;
        link
    }

    /// A link the peer attached, in this side's `role`; this side has not answered yet.
    fn theirs(name: String, role: LinkRole) -> Self {
        Link {
            name,
            role,
            remote_handle: None,
            attach_sent: false,
            detach_sent: false,
            delivery_count: INITIAL_DELIVERY_COUNT,
            credit: 0,
            drain: false,
            max_message_size: 0,
            partial: None,
        }
    }

    pub(super) fn role(&self) -> LinkRole {
        self.role
    }

    pub(super) fn remote_handle(&self) -> Option<u32> {
        self.remote_handle
    }

    /// Whether this side detached it.
    pub(super) fn detach_sent(&self) -> bool {
        self.detach_sent
    }

    /// Both sides attached it and this side has not detached it.
    pub(super) fn is_attached(&self) -> bool {
        self.remote_handle.is_some() && !self.detach_sent
    }

    /// Whether this is this side's link `name` waiting for the peer's attach.
    pub(super) fn awaits_answer(&self, name: &str) -> bool {
        self.attach_sent && self.remote_handle.is_none() && self.name == name
    }

    pub(super) fn credit(&self) -> u32 {
        self.credit
    }

    pub(super) fn max_message_size(&self) -> u64 {
        self.max_message_size
    }

    /// The delivery-count up to which the link may run: delivery-count + credit.
    fn limit(&self) -> u32 {
        self.delivery_count.wrapping_add(self.credit)
    }

    /// The peer's attach names it by `remote` (set by the session, with its handle map).
    pub(super) fn map_remote(&mut self, remote: u32) {
        assert!(
            self.remote_handle.is_none(),
            "a link knows at most one remote handle"
        );
        self.remote_handle = Some(remote);
    }

    /// The peer's attach arrived: a receiving link counts deliveries from the sender's
    /// initial delivery-count.
    fn peer_attached(&mut self, initial_delivery_count: Option<u32>) {
        if self.role == LinkRole::Receiver {
            self.delivery_count = initial_delivery_count.unwrap_or(0);
        }
    }

    /// This side detached it: a delivery still arriving is dropped.
    fn detached(&mut self) {
        self.detach_sent = true;
        self.partial = None;
        // Specification 2.6.3: a refusal still answers the attach first.
        self.attach_sent = true;
    }

    /// Moves `deliveries` from credit into delivery-count.
    fn spend(&mut self, deliveries: u32) {
        assert!(self.credit >= deliveries, "credit never goes below zero");
        let limit = self.limit();
        let count = self.delivery_count;
        self.credit -= deliveries;
        self.delivery_count = count.wrapping_add(deliveries);
        assert_eq!(
            serial::distance(count, self.delivery_count),
            deliveries,
            "delivery-count advances by exactly the deliveries"
        );
        assert_eq!(
            self.limit(),
            limit,
            "spending credit keeps the link's limit"
        );
    }

    /// Sender: one delivery is sent (the caller made sure credit is left).
    pub(super) fn consume_credit(&mut self) {
        assert_eq!(self.role, LinkRole::Sender, "only a sender sends");
        self.spend(1);
    }

    /// Sender: the receiver's flow (specification 2.6.7) — credit counted from its
    /// delivery-count, never more than it granted.
    fn peer_granted(&mut self, receiver_count: u32, link_credit: u32, drain: bool) {
        assert_eq!(self.role, LinkRole::Sender, "only a sender takes credit");
        let credit = serial::distance(
            self.delivery_count,
            receiver_count.wrapping_add(link_credit),
        );
        self.credit = credit.min(link_credit);
        self.drain = drain;
    }

    /// Sender: a drain is answered — the credit left is used up, as if sent.
    fn drain_credit(&mut self) {
        assert_eq!(self.role, LinkRole::Sender, "only a sender drains");
        self.spend(self.credit);
        self.drain = false;
    }

    /// Receiver: the peer may send `credit` more deliveries.
    fn grant(&mut self, credit: u32) {
        assert_eq!(
            self.role,
            LinkRole::Receiver,
            "only a receiver grants credit"
        );
        self.credit = credit;
    }

    /// Receiver: a delivery's first transfer arrived (the caller made sure credit is left);
    /// an aborted or a multi-frame delivery counts once, here.
    pub(super) fn accept_delivery(&mut self) {
        assert_eq!(self.role, LinkRole::Receiver, "only a receiver accepts");
        self.spend(1);
    }

    /// Receiver: the delivery whose frames are arriving, taken out.
    pub(super) fn take_partial(&mut self) -> Option<Partial> {
        self.partial.take()
    }

    /// Receiver: more frames of `partial` are to come.
    pub(super) fn keep_partial(&mut self, partial: Partial) {
        assert!(self.partial.is_none(), "one delivery arrives at a time");
        self.partial = Some(partial);
    }

    #[cfg(test)]
    pub(super) fn force_credit_for_test(&mut self, credit: u32) {
        self.credit = credit;
    }
}

/// An attach for a link named `name` in `role` with a source and target address, the settle
/// modes Event Hubs uses (sender: settled or unsettled; receiver: first).
pub fn attach_frame(
    name: impl Into<String>,
    role: Role,
    snd_settle_mode: SenderSettleMode,
) -> Attach {
    Attach {
        name: name.into(),
        handle: 0.into(),
        role,
        snd_settle_mode,
        rcv_settle_mode: ReceiverSettleMode::First,
        source: None,
        target: None,
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: None,
        max_message_size: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

/// The connection's link frames: `attach`, `detach` and the link part of `flow`.
impl Connection {
    pub(super) fn on_attach(&mut self, channel: u16, body: &[u8]) -> Result<(), ConnectionError> {
        let local_channel = self.session_of(channel)?;
        let attach: Attach = decode(body, "attach")?;
        let handle_max = self.config.handle_max;
        let remote = attach.handle.0;
        if remote > handle_max {
            return Err(ConnectionError::new(
                condition::RESOURCE_LIMIT_EXCEEDED,
                format!("handle {remote} is above handle-max"),
            ));
        }
        let session = self.session_mut(local_channel);
        if session.local_handle(remote).is_some() {
            return Err(ConnectionError::new(
                condition::HANDLE_IN_USE,
                format!("handle {remote} is in use"),
            ));
        }
        let peer_role = LinkRole::of(attach.role.clone());
        // An answer to this side's attach: same name, not yet answered.
        let (local, answer) = match session.awaiting_answer(&attach.name) {
            Some(local) => (local, true),
            None => {
                let Some(local) = session.free_handle(handle_max) else {
                    return Err(ConnectionError::new(
                        condition::RESOURCE_LIMIT_EXCEEDED,
                        "no handle is free",
                    ));
                };
                let link = Link::theirs(attach.name.clone(), peer_role.opposite());
                session.install_link(local, link);
                (local, false)
            }
        };
        let link = session.link_mut(local).expect("just found or made");
        if answer && link.role == peer_role {
            return Err(ConnectionError::new(
                condition::NOT_ALLOWED,
                format!("link {} answered with the same role", attach.name),
            ));
        }
        link.peer_attached(attach.initial_delivery_count);
        session.map_remote_handle(remote, local);
        let link = LinkId {
            session: SessionId(local_channel),
            handle: local,
        };
        self.events.push_back(Event::Attached {
            link,
            attach: Box::new(attach),
            answer,
        });
        Ok(())
    }

    pub(super) fn on_detach(&mut self, channel: u16, body: &[u8]) -> Result<(), ConnectionError> {
        let local_channel = self.session_of(channel)?;
        let detach: Detach = decode(body, "detach")?;
        let handle = self.link_of(local_channel, detach.handle.0)?;
        let session = self.session_mut(local_channel);
        let link = session.link(handle).expect("mapped handles have links");
        if link.detach_sent {
            session.free_link(handle);
            return Ok(());
        }
        let id = LinkId {
            session: SessionId(local_channel),
            handle,
        };
        // Answer, then free the handle: both sides are done with it.
        self.detach(id, detach.closed, None);
        self.session_mut(local_channel).free_link(handle);
        self.events.push_back(Event::Detached {
            link: id,
            closed: detach.closed,
            error: detach.error,
        });
        Ok(())
    }

    /// The link part of the peer's `flow` on `link`; returns whether its credit changed.
    pub(super) fn on_link_flow(&mut self, link: LinkId, flow: &FlowFields<'_>) -> bool {
        let state = self
            .session_mut(link.session.0)
            .link_mut(link.handle)
            .expect("mapped handles have links");
        let changed = match state.role {
            LinkRole::Sender => {
                state.peer_granted(
                    flow.delivery_count.unwrap_or(0),
                    flow.link_credit.unwrap_or(0),
                    flow.drain,
                );
                true
            }
            // A sender's flow reports its delivery count and what it has available; this
            // side's credit stands as granted.
            LinkRole::Receiver => false,
        };
        if flow.echo {
            self.write_link_flow(link, false);
        }
        changed
    }

    /// Detaches a link that broke the protocol and tells the application.
    pub(super) fn fail_link(&mut self, link: LinkId, condition: &'static str, description: &str) {
        let error = amqp_error(condition, description);
        self.detach(link, true, Some(error.clone()));
        self.events.push_back(Event::Detached {
            link,
            closed: true,
            error: Some(error),
        });
    }

    /// Attaches a new link on `session` with `attach` (its handle and, for senders, its
    /// initial delivery count are set here). The peer's answer comes as
    /// [`Event::Attached`] with `answer: true`.
    pub fn attach(&mut self, session: SessionId, mut attach: Attach) -> Result<LinkId, SendError> {
        if self.close_sent {
            return Err(SendError::Closed);
        }
        let handle_max = self.config.handle_max;
        let s = self.mapped_session(session)?;
        let handle = s.free_handle(handle_max).ok_or(SendError::Exhausted)?;
        let role = LinkRole::of(attach.role.clone());
        let max_message_size = attach.max_message_size.unwrap_or(0);
        s.install_link(
            handle,
            Link::ours(attach.name.clone(), role, max_message_size),
        );
        attach.handle = handle.into();
        if role == LinkRole::Sender {
            attach.initial_delivery_count = Some(INITIAL_DELIVERY_COUNT);
        }
        self.write_cold(session.0, &attach);
        Ok(LinkId { session, handle })
    }

    /// Answers the peer's attach of `link` with `attach` (its handle, role and initial delivery
    /// count are set here). To refuse, answer with a null terminus and then detach with the
    /// error (specification 2.6.3).
    pub fn attach_answer(&mut self, link: LinkId, mut attach: Attach) -> Result<(), SendError> {
        if self.close_sent {
            return Err(SendError::Closed);
        }
        let state = self.link_mut(link)?;
        if state.attach_sent {
            return Err(SendError::NotAttached);
        }
        state.attach_sent = true;
        attach.handle = link.handle.into();
        match state.role {
            LinkRole::Sender => {
                attach.role = Role::Sender;
                attach.initial_delivery_count = Some(state.delivery_count);
            }
            LinkRole::Receiver => {
                attach.role = Role::Receiver;
                attach.initial_delivery_count = None;
                state.max_message_size = attach.max_message_size.unwrap_or(0);
            }
        }
        self.write_cold(link.session.0, &attach);
        Ok(())
    }

    /// A sending link's credit (0 for anything else).
    pub fn credit(&self, link: LinkId) -> u32 {
        self.peek_link(link)
            .filter(|l| l.role == LinkRole::Sender && l.is_attached())
            .map_or(0, |l| l.credit)
    }

    /// Whether the peer asked a sending link to use up or give back its credit; answer with
    /// [`Self::drained`] once nothing is left to send.
    pub fn drain_requested(&self, link: LinkId) -> bool {
        self.peek_link(link)
            .is_some_and(|l| l.drain && l.credit > 0)
    }

    /// Sets a receiving link's credit to `credit` (absolute) and tells the peer.
    pub fn flow(&mut self, link: LinkId, credit: u32) -> Result<(), SendError> {
        if self.close_sent {
            return Err(SendError::Closed);
        }
        let state = self.link_mut(link)?;
        if state.role != LinkRole::Receiver {
            return Err(SendError::WrongRole);
        }
        state.grant(credit);
        self.write_link_flow(link, false);
        Ok(())
    }

    /// A receiving link's outstanding credit.
    pub fn granted(&self, link: LinkId) -> u32 {
        self.peek_link(link)
            .filter(|l| l.role == LinkRole::Receiver)
            .map_or(0, |l| l.credit)
    }

    /// Answers a drain request: the sending link's remaining credit is used up.
    pub fn drained(&mut self, link: LinkId) -> Result<(), SendError> {
        if self.close_sent {
            return Err(SendError::Closed);
        }
        let state = self.link_mut(link)?;
        if state.role != LinkRole::Sender {
            return Err(SendError::WrongRole);
        }
        state.drain_credit();
        self.write_link_flow(link, true);
        Ok(())
    }

    /// Detaches a link (`closed`: for good) with an optional error. A link the peer detached
    /// first is answered by the engine; this is for links this side ends.
    pub fn detach(&mut self, link: LinkId, closed: bool, error: Option<definitions::Error>) {
        if self.close_sent {
            return;
        }
        let Ok(state) = self.link_mut(link) else {
            return;
        };
        state.detached();
        let detach = Detach {
            handle: link.handle.into(),
            closed,
            error,
        };
        self.write_cold(link.session.0, &detach);
    }

    /// Writes a link `flow` with its flow state (nothing before the peer's `begin` or after
    /// this side's `close`).
    fn write_link_flow(&mut self, link: LinkId, drain: bool) {
        let session = self.sessions.get(link.session.0).expect("checked");
        let (true, Some(state)) = (session.is_mapped(), session.link(link.handle)) else {
            return;
        };
        if self.close_sent {
            return;
        }
        let fields = FlowFields {
            handle: Some(link.handle),
            delivery_count: Some(state.delivery_count),
            link_credit: Some(state.credit),
            available: None,
            drain,
            echo: false,
            properties: None,
            ..session.flow_fields()
        };
        self.write_flow(link.session.0, &fields);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sender(credit: u32) -> Link {
        let mut link = Link::ours("s".into(), LinkRole::Sender, 0);
        link.peer_granted(0, credit, false);
        link
    }

    #[test]
    fn sending_moves_credit_into_the_delivery_count() {
        let mut link = sender(3);
        link.consume_credit();
        link.consume_credit();
        assert_eq!((link.credit, link.delivery_count), (1, 2));
        // The receiver saw one of them and grants 5 more from there.
        link.peer_granted(1, 5, false);
        assert_eq!(link.credit, 4, "one is still in flight");
        link.drain_credit();
        assert_eq!((link.credit, link.delivery_count), (0, 6));
    }

    #[test]
    fn credit_is_counted_across_the_wrap() {
        let mut link = Link::ours("s".into(), LinkRole::Sender, 0);
        link.delivery_count = u32::MAX;
        link.peer_granted(u32::MAX, 2, false);
        link.consume_credit();
        link.consume_credit();
        assert_eq!((link.credit, link.delivery_count), (0, 1));
        link.peer_granted(0, 3, false);
        assert_eq!(link.credit, 2);
    }

    #[test]
    fn a_receiver_spends_what_it_granted() {
        let mut link = Link::theirs("r".into(), LinkRole::Receiver);
        link.grant(2);
        link.accept_delivery();
        assert_eq!((link.credit, link.delivery_count), (1, 1));
    }

    #[test]
    #[should_panic(expected = "credit never goes below zero")]
    fn sending_without_credit_is_our_bug() {
        sender(0).consume_credit();
    }

    #[test]
    #[should_panic(expected = "a link knows at most one remote handle")]
    fn a_link_is_mapped_once() {
        let mut link = sender(0);
        link.map_remote(1);
        link.map_remote(2);
    }
}
