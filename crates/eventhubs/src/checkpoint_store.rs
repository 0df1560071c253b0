//! The hub-hosted checkpoint store on the wire: Tributary's own `$management` operations.
//!
//! A Tributary hub keeps event processors' ownership records and checkpoints per consumer
//! group, so a processor needs no storage account: it reaches the store over the AMQP
//! connection it reads through. A request is a `$management` message whose application
//! properties say `operation` (one of [`names::checkpoint_store`](crate::names::checkpoint_store)),
//! `name` = the hub, `com.tributary:consumer-group` = the group (and `security_token`, as for
//! `READ`); claims and checkpoints travel in an `amqp-value` list (claims) or map (a
//! checkpoint) of records. An answer carries `status-code`, `com.tributary:checkpoint-store` = 1
//! and, for the lists and claims, an `amqp-value` list of records.
//!
//! Records are maps with string keys: `partition-id`, `owner-id`, `etag` (string or null),
//! `version` (long), `last-modified` (timestamp) for ownership; `owner-id`, `version`,
//! `last-modified` for a processor host's liveness record; `partition-id`, `offset` (ulong
//! or null), `sequence-number` (long or null) for checkpoints. A host renewal (its owner id in
//! `com.tributary:owner-id`) is answered with a map: `ownership` and `hosts`, each a list; so is
//! a listing of both that renews nothing (`com.tributary:list-hosts`). [`StoreCall`] and the
//! `encode_*`/`decode_*` functions here are the one encoder and decoder both the server
//! (`tributary-amqp`) and the client (`tributary-client`) use.
//!
//! Status codes: 200 done; 404 unknown hub, group or partition; 412 a checkpoint from someone
//! who does not own the partition (with `com.tributary:current-owner-id`); 400 a malformed or
//! invalid request; 401 not authorised. Azure Event Hubs answers these operations with an error
//! and without [`STORE_VERSION`](crate::names::checkpoint_store::STORE_VERSION), which is how a
//! client tells that a hub does not host checkpoints.

use fe2o3_amqp_types::messaging::{AmqpValue, ApplicationProperties, Body};
use fe2o3_amqp_types::primitives::{OrderedMap, SimpleValue, Timestamp, Value};

use crate::MessageError;
use crate::message::AmqpMessage;
use crate::names::checkpoint_store as n;
use crate::names::management as m;

/// The most records one request or answer may carry: one per partition of the largest hub.
pub const RECORDS_MAX: usize = 1024;

/// The protocol version [`n::STORE_VERSION`] carries.
pub const STORE_VERSION: i32 = 1;

/// An ownership record, or a claim (whose `version` and `last_modified_ms` are ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnershipEntry {
    /// The partition id.
    pub partition_id: String,
    /// The owner id (`""`: relinquished).
    pub owner_id: String,
    /// The etag; `None` in a claim for a partition that has no record yet.
    pub etag: Option<String>,
    /// The ownership version.
    pub version: i64,
    /// When the hub last changed the record, ms since the Unix epoch.
    pub last_modified_ms: i64,
}

/// A processor host's liveness record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostEntry {
    /// The host's owner id.
    pub owner_id: String,
    /// Grows with every renewal.
    pub version: i64,
    /// When the hub last renewed it, ms since the Unix epoch.
    pub last_modified_ms: i64,
}

/// A checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointEntry {
    /// The partition id.
    pub partition_id: String,
    /// The offset of the last processed event.
    pub offset: Option<u64>,
    /// The sequence number of the last processed event.
    pub sequence_number: Option<i64>,
}

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreRequest {
    /// Every ownership record of the group.
    ListOwnership,
    /// These claims.
    ClaimOwnership(Vec<OwnershipEntry>),
    /// Every checkpoint of the group.
    ListCheckpoints,
    /// This checkpoint, if `fence_owner_id` owns its partition.
    UpdateCheckpoint {
        /// The checkpoint.
        checkpoint: CheckpointEntry,
        /// The owner the partition's record must show.
        fence_owner_id: String,
    },
    /// Renew this host's liveness record; answer the ownership and host records.
    RenewHost {
        /// The host.
        owner_id: String,
    },
    /// Forget this host's liveness record.
    RemoveHost {
        /// The host.
        owner_id: String,
    },
    /// Answer the ownership and host records, renewing nothing.
    ListHosts,
}

/// One request to the hub-hosted store: which hub and group, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreCall {
    /// The event hub.
    pub hub: String,
    /// The consumer group.
    pub consumer_group: String,
    /// What is asked.
    pub request: StoreRequest,
}

