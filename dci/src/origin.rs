//! Who may talk to the DCI from a browser: the Host check (against DNS rebinding) and the
//! Origin check (against cross-site requests that change data), one middleware that runs
//! before the token gate and before any body is read.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{CONTENT_TYPE, HOST, ORIGIN, REFERER, USER_AGENT};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use disbatch_config::{is_ip_literal, normal_host, split_host_port, WebOrigin, WebSettings};

use crate::error::ApiError;

const SEC_FETCH_SITE: &str = "sec-fetch-site";

/// The hosts and origins this DCI answers, from `web` settings and how it listens.
#[derive(Debug, Clone)]
pub struct Policy {
    any_host: bool,
    /// Lowercase names; `*.name` matches one more label.
    hosts: Vec<String>,
    origins: Vec<WebOrigin>,
}

/// Why a request is refused; each is a 403 whose text says what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Host(String),
    /// A header that names one thing given more than once: which one counts would be the
    /// reader's guess, and a proxy's and ours could differ.
    Repeated(&'static str),
    Origin {
        origin: String,
        method: Method,
    },
    CrossSite {
        method: Method,
    },
    BrowserForm {
        method: Method,
        content_type: String,
    },
}

impl Refusal {
    fn message(&self) -> String {
        match self {
            Refusal::Host(host) => {
                format!("host '{host}' is not allowed: add it to web.allowed_hosts")
            }
            Refusal::Repeated(header) => {
                format!("the {header} header is given more than once; send it once")
            }
            Refusal::Origin { origin, method } if origin == "null" => format!(
                "origin 'null' may not send {method} requests: pages without an origin \
                 (sandboxed frames, files) cannot change queues or tasks"
            ),
            Refusal::Origin { origin, method } => format!(
                "origin '{origin}' may not send {method} requests: pages of other sites \
                 cannot change queues or tasks; add it to web.allowed_origins to allow it"
            ),
            Refusal::CrossSite { method } => format!(
                "cross-site {method} refused (Sec-Fetch-Site: cross-site): pages of other \
                 sites cannot change queues or tasks"
            ),
            Refusal::BrowserForm {
                method,
                content_type,
            } => format!(
                "{method} from a browser without an Origin header and with content type \
                 '{content_type}' refused: a form on another site could send it; send \
                 Content-Type: application/json"
            ),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        ApiError::with(StatusCode::FORBIDDEN, self.message()).into_response()
    }
}

impl Policy {
    /// Allowed hosts: IP literals, `localhost`, `machine` (the hostname), the host of
    /// `listen`, `names` (the TLS certificate's) and `web.allowed_hosts`; allowed origins:
    /// the request's own and `web.allowed_origins`.
    pub fn new(web: &WebSettings, listen: &str, machine: Option<String>, names: &[String]) -> Self {
        let mut hosts: Vec<String> = vec!["localhost".into()];
        hosts.extend(machine.map(|m| normal_host(&m)));
        if let Some((host, _)) = split_host_port(listen) {
            hosts.push(normal_host(host));
        }
        hosts.extend(names.iter().map(|n| normal_host(n)));
        hosts.extend(web.allowed_hosts.iter().cloned());
        hosts.sort();
        hosts.dedup();
        Policy {
            any_host: hosts.iter().any(|h| h == "*"),
            hosts,
            origins: web.allowed_origins.clone(),
        }
    }

    fn host_allowed(&self, host: &str) -> bool {
        let host = normal_host(host);
        self.any_host
            || is_ip_literal(&host)
            || self
                .hosts
                .iter()
                .any(|allowed| match allowed.strip_prefix("*.") {
                    Some(parent) => host
                        .strip_suffix(parent)
                        .and_then(|label| label.strip_suffix('.'))
                        .is_some_and(|label| !label.is_empty() && !label.contains('.')),
                    None => *allowed == host,
                })
    }

