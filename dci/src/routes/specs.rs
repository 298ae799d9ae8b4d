//! `POST /specs`: load Coordinate work specs into queues (create, or redefine and reset).

use axum::response::Response;
use disbatch_core::work_spec::spec_load;
use serde_json::{json, Value};

use crate::error::{ApiError, ApiResult};
use crate::namespace::Ns;
use crate::params::Params;
use crate::render::json_response;

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
    let (mut created, mut updated) = (Vec::new(), Vec::new());
    for load in &loads {
        if state.store.upsert_spec_queue(load).await? {
            created.push(load.name.clone());
        } else {
            updated.push(load.name.clone());
        }
    }
    Ok(json_response(
        &json!({"created": created, "updated": updated}),
        false,
    ))
}
