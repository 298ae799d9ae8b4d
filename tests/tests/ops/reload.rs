//! SIGHUP reloads the config of a running `disbatchd` or `disbatch-web`: what changes, what
//! a refused config leaves alone, and that running tasks are never touched.

use std::path::Path;
use std::time::Duration;

use bson::doc;
use disbatch_model::status;
use disbatch_tests::wait_for_log;
use disbatch_tests::{echo_plugin, read_lines, wait_for, write_config, Dci, Den, Launch, TestDb};
use serde_json::json;

#[tokio::test]
async fn a_reload_adds_a_plugin_without_touching_the_running_task() {
    let db = TestDb::new("reload_den").await;
    let only_echo = json!({"plugins": {"echo": echo_plugin()}});
    let config = write_config(&db, "node.json", only_echo);
    let echo = db.insert_queue("long", "echo", 1).await;
    let other = db.insert_queue("other", "echo2", 1).await;
    // Held at its gate until the reload is done and a task of the new plugin has run.
    let (runs, gate) = (db.path("runs.txt"), db.path("gate"));
    let long = db
        .insert_tasks(
            echo,
            vec![
                doc! {"stdout": "slept", "append_to": runs.to_string_lossy().to_string(),
                "hold_until": gate.to_string_lossy().to_string()}
                .into(),
            ],
        )
        .await[0];
    let den = Den::start(&config, "n1");
    wait_for("the long task to run", Duration::from_secs(60), || async {
        read_lines(&runs).len() == 1
    })
    .await;
    // A second name for the echo plugin: the queue `other` names it.
    let more = json!({"plugins": {"echo": echo_plugin(), "echo2": echo_plugin()}});
    write_config(&db, "node.json", more);
    den.hangup();
    wait_for_log("the reload", || den.log_text(), "config reloaded", 1).await;
    let log = den.log_text();
    assert!(
        log.contains("plugins"),
        "the reload names what changed: {log}"
    );
    let next = db
        .insert_tasks(other, vec![doc! {"stdout": "new plugin"}.into()])
        .await[0];
    db.wait_complete(&[next], Duration::from_secs(60)).await;
    let held = db.task(long).await;
    assert_eq!(
        held.get_i32("status").ok(),
        Some(status::RUNNING),
        "still running: {held}"
    );
    std::fs::write(&gate, "").expect("open the gate");
    db.wait_complete(&[long], Duration::from_secs(60)).await;
    let long = db.task(long).await;
    assert_eq!(
        long.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{long}"
    );
    // The echo plugin writes its params back: the whole run, not cut short.
    assert!(
        long.get_str("stdout").unwrap_or_default().contains("slept"),
        "{long}"
    );
    let next = db.task(next).await;
    assert_eq!(
        next.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{next}"
    );
    assert_eq!(
        db.attempts(long.get_object_id("_id").expect("id"))
            .await
            .len(),
        1
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn an_invalid_config_is_refused_and_the_old_one_kept() {
    let db = TestDb::new("reload_refused").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("q", "echo", 2).await;
    let mut den = Den::start(&config, "n1");
    let first = db
        .insert_tasks(queue, vec![doc! {"stdout": "a"}.into()])
        .await;
    db.wait_complete(&first, Duration::from_secs(60)).await;

    std::fs::write(&config, "{\"mongohost\": \"mongodb://x\", ").expect("broken config");
    den.hangup();
    wait_for_log("the refusal", || den.log_text(), "config reload refused", 1).await;
    // A bad value, then a restart-only change beside a bad one: each refused whole.
    write_config(
        &db,
        "node.json",
        json!({"loop_interval_ms": 5, "activequeues": ["nope"]}),
    );
    den.hangup();
    wait_for_log(
        "the second refusal",
        || den.log_text(),
        "config reload refused",
        2,
    )
    .await;
    let log = den.log_text();
    assert!(log.contains("loop_interval_ms"), "names the reason: {log}");
    assert!(log.contains("activequeues"), "names every problem: {log}");
    assert!(!log.contains("config reloaded"), "{log}");
    assert!(den.is_running(), "a refused reload leaves the node running");

    // The runners are given the config the node accepted, not the file as it is now.
    std::fs::write(&config, "not json at all").expect("broken config");
    let second = db
        .insert_tasks(queue, vec![doc! {"stdout": "b"}.into()])
        .await;
    db.wait_complete(&second, Duration::from_secs(60)).await;
    let task = db.task(second[0]).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{task}"
    );
    assert!(den.is_running());
    drop(den);
    db.drop().await;
}

const OLD: &str = "old-token-0123456789abcdef";
const NEW: &str = "new-token-0123456789abcdef";

fn web_config(db: &TestDb, tokens: serde_json::Value) -> std::path::PathBuf {
    write_config(db, "web.json", json!({"web": {"tokens": tokens}}))
}

fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[tokio::test]
async fn disbatch_web_reloads_its_tokens_and_refuses_a_bad_config() {
    let db = TestDb::new("reload_dci").await;
    let old = json!([{"name": "old", "role": "read", "token": OLD}]);
    let config = web_config(&db, old.clone());
    let log = db.path("dci.log");
    let mut dci = Dci::launch(
        &config,
        Launch {
            log_file: Some(log.clone()),
            rust_log: Some("info".into()),
            ..Launch::default()
        },
    );
    assert_eq!(dci.status_with_token("/queues", OLD).await, 200);
    assert_eq!(dci.status_with_token("/queues", NEW).await, 401);

    std::fs::write(db.path("new.token"), format!("{NEW}\n")).expect("token file");
    let both = json!([{"name": "old", "role": "read", "token": OLD},
        {"name": "new", "role": "read", "token_file": "new.token"}]);
    web_config(&db, both);
    dci.hangup();
    wait_for_log("the reload", || log_of(&log), "config reloaded", 1).await;
    assert_eq!(dci.status_with_token("/queues", NEW).await, 200);
    assert_eq!(dci.status_with_token("/queues", OLD).await, 200);

    // A token too short to accept: the whole config is refused, the tokens stay.
    let bad = json!([{"name": "old", "role": "read", "token": "short"}]);
    web_config(&db, bad);
    dci.hangup();
    wait_for_log("the refusal", || log_of(&log), "config reload refused", 1).await;
    let text = log_of(&log);
    assert!(text.contains("web.tokens[0].token"), "{text}");
    assert!(
        !text.contains("short\""),
        "a token never reaches the log: {text}"
    );
    assert!(dci.is_running());
    assert_eq!(dci.status_with_token("/queues", OLD).await, 200);
    assert_eq!(dci.status_with_token("/queues", NEW).await, 200);

    // A key that needs a restart is named, and the rest still applies.
    let listen = json!({"web": {"tokens": old, "listen": "127.0.0.1:1"}});
    write_config(&db, "web.json", listen);
    dci.hangup();
    wait_for_log("the second reload", || log_of(&log), "config reloaded", 2).await;
    let text = log_of(&log);
    assert!(text.contains("web.listen"), "{text}");
    assert_eq!(
        dci.status_with_token("/queues", NEW).await,
        401,
        "the removed token is refused"
    );
    assert_eq!(dci.status_with_token("/queues", OLD).await, 200);
    drop(dci);
    db.drop().await;
}
