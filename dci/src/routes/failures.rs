//! `GET /failures`: the fleet's newest failed and discarded tasks, with queue names and reasons.

use axum::response::Response;
use bson::{doc, Bson};
use disbatch_store::failures::{DEFAULT_FAILURES, MAX_FAILURES};
use serde_json::{json, Value};

use super::queues::find_id;
use crate::error::{ApiError, ApiResult};
use crate::namespace::Ns;
use crate::params::Params;
use crate::render::{self, json_response, Dates};

/// `?queue=Q` (id or name) narrows to one queue; `?limit=N` (or `.limit`), 1 to 1000, default
/// 50. Newest change first: a failed task's `mtime` is its end.
pub async fn list(Ns(state): Ns, mut p: Params) -> ApiResult<Response> {
    let dot_limit = p.options.limit.take();
    let pretty = p.options.pretty;
    let fields = p.given();
    let limit = match fields.get("limit") {
        None => dot_limit.filter(|n| *n > 0).unwrap_or(DEFAULT_FAILURES),
        Some(v) => v
            .as_i64()
            .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
            .filter(|n| (1..=MAX_FAILURES).contains(n))
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "limit must be an integer from 1 to {MAX_FAILURES}, not {v}"
                ))
            })?,
    };
    if limit > MAX_FAILURES {
        return Err(ApiError::bad_request(format!(
            "limit must be an integer from 1 to {MAX_FAILURES}, not {limit}"
        )));
    }
    let queue = match fields.get("queue") {
        None => None,
        Some(Value::String(q)) if q.is_empty() => None,
        Some(Value::String(q)) => Some(find_id(&state, q).await?),
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "queue must be a queue name or id, not {v}"
            )))
        }
    };
    let rows = state.store.failures(queue, limit).await?;
    let failures: Vec<Value> = rows
        .iter()
        .map(|f| {
            let opt_date = |d: Option<bson::DateTime>| d.map(Bson::DateTime).unwrap_or(Bson::Null);
            let d = doc! {
                "id": f.task.to_hex(),
                "queue": f.queue_name.clone().map(Bson::String).unwrap_or(Bson::Null),
                "queue_id": f.queue.map(|q| Bson::String(q.to_hex())).unwrap_or(Bson::Null),
                "status": f.status.clone(),
                "discarded": f.discarded_at.is_some(),
                "discarded_at": opt_date(f.discarded_at),
                "mtime": opt_date(f.mtime),
                "attempts": f.attempts.map(Bson::Int64).unwrap_or(Bson::Null),
                "reason": f.reason.clone().map(Bson::String).unwrap_or(Bson::Null),
                "last_attempt_end": opt_date(f.attempt_end),
                "params": f.params.clone().unwrap_or(Bson::Null),
            };
            render::document(&d, Dates::Text)
        })
        .collect();
    Ok(json_response(
        &json!({"limit": limit, "failures": failures}),
        pretty,
    ))
}
