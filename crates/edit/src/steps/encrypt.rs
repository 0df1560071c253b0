//! `encrypt` and `decrypt`: AES-256-GCM over the body, so a hop that stores or forwards the
//! event (a hub in between, a dead-letter target) cannot read it, and a change to it is caught.
//!
//! ```toml
//! [[step]]
//! kind = "encrypt"
//! key_file = "keys/events.key"     # 32 bytes, base64 or hex; or key_env; key_id optional
//!
//! [[step]]
//! kind = "decrypt"
//! key_file = "keys/events.key"     # or keys = [{ key_file = ... }, ...] during a rotation
//! unencrypted = "reject"           # or "pass": events that were never encrypted
//! ```
//!
//! `encrypt` makes the body `nonce (12 bytes) || ciphertext || tag (16 bytes)`, with a fresh
//! random nonce per event; sets `tributary-encryption = "aes-256-gcm"` and
//! `tributary-encryption-key-id` (named apart from the signature's key id, so an event both
//! encrypted and signed keeps both); moves the content type into `tributary-content-type`
//! (left out when the event had none) and sets the content type to
//! `application/octet-stream`. `decrypt` undoes all of it.
//!
//! # Associated data
//!
//! The ciphertext is bound to `str("aes-256-gcm") str(key id)` followed by the original content
//! type as a tagged optional string (absent `00`, or `09` + `str`), in the encoding of
//! [`crate::steps::sign`] (`str(x)`: 8-byte big-endian length, then the bytes). So changing the
//! key id or the restored content type fails decryption. The partition key, message id and
//! other properties are not bound (a target may rewrite them); to bind the ciphertext to them,
//! `sign` the encrypted event.
//!
//! # Guarantees
//!
//! - A random 96-bit nonce per event from the system's CSPRNG: with one key, stay well under
//!   2^32 events (NIST SP 800-38D's bound for random nonces) — rotate keys.
//! - A tampered body, a wrong or unknown key id, a short body or a missing property is refused
//!   with a reason (it goes to the dead-letter target), never a panic.
//! - An event already encrypted is refused by `encrypt` (a second layer would overwrite the
//!   first's properties and make it undecryptable).

use std::sync::Arc;

use bytes::Bytes;
use ring::aead::{self, Aad, NONCE_LEN, Nonce};
use ring::rand::{SecureRandom as _, SystemRandom};
use serde::Deserialize;
use tributary_event::PropertyValue;

use crate::item::Item;
use crate::spec::{CompileContext, SpecError};
use crate::step::{Context, Output, Step};
use crate::steps::keys::{self, EncryptionKey, KeyRing, KeySource};
use crate::steps::sign::{put_bytes, put_text, string_property, text};

/// The algorithm name in `tributary-encryption`.
pub const ALGORITHM: &str = "aes-256-gcm";
/// The algorithm an event was encrypted with.
pub const ENCRYPTION: &str = "tributary-encryption";
/// The id of the key it was encrypted with.
pub const ENCRYPTION_KEY_ID: &str = "tributary-encryption-key-id";
/// The content type the event had before it was encrypted.
pub const ORIGINAL_CONTENT_TYPE: &str = "tributary-content-type";
/// The content type of an encrypted body.
pub const ENCRYPTED_CONTENT_TYPE: &str = "application/octet-stream";

/// The length of the GCM tag after the ciphertext.
const TAG_LEN: usize = 16;

/// The associated data for `key_id` and `content_type` (see the module doc).
fn associated_data(key_id: &str, content_type: Option<&str>) -> Vec<u8> {
    let mut aad = Vec::with_capacity(64);
    put_bytes(&mut aad, ALGORITHM.as_bytes());
    put_bytes(&mut aad, key_id.as_bytes());
    put_text(&mut aad, content_type);
    aad
}

/// The `encrypt` step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncryptSpec {
    /// A file holding the key.
    pub key_file: Option<std::path::PathBuf>,
    /// An environment variable holding the key.
    pub key_env: Option<String>,
    /// The key's id (default: derived from the key).
    pub key_id: Option<String>,
}

/// Encrypts bodies.
#[derive(Debug)]
struct Encrypt {
    name: String,
    key: EncryptionKey,
    random: SystemRandom,
}

pub(crate) fn compile_encrypt(
    name: String,
    spec: EncryptSpec,
    context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let source = KeySource {
        key_file: spec.key_file,
        key_env: spec.key_env,
        key_id: spec.key_id,
    };
    Ok(Arc::new(Encrypt {
        name,
        key: keys::load_encryption_key(&source, "", context)?,
        random: SystemRandom::new(),
    }))
}

