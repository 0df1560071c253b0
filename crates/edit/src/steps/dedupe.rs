//! `dedupe`: drops an event whose id was already seen in its partition within a time window,
//! so a producer's retries and a replayed batch are forwarded once.
//!
//! ```toml
//! [[step]]
//! kind = "dedupe"
//! by = "sys.message_id"     # default; any field: body.reading.id, user.event_id, ...
//! window = "10m"            # by the events' source enqueued time; default 10m
//! window_events = 100000    # the most ids remembered per partition; default 100000
//! missing = "pass"          # an event without the id: "pass" (default) or "drop"
//! ```
//!
//! # Guarantees and limits
//!
//! - **Per partition, in order.** Each source partition has its own window; an id seen in
//!   partition 0 does not suppress it in partition 1. Events keep their order.
//! - **The window is measured in enqueued time**, not wall-clock time: an event is a duplicate
//!   when an event with the same id was enqueued less than `window` before it (measured from
//!   the first one forwarded; duplicates do not extend it). Replaying old events gives the
//!   same decisions as reading them live.
//! - **Bounded memory.** At most `window_events` ids are remembered per partition, the oldest
//!   forgotten first; a duplicate of a forgotten id passes. Each id costs 50 to 100 bytes (a
//!   16-byte hash in a hash set and, with its time, in an expiry queue; both grow by
//!   doubling), so the default is 5 to 10 MB per partition.
//! - **Ids are stored as 128-bit hashes** (SHA-256, first 16 bytes). Two different ids share a
//!   hash with probability about n²/2¹²⁹ for n ids remembered: about 10⁻²⁹ for 100,000, far
//!   below the odds of a hardware fault. A collision would drop a distinct event.
//! - **At least once across restarts.** The window lives in memory only. After a restart, or
//!   when a partition moves to another process, the new owner starts with an empty window:
//!   duplicates within the window can pass again (in particular the last batch, which is
//!   replayed when its checkpoint was not written). The window is cleared when the partition
//!   is opened or closed.
//! - Ids are compared as text ([`FieldValue::to_key`]): the string `"42"` and the number `42`
//!   are the same id. An empty or null id counts as missing.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tributary_event::PropertyValue;

use crate::field::{Field, FieldValue};
use crate::item::Item;
use crate::spec::{CompileContext, SpecError};
use crate::step::{Context, Output, Step};

/// The id field when `by` is not given: the message id is what Event Hubs producers set for
/// exactly this purpose.
pub const BY_DEFAULT: &str = "sys.message_id";

/// The window when `window` is not given: longer than a producer's retry loop and a
/// replication task's restart, short enough that the default memory bound is rarely reached.
pub const WINDOW_DEFAULT: Duration = Duration::from_secs(10 * 60);

/// The ids remembered per partition when `window_events` is not given: ten minutes at about
/// 170 events a second, for 5 to 10 MB.
pub const WINDOW_EVENTS_DEFAULT: usize = 100_000;

/// The most ids a partition may remember: up to 1 GB a partition; a longer memory needs a
/// store, not a process's heap.
pub const WINDOW_EVENTS_MAX: usize = 10_000_000;

/// The step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DedupeSpec {
    /// The id field (default [`BY_DEFAULT`]).
    #[serde(default)]
    pub by: Option<String>,
    /// How long an id is remembered, in enqueued time ("90s", "10m", "1h30m"; default
    /// [`WINDOW_DEFAULT`]).
    #[serde(default)]
    pub window: Option<String>,
    /// The most ids remembered per partition (default [`WINDOW_EVENTS_DEFAULT`]).
    #[serde(default)]
    pub window_events: Option<u64>,
    /// What happens to an event without the id.
    #[serde(default)]
    pub missing: MissingId,
}

/// What happens to an event without the id field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MissingId {
    /// Passed on: it cannot be told apart from others, so it is kept.
    #[default]
    Pass,
    /// Dropped and counted.
    Drop,
}

/// One partition's memory: the ids seen, and when, oldest first.
#[derive(Debug, Default)]
struct Window {
    seen: HashSet<u128>,
    order: VecDeque<(i64, u128)>,
}

impl Window {
    /// Whether `id`, enqueued at `at`, is new (and then remembers it), forgetting ids enqueued
    /// `window_ms` or more before `at` and the oldest beyond `capacity`.
    fn admit(&mut self, id: u128, at: i64, window_ms: i64, capacity: usize) -> bool {
        let horizon = at.saturating_sub(window_ms);
        while let Some(&(then, old)) = self.order.front() {
            if then > horizon {
                break;
            }
            self.order.pop_front();
            self.seen.remove(&old);
        }
        if !self.seen.insert(id) {
            return false;
        }
        self.order.push_back((at, id));
        if self.order.len() > capacity
            && let Some((_, old)) = self.order.pop_front()
        {
            self.seen.remove(&old);
        }
        true
    }
}

