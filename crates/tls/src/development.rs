//! A local certificate authority and a server certificate it signs, for development and tests.
//!
//! [`write_development_certificates`] writes four PEM files into a directory: `ca.pem` (the
//! authority's certificate: what a client is told to trust, e.g. the Python SDK's
//! `connection_verify`), `ca-key.pem`, `server.pem` and `server-key.pem` (what
//! `tributary serve --tls-cert/--tls-key` takes). Keys are written readable by their owner only
//! (mode 0600). When the directory already holds an authority, it signs the new server
//! certificate, so clients that trust it keep trusting the server after a re-issue.

use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::TlsError;

/// The start of the authority's name; the rest is drawn from its key (see [`authority_params`]).
const AUTHORITY_NAME: &str = "Tributary development CA";

/// How long a server certificate is valid: 825 days, the longest that every major client
/// platform accepts for a server certificate.
const SERVER_VALIDITY_DAYS: i64 = 825;

/// Where [`write_development_certificates`] put its files.
#[derive(Debug, Clone)]
pub struct DevelopmentCertificates {
    /// The authority's certificate: what clients trust.
    pub ca_cert: PathBuf,
    /// The server's certificate, signed by the authority.
    pub server_cert: PathBuf,
    /// The server's private key.
    pub server_key: PathBuf,
    /// Whether a new authority was made (false: the one already in the directory signed).
    pub created_authority: bool,
}

/// Writes a server certificate for `hosts` (DNS names or IP addresses) into `dir`, signed by
/// the authority in `dir` (made first if there is none).
pub fn write_development_certificates(
    dir: &Path,
    hosts: &[String],
) -> Result<DevelopmentCertificates, TlsError> {
    std::fs::create_dir_all(dir).map_err(|source| TlsError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let ca_cert = dir.join("ca.pem");
    let ca_key_path = dir.join("ca-key.pem");
    let existing = ca_cert.exists() && ca_key_path.exists();
    let ca_key = if existing {
        let pem = std::fs::read_to_string(&ca_key_path).map_err(|source| TlsError::Read {
            path: ca_key_path.clone(),
            source,
        })?;
        KeyPair::from_pem(&pem)?
    } else {
        KeyPair::generate()?
    };
    let authority = authority_params(&ca_key)?;
    if !existing {
        let certificate = authority.self_signed(&ca_key)?;
        write(&ca_cert, certificate.pem().as_bytes(), false)?;
        write(&ca_key_path, ca_key.serialize_pem().as_bytes(), true)?;
    }
    let issuer = Issuer::new(authority, ca_key);
    let server_key = KeyPair::generate()?;
    let certificate = server_params(hosts)?.signed_by(&server_key, &issuer)?;
    let server_cert = dir.join("server.pem");
    let server_key_path = dir.join("server-key.pem");
    write(&server_cert, certificate.pem().as_bytes(), false)?;
    write(
        &server_key_path,
        server_key.serialize_pem().as_bytes(),
        true,
    )?;
    Ok(DevelopmentCertificates {
        ca_cert,
        server_cert,
        server_key: server_key_path,
        created_authority: !existing,
    })
}

/// The authority's certificate parameters. Its name ends with a fingerprint of its key: two
/// authorities made on different machines have different names (a client told to trust one
/// looks the other up by name and finds nothing), and the same key always gives the same name,
/// so an issuer re-created from the key matches the certificate clients already trust.
fn authority_params(key: &KeyPair) -> Result<CertificateParams, TlsError> {
    let digest = ring::digest::digest(&ring::digest::SHA256, key.public_key_raw());
    let fingerprint: String = digest.as_ref()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(
        DnType::CommonName,
        format!("{AUTHORITY_NAME} {fingerprint}"),
    );
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

fn server_params(hosts: &[String]) -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::new(hosts.to_vec())?;
    let first = hosts.first().map_or("localhost", String::as_str);
    params.distinguished_name.push(DnType::CommonName, first);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::days(1);
    params.not_after = now + time::Duration::days(SERVER_VALIDITY_DAYS);
    Ok(params)
}

/// Writes `contents` to `path` atomically (a temporary file renamed over it), readable by the
/// owner only when `secret`.
fn write(path: &Path, contents: &[u8], secret: bool) -> Result<(), TlsError> {
    use std::os::unix::fs::OpenOptionsExt;
    let error = |source| TlsError::Write {
        path: path.to_owned(),
        source,
    };
    let temporary = path.with_extension("pem.tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if secret {
        options.mode(0o600);
    }
    let mut file = options.open(&temporary).map_err(error)?;
    file.write_all(contents).map_err(error)?;
    file.sync_all().map_err(error)?;
    std::fs::rename(&temporary, path).map_err(error)
}
