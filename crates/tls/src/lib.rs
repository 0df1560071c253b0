//! TLS for Tributary's front doors — AMQPS (the Azure SDKs' default transport) and HTTPS — and
//! the connection caps both doors apply ([`admission`]).
//!
//! This crate owns what every door needs to speak TLS, so the AMQP and HTTP doors hold no TLS
//! code of their own:
//!
//! - [`ServerTls`]: a certificate chain and private key read from PEM files, checked to belong
//!   together, and the [`TlsAcceptor`] a door accepts connections with
//!   ([`ServerTls::acceptor`], [`accept`]).
//! - [`write_development_certificates`]: a local certificate authority and a server
//!   certificate signed by it, for development and tests (`tributary cert`).
//!
//! # Guarantees
//!
//! - **Checked at start.** [`ServerTls::from_pem_files`] fails, naming the file, when a file
//!   cannot be read, holds no certificate or no key, or the key is not the certificate's: a
//!   server never starts with a pair that cannot complete a handshake.
//! - **Reloaded on change.** The files are looked at again (their modification time and size)
//!   at most once per [`RELOAD_CHECK_INTERVAL`], when a handshake asks for the certificate. A
//!   changed pair that loads serves every later handshake; one that does not (a renewal caught
//!   half-written, a key that does not match) is logged at `warn` and the previous pair stays.
//!   Open connections keep the certificate they were made with.
//! - **Bounded handshakes.** [`accept`] gives a peer [`HANDSHAKE_TIMEOUT`] to finish its
//!   handshake; one that stalls holds its socket no longer than that.
//! - No secret is logged: errors and log lines name files, never their contents.

pub mod admission;
mod development;
mod reload;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};
pub use tokio_rustls::TlsAcceptor;
pub use tokio_rustls::server::TlsStream;

pub use development::{DevelopmentCertificates, write_development_certificates};
use reload::ReloadingResolver;

/// How often, at most, the certificate and key files are checked for a change. A renewed
/// certificate is in use within this long of being written (plus the next handshake).
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// How long a peer has to complete its TLS handshake. A loopback handshake takes about a
/// millisecond and one across a continent a few round trips; ten seconds leaves room for a
/// congested link while a silent peer cannot hold a socket for long.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why TLS could not be set up, or a handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate or key file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not the PEM it should be.
    #[error("{}: {reason}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The private key does not belong to the certificate.
    #[error(
        "the private key in {} is not the key of the certificate in {}",
        key.display(),
        cert.display()
    )]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// A certificate could not be generated.
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The peer's handshake failed.
    #[error("TLS handshake failed: {0}")]
    Handshake(std::io::Error),
    /// The peer did not complete its handshake within [`HANDSHAKE_TIMEOUT`].
    #[error("the TLS handshake did not complete within {HANDSHAKE_TIMEOUT:?}")]
    HandshakeTimeout,
}

/// A server certificate and key from PEM files, reloaded when the files change.
#[derive(Debug, Clone)]
pub struct ServerTls {
    resolver: Arc<ReloadingResolver>,
}

impl ServerTls {
    /// Reads the certificate chain (`cert`: the server's certificate first, then any
    /// intermediates) and its private key (`key`: PKCS#8, PKCS#1 or SEC1) from PEM files.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<ServerTls, TlsError> {
        Ok(ServerTls {
            resolver: Arc::new(ReloadingResolver::load(cert, key)?),
        })
    }

    /// An acceptor offering `alpn` protocols (empty for AMQP, which has no ALPN name the SDKs
    /// send; `[b"http/1.1"]` for HTTPS). TLS 1.2 and 1.3, no client certificates.
    pub fn acceptor(&self, alpn: &[&[u8]]) -> TlsAcceptor {
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_no_client_auth()
                .with_cert_resolver(self.resolver.clone());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        TlsAcceptor::from(Arc::new(config))
    }
}

/// Completes a server-side handshake on `stream` within [`HANDSHAKE_TIMEOUT`].
pub async fn accept<S>(acceptor: &TlsAcceptor, stream: S) -> Result<TlsStream<S>, TlsError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(TlsError::Handshake(e)),
        Err(_) => Err(TlsError::HandshakeTimeout),
    }
}

#[cfg(test)]
mod tests;
