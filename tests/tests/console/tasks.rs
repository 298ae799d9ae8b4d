//! The console's task history and control in headless Chromium, with a real DEN and DCI: the
//! attempts of a task that failed and then succeeded, cancelling a running task from its
//! page, bulk retry and cancel on the queue page behind a confirmation, the confirmation
//! before a plugin change, and the count columns at phone width. Screenshots land in
//! `<target>/ui-screenshots/` (copied to docs/src/screenshots/ for the book).

use std::path::Path;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Document};
use disbatch_model::status;
use disbatch_tests::{wait_for, write_config, Browser, Dci, Den, Launch, TestDb};
use fantoccini::Locator;
use serde_json::{json, Value};

/// The outcomes the attempts table shows, in order.
async fn shown_outcomes(b: &Browser) -> Vec<String> {
    let found = b
        .client
        .execute(
            "return [...document.querySelectorAll('#task-attempts [data-outcome]')].map((e) => e.dataset.outcome)",
            vec![],
        )
        .await
        .unwrap_or(Value::Null);
    serde_json::from_value(found).unwrap_or_default()
}

async fn wait_outcomes(b: &Browser, want: &[&str]) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let shown = shown_outcomes(b).await;
        if shown == want {
            return;
        }
        if std::time::Instant::now() > deadline {
            let shot = b.screenshot("failed-attempts").await;
            panic!("attempts show {shown:?}, not {want:?}; {}", shot.display());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for the confirmation dialog, checks its question, and answers it.
async fn answer_confirm(b: &Browser, expect: &str, yes: bool, shot: Option<&str>) {
    let text = b
        .wait_text("#confirm-text", "confirmation", |t| !t.is_empty())
        .await;
    assert!(text.contains(expect), "{text:?} lacks {expect:?}");
    assert!(b
        .find("#confirm")
        .await
        .is_displayed()
        .await
        .unwrap_or(false));
    if let Some(name) = shot {
        b.screenshot(name).await;
    }
    let button = if yes { "#confirm-yes" } else { "#confirm-no" };
    b.find(button).await.click().await.expect("answer");
}

/// The requests the DCI's access log shows from byte `from` on, as (method, path).
fn requests(log: &Path, from: usize) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.get(from..)
        .unwrap_or("")
        .lines()
        .filter(|l| l.contains("disbatch_web::access"))
        .filter_map(|l| {
            let field = |name: &str| {
                l.split_whitespace()
                    .find_map(|w| w.strip_prefix(name))
                    .map(|v| v.trim_matches('"').to_string())
            };
            Some((field("method=")?, field("path=")?))
        })
        .collect()
}

fn log_len(log: &Path) -> usize {
    std::fs::metadata(log).map_or(0, |m| m.len() as usize)
}

/// Has the page send one more request, to a path of its own, and waits until the DCI has
/// answered it: whatever the page did before (a declined action's request, if it sent one)
/// was sent before it.
async fn page_request_answered(b: &Browser, log: &Path, marker: &str) {
    b.client
        .execute(
            &format!("fetch('/{marker}', {{cache: 'no-store'}}); return null"),
            vec![],
        )
        .await
        .expect("fetch from the page");
    let path = format!("/{marker}");
    wait_for(
        "the page's marker request in the access log",
        Duration::from_secs(30),
        || {
            let seen = requests(log, 0).iter().any(|(_, p)| *p == path);
            async move { seen }
        },
    )
    .await;
}

/// Requests that change something (anything but GET and HEAD).
fn writes(requests: &[(String, String)]) -> Vec<&(String, String)> {
    requests
        .iter()
        .filter(|(m, _)| m != "GET" && m != "HEAD")
        .collect()
}

async fn cell(b: &Browser, queue: &str, column: &str) -> String {
    let css = format!("tr[data-queue=\"{queue}\"] td.{column}");
    b.find(&css).await.text().await.unwrap_or_default()
}

