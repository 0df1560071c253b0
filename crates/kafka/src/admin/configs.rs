//! Topic and broker configs: DescribeConfigs, and the topic configs CreateTopics accepts (see
//! the module docs of [`crate::admin`] for which a hub honours).
//!
//! Values, sources and read-only flags follow what a Kafka broker answers: a topic's config is
//! TOPIC_CONFIG when the hub's value differs from the broker default, DEFAULT_CONFIG when it
//! does not; topic configs are not read-only; broker configs are STATIC_BROKER_CONFIG (set by
//! how `serve` runs) or DEFAULT_CONFIG and read-only. Asked for some keys, only those known are
//! answered, as Kafka does.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_topics_request::CreatableTopicConfig;
use kafka_protocol::messages::create_topics_response::CreatableTopicConfigs;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse};
use kafka_protocol::protocol::StrBytes;
use tributary_amqp::auth;
use tributary_amqp::auth::Needed;
use tributary_broker::config::RETENTION_AGE_MS_DEFAULT;
use tributary_broker::{HubCleanup, HubDefinition, HubSpec, HubUpdate};

use super::{Refusal, text};
use crate::connection::{Context, Session};
use crate::limits::RECORD_BYTES_MAX;
use crate::metadata::NODE_ID;

/// The config resource types (DescribeConfigs, AlterConfigs).
pub(crate) const RESOURCE_TOPIC: i8 = 2;
pub(crate) const RESOURCE_BROKER: i8 = 4;

/// DescribeConfigs' config sources.
const SOURCE_TOPIC: i8 = 1;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;

/// DescribeConfigs' config types (v3 and later).
const TYPE_BOOLEAN: i8 = 1;
const TYPE_STRING: i8 = 2;
const TYPE_INT: i8 = 3;
const TYPE_LONG: i8 = 5;
const TYPE_LIST: i8 = 7;

/// The partition count of a topic created with −1 partitions: Kafka's `num.partitions`
/// default.
pub(crate) const PARTITIONS_DEFAULT: u32 = 1;

/// One config as DescribeConfigs and CreateTopics report it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    name: &'static str,
    value: String,
    source: i8,
    read_only: bool,
    config_type: i8,
    documentation: &'static str,
}

/// The settings a hub keeps that are topic configs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Retention {
    pub(crate) age_ms: Option<i64>,
    pub(crate) bytes_max: Option<u64>,
    pub(crate) cleanup: HubCleanup,
}

impl Retention {
    pub(crate) fn of(spec: &HubSpec) -> Self {
        Retention {
            age_ms: spec.retention_age_ms,
            bytes_max: spec.retention_bytes_max,
            cleanup: spec.cleanup,
        }
    }

    pub(crate) fn of_hub(hub: &HubDefinition) -> Self {
        Retention {
            age_ms: hub.retention_age_ms,
            bytes_max: hub.retention_bytes_max,
            cleanup: hub.cleanup,
        }
    }
}

fn fixed(name: &'static str, value: &str, config_type: i8, documentation: &'static str) -> Entry {
    Entry {
        name,
        value: value.to_owned(),
        source: SOURCE_DEFAULT,
        read_only: false,
        config_type,
        documentation,
    }
}

/// A topic's configs: what its hub keeps, then what every hub fixes.
fn topic_entries(retention: Retention) -> Vec<Entry> {
    let mut entries = retention_entries(retention);
    entries.extend(cleanup_entries(retention.cleanup));
    entries.extend(fixed_entries());
    entries
}

/// `retention.ms` and `retention.bytes`.
fn retention_entries(retention: Retention) -> Vec<Entry> {
    let age = retention.age_ms.unwrap_or(-1);
    let age_source = if retention.age_ms == Some(RETENTION_AGE_MS_DEFAULT) {
        SOURCE_DEFAULT
    } else {
        SOURCE_TOPIC
    };
    let bytes = retention
        .bytes_max
        .map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX));
    let bytes_source = if retention.bytes_max.is_none() {
        SOURCE_DEFAULT
    } else {
        SOURCE_TOPIC
    };
    vec![
        Entry {
            source: age_source,
            ..fixed(
                "retention.ms",
                &age.to_string(),
                TYPE_LONG,
                "How long events are kept (the event hub's retention); -1 keeps them forever.",
            )
        },
        Entry {
            source: bytes_source,
            ..fixed(
                "retention.bytes",
                &bytes.to_string(),
                TYPE_LONG,
                "The most bytes each partition keeps, oldest segments removed first; -1: no limit.",
            )
        },
    ]
}

