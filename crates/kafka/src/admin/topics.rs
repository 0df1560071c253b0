//! CreateTopics, DeleteTopics and CreatePartitions: topics as event hubs (see [`crate::admin`]
//! for the rights, the configs a hub honours and the guarantees).

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{
    BrokerId, CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest,
    CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse, TopicName,
};
use tributary_broker::config::PARTITIONS_MAX;
use tributary_broker::{BrokerError, HubSpec};
use tributary_event::names::validate_hub_name;

use super::configs::{self, PARTITIONS_DEFAULT, Retention};
use super::{MANAGE, Refusal, duplicated, text};
use crate::connection::{Context, Session};
use crate::metadata::NODE_ID;

/// The CreateTopics answer: each topic created (or, with `validate_only`, checked) or refused.
pub(crate) async fn create(
    request: CreateTopicsRequest,
    session: &Session,
    ctx: &Context,
) -> CreateTopicsResponse {
    let twice = duplicated(request.topics.iter().map(|t| t.name.0.as_str()));
    let mut results = Vec::with_capacity(request.topics.len());
    for topic in &request.topics {
        let name = topic.name.0.as_str();
        let outcome = if twice.contains(&name.to_ascii_lowercase()) {
            Err(named_twice(name))
        } else {
            create_one(topic, request.validate_only, session, ctx).await
        };
        results.push(created(topic.name.clone(), outcome));
    }
    CreateTopicsResponse::default().with_topics(results)
}

/// One topic's entry in the CreateTopics answer.
fn created(name: TopicName, outcome: Result<HubSpec, Refusal>) -> CreatableTopicResult {
    let result = CreatableTopicResult::default().with_name(name);
    match outcome {
        Ok(spec) => result
            .with_error_message(None)
            .with_num_partitions(spec.partition_count as i32)
            .with_replication_factor(1)
            .with_configs(Some(configs::created(Retention::of(&spec)))),
        Err(refusal) => result
            .with_error_code(refusal.code)
            .with_error_message(text(refusal.message))
            .with_configs(None),
    }
}

fn named_twice(name: &str) -> Refusal {
    Refusal::new(
        ResponseError::InvalidRequest,
        format!("topic {name:?} is named more than once in the request"),
    )
}

/// Creates (or only checks) one topic; the hub it makes.
async fn create_one(
    topic: &CreatableTopic,
    validate_only: bool,
    session: &Session,
    ctx: &Context,
) -> Result<HubSpec, Refusal> {
    let name = topic.name.0.as_str();
    session.authorize(name, MANAGE).map_err(|code| Refusal {
        code,
        message: format!("creating topic {name:?} needs the Manage right"),
    })?;
    validate_hub_name(name)
        .map_err(|e| Refusal::new(ResponseError::InvalidTopicException, e.to_string()))?;
    if ctx.broker.describe_hub(name).is_ok() {
        return Err(Refusal::new(
            ResponseError::TopicAlreadyExists,
            format!("topic {name:?} already exists"),
        ));
    }
    let mut spec = HubSpec::new(name, partition_count(topic)?);
    configs::apply(&topic.configs, &mut spec)?;
    if validate_only {
        return Ok(spec);
    }
    ctx.broker
        .create_hub(spec.clone())
        .await
        .map_err(|e| refused_by_broker(&e))?;
    Ok(spec)
}

/// The partition count a topic asks for: `num_partitions` (−1: the default) with a
/// replication factor of −1 or 1, or a replica assignment naming this node for partitions
/// 0, 1, …
fn partition_count(topic: &CreatableTopic) -> Result<u32, Refusal> {
    if !topic.assignments.is_empty() {
        if topic.num_partitions != -1 || topic.replication_factor != -1 {
            return Err(Refusal::new(
                ResponseError::InvalidRequest,
                "a replica assignment goes with -1 partitions and a replication factor of -1",
            ));
        }
        return assigned_count(topic);
    }
    match topic.replication_factor {
        -1 | 1 => {}
        factor => {
            return Err(Refusal::new(
                ResponseError::InvalidReplicationFactor,
                format!("replication factor {factor}: this cluster has one broker, so 1 (or -1)"),
            ));
        }
    }
    match topic.num_partitions {
        -1 => Ok(PARTITIONS_DEFAULT),
        n if n >= 1 && n as u32 <= PARTITIONS_MAX => Ok(n as u32),
        n => Err(Refusal::new(
            ResponseError::InvalidPartitions,
            format!(
                "{n} partitions: an event hub has 1 to {PARTITIONS_MAX} (or -1 for the default)"
            ),
        )),
    }
}

