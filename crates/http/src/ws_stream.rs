//! The WebSocket ↔ byte-stream adapter: a WebSocket connection whose binary messages carry a
//! byte stream (AMQP's WebSocket binding, subprotocol `AMQPWSB10`) becomes an
//! `AsyncRead + AsyncWrite` stream for a protocol that knows nothing of WebSockets.
//!
//! [`byte_stream`] returns the application's end of a bounded in-memory pipe and the pump that
//! moves bytes between that pipe and the WebSocket; the caller runs the pump (it ends when the
//! connection does).
//!
//! # Guarantees
//! - Bytes keep their order and message boundaries mean nothing: a binary message may hold a
//!   part of an AMQP frame or several frames. Each chunk the application has written goes out
//!   as one binary message of at most [`PIPE_BYTES`].
//! - Memory is bounded: at most [`PIPE_BYTES`] wait in the pipe per direction, and one message
//!   read from the socket is at most what the WebSocket layer was configured to accept
//!   ([`crate::limits::WEBSOCKET_MESSAGE_BYTES_MAX`]). When the pipe is full the pump waits,
//!   and so does the peer, as TCP makes it.
//! - Pings are answered by the WebSocket layer; pongs are ignored.
//! - A text message is a protocol error: the connection closes with 1003 (unsupported data).
//! - Whoever ends first, the application reads end-of-stream. When the application ends first,
//!   the bytes it wrote are sent, then a close (1000); the peer's answer is awaited at most
//!   [`CLOSE_WAIT`]. A peer's close is answered by the WebSocket layer.
//! - Nothing the peer sends can panic the pump.

use std::fmt::Display;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, close_code};
use bytes::BytesMut;
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};

/// Bytes buffered per direction between the WebSocket and the application. 64 KiB holds many
/// small AMQP frames and keeps a slow reader from pinning more than this per connection; a
/// 1 MiB frame simply passes through in pieces.
pub(crate) const PIPE_BYTES: usize = 64 * 1024;

/// How long a close we sent waits for the peer's answer before the connection is dropped: a
/// peer that has gone silent must not hold the connection.
pub(crate) const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// The reason a text message is refused with.
const TEXT_REFUSED: &str = "AMQP over WebSockets takes binary messages only";

/// Why a connection ended, and so what, if anything, is still said to the peer.
#[derive(Debug, PartialEq, Eq)]
enum Ending {
    /// The peer closed; the WebSocket layer has answered.
    PeerClosed,
    /// The application closed its end (or stopped reading): close normally.
    ApplicationClosed,
    /// The peer sent a text message: close with 1003.
    Text,
    /// The socket failed (or a message was too large): nothing more can be said.
    SocketFailed(String),
}

