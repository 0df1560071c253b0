//! One client connection: length-prefixed request frames in, responses out, in order.
//!
//! # What it guarantees
//! - Requests are answered in the order they came. They are handled one at a time, as a Kafka
//!   broker does (a long-polling fetch holds back the requests behind it on its connection),
//!   except that produce requests whose batches are all written to their logs are answered
//!   once synced while the next requests are read: up to [`REQUESTS_IN_FLIGHT_MAX`] of them,
//!   so one sync covers the batches of several requests. Anything else waits for every earlier
//!   answer first.
//! - Until SASL succeeds only ApiVersions, SaslHandshake and SaslAuthenticate are answered;
//!   anything else closes the connection, as does a failed login, the pre-authentication
//!   deadline ([`crate::limits::KafkaLimits::auth_timeout`]) or more than
//!   [`UNAUTHENTICATED_BYTES_MAX`] bytes before it.
//! - Under the throughput limits ([`tributary_broker::throttle`]) a Produce or Fetch answer
//!   carries `throttle_time_ms`, and no further request of the connection is read for that
//!   long (Kafka's channel muting); a client older than KIP-219 (Produce < 6, Fetch < 8) also
//!   gets the answer only after that time, as a Kafka broker delays it.
//! - A frame over the size limit, an unknown API, an unadvertised version or a body that does
//!   not decode closes the connection (logged at debug level, never with a secret); nothing a
//!   client sends can panic the server.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::Encodable;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Semaphore, SemaphorePermit, mpsc, watch};
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
    /// Until when the connection is muted (no request read) for the throughput limits.
    muted_until: Option<Instant>,
}

/// The door's name in the throttle's counters.
pub(crate) const DOOR: &str = "kafka";

/// The first Produce version whose clients wait out `throttle_time_ms` themselves (KIP-219):
/// older ones get their answer only after the throttle time.
const PRODUCE_CLIENT_THROTTLES: i16 = 6;

/// The first Fetch version whose clients wait out `throttle_time_ms` themselves (KIP-219).
const FETCH_CLIENT_THROTTLES: i16 = 8;

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

    /// Mutes the connection for `throttle` from now (the throughput limits' delay), as a Kafka
    /// broker mutes a client's channel for its quota's throttle time.
    fn mute_for(&mut self, throttle: Duration) {
        if throttle.is_zero() {
            return;
        }
        let until = Instant::now() + throttle;
        self.muted_until = Some(self.muted_until.map_or(until, |u| u.max(until)));
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

/// How many requests of one connection may be started and not yet answered. Only produce
/// requests whose batches are all written to their logs are started ahead of their answers
/// (librdkafka keeps up to 5 in flight with idempotence, up to a million without); each holds
/// the receivers of its acknowledgements, not its records.
const REQUESTS_IN_FLIGHT_MAX: usize = 32;

/// A started request's answer: the response's bytes, none (a produce with acks 0), or why the
/// connection closes.
type Answer<'a> = Pin<Box<dyn Future<Output = Result<Option<BytesMut>, String>> + Send + 'a>>;

/// A started request on its way to the client, holding one of the connection's
/// [`REQUESTS_IN_FLIGHT_MAX`] places until its response is written.
struct InFlight<'a> {
    answer: Answer<'a>,
    _place: SemaphorePermit<'a>,
}

/// Serves one connection (plain TCP, or TLS once its handshake is done) until the client closes
/// it, a rule above closes it, or shutdown.
///
/// Requests are read and started by one half and answered in order by the other, so a
/// producer's next request can be read while earlier ones wait for their sync. Every other
/// request is handled only once all earlier ones are answered, as a Kafka broker handles a
/// connection's requests one at a time.
pub(crate) async fn serve<S>(stream: S, peer: SocketAddr, ctx: Arc<Context>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (reader, writer) = tokio::io::split(stream);
    let places = Semaphore::new(REQUESTS_IN_FLIGHT_MAX);
    let (answers_tx, answers_rx) = mpsc::channel(REQUESTS_IN_FLIGHT_MAX);
    let read = std::pin::pin!(read_requests(reader, peer, &ctx, &places, answers_tx));
    let mut write = std::pin::pin!(write_answers(writer, peer, &ctx, answers_rx));
    tokio::select! {
        // What was started is still answered (a failed login's refusal among it).
        () = read => write.await,
        // The client is gone, or shutdown: nothing more is read.
        () = &mut write => {}
    }
}

