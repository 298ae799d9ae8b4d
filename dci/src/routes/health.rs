//! `GET /healthz` and `GET /readyz`: public, for probes that cannot carry a token; they
//! answer only "up" and "the database answers" (see `disbatch_serve::readiness`).

use axum::extract::State;
use axum::response::Response;

use crate::state::AppState;

pub async fn healthz() -> Response {
    disbatch_serve::readiness::healthz()
}

/// Pings the configured database (never a request's namespace), shared across probes.
pub async fn readyz(State(state): State<AppState>) -> Response {
    state.readiness.respond().await
}
