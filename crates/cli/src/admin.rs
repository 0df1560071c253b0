//! Where `tributary hub` and `tributary group` work ([`Catalog`]): on the data directory, or
//! through a running server's admin API (`/admin/v1` on its HTTP door): the hub
//! `--connection-string` names (at `--admin-url`, plain HTTP or HTTPS verified as the AMQP
//! connections are, `--ca-file` included), or the `tributary serve` holding the data
//! directory (at the address its `server.json` records: its HTTP door, else its HTTPS one). Requests carry a short-lived SAS token
//! for the whole namespace, signed with the connection string's key or the data directory's
//! Manage policy (the Event Hubs REST scheme). The server changes the hubs; this process never
//! opens a data directory a server holds.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, header};
use serde_json::Value;
use tributary_amqp::{AccessPolicies, Right};

use serde_json::json;
use tributary_broker::{Broker, HubSpec, HubUpdate};
use tributary_capture::CaptureDescription;
use tributary_http::retention::{RetentionDescription, hours, minutes, policy_name};

use crate::args::{AdminArgs, GlobalArgs, PositionArg};
use crate::hub_handle::open_broker;
use crate::output::HubView;
use crate::running;

/// How long a request's token is valid, and how long a request may take.
const TOKEN_LIFETIME: Duration = Duration::from_secs(300);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The HTTP door's port when the user names none (`serve --http-port`'s default).
const ADMIN_PORT_DEFAULT: u16 = 8080;
/// Where `tributary cert` keeps its development authority, in the data directory.
const DEVELOPMENT_AUTHORITY: &str = "tls/ca.pem";
/// The HTTPS door's (`serve --https-port`'s default).
const ADMIN_TLS_PORT_DEFAULT: u16 = 8443;

/// A token for the whole namespace (any host, no path), valid for [`TOKEN_LIFETIME`].
fn namespace_token(host: &str, key_name: &str, key: &str) -> String {
    let expiry = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
        + TOKEN_LIFETIME.as_secs();
    tributary_eventhubs::sas::sign(&format!("sb://{host}/"), key_name, key, expiry)
}

/// The admin API of a running server.
#[derive(Debug)]
pub struct Admin {
    addr: SocketAddr,
    /// The `host` header: the host and port as the user named them.
    host: String,
    /// `Some` for an HTTPS door.
    tls: Option<AdminTls>,
    token: String,
}

/// How an HTTPS admin API is verified.
#[derive(Debug)]
struct AdminTls {
    /// The name the server's certificate must carry: the URL's host.
    server_name: String,
    /// Authorities to trust besides the usual roots (`--ca-file`).
    trusted: Option<PathBuf>,
}

/// Where `--admin-url` points: `http://host[:port]`, `https://host[:port]` or `host[:port]`
/// (plain HTTP); the default ports are `serve`'s. Returns `host:port` and, for HTTPS, the
/// host alone (the certificate's name).
fn parse_admin_url(url: &str) -> Result<(String, Option<String>)> {
    let uri: hyper::Uri = url
        .parse()
        .with_context(|| format!("--admin-url {url}: not a URL (http://host:port)"))?;
    let tls = match uri.scheme_str() {
        None | Some("http") => false,
        Some("https") => true,
        Some(other) => bail!("--admin-url {url}: the scheme is {other}, not http or https"),
    };
    let host = uri
        .host()
        .filter(|h| !h.is_empty())
        .with_context(|| format!("--admin-url {url}: no host"))?;
    let default_port = if tls {
        ADMIN_TLS_PORT_DEFAULT
    } else {
        ADMIN_PORT_DEFAULT
    };
    let host_port = format!("{host}:{}", uri.port_u16().unwrap_or(default_port));
    let name = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    Ok((host_port, tls.then_some(name)))
}

