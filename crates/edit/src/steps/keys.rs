//! Key material for the cryptographic steps (encrypt and decrypt, sign and verify, attest,
//! chain): where a key comes from, how its text is read, and the key id written next to what
//! it protects so a consumer can pick the right key while keys rotate.
//!
//! A step names its key with exactly one of
//!
//! - `key_file = "keys/sign.key"`: a file, relative to the task file's directory; a secret key
//!   file readable by group or others (unix mode `& 0o077 != 0`) is refused (`chmod 600`);
//! - `key_env = "TRIBUTARY_SIGN_KEY"`: an environment variable holding the same text;
//!
//! and optionally `key_id = "2024-05"` (default: the first 8 bytes of SHA-256 of the key — the
//! public key for Ed25519 — in hex, so both ends derive the same id from the same key).
//! Steps that check (decrypt, verify) take one key that way, or several for rotation:
//! `keys = [{ key_file = "new.key" }, { key_env = "OLD_KEY", key_id = "2023" }]`.
//!
//! Accepted forms:
//!
//! - AES-256 keys (exactly 32 bytes) and HMAC-SHA256 keys (at least 32 bytes): text, trimmed,
//!   in hex (an even number of hex digits and nothing else) or else standard base64 (padding
//!   optional) — `openssl rand -base64 32` writes one;
//! - Ed25519 private keys: PKCS#8 as PEM (`-----BEGIN PRIVATE KEY-----`, what
//!   `openssl genpkey -algorithm ed25519` writes), as DER, or as DER in base64 text;
//! - Ed25519 public keys (to verify): SPKI PEM (`-----BEGIN PUBLIC KEY-----`, what
//!   `openssl pkey -pubout` writes) or the raw 32 bytes (or the SPKI DER) in base64.
//!
//! # Guarantees
//!
//! - Keys are read and checked when the step is compiled; a task with a bad key never starts.
//! - Key bytes never appear in an error, a log line or a `Debug` output: messages name the
//!   file or variable and what is wrong (a length, a form), never the content.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::{DecodePaddingMode, general_purpose};
use ring::signature::{self, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use ring::{aead, digest, hmac};
use serde::Deserialize;

use crate::spec::{CompileContext, SpecError};

/// The longest key file read: a PEM key is under 1 KiB and a symmetric key under 100 bytes, so
/// 64 KiB only stops a path that names some large file by mistake from being read whole.
pub const KEY_FILE_BYTES_MAX: u64 = 64 * 1024;

/// AES-256 takes exactly 32 bytes of key.
pub const AES_256_KEY_BYTES: usize = 32;

/// HMAC-SHA256 keys shorter than the hash output (32 bytes) weaken it (RFC 2104 section 3).
pub const HMAC_KEY_BYTES_MIN: usize = 32;

/// The longest key id: ids travel in every event's properties, and 64 characters hold a date,
/// a purpose and a version with room to spare.
pub const KEY_ID_CHARS_MAX: usize = 64;

/// The default key id is this many bytes of SHA-256 of the key, in hex: 64 bits tell the keys
/// in a rotation apart, and a truncated hash says nothing usable about the key.
const KEY_ID_DEFAULT_BYTES: usize = 8;

/// The length of an Ed25519 public key.
pub const ED25519_PUBLIC_KEY_BYTES: usize = 32;

/// The DER an Ed25519 SubjectPublicKeyInfo starts with (RFC 8410): SEQUENCE { SEQUENCE { OID
/// 1.3.101.112 }, BIT STRING (33 bytes, no unused bits) }, then the 32 key bytes.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// Standard base64 that also reads text whose `=` padding was left off.
const BASE64_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Where one key comes from: exactly one of `key_file` and `key_env`, and its id.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySource {
    /// A file holding the key, relative to the task file's directory.
    pub key_file: Option<PathBuf>,
    /// An environment variable holding the key.
    pub key_env: Option<String>,
    /// The key's id (default: derived from the key).
    pub key_id: Option<String>,
}

impl KeySource {
    /// Whether none of the keys is given.
    pub fn is_empty(&self) -> bool {
        self.key_file.is_none() && self.key_env.is_none() && self.key_id.is_none()
    }
}

/// A signature algorithm (`sign`, `verify`, `attest`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Algorithm {
    /// HMAC-SHA256 with a shared secret.
    #[serde(rename = "hmac-sha256")]
    HmacSha256,
    /// Ed25519: signed with a private key, checked with the public key.
    #[serde(rename = "ed25519")]
    Ed25519,
}

