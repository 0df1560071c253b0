//! A request frame into its API, version, correlation id and body: the door's one decoder of
//! what a client sends (the fuzz target `kafka_request` runs it as the door does).
//!
//! # Guarantees
//! - The header is read at the version `ApiKey::request_header_version` gives for the request's
//!   API and version (v2, with tagged fields, for flexible versions), never assumed.
//! - Before authentication only ApiVersions, SaslHandshake and SaslAuthenticate are decoded;
//!   any other API is an error before its body is read.
//! - An API or version the door does not advertise is an error, except ApiVersions above our
//!   range, which is [`Body::ApiVersionsTooNew`] (answered with UNSUPPORTED_VERSION and our
//!   ranges, KIP-511).
//! - Every error is a sentence for the debug log, with nothing of the body in it.

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind};
use kafka_protocol::protocol::Decodable;

use crate::versions;

/// A decoded request.
#[derive(Debug)]
pub struct Request {
    /// Its API.
    pub key: ApiKey,
    /// The API version the client chose.
    pub version: i16,
    /// What the response must carry.
    pub correlation_id: i32,
    /// Its body.
    pub body: Body,
}

/// A request's body.
#[derive(Debug)]
pub enum Body {
    /// Decoded at the request's version (boxed: a request's body is some hundred bytes).
    Decoded(Box<RequestKind>),
    /// ApiVersions at a version above the advertised range: not decoded.
    ApiVersionsTooNew,
}

/// Whether `key` is answered before authentication.
pub fn answered_before_sasl(key: ApiKey) -> bool {
    matches!(
        key,
        ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
    )
}

/// Decodes one request frame (without its length prefix); `authenticated` says whether the
/// connection has logged in (see the module docs).
pub fn decode(mut frame: Bytes, authenticated: bool) -> Result<Request, String> {
    if frame.len() < 4 {
        return Err("a request shorter than its header".into());
    }
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let key = ApiKey::try_from(raw_key).map_err(|()| format!("unknown API key {raw_key}"))?;
    if !authenticated && !answered_before_sasl(key) {
        return Err(format!("{key:?} before authenticating (SASL PLAIN)"));
    }
    let header = RequestHeader::decode(&mut frame, key.request_header_version(version))
        .map_err(|e| format!("{key:?} v{version}: bad request header: {e}"))?;
    let correlation_id = header.correlation_id;
    let body = if key == ApiKey::ApiVersions && !versions::supports(key, version) {
        Body::ApiVersionsTooNew
    } else if !versions::supports(key, version) {
        return Err(format!("{key:?} v{version} is not supported"));
    } else {
        let body = RequestKind::decode(key, &mut frame, version)
            .map_err(|e| format!("{key:?} v{version}: the body does not decode: {e}"))?;
        Body::Decoded(Box::new(body))
    };
    Ok(Request {
        key,
        version,
        correlation_id,
        body,
    })
}
