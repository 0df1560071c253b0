//! OCI Streaming's control plane for streams, as the `oci` SDK's `StreamAdminClient` calls it:
//! CreateStream, GetStream, ListStreams and DeleteStream under `/20180418/streams`.
//!
//! A stream is an event hub and its id is the hub's name — the id the message API takes, so a
//! stream created here is used at once with `StreamClient(service_endpoint=messagesEndpoint)`.
//! A stream is `ACTIVE` as soon as CreateStream answers (OCI answers `CREATING` and provisions
//! for a while; SDK code that polls for `ACTIVE` sees it on its first look).
//!
//! Tributary has no compartments, stream pools or tags. CreateStream accepts a `compartmentId`
//! or a `streamPoolId` (not both, as OCI) and echoes it; ListStreams lists every stream whatever
//! compartment or pool it asks for and echoes that; GetStream answers with
//! [`COMPARTMENT_ID`] and [`STREAM_POOL_ID`]. Tags are accepted and not kept (answers carry
//! empty ones). Update and the other admin operations (stream pools, archivers, Kafka Connect
//! harnesses) are not served: the generic 404 `NotFound` or 405 answers them.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tributary_broker::{HubDefinition, HubSpec};

use super::{Query, StreamPath, format_time, parse_json};
use crate::error::ApiError;
use crate::server::{AppState, Json};

/// The compartment every stream answers with when the request named none.
pub(crate) const COMPARTMENT_ID: &str = "ocid1.compartment.oc1..tributary";
/// The stream pool every stream answers with when the request named none.
pub(crate) const STREAM_POOL_ID: &str = "ocid1.streampool.oc1..tributary";
/// ListStreams' page size when `limit` is not given, and its largest (OCI's values).
const LIST_LIMIT_DEFAULT: u32 = 10;
const LIST_LIMIT_MAX: u32 = 50;
/// The longest retention a stream may ask for: a century. (OCI allows 24 to 168 hours; a
/// local hub may keep data as long as its disk allows.)
const RETENTION_HOURS_MAX: u32 = 100 * 365 * 24;

/// `CreateStreamDetails`. Unknown fields are ignored: newer SDKs may send fields this server
/// does not know, and none of them could change how it stores events.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CreateStreamDetails {
    name: Option<String>,
    partitions: Option<i64>,
    compartment_id: Option<String>,
    stream_pool_id: Option<String>,
    retention_in_hours: Option<i64>,
    #[serde(default)]
    freeform_tags: Option<Value>,
    #[serde(default)]
    defined_tags: Option<Value>,
}

/// Where the answer says the stream lives.
struct Placement {
    compartment_id: String,
    stream_pool_id: String,
}

impl Placement {
    fn new(compartment_id: Option<String>, stream_pool_id: Option<String>) -> Placement {
        Placement {
            compartment_id: compartment_id.unwrap_or_else(|| COMPARTMENT_ID.to_owned()),
            stream_pool_id: stream_pool_id.unwrap_or_else(|| STREAM_POOL_ID.to_owned()),
        }
    }
}

/// The URL the message API is served at: this server, as the client reached it.
/// Where this server takes message requests, as the client reached it: the request's `Host`
/// with this door's scheme (`https` when it serves TLS).
fn messages_endpoint(state: &AppState, headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let scheme = if state.https { "https" } else { "http" };
    format!("{scheme}://{host}")
}

/// A `StreamSummary`; [`stream_json`] adds what a `Stream` has more.
fn summary_json(hub: &HubDefinition, placement: &Placement, endpoint: &str) -> Value {
    json!({
        "name": hub.name,
        "id": hub.name,
        "partitions": hub.partition_count,
        "compartmentId": placement.compartment_id,
        "streamPoolId": placement.stream_pool_id,
        "lifecycleState": "ACTIVE",
        "timeCreated": format_time(hub.created_at_ms),
        "messagesEndpoint": endpoint,
        "freeformTags": {},
        "definedTags": {},
    })
}

/// A `Stream`. A hub that keeps events forever answers `retentionInHours: null`.
fn stream_json(hub: &HubDefinition, placement: &Placement, endpoint: &str) -> Value {
    let mut stream = summary_json(hub, placement, endpoint);
    stream["retentionInHours"] = json!(hub.retention_age_ms.map(|ms| ms / 3_600_000));
    stream
}

/// A stream's definition never changes once created, so its creation time tags it.
fn etag(hub: &HubDefinition) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{}\"", hub.created_at_ms))
        .unwrap_or_else(|_| HeaderValue::from_static("\"0\""))
}

/// The hub a CreateStream asks for, or why it cannot be.
fn hub_spec(details: CreateStreamDetails) -> Result<(HubSpec, Placement), ApiError> {
    let name = details
        .name
        .ok_or_else(|| ApiError::missing("the stream needs a name"))?;
    let partitions = details
        .partitions
        .ok_or_else(|| ApiError::missing("the stream needs a partition count (partitions)"))?;
    let partitions = u32::try_from(partitions)
        .ok()
        .filter(|p| *p >= 1)
        .ok_or_else(|| {
            ApiError::invalid(format!("partitions must be at least 1, not {partitions}"))
        })?;
    if details.compartment_id.is_some() && details.stream_pool_id.is_some() {
        return Err(ApiError::invalid(
            "give compartmentId or streamPoolId, not both",
        ));
    }
    for (field, tags) in [
        ("freeformTags", &details.freeform_tags),
        ("definedTags", &details.defined_tags),
    ] {
        if tags
            .as_ref()
            .is_some_and(|t| !t.is_object() && !t.is_null())
        {
            return Err(ApiError::invalid(format!("{field} must be an object")));
        }
    }
    let mut spec = HubSpec::new(name, partitions);
    if let Some(hours) = details.retention_in_hours {
        let hours = u32::try_from(hours)
            .ok()
            .filter(|h| (1..=RETENTION_HOURS_MAX).contains(h))
            .ok_or_else(|| {
                ApiError::invalid(format!(
                    "retentionInHours must be between 1 and {RETENTION_HOURS_MAX}, not {hours}"
                ))
            })?;
        spec.retention_age_ms = Some(i64::from(hours) * 3_600_000);
    }
    Ok((
        spec,
        Placement::new(details.compartment_id, details.stream_pool_id),
    ))
}

