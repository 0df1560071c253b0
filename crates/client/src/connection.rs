//! One AMQP connection to a hub: transport, SASL, `$cbs` authorization and its renewal, and
//! reconnecting after the connection drops.
//!
//! A [`Connector`] belongs to one event hub. It opens the connection on first use (TCP, TLS
//! unless `UseDevelopmentEmulator=true` or `amqp://`, SASL ANONYMOUS, one control session), then
//! attaches the `$cbs` link pair and puts a token for the audience `sb://<host>/<hub>` — the
//! hub-level scope every link of this client falls under. A background task renews the token
//! when 90 % of its lifetime has passed, for as long as the connector lives.
//!
//! # Reconnecting
//! Every operation first checks the connection and its control session; if either has ended,
//! it opens a new one (a new *generation*) before going on. Links opened on an older
//! generation are dead and their owners find out on their next use (a
//! [`ClientError::ConnectionLost`]); nothing is retried behind the caller's back, so a send that
//! failed mid-flight is never silently sent twice, and a receiver never silently re-attaches
//! (which could defeat epoch fencing).

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use fe2o3_amqp_types::definitions::Fields;
use fe2o3_amqp_types::messaging::{AmqpValue, ApplicationProperties, Body};
use fe2o3_amqp_types::primitives::{SimpleValue, Timestamp, Value};
use tokio::sync::{Mutex, MutexGuard};
use tributary_amqp_engine::SessionId;

use crate::amqp::{AmqpConnection, Endpoint, string_property};
use tributary_eventhubs::address;
use tributary_eventhubs::names::management as m;

use crate::connection_string::{ConnectionString, Credential};
use crate::error::ClientError;
use crate::failover::{self, AliasEndpoint, FailoverOptions, HubAlias};
use crate::limits::{
    OPERATION_TIMEOUT_DEFAULT, SAS_TOKEN_LIFETIME, TOKEN_CHECK_INTERVAL_MAX, TOKEN_RENEW_AT_PERCENT,
};
use crate::request_response::RequestResponseLink;
use crate::sas::{SAS_TOKEN_TYPE, Token, now_s, token_for};

/// Options shared by every client type.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientOptions {
    /// How long one network operation (connect, attach, send, management request) may take.
    pub operation_timeout: Duration,
    /// An identifier sent as the AMQP container id prefix, to tell this application apart in
    /// the hub's logs.
    pub application_id: Option<String>,
    /// How long the SAS tokens this client signs stay valid (at least one second). The token
    /// is renewed on the connection once 90 % of this has passed.
    pub token_lifetime: Duration,
    /// A PEM file of certificate authorities to trust besides the Mozilla roots: a local hub's
    /// development authority (`tributary cert`), or a company's own.
    pub trusted_certificates: Option<std::path::PathBuf>,
    /// A hub alias to follow instead of connecting to the connection string's endpoint (see
    /// [`crate::failover`]). Boxed: it is rarely set, and keeps the options small.
    pub failover: Option<Box<FailoverOptions>>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            operation_timeout: OPERATION_TIMEOUT_DEFAULT,
            application_id: None,
            token_lifetime: SAS_TOKEN_LIFETIME,
            trusted_certificates: None,
            failover: None,
        }
    }
}

impl ClientOptions {
    /// With another operation timeout.
    pub fn with_operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// With another SAS token lifetime.
    pub fn with_token_lifetime(mut self, lifetime: Duration) -> Self {
        self.token_lifetime = lifetime;
        self
    }

    /// With an application id.
    pub fn with_application_id(mut self, id: impl Into<String>) -> Self {
        self.application_id = Some(id.into());
        self
    }

    /// Following a hub alias (see [`crate::failover`]).
    pub fn with_failover(mut self, failover: FailoverOptions) -> Self {
        self.failover = Some(Box::new(failover));
        self
    }

    /// Trusting the certificate authorities in the PEM file `path` too.
    pub fn with_trusted_certificates(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.trusted_certificates = Some(path.into());
        self
    }
}

/// What a connector connects to.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) connection_string: ConnectionString,
    pub(crate) hub: String,
    pub(crate) options: ClientOptions,
}

