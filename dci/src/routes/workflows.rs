//! `/graphs` and `/batches`: tasks created together, waiting on each other or reporting to a
//! callback; read back with each task's status, cancelled as a whole.

use std::collections::{HashMap, HashSet};

use axum::response::Response;
use bson::oid::ObjectId;
use bson::{Bson, Document};
use disbatch_model::text::client_json;
use disbatch_model::workflow::{
    check_graph, DependencyRef, GraphNode, OnDependencyFailure, MAX_WORKFLOW_TASKS,
};
use disbatch_store::{
    BatchTask, GraphTask, StatusCounts, StatusGroup, WorkflowSummary, WorkflowTask,
};
use futures::StreamExt;
use serde_json::{json, Map, Value};

use super::graph_body::{Dependencies, Dependency, GraphBody};
use super::queues::resolve_queue;
use crate::error::{ApiError, ApiResult};
use crate::namespace::Ns;
use crate::params::Params;
use crate::path::Path;
use crate::render::{date, json_response, Dates};
use crate::state::AppState;

/// Graphs or batches `GET /graphs` and `GET /batches` list, newest first, by default.
const LISTED: i64 = 100;

/// Task ids as a client may write them: hex strings or `{"$oid": hex}`.
pub fn task_ids(v: &Value, field: &str) -> ApiResult<Vec<ObjectId>> {
    let Value::Array(items) = v else {
        return Err(ApiError::bad_request(format!(
            "{field} must be an array of task ids"
        )));
    };
    if items.len() > MAX_WORKFLOW_TASKS {
        return Err(ApiError::bad_request(format!(
            "{field} names at most {MAX_WORKFLOW_TASKS} tasks, not {}",
            items.len()
        )));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            task_id(item).ok_or_else(|| {
                ApiError::bad_request(format!("{field}[{i}] is not a task id: {item}"))
            })
        })
        .collect()
}

fn task_id(v: &Value) -> Option<ObjectId> {
    let hex = match v {
        Value::String(s) => s.as_str(),
        Value::Object(o) => o.get("$oid")?.as_str()?,
        _ => return None,
    };
    ObjectId::parse_str(hex).ok()
}

/// `on_dependency_failure`: absent or null leaves it to the queue.
pub fn policy(fields: &Map<String, Value>, path: &str) -> ApiResult<Option<OnDependencyFailure>> {
    match fields.get("on_dependency_failure") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => OnDependencyFailure::parse(s)
            .map(Some)
            .map_err(|e| ApiError::bad_request(format!("{path}{e}"))),
        Some(other) => Err(ApiError::bad_request(format!(
            "{path}on_dependency_failure must be \"cancel\" or \"run\", not {other}"
        ))),
    }
}

fn params_of(v: Option<&Value>, path: &str) -> ApiResult<Document> {
    match v {
        None | Some(Value::Null) => Ok(Document::new()),
        Some(v @ Value::Object(_)) => {
            client_json::task_params(v, &format!("{path}params")).map_err(ApiError::bad_request)
        }
        Some(_) => Err(ApiError::bad_request(format!(
            "{path}params must be an object"
        ))),
    }
}

fn object<'a>(v: &'a Value, path: &str, fields: &[&str]) -> ApiResult<&'a Map<String, Value>> {
    let Value::Object(m) = v else {
        return Err(ApiError::bad_request(format!("{path} must be an object")));
    };
    if let Some(k) = m.keys().find(|k| !fields.contains(&k.as_str())) {
        return Err(ApiError::bad_request(format!(
            "{path}: unknown field {k:?} (known: {})",
            fields.join(", ")
        )));
    }
    Ok(m)
}

fn tasks_array<'a>(given: &'a Map<String, Value>, what: &str) -> ApiResult<&'a Vec<Value>> {
    match given.get("tasks") {
        Some(Value::Array(items)) if !items.is_empty() && items.len() <= MAX_WORKFLOW_TASKS => {
            Ok(items)
        }
        Some(Value::Array(items)) if !items.is_empty() => Err(ApiError::bad_request(format!(
            "a {what} holds at most {MAX_WORKFLOW_TASKS} tasks, not {}",
            items.len()
        ))),
        _ => Err(ApiError::bad_request(format!(
            "'tasks' must be a non-empty array of the {what}'s tasks"
        ))),
    }
}

/// Queue ids by the names or ids a request gives, each looked up once.
#[derive(Default)]
struct Queues(HashMap<String, ObjectId>);

