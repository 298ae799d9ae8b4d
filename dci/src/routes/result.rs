//! A plugin's result `output`: `GET /tasks/:id/result`, and how much of it other answers inline.

use axum::body::Body;
use axum::extract::RawQuery;
use axum::http::{header, HeaderName, HeaderValue};
use axum::response::{IntoResponse, Response};
use bson::oid::ObjectId;
use disbatch_store::{ResultOutput, StoredOutput};
use serde_json::{json, Map, Value};

use super::full_output::{MAX_ANSWER_BYTES, MAX_OUTPUT_BYTES};
use crate::error::{ApiError, ApiResult};
use crate::namespace::Ns;
use crate::path::Path;
use crate::render::{self, json_response, Dates};
use crate::request::object_id;

/// The attempt whose output `GET /tasks/:id/result` answered, as 24 hex digits.
const ATTEMPT_HEADER: HeaderName = HeaderName::from_static("x-disbatch-attempt");

/// What an answer holds of one output: the output, or why it is left out and where it is whole.
#[derive(Debug, Clone, PartialEq)]
pub enum Shown {
    Inline(Value),
    Omitted(Value),
}

/// What is left of one answer's room for inlined outputs, shared by its attempts: the same
/// bounds as outputs inlined by `.full` (`MAX_OUTPUT_BYTES` each, `MAX_ANSWER_BYTES` in all).
#[derive(Debug)]
pub struct Room(usize);

impl Default for Room {
    fn default() -> Self {
        Room(MAX_ANSWER_BYTES)
    }
}

impl Room {
    /// `output` of attempt `attempt` of `task` as this answer shows it: inline when its JSON
    /// fits both bounds, otherwise a marker with its size and the route that answers it whole.
    /// An output kept in GridFS is never inlined: it is beyond what a record holds.
    pub fn show(&mut self, task: ObjectId, attempt: ObjectId, output: &ResultOutput) -> Shown {
        let url = format!(
            "/tasks/{}/result?attempt={}",
            task.to_hex(),
            attempt.to_hex()
        );
        let output = match output {
            ResultOutput::Inline(b) => b,
            ResultOutput::File(StoredOutput { bytes, .. }) => {
                return Shown::Omitted(json!({
                    "bytes": bytes,
                    "reason": format!(
                        "it is {bytes} bytes of JSON, kept in GridFS: too large for its attempt record"
                    ),
                    "url": url,
                }))
            }
        };
        let value = render::bson(output, Dates::Text);
        let bytes = serde_json::to_vec(&value).map_or(usize::MAX, |v| v.len());
        if bytes <= MAX_OUTPUT_BYTES && bytes <= self.0 {
            self.0 -= bytes;
            return Shown::Inline(value);
        }
        let why = if bytes > MAX_OUTPUT_BYTES {
            format!("it is {bytes} bytes of JSON, beyond the {MAX_OUTPUT_BYTES} an answer inlines")
        } else {
            format!("this answer already holds {MAX_ANSWER_BYTES} bytes of outputs")
        };
        Shown::Omitted(json!({
            "bytes": bytes,
            "reason": why,
            "url": url,
        }))
    }
}

/// Adds the task's newest output to a task's answer: `output`, `output_attempt` (its
/// attempt's id, hex) and, when too large to inline, `output_omitted` in its place. Fields
/// the task document already has are left as they are.
pub async fn add_to_task(
    state: &crate::state::AppState,
    task: ObjectId,
    answer: &mut Map<String, Value>,
) -> ApiResult<()> {
    let found = match state.store.results().latest_output(task).await {
        Ok(found) => found,
        // A hand-edited record (an `_id` that is no ObjectId) costs the output, not the task.
        Err(e @ disbatch_store::Error::BadDocument { .. }) => {
            tracing::warn!(task = %task, error = %e, "the task's result output is not shown");
            None
        }
        Err(e) => return Err(e.into()),
    };
    let Some((attempt, output)) = found else {
        return Ok(());
    };
    let mut add = |k: &str, v: Value| {
        answer.entry(k.to_string()).or_insert(v);
    };
    add("output_attempt", Value::String(attempt.to_hex()));
    match Room::default().show(task, attempt, &output) {
        Shown::Inline(v) => add("output", v),
        Shown::Omitted(marker) => {
            add("output", Value::Null);
            add("output_omitted", marker);
        }
    }
    Ok(())
}

