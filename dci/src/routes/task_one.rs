//! One task: `GET /tasks/:id` (JSON or HTML, with its result's output), its output streams,
//! cancel, retry and delete.

use axum::body::Body;
use axum::extract::RawQuery;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use bson::Bson;
use disbatch_store::ControlOutcome;
use futures::StreamExt;

use crate::envelope;
use crate::error::{ApiError, ApiResult};
use crate::namespace::Ns;
use crate::path::Path;
use crate::render::{self, json_response, Dates};
use crate::request::{object_id, wants_html};

pub async fn get(Ns(state): Ns, Path(id): Path<String>, headers: HeaderMap) -> ApiResult<Response> {
    let html = wants_html(&headers);
    let oid = object_id("task", &id)?;
    let Some(task) = state.store.tasks().get_task(oid).await? else {
        if html {
            return Ok(
                (StatusCode::NOT_FOUND, Html(page("Document(s) not found."))).into_response(),
            );
        }
        return Err(ApiError::not_found(format!("no task with id {id}")));
    };
    let mut value = render::document(&task, Dates::Text);
    if let (Some(held), serde_json::Value::Object(m)) =
        (state.store.limits().why_held(&task).await?, &mut value)
    {
        m.insert(
            "held".into(),
            render::document(&held.to_document(), Dates::Text),
        );
    }
    if let serde_json::Value::Object(m) = &mut value {
        super::result::add_to_task(&state, oid, m).await?;
    }
    if html {
        return Ok(Html(task_page(&value)).into_response());
    }
    Ok(json_response(&value, true))
}

/// Disbatch's HTML view of a task: its JSON, pretty, in a `<pre>`. Stored text (params, queue
/// names in params, output) gets bidi and invisible characters as `\uXXXX` (the same JSON;
/// controls are already escaped by JSON), then HTML escaping.
fn task_page(task: &serde_json::Value) -> String {
    let pretty = serde_json::to_string_pretty(task).unwrap_or_default();
    let shown = disbatch_model::text::printable::json_text(&pretty);
    page(&format!("<pre>{}</pre>", escape(&shown)))
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
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

pub async fn stdout(
    state: Ns,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    output(state, id, "stdout", q).await
}

pub async fn stderr(
    state: Ns,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Response> {
    output(state, id, "stderr", q).await
}

/// `?offset=N&length=M`: a byte range, so a page can show a 15 MiB output a piece at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ByteRange {
    offset: u64,
    length: Option<u64>,
}

fn byte_range(query: Option<&str>) -> ApiResult<ByteRange> {
    let mut range = ByteRange {
        offset: 0,
        length: None,
    };
    for (k, v) in form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let n = || {
            v.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("{k} must be a non-negative integer")))
        };
        match k.as_ref() {
            "offset" => range.offset = n()?,
            "length" => range.length = Some(n()?),
            _ => {}
        }
    }
    Ok(range)
}

/// A task's output, streamed whether inline or in GridFS, whole or a byte range; the whole
/// size is in `X-Total-Length`.
async fn output(
    Ns(state): Ns,
    id: String,
    stream: &str,
    query: Option<String>,
) -> ApiResult<Response> {
    let range = byte_range(query.as_deref())?;
    let oid = object_id("task", &id)?;
    let task = state
        .store
        .tasks()
        .get_task(oid)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no task with id {id}")))?;
    let state_of = output_state(&task);
    if state_of == OutputState::Live {
        return Ok(live_output(&task, stream, range));
    }
    let (total, body) = match task.get(stream) {
        Some(Bson::String(s)) => {
            let bytes = s.as_bytes();
            let start = (range.offset as usize).min(bytes.len());
            let end = range.length.map_or(bytes.len(), |l| {
                start.saturating_add(l as usize).min(bytes.len())
            });
            (bytes.len() as u64, Body::from(bytes[start..end].to_vec()))
        }
        Some(Bson::ObjectId(file)) => {
            // Once streaming starts the status is sent; a corrupt chunk is refused before.
            if let Some(problem) = state.store.results().unreadable_chunk(*file).await? {
                return Err(ApiError::conflict(format!(
                    "the {stream} of task {id} cannot be read: GridFS file {file}: {problem}"
                )));
            }
            let total = state
                .store
                .results()
                .output_file(*file)
                .await?
                .and_then(|f| match f.get("length") {
                    Some(Bson::Int64(n)) => Some(*n as u64),
                    Some(Bson::Int32(n)) => Some(*n as u64),
                    _ => None,
                })
                .unwrap_or(0);
            let chunks = state.store.results().stream_output_file(*file).await?;
            (total, Body::from_stream(slice_stream(chunks, range)))
        }
        _ => (0, Body::empty()),
    };
    let headers = [
        (
            header::CONTENT_TYPE,
            "text/plain; charset=utf-8".to_string(),
        ),
        (
            header::HeaderName::from_static("x-total-length"),
            total.to_string(),
        ),
        (OUTPUT_HEADER, state_of.name().to_string()),
    ];
    Ok((headers, body).into_response())
}

/// `X-Disbatch-Output`: `live` (the task runs: its output so far), `waiting` (not started:
/// what is stored, an earlier attempt's if any) or `final` (it ended: its output).
const OUTPUT_HEADER: header::HeaderName = header::HeaderName::from_static("x-disbatch-output");
/// With `live`: how many bytes of the stream the live copy no longer holds (it keeps the
/// last `LIVE_TAIL`); a range starting before them starts after them.
const SKIPPED_HEADER: header::HeaderName =
    header::HeaderName::from_static("x-disbatch-output-skipped");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutputState {
    Live,
    Waiting,
    Final,
}

