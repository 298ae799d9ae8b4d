//! The routes behind the console's task history and bulk actions: `GET /tasks/:id/attempts`,
//! `POST /queues/:queue/cancel`, `DELETE /nodes/:node`, and `by_status` in `/queues`.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_model::status;
use disbatch_tests::api::{delete_result, update_result};
use disbatch_tests::{wait_for, write_config, Dci, Den, TestDb};
use reqwest::Method;
use serde_json::{json, Value};

const FIELDS: [&str; 13] = [
    "_id",
    "end",
    "exit_code",
    "node",
    "outcome",
    "output",
    "pid",
    "queue",
    "reason",
    "signal",
    "start",
    "status",
    "task",
];

fn keys(v: &Value) -> Vec<String> {
    v.as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

fn is_api_date(v: &Value) -> bool {
    v.as_str().is_some_and(|s| {
        s.len() == 19
            && s.as_bytes()[10] == b'T'
            && bson::DateTime::parse_rfc3339_str(format!("{s}Z")).is_ok()
    })
}

#[tokio::test]
async fn attempts_are_listed_oldest_first_with_every_field() {
    let db = TestDb::new("api_attempts").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let queue = db.insert_queue("q", "echo", 1).await;
    db.db
        .collection::<Document>("queues")
        .update_one(doc! {"_id": queue}, doc! {"$set": {"max_retries": 2}})
        .await
        .expect("queue");
    let ids = db
        .insert_tasks(
            queue,
            vec![doc! {"result": {"retry": true}}.into(), doc! {}.into()],
        )
        .await;
    let (retried, idle) = (ids[0], ids[1]);
    // The second task never runs: it has no attempts yet.
    db.set_task(idle, doc! {"status": -4}).await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&[retried], Duration::from_secs(60)).await;
    let path = format!("/tasks/{}/attempts", retried.to_hex());
    let closed = |body: &Value| {
        body.as_array()
            .is_some_and(|a| a.len() == 2 && a.iter().all(|r| r["outcome"] != json!("running")))
    };
    wait_for("two closed attempts", Duration::from_secs(10), || async {
        closed(&dci.get(&path).await.1)
    })
    .await;
    drop(den);
    let (s, body) = dci.get(&path).await;
    assert_eq!(s, 200, "{body}");
    let list = body.as_array().cloned().unwrap_or_default();
    let outcomes: Vec<&Value> = list.iter().map(|a| &a["outcome"]).collect();
    assert_eq!(outcomes, [&json!("retry"), &json!("failed")], "{body}");
    for a in &list {
        assert_eq!(keys(a), FIELDS, "every field, sorted: {a}");
        assert_eq!(a["task"], json!({"$oid": retried.to_hex()}));
        assert_eq!(a["queue"], json!({"$oid": queue.to_hex()}));
        assert_eq!(a["node"], json!("n1"));
        assert!(a["pid"].as_i64().is_some_and(|p| p > 0), "{a}");
        assert!(is_api_date(&a["start"]) && is_api_date(&a["end"]), "{a}");
    }
    // Issue 51: every attempt that did not succeed says why.
    assert_eq!(
        list[0]["reason"],
        json!("the plugin asked for a retry"),
        "{body}"
    );
    assert!(
        list[1]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("too many retries")),
        "{body}"
    );
    assert!(list[0]["start"].as_str() <= list[1]["start"].as_str());
    assert_eq!(
        list[0]["status"],
        Value::Null,
        "a retry records no status: {body}"
    );
    assert_eq!(list[1]["status"], json!(status::FAILED), "{body}");

    // A task without attempts, a malformed id and an unknown one.
    let (s, none) = dci.get(&format!("/tasks/{}/attempts", idle.to_hex())).await;
    assert_eq!((s, none), (200, json!([])));
    let (s, e) = dci.get("/tasks/not-an-id/attempts").await;
    assert_eq!(s, 400, "{e}");
    assert!(
        e["error"]
            .as_str()
            .is_some_and(|t| t.contains("invalid task id")),
        "{e}"
    );
    let unknown = ObjectId::new().to_hex();
    let (s, e) = dci.get(&format!("/tasks/{unknown}/attempts")).await;
    assert_eq!(s, 404, "{e}");
    assert_eq!(e, json!({"error": format!("no task with id {unknown}")}));
    db.drop().await;
}

