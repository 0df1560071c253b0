//! A hub's capture as users give it — a `DEST` text, flags, or Azure's `captureDescription` JSON —
//! checked and turned into what the engine runs.
//!
//! The catalog keeps a hub's capture as [`HubCapture`] (plain settings; the broker does not
//! know the capture). [`check`] is the one place they are validated: every door (the CLI's
//! `hub create|update --capture…`, the admin API) checks a [`HubCapture`] here before it
//! reaches the broker, and the capture running in `serve` reads it back through it.
//!
//! `DEST` ([`DestinationSpec`]) is `file:` and an absolute directory. A relative path is
//! refused: the same command works on a data directory and through a running server, whose
//! working directory may differ, so only an absolute path means one place. `blob:` is refused
//! for now, saying Blob Storage destinations are not built yet.
//!
//! [`CaptureDescription`] is Azure's ARM `captureDescription` (`enabled`, `encoding`,
//! `intervalInSeconds`, `sizeLimitInBytes`, `skipEmptyArchives`, `destination: {name,
//! properties: {archiveNameFormat, blobContainer, storageAccountResourceId}}`). A directory is
//! the destination named [`DIRECTORY_DESTINATION_NAME`] with the Tributary property `directory`;
//! the notification hub is the Tributary field `notifyEventHub`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tributary_broker::HubCapture;

use crate::archive::{ArchiveNameFormat, DEFAULT_ARCHIVE_NAME_FORMAT};
use crate::config::{CaptureConfig, CaptureFormat};
use crate::destination::{Destination, DirectoryDestination};
use crate::error::CaptureError;
use crate::limits::{INTERVAL_DEFAULT, SIZE_BYTES_DEFAULT};

/// `destination.name` of a directory destination (Azure names its Blob one
/// `EventHubArchive.AzureBlockBlob`).
pub const DIRECTORY_DESTINATION_NAME: &str = "Tributary.Directory";
/// `destination.name` of Azure's Blob Storage destination.
pub const BLOB_DESTINATION_NAME: &str = "EventHubArchive.AzureBlockBlob";

/// Where a capture's files go, parsed from `DEST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestinationSpec {
    /// `file:/absolute/dir`: files below that directory.
    File(PathBuf),
}

impl DestinationSpec {
    /// Parses `DEST`: `file:` and an absolute path (`file:///abs` too).
    pub fn parse(text: &str) -> Result<DestinationSpec, CaptureError> {
        let invalid = |reason: String| CaptureError::InvalidConfig {
            setting: "capture",
            reason,
        };
        if let Some(path) = text.strip_prefix("file:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(invalid(format!(
                    "{text:?}: a directory destination is file: and an absolute path, e.g. file:/var/lib/capture"
                )));
            }
            return Ok(DestinationSpec::File(path));
        }
        if text.starts_with("blob:") || text.starts_with("https:") {
            return Err(invalid(format!(
                "{text:?}: Azure Blob Storage destinations are not built yet; use file:/absolute/dir"
            )));
        }
        Err(invalid(format!(
            "{text:?} is not a capture destination; use file:/absolute/dir"
        )))
    }

    /// The destination, opened (a directory is created if missing).
    pub fn open(&self) -> Result<Arc<dyn Destination>, CaptureError> {
        match self {
            DestinationSpec::File(dir) => Ok(Arc::new(DirectoryDestination::new(dir)?)),
        }
    }
}

impl std::fmt::Display for DestinationSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DestinationSpec::File(dir) => write!(f, "file:{}", dir.display()),
        }
    }
}

/// A hub's capture, checked: what the engine runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureSpec {
    /// Where the files go.
    pub destination: DestinationSpec,
    /// Windows, encoding, names.
    pub config: CaptureConfig,
    /// The hub the notifications go to.
    pub notify_hub: Option<String>,
}

/// Checks the capture `capture` of hub `hub`: every setting in Azure's ranges, a destination
/// that can be built, a name format Azure accepts, a notification hub other than `hub`.
pub fn check(hub: &str, capture: &HubCapture) -> Result<CaptureSpec, CaptureError> {
    let destination = DestinationSpec::parse(&capture.destination)?;
    let config = CaptureConfig {
        interval: Duration::from_secs(u64::from(capture.interval_secs)),
        size_bytes_max: capture.size_bytes_max,
        skip_empty: capture.skip_empty,
        format: CaptureFormat::parse(&capture.encoding)?,
        archive_name_format: ArchiveNameFormat::parse(&capture.archive_name_format)?,
    };
    config.validate()?;
    if let Some(notify) = &capture.notify_hub
        && notify.eq_ignore_ascii_case(hub)
    {
        return Err(CaptureError::InvalidConfig {
            setting: "capture-notify",
            reason: format!(
                "notifications of {hub:?} cannot go to {hub:?} itself: each would be captured into the next file"
            ),
        });
    }
    Ok(CaptureSpec {
        destination,
        config,
        notify_hub: capture.notify_hub.clone(),
    })
}

