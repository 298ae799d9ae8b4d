//! `POST /specs`: load Coordinate work specs into queues (create, or redefine and reset),
//! saying what each load changes, or only saying it (`dry_run`).

use axum::response::Response;
use bson::{Bson, Document};
use disbatch_model::work_spec::{spec_load, SpecLoad};
use serde_json::{json, Map, Value};

use crate::error::{ApiError, ApiResult};
use crate::namespace::Ns;
use crate::params::Params;
use crate::render::{self, json_response, Dates};

pub async fn load(Ns(state): Ns, p: Params) -> ApiResult<Response> {
    let p = p.given();
    let default_plugin = match p.get("plugin") {
        None => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err(ApiError::bad_request("plugin must be a string")),
    };
    let specs = match p.get("specs") {
        Some(Value::Array(specs)) if !specs.is_empty() => specs,
        _ => {
            return Err(ApiError::bad_request(
                "'specs' must be a non-empty array of work spec objects",
            ))
        }
    };
    // Every spec is checked before any is written.
    let mut loads = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let Value::Object(map) = spec else {
            return Err(ApiError::bad_request(format!(
                "specs[{i}]: must be an object"
            )));
        };
        let load = spec_load(map, default_plugin)
            .map_err(|e| ApiError::bad_request(format!("specs[{i}]: {e}")))?;
        let plugin = load.set.get_str("plugin").unwrap_or_default();
        if !state.config.plugins.is_listed(plugin) {
            return Err(ApiError::bad_request_with(
                json!({"error": format!("specs[{i}]: Unknown plugin"), "plugin": plugin}),
            ));
        }
        loads.push(load);
    }
    // Claim limits are refused while Perl nodes serve, as for `POST /queues`.
    let force = super::queue_limits::force(&p)?;
    for load in &loads {
        super::queue_limits::refuse_beside_perl(&state, &load.name, &load.set, force).await?;
    }
    let dry_run = match p.get("dry_run") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(Value::String(s)) if matches!(s.as_str(), "1" | "true") => true,
        Some(Value::String(s)) if matches!(s.as_str(), "0" | "false" | "") => false,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "dry_run must be true or false, found {other}"
            )))
        }
    };
    // What each load changes on a queue that exists, read before anything is written, so a
    // reload that resets `threads` or `sort` says so (and a dry run says it without writing).
    let mut changes = Map::new();
    for load in &loads {
        if let Some(existing) = state.store.queues().find_queue(&load.name).await? {
            changes.insert(
                load.name.clone(),
                Value::Array(spec_changes(&existing, load)),
            );
        }
    }
    let (mut created, mut updated) = (Vec::new(), Vec::new());
    for load in &loads {
        let exists = changes.contains_key(&load.name);
        let made = if dry_run {
            !exists
        } else {
            state.store.queues().upsert_spec_queue(load).await?
        };
        if made {
            created.push(load.name.clone());
        } else {
            updated.push(load.name.clone());
        }
    }
    Ok(json_response(
        &json!({"created": created, "updated": updated, "changes": changes, "dry_run": dry_run}),
        false,
    ))
}

/// The fields a spec load changes on an existing queue: `{field, old, new}`, `new` null for
/// a field it removes. `config` holds the whole definition, so it changes with any edit.
fn spec_changes(existing: &Document, load: &SpecLoad) -> Vec<Value> {
    let shown = |b: Option<&Bson>| b.map_or(Value::Null, |b| render::bson(b, Dates::Text));
    let mut out = Vec::new();
    for (k, new) in &load.set {
        let old = existing.get(k);
        if old != Some(new) {
            out.push(json!({"field": k, "old": shown(old), "new": shown(Some(new))}));
        }
    }
    for k in &load.unset {
        if let Some(old) = existing.get(*k) {
            out.push(json!({"field": k, "old": shown(Some(old)), "new": Value::Null}));
        }
    }
    out
}