impl Algorithm {
    /// The name written in events and task files.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::HmacSha256 => "hmac-sha256",
            Algorithm::Ed25519 => "ed25519",
        }
    }
}

/// An AES-256-GCM key and its id.
pub struct EncryptionKey {
    id: String,
    key: aead::LessSafeKey,
}

impl fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncryptionKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl EncryptionKey {
    /// A key of exactly 32 bytes, with `id` (default: derived from the key).
    pub fn new(id: Option<&str>, bytes: &[u8]) -> Result<EncryptionKey, String> {
        if bytes.len() != AES_256_KEY_BYTES {
            return Err(format!(
                "is {} bytes; an AES-256 key is exactly {AES_256_KEY_BYTES} (generate one with \
                 `openssl rand -base64 32`)",
                bytes.len()
            ));
        }
        let unbound = aead::UnboundKey::new(&aead::AES_256_GCM, bytes)
            .map_err(|_| "is not a usable AES-256 key".to_owned())?;
        Ok(EncryptionKey {
            id: key_id(id, bytes)?,
            key: aead::LessSafeKey::new(unbound),
        })
    }

    /// The key's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn aead(&self) -> &aead::LessSafeKey {
        &self.key
    }
}

/// An HMAC-SHA256 key and its id (signs and checks).
#[derive(Clone)]
pub struct HmacKey {
    id: String,
    key: hmac::Key,
}

impl fmt::Debug for HmacKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HmacKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl HmacKey {
    /// A key of at least 32 bytes, with `id` (default: derived from the key).
    pub fn new(id: Option<&str>, bytes: &[u8]) -> Result<HmacKey, String> {
        if bytes.len() < HMAC_KEY_BYTES_MIN {
            return Err(format!(
                "is {} bytes; an HMAC-SHA256 key needs at least {HMAC_KEY_BYTES_MIN} (generate \
                 one with `openssl rand -base64 32`)",
                bytes.len()
            ));
        }
        Ok(HmacKey {
            id: key_id(id, bytes)?,
            key: hmac::Key::new(hmac::HMAC_SHA256, bytes),
        })
    }

    /// The key's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn key(&self) -> &hmac::Key {
        &self.key
    }
}

/// A key that signs (`sign`, `attest`).
pub enum SigningKey {
    /// A shared HMAC-SHA256 secret.
    Hmac(HmacKey),
    /// An Ed25519 private key and its id.
    Ed25519 {
        /// The key's id.
        id: String,
        /// The key pair.
        pair: Ed25519KeyPair,
    },
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("algorithm", &self.algorithm())
            .field("id", &self.id())
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// An Ed25519 key from PKCS#8 DER (v1, as OpenSSL writes, or v2, as ring does).
    pub fn ed25519(id: Option<&str>, pkcs8_der: &[u8]) -> Result<SigningKey, String> {
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(pkcs8_der)
            .map_err(|e| format!("is not an Ed25519 PKCS#8 private key ({e})"))?;
        let id = key_id(id, pair.public_key().as_ref())?;
        Ok(SigningKey::Ed25519 { id, pair })
    }

