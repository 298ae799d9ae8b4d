//! `GET /monitoring`: Nagios-style checks of node heartbeats and QueueBalance (always 200).

use axum::response::Response;
use serde_json::{json, Map, Value};

use crate::error::ApiResult;
use crate::namespace::Ns;
use crate::render::json_response;
use disbatch_model::fleet_time;

/// Disbatch's freshness window for both checks.
const FRESH_SECS: i64 = 60;

pub async fn get(Ns(state): Ns) -> ApiResult<Response> {
    if !state.config.monitoring {
        let off = json!({"status": "OK", "message": "monitoring disabled"});
        return Ok(json_response(
            &json!({"disbatch": off, "queuebalance": off}),
            false,
        ));
    }
    let now = fleet_time::now().timestamp_millis() / 1000;
    let disbatch = match state.store.nodes().list_nodes().await {
        Err(e) => {
            json!({"status": "CRITICAL", "message": format!("Could not get current Disbatch nodes: {}", e.short())})
        }
        Ok(nodes) if nodes.is_empty() => {
            json!({"status": "WARNING", "message": "No Disbatch nodes found"})
        }
        Ok(nodes) => {
            let (mut fresh, mut stale) = (Map::new(), Map::new());
            for n in &nodes {
                let name = n.get_str("node").unwrap_or("?").to_string();
                let age = n
                    .get_datetime("timestamp")
                    .map(|t| now - t.timestamp_millis() / 1000)
                    .unwrap_or(now);
                if age <= FRESH_SECS {
                    fresh.insert(name, Value::from(age));
                } else {
                    stale.insert(name, Value::from(age));
                }
            }
            let (status, message) = if fresh.is_empty() {
                ("CRITICAL", "No active Disbatch nodes found")
            } else {
                ("OK", "Disbatch is running on one or more nodes")
            };
            json!({"status": status, "message": message, "nodes": {"fresh": fresh, "stale": stale}})
        }
    };
    let queuebalance = if !state.config.balance.enabled {
        json!({"status": "OK", "message": "queuebalance disabled"})
    } else {
        match state.store.queues().balance_document().await {
            Err(e) => {
                json!({"status": "CRITICAL", "message": format!("Could not get balance document: {}", e.short())})
            }
            Ok(doc) => {
                let doc = doc.unwrap_or_default();
                let ts = match doc.get("timestamp") {
                    Some(bson::Bson::Int64(t)) => *t,
                    Some(bson::Bson::Int32(t)) => *t as i64,
                    Some(bson::Bson::Double(t)) => *t as i64,
                    Some(bson::Bson::DateTime(t)) => t.timestamp_millis() / 1000,
                    _ => 0,
                };
                let status = doc.get_str("status").unwrap_or("");
                // Saturating: the timestamp is whatever was stored, i64::MIN included.
                let age = now.saturating_sub(ts);
                if age > FRESH_SECS {
                    json!({"status": "CRITICAL", "message": format!("queuebalanced not running for {age}s")})
                } else if matches!(status, "OK" | "WARNING" | "CRITICAL") {
                    json!({"status": status, "message": doc.get_str("message").unwrap_or("")})
                } else {
                    json!({"status": "CRITICAL", "message": "queuebalanced unknown status", "result": status})
                }
            }
        }
    };
    Ok(json_response(
        &json!({"disbatch": disbatch, "queuebalance": queuebalance}),
        false,
    ))
}