impl Target {
    pub(crate) fn new(
        connection_string: &str,
        hub: Option<&str>,
        options: ClientOptions,
    ) -> Result<Target, ClientError> {
        let connection_string = ConnectionString::parse(connection_string)?;
        let hub = connection_string.resolve_hub(hub)?.to_owned();
        tributary_event::names::validate_hub_name(&hub)
            .map_err(|e| ClientError::InvalidArgument(e.to_string()))?;
        if options.operation_timeout.is_zero() {
            return Err(ClientError::InvalidArgument(
                "operation_timeout must be longer than zero".to_owned(),
            ));
        }
        if options.token_lifetime < Duration::from_secs(1) {
            return Err(ClientError::InvalidArgument(
                "token_lifetime must be at least one second".to_owned(),
            ));
        }
        if let Some(failover) = &options.failover {
            failover.check()?;
        }
        Ok(Target {
            connection_string,
            hub,
            options,
        })
    }

    /// The same credentials and options for another event hub of the namespace.
    pub(crate) fn for_hub(&self, hub: &str) -> Result<Target, ClientError> {
        let hub = self.connection_string.resolve_hub(Some(hub))?.to_owned();
        tributary_event::names::validate_hub_name(&hub)
            .map_err(|e| ClientError::InvalidArgument(e.to_string()))?;
        Ok(Target {
            connection_string: self.connection_string.clone(),
            hub,
            options: self.options.clone(),
        })
    }

    /// The CBS audience every link of this client is authorized under, on the namespace
    /// `host` (the connection string's, or the one an alias names).
    pub(crate) fn audience(&self, host: &str) -> String {
        format!("sb://{host}/{}", self.hub)
    }

    pub(crate) fn timeout_error(&self, operation: &'static str) -> ClientError {
        ClientError::Timeout {
            operation,
            waited_ms: u64::try_from(self.options.operation_timeout.as_millis())
                .unwrap_or(u64::MAX),
        }
    }

    /// Runs `future` under the operation timeout. The future is boxed: the engine's futures
    /// are tens of kilobytes, and callers' futures (and their stacks in debug builds) stay
    /// small when each operation lives on the heap for its round trip.
    pub(crate) async fn timed<T>(
        &self,
        operation: &'static str,
        future: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        tokio::time::timeout(self.options.operation_timeout, Box::pin(future))
            .await
            .map_err(|_| self.timeout_error(operation))?
    }
}

/// An open connection with its control session and `$cbs` link.
#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) generation: u64,
    pub(crate) connection: AmqpConnection,
    /// The control session: `$cbs`, `$management` and the producer's sender links.
    pub(crate) session: SessionId,
    cbs: RequestResponseLink,
    management: Option<RequestResponseLink>,
    token: Token,
    token_issued_at_s: u64,
    /// The audience the token is for.
    audience: String,
}

impl Live {
    fn is_usable(&self) -> bool {
        self.connection.is_usable(self.session)
    }

    /// The management link, attached on first use.
    pub(crate) async fn management(&mut self) -> Result<&mut RequestResponseLink, ClientError> {
        if self.management.is_none() {
            let link =
                RequestResponseLink::attach(&self.connection, self.session, address::MANAGEMENT)
                    .await?;
            self.management = Some(link);
        }
        self.management
            .as_mut()
            .ok_or_else(|| unreachable!("the management link was just attached"))
    }

    /// The current token text, for requests that carry it (`security_token`).
    pub(crate) fn token(&self) -> &str {
        &self.token.value
    }

    fn renew_at_s(&self) -> u64 {
        renew_at_s(self.token_issued_at_s, self.token.expires_at_s)
    }
}

/// When a token issued at `issued_at_s` and expiring at `expires_at_s` is due for renewal:
/// once [`TOKEN_RENEW_AT_PERCENT`] of its lifetime has passed.
fn renew_at_s(issued_at_s: u64, expires_at_s: u64) -> u64 {
    let lifetime = u128::from(expires_at_s.saturating_sub(issued_at_s));
    let elapsed = lifetime * u128::from(TOKEN_RENEW_AT_PERCENT) / 100;
    let renew_at = issued_at_s.saturating_add(u64::try_from(elapsed).unwrap_or(u64::MAX));
    assert!(renew_at <= expires_at_s.max(issued_at_s));
    renew_at
}

