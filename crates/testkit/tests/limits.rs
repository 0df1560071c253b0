//! The front doors' limits on clients that have not authenticated, from the outside. AMQP:
//! silent sockets, anonymous connections that never put a token, the per-address connection cap
//! (for raw sockets and for the official Python and JavaScript SDKs, which must raise rather
//! than hang), an
//! authenticated client sending undisturbed throughout, and the same deadlines for AMQP over
//! WebSockets. HTTP: headers sent too slowly, a stalled body, the per-address cap.
//!
//! Each test starts its own door on 127.0.0.1:0 with short deadlines and small caps (counts
//! per address are per door, so tests do not share one). The SDK tests need the SDKs
//! (`scripts/setup-python-interop`, `scripts/setup-js-interop`); without them the tests fail,
//! they never skip.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tributary_amqp::limits::ConnectionLimits;
use tributary_amqp::{AccessPolicies, AccessPolicy, AmqpConfig, Right, RunningAmqpServer};
use tributary_broker::{Broker, BrokerConfig, HubSpec};
use tributary_client::ProducerClient;
use tributary_event::{EventData, SendTarget};
use tributary_http::{AmqpOverWebSockets, AuthConfig, HttpConfig, HttpLimits, RunningHttpServer};

const HUB: &str = "limited";

/// A broker with one hub and an AMQP door with `limits`.
struct Door {
    broker: Broker,
    server: RunningAmqpServer,
    root: AccessPolicy,
    _dir: TempDir,
}

impl Door {
    async fn start(limits: ConnectionLimits) -> Door {
        let dir = tempfile::tempdir().unwrap();
        let broker = Broker::open(BrokerConfig::new(dir.path())).await.unwrap();
        broker.create_hub(HubSpec::new(HUB, 2)).await.unwrap();
        let root =
            AccessPolicy::generate("RootManageSharedAccessKey", vec![Right::Manage]).unwrap();
        let policies = AccessPolicies::new(vec![root.clone()]).unwrap();
        let mut config = AmqpConfig::new("127.0.0.1:0".parse().unwrap(), policies);
        config.limits = limits;
        let server = tributary_amqp::start(broker.clone(), config).await.unwrap();
        Door {
            broker,
            server,
            root,
            _dir: dir,
        }
    }

    /// An HTTP door (unsigned requests) over the same broker with `limits`, handing AMQP over
    /// WebSockets to this door.
    async fn http(&self, limits: HttpLimits) -> RunningHttpServer {
        let connections = self.server.connections();
        let auth = AuthConfig::DevelopmentUnauthenticated;
        let mut config = HttpConfig::new("127.0.0.1:0".parse().unwrap(), auth);
        config.limits = limits;
        config.websocket_amqp = Some(AmqpOverWebSockets::new(move |stream, peer| {
            let connections = connections.clone();
            Box::pin(async move { connections.serve(stream, peer).await })
        }));
        tributary_http::start(self.broker.clone(), config)
            .await
            .unwrap()
    }

    fn addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    fn conn(&self) -> String {
        tributary_amqp::connection_string("127.0.0.1", self.addr().port(), &self.root)
    }

    async fn stop(self) {
        self.server.shutdown().await;
        self.broker.shutdown().await.unwrap();
    }
}

fn limits(per_address: usize, handshake_ms: u64, auth_ms: u64) -> ConnectionLimits {
    ConnectionLimits {
        connections_max: 1_000,
        connections_per_address_max: per_address,
        handshake_timeout: Duration::from_millis(handshake_ms),
        auth_timeout: Duration::from_millis(auth_ms),
    }
}

/// An AMQP frame on channel 0 around `body`.
fn frame(frame_type: u8, body: &[u8]) -> Vec<u8> {
    frame_on(frame_type, 0, body)
}

