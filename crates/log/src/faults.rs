//! A [`Storage`] that lives in memory, injects faults on a seeded schedule and simulates crashes
//! (feature `fault-injection`; for tests).
//!
//! Each file keeps two images: what reads see now (the page cache) and what would survive a
//! crash (the disk), plus the writes made since the last sync, in order. A sync moves the writes
//! pending when it started onto the disk image; [`FaultyStorage::crash`] keeps the disk image
//! and a random prefix of the pending writes, the last of them possibly torn at any byte, and
//! forgets every directory entry not made durable by a directory sync — or, with
//! [`FaultyStorage::keep_directory_prefixes`], keeps a random prefix, in order, of the
//! directory changes (files created, removed, renamed) since their directory's last sync, as a
//! file system that journals its metadata in order may.
//!
//! Faults, each drawn with its probability from a ChaCha8 generator seeded by the caller (so a
//! run is replayed exactly by its seed, as long as the caller's operations come in the same
//! order):
//! - a failed sync (`EIO`), after which the writes it should have covered are, by a second
//!   draw, lost for good even though reads still see them — as Linux may drop dirty pages after
//!   a failed `fsync` and report success on the next one;
//! - a full disk (`ENOSPC`) on a write, a preallocation, a truncation, a file creation or a
//!   rename; a failed write first writes a random prefix of its bytes (a short write);
//! - a slow sync (a sleep of up to the configured maximum).
//!
//! A sync of the whole file system ([`Storage::file_system`]) settles every file's pending
//! writes; when it fails and its writes are lost, they are lost in every file, and each of those
//! files' next sync fails (as Linux reports a lost write to each file once).
//!
//! Single faults can also be asked for ([`FaultyStorage::fail_next_sync`],
//! [`FaultyStorage::fail_next_write`]), and a sync can be held until released, so a test can
//! line appends up behind it deterministically.
//!
//! A crash can also be scheduled at the n-th operation that changes the disk from now
//! ([`FaultyStorage::crash_at_op`]: a write, truncation, preallocation, sync, file creation,
//! removal or rename): it happens instead of that operation, and every operation after it fails
//! until [`FaultyStorage::power_on`], as a dead machine does nothing. [`FaultyStorage::fork`]
//! copies the whole file system, so a test can crash the same starting point at every step.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

use crate::storage::{FileSystem, OpenMode, Storage, StorageFile};

/// How often each fault happens: probabilities per operation, from 0.0 to 1.0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultConfig {
    /// A sync (`fdatasync`, `fsync`, directory sync) fails with `EIO`.
    pub sync_failure: f64,
    /// Given a failed sync, the writes it should have covered never reach the disk.
    pub lost_after_failed_sync: f64,
    /// A write, preallocation, truncation, file creation or rename fails with `ENOSPC` (a
    /// write after writing a random prefix of its bytes).
    pub no_space: f64,
    /// A sync first sleeps up to `slow_sync_max`.
    pub slow_sync: f64,
    /// The longest sleep of a slow sync.
    pub slow_sync_max: Duration,
}

impl FaultConfig {
    /// No random faults (single ones can still be asked for).
    pub const NONE: FaultConfig = FaultConfig {
        sync_failure: 0.0,
        lost_after_failed_sync: 0.0,
        no_space: 0.0,
        slow_sync: 0.0,
        slow_sync_max: Duration::ZERO,
    };
}

/// How many faults of each kind were injected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// Failed syncs.
    pub failed_syncs: u64,
    /// Failed syncs whose writes were then lost.
    pub lost_writes: u64,
    /// `ENOSPC` failures.
    pub no_space: u64,
    /// Failed writes that wrote part of their bytes first.
    pub short_writes: u64,
    /// Slow syncs.
    pub slow_syncs: u64,
    /// Crashes.
    pub crashes: u64,
    /// Crashes that tore a pending write (kept part of it).
    pub torn_writes: u64,
}

/// A change to a directory's entries, not yet made durable.
#[derive(Debug, Clone)]
enum DirOp {
    Create(PathBuf, u64),
    Remove(PathBuf),
    Rename { from: PathBuf, to: PathBuf, id: u64 },
}