/// The connection state of one client, shared by its handles and the renewal task.
#[derive(Debug)]
pub(crate) struct Connector {
    pub(crate) target: Target,
    state: Mutex<State>,
    renewal: OnceLock<tokio::task::JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct State {
    live: Option<Live>,
    generation: u64,
    failover: FailoverState,
}

/// Where an aliased client connects, and how its connection attempts have gone.
#[derive(Debug, Default)]
struct FailoverState {
    /// The endpoint in use (or to try first); `None` until the alias is first resolved.
    active: Option<AliasEndpoint>,
    /// Consecutive failed connection attempts.
    failures: u32,
    /// Since when there has been no working connection.
    failing_since: Option<Instant>,
}

impl FailoverState {
    fn failed(&mut self) {
        self.failures = self.failures.saturating_add(1);
        self.failing_since.get_or_insert_with(Instant::now);
    }

    fn connected(&mut self) {
        self.failures = 0;
        self.failing_since = None;
    }

    /// Why the alias should be resolved again before the next attempt, if it should.
    fn persistent(&self, options: &FailoverOptions) -> Option<String> {
        if self.failures >= options.failures_before_switch {
            return Some(format!("{} consecutive connection failures", self.failures));
        }
        self.failing_since
            .map(|since| since.elapsed())
            .filter(|down| *down >= options.unavailable_after)
            .map(|down| format!("no working connection for {} ms", down.as_millis()))
    }
}

impl Drop for Connector {
    fn drop(&mut self) {
        if let Some(task) = self.renewal.get() {
            task.abort();
        }
    }
}

impl Connector {
    /// A connector for `target`, connected (so bad credentials fail here).
    pub(crate) async fn connect(target: Target) -> Result<Arc<Connector>, ClientError> {
        let connector = Arc::new(Connector {
            target,
            state: Mutex::new(State::default()),
            renewal: OnceLock::new(),
        });
        drop(connector.live().await?);
        let weak = Arc::downgrade(&connector);
        let task = match connector.target.options.failover.as_deref() {
            Some(FailoverOptions {
                alias: HubAlias::File(path),
                poll_interval,
                ..
            }) => {
                let watch = watch_alias_file(weak.clone(), path.clone(), *poll_interval);
                tokio::spawn(async move {
                    tokio::join!(renew_tokens(weak), watch);
                })
            }
            _ => tokio::spawn(renew_tokens(weak)),
        };
        let _ = connector.renewal.set(task);
        Ok(connector)
    }

    /// The live connection, reconnecting first if it has dropped.
    pub(crate) async fn live(&self) -> Result<LiveGuard<'_>, ClientError> {
        let mut state = self.state.lock().await;
        let usable = state.live.as_ref().is_some_and(Live::is_usable);
        if !usable {
            if let Some(old) = state.live.take() {
                tracing::info!(hub = %self.target.hub, generation = old.generation, "connection lost; reconnecting");
                state
                    .failover
                    .failing_since
                    .get_or_insert_with(Instant::now);
            }
            let generation = state.generation + 1;
            let live = match &self.target.options.failover {
                None => self.open_at(None, generation).await?,
                Some(failover) => self.open_aliased(&mut state, failover, generation).await?,
            };
            state.generation = generation;
            state.live = Some(live);
        }
        Ok(LiveGuard { state })
    }

    /// Opens a connection to `endpoint`, or to the connection string's when `None`.
    async fn open_at(
        &self,
        endpoint: Option<&AliasEndpoint>,
        generation: u64,
    ) -> Result<Live, ClientError> {
        self.target
            .timed(
                "connecting to the hub",
                open_live(&self.target, endpoint, generation),
            )
            .await
    }