/// An AMQP frame on `channel` around `body`.
fn frame_on(frame_type: u8, channel: u16, body: &[u8]) -> Vec<u8> {
    let size = u32::try_from(8 + body.len()).unwrap();
    let mut out = size.to_be_bytes().to_vec();
    out.extend_from_slice(&[2, frame_type]);
    out.extend_from_slice(&channel.to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// A described list (`descriptor` a small ulong) of already-encoded fields.
fn described_list(descriptor: u8, fields: &[&[u8]]) -> Vec<u8> {
    let content: Vec<u8> = fields.concat();
    let mut out = vec![0x00, 0x53, descriptor, 0xc0];
    out.push(u8::try_from(content.len() + 1).unwrap());
    out.push(u8::try_from(fields.len()).unwrap());
    out.extend_from_slice(&content);
    out
}

/// A short AMQP string or symbol (`code` 0xa1 or 0xa3).
fn short(code: u8, text: &str) -> Vec<u8> {
    let mut out = vec![code, u8::try_from(text.len()).unwrap()];
    out.extend_from_slice(text.as_bytes());
    out
}

/// Opens a connection the way the SDKs begin: SASL ANONYMOUS, the AMQP header and `open` — and
/// then puts no token.
async fn anonymous_open(addr: SocketAddr) -> TcpStream {
    let mut socket = TcpStream::connect(addr).await.unwrap();
    socket.write_all(b"AMQP\x03\x01\x00\x00").await.unwrap();
    let init = described_list(0x41, &[&short(0xa3, "ANONYMOUS")]);
    socket.write_all(&frame(1, &init)).await.unwrap();
    socket.write_all(b"AMQP\x00\x01\x00\x00").await.unwrap();
    let open = described_list(0x10, &[&short(0xa1, "limits-test")]);
    socket.write_all(&frame(0, &open)).await.unwrap();
    socket
}

/// Everything the server sends until it closes the socket, and how long that took; fails if
/// it is still open after `within`.
async fn read_to_end(socket: &mut TcpStream, within: Duration) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    let mut got = Vec::new();
    let read = tokio::time::timeout(within, socket.read_to_end(&mut got)).await;
    assert!(
        read.is_ok(),
        "the server kept the connection open beyond {within:?}"
    );
    (got, started.elapsed())
}

/// What the server sends until it has sent `needle`, and how long that took; fails if it has
/// not within `within`.
async fn read_until(socket: &mut TcpStream, needle: &str, within: Duration) -> (Vec<u8>, Duration) {
    let started = Instant::now();
    let mut got = Vec::new();
    while !contains(&got, needle) {
        let mut chunk = [0u8; 4096];
        let read =
            tokio::time::timeout_at((started + within).into(), socket.read(&mut chunk)).await;
        match read {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&chunk[..n]),
            other => panic!(
                "no {needle:?} within {within:?} ({other:?}): {}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
    (got, started.elapsed())
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_socket_is_closed_after_the_handshake_timeout() {
    let door = Door::start(limits(10, 600, 5_000)).await;
    let mut socket = TcpStream::connect(door.addr()).await.unwrap();
    let (got, took) = read_to_end(&mut socket, Duration::from_secs(5)).await;
    assert!(
        got.is_empty(),
        "no frame can be sent before the header: {got:?}"
    );
    assert!(
        took >= Duration::from_millis(500),
        "closed too early: {took:?}"
    );
    // A socket that sent only the SASL header is cut off the same way.
    let mut socket = TcpStream::connect(door.addr()).await.unwrap();
    socket.write_all(b"AMQP\x03\x01\x00\x00").await.unwrap();
    let (_, took) = read_to_end(&mut socket, Duration::from_secs(5)).await;
    assert!(
        took >= Duration::from_millis(500),
        "closed too early: {took:?}"
    );
    door.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_connection_without_a_token_is_closed_with_unauthorized_access() {
    let door = Door::start(limits(10, 300, 1_200)).await;
    let mut socket = anonymous_open(door.addr()).await;
    let (got, took) = read_to_end(&mut socket, Duration::from_secs(10)).await;
    assert!(
        contains(&got, "amqp:unauthorized-access"),
        "no unauthorized-access close: {}",
        String::from_utf8_lossy(&got)
    );
    assert!(contains(&got, "put a valid token on $cbs"));
    // It opened in time, so the handshake timeout did not end it; the authentication one did.
    assert!(
        took >= Duration::from_millis(1_100),
        "closed too early: {took:?}"
    );
    door.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anonymous_connection_may_not_pile_up_sessions() {
    let door = Door::start(limits(10, 5_000, 5_000)).await;
    let mut socket = anonymous_open(door.addr()).await;
    // begin: remote-channel null, next-outgoing-id 0, incoming-window 10, outgoing-window 10.
    let begin = described_list(0x11, &[&[0x40], &[0x43], &[0x52, 10], &[0x52, 10]]);
    for channel in 0..10 {
        socket
            .write_all(&frame_on(0, channel, &begin))
            .await
            .unwrap();
    }
    let (got, took) = read_until(
        &mut socket,
        "amqp:resource-limit-exceeded",
        Duration::from_secs(8),
    )
    .await;
    assert!(
        contains(&got, "sessions"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(
        took < Duration::from_secs(2),
        "closed by a deadline, not the cap: {took:?}"
    );
    read_to_end(&mut socket, Duration::from_secs(8)).await;
    door.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_address_cap_refuses_with_resource_limit_while_an_authenticated_client_sends() {
    let door = Door::start(limits(3, 20_000, 20_000)).await;
    let producer = ProducerClient::connect(&door.conn(), HUB).await.unwrap();
    let send = |i: usize| {
        let producer = &producer;
        async move {
            let started = Instant::now();
            let events = [EventData::new(format!("event-{i}").into_bytes())];
            producer
                .send(&events, SendTarget::Partition("0".into()))
                .await
                .expect("the authenticated client keeps sending");
            started.elapsed()
        }
    };
    send(0).await;
    // Two more connections fill the address's three slots.
    let held = [
        anonymous_open(door.addr()).await,
        anonymous_open(door.addr()).await,
    ];
    send(1).await;
    let mut refused = anonymous_open(door.addr()).await;
    let (got, took) = read_until(
        &mut refused,
        "amqp:resource-limit-exceeded",
        Duration::from_secs(5),
    )
    .await;
    assert!(
        contains(&got, "maximum of 3"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    // A peer that attaches nothing gets the close after the refusal's one-second wait for a
    // link, and is held at most the refusal timeout (5 s) waiting for its close.
    read_to_end(&mut refused, Duration::from_secs(7)).await;
    // The authenticated client was never touched.
    for i in 2..20 {
        let took = send(i).await;
        assert!(took < Duration::from_secs(2), "send {i} took {took:?}");
    }
    // A slot given back is usable again.
    drop(held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut again = anonymous_open(door.addr()).await;
    let mut first = [0u8; 8];
    again.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"AMQP\x03\x01\x00\x00", "the SASL exchange starts");
    producer.close().await;
    door.stop().await;
}

/// With the address's two slots held, an official SDK's send (`send`, given the connection
/// string) must fail with the cap's refusal (its text in `result[error_field]`) within `bound`
/// — never hang — and store nothing.
async fn an_sdk_is_refused_by_the_cap<F, Fut>(
    sdk: &str,
    error_field: &str,
    bound: Duration,
    send: F,
) where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = serde_json::Value>,
{
    let door = Door::start(limits(2, 20_000, 20_000)).await;
    let held = [
        anonymous_open(door.addr()).await,
        anonymous_open(door.addr()).await,
    ];
    let started = Instant::now();
    let result = send(door.conn()).await;
    let took = started.elapsed();
    assert_eq!(result["sent"], false, "{result}");
    let error = result[error_field].as_str().unwrap_or_default();
    assert!(
        error.contains("resource-limit-exceeded") || error.contains("maximum of 2"),
        "{result}"
    );
    assert!(took < bound, "the {sdk} SDK took {took:?} to give up");
    eprintln!("the {sdk} SDK raised after {took:?}: {result}");
    let stored = door.broker.partition_properties(HUB, "0").unwrap();
    assert!(stored.is_empty, "a refused send stored nothing: {stored:?}");
    drop(held);
    door.stop().await;
}

/// The Python SDK takes the refusal as a connection error, which its producer retries three
/// times with backoff (its default `retry_total`) before it raises: about 13 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_raises_when_refused_by_the_cap() {
    let bound = Duration::from_secs(30);
    an_sdk_is_refused_by_the_cap("Python", "error", bound, |conn| async move {
        let args = json!({"conn": conn, "hub": HUB});
        tributary_testkit::run_python("interop.py", "send-expect", args).await
    })
    .await;
}

/// The JavaScript SDK (rhea) took an `open` followed by a `close` for an open connection and
/// waited out its operation timeout; a refused link reaches it as the condition, which it
/// raises at once (`QuotaExceededError`, not retried).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_js_sdk_raises_when_refused_by_the_cap() {
    let bound = Duration::from_secs(5);
    an_sdk_is_refused_by_the_cap("JavaScript", "message", bound, |conn| async move {
        let args =
            json!({"conn": conn, "hub": HUB, "count": 1, "prefix": "capped", "max_retries": 1});
        tributary_testkit::run_node("send-batch", args).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_over_websockets_gets_the_same_deadlines() {
    let door = Door::start(limits(10, 500, 5_000)).await;
    let http = door.http(HttpLimits::default()).await;
    let url = format!("ws://{}/$servicebus/websocket", http.local_addr());
    let mut request =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url)
            .unwrap();
    let protocol = "AMQPWSB10".parse().unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", protocol);
    let (mut client, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let started = Instant::now();
    // The protocol header, then nothing: no `open` within the handshake timeout.
    let header = b"AMQP\x00\x01\x00\x00".to_vec();
    client
        .send(tokio_tungstenite::tungstenite::Message::binary(header))
        .await
        .unwrap();
    let mut got = Vec::new();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(message)) = client.next().await {
            got.extend_from_slice(&message.into_data());
        }
    })
    .await;
    assert!(ended.is_ok(), "the WebSocket was kept open");
    assert!(
        contains(&got, "amqp:unauthorized-access") && contains(&got, "did not open"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    assert!(started.elapsed() >= Duration::from_millis(400));
    http.shutdown().await.unwrap();
    door.stop().await;
}

fn http_limits(per_address: usize, header_ms: u64, body_ms: u64) -> HttpLimits {
    HttpLimits {
        connections_max: 1_000,
        connections_per_address_max: per_address,
        header_read_timeout: Duration::from_millis(header_ms),
        body_read_timeout: Duration::from_millis(body_ms),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_client_sending_headers_slowly_is_cut_off() {
    let door = Door::start(limits(10, 5_000, 5_000)).await;
    let http = door.http(http_limits(10, 500, 5_000)).await;
    let socket = TcpStream::connect(http.local_addr()).await.unwrap();
    let (mut reader, mut writer) = socket.into_split();
    let started = Instant::now();
    // Slowloris: a byte of a header every 50 ms, never finishing the request.
    let trickle = tokio::spawn(async move {
        writer.write_all(b"GET /health HTTP/1.1\r\n").await?;
        for _ in 0..100 {
            writer.write_all(b"x").await?;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        std::io::Result::Ok(())
    });
    let mut sink = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(4), reader.read_to_end(&mut sink)).await;
    let took = started.elapsed();
    assert!(read.is_ok(), "the server kept a slow client for {took:?}");
    assert!(
        took >= Duration::from_millis(400),
        "cut off too early: {took:?}"
    );
    assert!(took < Duration::from_secs(2), "cut off too late: {took:?}");
    trickle.abort();
    // A prompt client is served as before.
    let mut socket = TcpStream::connect(http.local_addr()).await.unwrap();
    socket
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let (answer, _) = read_to_end(&mut socket, Duration::from_secs(5)).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    http.shutdown().await.unwrap();
    door.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_http_body_is_answered_408() {
    let door = Door::start(limits(10, 5_000, 5_000)).await;
    let http = door.http(http_limits(10, 5_000, 500)).await;
    let mut socket = TcpStream::connect(http.local_addr()).await.unwrap();
    let head = format!(
        "POST /20180418/streams/{HUB}/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"messages\""
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    let (answer, took) = read_until(&mut socket, "RequestTimeout", Duration::from_secs(5)).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(took >= Duration::from_millis(400), "{took:?}");
    http.shutdown().await.unwrap();
    door.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_per_address_cap_answers_429() {
    let door = Door::start(limits(10, 5_000, 5_000)).await;
    let http = door.http(http_limits(2, 5_000, 5_000)).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(TcpStream::connect(http.local_addr()).await.unwrap());
    }
    let mut refused = TcpStream::connect(http.local_addr()).await.unwrap();
    let (answer, _) = read_to_end(&mut refused, Duration::from_secs(5)).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 429"), "{text}");
    assert!(
        text.contains("TooManyRequests") && text.contains("maximum of 2"),
        "{text}"
    );
    // The held connections are served.
    held[0]
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let (answer, _) = read_to_end(&mut held[0], Duration::from_secs(5)).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    http.shutdown().await.unwrap();
    door.stop().await;
}
