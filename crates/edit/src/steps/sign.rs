//! `sign` and `verify`: a signature over an event's body and chosen properties, so a consumer
//! can tell the event was not changed on the way and who signed it.
//!
//! ```toml
//! [[step]]
//! kind = "sign"
//! algorithm = "ed25519"            # or "hmac-sha256"
//! key_file = "keys/sign.pem"       # or key_env; key_id optional (see `keys`)
//! properties = ["kind", "site"]    # application properties to sign (default none)
//! system = ["message_id"]          # message_id, content_type, partition_key, correlation_id
//!
//! [[step]]
//! kind = "verify"
//! algorithm = "ed25519"
//! key_file = "keys/sign.pub"       # or keys = [{ key_file = ... }, ...] during a rotation
//! properties = ["kind"]            # must be among the signed ones (default: no demand)
//! invalid = "dead-letter"          # or "drop"
//! strip = false                    # true: remove the signature properties once checked
//! ```
//!
//! `sign` writes `tributary-signature` (standard base64), `tributary-signature-alg`,
//! `tributary-signature-key-id` and `tributary-signed-properties` (the signed entries, comma
//! separated, in signing order: application property names as they are, system fields as
//! `sys.<name>`). The key id property is `tributary-signature-key-id`, not `tributary-key-id`,
//! so an event both encrypted and signed keeps both ids.
//!
//! # What is signed
//!
//! The signature (HMAC-SHA256 tag, or Ed25519 signature) covers this byte string, where
//! `str(x)` is the 8-byte big-endian length of `x` followed by its UTF-8 bytes:
//!
//! ```text
//! str("tributary-signature-v1") str(algorithm) str(key id)
//! u64 BE: number of entries
//! for each entry of tributary-signed-properties, in order: str(entry) value(entry)
//! SHA-256(body) (32 bytes)
//! ```
//!
//! `value(entry)` is one tag byte, then the value (integers and floats big-endian, of their
//! own width):
//!
//! | type      | tag  | then                                   |
//! |-----------|------|----------------------------------------|
//! | absent    | `00` | nothing                                |
//! | null      | `01` | nothing                                |
//! | bool      | `02` | `00` or `01`                           |
//! | int32     | `03` | 4 bytes                                |
//! | int64     | `04` | 8 bytes                                |
//! | uint32    | `05` | 4 bytes                                |
//! | uint64    | `06` | 8 bytes                                |
//! | float32   | `07` | 4 bytes (IEEE 754 bits)                |
//! | float64   | `08` | 8 bytes (IEEE 754 bits)                |
//! | string    | `09` | `str(value)`                           |
//! | bytes     | `0A` | 8-byte length, then the bytes          |
//! | timestamp | `0B` | 8 bytes (ms since the epoch, signed)   |
//! | uuid      | `0C` | 16 bytes                               |
//!
//! System fields are absent or strings. Every part is typed and length-prefixed, so no two
//! different events encode alike, and a consumer in another language rebuilds it in a few
//! lines. A property whose type changes on the way (an int32 read back as an int64) no longer
//! verifies, by design.
//!
//! # Guarantees
//!
//! - Verification fails on any change to the body, a signed entry (including its absence or
//!   its type), the list of signed entries, the algorithm or the key id.
//! - A missing or bad signature is a refusal with a reason (or a counted drop, when
//!   `invalid = "drop"`), never a panic; HMAC tags are compared in constant time.
//! - `verify` demands the configured `properties`/`system` be among the signed entries, so a
//!   signer that left them out cannot pass them off as signed.

use std::sync::Arc;

use ring::digest;
use serde::Deserialize;
use tributary_event::PropertyValue;

use crate::field::{Field, FieldValue, SystemProperty};
use crate::item::Item;
use crate::spec::{CompileContext, SpecError};
use crate::step::{Context, Output, Step};
use crate::steps::keys::{self, Algorithm, KeyRing, KeySource, SigningKey, VerifyingKey};

/// The signature, standard base64.
pub const SIGNATURE: &str = "tributary-signature";
/// The algorithm: `hmac-sha256` or `ed25519`.
pub const SIGNATURE_ALG: &str = "tributary-signature-alg";
/// The id of the key that signed.
pub const SIGNATURE_KEY_ID: &str = "tributary-signature-key-id";
/// The signed entries, comma separated.
pub const SIGNED_PROPERTIES: &str = "tributary-signed-properties";

