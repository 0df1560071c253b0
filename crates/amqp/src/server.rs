//! The listener: accepts TCP connections (with a TLS handshake first when the listener has a
//! certificate: AMQPS, the Azure SDKs' default transport) and serves each on its own task.
//!
//! Connections another front door has already accepted — AMQP over WebSockets, carried by the
//! HTTP door — are handed over through [`AmqpConnections`] and served by the same loop: the same
//! shared state, the same SASL/CBS authentication, the same shutdown (which closes them too and
//! waits for them as for TCP connections).
//!
//! # Connection caps
//! Every connection, accepted or handed over, needs a slot (`tributary_tls::admission`): at most
//! [`ConnectionLimits::connections_max`] in all and
//! [`ConnectionLimits::connections_per_address_max`] per source IP address. A connection over a
//! cap is refused: it may finish its handshake and `open`; its first link is refused and the
//! connection closed with `amqp:resource-limit-exceeded` saying which cap it hit (the Python
//! and JavaScript SDKs raise that error at once). At most
//! [`REFUSALS_IN_FLIGHT_MAX`] are being refused at once, each for at most
//! [`crate::limits::REFUSAL_TIMEOUT`]; beyond that a connection over a cap is closed at once,
//! before any frame.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tributary_broker::Broker;
use tributary_tls::admission::{Admission, ConnectionCaps, Slot};
use tributary_tls::{ServerTls, TlsAcceptor};

use crate::AmqpError;
use crate::limits::{
    CLOSE_TIMEOUT, ConnectionLimits, HANDOVERS_QUEUED_MAX, IDLE_TIMEOUT_DEFAULT,
    REFUSALS_IN_FLIGHT_MAX,
};
use crate::policies::AccessPolicies;
use crate::wire::{self, Context};

/// How the AMQP front door is set up.
#[derive(Debug, Clone)]
pub struct AmqpConfig {
    /// Where to listen (port 0: any free port; see [`RunningAmqpServer::local_addr`]).
    pub bind: SocketAddr,
    /// The shared access policies tokens are checked against.
    pub policies: AccessPolicies,
    /// The idle timeout advertised to clients: a silent connection is closed after it.
    pub idle_timeout: Duration,
    /// Connection caps, and the deadlines of connections that have not authenticated.
    pub limits: ConnectionLimits,
    /// A certificate: every connection starts with a TLS handshake (AMQPS). None: plain AMQP,
    /// as the SDKs' emulator mode (`UseDevelopmentEmulator=true`) speaks it.
    pub tls: Option<ServerTls>,
}

impl AmqpConfig {
    /// Listening on `bind` with `policies` and the default idle timeout (120 s).
    pub fn new(bind: SocketAddr, policies: AccessPolicies) -> Self {
        AmqpConfig {
            bind,
            policies,
            idle_timeout: IDLE_TIMEOUT_DEFAULT,
            limits: ConnectionLimits::default(),
            tls: None,
        }
    }
}

/// A running AMQP listener. Dropping it without [`RunningAmqpServer::shutdown`] stops accepting
/// but leaves open connections to end on their own.
#[derive(Debug)]
pub struct RunningAmqpServer {
    local_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    connections: AmqpConnections,
}

/// A byte stream another front door accepted, as the accept loop keeps it.
trait Carried: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Carried for T {}

/// A connection handed over, and its peer.
type Handover = (Box<dyn Carried>, SocketAddr);

/// Hands connections that another front door accepted (AMQP over WebSockets) to a running AMQP
/// door, which serves them exactly as the connections its listener accepts: SASL or the bare
/// AMQP header first, every link authorized by CBS tokens, closed by the door's shutdown.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct AmqpConnections {
    handovers: mpsc::Sender<Handover>,
}

impl AmqpConnections {
    /// Serves `stream` (already through any TLS: its carrier's business) from `peer`, on the
    /// door's own task. Returns once the door has taken it, not when the connection ends; a
    /// door that has stopped drops it, which closes it.
    pub async fn serve<S>(&self, stream: S, peer: SocketAddr)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        if self.handovers.send((Box::new(stream), peer)).await.is_err() {
            tracing::debug!(%peer, "the AMQP door has stopped: a handed-over connection is closed");
        }
    }
}