impl Admin {
    /// The admin API of the server running on `data_dir`, if one runs there: its plain HTTP
    /// door, else its HTTPS door as `localhost` (the name `serve` gives its TLS connection
    /// strings), trusting `trusted` or else the development authority `tributary cert` keeps in
    /// the data directory.
    pub fn find(data_dir: &Path, trusted: Option<&Path>) -> Option<Result<Admin>> {
        let listeners = running::find(data_dir)?;
        Some(Admin::for_server(data_dir, &listeners, trusted))
    }

    fn for_server(
        data_dir: &Path,
        listeners: &running::Listeners,
        trusted: Option<&Path>,
    ) -> Result<Admin> {
        let (mut addr, tls) = match (listeners.http, listeners.https) {
            (Some(addr), _) => (addr, None),
            (None, Some(addr)) => {
                let authority = data_dir.join(DEVELOPMENT_AUTHORITY);
                let trusted = trusted
                    .map(Path::to_owned)
                    .or_else(|| authority.exists().then_some(authority));
                let tls = AdminTls {
                    server_name: "localhost".to_owned(),
                    trusted,
                };
                (addr, Some(tls))
            }
            (None, None) => bail!(
                "the tributary serve running on {} (pid {}) has no HTTP door, which hub and group changes go through",
                data_dir.display(),
                listeners.pid
            ),
        };
        if addr.ip().is_unspecified() {
            addr.set_ip(Ipv4Addr::LOCALHOST.into());
        }
        let policies = AccessPolicies::load_or_create(data_dir)
            .context("cannot load the shared access policies")?
            .0;
        let policy = policies
            .policies()
            .into_iter()
            .find(|p| p.allows(Right::Manage))
            .context("no shared access policy has the Manage right")?;
        Ok(Admin {
            addr,
            host: addr.to_string(),
            tls,
            token: namespace_token(&addr.to_string(), &policy.name, &policy.key),
        })
    }

    /// The admin API of the hub `connection_string` names: at `admin_url`, or on the
    /// connection string's host at the HTTP door's default port. An HTTPS door's certificate
    /// is verified against the usual roots and the authorities in `trusted`.
    pub async fn remote(
        connection_string: &str,
        admin_url: Option<&str>,
        trusted: Option<&Path>,
    ) -> Result<Admin> {
        let cs = tributary_client::ConnectionString::parse(connection_string)?;
        let (host, tls_name) = match admin_url {
            Some(url) => parse_admin_url(url)?,
            None => (format!("{}:{ADMIN_PORT_DEFAULT}", cs.host()), None),
        };
        let addr = tokio::net::lookup_host(&host)
            .await
            .ok()
            .and_then(|mut addrs| addrs.next())
            .with_context(|| format!("cannot resolve the admin API's address {host:?}"))?;
        let token = match cs.credential() {
            tributary_client::Credential::SharedAccessKey { key_name, key } => {
                namespace_token(&host, key_name, key)
            }
            tributary_client::Credential::SharedAccessSignature(token) => token.clone(),
        };
        let tls = tls_name.map(|server_name| AdminTls {
            server_name,
            trusted: trusted.map(Path::to_owned),
        });
        Ok(Admin {
            addr,
            host,
            tls,
            token,
        })
    }

    /// Sends a request; the answer's JSON (null for an empty answer). A refusal is an error
    /// with the server's message alone.
    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let what = format!("{method} {scheme}://{}{path}", self.host);
        let answer = tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(method, path, body))
            .await
            .with_context(|| format!("{what}: no answer in {} s", REQUEST_TIMEOUT.as_secs()))?
            .with_context(|| {
                format!("cannot reach the hub's admin API ({what}; --admin-url names another)")
            })?;
        answer.map_err(anyhow::Error::msg)
    }

    /// The answer, or the refusal's message.
    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Result<Value, String>> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.host)
            .header(header::AUTHORIZATION, &self.token)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let stream = tokio::net::TcpStream::connect(self.addr).await?;
        let response = match &self.tls {
            None => send(stream, request).await?,
            Some(tls) => {
                let stream = tributary_client::tls_handshake(
                    stream,
                    &tls.server_name,
                    tls.trusted.as_deref(),
                )
                .await
                .map_err(|e| {
                    anyhow::anyhow!("{e} (an authority of your own is trusted with --ca-file)")
                })?;
                send(stream, request).await?
            }
        };
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        let json: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).context("the answer is not JSON")?
        };
        if !status.is_success() {
            let message = json["message"].as_str().unwrap_or("no message");
            return Ok(Err(format!("{message} ({status})")));
        }
        Ok(Ok(json))
    }
}

