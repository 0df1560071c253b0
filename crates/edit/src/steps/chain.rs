//! `chain`: each event carries a hash link to the previous event of its source partition, so a
//! consumer can tell when an event is missing ([`ChainVerifier`]).
//!
//! ```toml
//! [[step]]
//! kind = "chain"
//! properties = ["kind"]          # application properties to cover (default none)
//! key_file = "keys/chain.key"    # optional: HMAC-SHA256 links (or key_env; key_id optional)
//! state_dir = "state/chain"      # default: <task dir>/<step name>.chain
//! ```
//!
//! # Links
//!
//! `link(n) = H(link(n-1) || str(partition) || sequence || SHA-256(body) || properties)`, where
//! `H` is SHA-256, or HMAC-SHA256 with the key when one is given; `sequence` is the source
//! sequence number as 8 bytes big-endian (signed); `str(x)` and `properties` (an 8-byte count,
//! then `str(name) value(name)` for each configured property, absent ones included) are the
//! encoding of [`crate::steps::sign`]. The first link of a partition follows the genesis
//! `SHA-256("tributary-chain" || partition)`. The step writes `tributary-chain-partition` (the
//! source partition), `tributary-chain-sequence` (int64), `tributary-chain-prev` and
//! `tributary-chain-link` (base64), and `tributary-chain-key-id` when keyed.
//!
//! # State and replays
//!
//! Links are deterministic, and the step remembers, per partition, a few `(sequence → previous
//! link, link)` entries in `state_dir` (one small JSON file per partition, written atomically —
//! temp file, then rename — at the end of each `apply` that linked an event). The entries
//! kept: the [`WINDOW`] greatest sequence numbers, the first event of each of the last
//! [`ANCHORS_MAX`] batches (a replay starts from the last checkpoint, which is a batch start,
//! and a batch can be far longer than the window), and the last event linked (the tail). The
//! first event of a batch is linked to
//!
//! 1. the previous link remembered for its own sequence number (a replay: same links again);
//! 2. the genesis, when nothing is remembered (a new chain);
//! 3. the tail, when the event comes after it (the next batch);
//! 4. nothing otherwise: its predecessor is unknown, and guessing would forge a link. Such
//!    events are refused with a reason (dead-letter), as are all of a batch's events when the
//!    state file is unreadable or corrupt — a silent new genesis would hide a gap. Deleting the
//!    file starts a new chain on purpose (consumers see one gap).
//!
//! Events of one source sequence number (several made of one by an earlier step) are told
//! apart by their order. A state file that cannot be written refuses the batch (its links
//! could not be reproduced after a crash) and keeps the state from before it.
//!
//! The file survives a process crash, as checkpoints do (the checkpoint store runs SQLite with
//! `synchronous = NORMAL`); it is not fsynced, which would cost a disk flush per batch. After a
//! power loss an older state can only make a consumer see a gap that is not there, never hide
//! one: the links it makes differ from the lost ones.
//!
//! For failover between processes, put `state_dir` on storage every process of the task sees;
//! otherwise the new owner starts a new chain.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use ring::hmac;
use serde::{Deserialize, Serialize};
use tributary_event::format::check_format_version;
use tributary_event::{EventData, PropertyValue, SmolStr};

use crate::item::Item;
use crate::spec::{CompileContext, SpecError};
use crate::step::{Context, Output, Step};
use crate::steps::keys::{self, HmacKey, KeySource};
use crate::steps::sign::{put_bytes, put_len, put_value, sha256, text};

/// The source partition of the chain.
pub const CHAIN_PARTITION: &str = "tributary-chain-partition";
/// The source sequence number (int64).
pub const CHAIN_SEQUENCE: &str = "tributary-chain-sequence";
/// The previous event's link (base64).
pub const CHAIN_PREV: &str = "tributary-chain-prev";
/// This event's link (base64).
pub const CHAIN_LINK: &str = "tributary-chain-link";
/// The id of the HMAC key, when links are keyed.
pub const CHAIN_KEY_ID: &str = "tributary-chain-key-id";

