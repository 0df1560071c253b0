//! What users implement: [`EventProcessor`], made per partition by an [`EventProcessorFactory`],
//! and the [`PartitionContext`] each call receives.
//!
//! This module owns the contract between the host and user code, as in Event Processor Host's
//! `IEventProcessor`:
//!
//! - For each partition the host comes to own, the factory makes one processor instance. The
//!   host calls `open`, then `process_events` for each batch (and `process_error` for each
//!   failure the pump recovers from), then `close` once with the reason.
//! - **Calls for one partition are strictly sequential**: the instance is borrowed `&mut` by its
//!   partition's pump, so no call starts before the previous one returned. Different partitions
//!   run in parallel, each pump on its own Tokio task.
//! - A checkpoint goes through the [`CheckpointStore`] with this host's ownership as the fence:
//!   once another host owns the partition, [`PartitionContext::checkpoint`] fails with
//!   [`StoreError::OwnershipLost`] and the pump stops after the current call.
//!
//! For a processor that only needs `process_events`, [`processor_fn`] turns a closure into a
//! factory.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use thiserror::Error;
use tributary_event::ReceivedEvent;

use crate::store::{Checkpoint, CheckpointStore, OwnershipFence, StoreError};
use tributary_source::{LastEnqueuedEventProperties, SourceError};

/// Why a processor is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The host is shutting down; the partition will be relinquished right after `close`
    /// returns, so a checkpoint written in `close` is the one the next owner starts from.
    Shutdown,
    /// Another host owns the partition now (it was stolen, or this host's ownership expired).
    /// Checkpoints written now are refused.
    OwnershipLost,
}

/// A failure a partition's pump recovered from, reported to [`EventProcessor::process_error`].
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PartitionError {
    /// Opening the receiver failed; the pump tries again after a pause.
    #[error("opening a receiver failed: {source}")]
    OpenReceiver {
        /// What the source said.
        source: SourceError,
    },
    /// A receive failed; the pump reopens the receiver after the last delivered event, after a
    /// pause.
    #[error("receiving events failed: {source}")]
    Receive {
        /// What the source said.
        source: SourceError,
    },
}

impl PartitionError {
    /// The source's error.
    pub fn source_error(&self) -> &SourceError {
        match self {
            PartitionError::OpenReceiver { source } | PartitionError::Receive { source } => source,
        }
    }
}

/// User code that processes one partition's events.
#[async_trait::async_trait]
pub trait EventProcessor: Send + 'static {
    /// Called once before the first batch.
    async fn open(&mut self, _context: &PartitionContext) {}

    /// Called with each batch of at most `batch_events_max` events, in partition order. The
    /// batch is empty only when `invoke_processor_after_receive_timeout` is on and no event
    /// arrived within the receive timeout.
    ///
    /// If the host loses the partition while a batch is being processed, the call is cancelled
    /// at its next `.await` (its future is dropped) and `close(OwnershipLost)` follows: the new
    /// owner resumes from the last checkpoint, and no two hosts ever process one partition at
    /// the same time. Code between two awaits always runs to its end.
    async fn process_events(&mut self, context: &PartitionContext, events: Vec<ReceivedEvent>);

    /// Called when the pump hit an error it recovers from (it retries on its own). The default
    /// logs a warning.
    async fn process_error(&mut self, context: &PartitionContext, error: &PartitionError) {
        tracing::warn!(
            partition_id = context.partition_id(),
            %error,
            "event processor error"
        );
    }

    /// Called once when the host stops processing the partition.
    async fn close(&mut self, _context: &PartitionContext, _reason: CloseReason) {}
}

/// Makes one [`EventProcessor`] per partition the host comes to own.
///
/// Any `Fn(&PartitionContext) -> P` closure whose `P` is an [`EventProcessor`] is a factory.
pub trait EventProcessorFactory: Send + Sync + 'static {
    /// A new processor for the partition described by `context`.
    fn create_processor(&self, context: &PartitionContext) -> Box<dyn EventProcessor>;
}

