//! `/queues`: queue documents with Disbatch's counts; create, update, delete.

use axum::response::Response;
use axum::Extension;
use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use disbatch_config::Role;
use disbatch_model::fleet_time;
use disbatch_model::retry_policy::RetryPolicy;
use disbatch_model::schema::queue as field;
use disbatch_store::{check_queue_fields, retry_document, QueueCounts, StatusGroup, WriteCounts};
use serde_json::{json, Map, Value};

use super::nodes::non_negative;
use super::queue_limits;
use super::queue_schedule;
use super::queue_settings;
use crate::access::Caller;
use crate::envelope;
use crate::error::{ApiError, ApiResult};
use crate::namespace::Ns;
use crate::params::Params;
use crate::path::Path;
use crate::render::{self, json_response, Dates};
use crate::state::AppState;

async fn queue_json(state: &AppState, d: &Document) -> ApiResult<Value> {
    let id = d
        .get_object_id(field::ID)
        .map_err(|_| ApiError::bad_request("queue without an ObjectId _id"))?;
    let ids = [id];
    let (counts, retrying) = futures::try_join!(
        state.store.queues().queue_counts(id),
        state.store.tasks().retrying_counts(&ids)
    )?;
    let retrying = retrying.get(&id).copied().unwrap_or(0);
    Ok(queue_row(id, d, counts, retrying))
}

/// A queue document with its counts. `discarded` (of `failed`) and `retrying` (of the
/// queued) are this API's: Disbatch's fields keep their meaning.
fn queue_row(id: ObjectId, d: &Document, counts: QueueCounts, retrying: u64) -> Value {
    let get = |k: &str| {
        d.get(k)
            .map_or(Value::Null, |b| render::bson(b, Dates::Text))
    };
    let plugin = d.get(field::PLUGIN).or_else(|| d.get(field::LEGACY_PLUGIN));
    let mut row = json!({
        "id": id.to_hex(),
        "name": get(field::NAME),
        "plugin": plugin.map_or(Value::Null, |b| render::bson(b, Dates::Text)),
        "threads": get(field::THREADS),
        "sort": get(field::SORT),
        "queued": counts.queued,
        "running": counts.running,
        "completed": counts.completed,
        "succeeded": counts.succeeded,
        "failed": counts.failed,
        "discarded": counts.by_status.discarded(),
        "retrying": retrying,
        "paused_threads": get(field::PAUSED_THREADS),
        "by_status": by_status(&counts),
    });
    if let Value::Object(m) = &mut row {
        // The retry policy and run settings when set: a Disbatch queue's row is as it was.
        for k in queue_settings::all() {
            if let Some(b) = d.get(k) {
                m.insert(k.to_string(), render::bson(b, Dates::Text));
            }
        }
        queue_limits::as_set(d, m);
        queue_schedule::as_set(d, fleet_time::now(), m);
    }
    row
}

/// Each status group apart, named as in `task_counts` and the metrics: `queued` here is -2
/// alone, where the top-level `queued` keeps Disbatch's meaning (every status ≤ -2).
fn by_status(counts: &QueueCounts) -> Value {
    let groups: Map<String, Value> = StatusGroup::ALL
        .iter()
        .map(|g| (g.as_str().to_string(), json!(counts.by_status.get(*g))))
        .collect();
    Value::Object(groups)
}

pub async fn list(Ns(state): Ns) -> ApiResult<Response> {
    let reading = state.counts.get(&state.store).await?;
    let rows: Vec<Value> = reading
        .queues
        .iter()
        .filter_map(|d| {
            let id = d.get_object_id(field::ID).ok()?;
            let counts = QueueCounts::from(reading.counts(id));
            Some(queue_row(id, d, counts, reading.retrying(id)))
        })
        .collect();
    Ok(json_response(&Value::Array(rows), false))
}

async fn find(state: &AppState, ident: &str) -> ApiResult<Document> {
    state
        .store
        .queues()
        .find_queue(ident)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no queue {ident}")))
}

pub async fn find_id(state: &AppState, ident: &str) -> ApiResult<ObjectId> {
    find(state, ident)
        .await?
        .get_object_id(field::ID)
        .map_err(|_| ApiError::bad_request(format!("queue {ident} has no ObjectId _id")))
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
    let found = state.store.queues().find_queue(&ident).await?;
    found
        .and_then(|d| d.get_object_id("_id").ok())
        .ok_or_else(|| ApiError::bad_request("queue not found"))
}

