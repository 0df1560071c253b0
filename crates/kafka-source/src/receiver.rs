//! [`KafkaReceiver`]: one partition read by assignment through its own librdkafka consumer.
//!
//! What it guarantees, as `tributary-source` asks:
//! - events arrive in partition (offset) order, each at most once per receiver, starting where
//!   the source resolved the start position when the receiver opened;
//! - buffering is bounded: librdkafka prefetches up to `prefetch` records
//!   (`queued.min.messages`) and at most [`PREFETCH_KIB_MAX`] KiB;
//! - a receiver disconnected by a higher owner level of the same source fails its next
//!   `receive` with [`SourceError::OwnershipLost`] (see `epochs` for why only the same source);
//! - a position the cluster no longer retains (deleted by retention) restarts at the oldest
//!   retained record, as a Kafka consumer with `auto.offset.reset=earliest` and MirrorMaker do.
//!
//! The last-enqueued properties (with `track_last_enqueued`) come from the partition's high
//! watermark, asked at most every [`WATERMARKS_REFRESH_INTERVAL`]: the sequence number and
//! offset are the newest record's; Kafka's watermark carries no time, so the enqueued time is
//! that of the newest record this receiver delivered.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::{Consumer, StreamConsumer};
use tokio::time::Instant;
use tributary_event::ReceivedEvent;
use tributary_source::{
    LastEnqueuedEventProperties, PartitionReceiver, ReceiverOptions, SourceError,
};

use crate::epochs::EpochClaim;
use crate::error::source_error;
use crate::limits::{
    FETCH_QUEUE_BACKOFF_MS, FETCH_WAIT_MS_MAX, PREFETCH_KIB_MAX, WATERMARKS_REFRESH_INTERVAL,
};
use crate::ready::{ReadyRecords, event_of_message};
use crate::source::{Shared, StartAt, blocking};

/// A reader of one Kafka partition; see the [module docs](self).
pub(crate) struct KafkaReceiver {
    shared: Arc<Shared>,
    consumer: Option<Arc<StreamConsumer>>,
    /// The consumer's queue, for the records after a batch's first (see `take`).
    ready: Option<ReadyRecords>,
    partition: i32,
    options: ReceiverOptions,
    claim: EpochClaim,
    /// An error met after some events of a batch were taken: reported by the next `receive`.
    pending_error: Option<SourceError>,
    last_enqueued: Option<LastEnqueuedEventProperties>,
    watermarks_asked_at: Option<Instant>,
    /// The enqueued time of the newest event delivered.
    newest_delivered_ms: i64,
    /// Set for a start by time until the first record at or after it came (see `StartAt`).
    skip_before_ms: Option<i64>,
}

impl KafkaReceiver {
    /// Makes the partition's consumer and assigns it the partition at `start`.
    pub(crate) fn open(
        shared: Arc<Shared>,
        options: ReceiverOptions,
        partition: i32,
        claim: EpochClaim,
        start: StartAt,
    ) -> Result<KafkaReceiver, SourceError> {
        let mut receiver = KafkaReceiver {
            shared,
            consumer: None,
            ready: None,
            partition,
            options,
            claim,
            pending_error: None,
            last_enqueued: None,
            watermarks_asked_at: None,
            newest_delivered_ms: 0,
            skip_before_ms: start.skip_before_ms,
        };
        // On an error the receiver is dropped, which releases its epoch claim.
        let consumer = receiver.make_consumer()?;
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(&receiver.shared.topic, partition, start.offset)
            .and_then(|()| consumer.assign(&assignment))
            .map_err(|e| source_error("cannot assign the partition", &e))?;
        let consumer = Arc::new(consumer);
        receiver.ready = Some(ReadyRecords::new(Arc::clone(&consumer)));
        receiver.consumer = Some(consumer);
        Ok(receiver)
    }

    fn make_consumer(&self) -> Result<StreamConsumer, SourceError> {
        let mut config = self.shared.options.client_config();
        // librdkafka assigns partitions only to a consumer with a group id. The consumer never
        // joins the group (assignment, not subscription) and commits nothing.
        config
            .set("group.id", &self.options.consumer_group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("auto.offset.reset", "earliest")
            .set(
                "queued.min.messages",
                self.options.prefetch.max(1).to_string(),
            )
            .set("queued.max.messages.kbytes", PREFETCH_KIB_MAX.to_string())
            .set("fetch.wait.max.ms", FETCH_WAIT_MS_MAX.to_string())
            .set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS.to_string());
        config
            .create()
            .map_err(|e| source_error("cannot make the Kafka consumer", &e))
    }

    fn consumer(&self) -> &Arc<StreamConsumer> {
        self.consumer.as_ref().expect("set when opened")
    }