    /// Opens a connection where the alias points: the active endpoint while it works; once
    /// its failures are persistent (or before the first connection), the first candidate of a
    /// fresh resolution that accepts a connection.
    async fn open_aliased(
        &self,
        state: &mut State,
        failover: &FailoverOptions,
        generation: u64,
    ) -> Result<Live, ClientError> {
        let hub = &self.target.hub;
        let alias = &failover.alias;
        let mut why = state.failover.persistent(failover);
        if let (Some(active), None) = (state.failover.active.clone(), &why) {
            match self.open_at(Some(&active), generation).await {
                Ok(live) => {
                    state.failover.connected();
                    return Ok(live);
                }
                Err(error) => {
                    state.failover.failed();
                    why = state.failover.persistent(failover);
                    let Some(why) = &why else {
                        return Err(error);
                    };
                    tracing::warn!(%hub, %alias, endpoint = %active, %error, "{why}; resolving the alias again");
                }
            }
        }
        let candidates = match failover::resolve(alias).await {
            Ok(candidates) => candidates,
            Err(error) => {
                state.failover.failed();
                return Err(error);
            }
        };
        let mut last_error = None;
        for candidate in candidates {
            match self.open_at(Some(&candidate), generation).await {
                Ok(live) => {
                    match state.failover.active.take() {
                        Some(old) if !old.same_place(&candidate) => {
                            let why = why.as_deref().unwrap_or("the alias changed");
                            tracing::warn!(%hub, %alias, from = %old, to = %candidate, "switched to another endpoint: {why}");
                        }
                        Some(_) => {}
                        None => {
                            tracing::info!(%hub, %alias, endpoint = %candidate, "connected through the alias");
                        }
                    }
                    state.failover.active = Some(candidate);
                    state.failover.connected();
                    return Ok(live);
                }
                Err(error) => {
                    tracing::debug!(%hub, %alias, endpoint = %candidate, %error, "an alias candidate is unreachable");
                    last_error = Some(error);
                }
            }
        }
        state.failover.failed();
        Err(last_error.unwrap_or_else(|| ClientError::Connect {
            endpoint: alias.to_string(),
            description: "the alias names no endpoint".to_owned(),
        }))
    }

    /// Follows a change of the alias file: when it names another endpoint, makes that the
    /// active one and closes the connection, so the next operation connects there.
    async fn follow_alias_file(&self, path: &Path) {
        let hub = &self.target.hub;
        let endpoint = match failover::read_alias_file(path) {
            Ok(endpoint) => endpoint,
            Err(error) => {
                tracing::warn!(%hub, %error, "the alias file changed but names no usable endpoint; staying where the client is");
                return;
            }
        };
        let mut state = self.state.lock().await;
        let from = state.failover.active.clone();
        if from.as_ref().is_some_and(|from| from.same_place(&endpoint)) {
            return;
        }
        let from = from.map_or_else(|| "none".to_owned(), |from| from.to_string());
        tracing::warn!(%hub, alias = %path.display(), %from, to = %endpoint, "the alias file names another endpoint; switching");
        state.failover.active = Some(endpoint);
        state.failover.connected();
        if let Some(live) = state.live.take() {
            live.connection.close();
        }
    }

    /// The endpoint an aliased client uses (or will try first); `None` without an alias or
    /// before the alias was first resolved.
    pub(crate) async fn active_endpoint(&self) -> Option<AliasEndpoint> {
        self.state.lock().await.failover.active.clone()
    }

    /// Closes the connection, if open. Later operations reconnect.
    pub(crate) async fn close(&self) {
        let mut state = self.state.lock().await;
        if let Some(live) = state.live.take() {
            // The links detach as they drop; the connection's task then closes the
            // connection, waiting a bounded time for the hub's answer.
            live.connection.close();
        }
    }
}

/// Exclusive access to the live connection.
#[derive(Debug)]
pub(crate) struct LiveGuard<'a> {
    state: MutexGuard<'a, State>,
}

impl std::ops::Deref for LiveGuard<'_> {
    type Target = Live;

    fn deref(&self) -> &Live {
        self.state
            .live
            .as_ref()
            .unwrap_or_else(|| unreachable!("a LiveGuard is only made for a live connection"))
    }
}

