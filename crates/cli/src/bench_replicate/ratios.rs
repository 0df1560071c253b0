//! The replication targets of issue 38 as CPU ratios, from one round's runs, each printed with
//! its two figures and a verdict:
//!
//! - the task's CPU per copied event against the hub's CPU per ingested event (the round's
//!   ingest baseline into the source), ≤ 0.5, for each way the task reached the hubs;
//! - the target hub's CPU per stamped event (during the copy over AMQP) against its own CPU per
//!   unstamped event (the round's ingest run into the target: the same producers, events of
//!   the same size, no `repl-*` stamps), ≤ 1.2.
//!
//! Each figure is the CPU time of what would be one process in a deployment, over its events:
//! a hub is its runtime's threads and its log's `fdatasync` threads (in an ingest run and in a
//! copy over AMQP only one hub writes, so the sync threads counted are its); a task over AMQP
//! is the command's runtime; a task in process opens both hubs' data directories, so it is the
//! command's runtime, both hubs' runtimes and the target log's syncs. In process the target's
//! appends run on the task's threads, so the stamped/unstamped ratio is measured over AMQP only.

use crate::args::TaskTransport;
use crate::bench_silent::verdict;

use super::{
    CopyRun, IngestRun, LOG_SYNCS, Round, SOURCE_HUB, TARGET_HUB, TASK, median, per_append,
};

/// The task's CPU per copied event / the hub's per ingested event, at most.
pub(super) const TASK_TARGET: f64 = 0.5;
/// The target hub's CPU per stamped event / its own per unstamped event, at most.
pub(super) const STAMPED_TARGET: f64 = 1.2;

/// `seconds` of CPU over `events`, in µs per event.
fn micros(seconds: f64, events: u64) -> f64 {
    seconds * 1e6 / events.max(1) as f64
}

/// A hub's CPU per event in an ingest run: its threads and its log's syncs, in µs.
fn hub_ingest(run: &IngestRun, hub: &str) -> (f64, f64) {
    (
        micros(run.cpu.seconds(&[hub]), run.events),
        micros(run.cpu.seconds(&[LOG_SYNCS]), run.events),
    )
}

/// The groups of threads a task's process has.
fn task_groups(transport: TaskTransport) -> &'static [&'static str] {
    match transport {
        TaskTransport::Amqp => &[TASK],
        TaskTransport::Local => &[TASK, SOURCE_HUB, TARGET_HUB, LOG_SYNCS],
    }
}

/// The task's process CPU per copied event, in µs.
fn task_copy(copy: &CopyRun) -> f64 {
    micros(copy.cpu.seconds(task_groups(copy.transport)), copy.events)
}

/// The target hub's CPU per stamped event during a copy over AMQP: its threads and its log's
/// syncs, in µs.
fn target_copy(copy: &CopyRun) -> (f64, f64) {
    (
        micros(copy.cpu.seconds(&[TARGET_HUB]), copy.events),
        micros(copy.cpu.seconds(&[LOG_SYNCS]), copy.events),
    )
}

/// The task / hub ratio of the round's `index`th copy.
fn task_ratio(round: &Round, index: usize) -> f64 {
    let (hub, syncs) = hub_ingest(&round.baseline, SOURCE_HUB);
    task_copy(&round.copies[index]) / (hub + syncs)
}

/// The round's copy over AMQP, if it made one.
fn amqp_copy(round: &Round) -> Option<&CopyRun> {
    round
        .copies
        .iter()
        .find(|copy| copy.transport == TaskTransport::Amqp)
}

/// The target's stamped / unstamped ratio, if the round copied over AMQP.
fn stamped_ratio(round: &Round) -> Option<f64> {
    let (hub, syncs) = target_copy(amqp_copy(round)?);
    let (plain, plain_syncs) = hub_ingest(&round.target_baseline, TARGET_HUB);
    Some((hub + syncs) / (plain + plain_syncs))
}

/// How a line names the way a task reached the hubs.
fn way(transport: TaskTransport) -> &'static str {
    match transport {
        TaskTransport::Amqp => "over AMQP",
        TaskTransport::Local => "in process",
    }
}

/// What a task's process is, in a line.
fn task_parts(transport: TaskTransport) -> &'static str {
    match transport {
        TaskTransport::Amqp => "its threads",
        TaskTransport::Local => {
            "its threads with both hubs' brokers and the target log's syncs, all in its process"
        }
    }
}

/// Prints round `number`'s ratios (of `rounds`).
pub(super) fn print_round(round: &Round, number: usize, rounds: usize) {
    let label = match rounds {
        1 => String::new(),
        _ => format!(" (round {number})"),
    };
    let (hub, syncs) = hub_ingest(&round.baseline, SOURCE_HUB);
    for (index, copy) in round.copies.iter().enumerate() {
        let ratio = task_ratio(round, index);
        println!(
            "replicate ratio task/hub {}{label}: task CPU {:.2} µs per copied event ({}) / hub CPU {:.2} µs per ingested event (the baseline's source hub {hub:.2} + its log syncs {syncs:.2}) = {ratio:.2} (target <= {TASK_TARGET}: {})",
            way(copy.transport),
            task_copy(copy),
            task_parts(copy.transport),
            hub + syncs,
            verdict(ratio <= TASK_TARGET)
        );
    }
    print_stamped(round, &label);
}

/// Prints the target's stamped / unstamped ratio of `round`, or why there is none.
fn print_stamped(round: &Round, label: &str) {
    let (Some(copy), Some(ratio)) = (amqp_copy(round), stamped_ratio(round)) else {
        println!(
            "replicate ratio stamped/unstamped{label}: not measured (in process the target's appends run on the task's threads; add amqp to --task-transport)"
        );
        return;
    };
    let (hub, syncs) = target_copy(copy);
    let base = &round.target_baseline;
    let (plain, plain_syncs) = hub_ingest(base, TARGET_HUB);
    println!(
        "replicate ratio stamped/unstamped{label}: target hub CPU {:.2} µs per stamped event (its threads {hub:.2} + its log syncs {syncs:.2}, the copy over AMQP, {}) / {:.2} µs per unstamped event (its threads {plain:.2} + its log syncs {plain_syncs:.2}, the ingest run into it, {}) = {ratio:.2} (target <= {STAMPED_TARGET}: {})",
        hub + syncs,
        per_append(copy.events, copy.appends),
        plain + plain_syncs,
        per_append(base.events, base.appends),
        verdict(ratio <= STAMPED_TARGET)
    );
}

/// With more than one round, prints each ratio's median over the rounds.
pub(super) fn print_medians(rounds: &[Round]) {
    let Some(first) = rounds.first().filter(|_| rounds.len() > 1) else {
        return;
    };
    let mut parts: Vec<String> = (0..first.copies.len())
        .map(|index| {
            let ratio = median(rounds.iter().map(|r| task_ratio(r, index)).collect());
            format!(
                "task/hub {} {ratio:.2} (target <= {TASK_TARGET}: {})",
                way(first.copies[index].transport),
                verdict(ratio <= TASK_TARGET)
            )
        })
        .collect();
    let stamped: Vec<f64> = rounds.iter().filter_map(stamped_ratio).collect();
    if !stamped.is_empty() {
        let ratio = median(stamped);
        parts.push(format!(
            "stamped/unstamped {ratio:.2} (target <= {STAMPED_TARGET}: {})",
            verdict(ratio <= STAMPED_TARGET)
        ));
    }
    println!(
        "replicate ratios, medians of {} rounds: {}",
        rounds.len(),
        parts.join("; ")
    );
}
