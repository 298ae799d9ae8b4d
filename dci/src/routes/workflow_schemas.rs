//! The OpenAPI schemas of the workflow routes (`/graphs`, `/batches`): request and answer.

use serde_json::{json, Value};

fn ids() -> Value {
    json!({"type": "array", "items": {"type": "string", "description": "a task id (24 hex digits) or {\"$oid\": …}"}})
}

fn policy() -> Value {
    json!({"type": "string", "enum": ["cancel", "run"],
           "description": "when a dependency fails or is cancelled: cancel this task (and what waits on it), or run it anyway; default: the queue's on_dependency_failure, else cancel"})
}

fn task() -> Value {
    json!({"type": "object", "properties": {
        "id": {"type": "string"}, "queue": {"type": "string", "nullable": true},
        "name": {"type": "string", "nullable": true},
        "status": {"description": "the stored status code"},
        "state": {"type": "string", "enum": ["queued", "claimed", "running", "succeeded", "failed", "terminated", "blocked", "cancelled", "orphaned", "other"]},
        "depends_on": {"type": "array", "items": {"type": "string"}},
        "waiting_on": {"type": "array", "items": {"type": "string"}, "description": "dependencies that have not ended yet"},
        "cancel_reason": {"type": "string", "nullable": true}}})
}

fn whole() -> Value {
    json!({"type": "object", "properties": {
        "id": {"type": "string"}, "ctime": {"type": "string"}, "size": {"type": "integer"},
        "cancelled": {"type": "string", "nullable": true},
        "state": {"type": "string", "enum": ["active", "succeeded", "failed", "cancelled"]},
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        "tasks": {"type": "array", "items": task()}}})
}

/// `(method, path, request body, 200 answer)` of each workflow route that has them.
pub fn schemas() -> Vec<(&'static str, &'static str, Option<Value>, Value)> {
    let cancelled = json!({"type": "object", "properties": {
        "cancelled": {"type": "integer"}, "requested": {"type": "integer", "description": "running tasks asked to stop"}}});
    let mut batch = whole();
    if let Some(p) = batch.get_mut("properties").and_then(Value::as_object_mut) {
        p.insert("done".into(), json!({"type": "string", "nullable": true}));
        p.insert("callback".into(), task());
        p.insert("tasks_shown".into(), json!({"type": "integer", "description": "members listed (the first 1000); counts cover all"}));
    }
    vec![
        (
            "post",
            "/graphs",
            Some(
                json!({"type": "object", "required": ["tasks"], "properties": {
            "tasks": {"type": "array", "minItems": 1, "maxItems": 20000, "items": {
                "type": "object", "required": ["name", "queue"], "properties": {
                    "name": {"type": "string", "description": "unique in the request"},
                    "queue": {"type": "string", "description": "a queue's name or id"},
                    "params": {"type": "object"},
                    "depends_on": {"type": "array", "items": {"type": "string"}, "description": "names of this request's tasks, or ids of existing tasks"},
                    "on_dependency_failure": policy()}}}}}),
            ),
            json!({"type": "object", "properties": {"graph": {"type": "string"},
                "ids": {"type": "object", "additionalProperties": {"type": "string"}, "description": "task ids by name"}}}),
        ),
        ("get", "/graphs/{id}", None, whole()),
        ("post", "/graphs/{id}/cancel", None, cancelled.clone()),
        (
            "post",
            "/batches",
            Some(
                json!({"type": "object", "required": ["tasks"], "properties": {
            "tasks": {"type": "array", "minItems": 1, "maxItems": 20000, "items": {
                "type": "object", "required": ["queue"], "properties": {
                    "queue": {"type": "string"}, "params": {"type": "object"}}}},
            "callback": {"type": "object", "required": ["queue"], "properties": {
                "queue": {"type": "string"},
                "params": {"type": "object", "description": "gets `batch: {id, size, succeeded, failed, cancelled, other}` when released"}}}}}),
            ),
            json!({"type": "object", "properties": {"batch": {"type": "string"}, "ids": ids(),
                "callback": {"type": "string", "nullable": true}}}),
        ),
        ("get", "/batches/{id}", None, batch),
        ("post", "/batches/{id}/cancel", None, cancelled),
        (
            "post",
            "/tasks",
            Some(
                json!({"type": "object", "required": ["queue"], "properties": {
            "queue": {"type": "string"}, "params": {},
            "tasks": {"type": "array", "minItems": 1, "description": "instead of params: each task with its own timing; the request's not_before, delay_s and priority are the default",
                "items": {"type": "object", "required": ["params"], "properties": {
                    "params": {"type": "object"}, "not_before": {}, "delay_s": {"type": "number", "minimum": 0},
                    "priority": {"type": "integer"}}}},
            "collection": {"type": "string"}, "filter": {"type": "object"},
            "depends_on": ids(), "on_dependency_failure": policy(),
            "not_before": {"description": "not claimed before this time: an ISO-8601 UTC time or {\"$date\": …}; not with delay_s"},
            "delay_s": {"type": "number", "minimum": 0, "description": "not claimed before this many seconds from now, on the fleet's clock"},
            "priority": {"type": "integer", "description": "claim order in a queue with sort priority: higher first"},
            "answer": {"type": "string", "enum": ["disbatch", "ids"], "description": "disbatch (default): Disbatch's InsertManyResult; ids: {ids, created, duplicates}"}}}),
            ),
            json!({"type": "object", "description": "Disbatch's InsertManyResult, or with answer ids the shape below",
                   "properties": {
                "ids": {"type": "array", "items": {"type": "string"}, "description": "per input, in order: its task's id, new or the one it duplicates"},
                "created": {"type": "integer"},
                "duplicates": {"type": "array", "items": {"type": "object", "properties": {
                    "index": {"type": "integer"}, "matched": {"type": "string", "description": "the existing task's id"}}}}}}),
        ),
    ]
}
