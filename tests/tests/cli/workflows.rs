//! The CLI's workflow verbs against a real DCI and DEN: `graph --create FILE`, `graph ID`
//! (state, counts, one row per task with what it waits on), `graphs`, `graph ID --wait` (kept
//! waiting while a task is held, then exit 0 / 8 failed / 9 cancelled), `graph ID --cancel`,
//! and the same for batches with a callback; clear errors for bad ids and files.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use bson::oid::ObjectId;
use disbatch_tests::{bin_path, read_lines, scaled, wait_for, write_config, Dci, Den, TestDb};
use serde_json::{json, Value};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "disbatch failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// `disbatch ARGS` as a child the test can watch; killed if the test ends first.
fn spawn(dci: &Dci, args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(bin_path("disbatch"))
        .arg("--url")
        .arg(&dci.url)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run disbatch")
}

/// Waits for a `--wait` to end on its own: a wait that never ends fails the test instead of
/// hanging it.
async fn finished(child: tokio::process::Child, what: &str) -> Output {
    tokio::time::timeout(scaled(Duration::from_secs(120)), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{what} did not end"))
        .expect("disbatch output")
}

async fn run(dci: &Dci, args: &[&str]) -> Output {
    finished(spawn(dci, args), &format!("disbatch {args:?}")).await
}

fn write_json(db: &TestDb, name: &str, value: Value) -> String {
    let path = db.path(name);
    std::fs::write(&path, value.to_string()).expect("write the file");
    path.to_string_lossy().into_owned()
}

/// The id in "Created graph ID with …" / "Created batch ID with …".
fn created_id(out: &str) -> String {
    let id = out
        .split_whitespace()
        .nth(2)
        .unwrap_or_else(|| panic!("no id in {out:?}"));
    assert!(ObjectId::parse_str(id).is_ok(), "{out}");
    id.to_string()
}

/// The table row of the task named `name`, split into its cells.
fn row<'a>(out: &'a str, name: &str) -> Vec<&'a str> {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row for {name} in:\n{out}"))
        .split_whitespace()
        .collect()
}

fn start(db: &TestDb) -> (Dci, Den) {
    let config = write_config(db, "node.json", json!({}));
    let dci = Dci::start(&config);
    let den = Den::start(&config, "wf-node");
    (dci, den)
}

#[tokio::test]
async fn graphs_are_created_shown_waited_for_and_cancelled_from_the_cli() {
    let db = TestDb::new("cli_workflows_graph").await;
    db.insert_queue("w", "echo", 4).await;
    let (dci, _den) = start(&db);
    let started = db.path("started.txt");
    let gate = db.path("gate");
    let held =
        json!({"append_to": started.to_string_lossy(), "hold_until": gate.to_string_lossy()});
    let file = write_json(
        &db,
        "diamond.json",
        json!({"tasks": [
            {"name": "fetch", "queue": "w", "params": held},
            {"name": "left", "queue": "w", "depends_on": ["fetch"]},
            {"name": "right", "queue": "w", "depends_on": ["fetch"]},
            {"name": "join", "queue": "w", "depends_on": ["left", "right"]},
        ]}),
    );
    let created = ok(&run(&dci, &["graph", "--create", &file]).await);
    assert!(created.contains("with 4 tasks:"), "{created}");
    let id = created_id(&created);
    assert!(ok(&run(&dci, &["graphs"]).await).contains(&id));

    check_a_held_graph_waits_and_then_succeeds(&dci, &id, &started, &gate).await;

    check_a_failure_cancels_its_dependents_and_exits_8(&db, &dci).await;

    check_a_cancel_stops_the_running_task_and_exits_9(&db, &dci, &started, &gate, &held).await;

    check_errors_exit_by_their_class(&db, &dci).await;
    drop(dci);
    db.drop().await;
}

