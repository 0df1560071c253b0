//! `serve --emulator-config`: the event hubs and consumer groups of a Microsoft Event Hubs
//! emulator configuration file (its `Config.json`), created on the data directory.
//!
//! # What is read
//! The emulator's schema (`EventHub-Emulator/Schema/Config-schema.json` in
//! Azure/azure-event-hubs-emulator-installer): `UserConfig.NamespaceConfig[]`, each with `Type`
//! (`"EventHub"`), `Name` and `Entities[]`; each entity with `Name`, `PartitionCount` (a number,
//! or a string of one as the emulator's own sample writes `"2"`) and `ConsumerGroups[]` of
//! objects with `Name`. Used: the entities' `Name`, `PartitionCount` and `ConsumerGroups[].Name`.
//! Accepted and ignored: the namespace's `Name` (the emulator insists on `emulatorNs1`; its
//! clients never name it, connecting to `sb://localhost`), `LoggingConfig`, and any other field.
//! Keys match case-insensitively. Every namespace's entities go to this server's one namespace.
//! `$Default` always exists: a `$Default` entry (which the emulator refuses) is accepted and
//! changes nothing.
//!
//! # Guarantees
//! - The whole file is checked — shape, names, partition counts, duplicates, the consumer-group
//!   limit, and the hubs already on the data directory — before anything is created: a bad file
//!   creates nothing, and its error names the file and the JSON path of what is wrong.
//! - Starting again with the same file is idempotent: hubs already there with the partition
//!   count the file gives are kept with their events, missing consumer groups are added, and
//!   hubs and groups the file does not name are left alone (nothing is ever deleted).
//! - A hub already there with another partition count is an error naming the hub and both
//!   counts: a hub's partition count never changes here (the emulator instead starts empty each
//!   time); delete the hub, or use another data directory, to start it afresh.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tributary_broker::{Broker, HubDefinition, HubSpec};
use tributary_event::names::{
    is_default_consumer_group, name_key, validate_consumer_group_name, validate_hub_name,
};

/// What the file asks for: each event hub with its partitions and consumer groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmulatorConfig {
    /// The entities, in file order.
    pub hubs: Vec<EmulatorHub>,
}

/// One entity of the file: an event hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmulatorHub {
    /// Its name.
    pub name: String,
    /// Its partition count.
    pub partition_count: u32,
    /// Its consumer groups besides `$Default`, in file order, without duplicates.
    pub consumer_groups: Vec<String>,
    /// Where it is in the file (`UserConfig.NamespaceConfig[0].Entities[1]`), for errors.
    pub path: String,
}

/// What applying the file did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Hubs created now.
    pub hubs_created: Vec<String>,
    /// Hubs that were already there, with the partition count the file gives.
    pub hubs_kept: Vec<String>,
    /// Consumer groups created now, as `hub/group`.
    pub groups_created: Vec<String>,
}

/// Reads and checks `path` (no data directory involved yet); errors name the file.
pub fn read(path: &Path) -> Result<EmulatorConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the emulator configuration {}", path.display()))?;
    parse(&text).with_context(|| format!("the emulator configuration {}", path.display()))
}

/// Parses the text of an emulator configuration; an error names the JSON path at fault.
pub fn parse(text: &str) -> Result<EmulatorConfig> {
    let root: Value = serde_json::from_str(text).context("not valid JSON")?;
    let user = required(&root, "", "UserConfig")?;
    let namespaces = array(required(user, "UserConfig", "NamespaceConfig")?, || {
        "UserConfig.NamespaceConfig".to_owned()
    })?;
    if namespaces.is_empty() {
        bail!("UserConfig.NamespaceConfig: empty; it needs one namespace with Entities");
    }
    let mut hubs: Vec<EmulatorHub> = Vec::new();
    for (n, namespace) in namespaces.iter().enumerate() {
        let at = format!("UserConfig.NamespaceConfig[{n}]");
        check_namespace(namespace, &at)?;
        let entities = array(required(namespace, &at, "Entities")?, || {
            format!("{at}.Entities")
        })?;
        for (e, entity) in entities.iter().enumerate() {
            let hub = parse_entity(entity, format!("{at}.Entities[{e}]"))?;
            if let Some(first) = hubs
                .iter()
                .find(|h| name_key(&h.name) == name_key(&hub.name))
            {
                bail!(
                    "{}.Name: the event hub {:?} is already defined at {} (names compare case-insensitively)",
                    hub.path,
                    hub.name,
                    first.path
                );
            }
            hubs.push(hub);
        }
    }
    Ok(EmulatorConfig { hubs })
}

