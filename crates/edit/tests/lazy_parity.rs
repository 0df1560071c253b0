//! The lazily read body ([`tributary_edit::lazy`]) against the parsed one: random JSON
//! bodies through random chains of filter, transform and validate give the same events, the
//! same refusals with the same reasons and the same counts whether the steps read the body
//! lazily or (a first step having parsed and edited it) as a `serde_json::Value`.

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use tributary_edit::{CompileContext, Context, Edited, Editor, Item, Output, Position, Step};
use tributary_event::EventData;

/// Parses every body and marks it edited, so the steps after it read the parsed value.
#[derive(Debug)]
struct Parse;

impl Step for Parse {
    fn name(&self) -> &str {
        "parse"
    }

    fn apply(&self, _: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        for mut item in items {
            item.json_mut();
            out.pass(item);
        }
    }
}

const KEYS: [&str; 4] = ["a", "b", "c", "d e"];

fn key() -> impl Strategy<Value = String> {
    prop::sample::select(&KEYS[..]).prop_map(str::to_owned)
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-1000i64..1000).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1.0e6f64..1.0e6).prop_map(Value::from),
        prop::sample::select(&["", "x", "door", "é\"\\/\n", "\u{1}", "a b", "12"][..])
            .prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 40, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..5)
                .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// A body: mostly objects, written compactly or with whitespace, sometimes with a member
/// written twice (the parse keeps the last).
fn body() -> impl Strategy<Value = String> {
    let object = prop::collection::vec((key(), json_value()), 0..6)
        .prop_map(|members| Value::Object(members.into_iter().collect::<Map<_, _>>()));
    (
        prop_oneof![4 => object, 1 => json_value()],
        any::<bool>(),
        prop::option::of((key(), json_value())),
    )
        .prop_map(|(value, pretty, duplicate)| {
            let text = if pretty {
                serde_json::to_string_pretty(&value)
            } else {
                serde_json::to_string(&value)
            }
            .expect("a value serialises");
            match (duplicate, text.strip_prefix('{')) {
                (Some((k, v)), Some(rest)) if value.is_object() => {
                    let member = format!("{}:{v}", Value::from(k));
                    let rest = rest.trim_start();
                    if rest.starts_with('}') {
                        format!("{{{member}{rest}")
                    } else {
                        format!("{{{member},{rest}")
                    }
                }
                _ => text,
            }
        })
}

/// `value` written out with a space wherever `spaces` says and, before members where
/// `repeats` says, an earlier copy of the member with another value (the parse keeps the last
/// copy), at every depth.
fn write_with(value: &Value, choices: &mut impl Iterator<Item = (bool, bool)>, out: &mut String) {
    match value {
        Value::Object(map) => {
            out.push('{');
            for (i, (key, member)) in map.iter().enumerate() {
                let (repeat, space) = choices.next().unwrap_or_default();
                if i > 0 {
                    out.push(',');
                }
                let key = Value::from(key.as_str()).to_string();
                if repeat {
                    out.push_str(&format!("{key}:[0,{{\"a\":1}}],"));
                }
                out.push_str(&key);
                out.push_str(if space { " : " } else { ":" });
                write_with(member, choices, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    let (_, space) = choices.next().unwrap_or_default();
                    out.push_str(if space { ", " } else { "," });
                }
                write_with(item, choices, out);
            }
            out.push(']');
        }
        leaf => out.push_str(&leaf.to_string()),
    }
}

/// An object body written compactly or with spaces here and there, with members repeated at
/// any depth.
fn body_with_repeats() -> impl Strategy<Value = String> {
    (
        prop::collection::vec((key(), json_value()), 0..6),
        prop::collection::vec(any::<(bool, bool)>(), 0..64),
        0..4u8,
    )
        .prop_map(|(members, choices, density)| {
            let value = Value::Object(members.into_iter().collect::<Map<_, _>>());
            // Mostly without repeats or spaces: the common, compact case.
            let mut choices = choices
                .into_iter()
                .map(move |(repeat, space)| (repeat && density == 0, space && density < 2));
            let mut text = String::new();
            write_with(&value, &mut choices, &mut text);
            text
        })
}