/// A capture to `destination` with Azure's defaults (300 s, 300 MiB, Avro, empty files
/// written, the default name format, no notification).
pub fn with_defaults(destination: &str) -> HubCapture {
    HubCapture {
        destination: destination.to_owned(),
        encoding: CaptureFormat::Avro.as_str().to_owned(),
        interval_secs: u32::try_from(INTERVAL_DEFAULT.as_secs()).expect("300 fits"),
        size_bytes_max: SIZE_BYTES_DEFAULT,
        skip_empty: false,
        archive_name_format: DEFAULT_ARCHIVE_NAME_FORMAT.to_owned(),
        notify_hub: None,
        enabled_at_ms: 0,
    }
}

/// Azure's ARM `captureDescription`, as the admin API shows and takes it. Every field is
/// optional when sent: what is missing keeps its value (or Azure's default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CaptureDescription {
    /// Whether the hub is captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `Avro` or `AvroDeflate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
    /// The time window, 60 to 900.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_in_seconds: Option<u32>,
    /// The size window, 10485760 to 524288000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_limit_in_bytes: Option<u64>,
    /// Whether windows without events write no file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_empty_archives: Option<bool>,
    /// Where the files go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<CaptureDestination>,
    /// Tributary: the hub each file's notification is appended to (`""` for none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify_event_hub: Option<String>,
}

/// Azure's `destination` of a `captureDescription`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CaptureDestination {
    /// [`DIRECTORY_DESTINATION_NAME`] (or Azure's [`BLOB_DESTINATION_NAME`], not built yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its properties.
    #[serde(default)]
    pub properties: DestinationProperties,
}

/// Azure's `destination.properties`, plus Tributary's `directory`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DestinationProperties {
    /// Azure's archive name format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive_name_format: Option<String>,
    /// Azure: the Blob container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blob_container: Option<String>,
    /// Azure: the storage account's resource id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_account_resource_id: Option<String>,
    /// Tributary: the absolute directory of a [`DIRECTORY_DESTINATION_NAME`] destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory: Option<String>,
}

impl CaptureDescription {
    /// How a hub's capture (or its absence) is shown.
    pub fn of(capture: Option<&HubCapture>) -> CaptureDescription {
        let Some(c) = capture else {
            return CaptureDescription {
                enabled: Some(false),
                ..CaptureDescription::default()
            };
        };
        let directory = match DestinationSpec::parse(&c.destination) {
            Ok(DestinationSpec::File(dir)) => Some(dir.display().to_string()),
            Err(_) => None,
        };
        CaptureDescription {
            enabled: Some(true),
            encoding: Some(c.encoding.clone()),
            interval_in_seconds: Some(c.interval_secs),
            size_limit_in_bytes: Some(c.size_bytes_max),
            skip_empty_archives: Some(c.skip_empty),
            destination: Some(CaptureDestination {
                name: Some(DIRECTORY_DESTINATION_NAME.to_owned()),
                properties: DestinationProperties {
                    archive_name_format: Some(c.archive_name_format.clone()),
                    directory,
                    ..DestinationProperties::default()
                },
            }),
            notify_event_hub: c.notify_hub.clone(),
        }
    }

    /// Hub `hub`'s capture once this description is applied over `current` (`None`: not
    /// captured), checked. `enabled: false` turns it off; any other setting turns it on or
    /// changes it (turning it on needs a destination); an empty description changes nothing.
    pub fn apply(
        &self,
        hub: &str,
        current: Option<&HubCapture>,
    ) -> Result<Option<HubCapture>, CaptureError> {
        if *self == CaptureDescription::default() {
            return Ok(current.cloned());
        }
        if self.enabled == Some(false) {
            return Ok(None);
        }
        let mut capture = match (current, self.destination_text()?) {
            (_, Some(destination)) => HubCapture {
                destination,
                ..current.cloned().unwrap_or_else(|| with_defaults(""))
            },
            (Some(current), None) => current.clone(),
            (None, None) => {
                return Err(CaptureError::InvalidConfig {
                    setting: "captureDescription.destination",
                    reason: format!(
                        "turning capture on needs a destination: {{\"name\": \"{DIRECTORY_DESTINATION_NAME}\", \"properties\": {{\"directory\": \"/absolute/dir\"}}}}"
                    ),
                });
            }
        };
        if let Some(encoding) = &self.encoding {
            capture.encoding = CaptureFormat::parse(encoding)?.as_str().to_owned();
        }
        if let Some(interval) = self.interval_in_seconds {
            capture.interval_secs = interval;
        }
        if let Some(size) = self.size_limit_in_bytes {
            capture.size_bytes_max = size;
        }
        if let Some(skip) = self.skip_empty_archives {
            capture.skip_empty = skip;
        }
        let format = self
            .destination
            .as_ref()
            .map(|d| &d.properties.archive_name_format);
        if let Some(Some(format)) = format {
            capture.archive_name_format.clone_from(format);
        }
        if let Some(notify) = &self.notify_event_hub {
            capture.notify_hub = Some(notify.clone()).filter(|n| !n.is_empty());
        }
        check(hub, &capture)?;
        Ok(Some(capture))
    }