/// A namespace entry: an object whose `Type`, if given, is `EventHub` (a Service Bus
/// emulator's file is refused here rather than creating nothing) and whose `Name`, if given,
/// is a string (ignored).
fn check_namespace(namespace: &Value, at: &str) -> Result<()> {
    if !namespace.is_object() {
        bail!("{at}: expected an object, found {}", shape(namespace));
    }
    if let Some(kind) = field(namespace, "Type")
        && !kind
            .as_str()
            .is_some_and(|k| k.eq_ignore_ascii_case("EventHub"))
    {
        bail!("{at}.Type: expected \"EventHub\", found {kind}");
    }
    if let Some(name) = field(namespace, "Name") {
        string(name, || format!("{at}.Name"))?;
    }
    Ok(())
}

/// One entity: its name, partition count and consumer groups, each checked.
fn parse_entity(entity: &Value, path: String) -> Result<EmulatorHub> {
    if !entity.is_object() {
        bail!("{path}: expected an object, found {}", shape(entity));
    }
    let name = string(required(entity, &path, "Name")?, || format!("{path}.Name"))?;
    validate_hub_name(name).with_context(|| format!("{path}.Name"))?;
    let partition_count = partition_count(required(entity, &path, "PartitionCount")?, &path)?;
    let mut consumer_groups: Vec<String> = Vec::new();
    let groups = match field(entity, "ConsumerGroups") {
        None | Some(Value::Null) => &[][..],
        Some(groups) => array(groups, || format!("{path}.ConsumerGroups"))?,
    };
    for (g, group) in groups.iter().enumerate() {
        let at = format!("{path}.ConsumerGroups[{g}]");
        if !group.is_object() {
            bail!(
                "{at}: expected an object with a Name, found {}",
                shape(group)
            );
        }
        let group = string(required(group, &at, "Name")?, || format!("{at}.Name"))?;
        validate_consumer_group_name(group).with_context(|| format!("{at}.Name"))?;
        if is_default_consumer_group(group) {
            continue; // Every hub has it.
        }
        if consumer_groups
            .iter()
            .any(|known| name_key(known) == name_key(group))
        {
            bail!(
                "{at}.Name: the consumer group {group:?} is listed twice for {name:?} (names compare case-insensitively)"
            );
        }
        consumer_groups.push(group.to_owned());
    }
    Ok(EmulatorHub {
        name: name.to_owned(),
        partition_count,
        consumer_groups,
        path,
    })
}

/// `PartitionCount`: a whole number from 1 to the broker's limit, or a string of one.
fn partition_count(value: &Value, path: &str) -> Result<u32> {
    let max = tributary_broker::config::PARTITIONS_MAX;
    let number = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse::<u64>().ok(),
        _ => None,
    };
    match number.and_then(|n| u32::try_from(n).ok()) {
        Some(count) if (1..=max).contains(&count) => Ok(count),
        _ => bail!(
            "{path}.PartitionCount: expected a whole number from 1 to {max} (or a string of one), found {value}"
        ),
    }
}