    /// The algorithm the key signs with.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            SigningKey::Hmac(_) => Algorithm::HmacSha256,
            SigningKey::Ed25519 { .. } => Algorithm::Ed25519,
        }
    }

    /// The key's id.
    pub fn id(&self) -> &str {
        match self {
            SigningKey::Hmac(key) => key.id(),
            SigningKey::Ed25519 { id, .. } => id,
        }
    }

    /// The signature (HMAC tag or Ed25519 signature) of `message`, in standard base64.
    pub fn sign_base64(&self, message: &[u8]) -> String {
        match self {
            SigningKey::Hmac(key) => STANDARD.encode(hmac::sign(&key.key, message)),
            SigningKey::Ed25519 { pair, .. } => STANDARD.encode(pair.sign(message)),
        }
    }

    /// The key that checks this key's signatures (the same secret for HMAC, the public key for
    /// Ed25519), with the same id.
    pub fn verifying_key(&self) -> VerifyingKey {
        match self {
            SigningKey::Hmac(key) => VerifyingKey::Hmac(key.clone()),
            SigningKey::Ed25519 { id, pair } => {
                let mut public = [0u8; ED25519_PUBLIC_KEY_BYTES];
                public.copy_from_slice(pair.public_key().as_ref());
                VerifyingKey::Ed25519 {
                    id: id.clone(),
                    public: UnparsedPublicKey::new(&signature::ED25519, public),
                }
            }
        }
    }
}

/// A key that checks signatures (`verify`, attestation checks).
#[derive(Clone)]
pub enum VerifyingKey {
    /// A shared HMAC-SHA256 secret.
    Hmac(HmacKey),
    /// An Ed25519 public key and its id.
    Ed25519 {
        /// The key's id.
        id: String,
        /// The public key.
        public: UnparsedPublicKey<[u8; ED25519_PUBLIC_KEY_BYTES]>,
    },
}

impl fmt::Debug for VerifyingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VerifyingKey")
            .field("algorithm", &self.algorithm())
            .field("id", &self.id())
            .finish_non_exhaustive()
    }
}

impl VerifyingKey {
    /// An Ed25519 public key from its raw 32 bytes.
    pub fn ed25519(id: Option<&str>, public: &[u8]) -> Result<VerifyingKey, String> {
        let public: [u8; ED25519_PUBLIC_KEY_BYTES] = public.try_into().map_err(|_| {
            format!(
                "is {} bytes; an Ed25519 public key is {ED25519_PUBLIC_KEY_BYTES}",
                public.len()
            )
        })?;
        Ok(VerifyingKey::Ed25519 {
            id: key_id(id, &public)?,
            public: UnparsedPublicKey::new(&signature::ED25519, public),
        })
    }

    /// The algorithm of the signatures the key checks.
    pub fn algorithm(&self) -> Algorithm {
        match self {
            VerifyingKey::Hmac(_) => Algorithm::HmacSha256,
            VerifyingKey::Ed25519 { .. } => Algorithm::Ed25519,
        }
    }

    /// The key's id.
    pub fn id(&self) -> &str {
        match self {
            VerifyingKey::Hmac(key) => key.id(),
            VerifyingKey::Ed25519 { id, .. } => id,
        }
    }

    /// Whether `signature` is this key's signature of `message` (HMAC compared in constant
    /// time).
    pub fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        match self {
            VerifyingKey::Hmac(key) => hmac::verify(&key.key, message, signature).is_ok(),
            VerifyingKey::Ed25519 { public, .. } => public.verify(message, signature).is_ok(),
        }
    }
}

/// Several keys told apart by id (a rotation: the new key and the ones still in use).
#[derive(Debug)]
pub struct KeyRing<K> {
    keys: Vec<(String, K)>,
}

impl<K> KeyRing<K> {
    /// The key with id `id`.
    pub fn find(&self, id: &str) -> Option<&K> {
        self.keys.iter().find(|(k, _)| k == id).map(|(_, key)| key)
    }

    /// The ids, comma-separated, for messages.
    pub fn ids(&self) -> String {
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        ids.join(", ")
    }
}

/// The id `given`, checked, or the default derived from `key` (the public key for Ed25519).
fn key_id(given: Option<&str>, key: &[u8]) -> Result<String, String> {
    match given {
        Some(id) => check_key_id(id).map(|()| id.to_owned()),
        None => Ok(default_key_id(key)),
    }
}