/// The first part of every signed string: names the format, so it can change without old and
/// new signatures being confused.
const DOMAIN: &[u8] = b"tributary-signature-v1";

/// The most entries `verify` reads from an event's `tributary-signed-properties`: the list is
/// producer input, and no real configuration signs more than a few dozen properties.
pub const SIGNED_ENTRIES_MAX: usize = 64;

/// How a system field is written among the signed entries: `sys.<name>`.
const SYS_PREFIX: &str = "sys.";

/// The system fields that may be signed: those an event carries to its target unchanged
/// (sequence numbers, offsets and partition ids are the source's, and differ at the target).
const SIGNABLE_SYSTEM: [SystemProperty; 4] = [
    SystemProperty::MessageId,
    SystemProperty::ContentType,
    SystemProperty::PartitionKey,
    SystemProperty::CorrelationId,
];

// Canonical encoding, shared with encrypt (associated data), attest and chain.

const TAG_ABSENT: u8 = 0x00;
const TAG_NULL: u8 = 0x01;
const TAG_BOOL: u8 = 0x02;
const TAG_INT32: u8 = 0x03;
const TAG_INT64: u8 = 0x04;
const TAG_UINT32: u8 = 0x05;
const TAG_UINT64: u8 = 0x06;
const TAG_FLOAT32: u8 = 0x07;
const TAG_FLOAT64: u8 = 0x08;
const TAG_STRING: u8 = 0x09;
const TAG_BYTES: u8 = 0x0A;
const TAG_TIMESTAMP: u8 = 0x0B;
const TAG_UUID: u8 = 0x0C;

/// Appends `len` as 8 bytes, big-endian.
pub(crate) fn put_len(out: &mut Vec<u8>, len: usize) {
    // usize is at most 64 bits on every target Rust supports, so this is lossless.
    out.extend_from_slice(&(len as u64).to_be_bytes());
}

/// Appends `bytes`, length-prefixed.
pub(crate) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_len(out, bytes.len());
    out.extend_from_slice(bytes);
}

/// Appends an optional string value (absent, or a string), tagged.
pub(crate) fn put_text(out: &mut Vec<u8>, text: Option<&str>) {
    match text {
        None => out.push(TAG_ABSENT),
        Some(text) => {
            out.push(TAG_STRING);
            put_bytes(out, text.as_bytes());
        }
    }
}

/// Appends an optional property value, tagged (see the module doc).
pub(crate) fn put_value(out: &mut Vec<u8>, value: Option<&PropertyValue>) {
    let Some(value) = value else {
        out.push(TAG_ABSENT);
        return;
    };
    match value {
        PropertyValue::Null => out.push(TAG_NULL),
        PropertyValue::Bool(b) => out.extend_from_slice(&[TAG_BOOL, u8::from(*b)]),
        PropertyValue::Int32(n) => put_fixed(out, TAG_INT32, &n.to_be_bytes()),
        PropertyValue::Int64(n) => put_fixed(out, TAG_INT64, &n.to_be_bytes()),
        PropertyValue::UInt32(n) => put_fixed(out, TAG_UINT32, &n.to_be_bytes()),
        PropertyValue::UInt64(n) => put_fixed(out, TAG_UINT64, &n.to_be_bytes()),
        PropertyValue::Float32(n) => put_fixed(out, TAG_FLOAT32, &n.to_bits().to_be_bytes()),
        PropertyValue::Float64(n) => put_fixed(out, TAG_FLOAT64, &n.to_bits().to_be_bytes()),
        PropertyValue::String(s) => put_text(out, Some(s)),
        PropertyValue::Bytes(b) => {
            out.push(TAG_BYTES);
            put_bytes(out, b);
        }
        PropertyValue::Timestamp(ms) => put_fixed(out, TAG_TIMESTAMP, &ms.to_be_bytes()),
        PropertyValue::Uuid(u) => put_fixed(out, TAG_UUID, u),
    }
}

fn put_fixed(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    out.push(tag);
    out.extend_from_slice(bytes);
}