impl DirOp {
    fn dir(&self) -> Option<&Path> {
        match self {
            DirOp::Create(path, _) | DirOp::Remove(path) => path.parent(),
            DirOp::Rename { to, .. } => to.parent(),
        }
    }

    fn apply(&self, names: &mut BTreeMap<PathBuf, u64>) {
        match self {
            DirOp::Create(path, id) => {
                names.insert(path.clone(), *id);
            }
            DirOp::Remove(path) => {
                names.remove(path);
            }
            DirOp::Rename { from, to, id } => {
                names.remove(from);
                names.insert(to.clone(), *id);
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Write { at: u64, bytes: Vec<u8> },
    SetLen(u64),
    Extend(u64),
}

impl Op {
    fn apply(&self, image: &mut Vec<u8>) {
        match self {
            Op::Write { at, bytes } => {
                let at = to_usize(*at);
                if image.len() < at + bytes.len() {
                    image.resize(at + bytes.len(), 0);
                }
                image[at..at + bytes.len()].copy_from_slice(bytes);
            }
            Op::SetLen(len) => image.resize(to_usize(*len), 0),
            Op::Extend(len) => {
                if image.len() < to_usize(*len) {
                    image.resize(to_usize(*len), 0);
                }
            }
        }
    }
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).expect("in-memory files fit in memory")
}

#[derive(Debug, Default, Clone)]
struct FileState {
    /// What reads see.
    current: Vec<u8>,
    /// What survives a crash.
    durable: Vec<u8>,
    /// Changes since the last sync, oldest first.
    pending: Vec<Op>,
    /// How many changes have left `pending` (synced or lost) since the file was created.
    settled: u64,
    /// A failed sync of the whole file system lost this file's pending changes: its next
    /// sync fails (Linux reports a lost write once to each file open when it was lost).
    lost_unreported: bool,
}

/// The seeded generator behind every random choice of a simulation: ChaCha8, whose output for
/// a seed is fixed across platforms and releases, so a seed replays the same run anywhere.
#[derive(Debug, Clone)]
pub struct SimRng(ChaCha8Rng);

impl SimRng {
    /// A generator whose every draw follows from `seed`.
    pub fn new(seed: u64) -> SimRng {
        SimRng(ChaCha8Rng::seed_from_u64(seed))
    }

    /// A uniform draw.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// A draw in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.0.next_u64() % n }
    }

    /// `true` with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        #[allow(clippy::cast_precision_loss)]
        let x = (self.0.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        x < p
    }
}

#[derive(Debug, Clone)]
struct World {
    rng: SimRng,
    config: FaultConfig,
    faults_on: bool,
    fail_next_sync: bool,
    fail_next_write: bool,
    /// Hold the next sync until released.
    hold_next_sync: bool,
    held: bool,
    files: HashMap<u64, FileState>,
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    /// Directory changes since their directory's last sync, oldest first.
    dir_ops: Vec<DirOp>,
    /// Whether a crash keeps a prefix of `dir_ops` (otherwise none of them).
    keep_dir_prefixes: bool,
    locks: BTreeSet<PathBuf>,
    next_id: u64,
    /// Bumped by each crash; handles from before it fail.
    generation: u64,
    counts: FaultCounts,
    /// Operations that changed (or would have changed) the disk so far.
    ops: u64,
    /// Crash instead of the operation with this number.
    crash_at_op: Option<u64>,
    /// Crashed at a scheduled operation and not yet powered on: every operation fails.
    down: bool,
}

impl World {
    /// A draw that is `true` with probability `p` (always drawn, so the sequence of draws does
    /// not depend on the probabilities being zero).
    fn chance(&mut self, p: f64) -> bool {
        let hit = self.rng.chance(p);
        self.faults_on && hit
    }

    fn below(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }

    /// Fails if the machine is down.
    fn alive(&self) -> io::Result<()> {
        if self.down {
            return Err(io::Error::other(
                "the machine is down after a simulated crash",
            ));
        }
        Ok(())
    }

