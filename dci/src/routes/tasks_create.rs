//! `POST /tasks`: one task, many, one per document of another collection (Disbatch's shapes), or
//! many each with its own time and priority (`tasks`).

use std::time::Duration;

use axum::response::Response;
use bson::oid::ObjectId;
use bson::{Bson, DateTime, Document};
use disbatch_model::fleet_time;
use disbatch_model::text::client_json;
use disbatch_store::{Created, Template, Timing, Waits};
use serde_json::{json, Map, Value};

use super::queues::resolve_queue;
use crate::envelope;
use crate::error::{ApiError, ApiResult};
use crate::namespace::Ns;
use crate::params::Params;
use crate::render::json_response;
use crate::state::AppState;

const NOT_ARRAY: &str = "'params' must be a JSON array of task params objects";
const EMPTY_OBJECT: &str =
    "'params' must be a JSON array of task params objects with key/value pairs";

/// Every key `POST /tasks` reads; any other is refused by name.
const KEYS: [&str; 11] = [
    "queue",
    "params",
    "tasks",
    "collection",
    "filter",
    "depends_on",
    "on_dependency_failure",
    "not_before",
    "delay_s",
    "priority",
    "answer",
];

/// The longest `delay_s` taken: a century, far past any sane schedule and well inside what a
/// BSON date holds, so a typo of a few digits is refused rather than stored as year 30000.
const MAX_DELAY_S: f64 = 100.0 * 365.25 * 86_400.0;

/// Which answer a creation gets. The shape is chosen by a body key, not a route or an
/// `Accept` header: a key travels in every form the route reads (JSON, form, query string),
/// is checked with the other keys (a misspelt one is refused by name, where an unknown
/// media type would quietly get the default), and needs no second route to document,
/// authorise and keep in step. Disbatch's shape stays the default: its Perl tools parse it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Disbatch,
    Ids,
}

pub async fn create(Ns(state): Ns, p: Params) -> ApiResult<Response> {
    // A bare array body is params for a queue given elsewhere; here there is none.
    if p.body.is_some() {
        return Err(ApiError::bad_request(
            "the body must be a JSON object {\"queue\": …, \"params\": …}, not an array: POST /tasks has no queue in its path",
        ));
    }
    create_from(&state, &p.given()).await
}

/// The shared creation path (the legacy routes rewrite their input into this shape).
pub async fn create_from(state: &AppState, fields: &Map<String, Value>) -> ApiResult<Response> {
    let queue = match fields.get("queue") {
        Some(q) => resolve_queue(state, q).await?,
        None => {
            return Err(ApiError::bad_request(
                "queue is required: the id or name of the queue to add the tasks to",
            ))
        }
    };
    check_fields(fields)?;
    let timing = timing(fields).map_err(ApiError::bad_request)?;
    let answer = match fields.get("answer") {
        None => Answer::Disbatch,
        Some(Value::String(s)) if s == "disbatch" => Answer::Disbatch,
        Some(Value::String(s)) if s == "ids" => Answer::Ids,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "answer must be \"ids\" or \"disbatch\" (the default), not {other}"
            )))
        }
    };
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
    let from_collection = fields.contains_key("collection");
    let created = if from_collection && !waits.depends_on.is_empty() {
        return Err(ApiError::bad_request(
            "depends_on is for tasks given by params, not tasks made from a collection",
        ));
    } else if !from_collection {
        let (params, timings) = match fields.get("tasks") {
            Some(tasks) => task_list(tasks, &timing)?,
            None => {
                let params = params_list(&fields["params"])?;
                let timings = vec![timing; params.len()];
                (params, timings)
            }
        };
        if waits.depends_on.is_empty() {
            state
                .store
                .tasks()
                .create_tasks_at(queue, params, &timings)
                .await?
        } else {
            state
                .store
                .workflows()
                .create_waiting_tasks_at(queue, params, &waits, &timings)
                .await?
        }
    } else {
        tasks_from_collection(state, queue, fields, &timing, answer).await?
    };
    let out = match answer {
        Answer::Disbatch => created_reply(&created),
        Answer::Ids => ids_reply(&created),
    };
    Ok(json_response(&out, false))
}

