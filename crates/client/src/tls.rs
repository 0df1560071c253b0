//! TLS for `sb://` and `amqps://` endpoints: rustls with the ring provider and the Mozilla root
//! certificates (webpki-roots), the same trust store on every machine.
//!
//! Event Hubs expects TLS straight away on port 5671 (no AMQP TLS protocol header), so the AMQP
//! connection is opened as plain `amqp` over the TLS stream.

/// Why a TLS connection could not be set up: a sentence for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct TlsError(String);

#[cfg(feature = "tls")]
mod enabled {
    use super::TlsError;
    use std::sync::{Arc, OnceLock};

    use tokio::net::TcpStream;
    use tokio_rustls::TlsConnector;
    use tokio_rustls::client::TlsStream;
    use tokio_rustls::rustls::pki_types::ServerName;
    use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto};

    fn config() -> Result<Arc<ClientConfig>, TlsError> {
        static CONFIG: OnceLock<Result<Arc<ClientConfig>, TlsError>> = OnceLock::new();
        CONFIG
            .get_or_init(|| {
                let mut roots = RootCertStore::empty();
                roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
                // The provider is named explicitly: other crates in the process may enable
                // another one, which would make the process-wide default ambiguous.
                let provider = Arc::new(crypto::ring::default_provider());
                ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map(|builder| {
                        Arc::new(builder.with_root_certificates(roots).with_no_client_auth())
                    })
                    .map_err(|e| TlsError(format!("TLS could not be configured: {e}")))
            })
            .clone()
    }

    /// Wraps `tcp` in TLS, verifying the server's certificate for `host`.
    pub(crate) async fn connect(
        tcp: TcpStream,
        host: &str,
    ) -> Result<TlsStream<TcpStream>, TlsError> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| TlsError(format!("{host:?} is not a valid TLS server name: {e}")))?;
        TlsConnector::from(config()?)
            .connect(name, tcp)
            .await
            .map_err(|e| {
                TlsError(format!(
                    "TLS handshake failed: {e}; if the hub speaks plain AMQP (a local Tributary hub, the emulator), add UseDevelopmentEmulator=true to the connection string"
                ))
            })
    }
}

#[cfg(feature = "tls")]
pub(crate) use enabled::connect;

/// Without the `tls` feature every TLS endpoint is refused with a clear reason.
#[cfg(not(feature = "tls"))]
pub(crate) async fn connect(
    _tcp: tokio::net::TcpStream,
    _host: &str,
) -> Result<tokio::net::TcpStream, TlsError> {
    Err(TlsError("this build of tributary-client has no TLS support (the `tls` feature is off); use UseDevelopmentEmulator=true or an amqp:// endpoint for plain TCP".to_owned()))
}
