//! SASL authentication, as Event Hubs' Kafka endpoint does it: mechanism PLAIN with the user
//! name `$ConnectionString` and an Event Hubs connection string as the password (its policy
//! name and key are checked against the shared access policies), or a SAS token
//! (`SharedAccessSignature sr=…&sig=…&se=…&skn=…`) as the password.
//!
//! A login becomes a grant (`tributary_amqp::auth::Grant`) checked per request by the AMQP door's
//! rules: a connection string with an `EntityPath` or a token for one event hub covers that hub
//! only; a key (primary or secondary) grants its policy's rights; a key of an event hub's
//! policy grants that hub only, and its `EntityPath`, if given, must name that hub; a token
//! expires when it says. A login is checked against the policies as they are at that moment: a
//! key regenerated since is refused, while a connection already logged in keeps its grant until
//! it closes (a token's, until the token expires).
//!
//! # Guarantees
//! - Keys and tokens are compared by `tributary_amqp`'s code (in constant time for keys) and
//!   never logged or echoed: a refusal says only which part was wrong.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
};
use kafka_protocol::protocol::StrBytes;
use tributary_amqp::AccessPolicies;
use tributary_amqp::auth::{self, Grant};
use tributary_amqp::policies::{Signer, TokenRefused};
use tributary_eventhubs::{ConnectionString, Credential};

/// The one mechanism offered.
pub const PLAIN: &str = "PLAIN";

/// The user name that says the password is a connection string (or a token).
pub const CONNECTION_STRING_USER: &str = "$ConnectionString";

/// The answer to a SaslHandshake, and whether PLAIN was chosen.
pub fn handshake(request: &SaslHandshakeRequest) -> (SaslHandshakeResponse, bool) {
    let chosen = request.mechanism.as_str() == PLAIN;
    let error = if chosen {
        0
    } else {
        ResponseError::UnsupportedSaslMechanism.code()
    };
    let response = SaslHandshakeResponse::default()
        .with_error_code(error)
        .with_mechanisms(vec![StrBytes::from_static_str(PLAIN)]);
    (response, chosen)
}

/// Checks a SaslAuthenticate's PLAIN message (`authzid \0 user \0 password`) at `now_secs`;
/// returns the answer and, when it succeeded, the grant.
pub fn authenticate(
    request: &SaslAuthenticateRequest,
    policies: &AccessPolicies,
    now_secs: i64,
) -> (SaslAuthenticateResponse, Option<Grant>) {
    match login(&request.auth_bytes, policies, now_secs) {
        Ok(grant) => (SaslAuthenticateResponse::default(), Some(grant)),
        Err(reason) => {
            let response = SaslAuthenticateResponse::default()
                .with_error_code(ResponseError::SaslAuthenticationFailed.code())
                .with_error_message(Some(StrBytes::from_string(format!(
                    "Authentication failed: {reason}"
                ))));
            (response, None)
        }
    }
}

/// The grant a PLAIN message proves, or why not (a sentence without the secret).
fn login(message: &[u8], policies: &AccessPolicies, now_secs: i64) -> Result<Grant, String> {
    let mut parts = message.split(|b| *b == 0);
    let (Some(_authzid), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the PLAIN message is not 'authzid NUL user NUL password'".into());
    };
    if user != CONNECTION_STRING_USER.as_bytes() {
        return Err(format!(
            "the user name must be {CONNECTION_STRING_USER:?}, with a connection string or a SAS token as the password"
        ));
    }
    let password =
        std::str::from_utf8(password).map_err(|_| "the password is not UTF-8".to_owned())?;
    if password.starts_with("SharedAccessSignature ") {
        return token_grant(password, policies, now_secs, None);
    }
    let parsed = ConnectionString::parse(password)
        .map_err(|e| format!("the password is not a connection string: {}", e.part))?;
    let entity = parsed.entity_path().unwrap_or_default().to_owned();
    match parsed.credential() {
        Credential::SharedAccessKey { key_name, key } => {
            let signer = policies.verify_key(key_name, key.as_bytes()).ok_or_else(|| {
                format!(
                    "no shared access policy {key_name:?} has that key (neither its primary nor \
                     its secondary; a regenerated key no longer works)"
                )
            })?;
            key_grant(signer, entity)
        }
        Credential::SharedAccessSignature(token) => {
            token_grant(token, policies, now_secs, Some(entity))
        }
    }
}

/// The grant a policy's key proves: its rights on its scope, narrowed to the connection string's
/// `EntityPath` when it names one (which must lie in the policy's event hub, if it has one).
fn key_grant(signer: Signer, entity: String) -> Result<Grant, String> {
    if let Some(hub) = signer.scope.hub()
        && !entity.is_empty()
        && !entity.eq_ignore_ascii_case(hub)
    {
        return Err(format!(
            "the shared access policy {:?} belongs to event hub {hub:?}, not to EntityPath {entity:?}",
            signer.name
        ));
    }
    let mut grant = auth::login_grant(signer);
    if !entity.is_empty() {
        grant.audience = entity;
    }
    Ok(grant)
}