/// Entries of the greatest sequence numbers kept per partition: a replay that starts inside a
/// batch (a checkpoint between batches is the usual case, handled by anchors) reaches this far
/// back; 64 entries keep the state file a few kilobytes.
pub const WINDOW: usize = 64;

/// Batch starts kept per partition: a replay starts from the last checkpoint, at most a few
/// batches back (one in flight, a few whose checkpoints failed); 16 leaves room.
pub const ANCHORS_MAX: usize = 16;

/// Links a [`ChainVerifier`] remembers per partition to tell a replayed duplicate from a gap:
/// four default source batches (1000 events each) of replay.
pub const DUPLICATES_REMEMBERED: usize = 4096;

/// The state file format's version (see [`tributary_event::format`]).
const STATE_VERSION: u32 = 1;

/// A SHA-256 or HMAC-SHA256 output.
type Link = [u8; 32];

/// A position: source sequence number and order among events sharing it.
type Key = (i64, u32);

/// The link before the first event of `partition`'s chain.
pub fn genesis(partition: &str) -> [u8; 32] {
    let mut seed = b"tributary-chain".to_vec();
    seed.extend_from_slice(partition.as_bytes());
    sha256(&seed)
}

/// How links are made: the key (none: plain SHA-256) and the properties covered.
#[derive(Debug)]
struct Linker {
    key: Option<HmacKey>,
    properties: Vec<String>,
}

/// What one link covers.
struct Linking<'a> {
    prev: &'a Link,
    partition: &'a str,
    sequence: i64,
    body: &'a [u8],
    properties: &'a [(SmolStr, PropertyValue)],
}

impl Linker {
    /// Computes a link (see the module doc); `buf` is scratch space.
    fn link(&self, buf: &mut Vec<u8>, of: &Linking<'_>) -> Link {
        buf.clear();
        buf.extend_from_slice(of.prev);
        put_bytes(buf, of.partition.as_bytes());
        buf.extend_from_slice(&of.sequence.to_be_bytes());
        buf.extend_from_slice(&sha256(of.body));
        put_len(buf, self.properties.len());
        for name in &self.properties {
            put_bytes(buf, name.as_bytes());
            let value = of
                .properties
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v);
            put_value(buf, value);
        }
        match &self.key {
            None => sha256(buf),
            Some(key) => {
                let mut link = [0u8; 32];
                link.copy_from_slice(hmac::sign(key.key(), buf).as_ref());
                link
            }
        }
    }
}

/// What the step remembers of one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    prev: Link,
    link: Link,
}

/// What the step remembers of one partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PartitionState {
    entries: BTreeMap<Key, Entry>,
    anchors: VecDeque<Key>,
    tail: Option<Key>,
}

impl PartitionState {
    /// The previous link of the first event of a batch, at `key` (rules 1 to 4 of the module
    /// doc).
    fn prev_for(&self, key: Key, partition: &str, file: &Path) -> Result<Link, String> {
        if let Some(entry) = self.entries.get(&key) {
            return Ok(entry.prev);
        }
        let Some(tail) = self.tail else {
            return Ok(genesis(partition));
        };
        match self.entries.get(&tail) {
            Some(entry) if key > tail => Ok(entry.link),
            _ => Err(format!(
                "sequence {} comes before the last event chained ({}) and its link is not \
                 remembered, so it cannot be relinked the same way; if the source was reset, \
                 delete {} to start a new chain",
                key.0,
                tail.0,
                file.display()
            )),
        }
    }

    /// Keeps the window, the anchors and the tail.
    fn trim(&mut self) {
        while self.anchors.len() > ANCHORS_MAX {
            self.anchors.pop_front();
        }
        let Some(&from) = self.entries.keys().rev().nth(WINDOW - 1) else {
            return;
        };
        let (anchors, tail) = (&self.anchors, self.tail);
        self.entries
            .retain(|key, _| *key >= from || anchors.contains(key) || Some(*key) == tail);
    }
}

/// The state file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateFile {
    version: u32,
    partition: String,
    tail: Option<Key>,
    anchors: Vec<Key>,
    entries: Vec<EntryFile>,
}

