//! `log_format: json`: every line a DEN or disbatch-web writes on stderr is one JSON object,
//! credentials still masked.

use std::time::Duration;

use bson::doc;
use disbatch_tests::{wait_for, write_config, Dci, Den, Launch, TestDb};
use serde_json::{json, Value};

/// A warning at start quotes this unknown key, URI password and all.
const LEAKY_KEY: &str = "note mongodb://admin:hunter2secret@db.example/";

fn assert_json_lines(who: &str, text: &str) {
    assert!(!text.trim().is_empty(), "{who} logged nothing");
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let value: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{who}: not JSON ({e}): {line}"));
        assert!(value.get("level").is_some(), "{who}: no level: {line}");
        assert!(value.get("message").is_some(), "{who}: no message: {line}");
    }
    assert!(!text.contains("hunter2secret"), "{who} leaked: {text}");
    assert!(text.contains("admin:***@db.example"), "{who}: {text}");
}

#[tokio::test]
async fn a_den_with_json_logs_writes_one_object_per_line() {
    let db = TestDb::new("json_den").await;
    let config = write_config(
        &db,
        "node.json",
        // No metrics listener: its address is announced on stdout, which the harness logs
        // beside stderr, and this test reads that log as stderr alone.
        json!({"log_format": "json", "metrics_listen": null, LEAKY_KEY: 1}),
    );
    let queue = db.insert_queue("q", "echo", 1).await;
    let ids = db
        .insert_tasks(queue, vec![doc! {"stdout": "x"}.into()])
        .await;
    let mut den = Den::start(&config, "n1");
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    den.hangup();
    wait_for("the reload line", Duration::from_secs(30), || {
        let done = den.log_text().contains("config reloaded");
        async move { done }
    })
    .await;
    den.stop();
    assert_json_lines("disbatchd", &den.log_text());
    db.drop().await;
}

#[tokio::test]
async fn the_flag_wins_over_the_config_for_disbatch_web() {
    let db = TestDb::new("json_dci").await;
    let config = write_config(&db, "web.json", json!({"log_format": "text", LEAKY_KEY: 1}));
    let log = db.path("dci.log");
    // `Launch` has no arguments: the flag goes through a wrapper script.
    let wrapper = db.path("disbatch-web-json");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} --log-format json \"$@\"\n",
            disbatch_tests::bin_path("disbatch-web").display()
        ),
    )
    .expect("wrapper");
    let mut perms = std::fs::metadata(&wrapper).expect("meta").permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&wrapper, perms).expect("chmod");
    let dci = Dci::launch(
        &config,
        Launch {
            log_file: Some(log.clone()),
            rust_log: Some("info".into()),
            binary: Some(wrapper),
            ..Launch::default()
        },
    );
    let (status, _) = dci.get("/queues").await;
    assert_eq!(status, 200);
    let status = dci.terminate();
    assert!(status.success(), "{status:?}");
    assert_json_lines("disbatch-web", &std::fs::read_to_string(&log).expect("log"));
    db.drop().await;
}
