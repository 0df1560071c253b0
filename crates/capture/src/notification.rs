//! The notification of a written file, in Azure Event Grid's
//! `Microsoft.EventHub.CaptureFileCreated` shape.
//!
//! [`CaptureFileCreated`] is the event's `data`; [`CaptureFileCreated::event_grid_event`] wraps it
//! in Event Grid's envelope. Both serialise with serde to the JSON Event Grid delivers, so a
//! caller can append them to a hub as events. For an empty file the counts are 0, the sequence
//! numbers -1 and the times .NET's `DateTime.MinValue`, as in Azure's own sample.

use serde::{Deserialize, Serialize};

use crate::time_text::{NO_ENQUEUE_TIME, iso_millis};

/// Event Grid's event type of a capture notification.
pub const CAPTURE_FILE_CREATED: &str = "Microsoft.EventHub.CaptureFileCreated";

/// The `data` of a `Microsoft.EventHub.CaptureFileCreated` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CaptureFileCreated {
    /// Where the file is (`file://…` for a directory destination).
    pub file_url: String,
    /// The kind of file (`AzureBlockBlob` on Azure; `File` for a directory).
    pub file_type: String,
    /// The partition id.
    pub partition_id: String,
    /// The file's size.
    pub size_in_bytes: u64,
    /// How many events it holds.
    pub event_count: u64,
    /// The first event's sequence number; -1 for an empty file.
    pub first_sequence_number: i64,
    /// The last event's sequence number; -1 for an empty file.
    pub last_sequence_number: i64,
    /// The first event's enqueued time (ISO 8601, ms, `Z`).
    pub first_enqueue_time: String,
    /// The last event's enqueued time.
    pub last_enqueue_time: String,
}

/// An Event Grid event (its envelope) carrying a [`CaptureFileCreated`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventGridEvent {
    /// The source: the namespace.
    pub topic: String,
    /// `eventhubs/<hub>`.
    pub subject: String,
    /// [`CAPTURE_FILE_CREATED`].
    pub event_type: String,
    /// When the file was created (ISO 8601).
    pub event_time: String,
    /// Unique per file: the file's URL.
    pub id: String,
    /// The notification.
    pub data: CaptureFileCreated,
    /// Empty, as Azure sends it.
    pub data_version: String,
    /// `1`.
    pub metadata_version: String,
}

/// The first and last event of a window: (sequence number, enqueued time ms).
pub(crate) type Bounds = Option<((i64, i64), (i64, i64))>;

impl CaptureFileCreated {
    pub(crate) fn new(
        file_url: String,
        file_type: &str,
        partition_id: &str,
        size_in_bytes: u64,
        event_count: u64,
        bounds: Bounds,
    ) -> CaptureFileCreated {
        let ((first_sequence, first_ms), (last_sequence, last_ms)) =
            bounds.unwrap_or(((-1, i64::MIN), (-1, i64::MIN)));
        let time = |sequence: i64, ms: i64| {
            if sequence < 0 {
                NO_ENQUEUE_TIME.to_owned()
            } else {
                iso_millis(ms)
            }
        };
        CaptureFileCreated {
            file_url,
            file_type: file_type.to_owned(),
            partition_id: partition_id.to_owned(),
            size_in_bytes,
            event_count,
            first_sequence_number: first_sequence,
            last_sequence_number: last_sequence,
            first_enqueue_time: time(first_sequence, first_ms),
            last_enqueue_time: time(last_sequence, last_ms),
        }
    }

    /// This notification in Event Grid's envelope, from `namespace`'s event hub `hub`, sent at
    /// `now_ms`.
    pub fn event_grid_event(&self, namespace: &str, hub: &str, now_ms: i64) -> EventGridEvent {
        EventGridEvent {
            topic: namespace.to_owned(),
            subject: format!("eventhubs/{hub}"),
            event_type: CAPTURE_FILE_CREATED.to_owned(),
            event_time: iso_millis(now_ms),
            id: self.file_url.clone(),
            data: self.clone(),
            data_version: String::new(),
            metadata_version: "1".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_serialises_with_event_grids_field_names() {
        let data = CaptureFileCreated::new(
            "file:///c/ns/h/1/2017/08/31/19/11/45.avro".into(),
            "File",
            "1",
            249_168,
            1500,
            Some(((2400, 1_504_206_734_674), (3899, 1_504_206_764_309))),
        );
        let json = serde_json::to_value(&data).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "fileUrl": "file:///c/ns/h/1/2017/08/31/19/11/45.avro",
                "fileType": "File",
                "partitionId": "1",
                "sizeInBytes": 249168,
                "eventCount": 1500,
                "firstSequenceNumber": 2400,
                "lastSequenceNumber": 3899,
                "firstEnqueueTime": "2017-08-31T19:12:14.674Z",
                "lastEnqueueTime": "2017-08-31T19:12:44.309Z"
            })
        );
        let event = serde_json::to_value(data.event_grid_event("ns", "h", 0)).unwrap();
        assert_eq!(event["eventType"], CAPTURE_FILE_CREATED);
        assert_eq!(event["subject"], "eventhubs/h");
        assert_eq!(event["data"]["eventCount"], 1500);
    }

    #[test]
    fn an_empty_file_is_notified_as_azure_does() {
        let data = CaptureFileCreated::new("u".into(), "File", "0", 0, 0, None);
        assert_eq!(data.first_sequence_number, -1);
        assert_eq!(data.last_sequence_number, -1);
        assert_eq!(data.first_enqueue_time, "0001-01-01T00:00:00");
    }
}