/// One entry in the state file.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryFile {
    sequence: i64,
    index: u32,
    prev: String,
    link: String,
}

fn decode_link(text: &str) -> Option<Link> {
    keys::base64_decode(text)?.try_into().ok()
}

impl StateFile {
    fn of(partition: &str, state: &PartitionState) -> StateFile {
        StateFile {
            version: STATE_VERSION,
            partition: partition.to_owned(),
            tail: state.tail,
            anchors: state.anchors.iter().copied().collect(),
            entries: state
                .entries
                .iter()
                .map(|(&(sequence, index), entry)| EntryFile {
                    sequence,
                    index,
                    prev: keys::base64_encode(&entry.prev),
                    link: keys::base64_encode(&entry.link),
                })
                .collect(),
        }
    }

    fn into_state(self, partition: &str) -> Result<PartitionState, String> {
        if self.version != STATE_VERSION || self.partition != partition {
            return Err(format!(
                "it is version {} for partition {:?}; expected version {STATE_VERSION} for {:?}",
                self.version, self.partition, partition
            ));
        }
        let mut entries = BTreeMap::new();
        for e in self.entries {
            let (Some(prev), Some(link)) = (decode_link(&e.prev), decode_link(&e.link)) else {
                return Err(format!(
                    "the entry of sequence {} is not two links",
                    e.sequence
                ));
            };
            entries.insert((e.sequence, e.index), Entry { prev, link });
        }
        if let Some(tail) = self.tail
            && !entries.contains_key(&tail)
        {
            return Err("its tail has no entry".to_owned());
        }
        Ok(PartitionState {
            entries,
            anchors: self.anchors.into(),
            tail: self.tail,
        })
    }
}

/// The `chain` step's keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainSpec {
    /// A file holding an HMAC key (links are plain SHA-256 without one).
    pub key_file: Option<PathBuf>,
    /// An environment variable holding an HMAC key.
    pub key_env: Option<String>,
    /// The key's id (default: derived from the key).
    pub key_id: Option<String>,
    /// Application properties the links cover.
    #[serde(default)]
    pub properties: Vec<String>,
    /// Where the per-partition state goes (default `<task dir>/<step name>.chain`).
    pub state_dir: Option<PathBuf>,
}

/// Links events.
#[derive(Debug)]
struct Chain {
    name: String,
    linker: Linker,
    state_dir: PathBuf,
    partitions: Mutex<HashMap<String, PartitionState>>,
}

pub(crate) fn compile(
    name: String,
    spec: ChainSpec,
    context: &CompileContext,
) -> Result<Arc<dyn Step>, SpecError> {
    let source = KeySource {
        key_file: spec.key_file,
        key_env: spec.key_env,
        key_id: spec.key_id,
    };
    let key = if source.is_empty() {
        None
    } else {
        Some(keys::load_hmac_key(&source, "", context)?)
    };
    let properties = checked_properties(spec.properties)?;
    let state_dir = match spec.state_dir {
        Some(dir) => context.path(&dir),
        None => context.base_dir.join(format!("{name}.chain")),
    };
    fs::create_dir_all(&state_dir).map_err(|e| {
        SpecError::at(
            "state_dir",
            format!("cannot create {}: {e}", state_dir.display()),
        )
    })?;
    Ok(Arc::new(Chain {
        name,
        linker: Linker { key, properties },
        state_dir,
        partitions: Mutex::new(HashMap::new()),
    }))
}

fn checked_properties(properties: Vec<String>) -> Result<Vec<String>, SpecError> {
    for (i, name) in properties.iter().enumerate() {
        if name.is_empty() || name.starts_with("tributary-chain-") {
            return Err(SpecError::at(
                "properties",
                format!(
                    "{name:?} cannot be chained: name a non-empty application property \
                         other than the chain's own"
                ),
            ));
        }
        if properties[..i].contains(name) {
            return Err(SpecError::at(
                "properties",
                format!("{name:?} is listed twice"),
            ));
        }
    }
    Ok(properties)
}

