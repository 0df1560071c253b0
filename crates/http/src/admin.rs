//! The admin API under `/admin/v1`: event hubs, their (Event Hubs) consumer groups, and the
//! server-side (OCI) groups. JSON in and out, camelCase, unknown fields refused.
//!
//! `GET /admin/v1/hubs/{hub}/consumergroups/{group}/partitions` shows an Event Hubs consumer
//! group's processors as the hub-hosted checkpoint store records them: per partition its owner,
//! ownership version and last change, checkpoint, the partition's last enqueued event, and the
//! group's lag — events after the checkpoint (every retained event without one) and the age in
//! seconds of the oldest of them (0 when it is caught up).
//!
//! `PATCH /admin/v1/hubs/{hub}` changes a hub's retention (`retentionMs`, `retentionForever`,
//! `retentionBytesMax`, `null` for no limit) and cleanup policy (`retentionDescription`, Event
//! Hubs' shape: `cleanupPolicy`, `minCompactionLagTimeInMinutes`,
//! `tombstoneRetentionTimeInHours`; see [`crate::retention`]), which `POST /admin/v1/hubs` also
//! takes. `POST /admin/v1/hubs/{hub}/compact` seals and compacts a compacted hub's partitions
//! now; its description shows each partition's compaction (dirty ratio, last run, bytes before
//! and after).
//!
//! A hub's Event Hubs Capture is Azure's `captureDescription` (see
//! [`tributary_capture::spec`]), shown by every hub and taken by `POST` and `PATCH`
//! (`{"enabled": false}` turns it off). A captured hub's description shows each partition's
//! capture: `capturedTo`, `lagEvents`, `lagSeconds`, `filesWritten`, `bytesWritten`, `errors`,
//! `lastError`, `lastSuccess`, `retentionHeld` and `uncapturedEventsRemoved`.
//!
//! `POST /admin/v1/hubs/{hub}/consumergroups/{group}/reset` with `{"type": "TRIM_HORIZON" |
//! "LATEST" | "AT_TIME", "time": …}` moves every checkpoint of such a group so that its
//! processors resume at the earliest retained event, after the latest, or at the first event
//! enqueued at or after the time — as Kafka resets a consumer group's offsets, and like Kafka
//! only while none of its processors runs (409 otherwise, naming the owners).

use crate::server::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use tributary_broker::{Broker, HubCleanup, HubDefinition, HubSpec, HubUpdate};
use tributary_capture::CaptureDescription;
use tributary_groups::GroupSummary;

use crate::error::ApiError;
use crate::oci::{StreamPath, parse_json};
use crate::retention::RetentionDescription;
use crate::server::AppState;

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin/v1/hubs", get(list_hubs).post(create_hub))
        .route(
            "/admin/v1/hubs/{stream}",
            get(describe_hub).patch(update_hub).delete(delete_hub),
        )
        .route("/admin/v1/hubs/{stream}/compact", post(compact_hub))
        .route(
            "/admin/v1/hubs/{stream}/consumergroups",
            get(list_consumer_groups).post(create_consumer_group),
        )
        .route(
            "/admin/v1/hubs/{stream}/consumergroups/{group}",
            delete(delete_consumer_group),
        )
        .route(
            "/admin/v1/hubs/{stream}/consumergroups/{group}/partitions",
            get(consumer_group_partitions),
        )
        .route(
            "/admin/v1/hubs/{stream}/consumergroups/{group}/reset",
            post(reset_consumer_group),
        )
        .route("/admin/v1/hubs/{stream}/groups", get(list_groups))
        .route(
            "/admin/v1/hubs/{stream}/groups/{group}",
            delete(delete_group),
        )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CreateHub {
    name: String,
    partition_count: u32,
    #[serde(default)]
    retention_ms: Option<i64>,
    #[serde(default)]
    retention_forever: bool,
    #[serde(default)]
    retention_bytes_max: Option<u64>,
    #[serde(default)]
    retention_description: Option<RetentionDescription>,
    #[serde(default)]
    capture_description: Option<CaptureDescription>,
}

