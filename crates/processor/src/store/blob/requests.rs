//! The Blob service calls the store makes through its [`tributary_blob::ContainerClient`]:
//! conditional Put Blob and Set Blob Metadata, Get Blob Properties and List Blobs with metadata,
//! their answers sorted into outcomes and their errors into [`StoreError`]s.

use tributary_blob::{BlobError, BlobProperties, ListedBlob, http_date_ms, unquote};

use super::{BlobCheckpointStore, Bytes, StoreError, Write};
use crate::limits::BLOB_LIST_PAGES_MAX;

/// The precondition of a write.
#[derive(Debug, Clone, Copy)]
pub(super) enum Condition<'a> {
    None,
    /// `If-None-Match: *`: only if the blob does not exist.
    Absent,
    /// `If-Match: "<etag>"`.
    Etag(&'a str),
}

/// A blob client's error as the store's: malformed input is the caller's, the rest the backend's.
pub(super) fn store_error(error: BlobError) -> StoreError {
    match error {
        BlobError::Invalid { what, reason } => StoreError::Invalid { what, reason },
        BlobError::Service {
            operation,
            description,
            ..
        } => StoreError::Backend {
            operation,
            description,
        },
        other => StoreError::Backend {
            operation: "calling the blob service",
            description: other.to_string(),
        },
    }
}

impl BlobCheckpointStore {
    /// Every blob under `prefix`, with its metadata.
    pub(super) async fn list(&self, prefix: &str) -> Result<Vec<ListedBlob>, StoreError> {
        self.client
            .list(prefix, &["metadata"], BLOB_LIST_PAGES_MAX)
            .await
            .map_err(store_error)
    }

    /// Get Blob Properties; `None` when the blob does not exist.
    pub(super) async fn head(&self, blob: &str) -> Result<Option<BlobProperties>, StoreError> {
        self.client.properties(blob).await.map_err(store_error)
    }

    /// Put Blob (`create`: a zero-length block blob) or Set Blob Metadata, under `condition`.
    pub(super) async fn write(
        &self,
        blob: &str,
        create: bool,
        metadata: &[(&str, String)],
        condition: Condition<'_>,
    ) -> Result<Write, StoreError> {
        let mut headers: Vec<(String, String)> = metadata
            .iter()
            .map(|(key, value)| (format!("x-ms-meta-{key}"), value.clone()))
            .collect();
        match condition {
            Condition::None => {}
            Condition::Absent => headers.push(("if-none-match".to_owned(), "*".to_owned())),
            Condition::Etag(etag) => headers.push(("if-match".to_owned(), format!("\"{etag}\""))),
        }
        let query: &[(&str, &str)] = if create {
            headers.push(("x-ms-blob-type".to_owned(), "BlockBlob".to_owned()));
            &[]
        } else {
            &[("comp", "metadata")]
        };
        let operation = if create {
            "creating a blob"
        } else {
            "setting a blob's metadata"
        };
        let response = self
            .client
            .send("PUT", Some(blob), query, headers, Bytes::new())
            .await
            .map_err(|e| store_error(BlobError::unreachable(operation, e)))?;
        match response.status {
            200 | 201 => Ok(Write::Done {
                etag: unquote(response.header("etag").unwrap_or_default()),
                last_modified_ms: http_date_ms(
                    response.header("last-modified").unwrap_or_default(),
                ),
            }),
            409 | 412 => Ok(Write::Conflict),
            404 => Ok(Write::NotFound),
            _ => Err(store_error(tributary_blob::refused(operation, &response))),
        }
    }
}
