//! [`HubCheckpointStore`]: the processor's checkpoint store kept by a Tributary hub itself.
//!
//! A Tributary hub hosts ownership records and checkpoints per consumer group (the broker's
//! registry), reached with Tributary's own `$management` operations
//! (`tributary_eventhubs::checkpoint_store`) over the AMQP connection the processor already
//! reads through — so a processor of a Tributary hub needs no storage account and no store flag.
//! It implements `tributary_processor::store::CheckpointStore` with that trait's semantics
//! (conditional claims, growing versions, fenced checkpoints, host records); the hub enforces
//! them, in one place, for every processor of the group.
//!
//! The store talks to whichever hub a call names, over the connection of a [`ConsumerClient`]
//! for that hub: the one it was made with, or one it opens with the same credentials. The
//! namespace in a call is not sent (the connection is the namespace); records come back under
//! it, lowercased, as every store returns them.
//!
//! Azure Event Hubs does not know these operations and refuses them; such an answer (one
//! without `com.tributary:checkpoint-store`) becomes a [`StoreError::Backend`] that says the hub
//! hosts no checkpoints and to pick a store (`--store`). Nothing is retried here: the processor
//! host retries in its next balancing cycle.

use std::collections::HashMap;
use std::sync::Arc;

use fe2o3_amqp_types::primitives::SimpleValue;
use tokio::sync::Mutex;
use tributary_event::names::name_key;
use tributary_eventhubs::checkpoint_store::{
    self as wire, CheckpointEntry, OwnershipEntry, StoreCall, StoreRequest,
};
use tributary_eventhubs::names::checkpoint_store as n;
use tributary_eventhubs::names::management as m;
use tributary_processor::store::{
    Checkpoint, CheckpointStore, HostRecord, Ownership, OwnershipFence, OwnershipListing,
    StoreError,
};

use crate::connection::Connector;
use crate::consumer::ConsumerClient;
use crate::error::ClientError;
use crate::request_response::Response;

/// The checkpoint store a Tributary hub hosts. Cheap to share (`Arc`); calls for different
/// hubs go over different connections, calls for one hub one at a time over its connection.
#[derive(Debug)]
pub struct HubCheckpointStore {
    first: Arc<Connector>,
    /// Connections to other hubs of the namespace, opened on first use; by hub key.
    others: Mutex<HashMap<String, Arc<Connector>>>,
}

impl HubCheckpointStore {
    /// A store over `consumer`'s connection (for its hub), opening connections with its
    /// credentials for any other hub a call names.
    pub fn new(consumer: &ConsumerClient) -> Self {
        HubCheckpointStore {
            first: consumer.connector.clone(),
            others: Mutex::new(HashMap::new()),
        }
    }

    async fn connector(&self, hub: &str) -> Result<Arc<Connector>, StoreError> {
        if name_key(hub) == name_key(&self.first.target.hub) {
            return Ok(self.first.clone());
        }
        let mut others = self.others.lock().await;
        if let Some(connector) = others.get(&name_key(hub)) {
            return Ok(connector.clone());
        }
        let target = self
            .first
            .target
            .for_hub(hub)
            .map_err(|e| backend("connecting", &e))?;
        let connector = Connector::connect(target)
            .await
            .map_err(|e| backend("connecting", &e))?;
        others.insert(name_key(hub), connector.clone());
        Ok(connector)
    }

    /// Sends one store request and returns the hub's successful answer.
    async fn call(
        &self,
        operation: &'static str,
        call: &StoreCall,
    ) -> Result<Response, StoreError> {
        let connector = self.connector(&call.hub).await?;
        let target = &connector.target;
        let (mut properties, body) = call.encode();
        let work = async {
            let mut live = connector.live().await?;
            properties.0.insert(
                m::SECURITY_TOKEN.to_owned(),
                SimpleValue::String(live.token().to_owned()),
            );
            let timeout = target.options.operation_timeout;
            let link = live.management().await?;
            link.call(properties, body, timeout).await
        };
        let response = match target.timed("a checkpoint store request", work).await {
            Ok(response) => response,
            Err(e @ ClientError::Refused { .. }) => return Err(not_hosted(target, &e.to_string())),
            Err(e) => return Err(backend(operation, &e)),
        };
        judge(
            operation,
            target.connection_string.host(),
            &call.hub,
            response,
        )
    }

