//! Group commit: appends made durable by `fdatasync`, one chain of syncs per partition.
//!
//! Appenders write their batch into the page cache themselves and then hand the committer a
//! [`PendingSync`]. If the partition has no sync in flight, a sync thread takes the append at
//! once: it calls `fdatasync` on the file and acknowledges. If a sync is in flight, the append
//! waits with the others that arrive meanwhile; when the sync returns and its appends are
//! acknowledged, everything that waited goes to the sync threads as the chain's next link, one
//! sync for all of them (behind the other partitions' links queued by then, so partitions
//! beyond the number of sync threads take turns). So each partition
//! has at most one sync in flight, one sync covers every append that waited on it, and the
//! partitions' chains are independent: an append waits for its own partition's sync in flight
//! and then its own, never for a slower file of another partition (which a shared round would
//! make it do — on a disk with a long `fdatasync` tail, the round's slowest file).
//!
//! With [`SyncScope::FileSystem`], a sync thread takes every link waiting for the sync threads
//! at once. When it took more than there are sync threads, or a `syncfs` is under way, the
//! links share `syncfs`es: it waits for the one under way, takes the links queued meanwhile
//! too, and syncs their file system once (one `syncfs` at a time, everything that arrives
//! during it joining the next). Otherwise each link gets its own `fdatasync`, which costs less
//! than a `syncfs` while few partitions sync. Hundreds of partitions with a batch each then
//! cost a device flush per round, not per partition. A `syncfs` reports a lost write of any
//! file once, so its failure cannot be pinned on the partitions it covered: after one fails,
//! the committer syncs file by file for good, and links a later `syncfs` covered are synced
//! file by file again, since each file's own `fdatasync` reports whether that file lost writes.

//! Partitions in `interval:<ms>` mode are acknowledged on write; the committer thread syncs
//! their files when their interval has passed. Partitions in `none` mode never reach it.
//!
//! # Guarantees
//! - An append in `fsync` mode is acknowledged, and becomes visible to readers, only after a sync
//!   that started after its bytes were written has returned successfully.
//! - Within a partition, appends are acknowledged and published in append order (one chain per
//!   partition; an append joins it in the order the partition's writer enqueues them).
//! - A failed sync poisons the partition: what is on disk is unknown (the kernel may have dropped
//!   the dirty pages), so the appends it covered fail, and so do those waiting behind it; later
//!   appends are refused until the partition is reopened and recovered. A failed `syncfs`
//!   poisons every partition whose link it covered.
//! - Dropping the last [`GroupCommitter`] waits until every append handed to it is acknowledged
//!   or failed.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use crate::SyncScope;
use crate::partition::{AppendCompletion, AppendReceipt, Committed, PartitionShared};
use crate::segment::Segment;
use crate::storage::{FileSystem, Storage};
use crate::sync_times::{SyncTimeRecorder, SyncTimes};

/// An append written to its segment and waiting to be synced.
pub(crate) struct PendingSync {
    pub partition: Arc<PartitionShared>,
    pub segment: Arc<Segment>,
    /// The partition's committed state once this append is durable.
    pub committed: Committed,
    pub receipt: AppendReceipt,
    pub completion: AppendCompletion,
    /// When its bytes were written and it was handed to the committer.
    pub handed_over: Instant,
}

/// A partition in interval mode with bytes not yet synced. The partition is held weakly: a log
/// that is closed is closed at once (its lock released), and its file still gets its sync.
struct DirtyPartition {
    partition: Weak<PartitionShared>,
    segment: Arc<Segment>,
    due: Instant,
}

/// A partition's identity in the chains: its shared state's address (held by every pending
/// append, and weakly by its running chain, so the address is not reused while it has either).
type PartitionKey = usize;

fn key_of(partition: &Arc<PartitionShared>) -> PartitionKey {
    Arc::as_ptr(partition) as PartitionKey
}

