//! How a partition log is configured: durability, segment size, index density, event size
//! limit, and retention.

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

/// How long and how much a partition keeps. Whole segments are removed; the active segment is
/// sealed first if everything in it has expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retention {
    /// Remove events older than this (by enqueued time). `None` keeps them forever.
    pub age_ms_max: Option<i64>,
    /// Remove the oldest segments while the partition is larger than this. `None`: no limit.
    pub bytes_max: Option<u64>,
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
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            durability: Durability::Fsync,
            segment_bytes_max: SEGMENT_BYTES_MAX_DEFAULT,
            index_interval_bytes: INDEX_INTERVAL_BYTES_DEFAULT,
            event_bytes_max: EVENT_BYTES_MAX_DEFAULT,
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
        Ok(())
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
    }
}
