//! Request authentication: OCI HTTP request signatures (draft-cavage "Signature" scheme,
//! RSA-SHA256), checked against public keys registered in a key file.
//!
//! # What is checked
//! The `Authorization: Signature keyId="…",algorithm="rsa-sha256",headers="…",signature="…"`
//! parameters are parsed strictly (known names, no duplicates, quoted values). The signed headers
//! must include `date` (or `x-date`), `(request-target)` and `host`; for POST, PUT and PATCH also
//! `content-length`, `content-type` and `x-content-sha256` — except PutMessages, whose body the
//! OCI SDKs deliberately do not sign (they call it with `enforce_content_headers=False`), as OCI
//! Streaming allows. Whenever `x-content-sha256` is sent, it must be the body's SHA-256. The
//! signing string is rebuilt from the request as received (method, raw path and query, header
//! values) and verified with RSASSA-PKCS1-v1_5/SHA-256 under the key registered for `keyId`; the
//! `date` must be within the configured skew of the server's clock (five minutes by default).
//!
//! # The key file
//! `<data_dir>/oci-api-keys.json` (or the configured path) is a JSON object from keyId
//! (`<tenancy>/<user>/<fingerprint>`, as the SDKs build it) to a PEM public key (`BEGIN PUBLIC
//! KEY` or `BEGIN RSA PUBLIC KEY`). It is read at start and re-read when a request names an
//! unknown keyId and the file has changed, so keys can be added without a restart. It decides
//! who may call the API, so it must not be writable or readable by group or others: one with
//! any of those permission bits is refused with an error naming it and the `chmod 600` that
//! fixes it (the rule and wording of the editor's key files, `tributary-edit`'s `steps::keys`);
//! [`write_key_file`] writes one with mode 0600.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use axum::http::{HeaderMap, Method};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rsa::RsaPublicKey;
use rsa::pkcs1::DecodeRsaPublicKey;
use rsa::pkcs8::DecodePublicKey;
use sha2::{Digest, Sha256};
use tributary_event::Clock;

use crate::error::ApiError;

/// The registered keys and where they come from.
#[derive(Debug)]
struct KeyFile {
    path: PathBuf,
    modified: Option<SystemTime>,
    keys: KeyMap,
}

/// Verifies request signatures.
#[derive(Debug, Clone)]
pub(crate) struct Verifier {
    keys: Arc<RwLock<KeyFile>>,
    clock: Arc<dyn Clock>,
    skew_ms_max: i64,
}

/// Why the API key file cannot be used. Each names the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file cannot be read.
    #[error("read the API key file {}: {source} (register keys there, or run in development mode)", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Group or others may read or write the file.
    #[error(
        "{} holds API keys but is readable by group or others (mode {mode:o}); run `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file is not a JSON object from keyId to PEM.
    #[error("{}: expected a JSON object from keyId to PEM public key: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// A key is not an RSA public key in PEM.
    #[error("{}: the key for {key_id:?} is not an RSA public key in PEM: {reason}", path.display())]
    Key {
        /// The file.
        path: PathBuf,
        /// The keyId it is registered under.
        key_id: String,
        /// What the PEM parser said.
        reason: String,
    },
}

/// Writes the API key file `path` (keyId → PEM public key, as JSON) with mode 0600, the only
/// mode the server accepts it with; an existing file's mode is set too.
pub fn write_key_file(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    std::io::Write::write_all(&mut file, contents)
}

fn read_key_file(path: &Path) -> Result<(Option<SystemTime>, KeyMap), KeyFileError> {
    let read = |source| KeyFileError::Read {
        path: path.to_owned(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(read)?;
    // The open file's own metadata: what is checked is what is read.
    let metadata = file.metadata().map_err(read)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyFileError::Exposed {
                path: path.to_owned(),
                mode,
            });
        }
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut file, &mut text).map_err(read)?;
    let modified = metadata.modified().ok();
    let entries: HashMap<String, String> =
        serde_json::from_str(&text).map_err(|source| KeyFileError::Json {
            path: path.to_owned(),
            source,
        })?;
    let mut keys = HashMap::with_capacity(entries.len());
    for (key_id, pem) in entries {
        let key = RsaPublicKey::from_public_key_pem(pem.trim())
            .or_else(|_| RsaPublicKey::from_pkcs1_pem(pem.trim()))
            .map_err(|e| KeyFileError::Key {
                path: path.to_owned(),
                key_id: key_id.clone(),
                reason: e.to_string(),
            })?;
        keys.insert(key_id, Arc::new(RsaKey::from(&key)));
    }
    Ok((modified, keys))
}

/// The registered keys by keyId.
type KeyMap = HashMap<String, Arc<RsaKey>>;

/// A registered public key, in the form `ring` verifies with: RSASSA-PKCS1-v1_5 with SHA-256 is
/// an order of magnitude cheaper in `ring` than in the `rsa` crate, which is used only to parse
/// the PEM.
#[derive(Debug)]
struct RsaKey {
    modulus: Vec<u8>,
    exponent: Vec<u8>,
}

