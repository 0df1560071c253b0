//! The connection's byte stream as the engine sees it.
//!
//! - **Out**: every header and frame the engine writes is padded ([`super::pad::Framer`]) and
//!   queued for a writer task that owns the socket's write half. The engine flushes after each
//!   frame; a flush here only hands the bytes over, and the writer sends whatever has queued up
//!   in one system call. Many small frames — a receive link's deliveries, one transfer each —
//!   thus leave in few writes, and the peer wakes for few reads.
//! - **In**: reads pass through, except that the peer's `open` is adjusted on its way to the
//!   engine ([`super::pad::Inbound`]).
//!
//! # Backpressure
//! At most [`OUT_BYTES_MAX`] bytes wait for the socket; beyond that the engine's writes wait
//! until the writer has sent them, as they would wait for the socket.
//!
//! # Shutdown and errors
//! Shutting the stream down (or dropping it) lets the writer send what is queued, then shut the
//! socket's write side; once the stream is dropped, a peer that reads nothing holds the socket
//! open for at most [`CLOSE_TIMEOUT`]. A failed socket write fails every later write and flush.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker, ready};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf, ReadHalf, WriteHalf};
use tokio::sync::Notify;

use super::pad::{Framer, Inbound};
use crate::limits::CLOSE_TIMEOUT;

/// Above this many bytes waiting for the socket, the engine's writes wait for the writer.
const OUT_BYTES_MAX: usize = 4 * 1024 * 1024;

/// A writer's buffer above this capacity is given back after use, so a connection that once
/// had a burst does not keep megabytes while idle.
const BUFFER_KEEP_BYTES: usize = 64 * 1024;

/// What the engine and the writer task share.
#[derive(Debug, Default)]
struct Outbox {
    state: Mutex<Out>,
    wake_writer: Notify,
    /// The engine dropped the stream: a write that is stuck (the peer reads nothing) gets
    /// [`CLOSE_TIMEOUT`] more, then the writer gives up and the socket closes.
    dropped: Notify,
}

#[derive(Debug, Default)]
struct Out {
    /// Padded bytes waiting for the writer.
    queued: Vec<u8>,
    /// The engine, waiting for room or for the shutdown to complete.
    engine: Option<Waker>,
    /// The socket write that failed.
    failed: Option<io::ErrorKind>,
    /// No more bytes will come: send what is queued, then shut the write side.
    closing: bool,
    /// The writer is done (shut down or failed).
    closed: bool,
}

/// The stream the engine reads and writes; see the module docs.
#[derive(Debug)]
pub(crate) struct PaddedStream<S> {
    reader: ReadHalf<S>,
    inbound: Inbound,
    framer: Framer,
    outbox: Arc<Outbox>,
}

impl<S: AsyncRead + AsyncWrite + Send + 'static> PaddedStream<S> {
    /// Wraps `inner` and starts its writer task (on the current runtime).
    pub(crate) fn new(inner: S) -> Self {
        let (reader, writer) = tokio::io::split(inner);
        let outbox = Arc::new(Outbox::default());
        tokio::spawn(write_out(writer, outbox.clone()));
        PaddedStream {
            reader,
            inbound: Inbound::default(),
            framer: Framer::default(),
            outbox,
        }
    }
}

/// The writer task: sends what the engine queued, in as few writes as it can.
async fn write_out<S: AsyncWrite>(mut writer: WriteHalf<S>, outbox: Arc<Outbox>) {
    let mut batch = Vec::new();
    loop {
        let closing = {
            let mut out = outbox.state.lock().expect("outbox");
            std::mem::swap(&mut out.queued, &mut batch);
            if let Some(engine) = out.engine.take() {
                engine.wake();
            }
            out.closing
        };
        if batch.is_empty() {
            if closing {
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, writer.shutdown()).await;
                finish(&outbox, None);
                return;
            }
            // A notification sent since the lock was released is kept, so none is missed.
            outbox.wake_writer.notified().await;
            continue;
        }
        if let Err(e) = write_batch(&mut writer, &batch, &outbox).await {
            finish(&outbox, Some(e.kind()));
            return;
        }
        batch.clear();
        if batch.capacity() > BUFFER_KEEP_BYTES {
            batch = Vec::new();
        }
    }
}

/// Writes `batch`; once the stream is dropped, for at most [`CLOSE_TIMEOUT`] more.
async fn write_batch<S: AsyncWrite>(
    writer: &mut WriteHalf<S>,
    batch: &[u8],
    outbox: &Outbox,
) -> io::Result<()> {
    let write = writer.write_all(batch);
    tokio::pin!(write);
    tokio::select! {
        written = &mut write => written,
        () = outbox.dropped.notified() => {
            match tokio::time::timeout(CLOSE_TIMEOUT, &mut write).await {
                Ok(written) => written,
                Err(_) => Err(io::ErrorKind::TimedOut.into()),
            }
        }
    }
}

fn finish(outbox: &Outbox, failed: Option<io::ErrorKind>) {
    let mut out = outbox.state.lock().expect("outbox");
    out.closed = true;
    out.failed = out.failed.or(failed);
    out.queued = Vec::new();
    if let Some(engine) = out.engine.take() {
        engine.wake();
    }
}

