//! Event Hubs Capture for Tributary: each partition's events written, window by window, to Avro
//! files that a pipeline written against Azure Event Hubs Capture reads unchanged.
//!
//! - [`CaptureConfig`]: the time and size windows (Azure's ranges), skip-empty, the encoding
//!   (`Avro`, `AvroDeflate`, `Parquet`) and the [`ArchiveNameFormat`] (Azure's nine placeholders).
//! - [`avro`]: Azure's record schema and how an event becomes a record; [`window`]: the seam
//!   between a window and its file format (Avro, or Parquet with the `parquet` feature).
//! - [`Destination`]: where files go, written under a temporary name and published whole;
//!   [`DirectoryDestination`] (`file:`), and with the `blob` feature `BlobDestination`
//!   (`blob:`, block blobs in an Azure Storage container, committed whole).
//! - [`PartitionCapture`]: one partition, read from a [`tributary_broker::Broker`], exactly once
//!   across crashes; its [`progress`] file says where the next window starts.
//! - [`CaptureFileCreated`]: the notification of each file, in Event Grid's shape.
//!
//! - [`spec`]: a hub's capture as users give it (`DEST`, flags, Azure's `captureDescription`),
//!   checked in one place.
//! - [`CaptureRunner`]: every captured hub's partitions, stepped inside `serve`, with
//!   notifications, status, retries and the progress retention keeps.
//!
//! Time comes from a [`tributary_event::Clock`], so tests drive windows deterministically.

pub mod archive;
pub mod avro;
#[cfg(feature = "blob")]
pub mod blob;
pub mod config;
pub mod destination;
mod error;
mod file_writer;
pub mod limits;
pub mod notification;
#[cfg(feature = "parquet")]
pub mod parquet;
pub mod partition;
pub mod progress;
pub mod runner;
pub mod spec;
pub mod time_text;
pub mod window;

pub use archive::{ArchiveNameFormat, DEFAULT_ARCHIVE_NAME_FORMAT};
#[cfg(feature = "blob")]
pub use blob::BlobDestination;
pub use config::{CaptureConfig, CaptureFormat};
pub use destination::{Destination, DirectoryDestination, PendingFile, WriteMode};
pub use error::CaptureError;
pub use file_writer::writer_threads_cpu;
pub use notification::{CaptureFileCreated, EventGridEvent};
pub use partition::{CaptureTarget, PartitionCapture};
pub use progress::Progress;
pub use runner::CaptureRunner;
pub use spec::{CaptureDescription, CaptureSpec, DestinationSpec};