/// One HTTP/1.1 exchange on a fresh connection.
async fn send<S>(
    stream: S,
    request: Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(connection);
    Ok(sender.send_request(request).await?)
}

/// Where `hub` and `group` change hubs and groups: the data directory itself, or the server
/// that holds it.
pub enum Catalog {
    /// The broker in this process, on the data directory.
    Local(Broker),
    /// The running server's admin API.
    Server(Admin),
}

/// Where the admin API of the server running on `data_dir` listens, when `connection_string`
/// names that server (its plain AMQP door, on this machine): its HTTP door need not be on the
/// default port (`--http-port 0`, say). The connection string's own credential is still the
/// one used.
fn running_admin_url(data_dir: &Path, connection_string: &str) -> Option<String> {
    let cs = tributary_client::ConnectionString::parse(connection_string).ok()?;
    let listeners = running::find(data_dir)?;
    let local = matches!(cs.host(), "localhost" | "127.0.0.1" | "::1" | "[::1]");
    let same = listeners.amqp.is_some_and(|amqp| amqp.port() == cs.port());
    let http = listeners.http.filter(|_| local && same)?;
    Some(format!("http://127.0.0.1:{}", http.port()))
}

/// One line of `hub list`: name, partitions, consumer groups.
pub type HubLine = (String, u64, usize);

impl Catalog {
    /// The hub `remote` names, else the server running on the data directory if there is
    /// one, else the data directory.
    pub async fn open(global: &GlobalArgs, remote: &AdminArgs) -> Result<Catalog> {
        if let Some(cs) = &remote.connection_string {
            let admin_url = match &remote.admin_url {
                Some(url) => Some(url.clone()),
                None => running_admin_url(&global.data_dir, cs),
            };
            let admin = Admin::remote(cs, admin_url.as_deref(), global.ca_file.as_deref()).await?;
            return Ok(Catalog::Server(admin));
        }
        match Admin::find(&global.data_dir, global.ca_file.as_deref()) {
            Some(admin) => Ok(Catalog::Server(admin?)),
            None => Ok(Catalog::Local(open_broker(global).await?)),
        }
    }

    /// Creates a hub; its name as stored and its partition count.
    pub async fn create_hub(&self, spec: HubSpec) -> Result<(String, u64)> {
        match self {
            Catalog::Local(broker) => {
                let hub = broker.create_hub(spec).await?;
                Ok((hub.name, u64::from(hub.partition_count)))
            }
            Catalog::Server(admin) => {
                let mut body = json!({ "name": spec.name, "partitionCount": spec.partition_count });
                match spec.retention_age_ms {
                    Some(ms) => body["retentionMs"] = json!(ms),
                    None => body["retentionForever"] = json!(true),
                }
                if let Some(bytes) = spec.retention_bytes_max {
                    body["retentionBytesMax"] = json!(bytes);
                }
                body["retentionDescription"] =
                    json!(RetentionDescription::of_cleanup(spec.cleanup));
                if let Some(capture) = &spec.capture {
                    body["captureDescription"] = json!(CaptureDescription::of(Some(capture)));
                }
                let hub = admin.call(Method::POST, HUBS, Some(body)).await?;
                let (name, partitions, _) = hub_line(&hub)?;
                Ok((name, partitions))
            }
        }
    }