#[derive(Default)]
struct Queue {
    /// Partitions whose chain is running on a sync thread.
    in_flight: HashSet<PartitionKey>,
    /// Appends waiting for their partition's sync in flight, in append order.
    waiting: HashMap<PartitionKey, Vec<PendingSync>>,
    dirty: Vec<DirtyPartition>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the committer thread: an interval partition was marked dirty, shutdown began, or
    /// a chain ended during shutdown.
    wake: Condvar,
    /// The links waiting for a sync thread; closed (ending the sync threads once it is empty)
    /// when the committer thread stops.
    jobs: Mutex<Jobs>,
    /// Signalled when a link is queued and when the queue closes.
    job_queued: Condvar,
    /// How long the chains' syncs take.
    times: SyncTimeRecorder,
    /// What one sync covers.
    scope: SyncScope,
    /// How many sync threads there are: with [`SyncScope::FileSystem`], links of one file
    /// system share a `syncfs` when more of them wait than this (fewer are synced as fast by
    /// their own `fdatasync`s, side by side on the sync threads, and a `syncfs` costs more than
    /// one `fdatasync`).
    threads: usize,
    /// A `syncfs` failed: every sync since is a file's own.
    file_system_failed: AtomicBool,
    /// Held for each `syncfs`.
    file_system_sync: Mutex<()>,
    /// The file systems of the partitions opened so far, by id, each held open once (so every
    /// `syncfs` of a file system goes through the same handle, which reports each lost write).
    file_systems: Mutex<HashMap<u64, Arc<dyn FileSystem>>>,
}

/// The links waiting for a sync thread, in the order they were queued.
#[derive(Default)]
struct Jobs {
    links: std::collections::VecDeque<Chain>,
    closed: bool,
}

/// A link of a partition's chain: the appends one sync covers.
struct Chain {
    key: PartitionKey,
    appends: Vec<PendingSync>,
    /// A failed sync earlier in the chain: these appends fail without one.
    failure: Option<String>,
}

/// The group committer shared by the partitions of one data directory. Cheap to clone; its
/// threads stop when the last clone is dropped, after finishing the appends still queued.
#[derive(Clone)]
pub struct GroupCommitter {
    handle: Arc<CommitterHandle>,
}

struct CommitterHandle {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The committer thread and the sync threads: a completion running on one of them may drop
    /// the last handle, and a thread cannot wait for itself.
    own_threads: Vec<ThreadId>,
}

impl std::fmt::Debug for GroupCommitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommitter").finish_non_exhaustive()
    }
}

impl Default for GroupCommitter {
    fn default() -> Self {
        Self::start()
    }
}

impl GroupCommitter {
    /// Starts the committer thread and the sync threads, syncing file by file
    /// ([`SyncScope::File`]).
    pub fn start() -> GroupCommitter {
        Self::start_with(SyncScope::File)
    }

    /// Starts the committer thread and the sync threads, each sync covering `scope`.
    pub fn start_with(scope: SyncScope) -> GroupCommitter {
        Self::start_with_sync_threads(scope, crate::limits::SYNC_THREADS)
    }

    /// [`GroupCommitter::start_with`] with `threads` sync threads instead of
    /// [`crate::limits::SYNC_THREADS`]: tests use one, so links line up behind a held sync.
    #[doc(hidden)]
    pub fn start_with_sync_threads(scope: SyncScope, threads: usize) -> GroupCommitter {
        assert!(threads > 0, "a committer needs a sync thread");
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            jobs: Mutex::new(Jobs::default()),
            job_queued: Condvar::new(),
            times: SyncTimeRecorder::default(),
            scope,
            threads,
            file_system_failed: AtomicBool::new(false),
            file_system_sync: Mutex::new(()),
            file_systems: Mutex::new(HashMap::new()),
        });
        let mut own_threads = Vec::new();
        for i in 0..threads {
            let shared = shared.clone();
            let thread = std::thread::Builder::new()
                .name(format!("tributary-sync-{i}"))
                .spawn(move || {
                    while let Some(links) = next_links(&shared) {
                        run_links(&shared, links);
                    }
                })
                .expect("spawn a sync thread");
            own_threads.push(thread.thread().id());
        }
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("tributary-commit".into())
            .spawn(move || run(&thread_shared))
            .expect("spawn the group-commit thread");
        own_threads.push(thread.thread().id());
        GroupCommitter {
            handle: Arc::new(CommitterHandle {
                shared,
                thread: Mutex::new(Some(thread)),
                own_threads,
            }),
        }
    }

    pub(crate) fn enqueue(&self, pending: PendingSync) {
        let shared = &self.handle.shared;
        let key = key_of(&pending.partition);
        let mut queue = shared.queue.lock().expect("commit queue");
        assert!(!queue.shutdown, "append after the committer stopped");
        if queue.in_flight.contains(&key) {
            queue.waiting.entry(key).or_default().push(pending);
            return;
        }
        queue.in_flight.insert(key);
        drop(queue);
        let chain = Chain {
            key,
            appends: vec![pending],
            failure: None,
        };
        submit(shared, chain);
    }

    /// The syncs made so far for `fsync` appends (an `fdatasync`, or a `syncfs` shared by
    /// several partitions), and how long those appends waited for them.
    pub fn sync_times(&self) -> SyncTimes {
        self.handle.shared.times.snapshot()
    }

    /// What one sync covers.
    pub fn scope(&self) -> SyncScope {
        self.handle.shared.scope
    }

    /// The file system a partition in `dir` syncs through with [`SyncScope::FileSystem`]; none
    /// with [`SyncScope::File`], or where the storage cannot tell (the partition then syncs its
    /// own files).
    pub(crate) fn file_system_of(
        &self,
        storage: &dyn Storage,
        dir: &Path,
    ) -> Option<Arc<dyn FileSystem>> {
        let shared = &self.handle.shared;
        if shared.scope != SyncScope::FileSystem {
            return None;
        }
        let opened = match storage.file_system(dir) {
            Ok(opened) => opened,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot open the partition's file system to sync it whole; its files are synced one by one");
                return None;
            }
        };
        let mut file_systems = shared.file_systems.lock().expect("file systems");
        let held = file_systems
            .entry(opened.id())
            .or_insert_with(|| Arc::from(opened));
        Some(held.clone())
    }

    /// Registers an interval-mode partition as having unsynced bytes (once per interval).
    pub(crate) fn mark_dirty(
        &self,
        partition: Arc<PartitionShared>,
        segment: Arc<Segment>,
        interval: Duration,
    ) {
        let mut queue = self.handle.shared.queue.lock().expect("commit queue");
        if let Some(d) = queue
            .dirty
            .iter_mut()
            .find(|d| std::ptr::eq(d.partition.as_ptr(), Arc::as_ptr(&partition)))
        {
            d.segment = segment; // A roll synced the old one; the new one is what is dirty.
            return;
        }
        queue.dirty.push(DirtyPartition {
            partition: Arc::downgrade(&partition),
            segment,
            due: Instant::now() + interval,
        });
        drop(queue);
        self.handle.shared.wake.notify_one();
    }
}

