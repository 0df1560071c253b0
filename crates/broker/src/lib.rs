//! The broker core: a Tributary namespace in one process.
//!
//! A [`Broker`] owns a data directory. In it are event hubs (created, listed, described and
//! deleted through the broker; their definitions persist in the catalog), each with 1 to 1024
//! partitions — one [`tributary_log::PartitionLog`] each — and consumer groups (`$Default`
//! always, more up to a configurable limit, names compared case-insensitively).
//!
//! # Sending
//! [`Broker::send`] appends a batch to a partition chosen by id, by partition key (the Event Hubs
//! hash, so a key lands where it would on Azure) or round-robin, and returns once the batch is
//! acknowledged under the log's durability: with the default `fsync`, once it is on disk. A batch
//! is all or nothing.
//!
//! # Receiving
//! [`Broker::open_receiver`] opens a [`Receiver`] on (hub, consumer group, partition) from any
//! [`tributary_event::EventPosition`], under the epoch rules of Event Hubs (see [`epochs`]).
//! [`Receiver::receive`] returns a batch, waiting for the first event — woken by the append that
//! makes it visible, never by polling. A receiver displaced by a higher epoch gets the distinct
//! [`ReceiveError::Disconnected`] with [`DisconnectReason::Stolen`].
//!
//! # Ownership and checkpoints
//! The broker also hosts event processors' checkpoint store: per (hub, consumer group,
//! partition) an ownership record and a checkpoint, with conditional claims and fenced
//! checkpoints, kept durably in the data directory ([`Broker::claim_ownership`],
//! [`Broker::update_checkpoint`], [`Broker::processor_group_states`]; see `ownership_registry`).
//!
//! # Cleanup
//! A hub deletes old events by age and size (the default), compacts by partition key (keeping
//! the latest event of each key; every event must then carry a key), or both
//! ([`HubCleanup`]); [`Broker::update_hub`] changes that and the retention later, and a
//! background task compacts what is due (see `cleanup`).
//!
//! # Throttling
//! [`Broker::throttle`] holds the namespace's and hubs' ingress and egress limits (Event Hubs'
//! throughput units; see [`throttle`]): the front doors charge what they append and deliver to
//! it and answer in their protocol's way — the broker's own calls are never throttled.
//!
//! # Capture
//! A hub may carry an Event Hubs Capture ([`HubCapture`], set on create or by
//! [`Broker::update_hub`]); the capture itself runs above the broker and reports each
//! partition's progress ([`Broker::report_capture`]), which retention keeps (see `capture`).
//!
//! [`BrokerSource`] offers a hub of the broker as a `tributary_source::PartitionSource`, so an
//! event processor host (`tributary-processor`) reads it in process.
//!
//! # What it does not do
//! It knows no protocol: the AMQP and HTTP front doors translate to this API. Reads of the log
//! are synchronous file reads (from the page cache in the common case of a tailing reader),
//! bounded to [`receiver::RECEIVE_BYTES_MAX`] per call; catalog and hub changes run on the
//! blocking pool.

mod activity;
mod broker;
mod capture;
mod catalog;
mod cleanup;
pub mod config;
pub mod door_stamp;
pub mod epochs;
mod error;
mod hub;
mod ownership_registry;
pub mod receiver;
mod source;
pub mod throttle;

pub use activity::{OpenReceiverInfo, PartitionActivity};
pub use broker::{Broker, HubSpec, QueuedAppend, ReceiverSpec, SendReceipt};
pub use capture::{CaptureRetention, CaptureStatus};
pub use catalog::{
    ConsumerGroupDefinition, HubCapture, HubCleanup, HubDefinition, json_format_version,
};
pub use cleanup::{HubUpdate, SWEEP_INTERVAL_MS_MAX};
pub use config::BrokerConfig;
pub use door_stamp::{DOOR_STAMP_PROPERTY, DoorStamps};
pub use error::{BrokerError, DisconnectReason, ReceiveError};
pub use ownership_registry::{
    CheckpointRecord, OWNER_ID_BYTES_MAX, OWNER_RUNNING_WINDOW_MS, OwnershipClaim, OwnershipRecord,
    PROCESSOR_HOST_RETENTION_MS, ProcessorHostRecord, ProcessorPartitionState,
};
pub use receiver::{
    DisconnectWatch, LastEnqueuedEvent, RELEASE_BUFFERS_AFTER, Receiver, ReceiverPlace,
};
pub use source::BrokerSource;
pub use tributary_event::SendTarget;
pub use tributary_log::{
    CleanupPolicy, CompactionOutcome, CompactionState, Durability, DurationCounts, LogConfig,
    LogError, PartitionProperties, ReadCursor, RecordView, RecordsRead, SyncTimes, TailFollower,
};