impl Queues {
    async fn resolve(
        &mut self,
        state: &AppState,
        v: Option<&Value>,
        path: &str,
    ) -> ApiResult<ObjectId> {
        let Some(v) = v else {
            return Err(ApiError::bad_request(format!("{path}queue is required")));
        };
        let key = v.to_string();
        if let Some(id) = self.0.get(&key) {
            return Ok(*id);
        }
        let id = resolve_queue(state, v)
            .await
            .map_err(|_| ApiError::bad_request(format!("{path}queue {v} not found")))?;
        self.0.insert(key, id);
        Ok(id)
    }
}

/// `POST /graphs` `{"tasks": [{"name", "queue", "params", "depends_on": [names or task
/// ids], "on_dependency_failure"}]}`: all stored, or nothing (a cycle, an unknown name). The
/// body is read by `graph_body`, each dependency kept once.
pub async fn create_graph(Ns(state): Ns, GraphBody(items): GraphBody) -> ApiResult<Response> {
    let mut names = HashSet::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let name = graph_name(item.name.as_ref(), i)?;
        // Checked again by `check_graph`, which says so as for any other graph.
        names.insert(name.to_string());
    }
    let mut nodes = Vec::with_capacity(items.len());
    let mut parsed = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let path = format!("tasks[{i}].");
        let name = graph_name(item.name.as_ref(), i)?.to_string();
        let depends_on = match &item.depends_on {
            None => Vec::new(),
            Some(deps) if deps.named > MAX_WORKFLOW_TASKS => {
                return Err(ApiError::bad_request(format!(
                    "{path}depends_on names at most {MAX_WORKFLOW_TASKS} tasks, not {}",
                    deps.named
                )))
            }
            Some(Dependencies {
                bad: Some((j, what)),
                ..
            }) => {
                return Err(ApiError::bad_request(format!(
                    "{path}depends_on[{j}] must be a task's name or id, not {what}"
                )))
            }
            Some(deps) => dependency_refs(&deps.distinct, &names),
        };
        nodes.push(GraphNode { name, depends_on });
        parsed.push((item, path));
    }
    drop(names);
    let order = check_graph(&nodes).map_err(ApiError::bad_request)?;
    let mut queues = Queues::default();
    let mut tasks = Vec::with_capacity(nodes.len());
    for (i, (node, (item, path))) in nodes.into_iter().zip(parsed).enumerate() {
        let queue = queues.resolve(&state, item.queue.as_ref(), &path).await?;
        let mut fields = Map::new();
        if let Some(p) = item.on_dependency_failure {
            fields.insert("on_dependency_failure".into(), p);
        }
        tasks.push(GraphTask {
            queue,
            params: params_of(item.params.as_ref(), &path)?,
            waits_for: order.waits_for[i].clone(),
            existing: node
                .depends_on
                .iter()
                .filter_map(|d| match d {
                    DependencyRef::Task(id) => Some(*id),
                    DependencyRef::Name(_) => None,
                })
                .collect(),
            on_failure: policy(&fields, &path)?,
            name: node.name,
        });
    }
    let (graph, ids) = state.store.workflows().create_graph(&tasks).await?;
    let by_name: Map<String, Value> = tasks
        .iter()
        .zip(&ids)
        .map(|(t, id)| (t.name.clone(), Value::String(id.to_hex())))
        .collect();
    Ok(json_response(
        &json!({"graph": graph.to_hex(), "ids": by_name}),
        false,
    ))
}

/// Task `i`'s name: non-empty, at most 1024 bytes, and shown as written (no control,
/// text-direction or invisible characters, as queue names).
fn graph_name(name: Option<&Value>, i: usize) -> ApiResult<&str> {
    let path = format!("tasks[{i}].");
    match name {
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 1024 => {
            disbatch_model::names::check_characters(&format!("{path}name"), s)
                .map_err(ApiError::bad_request)?;
            Ok(s)
        }
        _ => Err(ApiError::bad_request(format!(
            "{path}name must be a non-empty string of at most 1024 bytes"
        ))),
    }
}

/// A request's dependencies as names of its tasks or ids of existing ones: a name of the
/// graph first, so a 24-hex-digit name is still a name.
fn dependency_refs(deps: &[Dependency], names: &HashSet<String>) -> Vec<DependencyRef> {
    let mut out: Vec<DependencyRef> = Vec::with_capacity(deps.len());
    let mut seen = HashSet::with_capacity(deps.len());
    for d in deps {
        let r = match d {
            Dependency::Hex(id) => {
                let hex = id.to_hex();
                if names.contains(hex.as_str()) {
                    DependencyRef::Name(hex)
                } else {
                    DependencyRef::Task(*id)
                }
            }
            Dependency::Text(s) => DependencyRef::Name(s.to_string()),
            Dependency::Oid(id) => DependencyRef::Task(*id),
        };
        // `"id"` and `{"$oid": "id"}` are one dependency.
        if seen.insert(r.clone()) {
            out.push(r);
        }
    }
    out
}

