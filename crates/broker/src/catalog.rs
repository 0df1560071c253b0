//! The catalog: which event hubs exist, with their settings and consumer groups.
//!
//! It is one JSON file, `catalog.json`, replaced atomically (written to a temporary file,
//! synced, renamed over the old one, directory synced), so a crash leaves either the old or the
//! new catalog, never a mix. Partition data lives beside it in `hubs/<hub>/<partition>/`; a hub
//! directory without a catalog entry (a crash mid-create or mid-delete) is removed on open.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tributary_event::format::check_format_version;
use tributary_event::names::name_key;
use tributary_log::limits::TOMBSTONE_RETENTION_MS_DEFAULT;
use tributary_log::{Cleanup, CleanupPolicy};

use crate::BrokerError;

/// The catalog's format (see [`tributary_event::format`]): 1 since the catalog was written; 2
/// since hubs carry a cleanup policy (a format-1 reader would ignore it and delete a compacted
/// hub's events by age); 3 since hubs carry a capture (a format-2 reader would ignore it, and
/// its retention would delete events no capture has written). A format-1 or 2 catalog is read
/// as hubs that delete and capture nothing, and written as 3.
const CATALOG_VERSION: u32 = 3;

/// A consumer group as the catalog records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerGroupDefinition {
    /// The name as created (compared case-insensitively).
    pub name: String,
    /// When it was created, ms since the epoch.
    pub created_at_ms: i64,
}

/// An event hub as the catalog records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HubDefinition {
    /// The name as created (compared case-insensitively).
    pub name: String,
    /// A stable identity unique to this hub: a random UUID made when the hub was created (a
    /// catalog written before hubs had one gets it the first time it is opened). Unlike the
    /// name it tells apart two hubs of one name on different machines, so replication records
    /// it as the hub an event was first produced to.
    #[serde(default)]
    pub id: String,
    /// Partitions `0..partition_count`.
    pub partition_count: u32,
    /// Events older than this are removed; `None` keeps them forever.
    pub retention_age_ms: Option<i64>,
    /// Each partition keeps at most about this many bytes; `None`: no limit.
    pub retention_bytes_max: Option<u64>,
    /// When it was created, ms since the epoch.
    pub created_at_ms: i64,
    /// How it cleans up: delete by age and size, compact by key, or both (a catalog written
    /// before hubs had a policy opens with [`HubCleanup::default`], deleting).
    #[serde(default)]
    pub cleanup: HubCleanup,
    /// Its Event Hubs Capture, if it is captured (a catalog before format 3 has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<HubCapture>,
    /// Its consumer groups, `$Default` first.
    pub consumer_groups: Vec<ConsumerGroupDefinition>,
}

impl HubDefinition {
    /// The consumer group named `name` (any case), if the hub has it.
    pub fn consumer_group(&self, name: &str) -> Option<&ConsumerGroupDefinition> {
        self.consumer_groups
            .iter()
            .find(|g| g.name.eq_ignore_ascii_case(name))
    }
}

/// How an event hub cleans up: Event Hubs' `retentionDescription` without the retention time
/// (which is [`HubDefinition::retention_age_ms`]), Kafka's `cleanup.policy`,
/// `min.compaction.lag.ms` and `delete.retention.ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HubCleanup {
    /// Delete, compact, or both.
    #[serde(with = "policy_text")]
    pub policy: CleanupPolicy,
    /// An event stays readable, even once superseded by a later event of its key, for at least
    /// this long (Event Hubs' `minCompactionLagTimeInMinutes`).
    pub min_compaction_lag_ms: i64,
    /// A tombstone (a key and an empty body) is removed once it is this old (Event Hubs'
    /// `tombstoneRetentionTimeInHours`).
    pub tombstone_retention_ms: i64,
}

impl Default for HubCleanup {
    /// Delete, as every hub did before compaction; the log's defaults for the rest.
    fn default() -> Self {
        HubCleanup {
            policy: CleanupPolicy::Delete,
            min_compaction_lag_ms: 0,
            tombstone_retention_ms: TOMBSTONE_RETENTION_MS_DEFAULT,
        }
    }
}

impl HubCleanup {
    /// The partition logs' cleanup: these settings over the broker's `base` (its key index
    /// budget).
    pub fn on(self, base: Cleanup) -> Cleanup {
        Cleanup {
            policy: self.policy,
            min_compaction_lag_ms: self.min_compaction_lag_ms,
            tombstone_retention_ms: self.tombstone_retention_ms,
            ..base
        }
    }

    /// Checks the settings, with a message naming the one that is off.
    pub fn validate(self) -> Result<(), BrokerError> {
        self.on(Cleanup::default()).validate().map_err(|e| match e {
            tributary_log::LogError::InvalidConfig(detail) => BrokerError::InvalidRetention(detail),
            other => BrokerError::InvalidRetention(other.to_string()),
        })
    }
}