/// The default id of `key`: the first 8 bytes of its SHA-256, in hex.
pub fn default_key_id(key: &[u8]) -> String {
    hex(&digest::digest(&digest::SHA256, key).as_ref()[..KEY_ID_DEFAULT_BYTES])
}

fn check_key_id(id: &str) -> Result<(), String> {
    let fits = !id.is_empty()
        && id.chars().count() <= KEY_ID_CHARS_MAX
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'));
    if fits {
        Ok(())
    } else {
        Err(format!(
            "key id {id:?} must be 1 to {KEY_ID_CHARS_MAX} letters, digits, '.', '_', ':' or '-'"
        ))
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        text.push(char::from(DIGITS[usize::from(b >> 4)]));
        text.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    text
}

/// Key text read from a file or a variable, with the spec key it came from (for errors).
struct Material {
    bytes: Vec<u8>,
    key: String,
}

impl Material {
    fn error(&self, message: impl fmt::Display) -> SpecError {
        SpecError::at(&self.key, message.to_string())
    }
}

/// Reads the key text `source` names; `at` prefixes the spec keys in errors (`keys[1].`);
/// a secret's file must be private.
fn read(
    source: &KeySource,
    at: &str,
    secret: bool,
    context: &CompileContext,
) -> Result<Material, SpecError> {
    match (&source.key_file, &source.key_env) {
        (Some(file), None) => {
            let key = format!("{at}key_file");
            let bytes = read_key_file(&context.path(file), secret)
                .map_err(|message| SpecError::at(&key, message))?;
            Ok(Material { bytes, key })
        }
        (None, Some(var)) => {
            let key = format!("{at}key_env");
            let text = (context.env)(var).ok_or_else(|| {
                SpecError::at(&key, format!("the environment variable {var} is not set"))
            })?;
            Ok(Material {
                bytes: text.into_bytes(),
                key,
            })
        }
        _ => Err(SpecError::at(
            &format!("{at}key_file"),
            "give exactly one of key_file (a file holding the key) and key_env (an environment \
             variable holding it)",
        )),
    }
}

fn read_key_file(path: &Path, secret: bool) -> Result<Vec<u8>, String> {
    let shown = path.display();
    let meta = fs::metadata(path).map_err(|e| format!("cannot read {shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{shown} is not a file"));
    }
    if meta.len() > KEY_FILE_BYTES_MAX {
        return Err(format!(
            "{shown} is {} bytes, more than any key file ({KEY_FILE_BYTES_MAX}); is it the \
             right file?",
            meta.len()
        ));
    }
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "{shown} holds a secret key but is readable by group or others (mode {mode:o}); \
                 run `chmod 600 {shown}`"
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = secret;
    fs::read(path).map_err(|e| format!("cannot read {shown}: {e}"))
}

/// Decodes symmetric key text: hex when it is an even number of hex digits, base64 otherwise.
fn decode_text(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| "is not text: write the key in base64 or hex".to_owned())?
        .trim();
    if text.is_empty() {
        return Err("is empty".to_owned());
    }
    if text.len() % 2 == 0 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(text
            .as_bytes()
            .chunks(2)
            .map(|pair| (hex_digit(pair[0]) << 4) | hex_digit(pair[1]))
            .collect());
    }
    // The decoder's error names the offending byte, which is key material: say only what is
    // accepted.
    BASE64_LENIENT.decode(text).map_err(|_| {
        "is neither hex nor base64 text (generate a key with `openssl rand -base64 32`)".to_owned()
    })
}

fn hex_digit(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        b'A'..=b'F' => b - b'A' + 10,
        _ => 0,
    }
}