/// The application's end of the stream carried by `socket`, and the pump to run beside it.
pub(crate) fn byte_stream<S, E>(
    socket: S,
) -> (DuplexStream, impl Future<Output = ()> + Send + 'static)
where
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Send + 'static,
    E: Display + Send + 'static,
{
    let (application, pipe) = tokio::io::duplex(PIPE_BYTES);
    (application, pump(socket, pipe))
}

/// Moves bytes both ways until either side ends, then closes as [`Ending`] says.
async fn pump<S, E>(socket: S, pipe: DuplexStream)
where
    S: Stream<Item = Result<Message, E>> + Sink<Message, Error = E> + Send + 'static,
    E: Display + Send + 'static,
{
    let (mut sink, mut stream) = socket.split();
    let (from_application, mut to_application) = tokio::io::split(pipe);
    let ending = tokio::select! {
        ending = inbound(&mut stream, &mut to_application) => ending,
        ending = outbound(from_application, &mut sink) => ending,
    };
    // The application reads end-of-stream whoever ended.
    let _ = to_application.shutdown().await;
    let close = match ending {
        Ending::PeerClosed => return,
        Ending::SocketFailed(error) => {
            tracing::debug!(%error, "AMQP over WebSockets: the socket failed");
            return;
        }
        Ending::ApplicationClosed => CloseFrame {
            code: close_code::NORMAL,
            reason: "".into(),
        },
        Ending::Text => CloseFrame {
            code: close_code::UNSUPPORTED,
            reason: TEXT_REFUSED.into(),
        },
    };
    if sink.send(Message::Close(Some(close))).await.is_err() {
        return;
    }
    // Until the peer answers (the stream then ends), or for CLOSE_WAIT at most.
    let answered = async { while let Some(Ok(_)) = stream.next().await {} };
    let _ = tokio::time::timeout(CLOSE_WAIT, answered).await;
}

/// Peer → application: the bytes of binary messages, in order.
async fn inbound<S, E>(stream: &mut S, to_application: &mut WriteHalf<DuplexStream>) -> Ending
where
    S: Stream<Item = Result<Message, E>> + Unpin,
    E: Display,
{
    while let Some(message) = stream.next().await {
        match message {
            Ok(Message::Binary(bytes)) => {
                if to_application.write_all(&bytes).await.is_err() {
                    return Ending::ApplicationClosed;
                }
            }
            // Pings are answered by the WebSocket layer; after a close it answers, and the
            // stream ends.
            Ok(Message::Ping(_) | Message::Pong(_) | Message::Close(_)) => {}
            Ok(Message::Text(_)) => return Ending::Text,
            Err(error) => return Ending::SocketFailed(error.to_string()),
        }
    }
    Ending::PeerClosed
}

/// Application → peer: what the application writes, one binary message per chunk read.
async fn outbound<S, E>(mut from_application: ReadHalf<DuplexStream>, sink: &mut S) -> Ending
where
    S: Sink<Message, Error = E> + Unpin,
    E: Display,
{
    let mut buffer = BytesMut::new();
    loop {
        buffer.reserve(PIPE_BYTES);
        match from_application.read_buf(&mut buffer).await {
            Ok(0) | Err(_) => return Ending::ApplicationClosed,
            Ok(_) => {
                let chunk = buffer.split().freeze();
                if let Err(error) = sink.send(Message::Binary(chunk)).await {
                    return Ending::SocketFailed(error.to_string());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::Bytes;
    use tokio::io::DuplexStream;
    use tokio::sync::mpsc;
    use tokio::task::JoinHandle;

    use super::*;

    /// A WebSocket whose peer is the test: what the test puts on `incoming` arrives; what the
    /// pump sends appears on `sent`.
    struct FakeSocket {
        incoming: mpsc::UnboundedReceiver<Result<Message, String>>,
        sent: mpsc::UnboundedSender<Message>,
    }

    impl Stream for FakeSocket {
        type Item = Result<Message, String>;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            self.incoming.poll_recv(cx)
        }
    }

    impl Sink<Message> for FakeSocket {
        type Error = String;
        fn poll_ready(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), String>> {
            Poll::Ready(Ok(()))
        }
        fn start_send(self: Pin<&mut Self>, message: Message) -> Result<(), String> {
            self.sent
                .send(message)
                .map_err(|_| "the peer is gone".to_owned())
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), String>> {
            Poll::Ready(Ok(()))
        }
        fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), String>> {
            Poll::Ready(Ok(()))
        }
    }

    struct Harness {
        peer_sends: mpsc::UnboundedSender<Result<Message, String>>,
        peer_receives: mpsc::UnboundedReceiver<Message>,
        application: DuplexStream,
        pump: JoinHandle<()>,
    }

    fn harness() -> Harness {
        let (peer_sends, incoming) = mpsc::unbounded_channel();
        let (sent, peer_receives) = mpsc::unbounded_channel();
        let (application, pump) = byte_stream(FakeSocket { incoming, sent });
        Harness {
            peer_sends,
            peer_receives,
            application,
            pump: tokio::spawn(pump),
        }
    }

    fn binary(bytes: &[u8]) -> Result<Message, String> {
        Ok(Message::Binary(Bytes::copy_from_slice(bytes)))
    }

    /// The SASL header and a frame, as one stream of bytes.
    const HEADER: &[u8] = b"AMQP\x03\x01\x00\x00";
    const FRAME: &[u8] = b"\x00\x00\x00\x0c\x02\x01\x00\x00\x00\x53\x10\x45";

    async fn read_to_end(application: &mut DuplexStream) -> Vec<u8> {
        let mut all = Vec::new();
        application.read_to_end(&mut all).await.unwrap();
        all
    }

    #[tokio::test]
    async fn a_frame_split_across_messages_arrives_whole() {
        let mut h = harness();
        h.peer_sends.send(binary(&HEADER[..3])).unwrap();
        h.peer_sends.send(binary(&HEADER[3..])).unwrap();
        h.peer_sends.send(binary(&FRAME[..5])).unwrap();
        h.peer_sends.send(binary(&FRAME[5..])).unwrap();
        let mut got = vec![0; HEADER.len() + FRAME.len()];
        h.application.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [HEADER, FRAME].concat());
    }

    #[tokio::test]
    async fn several_frames_in_one_message_arrive_in_order() {
        let mut h = harness();
        h.peer_sends
            .send(binary(&[HEADER, FRAME, FRAME].concat()))
            .unwrap();
        h.peer_sends.send(Ok(Message::Ping(Bytes::new()))).unwrap();
        h.peer_sends.send(binary(FRAME)).unwrap();
        drop(h.peer_sends);
        let got = read_to_end(&mut h.application).await;
        assert_eq!(got, [HEADER, FRAME, FRAME, FRAME].concat());
        h.pump.await.unwrap();
    }

    #[tokio::test]
    async fn what_the_application_writes_goes_out_as_binary_messages() {
        let mut h = harness();
        h.application.write_all(HEADER).await.unwrap();
        h.application.write_all(FRAME).await.unwrap();
        let mut sent = Vec::new();
        while sent.len() < HEADER.len() + FRAME.len() {
            match h.peer_receives.recv().await.unwrap() {
                Message::Binary(bytes) => sent.extend_from_slice(&bytes),
                other => panic!("not binary: {other:?}"),
            }
        }
        assert_eq!(sent, [HEADER, FRAME].concat());
    }

    #[tokio::test]
    async fn a_large_write_goes_out_in_bounded_messages() {
        let mut h = harness();
        let large: Vec<u8> = (0..PIPE_BYTES * 3).map(|i| (i % 251) as u8).collect();
        let written = large.clone();
        let writer = tokio::spawn(async move {
            h.application.write_all(&written).await.unwrap();
            h.application
        });
        let mut sent = Vec::new();
        while sent.len() < large.len() {
            let Message::Binary(bytes) = h.peer_receives.recv().await.unwrap() else {
                panic!("not binary");
            };
            assert!(bytes.len() <= PIPE_BYTES, "{}", bytes.len());
            sent.extend_from_slice(&bytes);
        }
        assert_eq!(sent, large);
        drop(writer.await.unwrap());
    }

    #[tokio::test]
    async fn the_peers_close_ends_the_applications_stream() {
        let mut h = harness();
        h.peer_sends.send(binary(FRAME)).unwrap();
        h.peer_sends.send(Ok(Message::Close(None))).unwrap();
        // The WebSocket layer ends the stream once it has answered the close.
        drop(h.peer_sends);
        assert_eq!(read_to_end(&mut h.application).await, FRAME);
        h.pump.await.unwrap();
        // The WebSocket layer answered; the pump says nothing more.
        assert!(h.peer_receives.recv().await.is_none());
    }

    #[tokio::test]
    async fn the_application_closing_sends_its_bytes_then_a_normal_close() {
        let mut h = harness();
        h.application.write_all(FRAME).await.unwrap();
        drop(h.application);
        let Message::Binary(bytes) = h.peer_receives.recv().await.unwrap() else {
            panic!("not binary");
        };
        assert_eq!(&bytes[..], FRAME);
        let Message::Close(Some(close)) = h.peer_receives.recv().await.unwrap() else {
            panic!("not a close");
        };
        assert_eq!(close.code, close_code::NORMAL);
        // The peer answers; the pump ends.
        h.peer_sends.send(Ok(Message::Close(None))).unwrap();
        drop(h.peer_sends);
        h.pump.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_peer_is_dropped_after_the_close_wait() {
        let h = harness();
        drop(h.application);
        let pump = h.pump;
        tokio::time::timeout(CLOSE_WAIT * 2, pump)
            .await
            .expect("the pump ends without the peer's answer")
            .unwrap();
        drop(h.peer_sends);
    }

    #[tokio::test]
    async fn a_text_message_closes_with_unsupported_data() {
        let mut h = harness();
        h.peer_sends.send(binary(HEADER)).unwrap();
        h.peer_sends.send(Ok(Message::Text("AMQP".into()))).unwrap();
        h.peer_sends.send(binary(FRAME)).unwrap();
        assert_eq!(read_to_end(&mut h.application).await, HEADER);
        let Message::Close(Some(close)) = h.peer_receives.recv().await.unwrap() else {
            panic!("not a close");
        };
        assert_eq!(close.code, close_code::UNSUPPORTED);
        assert_eq!(close.reason.as_str(), TEXT_REFUSED);
        drop(h.peer_sends);
        h.pump.await.unwrap();
    }

    #[tokio::test]
    async fn a_socket_error_ends_the_applications_stream() {
        let mut h = harness();
        h.peer_sends.send(binary(HEADER)).unwrap();
        h.peer_sends
            .send(Err("Space limit exceeded: Message too long".to_owned()))
            .unwrap();
        assert_eq!(read_to_end(&mut h.application).await, HEADER);
        h.pump.await.unwrap();
        assert!(h.peer_receives.recv().await.is_none());
    }
}
