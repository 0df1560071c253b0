//! Link addresses of the Event Hubs dialect, parsed into the node they name.
//!
//! Clients name nodes as `<hub>`, `<hub>/Partitions/<id>`,
//! `<hub>/ConsumerGroups/<group>/Partitions/<id>`, `$cbs`, `$management` or
//! `<hub>/$management`, optionally prefixed by `amqp://host/`, `amqps://host/` or `sb://host/`
//! (Python sends `amqps://host/...`). The keywords compare case-insensitively; names keep their
//! case (the broker compares them case-insensitively).

/// The node a link address names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
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
    pub(crate) fn entity_path(&self) -> String {
        let path = match self {
            Node::Cbs => "$cbs".to_owned(),
            Node::Management => "$management".to_owned(),
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

/// Strips an optional `scheme://host/` prefix and surrounding slashes.
pub(crate) fn strip_host(address: &str) -> &str {
    let rest = match address.split_once("://") {
        Some((_, after_scheme)) => after_scheme.split_once('/').map_or("", |(_, path)| path),
        None => address,
    };
    rest.trim_matches('/')
}

/// Parses a link address. The error says what is wrong in words for the client.
pub(crate) fn parse(address: &str) -> Result<Node, String> {
    let path = strip_host(address);
    let segments: Vec<&str> = path.split('/').collect();
    let keyword = |s: &str, k: &str| s.eq_ignore_ascii_case(k);
    let bad = || format!("the address {address:?} names no Event Hubs entity");
    if segments.iter().any(|s| s.is_empty()) {
        return Err(bad());
    }
    match segments.as_slice() {
        [node] if keyword(node, "$cbs") => Ok(Node::Cbs),
        [node] if keyword(node, "$management") => Ok(Node::Management),
        [_, node] if keyword(node, "$management") => Ok(Node::Management),
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