/// `POST /batches` `{"tasks": [{"queue", "params"}], "callback": {"queue", "params"}}`.
pub async fn create_batch(Ns(state): Ns, p: Params) -> ApiResult<Response> {
    let given = p.given();
    if let Some(k) = given
        .keys()
        .find(|k| !matches!(k.as_str(), "tasks" | "callback"))
    {
        return Err(ApiError::bad_request(format!(
            "unknown field {k:?} (known: tasks, callback)"
        )));
    }
    let items = tasks_array(&given, "batch")?;
    let mut queues = Queues::default();
    let mut members = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = format!("tasks[{i}].");
        let m = object(item, &format!("tasks[{i}]"), &["queue", "params"])?;
        members.push(BatchTask {
            queue: queues.resolve(&state, m.get("queue"), &path).await?,
            params: params_of(m.get("params"), &path)?,
        });
    }
    let callback = match given.get("callback") {
        None => None,
        Some(v) => {
            let m = object(v, "callback", &["queue", "params"])?;
            Some(BatchTask {
                queue: queues.resolve(&state, m.get("queue"), "callback.").await?,
                params: params_of(m.get("params"), "callback.")?,
            })
        }
    };
    let made = state
        .store
        .workflows()
        .create_batch(&members, callback.as_ref())
        .await?;
    let ids: Vec<Value> = made
        .members
        .iter()
        .map(|id| Value::String(id.to_hex()))
        .collect();
    Ok(json_response(
        &json!({"batch": made.id.to_hex(), "ids": ids, "callback": made.callback.map(|c| c.to_hex())}),
        false,
    ))
}

fn workflow_id(ident: &str, what: &str) -> ApiResult<ObjectId> {
    ObjectId::parse_str(ident)
        .map_err(|_| ApiError::bad_request(format!("{ident:?} is not a {what} id")))
}

/// A status's group name, as `/tasks` counts and the CLI show them.
fn state_of(status: Option<&Bson>) -> &'static str {
    StatusGroup::of(status).as_str()
}

fn task_json(t: &WorkflowTask) -> Value {
    let hex = |ids: &[ObjectId]| -> Vec<Value> {
        ids.iter().map(|i| Value::String(i.to_hex())).collect()
    };
    json!({
        "id": t.id.to_hex(),
        "queue": t.queue.map(|q| q.to_hex()),
        "name": t.name,
        "status": t.status.as_ref().map(|s| crate::render::bson(s, Dates::Text)),
        "state": state_of(t.status.as_ref()),
        "depends_on": hex(&t.depends_on),
        "waiting_on": hex(&t.waiting_on),
        "cancel_reason": t.cancel_reason,
    })
}

/// "active" while any task has not ended; then "cancelled" (when asked), "succeeded" when
/// every task did, else "failed".
fn outcome(counts: &StatusCounts, cancelled: bool) -> &'static str {
    let live: u64 = ["queued", "claimed", "running", "blocked", "other"]
        .iter()
        .filter_map(|k| counts.get(k))
        .sum();
    let all: u64 = counts.values().sum();
    match () {
        _ if live > 0 => "active",
        _ if cancelled => "cancelled",
        _ if counts.get("succeeded").copied().unwrap_or(0) == all => "succeeded",
        _ => "failed",
    }
}

fn summary_json(s: &WorkflowSummary) -> Map<String, Value> {
    let when = |d: Option<bson::DateTime>| d.map_or(Value::Null, |d| date(d, Dates::Text));
    let mut m = Map::new();
    m.insert("id".into(), Value::String(s.id.to_hex()));
    m.insert("ctime".into(), when(s.ctime));
    m.insert("size".into(), Value::from(s.size));
    m.insert("cancelled".into(), when(s.cancelled));
    m
}

/// `GET /graphs/:id`: the graph, its outcome so far and every task with what it waits on.
/// Counted on the server and streamed task by task: a graph of 20 000 tasks is never held
/// whole, however many ask at once.
pub async fn get_graph(Ns(state): Ns, Path(ident): Path<String>) -> ApiResult<Response> {
    let id = workflow_id(&ident, "graph")?;
    let Some((summary, counts)) = state.store.workflows().graph_view(id).await? else {
        return Err(ApiError::not_found(format!("no graph {ident}")));
    };
    let tasks = state.store.workflows().graph_tasks(id).await?;
    let mut out = summary_json(&summary);
    out.insert(
        "state".into(),
        Value::from(outcome(&counts, summary.cancelled.is_some())),
    );
    out.insert("counts".into(), json!(counts));
    let items = tasks.map(|t| t.map(|t| task_json(&t)).map_err(ApiError::from));
    Ok(crate::json_stream::object_with_array_response(
        out, "tasks", items,
    ))
}

