//! What the broker knows of its hubs' captures: how far each partition is captured, as the
//! capture running in `serve` reports it, and how retention treats what is not captured yet.
//!
//! The capture itself lives above the broker (`tributary-capture`); it reports each partition's
//! state here with [`Broker::report_capture`], so the doors (admin API, dashboard, `/metrics`)
//! show it without knowing the capture, and retention asks it before removing a segment.
//!
//! # Guarantees
//! - Retention never removes an event of a captured hub's partition that the capture has not
//!   written while [`CaptureRetention::Hold`] (the default): a partition whose capture has not
//!   reported yet (just enabled, or `serve` just started) is held whole until it does.
//! - With [`CaptureRetention::Proceed`], retention removes what is due and counts the
//!   uncaptured events it removed ([`CaptureStatus::uncaptured_events_removed`]); the capture
//!   then goes on from the earliest retained event.
//! - Either way a held partition is logged (once per pass that holds) and flagged
//!   ([`CaptureStatus::retention_held`]), so a capture that falls behind is seen.

use std::collections::HashMap;

use tributary_event::names::name_key;

use crate::Broker;

/// What retention does with events a capture has not written yet (`serve --capture-retention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CaptureRetention {
    /// Keep the segments that hold them, past the retention age and size.
    #[default]
    Hold,
    /// Remove them as retention says, counting them.
    Proceed,
}

/// One partition's capture, as last reported, plus what retention did with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaptureStatus {
    /// The first sequence number not yet in a published file (`None` until the capture
    /// reported).
    pub captured_to: Option<i64>,
    /// The enqueued time of the event at `captured_to`, if the partition holds it (the oldest
    /// event not yet captured).
    pub oldest_uncaptured_ms: Option<i64>,
    /// Files published since the server started.
    pub files_written: u64,
    /// Their bytes.
    pub bytes_written: u64,
    /// Failed steps since the server started.
    pub errors: u64,
    /// The last failure, cleared by the next success.
    pub last_error: Option<String>,
    /// When a step last succeeded, ms since the epoch.
    pub last_success_ms: Option<i64>,
    /// Whether retention's last pass kept segments for this capture.
    pub retention_held: bool,
    /// Uncaptured events retention removed anyway ([`CaptureRetention::Proceed`]).
    pub uncaptured_events_removed: u64,
}

impl CaptureStatus {
    /// Events of a partition whose next sequence number is `next_sequence` not yet captured
    /// (all of them before the capture reported).
    pub fn lag_events(&self, next_sequence: i64) -> i64 {
        (next_sequence - self.captured_to.unwrap_or(0)).max(0)
    }

    /// How long the oldest event not yet captured has waited at `now_ms`, in seconds (0 when
    /// every event is captured).
    #[allow(clippy::cast_precision_loss)]
    pub fn lag_seconds(&self, now_ms: i64) -> f64 {
        self.oldest_uncaptured_ms
            .map_or(0.0, |t| now_ms.saturating_sub(t).max(0) as f64 / 1000.0)
    }
}

/// Capture statuses by (hub name key, partition index).
pub(crate) type CaptureStatuses = HashMap<(String, u32), CaptureStatus>;

impl Broker {
    /// Records what the capture of `hub`'s partition `partition` reports (`update` changes the
    /// status in place). Unknown hubs and partitions are recorded all the same: the status goes
    /// with [`Broker::forget_capture`].
    pub fn report_capture(
        &self,
        hub: &str,
        partition: u32,
        update: impl FnOnce(&mut CaptureStatus),
    ) {
        let mut statuses = self.inner.capture.lock().expect("capture statuses");
        update(statuses.entry((name_key(hub), partition)).or_default());
    }

    /// Drops the statuses of `hub`'s capture (it was turned off).
    pub fn forget_capture(&self, hub: &str) {
        let key = name_key(hub);
        let mut statuses = self.inner.capture.lock().expect("capture statuses");
        statuses.retain(|(h, _), _| *h != key);
    }

    /// The capture status of each partition of `hub`, by partition index (default statuses
    /// for partitions not reported).
    pub fn capture_statuses(&self, hub: &str, partition_count: u32) -> Vec<CaptureStatus> {
        let key = name_key(hub);
        let statuses = self.inner.capture.lock().expect("capture statuses");
        (0..partition_count)
            .map(|p| statuses.get(&(key.clone(), p)).cloned().unwrap_or_default())
            .collect()
    }

    /// What retention should keep of `hub`'s partition `partition` for its capture: from the
    /// reported `captured_to`, or everything (0) before the first report.
    pub(crate) fn uncaptured(&self, hub: &str, partition: u32) -> tributary_log::Uncaptured {
        let statuses = self.inner.capture.lock().expect("capture statuses");
        let from_sequence = statuses
            .get(&(name_key(hub), partition))
            .and_then(|s| s.captured_to)
            .unwrap_or(0);
        tributary_log::Uncaptured {
            from_sequence,
            hold: self.inner.config.capture_retention == CaptureRetention::Hold,
        }
    }
}
