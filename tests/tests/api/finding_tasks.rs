//! Finding tasks (issue 51 item 4): `GET /tasks`' status words, time range, node and params
//! filters with the bounded-scan refusal; the failures view through the API, CLI and console;
//! "failed" as every status ≥ 2 in links and `retry --queue`; and all of it over a long history.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_tests::{wait_for, write_config, Browser, Dci, TestDb};
use serde_json::{json, Value};

const HINT: &str =
    "params.text is not indexed: add a time range (since/until) or a limit of at most 1000 so the scan is bounded";

fn ids(v: &Value) -> Vec<String> {
    let mut ids: Vec<String> = match v {
        Value::Array(items) => items
            .iter()
            .filter_map(|t| t["_id"]["$oid"].as_str().map(str::to_string))
            .collect(),
        Value::Object(o) if o.is_empty() => vec![],
        other => panic!("expected an array: {other}"),
    };
    ids.sort();
    ids
}

fn hexes(ids: &[ObjectId]) -> Vec<String> {
    let mut out: Vec<String> = ids.iter().map(|id| id.to_hex()).collect();
    out.sort();
    out
}

fn date(text: &str) -> DateTime {
    DateTime::parse_rfc3339_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// An ended task's fields: status, node, when it last changed, optionally discarded.
fn ended(status: i32, node: &str, mtime: DateTime, discarded: bool) -> Document {
    let mut d = doc! {"status": status, "node": node, "mtime": mtime, "complete": true};
    if discarded {
        d.insert("discarded_at", mtime);
    }
    d
}

async fn insert_attempt(db: &TestDb, task: ObjectId, queue: ObjectId, end: DateTime, reason: &str) {
    db.db
        .collection::<Document>("attempts")
        .insert_one(doc! {
            "_id": ObjectId::new(), "task": task, "queue": queue, "node": "n1",
            "start": DateTime::from_millis(end.timestamp_millis() - 1000), "end": end,
            "outcome": "failed", "reason": reason,
        })
        .await
        .expect("insert attempt");
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Queue `words`: "a b" failed 2 (old, node n1), "c" failed 3 (the plugin's own code, n2),
/// "a b" discarded (n2), "d" succeeded (n1), "e" queued. Queue `other`: one failed 2.
struct Fixture {
    words: ObjectId,
    failed_old: ObjectId,
    failed3: ObjectId,
    discarded: ObjectId,
    succeeded: ObjectId,
    queued: ObjectId,
    other_failed: ObjectId,
}

async fn fixture(db: &TestDb) -> Fixture {
    let words = db.insert_queue("words", "echo", 0).await;
    let other = db.insert_queue("other", "echo", 0).await;
    let t = db
        .insert_tasks(
            words,
            ["a b", "c", "a b", "d", "e"]
                .iter()
                .map(|s| doc! {"text": *s}.into())
                .collect(),
        )
        .await;
    db.set_task(t[0], ended(2, "n1", date("2020-01-01T00:00:00Z"), false))
        .await;
    db.set_task(t[1], ended(3, "n2", date("2026-01-02T00:00:00Z"), false))
        .await;
    db.set_task(t[2], ended(2, "n2", date("2026-01-03T00:00:00Z"), true))
        .await;
    db.set_task(t[3], ended(1, "n1", date("2026-01-04T00:00:00Z"), false))
        .await;
    let o = db
        .insert_tasks(other, vec![doc! {"text": "z"}.into()])
        .await[0];
    db.set_task(o, ended(2, "n1", date("2026-01-05T00:00:00Z"), false))
        .await;
    insert_attempt(db, t[1], words, date("2026-01-02T00:00:00Z"), "exit code 3").await;
    insert_attempt(db, t[2], words, date("2026-01-02T23:00:00Z"), "exit code 1").await;
    insert_attempt(
        db,
        t[2],
        words,
        date("2026-01-03T00:00:00Z"),
        "out of attempts (3 of 3)",
    )
    .await;
    insert_attempt(db, o, other, date("2026-01-05T00:00:00Z"), "timed out").await;
    Fixture {
        words,
        failed_old: t[0],
        failed3: t[1],
        discarded: t[2],
        succeeded: t[3],
        queued: t[4],
        other_failed: o,
    }
}

#[tokio::test]
async fn search_filters_by_status_word_time_node_and_params() {
    let db = TestDb::new("finding_search").await;
    let config = write_config(&db, "web.json", json!({}));
    let f = fixture(&db).await;
    let dci = Dci::start(&config);
    let failed_words = [f.failed_old, f.failed3, f.discarded];

    // "failed" is every status ≥ 2, the plugin's 3 too, across queues or in one.
    let (status, body) = dci.get("/tasks?status=failed").await;
    assert_eq!(status, 200, "{body}");
    let mut all_failed = failed_words.to_vec();
    all_failed.push(f.other_failed);
    assert_eq!(ids(&body), hexes(&all_failed));
    let (_, body) = dci.get("/tasks?queue=words&status=failed").await;
    assert_eq!(ids(&body), hexes(&failed_words));
    let (_, body) = dci.get("/tasks?queue=words&status=failed&.count=1").await;
    assert_eq!(body, json!({"count": 3}));
    let (_, body) = dci.get("/tasks?status=discarded").await;
    assert_eq!(ids(&body), hexes(&[f.discarded]));
    let (_, body) = dci.get("/tasks?queue=words&status=succeeded").await;
    assert_eq!(ids(&body), hexes(&[f.succeeded]));
    let (_, body) = dci.get("/tasks?queue=words&status=queued").await;
    assert_eq!(ids(&body), hexes(&[f.queued]));
    let (status, body) = dci.get("/tasks?status=broken").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or("")
            .contains("failed, discarded"),
        "{body}"
    );

    // A time range on mtime: the 2020 failure is left out.
    let (status, body) = dci
        .get("/tasks?status=failed&since=2021-01-01T00:00:00Z")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids(&body), hexes(&[f.failed3, f.discarded, f.other_failed]));
    let (_, body) = dci
        .get("/tasks?status=failed&since=2021-01-01T00:00:00Z&until=2026-01-03T00:00:00Z")
        .await;
    assert_eq!(ids(&body), hexes(&[f.failed3]));
    // Creation time, read from `_id`: every fixture task was made just now.
    let (status, body) = dci
        .get("/tasks?status=failed&created_since=2021-01-01T00:00:00Z")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids(&body).len(), 4, "{body}");
    let (_, body) = dci
        .get("/tasks?status=failed&created_until=2021-01-01T00:00:00Z")
        .await;
    assert_eq!(ids(&body), Vec::<String>::new(), "{body}");
    let (status, body) = dci
        .get("/tasks?queue=words&params.text=a%20b&created_since=2021-01-01T00:00:00Z")
        .await;
    assert_eq!(
        status, 200,
        "a creation range bounds a params search: {body}"
    );
    assert_eq!(ids(&body), hexes(&[f.failed_old, f.discarded]));
    let (status, body) = dci.get("/tasks?status=failed&since=yesterday").await;
    assert_eq!(status, 400, "{body}");

    // Node: indexed alone (node, status, queue).
    let (_, body) = dci.get("/tasks?node=n2").await;
    assert_eq!(ids(&body), hexes(&[f.failed3, f.discarded]));
    let (_, body) = dci.get("/tasks?node=n1&status=failed").await;
    assert_eq!(ids(&body), hexes(&[f.failed_old, f.other_failed]));

    // params.<path> within a queue: refused unbounded with what to add, run when bounded.
    let (status, body) = dci.get("/tasks?queue=words&params.text=a%20b").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["hint"], HINT, "{body}");
    assert_eq!(
        body["error"], "non-indexed params given",
        "Disbatch's field stays: {body}"
    );
    let (status, body) = dci
        .get("/tasks?queue=words&params.text=a%20b&limit=10")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(ids(&body), hexes(&[f.failed_old, f.discarded]));
    let (status, body) = dci
        .get("/tasks?queue=words&params.text=a%20b&limit=1001")
        .await;
    assert_eq!(status, 400, "a limit past the bound: {body}");
    let (status, body) = dci
        .get("/tasks?queue=words&params.text=a%20b&since=2021-01-01T00:00:00Z&.count=1")
        .await;
    assert_eq!((status, body), (200, json!({"count": 1})));
    // The failures index covers failed tasks alone: an mtime equality is not served by it.
    let (status, body) = dci.get("/tasks?mtime=2026-01-03").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["hint"]
            .as_str()
            .unwrap_or("")
            .starts_with("mtime is not indexed"),
        "{body}"
    );
    let (status, body) = dci.get("/tasks?status=2&.count=1").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["hint"]
            .as_str()
            .unwrap_or("")
            .starts_with("status is not indexed: add a time range (since/until)"),
        "{body}"
    );

    // Disbatch's `.limit` (its CLI always sends one) bounds nothing, so its refusal stays for
    // its Perl CLI; ours prints the hint, not the index list.
    let (status, body) = dci
        .get("/tasks?queue=words&params.text=a%20b&.limit=10")
        .await;
    assert_eq!(status, 400, "{body}");
    let o = dci.cli(&["tasks", r#"{"queue":"words","params.text":"a b"}"#]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains(HINT), "{}", stderr(&o));
    assert!(!stderr(&o).contains("indexes"), "{}", stderr(&o));
    let o = dci.cli(&["tasks", r#"{"status":2}"#]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("status is not indexed"),
        "{}",
        stderr(&o)
    );
    // The issue's two searches, bounded as the hint says.
    let o = dci.cli(&[
        "--json",
        "tasks",
        r#"{"queue":"words","params.text":"a b","limit":20}"#,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let listed: Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(ids(&listed), hexes(&[f.failed_old, f.discarded]));
    let o = dci.cli(&["--json", "tasks", r#"{"status":2,"limit":20}"#]);
    assert!(o.status.success(), "{}", stderr(&o));
    let listed: Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(
        ids(&listed),
        hexes(&[f.failed_old, f.discarded, f.other_failed])
    );
    let o = dci.cli(&["tasks", r#"{"status":2}"#, "--count"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains(
            "status is not indexed: add a time range (since/until) so the count is bounded"
        ),
        "{}",
        stderr(&o)
    );
    let o = dci.cli(&[
        "--json",
        "tasks",
        r#"{"status":"failed","since":"2021-01-01T00:00:00Z"}"#,
        "--limit",
        "10",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let listed: Value = serde_json::from_str(&stdout(&o)).expect("json");
    assert_eq!(
        ids(&listed),
        hexes(&[f.failed3, f.discarded, f.other_failed])
    );
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn failures_view_lists_names_reasons_and_retries() {
    let db = TestDb::new("finding_failures").await;
    let config = write_config(&db, "web.json", json!({}));
    let f = fixture(&db).await;
    let dci = Dci::start(&config);

    let (status, body) = dci.get("/failures").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["limit"], 50);
    let rows = body["failures"].as_array().expect("failures");
    let order: Vec<&str> = rows.iter().filter_map(|r| r["id"].as_str()).collect();
    let newest_first = [f.other_failed, f.discarded, f.failed3, f.failed_old];
    assert_eq!(
        order,
        newest_first.iter().map(|i| i.to_hex()).collect::<Vec<_>>(),
        "newest first, succeeded and queued left out: {body}"
    );
    assert_eq!(rows[0]["queue"], "other");
    assert_eq!(rows[0]["reason"], "timed out");
    assert_eq!(rows[1]["queue"], "words");
    assert_eq!(rows[1]["discarded"], true);
    assert_eq!(
        rows[1]["reason"], "out of attempts (3 of 3)",
        "the last attempt's"
    );
    assert_eq!(rows[1]["last_attempt_end"], "2026-01-03T00:00:00");
    assert_eq!(rows[2]["status"], 3);
    assert_eq!(rows[2]["discarded"], false);
    assert_eq!(rows[3]["reason"], Value::Null, "no attempt recorded");

    let (_, body) = dci.get("/failures?queue=words&limit=2").await;
    let order: Vec<&str> = body["failures"]
        .as_array()
        .expect("failures")
        .iter()
        .filter_map(|r| r["id"].as_str())
        .collect();
    assert_eq!(order, [f.discarded.to_hex(), f.failed3.to_hex()]);
    for bad in [
        "/failures?limit=0",
        "/failures?limit=1001",
        "/failures?limit=x",
    ] {
        let (status, body) = dci.get(bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            body["error"].as_str().unwrap_or("").contains("1 to 1000"),
            "{body}"
        );
    }
    let (status, body) = dci.get("/failures?queue=nosuch").await;
    assert_eq!(status, 404, "{body}");

    // The CLI's table: names, discarded, reasons.
    let o = dci.cli(&["failures"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(
        lines[0].starts_with("Task") && lines[0].contains("Reason"),
        "{text}"
    );
    assert!(
        lines[1].contains(&f.other_failed.to_hex()) && lines[1].contains("other"),
        "{text}"
    );
    assert!(
        lines[2].contains("words") && lines[2].contains("yes"),
        "{text}"
    );
    assert!(lines[2].contains("out of attempts (3 of 3)"), "{text}");
    assert!(lines[2].contains("2026-01-03 00:00:00"), "{text}");
    let o = dci.cli(&["failures", "--queue", "words", "--limit", "1"]);
    assert_eq!(stdout(&o).lines().count(), 2, "{}", stdout(&o));
    let o = dci.cli(&["failures", "--limit", "0"]);
    assert!(!o.status.success());

    // Retry from the view: those listed are requeued, the others stay.
    let o = dci.cli(&["failures", "--queue", "words", "--limit", "2", "--retry"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).ends_with("Requeued 2 tasks\n"), "{}", stdout(&o));
    for id in [f.discarded, f.failed3] {
        assert_eq!(db.task(id).await.get_i32("status").ok(), Some(-2), "{id}");
    }
    assert_eq!(db.task(f.failed_old).await.get_i32("status").ok(), Some(2));
    assert!(
        !db.task(f.discarded).await.contains_key("discarded_at"),
        "a discarded task retried by hand is no longer given up on"
    );
    let (_, body) = dci.get("/failures").await;
    assert_eq!(body["failures"].as_array().map(Vec::len), Some(2), "{body}");

    // Discard from the view: marked, listed and counted as discarded, status kept.
    let (_, before) = dci.get("/queues/words").await;
    let o = dci.cli(&["discard", &f.failed_old.to_hex()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!("Discarded task {}\n", f.failed_old.to_hex())
    );
    let t = db.task(f.failed_old).await;
    assert_eq!(t.get_i32("status").ok(), Some(2));
    assert!(t.get_datetime("discarded_at").is_ok(), "{t}");
    let o = dci.cli(&["discard", &f.failed_old.to_hex()]);
    assert!(stdout(&o).contains("already discarded"), "{}", stdout(&o));
    let (_, after) = dci.get("/queues/words").await;
    assert_eq!(
        after["discarded"].as_u64(),
        before["discarded"].as_u64().map(|n| n + 1),
        "{before} then {after}"
    );
    let (_, body) = dci.get("/tasks?status=discarded&queue=words").await;
    let ids: Vec<&str> = body
        .as_array()
        .map(|a| a.iter().filter_map(|t| t["_id"]["$oid"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ids, [f.failed_old.to_hex()], "{body}");
    let (status, body) = dci
        .post(
            &format!("/tasks/{}/discard", f.succeeded.to_hex()),
            json!({}),
        )
        .await;
    assert_eq!(status, 409, "only a failed task is discarded: {body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap_or_default()
            .contains("cannot be discarded"),
        "{body}"
    );
    let (status, _) = dci
        .post(
            &format!("/tasks/{}/discard", ObjectId::new().to_hex()),
            json!({}),
        )
        .await;
    assert_eq!(status, 404);
    let o = dci.cli(&["failures", "--queue", "other", "--discard"]);
    assert!(stdout(&o).ends_with("Discarded 1 task\n"), "{}", stdout(&o));
    assert!(db
        .task(f.other_failed)
        .await
        .get_datetime("discarded_at")
        .is_ok());
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn failed_means_every_status_from_2_in_links_and_queue_retry() {
    let db = TestDb::new("finding_failed_set").await;
    let config = write_config(&db, "web.json", json!({}));
    let q = db.insert_queue("mixed", "echo", 0).await;
    let t = db
        .insert_tasks(q, (0..5).map(|i| doc! {"i": i}.into()).collect())
        .await;
    let now = DateTime::now();
    for (id, status) in t.iter().zip([2, 3, -6, 1]) {
        db.set_task(*id, ended(status, "n1", now, false)).await;
    }
    let dci = Dci::start(&config);

    // What the console's "failed" count links to.
    let (_, body) = dci.get("/tasks?queue=mixed&status=failed").await;
    assert_eq!(ids(&body), hexes(&t[..2]));
    // `retry --queue` with no codes: every failed status and orphaned; succeeded stays.
    let o = dci.cli(&["retry", "--queue", "mixed"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "Requeued 3 tasks in queue mixed\n");
    let statuses = |db: &TestDb| {
        let ids = t.clone();
        let coll = db.tasks();
        async move {
            let mut out = Vec::new();
            for id in ids {
                let d = coll
                    .find_one(doc! {"_id": id})
                    .await
                    .ok()
                    .flatten()
                    .unwrap_or_default();
                out.push(d.get_i32("status").unwrap_or(i32::MIN));
            }
            out
        }
    };
    assert_eq!(statuses(&db).await, [-2, -2, -2, 1, -2]);
    // Explicit codes are taken as given (Disbatch's way).
    db.set_task(t[0], ended(3, "n1", now, false)).await;
    db.set_task(t[1], ended(2, "n1", now, false)).await;
    let (status, body) = dci
        .post("/queues/mixed/retry", json!({"status": [2]}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(statuses(&db).await, [3, -2, -2, 1, -2]);
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn a_long_history_still_answers_failures_and_searches() {
    let db = TestDb::new("finding_long").await;
    let config = write_config(&db, "web.json", json!({}));
    let q = db.insert_queue("history", "echo", 0).await;
    let base = date("2026-01-01T00:00:00Z").timestamp_millis();
    // 100 000 ended tasks, every 1000th failed 3, straight into the collection.
    let total: i64 = 100_000;
    let mut batch = Vec::new();
    for i in 0..total {
        let failed = i % 1000 == 999;
        batch.push(doc! {
            "_id": ObjectId::new(), "queue": q, "status": if failed { 3 } else { 1 },
            "node": "n1", "params": {"i": i}, "ctime": DateTime::from_millis(base + i),
            "mtime": DateTime::from_millis(base + i * 1000), "complete": true,
            "stdout": Bson::Null, "stderr": Bson::Null,
        });
        if batch.len() == 10_000 {
            db.tasks()
                .insert_many(std::mem::take(&mut batch))
                .await
                .expect("insert history");
        }
    }
    let dci = Dci::start(&config);
    wait_for("the history's tasks", Duration::from_secs(120), || async {
        db.count(doc! {"queue": q}).await == total as u64
    })
    .await;

    let (status, body) = dci.get("/failures?limit=3").await;
    assert_eq!(status, 200, "{body}");
    let shown: Vec<Value> = body["failures"]
        .as_array()
        .expect("failures")
        .iter()
        .map(|r| r["params"]["i"].clone())
        .collect();
    assert_eq!(
        shown,
        [json!(99_999), json!(98_999), json!(97_999)],
        "{body}"
    );
    let (_, body) = dci.get("/failures?limit=1000").await;
    assert_eq!(body["failures"].as_array().map(Vec::len), Some(100));

    let (_, body) = dci.get("/tasks?status=failed&.count=1").await;
    assert_eq!(body, json!({"count": 100}));
    let (status, body) = dci.get("/tasks?queue=history&params.i=54321&limit=5").await;
    assert_eq!(status, 200, "{body}");
    let found: Vec<i64> = body
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|t| t["params"]["i"].as_i64())
        .collect();
    assert_eq!(found, [54_321]);
    let (status, body) = dci.get("/tasks?queue=history&params.i=54321").await;
    assert_eq!(status, 400, "unbounded over 100 000 tasks: {body}");
    // The newest tasks of the fleet, through the _id index backwards.
    let (status, body) = dci.get("/tasks?.newest=1&.limit=3").await;
    assert_eq!(status, 200, "{body}");
    let newest: Vec<i64> = body
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|t| t["params"]["i"].as_i64())
        .collect();
    assert_eq!(newest, [99_999, 99_998, 99_997], "{body}");
    for refused in [
        "/tasks?.newest=1&.limit=3&queue=history",
        "/tasks?.newest=1&.limit=3&status=failed",
        "/tasks?.newest=1&.limit=3&since=0",
    ] {
        let (status, body) = dci.get(refused).await;
        assert_eq!(status, 400, "{refused}: {body}");
        assert!(
            body["error"]
                .as_str()
                .unwrap_or_default()
                .contains(".newest"),
            "{refused}: {body}"
        );
    }
    // The last hour of the history (mtime), failures only.
    let since = (base + (total - 3600) * 1000) / 1000;
    let (status, body) = dci
        .get(&format!("/tasks?status=failed&since={since}&.count=1"))
        .await;
    assert_eq!((status, body), (200, json!({"count": 4})));
    drop(dci);
    db.drop().await;
}

/// `disbatch tasks`' flags: each a key of the filter, a span back from now read on the
/// fleet's clock, a param search bounded by --bound, and a key given twice refused.
#[tokio::test]
async fn the_cli_searches_by_flags_and_spans_back_from_now() {
    let db = TestDb::new("finding_cli_flags").await;
    let config = write_config(&db, "web.json", json!({}));
    let f = fixture(&db).await;
    // One failure changed just now; every other ended in 2026-01 or before.
    db.set_task(f.failed3, doc! {"mtime": DateTime::now()})
        .await;
    let dci = Dci::start(&config);
    let json_of = |o: &std::process::Output| -> Value {
        assert!(o.status.success(), "{}", stderr(o));
        serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
    };
    let o = dci.cli(&["--json", "tasks", "--status", "failed", "--since", "1h"]);
    assert_eq!(ids(&json_of(&o)), hexes(&[f.failed3]));
    let o = dci.cli(&["--json", "tasks", "--status", "failed", "--until", "1h"]);
    assert_eq!(
        ids(&json_of(&o)),
        hexes(&[f.failed_old, f.discarded, f.other_failed])
    );
    let o = dci.cli(&[
        "--json",
        "tasks",
        "--queue",
        "words",
        "--param",
        r#"text="a b""#,
        "--bound",
        "20",
    ]);
    assert_eq!(ids(&json_of(&o)), hexes(&[f.failed_old, f.discarded]));
    let o = dci.cli(&[
        "--json", "tasks", "--queue", "words", "--status", "-2", "--node", "n9",
    ]);
    assert_eq!(ids(&json_of(&o)), Vec::<String>::new());
    let o = dci.cli(&["--json", "tasks", "--status", "discarded", "--node", "n2"]);
    assert_eq!(ids(&json_of(&o)), hexes(&[f.discarded]));
    // The table names queues, not ids.
    let o = dci.cli(&["tasks", "--status", "failed", "--since", "1h"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("words") && !stdout(&o).contains(&f.words.to_hex()),
        "{}",
        stdout(&o)
    );
    let o = dci.cli(&["tasks", r#"{"status":"failed"}"#, "--status", "2"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("'status' is given both"),
        "{}",
        stderr(&o)
    );
    let o = dci.cli(&["tasks", "--status", "failed", "--since", "yesterday"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("a span back from now"),
        "{}",
        stderr(&o)
    );
    drop(dci);
    db.drop().await;
}

#[tokio::test]
async fn console_failures_page_and_failed_link() {
    let db = TestDb::new("finding_console").await;
    let config = write_config(&db, "web.json", json!({}));
    let f = fixture(&db).await;
    let dci = Dci::start(&config);
    let b = Browser::start(1280, 900).await;

    // Before any search, the Tasks page lists the newest tasks of every queue, params shown.
    b.open(&format!("{}/#/tasks", dci.url), "tasks").await;
    let task_row = |id: ObjectId| format!("#tasks-table tr[data-task=\"{}\"]", id.to_hex());
    let text = b
        .wait_text(&task_row(f.other_failed), "the newest task", |t| {
            !t.is_empty()
        })
        .await;
    assert!(
        text.contains("other") && text.contains(r#"{"text":"z"}"#),
        "{text}"
    );
    let text = b
        .find(&task_row(f.queued))
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(
        text.contains("words") && text.contains(r#"{"text":"e"}"#),
        "{text}"
    );
    let count = b.find("#task-count").await.text().await.unwrap_or_default();
    assert_eq!(count, "the newest 6 tasks of every queue");
    b.screenshot("console-tasks-newest").await;

    b.open(&format!("{}/#/failures", dci.url), "failures").await;
    let row = |id: ObjectId| format!("#failures-table tr[data-task=\"{}\"]", id.to_hex());
    let text = b
        .wait_text(&row(f.discarded), "discarded row", |t| {
            t.contains("discarded")
        })
        .await;
    assert!(text.contains("words"), "queue name: {text}");
    assert!(text.contains("out of attempts (3 of 3)"), "reason: {text}");
    let text = b
        .wait_text(&row(f.other_failed), "other row", |t| {
            t.contains("timed out")
        })
        .await;
    assert!(text.contains("other"), "{text}");
    assert!(
        b.client
            .find(fantoccini::Locator::Css(&row(f.succeeded)))
            .await
            .is_err(),
        "a succeeded task is no failure"
    );
    b.screenshot("console-failures").await;
    b.find(&format!("{} button.retry", row(f.failed3)))
        .await
        .click()
        .await
        .expect("retry");
    wait_for(
        "the retried task queued",
        Duration::from_secs(20),
        || async { db.task(f.failed3).await.get_i32("status").ok() == Some(-2) },
    )
    .await;
    b.wait_text("#failures-msg", "retry message", |t| {
        t.contains("queued for retry")
    })
    .await;
    // Discard: the row says so and loses its button; the task keeps its status.
    b.find(&format!("{} button.discard", row(f.other_failed)))
        .await
        .click()
        .await
        .expect("discard");
    b.wait_text(
        &format!("{} td.discarded", row(f.other_failed)),
        "discarded mark",
        |t| t == "discarded",
    )
    .await;
    let t = db.task(f.other_failed).await;
    assert!(
        t.get_datetime("discarded_at").is_ok() && t.get_i32("status").ok() == Some(2),
        "{t}"
    );
    assert!(
        b.client
            .find(fantoccini::Locator::Css(&format!(
                "{} button.discard",
                row(f.discarded)
            )))
            .await
            .is_err(),
        "a discarded task has no Discard button"
    );

    // One task of words waits out a retry's backoff (it ran once; due in an hour).
    let waiting = db
        .insert_tasks(f.words, vec![doc! {"text": "w"}.into()])
        .await[0];
    let in_an_hour = DateTime::from_millis(DateTime::now().timestamp_millis() + 3_600_000);
    db.set_task(
        waiting,
        doc! {"attempt": ObjectId::new(), "attempts": 1, "not_before": in_an_hour},
    )
    .await;

    // The queues page counts the discarded (of the failed) and retrying (of the queued)
    // tasks, each linked to its list.
    b.open(&format!("{}/#/queues", dci.url), "queues").await;
    for (column, n) in [("discarded", "1"), ("retrying", "1")] {
        let cell = format!("tr[data-queue=\"words\"] td.{column}");
        b.wait_text(&cell, column, |t| t == n).await;
        let href = b
            .find(&format!("{cell} a"))
            .await
            .attr("href")
            .await
            .ok()
            .flatten()
            .unwrap_or_default();
        assert!(href.contains(&format!("status={column}")), "{href}");
    }
    b.wait_text(
        "tr[data-queue=\"other\"] td.discarded",
        "other's discard",
        |t| t == "1",
    )
    .await;
    b.screenshot("console-queues-retry-counts").await;
    b.find("tr[data-queue=\"words\"] td.retrying a")
        .await
        .click()
        .await
        .expect("follow retrying");
    b.wait_loaded("tasks").await;
    b.wait_text(
        &format!("#tasks-table tr[data-task=\"{}\"]", waiting.to_hex()),
        "the retrying task listed",
        |t| !t.is_empty(),
    )
    .await;
    let count = b
        .wait_text("#task-count", "one retrying task", |t| t == "1 task")
        .await;
    assert_eq!(count, "1 task");

    // The queues page's failed count links to every failed status.
    b.open(&format!("{}/#/queues", dci.url), "queues").await;
    let link = b.find("tr[data-queue=\"words\"] td.failed a").await;
    let href = link.attr("href").await.ok().flatten().unwrap_or_default();
    assert!(href.contains("status=failed"), "{href}");
    link.click().await.expect("follow");
    b.wait_loaded("tasks").await;
    let _ = f.words;
    for id in [f.failed_old, f.discarded] {
        b.wait_text(
            &format!("#tasks-table tr[data-task=\"{}\"]", id.to_hex()),
            "a failed task listed",
            |t| !t.is_empty(),
        )
        .await;
    }
    b.close().await;
    drop(dci);
    db.drop().await;
}