    /// Sends `request` (answered with the group's ownership and host records) for the group
    /// `scope` names: (namespace, hub, group).
    async fn listing(
        &self,
        operation: &'static str,
        scope: (&str, &str, &str),
        request: StoreRequest,
    ) -> Result<OwnershipListing, StoreError> {
        let call = scope_call(scope.1, scope.2, request);
        let response = self.call(operation, &call).await?;
        let (ownership, hosts) =
            wire::decode_listing(&response.body).map_err(|e| protocol(operation, &e))?;
        Ok(OwnershipListing {
            ownership: ownership
                .into_iter()
                .map(|e| ownership_of(scope.0, scope.1, scope.2, e))
                .collect(),
            hosts: hosts
                .into_iter()
                .map(|h| HostRecord {
                    owner_id: h.owner_id,
                    version: h.version,
                    last_modified_time_ms: h.last_modified_ms,
                })
                .collect(),
        })
    }
}

fn backend(operation: &'static str, error: &ClientError) -> StoreError {
    StoreError::Backend {
        operation,
        description: error.to_string(),
    }
}

fn not_hosted(target: &crate::connection::Target, said: &str) -> StoreError {
    not_hosted_at(target.connection_string.host(), &target.hub, said)
}

fn not_hosted_at(host: &str, hub: &str, said: &str) -> StoreError {
    StoreError::Backend {
        operation: "using the hub-hosted checkpoint store",
        description: format!(
            "event hub {hub:?} at {host} does not host checkpoints (it answered: {said}); \
             Azure Event Hubs does not — give the processor a store with --store \
             (sqlite:PATH, postgres://…, or https://ACCOUNT.blob.core.windows.net/CONTAINER)"
        ),
    }
}

/// The answer if it is a success; else the store error it stands for.
fn judge(
    operation: &'static str,
    host: &str,
    hub: &str,
    response: Response,
) -> Result<Response, StoreError> {
    let property = |key: &str| {
        response
            .properties
            .as_ref()
            .and_then(|p| p.0.get(key))
            .cloned()
    };
    let said = format!("status {}: {}", response.status, response.description);
    if property(n::STORE_VERSION).is_none() {
        if (200..300).contains(&response.status) {
            return Err(StoreError::Backend {
                operation,
                description: format!("the hub's answer lacks {}", n::STORE_VERSION),
            });
        }
        return Err(not_hosted_at(host, hub, &said));
    }
    match response.status {
        200..=299 => Ok(response),
        412 => Err(StoreError::OwnershipLost {
            partition_id: String::new(),
            current_owner: match property(n::CURRENT_OWNER_ID) {
                Some(SimpleValue::String(owner)) => owner,
                _ => String::new(),
            },
            fence_owner: String::new(),
        }),
        400 | 404 => Err(StoreError::Invalid {
            what: "checkpoint store request",
            reason: response.description,
        }),
        _ => Err(StoreError::Backend {
            operation,
            description: said,
        }),
    }
}

fn protocol(operation: &'static str, error: &tributary_eventhubs::MessageError) -> StoreError {
    StoreError::Backend {
        operation,
        description: format!("the hub's answer is malformed: {error}"),
    }
}

fn invalid(what: &'static str, reason: &str) -> StoreError {
    StoreError::Invalid {
        what,
        reason: reason.to_owned(),
    }
}

