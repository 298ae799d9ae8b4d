//! A queue's cron schedule through the API: reading the `schedule*` fields from a request
//! (checked by `check_queue_fields`, as the leader reads them) and showing them on its row.

use bson::{Bson, Document};
use disbatch_model::schedule::{self, LEADER_FIELDS};
use disbatch_model::schema::queue as field;
use serde_json::{json, Map, Value};

use crate::error::{ApiError, ApiResult};
use crate::render::{self, Dates};

/// The queue fields of a schedule, as requests name them.
pub use disbatch_model::schedule::FIELDS;

/// A schedule field's value from a request: the value to store, or None for null, which
/// removes it. `schedule_params` is an object (or its JSON text, as a form sends it); the
/// others are strings.
pub fn value(name: &str, v: &Value) -> ApiResult<Option<Bson>> {
    match (name, v) {
        (_, Value::Null) => Ok(None),
        (field::SCHEDULE_PARAMS, Value::String(text)) => {
            let parsed = serde_json::from_str::<Value>(text).map_err(|_| {
                ApiError::bad_request(format!(
                    "{name} must be an object or null, found the text {text:?}"
                ))
            })?;
            value(name, &parsed)
        }
        (field::SCHEDULE_PARAMS, v @ Value::Object(_)) => {
            disbatch_model::text::client_json::storable(v, name)
                .map(Some)
                .map_err(ApiError::bad_request)
        }
        (field::SCHEDULE_PARAMS, other) => Err(ApiError::bad_request(format!(
            "{name} must be an object or null, found {other}"
        ))),
        (_, Value::String(s)) => Ok(Some(Bson::String(s.clone()))),
        (_, other) => Err(ApiError::bad_request(format!(
            "{name} must be a string or null, found {other}"
        ))),
    }
}

/// The fields to remove with the ones a request removes: without `schedule`, the leader's
/// record of it goes too, so a schedule set again later starts from then.
pub fn also_unset(unset: &mut Vec<&'static str>) {
    if unset.contains(&field::SCHEDULE) {
        unset.extend(LEADER_FIELDS);
    }
}

/// The schedule fields set on queue document `d`, for its row: only those it has. A scheduled
/// queue is marked `scheduled`, with its next tick after `now` (the fleet's time) in UTC and in
/// its zone, or `schedule_error` when the leader cannot read it (and skips it).
pub fn as_set(d: &Document, now: bson::DateTime, row: &mut Map<String, Value>) {
    for k in FIELDS.iter().chain(&[field::SCHEDULE_LAST]) {
        if let Some(v) = d.get(*k).filter(|v| !matches!(v, Bson::Null)) {
            row.insert(k.to_string(), render::bson(v, Dates::Text));
        }
    }
    let Some(schedule) = schedule::read(d) else {
        return;
    };
    row.insert("scheduled".into(), Value::Bool(true));
    match schedule.and_then(|s| s.next_shown(now)) {
        Ok(Some(next)) => {
            row.insert(
                "schedule_next".into(),
                json!({"utc": next.utc, "local": next.local, "zone": next.zone}),
            );
        }
        // Within croner's search of a year, none: shown as none rather than guessed.
        Ok(None) => {
            row.insert("schedule_next".into(), Value::Null);
        }
        Err(problem) => {
            row.insert("schedule_error".into(), Value::String(problem));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_params_objects_and_null_to_remove() {
        assert_eq!(
            value("schedule", &json!("*/5 * * * *")).expect("ok"),
            Some(Bson::String("*/5 * * * *".into()))
        );
        assert_eq!(value("schedule_tz", &Value::Null).expect("ok"), None);
        let p = value("schedule_params", &json!({"a": 1})).expect("ok");
        assert!(matches!(p, Some(Bson::Document(_))));
        let p = value("schedule_params", &json!("{\"a\": 1}")).expect("ok");
        assert!(matches!(p, Some(Bson::Document(_))));
        for (k, bad) in [
            ("schedule", json!(5)),
            ("schedule_missed", json!(["once"])),
            ("schedule_params", json!([1])),
            ("schedule_params", json!("soon")),
        ] {
            let e = value(k, &bad).expect_err("refused");
            let text = e.body["error"].as_str().unwrap_or("").to_string();
            assert!(text.starts_with(k), "{k}: {text}");
        }
    }

    #[test]
    fn removing_the_schedule_removes_the_leaders_record() {
        let mut unset = vec![field::SCHEDULE];
        also_unset(&mut unset);
        assert!(unset.contains(&field::SCHEDULE_LAST));
        let mut unset = vec![field::SCHEDULE_TZ];
        also_unset(&mut unset);
        assert_eq!(unset, [field::SCHEDULE_TZ]);
    }
}
