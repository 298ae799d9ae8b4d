//! Per-queue task counts are kept in `task_counts` by the writes that change statuses, so
//! `/queues`, `/summary` and `/metrics` never count a backlog; the maintenance leader
//! reconciles them with what other writers did; and concurrent viewers share one reading.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Document};
use disbatch_model::status;
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
    let den = Den::start(&config, "n1");
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
        db.count(doc! {"queue": queue, "status": {"$lt": status::SUCCEEDED}})
            .await
            == 0
    })
    .await;
    // Paused again: retry two failed ones (they stay queued), delete a third. A pass that
    // read the queue before the pause can still claim from it, so the retries wait for two
    // more reads of the node's queues: the second began after the pause was written.
    db.set_threads(queue, 0).await;
    den.wait_queue_reads(2).await;
    let failed: Vec<ObjectId> = {
        let mut c = db
            .tasks()
            .find(doc! {"queue": queue, "status": {"$gte": status::FAILED}})
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
    // Given up on by hand, as an operator marking failures might.
    for id in &ids[9..11] {
        db.set_task(
            *id,
            doc! {"status": 2, "discarded_at": bson::DateTime::now()},
        )
        .await;
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
        || async {
            let r = row(&dci, "q").await;
            shown(&r) == want && r["discarded"] == json!(2)
        },
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
        .tasks()
        .reconcile_task_counts(Duration::from_secs(600), Duration::ZERO)
        .await
        .expect("first reconcile");
    assert_eq!(kept_queued(&db, queue).await, 0);
    // As a DEN does: writes only note their count changes, written on the writer's timer.
    store.tasks().defer_count_writes();
    let tasks = |n: usize| (0..n).map(|i| doc! {"i": i as i64}).collect::<Vec<_>>();
    store
        .tasks()
        .insert_tasks(queue, tasks(5))
        .await
        .expect("insert");
    assert_eq!(kept_queued(&db, queue).await, 0, "not written yet");
    store.tasks().flush_counts().await.expect("flush");
    assert_eq!(kept_queued(&db, queue).await, 5);
    // What is still noted when the process stops is written by its shutdown.
    store
        .tasks()
        .insert_tasks(queue, tasks(3))
        .await
        .expect("insert");
    assert_eq!(kept_queued(&db, queue).await, 5);
    store.shutdown().await;
    assert_eq!(kept_queued(&db, queue).await, 8);
}

/// The ids of `queue`'s tasks that match `filter`.
async fn ids_where(db: &TestDb, queue: ObjectId, filter: Document) -> Vec<ObjectId> {
    let mut f = doc! {"queue": queue};
    f.extend(filter);
    let mut c = db.tasks().find(f).await.expect("find");
    let mut ids = Vec::new();
    while let Some(t) = c.try_next().await.expect("next") {
        ids.push(t.get_object_id("_id").expect("id"));
    }
    ids
}

/// One sample of the DCI's `/metrics`, or -1 when it is missing.
async fn scraped(dci: &Dci, sample: &str) -> f64 {
    let text = reqwest::get(dci.at("/metrics"))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("text");
    text.lines()
        .find_map(|l| l.strip_prefix(sample))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0)
}

