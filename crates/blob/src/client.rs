//! [`ContainerClient`]: one container — its URL parsed, its credential chosen, every request
//! signed (Shared Key) or carrying the SAS — and the Blob service operations Tributary uses.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use crate::auth::{BlobCredential, ToSign, shared_key_authorization};
use crate::error::BlobError;
use crate::http::{Http, Response};
use crate::listing::{self, ListedBlob, Page};

/// The storage service version the client speaks (List Blobs with metadata, conditional Put
/// Blob, Set Blob Metadata, Put Block and Put Block List have not changed since).
pub const SERVICE_VERSION: &str = "2020-10-02";

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

/// A blob's properties as Get Blob Properties answers them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobProperties {
    /// The ETag, without surrounding quotes.
    pub etag: String,
    /// `Last-Modified` in milliseconds since the Unix epoch (0 if the service sent none).
    pub last_modified_ms: i64,
    /// The committed size in bytes.
    pub content_length: u64,
    /// The metadata, keys in lower case (metadata keys are case-insensitive).
    pub metadata: std::collections::HashMap<String, String>,
}

/// One container of a storage account (or Azurite), and a credential for it.
pub struct ContainerClient {
    http: Http,
    /// `/{container}`, or `/{account}/{container}` for a path-style endpoint (Azurite).
    container_path: String,
    credential: BlobCredential,
}

impl std::fmt::Debug for ContainerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerClient")
            .field("container", &self.container_url())
            .field("credential", &self.credential)
            .finish_non_exhaustive()
    }
}

fn invalid(reason: impl Into<String>) -> BlobError {
    BlobError::Invalid {
        what: "blob container URL",
        reason: reason.into(),
    }
}

/// The service's refusal of `operation`: its status and error code, as a [`BlobError`].
pub fn refused(operation: &'static str, response: &Response) -> BlobError {
    let code = response
        .header("x-ms-error-code")
        .unwrap_or("no error code");
    BlobError::Service {
        operation,
        description: format!("the service answered {} ({code})", response.status),
        status: Some(response.status),
    }
}

impl ContainerClient {
    /// The container at `url` (`https://{account}.blob.core.windows.net/{container}`, or
    /// path-style `http://127.0.0.1:10000/{account}/{container}` for Azurite). The credential
    /// is a SAS in the URL's query (`?sv=…&sig=…`) or `credential` (a Shared Key for the URL's
    /// account, or a SAS); exactly one of the two. Sends nothing.
    pub fn from_url(url: &str, credential: Option<BlobCredential>) -> Result<Self, BlobError> {
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
        Ok(ContainerClient {
            http: Http::new(tls, host, port),
            container_path,
            credential,
        })
    }

    /// `container` at the endpoint and with the credential a storage connection string gives.
    pub fn from_connection_string(
        connection_string: &str,
        container: &str,
    ) -> Result<Self, BlobError> {
        let parsed = BlobCredential::from_connection_string(connection_string)?;
        let url = format!("{}/{container}", parsed.blob_endpoint);
        ContainerClient::from_url(&url, Some(parsed.credential))
    }

    /// How many requests this client has sent (retries included).
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

    /// The URL of blob `name`, without any SAS token.
    pub fn blob_url(&self, name: &str) -> String {
        format!(
            "{}/{}",
            self.container_url(),
            utf8_percent_encode(name, PATH)
        )
    }

