//! GetGroup and UpdateGroup.

use crate::server::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};

use super::cursors::group_position;
use super::model::{Group, PartitionReservation, UpdateGroupDetails};
use super::{StreamPath, format_time, parse_json};
use crate::error::ApiError;
use crate::server::AppState;

fn group_name(path: &StreamPath) -> Result<&str, ApiError> {
    path.group
        .as_deref()
        .ok_or_else(|| ApiError::invalid("no group in the path"))
}

/// GET `/streams/{streamId}/groups/{groupName}`.
pub(crate) async fn get_group(
    State(state): State<AppState>,
    path: StreamPath,
) -> Result<Response, ApiError> {
    let d = state
        .coordinator
        .describe(&path.stream, group_name(&path)?)
        .await?;
    let group = Group {
        stream_id: d.stream,
        group_name: d.group,
        reservations: d
            .reservations
            .into_iter()
            .map(|r| PartitionReservation {
                partition: r.partition.to_string(),
                committed_offset: r.committed_offset,
                reserved_instance: r.instance,
                time_reserved_until: r.reserved_until_ms.map(format_time),
            })
            .collect(),
    };
    Ok(Json(group).into_response())
}

/// PUT `/streams/{streamId}/groups/{groupName}`: moves the whole group to a position.
pub(crate) async fn update_group(
    State(state): State<AppState>,
    path: StreamPath,
    body: Bytes,
) -> Result<Response, ApiError> {
    let d: UpdateGroupDetails = parse_json(&body)?;
    let position = group_position(&d.kind, d.time.as_deref())?;
    state
        .coordinator
        .reset(&path.stream, group_name(&path)?, position)
        .await?;
    Ok(().into_response())
}
