//! A queue's run settings through the API (worker, timeouts, lease, retries, work-spec
//! fields): which role changes each, and reading their values from a request.

use bson::Bson;
use disbatch_model::schema::queue as field;
use serde_json::Value;

use crate::error::{ApiError, ApiResult};

/// Settings that tune how a queue's tasks run: the `operate` role changes them, as it does
/// `threads` and the flow limits.
pub const OPERATE: [&str; 14] = [
    field::RETRY,
    field::TIMEOUT,
    field::KILL_GRACE,
    field::LEASE,
    field::ON_LOST,
    field::MAX_RETRIES,
    field::ON_DEPENDENCY_FAILURE,
    field::PRIORITY,
    field::WEIGHT,
    field::MAX_GETWORK,
    field::WORKER_IDLE_S,
    field::WORKER_MAX_TASKS,
    field::WORKER_MAX_RSS_MB,
    field::WORKER_START_S,
];

/// Settings that change what runs, or where, or delete history: `admin`, as a new plugin is.
pub const ADMIN: [&str; 8] = [
    field::RETAIN,
    field::WORKER,
    field::CONFIG,
    field::THEN,
    field::CONTINUOUS,
    field::INTERVAL,
    field::RUNTIME,
    field::MIN_GB,
];

/// Whether `name` is one of the settings, and so read by `value`.
pub fn is_setting(name: &str) -> bool {
    OPERATE.contains(&name) || ADMIN.contains(&name)
}

/// Every setting, as a reader of the queue is shown them.
pub fn all() -> impl Iterator<Item = &'static str> {
    OPERATE.into_iter().chain(ADMIN)
}

/// A setting's value from a request: None for null, which removes the setting (its default
/// applies again). Checked afterwards with the reader every node uses
/// (`check_queue_fields`), which names the field and what is wrong.
pub fn value(name: &str, v: &Value) -> ApiResult<Option<Bson>> {
    match v {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(Bson::Boolean(*b))),
        Value::String(s) => Ok(Some(Bson::String(s.clone()))),
        Value::Number(n) => Ok(Some(match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Bson::Int64(i),
            (None, Some(f)) => Bson::Double(f),
            (None, None) => {
                return Err(ApiError::bad_request(format!(
                    "{name} must be a number the database can store, found {n}"
                )))
            }
        })),
        Value::Object(_) | Value::Array(_) => disbatch_model::text::client_json::storable(v, name)
            .map(Some)
            .map_err(ApiError::bad_request),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_keep_their_json_type_and_null_removes() {
        assert_eq!(
            value("timeout", &json!(30)).ok().flatten(),
            Some(Bson::Int64(30))
        );
        assert_eq!(
            value("lease", &json!(2.5)).ok().flatten(),
            Some(Bson::Double(2.5))
        );
        assert_eq!(
            value("worker", &json!("persistent")).ok().flatten(),
            Some(Bson::String("persistent".into()))
        );
        assert_eq!(value("retry", &json!(null)).ok().flatten(), None);
        assert!(matches!(
            value("config", &json!({"a": 1})).ok().flatten(),
            Some(Bson::Document(_))
        ));
        assert!(is_setting("worker") && is_setting("timeout") && !is_setting("name"));
    }
}
