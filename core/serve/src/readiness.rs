//! `/healthz` and `/readyz` answers: liveness is "this process serves", readiness is "the
//! database answers a ping", one ping shared by every probe for a second.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use disbatch_store::Store;

/// How long a probe waits for the database: well inside a probe's usual timeout (1–10 s).
pub const PING_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long one ping's verdict answers every probe: however many probes arrive (or however
/// hostile the caller), the database sees at most about one ping a second from this process.
pub const SHARED_FOR: Duration = Duration::from_secs(1);

/// Whether the database answers; clones share the verdict.
#[derive(Clone, Default)]
pub struct Readiness {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Set once the program has connected (a DEN serves probes before it has).
    store: OnceLock<Store>,
    /// The last verdict and when it was reached; the lock also makes probes that arrive
    /// during a ping wait for its verdict rather than send pings of their own.
    last: tokio::sync::Mutex<Option<(Instant, Verdict)>>,
    /// What was last logged (0 nothing yet, READY, UNREADY), so a long outage is logged once.
    logged: AtomicU8,
}

const READY: u8 = 1;
const UNREADY: u8 = 2;

/// A probe's verdict. Reasons are fixed texts: the probes need no token, so they tell nothing
/// about the database (its address, user or error text), which goes to the log instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ready,
    Unready(&'static str),
}

impl Readiness {
    /// Not ready until `attach` gives it the store.
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_store(store: Store) -> Self {
        let r = Self::new();
        r.attach(store);
        r
    }

    /// The store to ping from now on; a second call is ignored.
    pub fn attach(&self, store: Store) {
        let _ = self.inner.store.set(store);
    }

    /// The verdict: a recent one if there is one, else a fresh ping (at most `PING_TIMEOUT`).
    pub async fn check(&self) -> Verdict {
        let mut last = self.inner.last.lock().await;
        if let Some((at, verdict)) = *last {
            if at.elapsed() < SHARED_FOR {
                return verdict;
            }
        }
        let verdict = self.ping().await;
        *last = Some((Instant::now(), verdict));
        verdict
    }

    async fn ping(&self) -> Verdict {
        let Some(store) = self.inner.store.get() else {
            return Verdict::Unready("starting: not connected to the database yet");
        };
        match tokio::time::timeout(PING_TIMEOUT, store.ping()).await {
            Ok(Ok(())) => {
                if self.inner.logged.swap(READY, Ordering::Relaxed) == UNREADY {
                    tracing::info!("readiness: the database answers again");
                }
                Verdict::Ready
            }
            Ok(Err(e)) => {
                if self.inner.logged.swap(UNREADY, Ordering::Relaxed) != UNREADY {
                    tracing::warn!(error = %e, "readiness: the database ping failed");
                }
                Verdict::Unready("the database ping failed")
            }
            Err(_) => {
                if self.inner.logged.swap(UNREADY, Ordering::Relaxed) != UNREADY {
                    tracing::warn!(
                        timeout_ms = PING_TIMEOUT.as_millis() as u64,
                        "readiness: the database did not answer a ping in time"
                    );
                }
                Verdict::Unready("the database did not answer a ping in time")
            }
        }
    }

    /// `GET /readyz`: 200 `{"status":"ready"}`, or 503 with the reason.
    pub async fn respond(&self) -> Response {
        match self.check().await {
            Verdict::Ready => answer(StatusCode::OK, serde_json::json!({"status": "ready"})),
            Verdict::Unready(reason) => answer(
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({"status": "unready", "reason": reason}),
            ),
        }
    }
}

/// `GET /healthz`: 200 whenever the process can answer at all; it reads nothing.
pub fn healthz() -> Response {
    answer(StatusCode::OK, serde_json::json!({"status": "ok"}))
}

fn answer(status: StatusCode, body: serde_json::Value) -> Response {
    let mut r = (status, format!("{body}\n")).into_response();
    let headers = r.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    // A cached "ready" would hide an outage from whoever asks next.
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_a_store_it_is_unready_and_healthz_is_always_ok() {
        let r = Readiness::new();
        assert!(matches!(r.check().await, Verdict::Unready(_)));
        assert_eq!(r.respond().await.status(), StatusCode::SERVICE_UNAVAILABLE);
        let h = healthz();
        assert_eq!(h.status(), StatusCode::OK);
        assert_eq!(h.headers()[CACHE_CONTROL], "no-store");
    }
}