/// `cleanup.policy`, `min.compaction.lag.ms` and `delete.retention.ms`: the hub's cleanup
/// policy, minimum compaction lag and tombstone retention.
fn cleanup_entries(cleanup: HubCleanup) -> Vec<Entry> {
    let defaults = HubCleanup::default();
    let source = |set: bool| if set { SOURCE_TOPIC } else { SOURCE_DEFAULT };
    vec![
        Entry {
            source: source(cleanup.policy != defaults.policy),
            ..fixed(
                "cleanup.policy",
                &cleanup.policy.to_string(),
                TYPE_LIST,
                "delete: events are removed by age and size; compact: the latest event of each key is kept; or both.",
            )
        },
        Entry {
            source: source(cleanup.min_compaction_lag_ms != defaults.min_compaction_lag_ms),
            ..fixed(
                "min.compaction.lag.ms",
                &cleanup.min_compaction_lag_ms.to_string(),
                TYPE_LONG,
                "An event stays readable this long after a later event of its key supersedes it.",
            )
        },
        Entry {
            source: source(cleanup.tombstone_retention_ms != defaults.tombstone_retention_ms),
            ..fixed(
                "delete.retention.ms",
                &cleanup.tombstone_retention_ms.to_string(),
                TYPE_LONG,
                "How long a tombstone (a key and a null value) is kept on a compacted topic.",
            )
        },
    ]
}

/// What every hub fixes.
fn fixed_entries() -> Vec<Entry> {
    vec![
        fixed(
            "max.message.bytes",
            &RECORD_BYTES_MAX.to_string(),
            TYPE_INT,
            "The largest record: Event Hubs' 1 MiB.",
        ),
        fixed(
            "message.timestamp.type",
            "CreateTime",
            TYPE_STRING,
            "Records keep the producer's timestamp.",
        ),
        fixed(
            "min.insync.replicas",
            "1",
            TYPE_INT,
            "One replica, this node: a write is acknowledged once stored here.",
        ),
        fixed(
            "compression.type",
            "producer",
            TYPE_STRING,
            "Batches are accepted as the producer compressed them; fetches answer uncompressed.",
        ),
    ]
}

/// This node's broker configs.
fn broker_entries() -> Vec<Entry> {
    let set = |name, value: &str, config_type, documentation| Entry {
        source: SOURCE_STATIC_BROKER,
        read_only: true,
        ..fixed(name, value, config_type, documentation)
    };
    let default = |name, value: &str, config_type, documentation| Entry {
        read_only: true,
        ..fixed(name, value, config_type, documentation)
    };
    vec![
        set(
            "broker.id",
            &NODE_ID.to_string(),
            TYPE_INT,
            "This node's id.",
        ),
        set("node.id", &NODE_ID.to_string(), TYPE_INT, "This node's id."),
        default(
            "num.partitions",
            &PARTITIONS_DEFAULT.to_string(),
            TYPE_INT,
            "The partition count of a topic created with -1 partitions.",
        ),
        default("default.replication.factor", "1", TYPE_INT, "One replica."),
        default("min.insync.replicas", "1", TYPE_INT, "One replica."),
        set(
            "log.retention.ms",
            &RETENTION_AGE_MS_DEFAULT.to_string(),
            TYPE_LONG,
            "A new topic's retention: one day, as Event Hubs.",
        ),
        default("log.retention.bytes", "-1", TYPE_LONG, "No size limit."),
        default(
            "log.cleanup.policy",
            "delete",
            TYPE_LIST,
            "Removal by age and size.",
        ),
        set(
            "message.max.bytes",
            &RECORD_BYTES_MAX.to_string(),
            TYPE_INT,
            "The largest record: Event Hubs' 1 MiB.",
        ),
        default(
            "log.message.timestamp.type",
            "CreateTime",
            TYPE_STRING,
            "Producers' times.",
        ),
        default(
            "compression.type",
            "producer",
            TYPE_STRING,
            "As the producer sent it.",
        ),
        set(
            "auto.create.topics.enable",
            "false",
            TYPE_BOOLEAN,
            "Topics are created by CreateTopics (or as event hubs), never on first use.",
        ),
    ]
}

