//! DNS SRV aliases: the records `_azure_eventhub._amqp.<alias>` through `hickory-resolver`,
//! ordered as RFC 2782 says (lowest priority first; within a priority, a weighted random order
//! in which a record of weight `w` comes first with probability `w / total`).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RData;
use hickory_resolver::{Resolver, TokioResolver};
use rand::Rng;

use super::AliasEndpoint;
use crate::error::ClientError;

/// The prefix of the SRV records an alias is published under.
pub const SRV_PREFIX: &str = "_azure_eventhub._amqp.";

/// The WebSockets port: its records are for AMQP over WebSockets, which this client does not
/// speak.
const WEBSOCKETS_PORT: u16 = 443;

/// How long one DNS query may take, and how often it is tried.
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);
const QUERY_ATTEMPTS: usize = 2;

/// The SRV name queried for the alias `name`.
pub(super) fn query_name(name: &str) -> String {
    let name = name.trim_end_matches('.');
    if name.starts_with('_') {
        name.to_owned()
    } else {
        format!("{SRV_PREFIX}{name}")
    }
}

/// Refuses names that are not DNS names (before any query is made).
pub(super) fn check_name(name: &str) -> Result<(), ClientError> {
    let labels_ok = !name.is_empty()
        && name.len() <= 200
        && name.trim_end_matches('.').split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        });
    if labels_ok {
        Ok(())
    } else {
        Err(ClientError::InvalidArgument(format!(
            "{name:?} is not a DNS name for an SRV alias (e.g. eh.test.example.com)"
        )))
    }
}

/// One SRV record, as far as ordering goes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SrvRecord {
    priority: u16,
    weight: u16,
    port: u16,
    /// The target host, without the final dot.
    target: String,
}

/// The usable records of the alias `name`, in the order to try them, each with the addresses
/// the same name server gives for its target.
pub(super) async fn lookup(
    name: &str,
    name_server: Option<SocketAddr>,
) -> Result<Vec<AliasEndpoint>, ClientError> {
    check_name(name)?;
    let query = query_name(name);
    let failed = |description: String| ClientError::Connect {
        endpoint: query.clone(),
        description,
    };
    let resolver = resolver(name_server).map_err(|e| failed(e.to_string()))?;
    let answer = resolver
        .srv_lookup(format!("{query}."))
        .await
        .map_err(|e| failed(format!("DNS SRV lookup failed: {e}")))?;
    let records: Vec<SrvRecord> = answer
        .answers()
        .iter()
        .filter_map(|record| match &record.data {
            RData::SRV(srv) if srv.port != WEBSOCKETS_PORT && !srv.target.is_root() => {
                Some(SrvRecord {
                    priority: srv.priority,
                    weight: srv.weight,
                    port: srv.port,
                    target: srv.target.to_ascii().trim_end_matches('.').to_owned(),
                })
            }
            _ => None,
        })
        .collect();
    if records.is_empty() {
        return Err(failed(
            "no usable SRV records (only port 443 or \".\" targets, or none)".to_owned(),
        ));
    }
    let ordered = rfc2782_order(records, &mut rand::thread_rng());
    let mut candidates = Vec::with_capacity(ordered.len());
    for record in ordered {
        // A target the alias's DNS cannot resolve is left to the system's resolver.
        let addresses: Vec<IpAddr> = match resolver.lookup_ip(format!("{}.", record.target)).await {
            Ok(found) => found.iter().collect(),
            Err(error) => {
                tracing::debug!(target = %record.target, %error, "no address for an SRV target from the alias's DNS");
                Vec::new()
            }
        };
        candidates.push(AliasEndpoint {
            host: record.target,
            port: Some(record.port),
            addresses,
        });
    }
    Ok(candidates)
}

fn resolver(
    name_server: Option<SocketAddr>,
) -> Result<TokioResolver, hickory_resolver::net::NetError> {
    let mut builder = match name_server {
        Some(server) => {
            let mut udp = ConnectionConfig::udp();
            udp.port = server.port();
            let mut tcp = ConnectionConfig::tcp();
            tcp.port = server.port();
            let config = ResolverConfig::from_name_servers(vec![NameServerConfig::new(
                server.ip(),
                true,
                vec![udp, tcp],
            )]);
            Resolver::builder_with_config(config, TokioRuntimeProvider::default())
        }
        None => TokioResolver::builder_tokio()?,
    };
    let options = builder.options_mut();
    options.timeout = QUERY_TIMEOUT;
    options.attempts = QUERY_ATTEMPTS;
    builder.build()
}

/// RFC 2782's order: by priority, lowest first; within a priority, repeatedly pick a record at
/// random with probability proportional to its weight (weight-0 records first in the running
/// sum, so they are picked only when the draw is 0 or nothing else is left).
fn rfc2782_order(mut records: Vec<SrvRecord>, rng: &mut impl Rng) -> Vec<SrvRecord> {
    records.sort_by_key(|record| (record.priority, record.weight != 0));
    let mut ordered = Vec::with_capacity(records.len());
    while !records.is_empty() {
        let priority = records[0].priority;
        let same = records
            .iter()
            .take_while(|r| r.priority == priority)
            .count();
        let mut group: Vec<SrvRecord> = records.drain(..same).collect();
        while !group.is_empty() {
            let total: u32 = group.iter().map(|r| u32::from(r.weight)).sum();
            let draw = rng.gen_range(0..=total);
            let mut running = 0;
            let chosen = group
                .iter()
                .position(|r| {
                    running += u32::from(r.weight);
                    running >= draw
                })
                .unwrap_or(0);
            ordered.push(group.remove(chosen));
        }
    }
    ordered
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn record(priority: u16, weight: u16, target: &str) -> SrvRecord {
        SrvRecord {
            priority,
            weight,
            port: 5671,
            target: target.to_owned(),
        }
    }

    #[test]
    fn lower_priority_comes_first_whatever_the_weight() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..100 {
            let ordered = rfc2782_order(
                vec![record(2, 1000, "b"), record(1, 0, "a"), record(3, 5, "c")],
                &mut rng,
            );
            let targets: Vec<_> = ordered.iter().map(|r| r.target.as_str()).collect();
            assert_eq!(targets, ["a", "b", "c"]);
        }
    }

    #[test]
    fn weights_share_out_first_place() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut heavy_first = 0;
        let mut zero_first = 0;
        for _ in 0..2000 {
            let ordered = rfc2782_order(
                vec![
                    record(1, 30, "light"),
                    record(1, 0, "zero"),
                    record(1, 70, "heavy"),
                ],
                &mut rng,
            );
            assert_eq!(ordered.len(), 3);
            match ordered[0].target.as_str() {
                "heavy" => heavy_first += 1,
                "zero" => zero_first += 1,
                _ => {}
            }
        }
        // Expected: heavy 70/101 of the time (1386 of 2000), zero 1/101 (20).
        assert!((1250..1520).contains(&heavy_first), "{heavy_first}");
        assert!(zero_first < 60, "{zero_first}");
    }

    #[test]
    fn names_are_prefixed_once_and_checked() {
        assert_eq!(
            query_name("eh.example.com."),
            "_azure_eventhub._amqp.eh.example.com"
        );
        assert_eq!(
            query_name("_azure_eventhub._amqp.eh.example.com"),
            "_azure_eventhub._amqp.eh.example.com"
        );
        assert!(check_name("eh1.test.example.com").is_ok());
        for bad in ["", "a..b", "a b", "a/b", ".", "x;y"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
