//! A seeded nemesis schedule: from a seed, a replayable list of faults between chosen pairs of
//! nodes over time ([`Schedule::generate`]), applied to a [`Network`] step by step
//! ([`Schedule::run`]). The same seed and pairs give the same schedule, and its `Display` is
//! what a failing test prints so the run can be replayed.
//!
//! Guarantees: a pair has at most one fault at a time, every fault is healed by the schedule's
//! end (each start has its heal step), and at most two pairs (or one isolated node) are faulty
//! at once, so some path stays up for the fleet to make progress.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::netns::{Fault, Network};

/// One change to the network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A fault starts on the link between two nodes.
    Start {
        /// One end.
        a: String,
        /// The other end.
        b: String,
        /// What goes wrong.
        fault: Fault,
    },
    /// That link heals.
    Heal {
        /// One end.
        a: String,
        /// The other end.
        b: String,
    },
    /// A node's link to the bridge goes down.
    Isolate {
        /// The node.
        node: String,
    },
    /// It comes back up.
    Rejoin {
        /// The node.
        node: String,
    },
}

/// An action at a moment, in milliseconds from the schedule's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// When, from the schedule's start.
    pub at_ms: u64,
    /// What.
    pub action: Action,
}

/// A seed's steps.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The seed it was generated from.
    pub seed: u64,
    /// Its steps, in time order.
    pub steps: Vec<Step>,
    /// When the last fault has healed.
    pub length: Duration,
}

/// Faults at once, at most.
const CONCURRENT_MAX: usize = 2;

impl Schedule {
    /// Faults on `pairs` (and isolations of `isolatable` nodes) starting within `span`, each
    /// lasting 0.5–`fault_ms_max` ms.
    pub fn generate(
        seed: u64,
        pairs: &[(&str, &str)],
        isolatable: &[&str],
        span: Duration,
        fault_ms_max: u64,
    ) -> Schedule {
        assert!(!pairs.is_empty());
        assert!(fault_ms_max >= 500);
        let mut rng = StdRng::seed_from_u64(seed);
        let span_ms = span.as_millis() as u64;
        // (heals at, what) of the faults started so far.
        let mut faults: Vec<(u64, Step, Step)> = Vec::new();
        let mut at_ms = rng.gen_range(200..1_000);
        while at_ms < span_ms {
            let active: Vec<&(u64, Step, Step)> =
                faults.iter().filter(|(end, ..)| *end > at_ms).collect();
            let busy = |a: &str, b: &str| {
                active.iter().any(|(_, start, _)| match &start.action {
                    Action::Start { a: x, b: y, .. } => (x == a && y == b) || (x == b && y == a),
                    // An isolated node is faulty with every peer.
                    Action::Isolate { node } => node == a || node == b,
                    _ => false,
                })
            };
            let isolating = active
                .iter()
                .any(|(_, s, _)| matches!(s.action, Action::Isolate { .. }));
            if active.len() < CONCURRENT_MAX && !isolating {
                let length_ms = rng.gen_range(500..=fault_ms_max);
                let alone = active.is_empty();
                let Some((start, heal)) = pick(&mut rng, pairs, isolatable, alone, busy) else {
                    at_ms += 100;
                    continue;
                };
                let end = at_ms + length_ms;
                faults.push((
                    end,
                    Step {
                        at_ms,
                        action: start,
                    },
                    Step {
                        at_ms: end,
                        action: heal,
                    },
                ));
            }
            at_ms += rng.gen_range(300..2_000);
        }
        let length = Duration::from_millis(faults.iter().map(|(end, ..)| *end).max().unwrap_or(0));
        let mut steps: Vec<Step> = faults
            .into_iter()
            .flat_map(|(_, start, heal)| [start, heal])
            .collect();
        steps.sort_by_key(|s| s.at_ms);
        Schedule {
            seed,
            steps,
            length,
        }
    }