    /// Counts an operation that changes the disk, and crashes instead of it when scheduled.
    fn step(&mut self) -> io::Result<()> {
        self.alive()?;
        self.ops += 1;
        if self.crash_at_op == Some(self.ops) {
            self.crash_at_op = None;
            self.crash();
            self.down = true;
            return Err(io::Error::other("the machine crashed"));
        }
        Ok(())
    }

    /// Keeps what a crash keeps (see [`FaultyStorage::crash`]).
    fn crash(&mut self) {
        self.generation += 1;
        self.counts.crashes += 1;
        self.locks.clear();
        let dir_ops = std::mem::take(&mut self.dir_ops);
        if self.keep_dir_prefixes {
            let kept_dir_ops = to_usize(self.below(dir_ops.len() as u64 + 1));
            for op in &dir_ops[..kept_dir_ops] {
                op.apply(&mut self.durable_names);
            }
        }
        self.names = self.durable_names.clone();
        let live: BTreeSet<u64> = self.names.values().copied().collect();
        self.files.retain(|id, _| live.contains(id));
        let mut ids: Vec<u64> = self.files.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let file = self.files.get_mut(&id).expect("file");
            let pending = std::mem::take(&mut file.pending);
            file.settled += pending.len() as u64;
            let kept = to_usize(self.below(pending.len() as u64 + 1));
            let tear = self.below(2) == 1;
            let file = self.files.get_mut(&id).expect("file");
            for op in &pending[..kept] {
                op.apply(&mut file.durable);
            }
            if let (true, Some(Op::Write { at, bytes })) = (tear, pending.get(kept)) {
                let n = to_usize(self.below(bytes.len() as u64));
                let torn = Op::Write {
                    at: *at,
                    bytes: bytes[..n].to_vec(),
                };
                let file = self.files.get_mut(&id).expect("file");
                torn.apply(&mut file.durable);
                self.counts.torn_writes += 1;
            }
            let file = self.files.get_mut(&id).expect("file");
            file.current = file.durable.clone();
            file.lost_unreported = false; // A restarted machine has no errors to report.
        }
    }

