//! The AMQP 1.0 connections, on Tributary's own engine (`tributary-amqp-engine`).
//!
//! A TCP connection runs the SASL layer (or goes straight to AMQP), then one task — the
//! engine's driver — owns the socket and the connection's protocol state and calls the
//! [`ServerHandler`] here for every event. The handler attaches each link to what it names:
//! `$cbs` and `$management` request/response nodes ([`nodes`]), send links into the broker
//! ([`send_link`]) and receive links out of it ([`receive_link`]). Work that waits — appends,
//! reads of the log, timers — runs in one task per link, which hands its results back as
//! [`Command`]s; the handler itself never waits. Everything the Event Hubs dialect decides —
//! addresses, selectors, tokens, conditions, messages in and out — is `tributary-eventhubs`'s.
//!
//! # Refusals
//! A refused attach is answered as Event Hubs answers one (AMQP 1.0 section 2.6.3): with a
//! null terminus on this side — no target for a client's sender, no source for its receiver —
//! and at once a closing detach carrying the error. The SDKs raise that error while they are
//! still opening the link; a refused link never gets credit, so nothing on it is ever appended
//! or delivered.
//!
//! # Unauthenticated connections
//! A connection is unauthenticated until a SASL PLAIN login or its first accepted `$cbs` token
//! (see [`crate::limits::ConnectionLimits`]). Until then it must finish its handshake and send
//! `open` within the handshake timeout and authenticate within the authentication timeout (both
//! counted from its accept), may send at most [`crate::limits::UNAUTHENTICATED_BYTES_MAX`]
//! bytes, and may begin and attach only a few sessions and links. Past a limit it is closed with
//! `amqp:unauthorized-access` (the deadlines) or `amqp:resource-limit-exceeded` (sessions and
//! links) once a `close` can be sent (the peer's protocol header has arrived, so this side's
//! `open` is out), else cut off without a frame. Authenticated connections keep only the
//! idle timeout.

mod nodes;
mod receive_link;
mod sasl;
mod send_link;
mod store_node;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp_types::definitions::{self, Role};
use fe2o3_amqp_types::messaging::TargetArchetype;
use fe2o3_amqp_types::performatives::Attach;
use fe2o3_amqp_types::primitives::Symbol;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tributary_amqp_engine::connection::{Delivery, amqp_error as engine_error, attach_frame};
use tributary_amqp_engine::driver::{self, Ending, Handler};
use tributary_amqp_engine::{Config, Connection, Event, LinkId, LinkMap, SessionId};
use tributary_broker::Broker;

use crate::auth::ConnectionGrants;
use crate::budget::Budgeted;
use crate::conditions::{self, Refusal};
use crate::limits::{
    CHANNEL_MAX, ConnectionLimits, FRAME_BYTES_MAX, HANDLE_MAX, SEND_LINK_CREDIT,
    UNAUTHENTICATED_LINKS_MAX, UNAUTHENTICATED_SESSIONS_MAX,
};
use crate::policies::AccessPolicies;
use tributary_eventhubs::address::{self, Node};

/// What every connection shares.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) broker: Broker,
    pub(crate) policies: AccessPolicies,
    pub(crate) idle_timeout: Duration,
    pub(crate) limits: ConnectionLimits,
    pub(crate) shutdown: watch::Receiver<bool>,
}

/// One connection's state, shared with its link tasks.
#[derive(Debug)]
pub(crate) struct ConnectionState {
    pub(crate) ctx: Arc<Context>,
    pub(crate) grants: ConnectionGrants,
    pub(crate) peer: SocketAddr,
}

/// Unix seconds now.
pub(crate) fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

pub(crate) fn amqp_error(refusal: &Refusal) -> definitions::Error {
    engine_error(refusal.condition, &refusal.description)
}

/// Waits until the shutdown flag is raised (or its sender is gone).
pub(crate) async fn shutting_down(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|down| *down).await;
}

/// A link is known to the handler by its id and a serial, so a command from the task of a
/// link that is gone never reaches a newer link that reuses its handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinkRef {
    pub(crate) id: LinkId,
    pub(crate) serial: u64,
}