impl Drop for CommitterHandle {
    fn drop(&mut self) {
        self.shared.queue.lock().expect("commit queue").shutdown = true;
        self.shared.wake.notify_one();
        // The last handle may be dropped by a completion running on one of the committer's own
        // threads; it cannot join, and the threads exit on their own once they see `shutdown`.
        if !self.own_threads.contains(&std::thread::current().id())
            && let Some(thread) = self.thread.lock().expect("thread handle").take()
        {
            let _ = thread.join();
        }
    }
}

/// The next links for a sync thread: one, or with [`SyncScope::FileSystem`] every link queued
/// by then (each of another partition). `None` once the queue is closed and empty.
fn next_links(shared: &Shared) -> Option<Vec<Chain>> {
    let mut jobs = shared.jobs.lock().expect("sync jobs");
    loop {
        if let Some(first) = jobs.links.pop_front() {
            let mut links = vec![first];
            if shared.scope == SyncScope::FileSystem {
                links.extend(jobs.links.drain(..));
            }
            return Some(links);
        }
        if jobs.closed {
            return None;
        }
        jobs = shared.job_queued.wait(jobs).expect("sync jobs");
    }
}

/// A sync thread's work on the links it took: sync them (see [`sync_links`]), then acknowledge
/// each one's appends and go on with its chain.
fn run_links(shared: &Shared, mut links: Vec<Chain>) {
    let failures = sync_links(shared, &mut links);
    for (link, failure) in links.into_iter().zip(failures) {
        finish_link(shared, link, failure);
    }
}

/// Syncs the links' files; the failure of each link, if any. Links already failed are not
/// synced.
///
/// With [`SyncScope::FileSystem`] (until a `syncfs` fails), the links share `syncfs`es when
/// there are more of them than sync threads, or when a `syncfs` is under way: then the thread
/// waits for it to end, takes every link queued meanwhile too (adding them to `links`), and
/// syncs each file system of theirs once. That makes the sync threads a convoy behind one
/// `syncfs` at a time while the load lasts, and leaves fewer links than threads, when nothing
/// else is syncing, to their own `fdatasync`s (cheaper than a `syncfs`, side by side on the
/// threads). Every link not covered by a `syncfs` syncs its own files.
fn sync_links(shared: &Shared, links: &mut Vec<Chain>) -> Vec<Option<String>> {
    let sharing = shared.scope == SyncScope::FileSystem
        && !shared.file_system_failed.load(Ordering::Acquire)
        && (links.len() > shared.threads || file_system_sync_under_way(shared));
    // Held while sharing: it waits for the `syncfs` under way, and so do the ones after.
    let one_at_a_time = sharing.then(|| {
        let guard = shared.file_system_sync.lock().expect("file system sync");
        links.extend(shared.jobs.lock().expect("sync jobs").links.drain(..));
        guard
    });
    let mut failures: Vec<Option<String>> = links.iter().map(|l| l.failure.clone()).collect();
    let mut covered = vec![false; links.len()];
    if let Some(one_at_a_time) = one_at_a_time {
        for (fs, members) in by_file_system(links, &failures) {
            match sync_file_system(shared, fs.as_ref(), &one_at_a_time) {
                FileSystemSync::Durable => members.iter().for_each(|&i| covered[i] = true),
                FileSystemSync::Failed(cause) => {
                    members
                        .iter()
                        .for_each(|&i| failures[i] = Some(cause.clone()));
                }
                FileSystemSync::Unvouched => {} // Each file's own sync decides.
            }
        }
    }
    for (i, link) in links.iter().enumerate() {
        if !covered[i] && failures[i].is_none() {
            failures[i] = sync_files(&shared.times, &link.appends);
        }
    }
    failures
}