/// The DER inside the PEM block labelled `label` in `text`.
///
/// By hand: PEM is a header line, base64 and a footer line, and no PEM crate is in the tree.
fn pem_block(text: &str, label: &str) -> Result<Vec<u8>, String> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let Some(start) = text.find(&begin) else {
        let found = text
            .lines()
            .find(|line| line.starts_with("-----BEGIN"))
            .unwrap_or("no PEM header");
        return Err(format!("holds {found}; expected a {begin} block"));
    };
    let rest = &text[start + begin.len()..];
    let stop = rest
        .find(&end)
        .ok_or_else(|| format!("has {begin} but no {end}"))?;
    let inner: String = rest[..stop]
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    STANDARD
        .decode(inner)
        .map_err(|_| format!("has a {label} block that is not base64"))
}

/// The PEM text of `bytes`, when they are text with a PEM header.
fn as_pem(bytes: &[u8]) -> Option<&str> {
    std::str::from_utf8(bytes)
        .ok()
        .filter(|text| text.contains("-----BEGIN"))
}

/// PKCS#8 DER from PEM, DER, or base64 text of DER.
fn private_key_der(bytes: &[u8]) -> Result<Vec<u8>, String> {
    if let Some(text) = as_pem(bytes) {
        return pem_block(text, "PRIVATE KEY");
    }
    // A DER SEQUENCE starts with 0x30; text would start with a base64 letter.
    if bytes.first() == Some(&0x30) {
        return Ok(bytes.to_vec());
    }
    decode_text(bytes).map_err(|_| {
        "is not an Ed25519 private key: write PKCS#8 PEM (`openssl genpkey -algorithm \
         ed25519`), DER, or DER in base64"
            .to_owned()
    })
}

/// The raw 32-byte Ed25519 public key from SPKI PEM, or base64 text of the raw key or SPKI DER.
fn public_key_raw(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let der = match as_pem(bytes) {
        Some(text) => pem_block(text, "PUBLIC KEY")?,
        None => decode_text(bytes)?,
    };
    if der.len() == ED25519_PUBLIC_KEY_BYTES {
        return Ok(der);
    }
    der.strip_prefix(&ED25519_SPKI_PREFIX[..])
        .filter(|raw| raw.len() == ED25519_PUBLIC_KEY_BYTES)
        .map(<[u8]>::to_vec)
        .ok_or_else(|| {
            "is not an Ed25519 public key: write SPKI PEM (`openssl pkey -in key.pem -pubout`) \
             or the 32 raw bytes in base64"
                .to_owned()
        })
}

/// Reads the AES-256 key `source` names (`at`: the spec key prefix for errors).
pub fn load_encryption_key(
    source: &KeySource,
    at: &str,
    context: &CompileContext,
) -> Result<EncryptionKey, SpecError> {
    let material = read(source, at, true, context)?;
    let bytes = decode_text(&material.bytes).map_err(|e| material.error(e))?;
    EncryptionKey::new(source.key_id.as_deref(), &bytes).map_err(|e| material.error(e))
}

/// Reads the HMAC-SHA256 key `source` names.
pub fn load_hmac_key(
    source: &KeySource,
    at: &str,
    context: &CompileContext,
) -> Result<HmacKey, SpecError> {
    let material = read(source, at, true, context)?;
    let bytes = decode_text(&material.bytes).map_err(|e| material.error(e))?;
    HmacKey::new(source.key_id.as_deref(), &bytes).map_err(|e| material.error(e))
}

/// Reads the signing key `source` names for `algorithm`.
pub fn load_signing_key(
    algorithm: Algorithm,
    source: &KeySource,
    at: &str,
    context: &CompileContext,
) -> Result<SigningKey, SpecError> {
    if algorithm == Algorithm::HmacSha256 {
        return load_hmac_key(source, at, context).map(SigningKey::Hmac);
    }
    let material = read(source, at, true, context)?;
    let der = private_key_der(&material.bytes).map_err(|e| material.error(e))?;
    SigningKey::ed25519(source.key_id.as_deref(), &der).map_err(|e| material.error(e))
}

