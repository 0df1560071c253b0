//! The web dashboard at `/`: hubs and partitions, consumer groups with their lag, open
//! receivers and their epochs, server-side groups, the log's sync latency, and operator
//! actions — server-rendered HTML, one small script and a style sheet, embedded in the binary
//! (no CDN, no build step: it works offline).
//!
//! # Routes
//! | Method | Path | Does |
//! |---|---|---|
//! | GET | `/` | the page (a session is needed; without one: 401 and the login form) |
//! | POST | `/dashboard/login` | form field `credential`: a connection string or SAS token with the Manage right → session cookie, 303 to `/` |
//! | POST | `/dashboard/logout` | ends the session |
//! | GET | `/dashboard/events` | server-sent events: about every second, the sections that changed |
//! | GET | `/dashboard/app.js`, `/dashboard/app.css` | the static script and style sheet |
//!
//! # Authentication
//! The same as the admin API's: a credential of a shared access policy with the Manage right,
//! checked by [`crate::AdminSas`]. It is sent once, to the login form, and never stored; the
//! browser gets a random session id in an `HttpOnly`, `SameSite=Strict` cookie (`Secure` over
//! HTTPS). The page's operator actions call the admin API (`/admin/v1/…`) and OCI UpdateGroup
//! (reset a server-side group) with that cookie and the session's CSRF token in the
//! `X-Tributary-CSRF` header; a request with the cookie alone is refused, so another site
//! cannot act through a logged-in browser. In development mode (no authentication on the API)
//! the dashboard needs no login either, and says so. Every page is sent with a strict
//! Content-Security-Policy (scripts and styles from this server only, no framing).
//!
//! # Live updates and their cost
//! One task samples the broker and the coordinator about once a second while at least one
//! page is connected (none: no work), renders the sections, and publishes them once for every
//! viewer: the first message to a viewer carries every section, later ones only the sections
//! whose HTML changed. Each message says how long its tick took (`costMs`).

mod render;
mod session;
mod snapshot;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use tokio::sync::watch;

use crate::server::{AppState, Shared};
use session::{COOKIE, SESSION_LIFETIME, Sessions};

/// How often the live view refreshes.
pub(crate) const TICK: Duration = Duration::from_secs(1);
/// The most bytes a login form may have.
const LOGIN_BODY_BYTES_MAX: usize = 16 * 1024;

/// One refresh, as every viewer gets it.
#[derive(Debug, Default)]
pub(crate) struct Tick {
    seq: u64,
    at: Option<Instant>,
    /// Every section (for a viewer's first message, or one that missed a tick).
    full: Arc<str>,
    /// The sections that changed since tick `seq - 1`.
    delta: Arc<str>,
}

/// The dashboard's state in the server.
#[derive(Debug)]
pub(crate) struct Dashboard {
    sessions: Sessions,
    sampler: Mutex<snapshot::Sampler>,
    /// The sections of the last tick, to tell what changed.
    last: Mutex<HashMap<String, Section>>,
    ticks: watch::Receiver<Arc<Tick>>,
    publish: Mutex<Option<watch::Sender<Arc<Tick>>>>,
}

impl Dashboard {
    pub(crate) fn new() -> Dashboard {
        let (publish, ticks) = watch::channel(Arc::new(Tick::default()));
        Dashboard {
            sessions: Sessions::default(),
            sampler: Mutex::new(snapshot::Sampler::default()),
            last: Mutex::new(HashMap::new()),
            ticks,
            publish: Mutex::new(Some(publish)),
        }
    }

    /// Whether a request to the API carries a dashboard session and its CSRF token, for the
    /// paths the page's operator actions use: the admin API and OCI UpdateGroup.
    pub(crate) fn authorises(&self, method: &Method, path: &str, headers: &HeaderMap) -> bool {
        let update_group = method == Method::PUT
            && path
                .strip_prefix("/20180418/streams/")
                .is_some_and(|rest| rest.split('/').nth(1) == Some("groups"));
        (path.starts_with("/admin/") || update_group) && self.sessions.authorises(headers)
    }
}

