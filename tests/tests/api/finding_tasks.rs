//! Finding tasks (issue 51 item 4): `GET /tasks`' status words, time range, node and params
//! filters with the bounded-scan refusal, through the API and CLI, over a long history too (the
//! failures view and "failed" as every status ≥ 2: `finding_failures.rs`).

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_tests::{wait_for, write_config, Dci, TestDb};
use serde_json::{json, Value};

const HINT: &str =
    "params.text is not indexed: add a time range (since/until) or a limit of at most 1000 so the scan is bounded";

pub(super) fn ids(v: &Value) -> Vec<String> {
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

pub(super) fn hexes(ids: &[ObjectId]) -> Vec<String> {
    let mut out: Vec<String> = ids.iter().map(|id| id.to_hex()).collect();
    out.sort();
    out
}

fn date(text: &str) -> DateTime {
    DateTime::parse_rfc3339_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// An ended task's fields: status, node, when it last changed, optionally discarded.
pub(super) fn ended(status: i32, node: &str, mtime: DateTime, discarded: bool) -> Document {
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

pub(super) fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub(super) fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Queue `words`: "a b" failed 2 (old, node n1), "c" failed 3 (the plugin's own code, n2),
/// "a b" discarded (n2), "d" succeeded (n1), "e" queued. Queue `other`: one failed 2.
pub(super) struct Fixture {
    pub(super) words: ObjectId,
    pub(super) failed_old: ObjectId,
    pub(super) failed3: ObjectId,
    pub(super) discarded: ObjectId,
    pub(super) succeeded: ObjectId,
    pub(super) queued: ObjectId,
    pub(super) other_failed: ObjectId,
}

pub(super) async fn fixture(db: &TestDb) -> Fixture {
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

    check_status_words_across_queues_or_in_one(&dci, &f, &failed_words).await;

    check_time_ranges_and_the_node(&dci, &f).await;

    check_params_are_refused_unbounded_and_run_bounded(&dci, &f).await;

    check_the_cli_prints_the_hint_and_runs_bounded_searches(&dci, &f).await;
    drop(dci);
    db.drop().await;
}

async fn check_status_words_across_queues_or_in_one(
    dci: &Dci,
    f: &Fixture,
    failed_words: &[ObjectId],
) {
    // "failed" is every status ≥ 2, the plugin's 3 too, across queues or in one.
    let (status, body) = dci.get("/tasks?status=failed").await;
    assert_eq!(status, 200, "{body}");
    let mut all_failed = failed_words.to_vec();
    all_failed.push(f.other_failed);
    assert_eq!(ids(&body), hexes(&all_failed));
    let (_, body) = dci.get("/tasks?queue=words&status=failed").await;
    assert_eq!(ids(&body), hexes(failed_words));
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
}

async fn check_time_ranges_and_the_node(dci: &Dci, f: &Fixture) {
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
}

async fn check_params_are_refused_unbounded_and_run_bounded(dci: &Dci, f: &Fixture) {
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
}

async fn check_the_cli_prints_the_hint_and_runs_bounded_searches(dci: &Dci, f: &Fixture) {
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