/// The compiled step.
#[derive(Debug)]
struct Dedupe {
    name: String,
    by: Field,
    window_ms: i64,
    capacity: usize,
    missing: MissingId,
    partitions: Mutex<HashMap<String, Arc<Mutex<Window>>>>,
}

pub(crate) fn compile(
    name: String,
    spec: DedupeSpec,
    _context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let by = Field::parse(spec.by.as_deref().unwrap_or(BY_DEFAULT))
        .map_err(|e| SpecError::at("by", e.to_string()))?;
    let window = match spec.window.as_deref() {
        Some(text) => parse_duration(text).map_err(|e| SpecError::at("window", e))?,
        None => WINDOW_DEFAULT,
    };
    let window_ms = i64::try_from(window.as_millis())
        .ok()
        .filter(|ms| *ms > 0)
        .ok_or_else(|| {
            SpecError::at(
                "window",
                "write a duration of at least 1ms, such as \"10m\"",
            )
        })?;
    let capacity = match spec.window_events {
        None => WINDOW_EVENTS_DEFAULT,
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|n| (1..=WINDOW_EVENTS_MAX).contains(n))
            .ok_or_else(|| {
                SpecError::at(
                    "window_events",
                    format!("{n} is out of range; write 1 to {WINDOW_EVENTS_MAX}"),
                )
            })?,
    };
    Ok(Arc::new(Dedupe {
        name,
        by,
        window_ms,
        capacity,
        missing: spec.missing,
        partitions: Mutex::new(HashMap::new()),
    }))
}

impl Dedupe {
    /// The window of `partition`, made when first needed.
    fn window(&self, partition: &str) -> Arc<Mutex<Window>> {
        let mut partitions = self
            .partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(window) = partitions.get(partition) {
            return Arc::clone(window);
        }
        let window = Arc::new(Mutex::new(Window::default()));
        partitions.insert(partition.to_owned(), Arc::clone(&window));
        window
    }

    fn forget(&self, partition: &str) {
        self.partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(partition);
    }
}

impl Step for Dedupe {
    fn edits_each_event_alone(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, context: &Context<'_>, items: Vec<Item>, out: &mut Output) {
        let window = self.window(context.partition);
        let mut window = window.lock().unwrap_or_else(PoisonError::into_inner);
        for item in items {
            let id = self
                .by
                .get(context, &item)
                .and_then(key_text)
                .filter(|id| !id.is_empty())
                .map(|id| hash_id(&id));
            let Some(id) = id else {
                match self.missing {
                    MissingId::Pass => out.pass(item),
                    MissingId::Drop => out.drop_item(item),
                }
                continue;
            };
            let at = item.position().enqueued_time_ms;
            if window.admit(id, at, self.window_ms, self.capacity) {
                out.pass(item);
            } else {
                out.drop_item(item);
            }
        }
    }

    fn open_partition(&self, partition: &str) {
        self.forget(partition);
    }

    fn close_partition(&self, partition: &str) {
        self.forget(partition);
    }
}

/// The first 128 bits of the SHA-256 of `id`.
fn hash_id(id: &str) -> u128 {
    let digest = ring::digest::digest(&ring::digest::SHA256, id.as_bytes());
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest.as_ref()[..16]);
    u128::from_le_bytes(first)
}