/// Starts the task that refreshes the live view until `stop` turns true.
pub(crate) fn spawn_ticker(state: &AppState, mut stop: watch::Receiver<bool>) {
    let Some(publish) = state.dashboard.publish.lock().expect("publisher").take() else {
        return;
    };
    let weak: Weak<Shared> = Arc::downgrade(state);
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(TICK);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let Some(state) = weak.upgrade() else { return };
            // The dashboard keeps one receiver itself; more are viewers.
            if publish.receiver_count() > 1 {
                let seq = publish.borrow().seq + 1;
                publish.send_replace(Arc::new(tick(&state, seq)));
            }
        }
    });
}

/// A section as last sent: the hub it shows (to tell whether it changed without rendering it)
/// and its `"name":"html"` JSON member.
#[derive(Debug)]
struct Section {
    hub: Option<snapshot::HubRow>,
    member: Arc<str>,
}

fn member(name: &str, html: &str) -> Arc<str> {
    let name = serde_json::to_string(name).expect("a string encodes");
    let html = serde_json::to_string(html).expect("a string encodes");
    format!("{name}:{html}").into()
}

/// Samples, renders and packs one tick. A hub whose rows equal the last tick's is neither
/// rendered nor encoded again.
fn tick(state: &Shared, seq: u64) -> Tick {
    let started = Instant::now();
    let snapshot = state
        .dashboard
        .sampler
        .lock()
        .expect("sampler")
        .sample(&state.broker, &state.coordinator);
    let mut last = state.dashboard.last.lock().expect("last sections");
    let mut next = HashMap::with_capacity(snapshot.hubs.len() + 1);
    let (mut all, mut changed) = (Vec::new(), Vec::new());
    let overview = member("overview", &render::overview(&snapshot));
    if last.get("overview").is_none_or(|s| s.member != overview) {
        changed.push(overview.clone());
    }
    all.push(overview.clone());
    next.insert(
        "overview".to_owned(),
        Section {
            hub: None,
            member: overview,
        },
    );
    for hub in &snapshot.hubs {
        let name = format!("hub:{}", hub.name);
        let section = match last.remove(&name) {
            Some(section) if section.hub.as_ref() == Some(hub) => section,
            _ => {
                let section = Section {
                    hub: Some(hub.clone()),
                    member: member(&name, &render::hub(hub, snapshot.time_ms)),
                };
                changed.push(section.member.clone());
                section
            }
        };
        all.push(section.member.clone());
        next.insert(name, section);
    }
    *last = next;
    drop(last);
    let order: Vec<&str> = snapshot.hubs.iter().map(|h| h.name.as_str()).collect();
    let (events_in, events_out, lag) = snapshot.totals();
    let head = json!({
        "seq": seq, "time": snapshot.time_ms, "hubs": order,
        "totals": { "in": events_in, "out": events_out, "lag": lag },
        "costMs": started.elapsed().as_secs_f64() * 1000.0,
    })
    .to_string();
    let head = head.strip_suffix('}').expect("a JSON object");
    let message = |members: &[Arc<str>]| -> Arc<str> {
        format!("{head},\"sections\":{{{}}}}}", members.join(",")).into()
    };
    Tick {
        seq,
        at: Some(Instant::now()),
        full: message(&all),
        delta: message(&changed),
    }
}

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(page))
        .route("/dashboard/login", post(login))
        .route("/dashboard/logout", post(logout))
        .route("/dashboard/events", get(events))
        .route("/dashboard/app.js", get(script))
        .route("/dashboard/app.css", get(style))
}

/// The CSRF token of the request's session; in development mode, a fixed one.
fn session(state: &Shared, headers: &HeaderMap) -> Option<String> {
    if state.verifier.is_none() {
        return Some("development".to_owned());
    }
    state.dashboard.sessions.csrf(headers)
}