/// The partition count of an explicit replica assignment: partitions 0 to n−1, each on this
/// node alone.
fn assigned_count(topic: &CreatableTopic) -> Result<u32, Refusal> {
    let count = topic.assignments.len();
    let invalid = |why: String| Refusal::new(ResponseError::InvalidReplicaAssignment, why);
    if count as u64 > u64::from(PARTITIONS_MAX) {
        return Err(invalid(format!(
            "{count} partitions: an event hub has at most {PARTITIONS_MAX}"
        )));
    }
    let mut indexes: Vec<i32> = topic
        .assignments
        .iter()
        .map(|a| a.partition_index)
        .collect();
    indexes.sort_unstable();
    if indexes
        .iter()
        .zip(0..)
        .any(|(index, expected)| *index != expected)
    {
        return Err(invalid(
            "the partitions must be numbered 0, 1, 2, … without gaps".into(),
        ));
    }
    let this_node = [BrokerId(NODE_ID)];
    if let Some(bad) = topic
        .assignments
        .iter()
        .find(|a| a.broker_ids[..] != this_node[..])
    {
        return Err(invalid(format!(
            "partition {} is assigned to brokers {:?}: this cluster has one broker, {NODE_ID}",
            bad.partition_index,
            bad.broker_ids.iter().map(|b| b.0).collect::<Vec<_>>()
        )));
    }
    Ok(count as u32)
}

/// A broker refusal of a create or delete as its Kafka error, with the broker's message.
fn refused_by_broker(error: &BrokerError) -> Refusal {
    let code = match error {
        BrokerError::HubExists { .. } => ResponseError::TopicAlreadyExists.code(),
        BrokerError::InvalidPartitionCount { .. } => ResponseError::InvalidPartitions.code(),
        BrokerError::InvalidRetention(_) => ResponseError::InvalidConfig.code(),
        other => crate::error::code(other),
    };
    Refusal {
        code,
        message: error.to_string(),
    }
}

