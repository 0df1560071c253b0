//! AlterConfigs and IncrementalAlterConfigs: a topic's configs changed after it was created, as
//! `kafka-configs.sh --alter` and the admin clients' `alter_configs` /
//! `incremental_alter_configs` do.
//!
//! - AlterConfigs replaces a topic's whole set of configs, as Kafka does: a config the request
//!   does not name goes back to its default.
//! - IncrementalAlterConfigs changes only what it names: SET, DELETE (back to the default), and
//!   APPEND / SUBTRACT for the one list config a hub keeps, `cleanup.policy`.
//! - Which configs a hub keeps and which it fixes is [`super::configs`]' rule, the one
//!   CreateTopics follows; an event hub's settings change through
//!   [`tributary_broker::Broker::update_hub`], durably and on every partition at once.
//! - Every resource gets its own answer. A resource that is refused changes nothing, whatever
//!   its other configs; `validate_only` checks everything and changes nothing.
//! - Changing a topic needs the Manage right on it (TOPIC_AUTHORIZATION_FAILED). Broker configs
//!   are set by how `tributary serve` runs, so altering them is INVALID_REQUEST.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse, alter_configs_response, incremental_alter_configs_response,
};
use kafka_protocol::protocol::StrBytes;
use tributary_broker::HubUpdate;

use super::configs::{self, RESOURCE_BROKER, RESOURCE_TOPIC, Retention, invalid};
use super::{MANAGE, Refusal, text};
use crate::connection::{Context, Session};

/// IncrementalAlterConfigs' operations.
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

/// The AlterConfigs answer: each resource's outcome.
pub(crate) async fn alter(
    request: AlterConfigsRequest,
    session: &Session,
    ctx: &Context,
) -> AlterConfigsResponse {
    let mut responses = Vec::with_capacity(request.resources.len());
    for resource in &request.resources {
        let name = resource.resource_name.as_str();
        let outcome =
            match topic(resource.resource_type, name, session, ctx) {
                Ok(_current) => {
                    let mut wanted = Retention::defaults();
                    let set = resource.configs.iter().try_for_each(|config| {
                        match config.value.as_ref() {
                            Some(value) => wanted.set(config.name.as_str(), value.as_str()),
                            None => wanted.reset(config.name.as_str()),
                        }
                    });
                    match set {
                        Ok(()) => change(name, wanted.update(), request.validate_only, ctx).await,
                        Err(refusal) => Err(refusal),
                    }
                }
                Err(refusal) => Err(refusal),
            };
        let (code, message) = answer(outcome);
        responses.push(
            alter_configs_response::AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(message)
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name.clone()),
        );
    }
    AlterConfigsResponse::default().with_responses(responses)
}

/// The IncrementalAlterConfigs answer: each resource's outcome.
pub(crate) async fn incremental_alter(
    request: IncrementalAlterConfigsRequest,
    session: &Session,
    ctx: &Context,
) -> IncrementalAlterConfigsResponse {
    let mut responses = Vec::with_capacity(request.resources.len());
    for resource in &request.resources {
        let name = resource.resource_name.as_str();
        let outcome = match topic(resource.resource_type, name, session, ctx) {
            Ok(mut wanted) => {
                let changed = resource.configs.iter().try_for_each(|config| {
                    operate(
                        &mut wanted,
                        config.config_operation,
                        config.name.as_str(),
                        config.value.as_ref().map(StrBytes::as_str),
                    )
                });
                match changed {
                    Ok(()) => change(name, wanted.update(), request.validate_only, ctx).await,
                    Err(refusal) => Err(refusal),
                }
            }
            Err(refusal) => Err(refusal),
        };
        let (code, message) = answer(outcome);
        responses.push(
            incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_error_message(message)
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name.clone()),
        );
    }
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

/// The topic a resource names, with its current settings, once the session may change it.
fn topic(
    resource_type: i8,
    name: &str,
    session: &Session,
    ctx: &Context,
) -> Result<Retention, Refusal> {
    match resource_type {
        RESOURCE_TOPIC => {}
        RESOURCE_BROKER => {
            return Err(Refusal::new(
                ResponseError::InvalidRequest,
                "broker configs are set by how `tributary serve` runs and cannot be altered",
            ));
        }
        other => {
            return Err(Refusal::new(
                ResponseError::InvalidRequest,
                format!("resource type {other} has no configs to alter here (topics 2 do)"),
            ));
        }
    }
    let hub = configs::topic(name, session, ctx, MANAGE, "altering")?;
    Ok(Retention::of_hub(&hub))
}

/// One IncrementalAlterConfigs operation on `wanted`.
fn operate(
    wanted: &mut Retention,
    operation: i8,
    name: &str,
    value: Option<&str>,
) -> Result<(), Refusal> {
    match (operation, value) {
        (OP_DELETE, _) => wanted.reset(name),
        (OP_SET | OP_APPEND | OP_SUBTRACT, None) => Err(invalid(name, "null", "a value is needed")),
        (OP_SET, Some(value)) => wanted.set(name, value),
        (OP_APPEND | OP_SUBTRACT, Some(value)) if name == "cleanup.policy" => {
            let mut policies: Vec<String> = wanted
                .cleanup
                .policy
                .to_string()
                .split(',')
                .map(str::to_owned)
                .collect();
            for item in value.split(',').map(|p| p.trim().to_ascii_lowercase()) {
                policies.retain(|p| *p != item);
                if operation == OP_APPEND {
                    policies.push(item);
                }
            }
            wanted.set(name, &policies.join(","))
        }
        (OP_APPEND | OP_SUBTRACT, Some(value)) => Err(invalid(
            name,
            value,
            "APPEND and SUBTRACT apply to list configs; this topic's only one is cleanup.policy",
        )),
        (other, _) => Err(Refusal::new(
            ResponseError::InvalidRequest,
            format!(
                "{name}: unknown config operation {other} (0 set, 1 delete, 2 append, 3 subtract)"
            ),
        )),
    }
}

/// Gives hub `name` the settings of `update`, or only checks them.
async fn change(
    name: &str,
    update: HubUpdate,
    validate_only: bool,
    ctx: &Context,
) -> Result<(), Refusal> {
    let refused = |e: tributary_broker::BrokerError| {
        Refusal::new(ResponseError::InvalidConfig, format!("topic {name:?}: {e}"))
    };
    if validate_only {
        let hub = ctx.broker.describe_hub(name).map_err(refused)?;
        update.apply(&hub).map(drop).map_err(refused)
    } else {
        ctx.broker
            .update_hub(name, update)
            .await
            .map(drop)
            .map_err(refused)
    }
}

/// A resource's error code and message (none when it succeeded).
fn answer(outcome: Result<(), Refusal>) -> (i16, Option<StrBytes>) {
    match outcome {
        Ok(()) => (0, None),
        Err(refusal) => (refusal.code, text(refusal.message)),
    }
}
