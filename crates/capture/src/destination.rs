//! Where window files go: the [`Destination`] seam, and [`DirectoryDestination`] (`file:`).
//!
//! # Guarantees
//! A destination makes a window's file visible whole or not at all: [`Destination::create`]
//! writes under a temporary name, and [`PendingFile::publish`] makes the bytes durable, then
//! gives the file its archive name, then makes the name durable — for a directory: `fsync` the
//! file (synced ahead while it is written, so this waits for little), `rename`, `fsync` the
//! directory (and every directory the name created). A reader of archive names never sees a
//! partial file. A temporary file a crash left behind is found by
//! [`Destination::leftovers`] and removed by [`Destination::remove_leftover`]; it never
//! becomes visible.
//!
//! `BlobDestination` (`crate::blob`, feature `blob`: a block list committed at once) implements
//! the same trait.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::CaptureError;
use crate::limits::SYNC_AHEAD_BYTES;

/// What a temporary file's name adds to the archive name.
pub const TEMPORARY_SUFFIX: &str = ".capturing";

/// A place that stores window files under archive names (relative `/`-separated paths).
pub trait Destination: Send + Sync + std::fmt::Debug {
    /// Starts the file `name` under a temporary name, replacing a leftover one.
    fn create(&self, name: &str) -> Result<Box<dyn PendingFile>, CaptureError>;
    /// Whether a file is visible under `name`.
    fn exists(&self, name: &str) -> Result<bool, CaptureError>;
    /// Reads the visible file `name`.
    fn open(&self, name: &str) -> Result<Box<dyn Read + Send>, CaptureError>;
    /// The size in bytes of the visible file `name`.
    fn size(&self, name: &str) -> Result<u64, CaptureError>;
    /// Removes the temporary file of `name`, if a crash left one; whether there was one.
    fn remove_leftover(&self, name: &str) -> Result<bool, CaptureError>;
    /// The archive names whose temporary files are left anywhere in the destination.
    fn leftovers(&self) -> Result<Vec<String>, CaptureError>;
    /// The URL of the file `name`, for notifications.
    fn url(&self, name: &str) -> String;
    /// What notifications call the kind of file (Azure: `AzureBlockBlob`).
    fn file_type(&self) -> &'static str;
}

/// A window's file being written under its temporary name.
pub trait PendingFile: Write + Send {
    /// Makes the file durable and visible under its archive name; returns its size in bytes.
    fn publish(self: Box<Self>) -> Result<u64, CaptureError>;
}

/// A directory as a destination: archive names are paths below `root`.
#[derive(Debug, Clone)]
pub struct DirectoryDestination {
    root: PathBuf,
}

