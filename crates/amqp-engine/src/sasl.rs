//! The SASL security layer (specification part 5.3), both ends, before the AMQP connection.
//!
//! The server offers its mechanisms and judges the client's `sasl-init` through a callback;
//! no mechanism here needs a challenge, so a `sasl-response` is refused. The client picks
//! `ANONYMOUS` (Event Hubs clients authorize afterwards, with tokens on `$cbs`) or `PLAIN`.
//! Either end leaves the bytes read past the exchange in the buffer for [`crate::Connection`].

use fe2o3_amqp_types::primitives::{Array, Binary, Symbol};
use fe2o3_amqp_types::sasl::{SaslCode, SaslInit, SaslMechanisms, SaslOutcome};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tributary_amqp_codec::frame::{self, FrameType};

use crate::connection::AMQP_HEADER;
use crate::pad::write_performative;

/// The protocol header of the SASL layer.
pub const SASL_HEADER: [u8; 8] = *b"AMQP\x03\x01\x00\x00";

/// The largest SASL frame read (real ones are under 1 KiB).
const SASL_FRAME_MAX: u32 = 64 * 1024;

/// Why the security layer failed.
#[derive(Debug, thiserror::Error)]
pub enum SaslError {
    /// The socket failed or closed.
    #[error("the connection failed during the SASL exchange: {0}")]
    Io(#[from] std::io::Error),
    /// The peer broke the SASL protocol.
    #[error("SASL protocol error: {0}")]
    Protocol(String),
    /// The server refused the credentials.
    #[error("authentication failed (SASL outcome {0:?})")]
    Refused(SaslCode),
}

/// What the server learned from the client's `sasl-init`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientInit {
    /// The mechanism the client picked.
    pub mechanism: String,
    /// Its initial response.
    pub initial_response: Vec<u8>,
}

/// The server side. `buffer` holds bytes already read (at least the first eight, the
/// protocol header); on return it holds what follows the exchange. With the SASL header the
/// exchange runs and `authenticate` judges the client's init (`Some(init)` is returned once it
/// passed); with the plain AMQP header nothing is exchanged (`None`). Any other header is
/// answered with the AMQP header and refused.
pub async fn accept<S, F>(
    stream: &mut S,
    buffer: &mut Vec<u8>,
    mechanisms: &[&str],
    mut authenticate: F,
) -> Result<Option<ClientInit>, SaslError>
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: FnMut(&ClientInit) -> bool,
{
    read_at_least(stream, buffer, 8).await?;
    if buffer[..8] == AMQP_HEADER {
        return Ok(None);
    }
    if buffer[..8] != SASL_HEADER {
        stream.write_all(&AMQP_HEADER).await?;
        return Err(SaslError::Protocol(
            "expected an AMQP 1.0 or SASL protocol header".into(),
        ));
    }
    buffer.drain(..8);
    let mut out = SASL_HEADER.to_vec();
    let offer = SaslMechanisms {
        sasl_server_mechanisms: Array::from(
            mechanisms
                .iter()
                .map(|m| Symbol::from(*m))
                .collect::<Vec<_>>(),
        ),
    };
    write_sasl_frame(&offer, &mut out);
    stream.write_all(&out).await?;
    let body = read_sasl_frame(stream, buffer).await?;
    let init: SaslInit = crate::error::from_untrusted_slice(&body)
        .map_err(|e| SaslError::Protocol(format!("expected sasl-init: {e}")))?;
    let init = ClientInit {
        mechanism: init.mechanism.as_str().to_owned(),
        initial_response: init
            .initial_response
            .map(Binary::into_vec)
            .unwrap_or_default(),
    };
    let known = mechanisms.contains(&init.mechanism.as_str());
    let code = if known && authenticate(&init) {
        SaslCode::Ok
    } else {
        SaslCode::Auth
    };
    let mut out = Vec::new();
    write_sasl_frame(
        &SaslOutcome {
            code: code.clone(),
            additional_data: None,
        },
        &mut out,
    );
    stream.write_all(&out).await?;
    match code {
        SaslCode::Ok => Ok(Some(init)),
        other => Err(SaslError::Refused(other)),
    }
}

