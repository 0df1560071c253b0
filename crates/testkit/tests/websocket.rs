//! AMQP over WebSockets at the protocol level: a connection the HTTP door hands over is served
//! by the AMQP door as a TCP connection is (the same protocol header exchange), and the AMQP
//! door's shutdown closes it. The official SDKs' transports are in `python_interop.rs` and
//! `js_interop.rs`.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tributary_testkit::TestHub;

/// The bare AMQP 1.0 protocol header.
const AMQP_HEADER: &[u8] = b"AMQP\x00\x01\x00\x00";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_amqp_doors_shutdown_closes_websocket_connections() {
    let mut f = TestHub::start(&[("hub", 1)])
        .await
        .with_websockets(None)
        .await;
    let url = format!("ws://127.0.0.1:{}/$servicebus/websocket", f.http_port());
    let mut request = url.into_client_request().unwrap();
    let protocol = "AMQPWSB10".parse().unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", protocol);
    let (mut client, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    // The header in two messages; the AMQP door answers with its own.
    client
        .send(Message::binary(&AMQP_HEADER[..4]))
        .await
        .unwrap();
    client
        .send(Message::binary(&AMQP_HEADER[4..]))
        .await
        .unwrap();
    let mut answer = Vec::new();
    while answer.len() < AMQP_HEADER.len() {
        match client.next().await.unwrap().unwrap() {
            Message::Binary(bytes) => answer.extend_from_slice(&bytes),
            other => panic!("expected binary, got {other:?}"),
        }
    }
    assert_eq!(&answer[..AMQP_HEADER.len()], AMQP_HEADER);

    let stopped = tokio::time::timeout(Duration::from_secs(30), f.stop_server());
    let ended = tokio::time::timeout(Duration::from_secs(30), async {
        let mut closed = false;
        while let Some(Ok(message)) = client.next().await {
            closed |= matches!(message, Message::Close(_));
        }
        closed
    });
    let (stopped, ended) = tokio::join!(stopped, ended);
    stopped.expect("the AMQP door stops");
    assert!(
        ended.expect("the WebSocket ends"),
        "the WebSocket was closed"
    );
    f.stop().await;
}
