//! The router, the shared state, and the middleware every request passes: request ids and
//! metrics (outermost), then body buffering and authentication for the API routes. The AMQP
//! WebSocket upgrade, like `/health`, is outside the API routes: AMQP authenticates it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant as StdInstant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::connect_info::Connected;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::IncomingStream;
use tokio::net::TcpListener;
use tributary_broker::Broker;
use tributary_groups::GroupCoordinator;

use crate::auth::Verifier;
use crate::cursor::CursorKey;
use crate::error::ApiError;
use crate::limits::{BODY_DRAIN_BYTES_MAX, REQUEST_BODY_BYTES_MAX, REQUEST_ID_CHARS_MAX};
use crate::metrics::Metrics;
use crate::tls::TlsListener;
use crate::websocket::{
    self, AMQP_WEBSOCKET_PATH, AMQP_WEBSOCKET_PATH_SLASHED, AmqpOverWebSockets,
};
use crate::{AuthConfig, HttpConfig, HttpError, admin, admin_policies, oci};
use tributary_broker::throttle::Buckets;

/// What every handler shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub broker: Broker,
    pub coordinator: GroupCoordinator,
    pub cursor_key: CursorKey,
    pub verifier: Option<Verifier>,
    pub metrics: Metrics,
    pub get_limit: Option<Buckets>,
    pub put_limit: Option<Buckets>,
    /// Where null-key messages go next.
    pub round_robin: AtomicU64,
    /// Whether this door serves TLS (the scheme of the endpoints it reports).
    pub https: bool,
    /// Where AMQP over WebSockets connections go; `None`: not served.
    pub websocket_amqp: Option<AmqpOverWebSockets>,
    /// SAS tokens accepted on the admin API besides signatures.
    pub admin_sas: Option<crate::AdminSas>,
    /// The shared access policies the admin API manages; `None`: its policy routes answer 404.
    pub policies: Option<tributary_amqp::AccessPolicies>,
    /// How long a request's body may take to arrive.
    pub body_read_timeout: std::time::Duration,
    /// The web dashboard's sessions and live view.
    pub dashboard: crate::dashboard::Dashboard,
}

/// The peer's address, as `axum::serve` gives it for plain and TLS listeners alike.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerAddr(pub SocketAddr);

impl Connected<IncomingStream<'_, TcpListener>> for PeerAddr {
    fn connect_info(stream: IncomingStream<'_, TcpListener>) -> Self {
        PeerAddr(*stream.remote_addr())
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for PeerAddr {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        PeerAddr(*stream.remote_addr())
    }
}

pub(crate) type AppState = Arc<Shared>;

impl Shared {
    /// Everything the handlers need, from the configuration.
    pub(crate) fn open(
        broker: Broker,
        coordinator: GroupCoordinator,
        config: &HttpConfig,
    ) -> Result<AppState, HttpError> {
        let data_dir = broker.config().data_dir.clone();
        let verifier = match &config.auth {
            AuthConfig::Signatures {
                keys_file,
                clock_skew_ms_max,
            } => {
                let path = keys_file
                    .clone()
                    .unwrap_or_else(|| data_dir.join("oci-api-keys.json"));
                Some(
                    Verifier::load(path, broker.clock(), *clock_skew_ms_max)
                        .map_err(HttpError::Keys)?,
                )
            }
            AuthConfig::DevelopmentUnauthenticated => {
                tracing::warn!(
                    "DEVELOPMENT MODE: the HTTP front door accepts unsigned requests; anyone who can reach it can read, write and administer every stream"
                );
                None
            }
        };
        let cursor_key = CursorKey::load_or_create(&data_dir).map_err(HttpError::CursorKey)?;
        let limits = &config.rate_limits;
        Ok(Arc::new(Shared {
            broker,
            coordinator,
            cursor_key,
            verifier,
            metrics: Metrics::new(),
            get_limit: limits
                .get_requests_per_second
                .filter(|r| *r > 0)
                .map(Buckets::new),
            put_limit: limits
                .put_bytes_per_second
                .filter(|r| *r > 0)
                .map(Buckets::new),
            round_robin: AtomicU64::new(0),
            https: config.tls.is_some(),
            websocket_amqp: config.websocket_amqp.clone(),
            admin_sas: config.admin_sas.clone(),
            policies: config.policies.clone(),
            body_read_timeout: config.limits.body_read_timeout,
            dashboard: crate::dashboard::Dashboard::new(),
        }))
    }
}

/// The whole application.
pub(crate) fn router(state: AppState) -> Router {
    let api = Router::new()
        .route(
            "/20180418/streams",
            get(oci::streams::list_streams).post(oci::streams::create_stream),
        )
        .route(
            "/20180418/streams/{stream}",
            get(oci::streams::get_stream).delete(oci::streams::delete_stream),
        )
        .route(
            "/20180418/streams/{stream}/messages",
            post(oci::messages::put_messages).get(oci::messages::get_messages),
        )
        .route(
            "/20180418/streams/{stream}/cursors",
            post(oci::cursors::create_cursor),
        )
        .route(
            "/20180418/streams/{stream}/groupCursors",
            post(oci::cursors::create_group_cursor),
        )
        .route(
            "/20180418/streams/{stream}/groups/{group}",
            get(oci::groups::get_group).put(oci::groups::update_group),
        )
        .route(
            "/20180418/streams/{stream}/commit",
            post(oci::cursors::consumer_commit),
        )
        .route(
            "/20180418/streams/{stream}/heartbeat",
            post(oci::cursors::consumer_heartbeat),
        )
        .merge(admin::routes())
        .merge(admin_policies::routes())
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate));
    api.route(AMQP_WEBSOCKET_PATH, get(websocket::amqp_upgrade))
        .route(AMQP_WEBSOCKET_PATH_SLASHED, get(websocket::amqp_upgrade))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(crate::dashboard::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::disable())
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "NotFound",
        "there is no operation at this path",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        "this path does not support the method",
    )
}

