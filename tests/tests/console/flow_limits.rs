//! Flow limits in the console (headless Chromium): the Queues page shows a limited queue's
//! limits, budget and held counts, sets limits (a bad one refused with its field named), and a
//! held task's page says why it waits and until when.

use bson::{doc, Bson, DateTime, Document};
use disbatch_tests::{write_config, Browser, Dci, TestDb};
use serde_json::json;

#[tokio::test]
async fn the_console_shows_and_sets_limits_and_why_a_task_waits() {
    let db = TestDb::new("ui_flow_limits").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let now = DateTime::now().timestamp_millis();
    let rated = db.insert_queue("rated", "echo", 2).await;
    db.set_queue(rated, doc! {"rate_limit": {"starts": 2, "per_s": 60}})
        .await;
    db.insert_rate_window(rated, Bson::Null, vec![(now - 5_000, 2)], now + 55_000)
        .await;
    let ids = db.insert_tasks(rated, vec![doc! {}.into()]).await;
    db.insert_queue("plain", "echo", 2).await;

    let b = Browser::start(1280, 900).await;
    b.open(&format!("{}/#/queues", dci.url), "queues").await;
    let block = b
        .wait_text(
            "#queue-limits-list [data-queue=\"rated\"]",
            "the rated queue's limits",
            |t| t.contains("2 used, 0 left"),
        )
        .await;
    assert!(block.contains("2 starts per 60 s"), "{block}");
    assert!(
        block.contains("rate_limit 1, partition_limit 0"),
        "held counts: {block}"
    );

    // A bad limit is refused with its field named; a good one is saved.
    b.select_option("#limits-queue", "plain").await;
    let input = b.find("#limits-concurrency").await;
    input
        .send_keys(r#"{"key": "params.a", "max": 0}"#)
        .await
        .expect("type");
    b.find("#limits-submit").await.click().await.expect("save");
    let msg = b
        .wait_text("#queue-limits-msg", "refusal", |t| !t.is_empty())
        .await;
    assert!(msg.contains("concurrency.max"), "{msg}");
    input.clear().await.expect("clear");
    input
        .send_keys(r#"{"key": "params.a", "ordered": true}"#)
        .await
        .expect("type");
    b.find("#limits-submit").await.click().await.expect("save");
    b.wait_text("#queue-limits-msg", "saved", |t| t.contains("saved"))
        .await;
    let stored = db
        .db
        .collection::<Document>("queues")
        .find_one(doc! {"name": "plain"})
        .await
        .expect("find")
        .expect("queue");
    let limits = disbatch_model::limits::parse(&stored).expect("limits");
    assert!(limits.concurrency.is_some_and(|c| c.ordered), "{stored}");
    b.wait_text(
        "#queue-limits-list [data-queue=\"plain\"]",
        "the new limit",
        |t| t.contains("per value of params.a, ordered"),
    )
    .await;
    b.screenshot("flow-limits-queues").await;

    b.open(&format!("{}/#/task/{}", dci.url, ids[0].to_hex()), "task")
        .await;
    let held = b
        .wait_text("#task-held", "held", |t| t.contains("rate_limit"))
        .await;
    assert!(held.contains("the rate limit is used up"), "{held}");
    assert!(held.contains("until"), "{held}");
    b.screenshot("flow-limits-task").await;
    b.close().await;
    drop(dci);
    db.drop().await;
}
