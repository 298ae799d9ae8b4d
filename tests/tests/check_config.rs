//! `--check-config`: every problem of a config file, by key, without connecting to anything.

use std::process::Command;
use std::time::{Duration, Instant};

use disbatch_tests::{bin_path, write_config, TestDb};
use serde_json::json;

/// Runs `program --check-config path`: (success, stdout, stderr, time taken).
fn check(program: &str, path: &std::path::Path) -> (bool, String, String, Duration) {
    let started = Instant::now();
    let out = Command::new(bin_path(program))
        .arg("--check-config")
        .arg(path)
        .env_remove("RUST_LOG")
        .output()
        .expect("run the check");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed(),
    )
}

/// An address nothing answers on: a connection attempt would wait out its timeout.
const UNROUTABLE: &str = "mongodb://10.255.255.1:27017/?serverSelectionTimeoutMS=20000";

#[tokio::test]
async fn a_good_config_passes_without_a_connection() {
    let db = TestDb::new("check_good").await;
    let path = write_config(
        &db,
        "good.json",
        json!({"mongohost": UNROUTABLE, "log_format": "json", "log_level": "debug",
            "web": {"tokens": [{"name": "a", "role": "read", "token": "a-token-0123456789"}]}}),
    );
    for program in ["disbatchd", "disbatch-web"] {
        let (ok, stdout, stderr, took) = check(program, &path);
        assert!(ok, "{program}: {stdout}{stderr}");
        assert!(stdout.contains("config OK"), "{program}: {stdout}");
        assert!(took < Duration::from_secs(5), "{program} took {took:?}");
    }
    db.drop().await;
}

#[tokio::test]
async fn a_bad_config_fails_naming_every_key() {
    let db = TestDb::new("check_bad").await;
    let path = write_config(
        &db,
        "bad.json",
        json!({"mongohost": "mongodb://admin:hunter2secret@10.255.255.1:27017/",
            "database": "no/slash", "loop_interval_ms": 5, "activequeues": ["not-an-id"],
            "log_format": "xml", "log_level": "info,[", "dead_node_after_s": "soon",
            "web": {"max_body_bytes": 10, "tokens": [{"name": "t", "role": "boss", "token": "x"}]}}),
    );
    let keys = [
        "database",
        "loop_interval_ms",
        "activequeues",
        "log_format",
        "log_level",
        "dead_node_after_s",
        "web.max_body_bytes",
        "web.tokens[0].role",
    ];
    for program in ["disbatchd", "disbatch-web"] {
        let (ok, stdout, stderr, took) = check(program, &path);
        assert!(!ok, "{program} must refuse: {stdout}{stderr}");
        for key in keys {
            assert!(
                stderr.contains(&format!("key `{key}`")),
                "{program} does not name {key}: {stderr}"
            );
        }
        assert!(stderr.contains("problem(s)"), "{stderr}");
        assert!(!stderr.contains("hunter2secret"), "redacted: {stderr}");
        assert!(took < Duration::from_secs(5), "{program} took {took:?}");
    }
    db.drop().await;
}

#[tokio::test]
async fn a_missing_task_runner_is_a_problem_for_disbatchd() {
    let db = TestDb::new("check_runner").await;
    let path = write_config(&db, "c.json", json!({"task_runner": "/nonexistent/runner"}));
    let (ok, _, stderr, _) = check("disbatchd", &path);
    assert!(!ok);
    assert!(stderr.contains("key `task_runner`"), "{stderr}");
    let (ok, stdout, stderr, _) = check("disbatch-web", &path);
    assert!(ok, "not a concern of disbatch-web: {stdout}{stderr}");
    db.drop().await;
}
