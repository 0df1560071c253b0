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
//!
//! # Not yet
//! InitProducerId hands out a fresh producer id (epoch 0) so idempotent producers (kafka-python
//! 3's default) work, but their sequence numbers are not checked yet: a batch a producer
//! retries after a lost acknowledgement is stored twice. Transactions are refused
//! (TRANSACTIONAL_ID_AUTHORIZATION_FAILED).

use std::sync::atomic::Ordering;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse, ProducerId,
};
use tributary_amqp::auth;

use crate::connection::{Context, Session};
use crate::error;

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
    let events = crate::batches::events(records)?;
    let partition = partition.to_string();
    let receipt = ctx
        .broker
        .send_to_partition_keyed(hub, &partition, &events)
        .await
        .map_err(|e| {
            tracing::debug!(hub, %partition, error = %e, "a Kafka produce was refused");
            error::code(&e)
        })?;
    let properties = ctx
        .broker
        .partition_properties(hub, &partition)
        .map_err(|e| error::code(&e))?;
    Ok((receipt.base_sequence, properties.begin_sequence_number))
}

/// The InitProducerId answer: a fresh producer id, epoch 0 (transactional ids refused).
pub(crate) fn init_producer_id(
    request: &InitProducerIdRequest,
    ctx: &Context,
) -> InitProducerIdResponse {
    if request.transactional_id.is_some() {
        return InitProducerIdResponse::default()
            .with_error_code(ResponseError::TransactionalIdAuthorizationFailed.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
    }
    let id = ctx.producer_ids.fetch_add(1, Ordering::Relaxed);
    InitProducerIdResponse::default()
        .with_producer_id(ProducerId(id))
        .with_producer_epoch(0)
}
