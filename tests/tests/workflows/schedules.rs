//! Cron schedules on queues: the API refuses bad ones, and scheduled queues show their next tick
//! (the ticks the maintenance leader enqueues: `schedule_ticks.rs`).

use bson::oid::ObjectId;
use bson::{doc, DateTime, Document};
use disbatch_tests::{write_config, Browser, Dci, TestDb};
use futures::TryStreamExt;
use serde_json::{json, Value};

pub(super) async fn queue_named(db: &TestDb, name: &str) -> Option<Document> {
    db.db
        .collection::<Document>("queues")
        .find_one(doc! {"name": name})
        .await
        .expect("read queue")
}

async fn queue_by_id(db: &TestDb, id: ObjectId) -> Document {
    db.db
        .collection::<Document>("queues")
        .find_one(doc! {"_id": id})
        .await
        .expect("read queue")
        .expect("the queue")
}

/// The queue's settled tick, in ms (`schedule_last`), once its schedule has started.
pub(super) async fn settled(db: &TestDb, id: ObjectId) -> Option<i64> {
    let q = queue_by_id(db, id).await;
    q.get_datetime("schedule_last")
        .ok()
        .map(|d| d.timestamp_millis())
}

/// The queue's scheduled tasks as (tick ms, `schedule_missed_ticks`), by tick.
pub(super) async fn scheduled(db: &TestDb, queue: ObjectId) -> Vec<(i64, Option<i64>)> {
    let mut out: Vec<(i64, Option<i64>)> = db
        .tasks()
        .find(doc! {"queue": queue, "schedule_tick": {"$exists": true}})
        .await
        .expect("find tasks")
        .try_collect::<Vec<Document>>()
        .await
        .expect("read tasks")
        .iter()
        .map(|t| {
            let tick = t.get_datetime("schedule_tick").expect("a date");
            (
                tick.timestamp_millis(),
                t.get_i64("schedule_missed_ticks").ok(),
            )
        })
        .collect();
    out.sort();
    out
}

pub(super) fn now_ms() -> i64 {
    DateTime::now().timestamp_millis()
}