async fn check_a_held_graph_waits_and_then_succeeds(
    dci: &Dci,
    id: &str,
    started: &Path,
    gate: &Path,
) {
    // While the first task is held: the rest wait, and say on what.
    wait_for(
        "the held task to start",
        Duration::from_secs(60),
        || async { !read_lines(started).is_empty() },
    )
    .await;
    let shown = ok(&run(dci, &["graph", id]).await);
    assert!(
        shown.starts_with(&format!("graph {id}: active\n")),
        "{shown}"
    );
    assert!(shown.contains("counts: 1 running, 3 blocked"), "{shown}");
    assert_eq!(
        row(&shown, "join")[3..],
        ["blocked", "left,", "right"],
        "{shown}"
    );
    assert_eq!(row(&shown, "left")[3..], ["blocked", "fetch"], "{shown}");
    assert_eq!(row(&shown, "fetch")[2..], ["w", "running"], "{shown}");

    // --wait keeps waiting while the graph is active, and exits 0 once all succeeded.
    let mut waiting = spawn(dci, &["graph", id, "--wait", "--interval", "0.2"]);
    assert!(
        waiting.try_wait().expect("try_wait").is_none(),
        "--wait ended while a task was held"
    );
    std::fs::write(gate, "").expect("open the gate");
    let done = finished(waiting, "graph --wait").await;
    assert_eq!(done.status.code(), Some(0), "{done:?}");
    let out = text(&done.stdout);
    assert!(
        out.starts_with(&format!("graph {id}: succeeded\n")),
        "{out}"
    );
    assert!(out.contains("counts: 4 succeeded\n"), "{out}");
    for name in ["fetch", "left", "right", "join"] {
        assert_eq!(row(&out, name)[3], "succeeded", "{out}");
    }
    let raw = ok(&run(dci, &["--json", "graph", id]).await);
    let raw: Value = serde_json::from_str(&raw).expect("--json is JSON");
    assert_eq!(raw["state"], "succeeded");
}

async fn check_a_failure_cancels_its_dependents_and_exits_8(db: &TestDb, dci: &Dci) {
    // A failure: its dependents are cancelled with the reason, and --wait exits 8.
    let file = write_json(
        db,
        "failing.json",
        json!([
            {"name": "root", "queue": "w"},
            {"name": "bad", "queue": "w", "params": {"exit_code": 1}, "depends_on": ["root"]},
            {"name": "after", "queue": "w", "depends_on": ["bad"]},
            {"name": "beside", "queue": "w", "depends_on": ["root"]},
        ]),
    );
    let failed = run(dci, &["graph", "--create", &file, "--wait"]).await;
    assert_eq!(failed.status.code(), Some(8), "{failed:?}");
    let out = text(&failed.stdout);
    let id = created_id(&out);
    assert!(out.contains(&format!("graph {id}: failed\n")), "{out}");
    assert!(
        out.contains("counts: 2 succeeded, 1 failed, 1 cancelled"),
        "{out}"
    );
    assert_eq!(row(&out, "bad")[3], "failed", "{out}");
    let after = row(&out, "after");
    assert_eq!(after[3], "cancelled", "{out}");
    assert!(
        after.contains(&"failed"),
        "the reason names the failure: {out}"
    );
    assert!(
        text(&failed.stderr).contains(&format!("graph {id} failed")),
        "{failed:?}"
    );
    let json_wait = run(dci, &["--json", "graph", &id, "--wait"]).await;
    assert_eq!(json_wait.status.code(), Some(8));
    let last: Value = serde_json::from_slice(&json_wait.stdout).expect("one JSON document");
    assert_eq!(last["state"], "failed");
}

async fn check_a_cancel_stops_the_running_task_and_exits_9(
    db: &TestDb,
    dci: &Dci,
    started: &Path,
    gate: &Path,
    held: &Value,
) {
    // Cancelled while a task runs: the runner stops it, and --wait exits 9.
    std::fs::remove_file(gate).expect("close the gate");
    let file = write_json(
        db,
        "cancelled.json",
        json!({"tasks": [
            {"name": "slow", "queue": "w", "params": held},
            {"name": "next", "queue": "w", "depends_on": ["slow"]},
        ]}),
    );
    let id = created_id(&ok(&run(dci, &["graph", "--create", &file]).await));
    wait_for(
        "the second held task to start",
        Duration::from_secs(60),
        || async { read_lines(started).len() >= 2 },
    )
    .await;
    let cancelled = run(dci, &["graph", &id, "--cancel", "--wait"]).await;
    assert_eq!(cancelled.status.code(), Some(9), "{cancelled:?}");
    let out = text(&cancelled.stdout);
    assert!(
        out.starts_with(&format!(
            "Cancelled graph {id}: 1 task cancelled, 1 running task asked to stop.\n"
        )),
        "{out}"
    );
    assert!(out.contains(&format!("graph {id}: cancelled\n")), "{out}");
}

