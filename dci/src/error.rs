//! API errors: a status code and a JSON body, in Disbatch's `{"error": …}` shape.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// An error response. Database failures are 503 (Disbatch said 400), bad input 400.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: Value,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::with(StatusCode::BAD_REQUEST, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::with(StatusCode::NOT_FOUND, message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::with(StatusCode::CONFLICT, message)
    }

    pub fn with(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            body: json!({"error": message.into()}),
        }
    }

    /// A 400 whose body carries extra keys beside `error` (Disbatch's `param`, `plugin`, …).
    pub fn bad_request_with(body: Value) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            body,
        }
    }
}

impl From<disbatch_store::Error> for ApiError {
    fn from(e: disbatch_store::Error) -> Self {
        use disbatch_store::Error as E;
        match &e {
            // Disbatch's shape: the driver's exception class as the key, its message as
            // `error`; the server's words only, as the Perl driver stringified them.
            E::Mongo { .. } if e.is_duplicate_key() => {
                let message = e.duplicate_key_message();
                ApiError::bad_request_with(json!({
                    "MongoDB::DuplicateKeyError": {"code": 11000, "message": message},
                    "error": message,
                }))
            }
            E::Mongo { .. } if e.is_document_too_large() => ApiError::with(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the document would exceed MongoDB's 16 MiB limit",
            ),
            E::Mongo { context, .. } => match e.refusal() {
                // The server refused the request itself (a filter, a namespace, a value):
                // bad input, said in the server's own short words.
                Some(message) => ApiError::bad_request(format!("{context}: {message}")),
                // Unreachable, busy or failing over: the body says which, never where the
                // database is nor what it replied (the log has it all).
                None => {
                    tracing::error!(error = %e, "database failure");
                    ApiError::with(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("database unavailable: {}", e.unavailable_reason()),
                    )
                }
            },
            E::Invalid(m) => ApiError::bad_request(m.clone()),
            // One stored document that cannot be read: that document's answer, not an outage.
            E::BadDocument { .. } => ApiError::conflict(e.to_string()),
            _ => {
                tracing::error!(error = %e, "internal error");
                ApiError::with(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal error; the server log says more",
                )
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = self.body;
        crate::render::canonical(&mut body);
        (self.status, axum::Json(body)).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
