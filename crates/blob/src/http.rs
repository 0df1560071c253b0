//! The HTTP/1.1 client for one storage endpoint: a few kept-alive connections,
//! plain TCP (Azurite) or TLS (Azure Storage, rustls with the webpki roots).
//!
//! Hand-written on hyper's client connections rather than a full client crate: a client talks
//! to one host, so a pool is a stack of idle connections, and the tree already has hyper and
//! rustls (a full client would add a second TLS setup and a DNS resolver crate).
//!
//! Guarantees: every request ends within [`REQUEST_TIMEOUT`]; a request that fails on a kept
//! connection (closed by the server while idle) is tried once more on a new one; errors name the
//! host and path, never the query (which may hold a SAS token).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(feature = "tls")]
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
#[cfg(feature = "tls")]
use tokio_rustls::TlsConnector;
#[cfg(feature = "tls")]
use tokio_rustls::rustls::pki_types::ServerName;
#[cfg(feature = "tls")]
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

/// How long one request may take, connecting included, before the call fails.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Idle connections kept per client: enough for the claims one balancing round sends at once.
const IDLE_CONNECTIONS_MAX: usize = 8;

/// A response, its body read whole (listings are a few kilobytes per page; blob reads ask for
/// bounded ranges).
#[derive(Debug)]
pub struct Response {
    /// The HTTP status.
    pub status: u16,
    /// The response headers.
    pub headers: hyper::HeaderMap,
    /// The body.
    pub body: Bytes,
}

impl Response {
    /// The value of header `name`, if it is present and text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// The endpoint's scheme, host and port, and the idle connections to it.
pub(crate) struct Http {
    tls: bool,
    host: String,
    port: u16,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
    /// Requests sent, retries included.
    requests: AtomicU64,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http")
            .field("tls", &self.tls)
            .field("host", &self.host)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "tls")]
fn tls_config() -> Arc<ClientConfig> {
    static CONFIG: OnceLock<Arc<ClientConfig>> = OnceLock::new();
    Arc::clone(CONFIG.get_or_init(|| {
        let mut roots = RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(config)
    }))
}

impl Http {
    pub(crate) fn new(tls: bool, host: String, port: u16) -> Http {
        Http {
            tls,
            host,
            port,
            idle: Mutex::new(Vec::new()),
            requests: AtomicU64::new(0),
        }
    }

    /// How many requests were sent, retries included.
    pub(crate) fn requests_sent(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    pub(crate) fn is_tls(&self) -> bool {
        self.tls
    }

    /// The `Host` header value.
    pub(crate) fn authority(&self) -> String {
        let default_port = if self.tls { 443 } else { 80 };
        if self.port == default_port {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Sends the request `build` makes (called again for a retry), within [`REQUEST_TIMEOUT`].
    pub(crate) async fn send(
        &self,
        build: impl Fn() -> hyper::Request<Full<Bytes>>,
    ) -> Result<Response, String> {
        let path = build().uri().path().to_owned();
        match tokio::time::timeout(REQUEST_TIMEOUT, self.send_with_retry(&build)).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(error)) => Err(format!("{} {path}: {error}", self.authority())),
            Err(_) => Err(format!(
                "{} {path}: no response within {} s",
                self.authority(),
                REQUEST_TIMEOUT.as_secs()
            )),
        }
    }

    async fn send_with_retry(
        &self,
        build: &impl Fn() -> hyper::Request<Full<Bytes>>,
    ) -> Result<Response, String> {
        let kept = self.take_idle();
        if let Some(sender) = kept
            && let Ok(response) = self.send_on(sender, build()).await
        {
            return Ok(response);
        }
        let sender = self.connect().await?;
        self.send_on(sender, build()).await
    }

    fn take_idle(&self) -> Option<SendRequest<Full<Bytes>>> {
        let mut idle = self
            .idle
            .lock()
            .expect("the idle list's lock is never poisoned");
        while let Some(sender) = idle.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    async fn send_on(
        &self,
        mut sender: SendRequest<Full<Bytes>>,
        request: hyper::Request<Full<Bytes>>,
    ) -> Result<Response, String> {
        sender.ready().await.map_err(|e| e.to_string())?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        let mut idle = self
            .idle
            .lock()
            .expect("the idle list's lock is never poisoned");
        if idle.len() < IDLE_CONNECTIONS_MAX {
            idle.push(sender);
        }
        Ok(Response {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, String> {
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| format!("cannot connect: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let stream: Box<dyn Io> = if self.tls {
            self.tls_handshake(tcp).await?
        } else {
            Box::new(tcp)
        };
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP handshake failed: {e}"))?;
        tokio::spawn(async move {
            // The connection ends when the server closes it or the sender is dropped; either
            // way the next request opens a new one.
            let _ = connection.await;
        });
        Ok(sender)
    }

    #[cfg(feature = "tls")]
    async fn tls_handshake(&self, tcp: tokio::net::TcpStream) -> Result<Box<dyn Io>, String> {
        let name = ServerName::try_from(self.host.clone())
            .map_err(|e| format!("not a TLS server name: {e}"))?;
        let tls = TlsConnector::from(tls_config())
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake failed: {e}"))?;
        Ok(Box::new(tls))
    }

    #[cfg(not(feature = "tls"))]
    async fn tls_handshake(&self, _tcp: tokio::net::TcpStream) -> Result<Box<dyn Io>, String> {
        Err("this build has no TLS (the tributary-blob feature `tls` is off)".to_owned())
    }
}
