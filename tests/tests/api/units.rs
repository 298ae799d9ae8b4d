//! Work units through the API: keys unique per queue, reject or update, busy units untouched.

use bson::{doc, Document};
use disbatch_model::status;
use disbatch_tests::{write_config, Dci, TestDb};
use serde_json::{json, Value};

fn keys(v: &Value, field: &str) -> Vec<String> {
    v[field]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|k| {
                    k.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| k["key"].as_str().unwrap_or("").to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn keys_are_unique_per_queue_and_conflicts_are_rejected_or_updated() {
    let db = TestDb::new("units").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let (_, created) = dci
        .post("/queues", json!({"name": "q", "plugin": "echo"}))
        .await;
    let queue = bson::oid::ObjectId::parse_str(created["id"]["$oid"].as_str().unwrap_or(""))
        .expect("queue id");
    dci.post("/queues", json!({"name": "other", "plugin": "echo"}))
        .await;
    // Units are always looked up by queue and key (the unique index's order); SecantusDB
    // 0.5.3-beta.196 misses documents on `{key}` alone when a partial {queue, key} index exists.
    let unit = |key: &str| doc! {"queue": queue, "key": key};
    let units = json!([{"key": "a", "params": {"n": 1}}, {"key": "b", "priority": 5},
                       {"key": "c", "not_before": "2030-01-01T00:00:00Z"}]);
    let (s, out) = dci.post("/queues/q/units", json!({"units": units})).await;
    assert_eq!(s, 200, "{out}");
    assert_eq!(keys(&out, "inserted"), ["a", "b", "c"]);
    let c = db
        .tasks()
        .find_one(unit("c"))
        .await
        .expect("find")
        .expect("c");
    assert_eq!(c.get_i32("status").ok(), Some(status::QUEUED));
    assert!(c.get_datetime("not_before").is_ok(), "{c}");
    assert_eq!(
        db.tasks()
            .find_one(unit("b"))
            .await
            .expect("f")
            .expect("b")
            .get_i64("priority")
            .ok(),
        Some(5)
    );

    // The same keys again: rejected by default, and the same key in another queue is fine.
    let (_, out) = dci
        .post(
            "/queues/q/units",
            json!({"units": [{"key": "a"}, {"key": "d"}]}),
        )
        .await;
    assert_eq!(
        (keys(&out, "inserted"), keys(&out, "rejected")),
        (vec!["d".to_string()], vec!["a".to_string()])
    );
    let (_, out) = dci
        .post("/queues/other/units", json!({"units": [{"key": "a"}]}))
        .await;
    assert_eq!(keys(&out, "inserted"), ["a"]);
    // The database itself refuses a duplicate key, whoever writes it.
    let dup = db
        .tasks()
        .insert_one(doc! {"queue": queue, "key": "a", "status": -2})
        .await;
    assert!(
        dup.is_err(),
        "a duplicate {{queue, key}} must be refused by the index"
    );

    // Update: a finished unit gets the new params and is requeued; a running one is left alone.
    db.tasks()
        .update_one(unit("a"), doc! {"$set": {"status": 1, "stdout": "old"}})
        .await
        .expect("u");
    db.tasks()
        .update_one(unit("b"), doc! {"$set": {"status": 0, "node": "n1"}})
        .await
        .expect("u");
    let (_, out) = dci
        .post("/queues/q/units", json!({"on_conflict": "update",
            "units": [{"key": "a", "params": {"n": 2}}, {"key": "b", "params": {"n": 3}}, {"key": "e"}]}))
        .await;
    assert_eq!(keys(&out, "updated"), ["a"], "{out}");
    assert_eq!(keys(&out, "busy"), ["b"]);
    assert_eq!(keys(&out, "inserted"), ["e"]);
    let a: Document = db.tasks().find_one(unit("a")).await.expect("f").expect("a");
    assert_eq!(a.get_i32("status").ok(), Some(status::QUEUED));
    assert_eq!(
        a.get_document("params")
            .ok()
            .and_then(|p| p.get_i32("n").ok()),
        Some(2)
    );
    assert_eq!(a.get("stdout"), Some(&bson::Bson::Null));
    let b: Document = db.tasks().find_one(unit("b")).await.expect("f").expect("b");
    assert_eq!(b.get_i32("status").ok(), Some(status::RUNNING));
    assert!(
        b.get_document("params")
            .ok()
            .and_then(|p| p.get_i32("n").ok())
            .is_none(),
        "running unit unchanged"
    );
    db.drop().await;
}

#[tokio::test]
async fn malformed_unit_requests_are_400_and_unknown_queues_404() {
    let db = TestDb::new("units_bad").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    dci.post("/queues", json!({"name": "q", "plugin": "echo"}))
        .await;
    for (body, text) in [
        (json!({}), "'units' must be a non-empty array"),
        (json!({"units": []}), "'units' must be a non-empty array"),
        (json!({"units": [{"params": {}}]}), "units[0]: key must be"),
        (
            json!({"units": [{"key": 5}]}),
            "units[0]: key must be a string",
        ),
        (
            json!({"units": [{"key": "a"}, {"key": "a"}]}),
            "units[1]: key \"a\" appears twice",
        ),
        (
            json!({"units": [{"key": "a", "params": [1]}]}),
            "units[0]: params must be an object",
        ),
        (
            json!({"units": [{"key": "a", "priority": "high"}]}),
            "units[0]: priority must be a number",
        ),
        (
            json!({"units": [{"key": "a", "not_before": "tomorrow"}]}),
            "not an RFC 3339 date",
        ),
        (
            json!({"units": [{"key": "a", "colour": 1}]}),
            "unknown field \"colour\"",
        ),
        (
            json!({"units": [{"key": "a"}], "on_conflict": "merge"}),
            "on_conflict must be reject or update",
        ),
    ] {
        let (s, out) = dci.post("/queues/q/units", body.clone()).await;
        assert_eq!(s, 400, "{body}: {out}");
        assert!(
            out["error"].as_str().unwrap_or("").contains(text),
            "{body}: {out}"
        );
    }
    assert_eq!(
        db.count(doc! {}).await,
        0,
        "nothing stored from bad requests"
    );
    let (s, _) = dci
        .post("/queues/nope/units", json!({"units": [{"key": "a"}]}))
        .await;
    assert_eq!(s, 404);
    db.drop().await;
}