/// One queue; with flow limits that hold claims, also `flow`: its budget and held tasks now
/// (a queue without them costs no further read).
pub async fn get(Ns(state): Ns, Path(ident): Path<String>) -> ApiResult<Response> {
    let d = find(&state, &ident).await?;
    let mut row = queue_json(&state, &d).await?;
    let flow = match (
        d.get_object_id(field::ID),
        disbatch_model::limits::parse(&d),
    ) {
        (Ok(id), Ok(limits)) => {
            let now = fleet_time::now();
            let flow = state.store.limits().queue_flow(id, &limits, now).await?;
            flow.map(|f| queue_limits::flow_json(&f, &limits))
        }
        // A node skips such a queue; its reason is what there is to show.
        (_, Err(problem)) => Some(json!({"error": problem})),
        (Err(_), _) => None,
    };
    if let (Some(flow), Value::Object(m)) = (flow, &mut row) {
        m.insert("flow".into(), flow);
    }
    Ok(json_response(&row, false))
}

/// `threads`: a non-negative integer (numbers or digit strings) or null (paused).
fn threads_value(v: &Value, message: &str) -> ApiResult<Bson> {
    match v {
        Value::Null => Ok(Bson::Null),
        v => non_negative(v)
            .map(Bson::Int64)
            .ok_or_else(|| ApiError::bad_request(message)),
    }
}

fn sort_value(v: &Value) -> ApiResult<Bson> {
    match v.as_str() {
        Some(s @ ("fifo" | "lifo" | "default" | "priority")) => Ok(Bson::String(s.to_string())),
        _ => Err(ApiError::bad_request(
            "sort must be fifo, lifo, default or priority",
        )),
    }
}

pub async fn create(Ns(state): Ns, params: Params) -> ApiResult<Response> {
    // `retry: null` asks for no policy, where a missing one gets the default.
    let p = params.given_keeping_null(&["threads", field::RETRY]);
    let (id, _) = create_queue(&state, &p).await?;
    let mut out = envelope::insert_one(id);
    if let Value::Object(m) = &mut out {
        m.insert("id".into(), json!({"$oid": id.to_hex()}));
    }
    Ok(json_response(&out, false))
}

/// Validates and inserts a queue (also used by the legacy route set).
pub async fn create_queue(
    state: &AppState,
    p: &Map<String, Value>,
) -> ApiResult<(ObjectId, Document)> {
    let text = |k: &str| p.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
    let (Some(name), Some(plugin)) = (text("name"), text("plugin")) else {
        return Err(ApiError::bad_request("name and plugin required"));
    };
    if let Some(k) = p.keys().find(|k| {
        !matches!(k.as_str(), "name" | "plugin" | "threads" | "sort" | "force")
            && !queue_settings::is_setting(k)
            && !queue_limits::FIELDS.contains(&k.as_str())
            && !queue_schedule::FIELDS.contains(&k.as_str())
    }) {
        return Err(ApiError::bad_request_with(
            json!({"error": "Invalid param", "param": k}),
        ));
    }
    if !state.config.plugins.is_listed(plugin) {
        return Err(ApiError::bad_request_with(
            json!({"error": "Unknown plugin", "plugin": plugin}),
        ));
    }
    let mut fields = doc! {field::NAME: name, field::PLUGIN: plugin};
    if let Some(t) = p.get("threads") {
        fields.insert(
            field::THREADS,
            threads_value(t, "threads must be a non-negative integer or null")?,
        );
    }
    if let Some(s) = p.get("sort") {
        fields.insert(field::SORT, sort_value(s)?);
    }
    for k in queue_limits::FIELDS {
        if let Some(v) = p
            .get(k)
            .map(|v| queue_limits::value(k, v))
            .transpose()?
            .flatten()
        {
            fields.insert(k, v);
        }
    }
    for k in queue_schedule::FIELDS {
        if let Some(v) = p
            .get(k)
            .map(|v| queue_schedule::value(k, v))
            .transpose()?
            .flatten()
        {
            fields.insert(k, v);
        }
    }
    for (k, v) in p.iter().filter(|(k, _)| k.as_str() != field::RETRY) {
        if queue_settings::is_setting(k) {
            if let Some(v) = queue_settings::value(k, v)? {
                fields.insert(k.clone(), v);
            }
        }
    }
    // Our queues retry failures unless told otherwise (`null` for Disbatch's none); the
    // policy is written out, so that it shows and can be changed.
    match p.get(field::RETRY) {
        None => {
            fields.insert(field::RETRY, retry_document(&RetryPolicy::DEFAULT));
        }
        Some(v) => {
            if let Some(v) = queue_limits::value(field::RETRY, v)? {
                fields.insert(field::RETRY, v);
            }
        }
    }
    check_queue_fields(&fields).map_err(ApiError::bad_request)?;
    queue_limits::refuse_beside_perl(state, name, &fields, queue_limits::force(p)?).await?;
    let id = state
        .store
        .queues()
        .insert_queue_document(fields.clone())
        .await?;
    Ok((id, fields))
}

