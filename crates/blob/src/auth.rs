//! How a client proves who it is to Azure Storage: a Shared Key or a SAS token.
//!
//! - **Shared Key**: every request is signed with HMAC-SHA256 over the string Azure Storage
//!   documents ("Authorize with Shared Key", blob service, version 2009-09-19 and later): the
//!   verb, the standard headers, the `x-ms-` headers and the canonical resource. The key never
//!   leaves this module and never appears in `Debug` output or errors.
//! - **SAS**: a token (`sv=…&sig=…`) appended to every request's query. It is a secret too:
//!   `Debug` shows only that one is present.
//!
//! [`BlobCredential::from_connection_string`] reads the connection strings the Azure portal and
//! Azurite print (`DefaultEndpointsProtocol=…;AccountName=…;AccountKey=…;BlobEndpoint=…`).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::BlobError;

/// A credential for an Azure Storage account.
#[derive(Clone)]
pub enum BlobCredential {
    /// The account name and its (decoded) access key.
    SharedKey {
        /// The storage account, e.g. `devstoreaccount1`.
        account: String,
        /// The account key, base64-decoded.
        key: Vec<u8>,
    },
    /// A shared access signature: the query string without its leading `?`.
    Sas(String),
}

impl std::fmt::Debug for BlobCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BlobCredential::SharedKey { account, .. } => f
                .debug_struct("SharedKey")
                .field("account", account)
                .finish_non_exhaustive(),
            BlobCredential::Sas(_) => f.write_str("Sas(..)"),
        }
    }
}

fn invalid(reason: impl Into<String>) -> BlobError {
    BlobError::Invalid {
        what: "storage credential",
        reason: reason.into(),
    }
}

/// What a connection string names: the credential and the blob endpoint, when it gives one.
#[derive(Debug, Clone)]
pub struct ConnectionString {
    /// The Shared Key (or SAS) in it.
    pub credential: BlobCredential,
    /// `BlobEndpoint=…`, or the one `DefaultEndpointsProtocol`, `AccountName` and
    /// `EndpointSuffix` imply (`https://{account}.blob.core.windows.net`).
    pub blob_endpoint: String,
}

impl BlobCredential {
    /// A Shared Key from an account name and the base64 key the portal shows.
    pub fn shared_key(account: &str, key_base64: &str) -> Result<Self, BlobError> {
        if account.is_empty() {
            return Err(invalid("the account name is empty"));
        }
        let key = STANDARD
            .decode(key_base64.trim())
            .map_err(|_| invalid(format!("the key of account {account} is not base64")))?;
        if key.is_empty() {
            return Err(invalid(format!("the key of account {account} is empty")));
        }
        Ok(BlobCredential::SharedKey {
            account: account.to_owned(),
            key,
        })
    }

    /// Reads a storage connection string.
    pub fn from_connection_string(text: &str) -> Result<ConnectionString, BlobError> {
        let mut fields = std::collections::HashMap::new();
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| invalid("a connection string field has no '='"))?;
            fields.insert(name.to_ascii_lowercase(), value.to_owned());
        }
        let account = fields.get("accountname").cloned().unwrap_or_default();
        let credential = if let Some(key) = fields.get("accountkey") {
            BlobCredential::shared_key(&account, key)?
        } else if let Some(sas) = fields.get("sharedaccesssignature") {
            BlobCredential::Sas(sas.trim_start_matches('?').to_owned())
        } else {
            return Err(invalid(
                "the connection string has neither AccountKey nor SharedAccessSignature",
            ));
        };
        let blob_endpoint = if let Some(endpoint) = fields.get("blobendpoint") {
            endpoint.trim_end_matches('/').to_owned()
        } else if account.is_empty() {
            return Err(invalid(
                "the connection string has neither BlobEndpoint nor AccountName",
            ));
        } else {
            let protocol = fields
                .get("defaultendpointsprotocol")
                .map_or("https", String::as_str);
            let suffix = fields
                .get("endpointsuffix")
                .map_or("core.windows.net", String::as_str);
            format!("{protocol}://{account}.blob.{suffix}")
        };
        Ok(ConnectionString {
            credential,
            blob_endpoint,
        })
    }
}

/// The parts of a request Shared Key signs.
pub(crate) struct ToSign<'a> {
    pub(crate) method: &'a str,
    /// The request's path as sent (percent-encoded), starting with `/`.
    pub(crate) path: &'a str,
    /// The query parameters, decoded.
    pub(crate) query: &'a [(String, String)],
    /// Every header the request carries, names in lower case.
    pub(crate) headers: &'a [(String, String)],
}

