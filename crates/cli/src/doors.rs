//! `serve`'s front doors, all through one shape: which doors a start opens ([`requested`]),
//! starting them ([`start`]), what each reports for the banner and `server.json`
//! ([`Door::addr`], [`Door::describe`], [`Doors::listeners`]) and stopping them
//! ([`Doors::stop`]).
//!
//! A door is a [`Protocol`] (its URL scheme, its port flag, what it serves) and the running
//! listener of the crate that serves it. Adding a door is one variant of each enum and one arm
//! of [`start_door`].
//!
//! # Order
//! Doors start in the order [`Protocol::ALL`] lists them: the AMQP doors first, since the HTTP
//! doors hand AMQP over WebSockets to the first AMQP door. They stop in the same order, each
//! finishing the requests it is answering, before the broker is shut down.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use tributary_amqp::{AccessPolicies, AmqpConfig, RunningAmqpServer};
use tributary_broker::Broker;
use tributary_http::{HttpConfig, RunningHttpServer};
use tributary_kafka::{KafkaConfig, RunningKafkaServer};
use tributary_tls::ServerTls;

use crate::args::{GlobalArgs, ServeArgs};
use crate::running;

/// A kind of front door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// AMQP over TLS: the Azure Event Hubs SDKs.
    Amqps,
    /// Plain AMQP: the SDKs' emulator mode.
    Amqp,
    /// HTTPS: the OCI Streaming API, the admin API, the dashboard, AMQP over WebSockets.
    Https,
    /// Plain HTTP: the same.
    Http,
    /// Kafka over TLS (SASL_SSL).
    KafkaTls,
    /// Kafka over TCP (SASL_PLAINTEXT).
    Kafka,
}

impl Protocol {
    /// Every door, in the order they start and stop.
    pub const ALL: [Protocol; 6] = [
        Protocol::Amqps,
        Protocol::Amqp,
        Protocol::Https,
        Protocol::Http,
        Protocol::KafkaTls,
        Protocol::Kafka,
    ];

    /// The name the banner and the start-up errors use.
    pub fn scheme(self) -> &'static str {
        match self {
            Protocol::Amqps => "amqps",
            Protocol::Amqp => "amqp",
            Protocol::Https => "https",
            Protocol::Http => "http",
            Protocol::KafkaTls => "kafka-tls",
            Protocol::Kafka => "kafka",
        }
    }

    /// The flag that sets its port.
    pub fn port_flag(self) -> &'static str {
        match self {
            Protocol::Amqps => "--amqps-port",
            Protocol::Amqp => "--amqp-port",
            Protocol::Https => "--https-port",
            Protocol::Http => "--http-port",
            Protocol::KafkaTls => "--kafka-tls-port",
            Protocol::Kafka => "--kafka-port",
        }
    }

    /// Whether it is one of the TLS doors.
    fn tls(self) -> bool {
        matches!(self, Protocol::Amqps | Protocol::Https | Protocol::KafkaTls)
    }

    /// Its port as `args` set it.
    fn port(self, args: &ServeArgs) -> u16 {
        match self {
            Protocol::Amqps => args.amqps_port,
            Protocol::Amqp => args.amqp_port,
            Protocol::Https => args.https_port,
            Protocol::Http => args.http_port(),
            Protocol::KafkaTls => args.kafka_tls_port,
            Protocol::Kafka => args.kafka_port,
        }
    }
}

/// The doors a start with `args` opens, each with its port: the TLS ones with a certificate,
/// the plain ones without (or with --plain).
pub fn requested(args: &ServeArgs) -> Vec<(Protocol, u16)> {
    let tls = args.tls_cert.is_some() && args.tls_key.is_some();
    let plain = !tls || args.plain;
    Protocol::ALL
        .into_iter()
        .filter(|protocol| if protocol.tls() { tls } else { plain })
        .map(|protocol| (protocol, protocol.port(args)))
        .collect()
}

/// A running listener of one of the front-door crates.
enum Listener {
    Amqp(RunningAmqpServer),
    Http(RunningHttpServer),
    Kafka(RunningKafkaServer),
}

/// One running front door.
pub struct Door {
    /// What it is.
    pub protocol: Protocol,
    listener: Listener,
}

impl Door {
    /// The address it is bound to.
    pub fn addr(&self) -> SocketAddr {
        match &self.listener {
            Listener::Amqp(amqp) => amqp.local_addr(),
            Listener::Http(http) => http.local_addr(),
            Listener::Kafka(kafka) => kafka.local_addr(),
        }
    }

