//! A window file of a `file:` destination written by a writer thread ([`FileWriter`]), from
//! buffers in huge pages, with `O_DIRECT` where the file system takes it.
//!
//! # Why
//! Capture writes every event it reads a second time. Through the page cache the kernel copies
//! each byte into a cache page, dirties and later writes it back: on this project's machine more
//! than half of the capture's CPU (BENCHMARKS.md, "Capture's CPU and lag"). With `O_DIRECT` the
//! device reads the bytes straight from the capture's buffers, so that copy is gone. What is
//! left of a write's cost is mostly pinning the buffer's pages for the device, one by one: a
//! buffer in one 2 MiB huge page is pinned at once.
//!
//! # How
//! The encoder copies bytes into the filling buffer; each full buffer ([`WRITE_CHUNK_BYTES`],
//! a huge page, at a chunk-aligned offset) goes to the file's writer thread,
//! which writes it while the encoder fills the next one: at most [`WRITE_BUFFERS`] buffers per
//! file, so the encoder waits only when the device is slower than it. A file has a thread to
//! itself while it is written; the destination keeps idle threads and buffers for its next
//! files. Only the last buffer of a file is partial: [`FileWriter::finish`] writes its whole
//! blocks, then its last partial block through the page cache (the file's `O_DIRECT` flag
//! cleared), and `fdatasync`s the file.
//!
//! Where `O_DIRECT` is refused at open (`EINVAL`: a file system without direct I/O), the same
//! writer thread writes through the page cache and `fdatasync`s every [`SYNC_AHEAD_BYTES`], so
//! the final sync waits for the last few MiB, not the whole file.
//!
//! # Guarantees
//! [`FileWriter::finish`] returns only once every byte handed to [`FileWriter::write`] is in
//! the file and durable (data and length), or with the first error the writer thread met. A
//! writer dropped without finishing waits for the writes it sent before the drop returns, so
//! no write of an abandoned file happens after it.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use memmap2::{Advice, MmapMut};

use crate::limits::{
    DIRECT_ALIGN_BYTES, HUGE_PAGE_BYTES, POOLED_BUFFERS_MAX, POOLED_WRITERS_MAX, SYNC_AHEAD_BYTES,
    WRITE_BUFFERS, WRITE_CHUNK_BYTES,
};

/// How a file's bytes reach the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// `O_DIRECT`: from the capture's aligned buffers, no page-cache copy.
    Direct,
    /// Through the page cache (where the file system refuses `O_DIRECT`, or when asked).
    Buffered,
}

/// [`WRITE_CHUNK_BYTES`] of memory starting at a [`HUGE_PAGE_BYTES`]-aligned address, and how
/// many of them are filled. A mapping of its own, one huge page longer, used from its first
/// aligned byte and advised into huge pages before it is first touched: an `O_DIRECT` write
/// then pins one page per 2 MiB, not 512. Where the kernel gives none (huge pages off, or none
/// free), the buffer works the same from small pages.
#[derive(Debug)]
pub(crate) struct AlignedBuffer {
    /// `None`: no memory, what a dropped writer leaves in place of its buffer.
    memory: Option<MmapMut>,
    start: usize,
    len: usize,
}

impl AlignedBuffer {
    fn new() -> std::io::Result<AlignedBuffer> {
        let memory = MmapMut::map_anon(WRITE_CHUNK_BYTES + HUGE_PAGE_BYTES)?;
        let address = memory.as_ptr() as usize;
        let start = (HUGE_PAGE_BYTES - address % HUGE_PAGE_BYTES) % HUGE_PAGE_BYTES;
        assert_eq!((address + start) % HUGE_PAGE_BYTES, 0);
        if let Err(e) = memory.advise_range(Advice::HugePage, start, WRITE_CHUNK_BYTES) {
            tracing::debug!(error = %e, "the kernel backs no capture write buffer with huge pages");
        }
        Ok(AlignedBuffer {
            memory: Some(memory),
            start,
            len: 0,
        })
    }

    fn empty() -> AlignedBuffer {
        AlignedBuffer {
            memory: None,
            start: 0,
            len: 0,
        }
    }

    fn has_memory(&self) -> bool {
        self.memory.is_some()
    }

    /// Copies as much of `bytes` as fits; returns how much.
    fn push(&mut self, bytes: &[u8]) -> usize {
        let Some(memory) = self.memory.as_mut() else {
            return 0;
        };
        let taken = bytes.len().min(WRITE_CHUNK_BYTES - self.len);
        memory[self.start + self.len..][..taken].copy_from_slice(&bytes[..taken]);
        self.len += taken;
        taken
    }