#[tokio::test]
async fn history_cancel_and_bulk_actions_from_the_console() {
    let db = TestDb::new("ui_console").await;
    let config = write_config(&db, "node.json", json!({}));
    // Its access log shows which requests a declined confirmation did not send.
    let dci_log = db.path("dci.log");
    let dci = Dci::launch(
        &config,
        Launch {
            log_file: Some(dci_log.clone()),
            rust_log: Some("warn,disbatch_web::access=info".into()),
            ..Launch::default()
        },
    );
    // Times out on its first attempt only (the plugin sleeps only then), so a retry succeeds.
    let hist = db.insert_queue("hist", "echo", 1).await;
    db.set_queue(hist, doc! {"timeout": 1, "kill_grace": 1})
        .await;
    let flaky = db
        .insert_tasks(hist, vec![doc! {"sleep_first_ms": 20_000}.into()])
        .await[0];
    let long = db.insert_queue("long", "echo", 1).await;
    // Runs until cancelled: its gate is never opened.
    let gate = db.path("sleeper.gate").to_string_lossy().to_string();
    let sleeper = db
        .insert_tasks(long, vec![doc! {"hold_until": &gate}.into()])
        .await[0];
    let bulk = db.insert_queue("bulk", "echo", 3).await;
    let failing = db
        .insert_tasks(bulk, (0..3).map(|_| doc! {"exit_code": 1}.into()).collect())
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&[flaky], Duration::from_secs(30)).await;
    db.wait_complete(&failing, Duration::from_secs(30)).await;
    assert_eq!(
        db.task_status(flaky).await,
        Some(status::FAILED),
        "timed out"
    );

    let b = Browser::start(1280, 900).await;
    b.record_csp_violations().await;

    check_the_attempts_of_a_task_retried_after_a_timeout(&dci, &b, flaky).await;

    check_cancel_of_a_running_task_only_once_confirmed(&db, &dci, &b, &dci_log, sleeper).await;

    check_bulk_retry_of_the_failed_from_the_queues_page(&db, &dci, &b, &failing).await;

    check_cancel_all_queued_and_a_declined_plugin_change(&db, &b, &dci_log, &failing, bulk).await;

    let violations = b.csp_violations().await;
    assert_eq!(violations, Vec::<String>::new());
    // Long after both declines, anything they sent late would be in the log by now: the one
    // cancel is the confirmed one, and the queue itself was changed once, by this test.
    let all = requests(&dci_log, 0);
    let cancels = all
        .iter()
        .filter(|(m, p)| m == "POST" && *p == format!("/tasks/{}/cancel", sleeper.to_hex()))
        .count();
    assert_eq!(cancels, 1, "{all:?}");
    let queue_paths = [
        "/queues/bulk".to_string(),
        format!("/queues/{}", bulk.to_hex()),
    ];
    let queue_writes = writes(&all)
        .into_iter()
        .filter(|(_, p)| queue_paths.contains(p))
        .count();
    assert_eq!(queue_writes, 1, "{all:?}");
    drop(den);
    b.close().await;
    db.drop().await;
}

async fn check_the_attempts_of_a_task_retried_after_a_timeout(
    dci: &Dci,
    b: &Browser,
    flaky: ObjectId,
) {
    // 1. The attempts of a task that failed once and succeeded when retried.
    b.open(&format!("{}/#/task/{}", dci.url, flaky.to_hex()), "task")
        .await;
    wait_outcomes(b, &["timed_out"]).await;
    b.find("#task-retry").await.click().await.expect("retry");
    b.wait_text("#task-status", "succeeded", |t| t.contains("succeeded"))
        .await;
    wait_outcomes(b, &["timed_out", "succeeded"]).await;
    let note = b
        .wait_text("#task-attempts-note", "attempt count", |t| !t.is_empty())
        .await;
    assert_eq!(note, "2 attempts");
    let node = b
        .find("#task-attempts tbody tr:last-child td.node")
        .await
        .text()
        .await
        .unwrap_or_default();
    assert_eq!(node, "n1");
    b.screenshot("task-attempts").await;
}

async fn check_cancel_of_a_running_task_only_once_confirmed(
    db: &TestDb,
    dci: &Dci,
    b: &Browser,
    dci_log: &Path,
    sleeper: ObjectId,
) {
    // 2. Cancel a running task from its page, after confirming.
    wait_for("the sleeper to run", Duration::from_secs(20), || async {
        db.task_status(sleeper).await == Some(status::RUNNING)
    })
    .await;
    b.open(&format!("{}/#/task/{}", dci.url, sleeper.to_hex()), "task")
        .await;
    b.wait_text("#task-status", "running", |t| t.contains("running"))
        .await;
    // The run under way has no record yet: it is shown from the task.
    wait_outcomes(b, &["running"]).await;
    let before_decline = log_len(dci_log);
    b.find("#task-cancel").await.click().await.expect("cancel");
    let keep = b.find("#confirm-no").await.text().await.unwrap_or_default();
    assert_eq!(keep, "Keep running");
    answer_confirm(b, "Cancel running task", false, None).await;
    page_request_answered(b, dci_log, "after-declined-cancel").await;
    let sent = requests(dci_log, before_decline);
    assert_eq!(writes(&sent), Vec::<&(String, String)>::new(), "declined");
    assert_eq!(
        db.task_status(sleeper).await,
        Some(status::RUNNING),
        "declined: still running"
    );
    b.find("#task-cancel").await.click().await.expect("cancel");
    answer_confirm(
        b,
        "Its plugin is stopped",
        true,
        Some("task-cancel-running-confirm"),
    )
    .await;
    wait_for(
        "the running task to be cancelled",
        Duration::from_secs(20),
        || async { db.task_status(sleeper).await == Some(status::CANCELLED) },
    )
    .await;
    b.wait_text("#task-status", "cancelled", |t| t.contains("cancelled"))
        .await;
    wait_outcomes(b, &["cancelled"]).await;
    b.screenshot("task-cancelled").await;
}