/// `partition` as a file name: letters, digits and '-' kept, every other byte `_xx` (hex).
fn file_name(partition: &str) -> String {
    let mut name = String::with_capacity(partition.len() + 5);
    for b in partition.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' {
            name.push(char::from(b));
        } else {
            name.push('_');
            name.push_str(&keys::hex(&[b]));
        }
    }
    name.push_str(".json");
    name
}

/// One event's links.
struct Linked {
    sequence: i64,
    prev: Link,
    link: Link,
}

impl Chain {
    fn state_path(&self, partition: &str) -> PathBuf {
        self.state_dir.join(file_name(partition))
    }

    /// The partition's state, taken out of the map (read from its file the first time).
    fn take(&self, partition: &str) -> Result<PartitionState, String> {
        let held = self
            .partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(partition);
        if let Some(state) = held {
            return Ok(state);
        }
        let path = self.state_path(partition);
        let bytes = match fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(PartitionState::default()),
            Err(e) => {
                return Err(format!(
                    "cannot read the chain state {}: {e}",
                    path.display()
                ));
            }
        };
        let corrupt = |e: String| format!("the chain state {} is corrupt: {e}", path.display());
        let file =
            serde_json::from_slice::<StateFile>(&bytes).map_err(|e| corrupt(e.to_string()))?;
        let what = format_args!("the chain state {}", path.display());
        check_format_version(what, file.version.into(), STATE_VERSION.into())
            .map_err(|too_new| too_new.to_string())?;
        file.into_state(partition).map_err(corrupt)
    }

    fn put(&self, partition: &str, state: PartitionState) {
        self.partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(partition.to_owned(), state);
    }

    /// Writes the state file atomically: a temp file, then a rename over the old one.
    fn save(&self, partition: &str, state: &PartitionState) -> io::Result<()> {
        let path = self.state_path(partition);
        let bytes = serde_json::to_vec(&StateFile::of(partition, state))?;
        let temp = path.with_extension("json.tmp");
        fs::write(&temp, bytes)?;
        fs::rename(&temp, &path)
    }

    /// Links `items` in order, updating `state`; one outcome per item.
    fn link_all(
        &self,
        partition: &str,
        state: &mut PartitionState,
        items: &mut [Item],
    ) -> Vec<Result<Linked, String>> {
        let file = self.state_path(partition);
        let mut buf = Vec::with_capacity(256);
        let mut outcomes = Vec::with_capacity(items.len());
        let mut current: Option<Link> = None;
        let mut last_key: Option<Key> = None;
        let mut first: Option<Key> = None;
        for item in items.iter_mut() {
            let sequence = item.position().sequence_number;
            let key = match last_key {
                Some((s, i)) if s == sequence => (s, i.saturating_add(1)),
                _ => (sequence, 0),
            };
            last_key = Some(key);
            let prev = match current {
                Some(link) => link,
                None => match state.prev_for(key, partition, &file) {
                    Ok(link) => link,
                    Err(reason) => {
                        outcomes.push(Err(reason));
                        continue;
                    }
                },
            };
            let body = item.body().clone();
            let link = self.linker.link(
                &mut buf,
                &Linking {
                    prev: &prev,
                    partition,
                    sequence,
                    body: &body,
                    properties: item.properties(),
                },
            );
            if let Some(old) = state.entries.get(&key)
                && old.link != link
            {
                tracing::warn!(step = %self.name, partition, sequence,
                    "a replayed event links differently than before: an earlier step is not \
                     deterministic, or the event changed");
            }
            state.entries.insert(key, Entry { prev, link });
            state.tail = Some(key);
            first.get_or_insert(key);
            current = Some(link);
            outcomes.push(Ok(Linked {
                sequence,
                prev,
                link,
            }));
        }
        if let Some(first) = first
            && state.anchors.back() != Some(&first)
        {
            state.anchors.push_back(first);
        }
        state.trim();
        outcomes
    }

    fn write_links(&self, partition: &str, item: &mut Item, linked: &Linked) {
        item.set_property(CHAIN_PARTITION, text(partition));
        item.set_property(CHAIN_SEQUENCE, PropertyValue::Int64(linked.sequence));
        item.set_property(CHAIN_PREV, text(&keys::base64_encode(&linked.prev)));
        item.set_property(CHAIN_LINK, text(&keys::base64_encode(&linked.link)));
        if let Some(key) = &self.linker.key {
            item.set_property(CHAIN_KEY_ID, text(key.id()));
        }
    }
}

