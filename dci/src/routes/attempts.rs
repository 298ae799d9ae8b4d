//! `GET /tasks/:id/attempts`: a task's attempt records, oldest first, with their result's
//! `output`, for the console and `disbatch attempts`.

use axum::response::Response;
use bson::oid::ObjectId;
use bson::Document;
use disbatch_model::schema::attempt;
use disbatch_store::{result_output, ResultOutput};
use futures::StreamExt;
use serde_json::{Map, Value};

use super::result::{Room, Shown};
use crate::error::{ApiError, ApiResult};
use crate::json_stream;
use crate::namespace::Ns;
use crate::path::Path;
use crate::render::{self, json_response, Dates};
use crate::request::object_id;

/// At most this many attempts are answered: the newest, oldest first. A task retried more
/// often than this is a runaway; `X-Attempts-Truncated: true` says older ones were left out.
pub const MAX_ATTEMPTS: usize = 1000;

/// The fields of one attempt, in this shape whatever the record holds (missing ones null).
const FIELDS: [&str; 12] = [
    attempt::ID,
    attempt::TASK,
    attempt::QUEUE,
    attempt::NODE,
    attempt::PID,
    attempt::START,
    attempt::END,
    attempt::OUTCOME,
    attempt::STATUS,
    attempt::EXIT_CODE,
    attempt::SIGNAL,
    attempt::REASON,
];

/// Streamed, with only `FIELDS` and the result's `output` read from the database: each record
/// may hold a 16 MiB plugin result, of which the listing shows only the output, within the
/// bounds `result::Room` keeps.
pub async fn list(Ns(state): Ns, Path(id): Path<String>) -> ApiResult<Response> {
    let oid = object_id("task", &id)?;
    if !state.store.tasks().task_exists(oid).await? {
        return Err(ApiError::not_found(format!("no task with id {id}")));
    }
    let mut fields = FIELDS.to_vec();
    fields.extend([
        attempt::RESULT_OUTPUT,
        attempt::OUTPUT_FILE,
        attempt::OUTPUT_BYTES,
    ]);
    let (mut records, truncated) = state
        .store
        .results()
        .recent_attempts(oid, MAX_ATTEMPTS, &fields)
        .await?;
    let mut room = Room::default();
    // The first record is read before answering, so a failed read is still an error status.
    let mut response = match records.next().await.transpose()? {
        None => json_response(&Value::Array(Vec::new()), false),
        Some(first) => {
            let rows = futures::stream::once(std::future::ready(Ok(first)))
                .chain(records)
                .map(move |d| {
                    d.map(|d| attempt_json(&d, oid, &mut room))
                        .map_err(ApiError::from)
                });
            json_stream::array_response(rows, false)
        }
    };
    if truncated {
        response.headers_mut().insert(
            axum::http::HeaderName::from_static("x-attempts-truncated"),
            axum::http::HeaderValue::from_static("true"),
        );
    }
    Ok(response)
}

/// One record as the API renders documents (`{"$oid"}` ids, text dates), only `FIELDS`, and
/// `output`: the result's (null when none), or null and `output_omitted` when `room` has
/// no place for it.
fn attempt_json(d: &Document, task: ObjectId, room: &mut Room) -> Value {
    let mut row: Map<String, Value> = FIELDS
        .iter()
        .map(|k| {
            let v = d
                .get(*k)
                .map_or(Value::Null, |b| render::bson(b, Dates::Text));
            (k.to_string(), v)
        })
        .collect();
    let output = match (d.get_object_id(attempt::ID), result_output(d)) {
        (Ok(id), Some(output)) => room.show(task, id, &output),
        // A record without an ObjectId `_id` has no link for its output: it is shown whole.
        (Err(_), Some(ResultOutput::Inline(output))) => {
            Shown::Inline(render::bson(&output, Dates::Text))
        }
        (Err(_), Some(ResultOutput::File(o))) => Shown::Omitted(serde_json::json!({
            "bytes": o.bytes,
            "reason": "kept in GridFS, and its attempt record has no ObjectId _id to link it by",
        })),
        (_, None) => Shown::Inline(Value::Null),
    };
    match output {
        Shown::Inline(v) => {
            row.insert("output".into(), v);
        }
        Shown::Omitted(marker) => {
            row.insert("output".into(), Value::Null);
            row.insert("output_omitted".into(), marker);
        }
    }
    Value::Object(row)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::{doc, DateTime};

    #[test]
    fn an_attempt_has_every_field_and_null_for_missing_ones() {
        let id = ObjectId::new();
        let v = attempt_json(
            &doc! {
                "_id": id, "outcome": "lost", "reason": "its lease passed on node n1",
                "start": DateTime::from_millis(0), "pid": 7_i64, "result": {"x": 1},
            },
            ObjectId::new(),
            &mut Room::default(),
        );
        assert_eq!(v["_id"], serde_json::json!({"$oid": id.to_hex()}));
        assert_eq!(v["start"], serde_json::json!("1970-01-01T00:00:00"));
        assert_eq!(v["pid"], serde_json::json!(7));
        assert_eq!(v["end"], Value::Null);
        assert_eq!(v["exit_code"], Value::Null);
        assert_eq!(
            v["reason"],
            serde_json::json!("its lease passed on node n1")
        );
        assert!(
            v.get("result").is_none(),
            "the plugin's result is not listed"
        );
        assert_eq!(v["output"], Value::Null, "a result without output");
        assert_eq!(v.as_object().map(|m| m.len()), Some(FIELDS.len() + 1));
    }

    #[test]
    fn an_attempt_shows_its_result_output_or_where_to_get_it() {
        let (task, id) = (ObjectId::new(), ObjectId::new());
        let record = doc! {"_id": id, "result": {"status": 1, "output": {"greeted": "Ada"}}};
        let v = attempt_json(&record, task, &mut Room::default());
        assert_eq!(v["output"], serde_json::json!({"greeted": "Ada"}));
        assert!(v.get("output_omitted").is_none());
        let big = "a".repeat(super::super::full_output::MAX_OUTPUT_BYTES);
        let record = doc! {"_id": id, "result": {"output": big}};
        let v = attempt_json(&record, task, &mut Room::default());
        assert_eq!(v["output"], Value::Null);
        assert_eq!(
            v["output_omitted"]["url"],
            serde_json::json!(format!("/tasks/{task}/result?attempt={id}"))
        );
    }
}