async fn health(State(state): State<AppState>) -> Response {
    let hubs = state.broker.list_hubs().len();
    Json(serde_json::json!({ "status": "ok", "hubs": hubs })).into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    let text = state.metrics.encode(&state.broker, &state.coordinator);
    let mut response = text.into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
    );
    response
}

/// Echoes (or makes) `opc-request-id` and records the request's metrics.
async fn observe(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = StdInstant::now();
    let request_id = request
        .headers()
        .get("opc-request-id")
        .filter(|v| v.len() <= REQUEST_ID_CHARS_MAX && v.to_str().is_ok())
        .cloned()
        .unwrap_or_else(|| {
            let id = uuid::Uuid::new_v4()
                .simple()
                .to_string()
                .to_ascii_uppercase();
            HeaderValue::from_str(&id).expect("hex is a valid header value")
        });
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let mut response = next.run(request).await;
    response.headers_mut().insert("opc-request-id", request_id);
    let status = response.status().as_u16();
    state
        .metrics
        .request(&route, &method, status, started.elapsed().as_secs_f64());
    response
}

/// Buffers the body (refusing one over the limit) and checks the request's signature.
async fn authenticate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let body = match tokio::time::timeout(state.body_read_timeout, read_body(body)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) => return e.into_response(),
        Err(_) => {
            let e = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "RequestTimeout",
                format!(
                    "the request body did not arrive within {} s",
                    state.body_read_timeout.as_secs_f64()
                ),
            );
            let mut response = e.into_response();
            // The rest of the body may still be coming: this connection is done.
            response.headers_mut().insert(
                axum::http::header::CONNECTION,
                HeaderValue::from_static("close"),
            );
            return response;
        }
    };
    let admin_sas = admin_sas_check(&state, &parts);
    if let Some(verifier) = state
        .verifier
        .as_ref()
        .filter(|_| !matches!(admin_sas, Some(Ok(()))))
        .filter(|_| {
            !state
                .dashboard
                .authorises(&parts.method, parts.uri.path(), &parts.headers)
        })
    {
        if let Some(Err(reason)) = admin_sas {
            tracing::info!(method = %parts.method, path = %parts.uri.path(), reason = %reason, "admin request refused: its SAS token was not accepted");
            return ApiError::not_authenticated(reason).into_response();
        }
        let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let body_signed = !is_put_messages(&parts.method, parts.uri.path());
        if let Err(e) = verifier.verify(
            &parts.method,
            path_and_query,
            &parts.headers,
            &body,
            body_signed,
        ) {
            tracing::info!(method = %parts.method, path = %parts.uri.path(), reason = %e.message, "request refused: not authenticated");
            return e.into_response();
        }
    }
    next.run(Request::from_parts(parts, Body::from(body))).await
}

/// For a request to the admin API with a SAS token, when a check is configured: whether the
/// check accepts it, or why not. `None`: not such a request.
fn admin_sas_check(
    state: &AppState,
    parts: &axum::http::request::Parts,
) -> Option<Result<(), String>> {
    let check = state.admin_sas.as_ref()?;
    let token = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.starts_with("SharedAccessSignature "))?;
    parts
        .uri
        .path()
        .starts_with("/admin/")
        .then(|| check.check(token))
}

/// Reads a body of at most [`REQUEST_BODY_BYTES_MAX`]. A larger one is refused, but read on (up
/// to [`BODY_DRAIN_BYTES_MAX`]) so the client, still sending, reads the 413 instead of a reset
/// connection.
async fn read_body(mut body: Body) -> Result<Bytes, ApiError> {
    use http_body_util::BodyExt;
    let mut buf = bytes::BytesMut::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ApiError::cannot_parse(format!("the request body could not be read: {e}"))
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        seen = seen.saturating_add(data.len());
        if seen <= REQUEST_BODY_BYTES_MAX {
            buf.extend_from_slice(&data);
        } else if seen > BODY_DRAIN_BYTES_MAX {
            break;
        }
    }
    if seen > REQUEST_BODY_BYTES_MAX {
        return Err(ApiError::too_large(format!(
            "the request body is larger than {REQUEST_BODY_BYTES_MAX} bytes"
        )));
    }
    Ok(buf.freeze())
}

/// PutMessages is the one body request the OCI SDKs sign without its body headers.
fn is_put_messages(method: &Method, path: &str) -> bool {
    method == Method::POST && path.starts_with("/20180418/streams/") && path.ends_with("/messages")
}

/// A JSON answer (axum's own needs a feature we do not otherwise use).
#[derive(Debug)]
pub(crate) struct Json<T>(pub T);

impl<T: serde::Serialize> IntoResponse for Json<T> {
    fn into_response(self) -> Response {
        match serde_json::to_vec(&self.0) {
            Ok(bytes) => {
                let mut response = Body::from(bytes).into_response();
                response.headers_mut().insert(
                    axum::http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                response
            }
            Err(e) => {
                ApiError::internal(format!("the answer could not be encoded: {e}")).into_response()
            }
        }
    }
}