/// The SHA-256 of `body`.
pub(crate) fn sha256(body: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(digest::digest(&digest::SHA256, body).as_ref());
    out
}

/// A string property value.
pub(crate) fn text(s: &str) -> PropertyValue {
    PropertyValue::String(s.into())
}

/// An application property value as a string, or why it is not one (for a reason).
pub(crate) fn string_property<'a>(item: &'a Item, key: &str) -> Result<Option<&'a str>, String> {
    match item.property(key) {
        None => Ok(None),
        Some(PropertyValue::String(s)) => Ok(Some(s)),
        Some(other) => Err(format!("{key} is a {}, not a string", other.type_name())),
    }
}

/// One signed entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry<'a> {
    Property(&'a str),
    System(SystemProperty),
}

impl<'a> Entry<'a> {
    /// Reads an entry of `tributary-signed-properties`.
    fn parse(text: &'a str) -> Result<Entry<'a>, String> {
        match text.strip_prefix(SYS_PREFIX) {
            Some(name) => SystemProperty::named(name)
                .filter(|p| SIGNABLE_SYSTEM.contains(p))
                .map(Entry::System)
                .ok_or_else(|| format!("signed entry {text:?} is not a signable system field")),
            None if text.is_empty() => Err("the list of signed entries has an empty entry".into()),
            None => Ok(Entry::Property(text)),
        }
    }

    fn put(&self, out: &mut Vec<u8>, context: &Context<'_>, item: &Item) {
        match self {
            Entry::Property(name) => {
                put_bytes(out, name.as_bytes());
                put_value(out, item.property(name));
            }
            Entry::System(property) => {
                let name = property.name();
                put_len(out, SYS_PREFIX.len() + name.len());
                out.extend_from_slice(SYS_PREFIX.as_bytes());
                out.extend_from_slice(name.as_bytes());
                let value = match Field::System(*property).get(context, item) {
                    Some(FieldValue::Str(s)) => Some(s),
                    _ => None,
                };
                put_text(out, value);
            }
        }
    }
}

/// The string a signature covers (see the module doc).
fn message(
    algorithm: Algorithm,
    key_id: &str,
    entries: &[Entry<'_>],
    context: &Context<'_>,
    item: &Item,
    body_sha256: &[u8; 32],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(128 + 32 * entries.len());
    put_bytes(&mut out, DOMAIN);
    put_bytes(&mut out, algorithm.name().as_bytes());
    put_bytes(&mut out, key_id.as_bytes());
    put_len(&mut out, entries.len());
    for entry in entries {
        entry.put(&mut out, context, item);
    }
    out.extend_from_slice(body_sha256);
    out
}

/// The entries a spec names: `properties` as they are, `system` as `sys.<name>`, checked.
fn spec_entries(properties: &[String], system: &[String]) -> Result<Vec<String>, SpecError> {
    let mut entries: Vec<String> = Vec::with_capacity(properties.len() + system.len());
    for name in properties {
        if name.is_empty() || name.contains(',') || name.starts_with("sys.") {
            return Err(SpecError::at(
                "properties",
                format!(
                    "{name:?} cannot be listed in {SIGNED_PROPERTIES}: a name must be non-empty, \
                     have no ',' and not start with \"sys.\""
                ),
            ));
        }
        if name.starts_with(SIGNATURE) {
            return Err(SpecError::at(
                "properties",
                format!("{name:?} is written by the signature itself and cannot be signed"),
            ));
        }
        entries.push(name.clone());
    }
    for name in system {
        let property = SystemProperty::named(name)
            .filter(|p| SIGNABLE_SYSTEM.contains(p))
            .ok_or_else(|| {
                SpecError::at(
                    "system",
                    format!(
                        "{name:?} cannot be signed; use message_id, content_type, partition_key \
                         or correlation_id (the others differ at the target)"
                    ),
                )
            })?;
        entries.push(format!("sys.{}", property.name()));
    }
    if let Some(twice) = entries
        .iter()
        .enumerate()
        .find(|(i, e)| entries[..*i].contains(e))
    {
        return Err(SpecError::table(format!("{} is listed twice", twice.1)));
    }
    if entries.len() > SIGNED_ENTRIES_MAX {
        return Err(SpecError::at(
            "properties",
            format!("at most {SIGNED_ENTRIES_MAX} entries can be signed"),
        ));
    }
    Ok(entries)
}

/// The `sign` step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignSpec {
    /// `hmac-sha256` or `ed25519`.
    pub algorithm: Algorithm,
    /// A file holding the key.
    pub key_file: Option<std::path::PathBuf>,
    /// An environment variable holding the key.
    pub key_env: Option<String>,
    /// The key's id (default: derived from the key).
    pub key_id: Option<String>,
    /// Application properties to sign.
    #[serde(default)]
    pub properties: Vec<String>,
    /// System fields to sign.
    #[serde(default)]
    pub system: Vec<String>,
}

/// Signs events.
#[derive(Debug)]
struct Sign {
    name: String,
    key: SigningKey,
    /// The signed entries as written in the event.
    entries: Vec<String>,
    /// `entries` joined with commas: the value of `tributary-signed-properties`.
    list: String,
}

pub(crate) fn compile_sign(
    name: String,
    spec: SignSpec,
    context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let source = KeySource {
        key_file: spec.key_file,
        key_env: spec.key_env,
        key_id: spec.key_id,
    };
    let key = keys::load_signing_key(spec.algorithm, &source, "", context)?;
    let entries = spec_entries(&spec.properties, &spec.system)?;
    let list = entries.join(",");
    Ok(Arc::new(Sign {
        name,
        key,
        entries,
        list,
    }))
}

impl Step for Sign {
    fn edits_each_event_alone(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        // Parsed at compile time from names this step checked, so every entry parses.
        let entries: Vec<Entry<'_>> = self
            .entries
            .iter()
            .filter_map(|e| Entry::parse(e).ok())
            .collect();
        for mut item in items {
            let body_sha256 = sha256(item.body());
            let algorithm = self.key.algorithm();
            let signed = message(
                algorithm,
                self.key.id(),
                &entries,
                context,
                &item,
                &body_sha256,
            );
            let signature = self.key.sign_base64(&signed);
            item.set_property(SIGNATURE, PropertyValue::String(signature.into()));
            item.set_property(SIGNATURE_ALG, text(algorithm.name()));
            item.set_property(SIGNATURE_KEY_ID, text(self.key.id()));
            item.set_property(SIGNED_PROPERTIES, text(&self.list));
            out.pass(item);
        }
    }
}

/// What `verify` does with an event whose signature is missing or does not match.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Invalid {
    /// Refuse it: it goes to the dead-letter target with the reason.
    #[default]
    DeadLetter,
    /// Drop it, counted under the step's name.
    Drop,
}

