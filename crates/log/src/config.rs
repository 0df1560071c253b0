//! How a partition log is configured: durability, segment size, index density, event size
//! limit, retention, and the cleanup policy (delete by age and size, compact by key, or both).

use std::str::FromStr;
use std::time::Duration;

use crate::LogError;
use crate::limits::*;

/// When an append is acknowledged, relative to its bytes reaching stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// Acknowledge only after `fdatasync` has covered the append. Appends to a partition that
    /// wait while its sync is in flight share the next one (group commit; partitions sync
    /// independently). The default: an acknowledged event survives power loss.
    #[default]
    Fsync,
    /// Acknowledge as soon as the bytes are written to the OS; sync every `Duration`. A crash of
    /// the machine (not just the process) can lose up to that much acknowledged data.
    Interval(Duration),
    /// Acknowledge on write; never sync except when a segment is sealed. Survives a process
    /// crash, not a machine crash.
    None,
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Durability::Fsync => write!(f, "fsync"),
            Durability::Interval(d) => write!(f, "interval:{}", d.as_millis()),
            Durability::None => write!(f, "none"),
        }
    }
}

impl FromStr for Durability {
    type Err = String;

    /// Parses `fsync`, `interval:<ms>` or `none`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fsync" => Ok(Durability::Fsync),
            "none" => Ok(Durability::None),
            _ => {
                let ms = s.strip_prefix("interval:").ok_or_else(|| {
                    format!("unknown durability {s:?}: use fsync, interval:<ms> or none")
                })?;
                match ms.parse::<u64>() {
                    Ok(ms) if ms > 0 => Ok(Durability::Interval(Duration::from_millis(ms))),
                    _ => Err(format!(
                        "invalid durability {s:?}: the interval must be a whole number of milliseconds above 0"
                    )),
                }
            }
        }
    }
}

/// What one sync of the group committer covers when it makes `fsync` appends durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncScope {
    /// `fdatasync` of each partition's file: partitions sync independently, and nothing else on
    /// the disk is flushed with them. The default.
    #[default]
    File,
    /// One `syncfs` for the partitions whose appends are waiting at the same moment, when more
    /// of them wait than the committer has sync threads or a `syncfs` is under way (then one
    /// `syncfs` at a time, the partitions that wait meanwhile sharing the next); otherwise
    /// each its own `fdatasync`, as with `File`. Many
    /// partitions then share one sync instead of one each, which is what keeps ingest across
    /// hundreds of partitions from paying a device flush per batch. `syncfs` also flushes
    /// every other dirty file of that file system, other programs' included: use it where the
    /// data directory has a file system of its own. After a `syncfs` fails, the committer
    /// goes back to `File` for good (a file's own `fdatasync` reports its lost writes to that
    /// partition; a second `syncfs` would not).
    FileSystem,
}

impl std::fmt::Display for SyncScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SyncScope::File => "file",
            SyncScope::FileSystem => "filesystem",
        })
    }
}

impl FromStr for SyncScope {
    type Err = String;

    /// Parses `file` or `filesystem`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "file" => Ok(SyncScope::File),
            "filesystem" => Ok(SyncScope::FileSystem),
            _ => Err(format!("unknown sync scope {s:?}: use file or filesystem")),
        }
    }
}

/// How long and how much a partition keeps. Whole segments are removed; the active segment is
/// sealed first if everything in it has expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retention {
    /// Remove events older than this (by enqueued time). `None` keeps them forever.
    pub age_ms_max: Option<i64>,
    /// Remove the oldest segments while the partition is larger than this. `None`: no limit.
    pub bytes_max: Option<u64>,
}

/// What a partition does with old events: Event Hubs' `cleanupPolicy`, Kafka's
/// `cleanup.policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CleanupPolicy {
    /// Remove whole segments by age and size ([`Retention`]); events need no key. The default.
    #[default]
    Delete,
    /// Keep the latest event of each partition key forever ([`crate::PartitionLog::compact`]);
    /// retention by age and size removes nothing. Every event must carry a partition key.
    Compact,
    /// Both: compact by key, and remove whole segments by age and size.
    DeleteOrCompact,
}

