//! The dashboard's login sessions: a random id in an HttpOnly, SameSite=Strict cookie, and a
//! second random value, the CSRF token, that the page's script sends back in a header with
//! every admin API request. Sessions live in memory (a restart logs everyone out), expire
//! after at most eight hours (sooner when the SAS token logged in with expires sooner), and
//! are capped in number; the oldest goes first.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;

/// The cookie's name.
pub(crate) const COOKIE: &str = "tributary_session";
/// The header carrying the CSRF token.
pub(crate) const CSRF_HEADER: &str = "x-tributary-csrf";
/// The longest a session lasts.
pub(crate) const SESSION_LIFETIME: Duration = Duration::from_secs(8 * 3600);
/// The most sessions kept at once.
const SESSIONS_MAX: usize = 256;

#[derive(Debug)]
struct Session {
    csrf: String,
    expires: Instant,
}

/// The open sessions.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    open: Mutex<HashMap<String, Session>>,
}

fn random_hex() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the system's random source is available");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares in time independent of where the first difference is.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The session id in a request's cookies, if any.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

impl Sessions {
    /// Opens a session for `lifetime`; returns its id.
    pub(crate) fn open(&self, lifetime: Duration) -> String {
        let now = Instant::now();
        let mut open = self.open.lock().expect("sessions");
        open.retain(|_, s| s.expires > now);
        if open.len() >= SESSIONS_MAX
            && let Some(oldest) = open
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(id, _)| id.clone())
        {
            open.remove(&oldest);
        }
        let id = random_hex();
        open.insert(
            id.clone(),
            Session {
                csrf: random_hex(),
                expires: now + lifetime.min(SESSION_LIFETIME),
            },
        );
        id
    }

    /// The CSRF token of the live session the request's cookie names.
    pub(crate) fn csrf(&self, headers: &HeaderMap) -> Option<String> {
        let id = cookie(headers)?;
        let open = self.open.lock().expect("sessions");
        open.get(id)
            .filter(|s| s.expires > Instant::now())
            .map(|s| s.csrf.clone())
    }

    /// Whether the request has a live session cookie and the matching CSRF header.
    pub(crate) fn authorises(&self, headers: &HeaderMap) -> bool {
        let sent = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok());
        match (self.csrf(headers), sent) {
            (Some(want), Some(sent)) => same(&want, sent),
            _ => false,
        }
    }

    /// Ends the session the request's cookie names.
    pub(crate) fn close(&self, headers: &HeaderMap) {
        if let Some(id) = cookie(headers) {
            self.open.lock().expect("sessions").remove(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with_cookie(id: &str, csrf: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            axum::http::header::COOKIE,
            HeaderValue::from_str(&format!("other=1; {COOKIE}={id}")).unwrap(),
        );
        if let Some(csrf) = csrf {
            h.insert(CSRF_HEADER, HeaderValue::from_str(csrf).unwrap());
        }
        h
    }

    #[test]
    fn a_session_authorises_only_with_its_csrf_token_until_closed() {
        let sessions = Sessions::default();
        let id = sessions.open(Duration::from_secs(60));
        let csrf = sessions
            .csrf(&with_cookie(&id, None))
            .expect("live session");
        assert!(sessions.authorises(&with_cookie(&id, Some(&csrf))));
        assert!(
            !sessions.authorises(&with_cookie(&id, None)),
            "no CSRF header"
        );
        assert!(
            !sessions.authorises(&with_cookie(&id, Some("0000"))),
            "wrong CSRF token"
        );
        assert!(
            !sessions.authorises(&with_cookie("forged", Some(&csrf))),
            "unknown session"
        );
        sessions.close(&with_cookie(&id, None));
        assert!(
            !sessions.authorises(&with_cookie(&id, Some(&csrf))),
            "closed"
        );
    }

    #[test]
    fn an_expired_session_is_refused() {
        let sessions = Sessions::default();
        let id = sessions.open(Duration::ZERO);
        assert_eq!(sessions.csrf(&with_cookie(&id, None)), None);
    }

    #[test]
    fn the_number_of_sessions_is_capped() {
        let sessions = Sessions::default();
        let first = sessions.open(Duration::from_secs(10));
        for _ in 0..SESSIONS_MAX {
            sessions.open(Duration::from_secs(60));
        }
        assert_eq!(sessions.open.lock().unwrap().len(), SESSIONS_MAX);
        assert_eq!(
            sessions.csrf(&with_cookie(&first, None)),
            None,
            "the oldest went"
        );
    }
}