impl std::ops::DerefMut for LiveGuard<'_> {
    fn deref_mut(&mut self) -> &mut Live {
        self.state
            .live
            .as_mut()
            .unwrap_or_else(|| unreachable!("a LiveGuard is only made for a live connection"))
    }
}

/// Polls the alias file `path` every `interval` (its modification time and length) and lets
/// the connector follow a change, until the connector is dropped.
async fn watch_alias_file(connector: Weak<Connector>, path: PathBuf, interval: Duration) {
    let stamp = |path: &Path| {
        std::fs::metadata(path)
            .ok()
            .map(|meta| (meta.modified().ok(), meta.len()))
    };
    let mut seen = stamp(&path);
    loop {
        tokio::time::sleep(interval).await;
        let Some(connector) = connector.upgrade() else {
            return;
        };
        let now = stamp(&path);
        if now != seen {
            seen = now;
            connector.follow_alias_file(&path).await;
        }
    }
}

async fn open_live(
    target: &Target,
    endpoint: Option<&AliasEndpoint>,
    generation: u64,
) -> Result<Live, ClientError> {
    let connection = open_connection(target, endpoint).await?;
    let session = connection.begin().await?;
    let mut cbs = RequestResponseLink::attach(&connection, session, address::CBS).await?;
    let issued_at_s = now_s();
    let host = endpoint.map_or(target.connection_string.host(), |e| e.host.as_str());
    let audience = target.audience(host);
    let token = token_for(
        target.connection_string.credential(),
        &audience,
        issued_at_s,
        target.options.token_lifetime,
    );
    put_token(&mut cbs, target, &audience, &token).await?;
    tracing::debug!(hub = %target.hub, generation, "connected and authorized");
    Ok(Live {
        generation,
        connection,
        session,
        cbs,
        management: None,
        token,
        token_issued_at_s: issued_at_s,
        audience,
    })
}

async fn open_connection(
    target: &Target,
    endpoint: Option<&AliasEndpoint>,
) -> Result<AmqpConnection, ClientError> {
    let cs = &target.connection_string;
    let (host, port, addresses) = match endpoint {
        Some(endpoint) => (
            endpoint.host.as_str(),
            endpoint.port.unwrap_or(if cs.uses_tls() {
                crate::connection_string::PORT_TLS
            } else {
                crate::connection_string::PORT_PLAIN
            }),
            endpoint.addresses.as_slice(),
        ),
        None => (cs.host(), cs.port(), &[][..]),
    };
    let container_id = format!(
        "{}-{}",
        target
            .options
            .application_id
            .as_deref()
            .unwrap_or("tributary-client"),
        uuid::Uuid::new_v4().simple()
    );
    let properties: Fields = [
        string_property("product", "tributary-client"),
        string_property("version", env!("CARGO_PKG_VERSION")),
    ]
    .into_iter()
    .collect();
    AmqpConnection::open(Endpoint {
        host,
        port,
        addresses,
        tls: cs.uses_tls(),
        trusted_certificates: target.options.trusted_certificates.as_deref(),
        container_id,
        properties: Some(properties),
    })
    .await
}

async fn put_token(
    cbs: &mut RequestResponseLink,
    target: &Target,
    audience: &str,
    token: &Token,
) -> Result<(), ClientError> {
    let expiration_ms = i64::try_from(token.expires_at_s)
        .unwrap_or(i64::MAX / 1000)
        .saturating_mul(1000);
    let mut properties = ApplicationProperties::default();
    properties.0.insert(
        m::OPERATION.to_owned(),
        SimpleValue::String(m::PUT_TOKEN.to_owned()),
    );
    properties.0.insert(
        m::TYPE.to_owned(),
        SimpleValue::String(SAS_TOKEN_TYPE.to_owned()),
    );
    properties
        .0
        .insert(m::NAME.to_owned(), SimpleValue::String(audience.to_owned()));
    properties.0.insert(
        m::EXPIRATION.to_owned(),
        SimpleValue::Timestamp(Timestamp::from_milliseconds(expiration_ms)),
    );
    let body = Body::Value(AmqpValue(Value::String(token.value.clone())));
    let response = cbs
        .call(properties, body, target.options.operation_timeout)
        .await?;
    match response.success() {
        Ok(_) => Ok(()),
        // The hub the token is for does not exist (Event Hubs answers a token for a missing
        // entity 404, "The messaging entity … could not be found").
        Err(ClientError::NotFound { description }) => Err(ClientError::NotFound { description }),
        // Every other refusal of a token is an authorization failure, whatever its status.
        Err(ClientError::Unauthorized { description })
        | Err(ClientError::Refused { description, .. })
        | Err(ClientError::Other { description, .. }) => Err(ClientError::Unauthorized {
            description: format!("the hub refused the token for {audience}: {description}"),
        }),
        Err(other) => Err(other),
    }
}

