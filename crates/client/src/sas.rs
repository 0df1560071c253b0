//! Shared access signature (SAS) tokens, signed exactly as the Azure SDKs sign them.
//!
//! ```text
//! string_to_sign = quote_plus(audience) + "\n" + expiry        (expiry: Unix seconds)
//! sig            = base64(HMAC-SHA256(key = UTF-8 bytes of the key as written, string_to_sign))
//! token          = "SharedAccessSignature sr=" + quote_plus(audience) + "&sig=" + quote_plus(sig)
//!                  + "&se=" + expiry + "&skn=" + quote_plus(key_name)
//! ```
//!
//! `quote_plus` is Python's: letters, digits and `_.-~` stay, a space becomes `+`, every other
//! byte of the UTF-8 text becomes `%XX` (upper-case hex). The key is used as written, not
//! base64-decoded, as every SDK does. A hub verifies by recomputing the HMAC; see
//! `amqp_dialect.md` §2.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::connection_string::Credential;
use crate::limits::SAS_TOKEN_LIFETIME;

/// The token type put on `$cbs` for SAS tokens.
pub const SAS_TOKEN_TYPE: &str = "servicebus.windows.net:sastoken";

/// A token ready to be put on `$cbs`, with when it stops being valid.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// The token text (`SharedAccessSignature sr=…`).
    pub value: String,
    /// When it expires, in Unix seconds.
    pub expires_at_s: u64,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("value", &"<redacted>")
            .field("expires_at_s", &self.expires_at_s)
            .finish()
    }
}

/// URL-encodes `text` as Python's `urllib.parse.quote_plus` does.
pub fn quote_plus(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' | b'~' => {
                out.push(char::from(byte));
            }
            b' ' => out.push('+'),
            _ => {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                out.push('%');
                out.push(char::from(HEX[usize::from(byte >> 4)]));
                out.push(char::from(HEX[usize::from(byte & 0x0f)]));
            }
        }
    }
    out
}

/// Signs a SAS token for `audience` (e.g. `sb://myns.servicebus.windows.net/orders`) that expires
/// at `expires_at_s` (Unix seconds).
pub fn sign_token(audience: &str, key_name: &str, key: &str, expires_at_s: u64) -> String {
    let encoded_audience = quote_plus(audience);
    let string_to_sign = format!("{encoded_audience}\n{expires_at_s}");
    // HMAC accepts a key of any length, so this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC-SHA256 takes keys of any length"));
    mac.update(string_to_sign.as_bytes());
    let signature = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    format!(
        "SharedAccessSignature sr={encoded_audience}&sig={}&se={expires_at_s}&skn={}",
        quote_plus(&signature),
        quote_plus(key_name)
    )
}

/// The `se` (expiry, Unix seconds) field of a ready-made token, if it has a readable one.
pub fn token_expiry(token: &str) -> Option<u64> {
    let fields = token
        .strip_prefix("SharedAccessSignature ")
        .unwrap_or(token);
    fields
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(key, _)| key.trim() == "se")
        .and_then(|(_, value)| value.trim().parse().ok())
}

/// Seconds since the Unix epoch, now.
pub(crate) fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs()
}

/// A token for `audience` from `credential`, valid from `now_s` for `lifetime`: signed fresh for
/// a key, or the connection string's own signature (with its `se`, or [`SAS_TOKEN_LIFETIME`]
/// from now when it has none).
pub fn token_for(credential: &Credential, audience: &str, now_s: u64, lifetime: Duration) -> Token {
    match credential {
        Credential::SharedAccessKey { key_name, key } => {
            let expires_at_s = now_s.saturating_add(lifetime.as_secs().max(1));
            Token {
                value: sign_token(audience, key_name, key, expires_at_s),
                expires_at_s,
            }
        }
        Credential::SharedAccessSignature(value) => Token {
            value: value.clone(),
            expires_at_s: token_expiry(value)
                .unwrap_or_else(|| now_s.saturating_add(SAS_TOKEN_LIFETIME.as_secs())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_plus_matches_python() {
        // Values from Python 3: urllib.parse.quote_plus(...)
        assert_eq!(
            quote_plus("sb://myns.servicebus.windows.net/orders"),
            "sb%3A%2F%2Fmyns.servicebus.windows.net%2Forders"
        );
        assert_eq!(quote_plus("a b+c/d=e~f_g.h-i"), "a+b%2Bc%2Fd%3De~f_g.h-i");
        assert_eq!(quote_plus("ü"), "%C3%BC");
        assert_eq!(quote_plus(""), "");
    }

    #[test]
    fn signs_like_the_azure_sdks() {
        // Python: azure.eventhub._pyamqp.utils.generate_sas_token(
        //   "sb://myns.servicebus.windows.net/orders", "RootManageSharedAccessKey",
        //   "c2VjcmV0", expiry=1700000000)
        let token = sign_token(
            "sb://myns.servicebus.windows.net/orders",
            "RootManageSharedAccessKey",
            "c2VjcmV0",
            1_700_000_000,
        );
        // Computed with Python's hmac/hashlib/base64 and urllib.parse.urlencode, as pyamqp does.
        assert_eq!(
            token,
            "SharedAccessSignature sr=sb%3A%2F%2Fmyns.servicebus.windows.net%2Forders&sig=D7yggqm71NqKXGYypfDiTj8YRvUSdYsKHtSxlCjaldo%3D&se=1700000000&skn=RootManageSharedAccessKey"
        );
        assert_eq!(token_expiry(&token), Some(1_700_000_000));
    }

    #[test]
    fn known_answer_vector() {
        // HMAC-SHA256(key="key", "The quick brown fox jumps over the lazy dog") from RFC 4231-style
        // published vectors: f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(b"key").unwrap();
        mac.update(b"The quick brown fox jumps over the lazy dog");
        let bytes = mac.finalize().into_bytes();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
        );
    }

    #[test]
    fn tokens_from_credentials() {
        let key = Credential::SharedAccessKey {
            key_name: "k".to_owned(),
            key: "s".to_owned(),
        };
        let token = token_for(&key, "sb://h/e", 1000, SAS_TOKEN_LIFETIME);
        assert_eq!(token.expires_at_s, 1000 + 3600);
        assert_eq!(
            token_for(&key, "sb://h/e", 1000, Duration::from_secs(5)).expires_at_s,
            1005
        );
        assert!(
            token
                .value
                .starts_with("SharedAccessSignature sr=sb%3A%2F%2Fh%2Fe&sig=")
        );
        assert!(!format!("{token:?}").contains("sig="));
        let given = Credential::SharedAccessSignature(
            "SharedAccessSignature sr=x&sig=y&se=42&skn=k".to_owned(),
        );
        assert_eq!(
            token_for(&given, "sb://h/e", 1000, SAS_TOKEN_LIFETIME).expires_at_s,
            42
        );
        let odd = Credential::SharedAccessSignature("opaque".to_owned());
        assert_eq!(
            token_for(&odd, "sb://h/e", 1000, SAS_TOKEN_LIFETIME).expires_at_s,
            4600
        );
    }
}
