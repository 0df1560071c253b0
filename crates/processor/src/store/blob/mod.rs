//! A checkpoint store in an Azure Storage blob container, in exactly the layout the official
//! Event Hubs processors use, so Tributary hosts and .NET, Python and JavaScript
//! `EventProcessorClient`s can balance one consumer group together.
//!
//! # The layout (shared with the official SDKs)
//!
//! - Ownership: a zero-length block blob `{namespace}/{hub}/{group}/ownership/{partition}`,
//!   metadata `ownerid` (`""` once relinquished). Checkpoint: a zero-length block blob
//!   `{namespace}/{hub}/{group}/checkpoint/{partition}`, metadata `offset` and
//!   `sequencenumber` as decimal strings. Names are lower-cased whole, as Python does.
//! - A first claim is a Put Blob with `If-None-Match: *`; every later claim (renewal, steal,
//!   release) is a Set Blob Metadata with `If-Match: <etag>`. A 412 or 409 (or a 404 for a
//!   blob that vanished) means another claimant won: the claim is left out of the result, as
//!   the trait requires. The ETag is the record's etag; the server's `Last-Modified` is its
//!   modification time.
//! - Listing is List Blobs by prefix with `include=metadata`, following `NextMarker`.
//! - Reads take what other SDKs write: extra keys (.NET's client identifier), an empty or
//!   non-numeric `offset` (read as no offset), missing keys. A checkpoint with neither a usable
//!   offset nor a sequence number is skipped, as .NET does. We write `offset` and
//!   `sequencenumber` whenever the checkpoint has them, never as empty strings (the host's
//!   checkpoints always have both; a sequence-only checkpoint written through the trait has no
//!   `offset` key, which the JavaScript processor refuses to read).
//!
//! # Ownership versions on a layout that has none
//!
//! The trait's [`Ownership::version`] must grow with every claim and never go back: the host
//! opens its receiver with it as the epoch, and judges a record alive by watching it change.
//! The official SDKs know nothing of versions, and each of their claims replaces all of the
//! blob's metadata. So:
//!
//! - **Our claims carry the version** in one extra metadata key, `tributaryversion`, written
//!   atomically with `ownerid` by the same conditional request. The SDKs ignore the key.
//! - **A record without the key was last claimed by an official SDK.** Its version is the
//!   server's `Last-Modified` in milliseconds: a foreign claim carries no number, so the time
//!   it happened stands in for one. Our versions start at 1 and grow by one a claim (after a
//!   foreign record, from its time), so as long as a partition sees at most one claim per
//!   millisecond they stay below the server's clock, and a Tributary claim over a foreign
//!   record (version `t + 1`) outranks every epoch a Tributary host used before that foreign
//!   claim.
//! - **The ETag is the change signal.** Each store remembers the last (etag, version) it
//!   reported per partition; a record whose ETag changed is never reported with a version at
//!   or below the remembered one. So an SDK's renewals (same owner, new ETag, no key) move the
//!   version we report even within one second of `Last-Modified`, and other hosts see that
//!   owner as alive.
//!
//! The official SDKs open their receivers with owner level 0, so any Tributary claim fences
//! them at the hub; a Tributary host that loses a partition to an SDK is fenced by the SDK's
//! claim in the store (its checkpoints are refused) and stops its pump at the next balancing
//! round.
//!
//! # Limits
//!
//! - A fenced checkpoint reads the ownership blob and then writes the checkpoint blob: two
//!   requests, not one transaction (blob storage has none across blobs). A claim landing
//!   between them lets the former owner's checkpoint through once; the hub's epoch fence
//!   still keeps it from reading further.
//! - Two Tributary hosts can report different versions for a record last claimed by an SDK
//!   (each counts the ETag changes it saw); each host's own view never goes back, and what a
//!   Tributary claim writes is always above the foreign record's `Last-Modified`.
//! - Claims in one call run one after another (one or two requests each).
//!
//! Authentication is a Shared Key (requests signed as Azure Storage documents) or a SAS token
//! ([`BlobCredential`]); neither ever appears in logs or errors.

