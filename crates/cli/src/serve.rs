//! `tributary serve` (the hub and its front doors until Ctrl-C or SIGTERM) and `tributary cert` (a
//! development authority and server certificate for its TLS doors).
//!
//! Without a certificate the doors are plain: AMQP on --amqp-port (the SDKs' emulator mode) and
//! HTTP on --http-port. With --tls-cert/--tls-key they are AMQPS on --amqps-port and HTTPS on
//! --https-port, and the plain ones open only with --plain.
//!
//! With --emulator-config it creates the hubs and groups of a Microsoft Event Hubs emulator
//! configuration file instead of the default hub (see [`crate::emulator`]). With
//! --emulator-compat it also accepts the emulator's publicly known key, for this run only (it
//! is never written to the policies file), and moves the HTTP door to the emulator's health
//! port; it says so on stderr, loudly, before anything else.
//!
//! The banner — where each door listens, the dashboard, how to get a connection string — goes
//! to stdout; warnings and diagnostics go to stderr. Every port asked for is checked before any
//! door starts, so ports in use are reported together, each with the flag that moves it.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use tributary_amqp::{AccessPolicies, AccessPolicy, AmqpConfig, RunningAmqpServer};
use tributary_broker::{Broker, BrokerConfig, HubSpec};
use tributary_http::{HttpConfig, RunningHttpServer};
use tributary_tls::ServerTls;

use crate::args::{CertArgs, GlobalArgs, ServeArgs};
use crate::emulator::{self, EmulatorConfig};
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
    if args.emulator_compat {
        warn_emulator_compat(args);
    }
    // The whole file is read and checked before the data directory is even opened.
    let emulator_config = args
        .emulator_config
        .as_deref()
        .map(emulator::read)
        .transpose()?;
    check_ports_free(args)?;
    let broker = open_with_hubs(global, args, emulator_config.as_ref()).await?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(ServerTls::from_pem_files(cert, key).context("cannot use the TLS certificate")?)
        }
        _ => None,
    };
    let (mut policies, created) = AccessPolicies::load_or_create(&global.data_dir)
        .context("cannot load the shared access policies")?;
    let root = created.and_then(|_| policies.policies().first().cloned());
    if args.emulator_compat {
        // For this run only: never saved, so a start without the flag refuses it.
        policies = policies.accepting_unsaved(AccessPolicy::emulator_well_known());
    }
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
    // Listening before the banner says "press Ctrl-C", so a Ctrl-C right after it stops cleanly.
    let ctrl_c = listen_for_ctrl_c()?;
    running::write(&global.data_dir, &listeners(&doors))?;
    print_banner(global, args, &broker, &doors, root.as_ref())?;
    ctrl_c.await;
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

/// Ctrl-C (SIGINT) or SIGTERM (what `docker stop`, systemd and Kubernetes send), listened for
/// from this call on: `tokio::signal::ctrl_c` only starts listening when first awaited.
#[cfg(unix)]
fn listen_for_ctrl_c() -> Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot listen for Ctrl-C")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

