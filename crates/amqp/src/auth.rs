//! Claims-based authorization of one connection.
//!
//! Public so other front doors (the Kafka door's SASL logins) check grants by the same rules.
//!
//! A client puts SAS tokens on the connection's `$cbs` node; each verified token becomes a
//! [`Grant`] for its audience. A link may attach only if an unexpired grant covers its entity
//! with a right the operation needs: the grant's audience path (host ignored, case-insensitive)
//! equals the entity path or is a prefix of it ending at a `/` (a namespace token `sb://host/`
//! covers everything). A token signed by an event hub's policy is only accepted for that hub
//! (see [`crate::policies`]), and a PLAIN login with such a policy's key grants that hub only.
//!
//! Grants are fixed when made: a key regenerated later refuses new tokens and logins at once,
//! while a grant already made keeps until its token expires (a PLAIN login's: until the
//! connection closes), as in Event Hubs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::conditions::{self, Refusal};
use crate::limits::GRANTS_PER_CONNECTION_MAX;
use crate::policies::{AccessPolicies, Right, Signer, TokenRefused};

/// What a verified token, or a SASL PLAIN login, grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The audience the token was issued for, as given (empty: the whole namespace).
    pub audience: String,
    /// The policy's rights.
    pub rights: Vec<Right>,
    /// When the grant ends, unix seconds.
    pub expiry: i64,
    /// The policy that signed it.
    pub key_name: String,
}

impl Grant {
    /// Whether the grant includes `right` (Manage includes everything).
    pub fn allows(&self, right: Right) -> bool {
        self.rights.contains(&right) || self.rights.contains(&Right::Manage)
    }
}

/// Verifies `token` against `policies` at `now_secs` (unix seconds) and returns what it grants.
pub fn verify(
    token: &str,
    policies: &AccessPolicies,
    now_secs: i64,
) -> Result<Grant, TokenRefused> {
    // The rights are those of the policy whose key signed it: policies may share a name (a
    // saved one and `serve --emulator-compat`'s unsaved one; policies of different scopes).
    let (verified, signer) = policies.verify_token(token, now_secs)?;
    Ok(Grant {
        audience: verified.audience,
        rights: signer.rights,
        expiry: verified.expiry,
        key_name: verified.key_name,
    })
}

/// What a login with a policy's key (SASL PLAIN, a connection string as a Kafka password)
/// grants: its rights on its scope — the namespace, or its event hub — until the connection
/// closes.
pub fn login_grant(signer: Signer) -> Grant {
    Grant {
        audience: signer.scope.hub().unwrap_or_default().to_owned(),
        rights: signer.rights,
        expiry: i64::MAX,
        key_name: signer.name,
    }
}

/// What an operation needs: any one of these rights.
pub type Needed = &'static [Right];

/// Sending events.
pub const SEND: Needed = &[Right::Send, Right::Manage];
/// Receiving events.
pub const LISTEN: Needed = &[Right::Listen, Right::Manage];
/// Reading hub and partition properties: producers need it before they send (the Python producer
/// reads the partition ids first), consumers before they receive.
pub const READ: Needed = &[Right::Listen, Right::Send, Right::Manage];

/// The grants of one connection.
#[derive(Debug, Default)]
pub(crate) struct ConnectionGrants {
    grants: Mutex<Vec<Grant>>,
    /// Raised for good by the first accepted token or PLAIN login: the connection is
    /// authenticated, and the limits on unauthenticated connections no longer apply.
    authenticated: Arc<AtomicBool>,
}

/// The audience's path, lower-cased, without scheme, host or surrounding slashes.
pub fn audience_path(audience: &str) -> String {
    tributary_eventhubs::address::strip_host(audience).to_ascii_lowercase()
}

/// Whether a grant for `audience` covers `entity_path` (both lower-cased paths).
fn covers(audience: &str, entity_path: &str) -> bool {
    audience.is_empty()
        || audience == entity_path
        || (entity_path.starts_with(audience) && entity_path.as_bytes()[audience.len()] == b'/')
}

/// A refusal for a missing, expired or insufficient grant.
fn unauthorized(description: String) -> Refusal {
    Refusal::new(conditions::UNAUTHORIZED, description)
}

/// Checks `grant` against an entity and the rights it needs.
pub fn check(
    grant: &Grant,
    entity_path: &str,
    needed: Needed,
    now_secs: i64,
) -> Result<(), Refusal> {
    if grant.expiry <= now_secs {
        return Err(unauthorized(format!(
            "the token for {:?} has expired",
            grant.audience
        )));
    }
    if !covers(&audience_path(&grant.audience), entity_path) {
        return Err(unauthorized(format!(
            "the token for {:?} does not cover {entity_path:?}",
            grant.audience
        )));
    }
    if !needed.iter().any(|r| grant.allows(*r)) {
        return Err(unauthorized(claims_required(needed, entity_path)));
    }
    Ok(())
}

