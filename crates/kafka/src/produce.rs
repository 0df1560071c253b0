//! Produce and InitProducerId: record batches into events, appended to the partition the
//! client chose.
//!
//! # Guarantees
//! - A partition's records are appended as one batch, all or nothing, and acknowledged
//!   (acks 1 or all; both wait for the hub's durable append, there being one replica) only once
//!   stored. A storage failure answers KAFKA_STORAGE_ERROR, which clients retry. A refused
//!   append carries the broker's reason as the partition's error message (a keyless record on
//!   a compacted hub: INVALID_RECORD, as Kafka answers it, saying the key is missing).
//! - base_offset is the sequence number of the batch's first event: Kafka offsets here are
//!   sequence numbers.
//! - A request is started ([`start`]) before it is answered: batches without a producer id are
//!   written to their logs then, so a connection can read and start its next produce requests
//!   while earlier ones wait for their sync, and one sync covers them all (the connection
//!   answers in order, [`crate::connection`]). The batches of requests started one after
//!   another are stored in that order.
//! - With acks 0 the records are appended the same way and no response is sent.
//! - The records are read by [`crate::batches`] (formats, compression, size limits and the
//!   error code of each refusal).
//! - A batch from an idempotent producer (one with a producer id; kafka-python 3's default,
//!   librdkafka's `enable.idempotence`) is checked against its producer's sequence numbers
//!   first, and stored with them, by [`crate::producers`]: a retried batch that was stored is
//!   acknowledged with the offset it got and not stored again, restarts included.
//! - Under an ingress limit ([`tributary_broker::throttle`]) the records are stored all the
//!   same and the answer carries `throttle_time_ms`; the connection is muted that long (see
//!   [`crate::connection`]), as a Kafka broker enforces its produce quotas.
//! - InitProducerId hands out a producer id never handed out before (epoch 0).
//!   Transactions are refused (TRANSACTIONAL_ID_AUTHORIZATION_FAILED).

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse, ProducerId,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tributary_amqp::auth;
use tributary_broker::QueuedAppend;
use tributary_event::EventData;

use std::time::Duration;

use tributary_broker::throttle::{Admit, Cost, Direction};

use crate::connection::{Context, DOOR, Session};
use crate::error;
use crate::producers::BatchIdentity;

/// A produce request whose batches were written to their partitions' logs (or refused) when
/// it was started; [`StartedProduce::answer`] waits for their acknowledgements.
pub(crate) struct StartedProduce {
    acks: i16,
    topics: Vec<(TopicName, Vec<(i32, Step)>)>,
    /// How long the ingress limits throttle the client for this request.
    pub(crate) throttle: Duration,
}

/// Why a partition's batch was refused: its error code, and the broker's words when it has
/// them (the partition's `error_message`, which Kafka clients log beside the code).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refused {
    code: i16,
    message: Option<String>,
}

impl From<i16> for Refused {
    fn from(code: i16) -> Self {
        Refused {
            code,
            message: None,
        }
    }
}

/// Where one partition's batch stands once its request is started.
enum Step {
    /// Refused, or nothing left to wait for.
    Done(Result<(i64, i64), Refused>),
    /// Written to the log, waiting for its sync.
    Queued {
        hub: String,
        partition: u32,
        append: QueuedAppend,
    },
    /// An idempotent producer's batch: checked and appended when the answer is awaited, in
    /// request order (see [`crate::producers`]).
    Idempotent {
        hub: String,
        hub_id: String,
        partition: u32,
        batch: BatchIdentity,
        events: Vec<EventData>,
    },
}

/// Starts a produce request: every partition's batch without a producer id is written to its
/// log before this returns (so the batches of requests started one after another are stored in
/// that order), refusals are settled, and idempotent batches wait for
/// [`StartedProduce::answer`].
pub(crate) fn start(request: ProduceRequest, session: &Session, ctx: &Context) -> StartedProduce {
    let transactional = request.transactional_id.is_some();
    let throttle = charge_ingress(&request, session, ctx);
    let topics = request
        .topic_data
        .into_iter()
        .map(|topic| {
            let hub = topic.name.0.as_str();
            let steps = topic
                .partition_data
                .into_iter()
                .map(|data| {
                    let step = if transactional {
                        let code = ResponseError::TransactionalIdAuthorizationFailed.code();
                        Step::Done(Err(code.into()))
                    } else {
                        start_partition(hub, data.index, data.records, session, ctx)
                            .unwrap_or_else(|refused| Step::Done(Err(refused)))
                    };
                    (data.index, step)
                })
                .collect();
            (topic.name, steps)
        })
        .collect();
    StartedProduce {
        acks: request.acks,
        topics,
        throttle,
    }
}