/// The grant a SAS token proves, narrowed to `entity` when its connection string names one.
fn token_grant(
    token: &str,
    policies: &AccessPolicies,
    now_secs: i64,
    entity: Option<String>,
) -> Result<Grant, String> {
    let mut grant = auth::verify(token, policies, now_secs)
        .map_err(|e| format!("the SAS token was refused: {}", sas_reason(&e)))?;
    if let Some(entity) = entity.filter(|e| !e.is_empty())
        && auth::audience_path(&grant.audience).is_empty()
    {
        grant.audience = entity;
    }
    Ok(grant)
}

/// A SAS refusal's kind, never its token.
fn sas_reason(error: &TokenRefused) -> String {
    use tributary_eventhubs::sas::SasError;
    match error {
        TokenRefused::Sas(SasError::Expired { .. }) => "it has expired".into(),
        TokenRefused::Sas(SasError::UnknownKeyName(name)) => format!("no policy is named {name:?}"),
        TokenRefused::Sas(_) => "its form is invalid".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use tributary_amqp::{AccessPolicy, Right};
    use tributary_eventhubs::sas;

    use super::*;

    fn policies() -> AccessPolicies {
        AccessPolicies::new(vec![AccessPolicy {
            name: "sender".into(),
            key: "secret".into(),
            secondary_key: Some("second".into()),
            rights: vec![Right::Send],
        }])
        .unwrap()
    }

    fn plain(password: &str) -> Vec<u8> {
        format!("\0$ConnectionString\0{password}").into_bytes()
    }

    #[test]
    fn connection_strings_and_tokens_log_in_and_bad_ones_do_not() {
        let p = policies();
        let good =
            "Endpoint=sb://localhost:9092/;SharedAccessKeyName=sender;SharedAccessKey=secret";
        let grant = login(&plain(good), &p, 0).unwrap();
        assert_eq!(grant.rights, vec![Right::Send]);
        assert_eq!(grant.audience, "");
        let scoped = format!("{good};EntityPath=hub");
        assert_eq!(login(&plain(&scoped), &p, 0).unwrap().audience, "hub");
        let token = sas::sign("sb://localhost/hub", "sender", "secret", 100);
        assert_eq!(login(&plain(&token), &p, 0).unwrap().expiry, 100);
        assert!(login(&plain(&token), &p, 200).is_err(), "expired");
        let bad = good.replace("secret", "wrong");
        let refused = login(&plain(&bad), &p, 0).unwrap_err();
        assert!(!refused.contains("wrong"), "{refused}");
        assert!(login(b"\0user\0pass", &p, 0).is_err());
        let secondary = good.replace("secret", "second");
        assert_eq!(
            login(&plain(&secondary), &p, 0).unwrap().rights,
            vec![Right::Send]
        );
        assert!(login(b"garbage", &p, 0).is_err());
    }

    #[test]
    fn a_hubs_policy_logs_in_to_its_hub_only_and_a_rotated_key_not_at_all() {
        use tributary_amqp::policies::{KeyType, Scope};
        let p = policies();
        let orders = Scope::Hub("orders".into());
        let send = p.create(&orders, "orders-send", vec![Right::Send]).unwrap();
        let cs = |entity: &str, key: &str| {
            format!(
                "Endpoint=sb://h/;SharedAccessKeyName=orders-send;SharedAccessKey={key}{entity}"
            )
        };
        assert_eq!(
            login(&plain(&cs("", &send.key)), &p, 0).unwrap().audience,
            "orders"
        );
        let scoped = login(&plain(&cs(";EntityPath=Orders", &send.key)), &p, 0).unwrap();
        assert_eq!(scoped.audience, "Orders");
        let elsewhere = login(&plain(&cs(";EntityPath=payments", &send.key)), &p, 0).unwrap_err();
        assert!(
            elsewhere.contains("belongs to event hub \"orders\""),
            "{elsewhere}"
        );
        let token = sas::sign("sb://h/payments", "orders-send", &send.key, 100);
        let refused = login(&plain(&token), &p, 0).unwrap_err();
        assert!(refused.contains("event hub \"orders\""), "{refused}");
        p.rotate(&orders, "orders-send", KeyType::Primary).unwrap();
        let old = login(&plain(&cs("", &send.key)), &p, 0).unwrap_err();
        assert!(old.contains("regenerated"), "{old}");
        assert!(!old.contains(&send.key), "{old}");
        let secondary = send.secondary_key.as_deref().unwrap();
        assert!(login(&plain(&cs("", secondary)), &p, 0).is_ok());
    }
}
