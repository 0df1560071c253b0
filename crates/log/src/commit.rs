//! Group commit: one thread that makes appends durable in rounds.
//!
//! Appenders write their batch into the page cache themselves and then hand the committer a
//! [`PendingSync`]. The committer takes everything queued, calls `fdatasync` once per file that
//! has pending bytes, and then publishes each partition's new committed state and acknowledges
//! every append of the round. While a round's syncs are in flight, new appends queue up for the
//! next round, so one sync covers every append that was waiting on it — across all partitions
//! that share the committer.
//!
//! Partitions in `interval:<ms>` mode are acknowledged on write; the committer syncs their files
//! when their interval has passed. Partitions in `none` mode never reach the committer.
//!
//! # Guarantees
//! - An append in `fsync` mode is acknowledged, and becomes visible to readers, only after a sync
//!   that started after its bytes were written has returned successfully.
//! - Within a partition, appends are acknowledged and published in append order.
//! - A failed sync poisons the partition: what is on disk is unknown (the kernel may have dropped
//!   the dirty pages), so the appends of that round fail and later appends are refused until the
//!   partition is reopened and recovered.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, Weak, mpsc};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use crate::partition::{AppendCompletion, AppendReceipt, Committed, PartitionShared};
use crate::segment::Segment;

/// An append written to its segment and waiting to be synced.
pub(crate) struct PendingSync {
    pub partition: Arc<PartitionShared>,
    pub segment: Arc<Segment>,
    /// The partition's committed state once this append is durable.
    pub committed: Committed,
    pub receipt: AppendReceipt,
    pub completion: AppendCompletion,
}

/// A partition in interval mode with bytes not yet synced. The partition is held weakly: a log
/// that is closed is closed at once (its lock released), and its file still gets its sync.
struct DirtyPartition {
    partition: Weak<PartitionShared>,
    segment: Arc<Segment>,
    due: Instant,
}

#[derive(Default)]
struct Queue {
    pending: Vec<PendingSync>,
    dirty: Vec<DirtyPartition>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

/// The group committer shared by the partitions of one data directory. Cheap to clone; the
/// thread stops when the last clone is dropped, after finishing the appends still queued.
#[derive(Clone)]
pub struct GroupCommitter {
    handle: Arc<CommitterHandle>,
}

struct CommitterHandle {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    thread_id: ThreadId,
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
    /// Starts the committer thread.
    pub fn start() -> GroupCommitter {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        });
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("tributary-commit".into())
            .spawn(move || run(&thread_shared))
            .expect("spawn the group-commit thread");
        let thread_id = thread.thread().id();
        GroupCommitter {
            handle: Arc::new(CommitterHandle {
                shared,
                thread: Mutex::new(Some(thread)),
                thread_id,
            }),
        }
    }

    pub(crate) fn enqueue(&self, pending: PendingSync) {
        let mut queue = self.handle.shared.queue.lock().expect("commit queue");
        assert!(!queue.shutdown, "append after the committer stopped");
        queue.pending.push(pending);
        drop(queue);
        self.handle.shared.wake.notify_one();
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
        // The last handle may be dropped by a completion running on the committer thread
        // itself; it cannot join itself, and it exits on its own once it sees `shutdown`.
        if std::thread::current().id() != self.thread_id
            && let Some(thread) = self.thread.lock().expect("thread handle").take()
        {
            let _ = thread.join();
        }
    }
}

fn run(shared: &Shared) {
    let pool = SyncPool::start(crate::limits::SYNC_THREADS);
    loop {
        let (pending, dirty, stop) = next_round(shared);
        if !pending.is_empty() {
            complete_round(&pool, pending);
        }
        for d in dirty {
            if let Err(e) = d.segment.file.sync_data()
                && let Some(partition) = d.partition.upgrade()
            {
                partition.poison(&format!("interval sync failed: {e}"));
            }
        }
        if stop {
            return;
        }
    }
}

/// Waits for work: pending appends, or an interval-mode partition whose sync is due.
fn next_round(shared: &Shared) -> (Vec<PendingSync>, Vec<DirtyPartition>, bool) {
    let mut queue = shared.queue.lock().expect("commit queue");
    loop {
        let now = Instant::now();
        let due_dirty = queue.dirty.iter().any(|d| d.due <= now);
        if !queue.pending.is_empty() || due_dirty || queue.shutdown {
            let pending = std::mem::take(&mut queue.pending);
            let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut queue.dirty)
                .into_iter()
                .partition(|d| d.due <= now || queue.shutdown);
            queue.dirty = later;
            // Stop only once nothing is left; a shutdown round drains everything first.
            let stop = queue.shutdown && queue.pending.is_empty() && queue.dirty.is_empty();
            return (pending, due, stop);
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

/// Syncs every file the round touched once, then publishes and acknowledges in queue order.
fn complete_round(pool: &SyncPool, pending: Vec<PendingSync>) {
    let mut files: Vec<Arc<Segment>> = Vec::new();
    for p in &pending {
        if !files.iter().any(|f| Arc::ptr_eq(f, &p.segment)) {
            files.push(p.segment.clone());
        }
    }
    let synced: HashMap<*const Segment, Result<(), String>> = files
        .iter()
        .map(Arc::as_ptr)
        .zip(pool.sync(&files))
        .collect();
    for p in pending {
        let PendingSync {
            partition,
            segment,
            committed,
            receipt,
            completion,
        } = p;
        let outcome = match &synced[&Arc::as_ptr(&segment)] {
            Ok(()) => {
                partition.publish(committed);
                Ok(receipt)
            }
            Err(cause) => Err(partition.poison(&format!("fdatasync failed: {cause}"))),
        };
        // Let go of the partition before acknowledging, so a caller that closes the log as soon
        // as its append is acknowledged really closes it (and can reopen it at once).
        drop((partition, segment));
        completion(outcome);
    }
}

/// Threads that run one round's `fdatasync`s in parallel, so the syncs of different files
/// proceed together on the device instead of one after another (four files: about one sync's
/// latency instead of four). Workers end when the pool is dropped.
struct SyncPool {
    jobs: mpsc::Sender<SyncJob>,
}

struct SyncJob {
    segment: Arc<Segment>,
    index: usize,
    done: mpsc::Sender<(usize, Result<(), String>)>,
}

impl SyncPool {
    fn start(workers: usize) -> SyncPool {
        assert!(workers > 0);
        let (jobs, queue) = mpsc::channel::<SyncJob>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..workers {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("tributary-sync-{i}"))
                .spawn(move || {
                    loop {
                        let next = queue.lock().expect("sync queue").recv();
                        let Ok(job) = next else { return };
                        let result = job.segment.file.sync_data().map_err(|e| e.to_string());
                        let _ = job.done.send((job.index, result));
                    }
                })
                .expect("spawn a sync thread");
        }
        SyncPool { jobs }
    }

    /// Syncs every file (in parallel when there are several); the results in the same order.
    fn sync(&self, files: &[Arc<Segment>]) -> Vec<Result<(), String>> {
        if let [only] = files {
            return vec![only.file.sync_data().map_err(|e| e.to_string())];
        }
        let (done, results) = mpsc::channel();
        for (index, segment) in files.iter().enumerate() {
            let job = SyncJob {
                segment: segment.clone(),
                index,
                done: done.clone(),
            };
            self.jobs
                .send(job)
                .expect("the sync threads live as long as the pool");
        }
        drop(done);
        let mut out: Vec<Result<(), String>> = vec![Ok(()); files.len()];
        for (index, result) in results.iter() {
            out[index] = result;
        }
        assert_eq!(results.try_recv().ok(), None, "every file reported once");
        out
    }
}
