//! Event Hubs connection strings: parsing, validation and redaction.
//!
//! A connection string is a `;`-separated list of `Key=Value` pairs, as the Azure portal and the
//! emulator hand them out:
//!
//! ```text
//! Endpoint=sb://myns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=…;EntityPath=orders
//! Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=…;UseDevelopmentEmulator=true
//! ```
//!
//! Keys compare case-insensitively, values keep their case (a key ends in `=`, so only the first
//! `=` of a pair separates), empty pairs (a trailing `;`) are skipped and unknown keys are
//! ignored, as the Azure SDKs do. Credentials are either a key name and key, or a ready-made
//! `SharedAccessSignature`.
//!
//! The secret never leaves this module in text: `Debug` and `Display` print `<redacted>` in its
//! place, and no error message quotes it. [`emulator_connection_string`] writes the form a local
//! hub hands out (the server prints it for its policies).

use std::fmt;

use thiserror::Error;

use crate::limits::CONNECTION_STRING_BYTES_MAX;

/// The AMQP port when TLS is off (`UseDevelopmentEmulator=true`, `amqp://`): the emulator's and a
/// local Tributary hub's.
pub const PORT_PLAIN: u16 = 5672;

/// The AMQP port with TLS (`sb://`, `amqps://`): Azure Event Hubs'.
pub const PORT_TLS: u16 = 5671;

/// The connection string the official SDKs take for the policy `key_name`/`key` on `host:port`,
/// with `UseDevelopmentEmulator=true` so they speak plain TCP (no TLS). It holds the key: print
/// it only where the key may be shown.
pub fn emulator_connection_string(host: &str, port: u16, key_name: &str, key: &str) -> String {
    let host = url_host(host);
    format!(
        "Endpoint=sb://{host}:{port};SharedAccessKeyName={key_name};SharedAccessKey={key};UseDevelopmentEmulator=true"
    )
}

/// A host as an endpoint URL writes it: an IPv6 literal in brackets (`[::1]`), so that a port
/// after it reads as one.
pub fn url_host(host: &str) -> std::borrow::Cow<'_, str> {
    if host.contains(':') && !host.starts_with('[') {
        std::borrow::Cow::Owned(format!("[{host}]"))
    } else {
        std::borrow::Cow::Borrowed(host)
    }
}

/// The connection string the official SDKs take for the policy `key_name`/`key` on `host:port`
/// over TLS (AMQPS), as Azure Event Hubs gives them; the port is left out when it is 5671, the
/// SDKs' default. It holds the key: print it only where the key may be shown.
pub fn tls_connection_string(host: &str, port: u16, key_name: &str, key: &str) -> String {
    let host = url_host(host);
    let endpoint = if port == PORT_TLS {
        host.into_owned()
    } else {
        format!("{host}:{port}")
    };
    format!("Endpoint=sb://{endpoint}/;SharedAccessKeyName={key_name};SharedAccessKey={key}")
}

/// What is wrong with a connection string: which part, and why, in words a person can act on.
/// Never contains the shared access key or signature.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid connection string: {part}: {reason}")]
pub struct ConnectionStringError {
    /// The offending key (`Endpoint`, `SharedAccessKey`, …) or `connection string` as a whole.
    pub part: String,
    /// Why it is refused and what would be accepted.
    pub reason: String,
}

fn invalid(part: &str, reason: impl Into<String>) -> ConnectionStringError {
    ConnectionStringError {
        part: part.to_owned(),
        reason: reason.into(),
    }
}

/// The credentials a connection string carries.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// A shared access policy's name and key; the client signs its own tokens and renews them.
    SharedAccessKey {
        /// The policy name, e.g. `RootManageSharedAccessKey`.
        key_name: String,
        /// The key, used as-is (not base64-decoded) as the HMAC key.
        key: String,
    },
    /// A ready-made token (`SharedAccessSignature sr=…&sig=…&se=…&skn=…`). It cannot be renewed:
    /// once it expires, a client's operations fail as unauthorized.
    SharedAccessSignature(String),
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::SharedAccessKey { key_name, .. } => f
                .debug_struct("SharedAccessKey")
                .field("key_name", key_name)
                .field("key", &"<redacted>")
                .finish(),
            Credential::SharedAccessSignature(_) => f
                .debug_tuple("SharedAccessSignature")
                .field(&"<redacted>")
                .finish(),
        }
    }
}

/// A parsed Event Hubs connection string.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionString {
    scheme: String,
    host: String,
    port: Option<u16>,
    credential: Credential,
    entity_path: Option<String>,
    use_development_emulator: bool,
}

