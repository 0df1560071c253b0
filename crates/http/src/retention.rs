//! A hub's cleanup settings in Event Hubs' words: the `retentionDescription` of the Azure
//! Resource Manager API (`cleanupPolicy` `Delete`, `Compact` or `DeleteOrCompact`,
//! `retentionTimeInHours`, `minCompactionLagTimeInMinutes`, `tombstoneRetentionTimeInHours`),
//! as the admin API shows and takes it and the CLI sends and reads it.
//!
//! The hub keeps milliseconds; here they become Azure's minutes and hours, as fractions when
//! they are not whole (a Kafka client may set `min.compaction.lag.ms` to any millisecond), and
//! back, rounded to the millisecond.

use serde::{Deserialize, Serialize};
use tributary_broker::{CleanupPolicy, HubCleanup, HubDefinition};

const MS_PER_MINUTE: f64 = 60_000.0;
const MS_PER_HOUR: f64 = 3_600_000.0;

/// Event Hubs' `retentionDescription`. Every field is optional when it is sent; the hub shows
/// them all. `retentionTimeInHours` is shown only (-1: forever): the admin API sets the
/// retention with `retentionMs` and `retentionForever`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RetentionDescription {
    /// `Delete`, `Compact` or `DeleteOrCompact` (Kafka's spellings are taken too).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cleanup_policy: Option<String>,
    /// How long events are kept, in hours; -1 is forever.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention_time_in_hours: Option<f64>,
    /// The minimum compaction lag, in minutes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_compaction_lag_time_in_minutes: Option<f64>,
    /// The tombstone retention, in hours.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tombstone_retention_time_in_hours: Option<f64>,
}

/// Event Hubs' name of a cleanup policy.
pub fn policy_name(policy: CleanupPolicy) -> &'static str {
    match policy {
        CleanupPolicy::Delete => "Delete",
        CleanupPolicy::Compact => "Compact",
        CleanupPolicy::DeleteOrCompact => "DeleteOrCompact",
    }
}

#[allow(clippy::cast_precision_loss)]
fn in_unit(ms: i64, unit_ms: f64) -> f64 {
    ms as f64 / unit_ms
}

/// `ms` in minutes (`minCompactionLagTimeInMinutes`).
pub fn minutes(ms: i64) -> f64 {
    in_unit(ms, MS_PER_MINUTE)
}

/// `ms` in hours (`retentionTimeInHours`, `tombstoneRetentionTimeInHours`).
pub fn hours(ms: i64) -> f64 {
    in_unit(ms, MS_PER_HOUR)
}

/// `value` units of `unit_ms` as whole milliseconds, if it is a duration (finite, not
/// negative, not absurdly large).
#[allow(clippy::cast_possible_truncation)]
fn to_ms(value: f64, unit_ms: f64, name: &str) -> Result<i64, String> {
    let ms = (value * unit_ms).round();
    if !ms.is_finite() || !(0.0..=1e15).contains(&ms) {
        return Err(format!(
            "{name} {value} must be a duration of at least 0 (and below about 30,000 years)"
        ));
    }
    Ok(ms as i64)
}

impl RetentionDescription {
    /// How `hub` is described.
    pub fn of(hub: &HubDefinition) -> Self {
        let cleanup = hub.cleanup;
        RetentionDescription {
            retention_time_in_hours: Some(hub.retention_age_ms.map_or(-1.0, hours)),
            ..Self::of_cleanup(cleanup)
        }
    }

    /// The description of `cleanup` alone (what the CLI sends when it creates a hub).
    pub fn of_cleanup(cleanup: HubCleanup) -> Self {
        RetentionDescription {
            cleanup_policy: Some(policy_name(cleanup.policy).to_owned()),
            retention_time_in_hours: None,
            min_compaction_lag_time_in_minutes: Some(minutes(cleanup.min_compaction_lag_ms)),
            tombstone_retention_time_in_hours: Some(hours(cleanup.tombstone_retention_ms)),
        }
    }

    /// The cleanup policy it names, if any.
    pub fn policy(&self) -> Result<Option<CleanupPolicy>, String> {
        self.cleanup_policy
            .as_deref()
            .map(|p| {
                p.parse().map_err(|_| {
                    format!("unknown cleanupPolicy {p:?}: use Delete, Compact or DeleteOrCompact")
                })
            })
            .transpose()
    }

    /// The minimum compaction lag it gives, in ms.
    pub fn min_compaction_lag_ms(&self) -> Result<Option<i64>, String> {
        self.min_compaction_lag_time_in_minutes
            .map(|m| to_ms(m, MS_PER_MINUTE, "minCompactionLagTimeInMinutes"))
            .transpose()
    }

    /// The tombstone retention it gives, in ms.
    pub fn tombstone_retention_ms(&self) -> Result<Option<i64>, String> {
        self.tombstone_retention_time_in_hours
            .map(|h| to_ms(h, MS_PER_HOUR, "tombstoneRetentionTimeInHours"))
            .transpose()
    }

    /// `base` with what this description gives in place of its settings.
    pub fn cleanup_over(&self, base: HubCleanup) -> Result<HubCleanup, String> {
        Ok(HubCleanup {
            policy: self.policy()?.unwrap_or(base.policy),
            min_compaction_lag_ms: self
                .min_compaction_lag_ms()?
                .unwrap_or(base.min_compaction_lag_ms),
            tombstone_retention_ms: self
                .tombstone_retention_ms()?
                .unwrap_or(base.tombstone_retention_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_round_trip_to_the_millisecond() {
        let cleanup = HubCleanup {
            policy: CleanupPolicy::DeleteOrCompact,
            min_compaction_lag_ms: 1_500,
            tombstone_retention_ms: 7_200_001,
        };
        let description = RetentionDescription::of_cleanup(cleanup);
        assert_eq!(
            description.cleanup_policy.as_deref(),
            Some("DeleteOrCompact")
        );
        let json = serde_json::to_value(&description).unwrap();
        let back: RetentionDescription = serde_json::from_value(json).unwrap();
        assert_eq!(back.cleanup_over(HubCleanup::default()), Ok(cleanup));
    }

    #[test]
    fn bad_values_are_named() {
        let bad = RetentionDescription {
            min_compaction_lag_time_in_minutes: Some(-1.0),
            ..RetentionDescription::default()
        };
        let err = bad.cleanup_over(HubCleanup::default()).unwrap_err();
        assert!(err.contains("minCompactionLagTimeInMinutes"), "{err}");
        let bad = RetentionDescription {
            cleanup_policy: Some("Shred".into()),
            ..RetentionDescription::default()
        };
        let err = bad.cleanup_over(HubCleanup::default()).unwrap_err();
        assert!(err.contains("cleanupPolicy \"Shred\""), "{err}");
        let bad = RetentionDescription {
            tombstone_retention_time_in_hours: Some(f64::INFINITY),
            ..RetentionDescription::default()
        };
        assert!(bad.cleanup_over(HubCleanup::default()).is_err());
    }
}
