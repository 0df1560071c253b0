//! The filter step (`kind = "filter"`): passes on the events that meet a condition (the
//! [`condition`](crate::condition) language routes use) and drops the others, or refuses them
//! to the dead-letter target.
//!
//! ```toml
//! [[step]]
//! kind = "filter"
//! when = "body.temperature > 30 AND user.site = 'north'"
//! unmatched = "dead-letter"        # or "drop" (the default)
//! ```
//!
//! # Guarantees
//!
//! - **Order**: the events passed on keep their order.
//! - **Accounted for**: an event that does not match (the condition is false or unknown, as
//!   for a body that is not JSON when the condition reads body fields) is dropped and counted,
//!   or refused with a reason that quotes the condition.
//! - **Checked before start**: the condition is compiled with the step; an error names the
//!   key `when`.

use std::sync::Arc;

use serde::Deserialize;

use crate::condition::Condition;
use crate::item::Item;
use crate::spec::{CompileContext, SpecError};
use crate::step::{Context, Output, Step};

/// The step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterSpec {
    /// The condition an event must meet to pass on.
    pub when: String,
    /// What becomes of the others: `"drop"` (the default) or `"dead-letter"`.
    #[serde(default)]
    pub unmatched: Option<String>,
}

/// A compiled filter.
#[derive(Debug)]
struct Filter {
    name: String,
    condition: Condition,
    /// Refuse the events that do not match (else drop them).
    dead_letter: bool,
    /// The refusal reason, made once.
    reason: String,
}

pub(crate) fn compile(
    name: String,
    spec: FilterSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let condition = Condition::parse(&spec.when).map_err(|e| SpecError::at("when", e.message))?;
    let dead_letter = match spec.unmatched.as_deref() {
        None | Some("drop") => false,
        Some("dead-letter") => true,
        Some(other) => {
            return Err(SpecError::at(
                "unmatched",
                format!("{other:?} is not accepted; use \"drop\" (the default) or \"dead-letter\""),
            ));
        }
    };
    let reason = format!(
        "the event does not meet the filter condition `{}`",
        condition.text()
    );
    Ok(Arc::new(Filter {
        name,
        condition,
        dead_letter,
        reason,
    }))
}

impl Step for Filter {
    fn edits_each_event_alone(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        for item in items {
            if self.condition.matches(context, &item) {
                out.pass(item);
            } else if self.dead_letter {
                out.reject(item, self.reason.clone());
            } else {
                out.drop_item(item);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use tributary_event::{EventData, PropertyValue};

    use super::*;
    use crate::item::Position;
    use crate::spec;
    use crate::step::Editor;

    fn step(when: &str, unmatched: Option<&str>) -> Result<Arc<dyn Step>, SpecError> {
        let spec = FilterSpec {
            when: when.to_owned(),
            unmatched: unmatched.map(str::to_owned),
        };
        compile("filter".to_owned(), spec, &CompileContext::new("."))
    }

    fn item(sequence_number: i64, body: &str, site: &str) -> Item {
        let event = EventData::new(Bytes::from(body.to_owned()))
            .with_property("site", PropertyValue::String(site.into()));
        Item::new(
            event,
            Position {
                sequence_number,
                offset: 0,
                enqueued_time_ms: 1_767_225_600_000,
            },
        )
    }

    fn batch() -> Vec<Item> {
        vec![
            item(1, r#"{"temperature": 35.5, "unit": "C"}"#, "north"),
            item(2, r#"{"temperature": 12, "unit": "C"}"#, "north"),
            item(3, "not json at all", "north"),
            item(4, r#"{"temperature": 40}"#, "south"),
            item(5, r#"{"temperature": 31}"#, "north"),
        ]
    }

    fn context() -> Context<'static> {
        Context {
            partition: "0",
            now_ms: 1_767_225_660_000,
        }
    }

    fn sequence_numbers(items: &[Item]) -> Vec<i64> {
        items.iter().map(|i| i.position().sequence_number).collect()
    }

    #[test]
    fn matching_events_pass_in_order_and_the_rest_are_dropped_and_counted() {
        let filter = step("body.temperature > 30 AND user.site = 'north'", None).expect("compiles");
        let edited = Editor::new(vec![filter]).apply(&context(), batch());
        assert_eq!(sequence_numbers(&edited.passed), [1, 5]);
        assert!(edited.rejected.is_empty());
        assert_eq!(edited.dropped, vec![("filter".to_owned(), 3)]);
    }

    #[test]
    fn dead_letter_refuses_the_rest_with_the_condition_as_reason() {
        let when = "body.temperature > 30 AND site = 'north'";
        let filter = step(when, Some("dead-letter")).expect("compiles");
        let edited = Editor::new(vec![filter]).apply(&context(), batch());
        assert_eq!(sequence_numbers(&edited.passed), [1, 5]);
        let refused: Vec<i64> = edited
            .rejected
            .iter()
            .map(|r| r.item.position().sequence_number)
            .collect();
        assert_eq!(refused, [2, 3, 4]);
        assert!(
            edited.rejected[1].reason.contains(when),
            "{}",
            edited.rejected[1].reason
        );
        assert_eq!(edited.rejected[0].step, "filter");
        assert!(edited.dropped.is_empty());
    }

    #[test]
    fn a_body_that_is_not_json_passes_a_condition_that_tests_for_it() {
        let filter = step("NOT EXISTS(body)", None).expect("compiles");
        let edited = Editor::new(vec![filter]).apply(&context(), batch());
        assert_eq!(sequence_numbers(&edited.passed), [3]);
    }

    #[test]
    fn system_properties_and_the_clock_are_read() {
        let filter = step(
            "sys.sequence_number % 2 = 1 AND sys.enqueued_time > NOW() - 120000 \
             AND sys.partition_id = '0'",
            None,
        )
        .expect("compiles");
        let edited = Editor::new(vec![filter]).apply(&context(), batch());
        assert_eq!(sequence_numbers(&edited.passed), [1, 3, 5]);
    }

    #[test]
    fn bad_tables_name_the_key() {
        let error = step("body.temperature >", None).expect_err("incomplete");
        assert_eq!(error.key.as_deref(), Some("when"));
        let error = step("sys.nope = 1", None).expect_err("unknown name");
        assert_eq!(error.key.as_deref(), Some("when"));
        assert!(error.message.contains("sys.sequence_number"), "{error}");
        let error = step("kind = 'a'", Some("reject")).expect_err("bad unmatched");
        assert_eq!(error.key.as_deref(), Some("unmatched"));
        assert!(error.message.contains("dead-letter"), "{error}");
    }

    #[test]
    fn a_step_table_compiles_through_spec() {
        let table = serde_json::json!({
            "when": "user.kind IN ('alarm', 'fault')",
            "unmatched": "dead-letter",
        });
        let compiled = spec::compile("filter", Some("alarms"), table, &CompileContext::new("."))
            .expect("compiles");
        assert_eq!(compiled.name(), "alarms");
        let table = serde_json::json!({"when": "kind = 'a'", "other": 1});
        let error = spec::compile("filter", None, table, &CompileContext::new("."))
            .expect_err("unknown key");
        assert!(error.message.contains("other"), "{error}");
        let error = spec::compile(
            "filter",
            None,
            serde_json::json!({}),
            &CompileContext::new("."),
        )
        .expect_err("no condition");
        assert!(error.message.contains("when"), "{error}");
    }
}
