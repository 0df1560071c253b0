//! PutMessages and GetMessages.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, Uri, header};
use axum::response::{IntoResponse, Response};
use tributary_broker::throttle::{Admit, Cost, Direction};
use tributary_broker::{BrokerError, HubDefinition, SendReceipt, SendTarget};
use tributary_event::names::name_key;
use tributary_event::{EventData, PropertyValue, ReceivedEvent, partition_for_key};
use tributary_groups::Session;

use super::encode::{MessagesWriter, PutOutcome, put_result};
use super::model::PutMessagesDetails;
use super::{Query, StreamPath, decode_base64, parse_json};
use crate::cursor::{Cursor, PartitionCursor};
use crate::error::ApiError;
use crate::limits::{
    CURSOR_TTL_MS, GET_LIMIT_MAX, GET_RESPONSE_BYTES_MAX, KEY_BYTES_MAX, PUT_REQUEST_BYTES_MAX,
};
use crate::server::AppState;

/// The application property that carries a key that is not UTF-8 (a UTF-8 key is the event's
/// partition key).
pub(crate) const BINARY_KEY_PROPERTY: &str = "tributary.oci.key";

/// One decoded message of a PutMessages request.
pub(crate) struct Decoded {
    pub(crate) key: Option<Vec<u8>>,
    pub(crate) value: Vec<u8>,
}

/// One broker send: the messages of one key, or the keyless (or non-UTF-8-keyed) messages of
/// one partition, in request order.
struct Send {
    target: SendTarget,
    partition: u32,
    indices: Vec<usize>,
    events: Vec<EventData>,
    bytes: u64,
}

/// POST `/streams/{streamId}/messages`.
pub(crate) async fn put_messages(
    State(state): State<AppState>,
    path: StreamPath,
    body: Bytes,
) -> Result<Response, ApiError> {
    let details: PutMessagesDetails<'_> = parse_json(&body)?;
    let messages = decode_messages(&details)?;
    let hub = state.broker.describe_hub(&path.stream)?;
    let sends = route(&state, &hub, messages);
    throttle_puts(&state, &hub, &sends)?;
    throttle_ingress(&state, &hub.name, &sends)?;
    let count = details.messages.len();
    drop(details);
    let mut entries = vec![PutOutcome::Unanswered; count];
    let mut failures = 0u32;
    for (send, outcome) in run_sends(&state, &hub.name, sends).await {
        match outcome {
            Ok(receipt) => {
                state.metrics.put(
                    &hub.name,
                    receipt.partition,
                    send.indices.len() as u64,
                    send.bytes,
                );
                for (n, &i) in send.indices.iter().enumerate() {
                    entries[i] = success(&receipt, n);
                }
            }
            Err(e) => {
                let e = ApiError::from(e);
                for &i in &send.indices {
                    failures += 1;
                    entries[i] = PutOutcome::Failed {
                        code: e.code,
                        message: e.message.clone(),
                    };
                }
            }
        }
    }
    Ok(json_answer(put_result(failures, &entries)))
}

fn success(receipt: &SendReceipt, n: usize) -> PutOutcome {
    PutOutcome::Stored {
        partition: receipt.partition,
        offset: receipt.base_sequence + n as i64,
        time_ms: receipt.enqueued_time_ms,
    }
}