    /// Whether it holds all it can (a buffer without memory holds nothing more).
    fn is_full(&self) -> bool {
        !self.has_memory() || self.len == WRITE_CHUNK_BYTES
    }

    fn filled(&self) -> &[u8] {
        self.memory
            .as_deref()
            .map_or(&[], |memory| &memory[self.start..][..self.len])
    }
}

/// What a destination keeps between its files: write buffers, so a new window's file does not
/// fault in fresh memory (at most [`POOLED_BUFFERS_MAX`]), and idle writer threads, so a new
/// window's file does not start one (at most [`POOLED_WRITERS_MAX`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct WritePool {
    buffers: Arc<Mutex<Vec<AlignedBuffer>>>,
    writers: Arc<Mutex<Vec<WriterThread>>>,
}

impl WritePool {
    fn take_buffer(&self) -> std::io::Result<AlignedBuffer> {
        let pooled = self.buffers.lock().expect("buffer pool").pop();
        pooled.map_or_else(AlignedBuffer::new, Ok)
    }

    fn give_buffer(&self, mut buffer: AlignedBuffer) {
        buffer.len = 0;
        let mut pool = self.buffers.lock().expect("buffer pool");
        if pool.len() < POOLED_BUFFERS_MAX {
            pool.push(buffer);
        }
    }

    fn take_writer(&self) -> std::io::Result<WriterThread> {
        let pooled = self.writers.lock().expect("writer pool").pop();
        pooled.map_or_else(WriterThread::start, Ok)
    }

    /// Keeps `writer` for the next file, if the pool has room (else its thread ends).
    fn give_writer(&self, writer: WriterThread) {
        let mut pool = self.writers.lock().expect("writer pool");
        if pool.len() < POOLED_WRITERS_MAX {
            pool.push(writer);
        }
    }
}

/// A full buffer, where in which file it goes, and whether to `fdatasync` the file after it.
struct Chunk {
    file: Arc<File>,
    buffer: AlignedBuffer,
    offset: u64,
    sync: bool,
}

/// A thread that writes the chunks it is sent, in order, and sends each buffer back (or the
/// error that kept it from being written); kept in a [`WritePool`] between files.
#[derive(Debug)]
struct WriterThread {
    chunks: SyncSender<Chunk>,
    written: Receiver<std::io::Result<AlignedBuffer>>,
    thread: Option<JoinHandle<()>>,
}

impl WriterThread {
    fn start() -> std::io::Result<WriterThread> {
        let (chunks, to_write) = sync_channel(WRITE_BUFFERS);
        let (done, written) = sync_channel(WRITE_BUFFERS);
        let thread = std::thread::Builder::new()
            .name("capture-write".into())
            .spawn(move || write_chunks(&to_write, &done))?;
        Ok(WriterThread {
            chunks,
            written,
            thread: Some(thread),
        })
    }
}

impl Drop for WriterThread {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it has written what it was sent.
        let (closed, _) = sync_channel(0);
        drop(std::mem::replace(&mut self.chunks, closed));
        if let Some(thread) = self.thread.take() {
            // The thread only writes and sends; a panic there is a bug shown by its own message.
            let _ = thread.join();
        }
    }
}

/// A file being written by a writer thread (its own while the file is open). See the module
/// docs.
pub(crate) struct FileWriter {
    file: Arc<File>,
    mode: WriteMode,
    filling: AlignedBuffer,
    /// Where `filling`'s first byte goes: every byte before it was handed to the thread.
    filling_offset: u64,
    /// Through the page cache: how far the file was last `fdatasync`ed (by the thread).
    synced_to: u64,
    /// Buffers handed to the thread and not yet given back.
    in_flight: usize,
    /// `None` once given back to the pool (or lost with its thread).
    writer: Option<WriterThread>,
    pool: WritePool,
}

