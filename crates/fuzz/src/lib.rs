//! Tributary's fuzz targets: every decoder that reads bytes from a peer, a client or a disk,
//! written once as a plain function over bytes.
//!
//! Each target in [`TARGETS`] asserts invariants, not just the absence of a panic: what a
//! decoder accepts re-encodes to something it decodes to the same value (or to the very same
//! bytes, where the encoding is canonical), a decoder never reads past its input, secrets never
//! appear in errors, and a log recovered from damaged files holds only whole, valid batches.
//! Errors must be errors: a panic anywhere below a target is a bug.
//!
//! The same functions run three ways:
//! - `cargo test -p tributary-fuzz` replays every file of `fuzz/corpus/<target>/` and the
//!   [`seeds`], then mutates them for a few seconds with a seeded generator (the seed is
//!   printed, and `TRIBUTARY_FUZZ_SEED` replays it);
//! - `scripts/fuzz TARGET SECONDS` runs one under libFuzzer, coverage-guided, through the
//!   harness in `fuzz/` (outside the workspace), which calls [`target`] and nothing else;
//! - `cargo run -p tributary-fuzz --example write_seeds` refreshes the seed files of the corpus.
//!
//! Inputs longer than [`INPUT_BYTES_MAX`] are ignored, so no target allocates without bound.

pub mod amqp;
mod arb;
pub mod edit;
pub mod eventhubs;
pub mod http;
pub mod kafka;
pub mod log;
pub mod seeds;

/// The longest input a target looks at. Real frames, messages and batches the decoders see are
/// bounded far below this by the limits in front of them; longer inputs only slow a fuzzer.
pub const INPUT_BYTES_MAX: usize = 256 * 1024;

/// A named fuzz target.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// The name `scripts/fuzz` and the corpus directory use.
    pub name: &'static str,
    /// The function; panics on a broken invariant.
    pub function: fn(&[u8]),
}

impl Target {
    /// Runs the target on `data`, unless it is longer than [`INPUT_BYTES_MAX`].
    pub fn run(&self, data: &[u8]) {
        if data.len() <= INPUT_BYTES_MAX {
            (self.function)(data);
        }
    }
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "amqp_frame",
        function: amqp::frame,
    },
    Target {
        name: "amqp_performative",
        function: amqp::performative,
    },
    Target {
        name: "amqp_value",
        function: amqp::value,
    },
    Target {
        name: "amqp_connection",
        function: amqp::connection,
    },
    Target {
        name: "eventhubs_ingest",
        function: eventhubs::ingest,
    },
    Target {
        name: "eventhubs_receive",
        function: eventhubs::receive,
    },
    Target {
        name: "eventhubs_send",
        function: eventhubs::send,
    },
    Target {
        name: "connection_string",
        function: eventhubs::connection_string,
    },
    Target {
        name: "sas_token",
        function: eventhubs::sas_token,
    },
    Target {
        name: "edit_json",
        function: edit::json,
    },
    Target {
        name: "http_cursor",
        function: http::cursor,
    },
    Target {
        name: "http_json",
        function: http::json,
    },
    Target {
        name: "http_signature",
        function: http::signature,
    },
    Target {
        name: "kafka_request",
        function: kafka::request,
    },
    Target {
        name: "kafka_authenticated",
        function: kafka::authenticated,
    },
    Target {
        name: "kafka_consumer_protocol",
        function: kafka::consumer_protocol,
    },
    Target {
        name: "log_batch",
        function: log::batch,
    },
    Target {
        name: "log_recovery",
        function: log::recovery,
    },
];

/// The target called `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}
