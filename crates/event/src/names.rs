//! Which names are legal for event hubs, consumer groups and partitions.
//!
//! The rules are Event Hubs': an event hub name has 1 to 256 characters, a consumer group name 1
//! to 50; both use only ASCII letters, digits, `.`, `-` and `_`, and start and end with a letter
//! or digit. `$Default` is the one consumer group name outside those rules. Names compare
//! case-insensitively, as they do in Event Hubs (the SDKs disagree on `$Default` vs `$default`).

use thiserror::Error;

/// The consumer group every event hub has, which cannot be deleted.
pub const DEFAULT_CONSUMER_GROUP: &str = "$Default";

/// The longest event hub name Event Hubs accepts.
pub const HUB_NAME_CHARS_MAX: usize = 256;

/// The longest consumer group name Event Hubs accepts.
pub const CONSUMER_GROUP_NAME_CHARS_MAX: usize = 50;

/// A name that breaks the naming rules, with the reason in words a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid {kind} name {name:?}: {reason}")]
pub struct InvalidName {
    /// What was being named ("event hub", "consumer group").
    pub kind: &'static str,
    /// The name as given.
    pub name: String,
    /// Why it is not allowed.
    pub reason: &'static str,
}

/// Checks an event hub name.
pub fn validate_hub_name(name: &str) -> Result<(), InvalidName> {
    validate_entity_name("event hub", name, HUB_NAME_CHARS_MAX)
}

/// Checks a consumer group name. `$Default` (in any case) is accepted.
pub fn validate_consumer_group_name(name: &str) -> Result<(), InvalidName> {
    if is_default_consumer_group(name) {
        return Ok(());
    }
    validate_entity_name("consumer group", name, CONSUMER_GROUP_NAME_CHARS_MAX)
}

/// Whether `name` is the default consumer group (compared case-insensitively).
pub fn is_default_consumer_group(name: &str) -> bool {
    name.eq_ignore_ascii_case(DEFAULT_CONSUMER_GROUP)
}

/// The key under which a name is stored and compared: names are case-insensitive.
pub fn name_key(name: &str) -> String {
    name.to_ascii_lowercase()
}

fn validate_entity_name(
    kind: &'static str,
    name: &str,
    chars_max: usize,
) -> Result<(), InvalidName> {
    let invalid = |reason| InvalidName {
        kind,
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("the name is empty"));
    }
    if name.len() > chars_max {
        return Err(invalid(if chars_max == HUB_NAME_CHARS_MAX {
            "the name is longer than 256 characters"
        } else {
            "the name is longer than 50 characters"
        }));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    {
        return Err(invalid(
            "only letters, digits, '.', '-' and '_' are allowed",
        ));
    }
    let first = name.as_bytes()[0];
    let last = name.as_bytes()[name.len() - 1];
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return Err(invalid(
            "the name must start and end with a letter or digit",
        ));
    }
    Ok(())
}

/// A partition id that is not a partition of the hub.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid partition id {id:?}: the hub has partitions 0 to {last}", last = .partition_count - 1)]
pub struct InvalidPartitionId {
    /// The id as given.
    pub id: String,
    /// How many partitions the hub has.
    pub partition_count: u32,
}

/// Parses a partition id ("0", "1", …) against a hub with `partition_count` partitions.
///
/// Partition ids are decimal strings without sign or leading zeros, as Event Hubs reports them.
pub fn parse_partition_id(id: &str, partition_count: u32) -> Result<u32, InvalidPartitionId> {
    let invalid = || InvalidPartitionId {
        id: id.to_owned(),
        partition_count,
    };
    let canonical = !id.is_empty()
        && id.bytes().all(|b| b.is_ascii_digit())
        && (id == "0" || !id.starts_with('0'));
    if !canonical {
        return Err(invalid());
    }
    match id.parse::<u32>() {
        Ok(n) if n < partition_count => Ok(n),
        _ => Err(invalid()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_names_follow_event_hubs_rules() {
        for good in ["a", "orders", "orders.v2", "my-hub_1", &"x".repeat(256)] {
            assert_eq!(validate_hub_name(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "-orders",
            "orders-",
            "or ders",
            "örders",
            "a/b",
            &"x".repeat(257),
        ] {
            assert!(validate_hub_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn consumer_group_names_allow_default_in_any_case() {
        assert_eq!(validate_consumer_group_name("$Default"), Ok(()));
        assert_eq!(validate_consumer_group_name("$default"), Ok(()));
        assert!(validate_consumer_group_name("$other").is_err());
        assert!(validate_consumer_group_name(&"g".repeat(51)).is_err());
        assert_eq!(validate_consumer_group_name(&"g".repeat(50)), Ok(()));
    }

    #[test]
    fn partition_ids_are_canonical_and_in_range() {
        assert_eq!(parse_partition_id("0", 4), Ok(0));
        assert_eq!(parse_partition_id("3", 4), Ok(3));
        for bad in ["4", "-1", "01", "", " 1", "x", "99999999999"] {
            assert!(parse_partition_id(bad, 4).is_err(), "{bad}");
        }
        let err = parse_partition_id("7", 4).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid partition id \"7\": the hub has partitions 0 to 3"
        );
    }
}
