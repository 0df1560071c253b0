//! How to reach a Kafka cluster: [`KafkaOptions`] — bootstrap servers, TLS and SASL — and the
//! librdkafka configuration they become.
//!
//! One type covers the three kinds of cluster a user points Tributary at:
//! - a plain cluster (Apache Kafka, Redpanda, Tansu) on `PLAINTEXT`: [`KafkaOptions::new`];
//! - a cluster with SASL (PLAIN, SCRAM-SHA-256/512) and/or TLS: set [`KafkaOptions::sasl`] and
//!   [`KafkaOptions::tls`]; the security protocol follows from which of the two are set;
//! - Azure Event Hubs' Kafka endpoint (and Tributary's own Kafka door), from an Event Hubs
//!   connection string: [`KafkaOptions::from_event_hubs_connection_string`] — SASL PLAIN with the
//!   user name `$ConnectionString` and the whole connection string as the password, over TLS on
//!   port 9093 when the connection string's endpoint uses TLS (`sb://` on Azure), else over
//!   plain TCP on port 9092 (`UseDevelopmentEmulator=true`, a local Tributary).
//!
//! Passwords never appear in `Debug` output or error messages.

use std::path::PathBuf;

use rdkafka::ClientConfig;
use tributary_eventhubs::ConnectionString;

/// The port of Event Hubs' Kafka endpoint (always TLS).
pub const EVENT_HUBS_KAFKA_TLS_PORT: u16 = 9093;

/// The port of Tributary's Kafka door without TLS (`serve --kafka-port`'s default).
pub const KAFKA_PLAINTEXT_PORT: u16 = 9092;

/// The SASL user name with which Event Hubs' Kafka endpoint takes a connection string as the
/// password.
pub const CONNECTION_STRING_USER: &str = "$ConnectionString";

/// Where a Kafka cluster is and how to authenticate to it.
#[derive(Clone, Default)]
pub struct KafkaOptions {
    /// `host:port[,host:port…]`, as librdkafka's `bootstrap.servers`.
    pub bootstrap_servers: String,
    /// SASL credentials, if the cluster wants them.
    pub sasl: Option<Sasl>,
    /// TLS settings; `None` connects over plain TCP.
    pub tls: Option<Tls>,
    /// The client id the cluster logs and quotas see (librdkafka's default when `None`).
    pub client_id: Option<String>,
    /// Further librdkafka settings (`name`, `value`), applied last, for what this type does not
    /// name (timeouts, fetch sizes, debug contexts).
    pub extra: Vec<(String, String)>,
}

impl std::fmt::Debug for KafkaOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaOptions")
            .field("bootstrap_servers", &self.bootstrap_servers)
            .field("sasl", &self.sasl)
            .field("tls", &self.tls)
            .field("client_id", &self.client_id)
            .field(
                "extra",
                &self.extra.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A SASL mechanism librdkafka speaks without extra C libraries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    /// `PLAIN` (Event Hubs, Confluent Cloud API keys). Send it over TLS only, outside tests.
    Plain,
    /// `SCRAM-SHA-256`.
    ScramSha256,
    /// `SCRAM-SHA-512`.
    ScramSha512,
}

impl SaslMechanism {
    /// The mechanism's name in librdkafka's `sasl.mechanisms`.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// SASL credentials.
#[derive(Clone)]
pub struct Sasl {
    /// The mechanism.
    pub mechanism: SaslMechanism,
    /// The user name (`$ConnectionString` for Event Hubs).
    pub username: String,
    /// The password (for Event Hubs, the connection string).
    pub password: String,
}

impl std::fmt::Debug for Sasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sasl")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// TLS settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    /// A PEM file of the certificate authorities to trust, instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// Whether the broker's certificate is checked (chain and host name). Turn it off only for
    /// a test broker with a throwaway certificate.
    pub verify_certificate: bool,
}

impl Default for Tls {
    fn default() -> Self {
        Tls {
            ca_file: None,
            verify_certificate: true,
        }
    }
}

/// Why an Event Hubs connection string cannot name a Kafka endpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid connection string: {reason}")]
pub struct ConnectionStringError {
    /// What is wrong (never the key).
    pub reason: String,
}

impl KafkaOptions {
    /// A cluster reached over plain TCP without authentication.
    pub fn new(bootstrap_servers: impl Into<String>) -> KafkaOptions {
        KafkaOptions {
            bootstrap_servers: bootstrap_servers.into(),
            ..KafkaOptions::default()
        }
    }

