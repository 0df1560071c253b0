//! HTTPS: a listener that hands axum connections whose TLS handshake has completed.
//!
//! Handshakes run on their own tasks, many at once, each within the TLS crate's deadline
//! ([`tributary_tls::HANDSHAKE_TIMEOUT`]), so a peer that stalls its handshake never holds up
//! the next connection. At most [`HANDSHAKES_IN_FLIGHT_MAX`] handshakes run at a time; the
//! listener stops accepting once the server it feeds has stopped.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tributary_tls::{TlsAcceptor, TlsStream};

use crate::limits::HANDSHAKES_IN_FLIGHT_MAX;

/// Connections that completed their handshake, for `axum::serve`.
#[derive(Debug)]
pub(crate) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
}

impl TlsListener {
    /// Accepts on `listener`, handshaking with `acceptor`.
    pub(crate) fn new(listener: TcpListener, acceptor: TlsAcceptor) -> std::io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let (ready_tx, ready) = mpsc::channel(HANDSHAKES_IN_FLIGHT_MAX);
        tokio::spawn(accept_and_handshake(listener, acceptor, ready_tx));
        Ok(TlsListener { ready, local_addr })
    }
}

async fn accept_and_handshake(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            () = ready.closed() => return,
            Some(_) = handshakes.join_next() => {}
            accepted = listener.accept(), if handshakes.len() < HANDSHAKES_IN_FLIGHT_MAX => {
                match accepted {
                    Ok((socket, peer)) => {
                        let (acceptor, ready) = (acceptor.clone(), ready.clone());
                        handshakes.spawn(async move {
                            match tributary_tls::accept(&acceptor, socket).await {
                                Ok(stream) => {
                                    let _ = ready.send((stream, peer)).await;
                                }
                                Err(e) => tracing::debug!(%peer, error = %e, "HTTPS handshake failed"),
                            }
                        });
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accepting an HTTPS connection failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                }
            }
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accepting task ends only when this receiver is gone, so this is not reached;
            // if it were, no more connections would come: wait for the server to stop.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}
