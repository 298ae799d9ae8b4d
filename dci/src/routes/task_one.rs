//! One task: `GET /tasks/:id` (JSON or HTML), its output streams, cancel, retry and delete.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use bson::Bson;
use disbatch_core::store::ControlOutcome;
use futures::StreamExt;

use crate::envelope;
use crate::error::{ApiError, ApiResult};
use crate::render::{self, json_response, Dates};
use crate::request::{object_id, wants_html};
use crate::state::AppState;

pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let html = wants_html(&headers);
    let oid = object_id("task", &id)?;
    let Some(task) = state.store.get_task(oid).await? else {
        if html {
            return Ok(
                (StatusCode::NOT_FOUND, Html(page("Document(s) not found."))).into_response(),
            );
        }
        return Err(ApiError::not_found(format!("no task with id {id}")));
    };
    let value = render::document(&task, Dates::Text);
    if html {
        let pretty = serde_json::to_string_pretty(&value).unwrap_or_default();
        return Ok(Html(page(&format!("<pre>{}</pre>", escape(&pretty)))).into_response());
    }
    Ok(json_response(&value, true))
}

fn page(body: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Disbatch Single Task Query Results</title></head>\
         <body><h1>Disbatch Single Task Query Results</h1>{body}</body></html>"
    )
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

pub async fn stdout(state: State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    output(state, id, "stdout").await
}

pub async fn stderr(state: State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    output(state, id, "stderr").await
}

/// A task's output, streamed whether inline or in GridFS.
async fn output(State(state): State<AppState>, id: String, stream: &str) -> ApiResult<Response> {
    let oid = object_id("task", &id)?;
    let task = state
        .store
        .get_task(oid)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no task with id {id}")))?;
    let text_plain = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    match task.get(stream) {
        Some(Bson::String(s)) => Ok((text_plain, s.clone()).into_response()),
        Some(Bson::ObjectId(file)) => {
            let chunks = state.store.stream_output_file(*file).await?;
            let body = Body::from_stream(chunks.map(|c| c.map_err(std::io::Error::other)));
            Ok((text_plain, body).into_response())
        }
        _ => Ok((text_plain, String::new()).into_response()),
    }
}

fn control_result(
    id: &str,
    action: &str,
    outcome: ControlOutcome,
    delete: bool,
) -> ApiResult<Response> {
    match outcome {
        ControlOutcome::Done(counts) => {
            let body = if delete {
                envelope::delete(&counts)
            } else {
                envelope::update(&counts)
            };
            Ok(json_response(&body, false))
        }
        ControlOutcome::NotFound => Err(ApiError::not_found(format!("no task with id {id}"))),
        ControlOutcome::WrongStatus(status) => {
            let s = render::bson(&status, Dates::Text);
            let why = match s.as_i64() {
                Some(-1) | Some(0) => {
                    format!("task {id} is running (status {s}); it cannot be {action} yet")
                }
                _ => format!("task {id} has status {s}; it cannot be {action}"),
            };
            Err(ApiError::conflict(why))
        }
    }
}

pub async fn cancel(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let outcome = state.store.cancel_task(object_id("task", &id)?).await?;
    control_result(&id, "cancelled", outcome, false)
}

pub async fn retry(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let outcome = state.store.retry_task(object_id("task", &id)?).await?;
    control_result(&id, "retried", outcome, false)
}

pub async fn delete(State(state): State<AppState>, Path(id): Path<String>) -> ApiResult<Response> {
    let outcome = state.store.delete_task(object_id("task", &id)?).await?;
    control_result(&id, "deleted", outcome, true)
}
