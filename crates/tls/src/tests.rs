//! Real handshakes over loopback between a rustls client and [`ServerTls`].

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

fn hosts() -> Vec<String> {
    vec!["localhost".into(), "127.0.0.1".into()]
}

fn connector(ca: &Path) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Serves one echo connection per accepted socket; returns the address.
async fn echo_server(tls: &ServerTls) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tls.acceptor(&[]);
    tokio::spawn(async move {
        loop {
            let (socket, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut stream) = accept(&acceptor, socket).await else {
                    return;
                };
                let mut buffer = [0u8; 5];
                if stream.read_exact(&mut buffer).await.is_ok() {
                    let _ = stream.write_all(&buffer).await;
                    let _ = stream.shutdown().await;
                }
            });
        }
    });
    addr
}

/// Connects trusting `ca`, echoes five bytes; returns the server's certificate.
async fn handshake(
    addr: std::net::SocketAddr,
    ca: &Path,
) -> std::io::Result<CertificateDer<'static>> {
    let socket = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    let mut stream = connector(ca).connect(name, socket).await?;
    stream.write_all(b"hello").await?;
    let mut echoed = [0u8; 5];
    stream.read_exact(&mut echoed).await?;
    assert_eq!(&echoed, b"hello");
    let (_, session) = stream.get_ref();
    Ok(session.peer_certificates().unwrap()[0].clone().into_owned())
}

fn file_certificate(path: &Path) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(path).unwrap()
}

#[tokio::test]
async fn a_client_trusting_the_development_authority_connects_and_another_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = write_development_certificates(dir.path(), &hosts()).unwrap();
    assert!(certs.created_authority);
    let tls = ServerTls::from_pem_files(&certs.server_cert, &certs.server_key).unwrap();
    let addr = echo_server(&tls).await;
    let served = handshake(addr, &certs.ca_cert).await.unwrap();
    assert_eq!(served, file_certificate(&certs.server_cert));

    let other = tempfile::tempdir().unwrap();
    let stranger = write_development_certificates(other.path(), &hosts()).unwrap();
    let refused = handshake(addr, &stranger.ca_cert).await.unwrap_err();
    assert!(refused.to_string().contains("UnknownIssuer"), "{refused}");
}

#[test]
fn keys_are_written_for_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let certs = write_development_certificates(dir.path(), &hosts()).unwrap();
    for key in [dir.path().join("ca-key.pem"), certs.server_key] {
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{} is mode {mode:o}", key.display());
    }
}

#[test]
fn a_key_of_another_certificate_or_a_file_that_is_not_pem_is_refused_by_name() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = write_development_certificates(a.path(), &hosts()).unwrap();
    let second = write_development_certificates(b.path(), &hosts()).unwrap();
    let mismatch = ServerTls::from_pem_files(&first.server_cert, &second.server_key).unwrap_err();
    assert!(
        matches!(mismatch, TlsError::KeyMismatch { .. }),
        "{mismatch}"
    );

    let garbage = a.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let error = ServerTls::from_pem_files(&garbage, &first.server_key).unwrap_err();
    assert!(error.to_string().contains("garbage.pem"), "{error}");
    let missing =
        ServerTls::from_pem_files(&a.path().join("nope.pem"), &first.server_key).unwrap_err();
    assert!(matches!(missing, TlsError::Read { .. }), "{missing}");
}

#[tokio::test]
async fn a_renewed_certificate_serves_the_next_handshakes_and_a_broken_one_is_not_taken() {
    let dir = tempfile::tempdir().unwrap();
    let first = write_development_certificates(dir.path(), &hosts()).unwrap();
    let tls = ServerTls::from_pem_files(&first.server_cert, &first.server_key).unwrap();
    let addr = echo_server(&tls).await;
    let before = handshake(addr, &first.ca_cert).await.unwrap();

    // Re-issued by the same authority: trusted as before, and served once noticed.
    let renewed = write_development_certificates(dir.path(), &hosts()).unwrap();
    assert!(!renewed.created_authority);
    let expected = file_certificate(&renewed.server_cert);
    assert_ne!(before, expected);
    tokio::time::sleep(RELOAD_CHECK_INTERVAL + std::time::Duration::from_millis(100)).await;
    assert_eq!(handshake(addr, &first.ca_cert).await.unwrap(), expected);

    // A key that does not match is not taken: the renewed pair goes on serving.
    let other = tempfile::tempdir().unwrap();
    let stranger = write_development_certificates(other.path(), &hosts()).unwrap();
    std::fs::copy(&stranger.server_key, &renewed.server_key).unwrap();
    tokio::time::sleep(RELOAD_CHECK_INTERVAL + std::time::Duration::from_millis(100)).await;
    assert_eq!(handshake(addr, &first.ca_cert).await.unwrap(), expected);
}

#[tokio::test]
async fn a_silent_peer_is_dropped_after_the_handshake_deadline() {
    tokio::time::pause();
    let dir = tempfile::tempdir().unwrap();
    let certs = write_development_certificates(dir.path(), &hosts()).unwrap();
    let tls = ServerTls::from_pem_files(&certs.server_cert, &certs.server_key).unwrap();
    let (server_side, _client_side) = tokio::io::duplex(1024);
    let outcome = accept(&tls.acceptor(&[]), server_side).await;
    assert!(matches!(outcome, Err(TlsError::HandshakeTimeout)));
}
