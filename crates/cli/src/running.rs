//! How the other commands find a `tributary serve` running on their data directory.
//!
//! `serve` holds the data directory's lock while it runs, and once its front doors listen it
//! writes `server.json` there: its process id and the addresses it really listens on (so
//! `--amqp-port 0` is found too). A clean stop removes the file. The file counts only while the
//! lock is held, so one left by a killed server is ignored.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tributary_amqp::AccessPolicies;

/// The file `serve` writes into the data directory.
const SERVER_FILE: &str = "server.json";

/// The listeners of a running server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listeners {
    /// The server's process id.
    pub pid: u32,
    /// Plain AMQP.
    pub amqp: Option<SocketAddr>,
    /// AMQP over TLS.
    pub amqps: Option<SocketAddr>,
    /// Plain HTTP.
    pub http: Option<SocketAddr>,
    /// HTTPS.
    pub https: Option<SocketAddr>,
    /// Kafka over TCP (SASL_PLAINTEXT).
    pub kafka: Option<SocketAddr>,
    /// Kafka over TLS (SASL_SSL).
    pub kafka_tls: Option<SocketAddr>,
}

fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(SERVER_FILE)
}

/// Records the listeners (written to a temporary file and renamed, so a reader never sees half).
pub fn write(data_dir: &Path, listeners: &Listeners) -> Result<()> {
    let addr = |a: Option<SocketAddr>| a.map(|a| a.to_string());
    let text = json!({
        "pid": listeners.pid,
        "amqp": addr(listeners.amqp),
        "amqps": addr(listeners.amqps),
        "http": addr(listeners.http),
        "https": addr(listeners.https),
        "kafka": addr(listeners.kafka),
        "kafka_tls": addr(listeners.kafka_tls),
    })
    .to_string();
    let temporary = data_dir.join(format!("{SERVER_FILE}.tmp"));
    std::fs::write(&temporary, text + "\n")
        .and_then(|()| std::fs::rename(&temporary, path(data_dir)))
        .with_context(|| format!("cannot write {}", path(data_dir).display()))
}

/// Removes the record (on a clean stop).
pub fn remove(data_dir: &Path) {
    let _ = std::fs::remove_file(path(data_dir));
}

/// Whether another process holds the data directory's lock (a running `serve`).
pub fn held(data_dir: &Path) -> bool {
    let Ok(file) = std::fs::OpenOptions::new()
        .write(true)
        .open(data_dir.join("LOCK"))
    else {
        return false;
    };
    // Taken and released at once when free: this only looks.
    matches!(file.try_lock(), Err(std::fs::TryLockError::WouldBlock))
}

/// The listeners of the server running on `data_dir`, if one is.
pub fn find(data_dir: &Path) -> Option<Listeners> {
    if !held(data_dir) {
        return None;
    }
    let text = std::fs::read_to_string(path(data_dir)).ok()?;
    parse(&text)
}

fn parse(text: &str) -> Option<Listeners> {
    let value: Value = serde_json::from_str(text).ok()?;
    let addr = |name: &str| value.get(name)?.as_str()?.parse().ok();
    Some(Listeners {
        pid: u32::try_from(value.get("pid")?.as_u64()?).ok()?,
        amqp: addr("amqp"),
        amqps: addr("amqps"),
        http: addr("http"),
        https: addr("https"),
        kafka: addr("kafka"),
        kafka_tls: addr("kafka_tls"),
    })
}

/// The host clients on this machine reach a listener by.
pub fn client_host(addr: SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        "localhost".to_owned()
    } else {
        addr.ip().to_string()
    }
}

impl Listeners {
    /// Where clients reach the AMQP door: host, port, and whether it is TLS (plain preferred;
    /// behind TLS the certificate names the host, so the host is localhost).
    pub fn amqp_endpoint(&self) -> Option<(String, u16, bool)> {
        match (self.amqp, self.amqps) {
            (Some(addr), _) => Some((client_host(addr), addr.port(), false)),
            (None, Some(addr)) => Some(("localhost".to_owned(), addr.port(), true)),
            (None, None) => None,
        }
    }
}

/// The connection string of the shared access policy `policy` of `data_dir` for an AMQP door at
/// `host:port` (AMQPS when `tls`, else the SDKs' emulator mode).
pub fn connection_string(
    data_dir: &Path,
    policy: &str,
    host: &str,
    port: u16,
    tls: bool,
) -> Result<String> {
    let policies = AccessPolicies::load_or_create(data_dir)
        .context("cannot load the shared access policies")?
        .0;
    let policy = policies.get(policy).with_context(|| {
        let names: Vec<String> = policies.policies().into_iter().map(|p| p.name).collect();
        format!(
            "there is no shared access policy {policy:?} in the namespace (there are: {}); \
             an event hub's policy's connection strings: `tributary policy show {policy} --hub <hub> --keys`",
            names.join(", ")
        )
    })?;
    Ok(if tls {
        tributary_amqp::tls_connection_string(host, port, &policy)
    } else {
        tributary_amqp::connection_string(host, port, &policy)
    })
}

/// The policy the CLI uses to reach the server running on its own data directory.
const LOCAL_POLICY: &str = "RootManageSharedAccessKey";

/// The server running on a data directory, as the CLI reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalServer {
    /// Its AMQP door, `host:port`.
    pub address: String,
    /// The connection string for it.
    pub connection_string: String,
}

/// The server running on `data_dir`, if one runs there (with an AMQP door).
pub fn local_server(data_dir: &Path) -> Option<Result<LocalServer>> {
    let (host, port, tls) = find(data_dir)?.amqp_endpoint()?;
    Some(
        connection_string(data_dir, LOCAL_POLICY, &host, port, tls).map(|connection_string| {
            LocalServer {
                address: format!("{host}:{port}"),
                connection_string,
            }
        }),
    )
}

/// The connection string for the server running on `data_dir`, if one runs there.
pub fn local_connection_string(data_dir: &Path) -> Option<Result<String>> {
    Some(local_server(data_dir)?.map(|server| server.connection_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_read_back_only_while_the_directory_is_held() {
        let dir = tempfile::tempdir().unwrap();
        let listeners = Listeners {
            pid: 42,
            amqp: Some("127.0.0.1:5999".parse().unwrap()),
            http: Some("0.0.0.0:8099".parse().unwrap()),
            ..Listeners::default()
        };
        write(dir.path(), &listeners).unwrap();
        let text = std::fs::read_to_string(path(dir.path())).unwrap();
        assert_eq!(parse(&text), Some(listeners));
        assert_eq!(find(dir.path()), None, "no lock held: a stale record");
        let lock = std::fs::File::create(dir.path().join("LOCK")).unwrap();
        lock.lock().unwrap();
        assert_eq!(find(dir.path()).map(|l| l.pid), Some(42));
        remove(dir.path());
        assert_eq!(find(dir.path()), None);
    }
}
