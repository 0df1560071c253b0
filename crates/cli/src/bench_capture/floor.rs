//! The capture scenario's last line, **floor**: what this machine charges a capture, per 1 KiB
//! event, for the one thing no capture can leave out, taking each body into its file's write
//! buffer from memory another thread wrote.
//!
//! A capture runs off the ingest path, on a thread of its own, as Event Hubs Capture does: the
//! bodies it reads were written by the hub's appender on another core, into memory the hub
//! keeps moving through (kept batches, page cache), and it copies each once, into the aligned
//! buffer its file is written from. What that copy costs is the machine's, not the capture's
//! code: here a writer thread fills a 64 MiB ring of 1 MiB slots a body at a time, as the
//! appender fills batches, and a reader thread follows it a few slots behind (a few MiB, as a
//! capture follows), copying each body into one of two 1 MiB buffers, as the capture's
//! encoder does, and counting its own CPU time for the copies alone. Both spin rather than
//! sleep while they wait for each other, so each keeps a core of its own (a thread woken by a
//! channel may be run on the core that woke it, and read what it reads from that core's
//! caches). The reader then does the same with a slot it wrote itself just before. Beside the
//! hub's CPU per ingested event in the same run, the first is the part of the 30 % target the
//! copy takes before the capture reads, encodes or writes anything. It is measured alone,
//! after the hub is shut: beside a hub ingesting, which streams through memory too, the same
//! copy costs more, so this is a floor, not an estimate.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::{EVENT_BYTES, thread_cpu_ns};

/// Bytes of each slot the writer fills and of each buffer the reader copies into.
const BUFFER_BYTES: usize = 1024 * 1024;
/// Slots in the ring: 64 MiB, more than this machine's caches, as a hub's writes are.
const RING_SLOTS: usize = 64;
/// How many slots behind the writer the reader copies.
const SLOTS_BEHIND: usize = 4;
/// Bytes copied in each of the two measurements (`--quick`: a sixteenth).
const MEASURED_BYTES: usize = 256 * 1024 * 1024;

/// CPU time per 1 KiB body copied, in nanoseconds.
pub struct CopyFloor {
    /// Bodies another thread wrote.
    pub other_thread_ns: f64,
    /// Bodies the copying thread wrote just before.
    pub own_ns: f64,
}

/// Measures both copies (about a second on this project's machine; `quick`, a sixteenth of it).
pub fn measure(quick: bool) -> CopyFloor {
    let buffers = MEASURED_BYTES / BUFFER_BYTES / if quick { 16 } else { 1 };
    let bodies = (buffers * (BUFFER_BYTES / EVENT_BYTES)) as f64;
    let mut copier = Copier::new();

    let ring: Arc<Vec<Mutex<Vec<u8>>>> = Arc::new(
        (0..RING_SLOTS)
            .map(|_| Mutex::new(vec![0; BUFFER_BYTES]))
            .collect(),
    );
    // Slots the writer has filled, and the reader has copied.
    let filled = Arc::new(AtomicUsize::new(0));
    let copied = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (ring, filled, copied) = (Arc::clone(&ring), Arc::clone(&filled), Arc::clone(&copied));
        std::thread::spawn(move || {
            for n in 0..buffers + SLOTS_BEHIND {
                while n >= copied.load(Ordering::Acquire) + RING_SLOTS {
                    std::hint::spin_loop();
                }
                fill(&mut ring[n % RING_SLOTS].lock().expect("a slot"), n);
                filled.store(n + 1, Ordering::Release);
            }
        })
    };
    let mut other_thread_ns = 0;
    for n in 0..buffers {
        while filled.load(Ordering::Acquire) < n + 1 + SLOTS_BEHIND {
            std::hint::spin_loop();
        }
        other_thread_ns += copier.copy_bodies(&ring[n % RING_SLOTS].lock().expect("a slot"));
        copied.store(n + 1, Ordering::Release);
    }
    writer.join().expect("the writer thread ends");

    let mut own = vec![0; BUFFER_BYTES];
    let mut own_ns = 0;
    for n in 0..buffers {
        fill(&mut own, n);
        own_ns += copier.copy_bodies(&own);
    }
    CopyFloor {
        other_thread_ns: other_thread_ns as f64 / bodies,
        own_ns: own_ns as f64 / bodies,
    }
}

/// Writes `buffer` a body at a time from a body in the cache, as an appender writes a batch.
fn fill(buffer: &mut [u8], n: usize) {
    let body = [n as u8; EVENT_BYTES];
    for piece in buffer.chunks_exact_mut(EVENT_BYTES) {
        piece.copy_from_slice(&body);
    }
}

/// Copies bodies into two write buffers in turn, as a capture's encoder fills its file's.
struct Copier {
    targets: [Vec<u8>; 2],
    turn: usize,
}

impl Copier {
    fn new() -> Copier {
        Copier {
            targets: [vec![0; BUFFER_BYTES], vec![0; BUFFER_BYTES]],
            turn: 0,
        }
    }

    /// Copies each body of `source` into the next write buffer; the CPU time it took, in ns.
    fn copy_bodies(&mut self, source: &[u8]) -> u64 {
        self.turn ^= 1;
        let target = &mut self.targets[self.turn];
        let before = thread_cpu_ns();
        for (from, to) in source
            .chunks_exact(EVENT_BYTES)
            .zip(target.chunks_exact_mut(EVENT_BYTES))
        {
            to.copy_from_slice(from);
        }
        let spent = thread_cpu_ns() - before;
        std::hint::black_box(&self.targets);
        spent
    }
}
