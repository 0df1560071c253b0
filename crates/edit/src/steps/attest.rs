//! `attest`: a signed "received by / received at" statement, so a consumer can prove which
//! replicator handled an event, when, from which source partition and position, and that the
//! body it holds is the body that replicator saw.
//!
//! ```toml
//! [[step]]
//! kind = "attest"
//! by = "replicator-eu-1"           # 1-64 letters, digits, '_' or '-'
//! algorithm = "ed25519"            # or "hmac-sha256"
//! key_file = "keys/attest.pem"     # or key_env; key_id optional (see `keys`)
//! ```
//!
//! Each attester writes two properties named after it, so hops stack (each replicator on the
//! way adds its own pair, and none overwrites another's):
//!
//! - `tributary-attestation.<by>`: the statement, compact JSON, for example
//!   `{"v":1,"by":"replicator-eu-1","at":"2024-05-01T12:00:00.123Z","partition":"3",
//!   "sequence":42,"body_sha256":"<hex>","alg":"ed25519","key_id":"<id>"}` — `at` is the
//!   replicator's clock in RFC 3339 UTC with milliseconds; `partition` and `sequence` are the
//!   source's;
//! - `tributary-attestation-signature.<by>`: the signature (HMAC-SHA256 or Ed25519) of the
//!   statement's exact UTF-8 bytes, standard base64.
//!
//! A consumer checks one with [`verify_attestation`] (or, in another language: verify the
//! signature over the property's bytes, parse the JSON, compare `body_sha256` with the body).
//!
//! # Guarantees
//!
//! - The signature covers the whole statement, the body's SHA-256 included: a changed body, a
//!   changed statement or another key fails the check. Other properties are not covered (use
//!   `sign` for them).
//! - The step writes only its own two properties; it never refuses an event unless the clock
//!   is outside what RFC 3339 can write.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::macros::format_description;
use tributary_event::{EventData, PropertyValue};

use crate::item::Item;
use crate::spec::{CompileContext, SpecError};
use crate::step::{Context, Output, Step};
use crate::steps::keys::{self, Algorithm, KeySource, SigningKey, VerifyingKey};
use crate::steps::sign::{sha256, text};

/// The statement property is this followed by the attester's name.
pub const ATTESTATION_PREFIX: &str = "tributary-attestation.";
/// The signature property is this followed by the attester's name.
pub const SIGNATURE_PREFIX: &str = "tributary-attestation-signature.";

/// The longest attester name: it is part of two property names on every event; 64 characters
/// hold a region, a role and a number.
pub const BY_CHARS_MAX: usize = 64;

/// The statement format's version.
const VERSION: u32 = 1;

/// The statement property of attester `by`.
pub fn attestation_property(by: &str) -> String {
    format!("{ATTESTATION_PREFIX}{by}")
}

/// The signature property of attester `by`.
pub fn signature_property(by: &str) -> String {
    format!("{SIGNATURE_PREFIX}{by}")
}

/// A statement as written.
#[derive(Serialize)]
struct Statement<'a> {
    v: u32,
    by: &'a str,
    at: &'a str,
    partition: &'a str,
    sequence: i64,
    body_sha256: &'a str,
    alg: &'a str,
    key_id: &'a str,
}

/// A checked attestation: who received the event, when, and from where.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Attestation {
    /// The statement format's version (1).
    pub v: u32,
    /// The attester.
    pub by: String,
    /// When it received the event (RFC 3339, UTC, milliseconds).
    pub at: String,
    /// The source partition.
    pub partition: String,
    /// The source sequence number.
    pub sequence: i64,
    /// The SHA-256 of the body the attester saw, hex.
    pub body_sha256: String,
    /// The signature algorithm.
    pub alg: String,
    /// The id of the key that signed.
    pub key_id: String,
}

/// Why an attestation does not check out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("attestation by {by:?}: {reason}")]
pub struct AttestationError {
    /// The attester asked about.
    pub by: String,
    /// What is wrong.
    pub reason: String,
}

