//! AMQP over WebSockets at the HTTP door: the upgrade at `/$servicebus/websocket` with the
//! subprotocol `AMQPWSB10`, the byte stream it carries (handed here to an echoing stand-in for
//! the AMQP door), and the refusals. The server requires request signatures: the upgrade must
//! pass without one (AMQP authenticates the connection itself).

use std::net::SocketAddr;

use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tributary_http::{AMQP_WEBSOCKET_PATH, AmqpOverWebSockets, limits};
use tributary_testkit::oci::{Server, Setup, request, start};

type Client = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A signed server whose AMQP door echoes every byte and reports each connection's peer.
async fn echo_server() -> (Server, mpsc::UnboundedReceiver<SocketAddr>) {
    let (peers, peers_rx) = mpsc::unbounded_channel();
    let echo = AmqpOverWebSockets::new(move |stream, peer| {
        let _ = peers.send(peer);
        Box::pin(async move {
            let (mut from, mut to) = tokio::io::split(stream);
            let _ = tokio::io::copy(&mut from, &mut to).await;
        })
    });
    let server = start(Setup {
        websocket_amqp: Some(echo),
        ..Setup::default()
    })
    .await;
    (server, peers_rx)
}

/// Opens the WebSocket at the SDKs' path, asking for `protocol` if any.
async fn connect(
    server: &Server,
    protocol: Option<&str>,
) -> Result<(Client, SocketAddr, Option<String>), WsError> {
    connect_at(server, AMQP_WEBSOCKET_PATH, protocol).await
}

/// Opens the WebSocket at `path`, asking for `protocol` if any.
async fn connect_at(
    server: &Server,
    path: &str,
    protocol: Option<&str>,
) -> Result<(Client, SocketAddr, Option<String>), WsError> {
    let addr = server.http.local_addr();
    let url = format!("ws://{addr}{path}");
    let mut request = url.into_client_request().unwrap();
    if let Some(protocol) = protocol {
        request
            .headers_mut()
            .insert("sec-websocket-protocol", protocol.parse().unwrap());
    }
    let tcp = TcpStream::connect(addr).await.unwrap();
    let local = tcp.local_addr().unwrap();
    let (client, response) =
        tokio_tungstenite::client_async(request, MaybeTlsStream::Plain(tcp)).await?;
    let answered = response
        .headers()
        .get("sec-websocket-protocol")
        .map(|v| v.to_str().unwrap().to_owned());
    Ok((client, local, answered))
}

/// Reads binary messages until `n` bytes have arrived.
async fn read_bytes(client: &mut Client, n: usize) -> Vec<u8> {
    let mut got = Vec::new();
    while got.len() < n {
        match client.next().await.unwrap().unwrap() {
            Message::Binary(bytes) => got.extend_from_slice(&bytes),
            other => panic!("expected binary, got {other:?}"),
        }
    }
    got
}

#[tokio::test]
async fn the_upgrade_answers_amqpwsb10_and_carries_a_byte_stream() {
    let (server, mut peers) = echo_server().await;
    let (mut client, local, answered) = connect(&server, Some("AMQPWSB10")).await.unwrap();
    assert_eq!(answered.as_deref(), Some("AMQPWSB10"));
    assert_eq!(
        peers.recv().await.unwrap(),
        local,
        "the door learns the peer"
    );
    // A header split across two messages, then two frames in one.
    client.send(Message::binary(&b"AMQP"[..])).await.unwrap();
    client
        .send(Message::binary(&b"\x03\x01\x00\x00"[..]))
        .await
        .unwrap();
    assert_eq!(read_bytes(&mut client, 8).await, b"AMQP\x03\x01\x00\x00");
    let frames = [&b"\x00\x00\x00\x08\x02\x00\x00\x00"[..]; 2].concat();
    client.send(Message::binary(frames.clone())).await.unwrap();
    assert_eq!(read_bytes(&mut client, 16).await, frames);
    // A ping is answered (by the WebSocket layer), the stream untouched.
    client.send(Message::Ping(b"hi"[..].into())).await.unwrap();
    assert_eq!(
        client.next().await.unwrap().unwrap(),
        Message::Pong(b"hi"[..].into())
    );
    client.close(None).await.unwrap();
    while let Some(Ok(_)) = client.next().await {}
}

/// Event Hubs accepts the path with a trailing slash too, as pyamqp's own clients spell it.
#[tokio::test]
async fn the_path_with_a_trailing_slash_upgrades_too() {
    let (server, mut peers) = echo_server().await;
    let (mut client, local, answered) =
        connect_at(&server, "/$servicebus/websocket/", Some("AMQPWSB10"))
            .await
            .unwrap();
    assert_eq!(answered.as_deref(), Some("AMQPWSB10"));
    assert_eq!(peers.recv().await.unwrap(), local);
    client
        .send(Message::binary(&b"AMQP\x03\x01\x00\x00"[..]))
        .await
        .unwrap();
    assert_eq!(read_bytes(&mut client, 8).await, b"AMQP\x03\x01\x00\x00");
    client.close(None).await.unwrap();
}

#[tokio::test]
async fn a_text_message_closes_the_connection_with_unsupported_data() {
    let (server, _peers) = echo_server().await;
    let (mut client, _, _) = connect(&server, Some("AMQPWSB10")).await.unwrap();
    client.send(Message::text("AMQP")).await.unwrap();
    match client.next().await.unwrap().unwrap() {
        Message::Close(Some(close)) => {
            assert_eq!(close.code, CloseCode::Unsupported);
            assert!(close.reason.contains("binary"), "{close:?}");
        }
        other => panic!("expected a close, got {other:?}"),
    }
}

#[tokio::test]
async fn a_message_over_the_limit_ends_the_connection() {
    let (server, _peers) = echo_server().await;
    let (mut client, _, _) = connect(&server, Some("AMQPWSB10")).await.unwrap();
    let large = vec![0u8; limits::WEBSOCKET_MESSAGE_BYTES_MAX + 1];
    let _ = client.send(Message::binary(large)).await;
    // Nothing is echoed: the connection ends (closed or reset).
    loop {
        match client.next().await {
            None | Some(Err(_)) => break,
            Some(Ok(Message::Close(_))) => continue,
            Some(Ok(other)) => panic!("expected the end, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_upgrade_without_the_subprotocol_is_refused_with_400() {
    let (server, mut peers) = echo_server().await;
    for protocol in [None, Some("mqtt")] {
        let Err(WsError::Http(response)) = connect(&server, protocol).await else {
            panic!("the upgrade without AMQPWSB10 succeeded");
        };
        assert_eq!(response.status(), 400);
        let body = String::from_utf8_lossy(response.body().as_deref().unwrap_or_default());
        assert!(body.contains("Sec-WebSocket-Protocol: AMQPWSB10"), "{body}");
    }
    assert!(peers.try_recv().is_err(), "nothing reached the AMQP door");
}

#[tokio::test]
async fn a_plain_request_to_the_path_is_refused() {
    let (server, _peers) = echo_server().await;
    let answer = request(&server, "GET", AMQP_WEBSOCKET_PATH, &[], b"").await;
    answer.assert_error(400, "InvalidParameter");
    assert!(
        answer.text().contains("WebSocket upgrade"),
        "{}",
        answer.text()
    );
}

#[tokio::test]
async fn without_an_amqp_door_the_path_is_not_found() {
    let server = start(Setup::default()).await;
    let Err(WsError::Http(response)) = connect(&server, Some("AMQPWSB10")).await else {
        panic!("the upgrade succeeded without an AMQP door");
    };
    assert_eq!(response.status(), 404);
}
