//! Finding failed tasks (issue 51 item 4): the failures view, what `failed` means in links and
//! retries, and the console's failures page.

use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, DateTime};
use disbatch_model::status;
use disbatch_tests::{wait_for, write_config, Browser, Dci, TestDb};
use serde_json::{json, Value};

use super::finding_tasks::{ended, fixture, hexes, ids, stderr, stdout, Fixture};

#[tokio::test]
async fn failures_view_lists_names_reasons_and_retries() {
    let db = TestDb::new("finding_failures").await;
    let config = write_config(&db, "web.json", json!({}));
    let f = fixture(&db).await;
    let dci = Dci::start(&config);

    check_the_failures_route_lists_and_validates(&dci, &f).await;

    check_the_cli_failures_table(&dci, &f).await;

    check_retry_from_the_view(&db, &dci, &f).await;

    check_discard_from_the_view(&db, &dci, &f).await;
    drop(dci);
    db.drop().await;
}

async fn check_the_failures_route_lists_and_validates(dci: &Dci, f: &Fixture) {
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
}

async fn check_the_cli_failures_table(dci: &Dci, f: &Fixture) {
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
}

async fn check_retry_from_the_view(db: &TestDb, dci: &Dci, f: &Fixture) {
    // Retry from the view: those listed are requeued, the others stay.
    let o = dci.cli(&["failures", "--queue", "words", "--limit", "2", "--retry"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).ends_with("Requeued 2 tasks\n"), "{}", stdout(&o));
    for id in [f.discarded, f.failed3] {
        assert_eq!(
            db.task(id).await.get_i32("status").ok(),
            Some(status::QUEUED),
            "{id}"
        );
    }
    assert_eq!(
        db.task(f.failed_old).await.get_i32("status").ok(),
        Some(status::FAILED)
    );
    assert!(
        !db.task(f.discarded).await.contains_key("discarded_at"),
        "a discarded task retried by hand is no longer given up on"
    );
    let (_, body) = dci.get("/failures").await;
    assert_eq!(body["failures"].as_array().map(Vec::len), Some(2), "{body}");
}

async fn check_discard_from_the_view(db: &TestDb, dci: &Dci, f: &Fixture) {
    // Discard from the view: marked, listed and counted as discarded, status kept.
    let (_, before) = dci.get("/queues/words").await;
    let o = dci.cli(&["discard", &f.failed_old.to_hex()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!("Discarded task {}\n", f.failed_old.to_hex())
    );
    let t = db.task(f.failed_old).await;
    assert_eq!(t.get_i32("status").ok(), Some(status::FAILED));
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
    assert_eq!(
        statuses(&db).await,
        [
            status::QUEUED,
            status::QUEUED,
            status::QUEUED,
            status::SUCCEEDED,
            status::QUEUED
        ]
    );
    // Explicit codes are taken as given (Disbatch's way).
    db.set_task(t[0], ended(3, "n1", now, false)).await;
    db.set_task(t[1], ended(2, "n1", now, false)).await;
    let (status, body) = dci
        .post("/queues/mixed/retry", json!({"status": [2]}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        statuses(&db).await,
        [
            3,
            status::QUEUED,
            status::QUEUED,
            status::SUCCEEDED,
            status::QUEUED
        ]
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

    check_the_tasks_page_lists_the_newest_first(&dci, &b, &f).await;

    check_the_failures_page_retries_and_discards(&db, &dci, &b, &f).await;

    check_queue_counts_link_to_the_discarded_and_retrying(&db, &dci, &b, &f).await;

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

async fn check_the_tasks_page_lists_the_newest_first(dci: &Dci, b: &Browser, f: &Fixture) {
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
}

async fn check_the_failures_page_retries_and_discards(
    db: &TestDb,
    dci: &Dci,
    b: &Browser,
    f: &Fixture,
) {
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
        || async { db.task(f.failed3).await.get_i32("status").ok() == Some(status::QUEUED) },
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
        t.get_datetime("discarded_at").is_ok() && t.get_i32("status").ok() == Some(status::FAILED),
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
}

async fn check_queue_counts_link_to_the_discarded_and_retrying(
    db: &TestDb,
    dci: &Dci,
    b: &Browser,
    f: &Fixture,
) {
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
}