/// Whether another sync thread is in a `syncfs`.
fn file_system_sync_under_way(shared: &Shared) -> bool {
    matches!(
        shared.file_system_sync.try_lock(),
        Err(std::sync::TryLockError::WouldBlock)
    )
}

/// The links not yet failed whose partitions sync through a file system, by file system, where
/// a file system has more than one of them (one link alone is cheaper by its `fdatasync`).
fn by_file_system(
    links: &[Chain],
    failures: &[Option<String>],
) -> Vec<(Arc<dyn FileSystem>, Vec<usize>)> {
    let mut groups: HashMap<u64, (Arc<dyn FileSystem>, Vec<usize>)> = HashMap::new();
    for (i, link) in links.iter().enumerate() {
        if let (None, Some(fs)) = (&failures[i], &link.appends[0].partition.file_system) {
            let group = groups
                .entry(fs.id())
                .or_insert_with(|| (fs.clone(), Vec::new()));
            group.1.push(i);
        }
    }
    groups.into_values().filter(|(_, m)| m.len() > 1).collect()
}

/// What a `syncfs` says about the links it covered.
enum FileSystemSync {
    /// Their writes are durable.
    Durable,
    /// It failed: their writes may be lost.
    Failed(String),
    /// It returned `Ok`, but a `syncfs` failed before it: that failure may have been another
    /// file's, reported once through the shared handle, so this one's success does not vouch
    /// for every file. Each file's own `fdatasync` reports whether it lost writes.
    Unvouched,
}

/// One `syncfs` of `fs`, made while holding `shared.file_system_sync` (`_one_at_a_time`), so a
/// failure is known to every sync after it (see [`FileSystemSync::Unvouched`]).
fn sync_file_system(
    shared: &Shared,
    fs: &dyn FileSystem,
    _one_at_a_time: &std::sync::MutexGuard<'_, ()>,
) -> FileSystemSync {
    let started = Instant::now();
    let outcome = fs.sync();
    shared.times.syncs.record(started.elapsed());
    match outcome {
        Ok(()) if shared.file_system_failed.load(Ordering::Acquire) => FileSystemSync::Unvouched,
        Ok(()) => FileSystemSync::Durable,
        Err(e) => {
            if !shared.file_system_failed.swap(true, Ordering::AcqRel) {
                tracing::error!(error = %e, "syncfs failed: the partitions it covered are poisoned, and every sync from now on is a file's own");
            }
            FileSystemSync::Failed(format!("syncfs failed: {e}"))
        }
    }
}

/// Acknowledges a link's appends (or fails them, after `failure`); then, if more waited
/// meanwhile, puts the chain back at the end of the queue with them, so partitions beyond the
/// number of sync threads take turns instead of waiting behind a busy one. After a failed
/// sync, whatever waited behind it fails too without another sync: what reached the disk is
/// unknown.
fn finish_link(shared: &Shared, link: Chain, failure: Option<String>) {
    let Chain { key, appends, .. } = link;
    assert!(!appends.is_empty(), "a link of a chain holds appends");
    // The partition's address is its key. A weak reference keeps the address from being reused
    // until the chain has left `in_flight` (so a partition opened meanwhile cannot join this
    // chain and inherit its failure), without keeping a closed partition open.
    let _key_holder = Arc::downgrade(&appends[0].partition);
    for append in &appends {
        shared.times.waits.record(append.handed_over.elapsed());
    }
    complete(appends, failure.as_deref());
    let mut queue = shared.queue.lock().expect("commit queue");
    match queue.waiting.remove(&key) {
        Some(more) => {
            drop(queue);
            let next = Chain {
                key,
                appends: more,
                failure,
            };
            submit(shared, next);
        }
        None => {
            queue.in_flight.remove(&key);
            // Only a shutdown waits for chains to end; waking the committer thread at every
            // chain's end would cost two context switches per sync for nothing.
            let shutdown = queue.shutdown;
            drop(queue);
            if shutdown {
                shared.wake.notify_one();
            }
        }
    }
}