/// CreateStream: `POST /20180418/streams`.
pub(crate) async fn create_stream(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let details: CreateStreamDetails = parse_json(&body)?;
    let (spec, placement) = hub_spec(details)?;
    let hub = state.broker.create_hub(spec).await?;
    let body = stream_json(&hub, &placement, &messages_endpoint(&state, &headers));
    Ok(([(header::ETAG, etag(&hub))], Json(body)).into_response())
}

/// GetStream: `GET /20180418/streams/{streamId}`.
pub(crate) async fn get_stream(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: StreamPath,
) -> Result<Response, ApiError> {
    let hub = state.broker.describe_hub(&path.stream)?;
    let body = stream_json(
        &hub,
        &Placement::new(None, None),
        &messages_endpoint(&state, &headers),
    );
    Ok(([(header::ETAG, etag(&hub))], Json(body)).into_response())
}

/// DeleteStream: `DELETE /20180418/streams/{streamId}`; 202 and no body, as OCI.
pub(crate) async fn delete_stream(
    State(state): State<AppState>,
    path: StreamPath,
) -> Result<Response, ApiError> {
    state.broker.delete_hub(&path.stream).await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

/// ListStreams' query parameters.
const LIST_PARAMETERS: &[&str] = &[
    "compartmentId",
    "streamPoolId",
    "id",
    "name",
    "limit",
    "page",
    "sortBy",
    "sortOrder",
    "lifecycleState",
];

/// ListStreams: `GET /20180418/streams`, paged with `limit` and `page` (the next page's token
/// comes in `opc-next-page`).
pub(crate) async fn list_streams(
    State(state): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Response, ApiError> {
    let query = Query::parse(uri.query(), LIST_PARAMETERS)?;
    let limit = query.count("limit", LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX)? as usize;
    let start = match query.get("page") {
        None => 0,
        Some(token) => token
            .parse::<usize>()
            .map_err(|_| ApiError::invalid(format!("page {token:?} is not a page token")))?,
    };
    let descending = match query.get("sortOrder") {
        None | Some("DESC") => true,
        Some("ASC") => false,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "sortOrder must be ASC or DESC, not {other:?}"
            )));
        }
    };
    let mut hubs: Vec<HubDefinition> = state
        .broker
        .list_hubs()
        .into_iter()
        .filter(|h| query.get("id").is_none_or(|id| id == h.name))
        .filter(|h| query.get("name").is_none_or(|name| name == h.name))
        .filter(|_| query.get("lifecycleState").is_none_or(|s| s == "ACTIVE"))
        .collect();
    match query.get("sortBy") {
        None | Some("TIMECREATED") => {
            hubs.sort_by(|a, b| (a.created_at_ms, &a.name).cmp(&(b.created_at_ms, &b.name)));
        }
        Some("NAME") => hubs.sort_by(|a, b| a.name.cmp(&b.name)),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "sortBy must be NAME or TIMECREATED, not {other:?}"
            )));
        }
    }
    if descending {
        hubs.reverse();
    }
    let placement = Placement::new(
        query.get("compartmentId").map(str::to_owned),
        query.get("streamPoolId").map(str::to_owned),
    );
    let endpoint = messages_endpoint(&state, &headers);
    let page: Vec<Value> = hubs
        .iter()
        .skip(start)
        .take(limit)
        .map(|h| summary_json(h, &placement, &endpoint))
        .collect();
    let mut response = Json(Value::Array(page)).into_response();
    let next = start.saturating_add(limit);
    if next < hubs.len()
        && let Ok(value) = HeaderValue::from_str(&next.to_string())
    {
        response.headers_mut().insert("opc-next-page", value);
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn details(json: &str) -> CreateStreamDetails {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn create_details_become_a_hub_spec() {
        let (spec, placement) = hub_spec(details(
            r#"{"name":"orders","partitions":3,"compartmentId":"c1","retentionInHours":48,"freeformTags":{"a":"b"},"newField":1}"#,
        ))
        .unwrap();
        assert_eq!(spec.name, "orders");
        assert_eq!(spec.partition_count, 3);
        assert_eq!(spec.retention_age_ms, Some(48 * 3_600_000));
        assert_eq!(placement.compartment_id, "c1");
        assert_eq!(placement.stream_pool_id, STREAM_POOL_ID);
    }

    #[test]
    fn bad_create_details_are_refused() {
        for bad in [
            r#"{"partitions":1}"#,
            r#"{"name":"a"}"#,
            r#"{"name":"a","partitions":0}"#,
            r#"{"name":"a","partitions":-1}"#,
            r#"{"name":"a","partitions":1,"retentionInHours":0}"#,
            r#"{"name":"a","partitions":1,"compartmentId":"c","streamPoolId":"p"}"#,
            r#"{"name":"a","partitions":1,"freeformTags":[1]}"#,
        ] {
            assert!(hub_spec(details(bad)).is_err(), "{bad}");
        }
    }
}
