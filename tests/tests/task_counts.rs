//! Per-queue task counts are kept in `task_counts` by the writes that change statuses, so
//! `/queues`, `/summary` and `/metrics` never count a backlog; the maintenance leader
//! reconciles them with what other writers did; and concurrent viewers share one reading.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Document};
use disbatch_tests::{wait_for, write_config, Dci, Den, TestDb};
use futures::TryStreamExt;
use reqwest::Method;
use serde_json::{json, Value};

/// The test's own count of a queue's tasks, in `/queues`' columns.
async fn exact(db: &TestDb, queue: ObjectId) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::from([
        ("queued", 0),
        ("running", 0),
        ("succeeded", 0),
        ("failed", 0),
    ]);
    let mut cursor = db.tasks().find(doc! {"queue": queue}).await.expect("find");
    while let Some(t) = cursor.try_next().await.expect("next") {
        let s = t.get_i32("status").expect("status");
        let column = match s {
            s if s <= -2 => "queued",
            -1 | 0 => "running",
            1 => "succeeded",
            _ => "failed",
        };
        *out.entry(column).or_default() += 1;
    }
    out
}

fn shown(row: &Value) -> BTreeMap<&'static str, u64> {
    ["queued", "running", "succeeded", "failed"]
        .into_iter()
        .map(|k| (k, row[k].as_u64().unwrap_or(u64::MAX)))
        .collect()
}

