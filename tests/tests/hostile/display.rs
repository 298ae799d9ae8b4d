//! Names stored past the API (ESC, NUL, line feed, U+202E, 100 KB, trailing spaces) in queues,
//! nodes and tasks: the CLI, both `/metrics` and the HTML task page show them escaped, never
//! raw, and never spread a table row over several lines.

use std::process::Output;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime};
use disbatch_tests::exposition::{self, hidden_characters};
use disbatch_tests::{write_config, Dci, Den, TestDb};
use serde_json::{json, Value};

/// Queue names as ops or older versions stored them, each with a plain tag to find its row.
fn hostile_names() -> Vec<String> {
    vec![
        "esc\u{1b}[31mred".into(),
        "nul\0name".into(),
        "two\nlines".into(),
        "rtl\u{202e}txt.exe".into(),
        format!("long{}", "L".repeat(100_000)),
        "trailing  ".into(),
        "<img src=x onerror=alert(1)>".into(),
    ]
}

const HOSTILE_NODES: &[&str] = &["node\u{1b}]0;pwned\u{7}", "node\u{202e}x", "node\nsplit"];

/// Characters that must never reach a terminal from a CLI that shows stored names.
fn raw_hidden(text: &str) -> Vec<char> {
    text.chars()
        .filter(|&c| {
            (c.is_control() && c != '\n')
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}')
        })
        .collect()
}

/// Both streams of a CLI run, checked for raw control and bidi characters and, in human
/// output (not JSON, which keeps whole values), for lines holding the whole 100 KB name.
fn checked(what: &str, out: &Output) -> (String, String) {
    let json = what.starts_with("--json") || what.starts_with("tasks");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    for (stream, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        let found = raw_hidden(text);
        assert!(
            found.is_empty(),
            "`disbatch {what}` {stream} carries raw {found:?}:\n{text:?}"
        );
        assert!(
            json || text.lines().all(|l| l.chars().count() < 4096),
            "`disbatch {what}` {stream} has a line of the whole 100 KB name"
        );
    }
    (stdout, stderr)
}

/// A table command: one line per row of its `--json` answer, plus the header (and `extra`).
fn table_has_one_line_per_row(dci: &Dci, command: &str, extra: usize) -> String {
    let out = dci.cli(&[command]);
    assert!(out.status.success(), "{command}: {out:?}");
    let (table, _) = checked(command, &out);
    let json_out = dci.cli(&["--json", command]);
    let (json_text, _) = checked(&format!("--json {command}"), &json_out);
    let rows = serde_json::from_str::<Value>(&json_text)
        .unwrap_or_else(|e| panic!("--json {command} is not JSON ({e}): {json_text}"));
    let rows = rows.as_array().map_or(0, Vec::len);
    assert!(rows > 0, "{command}: {json_text}");
    assert_eq!(
        table.lines().count(),
        1 + rows + extra,
        "`disbatch {command}`: a row spread over several lines:\n{table}"
    );
    table
}

async fn insert_hostile_fleet(db: &TestDb) -> (Vec<ObjectId>, ObjectId) {
    let mut queues = Vec::new();
    for name in hostile_names() {
        queues.push(db.insert_queue(&name, "echo", 1).await);
    }
    for (i, node) in HOSTILE_NODES.iter().enumerate() {
        db.insert_node(node, Duration::from_secs(i as u64)).await;
    }
    // A finished task on a hostile node, whose params hold every kind of hostile text.
    let now = DateTime::now();
    let task = ObjectId::new();
    db.tasks()
        .insert_one(doc! {
            "_id": task, "queue": queues[0], "status": 1, "node": HOSTILE_NODES[0],
            "params": {"name": "<script>alert(1)</script>\u{1b}[2J\u{202e}\0", "q": &hostile_names()[3]},
            "ctime": now, "mtime": now, "stdout": "out\u{1b}[31m", "stderr": "", "complete": true,
        })
        .await
        .expect("insert task");
    (queues, task)
}

#[tokio::test]
async fn stored_names_are_escaped_in_cli_tables_metrics_and_html() {
    let db = TestDb::new("hostile_display").await;
    let config = write_config(&db, "web.json", json!({}));
    let (queues, task) = insert_hostile_fleet(&db).await;
    let dci = Dci::start(&config);

    check_the_cli_escapes_stored_names(&dci, &queues, task).await;

    check_the_metrics_escape_stored_names(&dci).await;

    // The HTML task page: names, params and output escaped, nothing injected.
    let html = dci
        .http
        .get(dci.at(&format!("/tasks/{}", task.to_hex())))
        .header("accept", "text/html")
        .send()
        .await
        .expect("task page")
        .text()
        .await
        .expect("body");
    assert!(
        html.contains("Disbatch Single Task Query Results"),
        "{html}"
    );
    for raw in ["<script", "<img", "\u{1b}", "\u{202e}", "\0"] {
        assert!(!html.contains(raw), "{raw:?} raw in {html}");
    }
    for shown in ["&lt;script&gt;", "\\u001b[2J", "\\u202e", "\\u0000"] {
        assert!(html.contains(shown), "{shown:?} not in {html}");
    }

    // What the console reads: JSON whose strings carry the names exactly, controls escaped.
    for path in ["/queues", "/nodes", "/tasks?.limit=10"] {
        let body = dci
            .http
            .get(dci.at(path))
            .send()
            .await
            .expect("console data")
            .text()
            .await
            .expect("body");
        assert!(
            !body.chars().any(|c| c.is_control()),
            "{path}: a raw control character"
        );
        serde_json::from_str::<Value>(&body).unwrap_or_else(|e| panic!("{path}: {e}"));
    }
    db.drop().await;
}