impl Encrypt {
    fn encrypt(&self, item: &mut Item) -> Result<(), String> {
        if item.property(ENCRYPTION).is_some() {
            return Err(format!(
                "the event is already encrypted ({ENCRYPTION} is set)"
            ));
        }
        let mut nonce = [0u8; NONCE_LEN];
        self.random
            .fill(&mut nonce)
            .map_err(|_| "the system's random source failed".to_owned())?;
        let body = item.body().clone();
        let content_type = item.content_type().map(str::to_owned);
        let aad = associated_data(self.key.id(), content_type.as_deref());
        let mut sealed = Vec::with_capacity(NONCE_LEN + body.len() + TAG_LEN);
        sealed.extend_from_slice(&nonce);
        sealed.extend_from_slice(&body);
        let tag = self
            .key
            .aead()
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad),
                &mut sealed[NONCE_LEN..],
            )
            .map_err(|_| "the body is too large to encrypt".to_owned())?;
        sealed.extend_from_slice(tag.as_ref());
        let event = item.event_mut();
        event.body = Bytes::from(sealed);
        event.content_type = Some(ENCRYPTED_CONTENT_TYPE.to_owned());
        match content_type {
            Some(original) => item.set_property(
                ORIGINAL_CONTENT_TYPE,
                PropertyValue::String(original.into()),
            ),
            None => {
                item.remove_property(ORIGINAL_CONTENT_TYPE);
            }
        }
        item.set_property(ENCRYPTION, text(ALGORITHM));
        item.set_property(ENCRYPTION_KEY_ID, text(self.key.id()));
        Ok(())
    }
}

impl Step for Encrypt {
    fn edits_each_event_alone(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, _context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        for mut item in items {
            match self.encrypt(&mut item) {
                Ok(()) => out.pass(item),
                Err(reason) => out.reject(item, reason),
            }
        }
    }
}

/// What `decrypt` does with an event that was never encrypted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unencrypted {
    /// Refuse it (a plaintext event where only ciphertext is expected).
    #[default]
    Reject,
    /// Pass it on unchanged.
    Pass,
}

/// The `decrypt` step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecryptSpec {
    /// A file holding the key.
    pub key_file: Option<std::path::PathBuf>,
    /// An environment variable holding the key.
    pub key_env: Option<String>,
    /// The key's id (default: derived from the key).
    pub key_id: Option<String>,
    /// Several keys (a rotation), instead of `key_file`/`key_env`/`key_id`.
    pub keys: Option<Vec<KeySource>>,
    /// What to do with events that carry no `tributary-encryption`.
    #[serde(default)]
    pub unencrypted: Unencrypted,
}

/// Decrypts bodies.
#[derive(Debug)]
struct Decrypt {
    name: String,
    keys: KeyRing<EncryptionKey>,
    unencrypted: Unencrypted,
}

pub(crate) fn compile_decrypt(
    name: String,
    spec: DecryptSpec,
    context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let single = KeySource {
        key_file: spec.key_file,
        key_env: spec.key_env,
        key_id: spec.key_id,
    };
    let keys = keys::load_ring(
        single,
        spec.keys,
        context,
        keys::load_encryption_key,
        EncryptionKey::id,
    )?;
    Ok(Arc::new(Decrypt {
        name,
        keys,
        unencrypted: spec.unencrypted,
    }))
}

/// What decrypting one event came to.
enum Decrypted {
    Done,
    NotEncrypted,
}

