//! Fetch: a partition's events from an offset (a sequence number), as record batches v2.
//!
//! # Behaviour
//! - Each event is a record whose offset is its sequence number (see [`crate::mapping`]); the
//!   high watermark is the last sequence number + 1 (also the last stable offset: there are no
//!   transactions), the log start offset the first retained one.
//! - `max_wait_ms` and `min_bytes` are honoured: with fewer than `min_bytes` ready, the fetch
//!   waits for an append to one of its partitions (woken by the append, not by polling) or for
//!   `max_wait_ms` (at most [`FETCH_WAIT_MAX`]), then answers with what there is.
//! - `partition_max_bytes` and `max_bytes` bound the answer, but a partition's first event is
//!   always sent whole so a consumer can make progress, as Kafka does.
//! - Under an egress limit ([`tributary_broker::throttle`]) the answer carries
//!   `throttle_time_ms` and the connection is muted that long (see [`crate::connection`]):
//!   reads are slowed to the limit, never refused.
//! - Fetch sessions are declined (session id 0): every fetch names its partitions.
//! - An offset below the log start or above the high watermark gets OFFSET_OUT_OF_RANGE, except
//!   on a compacted hub, where an offset below the first kept event reads from it (compaction
//!   moved the log start, not retention). An offset in a gap compaction left reads from the next
//!   kept event.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::records::{Compression, RecordBatchEncoder, RecordEncodeOptions};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tributary_amqp::auth;

use crate::connection::{Context, DOOR, Session};
use crate::error;
use crate::limits::{FETCH_PARTITION_EVENTS_MAX, FETCH_RESPONSE_BYTES_MAX, FETCH_WAIT_MAX};
use crate::mapping;
use tributary_broker::throttle::{Admit, Cost, Direction};

/// One partition a fetch asks for.
struct Wanted {
    hub: String,
    partition: i32,
    offset: i64,
    max_bytes: u64,
}

/// The Fetch answer, after waiting as `max_wait_ms` and `min_bytes` say, and how long the
/// egress limits throttle the client (the caller sets `throttle_time_ms` and mutes the
/// connection for it).
pub(crate) async fn answer(
    request: FetchRequest,
    session: &Session,
    ctx: &Context,
) -> (FetchResponse, Duration) {
    let wait_ms = u64::try_from(request.max_wait_ms).unwrap_or(0);
    let deadline = Instant::now() + Duration::from_millis(wait_ms).min(FETCH_WAIT_MAX);
    let min_bytes = u64::try_from(request.min_bytes).unwrap_or(0);
    let max_bytes = u64::try_from(request.max_bytes)
        .unwrap_or(0)
        .clamp(1, FETCH_RESPONSE_BYTES_MAX);
    let wanted: Vec<Wanted> = request
        .topics
        .iter()
        .flat_map(|topic| {
            topic.partitions.iter().map(|p| Wanted {
                hub: topic.topic.0.to_string(),
                partition: p.partition,
                offset: p.fetch_offset,
                max_bytes: u64::try_from(p.partition_max_bytes).unwrap_or(0),
            })
        })
        .collect();
    loop {
        let (partitions, bytes, failed, events) = read_all(&wanted, max_bytes, session, ctx);
        let enough = bytes >= min_bytes.max(1) || failed;
        // Wait for an event beyond what is there now: each partition's high watermark.
        let next: Vec<i64> = partitions.iter().map(|p| p.high_watermark).collect();
        if enough || Instant::now() >= deadline || !wait(&wanted, &next, deadline, ctx).await {
            let throttle = charge_egress(&wanted, &partitions, &events, ctx);
            let response = response(&request, partitions);
            return (response, throttle);
        }
    }
}

/// Charges what an answer carries to each hub's (and the namespace's) egress limits: how long
/// the client must wait before its next request (Kafka's `throttle_time_ms`; reads are slowed,
/// never refused).
fn charge_egress(
    wanted: &[Wanted],
    partitions: &[PartitionData],
    events: &[u64],
    ctx: &Context,
) -> Duration {
    let throttle = ctx.broker.throttle();
    let mut costs: Vec<(&str, Cost)> = Vec::new();
    for ((w, p), n) in wanted.iter().zip(partitions).zip(events) {
        let bytes = p.records.as_ref().map_or(0, |r| r.len() as u64);
        if *n == 0 || !throttle.limits_hub(&w.hub, Direction::Egress) {
            continue;
        }
        match costs.iter_mut().find(|(hub, _)| *hub == w.hub) {
            Some((_, cost)) => {
                cost.events += n;
                cost.bytes += bytes;
            }
            None => costs.push((&w.hub, Cost { events: *n, bytes })),
        }
    }
    let now = Instant::now();
    costs
        .into_iter()
        .filter_map(|(hub, cost)| {
            throttle
                .admit(DOOR, hub, Direction::Egress, cost, Admit::Always, now)
                .ok()
        })
        .max()
        .unwrap_or(Duration::ZERO)
}