mod auth;
mod http;
mod listing;
mod records;
mod requests;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

pub use auth::{BlobCredential, ConnectionString};

use super::{
    Checkpoint, CheckpointStore, Ownership, OwnershipFence, ScopeKey, StoreError,
    validate_checkpoint, validate_claim,
};
use http::{Http, Response};
use listing::ListedBlob;

/// The storage service version the store speaks (List Blobs with metadata, conditional Put Blob
/// and Set Blob Metadata have not changed since).
const SERVICE_VERSION: &str = "2020-10-02";

/// Our metadata key for the ownership version; the official SDKs ignore and drop it.
pub const VERSION_KEY: &str = "tributaryversion";

/// Blob path characters sent as they are; everything else is percent-encoded (as the Python
/// SDK does: `$default` travels as `%24default`).
const PATH: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');
/// Query values: only the unreserved characters are sent as they are.
const QUERY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// What the store last reported for one partition's ownership record.
#[derive(Debug, Clone)]
struct Seen {
    etag: String,
    version: i64,
}

/// A [`CheckpointStore`] in an Azure Storage (or Azurite) blob container.
pub struct BlobCheckpointStore {
    http: Http,
    /// `/{container}`, or `/{account}/{container}` for a path-style endpoint (Azurite).
    container_path: String,
    credential: BlobCredential,
    seen: Mutex<HashMap<(ScopeKey, String), Seen>>,
}

impl std::fmt::Debug for BlobCheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlobCheckpointStore")
            .field("container", &self.container_url())
            .field("credential", &self.credential)
            .finish_non_exhaustive()
    }
}

fn invalid(reason: impl Into<String>) -> StoreError {
    StoreError::Invalid {
        what: "blob container URL",
        reason: reason.into(),
    }
}

fn backend(operation: &'static str, description: impl Into<String>) -> StoreError {
    StoreError::Backend {
        operation,
        description: description.into(),
    }
}

/// The outcome of a write: done (new etag and time), or lost to another writer.
enum Write {
    Done { etag: String, last_modified_ms: i64 },
    Conflict,
    NotFound,
}

impl BlobCheckpointStore {
    /// Opens the container at `url` (`https://{account}.blob.core.windows.net/{container}`, or
    /// path-style `http://127.0.0.1:10000/{account}/{container}` for Azurite), creating it if
    /// absent. The credential is a SAS in the URL's query (`?sv=…&sig=…`) or `credential`
    /// (a Shared Key for the URL's account); exactly one of the two.
    pub async fn from_url(
        url: &str,
        credential: Option<BlobCredential>,
    ) -> Result<Self, StoreError> {
        let parsed = url::Url::parse(url).map_err(|e| invalid(format!("not a URL: {e}")))?;
        let tls = match parsed.scheme() {
            "https" => true,
            "http" => false,
            other => return Err(invalid(format!("the scheme is {other}, not http or https"))),
        };
        let host = parsed
            .host_str()
            .ok_or_else(|| invalid("the URL has no host"))?
            .to_owned();
        let port = parsed.port_or_known_default().unwrap_or(443);
        let (account, container, path_style) = account_and_container(&parsed)?;
        validate_container(&container)?;
        let credential = pick_credential(parsed.query(), credential, &account)?;
        let container_path = if path_style {
            format!("/{account}/{container}")
        } else {
            format!("/{container}")
        };
        let store = BlobCheckpointStore {
            http: Http::new(tls, host, port),
            container_path,
            credential,
            seen: Mutex::new(HashMap::new()),
        };
        store.ensure_container().await?;
        Ok(store)
    }

