//! [`PartitionCapture`]: one partition of one event hub, captured window by window.
//!
//! # Windows
//! A window opens at `window_start_ms` with the event at `next_sequence` (both recorded in the
//! partition's [`Progress`]). [`PartitionCapture::step`] reads every event committed since, and
//! appends each to the window's file as it goes (under its temporary name); the window closes
//! as soon as its events reach the size window, or, after the reading, once the time window has
//! passed since it opened. The next window opens at the close time, but always in a later
//! second than the last one, so one partition's archive names never repeat.
//!
//! # Exactly once across crashes
//! A window's archive name is a function of its start time, and the start time is recorded
//! durably before the window's file can be published. A closed window's file is published
//! whole (see [`crate::destination`]) and only then is the progress advanced past its events.
//! So after a crash (or any error: the capture then recovers exactly as after a restart):
//! - the window's temporary file, if any, is removed, and the window is written again from
//!   `next_sequence`;
//! - if the window's file was published but the progress not yet advanced, the file is found
//!   under the recorded window's name, read back (its first sequence number must be
//!   `next_sequence`; anything else is refused, not overwritten) and the progress advanced past
//!   its last event, so its events are not written a second time.
//!
//! Every event is therefore in exactly one file, whatever the moment of the crash. The
//! notification of a file found at recovery is returned again, and given again to
//! [`PartitionCapture::on_file`], which is called before the progress moves past the file:
//! notifications are at least once.
//!
//! # What it does not do
//! It does not run by itself: [`crate::runner`] steps it inside `serve`. Events retention
//! removed before they were captured (only when told to, `serve --capture-retention proceed`)
//! are skipped with a warning: the capture goes on from the earliest retained event.

use std::sync::Arc;

use tributary_broker::{Broker, ReadCursor, RecordsRead, TailFollower};
use tributary_event::{Clock, EventPosition};

use crate::avro::record_bytes;
use crate::config::CaptureConfig;
use crate::destination::Destination;
use crate::error::CaptureError;
use crate::limits::{READ_BYTES_MAX, READ_EVENTS_MAX};
use crate::notification::{Bounds, CaptureFileCreated};
use crate::progress::{Progress, ProgressStore};
use crate::window::{WindowWriter, summarize, window_writer};

/// Which partition of which event hub of which namespace a capture reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureTarget {
    /// The namespace, as `{Namespace}` in archive names.
    pub namespace: String,
    /// The event hub.
    pub hub: String,
    /// The partition id.
    pub partition: String,
}

/// The window being filled: its file under its temporary name and what it holds.
struct OpenWindow {
    writer: Box<dyn WindowWriter>,
    bounds: Bounds,
    event_count: u64,
    record_bytes: u64,
}

/// The capture of one partition. See the module docs for its guarantees.
pub struct PartitionCapture {
    broker: Broker,
    destination: Arc<dyn Destination>,
    clock: Arc<dyn Clock>,
    config: CaptureConfig,
    target: CaptureTarget,
    store: ProgressStore,
    start: EventPosition,
    /// The recorded progress; `None` until recovery ran (after opening and after any error).
    progress: Option<Progress>,
    /// The sequence number of the next event to read (past the open window's events).
    read_next: i64,
    /// Where the last read ended, and its read buffers (given back when a step finds nothing
    /// new): reads go on from it while it is at `read_next`.
    cursor: ReadCursor,
    /// The last read's records, read in place; its memory is reused by the next read.
    records: RecordsRead,
    /// Keeps the partition's newest batches in memory for the capture's reads, from its first
    /// read on (see [`Broker::follow_tail`]).
    tail: Option<TailFollower>,
    window: Option<OpenWindow>,
    /// Called with each file's notification once the file is durable and before the progress
    /// moves past it (see [`PartitionCapture::on_file`]).
    on_file: Option<OnFile>,
}

/// What [`PartitionCapture::on_file`] takes.
pub type OnFile = Box<dyn FnMut(&CaptureFileCreated) -> Result<(), CaptureError> + Send>;

impl std::fmt::Debug for PartitionCapture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionCapture")
            .field("target", &self.target)
            .field("progress", &self.progress)
            .field("read_next", &self.read_next)
            .finish_non_exhaustive()
    }
}