async fn row(dci: &Dci, name: &str) -> Value {
    let (status, body) = dci.get(&format!("/queues/{name}")).await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn counts_doc(db: &TestDb, queue: ObjectId) -> Option<Document> {
    db.db
        .collection::<Document>("task_counts")
        .find_one(doc! {"_id": queue})
        .await
        .expect("task_counts")
}

async fn wait_reconciled(db: &TestDb, queue: ObjectId) -> Document {
    let deadline = Instant::now() + disbatch_tests::scaled(Duration::from_secs(60));
    let mut backoff = disbatch_tests::Backoff::new();
    loop {
        if let Some(d) = counts_doc(db, queue).await {
            if d.get_datetime("reconciled_at").is_ok() {
                return d;
            }
        }
        assert!(
            Instant::now() < deadline,
            "queue {queue} never got reconciled counts"
        );
        backoff.wait().await;
    }
}

fn kept(d: &Document, group: &str) -> i64 {
    match d.get(group) {
        Some(bson::Bson::Int64(n)) => *n,
        Some(bson::Bson::Int32(n)) => i64::from(*n),
        _ => 0,
    }
}

#[tokio::test]
async fn writes_keep_the_counts_without_a_recount() {
    let db = TestDb::new("counts_kept").await;
    let config = write_config(&db, "node.json", json!({}));
    // Paused until the counts exist, so the first reconcile finds the queue quiet.
    let queue = db.insert_queue("q", "echo", 0).await;
    // Tasks from before the counts existed are counted by the first reconcile.
    db.insert_tasks(queue, (0..5).map(|i| doc! {"old": i}.into()).collect())
        .await;
    let _den = Den::start(&config, "n1");
    let dci = Dci::start(&config);
    let first = wait_reconciled(&db, queue).await;
    let reconciled_at = first.get_datetime("reconciled_at").copied().expect("date");
    assert_eq!(kept(&first, "queued"), 5, "{first}");
    db.set_threads(queue, 4).await;

    // Created through the API (succeed or fail), chained through units, run by the DEN.
    let params: Vec<Value> = (0..40)
        .map(|i| json!({"n": i, "exit_code": if i % 4 == 0 { 3 } else { 0 }}))
        .collect();
    let (status, body) = dci
        .post("/tasks", json!({"queue": "q", "params": params}))
        .await;
    assert_eq!(status, 200, "{body}");
    wait_for("every task to end", Duration::from_secs(60), || async {
        db.count(doc! {"queue": queue, "status": {"$lt": 1}}).await == 0
    })
    .await;
    // Paused again: retry two failed ones (they stay queued), delete a third.
    db.set_threads(queue, 0).await;
    let failed: Vec<ObjectId> = {
        let mut c = db
            .tasks()
            .find(doc! {"queue": queue, "status": {"$gte": 2}})
            .await
            .expect("find");
        let mut ids = Vec::new();
        while let Some(t) = c.try_next().await.expect("next") {
            ids.push(t.get_object_id("_id").expect("id"));
        }
        ids
    };
    assert!(failed.len() >= 3, "{failed:?}");
    for id in &failed[..2] {
        let (s, b) = dci
            .post(&format!("/tasks/{}/retry", id.to_hex()), json!({}))
            .await;
        assert_eq!(s, 200, "{b}");
    }
    let (s, b) = dci
        .send(
            Method::DELETE,
            &format!("/tasks/{}", failed[2].to_hex()),
            json!({}),
        )
        .await;
    assert_eq!(s, 200, "{b}");

    let want = exact(&db, queue).await;
    wait_for(
        "the API to show the exact counts",
        Duration::from_secs(30),
        || async { shown(&row(&dci, "q").await) == want },
    )
    .await;
    // The counts came from the writes: no reconcile has run since the first.
    let now = counts_doc(&db, queue).await.expect("counts");
    assert_eq!(now.get_datetime("reconciled_at").ok(), Some(&reconciled_at));
    assert_eq!(kept(&now, "queued") as u64, want["queued"]);
    assert_eq!(kept(&now, "succeeded") as u64, want["succeeded"]);
    assert_eq!(kept(&now, "failed") as u64, want["failed"]);
    assert!(kept(&now, "seq") > kept(&first, "seq"), "{now}");
}

#[tokio::test]
async fn the_leader_corrects_counts_other_writers_changed() {
    let db = TestDb::new("counts_reconcile").await;
    let config = write_config(&db, "node.json", json!({"counts_reconcile_s": 2}));
    let queue = db.insert_queue("q", "echo", 0).await;
    let ids = db
        .insert_tasks(queue, (0..20).map(|i| doc! {"i": i}.into()).collect())
        .await;
    let mut den = Den::start(&config, "n1");
    let dci = Dci::start(&config);
    wait_reconciled(&db, queue).await;
    // As a Perl node or an operator would: statuses changed with no counts kept.
    for id in &ids[..6] {
        db.set_task(*id, doc! {"status": 1}).await;
    }
    for id in &ids[6..8] {
        db.set_task(*id, doc! {"status": -5}).await;
    }
    db.tasks()
        .delete_one(doc! {"_id": ids[8]})
        .await
        .expect("delete");
    let want = exact(&db, queue).await;
    assert_eq!(want["succeeded"], 6);
    wait_for(
        "the reconcile to correct the counts",
        Duration::from_secs(60),
        || async { shown(&row(&dci, "q").await) == want },
    )
    .await;
    let log = den.log_text();
    assert!(log.contains("task counts were off"), "{log}");
    den.stop();
}

#[tokio::test]
async fn viewers_share_one_reading_and_see_their_own_writes() {
    let db = TestDb::new("counts_shared").await;
    let config = write_config(&db, "web.json", json!({}));
    let queue = db.insert_queue("q", "echo", 0).await;
    db.insert_tasks(queue, (0..50).map(|i| doc! {"i": i}.into()).collect())
        .await;
    let dci = Dci::start(&config);
    let readings = |text: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix("disbatch_counts_readings_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(-1.0)
    };
    let scrape = || async {
        reqwest::get(dci.at("/metrics"))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("text")
    };
    let before = readings(&scrape().await);
    assert!(before >= 1.0, "no readings metric");
    let started = Instant::now();
    let paths = ["/queues", "/summary", "/metrics"];
    let requests = (0..60).map(|i| {
        let url = dci.at(paths[i % 3]);
        async move { reqwest::get(url).await.map(|r| r.status().as_u16()) }
    });
    for r in futures::future::join_all(requests).await {
        assert_eq!(r.expect("request"), 200);
    }
    let took = started.elapsed().as_secs_f64();
    let after = readings(&scrape().await);
    // One reading per second at most while they run (plus the scrape's own).
    assert!(
        after - before <= took.ceil() + 2.0,
        "{} readings for 60 requests in {took:.2} s",
        after - before
    );
    // A write through this DCI is seen by the next reading, not a second later.
    let (status, body) = dci
        .post(
            "/tasks",
            json!({"queue": "q", "params": [{"x": 1}, {"x": 2}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (_, list) = dci.get("/queues").await;
    let q = list
        .as_array()
        .and_then(|l| l.iter().find(|r| r["name"] == "q"))
        .cloned()
        .expect("q");
    assert_eq!(q["queued"], json!(52), "{q}");
}

/// The kept `queued` count of `queue`, read with the test's own client.
async fn kept_queued(db: &TestDb, queue: ObjectId) -> i64 {
    let d = db
        .db
        .collection::<Document>("task_counts")
        .find_one(doc! {"_id": queue})
        .await
        .expect("read task_counts")
        .unwrap_or_default();
    kept(&d, "queued")
}

#[tokio::test]
async fn deferred_counts_are_written_on_flush_and_at_shutdown() {
    let db = TestDb::new("counts_deferred").await;
    let store = db.den_store().await;
    let queue = db.insert_queue("q", "echo", 0).await;
    store
        .reconcile_task_counts(Duration::from_secs(600), Duration::ZERO)
        .await
        .expect("first reconcile");
    assert_eq!(kept_queued(&db, queue).await, 0);
    // As a DEN does: writes only note their count changes, written on the writer's timer.
    store.defer_count_writes();
    let tasks = |n: usize| (0..n).map(|i| doc! {"i": i as i64}).collect::<Vec<_>>();
    store.insert_tasks(queue, tasks(5)).await.expect("insert");
    assert_eq!(kept_queued(&db, queue).await, 0, "not written yet");
    store.flush_counts().await.expect("flush");
    assert_eq!(kept_queued(&db, queue).await, 5);
    // What is still noted when the process stops is written by its shutdown.
    store.insert_tasks(queue, tasks(3)).await.expect("insert");
    assert_eq!(kept_queued(&db, queue).await, 5);
    store.shutdown().await;
    assert_eq!(kept_queued(&db, queue).await, 8);
}
