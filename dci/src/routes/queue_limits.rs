//! A queue's flow limits through the API: reading `rate_limit`, `concurrency` and `unique` from
//! a request, refusing claim limits while Perl nodes serve, and the queue's budget as JSON.

use bson::{Bson, DateTime, Document};
use disbatch_model::held::HeldLimit;
use disbatch_model::limits::FlowLimits;
use disbatch_model::schema::queue as field;
use disbatch_store::QueueFlow;
use serde_json::{json, Map, Value};

use crate::error::{ApiError, ApiResult};
use crate::render::{self, Dates};
use crate::state::AppState;

/// The queue fields of the flow limits, as requests name them.
pub const FIELDS: [&str; 3] = [field::RATE_LIMIT, field::CONCURRENCY, field::UNIQUE];
/// The limits a Perl DEN would claim past: it knows neither.
const CLAIM_LIMITS: [&str; 2] = [field::RATE_LIMIT, field::CONCURRENCY];

/// A limit field's value from a request: an object (or its JSON text, as a form sends it)
/// to store, or None for null, which removes the limit.
pub fn value(name: &str, v: &Value) -> ApiResult<Option<Bson>> {
    let parsed;
    let v = match v {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text).map_err(|_| {
                ApiError::bad_request(format!(
                    "{name} must be an object or null, found the text {text:?}"
                ))
            })?;
            &parsed
        }
        other => other,
    };
    match v {
        Value::Null => Ok(None),
        Value::Object(_) => disbatch_model::text::client_json::storable(v, name)
            .map(Some)
            .map_err(ApiError::bad_request),
        other => Err(ApiError::bad_request(format!(
            "{name} must be an object or null, found {other}"
        ))),
    }
}

/// `force`: true or false (or their form texts).
pub fn force(p: &Map<String, Value>) -> ApiResult<bool> {
    match p.get("force") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(false),
        Some(Value::Bool(true)) => Ok(true),
        Some(Value::String(s)) if matches!(s.as_str(), "1" | "true") => Ok(true),
        Some(Value::String(s)) if matches!(s.as_str(), "0" | "false" | "") => Ok(false),
        Some(other) => Err(ApiError::bad_request(format!(
            "force must be true or false, found {other}"
        ))),
    }
}

/// Refuses to set a rate limit or per-key concurrency on queue `name` while a live Perl
/// Disbatch node is in the fleet: it claims outside both, so neither would hold. `force`
/// sets them anyway (the Perl nodes serve other queues, or are about to leave).
pub async fn refuse_beside_perl(
    state: &AppState,
    name: &str,
    set: &Document,
    force: bool,
) -> ApiResult<()> {
    let asked: Vec<&str> = CLAIM_LIMITS
        .into_iter()
        .filter(|k| !matches!(set.get(*k), None | Some(Bson::Null)))
        .collect();
    if asked.is_empty() || force {
        return Ok(());
    }
    let fleet = state
        .store
        .nodes()
        .live_nodes(state.config.web.live_window)
        .await?;
    if fleet.others.is_empty() {
        return Ok(());
    }
    let mut perl = fleet.others;
    perl.sort();
    Err(ApiError::conflict(format!(
        "cannot set {} on queue {name}: live Perl Disbatch node(s) {} claim tasks past every flow limit, \
         so the limit would not hold while they serve the queue; stop them or keep them off this queue, \
         or send \"force\": true to set it anyway",
        asked.join(" and "),
        perl.join(", ")
    )))
}

/// The limits as set on queue document `d`, for its row: only those it has.
pub fn as_set(d: &Document, row: &mut Map<String, Value>) {
    for k in FIELDS {
        if let Some(v) = d.get(k).filter(|v| !matches!(v, Bson::Null)) {
            row.insert(k.to_string(), render::bson(v, Dates::Text));
        }
    }
}

/// The queue's budget now: `{at, rate_limit?, concurrency?, held}` (see the README).
pub fn flow_json(flow: &QueueFlow, limits: &FlowLimits) -> Value {
    let date = |d: Option<DateTime>| d.map_or(Value::Null, |d| render::date(d, Dates::Text));
    let mut out = Map::new();
    out.insert("at".into(), render::date(flow.now, Dates::Text));
    if let (Some(b), Some(r)) = (&flow.rate, &limits.rate) {
        let rate = match &r.partition {
            None => {
                let used = b.busiest.first().map_or(0, |p| p.used);
                json!({
                    "used": used,
                    "left": u64::from(r.starts).saturating_sub(used),
                    "next_free": date(b.busiest.first().and_then(|p| p.next_free)),
                })
            }
            Some(_) => json!({
                "live_partitions": b.live_partitions,
                "max_partitions": r.max_partitions,
                "exhausted_partitions": b.exhausted_partitions,
                "next_partition_free": date(b.next_partition_free),
                "busiest": b.busiest.iter().map(|p| json!({
                    "partition": render::bson(&p.partition, Dates::Text),
                    "used": p.used,
                    "left": p.left,
                    "next_free": date(p.next_free),
                })).collect::<Vec<_>>(),
            }),
        };
        out.insert("rate_limit".into(), rate);
    }
    if let Some(c) = &flow.concurrency {
        out.insert(
            "concurrency".into(),
            json!({
                "holding": c.holding,
                "keys": c.keys,
                "keys_at_max": c.keys_at_max,
                "at_max": c.at_max.iter().map(|(k, n)| json!({
                    "key": render::bson(k, Dates::Text),
                    "holding": n,
                })).collect::<Vec<_>>(),
            }),
        );
    }
    let mut held = Map::new();
    for limit in HeldLimit::ALL {
        held.insert(limit.as_str().into(), json!(flow.held.get(limit)));
    }
    held.insert("scanned".into(), json!(flow.held.scanned));
    held.insert("capped".into(), json!(flow.held.capped));
    out.insert("held".into(), Value::Object(held));
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_is_an_object_its_text_or_null() {
        let v = value("rate_limit", &json!({"starts": 5, "per_s": 1})).expect("ok");
        assert!(matches!(v, Some(Bson::Document(_))));
        let v = value("rate_limit", &json!("{\"starts\": 5, \"per_s\": 1}")).expect("ok");
        assert!(matches!(v, Some(Bson::Document(_))));
        assert_eq!(value("unique", &Value::Null).expect("ok"), None);
        for bad in [json!(5), json!("soon"), json!([1])] {
            let e = value("concurrency", &bad).expect_err("refused");
            assert!(
                e.body["error"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("concurrency must be"),
                "{bad}"
            );
        }
    }

    #[test]
    fn force_takes_booleans_and_their_texts() {
        let p = |v: Value| json!({"force": v}).as_object().cloned().unwrap_or_default();
        assert!(force(&p(json!(true))).expect("ok"));
        assert!(force(&p(json!("1"))).expect("ok"));
        assert!(!force(&p(json!(false))).expect("ok"));
        assert!(!force(&Map::new()).expect("ok"));
        assert!(force(&p(json!(2))).is_err());
    }
}