impl From<&RsaPublicKey> for RsaKey {
    fn from(key: &RsaPublicKey) -> Self {
        use rsa::traits::PublicKeyParts;
        RsaKey {
            modulus: key.n().to_bytes_be(),
            exponent: key.e().to_bytes_be(),
        }
    }
}

impl RsaKey {
    /// Verifies an RSASSA-PKCS1-v1_5 SHA-256 signature (keys of 2048 to 8192 bits).
    fn verify(&self, message: &[u8], signature: &[u8]) -> Result<(), ring::error::Unspecified> {
        let key = ring::signature::RsaPublicKeyComponents {
            n: &self.modulus,
            e: &self.exponent,
        };
        key.verify(
            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            message,
            signature,
        )
    }
}

impl Verifier {
    /// Loads the key file; an absent or invalid file is an error at start.
    pub(crate) fn load(
        path: PathBuf,
        clock: Arc<dyn Clock>,
        skew_ms_max: i64,
    ) -> Result<Verifier, KeyFileError> {
        let (modified, keys) = read_key_file(&path)?;
        if keys.is_empty() {
            // Not a warning: most users of a hub speak AMQP and never sign an OCI request. A
            // refused request says why (see `verify`).
            tracing::info!(path = %path.display(), "no OCI API keys are registered: every signed request is refused until one is added");
        }
        tracing::info!(path = %path.display(), keys = keys.len(), "OCI request signatures required");
        Ok(Verifier {
            keys: Arc::new(RwLock::new(KeyFile {
                path,
                modified,
                keys,
            })),
            clock,
            skew_ms_max,
        })
    }

    fn key(&self, key_id: &str) -> Option<Arc<RsaKey>> {
        let found = self
            .keys
            .read()
            .expect("key file lock")
            .keys
            .get(key_id)
            .cloned();
        if found.is_some() {
            return found;
        }
        let mut file = self.keys.write().expect("key file lock");
        let modified = std::fs::metadata(&file.path)
            .and_then(|m| m.modified())
            .ok();
        if modified != file.modified {
            match read_key_file(&file.path) {
                Ok((modified, keys)) => {
                    tracing::info!(keys = keys.len(), "API key file re-read");
                    file.modified = modified;
                    file.keys = keys;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "API key file changed but cannot be read; keeping the keys loaded before")
                }
            }
        }
        file.keys.get(key_id).cloned()
    }

    /// Checks a request; returns the keyId it was signed with.
    pub(crate) fn verify(
        &self,
        method: &Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: &[u8],
        body_signed: bool,
    ) -> Result<String, ApiError> {
        let authorization = header(headers, "authorization")?.ok_or_else(|| {
            ApiError::not_authenticated("the request is not signed: it has no Authorization header")
        })?;
        let params = SignatureParams::parse(authorization)?;
        check_signed_headers(&params.headers, method, body_signed)?;
        check_body(headers, body)?;
        self.check_date(headers, &params.headers)?;
        let signing_string = signing_string(&params.headers, method, path_and_query, headers)?;
        let key = self.key(&params.key_id).ok_or_else(|| {
            ApiError::not_authenticated(format!(
                "no API key is registered for keyId {:?}",
                params.key_id
            ))
        })?;
        let signature = STANDARD
            .decode(&params.signature)
            .map_err(|_| ApiError::not_authenticated("the signature is not base64"))?;
        key.verify(signing_string.as_bytes(), &signature)
            .map_err(|_| {
                ApiError::not_authenticated(
                    "the signature does not verify with the key registered for this keyId",
                )
            })?;
        Ok(params.key_id)
    }

    fn check_date(&self, headers: &HeaderMap, signed: &[String]) -> Result<(), ApiError> {
        let name = if signed.iter().any(|h| h == "x-date") {
            "x-date"
        } else {
            "date"
        };
        let value = header(headers, name)?.ok_or_else(|| {
            ApiError::not_authenticated(format!("the signed header {name} is missing"))
        })?;
        let date = httpdate::parse_http_date(value).map_err(|_| {
            ApiError::not_authenticated(format!("the {name} header {value:?} is not an HTTP date"))
        })?;
        let date_ms = match date.duration_since(SystemTime::UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
            Err(_) => 0,
        };
        let skew = (self.clock.now_ms() - date_ms).abs();
        if skew > self.skew_ms_max {
            return Err(ApiError::not_authenticated(format!(
                "the {name} header is {skew} ms away from the server's clock; at most {} ms are allowed",
                self.skew_ms_max
            )));
        }
        Ok(())
    }
}

/// A header's value as text; a header given twice or with non-visible bytes is refused.
fn header<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::not_authenticated(format!(
            "the header {name} is given more than once"
        )));
    }
    value
        .to_str()
        .map(Some)
        .map_err(|_| ApiError::not_authenticated(format!("the header {name} is not visible ASCII")))
}