    fn no_space(&mut self) -> io::Result<()> {
        let forced = std::mem::take(&mut self.fail_next_write);
        let p = self.config.no_space;
        if self.chance(p) || forced {
            self.counts.no_space += 1;
            return Err(io::Error::from(rustix::io::Errno::NOSPC));
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Shared {
    world: Mutex<World>,
    /// Signalled when a sync starts being held and when a held sync is released.
    held_changed: Condvar,
}

/// The fault-injecting in-memory storage. Clones share the same files.
#[derive(Debug, Clone)]
pub struct FaultyStorage {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct FaultyFile {
    shared: Arc<Shared>,
    id: u64,
    generation: u64,
    writable: bool,
}

#[derive(Debug)]
struct LockGuard {
    shared: Arc<Shared>,
    path: PathBuf,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.shared.lock().locks.remove(&self.path);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, World> {
        self.world
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{}: no such file", path.display()),
    )
}

impl FaultyStorage {
    /// An empty file system whose faults are drawn from `seed`.
    pub fn new(seed: u64, config: FaultConfig) -> FaultyStorage {
        FaultyStorage {
            shared: Arc::new(Shared {
                world: Mutex::new(World {
                    rng: SimRng::new(seed),
                    config,
                    faults_on: true,
                    fail_next_sync: false,
                    fail_next_write: false,
                    hold_next_sync: false,
                    held: false,
                    files: HashMap::new(),
                    names: BTreeMap::new(),
                    durable_names: BTreeMap::new(),
                    dir_ops: Vec::new(),
                    keep_dir_prefixes: false,
                    locks: BTreeSet::new(),
                    next_id: 0,
                    generation: 0,
                    counts: FaultCounts::default(),
                    ops: 0,
                    crash_at_op: None,
                    down: false,
                }),
                held_changed: Condvar::new(),
            }),
        }
    }

    /// Turns the random faults on or off (the draws go on either way).
    pub fn set_faults(&self, on: bool) {
        self.shared.lock().faults_on = on;
    }

    /// The next sync fails (with its writes kept or lost as the dice say).
    pub fn fail_next_sync(&self) {
        self.shared.lock().fail_next_sync = true;
    }

    /// The next write (or other space-taking operation) fails with `ENOSPC`.
    pub fn fail_next_write(&self) {
        self.shared.lock().fail_next_write = true;
    }

    /// The next `sync_data` waits, after deciding what it covers and whether it fails, until
    /// [`FaultyStorage::release`]. `false` cancels a hold no sync has taken yet.
    pub fn hold_next_sync(&self, hold: bool) {
        self.shared.lock().hold_next_sync = hold;
    }

    /// Waits until a sync is being held.
    pub fn wait_until_held(&self) {
        let mut world = self.shared.lock();
        while !world.held {
            world = self
                .shared
                .held_changed
                .wait(world)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Lets a held sync finish.
    pub fn release(&self) {
        self.shared.lock().held = false;
        self.shared.held_changed.notify_all();
    }

    /// The faults injected so far.
    pub fn counts(&self) -> FaultCounts {
        self.shared.lock().counts
    }

    /// Simulates a crash of the machine: each file keeps what was synced plus a random prefix
    /// of its later writes (the last possibly torn), directory entries not synced are forgotten,
    /// locks are released and handles opened before it stop working.
    pub fn crash(&self) {
        self.shared.lock().crash();
    }

    /// From now on, a crash keeps a random prefix of the directory changes not yet synced
    /// (see the module doc) instead of none of them.
    pub fn keep_directory_prefixes(&self) {
        self.shared.lock().keep_dir_prefixes = true;
    }

    /// Schedules a crash instead of the `n`-th operation from now that changes the disk
    /// (`n` ≥ 1); see the module doc.
    pub fn crash_at_op(&self, n: u64) {
        assert!(n >= 1);
        let mut world = self.shared.lock();
        world.crash_at_op = Some(world.ops + n);
    }

    /// How many operations that change the disk have been made so far.
    pub fn ops(&self) -> u64 {
        self.shared.lock().ops
    }

    /// Whether a scheduled crash has happened and the machine is not yet powered on.
    pub fn is_down(&self) -> bool {
        self.shared.lock().down
    }

    /// Starts the machine again after a scheduled crash (the disk as the crash left it).
    pub fn power_on(&self) {
        let mut world = self.shared.lock();
        world.down = false;
        world.crash_at_op = None;
    }

    /// A separate copy of this file system, as it is now (files, what is durable, pending
    /// writes, the fault generator's state); no lock is held in it.
    pub fn fork(&self) -> FaultyStorage {
        let mut world = self.shared.lock().clone();
        world.locks.clear();
        world.held = false;
        world.hold_next_sync = false;
        FaultyStorage {
            shared: Arc::new(Shared {
                world: Mutex::new(world),
                held_changed: Condvar::new(),
            }),
        }
    }

    /// The paths of every file, in order (for tests that look at the bytes).
    pub fn paths(&self) -> Vec<PathBuf> {
        self.shared.lock().names.keys().cloned().collect()
    }

    /// The current contents of a file (for tests that look at the bytes).
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let world = self.shared.lock();
        let id = world.names.get(path)?;
        Some(world.files[id].current.clone())
    }
}

impl Storage for FaultyStorage {
    fn create_dir_all(&self, _dir: &Path) -> io::Result<()> {
        // Directories are implied by the paths of the files in them.
        Ok(())
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut world = self.shared.lock();
        world.alive()?;
        let existing = world.names.get(path).copied();
        let id = match (mode, existing) {
            (OpenMode::Read | OpenMode::Existing, None) => return Err(not_found(path)),
            (OpenMode::CreateNew, Some(_)) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{}: exists", path.display()),
                ));
            }
            (OpenMode::Replace, Some(id)) => {
                world.step()?;
                world.no_space()?;
                let file = world.files.get_mut(&id).expect("named file");
                file.current.clear();
                file.pending.push(Op::SetLen(0));
                id
            }
            (_, Some(id)) => id,
            (_, None) => {
                world.step()?;
                world.no_space()?;
                let id = world.next_id;
                world.next_id += 1;
                world.files.insert(id, FileState::default());
                world.names.insert(path.to_owned(), id);
                world.dir_ops.push(DirOp::Create(path.to_owned(), id));
                id
            }
        };
        Ok(Box::new(FaultyFile {
            shared: self.shared.clone(),
            id,
            generation: world.generation,
            writable: mode != OpenMode::Read,
        }))
    }

    fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let world = self.shared.lock();
        world.alive()?;
        Ok(world
            .names
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
            .collect())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut world = self.shared.lock();
        world.step()?;
        world.names.remove(path).ok_or_else(|| not_found(path))?;
        world.dir_ops.push(DirOp::Remove(path.to_owned()));
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut world = self.shared.lock();
        world.step()?;
        if !world.names.contains_key(from) {
            return Err(not_found(from));
        }
        world.no_space()?;
        let id = world.names.remove(from).expect("checked");
        world.names.insert(to.to_owned(), id);
        world.dir_ops.push(DirOp::Rename {
            from: from.to_owned(),
            to: to.to_owned(),
            id,
        });
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut world = self.shared.lock();
        world.step()?;
        if sync_fails(&mut world) {
            return Err(io::Error::from(rustix::io::Errno::IO));
        }
        world.durable_names.retain(|p, _| p.parent() != Some(dir));
        let entries: Vec<(PathBuf, u64)> = world
            .names
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .map(|(p, id)| (p.clone(), *id))
            .collect();
        world.durable_names.extend(entries);
        world.dir_ops.retain(|op| op.dir() != Some(dir));
        Ok(())
    }

    fn lock_file(&self, path: &Path) -> io::Result<Box<dyn Debug + Send + Sync>> {
        let mut world = self.shared.lock();
        world.alive()?;
        if !world.locks.insert(path.to_owned()) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the partition is open elsewhere",
            ));
        }
        Ok(Box::new(LockGuard {
            shared: self.shared.clone(),
            path: path.to_owned(),
        }))
    }

    fn file_system(&self, _dir: &Path) -> io::Result<Box<dyn FileSystem>> {
        let world = self.shared.lock();
        world.alive()?;
        Ok(Box::new(FaultyFileSystem {
            shared: self.shared.clone(),
            generation: world.generation,
        }))
    }
}

