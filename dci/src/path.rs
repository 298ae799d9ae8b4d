//! Path parameters whose rejection is JSON like every other error: axum's own `Path` answers
//! text/plain, e.g. for `GET /queues/%ff%fe`, whose parameter is not UTF-8.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// Drop-in for `axum::extract::Path` in handlers.
pub struct Path<T>(pub T);

impl<T, S> FromRequestParts<S> for Path<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Path(value)),
            Err(rejection) => Err(ApiError::with(
                rejection.status(),
                format!(
                    "invalid path {}: {}",
                    parts.uri.path(),
                    rejection.body_text()
                ),
            )),
        }
    }
}