fn check_signed_headers(
    signed: &[String],
    method: &Method,
    body_signed: bool,
) -> Result<(), ApiError> {
    let has = |h: &str| signed.iter().any(|s| s == h);
    let mut required = vec!["(request-target)", "host"];
    if !has("x-date") {
        required.push("date");
    }
    let bodied = matches!(*method, Method::POST | Method::PUT | Method::PATCH);
    if bodied && body_signed {
        required.extend(["content-length", "content-type", "x-content-sha256"]);
    }
    let missing: Vec<&str> = required.into_iter().filter(|h| !has(h)).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(ApiError::not_authenticated(format!(
            "the signature must cover the headers {}",
            missing.join(", ")
        )))
    }
}

fn check_body(headers: &HeaderMap, body: &[u8]) -> Result<(), ApiError> {
    if let Some(length) = header(headers, "content-length")?
        && length.parse::<u64>().ok() != Some(body.len() as u64)
    {
        return Err(ApiError::not_authenticated(
            "content-length does not match the body",
        ));
    }
    if let Some(digest) = header(headers, "x-content-sha256")?
        && STANDARD.encode(Sha256::digest(body)) != digest
    {
        return Err(ApiError::not_authenticated(
            "x-content-sha256 does not match the body",
        ));
    }
    Ok(())
}

fn signing_string(
    signed: &[String],
    method: &Method,
    path_and_query: &str,
    headers: &HeaderMap,
) -> Result<String, ApiError> {
    let mut lines = Vec::with_capacity(signed.len());
    for name in signed {
        if name == "(request-target)" {
            lines.push(format!(
                "(request-target): {} {path_and_query}",
                method.as_str().to_ascii_lowercase()
            ));
            continue;
        }
        let value = header(headers, name)?.ok_or_else(|| {
            ApiError::not_authenticated(format!(
                "the signed header {name} is missing from the request"
            ))
        })?;
        lines.push(format!("{name}: {value}"));
    }
    Ok(lines.join("\n"))
}

/// The parameters of a `Signature` Authorization header.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SignatureParams {
    pub key_id: String,
    pub headers: Vec<String>,
    pub signature: String,
}

impl std::fmt::Debug for SignatureParams {
    // A signature is a credential for as long as its `date` is in the skew window: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignatureParams")
            .field("key_id", &self.key_id)
            .field("headers", &self.headers)
            .field("signature", &"<redacted>")
            .finish()
    }
}

impl SignatureParams {
    /// Parses `Signature name="value",name="value",…` strictly.
    pub(crate) fn parse(value: &str) -> Result<SignatureParams, ApiError> {
        let bad = |why: &str| {
            ApiError::not_authenticated(format!("malformed Authorization header: {why}"))
        };
        let rest = value
            .strip_prefix("Signature ")
            .or_else(|| value.strip_prefix("signature "))
            .ok_or_else(|| bad("the scheme must be Signature"))?;
        let mut found: HashMap<&str, &str> = HashMap::new();
        for part in split_params(rest.trim()).map_err(&bad)? {
            let (name, quoted) = part
                .split_once('=')
                .ok_or_else(|| bad("a parameter has no value"))?;
            let name = name.trim();
            let inner = quoted
                .trim()
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .ok_or_else(|| bad("a parameter value is not quoted"))?;
            if !matches!(
                name,
                "keyId" | "algorithm" | "headers" | "signature" | "version"
            ) {
                return Err(bad(&format!("unknown parameter {name:?}")));
            }
            if found.insert(name, inner).is_some() {
                return Err(bad(&format!("the parameter {name} is given twice")));
            }
        }
        if let Some(algorithm) = found.get("algorithm")
            && *algorithm != "rsa-sha256"
        {
            return Err(bad(&format!(
                "algorithm {algorithm:?} is not supported; use rsa-sha256"
            )));
        }
        if found.get("version").is_some_and(|v| *v != "1") {
            return Err(bad("only version 1 is supported"));
        }
        let required = |name: &str| {
            found
                .get(name)
                .filter(|v| !v.is_empty())
                .map(|v| (*v).to_owned())
                .ok_or_else(|| bad(&format!("the parameter {name} is missing")))
        };
        let headers: Vec<String> = required("headers")?
            .split(' ')
            .filter(|h| !h.is_empty())
            .map(str::to_ascii_lowercase)
            .collect();
        Ok(SignatureParams {
            key_id: required("keyId")?,
            headers,
            signature: required("signature")?,
        })
    }
}

/// Splits on commas outside quotes.
fn split_params(s: &str) -> Result<Vec<&str>, &'static str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted) = (0, false);
    for (i, c) in s.char_indices() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if quoted {
        return Err("an unterminated quote");
    }
    parts.push(&s[start..]);
    Ok(parts)
}

#[cfg(test)]
mod tests;