impl OutputState {
    fn name(self) -> &'static str {
        match self {
            OutputState::Live => "live",
            OutputState::Waiting => "waiting",
            OutputState::Final => "final",
        }
    }
}

fn output_state(task: &bson::Document) -> OutputState {
    use disbatch_model::status;
    let code = disbatch_model::task::status_code(task);
    match code {
        Some(s) if s == status::RUNNING as i64 => OutputState::Live,
        Some(s)
            if [status::QUEUED, status::CLAIMED, status::BLOCKED]
                .iter()
                .any(|w| *w as i64 == s) =>
        {
            OutputState::Waiting
        }
        _ => OutputState::Final,
    }
}

/// A running task's output so far, from its runner's live copy (empty before the first),
/// in the stream's own byte offsets: `X-Total-Length` is how much the plugin has written.
fn live_output(task: &bson::Document, stream: &str, range: ByteRange) -> Response {
    let copy = disbatch_store::live_stream(task, stream).unwrap_or_default();
    let text = copy.text.as_bytes();
    let start = (range.offset.max(copy.from) - copy.from).min(text.len() as u64) as usize;
    let end = range.length.map_or(text.len(), |l| {
        start
            .saturating_add(l.min(usize::MAX as u64) as usize)
            .min(text.len())
    });
    let headers = [
        (
            header::CONTENT_TYPE,
            "text/plain; charset=utf-8".to_string(),
        ),
        (
            header::HeaderName::from_static("x-total-length"),
            copy.bytes.to_string(),
        ),
        (OUTPUT_HEADER, OutputState::Live.name().to_string()),
        (SKIPPED_HEADER, copy.from.to_string()),
        (header::CACHE_CONTROL, "no-store".to_string()),
    ];
    (headers, Body::from(text[start..end].to_vec())).into_response()
}

/// Skips `offset` bytes of a chunk stream and ends after `length`, reading no further chunks.
fn slice_stream(
    chunks: disbatch_store::OutputStream,
    range: ByteRange,
) -> impl futures::Stream<Item = Result<Vec<u8>, std::io::Error>> {
    let left = range.length.unwrap_or(u64::MAX);
    chunks.scan((range.offset, left), |(skip, left), chunk| {
        if *left == 0 {
            return futures::future::ready(None);
        }
        let piece = chunk.map_err(std::io::Error::other).map(|mut c| {
            let drop = (*skip).min(c.len() as u64) as usize;
            *skip -= drop as u64;
            c.drain(..drop);
            let keep = (*left).min(c.len() as u64) as usize;
            c.truncate(keep);
            *left -= keep as u64;
            c
        });
        futures::future::ready(Some(piece))
    })
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
        // Accepted, not done: the runner stops the plugin and records -5 within seconds.
        ControlOutcome::Requested(counts) => {
            let mut response = json_response(&envelope::update(&counts), false);
            *response.status_mut() = axum::http::StatusCode::ACCEPTED;
            Ok(response)
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
        ControlOutcome::WaitedOn(n) => Err(ApiError::conflict(format!(
            "task {id} cannot be {action}: {n} task(s) wait on it (depends_on, or a batch's callback) and would wait for ever; cancel it instead, which settles them by their on_dependency_failure, and delete it once it has ended"
        ))),
    }
}

pub async fn cancel(Ns(state): Ns, Path(id): Path<String>) -> ApiResult<Response> {
    let outcome = state
        .store
        .tasks()
        .cancel_task(object_id("task", &id)?)
        .await?;
    control_result(&id, "cancelled", outcome, false)
}

pub async fn retry(Ns(state): Ns, Path(id): Path<String>) -> ApiResult<Response> {
    let outcome = state
        .store
        .tasks()
        .retry_task(object_id("task", &id)?)
        .await?;
    control_result(&id, "retried", outcome, false)
}

pub async fn discard(Ns(state): Ns, Path(id): Path<String>) -> ApiResult<Response> {
    let outcome = state
        .store
        .tasks()
        .discard_task(object_id("task", &id)?)
        .await?;
    control_result(&id, "discarded", outcome, false)
}

pub async fn delete(Ns(state): Ns, Path(id): Path<String>) -> ApiResult<Response> {
    let outcome = state
        .store
        .tasks()
        .delete_task(object_id("task", &id)?)
        .await?;
    control_result(&id, "deleted", outcome, true)
}

#[cfg(test)]
mod page_tests {
    use super::*;

    #[test]
    fn stored_text_is_escaped_in_the_html_page() {
        let task = serde_json::json!({
            "params": {"name": "<script>alert(1)</script>\u{1b}[31m\u{202e}\0\"'&"},
            "stdout": "</pre><img src=x onerror=alert(1)>",
        });
        let html = task_page(&task);
        let body = html.split("<pre>").nth(1).unwrap_or_default();
        let body = body.split("</pre>").next().unwrap_or_default();
        for raw in ["<script", "<img", "\u{1b}", "\u{202e}", "\0", "\"", "'"] {
            assert!(!body.contains(raw), "{raw:?} raw in {html}");
        }
        for shown in [
            "&lt;script&gt;",
            "&lt;/pre&gt;&lt;img",
            "\\u001b[31m",
            "\\u202e",
            "\\u0000",
            "&quot;",
            "&amp;",
        ] {
            assert!(body.contains(shown), "{shown:?} not in {html}");
        }
        assert_eq!(html.matches("<pre>").count(), 1, "{html}");
    }
}