    /// [`from_url`](Self::from_url) with the credential from the environment when the URL has
    /// no SAS: `AZURE_STORAGE_CONNECTION_STRING` (its key), else `AZURE_STORAGE_KEY` (the key
    /// of the URL's account). For a command line's `--store https://…`.
    pub async fn from_url_and_environment(url: &str) -> Result<Self, StoreError> {
        let credential = credential_from_environment(
            url,
            std::env::var("AZURE_STORAGE_CONNECTION_STRING").ok(),
            std::env::var("AZURE_STORAGE_KEY").ok(),
        )?;
        BlobCheckpointStore::from_url(url, credential).await
    }

    /// Opens `container` at the endpoint and with the credential a storage connection string
    /// gives, creating the container if absent.
    pub async fn from_connection_string(
        connection_string: &str,
        container: &str,
    ) -> Result<Self, StoreError> {
        let parsed = BlobCredential::from_connection_string(connection_string)?;
        let url = format!("{}/{container}", parsed.blob_endpoint);
        BlobCheckpointStore::from_url(&url, Some(parsed.credential)).await
    }

    /// How many requests this store has sent to the service (retries included): what the
    /// store costs, for benchmarks and metrics.
    pub fn requests_sent(&self) -> u64 {
        self.http.requests_sent()
    }

    /// The container's URL, without any SAS token.
    pub fn container_url(&self) -> String {
        let scheme = if self.http.is_tls() { "https" } else { "http" };
        format!(
            "{scheme}://{}{}",
            self.http.authority(),
            self.container_path
        )
    }

    async fn ensure_container(&self) -> Result<(), StoreError> {
        let created = self
            .send("PUT", None, &[("restype", "container")], Vec::new())
            .await
            .map_err(|e| backend("creating the container", e))?;
        match created.status {
            201 | 409 => Ok(()),
            // A SAS scoped to the container may not create one; it may still use it.
            _ => match self.list_page("", None).await {
                Ok(_) => Ok(()),
                Err(_) => Err(backend(
                    "creating the container",
                    describe_failure(&created),
                )),
            },
        }
    }
}

/// The credential for `url` from the environment's values: none when the URL carries a SAS.
fn credential_from_environment(
    url: &str,
    connection_string: Option<String>,
    key: Option<String>,
) -> Result<Option<BlobCredential>, StoreError> {
    let parsed = url::Url::parse(url).map_err(|e| invalid(format!("not a URL: {e}")))?;
    if parsed.query().is_some_and(|q| !q.is_empty()) {
        return Ok(None);
    }
    if let Some(text) = connection_string.filter(|c| !c.trim().is_empty()) {
        return Ok(Some(
            BlobCredential::from_connection_string(&text)?.credential,
        ));
    }
    let Some(key) = key.filter(|k| !k.trim().is_empty()) else {
        return Ok(None);
    };
    let (account, _, _) = account_and_container(&parsed)?;
    BlobCredential::shared_key(&account, &key).map(Some)
}

/// The account and container a container URL names, and whether it is path-style
/// (`/{account}/{container}`, as Azurite serves) rather than `{account}.blob…/{container}`.
fn account_and_container(url: &url::Url) -> Result<(String, String, bool), StoreError> {
    let segments: Vec<&str> = url
        .path_segments()
        .map(|s| s.filter(|s| !s.is_empty()).collect())
        .unwrap_or_default();
    match segments.as_slice() {
        [container] => {
            let host = url.host_str().unwrap_or_default();
            let account = host.split('.').next().unwrap_or_default();
            Ok((account.to_owned(), (*container).to_owned(), false))
        }
        [account, container] => Ok(((*account).to_owned(), (*container).to_owned(), true)),
        _ => Err(invalid(
            "the path must be /{container} or /{account}/{container}",
        )),
    }
}

fn validate_container(container: &str) -> Result<(), StoreError> {
    let valid_chars = container
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !(3..=63).contains(&container.len()) || !valid_chars {
        return Err(invalid(format!(
            "container name {container:?}: 3 to 63 lower-case letters, digits and hyphens"
        )));
    }
    Ok(())
}

