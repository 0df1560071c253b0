//! Tributary's HTTP front door: the OCI Streaming message API, server-side consumer groups,
//! an admin API, health and Prometheus metrics, over one [`tributary_broker::Broker`].
//!
//! [`start`] binds a listener and serves until [`RunningHttpServer::shutdown`]. It owns no data:
//! messages go to and come from the broker, groups live in the [`GroupCoordinator`]
//! (`tributary-groups`, opened by [`start`] over the broker), and the only files it keeps are the cursor key
//! (`<data_dir>/http-cursor.key`) and, when signatures are required, the API key file it reads
//! (`<data_dir>/oci-api-keys.json`).
//!
//! # The OCI Streaming API (base path `/20180418`)
//! A stream is an event hub (stream id = hub name); offsets are sequence numbers; a message key
//! routes like a partition key (a UTF-8 key *is* the event's partition key, so AMQP consumers see
//! it), a null key spreads round-robin. The paths and JSON shapes are OCI's, so the official
//! `oci` SDK's `StreamClient` works unmodified, and so does its `StreamAdminClient` for
//! creating, getting, listing and deleting streams; see [`routes`] for the list.
//!
//! # AMQP over WebSockets
//! With [`HttpConfig::websocket_amqp`] set, `GET /$servicebus/websocket` upgrades to a WebSocket
//! with the subprotocol `AMQPWSB10` (the Azure SDKs' `AmqpOverWebsocket` transport, over HTTPS
//! or plain HTTP) and hands the AMQP byte stream it carries to the AMQP door, which
//! authenticates it as any AMQP connection; see [`AmqpOverWebSockets`].
//!
//! # Guarantees
//! - PutMessages answers per message in request order; messages with the same key keep their
//!   order; a request refused as a whole (bad JSON, bad base64, over 1 MiB, throttled) writes
//!   nothing; a partial failure answers 200 with `failures` and per-entry errors.
//! - Every answer carries `opc-request-id` (the caller's, or a generated one); every error is
//!   `{"code", "message"}` with OCI's status and code (listed in [`routes`]); nothing a client
//!   sends can panic the server.
//! - Cursors are opaque, HMAC-authenticated and expire after five minutes.
//! - Signed requests are verified against registered RSA keys (see [`AuthConfig`]); development
//!   mode accepts unsigned requests and says so with a WARN line at start. The admin API
//!   (`/admin/v1`) alone also takes a SAS token when [`HttpConfig::admin_sas`] accepts it.
//!
//! # The web dashboard
//! `GET /` serves a live dashboard (hubs, partitions, groups and their lag, receivers,
//! server-side groups, the log's sync latency) with operator actions, behind the admin API's
//! authentication; see the `dashboard` module.
//!
//! # Limits
//! Connections are capped in total and per source address, and must send a request's headers
//! and body within their timeouts ([`HttpLimits`]; refusals are 503, 429 and 408 answers).
//!
//! # Shutdown
//! [`RunningHttpServer::shutdown`] stops accepting connections, lets requests in flight finish
//! (up to a few seconds), and returns; the broker is left running for its owner to shut down.

#![forbid(unsafe_code)]

mod accept;
mod admin;
mod admin_policies;
mod auth;
mod cursor;
mod dashboard;
mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod limits;
mod metrics;
mod oci;
pub mod retention;
pub mod routes;
mod server;
mod tls;
mod websocket;
mod ws_stream;

pub use auth::{KeyFileError, write_key_file};
pub use cursor::CursorKeyError;
pub use limits::HttpLimits;
pub use websocket::{
    AMQP_WEBSOCKET_PATH, AMQP_WEBSOCKET_PATH_SLASHED, AMQP_WEBSOCKET_PROTOCOL, AmqpOverWebSockets,
    ByteStream, ServeFuture,
};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tributary_broker::Broker;
use tributary_groups::{CoordinatorConfig, CoordinatorError, GroupCoordinator};

