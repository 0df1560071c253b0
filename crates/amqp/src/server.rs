//! The listener: accepts TCP connections (with a TLS handshake first when the listener has a
//! certificate: AMQPS, the Azure SDKs' default transport) and serves each on its own task.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tributary_broker::Broker;
use tributary_tls::{ServerTls, TlsAcceptor};

use crate::AmqpError;
use crate::limits::{CLOSE_TIMEOUT, IDLE_TIMEOUT_DEFAULT};
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
    let task = tokio::spawn(accept_loop(listener, tls, ctx));
    Ok(RunningAmqpServer {
        local_addr,
        shutdown,
        task,
    })
}

async fn accept_loop(listener: TcpListener, tls: Option<TlsAcceptor>, ctx: Arc<Context>) {
    let mut connections = JoinSet::new();
    let mut shutdown = ctx.shutdown.clone();
    loop {
        tokio::select! {
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

    /// Stops accepting; lets every send link finish and settle the appends it issued, then
    /// detaches it and every other link (`amqp:link:detach-forced`), so nothing in the log goes
    /// unacknowledged; closes every connection and waits for them (at most about ten seconds).
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
        tracing::info!(local_addr = %self.local_addr, "AMQP listener stopped");
    }
}