    /// The decision for one request, from its method, target and headers.
    pub fn check(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Result<(), Refusal> {
        for (header, name) in [(HOST, "Host"), (ORIGIN, "Origin")] {
            if headers.get_all(header).iter().nth(1).is_some() {
                return Err(Refusal::Repeated(name));
            }
        }
        let host = headers
            .get(HOST)
            .map(|h| String::from_utf8_lossy(h.as_bytes()));
        // An absolute target (and HTTP/2's :authority) names a host too: both must pass.
        let named = host
            .as_deref()
            .into_iter()
            .chain(uri.authority().map(|a| a.as_str()));
        for name in named {
            match split_host_port(name.trim()) {
                Some((h, _)) if self.host_allowed(h) => {}
                _ => return Err(Refusal::Host(shown(name))),
            }
        }
        // A request without any host names nothing a rebinding could have changed, and no
        // browser sends one: it goes on (HTTP/1.0 clients, health checks).
        if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
            return Ok(());
        }
        let authority = host
            .as_deref()
            .or_else(|| uri.authority().map(|a| a.as_str()))
            .unwrap_or_default();
        if let Some(origin) = headers.get(ORIGIN) {
            let origin = String::from_utf8_lossy(origin.as_bytes());
            let origin = origin.trim();
            return match WebOrigin::parse(origin) {
                Ok(o) if same_origin(&o, authority) || self.origins.contains(&o) => Ok(()),
                _ => Err(Refusal::Origin {
                    origin: shown(origin),
                    method: method.clone(),
                }),
            };
        }
        let fetch_site = text(headers, SEC_FETCH_SITE).map(|s| s.to_ascii_lowercase());
        if fetch_site.as_deref() == Some("cross-site") {
            return Err(Refusal::CrossSite {
                method: method.clone(),
            });
        }
        let content_type = text(headers, CONTENT_TYPE.as_str()).unwrap_or_default();
        if is_json(&content_type) {
            // Browsers send JSON across sites only after a CORS preflight, which this API
            // never grants.
            return Ok(());
        }
        // A cross-site form cannot set User-Agent and every browser sends Mozilla/…, so
        // clients without it (curl, Perl Disbatch's LWP) keep posting forms.
        let browser = text(headers, USER_AGENT.as_str()).is_some_and(|ua| ua.contains("Mozilla/"))
            || fetch_site.is_some_and(|s| s != "same-origin" && s != "none")
            || text(headers, REFERER.as_str()).is_some_and(|r| !same_origin_url(&r, authority));
        if browser {
            return Err(Refusal::BrowserForm {
                method: method.clone(),
                content_type: shown(&content_type),
            });
        }
        Ok(())
    }
}

/// A browser's origin is the request's own when its host and port are the `Host` header's
/// (a `Host` without port has the origin scheme's default: a TLS-terminating proxy in front
/// keeps the page's origin and the Host it was sent to).
fn same_origin(origin: &WebOrigin, authority: &str) -> bool {
    match split_host_port(authority.trim()) {
        Some((host, port)) => {
            normal_host(host) == origin.host && port.unwrap_or(origin.port) == origin.port
        }
        None => false,
    }
}

/// A Referer is a URL: its origin is what comes before the path.
fn same_origin_url(url: &str, authority: &str) -> bool {
    let Some((scheme, rest)) = url.split_once("://") else {
        return false;
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    WebOrigin::parse(&format!("{scheme}://{}", &rest[..end]))
        .is_ok_and(|o| same_origin(&o, authority))
}

fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json")
}

fn text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_string())
}

/// Header values echoed in refusals are cut: they come from the client.
fn shown(value: &str) -> String {
    const MAX: usize = 200;
    match value.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &value[..at]),
        None => value.to_string(),
    }
}

/// Router middleware: refused requests get 403 before routing, the token gate and the body.
pub async fn guard(State(policy): State<Arc<Policy>>, req: Request, next: Next) -> Response {
    match policy.check(req.method(), req.uri(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            tracing::info!(method = %req.method(), path = %req.uri().path(), reason = %refusal.message(), "refused");
            refusal.into_response()
        }
    }
}

#[cfg(test)]
#[path = "origin_tests.rs"]
mod tests;
