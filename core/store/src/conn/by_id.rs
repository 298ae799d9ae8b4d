//! Conditional writes found by `_id` alone: a filter of equalities and an update of `$set`,
//! `$unset` and `$inc` rewritten as the filter `{_id}` and an update pipeline that changes
//! the document only where the other equalities hold. A server then finds the document
//! without planning (mongod's IDHACK takes `{_id: v}` and nothing more; SecantusDB plans any
//! other filter against each of the tasks' nine indexes: 0.58 against 0.29 ms of its CPU per
//! update, measured), and `nModified`, not `n`, says whether the conditions held. Every
//! caller's update changes the document when they hold (a new `mtime`, `attempt` or
//! `status`), so `nModified` is 1 exactly then.
//!
//! The conditions are worked out once per document, into a field of the pipeline's own
//! ([`WHEN`]) that the last stage gives back its earlier value (or removes, as it was absent),
//! rather than once per changed field: SecantusDB spent 1.83–2.13 ms of CPU per task on a
//! claim and its result written so, against 2.17–2.61 with the conditions in every field's
//! `$cond` (batches of 8, nine indexes, same hour; 2026-11-28).
//!
//! What this relies on from the server, by MongoDB's documented behaviour: update pipelines
//! (`update` and `findAndModify` take one from 4.2; `bulkWrite`'s `updateMods` from 8.0),
//! `$set` of an expression that is missing removing the field (as `$$REMOVE` does), and
//! `nModified` counting only documents an update changed ("if the update operation results in
//! no change to the document … nModified can be less than n", the `update` command's output,
//! the same per operation in `bulkWrite`'s). A server that counted a pipeline that left the
//! document as it was as modified would make a claim lost to another node look won: the
//! server-contract test (`tests/tests/store/server_contract.rs`) fails on such a server, and
//! the book says so (`docs/src/operating/mongodb.md`).

use bson::{doc, Bson, Document};

use disbatch_model::schema::task;

/// The pipeline's own field: `{w: <the conditions hold>, o: <the field's earlier value>}`
/// while the pipeline runs, put back as it was by its last stage. A name no writer of tasks
/// uses; a document that holds it anyway keeps it, value and place.
pub const WHEN: &str = "_disbatch_when";

/// The write `filter` + `update` as `({_id}, pipeline)`, or None when it cannot be said so
/// (no `_id` equality, a condition other than an equality on a scalar, an operator other
/// than `$set`, `$unset` and `$inc`, or a field name with `.` or `$`): send it as it is.
pub fn conditional_by_id(
    filter: &Document,
    update: &Document,
) -> Option<(Document, Vec<Document>)> {
    let id = equality(filter.get(task::ID)?)?;
    let mut conditions = Vec::new();
    for (field, value) in filter {
        if field == task::ID {
            continue;
        }
        let value = equality(value)?;
        conditions.push(condition(plain_field(field)?, value));
    }
    let when = format!("${WHEN}.w");
    let mut set = Document::new();
    for (op, fields) in update {
        let fields = match fields {
            Bson::Document(d) => d,
            _ => return None,
        };
        for (field, value) in fields {
            let current = format!("${}", plain_field(field)?);
            let new = match op.as_str() {
                "$set" => doc! {"$literal": value.clone()}.into(),
                "$unset" => Bson::String("$$REMOVE".into()),
                "$inc" => {
                    doc! {"$add": [{"$ifNull": [&current, 0]}, {"$literal": value.clone()}]}.into()
                }
                _ => return None,
            };
            if set.contains_key(field) || field == WHEN {
                return None;
            }
            set.insert(field, doc! {"$cond": [&when, new, current]});
        }
    }
    let pipeline = vec![
        doc! {"$set": {WHEN: {"w": {"$and": conditions}, "o": format!("${WHEN}")}}},
        doc! {"$set": set},
        doc! {"$set": {WHEN: format!("${WHEN}.o")}},
    ];
    Some((doc! {task::ID: id}, pipeline))
}

