//! Crash safety: a destination that fails at one chosen operation — creating the temporary
//! file, any write into it, before its rename, or after the rename but before the progress is
//! recorded — then a restart (a new capture on the same state) or an in-process retry. Over
//! seeded runs with random sends, clock moves and crash points, every event of the hub is in
//! exactly one file and no temporary file is left.

mod common;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng};
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Fixture, avro_files, captured_sequences};
use tributary_capture::{
    CaptureConfig, CaptureError, Destination, DirectoryDestination, PendingFile,
};
use tributary_event::EventData;

/// Counts the destination's operations and fails the one numbered `fail_at`.
#[derive(Debug, Clone)]
struct Faults {
    done: Arc<AtomicU64>,
    fail_at: Arc<AtomicU64>,
    fail_on: Arc<Mutex<Option<&'static str>>>,
    /// The operations that failed, by name.
    failed: Arc<Mutex<std::collections::BTreeSet<&'static str>>>,
}

impl Faults {
    fn new() -> Faults {
        Faults {
            done: Arc::new(AtomicU64::new(0)),
            fail_at: Arc::new(AtomicU64::new(u64::MAX)),
            fail_on: Arc::new(Mutex::new(None)),
            failed: Arc::default(),
        }
    }

    /// Fails the next operation called `what`.
    fn fail_next(&self, what: &'static str) {
        *self.fail_on.lock().unwrap() = Some(what);
    }

    /// Fails the operation `ahead` operations from now.
    fn fail_in(&self, ahead: u64) {
        self.fail_at
            .store(self.done.load(Ordering::SeqCst) + ahead, Ordering::SeqCst);
    }

    fn tick(&self, what: &'static str) -> Result<(), String> {
        let n = self.done.fetch_add(1, Ordering::SeqCst);
        let mut fail_on = self.fail_on.lock().unwrap();
        if *fail_on == Some(what) {
            *fail_on = None;
            return Err(format!("injected crash at {what}"));
        }
        if n == self.fail_at.load(Ordering::SeqCst) {
            self.failed.lock().unwrap().insert(what);
            Err(format!("injected crash at operation {n} ({what})"))
        } else {
            Ok(())
        }
    }
}

fn crash(reason: String) -> CaptureError {
    CaptureError::Destination {
        destination: "faulty".into(),
        reason,
    }
}

#[derive(Debug)]
struct FaultyDestination {
    inner: DirectoryDestination,
    faults: Faults,
}

impl Destination for FaultyDestination {
    fn create(&self, name: &str) -> Result<Box<dyn PendingFile>, CaptureError> {
        self.faults.tick("create").map_err(crash)?;
        Ok(Box::new(FaultyFile {
            inner: self.inner.create(name)?,
            faults: self.faults.clone(),
        }))
    }
    fn exists(&self, name: &str) -> Result<bool, CaptureError> {
        self.inner.exists(name)
    }
    fn open(&self, name: &str) -> Result<Box<dyn Read + Send>, CaptureError> {
        self.inner.open(name)
    }
    fn size(&self, name: &str) -> Result<u64, CaptureError> {
        self.inner.size(name)
    }
    fn remove_leftover(&self, name: &str) -> Result<bool, CaptureError> {
        self.inner.remove_leftover(name)
    }
    fn leftovers(&self) -> Result<Vec<String>, CaptureError> {
        self.inner.leftovers()
    }
    fn url(&self, name: &str) -> String {
        self.inner.url(name)
    }
    fn file_type(&self) -> &'static str {
        self.inner.file_type()
    }
}

struct FaultyFile {
    inner: Box<dyn PendingFile>,
    faults: Faults,
}

impl std::io::Write for FaultyFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Err(crash) = self.faults.tick("write") {
            // A crash in the middle of a write leaves part of it.
            self.inner.write_all(&buf[..buf.len() / 2])?;
            return Err(std::io::Error::other(crash));
        }
        self.inner.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

impl PendingFile for FaultyFile {
    fn publish(self: Box<Self>) -> Result<u64, CaptureError> {
        self.faults.tick("before rename").map_err(crash)?;
        let size = self.inner.publish()?;
        // The file is visible; failing now is a crash before the progress is recorded.
        self.faults.tick("after rename").map_err(crash)?;
        Ok(size)
    }
}

