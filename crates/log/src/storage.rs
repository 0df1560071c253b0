//! The storage seam: every file operation the log makes, behind one trait.
//!
//! The log touches the file system only through [`Storage`] (directories: create, list, lock,
//! sync; files: open, remove, rename; whole file systems: `syncfs`) and the [`StorageFile`]s it opens (positioned reads and
//! writes, length, preallocation, `fdatasync`/`fsync`). [`OsStorage`], the default, is a thin
//! pass-through to `std::fs` and `rustix`; a partition holds one `Arc<dyn Storage>` and each
//! segment one boxed file, so the seam costs a virtual call per system call.
//!
//! With the `fault-injection` feature, [`crate::faults`] provides an in-memory implementation
//! that fails, shortens, tears and slows operations on a seeded schedule, and simulates crashes.
//!
//! # Guarantees an implementation must give
//! - `write_all_at` either writes every byte or fails; on failure any prefix of the bytes may
//!   have been written (a short write followed by an error).
//! - Bytes are durable (survive a crash) only once a later `sync_data`/`sync_all` of the file,
//!   or a [`FileSystem::sync`] of its file system, has returned `Ok`; a directory entry
//!   (created, renamed, removed file) only once `sync_dir` of its directory has. A failed sync
//!   leaves durability unknown: the bytes it should have covered may or may not survive, and a
//!   later successful sync does not vouch for them — except that the next sync of a file that
//!   lost bytes fails too (Linux reports a lost write to every open file once).

use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use bytes::BytesMut;

/// How [`Storage::open`] opens a file. Every mode but `Read` opens for reading and writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// An existing file, read only.
    Read,
    /// An existing file.
    Existing,
    /// A new file; fails if it exists.
    CreateNew,
    /// Creates the file if missing and empties it.
    Replace,
    /// Creates the file if missing, keeping what it holds.
    CreateOrOpen,
}

/// The directory and file operations the log uses.
pub trait Storage: Send + Sync + Debug {
    /// Creates `dir` and its parents if missing.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Opens a file.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>>;
    /// The names of the entries of `dir` (names that are not UTF-8 are left out).
    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Removes a file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Renames a file, replacing `to` if it exists.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the entries of `dir` durable (created, renamed and removed files).
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// Takes an exclusive lock on the file `path` (creating it), held until the returned guard
    /// is dropped. Fails with [`io::ErrorKind::WouldBlock`] when another holder has it.
    fn lock_file(&self, path: &Path) -> io::Result<Box<dyn Debug + Send + Sync>>;
    /// The file system that holds directory `dir`, to sync whole (see [`FileSystem`]).
    fn file_system(&self, dir: &Path) -> io::Result<Box<dyn FileSystem>>;
}

/// A file system, held open to be synced whole.
pub trait FileSystem: Send + Sync + Debug {
    /// Tells file systems apart: two handles with the same id sync the same file system.
    fn id(&self) -> u64;
    /// `syncfs`: makes every file's data and metadata on the file system durable, as a sync of
    /// each file would. Fails if a write to any file of it failed since this handle was opened
    /// (and since the last time that failure was reported through it): which files lost bytes
    /// is then unknown, and a file's own sync reports its loss.
    fn sync(&self) -> io::Result<()>;
}

/// An open file.
pub trait StorageFile: Send + Sync + Debug {
    /// Fills `buf` from position `at`; fails if the file ends first.
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()>;
    /// Appends the `len` bytes at position `at` to `buf`; fails if the file ends first, and
    /// then leaves `buf` as it was. Reads' hot path: an implementation may read into `buf`'s
    /// spare capacity without clearing it first, which this default (zeros, then
    /// [`StorageFile::read_exact_at`]) does not.
    fn read_exact_appending(&self, buf: &mut BytesMut, len: usize, at: u64) -> io::Result<()> {
        let start = buf.len();
        buf.resize(start + len, 0);
        let read = self.read_exact_at(&mut buf[start..], at);
        if read.is_err() {
            buf.truncate(start);
        }
        read
    }
    /// Writes all of `buf` at position `at` (see the module's guarantees on failure).
    fn write_all_at(&self, buf: &[u8], at: u64) -> io::Result<()>;
    /// The file's length.
    fn size(&self) -> io::Result<u64>;
    /// Cuts or extends (with zeros) the file to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Reserves space so the file is at least `len` bytes long (zeros past the old end).
    /// Fails with [`io::ErrorKind::Unsupported`] where the file system cannot.
    fn allocate(&self, len: u64) -> io::Result<()>;
    /// `fdatasync`: makes the file's data (and its length) durable.
    fn sync_data(&self) -> io::Result<()>;
    /// `fsync`: makes the file's data and metadata durable.
    fn sync_all(&self) -> io::Result<()>;
}

/// The real file system.
#[derive(Debug, Clone, Copy, Default)]
pub struct OsStorage;

#[derive(Debug)]
struct OsFile(File);

