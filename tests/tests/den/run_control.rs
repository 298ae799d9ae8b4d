//! Control over a running plugin with real nodes and runners: queue timeouts (TERM, grace,
//! KILL), cancelling a running task, and the environment a plugin is given.

use std::path::Path;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Document};
use disbatch_model::status;
use disbatch_tests::{read_lines, wait_for, write_config, Backoff, Dci, Den, TestDb};
use serde_json::json;

/// Params of a task whose plugin appends its id to `runs` and then waits for a gate that
/// never opens: it runs until it is stopped, however long the test takes to act.
fn never_ending(runs: &Path, more: Document) -> bson::Bson {
    let mut p = more;
    p.insert("append_to", runs.to_string_lossy().to_string());
    let gate = runs.with_file_name("never-opened");
    p.insert("hold_until", gate.to_string_lossy().to_string());
    p.into()
}

/// The last attempt's outcome, once the runner has closed it.
async fn closed_outcome(db: &TestDb, id: ObjectId) -> String {
    let deadline = Instant::now() + disbatch_tests::scaled(Duration::from_secs(30));
    let mut backoff = Backoff::new();
    loop {
        let outcome = db
            .attempts(id)
            .await
            .last()
            .and_then(|a| a.get_str("outcome").ok().map(str::to_string))
            .unwrap_or_default();
        if !outcome.is_empty() && outcome != "running" {
            return outcome;
        }
        assert!(
            Instant::now() < deadline,
            "the attempt of {id} never closed"
        );
        backoff.wait().await;
    }
}

#[tokio::test]
async fn a_plugin_past_its_queue_timeout_is_stopped_and_the_task_fails() {
    let db = TestDb::new("timeout").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("q", "echo", 2).await;
    db.set_queue(queue, doc! {"timeout": 1, "kill_grace": 1})
        .await;
    // Neither plugin ends by itself, so their tasks ending at all shows the timeout fired:
    // no bound on the clock is needed.
    let runs = db.path("runs.txt");
    let ids = db
        .insert_tasks(
            queue,
            vec![
                never_ending(&runs, doc! {}),
                // Ignores SIGTERM: only the SIGKILL after the grace period stops it.
                never_ending(&runs, doc! {"ignore_term": true}),
            ],
        )
        .await;
    let started = Instant::now();
    let den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    let took = started.elapsed();
    for (id, signal) in ids.iter().zip([15, 9]) {
        let task = db.task(*id).await;
        assert_eq!(task.get_i32("status").ok(), Some(status::FAILED), "{task}");
        let stderr = task.get_str("stderr").unwrap_or("");
        assert!(
            stderr.contains("[disbatch] timed out after 1 s"),
            "{stderr}"
        );
        assert_eq!(closed_outcome(&db, *id).await, "timed_out");
        let attempt = db.attempts(*id).await.remove(0);
        assert_eq!(attempt.get_i32("signal").ok(), Some(signal), "{attempt}");
    }
    println!("both timed out and done {took:?} after the node's start");
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn cancelling_a_running_task_stops_its_plugin_within_seconds() {
    let db = TestDb::new("cancel_running").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("q", "echo", 1).await;
    // Its plugin never ends by itself: only the cancel can stop it.
    let runs = db.path("runs.txt");
    let id = db
        .insert_tasks(queue, vec![never_ending(&runs, doc! {})])
        .await[0];
    let den = Den::start(&config, "n1");
    let dci = Dci::start(&config);
    wait_for("the plugin to start", Duration::from_secs(60), || async {
        read_lines(&runs).len() == 1
    })
    .await;
    let asked = Instant::now();
    let (code, body) = dci
        .post(&format!("/tasks/{}/cancel", id.to_hex()), json!({}))
        .await;
    assert_eq!(code, 202, "{body}");
    wait_for("the cancel to land", Duration::from_secs(60), || async {
        db.task(id).await.get_i32("status").ok() == Some(status::CANCELLED)
    })
    .await;
    let latency = asked.elapsed();
    println!("running task cancelled {latency:?} after the request");
    let task = db.task(id).await;
    assert!(
        task.get_str("stderr")
            .unwrap_or("")
            .contains("cancelled by an operator"),
        "{task}"
    );
    assert!(
        task.get("cancel_requested").is_none() && task.get("slot").is_none(),
        "{task}"
    );
    assert_eq!(closed_outcome(&db, id).await, "cancelled");
    drop(dci);
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_plugin_sees_only_allow_listed_environment_variables() {
    let db = TestDb::new("plugin_env").await;
    let config = write_config(&db, "node.json", json!({"plugin_env": ["APP_*"]}));
    let queue = db.insert_queue("q", "echo", 1).await;
    let names = [
        "APP_MODE",
        "SECRET_TOKEN",
        "PATH",
        "DISBATCH_ATTEMPT",
        "DISBATCH_LEAKED",
    ];
    let id = db
        .insert_tasks(queue, vec![doc! {"print_env": names.to_vec()}.into()])
        .await[0];
    let den = Den::start_with_env(
        &config,
        "n1",
        &[
            ("APP_MODE", "blue"),
            ("SECRET_TOKEN", "hunter2"),
            ("DISBATCH_LEAKED", "x"),
        ],
    );
    db.wait_complete(&[id], Duration::from_secs(30)).await;
    let task = db.task(id).await;
    let stdout = task.get_str("stdout").unwrap_or("");
    assert!(stdout.contains("APP_MODE=blue\n"), "{stdout}");
    assert!(stdout.contains("SECRET_TOKEN unset\n"), "{stdout}");
    assert!(stdout.contains("DISBATCH_LEAKED unset\n"), "{stdout}");
    assert!(stdout.contains("PATH="), "{stdout}");
    let attempt = task.get_object_id("attempt").expect("attempt");
    assert!(
        stdout.contains(&format!("DISBATCH_ATTEMPT={}\n", attempt.to_hex())),
        "{stdout}"
    );
    drop(den);
    db.drop().await;
}