    /// Sends one request to the container (`blob: None`) or one of its blobs, signed or with
    /// the SAS, `x-ms-version` and `x-ms-date` added. `query` values are percent-encoded here.
    /// The error is why no answer came (any answer, a refusal included, is `Ok`).
    pub async fn send(
        &self,
        method: &str,
        blob: Option<&str>,
        query: &[(&str, &str)],
        mut headers: Vec<(String, String)>,
        body: Bytes,
    ) -> Result<Response, String> {
        let path = match blob {
            Some(name) => format!(
                "{}/{}",
                self.container_path,
                utf8_percent_encode(name, PATH)
            ),
            None => self.container_path.clone(),
        };
        headers.push(("x-ms-version".to_owned(), SERVICE_VERSION.to_owned()));
        headers.push((
            "x-ms-date".to_owned(),
            httpdate::fmt_http_date(SystemTime::now()),
        ));
        if method == "PUT" || !body.is_empty() {
            headers.push(("content-length".to_owned(), body.len().to_string()));
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
                let to_sign = ToSign {
                    method,
                    path: &path,
                    query: &decoded,
                    headers: &headers,
                };
                let authorization = shared_key_authorization(account, key, &to_sign);
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
                    .body(Full::new(body.clone()))
                    .expect("the client builds only valid requests")
            })
            .await
    }

    /// [`send`](Self::send) with no answer turned into a [`BlobError::Service`].
    async fn call(
        &self,
        operation: &'static str,
        method: &str,
        blob: Option<&str>,
        query: &[(&str, &str)],
        headers: Vec<(String, String)>,
        body: Bytes,
    ) -> Result<Response, BlobError> {
        self.send(method, blob, query, headers, body)
            .await
            .map_err(|e| BlobError::unreachable(operation, e))
    }

    /// Create Container; `Ok` also when it exists, or when a SAS that may not create
    /// containers may list this one.
    pub async fn create_container_if_absent(&self) -> Result<(), BlobError> {
        let operation = "creating the container";
        let query = [("restype", "container")];
        let created = self
            .call(operation, "PUT", None, &query, Vec::new(), Bytes::new())
            .await?;
        match created.status {
            201 | 409 => Ok(()),
            _ => match self.list_page("", None, &[]).await {
                Ok(_) => Ok(()),
                Err(_) => Err(refused(operation, &created)),
            },
        }
    }

    /// One page of List Blobs under `prefix`, with the `include` datasets (`metadata`,
    /// `uncommittedblobs`).
    pub async fn list_page(
        &self,
        prefix: &str,
        marker: Option<&str>,
        include: &[&str],
    ) -> Result<Page, BlobError> {
        let operation = "listing blobs";
        let include = include.join(",");
        let mut query = vec![("restype", "container"), ("comp", "list")];
        if !include.is_empty() {
            query.push(("include", &include));
        }
        query.push(("prefix", prefix));
        if let Some(marker) = marker {
            query.push(("marker", marker));
        }
        let response = self
            .call(operation, "GET", None, &query, Vec::new(), Bytes::new())
            .await?;
        if response.status != 200 {
            return Err(refused(operation, &response));
        }
        let body = std::str::from_utf8(&response.body)
            .map_err(|_| BlobError::unreachable(operation, "the listing is not UTF-8"))?;
        listing::parse(body).map_err(|e| BlobError::unreachable(operation, e))
    }

    /// Every blob under `prefix`, following `NextMarker` for at most `pages_max` pages.
    pub async fn list(
        &self,
        prefix: &str,
        include: &[&str],
        pages_max: u32,
    ) -> Result<Vec<ListedBlob>, BlobError> {
        let mut blobs = Vec::new();
        let mut marker: Option<String> = None;
        for _ in 0..pages_max {
            let page = self.list_page(prefix, marker.as_deref(), include).await?;
            blobs.extend(page.blobs);
            marker = page.next_marker;
            if marker.is_none() {
                return Ok(blobs);
            }
        }
        Err(BlobError::unreachable(
            "listing blobs",
            format!("more than {pages_max} pages under {prefix:?}"),
        ))
    }

    /// Get Blob Properties; `None` when no committed blob `name` exists.
    pub async fn properties(&self, name: &str) -> Result<Option<BlobProperties>, BlobError> {
        let operation = "reading a blob's properties";
        let response = self
            .call(operation, "HEAD", Some(name), &[], Vec::new(), Bytes::new())
            .await?;
        match response.status {
            200 => {}
            404 => return Ok(None),
            _ => return Err(refused(operation, &response)),
        }
        let metadata = response
            .headers
            .iter()
            .filter_map(|(name, value)| {
                let key = name.as_str().strip_prefix("x-ms-meta-")?;
                Some((key.to_ascii_lowercase(), value.to_str().ok()?.to_owned()))
            })
            .collect();
        Ok(Some(BlobProperties {
            etag: unquote(response.header("etag").unwrap_or_default()),
            last_modified_ms: http_date_ms(response.header("last-modified").unwrap_or_default()),
            content_length: response
                .header("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            metadata,
        }))
    }

    /// Get Blob of the `len` bytes at `offset` (fewer at the blob's end).
    pub async fn read_range(&self, name: &str, offset: u64, len: u64) -> Result<Bytes, BlobError> {
        let operation = "reading a blob";
        if len == 0 {
            return Ok(Bytes::new());
        }
        let range = format!("bytes={offset}-{}", offset + len - 1);
        let headers = vec![("x-ms-range".to_owned(), range)];
        let response = self
            .call(operation, "GET", Some(name), &[], headers, Bytes::new())
            .await?;
        match response.status {
            200 | 206 => Ok(response.body),
            _ => Err(refused(operation, &response)),
        }
    }

    /// Put Block: stages `data` as block `block_id` (base64, the same length for every block
    /// of a blob) of blob `name`, uncommitted — invisible until a block list names it.
    pub async fn put_block(
        &self,
        name: &str,
        block_id: &str,
        data: Bytes,
    ) -> Result<(), BlobError> {
        let operation = "staging a block";
        let query = [("comp", "block"), ("blockid", block_id)];
        let response = self
            .call(operation, "PUT", Some(name), &query, Vec::new(), data)
            .await?;
        match response.status {
            201 => Ok(()),
            _ => Err(refused(operation, &response)),
        }
    }

    /// Put Block List: commits blob `name` as the staged blocks `block_ids`, in order, at once;
    /// the blob's other uncommitted blocks are discarded. With `only_if_absent`
    /// (`If-None-Match: *`) an existing blob is left alone and the answer is a refusal with
    /// status 409 or 412.
    pub async fn put_block_list(
        &self,
        name: &str,
        block_ids: &[String],
        only_if_absent: bool,
    ) -> Result<(), BlobError> {
        let operation = "committing a block list";
        let mut xml = String::from(r#"<?xml version="1.0" encoding="utf-8"?><BlockList>"#);
        for id in block_ids {
            xml.push_str("<Latest>");
            xml.push_str(id);
            xml.push_str("</Latest>");
        }
        xml.push_str("</BlockList>");
        let mut headers = vec![(
            "x-ms-blob-content-type".to_owned(),
            "application/octet-stream".to_owned(),
        )];
        if only_if_absent {
            headers.push(("if-none-match".to_owned(), "*".to_owned()));
        }
        let query = [("comp", "blocklist")];
        let response = self
            .call(
                operation,
                "PUT",
                Some(name),
                &query,
                headers,
                Bytes::from(xml),
            )
            .await?;
        match response.status {
            201 => Ok(()),
            _ => Err(refused(operation, &response)),
        }
    }

    /// Get Block List (`blocklisttype=uncommitted`): how many blocks of blob `name` are
    /// staged and not committed (0 when there is no such blob).
    pub async fn uncommitted_blocks(&self, name: &str) -> Result<usize, BlobError> {
        let operation = "listing a blob's uncommitted blocks";
        let query = [("comp", "blocklist"), ("blocklisttype", "uncommitted")];
        let response = self
            .call(
                operation,
                "GET",
                Some(name),
                &query,
                Vec::new(),
                Bytes::new(),
            )
            .await?;
        match response.status {
            200 => {}
            404 => return Ok(0),
            _ => return Err(refused(operation, &response)),
        }
        let body = std::str::from_utf8(&response.body)
            .map_err(|_| BlobError::unreachable(operation, "the block list is not UTF-8"))?;
        listing::count_uncommitted_blocks(body).map_err(|e| BlobError::unreachable(operation, e))
    }
}

/// The credential for `url` from the environment's values — a storage connection string (its
/// key) or an account key (for the URL's account) — or none when the URL carries a SAS.
pub fn credential_from_environment(
    url: &str,
    connection_string: Option<String>,
    key: Option<String>,
) -> Result<Option<BlobCredential>, BlobError> {
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
fn account_and_container(url: &url::Url) -> Result<(String, String, bool), BlobError> {
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

fn validate_container(container: &str) -> Result<(), BlobError> {
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
) -> Result<BlobCredential, BlobError> {
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

/// The block id of the `index`th block of a blob: base64 of a fixed-length text, so every id of
/// a blob has the same length (the service requires it) and ids sort in block order.
pub fn block_id(index: u32) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("block-{index:010}"))
}

/// An RFC 1123 date (`Last-Modified`) in milliseconds since the Unix epoch; 0 if malformed.
pub fn http_date_ms(text: &str) -> i64 {
    httpdate::parse_http_date(text)
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .unwrap_or(0)
}

/// An ETag without its surrounding quotes.
pub fn unquote(etag: &str) -> String {
    etag.trim_matches('"').to_owned()
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
    fn block_ids_have_one_length_and_sort_in_order() {
        let ids: Vec<String> = [0, 1, 9, 10, 49_999, u32::MAX].map(block_id).into();
        assert!(ids.iter().all(|id| id.len() == ids[0].len()));
        assert!(
            ids.windows(2)
                .all(|w| w[0] < w[1] || w[0].len() == w[1].len())
        );
        assert_eq!(block_id(0), "YmxvY2stMDAwMDAwMDAwMA==");
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

    #[test]
    fn urls_name_the_container_and_pick_one_credential() {
        let key = BlobCredential::shared_key("devstoreaccount1", "a2V5").unwrap();
        let client = ContainerClient::from_url(
            "http://127.0.0.1:10000/devstoreaccount1/capture",
            Some(key.clone()),
        )
        .unwrap();
        assert_eq!(
            client.blob_url("ns/hub/0/2026/01/01/00/00/00.avro"),
            "http://127.0.0.1:10000/devstoreaccount1/capture/ns/hub/0/2026/01/01/00/00/00.avro"
        );
        let sas = ContainerClient::from_url(
            "https://acct.blob.core.windows.net/capture?sv=2020-10-02&sig=secret",
            None,
        )
        .unwrap();
        assert_eq!(
            sas.container_url(),
            "https://acct.blob.core.windows.net/capture"
        );
        assert!(!format!("{sas:?}").contains("secret"));
        for (url, credential) in [
            (
                "https://acct.blob.core.windows.net/capture?sv=1&sig=x",
                Some(key.clone()),
            ),
            ("https://acct.blob.core.windows.net/capture", Some(key)),
            ("https://acct.blob.core.windows.net/capture", None),
            ("ftp://acct.blob.core.windows.net/capture?sig=x", None),
        ] {
            let error = ContainerClient::from_url(url, credential).unwrap_err();
            assert!(matches!(error, BlobError::Invalid { .. }), "{url}: {error}");
        }
    }
}