/// Checks the attestation of attester `by` on `event` with `key`: the statement is signed by
/// `key`, names `by`, and its body hash is `event`'s body's.
pub fn verify_attestation(
    event: &EventData,
    by: &str,
    key: &VerifyingKey,
) -> Result<Attestation, AttestationError> {
    let error = |reason: String| AttestationError {
        by: by.to_owned(),
        reason,
    };
    let string = |name: String| match event.property(&name) {
        Some(PropertyValue::String(s)) => Ok(s.as_str()),
        Some(other) => Err(error(format!("{name} is a {}", other.type_name()))),
        None => Err(error(format!("no {name} property"))),
    };
    let statement = string(attestation_property(by))?;
    let signature = string(signature_property(by))?;
    let attestation: Attestation = serde_json::from_str(statement)
        .map_err(|e| error(format!("the statement is not an attestation: {e}")))?;
    if attestation.v != VERSION || attestation.by != by {
        return Err(error(format!(
            "the statement is version {} by {:?}; expected version {VERSION} by {by:?}",
            attestation.v, attestation.by
        )));
    }
    if attestation.alg != key.algorithm().name() || attestation.key_id != key.id() {
        return Err(error(format!(
            "signed with {} key {:?}; the key given is {} key {:?}",
            attestation.alg,
            attestation.key_id,
            key.algorithm().name(),
            key.id()
        )));
    }
    let raw = keys::base64_decode(signature)
        .ok_or_else(|| error("the signature is not base64".into()))?;
    if !key.verify(statement.as_bytes(), &raw) {
        return Err(error("the signature does not match the statement".into()));
    }
    if attestation.body_sha256 != keys::hex(&sha256(&event.body)) {
        return Err(error("the body is not the body the attester saw".into()));
    }
    Ok(attestation)
}

/// The `attest` step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttestSpec {
    /// The attester's name.
    pub by: String,
    /// `hmac-sha256` or `ed25519`.
    pub algorithm: Algorithm,
    /// A file holding the key.
    pub key_file: Option<std::path::PathBuf>,
    /// An environment variable holding the key.
    pub key_env: Option<String>,
    /// The key's id (default: derived from the key).
    pub key_id: Option<String>,
}

/// Attests events.
#[derive(Debug)]
struct Attest {
    name: String,
    by: String,
    key: SigningKey,
    statement_property: String,
    signature_property: String,
}

pub(crate) fn compile(
    name: String,
    spec: AttestSpec,
    context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let by = spec.by;
    let fits = !by.is_empty()
        && by.len() <= BY_CHARS_MAX
        && by
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'));
    if !fits {
        return Err(SpecError::at(
            "by",
            format!("{by:?} must be 1 to {BY_CHARS_MAX} letters, digits, '_' or '-'"),
        ));
    }
    let source = KeySource {
        key_file: spec.key_file,
        key_env: spec.key_env,
        key_id: spec.key_id,
    };
    let key = keys::load_signing_key(spec.algorithm, &source, "", context)?;
    Ok(Arc::new(Attest {
        name,
        statement_property: attestation_property(&by),
        signature_property: signature_property(&by),
        by,
        key,
    }))
}

/// `ms` since the Unix epoch in RFC 3339, UTC, with milliseconds.
fn rfc3339_ms(ms: i64) -> Option<String> {
    let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).ok()?;
    at.format(format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    ))
    .ok()
}

