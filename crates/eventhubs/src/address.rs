//! Link addresses of the Event Hubs dialect: parsed into the node they name (the server) and
//! written for a node (the client).
//!
//! Clients name nodes as `<hub>`, `<hub>/Partitions/<id>`,
//! `<hub>/ConsumerGroups/<group>/Partitions/<id>`, `$cbs`, `$management` or
//! `<hub>/$management`, optionally prefixed by `amqp://host/`, `amqps://host/` or `sb://host/`
//! (Python sends `amqps://host/...`). The keywords compare case-insensitively; names keep their
//! case (the broker compares them case-insensitively). [`Node`]'s `Display` writes the form the
//! SDKs use (`<hub>/ConsumerGroups/<group>/Partitions/<id>`), which parses back to the same node.

use std::fmt;

/// The claims-based-security node's address.
pub const CBS: &str = "$cbs";
/// The management node's address.
pub const MANAGEMENT: &str = "$management";

/// An address that names no Event Hubs entity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the address {address:?} names no Event Hubs entity")]
pub struct AddressError {
    /// The address, as given.
    pub address: String,
}

/// The node a link address names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// The claims-based-security node.
    Cbs,
    /// The management node (`$management` or `<hub>/$management`).
    Management,
    /// An event hub, for sending (round-robin or by partition key).
    Hub {
        /// Its name.
        hub: String,
    },
    /// One partition of an event hub, for sending.
    HubPartition {
        /// The hub.
        hub: String,
        /// The partition id, as given.
        partition: String,
    },
    /// One partition in one consumer group, for receiving.
    ConsumerPartition {
        /// The hub.
        hub: String,
        /// The consumer group, as given.
        group: String,
        /// The partition id, as given.
        partition: String,
    },
}

impl Node {
    /// The entity path a token's audience must cover, lower-cased, without host.
    pub fn entity_path(&self) -> String {
        let path = match self {
            Node::Cbs => CBS.to_owned(),
            Node::Management => MANAGEMENT.to_owned(),
            Node::Hub { hub } => hub.clone(),
            Node::HubPartition { hub, partition } => format!("{hub}/partitions/{partition}"),
            Node::ConsumerPartition {
                hub,
                group,
                partition,
            } => format!("{hub}/consumergroups/{group}/partitions/{partition}"),
        };
        path.to_ascii_lowercase()
    }
}

/// The address the SDKs write for `node`.
impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Node::Cbs => f.write_str(CBS),
            Node::Management => f.write_str(MANAGEMENT),
            Node::Hub { hub } => f.write_str(hub),
            Node::HubPartition { hub, partition } => write!(f, "{hub}/Partitions/{partition}"),
            Node::ConsumerPartition {
                hub,
                group,
                partition,
            } => write!(f, "{hub}/ConsumerGroups/{group}/Partitions/{partition}"),
        }
    }
}

/// The sender link address for a whole hub (the hub routes) or one partition.
pub fn sender_address(hub: &str, partition: Option<&str>) -> String {
    match partition {
        Some(partition) => format!("{hub}/Partitions/{partition}"),
        None => hub.to_owned(),
    }
}

/// The receiver link address of a partition in a consumer group.
pub fn receiver_address(hub: &str, consumer_group: &str, partition: &str) -> String {
    format!("{hub}/ConsumerGroups/{consumer_group}/Partitions/{partition}")
}

/// Strips an optional `scheme://host/` prefix and surrounding slashes.
pub fn strip_host(address: &str) -> &str {
    let rest = match address.split_once("://") {
        Some((_, after_scheme)) => after_scheme.split_once('/').map_or("", |(_, path)| path),
        None => address,
    };
    rest.trim_matches('/')
}

/// Parses a link address. The error says what is wrong in words for the client.
pub fn parse(address: &str) -> Result<Node, AddressError> {
    let path = strip_host(address);
    let segments: Vec<&str> = path.split('/').collect();
    let keyword = |s: &str, k: &str| s.eq_ignore_ascii_case(k);
    let bad = || AddressError {
        address: address.to_owned(),
    };
    if segments.iter().any(|s| s.is_empty()) {
        return Err(bad());
    }
    match segments.as_slice() {
        [node] if keyword(node, CBS) => Ok(Node::Cbs),
        [node] if keyword(node, MANAGEMENT) => Ok(Node::Management),
        [_, node] if keyword(node, MANAGEMENT) => Ok(Node::Management),
        [hub] => Ok(Node::Hub {
            hub: (*hub).to_owned(),
        }),
        [hub, p, partition] if keyword(p, "Partitions") => Ok(Node::HubPartition {
            hub: (*hub).to_owned(),
            partition: (*partition).to_owned(),
        }),
        [hub, g, group, p, partition]
            if keyword(g, "ConsumerGroups") && keyword(p, "Partitions") =>
        {
            Ok(Node::ConsumerPartition {
                hub: (*hub).to_owned(),
                group: (*group).to_owned(),
                partition: (*partition).to_owned(),
            })
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sdk_addresses_parse() {
        assert_eq!(parse("$cbs"), Ok(Node::Cbs));
        assert_eq!(parse("$management"), Ok(Node::Management));
        assert_eq!(parse("hub/$management"), Ok(Node::Management));
        assert_eq!(
            parse("amqps://localhost:5672/orders"),
            Ok(Node::Hub {
                hub: "orders".into()
            })
        );
        assert_eq!(
            parse("amqps://localhost/orders/Partitions/3"),
            Ok(Node::HubPartition {
                hub: "orders".into(),
                partition: "3".into()
            })
        );
        assert_eq!(
            parse("orders/consumergroups/$Default/partitions/0"),
            Ok(Node::ConsumerPartition {
                hub: "orders".into(),
                group: "$Default".into(),
                partition: "0".into()
            })
        );
        assert_eq!(
            parse("amqps://h/Orders/ConsumerGroups/G/Partitions/1")
                .unwrap()
                .entity_path(),
            "orders/consumergroups/g/partitions/1"
        );
    }

    #[test]
    fn written_addresses_parse_back() {
        let nodes = [
            Node::Cbs,
            Node::Management,
            Node::Hub { hub: "h".into() },
            Node::HubPartition {
                hub: "h".into(),
                partition: "2".into(),
            },
            Node::ConsumerPartition {
                hub: "h".into(),
                group: "$Default".into(),
                partition: "7".into(),
            },
        ];
        for node in nodes {
            assert_eq!(parse(&node.to_string()), Ok(node));
        }
        assert_eq!(sender_address("h", Some("1")), "h/Partitions/1");
        assert_eq!(sender_address("h", None), "h");
        assert_eq!(
            receiver_address("h", "g", "0"),
            "h/ConsumerGroups/g/Partitions/0"
        );
    }

    #[test]
    fn other_addresses_are_refused() {
        for bad in [
            "",
            "/",
            "a//b",
            "a/b",
            "a/Partitions",
            "a/x/1",
            "a/ConsumerGroups/g/x/1",
            "a/b/c/d/e/f",
            "amqps://host",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