async fn check_the_cli_escapes_stored_names(dci: &Dci, queues: &[ObjectId], task: ObjectId) {
    // CLI tables: one line per row, escapes visible.
    let table = table_has_one_line_per_row(dci, "queues", 1);
    for shown in [
        "esc\\u{1b}[31mred",
        "nul\\u{0}name",
        "two\\u{a}lines",
        "rtl\\u{202e}txt.exe",
        "trailing\\u{20}\\u{20}",
        "…[+",
    ] {
        assert!(table.contains(shown), "{shown} not in\n{table}");
    }
    let nodes = table_has_one_line_per_row(dci, "nodes", 0);
    assert!(nodes.contains("node\\u{1b}]0;pwned\\u{7}"), "{nodes}");
    table_has_one_line_per_row(dci, "summary", 0);

    // JSON output: escaped as \uXXXX, the same values once parsed.
    let (json_text, _) = checked("--json queues", &dci.cli(&["--json", "queues"]));
    let parsed: Value = serde_json::from_str(&json_text).expect("JSON");
    let names: Vec<&str> = parsed
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|q| q["name"].as_str())
        .collect();
    for name in hostile_names() {
        assert!(names.contains(&name.as_str()), "{name:?} lost in --json");
    }
    let (tasks_text, _) = checked("tasks", &dci.cli(&["tasks", "{}", "--pretty"]));
    assert!(tasks_text.contains("\\u202e"), "{tasks_text}");

    // Messages quoting names: a success line (threads 1 → 2) and a server error.
    let out = dci.cli(&["update-queue", &queues[0].to_hex(), "threads", "2"]);
    assert!(out.status.success(), "{out:?}");
    checked("update-queue", &out);
    let out = dci.cli(&["delete-queue", "gone\u{1b}[2J\u{202e}"]);
    assert!(!out.status.success());
    let (_, stderr) = checked("delete-queue", &out);
    assert!(stderr.contains("\\u{1b}[2J"), "{stderr}");

    // The task's own output is printed raw, as documented.
    let out = dci.cli(&["stdout", &task.to_hex()]);
    assert_eq!(out.stdout, b"out\x1b[31m", "{out:?}");
}

async fn check_the_metrics_escape_stored_names(dci: &Dci) {
    // The DCI's /metrics: a valid exposition with no control or bidi character in it.
    let text = dci
        .http
        .get(dci.at("/metrics"))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("body");
    let e = exposition::check(&text).unwrap_or_else(|err| panic!("{err}\n{text:?}"));
    assert_eq!(hidden_characters(&text), vec![], "{text:?}");
    assert!(
        text.lines().all(|l| l.chars().count() < 1024),
        "a label is not cut"
    );
    for (label, threads) in [
        ("esc\\u{1b}[31mred", 2.0),
        ("nul\\u{0}name", 1.0),
        ("two\nlines", 1.0),
        ("rtl\\u{202e}txt.exe", 1.0),
        ("trailing\\u{20}\\u{20}", 1.0),
        ("<img src=x onerror=alert(1)>", 1.0),
    ] {
        assert_eq!(
            e.value("disbatch_queue_threads", &[("queue", label)]),
            Some(threads),
            "{label:?} in\n{text}"
        );
    }
    assert!(text.contains("…[+99748 chars #"), "{text}");
}

#[tokio::test]
async fn a_den_serving_hostile_queues_exposes_only_escaped_labels() {
    let db = TestDb::new("hostile_display_den").await;
    let config = write_config(&db, "node.json", json!({"metrics_listen": "127.0.0.1:0"}));
    let mut tasks = Vec::new();
    for name in hostile_names() {
        let queue = db.insert_queue(&name, "echo", 1).await;
        tasks.extend(db.insert_tasks(queue, vec![Bson::from(doc! {})]).await);
    }
    let den = Den::start(&config, "display-node");
    db.wait_complete(&tasks, Duration::from_secs(60)).await;

    let text = den.scrape().await;
    let e = exposition::check(&text).unwrap_or_else(|err| panic!("{err}\n{text:?}"));
    assert_eq!(hidden_characters(&text), vec![], "{text:?}");
    assert!(
        text.lines().all(|l| l.chars().count() < 1024),
        "a label is not cut"
    );
    for label in [
        "esc\\u{1b}[31mred",
        "nul\\u{0}name",
        "two\nlines",
        "rtl\\u{202e}txt.exe",
        "trailing\\u{20}\\u{20}",
    ] {
        assert_eq!(
            e.value("disbatch_den_claims_total", &[("queue", label)]),
            Some(1.0),
            "{label:?} in\n{text}"
        );
    }
    assert!(text.contains("…[+99748 chars #"), "{text}");
    drop(den);
    db.drop().await;
}