impl ConnectionString {
    /// Parses a connection string; see the module docs for the accepted form.
    pub fn parse(text: &str) -> Result<ConnectionString, ConnectionStringError> {
        if text.len() > CONNECTION_STRING_BYTES_MAX {
            return Err(invalid(
                "connection string",
                format!(
                    "it is {} bytes long; at most {CONNECTION_STRING_BYTES_MAX} are accepted",
                    text.len()
                ),
            ));
        }
        let fields = Fields::split(text)?;
        let endpoint = fields.endpoint.ok_or_else(|| {
            invalid(
                "Endpoint",
                "missing; expected e.g. Endpoint=sb://myns.servicebus.windows.net/",
            )
        })?;
        let (scheme, host, port) = parse_endpoint(endpoint)?;
        let credential = credential(fields.key_name, fields.key, fields.signature)?;
        let entity_path = match fields.entity_path {
            Some("") => {
                return Err(invalid(
                    "EntityPath",
                    "empty; name an event hub or leave EntityPath out",
                ));
            }
            other => other.map(str::to_owned),
        };
        let use_development_emulator = match fields.emulator {
            None => false,
            Some(v) if v.eq_ignore_ascii_case("true") => true,
            Some(v) if v.eq_ignore_ascii_case("false") => false,
            Some(_) => return Err(invalid("UseDevelopmentEmulator", "expected true or false")),
        };
        Ok(ConnectionString {
            scheme,
            host,
            port,
            credential,
            entity_path,
            use_development_emulator,
        })
    }

    /// The namespace's host name, e.g. `myns.servicebus.windows.net` or `localhost`.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The fully qualified namespace: the host name. Part of the key under which the processor
    /// host stores ownership and checkpoints, as in the Azure SDKs.
    pub fn fully_qualified_namespace(&self) -> &str {
        &self.host
    }

    /// The port the endpoint names, if any.
    pub fn explicit_port(&self) -> Option<u16> {
        self.port
    }

    /// The port to connect to: the endpoint's, else 5672 without TLS and 5671 with it.
    pub fn port(&self) -> u16 {
        self.port.unwrap_or(if self.uses_tls() {
            PORT_TLS
        } else {
            PORT_PLAIN
        })
    }

    /// Whether the connection is made over TLS: always, except with
    /// `UseDevelopmentEmulator=true` or an `amqp://` endpoint.
    pub fn uses_tls(&self) -> bool {
        !self.use_development_emulator && self.scheme != "amqp"
    }

    /// The credentials.
    pub fn credential(&self) -> &Credential {
        &self.credential
    }

    /// The event hub the connection string is scoped to (`EntityPath`), if any.
    pub fn entity_path(&self) -> Option<&str> {
        self.entity_path.as_deref()
    }

    /// Whether `UseDevelopmentEmulator=true` was given (plain TCP, port 5672 by default).
    pub fn use_development_emulator(&self) -> bool {
        self.use_development_emulator
    }

    /// The event hub to use: `hub` if given, else `EntityPath`. Both given and different is an
    /// error, as in the Azure SDKs.
    pub fn resolve_hub<'a>(
        &'a self,
        hub: Option<&'a str>,
    ) -> Result<&'a str, ConnectionStringError> {
        match (hub, self.entity_path.as_deref()) {
            (Some(hub), Some(path)) if hub != path => Err(invalid(
                "EntityPath",
                format!("it names event hub {path:?} but {hub:?} was asked for"),
            )),
            (Some(hub), _) => Ok(hub),
            (None, Some(path)) => Ok(path),
            (None, None) => Err(invalid(
                "EntityPath",
                "missing, and no event hub name was given; add EntityPath=<hub> or pass the hub name",
            )),
        }
    }
}

impl fmt::Debug for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionString")
            .field("host", &self.host)
            .field("port", &self.port())
            .field("tls", &self.uses_tls())
            .field("credential", &self.credential)
            .field("entity_path", &self.entity_path)
            .finish()
    }
}

/// The connection string with its secret replaced by `<redacted>`.
impl fmt::Display for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Endpoint={}://{}", self.scheme, url_host(&self.host))?;
        if let Some(port) = self.port {
            write!(f, ":{port}")?;
        }
        f.write_str("/")?;
        match &self.credential {
            Credential::SharedAccessKey { key_name, .. } => write!(
                f,
                ";SharedAccessKeyName={key_name};SharedAccessKey=<redacted>"
            )?,
            Credential::SharedAccessSignature(_) => {
                f.write_str(";SharedAccessSignature=<redacted>")?
            }
        }
        if let Some(path) = &self.entity_path {
            write!(f, ";EntityPath={path}")?;
        }
        if self.use_development_emulator {
            f.write_str(";UseDevelopmentEmulator=true")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for ConnectionString {
    type Err = ConnectionStringError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ConnectionString::parse(s)
    }
}