fn error_text(body: &Value) -> String {
    body["error"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn bad_schedules_are_refused_with_400_and_nothing_is_stored() {
    let db = TestDb::new("schedules_api").await;
    let config = write_config(&db, "web.json", json!({}));
    let dci = Dci::start(&config);
    let base = json!({"name": "cron", "plugin": "echo", "threads": 1});
    let with = |extra: Value| {
        let mut body = base.clone();
        if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
            b.extend(extra);
        }
        body
    };
    for (extra, needle) in [
        (json!({"schedule": "every minute"}), "schedule"),
        (json!({"schedule": "61 * * * *"}), "schedule"),
        (json!({"schedule": "0 0 30 2 *"}), "never fires"),
        (json!({"schedule": 5}), "schedule must be a string"),
        (
            json!({"schedule": "* * * * *", "schedule_tz": "Mars/Olympus_Mons"}),
            "schedule_tz",
        ),
        (
            json!({"schedule": "* * * * *", "schedule_missed": "twice"}),
            "schedule_missed",
        ),
        (
            json!({"schedule": "* * * * *", "schedule_params": [1]}),
            "schedule_params",
        ),
    ] {
        let (status, body) = dci.post("/queues", with(extra.clone())).await;
        assert_eq!(status, 400, "{extra}: {body}");
        assert!(error_text(&body).contains(needle), "{extra}: {body}");
        assert!(queue_named(&db, "cron").await.is_none(), "{extra} stored");
    }

    let (status, body) = dci
        .post(
            "/queues",
            with(
                json!({"schedule": "*/5 * * * *", "schedule_tz": "America/New_York",
                        "schedule_params": {"report": "hourly"}, "schedule_missed": "once"}),
            ),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let stored = queue_named(&db, "cron").await.expect("created");
    assert_eq!(stored.get_str("schedule").ok(), Some("*/5 * * * *"));
    assert_eq!(stored.get_str("schedule_tz").ok(), Some("America/New_York"));
    assert_eq!(stored.get_str("schedule_missed").ok(), Some("once"));
    assert_eq!(
        stored.get_document("schedule_params").ok(),
        Some(&doc! {"report": "hourly"})
    );
    let (_, row) = dci.get("/queues/cron").await;
    assert_eq!(row["schedule"], "*/5 * * * *", "{row}");
    assert_eq!(row["schedule_params"], json!({"report": "hourly"}), "{row}");

    for (update, needle) in [
        (json!({"schedule": "* * *"}), "schedule"),
        (json!({"schedule_tz": "Nowhere"}), "schedule_tz"),
        (json!({"schedule_missed": 1}), "schedule_missed"),
        (json!({"schedule_params": "soon"}), "schedule_params"),
    ] {
        let (status, body) = dci.post("/queues/cron", update.clone()).await;
        assert_eq!(status, 400, "{update}: {body}");
        assert!(error_text(&body).contains(needle), "{update}: {body}");
    }
    assert_eq!(
        queue_named(&db, "cron").await.expect("kept"),
        stored,
        "refused updates change nothing"
    );

    check_removing_the_schedule_removes_the_leaders_record(&db, &dci, &stored).await;

    check_work_spec_schedules_are_checked_and_removed_on_reload(&db, &dci).await;
    drop(dci);
    db.drop().await;
}

async fn check_removing_the_schedule_removes_the_leaders_record(
    db: &TestDb,
    dci: &Dci,
    stored: &Document,
) {
    // Removing the schedule removes the leader's record of it too: set again, it starts anew.
    let id = stored.get_object_id("_id").expect("id");
    db.set_queue(
        id,
        doc! {"schedule_last": DateTime::now(), "schedule_basis": "x"},
    )
    .await;
    let (status, body) = dci.post("/queues/cron", json!({"schedule": null})).await;
    assert_eq!(status, 200, "{body}");
    let q = queue_by_id(db, id).await;
    for gone in ["schedule", "schedule_last", "schedule_basis"] {
        assert!(!q.contains_key(gone), "{gone} left in {q}");
    }
    assert_eq!(
        q.get_str("schedule_tz").ok(),
        Some("America/New_York"),
        "only what was sent is removed"
    );
}

async fn check_work_spec_schedules_are_checked_and_removed_on_reload(db: &TestDb, dci: &Dci) {
    // Work specs: checked before anything is written; a reload without it removes it.
    let (status, body) = dci
        .post(
            "/specs",
            json!({"specs": [{"name": "ok", "plugin": "echo", "schedule": "@hourly"},
                             {"name": "bad", "plugin": "echo", "schedule": "0 0 30 2 *"}]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        error_text(&body).starts_with("specs[1]: schedule"),
        "{body}"
    );
    assert!(queue_named(db, "ok").await.is_none() && queue_named(db, "bad").await.is_none());
    let spec = json!({"name": "ok", "plugin": "echo", "schedule": "@hourly", "schedule_tz": "Europe/Paris"});
    let (status, body) = dci.post("/specs", json!({"specs": [spec]})).await;
    assert_eq!(status, 200, "{body}");
    let q = queue_named(db, "ok").await.expect("loaded");
    assert_eq!(q.get_str("schedule").ok(), Some("@hourly"));
    assert_eq!(q.get_str("schedule_tz").ok(), Some("Europe/Paris"));
    let (status, body) = dci
        .post(
            "/specs",
            json!({"specs": [{"name": "ok", "plugin": "echo"}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let q = queue_named(db, "ok").await.expect("reloaded");
    assert!(
        !q.contains_key("schedule") && !q.contains_key("schedule_tz"),
        "{q}"
    );
}

/// The line of `queues` output naming queue `name` (its third column).
fn cli_line<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().nth(2) == Some(name))
        .unwrap_or_else(|| panic!("no line for {name} in\n{out}"))
}

#[tokio::test]
async fn scheduled_queues_are_marked_with_their_next_tick_in_utc_and_their_zone() {
    let db = TestDb::new("schedules_shown").await;
    let config = write_config(&db, "web.json", json!({}));
    let dci = Dci::start(&config);
    let (status, body) = dci
        .post(
            "/queues",
            json!({"name": "plain", "plugin": "echo", "threads": 1}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // A fleet without schedules keeps Disbatch's table.
    let o = dci.cli(&["queues"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success() && !out.contains("Next tick"), "{out}");

    // Asia/Kolkata has no DST: 09:00 there is 03:30 UTC on every day.
    let cron = json!({"name": "daily", "plugin": "echo", "threads": 1,
                      "schedule": "0 9 * * *", "schedule_tz": "Asia/Kolkata"});
    let (status, body) = dci.post("/queues", cron).await;
    assert_eq!(status, 200, "{body}");
    let paused =
        json!({"name": "quarter", "plugin": "echo", "threads": 0, "schedule": "*/15 * * * *"});
    let (status, body) = dci.post("/queues", paused).await;
    assert_eq!(status, 200, "{body}");
    // Written by hand past the API: the leader skips it, and the list says why.
    let bad = db.insert_queue("handmade", "echo", 1).await;
    db.set_queue(bad, doc! {"schedule": "every minute"}).await;

    check_the_api_and_the_cli_show_the_next_tick(&dci).await;

    check_the_console_marks_the_scheduled_queues(&dci).await;
    drop(dci);
    db.drop().await;
}

async fn check_the_api_and_the_cli_show_the_next_tick(dci: &Dci) {
    let (status, rows) = dci.get("/queues").await;
    assert_eq!(status, 200, "{rows}");
    let row = |name: &str| {
        rows.as_array()
            .and_then(|a| a.iter().find(|r| r["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no row {name} in {rows}"))
    };
    let daily = row("daily");
    assert_eq!(daily["scheduled"], true, "{daily}");
    let next = &daily["schedule_next"];
    let utc = next["utc"].as_str().unwrap_or_default();
    let local = next["local"].as_str().unwrap_or_default();
    assert!(utc.ends_with("T03:30:00Z"), "{daily}");
    assert!(local.ends_with("T09:00:00+05:30"), "{daily}");
    assert_eq!(next["zone"], "Asia/Kolkata", "{daily}");
    // The next tick, not a past one: within the coming day.
    let tick = DateTime::parse_rfc3339_str(utc).expect("an RFC 3339 date");
    let ahead = tick.timestamp_millis() - now_ms();
    assert!(
        ahead > 0 && ahead <= 86_400_000 + 60_000,
        "{utc} is {ahead} ms ahead"
    );
    let quarter = row("quarter");
    let q_utc = quarter["schedule_next"]["utc"].as_str().unwrap_or_default();
    assert!(
        [":00:00Z", ":15:00Z", ":30:00Z", ":45:00Z"]
            .iter()
            .any(|m| q_utc.ends_with(m)),
        "{quarter}"
    );
    assert_eq!(quarter["schedule_next"]["zone"], "UTC", "{quarter}");
    let plain = row("plain");
    for absent in ["scheduled", "schedule_next", "schedule_error"] {
        assert!(plain.get(absent).is_none(), "{absent} on {plain}");
    }
    let handmade = row("handmade");
    assert_eq!(handmade["scheduled"], true, "{handmade}");
    assert!(
        handmade["schedule_error"]
            .as_str()
            .unwrap_or_default()
            .contains("schedule"),
        "{handmade}"
    );
    assert!(handmade.get("schedule_next").is_none(), "{handmade}");
    let (_, one) = dci.get("/queues/daily").await;
    assert_eq!(one["schedule_next"], daily["schedule_next"], "{one}");

    let o = dci.cli(&["queues"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{out}");
    assert!(
        out.lines().next().unwrap_or_default().contains("Next tick"),
        "{out}"
    );
    let line = cli_line(&out, "daily");
    assert!(
        line.contains(&format!("{utc} ({local} Asia/Kolkata)")) && !line.contains("paused"),
        "{line}"
    );
    assert!(cli_line(&out, "quarter")
        .trim_end()
        .ends_with(&format!("{q_utc} [paused: ticks pass]")));
    assert!(
        cli_line(&out, "handmade").contains("invalid: schedule"),
        "{out}"
    );
    assert!(!cli_line(&out, "plain").contains('Z'), "{out}");
}

async fn check_the_console_marks_the_scheduled_queues(dci: &Dci) {
    let b = Browser::start(1280, 900).await;
    b.open(&format!("{}/#/queues", dci.url), "queues").await;
    let shown = b
        .wait_text(
            "tr[data-queue=\"daily\"] .schedule-next",
            "daily's next tick",
            |t| !t.is_empty(),
        )
        .await;
    assert!(
        shown.contains("03:30:00 UTC") && shown.contains("09:00:00 Asia/Kolkata"),
        "{shown}"
    );
    let shown = b
        .find("tr[data-queue=\"quarter\"] .schedule-next")
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(
        shown.contains(" UTC") && shown.contains("paused"),
        "{shown}"
    );
    let shown = b
        .find("tr[data-queue=\"handmade\"] .schedule-next")
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(shown.contains("schedule not run"), "{shown}");
    assert!(
        b.client
            .find(fantoccini::Locator::Css(
                "tr[data-queue=\"plain\"] .schedule-next"
            ))
            .await
            .is_err(),
        "an unscheduled queue is not marked"
    );
    b.screenshot("queues-scheduled").await;
    b.close().await;
}
