//! One client connection: length-prefixed request frames in, responses out, in order.
//!
//! # What it guarantees
//! - Requests are answered one at a time, in the order they came, as a Kafka broker does (a
//!   long-polling fetch holds back the requests behind it on its connection).
//! - Until SASL succeeds only ApiVersions, SaslHandshake and SaslAuthenticate are answered;
//!   anything else closes the connection, as does a failed login, the pre-authentication
//!   deadline ([`crate::limits::KafkaLimits::auth_timeout`]) or more than
//!   [`UNAUTHENTICATED_BYTES_MAX`] bytes before it.
//! - A frame over the size limit, an unknown API, an unadvertised version or a body that does
//!   not decode closes the connection (logged at debug level, never with a secret); nothing a
//!   client sends can panic the server.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::Encodable;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tokio::time::Instant;
use tributary_amqp::AccessPolicies;
use tributary_amqp::auth::{self, Grant, Needed};
use tributary_broker::Broker;

use crate::limits::{IDLE_TIMEOUT, KafkaLimits, UNAUTHENTICATED_BYTES_MAX};
use crate::request::{self, Body};
use crate::{admin, fetch, groups, metadata, offsets, produce, sasl, versions};

/// How long a connection whose login failed stays open after the refusal is written (Kafka's
/// default connections.failed.authentication.delay.ms).
const FAILED_LOGIN_CLOSE_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

/// What every connection of one door shares.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) broker: Broker,
    pub(crate) policies: AccessPolicies,
    /// Development only: every request is served without SASL.
    pub(crate) unauthenticated: bool,
    pub(crate) limits: KafkaLimits,
    pub(crate) advertised_host: String,
    pub(crate) advertised_port: u16,
    /// The consumer groups' coordinator.
    pub(crate) groups: Arc<groups::Coordinator>,
    /// Producer ids and idempotent producers' state, shared by every door of the broker.
    pub(crate) producers: Arc<crate::producers::Producers>,
    pub(crate) shutdown: watch::Receiver<bool>,
}

/// What one connection has proven.
#[derive(Debug, Default)]
pub(crate) struct Session {
    /// The login's grant, once SASL succeeded.
    grant: Option<Grant>,
    /// Development mode: everything allowed without a login.
    open: bool,
    /// A SaslHandshake chose PLAIN; a SaslAuthenticate may follow.
    handshake_done: bool,
    /// The response just written is the last (a failed login).
    close_after_response: bool,
    /// The client's IP address (DescribeGroups shows it).
    client_host: String,
    /// The client id of the latest request's header, at most [`CLIENT_ID_CHARS_MAX`]
    /// characters (DescribeGroups shows it).
    client_id: String,
}

/// The longest client id kept for a connection: what identifies a client in a listing, not a
/// place to store data (the header's string may be 32 KiB).
const CLIENT_ID_CHARS_MAX: usize = 255;

/// Returns once the door is shutting down.
pub(crate) async fn stopping(shutdown: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is dropped here, not held across the caller's awaits.
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Unix seconds now, for token expiry.
pub(crate) fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl Session {
    /// The client's IP address.
    pub(crate) fn client_host(&self) -> &str {
        &self.client_host
    }

    /// The client's id (`client.id`), empty when its requests carry none.
    pub(crate) fn client_id(&self) -> &str {
        &self.client_id
    }

    fn authenticated(&self) -> bool {
        self.open || self.grant.is_some()
    }

    /// Whether this connection may do what `needed` allows on event hub `hub`; the error is
    /// TOPIC_AUTHORIZATION_FAILED.
    pub(crate) fn authorize(&self, hub: &str, needed: Needed) -> Result<(), i16> {
        if self.open {
            return Ok(());
        }
        let denied = ResponseError::TopicAuthorizationFailed.code();
        let grant = self.grant.as_ref().ok_or(denied)?;
        auth::check(grant, &hub.to_ascii_lowercase(), needed, now_secs()).map_err(|_| denied)
    }
}

/// Serves one connection (plain TCP, or TLS once its handshake is done) until the client closes
/// it, a rule above closes it, or shutdown.
pub(crate) async fn serve<S>(stream: S, peer: SocketAddr, ctx: Arc<Context>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (reader, mut writer) = tokio::io::split(stream);
    let mut reader = BufReader::new(reader);
    let mut session = Session {
        open: ctx.unauthenticated,
        client_host: peer.ip().to_string(),
        ..Session::default()
    };
    let auth_deadline = Instant::now() + ctx.limits.auth_timeout;
    let mut unauthenticated_bytes: u64 = 0;
    let mut shutdown = ctx.shutdown.clone();
    loop {
        let authenticated = session.authenticated();
        let (until, frame_max) = if authenticated {
            (Instant::now() + IDLE_TIMEOUT, ctx.limits.frame_bytes_max)
        } else {
            let left = UNAUTHENTICATED_BYTES_MAX.saturating_sub(unauthenticated_bytes);
            (auth_deadline, ctx.limits.frame_bytes_max.min(left as u32))
        };
        let frame = tokio::select! {
            frame = read_frame(&mut reader, frame_max) => frame,
            () = tokio::time::sleep_until(until) => Err(if authenticated {
                "idle for too long".to_owned()
            } else {
                "did not authenticate in time".to_owned()
            }),
            () = crate::connection::stopping(&mut shutdown) => return,
        };
        let outcome = match frame {
            Ok(None) => return,
            Ok(Some(frame)) => {
                if !authenticated {
                    unauthenticated_bytes += 4 + frame.len() as u64;
                }
                handle_frame(frame, &mut session, &ctx).await
            }
            Err(reason) => Err(reason),
        };
        let written = match outcome {
            Ok(Some(response)) => writer.write_all(&response).await,
            Ok(None) => Ok(()),
            Err(reason) => {
                tracing::debug!(%peer, %reason, "Kafka connection closed");
                return;
            }
        };
        if written.is_err() {
            return;
        }
        if session.close_after_response {
            // As Kafka's connections.failed.authentication.delay.ms: the client reads the
            // refusal before the close (kafka-python 3 drops a response that arrives with the
            // end of the stream, and sees only a disconnect), and a guesser is slowed.
            tokio::time::sleep(FAILED_LOGIN_CLOSE_DELAY).await;
            return;
        }
    }
}

/// Reads one frame (a 4-byte big-endian length, then that many bytes); `None` at a clean end
/// of stream.
async fn read_frame(
    reader: &mut (impl AsyncRead + Unpin),
    max: u32,
) -> Result<Option<Bytes>, String> {
    let mut len = [0u8; 4];
    match reader.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(format!("read failed: {e}")),
    }
    let len = i32::from_be_bytes(len);
    let Ok(len) = u32::try_from(len) else {
        return Err(format!("negative frame length {len}"));
    };
    if len > max {
        return Err(format!("a frame of {len} bytes is over the limit of {max}"));
    }
    let mut frame = vec![0u8; len as usize];
    reader
        .read_exact(&mut frame)
        .await
        .map_err(|e| format!("read failed: {e}"))?;
    Ok(Some(Bytes::from(frame)))
}

