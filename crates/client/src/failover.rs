//! Hub aliases: a client names its hub through an alias that resolves to the active endpoint,
//! and moves to another endpoint when the alias changes or the active one keeps failing
//! (geo-disaster recovery between replicated hubs, as the Event Hubs federation guidance
//! describes it).
//!
//! # Naming an alias
//!
//! The connection string still carries the credentials (`SharedAccessKeyName`/`SharedAccessKey`
//! or a signature), the transport (`UseDevelopmentEmulator=true` for plain TCP, else TLS) and,
//! in `Endpoint`, the namespace's *home* name; with an alias that name is the client's identity
//! ([`crate::ProducerClient::fully_qualified_namespace`], and so the processor host's
//! checkpoint key) but never where it connects. The key is applied to whatever endpoint the
//! alias names; the alias itself never holds a secret. Set it in the Rust API with
//! [`ClientOptions::with_failover`](crate::ClientOptions::with_failover) and on the command
//! line with `--alias-file PATH` or `--alias-srv NAME [--dns-server IP:PORT]`.
//!
//! - [`HubAlias::File`]: a text file whose first line that is not blank nor a `#` comment is
//!   `host[:port]` (an optional `sb://`, `amqp://` or `amqps://` in front and a trailing `/` are
//!   allowed). Anything that looks like a connection string or a key (`;`, `=`, `@`) is refused.
//!   The client polls the file ([`FailoverOptions::poll_interval`]) and switches as soon as it
//!   names another endpoint. `tributary failover switch` rewrites it atomically (a temporary
//!   file renamed over it, [`write_alias_file`]), so a reader never sees half a line.
//! - [`HubAlias::Srv`]: the DNS SRV records `_azure_eventhub._amqp.<name>` (a name that already
//!   starts with `_` is queried as given). Records are tried lowest priority first and, within a
//!   priority, in the weighted random order of RFC 2782; records for port 443 (AMQP over
//!   WebSockets, which this client does not speak) and the "no service" target `.` are skipped.
//!   Each target's addresses are resolved through the same name server, which is the system's
//!   (`/etc/resolv.conf`) unless [`HubAlias::Srv::name_server`] names one (private DNS, tests).
//!
//! A port the alias leaves out is the connection string's default: 5671 with TLS, 5672
//! without.
//!
//! # Switching
//!
//! - **On a change of the alias file**, within one poll interval the client closes its
//!   connection (logging why at `warn`); the next operation connects to the new endpoint.
//! - **On persistent errors**: after [`FailoverOptions::failures_before_switch`] consecutive
//!   failed connection attempts, or once [`FailoverOptions::unavailable_after`] has passed
//!   without a working connection, the next connection attempt resolves the alias again and
//!   takes the first candidate that accepts a connection (logging the switch at `warn`).
//!
//! A switch is a reconnect, with a reconnect's guarantees: sends in flight on the old connection
//! fail with [`ClientError::ConnectionLost`] (they may or may not have been stored, as with any
//! lost connection; an acknowledged send was stored by the old hub), receivers on it end and
//! are reopened by their owner (the processor host does), and the first operation after the
//! switch goes to the new endpoint. Offsets differ between hubs unless one replicates the other
//! with the same sequence numbers; positioning a consumer on the replica is the caller's (or its
//! checkpoint store's) business.

mod srv;

pub use srv::SRV_PREFIX;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::ClientError;

/// Where a client looks up the active endpoint of its hub. See the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HubAlias {
    /// A file holding `host[:port]`, re-read when it changes.
    File(PathBuf),
    /// DNS SRV records `_azure_eventhub._amqp.<name>`.
    Srv {
        /// The alias's domain name (or the full SRV name when it starts with `_`).
        name: String,
        /// The DNS server to ask (UDP and TCP); the system's when `None`.
        name_server: Option<SocketAddr>,
    },
}

impl fmt::Display for HubAlias {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HubAlias::File(path) => write!(f, "alias file {}", path.display()),
            HubAlias::Srv { name, .. } => write!(f, "DNS SRV alias {}", srv::query_name(name)),
        }
    }
}

/// How a client follows a [`HubAlias`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailoverOptions {
    /// The alias.
    pub alias: HubAlias,
    /// Consecutive failed connection attempts after which the alias is resolved again
    /// (at least 1; default 3).
    pub failures_before_switch: u32,
    /// How long without a working connection before the alias is resolved again, whatever
    /// the count (default 10 s).
    pub unavailable_after: Duration,
    /// How often an alias file is checked for a change (default 250 ms).
    pub poll_interval: Duration,
}