async fn check_bulk_retry_of_the_failed_from_the_queues_page(
    db: &TestDb,
    dci: &Dci,
    b: &Browser,
    failing: &[ObjectId],
) {
    // 3. Bulk retry of the failed tasks on the queue page; threads 0 first so they stay queued.
    let (s, _) = dci.post("/queues/bulk", json!({"threads": 0})).await;
    assert_eq!(s, 200);
    b.open(&format!("{}/#/queues", dci.url), "queues").await;
    b.wait_text("tr[data-queue=\"bulk\"] td.failed", "failed count", |t| {
        t.trim() == "3"
    })
    .await;
    b.find("tr[data-queue=\"bulk\"] button.retry-failed")
        .await
        .click()
        .await
        .expect("retry failed");
    answer_confirm(
        b,
        "Retry the 3 failed task(s) of queue \"bulk\"",
        true,
        Some("queues-retry-confirm"),
    )
    .await;
    b.wait_text("#queues-msg", "retry message", |t| {
        t.contains("3 task(s) queued again")
    })
    .await;
    b.wait_text("tr[data-queue=\"bulk\"] td.queued", "queued again", |t| {
        t.trim() == "3"
    })
    .await;
    assert_eq!(cell(b, "bulk", "failed").await.trim(), "0");
    for id in failing {
        assert_eq!(db.task_status(*id).await, Some(status::QUEUED));
    }
    b.screenshot("queues-after-retry").await;
}

async fn check_cancel_all_queued_and_a_declined_plugin_change(
    db: &TestDb,
    b: &Browser,
    dci_log: &Path,
    failing: &[ObjectId],
    bulk: ObjectId,
) {
    // ... then cancel them all, and decline a plugin change.
    b.find("tr[data-queue=\"bulk\"] button.cancel-queued")
        .await
        .click()
        .await
        .expect("cancel queued");
    answer_confirm(b, "Cancel the 3 queued and blocked task(s)", true, None).await;
    b.wait_text(
        "tr[data-queue=\"bulk\"] td.cancelled",
        "cancelled count",
        |t| t.trim() == "3",
    )
    .await;
    for id in failing {
        assert_eq!(db.task_status(*id).await, Some(status::CANCELLED));
    }
    let plugin = b.find("tr[data-queue=\"bulk\"] select.plugin").await;
    let other = b
        .client
        .find_all(Locator::Css("tr[data-queue=\"bulk\"] select.plugin option"))
        .await
        .expect("options");
    let mut picked = false;
    for option in other {
        if option.attr("value").await.ok().flatten().as_deref() != Some("echo") {
            option.click().await.expect("pick another plugin");
            picked = true;
            break;
        }
    }
    assert!(picked, "the config lists a second plugin");
    let before_decline = log_len(dci_log);
    answer_confirm(
        b,
        "Change the plugin of queue \"bulk\" from echo",
        false,
        None,
    )
    .await;
    let shown = plugin.prop("value").await.ok().flatten();
    assert_eq!(shown.as_deref(), Some("echo"), "the select went back");
    page_request_answered(b, dci_log, "after-declined-plugin-change").await;
    let sent = requests(dci_log, before_decline);
    assert_eq!(writes(&sent), Vec::<&(String, String)>::new(), "declined");
    let stored = db
        .db
        .collection::<Document>("queues")
        .find_one(doc! {"_id": bulk})
        .await
        .expect("queue")
        .expect("exists");
    assert_eq!(stored.get_str("plugin").ok(), Some("echo"));
}

