//! `tributary failover status|switch`: what a hub alias names and whether its endpoints
//! answer, and moving a file-based alias to another endpoint atomically. (The clients' side —
//! following an alias — is `tributary_client::failover`.)

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use tributary_client::AliasEndpoint;
use tributary_client::failover::{self, HubAlias, read_alias_file, write_alias_file};

use crate::args::{FailoverArgs, FailoverCommand, GlobalArgs};
use crate::output::rfc3339;

/// How long a reachability check waits for a TCP connection.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Runs `tributary failover …`.
pub async fn run(global: &GlobalArgs, args: &FailoverArgs) -> Result<()> {
    match &args.command {
        FailoverCommand::Status {
            candidates,
            default_port,
            ..
        } => status(global, candidates, *default_port).await,
        FailoverCommand::Switch {
            endpoint,
            force,
            default_port,
            ..
        } => {
            let Some(path) = &global.alias.alias_file else {
                bail!("failover switch rewrites an alias file: give --alias-file PATH");
            };
            let endpoint: AliasEndpoint = endpoint.parse()?;
            switch(path, &endpoint, *force, *default_port).await
        }
        FailoverCommand::Translate(args) => crate::failover_translate::translate(args).await,
    }
}

async fn status(global: &GlobalArgs, extra: &[AliasEndpoint], default_port: u16) -> Result<()> {
    let Some(options) = global.alias.failover_options()? else {
        bail!("failover status shows an alias: give --alias-file PATH or --alias-srv NAME");
    };
    let alias = &options.alias;
    println!("{alias}");
    let mut candidates = failover::resolve(alias)
        .await
        .with_context(|| format!("cannot resolve the {alias}"))?;
    if let HubAlias::File(path) = alias {
        println!("active endpoint: {}", candidates[0]);
        if let Some(changed) = changed_at(path) {
            println!("changed: {changed}");
        }
    }
    for endpoint in extra {
        if !candidates.iter().any(|c| c.same_place(endpoint)) {
            candidates.push(endpoint.clone());
        }
    }
    println!("endpoint\treachable");
    for (index, candidate) in candidates.iter().enumerate() {
        let role = if index == 0 { " (active)" } else { "" };
        let reachable = match probe(candidate, default_port).await {
            Ok(took) => format!("yes ({} ms)", took.as_millis()),
            Err(why) => format!("no: {why}"),
        };
        println!("{candidate}{role}\t{reachable}");
    }
    Ok(())
}

/// When the file was last modified, as RFC 3339 and its age.
fn changed_at(path: &Path) -> Option<String> {
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    let ms = i64::try_from(modified.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()?;
    let age = SystemTime::now()
        .duration_since(modified)
        .unwrap_or_default()
        .as_secs();
    Some(format!("{} ({age} s ago)", rfc3339(ms)))
}

async fn switch(
    path: &Path,
    endpoint: &AliasEndpoint,
    force: bool,
    default_port: u16,
) -> Result<()> {
    let previous = read_alias_file(path).ok();
    if previous.as_ref().is_some_and(|p| p.same_place(endpoint)) {
        println!("{} already names {endpoint}", path.display());
        return Ok(());
    }
    if let Err(why) = probe(endpoint, default_port).await {
        if !force {
            bail!(
                "{endpoint} does not accept a connection ({why}); nothing changed (--force switches anyway)"
            );
        }
        eprintln!("tributary: {endpoint} does not accept a connection ({why}); switching anyway");
    }
    write_alias_file(path, endpoint)?;
    let from = previous.map_or_else(|| "(none)".to_owned(), |p| p.to_string());
    println!("{}: {from} -> {endpoint}", path.display());
    Ok(())
}

/// Whether `endpoint` accepts a TCP connection, and how long that took.
async fn probe(endpoint: &AliasEndpoint, default_port: u16) -> Result<Duration, String> {
    let port = endpoint.port.unwrap_or(default_port);
    let started = Instant::now();
    let connect = async {
        if endpoint.addresses.is_empty() {
            tokio::net::TcpStream::connect((endpoint.host.as_str(), port)).await
        } else {
            let addresses: Vec<std::net::SocketAddr> = endpoint
                .addresses
                .iter()
                .map(|ip| std::net::SocketAddr::new(*ip, port))
                .collect();
            tokio::net::TcpStream::connect(addresses.as_slice()).await
        }
    };
    match tokio::time::timeout(PROBE_TIMEOUT, connect).await {
        Ok(Ok(_)) => Ok(started.elapsed()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
    }
}
