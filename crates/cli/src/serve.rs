//! `tributary serve` (the hub and its front doors until Ctrl-C) and `tributary cert` (a
//! development authority and server certificate for its TLS doors).
//!
//! Without a certificate the doors are plain: AMQP on --amqp-port (the SDKs' emulator mode) and
//! HTTP on --http-port. With --tls-cert/--tls-key they are AMQPS on --amqps-port and HTTPS on
//! --https-port, and the plain ones open only with --plain.

use std::io::Write;
use std::time::Duration;

use anyhow::{Context, Result};
use tributary_amqp::{AccessPolicies, AccessPolicy, AmqpConfig, RunningAmqpServer};
use tributary_broker::{Broker, BrokerConfig, HubSpec};
use tributary_http::{HttpConfig, RunningHttpServer};
use tributary_tls::ServerTls;

use crate::args::{CertArgs, GlobalArgs, ServeArgs};
use crate::running;

/// The log's own limit while front doors run: they enforce the 1 MiB protocol limits on what
/// clients send; the log's check counts record framing and keys too, so it needs headroom.
const FRONT_DOOR_EVENT_BYTES_MAX: u32 = 1024 * 1024 + 16 * 1024;

/// The listeners `serve` runs, each with the URL scheme clients reach it by.
struct Doors {
    amqp: Vec<(&'static str, RunningAmqpServer)>,
    http: Vec<(&'static str, RunningHttpServer)>,
}

/// `tributary serve`.
pub async fn serve(global: &GlobalArgs, args: &ServeArgs) -> Result<()> {
    let broker = open_with_default_hub(global, args).await?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(ServerTls::from_pem_files(cert, key).context("cannot use the TLS certificate")?)
        }
        _ => None,
    };
    let (policies, created) = AccessPolicies::load_or_create(&global.data_dir)
        .context("cannot load the shared access policies")?;
    let root = created.and_then(|_| policies.policies().first().cloned());
    let doors = match start_doors(global, args, &broker, policies, tls).await {
        Ok(doors) => doors,
        Err(e) => {
            if root.is_some() {
                // The policy was never shown: the next start creates one and shows it.
                let _ = std::fs::remove_file(global.data_dir.join("access-policies.json"));
            }
            broker.shutdown().await?;
            return Err(e);
        }
    };
    running::write(&global.data_dir, &listeners(&doors))?;
    print_banner(global, args, &broker, &doors)?;
    if let Some(root) = root {
        print_root_connection_string(&doors, &root);
    }
    eprintln!("press Ctrl-C to stop");
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    eprintln!("stopping: closing listeners, syncing partitions");
    running::remove(&global.data_dir);
    for (_, amqp) in doors.amqp {
        amqp.shutdown().await;
    }
    for (_, http) in doors.http {
        http.shutdown().await?;
    }
    broker.shutdown().await?;
    Ok(())
}