    /// The `DEST` text the description's destination names, if it names one.
    fn destination_text(&self) -> Result<Option<String>, CaptureError> {
        let Some(destination) = &self.destination else {
            return Ok(None);
        };
        let p = &destination.properties;
        let name = destination.name.as_deref();
        let blob = p.blob_container.is_some() || p.storage_account_resource_id.is_some();
        if name.is_some_and(|n| n.eq_ignore_ascii_case(BLOB_DESTINATION_NAME)) || blob {
            return Err(CaptureError::InvalidConfig {
                setting: "captureDescription.destination",
                reason: "Azure Blob Storage destinations are not built yet; use the destination \
                         Tributary.Directory with properties.directory"
                    .to_owned(),
            });
        }
        if let Some(other) = name.filter(|n| !n.eq_ignore_ascii_case(DIRECTORY_DESTINATION_NAME)) {
            return Err(CaptureError::InvalidConfig {
                setting: "captureDescription.destination.name",
                reason: format!("{other:?} is not a destination; use {DIRECTORY_DESTINATION_NAME}"),
            });
        }
        Ok(p.directory.as_ref().map(|dir| format!("file:{dir}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_are_absolute_directories_and_blob_is_not_built_yet() {
        assert_eq!(
            DestinationSpec::parse("file:/var/c").unwrap(),
            DestinationSpec::File("/var/c".into())
        );
        assert_eq!(
            DestinationSpec::parse("file:///var/c").unwrap(),
            DestinationSpec::File("/var/c".into())
        );
        let relative = DestinationSpec::parse("file:c").unwrap_err().to_string();
        assert!(relative.contains("absolute"), "{relative}");
        let blob = DestinationSpec::parse("blob:https://a.blob.core.windows.net/c")
            .unwrap_err()
            .to_string();
        assert!(blob.contains("not built yet"), "{blob}");
        assert!(DestinationSpec::parse("/var/c").is_err());
    }

    #[test]
    fn settings_outside_azures_ranges_and_self_notification_are_refused() {
        let good = HubCapture {
            notify_hub: Some("files".into()),
            ..with_defaults("file:/c")
        };
        check("h", &good).unwrap();
        let short = HubCapture {
            interval_secs: 30,
            ..good.clone()
        };
        assert!(
            check("h", &short)
                .unwrap_err()
                .to_string()
                .contains("capture-interval")
        );
        let own = HubCapture {
            notify_hub: Some("H".into()),
            ..good.clone()
        };
        assert!(
            check("h", &own)
                .unwrap_err()
                .to_string()
                .contains("capture-notify")
        );
        let format = HubCapture {
            archive_name_format: "{Namespace}/{EventHub}".into(),
            ..good
        };
        assert!(check("h", &format).is_err());
    }

    #[test]
    fn the_description_round_trips_and_turns_capture_on_and_off() {
        let json = serde_json::json!({
            "enabled": true,
            "encoding": "AvroDeflate",
            "intervalInSeconds": 120,
            "sizeLimitInBytes": 10485760,
            "skipEmptyArchives": true,
            "destination": {"name": "Tributary.Directory", "properties": {"directory": "/c"}}
        });
        let description: CaptureDescription = serde_json::from_value(json).unwrap();
        let capture = description.apply("h", None).unwrap().unwrap();
        assert_eq!(capture.destination, "file:/c");
        assert_eq!(capture.encoding, "AvroDeflate");
        assert_eq!(capture.interval_secs, 120);
        assert!(capture.skip_empty);
        assert_eq!(capture.archive_name_format, DEFAULT_ARCHIVE_NAME_FORMAT);
        let shown = CaptureDescription::of(Some(&capture));
        assert_eq!(shown.apply("h", None).unwrap().unwrap(), capture);
        let off = CaptureDescription {
            enabled: Some(false),
            ..CaptureDescription::default()
        };
        assert_eq!(off.apply("h", Some(&capture)).unwrap(), None);
        let on = CaptureDescription {
            enabled: Some(true),
            ..CaptureDescription::default()
        };
        assert!(on.apply("h", None).is_err());
        let blob: CaptureDescription = serde_json::from_value(serde_json::json!({
            "destination": {"name": "EventHubArchive.AzureBlockBlob",
                "properties": {"blobContainer": "c", "storageAccountResourceId": "/s"}}
        }))
        .unwrap();
        let error = blob.apply("h", None).unwrap_err().to_string();
        assert!(error.contains("not built yet"), "{error}");
    }
}