    /// The Kafka endpoint of the namespace an Event Hubs connection string names (see the
    /// module docs). The connection string's `EntityPath`, if any, is not used here: the topic is
    /// chosen where the source is made.
    pub fn from_event_hubs_connection_string(
        connection_string: &str,
    ) -> Result<KafkaOptions, ConnectionStringError> {
        let parsed =
            ConnectionString::parse(connection_string).map_err(|e| ConnectionStringError {
                reason: e.to_string(),
            })?;
        let (port, tls) = if parsed.uses_tls() {
            (EVENT_HUBS_KAFKA_TLS_PORT, Some(Tls::default()))
        } else {
            (KAFKA_PLAINTEXT_PORT, None)
        };
        Ok(KafkaOptions {
            bootstrap_servers: format!("{}:{port}", parsed.host()),
            sasl: Some(Sasl {
                mechanism: SaslMechanism::Plain,
                username: CONNECTION_STRING_USER.to_owned(),
                password: connection_string.to_owned(),
            }),
            tls,
            ..KafkaOptions::default()
        })
    }

    /// librdkafka's `security.protocol` for these options.
    pub fn security_protocol(&self) -> &'static str {
        match (self.sasl.is_some(), self.tls.is_some()) {
            (false, false) => "PLAINTEXT",
            (false, true) => "SSL",
            (true, false) => "SASL_PLAINTEXT",
            (true, true) => "SASL_SSL",
        }
    }

    /// The first bootstrap server's host, for names (the namespace ownership is recorded under
    /// when none is given).
    pub fn first_host(&self) -> &str {
        let first = self.bootstrap_servers.split(',').next().unwrap_or_default();
        let first = first.trim();
        match first.rsplit_once(':') {
            Some((host, port)) if port.chars().all(|c| c.is_ascii_digit()) => host,
            _ => first,
        }
    }

    /// The librdkafka settings every client made from these options shares.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap_servers)
            .set("security.protocol", self.security_protocol());
        if let Some(client_id) = &self.client_id {
            config.set("client.id", client_id);
        }
        if let Some(sasl) = &self.sasl {
            config
                .set("sasl.mechanisms", sasl.mechanism.name())
                .set("sasl.username", &sasl.username)
                .set("sasl.password", &sasl.password);
        }
        if let Some(tls) = &self.tls {
            if let Some(ca_file) = &tls.ca_file {
                config.set("ssl.ca.location", ca_file.display().to_string());
            }
            if !tls.verify_certificate {
                config
                    .set("enable.ssl.certificate.verification", "false")
                    .set("ssl.endpoint.identification.algorithm", "none");
            }
        }
        for (name, value) in &self.extra {
            config.set(name, value);
        }
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AZURE: &str = "Endpoint=sb://myns.servicebus.windows.net/;SharedAccessKeyName=listen;SharedAccessKey=c2VjcmV0;EntityPath=orders";

    #[test]
    fn an_azure_connection_string_is_sasl_plain_over_tls_on_9093() {
        let options = KafkaOptions::from_event_hubs_connection_string(AZURE).unwrap();
        assert_eq!(
            options.bootstrap_servers,
            "myns.servicebus.windows.net:9093"
        );
        assert_eq!(options.security_protocol(), "SASL_SSL");
        let config = options.client_config();
        assert_eq!(config.get("sasl.mechanisms"), Some("PLAIN"));
        assert_eq!(config.get("sasl.username"), Some("$ConnectionString"));
        assert_eq!(config.get("sasl.password"), Some(AZURE));
        assert_eq!(options.first_host(), "myns.servicebus.windows.net");
        // The key never shows in Debug output.
        assert!(!format!("{options:?}").contains("c2VjcmV0"));
    }

    #[test]
    fn an_emulator_connection_string_is_sasl_plain_without_tls_on_9092() {
        let cs = "Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true";
        let options = KafkaOptions::from_event_hubs_connection_string(cs).unwrap();
        assert_eq!(options.bootstrap_servers, "localhost:9092");
        assert_eq!(options.security_protocol(), "SASL_PLAINTEXT");
    }

    #[test]
    fn a_garbled_connection_string_is_refused() {
        let error = KafkaOptions::from_event_hubs_connection_string("no=endpoint").unwrap_err();
        assert!(error.reason.contains("Endpoint"), "{error}");
    }

    #[test]
    fn tls_settings_reach_librdkafka() {
        let options = KafkaOptions {
            tls: Some(Tls {
                ca_file: Some("/etc/ca.pem".into()),
                verify_certificate: false,
            }),
            extra: vec![("fetch.wait.max.ms".into(), "50".into())],
            ..KafkaOptions::new("a:1,b:2")
        };
        let config = options.client_config();
        assert_eq!(config.get("security.protocol"), Some("SSL"));
        assert_eq!(config.get("ssl.ca.location"), Some("/etc/ca.pem"));
        assert_eq!(
            config.get("enable.ssl.certificate.verification"),
            Some("false")
        );
        assert_eq!(config.get("fetch.wait.max.ms"), Some("50"));
        assert_eq!(options.first_host(), "a");
    }
}