/// Answers one request frame: the response's bytes, none (a produce with acks 0), or why the
/// connection closes.
async fn handle_frame(
    frame: Bytes,
    session: &mut Session,
    ctx: &Context,
) -> Result<Option<BytesMut>, String> {
    let request = request::decode(frame, session.authenticated())?;
    if let Some(id) = request.client_id.as_deref()
        && id != session.client_id
    {
        session.client_id = id.chars().take(CLIENT_ID_CHARS_MAX).collect();
    }
    let (key, version, correlation_id) = (request.key, request.version, request.correlation_id);
    let body = match request.body {
        Body::Decoded(body) => *body,
        Body::ApiVersionsTooNew => {
            // KIP-511: a v0 body listing our ranges, so the client retries at our highest.
            let response = versions::api_versions(ResponseError::UnsupportedVersion.code());
            let response = ResponseKind::ApiVersions(response);
            return encode(key, 0, correlation_id, &response).map(Some);
        }
    };
    match dispatch(body, version, session, ctx).await? {
        Some(response) => encode(key, version, correlation_id, &response).map(Some),
        None => Ok(None),
    }
}

/// Runs one decoded request.
async fn dispatch(
    request: RequestKind,
    version: i16,
    session: &mut Session,
    ctx: &Context,
) -> Result<Option<ResponseKind>, String> {
    let response = match request {
        RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(versions::api_versions(0)),
        RequestKind::SaslHandshake(request) => {
            let (response, chosen) = sasl::handshake(&request);
            session.handshake_done = chosen;
            ResponseKind::SaslHandshake(response)
        }
        RequestKind::SaslAuthenticate(request) => {
            ResponseKind::SaslAuthenticate(authenticate(&request, session, ctx))
        }
        RequestKind::Metadata(request) => {
            ResponseKind::Metadata(metadata::answer(&request, session, ctx))
        }
        RequestKind::Produce(request) => match produce::answer(request, session, ctx).await {
            Some(response) => ResponseKind::Produce(response),
            None => return Ok(None),
        },
        RequestKind::InitProducerId(request) => {
            ResponseKind::InitProducerId(produce::init_producer_id(&request, ctx))
        }
        RequestKind::ListOffsets(request) => {
            ResponseKind::ListOffsets(offsets::answer(&request, session, ctx))
        }
        RequestKind::Fetch(request) => {
            ResponseKind::Fetch(fetch::answer(request, session, ctx).await)
        }
        request if admin::answers(&request) => admin::answer(request, session, ctx).await?,
        request if groups::answers(&request) => {
            groups::answer(request, version, session, ctx).await?
        }
        other => return Err(format!("no handler for {other:?}")),
    };
    Ok(Some(response))
}

/// A SaslAuthenticate: only right after a handshake chose PLAIN, once; a failure is answered
/// and then the connection closes, as Kafka brokers do.
fn authenticate(
    request: &kafka_protocol::messages::SaslAuthenticateRequest,
    session: &mut Session,
    ctx: &Context,
) -> kafka_protocol::messages::SaslAuthenticateResponse {
    if !session.handshake_done || session.grant.is_some() {
        session.close_after_response = true;
        return kafka_protocol::messages::SaslAuthenticateResponse::default()
            .with_error_code(ResponseError::IllegalSaslState.code());
    }
    session.handshake_done = false;
    let (response, grant) = sasl::authenticate(request, &ctx.policies, now_secs());
    match grant {
        Some(grant) => session.grant = Some(grant),
        None => session.close_after_response = true,
    }
    response
}

/// A response frame: length, header (at the API's response header version), body.
fn encode(
    key: ApiKey,
    version: i16,
    correlation_id: i32,
    response: &ResponseKind,
) -> Result<BytesMut, String> {
    let mut buf = BytesMut::with_capacity(64);
    buf.put_u32(0);
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut buf, key.response_header_version(version))
        .and_then(|()| response.encode(&mut buf, version))
        .map_err(|e| format!("{key:?} v{version}: the response does not encode: {e}"))?;
    let len = u32::try_from(buf.len() - 4).map_err(|_| "a response over 4 GiB".to_owned())?;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf)
}
