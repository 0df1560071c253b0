//! The [`Step`] trait every editor step implements (the built-in ones and a library user's),
//! and [`Editor`], a chain of steps applied in order.
//!
//! # Guarantees
//!
//! - **Order.** A step sees one source partition's events in source order and passes on what
//!   it keeps in order; a step that makes one event of several, or several of one, keeps the
//!   order of what it made.
//! - **Nothing vanishes uncounted.** Every event a step is given is passed on, refused (with a
//!   reason, for the dead-letter target), or dropped and counted under the step's name.
//! - **No panic on input.** Events come from producers: a step turns every malformed input
//!   into a refusal, never a panic.

use std::fmt;
use std::sync::Arc;

use crate::item::Item;

/// What a step knows besides the events.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The source partition the events were read from.
    pub partition: &'a str,
    /// Now, ms since the Unix epoch (a test's clock in tests).
    pub now_ms: i64,
}

/// An event a step refused, and why.
#[derive(Debug, Clone)]
pub struct Rejected {
    /// The event as it reached the step.
    pub item: Item,
    /// The step that refused it.
    pub step: String,
    /// Why, for a person (becomes the dead-letter reason).
    pub reason: String,
}

/// What one step did with the events it was given.
#[derive(Debug, Default)]
pub struct Output {
    passed: Vec<Item>,
    rejected: Vec<(Item, String)>,
    dropped: u64,
}

impl Output {
    /// Passes `item` on to the next step.
    pub fn pass(&mut self, item: Item) {
        self.passed.push(item);
    }

    /// Refuses `item`: it goes to the task's dead-letter target with `reason`.
    pub fn reject(&mut self, item: Item, reason: impl Into<String>) {
        self.rejected.push((item, reason.into()));
    }

    /// Drops `item` on purpose (filtered, a duplicate, invalid and configured to be dropped);
    /// it is counted under the step's name.
    pub fn drop_item(&mut self, item: Item) {
        drop(item);
        self.dropped += 1;
    }
}

/// One step of an editor chain.
///
/// A step is shared by every partition of a task (and so called from several tasks at once);
/// state it keeps per partition belongs in a map keyed by [`Context::partition`], set up in
/// [`Step::open_partition`] and let go in [`Step::close_partition`].
pub trait Step: Send + Sync + fmt::Debug {
    /// The step's name: the task file's `name`, or its kind.
    fn name(&self) -> &str;

    /// Edits `items` (one partition's events, in source order) into `out`.
    fn apply(&self, context: &Context<'_>, items: Vec<Item>, out: &mut Output);

    /// This process starts editing `partition` (after taking it over, perhaps from another
    /// process that edited it before).
    fn open_partition(&self, _partition: &str) {}

    /// This process stops editing `partition`.
    fn close_partition(&self, _partition: &str) {}
}

/// What a chain did with one batch.
#[derive(Debug, Default)]
pub struct Edited {
    /// The events to forward, in order.
    pub passed: Vec<Item>,
    /// The events refused, for the dead-letter target, in the order they were refused.
    pub rejected: Vec<Rejected>,
    /// How many each step dropped, by step name, in chain order (steps that dropped none are
    /// left out).
    pub dropped: Vec<(String, u64)>,
}

/// A chain of steps, applied in order.
#[derive(Debug, Clone, Default)]
pub struct Editor {
    steps: Vec<Arc<dyn Step>>,
}

impl Editor {
    /// A chain of `steps`.
    pub fn new(steps: Vec<Arc<dyn Step>>) -> Editor {
        Editor { steps }
    }

    /// Whether the chain has no step (events pass unchanged).
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The steps, in order.
    pub fn steps(&self) -> &[Arc<dyn Step>] {
        &self.steps
    }

    /// Runs `items` through every step.
    pub fn apply(&self, context: &Context<'_>, items: Vec<Item>) -> Edited {
        let mut edited = Edited {
            passed: items,
            ..Edited::default()
        };
        for step in &self.steps {
            if edited.passed.is_empty() {
                break;
            }
            let mut out = Output::default();
            step.apply(context, std::mem::take(&mut edited.passed), &mut out);
            edited.passed = out.passed;
            edited
                .rejected
                .extend(out.rejected.into_iter().map(|(item, reason)| Rejected {
                    item,
                    step: step.name().to_owned(),
                    reason,
                }));
            if out.dropped > 0 {
                edited.dropped.push((step.name().to_owned(), out.dropped));
            }
        }
        edited
    }

    /// Tells every step that this process starts editing `partition`.
    pub fn open_partition(&self, partition: &str) {
        for step in &self.steps {
            step.open_partition(partition);
        }
    }

    /// Tells every step that this process stops editing `partition`.
    pub fn close_partition(&self, partition: &str) {
        for step in &self.steps {
            step.close_partition(partition);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use tributary_event::EventData;

    use super::*;
    use crate::item::Position;

    /// Keeps even bodies, refuses "bad", drops the rest.
    #[derive(Debug)]
    struct Evens;

    impl Step for Evens {
        fn name(&self) -> &str {
            "evens"
        }

        fn apply(&self, _: &Context<'_>, items: Vec<Item>, out: &mut Output) {
            for mut item in items {
                let body = item.body().clone();
                match std::str::from_utf8(&body)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                {
                    Some(n) if n % 2 == 0 => out.pass(item),
                    Some(_) => out.drop_item(item),
                    None => out.reject(item, "not a number"),
                }
            }
        }
    }

    /// Doubles each event.
    #[derive(Debug)]
    struct Twice;

    impl Step for Twice {
        fn name(&self) -> &str {
            "twice"
        }

        fn apply(&self, _: &Context<'_>, items: Vec<Item>, out: &mut Output) {
            for item in items {
                out.pass(item.clone());
                out.pass(item);
            }
        }
    }

    fn items(bodies: &[&str]) -> Vec<Item> {
        bodies
            .iter()
            .enumerate()
            .map(|(i, body)| {
                let position = Position {
                    sequence_number: i as i64,
                    offset: i as u64,
                    enqueued_time_ms: 0,
                };
                Item::new(EventData::new(Bytes::from(body.to_string())), position)
            })
            .collect()
    }

    #[test]
    fn a_chain_passes_refuses_and_counts_in_order() {
        let editor = Editor::new(vec![Arc::new(Evens), Arc::new(Twice)]);
        let context = Context {
            partition: "0",
            now_ms: 0,
        };
        let edited = editor.apply(&context, items(&["2", "3", "bad", "4", "5"]));
        let bodies: Vec<String> = edited
            .passed
            .into_iter()
            .map(|i| String::from_utf8(i.into_event().body.to_vec()).expect("utf-8"))
            .collect();
        assert_eq!(bodies, ["2", "2", "4", "4"]);
        assert_eq!(edited.rejected.len(), 1);
        assert_eq!(edited.rejected[0].step, "evens");
        assert_eq!(edited.rejected[0].reason, "not a number");
        assert_eq!(edited.rejected[0].item.position().sequence_number, 2);
        assert_eq!(edited.dropped, vec![("evens".to_owned(), 2)]);
    }
}