/// What link tasks ask of the connection.
#[derive(Debug)]
pub(crate) enum Command {
    /// Encoded messages for a receive link, in order.
    Deliver {
        link: LinkRef,
        encoded: receive_link::Encoded,
    },
    /// A send link's task finished `finished` deliveries: settle those of `delivery_ids` (the
    /// ones the client did not settle itself) with this outcome.
    Settle {
        link: LinkRef,
        delivery_ids: Vec<u32>,
        finished: u32,
        outcome: Result<(), Refusal>,
    },
    /// Detach a link with this error.
    Detach { link: LinkRef, refusal: Refusal },
    /// A `$management` answer that took work off the connection's task is ready.
    Reply {
        session: SessionId,
        kind: nodes::NodeKind,
        reply_to: Option<String>,
        response: Box<tributary_eventhubs::message::AmqpMessage>,
    },
    /// The handshake timeout is over: an unauthenticated connection without `open` ends.
    OpenDue,
    /// The authentication timeout is over: an unauthenticated connection ends.
    AuthDue,
}

/// Serves one connection (TCP, or TLS over TCP) until it closes or the server shuts down.
/// Its deadlines count from `accepted`.
pub(crate) async fn serve_connection<S>(
    stream: S,
    peer: SocketAddr,
    accepted: Instant,
    ctx: Arc<Context>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let grants = ConnectionGrants::default();
    let mut stream = Budgeted::new(stream, grants.authenticated_flag());
    let mut buffered = Vec::new();
    let handshake = sasl::accept(&mut stream, &mut buffered, &ctx.policies, &grants);
    let handshake_due = accepted + ctx.limits.handshake_timeout;
    match tokio::time::timeout_at(handshake_due, handshake).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "AMQP handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "AMQP handshake timed out");
            return;
        }
    }
    let (commands_tx, mut commands) = mpsc::unbounded_channel();
    let (abort, aborted) = oneshot::channel();
    // Only an unauthenticated connection is timed; the timer ends with the connection.
    let _deadlines = (!grants.is_authenticated())
        .then(|| Deadlines::start(accepted, ctx.limits, commands_tx.clone()));
    let state = Arc::new(ConnectionState {
        ctx: ctx.clone(),
        grants,
        peer,
    });
    let mut handler = ServerHandler {
        state,
        commands: commands_tx,
        links: LinkMap::default(),
        next_serial: 0,
        shutting_down: false,
        unauthenticated: Unauthenticated {
            sessions: 0,
            links: 0,
            abort: Some(abort),
        },
    };
    let mut shutdown = ctx.shutdown.clone();
    let shutdown = async move { shutting_down(&mut shutdown).await };
    tracing::debug!(%peer, "AMQP connection open");
    let run = driver::run(
        stream,
        buffered,
        server_connection(&ctx),
        &mut handler,
        &mut commands,
        shutdown,
    );
    tokio::select! {
        (_, ending) = run => match ending {
            Ending::Closed => tracing::debug!(%peer, "AMQP connection closed"),
            other => tracing::debug!(%peer, ending = ?other, "AMQP connection ended"),
        },
        _ = aborted => tracing::debug!(%peer, "an unauthenticated AMQP connection was cut off"),
    }
}

/// The server's side of a new connection, with the door's limits.
fn server_connection(ctx: &Context) -> Connection {
    let mut config = Config::new("tributary");
    config.max_frame_size = FRAME_BYTES_MAX;
    config.channel_max = CHANNEL_MAX;
    config.handle_max = HANDLE_MAX;
    config.idle_timeout_ms = Some(u32::try_from(ctx.idle_timeout.as_millis()).unwrap_or(u32::MAX));
    Connection::server(config)
}

/// The timer of an unauthenticated connection's deadlines: sends [`Command::OpenDue`], then
/// [`Command::AuthDue`]. Stopped when dropped.
struct Deadlines(tokio::task::JoinHandle<()>);

impl Deadlines {
    fn start(
        accepted: Instant,
        limits: ConnectionLimits,
        commands: mpsc::UnboundedSender<Command>,
    ) -> Self {
        Deadlines(tokio::spawn(async move {
            tokio::time::sleep_until(accepted + limits.handshake_timeout).await;
            if commands.send(Command::OpenDue).is_err() {
                return;
            }
            tokio::time::sleep_until(accepted + limits.auth_timeout).await;
            let _ = commands.send(Command::AuthDue);
        }))
    }
}

