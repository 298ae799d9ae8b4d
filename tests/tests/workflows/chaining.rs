//! `then` chaining with a real DEN: a succeeded task's `output` becomes units of the next queue.

use std::time::Duration;

use bson::doc;
use disbatch_model::status;
use disbatch_tests::{wait_for, write_config, Den, TestDb};
use serde_json::json;

#[tokio::test]
async fn succeeded_output_chains_into_the_then_queue_in_every_form() {
    let db = TestDb::new("chain").await;
    let config = write_config(&db, "node.json", json!({}));
    let first = db.insert_queue("first", "echo", 2).await;
    // The next queue is paused so the chained units stay visible as queued.
    let next = db.insert_queue("next", "echo", 0).await;
    db.set_queue(first, doc! {"then": "next"}).await;
    let map_form = doc! {"result": {"status": 1, "output": {"m1": {"x": 1}, "m2": {}}}};
    let list_form =
        doc! {"result": {"output": ["l1", ["l2", {"y": 2}, {"priority": 7, "delay": 60}]]}};
    let failed = doc! {"exit_code": 3, "result": {"output": ["never"]}};
    // Chaining happens after this and before the check below: a delay of 60 s puts
    // `not_before` 60 s past a moment between the two, however long that stretch is.
    let before = bson::DateTime::now().timestamp_millis();
    let ids = db
        .insert_tasks(
            first,
            vec![map_form.into(), list_form.into(), failed.into()],
        )
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(30)).await;
    wait_for("chained units", Duration::from_secs(30), || async {
        db.count(doc! {"queue": next}).await == 4
    })
    .await;

    let m1 = db.unit(next, "m1").await.expect("m1");
    assert_eq!(m1.get_document("params").ok(), Some(&doc! {"x": 1}));
    assert_eq!(m1.get_i32("status").ok(), Some(status::QUEUED));
    assert!(db.unit(next, "m2").await.is_some());
    assert!(db.unit(next, "l1").await.is_some());
    let l2 = db.unit(next, "l2").await.expect("l2");
    assert_eq!(l2.get_i64("priority").ok(), Some(7));
    let not_before = l2
        .get_datetime("not_before")
        .expect("not_before")
        .timestamp_millis();
    let after = bson::DateTime::now().timestamp_millis();
    assert!(
        (before + 60_000..=after + 60_000).contains(&not_before),
        "delay 60 s gave not_before {} ms after the tasks were queued, {} ms after the check",
        not_before - before,
        not_before - after
    );
    assert!(
        db.unit(next, "never").await.is_none(),
        "a failed task chains nothing"
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn chaining_updates_existing_units_and_tolerates_a_missing_then_queue() {
    let db = TestDb::new("chain_update").await;
    let config = write_config(&db, "node.json", json!({}));
    let first = db.insert_queue("first", "echo", 1).await;
    let next = db.insert_queue("next", "echo", 0).await;
    let orphan = db.insert_queue("orphan", "echo", 1).await;
    db.set_queue(first, doc! {"then": "next"}).await;
    db.set_queue(orphan, doc! {"then": "no-such-queue"}).await;
    // An existing finished unit with the same key is re-run with the new params.
    db.tasks()
        .insert_one(
            doc! {"queue": next, "key": "k", "status": 1, "params": {"old": true}, "node": "n0"},
        )
        .await
        .expect("existing unit");
    let a = db
        .insert_tasks(
            first,
            vec![doc! {"result": {"output": {"k": {"new": true}}}}.into()],
        )
        .await;
    let b = db
        .insert_tasks(orphan, vec![doc! {"result": {"output": ["x"]}}.into()])
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&[a[0], b[0]], Duration::from_secs(30))
        .await;
    wait_for(
        "the unit to be requeued",
        Duration::from_secs(30),
        || async {
            db.unit(next, "k")
                .await
                .and_then(|u| u.get_i32("status").ok())
                == Some(status::QUEUED)
        },
    )
    .await;
    let k = db.unit(next, "k").await.expect("k");
    assert_eq!(k.get_document("params").ok(), Some(&doc! {"new": true}));
    assert_eq!(
        db.task(b[0]).await.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "a missing then queue never fails the task"
    );
    // The runner chains after its result is stored: the line may come a moment later.
    wait_for(
        "the missing-queue warning",
        Duration::from_secs(30),
        || async {
            den.log_text()
                .contains("does not exist; output not chained")
        },
    )
    .await;
    drop(den);
    db.drop().await;
}