    fn ownership_lost(&self) -> SourceError {
        SourceError::OwnershipLost {
            description: format!(
                "partition {} of Kafka topic {:?} was opened with a higher owner level",
                self.partition, self.shared.topic
            ),
        }
    }

    /// Takes up to `max_events`, waiting up to `wait` for the first.
    ///
    /// The first record is awaited through a message stream (which registers a waker with
    /// the consumer's queue); the rest of the batch is only what librdkafka already holds,
    /// taken in one call ([`ReadyRecords`]) rather than one poll each. (A stream never ends:
    /// `None` is read as nothing there.)
    async fn take(
        &mut self,
        max_events: usize,
        wait: Duration,
    ) -> Result<Vec<ReceivedEvent>, SourceError> {
        let consumer = Arc::clone(self.consumer());
        let first = {
            let mut messages = consumer.stream();
            match tokio::time::timeout(wait, messages.next()).await {
                Err(_) | Ok(None) => return Ok(Vec::new()),
                Ok(Some(first)) => {
                    first.map_err(|e| source_error("cannot read the partition", &e))?
                }
            }
        };
        // Room for as many as librdkafka prefetches, up to the batch: growing the list would
        // copy every event in it again.
        let prefetch = usize::try_from(self.options.prefetch.max(1)).unwrap_or(usize::MAX);
        let mut events = Vec::with_capacity(max_events.min(prefetch));
        events.push(event_of_message(&first));
        drop(first);
        let ready = self.ready.as_mut().expect("set when opened");
        if let Err(e) = ready.take(max_events - 1, &mut events) {
            self.pending_error = Some(source_error("cannot read the partition", &e));
        }
        self.skip_early_records(&mut events);
        Ok(events)
    }

    /// Drops the records before the start time, up to the first one at or after it.
    fn skip_early_records(&mut self, events: &mut Vec<ReceivedEvent>) {
        let Some(from_ms) = self.skip_before_ms else {
            return;
        };
        match events.iter().position(|e| e.enqueued_time_ms >= from_ms) {
            Some(first) => {
                events.drain(..first);
                self.skip_before_ms = None;
            }
            None => events.clear(),
        }
    }

    /// Asks for the high watermark when the last answer is older than the refresh interval.
    async fn refresh_last_enqueued(&mut self) {
        let now = Instant::now();
        if self
            .watermarks_asked_at
            .is_some_and(|at| now < at + WATERMARKS_REFRESH_INTERVAL)
        {
            return;
        }
        self.watermarks_asked_at = Some(now);
        let (shared, partition) = (Arc::clone(&self.shared), self.partition);
        match blocking(move || shared.extent(partition)).await {
            Ok(extent) => {
                self.last_enqueued = extent
                    .last_offset()
                    .map(|last| LastEnqueuedEventProperties {
                        sequence_number: last,
                        offset: last.unsigned_abs(),
                        enqueued_time_ms: self.newest_delivered_ms,
                        retrieved_time_ms: now_ms(),
                    });
            }
            // Reading goes on; the properties stay as last known.
            Err(error) => tracing::debug!(partition, %error, "watermarks not read"),
        }
    }
}

fn now_ms() -> i64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX)
}

#[async_trait::async_trait]
impl PartitionReceiver for KafkaReceiver {
    async fn receive(
        &mut self,
        max_events: usize,
        wait: Duration,
    ) -> Result<Vec<ReceivedEvent>, SourceError> {
        assert!(max_events > 0, "a batch holds at least one event");
        if self.claim.is_stolen() {
            return Err(self.ownership_lost());
        }
        if let Some(error) = self.pending_error.take() {
            return Err(error);
        }
        let events = self.take(max_events, wait).await?;
        if self.claim.is_stolen() {
            return Err(self.ownership_lost());
        }
        assert!(events.len() <= max_events);
        if let Some(last) = events.last() {
            self.newest_delivered_ms = last.enqueued_time_ms;
        }
        if self.options.track_last_enqueued {
            self.refresh_last_enqueued().await;
        }
        Ok(events)
    }

    fn last_enqueued(&self) -> Option<LastEnqueuedEventProperties> {
        self.last_enqueued
    }

    async fn close(mut self: Box<Self>) {
        // Dropping a consumer stops its threads and may wait for them: off the caller's task.
        // The queue handle goes first: it holds the consumer too.
        drop(self.ready.take());
        if let Some(consumer) = self.consumer.take() {
            let _ = tokio::task::spawn_blocking(move || drop(consumer)).await;
        }
    }
}

impl Drop for KafkaReceiver {
    fn drop(&mut self) {
        self.shared.epochs.release(
            &self.options.consumer_group,
            &self.options.partition_id,
            &self.claim,
        );
    }
}