/// What `server.json` records: the addresses the doors really listen on.
fn listeners(doors: &Doors) -> running::Listeners {
    let mut listeners = running::Listeners {
        pid: std::process::id(),
        ..running::Listeners::default()
    };
    for (scheme, amqp) in &doors.amqp {
        match *scheme {
            "amqps" => listeners.amqps = Some(amqp.local_addr()),
            _ => listeners.amqp = Some(amqp.local_addr()),
        }
    }
    for (scheme, http) in &doors.http {
        match *scheme {
            "https" => listeners.https = Some(http.local_addr()),
            _ => listeners.http = Some(http.local_addr()),
        }
    }
    listeners
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

async fn open_with_default_hub(global: &GlobalArgs, args: &ServeArgs) -> Result<Broker> {
    let mut config = BrokerConfig::new(&global.data_dir);
    config.log.durability = global.durability;
    config.log.event_bytes_max = global.event_bytes_max.max(FRONT_DOOR_EVENT_BYTES_MAX);
    config.retention_check_interval = Duration::from_millis(args.retention_check as u64);
    let broker = Broker::open(config).await.with_context(|| {
        format!(
            "cannot open the data directory {}",
            global.data_dir.display()
        )
    })?;
    if broker.list_hubs().is_empty() {
        broker
            .create_hub(HubSpec::new(&args.hub, args.partitions))
            .await
            .context("cannot create the default hub")?;
    }
    Ok(broker)
}

/// Starts the AMQP doors, then the HTTP doors (which carry AMQP over WebSockets to the first
/// AMQP door): TLS ones with a certificate, plain ones without (or with --plain).
async fn start_doors(
    global: &GlobalArgs,
    args: &ServeArgs,
    broker: &Broker,
    policies: AccessPolicies,
    tls: Option<ServerTls>,
) -> Result<Doors> {
    let plain = tls.is_none() || args.plain;
    let mut doors = Doors {
        amqp: Vec::new(),
        http: Vec::new(),
    };
    let mut amqp_listeners = Vec::new();
    if let Some(tls) = &tls {
        amqp_listeners.push(("amqps", args.amqps_port, Some(tls.clone())));
    }
    if plain {
        amqp_listeners.push(("amqp", args.amqp_port, None));
    }
    for (scheme, port, tls) in amqp_listeners {
        let mut config = AmqpConfig::new((args.listen, port).into(), policies.clone());
        config.tls = tls;
        let flag = if scheme == "amqps" {
            "--amqps-port"
        } else {
            "--amqp-port"
        };
        config.limits = amqp_limits(args);
        let amqp = tributary_amqp::start(broker.clone(), config)
            .await
            .with_context(|| format!("cannot start the {scheme} front door"))
            .map_err(|e| explain_port_in_use(e, port, flag))?;
        doors.amqp.push((scheme, amqp));
    }
    let mut http_listeners = Vec::new();
    if let Some(tls) = &tls {
        http_listeners.push(("https", args.https_port, Some(tls.clone())));
    }
    if plain {
        http_listeners.push(("http", args.http_port, None));
    }
    for (scheme, port, tls) in http_listeners {
        let mut config = HttpConfig::new((args.listen, port).into(), http_auth(global, args)?);
        if args.http_oci_rate_limits {
            config.rate_limits = tributary_http::RateLimits::oci();
        }
        config.tls = tls;
        config.admin_sas = Some(admin_sas(&policies));
        config.limits = http_limits(args);
        // AMQP over WebSockets (`/$servicebus/websocket`): the first AMQP door serves it; TLS,
        // if any, is the WebSocket's.
        config.websocket_amqp = doors
            .amqp
            .first()
            .map(|(_, amqp)| amqp_over_websockets(amqp));
        // Every HTTP listener serves the same server-side consumer groups.
        let http = match doors.http.first() {
            None => tributary_http::start(broker.clone(), config).await,
            Some((_, first)) => {
                let coordinator = first.coordinator().clone();
                tributary_http::start_with_coordinator(broker.clone(), coordinator, config).await
            }
        };
        let flag = if scheme == "https" {
            "--https-port"
        } else {
            "--http-port"
        };
        let http = http
            .with_context(|| format!("cannot start the {scheme} front door"))
            .map_err(|e| explain_port_in_use(e, port, flag))?;
        doors.http.push((scheme, http));
    }
    Ok(doors)
}

/// The admin API also takes a SAS token (Event Hubs' REST scheme) signed with the key of a
/// policy with the Manage right, for the whole namespace: what `tributary hub`/`group` send to
/// a running server.
fn admin_sas(policies: &AccessPolicies) -> tributary_http::AdminSas {
    let keys: Vec<(String, String)> = policies
        .policies()
        .iter()
        .filter(|p| p.allows(tributary_amqp::Right::Manage))
        .map(|p| (p.name.clone(), p.key.clone()))
        .collect();
    tributary_http::AdminSas::new(move |token| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        let key_of = |name: &str| {
            keys.iter()
                .find(|(n, _)| n == name)
                .map(|(_, key)| key.clone())
        };
        tributary_eventhubs::sas::verify(token, key_of, now)
            .is_ok_and(|v| tributary_eventhubs::address::strip_host(&v.audience).is_empty())
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

fn print_root_connection_string(doors: &Doors, root: &AccessPolicy) {
    let Some((scheme, amqp)) = doors.amqp.first() else {
        return;
    };
    let addr = amqp.local_addr();
    let text = if *scheme == "amqps" {
        // The certificate names the host, so the string names it too: localhost here.
        tributary_amqp::tls_connection_string("localhost", addr.port(), root)
    } else {
        tributary_amqp::connection_string(&running::client_host(addr), addr.port(), root)
    };
    eprintln!(
        "created the shared access policy {:?}; its connection string (shown once; `tributary connection-string` prints it again):\n  {text}",
        root.name
    );
}

fn print_banner(
    global: &GlobalArgs,
    args: &ServeArgs,
    broker: &Broker,
    doors: &Doors,
) -> Result<()> {
    let mut err = std::io::stderr().lock();
    writeln!(
        err,
        "tributary {} serving {}",
        env!("CARGO_PKG_VERSION"),
        global.data_dir.display()
    )?;
    writeln!(err, "  durability: {}", global.durability)?;
    for hub in broker.list_hubs() {
        let groups: Vec<_> = hub
            .consumer_groups
            .iter()
            .map(|g| g.name.as_str())
            .collect();
        writeln!(
            err,
            "  hub {:?}: {} partitions, consumer groups {}",
            hub.name,
            hub.partition_count,
            groups.join(", ")
        )?;
    }
    let auth = if args.http_unauthenticated {
        "UNAUTHENTICATED (development mode)".to_owned()
    } else {
        format!(
            "OCI request signatures, keys in {}",
            global.data_dir.join("oci-api-keys.json").display()
        )
    };
    let policies = global.data_dir.join("access-policies.json");
    for (scheme, amqp) in &doors.amqp {
        writeln!(
            err,
            "  {scheme}: {scheme}://{} (Azure Event Hubs SDKs; SAS policies in {})",
            amqp.local_addr(),
            policies.display()
        )?;
    }
    for (scheme, http) in &doors.http {
        writeln!(
            err,
            "  {scheme}: {scheme}://{}/20180418 (OCI Streaming), /admin/v1, /health, /metrics; {auth}; AMQP over WebSockets at /$servicebus/websocket",
            http.local_addr()
        )?;
    }
    Ok(())
}

/// `tributary cert`.
pub fn cert(global: &GlobalArgs, args: &CertArgs) -> Result<()> {
    let dir = args
        .dir
        .clone()
        .unwrap_or_else(|| global.data_dir.join("tls"));
    let mut hosts = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    for host in &args.hosts {
        if !hosts.contains(host) {
            hosts.push(host.clone());
        }
    }
    let made = tributary_tls::write_development_certificates(&dir, &hosts)
        .with_context(|| format!("cannot make certificates in {}", dir.display()))?;
    let authority = if made.created_authority {
        "a new development authority"
    } else {
        "the development authority already there"
    };
    println!(
        "server certificate for {} signed by {authority}:\n  authority (what clients trust): {}\n  certificate: {}\n  key:         {}\n\nserve with it:\n  tributary serve --tls-cert {} --tls-key {}\nclients: trust {} (Python: connection_verify=…; Node: NODE_EXTRA_CA_CERTS=…; tributary: --ca-file …)",
        hosts.join(", "),
        made.ca_cert.display(),
        made.server_cert.display(),
        made.server_key.display(),
        made.server_cert.display(),
        made.server_key.display(),
        made.ca_cert.display(),
    );
    Ok(())
}
