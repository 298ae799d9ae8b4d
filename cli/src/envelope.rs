//! Reading the server's result shapes: `MongoDB::*Result` envelopes and `{"$oid":…}` ids.

use anyhow::{anyhow, bail};
use serde_json::{Map, Value};

/// The object under `class` (e.g. `MongoDB::UpdateResult`).
pub fn envelope<'a>(reply: &'a Value, class: &str) -> anyhow::Result<&'a Map<String, Value>> {
    reply.get(class).and_then(Value::as_object).ok_or_else(|| {
        anyhow!(
            "unexpected response from the server: no {class} in {}",
            short(reply)
        )
    })
}

/// A count such as `modified_count` from an envelope; Perl servers may send it as a string.
pub fn count(reply: &Value, class: &str, field: &str) -> anyhow::Result<u64> {
    let value = envelope(reply, class)?.get(field);
    match value.and_then(as_count) {
        Some(n) => Ok(n),
        None => bail!(
            "unexpected response from the server: {class}.{field} is not a count in {}",
            short(reply)
        ),
    }
}

fn as_count(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// The hex id of an ObjectId as the server writes it: `{"$oid":"…"}`, or a plain string.
pub fn oid(value: &Value) -> Option<&str> {
    match value {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("$oid").and_then(Value::as_str),
        _ => None,
    }
}

/// The ids of an InsertManyResult's `inserted` list, in order.
pub fn inserted_ids(reply: &Value) -> anyhow::Result<Vec<String>> {
    let result = envelope(reply, "MongoDB::InsertManyResult")?;
    let Some(inserted) = result.get("inserted").and_then(Value::as_array) else {
        bail!(
            "unexpected response from the server: no inserted list in {}",
            short(reply)
        );
    };
    inserted
        .iter()
        .map(|entry| {
            entry
                .get("_id")
                .and_then(oid)
                .map(str::to_string)
                .ok_or_else(|| {
                    anyhow!(
                        "unexpected response from the server: inserted entry {entry} has no _id"
                    )
                })
        })
        .collect()
}

/// A creation's duplicates, `(input index, id of the task it matched)`, from either answer
/// of `POST /tasks`: Disbatch's (`duplicates: [{"_id", "index"}]`, only for a queue with
/// `unique`) or `answer: ids` (`duplicates: [{"index", "matched"}]`). None listed: none.
pub fn duplicates(reply: &Value) -> Vec<(usize, String)> {
    reply
        .get("duplicates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|d| {
            let index = usize::try_from(d.get("index")?.as_u64()?).ok()?;
            let matched = d.get("matched").or_else(|| d.get("_id")).and_then(oid)?;
            Some((index, matched.to_string()))
        })
        .collect()
}

/// A reply clipped for an error message.
fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 300 {
        text.chars().take(300).collect::<String>() + "…"
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_from_envelopes() {
        let reply = json!({"MongoDB::UpdateResult": {"matched_count": 1, "modified_count": 1}});
        assert_eq!(
            count(&reply, "MongoDB::UpdateResult", "modified_count").unwrap(),
            1
        );
        let reply = json!({"MongoDB::DeleteResult": {"deleted_count": "2"}});
        assert_eq!(
            count(&reply, "MongoDB::DeleteResult", "deleted_count").unwrap(),
            2
        );
        assert!(count(&json!({}), "MongoDB::DeleteResult", "deleted_count").is_err());
        assert!(count(&json!([]), "MongoDB::DeleteResult", "deleted_count").is_err());
        let reply = json!({"MongoDB::DeleteResult": {"deleted_count": -1}});
        assert!(count(&reply, "MongoDB::DeleteResult", "deleted_count").is_err());
    }

    #[test]
    fn ids_in_either_form() {
        assert_eq!(oid(&json!({"$oid": "abc"})), Some("abc"));
        assert_eq!(oid(&json!("abc")), Some("abc"));
        assert_eq!(oid(&json!(1)), None);
        let reply = json!({"MongoDB::InsertManyResult": {"inserted": [
            {"index": 0, "_id": {"$oid": "a"}}, {"index": 1, "_id": {"$oid": "b"}}]}});
        assert_eq!(inserted_ids(&reply).unwrap(), vec!["a", "b"]);
        let bad = json!({"MongoDB::InsertManyResult": {"inserted": [{"index": 0}]}});
        assert!(inserted_ids(&bad).is_err());
    }
}
