//! Reading a request's parameters inside handlers, with over-limit bodies answered as 413 JSON.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderMap, StatusCode};
use bson::oid::ObjectId;

use crate::error::{ApiError, ApiResult};
use crate::params::{parse, Params};

/// A request's body, or the JSON error for one over `web.max_body_bytes` (413) or unreadable.
pub fn body_bytes(body: Result<Bytes, BytesRejection>) -> ApiResult<Bytes> {
    body.map_err(|e| {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::with(status, "request body is larger than web.max_body_bytes")
        } else {
            ApiError::with(status, format!("could not read the request body: {e}"))
        }
    })
}

fn read_params(
    headers: &HeaderMap,
    query: Option<&str>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Params> {
    parse(headers, query, &body_bytes(body)?)
}

/// Handlers take `Params` as their last argument: headers, query string and body decoded
/// the Disbatch way, with the body limit applied.
impl<S: Send + Sync> FromRequest<S> for Params {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let headers = req.headers().clone();
        let query = req.uri().query().map(str::to_string);
        let body = Bytes::from_request(req, state).await;
        read_params(&headers, query.as_deref(), body)
    }
}

/// A path id that must be an ObjectId: 400 with the offending text otherwise.
pub fn object_id(what: &str, text: &str) -> ApiResult<ObjectId> {
    ObjectId::parse_str(text).map_err(|_| {
        ApiError::bad_request(format!(
            "invalid {what} id {text:?}: expected 24 hex digits"
        ))
    })
}

/// Disbatch's content negotiation: HTML only when `text/html` is wanted at least as much
/// as `application/json` (no Accept, or `*/*`, means JSON).
pub fn wants_html(headers: &HeaderMap) -> bool {
    let Some(accept) = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let (mut html, mut json) = (0.0_f32, None::<f32>);
    for part in accept.split(',') {
        let mut pieces = part.split(';');
        let kind = pieces.next().unwrap_or("").trim();
        let q = pieces
            .filter_map(|p| p.trim().strip_prefix("q="))
            .find_map(|q| q.parse::<f32>().ok())
            .unwrap_or(1.0);
        match kind {
            "text/html" => html = q,
            "application/json" => json = Some(q),
            _ => {}
        }
    }
    html > 0.0 && html >= json.unwrap_or(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn accept(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            axum::http::header::ACCEPT,
            HeaderValue::from_str(v).expect("header"),
        );
        h
    }

    #[test]
    fn negotiation_follows_disbatch() {
        assert!(!wants_html(&HeaderMap::new()));
        assert!(!wants_html(&accept("*/*")));
        assert!(wants_html(&accept(
            "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
        )));
        assert!(!wants_html(&accept("application/json")));
        assert!(!wants_html(&accept("text/html;q=0.5, application/json")));
        assert!(wants_html(&accept("text/html, application/json")));
    }
}
