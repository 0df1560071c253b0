//! Who gets a connection slot, and what a connection may do before it authenticates.
//!
//! - [`Admission`] counts the connections the door holds, in total and per source IP address,
//!   against [`ConnectionLimits`]; a connection over a cap gets no [`Slot`] and is refused.
//!   A slot is given back when it is dropped, however the connection ends.
//! - [`Budgeted`] wraps a connection's byte stream: until the connection authenticates, at most
//!   [`UNAUTHENTICATED_BYTES_MAX`] bytes are read from it; the next read fails, which ends the
//!   connection. Authenticated connections read without limit.
//!
//! # Guarantees
//! - The counts never exceed the caps, and every slot given out is returned exactly once.
//! - Nothing here holds memory per refused connection.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::limits::{ConnectionLimits, UNAUTHENTICATED_BYTES_MAX};

/// Connection counts against the caps. Cheap to clone; clones share the counts.
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limits: ConnectionLimits,
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    total: usize,
    per_address: HashMap<IpAddr, usize>,
}

/// Why a connection got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// The door holds its most connections.
    Total(usize),
    /// The peer's address holds its most connections.
    PerAddress(usize),
}

impl Full {
    /// The refusal's description, as the client reads it.
    pub(crate) fn description(self) -> String {
        match self {
            Full::Total(max) => {
                format!("the server holds its maximum of {max} connections; retry later")
            }
            Full::PerAddress(max) => format!(
                "this source address holds its maximum of {max} connections; close some first"
            ),
        }
    }
}

/// One connection's place in the counts, given back on drop.
#[derive(Debug)]
pub(crate) struct Slot {
    inner: Arc<Inner>,
    address: IpAddr,
}

impl Admission {
    pub(crate) fn new(limits: ConnectionLimits) -> Self {
        Admission {
            inner: Arc::new(Inner {
                limits,
                counts: Mutex::new(Counts::default()),
            }),
        }
    }

    /// A slot for a connection from `peer`, or which cap it is over.
    pub(crate) fn admit(&self, peer: SocketAddr) -> Result<Slot, Full> {
        let limits = &self.inner.limits;
        let mut counts = self.inner.counts.lock().expect("admission counts");
        if counts.total >= limits.connections_max {
            return Err(Full::Total(limits.connections_max));
        }
        let address = peer.ip().to_canonical();
        let held = counts.per_address.entry(address).or_insert(0);
        if *held >= limits.connections_per_address_max {
            return Err(Full::PerAddress(limits.connections_per_address_max));
        }
        *held += 1;
        counts.total += 1;
        Ok(Slot {
            inner: self.inner.clone(),
            address,
        })
    }

    /// How many connections hold a slot.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.inner.counts.lock().expect("admission counts").total
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.inner.counts.lock().expect("admission counts");
        counts.total -= 1;
        if let Some(held) = counts.per_address.get_mut(&self.address) {
            *held -= 1;
            if *held == 0 {
                counts.per_address.remove(&self.address);
            }
        }
    }
}

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
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn limits(total: usize, per_address: usize) -> ConnectionLimits {
        ConnectionLimits {
            connections_max: total,
            connections_per_address_max: per_address,
            handshake_timeout: Duration::from_secs(1),
            auth_timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn caps_hold_per_address_and_in_total_and_slots_come_back() {
        let admission = Admission::new(limits(3, 2));
        let a: SocketAddr = "10.0.0.1:1000".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:1000".parse().unwrap();
        let c: SocketAddr = "10.0.0.3:1000".parse().unwrap();
        let a1 = admission.admit(a).unwrap();
        let a2 = admission.admit(a).unwrap();
        assert_eq!(admission.admit(a).unwrap_err(), Full::PerAddress(2));
        let b1 = admission.admit(b).unwrap();
        assert_eq!(admission.admit(c).unwrap_err(), Full::Total(3));
        drop(a1);
        assert_eq!(admission.held(), 2);
        let c1 = admission.admit(c).unwrap();
        assert_eq!(admission.admit(a).unwrap_err(), Full::Total(3));
        drop((a2, b1, c1));
        assert_eq!(admission.held(), 0);
        assert!(
            admission
                .inner
                .counts
                .lock()
                .unwrap()
                .per_address
                .is_empty()
        );
        // IPv4 seen through an IPv6 socket counts as the same address.
        let mapped: SocketAddr = "[::ffff:10.0.0.1]:1".parse().unwrap();
        let _x = admission.admit(a).unwrap();
        let _y = admission.admit(mapped).unwrap();
        assert_eq!(admission.admit(a).unwrap_err(), Full::PerAddress(2));
    }

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