/// The recognised fields of a connection string, borrowed from it.
#[derive(Default)]
struct Fields<'a> {
    endpoint: Option<&'a str>,
    key_name: Option<&'a str>,
    key: Option<&'a str>,
    signature: Option<&'a str>,
    entity_path: Option<&'a str>,
    emulator: Option<&'a str>,
}

impl<'a> Fields<'a> {
    fn split(text: &'a str) -> Result<Fields<'a>, ConnectionStringError> {
        let mut fields = Fields::default();
        for pair in text.split(';') {
            let pair = pair.trim();
            if pair.is_empty() {
                continue;
            }
            let Some((key, value)) = pair.split_once('=') else {
                // Not echoing the pair: it might be a key pasted without its name.
                return Err(invalid(
                    "connection string",
                    "a part has no '='; expected Key=Value pairs separated by ';'",
                ));
            };
            fields.set(key.trim(), value.trim())?;
        }
        Ok(fields)
    }

    fn set(&mut self, key: &str, value: &'a str) -> Result<(), ConnectionStringError> {
        let (name, slot) = match key.to_ascii_lowercase().as_str() {
            "endpoint" => ("Endpoint", &mut self.endpoint),
            "sharedaccesskeyname" => ("SharedAccessKeyName", &mut self.key_name),
            "sharedaccesskey" => ("SharedAccessKey", &mut self.key),
            "sharedaccesssignature" => ("SharedAccessSignature", &mut self.signature),
            "entitypath" => ("EntityPath", &mut self.entity_path),
            "usedevelopmentemulator" => ("UseDevelopmentEmulator", &mut self.emulator),
            _ => return Ok(()),
        };
        if slot.is_some() {
            return Err(invalid(name, "given more than once"));
        }
        *slot = Some(value);
        Ok(())
    }
}

fn parse_endpoint(endpoint: &str) -> Result<(String, String, Option<u16>), ConnectionStringError> {
    let bad = |reason: String| invalid("Endpoint", reason);
    let Some((scheme, rest)) = endpoint.split_once("://") else {
        return Err(bad(format!(
            "{endpoint:?} has no scheme; expected sb://<host>[:<port>]/"
        )));
    };
    let scheme = scheme.to_ascii_lowercase();
    if !matches!(scheme.as_str(), "sb" | "amqps" | "amqp") {
        return Err(bad(format!(
            "scheme {scheme:?} is not supported; use sb:// (or amqps://, amqp://)"
        )));
    }
    let authority = match rest.split_once('/') {
        Some((authority, "")) => authority,
        Some(_) => {
            return Err(bad(format!(
                "{endpoint:?} has a path; give only the host (and port)"
            )));
        }
        None => rest,
    };
    if authority.contains('@') {
        return Err(bad(
            "credentials belong in SharedAccessKeyName/SharedAccessKey, not in the endpoint"
                .to_owned(),
        ));
    }
    let (host, port) = split_host_port(authority)?;
    if host.is_empty() {
        return Err(bad(format!("{endpoint:?} has no host")));
    }
    let host_ok = host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':' | b'[' | b']'));
    if !host_ok {
        return Err(bad(format!(
            "host {host:?} contains characters a host name cannot have"
        )));
    }
    Ok((scheme, host.to_ascii_lowercase(), port))
}