impl<F, P> EventProcessorFactory for F
where
    F: Fn(&PartitionContext) -> P + Send + Sync + 'static,
    P: EventProcessor,
{
    fn create_processor(&self, context: &PartitionContext) -> Box<dyn EventProcessor> {
        Box::new(self(context))
    }
}

/// A factory of processors that call one closure for every batch; see [`processor_fn`].
pub struct ProcessorFn<F> {
    process_events: Arc<F>,
}

impl<F> std::fmt::Debug for ProcessorFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessorFn").finish_non_exhaustive()
    }
}

/// A processor factory from a closure called with each batch; `open`, `process_error` and
/// `close` keep their defaults.
///
/// The closure gets its own clone of the [`PartitionContext`], so the future it returns may
/// keep it (to checkpoint) without borrowing.
///
/// ```
/// use tributary_processor::processor_fn;
///
/// let factory = processor_fn(|context, events| async move {
///     for event in &events {
///         println!("{}: {:?}", context.partition_id(), event.data.body);
///     }
///     if let Err(error) = context.checkpoint().await {
///         eprintln!("checkpoint failed: {error}");
///     }
/// });
/// # let _ = factory;
/// ```
pub fn processor_fn<F, Fut>(process_events: F) -> ProcessorFn<F>
where
    F: Fn(PartitionContext, Vec<ReceivedEvent>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    ProcessorFn {
        process_events: Arc::new(process_events),
    }
}

struct FnProcessor<F> {
    process_events: Arc<F>,
}

#[async_trait::async_trait]
impl<F, Fut> EventProcessor for FnProcessor<F>
where
    F: Fn(PartitionContext, Vec<ReceivedEvent>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    async fn process_events(&mut self, context: &PartitionContext, events: Vec<ReceivedEvent>) {
        (self.process_events)(context.clone(), events).await;
    }
}

impl<F, Fut> EventProcessorFactory for ProcessorFn<F>
where
    F: Fn(PartitionContext, Vec<ReceivedEvent>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    fn create_processor(&self, _context: &PartitionContext) -> Box<dyn EventProcessor> {
        Box::new(FnProcessor {
            process_events: Arc::clone(&self.process_events),
        })
    }
}

/// Where one partition is, handed to every [`EventProcessor`] call. Cheap to clone; clones share
/// state.
#[derive(Clone)]
pub struct PartitionContext {
    shared: Arc<ContextShared>,
}

struct ContextShared {
    fully_qualified_namespace: String,
    event_hub_name: String,
    consumer_group: String,
    partition_id: String,
    owner_id: String,
    store: Arc<dyn CheckpointStore>,
    state: Mutex<ContextState>,
}

#[derive(Debug, Default)]
struct ContextState {
    /// (offset, sequence number) of the last event delivered to `process_events`.
    last_delivered: Option<(u64, i64)>,
    last_enqueued: Option<LastEnqueuedEventProperties>,
    ownership_lost: bool,
}

impl std::fmt::Debug for PartitionContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionContext")
            .field("partition_id", &self.shared.partition_id)
            .field("event_hub_name", &self.shared.event_hub_name)
            .field("consumer_group", &self.shared.consumer_group)
            .field("owner_id", &self.shared.owner_id)
            .finish_non_exhaustive()
    }
}

/// What a [`PartitionContext`] is about.
#[derive(Debug, Clone)]
pub(crate) struct ContextScope {
    pub(crate) fully_qualified_namespace: String,
    pub(crate) event_hub_name: String,
    pub(crate) consumer_group: String,
    pub(crate) partition_id: String,
    pub(crate) owner_id: String,
}

