//! The official processors — `EventHubConsumerClient` with the blob checkpoint store, Python
//! (`tests/python/processor.py`) or JavaScript (`tests/js/processor.js`) — each in its own
//! process, and what it reports: the namespace its blobs are keyed by, the partitions it owns,
//! the events it processes, its checkpoints and its errors. For the mixed-fleet tests (this
//! crate's and the CLI's), which balance one consumer group between them and Tributary.
//!
//! A missing SDK fails the test that spawns it (see [`crate::sdk`]), it never skips it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::sdk::{JsonLines, node_modules, python};

/// How long one awaited step of an official processor may take.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(90);

/// Sequence numbers processed per partition, in the order processed.
pub type Events = BTreeMap<String, Vec<i64>>;

/// Which official processor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sdk {
    /// `azure-eventhub` with `azure-eventhub-checkpointstoreblob-aio`.
    Python,
    /// `@azure/event-hubs` with `@azure/eventhubs-checkpointstore-blob`.
    JavaScript,
}

/// What an official processor reported so far.
#[derive(Default, Debug)]
pub struct OfficialSeen {
    /// The namespace its blobs are keyed by, once it reported ready.
    pub namespace: Option<String>,
    /// The partitions it owns now (initialised and not closed).
    pub owned: BTreeSet<String>,
    /// The events it processed.
    pub events: Events,
    /// The last checkpoint it wrote, per partition (a sequence number).
    pub checkpoints: BTreeMap<String, i64>,
    /// The offset of that checkpoint, per partition, as the SDK reported it.
    pub checkpoint_offsets: BTreeMap<String, String>,
    /// The errors it reported.
    pub errors: Vec<Value>,
    /// Its last report, once it stopped (after [`OfficialProcessor::stop`]); Python's holds
    /// the checkpoints and ownership it read back from the store.
    pub stopped: Option<Value>,
}

/// An official processor's process and its reports.
#[derive(Debug)]
pub struct OfficialProcessor {
    /// Which SDK it is.
    pub sdk: Sdk,
    /// Its output, one JSON document per line.
    pub lines: JsonLines,
    /// What it reported, as far as read.
    pub seen: OfficialSeen,
}

impl OfficialProcessor {
    /// Starts the processor with the script's JSON arguments (`conn`, `hub`, `storage`,
    /// `container`, `checkpoint_every`, `load_balancing_interval`; Python also takes
    /// `custom_endpoint`).
    pub fn spawn(sdk: Sdk, args: &Value) -> OfficialProcessor {
        let scripts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests");
        let mut command = match sdk {
            Sdk::Python => {
                let mut command = tokio::process::Command::new(python());
                command.arg(scripts.join("python/processor.py"));
                command
            }
            Sdk::JavaScript => {
                let mut command = tokio::process::Command::new("node");
                command
                    .env("NODE_PATH", node_modules())
                    .arg(scripts.join("js/processor.js"));
                command
            }
        };
        command.arg(args.to_string());
        OfficialProcessor {
            sdk,
            lines: JsonLines::spawn(&format!("the {sdk:?} processor"), command),
            seen: OfficialSeen::default(),
        }
    }

    /// Records one report.
    pub fn apply(&mut self, doc: &Value) {
        let partition = doc["partition"].as_str().unwrap_or_default().to_owned();
        let seq = || doc["seq"].as_i64().expect("a sequence number");
        let seen = &mut self.seen;
        match doc["kind"].as_str().unwrap_or_default() {
            "ready" => seen.namespace = doc["namespace"].as_str().map(str::to_owned),
            "init" => {
                seen.owned.insert(partition);
            }
            "close" => {
                seen.owned.remove(&partition);
            }
            "event" => seen.events.entry(partition).or_default().push(seq()),
            "checkpoint" => {
                let offset = doc["offset"].as_str().unwrap_or_default().to_owned();
                seen.checkpoint_offsets.insert(partition.clone(), offset);
                seen.checkpoints.insert(partition, seq());
            }
            "error" => seen.errors.push(doc.clone()),
            "stopped" => seen.stopped = Some(doc.clone()),
            _ => {}
        }
    }

    /// Records every report that has arrived, without waiting.
    pub fn pump(&mut self) {
        while let Ok(doc) = self.lines.lines.try_recv() {
            self.apply(&doc);
        }
    }

    /// Reads reports until `done` holds; panics after [`STEP_TIMEOUT`].
    pub async fn until(&mut self, what: &str, done: impl Fn(&OfficialSeen) -> bool) {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        while !done(&self.seen) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}\n{:?}: {:?}\nstderr:\n{}",
                self.sdk,
                self.seen,
                self.lines.stderr()
            );
            if let Ok(Some(doc)) =
                tokio::time::timeout(Duration::from_millis(100), self.lines.lines.recv()).await
            {
                self.apply(&doc);
            }
        }
    }

    /// Waits until the processor is receiving; the namespace its blobs are keyed by.
    pub async fn ready(&mut self) -> String {
        self.until("the official processor to be ready", |seen| {
            seen.namespace.is_some()
        })
        .await;
        self.seen.namespace.clone().expect("ready")
    }

    /// Stops the processor (which gives up its ownerships) and waits for it to exit cleanly.
    pub async fn stop(&mut self) {
        self.lines.write_line("stop").await;
        self.until("the official processor to stop", |seen| {
            seen.stopped.is_some()
        })
        .await;
        self.lines.wait_success(STEP_TIMEOUT).await;
    }

    /// Asserts that every error reported so far is one that balancing causes — a partition
    /// taken over by another owner, whose receiver the hub then detaches or refuses — and
    /// forgets them.
    pub fn drain_balancing_errors(&mut self) {
        for error in self.seen.errors.drain(..) {
            let text = error["error"].as_str().unwrap_or_default();
            assert!(
                text.contains("stolen") || text.contains("epoch") || text.contains("owner"),
                "the {:?} processor reported {error}",
                self.sdk
            );
        }
    }
}
