//! TLS for `sb://` and `amqps://` endpoints: rustls with the ring provider and the Mozilla root
//! certificates (webpki-roots), the same trust store on every machine, plus the authorities of a
//! PEM file the application names (`ClientOptions::trusted_certificates`).
//!
//! Event Hubs expects TLS straight away on port 5671 (no AMQP TLS protocol header), so the AMQP
//! connection is opened as plain `amqp` over the TLS stream.

/// Why a TLS connection could not be set up: a sentence for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

#[cfg(feature = "tls")]
mod enabled {
    use super::TlsError;
    use std::path::Path;
    use std::sync::{Arc, OnceLock};

    use tokio::net::TcpStream;
    use tokio_rustls::TlsConnector;
    use tokio_rustls::client::TlsStream;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto};

    /// The Mozilla roots, and the authorities in `extra` (a PEM file) when given. The roots
    /// alone are built once; a configuration with extra authorities is built per connection,
    /// so a renewed file is read on the next connect.
    fn config(extra: Option<&Path>) -> Result<Arc<ClientConfig>, TlsError> {
        static DEFAULT: OnceLock<Result<Arc<ClientConfig>, TlsError>> = OnceLock::new();
        match extra {
            None => DEFAULT.get_or_init(|| build(None)).clone(),
            Some(path) => build(Some(path)),
        }
    }

    fn build(extra: Option<&Path>) -> Result<Arc<ClientConfig>, TlsError> {
        let mut roots = RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(path) = extra {
            let unreadable = |e: &dyn std::fmt::Display| {
                TlsError(format!(
                    "cannot read the trusted certificates in {}: {e}",
                    path.display()
                ))
            };
            let certificates = CertificateDer::pem_file_iter(path)
                .map_err(|e| unreadable(&e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| unreadable(&e))?;
            if certificates.is_empty() {
                return Err(unreadable(&"no CERTIFICATE block"));
            }
            for certificate in certificates {
                roots.add(certificate).map_err(|e| unreadable(&e))?;
            }
        }
        // The provider is named explicitly: other crates in the process may enable another
        // one, which would make the process-wide default ambiguous.
        let provider = Arc::new(crypto::ring::default_provider());
        ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map(|builder| Arc::new(builder.with_root_certificates(roots).with_no_client_auth()))
            .map_err(|e| TlsError(format!("TLS could not be configured: {e}")))
    }

    /// The handshake: `Err` when it cannot start (a bad name, an unreadable file), `Ok(Err)`
    /// when it fails.
    async fn handshake(
        tcp: TcpStream,
        host: &str,
        trusted: Option<&Path>,
    ) -> Result<std::io::Result<TlsStream<TcpStream>>, TlsError> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| TlsError(format!("{host:?} is not a valid TLS server name: {e}")))?;
        Ok(TlsConnector::from(config(trusted)?)
            .connect(name, tcp)
            .await)
    }

    /// Wraps `tcp` in TLS, verifying the server's certificate for `host` against the trust
    /// store of the AMQP connections: the Mozilla roots and the authorities in `trusted` (a
    /// PEM file). For a hub's other TLS doors, such as its HTTPS admin API.
    ///
    /// # Errors
    ///
    /// An invalid server name, an unreadable `trusted` file, or a failed handshake (an
    /// untrusted certificate, for instance).
    pub async fn tls_handshake(
        tcp: TcpStream,
        host: &str,
        trusted: Option<&Path>,
    ) -> Result<TlsStream<TcpStream>, TlsError> {
        handshake(tcp, host, trusted)
            .await?
            .map_err(|e| TlsError(format!("TLS handshake failed: {e}")))
    }

    /// [`tls_handshake`] for an AMQP connection: a failed handshake says what to do.
    pub(crate) async fn connect(
        tcp: TcpStream,
        host: &str,
        trusted: Option<&Path>,
    ) -> Result<TlsStream<TcpStream>, TlsError> {
        handshake(tcp, host, trusted).await?.map_err(|e| {
            TlsError(format!(
                "TLS handshake failed: {e}; a hub whose certificate comes from its own authority (`tributary cert`) needs that authority trusted (ClientOptions::with_trusted_certificates, `tributary --ca-file`); a hub that speaks plain AMQP (a local Tributary hub without a certificate, the emulator) needs UseDevelopmentEmulator=true in the connection string"
            ))
        })
    }
}

#[cfg(feature = "tls")]
pub(crate) use enabled::connect;
#[cfg(feature = "tls")]
pub use enabled::tls_handshake;

/// Without the `tls` feature every TLS endpoint is refused with a clear reason.
#[cfg(not(feature = "tls"))]
pub(crate) async fn connect(
    _tcp: tokio::net::TcpStream,
    _host: &str,
    _trusted: Option<&std::path::Path>,
) -> Result<tokio::net::TcpStream, TlsError> {
    Err(TlsError("this build of tributary-client has no TLS support (the `tls` feature is off); use UseDevelopmentEmulator=true or an amqp:// endpoint for plain TCP".to_owned()))
}