#[tokio::test]
async fn a_lost_attempt_shows_its_reason_and_the_list_is_capped_at_the_newest_thousand() {
    let db = TestDb::new("api_attempts_cap").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let queue = db.insert_queue("q", "echo", 0).await;
    let ids = db
        .insert_tasks(queue, vec![doc! {}.into(), doc! {}.into()])
        .await;
    let attempts = db.db.collection::<Document>("attempts");
    // As recovery writes it: no pid, exit code or signal.
    let lost = ObjectId::new();
    attempts
        .insert_one(doc! {
            "_id": lost, "task": ids[0], "queue": queue, "node": "gone",
            "start": DateTime::from_millis(1_000), "end": DateTime::from_millis(61_000),
            "outcome": "lost", "reason": "its node gone stopped heartbeating (silent for over 300 s)",
        })
        .await
        .expect("lost attempt");
    let (s, body) = dci
        .get(&format!("/tasks/{}/attempts", ids[0].to_hex()))
        .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(
        body,
        json!([{
            "_id": {"$oid": lost.to_hex()}, "task": {"$oid": ids[0].to_hex()},
            "queue": {"$oid": queue.to_hex()}, "node": "gone", "pid": null,
            "start": "1970-01-01T00:00:01", "end": "1970-01-01T00:01:01", "outcome": "lost",
            "status": null, "exit_code": null, "signal": null, "output": null,
            "reason": "its node gone stopped heartbeating (silent for over 300 s)",
        }])
    );

    let many: Vec<Document> = (0..1005_i64)
        .map(|i| {
            doc! {
                "_id": ObjectId::new(), "task": ids[1], "queue": queue, "node": "n1",
                "pid": i, "start": DateTime::from_millis(1_000_000 + i * 1000),
                "outcome": "retry",
            }
        })
        .collect();
    attempts.insert_many(many).await.expect("attempts");
    let response = dci
        .http
        .get(dci.at(&format!("/tasks/{}/attempts", ids[1].to_hex())))
        .send()
        .await
        .expect("request");
    assert_eq!(
        response
            .headers()
            .get("x-attempts-truncated")
            .and_then(|v| v.to_str().ok()),
        Some("true")
    );
    let body: Value = response.json().await.expect("json");
    let list = body.as_array().cloned().unwrap_or_default();
    assert_eq!(list.len(), 1000);
    let pids: Vec<i64> = list.iter().filter_map(|a| a["pid"].as_i64()).collect();
    assert_eq!(pids.first(), Some(&5), "the newest thousand, oldest first");
    assert_eq!(pids.last(), Some(&1004));
    assert!(pids.windows(2).all(|w| w[0] < w[1]));
    db.drop().await;
}

#[tokio::test]
async fn queue_cancel_cancels_what_waits_and_counts_show_every_status_apart() {
    let db = TestDb::new("api_queue_cancel").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let queue = db.insert_queue("q", "echo", 0).await;
    let other = db.insert_queue("other", "echo", 0).await;
    let statuses = [-2, -2, -4, -1, 0, 1, 2, 3, -3, -5, -6, -6];
    let ids = db
        .insert_tasks(queue, statuses.iter().map(|_| doc! {}.into()).collect())
        .await;
    for (id, status) in ids.iter().zip(statuses) {
        db.set_task(*id, doc! {"status": status, "node": if status == -1 || status == 0 { Bson::from("n1") } else { Bson::Null }})
            .await;
    }
    let untouched = db.insert_tasks(other, vec![doc! {}.into()]).await[0];

    check_counts_show_every_status_apart(&dci).await;

    check_queue_cancel_cancels_only_what_waits(&db, &dci, &ids, untouched).await;

    check_retry_failed_then_cancel_the_rest(&db, &dci, &ids).await;

    // Nothing left to cancel; by id too; unknown queue.
    let (s, body) = dci
        .post(&format!("/queues/{}/cancel", queue.to_hex()), json!({}))
        .await;
    assert_eq!((s, body), (200, update_result(0, 0)));
    let (s, body) = dci.post("/queues/nope/cancel", json!({})).await;
    assert_eq!(s, 404, "{body}");
    let (s, body) = dci.get("/queues/q/cancel").await;
    assert_eq!(s, 405, "{body}");
    db.drop().await;
}