/// Splits `host[:port]`, with `[v6]:port` for IPv6 literals; an error names the endpoint.
fn split_host_port(authority: &str) -> Result<(&str, Option<u16>), ConnectionStringError> {
    let bad = |reason: String| invalid("Endpoint", reason);
    let (host, port) = if let Some(inner) = authority.strip_prefix('[') {
        let Some((v6, after)) = inner.split_once(']') else {
            return Err(bad(format!(
                "{authority:?}: unclosed '[' in an IPv6 address"
            )));
        };
        match after {
            "" => (v6, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (v6, Some(port)),
                None => {
                    return Err(bad(format!("{authority:?}: expected ':<port>' after ']'")));
                }
            },
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        None => None,
        Some(text) => match text.parse::<u16>() {
            Ok(port) if port > 0 => Some(port),
            _ => {
                return Err(bad(format!(
                    "port {text:?} is not a number from 1 to 65535"
                )));
            }
        },
    };
    Ok((host, port))
}

fn credential(
    key_name: Option<&str>,
    key: Option<&str>,
    signature: Option<&str>,
) -> Result<Credential, ConnectionStringError> {
    match (key_name, key, signature) {
        (_, _, Some(_)) if key.is_some() => Err(invalid(
            "SharedAccessSignature",
            "given together with SharedAccessKey; give one or the other",
        )),
        (_, _, Some("")) => Err(invalid("SharedAccessSignature", "empty")),
        (_, _, Some(signature)) => Ok(Credential::SharedAccessSignature(signature.to_owned())),
        (Some(""), Some(_), None) => Err(invalid("SharedAccessKeyName", "empty")),
        (Some(_), Some(""), None) => Err(invalid("SharedAccessKey", "empty")),
        (Some(name), Some(key), None) => Ok(Credential::SharedAccessKey {
            key_name: name.to_owned(),
            key: key.to_owned(),
        }),
        (Some(_), None, None) => Err(invalid(
            "SharedAccessKey",
            "missing; SharedAccessKeyName needs its SharedAccessKey",
        )),
        (None, Some(_), None) => Err(invalid(
            "SharedAccessKeyName",
            "missing; SharedAccessKey needs the name of its policy",
        )),
        (None, None, None) => Err(invalid(
            "SharedAccessKey",
            "no credentials; give SharedAccessKeyName and SharedAccessKey, or SharedAccessSignature",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "c2VjcmV0LWtleS1ub3QtdG8tYmUtcHJpbnRlZA==";

    fn parse(text: &str) -> Result<ConnectionString, ConnectionStringError> {
        ConnectionString::parse(text)
    }

    #[test]
    fn the_emulator_form_parses() {
        let cs = parse(&emulator_connection_string("127.0.0.1", 5999, "root", KEY)).unwrap();
        assert_eq!(
            (cs.host(), cs.port(), cs.uses_tls()),
            ("127.0.0.1", 5999, false)
        );
        assert!(cs.use_development_emulator());
        assert_eq!(
            cs.credential(),
            &Credential::SharedAccessKey {
                key_name: "root".into(),
                key: KEY.into()
            }
        );
    }

    #[test]
    fn parses_an_azure_connection_string() {
        let cs = parse(&format!(
            "Endpoint=sb://myns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={KEY};EntityPath=orders"
        ))
        .unwrap();
        assert_eq!(cs.host(), "myns.servicebus.windows.net");
        assert_eq!(cs.port(), 5671);
        assert!(cs.uses_tls());
        assert_eq!(cs.entity_path(), Some("orders"));
        assert_eq!(
            cs.credential(),
            &Credential::SharedAccessKey {
                key_name: "RootManageSharedAccessKey".to_owned(),
                key: KEY.to_owned()
            }
        );
        assert_eq!(cs.resolve_hub(None).unwrap(), "orders");
        assert_eq!(cs.resolve_hub(Some("orders")).unwrap(), "orders");
        assert!(cs.resolve_hub(Some("other")).is_err());
    }

    #[test]
    fn parses_the_emulator_form_with_and_without_port() {
        let cs = parse(&format!(
            "Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={KEY};UseDevelopmentEmulator=true;"
        ))
        .unwrap();
        assert!(!cs.uses_tls());
        assert_eq!(cs.port(), 5672);
        assert!(cs.use_development_emulator());
        let cs = parse(&format!(
            "endpoint=SB://LocalHost:6765/;sharedaccesskeyname=k;sharedaccesskey={KEY};usedevelopmentemulator=TRUE"
        ))
        .unwrap();
        assert_eq!(cs.host(), "localhost");
        assert_eq!(cs.port(), 6765);
        assert_eq!(cs.explicit_port(), Some(6765));
        let cs = parse(&format!(
            "Endpoint=sb://[::1]:6000;SharedAccessKeyName=k;SharedAccessKey={KEY}"
        ))
        .unwrap();
        assert_eq!(cs.host(), "::1");
        assert_eq!(cs.port(), 6000);
        // Written back (and made) with the brackets, so the port still reads as one.
        let again = parse(&cs.to_string()).unwrap();
        assert_eq!((again.host(), again.port()), ("::1", 6000));
        let made = emulator_connection_string("::1", 6001, "k", KEY);
        assert_eq!(parse(&made).unwrap().port(), 6001);
        let made = tls_connection_string("::1", 5671, "k", KEY);
        assert_eq!(parse(&made).unwrap().host(), "::1");
    }

    #[test]
    fn accepts_a_shared_access_signature() {
        let cs = parse(
            "Endpoint=sb://h/;SharedAccessSignature=SharedAccessSignature sr=a&sig=b&se=1&skn=c",
        )
        .unwrap();
        assert!(
            matches!(cs.credential(), Credential::SharedAccessSignature(s) if s.ends_with("skn=c"))
        );
    }

    #[test]
    fn names_the_bad_part() {
        let cases: &[(&str, &str)] = &[
            ("SharedAccessKeyName=a;SharedAccessKey=b", "Endpoint"),
            (
                "Endpoint=localhost;SharedAccessKeyName=a;SharedAccessKey=b",
                "Endpoint",
            ),
            (
                "Endpoint=http://h/;SharedAccessKeyName=a;SharedAccessKey=b",
                "Endpoint",
            ),
            (
                "Endpoint=sb://h:99999/;SharedAccessKeyName=a;SharedAccessKey=b",
                "Endpoint",
            ),
            (
                "Endpoint=sb://h/x;SharedAccessKeyName=a;SharedAccessKey=b",
                "Endpoint",
            ),
            (
                "Endpoint=sb:///;SharedAccessKeyName=a;SharedAccessKey=b",
                "Endpoint",
            ),
            ("Endpoint=sb://h/;SharedAccessKeyName=a", "SharedAccessKey"),
            ("Endpoint=sb://h/;SharedAccessKey=b", "SharedAccessKeyName"),
            ("Endpoint=sb://h/", "SharedAccessKey"),
            (
                "Endpoint=sb://h/;SharedAccessKeyName=a;SharedAccessKey=b;EntityPath=",
                "EntityPath",
            ),
            (
                "Endpoint=sb://h/;SharedAccessKeyName=a;SharedAccessKey=b;UseDevelopmentEmulator=yes",
                "UseDevelopmentEmulator",
            ),
            (
                "Endpoint=sb://h/;Endpoint=sb://g/;SharedAccessKeyName=a;SharedAccessKey=b",
                "Endpoint",
            ),
            ("Endpoint=sb://h/;justtext", "connection string"),
        ];
        for (text, part) in cases {
            let err = parse(text).unwrap_err();
            assert_eq!(err.part, *part, "{text}: {err}");
        }
    }

    #[test]
    fn never_prints_the_secret() {
        let text = format!("Endpoint=sb://h/;SharedAccessKeyName=policy;SharedAccessKey={KEY}");
        let cs = parse(&text).unwrap();
        for shown in [
            format!("{cs}"),
            format!("{cs:?}"),
            format!("{:?}", cs.credential()),
        ] {
            assert!(!shown.contains(KEY), "{shown}");
            assert!(shown.contains("<redacted>"), "{shown}");
        }
        assert_eq!(
            cs.to_string(),
            "Endpoint=sb://h/;SharedAccessKeyName=policy;SharedAccessKey=<redacted>"
        );
        // Errors never quote the key either, even when it is where something else should be.
        let err = parse(&format!("Endpoint=sb://h/;{KEY}")).unwrap_err();
        assert!(!err.to_string().contains(KEY));
        let sas = "SharedAccessSignature sr=a&sig=SECRETSIG&se=1&skn=c";
        let cs = parse(&format!("Endpoint=sb://h/;SharedAccessSignature={sas}")).unwrap();
        assert!(!format!("{cs} {cs:?}").contains("SECRETSIG"));
    }

    #[test]
    fn display_round_trips_apart_from_the_secret() {
        let cs = parse(&format!(
            "Endpoint=sb://localhost:5672;SharedAccessKeyName=k;SharedAccessKey={KEY};EntityPath=eh1;UseDevelopmentEmulator=true"
        ))
        .unwrap();
        let again = parse(&cs.to_string()).unwrap();
        assert_eq!(again.host(), cs.host());
        assert_eq!(again.port(), cs.port());
        assert_eq!(again.entity_path(), cs.entity_path());
        assert_eq!(again.uses_tls(), cs.uses_tls());
    }

    #[test]
    fn parsing_never_panics() {
        proptest::proptest!(|(text in ".{0,200}")| {
            let _ = ConnectionString::parse(&text);
        });
        proptest::proptest!(|(
            endpoint in "[a-zA-Z]{0,6}://[a-z0-9:\\[\\]./@-]{0,30}",
            extra in "[a-zA-Z=; ]{0,40}",
        )| {
            let _ = ConnectionString::parse(&format!("Endpoint={endpoint};SharedAccessKeyName=a;SharedAccessKey=b;{extra}"));
        });
    }
}