/// The `verify` step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifySpec {
    /// `hmac-sha256` or `ed25519`.
    pub algorithm: Algorithm,
    /// A file holding the key.
    pub key_file: Option<std::path::PathBuf>,
    /// An environment variable holding the key.
    pub key_env: Option<String>,
    /// The key's id (default: derived from the key).
    pub key_id: Option<String>,
    /// Several keys (a rotation), instead of `key_file`/`key_env`/`key_id`.
    pub keys: Option<Vec<KeySource>>,
    /// Application properties the signature must cover.
    #[serde(default)]
    pub properties: Vec<String>,
    /// System fields the signature must cover.
    #[serde(default)]
    pub system: Vec<String>,
    /// What to do with an event that does not verify.
    #[serde(default)]
    pub invalid: Invalid,
    /// Remove the signature properties from events that verify.
    #[serde(default)]
    pub strip: bool,
}

/// Checks signatures.
#[derive(Debug)]
struct Verify {
    name: String,
    algorithm: Algorithm,
    keys: KeyRing<VerifyingKey>,
    /// Entries the signature must cover, as written in `tributary-signed-properties`.
    required: Vec<String>,
    invalid: Invalid,
    strip: bool,
}

pub(crate) fn compile_verify(
    name: String,
    spec: VerifySpec,
    context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let single = KeySource {
        key_file: spec.key_file,
        key_env: spec.key_env,
        key_id: spec.key_id,
    };
    let algorithm = spec.algorithm;
    let keys = keys::load_ring(
        single,
        spec.keys,
        context,
        |source, at, context| keys::load_verifying_key(algorithm, source, at, context),
        VerifyingKey::id,
    )?;
    Ok(Arc::new(Verify {
        name,
        algorithm,
        keys,
        required: spec_entries(&spec.properties, &spec.system)?,
        invalid: spec.invalid,
        strip: spec.strip,
    }))
}

