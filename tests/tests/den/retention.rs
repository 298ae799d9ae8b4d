//! Retention with a real DEN: ended tasks past their queue's `retain` (or the leader's config
//! default) are deleted with their attempts and GridFS output; live tasks, young ones,
//! orphaned ones and ones others wait on stay, and a queue keeps everything unless told.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_tests::{wait_for, write_config, Dci, Den, TestDb};
use serde_json::json;

/// `age` seconds ago.
fn ago(age: i64) -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() - age * 1000)
}

/// A task of `queue` in `status`, last changed `age` seconds ago, with one attempt record and
/// a GridFS stdout file, as a node that ran it leaves them; `extra` set on it too.
async fn ended(db: &TestDb, queue: ObjectId, status: i32, age: i64, extra: Document) -> ObjectId {
    let id = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    let file = ObjectId::new();
    let mut set = doc! {"status": status, "mtime": ago(age), "stdout": file};
    set.extend(extra);
    db.set_task(id, set).await;
    db.db
        .collection::<Document>("attempts")
        .insert_one(
            doc! {"_id": ObjectId::new(), "task": id, "queue": queue, "start": ago(age + 1)},
        )
        .await
        .expect("attempt");
    db.db
        .collection::<Document>("tasks.files")
        .insert_one(
            doc! {"_id": file, "filename": "stdout", "length": 4, "chunkSize": 261_120,
            "uploadDate": ago(age), "metadata": {"task_id": id}},
        )
        .await
        .expect("file");
    db.db
        .collection::<Document>("tasks.chunks")
        .insert_one(doc! {"files_id": file, "n": 0, "data": "out\n"})
        .await
        .expect("chunk");
    id
}

/// How many of the task's task document, attempts, files and chunks are left.
async fn left(db: &TestDb, id: ObjectId) -> (u64, u64, u64, u64) {
    let count = |coll: &'static str, filter: Document| async move {
        db.db
            .collection::<Document>(coll)
            .count_documents(filter)
            .await
            .expect("count")
    };
    let files: Vec<Bson> = {
        use futures::TryStreamExt;
        db.db
            .collection::<Document>("tasks.files")
            .find(doc! {"metadata.task_id": id})
            .await
            .expect("files")
            .try_collect::<Vec<Document>>()
            .await
            .expect("files")
            .into_iter()
            .filter_map(|d| d.get("_id").cloned())
            .collect()
    };
    (
        count("tasks", doc! {"_id": id}).await,
        count("attempts", doc! {"task": id}).await,
        files.len() as u64,
        count("tasks.chunks", doc! {"files_id": {"$in": files}}).await,
    )
}

