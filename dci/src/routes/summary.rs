//! `GET /summary`: every queue's tasks counted in Coordinate's unit states.

use axum::response::Response;
use serde_json::{json, Value};

use crate::error::ApiResult;
use crate::namespace::Ns;
use crate::render::json_response;

pub async fn get(Ns(state): Ns) -> ApiResult<Response> {
    let (queues, counts) =
        futures::try_join!(state.store.queue_documents(), state.store.summary())?;
    let rows: Vec<Value> = queues
        .iter()
        .filter_map(|q| {
            let id = q.get_object_id("_id").ok()?;
            let c = counts.get(&id).copied().unwrap_or_default();
            Some(json!({
                "id": id.to_hex(),
                "queue": q.get_str("name").unwrap_or(""),
                "available": c.available, "delayed": c.delayed, "pending": c.pending,
                "finished": c.finished, "failed": c.failed, "other": c.other,
            }))
        })
        .collect();
    Ok(json_response(&Value::Array(rows), false))
}