/// `PATCH /admin/v1/hubs/{hub}`: what to change, each field optional (`retentionBytesMax`
/// `null` removes the size limit).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct UpdateHub {
    #[serde(default)]
    retention_ms: Option<i64>,
    #[serde(default)]
    retention_forever: bool,
    #[serde(default, deserialize_with = "present")]
    retention_bytes_max: Option<Option<u64>>,
    #[serde(default)]
    retention_description: Option<RetentionDescription>,
    #[serde(default)]
    capture_description: Option<CaptureDescription>,
}

/// A field that may be given as `null`: `Some(None)` then, `None` (by default) when absent.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// The retention age a request gives: `retentionMs`, `retentionForever`, or neither (`None`).
fn retention_age(ms: Option<i64>, forever: bool) -> Result<Option<Option<i64>>, ApiError> {
    match (ms, forever) {
        (Some(_), true) => Err(ApiError::invalid(
            "give retentionMs or retentionForever, not both",
        )),
        (Some(ms), false) => Ok(Some(Some(ms))),
        (None, true) => Ok(Some(None)),
        (None, false) => Ok(None),
    }
}

/// The cleanup settings a request's `retentionDescription` changes (each if given), as an
/// update of nothing else.
fn cleanup_changes(description: Option<&RetentionDescription>) -> Result<HubUpdate, ApiError> {
    let Some(description) = description else {
        return Ok(HubUpdate::default());
    };
    if description.retention_time_in_hours.is_some() {
        return Err(ApiError::invalid(
            "retentionDescription.retentionTimeInHours is shown, not set: give retentionMs or retentionForever",
        ));
    }
    Ok(HubUpdate {
        cleanup_policy: description.policy().map_err(ApiError::invalid)?,
        min_compaction_lag_ms: description
            .min_compaction_lag_ms()
            .map_err(ApiError::invalid)?,
        tombstone_retention_ms: description
            .tombstone_retention_ms()
            .map_err(ApiError::invalid)?,
        ..HubUpdate::default()
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateConsumerGroup {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetConsumerGroup {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    time: Option<String>,
}

fn group_of(path: &StreamPath) -> Result<&str, ApiError> {
    path.group
        .as_deref()
        .ok_or_else(|| ApiError::invalid("no group in the path"))
}

fn hub_json(h: &HubDefinition) -> Value {
    json!({
        "name": h.name,
        "partitionCount": h.partition_count,
        "retentionMs": h.retention_age_ms,
        "retentionBytesMax": h.retention_bytes_max,
        "retentionDescription": RetentionDescription::of(h),
        "captureDescription": CaptureDescription::of(h.capture.as_ref()),
        "createdAt": crate::oci::format_time(h.created_at_ms),
        "consumerGroups": h.consumer_groups.iter().map(|g| g.name.clone()).collect::<Vec<_>>(),
    })
}

async fn list_hubs(State(state): State<AppState>) -> Response {
    let hubs: Vec<Value> = state.broker.list_hubs().iter().map(hub_json).collect();
    Json(json!({ "hubs": hubs })).into_response()
}

async fn create_hub(State(state): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    let request: CreateHub = parse_json(&body)?;
    let mut spec = HubSpec::new(request.name, request.partition_count);
    if let Some(age) = retention_age(request.retention_ms, request.retention_forever)? {
        spec.retention_age_ms = age;
    }
    spec.retention_bytes_max = request.retention_bytes_max;
    let changes = cleanup_changes(request.retention_description.as_ref())?;
    spec.cleanup = HubCleanup {
        policy: changes.cleanup_policy.unwrap_or(spec.cleanup.policy),
        min_compaction_lag_ms: changes
            .min_compaction_lag_ms
            .unwrap_or(spec.cleanup.min_compaction_lag_ms),
        tombstone_retention_ms: changes
            .tombstone_retention_ms
            .unwrap_or(spec.cleanup.tombstone_retention_ms),
    };
    if let Some(description) = &request.capture_description {
        spec.capture = description
            .apply(&spec.name, None)
            .map_err(|e| ApiError::invalid(e.to_string()))?;
    }
    let hub = state.broker.create_hub(spec).await?;
    Ok((StatusCode::CREATED, Json(hub_json(&hub))).into_response())
}

async fn describe_hub(
    State(state): State<AppState>,
    path: StreamPath,
) -> Result<Response, ApiError> {
    let definition = state.broker.describe_hub(&path.stream)?;
    let mut body = hub_json(&definition);
    let mut partitions = Vec::new();
    for p in 0..definition.partition_count {
        let props = state
            .broker
            .partition_properties(&definition.name, &p.to_string())?;
        partitions.push(json!({
            "id": p.to_string(),
            "beginSequenceNumber": props.begin_sequence_number,
            "lastEnqueuedSequenceNumber": props.last_enqueued_sequence_number,
            "lastEnqueuedOffset": props.last_enqueued_offset.map(|o| o.to_string()),
            "lastEnqueuedTime": props.last_enqueued_time_ms.map(crate::oci::format_time),
            "isEmpty": props.is_empty,
        }));
    }
    if definition.cleanup.policy.compacts() {
        let states = state.broker.compaction_states(&definition.name)?;
        for (partition, c) in partitions.iter_mut().zip(states) {
            partition["compaction"] = json!({
                "dirtyRatio": c.dirty_ratio,
                "totalBytes": c.total_bytes,
                "lastRun": c.last_run_ms.map(crate::oci::format_time),
                "bytesBefore": c.last_outcome.map(|o| o.bytes_before),
                "bytesAfter": c.last_outcome.map(|o| o.bytes_after),
            });
        }
    }
    if definition.capture.is_some() {
        add_capture_statuses(&state.broker, &definition, &mut partitions);
    }
    body["partitions"] = Value::Array(partitions);
    body["openReceivers"] = json!(state.broker.open_receiver_count(&definition.name)?);
    Ok(Json(body).into_response())
}

/// Adds each partition's capture status to its description (see the module docs).
fn add_capture_statuses(broker: &Broker, hub: &HubDefinition, partitions: &mut [Value]) {
    let now_ms = broker.clock().now_ms();
    let statuses = broker.capture_statuses(&hub.name, hub.partition_count);
    for (partition, status) in partitions.iter_mut().zip(statuses) {
        let next = partition["lastEnqueuedSequenceNumber"]
            .as_i64()
            .unwrap_or(-1)
            + 1;
        partition["capture"] = json!({
            "capturedTo": status.captured_to,
            "lagEvents": status.lag_events(next),
            "lagSeconds": status.lag_seconds(now_ms),
            "filesWritten": status.files_written,
            "bytesWritten": status.bytes_written,
            "errors": status.errors,
            "lastError": status.last_error,
            "lastSuccess": status.last_success_ms.map(crate::oci::format_time),
            "retentionHeld": status.retention_held,
            "uncapturedEventsRemoved": status.uncaptured_events_removed,
        });
    }
}

async fn update_hub(
    State(state): State<AppState>,
    path: StreamPath,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: UpdateHub = parse_json(&body)?;
    let capture = match &request.capture_description {
        Some(description) => {
            let current = state.broker.describe_hub(&path.stream)?;
            let capture = description
                .apply(&current.name, current.capture.as_ref())
                .map_err(|e| ApiError::invalid(e.to_string()))?;
            Some(capture)
        }
        None => None,
    };
    let update = HubUpdate {
        retention_age_ms: retention_age(request.retention_ms, request.retention_forever)?,
        retention_bytes_max: request.retention_bytes_max,
        capture,
        ..cleanup_changes(request.retention_description.as_ref())?
    };
    let hub = state.broker.update_hub(&path.stream, update).await?;
    Ok(Json(hub_json(&hub)).into_response())
}

/// `POST /admin/v1/hubs/{hub}/compact`: seals and compacts every partition of a hub that
/// compacts now, whatever the schedule, and answers what each run did.
async fn compact_hub(
    State(state): State<AppState>,
    path: StreamPath,
) -> Result<Response, ApiError> {
    let hub = state.broker.describe_hub(&path.stream)?;
    if !hub.cleanup.policy.compacts() {
        return Err(ApiError::invalid(format!(
            "event hub {:?} does not compact: its cleanup policy is {}",
            hub.name,
            crate::retention::policy_name(hub.cleanup.policy)
        )));
    }
    let outcomes = state.broker.compact_hub(&hub.name).await?;
    let partitions: Vec<Value> = outcomes
        .iter()
        .enumerate()
        .map(|(p, o)| {
            json!({
                "id": p.to_string(),
                "eventsRemoved": o.events_removed,
                "tombstonesRemoved": o.tombstones_removed,
                "bytesBefore": o.bytes_before,
                "bytesAfter": o.bytes_after,
                "segmentsRewritten": o.segments_rewritten,
            })
        })
        .collect();
    Ok(Json(json!({ "partitions": partitions })).into_response())
}

async fn delete_hub(State(state): State<AppState>, path: StreamPath) -> Result<Response, ApiError> {
    state.broker.delete_hub(&path.stream).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn list_consumer_groups(
    State(state): State<AppState>,
    path: StreamPath,
) -> Result<Response, ApiError> {
    let groups: Vec<Value> = state
        .broker
        .list_consumer_groups(&path.stream)?
        .iter()
        .map(|g| json!({ "name": g.name, "createdAt": crate::oci::format_time(g.created_at_ms) }))
        .collect();
    Ok(Json(json!({ "consumerGroups": groups })).into_response())
}

async fn create_consumer_group(
    State(state): State<AppState>,
    path: StreamPath,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: CreateConsumerGroup = parse_json(&body)?;
    let g = state
        .broker
        .create_consumer_group(&path.stream, &request.name)
        .await?;
    let body = json!({ "name": g.name, "createdAt": crate::oci::format_time(g.created_at_ms) });
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn delete_consumer_group(
    State(state): State<AppState>,
    path: StreamPath,
) -> Result<Response, ApiError> {
    state
        .broker
        .delete_consumer_group(&path.stream, group_of(&path)?)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn consumer_group_partitions(
    State(state): State<AppState>,
    path: StreamPath,
) -> Result<Response, ApiError> {
    let broker = &state.broker;
    let definition = broker.describe_hub(&path.stream)?;
    let asked = group_of(&path)?;
    let Some((group, states)) = broker
        .processor_group_states(&definition.name)?
        .into_iter()
        .find(|(group, _)| group.eq_ignore_ascii_case(asked))
    else {
        return Err(tributary_broker::BrokerError::ConsumerGroupNotFound {
            hub: definition.name,
            group: asked.to_owned(),
        }
        .into());
    };
    let now_ms = broker.clock().now_ms();
    let mut partitions = Vec::new();
    for p in 0..definition.partition_count {
        let id = p.to_string();
        let record = states.iter().find(|s| s.partition_id == id);
        partitions.push(partition_state_json(
            broker,
            &definition.name,
            &id,
            record,
            now_ms,
        )?);
    }
    let body = json!({
        "hub": definition.name,
        "consumerGroup": group,
        "partitions": partitions,
    });
    Ok(Json(body).into_response())
}

async fn reset_consumer_group(
    State(state): State<AppState>,
    path: StreamPath,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: ResetConsumerGroup = parse_json(&body)?;
    let start = crate::oci::cursors::group_position(&request.kind, request.time.as_deref())?;
    let group = group_of(&path)?;
    let checkpoints = state
        .broker
        .reset_processor_group(&path.stream, group, &start.event_position())
        .await?;
    let checkpoints: Vec<Value> = checkpoints
        .iter()
        .map(|c| json!({"partitionId": c.partition_id, "sequenceNumber": c.sequence_number}))
        .collect();
    let body = json!({"hub": path.stream, "consumerGroup": group, "checkpoints": checkpoints});
    Ok(Json(body).into_response())
}

/// One partition's owner, checkpoint and lag (see the module docs).
fn partition_state_json(
    broker: &tributary_broker::Broker,
    hub: &str,
    id: &str,
    record: Option<&tributary_broker::ProcessorPartitionState>,
    now_ms: i64,
) -> Result<Value, ApiError> {
    let props = broker.partition_properties(hub, id)?;
    let checkpoint_sequence = record.and_then(|r| r.checkpoint_sequence_number);
    let has_checkpoint =
        record.is_some_and(|r| r.checkpoint_offset.is_some()) || checkpoint_sequence.is_some();
    // The first event the group has not processed.
    let next = match (has_checkpoint, checkpoint_sequence) {
        (true, Some(sequence)) => Some(sequence + 1),
        (true, None) => None, // An offset alone: the sequence number is not known here.
        (false, _) => Some(props.begin_sequence_number),
    };
    let last = props.last_enqueued_sequence_number;
    let lag_events = next.map(|next| (last + 1 - next).max(0));
    let lag_seconds = match (next, lag_events) {
        (Some(next), Some(events)) if events > 0 => broker
            .read(hub, id, next.max(props.begin_sequence_number), 1, 1 << 20)
            .ok()
            .and_then(|events| events.first().map(|e| e.enqueued_time_ms))
            .map(|enqueued| ((now_ms - enqueued).max(0) as f64) / 1000.0),
        (Some(_), Some(_)) => Some(0.0),
        _ => None,
    };
    let owned = record.filter(|r| r.version > 0);
    Ok(json!({
        "id": id,
        "ownerId": owned.map(|r| r.owner_id.clone()),
        "ownershipVersion": owned.map(|r| r.version),
        "ownershipLastModified": owned.map(|r| crate::oci::format_time(r.last_modified_ms)),
        "checkpoint": has_checkpoint.then(|| json!({
            "offset": record.and_then(|r| r.checkpoint_offset).map(|o| o.to_string()),
            "sequenceNumber": checkpoint_sequence,
        })),
        "lastEnqueuedSequenceNumber": last,
        "lastEnqueuedTime": props.last_enqueued_time_ms.map(crate::oci::format_time),
        "lagEvents": lag_events,
        "lagSeconds": lag_seconds,
    }))
}

fn group_json(g: &GroupSummary) -> Value {
    json!({
        "groupName": g.group,
        "createdAt": crate::oci::format_time(g.created_ms),
        "lastUsedAt": crate::oci::format_time(g.last_used_ms),
        "committed": g.committed.iter().enumerate().map(|(p, next)| json!({
            "partition": p.to_string(),
            "committedOffset": (*next > 0).then_some(next - 1),
        })).collect::<Vec<_>>(),
        "instances": g.instances.iter().map(|(name, ps)| json!({
            "instanceName": name,
            "partitions": ps.iter().map(u32::to_string).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

async fn list_groups(
    State(state): State<AppState>,
    path: StreamPath,
) -> Result<Response, ApiError> {
    let definition = state.broker.describe_hub(&path.stream)?;
    let groups: Vec<Value> = state
        .coordinator
        .list(Some(&definition.name))
        .iter()
        .map(group_json)
        .collect();
    Ok(Json(json!({ "groups": groups })).into_response())
}

async fn delete_group(
    State(state): State<AppState>,
    path: StreamPath,
) -> Result<Response, ApiError> {
    state
        .coordinator
        .delete(&path.stream, group_of(&path)?)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