impl PartitionContext {
    pub(crate) fn new(scope: ContextScope, store: Arc<dyn CheckpointStore>) -> Self {
        assert!(!scope.owner_id.is_empty());
        assert!(!scope.partition_id.is_empty());
        PartitionContext {
            shared: Arc::new(ContextShared {
                fully_qualified_namespace: scope.fully_qualified_namespace,
                event_hub_name: scope.event_hub_name,
                consumer_group: scope.consumer_group,
                partition_id: scope.partition_id,
                owner_id: scope.owner_id,
                store,
                state: Mutex::new(ContextState::default()),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, ContextState> {
        // Every update is a single field store, so a poisoned lock is still consistent.
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The partition.
    pub fn partition_id(&self) -> &str {
        &self.shared.partition_id
    }

    /// The namespace's host name.
    pub fn fully_qualified_namespace(&self) -> &str {
        &self.shared.fully_qualified_namespace
    }

    /// The event hub.
    pub fn event_hub_name(&self) -> &str {
        &self.shared.event_hub_name
    }

    /// The consumer group.
    pub fn consumer_group(&self) -> &str {
        &self.shared.consumer_group
    }

    /// This host's name, the owner on record while it holds the partition.
    pub fn owner_id(&self) -> &str {
        &self.shared.owner_id
    }

    /// The partition's newest event as last reported by the hub; `None` unless
    /// `track_last_enqueued_event_properties` is on and a receive has reported it.
    pub fn last_enqueued_event_properties(&self) -> Option<LastEnqueuedEventProperties> {
        self.state().last_enqueued
    }

    /// Checkpoints the last event delivered to `process_events` (a high-water mark: everything
    /// delivered so far counts as processed). Does nothing if no event has been delivered yet.
    ///
    /// Fails with [`StoreError::OwnershipLost`] once another host owns the partition; the pump
    /// then stops after the current call and closes with [`CloseReason::OwnershipLost`].
    pub async fn checkpoint(&self) -> Result<(), StoreError> {
        let last_delivered = self.state().last_delivered;
        match last_delivered {
            Some((offset, sequence_number)) => self.write_checkpoint(offset, sequence_number).await,
            None => Ok(()),
        }
    }

    /// Checkpoints `event` (a low-water mark: `event` and everything before it count as
    /// processed; reading resumes after it). Fails like [`checkpoint`](Self::checkpoint).
    pub async fn checkpoint_at(&self, event: &ReceivedEvent) -> Result<(), StoreError> {
        self.write_checkpoint(event.offset, event.sequence_number)
            .await
    }

    async fn write_checkpoint(&self, offset: u64, sequence_number: i64) -> Result<(), StoreError> {
        let checkpoint = Checkpoint {
            fully_qualified_namespace: self.shared.fully_qualified_namespace.clone(),
            event_hub_name: self.shared.event_hub_name.clone(),
            consumer_group: self.shared.consumer_group.clone(),
            partition_id: self.shared.partition_id.clone(),
            offset: Some(offset),
            sequence_number: Some(sequence_number),
        };
        let fence = OwnershipFence {
            owner_id: self.shared.owner_id.clone(),
        };
        let result = self
            .shared
            .store
            .update_checkpoint(checkpoint, &fence)
            .await;
        if let Err(StoreError::OwnershipLost { current_owner, .. }) = &result {
            tracing::info!(
                partition_id = self.partition_id(),
                new_owner = current_owner.as_str(),
                "checkpoint refused: the partition has another owner"
            );
            self.state().ownership_lost = true;
        }
        result
    }

    /// Called by the pump before handing `events` to the processor.
    pub(crate) fn record_delivery(&self, events: &[ReceivedEvent]) {
        if let Some(last) = events.last() {
            self.state().last_delivered = Some((last.offset, last.sequence_number));
        }
    }

    pub(crate) fn record_last_enqueued(&self, properties: Option<LastEnqueuedEventProperties>) {
        if properties.is_some() {
            self.state().last_enqueued = properties;
        }
    }

    /// Whether a checkpoint was refused because another host owns the partition.
    pub(crate) fn ownership_lost(&self) -> bool {
        self.state().ownership_lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{InMemoryCheckpointStore, Ownership};
    use tributary_event::EventData;

    fn event(sequence_number: i64) -> ReceivedEvent {
        ReceivedEvent {
            sequence_number,
            offset: u64::try_from(sequence_number).unwrap() * 100,
            enqueued_time_ms: 0,
            data: EventData::new(format!("event {sequence_number}")),
        }
    }

    async fn owned_context(store: &Arc<InMemoryCheckpointStore>, owner: &str) -> PartitionContext {
        let claim = Ownership {
            fully_qualified_namespace: "ns".to_owned(),
            event_hub_name: "hub".to_owned(),
            consumer_group: "$Default".to_owned(),
            partition_id: "0".to_owned(),
            owner_id: owner.to_owned(),
            last_modified_time_ms: 0,
            etag: None,
            version: 0,
        };
        store.claim_ownership(vec![claim]).await.unwrap();
        let scope = ContextScope {
            fully_qualified_namespace: "ns".to_owned(),
            event_hub_name: "hub".to_owned(),
            consumer_group: "$Default".to_owned(),
            partition_id: "0".to_owned(),
            owner_id: owner.to_owned(),
        };
        PartitionContext::new(scope, store.clone())
    }

    async fn stored_position(
        store: &InMemoryCheckpointStore,
    ) -> Option<(Option<u64>, Option<i64>)> {
        let checkpoints = store
            .list_checkpoints("ns", "hub", "$Default")
            .await
            .unwrap();
        checkpoints
            .first()
            .map(|checkpoint| (checkpoint.offset, checkpoint.sequence_number))
    }

    #[tokio::test]
    async fn checkpoint_marks_the_last_delivered_event_and_checkpoint_at_any_event() {
        let store = Arc::new(InMemoryCheckpointStore::new());
        let context = owned_context(&store, "host-a").await;
        context.checkpoint().await.unwrap();
        assert_eq!(stored_position(&store).await, None, "nothing delivered yet");

        let batch = vec![event(0), event(1), event(2)];
        context.record_delivery(&batch);
        context.checkpoint().await.unwrap();
        assert_eq!(stored_position(&store).await, Some((Some(200), Some(2))));

        context.checkpoint_at(&batch[0]).await.unwrap();
        assert_eq!(stored_position(&store).await, Some((Some(0), Some(0))));

        // An empty batch (a receive timeout) does not move the high-water mark.
        context.record_delivery(&[]);
        context.checkpoint().await.unwrap();
        assert_eq!(stored_position(&store).await, Some((Some(200), Some(2))));
        assert!(!context.ownership_lost());
    }

    #[tokio::test]
    async fn a_refused_checkpoint_marks_the_ownership_as_lost() {
        let store = Arc::new(InMemoryCheckpointStore::new());
        let context = owned_context(&store, "host-a").await;
        let records = store.list_ownership("ns", "hub", "$Default").await.unwrap();
        let mut steal = records[0].clone();
        steal.owner_id = "host-b".to_owned();
        assert_eq!(store.claim_ownership(vec![steal]).await.unwrap().len(), 1);

        let error = context.checkpoint_at(&event(5)).await.unwrap_err();
        assert!(matches!(error, StoreError::OwnershipLost { .. }), "{error}");
        assert!(context.ownership_lost());
        assert!(context.clone().ownership_lost(), "clones share state");
        assert_eq!(stored_position(&store).await, None);
    }

    #[test]
    fn last_enqueued_properties_keep_the_latest_report() {
        let store = Arc::new(InMemoryCheckpointStore::new());
        let scope = ContextScope {
            fully_qualified_namespace: "ns".to_owned(),
            event_hub_name: "hub".to_owned(),
            consumer_group: "$Default".to_owned(),
            partition_id: "3".to_owned(),
            owner_id: "me".to_owned(),
        };
        let context = PartitionContext::new(scope, store);
        assert_eq!(context.last_enqueued_event_properties(), None);
        let reported = LastEnqueuedEventProperties {
            sequence_number: 9,
            offset: 900,
            enqueued_time_ms: 5,
            retrieved_time_ms: 6,
        };
        context.record_last_enqueued(Some(reported));
        context.record_last_enqueued(None);
        assert_eq!(context.last_enqueued_event_properties(), Some(reported));
        assert_eq!(context.partition_id(), "3");
        assert_eq!(context.owner_id(), "me");
        assert_eq!(context.event_hub_name(), "hub");
        assert_eq!(context.consumer_group(), "$Default");
        assert_eq!(context.fully_qualified_namespace(), "ns");
    }
}