/// Whether `operation` is one of the store's.
pub fn is_store_operation(operation: &str) -> bool {
    [
        n::LIST_OWNERSHIP,
        n::CLAIM_OWNERSHIP,
        n::LIST_CHECKPOINTS,
        n::UPDATE_CHECKPOINT,
        n::RENEW_HOST,
        n::REMOVE_HOST,
        n::LIST_HOSTS,
    ]
    .contains(&operation)
}

fn malformed(what: impl Into<String>) -> MessageError {
    MessageError::Malformed(what.into())
}

impl StoreCall {
    /// The request's application properties (without a `security_token`) and body.
    pub fn encode(&self) -> (ApplicationProperties, Body<Value>) {
        let operation = match &self.request {
            StoreRequest::ListOwnership => n::LIST_OWNERSHIP,
            StoreRequest::ClaimOwnership(_) => n::CLAIM_OWNERSHIP,
            StoreRequest::ListCheckpoints => n::LIST_CHECKPOINTS,
            StoreRequest::UpdateCheckpoint { .. } => n::UPDATE_CHECKPOINT,
            StoreRequest::RenewHost { .. } => n::RENEW_HOST,
            StoreRequest::RemoveHost { .. } => n::REMOVE_HOST,
            StoreRequest::ListHosts => n::LIST_HOSTS,
        };
        let mut properties = ApplicationProperties::default();
        let mut put = |key: &str, value: &str| {
            properties
                .0
                .insert(key.to_owned(), SimpleValue::String(value.to_owned()));
        };
        put(m::OPERATION, operation);
        put(m::NAME, &self.hub);
        put(n::CONSUMER_GROUP, &self.consumer_group);
        let body = match &self.request {
            StoreRequest::ListOwnership
            | StoreRequest::ListCheckpoints
            | StoreRequest::ListHosts => Body::Value(AmqpValue(Value::Null)),
            StoreRequest::ClaimOwnership(claims) => encode_ownership(claims),
            StoreRequest::UpdateCheckpoint {
                checkpoint,
                fence_owner_id,
            } => {
                put(n::FENCE_OWNER_ID, fence_owner_id);
                Body::Value(AmqpValue(checkpoint_map(checkpoint)))
            }
            StoreRequest::RenewHost { owner_id } | StoreRequest::RemoveHost { owner_id } => {
                put(n::FENCE_OWNER_ID, owner_id);
                Body::Value(AmqpValue(Value::Null))
            }
        };
        (properties, body)
    }

    /// The store call `request` carries: `None` when its operation is not one of the store's,
    /// an error when it is but the request is malformed.
    pub fn decode(request: &AmqpMessage) -> Option<Result<StoreCall, MessageError>> {
        let operation = property(request, m::OPERATION)?;
        if !is_store_operation(operation) {
            return None;
        }
        Some(decode_call(operation, request))
    }
}

fn decode_call(operation: &str, request: &AmqpMessage) -> Result<StoreCall, MessageError> {
    let hub = property(request, m::NAME)
        .ok_or_else(|| malformed("the request names no event hub (`name`)"))?;
    let consumer_group = property(request, n::CONSUMER_GROUP).ok_or_else(|| {
        malformed(format!(
            "the request names no consumer group (`{}`)",
            n::CONSUMER_GROUP
        ))
    })?;
    let body = match &request.body {
        Body::Value(AmqpValue(value)) => Some(value),
        _ => None,
    };
    let owner_id = |what: &str| {
        property(request, n::FENCE_OWNER_ID)
            .map(str::to_owned)
            .ok_or_else(|| malformed(format!("{what} names no owner (`{}`)", n::FENCE_OWNER_ID)))
    };
    let request = match operation {
        n::LIST_OWNERSHIP => StoreRequest::ListOwnership,
        n::LIST_CHECKPOINTS => StoreRequest::ListCheckpoints,
        n::LIST_HOSTS => StoreRequest::ListHosts,
        n::CLAIM_OWNERSHIP => StoreRequest::ClaimOwnership(decode_ownership_value(
            body.ok_or_else(|| malformed("a claim needs an amqp-value list of claims"))?,
        )?),
        n::RENEW_HOST => StoreRequest::RenewHost {
            owner_id: owner_id("a host renewal")?,
        },
        n::REMOVE_HOST => StoreRequest::RemoveHost {
            owner_id: owner_id("a host removal")?,
        },
        _ => {
            let fence_owner_id = owner_id("a checkpoint")?;
            let map = match body {
                Some(Value::Map(map)) => map,
                _ => return Err(malformed("a checkpoint must be an amqp-value map")),
            };
            StoreRequest::UpdateCheckpoint {
                checkpoint: checkpoint_from_map(map)?,
                fence_owner_id,
            }
        }
    };
    Ok(StoreCall {
        hub: hub.to_owned(),
        consumer_group: consumer_group.to_owned(),
        request,
    })
}