/// Checks the file against the hubs already on the data directory, then creates what is
/// missing. Nothing is created when any check fails. `groups_max` is the broker's limit on
/// consumer groups per hub, `$Default` included.
pub async fn apply(broker: &Broker, config: &EmulatorConfig, groups_max: u32) -> Result<Applied> {
    let existing = broker.list_hubs();
    for hub in &config.hubs {
        check_against_existing(hub, &existing, groups_max)?;
    }
    let mut applied = Applied::default();
    for hub in &config.hubs {
        let current = existing
            .iter()
            .find(|h| name_key(&h.name) == name_key(&hub.name));
        let groups_there = match current {
            Some(current) => {
                applied.hubs_kept.push(current.name.clone());
                current.consumer_groups.clone()
            }
            None => {
                let spec = HubSpec::new(&hub.name, hub.partition_count);
                let created = broker
                    .create_hub(spec)
                    .await
                    .with_context(|| format!("cannot create the event hub {:?}", hub.name))?;
                applied.hubs_created.push(created.name.clone());
                created.consumer_groups
            }
        };
        for group in &hub.consumer_groups {
            if groups_there
                .iter()
                .any(|g| name_key(&g.name) == name_key(group))
            {
                continue;
            }
            broker
                .create_consumer_group(&hub.name, group)
                .await
                .with_context(|| {
                    format!(
                        "cannot create the consumer group {group:?} of {:?}",
                        hub.name
                    )
                })?;
            applied.groups_created.push(format!("{}/{group}", hub.name));
        }
    }
    Ok(applied)
}

/// One hub of the file against the data directory: the same partition count if it is there,
/// and no more consumer groups than the limit once the file's are added.
fn check_against_existing(
    hub: &EmulatorHub,
    existing: &[HubDefinition],
    groups_max: u32,
) -> Result<()> {
    let current = existing
        .iter()
        .find(|h| name_key(&h.name) == name_key(&hub.name));
    let mut groups = 1; // $Default
    if let Some(current) = current {
        if current.partition_count != hub.partition_count {
            bail!(
                "{}.PartitionCount: the event hub {:?} already has {} partitions on this data directory, and the file gives {}; a hub's partition count cannot change: delete it (`tributary hub delete {}`, which deletes its events) or use another --data-dir",
                hub.path,
                current.name,
                current.partition_count,
                hub.partition_count,
                current.name
            );
        }
        groups = current.consumer_groups.len();
    }
    let new = hub.consumer_groups.iter().filter(|g| {
        current.is_none_or(|c| {
            !c.consumer_groups
                .iter()
                .any(|k| name_key(&k.name) == name_key(g))
        })
    });
    let total = groups + new.count();
    if total > groups_max as usize {
        bail!(
            "{}.ConsumerGroups: the event hub {:?} would have {total} consumer groups ($Default included), over the limit of {groups_max}",
            hub.path,
            hub.name
        );
    }
    Ok(())
}

/// The field `key` of an object, matched case-insensitively (an exact match first).
fn field<'a>(object: &'a Value, key: &str) -> Option<&'a Value> {
    let object = object.as_object()?;
    object.get(key).or_else(|| {
        object
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v)
    })
}

/// The field `key` of the object at `at`, which must be there.
fn required<'a>(object: &'a Value, at: &str, key: &str) -> Result<&'a Value> {
    let path = if at.is_empty() {
        key.to_owned()
    } else {
        format!("{at}.{key}")
    };
    if !object.is_object() {
        bail!(
            "{}: expected an object, found {}",
            at_or_top(at),
            shape(object)
        );
    }
    field(object, key).with_context(|| format!("{path}: missing"))
}

fn array(value: &Value, path: impl FnOnce() -> String) -> Result<&[Value]> {
    match value {
        Value::Array(items) => Ok(items),
        other => bail!("{}: expected an array, found {}", path(), shape(other)),
    }
}

fn string(value: &Value, path: impl FnOnce() -> String) -> Result<&str> {
    match value {
        Value::String(text) => Ok(text),
        other => bail!("{}: expected a string, found {}", path(), shape(other)),
    }
}

fn at_or_top(at: &str) -> &str {
    if at.is_empty() { "the top level" } else { at }
}

