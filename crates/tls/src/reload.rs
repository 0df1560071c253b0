//! The certificate a handshake gets: loaded from PEM files, and loaded again when they change.
//!
//! A change is noticed by the files' modification times and sizes, looked at no more than once
//! per [`RELOAD_CHECK_INTERVAL`](crate::RELOAD_CHECK_INTERVAL) and only when a handshake asks:
//! an idle server does no work, and a busy one one `stat` pair a second.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::{RELOAD_CHECK_INTERVAL, TlsError};

/// What identifies one version of the two files: each one's modification time and size.
type FilesStamp = [(Option<SystemTime>, u64); 2];

#[derive(Debug)]
pub(crate) struct ReloadingResolver {
    cert_path: PathBuf,
    key_path: PathBuf,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    current: Arc<CertifiedKey>,
    /// The files as they were when last looked at (loaded or not).
    stamp: FilesStamp,
    checked_at: Instant,
}

impl ReloadingResolver {
    pub(crate) fn load(cert_path: &Path, key_path: &Path) -> Result<ReloadingResolver, TlsError> {
        let stamp = stamp(cert_path, key_path);
        let current = load_pair(cert_path, key_path)?;
        Ok(ReloadingResolver {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            state: Mutex::new(State {
                current,
                stamp,
                checked_at: Instant::now(),
            }),
        })
    }

    /// The pair to serve, reloaded first if the files changed since they were last looked at.
    fn current(&self) -> Arc<CertifiedKey> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.checked_at.elapsed() >= RELOAD_CHECK_INTERVAL {
            state.checked_at = Instant::now();
            let stamp = stamp(&self.cert_path, &self.key_path);
            if stamp != state.stamp {
                // Remember this version even when it does not load, so a broken pair is
                // reported once, not at every handshake; its next change is tried again.
                state.stamp = stamp;
                match load_pair(&self.cert_path, &self.key_path) {
                    Ok(pair) => {
                        tracing::info!(cert = %self.cert_path.display(), "TLS certificate reloaded");
                        state.current = pair;
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        "the changed TLS certificate or key does not load; still serving the previous one"
                    ),
                }
            }
        }
        state.current.clone()
    }
}

impl ResolvesServerCert for ReloadingResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn stamp(cert_path: &Path, key_path: &Path) -> FilesStamp {
    let one = |path: &Path| match std::fs::metadata(path) {
        Ok(meta) => (meta.modified().ok(), meta.len()),
        Err(_) => (None, 0),
    };
    [one(cert_path), one(key_path)]
}

/// Reads and checks a certificate chain and its key.
fn load_pair(cert_path: &Path, key_path: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let certs = read_certificates(cert_path)?;
    let key = read_key(key_path)?;
    let signing_key =
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| TlsError::Pem {
            path: key_path.to_owned(),
            reason: format!("the private key cannot sign: {e}"),
        })?;
    let pair = CertifiedKey::new(certs, signing_key);
    pair.keys_match().map_err(|_| TlsError::KeyMismatch {
        cert: cert_path.to_owned(),
        key: key_path.to_owned(),
    })?;
    Ok(Arc::new(pair))
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            reason: format!("not a PEM certificate chain: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            reason: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Pem {
        path: path.to_owned(),
        reason: format!("no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
    })
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}