fn property<'a>(message: &'a AmqpMessage, key: &str) -> Option<&'a str> {
    match message.application_properties.as_ref()?.0.get(key)? {
        SimpleValue::String(s) => Some(s),
        SimpleValue::Symbol(s) => Some(s.as_str()),
        _ => None,
    }
}

fn key(k: &str) -> Value {
    Value::String(k.to_owned())
}

fn optional<T>(value: Option<T>, wrap: impl FnOnce(T) -> Value) -> Value {
    value.map_or(Value::Null, wrap)
}

/// Ownership records (or claims) as an answer's (or a claim request's) body.
pub fn encode_ownership(entries: &[OwnershipEntry]) -> Body<Value> {
    let list = entries
        .iter()
        .map(|entry| {
            let mut map = OrderedMap::new();
            map.insert(
                key(n::PARTITION_ID),
                Value::String(entry.partition_id.clone()),
            );
            map.insert(key(n::OWNER_ID), Value::String(entry.owner_id.clone()));
            map.insert(key(n::ETAG), optional(entry.etag.clone(), Value::String));
            map.insert(key(n::VERSION), Value::Long(entry.version));
            map.insert(
                key(n::LAST_MODIFIED),
                Value::Timestamp(Timestamp::from_milliseconds(entry.last_modified_ms)),
            );
            Value::Map(map)
        })
        .collect();
    Body::Value(AmqpValue(Value::List(list)))
}

fn ownership_list(entries: &[OwnershipEntry]) -> Value {
    let Body::Value(AmqpValue(list)) = encode_ownership(entries) else {
        unreachable!("ownership records are an amqp-value")
    };
    list
}

/// A host renewal's answer: the group's ownership and host records.
pub fn encode_listing(ownership: &[OwnershipEntry], hosts: &[HostEntry]) -> Body<Value> {
    let hosts = hosts
        .iter()
        .map(|host| {
            let mut map = OrderedMap::new();
            map.insert(key(n::OWNER_ID), Value::String(host.owner_id.clone()));
            map.insert(key(n::VERSION), Value::Long(host.version));
            map.insert(
                key(n::LAST_MODIFIED),
                Value::Timestamp(Timestamp::from_milliseconds(host.last_modified_ms)),
            );
            Value::Map(map)
        })
        .collect();
    let mut listing = OrderedMap::new();
    listing.insert(key(n::OWNERSHIP), ownership_list(ownership));
    listing.insert(key(n::HOSTS), Value::List(hosts));
    Body::Value(AmqpValue(Value::Map(listing)))
}