impl PartitionCapture {
    /// A capture of `target` into `destination`, its progress kept in `state_dir`. A capture
    /// that never ran starts at `start` (Azure captures from when capture is enabled:
    /// [`EventPosition::Latest`]); one that ran goes on from its progress.
    pub fn new(
        broker: Broker,
        destination: Arc<dyn Destination>,
        clock: Arc<dyn Clock>,
        config: CaptureConfig,
        target: CaptureTarget,
        state_dir: &std::path::Path,
        start: EventPosition,
    ) -> Result<PartitionCapture, CaptureError> {
        config.validate()?;
        check_name_part("namespace", &target.namespace)?;
        check_name_part("event hub", &target.hub)?;
        check_name_part("partition", &target.partition)?;
        let store = ProgressStore::new(state_dir, &target.hub, &target.partition);
        Ok(PartitionCapture {
            broker,
            destination,
            clock,
            config,
            target,
            store,
            start,
            progress: None,
            read_next: 0,
            cursor: ReadCursor::new(0),
            records: RecordsRead::new(),
            tail: None,
            window: None,
            on_file: None,
        })
    }

    /// Calls `on_file` with each file's notification after the file is durable and before the
    /// progress is recorded past its events; if it fails, the step fails and the progress stays,
    /// so the file is found again at recovery and `on_file` called again: a notification is
    /// delivered at least once, never lost.
    pub fn on_file(&mut self, on_file: OnFile) {
        self.on_file = Some(on_file);
    }

    /// The recorded progress (after the first step).
    pub fn progress(&self) -> Option<Progress> {
        self.progress
    }

    /// Whether the capture holds memory for reading the partition: after a step that read
    /// events, until a step finds nothing new.
    pub fn holds_read_buffers(&self) -> bool {
        self.cursor.holds_buffers()
    }

    /// The sequence number of the next event the capture reads: a step has work once the
    /// partition holds it.
    pub fn read_next(&self) -> i64 {
        self.read_next
    }

    /// The archive name of the window that started at `window_start_ms`.
    pub fn archive_name(&self, window_start_ms: i64) -> String {
        let t = &self.target;
        self.config.archive_name_format.render_with_extension(
            &t.namespace,
            &t.hub,
            &t.partition,
            window_start_ms,
            self.config.format.extension(),
        )
    }

    /// Recovers if needed, reads what the partition committed, and closes the window if its
    /// size or time is up. Returns a notification per file published (and per file found at
    /// recovery). After an error the next call recovers as a restart would.
    pub fn step(&mut self) -> Result<Vec<CaptureFileCreated>, CaptureError> {
        let outcome = self.step_inner();
        if outcome.is_err() {
            // Forget the open window (its temporary file is removed at recovery) and the read.
            self.window = None;
            self.progress = None;
            self.records.clear();
        }
        outcome
    }

    fn step_inner(&mut self) -> Result<Vec<CaptureFileCreated>, CaptureError> {
        let mut created = Vec::new();
        if self.progress.is_none() {
            created.extend(self.recover()?);
        }
        // Read up to what the partition held when the step began, so a step ends even while
        // producers keep sending.
        let properties = self
            .broker
            .partition_properties(&self.target.hub, &self.target.partition)
            .map_err(|e| self.broker_error(e))?;
        self.skip_removed(properties.begin_sequence_number)?;
        let head = properties.last_enqueued_sequence_number;
        if self.read_next > head {
            // Nothing new since the last step: a quiet partition gives its read buffers back
            // (a busy one keeps them from step to step, and reads into them again).
            self.cursor.release_buffers();
        }
        while self.read_next <= head {
            self.read()?;
            if self.records.is_empty() {
                break;
            }
            let mut next = 0;
            while next < self.records.len() {
                next += self.append(next)?;
                if self
                    .window
                    .as_ref()
                    .is_some_and(|w| w.record_bytes >= self.config.size_bytes_max)
                {
                    created.extend(self.close_window()?);
                }
            }
        }
        // The read's records hold its buffers, which the cursor takes back once they are
        // dropped (and releases when the partition goes quiet).
        self.records.clear();
        let progress = self.progress.expect("recovered");
        if self.clock.now_ms().saturating_sub(progress.window_start_ms) >= self.config.interval_ms()
        {
            created.extend(self.close_window()?);
        }
        Ok(created)
    }

