//! The QueueBalance document's rules: Disbatch's validation of what `POST /balance` may store.

use bson::{Bson, Document};
use serde_json::Value;

/// Validates a balance update and returns the fields to `$set`. The error is the reason
/// Disbatch appends to "failed: invalid json passed".
pub fn validate_balance(
    body: &Value,
    known_queues: &[String],
    now_epoch: i64,
) -> Result<Document, String> {
    let Value::Object(map) = body else {
        return Err("body must be an object".into());
    };
    let mut keys: Vec<&str> = map.keys().map(String::as_str).collect();
    keys.sort_unstable();
    if keys != ["max_tasks", "queues"] && keys != ["disabled", "max_tasks", "queues"] {
        return Err(format!(
            "keys must be max_tasks and queues, optionally disabled; got {}",
            keys.join(",")
        ));
    }
    let mut set = Document::new();
    if let Some(disabled) = map.get("disabled") {
        set.insert("disabled", validate_disabled(disabled, now_epoch)?);
    }
    set.insert("queues", validate_queues(&map["queues"], known_queues)?);
    set.insert("max_tasks", validate_max_tasks(&map["max_tasks"])?);
    Ok(set)
}

fn digits(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().filter(|i| *i >= 0),
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => {
            s.parse().ok()
        }
        _ => None,
    }
}

fn validate_disabled(v: &Value, now: i64) -> Result<Bson, String> {
    if v.is_null() {
        return Ok(Bson::Null);
    }
    let t = digits(v).ok_or("disabled must be null or epoch seconds")?;
    if t != 0 && t < now {
        return Err(format!("disabled {t} is in the past"));
    }
    Ok(Bson::Int64(t))
}

fn validate_queues(v: &Value, known: &[String]) -> Result<Bson, String> {
    let tiers = v
        .as_array()
        .ok_or("queues must be an array of arrays of queue names")?;
    let mut seen: Vec<&str> = Vec::new();
    let mut out = Vec::with_capacity(tiers.len());
    for tier in tiers {
        let names = tier
            .as_array()
            .ok_or("queues must be an array of arrays of queue names")?;
        let mut tier_out = Vec::with_capacity(names.len());
        for name in names {
            let name = name.as_str().ok_or("queue names must be strings")?;
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_alphanumeric() || c == '_' || c == '-')
            {
                return Err(format!("queue name {name:?} must match ^[\\w-]+$"));
            }
            if !known.iter().any(|k| k == name) {
                return Err(format!("queue {name} does not exist"));
            }
            if seen.contains(&name) {
                return Err(format!("queue {name} appears more than once"));
            }
            seen.push(name);
            tier_out.push(Bson::String(name.to_string()));
        }
        out.push(Bson::Array(tier_out));
    }
    Ok(Bson::Array(out))
}

/// Keys are `D HH:MM` with D a weekday 0–6 (0 = Sunday) or `*`.
pub fn is_valid_slot_key(key: &str) -> bool {
    let b = key.as_bytes();
    b.len() == 7
        && (b[0] == b'*' || (b'0'..=b'6').contains(&b[0]))
        && b[1] == b' '
        && b[4] == b':'
        && matches!(
            (b[2], b[3]),
            (b'0'..=b'1', b'0'..=b'9') | (b'2', b'0'..=b'3')
        )
        && (b'0'..=b'5').contains(&b[5])
        && b[6].is_ascii_digit()
}

fn validate_max_tasks(v: &Value) -> Result<Bson, String> {
    let map = v.as_object().ok_or("max_tasks must be an object")?;
    let mut out = Document::new();
    for (key, value) in map {
        if !is_valid_slot_key(key) {
            return Err(format!(
                "max_tasks key {key:?} must look like \"* 07:00\" or \"1 19:30\""
            ));
        }
        let n = digits(value)
            .ok_or_else(|| format!("max_tasks {key:?} must be a non-negative integer"))?;
        out.insert(key.clone(), Bson::Int64(n));
    }
    Ok(Bson::Document(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn known() -> Vec<String> {
        vec!["a".into(), "b-1".into(), "c_2".into()]
    }

    #[test]
    fn accepts_disbatch_shapes_and_converts_numeric_strings() {
        let set = validate_balance(
            &json!({"max_tasks": {"* 07:00": 5, "1 19:30": "15"}, "queues": [["a"], ["b-1", "c_2"]]}),
            &known(),
            1000,
        )
        .expect("valid");
        assert_eq!(
            set.get_document("max_tasks")
                .ok()
                .and_then(|m| m.get_i64("1 19:30").ok()),
            Some(15)
        );
        let set = validate_balance(
            &json!({"max_tasks": {}, "queues": [], "disabled": null}),
            &known(),
            1000,
        )
        .expect("valid");
        assert_eq!(set.get("disabled"), Some(&Bson::Null));
        assert!(validate_balance(
            &json!({"max_tasks": {}, "queues": [], "disabled": 0}),
            &known(),
            1000
        )
        .is_ok());
    }

    #[test]
    fn refuses_what_disbatch_refuses() {
        let bad = [
            json!({"max_tasks": {}}),
            json!({"max_tasks": {}, "queues": [], "extra": 1}),
            json!({"max_tasks": {"7 07:00": 1}, "queues": []}),
            json!({"max_tasks": {"* 24:00": 1}, "queues": []}),
            json!({"max_tasks": {"* 07:60": 1}, "queues": []}),
            json!({"max_tasks": {"* 07:00": 1.1}, "queues": []}),
            json!({"max_tasks": {"* 07:00": -1}, "queues": []}),
            json!({"max_tasks": {}, "queues": ["a"]}),
            json!({"max_tasks": {}, "queues": [["nope"]]}),
            json!({"max_tasks": {}, "queues": [["a"], ["a"]]}),
            json!({"max_tasks": {}, "queues": [["a b"]]}),
            json!({"max_tasks": {}, "queues": [], "disabled": 999}),
            json!({"max_tasks": {}, "queues": [], "disabled": "soon"}),
            json!([1]),
        ];
        for b in bad {
            assert!(
                validate_balance(&b, &known(), 1000).is_err(),
                "{b} should be refused"
            );
        }
    }
}