/// A hub's Event Hubs Capture as the catalog records it: the settings as given, checked by
/// `tributary_capture::spec` (which the broker does not depend on) before they reach the
/// broker. `serve` captures every hub that has one; retention keeps what it has not written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HubCapture {
    /// Where the files go: `file:/absolute/dir`.
    pub destination: String,
    /// Azure's encoding name: `Avro` or `AvroDeflate`.
    pub encoding: String,
    /// The time window in seconds (60 to 900).
    pub interval_secs: u32,
    /// The size window in bytes (10 MiB to 500 MiB).
    pub size_bytes_max: u64,
    /// Whether a window without events writes no file.
    pub skip_empty: bool,
    /// Azure's archive name format.
    pub archive_name_format: String,
    /// The hub each file's `Microsoft.EventHub.CaptureFileCreated` notification is appended to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify_hub: Option<String>,
    /// When capture was turned on, ms since the epoch (set by the broker; kept while it stays
    /// on): as on Azure, a capture starts with the events enqueued from then on.
    #[serde(default)]
    pub enabled_at_ms: i64,
}

/// The cleanup policy in the catalog: its Kafka spelling (`delete`, `compact`,
/// `delete,compact`), read in any spelling [`CleanupPolicy`] parses.
mod policy_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use tributary_log::CleanupPolicy;

    pub(super) fn serialize<S: Serializer>(
        policy: &CleanupPolicy,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_str(policy)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<CleanupPolicy, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The `version` field of a JSON file's top-level object, read before the rest: a file written
/// by a newer format may not parse as this build's. `None` when it has none, or is no such
/// object (the full parse then says what is wrong).
pub fn json_format_version(bytes: &[u8]) -> Option<u64> {
    #[derive(Deserialize)]
    struct Versioned {
        version: Option<u64>,
    }
    serde_json::from_slice::<Versioned>(bytes).ok()?.version
}

/// Refuses a JSON file of the broker's whose `version` is newer than `newest` (see
/// [`tributary_event::format`]).
pub(crate) fn check_json_format(
    what: std::fmt::Arguments<'_>,
    bytes: &[u8],
    newest: u32,
) -> Result<(), BrokerError> {
    let found = json_format_version(bytes).unwrap_or(0);
    check_format_version(what, found, newest.into())
        .map_err(|too_new| BrokerError::Storage(too_new.to_string()))
}

/// A new hub identity (see [`HubDefinition::id`]).
pub(crate) fn new_hub_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

#[derive(Serialize, Deserialize)]
struct CatalogFile {
    version: u32,
    hubs: Vec<HubDefinition>,
}

/// The catalog in memory, and where it is kept.
#[derive(Debug)]
pub(crate) struct Catalog {
    path: PathBuf,
    pub hubs: BTreeMap<String, HubDefinition>,
}

impl Catalog {
    /// Loads `catalog.json` from `data_dir` (an empty catalog if there is none yet).
    pub(crate) fn load(data_dir: &Path) -> Result<Catalog, BrokerError> {
        let path = data_dir.join("catalog.json");
        let hubs = match std::fs::read(&path) {
            Ok(bytes) => {
                let what = format_args!("catalog {}", path.display());
                check_json_format(what, &bytes, CATALOG_VERSION)?;
                let file: CatalogFile = serde_json::from_slice(&bytes).map_err(|e| {
                    BrokerError::Storage(format!("{}: damaged catalog: {e}", path.display()))
                })?;
                if file.version == 0 || file.version > CATALOG_VERSION {
                    return Err(BrokerError::Storage(format!(
                        "{}: catalog version {} is not supported by this version of Tributary",
                        path.display(),
                        file.version
                    )));
                }
                file.hubs
                    .into_iter()
                    .map(|h| (name_key(&h.name), h))
                    .collect()
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => {
                return Err(BrokerError::Storage(format!(
                    "read {}: {e}",
                    path.display()
                )));
            }
        };
        let mut catalog = Catalog { path, hubs };
        let mut unidentified = catalog
            .hubs
            .values_mut()
            .filter(|h| h.id.is_empty())
            .peekable();
        if unidentified.peek().is_some() {
            unidentified.for_each(|hub| hub.id = new_hub_id());
            catalog.save()?;
        }
        Ok(catalog)
    }

    /// Writes the catalog durably (see the module docs).
    pub(crate) fn save(&self) -> Result<(), BrokerError> {
        let file = CatalogFile {
            version: CATALOG_VERSION,
            hubs: self.hubs.values().cloned().collect(),
        };
        let bytes = serde_json::to_vec_pretty(&file).expect("the catalog serialises");
        let tmp = self.path.with_extension("json.tmp");
        let storage = |op: &str, e: std::io::Error| {
            BrokerError::Storage(format!("{op} {}: {e}", self.path.display()))
        };
        std::fs::write(&tmp, &bytes).map_err(|e| storage("write", e))?;
        std::fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| storage("sync", e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| storage("replace", e))?;
        let dir = self
            .path
            .parent()
            .expect("the catalog is inside the data directory");
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| storage("sync directory of", e))
    }
}