    /// Changes a hub's retention and cleanup settings, and its capture as `capture` says.
    pub async fn update_hub(
        &self,
        name: &str,
        update: &HubUpdate,
        capture: Option<&CaptureDescription>,
    ) -> Result<()> {
        match self {
            Catalog::Local(broker) => {
                let mut update = update.clone();
                if let Some(description) = capture {
                    let current = broker.describe_hub(name)?;
                    update.capture =
                        Some(description.apply(&current.name, current.capture.as_ref())?);
                }
                broker.update_hub(name, update).await.map(drop)?;
            }
            Catalog::Server(admin) => {
                let path = format!("{HUBS}/{}", segment(name));
                let mut body = update_body(update);
                if let Some(description) = capture {
                    body["captureDescription"] = json!(description);
                }
                admin
                    .call(Method::PATCH, &path, Some(body))
                    .await
                    .map(drop)?;
            }
        }
        Ok(())
    }

    /// Every hub.
    pub async fn list_hubs(&self) -> Result<Vec<HubLine>> {
        match self {
            Catalog::Local(broker) => Ok(broker
                .list_hubs()
                .into_iter()
                .map(|h| {
                    let groups = h.consumer_groups.len();
                    (h.name, u64::from(h.partition_count), groups)
                })
                .collect()),
            Catalog::Server(admin) => {
                let answer = admin.call(Method::GET, HUBS, None).await?;
                let hubs = answer["hubs"].as_array().map_or(&[][..], Vec::as_slice);
                hubs.iter().map(hub_line).collect()
            }
        }
    }

    /// A hub with its partitions.
    pub async fn show_hub(&self, name: &str) -> Result<HubView> {
        match self {
            Catalog::Local(broker) => HubView::local(broker, &broker.describe_hub(name)?),
            Catalog::Server(admin) => {
                let path = format!("{HUBS}/{}", segment(name));
                HubView::from_admin(&admin.call(Method::GET, &path, None).await?)
            }
        }
    }

    /// Deletes a hub.
    pub async fn delete_hub(&self, name: &str) -> Result<()> {
        match self {
            Catalog::Local(broker) => {
                broker.delete_hub(name).await?;
                // No server follows the hub with its policies here: they go with it now.
                crate::policy::forget_hub(&broker.config().data_dir, name)
            }
            Catalog::Server(admin) => {
                let path = format!("{HUBS}/{}", segment(name));
                admin.call(Method::DELETE, &path, None).await.map(drop)
            }
        }
    }

    /// Creates a consumer group.
    pub async fn create_group(&self, hub: &str, name: &str) -> Result<()> {
        match self {
            Catalog::Local(broker) => {
                broker.create_consumer_group(hub, name).await?;
                Ok(())
            }
            Catalog::Server(admin) => {
                let path = format!("{HUBS}/{}/consumergroups", segment(hub));
                let body = json!({ "name": name });
                admin.call(Method::POST, &path, Some(body)).await.map(drop)
            }
        }
    }

    /// A hub's consumer groups.
    pub async fn list_groups(&self, hub: &str) -> Result<Vec<String>> {
        match self {
            Catalog::Local(broker) => Ok(broker
                .list_consumer_groups(hub)?
                .into_iter()
                .map(|g| g.name)
                .collect()),
            Catalog::Server(admin) => {
                let path = format!("{HUBS}/{}/consumergroups", segment(hub));
                let answer = admin.call(Method::GET, &path, None).await?;
                let groups = answer["consumerGroups"]
                    .as_array()
                    .map_or(&[][..], Vec::as_slice);
                Ok(groups
                    .iter()
                    .filter_map(|g| g["name"].as_str().map(str::to_owned))
                    .collect())
            }
        }
    }

