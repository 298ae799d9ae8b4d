//! The Perl driver's result envelopes (`MongoDB::InsertManyResult`, …), which clients parse.

use bson::oid::ObjectId;
use disbatch_store::WriteCounts;
use serde_json::{json, Value};

use crate::render::{bson, Dates};

pub fn insert_one(id: ObjectId) -> Value {
    json!({"MongoDB::InsertOneResult": {
        "acknowledged": 1,
        "inserted_id": {"$oid": id.to_hex()},
        "write_errors": [],
        "write_concern_errors": [],
    }})
}

pub fn insert_many(ids: &[ObjectId]) -> Value {
    let inserted: Vec<Value> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| json!({"_id": {"$oid": id.to_hex()}, "index": i}))
        .collect();
    json!({"MongoDB::InsertManyResult": {
        "acknowledged": 1,
        "inserted": inserted,
        "write_errors": [],
        "write_concern_errors": [],
    }})
}

pub fn update(w: &WriteCounts) -> Value {
    json!({"MongoDB::UpdateResult": {
        "acknowledged": 1,
        "matched_count": w.matched,
        "modified_count": w.modified,
        "upserted_id": w.upserted_id.as_ref().map_or(Value::Null, |b| bson(b, Dates::Text)),
        "write_errors": [],
        "write_concern_errors": [],
    }})
}

pub fn delete(w: &WriteCounts) -> Value {
    json!({"MongoDB::DeleteResult": {
        "acknowledged": 1,
        "deleted_count": w.deleted,
        "write_errors": [],
        "write_concern_errors": [],
    }})
}
