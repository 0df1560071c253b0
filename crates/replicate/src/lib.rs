//! Replication tasks (Azure's "event replication task patterns"): copy, merge, edit and route
//! events between event hubs — a Tributary hub in this process, one reached over AMQP, or Azure
//! Event Hubs — as a product rather than a Functions sample.
//!
//! A task ([`TaskConfig`], read from a TOML file) reads its source as a consumer group on the
//! event processor host, so it inherits leases, checkpoints, epochs, balancing and failover:
//! several processes running one task file share the source partitions and take over from each
//! other after a crash. [`Replicator`] runs one task.
//!
//! # Guarantees
//!
//! - **At least once, nothing skipped.** A batch is checkpointed only after every target
//!   acknowledged every event of it (or the event went to the dead-letter target). Sends are
//!   retried with backoff without end; a crash replays at most the batch in flight per
//!   partition. (Azure Functions checkpoints a failed batch and relies on in-place retry.)
//! - **Forwarded unmodified.** Body, application properties, content type, message and
//!   correlation ids and partition key travel as they were; the task only adds the
//!   [`metadata`] properties (`repl-enqueued-time`, `repl-offset`, `repl-sequence` as Azure's
//!   helper writes them, and Tributary's `repl-origin` and `repl-path`).
//! - **Per-key order.** Events with one partition key reach the target in source order.
//! - **No loops.** An event is never forwarded to a hub on its path, so any number of hubs may
//!   mirror each other.
//! - **Poison never blocks and is never silent.** An event a target refuses on its own goes to
//!   the dead-letter target with the reason; without one, it is logged at error level and
//!   counted.
//!
//! - **Edited as the file says.** The editor's steps ([`tributary_edit`], re-exported as
//!   [`edit`]) run on each batch before routing; an event a step refuses goes to the
//!   dead-letter target with the step's name and reason, one it drops is counted.
//!
//! [`offset_map`] records where source events landed in each target, so a consumer group's
//! checkpoints translate to a replica after a failover.
//! - **Exactly once into PostgreSQL.** A `kind = "postgres"` target (feature `postgres`,
//!   [`projection`]) writes each batch's rows and the task's progress in one transaction, and
//!   a partition resumes from the database's progress: replays change nothing.
//!
//! [`metrics`] counts events in, out, dead-lettered and filtered, and the replication lag.

pub mod endpoint;
pub mod forward;
pub mod kafka;
pub mod limits;
pub mod metadata;
pub mod metrics;
pub mod offset_map;
#[cfg(feature = "postgres")]
pub mod projection;
mod runner;
pub mod status;
pub mod target;
pub mod task;

pub use endpoint::Brokers;
pub use runner::{
    DEAD_LETTER_REASON, DEAD_LETTER_ROUTE, DEAD_LETTER_STEP, DEAD_LETTER_TASK, Replicator,
    StartOptions, wall_clock_ms,
};
pub use task::{TaskConfig, TaskError};
pub use tributary_edit as edit;
