//! Kafka door target: a request frame as an unauthenticated connection's first bytes reach the
//! door (`tributary_kafka::request::decode`), and a SASL login carried in it.
//!
//! Only the requests answered before SASL are decoded here: the codec's decoders of the other
//! APIs size vectors by claimed element counts (see `tributary_kafka`'s "Known gap"), which a
//! fuzzer finds at once; their target waits for the codec release that bounds them.

use bytes::Bytes;
use kafka_protocol::messages::RequestKind;
use tributary_amqp::{AccessPolicies, AccessPolicy, Right};
use tributary_kafka::request::{self, Body};

/// The policies logins are checked against.
fn policies() -> AccessPolicies {
    AccessPolicies::new(vec![AccessPolicy {
        name: "sender".into(),
        key: "fuzz-secret-key-0123456789".into(),
        rights: vec![Right::Send],
    }])
    .expect("valid policies")
}

/// A frame (without its length prefix) decoded before authentication. An accepted request is
/// one answered before SASL, carries the header's correlation id, and a login it carries never
/// echoes a key.
pub fn request(data: &[u8]) {
    let Ok(decoded) = request::decode(Bytes::copy_from_slice(data), false) else {
        return;
    };
    assert!(
        request::answered_before_sasl(decoded.key),
        "{:?} before SASL",
        decoded.key
    );
    let correlation = i32::from_be_bytes(data[4..8].try_into().expect("a decoded header"));
    assert_eq!(decoded.correlation_id, correlation);
    if let Body::Decoded(body) = decoded.body
        && let RequestKind::SaslAuthenticate(login) = *body
    {
        let (response, grant) = tributary_kafka::sasl::authenticate(&login, &policies(), 0);
        let message = response
            .error_message
            .map(|m| m.to_string())
            .unwrap_or_default();
        assert_eq!(grant.is_some(), response.error_code == 0);
        if let Some(key) = claimed_key(&login.auth_bytes) {
            assert!(
                !message.contains(key),
                "a refusal echoes the key: {message}"
            );
        }
    }
}

/// The `SharedAccessKey` a PLAIN login's password claims, when long enough to be told apart
/// from the refusal's own words.
fn claimed_key(auth: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(auth).ok()?;
    let (_, rest) = text.split_once("SharedAccessKey=")?;
    let key = rest.split(';').next()?;
    (key.len() >= 12).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_reach_the_decoders_and_the_good_login_logs_in() {
        let seeds = crate::seeds::seeds("kafka_request");
        let decoded: Vec<_> = seeds
            .iter()
            .map(|s| request::decode(Bytes::copy_from_slice(s), false))
            .collect();
        assert!(decoded[..6].iter().all(Result::is_ok), "{decoded:?}");
        assert!(matches!(decoded[2], Ok(ref r) if matches!(r.body, Body::ApiVersionsTooNew)));
        assert!(decoded[6].is_err(), "Metadata before SASL");
        let Ok(request::Request {
            body: Body::Decoded(body),
            ..
        }) = &decoded[4]
        else {
            panic!("a login: {:?}", decoded[4]);
        };
        let RequestKind::SaslAuthenticate(login) = body.as_ref() else {
            panic!("a login: {body:?}");
        };
        let (_, grant) = tributary_kafka::sasl::authenticate(login, &policies(), 0);
        assert!(grant.is_some());
    }
}