    /// Resets a processor group's checkpoints to `to` (earliest, latest or a time); the
    /// sequence number each partition's processors resume after.
    pub async fn reset_group(
        &self,
        hub: &str,
        name: &str,
        to: PositionArg,
    ) -> Result<Vec<(String, i64)>> {
        let body = match to {
            PositionArg::Earliest => json!({"type": "TRIM_HORIZON"}),
            PositionArg::Latest => json!({"type": "LATEST"}),
            PositionArg::Time(ms) => json!({"type": "AT_TIME", "time": crate::output::rfc3339(ms)}),
            PositionArg::Sequence(_) | PositionArg::Offset(_) => {
                bail!(
                    "a group is reset to earliest, latest or time:<…>, not to one partition's position"
                )
            }
        };
        let checkpoints = match self {
            Catalog::Local(broker) => broker
                .reset_processor_group(hub, name, &to.to_position(false))
                .await?
                .into_iter()
                .map(|c| (c.partition_id, c.sequence_number.unwrap_or(-1)))
                .collect(),
            Catalog::Server(admin) => {
                let path = format!(
                    "{HUBS}/{}/consumergroups/{}/reset",
                    segment(hub),
                    segment(name)
                );
                let answer = admin.call(Method::POST, &path, Some(body)).await?;
                let listed = answer["checkpoints"]
                    .as_array()
                    .map_or(&[][..], Vec::as_slice);
                listed
                    .iter()
                    .map(|c| {
                        let partition = c["partitionId"].as_str().unwrap_or_default();
                        (
                            partition.to_owned(),
                            c["sequenceNumber"].as_i64().unwrap_or(-1),
                        )
                    })
                    .collect()
            }
        };
        Ok(checkpoints)
    }

    /// Deletes a consumer group.
    pub async fn delete_group(&self, hub: &str, name: &str) -> Result<()> {
        match self {
            Catalog::Local(broker) => Ok(broker.delete_consumer_group(hub, name).await?),
            Catalog::Server(admin) => {
                let path = format!("{HUBS}/{}/consumergroups/{}", segment(hub), segment(name));
                admin.call(Method::DELETE, &path, None).await.map(drop)
            }
        }
    }
}

const HUBS: &str = "/admin/v1/hubs";

/// A name as one path segment: percent-encoded where a URL needs it (names are checked by the
/// server; this only keeps a bad one from changing the path).
pub(crate) fn segment(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'$' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The admin API's `PATCH /admin/v1/hubs/{hub}` body for `update`.
fn update_body(update: &HubUpdate) -> Value {
    let mut body = json!({});
    match update.retention_age_ms {
        Some(Some(ms)) => body["retentionMs"] = json!(ms),
        Some(None) => body["retentionForever"] = json!(true),
        None => {}
    }
    if let Some(bytes) = update.retention_bytes_max {
        body["retentionBytesMax"] = json!(bytes);
    }
    let description = RetentionDescription {
        cleanup_policy: update.cleanup_policy.map(|p| policy_name(p).to_owned()),
        retention_time_in_hours: None,
        min_compaction_lag_time_in_minutes: update.min_compaction_lag_ms.map(minutes),
        tombstone_retention_time_in_hours: update.tombstone_retention_ms.map(hours),
    };
    if description != RetentionDescription::default() {
        body["retentionDescription"] = json!(description);
    }
    body
}

fn hub_line(hub: &Value) -> Result<HubLine> {
    let bad = || anyhow::anyhow!("the admin API described a hub in an unexpected form");
    Ok((
        hub["name"].as_str().ok_or_else(bad)?.to_owned(),
        hub["partitionCount"].as_u64().ok_or_else(bad)?,
        hub["consumerGroups"].as_array().map_or(0, Vec::len),
    ))
}

#[cfg(test)]
mod tests {
    use super::parse_admin_url;

    #[test]
    fn an_admin_url_names_the_door_and_for_https_the_certificates_name() {
        let parsed = |url| parse_admin_url(url).unwrap();
        assert_eq!(parsed("http://hub:9000/x"), ("hub:9000".into(), None));
        assert_eq!(parsed("hub:9000"), ("hub:9000".into(), None));
        assert_eq!(parsed("http://hub"), ("hub:8080".into(), None));
        assert_eq!(
            parsed("https://hub.test"),
            ("hub.test:8443".into(), Some("hub.test".into()))
        );
        assert_eq!(
            parsed("https://[::1]:9443/"),
            ("[::1]:9443".into(), Some("::1".into()))
        );
        for bad in ["ftp://hub:21", "https://", "not a url"] {
            assert!(parse_admin_url(bad).is_err(), "{bad}");
        }
    }
}
