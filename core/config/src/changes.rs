//! What a reload changed: config values compared key by key, and restart-only keys kept.

use serde_json::Value;

/// Keys whose values differ between two configs as read: top-level keys, and `web.KEY` for
/// the keys of `web` (the DCI applies some of them and not others). Sorted.
pub fn changed_keys(old: &Value, new: &Value) -> Vec<String> {
    let mut changed = Vec::new();
    for key in keys(old, new) {
        let (o, n) = (field(old, &key), field(new, &key));
        if o == n {
            continue;
        }
        let objects = matches!(o, Some(Value::Object(_)) | None)
            && matches!(n, Some(Value::Object(_)) | None);
        if key == "web" && objects {
            let empty = Value::Object(Default::default());
            let (o, n) = (o.unwrap_or(&empty), n.unwrap_or(&empty));
            for sub in keys(o, n) {
                if field(o, &sub) != field(n, &sub) {
                    changed.push(format!("web.{sub}"));
                }
            }
        } else {
            changed.push(key);
        }
    }
    changed.sort();
    changed
}

/// `new` with each of `keys` (`KEY` or `web.KEY`) as it is in `old`, or absent when `old`
/// lacks it: the config a running process goes on with when those keys need a restart.
pub fn keep_keys(old: &Value, mut new: Value, keys: &[String]) -> Value {
    for key in keys {
        let (parent_old, parent_new, name) = match key.split_once('.') {
            Some((top, sub)) => {
                let Some(o) = old.get(top) else {
                    remove(new.get_mut(top), sub);
                    continue;
                };
                (Some(o), new.get_mut(top), sub)
            }
            None => (Some(old), Some(&mut new), key.as_str()),
        };
        match parent_old.and_then(|o| o.get(name)) {
            Some(v) => {
                if let Some(Value::Object(map)) = parent_new {
                    map.insert(name.to_string(), v.clone());
                }
            }
            None => remove(parent_new, name),
        }
    }
    new
}

fn remove(parent: Option<&mut Value>, name: &str) {
    if let Some(Value::Object(map)) = parent {
        map.remove(name);
    }
}

fn field<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    value.get(key).filter(|v| !v.is_null())
}

fn keys(a: &Value, b: &Value) -> std::collections::BTreeSet<String> {
    [a, b]
        .into_iter()
        .filter_map(Value::as_object)
        .flat_map(|m| m.keys().cloned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn changes_are_named_by_key_and_web_by_its_keys() {
        let old = json!({"database": "a", "plugins": {"x": "/x"}, "web": {"listen": ":1"}});
        let new = json!({"database": "b", "plugins": {"x": "/x"}, "node": null,
            "web": {"listen": ":2", "tokens": []}, "log_level": "debug"});
        assert_eq!(
            changed_keys(&old, &new),
            ["database", "log_level", "web.listen", "web.tokens"]
        );
    }

    #[test]
    fn kept_keys_come_from_the_old_config() {
        let old = json!({"database": "a", "web": {"listen": ":1"}});
        let new = json!({"database": "b", "node": "n", "web": {"listen": ":2", "tokens": []}});
        let kept = keep_keys(
            &old,
            new,
            &["database".into(), "node".into(), "web.listen".into()],
        );
        assert_eq!(
            kept,
            json!({"database": "a", "web": {"listen": ":1", "tokens": []}})
        );
    }
}