    /// The longest a message between `a` and `b` can wait in a fault's queue during the
    /// schedule (zero when no slow link ever joins them).
    pub fn queue_delay_max(&self, a: &str, b: &str) -> Duration {
        self.steps
            .iter()
            .filter_map(|step| match &step.action {
                Action::Start { a: x, b: y, fault } if (x == a && y == b) || (x == b && y == a) => {
                    Some(fault.queue_delay_max())
                }
                _ => None,
            })
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// Whether any step makes the link between `a` and `b` lossy.
    pub fn has_loss(&self, a: &str, b: &str) -> bool {
        self.steps.iter().any(|step| {
            matches!(&step.action, Action::Start { a: x, b: y, fault: Fault::Loss { .. } }
                if (x == a && y == b) || (x == b && y == a))
        })
    }

    /// Applies the steps on `network` at their moments from now (blocking; run it on a thread
    /// of its own), then heals everything.
    pub fn run(&self, network: &Network) -> Result<(), String> {
        let started = Instant::now();
        for step in &self.steps {
            let at = started + Duration::from_millis(step.at_ms);
            std::thread::sleep(at.saturating_duration_since(Instant::now()));
            let applied = match &step.action {
                Action::Start { a, b, fault } => network.start(a, b, *fault),
                Action::Heal { a, b } => network.heal(a, b),
                Action::Isolate { node } => network.isolate(node),
                Action::Rejoin { node } => network.rejoin(node),
            };
            applied.map_err(|e| format!("at +{} ms: {e}", step.at_ms))?;
        }
        network.heal_all()
    }
}

/// A fault's start and heal: an isolation now and then when no other fault is on, else a
/// fault on a random pair; `None` when that pair is `busy` already.
fn pick(
    rng: &mut StdRng,
    pairs: &[(&str, &str)],
    isolatable: &[&str],
    alone: bool,
    busy: impl Fn(&str, &str) -> bool,
) -> Option<(Action, Action)> {
    if !isolatable.is_empty() && alone && rng.gen_bool(0.15) {
        let node = isolatable[rng.gen_range(0..isolatable.len())].to_owned();
        return Some((
            Action::Isolate { node: node.clone() },
            Action::Rejoin { node },
        ));
    }
    let (a, b) = pairs[rng.gen_range(0..pairs.len())];
    if busy(a, b) {
        return None;
    }
    let fault = random_fault(rng);
    let (a, b) = (a.to_owned(), b.to_owned());
    let start = Action::Start {
        a: a.clone(),
        b: b.clone(),
        fault,
    };
    Some((start, Action::Heal { a, b }))
}

/// Cuts (the faults that move partitions) two times in three.
fn random_fault(rng: &mut StdRng) -> Fault {
    match rng.gen_range(0..6) {
        0..=2 => Fault::Drop,
        3 => Fault::Reject,
        4 => Fault::Slow {
            kbit: [128, 256, 512][rng.gen_range(0..3)],
        },
        _ => Fault::Loss {
            bits: rng.gen_range(2..=4),
        },
    }
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {} ({} steps):", self.seed, self.steps.len())?;
        for step in &self.steps {
            let what = match &step.action {
                Action::Start { a, b, fault } => format!("{fault} between {a} and {b}"),
                Action::Heal { a, b } => format!("heal {a} <-> {b}"),
                Action::Isolate { node } => format!("isolate {node} (link down)"),
                Action::Rejoin { node } => format!("rejoin {node} (link up)"),
            };
            writeln!(f, "  +{:>6} ms  {what}", step.at_ms)?;
        }
        write!(f, "  +{:>6} ms  all healed", self.length.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAIRS: [(&str, &str); 3] = [("hub", "p0"), ("hub", "p1"), ("hub", "rep")];

    #[test]
    fn a_seed_gives_one_schedule_and_every_fault_heals() {
        for seed in 0..50 {
            let one = Schedule::generate(seed, &PAIRS, &["p0"], Duration::from_secs(12), 4_000);
            let two = Schedule::generate(seed, &PAIRS, &["p0"], Duration::from_secs(12), 4_000);
            assert_eq!(one.steps, two.steps);
            assert!(!one.steps.is_empty(), "seed {seed}");
            let starts = one
                .steps
                .iter()
                .filter(|s| matches!(s.action, Action::Start { .. } | Action::Isolate { .. }))
                .count();
            assert_eq!(starts * 2, one.steps.len(), "seed {seed}");
            assert_eq!(
                one.steps.last().unwrap().at_ms,
                one.length.as_millis() as u64
            );
        }
    }

    #[test]
    fn at_most_two_faults_at_once() {
        for seed in 0..50 {
            let schedule =
                Schedule::generate(seed, &PAIRS, &["p0"], Duration::from_secs(12), 4_000);
            let mut active = 0i32;
            for step in &schedule.steps {
                active += match step.action {
                    Action::Start { .. } | Action::Isolate { .. } => 1,
                    Action::Heal { .. } | Action::Rejoin { .. } => -1,
                };
                assert!((0..=2).contains(&active), "seed {seed}:\n{schedule}");
            }
        }
    }
}