    /// The banner's lines for it: where it listens and what it serves.
    pub fn describe(&self) -> Vec<String> {
        let (scheme, addr) = (self.protocol.scheme(), self.addr());
        match self.protocol {
            Protocol::Amqps | Protocol::Amqp => {
                vec![format!(
                    "{scheme}: {scheme}://{addr} (the Azure Event Hubs SDKs)"
                )]
            }
            Protocol::Https | Protocol::Http => vec![
                format!("dashboard: {scheme}://{addr}/ (log in with a Manage connection string)"),
                format!(
                    "{scheme}: {scheme}://{addr} (AMQP over WebSockets at /$servicebus/websocket, \
                     OCI Streaming at /20180418, admin API, /health, /metrics)"
                ),
            ],
            Protocol::KafkaTls | Protocol::Kafka => {
                let security = if self.protocol.tls() {
                    "SASL_SSL"
                } else {
                    "SASL_PLAINTEXT"
                };
                vec![format!(
                    "{scheme}: {addr} (Kafka clients: bootstrap.servers={}:{}, {security}, \
                     mechanism PLAIN, user $ConnectionString, a connection string as password)",
                    running::client_host(addr),
                    addr.port()
                )]
            }
        }
    }

    /// Stops it: it stops accepting and finishes the requests it is answering.
    async fn stop(self) -> Result<()> {
        match self.listener {
            Listener::Amqp(amqp) => amqp.shutdown().await,
            Listener::Http(http) => http.shutdown().await?,
            Listener::Kafka(kafka) => kafka.shutdown().await,
        }
        Ok(())
    }
}

/// The doors `serve` runs, in start order.
pub struct Doors(Vec<Door>);

impl Doors {
    /// Every door, in start order.
    pub fn iter(&self) -> impl Iterator<Item = &Door> {
        self.0.iter()
    }

    /// The first door of one of `protocols`, in start order.
    pub fn first(&self, protocols: &[Protocol]) -> Option<&Door> {
        self.0
            .iter()
            .find(|door| protocols.contains(&door.protocol))
    }

    /// The first AMQP door (TLS first): the one connection strings name.
    pub fn first_amqp(&self) -> Option<(Protocol, SocketAddr)> {
        self.first(&[Protocol::Amqps, Protocol::Amqp])
            .map(|door| (door.protocol, door.addr()))
    }

    /// What `server.json` records: the addresses the doors really listen on.
    pub fn listeners(&self) -> running::Listeners {
        let mut listeners = running::Listeners {
            pid: std::process::id(),
            ..running::Listeners::default()
        };
        for door in &self.0 {
            let slot = match door.protocol {
                Protocol::Amqps => &mut listeners.amqps,
                Protocol::Amqp => &mut listeners.amqp,
                Protocol::Https => &mut listeners.https,
                Protocol::Http => &mut listeners.http,
                Protocol::KafkaTls => &mut listeners.kafka_tls,
                Protocol::Kafka => &mut listeners.kafka,
            };
            slot.get_or_insert(door.addr());
        }
        listeners
    }

    /// Stops every door, in start order.
    pub async fn stop(self) -> Result<()> {
        for door in self.0 {
            door.stop().await?;
        }
        Ok(())
    }
}

/// Starts the doors [`requested`] lists, in order; on a failure, those already started are
/// stopped again and the error names the door and, when its port is taken, the flag to move
/// it.
pub async fn start(
    global: &GlobalArgs,
    args: &ServeArgs,
    broker: &Broker,
    policies: &AccessPolicies,
    tls: Option<&ServerTls>,
) -> Result<Doors> {
    let mut doors = Doors(Vec::new());
    for (protocol, port) in requested(args) {
        let addr = SocketAddr::from((args.listen, port));
        let started = start_door(protocol, addr, global, args, broker, policies, tls, &doors)
            .await
            .with_context(|| format!("cannot start the {} front door", protocol.scheme()))
            .map_err(|e| explain_port_in_use(e, port, protocol.port_flag()));
        match started {
            Ok(listener) => doors.0.push(Door { protocol, listener }),
            Err(e) => {
                let _ = doors.stop().await;
                return Err(e);
            }
        }
    }
    Ok(doors)
}

/// Starts one door at `addr`; `before` holds the doors already started.
#[allow(clippy::too_many_arguments)] // what each door takes from the start-up, in one place
async fn start_door(
    protocol: Protocol,
    addr: SocketAddr,
    global: &GlobalArgs,
    args: &ServeArgs,
    broker: &Broker,
    policies: &AccessPolicies,
    tls: Option<&ServerTls>,
    before: &Doors,
) -> Result<Listener> {
    let tls = tls.filter(|_| protocol.tls()).cloned();
    Ok(match protocol {
        Protocol::Amqps | Protocol::Amqp => {
            let mut config = AmqpConfig::new(addr, policies.clone());
            config.tls = tls;
            config.limits = amqp_limits(args);
            Listener::Amqp(tributary_amqp::start(broker.clone(), config).await?)
        }
        Protocol::Https | Protocol::Http => {
            let mut config = HttpConfig::new(addr, http_auth(global, args)?);
            if args.http_oci_rate_limits {
                config.rate_limits = tributary_http::RateLimits::oci();
            }
            config.tls = tls;
            config.admin_sas = Some(admin_sas(policies));
            config.policies = Some(policies.clone());
            config.limits = http_limits(args);
            // AMQP over WebSockets (`/$servicebus/websocket`): the first AMQP door serves it;
            // TLS, if any, is the WebSocket's.
            config.websocket_amqp = before.0.iter().find_map(|door| match &door.listener {
                Listener::Amqp(amqp) => Some(amqp_over_websockets(amqp)),
                _ => None,
            });
            // Every HTTP listener serves the same server-side consumer groups.
            let coordinator = before.0.iter().find_map(|door| match &door.listener {
                Listener::Http(http) => Some(http.coordinator().clone()),
                _ => None,
            });
            Listener::Http(match coordinator {
                None => tributary_http::start(broker.clone(), config).await?,
                Some(coordinator) => {
                    tributary_http::start_with_coordinator(broker.clone(), coordinator, config)
                        .await?
                }
            })
        }
        Protocol::KafkaTls | Protocol::Kafka => {
            let mut config = KafkaConfig::new(addr, policies.clone());
            if let Some(host) = &args.kafka_advertised_host {
                config.advertised_host.clone_from(host);
            }
            config.tls = tls;
            config.development_unauthenticated = args.kafka_unauthenticated;
            config.limits = kafka_limits(args);
            Listener::Kafka(tributary_kafka::start(broker.clone(), config).await?)
        }
    })
}

