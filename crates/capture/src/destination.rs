//! Where window files go: the [`Destination`] seam, and [`DirectoryDestination`] (`file:`).
//!
//! # Guarantees
//! A destination makes a window's file visible whole or not at all: [`Destination::create`]
//! writes under a temporary name, and [`PendingFile::publish`] makes the bytes durable, then
//! gives the file its archive name, then makes the name durable — for a directory: write the
//! file's last bytes and `fdatasync` it (its earlier bytes were written while the window was
//! encoded, so this waits for little), `rename`, `fsync` the directory (and every directory the
//! name created). A directory's files are written with `O_DIRECT` where the file system takes
//! it, by writer threads the destination keeps between files (see [`crate::file_writer`]). A
//! reader of archive names never sees a partial file. A temporary file a crash left behind is
//! found by [`Destination::leftovers`] and removed by [`Destination::remove_leftover`]; it
//! never becomes visible.
//!
//! `BlobDestination` (`crate::blob`, feature `blob`: a block list committed at once) implements
//! the same trait.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::CaptureError;
pub use crate::file_writer::WriteMode;
use crate::file_writer::{FileWriter, WritePool};

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
    mode: WriteMode,
    /// The write buffers and writer threads of its files, kept between files.
    pool: WritePool,
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
        Ok(DirectoryDestination {
            root,
            mode: WriteMode::Direct,
            pool: WritePool::default(),
        })
    }

    /// The same destination writing its files as `mode` says: [`WriteMode::Direct`] (the
    /// default) falls back to the page cache per file where the file system refuses
    /// `O_DIRECT`; [`WriteMode::Buffered`] always writes through it.
    pub fn with_write_mode(mut self, mode: WriteMode) -> DirectoryDestination {
        self.mode = mode;
        self
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
        let writer = FileWriter::create(&temporary, self.mode, self.pool.clone())
            .map_err(|e| CaptureError::io("create", &temporary, e))?;
        if writer.mode() != self.mode {
            tracing::debug!(file = %temporary.display(), "the file system refuses O_DIRECT: writing through the page cache");
        }
        Ok(Box::new(DirectoryFile {
            writer,
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

/// A file of a [`DirectoryDestination`] under its temporary name, written by its
/// [`FileWriter`]'s thread.
struct DirectoryFile {
    writer: FileWriter,
    temporary: PathBuf,
    path: PathBuf,
    parent: PathBuf,
}

impl Write for DirectoryFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writer.write(buf)?;
        Ok(buf.len())
    }

    /// Takes every slice whole, so a caller hands over a block of records in one call.
    fn write_vectored(&mut self, slices: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        let mut written = 0;
        for slice in slices {
            self.writer.write(slice)?;
            written += slice.len();
        }
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // Bytes go to the file a chunk at a time; `publish` writes the last ones.
        Ok(())
    }
}

impl PendingFile for DirectoryFile {
    fn publish(self: Box<Self>) -> Result<u64, CaptureError> {
        let DirectoryFile {
            writer,
            temporary,
            path,
            parent,
        } = *self;
        let (file, size) = writer
            .finish()
            .map_err(|e| CaptureError::io("write", &temporary, e))?;
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::limits::{SYNC_AHEAD_BYTES, WRITE_CHUNK_BYTES};

    const MODES: [WriteMode; 2] = [WriteMode::Direct, WriteMode::Buffered];

    #[test]
    fn a_file_is_visible_only_once_published_and_leftovers_are_found_and_removed() {
        for mode in MODES {
            let dir = tempfile::tempdir().unwrap();
            let destination = DirectoryDestination::new(dir.path().join("root"))
                .unwrap()
                .with_write_mode(mode);
            let name = "ns/hub/0/2023/09/15/14/42/31.avro";
            let mut file = destination.create(name).unwrap();
            file.write_all(b"window").unwrap();
            assert!(!destination.exists(name).unwrap());
            assert_eq!(destination.leftovers().unwrap(), [name]);
            assert_eq!(file.publish().unwrap(), 6, "{mode:?}");
            assert!(destination.exists(name).unwrap());
            assert_eq!(destination.size(name).unwrap(), 6, "{mode:?}");
            assert_eq!(std::fs::read(destination.path(name)).unwrap(), b"window");
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
    }

    #[test]
    fn a_file_of_many_chunks_written_while_encoding_is_published_whole() {
        for mode in MODES {
            let dir = tempfile::tempdir().unwrap();
            let destination = DirectoryDestination::new(dir.path())
                .unwrap()
                .with_write_mode(mode);
            let name = "big.avro";
            let mut file = destination.create(name).unwrap();
            // Pieces that straddle chunks, past two early syncs of the buffered path, and a
            // partial last block.
            let piece: Vec<u8> = (0..=255).cycle().take(WRITE_CHUNK_BYTES / 3 + 1).collect();
            let pieces = (2 * SYNC_AHEAD_BYTES as usize + 3 * WRITE_CHUNK_BYTES) / piece.len();
            for _ in 0..pieces {
                file.write_all(&piece).unwrap();
            }
            let size = (pieces * piece.len()) as u64;
            assert_eq!(file.publish().unwrap(), size, "{mode:?}");
            let bytes = std::fs::read(destination.path(name)).unwrap();
            assert_eq!(bytes.len() as u64, size, "{mode:?}");
            assert!(bytes.chunks(piece.len()).all(|c| c == piece.as_slice()));
        }
    }
}
