//! Disbatch 4.0's task routes (`Disbatch::Web::Tasks`), loaded only when `web_extensions` names them.

use axum::response::Response;
use bson::{Bson, Document};
use serde_json::{json, Map, Value};

use super::full_output;
use super::nodes::non_negative;
use super::queues::resolve_queue;
use super::tasks_create::create_from;
use super::tasks_search::task_json;
use crate::error::{ApiError, ApiResult};
use crate::namespace::Ns;
use crate::params::{without_nulls, Options, Params};
use crate::path::Path;
use crate::render::json_response;
use crate::state::AppState;

fn enabled(state: &AppState) -> ApiResult<()> {
    if state.legacy_routes() {
        Ok(())
    } else {
        Err(ApiError::not_found(
            "legacy task routes are not loaded (add Disbatch::Web::Tasks to web_extensions)",
        ))
    }
}

/// `POST /tasks/search {filter, options, count, terse, pretty}`: an arbitrary-filter search.
pub async fn search(Ns(state): Ns, params: Params) -> ApiResult<Response> {
    enabled(&state)?;
    // The keys around the filter are settings (Disbatch's CLI sends `"options": null` and
    // `"filter": null` when not given); the filter's own nulls are data ("is null").
    let p = params.given();
    let (filter, options) = match (p.get("filter"), p.get("options")) {
        (None | Some(Value::Object(_)), None | Some(Value::Object(_))) => (
            p.get("filter").cloned().unwrap_or(json!({})),
            match p.get("options") {
                Some(Value::Object(o)) => without_nulls(o.clone()),
                _ => Map::new(),
            },
        ),
        _ => {
            return Err(ApiError::bad_request(
                "filter and options must be name/value objects",
            ))
        }
    };
    let filter = legacy_filter(&state, filter).await?;
    let flag = |k: &str, default: bool| {
        p.get(k)
            .map_or(default, |v| v.as_bool().unwrap_or(v.as_i64() == Some(1)))
    };
    if flag("count", false) {
        let n = state.store.tasks().count_tasks(filter).await?;
        return Ok(json_response(&json!({"count": n}), flag("pretty", false)));
    }
    let count_option = |k: &str, default: i64| match options.get(k) {
        None => Ok(default),
        Some(v) => non_negative(v).ok_or_else(|| {
            ApiError::bad_request(format!("options.{k} must be a non-negative integer"))
        }),
    };
    let limit = count_option("limit", 100)?;
    if limit > 100 {
        return Err(ApiError::bad_request("limit cannot exceed 100"));
    }
    let skip = count_option("skip", 0)? as u64;
    let terse = flag("terse", true);
    let o = Options {
        terse,
        full: !terse,
        epoch: true,
        ..Options::default()
    };
    let docs = state
        .store
        .tasks()
        .find_tasks(filter, None, skip, limit)
        .await?;
    let mut out = Vec::with_capacity(docs.len());
    let budget = full_output::Budget::default();
    for d in docs {
        out.push(task_json(&state, d, &o, &budget).await?);
    }
    Ok(json_response(&Value::Array(out), flag("pretty", false)))
}

/// `{"$oid"}` values become ids (a bad one is a 400), `queue` strings become ids, and
/// `ctime`/`mtime` numbers above 9999999999 are milliseconds.
async fn legacy_filter(state: &AppState, filter: Value) -> ApiResult<Document> {
    let mut filter = match filter {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    if let Some(Value::String(q)) = filter.get("queue").cloned() {
        let id = resolve_queue(state, &Value::String(q)).await?;
        filter.insert("queue".into(), json!({"$oid": id.to_hex()}));
    }
    check_oids(&Value::Object(filter.clone()))?;
    let mut doc = disbatch_model::text::client_json::query_filter(&Value::Object(filter), "filter")
        .map_err(ApiError::bad_request)?;
    for field in ["ctime", "mtime"] {
        let ms = match doc.get(field) {
            Some(Bson::Int64(n)) if *n > 9_999_999_999 => Some(*n),
            Some(Bson::Double(f)) if *f > 9_999_999_999.0 => Some(*f as i64),
            _ => None,
        };
        if let Some(ms) = ms {
            doc.insert(field, bson::DateTime::from_millis(ms));
        }
    }
    Ok(doc)
}

fn check_oids(v: &Value) -> ApiResult<()> {
    match v {
        Value::Object(m) => {
            if let Some(oid) = m.get("$oid") {
                let text = oid.as_str().unwrap_or_default();
                if bson::oid::ObjectId::parse_str(text).is_err() {
                    return Err(ApiError::bad_request(format!("Bad OID passed: {oid}")));
                }
            }
            m.values().try_for_each(check_oids)
        }
        Value::Array(items) => items.iter().try_for_each(check_oids),
        _ => Ok(()),
    }
}

/// `POST /tasks/:queue` with a JSON array of params.
pub async fn create_in_queue(
    Ns(state): Ns,
    Path(queue): Path<String>,
    p: Params,
) -> ApiResult<Response> {
    enabled(&state)?;
    let mut p = p;
    // The body is the task params themselves: data, nulls and all.
    let params = match p.body.take() {
        Some(body) => body,
        None => Value::Object(p.data()),
    };
    let mut fields = Map::new();
    fields.insert("queue".into(), Value::String(queue));
    fields.insert("params".into(), params);
    create_from(&state, &fields).await
}

/// `POST /tasks/:queue/:collection` with `{filter, params}`.
pub async fn create_from_collection(
    Ns(state): Ns,
    Path((queue, collection)): Path<(String, String)>,
    params: Params,
) -> ApiResult<Response> {
    enabled(&state)?;
    let mut fields = params.given();
    fields.insert("queue".into(), Value::String(queue));
    fields.insert("collection".into(), Value::String(collection));
    fields.entry("filter").or_insert(json!({}));
    create_from(&state, &fields).await
}