async fn check_counts_show_every_status_apart(dci: &Dci) {
    let (s, q) = dci.get("/queues/q").await;
    assert_eq!(s, 200, "{q}");
    // Disbatch's columns keep their meaning: queued is every status ≤ -2.
    assert_eq!(
        (
            &q["queued"],
            &q["running"],
            &q["succeeded"],
            &q["failed"],
            &q["completed"]
        ),
        (&json!(7), &json!(2), &json!(1), &json!(2), &json!(3)),
        "{q}"
    );
    assert_eq!(
        q["by_status"],
        json!({
            "queued": 2, "claimed": 1, "running": 1, "succeeded": 1, "failed": 2,
            "terminated": 1, "blocked": 1, "cancelled": 1, "orphaned": 2, "other": 0,
        }),
        "{q}"
    );
    let (_, list) = dci.get("/queues").await;
    let row = list
        .as_array()
        .and_then(|l| l.iter().find(|r| r["name"] == json!("q")).cloned())
        .unwrap_or_default();
    assert_eq!(row["by_status"], q["by_status"], "{list}");
}

async fn check_queue_cancel_cancels_only_what_waits(
    db: &TestDb,
    dci: &Dci,
    ids: &[ObjectId],
    untouched: ObjectId,
) {
    let (s, body) = dci.post("/queues/q/cancel", json!({})).await;
    assert_eq!((s, body), (200, update_result(3, 3)));
    let after: Vec<i32> = {
        let mut v = Vec::new();
        for id in ids {
            v.push(db.task(*id).await.get_i32("status").unwrap_or(99));
        }
        v
    };
    assert_eq!(
        after,
        [
            status::CANCELLED,
            status::CANCELLED,
            status::CANCELLED,
            status::CLAIMED,
            status::RUNNING,
            status::SUCCEEDED,
            status::FAILED,
            3,
            status::TERMINATED,
            status::CANCELLED,
            status::ORPHANED,
            status::ORPHANED,
        ]
    );
    assert_eq!(
        db.task(untouched).await.get_i32("status").ok(),
        Some(status::QUEUED)
    );
    let (_, q) = dci.get("/queues/q").await;
    assert_eq!(q["by_status"]["cancelled"], json!(4), "{q}");
    assert_eq!(q["by_status"]["queued"], json!(0), "{q}");
    assert_eq!(q["queued"], json!(7), "still every status ≤ -2: {q}");
}

async fn check_retry_failed_then_cancel_the_rest(db: &TestDb, dci: &Dci, ids: &[ObjectId]) {
    // Retry "failed": status 2 and the plugin-defined codes above it, nothing else.
    let (s, body) = dci
        .post("/queues/q/retry", json!({"status": "failed"}))
        .await;
    assert_eq!((s, body), (200, update_result(2, 2)));
    assert_eq!(
        db.task(ids[6]).await.get_i32("status").ok(),
        Some(status::QUEUED)
    );
    assert_eq!(
        db.task(ids[7]).await.get_i32("status").ok(),
        Some(status::QUEUED)
    );
    assert_eq!(
        db.task(ids[5]).await.get_i32("status").ok(),
        Some(status::SUCCEEDED)
    );
    let (_, q) = dci.get("/queues/q").await;
    assert_eq!(
        (&q["by_status"]["failed"], &q["by_status"]["queued"]),
        (&json!(0), &json!(2)),
        "{q}"
    );
    let (s, body) = dci
        .post("/queues/q/retry", json!({"status": "broken"}))
        .await;
    assert_eq!(s, 400, "{body}");
    let (s, body) = dci.post("/queues/q/cancel", json!({})).await;
    assert_eq!((s, body), (200, update_result(2, 2)));
}