fn html(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

async fn page(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let Some(csrf) = session(&state, &headers) else {
        return html(StatusCode::UNAUTHORIZED, render::login(None));
    };
    let snapshot = state
        .dashboard
        .sampler
        .lock()
        .expect("sampler")
        .sample(&state.broker, &state.coordinator);
    html(
        StatusCode::OK,
        render::page(&snapshot, &csrf, state.verifier.is_none()),
    )
}

/// Whether a form post comes from this server's own page (an `Origin` naming another host is
/// refused; browsers send one with every POST).
fn same_origin(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    match headers.get(header::ORIGIN).map(|v| v.to_str()) {
        None => true,
        Some(Ok(origin)) => {
            let origin_host = origin.split_once("://").map(|(_, rest)| rest);
            origin_host.is_some() && origin_host == host
        }
        Some(Err(_)) => false,
    }
}

async fn login(State(state): State<AppState>, request: Request) -> Response {
    if !same_origin(request.headers()) {
        return html(
            StatusCode::FORBIDDEN,
            render::login(Some("the form was posted from another site")),
        );
    }
    let Ok(body) = axum::body::to_bytes(request.into_body(), LOGIN_BODY_BYTES_MAX).await else {
        return html(
            StatusCode::BAD_REQUEST,
            render::login(Some("the form is too large")),
        );
    };
    let credential = form_urlencoded::parse(&body)
        .find(|(name, _)| name == "credential")
        .map(|(_, value)| value.trim().to_owned())
        .unwrap_or_default();
    let lifetime = match admin_token(&credential) {
        Ok((token, expires_s)) if state.admin_sas.as_ref().is_some_and(|c| c.accepts(&token)) => {
            expires_s.map_or(SESSION_LIFETIME, |s| {
                Duration::from_secs(s.saturating_sub(now_s()))
            })
        }
        Ok(_) => {
            tracing::info!(
                "dashboard login refused: the credential does not grant Manage over the namespace"
            );
            return html(
                StatusCode::UNAUTHORIZED,
                render::login(Some(
                    "not accepted: the credential must be valid and have the Manage right",
                )),
            );
        }
        Err(why) => return html(StatusCode::UNAUTHORIZED, render::login(Some(&why))),
    };
    let id = state.dashboard.sessions.open(lifetime);
    let secure = if state.https { "; Secure" } else { "" };
    let cookie = format!(
        "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        lifetime.min(SESSION_LIFETIME).as_secs()
    );
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A SAS token (and its expiry, unix seconds) from what a person pasted: a SAS token, or a
/// connection string with a key (signed here for the namespace, valid for a minute) or a token.
fn admin_token(credential: &str) -> Result<(String, Option<u64>), String> {
    use tributary_eventhubs::connection_string::{ConnectionString, Credential};
    use tributary_eventhubs::sas;
    if credential.starts_with("SharedAccessSignature ") {
        return Ok((credential.to_owned(), sas::token_expiry(credential)));
    }
    let parsed = ConnectionString::parse(credential)
        .map_err(|e| format!("not a connection string or SAS token: {e}"))?;
    Ok(match parsed.credential() {
        Credential::SharedAccessKey { key_name, key } => {
            let audience = format!("sb://{}/", parsed.host());
            (sas::sign(&audience, key_name, key, now_s() + 60), None)
        }
        Credential::SharedAccessSignature(token) => (token.clone(), sas::token_expiry(token)),
    })
}

async fn logout(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if same_origin(&headers) {
        state.dashboard.sessions.close(&headers);
    }
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
    let cookie = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

async fn events(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if session(&state, &headers).is_none() {
        return crate::error::ApiError::not_authenticated("log in at / first").into_response();
    }
    let ticks = state.dashboard.ticks.clone();
    let stream =
        futures_util::stream::unfold((ticks, None::<u64>), |(mut ticks, sent)| async move {
            loop {
                let tick = ticks.borrow_and_update().clone();
                let fresh = tick.at.is_some_and(|at| at.elapsed() < TICK * 2);
                if fresh && sent != Some(tick.seq) {
                    let data = if sent == Some(tick.seq - 1) {
                        &tick.delta
                    } else {
                        &tick.full
                    };
                    let event = Event::default().event("tick").data(&**data);
                    return Some((
                        Ok::<_, std::convert::Infallible>(event),
                        (ticks, Some(tick.seq)),
                    ));
                }
                ticks.changed().await.ok()?;
            }
        });
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = Body::from(body).into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    response
}

async fn script() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("assets/app.js"),
    )
}

async fn style() -> Response {
    asset("text/css; charset=utf-8", include_str!("assets/app.css"))
}

#[cfg(test)]
mod tests;