impl Step for Chain {
    fn name(&self) -> &str {
        &self.name
    }

    fn apply(&self, context: &Context<'_>, mut items: Vec<Item>, out: &mut Output) {
        let partition = context.partition;
        let before = match self.take(partition) {
            Ok(state) => state,
            Err(reason) => {
                tracing::warn!(step = %self.name, partition, %reason, "chain state unusable");
                let reason = format!(
                    "{reason}; refusing to link rather than start a new chain that would hide a \
                     gap (restore the file, or delete it to start a new chain)"
                );
                for item in items {
                    out.reject(item, reason.clone());
                }
                return;
            }
        };
        let mut state = before.clone();
        let outcomes = self.link_all(partition, &mut state, &mut items);
        if state != before
            && let Err(e) = self.save(partition, &state)
        {
            let path = self.state_path(partition);
            tracing::warn!(step = %self.name, partition, error = %e, "chain state not saved");
            self.put(partition, before);
            for item in items {
                out.reject(
                    item,
                    format!(
                        "the chain state {} could not be saved ({e}), so these links could \
                         not be reproduced after a crash",
                        path.display()
                    ),
                );
            }
            return;
        }
        self.put(partition, state);
        for (mut item, outcome) in items.into_iter().zip(outcomes) {
            match outcome {
                Ok(linked) => {
                    self.write_links(partition, &mut item, &linked);
                    out.pass(item);
                }
                Err(reason) => out.reject(item, reason),
            }
        }
    }

    fn close_partition(&self, partition: &str) {
        self.partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(partition);
    }
}

/// What [`ChainVerifier::check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainCheck {
    /// The event follows the last one seen of its partition (or starts the chain).
    Linked,
    /// The first event seen of its partition, not the chain's first: what came before it is
    /// unknown to this verifier.
    Joined,
    /// Events are missing between the last one seen and this one.
    Gap {
        /// The source partition.
        partition: String,
        /// The source sequence number of the last event seen.
        after_sequence: i64,
        /// This event's source sequence number.
        sequence: i64,
    },
    /// The event was seen before (a replay after a crash delivers some events twice).
    Duplicate {
        /// The source partition.
        partition: String,
        /// Its source sequence number.
        sequence: i64,
    },
}

/// Why an event cannot be checked: its chain properties are missing or malformed, or its link
/// does not match its content (changed on the way, or another key).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ChainError(pub String);

/// What a verifier remembers of one partition.
#[derive(Debug, Default)]
struct Seen {
    last: Option<(Link, i64)>,
    recent: HashSet<Link>,
    order: VecDeque<Link>,
}

/// Follows the chains of a stream of events (for a consumer): feed one source partition's
/// events in order to [`ChainVerifier::check`]; a missing event shows as a
/// [`ChainCheck::Gap`], a replayed one as a [`ChainCheck::Duplicate`].
#[derive(Debug)]
pub struct ChainVerifier {
    linker: Linker,
    partitions: HashMap<String, Seen>,
    buf: Vec<u8>,
}

impl ChainVerifier {
    /// A verifier for links made with `key` (none: plain SHA-256) over `properties` — the
    /// chain step's `key_file` and `properties`.
    pub fn new(key: Option<HmacKey>, properties: Vec<String>) -> ChainVerifier {
        ChainVerifier {
            linker: Linker { key, properties },
            partitions: HashMap::new(),
            buf: Vec::new(),
        }
    }