#[tokio::test]
async fn a_stale_node_is_forgotten_and_a_live_one_or_one_holding_tasks_is_not() {
    let db = TestDb::new("api_forget_node").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let stale = db.insert_node("stale", Duration::from_secs(600)).await;
    db.insert_node("fresh", Duration::ZERO).await;
    db.insert_node("holding", Duration::from_secs(600)).await;
    let queue = db.insert_queue("q", "echo", 0).await;
    let task = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    db.set_task(task, doc! {"status": 0, "node": "holding"})
        .await;

    let (s, body) = dci.send(Method::DELETE, "/nodes/fresh", json!({})).await;
    assert_eq!(s, 409, "{body}");
    assert_eq!(
        body,
        json!({"error": "node fresh was not forgotten: it is live (heartbeat within the last 15000 ms, web.live_window_ms)"})
    );
    let (s, body) = dci.send(Method::DELETE, "/nodes/holding", json!({})).await;
    assert_eq!(s, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("still holds 1 claimed or running task")),
        "{body}"
    );
    // A live DEN refused too, and it is still listed.
    let den = Den::start(&config, "n1");
    wait_for("the DEN's heartbeat", Duration::from_secs(20), || async {
        dci.get("/nodes/n1").await.0 == 200
    })
    .await;
    let (s, body) = dci.send(Method::DELETE, "/nodes/n1", json!({})).await;
    assert_eq!(s, 409, "{body}");
    assert_eq!(dci.get("/nodes/n1").await.0, 200);
    drop(den);

    let (s, body) = dci
        .send(
            Method::DELETE,
            &format!("/nodes/{}", stale.to_hex()),
            json!({}),
        )
        .await;
    assert_eq!((s, body), (200, delete_result(1)));
    let (s, _) = dci.get("/nodes/stale").await;
    assert_eq!(s, 404);
    let (s, body) = dci.send(Method::DELETE, "/nodes/stale", json!({})).await;
    assert_eq!(s, 404, "{body}");
    let (_, nodes) = dci.get("/nodes").await;
    let names: Vec<&Value> = nodes
        .as_array()
        .map(|l| l.iter().map(|n| &n["node"]).collect())
        .unwrap_or_default();
    assert_eq!(names, [&json!("fresh"), &json!("holding"), &json!("n1")]);
    db.drop().await;
}

#[tokio::test]
async fn reading_attempts_needs_read_and_the_bulk_actions_need_operate() {
    const READ: &str = "read-token-0123456789abcdef";
    const OPERATE: &str = "operate-token-0123456789abcdef";
    let db = TestDb::new("api_console_roles").await;
    let config = write_config(
        &db,
        "node.json",
        json!({"web": {"tokens": [
            {"name": "viewer", "role": "read", "token": READ},
            {"name": "ops", "role": "operate", "token": OPERATE},
        ]}}),
    );
    let dci = Dci::start(&config);
    let queue = db.insert_queue("q", "echo", 0).await;
    let task = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    db.insert_node("old", Duration::from_secs(600)).await;
    let call = |method: Method, path: String, token: Option<&'static str>| {
        let mut r = dci.http.request(method, dci.at(&path));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        async move {
            let response = r.send().await.expect("request");
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            (status, body)
        }
    };
    let attempts = format!("/tasks/{}/attempts", task.to_hex());
    assert_eq!(call(Method::GET, attempts.clone(), None).await.0, 401);
    assert_eq!(
        call(Method::GET, attempts.clone(), Some(READ)).await,
        (200, json!([]))
    );
    for (method, path) in [
        (Method::POST, "/queues/q/cancel".to_string()),
        (Method::DELETE, "/nodes/old".to_string()),
    ] {
        let (s, body) = call(method.clone(), path.clone(), Some(READ)).await;
        assert_eq!(s, 403, "{method} {path}: {body}");
        assert!(
            body["error"]
                .as_str()
                .is_some_and(|e| e.contains("needs role operate")),
            "{body}"
        );
        assert_eq!(call(method.clone(), path.clone(), None).await.0, 401);
    }
    assert_eq!(
        db.task(task).await.get_i32("status").ok(),
        Some(status::QUEUED)
    );
    let (s, body) = call(Method::POST, "/queues/q/cancel".into(), Some(OPERATE)).await;
    assert_eq!((s, body), (200, update_result(1, 1)));
    let (s, body) = call(Method::DELETE, "/nodes/old".into(), Some(OPERATE)).await;
    assert_eq!((s, body), (200, delete_result(1)));
    // The routes are listed with their roles.
    let (_, doc) = call(Method::GET, "/openapi.json".into(), Some(READ)).await;
    assert_eq!(
        doc["paths"]["/tasks/{id}/attempts"]["get"]["x-disbatch-role"],
        json!("read"),
        "{}",
        doc["paths"]
    );
    assert_eq!(
        doc["paths"]["/queues/{queue}/cancel"]["post"]["x-disbatch-role"],
        json!("operate")
    );
    assert_eq!(
        doc["paths"]["/nodes/{node}"]["delete"]["x-disbatch-role"],
        json!("operate")
    );
    db.drop().await;
}