/// The task fields sent beside the params: `not_before` or `delay_s`, and `priority`. Form
/// bodies send every value as text, so numbers may come as their digits.
fn timing(fields: &Map<String, Value>) -> Result<Timing, String> {
    let not_before = match (fields.get("not_before"), fields.get("delay_s")) {
        (Some(_), Some(_)) => return Err(
            "not_before and delay_s cannot both be given: each says when the tasks may first run"
                .into(),
        ),
        (Some(v), None) => Some(not_before(v)?),
        (None, Some(v)) => Some(delay(v)?),
        (None, None) => None,
    };
    let priority = match fields.get("priority") {
        None => None,
        Some(v) => Some(priority(v)?),
    };
    Ok(Timing {
        not_before,
        priority,
    })
}

const NOT_BEFORE_FORMS: &str = "an ISO-8601 UTC time (\"2030-01-01T00:00:00Z\") or {\"$date\": …}";

fn not_before(v: &Value) -> Result<DateTime, String> {
    match v {
        // The API's own dates are UTC without a zone: read back as they are written.
        Value::String(s) => DateTime::parse_rfc3339_str(s)
            .or_else(|_| DateTime::parse_rfc3339_str(format!("{s}Z")))
            .map_err(|_| format!("not_before must be {NOT_BEFORE_FORMS}, not {v}")),
        Value::Object(o) if o.contains_key("$date") => {
            match client_json::storable(v, "not_before")? {
                Bson::DateTime(t) => Ok(t),
                _ => Err(format!("not_before must be {NOT_BEFORE_FORMS}, not {v}")),
            }
        }
        _ => Err(format!("not_before must be {NOT_BEFORE_FORMS}, not {v}")),
    }
}

/// `delay_s` from now on the fleet's clock (the database server's), which every node claims
/// by: a host whose clock is off would otherwise delay its tasks by its error too.
fn delay(v: &Value) -> Result<DateTime, String> {
    let secs = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    match secs {
        Some(s) if s.is_finite() && (0.0..=MAX_DELAY_S).contains(&s) => {
            Ok(fleet_time::after(Duration::from_secs_f64(s)))
        }
        Some(s) if s.is_finite() && s > MAX_DELAY_S => Err(format!(
            "delay_s must be at most {MAX_DELAY_S} seconds (a century), not {v}"
        )),
        _ => Err(format!(
            "delay_s must be a non-negative number of seconds, not {v}"
        )),
    }
}

fn priority(v: &Value) -> Result<i64, String> {
    let p = match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse::<i64>().ok(),
        _ => None,
    };
    p.ok_or_else(|| format!("priority must be an integer (higher is claimed first), not {v}"))
}

/// The answer asked for with `"answer": "ids"`: per input, in order, the id of its task (new,
/// or for a duplicate the existing task it matched), and the duplicates by input index. A
/// client reads one id per input it sent, whatever the queue.
fn ids_reply(created: &Created) -> Value {
    let ids: Vec<String> = created.ids.iter().map(|id| id.to_hex()).collect();
    let duplicates: Vec<Value> = created
        .duplicate_tasks()
        .iter()
        .map(|(i, id)| json!({"index": i, "matched": id.to_hex()}))
        .collect();
    json!({
        "ids": ids,
        "created": created.ids.len() - duplicates.len(),
        "duplicates": duplicates,
    })
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

/// Refuses a `POST /tasks` whose fields do not go together, naming what is wrong.
fn check_fields(fields: &Map<String, Value>) -> ApiResult<()> {
    if let Some(k) = fields.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "unknown field {k:?}: POST /tasks takes {}",
            KEYS.join(", ")
        )));
    }
    match (fields.contains_key("params"), fields.contains_key("tasks")) {
        (false, false) => {
            return Err(ApiError::bad_request(
                "params is required: a task's params object, or an array of them (or tasks: an array of {params, not_before, delay_s, priority})",
            ))
        }
        (true, true) => {
            return Err(ApiError::bad_request(
                "tasks and params cannot both be given: tasks lists each task with its params",
            ))
        }
        (false, true) if fields.contains_key("collection") => {
            return Err(ApiError::bad_request(
                "tasks is for tasks given one by one, not tasks made from a collection (which take params as their template)",
            ))
        }
        _ => {}
    }
    match (
        fields.contains_key("collection"),
        fields.contains_key("filter"),
    ) {
        (true, false) => {
            return Err(ApiError::bad_request(
                "collection needs filter: a JSON object choosing its documents ({} for all)",
            ))
        }
        (false, true) => {
            return Err(ApiError::bad_request(
                "filter needs collection: the collection whose documents make the tasks",
            ))
        }
        _ => {}
    }
    Ok(())
}

