//! One DEN end to end: tasks inserted the way ops do reach their final status with output.

use std::time::Duration;

use bson::{doc, Bson};
use disbatch_model::status;
use disbatch_tests::{write_config, Den, TestDb};
use serde_json::json;

#[tokio::test]
async fn twenty_tasks_succeed_with_their_stdout() {
    let db = TestDb::new("twenty").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("demo", "Disbatch::Plugin::Demo", 4).await;
    let ids = db
        .insert_tasks(
            queue,
            (0..20).map(|_| doc! {"commands": "a"}.into()).collect(),
        )
        .await;
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    for id in &ids {
        let t = db.task(*id).await;
        assert_eq!(t.get_i32("status").ok(), Some(status::SUCCEEDED), "{t}");
        assert_eq!(
            t.get_str("stdout").ok(),
            Some("This is command 'a' for apple.\n"),
            "{t}"
        );
        // Empty output is stored as null, as Disbatch's runner stores a plugin's undef.
        assert_eq!(t.get("stderr"), Some(&Bson::Null), "{t}");
        assert_eq!(t.get_str("node").ok(), Some("n1"));
        assert!(t.get("slot").is_none(), "slot freed: {t}");
        assert!(t.get_datetime("mtime").is_ok());
    }
    let node = db.node("n1").await;
    assert!(node.get_datetime("timestamp").is_ok(), "{node}");
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn failures_record_status_two_with_stderr() {
    let db = TestDb::new("failures").await;
    let config = write_config(&db, "node.json", json!({}));
    let demo = db.insert_queue("demo", "Disbatch::Plugin::Demo", 4).await;
    let echo = db.insert_queue("echo", "echo", 4).await;
    let failing = db
        .insert_tasks(demo, vec![doc! {"commands": "abc"}.into()])
        .await[0];
    let exits = db
        .insert_tasks(
            echo,
            vec![doc! {"exit_code": 3, "stderr": "went wrong"}.into()],
        )
        .await[0];
    let aborts = db
        .insert_tasks(echo, vec![doc! {"abort": true}.into()])
        .await[0];
    let result_wins = db
        .insert_tasks(
            echo,
            vec![doc! {"exit_code": 1, "result": {"status": 1}}.into()],
        )
        .await[0];
    let bad_utf8 = db
        .insert_tasks(echo, vec![doc! {"invalid_utf8": true}.into()])
        .await[0];
    let den = Den::start(&config, "n1");
    db.wait_complete(
        &[failing, exits, aborts, result_wins, bad_utf8],
        Duration::from_secs(60),
    )
    .await;

    let t = db.task(failing).await;
    assert_eq!(t.get_i32("status").ok(), Some(status::FAILED), "{t}");
    let stderr = t.get_str("stderr").unwrap_or_default();
    assert!(stderr.contains("'c' for cherry"), "{stderr}");

    let t = db.task(exits).await;
    assert_eq!(t.get_i32("status").ok(), Some(status::FAILED), "{t}");
    let stderr = t.get_str("stderr").unwrap_or_default();
    assert!(
        stderr.starts_with("went wrong") && stderr.contains("exited with code 3"),
        "{stderr}"
    );

    let t = db.task(aborts).await;
    assert_eq!(t.get_i32("status").ok(), Some(status::FAILED), "{t}");
    assert!(
        t.get_str("stderr").unwrap_or_default().contains("SIGABRT"),
        "{t}"
    );

    let t = db.task(result_wins).await;
    assert_eq!(
        t.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "positive status in the result file wins: {t}"
    );

    let t = db.task(bad_utf8).await;
    assert_eq!(t.get_i32("status").ok(), Some(status::SUCCEEDED), "{t}");
    assert!(
        t.get_str("stdout")
            .unwrap_or_default()
            .ends_with("bad:\u{FFFD}\u{FFFD}:end\n"),
        "{t}"
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn unrunnable_tasks_fail_clearly_and_other_queues_keep_running() {
    let db = TestDb::new("badinput").await;
    let config = write_config(&db, "node.json", json!({}));
    let unknown = db.insert_queue("unknown", "No::Such::Plugin", 2).await;
    let bad_threads = db.insert_queue("badthreads", "echo", "abc").await;
    let string_threads = db.insert_queue("strthreads", "echo", "2").await;
    let good = db.insert_queue("good", "echo", 2).await;
    let skipped_a = db.insert_tasks(unknown, vec![doc! {}.into()]).await[0];
    let skipped_b = db.insert_tasks(bad_threads, vec![doc! {}.into()]).await[0];
    let ok_string = db
        .insert_tasks(string_threads, vec![doc! {"n": 1}.into()])
        .await[0];
    let not_object = db
        .insert_tasks(good, vec![Bson::String("hello".into())])
        .await[0];
    let fine = db.insert_tasks(good, vec![doc! {"n": 2}.into()]).await[0];
    let mut den = Den::start(&config, "n1");
    db.wait_complete(&[ok_string, not_object, fine], Duration::from_secs(60))
        .await;

    let t = db.task(not_object).await;
    assert_eq!(t.get_i32("status").ok(), Some(status::FAILED), "{t}");
    assert!(
        t.get_str("stderr")
            .unwrap_or_default()
            .contains("params must be an object"),
        "{t}"
    );
    assert_eq!(
        db.task(fine).await.get_i32("status").ok(),
        Some(status::SUCCEEDED)
    );
    assert_eq!(
        db.task(ok_string).await.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "threads \"2\" is accepted"
    );
    // Queues this node cannot serve are skipped, their tasks untouched.
    for id in [skipped_a, skipped_b] {
        let t = db.task(id).await;
        assert_eq!(t.get_i32("status").ok(), Some(status::QUEUED), "{t}");
        assert_eq!(t.get("node"), Some(&Bson::Null));
    }
    assert!(den.is_running());
    let log = den.log_text();
    assert!(log.contains("not listed in this node's `plugins`"), "{log}");
    assert!(
        log.contains("\\\"abc\\\" is not a non-negative integer")
            || log.contains("\"abc\" is not a non-negative integer"),
        "{log}"
    );
    assert_eq!(den.stop(), Some(0));
    db.drop().await;
}

#[tokio::test]
async fn the_node_document_lists_its_live_runners() {
    let db = TestDb::new("runners").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("q", "echo", 1).await;
    // Held at its gate until the runner has been seen: a quick task could come and go
    // between two heartbeats.
    let gate = db.path("gate");
    let id = db
        .insert_tasks(
            queue,
            vec![doc! {"hold_until": gate.to_string_lossy().to_string()}.into()],
        )
        .await[0];
    let den = Den::start(&config, "n1");
    disbatch_tests::wait_for(
        "the runner on the node document",
        Duration::from_secs(60),
        || async {
            let node = node_or_empty(&db, "n1").await;
            node.get_array("runners").is_ok_and(|r| {
                r.iter().any(|x| {
                    x.as_document().is_some_and(|d| {
                        d.get_object_id("task").ok() == Some(id)
                            && d.get_i64("pid").is_ok_and(|p| p > 0)
                    })
                })
            })
        },
    )
    .await;
    std::fs::write(&gate, "").expect("open the gate");
    db.wait_complete(&[id], Duration::from_secs(60)).await;
    disbatch_tests::wait_for(
        "the runner to leave the list",
        Duration::from_secs(60),
        || async {
            node_or_empty(&db, "n1")
                .await
                .get_array("runners")
                .is_ok_and(|r| r.is_empty())
        },
    )
    .await;
    drop(den);
    db.drop().await;
}

/// The node document, or an empty one before the node's first heartbeat.
async fn node_or_empty(db: &TestDb, name: &str) -> bson::Document {
    let nodes = db.db.collection::<bson::Document>("nodes");
    nodes
        .find_one(doc! {"node": name})
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
}
