//! What an unauthenticated connection may send: [`Budgeted`] wraps a connection's byte
//! stream so that, until the connection authenticates, at most [`UNAUTHENTICATED_BYTES_MAX`]
//! bytes are read from it; the next read fails, which ends the connection. Authenticated
//! connections read without limit. (Connection caps are `tributary_tls::admission`'s, shared
//! with the HTTP door.)
//!
//! # Guarantees
//! - An unauthenticated peer never makes the server buffer more than its budget.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::limits::UNAUTHENTICATED_BYTES_MAX;

/// A byte stream that reads at most [`UNAUTHENTICATED_BYTES_MAX`] bytes until `authenticated`
/// is raised (see the module docs). Writes pass through.
#[derive(Debug)]
pub(crate) struct Budgeted<S> {
    inner: S,
    authenticated: Arc<AtomicBool>,
    read: u64,
}

impl<S> Budgeted<S> {
    pub(crate) fn new(inner: S, authenticated: Arc<AtomicBool>) -> Self {
        Budgeted {
            inner,
            authenticated,
            read: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Budgeted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.authenticated.load(Ordering::Relaxed) {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        let left = UNAUTHENTICATED_BYTES_MAX.saturating_sub(self.read);
        if left == 0 {
            return Poll::Ready(Err(std::io::Error::other(format!(
                "the peer sent {UNAUTHENTICATED_BYTES_MAX} bytes without authenticating"
            ))));
        }
        let left = usize::try_from(left).unwrap_or(usize::MAX);
        if buf.remaining() <= left {
            let before = buf.filled().len();
            let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
            self.read += (buf.filled().len() - before) as u64;
            return poll;
        }
        // The last bytes of the budget: read into a buffer of exactly what is left (rare, so
        // the allocation does not matter), so the budget is never overrun.
        let mut last = vec![0; left];
        let mut limited = ReadBuf::new(&mut last);
        let poll = Pin::new(&mut self.inner).poll_read(cx, &mut limited);
        if let Poll::Ready(Ok(())) = &poll {
            let filled = limited.filled();
            buf.put_slice(filled);
            self.read += filled.len() as u64;
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Budgeted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn an_unauthenticated_stream_reads_its_budget_and_no_more() {
        let budget = usize::try_from(UNAUTHENTICATED_BYTES_MAX).unwrap();
        let (mut client, server) = tokio::io::duplex(4 * budget);
        let flag = Arc::new(AtomicBool::new(false));
        let mut stream = Budgeted::new(server, flag.clone());
        client.write_all(&vec![7; budget + 10]).await.unwrap();
        let mut got = vec![0; budget];
        stream.read_exact(&mut got).await.unwrap();
        let error = stream.read_u8().await.unwrap_err();
        assert!(
            error.to_string().contains("without authenticating"),
            "{error}"
        );
        flag.store(true, Ordering::Relaxed);
        let mut rest = [0; 10];
        stream.read_exact(&mut rest).await.unwrap();
        assert_eq!(rest, [7; 10]);
    }
}
