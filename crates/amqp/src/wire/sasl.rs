//! The SASL layer: which mechanisms are offered and what each proves.
//!
//! - `ANONYMOUS` (Python always; JavaScript with the key name as its initial response) and
//!   `MSSBCBS` prove nothing: the client authorizes later by putting tokens on `$cbs`.
//! - `PLAIN` with a policy name and key (primary or secondary) proves the policy: the connection
//!   then holds a grant with that policy's rights on its scope (the namespace, or its event
//!   hub). A wrong name or key fails the handshake.
//!
//! A client may also skip SASL and send the AMQP header at once (rhea with token credentials).

use tokio::io::{AsyncRead, AsyncWrite};
use tributary_amqp_engine::sasl::{self, ClientInit, SaslError};

use crate::auth::ConnectionGrants;
use crate::policies::{AccessPolicies, Signer};

const ANONYMOUS: &str = "ANONYMOUS";
const MSSBCBS: &str = "MSSBCBS";
const PLAIN: &str = "PLAIN";

/// Runs the security layer on a new connection; a proven PLAIN policy becomes a grant.
pub(crate) async fn accept<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buffered: &mut Vec<u8>,
    policies: &AccessPolicies,
    grants: &ConnectionGrants,
) -> Result<(), SaslError> {
    let mut proven = None;
    sasl::accept(
        stream,
        buffered,
        &[ANONYMOUS, MSSBCBS, PLAIN],
        |init| match judge(policies, init) {
            Some(grant) => {
                proven = grant;
                true
            }
            None => false,
        },
    )
    .await?;
    if let Some(signer) = proven {
        grants.grant_login(signer);
    }
    Ok(())
}

/// `None`: refused. `Some(None)`: passed, proving nothing. `Some(Some(..))`: a policy proven.
fn judge(policies: &AccessPolicies, init: &ClientInit) -> Option<Option<Signer>> {
    match init.mechanism.as_str() {
        ANONYMOUS | MSSBCBS => Some(None),
        PLAIN => plain(policies, &init.initial_response).map(Some),
        _ => None,
    }
}

/// The policy a PLAIN response (`authzid \0 name \0 key`) proves, if any.
fn plain(policies: &AccessPolicies, response: &[u8]) -> Option<Signer> {
    let mut parts = response.split(|b| *b == 0);
    let (Some(_authzid), Some(name), Some(key), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let name = std::str::from_utf8(name).ok()?;
    policies.verify_key(name, key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policies::{AccessPolicy, Right, Scope};

    fn signer(name: &str, rights: Vec<Right>) -> Option<Signer> {
        Some(Signer {
            name: name.to_owned(),
            rights,
            scope: Scope::Namespace,
        })
    }

    fn policies() -> AccessPolicies {
        AccessPolicies::new(vec![AccessPolicy {
            name: "sender".into(),
            key: "secret".into(),
            secondary_key: Some("second".into()),
            rights: vec![Right::Send],
        }])
        .unwrap()
    }

    #[test]
    fn plain_checks_the_policy_key() {
        let p = policies();
        assert_eq!(
            plain(&p, b"\0sender\0secret"),
            signer("sender", vec![Right::Send])
        );
        assert_eq!(
            plain(&p, b"\0sender\0second"),
            signer("sender", vec![Right::Send])
        );
        for bad in [
            &b"\0sender\0wrong"[..],
            b"\0nobody\0secret",
            b"sender\0secret",
            b"\0sender\0secret\0x",
            b"",
        ] {
            assert_eq!(plain(&p, bad), None, "{bad:?}");
        }
        let init = |mechanism: &str| ClientInit {
            mechanism: mechanism.into(),
            initial_response: Vec::new(),
        };
        assert_eq!(judge(&p, &init("ANONYMOUS")), Some(None));
        assert_eq!(judge(&p, &init("MSSBCBS")), Some(None));
        assert_eq!(judge(&p, &init("PLAIN")), None);
        assert_eq!(judge(&p, &init("EXTERNAL")), None);
    }

    #[test]
    fn plain_takes_an_unsaved_key_of_a_saved_name_only_once_added() {
        let saved = AccessPolicies::new(vec![AccessPolicy {
            name: crate::policies::EMULATOR_KEY_NAME.into(),
            key: "own-key".into(),
            secondary_key: None,
            rights: vec![Right::Listen],
        }])
        .unwrap();
        let login = b"\0RootManageSharedAccessKey\0SAS_KEY_VALUE";
        assert_eq!(plain(&saved, login), None);
        let compat = saved.accepting_unsaved(AccessPolicy::emulator_well_known());
        assert_eq!(
            plain(&compat, login),
            signer("RootManageSharedAccessKey", vec![Right::Manage])
        );
        assert_eq!(
            plain(&compat, b"\0RootManageSharedAccessKey\0own-key"),
            signer("RootManageSharedAccessKey", vec![Right::Listen])
        );
    }
}