/// The one simulated file system, synced whole.
#[derive(Debug)]
struct FaultyFileSystem {
    shared: Arc<Shared>,
    generation: u64,
}

impl FileSystem for FaultyFileSystem {
    fn id(&self) -> u64 {
        0
    }

    /// Settles every file's pending changes, as `syncfs` does. A failure is drawn once for the
    /// whole sync; if its writes are then lost, they are lost in every file that had some,
    /// and each such file's next sync fails.
    fn sync(&self) -> io::Result<()> {
        let mut world = self.shared.lock();
        world.step()?;
        if world.generation != self.generation {
            return Err(io::Error::other(
                "the file system was opened before a simulated crash",
            ));
        }
        let failed = sync_fails(&mut world);
        let lost_p = world.config.lost_after_failed_sync;
        let lost = failed && world.chance(lost_p);
        if failed && !lost {
            return Err(io::Error::from(rustix::io::Errno::IO));
        }
        if lost {
            world.counts.lost_writes += 1;
        }
        for file in world.files.values_mut() {
            if file.pending.is_empty() {
                continue;
            }
            file.settled += file.pending.len() as u64;
            let done = std::mem::take(&mut file.pending);
            if lost {
                file.lost_unreported = true;
            } else {
                for op in &done {
                    op.apply(&mut file.durable);
                }
            }
        }
        if lost {
            return Err(io::Error::from(rustix::io::Errno::IO));
        }
        Ok(())
    }
}

/// Draws whether a sync fails (and counts it).
fn sync_fails(world: &mut World) -> bool {
    let forced = std::mem::take(&mut world.fail_next_sync);
    let p = world.config.sync_failure;
    let failed = world.chance(p) || forced;
    if failed {
        world.counts.failed_syncs += 1;
    }
    failed
}

