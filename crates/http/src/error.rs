//! Every error the front door answers with: an HTTP status and the OCI body
//! `{"code": "...", "message": "..."}`, which the OCI SDKs turn into a `ServiceError`.
//!
//! The codes are OCI's (API Errors reference): 400 `InvalidParameter`, `MissingParameter`,
//! `CannotParseRequest`, `LimitExceeded`; 401 `NotAuthenticated`; 404 `NotAuthorizedOrNotFound`
//! (an unknown stream or group) and `NotFound` (no such route); 405 `MethodNotAllowed`; 409
//! `Conflict` (a fenced group instance; not retried by the SDKs); 413 `RequestEntityTooLarge`;
//! 429 `TooManyRequests`; 500 `InternalServerError`; 503 `ServiceUnavailable`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tributary_broker::BrokerError;
use tributary_groups::CoordinatorError;

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Whole seconds for a `Retry-After` header, on a throttled request.
    pub retry_after_secs: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after_secs: None,
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "InvalidParameter", message)
    }

    pub(crate) fn missing(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "MissingParameter", message)
    }

    pub(crate) fn cannot_parse(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "CannotParseRequest", message)
    }

    pub(crate) fn limit_exceeded(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "LimitExceeded", message)
    }

    pub(crate) fn not_authenticated(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "NotAuthenticated", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NotAuthorizedOrNotFound", message)
    }

    pub(crate) fn too_large(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            message,
        )
    }

    /// 429 with `Retry-After: 1`: a rate per second was exceeded.
    pub(crate) fn throttled(message: impl Into<String>) -> Self {
        Self::throttled_for(message, std::time::Duration::from_secs(1))
    }

    /// 429 with `Retry-After` saying when the request would be admitted, in whole seconds
    /// rounded up (at least 1: the header has no finer unit).
    pub(crate) fn throttled_for(
        message: impl Into<String>,
        retry_after: std::time::Duration,
    ) -> Self {
        let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
        ApiError {
            retry_after_secs: Some(secs.max(1)),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", message)
        }
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            message,
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = %self.status, code = self.code, message = %self.message, "request failed");
        }
        let body = serde_json::json!({ "code": self.code, "message": self.message });
        let mut response = (self.status, body.to_string()).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

impl From<BrokerError> for ApiError {
    fn from(e: BrokerError) -> Self {
        let message = e.to_string();
        match e {
            BrokerError::HubNotFound { .. } | BrokerError::ConsumerGroupNotFound { .. } => {
                ApiError::not_found(message)
            }
            BrokerError::HubExists { .. }
            | BrokerError::ConsumerGroupExists { .. }
            | BrokerError::ProcessorGroupRunning { .. } => {
                ApiError::new(StatusCode::CONFLICT, "Conflict", message)
            }
            BrokerError::ConsumerGroupLimit { .. } => ApiError::limit_exceeded(message),
            BrokerError::ShuttingDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                message,
            ),
            e if e.is_caller_error() => ApiError::invalid(message),
            _ => ApiError::internal(message),
        }
    }
}

impl From<CoordinatorError> for ApiError {
    fn from(e: CoordinatorError) -> Self {
        let message = e.to_string();
        match e {
            CoordinatorError::Broker(e) => e.into(),
            CoordinatorError::GroupNotFound { .. } => ApiError::not_found(message),
            CoordinatorError::GroupLimit { .. } => ApiError::limit_exceeded(message),
            CoordinatorError::Fenced { .. } => {
                ApiError::new(StatusCode::CONFLICT, "Conflict", message)
            }
            e if e.is_caller_error() => ApiError::invalid(message),
            _ => ApiError::internal(message),
        }
    }
}