#[tokio::test]
async fn every_status_has_its_own_count_column_at_phone_width() {
    let db = TestDb::new("ui_counts_phone").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    // Hand-set statuses before the DEN counts them; threads 0: nothing here runs.
    let mixed = db.insert_queue("mixed", "echo", 0).await;
    let statuses = [-2, -2, -4, -5, -5, -5, -6, 1, 1, 1, 1, 2, 2];
    let ids = db
        .insert_tasks(mixed, statuses.iter().map(|_| doc! {}.into()).collect())
        .await;
    for (id, s) in ids.iter().zip(statuses) {
        db.set_task(*id, doc! {"status": s}).await;
    }
    let busy = db.insert_queue("busy", "echo", 1).await;
    // Runs until the test opens its gate.
    let gate = db.path("busy.gate");
    let sleeper = db
        .insert_tasks(
            busy,
            vec![doc! {"hold_until": gate.to_string_lossy().to_string()}.into()],
        )
        .await[0];
    let den = Den::start(&config, "n1");
    wait_for("the sleeper to run", Duration::from_secs(20), || async {
        db.task_status(sleeper).await == Some(status::RUNNING)
    })
    .await;

    let b = Browser::start(500, 844).await;
    b.client.goto(&format!("{}/", dci.url)).await.expect("open");
    b.emulate_phone(390, 844).await;
    b.open(&format!("{}/#/queues", dci.url), "queues").await;
    b.wait_text("tr[data-queue=\"busy\"] td.running", "running", |t| {
        t.trim() == "1"
    })
    .await;
    check_each_status_has_its_own_count_column(&dci, &b).await;
    check_the_page_fits_a_phone_and_the_name_stays_in_view(&b).await;
    std::fs::write(&gate, "").expect("open the gate");
    db.wait_complete(&[sleeper], Duration::from_secs(60)).await;
    drop(den);
    b.close().await;
    db.drop().await;
}

async fn check_each_status_has_its_own_count_column(dci: &Dci, b: &Browser) {
    let want = [
        ("queued", "2"),
        ("blocked", "1"),
        ("running", "0"),
        ("succeeded", "4"),
        ("failed", "2"),
        ("cancelled", "3"),
        ("orphaned", "1"),
        ("retrying", "0"),
        ("discarded", "0"),
    ];
    for (column, n) in want {
        assert_eq!(cell(b, "mixed", column).await.trim(), n, "{column}");
    }
    // Disbatch's own queued field still counts every status ≤ -2.
    let (_, q) = dci.get("/queues/mixed").await;
    assert_eq!(q["queued"], json!(7), "{q}");
    let heads = b
        .client
        .execute(
            "return [...document.querySelectorAll('#queues-table th')].map((t) => t.textContent.toLowerCase())",
            vec![],
        )
        .await
        .expect("headers");
    assert_eq!(
        heads,
        json!([
            "name",
            "queued",
            "retrying",
            "blocked",
            "running",
            "succeeded",
            "failed",
            "discarded",
            "cancelled",
            "orphaned",
            "plugin",
            "threads",
            "sort",
            ""
        ])
    );
}

async fn check_the_page_fits_a_phone_and_the_name_stays_in_view(b: &Browser) {
    // The page itself fits 390 px; the table scrolls sideways inside its frame.
    let fit = b
        .client
        .execute(
            "const w = document.querySelector('#queues-table').parentElement; \
             return [document.documentElement.scrollWidth, window.innerWidth, w.scrollWidth > w.clientWidth]",
            vec![],
        )
        .await
        .expect("widths");
    assert_eq!(fit[1], json!(390), "{fit}");
    assert!(
        fit[0].as_i64() <= fit[1].as_i64(),
        "the page is wider than the phone: {fit}"
    );
    assert_eq!(
        fit[2],
        json!(true),
        "the table scrolls inside its frame: {fit}"
    );
    b.screenshot("phone-queue-counts").await;
    b.client
        .execute(
            "const w = document.querySelector('#queues-table').parentElement; w.scrollLeft = 480; return null",
            vec![],
        )
        .await
        .expect("scroll");
    // The queue's name stays in view while the counts scroll.
    let name_left = b
        .client
        .execute(
            "return document.querySelector('tr[data-queue=\"mixed\"] td.name').getBoundingClientRect().left",
            vec![],
        )
        .await
        .expect("name position");
    assert!(
        name_left.as_f64().is_some_and(|x| (0.0..40.0).contains(&x)),
        "{name_left}"
    );
    b.screenshot("phone-queue-counts-scrolled").await;
}
