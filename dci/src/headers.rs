//! Security headers on every answer: no MIME sniffing, no framing, and a Content-Security-Policy
//! on HTML (the console and task pages load only their own files).

use axum::http::header::{
    HeaderValue, CONTENT_SECURITY_POLICY, CONTENT_TYPE, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::response::Response;

/// The console's scripts and styles are files of its own (no inline code); its icon is an empty
/// `data:` URL. Nothing may frame a page, change its base URL or post its forms elsewhere.
pub const CSP: &str = "default-src 'self'; img-src 'self' data:; object-src 'none'; \
                       base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Router middleware (`map_response`): adds the headers to whatever the route answered.
pub async fn security_headers(mut response: Response) -> Response {
    let html = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            ct.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/html")
        });
    let headers = response.headers_mut();
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if html {
        headers.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::{Html, IntoResponse};

    #[tokio::test]
    async fn every_answer_gets_nosniff_and_deny_and_html_gets_the_policy() {
        let json = security_headers(axum::Json(serde_json::json!({"a": 1})).into_response()).await;
        let html = security_headers(Html("<p>x</p>").into_response()).await;
        for r in [&json, &html] {
            assert_eq!(r.headers()[X_CONTENT_TYPE_OPTIONS], "nosniff");
            assert_eq!(r.headers()[X_FRAME_OPTIONS], "DENY");
        }
        assert!(json.headers().get(CONTENT_SECURITY_POLICY).is_none());
        assert_eq!(html.headers()[CONTENT_SECURITY_POLICY], CSP);
    }
}
