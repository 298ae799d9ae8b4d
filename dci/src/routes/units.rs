//! `POST /queues/:queue/units`: Coordinate work units, keyed, added or updated as asked.

use std::collections::HashSet;

use axum::response::Response;
use bson::{DateTime, Document};
use disbatch_store::{OnConflict, Unit, Waits};
use serde_json::{json, Value};

use super::queues::find_id;
use crate::error::{ApiError, ApiResult};
use crate::namespace::Ns;
use crate::params::Params;
use crate::path::Path;
use crate::render::json_response;

pub async fn add(Ns(state): Ns, Path(ident): Path<String>, p: Params) -> ApiResult<Response> {
    let p = p.given();
    let on_conflict = match p.get("on_conflict") {
        None => OnConflict::Reject,
        Some(Value::String(s)) if s == "reject" => OnConflict::Reject,
        Some(Value::String(s)) if s == "update" => OnConflict::Update,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "on_conflict must be reject or update, not {other}"
            )))
        }
    };
    let items = match p.get("units") {
        Some(Value::Array(items)) if !items.is_empty() => items,
        _ => {
            return Err(ApiError::bad_request(
                "'units' must be a non-empty array of {key, params} objects",
            ))
        }
    };
    let mut seen = HashSet::new();
    let mut units = Vec::with_capacity(items.len());
    let mut waits = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        waits.push(parse_waits(item, i)?);
        let unit =
            parse_unit(item).map_err(|e| ApiError::bad_request(format!("units[{i}]: {e}")))?;
        if !seen.insert(unit.key.clone()) {
            return Err(ApiError::bad_request(format!(
                "units[{i}]: key {:?} appears twice",
                unit.key
            )));
        }
        units.push(unit);
    }
    let queue = find_id(&state, &ident).await?;
    let out = state
        .store
        .workflows()
        .add_waiting_units(queue, units, &waits, on_conflict)
        .await?;
    let inserted: Vec<Value> = out
        .inserted
        .iter()
        .map(|(k, id)| json!({"key": k, "_id": {"$oid": id.to_hex()}}))
        .collect();
    // `duplicates`: units of a queue with `unique` whose unique key another task holds,
    // neither added nor updated, with that task's id.
    let duplicates: Vec<Value> = out
        .duplicates
        .iter()
        .map(|(k, id)| json!({"key": k, "_id": {"$oid": id.to_hex()}}))
        .collect();
    Ok(json_response(
        &json!({"inserted": inserted, "updated": out.updated, "rejected": out.rejected,
                "busy": out.busy, "duplicates": duplicates}),
        false,
    ))
}

/// A unit's `depends_on` (task ids) and `on_dependency_failure`, if it gives them.
fn parse_waits(v: &Value, i: usize) -> ApiResult<Waits> {
    let Value::Object(m) = v else {
        return Ok(Waits::default());
    };
    let path = format!("units[{i}].");
    let waits = Waits {
        depends_on: match m.get("depends_on") {
            None | Some(Value::Null) => Vec::new(),
            Some(deps) => super::workflows::task_ids(deps, &format!("{path}depends_on"))?,
        },
        on_failure: super::workflows::policy(m, &path)?,
    };
    if waits.depends_on.is_empty() && waits.on_failure.is_some() {
        return Err(ApiError::bad_request(format!(
            "{path}on_dependency_failure needs depends_on"
        )));
    }
    Ok(waits)
}

fn parse_unit(v: &Value) -> Result<Unit, String> {
    let Value::Object(m) = v else {
        return Err("must be an object".into());
    };
    if let Some(k) = m.keys().find(|k| {
        !matches!(
            k.as_str(),
            "key" | "params" | "priority" | "not_before" | "depends_on" | "on_dependency_failure"
        )
    }) {
        return Err(format!("unknown field {k:?}"));
    }
    let key = match m.get("key") {
        Some(Value::String(k)) if k.len() <= 1024 => k.clone(),
        _ => return Err("key must be a string of at most 1024 bytes".into()),
    };
    let params = match m.get("params") {
        None | Some(Value::Null) => Document::new(),
        Some(v @ Value::Object(_)) => disbatch_model::text::client_json::task_params(v, "params")?,
        Some(_) => return Err("params must be an object".into()),
    };
    let priority = match m.get("priority") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_f64()
                .filter(|p| p.is_finite())
                .ok_or("priority must be a number")?,
        ),
    };
    let not_before = match m.get("not_before") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => {
            let secs = n
                .as_f64()
                .ok_or("not_before must be epoch seconds or an RFC 3339 date")?;
            Some(DateTime::from_millis((secs * 1000.0) as i64))
        }
        Some(Value::String(s)) => Some(
            DateTime::parse_rfc3339_str(s)
                .map_err(|_| format!("not_before {s:?} is not an RFC 3339 date"))?,
        ),
        Some(_) => return Err("not_before must be epoch seconds or an RFC 3339 date".into()),
    };
    Ok(Unit {
        key,
        params,
        priority,
        not_before,
    })
}
