//! Event Hubs targets: the message decoders in both directions (each checked against its
//! encoder), connection strings and SAS tokens.

use arbitrary::{Arbitrary, Unstructured};
use tributary_event::{EventData, ReceivedEvent, repeats_a_property_key};
use tributary_eventhubs::ConnectionString;
use tributary_eventhubs::deliver::write_delivery_message;
use tributary_eventhubs::ingest::events_of;
use tributary_eventhubs::limits::{BATCH_EVENTS_MAX, TOKEN_BYTES_MAX};
use tributary_eventhubs::names::BATCH_MESSAGE_FORMAT;
use tributary_eventhubs::receive::decode_received_bytes;
use tributary_eventhubs::sas;
use tributary_eventhubs::send::encode_outgoing;

/// The wall clock the receive targets pass (2023-11-14).
const NOW_MS: i64 = 1_700_000_000_000;

/// What the server makes of a producer's transfer payload. The first byte chooses the message
/// format and whether events are routed by key. Accepted events, delivered back to a consumer,
/// decode to the same event.
pub fn ingest(data: &[u8]) {
    let Some((&choice, payload)) = data.split_first() else {
        return;
    };
    let format = match choice % 3 {
        0 => 0,
        1 => BATCH_MESSAGE_FORMAT,
        _ => u32::from(choice),
    };
    let route_by_key = choice & 0x80 != 0;
    let Ok((_, events)) = events_of(payload, format, route_by_key) else {
        return;
    };
    assert!(!events.is_empty(), "a delivery holds at least one event");
    assert!(
        events.len() <= BATCH_EVENTS_MAX,
        "a batch holds at most the limit"
    );
    for (sequence_number, event) in (0..).zip(events) {
        let stored = ReceivedEvent {
            sequence_number,
            offset: 4096,
            enqueued_time_ms: NOW_MS,
            data: event,
        };
        let mut delivery = Vec::new();
        write_delivery_message(&stored, None, &mut delivery);
        let (received, last) =
            decode_received_bytes(&delivery, NOW_MS).expect("a delivery we wrote decodes");
        assert!(last.is_none(), "no runtime metric was asked for");
        let mut expected = EventData {
            protocol_sections: None,
            ..stored.data.clone()
        };
        if !route_by_key {
            // A send to a partition keeps `x-opt-partition-key` as an annotation, which the
            // consumer reads as the key: as Event Hubs does.
            expected
                .partition_key
                .clone_from(&received.data.partition_key);
        }
        if stored.data.protocol_sections.is_some() {
            // What has no field of its own (an `amqp-value` body, a binary message id, …) is
            // kept in the protocol sections and reaches the consumer as bytes or text; what the
            // event does hold comes back unchanged.
            assert_holds(&received.data, &expected);
        } else if !repeats_a_property_key(&expected.properties) {
            assert_eq!(
                format!("{:?}", received.data),
                format!("{expected:?}"),
                "a stored event comes back as it was stored"
            );
        }
        assert_eq!(received.sequence_number, stored.sequence_number);
        assert_eq!(received.offset, stored.offset);
        assert_eq!(received.enqueued_time_ms, stored.enqueued_time_ms);
    }
}

/// `received` holds everything `expected` holds (and may hold more).
fn assert_holds(received: &EventData, expected: &EventData) {
    if !expected.body.is_empty() {
        assert_eq!(received.body, expected.body);
    }
    for (field, got, want) in [
        (
            "content type",
            &received.content_type,
            &expected.content_type,
        ),
        (
            "correlation id",
            &received.correlation_id,
            &expected.correlation_id,
        ),
        ("message id", &received.message_id, &expected.message_id),
        (
            "partition key",
            &received.partition_key,
            &expected.partition_key,
        ),
    ] {
        if want.is_some() {
            assert_eq!(got, want, "the {field} comes back");
        }
    }
    if !repeats_a_property_key(&expected.properties) {
        for (key, value) in &expected.properties {
            let got = received.properties.iter().find(|(k, _)| k == key);
            assert_eq!(
                format!("{:?}", got.map(|(_, v)| v)),
                format!("{:?}", Some(value)),
                "property {key:?} comes back"
            );
        }
    }
}

/// What a client makes of a delivery's bytes. An accepted delivery, written again by the
/// server's encoder, decodes to the same event and runtime metric.
pub fn receive(data: &[u8]) {
    let Ok((event, last)) = decode_received_bytes(data, NOW_MS) else {
        return;
    };
    let mut again = Vec::new();
    write_delivery_message(&event, last.as_ref(), &mut again);
    let (reread, relast) =
        decode_received_bytes(&again, NOW_MS).expect("a delivery we wrote decodes");
    if !repeats_a_property_key(&event.data.properties) {
        assert_eq!(format!("{reread:?}"), format!("{event:?}"));
    }
    assert_eq!(format!("{relast:?}"), format!("{last:?}"));
}