#[tokio::test]
async fn discarded_and_retrying_counts_are_kept_by_each_write_that_changes_them() {
    let db = TestDb::new("counts_discarded").await;
    let config = write_config(&db, "node.json", json!({}));
    // Paused until the first reconcile has made their counts.
    let give_up = db.insert_queue("giveup", "echo", 0).await;
    db.set_queue(give_up, doc! {"retry": {"max_attempts": 1}})
        .await;
    let backoff = db.insert_queue("backoff", "echo", 0).await;
    // An hour's wait: the failed task stays waiting for its retry for the whole test.
    db.set_queue(
        backoff,
        doc! {"retry": {"max_attempts": 5, "backoff": "constant", "base_s": 3600, "jitter": 0}},
    )
    .await;
    // Disbatch's behaviour: a failure is final but not discarded.
    let plain = db.insert_queue("plain", "echo", 0).await;
    let den = Den::start(&config, "n1");
    let dci = Dci::start(&config);
    let mut reconciled = BTreeMap::new();
    for q in [give_up, backoff, plain] {
        let d = wait_reconciled(&db, q).await;
        reconciled.insert(q, d.get_datetime("reconciled_at").copied().expect("date"));
    }
    for (name, n) in [("giveup", 3), ("backoff", 1), ("plain", 1)] {
        let params: Vec<Value> = (0..n).map(|i| json!({"i": i, "exit_code": 3})).collect();
        let (status, body) = dci
            .post("/tasks", json!({"queue": name, "params": params}))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    for q in [give_up, backoff, plain] {
        db.set_threads(q, 2).await;
    }
    wait_for("the failures to land", Duration::from_secs(60), || async {
        db.count(doc! {"queue": give_up, "discarded_at": {"$exists": true}})
            .await
            == 3
            && db
                .count(doc! {"queue": backoff, "status": -2, "attempt": {"$exists": true}})
                .await
                == 1
            && db.count(doc! {"queue": plain, "status": 2}).await == 1
    })
    .await;
    for q in [give_up, backoff, plain] {
        db.set_threads(q, 0).await;
    }
    // No pass on a reading from before the pause claims what is retried below.
    den.wait_queue_reads(2).await;

    check_the_counts_are_shown_by_the_list_the_view_and_the_metrics(&dci).await;
    check_each_discard_write_moves_the_kept_count(&db, &dci, give_up, plain).await;
    // All of it came from the writes: no reconcile ran since the first.
    for (q, at) in reconciled {
        let d = counts_doc(&db, q).await.expect("counts");
        assert_eq!(d.get_datetime("reconciled_at").ok(), Some(&at), "{d}");
    }
    drop(dci);
    drop(den);
    db.drop().await;
}

/// The list, one queue's view and the DCI's metrics all show the discarded and retrying counts.
async fn check_the_counts_are_shown_by_the_list_the_view_and_the_metrics(dci: &Dci) {
    wait_for("the counts shown", Duration::from_secs(30), || async {
        discarded_of(dci, "giveup").await == Some(3)
            && row(dci, "backoff").await["retrying"].as_u64() == Some(1)
    })
    .await;
    let (_, list) = dci.get("/queues").await;
    let listed = |name: &str, key: &str| {
        list.as_array()
            .and_then(|l| l.iter().find(|r| r["name"] == name))
            .map(|r| r[key].clone())
    };
    assert_eq!(listed("giveup", "discarded"), Some(json!(3)), "{list}");
    assert_eq!(listed("backoff", "retrying"), Some(json!(1)), "{list}");
    assert_eq!(listed("plain", "discarded"), Some(json!(0)), "{list}");
    assert_eq!(
        scraped(dci, "disbatch_queue_tasks_discarded{queue=\"giveup\"} ").await,
        3.0
    );
    assert_eq!(
        scraped(dci, "disbatch_queue_tasks_retrying{queue=\"backoff\"} ").await,
        1.0
    );
    let (_, waiting) = dci.get("/tasks?queue=backoff&status=retrying").await;
    assert_eq!(waiting.as_array().map(Vec::len), Some(1), "{waiting}");
}

/// Each write that marks or clears a discard moves the kept count by itself, and a queue's
/// retry of its failed tasks clears the last one.
async fn check_each_discard_write_moves_the_kept_count(
    db: &TestDb,
    dci: &Dci,
    give_up: ObjectId,
    plain: ObjectId,
) {
    let gone = ids_where(db, give_up, doc! {"discarded_at": {"$exists": true}}).await;
    let (s, b) = dci
        .post(&format!("/tasks/{}/retry", gone[0].to_hex()), json!({}))
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = dci
        .send(
            Method::DELETE,
            &format!("/tasks/{}", gone[1].to_hex()),
            json!({}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let plain_failed = ids_where(db, plain, doc! {"status": 2}).await;
    let (s, b) = dci
        .post(
            &format!("/tasks/{}/discard", plain_failed[0].to_hex()),
            json!({}),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let kept_discarded =
        |q: ObjectId| async move { counts_doc(db, q).await.map(|d| kept(&d, "discarded")) };
    assert_eq!(kept_discarded(give_up).await, Some(1));
    assert_eq!(kept_discarded(plain).await, Some(1));
    assert_eq!(discarded_of(dci, "plain").await, Some(1));
    // A queue's retry of its failed tasks clears the last one.
    let (s, b) = dci
        .post("/queues/giveup/retry", json!({"status": "failed"}))
        .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(kept_discarded(give_up).await, Some(0));
    assert_eq!(discarded_of(dci, "giveup").await, Some(0));
    assert_eq!(
        db.count(doc! {"queue": give_up, "discarded_at": {"$exists": true}})
            .await,
        0
    );
}

/// The discarded count a queue's own view shows.
async fn discarded_of(dci: &Dci, name: &str) -> Option<u64> {
    row(dci, name).await["discarded"].as_u64()
}
