//! Live output as its readers see it, the CLI's `--follow` and the console's task page, and what it
//! costs the runner.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bson::doc;
use disbatch_model::status;
use disbatch_tests::{
    bin_path, scaled, wait_for, write_config, Backoff, Browser, Dci, Den, TestDb,
};
use serde_json::json;

use super::live_output::{assert_running, gates, open, printed_lines};

#[tokio::test]
async fn cli_follow_prints_the_output_as_it_comes_and_exits_when_the_task_ends() {
    let db = TestDb::new("live_cli").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("live", "echo", 1).await;
    let (gate, gate_param) = gates(&db, 2);
    let params = doc! {"lines": 2, "stderr": "to stderr\n", "hold_until": gate_param};
    let ids = db.insert_tasks(queue, vec![params.into()]).await;
    let dci = Dci::start(&config);
    let asked = || async {
        let r = dci.http.get(dci.at("/metrics")).send().await;
        let text = r.expect("GET /metrics").text().await.expect("metrics");
        text.lines()
            .filter(|l| {
                l.starts_with("disbatch_web_http_requests_total{")
                    && l.contains("route=\"/tasks/{id}/stdout\"")
                    && l.contains("status=\"2xx\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let before = asked().await;
    let mut child = Command::new(bin_path("disbatch"))
        .args(["--url", &dci.url, "stdout", &ids[0].to_hex(), "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run disbatch");
    let mut pipe = child.stdout.take().expect("stdout");
    let printed = Arc::new(Mutex::new(Vec::new()));
    let reader = {
        let printed = printed.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0; 65536];
            while let Ok(n @ 1..) = pipe.read(&mut buf) {
                printed
                    .lock()
                    .expect("printed")
                    .extend_from_slice(&buf[..n]);
            }
        })
    };
    // The CLI has asked while the task waits to run (no node yet): it waits, then follows.
    wait_for(
        "--follow to ask for the queued task's output",
        Duration::from_secs(30),
        || async { asked().await > before },
    )
    .await;
    let den = Den::start(&config, "n1");
    let shown = |k: u64| {
        let printed = printed.clone();
        async move {
            let text = String::from_utf8_lossy(&printed.lock().expect("printed")).into_owned();
            printed_lines(&text).iter().any(|(i, _)| *i >= k)
        }
    };
    wait_for("--follow to print line 2", Duration::from_secs(60), || {
        shown(2)
    })
    .await;
    assert_running(&db, ids[0], "--follow printed lines 1-2 while the task ran").await;
    open(&gate[0]);
    wait_for("--follow to print line 4", Duration::from_secs(60), || {
        shown(4)
    })
    .await;
    assert_running(&db, ids[0], "--follow printed lines 3-4 while the task ran").await;
    open(&gate[1]);
    let deadline = Instant::now() + scaled(Duration::from_secs(60));
    let mut backoff = Backoff::new();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "--follow never exited");
        backoff.wait().await;
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(status.success(), "--follow failed: {err}");
    reader.join().expect("reader");
    let printed = printed.lock().expect("printed").clone();
    let task = db.task(ids[0]).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{task}"
    );
    assert_eq!(
        String::from_utf8_lossy(&printed),
        task.get_str("stdout").expect("inline stdout"),
        "everything, once, in order"
    );
    // Followed stderr of an ended task: all of it at once.
    let stderr = dci.cli(&["stderr", &ids[0].to_hex(), "--follow"]);
    assert!(stderr.status.success());
    assert_eq!(String::from_utf8_lossy(&stderr.stdout), "to stderr\n");
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn the_task_page_tails_a_running_tasks_output() {
    let db = TestDb::new("live_ui").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("live", "echo", 1).await;
    let (gate, gate_param) = gates(&db, 2);
    let params = doc! {"lines": 3, "stderr": "<b>not bold</b>\n", "hold_until": gate_param};
    let ids = db.insert_tasks(queue, vec![params.into()]).await;
    let dci = Dci::start(&config);
    let den = Den::start(&config, "n1");
    let b = Browser::start(1280, 800).await;
    b.open(&format!("{}/#/task/{}", dci.url, ids[0].to_hex()), "task")
        .await;
    b.wait_text("#task-stdout", "first lines", |t| t.contains("line 2 "))
        .await;
    let range = b
        .wait_text(
            "section.output-panel[data-stream=\"stdout\"] .range",
            "live range",
            |t| t.starts_with("live"),
        )
        .await;
    let earlier = b
        .find("#task-stdout")
        .await
        .text()
        .await
        .unwrap_or_default();
    open(&gate[0]);
    let later = b
        .wait_text("#task-stdout", "more lines", |t| t.contains("line 6 "))
        .await;
    assert!(
        later.starts_with(&earlier),
        "appended: {earlier:?} then {later:?}"
    );
    let running = db.task(ids[0]).await;
    assert_eq!(
        running.get_i32("status").ok(),
        Some(status::RUNNING),
        "still running"
    );
    assert!(running.get_document("live_output").is_ok(), "{running}");
    // What the page polls: a terse search, which leaves the live copy's text out.
    let (code, found) = dci
        .get(&format!("/tasks?id={}&.terse=1", ids[0].to_hex()))
        .await;
    let found = found.to_string();
    assert_eq!(code, 200, "{found}");
    assert!(
        found.contains("[terse mode]") && !found.contains("line 1 "),
        "{found}"
    );
    b.screenshot("task-live-output").await;
    println!("live range while running: {range}");
    open(&gate[1]);
    db.wait_complete(&ids, Duration::from_secs(30)).await;
    b.wait_text(
        "section.output-panel[data-stream=\"stdout\"] .range",
        "stored output",
        |t| t.starts_with("showing bytes"),
    )
    .await;
    let stderr = b
        .find("#task-stderr")
        .await
        .text()
        .await
        .unwrap_or_default();
    assert_eq!(stderr.trim(), "<b>not bold</b>", "shown as text");
    let whole = b
        .find("#task-stdout")
        .await
        .text()
        .await
        .unwrap_or_default();
    assert!(whole.contains("line 6 "), "the whole output: {whole:?}");
    b.screenshot("task-live-output-ended").await;
    drop(den);
    b.close().await;
    db.drop().await;
}

/// What live output costs the runner: CPU of the node's reaped children (runners and their
/// plugins, which sleep) per task, for tasks that print a line every 250 ms for 3 s. Run
/// with `--ignored --nocapture`; `DISBATCH_LIVE_BENCH_RUNNER=PATH` measures another runner
/// (a build without live output) the same way.
#[tokio::test]
#[ignore]
async fn live_output_cpu_per_task() {
    use disbatch_tests::bench::procfs::{clock_ticks, cpu_ticks};
    let tasks: usize = std::env::var("DISBATCH_LIVE_BENCH_TASKS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(40);
    let db = TestDb::new("live_bench").await;
    let runner = std::env::var("DISBATCH_LIVE_BENCH_RUNNER")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| bin_path("disbatch-task-runner"));
    let config = write_config(&db, "node.json", json!({"task_runner": runner}));
    let queue = db.insert_queue("live", "echo", 8).await;
    // DISBATCH_LIVE_BENCH_PARAMS: other params, e.g. `{"lines": 1, "sleep_ms": 3000}`.
    let params: bson::Document = match std::env::var("DISBATCH_LIVE_BENCH_PARAMS") {
        Ok(text) => {
            let value: serde_json::Value = serde_json::from_str(&text).expect("params JSON");
            bson::to_document(&value).expect("params object")
        }
        Err(_) => doc! {"lines": 12, "line_ms": 250},
    };
    let ids = db
        .insert_tasks(queue, (0..tasks).map(|_| params.clone().into()).collect())
        .await;
    let den = Den::start(&config, "n1");
    let pid = den.pid().as_raw() as u32;
    let before = cpu_ticks(pid).expect("stat");
    let started = Instant::now();
    db.wait_complete(&ids, Duration::from_secs(300)).await;
    // The last runners are reaped a moment after their results land.
    wait_for(
        "the node to reap its runners",
        Duration::from_secs(60),
        || async { den.metric("disbatch_den_runners{queue=\"live\"}").await == 0.0 },
    )
    .await;
    let after = cpu_ticks(pid).expect("stat");
    let ms = |ticks: u64| ticks as f64 * 1000.0 / clock_ticks();
    let children = ms(after.children - before.children);
    println!(
        "runner {} ({params}): {tasks} tasks in {:.1} s; runners+plugins {:.1} ms CPU per task; node {:.1} ms per task",
        runner.display(),
        started.elapsed().as_secs_f64(),
        children / tasks as f64,
        ms(after.own - before.own) / tasks as f64,
    );
    for id in &ids {
        let task = db.task(*id).await;
        assert_eq!(
            task.get_i32("status").ok(),
            Some(status::SUCCEEDED),
            "{task}"
        );
        assert_eq!(task.get("live_output"), None);
    }
    drop(den);
    db.drop().await;
}