/// Events a producer sends (carved from the bytes), encoded as the client does, decoded as the
/// server does: the same events, routed by the same key.
pub fn send(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let (Ok(key), Ok(events)) = (
        Option::<String>::arbitrary(&mut u),
        crate::arb::events(&mut u, 8),
    ) else {
        return;
    };
    let (payload, format) = encode_outgoing(&events, key.as_deref()).expect("small events encode");
    let (routed, ingested) =
        events_of(&payload, format, true).expect("the server reads what the client sends");
    assert_eq!(routed, key, "the batch is routed by its key");
    assert_eq!(ingested.len(), events.len());
    for (sent, got) in events.iter().zip(ingested) {
        let got = EventData {
            protocol_sections: None,
            ..got
        };
        let sent = EventData {
            partition_key: key.clone(),
            ..sent.clone()
        };
        assert_eq!(format!("{got:?}"), format!("{sent:?}"));
    }
}

/// Parses a connection string. Its secret appears in no error, `Display` or `Debug`; what is
/// accepted prints as a connection string that parses to the same endpoint.
pub fn connection_string(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for secret in secrets_in(text) {
        let output = shown(text);
        if output.contains(secret) {
            // Shown, unless the same text with another secret shows it too (then it is part of
            // the message, not an echo of the secret).
            let blank = "Z".repeat(secret.len());
            assert!(
                shown(&text.replace(secret, &blank)).contains(secret),
                "{output}"
            );
        }
    }
    if let Ok(parsed) = ConnectionString::parse(text) {
        if let Ok(again) = ConnectionString::parse(&parsed.to_string()) {
            assert_eq!(again.host(), parsed.host());
            assert_eq!(again.port(), parsed.port());
            assert_eq!(again.entity_path(), parsed.entity_path());
            assert_eq!(again.uses_tls(), parsed.uses_tls());
        }
        let _ = parsed.resolve_hub(Some("hub"));
    }
}

/// Everything parsing `text` shows: the error, or the parsed string's `Display` and `Debug`.
fn shown(text: &str) -> String {
    match ConnectionString::parse(text) {
        Err(e) => e.to_string(),
        Ok(parsed) => format!("{parsed} {parsed:?}"),
    }
}

/// The values of the secret fields of a connection string that occur nowhere else in it.
fn secrets_in(text: &str) -> Vec<&str> {
    text.split(';')
        .filter_map(|pair| pair.split_once('='))
        .filter(|(key, _)| {
            let key = key.trim();
            key.eq_ignore_ascii_case("SharedAccessKey")
                || key.eq_ignore_ascii_case("SharedAccessSignature")
        })
        .flat_map(|(_, value)| [value, value.trim()])
        .filter(|secret| secret.len() >= 4 && text.matches(secret).count() == 1)
        .collect()
}

/// A signing request carved from the bytes.
#[derive(Debug, Arbitrary)]
struct Signing {
    audience: String,
    key_name: String,
    key: String,
    expiry: u64,
}

/// Parses and verifies a SAS token (first byte even), or signs one from carved fields and
/// verifies it (odd): a token we sign verifies with its key, before its expiry, for its
/// audience, and no other key verifies it.
pub fn sas_token(data: &[u8]) {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    if choice % 2 == 0 {
        let Ok(text) = std::str::from_utf8(rest) else {
            return;
        };
        if let Ok(token) = sas::parse(text) {
            assert!(!token.audience.is_empty());
            assert!(!token.key_name.is_empty());
        }
        let _ = sas::token_expiry(text);
        let _ = sas::verify(text, |_| Some("fuzz-key"), 0);
        return;
    }
    let Ok(s) = Signing::arbitrary(&mut Unstructured::new(rest)) else {
        return;
    };
    let expiry = s.expiry % 1_000_000_000_000_000_000;
    if s.audience.is_empty() || s.key_name.is_empty() || expiry == 0 {
        return;
    }
    let token = sas::sign(&s.audience, &s.key_name, &s.key, expiry);
    if token.len() > TOKEN_BYTES_MAX {
        return;
    }
    let expiry = i64::try_from(expiry).expect("below 10^18");
    let verified = sas::verify(
        &token,
        |name| (name == s.key_name).then_some(&s.key),
        expiry - 1,
    )
    .expect("a token we signed verifies");
    assert_eq!(verified.audience, s.audience);
    assert_eq!(verified.key_name, s.key_name);
    assert_eq!(verified.expiry, expiry);
    let wrong = format!("{}x", s.key);
    assert!(sas::verify(&token, |_| Some(&wrong), expiry - 1).is_err());
    assert!(
        sas::verify(&token, |_| Some(&s.key), expiry).is_err(),
        "expired"
    );
}
