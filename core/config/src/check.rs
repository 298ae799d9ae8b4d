//! Every problem of a config at once (`--check-config`), not only the first that `load` stops at.

use std::path::Path;

use serde_json::{Map, Value};

use super::raw::RawConfig;
use super::Loaded;

/// Validates `value` as read from `path`. Keys of the wrong type are found one by one (the
/// decoder stops at the first); the other keys are then validated without them, so their
/// problems are listed too.
pub(super) fn all_problems(path: &Path, value: Value) -> Result<Loaded, Vec<String>> {
    let base = path.parent().unwrap_or(Path::new("."));
    let mut warnings = Vec::new();
    let first = match RawConfig::from_value(value.clone(), &mut warnings) {
        Ok(raw) => {
            return raw
                .validate(path, base, &mut warnings)
                .map(|config| Loaded { config, warnings })
        }
        Err(first) => first,
    };
    let mut problems = vec![first];
    let Value::Object(map) = value else {
        return Err(problems);
    };
    let mut bad_keys = Vec::new();
    for (key, v) in &map {
        if decodes(key, v.clone()) {
            continue;
        }
        bad_keys.push(key.clone());
        match v {
            // One level down: `web` may hold several keys of the wrong type.
            Value::Object(inner) if inner.len() > 1 => {
                for (sub, sv) in inner {
                    let single = Value::Object(Map::from_iter([(sub.clone(), sv.clone())]));
                    push_decode_error(&mut problems, key, single);
                }
            }
            _ => push_decode_error(&mut problems, key, v.clone()),
        }
    }
    let mut rest = map;
    for key in &bad_keys {
        rest.remove(key);
    }
    if let Ok(raw) = RawConfig::from_value(Value::Object(rest), &mut Vec::new()) {
        if let Err(more) = raw.validate(path, base, &mut Vec::new()) {
            // A key left out for its type would now also be "required": said once is enough.
            problems.extend(
                more.into_iter()
                    .filter(|m| !bad_keys.iter().any(|k| names_key(m, k))),
            );
        }
    }
    let mut seen = std::collections::HashSet::new();
    problems.retain(|p| seen.insert(p.clone()));
    Err(problems)
}

fn decodes(key: &str, value: Value) -> bool {
    let single = Value::Object(Map::from_iter([(key.to_string(), value)]));
    RawConfig::from_value(single, &mut Vec::new()).is_ok()
}

fn push_decode_error(problems: &mut Vec<String>, key: &str, value: Value) {
    let single = Value::Object(Map::from_iter([(key.to_string(), value)]));
    if let Err(e) = RawConfig::from_value(single, &mut Vec::new()) {
        problems.push(e);
    }
}

/// Whether a message is about `key` or a key under it (messages say "key `web.listen`: …").
fn names_key(message: &str, key: &str) -> bool {
    let needle = format!("key `{key}");
    message.match_indices(&needle).any(|(i, _)| {
        matches!(
            message[i + needle.len()..].chars().next(),
            Some('`' | '.' | '[')
        )
    })
}