/// A field's value as key text, as [`FieldValue::to_key`] spells it, borrowed where the value
/// is already a string (the usual case) so a lookup costs no allocation.
pub(crate) fn key_text(value: FieldValue<'_>) -> Option<Cow<'_, str>> {
    match value {
        FieldValue::Str(s) => Some(Cow::Borrowed(s)),
        FieldValue::Json(Value::String(s)) => Some(Cow::Borrowed(s.as_str())),
        FieldValue::Property(PropertyValue::String(s)) => Some(Cow::Borrowed(s.as_str())),
        other => other.to_key().map(Cow::Owned),
    }
}

/// Reads a duration such as `"500ms"`, `"90s"`, `"10m"` or `"1h 30m"`, as the rest of a task
/// file writes them (`humantime`, which the replication task's own keys use too).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        format!("{text:?} is not a duration such as \"500ms\", \"90s\", \"10m\" or \"1h 30m\": {e}")
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;
    use tributary_event::EventData;

    use super::*;
    use crate::item::Position;
    use crate::spec;

    fn step(keys: Value) -> Arc<dyn Step> {
        let context = CompileContext::new(std::env::temp_dir());
        spec::compile("dedupe", None, keys, &context).expect("compiles")
    }

    fn event(message_id: Option<&str>, body: &str) -> EventData {
        EventData {
            message_id: message_id.map(str::to_owned),
            ..EventData::new(body.to_owned())
        }
    }

    fn at(event: EventData, enqueued_time_ms: i64) -> Item {
        let position = Position {
            sequence_number: enqueued_time_ms,
            offset: 0,
            enqueued_time_ms,
        };
        Item::new(event, position)
    }

    /// Runs `items` through `step` on `partition`: the bodies passed and the count dropped.
    fn run(step: &Arc<dyn Step>, partition: &str, items: Vec<Item>) -> (Vec<String>, u64) {
        let context = Context {
            partition,
            now_ms: 0,
        };
        let editor = crate::step::Editor::new(vec![Arc::clone(step)]);
        let edited = editor.apply(&context, items);
        assert!(edited.rejected.is_empty(), "dedupe never refuses");
        let bodies = edited
            .passed
            .into_iter()
            .map(|i| String::from_utf8_lossy(&i.into_event().body).into_owned())
            .collect();
        (bodies, edited.dropped.iter().map(|(_, n)| n).sum())
    }

    fn by_message_id(ids: &[&str]) -> Vec<Item> {
        ids.iter()
            .enumerate()
            .map(|(i, id)| at(event(Some(id), &format!("{i}")), 1_000 + i as i64))
            .collect()
    }

    #[test]
    fn repeated_message_ids_are_dropped_in_order() {
        let step = step(json!({}));
        let (passed, dropped) = run(&step, "0", by_message_id(&["a", "b", "a", "c", "b"]));
        assert_eq!(passed, ["0", "1", "3"]);
        assert_eq!(dropped, 2);
        // The window carries over to the next batch.
        let (passed, dropped) = run(&step, "0", by_message_id(&["c", "d"]));
        assert_eq!(passed, ["1"]);
        assert_eq!(dropped, 1);
    }

    #[test]
    fn a_body_field_or_property_can_be_the_id() {
        let step_body = step(json!({"by": "body.reading.id"}));
        let items = [
            r#"{"reading":{"id":"r-1","t":20}}"#,
            r#"{"reading":{"id":"r-1","t":21}}"#,
            r#"{"reading":{"id":42}}"#,
            r#"{"reading":{"id":"42"}}"#,
            r#"{"reading":{}}"#,
            r#"{"reading":{}}"#,
            "not json",
        ]
        .iter()
        .map(|b| at(event(None, b), 5))
        .collect();
        let (passed, dropped) = run(&step_body, "0", items);
        assert_eq!(
            passed,
            [
                r#"{"reading":{"id":"r-1","t":20}}"#,
                r#"{"reading":{"id":42}}"#,
                r#"{"reading":{}}"#,
                r#"{"reading":{}}"#,
                "not json",
            ]
        );
        assert_eq!(dropped, 2);

        let step_user = step(json!({"by": "user.event_id", "missing": "drop"}));
        let with = |id: Option<PropertyValue>, body: &str| {
            let mut e = event(None, body);
            if let Some(id) = id {
                e = e.with_property("event_id", id);
            }
            at(e, 5)
        };
        let items = vec![
            with(Some(PropertyValue::Int64(7)), "a"),
            with(Some(PropertyValue::String("7".into())), "b"),
            with(Some(PropertyValue::String("".into())), "c"),
            with(
                Some(PropertyValue::Bytes(bytes::Bytes::from_static(b"x"))),
                "d",
            ),
            with(None, "e"),
            with(Some(PropertyValue::Int64(8)), "f"),
        ];
        let (passed, dropped) = run(&step_user, "0", items);
        assert_eq!(passed, ["a", "f"]);
        assert_eq!(dropped, 4);
    }

    #[test]
    fn ids_are_forgotten_once_the_window_has_passed_in_enqueued_time() {
        let step = step(json!({"window": "10m"}));
        let ten_minutes = 600_000;
        let items = vec![
            at(event(Some("a"), "first"), 0),
            at(event(Some("a"), "retry"), ten_minutes - 1),
            at(event(Some("a"), "later"), ten_minutes),
            at(event(Some("a"), "retry of later"), ten_minutes + 5),
        ];
        let (passed, dropped) = run(&step, "0", items);
        assert_eq!(passed, ["first", "later"]);
        assert_eq!(dropped, 2);
    }

    #[test]
    fn window_events_bounds_the_memory_oldest_first() {
        let step = step(json!({"window_events": 2}));
        let (passed, dropped) = run(&step, "0", by_message_id(&["a", "b", "c", "c", "a", "c"]));
        // After a, b, c only b and c are remembered: the second c is dropped, a passes again,
        // and then c (remembered with a) is dropped.
        assert_eq!(passed, ["0", "1", "2", "4"]);
        assert_eq!(dropped, 2);
    }

    #[test]
    fn partitions_have_separate_windows_and_close_clears_one() {
        let step = step(json!({}));
        assert_eq!(run(&step, "0", by_message_id(&["a"])).0.len(), 1);
        assert_eq!(run(&step, "1", by_message_id(&["a"])).0.len(), 1);
        assert_eq!(run(&step, "0", by_message_id(&["a"])).1, 1);
        step.close_partition("0");
        assert_eq!(run(&step, "0", by_message_id(&["a"])).0.len(), 1);
        assert_eq!(
            run(&step, "1", by_message_id(&["a"])).1,
            1,
            "partition 1 kept its window"
        );
        step.open_partition("1");
        assert_eq!(run(&step, "1", by_message_id(&["a"])).0.len(), 1);
    }

    #[test]
    fn bad_keys_are_refused_with_what_would_do() {
        let context = CompileContext::new(std::env::temp_dir());
        let compile =
            |keys: Value| spec::compile("dedupe", None, keys, &context).expect_err("refused");
        let error = compile(json!({"by": "message_id"}));
        assert_eq!(error.key.as_deref(), Some("by"));
        let error = compile(json!({"window": "10 parsecs"}));
        assert_eq!(error.key.as_deref(), Some("window"));
        assert!(error.message.contains("10 parsecs"), "{error}");
        assert!(error.message.contains("\"10m\""), "{error}");
        let error = compile(json!({"window": "0s"}));
        assert!(error.message.contains("at least 1ms"), "{error}");
        let error = compile(json!({"window_events": 0}));
        assert_eq!(error.key.as_deref(), Some("window_events"));
        assert!(
            compile(json!({"missing": "dead-letter"}))
                .message
                .contains("pass")
        );
        assert!(compile(json!({"size": 1})).message.contains("size"));
    }

    #[test]
    fn durations_read_as_the_task_file_writes_them() {
        let ms = |text: &str| parse_duration(text).map(|d| d.as_millis());
        assert_eq!(ms("500ms"), Ok(500));
        assert_eq!(ms("90s"), Ok(90_000));
        assert_eq!(ms("10m"), Ok(600_000));
        assert_eq!(ms("1h 30m"), Ok(5_400_000));
        assert_eq!(ms(" 2days 1h "), Ok(176_400_000));
        assert_eq!(ms("10min"), Ok(600_000));
        for bad in ["", "10", "m", "-1s", "10 parsecs", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn distinct_ids_hash_apart() {
        let hashes: HashSet<u128> = (0..10_000).map(|i| hash_id(&format!("id-{i}"))).collect();
        assert_eq!(hashes.len(), 10_000);
        assert_eq!(hash_id("same"), hash_id("same"));
    }

    proptest! {
        #[test]
        fn never_panics_and_accounts_for_every_event(
            events in proptest::collection::vec(
                (proptest::option::of("[a-c]{0,2}"), any::<Vec<u8>>(),
                 "[\\[\\]{}\",:0-9a-z ]{0,24}", -5i64..5, any::<i64>()),
                1..24),
            by in prop_oneof![
                Just("sys.message_id"), Just("body.id"), Just("body"), Just("user.id"),
                Just("sys.enqueued_time")],
        ) {
            let step = step(json!({"by": by, "window": "3ms", "window_events": 3}));
            let count = events.len();
            let items = events
                .into_iter()
                .enumerate()
                .map(|(i, (id, raw, json_body, time, number))| {
                    let body = if i % 2 == 0 { raw } else { json_body.into_bytes() };
                    let e = EventData { message_id: id, ..EventData::new(body) }
                        .with_property("id", PropertyValue::Int64(number % 3));
                    at(e, time)
                })
                .collect();
            let (passed, dropped) = run(&step, "0", items);
            prop_assert_eq!(passed.len() as u64 + dropped, count as u64);
        }
    }
}
