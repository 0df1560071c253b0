//! CreateCursor, CreateGroupCursor, ConsumerCommit and ConsumerHeartbeat.

use crate::server::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use tributary_event::EventPosition;
use tributary_event::names::parse_partition_id;
use tributary_groups::{INSTANCE_TIMEOUT_MS_DEFAULT, JoinRequest, Session, StartPosition};

use super::messages::decode_cursor;
use super::model::{CreateCursorDetails, CreateGroupCursorDetails, CursorBody};
use super::{Query, StreamPath, parse_json, parse_time};
use crate::cursor::{Cursor, PartitionCursor};
use crate::error::ApiError;
use crate::limits::CURSOR_TTL_MS;
use crate::server::AppState;

fn cursor_answer(state: &AppState, cursor: &Cursor) -> Response {
    let expires = state.broker.clock().now_ms() + CURSOR_TTL_MS;
    Json(CursorBody {
        value: state.cursor_key.encode(cursor, expires),
    })
    .into_response()
}

/// POST `/streams/{streamId}/cursors`.
pub(crate) async fn create_cursor(
    State(state): State<AppState>,
    path: StreamPath,
    body: Bytes,
) -> Result<Response, ApiError> {
    let details: CreateCursorDetails = parse_json(&body)?;
    let hub = state.broker.describe_hub(&path.stream)?;
    let partition = parse_partition_id(&details.partition, hub.partition_count)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let position = partition_position(&details)?;
    let offset = state
        .broker
        .resolve_position(&hub.name, &details.partition, &position)?;
    let cursor = Cursor::Partition(PartitionCursor {
        stream: hub.name,
        hub_created_ms: hub.created_at_ms,
        partition,
        offset,
    });
    Ok(cursor_answer(&state, &cursor))
}

pub(crate) fn partition_position(d: &CreateCursorDetails) -> Result<EventPosition, ApiError> {
    let takes_offset = matches!(d.kind.as_str(), "AT_OFFSET" | "AFTER_OFFSET");
    if d.offset.is_some() && !takes_offset {
        return Err(ApiError::invalid(format!(
            "offset is not allowed with type {}",
            d.kind
        )));
    }
    if d.time.is_some() && d.kind != "AT_TIME" {
        return Err(ApiError::invalid(format!(
            "time is not allowed with type {}",
            d.kind
        )));
    }
    let offset = || match d.offset {
        None => Err(ApiError::missing(format!(
            "type {} needs an offset",
            d.kind
        ))),
        Some(o) if o < 0 => Err(ApiError::invalid(format!("offset {o} is negative"))),
        Some(o) => Ok(o),
    };
    Ok(match d.kind.as_str() {
        "TRIM_HORIZON" => EventPosition::Earliest,
        "LATEST" => EventPosition::Latest,
        "AT_OFFSET" => EventPosition::SequenceNumber {
            sequence_number: offset()?,
            inclusive: true,
        },
        "AFTER_OFFSET" => EventPosition::SequenceNumber {
            sequence_number: offset()?,
            inclusive: false,
        },
        "AT_TIME" => EventPosition::EnqueuedTime {
            enqueued_time_ms: group_time(d.time.as_deref(), "AT_TIME")?,
            inclusive: true,
        },
        other => {
            return Err(ApiError::invalid(format!(
                "type {other:?} is not one of AFTER_OFFSET, AT_OFFSET, AT_TIME, LATEST, TRIM_HORIZON"
            )));
        }
    })
}

fn group_time(time: Option<&str>, kind: &str) -> Result<i64, ApiError> {
    let time = time.ok_or_else(|| ApiError::missing(format!("type {kind} needs a time")))?;
    parse_time("time", time)
}

/// The start of a group (CreateGroupCursor, UpdateGroup): AT_TIME, LATEST or TRIM_HORIZON.
pub(crate) fn group_position(kind: &str, time: Option<&str>) -> Result<StartPosition, ApiError> {
    if time.is_some() && kind != "AT_TIME" {
        return Err(ApiError::invalid(format!(
            "time is not allowed with type {kind}"
        )));
    }
    match kind {
        "TRIM_HORIZON" => Ok(StartPosition::TrimHorizon),
        "LATEST" => Ok(StartPosition::Latest),
        "AT_TIME" => Ok(StartPosition::AtTime(group_time(time, kind)?)),
        other => Err(ApiError::invalid(format!(
            "type {other:?} is not one of AT_TIME, LATEST, TRIM_HORIZON"
        ))),
    }
}

/// POST `/streams/{streamId}/groupCursors`.
pub(crate) async fn create_group_cursor(
    State(state): State<AppState>,
    path: StreamPath,
    body: Bytes,
) -> Result<Response, ApiError> {
    let d: CreateGroupCursorDetails = parse_json(&body)?;
    let start = group_position(&d.kind, d.time.as_deref())?;
    let timeout_ms = match d.timeout_in_ms {
        None => INSTANCE_TIMEOUT_MS_DEFAULT,
        Some(t) => u32::try_from(t)
            .map_err(|_| ApiError::invalid(format!("timeoutInMs {t} is out of range")))?,
    };
    let session = state
        .coordinator
        .join(JoinRequest {
            stream: path.stream,
            group: d.group_name,
            instance: d.instance_name,
            start,
            commit_on_get: d.commit_on_get.unwrap_or(true),
            timeout_ms,
        })
        .await?;
    Ok(cursor_answer(&state, &Cursor::Group(session)))
}

/// The group session of a commit or heartbeat request (no body; `cursor` in the query).
fn session_of(
    state: &AppState,
    path: &StreamPath,
    uri: &Uri,
    body: &[u8],
) -> Result<Session, ApiError> {
    if !body.is_empty() {
        return Err(ApiError::invalid("this operation takes no request body"));
    }
    let query = Query::parse(uri.query(), &["cursor"])?;
    let now_ms = state.broker.clock().now_ms();
    match decode_cursor(state, &path.stream, query.required("cursor")?, now_ms)? {
        Cursor::Group(session) => Ok(session),
        Cursor::Partition(_) => Err(ApiError::invalid(
            "this operation needs a group cursor (from CreateGroupCursor), not a partition cursor",
        )),
    }
}

/// POST `/streams/{streamId}/commit?cursor=…`.
pub(crate) async fn consumer_commit(
    State(state): State<AppState>,
    path: StreamPath,
    uri: Uri,
    body: Bytes,
) -> Result<Response, ApiError> {
    let session = session_of(&state, &path, &uri, &body)?;
    let session = state.coordinator.commit(&session).await?;
    Ok(cursor_answer(&state, &Cursor::Group(session)))
}

/// POST `/streams/{streamId}/heartbeat?cursor=…`.
pub(crate) async fn consumer_heartbeat(
    State(state): State<AppState>,
    path: StreamPath,
    uri: Uri,
    body: Bytes,
) -> Result<Response, ApiError> {
    let session = session_of(&state, &path, &uri, &body)?;
    let session = state.coordinator.heartbeat(&session).await?;
    Ok(cursor_answer(&state, &Cursor::Group(session)))
}