/// The ownership and host records of a host renewal's answer.
pub fn decode_listing(
    body: &Body<Value>,
) -> Result<(Vec<OwnershipEntry>, Vec<HostEntry>), MessageError> {
    let Body::Value(AmqpValue(Value::Map(map))) = body else {
        return Err(malformed(
            "a host renewal's answer must be an amqp-value map",
        ));
    };
    let fields = Fields(map);
    let ownership = decode_ownership_value(
        fields
            .get(n::OWNERSHIP)
            .ok_or_else(|| Fields::bad(n::OWNERSHIP, "missing"))?,
    )?;
    let hosts = fields
        .get(n::HOSTS)
        .ok_or_else(|| Fields::bad(n::HOSTS, "missing"))?;
    let hosts = records(hosts, "host records")?
        .iter()
        .map(|record| {
            let Value::Map(map) = record else {
                return Err(malformed("a host record must be a map"));
            };
            let fields = Fields(map);
            Ok(HostEntry {
                owner_id: fields.string(n::OWNER_ID)?,
                version: fields.optional_long(n::VERSION)?.unwrap_or(0),
                last_modified_ms: fields.optional_time(n::LAST_MODIFIED)?.unwrap_or(0),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((ownership, hosts))
}

fn checkpoint_map(entry: &CheckpointEntry) -> Value {
    let mut map = OrderedMap::new();
    map.insert(
        key(n::PARTITION_ID),
        Value::String(entry.partition_id.clone()),
    );
    map.insert(key(n::OFFSET), optional(entry.offset, Value::Ulong));
    map.insert(
        key(n::SEQUENCE_NUMBER),
        optional(entry.sequence_number, Value::Long),
    );
    Value::Map(map)
}

/// Checkpoints as an answer's body.
pub fn encode_checkpoints(entries: &[CheckpointEntry]) -> Body<Value> {
    Body::Value(AmqpValue(Value::List(
        entries.iter().map(checkpoint_map).collect(),
    )))
}

/// The ownership records (or claims) of an answer's (or a claim request's) body.
pub fn decode_ownership(body: &Body<Value>) -> Result<Vec<OwnershipEntry>, MessageError> {
    match body {
        Body::Value(AmqpValue(value)) => decode_ownership_value(value),
        _ => Err(malformed("ownership records must be an amqp-value list")),
    }
}

/// The checkpoints of an answer's body.
pub fn decode_checkpoints(body: &Body<Value>) -> Result<Vec<CheckpointEntry>, MessageError> {
    let Body::Value(AmqpValue(value)) = body else {
        return Err(malformed("checkpoints must be an amqp-value list"));
    };
    records(value, "checkpoints")?
        .iter()
        .map(|record| match record {
            Value::Map(map) => checkpoint_from_map(map),
            _ => Err(malformed("a checkpoint must be a map")),
        })
        .collect()
}

fn records<'a>(value: &'a Value, what: &str) -> Result<&'a [Value], MessageError> {
    let list = match value {
        Value::List(list) => list.as_slice(),
        Value::Array(array) => array.as_slice(),
        _ => return Err(malformed(format!("{what} must be a list"))),
    };
    if list.len() > RECORDS_MAX {
        return Err(malformed(format!(
            "{} {what} in one message; at most {RECORDS_MAX}",
            list.len()
        )));
    }
    Ok(list)
}

fn decode_ownership_value(value: &Value) -> Result<Vec<OwnershipEntry>, MessageError> {
    records(value, "ownership records")?
        .iter()
        .map(|record| {
            let Value::Map(map) = record else {
                return Err(malformed("an ownership record must be a map"));
            };
            let fields = Fields(map);
            Ok(OwnershipEntry {
                partition_id: fields.string(n::PARTITION_ID)?,
                owner_id: fields.string(n::OWNER_ID)?,
                etag: fields.optional_string(n::ETAG)?,
                version: fields.optional_long(n::VERSION)?.unwrap_or(0),
                last_modified_ms: fields.optional_time(n::LAST_MODIFIED)?.unwrap_or(0),
            })
        })
        .collect()
}

fn checkpoint_from_map(map: &OrderedMap<Value, Value>) -> Result<CheckpointEntry, MessageError> {
    let fields = Fields(map);
    Ok(CheckpointEntry {
        partition_id: fields.string(n::PARTITION_ID)?,
        offset: fields.optional_ulong(n::OFFSET)?,
        sequence_number: fields.optional_long(n::SEQUENCE_NUMBER)?,
    })
}

/// Typed reads of a record's fields, with errors naming the key.
struct Fields<'a>(&'a OrderedMap<Value, Value>);

impl Fields<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        self.0
            .iter()
            .find(|(k, _)| match k {
                Value::String(s) => s == name,
                Value::Symbol(s) => s.0 == name,
                _ => false,
            })
            .map(|(_, v)| v)
            .filter(|v| !matches!(v, Value::Null))
    }

    fn bad(name: &str, why: &str) -> MessageError {
        malformed(format!("a record's {name:?} is {why}"))
    }

    fn optional_string(&self, name: &str) -> Result<Option<String>, MessageError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(Self::bad(name, "not a string")),
        }
    }

    fn string(&self, name: &str) -> Result<String, MessageError> {
        self.optional_string(name)?
            .ok_or_else(|| Self::bad(name, "missing"))
    }

    fn optional_long(&self, name: &str) -> Result<Option<i64>, MessageError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Long(v)) => Ok(Some(*v)),
            Some(Value::Int(v)) => Ok(Some(i64::from(*v))),
            Some(_) => Err(Self::bad(name, "not a long")),
        }
    }

    fn optional_ulong(&self, name: &str) -> Result<Option<u64>, MessageError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Ulong(v)) => Ok(Some(*v)),
            Some(Value::Long(v)) => u64::try_from(*v)
                .map(Some)
                .map_err(|_| Self::bad(name, "negative")),
            Some(_) => Err(Self::bad(name, "not an unsigned long")),
        }
    }

    fn optional_time(&self, name: &str) -> Result<Option<i64>, MessageError> {
        match self.get(name) {
            Some(Value::Timestamp(t)) => Ok(Some(t.milliseconds())),
            _ => self.optional_long(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::empty_message;

    fn as_request(call: &StoreCall) -> AmqpMessage {
        let (properties, body) = call.encode();
        AmqpMessage {
            application_properties: Some(properties),
            body,
            ..empty_message()
        }
    }

    fn ownership(partition: &str, etag: Option<&str>) -> OwnershipEntry {
        OwnershipEntry {
            partition_id: partition.to_owned(),
            owner_id: "host-a".to_owned(),
            etag: etag.map(str::to_owned),
            version: 7,
            last_modified_ms: 1_700_000_000_123,
        }
    }

    #[test]
    fn every_request_decodes_back_to_what_was_encoded() {
        let checkpoint = CheckpointEntry {
            partition_id: "3".into(),
            offset: Some(u64::MAX),
            sequence_number: None,
        };
        for request in [
            StoreRequest::ListOwnership,
            StoreRequest::ListCheckpoints,
            StoreRequest::ClaimOwnership(vec![ownership("0", None), ownership("1", Some("e"))]),
            StoreRequest::UpdateCheckpoint {
                checkpoint,
                fence_owner_id: "host-a".into(),
            },
            StoreRequest::RenewHost {
                owner_id: "host-a".into(),
            },
            StoreRequest::RemoveHost {
                owner_id: "host-b".into(),
            },
            StoreRequest::ListHosts,
        ] {
            let call = StoreCall {
                hub: "Orders".into(),
                consumer_group: "$Default".into(),
                request,
            };
            let message = as_request(&call);
            // Through the bytes, as on the wire.
            let bytes = crate::message::encode_message(&message).unwrap();
            let decoded = crate::ingest::decode_strict(&bytes).unwrap();
            assert_eq!(StoreCall::decode(&decoded), Some(Ok(call)));
        }
    }

    #[test]
    fn answers_decode_back_and_other_operations_are_not_ours() {
        let records = vec![ownership("0", Some("x")), ownership("1", Some("y"))];
        assert_eq!(
            decode_ownership(&encode_ownership(&records)),
            Ok(records.clone())
        );
        let checkpoints = vec![CheckpointEntry {
            partition_id: "0".into(),
            offset: None,
            sequence_number: Some(-1),
        }];
        assert_eq!(
            decode_checkpoints(&encode_checkpoints(&checkpoints)),
            Ok(checkpoints)
        );
        let hosts = vec![HostEntry {
            owner_id: "host-a".into(),
            version: 3,
            last_modified_ms: 1_700_000_000_000,
        }];
        assert_eq!(
            decode_listing(&encode_listing(&records, &hosts)),
            Ok((records.clone(), hosts))
        );
        assert!(decode_listing(&encode_ownership(&records)).is_err());
        let mut read = empty_message();
        let mut properties = ApplicationProperties::default();
        properties
            .0
            .insert(m::OPERATION.into(), SimpleValue::String(m::READ.into()));
        read.application_properties = Some(properties);
        assert_eq!(StoreCall::decode(&read), None);
    }

    #[test]
    fn malformed_requests_and_answers_are_errors_not_panics() {
        let mut call = as_request(&StoreCall {
            hub: "h".into(),
            consumer_group: "g".into(),
            request: StoreRequest::ClaimOwnership(vec![]),
        });
        call.body = Body::Value(AmqpValue(Value::String("x".into())));
        assert!(matches!(StoreCall::decode(&call), Some(Err(_))));
        let mut without_group = ApplicationProperties::default();
        without_group.0.insert(
            m::OPERATION.into(),
            SimpleValue::String(n::LIST_OWNERSHIP.into()),
        );
        without_group
            .0
            .insert(m::NAME.into(), SimpleValue::String("h".into()));
        call.application_properties = Some(without_group);
        assert!(matches!(StoreCall::decode(&call), Some(Err(_))));
        let too_many = Value::List(vec![Value::Null; RECORDS_MAX + 1]);
        assert!(decode_ownership(&Body::Value(AmqpValue(too_many))).is_err());
        let mut bad = OrderedMap::new();
        bad.insert(key(n::PARTITION_ID), Value::Long(1));
        let bad = Value::List(vec![Value::Map(bad)]);
        let error = decode_checkpoints(&Body::Value(AmqpValue(bad))).unwrap_err();
        assert!(error.to_string().contains("partition-id"), "{error}");
    }
}