impl Step for Attest {
    fn edits_each_event_alone(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        let Some(at) = rfc3339_ms(context.now_ms) else {
            for item in items {
                out.reject(
                    item,
                    format!("the clock ({} ms) is not a date", context.now_ms),
                );
            }
            return;
        };
        for mut item in items {
            let body_sha256 = keys::hex(&sha256(item.body()));
            let statement = Statement {
                v: VERSION,
                by: &self.by,
                at: &at,
                partition: context.partition,
                sequence: item.position().sequence_number,
                body_sha256: &body_sha256,
                alg: self.key.algorithm().name(),
                key_id: self.key.id(),
            };
            // A struct of strings and integers always serialises.
            let Ok(statement) = serde_json::to_string(&statement) else {
                out.reject(item, "the statement could not be written");
                continue;
            };
            let signature = self.key.sign_base64(statement.as_bytes());
            item.set_property(
                &self.statement_property,
                PropertyValue::String(statement.into()),
            );
            item.set_property(&self.signature_property, text(&signature));
            out.pass(item);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::spec::compile as compile_step;
    use crate::step::Editor;
    use crate::steps::keys::testing::*;

    const CONTEXT: Context<'static> = Context {
        partition: "3",
        // 2023-11-14T22:13:20.123Z
        now_ms: 1_700_000_000_123,
    };

    /// An attest step by `by` with a fresh key in `dir`, and the key that checks it.
    fn attester(dir: &std::path::Path, by: &str, algorithm: &str) -> (Arc<dyn Step>, VerifyingKey) {
        let file = format!("{by}.key");
        let ctx = context(dir, &[]);
        let key = if algorithm == "ed25519" {
            let der = ed25519_pkcs8();
            write_secret(dir, &file, pem("PRIVATE KEY", &der).as_bytes());
            SigningKey::ed25519(None, &der)
                .expect("key")
                .verifying_key()
        } else {
            let secret = random(32);
            write_secret(dir, &file, keys::base64_encode(&secret).as_bytes());
            VerifyingKey::Hmac(keys::HmacKey::new(None, &secret).expect("key"))
        };
        let table = json!({"by": by, "algorithm": algorithm, "key_file": file});
        (
            compile_step("attest", None, table, &ctx).expect("compiles"),
            key,
        )
    }

    fn attested(steps: Vec<Arc<dyn Step>>) -> EventData {
        let edited = Editor::new(steps).apply(&CONTEXT, vec![item(r#"{"a":1}"#, 42)]);
        edited
            .passed
            .into_iter()
            .next()
            .expect("passed")
            .into_event()
    }

    #[test]
    fn an_attestation_round_trips_with_both_algorithms() {
        for algorithm in ["hmac-sha256", "ed25519"] {
            let dir = tempfile::tempdir().expect("dir");
            let (step, key) = attester(dir.path(), "replicator-eu-1", algorithm);
            let event = attested(vec![step]);
            let a = verify_attestation(&event, "replicator-eu-1", &key).expect("checks out");
            assert_eq!(a.at, "2023-11-14T22:13:20.123Z");
            assert_eq!((a.partition.as_str(), a.sequence), ("3", 42));
            assert_eq!(a.body_sha256, keys::hex(&sha256(br#"{"a":1}"#)));
            assert_eq!(a.alg, algorithm);
        }
    }

    #[test]
    fn hops_stack_and_each_checks_out_on_its_own() {
        let dir = tempfile::tempdir().expect("dir");
        let (eu, eu_key) = attester(dir.path(), "eu", "ed25519");
        let (us, us_key) = attester(dir.path(), "us", "hmac-sha256");
        let event = attested(vec![eu, us]);
        assert_eq!(event.properties.len(), 4);
        assert!(verify_attestation(&event, "eu", &eu_key).is_ok());
        assert!(verify_attestation(&event, "us", &us_key).is_ok());
        let e = verify_attestation(&event, "us", &eu_key).expect_err("wrong key");
        assert!(e.reason.contains("the key given is"), "{e}");
    }

    #[test]
    fn a_changed_body_statement_or_key_is_caught() {
        let dir = tempfile::tempdir().expect("dir");
        let (step, key) = attester(dir.path(), "eu", "ed25519");
        let mut event = attested(vec![step.clone()]);
        event.body = Bytes::from_static(br#"{"a":2}"#);
        let e = verify_attestation(&event, "eu", &key).expect_err("body");
        assert!(e.reason.contains("not the body"), "{e}");
        let mut event = attested(vec![step.clone()]);
        let name = attestation_property("eu");
        let Some(PropertyValue::String(s)) = event.property(&name) else {
            panic!("statement")
        };
        let forged = s.replace("\"sequence\":42", "\"sequence\":43");
        event.properties.retain(|(k, _)| *k != name);
        event
            .properties
            .push((name.into(), PropertyValue::String(forged.into())));
        let e = verify_attestation(&event, "eu", &key).expect_err("statement");
        assert!(e.reason.contains("does not match"), "{e}");
        let other = tempfile::tempdir().expect("dir");
        let (_, stranger) = attester(other.path(), "eu", "ed25519");
        assert!(verify_attestation(&attested(vec![step]), "eu", &stranger).is_err());
    }

    #[test]
    fn a_bad_attester_name_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let ctx = context(dir.path(), &[]);
        let table = json!({"by": "eu.1", "algorithm": "ed25519", "key_file": "x"});
        let e = compile_step("attest", None, table, &ctx).expect_err("dot");
        assert_eq!(e.key.as_deref(), Some("by"));
    }

    proptest! {
        #[test]
        fn checking_never_panics_on_arbitrary_properties(
            statement in prop_oneof![
                ".{0,60}",
                Just(r#"{"v":1,"by":"eu","at":"x","partition":"0","sequence":1,"body_sha256":"","alg":"hmac-sha256","key_id":"k"}"#.to_owned()),
            ],
            signature in ".{0,60}",
            body in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let key = VerifyingKey::Hmac(keys::HmacKey::new(Some("k"), &[7u8; 32]).expect("key"));
            let event = EventData::new(Bytes::from(body))
                .with_property(attestation_property("eu"), PropertyValue::String(statement.into()))
                .with_property(signature_property("eu"), PropertyValue::String(signature.into()));
            prop_assert!(verify_attestation(&event, "eu", &key).is_err());
        }
    }
}