impl Decrypt {
    fn decrypt(&self, item: &mut Item) -> Result<Decrypted, String> {
        let body = item.body().clone();
        let Some(algorithm) = string_property(item, ENCRYPTION)? else {
            return Ok(Decrypted::NotEncrypted);
        };
        if algorithm != ALGORITHM {
            return Err(format!(
                "encrypted with {algorithm:?}; this step decrypts {ALGORITHM}"
            ));
        }
        let key_id = string_property(item, ENCRYPTION_KEY_ID)?
            .ok_or_else(|| format!("no {ENCRYPTION_KEY_ID} property"))?;
        let key = self.keys.find(key_id).ok_or_else(|| {
            format!(
                "encrypted with key {key_id:?}, which this step does not have (it has {})",
                self.keys.ids()
            )
        })?;
        let content_type = string_property(item, ORIGINAL_CONTENT_TYPE)?.map(str::to_owned);
        let aad = associated_data(key_id, content_type.as_deref());
        if body.len() < NONCE_LEN + TAG_LEN {
            return Err(format!(
                "the body is {} bytes, shorter than a nonce and a tag ({})",
                body.len(),
                NONCE_LEN + TAG_LEN
            ));
        }
        let mut opened = body.to_vec();
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&opened[..NONCE_LEN]);
        let plain_len = key
            .aead()
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad),
                &mut opened[NONCE_LEN..],
            )
            .map_err(|_| {
                format!(
                    "does not decrypt with key {key_id:?}: the body, its key id or its content \
                     type was changed, or another key with that id encrypted it"
                )
            })?
            .len();
        let plain = Bytes::from(opened).slice(NONCE_LEN..NONCE_LEN + plain_len);
        let event = item.event_mut();
        event.body = plain;
        event.content_type = content_type;
        for key in [ENCRYPTION, ENCRYPTION_KEY_ID, ORIGINAL_CONTENT_TYPE] {
            item.remove_property(key);
        }
        Ok(Decrypted::Done)
    }
}

impl Step for Decrypt {
    fn edits_each_event_alone(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, _context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        for mut item in items {
            match self.decrypt(&mut item) {
                Ok(Decrypted::Done) => out.pass(item),
                Ok(Decrypted::NotEncrypted) if self.unencrypted == Unencrypted::Pass => {
                    out.pass(item);
                }
                Ok(Decrypted::NotEncrypted) => out.reject(
                    item,
                    format!("the event is not encrypted (no {ENCRYPTION} property)"),
                ),
                Err(reason) => out.reject(item, reason),
            }
        }
    }
}