impl std::fmt::Debug for FileWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileWriter")
            .field("mode", &self.mode)
            .field("filling_offset", &self.filling_offset)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl FileWriter {
    /// Creates (or truncates) `path` and takes a writer thread from `pool` (or starts one):
    /// `O_DIRECT` if `mode` asks for it and the file system takes it, else through the page
    /// cache.
    pub(crate) fn create(
        path: &Path,
        mode: WriteMode,
        pool: WritePool,
    ) -> std::io::Result<FileWriter> {
        let (file, mode) = open(path, mode)?;
        let filling = pool.take_buffer()?;
        let writer = pool.take_writer()?;
        Ok(FileWriter {
            file: Arc::new(file),
            mode,
            filling,
            filling_offset: 0,
            synced_to: 0,
            in_flight: 0,
            writer: Some(writer),
            pool,
        })
    }

    /// How the bytes reach the device.
    pub(crate) fn mode(&self) -> WriteMode {
        self.mode
    }

    /// Appends `bytes`; hands each buffer that fills to the writer thread. An error is the
    /// first one the thread met.
    pub(crate) fn write(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let taken = self.filling.push(bytes);
            bytes = &bytes[taken..];
            if self.filling.is_full() {
                self.hand_off()?;
            }
        }
        Ok(())
    }

    fn writer(&self) -> std::io::Result<&WriterThread> {
        self.writer.as_ref().ok_or_else(thread_ended)
    }

    /// Sends the full buffer to the thread, then takes the next one to fill: from the pool
    /// while fewer than [`WRITE_BUFFERS`] are in use, else the oldest in flight once the thread
    /// has written it (the one just sent is then already queued behind it).
    fn hand_off(&mut self) -> std::io::Result<()> {
        if !self.filling.has_memory() {
            return Err(abandoned());
        }
        assert!(self.filling.is_full());
        let end = self.filling_offset + WRITE_CHUNK_BYTES as u64;
        let sync = self.mode == WriteMode::Buffered && end - self.synced_to >= SYNC_AHEAD_BYTES;
        let chunk = Chunk {
            file: Arc::clone(&self.file),
            buffer: std::mem::replace(&mut self.filling, AlignedBuffer::empty()),
            offset: self.filling_offset,
            sync,
        };
        // After an error the file is abandoned: a buffer without memory stays in place, and
        // every later write fails.
        let sent = self
            .writer()
            .and_then(|w| w.chunks.send(chunk).map_err(|_| thread_ended()));
        if let Err(e) = sent {
            self.writer = None;
            return Err(e);
        }
        self.in_flight += 1;
        self.filling_offset = end;
        if sync {
            self.synced_to = end;
        }
        self.filling = if self.in_flight < WRITE_BUFFERS {
            self.pool.take_buffer()?
        } else {
            self.wait_for_one()?
        };
        Ok(())
    }

    /// Waits for the oldest buffer in flight to be written and takes it back.
    fn wait_for_one(&mut self) -> std::io::Result<AlignedBuffer> {
        let outcome = match self.writer().map(|writer| writer.written.recv()) {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => {
                // The thread is gone (it panicked): so is the writer.
                self.writer = None;
                Err(thread_ended())
            }
            Err(e) => Err(e),
        };
        self.in_flight = self.in_flight.saturating_sub(1);
        let mut buffer = outcome?;
        buffer.len = 0;
        Ok(buffer)
    }

    /// Waits for every buffer in flight (giving each back to the pool); the first error the
    /// thread met, if any.
    fn wait_for_all(&mut self) -> std::io::Result<()> {
        let mut first_error = None;
        while self.in_flight > 0 {
            match self.wait_for_one() {
                Ok(buffer) => self.pool.give_buffer(buffer),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Writes what is left and `fdatasync`s the file; returns the file and its length in bytes.
    pub(crate) fn finish(mut self) -> std::io::Result<(Arc<File>, u64)> {
        if !self.filling.has_memory() {
            return Err(abandoned());
        }
        self.wait_for_all()?;
        if let Some(writer) = self.writer.take() {
            self.pool.give_writer(writer);
        }
        let mut offset = self.filling_offset;
        let len = offset + self.filling.len as u64;
        let mut rest = self.filling.filled();
        if self.mode == WriteMode::Direct {
            // The whole blocks go as the chunks did; the last partial block through the page
            // cache. Written padded, the file would then be cut back to its length, and cutting
            // an `O_DIRECT` file inside a block reads that block back first, synchronously.
            let blocks = rest.len() / DIRECT_ALIGN_BYTES * DIRECT_ALIGN_BYTES;
            self.file.write_all_at(&rest[..blocks], offset)?;
            (offset, rest) = (offset + blocks as u64, &rest[blocks..]);
            let flags = rustix::fs::fcntl_getfl(&*self.file)?;
            rustix::fs::fcntl_setfl(&*self.file, flags - rustix::fs::OFlags::DIRECT)?;
        }
        self.file.write_all_at(rest, offset)?;
        self.file.sync_data()?;
        Ok((Arc::clone(&self.file), len))
    }
}

impl Drop for FileWriter {
    fn drop(&mut self) {
        // An abandoned file: the writes already sent finish before the drop returns (so none
        // happens after it), and the thread goes back to the pool.
        let _ = self.wait_for_all();
        if let Some(writer) = self.writer.take() {
            self.pool.give_writer(writer);
        }
        let filling = std::mem::replace(&mut self.filling, AlignedBuffer::empty());
        if filling.has_memory() {
            self.pool.give_buffer(filling);
        }
    }
}

/// What a write or finish of a file abandoned after an error (its buffer gone) meets.
fn abandoned() -> std::io::Error {
    std::io::Error::other("the window file was abandoned after an earlier error")
}

fn thread_ended() -> std::io::Error {
    std::io::Error::other("the capture's writer thread ended")
}

/// Opens `path` for writing, truncated, with `O_DIRECT` if `mode` asks for it and the file
/// system takes it.
fn open(path: &Path, mode: WriteMode) -> std::io::Result<(File, WriteMode)> {
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if mode == WriteMode::Direct {
        let direct = options
            .clone()
            .custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32)
            .open(path);
        match direct {
            Ok(file) => return Ok((file, WriteMode::Direct)),
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {}
            Err(e) => return Err(e),
        }
    }
    Ok((options.open(path)?, WriteMode::Buffered))
}

/// The CPU time the writer threads have used, counted after each chunk, in nanoseconds.
static WRITER_THREADS_CPU_NS: AtomicU64 = AtomicU64::new(0);

/// The CPU time the writer threads of every window file have used (up to each one's last
/// chunk): the share of a capture's cost that its stepping thread does not see (for measuring
/// it).
pub fn writer_threads_cpu() -> Duration {
    Duration::from_nanos(WRITER_THREADS_CPU_NS.load(Ordering::Relaxed))
}

/// The calling thread's CPU time, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// A writer thread: writes each chunk at its offset (and `fdatasync`s the file when the chunk
/// asks), sends its buffer back or the error, and adds its CPU time to
/// [`WRITER_THREADS_CPU_NS`]; ends when the sending side is gone.
fn write_chunks(chunks: &Receiver<Chunk>, done: &SyncSender<std::io::Result<AlignedBuffer>>) {
    let mut counted = thread_cpu_ns();
    for Chunk {
        file,
        buffer,
        offset,
        sync,
    } in chunks
    {
        let mut outcome = file.write_all_at(buffer.filled(), offset);
        if outcome.is_ok() && sync {
            outcome = file.sync_data();
        }
        drop(file);
        let now = thread_cpu_ns();
        WRITER_THREADS_CPU_NS.fetch_add(now - counted, Ordering::Relaxed);
        counted = now;
        if done.send(outcome.map(|()| buffer)).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    /// Writes `bytes` in uneven pieces and checks the file holds exactly them.
    fn write_and_check(mode: WriteMode, bytes: &[u8]) -> WriteMode {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("window.avro");
        let mut writer = FileWriter::create(&path, mode, WritePool::default()).unwrap();
        let used = writer.mode();
        for piece in bytes.chunks(300_007) {
            writer.write(piece).unwrap();
        }
        let (_, len) = writer.finish().unwrap();
        assert_eq!(len, bytes.len() as u64);
        let read = std::fs::read(&path).unwrap();
        assert_eq!(read.len(), bytes.len());
        assert!(read == bytes, "the file holds other bytes than written");
        used
    }

    #[test]
    fn direct_and_buffered_files_hold_exactly_what_was_written() {
        // Chunk-exact, one byte past, a partial block, empty: the tail cases of `finish`.
        for len in [
            3 * WRITE_CHUNK_BYTES,
            3 * WRITE_CHUNK_BYTES + 1,
            WRITE_CHUNK_BYTES / 2 + 100,
            7,
            0,
        ] {
            let bytes = pattern(len);
            // The tests' temporary directory is on ext4 here, which takes O_DIRECT.
            assert_eq!(
                write_and_check(WriteMode::Direct, &bytes),
                WriteMode::Direct
            );
            assert_eq!(
                write_and_check(WriteMode::Buffered, &bytes),
                WriteMode::Buffered
            );
        }
    }

    #[test]
    fn buffers_are_aligned_and_pooled_across_files() {
        let pool = WritePool::default();
        let buffer = pool.take_buffer().unwrap();
        assert_eq!(buffer.filled().as_ptr() as usize % HUGE_PAGE_BYTES, 0);
        pool.give_buffer(buffer);
        let dir = tempfile::tempdir().unwrap();
        let mut writer =
            FileWriter::create(&dir.path().join("f"), WriteMode::Direct, pool.clone()).unwrap();
        writer.write(&pattern(2 * WRITE_CHUNK_BYTES + 5)).unwrap();
        writer.finish().unwrap();
        let pooled = pool.buffers.lock().unwrap().len();
        assert!((1..=WRITE_BUFFERS).contains(&pooled), "{pooled} pooled");
    }

    /// The `AnonHugePages` of the mapping holding `address`, in KiB, from `/proc/self/smaps`.
    fn anon_huge_kib_at(address: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_once(' ').map(|(range, _)| range);
            let bounds = range
                .and_then(|range| range.split_once('-'))
                .and_then(|(start, end)| {
                    let start = usize::from_str_radix(start, 16).ok()?;
                    Some(start..usize::from_str_radix(end, 16).ok()?)
                });
            if let Some(bounds) = bounds {
                inside = bounds.contains(&address);
                continue;
            }
            if let Some(kib) = line.strip_prefix("AnonHugePages:").filter(|_| inside) {
                return kib.trim().trim_end_matches(" kB").trim().parse().unwrap();
            }
        }
        panic!("no mapping holds {address:#x}");
    }

    #[test]
    fn write_buffers_are_huge_pages_where_the_kernel_has_them() {
        let huge_pages = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|setting| !setting.contains("[never]"));
        let mut buffer = AlignedBuffer::new().unwrap();
        assert_eq!(
            buffer.push(&pattern(WRITE_CHUNK_BYTES + 1)),
            WRITE_CHUNK_BYTES
        );
        assert!(buffer.is_full());
        let huge_kib = anon_huge_kib_at(buffer.filled().as_ptr() as usize);
        if huge_pages {
            assert!(
                huge_kib >= (WRITE_CHUNK_BYTES / 1024) as u64,
                "{huge_kib} KiB"
            );
        } else {
            assert_eq!(huge_kib, 0);
        }
        assert_eq!(buffer.filled(), &pattern(WRITE_CHUNK_BYTES)[..]);
    }

    #[test]
    fn a_file_abandoned_after_an_error_refuses_writes_and_finish() {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = FileWriter::create(
            &dir.path().join("f"),
            WriteMode::Direct,
            WritePool::default(),
        )
        .unwrap();
        // The writer thread gone, as after it panicked: the next hand-off fails.
        drop(writer.writer.take());
        assert!(writer.write(&pattern(WRITE_CHUNK_BYTES)).is_err());
        assert!(!writer.filling.has_memory());
        assert!(
            writer.write(b"more").is_err(),
            "a write after the error fails"
        );
        assert!(writer.finish().is_err(), "no file is finished short");
    }

    #[test]
    fn a_writer_thread_serves_file_after_file_and_its_cpu_is_counted() {
        let pool = WritePool::default();
        let dir = tempfile::tempdir().unwrap();
        let thread_of = |pool: &WritePool| {
            let writers = pool.writers.lock().unwrap();
            assert_eq!(writers.len(), 1, "one idle writer thread between files");
            writers[0].thread.as_ref().unwrap().thread().id()
        };
        let mut threads = Vec::new();
        for (n, mode) in [WriteMode::Direct, WriteMode::Buffered, WriteMode::Direct]
            .into_iter()
            .enumerate()
        {
            let path = dir.path().join(format!("f{n}"));
            let mut writer = FileWriter::create(&path, mode, pool.clone()).unwrap();
            assert!(
                pool.writers.lock().unwrap().is_empty(),
                "the file holds the thread"
            );
            let cpu_before = writer_threads_cpu();
            let bytes = pattern(3 * WRITE_CHUNK_BYTES + 17);
            writer.write(&bytes).unwrap();
            if n == 2 {
                // An abandoned file gives its thread back too, once its writes are done.
                drop(writer);
            } else {
                writer.finish().unwrap();
                assert_eq!(std::fs::read(&path).unwrap(), bytes);
            }
            assert!(
                writer_threads_cpu() > cpu_before,
                "the thread's CPU is counted"
            );
            threads.push(thread_of(&pool));
        }
        assert!(threads.windows(2).all(|t| t[0] == t[1]), "{threads:?}");
    }

    #[test]
    fn a_dropped_writer_stops_its_thread_and_leaves_what_it_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("abandoned");
        let mut writer =
            FileWriter::create(&path, WriteMode::Direct, WritePool::default()).unwrap();
        writer.write(&pattern(2 * WRITE_CHUNK_BYTES + 9)).unwrap();
        drop(writer);
        // Whole chunks may have reached the file; the unfinished tail never does.
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len <= 2 * WRITE_CHUNK_BYTES as u64, "{len}");
        assert_eq!(len % WRITE_CHUNK_BYTES as u64, 0);
    }
}
