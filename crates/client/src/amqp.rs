//! The client's AMQP connections, on Tributary's own engine (`tributary-amqp-engine`).
//!
//! [`AmqpConnection::open`] connects (TCP, TLS when asked), runs the SASL exchange and spawns
//! one task that owns the socket and the engine's [`Connection`] through the engine's driver.
//! Everything else talks to that task with [`Command`]s: beginning and ending sessions,
//! attaching links, sending messages, granting credit, detaching, closing. The task answers
//! through one-shot channels, and hands each receiver link its messages in batches — one batch
//! per read of the socket, so a burst of deliveries costs its receiver one wake-up.
//!
//! # Guarantees
//! - **Order.** Messages sent on one [`SenderLink`] leave in the order of the `send` calls;
//!   a send that finds no credit waits in the task, in order, never in the caller.
//! - **Exact credit.** A [`ReceiverLink`] has exactly the credit it granted: the hub can never
//!   have more deliveries in flight than that, and the messages waiting in the link plus its
//!   credit never exceed what the link's owner granted in total minus what it took.
//! - **Acceptance.** Deliveries the hub sent unsettled (Azure Event Hubs does) are accepted
//!   and settled as they arrive, one ranged disposition per read; a Tributary hub sends them
//!   settled.
//! - **Every waiter hears back.** When a link, its session or the connection ends, whatever
//!   waits on it — an attach, a send's settlement, a receiver — gets the reason as a
//!   [`ClientError`]: the hub's error mapped by its condition, or
//!   [`ClientError::ConnectionLost`].
//! - **Links end with their handles.** Dropping a [`SenderLink`] or [`ReceiverLink`] detaches
//!   it (and ends a receiver's own session); nothing stays attached behind a caller's back.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use fe2o3_amqp_types::definitions::{self, Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{DeliveryState, Outcome};
use fe2o3_amqp_types::performatives::Attach;
use fe2o3_amqp_types::primitives::{Symbol, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tributary_amqp_engine::connection::{SendError, amqp_error, attach_frame};
use tributary_amqp_engine::driver::{self, Ending, Handler};
use tributary_amqp_engine::sasl::{self, SaslError};
use tributary_amqp_engine::types::sasl::SaslCode;
use tributary_amqp_engine::{Config, Connection, Event, LinkId, LinkMap, SessionId};

use crate::error::ClientError;
use crate::limits::{DELIVERY_BYTES_MAX, FRAME_BYTES_MAX, IDLE_TIMEOUT, SESSIONS_MAX};

/// The `accepted` outcome, encoded (described list code 0x24, an empty list).
const ACCEPTED: [u8; 4] = [0x00, 0x53, 0x24, 0x45];

fn lost(description: impl Into<String>) -> ClientError {
    ClientError::ConnectionLost {
        description: description.into(),
    }
}

/// How to reach a hub: where, and under which name for TLS and `open`.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint<'a> {
    pub(crate) host: &'a str,
    pub(crate) port: u16,
    /// Addresses to connect to instead of resolving `host` (an alias's DNS answered them);
    /// `host` still names the peer for TLS and the AMQP `open`.
    pub(crate) addresses: &'a [std::net::IpAddr],
    pub(crate) tls: bool,
    /// Certificate authorities trusted besides the Mozilla roots (a PEM file).
    pub(crate) trusted_certificates: Option<&'a std::path::Path>,
    pub(crate) container_id: String,
    pub(crate) properties: Option<definitions::Fields>,
}

impl Endpoint<'_> {
    fn name(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// What a link's task is told; see the module docs.
#[derive(Debug)]
enum Command {
    Begin {
        reply: oneshot::Sender<Result<SessionId, ClientError>>,
    },
    End {
        session: SessionId,
    },
    Attach {
        session: SessionId,
        attach: Box<Attach>,
        address: String,
        receiver: Option<ReceiverSetup>,
        reply: oneshot::Sender<Result<Attached, ClientError>>,
    },
    Send {
        link: LinkRef,
        payload: Vec<u8>,
        format: u32,
        reply: oneshot::Sender<Result<Outcome, ClientError>>,
    },
    Credit {
        link: LinkRef,
        add: u32,
    },
    Detach {
        link: LinkRef,
    },
    Close,
}

/// A receiver link's first credit and where its messages go.
#[derive(Debug)]
struct ReceiverSetup {
    credit: u32,
    events: mpsc::UnboundedSender<ReceiverEvent>,
}

/// A link as its handles know it: the engine's id and a serial, so a command for a link that
/// is gone never reaches a newer one that reuses the handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LinkRef {
    id: LinkId,
    serial: u64,
}