/// `aead::MAX_TAG_LEN` is what GCM writes; checked so `TAG_LEN` cannot drift from ring.
const _: () = assert!(aead::MAX_TAG_LEN == TAG_LEN);

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::spec::compile;
    use crate::step::{Edited, Editor};
    use crate::steps::keys::testing::*;

    const CONTEXT: Context<'static> = Context {
        partition: "0",
        now_ms: 0,
    };

    /// An encrypt and a decrypt step sharing a fresh key in `dir`.
    fn steps(dir: &std::path::Path, decrypt: serde_json::Value) -> (Arc<dyn Step>, Arc<dyn Step>) {
        write_secret(
            dir,
            "events.key",
            keys::base64_encode(&random(32)).as_bytes(),
        );
        let ctx = context(dir, &[]);
        let mut table = json!({"key_file": "events.key"});
        for (k, v) in decrypt.as_object().expect("object") {
            table[k] = v.clone();
        }
        (
            compile("encrypt", None, json!({"key_file": "events.key"}), &ctx).expect("encrypt"),
            compile("decrypt", None, table, &ctx).expect("decrypt"),
        )
    }

    fn run(step: &Arc<dyn Step>, item: Item) -> Edited {
        Editor::new(vec![step.clone()]).apply(&CONTEXT, vec![item])
    }

    fn encrypted(step: &Arc<dyn Step>) -> Item {
        let mut edited = run(step, item(r#"{"reading":{"temperature":21.5}}"#, 5));
        assert!(edited.rejected.is_empty());
        edited.passed.remove(0)
    }

    fn rejection(step: &Arc<dyn Step>, item: Item) -> String {
        let edited = run(step, item);
        assert!(edited.passed.is_empty(), "should be refused");
        edited.rejected[0].reason.clone()
    }

    #[test]
    fn a_body_round_trips_and_its_content_type_comes_back() {
        let dir = tempfile::tempdir().expect("dir");
        let (encrypt, decrypt) = steps(dir.path(), json!({}));
        let mut sealed = encrypted(&encrypt);
        assert_eq!(sealed.content_type(), Some(ENCRYPTED_CONTENT_TYPE));
        assert_eq!(string_property(&sealed, ENCRYPTION), Ok(Some(ALGORITHM)));
        assert_eq!(sealed.body().len(), 12 + 32 + 16);
        assert!(!sealed.body().windows(11).any(|w| w == b"temperature"));
        let mut edited = run(&decrypt, sealed);
        let mut plain = edited.passed.remove(0);
        assert_eq!(
            plain.body().as_ref(),
            br#"{"reading":{"temperature":21.5}}"#
        );
        assert_eq!(plain.content_type(), Some("application/json"));
        assert!(plain.properties().is_empty(), "{:?}", plain.properties());
    }

    #[test]
    fn two_encryptions_of_one_body_differ() {
        let dir = tempfile::tempdir().expect("dir");
        let (encrypt, _) = steps(dir.path(), json!({}));
        let (mut a, mut b) = (encrypted(&encrypt), encrypted(&encrypt));
        assert_ne!(a.body(), b.body());
    }

    #[test]
    fn tampering_truncation_and_a_wrong_key_are_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let (encrypt, decrypt) = steps(dir.path(), json!({}));
        let mut flipped = encrypted(&encrypt);
        let mut body = flipped.body().to_vec();
        body[20] ^= 0x80;
        flipped.set_body(Bytes::from(body));
        assert!(rejection(&decrypt, flipped).contains("does not decrypt"));
        let mut short = encrypted(&encrypt);
        short.set_body(Bytes::from_static(b"0123456789"));
        assert!(rejection(&decrypt, short).contains("shorter than a nonce and a tag"));
        let mut truncated = encrypted(&encrypt);
        let cut = truncated.body().slice(..NONCE_LEN + TAG_LEN + 5);
        truncated.set_body(cut);
        assert!(rejection(&decrypt, truncated).contains("does not decrypt"));
        let mut retyped = encrypted(&encrypt);
        retyped.set_property(ORIGINAL_CONTENT_TYPE, text("text/html"));
        assert!(rejection(&decrypt, retyped).contains("does not decrypt"));
        let other = tempfile::tempdir().expect("dir");
        let (_, stranger) = steps(other.path(), json!({}));
        assert!(rejection(&stranger, encrypted(&encrypt)).contains("does not have"));
        let (_, same_id) = steps(other.path(), json!({"key_id": "k1"}));
        let mut relabelled = encrypted(&encrypt);
        relabelled.set_property(ENCRYPTION_KEY_ID, text("k1"));
        assert!(rejection(&same_id, relabelled).contains("does not decrypt"));
    }

    #[test]
    fn unencrypted_events_are_refused_or_passed_as_configured() {
        let dir = tempfile::tempdir().expect("dir");
        let (encrypt, strict) = steps(dir.path(), json!({}));
        assert!(rejection(&strict, item("{}", 1)).contains("not encrypted"));
        let (_, lenient) = steps(dir.path(), json!({"unencrypted": "pass"}));
        assert_eq!(run(&lenient, item("{}", 1)).passed.len(), 1);
        assert!(rejection(&encrypt, encrypted(&encrypt)).contains("already encrypted"));
    }

    #[test]
    fn a_bad_key_file_stops_the_step_from_compiling() {
        let dir = tempfile::tempdir().expect("dir");
        write_secret(
            dir.path(),
            "short.key",
            keys::base64_encode(&random(31)).as_bytes(),
        );
        let ctx = context(dir.path(), &[]);
        let e =
            compile("encrypt", None, json!({"key_file": "short.key"}), &ctx).expect_err("31 bytes");
        assert_eq!(e.key.as_deref(), Some("key_file"));
        let e = compile(
            "decrypt",
            None,
            json!({"unencrypted": "maybe", "key_file": "k"}),
            &ctx,
        )
        .expect_err("bad option");
        assert!(e.message.contains("pass"), "{e}");
    }

    proptest! {
        #[test]
        fn decrypt_never_panics_on_arbitrary_events(
            body in proptest::collection::vec(any::<u8>(), 0..120),
            algorithm in prop_oneof![Just(ALGORITHM.to_owned()), ".{0,10}"],
            key_id in prop_oneof![Just("k".to_owned()), ".{0,10}"],
            content_type in proptest::option::of(".{0,10}"),
            typed in any::<bool>(),
        ) {
            let dir = tempfile::tempdir().expect("dir");
            let (_, decrypt) = steps(dir.path(), json!({"key_id": "k"}));
            let mut item = item("", 1);
            item.set_body(Bytes::from(body));
            item.set_property(ENCRYPTION, text(&algorithm));
            let id = if typed { PropertyValue::Int64(1) } else { text(&key_id) };
            item.set_property(ENCRYPTION_KEY_ID, id);
            if let Some(ct) = content_type {
                item.set_property(ORIGINAL_CONTENT_TYPE, text(&ct));
            }
            let edited = run(&decrypt, item);
            prop_assert_eq!(edited.passed.len() + edited.rejected.len(), 1);
        }
    }
}