#[tokio::test]
async fn ended_tasks_past_their_retention_go_with_their_history_and_nothing_else_does() {
    let db = TestDb::new("retention").await;
    // The leader's default: a day for succeeded tasks, nothing said of the others.
    let config = write_config(&db, "node.json", json!({"retain": {"succeeded_s": 86400}}));
    let q = db.insert_queue("q", "echo", 0).await;
    db.set_queue(
        q,
        doc! {"retain": {"succeeded_s": 600, "failed_s": 1200, "cancelled_s": 300}},
    )
    .await;
    let plain = db.insert_queue("plain", "echo", 0).await;
    let forever = db.insert_queue("forever", "echo", 0).await;
    db.set_queue(forever, doc! {"retain": {"succeeded_s": null}})
        .await;

    let gone = vec![
        ("succeeded", ended(&db, q, 1, 700, doc! {}).await),
        ("failed", ended(&db, q, 2, 1300, doc! {}).await),
        (
            "a plugin's failure code",
            ended(&db, q, 7, 1300, doc! {}).await,
        ),
        (
            "discarded",
            ended(&db, q, 2, 1300, doc! {"discarded_at": ago(1300)}).await,
        ),
        ("cancelled", ended(&db, q, -5, 400, doc! {}).await),
        ("terminated", ended(&db, q, -3, 400, doc! {}).await),
        (
            "succeeded under the default",
            ended(&db, plain, 1, 90_000, doc! {}).await,
        ),
    ];
    let kept = vec![
        ("succeeded, young", ended(&db, q, 1, 500, doc! {}).await),
        ("failed, young", ended(&db, q, 2, 1100, doc! {}).await),
        ("cancelled, young", ended(&db, q, -5, 200, doc! {}).await),
        ("queued", ended(&db, q, -2, 5000, doc! {}).await),
        ("blocked", ended(&db, q, -4, 5000, doc! {}).await),
        (
            "running",
            ended(&db, q, 0, 5000, doc! {"node": "gone"}).await,
        ),
        ("orphaned", ended(&db, q, -6, 5000, doc! {}).await),
        (
            "waited on",
            ended(&db, q, 1, 5000, doc! {"has_dependents": true}).await,
        ),
        (
            "failed, no default for it",
            ended(&db, plain, 2, 90_000, doc! {}).await,
        ),
        (
            "succeeded, kept for ever",
            ended(&db, forever, 1, 90_000, doc! {}).await,
        ),
    ];
    let den = Den::start(&config, "n1");
    wait_for("the old tasks pruned", Duration::from_secs(120), || async {
        for (_, id) in &gone {
            if left(&db, *id).await != (0, 0, 0, 0) {
                return false;
            }
        }
        true
    })
    .await;
    // One run judged every queue: what it left, it keeps.
    for (what, id) in &kept {
        assert_eq!(left(&db, *id).await, (1, 1, 1, 1), "{what} was pruned");
    }
    let pruned = |queue: &str, state: &str| {
        format!("disbatch_den_tasks_pruned_total{{queue=\"{queue}\",state=\"{state}\"}}")
    };
    assert_eq!(den.metric(&pruned("q", "succeeded")).await, 1.0);
    assert_eq!(den.metric(&pruned("q", "failed")).await, 3.0);
    assert_eq!(den.metric(&pruned("q", "cancelled")).await, 2.0);
    assert_eq!(den.metric(&pruned("plain", "succeeded")).await, 1.0);
    assert!(
        den.log_text()
            .contains("pruned ended tasks past their retention"),
        "{}",
        den.log_text()
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn retention_is_an_admin_setting_checked_by_key_and_a_bad_default_stops_the_start() {
    let db = TestDb::new("retention_api").await;
    let config = write_config(&db, "web.json", json!({}));
    db.insert_queue("q", "echo", 0).await;
    let dci = Dci::start(&config);
    for (retain, says) in [
        (
            json!({"succeeded_s": -1}),
            "retain.succeeded_s must be a whole number",
        ),
        (json!({"kept_s": 5}), "retain.kept_s is unknown"),
        (json!("1d"), "retain must be an object"),
    ] {
        let (status, body) = dci.post("/queues/q", json!({ "retain": retain })).await;
        assert_eq!(status, 400, "{body}");
        assert!(
            body["error"].as_str().is_some_and(|e| e.contains(says)),
            "{body}"
        );
    }
    let (status, body) = dci
        .post(
            "/queues/q",
            json!({"retain": {"succeeded_s": 86400, "failed_s": null}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (_, shown) = dci.get("/queues/q").await;
    assert_eq!(
        shown["retain"],
        json!({"succeeded_s": 86400, "failed_s": null}),
        "{shown}"
    );
    drop(dci);

    let bad = write_config(&db, "bad.json", json!({"retain": {"succeeded_s": "a day"}}));
    let out = std::process::Command::new(disbatch_tests::bin_path("disbatchd"))
        .args(["--check-config"])
        .arg(&bad)
        .output()
        .expect("run disbatchd");
    assert!(!out.status.success());
    let said =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("key `retain`: retain.succeeded_s"), "{said}");
    db.drop().await;
}