/// Adds what to do when a door's port is taken: the flag that moves it.
fn explain_port_in_use(error: anyhow::Error, port: u16, flag: &str) -> anyhow::Error {
    let in_use = error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::AddrInUse)
    });
    if in_use {
        error.context(format!(
            "port {port} is in use (another `tributary serve`?); choose another with {flag} <port> (0 picks a free one)"
        ))
    } else {
        error
    }
}

/// The admin API also takes a SAS token (Event Hubs' REST scheme) signed with the key of a
/// policy with the Manage right, for the whole namespace: what `tributary hub`/`group` send to
/// a running server.
fn admin_sas(policies: &AccessPolicies) -> tributary_http::AdminSas {
    // Every accepted key, the unsaved one of --emulator-compat included; the live set, so a
    // regenerated key is refused here too.
    let policies = policies.clone();
    tributary_http::AdminSas::explained(move |token| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        policies.verify_admin_token(token, now).map(drop)
    })
}

/// AMQP over WebSockets: the HTTP door hands each connection it upgrades at
/// `/$servicebus/websocket` to the AMQP door, which authenticates and serves it as any other.
fn amqp_over_websockets(amqp: &RunningAmqpServer) -> tributary_http::AmqpOverWebSockets {
    let connections = amqp.connections();
    tributary_http::AmqpOverWebSockets::new(move |stream, peer| {
        let connections = connections.clone();
        Box::pin(async move { connections.serve(stream, peer).await })
    })
}

/// A duration flag in milliseconds, or `default` when not given.
fn duration_or(ms: Option<i64>, default: Duration) -> Duration {
    ms.map_or(default, |ms| {
        Duration::from_millis(u64::try_from(ms).unwrap_or(0))
    })
}

/// The AMQP doors' connection caps and deadlines, from the flags.
fn amqp_limits(args: &ServeArgs) -> tributary_amqp::limits::ConnectionLimits {
    let defaults = tributary_amqp::limits::ConnectionLimits::default();
    tributary_amqp::limits::ConnectionLimits {
        connections_max: args.connections_max,
        connections_per_address_max: args.connections_per_address_max,
        handshake_timeout: duration_or(args.amqp_handshake_timeout, defaults.handshake_timeout),
        auth_timeout: duration_or(args.amqp_auth_timeout, defaults.auth_timeout),
    }
}

/// The Kafka doors' connection caps and pre-authentication deadline (the AMQP doors' flag: one
/// budget for every door), from the flags.
fn kafka_limits(args: &ServeArgs) -> tributary_kafka::KafkaLimits {
    let defaults = tributary_kafka::KafkaLimits::default();
    tributary_kafka::KafkaLimits {
        connections_max: args.connections_max,
        connections_per_address_max: args.connections_per_address_max,
        auth_timeout: duration_or(args.amqp_auth_timeout, defaults.auth_timeout),
        ..defaults
    }
}

/// The HTTP doors' connection caps and read timeouts, from the flags.
fn http_limits(args: &ServeArgs) -> tributary_http::HttpLimits {
    let defaults = tributary_http::HttpLimits::default();
    tributary_http::HttpLimits {
        connections_max: args.connections_max,
        connections_per_address_max: args.connections_per_address_max,
        header_read_timeout: duration_or(args.http_header_timeout, defaults.header_read_timeout),
        body_read_timeout: duration_or(args.http_body_timeout, defaults.body_read_timeout),
    }
}

fn http_auth(global: &GlobalArgs, args: &ServeArgs) -> Result<tributary_http::AuthConfig> {
    if args.http_unauthenticated {
        return Ok(tributary_http::AuthConfig::DevelopmentUnauthenticated);
    }
    // An empty key file on first start: every request is refused until a key is added (the
    // file is re-read when it changes, no restart needed).
    let keys = global.data_dir.join("oci-api-keys.json");
    if !keys.exists() {
        tributary_http::write_key_file(&keys, b"{}\n")
            .with_context(|| format!("cannot create {}", keys.display()))?;
    }
    Ok(tributary_http::AuthConfig::signatures())
}
