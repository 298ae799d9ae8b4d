//! The CLI's operator verbs against a real DCI and DEN: task, attempts, pause, resume, units,
//! balance, top, the tasks table, counts in words, `--url` without a scheme, and exit
//! statuses by class of failure.

use std::process::Output;
use std::time::Duration;

use bson::oid::ObjectId;
use disbatch_model::status;
use disbatch_tests::{write_config, Dci, Den, TestDb};
use serde_json::json;

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "disbatch failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn exit_code(out: &Output) -> Option<i32> {
    out.status.code()
}

#[tokio::test]
async fn operator_verbs_read_and_control_tasks_and_queues() {
    let db = TestDb::new("cli_verbs").await;
    let config = write_config(
        &db,
        "node.json",
        json!({"plugins": {"echo": disbatch_tests::echo_plugin()}}),
    );
    let dci = Dci::start(&config);
    let _den = Den::start(&config, "verbs-node");
    ok(&dci.cli(&["create-queue", "q", "echo", "--threads", "2"]));
    let created = ok(&dci.cli(&["create-task", "q", "word", "hello"]));
    assert!(
        created.starts_with("Created 1 task in queue q"),
        "{created}"
    );
    let id: ObjectId = db
        .tasks()
        .find_one(bson::doc! {})
        .await
        .expect("find")
        .and_then(|t| t.get_object_id("_id").ok())
        .expect("a task");
    db.wait_complete(&[id], Duration::from_secs(60)).await;
    let id = id.to_hex();

    check_one_task_and_the_tasks_table(&dci, &id).await;

    check_pause_units_resume_and_balance(&db, &dci).await;

    check_top_a_bare_url_and_exit_statuses_by_class(&dci).await;

    // The task's attempts.
    let attempts = ok(&dci.cli(&["attempts", &id]));
    let header: Vec<&str> = attempts
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["#", "Node", "PID", "Start", "End", "Outcome", "Status", "Exit", "Reason"],
        "{attempts}"
    );
    assert!(attempts.contains("verbs-node"), "{attempts}");
    assert!(attempts.contains("succeeded"), "{attempts}");
    assert!(attempts.trim_end().ends_with("1 attempt."), "{attempts}");

    // Help says what cancel does to a running task.
    let help = ok(&dci.cli(&["cancel", "--help"]));
    assert!(help.contains("running one is stopped"), "{help}");
    db.drop().await;
}

