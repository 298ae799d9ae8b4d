//! `GET /summary`: every queue's tasks counted in Coordinate's unit states.

use axum::response::Response;
use disbatch_store::StateCounts;
use serde_json::{json, Value};

use crate::error::ApiResult;
use crate::namespace::Ns;
use crate::render::json_response;

pub async fn get(Ns(state): Ns) -> ApiResult<Response> {
    let reading = state.counts.get(&state.store).await?;
    let rows: Vec<Value> = reading
        .queues
        .iter()
        .filter_map(|q| {
            let id = q.get_object_id("_id").ok()?;
            let delayed = reading.delayed.get(&id).copied().unwrap_or(0);
            let c = StateCounts::from_groups(reading.counts(id), delayed);
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