/// Queues a link of a chain for the sync threads.
fn submit(shared: &Shared, chain: Chain) {
    let mut jobs = shared.jobs.lock().expect("sync jobs");
    assert!(
        !jobs.closed,
        "the sync threads run while a chain is in flight"
    );
    jobs.links.push_back(chain);
    drop(jobs);
    shared.job_queued.notify_one();
}

/// Syncs each file the appends were written to (after a roll, the old segment and the new);
/// the first failure, if any. Each sync's duration is recorded.
fn sync_files(times: &SyncTimeRecorder, appends: &[PendingSync]) -> Option<String> {
    let mut synced: Vec<&Arc<Segment>> = Vec::new();
    for append in appends {
        if synced.iter().any(|s| Arc::ptr_eq(s, &append.segment)) {
            continue;
        }
        synced.push(&append.segment);
        let started = Instant::now();
        let synced = append.segment.file.sync_data();
        times.syncs.record(started.elapsed());
        if let Err(e) = synced {
            return Some(format!("fdatasync failed: {e}"));
        }
    }
    None
}

/// Publishes and acknowledges appends in order, or fails them all with the partition poisoned
/// (and its unacknowledged tail cut off).
fn complete(appends: Vec<PendingSync>, failure: Option<&str>) {
    if let Some(cause) = failure {
        let partition = &appends[0].partition;
        partition.poison(cause);
        partition.cut_unacknowledged_now();
    }
    for append in appends {
        let PendingSync {
            partition,
            segment,
            committed,
            receipt,
            completion,
            handed_over: _,
        } = append;
        // A partition poisoned since this append was written (a failed sync elsewhere, such as
        // sealing a segment) acknowledges nothing more: the failure may have cost these bytes,
        // and a later sync succeeding does not vouch for them.
        let outcome = match failure {
            None => partition.check_poisoned().map(|()| {
                partition.publish(committed);
                receipt
            }),
            Some(cause) => Err(partition.poison(cause)),
        };
        // Let go of the partition before acknowledging, so a caller that closes the log as soon
        // as its append is acknowledged really closes it (and can reopen it at once).
        drop((partition, segment));
        completion(outcome);
    }
}

/// The committer thread: syncs interval-mode partitions when due, and at shutdown waits for
/// every chain to end before closing the sync threads' queue.
fn run(shared: &Shared) {
    loop {
        let (dirty, stop) = next_round(shared);
        for d in dirty {
            if let Err(e) = d.segment.file.sync_data()
                && let Some(partition) = d.partition.upgrade()
            {
                partition.poison(&format!("interval sync failed: {e}"));
            }
        }
        if stop {
            shared.jobs.lock().expect("sync jobs").closed = true;
            shared.job_queued.notify_all();
            return;
        }
    }
}

/// Waits for an interval-mode partition whose sync is due, or for shutdown with nothing left.
fn next_round(shared: &Shared) -> (Vec<DirtyPartition>, bool) {
    let mut queue = shared.queue.lock().expect("commit queue");
    loop {
        let now = Instant::now();
        let due_dirty = queue.dirty.iter().any(|d| d.due <= now);
        if due_dirty || queue.shutdown {
            let shutdown = queue.shutdown;
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut queue.dirty)
                .into_iter()
                .partition(|d| d.due <= now || shutdown);
            queue.dirty = later;
            // Stop only once nothing is left; a shutdown drains every chain first.
            let stop = shutdown && queue.dirty.is_empty() && queue.in_flight.is_empty();
            if !due.is_empty() || stop {
                return (due, stop);
            }
            if shutdown {
                // Chains still running: wait for them to end (each notifies).
                queue = shared.wake.wait(queue).expect("commit queue");
                continue;
            }
        }
        queue = match queue.dirty.iter().map(|d| d.due).min() {
            Some(due) => {
                shared
                    .wake
                    .wait_timeout(queue, due.saturating_duration_since(now))
                    .expect("commit queue")
                    .0
            }
            None => shared.wake.wait(queue).expect("commit queue"),
        };
    }
}