/// Reads the checking key `source` names for `algorithm` (an Ed25519 public key is not a
/// secret, so its file may be readable by others).
pub fn load_verifying_key(
    algorithm: Algorithm,
    source: &KeySource,
    at: &str,
    context: &CompileContext,
) -> Result<VerifyingKey, SpecError> {
    if algorithm == Algorithm::HmacSha256 {
        return load_hmac_key(source, at, context).map(VerifyingKey::Hmac);
    }
    let material = read(source, at, false, context)?;
    let raw = public_key_raw(&material.bytes).map_err(|e| material.error(e))?;
    VerifyingKey::ed25519(source.key_id.as_deref(), &raw).map_err(|e| material.error(e))
}

/// Reads the keys of a checking step: the one given by `key_file`/`key_env`/`key_id`
/// (`single`) or the list `keys`, not both; ids must differ.
pub fn load_ring<K>(
    single: KeySource,
    list: Option<Vec<KeySource>>,
    context: &CompileContext,
    load: impl Fn(&KeySource, &str, &CompileContext) -> Result<K, SpecError>,
    id_of: impl Fn(&K) -> &str,
) -> Result<KeyRing<K>, SpecError> {
    let sources: Vec<(String, KeySource)> = match list {
        Some(_) if !single.is_empty() => {
            return Err(SpecError::at(
                "keys",
                "give either keys = [...] or key_file/key_env/key_id, not both",
            ));
        }
        Some(list) if list.is_empty() => {
            return Err(SpecError::at("keys", "give at least one key"));
        }
        Some(list) => list
            .into_iter()
            .enumerate()
            .map(|(i, source)| (format!("keys[{i}]."), source))
            .collect(),
        None => vec![(String::new(), single)],
    };
    let mut keys: Vec<(String, K)> = Vec::with_capacity(sources.len());
    for (at, source) in &sources {
        let key = load(source, at, context)?;
        let id = id_of(&key).to_owned();
        if keys.iter().any(|(known, _)| *known == id) {
            return Err(SpecError::at(
                &format!("{at}key_id"),
                format!("two keys have the id {id:?}; give each a distinct key_id"),
            ));
        }
        keys.push((id, key));
    }
    Ok(KeyRing { keys })
}

/// Standard base64 with padding, as every signature and link is written.
pub(crate) fn base64_encode(bytes: &[u8]) -> String {
    general_purpose::STANDARD.encode(bytes)
}

/// Decodes standard base64 (padding optional).
pub(crate) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    BASE64_LENIENT.decode(text).ok()
}

/// Test helpers shared by the cryptographic steps' tests.
#[cfg(test)]
pub(crate) mod testing {
    use std::path::Path;
    use std::sync::Arc;

    use bytes::Bytes;
    use ring::rand::{SecureRandom as _, SystemRandom};
    use tributary_event::EventData;

    use super::*;
    use crate::item::{Item, Position};

