//! The `disbatch` CLI driving a running DCI (and a DEN where tasks must run).

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use bson::doc;
use disbatch_tests::{bin_path, write_config, Dci, Den, TestDb};
use serde_json::{json, Value};

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "disbatch failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn queue_commands_round_trip_through_the_api() {
    let db = TestDb::new("cli_queues").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);

    let plugins = ok(&dci.cli(&["plugins"]));
    assert_eq!(
        plugins.lines().collect::<Vec<_>>(),
        ["Disbatch::Plugin::Demo", "echo"]
    );

    let created = ok(&dci.cli(&[
        "create-queue",
        "alpha",
        "echo",
        "--threads",
        "2",
        "--sort",
        "lifo",
    ]));
    assert!(created.starts_with("Created queue alpha: "), "{created}");
    let updated = ok(&dci.cli(&["update-queue", "alpha", "threads", "5"]));
    assert!(updated.starts_with("Updated queue alpha"), "{updated}");
    let stored = db
        .db
        .collection::<bson::Document>("queues")
        .find_one(doc! {"name": "alpha"})
        .await
        .expect("find")
        .expect("queue");
    assert_eq!(
        stored.get_i64("threads").ok(),
        Some(5),
        "threads stored as a number: {stored}"
    );
    assert_eq!(stored.get_str("sort").ok(), Some("lifo"));

    let table = ok(&dci.cli(&["queues"]));
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].split_whitespace().eq([
            "ID",
            "Plugin",
            "Name",
            "Threads",
            "Queued",
            "Blocked",
            "Running",
            "Succeeded",
            "Failed",
            "Cancelled",
            "Orphaned"
        ]),
        "{table}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("alpha") && l.contains("echo")),
        "{table}"
    );
    assert!(table.contains("1 queue total."), "{table}");
    // Columns are aligned: every row has the header's width up to the last column.
    let json_out = ok(&dci.cli(&["--json", "queues"]));
    let parsed: Value = serde_json::from_str(&json_out).expect("--json prints JSON");
    assert_eq!(parsed[0]["name"], json!("alpha"));

    // Errors carry the server's message and exit non-zero.
    let dup = dci.cli(&["create-queue", "beta", "no-such-plugin"]);
    assert!(!dup.status.success());
    assert!(
        String::from_utf8_lossy(&dup.stderr).contains("Unknown plugin"),
        "{dup:?}"
    );
    let odd = dci.cli(&["update-queue", "alpha", "threads"]);
    assert!(!odd.status.success());

    let deleted = ok(&dci.cli(&["delete-queue", "alpha"]));
    assert!(deleted.contains("Deleted queue alpha"), "{deleted}");
    let gone = dci.cli(&["delete-queue", "alpha"]);
    assert!(!gone.status.success());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("no queue alpha"));
    db.drop().await;
}