/// Runs one seeded scenario; returns the operations that failed in it.
async fn run_seed(seed: u64) -> std::collections::BTreeSet<&'static str> {
    let f = Fixture::start(1).await;
    let mut rng = StdRng::seed_from_u64(seed);
    let faults = Faults::new();
    let destination: Arc<dyn Destination> = Arc::new(FaultyDestination {
        inner: f.destination(),
        faults: faults.clone(),
    });
    let config = CaptureConfig {
        interval: Duration::from_secs(60),
        skip_empty: rng.gen_range(0..2) == 0,
        ..CaptureConfig::default()
    };
    let mut capture = f.capture_with(destination.clone(), config.clone(), "0");
    let mut sent = 0_i64;
    let mut crashes = 0;
    for round in 0..40 {
        let n = rng.gen_range(0..4);
        if n > 0 {
            let body = |i: u64| EventData::new(format!("seed {seed} round {round} event {i}"));
            f.send("0", (0..n).map(body).collect()).await;
            sent += n as i64;
        }
        f.advance_secs(rng.gen_range(0..50) as i64);
        if rng.gen_range(0..3) == 0 {
            faults.fail_in(rng.gen_range(0..6));
        }
        if capture.step().is_err() {
            crashes += 1;
            if rng.gen_range(0..2) == 0 {
                // A restart: a new capture on the same progress and files.
                capture = f.capture_with(destination.clone(), config.clone(), "0");
            }
        }
    }
    faults.fail_in(u64::MAX / 2);
    f.advance_secs(120);
    capture.step().unwrap();
    f.advance_secs(120);
    capture.step().unwrap();

    let mut captured = captured_sequences(&f.files_root());
    let in_order = captured.clone();
    captured.sort_unstable();
    assert_eq!(
        captured,
        (0..sent).collect::<Vec<_>>(),
        "seed {seed} ({crashes} crashes)"
    );
    assert_eq!(
        in_order, captured,
        "seed {seed}: files in name order hold the events in order"
    );
    assert!(destination.leftovers().unwrap().is_empty(), "seed {seed}");
    assert!(
        avro_files(&f.files_root())
            .keys()
            .all(|n| n.ends_with(".avro")),
        "seed {seed}"
    );
    faults.failed.lock().unwrap().clone()
}

#[tokio::test]
async fn every_event_is_in_exactly_one_file_whatever_the_crash_point() {
    let mut failed = std::collections::BTreeSet::new();
    for seed in 0..60 {
        failed.extend(run_seed(seed).await);
    }
    let every_point = ["after rename", "before rename", "create", "write"];
    assert_eq!(
        failed.into_iter().collect::<Vec<_>>(),
        every_point,
        "crash points exercised"
    );
}

#[tokio::test]
async fn a_crash_after_the_rename_does_not_write_the_window_again() {
    let f = Fixture::start(1).await;
    let faults = Faults::new();
    let destination: Arc<dyn Destination> = Arc::new(FaultyDestination {
        inner: f.destination(),
        faults: faults.clone(),
    });
    let config = CaptureConfig::default();
    let mut capture = f.capture_with(destination.clone(), config.clone(), "0");
    f.send("0", vec![EventData::new("a"), EventData::new("b")])
        .await;
    capture.step().unwrap();
    f.advance_secs(300);
    faults.fail_next("after rename");
    let error = capture.step().unwrap_err().to_string();
    assert!(error.contains("after rename"), "{error}");
    assert_eq!(avro_files(&f.files_root()).len(), 1, "the file is visible");

    f.send("0", vec![EventData::new("c")]).await;
    let mut restarted = f.capture_with(destination, config, "0");
    let found = restarted.step().unwrap();
    assert_eq!(
        found.len(),
        1,
        "the file found at recovery is notified again"
    );
    assert_eq!(
        (
            found[0].first_sequence_number,
            found[0].last_sequence_number
        ),
        (0, 1)
    );
    f.advance_secs(300);
    restarted.step().unwrap();
    assert_eq!(captured_sequences(&f.files_root()), [0, 1, 2]);
}

#[tokio::test]
async fn a_file_this_capture_did_not_write_is_refused_not_overwritten() {
    let f = Fixture::start(1).await;
    let mut capture = f.capture(CaptureConfig::default(), "0");
    capture.step().unwrap();
    let name = capture.archive_name(capture.progress().unwrap().window_start_ms);
    f.send("0", vec![EventData::new("a")]).await;
    // Someone else's capture file under this window's name, starting elsewhere.
    let path = f.files_root().join(&name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let foreign = f.broker.read(common::HUB, "0", 0, 1, u64::MAX).unwrap();
    let mut other = foreign[0].clone();
    other.sequence_number = 41;
    let mut writer = tributary_capture::avro::AvroFileWriter::new(
        std::fs::File::create(&path).unwrap(),
        tributary_capture::CaptureFormat::Avro,
    )
    .unwrap();
    let other = tributary_broker::RecordsRead::from_events(&[other]);
    writer.append(&other.get(0).unwrap()).unwrap();
    writer.finish().unwrap();

    let mut restarted = f.capture(CaptureConfig::default(), "0");
    let error = restarted.step().unwrap_err().to_string();
    assert!(error.contains("refusing to overwrite"), "{error}");
    assert!(error.contains("starts at sequence number 41"), "{error}");
}

#[tokio::test]
async fn a_damaged_progress_file_is_an_error_naming_it() {
    let f = Fixture::start(1).await;
    let mut capture = f.capture(CaptureConfig::default(), "0");
    capture.step().unwrap();
    let path = f.state_dir().join("orders/0.progress");
    assert!(path.exists());
    std::fs::write(&path, b"{not a progress file").unwrap();
    let error = f
        .capture(CaptureConfig::default(), "0")
        .step()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("0.progress") && error.contains("not a capture progress file"),
        "{error}"
    );
}