impl FailoverOptions {
    /// Following `alias` with the default thresholds.
    pub fn new(alias: HubAlias) -> Self {
        FailoverOptions {
            alias,
            failures_before_switch: 3,
            unavailable_after: Duration::from_secs(10),
            poll_interval: Duration::from_millis(250),
        }
    }

    /// Following the alias file `path`.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self::new(HubAlias::File(path.into()))
    }

    /// Following the DNS SRV alias `name`, asking `name_server` (the system's when `None`).
    pub fn srv(name: impl Into<String>, name_server: Option<SocketAddr>) -> Self {
        Self::new(HubAlias::Srv {
            name: name.into(),
            name_server,
        })
    }

    /// With another count of failed connection attempts before re-resolving.
    pub fn with_failures_before_switch(mut self, failures: u32) -> Self {
        self.failures_before_switch = failures;
        self
    }

    /// With another time without a connection before re-resolving.
    pub fn with_unavailable_after(mut self, after: Duration) -> Self {
        self.unavailable_after = after;
        self
    }

    /// With another poll interval for an alias file.
    pub fn with_poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Checks the options as connecting would: a count of at least 1, a poll interval above
    /// zero, a DNS name an SRV query can take.
    pub fn check(&self) -> Result<(), ClientError> {
        let invalid = |what: &str| Err(ClientError::InvalidArgument(what.to_owned()));
        if self.failures_before_switch == 0 {
            return invalid("failover: failures_before_switch must be at least 1");
        }
        if self.poll_interval.is_zero() {
            return invalid("failover: poll_interval must be longer than zero");
        }
        if let HubAlias::Srv { name, .. } = &self.alias {
            srv::check_name(name)?;
        }
        Ok(())
    }
}

/// One endpoint an alias names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AliasEndpoint {
    /// The host name (or IP address) the hub answers as: the TLS name and the SAS audience.
    pub host: String,
    /// The port; the connection string's default when `None`.
    pub port: Option<u16>,
    /// Addresses to connect to, as the alias's DNS server gave them for `host`; empty to
    /// resolve `host` the usual way.
    pub addresses: Vec<IpAddr>,
}

impl AliasEndpoint {
    /// `host` on `port`, resolved the usual way.
    pub fn new(host: impl Into<String>, port: Option<u16>) -> Self {
        AliasEndpoint {
            host: host.into(),
            port,
            addresses: Vec::new(),
        }
    }

    /// Whether `other` is the same host and port (the addresses may differ between lookups).
    pub fn same_place(&self, other: &AliasEndpoint) -> bool {
        self.host.eq_ignore_ascii_case(&other.host) && self.port == other.port
    }
}

impl fmt::Display for AliasEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bracketed = self.host.contains(':');
        match (self.port, bracketed) {
            (Some(port), true) => write!(f, "[{}]:{port}", self.host),
            (Some(port), false) => write!(f, "{}:{port}", self.host),
            (None, _) => f.write_str(&self.host),
        }
    }
}

impl std::str::FromStr for AliasEndpoint {
    type Err = ClientError;

    /// Parses `host[:port]` (IPv6 in brackets), optionally after `sb://`, `amqp://` or
    /// `amqps://` and before a trailing `/`.
    fn from_str(text: &str) -> Result<Self, ClientError> {
        parse_endpoint(text)
    }
}

fn parse_endpoint(text: &str) -> Result<AliasEndpoint, ClientError> {
    let bad = |why: &str| {
        Err(ClientError::InvalidArgument(format!(
            "{why}; an alias endpoint is host[:port], e.g. hub-b.example.com:5671"
        )))
    };
    let text = text.trim();
    if text.contains([';', '=', '@']) {
        // Never echo it: it may be a connection string with its key.
        return bad("this looks like a connection string or a secret, which an alias never holds");
    }
    let text = ["sb://", "amqps://", "amqp://"]
        .iter()
        .find_map(|scheme| text.strip_prefix(scheme))
        .unwrap_or(text);
    let text = text.strip_suffix('/').unwrap_or(text);
    if text.contains('/') {
        return bad(&format!("{text:?} has a path"));
    }
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else {
            return bad(&format!("{text:?} opens a '[' it does not close"));
        };
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return bad(&format!("{text:?} has text after ']'")),
        }
    } else {
        match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'));
    if !host_ok || (host.contains(':') && host.parse::<std::net::Ipv6Addr>().is_err()) {
        return bad(&format!("{host:?} is not a host name or IP address"));
    }
    let port = match port.map(str::parse::<u16>) {
        None => None,
        Some(Ok(port)) if port > 0 => Some(port),
        Some(_) => return bad(&format!("{text:?} has no valid port (1 to 65535)")),
    };
    Ok(AliasEndpoint::new(host, port))
}