/// Tasks made from the documents of `collection` that `filter` matches, `params` their
/// template. None matching is an error: Disbatch's, or for `answer: ids` one that says why.
async fn tasks_from_collection(
    state: &AppState,
    queue: ObjectId,
    fields: &Map<String, Value>,
    timing: &Timing,
    answer: Answer,
) -> ApiResult<Created> {
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
        .tasks()
        .insert_tasks_from_collection(queue, &collection, filter, &template, timing)
        .await?;
    if created.ids.is_empty() {
        if answer == Answer::Ids {
            return Err(ApiError::bad_request(format!(
                "filter: no document of collection {collection:?} matches it, so no task was made"
            )));
        }
        let mut out = envelope::insert_many(&[]);
        if let Value::Object(m) = &mut out {
            m.insert("error".into(), Value::String("Unknown error".into()));
        }
        return Err(ApiError::bad_request_with(out));
    }
    Ok(created)
}

/// The keys of an entry of `tasks`.
const TASK_KEYS: [&str; 4] = ["params", "not_before", "delay_s", "priority"];

/// `tasks`: each task with its own params and, where it gives them, its own `not_before` or
/// `delay_s` and `priority`; the request's own are the default of those that do not. Errors
/// name the entry (`tasks[2].priority must be …`).
fn task_list(v: &Value, default: &Timing) -> ApiResult<(Vec<Document>, Vec<Timing>)> {
    const NOT_LIST: &str =
        "tasks must be a non-empty array of {params, not_before, delay_s, priority} objects";
    let Value::Array(items) = v else {
        return Err(ApiError::bad_request(NOT_LIST));
    };
    if items.is_empty() {
        return Err(ApiError::bad_request(NOT_LIST));
    }
    let mut params = Vec::with_capacity(items.len());
    let mut timings = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Value::Object(entry) = item else {
            return Err(ApiError::bad_request(format!(
                "tasks[{i}] must be an object {{params, not_before, delay_s, priority}}"
            )));
        };
        // A null is the key not given, as at the top level.
        let entry = crate::params::without_nulls(entry.clone());
        if let Some(k) = entry.keys().find(|k| !TASK_KEYS.contains(&k.as_str())) {
            return Err(ApiError::bad_request(format!(
                "tasks[{i}]: unknown field {k:?}: a task takes {}",
                TASK_KEYS.join(", ")
            )));
        }
        match entry.get("params") {
            Some(p @ Value::Object(o)) if !o.is_empty() => {
                params.push(to_document(p, &format!("tasks[{i}].params"))?)
            }
            _ => {
                return Err(ApiError::bad_request(format!(
                    "tasks[{i}].params must be a non-empty object"
                )))
            }
        }
        let own = timing(&entry).map_err(|e| ApiError::bad_request(format!("tasks[{i}].{e}")))?;
        timings.push(Timing {
            not_before: own.not_before.or(default.not_before),
            priority: own.priority.or(default.priority),
        });
    }
    Ok((params, timings))
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
    client_json::task_params(v, path).map_err(ApiError::bad_request)
}
