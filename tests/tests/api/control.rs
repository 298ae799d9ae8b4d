//! `disbatch-web` black-box: cancelling, retrying and deleting one task.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_model::status;
use disbatch_tests::api::{delete_result, error, update_result};
use disbatch_tests::{read_lines, wait_for, write_config, Dci, Den, TestDb};
use reqwest::Method;
use serde_json::json;

/// Tasks with the given statuses in a paused queue.
async fn tasks_with(db: &TestDb, statuses: &[i32]) -> Vec<ObjectId> {
    let queue = db.insert_queue("paused", "echo", 0).await;
    let ids = db
        .insert_tasks(
            queue,
            statuses.iter().map(|s| doc! {"s": *s}.into()).collect(),
        )
        .await;
    for (id, s) in ids.iter().zip(statuses) {
        db.set_task(*id, doc! {"status": *s}).await;
    }
    ids
}

/// A GridFS output file of `task`, in Disbatch's format (string chunks).
async fn output_file(db: &TestDb, task: ObjectId, name: &str) -> ObjectId {
    let id = ObjectId::new();
    db.db
        .collection::<Document>("tasks.chunks")
        .insert_many(vec![
            doc! {"files_id": id, "n": 0, "data": "first "},
            doc! {"files_id": id, "n": 1, "data": "second"},
        ])
        .await
        .expect("chunks");
    db.db
        .collection::<Document>("tasks.files")
        .insert_one(
            doc! {"_id": id, "filename": name, "length": 12_i64, "chunkSize": 6,
            "uploadDate": DateTime::now(), "metadata": {"task_id": task}},
        )
        .await
        .expect("files doc");
    id
}

/// How many GridFS files name `task` in their metadata, and how many chunks those files have.
async fn files_of(db: &TestDb, task: ObjectId) -> (u64, u64) {
    let mut cursor = db
        .db
        .collection::<Document>("tasks.files")
        .find(doc! {"metadata.task_id": task})
        .await
        .expect("find files");
    let mut files = Vec::new();
    while cursor.advance().await.expect("cursor") {
        let d = cursor.deserialize_current().expect("files doc");
        files.push(d.get_object_id("_id").expect("file id"));
    }
    let chunks = db
        .db
        .collection::<Document>("tasks.chunks")
        .count_documents(doc! {"files_id": {"$in": files.clone()}})
        .await
        .expect("count chunks");
    (files.len() as u64, chunks)
}