impl Drop for Deadlines {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What an unauthenticated connection has used of its allowance, and how to cut it off.
#[derive(Debug)]
struct Unauthenticated {
    sessions: usize,
    links: usize,
    /// Ends the connection without a frame (before the peer's protocol header arrived).
    abort: Option<oneshot::Sender<()>>,
}

/// What the handler keeps per link.
#[derive(Debug)]
struct LinkEntry {
    serial: u64,
    kind: LinkKind,
}

#[derive(Debug)]
enum LinkKind {
    /// The client's requests to `$cbs` or `$management`.
    Requests(nodes::NodeKind),
    /// Responses of `$cbs` or `$management` to the client.
    Replies(nodes::ReplyLink),
    /// Messages into the broker.
    Send(send_link::SendLinkHandle),
    /// Events out of the broker.
    Receive(receive_link::ReceiveLinkHandle),
}

/// The Event Hubs dialect over one connection's engine (see the module docs).
pub(crate) struct ServerHandler {
    state: Arc<ConnectionState>,
    commands: mpsc::UnboundedSender<Command>,
    links: LinkMap<LinkEntry>,
    next_serial: u64,
    /// The server is shutting down: send links drain, then the connection closes.
    shutting_down: bool,
    /// What the connection holds before it authenticates.
    unauthenticated: Unauthenticated,
}

impl std::fmt::Debug for ServerHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerHandler")
            .field("peer", &self.state.peer)
            .field("links", &self.links.len())
            .finish()
    }
}

impl Handler for ServerHandler {
    type Command = Command;

    fn on_event(&mut self, connection: &mut Connection, event: Event) {
        match event {
            Event::Attached {
                link,
                attach,
                answer: false,
            } => {
                if self.allow_unauthenticated(connection, false) {
                    self.on_attach(connection, link, *attach);
                }
            }
            Event::SessionBegun(_) => {
                self.allow_unauthenticated(connection, true);
            }
            Event::Delivery(delivery) => self.on_delivery(connection, delivery),
            Event::Credit(link) => self.on_credit(connection, link),
            Event::Detached { link, .. } => {
                self.links.remove(&link);
            }
            Event::SessionEnded { session, .. } => {
                self.links.retain(|id, _| id.session != session);
            }
            Event::Closed { .. } => self.links.clear(),
            // Dispositions: receive links deliver settled, responses are not waited on.
            Event::Opened(_) | Event::Attached { answer: true, .. } | Event::Disposition { .. } => {
            }
        }
    }

    fn on_command(&mut self, connection: &mut Connection, command: Command) {
        match command {
            Command::Deliver { link, encoded } => {
                if let Some(LinkKind::Receive(receive)) = self.kind_mut(link) {
                    receive.queue(encoded);
                    receive.flush(connection, link.id);
                }
            }
            Command::Settle {
                link,
                delivery_ids,
                finished,
                outcome,
            } => {
                if let Some(LinkKind::Send(send)) = self.kind_mut(link) {
                    send.settle(connection, link.id, &delivery_ids, finished, outcome);
                }
            }
            Command::Detach { link, refusal } => {
                if self.kind_mut(link).is_some() {
                    tracing::debug!(condition = refusal.condition, description = %refusal.description, "detaching link");
                    self.links.remove(&link.id);
                    connection.detach(link.id, true, Some(amqp_error(&refusal)));
                }
            }
            Command::OpenDue => self.on_deadline(connection, true),
            Command::AuthDue => self.on_deadline(connection, false),
            Command::Reply {
                session,
                kind,
                reply_to,
                response,
            } => self.send_reply(connection, session, kind, reply_to.as_deref(), *response),
        }
    }

    /// Send links drain first — they stop taking messages, and their tasks finish, settle and
    /// then detach what they had issued — so an append that reached the log is acknowledged;
    /// receive links are detached at once. The connection closes when no send link is left
    /// (and the listener cuts off connections that take too long).
    fn on_shutdown(&mut self, connection: &mut Connection) {
        self.shutting_down = true;
        let refusal = Refusal::new(conditions::DETACH_FORCED, "the broker is shutting down");
        self.links.retain(|id, entry| match &mut entry.kind {
            LinkKind::Send(send) => {
                send.drain();
                true
            }
            // The client's `$cbs` and `$management` links stay until the close: a client may
            // take their loss for its connection's and give up on its sends still settling.
            LinkKind::Requests(_) | LinkKind::Replies(_) => true,
            LinkKind::Receive(_) => {
                connection.detach(*id, true, Some(amqp_error(&refusal)));
                false
            }
        });
        self.close_once_drained(connection);
    }

