//! The AMQP 1.0 engine boundary: the only module that uses `fe2o3-amqp`.
//!
//! It accepts a TCP connection (SASL or plain AMQP header), runs its sessions and attaches each
//! link to what it names: `$cbs` and `$management` request/response nodes ([`nodes`]), send links
//! into the broker ([`send_link`]) and receive links out of it ([`receive_link`]). Everything
//! the Event Hubs dialect decides — addresses, selectors, tokens, conditions — lives outside, in
//! engine-free modules; this module translates between them and the engine's types. A fix or
//! fork of the engine stays here.
//!
//! # Engine limitations worked around here
//! - The engine's SASL acceptor reads only the SASL protocol header, and its plain acceptor only
//!   the AMQP one, while clients send either (rhea with token credentials skips SASL). The first
//!   eight bytes are peeked (`TcpStream::peek`) to pick the acceptor.
//! - A link acceptor's credit mode is fixed at the engine default (`Auto(200)`), so a client's
//!   send link gets 200 credits, refilled as deliveries are settled.
//! - A refused attach is answered by completing it and detaching it with the error after
//!   [`crate::limits::REFUSAL_DETACH_DELAY`] (the engine has no attach-with-null-terminus path, and
//!   the Python SDK reports a link's error only once it uses the link). No message on such a link
//!   is ever read.
//! - The engine omits trailing null fields of performatives, which the Python SDK cannot read;
//!   [`pad`] re-encodes every outgoing performative with all its fields, and adjusts the peer's
//!   `open` so the padded frames still fit its `max-frame-size`.
//! - The engine flushes the socket after every frame; [`stream`] hands frames to a writer task
//!   instead, which sends what has queued up in one write.
//! - A sender's credit is not observable, so a receive link waiting for credit also waits on its
//!   broker receiver's disconnect, and gives up the send the moment a higher epoch takes over.

mod message;
mod nodes;
mod pad;
mod receive_link;
mod sasl;
mod send_link;
mod stream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp::acceptor::{
    ConnectionAcceptor, LinkAcceptor, LinkEndpoint, ListenerConnectionHandle,
    ListenerSessionHandle, SessionAcceptor, SupportedReceiverSettleModes,
};
use fe2o3_amqp_types::definitions::{self, Role};
use fe2o3_amqp_types::messaging::TargetArchetype;
use fe2o3_amqp_types::performatives::Attach;
use fe2o3_amqp_types::primitives::Symbol;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tributary_broker::Broker;

use crate::address::{self, Node};
use crate::auth::ConnectionGrants;
use crate::conditions::{self, Refusal};
use crate::limits::{
    CHANNEL_MAX, CLOSE_TIMEOUT, FRAME_BYTES_MAX, HANDLE_MAX, HANDSHAKE_TIMEOUT,
    REFUSAL_DETACH_DELAY,
};
use crate::policies::AccessPolicies;

/// What every connection shares.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) broker: Broker,
    pub(crate) policies: AccessPolicies,
    pub(crate) idle_timeout: Duration,
    pub(crate) shutdown: watch::Receiver<bool>,
}

/// One connection's state.
#[derive(Debug)]
pub(crate) struct Connection {
    pub(crate) ctx: Arc<Context>,
    pub(crate) grants: ConnectionGrants,
    pub(crate) peer: SocketAddr,
}

/// Unix seconds now.
pub(crate) fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

pub(crate) fn amqp_error(refusal: &Refusal) -> definitions::Error {
    definitions::Error::new(
        definitions::ErrorCondition::Custom(Symbol::from(refusal.condition)),
        Some(refusal.description.clone()),
        None,
    )
}

/// Waits until the shutdown flag is raised (or its sender is gone).
pub(crate) async fn shutting_down(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|down| *down).await;
}

/// Serves one TCP connection until it closes or the server shuts down.
pub(crate) async fn serve_connection(stream: TcpStream, peer: SocketAddr, ctx: Arc<Context>) {
    let _ = stream.set_nodelay(true);
    let accepted = tokio::time::timeout(HANDSHAKE_TIMEOUT, accept(stream, &ctx)).await;
    let (handle, grants) = match accepted {
        Ok(Ok(accepted)) => accepted,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "AMQP handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "AMQP handshake timed out");
            return;
        }
    };
    tracing::debug!(%peer, "AMQP connection open");
    let connection = Arc::new(Connection { ctx, grants, peer });
    run_connection(handle, connection).await;
    tracing::debug!(%peer, "AMQP connection closed");
}

