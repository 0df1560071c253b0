//! `kind = "kafka"` endpoints in a task file: a Kafka topic as the source or a target.
//!
//! ```toml
//! [source]
//! kind = "kafka"
//! bootstrap_servers = "kafka-1:9092,kafka-2:9092"
//! topic = "orders"
//! # SASL (PLAIN by default, or SCRAM-SHA-256 / SCRAM-SHA-512), the password from the
//! # environment; or, for Event Hubs' Kafka endpoint, connection_string(_env): SASL PLAIN as
//! # `$ConnectionString`, over TLS when the connection string's endpoint uses TLS.
//! sasl_mechanism = "SCRAM-SHA-512"
//! sasl_username = "replicator"
//! sasl_password_env = "KAFKA_PASSWORD"
//! tls = true                # with ca_file = "ca.pem" to trust a private CA
//! ```
//!
//! The source keys (`consumer_group`, `initial_position`, `checkpoint_store`, …) and the target
//! keys (`name`, `keep_partition`, `when`) are those of a hub. The topic plays the event hub:
//! ownership and checkpoints are recorded under the first bootstrap server and the topic.
//! Opening one needs the `kafka` feature; the file is checked the same without it.

use std::ops::Range;
use std::path::PathBuf;

use toml::Spanned;

use super::{Checker, EndpointSpec, TaskError};
use crate::task::{Connection, Endpoint};

/// The keys every Kafka endpoint takes (besides its role's).
pub(super) const KAFKA_KEYS: [&str; 10] = [
    "kind",
    "bootstrap_servers",
    "topic",
    "connection_string",
    "connection_string_env",
    "sasl_mechanism",
    "sasl_username",
    "sasl_password_env",
    "tls",
    "ca_file",
];

/// The longest Kafka topic name.
const TOPIC_CHARS_MAX: usize = 249;

/// How a Kafka cluster is reached, as the task file says.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaConnection {
    /// `host:port[,host:port…]`.
    pub bootstrap_servers: String,
    /// An Event Hubs connection string: SASL PLAIN as `$ConnectionString` (holds a secret).
    pub connection_string: Option<String>,
    /// SASL credentials: mechanism (`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`), user name,
    /// password (a secret).
    pub sasl: Option<(String, String, String)>,
    /// Whether to connect over TLS (implied by a connection string whose endpoint uses TLS).
    pub tls: bool,
    /// Certificates to trust for TLS.
    pub ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for KafkaConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConnection")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("connection_string", &self.connection_string.is_some())
            .field("sasl", &self.sasl.as_ref().map(|(m, u, _)| (m, u)))
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

impl KafkaConnection {
    /// The first bootstrap server: the namespace ownership and checkpoints are recorded under.
    pub fn namespace(&self) -> &str {
        self.bootstrap_servers
            .split(',')
            .next()
            .unwrap_or_default()
            .trim()
    }
}

/// Every key `spec` sets, by name.
fn set_keys(spec: &EndpointSpec) -> Vec<&'static str> {
    let set = [
        ("event_hub", spec.event_hub.is_some()),
        ("data_dir", spec.data_dir.is_some()),
        ("alias_file", spec.alias_file.is_some()),
        ("alias_srv", spec.alias_srv.is_some()),
        ("dns_server", spec.dns_server.is_some()),
        ("failover_failures", spec.failover_failures.is_some()),
        ("failover_after", spec.failover_after.is_some()),
        ("url", spec.url.is_some()),
        ("url_env", spec.url_env.is_some()),
        ("table", spec.table.is_some()),
        ("shape", spec.shape.is_some()),
        ("keyless", spec.keyless.is_some()),
        ("columns", spec.columns.is_some()),
        ("backoff_max", spec.backoff_max.is_some()),
        ("name", spec.name.is_some()),
        ("consumer_group", spec.consumer_group.is_some()),
        ("initial_position", spec.initial_position.is_some()),
        ("checkpoint_store", spec.checkpoint_store.is_some()),
        ("batch_events_max", spec.batch_events_max.is_some()),
        ("prefetch", spec.prefetch.is_some()),
        ("origin_id", spec.origin_id.is_some()),
        ("keep_partition", spec.keep_partition.is_some()),
        ("when", spec.when.is_some()),
    ];
    set.into_iter()
        .filter_map(|(key, is_set)| is_set.then_some(key))
        .collect()
}

