//! The SASL layer: which mechanisms are offered and what each proves.
//!
//! - `ANONYMOUS` (Python always; JavaScript with the key name as its initial response) and
//!   `MSSBCBS` prove nothing: the client authorizes later by putting tokens on `$cbs`.
//! - `PLAIN` with a policy name and key proves the policy: the connection then holds a
//!   namespace-wide grant with that policy's rights. A wrong name or key fails the handshake.
//!
//! The engine's acceptor is synchronous and cloned per negotiation, so the outcome is shared
//! through an `Arc` the connection reads once the handshake is done.

use std::sync::{Arc, Mutex};

use fe2o3_amqp::acceptor::SaslAcceptor;
use fe2o3_amqp::acceptor::sasl_acceptor::SaslServerFrame;
use fe2o3_amqp_types::primitives::{Array, Symbol};
use fe2o3_amqp_types::sasl::{SaslCode, SaslInit, SaslOutcome, SaslResponse};

use crate::policies::{AccessPolicies, Right};

const ANONYMOUS: &str = "ANONYMOUS";
const MSSBCBS: &str = "MSSBCBS";
const PLAIN: &str = "PLAIN";

/// The rights a successful PLAIN exchange proved, if any.
pub(crate) type PlainGrant = Arc<Mutex<Option<(String, Vec<Right>)>>>;

#[derive(Debug, Clone)]
pub(crate) struct Mechanisms {
    pub(crate) policies: AccessPolicies,
    pub(crate) plain: PlainGrant,
}

fn outcome(code: SaslCode) -> SaslServerFrame {
    SaslServerFrame::Outcome(SaslOutcome {
        code,
        additional_data: None,
    })
}

/// Compares two byte strings in time that depends only on their lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Mechanisms {
    fn plain(&self, response: &[u8]) -> SaslCode {
        let mut parts = response.split(|b| *b == 0);
        let (Some(_authzid), Some(name), Some(key), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return SaslCode::Auth;
        };
        let Ok(name) = std::str::from_utf8(name) else {
            return SaslCode::Auth;
        };
        match self.policies.get(name) {
            Some(policy) if constant_time_eq(policy.key.as_bytes(), key) => {
                *self.plain.lock().expect("sasl outcome") =
                    Some((policy.name.clone(), policy.rights.clone()));
                SaslCode::Ok
            }
            _ => SaslCode::Auth,
        }
    }
}

impl SaslAcceptor for Mechanisms {
    fn mechanisms(&self) -> Array<Symbol> {
        Array::from(vec![
            Symbol::from(ANONYMOUS),
            Symbol::from(MSSBCBS),
            Symbol::from(PLAIN),
        ])
    }

    fn on_init(&mut self, init: SaslInit) -> SaslServerFrame {
        match init.mechanism.as_str() {
            ANONYMOUS | MSSBCBS => outcome(SaslCode::Ok),
            PLAIN => {
                let response = init
                    .initial_response
                    .map(|b| b.into_vec())
                    .unwrap_or_default();
                outcome(self.plain(&response))
            }
            _ => outcome(SaslCode::Auth),
        }
    }

    fn on_response(&mut self, _response: SaslResponse) -> SaslServerFrame {
        // No mechanism here sends a challenge, so a response is a protocol error.
        outcome(SaslCode::Sys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policies::AccessPolicy;

    fn mechanisms() -> Mechanisms {
        Mechanisms {
            policies: AccessPolicies::new(vec![AccessPolicy {
                name: "sender".into(),
                key: "secret".into(),
                rights: vec![Right::Send],
            }])
            .unwrap(),
            plain: PlainGrant::default(),
        }
    }

    #[test]
    fn plain_checks_the_policy_key() {
        let m = mechanisms();
        assert_eq!(m.plain(b"\0sender\0secret"), SaslCode::Ok);
        assert_eq!(
            m.plain.lock().unwrap().clone(),
            Some(("sender".to_owned(), vec![Right::Send]))
        );
        let m = mechanisms();
        for bad in [
            &b"\0sender\0wrong"[..],
            b"\0nobody\0secret",
            b"sender\0secret",
            b"\0sender\0secret\0x",
            b"",
        ] {
            assert_eq!(m.plain(bad), SaslCode::Auth, "{bad:?}");
        }
        assert_eq!(*m.plain.lock().unwrap(), None);
    }
}
