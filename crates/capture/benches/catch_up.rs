//! What capture costs per event, on its own: a capture catching up on a partition that holds
//! its events in the page cache, with nothing else running, and its two parts, reading and
//! writing, alone.
//!
//! `tributary bench --scenario capture` measures capture beside a hub taking events, which is
//! the target but moves with the hub's load and with this VM's memory (BENCHMARKS.md,
//! "The machine"). This bench keeps only the capture's own work, repeated over the same warm
//! log, so two builds can be told apart:
//!
//! - **read**: every event read from the log as the capture reads it, in place
//!   (`Broker::read_records_from`, as many events a read as the capture asks for), nothing
//!   written; **read (owned events)** reads them as receivers do (`Broker::read_from`);
//! - **write**: the events of one read encoded as Avro blocks into window files of about
//!   10 MiB, published as the capture's are, without reading the log (the records'
//!   and the files' CPU): with `O_DIRECT` (the default) and through the page cache;
//! - **catch up**: a [`PartitionCapture`] from the first event, one step over all of them:
//!   Avro, no deflate, a `file:` destination (`O_DIRECT` where the file system takes it),
//!   size window 10 MiB. CPU is the stepping thread's plus its files' writer threads'.
//!
//! Each part's files are emptied once it is measured, not removed: an unlink inside a measured
//! part would be charged to it, and on ext4 without a journal so would every later file
//! creation that steps over the freed inode; files kept whole would fill the page cache.
//!
//! `cargo bench -p tributary-capture --bench catch_up` fills 256 MiB of 1 KiB events (durability
//! `none`; the log's files stay in the page cache) and runs each part [`ROUNDS`] times; it prints
//! each round's CPU per event and their median. Under `cargo test --all-targets` (no `--bench`)
//! it runs on 24 MiB, once: a smoke test, not a measurement. `--only read|write|catch-up` runs
//! that part alone (for a profile of it).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rustix::time::{ClockId, clock_gettime};
use tributary_broker::{Broker, BrokerConfig, Durability, HubSpec, ReadCursor, RecordsRead};
use tributary_capture::avro::AvroFileWriter;
use tributary_capture::limits::{READ_BYTES_MAX, READ_EVENTS_MAX, SIZE_BYTES_MIN};
use tributary_capture::{
    CaptureConfig, CaptureFormat, CaptureTarget, Destination, DirectoryDestination,
    PartitionCapture, WriteMode, writer_threads_cpu,
};
use tributary_event::{EventData, EventPosition, ReceivedEvent, SendTarget};

// The allocator the `tributary` binary runs capture with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const HUB: &str = "captured";
const EVENT_BYTES: usize = 1024;
const BATCH_EVENTS: usize = 100;
const ROUNDS: usize = 5;

