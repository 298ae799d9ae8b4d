//! HTTP client for disbatch-web: endpoint URLs, auth, JSON calls, streaming, and server error text.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use reqwest::{Method, Response, StatusCode, Url};
use serde_json::Value;

use crate::auth::Auth;
use crate::exit::{HttpError, Unreachable};

/// Longest slice of an unexpected body quoted in an error message.
const QUOTE_LIMIT: usize = 500;

pub struct Client {
    http: reqwest::Client,
    base: Url,
    auth: Auth,
}

/// A successful JSON response: the bytes as sent (for `--json`) and their parse.
#[derive(Debug)]
pub struct Reply {
    pub raw: Vec<u8>,
    pub value: Value,
}

impl Client {
    /// `cacert`: a PEM file of extra trusted certificates, for a server with a private CA.
    pub fn new(
        base_url: &str,
        auth: Auth,
        namespace: Option<&str>,
        cacert: Option<&Path>,
    ) -> anyhow::Result<Self> {
        // The given text is not echoed: it may hold user:password@.
        let base = Url::parse(&with_scheme(base_url))
            .map_err(|e| crate::exit::usage(format!("invalid --url: {e}")))?;
        if base.cannot_be_a_base() || !matches!(base.scheme(), "http" | "https") {
            return Err(crate::exit::usage(
                "invalid --url: expected HOST[:PORT], http://HOST[:PORT] or https://…",
            ));
        }
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(ns) = namespace {
            let value = HeaderValue::from_str(ns).context("invalid --namespace")?;
            headers.insert("x-disbatch-namespace", value);
        }
        let mut http = reqwest::Client::builder()
            .default_headers(headers)
            .user_agent(concat!("disbatch-cli/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(10));
        if let Some(path) = cacert {
            for cert in ca_certificates(path)? {
                http = http.add_root_certificate(cert);
            }
        }
        let http = http.build().context("building the HTTP client")?;
        Ok(Client { http, base, auth })
    }

    /// The URL of `segments` under the base URL, each segment percent-encoded, so queue names
    /// with `/` or spaces address one path segment as the server expects.
    pub fn endpoint(&self, segments: &[&str]) -> Url {
        endpoint(&self.base, segments)
    }

    /// Sends `body` (if any) as JSON and returns the parsed 2xx JSON response.
    pub async fn call(
        &self,
        method: Method,
        segments: &[&str],
        body: Option<&Value>,
    ) -> anyhow::Result<Reply> {
        let url = self.endpoint(segments);
        let response = self.send(method.clone(), &url, body).await?;
        let raw = response
            .bytes()
            .await
            .map_err(|e| {
                anyhow!(
                    "{method} {}: reading the response: {}",
                    shown(&url),
                    describe(e)
                )
            })?
            .to_vec();
        let value = serde_json::from_slice(&raw).map_err(|e| {
            anyhow!(
                "{method} {}: the response is not JSON ({e}): {}",
                shown(&url),
                quote(&raw)
            )
        })?;
        Ok(Reply { raw, value })
    }

    /// Copies a 2xx response body to `out` as it arrives, flushing each chunk.
    pub async fn stream(&self, segments: &[&str], out: &mut dyn Write) -> anyhow::Result<()> {
        let url = self.endpoint(segments);
        let mut response = self.send(Method::GET, &url, None).await?;
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| anyhow!("GET {}: reading the response: {}", shown(&url), describe(e)))?
        {
            out.write_all(&chunk)?;
            out.flush()?;
        }
        Ok(())
    }

    /// GETs `segments?query` and returns the response's headers and whole body.
    pub async fn get_bytes(
        &self,
        segments: &[&str],
        query: &[(&str, String)],
    ) -> anyhow::Result<(reqwest::header::HeaderMap, Vec<u8>)> {
        let mut url = self.endpoint(segments);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let response = self.send(Method::GET, &url, None).await?;
        let headers = response.headers().clone();
        let body = response
            .bytes()
            .await
            .map_err(|e| anyhow!("GET {}: reading the response: {}", shown(&url), describe(e)))?;
        Ok((headers, body.to_vec()))
    }

    /// Sends the request; a non-2xx status becomes an [`HttpError`].
    async fn send(
        &self,
        method: Method,
        url: &Url,
        body: Option<&Value>,
    ) -> anyhow::Result<Response> {
        let mut request = self.http.request(method.clone(), url.clone());
        request = match &self.auth {
            Auth::None => request,
            Auth::Basic { username, password } => request.basic_auth(username, Some(password)),
            Auth::Bearer(header) => request.header(AUTHORIZATION, header.clone()),
        };
        if let Some(body) = body {
            request = request
                .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
                .body(serde_json::to_vec(body)?);
        }
        let response = request.send().await.map_err(|e| {
            let unreachable = e.is_connect() || e.is_timeout();
            let message = format!("{method} {}: {}", shown(url), describe(e));
            if unreachable {
                anyhow::Error::new(Unreachable(message))
            } else {
                anyhow!(message)
            }
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        // The body of an error is small; a failure reading it still leaves the status to report.
        let raw = response
            .bytes()
            .await
            .map(|b| b.to_vec())
            .unwrap_or_default();
        let body = serde_json::from_slice::<Value>(&raw).ok();
        let mut message = match &body {
            Some(value) => error_message(value),
            None => quote(&raw),
        };
        if let Some(hint) = access_hint(status, &self.auth) {
            message = if message.is_empty() {
                hint.to_string()
            } else {
                format!("{message} ({hint})")
            };
        }
        Err(HttpError {
            method,
            url: shown(url),
            status,
            message,
            body,
        }
        .into())
    }
}

/// What to do about a 401 or 403, which the server's own text does not say for this client.
fn access_hint(status: StatusCode, auth: &Auth) -> Option<&'static str> {
    match (status, auth) {
        (StatusCode::UNAUTHORIZED, Auth::None) => Some(
            "the server needs a bearer token: put it in DISBATCH_TOKEN or a file given to --token-file",
        ),
        (StatusCode::UNAUTHORIZED, Auth::Bearer(_)) => {
            Some("the server refused the token from DISBATCH_TOKEN or --token-file")
        }
        (StatusCode::UNAUTHORIZED, Auth::Basic { .. }) => {
            Some("the server refused the user name and password")
        }
        (StatusCode::FORBIDDEN, _) => Some("your token's role cannot do this"),
        _ => None,
    }
}

/// The certificates of a `--cacert` PEM file; a file with none is an error, not a silent no-op.
fn ca_certificates(path: &Path) -> anyhow::Result<Vec<reqwest::Certificate>> {
    let pem =
        std::fs::read(path).with_context(|| format!("reading --cacert {}", path.display()))?;
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .with_context(|| format!("--cacert {}: not a PEM certificate file", path.display()))?;
    if certs.is_empty() {
        bail!(
            "--cacert {}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
            path.display()
        );
    }
    Ok(certs)
}

/// `host:port` and `host` as the user means them: plain http. A URL with a scheme is kept.
fn with_scheme(url: &str) -> std::borrow::Cow<'_, str> {
    if url.contains("://") {
        url.into()
    } else {
        format!("http://{url}").into()
    }
}

fn endpoint(base: &Url, segments: &[&str]) -> Url {
    let mut url = base.clone();
    url.set_query(None);
    url.set_fragment(None);
    if let Ok(mut path) = url.path_segments_mut() {
        path.pop_if_empty().extend(segments);
    }
    url
}

/// The URL as shown to the user: any `user:password@` in `--url` is left out.
fn shown(url: &Url) -> String {
    let mut url = url.clone();
    // Both fail only for URLs that cannot have credentials, which then have none to hide.
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.to_string()
}

/// reqwest's error with its causes (e.g. "connection refused"), without the URL, which may
/// hold credentials and is shown by the caller anyway.
fn describe(e: reqwest::Error) -> String {
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The server's explanation from an error body: `error` (or `status`, used by /balance) plus
/// any detail fields such as `param`, `plugin` or `invalid_params`.
pub fn error_message(body: &Value) -> String {
    let Some(object) = body.as_object() else {
        return clip(body.to_string());
    };
    let main = ["error", "status"]
        .iter()
        .find_map(|k| object.get(*k))
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string())
        });
    let Some(main) = main else {
        return clip(body.to_string());
    };
    // A search refusal's `hint` says what to do; the index list it is kept beside (for
    // Disbatch's Perl CLI) would only bury it.
    if let Some(Value::String(hint)) = object.get("hint") {
        return clip(hint.clone());
    }
    let details: Vec<String> = object
        .iter()
        .filter(|(k, _)| {
            !matches!(k.as_str(), "error" | "status" | "title" | "path")
                && !k.starts_with("MongoDB::")
        })
        .map(|(k, v)| match v.as_str() {
            Some(s) => format!("{k}: {s}"),
            None => format!("{k}: {v}"),
        })
        .collect();
    if details.is_empty() {
        main
    } else {
        clip(format!("{main} ({})", details.join(", ")))
    }
}

