//! [`Receiver`]: one open reader of one partition in one consumer group.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tributary_event::ReceivedEvent;
use tributary_log::ReadCursor;

use crate::epochs::ReceiverId;
use crate::hub::Hub;
use crate::{BrokerError, DisconnectReason, ReceiveError};

/// The most bytes of batches one `receive` reads from the log (at least one event is always
/// returned, however large).
pub const RECEIVE_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// A `receive` that has waited this long for an event gives back its cursor's read buffers
/// (an idle receiver holds no file bytes; a busy one, never waiting this long, reuses them).
pub const RELEASE_BUFFERS_AFTER: Duration = Duration::from_millis(200);

/// How the broker reaches an open receiver to disconnect it. A watch, so any number of waiters
/// (a receive in progress, a front door watching for displacement) all see the disconnect.
#[derive(Debug)]
pub(crate) struct ReceiverControl {
    reason: watch::Sender<Option<DisconnectReason>>,
}

impl Default for ReceiverControl {
    fn default() -> Self {
        ReceiverControl {
            reason: watch::Sender::new(None),
        }
    }
}

impl ReceiverControl {
    pub(crate) fn disconnect(&self, reason: DisconnectReason) {
        // The first reason sticks.
        self.reason.send_if_modified(|current| {
            let first = current.is_none();
            if first {
                *current = Some(reason);
            }
            first
        });
    }

    fn reason(&self) -> Option<DisconnectReason> {
        self.reason.borrow().clone()
    }
}

/// Resolves once `control` holds a disconnect reason.
async fn disconnected(control: &ReceiverControl) -> DisconnectReason {
    let mut watcher = control.reason.subscribe();
    match watcher.wait_for(Option::is_some).await {
        Ok(reason) => reason.clone().expect("wait_for returned a set reason"),
        // The sender lives in the control, which the caller borrows for this whole wait.
        Err(_) => unreachable!("the receiver control outlives its watchers"),
    }
}

/// Whether a [`Receiver`] was disconnected, readable without the receiver
/// ([`Receiver::disconnect_watch`]).
#[derive(Debug, Clone)]
pub struct DisconnectWatch(Arc<ReceiverControl>);

impl DisconnectWatch {
    /// Why the broker disconnected the receiver, if it has.
    pub fn reason(&self) -> Option<DisconnectReason> {
        self.0.reason()
    }
}

/// The newest event of a partition as a receiver last saw it (the runtime metric Event Hubs
/// receivers can ask for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastEnqueuedEvent {
    /// Its sequence number (-1 if the partition never had an event).
    pub sequence_number: i64,
    /// Its offset, if the partition ever had an event.
    pub offset: Option<u64>,
    /// Its enqueued time, if the partition ever had an event.
    pub enqueued_time_ms: Option<i64>,
    /// When this was read, ms since the epoch.
    pub retrieved_time_ms: i64,
}

/// A reader of one partition in one consumer group, opened with
/// [`crate::Broker::open_receiver`]. Dropping it closes it.
pub struct Receiver {
    pub(crate) hub: Arc<Hub>,
    pub(crate) group: String,
    pub(crate) partition: u32,
    pub(crate) id: ReceiverId,
    pub(crate) epoch: Option<i64>,
    pub(crate) cursor: ReadCursor,
    pub(crate) commits: watch::Receiver<i64>,
    pub(crate) control: Arc<ReceiverControl>,
    pub(crate) last_enqueued: Option<LastEnqueuedEvent>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("hub", &self.hub.name())
            .field("group", &self.group)
            .field("partition", &self.partition)
            .field("epoch", &self.epoch)
            .field("next_sequence", &self.cursor.next_sequence())
            .finish_non_exhaustive()
    }
}