/// What a JSON value is, for errors: its kind, and the value itself when it is short.
fn shape(value: &Value) -> String {
    match value {
        Value::Object(_) => "an object".to_owned(),
        Value::Array(_) => "an array".to_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The emulator's own sample (EventHub-Emulator/Config/Config.json): a string partition
    /// count, one consumer group, logging settings.
    const SAMPLE: &str = r#"{
        "UserConfig": {
            "NamespaceConfig": [{
                "Type": "EventHub",
                "Name": "emulatorNs1",
                "Entities": [{
                    "Name": "eh1",
                    "PartitionCount": "2",
                    "ConsumerGroups": [{ "Name": "cg1" }]
                }]
            }],
            "LoggingConfig": { "Type": "File" }
        }
    }"#;

    fn error_of(text: &str) -> String {
        format!("{:#}", parse(text).unwrap_err())
    }

    #[test]
    fn the_emulators_sample_parses() {
        let config = parse(SAMPLE).unwrap();
        assert_eq!(
            config.hubs,
            vec![EmulatorHub {
                name: "eh1".into(),
                partition_count: 2,
                consumer_groups: vec!["cg1".into()],
                path: "UserConfig.NamespaceConfig[0].Entities[0]".into(),
            }]
        );
    }

    #[test]
    fn numbers_missing_or_empty_groups_default_and_unknown_fields_are_accepted() {
        // As Aspire writes it: a numeric count, an empty ConsumerGroups; plus fields we ignore.
        let config = parse(
            r#"{"UserConfig": {"NamespaceConfig": [{"Type": "EventHub", "Name": "emulatorNs1",
                "Entities": [
                    {"Name": "a", "PartitionCount": 4, "ConsumerGroups": []},
                    {"name": "b", "partitionCount": 1},
                    {"Name": "c", "PartitionCount": 3, "ConsumerGroups": [{"Name": "$default"}, {"Name": "x"}],
                     "MessageRetentionInHours": 1}
                ]}], "LoggingConfig": {"Type": "Console"}, "Extra": true}}"#,
        )
        .unwrap();
        let summary: Vec<_> = config
            .hubs
            .iter()
            .map(|h| {
                (
                    h.name.as_str(),
                    h.partition_count,
                    h.consumer_groups.clone(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("a", 4, vec![]),
                ("b", 1, vec![]),
                ("c", 3, vec!["x".to_owned()])
            ]
        );
    }

    #[test]
    fn bad_shapes_are_named_by_their_json_path() {
        let cases = [
            ("[1]", "the top level: expected an object, found an array"),
            ("{}", "UserConfig: missing"),
            (
                "{\"UserConfig\": 3}",
                "UserConfig: expected an object, found 3",
            ),
            (
                "{\"UserConfig\": {}}",
                "UserConfig.NamespaceConfig: missing",
            ),
            (
                "{\"UserConfig\": {\"NamespaceConfig\": {}}}",
                "UserConfig.NamespaceConfig: expected an array, found an object",
            ),
            (
                "{\"UserConfig\": {\"NamespaceConfig\": [{\"Type\": \"ServiceBus\", \"Entities\": []}]}}",
                "UserConfig.NamespaceConfig[0].Type: expected \"EventHub\", found \"ServiceBus\"",
            ),
            (
                "{\"UserConfig\": {\"NamespaceConfig\": [{\"Name\": \"n\"}]}}",
                "UserConfig.NamespaceConfig[0].Entities: missing",
            ),
        ];
        for (text, wanted) in cases {
            let error = error_of(text);
            assert!(error.contains(wanted), "{text}: {error}");
        }
        assert!(error_of("{\"UserConfig\": ").contains("not valid JSON"));
    }

    #[test]
    fn bad_entities_are_named_by_their_json_path() {
        let entity = |body: &str| {
            format!(
                "{{\"UserConfig\": {{\"NamespaceConfig\": [{{\"Entities\": [{{\"Name\": \"ok\", \"PartitionCount\": 1}}, {body}]}}]}}}}"
            )
        };
        let at = "UserConfig.NamespaceConfig[0].Entities[1]";
        let cases = [
            ("7", format!("{at}: expected an object, found 7")),
            ("{\"PartitionCount\": 1}", format!("{at}.Name: missing")),
            ("{\"Name\": \"h\"}", format!("{at}.PartitionCount: missing")),
            (
                "{\"Name\": \"h\", \"PartitionCount\": \"two\"}",
                format!("{at}.PartitionCount: expected a whole number from 1 to 1024"),
            ),
            (
                "{\"Name\": \"h\", \"PartitionCount\": 0}",
                format!("{at}.PartitionCount: expected a whole number"),
            ),
            (
                "{\"Name\": \"h\", \"PartitionCount\": 2.5}",
                format!("{at}.PartitionCount: expected a whole number"),
            ),
            (
                "{\"Name\": \"bad name\", \"PartitionCount\": 1}",
                format!("{at}.Name: invalid event hub name"),
            ),
            (
                "{\"Name\": \"OK\", \"PartitionCount\": 1}",
                format!(
                    "{at}.Name: the event hub \"OK\" is already defined at UserConfig.NamespaceConfig[0].Entities[0]"
                ),
            ),
            (
                "{\"Name\": \"h\", \"PartitionCount\": 1, \"ConsumerGroups\": [\"cg\"]}",
                format!("{at}.ConsumerGroups[0]: expected an object with a Name, found \"cg\""),
            ),
            (
                "{\"Name\": \"h\", \"PartitionCount\": 1, \"ConsumerGroups\": [{\"Name\": \"a/b\"}]}",
                format!("{at}.ConsumerGroups[0].Name: invalid consumer group name"),
            ),
            (
                "{\"Name\": \"h\", \"PartitionCount\": 1, \"ConsumerGroups\": [{\"Name\": \"g\"}, {\"Name\": \"G\"}]}",
                format!("{at}.ConsumerGroups[1].Name: the consumer group \"G\" is listed twice"),
            ),
        ];
        for (body, wanted) in cases {
            let error = error_of(&entity(body));
            assert!(error.contains(&wanted), "{body}: {error}");
        }
    }

    #[tokio::test]
    async fn applying_twice_is_idempotent_and_a_changed_count_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let broker = Broker::open(tributary_broker::BrokerConfig::new(dir.path()))
            .await
            .unwrap();
        let config = parse(SAMPLE).unwrap();
        let first = apply(&broker, &config, 20).await.unwrap();
        assert_eq!(first.hubs_created, vec!["eh1".to_owned()]);
        assert_eq!(first.groups_created, vec!["eh1/cg1".to_owned()]);
        let again = apply(&broker, &config, 20).await.unwrap();
        assert_eq!(again.hubs_kept, vec!["eh1".to_owned()]);
        assert!(again.hubs_created.is_empty() && again.groups_created.is_empty());
        let groups: Vec<_> = broker.list_consumer_groups("eh1").unwrap();
        let names: Vec<_> = groups.iter().map(|g| g.name.as_str()).collect();
        assert_eq!(names, ["$Default", "cg1"]);

        // A new hub first, then eh1 with another count: the whole file is refused, the new hub
        // is not created.
        let changed = SAMPLE
            .replace("\"PartitionCount\": \"2\"", "\"PartitionCount\": 4")
            .replace(
                "\"Entities\": [{",
                "\"Entities\": [{\"Name\": \"fresh\", \"PartitionCount\": 1}, {",
            );
        let error = format!(
            "{:#}",
            apply(&broker, &parse(&changed).unwrap(), 20)
                .await
                .unwrap_err()
        );
        assert!(
            error.contains("UserConfig.NamespaceConfig[0].Entities[1].PartitionCount")
                && error.contains("\"eh1\" already has 2 partitions")
                && error.contains("the file gives 4"),
            "{error}"
        );
        let hubs: Vec<_> = broker.list_hubs().into_iter().map(|h| h.name).collect();
        assert_eq!(hubs, ["eh1"]);

        let too_many = apply(&broker, &config, 1).await.unwrap_err();
        assert!(
            format!("{too_many:#}").contains("over the limit of 1"),
            "{too_many:#}"
        );
        broker.shutdown().await.unwrap();
    }
}