/// A 200 answer with a JSON body written by [`super::encode`].
fn json_answer(body: Vec<u8>) -> Response {
    let mut response = Body::from(body).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

pub(crate) fn decode_messages(details: &PutMessagesDetails<'_>) -> Result<Vec<Decoded>, ApiError> {
    if details.messages.is_empty() {
        return Err(ApiError::invalid(
            "messages must contain at least one message",
        ));
    }
    let mut total = 0u64;
    let mut out = Vec::with_capacity(details.messages.len());
    for (i, m) in details.messages.iter().enumerate() {
        let key = match &m.key {
            Some(k) => Some(decode_base64(k, || format!("messages[{i}].key"))?),
            None => None,
        };
        if let Some(k) = &key
            && k.len() > KEY_BYTES_MAX
        {
            return Err(ApiError::invalid(format!(
                "messages[{i}].key is {} bytes; a key has at most {KEY_BYTES_MAX}",
                k.len()
            )));
        }
        let value = decode_base64(&m.value, || format!("messages[{i}].value"))?;
        total += value.len() as u64 + key.as_ref().map_or(0, |k| k.len() as u64);
        out.push(Decoded { key, value });
    }
    if total > PUT_REQUEST_BYTES_MAX {
        return Err(ApiError::too_large(format!(
            "the messages total {total} bytes of keys and values after base64 decoding; a request (and a message) may carry at most {PUT_REQUEST_BYTES_MAX}"
        )));
    }
    Ok(out)
}

#[derive(Hash, PartialEq, Eq)]
enum SendKey {
    Key(String),
    Partition(u32),
}

fn route(state: &AppState, hub: &HubDefinition, messages: Vec<Decoded>) -> Vec<Send> {
    let mut sends: Vec<Send> = Vec::new();
    let mut index: HashMap<SendKey, usize> = HashMap::new();
    for (i, m) in messages.into_iter().enumerate() {
        let bytes = m.value.len() as u64 + m.key.as_ref().map_or(0, |k| k.len() as u64);
        let mut event = EventData::new(m.value);
        let (send_key, partition) = send_key(state, hub.partition_count, m.key, &mut event);
        let at = match index.get(&send_key) {
            Some(&at) => at,
            None => {
                let target = match &send_key {
                    SendKey::Key(key) => SendTarget::PartitionKey(key.clone()),
                    SendKey::Partition(p) => SendTarget::Partition(p.to_string()),
                };
                sends.push(Send {
                    target,
                    partition,
                    indices: Vec::new(),
                    events: Vec::new(),
                    bytes: 0,
                });
                index.insert(send_key, sends.len() - 1);
                sends.len() - 1
            }
        };
        sends[at].indices.push(i);
        sends[at].events.push(event);
        sends[at].bytes += bytes;
    }
    sends
}

/// Which send a message joins and its partition; stamps the key on the event.
fn send_key(
    state: &AppState,
    partition_count: u32,
    key: Option<Vec<u8>>,
    event: &mut EventData,
) -> (SendKey, u32) {
    match key.map(String::from_utf8) {
        Some(Ok(key)) => {
            let p = partition_for_key(&key, partition_count);
            event.partition_key = Some(key.clone());
            (SendKey::Key(key), p)
        }
        Some(Err(binary)) => {
            let p = partition_for_key(&String::from_utf8_lossy(binary.as_bytes()), partition_count);
            let key = PropertyValue::Bytes(binary.into_bytes().into());
            event.properties.push((BINARY_KEY_PROPERTY.into(), key));
            (SendKey::Partition(p), p)
        }
        None => {
            let n = state.round_robin.fetch_add(1, Ordering::Relaxed);
            let p =
                u32::try_from(n % u64::from(partition_count)).expect("below the partition count");
            (SendKey::Partition(p), p)
        }
    }
}

fn throttle_puts(state: &AppState, hub: &HubDefinition, sends: &[Send]) -> Result<(), ApiError> {
    let Some(buckets) = &state.put_limit else {
        return Ok(());
    };
    let mut per_partition: HashMap<String, u64> = HashMap::new();
    for s in sends {
        *per_partition
            .entry(format!("{}/{}", name_key(&hub.name), s.partition))
            .or_default() += s.bytes;
    }
    let keys: Vec<(&str, u64)> = per_partition
        .iter()
        .map(|(k, v)| (k.as_str(), *v))
        .collect();
    buckets.take_all(&keys, tokio::time::Instant::now()).map_err(|key| {
        ApiError::throttled(format!(
            "partition {key} is over its configured write rate; nothing was written, retry later"
        ))
    })
}

/// Charges a PutMessages request to the namespace's and the hub's ingress limits
/// ([`tributary_broker::throttle`]): over them, 429 with `Retry-After` and nothing written.
fn throttle_ingress(state: &AppState, hub: &str, sends: &[Send]) -> Result<(), ApiError> {
    let throttle = state.broker.throttle();
    if !throttle.limits_hub(hub, Direction::Ingress) {
        return Ok(());
    }
    let cost = Cost {
        events: sends.iter().map(|s| s.events.len() as u64).sum(),
        bytes: sends.iter().map(|s| s.bytes).sum(),
    };
    let now = tokio::time::Instant::now();
    throttle
        .admit(DOOR, hub, Direction::Ingress, cost, Admit::Now, now)
        .map(drop)
        .map_err(|t| {
            ApiError::throttled_for(
                format!(
                    "stream {hub:?} is over its ingress limit; nothing was written, retry later"
                ),
                t.retry_after,
            )
        })
}

/// Charges a GetMessages answer to the egress limits and waits until it is within them:
/// reads are slowed, never refused.
async fn pace_egress(state: &AppState, hub: &str, events: &[(u32, &ReceivedEvent)]) {
    let throttle = state.broker.throttle();
    if events.is_empty() || !throttle.limits_hub(hub, Direction::Egress) {
        return;
    }
    let cost = Cost {
        events: events.len() as u64,
        bytes: events.iter().map(|(_, e)| message_bytes(e)).sum(),
    };
    let now = tokio::time::Instant::now();
    if let Ok(wait) = throttle.admit(DOOR, hub, Direction::Egress, cost, Admit::Always, now) {
        tokio::time::sleep(wait).await;
    }
}

/// The door's name in the throttle's counters.
const DOOR: &str = "http";

/// Sends every batch at once (their syncs share a group commit); returns them in order.
async fn run_sends(
    state: &AppState,
    hub: &str,
    sends: Vec<Send>,
) -> Vec<(Send, Result<SendReceipt, BrokerError>)> {
    let mut tasks = tokio::task::JoinSet::new();
    let mut slots: Vec<Option<(Send, Result<SendReceipt, BrokerError>)>> = Vec::new();
    for (n, mut send) in sends.into_iter().enumerate() {
        let broker = state.broker.clone();
        let (hub, target, events) = (
            hub.to_owned(),
            send.target.clone(),
            std::mem::take(&mut send.events),
        );
        tasks.spawn(async move { (n, broker.send(&hub, target, events).await) });
        slots.push(Some((send, Err(BrokerError::ShuttingDown))));
    }
    while let Some(joined) = tasks.join_next().await {
        if let Ok((n, outcome)) = joined
            && let Some(slot) = slots[n].as_mut()
        {
            slot.1 = outcome;
        }
    }
    slots.into_iter().flatten().collect()
}

/// GET `/streams/{streamId}/messages?cursor=…&limit=…`.
pub(crate) async fn get_messages(
    State(state): State<AppState>,
    path: StreamPath,
    uri: Uri,
) -> Result<Response, ApiError> {
    let query = Query::parse(uri.query(), &["cursor", "limit"])?;
    let cursor = query.required("cursor")?;
    let limit = query.count("limit", GET_LIMIT_MAX, GET_LIMIT_MAX)?;
    let now_ms = state.broker.clock().now_ms();
    match decode_cursor(&state, &path.stream, cursor, now_ms)? {
        Cursor::Partition(c) => get_partition(&state, c, limit, now_ms).await,
        Cursor::Group(s) => get_group(&state, s, limit, now_ms).await,
    }
}

/// Decodes a cursor and checks it belongs to the stream in the path.
pub(crate) fn decode_cursor(
    state: &AppState,
    stream: &str,
    text: &str,
    now_ms: i64,
) -> Result<Cursor, ApiError> {
    let cursor = state
        .cursor_key
        .decode(text, now_ms)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let cursor_stream = match &cursor {
        Cursor::Partition(c) => &c.stream,
        Cursor::Group(s) => &s.stream,
    };
    if name_key(cursor_stream) != name_key(stream) {
        return Err(ApiError::invalid(format!(
            "the cursor belongs to stream {cursor_stream:?}, not {stream:?}"
        )));
    }
    Ok(cursor)
}

fn throttle_get(state: &AppState, key: &str) -> Result<(), ApiError> {
    let Some(buckets) = &state.get_limit else {
        return Ok(());
    };
    buckets
        .take_all(&[(key, 1)], tokio::time::Instant::now())
        .map_err(|key| {
            ApiError::throttled(format!(
                "too many GetMessages requests for {key}; retry later"
            ))
        })
}

async fn get_partition(
    state: &AppState,
    c: PartitionCursor,
    limit: u32,
    now_ms: i64,
) -> Result<Response, ApiError> {
    let hub = state.broker.describe_hub(&c.stream)?;
    if hub.created_at_ms != c.hub_created_ms {
        return Err(ApiError::invalid(format!(
            "stream {:?} was deleted and created again since this cursor was made; create a new cursor",
            hub.name
        )));
    }
    throttle_get(state, &format!("{}/{}", name_key(&hub.name), c.partition))?;
    let id = c.partition.to_string();
    let begin = state
        .broker
        .partition_properties(&hub.name, &id)?
        .begin_sequence_number;
    let mut from = c.offset.max(begin);
    let events =
        match state
            .broker
            .read(&hub.name, &id, from, limit as usize, GET_RESPONSE_BYTES_MAX)
        {
            Err(e) if e.is_caller_error() => {
                // Retention may have removed the position since we looked; continue at the oldest.
                from = state
                    .broker
                    .partition_properties(&hub.name, &id)?
                    .begin_sequence_number
                    .max(from);
                state
                    .broker
                    .read(&hub.name, &id, from, limit as usize, GET_RESPONSE_BYTES_MAX)?
            }
            other => other?,
        };
    let events = within_answer_bytes(events);
    let next = events.last().map_or(from, |e| e.sequence_number + 1);
    let answer: Vec<(u32, &ReceivedEvent)> = events.iter().map(|e| (c.partition, e)).collect();
    pace_egress(state, &hub.name, &answer).await;
    let body = encode_messages(state, &hub.name, answer.iter().copied());
    let next_cursor = Cursor::Partition(PartitionCursor { offset: next, ..c });
    Ok(with_next_cursor(state, body, &next_cursor, now_ms))
}

/// The leading events whose keys and values fit in [`GET_RESPONSE_BYTES_MAX`] (at least one):
/// the log reads whole batches, so a read can overshoot its byte budget by up to a batch.
fn within_answer_bytes(
    mut events: Vec<tributary_event::ReceivedEvent>,
) -> Vec<tributary_event::ReceivedEvent> {
    let mut total = 0u64;
    let fit = events
        .iter()
        .take_while(|e| {
            total += message_bytes(e);
            total <= GET_RESPONSE_BYTES_MAX
        })
        .count();
    events.truncate(fit.max(1));
    events
}

async fn get_group(
    state: &AppState,
    session: Session,
    limit: u32,
    now_ms: i64,
) -> Result<Response, ApiError> {
    let key = format!(
        "{}/{}/{}",
        name_key(&session.stream),
        name_key(&session.group),
        session.instance
    );
    throttle_get(state, &key)?;
    let batch = state
        .coordinator
        .get(&session, limit, GET_RESPONSE_BYTES_MAX)
        .await?;
    let answer: Vec<(u32, &ReceivedEvent)> = batch.events.iter().map(|(p, e)| (*p, e)).collect();
    pace_egress(state, &batch.stream, &answer).await;
    let body = encode_messages(state, &batch.stream, answer.iter().copied());
    Ok(with_next_cursor(
        state,
        body,
        &Cursor::Group(batch.session),
        now_ms,
    ))
}

fn with_next_cursor(state: &AppState, body: Vec<u8>, next: &Cursor, now_ms: i64) -> Response {
    let text = state.cursor_key.encode(next, now_ms + CURSOR_TTL_MS);
    let mut response = json_answer(body);
    response.headers_mut().insert(
        "opc-next-cursor",
        HeaderValue::from_str(&text).expect("base64url is a valid header value"),
    );
    response
}

/// The key a message was put with, as bytes.
fn key_of(e: &ReceivedEvent) -> Option<&[u8]> {
    match e.data.property(BINARY_KEY_PROPERTY) {
        Some(PropertyValue::Bytes(b)) => Some(b),
        _ => e.data.partition_key.as_ref().map(|k| k.as_bytes()),
    }
}

/// The bytes a message costs an answer: its key and value.
fn message_bytes(e: &ReceivedEvent) -> u64 {
    e.data.body.len() as u64 + key_of(e).map_or(0, |k| k.len() as u64)
}

/// A GetMessages answer (`[Message]`), counting what it carries in the metrics.
fn encode_messages<'a>(
    state: &AppState,
    stream: &str,
    events: impl Iterator<Item = (u32, &'a ReceivedEvent)> + Clone,
) -> Vec<u8> {
    let sizes = events.clone().map(|(_, e)| (message_bytes(e), 1));
    let (bytes, count) = sizes.fold((0, 0), |(b, n), (eb, en)| (b + eb, n + en));
    let mut writer = MessagesWriter::new(stream, count, bytes);
    // (partition, messages, bytes) per run of one partition: an answer reads partitions in turn.
    let mut counted: Vec<(u32, u64, u64)> = Vec::new();
    for (partition, e) in events {
        let key = key_of(e);
        writer.push(
            partition,
            key,
            &e.data.body,
            e.sequence_number,
            e.enqueued_time_ms,
        );
        let bytes = message_bytes(e);
        match counted.last_mut() {
            Some((p, n, b)) if *p == partition => {
                *n += 1;
                *b += bytes;
            }
            _ => counted.push((partition, 1, bytes)),
        }
    }
    for (partition, messages, bytes) in counted {
        state.metrics.got(stream, partition, messages, bytes);
    }
    writer.finish()
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    fn event(sequence_number: i64, value_bytes: usize, key: Option<&str>) -> ReceivedEvent {
        let mut data = EventData::new(vec![b'v'; value_bytes]);
        data.partition_key = key.map(str::to_owned);
        ReceivedEvent {
            sequence_number,
            offset: 0,
            enqueued_time_ms: 0,
            data,
        }
    }

    #[test]
    fn values_borrow_from_the_body_unless_escaped() {
        let body = br#"{"messages": [{"value": "aGk="}, {"key": "aw==", "value": "a\/8="}]}"#;
        let details: PutMessagesDetails<'_> = parse_json(body).unwrap();
        assert!(matches!(details.messages[0].value, Cow::Borrowed("aGk=")));
        assert!(matches!(&details.messages[1].value, Cow::Owned(v) if v == "a/8="));
        let decoded = decode_messages(&details).unwrap();
        assert_eq!(decoded[0].value, b"hi");
        assert_eq!(decoded[1].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(decoded[1].value, [0x6b, 0xff]);
    }

    #[test]
    fn an_answer_keeps_to_its_byte_budget() {
        let budget = GET_RESPONSE_BYTES_MAX as usize;
        let quarter = || (0..8).map(|s| event(s, budget / 4, None)).collect();
        assert_eq!(
            within_answer_bytes(quarter()).len(),
            4,
            "exactly the budget"
        );
        let keyed = (0..8).map(|s| event(s, budget / 4, Some("k"))).collect();
        assert_eq!(within_answer_bytes(keyed).len(), 3, "keys count too");
        let huge = vec![event(0, budget + 1, None), event(1, 1, None)];
        assert_eq!(within_answer_bytes(huge).len(), 1, "at least one message");
        assert!(within_answer_bytes(Vec::new()).is_empty());
    }
}