    /// Goes on from `begin`, the partition's earliest retained event, when retention removed
    /// events before they were captured (`serve --capture-retention proceed`): recorded first
    /// when no window is open, so the next window's file starts where its progress says.
    fn skip_removed(&mut self, begin: i64) -> Result<(), CaptureError> {
        if self.read_next >= begin {
            return Ok(());
        }
        tracing::warn!(hub = %self.target.hub, partition = %self.target.partition, from = self.read_next, to = begin, "events were removed before they were captured; going on from the earliest retained event");
        if self.window.is_none() {
            let progress = Progress {
                next_sequence: begin,
                ..self.progress.expect("recovered")
            };
            self.store.save(progress)?;
            self.progress = Some(progress);
        }
        self.read_next = begin;
        Ok(())
    }

    /// Loads (or starts) the progress, removes the window's leftover temporary file, and
    /// accounts for a window file published but not yet recorded.
    fn recover(&mut self) -> Result<Option<CaptureFileCreated>, CaptureError> {
        let progress = match self.store.load()? {
            Some(progress) => progress,
            None => {
                let next_sequence = self
                    .broker
                    .resolve_position(&self.target.hub, &self.target.partition, &self.start)
                    .map_err(|e| self.broker_error(e))?;
                let progress = Progress {
                    next_sequence,
                    window_start_ms: self.clock.now_ms(),
                };
                self.store.save(progress)?;
                progress
            }
        };
        let name = self.archive_name(progress.window_start_ms);
        if self.destination.remove_leftover(&name)? {
            tracing::info!(file = %name, "removed a window file a crash left unfinished");
        }
        self.window = None;
        self.read_next = progress.next_sequence;
        self.progress = Some(progress);
        if !self.destination.exists(&name)? {
            return Ok(None);
        }
        self.adopt_published(&name, progress).map(Some)
    }

    /// Records a window whose file `name` was published before a crash kept its progress from
    /// being recorded.
    fn adopt_published(
        &mut self,
        name: &str,
        progress: Progress,
    ) -> Result<CaptureFileCreated, CaptureError> {
        let corrupted = |reason: String| CaptureError::Corrupted {
            path: self.destination.url(name).into(),
            reason,
        };
        let summary = summarize(self.config.format, self.destination.open(name)?)
            .map_err(|e| corrupted(format!("not a capture file: {e}")))?;
        let bounds = match (summary.first_sequence, summary.last_sequence) {
            (Some(first), Some(last)) if first == progress.next_sequence => {
                Some(((first, 0), (last, 0)))
            }
            (Some(first), _) => {
                return Err(corrupted(format!(
                    "it starts at sequence number {first}, but this window starts at {}: \
                     refusing to overwrite a file this capture did not write",
                    progress.next_sequence
                )));
            }
            _ => None,
        };
        let next_sequence = bounds.map_or(progress.next_sequence, |(_, (last, _))| last + 1);
        tracing::info!(file = %name, next_sequence, "found a window file published before a crash");
        let bounds = self.enqueue_times(bounds)?;
        let created = self.notification(name, summary.event_count, bounds)?;
        self.notify(&created)?;
        self.advance(next_sequence)?;
        Ok(created)
    }

    /// Fills in the enqueued times of a recovered window's first and last events.
    fn enqueue_times(&self, bounds: Bounds) -> Result<Bounds, CaptureError> {
        let Some(((first, _), (last, _))) = bounds else {
            return Ok(None);
        };
        let time = |sequence: i64| -> Result<i64, CaptureError> {
            let events = self
                .broker
                .read(
                    &self.target.hub,
                    &self.target.partition,
                    sequence,
                    1,
                    READ_BYTES_MAX,
                )
                .map_err(|e| self.broker_error(e))?;
            Ok(events.first().map_or(0, |e| e.enqueued_time_ms))
        };
        Ok(Some(((first, time(first)?), (last, time(last)?))))
    }

    /// Reads what the partition holds from `read_next` into `records`.
    fn read(&mut self) -> Result<(), CaptureError> {
        if self.cursor.next_sequence() != self.read_next {
            self.cursor = ReadCursor::new(self.read_next);
        }
        let t = &self.target;
        if self.tail.is_none() {
            // Where the hub is not there, the read below fails too; the next read tries again.
            self.tail = self.broker.follow_tail(&t.hub, &t.partition).ok();
        }
        let read = self.broker.read_records_from(
            &t.hub,
            &t.partition,
            &mut self.cursor,
            READ_EVENTS_MAX,
            READ_BYTES_MAX,
            &mut self.records,
        );
        read.map_err(|e| self.broker_error(e))
    }

