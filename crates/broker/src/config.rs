//! How a broker is configured.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tributary_log::LogConfig;
use tributary_log::storage::{OsStorage, Storage};

use crate::throttle::ThroughputLimits;

/// Retention of an event hub when its creator does not say: one day, as Event Hubs.
pub const RETENTION_AGE_MS_DEFAULT: i64 = 24 * 60 * 60 * 1000;

/// The most consumer groups an event hub may have by default, `$Default` included (Event Hubs
/// standard tier).
pub const CONSUMER_GROUPS_MAX_DEFAULT: u32 = 20;

/// The most partitions an event hub may have.
pub const PARTITIONS_MAX: u32 = 1024;

/// How often retention is enforced by default.
pub const RETENTION_CHECK_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);

/// How often compacted hubs' partitions are looked at by default (Kafka's log cleaner backs
/// off 15 s between looks): a run happens only where sealed segments hold events compaction
/// has not seen, or tombstones may have expired.
pub const COMPACTION_CHECK_INTERVAL_DEFAULT: Duration = Duration::from_secs(15);

/// How old a compacted hub's active segment gets (holding events) before it is sealed, so that
/// compaction reaches the events of a partition written slowly: an hour (Kafka's `segment.ms`
/// is a week; a compacted hub here is meant to look compacted sooner).
pub const COMPACTION_SEGMENT_AGE_MAX_DEFAULT: Duration = Duration::from_secs(60 * 60);

/// The configuration of a broker.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Where everything is kept. Locked while the broker runs.
    pub data_dir: PathBuf,
    /// Durability, segment size and event size limit of every partition.
    pub log: LogConfig,
    /// The most consumer groups an event hub may have, `$Default` included.
    pub consumer_groups_max: u32,
    /// How often the background task enforces retention.
    pub retention_check_interval: Duration,
    /// How often the background task looks for partitions of compacted hubs to compact.
    pub compaction_check_interval: Duration,
    /// A compacted hub's active segment is sealed once it is this old and holds events.
    pub compaction_segment_age_max: Duration,
    /// Where the partition logs' files live: the file system, or in tests a fault-injecting
    /// storage (`tributary_log::faults`).
    pub storage: Arc<dyn Storage>,
    /// Ingress and egress limits of the namespace and of single hubs, which every front door
    /// applies ([`crate::throttle`]); the default limits nothing.
    pub throughput: ThroughputLimits,
    /// Whether retention keeps events captured hubs' captures have not written yet.
    pub capture_retention: crate::CaptureRetention,
    /// What one sync of `fsync` appends covers: each partition's file, or the data
    /// directory's file system shared by the partitions waiting at once.
    pub sync_scope: tributary_log::SyncScope,
}

impl BrokerConfig {
    /// The defaults, keeping data in `data_dir`.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        BrokerConfig {
            data_dir: data_dir.into(),
            log: LogConfig::default(),
            consumer_groups_max: CONSUMER_GROUPS_MAX_DEFAULT,
            retention_check_interval: RETENTION_CHECK_INTERVAL_DEFAULT,
            compaction_check_interval: COMPACTION_CHECK_INTERVAL_DEFAULT,
            compaction_segment_age_max: COMPACTION_SEGMENT_AGE_MAX_DEFAULT,
            storage: Arc::new(OsStorage),
            throughput: ThroughputLimits::default(),
            capture_retention: crate::CaptureRetention::Hold,
            sync_scope: tributary_log::SyncScope::File,
        }
    }
}