/// Binds the listener and starts serving `broker` over AMQP 1.0 (the Event Hubs dialect).
pub async fn start(broker: Broker, config: AmqpConfig) -> Result<RunningAmqpServer, AmqpError> {
    let listener = TcpListener::bind(config.bind)
        .await
        .map_err(|source| AmqpError::Bind {
            addr: config.bind,
            source,
        })?;
    let local_addr = listener.local_addr().map_err(|source| AmqpError::Bind {
        addr: config.bind,
        source,
    })?;
    let (shutdown, shutdown_rx) = watch::channel(false);
    let ctx = Arc::new(Context {
        broker,
        policies: config.policies,
        idle_timeout: config.idle_timeout,
        limits: config.limits,
        shutdown: shutdown_rx,
    });
    let tls = config.tls.map(|tls| tls.acceptor(&[]));
    tracing::info!(%local_addr, tls = tls.is_some(), "AMQP listener started");
    let (handovers, handed) = mpsc::channel(HANDOVERS_QUEUED_MAX);
    let task = tokio::spawn(accept_loop(listener, handed, tls, ctx));
    Ok(RunningAmqpServer {
        local_addr,
        shutdown,
        task,
        connections: AmqpConnections { handovers },
    })
}

/// Serves what the listener accepts and what other doors hand over until shutdown, then
/// drains every connection.
async fn accept_loop(
    listener: TcpListener,
    mut handed: mpsc::Receiver<Handover>,
    tls: Option<TlsAcceptor>,
    ctx: Arc<Context>,
) {
    let mut connections = JoinSet::new();
    let mut shutdown = ctx.shutdown.clone();
    let door = Door {
        admission: Admission::new(ConnectionCaps {
            total: ctx.limits.connections_max,
            per_address: ctx.limits.connections_per_address_max,
        }),
        refusals: Arc::new(Semaphore::new(REFUSALS_IN_FLIGHT_MAX)),
        tls,
        ctx: ctx.clone(),
    };
    loop {
        tokio::select! {
            Some((stream, peer)) = handed.recv() => {
                door.admit(&mut connections, stream, peer, false);
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    door.admit(&mut connections, stream, peer, true);
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting an AMQP connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next() => {}
            () = wire::shutting_down(&mut shutdown) => break,
        }
    }
    drop(listener);
    // Connections still queued for a handover are dropped: closed.
    drop(handed);
    // Connections see the same flag and close themselves; give them time, then cut them off.
    let drained = tokio::time::timeout(CLOSE_TIMEOUT * 2, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        connections.shutdown().await;
    }
}

/// What the accept loop needs to admit or refuse a connection.
struct Door {
    admission: Admission,
    refusals: Arc<Semaphore>,
    tls: Option<TlsAcceptor>,
    ctx: Arc<Context>,
}

impl Door {
    /// Serves `stream` in a slot, or refuses it (see the module docs). `own_tls`: whether the
    /// listener's TLS applies (not to handed-over streams, whose carrier did its own).
    fn admit<S>(&self, connections: &mut JoinSet<()>, stream: S, peer: SocketAddr, own_tls: bool)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let accepted = Instant::now();
        let tls = self.tls.clone().filter(|_| own_tls);
        let ctx = self.ctx.clone();
        match self.admission.admit(peer) {
            Ok(slot) => {
                connections.spawn(serve(stream, peer, accepted, tls, ctx, slot));
            }
            Err(full) => {
                let description = full.description();
                let Ok(permit) = self.refusals.clone().try_acquire_owned() else {
                    tracing::debug!(%peer, reason = %description, "AMQP connection dropped: over a cap, and too many refusals in flight");
                    return;
                };
                connections.spawn(async move {
                    let refuse = |stream: Box<dyn Carried>| {
                        wire::refuse_connection(stream, peer, &ctx, description)
                    };
                    let _permit = permit;
                    match tls {
                        None => refuse(Box::new(stream) as Box<dyn Carried>).await,
                        Some(acceptor) => {
                            if let Ok(stream) = tributary_tls::accept(&acceptor, stream).await {
                                refuse(Box::new(stream)).await;
                            }
                        }
                    }
                });
            }
        }
    }
}

/// Serves one connection in its slot: after a TLS handshake when the listener has a
/// certificate.
async fn serve<S>(
    stream: S,
    peer: SocketAddr,
    accepted: Instant,
    tls: Option<TlsAcceptor>,
    ctx: Arc<Context>,
    slot: Slot,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let _slot = slot;
    let Some(acceptor) = tls else {
        return wire::serve_connection(stream, peer, accepted, ctx).await;
    };
    match tributary_tls::accept(&acceptor, stream).await {
        Ok(stream) => wire::serve_connection(stream, peer, accepted, ctx).await,
        Err(e) => tracing::debug!(%peer, error = %e, "AMQPS handshake failed"),
    }
}

impl RunningAmqpServer {
    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Where other front doors hand over connections they accepted (AMQP over WebSockets).
    pub fn connections(&self) -> AmqpConnections {
        self.connections.clone()
    }

    /// Stops accepting; lets every send link finish and settle the appends it issued, then
    /// detaches it and every other link (`amqp:link:detach-forced`), so nothing in the log goes
    /// unacknowledged; closes every connection and waits for them (at most about ten seconds).
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
        tracing::info!(local_addr = %self.local_addr, "AMQP listener stopped");
    }
}