impl CleanupPolicy {
    /// Whether the policy compacts (and so refuses events without a partition key).
    pub fn compacts(self) -> bool {
        matches!(
            self,
            CleanupPolicy::Compact | CleanupPolicy::DeleteOrCompact
        )
    }

    /// Whether the policy removes segments by age and size.
    pub fn deletes(self) -> bool {
        matches!(self, CleanupPolicy::Delete | CleanupPolicy::DeleteOrCompact)
    }
}

impl std::fmt::Display for CleanupPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CleanupPolicy::Delete => "delete",
            CleanupPolicy::Compact => "compact",
            CleanupPolicy::DeleteOrCompact => "delete,compact",
        })
    }
}

impl FromStr for CleanupPolicy {
    type Err = String;

    /// Parses Kafka's spellings (`delete`, `compact`, `compact,delete` in either order) and
    /// Event Hubs' (`Delete`, `Compact`, `DeleteOrCompact`), ignoring case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts: Vec<String> = s
            .split(',')
            .map(|p| p.trim().to_ascii_lowercase())
            .collect();
        parts.sort();
        match parts.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["delete"] => Ok(CleanupPolicy::Delete),
            ["compact"] => Ok(CleanupPolicy::Compact),
            ["compact", "delete"] | ["deleteorcompact"] => Ok(CleanupPolicy::DeleteOrCompact),
            _ => Err(format!(
                "unknown cleanup policy {s:?}: use delete, compact or delete,compact"
            )),
        }
    }
}

/// How a partition cleans up: its policy and, when it compacts, the compaction's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cleanup {
    /// Delete, compact, or both.
    pub policy: CleanupPolicy,
    /// An event stays readable, even once a later event of its key supersedes it, for at least
    /// this long after it was enqueued (Event Hubs' `minCompactionLagTimeInMinutes`, Kafka's
    /// `min.compaction.lag.ms`). Compaction only rewrites sealed segments whose newest event is
    /// this old.
    pub min_compaction_lag_ms: i64,
    /// A tombstone (an event with a key and an empty body) is removed once it is this old
    /// (Event Hubs' `tombstoneRetentionTimeInHours`, Kafka's `delete.retention.ms`), so
    /// consumers that read slower than this see every deletion.
    pub tombstone_retention_ms: i64,
    /// Memory for compaction's key index: at most [`COMPACTION_KEY_INDEX_BYTES_PER_KEY`]
    /// bytes per distinct key. When a partition's keys do not fit, compaction works in passes,
    /// each over as many keys as fit.
    pub key_index_bytes_max: u64,
}

impl Default for Cleanup {
    fn default() -> Self {
        Cleanup {
            policy: CleanupPolicy::Delete,
            min_compaction_lag_ms: 0,
            tombstone_retention_ms: TOMBSTONE_RETENTION_MS_DEFAULT,
            key_index_bytes_max: COMPACTION_KEY_INDEX_BYTES_DEFAULT,
        }
    }
}

impl Cleanup {
    /// Checks every value against the limits, with a message naming the one that is off.
    pub fn validate(&self) -> Result<(), LogError> {
        let bad = |msg: String| Err(LogError::InvalidConfig(msg));
        if self.min_compaction_lag_ms < 0 {
            return bad(format!(
                "the minimum compaction lag {} ms must not be negative",
                self.min_compaction_lag_ms
            ));
        }
        if self.tombstone_retention_ms < 0 {
            return bad(format!(
                "the tombstone retention {} ms must not be negative",
                self.tombstone_retention_ms
            ));
        }
        if self.key_index_bytes_max < COMPACTION_KEY_INDEX_BYTES_MIN {
            return bad(format!(
                "the compaction key index budget {} bytes must be at least {COMPACTION_KEY_INDEX_BYTES_MIN} bytes",
                self.key_index_bytes_max
            ));
        }
        Ok(())
    }

    /// How many distinct keys one compaction pass may index.
    pub fn keys_per_pass(&self) -> usize {
        usize::try_from(self.key_index_bytes_max / COMPACTION_KEY_INDEX_BYTES_PER_KEY)
            .unwrap_or(usize::MAX)
    }
}

