//! ListOffsets: where a partition starts and ends, and the first offset at or after a time.
//!
//! Offsets are sequence numbers. Earliest (−2) is the first retained event, latest (−1) the
//! next sequence number (the high watermark); a timestamp finds the first event enqueued at or
//! after it through the broker's read by enqueued time (−1 and −1 when there is none, as Kafka
//! answers); max-timestamp (−3) the newest event.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::{ListOffsetsRequest, ListOffsetsResponse};
use tributary_amqp::auth;
use tributary_event::EventPosition;

use crate::connection::{Context, Session};
use crate::error;

/// Kafka's "latest" timestamp.
const LATEST: i64 = -1;
/// Kafka's "earliest" timestamp.
const EARLIEST: i64 = -2;
/// Kafka's "the newest record's timestamp".
const MAX_TIMESTAMP: i64 = -3;

/// The ListOffsets answer.
pub(crate) fn answer(
    request: &ListOffsetsRequest,
    session: &Session,
    ctx: &Context,
) -> ListOffsetsResponse {
    let topics = request
        .topics
        .iter()
        .map(|topic| {
            let hub = topic.name.0.as_str();
            let partitions = topic
                .partitions
                .iter()
                .map(|p| {
                    let response = ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_leader_epoch(-1);
                    match find(hub, p.partition_index, p.timestamp, session, ctx) {
                        Ok((offset, timestamp)) => {
                            response.with_offset(offset).with_timestamp(timestamp)
                        }
                        Err(code) => response
                            .with_error_code(code)
                            .with_offset(-1)
                            .with_timestamp(-1),
                    }
                })
                .collect();
            ListOffsetsTopicResponse::default()
                .with_name(topic.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    ListOffsetsResponse::default().with_topics(topics)
}

/// The offset and timestamp for one partition and asked timestamp.
fn find(
    hub: &str,
    index: i32,
    timestamp: i64,
    session: &Session,
    ctx: &Context,
) -> Result<(i64, i64), i16> {
    session.authorize(hub, auth::LISTEN)?;
    if index < 0 {
        return Err(ResponseError::UnknownTopicOrPartition.code());
    }
    let partition = index.to_string();
    let broker = &ctx.broker;
    let properties = broker
        .partition_properties(hub, &partition)
        .map_err(|e| error::code(&e))?;
    let end = properties.last_enqueued_sequence_number + 1;
    let sequence = match timestamp {
        EARLIEST => return Ok((properties.begin_sequence_number, -1)),
        LATEST => return Ok((end, -1)),
        MAX_TIMESTAMP if properties.is_empty => return Ok((-1, -1)),
        MAX_TIMESTAMP => properties.last_enqueued_sequence_number,
        time if time < 0 => return Err(ResponseError::InvalidRequest.code()),
        time => {
            let at = EventPosition::EnqueuedTime {
                enqueued_time_ms: time,
                inclusive: true,
            };
            broker
                .resolve_position(hub, &partition, &at)
                .map_err(|e| error::code(&e))?
        }
    };
    if sequence >= end {
        return Ok((-1, -1));
    }
    let found = broker
        .read(hub, &partition, sequence, 1, 0)
        .map_err(|e| error::code(&e))?;
    Ok(found
        .first()
        .map_or((-1, -1), |e| (e.sequence_number, e.enqueued_time_ms)))
}
