//! The event processor host: partitioned consumers with ownership, checkpoints and load
//! balancing, as Event Processor Host and `EventProcessorClient` offer them for Azure Event Hubs.
//!
//! This crate owns everything between "a hub with partitions" and "user code that handles a
//! batch": which host of a consumer group reads which partition, where each partition resumes,
//! and moving partitions when hosts come and go. Its parts:
//!
//! - [`EventProcessorHost`] / [`RunningHost`]: one instance of a consumer application. It claims
//!   a fair share of the partitions, runs one pump per owned partition, renews its ownership, and
//!   hands partitions over on shutdown.
//! - [`EventProcessor`] (made per partition by an [`EventProcessorFactory`], or from a closure
//!   with [`processor_fn`]) and its [`PartitionContext`]: the user's side.
//! - [`CheckpointStore`] with [`InMemoryCheckpointStore`], with the `sqlite` feature (on by
//!   default) `SqliteCheckpointStore`, and with the `postgres` feature (off by default)
//!   `PostgresCheckpointStore`: the ownership and checkpoint records the hosts share.
//!   `store::open_url` opens any of them from a URL (`memory:`, `sqlite:PATH`, `postgres://…`).
//! - [`balance`]: the pure load-balancing function the host calls every cycle.
//! - [`PartitionSource`] / [`PartitionReceiver`] (from `tributary-source`, re-exported here): how
//!   events are read. This crate delegates all reading to them and knows no hub: the broker's
//!   `BrokerSource` reads an in-process broker, the AMQP client's `RemoteHub` a remote hub, and
//!   `tributary_source::testing::InMemoryPartitionSource` is a test double.
//!
//! # Delivery guarantees
//!
//! **At least once.** A partition resumes after its last checkpoint, so every event is delivered
//! at least once to some processor; events processed but not yet checkpointed when a partition
//! moves are delivered again to the next owner (make processing idempotent, or checkpoint more
//! often). Within a partition events arrive in order, one batch at a time.
//!
//! **No zombie reads, no zombie checkpoints.** Every claim of a partition bumps its ownership
//! version; the pump opens its receiver with that version as the epoch (owner level), so the hub
//! disconnects any former owner's receiver, and the store refuses a checkpoint from a host that
//! is no longer the owner ([`StoreError::OwnershipLost`]). A host that loses a partition closes
//! its processor with [`CloseReason::OwnershipLost`].
//!
//! **One host per partition at a time.** A partition stolen from a live owner starts only once
//! that owner has noticed in the store, or its fence has passed (the wait is explained in
//! `handoff.rs`). Where the store cannot show a former owner — a host that has just started
//! steals a partition stolen moments before from a host cut off from the store — the epoch
//! does it: the former owner's receiver is taken over when the new owner's opens, and the
//! batch it is processing is cancelled at its next await point, so the two overlap only until
//! the former owner hears of the takeover (at once in process; a detach's trip over AMQP).
//!
//! **Expiry without trusting clocks.** A host that stops renewing loses its partitions after
//! [`ProcessorOptions::ownership_expiration`], judged by each other host on its own monotonic
//! clock from the moment it last saw the record's version change.
//!
//! # Backpressure
//!
//! Pumps pull: a partition's next batch is requested only after `process_events` for the previous
//! one returned, so a slow processor slows its partition's reading rather than filling a queue.
//! What a receiver buffers ahead is bounded by [`ProcessorOptions::prefetch_count`], and a batch by
//! [`ProcessorOptions::batch_events_max`]. There are no other queues between the hub and the
//! processor. Partitions do not hold each other up: each pump is its own task.
//!
//! # Shutdown
//!
//! [`RunningHost::shutdown`] stops every pump between batches (a batch in progress finishes),
//! calls `close(Shutdown)` on each processor — a checkpoint written there is the one the next
//! owner starts from — and then relinquishes every partition, so other hosts take them over on
//! their next balancing cycle (within [`ProcessorOptions::load_balancing_interval`]) instead of
//! waiting for the ownership to expire. A processor that never returns delays shutdown.
//! [`RunningHost::abort`] does none of this, like a crash. Dropping a [`RunningHost`] starts the
//! graceful shutdown in the background.
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::time::Duration;
//!
//! use tributary_event::EventData;
//! use tributary_source::testing::InMemoryPartitionSource;
//! use tributary_processor::{
//!     CheckpointStore, EventProcessorHost, InMemoryCheckpointStore, ProcessorOptions,
//!     processor_fn,
//! };
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let source = Arc::new(InMemoryPartitionSource::new("example.test", "orders", 4));
//! for partition in ["0", "1", "2", "3"] {
//!     source.append(partition, vec![EventData::new("order placed")]);
//! }
//! let store = Arc::new(InMemoryCheckpointStore::new());
//!
//! let processed = Arc::new(AtomicUsize::new(0));
//! let counter = Arc::clone(&processed);
//! let factory = processor_fn(move |context, events| {
//!     let counter = Arc::clone(&counter);
//!     async move {
//!         counter.fetch_add(events.len(), Ordering::SeqCst);
//!         // High-water mark: everything delivered so far is done.
//!         if let Err(error) = context.checkpoint().await {
//!             eprintln!("partition {}: {error}", context.partition_id());
//!         }
//!     }
//! });
//!
//! let host = EventProcessorHost::builder(source, store.clone(), factory)
//!     .options(ProcessorOptions {
//!         consumer_group: "$Default".to_owned(),
//!         ..ProcessorOptions::default()
//!     })
//!     .build()?
//!     .start()?;
//! while processed.load(Ordering::SeqCst) < 4 {
//!     tokio::time::sleep(Duration::from_millis(10)).await;
//! }
//! assert_eq!(host.owned_partitions(), ["0", "1", "2", "3"]);
//! host.shutdown().await?;
//!
//! // Every partition was checkpointed and then relinquished.
//! let checkpoints = store.list_checkpoints("example.test", "orders", "$Default").await?;
//! assert_eq!(checkpoints.len(), 4);
//! let ownership = store.list_ownership("example.test", "orders", "$Default").await?;
//! assert!(ownership.iter().all(|record| record.owner_id.is_empty()));
//! # Ok(())
//! # }
//! ```

pub mod balance;
mod error;
mod handoff;
mod host;
pub mod limits;
mod options;
mod processor;
mod pump;
pub mod store;

pub use error::{HostError, InvalidOption};
pub use host::{EventProcessorHost, EventProcessorHostBuilder, RunningHost};
pub use options::{
    ErrorNotifier, InitialPositionProvider, LoadBalancingStrategy, ProcessorOptions,
    StartPositionOverride,
};
pub use processor::{
    CloseReason, EventProcessor, EventProcessorFactory, PartitionContext, PartitionError,
    ProcessorFn, processor_fn,
};
#[cfg(feature = "postgres")]
pub use store::PostgresCheckpointStore;
#[cfg(feature = "sqlite")]
pub use store::SqliteCheckpointStore;
#[cfg(feature = "blob")]
pub use store::{BlobCheckpointStore, BlobCredential};
pub use store::{
    Checkpoint, CheckpointStore, HostRecord, InMemoryCheckpointStore, Ownership, OwnershipFence,
    OwnershipListing, StoreError,
};
pub use tributary_source::{
    LastEnqueuedEventProperties, PartitionReceiver, PartitionSource, ReceiverOptions, SourceError,
};