impl Receiver {
    /// Up to `max_events` events from the receiver's position on. Waits up to `wait` for the
    /// first one — woken by the append that brings it, not by polling — and returns an empty
    /// batch if none arrives in time.
    ///
    /// Fails with [`ReceiveError::Disconnected`] once the broker has disconnected the receiver
    /// (a higher epoch took the partition, its group or hub was deleted, or shutdown).
    pub async fn receive(
        &mut self,
        max_events: usize,
        wait: Duration,
    ) -> Result<Vec<ReceivedEvent>, ReceiveError> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut release_at = Some(tokio::time::Instant::now() + RELEASE_BUFFERS_AFTER);
        loop {
            if let Some(reason) = self.control.reason() {
                return Err(ReceiveError::Disconnected(reason));
            }
            self.commits.borrow_and_update();
            let events = self.read(max_events)?;
            if !events.is_empty() || max_events == 0 {
                return Ok(events);
            }
            tokio::select! {
                _ = disconnected(&self.control) => {}
                changed = self.commits.changed() => {
                    if changed.is_err() {
                        return Err(ReceiveError::Disconnected(DisconnectReason::HubDeleted));
                    }
                }
                // One timer: the deadline, or before it the moment to give the buffers back.
                () = tokio::time::sleep_until(release_at.map_or(deadline, |at| at.min(deadline))) => {
                    if release_at.take().is_none_or(|at| at >= deadline) {
                        return Ok(Vec::new());
                    }
                    self.cursor.release_buffers();
                }
            }
        }
    }

    fn read(&mut self, max_events: usize) -> Result<Vec<ReceivedEvent>, BrokerError> {
        let log = &self.hub.partitions[self.partition as usize].log;
        let mut events = log
            .read(&mut self.cursor, max_events, RECEIVE_BYTES_MAX)
            .map_err(self.hub.log_error(self.partition))?;
        crate::door_stamp::hide(&mut events);
        self.hub.count_delivered(self.partition, events.len());
        let properties = log.properties();
        self.last_enqueued = Some(LastEnqueuedEvent {
            sequence_number: properties.last_enqueued_sequence_number,
            offset: properties.last_enqueued_offset,
            enqueued_time_ms: properties.last_enqueued_time_ms,
            retrieved_time_ms: self.hub.clock.now_ms(),
        });
        Ok(events)
    }

    /// Why the broker disconnected this receiver, if it has; checked without receiving, so a
    /// front door can stop delivering events it already holds the moment a higher epoch takes
    /// the partition.
    pub fn disconnect_reason(&self) -> Option<DisconnectReason> {
        self.control.reason()
    }

    /// A handle that tells whether the broker disconnected this receiver, apart from it: a
    /// front door that holds fetched events elsewhere checks it before sending each batch.
    pub fn disconnect_watch(&self) -> DisconnectWatch {
        DisconnectWatch(self.control.clone())
    }

    /// Resolves once the broker disconnects this receiver (cancel-safe; never resolves for a
    /// receiver that stays connected).
    pub async fn disconnected(&self) -> DisconnectReason {
        disconnected(&self.control).await
    }

    /// The partition this receiver reads.
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// The epoch (owner level) it was opened with, if any.
    pub fn epoch(&self) -> Option<i64> {
        self.epoch
    }

    /// The sequence number of the next event it will return.
    pub fn next_sequence(&self) -> i64 {
        self.cursor.next_sequence()
    }

    /// The partition's newest event as of the last `receive`.
    pub fn last_enqueued(&self) -> Option<LastEnqueuedEvent> {
        self.last_enqueued
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.hub
            .close_receiver(&self.group, self.partition, self.id);
    }
}

/// Frees a receiver's place — its epoch and its share of the five-receiver quota — when it is
/// dropped, even while a task still holds the [`Receiver`] itself: a front door whose link is
/// gone gives the place back at once, so the client's next receiver is not refused for a
/// receiver that is only winding down. Freeing twice (here and when the receiver is dropped) is
/// harmless.
pub struct ReceiverPlace {
    hub: Arc<Hub>,
    group: String,
    partition: u32,
    id: ReceiverId,
}

impl Receiver {
    /// The token that frees this receiver's place when dropped (see [`ReceiverPlace`]).
    pub fn place(&self) -> ReceiverPlace {
        ReceiverPlace {
            hub: self.hub.clone(),
            group: self.group.clone(),
            partition: self.partition,
            id: self.id,
        }
    }
}

impl std::fmt::Debug for ReceiverPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiverPlace")
            .field("hub", &self.hub.name())
            .field("group", &self.group)
            .field("partition", &self.partition)
            .finish_non_exhaustive()
    }
}

impl Drop for ReceiverPlace {
    fn drop(&mut self) {
        self.hub
            .close_receiver(&self.group, self.partition, self.id);
    }
}
