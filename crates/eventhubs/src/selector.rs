//! The Event Hubs selector filter: where a receive link starts, parsed (the server) and
//! written (the client) in one place.
//!
//! The SDKs put an `apache.org:selector-filter:string` filter on the link's source whose text is
//! one comparison: `amqp.annotation.<field> <op> '<value>'`, where `<field>` is `x-opt-offset`,
//! `x-opt-sequence-number` or `x-opt-enqueued-time` (also the legacy `x-opt-enqueuedtimeutc`),
//! `<op>` is `>` or `>=` (and `=`, which the service treats as inclusive), and `<value>` a
//! decimal number. For offsets, `-1` means the start of the stream and `@latest` its end. A link
//! without a filter starts at the beginning of the partition, as the service's does.
//!
//! Parsing is strict: anything else is refused with a reason, never guessed at, and never panics
//! (a property test feeds it arbitrary text). [`write`] writes what the Azure SDKs write, and
//! every expression it writes parses back to its position (property-tested).

use tributary_event::EventPosition;

use crate::limits::SELECTOR_BYTES_MAX;
use crate::names::annotation::{ENQUEUED_TIME, ENQUEUED_TIME_LEGACY, OFFSET, SEQUENCE_NUMBER};

/// What the selector references its fields by.
const FIELD_PREFIX: &str = "amqp.annotation.";

/// Why a selector expression was refused: a sentence for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(String);

/// The selector expression for a start position, as the Azure SDKs write it.
pub fn write(position: &EventPosition) -> String {
    let op = |inclusive: bool| if inclusive { ">=" } else { ">" };
    match position {
        EventPosition::Earliest => format!("{FIELD_PREFIX}{OFFSET} > '-1'"),
        EventPosition::Latest => format!("{FIELD_PREFIX}{OFFSET} > '@latest'"),
        EventPosition::Offset { offset, inclusive } => {
            format!("{FIELD_PREFIX}{OFFSET} {} '{offset}'", op(*inclusive))
        }
        EventPosition::SequenceNumber {
            sequence_number,
            inclusive,
        } => format!(
            "{FIELD_PREFIX}{SEQUENCE_NUMBER} {} '{sequence_number}'",
            op(*inclusive)
        ),
        EventPosition::EnqueuedTime {
            enqueued_time_ms,
            inclusive,
        } => format!(
            "{FIELD_PREFIX}{ENQUEUED_TIME} {} '{enqueued_time_ms}'",
            op(*inclusive)
        ),
    }
}

/// Parses a selector expression into a start position.
pub fn parse(expression: &str) -> Result<EventPosition, SelectorError> {
    if expression.len() > SELECTOR_BYTES_MAX {
        return Err(SelectorError(format!(
            "the selector filter is longer than {SELECTOR_BYTES_MAX} bytes"
        )));
    }
    let invalid =
        |why: &str| SelectorError(format!("invalid selector filter {expression:?}: {why}"));
    let text = expression.trim();
    let field_end = text
        .find(|c: char| c.is_whitespace() || c == '>' || c == '=' || c == '<')
        .ok_or_else(|| invalid("expected `amqp.annotation.<field> <op> '<value>'`"))?;
    let (field, rest) = text.split_at(field_end);
    let field = field
        .strip_prefix(FIELD_PREFIX)
        .ok_or_else(|| invalid("the field must start with `amqp.annotation.`"))?;
    let rest = rest.trim_start();
    let (inclusive, rest) = if let Some(r) = rest.strip_prefix(">=") {
        (true, r)
    } else if let Some(r) = rest.strip_prefix('>') {
        (false, r)
    } else if let Some(r) = rest.strip_prefix('=') {
        (true, r)
    } else {
        return Err(invalid("the operator must be `>`, `>=` or `=`"));
    };
    let value = unquote(rest.trim()).ok_or_else(|| invalid("the value must be one quoted word"))?;
    match field.to_ascii_lowercase().as_str() {
        OFFSET => offset_position(value, inclusive).ok_or_else(|| {
            invalid("an offset is a non-negative decimal number, `-1` or `@latest`")
        }),
        SEQUENCE_NUMBER => {
            let sequence_number =
                parse_i64(value).ok_or_else(|| invalid("a sequence number is a decimal number"))?;
            Ok(EventPosition::SequenceNumber {
                sequence_number,
                inclusive,
            })
        }
        ENQUEUED_TIME | ENQUEUED_TIME_LEGACY => {
            let enqueued_time_ms = parse_i64(value)
                .ok_or_else(|| invalid("an enqueued time is milliseconds since the Unix epoch"))?;
            Ok(EventPosition::EnqueuedTime {
                enqueued_time_ms,
                inclusive,
            })
        }
        _ => Err(invalid(
            "the field must be x-opt-offset, x-opt-sequence-number or x-opt-enqueued-time",
        )),
    }
}

/// `'v'` → `v`; a bare word is accepted as is. No quotes inside, nothing after.
fn unquote(value: &str) -> Option<&str> {
    let inner = match value.strip_prefix('\'') {
        Some(rest) => rest.strip_suffix('\'')?,
        None => value,
    };
    let plain = !inner.is_empty() && !inner.contains(|c: char| c == '\'' || c.is_whitespace());
    plain.then_some(inner)
}

fn offset_position(value: &str, inclusive: bool) -> Option<EventPosition> {
    match value {
        "-1" => Some(EventPosition::Earliest),
        "@latest" => Some(EventPosition::Latest),
        _ if value.bytes().all(|b| b.is_ascii_digit()) => Some(EventPosition::Offset {
            offset: value.parse::<u64>().ok()?,
            inclusive,
        }),
        _ => None,
    }
}

