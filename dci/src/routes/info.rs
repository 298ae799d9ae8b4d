//! `GET /info` and `GET /plugins`: what this DCI serves and which plugins queues may use.

use std::collections::BTreeMap;

use axum::response::Response;
use serde_json::{json, Value};

use super::table;
use crate::error::ApiResult;
use crate::namespace::Ns;
use crate::render::json_response;

pub async fn info(Ns(state): Ns) -> ApiResult<Response> {
    let legacy = state.legacy_routes();
    let mut routes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in table().into_iter().filter(|r| legacy || !r.legacy) {
        routes
            .entry(r.method.to_string())
            .or_default()
            .push(r.path.replace('{', ":").replace('}', ""));
    }
    let mut extensions = state.config.web_extensions.clone();
    extensions.sort();
    Ok(json_response(
        &json!({"database": state.config.database, "web_extensions": extensions, "routes": routes}),
        false,
    ))
}

pub async fn plugins(Ns(state): Ns) -> ApiResult<Response> {
    let names: Vec<Value> = state
        .config
        .plugins
        .names()
        .map(|n| Value::String(n.to_string()))
        .collect();
    Ok(json_response(&Value::Array(names), false))
}
