//! Where events come from: the two traits an event processor host reads partitions through.
//!
//! This crate owns the boundary between the processor host and an event hub: [`PartitionSource`]
//! and [`PartitionReceiver`], what a receiver is opened with ([`ReceiverOptions`]), what it reports
//! about the partition's newest event ([`LastEnqueuedEventProperties`]) and how it fails
//! ([`SourceError`]). It depends on the event data model only, so each side compiles without the
//! other: `tributary-processor` consumes these traits, `tributary-broker` implements them for an
//! in-process hub, `tributary-client` for a remote one (Tributary or Azure Event Hubs), and the
//! `testing` feature adds `testing::InMemoryPartitionSource`, a test double.
//!
//! A [`PartitionSource`] names one event hub and opens [`PartitionReceiver`]s on its partitions;
//! the host never learns whether the hub is the in-process broker, a Tributary server reached over
//! AMQP, or Azure Event Hubs. What the host relies on, and every implementation must provide:
//!
//! - **Epochs.** A receiver opened with `owner_level = Some(e2)` disconnects the receiver with
//!   owner level `e1 <= e2` on the same (consumer group, partition) — that receiver's next
//!   `receive` returns [`SourceError::OwnershipLost`] — and opening with `e2 < e1` is refused
//!   with [`SourceError::OwnershipLost`]. This is what keeps a former owner from reading on; a
//!   source that can tell a takeover apart from a receive also resolves
//!   [`PartitionReceiver::taken_over`], which keeps a former owner from processing on.
//! - **Positions.** `start` is resolved when the receiver opens; events then arrive in partition
//!   order, each at most once per receiver.
//! - **Bounded buffering.** A receiver buffers at most `prefetch` events ahead of the caller.

#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::time::Duration;

use thiserror::Error;
use tributary_event::{EventPosition, ReceivedEvent};

/// One event hub whose partitions can be read.
#[async_trait::async_trait]
pub trait PartitionSource: Send + Sync + 'static {
    /// The namespace's host name, e.g. `"myns.servicebus.windows.net"`; part of the key under
    /// which ownership and checkpoints are stored.
    fn fully_qualified_namespace(&self) -> &str;

    /// The event hub's name.
    fn event_hub_name(&self) -> &str;

    /// The hub's partition ids, e.g. `["0", "1", …]`. The host asks again from time to time, so
    /// partitions added to a hub are picked up.
    async fn partition_ids(&self) -> Result<Vec<String>, SourceError>;

    /// Opens a receiver on one partition (see the crate docs for the epoch rules).
    async fn open_receiver(
        &self,
        options: ReceiverOptions,
    ) -> Result<Box<dyn PartitionReceiver>, SourceError>;
}

/// The most events a receiver may be asked to buffer ([`ReceiverOptions::prefetch`]): every
/// source honours at least this much, and the processor host never asks for more. 100,000
/// events is ten batches of the processor's largest; at 1 MiB per event (the Event Hubs
/// maximum) that is already far beyond any sensible memory budget.
pub const PREFETCH_LIMIT: u32 = 100_000;

/// What a receiver reads and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiverOptions {
    /// The partition to read.
    pub partition_id: String,
    /// The consumer group to read in.
    pub consumer_group: String,
    /// Where to start.
    pub start: EventPosition,
    /// The epoch. The host passes the version of the ownership record it won, so every new owner
    /// of a partition has a higher owner level than every former one.
    pub owner_level: Option<i64>,
    /// How many events the receiver may buffer ahead of `receive` calls (at most
    /// [`PREFETCH_LIMIT`]).
    pub prefetch: u32,
    /// Whether to ask the hub for the partition's last-enqueued-event properties with each
    /// delivery (see [`PartitionReceiver::last_enqueued`]).
    pub track_last_enqueued: bool,
}

/// A reader of one partition, opened by [`PartitionSource::open_receiver`].
#[async_trait::async_trait]
pub trait PartitionReceiver: Send {
    /// Up to `max_events`; waits up to `wait` for the first; Ok(empty) on timeout.
    async fn receive(
        &mut self,
        max_events: usize,
        wait: Duration,
    ) -> Result<Vec<ReceivedEvent>, SourceError>;

    /// The partition's last enqueued event as of the latest delivery, when the receiver was
    /// opened with `track_last_enqueued` and the hub has reported it.
    fn last_enqueued(&self) -> Option<LastEnqueuedEventProperties>;

    /// Resolves once a receiver with a higher owner level has taken the partition from this
    /// one, learnt without receiving: the host watches for it while a batch is being processed
    /// and cancels that batch, so a former owner that has not noticed the change of hands in
    /// the checkpoint store stops processing the moment the new owner's receiver opens. Must be
    /// cancel-safe. A source that learns of a takeover only from [`receive`](Self::receive)
    /// keeps this default, which never resolves.
    async fn taken_over(&mut self) {
        std::future::pending::<()>().await;
    }

    /// Detaches from the partition. Dropping a receiver without closing it is allowed (a crash
    /// does just that); the hub then notices the receiver is gone on its own schedule.
    async fn close(self: Box<Self>);
}

/// The newest event in a partition, as the hub last reported it to a receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastEnqueuedEventProperties {
    /// The sequence number of the partition's newest event.
    pub sequence_number: i64,
    /// The offset of the partition's newest event.
    pub offset: u64,
    /// When the newest event was enqueued, in milliseconds since the Unix epoch.
    pub enqueued_time_ms: i64,
    /// When the receiver learnt these values, in milliseconds since the Unix epoch.
    pub retrieved_time_ms: i64,
}

/// Why a source or receiver operation failed.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SourceError {
    /// A receiver with a higher epoch took the partition (`amqp:link:stolen`), or this receiver
    /// was refused because one with a higher epoch is reading. Expected during rebalancing.
    #[error("partition ownership lost: {description}")]
    OwnershipLost {
        /// What the hub said.
        description: String,
    },
    /// The event hub, consumer group or partition does not exist.
    #[error("not found: {what}")]
    NotFound {
        /// What was missing, e.g. `consumer group "audit"`.
        what: String,
    },
    /// The credentials do not allow listening on this hub.
    #[error("unauthorized: {description}")]
    Unauthorized {
        /// What the hub said.
        description: String,
    },
    /// A failure worth retrying (connection dropped, server busy, timeout).
    #[error("transient failure: {description}")]
    Transient {
        /// What went wrong.
        description: String,
    },
    /// Anything else.
    #[error("{description}")]
    Other {
        /// What went wrong.
        description: String,
    },
}

impl SourceError {
    /// Whether this error means another receiver owns the partition now.
    pub fn is_ownership_lost(&self) -> bool {
        matches!(self, SourceError::OwnershipLost { .. })
    }

    /// Whether retrying the same operation may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, SourceError::Transient { .. })
    }
}