fn parse_i64(value: &str) -> Option<i64> {
    let digits = value.strip_prefix('-').unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse::<i64>().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sdk_start_position_parses() {
        let cases = [
            (
                "amqp.annotation.x-opt-offset > '-1'",
                EventPosition::Earliest,
            ),
            (
                "amqp.annotation.x-opt-offset >= '-1'",
                EventPosition::Earliest,
            ),
            (
                "amqp.annotation.x-opt-offset > '@latest'",
                EventPosition::Latest,
            ),
            (
                "amqp.annotation.x-opt-offset > '4096'",
                EventPosition::Offset {
                    offset: 4096,
                    inclusive: false,
                },
            ),
            (
                "amqp.annotation.x-opt-offset >= '0'",
                EventPosition::Offset {
                    offset: 0,
                    inclusive: true,
                },
            ),
            (
                "amqp.annotation.x-opt-sequence-number > '41'",
                EventPosition::SequenceNumber {
                    sequence_number: 41,
                    inclusive: false,
                },
            ),
            (
                "amqp.annotation.x-opt-sequence-number >= '-1'",
                EventPosition::SequenceNumber {
                    sequence_number: -1,
                    inclusive: true,
                },
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn enqueued_times_and_spacing_parse() {
        let cases = [
            (
                "amqp.annotation.x-opt-enqueued-time > '1700000000000'",
                EventPosition::EnqueuedTime {
                    enqueued_time_ms: 1_700_000_000_000,
                    inclusive: false,
                },
            ),
            (
                "amqp.annotation.x-opt-enqueued-time >= '5'",
                EventPosition::EnqueuedTime {
                    enqueued_time_ms: 5,
                    inclusive: true,
                },
            ),
            (
                "amqp.annotation.x-opt-enqueuedtimeutc > 5",
                EventPosition::EnqueuedTime {
                    enqueued_time_ms: 5,
                    inclusive: false,
                },
            ),
            (
                "  amqp.annotation.x-opt-sequence-number>='7'  ",
                EventPosition::SequenceNumber {
                    sequence_number: 7,
                    inclusive: true,
                },
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn written_expressions_match_the_sdks() {
        let cases = [
            (
                EventPosition::Earliest,
                "amqp.annotation.x-opt-offset > '-1'",
            ),
            (
                EventPosition::Latest,
                "amqp.annotation.x-opt-offset > '@latest'",
            ),
            (
                EventPosition::Offset {
                    offset: 42,
                    inclusive: true,
                },
                "amqp.annotation.x-opt-offset >= '42'",
            ),
            (
                EventPosition::SequenceNumber {
                    sequence_number: 7,
                    inclusive: false,
                },
                "amqp.annotation.x-opt-sequence-number > '7'",
            ),
            (
                EventPosition::EnqueuedTime {
                    enqueued_time_ms: 1_700_000_000_000,
                    inclusive: false,
                },
                "amqp.annotation.x-opt-enqueued-time > '1700000000000'",
            ),
        ];
        for (position, text) in cases {
            assert_eq!(write(&position), text);
        }
    }

    fn position() -> impl proptest::strategy::Strategy<Value = EventPosition> {
        use proptest::prelude::*;
        prop_oneof![
            Just(EventPosition::Earliest),
            Just(EventPosition::Latest),
            (any::<u64>(), any::<bool>())
                .prop_map(|(offset, inclusive)| EventPosition::Offset { offset, inclusive }),
            (any::<i64>(), any::<bool>()).prop_map(|(sequence_number, inclusive)| {
                EventPosition::SequenceNumber {
                    sequence_number,
                    inclusive,
                }
            }),
            (any::<i64>(), any::<bool>()).prop_map(|(enqueued_time_ms, inclusive)| {
                EventPosition::EnqueuedTime {
                    enqueued_time_ms,
                    inclusive,
                }
            }),
        ]
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            "x-opt-offset > '1'",
            "amqp.annotation.x-opt-offset < '1'",
            "amqp.annotation.x-opt-offset > '1' OR 1=1",
            "amqp.annotation.x-opt-offset > 'abc'",
            "amqp.annotation.x-opt-offset > '-2'",
            "amqp.annotation.x-opt-offset > ''",
            "amqp.annotation.x-opt-offset > '1",
            "amqp.annotation.x-opt-sequence-number > '1.5'",
            "amqp.annotation.x-opt-sequence-number > '99999999999999999999'",
            "amqp.annotation.x-opt-partition-key > 'a'",
            "amqp.annotation.x-opt-offset",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse(&"a".repeat(SELECTOR_BYTES_MAX + 1)).is_err());
    }

    proptest::proptest! {
        #[test]
        fn never_panics_on_arbitrary_text(s in "\\PC{0,200}") {
            let _ = parse(&s);
            let _ = parse(&format!("amqp.annotation.x-opt-offset {s}"));
        }

        #[test]
        fn written_positions_parse_back(position in position()) {
            proptest::prop_assert_eq!(parse(&write(&position)), Ok(position));
        }

        #[test]
        fn numbers_round_trip(n in proptest::num::i64::ANY, inclusive: bool) {
            let op = if inclusive { ">=" } else { ">" };
            let text = format!("amqp.annotation.x-opt-sequence-number {op} '{n}'");
            proptest::prop_assert_eq!(
                parse(&text),
                Ok(EventPosition::SequenceNumber { sequence_number: n, inclusive })
            );
        }
    }
}