/// The route is `operate` (threads, sort, flow limits, run settings; a field sent as null is
/// removed); a new name, plugin, worker mode, config, chaining or placement changes what
/// runs, so `admin`.
pub async fn update(
    Ns(state): Ns,
    Path(ident): Path<String>,
    Extension(caller): Extension<Caller>,
    params: Params,
) -> ApiResult<Response> {
    let keep_null: Vec<&str> = [
        "threads",
        field::RATE_LIMIT,
        field::CONCURRENCY,
        field::UNIQUE,
        field::SCHEDULE,
        field::SCHEDULE_TZ,
        field::SCHEDULE_PARAMS,
        field::SCHEDULE_MISSED,
    ]
    .into_iter()
    .chain(queue_settings::all())
    .collect();
    let mut p = params.given_keeping_null(&keep_null);
    let force = queue_limits::force(&p)?;
    p.remove("force");
    if p.is_empty() {
        return Err(ApiError::bad_request("no params"));
    }
    if p.contains_key("name") || p.contains_key("plugin") {
        caller.require(Role::Admin, "changing a queue's name or plugin")?;
    }
    if let Some(k) = queue_settings::ADMIN.iter().find(|k| p.contains_key(**k)) {
        caller.require(Role::Admin, &format!("changing a queue's {k}"))?;
    }
    let mut set = Document::new();
    let mut unset = Vec::new();
    for (k, v) in &p {
        if let Some(limit) = queue_limits::FIELDS.iter().find(|f| **f == k.as_str()) {
            match queue_limits::value(limit, v)? {
                Some(v) => set.insert(*limit, v),
                None => {
                    unset.push(*limit);
                    None
                }
            };
            continue;
        }
        if let Some(key) = queue_schedule::FIELDS.iter().find(|f| **f == k.as_str()) {
            match queue_schedule::value(key, v)? {
                Some(v) => set.insert(*key, v),
                None => {
                    unset.push(*key);
                    None
                }
            };
            continue;
        }
        match k.as_str() {
            "name" => match v.as_str() {
                Some(s) if !s.is_empty() => set.insert(field::NAME, s),
                _ => return Err(ApiError::bad_request("name must be a string")),
            },
            "plugin" => match v.as_str() {
                Some(s) if state.config.plugins.is_listed(s) => set.insert(field::PLUGIN, s),
                _ => {
                    return Err(ApiError::bad_request_with(
                        json!({"error": "unknown plugin", "plugin": v}),
                    ))
                }
            },
            "threads" => set.insert(
                field::THREADS,
                threads_value(v, "threads must be a non-negative integer")?,
            ),
            "sort" => set.insert(field::SORT, sort_value(v)?),
            field::RETRY => match queue_limits::value(field::RETRY, v)? {
                Some(v) => set.insert(field::RETRY, v),
                None => {
                    unset.push(field::RETRY);
                    None
                }
            },
            k if queue_settings::is_setting(k) => match queue_settings::value(k, v)? {
                Some(v) => set.insert(k, v),
                None => {
                    if let Some(known) = queue_settings::all().find(|f| *f == k) {
                        unset.push(known);
                    }
                    None
                }
            },
            _ => {
                return Err(ApiError::bad_request_with(
                    json!({"error": "unknown param", "param": k}),
                ))
            }
        };
    }
    check_queue_fields(&set).map_err(ApiError::bad_request)?;
    queue_schedule::also_unset(&mut unset);
    let id = find_id(&state, &ident).await?;
    queue_limits::refuse_beside_perl(&state, &ident, &set, force).await?;
    let counts = state.store.queues().update_queue(id, set, &unset).await?;
    Ok(json_response(&envelope::update(&counts), false))
}

pub async fn delete(Ns(state): Ns, Path(ident): Path<String>) -> ApiResult<Response> {
    let id = find_id(&state, &ident).await?;
    let counts = state.store.queues().delete_queue(id).await?;
    Ok(json_response(&envelope::delete(&counts), false))
}

