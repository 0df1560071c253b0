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
//!   appends are refused until the partition is reopened and recovered.
//! - Dropping the last [`GroupCommitter`] waits until every append handed to it is acknowledged
//!   or failed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex, Weak, mpsc};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use crate::partition::{AppendCompletion, AppendReceipt, Committed, PartitionShared};
use crate::segment::Segment;
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
    /// Where chains are started; taken (closing the channel, ending the sync threads) when the
    /// committer thread stops.
    jobs: Mutex<Option<mpsc::Sender<Chain>>>,
    /// How long the chains' syncs take.
    times: SyncTimeRecorder,
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
    /// Starts the committer thread and the sync threads.
    pub fn start() -> GroupCommitter {
        let (jobs, chains) = mpsc::channel::<Chain>();
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            jobs: Mutex::new(Some(jobs)),
            times: SyncTimeRecorder::default(),
        });
        let chains = Arc::new(Mutex::new(chains));
        let mut own_threads = Vec::new();
        for i in 0..crate::limits::SYNC_THREADS {
            let (shared, chains) = (shared.clone(), chains.clone());
            let thread = std::thread::Builder::new()
                .name(format!("tributary-sync-{i}"))
                .spawn(move || {
                    loop {
                        let next = chains.lock().expect("chain queue").recv();
                        let Ok(chain) = next else { return };
                        run_chain(&shared, chain);
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

    /// The `fdatasync` calls made so far for `fsync` appends, and how long those appends waited
    /// for them.
    pub fn sync_times(&self) -> SyncTimes {
        self.handle.shared.times.snapshot()
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

/// A sync thread's work on one partition: sync and acknowledge the chain's appends; then, if
/// more waited meanwhile, put the chain back at the end of the queue with them, so partitions
/// beyond the number of sync threads take turns instead of waiting behind a busy one. After a
/// failed sync, whatever waited behind it fails too without another sync: what reached the
/// disk is unknown.
fn run_chain(shared: &Shared, chain: Chain) {
    let Chain {
        key,
        appends,
        failure,
    } = chain;
    assert!(!appends.is_empty(), "a link of a chain holds appends");
    // The partition's address is its key. A weak reference keeps the address from being reused
    // until the chain has left `in_flight` (so a partition opened meanwhile cannot join this
    // chain and inherit its failure), without keeping a closed partition open.
    let _key_holder = Arc::downgrade(&appends[0].partition);
    let failure = failure.or_else(|| sync_files(&shared.times, &appends));
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
    shared
        .jobs
        .lock()
        .expect("chain sender")
        .as_ref()
        .expect("the sync threads run while a chain is in flight")
        .send(chain)
        .unwrap_or_else(|_| unreachable!("the sync threads outlive the sender"));
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
            return Some(e.to_string());
        }
    }
    None
}

/// Publishes and acknowledges appends in order, or fails them all with the partition poisoned
/// (and its unacknowledged tail cut off).
fn complete(appends: Vec<PendingSync>, failure: Option<&str>) {
    if let Some(cause) = failure {
        let partition = &appends[0].partition;
        partition.poison(&format!("fdatasync failed: {cause}"));
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
            Some(cause) => Err(partition.poison(&format!("fdatasync failed: {cause}"))),
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
            shared.jobs.lock().expect("chain sender").take();
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