fn claims_required(needed: Needed, entity_path: &str) -> String {
    format!(
        "Unauthorized access. '{}' claim(s) are required to perform this operation. Resource: '{entity_path}'.",
        needed[0]
    )
}

impl ConnectionGrants {
    /// Remembers what a verified token grants (see [`verify`]), in place of an earlier grant
    /// for the same audience.
    pub(crate) fn record(&self, grant: Grant, now_secs: i64) {
        let mut grants = self.grants.lock().expect("grants");
        grants.retain(|g| g.expiry > now_secs && g.audience != grant.audience);
        if grants.len() >= GRANTS_PER_CONNECTION_MAX {
            grants.remove(0);
        }
        grants.push(grant);
        self.authenticated.store(true, Ordering::Relaxed);
    }

    /// Whether a token or a PLAIN login was ever accepted on this connection.
    pub(crate) fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Relaxed)
    }

    /// The flag [`Self::is_authenticated`] reads, for the connection's byte stream.
    pub(crate) fn authenticated_flag(&self) -> Arc<AtomicBool> {
        self.authenticated.clone()
    }

    /// Records the grant SASL PLAIN with a policy's name and key proved (see [`login_grant`]).
    pub(crate) fn grant_login(&self, signer: Signer) {
        let mut grants = self.grants.lock().expect("grants");
        grants.push(login_grant(signer));
        self.authenticated.store(true, Ordering::Relaxed);
    }

    /// Whether some grant lets this connection do an operation needing `needed` on
    /// `entity_path`, and until when (Unix seconds: the latest expiry among the grants that
    /// do). The error is the description the service gives.
    pub(crate) fn authorize(
        &self,
        entity_path: &str,
        needed: Needed,
        now_secs: i64,
    ) -> Result<i64, Refusal> {
        let grants = self.grants.lock().expect("grants");
        let mut last_error = None;
        let mut until = None;
        for grant in grants.iter() {
            match check(grant, entity_path, needed, now_secs) {
                Ok(()) => until = until.max(Some(grant.expiry)),
                Err(e) => last_error = Some(e),
            }
        }
        if let Some(until) = until {
            return Ok(until);
        }
        Err(match last_error {
            Some(e) if grants.len() == 1 => e,
            _ => unauthorized(format!(
                "{} No valid token covers it; put one on $cbs first.",
                claims_required(needed, entity_path)
            )),
        })
    }
}

#[cfg(test)]
mod tests {
    use tributary_eventhubs::sas;

    use super::*;

    fn policies() -> AccessPolicies {
        crate::policies::test_policies()
    }

    #[test]
    fn audiences_cover_their_entity_and_below_only() {
        assert!(covers("hub", "hub"));
        assert!(covers("hub", "hub/partitions/0"));
        assert!(covers("", "anything"));
        assert!(!covers("hub", "hub2"));
        assert!(!covers("hub/partitions/0", "hub"));
        assert_eq!(audience_path("sb://LocalHost:5672/Hub/"), "hub");
        assert_eq!(audience_path("sb://localhost/"), "");
    }

    #[test]
    fn rights_expiry_and_scope_are_enforced() {
        let grants = ConnectionGrants::default();
        let now = 1_000;
        assert!(grants.authorize("hub", SEND, now).is_err(), "no token yet");
        let token = sas::sign("sb://localhost/hub", "listener", "listen-key", 1_060);
        grants.record(verify(&token, &policies(), now).unwrap(), now);
        assert!(
            grants
                .authorize("hub/consumergroups/$default/partitions/0", LISTEN, now)
                .is_ok()
        );
        assert!(grants.authorize("hub", READ, now).is_ok());
        let refused = grants.authorize("hub", SEND, now).unwrap_err();
        assert!(
            refused.description.contains("'Send' claim(s) are required"),
            "{refused}"
        );
        assert!(grants.authorize("other", LISTEN, now).is_err());
        assert!(
            grants.authorize("hub", LISTEN, now + 60).is_err(),
            "expired"
        );
        let root = sas::sign("sb://localhost/", "root", "c2VjcmV0LWtleQ==", 1_060);
        grants.record(verify(&root, &policies(), now).unwrap(), now);
        assert!(grants.authorize("other/partitions/1", SEND, now).is_ok());
    }
}