/// Renews the token of the live connection when it is due, until the connector is dropped.
async fn renew_tokens(connector: Weak<Connector>) {
    loop {
        let sleep_for = match connector.upgrade() {
            Some(connector) => renew_once(&connector).await,
            None => return,
        };
        tokio::time::sleep(sleep_for).await;
    }
}

/// Renews the token if due; returns how long to sleep before looking again.
async fn renew_once(connector: &Connector) -> Duration {
    let mut state = connector.state.lock().await;
    let Some(live) = state.live.as_mut().filter(|live| live.is_usable()) else {
        return TOKEN_CHECK_INTERVAL_MAX;
    };
    let renewable = matches!(
        connector.target.connection_string.credential(),
        Credential::SharedAccessKey { .. }
    );
    let now = now_s();
    if renewable && now >= live.renew_at_s() {
        let token = token_for(
            connector.target.connection_string.credential(),
            &live.audience,
            now,
            connector.target.options.token_lifetime,
        );
        match put_token(&mut live.cbs, &connector.target, &live.audience, &token).await {
            Ok(()) => {
                tracing::debug!(hub = %connector.target.hub, "token renewed");
                live.token = token;
                live.token_issued_at_s = now;
            }
            Err(error) => {
                tracing::warn!(hub = %connector.target.hub, %error, "renewing the token failed; retrying");
            }
        }
    }
    let until_due = live.renew_at_s().saturating_sub(now_s()).max(1);
    Duration::from_secs(until_due).min(TOKEN_CHECK_INTERVAL_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_renewed_before_they_expire() {
        // A one-hour token: six minutes before expiry.
        assert_eq!(renew_at_s(1_000, 1_000 + 3_600), 1_000 + 3_240);
        // A short token still renews before expiry.
        assert_eq!(renew_at_s(1_000, 1_003), 1_002);
        // An already expired signature (issued "after" its expiry) is due at once.
        assert_eq!(renew_at_s(2_000, 1_000), 2_000);
        // A signature that never expires (a huge `se`) does not overflow.
        assert!(renew_at_s(1_000, u64::MAX) < u64::MAX);
    }

    #[test]
    fn options_are_checked() {
        let cs =
            "Endpoint=sb://h;SharedAccessKeyName=a;SharedAccessKey=b;UseDevelopmentEmulator=true";
        assert!(Target::new(cs, Some("hub"), ClientOptions::default()).is_ok());
        let zero = ClientOptions::default().with_operation_timeout(Duration::ZERO);
        assert!(Target::new(cs, Some("hub"), zero).is_err());
        let short = ClientOptions::default().with_token_lifetime(Duration::from_millis(10));
        assert!(Target::new(cs, Some("hub"), short).is_err());
        assert!(matches!(
            Target::new(cs, Some("bad/hub"), ClientOptions::default()),
            Err(ClientError::InvalidArgument(_))
        ));
        assert!(matches!(
            Target::new(cs, None, ClientOptions::default()),
            Err(ClientError::InvalidConnectionString(_))
        ));
        let target = Target::new(cs, Some("orders"), ClientOptions::default()).unwrap();
        assert_eq!(target.audience("h"), "sb://h/orders");
        assert_eq!(target.connection_string.port(), 5672);
    }
}