async fn check_errors_exit_by_their_class(db: &TestDb, dci: &Dci) {
    // Errors say what is wrong, with the status of their class.
    let missing = run(dci, &["graph", &ObjectId::new().to_hex()]).await;
    assert_eq!(missing.status.code(), Some(3), "{missing:?}");
    assert!(text(&missing.stderr).contains("no graph"), "{missing:?}");
    let bad_id = run(dci, &["graph", "nope"]).await;
    assert_eq!(bad_id.status.code(), Some(2), "{bad_id:?}");
    assert!(
        text(&bad_id.stderr).contains("not a graph id"),
        "{bad_id:?}"
    );
    let not_json = db.path("bad.json");
    std::fs::write(&not_json, "{").expect("write");
    let refused = run(dci, &["graph", "--create", &not_json.to_string_lossy()]).await;
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(text(&refused.stderr).contains("not JSON"), "{refused:?}");
    let cycle = write_json(
        db,
        "cycle.json",
        json!([{"name": "a", "queue": "w", "depends_on": ["b"]},
               {"name": "b", "queue": "w", "depends_on": ["a"]}]),
    );
    let refused = run(dci, &["graph", "--create", &cycle]).await;
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    assert!(text(&refused.stderr).contains("POST"), "{refused:?}");
}

#[tokio::test]
async fn batches_wait_for_their_callback_and_exit_by_their_outcome() {
    let db = TestDb::new("cli_workflows_batch").await;
    let queue = db.insert_queue("w", "echo", 4).await;
    let (dci, _den) = start(&db);
    let file = write_json(
        &db,
        "batch.json",
        json!({
            "tasks": [{"queue": "w", "params": {"n": 1}}, {"queue": "w", "params": {"n": 2}},
                      {"queue": queue.to_hex(), "params": {"n": 3}}],
            "callback": {"queue": "w", "params": {"report": true}},
        }),
    );
    let made = run(&dci, &["batch", "--create", &file, "--wait"]).await;
    assert_eq!(made.status.code(), Some(0), "{made:?}");
    let out = text(&made.stdout);
    assert!(out.contains("with 3 tasks, callback "), "{out}");
    let id = created_id(&out);
    assert!(out.contains(&format!("batch {id}: succeeded\n")), "{out}");
    assert!(out.contains("counts: 3 succeeded\n"), "{out}");
    let callback_line = out
        .lines()
        .find(|l| l.starts_with("callback: "))
        .unwrap_or_else(|| panic!("no callback line in {out}"));
    let callback: Vec<&str> = callback_line.split_whitespace().collect();
    assert_eq!(callback[2..], ["succeeded", "in", "w"], "{out}");
    // It ran after every member and was told how they ended.
    let task = db
        .task(ObjectId::parse_str(callback[1]).expect("callback id"))
        .await;
    let outcome = task
        .get_document("params")
        .and_then(|p| p.get_document("batch"))
        .unwrap_or_else(|e| panic!("no batch outcome in {task}: {e}"));
    assert_eq!(outcome.get_i64("succeeded").ok(), Some(3), "{outcome}");
    assert!(out.trim_end().ends_with("3 tasks."), "{out}");

    // A failed member: the callback still runs, and the batch has failed.
    let file = write_json(
        &db,
        "failing.json",
        json!({"tasks": [{"queue": "w"}, {"queue": "w", "params": {"exit_code": 3}}],
               "callback": {"queue": "w"}}),
    );
    let failed = run(&dci, &["batch", "--create", &file, "--wait"]).await;
    assert_eq!(failed.status.code(), Some(8), "{failed:?}");
    let out = text(&failed.stdout);
    let failed_id = created_id(&out);
    assert!(out.contains("counts: 1 succeeded, 1 failed\n"), "{out}");
    assert!(
        out.contains("callback: ") && out.contains(" succeeded in w"),
        "{out}"
    );

    // Just the members' array, no callback; then cancelled before any can run (paused).
    ok(&run(&dci, &["pause", "w"]).await);
    let file = write_json(&db, "members.json", json!([{"queue": "w"}, {"queue": "w"}]));
    let created = ok(&run(&dci, &["batch", "--create", &file]).await);
    assert!(created.ends_with("with 2 tasks.\n"), "{created}");
    let paused_id = created_id(&created);
    let cancelled = run(&dci, &["batch", &paused_id, "--cancel", "--wait"]).await;
    assert_eq!(cancelled.status.code(), Some(9), "{cancelled:?}");
    let out = text(&cancelled.stdout);
    assert!(
        out.contains("2 tasks cancelled, 0 running tasks asked to stop"),
        "{out}"
    );
    assert!(out.contains("callback: none"), "{out}");
    assert!(out.contains("counts: 2 cancelled"), "{out}");

    let listed = ok(&run(&dci, &["batches", "--limit", "5"]).await);
    for batch in [&id, &failed_id, &paused_id] {
        assert!(listed.contains(batch.as_str()), "{listed}");
    }
    assert!(listed.trim_end().ends_with("3 batches."), "{listed}");
    let missing = run(&dci, &["batch", &ObjectId::new().to_hex(), "--wait"]).await;
    assert_eq!(missing.status.code(), Some(3), "{missing:?}");
    drop(dci);
    db.drop().await;
}
