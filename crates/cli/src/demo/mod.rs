//! `tributary demo`: the home-security scenario of the Event Processor Host documentation
//! (seed 000), live on one machine.
//!
//! In this process: an embedded hub (the broker and the AMQP door `serve` runs; 16 partitions,
//! hub `sensors`), the simulated sensors ([`sensors`]), the residents' page ([`page`]) and a
//! script. In child processes: the processor instances ([`fleet`], [`aggregate`]), which read
//! over AMQP, share one SQLite checkpoint store and aggregate per home per minute into one
//! SQLite aggregates database, exactly once per event.
//!
//! The script, at fixed fractions of `--duration`: carbon-monoxide detectors are installed
//! (the load grows by a third), an instance is added (the pool rebalances), an instance is
//! killed with SIGKILL (its partitions resume elsewhere from its checkpoints). Each step is
//! announced on the terminal and on the page. At the end of `--duration` (or on Ctrl-C) the
//! sensors stop, the instances catch up, the aggregates are checked against what the hub
//! acknowledged (the verdict), and `summary.json` is written to the data directory; then
//! everything stops, children included. Without `--duration` the script ends 10 s after its last
//! step: the sensors pause for the same check, then resume until Ctrl-C, which stops everything
//! without a second verdict. The verdict is given once.

pub mod aggregate;
mod fleet;
mod page;
mod run;
mod sensors;

pub use run::run;

/// The hub the sensors send to.
pub const HUB: &str = "sensors";
/// Its partitions, as in the seed.
pub const PARTITIONS: u32 = 16;
