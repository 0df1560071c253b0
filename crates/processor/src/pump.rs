//! One partition's pump: receiver → processor, until told to stop or the partition is lost.
//!
//! A pump owns one [`EventProcessor`] and at most one open receiver. It guarantees:
//! - `open` first, `close` last and exactly once, and nothing in between runs concurrently;
//! - a batch is read only after the previous `process_events` returned (pull, never push), so a
//!   slow processor slows reading instead of filling a queue;
//! - after an error it reopens the receiver after the last event it delivered, so a batch is not
//!   delivered twice by the same pump; after an ownership loss it reads nothing more, and a
//!   batch being processed when the loss is signalled — by the coordinator, or by the receiver
//!   being taken over by a higher owner level — is cancelled at its next await point.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tributary_event::EventPosition;

use crate::limits::{RECEIVE_RETRY_BACKOFF_MAX, RECEIVE_RETRY_BACKOFF_MIN};
use crate::processor::{CloseReason, EventProcessor, PartitionContext, PartitionError};
use tributary_source::{PartitionReceiver, PartitionSource, ReceiverOptions, SourceError};

/// What every pump of a host shares.
pub(crate) struct PumpConfig {
    pub(crate) source: Arc<dyn PartitionSource>,
    pub(crate) consumer_group: String,
    pub(crate) batch_events_max: usize,
    pub(crate) prefetch_count: u32,
    pub(crate) receive_timeout: Duration,
    pub(crate) invoke_processor_after_receive_timeout: bool,
    pub(crate) track_last_enqueued: bool,
}

/// What one pump starts with.
pub(crate) struct PumpStart {
    pub(crate) context: PartitionContext,
    pub(crate) processor: Box<dyn EventProcessor>,
    /// Where to start reading: after the checkpoint, or the initial position.
    pub(crate) position: EventPosition,
    /// The version of the ownership record this host won: the receiver's epoch.
    pub(crate) owner_level: i64,
}

/// The coordinator's instruction to a pump: `Some(reason)` once it should stop.
pub(crate) type StopSignal = watch::Receiver<Option<CloseReason>>;

/// Runs a pump to its end; returns the reason `close` was called with.
pub(crate) async fn run_pump(
    config: Arc<PumpConfig>,
    start: PumpStart,
    mut stop: StopSignal,
) -> CloseReason {
    let PumpStart {
        context,
        mut processor,
        position,
        owner_level,
    } = start;
    processor.open(&context).await;
    let mut pump = Pump {
        config,
        context: context.clone(),
        processor: processor.as_mut(),
        position,
        owner_level,
        backoff: Backoff::default(),
    };
    let reason = pump.run(&mut stop).await;
    processor.close(&context, reason).await;
    tracing::debug!(
        partition_id = context.partition_id(),
        ?reason,
        "partition pump closed"
    );
    reason
}

/// How one receiver's life ended.
enum ReceiverEnd {
    Stop(CloseReason),
    Failed(SourceError),
}

struct Pump<'a> {
    config: Arc<PumpConfig>,
    context: PartitionContext,
    processor: &'a mut dyn EventProcessor,
    /// Where the next receiver starts: after the last delivered event.
    position: EventPosition,
    owner_level: i64,
    backoff: Backoff,
}