fn pick_credential(
    sas: Option<&str>,
    credential: Option<BlobCredential>,
    account: &str,
) -> Result<BlobCredential, StoreError> {
    match (sas.filter(|q| !q.is_empty()), credential) {
        (Some(_), Some(_)) => Err(invalid(
            "the URL carries a SAS token and a credential was given too: use one",
        )),
        (Some(sas), None) => Ok(BlobCredential::Sas(sas.to_owned())),
        (
            None,
            Some(BlobCredential::SharedKey {
                account: key_account,
                ..
            }),
        ) if key_account != account => Err(invalid(format!(
            "the shared key is for account {key_account}, the URL names account {account}"
        ))),
        (None, Some(credential)) => Ok(credential),
        (None, None) => Err(invalid(
            "no credential: add a SAS token to the URL (?sv=…) or give the account key \
             (AZURE_STORAGE_KEY or a connection string)",
        )),
    }
}

fn describe_failure(response: &Response) -> String {
    let code = response
        .header("x-ms-error-code")
        .unwrap_or("no error code");
    format!("the service answered {} ({code})", response.status)
}

fn now_http_date() -> String {
    httpdate::fmt_http_date(SystemTime::now())
}

fn parse_time_ms(text: &str) -> i64 {
    httpdate::parse_http_date(text)
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .unwrap_or(0)
}

fn unquote(etag: &str) -> String {
    etag.trim_matches('"').to_owned()
}

/// Metadata values travel as header values: printable ASCII only.
fn validate_value(what: &'static str, value: &str) -> Result<(), StoreError> {
    if value.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        Ok(())
    } else {
        Err(StoreError::Invalid {
            what,
            reason: format!("{value:?} is not printable ASCII, which blob metadata requires"),
        })
    }
}

fn blob_name(scope: &ScopeKey, kind: &str, partition_id: &str) -> String {
    format!(
        "{}/{}/{}/{kind}/{}",
        scope.namespace,
        scope.hub,
        scope.consumer_group,
        partition_id.to_lowercase()
    )
}

fn prefix(scope: &ScopeKey, kind: &str) -> String {
    format!(
        "{}/{}/{}/{kind}/",
        scope.namespace, scope.hub, scope.consumer_group
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_gives_the_credential_unless_the_url_has_a_sas() {
        let url = "https://acct.blob.core.windows.net/checkpoints";
        let key = Some("a2V5".to_owned());
        let from_key = credential_from_environment(url, None, key.clone()).unwrap();
        assert!(matches!(
            from_key,
            Some(BlobCredential::SharedKey { ref account, .. }) if account == "acct"
        ));
        let azurite = "http://127.0.0.1:10000/devstoreaccount1/checkpoints";
        let path_style = credential_from_environment(azurite, None, key.clone()).unwrap();
        assert!(matches!(
            path_style,
            Some(BlobCredential::SharedKey { ref account, .. }) if account == "devstoreaccount1"
        ));
        let conn = Some("AccountName=other;AccountKey=a2V5".to_owned());
        let from_conn = credential_from_environment(url, conn, key.clone()).unwrap();
        assert!(matches!(
            from_conn,
            Some(BlobCredential::SharedKey { ref account, .. }) if account == "other"
        ));
        let with_sas = format!("{url}?sv=2020-10-02&sig=abc");
        assert!(
            credential_from_environment(&with_sas, None, key)
                .unwrap()
                .is_none()
        );
        assert!(
            credential_from_environment(url, None, None)
                .unwrap()
                .is_none()
        );
        assert!(credential_from_environment(url, None, Some("***".to_owned())).is_err());
    }

    #[test]
    fn container_names_follow_azure_rules() {
        for good in ["abc", "checkpoints-1", &"a".repeat(63)] {
            assert!(validate_container(good).is_ok(), "{good}");
        }
        for bad in ["ab", "Upper", "under_score", &"a".repeat(64)] {
            assert!(validate_container(bad).is_err(), "{bad}");
        }
    }
}