/// The configuration of one partition log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    /// When appends are acknowledged.
    pub durability: Durability,
    /// A segment is sealed and a new one started once it reaches this size.
    pub segment_bytes_max: u64,
    /// Distance between sparse index entries.
    pub index_interval_bytes: u32,
    /// The largest encoded event accepted.
    pub event_bytes_max: u32,
    /// The cleanup policy the log opens with ([`crate::PartitionLog::set_cleanup`] changes it).
    pub cleanup: Cleanup,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            durability: Durability::Fsync,
            segment_bytes_max: SEGMENT_BYTES_MAX_DEFAULT,
            index_interval_bytes: INDEX_INTERVAL_BYTES_DEFAULT,
            event_bytes_max: EVENT_BYTES_MAX_DEFAULT,
            cleanup: Cleanup::default(),
        }
    }
}

impl LogConfig {
    /// Checks every value against the limits, with a message naming the one that is off.
    pub fn validate(&self) -> Result<(), LogError> {
        let bad = |msg: String| Err(LogError::InvalidConfig(msg));
        if !(SEGMENT_BYTES_MAX_MIN..=SEGMENT_BYTES_MAX_LIMIT).contains(&self.segment_bytes_max) {
            return bad(format!(
                "segment size {} must be between {SEGMENT_BYTES_MAX_MIN} and {SEGMENT_BYTES_MAX_LIMIT} bytes",
                self.segment_bytes_max
            ));
        }
        if self.index_interval_bytes == 0 {
            return bad("the index interval must be above 0 bytes".into());
        }
        if self.event_bytes_max == 0 || self.event_bytes_max > EVENT_BYTES_MAX_LIMIT {
            return bad(format!(
                "the event size limit {} must be between 1 and {EVENT_BYTES_MAX_LIMIT} bytes",
                self.event_bytes_max
            ));
        }
        if let Durability::Interval(d) = self.durability
            && d.is_zero()
        {
            return bad("the sync interval must be above 0 ms".into());
        }
        self.cleanup.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durability_parses_and_prints() {
        for s in ["fsync", "none", "interval:250"] {
            assert_eq!(s.parse::<Durability>().unwrap().to_string(), s);
        }
        assert!("interval:0".parse::<Durability>().is_err());
        assert!("interval:x".parse::<Durability>().is_err());
        assert!("sometimes".parse::<Durability>().is_err());
    }

    #[test]
    fn config_limits_are_checked() {
        assert!(LogConfig::default().validate().is_ok());
        let small = LogConfig {
            segment_bytes_max: 1,
            ..LogConfig::default()
        };
        assert!(small.validate().is_err());
        let huge_event = LogConfig {
            event_bytes_max: EVENT_BYTES_MAX_LIMIT + 1,
            ..LogConfig::default()
        };
        assert!(huge_event.validate().is_err());
        let tiny_key_index = LogConfig {
            cleanup: Cleanup {
                key_index_bytes_max: COMPACTION_KEY_INDEX_BYTES_MIN - 1,
                ..Cleanup::default()
            },
            ..LogConfig::default()
        };
        assert!(tiny_key_index.validate().is_err());
    }

    #[test]
    fn cleanup_policies_parse_in_kafka_and_event_hubs_spellings() {
        for (s, policy) in [
            ("delete", CleanupPolicy::Delete),
            ("Compact", CleanupPolicy::Compact),
            ("compact,delete", CleanupPolicy::DeleteOrCompact),
            ("delete, compact", CleanupPolicy::DeleteOrCompact),
            ("DeleteOrCompact", CleanupPolicy::DeleteOrCompact),
        ] {
            assert_eq!(s.parse::<CleanupPolicy>().unwrap(), policy, "{s}");
            assert_eq!(policy.to_string().parse::<CleanupPolicy>().unwrap(), policy);
        }
        assert!("shred".parse::<CleanupPolicy>().is_err());
        assert!(!CleanupPolicy::Delete.compacts());
        assert!(!CleanupPolicy::Compact.deletes());
        assert_eq!(Cleanup::default().policy, CleanupPolicy::Delete);
    }
}