async fn check_one_task_and_the_tasks_table(dci: &Dci, id: &str) {
    // One task, readable.
    let task = ok(&dci.cli(&["task", id]));
    assert!(task.starts_with("id "), "{task}");
    assert!(task.contains("succeeded (1)"), "{task}");
    assert!(task.contains("verbs-node"), "{task}");
    let raw = ok(&dci.cli(&["--json", "task", id]));
    let raw: serde_json::Value = serde_json::from_str(&raw).expect("--json is JSON");
    assert_eq!(raw["status"], json!(status::SUCCEEDED));

    // The tasks table, and JSON on request.
    let table = ok(&dci.cli(&["tasks", r#"{"queue":"q"}"#]));
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["ID", "Queue", "Status", "Node", "Attempts", "Modified", "Params"],
        "{table}"
    );
    assert!(
        table.contains(id) && table.contains("succeeded (1)"),
        "{table}"
    );
    assert!(table.trim_end().ends_with("1 task."), "{table}");
    let listed = ok(&dci.cli(&["--json", "tasks", r#"{"queue":"q"}"#]));
    assert!(serde_json::from_str::<serde_json::Value>(&listed).is_ok_and(|v| v.is_array()));
    assert_eq!(
        ok(&dci.cli(&["tasks", r#"{"queue":"q"}"#, "--count"])).trim(),
        "1 task"
    );
}

async fn check_pause_units_resume_and_balance(db: &TestDb, dci: &Dci) {
    // Pause, units while paused (none can be claimed), resume.
    assert!(ok(&dci.cli(&["pause", "q"])).contains("Paused queue q"));
    let again = dci.cli(&["pause", "q"]);
    assert_eq!(exit_code(&again), Some(4), "a conflict exits 4: {again:?}");
    let units = ok(&dci.cli(&[
        "units",
        "q",
        r#"[{"key":"a"},{"key":"b","params":{"word":"b"}}]"#,
    ]));
    assert!(
        units.starts_with("2 units added, 0 updated, 0 rejected"),
        "{units}"
    );
    let units = ok(&dci.cli(&["units", "q", r#"[{"key":"a"}]"#]));
    assert!(
        units.starts_with("0 units added, 0 updated, 1 rejected"),
        "{units}"
    );
    let lines = db.path("units.jsonl");
    std::fs::write(
        &lines,
        "{\"key\":\"a\",\"params\":{\"word\":\"new\"}}\n\n{\"key\":\"c\"}\n",
    )
    .expect("write units");
    let units = ok(&dci.cli(&["units", "q", "--update", "--file", &lines.to_string_lossy()]));
    assert!(
        units.starts_with("1 unit added, 1 updated, 0 rejected"),
        "{units}"
    );
    let queues = ok(&dci.cli(&["queues"]));
    assert!(queues.trim_end().ends_with("1 queue total."), "{queues}");
    assert!(ok(&dci.cli(&["resume", "q"])).contains("Resumed queue q"));

    // Balance: shown, then set.
    let balance = ok(&dci.cli(&["balance"]));
    assert!(balance.contains("balancer:"), "{balance}");
    let set = ok(&dci.cli(&[
        "balance",
        "--set",
        r#"{"max_tasks":{"* 07:00":3},"queues":[["q"]]}"#,
    ]));
    assert!(set.contains("success"), "{set}");
    let balance = ok(&dci.cli(&["balance"]));
    assert!(balance.contains("group 1: q"), "{balance}");
    assert!(balance.contains("max_tasks * 07:00: 3"), "{balance}");
}

async fn check_top_a_bare_url_and_exit_statuses_by_class(dci: &Dci) {
    // top: frames of queues and nodes.
    let top = ok(&dci.cli(&["top", "--iterations", "2", "--interval", "0.2"]));
    assert_eq!(top.matches("disbatch top:").count(), 2, "{top}");
    assert!(
        top.contains("verbs-node") && top.contains("Succeeded"),
        "{top}"
    );

    // --url without a scheme is http.
    let bare = dci.url.trim_start_matches("http://").to_string();
    let out = std::process::Command::new(disbatch_tests::bin_path("disbatch"))
        .args(["--url", &bare, "plugins"])
        .output()
        .expect("run disbatch");
    assert!(ok(&out).contains("echo"));

    // Exit statuses by class.
    let missing = dci.cli(&["task", &ObjectId::new().to_hex()]);
    assert_eq!(
        exit_code(&missing),
        Some(3),
        "not found exits 3: {missing:?}"
    );
    let missing = dci.cli(&["attempts", &ObjectId::new().to_hex()]);
    assert_eq!(
        exit_code(&missing),
        Some(3),
        "not found exits 3: {missing:?}"
    );
    let odd = dci.cli(&["update-queue", "q", "threads"]);
    assert_eq!(exit_code(&odd), Some(2), "usage exits 2: {odd:?}");
    let bad_json = dci.cli(&["create-tasks", "q", "{bad"]);
    assert_eq!(exit_code(&bad_json), Some(2), "usage exits 2: {bad_json:?}");
    let refused = dci.cli(&["update-queue", "q", "threads", "-1"]);
    assert_eq!(
        exit_code(&refused),
        Some(2),
        "a request the server rejects exits 2: {refused:?}"
    );
    let unreachable = std::process::Command::new(disbatch_tests::bin_path("disbatch"))
        .args(["--url", "127.0.0.1:1", "queues"])
        .output()
        .expect("run disbatch");
    assert_eq!(
        exit_code(&unreachable),
        Some(5),
        "unreachable exits 5: {unreachable:?}"
    );
    let usage = dci.cli(&["no-such-verb"]);
    assert_eq!(exit_code(&usage), Some(2));
    // Disbatch's body names no queue (the Perl CLI prints it as it is); ours says which.
    for args in [
        &["create-task", "nosuchq", "a=1"][..],
        &["tasks", "--queue", "nosuchq"][..],
    ] {
        let out = dci.cli(args);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains("queue not found: \"nosuchq\""),
            "{args:?}: {said}"
        );
        assert_eq!(exit_code(&out), Some(2), "{args:?}");
    }
}

/// A mistyped option's usage line showed the option clap suggests as if it were required
/// (`Usage: disbatch --url <URL> <COMMAND>`); the tip names it, the usage line is the plain one.
#[test]
fn a_mistyped_option_is_suggested_without_a_usage_line_that_requires_it() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(disbatch_tests::bin_path("disbatch"))
            .args(args)
            .output()
            .expect("run disbatch");
        assert_eq!(exit_code(&out), Some(2), "usage exits 2: {out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let top = run(&["--ur", "http://x:1", "queues"]);
    assert!(top.contains("a similar argument exists: '--url'"), "{top}");
    assert!(top.contains("Usage: disbatch [OPTIONS] <COMMAND>"), "{top}");
    assert!(!top.contains("--url <URL> <COMMAND>"), "{top}");
    let sub = run(&["tasks", "--bogus"]);
    assert!(
        sub.contains("a similar argument exists: '--bound'"),
        "{sub}"
    );
    assert!(
        sub.contains("Usage: disbatch tasks [OPTIONS] [FILTER]"),
        "{sub}"
    );
    let nested = run(&["queues", "--jsn"]);
    assert!(
        nested.contains("Usage: disbatch queues [OPTIONS]"),
        "{nested}"
    );
}
