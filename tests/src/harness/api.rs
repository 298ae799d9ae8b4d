//! Expected shapes for black-box API tests: error bodies, result envelopes, canonical keys.

use serde_json::{json, Value};

/// Disbatch's error body.
pub fn error(text: &str) -> Value {
    json!({ "error": text })
}

/// The Perl driver's `MongoDB::UpdateResult` envelope.
pub fn update_result(matched: u64, modified: u64) -> Value {
    json!({"MongoDB::UpdateResult": {
        "acknowledged": 1, "matched_count": matched, "modified_count": modified,
        "upserted_id": null, "write_errors": [], "write_concern_errors": [],
    }})
}

/// The Perl driver's `MongoDB::DeleteResult` envelope.
pub fn delete_result(deleted: u64) -> Value {
    json!({"MongoDB::DeleteResult": {
        "acknowledged": 1, "deleted_count": deleted, "write_errors": [], "write_concern_errors": [],
    }})
}

/// Every object key at every depth is in sorted order (Disbatch encoded canonically).
pub fn assert_sorted_keys(v: &Value) {
    // Only meaningful when parsing keeps the server's key order (serde_json `preserve_order`).
    let probe: Value = serde_json::from_str(r#"{"b": 1, "a": 2}"#).expect("probe");
    let first = probe.as_object().and_then(|m| m.keys().next().cloned());
    assert_eq!(
        first.as_deref(),
        Some("b"),
        "serde_json must keep key order"
    );
    match v {
        Value::Object(m) => {
            let keys: Vec<&String> = m.keys().collect();
            let mut sorted = keys.clone();
            sorted.sort();
            assert_eq!(keys, sorted, "keys not sorted in {v}");
            m.values().for_each(assert_sorted_keys);
        }
        Value::Array(items) => items.iter().for_each(assert_sorted_keys),
        _ => {}
    }
}