/// Charges a request's record batches to each hub's (and the namespace's) ingress limits: how
/// long the client must wait before its next request. Kafka's quotas never refuse a produce;
/// they delay the client (`throttle_time_ms`, and the connection muted that long). Only
/// batches the connection may send to an existing hub are charged: a client without the
/// right cannot use up another's limit.
fn charge_ingress(request: &ProduceRequest, session: &Session, ctx: &Context) -> Duration {
    let throttle = ctx.broker.throttle();
    let now = tokio::time::Instant::now();
    let chargeable = |hub: &str| {
        throttle.limits_hub(hub, Direction::Ingress)
            && session.authorize(hub, auth::SEND).is_ok()
            && ctx.broker.describe_hub(hub).is_ok()
    };
    request
        .topic_data
        .iter()
        .filter(|topic| request.transactional_id.is_none() && chargeable(&topic.name.0))
        .filter_map(|topic| {
            let batches = topic
                .partition_data
                .iter()
                .filter_map(|p| p.records.as_ref());
            let cost = batches.fold(
                Cost {
                    events: 0,
                    bytes: 0,
                },
                |cost, records| Cost {
                    events: cost.events + crate::batches::record_count(records),
                    bytes: cost.bytes + records.len() as u64,
                },
            );
            throttle
                .admit(
                    DOOR,
                    &topic.name.0,
                    Direction::Ingress,
                    cost,
                    Admit::Always,
                    now,
                )
                .ok()
        })
        .max()
        .unwrap_or(Duration::ZERO)
}

impl StartedProduce {
    /// Whether every batch is written or settled: nothing of this request is appended later, so
    /// the connection may start the next request before this one is answered.
    pub(crate) fn all_queued(&self) -> bool {
        self.topics.iter().all(|(_, steps)| {
            steps
                .iter()
                .all(|(_, step)| !matches!(step, Step::Idempotent { .. }))
        })
    }

    /// The Produce answer once every batch is acknowledged or refused, or none with acks 0.
    pub(crate) async fn answer(self, ctx: &Context) -> Option<ProduceResponse> {
        let mut responses = Vec::with_capacity(self.topics.len());
        for (name, steps) in self.topics {
            let mut partitions = Vec::with_capacity(steps.len());
            for (index, step) in steps {
                partitions.push(partition_response(index, finish(step, ctx).await));
            }
            responses.push(
                TopicProduceResponse::default()
                    .with_name(name)
                    .with_partition_responses(partitions),
            );
        }
        let throttle_time_ms = i32::try_from(self.throttle.as_millis()).unwrap_or(i32::MAX);
        (self.acks != 0).then(|| {
            ProduceResponse::default()
                .with_responses(responses)
                .with_throttle_time_ms(throttle_time_ms)
        })
    }
}

/// One partition's answer: its base offset and log start, or its error.
fn partition_response(
    index: i32,
    outcome: Result<(i64, i64), Refused>,
) -> PartitionProduceResponse {
    let response = PartitionProduceResponse::default()
        .with_index(index)
        .with_log_append_time_ms(-1);
    match outcome {
        Ok((base_offset, log_start)) => response
            .with_base_offset(base_offset)
            .with_log_start_offset(log_start),
        Err(refused) => response
            .with_error_code(refused.code)
            .with_error_message(refused.message.map(StrBytes::from_string))
            .with_base_offset(-1)
            .with_log_start_offset(-1),
    }
}

/// Checks one partition's batch and writes it to the log unless it is an idempotent
/// producer's.
fn start_partition(
    hub: &str,
    index: i32,
    records: Option<Bytes>,
    session: &Session,
    ctx: &Context,
) -> Result<Step, Refused> {
    session.authorize(hub, auth::SEND)?;
    let definition = ctx.broker.describe_hub(hub).map_err(|e| error::code(&e))?;
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    let partition = u32::try_from(index).map_err(|_| unknown)?;
    if partition >= definition.partition_count {
        return Err(unknown.into());
    }
    let idempotent = BatchIdentity::of(records.as_ref())?;
    let events = crate::batches::events(records)?;
    let hub = hub.to_owned();
    if let Some(batch) = idempotent {
        return Ok(Step::Idempotent {
            hub,
            hub_id: definition.id,
            partition,
            batch,
            events,
        });
    }
    let append = ctx
        .broker
        .queue_to_partition_keyed(&hub, &partition.to_string(), &events)
        .map_err(|e| refused(&hub, partition, &e))?;
    Ok(Step::Queued {
        hub,
        partition,
        append,
    })
}

/// Waits for one partition's batch: its base offset and the partition's first retained
/// sequence number.
async fn finish(step: Step, ctx: &Context) -> Result<(i64, i64), Refused> {
    let (hub, partition, base_offset) = match step {
        Step::Done(outcome) => return outcome,
        Step::Queued {
            hub,
            partition,
            append,
        } => {
            let receipt = append
                .acknowledged()
                .await
                .map_err(|e| refused(&hub, partition, &e))?;
            (hub, partition, receipt.base_sequence)
        }
        Step::Idempotent {
            hub,
            hub_id,
            partition,
            batch,
            events,
        } => {
            let place = (hub.as_str(), hub_id.as_str(), partition);
            let base_offset = ctx
                .producers
                .append(&ctx.broker, place, batch, events)
                .await?;
            (hub, partition, base_offset)
        }
    };
    let properties = ctx
        .broker
        .partition_properties(&hub, &partition.to_string())
        .map_err(|e| error::code(&e))?;
    Ok((base_offset, properties.begin_sequence_number))
}

/// A refused append, with the broker's words, logged at debug level.
fn refused(hub: &str, partition: u32, e: &tributary_broker::BrokerError) -> Refused {
    tracing::debug!(hub, partition, error = %e, "a Kafka produce was refused");
    Refused {
        code: error::code(e),
        message: Some(e.to_string()),
    }
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