/// `GET /batches/:id`: the batch, its members' counts, its first members and its callback.
pub async fn get_batch(Ns(state): Ns, Path(ident): Path<String>) -> ApiResult<Response> {
    let id = workflow_id(&ident, "batch")?;
    let Some((summary, counts, members, callback)) = state.store.workflows().batch_view(id).await?
    else {
        return Err(ApiError::not_found(format!("no batch {ident}")));
    };
    let mut out = summary_json(&summary);
    let members_state = outcome(&counts, summary.cancelled.is_some());
    // Done once the members have ended and the callback (if any) has too.
    let callback_live = callback.as_ref().is_some_and(|c| {
        !matches!(
            state_of(c.status.as_ref()),
            "succeeded" | "failed" | "cancelled" | "terminated" | "orphaned"
        )
    });
    let callback_failed = callback
        .as_ref()
        .is_some_and(|c| !callback_live && state_of(c.status.as_ref()) != "succeeded");
    // The callback is part of the outcome: a batch whose report failed did not succeed.
    let state_name = match (members_state, callback_live) {
        ("active", _) | (_, true) => "active",
        ("succeeded", false) if callback_failed => "failed",
        (s, false) => s,
    };
    out.insert("state".into(), Value::from(state_name));
    out.insert("counts".into(), json!(counts));
    out.insert(
        "done".into(),
        summary.done.map_or(Value::Null, |d| date(d, Dates::Text)),
    );
    out.insert(
        "callback".into(),
        callback.as_ref().map_or(Value::Null, task_json),
    );
    out.insert(
        "tasks".into(),
        Value::Array(members.iter().map(task_json).collect()),
    );
    out.insert("tasks_shown".into(), Value::from(members.len()));
    Ok(json_response(&Value::Object(out), false))
}

fn listed(rows: Vec<WorkflowSummary>, batches: bool) -> Value {
    let items: Vec<Value> = rows
        .iter()
        .map(|s| {
            let mut m = summary_json(s);
            let when = s.done.map_or(Value::Null, |d| date(d, Dates::Text));
            if batches {
                m.insert("done".into(), when);
                m.insert(
                    "callback".into(),
                    s.callback_task
                        .map_or(Value::Null, |c| Value::String(c.to_hex())),
                );
            }
            Value::Object(m)
        })
        .collect();
    Value::Array(items)
}

fn list_limit(p: &Params) -> i64 {
    p.options
        .limit
        .filter(|l| *l > 0)
        .unwrap_or(LISTED)
        .min(1000)
}

/// `GET /graphs`: the newest graphs (`.limit`, at most 1 000).
pub async fn list_graphs(Ns(state): Ns, p: Params) -> ApiResult<Response> {
    let rows = state
        .store
        .workflows()
        .list_workflows(false, list_limit(&p))
        .await?;
    Ok(json_response(&listed(rows, false), false))
}

/// `GET /batches`: the newest batches (`.limit`, at most 1 000).
pub async fn list_batches(Ns(state): Ns, p: Params) -> ApiResult<Response> {
    let rows = state
        .store
        .workflows()
        .list_workflows(true, list_limit(&p))
        .await?;
    Ok(json_response(&listed(rows, true), false))
}

/// `POST /graphs/:id/cancel`.
pub async fn cancel_graph(Ns(state): Ns, Path(ident): Path<String>) -> ApiResult<Response> {
    let id = workflow_id(&ident, "graph")?;
    let Some(done) = state.store.workflows().cancel_graph(id).await? else {
        return Err(ApiError::not_found(format!("no graph {ident}")));
    };
    Ok(json_response(
        &json!({"cancelled": done.cancelled, "requested": done.requested}),
        false,
    ))
}

/// `POST /batches/:id/cancel`: its members and its callback.
pub async fn cancel_batch(Ns(state): Ns, Path(ident): Path<String>) -> ApiResult<Response> {
    let id = workflow_id(&ident, "batch")?;
    let Some(done) = state.store.workflows().cancel_batch(id).await? else {
        return Err(ApiError::not_found(format!("no batch {ident}")));
    };
    Ok(json_response(
        &json!({"cancelled": done.cancelled, "requested": done.requested}),
        false,
    ))
}