/// Reads the endpoint an alias file names (see the module docs for the format).
pub fn read_alias_file(path: &Path) -> Result<AliasEndpoint, ClientError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ClientError::InvalidArgument(format!(
            "cannot read the alias file {}: {e}",
            path.display()
        ))
    })?;
    let line = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'));
    let Some(line) = line else {
        return Err(ClientError::InvalidArgument(format!(
            "the alias file {} names no endpoint",
            path.display()
        )));
    };
    parse_endpoint(line).map_err(|e| match e {
        ClientError::InvalidArgument(why) => {
            ClientError::InvalidArgument(format!("alias file {}: {why}", path.display()))
        }
        other => other,
    })
}

/// Points the alias file `path` at `endpoint`: writes a temporary file next to it, flushes it
/// to disk and renames it over `path`, so readers see the old or the new endpoint, never part
/// of one.
pub fn write_alias_file(path: &Path, endpoint: &AliasEndpoint) -> Result<(), ClientError> {
    let io = |what: &str, e: std::io::Error| {
        ClientError::InvalidArgument(format!("{what} {}: {e}", path.display()))
    };
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| ClientError::InvalidArgument(format!("{} names no file", path.display())))?;
    let mut temporary_name = std::ffi::OsString::from(".");
    temporary_name.push(name);
    temporary_name.push(format!(".{}.tmp", uuid::Uuid::new_v4().simple()));
    let temporary = dir.join(temporary_name);
    let written = (|| {
        use std::io::Write;
        let mut file = std::fs::File::create(&temporary)?;
        writeln!(file, "{endpoint}")?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(io("cannot rewrite the alias file", e));
    }
    // The rename is durable once the directory is.
    if let Ok(dir) = std::fs::File::open(dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// The candidate endpoints of `alias`, in the order to try them.
pub async fn resolve(alias: &HubAlias) -> Result<Vec<AliasEndpoint>, ClientError> {
    match alias {
        HubAlias::File(path) => Ok(vec![read_alias_file(path)?]),
        HubAlias::Srv { name, name_server } => srv::lookup(name, *name_server).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse() {
        let parsed = |text: &str| parse_endpoint(text).map(|e| (e.host, e.port));
        assert_eq!(
            parsed("hub-b.example.com"),
            Ok(("hub-b.example.com".into(), None))
        );
        assert_eq!(
            parsed(" 127.0.0.1:5672 "),
            Ok(("127.0.0.1".into(), Some(5672)))
        );
        assert_eq!(
            parsed("sb://ns.servicebus.windows.net/"),
            Ok(("ns.servicebus.windows.net".into(), None))
        );
        assert_eq!(parsed("amqp://h:1"), Ok(("h".into(), Some(1))));
        assert_eq!(parsed("[::1]:5671"), Ok(("::1".into(), Some(5671))));
        assert_eq!(parsed("[::1]"), Ok(("::1".into(), None)));
        for bad in [
            "",
            "Endpoint=sb://h;SharedAccessKeyName=a;SharedAccessKey=s3kr1t",
            "user@h",
            "h:0",
            "h:99999",
            "h:x",
            "h/hub",
            "h h",
            "[::1",
            "::1",
            "[::1]x",
        ] {
            let error = parse_endpoint(bad).unwrap_err().to_string();
            assert!(!error.contains("s3kr1t"), "{error}");
        }
    }

    #[test]
    fn endpoints_print_as_they_parse() {
        for text in ["h", "h:5672", "[::1]:5671", "10.0.0.1:1"] {
            assert_eq!(parse_endpoint(text).unwrap().to_string(), text);
        }
    }

    #[test]
    fn alias_files_round_trip_and_skip_comments() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("alias");
        std::fs::write(&path, "# the active hub\n\n  hub-a:5672\nhub-b:5672\n").unwrap();
        assert_eq!(
            read_alias_file(&path).unwrap(),
            AliasEndpoint::new("hub-a", Some(5672))
        );
        write_alias_file(&path, &AliasEndpoint::new("hub-b", None)).unwrap();
        assert_eq!(
            read_alias_file(&path).unwrap(),
            AliasEndpoint::new("hub-b", None)
        );
        // No temporary file is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        std::fs::write(&path, "# nothing\n").unwrap();
        assert!(read_alias_file(&path).is_err());
        assert!(read_alias_file(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn options_are_checked() {
        assert!(FailoverOptions::file("f").check().is_ok());
        assert!(
            FailoverOptions::file("f")
                .with_failures_before_switch(0)
                .check()
                .is_err()
        );
        assert!(
            FailoverOptions::file("f")
                .with_poll_interval(Duration::ZERO)
                .check()
                .is_err()
        );
        assert!(FailoverOptions::srv("bad name", None).check().is_err());
        assert!(FailoverOptions::srv("eh.example.com", None).check().is_ok());
    }
}