/// An attached link and the hub's answer.
#[derive(Debug)]
struct Attached {
    link: LinkRef,
    answer: Box<Attach>,
}

/// What a receiver link hears.
#[derive(Debug)]
pub(crate) enum ReceiverEvent {
    /// Messages, in order (each a transfer's payload).
    Messages(Vec<Bytes>),
    /// The link ended; nothing follows.
    Ended(ClientError),
}

/// What the connection's task and its handles share.
#[derive(Debug, Default)]
struct Shared {
    /// Why the connection ended, once it has.
    failure: Mutex<Option<ClientError>>,
    /// The sessions the hub has begun and not ended.
    sessions: Mutex<HashSet<SessionId>>,
}

impl Shared {
    fn failure(&self) -> Option<ClientError> {
        self.failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn session_live(&self, session: SessionId) -> bool {
        self.sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&session)
    }

    fn set_session(&self, session: SessionId, live: bool) {
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        if live {
            sessions.insert(session);
        } else {
            sessions.remove(&session);
        }
    }
}

/// A handle on one open connection; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct AmqpConnection {
    commands: mpsc::UnboundedSender<Command>,
    shared: Arc<Shared>,
}

impl AmqpConnection {
    /// Connects to `endpoint`, authenticates with SASL ANONYMOUS (tokens follow on `$cbs`) and
    /// waits for the hub's `open`.
    pub(crate) async fn open(endpoint: Endpoint<'_>) -> Result<AmqpConnection, ClientError> {
        let name = endpoint.name();
        let connect = |description: String| ClientError::Connect {
            endpoint: name.clone(),
            description,
        };
        let tcp = if endpoint.addresses.is_empty() {
            TcpStream::connect((endpoint.host, endpoint.port)).await
        } else {
            let addresses: Vec<std::net::SocketAddr> = endpoint
                .addresses
                .iter()
                .map(|ip| std::net::SocketAddr::new(*ip, endpoint.port))
                .collect();
            TcpStream::connect(addresses.as_slice()).await
        };
        let tcp = tcp.map_err(|e| connect(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        if endpoint.tls {
            let stream = crate::tls::connect(tcp, endpoint.host, endpoint.trusted_certificates)
                .await
                .map_err(|e| connect(e.to_string()))?;
            Self::open_on(stream, &endpoint).await
        } else {
            Self::open_on(tcp, &endpoint).await
        }
    }

    async fn open_on<S>(mut stream: S, endpoint: &Endpoint<'_>) -> Result<Self, ClientError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let name = endpoint.name();
        let mut buffered = Vec::new();
        sasl::connect(
            &mut stream,
            &mut buffered,
            "ANONYMOUS",
            None,
            Some(endpoint.host),
        )
        .await
        .map_err(|e| sasl_error(&name, e))?;
        let mut config = Config::new(endpoint.container_id.clone());
        config.hostname = Some(endpoint.host.to_owned());
        config.max_frame_size = FRAME_BYTES_MAX;
        config.channel_max = SESSIONS_MAX;
        config.idle_timeout_ms = Some(u32::try_from(IDLE_TIMEOUT.as_millis()).unwrap_or(u32::MAX));
        config.properties = endpoint.properties.clone();
        let connection = Connection::client(config);
        let shared = Arc::new(Shared::default());
        let (opened_tx, opened) = oneshot::channel();
        let (commands, mut commands_rx) = mpsc::unbounded_channel();
        let mut handler = ClientHandler::new(Arc::clone(&shared), opened_tx);
        tokio::spawn(async move {
            let shutdown = std::future::pending();
            let (_, ending) = driver::run(
                stream,
                buffered,
                connection,
                &mut handler,
                &mut commands_rx,
                shutdown,
            )
            .await;
            handler.finish(&ending);
        });
        let opening = opened.await.unwrap_or_else(|_| {
            Err(lost(
                "the connection ended before the hub answered its open",
            ))
        });
        match opening {
            Ok(()) => Ok(AmqpConnection { commands, shared }),
            Err(ClientError::Unauthorized { description }) => {
                Err(ClientError::Unauthorized { description })
            }
            Err(other) => Err(ClientError::Connect {
                endpoint: name,
                description: other.to_string(),
            }),
        }
    }

    /// Whether the connection is open and `session` is begun.
    pub(crate) fn is_usable(&self, session: SessionId) -> bool {
        !self.commands.is_closed()
            && self.shared.failure().is_none()
            && self.shared.session_live(session)
    }

    fn gone(&self) -> ClientError {
        self.shared
            .failure()
            .unwrap_or_else(|| lost("the connection to the hub is closed"))
    }

    fn command(&self, command: Command) -> Result<(), ClientError> {
        self.commands.send(command).map_err(|_| self.gone())
    }

    async fn answer<T>(
        &self,
        reply: oneshot::Receiver<Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        match reply.await {
            Ok(result) => result,
            Err(_) => Err(self.gone()),
        }
    }

    /// Begins a session.
    pub(crate) async fn begin(&self) -> Result<SessionId, ClientError> {
        let (reply, answer) = oneshot::channel();
        self.command(Command::Begin { reply })?;
        self.answer(answer).await
    }

    /// Ends a session (its links with it).
    pub(crate) fn end(&self, session: SessionId) {
        let _ = self.command(Command::End { session });
    }

    /// Attaches a sender to `address` on `session`, settle mode `unsettled`.
    pub(crate) async fn attach_sender(
        &self,
        session: SessionId,
        name: String,
        address: &str,
    ) -> Result<SenderLink, ClientError> {
        let mut attach = attach_frame(name, Role::Sender, SenderSettleMode::Unsettled);
        attach.source = Some(Box::new(
            fe2o3_amqp_types::messaging::Source::builder()
                .address(attach.name.clone())
                .build(),
        ));
        attach.target = Some(Box::new(
            fe2o3_amqp_types::messaging::Target::builder()
                .address(address.to_owned())
                .build()
                .into(),
        ));
        let (reply, answer) = oneshot::channel();
        self.command(Command::Attach {
            session,
            attach: Box::new(attach),
            address: address.to_owned(),
            receiver: None,
            reply,
        })?;
        let attached = self.answer(answer).await?;
        Ok(SenderLink {
            link: attached.link,
            connection: self.clone(),
            max_message_size: attached.answer.max_message_size.filter(|max| *max > 0),
        })
    }

    /// Attaches a receiver as `attach` says (its role is set here) with `credit` to start;
    /// `own_session`: the session is the receiver's alone and ends with it.
    pub(crate) async fn attach_receiver(
        &self,
        session: SessionId,
        mut attach: Attach,
        address: &str,
        credit: u32,
        own_session: bool,
    ) -> Result<ReceiverLink, ClientError> {
        attach.role = Role::Receiver;
        attach.max_message_size = Some(DELIVERY_BYTES_MAX);
        let (events_tx, events) = mpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        self.command(Command::Attach {
            session,
            attach: Box::new(attach),
            address: address.to_owned(),
            receiver: Some(ReceiverSetup {
                credit,
                events: events_tx,
            }),
            reply,
        })?;
        let attached = self.answer(answer).await?;
        Ok(ReceiverLink {
            link: attached.link,
            connection: self.clone(),
            events,
            own_session: own_session.then_some(session),
        })
    }

    /// Closes the connection (the task waits a bounded time for the hub's answer).
    pub(crate) fn close(&self) {
        let _ = self.command(Command::Close);
    }
}

fn sasl_error(endpoint: &str, error: SaslError) -> ClientError {
    let connect = |description: String| ClientError::Connect {
        endpoint: endpoint.to_owned(),
        description,
    };
    match error {
        SaslError::Refused(SaslCode::Auth) => ClientError::Unauthorized {
            description: "the hub refused the SASL authentication".to_owned(),
        },
        SaslError::Refused(code) => connect(format!("SASL negotiation failed with code {code:?}")),
        SaslError::Io(e) => connect(e.to_string()),
        SaslError::Protocol(reason) => connect(format!(
            "{reason}; is it an AMQP endpoint, and is TLS set right (UseDevelopmentEmulator=true for plain TCP)?"
        )),
    }
}

/// A sending link; dropping it detaches it.
#[derive(Debug)]
pub(crate) struct SenderLink {
    link: LinkRef,
    connection: AmqpConnection,
    max_message_size: Option<u64>,
}

impl SenderLink {
    /// The largest message the hub takes on this link, if it said.
    pub(crate) fn max_message_size(&self) -> Option<u64> {
        self.max_message_size
    }

    /// Queues `payload` (an encoded message) for the link, unsettled; the returned channel
    /// gets the hub's outcome. Sends leave in the order of these calls.
    pub(crate) fn send(&self, payload: Vec<u8>, format: u32) -> Result<Settlement, ClientError> {
        let (reply, settlement) = oneshot::channel();
        self.connection.command(Command::Send {
            link: self.link,
            payload,
            format,
            reply,
        })?;
        Ok(Settlement {
            settlement,
            connection: self.connection.clone(),
        })
    }
}

impl Drop for SenderLink {
    fn drop(&mut self) {
        let _ = self.connection.command(Command::Detach { link: self.link });
    }
}

/// The hub's outcome for one send, to await.
#[derive(Debug)]
pub(crate) struct Settlement {
    settlement: oneshot::Receiver<Result<Outcome, ClientError>>,
    connection: AmqpConnection,
}

impl Settlement {
    /// Waits for the outcome.
    pub(crate) async fn outcome(self) -> Result<Outcome, ClientError> {
        self.connection.answer(self.settlement).await
    }
}

/// A receiving link; dropping it detaches it (and ends its own session).
#[derive(Debug)]
pub(crate) struct ReceiverLink {
    link: LinkRef,
    connection: AmqpConnection,
    events: mpsc::UnboundedReceiver<ReceiverEvent>,
    own_session: Option<SessionId>,
}

impl ReceiverLink {
    /// The next batch of messages, or how the link ended.
    pub(crate) async fn next(&mut self) -> ReceiverEvent {
        match self.events.recv().await {
            Some(event) => event,
            None => ReceiverEvent::Ended(self.connection.gone()),
        }
    }

    /// The next batch if one is already here.
    pub(crate) fn try_next(&mut self) -> Option<ReceiverEvent> {
        match self.events.try_recv() {
            Ok(event) => Some(event),
            Err(mpsc::error::TryRecvError::Empty) => None,
            Err(mpsc::error::TryRecvError::Disconnected) => {
                Some(ReceiverEvent::Ended(self.connection.gone()))
            }
        }
    }

    /// Grants the hub `add` more deliveries.
    pub(crate) fn grant(&self, add: u32) {
        if add > 0 {
            let _ = self.connection.command(Command::Credit {
                link: self.link,
                add,
            });
        }
    }
}

impl Drop for ReceiverLink {
    fn drop(&mut self) {
        let _ = self.connection.command(Command::Detach { link: self.link });
        if let Some(session) = self.own_session {
            self.connection.end(session);
        }
    }
}

// ----- the connection's task -----

/// A send waiting for credit.
#[derive(Debug)]
struct WaitingSend {
    payload: Vec<u8>,
    format: u32,
    reply: oneshot::Sender<Result<Outcome, ClientError>>,
}

#[derive(Debug)]
enum LinkKind {
    Sender {
        waiting: std::collections::VecDeque<WaitingSend>,
    },
    Receiver {
        credit: u32,
        events: mpsc::UnboundedSender<ReceiverEvent>,
        batch: Vec<Bytes>,
    },
}

#[derive(Debug)]
struct LinkSlot {
    serial: u64,
    address: String,
    attach_reply: Option<oneshot::Sender<Result<Attached, ClientError>>>,
    kind: LinkKind,
}

/// A send the hub has not settled yet.
#[derive(Debug)]
struct Unsettled {
    link: LinkId,
    reply: oneshot::Sender<Result<Outcome, ClientError>>,
}

/// The connection's [`Handler`]: see the module docs.
#[derive(Debug)]
struct ClientHandler {
    shared: Arc<Shared>,
    opened: Option<oneshot::Sender<Result<(), ClientError>>>,
    begins: HashMap<SessionId, oneshot::Sender<Result<SessionId, ClientError>>>,
    links: LinkMap<LinkSlot>,
    next_serial: u64,
    /// Per session, unsettled sends by delivery id.
    unsettled: HashMap<SessionId, BTreeMap<u32, Unsettled>>,
    /// Runs of consecutive delivery ids to accept at the end of the turn.
    to_accept: Vec<(SessionId, u32, u32)>,
    /// Receivers with messages gathered this turn.
    filled: Vec<LinkId>,
    /// The error the hub closed the connection with.
    close_error: Option<ClientError>,
}

impl ClientHandler {
    fn new(shared: Arc<Shared>, opened: oneshot::Sender<Result<(), ClientError>>) -> Self {
        ClientHandler {
            shared,
            opened: Some(opened),
            begins: HashMap::new(),
            links: LinkMap::default(),
            next_serial: 0,
            unsettled: HashMap::new(),
            to_accept: Vec::new(),
            filled: Vec::new(),
            close_error: None,
        }
    }

    fn slot(&mut self, link: LinkRef) -> Option<&mut LinkSlot> {
        self.links
            .get_mut(&link.id)
            .filter(|slot| slot.serial == link.serial)
    }

    /// Ends a link's slot: everything waiting on it gets `error`.
    fn fail_link(&mut self, id: LinkId, error: &ClientError) {
        let Some(slot) = self.links.remove(&id) else {
            return;
        };
        if let Some(reply) = slot.attach_reply {
            let _ = reply.send(Err(error.clone()));
        }
        match slot.kind {
            LinkKind::Sender { waiting } => {
                for send in waiting {
                    let _ = send.reply.send(Err(error.clone()));
                }
                if let Some(unsettled) = self.unsettled.get_mut(&id.session) {
                    let ids: Vec<u32> = unsettled
                        .iter()
                        .filter(|(_, u)| u.link == id)
                        .map(|(delivery_id, _)| *delivery_id)
                        .collect();
                    for delivery_id in ids {
                        if let Some(u) = unsettled.remove(&delivery_id) {
                            let _ = u.reply.send(Err(error.clone()));
                        }
                    }
                }
            }
            LinkKind::Receiver { events, batch, .. } => {
                if !batch.is_empty() {
                    let _ = events.send(ReceiverEvent::Messages(batch));
                }
                let _ = events.send(ReceiverEvent::Ended(error.clone()));
            }
        }
    }

    fn fail_session(&mut self, session: SessionId, error: &ClientError) {
        self.shared.set_session(session, false);
        if let Some(reply) = self.begins.remove(&session) {
            let _ = reply.send(Err(error.clone()));
        }
        let links: Vec<LinkId> = self
            .links
            .keys()
            .filter(|id| id.session == session)
            .copied()
            .collect();
        for link in links {
            self.fail_link(link, error);
        }
        for (_, u) in self.unsettled.remove(&session).unwrap_or_default() {
            let _ = u.reply.send(Err(error.clone()));
        }
        self.to_accept.retain(|(s, _, _)| *s != session);
    }

    fn fail_all(&mut self, error: &ClientError) {
        {
            let mut failure = self
                .shared
                .failure
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            failure.get_or_insert_with(|| error.clone());
        }
        if let Some(opened) = self.opened.take() {
            let _ = opened.send(Err(error.clone()));
        }
        let mut sessions: HashSet<SessionId> = self.begins.keys().copied().collect();
        sessions.extend(self.links.keys().map(|id| id.session));
        sessions.extend(self.unsettled.keys().copied());
        for session in sessions {
            self.fail_session(session, error);
        }
        self.shared
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The connection's task is over: fail whatever still waits.
    fn finish(&mut self, ending: &Ending) {
        let error = self.close_error.clone().unwrap_or_else(|| match ending {
            Ending::Closed => lost("the connection was closed"),
            Ending::Protocol(error) => ClientError::Protocol {
                description: format!("the hub broke the AMQP protocol: {error}"),
            },
            Ending::IdleTimeout => lost("the hub was silent beyond the connection's idle timeout"),
            Ending::Io(error) => lost(format!("the connection to the hub failed: {error}")),
            Ending::CloseUnanswered => lost("the connection was closed"),
        });
        self.fail_all(&error);
    }

    fn send_now(
        connection: &mut Connection,
        link: LinkId,
        send: WaitingSend,
        unsettled: &mut HashMap<SessionId, BTreeMap<u32, Unsettled>>,
    ) {
        let WaitingSend {
            payload,
            format,
            reply,
        } = send;
        // Large enough messages go to the socket from the payload itself, not copied.
        match connection.send_bytes(link, false, format, &Bytes::from(payload)) {
            Ok(delivery_id) => {
                unsettled
                    .entry(link.session)
                    .or_default()
                    .insert(delivery_id, Unsettled { link, reply });
            }
            Err(error) => {
                let _ = reply.send(Err(engine_refusal(error)));
            }
        }
    }

    /// Sends what waits on `link` while it has credit.
    fn flush_sends(&mut self, connection: &mut Connection, link: LinkId) {
        let Some(LinkSlot {
            kind: LinkKind::Sender { waiting },
            ..
        }) = self.links.get_mut(&link)
        else {
            return;
        };
        while connection.credit(link) > 0 {
            let Some(send) = waiting.pop_front() else {
                break;
            };
            Self::send_now(connection, link, send, &mut self.unsettled);
        }
    }

    /// A link the client asked the engine to attach: kept until the hub answers.
    fn attaching(
        &mut self,
        link: LinkId,
        address: String,
        receiver: Option<ReceiverSetup>,
        reply: oneshot::Sender<Result<Attached, ClientError>>,
    ) {
        self.next_serial += 1;
        let kind = match receiver {
            Some(setup) => LinkKind::Receiver {
                credit: setup.credit,
                events: setup.events,
                batch: Vec::new(),
            },
            None => LinkKind::Sender {
                waiting: std::collections::VecDeque::new(),
            },
        };
        self.links.insert(
            link,
            LinkSlot {
                serial: self.next_serial,
                address,
                attach_reply: Some(reply),
                kind,
            },
        );
    }

    /// A message to send: now if the link has credit and nothing waits, else queued.
    fn send_or_wait(&mut self, connection: &mut Connection, link: LinkRef, send: WaitingSend) {
        let Some(slot) = self.slot(link) else {
            let _ = send.reply.send(Err(lost("the link is closed")));
            return;
        };
        let LinkKind::Sender { waiting } = &mut slot.kind else {
            return;
        };
        if waiting.is_empty() && connection.credit(link.id) > 0 {
            Self::send_now(connection, link.id, send, &mut self.unsettled);
        } else {
            waiting.push_back(send);
        }
    }

    fn on_detached(&mut self, link: LinkId, error: Option<&definitions::Error>) {
        let address = self
            .links
            .get(&link)
            .map(|slot| slot.address.clone())
            .unwrap_or_default();
        let error = ended_error(error, || ClientError::ServerBusy {
            condition: tributary_eventhubs::condition::DETACH_FORCED.to_owned(),
            description: format!("the hub detached the link to {address} without saying why"),
        });
        self.fail_link(link, &error);
    }

    fn on_closed(&mut self, error: Option<&definitions::Error>) {
        let error = match error.map(ClientError::from_amqp) {
            Some(ClientError::Other {
                condition,
                description,
            }) => lost(format!(
                "the hub closed the connection ({condition}): {description}"
            )),
            Some(mapped) => mapped,
            None => lost("the hub closed the connection"),
        };
        self.close_error = Some(error.clone());
        self.fail_all(&error);
    }

    fn on_attached(&mut self, connection: &mut Connection, link: LinkId, answer: Box<Attach>) {
        let Some(slot) = self.links.get_mut(&link) else {
            return;
        };
        // A refusal answers with a null terminus and detaches with the reason next
        // (specification 2.6.3): wait for the detach.
        let refused = match slot.kind {
            LinkKind::Sender { .. } => answer.target.is_none(),
            LinkKind::Receiver { .. } => answer.source.is_none(),
        };
        if refused {
            return;
        }
        if let LinkKind::Receiver { credit, .. } = slot.kind {
            let _ = connection.flow(link, credit);
        }
        if let Some(reply) = slot.attach_reply.take() {
            let attached = Attached {
                link: LinkRef {
                    id: link,
                    serial: slot.serial,
                },
                answer,
            };
            if reply.send(Ok(attached)).is_err() {
                // The caller gave up (timed out): the link is nobody's.
                self.links.remove(&link);
                connection.detach(link, true, None);
            }
        }
    }

    fn on_delivery(&mut self, delivery: tributary_amqp_engine::connection::Delivery) {
        if !delivery.settled {
            let session = delivery.link.session;
            let id = delivery.delivery_id;
            match self.to_accept.last_mut() {
                Some((s, _, last)) if *s == session && last.wrapping_add(1) == id => *last = id,
                _ => self.to_accept.push((session, id, id)),
            }
        }
        if let Some(LinkSlot {
            kind: LinkKind::Receiver { batch, .. },
            ..
        }) = self.links.get_mut(&delivery.link)
        {
            if batch.is_empty() {
                self.filled.push(delivery.link);
            }
            batch.push(delivery.payload);
        }
    }

    fn on_disposition(&mut self, session: SessionId, first: u32, last: u32, state: Option<&[u8]>) {
        let Some(unsettled) = self.unsettled.get_mut(&session) else {
            return;
        };
        let outcome = delivery_outcome(state);
        let ids: Vec<u32> = if first <= last {
            unsettled.range(first..=last).map(|(id, _)| *id).collect()
        } else {
            // The range wraps around the end of the delivery-id space.
            unsettled
                .range(first..)
                .chain(unsettled.range(..=last))
                .map(|(id, _)| *id)
                .collect()
        };
        for id in ids {
            if let Some(u) = unsettled.remove(&id) {
                let _ = u.reply.send(outcome.clone());
            }
        }
    }
}

/// A send the engine refused to put on the wire.
/// The hub attaching a link to this client: nothing here serves one.
fn refuse_hub_link(connection: &mut Connection, link: LinkId, attach: Attach) {
    let role = match attach.role {
        Role::Sender => Role::Receiver,
        Role::Receiver => Role::Sender,
    };
    let _ = connection.attach_answer(
        link,
        attach_frame(attach.name, role, SenderSettleMode::Unsettled),
    );
    connection.detach(
        link,
        true,
        Some(amqp_error(
            tributary_eventhubs::condition::NOT_ALLOWED,
            "this client does not accept links from the hub",
        )),
    );
}

fn engine_refusal(error: SendError) -> ClientError {
    match error {
        SendError::Exhausted => ClientError::QuotaExceeded {
            description: "the connection carries as many sessions or links as it may (one session per open receiver); close receivers or open them from another client".to_owned(),
        },
        other => lost(format!("the link is gone: {other}")),
    }
}

/// The outcome a settled disposition carries.
fn delivery_outcome(state: Option<&[u8]>) -> Result<Outcome, ClientError> {
    let Some(state) = state else {
        // Settled without a state: the hub is done with it and said nothing against it.
        return Ok(Outcome::Accepted(fe2o3_amqp_types::messaging::Accepted {}));
    };
    if state.starts_with(&ACCEPTED[..3]) {
        return Ok(Outcome::Accepted(fe2o3_amqp_types::messaging::Accepted {}));
    }
    tributary_amqp_codec::value::check_well_formed(state).map_err(|e| ClientError::Protocol {
        description: format!("the hub sent a malformed delivery state: {e}"),
    })?;
    match serde_amqp::from_slice::<DeliveryState>(state) {
        Ok(DeliveryState::Accepted(a)) => Ok(Outcome::Accepted(a)),
        Ok(DeliveryState::Rejected(r)) => Ok(Outcome::Rejected(r)),
        Ok(DeliveryState::Released(r)) => Ok(Outcome::Released(r)),
        Ok(DeliveryState::Modified(m)) => Ok(Outcome::Modified(m)),
        Ok(_) => Err(ClientError::Protocol {
            description: "the hub settled a send with a state that is no outcome".to_owned(),
        }),
        Err(e) => Err(ClientError::Protocol {
            description: format!("the hub sent an undecodable delivery state: {e}"),
        }),
    }
}

/// The error a link or session ended with, mapped; `None`: it ended without one.
fn ended_error(
    error: Option<&definitions::Error>,
    without: impl FnOnce() -> ClientError,
) -> ClientError {
    match error {
        Some(error) => ClientError::from_amqp(error),
        None => without(),
    }
}

impl Handler for ClientHandler {
    type Command = Command;

    fn on_event(&mut self, connection: &mut Connection, event: Event) {
        match event {
            Event::Opened(_) => {
                if let Some(opened) = self.opened.take() {
                    let _ = opened.send(Ok(()));
                }
            }
            Event::SessionBegun(session) => {
                self.shared.set_session(session, true);
                if let Some(reply) = self.begins.remove(&session)
                    && reply.send(Ok(session)).is_err()
                {
                    // The caller gave up waiting: the session is nobody's.
                    self.shared.set_session(session, false);
                    connection.end(session, None);
                }
            }
            Event::Attached {
                link,
                attach,
                answer: true,
            } => self.on_attached(connection, link, attach),
            Event::Attached {
                link,
                attach,
                answer: false,
            } => refuse_hub_link(connection, link, *attach),
            Event::Delivery(delivery) => self.on_delivery(delivery),
            Event::Credit(link) => self.flush_sends(connection, link),
            Event::Disposition {
                session,
                role_is_receiver: true,
                first,
                last,
                settled: true,
                state,
            } => self.on_disposition(session, first, last, state.as_deref()),
            // Not final yet, or about deliveries the hub sent (settled here on arrival).
            Event::Disposition { .. } => {}
            Event::Detached { link, error, .. } => self.on_detached(link, error.as_ref()),
            Event::SessionEnded { session, error } => {
                let error = ended_error(error.as_ref(), || lost("the hub ended the session"));
                self.fail_session(session, &error);
            }
            Event::Closed { error } => self.on_closed(error.as_ref()),
        }
    }

    fn on_command(&mut self, connection: &mut Connection, command: Command) {
        match command {
            Command::Begin { reply } => match connection.begin() {
                Ok(session) => {
                    self.begins.insert(session, reply);
                }
                Err(error) => {
                    let _ = reply.send(Err(engine_refusal(error)));
                }
            },
            Command::End { session } => {
                connection.end(session, None);
                self.fail_session(session, &lost("the session was ended"));
            }
            Command::Attach {
                session,
                attach,
                address,
                receiver,
                reply,
            } => match connection.attach(session, *attach) {
                Ok(link) => self.attaching(link, address, receiver, reply),
                Err(error) => {
                    let _ = reply.send(Err(engine_refusal(error)));
                }
            },
            Command::Send {
                link,
                payload,
                format,
                reply,
            } => {
                let send = WaitingSend {
                    payload,
                    format,
                    reply,
                };
                self.send_or_wait(connection, link, send);
            }
            Command::Credit { link, add } => {
                if self.slot(link).is_some() {
                    let credit = connection.granted(link.id).saturating_add(add);
                    let _ = connection.flow(link.id, credit);
                }
            }
            Command::Detach { link } => {
                if self.slot(link).is_some() {
                    connection.detach(link.id, true, None);
                    self.fail_link(link.id, &lost("the link was closed"));
                }
            }
            Command::Close => {
                connection.close(None);
                self.fail_all(&lost("the connection was closed"));
            }
        }
    }

    fn on_turn_end(&mut self, connection: &mut Connection) {
        for (session, first, last) in self.to_accept.drain(..) {
            let _ = connection.disposition(session, true, first, last, true, Some(&ACCEPTED));
        }
        for link in self.filled.drain(..) {
            if let Some(LinkSlot {
                kind: LinkKind::Receiver { events, batch, .. },
                ..
            }) = self.links.get_mut(&link)
                && !batch.is_empty()
            {
                let _ = events.send(ReceiverEvent::Messages(std::mem::take(batch)));
            }
        }
    }

    fn on_shutdown(&mut self, connection: &mut Connection) {
        connection.close(None);
    }
}

/// A connection property value: a string.
pub(crate) fn string_property(name: &str, value: &str) -> (Symbol, Value) {
    (Symbol::from(name), Value::String(value.to_owned()))
}

#[cfg(test)]
mod tests;
