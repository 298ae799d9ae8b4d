//! Attempts and retries with a real DEN: one record per run, retry with delay, max_retries.

use std::time::Duration;

use bson::doc;
use disbatch_model::status;
use disbatch_tests::{read_lines, write_config, Den, TestDb};
use futures::StreamExt;
use serde_json::json;

#[tokio::test]
async fn every_run_leaves_an_attempt_record() {
    let db = TestDb::new("attempts").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("q", "echo", 1).await;
    let id = db
        .insert_tasks(queue, vec![doc! {"exit_code": 0}.into()])
        .await[0];
    let den = Den::start(&config, "n1");
    db.wait_complete(&[id], Duration::from_secs(30)).await;
    let task = db.task(id).await;
    assert_eq!(task.get_i32("attempts").ok(), Some(1), "{task}");
    let records = db.closed_attempts(id, 1).await;
    assert_eq!(records.len(), 1);
    let a = &records[0];
    assert_eq!(
        task.get_object_id("attempt").ok(),
        a.get_object_id("_id").ok(),
        "the task names its attempt"
    );
    assert_eq!(a.get_str("outcome").ok(), Some("succeeded"), "{a}");
    assert_eq!(a.get_str("node").ok(), Some("n1"));
    assert_eq!(a.get_i32("exit_code").ok(), Some(0));
    assert_eq!(a.get_i32("status").ok(), Some(status::SUCCEEDED));
    assert!(a.get_i64("pid").is_ok_and(|p| p > 0));
    assert!(a.get_datetime("end").ok() >= a.get_datetime("start").ok());
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_result_can_ask_for_retries_until_max_retries_fails_the_task() {
    let db = TestDb::new("retries").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("q", "echo", 1).await;
    db.set_queue(queue, doc! {"max_retries": 3}).await;
    let runs = db.path("runs.txt");
    let id = db
        .insert_tasks(
            queue,
            vec![
                doc! {"append_to": runs.to_string_lossy().to_string(), "result": {"retry": true}}
                    .into(),
            ],
        )
        .await[0];
    let den = Den::start(&config, "n1");
    db.wait_complete(&[id], Duration::from_secs(60)).await;
    let task = db.task(id).await;
    assert_eq!(task.get_i32("status").ok(), Some(status::FAILED), "{task}");
    assert!(
        task.get_str("stderr")
            .unwrap_or("")
            .contains("too many retries"),
        "{task}"
    );
    assert_eq!(task.get_i32("attempts").ok(), Some(3));
    assert_eq!(
        read_lines(&runs).len(),
        3,
        "max_retries 3 allows three runs"
    );
    let outcomes: Vec<String> = db
        .closed_attempts(id, 3)
        .await
        .iter()
        .map(|a| a.get_str("outcome").unwrap_or("?").to_string())
        .collect();
    assert_eq!(outcomes, ["retry", "retry", "failed"]);
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_retry_with_a_delay_waits_before_running_again() {
    let db = TestDb::new("retry_delay").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("q", "echo", 1).await;
    db.set_queue(queue, doc! {"max_retries": 2}).await;
    let id = db
        .insert_tasks(
            queue,
            vec![doc! {"result": {"retry": true, "delay": 1.5}}.into()],
        )
        .await[0];
    // The requeue is read from the server's record of writes, not from the task while it
    // waits: a test descheduled for the 1.5 s delay would miss that state.
    let mut changes = db.tasks().watch().await.expect("watch the tasks");
    let den = Den::start(&config, "n1");
    db.wait_complete(&[id], Duration::from_secs(60)).await;
    let requeue = loop {
        let event = tokio::time::timeout(
            disbatch_tests::scaled(Duration::from_secs(30)),
            changes.next(),
        )
        .await
        .expect("the requeue in the change stream")
        .expect("the change stream ended")
        .expect("a change event");
        if let Some(update) = event.update_description {
            if update.updated_fields.get_i32("status").ok() == Some(status::QUEUED) {
                break update;
            }
        }
    };
    let set = &requeue.updated_fields;
    assert!(
        set.get_datetime("not_before").is_ok(),
        "requeued with not_before: {set}"
    );
    assert!(set.get("complete").is_none(), "{set}");
    assert!(
        requeue.removed_fields.iter().any(|f| f == "slot"),
        "its slot freed: {:?}",
        requeue.removed_fields
    );
    let records = db.closed_attempts(id, 2).await;
    assert_eq!(records.len(), 2);
    let first_end = records[0]
        .get_datetime("end")
        .expect("end")
        .timestamp_millis();
    let second_start = records[1]
        .get_datetime("start")
        .expect("start")
        .timestamp_millis();
    assert!(
        second_start - first_end >= 1400,
        "ran again after {} ms",
        second_start - first_end
    );
    drop(den);
    db.drop().await;
}
