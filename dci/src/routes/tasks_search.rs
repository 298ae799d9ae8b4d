//! `GET /tasks`: search and count by indexed prefixes (others bounded), with Disbatch's dot options.

use axum::response::Response;
use bson::{Bson, Document};
use disbatch_model::schema::task as task_field;
use disbatch_store::QueryError;
use serde_json::{json, Value};

use super::full_output;
use super::queues::resolve_queue;
use super::task_filters;
use futures::StreamExt;

use crate::error::{ApiError, ApiResult};
use crate::json_stream;
use crate::namespace::Ns;
use crate::params::Options;
use crate::params::Params;
use crate::render::{self, json_response, Dates};
use crate::state::AppState;

pub async fn search(Ns(state): Ns, mut p: Params) -> ApiResult<Response> {
    let options = std::mem::take(&mut p.options);
    // The fields are the filter: `{"node": null}` asks for unclaimed tasks.
    let mut fields = p.data();
    // Disbatch only took queue ids here (a name gave a 500); names are resolved instead.
    if let Some(Value::String(q)) = fields.get("queue").cloned() {
        if !q.is_empty() && bson::oid::ObjectId::parse_str(&q).is_err() {
            let id = resolve_queue(&state, &Value::String(q)).await?;
            fields.insert("queue".into(), Value::String(id.to_hex()));
        }
    }
    let extras = task_filters::take_extras(&mut fields)?;
    let o = &options;
    if o.newest && !task_filters::creation_range_only(&fields, &extras) {
        return Err(ApiError::bad_request(
            ".newest lists the fleet's newest tasks through the _id index: it takes no filter but created_since and created_until, and a .limit",
        ));
    }
    let limit = extras.limit.or(o.limit).unwrap_or(0);
    let sets = state.store.tasks().task_index_sets().await?;
    let invalid = sets.non_indexed(&fields);
    // Disbatch's refusal body is kept for its Perl CLI; `hint` says what would run instead.
    if let Err(hint) = task_filters::check_bounded(&invalid, &extras, o.count) {
        return Err(ApiError::bad_request_with(json!({
            "title": "Disbatch Tasks Query",
            "path": "/tasks",
            "error": "non-indexed params given",
            "hint": hint,
            "invalid_params": invalid,
            "indexes": sets.0,
        })));
    }
    let q = disbatch_store::search_filter(&fields, &extras.terms).map_err(|e| match e {
        QueryError::NonIndexed { invalid } => {
            ApiError::bad_request(format!("not indexed: {}", invalid.join(", ")))
        }
        QueryError::BadObjectId { field, value } => {
            ApiError::bad_request(format!("invalid ObjectId for {field}: {value:?}"))
        }
        QueryError::BadValue { field, message } => {
            ApiError::bad_request(format!("{field} {message}"))
        }
    })?;
    let (filter, is_empty) = (q.filter, q.is_empty);
    if o.count {
        let n = state.store.tasks().count_tasks(filter).await?;
        return Ok(json_response(&json!({"count": n}), o.pretty));
    }
    if is_empty && limit == 0 {
        return Err(ApiError::bad_request_with(json!({
            "error": "refusing to return everything - include one or more indexed search restrictions",
            "hint": "give a queue, node, id, a status word such as \"failed\", a time range (since/until) or a .limit",
            "indexes": sets.0,
        })));
    }
    // Streamed: a search over a queue of 100 000 tasks must not be built in memory. The first
    // task is read before answering, so a failed search is still an error status, and the
    // shapes Disbatch's clients rely on stay: `{}` or `[]` for none, an object for `.limit=1`.
    let mut docs = state
        .store
        .tasks()
        .stream_tasks(filter, o.fields.clone(), o.skip, limit, o.newest)
        .await?;
    let Some(first) = docs.next().await.transpose()? else {
        let empty = if state.config.web.empty_tasks_object {
            json!({})
        } else {
            json!([])
        };
        return Ok(json_response(&empty, o.pretty));
    };
    if limit == 1 {
        let budget = full_output::Budget::default();
        return Ok(json_response(
            &task_json(&state, first, o, &budget).await?,
            o.pretty,
        ));
    }
    let options = o.clone();
    let pretty = o.pretty;
    let budget = full_output::Budget::default();
    let items = futures::stream::once(std::future::ready(Ok(first)))
        .chain(docs)
        .then(move |d| {
            let (state, options, budget) = (state.clone(), options.clone(), budget.clone());
            async move { task_json(&state, d?, &options, &budget).await }
        });
    Ok(json_stream::array_response(items, pretty))
}

/// One task with `.terse`, `.full` and `.epoch` applied; `.full` outputs take from `budget`,
/// the answer's.
pub async fn task_json(
    state: &AppState,
    mut d: Document,
    o: &Options,
    budget: &full_output::Budget,
) -> ApiResult<Value> {
    let task = d.get_object_id(task_field::ID).ok();
    for field in [task_field::STDOUT, task_field::STDERR] {
        match d.get(field) {
            // Perl's truth: "" and "0" are false, so Disbatch left them as they were.
            Some(Bson::String(s)) if o.terse && !matches!(s.as_str(), "" | "0") => {
                d.insert(field, "[terse mode]");
            }
            Some(Bson::ObjectId(id)) if o.full => {
                // One corrupt file must not fail a whole search: its field says why instead.
                let text = match full_output::text(state, task, field, *id, budget).await {
                    Ok(text) => text,
                    Err(e @ disbatch_store::Error::BadDocument { .. }) => {
                        tracing::warn!(file = %id, error = %e, "unreadable task output");
                        format!("[unreadable output: {e}]")
                    }
                    Err(e) => return Err(e.into()),
                };
                d.insert(field, text);
            }
            _ => {}
        }
    }
    if o.terse {
        disbatch_store::terse_live_output(&mut d);
    }
    let dates = if o.epoch { Dates::Epoch } else { Dates::Text };
    Ok(render::document(&d, dates))
}