impl DirectoryDestination {
    /// A destination below `root`, created (durably) if missing.
    pub fn new(root: impl Into<PathBuf>) -> Result<DirectoryDestination, CaptureError> {
        let root = root.into();
        if !root.exists() {
            std::fs::create_dir_all(&root).map_err(|e| CaptureError::io("create", &root, e))?;
            if let Some(parent) = root.parent().filter(|p| !p.as_os_str().is_empty()) {
                sync_dir(parent)?;
            }
        }
        Ok(DirectoryDestination { root })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of archive name `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    fn temporary(&self, name: &str) -> PathBuf {
        self.root.join(format!("{name}{TEMPORARY_SUFFIX}"))
    }
}

impl Destination for DirectoryDestination {
    fn create(&self, name: &str) -> Result<Box<dyn PendingFile>, CaptureError> {
        let path = self.path(name);
        let parent = path.parent().unwrap_or(&self.root).to_path_buf();
        create_dirs_durably(&self.root, &parent)?;
        let temporary = self.temporary(name);
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&temporary)
            .map_err(|e| CaptureError::io("create", &temporary, e))?;
        Ok(Box::new(DirectoryFile {
            file: std::io::BufWriter::new(file),
            written: 0,
            sync_ahead_at: 0,
            syncing: None,
            temporary,
            path,
            parent,
        }))
    }

    fn exists(&self, name: &str) -> Result<bool, CaptureError> {
        let path = self.path(name);
        path.try_exists()
            .map_err(|e| CaptureError::io("look for", &path, e))
    }

    fn open(&self, name: &str) -> Result<Box<dyn Read + Send>, CaptureError> {
        let path = self.path(name);
        let file = File::open(&path).map_err(|e| CaptureError::io("open", &path, e))?;
        Ok(Box::new(std::io::BufReader::new(file)))
    }

    fn size(&self, name: &str) -> Result<u64, CaptureError> {
        let path = self.path(name);
        std::fs::metadata(&path)
            .map(|m| m.len())
            .map_err(|e| CaptureError::io("stat", &path, e))
    }

    fn remove_leftover(&self, name: &str) -> Result<bool, CaptureError> {
        let temporary = self.temporary(name);
        match std::fs::remove_file(&temporary) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(CaptureError::io("remove", &temporary, e)),
        }
    }

    fn leftovers(&self) -> Result<Vec<String>, CaptureError> {
        let mut found = Vec::new();
        let mut pending = vec![self.root.clone()];
        while let Some(dir) = pending.pop() {
            let entries = std::fs::read_dir(&dir).map_err(|e| CaptureError::io("list", &dir, e))?;
            for entry in entries {
                let entry = entry.map_err(|e| CaptureError::io("list", &dir, e))?;
                let path = entry.path();
                if path.is_dir() {
                    pending.push(path);
                } else if let Some(name) = self.leftover_name(&path) {
                    found.push(name);
                }
            }
        }
        found.sort();
        Ok(found)
    }

    fn url(&self, name: &str) -> String {
        format!("file://{}", self.path(name).display())
    }

    fn file_type(&self) -> &'static str {
        "File"
    }
}

impl DirectoryDestination {
    /// The archive name whose temporary file `path` is, if it is one.
    fn leftover_name(&self, path: &Path) -> Option<String> {
        let relative = path.strip_prefix(&self.root).ok()?.to_str()?;
        relative.strip_suffix(TEMPORARY_SUFFIX).map(str::to_owned)
    }
}

/// A file of a [`DirectoryDestination`] under its temporary name.
///
/// Every [`SYNC_AHEAD_BYTES`] written, it starts an `fdatasync` of the file on a thread of its
/// own (if the last one is done): the disk writes the window while the next blocks are encoded,
/// so the `fsync` at [`PendingFile::publish`] waits for the last few MiB, not the whole file.
/// A failed early sync fails the publish (its error is not left for the final `fsync`, which
/// might not see it again).
struct DirectoryFile {
    file: std::io::BufWriter<File>,
    written: u64,
    /// `written` when the last early sync started.
    sync_ahead_at: u64,
    syncing: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    temporary: PathBuf,
    path: PathBuf,
    parent: PathBuf,
}

impl DirectoryFile {
    /// Starts an early sync if [`SYNC_AHEAD_BYTES`] were written since the last one started and
    /// it is done; reports its error if it failed.
    fn sync_ahead(&mut self) -> std::io::Result<()> {
        if self.written - self.sync_ahead_at < SYNC_AHEAD_BYTES
            || self.syncing.as_ref().is_some_and(|s| !s.is_finished())
        {
            return Ok(());
        }
        self.wait_for_sync()?;
        let file = self.file.get_ref().try_clone()?;
        self.syncing = Some(std::thread::spawn(move || file.sync_data()));
        self.sync_ahead_at = self.written;
        Ok(())
    }

    /// Waits for the early sync under way, if any, and reports its outcome.
    fn wait_for_sync(&mut self) -> std::io::Result<()> {
        match self.syncing.take() {
            Some(syncing) => syncing
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("an early sync panicked"))),
            None => Ok(()),
        }
    }
}

impl Write for DirectoryFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.file.write(buf)?;
        self.written += written as u64;
        self.sync_ahead()?;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl PendingFile for DirectoryFile {
    fn publish(mut self: Box<Self>) -> Result<u64, CaptureError> {
        self.wait_for_sync()
            .map_err(|e| CaptureError::io("sync", &self.temporary, e))?;
        let DirectoryFile {
            file,
            temporary,
            path,
            parent,
            ..
        } = *self;
        let file = file
            .into_inner()
            .map_err(|e| CaptureError::io("write", &temporary, e.into_error()))?;
        file.sync_all()
            .map_err(|e| CaptureError::io("sync", &temporary, e))?;
        let size = file
            .metadata()
            .map_err(|e| CaptureError::io("stat", &temporary, e))?
            .len();
        drop(file);
        std::fs::rename(&temporary, &path)
            .map_err(|e| CaptureError::io("rename", &temporary, e))?;
        sync_dir(&parent)?;
        Ok(size)
    }
}

/// `fsync`s a directory, so the names created or renamed in it survive a crash.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), CaptureError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| CaptureError::io("sync", dir, e))
}

/// Creates `dir` (below `root`) and the directories above it that are missing, syncing the
/// parent of each one created so the new names survive a crash.
pub(crate) fn create_dirs_durably(root: &Path, dir: &Path) -> Result<(), CaptureError> {
    let mut missing = Vec::new();
    let mut at = dir;
    while at != root && !at.exists() {
        missing.push(at.to_path_buf());
        match at.parent() {
            Some(parent) => at = parent,
            None => break,
        }
    }
    for created in missing.iter().rev() {
        match std::fs::create_dir(created) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(CaptureError::io("create", created, e)),
        }
        if let Some(parent) = created.parent() {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically and durably: a temporary file beside it, `fsync`,
/// `rename`, `fsync` of the directory.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CaptureError> {
    let temporary = path.with_extension("tmp");
    let mut file =
        File::create(&temporary).map_err(|e| CaptureError::io("create", &temporary, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| CaptureError::io("write", &temporary, e))?;
    drop(file);
    std::fs::rename(&temporary, path).map_err(|e| CaptureError::io("rename", &temporary, e))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn a_file_is_visible_only_once_published_and_leftovers_are_found_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let destination = DirectoryDestination::new(dir.path().join("root")).unwrap();
        let name = "ns/hub/0/2023/09/15/14/42/31.avro";
        let mut file = destination.create(name).unwrap();
        file.write_all(b"window").unwrap();
        assert!(!destination.exists(name).unwrap());
        assert_eq!(destination.leftovers().unwrap(), [name]);
        assert_eq!(file.publish().unwrap(), 6);
        assert!(destination.exists(name).unwrap());
        assert_eq!(destination.size(name).unwrap(), 6);
        assert!(destination.leftovers().unwrap().is_empty());

        // A crash while writing leaves the temporary file; it is removed, never published.
        let other = "ns/hub/0/2023/09/15/14/43/31.avro";
        let mut file = destination.create(other).unwrap();
        file.write_all(b"half").unwrap();
        file.flush().unwrap();
        drop(file);
        assert_eq!(destination.leftovers().unwrap(), [other]);
        assert!(destination.remove_leftover(other).unwrap());
        assert!(!destination.remove_leftover(other).unwrap());
        assert!(!destination.exists(other).unwrap());
        assert!(destination.url(name).starts_with("file://"));
    }

    #[test]
    fn a_file_synced_ahead_while_written_is_published_whole() {
        let dir = tempfile::tempdir().unwrap();
        let destination = DirectoryDestination::new(dir.path()).unwrap();
        let name = "big.avro";
        let mut file = destination.create(name).unwrap();
        let chunk: Vec<u8> = (0..=255).cycle().take(1 << 20).collect();
        // Early syncs start at 4 and 8 MiB (or later, while one runs); the publish waits.
        let chunks = ((2 * SYNC_AHEAD_BYTES) >> 20) + 3;
        for _ in 0..chunks {
            file.write_all(&chunk).unwrap();
        }
        assert_eq!(file.publish().unwrap(), chunks << 20);
        let bytes = std::fs::read(destination.path(name)).unwrap();
        assert_eq!(bytes.len() as u64, chunks << 20);
        assert!(bytes.chunks(1 << 20).all(|c| c == chunk.as_slice()));
    }
}
