//! Entry points for the fuzz targets of `tributary-fuzz` into the HTTP door's private decoders;
//! not part of the API (hidden from the docs). Each runs what a request handler runs on the
//! same bytes and reports the outcome as plain values; errors are the messages a client gets.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::auth::SignatureParams;
use crate::cursor::{CursorKey, parse};
use crate::limits::{CURSOR_KEY_BYTES, CURSOR_TAG_BYTES};
use crate::oci::cursors::{group_position, partition_position};
use crate::oci::messages::decode_messages;
use crate::oci::model::{
    CreateCursorDetails, CreateGroupCursorDetails, PutMessagesDetails, UpdateGroupDetails,
};
use crate::oci::parse_json;

/// The cursor key the fuzz targets sign and check cursors with.
const FUZZ_KEY: [u8; CURSOR_KEY_BYTES] = [0x5a; CURSOR_KEY_BYTES];

/// `payload` made into a cursor under the fuzzing key (a fuzzer cannot forge the tag itself).
pub fn sign_cursor(payload: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(&FUZZ_KEY).expect("HMAC takes any key length");
    mac.update(payload);
    let mut bytes = payload.to_vec();
    bytes.extend_from_slice(&mac.finalize().into_bytes()[..CURSOR_TAG_BYTES]);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Decodes `text` as GetMessages does at `now_ms`; when it is accepted, returns the cursor the
/// server would issue for the same position and expiry.
pub fn decode_cursor(text: &str, now_ms: i64) -> Result<String, String> {
    let key = CursorKey::from_bytes(FUZZ_KEY);
    let cursor = key.decode(text, now_ms).map_err(|e| e.to_string())?;
    let bytes = URL_SAFE_NO_PAD
        .decode(text)
        .expect("an accepted cursor is base64url");
    let (expires_at_ms, parsed) =
        parse(&bytes[..bytes.len() - CURSOR_TAG_BYTES]).expect("an accepted cursor parses");
    assert_eq!(parsed, cursor, "decode and parse agree");
    Ok(key.encode(&cursor, expires_at_ms))
}

/// Parses an `Authorization` header value; the key id, signed headers and signature.
pub fn parse_signature(value: &str) -> Result<(String, Vec<String>, String), String> {
    let params = SignatureParams::parse(value).map_err(|e| e.message)?;
    Ok((params.key_id, params.headers, params.signature))
}

/// A decoded PutMessages entry: its key (if any) and value.
pub type KeyAndValue = (Option<Vec<u8>>, Vec<u8>);

/// Decodes a PutMessages body as the handler does: JSON, then each key and value from base64.
pub fn put_messages(body: &[u8]) -> Result<Vec<KeyAndValue>, String> {
    let details: PutMessagesDetails<'_> = parse_json(body).map_err(|e| e.message)?;
    let decoded = decode_messages(&details).map_err(|e| e.message)?;
    Ok(decoded.into_iter().map(|d| (d.key, d.value)).collect())
}

/// Decodes a CreateCursor body and its position, as the handler does before asking the broker.
pub fn create_cursor(body: &[u8]) -> Result<String, String> {
    let details: CreateCursorDetails = parse_json(body).map_err(|e| e.message)?;
    let position = partition_position(&details).map_err(|e| e.message)?;
    Ok(format!("{}: {position:?}", details.partition))
}

/// Decodes a CreateGroupCursor body and its start position.
pub fn create_group_cursor(body: &[u8]) -> Result<String, String> {
    let details: CreateGroupCursorDetails = parse_json(body).map_err(|e| e.message)?;
    let start = group_position(&details.kind, details.time.as_deref()).map_err(|e| e.message)?;
    Ok(format!("{}: {start:?}", details.group_name))
}

/// Decodes an UpdateGroup body and its start position.
pub fn update_group(body: &[u8]) -> Result<String, String> {
    let details: UpdateGroupDetails = parse_json(body).map_err(|e| e.message)?;
    let start = group_position(&details.kind, details.time.as_deref()).map_err(|e| e.message)?;
    Ok(format!("{start:?}"))
}
