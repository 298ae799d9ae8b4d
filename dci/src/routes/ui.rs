//! The operator console: HTML, script and styles compiled into the binary (nothing fetched).

use axum::extract::Path;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, ApiResult};

/// Every console file: name, content type, content.
const ASSETS: &[(&str, &str, &str)] = &[
    (
        "app.js",
        "application/javascript; charset=utf-8",
        include_str!("../../ui/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_str!("../../ui/app.css"),
    ),
];

const INDEX: &str = include_str!("../../ui/index.html");

pub async fn index() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX).into_response()
}

pub async fn asset(Path(file): Path<String>) -> ApiResult<Response> {
    let (_, kind, body) = ASSETS
        .iter()
        .find(|(name, _, _)| *name == file)
        .ok_or_else(|| ApiError::not_found(format!("no console file {file}")))?;
    Ok((
        [
            (header::CONTENT_TYPE, *kind),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        *body,
    )
        .into_response())
}