    /// Appends the read's records from `first` on (at least one) to the open window, opening
    /// its file first if they are its first: as many as the window's size takes, the last one
    /// crossing it. Returns how many.
    fn append(&mut self, first: usize) -> Result<usize, CaptureError> {
        if self.window.is_none() {
            self.window = Some(self.open_window()?);
        }
        let window = self.window.as_mut().expect("opened above");
        let mut taken = 0;
        let mut bytes = 0;
        let mut next = self.read_next;
        for record in self.records.range(first..self.records.len()) {
            // Sequence numbers may skip: compaction removes events, retention may (see
            // `skip_removed`).
            assert!(record.sequence_number() >= next);
            next = record.sequence_number() + 1;
            taken += 1;
            bytes += record_bytes(&record);
            if window.record_bytes + bytes >= self.config.size_bytes_max {
                break;
            }
        }
        let taken_range = first..first + taken;
        window.writer.append(&self.records, taken_range.clone())?;
        let bound = |index: usize| {
            let record = self.records.get(index).expect("a record of the read");
            (record.sequence_number(), record.enqueued_time_ms())
        };
        let (first, last) = (bound(taken_range.start), bound(taken_range.end - 1));
        window.bounds = Some(
            window
                .bounds
                .map_or((first, last), |(first, _)| (first, last)),
        );
        window.event_count += taken as u64;
        window.record_bytes += bytes;
        self.read_next = next;
        Ok(taken)
    }

    fn current_name(&self) -> String {
        self.archive_name(self.progress.expect("recovered").window_start_ms)
    }

    fn open_window(&self) -> Result<OpenWindow, CaptureError> {
        let name = self.current_name();
        let file = self.destination.create(&name)?;
        let writer = window_writer(self.config.format, file, &name)?;
        Ok(OpenWindow {
            writer,
            bounds: None,
            event_count: 0,
            record_bytes: 0,
        })
    }

    /// Closes the window: publishes its file (unless it is empty and empty windows are
    /// skipped), then records the progress past it.
    fn close_window(&mut self) -> Result<Option<CaptureFileCreated>, CaptureError> {
        let progress = self.progress.expect("recovered");
        let window = match self.window.take() {
            Some(window) => window,
            None if self.config.skip_empty => {
                self.advance(progress.next_sequence)?;
                return Ok(None);
            }
            None => self.open_window()?,
        };
        let name = self.current_name();
        let size = window.writer.finish()?.publish()?;
        let next_sequence = window
            .bounds
            .map_or(progress.next_sequence, |(_, (last, _))| last + 1);
        assert_eq!(next_sequence, self.read_next);
        let created = CaptureFileCreated::new(
            self.destination.url(&name),
            self.destination.file_type(),
            &self.target.partition,
            size,
            window.event_count,
            window.bounds,
        );
        self.notify(&created)?;
        self.advance(next_sequence)?;
        Ok(Some(created))
    }

    /// Records that the next window starts at `next_sequence`, now (in a later second than the
    /// window that closed).
    fn advance(&mut self, next_sequence: i64) -> Result<(), CaptureError> {
        let closed = self.progress.expect("recovered");
        let next_second_ms = (closed.window_start_ms.div_euclid(1000) + 1) * 1000;
        let progress = Progress {
            next_sequence,
            window_start_ms: self.clock.now_ms().max(next_second_ms),
        };
        self.store.save(progress)?;
        self.progress = Some(progress);
        self.read_next = next_sequence;
        Ok(())
    }

    fn notify(&mut self, created: &CaptureFileCreated) -> Result<(), CaptureError> {
        match self.on_file.as_mut() {
            Some(on_file) => on_file(created),
            None => Ok(()),
        }
    }

    fn notification(
        &self,
        name: &str,
        event_count: u64,
        bounds: Bounds,
    ) -> Result<CaptureFileCreated, CaptureError> {
        Ok(CaptureFileCreated::new(
            self.destination.url(name),
            self.destination.file_type(),
            &self.target.partition,
            self.destination.size(name)?,
            event_count,
            bounds,
        ))
    }

    fn broker_error(&self, source: tributary_broker::BrokerError) -> CaptureError {
        CaptureError::Broker {
            hub: self.target.hub.clone(),
            partition: self.target.partition.clone(),
            source: Box::new(source),
        }
    }
}

/// Refuses a name part that would change an archive name's path shape.
fn check_name_part(what: &'static str, value: &str) -> Result<(), CaptureError> {
    if value.is_empty() || value == "." || value == ".." || value.contains(['/', '\0']) {
        return Err(CaptureError::InvalidConfig {
            setting: what,
            reason: format!("{value:?} cannot be part of an archive name"),
        });
    }
    Ok(())
}
