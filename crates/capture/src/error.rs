//! What can go wrong in a capture, and who is at fault.

use std::path::PathBuf;

/// An error of the capture engine. Each names the setting, file or partition it is about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// A setting is out of range or malformed (the caller's input).
    #[error("invalid capture setting {setting}: {reason}")]
    InvalidConfig {
        /// The setting, as a flag or property name.
        setting: &'static str,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// The archive name format is not one Azure accepts.
    #[error("invalid archive name format {format:?}: {reason}")]
    InvalidArchiveNameFormat {
        /// The format as given.
        format: String,
        /// What is wrong.
        reason: String,
    },
    /// A file or directory operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// On what.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A file the capture wrote earlier (a window's Avro file or the progress file) is not what
    /// the capture writes: changed or damaged from outside.
    #[error("{}: {reason}", path.display())]
    Corrupted {
        /// The file.
        path: PathBuf,
        /// What was found.
        reason: String,
    },
    /// Encoding a window's Avro file failed.
    #[error("writing the Avro file {name}: {reason}")]
    Avro {
        /// The archive name of the file.
        name: String,
        /// The encoder's message.
        reason: String,
    },
    /// Encoding a window's Parquet file failed.
    #[error("writing the Parquet file {name}: {reason}")]
    Parquet {
        /// The archive name of the file.
        name: String,
        /// The encoder's message.
        reason: String,
    },
    /// Reading the partition failed.
    #[error("reading partition {partition} of event hub {hub}: {source}")]
    Broker {
        /// The event hub.
        hub: String,
        /// The partition id.
        partition: String,
        /// The broker's error (boxed: it is large, and rare).
        source: Box<tributary_broker::BrokerError>,
    },
    /// A destination refused an operation (for a remote destination: its answer).
    #[error("destination {destination}: {reason}")]
    Destination {
        /// The destination, as its URL.
        destination: String,
        /// What happened.
        reason: String,
    },
}

impl CaptureError {
    /// An [`CaptureError::Io`] error.
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CaptureError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}