/// How requests are authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthConfig {
    /// Every request to the OCI and admin APIs must carry a valid OCI request signature.
    Signatures {
        /// The key file (keyId → PEM public key); `None`: `<data_dir>/oci-api-keys.json`.
        keys_file: Option<PathBuf>,
        /// How far a request's `date` may be from the server's clock.
        clock_skew_ms_max: i64,
    },
    /// Unsigned requests are accepted (and signatures are not checked). For development only;
    /// logged as a warning at start.
    DevelopmentUnauthenticated,
}

impl AuthConfig {
    /// Signatures required, keys in `<data_dir>/oci-api-keys.json`, five minutes of skew.
    pub fn signatures() -> Self {
        AuthConfig::Signatures {
            keys_file: None,
            clock_skew_ms_max: limits::CLOCK_SKEW_MS_MAX_DEFAULT,
        }
    }
}

/// Throttling; `None` is no limit. Beyond a limit, requests are answered 429 `TooManyRequests`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateLimits {
    /// GetMessages requests per second per reader: per (stream, partition) for partition
    /// cursors, per (stream, group, instance) for group cursors. OCI allows 5.
    pub get_requests_per_second: Option<u64>,
    /// Key and value bytes per second put into one partition. OCI allows 1 MiB.
    pub put_bytes_per_second: Option<u64>,
}

impl RateLimits {
    /// OCI Streaming's limits: 5 GetMessages per second per reader, 1 MiB/s per partition.
    pub fn oci() -> Self {
        RateLimits {
            get_requests_per_second: Some(5),
            put_bytes_per_second: Some(1024 * 1024),
        }
    }
}

/// How the HTTP front door is configured.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Where to listen; port 0 picks a free port (see [`RunningHttpServer::local_addr`]).
    pub bind: SocketAddr,
    /// Authentication.
    pub auth: AuthConfig,
    /// Throttling.
    pub rate_limits: RateLimits,
    /// The group coordinator's settings (used by [`start`], which opens one).
    pub coordinator: CoordinatorConfig,
    /// A certificate: serve HTTPS (TLS 1.2 and 1.3, HTTP/1.1). None: plain HTTP.
    pub tls: Option<tributary_tls::ServerTls>,
    /// Where AMQP over WebSockets (`GET /$servicebus/websocket`) connections are handed; None:
    /// that path answers 404.
    pub websocket_amqp: Option<AmqpOverWebSockets>,
    /// Also accept, on the admin API (`/admin/v1/…`) only, an `Authorization:
    /// SharedAccessSignature …` header this checks (the Event Hubs REST scheme; `tributary
    /// hub`/`group` use it with a shared access policy's key). None: signatures only.
    pub admin_sas: Option<AdminSas>,
    /// The shared access policies the admin API manages (`/admin/v1/policies`,
    /// `/admin/v1/hubs/{hub}/policies`): the same live set the other doors check logins
    /// against, so a change is in force everywhere at once. None: those routes answer 404.
    pub policies: Option<tributary_amqp::AccessPolicies>,
    /// Connection caps and read timeouts.
    pub limits: HttpLimits,
}

/// Checks the SAS token of an admin API request: whether it is valid and grants Manage over
/// the whole namespace (wired by whoever knows the shared access policies).
#[derive(Clone)]
pub struct AdminSas {
    check: std::sync::Arc<AdminTokenCheck>,
}

/// What [`AdminSas`] asks of a token: accepted, or why not.
type AdminTokenCheck = dyn Fn(&str) -> Result<(), String> + Send + Sync;

impl AdminSas {
    /// Accepts the tokens `check` accepts.
    pub fn new(check: impl Fn(&str) -> bool + Send + Sync + 'static) -> Self {
        Self::explained(move |token| {
            if check(token) {
                Ok(())
            } else {
                Err("the SAS token is not valid or does not grant Manage over the namespace".into())
            }
        })
    }

    /// Accepts the tokens `check` accepts; its error, which a refused request's answer carries,
    /// says why in words a person can act on (never the token or a key).
    pub fn explained(check: impl Fn(&str) -> Result<(), String> + Send + Sync + 'static) -> Self {
        AdminSas {
            check: std::sync::Arc::new(check),
        }
    }

    /// Whether `token` is accepted.
    pub(crate) fn accepts(&self, token: &str) -> bool {
        self.check(token).is_ok()
    }