/// The hub settings `configs` ask for, applied to `spec`; a config the hub cannot honour is
/// INVALID_CONFIG naming it. A config with a null value keeps its default.
pub(crate) fn apply(configs: &[CreatableTopicConfig], spec: &mut HubSpec) -> Result<(), Refusal> {
    let mut retention = Retention::of(spec);
    for config in configs {
        if let Some(value) = config.value.as_ref() {
            retention.set(config.name.as_str(), value.as_str())?;
        }
    }
    spec.retention_age_ms = retention.age_ms;
    spec.retention_bytes_max = retention.bytes_max;
    spec.cleanup = retention.cleanup;
    Ok(())
}

/// INVALID_CONFIG for `name=value`, saying why.
pub(crate) fn invalid(name: &str, value: &str, why: &str) -> Refusal {
    Refusal::new(
        ResponseError::InvalidConfig,
        format!("{name}={value}: {why}"),
    )
}

impl Retention {
    /// What a topic created without configs keeps: Kafka's and Event Hubs' defaults.
    pub(crate) fn defaults() -> Self {
        Retention {
            age_ms: Some(RETENTION_AGE_MS_DEFAULT),
            bytes_max: None,
            cleanup: HubCleanup::default(),
        }
    }

    /// Sets topic config `name` to `value`; a config the hub keeps changes it, one the hub fixes
    /// must be given at its fixed value, and anything else is INVALID_CONFIG naming it.
    pub(crate) fn set(&mut self, name: &str, value: &str) -> Result<(), Refusal> {
        let value = value.trim();
        let invalid = |why: &str| invalid(name, value, why);
        match name {
            "retention.ms" => self.age_ms = limit(value).map_err(invalid)?,
            "retention.bytes" => {
                let bytes = limit(value).map_err(invalid)?;
                self.bytes_max = bytes.map(|b| b.unsigned_abs());
            }
            "cleanup.policy" => {
                self.cleanup.policy = value
                    .parse()
                    .map_err(|_| invalid("expected delete, compact or compact,delete"))?;
            }
            "min.compaction.lag.ms" => {
                self.cleanup.min_compaction_lag_ms = duration(value).map_err(invalid)?;
            }
            "delete.retention.ms" => {
                self.cleanup.tombstone_retention_ms = duration(value).map_err(invalid)?;
            }
            _ => fixed_value(name, value).map_err(invalid)?,
        }
        Ok(())
    }

    /// Sets topic config `name` back to its default; a config the hub fixes is its default
    /// already, and an unknown one is INVALID_CONFIG.
    pub(crate) fn reset(&mut self, name: &str) -> Result<(), Refusal> {
        let defaults = Retention::defaults();
        match name {
            "retention.ms" => self.age_ms = defaults.age_ms,
            "retention.bytes" => self.bytes_max = defaults.bytes_max,
            "cleanup.policy" => self.cleanup.policy = defaults.cleanup.policy,
            "min.compaction.lag.ms" => {
                self.cleanup.min_compaction_lag_ms = defaults.cleanup.min_compaction_lag_ms;
            }
            "delete.retention.ms" => {
                self.cleanup.tombstone_retention_ms = defaults.cleanup.tombstone_retention_ms;
            }
            _ if fixed_entries().iter().any(|e| e.name == name) => {}
            _ => {
                return Err(Refusal::new(
                    ResponseError::InvalidConfig,
                    format!("{name}: an event hub has no such topic config"),
                ));
            }
        }
        Ok(())
    }

    /// The update that gives a hub these settings.
    pub(crate) fn update(self) -> HubUpdate {
        HubUpdate {
            retention_age_ms: Some(self.age_ms),
            retention_bytes_max: Some(self.bytes_max),
            cleanup_policy: Some(self.cleanup.policy),
            min_compaction_lag_ms: Some(self.cleanup.min_compaction_lag_ms),
            tombstone_retention_ms: Some(self.cleanup.tombstone_retention_ms),
            // A topic's configs say nothing of Capture: it is kept as it is.
            capture: None,
        }
    }
}

/// A retention limit: a positive number, or −1 for none.
fn limit(value: &str) -> Result<Option<i64>, &'static str> {
    match value.parse::<i64>() {
        Ok(-1) => Ok(None),
        Ok(v) if v > 0 => Ok(Some(v)),
        _ => Err("expected a positive number, or -1 for no limit"),
    }
}

/// A duration in ms: 0 or more.
fn duration(value: &str) -> Result<i64, &'static str> {
    match value.parse::<i64>() {
        Ok(v) if v >= 0 => Ok(v),
        _ => Err("expected a number of milliseconds, 0 or more"),
    }
}