/// Reads, checks and starts the connection's requests, handing their answers to
/// [`write_answers`] in order.
async fn read_requests<'a, R>(
    reader: R,
    peer: SocketAddr,
    ctx: &'a Context,
    places: &'a Semaphore,
    answers: mpsc::Sender<InFlight<'a>>,
) where
    R: AsyncRead + Unpin + Send,
{
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
        let started = match frame {
            Ok(None) => return,
            Ok(Some(frame)) => {
                if !authenticated {
                    unauthenticated_bytes += 4 + frame.len() as u64;
                }
                start(frame, &mut session, ctx, places).await
            }
            Err(reason) => Err(reason),
        };
        let (in_flight, wait_for_answer) = match started {
            Ok(started) => started,
            Err(reason) => {
                tracing::debug!(%peer, %reason, "Kafka connection closed");
                return;
            }
        };
        if answers.send(in_flight).await.is_err() {
            return;
        }
        if (wait_for_answer || session.close_after_response) && all_answered(places).await.is_err()
        {
            return;
        }
        if let Some(until) = session.muted_until.take() {
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                () = crate::connection::stopping(&mut shutdown) => return,
            }
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

/// Writes the answers of started requests, in the order they were started, as each is ready.
async fn write_answers<W>(
    mut writer: W,
    peer: SocketAddr,
    ctx: &Context,
    mut answers: mpsc::Receiver<InFlight<'_>>,
) where
    W: AsyncWrite + Unpin + Send,
{
    let mut shutdown = ctx.shutdown.clone();
    loop {
        let next = tokio::select! {
            next = answers.recv() => next,
            () = stopping(&mut shutdown) => return,
        };
        let Some(InFlight { answer, _place }) = next else {
            return;
        };
        let written = tokio::select! {
            answer = answer => match answer {
                Ok(Some(response)) => writer.write_all(&response).await.map_err(|e| format!("write failed: {e}")),
                Ok(None) => Ok(()),
                Err(reason) => Err(reason),
            },
            () = stopping(&mut shutdown) => return,
        };
        if let Err(reason) = written {
            tracing::debug!(%peer, %reason, "Kafka connection closed");
            return;
        }
    }
}

/// Returns once every started request of the connection is answered.
async fn all_answered(places: &Semaphore) -> Result<(), String> {
    let all = u32::try_from(REQUESTS_IN_FLIGHT_MAX).expect("a small constant");
    places
        .acquire_many(all)
        .await
        .map(drop)
        .map_err(|_| "the connection's pipeline is closed".to_owned())
}

/// A place in the connection's pipeline for one more started request.
async fn place(places: &Semaphore) -> Result<SemaphorePermit<'_>, String> {
    places
        .acquire()
        .await
        .map_err(|_| "the connection's pipeline is closed".to_owned())
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

/// Starts one request frame: its answer in the pipeline, and whether the next request must
/// wait until it is written; or why the connection closes.
///
/// A produce request whose batches are all written by [`produce::start`] is answered later, so
/// the next request can be read meanwhile. Any other request waits until every earlier one is
/// answered and is then handled here.
async fn start<'a>(
    frame: Bytes,
    session: &mut Session,
    ctx: &'a Context,
    places: &'a Semaphore,
) -> Result<(InFlight<'a>, bool), String> {
    let request = request::decode(frame, session.authenticated())?;
    if let Some(id) = request.client_id.as_deref()
        && id != session.client_id
    {
        session.client_id = id.chars().take(CLIENT_ID_CHARS_MAX).collect();
    }
    let (key, version, correlation_id) = (request.key, request.version, request.correlation_id);
    let response = match request.body {
        Body::Decoded(body) => match *body {
            RequestKind::Produce(produce) => {
                let place = place(places).await?;
                let started = produce::start(produce, session, ctx);
                let wait_for_answer = !started.all_queued();
                let throttle = started.throttle;
                session.mute_for(throttle);
                let answer = Box::pin(async move {
                    if version < PRODUCE_CLIENT_THROTTLES {
                        // An older client does not back off itself: the answer comes late.
                        tokio::time::sleep(throttle).await;
                    }
                    match started.answer(ctx).await {
                        Some(response) => {
                            let response = ResponseKind::Produce(response);
                            encode(key, version, correlation_id, &response).map(Some)
                        }
                        None => Ok(None),
                    }
                });
                let in_flight = InFlight {
                    answer,
                    _place: place,
                };
                return Ok((in_flight, wait_for_answer));
            }
            body => {
                all_answered(places).await?;
                dispatch(body, version, session, ctx).await?
            }
        },
        Body::ApiVersionsTooNew => {
            // KIP-511: a v0 body listing our ranges, so the client retries at our highest.
            all_answered(places).await?;
            let response = versions::api_versions(ResponseError::UnsupportedVersion.code());
            let response = ResponseKind::ApiVersions(response);
            let response = encode(key, 0, correlation_id, &response)?;
            return Ok((ready(Some(response), place(places).await?), false));
        }
    };
    let response = encode(key, version, correlation_id, &response)?;
    Ok((ready(Some(response), place(places).await?), false))
}

/// An answer already known.
fn ready(response: Option<BytesMut>, place: SemaphorePermit<'_>) -> InFlight<'_> {
    InFlight {
        answer: Box::pin(std::future::ready(Ok(response))),
        _place: place,
    }
}

/// Runs one decoded request other than a produce.
async fn dispatch(
    request: RequestKind,
    version: i16,
    session: &mut Session,
    ctx: &Context,
) -> Result<ResponseKind, String> {
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
        RequestKind::InitProducerId(request) => {
            ResponseKind::InitProducerId(produce::init_producer_id(&request, ctx))
        }
        RequestKind::ListOffsets(request) => {
            ResponseKind::ListOffsets(offsets::answer(&request, session, ctx))
        }
        RequestKind::Fetch(request) => {
            let (response, throttle) = fetch::answer(request, session, ctx).await;
            session.mute_for(throttle);
            if version < FETCH_CLIENT_THROTTLES {
                // An older client does not back off itself: the answer comes late.
                tokio::time::sleep(throttle).await;
            }
            let throttle_time_ms = i32::try_from(throttle.as_millis()).unwrap_or(i32::MAX);
            ResponseKind::Fetch(response.with_throttle_time_ms(throttle_time_ms))
        }
        request if admin::answers(&request) => admin::answer(request, session, ctx).await?,
        request if groups::answers(&request) => {
            groups::answer(request, version, session, ctx).await?
        }
        other => return Err(format!("no handler for {other:?}")),
    };
    Ok(response)
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
