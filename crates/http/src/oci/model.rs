//! The JSON shapes of the OCI Streaming API (wire names from the SDK models' `attribute_map`).
//! Requests deny unknown fields; optional fields the SDK omits when unset are `Option`s.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// `PutMessagesDetails`. Values borrow from the request body unless JSON escapes force a copy
/// (base64 needs none, though some encoders write `/` as `\/`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PutMessagesDetails<'a> {
    #[serde(borrow)]
    pub messages: Vec<PutMessagesDetailsEntry<'a>>,
}

/// `PutMessagesDetailsEntry`: base64 key (optional) and value.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PutMessagesDetailsEntry<'a> {
    #[serde(default, borrow)]
    pub key: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub value: Cow<'a, str>,
}

/// `PutMessagesResult`, as `super::encode` writes it (the tests compare).
#[cfg(test)]
#[derive(Debug, Serialize)]
pub(crate) struct PutMessagesResult {
    pub failures: u32,
    pub entries: Vec<PutMessagesResultEntry>,
}

/// `PutMessagesResultEntry`: where a message went, or why it did not.
#[cfg(test)]
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PutMessagesResultEntry {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
}

/// `Message`, as `super::encode` writes it (the tests compare).
#[cfg(test)]
#[derive(Debug, Serialize)]
pub(crate) struct Message {
    pub stream: String,
    pub partition: String,
    pub key: Option<String>,
    pub value: String,
    pub offset: i64,
    pub timestamp: String,
}

/// `CreateCursorDetails`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateCursorDetails {
    pub partition: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub offset: Option<i64>,
    #[serde(default)]
    pub time: Option<String>,
}

/// `CreateGroupCursorDetails`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct CreateGroupCursorDetails {
    #[serde(rename = "type")]
    pub kind: String,
    pub group_name: String,
    #[serde(default)]
    pub instance_name: Option<String>,
    #[serde(default)]
    pub time: Option<String>,
    #[serde(default)]
    pub commit_on_get: Option<bool>,
    #[serde(default)]
    pub timeout_in_ms: Option<i64>,
}

/// `UpdateGroupDetails`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateGroupDetails {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub time: Option<String>,
}

/// `Cursor`.
#[derive(Debug, Serialize)]
pub(crate) struct CursorBody {
    pub value: String,
}

/// `Group`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Group {
    pub stream_id: String,
    pub group_name: String,
    pub reservations: Vec<PartitionReservation>,
}

/// `PartitionReservation`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PartitionReservation {
    pub partition: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub committed_offset: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_instance: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_reserved_until: Option<String>,
}
