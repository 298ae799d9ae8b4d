//! `/nodes`: node documents with live running counts, and ops' `maxthreads`.

use std::time::Duration;

use axum::response::Response;
use bson::{Bson, Document};
use disbatch_config::MAX_LOOP_INTERVAL;
use disbatch_model::fleet_time;
use disbatch_model::schema::node as field;
use disbatch_store::WriteCounts;
use serde_json::{json, Value};

use crate::envelope;
use crate::error::{ApiError, ApiResult};
use crate::namespace::Ns;
use crate::params::Params;
use crate::path::Path;
use crate::render::{self, json_response, Dates};
use crate::state::AppState;

fn node_json(d: &Document, running: u64, web_window: Duration) -> Value {
    let mut v = render::document(d, Dates::Text);
    let ts = d.get_datetime("timestamp").ok().copied();
    if let Value::Object(map) = &mut v {
        if let Ok(id) = d.get_object_id("_id") {
            map.insert("id".into(), Value::String(id.to_hex()));
        }
        if let Some(ts) = ts {
            map.insert("timestamp".into(), render::date(ts, Dates::Millis));
        }
        map.insert("live".into(), Value::Bool(is_live(d, web_window)));
        map.insert("running".into(), Value::from(running));
        // Keep the key order canonical after the inserts.
        map.sort_keys();
    }
    v
}

/// A node is live while its last heartbeat is younger than the longer of
/// `web.live_window_ms` and this many of its own loop intervals, as its document records
/// them: a node whose interval exceeds the window is not dead between two beats.
const LIVE_INTERVALS: u32 = 3;

/// How long after its last heartbeat node `d` still counts as live: `web_window`, or more for
/// a node that says it heartbeats less often (read up to the longest interval a node may have).
fn live_window(d: &Document, web_window: Duration) -> Duration {
    let interval_ms = match d.get(field::INTERVAL_MS) {
        Some(Bson::Int64(n)) => u64::try_from(*n).unwrap_or(0),
        Some(Bson::Int32(n)) => u64::try_from(*n).unwrap_or(0),
        _ => 0,
    };
    let interval = Duration::from_millis(interval_ms).min(MAX_LOOP_INTERVAL);
    web_window.max(interval * LIVE_INTERVALS)
}

/// Whether a node heartbeated within its live window: what `live` says and `DELETE` refuses on.
fn is_live(d: &Document, web_window: Duration) -> bool {
    let window = i64::try_from(live_window(d, web_window).as_millis()).unwrap_or(i64::MAX);
    // Saturating: ops can store any date, even i64::MIN milliseconds.
    let age = d.get_datetime(field::TIMESTAMP).ok().map(|t| {
        fleet_time::now()
            .timestamp_millis()
            .saturating_sub(t.timestamp_millis())
    });
    age.is_some_and(|a| a <= window)
}

pub async fn list(Ns(state): Ns) -> ApiResult<Response> {
    let (nodes, running) =
        futures::try_join!(state.store.list_nodes(), state.store.running_per_node())?;
    let window = state.config.web.live_window;
    let out: Vec<Value> = nodes
        .iter()
        .map(|d| {
            let name = d.get_str("node").unwrap_or_default();
            node_json(d, running.get(name).copied().unwrap_or(0), window)
        })
        .collect();
    Ok(json_response(&Value::Array(out), false))
}

async fn find(state: &AppState, ident: &str) -> ApiResult<Document> {
    state
        .store
        .find_node(ident)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no node {ident}")))
}

pub async fn get(Ns(state): Ns, Path(ident): Path<String>) -> ApiResult<Response> {
    let d = find(&state, &ident).await?;
    let name = d.get_str("node").unwrap_or_default().to_string();
    let running = state.store.running_per_node().await?;
    let window = state.config.web.live_window;
    Ok(json_response(
        &node_json(&d, running.get(&name).copied().unwrap_or(0), window),
        false,
    ))
}

pub async fn set_maxthreads(
    Ns(state): Ns,
    Path(ident): Path<String>,
    params: Params,
) -> ApiResult<Response> {
    let fields = params.given_keeping_null(&["maxthreads"]);
    if fields.is_empty() {
        return Err(ApiError::bad_request("No params"));
    }
    if let Some(k) = fields.keys().find(|k| *k != "maxthreads") {
        return Err(ApiError::bad_request_with(
            json!({"error": "Invalid param", "param": k}),
        ));
    }
    let value = match fields.get("maxthreads") {
        Some(Value::Null) => Bson::Null,
        Some(v) => Bson::Int64(non_negative(v).ok_or_else(|| {
            ApiError::bad_request("maxthreads must be a non-negative integer or null")
        })?),
        None => Bson::Null,
    };
    // The node reads it back with this reader: refuse here what it would refuse there.
    disbatch_model::parse_limit(Some(&value))
        .map_err(|e| ApiError::bad_request(format!("maxthreads: {e}")))?;
    let node = find(&state, &ident).await?;
    let id = node
        .get_object_id("_id")
        .map_err(|_| ApiError::bad_request(format!("node {ident} has no ObjectId _id")))?;
    let counts = state.store.set_node_maxthreads(id, value).await?;
    Ok(json_response(&envelope::update(&counts), false))
}

/// `DELETE /nodes/:node`: forgets a stale node's document. Refused (409) for a node that is
/// live by the same test as `GET /nodes` (a heartbeat within `web.live_window_ms`, or within
/// three of its own loop intervals when longer), and for a node that still holds claimed or
/// running tasks: recovery finds a dead node's lease-less tasks through its document, so
/// forgetting it would strand them.
pub async fn forget(Ns(state): Ns, Path(ident): Path<String>) -> ApiResult<Response> {
    let node = find(&state, &ident).await?;
    let name = node.get_str(field::NODE).unwrap_or_default().to_string();
    let window = live_window(&node, state.config.web.live_window);
    let id = node
        .get_object_id(field::ID)
        .map_err(|_| ApiError::bad_request(format!("node {ident} has no ObjectId _id")))?;
    let refuse = |why: String| {
        Err(ApiError::conflict(format!(
            "node {ident} was not forgotten: {why}"
        )))
    };
    let source = if window > state.config.web.live_window {
        format!("{LIVE_INTERVALS} of its loop intervals")
    } else {
        "web.live_window_ms".to_string()
    };
    let live = |why: &str| {
        format!(
            "it is live (heartbeat within the last {} ms, {source}{why})",
            window.as_millis()
        )
    };
    if is_live(&node, state.config.web.live_window) {
        return refuse(live(""));
    }
    let held = state.store.tasks_held_by(&name).await?;
    if held > 0 {
        return refuse(format!(
            "it still holds {held} claimed or running task(s); recovery needs its document to take them back"
        ));
    }
    if !state.store.forget_node(id, window).await? {
        return refuse(live("; it came back meanwhile"));
    }
    let counts = WriteCounts {
        deleted: 1,
        ..Default::default()
    };
    Ok(json_response(&envelope::delete(&counts), false))
}

/// A non-negative integer given as a JSON number or a digit string (form bodies).
pub fn non_negative(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().filter(|n| *n >= 0),
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse().ok()
        }
        _ => None,
    }
}
