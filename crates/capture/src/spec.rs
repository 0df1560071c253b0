//! A hub's capture as users give it — a `DEST` text, flags, or Azure's `captureDescription` JSON —
//! checked and turned into what the engine runs.
//!
//! The catalog keeps a hub's capture as [`HubCapture`] (plain settings; the broker does not
//! know the capture). [`check`] is the one place they are validated: every door (the CLI's
//! `hub create|update --capture…`, the admin API) checks a [`HubCapture`] here before it
//! reaches the broker, and the capture running in `serve` reads it back through it.
//!
//! `DEST` ([`DestinationSpec`]) is `file:` and an absolute directory, or `blob:` and an Azure
//! Storage container's URL. A relative path is refused: the same command works on a data
//! directory and through a running server, whose working directory may differ, so only an
//! absolute path means one place. A container URL carries no credential (a SAS in it is
//! refused): the catalog and the admin API would keep and show it. The storage account's
//! connection string is given to `serve` instead ([`DestinationSpec::open`] takes it).
//!
//! [`CaptureDescription`] is Azure's ARM `captureDescription` (`enabled`, `encoding`,
//! `intervalInSeconds`, `sizeLimitInBytes`, `skipEmptyArchives`, `destination: {name,
//! properties: {archiveNameFormat, blobContainer, storageAccountResourceId}}`). A directory is
//! the destination named [`DIRECTORY_DESTINATION_NAME`] with the Tributary property `directory`;
//! a container is Azure's [`BLOB_DESTINATION_NAME`] with `blobContainer` and the Tributary
//! property `containerUrl` (there is no Azure Resource Manager here to resolve
//! `storageAccountResourceId`); the notification hub is the Tributary field `notifyEventHub`.

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
    /// `blob:https://ACCOUNT.blob.core.windows.net/CONTAINER` (or Azurite's path-style URL):
    /// block blobs in that container.
    Blob {
        /// The container's URL, without a query.
        container_url: String,
    },
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
        if let Some(url) = text.strip_prefix("blob:") {
            let http = url.starts_with("https://") || url.starts_with("http://");
            let path = url.split_once("://").map_or("", |(_, rest)| rest);
            if !http || !path.trim_end_matches('/').contains('/') {
                return Err(invalid(format!(
                    "{text:?}: a Blob Storage destination is blob: and a container's URL, e.g. blob:https://ACCOUNT.blob.core.windows.net/CONTAINER"
                )));
            }
            if url.contains('?') {
                return Err(invalid(format!(
                    "{:?}: a credential in the destination would be kept in the hub's catalog and shown by the admin API; give the container's URL alone, and serve the storage account's connection string (--capture-storage)",
                    url.split('?').next().unwrap_or_default()
                )));
            }
            return Ok(DestinationSpec::Blob {
                container_url: url.trim_end_matches('/').to_owned(),
            });
        }
        Err(invalid(format!(
            "{text:?} is not a capture destination; use file:/absolute/dir or blob:CONTAINER_URL"
        )))
    }

    /// The destination, opened (a directory is created if missing; a container must exist),
    /// a container with `storage`, its account's connection string.
    pub fn open(&self, storage: Option<&str>) -> Result<Arc<dyn Destination>, CaptureError> {
        match self {
            DestinationSpec::File(dir) => Ok(Arc::new(DirectoryDestination::new(dir)?)),
            DestinationSpec::Blob { .. } => self.open_blob(storage),
        }
    }

    #[cfg(feature = "blob")]
    fn open_blob(&self, storage: Option<&str>) -> Result<Arc<dyn Destination>, CaptureError> {
        if storage.is_none() {
            return Err(CaptureError::InvalidConfig {
                setting: "capture-storage",
                reason: format!(
                    "{self}: capturing to Blob Storage needs the storage account's connection string (serve --capture-storage, or TRIBUTARY_CAPTURE_STORAGE)"
                ),
            });
        }
        Ok(Arc::new(crate::blob::BlobDestination::open(
            &self.to_string(),
            storage,
        )?))
    }

    #[cfg(not(feature = "blob"))]
    fn open_blob(&self, _storage: Option<&str>) -> Result<Arc<dyn Destination>, CaptureError> {
        Err(CaptureError::InvalidConfig {
            setting: "capture",
            reason: format!("{self}: this build has no Blob Storage destination (feature blob)"),
        })
    }
}

impl DestinationSpec {
    /// How `captureDescription.destination` shows it (the archive name format aside).
    pub fn described(&self) -> CaptureDestination {
        match self {
            DestinationSpec::File(dir) => CaptureDestination {
                name: Some(DIRECTORY_DESTINATION_NAME.to_owned()),
                properties: DestinationProperties {
                    directory: Some(dir.display().to_string()),
                    ..DestinationProperties::default()
                },
            },
            DestinationSpec::Blob { container_url } => CaptureDestination {
                name: Some(BLOB_DESTINATION_NAME.to_owned()),
                properties: DestinationProperties {
                    blob_container: container_url.rsplit('/').next().map(str::to_owned),
                    container_url: Some(container_url.clone()),
                    ..DestinationProperties::default()
                },
            },
        }
    }
}

