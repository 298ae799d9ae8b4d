//! API pieces the console relies on: pause/resume, succeeded/failed counts, output byte ranges.

use std::time::Duration;

use bson::doc;
use disbatch_tests::{write_config, Dci, Den, TestDb};
use serde_json::json;

#[tokio::test]
async fn pause_remembers_threads_and_resume_restores_them() {
    let db = TestDb::new("pause").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let (s, _) = dci
        .post(
            "/queues",
            json!({"name": "q", "plugin": "echo", "threads": 4}),
        )
        .await;
    assert_eq!(s, 200);
    let (s, body) = dci.post("/queues/q/pause", json!({})).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["MongoDB::UpdateResult"]["modified_count"], json!(1));
    let (_, q) = dci.get("/queues/q").await;
    assert_eq!(
        (q["threads"].clone(), q["paused_threads"].clone()),
        (json!(0), json!(4))
    );
    let (s, body) = dci.post("/queues/q/pause", json!({})).await;
    assert_eq!(s, 409, "pausing twice would lose the threads: {body}");
    let (s, _) = dci.post("/queues/q/resume", json!({})).await;
    assert_eq!(s, 200);
    let (_, q) = dci.get("/queues/q").await;
    assert_eq!(
        (q["threads"].clone(), q["paused_threads"].clone()),
        (json!(4), json!(null))
    );
    let (s, body) = dci.post("/queues/q/resume", json!({})).await;
    assert_eq!(s, 409, "{body}");
    assert_eq!(body["error"], json!("queue q is not paused"));
    let (s, _) = dci.post("/queues/nope/pause", json!({})).await;
    assert_eq!(s, 404);
    // A queue with no threads has nothing to pause.
    dci.post("/queues", json!({"name": "idle", "plugin": "echo"}))
        .await;
    let (s, _) = dci.post("/queues/idle/pause", json!({})).await;
    assert_eq!(s, 409);
    db.drop().await;
}

#[tokio::test]
async fn queue_counts_split_completed_into_succeeded_and_failed() {
    let db = TestDb::new("counts").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let queue = db.insert_queue("q", "echo", 0).await;
    let ids = db
        .insert_tasks(queue, (0..6).map(|_| doc! {}.into()).collect())
        .await;
    for (id, status) in ids.iter().zip([1, 1, 2, 3, -2, 0]) {
        db.tasks()
            .update_one(doc! {"_id": id}, doc! {"$set": {"status": status}})
            .await
            .expect("set");
    }
    let (_, q) = dci.get("/queues/q").await;
    assert_eq!(
        (
            q["queued"].clone(),
            q["running"].clone(),
            q["completed"].clone(),
            q["succeeded"].clone(),
            q["failed"].clone()
        ),
        (json!(1), json!(1), json!(4), json!(2), json!(2)),
        "{q}"
    );
    db.drop().await;
}

async fn range(dci: &Dci, path: &str) -> (String, Vec<u8>) {
    let r = dci.http.get(dci.at(path)).send().await.expect("get");
    assert_eq!(r.status().as_u16(), 200, "{path}");
    let total = r
        .headers()
        .get("x-total-length")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (total, r.bytes().await.expect("body").to_vec())
}

#[tokio::test]
async fn output_can_be_read_in_byte_ranges_inline_and_from_gridfs() {
    let db = TestDb::new("ranges").await;
    let config = write_config(&db, "node.json", json!({"gfs": "auto"}));
    let dci = Dci::start(&config);
    let queue = db.insert_queue("demo", "Disbatch::Plugin::Demo", 2).await;
    // "ea": 15 MiB of 'e' then the apple line, so stdout goes to GridFS; "a" stays inline.
    let ids = db
        .insert_tasks(
            queue,
            vec![
                doc! {"commands": "ea"}.into(),
                doc! {"commands": "a"}.into(),
            ],
        )
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    drop(den);
    let big = ids[0].to_hex();
    let total = 15 * 1024 * 1024 + 31;
    let (t, body) = range(&dci, &format!("/tasks/{big}/stdout?offset=0&length=65536")).await;
    assert_eq!(t, total.to_string());
    assert_eq!(body, vec![b'e'; 65536]);
    let (_, body) = range(
        &dci,
        &format!("/tasks/{big}/stdout?offset={}&length=100", total - 40),
    )
    .await;
    assert_eq!(
        body,
        [&b"eeeeeeeee"[..], b"This is command 'a' for apple.\n"].concat()
    );
    let (_, body) = range(&dci, &format!("/tasks/{big}/stdout?offset={}", total + 10)).await;
    assert!(body.is_empty());

    let small = ids[1].to_hex();
    let (t, body) = range(&dci, &format!("/tasks/{small}/stdout?offset=8&length=7")).await;
    assert_eq!((t.as_str(), body.as_slice()), ("31", &b"command"[..]));
    let (t, body) = range(&dci, &format!("/tasks/{small}/stderr")).await;
    assert_eq!((t.as_str(), body.len()), ("0", 0));
    let r = dci
        .http
        .get(dci.at(&format!("/tasks/{small}/stdout?offset=-1")))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status().as_u16(), 400);
    db.drop().await;
}
