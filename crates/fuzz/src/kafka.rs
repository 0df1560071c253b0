//! Kafka door targets, each a request frame as it reaches the door
//! (`tributary_kafka::request::decode`):
//! - `kafka_request`: an unauthenticated connection's first bytes, and a SASL login carried in
//!   them;
//! - `kafka_authenticated`: any request of an authenticated connection, and a Produce's record
//!   batches through `tributary_kafka::batches::events`. The codec reserves memory for claimed
//!   element counts; the door's bounded probe must stop every claim beyond the bytes before the
//!   codec sees it (a failed reservation aborts the fuzzer, so it finds one at once);
//! - `kafka_consumer_protocol`: the subscription and assignment bytes a consumer group's
//!   members send inside JoinGroup and SyncGroup, decoded as the group coordinator decodes them
//!   (`tributary_kafka::decode_consumer_protocol`).

use bytes::Bytes;
use kafka_protocol::messages::RequestKind;
use tributary_amqp::{AccessPolicies, AccessPolicy, Right};
use tributary_kafka::request::{self, Body};

/// The policies logins are checked against.
fn policies() -> AccessPolicies {
    AccessPolicies::new(vec![AccessPolicy {
        name: "sender".into(),
        key: "fuzz-secret-key-0123456789".into(),
        secondary_key: None,
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

/// A frame (without its length prefix) decoded after authentication; a Produce's record
/// batches become events or an error code, and an accepted event is within the record limit.
pub fn authenticated(data: &[u8]) {
    let Ok(decoded) = request::decode(Bytes::copy_from_slice(data), true) else {
        return;
    };
    let correlation = i32::from_be_bytes(data[4..8].try_into().expect("a decoded header"));
    assert_eq!(decoded.correlation_id, correlation);
    let Body::Decoded(body) = decoded.body else {
        return;
    };
    if let RequestKind::Produce(produce) = *body {
        for partition in produce
            .topic_data
            .into_iter()
            .flat_map(|t| t.partition_data)
        {
            if let Ok(events) = tributary_kafka::batches::events(partition.records) {
                assert!(!events.is_empty(), "an accepted batch holds events");
                for event in events {
                    assert!(event.body.len() <= tributary_kafka::limits::RECORD_BYTES_MAX);
                }
            }
        }
    }
}

/// Consumer-protocol bytes as a subscription and as an assignment: what decodes re-encodes to
/// bytes that decode to the same value.
pub fn consumer_protocol(data: &[u8]) {
    use kafka_protocol::messages::{ConsumerProtocolAssignment, ConsumerProtocolSubscription};
    let bytes = Bytes::copy_from_slice(data);
    if let Some(subscription) =
        tributary_kafka::decode_consumer_protocol::<ConsumerProtocolSubscription>(bytes.clone(), 3)
    {
        let again = reencoded(&subscription, 3);
        assert_eq!(
            tributary_kafka::decode_consumer_protocol::<ConsumerProtocolSubscription>(again, 3),
            Some(subscription)
        );
    }
    if let Some(assignment) =
        tributary_kafka::decode_consumer_protocol::<ConsumerProtocolAssignment>(bytes, 3)
    {
        let again = reencoded(&assignment, 3);
        assert_eq!(
            tributary_kafka::decode_consumer_protocol::<ConsumerProtocolAssignment>(again, 3),
            Some(assignment)
        );
    }
}

/// `value` encoded at `version`, with the consumer protocol's leading version.
fn reencoded<T: kafka_protocol::protocol::Encodable>(value: &T, version: i16) -> Bytes {
    let mut out = bytes::BytesMut::new();
    out.extend_from_slice(&version.to_be_bytes());
    value
        .encode(&mut out, version)
        .expect("a decoded value encodes");
    out.freeze()
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
    fn the_authenticated_seeds_decode_and_the_produce_seed_holds_an_event() {
        let seeds = crate::seeds::seeds("kafka_authenticated");
        assert!(seeds.len() >= 4);
        for seed in &seeds {
            let decoded = request::decode(Bytes::copy_from_slice(seed), true);
            assert!(decoded.is_ok(), "{decoded:?}");
        }
        let Ok(request::Request {
            body: Body::Decoded(body),
            ..
        }) = request::decode(Bytes::copy_from_slice(&seeds[0]), true)
        else {
            panic!("the produce seed decodes");
        };
        let RequestKind::Produce(produce) = *body else {
            panic!("the first seed is a Produce");
        };
        let records = produce.topic_data[0].partition_data[0].records.clone();
        assert_eq!(
            tributary_kafka::batches::events(records).map(|e| e.len()),
            Ok(2)
        );
    }

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