impl Storage for OsStorage {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut options = OpenOptions::new();
        options.read(true).write(mode != OpenMode::Read);
        match mode {
            OpenMode::Read | OpenMode::Existing => {}
            OpenMode::CreateNew => {
                options.create_new(true);
            }
            OpenMode::Replace => {
                options.create(true).truncate(true);
            }
            OpenMode::CreateOrOpen => {
                options.create(true).truncate(false);
            }
        }
        Ok(Box::new(OsFile(options.open(path)?)))
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            if let Ok(name) = entry?.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn lock_file(&self, path: &Path) -> io::Result<Box<dyn Debug + Send + Sync>> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        match file.try_lock() {
            Ok(()) => Ok(Box::new(file)),
            Err(std::fs::TryLockError::WouldBlock) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the partition is open in another process",
            )),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }

    fn file_system(&self, dir: &Path) -> io::Result<Box<dyn FileSystem>> {
        let dir = File::open(dir)?;
        let device = dir.metadata()?.dev();
        Ok(Box::new(OsFileSystem { device, dir }))
    }
}

/// A file system, through a directory of it held open: `syncfs` reports a write failure to
/// each open file once, so every sync goes through the same one.
#[derive(Debug)]
struct OsFileSystem {
    device: u64,
    dir: File,
}

impl FileSystem for OsFileSystem {
    fn id(&self) -> u64 {
        self.device
    }

    fn sync(&self) -> io::Result<()> {
        rustix::fs::syncfs(&self.dir).map_err(io::Error::from)
    }
}

impl StorageFile for OsFile {
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, at)
    }

    /// Reads into the spare capacity: zeroing a buffer only for `pread` to overwrite it cost
    /// about a twentieth of a reader's CPU (BENCHMARKS.md, "Reads into memory not cleared").
    #[allow(unsafe_code)]
    fn read_exact_appending(&self, buf: &mut BytesMut, len: usize, at: u64) -> io::Result<()> {
        buf.reserve(len);
        let start = buf.len();
        let mut filled = 0;
        while filled < len {
            let spare = &mut buf.spare_capacity_mut()[filled..len];
            match rustix::io::pread(&self.0, spare, at + filled as u64) {
                Ok(([], _)) => {
                    return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
                }
                Ok((read, _)) => filled += read.len(),
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        // SAFETY: `pread` initialised the `len` bytes of spare capacity after `start`, each
        // exactly once (`filled` only grows by what a call returned as read).
        unsafe { buf.set_len(start + len) };
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], at: u64) -> io::Result<()> {
        self.0.write_all_at(buf, at)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        rustix::fs::fallocate(&self.0, rustix::fs::FallocateFlags::empty(), 0, len)
            .map_err(io::Error::from)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.0.sync_all()
    }
}

/// Reads a whole file.
pub(crate) fn read_whole(storage: &dyn Storage, path: &Path) -> io::Result<Vec<u8>> {
    let file = storage.open(path, OpenMode::Read)?;
    let len = usize::try_from(file.size()?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "file too large"))?;
    let mut buf = vec![0; len];
    file.read_exact_at(&mut buf, 0)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_of_one_file_system_share_its_id_and_it_syncs() {
        let root = tempfile::tempdir().unwrap();
        let (a, b) = (root.path().join("a"), root.path().join("b"));
        OsStorage.create_dir_all(&a).unwrap();
        OsStorage.create_dir_all(&b).unwrap();
        let fs_a = OsStorage.file_system(&a).unwrap();
        let fs_b = OsStorage.file_system(&b).unwrap();
        assert_eq!(fs_a.id(), fs_b.id());
        fs_a.sync().unwrap();
        let missing = OsStorage
            .file_system(&root.path().join("missing"))
            .unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn reads_appended_into_spare_capacity_match_the_file_and_a_short_file_changes_nothing() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("f");
        let content: Vec<u8> = (0..100_000_u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &content).unwrap();
        let file = OsStorage.open(&path, OpenMode::Read).unwrap();
        for (start, len) in [
            (0, 100_000),
            (1, 4096),
            (99_999, 1),
            (12_345, 0),
            (50_000, 50_000),
        ] {
            // Memory that held other bytes before, as a reused read buffer's does.
            let mut buf = BytesMut::with_capacity(len + 3);
            buf.extend_from_slice(&[0xEE; 3]);
            buf.extend_from_slice(&vec![0xAB; len]);
            buf.truncate(3);
            file.read_exact_appending(&mut buf, len, start as u64)
                .unwrap();
            assert_eq!(&buf[..3], &[0xEE; 3]);
            assert_eq!(&buf[3..], &content[start..start + len], "{start}+{len}");
        }
        let mut buf = BytesMut::from(&b"kept"[..]);
        let short = file.read_exact_appending(&mut buf, 10, 99_995).unwrap_err();
        assert_eq!(short.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(&buf[..], b"kept");
    }
}