    /// Whether `token` is accepted, or why not.
    pub(crate) fn check(&self, token: &str) -> Result<(), String> {
        (self.check)(token)
    }
}

impl std::fmt::Debug for AdminSas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminSas").finish_non_exhaustive()
    }
}

impl HttpConfig {
    /// Listens on `bind` with `auth`, no throttling, default group settings.
    pub fn new(bind: SocketAddr, auth: AuthConfig) -> Self {
        HttpConfig {
            bind,
            auth,
            rate_limits: RateLimits::default(),
            coordinator: CoordinatorConfig::default(),
            tls: None,
            websocket_amqp: None,
            admin_sas: None,
            policies: None,
            limits: HttpLimits::default(),
        }
    }
}

/// Why the server did not start or did not stop cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The API key file is missing or invalid.
    #[error(transparent)]
    Keys(#[from] auth::KeyFileError),
    /// The cursor key could not be read or created.
    #[error(transparent)]
    CursorKey(#[from] cursor::CursorKeyError),
    /// The group coordinator could not open.
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
    /// The server failed while running.
    #[error("the HTTP server failed: {0}")]
    Server(#[source] std::io::Error),
}

/// A running server.
#[derive(Debug)]
pub struct RunningHttpServer {
    local_addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
    coordinator: GroupCoordinator,
}

/// How long shutdown waits for requests in flight.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

impl RunningHttpServer {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The group coordinator it serves.
    pub fn coordinator(&self) -> &GroupCoordinator {
        &self.coordinator
    }

    /// Stops accepting connections and waits (a few seconds at most) for requests in flight.
    pub async fn shutdown(self) -> Result<(), HttpError> {
        let _ = self.stop.send(());
        let mut task = self.task;
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut task).await {
            Ok(Ok(result)) => result.map_err(HttpError::Server),
            Ok(Err(join)) => Err(HttpError::Server(std::io::Error::other(join.to_string()))),
            Err(_) => {
                task.abort();
                tracing::warn!(
                    "HTTP requests still running after the shutdown grace period were cut off"
                );
                Ok(())
            }
        }
    }
}

/// Opens a group coordinator over `broker` and starts serving on `config.bind`.
pub async fn start(broker: Broker, config: HttpConfig) -> Result<RunningHttpServer, HttpError> {
    let coordinator = GroupCoordinator::open(broker.clone(), config.coordinator.clone()).await?;
    start_with_coordinator(broker, coordinator, config).await
}

/// Starts serving on `config.bind` with an existing coordinator (to share it with other front
/// doors).
pub async fn start_with_coordinator(
    broker: Broker,
    coordinator: GroupCoordinator,
    config: HttpConfig,
) -> Result<RunningHttpServer, HttpError> {
    let state = server::Shared::open(broker, coordinator.clone(), &config)?;
    let listener = tokio::net::TcpListener::bind(config.bind)
        .await
        .map_err(|source| HttpError::Bind {
            addr: config.bind,
            source,
        })?;
    let local_addr = listener.local_addr().map_err(HttpError::Server)?;
    let (stop, stopped) = oneshot::channel::<()>();
    // The dashboard's live view stops with the server, so its event streams end and their
    // connections close instead of holding shutdown for its grace period.
    let (dashboard_stop, dashboard_stopped) = tokio::sync::watch::channel(false);
    dashboard::spawn_ticker(&state, dashboard_stopped);
    let app = server::router(state);
    let stopped = async move {
        let _ = stopped.await;
        let _ = dashboard_stop.send(true);
    };
    let https = config.tls.is_some();
    let limits = config.limits;
    let task = match config.tls {
        None => tokio::spawn(accept::serve(listener, app, limits, stopped)),
        Some(tls) => {
            let listener = tls::TlsListener::new(listener, tls.acceptor(&[b"http/1.1"]))
                .map_err(HttpError::Server)?;
            tokio::spawn(accept::serve(listener, app, limits, stopped))
        }
    };
    tracing::info!(%local_addr, https, "HTTP front door listening (OCI Streaming API at /20180418, admin at /admin/v1)");
    Ok(RunningHttpServer {
        local_addr,
        stop,
        task,
        coordinator,
    })
}
