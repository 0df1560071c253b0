//! `validate`: checks each event's JSON body against a JSON Schema and passes the events that
//! match; the others are refused (for the dead-letter target) or dropped, as configured.
//!
//! ```toml
//! [[step]]
//! kind = "validate"
//! schema = "reading.schema.json"   # relative to the task file
//! invalid = "dead-letter"          # or "drop"; default "dead-letter"
//! formats = false                  # true: also check "format" (date-time, email, uuid, ...)
//! ```
//!
//! # Guarantees
//!
//! - The schema is read and compiled once, when the step is compiled; a schema that is not
//!   JSON, is not a valid schema, or `$ref`s anything outside its own file is refused then:
//!   the editor never fetches a schema over the network or from another file while events
//!   flow.
//! - A body that is not JSON is invalid.
//! - The refusal reason names the first [`ERRORS_SHOWN`] errors, each with the JSON pointer of
//!   the offending value (`/reading/temperature`) and what is wrong, and how many more there
//!   were; it is at most [`REASON_MAX`] bytes.
//! - Valid events cost one `is_valid` walk over the body read lazily (only the values the
//!   schema names are read: [`crate::lazy`]), or over the parsed body when a step parsed it;
//!   the two walks give the same answer. Error details are collected only for invalid ones,
//!   from the parsed body.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use jsonschema::{Retrieve, Uri, Validator};
use serde::Deserialize;
use serde_json::Value;

use crate::item::Item;
use crate::lazy_schema::{self, LazyJson};
use crate::spec::{CompileContext, SpecError};
use crate::step::{Context, Output, Step};

/// The most schema errors a refusal reason names: enough to fix the usual one or two mistakes
/// at once, few enough that the reason stays readable.
pub const ERRORS_SHOWN: usize = 3;

/// The longest one error's text in a reason, in bytes: a message quotes the offending value,
/// which may be a whole object.
pub const ERROR_TEXT_MAX: usize = 200;

/// The longest refusal reason, in bytes: it travels with the event to the dead-letter target
/// as a property, so it must stay small.
pub const REASON_MAX: usize = 1024;

/// The largest schema file read: real schemas are kilobytes; anything near this size is a
/// wrong file.
pub const SCHEMA_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// The step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidateSpec {
    /// The JSON Schema file, relative to the task file's directory.
    pub schema: PathBuf,
    /// What happens to an event that does not match.
    #[serde(default)]
    pub invalid: Invalid,
    /// Whether `format` keywords (date-time, email, uuid, ...) are checked; JSON Schema 2019-09
    /// and later treat them as annotations only unless asked.
    #[serde(default)]
    pub formats: bool,
}

/// What happens to an event whose body does not match the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Invalid {
    /// Refused with the reason, for the dead-letter target.
    #[default]
    DeadLetter,
    /// Dropped and counted.
    Drop,
}

/// The compiled step.
struct Validate {
    name: String,
    /// The schema file as the task names it, for reasons.
    schema_name: String,
    validator: Validator,
    /// The same schema, over bodies read lazily ([`crate::lazy`]).
    lazy: Validator<LazyJson>,
    invalid: Invalid,
}

impl std::fmt::Debug for Validate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validate")
            .field("name", &self.name)
            .field("schema", &self.schema_name)
            .field("invalid", &self.invalid)
            .finish_non_exhaustive()
    }
}

/// Refuses every `$ref` the schema file does not resolve itself: no network, no other files,
/// so a running task never waits on (or is steered by) a schema it did not check at start.
struct NoRetrieval;

impl Retrieve for NoRetrieval {
    fn retrieve(
        &self,
        uri: &Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(format!(
            "the schema refers to {uri}, which the editor does not fetch (no network, no other \
             files); copy what it needs under \"$defs\" in this file and refer to it as \
             \"#/$defs/<name>\""
        )
        .into())
    }
}

