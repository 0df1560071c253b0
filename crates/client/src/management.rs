//! Hub and partition properties through the `$management` node.
//!
//! A request is an empty message whose application properties say `operation = READ`,
//! `type = com.microsoft:eventhub` (or `com.microsoft:partition` with `partition = <id>`),
//! `name = <hub>` and `security_token = <the current SAS token>`. The answer's body is an
//! `amqp-value` map with the keys the Azure SDKs read (see `amqp_dialect.md` §3); a missing key
//! or a value of the wrong type is a [`ClientError::Protocol`], a status of 404 a
//! [`ClientError::NotFound`].

use fe2o3_amqp_types::messaging::{ApplicationProperties, Body};
use fe2o3_amqp_types::primitives::{OrderedMap, SimpleValue, Value};

use tributary_eventhubs::names::management as m;

use crate::connection::Connector;
use crate::error::ClientError;

/// What `$management` says about an event hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventHubProperties {
    /// The hub's name.
    pub name: String,
    /// When the hub was created, in milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// The partition ids, e.g. `["0", "1", "2", "3"]`.
    pub partition_ids: Vec<String>,
    /// The hub's stable, unique identity, when the hub says (a Tributary hub does; Azure Event
    /// Hubs does not, and there the namespace's host name and the hub's name are unique).
    pub hub_id: Option<String>,
}

/// What `$management` says about one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionProperties {
    /// The hub's name.
    pub event_hub_name: String,
    /// The partition id.
    pub id: String,
    /// The sequence number of the oldest retained event (0 for an empty partition).
    pub beginning_sequence_number: i64,
    /// The sequence number of the newest event, -1 if none was ever appended.
    pub last_enqueued_sequence_number: i64,
    /// The offset of the newest event; `None` when the partition is empty (the hub says `-1`).
    pub last_enqueued_offset: Option<u64>,
    /// When the newest event was enqueued, in milliseconds since the Unix epoch (0 if none).
    pub last_enqueued_time_ms: i64,
    /// Whether the partition holds no events.
    pub is_empty: bool,
}

fn request(kind: &str, hub: &str, partition: Option<&str>, token: &str) -> ApplicationProperties {
    let mut properties = ApplicationProperties::default();
    let mut put = |key: &str, value: &str| {
        properties
            .0
            .insert(key.to_owned(), SimpleValue::String(value.to_owned()));
    };
    put(m::OPERATION, m::READ);
    put(m::TYPE, kind);
    put(m::NAME, hub);
    if let Some(partition) = partition {
        put(m::PARTITION, partition);
    }
    put(m::SECURITY_TOKEN, token);
    properties
}

async fn read(
    connector: &Connector,
    kind: &str,
    partition: Option<&str>,
) -> Result<OrderedMap<Value, Value>, ClientError> {
    let target = &connector.target;
    let work = async {
        let mut live = connector.live().await?;
        let properties = request(kind, &target.hub, partition, live.token());
        let timeout = target.options.operation_timeout;
        let link = live.management().await?;
        link.call(properties, Body::Empty, timeout).await?.success()
    };
    let response = target.timed("a $management request", work).await?;
    match response.body {
        Body::Value(value) => match value.0 {
            Value::Map(map) => Ok(map),
            other => Err(bad_body(kind, &format!("a {} value", value_kind(&other)))),
        },
        Body::Data(_) => Err(bad_body(kind, "data sections")),
        Body::Sequence(_) => Err(bad_body(kind, "a sequence")),
        Body::Empty => Err(bad_body(kind, "nothing")),
    }
}

fn bad_body(kind: &str, found: &str) -> ClientError {
    ClientError::Protocol {
        description: format!(
            "the $management answer for {kind} should be a map, but it holds {found}"
        ),
    }
}

fn value_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::List(_) => "list",
        Value::Array(_) => "array",
        Value::String(_) => "string",
        _ => "scalar",
    }
}

/// Reads the hub's properties.
pub(crate) async fn hub_properties(
    connector: &Connector,
) -> Result<EventHubProperties, ClientError> {
    let map = read(connector, m::EVENTHUB_TYPE, None).await?;
    let fields = Fields {
        map: &map,
        kind: m::EVENTHUB_TYPE,
    };
    Ok(EventHubProperties {
        name: fields.string(m::NAME)?,
        created_at_ms: fields.time(m::CREATED_AT)?,
        partition_ids: fields.strings(m::PARTITION_IDS)?,
        hub_id: fields.string(m::HUB_ID).ok(),
    })
}

/// Reads one partition's properties.
pub(crate) async fn partition_properties(
    connector: &Connector,
    partition: &str,
) -> Result<PartitionProperties, ClientError> {
    if partition.is_empty() {
        return Err(ClientError::InvalidArgument(
            "the partition id is empty".to_owned(),
        ));
    }
    let map = read(connector, m::PARTITION_TYPE, Some(partition)).await?;
    let fields = Fields {
        map: &map,
        kind: m::PARTITION_TYPE,
    };
    let offset = fields.string(m::LAST_ENQUEUED_OFFSET)?;
    let last_enqueued_offset = match offset.as_str() {
        "-1" | "" => None,
        text => Some(text.parse::<u64>().map_err(|_| {
            fields.bad(
                m::LAST_ENQUEUED_OFFSET,
                &format!("{text:?} is not a decimal offset"),
            )
        })?),
    };
    Ok(PartitionProperties {
        event_hub_name: fields.string(m::NAME)?,
        id: fields.string(m::PARTITION)?,
        beginning_sequence_number: fields.integer(m::BEGIN_SEQUENCE_NUMBER)?,
        last_enqueued_sequence_number: fields.integer(m::LAST_ENQUEUED_SEQUENCE_NUMBER)?,
        last_enqueued_offset,
        last_enqueued_time_ms: fields.time(m::LAST_ENQUEUED_TIME_UTC)?,
        is_empty: fields.boolean(m::IS_PARTITION_EMPTY)?,
    })
}

