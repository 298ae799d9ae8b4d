//! A queue's retry: the chosen statuses requeued, many codes in one write, and longer lists
//! refused.

use bson::{doc, Bson};
use disbatch_model::status;
use disbatch_tests::api::{error, update_result};
use disbatch_tests::api_calls::raw_json;
use disbatch_tests::{write_config, Dci, TestDb};
use reqwest::Method;
use serde_json::json;

#[tokio::test]
async fn a_queue_retry_requeues_the_chosen_statuses() {
    let db = TestDb::new("api_queues_retry").await;
    let config = write_config(&db, "web.json", json!({}));
    let queue = db.insert_queue("q", "echo", 0).await;
    let other = db.insert_queue("other", "echo", 0).await;
    let statuses = [2, -6, 1, -5, -3, -2, 0, -1, 3];
    let ids = db
        .insert_tasks(
            queue,
            statuses.iter().map(|s| doc! {"s": *s}.into()).collect(),
        )
        .await;
    for (id, s) in ids.iter().zip(statuses) {
        db.set_task(
            *id,
            doc! {"status": s, "node": "n1", "stdout": "out", "stderr": "err", "complete": s >= 1},
        )
        .await;
    }
    let foreign = db.insert_tasks(other, vec![doc! {"s": 2}.into()]).await[0];
    db.set_task(foreign, doc! {"status": 2}).await;
    let dci = Dci::start(&config);
    let status_of = |i: usize| {
        let db = &db;
        let id = ids[i];
        async move { db.task(id).await.get_i32("status").expect("status") }
    };

    // Default: every failed status (2, and the plugin's 3) and orphaned (-6).
    let (status, body) = dci.post("/queues/q/retry", json!({})).await;
    assert_eq!((status, body), (200, update_result(3, 3)));
    for i in [0, 1, 8] {
        let t = db.task(ids[i]).await;
        assert_eq!(t.get_i32("status").ok(), Some(status::QUEUED), "{t}");
        assert_eq!(t.get("node"), Some(&Bson::Null), "{t}");
        assert_eq!(t.get("stdout"), Some(&Bson::Null), "{t}");
        assert_eq!(t.get("stderr"), Some(&Bson::Null), "{t}");
        assert!(t.get("complete").is_none(), "{t}");
    }
    assert_eq!(status_of(2).await, 1, "succeeded tasks stay");
    assert_eq!(
        db.task(foreign).await.get_i32("status").ok(),
        Some(status::FAILED),
        "other queues untouched"
    );

    db.set_task(ids[8], doc! {"status": 3}).await;
    let path = format!("/queues/{}/retry", queue.to_hex());
    let (status, body) = dci.post(&path, json!({"status": [1, -5, 3]})).await;
    assert_eq!((status, body), (200, update_result(3, 3)));
    for i in [2, 3, 8] {
        assert_eq!(status_of(i).await, -2);
    }
    assert_eq!(status_of(4).await, -3, "terminated not asked for");
    let (status, _, body) = raw_json(
        &dci,
        Method::POST,
        "/queues/q/retry",
        Some("application/x-www-form-urlencoded"),
        "status=-3",
    )
    .await;
    assert_eq!((status, body), (200, update_result(1, 1)));
    assert_eq!(status_of(4).await, -2);

    for bad in [json!([0]), json!([-1]), json!([-2]), json!([2, -4])] {
        let (status, body) = dci.post("/queues/q/retry", json!({"status": bad})).await;
        assert_eq!(status, 400, "status {bad}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("cannot be retried")),
            "{body}"
        );
    }
    let (status, body) = dci.post("/queues/q/retry", json!({"status": ["x"]})).await;
    assert_eq!(
        (status, body),
        (400, error("status must be a list of integer status codes"))
    );
    assert_eq!(status_of(6).await, 0, "running task untouched");
    assert_eq!(status_of(7).await, -1, "claimed task untouched");

    let (status, body) = dci.post("/queues/nosuch/retry", json!({})).await;
    assert_eq!((status, body), (404, error("no queue nosuch")));
    drop(dci);
    db.drop().await;
}

/// A retry of many status codes is one write per status group (these all count as failed:
/// one write), not one per code; a list longer than the cap is refused before any write.
// Multi-threaded: the proxy relays on this runtime while `Dci::start` blocks a thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_retry_of_many_codes_is_one_write_and_longer_lists_are_refused() {
    use disbatch_tests::bench::proxy::{Counts, HostUri, Proxy};
    let db = TestDb::new("api_queues_retry_many").await;
    let server = HostUri::parse(&db.uri).expect("the test server's URI");
    let proxy = Proxy::start(server.host.clone()).await.expect("the proxy");
    let config = write_config(
        &db,
        "web.json",
        json!({"mongohost": server.with_host(&proxy.addr.to_string())}),
    );
    let queue = db.insert_queue("q", "echo", 0).await;
    let statuses = [2, 7, 300, 501, 1, 600];
    let ids = db
        .insert_tasks(
            queue,
            statuses.iter().map(|s| doc! {"s": *s}.into()).collect(),
        )
        .await;
    for (id, s) in ids.iter().zip(statuses) {
        db.set_task(*id, doc! {"status": s, "node": "n1"}).await;
    }
    let dci = Dci::start(&config);
    let task_updates =
        |c: &Counts| -> u64 { c.app.values().filter_map(|by| by.get("update tasks")).sum() };
    let codes: Vec<i32> = (2..=501).collect();
    let before = proxy.snapshot();
    let (status, body) = dci.post("/queues/q/retry", json!({"status": codes})).await;
    assert_eq!((status, body), (200, update_result(4, 4)));
    let counted = proxy.snapshot().since(&before);
    assert_eq!(
        task_updates(&counted),
        1,
        "one write for {} codes: {:?}",
        codes.len(),
        counted.app
    );
    for (id, s) in ids.iter().zip(statuses) {
        let now = db.task(*id).await.get_i32("status").expect("status");
        let expected = if s == status::SUCCEEDED || s == 600 {
            s
        } else {
            status::QUEUED
        };
        assert_eq!(now, expected, "task with status {s}");
    }

    let too_many: Vec<i32> = (2..=1002).collect();
    let before = proxy.snapshot();
    let (status, body) = dci
        .post("/queues/q/retry", json!({"status": too_many}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("status lists 1001 codes; at most 1000 are allowed")),
        "{body}"
    );
    assert_eq!(task_updates(&proxy.snapshot().since(&before)), 0);
    assert_eq!(db.task(ids[5]).await.get_i32("status").ok(), Some(600));
    drop(dci);
    db.drop().await;
}
