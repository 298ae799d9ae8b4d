//! `/nodes`: node documents with live running counts, and ops' `maxthreads`.

use std::time::Duration;

use axum::response::Response;
use bson::{Bson, Document};
use disbatch_store::{NodeView, WriteCounts, LIVE_INTERVALS};
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
        map.insert("live".into(), Value::Bool(NodeView(d).is_live(web_window)));
        map.insert("running".into(), Value::from(running));
        // Keep the key order canonical after the inserts.
        map.sort_keys();
    }
    v
}

pub async fn list(Ns(state): Ns) -> ApiResult<Response> {
    let (nodes, running) = futures::try_join!(
        state.store.nodes().list_nodes(),
        state.store.nodes().running_per_node()
    )?;
    let window = state.config.web.live_window;
    let out: Vec<Value> = nodes
        .iter()
        .map(|d| {
            let name = NodeView(d).name();
            node_json(d, running.get(name).copied().unwrap_or(0), window)
        })
        .collect();
    Ok(json_response(&Value::Array(out), false))
}

async fn find(state: &AppState, ident: &str) -> ApiResult<Document> {
    state
        .store
        .nodes()
        .find_node(ident)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no node {ident}")))
}

pub async fn get(Ns(state): Ns, Path(ident): Path<String>) -> ApiResult<Response> {
    let d = find(&state, &ident).await?;
    let name = NodeView(&d).name().to_string();
    let running = state.store.nodes().running_per_node().await?;
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
    let id = NodeView(&node)
        .id()
        .ok_or_else(|| ApiError::bad_request(format!("node {ident} has no ObjectId _id")))?;
    let counts = state.store.nodes().set_node_maxthreads(id, value).await?;
    Ok(json_response(&envelope::update(&counts), false))
}

/// `DELETE /nodes/:node`: forgets a stale node's document. Refused (409) for a node that is
/// live by the same test as `GET /nodes` (a heartbeat within `web.live_window_ms`, or within
/// three of its own loop intervals when longer), and for a node that still holds claimed or
/// running tasks: recovery finds a dead node's lease-less tasks through its document, so
/// forgetting it would strand them.
pub async fn forget(Ns(state): Ns, Path(ident): Path<String>) -> ApiResult<Response> {
    let node = find(&state, &ident).await?;
    let view = NodeView(&node);
    let name = view.name().to_string();
    let window = view.live_window(state.config.web.live_window);
    let id = view
        .id()
        .ok_or_else(|| ApiError::bad_request(format!("node {ident} has no ObjectId _id")))?;
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
    if view.is_live(state.config.web.live_window) {
        return refuse(live(""));
    }
    let held = state.store.nodes().tasks_held_by(&name).await?;
    if held > 0 {
        return refuse(format!(
            "it still holds {held} claimed or running task(s); recovery needs its document to take them back"
        ));
    }
    if !state.store.nodes().forget_node(id, window).await? {
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