/// The client side: `mechanism` (`ANONYMOUS`, or `PLAIN` with `initial_response`
/// `\0name\0password`) for `hostname`. On return `buffer` holds what the server sent after its
/// outcome.
pub async fn connect<S>(
    stream: &mut S,
    buffer: &mut Vec<u8>,
    mechanism: &str,
    initial_response: Option<&[u8]>,
    hostname: Option<&str>,
) -> Result<(), SaslError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    // The init waits for the server's mechanisms (specification 5.3.2): one round trip, and
    // no server has to take an init it did not offer yet.
    stream.write_all(&SASL_HEADER).await?;
    read_at_least(stream, buffer, 8).await?;
    if buffer[..8] != SASL_HEADER {
        return Err(SaslError::Protocol(
            "the server did not answer with the SASL header".into(),
        ));
    }
    buffer.drain(..8);
    let body = read_sasl_frame(stream, buffer).await?;
    let offered: SaslMechanisms = crate::error::from_untrusted_slice(&body)
        .map_err(|e| SaslError::Protocol(format!("expected sasl-mechanisms: {e}")))?;
    if !offered
        .sasl_server_mechanisms
        .0
        .iter()
        .any(|m| m.as_str() == mechanism)
    {
        return Err(SaslError::Protocol(format!(
            "the server does not offer {mechanism}"
        )));
    }
    let init = SaslInit {
        mechanism: Symbol::from(mechanism),
        initial_response: initial_response.map(|r| Binary::from(r.to_vec())),
        hostname: hostname.map(str::to_owned),
    };
    let mut out = Vec::new();
    write_sasl_frame(&init, &mut out);
    stream.write_all(&out).await?;
    let body = read_sasl_frame(stream, buffer).await?;
    let outcome: SaslOutcome = crate::error::from_untrusted_slice(&body)
        .map_err(|e| SaslError::Protocol(format!("expected sasl-outcome: {e}")))?;
    match outcome.code {
        SaslCode::Ok => Ok(()),
        other => Err(SaslError::Refused(other)),
    }
}

fn write_sasl_frame<T: serde::Serialize>(value: &T, out: &mut Vec<u8>) {
    let start = frame::start_frame(out, FrameType::Sasl, 0);
    write_performative(value, out);
    frame::finish_frame(out, start);
}

/// Reads until `buffer` holds at least `n` bytes.
pub(crate) async fn read_at_least<S: AsyncRead + Unpin>(
    stream: &mut S,
    buffer: &mut Vec<u8>,
    n: usize,
) -> std::io::Result<()> {
    while buffer.len() < n {
        if stream.read_buf(buffer).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(())
}

/// Reads one SASL frame off the front of `buffer` (reading more as needed); returns its body.
async fn read_sasl_frame<S: AsyncRead + Unpin>(
    stream: &mut S,
    buffer: &mut Vec<u8>,
) -> Result<Vec<u8>, SaslError> {
    loop {
        match frame::split_frame(buffer, SASL_FRAME_MAX) {
            Ok(Some((frame, size))) => {
                if frame.frame_type != FrameType::Sasl {
                    return Err(SaslError::Protocol("expected a SASL frame".into()));
                }
                let body = frame.body.to_vec();
                buffer.drain(..size);
                return Ok(body);
            }
            Ok(None) => {
                if stream.read_buf(buffer).await? == 0 {
                    return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
                }
            }
            Err(e) => return Err(SaslError::Protocol(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn plain_is_judged_and_the_rest_is_kept() {
        for (password, ok) in [(&b"\0user\0right"[..], true), (b"\0user\0wrong", false)] {
            let (mut a, mut b) = tokio::io::duplex(4096);
            let server = tokio::spawn(async move {
                let mut buffer = Vec::new();
                let result = accept(&mut b, &mut buffer, &["ANONYMOUS", "PLAIN"], |init| {
                    init.mechanism == "PLAIN" && init.initial_response == b"\0user\0right"
                })
                .await;
                if result.is_ok() {
                    read_at_least(&mut b, &mut buffer, 8).await.unwrap();
                }
                (result.map_err(|e| e.to_string()), buffer)
            });
            let mut buffer = Vec::new();
            let client = connect(&mut a, &mut buffer, "PLAIN", Some(password), Some("h")).await;
            assert_eq!(client.is_ok(), ok, "{client:?}");
            if ok {
                a.write_all(&AMQP_HEADER).await.unwrap();
            }
            let (result, rest) = server.await.unwrap();
            assert_eq!(result.is_ok(), ok);
            if ok {
                assert_eq!(result.unwrap().unwrap().mechanism, "PLAIN");
                assert_eq!(
                    rest, AMQP_HEADER,
                    "the AMQP header stays for the connection"
                );
            }
        }
    }

    #[tokio::test]
    async fn the_plain_amqp_header_skips_sasl_and_others_are_refused() {
        let (mut a, mut b) = tokio::io::duplex(4096);
        a.write_all(&AMQP_HEADER).await.unwrap();
        let mut buffer = Vec::new();
        let result = accept(&mut b, &mut buffer, &["ANONYMOUS"], |_| true).await;
        assert!(matches!(result, Ok(None)));
        assert_eq!(buffer, AMQP_HEADER);

        a.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let mut buffer = Vec::new();
        let result = accept(&mut b, &mut buffer, &["ANONYMOUS"], |_| true).await;
        assert!(matches!(result, Err(SaslError::Protocol(_))));
        let mut answer = [0u8; 8];
        a.read_exact(&mut answer).await.unwrap();
        assert_eq!(answer, AMQP_HEADER);
    }

    #[tokio::test]
    async fn an_unknown_mechanism_is_refused() {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let server = tokio::spawn(async move {
            let mut buffer = Vec::new();
            accept(&mut b, &mut buffer, &["ANONYMOUS"], |_| true)
                .await
                .is_ok()
        });
        let mut buffer = Vec::new();
        let result = connect(&mut a, &mut buffer, "EXTERNAL", None, None).await;
        assert!(result.is_err());
        // The client never sent an init; the server sees the connection end.
        drop(a);
        assert!(!server.await.unwrap());
    }
}