impl Pump<'_> {
    async fn run(&mut self, stop: &mut StopSignal) -> CloseReason {
        loop {
            let options = self.receiver_options();
            let source = Arc::clone(&self.config.source);
            let opened = tokio::select! {
                biased;
                reason = stopped(stop) => return reason,
                opened = source.open_receiver(options) => opened,
            };
            let mut receiver = match opened {
                Ok(receiver) => receiver,
                Err(error) if error.is_ownership_lost() => {
                    self.log_ownership_lost(&error);
                    return CloseReason::OwnershipLost;
                }
                Err(error) => {
                    let error = PartitionError::OpenReceiver { source: error };
                    self.processor.process_error(&self.context, &error).await;
                    if let Some(reason) = self.pause(stop).await {
                        return reason;
                    }
                    continue;
                }
            };
            let end = self.receive_until_end(receiver.as_mut(), stop).await;
            receiver.close().await;
            match end {
                ReceiverEnd::Stop(reason) => return reason,
                ReceiverEnd::Failed(error) => {
                    let error = PartitionError::Receive { source: error };
                    self.processor.process_error(&self.context, &error).await;
                    if let Some(reason) = self.pause(stop).await {
                        return reason;
                    }
                }
            }
        }
    }

    fn receiver_options(&self) -> ReceiverOptions {
        ReceiverOptions {
            partition_id: self.context.partition_id().to_owned(),
            consumer_group: self.config.consumer_group.clone(),
            start: self.position,
            owner_level: Some(self.owner_level),
            prefetch: self.config.prefetch_count,
            track_last_enqueued: self.config.track_last_enqueued,
        }
    }

    /// Receives and processes batches until told to stop, the partition is lost, or the
    /// receiver fails.
    async fn receive_until_end(
        &mut self,
        receiver: &mut dyn PartitionReceiver,
        stop: &mut StopSignal,
    ) -> ReceiverEnd {
        loop {
            let received = tokio::select! {
                biased;
                reason = stopped(stop) => return ReceiverEnd::Stop(reason),
                received = receiver.receive(
                    self.config.batch_events_max,
                    self.config.receive_timeout,
                ) => received,
            };
            let events = match received {
                Ok(events) => events,
                Err(error) if error.is_ownership_lost() => {
                    self.log_ownership_lost(&error);
                    return ReceiverEnd::Stop(CloseReason::OwnershipLost);
                }
                Err(error) => return ReceiverEnd::Failed(error),
            };
            assert!(events.len() <= self.config.batch_events_max);
            self.backoff.reset();
            self.context.record_last_enqueued(receiver.last_enqueued());
            if events.is_empty() && !self.config.invoke_processor_after_receive_timeout {
                continue;
            }
            if let Some(last) = events.last() {
                self.position = EventPosition::Offset {
                    offset: last.offset,
                    inclusive: false,
                };
            }
            self.context.record_delivery(&events);
            // Losing the partition cancels the batch in progress (at its next await point), so
            // the next owner — which waits out the handoff delay — never processes the
            // partition at the same time. So does a new owner's receiver taking the partition
            // over: the next owner may not have waited for this host (see `handoff.rs`). A
            // shutdown lets the batch finish.
            tokio::select! {
                biased;
                () = lost(stop) => return ReceiverEnd::Stop(CloseReason::OwnershipLost),
                () = receiver.taken_over() => {
                    self.log_taken_over();
                    return ReceiverEnd::Stop(CloseReason::OwnershipLost);
                }
                () = self.processor.process_events(&self.context, events) => {}
            }
            if self.context.ownership_lost() {
                return ReceiverEnd::Stop(CloseReason::OwnershipLost);
            }
        }
    }

    /// Waits out the backoff; `Some(reason)` if told to stop meanwhile.
    async fn pause(&mut self, stop: &mut StopSignal) -> Option<CloseReason> {
        let pause = self.backoff.next_pause();
        tokio::select! {
            biased;
            reason = stopped(stop) => Some(reason),
            () = tokio::time::sleep(pause) => None,
        }
    }

    fn log_taken_over(&self) {
        tracing::info!(
            partition_id = self.context.partition_id(),
            owner_level = self.owner_level,
            "partition taken over by a receiver with a higher owner level; cancelling the batch \
             in progress"
        );
    }

    fn log_ownership_lost(&self, error: &SourceError) {
        tracing::info!(
            partition_id = self.context.partition_id(),
            owner_level = self.owner_level,
            reason = %error,
            "partition taken over by a receiver with a higher owner level; stopping its pump"
        );
    }
}

/// Resolves with the stop reason once the coordinator sets one (or goes away: then it is a
/// shutdown).
async fn stopped(stop: &mut StopSignal) -> CloseReason {
    match stop.wait_for(Option::is_some).await {
        Ok(reason) => reason.expect("wait_for returned a set reason"),
        Err(_) => CloseReason::Shutdown,
    }
}

/// Resolves once the coordinator says the partition was lost (never for a shutdown, nor when
/// the coordinator goes away).
async fn lost(stop: &mut StopSignal) {
    let coordinator_gone = stop
        .wait_for(|reason| *reason == Some(CloseReason::OwnershipLost))
        .await
        .is_err();
    if coordinator_gone {
        std::future::pending::<()>().await;
    }
}

/// Exponential backoff between retries, from the minimum to the maximum pause.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: RECEIVE_RETRY_BACKOFF_MIN,
        }
    }
}

impl Backoff {
    fn next_pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(RECEIVE_RETRY_BACKOFF_MAX);
        assert!(pause >= RECEIVE_RETRY_BACKOFF_MIN);
        assert!(pause <= RECEIVE_RETRY_BACKOFF_MAX);
        pause
    }

    fn reset(&mut self) {
        self.next = RECEIVE_RETRY_BACKOFF_MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_maximum_and_resets() {
        let mut backoff = Backoff::default();
        let pauses: Vec<Duration> = (0..10).map(|_| backoff.next_pause()).collect();
        assert_eq!(pauses[0], RECEIVE_RETRY_BACKOFF_MIN);
        assert_eq!(pauses[1], RECEIVE_RETRY_BACKOFF_MIN * 2);
        assert!(pauses.windows(2).all(|pair| pair[0] <= pair[1]));
        assert_eq!(pauses[9], RECEIVE_RETRY_BACKOFF_MAX);
        backoff.reset();
        assert_eq!(backoff.next_pause(), RECEIVE_RETRY_BACKOFF_MIN);
    }
}