pub(crate) fn compile(
    name: String,
    spec: ValidateSpec,
    context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let path = context.path(&spec.schema);
    let schema = read_schema(&path)?;
    let unusable = |e: jsonschema::ValidationError<'_>| {
        SpecError::at(
            "schema",
            format!("{} is not a usable JSON Schema: {e}", path.display()),
        )
    };
    let validator = jsonschema::options()
        .with_retriever(NoRetrieval)
        .should_validate_formats(spec.formats)
        .build(&schema)
        .map_err(unusable)?;
    let lazy = jsonschema::options_for::<LazyJson>()
        .with_retriever(NoRetrieval)
        .should_validate_formats(spec.formats)
        .build(&schema)
        .map_err(unusable)?;
    Ok(Arc::new(Validate {
        name,
        schema_name: spec.schema.display().to_string(),
        validator,
        lazy,
        invalid: spec.invalid,
    }))
}

/// Reads and parses the schema file, with the line and column of a syntax error.
fn read_schema(path: &Path) -> Result<Value, SpecError> {
    let error = |message: String| SpecError::at("schema", message);
    let size = std::fs::metadata(path)
        .map_err(|e| error(format!("cannot read {}: {e}", path.display())))?
        .len();
    if size > SCHEMA_BYTES_MAX {
        return Err(error(format!(
            "{} is {size} bytes; a schema file is at most {SCHEMA_BYTES_MAX}",
            path.display()
        )));
    }
    let text =
        std::fs::read(path).map_err(|e| error(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_slice(&text).map_err(|e| {
        error(format!(
            "{} is not JSON (a JSON Schema file is a JSON object): {e}",
            path.display()
        ))
    })
}

impl Step for Validate {
    fn edits_each_event_alone(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, _context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        for item in items {
            if lazy_schema::root(&item).is_some_and(|root| self.lazy.is_valid(root)) {
                out.pass(item);
                continue;
            }
            let reason = match item.json() {
                Some(body) if self.validator.is_valid(body) => {
                    out.pass(item);
                    continue;
                }
                Some(body) => self.reason(body),
                None => format!(
                    "the body is not JSON, so it cannot match {}",
                    self.schema_name
                ),
            };
            match self.invalid {
                Invalid::DeadLetter => out.reject(item, reason),
                Invalid::Drop => out.drop_item(item),
            }
        }
    }
}

impl Validate {
    /// Why `body` does not match: the first errors with their instance paths, bounded.
    fn reason(&self, body: &Value) -> String {
        let mut reason = format!("the body does not match {}: ", self.schema_name);
        let mut total = 0usize;
        for error in self.validator.iter_errors(body) {
            total += 1;
            if total > ERRORS_SHOWN {
                continue;
            }
            if total > 1 {
                reason.push_str("; ");
            }
            let at = error.instance_path().as_str();
            let at = if at.is_empty() { "/" } else { at };
            let mut text = error.to_string();
            truncate(&mut text, ERROR_TEXT_MAX);
            let _ = write!(reason, "at {at}: {text}");
        }
        if total == 0 {
            // is_valid and iter_errors disagree only on a jsonschema bug; still say something.
            reason.push_str("the validator reported no detail");
        } else if total > ERRORS_SHOWN {
            let _ = write!(reason, " (and {} more)", total - ERRORS_SHOWN);
        }
        truncate(&mut reason, REASON_MAX);
        reason
    }
}

/// Cuts `text` to at most `max` bytes on a character boundary, marking the cut with "…".
fn truncate(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;
    use tributary_event::EventData;

    use super::*;
    use crate::item::Position;
    use crate::spec;

    const SCHEMA: &str = r##"{
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["device", "reading"],
        "properties": {
            "device": {"type": "string", "minLength": 1},
            "reading": {
                "type": "object",
                "required": ["temperature"],
                "properties": {
                    "temperature": {"type": "number", "minimum": -50, "maximum": 100},
                    "humidity": {"type": "integer", "minimum": 0, "maximum": 100}
                }
            },
            "at": {"type": "string", "format": "date-time"},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}}
        },
        "$defs": {"tag": {"type": "string", "pattern": "^[a-z]+$"}}
    }"##;

    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).expect("write");
        }
        dir
    }

    fn build(dir: &Path, keys: Value) -> Result<Arc<dyn Step>, SpecError> {
        spec::compile("validate", None, keys, &CompileContext::new(dir))
    }

    fn item(body: &str) -> Item {
        let position = Position {
            sequence_number: 1,
            offset: 0,
            enqueued_time_ms: 0,
        };
        Item::new(EventData::new(body.to_owned()), position)
    }

    /// Runs `bodies` through `step`: what passed, the refusal reasons, how many were dropped.
    fn run(step: &Arc<dyn Step>, bodies: &[&str]) -> (Vec<Item>, Vec<String>, u64) {
        let editor = crate::step::Editor::new(vec![Arc::clone(step)]);
        let context = Context {
            partition: "0",
            now_ms: 0,
        };
        let edited = editor.apply(&context, bodies.iter().map(|b| item(b)).collect());
        let reasons = edited.rejected.into_iter().map(|r| r.reason).collect();
        let dropped = edited.dropped.iter().map(|(_, n)| n).sum();
        (edited.passed, reasons, dropped)
    }

    fn reading_step(invalid: &str) -> (tempfile::TempDir, Arc<dyn Step>) {
        let dir = dir_with(&[("reading.schema.json", SCHEMA)]);
        let step = build(
            dir.path(),
            json!({"schema": "reading.schema.json", "invalid": invalid, "formats": true}),
        )
        .expect("a good schema compiles");
        (dir, step)
    }

    const VALID: &str = r#"{"device":"boiler-7","reading":{"temperature":21.5,"humidity":40},
        "at":"2024-05-01T12:00:00Z","tags":["north","roof"]}"#;

    #[test]
    fn a_valid_reading_passes_unchanged() {
        let (_dir, step) = reading_step("dead-letter");
        let (passed, reasons, dropped) = run(
            &step,
            &[VALID, r#"{"device":"d","reading":{"temperature":-50}}"#],
        );
        assert_eq!(passed.len(), 2);
        assert!(reasons.is_empty());
        assert_eq!(dropped, 0);
        let body = passed.into_iter().next().expect("one").into_event().body;
        assert_eq!(body.as_ref(), VALID.as_bytes());
    }

    #[test]
    fn an_invalid_reading_is_refused_with_the_path_of_each_error() {
        let (_dir, step) = reading_step("dead-letter");
        let (passed, reasons, _) = run(
            &step,
            &[
                r#"{"device":"boiler-7","reading":{"temperature":150}}"#,
                r#"{"reading":{"temperature":"warm","humidity":4.5}}"#,
                r#"{"device":"d","reading":{"temperature":1},"tags":["ok","NOT OK"]}"#,
                r#"{"device":"d","reading":{"temperature":1},"at":"yesterday"}"#,
            ],
        );
        assert!(passed.is_empty());
        assert_eq!(reasons.len(), 4);
        assert!(reasons[0].contains("reading.schema.json"), "{}", reasons[0]);
        assert!(
            reasons[0].contains("at /reading/temperature: 150"),
            "{}",
            reasons[0]
        );
        assert!(reasons[0].contains("maximum of 100"), "{}", reasons[0]);
        // Three errors: the missing device (at the root), the wrong type, the fraction.
        assert!(
            reasons[1].contains("at /: \"device\" is a required property"),
            "{}",
            reasons[1]
        );
        assert!(
            reasons[1].contains("at /reading/temperature: \"warm\""),
            "{}",
            reasons[1]
        );
        assert!(
            reasons[1].contains("at /reading/humidity: 4.5"),
            "{}",
            reasons[1]
        );
        assert!(reasons[2].contains("at /tags/1:"), "{}", reasons[2]);
        assert!(reasons[3].contains("at /at:"), "{}", reasons[3]);
        assert!(reasons[3].contains("date-time"), "{}", reasons[3]);
    }

    #[test]
    fn a_body_that_is_not_json_is_invalid() {
        let (_dir, step) = reading_step("dead-letter");
        let (passed, reasons, _) = run(&step, &["temperature=21", ""]);
        assert!(passed.is_empty());
        assert_eq!(reasons.len(), 2);
        assert!(reasons[0].contains("not JSON"), "{}", reasons[0]);
    }

    #[test]
    fn drop_mode_drops_and_counts_the_invalid_ones() {
        let (_dir, step) = reading_step("drop");
        let (passed, reasons, dropped) = run(&step, &[VALID, r#"{"device":""}"#, "nope", VALID]);
        assert_eq!(passed.len(), 2);
        assert!(reasons.is_empty());
        assert_eq!(dropped, 2);
    }

    #[test]
    fn a_reason_names_at_most_three_errors_and_stays_short() {
        let dir = dir_with(&[(
            "wide.json",
            r#"{"type":"object","additionalProperties":{"type":"integer"}}"#,
        )]);
        let step = build(dir.path(), json!({"schema": "wide.json"})).expect("compiles");
        let long = "x".repeat(5000);
        let body =
            format!(r#"{{"a":"{long}","b":"{long}","c":"{long}","d":"{long}","e":"{long}"}}"#);
        let (_, reasons, _) = run(&step, &[&body]);
        let reason = &reasons[0];
        assert_eq!(reason.matches("at /").count(), ERRORS_SHOWN, "{reason}");
        assert!(reason.ends_with("(and 2 more)"), "{reason}");
        assert!(reason.len() <= REASON_MAX);
    }

    #[test]
    fn a_remote_ref_is_refused_at_compile_time() {
        let dir = dir_with(&[
            (
                "remote.json",
                r#"{"$ref":"https://example.com/reading.json"}"#,
            ),
            (
                "other.json",
                r#"{"properties":{"a":{"$ref":"common.json#/a"}}}"#,
            ),
        ]);
        let error = build(dir.path(), json!({"schema": "remote.json"}))
            .expect_err("remote refs are not fetched");
        assert_eq!(error.key.as_deref(), Some("schema"));
        assert!(
            error.message.contains("https://example.com/reading.json"),
            "{error}"
        );
        assert!(error.message.contains("does not fetch"), "{error}");
        let error = build(dir.path(), json!({"schema": "other.json"}))
            .expect_err("other files are not read either");
        assert!(error.message.contains("common.json"), "{error}");
    }

    #[test]
    fn bad_schema_files_and_keys_are_refused_at_compile_time() {
        let dir = dir_with(&[
            ("broken.json", r#"{"type": "object",,}"#),
            ("wrong.json", r#"{"type": "thing"}"#),
            ("reading.schema.json", SCHEMA),
        ]);
        let error = build(dir.path(), json!({"schema": "missing.json"})).expect_err("missing");
        assert!(error.message.contains("cannot read"), "{error}");
        let error = build(dir.path(), json!({"schema": "broken.json"})).expect_err("syntax");
        assert!(error.message.contains("line 1"), "{error}");
        let error = build(dir.path(), json!({"schema": "wrong.json"})).expect_err("bad schema");
        assert!(
            error.message.contains("not a usable JSON Schema"),
            "{error}"
        );
        let error = build(
            dir.path(),
            json!({"schema": "reading.schema.json", "invalid": "ignore"}),
        )
        .expect_err("unknown mode");
        assert!(error.message.contains("dead-letter"), "{error}");
        assert!(
            build(
                dir.path(),
                json!({"schema": "reading.schema.json", "extra": 1})
            )
            .is_err()
        );
    }

    #[test]
    fn truncation_keeps_characters_whole() {
        let mut text = "é".repeat(100);
        truncate(&mut text, 11);
        assert!(text.len() <= 11);
        assert!(text.ends_with('…'));
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_bodies(
            bodies in proptest::collection::vec(any::<Vec<u8>>(), 1..8),
            json_bodies in proptest::collection::vec(
                "[\\[\\]{}\",:0-9a-z\\.\\-eE ]{0,40}", 1..8),
        ) {
            let (_dir, step) = reading_step("dead-letter");
            let mut items: Vec<Item> = bodies
                .into_iter()
                .map(|b| Item::new(EventData::new(b), Position {
                    sequence_number: 0, offset: 0, enqueued_time_ms: 0 }))
                .collect();
            items.extend(json_bodies.iter().map(|b| item(b)));
            let count = items.len();
            let editor = crate::step::Editor::new(vec![step]);
            let context = Context { partition: "0", now_ms: 0 };
            let edited = editor.apply(&context, items);
            prop_assert_eq!(edited.passed.len() + edited.rejected.len(), count);
        }
    }
}
