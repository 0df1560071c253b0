//! The listener: accepts TCP connections and serves each on its own task, within the
//! connection caps every door applies (`tributary_tls::admission`). With a certificate the
//! listener is SASL_SSL: each connection's TLS handshake runs on its own task, within the
//! pre-authentication deadline, before the first request is read.
//!
//! A connection over a cap is closed at once: a Kafka client sends no request a refusal could
//! answer before it has a connection, and it retries a closed one with backoff.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tributary_amqp::AccessPolicies;
use tributary_broker::Broker;
use tributary_tls::admission::{Admission, ConnectionCaps};
use tributary_tls::{ServerTls, TlsAcceptor};

use crate::KafkaError;
use crate::connection::{self, Context};
use crate::limits::{CLOSE_TIMEOUT, KafkaLimits};

/// How the Kafka front door is set up.
#[derive(Debug, Clone)]
pub struct KafkaConfig {
    /// Where to listen (port 0: any free port; see [`RunningKafkaServer::local_addr`]).
    pub listen: SocketAddr,
    /// The host clients are told to connect to (Metadata's broker list): a name or address
    /// they can reach. The advertised port is the one the listener is bound to.
    pub advertised_host: String,
    /// The shared access policies SASL logins are checked against.
    pub policies: AccessPolicies,
    /// Development only: serve every request without SASL, with every right. Off by default.
    pub development_unauthenticated: bool,
    /// Connection caps, the pre-authentication deadline and the frame size.
    pub limits: KafkaLimits,
    /// TLS (SASL_SSL, as Event Hubs' port 9093): every connection starts with a handshake.
    /// `None`: plain TCP (SASL_PLAINTEXT).
    pub tls: Option<ServerTls>,
}

impl KafkaConfig {
    /// Listening on `listen` with `policies`, advertising `listen`'s IP address (`localhost`
    /// when it is every interface, 0.0.0.0 or ::, which no client can connect to), SASL
    /// required, the default limits.
    pub fn new(listen: SocketAddr, policies: AccessPolicies) -> Self {
        let advertised_host = if listen.ip().is_unspecified() {
            "localhost".to_owned()
        } else {
            listen.ip().to_string()
        };
        KafkaConfig {
            listen,
            advertised_host,
            policies,
            development_unauthenticated: false,
            limits: KafkaLimits::default(),
            tls: None,
        }
    }
}

/// A running Kafka listener. Dropping it without [`RunningKafkaServer::shutdown`] stops
/// accepting but leaves open connections to end on their own.
#[derive(Debug)]
pub struct RunningKafkaServer {
    local_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

/// Binds the listener and starts serving `broker` to Kafka clients.
pub async fn start(broker: Broker, config: KafkaConfig) -> Result<RunningKafkaServer, KafkaError> {
    let bind_error = |source| KafkaError::Bind {
        addr: config.listen,
        source,
    };
    let listener = TcpListener::bind(config.listen).await.map_err(bind_error)?;
    let local_addr = listener.local_addr().map_err(bind_error)?;
    let (shutdown, shutdown_rx) = watch::channel(false);
    if config.development_unauthenticated {
        tracing::warn!(%local_addr, "the Kafka door serves clients without authentication (development only)");
    }
    let ctx = Arc::new(Context {
        producers: crate::producers::Producers::of(&broker),
        groups: crate::groups::Coordinator::of(&broker),
        broker,
        policies: config.policies,
        unauthenticated: config.development_unauthenticated,
        limits: config.limits,
        advertised_host: config.advertised_host,
        advertised_port: local_addr.port(),
        shutdown: shutdown_rx,
    });
    let tls = config.tls.map(|tls| tls.acceptor(&[]));
    tracing::info!(%local_addr, tls = tls.is_some(), "Kafka listener started");
    let task = tokio::spawn(accept_loop(listener, tls, ctx));
    Ok(RunningKafkaServer {
        local_addr,
        shutdown,
        task,
    })
}

/// Serves what the listener accepts until shutdown, then drains every connection.
async fn accept_loop(listener: TcpListener, tls: Option<TlsAcceptor>, ctx: Arc<Context>) {
    let admission = Admission::new(ConnectionCaps {
        total: ctx.limits.connections_max,
        per_address: ctx.limits.connections_per_address_max,
    });
    let mut connections = JoinSet::new();
    let mut shutdown = ctx.shutdown.clone();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match admission.admit(peer) {
                    Ok(slot) => {
                        let _ = stream.set_nodelay(true);
                        let (ctx, tls) = (ctx.clone(), tls.clone());
                        connections.spawn(async move {
                            let _slot = slot;
                            serve_stream(stream, peer, tls, ctx).await;
                        });
                    }
                    Err(full) => {
                        tracing::debug!(%peer, reason = %full.description(), "Kafka connection closed: over a cap");
                    }
                },
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a Kafka connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = connections.join_next() => {}
            () = crate::connection::stopping(&mut shutdown) => break,
        }
    }
    drop(listener);
    // Connections see the same flag and close after the request they are answering.
    let drained = tokio::time::timeout(CLOSE_TIMEOUT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        connections.shutdown().await;
    }
    ctx.groups.release().await;
}

/// Serves one accepted connection: over TLS when the listener has a certificate (a handshake
/// that fails or outlasts the pre-authentication deadline closes it), else as it is.
async fn serve_stream(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
    ctx: Arc<Context>,
) {
    let Some(acceptor) = tls else {
        return connection::serve(stream, peer, ctx).await;
    };
    let handshake = tributary_tls::accept(&acceptor, stream);
    match tokio::time::timeout(ctx.limits.auth_timeout, handshake).await {
        Ok(Ok(stream)) => connection::serve(stream, peer, ctx).await,
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "Kafka TLS handshake failed"),
        Err(_) => tracing::debug!(%peer, "Kafka TLS handshake timed out"),
    }
}

impl RunningKafkaServer {
    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting; lets each connection finish the request it is answering (a produce
    /// acknowledges only what is stored), closes them and waits for them (at most about five
    /// seconds).
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
        tracing::info!(local_addr = %self.local_addr, "Kafka listener stopped");
    }
}