    /// Checks `event`'s link and how it follows the last event seen of its partition.
    pub fn check(&mut self, event: &EventData) -> Result<ChainCheck, ChainError> {
        let (partition, sequence, prev, link) = chain_properties(event)?;
        let expected = self.linker.link(
            &mut self.buf,
            &Linking {
                prev: &prev,
                partition,
                sequence,
                body: &event.body,
                properties: &event.properties,
            },
        );
        if expected != link {
            return Err(ChainError(format!(
                "the link of sequence {sequence} does not match the event: its body, a chained \
                 property or its links were changed, or another key or property list made it"
            )));
        }
        let seen = self.partitions.entry(partition.to_owned()).or_default();
        if seen.recent.contains(&link) {
            return Ok(ChainCheck::Duplicate {
                partition: partition.to_owned(),
                sequence,
            });
        }
        let check = match seen.last {
            None if prev == genesis(partition) => ChainCheck::Linked,
            None => ChainCheck::Joined,
            Some((last, _)) if last == prev => ChainCheck::Linked,
            Some((_, after_sequence)) => ChainCheck::Gap {
                partition: partition.to_owned(),
                after_sequence,
                sequence,
            },
        };
        seen.last = Some((link, sequence));
        seen.recent.insert(link);
        seen.order.push_back(link);
        if seen.order.len() > DUPLICATES_REMEMBERED
            && let Some(old) = seen.order.pop_front()
        {
            seen.recent.remove(&old);
        }
        Ok(check)
    }
}