    fn on_turn_end(&mut self, connection: &mut Connection) {
        // Links also end by the client's detach, a session's end or the connection's close.
        self.close_once_drained(connection);
    }
}

impl ServerHandler {
    /// Counts a session (`session`) or a link an unauthenticated connection opens; returns
    /// whether it may (beyond its allowance the connection is closed).
    fn allow_unauthenticated(&mut self, connection: &mut Connection, session: bool) -> bool {
        if connection.is_closed() {
            return false;
        }
        if self.state.grants.is_authenticated() {
            return true;
        }
        let allowance = &mut self.unauthenticated;
        let (used, max, what) = if session {
            (
                &mut allowance.sessions,
                UNAUTHENTICATED_SESSIONS_MAX,
                "sessions",
            )
        } else {
            (&mut allowance.links, UNAUTHENTICATED_LINKS_MAX, "links")
        };
        *used += 1;
        if *used <= max {
            return true;
        }
        let description = format!(
            "an unauthenticated connection may open at most {max} {what}; put a token on $cbs first"
        );
        self.end_unauthenticated(connection, conditions::RESOURCE_LIMIT, &description);
        false
    }

    /// The handshake (`open_due`) or authentication timeout is over: ends the connection
    /// unless it has authenticated (or, for the handshake, sent `open`).
    fn on_deadline(&mut self, connection: &mut Connection, open_due: bool) {
        let limits = self.state.ctx.limits;
        if self.state.grants.is_authenticated() || (open_due && connection.open_received()) {
            return;
        }
        let description = if open_due {
            format!(
                "the connection did not open within {} s of connecting",
                limits.handshake_timeout.as_secs_f64()
            )
        } else {
            format!(
                "the connection did not authenticate within {} s of connecting: put a valid token on $cbs first",
                limits.auth_timeout.as_secs_f64()
            )
        };
        self.end_unauthenticated(connection, conditions::UNAUTHORIZED, &description);
    }

    /// Closes an unauthenticated connection with an error, or cuts it off when no `close` may
    /// be sent yet (see the module docs).
    fn end_unauthenticated(
        &mut self,
        connection: &mut Connection,
        condition: &str,
        description: &str,
    ) {
        tracing::debug!(peer = %self.state.peer, condition, description, "ending an unauthenticated connection");
        if connection.header_received() {
            connection.close(Some(engine_error(condition, description)));
        } else if let Some(abort) = self.unauthenticated.abort.take() {
            let _ = abort.send(());
        }
    }

    /// While shutting down: closes the connection once no send link is left draining.
    fn close_once_drained(&mut self, connection: &mut Connection) {
        // Checked at every turn's end: the flag first, so a running connection pays nothing.
        if !self.shutting_down || connection.is_closed() {
            return;
        }
        let draining = self
            .links
            .values()
            .any(|entry| matches!(entry.kind, LinkKind::Send(_)));
        if !draining {
            connection.close(Some(engine_error(
                conditions::CONNECTION_FORCED,
                "the broker is shutting down",
            )));
        }
    }

    fn kind_mut(&mut self, link: LinkRef) -> Option<&mut LinkKind> {
        self.links
            .get_mut(&link.id)
            .filter(|entry| entry.serial == link.serial)
            .map(|entry| &mut entry.kind)
    }

    fn register(&mut self, id: LinkId, kind: LinkKind) -> LinkRef {
        self.next_serial += 1;
        let serial = self.next_serial;
        self.links.insert(id, LinkEntry { serial, kind });
        LinkRef { id, serial }
    }

    fn next_ref(&self, id: LinkId) -> LinkRef {
        LinkRef {
            id,
            serial: self.next_serial + 1,
        }
    }