impl Verify {
    /// Checks `item`'s signature; `Err` holds the reason it does not verify.
    fn check(&self, context: &Context<'_>, item: &mut Item) -> Result<(), String> {
        if item.property(SIGNATURE).is_none() {
            return Err(format!("no {SIGNATURE} property: the event is not signed"));
        }
        let body_sha256 = sha256(item.body());
        let item = &*item;
        let present = |key| string_property(item, key)?.ok_or_else(|| format!("no {key} property"));
        let signature = present(SIGNATURE)?;
        let algorithm = present(SIGNATURE_ALG)?;
        if algorithm != self.algorithm.name() {
            return Err(format!(
                "signed with {algorithm:?}; this step verifies {}",
                self.algorithm.name()
            ));
        }
        let key_id = present(SIGNATURE_KEY_ID)?;
        let key = self.keys.find(key_id).ok_or_else(|| {
            format!(
                "signed with key {key_id:?}, which this step does not have (it has {})",
                self.keys.ids()
            )
        })?;
        let list = present(SIGNED_PROPERTIES)?;
        let entries = parse_list(list)?;
        if let Some(missing) = self
            .required
            .iter()
            .find(|r| !list.split(',').any(|e| e == *r))
        {
            return Err(format!(
                "the signature does not cover {missing} ({SIGNED_PROPERTIES} is {list:?})"
            ));
        }
        let raw =
            keys::base64_decode(signature).ok_or_else(|| format!("{SIGNATURE} is not base64"))?;
        let signed = message(
            self.algorithm,
            key_id,
            &entries,
            context,
            item,
            &body_sha256,
        );
        if key.verify(&signed, &raw) {
            Ok(())
        } else {
            Err(format!(
                "the signature does not match: the body or a signed property ({list}) was \
                 changed, or it was not signed with key {key_id:?}"
            ))
        }
    }
}

/// The entries of a `tributary-signed-properties` value (empty text: none).
fn parse_list(list: &str) -> Result<Vec<Entry<'_>>, String> {
    if list.is_empty() {
        return Ok(Vec::new());
    }
    if list.split(',').nth(SIGNED_ENTRIES_MAX).is_some() {
        return Err(format!(
            "{SIGNED_PROPERTIES} lists more than {SIGNED_ENTRIES_MAX} entries"
        ));
    }
    list.split(',').map(Entry::parse).collect()
}