/// A body that is not the expected JSON, trimmed and clipped for an error message.
fn quote(raw: &[u8]) -> String {
    clip(String::from_utf8_lossy(raw).trim().to_string())
}

fn clip(mut text: String) -> String {
    if text.chars().count() > QUOTE_LIMIT {
        text = text.chars().take(QUOTE_LIMIT).collect::<String>() + "…";
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn endpoints_encode_segments_and_keep_a_base_path() {
        let base = Url::parse("http://localhost:8080").unwrap();
        assert_eq!(
            endpoint(&base, &["queues"]).as_str(),
            "http://localhost:8080/queues"
        );
        let base = Url::parse("https://h/disbatch/?x=1").unwrap();
        assert_eq!(
            endpoint(&base, &["queues", "a b/c", "retry"]).as_str(),
            "https://h/disbatch/queues/a%20b%2Fc/retry"
        );
    }

    #[test]
    fn refusals_say_what_to_do_about_them() {
        let none = access_hint(StatusCode::UNAUTHORIZED, &Auth::None).unwrap_or_default();
        assert!(
            none.contains("DISBATCH_TOKEN") && none.contains("--token-file"),
            "{none}"
        );
        let forbidden = access_hint(StatusCode::FORBIDDEN, &Auth::None).unwrap_or_default();
        assert!(forbidden.contains("role"), "{forbidden}");
        assert!(access_hint(StatusCode::NOT_FOUND, &Auth::None).is_none());
    }

    #[test]
    fn a_cacert_file_without_certificates_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let e = ca_certificates(&junk).err().unwrap().to_string();
        assert!(e.contains("--cacert") && e.contains("junk.pem"), "{e}");
        let missing = dir.path().join("missing.pem");
        let e = format!("{:#}", ca_certificates(&missing).err().unwrap());
        assert!(e.contains("missing.pem"), "{e}");
    }

    #[test]
    fn shown_urls_drop_credentials() {
        let url = Url::parse("http://user:secret@h:1/queues").unwrap();
        assert_eq!(shown(&url), "http://h:1/queues");
    }

    #[test]
    fn error_messages_from_bodies() {
        assert_eq!(
            error_message(&json!({"error": "name and plugin required"})),
            "name and plugin required"
        );
        assert_eq!(
            error_message(&json!({"error": "Invalid param", "param": "x"})),
            "Invalid param (param: x)"
        );
        assert_eq!(
            error_message(&json!({"status": "failed: invalid json passed x"})),
            "failed: invalid json passed x"
        );
        assert_eq!(
            error_message(&json!({"error": "Unknown error", "MongoDB::InsertManyResult": {}})),
            "Unknown error"
        );
        assert_eq!(
            error_message(
                &json!({"error": "non-indexed params given", "invalid_params": ["status"], "path": "/tasks", "title": "t"})
            ),
            "non-indexed params given (invalid_params: [\"status\"])"
        );
        assert_eq!(
            error_message(
                &json!({"error": "non-indexed params given", "hint": "status is not indexed: add a time range", "indexes": [["id"]]})
            ),
            "status is not indexed: add a time range"
        );
        assert_eq!(error_message(&json!([1])), "[1]");
    }
}
