//! The editor's lazily read JSON body ([`tributary_edit::lazy`]): a body field read lazily is
//! the field of serde_json's parse (and absent when serde_json refuses the body), and a chain
//! of filter, transform and validate gives the same events, refusals and counts whether it
//! reads the body lazily or parsed.

use std::sync::{Arc, OnceLock};

use serde_json::{Value, json};
use tributary_edit::{
    CompileContext, Context, Edited, Editor, FieldPath, Item, Output, Position, Step,
};
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

/// The schema the validate step checks: properties, a required field, a pattern, a range and
/// additional properties, so the validator reads members, keys and values.
const SCHEMA: &str = r#"{"type":"object","required":["a"],
    "properties":{"a":{"type":["integer","object"],"maximum":100},
                  "b":{"type":"object","properties":{"c":{"type":"string","pattern":"^[a-z]*$"}},
                       "additionalProperties":{"type":["number","array"]}},
                  "t":{"enum":[1,"x",null,[1]]}},
    "additionalProperties":{"type":["string","object","array","boolean"]}}"#;

fn steps() -> &'static [Arc<dyn Step>] {
    static STEPS: OnceLock<Vec<Arc<dyn Step>>> = OnceLock::new();
    STEPS.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(dir.path().join("s.json"), SCHEMA).expect("the schema is written");
        let context = CompileContext::new(dir.path());
        let compile = |kind: &str, keys: Value| {
            tributary_edit::compile(kind, None, keys, &context).expect("the step compiles")
        };
        vec![
            compile(
                "filter",
                json!({"when": "body.a < 50 OR EXISTS(body.b.c) OR body.t = 'x'",
                       "unmatched": "dead-letter"}),
            ),
            compile(
                "transform",
                json!({"drop": ["x", "b.d"], "rename": {"b.c": "c", "e": "b.e"},
                       "set": {"s": 1, "b.f": [true]}}),
            ),
            compile("validate", json!({"schema": "s.json"})),
        ]
    })
}

fn run(body: &[u8], parse_first: bool) -> Edited {
    let mut chain: Vec<Arc<dyn Step>> = Vec::new();
    if parse_first {
        chain.push(Arc::new(Parse));
    }
    chain.extend(steps().iter().cloned());
    let position = Position {
        sequence_number: 0,
        offset: 0,
        enqueued_time_ms: 0,
    };
    let item = Item::new(EventData::new(body.to_vec()), position);
    let context = Context {
        partition: "0",
        now_ms: 0,
    };
    Editor::new(chain).apply(&context, vec![item])
}

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
    (
        edited.passed.into_iter().map(parsed).collect(),
        edited
            .rejected
            .into_iter()
            .map(|r| (r.step, r.reason, parsed(r.item)))
            .collect(),
        edited
            .dropped
            .into_iter()
            .filter(|(step, _)| step != "parse")
            .collect(),
    )
}

/// A body, read lazily and through the chain.
pub fn json(data: &[u8]) {
    let parse: Option<Value> = serde_json::from_slice(data).ok();
    for path in ["a", "b.c", "t[0]"] {
        let path = FieldPath::parse(path).expect("a path");
        let item = Item::new(
            EventData::new(data.to_vec()),
            Position {
                sequence_number: 0,
                offset: 0,
                enqueued_time_ms: 0,
            },
        );
        let expected = parse.as_ref().and_then(|v| path.get(v));
        assert_eq!(item.body_field(&path), expected, "{path}");
        assert_eq!(item.json(), parse.as_ref());
    }
    assert_eq!(outcome(run(data, false)), outcome(run(data, true)));
}