impl std::fmt::Display for DestinationSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DestinationSpec::File(dir) => write!(f, "file:{}", dir.display()),
            DestinationSpec::Blob { container_url } => write!(f, "blob:{container_url}"),
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
    /// [`DIRECTORY_DESTINATION_NAME`] or Azure's [`BLOB_DESTINATION_NAME`].
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
    /// Tributary: the container's URL of a [`BLOB_DESTINATION_NAME`] destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_url: Option<String>,
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
        let mut destination = DestinationSpec::parse(&c.destination)
            .ok()
            .map_or_else(CaptureDestination::default, |d| d.described());
        destination.properties.archive_name_format = Some(c.archive_name_format.clone());
        CaptureDescription {
            enabled: Some(true),
            encoding: Some(c.encoding.clone()),
            interval_in_seconds: Some(c.interval_secs),
            size_limit_in_bytes: Some(c.size_bytes_max),
            skip_empty_archives: Some(c.skip_empty),
            destination: Some(destination),
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
        let blob = p.blob_container.is_some()
            || p.storage_account_resource_id.is_some()
            || p.container_url.is_some();
        if name.is_some_and(|n| n.eq_ignore_ascii_case(BLOB_DESTINATION_NAME)) || blob {
            let Some(url) = &p.container_url else {
                return Err(CaptureError::InvalidConfig {
                    setting: "captureDescription.destination.properties.containerUrl",
                    reason: format!(
                        "a {BLOB_DESTINATION_NAME} destination names its container by URL here (there is no Azure Resource Manager to resolve storageAccountResourceId): \"containerUrl\": \"https://ACCOUNT.blob.core.windows.net/CONTAINER\""
                    ),
                });
            };
            let spec = DestinationSpec::parse(&format!("blob:{url}"))?;
            return Ok(Some(spec.to_string()));
        }
        if let Some(other) = name.filter(|n| !n.eq_ignore_ascii_case(DIRECTORY_DESTINATION_NAME)) {
            return Err(CaptureError::InvalidConfig {
                setting: "captureDescription.destination.name",
                reason: format!(
                    "{other:?} is not a destination; use {DIRECTORY_DESTINATION_NAME} or {BLOB_DESTINATION_NAME}"
                ),
            });
        }
        Ok(p.directory.as_ref().map(|dir| format!("file:{dir}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_are_absolute_directories_or_container_urls_without_a_credential() {
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
        let blob = DestinationSpec::parse("blob:https://a.blob.core.windows.net/c/").unwrap();
        assert_eq!(
            blob,
            DestinationSpec::Blob {
                container_url: "https://a.blob.core.windows.net/c".into()
            }
        );
        assert_eq!(blob.to_string(), "blob:https://a.blob.core.windows.net/c");
        let sas = DestinationSpec::parse("blob:https://a.blob.core.windows.net/c?sv=1&sig=SECRET")
            .unwrap_err()
            .to_string();
        assert!(sas.contains("--capture-storage"), "{sas}");
        assert!(!sas.contains("SECRET"), "{sas}");
        for bad in [
            "blob:a.blob.core.windows.net/c",
            "blob:https://a.blob.core.windows.net",
            "/var/c",
        ] {
            assert!(DestinationSpec::parse(bad).is_err(), "{bad}");
        }
        let unopened = blob.open(None).err().unwrap().to_string();
        assert!(unopened.contains("--capture-storage"), "{unopened}");
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
        let azure_only: CaptureDescription = serde_json::from_value(serde_json::json!({
            "destination": {"name": "EventHubArchive.AzureBlockBlob",
                "properties": {"blobContainer": "c", "storageAccountResourceId": "/s"}}
        }))
        .unwrap();
        let error = azure_only.apply("h", None).unwrap_err().to_string();
        assert!(error.contains("containerUrl"), "{error}");
        let blob: CaptureDescription = serde_json::from_value(serde_json::json!({
            "destination": {"name": "EventHubArchive.AzureBlockBlob",
                "properties": {"containerUrl": "http://127.0.0.1:10000/devstoreaccount1/c"}}
        }))
        .unwrap();
        let capture = blob.apply("h", None).unwrap().unwrap();
        assert_eq!(
            capture.destination,
            "blob:http://127.0.0.1:10000/devstoreaccount1/c"
        );
        let shown = CaptureDescription::of(Some(&capture));
        let properties = &shown.destination.as_ref().unwrap().properties;
        assert_eq!(properties.blob_container.as_deref(), Some("c"));
        assert_eq!(shown.apply("h", None).unwrap().unwrap(), capture);
    }
}
