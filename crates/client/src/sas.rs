//! Shared access signature (SAS) tokens, signed exactly as the Azure SDKs sign them.
//!
//! The signer is the dialect's (`tributary_eventhubs::sas`, shared with the hub, which verifies
//! with the same code); this module re-exports what the client uses and adds the clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use tributary_eventhubs::sas::{
    SAS_TOKEN_TYPE, Token, quote_plus, sign as sign_token, token_expiry, token_for,
};

/// Seconds since the Unix epoch, now.
pub(crate) fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs()
}