fn path() -> impl Strategy<Value = String> {
    prop::collection::vec(key(), 1..4).prop_map(|keys| {
        keys.iter()
            .map(|k| {
                if k.contains(' ') {
                    format!("\"{k}\"")
                } else {
                    k.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(".")
    })
}

fn condition() -> impl Strategy<Value = String> {
    (path(), 0..5usize, leaf()).prop_map(|(path, how, value)| {
        let literal = match &value {
            Value::String(s) => format!("'{}'", s.replace('\'', "''")),
            Value::Number(n) => n.to_string(),
            Value::Bool(b) => b.to_string().to_uppercase(),
            _ => "NULL".to_owned(),
        };
        match how {
            0 => format!("EXISTS(body.{path})"),
            1 => format!("body.{path} = {literal}"),
            2 => format!("body.{path} > {literal}"),
            3 => format!("NOT EXISTS(body.{path}) OR body.{path} <> {literal}"),
            _ => format!("body.{path} IS NULL"),
        }
    })
}

fn transform() -> impl Strategy<Value = Value> {
    (
        prop::collection::vec(path(), 0..3),
        prop::collection::btree_map(path(), path(), 0..3),
        prop::collection::btree_map(path(), leaf(), 0..3),
    )
        .prop_map(|(drop, rename, set)| json!({"drop": drop, "rename": rename, "set": set}))
}

fn schema() -> impl Strategy<Value = Value> {
    let property = prop_oneof![
        Just(json!({"type": "string"})),
        Just(json!({"type": "integer", "minimum": 0, "maximum": 500})),
        Just(json!({"type": "number", "exclusiveMaximum": 100.5})),
        Just(json!({"enum": ["door", "x", 12, null, true]})),
        Just(json!({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3})),
        Just(json!({"type": "object", "required": ["a"], "minProperties": 2})),
        Just(json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true})),
        Just(json!({"type": "object", "additionalProperties": {"type": "number"}})),
        Just(json!({"const": {"a": 1}})),
        Just(json!({"not": {"type": "null"}})),
    ];
    (
        prop::collection::btree_map(key(), property, 0..4),
        prop::collection::vec(key(), 0..2),
        prop::option::of(prop_oneof![
            Just(json!(false)),
            Just(json!({"type": "string"}))
        ]),
        any::<bool>(),
    )
        .prop_map(|(properties, required, additional, names)| {
            let mut schema =
                json!({"type": "object", "properties": properties, "required": required});
            if let Some(additional) = additional {
                schema["additionalProperties"] = additional;
            }
            if names {
                schema["propertyNames"] = json!({"maxLength": 1});
            }
            schema
        })
}

fn run(steps: &[Arc<dyn Step>], parse_first: bool, bodies: &[String]) -> Edited {
    let mut chain: Vec<Arc<dyn Step>> = Vec::new();
    if parse_first {
        chain.push(Arc::new(Parse));
    }
    chain.extend(steps.iter().cloned());
    let items = bodies
        .iter()
        .enumerate()
        .map(|(i, body)| {
            let position = Position {
                sequence_number: i64::try_from(i).expect("small"),
                offset: 0,
                enqueued_time_ms: 0,
            };
            Item::new(EventData::new(body.clone()), position)
        })
        .collect();
    let context = Context {
        partition: "0",
        now_ms: 0,
    };
    Editor::new(chain).apply(&context, items)
}

/// What a batch came to: each passed body as JSON (or its bytes when it is not JSON),
/// each refusal with its step, reason and body, and the drop counts.
type Outcome = (
    Vec<Result<Value, Vec<u8>>>,
    Vec<(String, String, Result<Value, Vec<u8>>)>,
    Vec<(String, u64)>,
);

fn parsed(item: Item) -> Result<Value, Vec<u8>> {
    let body = item.into_event().body;
    serde_json::from_slice(&body).map_err(|_| body.to_vec())
}

fn outcome(edited: Edited) -> Outcome {
    let passed = edited.passed.into_iter().map(parsed).collect();
    let rejected = edited
        .rejected
        .into_iter()
        .map(|r| (r.step, r.reason, parsed(r.item)))
        .collect();
    let dropped = edited
        .dropped
        .into_iter()
        .filter(|(step, _)| step != "parse")
        .collect();
    (passed, rejected, dropped)
}

fn compile(dir: &std::path::Path, kind: &str, keys: Value) -> Option<Arc<dyn Step>> {
    tributary_edit::compile(kind, None, keys, &CompileContext::new(dir)).ok()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn a_lazily_read_body_edits_as_the_parsed_one(
        bodies in prop::collection::vec(body(), 1..6),
        when in prop::option::of(condition()),
        transform in prop::option::of(transform()),
        schema in prop::option::of(schema()),
        unmatched in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut steps = Vec::new();
        if let Some(when) = when {
            let unmatched = if unmatched { "dead-letter" } else { "drop" };
            let filter = compile(dir.path(), "filter", json!({"when": when, "unmatched": unmatched}));
            prop_assume!(filter.is_some());
            steps.extend(filter);
        }
        if let Some(transform) = transform {
            let step = compile(dir.path(), "transform", transform);
            prop_assume!(step.is_some());
            steps.extend(step);
        }
        if let Some(schema) = schema {
            std::fs::write(dir.path().join("s.json"), schema.to_string()).expect("written");
            steps.extend(compile(dir.path(), "validate", json!({"schema": "s.json"})));
        }
        let lazy = outcome(run(&steps, false, &bodies));
        let parsed = outcome(run(&steps, true, &bodies));
        prop_assert_eq!(lazy, parsed);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Nested edits, members repeated at any depth and bodies with and without spaces: the
    /// chain read lazily edits, filters and validates as the parsed body does.
    #[test]
    fn nested_edits_and_repeated_members_read_as_parsed(
        bodies in prop::collection::vec(body_with_repeats(), 1..6),
        when in prop::option::of(condition()),
        transform in transform(),
        schema in prop::option::of(schema()),
    ) {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut steps = Vec::new();
        if let Some(when) = when {
            steps.extend(compile(dir.path(), "filter", json!({"when": when, "unmatched": "dead-letter"})));
        }
        let step = compile(dir.path(), "transform", transform);
        prop_assume!(step.is_some());
        steps.extend(step);
        if let Some(schema) = schema {
            std::fs::write(dir.path().join("s.json"), schema.to_string()).expect("written");
            steps.extend(compile(dir.path(), "validate", json!({"schema": "s.json"})));
        }
        for body in &bodies {
            let parsed: Value = serde_json::from_str(body).expect("the body is JSON");
            prop_assert!(parsed.is_object());
        }
        let lazy = outcome(run(&steps, false, &bodies));
        let parsed = outcome(run(&steps, true, &bodies));
        prop_assert_eq!(lazy, parsed);
    }
}

#[test]
fn a_nested_edit_rewrites_only_the_objects_on_its_way() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let transform = compile(
        dir.path(),
        "transform",
        json!({"drop": ["r.h"], "rename": {"q.t": "t"}, "set": {"q.u.v": 1}}),
    )
    .expect("transform");
    let bodies = [
        r#"{"a":1,"r":{"s":-1,"h":[1,2],"c":"x"},"q":{"t":20.5,"b":50},"z":[{"k":null}]}"#,
        r#"{"a": 1,"r":{"s":-1, "h":[1,2],"c":"x"},"q":{"b":50,"t":{"d" : 1}},"z":2}"#,
    ]
    .map(str::to_owned);
    let edited = run(&[transform], false, &bodies);
    let written: Vec<Vec<u8>> = edited
        .passed
        .into_iter()
        .map(|item| item.into_event().body.to_vec())
        .collect();
    assert_eq!(
        written,
        vec![
            br#"{"a":1,"r":{"s":-1,"c":"x"},"q":{"b":50,"u":{"v":1}},"z":[{"k":null}],"t":20.5}"#
                .to_vec(),
            br#"{"a":1,"r":{"s":-1,"c":"x"},"q":{"b":50,"u":{"v":1}},"z":2,"t":{"d" : 1}}"#
                .to_vec(),
        ]
    );
}

#[test]
fn duplicate_keys_filter_transform_and_validate_as_parsed() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(
        dir.path().join("s.json"),
        r#"{"properties":{"a":{"type":"integer"},"b":{"type":"object","maxProperties":1},
            "c":{"type":"integer"}},
            "additionalProperties":false}"#,
    )
    .expect("written");
    let steps: Vec<Arc<dyn Step>> = vec![
        compile(
            dir.path(),
            "filter",
            json!({"when": "body.a = 2 AND body.b.c = 4"}),
        )
        .expect("filter"),
        compile(
            dir.path(),
            "transform",
            json!({"rename": {"b.c": "c"}, "set": {"b.d": 1}, "drop": ["x"]}),
        )
        .expect("transform"),
        compile(dir.path(), "validate", json!({"schema": "s.json"})).expect("validate"),
    ];
    let bodies = [
        r#"{"a":1,"b":{"c":3,"c":4},"a":2}"#,
        r#"{"a":1,"b":{"c":3,"c":4},"a":2,"x":0,"x":1}"#,
        r#"{"a":2,"b":{"c":4},"b":{"c":5}}"#,
        r#"{ "a" : 2 , "b" : { "c" : 4, "e": [1, 2] } }"#,
    ]
    .map(str::to_owned);
    let lazy = outcome(run(&steps, false, &bodies));
    assert_eq!(lazy, outcome(run(&steps, true, &bodies)));
    assert_eq!(lazy.0.len(), 2, "{lazy:?}");
    assert_eq!(lazy.0[0], Ok(json!({"a": 2, "b": {"d": 1}, "c": 4})));
    assert_eq!(lazy.1.len(), 1, "{lazy:?}");
    assert_eq!(lazy.2, vec![("filter".to_owned(), 1)]);
}

#[test]
fn untouched_members_keep_their_bytes_and_order() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let transform = compile(
        dir.path(),
        "transform",
        json!({"drop": ["b"], "set": {"z": 1}}),
    )
    .expect("transform");
    let body = r#"{"y": [1, 2.50, "x\"y"], "b": 0, "a": {"k" : null}}"#.to_owned();
    let mut edited = run(&[transform], false, &[body]);
    let item = edited.passed.pop().expect("passed");
    assert_eq!(
        item.into_event().body.as_ref(),
        br#"{"y":[1, 2.50, "x\"y"],"a":{"k" : null},"z":1}"#
    );
}
