//! The OCI Streaming message API: handlers, the JSON models, and the strict parsing they share.

pub(crate) mod cursors;
mod encode;
pub(crate) mod groups;
pub(crate) mod messages;
pub(crate) mod model;
pub(crate) mod streams;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use base64::Engine;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use serde::Deserialize;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use time::macros::format_description;

use crate::error::ApiError;

/// Standard base64, padding optional (some clients strip it), nothing else tolerated.
const BASE64_IN: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Decodes `value`; `field` names it in the error (made only then).
pub(crate) fn decode_base64(
    value: &str,
    field: impl FnOnce() -> String,
) -> Result<Vec<u8>, ApiError> {
    BASE64_IN
        .decode(value)
        .map_err(|e| ApiError::invalid(format!("{} is not valid base64: {e}", field())))
}

#[cfg(test)]
pub(crate) fn encode_base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Parses a JSON body into `T` (whose fields say what is required and deny unknown ones; it may
/// borrow strings from the body).
pub(crate) fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Data if e.to_string().starts_with("missing field") => {
                ApiError::missing(format!("the request body is incomplete: {e}"))
            }
            Category::Data => ApiError::invalid(format!("the request body is invalid: {e}")),
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::cannot_parse(format!("the request body is not valid JSON: {e}"))
            }
        }
    })
}

/// An RFC 3339 time as ms since the epoch.
pub(crate) fn parse_time(field: &str, value: &str) -> Result<i64, ApiError> {
    let t = OffsetDateTime::parse(value, &Rfc3339).map_err(|e| {
        ApiError::invalid(format!("{field} {value:?} is not an RFC 3339 time: {e}"))
    })?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| ApiError::invalid(format!("{field} {value:?} is out of range")))
}

/// Ms since the epoch as OCI writes times: `2024-01-02T03:04:05.123Z`.
pub(crate) fn format_time(ms: i64) -> String {
    let t = OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    t.format(format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    ))
    .expect("a UTC time formats")
}

/// The query parameters of a request, each at most once, none unknown.
#[derive(Debug, Default)]
pub(crate) struct Query {
    params: Vec<(String, String)>,
}

impl Query {
    pub(crate) fn parse(raw: Option<&str>, allowed: &[&str]) -> Result<Query, ApiError> {
        let mut params: Vec<(String, String)> = Vec::new();
        for (name, value) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            if !allowed.contains(&name.as_ref()) {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {name:?}"
                )));
            }
            if params.iter().any(|(n, _)| *n == name) {
                return Err(ApiError::invalid(format!(
                    "the query parameter {name} is given more than once"
                )));
            }
            params.push((name.into_owned(), value.into_owned()));
        }
        Ok(Query { params })
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn required(&self, name: &str) -> Result<&str, ApiError> {
        self.get(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| ApiError::missing(format!("the query parameter {name} is required")))
    }

    /// A count parameter such as `limit`: `default` when absent, else a number from 1 to `max`.
    pub(crate) fn count(&self, name: &str, default: u32, max: u32) -> Result<u32, ApiError> {
        match self.get(name) {
            None => Ok(default),
            Some(text) => text
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| {
                    ApiError::invalid(format!("{name} {text:?} must be a number from 1 to {max}"))
                }),
        }
    }
}

/// The `{stream}` (and `{group}`) path parameters, percent-decoded.
#[derive(Debug)]
pub(crate) struct StreamPath {
    pub stream: String,
    pub group: Option<String>,
}

/// A request's path parameters by name, percent-decoded; a path that does not decode is
/// refused as invalid.
pub(crate) async fn path_params<S: Send + Sync>(
    parts: &mut Parts,
    state: &S,
) -> Result<std::collections::HashMap<String, String>, ApiError> {
    axum::extract::Path::<std::collections::HashMap<String, String>>::from_request_parts(
        parts, state,
    )
    .await
    .map(|axum::extract::Path(params)| params)
    .map_err(|e| ApiError::invalid(format!("invalid path: {e}")))
}

impl<S: Send + Sync> FromRequestParts<S> for StreamPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let params = path_params(parts, state).await?;
        let stream = params
            .get("stream")
            .cloned()
            .ok_or_else(|| ApiError::invalid("no stream in the path"))?;
        Ok(StreamPath {
            stream,
            group: params.get("group").cloned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_in_the_sdk_formats() {
        assert_eq!(format_time(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(
            parse_time("t", "2023-11-14T22:13:20.123456Z").unwrap(),
            1_700_000_000_123
        );
        assert_eq!(
            parse_time("t", "2023-11-14T22:13:20Z").unwrap(),
            1_700_000_000_000
        );
        assert_eq!(
            parse_time("t", "2023-11-14T23:13:20.5+01:00").unwrap(),
            1_700_000_000_500
        );
        assert!(parse_time("t", "yesterday").is_err());
    }

    #[test]
    fn base64_is_strict_about_the_alphabet() {
        let field = || "v".to_owned();
        assert_eq!(decode_base64("aGk=", field).unwrap(), b"hi");
        assert_eq!(decode_base64("aGk", field).unwrap(), b"hi");
        for bad in ["aGk*", "a", "aG k=", "_-8="] {
            let e = decode_base64(bad, field).unwrap_err();
            assert!(e.message.starts_with("v is not valid base64"), "{bad}");
        }
    }

    #[test]
    fn queries_refuse_unknown_and_repeated_parameters() {
        let q = Query::parse(Some("cursor=a%2Bb&limit=5"), &["cursor", "limit"]).unwrap();
        assert_eq!(q.get("cursor"), Some("a+b"));
        assert!(Query::parse(Some("cursor=a&cursor=b"), &["cursor"]).is_err());
        assert!(Query::parse(Some("cursor=a&x=1"), &["cursor"]).is_err());
        assert!(
            Query::parse(None, &["cursor"])
                .unwrap()
                .required("cursor")
                .is_err()
        );
    }
}
