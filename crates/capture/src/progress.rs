//! A partition's capture progress: a small versioned JSON file, replaced atomically.
//!
//! It says where the next window starts: the sequence number of its first event
//! (`next_sequence`) and its start time (`window_start_ms`, which names its file). It is
//! written when a capture starts, and after each window only once that window's file is
//! durable (or, with skip-empty, once an empty window is passed over). Each write is a
//! temporary file, `fsync`, `rename`, `fsync` of the directory: after a crash the file holds
//! the old progress or the new, never a mix.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::destination::{create_dirs_durably, write_atomically};
use crate::error::CaptureError;
use crate::limits::PROGRESS_FILE_BYTES_MAX;

/// The version this build writes and reads.
pub const PROGRESS_VERSION: u32 = 1;

/// Where the next window of one partition starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// The sequence number of the next window's first event.
    pub next_sequence: i64,
    /// When the next window started, ms since the Unix epoch (UTC); its archive name's time.
    pub window_start_ms: i64,
}

#[derive(Debug, Serialize, Deserialize)]
struct ProgressFile {
    version: u32,
    hub: String,
    partition: String,
    #[serde(flatten)]
    progress: Progress,
}

/// The progress file of one partition.
#[derive(Debug, Clone)]
pub struct ProgressStore {
    path: PathBuf,
    state_dir: PathBuf,
    hub: String,
    partition: String,
}

impl ProgressStore {
    /// The progress file of (`hub`, `partition`) in `state_dir`: `<hub, lower case>/<partition>.json`.
    pub fn new(state_dir: &Path, hub: &str, partition: &str) -> ProgressStore {
        let path = state_dir
            .join(tributary_event::names::name_key(hub))
            .join(format!("{partition}.json"));
        ProgressStore {
            path,
            state_dir: state_dir.to_path_buf(),
            hub: hub.to_owned(),
            partition: partition.to_owned(),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The recorded progress, or `None` if the capture never started.
    pub fn load(&self) -> Result<Option<Progress>, CaptureError> {
        let corrupted = |reason: String| CaptureError::Corrupted {
            path: self.path.clone(),
            reason,
        };
        let size = match std::fs::metadata(&self.path) {
            Ok(metadata) => metadata.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(CaptureError::io("stat", &self.path, e)),
        };
        if size > PROGRESS_FILE_BYTES_MAX {
            return Err(corrupted(format!(
                "{size} bytes is more than a progress file holds ({PROGRESS_FILE_BYTES_MAX})"
            )));
        }
        let bytes =
            std::fs::read(&self.path).map_err(|e| CaptureError::io("read", &self.path, e))?;
        let file: ProgressFile = serde_json::from_slice(&bytes)
            .map_err(|e| corrupted(format!("not a capture progress file: {e}")))?;
        if file.version != PROGRESS_VERSION {
            return Err(corrupted(format!(
                "version {} is not the version this build reads ({PROGRESS_VERSION})",
                file.version
            )));
        }
        if file.hub != self.hub || file.partition != self.partition {
            return Err(corrupted(format!(
                "it is the progress of partition {} of {}, not of partition {} of {}",
                file.partition, file.hub, self.partition, self.hub
            )));
        }
        if file.progress.next_sequence < 0 {
            return Err(corrupted(format!(
                "next_sequence {} is negative",
                file.progress.next_sequence
            )));
        }
        Ok(Some(file.progress))
    }

    /// Records `progress` durably (temporary file, `fsync`, `rename`, `fsync` directory).
    pub fn save(&self, progress: Progress) -> Result<(), CaptureError> {
        assert!(progress.next_sequence >= 0);
        let dir = self.path.parent().unwrap_or(&self.state_dir);
        std::fs::create_dir_all(&self.state_dir)
            .map_err(|e| CaptureError::io("create", &self.state_dir, e))?;
        create_dirs_durably(&self.state_dir, dir)?;
        let file = ProgressFile {
            version: PROGRESS_VERSION,
            hub: self.hub.clone(),
            partition: self.partition.clone(),
            progress,
        };
        let bytes = serde_json::to_vec_pretty(&file).expect("a progress file serialises");
        write_atomically(&self.path, &bytes)
    }
}