fn main() {
    let measuring = std::env::args().any(|a| a == "--bench");
    // The smoke test still fills more than two size windows, so files are published.
    let (fill_bytes, files, rounds) = if measuring {
        (256 << 20, 8, ROUNDS)
    } else {
        (24 << 20, 1, 1)
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let events = fill_bytes / EVENT_BYTES / BATCH_EVENTS * BATCH_EVENTS;
    let broker = runtime.block_on(fill(dir.path(), events));
    let events = events as u64;
    println!(
        "# capture catching up: {events} events of {EVENT_BYTES} B in one partition (page cache), {rounds} rounds"
    );
    // `--only PART` (`read`, `write`, `catch-up`) runs that part alone, for a profile of it.
    let args: Vec<String> = std::env::args().collect();
    let only = args
        .windows(2)
        .find(|pair| pair[0] == "--only")
        .map(|pair| pair[1].as_str());
    let runs = |part: &str| only.is_none_or(|only| only == part);
    let mut figures = [const { Vec::new() }; 5];
    for round in 0..rounds {
        let round_dir = dir.path().join(format!("round-{round}"));
        if runs("read") {
            figures[0].push(read_all(&broker, events));
            figures[4].push(read_all_owned(&broker, events));
        }
        if runs("write") {
            for (figure, mode) in [(1, WriteMode::Direct), (2, WriteMode::Buffered)] {
                figures[figure].push(encode_and_write(&broker, &round_dir, files, mode));
            }
        }
        if runs("catch-up") {
            figures[3].push(catch_up(&broker, &round_dir, events));
        }
    }
    let names = [
        "read",
        "write (O_DIRECT)",
        "write (page cache)",
        "catch up",
        "read (owned events)",
    ];
    for (name, mut runs) in names.into_iter().zip(figures) {
        if runs.is_empty() {
            continue;
        }
        let each: Vec<String> = runs.iter().map(|ns| format!("{ns:.0}")).collect();
        runs.sort_by(f64::total_cmp);
        println!(
            "{name:<18} {:>6.0} ns CPU per event (median; rounds: {})",
            runs[runs.len() / 2],
            each.join(", ")
        );
    }
}

/// A hub of one partition holding `count` events of [`EVENT_BYTES`], durability `none`.
async fn fill(root: &Path, count: usize) -> Broker {
    let mut config = BrokerConfig::new(root.join("hub"));
    config.log.durability = Durability::None;
    let broker = Broker::open(config).await.expect("the hub opens");
    broker
        .create_hub(HubSpec::new(HUB, 1))
        .await
        .expect("the hub is created");
    let body = Bytes::from(vec![0x5a; EVENT_BYTES]);
    let batch: Vec<EventData> = (0..BATCH_EVENTS)
        .map(|_| EventData::new(body.clone()))
        .collect();
    for _ in 0..count / BATCH_EVENTS {
        broker
            .send(HUB, SendTarget::RoundRobin, batch.clone())
            .await
            .expect("a batch is taken");
    }
    broker
}

/// The calling thread's CPU time in nanoseconds.
fn thread_cpu_ns() -> f64 {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    t.tv_sec as f64 * 1e9 + t.tv_nsec as f64
}

fn read_records(broker: &Broker, cursor: &mut ReadCursor, into: &mut RecordsRead) {
    broker
        .read_records_from(HUB, "0", cursor, READ_EVENTS_MAX, READ_BYTES_MAX, into)
        .expect("the log reads");
}

/// Reads every event as the capture does (in place); CPU per event.
fn read_all(broker: &Broker, events: u64) -> f64 {
    let started = thread_cpu_ns();
    let mut cursor = ReadCursor::new(0);
    let mut records = RecordsRead::new();
    let mut read = 0;
    loop {
        read_records(broker, &mut cursor, &mut records);
        if records.is_empty() {
            break;
        }
        read += records.len() as u64;
        std::hint::black_box(&records);
    }
    assert_eq!(read, events, "every event is read");
    (thread_cpu_ns() - started) / read as f64
}

/// Reads every event as owned events (as a receiver does); CPU per event.
fn read_all_owned(broker: &Broker, events: u64) -> f64 {
    let started = thread_cpu_ns();
    let mut cursor = ReadCursor::new(0);
    let mut read = 0;
    loop {
        let batch: Vec<ReceivedEvent> = broker
            .read_from(HUB, "0", &mut cursor, READ_EVENTS_MAX, READ_BYTES_MAX)
            .expect("the log reads");
        if batch.is_empty() {
            break;
        }
        read += batch.len() as u64;
        std::hint::black_box(&batch);
    }
    assert_eq!(read, events, "every event is read");
    (thread_cpu_ns() - started) / read as f64
}

/// Encodes one read's events as Avro blocks into `files` window files, 10 times per file
/// (about 10 MiB, the size window), and publishes each; CPU per event, the files' writer
/// threads' included.
fn encode_and_write(broker: &Broker, root: &Path, files: usize, mode: WriteMode) -> f64 {
    let mut records = RecordsRead::new();
    read_records(broker, &mut ReadCursor::new(0), &mut records);
    let destination = DirectoryDestination::new(root.join(format!("written-{mode:?}")))
        .expect("the destination opens")
        .with_write_mode(mode);
    let repeats = 10;
    let writers_before = writer_threads_cpu();
    let started = thread_cpu_ns();
    for file in 0..files {
        let name = format!("window-{file}.avro");
        let mut writer = AvroFileWriter::new(
            destination.create(&name).expect("a window file"),
            CaptureFormat::Avro,
        )
        .expect("the header writes");
        for _ in 0..repeats {
            writer
                .append_all(&records, 0..records.len())
                .expect("the blocks are written");
        }
        writer
            .finish()
            .expect("the file ends")
            .publish()
            .expect("the file is published");
    }
    let spent =
        thread_cpu_ns() - started + (writer_threads_cpu() - writers_before).as_nanos() as f64;
    empty_files(&root.join(format!("written-{mode:?}")));
    spent / (files * repeats * records.len()) as f64
}

/// A capture from the first event, one step; CPU per captured event (the stepping thread's and
/// its files' writer threads').
fn catch_up(broker: &Broker, root: &Path, events: u64) -> f64 {
    let destination: Arc<dyn Destination> =
        Arc::new(DirectoryDestination::new(root.join("capture")).expect("the destination opens"));
    let config = CaptureConfig {
        interval: Duration::from_secs(900),
        size_bytes_max: SIZE_BYTES_MIN,
        skip_empty: true,
        format: CaptureFormat::Avro,
        ..CaptureConfig::default()
    };
    let target = CaptureTarget {
        namespace: "bench".into(),
        hub: HUB.into(),
        partition: "0".into(),
    };
    let mut capture = PartitionCapture::new(
        broker.clone(),
        destination,
        broker.clock(),
        config,
        target,
        &root.join("state"),
        EventPosition::Earliest,
    )
    .expect("the capture starts");
    let writers_before = writer_threads_cpu();
    let started = thread_cpu_ns();
    let files = capture.step().expect("the capture steps");
    let spent =
        thread_cpu_ns() - started + (writer_threads_cpu() - writers_before).as_nanos() as f64;
    let captured: u64 = files.iter().map(|f| f.event_count).sum();
    assert!(
        captured > events / 2 && capture.read_next() == events as i64,
        "the capture read all {events} events and published most ({captured})"
    );
    empty_files(&root.join("capture"));
    spent / captured as f64
}

/// Empties every file below `dir`, after a measured part: the blocks and the page cache they
/// held are free for the next part, and no inode is freed (see the module docs).
fn empty_files(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("a directory the bench wrote") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            empty_files(&path);
        } else {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|file| file.set_len(0))
                .expect("a file the bench wrote empties");
        }
    }
}