#[tokio::test]
async fn task_commands_create_search_and_show_output() {
    let db = TestDb::new("cli_tasks").await;
    let config = write_config(&db, "node.json", json!({"gfs": true}));
    let dci = Dci::start(&config);
    // No retry policy: the failing task stays failed, for the operator's retry below.
    ok(&dci.cli(&[
        "create-queue",
        "demo",
        "Disbatch::Plugin::Demo",
        "--threads",
        "2",
        "--retry",
        "null",
    ]));

    let one = ok(&dci.cli(&["create-task", "demo", "commands", "a"]));
    assert!(one.starts_with("Created 1 task in queue demo"), "{one}");
    let many = ok(&dci.cli(&[
        "create-tasks",
        "demo",
        r#"[{"commands":"ab"},{"commands":"c"}]"#,
    ]));
    assert!(many.contains('2'), "{many}");

    let count = ok(&dci.cli(&["tasks", r#"{"queue":"demo"}"#, "--count"]));
    assert_eq!(count.trim(), "3 tasks");
    let page = ok(&dci.cli(&[
        "--json",
        "tasks",
        r#"{"queue":"demo"}"#,
        "--limit",
        "2",
        "--skip",
        "1",
    ]));
    let page: Value = serde_json::from_str(&page).expect("json");
    assert_eq!(
        page.as_array().map(Vec::len),
        Some(2),
        "--skip takes a value: {page}"
    );
    let bad = dci.cli(&["tasks", "[1]"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("Invalid filter is not a JSON object"));

    let den = Den::start(&config, "n1");
    let ids: Vec<bson::oid::ObjectId> = db
        .tasks()
        .distinct("_id", doc! {})
        .await
        .expect("ids")
        .into_iter()
        .filter_map(|b| b.as_object_id())
        .collect();
    db.wait_complete(&ids, Duration::from_secs(60)).await;
    drop(den);
    let first = ids.first().expect("a task");
    let task = db.task(*first).await;
    assert!(
        task.get_object_id("stdout").is_ok(),
        "gfs true puts output in GridFS: {task}"
    );
    let out = ok(&dci.cli(&["stdout", &first.to_hex()]));
    assert!(out.starts_with("This is command 'a' for apple."), "{out}");

    let nodes = ok(&dci.cli(&["nodes"]));
    assert!(
        nodes
            .lines()
            .next()
            .is_some_and(|h| h.contains("Node") && h.contains("MaxThreads")),
        "{nodes}"
    );
    assert!(nodes.contains("n1"), "{nodes}");
    ok(&dci.cli(&["set-maxthreads", "n1", "3"]));
    assert_eq!(db.node("n1").await.get_i64("maxthreads").ok(), Some(3));
    ok(&dci.cli(&["set-maxthreads", "n1", "null"]));
    assert_eq!(
        db.node("n1").await.get("maxthreads"),
        Some(&bson::Bson::Null)
    );

    // The failing task ('c') can be retried; a queued one can be cancelled.
    let failed = db
        .tasks()
        .find_one(doc! {"status": 2})
        .await
        .expect("find")
        .expect("a failed task");
    let failed_id = failed.get_object_id("_id").expect("id").to_hex();
    ok(&dci.cli(&["retry", &failed_id]));
    assert_eq!(db.count(doc! {"status": -2}).await, 1);
    ok(&dci.cli(&["cancel", &failed_id]));
    assert_eq!(db.count(doc! {"status": -5}).await, 1);
    let again = dci.cli(&["cancel", &failed_id]);
    assert!(
        !again.status.success(),
        "cancelling a cancelled task is refused"
    );
    db.drop().await;
}

#[tokio::test]
async fn many_tasks_from_json_lines_on_stdin_are_sent_in_chunks() {
    let db = TestDb::new("cli_bulk").await;
    let config = write_config(&db, "node.json", json!({}));
    let dci = Dci::start(&config);
    ok(&dci.cli(&["create-queue", "bulk", "echo"]));
    let mut child = Command::new(bin_path("disbatch"))
        .args([
            "--url",
            &dci.url,
            "create-tasks",
            "bulk",
            "--file",
            "-",
            "--chunk-size",
            "300",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    {
        let mut stdin = child.stdin.take().expect("stdin");
        for i in 0..1000 {
            writeln!(stdin, "{}", json!({"i": i})).expect("write");
        }
    }
    let out = child.wait_with_output().expect("wait");
    let stdout = ok(&out);
    assert!(stdout.contains("1000"), "{stdout}");
    assert_eq!(db.count(doc! {}).await, 1000);

    let bad = db.path("bad.jsonl");
    std::fs::write(&bad, "{\"i\": 1}\n\nnot json\n").expect("write");
    let out = dci.cli(&["create-tasks", "bulk", "--file", &bad.to_string_lossy()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 3"),
        "{out:?}"
    );
    assert_eq!(
        db.count(doc! {}).await,
        1000,
        "nothing sent from a bad file"
    );
    db.drop().await;
}

#[test]
fn completions_are_generated_for_bash() {
    let out = Command::new(bin_path("disbatch"))
        .args(["completions", "bash"])
        .output()
        .expect("run");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("create-tasks"));
}