/// Reads every wanted partition: their answers, the record bytes, and whether any failed.
fn read_all(
    wanted: &[Wanted],
    max_bytes: u64,
    session: &Session,
    ctx: &Context,
) -> (Vec<PartitionData>, u64, bool, Vec<u64>) {
    let mut left = max_bytes;
    let mut failed = false;
    let mut answers = Vec::with_capacity(wanted.len());
    let mut events = Vec::with_capacity(wanted.len());
    for w in wanted {
        let data = PartitionData::default()
            .with_partition_index(w.partition)
            .with_preferred_read_replica(BrokerId(-1))
            .with_aborted_transactions(Some(Vec::new()));
        let data = match read(w, w.max_bytes.min(left), session, ctx) {
            Ok((records, high, start, n)) => {
                left = left.saturating_sub(records.len() as u64);
                events.push(n);
                data.with_high_watermark(high)
                    .with_last_stable_offset(high)
                    .with_log_start_offset(start)
                    .with_records(Some(records))
            }
            Err(code) => {
                failed = true;
                events.push(0);
                data.with_error_code(code)
                    .with_high_watermark(-1)
                    .with_last_stable_offset(-1)
                    .with_log_start_offset(-1)
            }
        };
        answers.push(data);
    }
    (answers, max_bytes - left, failed, events)
}

/// One partition's records from its offset (at most about `max_bytes`, at least one event),
/// its high watermark, its log start offset and how many events the records hold.
fn read(
    w: &Wanted,
    max_bytes: u64,
    session: &Session,
    ctx: &Context,
) -> Result<(Bytes, i64, i64, u64), i16> {
    session.authorize(&w.hub, auth::LISTEN)?;
    if w.partition < 0 {
        return Err(ResponseError::UnknownTopicOrPartition.code());
    }
    let partition = w.partition.to_string();
    let code = |e: tributary_broker::BrokerError| error::code(&e);
    let properties = ctx
        .broker
        .partition_properties(&w.hub, &partition)
        .map_err(code)?;
    let high = properties.last_enqueued_sequence_number + 1;
    let start = properties.begin_sequence_number;
    let from = if w.offset < start && compacts(&w.hub, ctx) {
        // Compaction removed the events before the first kept one: read from there, as a
        // compacted Kafka topic answers an offset whose record was cleaned.
        start
    } else {
        w.offset
    };
    if from < start || from > high {
        return Err(ResponseError::OffsetOutOfRange.code());
    }
    if from == high {
        return Ok((Bytes::new(), high, start, 0));
    }
    let events = ctx
        .broker
        .read(
            &w.hub,
            &partition,
            from,
            FETCH_PARTITION_EVENTS_MAX,
            max_bytes,
        )
        .map_err(code)?;
    let first = events.first().map_or(from, |e| e.sequence_number);
    let count = events.len() as u64;
    let records: Vec<_> = events
        .into_iter()
        .map(|event| mapping::record_from_event(event, first))
        .collect();
    let mut buf = BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    RecordBatchEncoder::encode(&mut buf, &records, &options)
        .map_err(|_| ResponseError::UnknownServerError.code())?;
    Ok((buf.freeze(), high, start, count))
}

/// Whether `hub` compacts (so an offset before its first kept event is not out of range).
fn compacts(hub: &str, ctx: &Context) -> bool {
    ctx.broker
        .describe_hub(hub)
        .is_ok_and(|h| h.cleanup.policy.compacts())
}

/// Waits until one of the wanted partitions has an event at its `next` sequence number (its
/// high watermark when read: an append since), or the deadline, or shutdown. Returns whether
/// something arrived (false: answer now).
async fn wait(wanted: &[Wanted], next: &[i64], deadline: Instant, ctx: &Context) -> bool {
    let left = deadline.saturating_duration_since(Instant::now());
    let mut waits = JoinSet::new();
    for (w, next) in wanted.iter().zip(next).filter(|(_, next)| **next >= 0) {
        let broker = ctx.broker.clone();
        let (hub, partition, offset) = (w.hub.clone(), w.partition.to_string(), *next);
        waits.spawn(async move {
            broker
                .wait_for_sequence(&hub, &partition, offset, left)
                .await
                .unwrap_or(false)
        });
    }
    let mut shutdown = ctx.shutdown.clone();
    tokio::select! {
        arrived = waits.join_next() => matches!(arrived, Some(Ok(true))),
        () = crate::connection::stopping(&mut shutdown) => false,
        () = tokio::time::sleep_until(deadline) => false,
    }
}

/// The response for `request`'s topics, in its order.
fn response(request: &FetchRequest, mut partitions: Vec<PartitionData>) -> FetchResponse {
    let mut responses = Vec::with_capacity(request.topics.len());
    for topic in request.topics.iter().rev() {
        let count = topic.partitions.len();
        let tail = partitions.split_off(partitions.len().saturating_sub(count));
        responses.push(
            FetchableTopicResponse::default()
                .with_topic(TopicName(topic.topic.0.clone()))
                .with_partitions(tail),
        );
    }
    responses.reverse();
    FetchResponse::default()
        .with_session_id(0)
        .with_responses(responses)
}