/// Reads the protocol header without consuming it, so the right acceptor can answer it.
async fn peek_header(stream: &TcpStream) -> std::io::Result<[u8; 8]> {
    let mut header = [0u8; 8];
    loop {
        let n = stream.peek(&mut header).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if n == header.len() {
            return Ok(header);
        }
        // Fewer than eight bytes are in; wait for more instead of spinning.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn accept(
    stream: TcpStream,
    ctx: &Context,
) -> Result<(ListenerConnectionHandle, ConnectionGrants), String> {
    let header = peek_header(&stream).await.map_err(|e| e.to_string())?;
    // Every outgoing performative is padded to its full field list (see `pad`).
    let stream = stream::PaddedStream::new(stream);
    let idle_ms = u32::try_from(ctx.idle_timeout.as_millis()).unwrap_or(u32::MAX);
    let builder = ConnectionAcceptor::builder()
        .container_id("tributary")
        .max_frame_size(FRAME_BYTES_MAX)
        .channel_max(CHANNEL_MAX)
        .idle_time_out(idle_ms);
    let grants = ConnectionGrants::default();
    if header[4] == 3 {
        let mechanisms = sasl::Mechanisms {
            policies: ctx.policies.clone(),
            plain: sasl::PlainGrant::default(),
        };
        let acceptor = builder.sasl_acceptor(mechanisms.clone()).build();
        let handle = acceptor.accept(stream).await.map_err(|e| e.to_string())?;
        let plain = mechanisms.plain.lock().expect("sasl outcome").take();
        if let Some((policy, rights)) = plain {
            grants.grant_namespace(policy, rights);
        }
        Ok((handle, grants))
    } else {
        // The plain AMQP header; any other header is answered by the acceptor with its own and
        // the connection fails.
        let handle = builder
            .build()
            .accept(stream)
            .await
            .map_err(|e| e.to_string())?;
        Ok((handle, grants))
    }
}

async fn run_connection(mut handle: ListenerConnectionHandle, connection: Arc<Connection>) {
    let mut shutdown = connection.ctx.shutdown.clone();
    let mut sessions = JoinSet::new();
    let session_acceptor = SessionAcceptor::builder().handle_max(HANDLE_MAX).build();
    let mut closing_error = None;
    loop {
        tokio::select! {
            incoming = handle.next_incoming_session() => {
                let Some(incoming) = incoming else { break };
                match session_acceptor.accept_incoming_session(incoming, &mut handle).await {
                    Ok(session) => {
                        sessions.spawn(run_session(session, connection.clone()));
                    }
                    Err(e) => {
                        tracing::debug!(peer = %connection.peer, error = %e, "session refused");
                        break;
                    }
                }
            }
            Some(_) = sessions.join_next() => {}
            () = shutting_down(&mut shutdown) => {
                closing_error = Some(Refusal::new(
                    "amqp:connection:forced",
                    "the broker is shutting down",
                ));
                break;
            }
        }
    }
    let close = async {
        match closing_error {
            Some(refusal) => handle.close_with_error(amqp_error(&refusal)).await,
            None => handle.close().await,
        }
    };
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, close).await;
    sessions.shutdown().await;
}

async fn run_session(mut session: ListenerSessionHandle, connection: Arc<Connection>) {
    let routes = Arc::new(nodes::ReplyRoutes::default());
    let mut links = JoinSet::new();
    let mut shutdown = connection.ctx.shutdown.clone();
    loop {
        tokio::select! {
            attach = session.next_incoming_attach() => {
                let Some(attach) = attach else { break };
                on_attach(attach, &mut session, &connection, &routes, &mut links).await;
            }
            Some(_) = links.join_next() => {}
            () = shutting_down(&mut shutdown) => break,
        }
    }
    // Let the links detach (they watch the shutdown flag too) before ending the session.
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
        while links.join_next().await.is_some() {}
    })
    .await;
    links.shutdown().await;
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, session.end()).await;
}

/// The address of the node a link attaches to: the target when the client sends, the source
/// when it receives.
fn link_address(attach: &Attach) -> Option<String> {
    match attach.role {
        Role::Sender => match attach.target.as_deref() {
            Some(TargetArchetype::Target(t)) => t.address.clone(),
            _ => None,
        },
        Role::Receiver => attach.source.as_ref().and_then(|s| s.address.clone()),
    }
}

