//! `--check-config`: every problem of a config file, by key, without connecting to anything.

use std::net::TcpListener;
use std::process::Command;

use disbatch_tests::{bin_path, write_config, TestDb};
use serde_json::json;

/// Runs `program --check-config path`: (success, stdout, stderr).
fn check(program: &str, path: &std::path::Path) -> (bool, String, String) {
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
    )
}

/// A server that takes connections and never answers: a check that connected would leave
/// one behind (the kernel completes it without an `accept`), and one that waited for an
/// answer would wait out the selection timeout and fail. Returns it and its host:port.
fn silent_server() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let addr = listener.local_addr().expect("address").to_string();
    (listener, addr)
}

/// Panics if anything connected to `server`.
fn assert_no_connection(server: &TcpListener, program: &str) {
    match server.accept() {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        Ok((_, peer)) => panic!("{program} connected to the server ({peer}) to check a config"),
        Err(e) => panic!("accept: {e}"),
    }
}

#[tokio::test]
async fn a_good_config_passes_without_a_connection() {
    let db = TestDb::new("check_good").await;
    let (server, addr) = silent_server();
    let path = write_config(
        &db,
        "good.json",
        json!({"mongohost": format!("mongodb://{addr}/?serverSelectionTimeoutMS=20000"), "log_format": "json", "log_level": "debug",
            "web": {"tokens": [{"name": "a", "role": "read", "token": "a-token-0123456789"}]}}),
    );
    for program in ["disbatchd", "disbatch-web"] {
        let (ok, stdout, stderr) = check(program, &path);
        assert!(ok, "{program}: {stdout}{stderr}");
        assert!(stdout.contains("config OK"), "{program}: {stdout}");
        assert_no_connection(&server, program);
    }
    db.drop().await;
}

#[tokio::test]
async fn a_bad_config_fails_naming_every_key() {
    let db = TestDb::new("check_bad").await;
    let (server, addr) = silent_server();
    let path = write_config(
        &db,
        "bad.json",
        json!({"mongohost": format!("mongodb://admin:hunter2secret@{addr}/"),
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
        let (ok, stdout, stderr) = check(program, &path);
        assert!(!ok, "{program} must refuse: {stdout}{stderr}");
        for key in keys {
            assert!(
                stderr.contains(&format!("key `{key}`")),
                "{program} does not name {key}: {stderr}"
            );
        }
        assert!(stderr.contains("problem(s)"), "{stderr}");
        assert!(!stderr.contains("hunter2secret"), "redacted: {stderr}");
        assert_no_connection(&server, program);
    }
    db.drop().await;
}

#[tokio::test]
async fn a_missing_task_runner_is_a_problem_for_disbatchd() {
    let db = TestDb::new("check_runner").await;
    let path = write_config(&db, "c.json", json!({"task_runner": "/nonexistent/runner"}));
    let (ok, _, stderr) = check("disbatchd", &path);
    assert!(!ok);
    assert!(stderr.contains("key `task_runner`"), "{stderr}");
    let (ok, stdout, stderr) = check("disbatch-web", &path);
    assert!(ok, "not a concern of disbatch-web: {stdout}{stderr}");
    db.drop().await;
}