impl Checker<'_> {
    /// A `kind = "kafka"` endpoint in the role whose own keys are `allowed`.
    pub(super) fn kafka_endpoint(
        &self,
        table: &Spanned<EndpointSpec>,
        key: &str,
        allowed: &[&str],
    ) -> Result<Endpoint, TaskError> {
        let spec = table.get_ref();
        let span = table.span();
        let at = |name: &str, message: String| {
            self.error(span.clone(), &format!("{key}.{name}"), message)
        };
        let takes = [&KAFKA_KEYS[..], allowed].concat();
        if let Some(other) = set_keys(spec).into_iter().find(|k| !takes.contains(k)) {
            return Err(at(
                other,
                format!(
                    "{other:?} does not belong in a Kafka endpoint; it takes {}",
                    takes.join(", ")
                ),
            ));
        }
        let bootstrap_servers = spec
            .bootstrap_servers
            .clone()
            .filter(|b| !b.trim().is_empty())
            .ok_or_else(|| {
                at(
                    "bootstrap_servers",
                    "missing: name the cluster's bootstrap servers, \"host:port[,host:port…]\""
                        .into(),
                )
            })?;
        let topic = self.topic(spec, &at)?;
        let connection = self.kafka_connection(spec, span.clone(), key, bootstrap_servers)?;
        Ok(Endpoint {
            connection: Connection::Kafka(Box::new(connection)),
            event_hub: topic,
            key: key.to_owned(),
            line: self.line_of(span),
        })
    }

    /// The topic, checked as Kafka checks a topic name.
    fn topic(
        &self,
        spec: &EndpointSpec,
        at: &impl Fn(&str, String) -> TaskError,
    ) -> Result<String, TaskError> {
        let topic = spec
            .topic
            .clone()
            .ok_or_else(|| at("topic", "missing: name the Kafka topic".into()))?;
        let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if topic.is_empty()
            || topic.len() > TOPIC_CHARS_MAX
            || topic == "."
            || topic == ".."
            || !topic.chars().all(legal)
        {
            return Err(at(
                "topic",
                format!(
                    "{topic:?} is not a Kafka topic name (1 to {TOPIC_CHARS_MAX} letters, digits, '.', '_' and '-')"
                ),
            ));
        }
        Ok(topic)
    }

    /// Credentials and TLS.
    fn kafka_connection(
        &self,
        spec: &EndpointSpec,
        span: Range<usize>,
        key: &str,
        bootstrap_servers: String,
    ) -> Result<KafkaConnection, TaskError> {
        let at = |name: &str, message: String| {
            self.error(span.clone(), &format!("{key}.{name}"), message)
        };
        let env = |name: &str, variable: &str| {
            std::env::var(variable).map_err(|_| {
                at(
                    name,
                    format!("the environment variable {variable:?} is not set (or not UTF-8)"),
                )
            })
        };
        let connection_string = match (&spec.connection_string, &spec.connection_string_env) {
            (Some(_), Some(_)) => {
                return Err(at(
                    "connection_string_env",
                    "give connection_string or connection_string_env, not both".into(),
                ));
            }
            (Some(text), None) => Some(text.clone()),
            (None, Some(variable)) => Some(env("connection_string_env", variable)?),
            (None, None) => None,
        };
        let mut tls = spec.tls.unwrap_or(false) || spec.ca_file.is_some();
        if let Some(text) = &connection_string {
            let parsed = tributary_client::ConnectionString::parse(text)
                .map_err(|e| at("connection_string", e.to_string()))?;
            tls |= parsed.uses_tls();
        }
        let sasl = self.sasl(spec, &at, &env)?;
        if sasl.is_some() && connection_string.is_some() {
            return Err(at(
                "sasl_username",
                "a connection string is the SASL login already; give it or sasl_username".into(),
            ));
        }
        Ok(KafkaConnection {
            bootstrap_servers,
            connection_string,
            sasl,
            tls,
            ca_file: spec.ca_file.as_ref().map(|f| self.base_dir().join(f)),
        })
    }

    /// `sasl_mechanism`, `sasl_username` and `sasl_password_env`, all or none (the mechanism
    /// defaults to PLAIN).
    fn sasl(
        &self,
        spec: &EndpointSpec,
        at: &impl Fn(&str, String) -> TaskError,
        env: &impl Fn(&str, &str) -> Result<String, TaskError>,
    ) -> Result<Option<(String, String, String)>, TaskError> {
        let (username, password_env) = match (&spec.sasl_username, &spec.sasl_password_env) {
            (Some(user), Some(variable)) => (user.clone(), variable),
            (None, None) if spec.sasl_mechanism.is_none() => return Ok(None),
            (Some(_), None) => {
                return Err(at(
                    "sasl_password_env",
                    "missing: name the environment variable holding the password".into(),
                ));
            }
            _ => {
                return Err(at(
                    "sasl_username",
                    "missing: SASL needs sasl_username and sasl_password_env".into(),
                ));
            }
        };
        let mechanism = spec
            .sasl_mechanism
            .clone()
            .unwrap_or_else(|| "PLAIN".to_owned())
            .to_ascii_uppercase();
        if !["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"].contains(&mechanism.as_str()) {
            return Err(at(
                "sasl_mechanism",
                format!("{mechanism:?} is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
            ));
        }
        let password = env("sasl_password_env", password_env)?;
        Ok(Some((mechanism, username, password)))
    }
}
