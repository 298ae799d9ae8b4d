//! `/balance`: the QueueBalance document, read and validated writes (Disbatch's rules).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use disbatch_model::balance::validate_balance;
use disbatch_model::fleet_time;
use serde_json::{json, Value};

use crate::error::ApiResult;
use crate::namespace::Ns;
use crate::params::Params;
use crate::render::{self, json_response, Dates};

pub async fn get(Ns(state): Ns) -> ApiResult<Response> {
    let (doc, names) = futures::try_join!(
        state.store.queues().balance_document(),
        state.store.queues().queue_names()
    )?;
    let b = &state.config.balance;
    let mut out = match doc {
        Some(mut d) => {
            d.remove("_id");
            render::document(&d, Dates::Text)
        }
        None => json!({"notice": "balance document not found"}),
    };
    if let Value::Object(m) = &mut out {
        // Sorted by name, as Disbatch 4 lists them.
        let mut names = names;
        names.sort();
        m.insert("known_queues".into(), json!(names));
        // As the file wrote them (`1` stays 1, as Disbatch echoed its config); a switch the
        // file left out shows its default.
        let mut settings =
            json!({"enabled": b.enabled, "log": b.log, "verbose": b.verbose, "pretend": b.pretend});
        if let Value::Object(s) = &mut settings {
            for (key, written) in &b.written {
                s.insert(key.clone(), written.clone());
            }
        }
        m.insert("settings".into(), settings);
        m.sort_keys();
    }
    Ok(json_response(&out, true))
}

pub async fn set(Ns(state): Ns, mut p: Params) -> ApiResult<Response> {
    // `disabled: null` re-enables balancing; left out, it would leave a pause in place.
    let body = match p.body.take() {
        Some(body) => body,
        None => Value::Object(p.given_keeping_null(&["disabled"])),
    };
    let names = state.store.queues().queue_names().await?;
    match validate_balance(&body, &names, fleet_time::now().timestamp_millis() / 1000) {
        Ok(set) => {
            state.store.queues().set_balance(set).await?;
            Ok(json_response(
                &json!({"status": "success: queuebalance modified"}),
                false,
            ))
        }
        Err(reason) => Ok((
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"status": format!("failed: invalid json passed {reason}")})),
        )
            .into_response()),
    }
}