    /// A compile context rooted at `dir` whose environment holds only `vars`.
    pub(crate) fn context(dir: &Path, vars: &[(&str, &str)]) -> CompileContext {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        CompileContext {
            base_dir: dir.to_path_buf(),
            env: Arc::new(move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())),
        }
    }

    /// Writes `contents` to `dir/name` with mode 0600.
    pub(crate) fn write_secret(dir: &Path, name: &str, contents: &[u8]) {
        let path = dir.join(name);
        fs::write(&path, contents).expect("write key");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).expect("chmod");
        }
    }

    /// `n` random bytes.
    pub(crate) fn random(n: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; n];
        SystemRandom::new().fill(&mut bytes).expect("random");
        bytes
    }

    /// A fresh Ed25519 PKCS#8 v2 document (ring's form).
    pub(crate) fn ed25519_pkcs8() -> Vec<u8> {
        Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
            .expect("generate")
            .as_ref()
            .to_vec()
    }

    /// `der` as a PEM block labelled `label`, lines of 64 characters.
    pub(crate) fn pem(label: &str, der: &[u8]) -> String {
        let b64 = STANDARD.encode(der);
        let mut text = format!("-----BEGIN {label}-----\n");
        for line in b64.as_bytes().chunks(64) {
            text.push_str(std::str::from_utf8(line).expect("ascii"));
            text.push('\n');
        }
        text.push_str(&format!("-----END {label}-----\n"));
        text
    }

    /// An item with a JSON body, read at `sequence`.
    pub(crate) fn item(body: &str, sequence: i64) -> Item {
        let mut event = EventData::new(Bytes::from(body.to_owned()));
        event.content_type = Some("application/json".to_owned());
        Item::new(
            event,
            Position {
                sequence_number: sequence,
                offset: 100 * sequence.unsigned_abs(),
                enqueued_time_ms: 1_700_000_000_000,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    fn source(file: &str) -> KeySource {
        KeySource {
            key_file: Some(PathBuf::from(file)),
            ..KeySource::default()
        }
    }

    #[test]
    fn an_aes_key_reads_from_base64_or_hex_with_a_derived_id() {
        let dir = tempfile::tempdir().expect("dir");
        let key = random(32);
        write_secret(
            dir.path(),
            "b64",
            format!("{}\n", STANDARD.encode(&key)).as_bytes(),
        );
        write_secret(dir.path(), "hex", hex(&key).to_uppercase().as_bytes());
        let ctx = context(dir.path(), &[]);
        let a = load_encryption_key(&source("b64"), "", &ctx).expect("base64");
        let b = load_encryption_key(&source("hex"), "", &ctx).expect("hex");
        assert_eq!(a.id(), default_key_id(&key));
        assert_eq!(a.id(), b.id());
        assert_eq!(a.id().len(), 16);
    }

    #[test]
    fn a_key_of_the_wrong_length_or_form_is_refused_without_showing_it() {
        let dir = tempfile::tempdir().expect("dir");
        let short = STANDARD.encode(random(16));
        write_secret(dir.path(), "short", short.as_bytes());
        write_secret(dir.path(), "junk", b"not*base64*at*all");
        let ctx = context(dir.path(), &[]);
        let e = load_encryption_key(&source("short"), "", &ctx).expect_err("16 bytes");
        assert_eq!(e.key.as_deref(), Some("key_file"));
        assert!(e.message.contains("is 16 bytes"), "{e}");
        assert!(!e.message.contains(&short), "{e}");
        let e = load_hmac_key(&source("short"), "", &ctx).expect_err("short hmac");
        assert!(e.message.contains("at least 32"), "{e}");
        let e = load_encryption_key(&source("junk"), "", &ctx).expect_err("junk");
        assert!(e.message.contains("neither hex nor base64"), "{e}");
        assert!(!e.message.contains("base64*at"), "{e}");
    }

    #[cfg(unix)]
    #[test]
    fn a_secret_key_file_readable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("dir");
        write_secret(dir.path(), "k", STANDARD.encode(random(32)).as_bytes());
        let path = dir.path().join("k");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
        let ctx = context(dir.path(), &[]);
        let e = load_hmac_key(&source("k"), "", &ctx).expect_err("0644");
        assert!(
            e.message.contains(&format!("chmod 600 {}", path.display())),
            "{e}"
        );
        // A public key is not a secret: 0644 is fine.
        let signing = SigningKey::ed25519(None, &ed25519_pkcs8()).expect("key");
        let SigningKey::Ed25519 { pair, .. } = &signing else {
            panic!("ed25519")
        };
        let spki = [&ED25519_SPKI_PREFIX[..], pair.public_key().as_ref()].concat();
        fs::write(dir.path().join("pub"), pem("PUBLIC KEY", &spki)).expect("write");
        fs::set_permissions(dir.path().join("pub"), fs::Permissions::from_mode(0o644))
            .expect("chmod");
        let public =
            load_verifying_key(Algorithm::Ed25519, &source("pub"), "", &ctx).expect("public");
        assert_eq!(public.id(), signing.id());
    }

    #[test]
    fn exactly_one_of_key_file_and_key_env_is_required() {
        let dir = tempfile::tempdir().expect("dir");
        let ctx = context(dir.path(), &[("K", "x")]);
        let neither = KeySource::default();
        let both = KeySource {
            key_file: Some(PathBuf::from("k")),
            key_env: Some("K".to_owned()),
            key_id: None,
        };
        for bad in [neither, both] {
            let e = load_hmac_key(&bad, "", &ctx).expect_err("one of two");
            assert!(e.message.contains("exactly one of key_file"), "{e}");
        }
        let unset = KeySource {
            key_env: Some("UNSET".to_owned()),
            ..KeySource::default()
        };
        let e = load_hmac_key(&unset, "", &ctx).expect_err("unset");
        assert_eq!(
            e.to_string(),
            "key_env: the environment variable UNSET is not set"
        );
    }

    #[test]
    fn a_key_comes_from_an_environment_variable_with_a_given_id() {
        let dir = tempfile::tempdir().expect("dir");
        let text = STANDARD.encode(random(48));
        let ctx = context(dir.path(), &[("SIGN_KEY", &text)]);
        let from_env = KeySource {
            key_env: Some("SIGN_KEY".to_owned()),
            key_id: Some("2024-05".to_owned()),
            ..KeySource::default()
        };
        let key = load_hmac_key(&from_env, "", &ctx).expect("env key");
        assert_eq!(key.id(), "2024-05");
        let bad_id = KeySource {
            key_id: Some("has space".to_owned()),
            ..from_env
        };
        let e = load_hmac_key(&bad_id, "", &ctx).expect_err("bad id");
        assert!(e.message.contains("key id"), "{e}");
    }

    #[test]
    fn ed25519_private_keys_read_as_pem_der_and_openssl_v1() {
        let dir = tempfile::tempdir().expect("dir");
        let v2 = ed25519_pkcs8();
        // What `openssl genpkey -algorithm ed25519` writes: PKCS#8 v1, the seed only.
        let v1 = [
            &[
                0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70,
            ][..],
            &[0x04, 0x22, 0x04, 0x20][..],
            &random(32),
        ]
        .concat();
        write_secret(dir.path(), "v2.pem", pem("PRIVATE KEY", &v2).as_bytes());
        write_secret(dir.path(), "v2.der", &v2);
        write_secret(dir.path(), "v1.pem", pem("PRIVATE KEY", &v1).as_bytes());
        write_secret(
            dir.path(),
            "ssh",
            b"-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n",
        );
        let ctx = context(dir.path(), &[]);
        let load = |f: &str| load_signing_key(Algorithm::Ed25519, &source(f), "", &ctx);
        assert_eq!(
            load("v2.pem").expect("pem").id(),
            load("v2.der").expect("der").id()
        );
        let v1_key = load("v1.pem").expect("openssl form");
        let signature = v1_key.sign_base64(b"message");
        let raw = STANDARD.decode(signature).expect("b64");
        assert!(v1_key.verifying_key().verify(b"message", &raw));
        let e = load("ssh").expect_err("ssh key");
        assert!(e.message.contains("OPENSSH PRIVATE KEY"), "{e}");
    }

    #[test]
    fn a_ring_of_keys_refuses_duplicates_and_mixing_forms() {
        let dir = tempfile::tempdir().expect("dir");
        let text = STANDARD.encode(random(32));
        write_secret(dir.path(), "a", text.as_bytes());
        let ctx = context(dir.path(), &[]);
        let load = |s: &KeySource, at: &str, c: &CompileContext| load_hmac_key(s, at, c);
        let twice = vec![source("a"), source("a")];
        let e = load_ring(KeySource::default(), Some(twice), &ctx, load, HmacKey::id)
            .expect_err("same key twice");
        assert_eq!(e.key.as_deref(), Some("keys[1].key_id"));
        let e = load_ring(
            source("a"),
            Some(vec![source("a")]),
            &ctx,
            load,
            HmacKey::id,
        )
        .expect_err("both forms");
        assert_eq!(e.key.as_deref(), Some("keys"));
        let ring = load_ring(source("a"), None, &ctx, load, HmacKey::id).expect("single");
        assert!(
            ring.find(&default_key_id(&STANDARD.decode(&text).expect("b64")))
                .is_some()
        );
    }
}