/// Whether `value` is what every hub has for `name`.
fn fixed_value(name: &str, value: &str) -> Result<(), &'static str> {
    let entries = fixed_entries();
    let Some(entry) = entries.iter().find(|e| e.name == name) else {
        return Err("an event hub has no such topic config");
    };
    let accepted = match name {
        "compression.type" => matches!(value, "producer" | "uncompressed"),
        "message.timestamp.type" => value.eq_ignore_ascii_case(&entry.value),
        _ => value == entry.value,
    };
    if accepted {
        Ok(())
    } else {
        Err("an event hub has a fixed value for this config (see DescribeConfigs)")
    }
}

/// A new topic's configs as CreateTopics (v5 and later) reports them.
pub(crate) fn created(retention: Retention) -> Vec<CreatableTopicConfigs> {
    topic_entries(retention)
        .into_iter()
        .map(|e| {
            CreatableTopicConfigs::default()
                .with_name(StrBytes::from_static_str(e.name))
                .with_value(text(e.value))
                .with_read_only(e.read_only)
                .with_config_source(e.source)
        })
        .collect()
}

/// The DescribeConfigs answer: each resource's configs, or its error.
pub(crate) fn describe(
    request: &DescribeConfigsRequest,
    session: &Session,
    ctx: &Context,
) -> DescribeConfigsResponse {
    let results = request
        .resources
        .iter()
        .map(|resource| {
            let result = DescribeConfigsResult::default()
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name.clone());
            match entries(resource, session, ctx) {
                Ok(entries) => result
                    .with_configs(entries.into_iter().map(|e| described(e, request)).collect()),
                Err(refusal) => result
                    .with_error_code(refusal.code)
                    .with_error_message(text(refusal.message)),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

/// One resource's configs (those asked for), or why not.
fn entries(
    resource: &DescribeConfigsResource,
    session: &Session,
    ctx: &Context,
) -> Result<Vec<Entry>, Refusal> {
    let name = resource.resource_name.as_str();
    let all = match resource.resource_type {
        RESOURCE_TOPIC => {
            let hub = topic(name, session, ctx, auth::LISTEN, "describing")?;
            topic_entries(Retention::of_hub(&hub))
        }
        RESOURCE_BROKER => {
            super::authorize_cluster(session, auth::LISTEN)?;
            if !name.is_empty() && name != NODE_ID.to_string() {
                return Err(Refusal::new(
                    ResponseError::InvalidRequest,
                    format!("no broker {name:?}: this cluster's only broker is {NODE_ID}"),
                ));
            }
            broker_entries()
        }
        other => {
            return Err(Refusal::new(
                ResponseError::InvalidRequest,
                format!("resource type {other} has no configs here (topics 2 and brokers 4 do)"),
            ));
        }
    };
    Ok(match &resource.configuration_keys {
        None => all,
        Some(keys) => all
            .into_iter()
            .filter(|e| keys.iter().any(|k| k.as_str() == e.name))
            .collect(),
    })
}

/// The hub topic `name` is, once the session holds `needed` on it for `doing` (named in the
/// refusal: "describing", "altering").
pub(crate) fn topic(
    name: &str,
    session: &Session,
    ctx: &Context,
    needed: Needed,
    doing: &str,
) -> Result<HubDefinition, Refusal> {
    session.authorize(name, needed).map_err(|code| Refusal {
        code,
        message: format!(
            "{doing} topic {name:?} needs the {} right",
            needed_rights(needed)
        ),
    })?;
    ctx.broker.describe_hub(name).map_err(|_| {
        Refusal::new(
            ResponseError::UnknownTopicOrPartition,
            format!("topic {name:?} does not exist"),
        )
    })
}

/// The rights a check accepts, as a refusal names them ("Listen or Manage").
fn needed_rights(needed: Needed) -> String {
    needed
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" or ")
}

/// One config as DescribeConfigs answers it (its synonym list is itself, as Kafka lists the
/// config that sets the value first).
fn described(entry: Entry, request: &DescribeConfigsRequest) -> DescribeConfigsResourceResult {
    let name = StrBytes::from_static_str(entry.name);
    let synonyms = if request.include_synonyms {
        vec![
            DescribeConfigsSynonym::default()
                .with_name(name.clone())
                .with_value(text(entry.value.clone()))
                .with_source(entry.source),
        ]
    } else {
        Vec::new()
    };
    let documentation = if request.include_documentation {
        Some(StrBytes::from_static_str(entry.documentation))
    } else {
        None
    };
    DescribeConfigsResourceResult::default()
        .with_name(name)
        .with_value(text(entry.value))
        .with_read_only(entry.read_only)
        .with_config_source(entry.source)
        .with_synonyms(synonyms)
        .with_config_type(entry.config_type)
        .with_documentation(documentation)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: &str, value: Option<&str>) -> CreatableTopicConfig {
        CreatableTopicConfig::default()
            .with_name(StrBytes::from_string(name.to_owned()))
            .with_value(value.map(|v| StrBytes::from_string(v.to_owned())))
    }

    #[test]
    fn retention_configs_set_the_hub_and_fixed_ones_are_accepted_only_at_their_value() {
        let mut spec = HubSpec::new("t", 1);
        let asked = [
            config("retention.ms", Some("3600000")),
            config("retention.bytes", Some("-1")),
            config("cleanup.policy", Some("delete")),
            config("max.message.bytes", Some("1048576")),
            config("compression.type", Some("uncompressed")),
            config("min.insync.replicas", None),
        ];
        apply(&asked, &mut spec).unwrap();
        assert_eq!(spec.retention_age_ms, Some(3_600_000));
        assert_eq!(spec.retention_bytes_max, None);
        apply(&[config("retention.ms", Some("-1"))], &mut spec).unwrap();
        assert_eq!(spec.retention_age_ms, None);
        apply(&[config("retention.bytes", Some("1024"))], &mut spec).unwrap();
        assert_eq!(spec.retention_bytes_max, Some(1024));
        let compacted = [
            config("cleanup.policy", Some("compact,delete")),
            config("min.compaction.lag.ms", Some("1500")),
            config("delete.retention.ms", Some("0")),
        ];
        apply(&compacted, &mut spec).unwrap();
        let cleanup = HubCleanup {
            policy: tributary_broker::CleanupPolicy::DeleteOrCompact,
            min_compaction_lag_ms: 1500,
            tombstone_retention_ms: 0,
        };
        assert_eq!(spec.cleanup, cleanup);
        let entries = topic_entries(Retention::of(&spec));
        let entry = |name: &str| entries.iter().find(|e| e.name == name).unwrap().clone();
        assert_eq!(entry("cleanup.policy").value, "delete,compact");
        assert_eq!(entry("cleanup.policy").source, SOURCE_TOPIC);
        assert_eq!(entry("min.compaction.lag.ms").value, "1500");
        assert_eq!(entry("delete.retention.ms").value, "0");

        let invalid = ResponseError::InvalidConfig.code();
        for (name, value) in [
            ("cleanup.policy", "shred"),
            ("min.compaction.lag.ms", "-1"),
            ("delete.retention.ms", "a day"),
            ("retention.ms", "0"),
            ("retention.ms", "soon"),
            ("retention.bytes", "-2"),
            ("max.message.bytes", "2097152"),
            ("message.timestamp.type", "LogAppendTime"),
            ("min.insync.replicas", "2"),
            ("compression.type", "zstd"),
            ("segment.bytes", "1024"),
        ] {
            let refused = apply(&[config(name, Some(value))], &mut spec).unwrap_err();
            assert_eq!(refused.code, invalid, "{name}={value}");
            assert!(refused.message.contains(name), "{refused:?}");
        }
    }

    #[test]
    fn a_default_retention_is_a_default_source_and_a_set_one_a_topic_source() {
        let default = topic_entries(Retention {
            age_ms: Some(RETENTION_AGE_MS_DEFAULT),
            bytes_max: None,
            cleanup: HubCleanup::default(),
        });
        assert_eq!(default[0].source, SOURCE_DEFAULT);
        assert_eq!(default[1].value, "-1");
        assert!(
            default
                .iter()
                .all(|e| e.source == SOURCE_DEFAULT || e.name == "retention.bytes")
        );
        let set = topic_entries(Retention {
            age_ms: None,
            bytes_max: Some(10),
            cleanup: HubCleanup::default(),
        });
        assert_eq!((set[0].value.as_str(), set[0].source), ("-1", SOURCE_TOPIC));
        assert_eq!((set[1].value.as_str(), set[1].source), ("10", SOURCE_TOPIC));
        assert!(broker_entries().iter().all(|e| e.read_only));
    }
}