    fn on_attach(&mut self, connection: &mut Connection, link: LinkId, attach: Attach) {
        if self.shutting_down {
            // A client re-attaching after its link drained: nothing new while shutting down.
            let refusal = Refusal::new(conditions::DETACH_FORCED, "the broker is shutting down");
            return self.refuse(connection, link, &attach, refusal);
        }
        let node = match attached_node(&attach) {
            Ok(node) => node,
            Err(refusal) => return self.refuse(connection, link, &attach, refusal),
        };
        let client_sends = matches!(attach.role, Role::Sender);
        let outcome = match node {
            Node::Cbs => self.attach_node(connection, link, &attach, nodes::NodeKind::Cbs),
            Node::Management => {
                self.attach_node(connection, link, &attach, nodes::NodeKind::Management)
            }
            Node::Hub { .. } | Node::HubPartition { .. } if client_sends => {
                self.attach_send(connection, link, &attach, &node)
            }
            Node::ConsumerPartition {
                hub,
                group,
                partition,
            } if !client_sends => {
                let names = receive_link::Names {
                    hub,
                    group,
                    partition,
                };
                self.attach_receive(connection, link, &attach, names)
            }
            _ if client_sends => Err(Refusal::new(
                conditions::NOT_ALLOWED,
                "send to <hub> or <hub>/Partitions/<id>",
            )),
            _ => Err(Refusal::new(
                conditions::NOT_ALLOWED,
                "receive from <hub>/ConsumerGroups/<group>/Partitions/<id>",
            )),
        };
        if let Err(refusal) = outcome {
            self.refuse(connection, link, &attach, refusal);
        }
    }

    /// A link to `$cbs` or `$management`: requests when the client sends, replies otherwise.
    fn attach_node(
        &mut self,
        connection: &mut Connection,
        link: LinkId,
        attach: &Attach,
        kind: nodes::NodeKind,
    ) -> Result<(), Refusal> {
        let client_sends = matches!(attach.role, Role::Sender);
        let entry = if client_sends {
            LinkKind::Requests(kind)
        } else {
            LinkKind::Replies(nodes::ReplyLink::new(kind, attach))
        };
        if connection.attach_answer(link, answer_for(attach)).is_ok() {
            self.register(link, entry);
            if client_sends {
                let _ = connection.flow(link, SEND_LINK_CREDIT);
            }
        }
        Ok(())
    }

    /// A client's send link to a hub or one of its partitions.
    fn attach_send(
        &mut self,
        connection: &mut Connection,
        link: LinkId,
        attach: &Attach,
        node: &Node,
    ) -> Result<(), Refusal> {
        let link_ref = self.next_ref(link);
        let handle = send_link::attach(node, link_ref, &self.state, &self.commands)?;
        let mut answer = answer_for(attach);
        answer.max_message_size = Some(crate::limits::MESSAGE_BYTES_MAX);
        if connection.attach_answer(link, answer).is_ok() {
            self.register(link, LinkKind::Send(handle));
            let _ = connection.flow(link, SEND_LINK_CREDIT);
        }
        Ok(())
    }

    /// A client's receive link from a consumer group's partition.
    fn attach_receive(
        &mut self,
        connection: &mut Connection,
        link: LinkId,
        attach: &Attach,
        names: receive_link::Names,
    ) -> Result<(), Refusal> {
        let link_ref = self.next_ref(link);
        let (handle, runtime_metric) =
            receive_link::attach(names, attach, link_ref, &self.state, &self.commands)?;
        let mut answer = answer_for(attach);
        answer.snd_settle_mode = definitions::SenderSettleMode::Settled;
        if runtime_metric {
            answer.offered_capabilities = Some(
                vec![Symbol::from(
                    tributary_eventhubs::names::link::RUNTIME_METRIC_CAPABILITY,
                )]
                .into(),
            );
        }
        if connection.attach_answer(link, answer).is_ok() {
            self.register(link, LinkKind::Receive(handle));
        }
        Ok(())
    }

    /// Refuses an attach: answers it with a null terminus on this side and detaches it with the
    /// refusal in the same turn (see the module docs).
    fn refuse(
        &mut self,
        connection: &mut Connection,
        link: LinkId,
        attach: &Attach,
        refusal: Refusal,
    ) {
        tracing::debug!(link = %attach.name, condition = refusal.condition, description = %refusal.description, "refusing link");
        refuse_link(connection, link, attach, amqp_error(&refusal));
    }