/// The DeleteTopics answer: each topic's hub deleted, with its events, or refused.
pub(crate) async fn delete(
    request: DeleteTopicsRequest,
    session: &Session,
    ctx: &Context,
) -> DeleteTopicsResponse {
    // Versions up to 5 name topics in `topic_names`; 6 (not advertised) in `topics`.
    let names: Vec<TopicName> = request
        .topic_names
        .into_iter()
        .chain(request.topics.into_iter().filter_map(|t| t.name))
        .collect();
    let twice = duplicated(names.iter().map(|n| n.0.as_str()));
    let mut responses = Vec::with_capacity(names.len());
    for name in names {
        let hub = name.0.as_str();
        let outcome = if twice.contains(&hub.to_ascii_lowercase()) {
            Err(named_twice(hub))
        } else {
            delete_one(hub, session, ctx).await
        };
        let result = DeletableTopicResult::default().with_name(Some(name.clone()));
        responses.push(match outcome {
            Ok(()) => result,
            Err(refusal) => result
                .with_error_code(refusal.code)
                .with_error_message(text(refusal.message)),
        });
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

async fn delete_one(hub: &str, session: &Session, ctx: &Context) -> Result<(), Refusal> {
    session.authorize(hub, MANAGE).map_err(|code| Refusal {
        code,
        message: format!("deleting topic {hub:?} needs the Manage right"),
    })?;
    ctx.broker
        .delete_hub(hub)
        .await
        .map_err(|e| refused_by_broker(&e))
}

/// The CreatePartitions answer: refused for every topic, since a hub's partition count is
/// fixed when it is created; the message says why (or that the count is not an increase).
pub(crate) fn create_partitions(
    request: &CreatePartitionsRequest,
    session: &Session,
    ctx: &Context,
) -> CreatePartitionsResponse {
    let twice = duplicated(request.topics.iter().map(|t| t.name.0.as_str()));
    let results = request
        .topics
        .iter()
        .map(|topic| {
            let name = topic.name.0.as_str();
            let refusal = if twice.contains(&name.to_ascii_lowercase()) {
                named_twice(name)
            } else {
                grow_refusal(name, topic.count, session, ctx)
            };
            CreatePartitionsTopicResult::default()
                .with_name(topic.name.clone())
                .with_error_code(refusal.code)
                .with_error_message(text(refusal.message))
        })
        .collect();
    CreatePartitionsResponse::default().with_results(results)
}

/// Why topic `name` cannot grow to `count` partitions.
fn grow_refusal(name: &str, count: i32, session: &Session, ctx: &Context) -> Refusal {
    if let Err(code) = session.authorize(name, MANAGE) {
        return Refusal {
            code,
            message: format!("adding partitions to topic {name:?} needs the Manage right"),
        };
    }
    let hub = match ctx.broker.describe_hub(name) {
        Ok(hub) => hub,
        Err(e) => return refused_by_broker(&e),
    };
    let current = i64::from(hub.partition_count);
    let message = match i64::from(count) {
        asked if asked == current => format!("topic {name:?} already has {current} partitions"),
        asked if asked < current => format!(
            "topic {name:?} has {current} partitions, more than the {asked} asked for (a count only grows)"
        ),
        asked => format!(
            "topic {name:?} keeps its {current} partitions: an event hub's partition count is fixed \
             when it is created (as on Event Hubs' Basic and Standard tiers); create a new topic \
             with {asked} partitions instead"
        ),
    };
    Refusal::new(ResponseError::InvalidPartitions, message)
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::create_topics_request::CreatableReplicaAssignment;

    use super::*;

    fn topic(partitions: i32, replication: i16) -> CreatableTopic {
        CreatableTopic::default()
            .with_num_partitions(partitions)
            .with_replication_factor(replication)
    }

    fn assigned(brokers: &[(i32, &[i32])]) -> CreatableTopic {
        let assignments = brokers
            .iter()
            .map(|(index, ids)| {
                CreatableReplicaAssignment::default()
                    .with_partition_index(*index)
                    .with_broker_ids(ids.iter().map(|id| BrokerId(*id)).collect())
            })
            .collect();
        topic(-1, -1).with_assignments(assignments)
    }

    fn code(outcome: Result<u32, Refusal>) -> i16 {
        outcome.unwrap_err().code
    }

    #[test]
    fn partition_counts_come_from_the_count_or_an_assignment_to_this_node() {
        assert_eq!(partition_count(&topic(-1, -1)).unwrap(), PARTITIONS_DEFAULT);
        assert_eq!(partition_count(&topic(12, 1)).unwrap(), 12);
        let invalid_partitions = ResponseError::InvalidPartitions.code();
        assert_eq!(code(partition_count(&topic(0, 1))), invalid_partitions);
        assert_eq!(code(partition_count(&topic(-2, 1))), invalid_partitions);
        let too_many = i32::try_from(PARTITIONS_MAX).unwrap() + 1;
        assert_eq!(
            code(partition_count(&topic(too_many, 1))),
            invalid_partitions
        );
        let factor = ResponseError::InvalidReplicationFactor.code();
        assert_eq!(code(partition_count(&topic(1, 3))), factor);
        assert_eq!(code(partition_count(&topic(1, 0))), factor);

        assert_eq!(
            partition_count(&assigned(&[(1, &[0]), (0, &[0])])).unwrap(),
            2
        );
        let replica = ResponseError::InvalidReplicaAssignment.code();
        assert_eq!(
            code(partition_count(&assigned(&[(0, &[0]), (2, &[0])]))),
            replica
        );
        assert_eq!(code(partition_count(&assigned(&[(0, &[0, 1])]))), replica);
        assert_eq!(code(partition_count(&assigned(&[(0, &[])]))), replica);
        let both = assigned(&[(0, &[0])]).with_num_partitions(1);
        assert_eq!(
            code(partition_count(&both)),
            ResponseError::InvalidRequest.code()
        );
    }

    #[test]
    fn a_name_given_twice_in_any_case_is_found() {
        let twice = duplicated(["orders", "Events", "ORDERS", "other"].into_iter());
        assert_eq!(twice.len(), 1);
        assert!(twice.contains("orders"));
    }
}
