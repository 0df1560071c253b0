//! The integration-test harness: what the tests of several crates share, in one place.
//!
//! - [`azurite`]: Azurite's blob service on a free port, for the blob checkpoint store tests.
//! - [`counting_store`]: a checkpoint store wrapper counting a processor's store calls.
//! - [`formats`]: the on-disk format fixtures earlier builds wrote, and copies of them.
//! - [`history`]: what a processor fleet did, and the checks run on it after a nemesis
//!   schedule (no double processing beyond a window, no checkpoint backwards, nothing lost).
//! - [`hub`]: a real hub on a free port — a broker on a temporary directory and its AMQP front
//!   door (AMQPS when given a certificate) with root, listen-only and send-only policies.
//! - [`sdk`]: running the official SDKs' scenario scripts (Python `azure-eventhub`, JavaScript
//!   `@azure/event-hubs`) and reading the JSON they print.
//! - [`official`]: the official Python and JavaScript processors in their own processes, and
//!   what they report, for the mixed-fleet tests.
//! - [`netns`]: nodes in network namespaces of their own on one bridge, and faults on the
//!   links between them (silent drops, resets, slow and lossy links, a link down).
//! - [`nemesis`]: a seeded, replayable schedule of those faults.
//! - [`oci`]: the HTTP front door under test, the `oci` SDK's scripts, a raw HTTP client.
//! - [`postgres`]: a private PostgreSQL server (one per test binary, a database per test).
//!
//! The tests that need both ends of the wire — the server's doors and the Rust client, the
//! official SDKs, the processor over AMQP — live in this crate's `tests/` and its scripts in
//! `tests/python`, `tests/js` and `tests/oci`, so no library crate needs another's as a
//! dev-dependency (the front door and the client used to depend on each other that way).
//! Nothing here is published; a missing SDK fails a test, it never skips it.

pub mod azurite;
pub mod counting_store;
pub mod formats;
pub mod history;
pub mod hub;
pub mod nemesis;
pub mod netns;
pub mod oci;
pub mod official;
pub mod postgres;
pub mod sdk;

pub use azurite::Azurite;
pub use counting_store::{CountingStore, StoreCalls};
pub use hub::{TestHub, within};
pub use official::{OfficialProcessor, OfficialSeen, Sdk};
pub use postgres::PostgresServer;
pub use sdk::{
    JsonLines, bodies, join_all, join_in_waves, node_modules, python, repo, run_json, run_kafkajs,
    run_node, run_node_with, run_python, wait_for_receivers,
};
