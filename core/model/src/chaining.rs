//! Coordinate's `output` forms: the units a finished task adds to its queue's `then` queue.

use std::collections::BTreeMap;

use bson::{DateTime, Document};
use serde_json::Value;

use crate::task::Unit;

/// The units a result's `output` names, and the items that had to be left out because their
/// params cannot be stored (each said in a line fit for the task's stderr).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Chained {
    pub units: Vec<Unit>,
    pub problems: Vec<String>,
}

/// Units named by a result's `output`: a map `{key: params}`, or a list of items that are a
/// key, or `[key, params, meta?, priority?]` with meta `{priority, delay}`. Bad items are
/// skipped, never fatal (Coordinate's rule); a repeated key keeps its last item. Params are
/// read as the API reads them (Extended JSON for typed values). Whatever is left out is
/// reported in `problems` rather than dropped unseen: params that cannot be stored, a map
/// with a value that is not an object (which names nothing at all, as in Coordinate), an
/// `output` of another shape.
pub fn units_from_output(output: &Value, now: DateTime) -> Chained {
    let mut units: BTreeMap<String, Unit> = BTreeMap::new();
    let mut problems = Vec::new();
    match output {
        // Every value must be an object, or the map names nothing.
        Value::Object(map) if !map.values().all(Value::is_object) => {
            problems.push(map_not_chained(map));
        }
        Value::Object(map) => {
            for (key, data) in map {
                match to_document(data, &format!("output.{key}")) {
                    Ok(params) => {
                        units.insert(key.clone(), unit(key, params, None, None));
                    }
                    Err(why) => problems.push(format!("unit {key:?} not chained: {why}")),
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                match unit_from_item(item, i, now) {
                    Ok(Some(u)) => {
                        units.insert(u.key.clone(), u);
                    }
                    Ok(None) => {}
                    Err(why) => problems.push(why),
                }
            }
        }
        // The plugin said there is nothing to chain.
        Value::Null => {}
        other => problems.push(format!(
            "output not chained: it is {}, not a map of units or a list of items",
            kind(other)
        )),
    }
    Chained {
        units: units.into_values().collect(),
        problems,
    }
}

/// Why a map with values that are not objects chained nothing, naming the first few.
fn map_not_chained(map: &serde_json::Map<String, Value>) -> String {
    const NAMED: usize = 3;
    let bad: Vec<(&String, &Value)> = map.iter().filter(|(_, v)| !v.is_object()).collect();
    let mut named: Vec<String> = bad
        .iter()
        .take(NAMED)
        .map(|(k, v)| format!("{} is {}", shown_key(k), kind(v)))
        .collect();
    if bad.len() > NAMED {
        named.push(format!("and {} more", bad.len() - NAMED));
    }
    format!(
        "output not chained: a map chains only when every value is an object (the unit's params), and {}",
        named.join(", ")
    )
}

/// A key as a message shows it: quoted, and cut when long (a key may be megabytes).
fn shown_key(key: &str) -> String {
    const MOST: usize = 80;
    match key.char_indices().nth(MOST) {
        Some((cut, _)) => format!("{:?}…", &key[..cut]),
        None => format!("{key:?}"),
    }
}

/// What kind of JSON value `v` is, for a message.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn unit_from_item(item: &Value, i: usize, now: DateTime) -> Result<Option<Unit>, String> {
    Ok(match item {
        // The empty string is a key like any other (Coordinate accepts it).
        Value::String(key) => Some(unit(key, Document::new(), None, None)),
        Value::Array(parts) if parts.len() >= 2 => {
            let Some(key) = parts[0].as_str() else {
                return Ok(None);
            };
            if !parts[1].is_object() {
                return Ok(None);
            }
            let params = to_document(&parts[1], &format!("output[{i}][1]"))
                .map_err(|why| format!("unit {key:?} not chained: {why}"))?;
            let meta = parts.get(2).and_then(Value::as_object);
            let mut priority = meta.and_then(|m| m.get("priority")).and_then(Value::as_f64);
            match parts.get(3).map(|p| (p, p.as_f64())) {
                None | Some((Value::Null, _)) => {}
                Some((_, Some(p))) => priority = Some(p),
                Some((_, None)) => return Ok(None),
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
            Some(unit(
                key,
                params,
                priority.filter(|p| p.is_finite()),
                not_before,
            ))
        }
        _ => None,
    })
}

fn unit(key: &str, params: Document, priority: Option<f64>, not_before: Option<DateTime>) -> Unit {
    Unit {
        key: key.to_string(),
        params,
        priority,
        not_before,
    }
}

fn to_document(v: &Value, path: &str) -> Result<Document, String> {
    crate::text::client_json::task_params(v, path)
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
        let units = units_from_output(&json!({"b": {"x": 1}, "a": {}}), now).units;
        assert_eq!(keys(&units), ["a", "b"]);
        assert_eq!(units[1].params, doc! {"x": 1});
    }

    #[test]
    fn a_map_with_a_value_that_is_not_an_object_chains_nothing_and_says_which() {
        let now = DateTime::now();
        let one = units_from_output(&json!({"a": {}, "b": 5}), now);
        assert!(one.units.is_empty());
        assert_eq!(
            one.problems,
            ["output not chained: a map chains only when every value is an object (the unit's params), and \"b\" is a number"]
        );
        let many = units_from_output(
            &json!({"a": "x", "b": [], "c": null, "d": true, "e": {}, &"k".repeat(200): 1}),
            now,
        );
        assert!(many.units.is_empty());
        let said = &many.problems[0];
        assert!(
            said.ends_with("\"a\" is a string, \"b\" is a list, \"c\" is null, and 2 more"),
            "{said}"
        );
        let long = units_from_output(&json!({&"k".repeat(200): 1}), now).problems;
        assert!(
            long[0].contains(&format!("\"{}\"… is a number", "k".repeat(80))),
            "{long:?}"
        );
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
        let units = units_from_output(&out, now).units;
        assert_eq!(keys(&units), ["meta", "override", "plain", "with-data"]);
        let get = |k: &str| units.iter().find(|u| u.key == k).cloned().expect(k);
        assert_eq!(
            get("plain").params,
            doc! {"again": true},
            "the last item for a key wins"
        );
        assert_eq!(get("meta").priority, Some(5.0));
        assert_eq!(
            get("meta").not_before,
            Some(DateTime::from_millis(1_002_000)),
            "delay truncated to seconds"
        );
        assert_eq!(get("override").priority, Some(9.0));
        assert_eq!(get("with-data").not_before, None);
    }

    #[test]
    fn params_that_cannot_be_stored_are_reported_and_the_rest_chained() {
        let now = DateTime::now();
        let map = units_from_output(
            &json!({"ok": {"n": {"$numberLong": "5"}}, "bad": {"n": {"$numberLong": "x"}}}),
            now,
        );
        assert_eq!(keys(&map.units), ["ok"]);
        assert_eq!(map.units[0].params, doc! {"n": 5_i64});
        assert_eq!(map.problems.len(), 1);
        assert!(
            map.problems[0].contains("\"bad\"") && map.problems[0].contains("output.bad.n"),
            "{:?}",
            map.problems
        );
        let list = units_from_output(
            &json!([["a", {"u": {"$undefined": true}}], ["b", {}], ["c", {"d": {"$date": "x"}}]]),
            now,
        );
        assert_eq!(keys(&list.units), ["b"]);
        assert_eq!(list.problems.len(), 2, "{:?}", list.problems);
        assert!(
            list.problems[0].contains("output[0][1].u"),
            "{:?}",
            list.problems
        );
        assert!(
            list.problems[1].contains("output[2][1].d"),
            "{:?}",
            list.problems
        );
    }

    #[test]
    fn priorities_stay_fractions_and_the_empty_key_is_a_key() {
        let now = DateTime::now();
        let out = json!(["", ["a", {}, {"priority": 2.7}], ["b", {}, null, -0.5]]);
        let units = units_from_output(&out, now).units;
        assert_eq!(keys(&units), ["", "a", "b"]);
        assert_eq!(units[1].priority, Some(2.7));
        assert_eq!(units[2].priority, Some(-0.5));
        assert_eq!(units[0].priority, None);
    }

    #[test]
    fn other_shapes_name_nothing_and_say_so_unless_null() {
        for v in [json!("x"), json!(3), json!(true)] {
            let chained = units_from_output(&v, DateTime::now());
            assert!(chained.units.is_empty());
            assert_eq!(chained.problems.len(), 1, "{v}");
            assert!(chained.problems[0].starts_with("output not chained: it is a"));
        }
        assert_eq!(
            units_from_output(&json!(null), DateTime::now()),
            Chained::default()
        );
    }
}