/// The node an attach names, or why it names none.
fn attached_node(attach: &Attach) -> Result<Node, Refusal> {
    let address = link_address(attach)
        .ok_or_else(|| Refusal::new(conditions::NOT_FOUND, "the link names no address"))?;
    address::parse(&address).map_err(|e| Refusal::new(conditions::NOT_FOUND, e))
}

async fn on_attach(
    attach: Attach,
    session: &mut ListenerSessionHandle,
    connection: &Arc<Connection>,
    routes: &Arc<nodes::ReplyRoutes>,
    links: &mut JoinSet<()>,
) {
    let node = match attached_node(&attach) {
        Ok(node) => node,
        Err(refusal) => return refuse(attach, session, refusal, links).await,
    };
    let client_sends = matches!(attach.role, Role::Sender);
    let outcome = match node {
        Node::Cbs => {
            let kind = nodes::NodeKind::Cbs;
            nodes::attach(kind, attach, session, connection, routes, links).await
        }
        Node::Management => {
            let kind = nodes::NodeKind::Management;
            nodes::attach(kind, attach, session, connection, routes, links).await
        }
        Node::Hub { .. } | Node::HubPartition { .. } if client_sends => {
            send_link::attach(node, attach, session, connection, links).await
        }
        Node::ConsumerPartition {
            hub,
            group,
            partition,
        } if !client_sends => {
            let names = receive_link::Names {
                hub,
                group,
                partition,
            };
            receive_link::attach(names, attach, session, connection, links).await
        }
        _ if client_sends => Err((
            attach,
            Refusal::new(
                conditions::NOT_ALLOWED,
                "send to <hub> or <hub>/Partitions/<id>",
            ),
        )),
        _ => Err((
            attach,
            Refusal::new(
                conditions::NOT_ALLOWED,
                "receive from <hub>/ConsumerGroups/<group>/Partitions/<id>",
            ),
        )),
    };
    if let Err((attach, refusal)) = outcome {
        refuse(attach, session, refusal, links).await;
    }
}

/// Refuses an attach: completes it, then, after [`REFUSAL_DETACH_DELAY`], detaches it with the
/// error, in the background. Nothing sent on the link meanwhile is read.
pub(crate) async fn refuse(
    attach: Attach,
    session: &mut ListenerSessionHandle,
    refusal: Refusal,
    links: &mut JoinSet<()>,
) {
    tracing::debug!(link = %attach.name, condition = refusal.condition, description = %refusal.description, "refusing link");
    let error = amqp_error(&refusal);
    // Settle in mode `first` so a rejected delivery is final (see `send_link`).
    let acceptor = LinkAcceptor::builder()
        .supported_receiver_settle_modes(SupportedReceiverSettleModes::First)
        .fallback_receiver_settle_mode(definitions::ReceiverSettleMode::First)
        .build();
    match acceptor.accept_incoming_attach(attach, session).await {
        Ok(LinkEndpoint::Sender(sender)) => {
            links.spawn(async move {
                tokio::time::sleep(REFUSAL_DETACH_DELAY).await;
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, sender.close_with_error(error)).await;
            });
        }
        Ok(LinkEndpoint::Receiver(receiver)) => {
            links.spawn(refuse_sends(receiver, error));
        }
        Err(e) => tracing::debug!(error = %e, "the refused link could not even attach"),
    }
}

/// A refused send link: the first delivery (if any comes before the delay is over) is rejected
/// with the error — which is how the Python SDK learns the condition — then the link is
/// detached with it. Nothing is ever appended.
async fn refuse_sends(mut receiver: fe2o3_amqp::Receiver, error: definitions::Error) {
    use fe2o3_amqp::link::RecvError;
    use fe2o3_amqp_types::messaging::Body;
    use fe2o3_amqp_types::primitives::Value;
    let _ = tokio::time::timeout(REFUSAL_DETACH_DELAY, async {
        match receiver.recv::<Body<Value>>().await {
            Ok(delivery) => {
                let _ = receiver.reject(&delivery, error.clone()).await;
            }
            Err(RecvError::MessageDecode(e)) => {
                let _ = receiver.reject(e.info, error.clone()).await;
            }
            Err(_) => {}
        }
    })
    .await;
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, receiver.close_with_error(error)).await;
}