impl<S> Drop for PaddedStream<S> {
    fn drop(&mut self) {
        self.outbox.state.lock().expect("outbox").closing = true;
        self.outbox.wake_writer.notify_one();
        self.outbox.dropped.notify_one();
    }
}

impl<S: AsyncRead> AsyncRead for PaddedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            let ready = this.inbound.ready();
            if !ready.is_empty() {
                let n = buf.remaining().min(ready.len());
                buf.put_slice(&ready[..n]);
                this.inbound.take(n);
                return Poll::Ready(Ok(()));
            }
            if !this.inbound.scanning {
                return Pin::new(&mut this.reader).poll_read(cx, buf);
            }
            let mut chunk = [0u8; 4096];
            let mut chunk_buf = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.reader).poll_read(cx, &mut chunk_buf))?;
            if chunk_buf.filled().is_empty() {
                // End of stream: hand over what is left, then the end.
                this.inbound.end();
                if this.inbound.ready().is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            this.inbound.push(chunk_buf.filled());
        }
    }
}

fn failure(kind: io::ErrorKind) -> io::Error {
    io::Error::new(kind, "the connection's socket write failed")
}

impl<S> AsyncWrite for PaddedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let mut out = this.outbox.state.lock().expect("outbox");
        if let Some(kind) = out.failed {
            return Poll::Ready(Err(failure(kind)));
        }
        if out.closing || out.closed {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if out.queued.len() >= OUT_BYTES_MAX {
            out.engine = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let was_empty = out.queued.is_empty();
        this.framer.push(buf, &mut out.queued);
        drop(out);
        if was_empty {
            this.outbox.wake_writer.notify_one();
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Queued bytes are the writer's to send; a flush has nothing to wait for.
        match self.outbox.state.lock().expect("outbox").failed {
            Some(kind) => Poll::Ready(Err(failure(kind))),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut out = self.outbox.state.lock().expect("outbox");
        if out.closed {
            return Poll::Ready(match out.failed {
                Some(kind) => Err(failure(kind)),
                None => Ok(()),
            });
        }
        out.closing = true;
        out.engine = Some(cx.waker().clone());
        drop(out);
        self.outbox.wake_writer.notify_one();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A close frame with no fields, which the framer pads to 21 bytes.
    const CLOSE_EMPTY: [u8; 12] = [0, 0, 0, 12, 2, 0, 0, 0, 0x00, 0x53, 0x18, 0x45];

    #[tokio::test]
    async fn writes_are_padded_sent_in_order_and_shut_down() {
        let (client, server) = tokio::io::duplex(64);
        let mut stream = PaddedStream::new(server);
        let (mut client_read, mut client_write) = tokio::io::split(client);
        let frames = 10_000;
        let writer = tokio::spawn(async move {
            stream.write_all(b"AMQP\x00\x01\x00\x00").await.unwrap();
            for _ in 0..frames {
                stream.write_all(&CLOSE_EMPTY).await.unwrap();
                stream.flush().await.unwrap();
            }
            stream.shutdown().await.unwrap();
            stream
        });
        let mut received = Vec::new();
        client_read.read_to_end(&mut received).await.unwrap();
        let mut stream = writer.await.unwrap();
        assert_eq!(received.len(), 8 + frames * 21);
        assert_eq!(&received[..8], b"AMQP\x00\x01\x00\x00");
        assert!(received[8..].chunks(21).all(|f| f[..4] == [0, 0, 0, 21]));
        // Reads pass through.
        client_write
            .write_all(b"AMQP\x00\x01\x00\x00")
            .await
            .unwrap();
        let mut header = [0u8; 8];
        stream.read_exact(&mut header).await.unwrap();
        assert_eq!(&header, b"AMQP\x00\x01\x00\x00");
        // After the shutdown, writes fail.
        assert!(stream.write_all(&CLOSE_EMPTY).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_reads_nothing_is_dropped_after_the_close_timeout() {
        let (client, server) = tokio::io::duplex(64);
        let mut stream = PaddedStream::new(server);
        // More than the pipe holds, and nobody reads.
        for _ in 0..100 {
            stream.write_all(&CLOSE_EMPTY).await.unwrap();
        }
        tokio::task::yield_now().await;
        drop(stream);
        tokio::time::sleep(CLOSE_TIMEOUT * 2).await;
        // The writer gave up and the socket closed: the client reads what fit, then the end.
        let mut client = client;
        let mut received = Vec::new();
        client.read_to_end(&mut received).await.unwrap();
        assert!(received.len() < 100 * 21);
    }

    #[tokio::test]
    async fn a_failed_socket_fails_later_writes() {
        let (client, server) = tokio::io::duplex(64);
        drop(client);
        let mut stream = PaddedStream::new(server);
        let mut failed = false;
        for _ in 0..100 {
            if stream.write_all(&CLOSE_EMPTY).await.is_err() || stream.flush().await.is_err() {
                failed = true;
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(failed);
    }
}