/// `POST /queues/:queue/pause`: threads to 0, remembering the old value for resume.
pub async fn pause(Ns(state): Ns, Path(ident): Path<String>) -> ApiResult<Response> {
    let id = find_id(&state, &ident).await?;
    if !state.store.queues().pause_queue(id).await? {
        return Err(ApiError::conflict(format!(
            "queue {ident} is already paused or has no threads to pause"
        )));
    }
    let counts = WriteCounts {
        matched: 1,
        modified: 1,
        ..Default::default()
    };
    Ok(json_response(&envelope::update(&counts), false))
}

/// `POST /queues/:queue/resume`: restores the threads a pause set aside.
pub async fn resume(Ns(state): Ns, Path(ident): Path<String>) -> ApiResult<Response> {
    let id = find_id(&state, &ident).await?;
    if !state.store.queues().resume_queue(id).await? {
        return Err(ApiError::conflict(format!("queue {ident} is not paused")));
    }
    let counts = WriteCounts {
        matched: 1,
        modified: 1,
        ..Default::default()
    };
    Ok(json_response(&envelope::update(&counts), false))
}

/// The most status codes one retry may list.
pub const MAX_RETRY_STATUSES: usize = 1000;

/// `POST /queues/:queue/retry {"status": [codes]}`: requeue a queue's failed/orphaned tasks;
/// `{"status": "failed"}` requeues every failed one, status 2 and the codes above it, and no
/// status every failed and orphaned one.
pub async fn retry(
    Ns(state): Ns,
    Path(ident): Path<String>,
    params: Params,
) -> ApiResult<Response> {
    let p = params.given();
    if p.get("status").and_then(Value::as_str) == Some("failed") {
        let id = find_id(&state, &ident).await?;
        let counts = state.store.tasks().retry_queue_failed(id).await?;
        return Ok(json_response(&envelope::update(&counts), false));
    }
    // No status: the failed group (every status >= 2, as the counts count it) and orphaned,
    // where Disbatch took 2 and -6 and left a plugin's 3 behind. Listed codes are as given.
    if p.get("status").is_none() {
        let id = find_id(&state, &ident).await?;
        let mut counts = state.store.tasks().retry_queue_failed(id).await?;
        let orphaned = state
            .store
            .tasks()
            .retry_queue(id, &[disbatch_model::status::ORPHANED])
            .await?;
        counts.matched += orphaned.matched;
        counts.modified += orphaned.modified;
        return Ok(json_response(&envelope::update(&counts), false));
    }
    let statuses: Vec<i32> = match p.get("status") {
        None => vec![2, -6],
        Some(Value::Array(items)) if items.len() > MAX_RETRY_STATUSES => {
            return Err(ApiError::bad_request(format!(
                "status lists {} codes; at most {MAX_RETRY_STATUSES} are allowed (\"failed\" retries every failure code)",
                items.len()
            )))
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(status_code)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::bad_request("status must be a list of integer status codes")
            })?,
        Some(v) => vec![status_code(v).ok_or_else(|| {
            ApiError::bad_request("status must be a list of integer status codes")
        })?],
    };
    if let Some(bad) = statuses
        .iter()
        .find(|s| !disbatch_store::is_retryable(**s as i64))
    {
        return Err(ApiError::bad_request(format!(
            "status {bad} cannot be retried: use finished (>= 1), orphaned (-6), cancelled (-5) or terminated (-3)"
        )));
    }
    let id = find_id(&state, &ident).await?;
    let counts = state.store.tasks().retry_queue(id, &statuses).await?;
    Ok(json_response(&envelope::update(&counts), false))
}

fn status_code(v: &Value) -> Option<i32> {
    match v {
        Value::Number(n) => n.as_i64().and_then(|n| i32::try_from(n).ok()),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// `POST /queues/:queue/cancel`: cancels the queue's tasks that wait to run, queued (-2) and
/// blocked (-4); claimed and running tasks are left to `POST /tasks/:id/cancel`. Answers
/// Disbatch's update envelope: `modified_count` is how many were cancelled.
pub async fn cancel(Ns(state): Ns, Path(ident): Path<String>) -> ApiResult<Response> {
    let id = find_id(&state, &ident).await?;
    let counts = state.store.tasks().cancel_queue(id).await?;
    Ok(json_response(&envelope::update(&counts), false))
}