    fn on_delivery(&mut self, connection: &mut Connection, delivery: Delivery) {
        let link = delivery.link;
        let Some(entry) = self.links.get_mut(&link) else {
            return;
        };
        match &mut entry.kind {
            LinkKind::Requests(kind) => {
                let kind = *kind;
                let session = link.session;
                let (reply_to, response) = nodes::answer(kind, &delivery.payload, &self.state);
                settle_request(connection, session, &delivery, response.is_ok());
                let Ok(response) = response else { return };
                match response {
                    Ok(ready) => {
                        self.send_reply(connection, session, kind, reply_to.as_deref(), ready);
                    }
                    Err(pending) => {
                        let commands = self.commands.clone();
                        tokio::spawn(async move {
                            let response = Box::new(pending.await);
                            let _ = commands.send(Command::Reply {
                                session,
                                kind,
                                reply_to,
                                response,
                            });
                        });
                    }
                }
                let _ = connection.flow(link, SEND_LINK_CREDIT);
            }
            LinkKind::Send(send) => send.deliver(connection, delivery),
            LinkKind::Replies(_) | LinkKind::Receive(_) => {}
        }
    }

    /// Sends a node's response on its response link, if the session still has one.
    fn send_reply(
        &mut self,
        connection: &mut Connection,
        session: SessionId,
        kind: nodes::NodeKind,
        reply_to: Option<&str>,
        response: tributary_eventhubs::message::AmqpMessage,
    ) {
        match self.reply_link(session, kind, reply_to) {
            Some((id, reply)) => reply.send(connection, id, response),
            None => tracing::debug!(?kind, "no response link for a request; response dropped"),
        }
    }

    /// The response link of `kind` on `session`: the one whose name or target address is the
    /// request's `reply-to` (JavaScript), else the newest (Python sends no `reply-to`).
    fn reply_link(
        &mut self,
        session: SessionId,
        kind: nodes::NodeKind,
        reply_to: Option<&str>,
    ) -> Option<(LinkId, &mut nodes::ReplyLink)> {
        let candidates = self
            .links
            .iter()
            .filter_map(|(id, entry)| match &entry.kind {
                LinkKind::Replies(r) if id.session == session && r.kind == kind => {
                    Some((*id, entry.serial, r.answers(reply_to)))
                }
                _ => None,
            });
        let (id, _, _) = candidates.max_by_key(|(_, serial, named)| (*named, *serial))?;
        match &mut self.links.get_mut(&id)?.kind {
            LinkKind::Replies(reply) => Some((id, reply)),
            _ => None,
        }
    }

    fn on_credit(&mut self, connection: &mut Connection, link: LinkId) {
        let Some(entry) = self.links.get_mut(&link) else {
            return;
        };
        match &mut entry.kind {
            LinkKind::Receive(receive) => receive.flush(connection, link),
            LinkKind::Replies(reply) => reply.flush(connection, link),
            _ => {}
        }
    }
}

/// Settles a request to a node: accepted, or rejected when it could not be read.
fn settle_request(connection: &mut Connection, session: SessionId, delivery: &Delivery, ok: bool) {
    if delivery.settled {
        return;
    }
    let state = if ok {
        tributary_amqp_codec::performative::ACCEPTED.to_vec()
    } else {
        nodes::rejected(&Refusal::new(
            conditions::DECODE_ERROR,
            "the request is not a valid AMQP message",
        ))
    };
    let _ = connection.disposition(
        session,
        true,
        delivery.delivery_id,
        delivery.delivery_id,
        true,
        Some(&state),
    );
}

/// Refuses an attach the way Event Hubs does (see the module docs): answers it with a null
/// terminus on this side and detaches it at once with `error`.
fn refuse_link(
    connection: &mut Connection,
    link: LinkId,
    attach: &Attach,
    error: definitions::Error,
) {
    let mut answer = answer_for(attach);
    match attach.role {
        Role::Sender => answer.target = None,
        Role::Receiver => answer.source = None,
    }
    if connection.attach_answer(link, answer).is_ok() {
        connection.detach(link, true, Some(error));
    }
}

