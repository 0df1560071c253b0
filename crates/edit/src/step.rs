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
use std::ops::Range;
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

    /// Whether the step edits each event without regard to which events share its batch:
    /// given a batch in consecutive parts, it passes on, refuses and drops exactly what it
    /// would given the batch whole. The chain then runs consecutive such steps over a few
    /// events at a time ([`PER_EVENT_RUN`]), so an event's body, read by one step, is still in
    /// the CPU's cache when the next step reads it. A step that keeps state across events
    /// (a de-duplication window) still qualifies if it sees them in order; one that groups
    /// events, or does per-batch work that parts would repeat (saving a file), does not.
    ///
    /// The default is `false`: a step sees each batch whole.
    fn edits_each_event_alone(&self) -> bool {
        false
    }

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

/// How many events a run of steps that edit each event alone
/// ([`Step::edits_each_event_alone`]) takes at a time. A 1 KiB JSON event and its scanned
/// tape take about 3 KiB, so a part stays within a core's L1 and L2 caches from the run's
/// first step to its last; much smaller parts pay the per-part work (vectors, one call per
/// step) on too few events.
pub const PER_EVENT_RUN: usize = 32;

/// A chain of steps, applied in order.
#[derive(Debug, Clone, Default)]
pub struct Editor {
    steps: Vec<Arc<dyn Step>>,
    /// The chain cut into runs: a run of consecutive steps that each edit each event alone, or
    /// one other step. Together the runs cover the steps in order.
    runs: Vec<Range<usize>>,
}

impl Editor {
    /// A chain of `steps`.
    pub fn new(steps: Vec<Arc<dyn Step>>) -> Editor {
        let mut runs: Vec<Range<usize>> = Vec::new();
        for (index, step) in steps.iter().enumerate() {
            match runs.last_mut() {
                Some(run)
                    if step.edits_each_event_alone()
                        && steps[run.start].edits_each_event_alone() =>
                {
                    run.end = index + 1;
                }
                _ => runs.push(index..index + 1),
            }
        }
        debug_assert_eq!(
            runs.iter().map(ExactSizeIterator::len).sum::<usize>(),
            steps.len()
        );
        Editor { steps, runs }
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
    ///
    /// Runs of steps that edit each event alone take the batch [`PER_EVENT_RUN`] events at a
    /// time (through all of the run's steps before the next part); every other step takes it
    /// whole. What passes is the same either way, in the same order; refusals keep their
    /// order within each step.
    pub fn apply(&self, context: &Context<'_>, items: Vec<Item>) -> Edited {
        let mut passed = items;
        let mut rejected = Vec::new();
        let mut dropped = vec![0; self.steps.len()];
        for run in &self.runs {
            if passed.is_empty() {
                break;
            }
            if run.len() == 1 || passed.len() <= PER_EVENT_RUN {
                passed = self.apply_run(context, run.clone(), passed, &mut rejected, &mut dropped);
                continue;
            }
            let mut events = passed.into_iter();
            let mut run_passed = Vec::with_capacity(events.len());
            loop {
                let part: Vec<Item> = events.by_ref().take(PER_EVENT_RUN).collect();
                if part.is_empty() {
                    break;
                }
                let part_passed =
                    self.apply_run(context, run.clone(), part, &mut rejected, &mut dropped);
                run_passed.extend(part_passed);
            }
            passed = run_passed;
        }
        Edited {
            passed,
            rejected,
            dropped: self
                .steps
                .iter()
                .zip(dropped)
                .filter(|(_, count)| *count > 0)
                .map(|(step, count)| (step.name().to_owned(), count))
                .collect(),
        }
    }

    /// Runs `items` through the steps of `run`, one after another, adding what they refuse
    /// and drop to `rejected` and `dropped` (by step index); returns what passed the last.
    fn apply_run(
        &self,
        context: &Context<'_>,
        run: Range<usize>,
        mut items: Vec<Item>,
        rejected: &mut Vec<Rejected>,
        dropped: &mut [u64],
    ) -> Vec<Item> {
        for index in run {
            if items.is_empty() {
                break;
            }
            let step = &self.steps[index];
            // Most steps pass on about what they are given: room for that up front.
            let mut out = Output {
                passed: Vec::with_capacity(items.len()),
                ..Output::default()
            };
            step.apply(context, items, &mut out);
            items = out.passed;
            rejected.extend(out.rejected.into_iter().map(|(item, reason)| Rejected {
                item,
                step: step.name().to_owned(),
                reason,
            }));
            dropped[index] += out.dropped;
        }
        items
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

        fn edits_each_event_alone(&self) -> bool {
            true
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

    /// Passes everything, noting the size of each batch it is given.
    #[derive(Debug)]
    struct Sizes {
        alone: bool,
        seen: std::sync::Mutex<Vec<usize>>,
    }

    impl Sizes {
        fn new(alone: bool) -> Arc<Sizes> {
            Arc::new(Sizes {
                alone,
                seen: std::sync::Mutex::default(),
            })
        }

        fn seen(&self) -> Vec<usize> {
            self.seen.lock().expect("not poisoned").clone()
        }
    }

    impl Step for Sizes {
        fn name(&self) -> &str {
            "sizes"
        }

        fn edits_each_event_alone(&self) -> bool {
            self.alone
        }

        fn apply(&self, _: &Context<'_>, items: Vec<Item>, out: &mut Output) {
            self.seen.lock().expect("not poisoned").push(items.len());
            for item in items {
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

    #[test]
    fn runs_of_steps_that_edit_events_alone_take_a_batch_in_parts_with_the_same_outcome() {
        let bodies: Vec<String> = (0..100)
            .map(|i| {
                if i % 10 == 9 {
                    "bad".to_owned()
                } else {
                    i.to_string()
                }
            })
            .collect();
        let bodies: Vec<&str> = bodies.iter().map(String::as_str).collect();
        let context = Context {
            partition: "0",
            now_ms: 0,
        };
        let (first, second, whole) = (Sizes::new(true), Sizes::new(true), Sizes::new(false));
        let editor = Editor::new(vec![
            first.clone(),
            Arc::new(Evens),
            second.clone(),
            whole.clone(),
            Arc::new(Twice),
        ]);
        let edited = editor.apply(&context, items(&bodies));

        // The first three steps ran part by part, each part through all three in turn.
        assert_eq!(first.seen(), [32, 32, 32, 4]);
        assert_eq!(second.seen().iter().sum::<usize>(), 50);
        assert!(
            second.seen().iter().all(|&n| n <= 16),
            "{:?}",
            second.seen()
        );
        // A step that sees batches whole saw every event that got that far at once.
        assert_eq!(whole.seen(), [50]);

        // The same as each step given the batch whole.
        let sequences: Vec<i64> = edited
            .passed
            .iter()
            .map(|i| i.position().sequence_number)
            .collect();
        let expected: Vec<i64> = (0..100)
            .filter(|i| i % 10 != 9 && i % 2 == 0)
            .flat_map(|i| [i, i])
            .collect();
        assert_eq!(sequences, expected);
        let refused: Vec<i64> = edited
            .rejected
            .iter()
            .map(|r| r.item.position().sequence_number)
            .collect();
        assert_eq!(
            refused,
            (0..100).filter(|i| i % 10 == 9).collect::<Vec<_>>()
        );
        assert_eq!(edited.dropped, vec![("evens".to_owned(), 40)]);
    }
}
