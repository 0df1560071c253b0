//! The Blob service calls the store makes, each signed or carrying the SAS: Put Blob, Set Blob
//! Metadata, Get Blob Properties and List Blobs, with their answers sorted into outcomes.

use super::auth::{ToSign, shared_key_authorization};
use super::listing::{self, ListedBlob, Page};
use super::{
    BlobCheckpointStore, BlobCredential, Bytes, Full, PATH, QUERY, SERVICE_VERSION, StoreError,
    Write, backend, describe_failure, now_http_date, parse_time_ms, unquote, utf8_percent_encode,
};
use crate::limits::BLOB_LIST_PAGES_MAX;

/// A blob's ETag, modification time and metadata (keys in lower case).
#[derive(Debug)]
pub(super) struct Properties {
    pub(super) etag: String,
    pub(super) last_modified_ms: i64,
    pub(super) metadata: std::collections::HashMap<String, String>,
}

/// The precondition of a write.
#[derive(Debug, Clone, Copy)]
pub(super) enum Condition<'a> {
    None,
    /// `If-None-Match: *`: only if the blob does not exist.
    Absent,
    /// `If-Match: "<etag>"`.
    Etag(&'a str),
}

impl BlobCheckpointStore {
    /// Sends one request to the container (`blob: None`) or one of its blobs.
    pub(super) async fn send(
        &self,
        method: &str,
        blob: Option<&str>,
        query: &[(&str, &str)],
        mut headers: Vec<(String, String)>,
    ) -> Result<super::Response, String> {
        let path = match blob {
            Some(name) => format!(
                "{}/{}",
                self.container_path,
                utf8_percent_encode(name, PATH)
            ),
            None => self.container_path.clone(),
        };
        headers.push(("x-ms-version".to_owned(), SERVICE_VERSION.to_owned()));
        headers.push(("x-ms-date".to_owned(), now_http_date()));
        if method == "PUT" {
            headers.push(("content-length".to_owned(), "0".to_owned()));
        }
        let mut uri = path.clone();
        let mut separator = '?';
        for (name, value) in query {
            uri.push(separator);
            uri.push_str(name);
            uri.push('=');
            uri.extend(utf8_percent_encode(value, QUERY));
            separator = '&';
        }
        match &self.credential {
            BlobCredential::Sas(sas) => {
                uri.push(separator);
                uri.push_str(sas);
            }
            BlobCredential::SharedKey { account, key } => {
                let decoded: Vec<(String, String)> = query
                    .iter()
                    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                    .collect();
                let authorization = shared_key_authorization(
                    account,
                    key,
                    &ToSign {
                        method,
                        path: &path,
                        query: &decoded,
                        headers: &headers,
                    },
                );
                headers.push(("authorization".to_owned(), authorization));
            }
        }
        let host = self.http.authority();
        self.http
            .send(|| {
                let mut request = hyper::Request::builder()
                    .method(method)
                    .uri(uri.as_str())
                    .header("host", host.as_str());
                for (name, value) in &headers {
                    request = request.header(name.as_str(), value.as_str());
                }
                request
                    .body(Full::new(Bytes::new()))
                    .expect("the store builds only valid requests")
            })
            .await
    }

    /// One page of List Blobs under `prefix`.
    pub(super) async fn list_page(
        &self,
        prefix: &str,
        marker: Option<&str>,
    ) -> Result<Page, StoreError> {
        let mut query = vec![
            ("restype", "container"),
            ("comp", "list"),
            ("include", "metadata"),
            ("prefix", prefix),
        ];
        if let Some(marker) = marker {
            query.push(("marker", marker));
        }
        let response = self
            .send("GET", None, &query, Vec::new())
            .await
            .map_err(|e| backend("listing blobs", e))?;
        if response.status != 200 {
            return Err(backend("listing blobs", describe_failure(&response)));
        }
        let body = std::str::from_utf8(&response.body)
            .map_err(|_| backend("listing blobs", "the listing is not UTF-8"))?;
        listing::parse(body).map_err(|e| backend("listing blobs", e))
    }

    /// Every blob under `prefix`, following `NextMarker` (at most [`BLOB_LIST_PAGES_MAX`]).
    pub(super) async fn list(&self, prefix: &str) -> Result<Vec<ListedBlob>, StoreError> {
        let mut blobs = Vec::new();
        let mut marker: Option<String> = None;
        for _ in 0..BLOB_LIST_PAGES_MAX {
            let page = self.list_page(prefix, marker.as_deref()).await?;
            blobs.extend(page.blobs);
            marker = page.next_marker;
            if marker.is_none() {
                return Ok(blobs);
            }
        }
        Err(backend(
            "listing blobs",
            format!("more than {BLOB_LIST_PAGES_MAX} pages under {prefix}"),
        ))
    }

    /// Get Blob Properties; `None` when the blob does not exist.
    pub(super) async fn head(&self, blob: &str) -> Result<Option<Properties>, StoreError> {
        let response = self
            .send("HEAD", Some(blob), &[], Vec::new())
            .await
            .map_err(|e| backend("reading a blob's properties", e))?;
        match response.status {
            200 => {}
            404 => return Ok(None),
            _ => {
                return Err(backend(
                    "reading a blob's properties",
                    describe_failure(&response),
                ));
            }
        }
        let metadata = response
            .headers
            .iter()
            .filter_map(|(name, value)| {
                let key = name.as_str().strip_prefix("x-ms-meta-")?;
                Some((key.to_ascii_lowercase(), value.to_str().ok()?.to_owned()))
            })
            .collect();
        Ok(Some(Properties {
            etag: unquote(response.header("etag").unwrap_or_default()),
            last_modified_ms: parse_time_ms(response.header("last-modified").unwrap_or_default()),
            metadata,
        }))
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
            .send("PUT", Some(blob), query, headers)
            .await
            .map_err(|e| backend(operation, e))?;
        match response.status {
            200 | 201 => Ok(Write::Done {
                etag: unquote(response.header("etag").unwrap_or_default()),
                last_modified_ms: parse_time_ms(
                    response.header("last-modified").unwrap_or_default(),
                ),
            }),
            409 | 412 => Ok(Write::Conflict),
            404 => Ok(Write::NotFound),
            _ => Err(backend(operation, describe_failure(&response))),
        }
    }
}