impl Step for Verify {
    fn edits_each_event_alone(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        for mut item in items {
            match self.check(context, &mut item) {
                Ok(()) => {
                    if self.strip {
                        for key in [
                            SIGNATURE,
                            SIGNATURE_ALG,
                            SIGNATURE_KEY_ID,
                            SIGNED_PROPERTIES,
                        ] {
                            item.remove_property(key);
                        }
                    }
                    out.pass(item);
                }
                Err(_) if self.invalid == Invalid::Drop => out.drop_item(item),
                Err(reason) => out.reject(item, reason),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::spec::compile;
    use crate::step::Editor;
    use crate::steps::keys::testing::*;

    const CONTEXT: Context<'static> = Context {
        partition: "3",
        now_ms: 1_700_000_000_000,
    };

    /// A signer and a verifier (with `verify_keys` merged into its table) for `algorithm`.
    fn pair(
        dir: &std::path::Path,
        algorithm: &str,
        verify_keys: serde_json::Value,
    ) -> (Arc<dyn Step>, Arc<dyn Step>) {
        let ctx = context(dir, &[]);
        let (sign_file, verify_file) = if algorithm == "ed25519" {
            let der = ed25519_pkcs8();
            write_secret(dir, "sign.pem", pem("PRIVATE KEY", &der).as_bytes());
            let key = SigningKey::ed25519(None, &der).expect("key");
            let VerifyingKey::Ed25519 { public, .. } = key.verifying_key() else {
                panic!("ed25519");
            };
            let raw = keys::base64_encode(public.as_ref());
            std::fs::write(dir.join("sign.pub"), raw).expect("write public");
            ("sign.pem", "sign.pub")
        } else {
            write_secret(dir, "hmac.key", keys::base64_encode(&random(32)).as_bytes());
            ("hmac.key", "hmac.key")
        };
        let sign = json!({"algorithm": algorithm, "key_file": sign_file,
                          "properties": ["kind", "site"], "system": ["message_id"]});
        let mut verify = json!({"algorithm": algorithm, "key_file": verify_file});
        for (k, v) in verify_keys.as_object().expect("object") {
            verify[k] = v.clone();
        }
        (
            compile("sign", None, sign, &ctx).expect("sign compiles"),
            compile("verify", None, verify, &ctx).expect("verify compiles"),
        )
    }

    fn signed(sign: &Arc<dyn Step>) -> Item {
        let mut item = item(r#"{"temperature":21.5}"#, 42);
        item.set_property("kind", text("reading"));
        item.set_property("site", PropertyValue::Int32(7));
        item.event_mut().message_id = Some("m-1".to_owned());
        let edited = Editor::new(vec![sign.clone()]).apply(&CONTEXT, vec![item]);
        edited.passed.into_iter().next().expect("signed")
    }

    fn verify(verify: &Arc<dyn Step>, item: Item) -> crate::step::Edited {
        Editor::new(vec![verify.clone()]).apply(&CONTEXT, vec![item])
    }

    fn rejection(verify_step: &Arc<dyn Step>, item: Item) -> String {
        let edited = verify(verify_step, item);
        assert!(edited.passed.is_empty(), "should not verify");
        edited.rejected[0].reason.clone()
    }

    #[test]
    fn both_algorithms_round_trip_and_strip_removes_the_properties() {
        for algorithm in ["hmac-sha256", "ed25519"] {
            let dir = tempfile::tempdir().expect("dir");
            let (sign, check) = pair(dir.path(), algorithm, json!({"strip": true}));
            let item = signed(&sign);
            assert_eq!(
                string_property(&item, SIGNED_PROPERTIES),
                Ok(Some("kind,site,sys.message_id"))
            );
            assert_eq!(string_property(&item, SIGNATURE_ALG), Ok(Some(algorithm)));
            let edited = verify(&check, item);
            assert!(edited.rejected.is_empty(), "{:?}", edited.rejected);
            let passed = &edited.passed[0];
            assert!(passed.property(SIGNATURE).is_none());
            assert!(passed.property(SIGNED_PROPERTIES).is_none());
            assert!(passed.property("kind").is_some());
        }
    }

    #[test]
    fn tampering_is_caught_with_a_reason() {
        for algorithm in ["hmac-sha256", "ed25519"] {
            let dir = tempfile::tempdir().expect("dir");
            let (sign, check) = pair(dir.path(), algorithm, json!({}));
            let mut flipped = signed(&sign);
            let mut body = flipped.body().to_vec();
            body[3] ^= 0x01;
            flipped.set_body(Bytes::from(body));
            assert!(rejection(&check, flipped).contains("does not match"));
            let mut changed = signed(&sign);
            changed.set_property("site", PropertyValue::Int32(8));
            assert!(rejection(&check, changed).contains("does not match"));
            let mut retyped = signed(&sign);
            retyped.set_property("site", PropertyValue::Int64(7));
            assert!(rejection(&check, retyped).contains("does not match"));
            let mut renamed = signed(&sign);
            renamed.event_mut().message_id = Some("m-2".to_owned());
            assert!(rejection(&check, renamed).contains("does not match"));
            let mut narrowed = signed(&sign);
            narrowed.set_property(SIGNED_PROPERTIES, text("kind"));
            assert!(rejection(&check, narrowed).contains("does not match"));
        }
    }

    #[test]
    fn a_wrong_key_a_missing_signature_and_a_missing_demand_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let (sign, _) = pair(dir.path(), "hmac-sha256", json!({}));
        let other = tempfile::tempdir().expect("dir");
        let (_, wrong) = pair(other.path(), "hmac-sha256", json!({}));
        assert!(rejection(&wrong, signed(&sign)).contains("does not have"));
        let table = json!({"algorithm": "hmac-sha256", "key_file": "hmac.key",
                           "properties": ["unit"]});
        let demanding = compile("verify", None, table, &context(dir.path(), &[])).expect("verify");
        assert!(rejection(&demanding, signed(&sign)).contains("does not cover unit"));
        let unsigned = item("{}", 1);
        assert!(rejection(&demanding, unsigned).contains("not signed"));
        let (_, ed) = pair(other.path(), "ed25519", json!({}));
        assert!(rejection(&ed, signed(&sign)).contains("this step verifies ed25519"));
    }

    #[test]
    fn a_wrong_key_with_the_same_id_fails_the_signature_and_drop_counts_it() {
        let dir = tempfile::tempdir().expect("dir");
        let (sign, _) = pair(dir.path(), "hmac-sha256", json!({}));
        let item = signed(&sign);
        let id = string_property(&item, SIGNATURE_KEY_ID)
            .expect("string")
            .expect("id")
            .to_owned();
        let other = tempfile::tempdir().expect("dir");
        let (_, impostor) = pair(
            other.path(),
            "hmac-sha256",
            json!({"key_id": id, "invalid": "drop"}),
        );
        let edited = verify(&impostor, item);
        assert!(edited.passed.is_empty() && edited.rejected.is_empty());
        assert_eq!(edited.dropped, vec![("verify".to_owned(), 1)]);
    }

    #[test]
    fn a_rotation_verifies_with_any_listed_key() {
        let old = tempfile::tempdir().expect("dir");
        let (old_sign, _) = pair(old.path(), "hmac-sha256", json!({}));
        let dir = tempfile::tempdir().expect("dir");
        std::fs::copy(old.path().join("hmac.key"), dir.path().join("old.key")).expect("copy");
        let keys = json!({"keys": [{"key_file": "hmac.key"}, {"key_file": "old.key"}]});
        let (new_sign, check) = pair(dir.path(), "hmac-sha256", json!({}));
        let ctx = context(dir.path(), &[]);
        let mut table = json!({"algorithm": "hmac-sha256"});
        table["keys"] = keys["keys"].clone();
        let rotating = compile("verify", None, table, &ctx).expect("compiles");
        for sign in [&old_sign, &new_sign] {
            assert!(verify(&rotating, signed(sign)).rejected.is_empty());
        }
        assert!(verify(&check, signed(&new_sign)).rejected.is_empty());
    }

    #[test]
    fn bad_spec_entries_are_refused_naming_the_key() {
        let e = spec_entries(&["a,b".to_owned()], &[]).expect_err("comma");
        assert_eq!(e.key.as_deref(), Some("properties"));
        let e = spec_entries(&[], &["sequence_number".to_owned()]).expect_err("differs");
        assert_eq!(e.key.as_deref(), Some("system"));
        assert!(spec_entries(&["k".to_owned(), "k".to_owned()], &[]).is_err());
    }

    fn property_value() -> impl Strategy<Value = PropertyValue> {
        prop_oneof![
            Just(PropertyValue::Null),
            any::<i64>().prop_map(PropertyValue::Int64),
            any::<bool>().prop_map(PropertyValue::Bool),
            ".{0,40}".prop_map(|s| PropertyValue::String(s.into())),
            proptest::collection::vec(any::<u8>(), 0..40)
                .prop_map(|b| PropertyValue::Bytes(Bytes::from(b))),
        ]
    }

    proptest! {
        #[test]
        fn verify_never_panics_on_arbitrary_events(
            body in proptest::collection::vec(any::<u8>(), 0..200),
            props in proptest::collection::vec(
                (prop_oneof![
                    Just(SIGNATURE.to_owned()), Just(SIGNATURE_ALG.to_owned()),
                    Just(SIGNATURE_KEY_ID.to_owned()), Just(SIGNED_PROPERTIES.to_owned()),
                    "[a-z,.]{0,12}"
                ], property_value()),
                0..8),
        ) {
            let dir = tempfile::tempdir().expect("dir");
            let (_, check) = pair(dir.path(), "ed25519", json!({}));
            let mut item = item("", 1);
            item.set_body(Bytes::from(body));
            for (k, v) in props {
                item.set_property(&k, v);
            }
            let edited = verify(&check, item);
            prop_assert_eq!(edited.passed.len() + edited.rejected.len(), 1);
        }
    }
}