/// Typed access to a response map, with errors naming the key.
struct Fields<'a> {
    map: &'a OrderedMap<Value, Value>,
    kind: &'static str,
}

impl Fields<'_> {
    fn get(&self, key: &str) -> Result<&Value, ClientError> {
        self.map
            .iter()
            .find(|(k, _)| match k {
                Value::String(s) => s == key,
                Value::Symbol(s) => s.0 == key,
                _ => false,
            })
            .map(|(_, v)| v)
            .ok_or_else(|| self.bad(key, "missing"))
    }

    fn bad(&self, key: &str, why: &str) -> ClientError {
        ClientError::Protocol {
            description: format!(
                "the $management answer for {} has a bad {key:?}: {why}",
                self.kind
            ),
        }
    }

    fn string(&self, key: &str) -> Result<String, ClientError> {
        match self.get(key)? {
            Value::String(s) => Ok(s.clone()),
            Value::Symbol(s) => Ok(s.0.clone()),
            Value::Binary(b) => {
                String::from_utf8(b.to_vec()).map_err(|_| self.bad(key, "not UTF-8"))
            }
            _ => Err(self.bad(key, "not a string")),
        }
    }

    fn integer(&self, key: &str) -> Result<i64, ClientError> {
        match self.get(key)? {
            Value::Long(v) => Ok(*v),
            Value::Int(v) => Ok(i64::from(*v)),
            Value::Uint(v) => Ok(i64::from(*v)),
            Value::Ulong(v) => i64::try_from(*v).map_err(|_| self.bad(key, "out of range")),
            Value::String(s) => s.parse().map_err(|_| self.bad(key, "not an integer")),
            _ => Err(self.bad(key, "not an integer")),
        }
    }

    fn time(&self, key: &str) -> Result<i64, ClientError> {
        match self.get(key)? {
            Value::Timestamp(t) => Ok(t.milliseconds()),
            _ => self.integer(key),
        }
    }

    fn boolean(&self, key: &str) -> Result<bool, ClientError> {
        match self.get(key)? {
            Value::Bool(b) => Ok(*b),
            _ => Err(self.bad(key, "not a boolean")),
        }
    }

    fn strings(&self, key: &str) -> Result<Vec<String>, ClientError> {
        let items: Vec<&Value> = match self.get(key)? {
            Value::Array(array) => array.iter().collect(),
            Value::List(list) => list.iter().collect(),
            _ => return Err(self.bad(key, "not an array of strings")),
        };
        items
            .into_iter()
            .map(|item| match item {
                Value::String(s) => Ok(s.clone()),
                Value::Symbol(s) => Ok(s.0.clone()),
                _ => Err(self.bad(key, "an element is not a string")),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp_types::primitives::{Array, Timestamp};

    use super::*;

    fn map(entries: Vec<(&str, Value)>) -> OrderedMap<Value, Value> {
        let mut map = OrderedMap::new();
        for (k, v) in entries {
            map.insert(Value::String(k.to_owned()), v);
        }
        map
    }

    #[test]
    fn reads_fields_of_every_accepted_type() {
        let m = map(vec![
            ("name", Value::String("orders".to_owned())),
            (
                "created_at",
                Value::Timestamp(Timestamp::from_milliseconds(5)),
            ),
            (
                "partition_ids",
                Value::Array(Array::from(vec![
                    Value::String("0".to_owned()),
                    Value::String("1".to_owned()),
                ])),
            ),
            ("n", Value::Int(3)),
            ("b", Value::Bool(true)),
            ("list", Value::List(vec![Value::String("x".to_owned())])),
        ]);
        let f = Fields {
            map: &m,
            kind: "test",
        };
        assert_eq!(f.string("name").unwrap(), "orders");
        assert_eq!(f.time("created_at").unwrap(), 5);
        assert_eq!(f.strings("partition_ids").unwrap(), ["0", "1"]);
        assert_eq!(f.strings("list").unwrap(), ["x"]);
        assert_eq!(f.integer("n").unwrap(), 3);
        assert!(f.boolean("b").unwrap());
        let missing = f.string("absent").unwrap_err();
        assert!(missing.to_string().contains("\"absent\""), "{missing}");
        assert!(matches!(
            f.boolean("name"),
            Err(ClientError::Protocol { .. })
        ));
    }

    #[test]
    fn requests_carry_what_the_sdks_send() {
        let p = request("com.microsoft:partition", "orders", Some("3"), "tok");
        let get = |k: &str| p.0.get(k).cloned();
        assert_eq!(
            get("operation"),
            Some(SimpleValue::String("READ".to_owned()))
        );
        assert_eq!(
            get("type"),
            Some(SimpleValue::String("com.microsoft:partition".to_owned()))
        );
        assert_eq!(get("name"), Some(SimpleValue::String("orders".to_owned())));
        assert_eq!(get("partition"), Some(SimpleValue::String("3".to_owned())));
        assert_eq!(
            get("security_token"),
            Some(SimpleValue::String("tok".to_owned()))
        );
    }
}
