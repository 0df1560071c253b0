//! What can go wrong talking to Blob Storage, split by who must act: the caller (a malformed URL
//! or credential) or the service (an answer that is not success, or no answer).

/// An error of the blob client. Messages never carry a key or a SAS token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BlobError {
    /// A URL, container name or credential is malformed (the caller's input).
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// What was wrong, e.g. "blob container URL".
        what: &'static str,
        /// Why, in words a person can act on.
        reason: String,
    },
    /// The service refused a request or could not be reached; worth retrying later.
    #[error("{operation} failed: {description}")]
    Service {
        /// What was being done, e.g. "listing blobs".
        operation: &'static str,
        /// The status and error code the service answered, or why there was no answer.
        description: String,
        /// The HTTP status, when the service answered.
        status: Option<u16>,
    },
}

impl BlobError {
    /// A [`BlobError::Service`] without an answer (connection refused, timeout).
    pub fn unreachable(operation: &'static str, description: impl Into<String>) -> BlobError {
        BlobError::Service {
            operation,
            description: description.into(),
            status: None,
        }
    }

    /// The HTTP status the service answered, if this is its refusal.
    pub fn status(&self) -> Option<u16> {
        match self {
            BlobError::Service { status, .. } => *status,
            BlobError::Invalid { .. } => None,
        }
    }
}