/// The answer to a peer's attach: its terminus echoed, settled in mode `first` (Python asks
/// for `second` yet waits for a settled disposition, as the service does).
fn answer_for(attach: &Attach) -> Attach {
    let mut answer = attach_frame(
        attach.name.clone(),
        attach.role.clone(),
        attach.snd_settle_mode.clone(),
    );
    answer.source = attach.source.clone();
    answer.target = attach.target.clone();
    answer
}

/// The address of the node a link attaches to: the target when the client sends, the source
/// when it receives.
fn link_address(attach: &Attach) -> Option<String> {
    match attach.role {
        Role::Sender => match attach.target.as_deref() {
            Some(TargetArchetype::Target(t)) => t.address.clone(),
            _ => None,
        },
        Role::Receiver => attach.source.as_ref().and_then(|s| s.address.clone()),
    }
}

/// The node an attach names, or why it names none.
fn attached_node(attach: &Attach) -> Result<Node, Refusal> {
    let address = link_address(attach)
        .ok_or_else(|| Refusal::new(conditions::NOT_FOUND, "the link names no address"))?;
    address::parse(&address).map_err(|e| Refusal::new(conditions::NOT_FOUND, e.to_string()))
}

/// Answers a connection that got no slot: its handshake, this side's `open`, then
/// `amqp:resource-limit-exceeded` with `description` on the peer's first link and on a `close`
/// (or on the `close` alone when the peer attaches nothing within
/// [`crate::limits::REFUSAL_LINK_WAIT`]); held at most [`crate::limits::REFUSAL_TIMEOUT`] in
/// all, reading at most what an unauthenticated connection may.
pub(crate) async fn refuse_connection<S>(
    stream: S,
    peer: SocketAddr,
    ctx: &Context,
    description: String,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let grants = ConnectionGrants::default();
    // Never raised: a refused connection reads no more than an unauthenticated one.
    let mut stream = Budgeted::new(stream, Arc::default());
    let refusal = async {
        let mut buffered = Vec::new();
        sasl::accept(&mut stream, &mut buffered, &ctx.policies, &grants)
            .await
            .ok()?;
        let mut handler = Refuser {
            error: engine_error(conditions::RESOURCE_LIMIT, &description),
            opened: false,
            waited: false,
        };
        let (waited, mut commands) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            tokio::time::sleep(crate::limits::REFUSAL_LINK_WAIT).await;
            let _ = waited.send(());
        });
        let connection = server_connection(ctx);
        let never = std::future::pending::<()>();
        Some(
            driver::run(
                stream,
                buffered,
                connection,
                &mut handler,
                &mut commands,
                never,
            )
            .await,
        )
    };
    let ended = tokio::time::timeout(crate::limits::REFUSAL_TIMEOUT, refusal).await;
    tracing::debug!(%peer, answered = matches!(ended, Ok(Some(_))), "AMQP connection refused: over a connection cap");
}

/// Refuses the peer's first link with `amqp:resource-limit-exceeded`, then closes the
/// connection with the same error.
///
/// Refusing the link rather than closing at `open` is what lets the JavaScript SDK raise at
/// once: it (rhea-promise) takes an `open` followed by a `close` as an open connection and then
/// waits its whole operation timeout (60 s) for a session that never begins, retrying after,
/// while a refused attach reaches it as the condition, which it does not retry. The Python SDK
/// sees the `close` either way and raises after its producer's retries.
struct Refuser {
    error: definitions::Error,
    /// The peer's `open` arrived (a `close` may be sent only after it).
    opened: bool,
    /// [`crate::limits::REFUSAL_LINK_WAIT`] is over.
    waited: bool,
}

impl Handler for Refuser {
    type Command = ();

    fn on_event(&mut self, connection: &mut Connection, event: Event) {
        match event {
            Event::Opened(_) => {
                self.opened = true;
                if self.waited {
                    connection.close(Some(self.error.clone()));
                }
            }
            Event::Attached {
                link,
                attach,
                answer: false,
            } => {
                refuse_link(connection, link, &attach, self.error.clone());
                connection.close(Some(self.error.clone()));
            }
            _ => {}
        }
    }

    fn on_command(&mut self, connection: &mut Connection, (): ()) {
        self.waited = true;
        if self.opened {
            connection.close(Some(self.error.clone()));
        }
    }
}
