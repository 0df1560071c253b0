//! Produce and InitProducerId: record batches into events, appended to the partition the
//! client chose.
//!
//! # Guarantees
//! - A partition's records are appended as one batch, all or nothing, and acknowledged
//!   (acks 1 or all; both wait for the hub's durable append, there being one replica) only once
//!   stored. A storage failure answers KAFKA_STORAGE_ERROR, which clients retry.
//! - base_offset is the sequence number of the batch's first event: Kafka offsets here are
//!   sequence numbers.
//! - With acks 0 the records are appended the same way and no response is sent.
//! - The records are read by [`crate::batches`] (formats, compression, size limits and the
//!   error code of each refusal).
//! - A batch from an idempotent producer (one with a producer id; kafka-python 3's default,
//!   librdkafka's `enable.idempotence`) is checked against its producer's sequence numbers
//!   first, and stored with them, by [`crate::producers`]: a retried batch that was stored is
//!   acknowledged with the offset it got and not stored again, restarts included.
//! - InitProducerId hands out a producer id never handed out before (epoch 0).
//!   Transactions are refused (TRANSACTIONAL_ID_AUTHORIZATION_FAILED).

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse, ProducerId,
};
use tributary_amqp::auth;
use tributary_event::EventData;

use crate::connection::{Context, Session};
use crate::error;
use crate::producers::BatchIdentity;

/// The Produce answer, or none with acks 0.
pub(crate) async fn answer(
    request: ProduceRequest,
    session: &Session,
    ctx: &Context,
) -> Option<ProduceResponse> {
    let transactional = request.transactional_id.is_some();
    let mut responses = Vec::with_capacity(request.topic_data.len());
    for topic in request.topic_data {
        let hub = topic.name.0.as_str();
        let mut partitions = Vec::with_capacity(topic.partition_data.len());
        for data in topic.partition_data {
            let outcome = if transactional {
                Err(ResponseError::TransactionalIdAuthorizationFailed.code())
            } else {
                append(hub, data.index, data.records, session, ctx).await
            };
            partitions.push(partition_response(data.index, outcome));
        }
        responses.push(
            TopicProduceResponse::default()
                .with_name(topic.name.clone())
                .with_partition_responses(partitions),
        );
    }
    (request.acks != 0).then(|| ProduceResponse::default().with_responses(responses))
}

/// One partition's answer: its base offset and log start, or its error.
fn partition_response(index: i32, outcome: Result<(i64, i64), i16>) -> PartitionProduceResponse {
    let response = PartitionProduceResponse::default()
        .with_index(index)
        .with_log_append_time_ms(-1);
    match outcome {
        Ok((base_offset, log_start)) => response
            .with_base_offset(base_offset)
            .with_log_start_offset(log_start),
        Err(code) => response
            .with_error_code(code)
            .with_base_offset(-1)
            .with_log_start_offset(-1),
    }
}

/// Appends one partition's records; returns the first event's sequence number and the
/// partition's first retained one.
async fn append(
    hub: &str,
    index: i32,
    records: Option<Bytes>,
    session: &Session,
    ctx: &Context,
) -> Result<(i64, i64), i16> {
    session.authorize(hub, auth::SEND)?;
    let definition = ctx.broker.describe_hub(hub).map_err(|e| error::code(&e))?;
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    let partition = u32::try_from(index).map_err(|_| unknown)?;
    if partition >= definition.partition_count {
        return Err(unknown);
    }
    let idempotent = BatchIdentity::of(records.as_ref())?;
    let events = crate::batches::events(records)?;
    let base_offset = match idempotent {
        Some(batch) => {
            let place = (hub, definition.id.as_str(), partition);
            ctx.producers
                .append(&ctx.broker, place, batch, events)
                .await?
        }
        None => append_plain(hub, partition, &events, ctx).await?,
    };
    let properties = ctx
        .broker
        .partition_properties(hub, &partition.to_string())
        .map_err(|e| error::code(&e))?;
    Ok((base_offset, properties.begin_sequence_number))
}

/// Appends the events of a batch without a producer id; returns its base offset.
async fn append_plain(
    hub: &str,
    partition: u32,
    events: &[EventData],
    ctx: &Context,
) -> Result<i64, i16> {
    let partition = partition.to_string();
    let receipt = ctx
        .broker
        .send_to_partition_keyed(hub, &partition, events)
        .await
        .map_err(|e| {
            tracing::debug!(hub, %partition, error = %e, "a Kafka produce was refused");
            error::code(&e)
        })?;
    Ok(receipt.base_sequence)
}

/// The InitProducerId answer: a producer id never handed out before, epoch 0 (transactional
/// ids refused).
pub(crate) fn init_producer_id(
    request: &InitProducerIdRequest,
    ctx: &Context,
) -> InitProducerIdResponse {
    let refused = |code| {
        InitProducerIdResponse::default()
            .with_error_code(code)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    };
    if request.transactional_id.is_some() {
        return refused(ResponseError::TransactionalIdAuthorizationFailed.code());
    }
    match ctx.producers.new_id(ctx.broker.clock().now_ms()) {
        Ok(id) => InitProducerIdResponse::default()
            .with_producer_id(ProducerId(id))
            .with_producer_epoch(0),
        Err(code) => refused(code),
    }
}
