//! The listener: accepts TCP connections (with a TLS handshake first when the listener has a
//! certificate: AMQPS, the Azure SDKs' default transport) and serves each on its own task.
//!
//! Connections another front door has already accepted — AMQP over WebSockets, carried by the
//! HTTP door — are handed over through [`AmqpConnections`] and served by the same loop: the same
//! shared state, the same SASL/CBS authentication, the same shutdown (which closes them too and
//! waits for them as for TCP connections).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tributary_broker::Broker;
use tributary_tls::{ServerTls, TlsAcceptor};

use crate::AmqpError;
use crate::limits::{CLOSE_TIMEOUT, HANDOVERS_QUEUED_MAX, IDLE_TIMEOUT_DEFAULT};
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
    loop {
        tokio::select! {
            Some((stream, peer)) = handed.recv() => {
                connections.spawn(wire::serve_connection(stream, peer, ctx.clone()));
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    connections.spawn(serve(stream, peer, tls.clone(), ctx.clone()));
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

/// Serves one accepted socket: after a TLS handshake when the listener has a certificate.
async fn serve(stream: TcpStream, peer: SocketAddr, tls: Option<TlsAcceptor>, ctx: Arc<Context>) {
    let _ = stream.set_nodelay(true);
    let Some(acceptor) = tls else {
        return wire::serve_connection(stream, peer, ctx).await;
    };
    match tributary_tls::accept(&acceptor, stream).await {
        Ok(stream) => wire::serve_connection(stream, peer, ctx).await,
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
