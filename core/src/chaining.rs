//! Coordinate's `output` forms: the units a finished task adds to its queue's `then` queue.

use std::collections::BTreeMap;

use bson::{DateTime, Document};
use serde_json::Value;

use crate::store::Unit;

/// Units named by a result's `output`: a map `{key: params}`, or a list of items that are a
/// key, or `[key, params, meta?, priority?]` with meta `{priority, delay}`. Bad items are
/// skipped, never fatal (Coordinate's rule); a repeated key keeps its last item.
pub fn units_from_output(output: &Value, now: DateTime) -> Vec<Unit> {
    let mut units: BTreeMap<String, Unit> = BTreeMap::new();
    match output {
        // Every value must be an object, or the map names nothing.
        Value::Object(map) if map.values().all(Value::is_object) => {
            for (key, data) in map {
                if let Some(params) = to_document(data) {
                    units.insert(key.clone(), unit(key, params, None, None));
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                if let Some(u) = unit_from_item(item, now) {
                    units.insert(u.key.clone(), u);
                }
            }
        }
        _ => {}
    }
    units.into_values().collect()
}

fn unit_from_item(item: &Value, now: DateTime) -> Option<Unit> {
    match item {
        Value::String(key) if !key.is_empty() => Some(unit(key, Document::new(), None, None)),
        Value::Array(parts) if parts.len() >= 2 => {
            let key = parts[0].as_str().filter(|k| !k.is_empty())?;
            let params = to_document(&parts[1])?;
            let meta = parts.get(2).and_then(Value::as_object);
            let mut priority = meta.and_then(|m| m.get("priority")).and_then(Value::as_f64);
            match parts.get(3) {
                None | Some(Value::Null) => {}
                Some(p) => priority = Some(p.as_f64()?),
            }
            let delay = meta
                .and_then(|m| m.get("delay"))
                .and_then(Value::as_f64)
                .unwrap_or(0.0);
            let not_before = (delay >= 1.0).then(|| {
                // `as` saturates; the arithmetic must too, for a plugin's absurd delay.
                let millis = (delay.trunc() as i64).saturating_mul(1000);
                DateTime::from_millis(now.timestamp_millis().saturating_add(millis))
            });
            Some(unit(key, params, priority.map(|p| p as i64), not_before))
        }
        _ => None,
    }
}

fn unit(key: &str, params: Document, priority: Option<i64>, not_before: Option<DateTime>) -> Unit {
    Unit {
        key: key.to_string(),
        params,
        priority,
        not_before,
    }
}

fn to_document(v: &Value) -> Option<Document> {
    match bson::Bson::try_from(v.clone()).ok()? {
        bson::Bson::Document(d) => Some(d),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;
    use serde_json::json;

    fn keys(units: &[Unit]) -> Vec<&str> {
        units.iter().map(|u| u.key.as_str()).collect()
    }

    #[test]
    fn a_map_names_one_unit_per_key_when_every_value_is_an_object() {
        let now = DateTime::now();
        let units = units_from_output(&json!({"b": {"x": 1}, "a": {}}), now);
        assert_eq!(keys(&units), ["a", "b"]);
        assert_eq!(units[1].params, doc! {"x": 1});
        assert!(units_from_output(&json!({"a": {}, "b": 5}), now).is_empty());
    }

    #[test]
    fn list_items_are_keys_or_key_params_meta_priority() {
        let now = DateTime::from_millis(1_000_000);
        let out = json!([
            "plain",
            ["with-data", {"n": 1}],
            ["meta", {}, {"priority": 5, "delay": 2.9}],
            ["override", {}, {"priority": 5}, 9],
            ["bad-priority", {}, null, "high"],
            ["short"],
            [7, {}],
            {"not": "an item"},
            ["plain", {"again": true}]
        ]);
        let units = units_from_output(&out, now);
        assert_eq!(keys(&units), ["meta", "override", "plain", "with-data"]);
        let get = |k: &str| units.iter().find(|u| u.key == k).cloned().expect(k);
        assert_eq!(
            get("plain").params,
            doc! {"again": true},
            "the last item for a key wins"
        );
        assert_eq!(get("meta").priority, Some(5));
        assert_eq!(
            get("meta").not_before,
            Some(DateTime::from_millis(1_002_000)),
            "delay truncated to seconds"
        );
        assert_eq!(get("override").priority, Some(9));
        assert_eq!(get("with-data").not_before, None);
    }

    #[test]
    fn other_shapes_name_nothing() {
        for v in [json!(null), json!("x"), json!(3), json!(true)] {
            assert!(units_from_output(&v, DateTime::now()).is_empty());
        }
    }
}
