//! `POST /tasks`: one task, many, or one per document of another collection (Disbatch's shapes).

use axum::response::Response;
use bson::oid::ObjectId;
use bson::Document;
use disbatch_core::client_json;
use disbatch_core::store::{Created, Template, Waits};
use serde_json::{json, Map, Value};

use crate::envelope;
use crate::error::{ApiError, ApiResult};
use crate::namespace::Ns;
use crate::params::Params;
use crate::render::json_response;
use crate::state::AppState;

const NOT_ARRAY: &str = "'params' must be a JSON array of task params objects";
const EMPTY_OBJECT: &str =
    "'params' must be a JSON array of task params objects with key/value pairs";

pub async fn create(Ns(state): Ns, p: Params) -> ApiResult<Response> {
    // A bare array body is params for a queue given elsewhere; here there is none.
    if p.body.is_some() {
        return Err(ApiError::bad_request("invalid parameters passed"));
    }
    create_from(&state, &p.given()).await
}

/// The shared creation path (the legacy routes rewrite their input into this shape).
pub async fn create_from(state: &AppState, fields: &Map<String, Value>) -> ApiResult<Response> {
    let queue = match fields.get("queue") {
        Some(q) => resolve_queue(state, q).await?,
        None => return Err(ApiError::bad_request("invalid parameters passed")),
    };
    let mut keys: Vec<&str> = fields
        .keys()
        .map(String::as_str)
        .filter(|k| !matches!(*k, "depends_on" | "on_dependency_failure"))
        .collect();
    keys.sort_unstable();
    let waits = Waits {
        depends_on: match fields.get("depends_on") {
            Some(v) => super::workflows::task_ids(v, "depends_on")?,
            None => Vec::new(),
        },
        on_failure: super::workflows::policy(fields, "")?,
    };
    if waits.depends_on.is_empty() && waits.on_failure.is_some() {
        return Err(ApiError::bad_request(
            "on_dependency_failure needs depends_on: a task that waits for nothing has no dependency to fail",
        ));
    }
    let created = match keys.as_slice() {
        ["params", "queue"] if !waits.depends_on.is_empty() => {
            let params = params_list(&fields["params"])?;
            state
                .store
                .create_waiting_tasks(queue, params, &waits)
                .await?
        }
        ["collection", "filter", "params", "queue"] if !waits.depends_on.is_empty() => {
            return Err(ApiError::bad_request(
                "depends_on is for tasks given by params, not tasks made from a collection",
            ))
        }
        ["params", "queue"] => {
            let params = params_list(&fields["params"])?;
            state.store.create_tasks(queue, params).await?
        }
        ["collection", "filter", "params", "queue"] => {
            let collection = match &fields["collection"] {
                Value::String(s) if !s.is_empty() => s.clone(),
                _ => {
                    return Err(ApiError::bad_request(
                        "'collection' required and must be a scalar (string)'",
                    ))
                }
            };
            let filter = match &fields["filter"] {
                v @ Value::Object(_) => {
                    client_json::query_filter(v, "filter").map_err(ApiError::bad_request)?
                }
                _ => return Err(ApiError::bad_request("'filter' must be a JSON object")),
            };
            let template = match &fields["params"] {
                v @ Value::Object(_) => Template(to_document(v, "params")?),
                _ => return Err(ApiError::bad_request(NOT_ARRAY)),
            };
            let created = state
                .store
                .insert_tasks_from_collection(queue, &collection, filter, &template)
                .await?;
            if created.ids.is_empty() {
                let mut out = envelope::insert_many(&[]);
                if let Value::Object(m) = &mut out {
                    m.insert("error".into(), Value::String("Unknown error".into()));
                }
                return Err(ApiError::bad_request_with(out));
            }
            created
        }
        _ => return Err(ApiError::bad_request("invalid parameters passed")),
    };
    Ok(json_response(&created_reply(&created), false))
}

/// Disbatch's InsertManyResult with the new tasks under their input indexes. For a queue
/// with `unique`, also which inputs were duplicates of existing tasks (`duplicates`, by input
/// index with the existing task's id) and how many of each; for a single task, whether it was
/// a duplicate and its id (`duplicate`, `id`). A plain queue's reply is Disbatch's exactly.
fn created_reply(created: &Created) -> Value {
    let oid = |id: &ObjectId| json!({"$oid": id.to_hex()});
    let listed = |tasks: Vec<(usize, ObjectId)>| -> Vec<Value> {
        tasks
            .iter()
            .map(|(i, id)| json!({"_id": oid(id), "index": i}))
            .collect()
    };
    let new = created.new_tasks();
    let mut out = envelope::insert_many(&[]);
    if let Some(result) = out
        .get_mut("MongoDB::InsertManyResult")
        .and_then(Value::as_object_mut)
    {
        result.insert("inserted".into(), Value::Array(listed(new.clone())));
    }
    if !created.unique {
        return out;
    }
    if let Value::Object(m) = &mut out {
        let duplicates = created.duplicate_tasks();
        m.insert(
            "counts".into(),
            json!({"created": new.len(), "duplicates": duplicates.len()}),
        );
        m.insert("duplicates".into(), Value::Array(listed(duplicates)));
        if let [only] = created.ids.as_slice() {
            m.insert("duplicate".into(), Value::Bool(new.is_empty()));
            m.insert("id".into(), oid(only));
        }
    }
    out
}

/// `queue` is an id or a name; unknown → Disbatch's 400 "queue not found".
pub async fn resolve_queue(state: &AppState, q: &Value) -> ApiResult<ObjectId> {
    let ident = match q {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("$oid")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        other => other.to_string(),
    };
    let found = state.store.find_queue(&ident).await?;
    found
        .and_then(|d| d.get_object_id("_id").ok())
        .ok_or_else(|| ApiError::bad_request("queue not found"))
}

fn params_list(v: &Value) -> ApiResult<Vec<Document>> {
    let items: Vec<&Value> = match v {
        Value::Object(_) => vec![v],
        Value::Array(items) if !items.is_empty() => items.iter().collect(),
        _ => return Err(ApiError::bad_request(NOT_ARRAY)),
    };
    let many = items.len() > 1;
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::Object(o) if o.is_empty() => Err(ApiError::bad_request(EMPTY_OBJECT)),
            Value::Object(_) if many => to_document(item, &format!("params[{i}]")),
            Value::Object(_) => to_document(item, "params"),
            _ => Err(ApiError::bad_request(NOT_ARRAY)),
        })
        .collect()
}

/// JSON to BSON, reading Extended JSON (`{"$oid": …}`, `{"$date": …}`) as its types and
/// refusing what cannot be stored and queried safely, with the path of the value at fault.
fn to_document(v: &Value, path: &str) -> ApiResult<Document> {
    client_json::storable_document(v, path).map_err(ApiError::bad_request)
}
