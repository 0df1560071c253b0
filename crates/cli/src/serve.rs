//! `tributary serve` (the hub and its front doors until Ctrl-C or SIGTERM) and `tributary cert` (a
//! development authority and server certificate for its TLS doors).
//!
//! Without a certificate the doors are plain: AMQP on --amqp-port (the SDKs' emulator mode),
//! HTTP on --http-port and Kafka (SASL_PLAINTEXT) on --kafka-port. With --tls-cert/--tls-key
//! they are AMQPS on --amqps-port, HTTPS on --https-port and Kafka's SASL_SSL on
//! --kafka-tls-port, and the plain ones open only with --plain. [`crate::doors`] starts, lists
//! and stops them all the same way.
//!
//! With --emulator-config it creates the hubs and groups of a Microsoft Event Hubs emulator
//! configuration file instead of the default hub (see [`crate::emulator`]). With
//! --emulator-compat it also accepts the emulator's publicly known key, for this run only (it
//! is never written to the policies file), and moves the HTTP door to the emulator's health
//! port; it says so on stderr, loudly, before anything else.
//!
//! Every captured hub is captured while it serves ([`CaptureRunner`]; progress in
//! `<data dir>/capture/`), and stops being captured cleanly on the way out.
//!
//! The banner — where each door listens, the dashboard, how to get a connection string — goes
//! to stdout; warnings and diagnostics go to stderr. Every port asked for is checked before any
//! door starts, so ports in use are reported together, each with the flag that moves it.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use tributary_amqp::{AccessPolicies, AccessPolicy};
use tributary_broker::{Broker, BrokerConfig, HubSpec};
use tributary_capture::CaptureRunner;
use tributary_tls::ServerTls;

use crate::args::{CertArgs, GlobalArgs, ServeArgs};
use crate::doors::{self, Door, Doors, Protocol};
use crate::emulator::{self, EmulatorConfig};
use crate::running;

/// The log's own limit while front doors run: they enforce the 1 MiB protocol limits on what
/// clients send; the log's check counts record framing and keys too, so it needs headroom.
const FRONT_DOOR_EVENT_BYTES_MAX: u32 = 1024 * 1024 + 16 * 1024;

/// Where the captures' progress is kept, in the data directory.
const CAPTURE_STATE_DIR: &str = "capture";

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
    crate::policy::follow_hubs(&broker, &policies)?;
    let root = created.and_then(|_| policies.policies().first().cloned());
    if args.emulator_compat {
        // For this run only: never saved, so a start without the flag refuses it.
        policies = policies.accepting_unsaved(AccessPolicy::emulator_well_known());
    }
    let doors = match doors::start(global, args, &broker, &policies, tls.as_ref()).await {
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
    let capture = CaptureRunner::start(
        &broker,
        &args.capture_namespace,
        &global.data_dir.join(CAPTURE_STATE_DIR),
        args.capture_storage.clone(),
    );
    // Listening before the banner says "press Ctrl-C", so a Ctrl-C right after it stops cleanly.
    let ctrl_c = listen_for_ctrl_c()?;
    running::write(&global.data_dir, &doors.listeners())?;
    print_banner(global, args, &broker, &doors, root.as_ref())?;
    ctrl_c.await;
    eprintln!("stopping: closing listeners, syncing partitions");
    running::remove(&global.data_dir);
    doors.stop().await?;
    capture.stop().await;
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

/// Fails, naming every one of them, when ports the doors are to listen on are taken, before
/// anything starts: a user sees all the flags to change at once, not one per attempt. The
/// probes are closed again at once; a port taken in the moment between is still reported by
/// the door that cannot bind it.
fn check_ports_free(args: &ServeArgs) -> Result<()> {
    let taken: Vec<String> = doors::requested(args)
        .into_iter()
        .filter(|(_, port)| *port != 0)
        .filter(|(_, port)| {
            std::net::TcpListener::bind((args.listen, *port))
                .is_err_and(|e| e.kind() == std::io::ErrorKind::AddrInUse)
        })
        .map(|(protocol, port)| format!("{port} ({})", protocol.port_flag()))
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
    config.sync_scope = global.sync_scope;
    config.log.event_bytes_max = global.event_bytes_max.max(FRONT_DOOR_EVENT_BYTES_MAX);
    config.retention_check_interval = Duration::from_millis(args.retention_check as u64);
    config.compaction_check_interval = Duration::from_millis(args.compaction_check as u64);
    config.compaction_segment_age_max = Duration::from_millis(args.compaction_segment_age as u64);
    config.throughput = crate::throughput::limits(
        args.throughput_units,
        args.ingress_limit,
        args.egress_limit,
        &args.hub_limit,
    )
    .map_err(anyhow::Error::msg)?;
    config.capture_retention = args.capture_retention;
    Broker::open(config).await.with_context(|| {
        format!(
            "cannot open the data directory {}",
            global.data_dir.display()
        )
    })
}

/// The connection string of the policy `root` for the first AMQP door.
fn root_connection_string(doors: &Doors, root: &AccessPolicy) -> Option<String> {
    let (protocol, addr) = doors.first_amqp()?;
    Some(if protocol == Protocol::Amqps {
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
    for line in crate::throughput::describe(broker.throttle().limits()) {
        writeln!(out, "  {line}")?;
    }
    for line in doors.iter().flat_map(Door::describe) {
        writeln!(out, "  {line}")?;
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
    let endpoint = match doors.first(&[Protocol::Amqp]).map(Door::addr) {
        Some(addr) if addr.port() == tributary_amqp::policies::DEFAULT_PORT => {
            "sb://localhost".to_owned()
        }
        Some(addr) => format!("sb://localhost:{}", addr.port()),
        None => "(no plain AMQP door: --plain)".to_owned(),
    };
    writeln!(
        out,
        "  emulator compatibility (DEVELOPMENT ONLY): the emulator's connection string works: \
         Endpoint={endpoint};SharedAccessKeyName={};SharedAccessKey=<the emulator's>;UseDevelopmentEmulator=true;",
        tributary_amqp::policies::EMULATOR_KEY_NAME
    )?;
    if let Some(http) = doors.first(&[Protocol::Http]) {
        writeln!(
            out,
            "  emulator health check: http://{}/health",
            http.addr()
        )?;
    }
    match doors.first(&[Protocol::Kafka]) {
        Some(kafka) => writeln!(
            out,
            "  emulator Kafka endpoint: {} (SASL_PLAINTEXT, PLAIN, user $ConnectionString, the \
             emulator's connection string as password)",
            kafka.addr()
        )?,
        None => writeln!(
            out,
            "  emulator Kafka endpoint: none (no plain Kafka door: --plain)"
        )?,
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