#[tokio::test]
async fn queued_and_blocked_tasks_are_cancelled_others_conflict() {
    let db = TestDb::new("api_cancel").await;
    let config = write_config(&db, "web.json", json!({}));
    let ids = tasks_with(&db, &[-2, -4, 0, -1, 1, 2, -5, -6]).await;
    let dci = Dci::start(&config);
    let cancel = |id: ObjectId| format!("/tasks/{}/cancel", id.to_hex());

    for i in [0, 1] {
        let before = db
            .task(ids[i])
            .await
            .get_datetime("mtime")
            .expect("mtime")
            .timestamp_millis();
        let (code, body) = dci.post(&cancel(ids[i]), json!({})).await;
        assert_eq!((code, body), (200, update_result(1, 1)));
        let t = db.task(ids[i]).await;
        assert_eq!(t.get_i32("status").ok(), Some(status::CANCELLED), "{t}");
        assert!(t.get_datetime("mtime").expect("mtime").timestamp_millis() >= before);
    }
    // Running: the request is accepted (202) and left for the task's runner to carry out.
    let (code, body) = dci.post(&cancel(ids[2]), json!({})).await;
    assert_eq!((code, body), (202, update_result(1, 1)));
    let t = db.task(ids[2]).await;
    assert_eq!(
        t.get_i32("status").ok(),
        Some(status::RUNNING),
        "still running: {t}"
    );
    assert!(t.get_datetime("cancel_requested").is_ok(), "{t}");
    // Claimed but not started: cancelled at once, its slot freed.
    db.set_task(ids[3], doc! {"slot": 0_i64}).await;
    let (code, body) = dci.post(&cancel(ids[3]), json!({})).await;
    assert_eq!((code, body), (200, update_result(1, 1)));
    let t = db.task(ids[3]).await;
    assert_eq!(t.get_i32("status").ok(), Some(status::CANCELLED), "{t}");
    assert!(t.get("slot").is_none(), "{t}");
    for (i, s) in [
        (4, status::SUCCEEDED),
        (5, status::FAILED),
        (6, status::CANCELLED),
        (7, status::ORPHANED),
    ] {
        let (code, body) = dci.post(&cancel(ids[i]), json!({})).await;
        assert_eq!(code, 409, "status {s}: {body}");
        let text = body["error"].as_str().expect("error");
        assert!(
            text.contains(&ids[i].to_hex()) && text.contains(&format!("status {s}")),
            "{text}"
        );
        assert_eq!(
            db.task_status(ids[i]).await.expect("status"),
            s,
            "unchanged"
        );
    }

    let unknown = ObjectId::new().to_hex();
    let (code, body) = dci
        .post(&format!("/tasks/{unknown}/cancel"), json!({}))
        .await;
    assert_eq!(
        (code, body),
        (404, error(&format!("no task with id {unknown}")))
    );
    let (code, body) = dci.post("/tasks/nothex/cancel", json!({})).await;
    assert_eq!(code, 400, "{body}");
    assert!(body["error"].is_string(), "{body}");
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn finished_orphaned_cancelled_and_terminated_tasks_are_requeued() {
    let db = TestDb::new("api_retry").await;
    let config = write_config(&db, "web.json", json!({}));
    let ids = tasks_with(&db, &[2, 1, -6, -5, -3, 3, -2, -4, 0, -1]).await;
    for id in &ids[..6] {
        db.set_task(
            *id,
            doc! {"node": "n1", "stdout": "out", "stderr": "err", "complete": true},
        )
        .await;
    }
    let kept = output_file(&db, ids[0], "stdout").await;
    let dci = Dci::start(&config);
    let retry = |id: ObjectId| format!("/tasks/{}/retry", id.to_hex());

    for id in &ids[..6] {
        let (code, body) = dci.post(&retry(*id), json!({})).await;
        assert_eq!((code, body), (200, update_result(1, 1)));
        let t = db.task(*id).await;
        assert_eq!(t.get_i32("status").ok(), Some(status::QUEUED), "{t}");
        for field in ["node", "stdout", "stderr"] {
            assert_eq!(t.get(field), Some(&Bson::Null), "{field}: {t}");
        }
        assert!(t.get("complete").is_none(), "{t}");
        assert_eq!(
            t.get_document("params").ok().map(|p| p.contains_key("s")),
            Some(true),
            "params kept: {t}"
        );
    }
    assert_eq!(
        files_of(&db, ids[0]).await,
        (1, 2),
        "old GridFS files are kept"
    );
    let files = db.db.collection::<Document>("tasks.files");
    assert!(files
        .find_one(doc! {"_id": kept})
        .await
        .expect("find")
        .is_some());

    for (i, s) in [(6, status::QUEUED), (7, status::BLOCKED)] {
        let (code, body) = dci.post(&retry(ids[i]), json!({})).await;
        assert_eq!(code, 409, "status {s}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains(&format!("status {s}"))),
            "{body}"
        );
        assert_eq!(db.task_status(ids[i]).await.expect("status"), s);
    }
    for (i, s) in [(8, status::RUNNING), (9, status::CLAIMED)] {
        let (code, body) = dci.post(&retry(ids[i]), json!({})).await;
        let text = format!(
            "task {} is running (status {s}); it cannot be retried yet",
            ids[i].to_hex()
        );
        assert_eq!((code, body), (409, error(&text)));
        assert_eq!(db.task_status(ids[i]).await.expect("status"), s);
    }
    // A task retried once is queued now, so a second retry conflicts.
    let (code, _) = dci.post(&retry(ids[0]), json!({})).await;
    assert_eq!(code, 409);

    let unknown = ObjectId::new().to_hex();
    let (code, body) = dci
        .post(&format!("/tasks/{unknown}/retry"), json!({}))
        .await;
    assert_eq!(
        (code, body),
        (404, error(&format!("no task with id {unknown}")))
    );
    let (code, body) = dci.post("/tasks/xyz/retry", json!({})).await;
    assert_eq!(code, 400, "{body}");
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn a_retried_failure_runs_again_on_a_den() {
    let db = TestDb::new("api_retry_run").await;
    let config = write_config(&db, "node.json", json!({}));
    db.insert_queue("echo", "echo", 1).await;
    let runs = db.path("runs.txt");
    let dci = Dci::start(&config);
    let (code, body) = dci
        .post(
            "/tasks",
            json!({"queue": "echo", "params": {"exit_code": 3, "stderr": "failed", "append_to": runs}}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let hex = body["MongoDB::InsertManyResult"]["inserted"][0]["_id"]["$oid"]
        .as_str()
        .expect("id")
        .to_string();
    let id = ObjectId::parse_str(&hex).expect("oid");

    let mut den = Den::start(&config, "n1");
    db.wait_complete(&[id], Duration::from_secs(30)).await;
    den.stop();
    let t = db.task(id).await;
    assert_eq!(t.get_i32("status").ok(), Some(status::FAILED), "{t}");
    assert!(
        t.get_str("stderr").is_ok_and(|e| e.starts_with("failed")),
        "{t}"
    );
    assert_eq!(read_lines(&runs), vec![hex.clone()]);

    let (code, body) = dci.post(&format!("/tasks/{hex}/retry"), json!({})).await;
    assert_eq!((code, body), (200, update_result(1, 1)));
    let t = db.task(id).await;
    assert_eq!(t.get_i32("status").ok(), Some(status::QUEUED), "{t}");
    assert_eq!(t.get("node"), Some(&Bson::Null));
    assert!(t.get("complete").is_none(), "{t}");
    let (_, listed) = dci.get("/queues/echo").await;
    assert_eq!(
        (listed["queued"].clone(), listed["completed"].clone()),
        (json!(1), json!(0))
    );

    let _den = Den::start(&config, "n1");
    db.wait_complete(&[id], Duration::from_secs(30)).await;
    let t = db.task(id).await;
    assert_eq!(
        (t.get_i32("status").ok(), t.get_str("node").ok()),
        (Some(status::FAILED), Some("n1")),
        "{t}"
    );
    assert_eq!(
        read_lines(&runs),
        vec![hex.clone(), hex],
        "ran a second time"
    );
    drop(dci);
    db.drop().await;
}

#[tokio::test]
/// Cancelling a running task is accepted and carried out by its runner (tests/run_control.rs).
async fn a_running_task_cannot_be_retried_or_deleted() {
    let db = TestDb::new("api_running").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("echo", "echo", 1).await;
    // Held at its gate until every request below has met it running.
    let (runs, gate) = (db.path("runs.txt"), db.path("gate"));
    let id = db
        .insert_tasks(
            queue,
            vec![doc! {"append_to": runs.to_string_lossy().to_string(),
            "hold_until": gate.to_string_lossy().to_string()}
            .into()],
        )
        .await[0];
    let hex = id.to_hex();
    let den = Den::start(&config, "n1");
    let dci = Dci::start(&config);
    wait_for("the task to run", Duration::from_secs(60), || async {
        read_lines(&runs).len() == 1
    })
    .await;

    let running = |action: &str| {
        error(&format!(
            "task {hex} is running (status 0); it cannot be {action} yet"
        ))
    };
    let (code, body) = dci.post(&format!("/tasks/{hex}/retry"), json!({})).await;
    assert_eq!((code, body), (409, running("retried")));
    let (code, body) = dci
        .send(Method::DELETE, &format!("/tasks/{hex}"), json!({}))
        .await;
    assert_eq!((code, body), (409, running("deleted")));
    let (_, node) = dci.get("/nodes/n1").await;
    assert_eq!(node["running"], 1, "{node}");

    std::fs::write(&gate, "").expect("open the gate");
    db.wait_complete(&[id], Duration::from_secs(60)).await;
    assert_eq!(db.task_status(id).await.expect("status"), status::SUCCEEDED);
    let (code, body) = dci
        .send(Method::DELETE, &format!("/tasks/{hex}"), json!({}))
        .await;
    assert_eq!((code, body), (200, delete_result(1)));
    assert_eq!(db.count(doc! {"_id": id}).await, 0);
    drop(den);
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn deleting_a_task_removes_it_and_its_output_files() {
    let db = TestDb::new("api_delete").await;
    let config = write_config(&db, "web.json", json!({}));
    let ids = tasks_with(&db, &[1, 2, -2, -5, 0, -1]).await;
    let out = output_file(&db, ids[0], "stdout").await;
    let err = output_file(&db, ids[0], "stderr").await;
    db.set_task(ids[0], doc! {"stdout": out, "stderr": err})
        .await;
    output_file(&db, ids[1], "stdout").await;
    let dci = Dci::start(&config);
    let path = |id: ObjectId| format!("/tasks/{}", id.to_hex());
    assert_eq!(files_of(&db, ids[0]).await, (2, 4));

    let (code, body) = dci.send(Method::DELETE, &path(ids[0]), json!({})).await;
    assert_eq!((code, body), (200, delete_result(1)));
    assert_eq!(db.count(doc! {"_id": ids[0]}).await, 0);
    assert_eq!(
        files_of(&db, ids[0]).await,
        (0, 0),
        "files and chunks are gone"
    );
    let chunks = db.db.collection::<Document>("tasks.chunks");
    let left = chunks
        .count_documents(doc! {"files_id": {"$in": [out, err]}})
        .await
        .expect("count");
    assert_eq!(left, 0);
    assert_eq!(
        files_of(&db, ids[1]).await,
        (1, 2),
        "another task's files stay"
    );
    let (code, body) = dci.get(&format!("{}/stdout", path(ids[0]))).await;
    assert_eq!(code, 404, "{body}");

    for i in [1, 2, 3] {
        let (code, body) = dci.send(Method::DELETE, &path(ids[i]), json!({})).await;
        assert_eq!((code, body), (200, delete_result(1)), "task {i}");
    }
    assert_eq!(files_of(&db, ids[1]).await, (0, 0));
    for (i, s) in [(4, status::RUNNING), (5, status::CLAIMED)] {
        let (code, body) = dci.send(Method::DELETE, &path(ids[i]), json!({})).await;
        let text = format!(
            "task {} is running (status {s}); it cannot be deleted yet",
            ids[i].to_hex()
        );
        assert_eq!((code, body), (409, error(&text)));
        assert_eq!(db.count(doc! {"_id": ids[i]}).await, 1);
    }

    let (code, body) = dci.send(Method::DELETE, &path(ids[0]), json!({})).await;
    assert_eq!(
        (code, body),
        (404, error(&format!("no task with id {}", ids[0].to_hex())))
    );
    let (code, body) = dci.send(Method::DELETE, "/tasks/nothex", json!({})).await;
    assert_eq!(code, 400, "{body}");
    assert!(body["error"].is_string(), "{body}");
    drop(dci);
    db.drop().await;
}

/// An operator's retry gives a task its retry policy's attempts (and `max_retries`') again:
/// before, a retried task that had used them failed on its first new attempt. `attempts`
/// still counts every start; `attempts_before_retry` is what it was at the retry.
#[tokio::test]
async fn a_task_retried_by_hand_gets_its_attempts_again() {
    let db = TestDb::new("api_retry_attempts").await;
    let runs = db.path("runs.txt");
    let always = db.script(
        "always.sh",
        &format!(
            "echo $DISBATCH_TASK_ID >> {}; echo boom >&2; exit 5",
            runs.display()
        ),
    );
    // Coordinate's `max_retries` caps the retries a plugin asks for.
    let asks = db.script(
        "asks.sh",
        &format!(
            "echo $DISBATCH_TASK_ID >> {}; echo '{{\"retry\": true}}' > \"$DISBATCH_RESULT\"; exit 1",
            runs.display()
        ),
    );
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"always": always, "asks": asks}}),
    );
    let q = db.insert_queue("q", "always", 2).await;
    db.set_queue(q, doc! {"retry": {"max_attempts": 2, "base_s": 0}})
        .await;
    let capped = db.insert_queue("capped", "asks", 1).await;
    db.set_queue(capped, doc! {"max_retries": 2}).await;
    let one = db.insert_tasks(q, vec![doc! {"t": 1}.into()]).await[0];
    let two = db.insert_tasks(q, vec![doc! {"t": 2}.into()]).await[0];
    let asking = db.insert_tasks(capped, vec![doc! {}.into()]).await[0];
    let runs_of = |id: ObjectId| {
        let hex = id.to_hex();
        read_lines(&runs).iter().filter(|l| **l == hex).count()
    };
    let mut den = Den::start(&config, "n1");
    let dci = Dci::start(&config);
    db.wait_complete(&[one, two, asking], Duration::from_secs(90))
        .await;
    // Stopped, so the retried tasks are read as the retry left them.
    den.stop();
    for id in [one, two] {
        let t = db.task(id).await;
        assert!(t.get_datetime("discarded_at").is_ok(), "{t}");
        assert_eq!(runs_of(id), 2, "{t}");
    }
    assert_eq!(runs_of(asking), 2, "{}", db.task(asking).await);
    let (_, listed) = dci.get("/queues/q").await;
    assert_eq!(listed["discarded"], json!(2), "{listed}");

    // One task by hand, the other by its queue's retry, the capped one by hand.
    let (code, body) = dci
        .post(&format!("/tasks/{}/retry", one.to_hex()), json!({}))
        .await;
    assert_eq!((code, body), (200, update_result(1, 1)));
    let (code, body) = dci
        .post("/queues/q/retry", json!({"status": "failed"}))
        .await;
    assert_eq!(
        (code, body),
        (200, update_result(1, 1)),
        "only the other is failed"
    );
    let (code, _) = dci
        .post(&format!("/tasks/{}/retry", asking.to_hex()), json!({}))
        .await;
    assert_eq!(code, 200);
    for id in [one, two, asking] {
        let t = db.task(id).await;
        assert_eq!(t.get_i32("attempts_before_retry").ok(), Some(2), "{t}");
        assert_eq!(t.get_i32("attempts").ok(), Some(2), "kept: {t}");
        assert!(t.get("discarded_at").is_none(), "{t}");
    }
    let den = Den::start(&config, "n1");
    db.wait_complete(&[one, two, asking], Duration::from_secs(90))
        .await;
    for id in [one, two] {
        let t = db.task(id).await;
        assert_eq!(runs_of(id), 4, "two new attempts, not one: {t}");
        assert_eq!(t.get_i32("attempts").ok(), Some(4), "{t}");
        assert!(t.get_datetime("discarded_at").is_ok(), "{t}");
        assert!(
            t.get_str("stderr")
                .unwrap_or("")
                .contains("failed on attempt 2 of 2: out of attempts, discarded"),
            "{t}"
        );
    }
    let t = db.task(asking).await;
    assert_eq!(runs_of(asking), 4, "{t}");
    assert!(
        t.get_str("stderr")
            .unwrap_or("")
            .contains("attempt 2 asked for another, max_retries is 2"),
        "{t}"
    );
    let (_, listed) = dci.get("/queues/q").await;
    assert_eq!(listed["discarded"], json!(2), "{listed}");
    drop((dci, den));
    db.drop().await;
}