/// The value an equality condition compares with: `v` or `{$eq: v}`, v not an array (a
/// query's equality also matches arrays holding v; an expression's does not).
fn equality(condition: &Bson) -> Option<Bson> {
    let value = match condition {
        Bson::Document(d) if d.keys().any(|k| k.starts_with('$')) => {
            if d.len() != 1 {
                return None;
            }
            d.get("$eq")?.clone()
        }
        other => other.clone(),
    };
    match value {
        Bson::Array(_) | Bson::RegularExpression(_) => None,
        v => Some(v),
    }
}

/// The expression for `field == value` with a query's meaning: null also matches a missing
/// field.
fn condition(field: &str, value: Bson) -> Document {
    let current = format!("${field}");
    match value {
        Bson::Null => doc! {"$eq": [{"$ifNull": [current, Bson::Null]}, Bson::Null]},
        v => doc! {"$eq": [current, {"$literal": v}]},
    }
}

fn plain_field(field: &str) -> Option<&str> {
    (!field.is_empty() && !field.contains('.') && !field.starts_with('$')).then_some(field)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::oid::ObjectId;

    #[test]
    fn equalities_become_one_condition_on_every_changed_field() {
        let id = ObjectId::new();
        let filter = doc! {"_id": {"$eq": id}, "status": -2, "node": {"$eq": Bson::Null}};
        let update = doc! {
            "$set": {"status": 0, "stdout": "$HOME is set"},
            "$unset": {"slot": ""},
            "$inc": {"attempts": 1},
        };
        let (by_id, pipeline) = conditional_by_id(&filter, &update).expect("convertible");
        assert_eq!(by_id, doc! {"_id": id});
        let conditions = doc! {"$and": [
            {"$eq": ["$status", {"$literal": -2}]},
            {"$eq": [{"$ifNull": ["$node", Bson::Null]}, Bson::Null]},
        ]};
        let when = "$_disbatch_when.w";
        assert_eq!(
            pipeline,
            vec![
                doc! {"$set": {"_disbatch_when": {"w": conditions, "o": "$_disbatch_when"}}},
                doc! {"$set": {
                    "status": {"$cond": [when, {"$literal": 0}, "$status"]},
                    // A literal stays a literal, even one that reads as a field path.
                    "stdout": {"$cond": [when, {"$literal": "$HOME is set"}, "$stdout"]},
                    "slot": {"$cond": [when, "$$REMOVE", "$slot"]},
                    "attempts": {"$cond": [when, {"$add": [{"$ifNull": ["$attempts", 0]}, {"$literal": 1}]}, "$attempts"]},
                }},
                doc! {"$set": {"_disbatch_when": "$_disbatch_when.o"}},
            ]
        );
    }

    #[test]
    fn what_a_pipeline_cannot_say_the_same_way_is_left_as_it_is() {
        let id = ObjectId::new();
        let set = doc! {"$set": {"a": 1}};
        let refused = [
            (doc! {"status": 1}, set.clone()),
            (doc! {"_id": id, "n": {"$gt": 1}}, set.clone()),
            (doc! {"_id": id, "tags": ["a"]}, set.clone()),
            (doc! {"_id": {"$in": [id]}}, set.clone()),
            (doc! {"_id": id, "a.b": 1}, set.clone()),
            (doc! {"_id": id}, doc! {"$push": {"a": 1}}),
            (doc! {"_id": id}, doc! {"$set": {"a.b": 1}}),
            (doc! {"_id": id}, doc! {"$set": {WHEN: 1}}),
            (
                doc! {"_id": id},
                doc! {"$set": {"a": 1}, "$unset": {"a": ""}},
            ),
        ];
        for (filter, update) in refused {
            assert_eq!(
                conditional_by_id(&filter, &update),
                None,
                "{filter} {update}"
            );
        }
    }
}