impl FaultyFile {
    fn world(&self) -> io::Result<MutexGuard<'_, World>> {
        let world = self.shared.lock();
        world.alive()?;
        if world.generation != self.generation {
            return Err(io::Error::other(
                "the file was open before a simulated crash",
            ));
        }
        Ok(world)
    }

    fn writable(&self) -> io::Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "opened read-only",
            ))
        }
    }

    /// Records a change: applied to what reads see now, pending for the disk.
    fn change(world: &mut World, id: u64, op: Op) {
        let file = world.files.get_mut(&id).expect("open file");
        op.apply(&mut file.current);
        file.pending.push(op);
    }

    /// A sync; `sync_data` (what the group committer calls) may be held, `sync_all` is not.
    fn sync(&self, may_hold: bool) -> io::Result<()> {
        let mut world = self.world()?;
        world.step()?;
        let slow = world.config.slow_sync;
        if world.chance(slow) {
            world.counts.slow_syncs += 1;
            let max = u64::try_from(world.config.slow_sync_max.as_micros()).unwrap_or(u64::MAX);
            let pause = Duration::from_micros(world.below(max + 1));
            drop(world);
            std::thread::sleep(pause);
            world = self.world()?;
        }
        // A write this file lost in a failed sync of the whole file system is reported here.
        let file = world.files.get_mut(&self.id).expect("open file");
        if std::mem::take(&mut file.lost_unreported) {
            return Err(io::Error::from(rustix::io::Errno::IO));
        }
        // What this sync covers, and whether it fails, is decided when it starts.
        let file = &world.files[&self.id];
        let covered = file.settled + file.pending.len() as u64;
        let failed = sync_fails(&mut world);
        let lost_p = world.config.lost_after_failed_sync;
        let lost = failed && world.chance(lost_p);
        if may_hold && std::mem::take(&mut world.hold_next_sync) {
            world.held = true;
            self.shared.held_changed.notify_all();
            while world.held {
                world = self
                    .shared
                    .held_changed
                    .wait(world)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
        if world.generation != self.generation {
            // The machine crashed while this sync was held: it never returned.
            return Err(io::Error::other("the machine crashed during the sync"));
        }
        if failed && !lost {
            return Err(io::Error::from(rustix::io::Errno::IO));
        }
        if lost {
            world.counts.lost_writes += 1;
        }
        let file = world.files.get_mut(&self.id).expect("open file");
        // Another sync may have settled some of them meanwhile.
        let n = to_usize(covered.saturating_sub(file.settled));
        file.settled += n as u64;
        let done: Vec<Op> = file.pending.drain(..n).collect();
        if !lost {
            for op in &done {
                op.apply(&mut file.durable);
            }
            return Ok(());
        }
        Err(io::Error::from(rustix::io::Errno::IO))
    }
}

impl StorageFile for FaultyFile {
    fn read_exact_at(&self, buf: &mut [u8], at: u64) -> io::Result<()> {
        let world = self.world()?;
        let data = &world.files[&self.id].current;
        let at = to_usize(at);
        let Some(bytes) = data.get(at..at + buf.len()) else {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the file",
            ));
        };
        buf.copy_from_slice(bytes);
        Ok(())
    }

    fn write_all_at(&self, buf: &[u8], at: u64) -> io::Result<()> {
        self.writable()?;
        let mut world = self.world()?;
        world.step()?;
        if let Err(e) = world.no_space() {
            // A short write: part of the bytes land before the disk is found full.
            let n = to_usize(world.below(buf.len() as u64));
            if n > 0 {
                world.counts.short_writes += 1;
                let bytes = buf[..n].to_vec();
                Self::change(&mut world, self.id, Op::Write { at, bytes });
            }
            return Err(e);
        }
        let bytes = buf.to_vec();
        Self::change(&mut world, self.id, Op::Write { at, bytes });
        Ok(())
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.world()?.files[&self.id].current.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.writable()?;
        let mut world = self.world()?;
        world.step()?;
        if len > world.files[&self.id].current.len() as u64 {
            world.no_space()?;
        }
        Self::change(&mut world, self.id, Op::SetLen(len));
        Ok(())
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        self.writable()?;
        let mut world = self.world()?;
        world.step()?;
        world.no_space()?;
        Self::change(&mut world, self.id, Op::Extend(len));
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.sync(true)
    }

    fn sync_all(&self) -> io::Result<()> {
        self.sync(false)
    }
}