/// The `Authorization` header value for a request, signed with `key` of `account`.
pub(crate) fn shared_key_authorization(account: &str, key: &[u8], request: &ToSign<'_>) -> String {
    let string_to_sign = string_to_sign(account, request);
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC accepts a key of any length");
    mac.update(string_to_sign.as_bytes());
    let signature = STANDARD.encode(mac.finalize().into_bytes());
    format!("SharedKey {account}:{signature}")
}

fn header<'a>(request: &'a ToSign<'_>, name: &str) -> &'a str {
    request
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .map_or("", |(_, v)| v.as_str())
}

fn string_to_sign(account: &str, request: &ToSign<'_>) -> String {
    let mut out = String::new();
    out.push_str(request.method);
    out.push('\n');
    for name in [
        "content-encoding",
        "content-language",
        "content-length",
        "content-md5",
        "content-type",
        "date",
        "if-modified-since",
        "if-match",
        "if-none-match",
        "if-unmodified-since",
        "range",
    ] {
        let value = header(request, name);
        // Since version 2015-02-21 a zero Content-Length is signed as the empty string.
        if !(name == "content-length" && value == "0") {
            out.push_str(value);
        }
        out.push('\n');
    }
    let mut ms_headers: Vec<(&str, &str)> = request
        .headers
        .iter()
        .filter(|(n, _)| n.starts_with("x-ms-"))
        .map(|(n, v)| (n.as_str(), v.trim()))
        .collect();
    ms_headers.sort_unstable();
    for (name, value) in ms_headers {
        out.push_str(name);
        out.push(':');
        out.push_str(value);
        out.push('\n');
    }
    out.push('/');
    out.push_str(account);
    out.push_str(request.path);
    let mut query: Vec<(String, &str)> = request
        .query
        .iter()
        .map(|(n, v)| (n.to_ascii_lowercase(), v.as_str()))
        .collect();
    query.sort_unstable();
    for (name, value) in query {
        out.push('\n');
        out.push_str(&name);
        out.push(':');
        out.push_str(value);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_string_to_sign_follows_the_documented_order() {
        let headers = vec![
            ("x-ms-version".to_owned(), "2020-10-02".to_owned()),
            ("content-length".to_owned(), "0".to_owned()),
            ("if-match".to_owned(), "\"0x1\"".to_owned()),
            (
                "x-ms-date".to_owned(),
                "Wed, 25 Nov 2026 01:00:00 GMT".to_owned(),
            ),
            ("x-ms-meta-ownerid".to_owned(), " host-a ".to_owned()),
        ];
        let query = vec![
            ("restype".to_owned(), "container".to_owned()),
            ("Comp".to_owned(), "list".to_owned()),
        ];
        let request = ToSign {
            method: "PUT",
            path: "/c/ns/hub/%24default/ownership/0",
            query: &query,
            headers: &headers,
        };
        assert_eq!(
            string_to_sign("acct", &request),
            "PUT\n\n\n\n\n\n\n\n\"0x1\"\n\n\n\n\
             x-ms-date:Wed, 25 Nov 2026 01:00:00 GMT\nx-ms-meta-ownerid:host-a\n\
             x-ms-version:2020-10-02\n/acct/c/ns/hub/%24default/ownership/0\ncomp:list\n\
             restype:container"
        );
        let auth = shared_key_authorization("acct", b"key", &request);
        // HMAC-SHA256 of the string above with the key `key`, computed independently (Python's
        // hmac module).
        assert_eq!(
            auth,
            "SharedKey acct:mM//qY3tjjZ8z4RVIlj1oY+uAtdThd8UK6bVdLPh67U="
        );
    }

    #[test]
    fn connection_strings_give_the_key_and_the_endpoint() {
        let azurite = BlobCredential::from_connection_string(
            "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;\
             BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1/;",
        )
        .unwrap();
        assert_eq!(
            azurite.blob_endpoint,
            "http://127.0.0.1:10000/devstoreaccount1"
        );
        assert!(matches!(
            &azurite.credential,
            BlobCredential::SharedKey { account, key } if account == "devstoreaccount1" && key == b"key"
        ));
        assert!(!format!("{azurite:?}").contains("a2V5"));
        let azure = BlobCredential::from_connection_string(
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=a2V5;EndpointSuffix=core.windows.net",
        )
        .unwrap();
        assert_eq!(azure.blob_endpoint, "https://acct.blob.core.windows.net");
        for bad in [
            "AccountName=acct",
            "AccountName=acct;AccountKey=***",
            "nonsense",
        ] {
            let error = BlobCredential::from_connection_string(bad).unwrap_err();
            assert!(matches!(error, BlobError::Invalid { .. }), "{bad}: {error}");
        }
    }
}