/// `GET /tasks/:id/result`: the `output` of the task's newest succeeded attempt, whole, as
/// JSON; `?attempt=ID` asks for that attempt's whatever its outcome (the link an answer
/// gives for an output too large to inline). `X-Disbatch-Attempt` names the attempt.
pub async fn get(
    Ns(state): Ns,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> ApiResult<Response> {
    let task = object_id("task", &id)?;
    let mut wanted = None;
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if k == "attempt" {
            wanted = Some(object_id("attempt", &v)?);
        }
    }
    if !state.store.tasks().task_exists(task).await? {
        return Err(ApiError::not_found(format!("no task with id {id}")));
    }
    let (attempt, output) = match wanted {
        Some(attempt) => match state.store.results().attempt_output(task, attempt).await? {
            Some(output) => (attempt, output),
            None => {
                return Err(ApiError::not_found(format!(
                    "task {id} has no attempt {attempt}"
                )))
            }
        },
        None => match state.store.results().last_success_output(task).await? {
            Some(found) => found,
            None => {
                return Err(ApiError::not_found(format!(
                    "task {id} has no result: no attempt of it succeeded"
                )))
            }
        },
    };
    let Some(output) = output else {
        return Err(ApiError::not_found(format!(
            "task {id} has no result: attempt {attempt} wrote no output in its result file"
        )));
    };
    let mut response = match output {
        ResultOutput::Inline(b) => json_response(&render::bson(&b, Dates::Text), true),
        ResultOutput::File(o) => stored_output(&state, task, o).await?,
    };
    if let Ok(v) = HeaderValue::from_str(&attempt.to_hex()) {
        response.headers_mut().insert(ATTEMPT_HEADER, v);
    }
    Ok(response)
}

/// An output kept in GridFS, streamed as stored (JSON text) without holding it whole. A
/// corrupt chunk is refused before the status is sent.
async fn stored_output(
    state: &crate::state::AppState,
    task: ObjectId,
    o: StoredOutput,
) -> ApiResult<Response> {
    if let Some(problem) = state.store.results().unreadable_chunk(o.file).await? {
        return Err(ApiError::conflict(format!(
            "the result of task {task} cannot be read: GridFS file {}: {problem}",
            o.file
        )));
    }
    let chunks = state.store.results().stream_output_file(o.file).await?;
    let headers = [(header::CONTENT_TYPE, "application/json")];
    Ok((headers, Body::from_stream(chunks)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, Bson};

    #[test]
    fn an_output_is_inlined_within_both_bounds_and_marked_past_them() {
        let (task, attempt) = (ObjectId::new(), ObjectId::new());
        let mut room = Room::default();
        let small = Bson::Document(doc! {"greeted": "Ada"});
        assert_eq!(
            room.show(task, attempt, &ResultOutput::Inline(small.clone())),
            Shown::Inline(json!({"greeted": "Ada"}))
        );
        let big = Bson::String("a".repeat(MAX_OUTPUT_BYTES));
        let Shown::Omitted(marker) = room.show(task, attempt, &ResultOutput::Inline(big.clone()))
        else {
            panic!("a {MAX_OUTPUT_BYTES}-byte string and its quotes is inlined");
        };
        assert_eq!(marker["bytes"], json!(MAX_OUTPUT_BYTES + 2));
        assert_eq!(
            marker["url"],
            json!(format!("/tasks/{task}/result?attempt={attempt}"))
        );
        let almost = Bson::String("a".repeat(MAX_OUTPUT_BYTES - 2));
        for _ in 0..MAX_ANSWER_BYTES / MAX_OUTPUT_BYTES - 1 {
            assert!(matches!(
                room.show(task, attempt, &ResultOutput::Inline(almost.clone())),
                Shown::Inline(_)
            ));
        }
        let Shown::Omitted(marker) =
            room.show(task, attempt, &ResultOutput::Inline(almost.clone()))
        else {
            panic!("the answer's room is used up");
        };
        assert!(
            marker["reason"]
                .as_str()
                .is_some_and(|r| r.contains("already holds")),
            "{marker}"
        );
        assert!(matches!(
            room.show(task, attempt, &ResultOutput::Inline(Bson::Int32(1))),
            Shown::Inline(_)
        ));
    }
}
