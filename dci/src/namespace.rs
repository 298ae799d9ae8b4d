//! The request's namespace (Coordinate's word for a database): the configured database unless
//! the `X-Disbatch-Namespace` header names another one the config allows.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use crate::error::ApiError;
use crate::state::AppState;

pub const HEADER: &str = "x-disbatch-namespace";

/// The state to serve a request with, on its namespace's database.
pub struct Ns(pub AppState);

impl FromRequestParts<AppState> for Ns {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Some(value) = parts.headers.get(HEADER) else {
            return Ok(Ns(state.clone()));
        };
        let ns = value
            .to_str()
            .map_err(|_| ApiError::bad_request("the namespace header is not text"))?;
        if ns == state.config.database {
            return Ok(Ns(state.clone()));
        }
        // Only listed databases: the DCI's credentials must not reach every database.
        match state.in_namespace(ns) {
            Some(state) => Ok(Ns(state)),
            None => Err(ApiError::not_found(format!("no namespace {ns}"))),
        }
    }
}