#[cfg(not(unix))]
fn listen_for_ctrl_c() -> Result<impl Future<Output = ()>> {
    Ok(async {
        let _ = tokio::signal::ctrl_c().await;
    })
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

/// The doors' ports with the flags that set them, as `start_doors` will open them.
fn requested_ports(args: &ServeArgs) -> Vec<(u16, &'static str)> {
    let tls = args.tls_cert.is_some() && args.tls_key.is_some();
    let plain = !tls || args.plain;
    let mut ports = Vec::new();
    if tls {
        ports.push((args.amqps_port, "--amqps-port"));
        ports.push((args.https_port, "--https-port"));
    }
    if plain {
        ports.push((args.amqp_port, "--amqp-port"));
        ports.push((args.http_port(), "--http-port"));
    }
    ports
}

/// Fails, naming every one of them, when ports the doors are to listen on are taken, before
/// anything starts: a user sees all the flags to change at once, not one per attempt. The
/// probes are closed again at once; a port taken in the moment between is still reported by
/// the door that cannot bind it.
fn check_ports_free(args: &ServeArgs) -> Result<()> {
    let taken: Vec<String> = requested_ports(args)
        .into_iter()
        .filter(|(port, _)| *port != 0)
        .filter(|(port, _)| {
            std::net::TcpListener::bind((args.listen, *port))
                .is_err_and(|e| e.kind() == std::io::ErrorKind::AddrInUse)
        })
        .map(|(port, flag)| format!("{port} ({flag})"))
        .collect();
    let ports = match taken.as_slice() {
        [] => return Ok(()),
        [one] => format!("port {one} is"),
        several => format!("ports {} are", several.join(", ")),
    };
    anyhow::bail!(
        "{ports} in use on {} (another `tributary serve`?); choose free ones with the flags \
         named (0 picks a free port)",
        args.listen
    )
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

/// Says, before anything else, that --emulator-compat accepts a key anyone knows.
fn warn_emulator_compat(args: &ServeArgs) {
    let reach = if args.listen.is_loopback() {
        "anyone on this machine".to_owned()
    } else {
        format!("anyone who can reach {}", args.listen)
    };
    eprintln!(
        "WARNING: --emulator-compat: FOR DEVELOPMENT ONLY.\n\
         WARNING: this server accepts the Event Hubs emulator's publicly known key \
         (SharedAccessKeyName={}) with the Manage right:\n\
         WARNING: {reach} can read, write and delete with it. Never run it this way where others can connect.",
        tributary_amqp::policies::EMULATOR_KEY_NAME
    );
}

/// Opens the data directory and creates its hubs: the emulator configuration's, or the
/// default hub (--hub) when the directory has none. A configuration that does not fit the
/// directory creates nothing and closes the broker again.
async fn open_with_hubs(
    global: &GlobalArgs,
    args: &ServeArgs,
    emulator_config: Option<&EmulatorConfig>,
) -> Result<Broker> {
    let broker = open_broker(global, args).await?;
    let Some(config) = emulator_config else {
        if broker.list_hubs().is_empty() {
            let created = broker
                .create_hub(HubSpec::new(&args.hub, args.partitions))
                .await
                .context("cannot create the default hub");
            if let Err(e) = created {
                broker.shutdown().await?;
                return Err(e);
            }
        }
        return Ok(broker);
    };
    let file = args.emulator_config.as_deref().unwrap_or(Path::new("-"));
    let groups_max = broker.config().consumer_groups_max;
    match emulator::apply(&broker, config, groups_max).await {
        Ok(applied) => {
            print_applied(file, &applied);
            Ok(broker)
        }
        Err(e) => {
            broker.shutdown().await?;
            Err(e.context(format!("the emulator configuration {}", file.display())))
        }
    }
}

/// One line on what --emulator-config did, on stdout before the banner.
fn print_applied(file: &Path, applied: &emulator::Applied) {
    let list = |names: &[String]| {
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    };
    println!(
        "emulator configuration {}: event hubs created: {}; already there: {}; consumer groups created: {}",
        file.display(),
        list(&applied.hubs_created),
        list(&applied.hubs_kept),
        list(&applied.groups_created)
    );
}

async fn open_broker(global: &GlobalArgs, args: &ServeArgs) -> Result<Broker> {
    let mut config = BrokerConfig::new(&global.data_dir);
    config.log.durability = global.durability;
    config.log.event_bytes_max = global.event_bytes_max.max(FRONT_DOOR_EVENT_BYTES_MAX);
    config.retention_check_interval = Duration::from_millis(args.retention_check as u64);
    Broker::open(config).await.with_context(|| {
        format!(
            "cannot open the data directory {}",
            global.data_dir.display()
        )
    })
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
        http_listeners.push(("http", args.http_port(), None));
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
    // Every accepted key, the unsaved one of --emulator-compat included.
    let policies = policies.clone();
    tributary_http::AdminSas::new(move |token| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        policies
            .verify_token(token, now)
            .is_ok_and(|(verified, policy)| {
                policy.allows(tributary_amqp::Right::Manage)
                    && tributary_eventhubs::address::strip_host(&verified.audience).is_empty()
            })
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

/// The connection string of the policy `root` for the first AMQP door.
fn root_connection_string(doors: &Doors, root: &AccessPolicy) -> Option<String> {
    let (scheme, amqp) = doors.amqp.first()?;
    let addr = amqp.local_addr();
    Some(if *scheme == "amqps" {
        // The certificate names the host, so the string names it too: localhost here.
        tributary_amqp::tls_connection_string("localhost", addr.port(), root)
    } else {
        tributary_amqp::connection_string(&running::client_host(addr), addr.port(), root)
    })
}

/// The banner, on stdout: the data, where each door listens, the dashboard, and the connection
/// string — shown in full only when `root` was just created (a secret is shown once), else the
/// command that prints it.
fn print_banner(
    global: &GlobalArgs,
    args: &ServeArgs,
    broker: &Broker,
    doors: &Doors,
    root: Option<&AccessPolicy>,
) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "tributary {} serving {} (durability: {})",
        env!("CARGO_PKG_VERSION"),
        global.data_dir.display(),
        global.durability
    )?;
    for hub in broker.list_hubs() {
        let groups: Vec<_> = hub
            .consumer_groups
            .iter()
            .map(|g| g.name.as_str())
            .collect();
        let partitions = crate::output::count(u64::from(hub.partition_count), "partition");
        writeln!(
            out,
            "  event hub {:?}: {partitions}, consumer groups {}",
            hub.name,
            groups.join(", ")
        )?;
    }
    for (scheme, amqp) in &doors.amqp {
        writeln!(
            out,
            "  {scheme}: {scheme}://{} (the Azure Event Hubs SDKs)",
            amqp.local_addr()
        )?;
    }
    for (scheme, http) in &doors.http {
        let addr = http.local_addr();
        writeln!(
            out,
            "  dashboard: {scheme}://{addr}/ (log in with a Manage connection string)"
        )?;
        writeln!(
            out,
            "  {scheme}: {scheme}://{addr} (AMQP over WebSockets at /$servicebus/websocket, \
             OCI Streaming at /20180418, admin API, /health, /metrics)"
        )?;
    }
    match root.and_then(|root| root_connection_string(doors, root).map(|text| (root, text))) {
        Some((root, text)) => writeln!(
            out,
            "  created the shared access policy {:?}; its connection string, shown this once \
             ({} prints it again):\n    {text}",
            root.name,
            connection_string_command(global)
        )?,
        None => writeln!(
            out,
            "  connection string: {} prints it",
            connection_string_command(global)
        )?,
    }
    if args.emulator_compat {
        print_emulator_compat(&mut out, doors)?;
    }
    writeln!(out, "press Ctrl-C to stop")?;
    out.flush()?;
    Ok(())
}

/// The command that prints the running server's connection string for this data directory.
fn connection_string_command(global: &GlobalArgs) -> String {
    format!(
        "`tributary --data-dir {} connection-string`",
        global.data_dir.display()
    )
}

/// What --emulator-compat serves where the emulator does, in the banner. The key itself is
/// never printed.
fn print_emulator_compat(out: &mut impl Write, doors: &Doors) -> Result<()> {
    let endpoint = match doors.amqp.iter().find(|(scheme, _)| *scheme == "amqp") {
        Some((_, amqp)) if amqp.local_addr().port() == tributary_amqp::policies::DEFAULT_PORT => {
            "sb://localhost".to_owned()
        }
        Some((_, amqp)) => format!("sb://localhost:{}", amqp.local_addr().port()),
        None => "(no plain AMQP door: --plain)".to_owned(),
    };
    writeln!(
        out,
        "  emulator compatibility (DEVELOPMENT ONLY): the emulator's connection string works: \
         Endpoint={endpoint};SharedAccessKeyName={};SharedAccessKey=<the emulator's>;UseDevelopmentEmulator=true;",
        tributary_amqp::policies::EMULATOR_KEY_NAME
    )?;
    if let Some((scheme, http)) = doors.http.iter().find(|(scheme, _)| *scheme == "http") {
        writeln!(
            out,
            "  emulator health check: {scheme}://{}/health",
            http.local_addr()
        )?;
    }
    writeln!(
        out,
        "  Kafka (the emulator's port 9092): not served; Tributary has no Kafka door yet"
    )?;
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