fn scope_call(hub: &str, group: &str, request: StoreRequest) -> StoreCall {
    StoreCall {
        hub: hub.to_owned(),
        consumer_group: group.to_owned(),
        request,
    }
}

fn ownership_of(namespace: &str, hub: &str, group: &str, entry: OwnershipEntry) -> Ownership {
    Ownership {
        fully_qualified_namespace: name_key(namespace),
        event_hub_name: name_key(hub),
        consumer_group: name_key(group),
        partition_id: entry.partition_id,
        owner_id: entry.owner_id,
        last_modified_time_ms: entry.last_modified_ms,
        etag: entry.etag,
        version: entry.version,
    }
}

#[async_trait::async_trait]
impl CheckpointStore for HubCheckpointStore {
    async fn list_ownership(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<Vec<Ownership>, StoreError> {
        const OPERATION: &str = "listing ownership";
        let call = scope_call(event_hub_name, consumer_group, StoreRequest::ListOwnership);
        let response = self.call(OPERATION, &call).await?;
        let entries =
            wire::decode_ownership(&response.body).map_err(|e| protocol(OPERATION, &e))?;
        Ok(entries
            .into_iter()
            .map(|e| ownership_of(fully_qualified_namespace, event_hub_name, consumer_group, e))
            .collect())
    }

    fn keeps_host_records(&self) -> bool {
        true
    }

    async fn renew_host(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
        owner_id: &str,
    ) -> Result<OwnershipListing, StoreError> {
        const OPERATION: &str = "renewing the host record";
        if owner_id.is_empty() {
            return Err(invalid("host record", "the owner id is empty"));
        }
        let request = StoreRequest::RenewHost {
            owner_id: owner_id.to_owned(),
        };
        let scope = (fully_qualified_namespace, event_hub_name, consumer_group);
        self.listing(OPERATION, scope, request).await
    }

    async fn list_ownership_and_hosts(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<OwnershipListing, StoreError> {
        let scope = (fully_qualified_namespace, event_hub_name, consumer_group);
        self.listing(
            "listing ownership and hosts",
            scope,
            StoreRequest::ListHosts,
        )
        .await
    }

    async fn remove_host(
        &self,
        _fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
        owner_id: &str,
    ) -> Result<(), StoreError> {
        let request = StoreRequest::RemoveHost {
            owner_id: owner_id.to_owned(),
        };
        let call = scope_call(event_hub_name, consumer_group, request);
        self.call("removing the host record", &call).await.map(drop)
    }

    async fn claim_ownership(&self, claims: Vec<Ownership>) -> Result<Vec<Ownership>, StoreError> {
        const OPERATION: &str = "claiming ownership";
        // One request per (namespace, hub, group), in the order the claims name them.
        let mut scopes: Vec<((String, String, String), Vec<OwnershipEntry>)> = Vec::new();
        for claim in claims {
            if claim.partition_id.is_empty() {
                return Err(invalid("ownership claim", "the partition id is empty"));
            }
            if claim.consumer_group.is_empty() {
                return Err(invalid("ownership claim", "the consumer group is empty"));
            }
            let scope = (
                name_key(&claim.fully_qualified_namespace),
                name_key(&claim.event_hub_name),
                name_key(&claim.consumer_group),
            );
            let entry = OwnershipEntry {
                partition_id: claim.partition_id,
                owner_id: claim.owner_id,
                etag: claim.etag,
                version: 0,
                last_modified_ms: 0,
            };
            match scopes.iter_mut().find(|(s, _)| *s == scope) {
                Some((_, entries)) => entries.push(entry),
                None => scopes.push((scope, vec![entry])),
            }
        }
        let mut won = Vec::new();
        for ((namespace, hub, group), entries) in scopes {
            let call = scope_call(&hub, &group, StoreRequest::ClaimOwnership(entries));
            let response = self.call(OPERATION, &call).await?;
            let records =
                wire::decode_ownership(&response.body).map_err(|e| protocol(OPERATION, &e))?;
            won.extend(
                records
                    .into_iter()
                    .map(|e| ownership_of(&namespace, &hub, &group, e)),
            );
        }
        Ok(won)
    }

    async fn list_checkpoints(
        &self,
        fully_qualified_namespace: &str,
        event_hub_name: &str,
        consumer_group: &str,
    ) -> Result<Vec<Checkpoint>, StoreError> {
        const OPERATION: &str = "listing checkpoints";
        let call = scope_call(
            event_hub_name,
            consumer_group,
            StoreRequest::ListCheckpoints,
        );
        let response = self.call(OPERATION, &call).await?;
        let entries =
            wire::decode_checkpoints(&response.body).map_err(|e| protocol(OPERATION, &e))?;
        Ok(entries
            .into_iter()
            .map(|e| Checkpoint {
                fully_qualified_namespace: name_key(fully_qualified_namespace),
                event_hub_name: name_key(event_hub_name),
                consumer_group: name_key(consumer_group),
                partition_id: e.partition_id,
                offset: e.offset,
                sequence_number: e.sequence_number,
            })
            .collect())
    }

    async fn update_checkpoint(
        &self,
        checkpoint: Checkpoint,
        fence: &OwnershipFence,
    ) -> Result<(), StoreError> {
        const OPERATION: &str = "updating a checkpoint";
        if checkpoint.partition_id.is_empty() {
            return Err(invalid("checkpoint", "the partition id is empty"));
        }
        let partition_id = checkpoint.partition_id.clone();
        let call = scope_call(
            &checkpoint.event_hub_name,
            &checkpoint.consumer_group,
            StoreRequest::UpdateCheckpoint {
                checkpoint: CheckpointEntry {
                    partition_id: checkpoint.partition_id,
                    offset: checkpoint.offset,
                    sequence_number: checkpoint.sequence_number,
                },
                fence_owner_id: fence.owner_id.clone(),
            },
        );
        match self.call(OPERATION, &call).await {
            Ok(_) => Ok(()),
            Err(StoreError::OwnershipLost { current_owner, .. }) => {
                Err(StoreError::OwnershipLost {
                    partition_id,
                    current_owner,
                    fence_owner: fence.owner_id.clone(),
                })
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp_types::messaging::{AmqpValue, ApplicationProperties, Body};
    use fe2o3_amqp_types::primitives::Value;

    use super::*;

    fn answer(status: u16, marked: bool) -> Response {
        let mut properties = ApplicationProperties::default();
        if marked {
            properties
                .0
                .insert(n::STORE_VERSION.to_owned(), SimpleValue::Int(1));
            properties.0.insert(
                n::CURRENT_OWNER_ID.to_owned(),
                SimpleValue::String("host-b".to_owned()),
            );
        }
        Response {
            status,
            description: "The operation is not supported".to_owned(),
            condition: None,
            properties: Some(properties),
            body: Body::Value(AmqpValue(Value::Null)),
        }
    }

    /// An answer without the store's property (Azure Event Hubs refusing an operation it does
    /// not know) says the hub hosts no checkpoints and what to do instead.
    #[test]
    fn a_hub_without_the_store_is_a_clear_error() {
        for status in [400, 404, 500, 501] {
            let error = judge(
                "listing ownership",
                "ns.servicebus.windows.net",
                "orders",
                answer(status, false),
            )
            .unwrap_err();
            let text = error.to_string();
            assert!(
                text.contains("does not host checkpoints") && text.contains("--store"),
                "{text}"
            );
        }
        let lost = judge("updating a checkpoint", "h", "orders", answer(412, true)).unwrap_err();
        assert!(
            matches!(lost, StoreError::OwnershipLost { ref current_owner, .. } if current_owner == "host-b"),
            "{lost}"
        );
        assert!(judge("listing ownership", "h", "orders", answer(200, true)).is_ok());
    }
}
