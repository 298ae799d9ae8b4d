//! What claims and results written by `_id` rely on from the server (`core/store/src/conn/by_id.rs`):
//! an update pipeline whose conditions fail leaves the document as it was and is reported
//! unmodified (`nModified` 0) by the `update` command and by `bulkWrite`, and one whose
//! conditions hold is reported modified. A server that got this wrong would let two nodes
//! both believe they claimed a task.

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_model::status;
use disbatch_store::{conditional_by_id, BY_ID_WHEN as WHEN};
use disbatch_tests::TestDb;

/// A claim's write as the DEN sends it: conditions on the task as read, the claim's fields.
fn claim_write(id: ObjectId, mtime: DateTime) -> (Document, Vec<Document>) {
    let filter = doc! {"_id": id, "status": -2, "node": Bson::Null, "mtime": mtime};
    let update = doc! {
        "$set": {"status": 0, "node": "n1", "mtime": DateTime::now(), "slot": 3,
            "attempt": ObjectId::new(), "stdout": "$not_a_path"},
        "$unset": {"lease_until": ""},
        "$inc": {"attempts": 1},
    };
    conditional_by_id(&filter, &update).expect("a claim's write converts")
}

async fn raw(db: &TestDb, id: ObjectId) -> Vec<u8> {
    let raw = db
        .db
        .collection::<bson::RawDocumentBuf>("tasks")
        .find_one(doc! {"_id": id})
        .await
        .expect("read the task")
        .expect("the task exists");
    raw.into_bytes()
}

/// Sends the claim's write for `id` as the `update` command; (matched, modified).
async fn claim(db: &TestDb, id: ObjectId, mtime: DateTime) -> (u64, u64) {
    let (filter, pipeline) = claim_write(id, mtime);
    let r = db
        .tasks()
        .update_one(filter, pipeline)
        .await
        .expect("update");
    (r.matched_count, r.modified_count)
}

async fn task(db: &TestDb, id: ObjectId) -> Document {
    db.tasks()
        .find_one(doc! {"_id": id})
        .await
        .expect("read")
        .expect("exists")
}

#[tokio::test]
async fn a_pipeline_write_whose_conditions_fail_is_reported_unmodified_and_changes_nothing() {
    let db = TestDb::new("server_contract_update").await;
    let mtime = DateTime::from_millis(1_700_000_000_000);
    let id = ObjectId::new();
    // Claimed by another node since it was read, with an array and a missing field beside.
    db.tasks()
        .insert_one(
            doc! {"_id": id, "queue": ObjectId::new(), "status": 0, "node": "other",
            "mtime": mtime, "attempts": 1, "tags": ["a", "b"], "lease_until": mtime},
        )
        .await
        .expect("insert");
    let before = raw(&db, id).await;
    let (filter, pipeline) = claim_write(id, mtime);
    let r = db
        .tasks()
        .update_one(filter.clone(), pipeline.clone())
        .await
        .expect("update");
    assert_eq!(r.matched_count, 1, "found by _id");
    assert_eq!(
        r.modified_count, 0,
        "this server counts a pipeline update that changed nothing as modified: claims and \
         results written by _id would take a write that did not hold for one that did"
    );
    assert_eq!(
        raw(&db, id).await,
        before,
        "the document is byte for byte as it was"
    );

    // The same by `bulkWrite` (MongoDB 8.0+), as batches of claims and results are sent.
    let ns = format!("{}.tasks", db.name);
    let reply = db
        .client
        .database("admin")
        .run_command(doc! {
            "bulkWrite": 1,
            "ops": [{"update": 0, "filter": filter, "updateMods": pipeline, "multi": false}],
            "nsInfo": [{"ns": &ns}],
            "errorsOnly": false,
        })
        .await;
    match reply {
        Ok(reply) => {
            let results = reply
                .get_document("cursor")
                .and_then(|c| c.get_array("firstBatch"))
                .expect("per-operation results");
            let op = results[0].as_document().expect("a result document");
            let n = |k: &str| {
                op.get(k)
                    .and_then(Bson::as_i32)
                    .or(op.get(k).and_then(Bson::as_i64).map(|v| v as i32))
            };
            assert_eq!(n("n"), Some(1), "{op}");
            assert_eq!(
                n("nModified"),
                Some(0),
                "bulkWrite counts a no-op pipeline as modified: {op}"
            );
            assert_eq!(raw(&db, id).await, before);
        }
        // Before 8.0 the store sends batches as `update` commands, checked above.
        Err(e) => eprintln!("no bulkWrite on this server ({e}); the update command was checked"),
    }
}

#[tokio::test]
async fn a_pipeline_write_whose_conditions_hold_is_reported_modified_with_its_fields() {
    let db = TestDb::new("server_contract_holds").await;
    let mtime = DateTime::from_millis(1_700_000_000_000);
    let id = ObjectId::new();
    db.tasks()
        .insert_one(
            doc! {"_id": id, "queue": ObjectId::new(), "status": -2, "node": Bson::Null,
            "mtime": mtime, "lease_until": mtime},
        )
        .await
        .expect("insert");
    assert_eq!(claim(&db, id, mtime).await, (1, 1));
    let t = task(&db, id).await;
    assert_eq!(t.get_i32("status"), Ok(status::RUNNING));
    assert_eq!(t.get_str("node"), Ok("n1"));
    assert_eq!(t.get_i32("slot"), Ok(3));
    assert_eq!(
        t.get_i32("attempts"),
        Ok(1),
        "$inc of a missing field starts at 0"
    );
    assert_eq!(
        t.get_str("stdout"),
        Ok("$not_a_path"),
        "a literal stays a literal"
    );
    assert!(!t.contains_key("lease_until"), "$unset removes: {t}");
    assert!(
        !t.contains_key(WHEN),
        "the pipeline's own field is gone once it has run: {t}"
    );
}

/// The pipeline's own field (`WHEN`) in a task, as no writer of ours puts it: kept, value and
/// place, whether the conditions hold or not, and a write that did not hold still changes
/// nothing and counts as unmodified.
#[tokio::test]
async fn a_task_holding_the_pipelines_own_field_keeps_it_and_no_op_writes_stay_no_ops() {
    let db = TestDb::new("server_contract_own_field").await;
    let mtime = DateTime::from_millis(1_700_000_000_000);
    let (lost, won) = (ObjectId::new(), ObjectId::new());
    for (id, status, node) in [(lost, 0, Bson::from("other")), (won, -2, Bson::Null)] {
        db.tasks()
            .insert_one(
                doc! {"_id": id, "status": status, "node": node, "mtime": mtime,
                WHEN: {"kept": [1, 2]}, "after": "x"},
            )
            .await
            .expect("insert");
    }
    let before = raw(&db, lost).await;
    assert_eq!(claim(&db, lost, mtime).await, (1, 0));
    assert_eq!(raw(&db, lost).await, before, "byte for byte as it was");

    assert_eq!(claim(&db, won, mtime).await, (1, 1));
    let t = task(&db, won).await;
    assert_eq!(t.get_str("node"), Ok("n1"));
    assert_eq!(t.get_document(WHEN), Ok(&doc! {"kept": [1, 2]}));
    let keys: Vec<&str> = t.keys().map(String::as_str).collect();
    assert_eq!(
        &keys[..6],
        ["_id", "status", "node", "mtime", WHEN, "after"],
        "{t}"
    );
}
