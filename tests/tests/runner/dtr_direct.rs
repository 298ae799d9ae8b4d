//! The task runner run by hand on a task claimed by hand: failures to start are recorded.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use bson::oid::ObjectId;
use bson::{doc, DateTime};
use disbatch_model::status;
use disbatch_tests::{bin_path, write_config, TestDb};
use serde_json::json;

async fn claim_by_hand(db: &TestDb, id: ObjectId, node: &str) {
    db.tasks()
        .update_one(
            doc! {"_id": id},
            doc! {"$set": {"status": -1, "node": node, "mtime": DateTime::now()}},
        )
        .await
        .expect("claim");
}

fn run_dtr(config: &std::path::Path, task: ObjectId, node: &str) -> std::process::Output {
    Command::new(bin_path("disbatch-task-runner"))
        .arg("--config")
        .arg(config)
        .arg("--task")
        .arg(task.to_hex())
        .arg("--node")
        .arg(node)
        .output()
        .expect("run the task runner")
}

#[tokio::test]
async fn missing_or_non_executable_plugins_fail_the_task_with_a_clear_stderr() {
    let db = TestDb::new("dtr_plugins").await;
    let not_exec = db.path("not-executable");
    std::fs::write(&not_exec, "#!/bin/sh\n").expect("write");
    std::fs::set_permissions(&not_exec, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"gone": db.path("no-such-file"), "noexec": not_exec}}),
    );
    let cases = [
        ("gone", "not an executable file"),
        ("noexec", "not an executable file"),
        ("unlisted", "not listed"),
    ];
    for (plugin, expected) in cases {
        let queue = db.insert_queue(plugin, plugin, 1).await;
        let id = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
        claim_by_hand(&db, id, "n1").await;
        let out = run_dtr(&config, id, "n1");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let task = db.task(id).await;
        assert_eq!(task.get_i32("status").ok(), Some(status::FAILED), "{task}");
        assert_eq!(task.get_str("stdout").ok(), Some("Unable to start"));
        let stderr = task.get_str("stderr").unwrap_or_default();
        assert!(
            stderr.contains(expected) && stderr.contains(plugin),
            "{plugin}: {stderr}"
        );
        assert_eq!(task.get_bool("complete").ok(), Some(true));
    }
    // A queue that was deleted after its task was claimed.
    let id = db.insert_tasks(ObjectId::new(), vec![doc! {}.into()]).await[0];
    claim_by_hand(&db, id, "n1").await;
    assert!(run_dtr(&config, id, "n1").status.success());
    let task = db.task(id).await;
    assert_eq!(task.get_i32("status").ok(), Some(status::FAILED));
    assert!(
        task.get_str("stderr")
            .unwrap_or_default()
            .contains("does not exist"),
        "{task}"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_runner_leaves_tasks_it_does_not_own_alone() {
    let db = TestDb::new("dtr_owner").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("q", "echo", 1).await;
    let id = db.insert_tasks(queue, vec![doc! {}.into()]).await[0];
    claim_by_hand(&db, id, "other-node").await;
    let out = run_dtr(&config, id, "n1");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not claimed by this node"));
    let task = db.task(id).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::CLAIMED),
        "untouched: {task}"
    );
    assert_eq!(task.get_str("node").ok(), Some("other-node"));

    let out = Command::new(bin_path("disbatch-task-runner"))
        .args(["--config"])
        .arg(&config)
        .args(["--task", "not-an-id"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a task id"));
    db.drop().await;
}