/// The chain properties of `event`: partition, sequence, previous link, link.
fn chain_properties(event: &EventData) -> Result<(&str, i64, Link, Link), ChainError> {
    let get = |name: &str| {
        event
            .property(name)
            .ok_or_else(|| ChainError(format!("no {name} property: the event is not chained")))
    };
    let string = |name: &str| match get(name)? {
        PropertyValue::String(s) => Ok(s.as_str()),
        other => Err(ChainError(format!("{name} is a {}", other.type_name()))),
    };
    let link = |name: &str| {
        decode_link(string(name)?)
            .ok_or_else(|| ChainError(format!("{name} is not a base64 32-byte link")))
    };
    let partition = string(CHAIN_PARTITION)?;
    let PropertyValue::Int64(sequence) = get(CHAIN_SEQUENCE)? else {
        return Err(ChainError(format!("{CHAIN_SEQUENCE} is not an int64")));
    };
    Ok((partition, *sequence, link(CHAIN_PREV)?, link(CHAIN_LINK)?))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::spec::compile as compile_step;
    use crate::step::{Edited, Editor};
    use crate::steps::keys::testing::*;

    fn context(partition: &str) -> Context<'_> {
        Context {
            partition,
            now_ms: 0,
        }
    }

    fn step(dir: &Path, table: serde_json::Value) -> Arc<dyn Step> {
        let ctx = super::super::keys::testing::context(dir, &[]);
        compile_step("chain", None, table, &ctx).expect("chain compiles")
    }

    fn batch(sequences: std::ops::Range<i64>) -> Vec<Item> {
        sequences
            .map(|n| {
                let mut item = item(&format!(r#"{{"n":{n}}}"#), n);
                item.set_property("kind", text("reading"));
                item
            })
            .collect()
    }

    fn run(step: &Arc<dyn Step>, partition: &str, items: Vec<Item>) -> Edited {
        Editor::new(vec![step.clone()]).apply(&context(partition), items)
    }

    fn events(edited: Edited) -> Vec<EventData> {
        assert!(edited.rejected.is_empty(), "{:?}", edited.rejected);
        edited.passed.into_iter().map(Item::into_event).collect()
    }

    fn links(events: &[EventData]) -> Vec<PropertyValue> {
        events
            .iter()
            .map(|e| e.property(CHAIN_LINK).expect("link").clone())
            .collect()
    }

    fn checks(verifier: &mut ChainVerifier, events: &[EventData]) -> Vec<ChainCheck> {
        events
            .iter()
            .map(|e| verifier.check(e).expect("checks"))
            .collect()
    }

    #[test]
    fn a_missing_event_is_a_gap_and_a_replayed_one_a_duplicate() {
        let dir = tempfile::tempdir().expect("dir");
        let chain = step(dir.path(), json!({"properties": ["kind"]}));
        let mut sent = events(run(&chain, "0", batch(0..5)));
        sent.extend(events(run(&chain, "0", batch(5..8))));
        let mut verifier = ChainVerifier::new(None, vec!["kind".to_owned()]);
        let first: Vec<ChainCheck> = checks(&mut verifier, &sent[..3]);
        assert_eq!(first, vec![ChainCheck::Linked; 3]);
        // Event 3 is lost; 2 is delivered again.
        assert_eq!(
            checks(
                &mut verifier,
                &[sent[2].clone(), sent[4].clone(), sent[5].clone()]
            ),
            vec![
                ChainCheck::Duplicate {
                    partition: "0".to_owned(),
                    sequence: 2
                },
                ChainCheck::Gap {
                    partition: "0".to_owned(),
                    after_sequence: 2,
                    sequence: 4
                },
                ChainCheck::Linked,
            ]
        );
        let mut late = ChainVerifier::new(None, vec!["kind".to_owned()]);
        assert_eq!(late.check(&sent[6]), Ok(ChainCheck::Joined));
    }

    #[test]
    fn a_changed_event_or_the_wrong_key_fails_the_link() {
        let dir = tempfile::tempdir().expect("dir");
        write_secret(
            dir.path(),
            "chain.key",
            keys::base64_encode(&random(32)).as_bytes(),
        );
        let chain = step(
            dir.path(),
            json!({"key_file": "chain.key", "properties": ["kind"]}),
        );
        let sent = events(run(&chain, "0", batch(0..2)));
        let key = keys::load_hmac_key(
            &KeySource {
                key_file: Some("chain.key".into()),
                ..KeySource::default()
            },
            "",
            &super::super::keys::testing::context(dir.path(), &[]),
        )
        .expect("key");
        let mut keyed = ChainVerifier::new(Some(key), vec!["kind".to_owned()]);
        assert_eq!(checks(&mut keyed, &sent), vec![ChainCheck::Linked; 2]);
        let mut unkeyed = ChainVerifier::new(None, vec!["kind".to_owned()]);
        assert!(unkeyed.check(&sent[0]).is_err());
        let mut changed = sent[1].clone();
        changed.properties.retain(|(k, _)| k != "kind");
        let e = keyed.check(&changed).expect_err("property removed");
        assert!(e.0.contains("does not match"), "{e}");
        let mut flipped = sent[1].clone();
        flipped.body = Bytes::from_static(br#"{"n":9}"#);
        assert!(keyed.check(&flipped).is_err());
    }

    #[test]
    fn state_survives_a_restart_and_a_replay_reproduces_identical_links() {
        let dir = tempfile::tempdir().expect("dir");
        let table = json!({"state_dir": "state"});
        let first = step(dir.path(), table.clone());
        let a = events(run(&first, "1", batch(0..10)));
        // A batch far longer than the window, then a crash before its checkpoint.
        let b = events(run(&first, "1", batch(10..300)));
        drop(first);
        let restarted = step(dir.path(), table.clone());
        let replayed = events(run(&restarted, "1", batch(10..300)));
        assert_eq!(links(&replayed), links(&b));
        // The replay may come in other batches; the next batch goes on from the tail.
        let again = step(dir.path(), table);
        let part = events(run(&again, "1", batch(10..150)));
        let rest = events(run(&again, "1", batch(150..300)));
        assert_eq!(links(&part), links(&b[..140]));
        assert_eq!(links(&rest), links(&b[140..]));
        let c = events(run(&again, "1", batch(300..305)));
        let mut verifier = ChainVerifier::new(None, Vec::new());
        let all: Vec<EventData> = [a, b, c].concat();
        assert!(
            checks(&mut verifier, &all)
                .iter()
                .all(|c| *c == ChainCheck::Linked)
        );
        assert!(dir.path().join("state").join("1.json").is_file());
    }

    #[test]
    fn an_event_that_cannot_be_relinked_the_same_way_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let chain = step(dir.path(), json!({}));
        events(run(&chain, "0", batch(0..200)));
        let restarted = step(dir.path(), json!({}));
        let edited = run(&restarted, "0", batch(100..102));
        assert!(edited.passed.is_empty());
        assert!(
            edited.rejected[0].reason.contains("cannot be relinked"),
            "{}",
            edited.rejected[0].reason
        );
        // The remembered window still links.
        assert_eq!(run(&restarted, "0", batch(150..152)).passed.len(), 2);
    }

    #[test]
    fn a_corrupt_state_file_refuses_the_batch_without_panicking() {
        let dir = tempfile::tempdir().expect("dir");
        let chain = step(dir.path(), json!({}));
        events(run(&chain, "p/1", batch(0..3)));
        let file = dir.path().join("chain.chain").join("p_2f1.json");
        assert!(file.is_file());
        fs::write(&file, b"{\"version\":1,").expect("corrupt");
        let restarted = step(dir.path(), json!({}));
        let edited = run(&restarted, "p/1", batch(3..5));
        assert_eq!(edited.rejected.len(), 2);
        assert!(
            edited.rejected[0].reason.contains("is corrupt"),
            "{}",
            edited.rejected[0].reason
        );
        // A state file from a newer format is refused as such, not as corrupt.
        let whole = json!({"version": 2, "partition": "p/1", "tail": null, "anchors": [],
            "entries": []});
        fs::write(&file, whole.to_string()).expect("from the future");
        let edited = run(&step(dir.path(), json!({})), "p/1", batch(3..5));
        assert_eq!(edited.rejected.len(), 2);
        assert!(
            edited.rejected[0]
                .reason
                .contains("was written by format 2; this binary reads up to format 1"),
            "{}",
            edited.rejected[0].reason
        );
        fs::remove_file(&file).expect("delete");
        assert_eq!(run(&restarted, "p/1", batch(3..5)).passed.len(), 2);
    }

    #[test]
    fn events_made_of_one_source_event_get_distinct_links() {
        let dir = tempfile::tempdir().expect("dir");
        let chain = step(dir.path(), json!({}));
        let twins = vec![item(r#"{"a":1}"#, 7), item(r#"{"a":2}"#, 7)];
        let sent = events(run(&chain, "0", twins));
        let mut verifier = ChainVerifier::new(None, Vec::new());
        assert_eq!(checks(&mut verifier, &sent), vec![ChainCheck::Linked; 2]);
        let replay = vec![item(r#"{"a":1}"#, 7), item(r#"{"a":2}"#, 7)];
        assert_eq!(links(&events(run(&chain, "0", replay))), links(&sent));
    }

    #[test]
    fn chained_properties_are_checked_when_compiled() {
        let dir = tempfile::tempdir().expect("dir");
        let ctx = super::super::keys::testing::context(dir.path(), &[]);
        let e = compile_step("chain", None, json!({"properties": [CHAIN_LINK]}), &ctx)
            .expect_err("own property");
        assert_eq!(e.key.as_deref(), Some("properties"));
        let e = compile_step("chain", None, json!({"key_id": "k"}), &ctx).expect_err("no key");
        assert!(e.message.contains("exactly one of key_file"), "{e}");
    }

    proptest! {
        #[test]
        fn the_verifier_never_panics_on_arbitrary_properties(
            body in proptest::collection::vec(any::<u8>(), 0..64),
            partition in prop_oneof![Just(PropertyValue::Int64(1)), ".{0,8}".prop_map(|s| PropertyValue::String(s.into()))],
            sequence in prop_oneof![any::<i64>().prop_map(PropertyValue::Int64), Just(PropertyValue::Null)],
            prev in prop_oneof![".{0,50}", Just(keys::base64_encode(&[1u8; 32]))],
            link in prop_oneof![".{0,50}", Just(keys::base64_encode(&[2u8; 32]))],
        ) {
            let event = EventData::new(Bytes::from(body))
                .with_property(CHAIN_PARTITION, partition)
                .with_property(CHAIN_SEQUENCE, sequence)
                .with_property(CHAIN_PREV, PropertyValue::String(prev.into()))
                .with_property(CHAIN_LINK, PropertyValue::String(link.into()));
            let mut verifier = ChainVerifier::new(None, vec!["kind".to_owned()]);
            prop_assert!(verifier.check(&event).is_err());
        }
    }
}
