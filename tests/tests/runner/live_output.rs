//! Live output: a running task's stdout so far through the real runner and the DCI route (the
//! CLI's `--follow` and the console: `live_output_views.rs`); the stored output stays as Disbatch
//! stores it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime};
use disbatch_model::status;
use disbatch_store::{
    FinishOutcome, LiveOutput, LiveStream, LiveWrite, OutputValue, Store, TaskEnd,
};
use disbatch_tests::{scaled, write_config, Backoff, Dci, Den, TestDb};
use serde_json::json;

/// One answer of `GET /tasks/:id/stdout`.
struct Answer {
    state: String,
    skipped: u64,
    total: u64,
    body: Vec<u8>,
}

async fn output(dci: &Dci, id: ObjectId, stream: &str) -> Answer {
    let r = dci
        .http
        .get(dci.at(&format!("/tasks/{}/{stream}", id.to_hex())))
        .send()
        .await
        .expect("GET output");
    assert!(r.status().is_success(), "{}", r.status());
    let header = |name: &str| {
        r.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let state = header("x-disbatch-output");
    let skipped = header("x-disbatch-output-skipped").parse().unwrap_or(0);
    let total = header("x-total-length").parse().expect("X-Total-Length");
    let body = r.bytes().await.expect("body").to_vec();
    Answer {
        state,
        skipped,
        total,
        body,
    }
}

fn now_ms() -> i64 {
    DateTime::now().timestamp_millis()
}

/// `line I MS` lines of the echo plugin in `text`: (I, MS).
pub(super) fn printed_lines(text: &str) -> Vec<(u64, i64)> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.strip_prefix("line ")?.split(' ');
            let i = parts.next()?.parse().ok()?;
            let ms = parts.next()?.trim_end_matches('x').parse().ok()?;
            Some((i, ms))
        })
        .collect()
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Gate files for the echo plugin's `hold_until`: it prints `lines` lines and waits for the
/// first gate, prints `lines` more and waits for the next, and so on. While a gate is shut the
/// task provably runs, so what the test sees then was shown while it ran, however slow the
/// machine is.
pub(super) fn gates(db: &TestDb, n: usize) -> (Vec<PathBuf>, Bson) {
    let paths: Vec<PathBuf> = (0..n).map(|i| db.path(&format!("gate-{i}"))).collect();
    let param = paths
        .iter()
        .map(|p| Bson::String(p.display().to_string()))
        .collect();
    (paths, Bson::Array(param))
}

pub(super) fn open(gate: &Path) {
    std::fs::write(gate, b"").expect("open the gate");
}

pub(super) async fn assert_running(db: &TestDb, id: ObjectId, what: &str) {
    let task = db.task(id).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::RUNNING),
        "{what}: {task}"
    );
}

/// What the route showed while the task ran: every live answer, the highest line seen, and
/// per line how long after its printing it was first seen (a figure, printed, not asserted).
#[derive(Default)]
struct Watched {
    live: Vec<Answer>,
    seen: u64,
    lags: Vec<i64>,
}

impl Watched {
    /// One answer of the route: the stored output, or None (a live answer is kept and its new
    /// lines timed; a waiting one is passed over).
    async fn ask(&mut self, dci: &Dci, id: ObjectId) -> Option<Answer> {
        let a = output(dci, id, "stdout").await;
        match a.state.as_str() {
            "final" => return Some(a),
            "live" => {
                let at = now_ms();
                for (i, ms) in printed_lines(&String::from_utf8_lossy(&a.body)) {
                    if i > self.seen {
                        self.seen = i;
                        self.lags.push(at - ms);
                    }
                }
                self.live.push(a);
            }
            other => assert_eq!(other, "waiting", "X-Disbatch-Output"),
        }
        None
    }

    /// Asks until line `k` is live. The task must not end first.
    async fn line(&mut self, dci: &Dci, id: ObjectId, k: u64) {
        let deadline = Instant::now() + scaled(Duration::from_secs(60));
        let mut backoff = Backoff::new();
        while self.seen < k {
            if let Some(a) = self.ask(dci, id).await {
                panic!("the task ended before line {k} was live: {} bytes", a.total);
            }
            assert!(Instant::now() < deadline, "line {k} never became live");
            backoff.wait().await;
        }
    }

    /// Asks until the stored output is served.
    async fn stored(&mut self, dci: &Dci, id: ObjectId) -> Answer {
        let deadline = Instant::now() + scaled(Duration::from_secs(60));
        let mut backoff = Backoff::new();
        loop {
            if let Some(a) = self.ask(dci, id).await {
                return a;
            }
            assert!(Instant::now() < deadline, "the task did not end");
            backoff.wait().await;
        }
    }

    fn print_lags(&mut self, what: &str) {
        self.lags.sort_unstable();
        if let Some(max) = self.lags.last() {
            println!(
                "{what}: live output lag over {} lines: p50 {} ms, max {max} ms",
                self.lags.len(),
                percentile(&self.lags, 0.5),
            );
        }
    }
}

#[tokio::test]
async fn a_running_tasks_output_is_readable_while_it_runs_and_stored_as_before() {
    let db = TestDb::new("live_inline").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("live", "echo", 1).await;
    let (gate, gate_param) = gates(&db, 2);
    let params = doc! {"lines": 3, "hold_until": gate_param.clone()};
    let ids = db.insert_tasks(queue, vec![params.clone().into()]).await;
    let dci = Dci::start(&config);
    let den = Den::start(&config, "n1");
    let mut w = Watched::default();
    w.line(&dci, ids[0], 3).await;
    assert_running(&db, ids[0], "lines 1-3 are live while the task waits").await;
    open(&gate[0]);
    // Only a later copy can show lines 4-6: the live view grows while the task runs.
    w.line(&dci, ids[0], 6).await;
    assert_running(&db, ids[0], "lines 4-6 are live while the task waits").await;
    open(&gate[1]);
    let last = w.stored(&dci, ids[0]).await;
    db.wait_complete(&ids, Duration::from_secs(30)).await;

    let lengths: Vec<u64> = w.live.iter().map(|a| a.total).collect();
    assert!(
        lengths.windows(2).all(|win| win[0] <= win[1]),
        "never shrinks: {lengths:?}"
    );
    for a in &w.live {
        assert_eq!(a.skipped, 0, "small output is kept whole");
        assert_eq!(a.body.len() as u64, a.total);
    }
    w.print_lags("inline");
    assert_eq!(w.lags.len(), 6, "every line was seen while the task ran");

    // Stored exactly as before: inline, the whole output, and no live copy left.
    let task = db.task(ids[0]).await;
    let Some(Bson::String(stdout)) = task.get("stdout") else {
        panic!("stdout is inline text: {task}");
    };
    assert_eq!(
        task.get("live_output"),
        None,
        "the live copy is gone: {task}"
    );
    assert_eq!(last.state, "final");
    assert_eq!(last.body, stdout.as_bytes());
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 7, "{stdout}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(lines[0]).expect("params line"),
        serde_json::to_value(&params).expect("params as JSON")
    );
    let numbered: Vec<u64> = printed_lines(stdout).iter().map(|(i, _)| *i).collect();
    assert_eq!(numbered, (1..=6).collect::<Vec<_>>());
    for a in &w.live {
        assert!(
            stdout.as_bytes().starts_with(&a.body),
            "what was live is where the output begins"
        );
    }
    drop(den);
    db.drop().await;
}

/// The node takes its runners' live copies on their relay pipes and writes them itself: the
/// runners of tasks that print never open a connection of their own, and the output is live
/// all the same. Every request is counted by a proxy in front of the server, which runs on
/// this test's runtime: a multi-thread one, so it serves while `Den::start` blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_output_goes_through_the_node_and_its_runners_never_connect() {
    use disbatch_tests::bench::proxy::{HostUri, Proxy};
    use disbatch_tests::exposition;
    let db = TestDb::new("live_relay").await;
    let server = HostUri::parse(&db.uri).expect("a single-host test server URI");
    let proxy = Proxy::start(server.host.clone()).await.expect("proxy");
    let config = write_config(
        &db,
        "node.json",
        json!({
            "mongohost": server.with_host(&proxy.addr.to_string()),
            "metrics_listen": "127.0.0.1:0",
        }),
    );
    let queue = db.insert_queue("live", "echo", 3).await;
    // A lease far longer than the test: a runner renews its lease over its own connection,
    // and that must not depend on how fast the machine gets through the gates.
    db.db
        .collection::<bson::Document>("queues")
        .update_one(doc! {"_id": queue}, doc! {"$set": {"lease": 3600}})
        .await
        .expect("queue lease");
    let (gate, gate_param) = gates(&db, 2);
    let params = doc! {"lines": 2, "hold_until": gate_param};
    let ids = db
        .insert_tasks(queue, (0..3).map(|_| params.clone().into()).collect())
        .await;
    let dci = Dci::start(&config);
    let den = Den::start(&config, "n1");
    // Each task shows two different live copies while it runs: six copies at least.
    let mut watched: Vec<Watched> = ids.iter().map(|_| Watched::default()).collect();
    for (w, id) in watched.iter_mut().zip(&ids) {
        w.line(&dci, *id, 2).await;
        assert_running(&db, *id, "lines 1-2 are live").await;
    }
    open(&gate[0]);
    for (w, id) in watched.iter_mut().zip(&ids) {
        w.line(&dci, *id, 4).await;
        assert_running(&db, *id, "lines 3-4 are live").await;
    }
    open(&gate[1]);
    let last = watched[0].stored(&dci, ids[0]).await;
    db.wait_complete(&ids, Duration::from_secs(60)).await;

    assert_eq!(last.state, "final");
    for a in &watched[0].live {
        assert!(
            last.body.starts_with(&a.body),
            "live is where the output begins"
        );
    }
    let counts = proxy.snapshot();
    let who: Vec<&String> = counts.app.keys().chain(counts.monitoring.keys()).collect();
    assert!(
        who.iter().any(|w| w.contains("disbatchd")),
        "the proxy saw the node: {who:?}"
    );
    assert!(
        !who.iter().any(|w| w.contains("task_runner")),
        "no runner connected: {:?}",
        counts.app
    );
    let text = reqwest::get(format!("{}/metrics", den.metrics_url().await))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("body");
    let e = exposition::check(&text).unwrap_or_else(|err| panic!("{err}\n{text}"));
    let copies = |result| {
        e.value("disbatch_den_live_copies_total", &[("result", result)])
            .unwrap_or(-1.0)
    };
    assert!(copies("written") >= 6.0, "{text}");
    assert_eq!(copies("dropped"), 0.0, "{text}");
    for id in &ids {
        let task = db.task(*id).await;
        assert_eq!(
            task.get_i32("status").ok(),
            Some(status::SUCCEEDED),
            "{task}"
        );
        assert_eq!(task.get("live_output"), None, "{task}");
    }
    drop(den);
    db.drop().await;
}

/// A runner whose node stops (SIGTERM leaves running tasks running) finds its pipe closed at
/// the next copy and writes its copies itself from then on, that copy included: the live
/// output keeps growing without the node, even when the output grows no more until the test
/// opens the next gate, and the result is stored whole.
#[tokio::test]
async fn a_runner_whose_node_stops_writes_its_live_output_itself() {
    let db = TestDb::new("live_orphan").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("live", "echo", 1).await;
    let (gate, gate_param) = gates(&db, 3);
    let ids = db
        .insert_tasks(
            queue,
            vec![doc! {"lines": 2, "hold_until": gate_param}.into()],
        )
        .await;
    let dci = Dci::start(&config);
    let mut den = Den::start(&config, "n1");
    let mut w = Watched::default();
    w.line(&dci, ids[0], 2).await;
    den.stop();
    let before = w.live.len();
    // Lines 3-4, then 5-6, can only reach the task through the runner's own writes now.
    open(&gate[0]);
    w.line(&dci, ids[0], 4).await;
    assert_running(&db, ids[0], "lines 3-4 are live without the node").await;
    open(&gate[1]);
    w.line(&dci, ids[0], 6).await;
    assert_running(&db, ids[0], "lines 5-6 are live without the node").await;
    open(&gate[2]);
    let last = w.stored(&dci, ids[0]).await;
    let mut totals: Vec<u64> = w.live[before - 1..].iter().map(|a| a.total).collect();
    totals.dedup();
    assert!(
        totals.len() >= 3,
        "the live output grew twice after the node stopped: {totals:?}"
    );
    db.wait_complete(&ids, Duration::from_secs(30)).await;
    let task = db.task(ids[0]).await;
    assert_eq!(
        task.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{task}"
    );
    assert_eq!(printed_lines(&String::from_utf8_lossy(&last.body)).len(), 6);
    db.drop().await;
}

#[tokio::test]
async fn large_live_output_keeps_its_last_64_kib_and_gridfs_output_is_unchanged() {
    let db = TestDb::new("live_gridfs").await;
    let config = write_config(&db, "node.json", json!({"gfs": true}));
    let queue = db.insert_queue("live", "echo", 1).await;
    // ~20 KB a line: 80 KB before the first gate, so a copy made then is capped at 64 KiB.
    let (gate, gate_param) = gates(&db, 2);
    let params = doc! {"lines": 4, "line_pad": 20000, "hold_until": gate_param};
    let ids = db.insert_tasks(queue, vec![params.into()]).await;
    let dci = Dci::start(&config);
    let den = Den::start(&config, "n1");
    let mut w = Watched::default();
    w.line(&dci, ids[0], 4).await;
    assert_running(&db, ids[0], "lines 1-4 are live").await;
    open(&gate[0]);
    w.line(&dci, ids[0], 8).await;
    assert_running(&db, ids[0], "lines 5-8 are live").await;
    open(&gate[1]);
    let last = w.stored(&dci, ids[0]).await;
    db.wait_complete(&ids, Duration::from_secs(30)).await;
    let live = w.live;

    let task = db.task(ids[0]).await;
    let Some(Bson::ObjectId(file)) = task.get("stdout") else {
        panic!("stdout is a GridFS file id: {:?}", task.get("stdout"));
    };
    assert_eq!(task.get("live_output"), None);
    let store = db.den_store().await;
    let stored = store
        .results()
        .read_output_file(*file)
        .await
        .expect("read GridFS");
    assert_eq!(last.state, "final");
    assert_eq!(last.body, stored, "the route serves the stored file");
    assert_eq!(printed_lines(&String::from_utf8_lossy(&stored)).len(), 8);

    let capped: Vec<&Answer> = live.iter().filter(|a| a.skipped > 0).collect();
    assert!(!capped.is_empty(), "the tail cap was reached");
    for a in &live {
        assert!(a.body.len() <= 64 * 1024, "{} bytes live", a.body.len());
        let (from, to) = (a.skipped as usize, a.total as usize);
        assert_eq!(
            a.body,
            stored[from..to],
            "the live copy is the output's bytes {from}..{to}"
        );
    }
    drop(den);
    db.drop().await;
}

/// A live copy of `attempt`'s output so far.
fn copy(attempt: ObjectId) -> LiveOutput {
    LiveOutput {
        attempt,
        stdout: LiveStream {
            text: "so far\n".into(),
            from: 0,
            bytes: 7,
        },
        stderr: LiveStream::default(),
    }
}

#[tokio::test]
async fn only_the_running_attempt_writes_live_output_and_the_result_removes_it() {
    let db = TestDb::new("live_fence").await;
    let store = db.den_store().await;
    let (id, attempt) = (ObjectId::new(), ObjectId::new());
    db.tasks()
        .insert_one(doc! {
            "_id": id, "queue": ObjectId::new(), "status": 0, "node": "n1", "attempt": attempt,
            "attempts": 1, "params": {}, "ctime": DateTime::now(), "mtime": DateTime::now(),
            "stdout": Bson::Null, "stderr": Bson::Null,
        })
        .await
        .expect("insert");
    let stale = store
        .results()
        .write_live_output(id, &copy(ObjectId::new()))
        .await
        .expect("write");
    assert_eq!(stale, LiveWrite::NotOurs);
    assert_eq!(db.task(id).await.get("live_output"), None);
    let ours = store
        .results()
        .write_live_output(id, &copy(attempt))
        .await
        .expect("write");
    assert_eq!(ours, LiveWrite::Written);
    let task = db.task(id).await;
    let live = task.get_document("live_output").expect("live_output");
    assert_eq!(live.get_object_id("attempt").ok(), Some(attempt));
    assert_eq!(
        live.get_document("stdout")
            .expect("stdout")
            .get_str("text")
            .ok(),
        Some("so far\n")
    );

    let finished = store
        .results()
        .finish_task(
            id,
            "n1",
            attempt,
            TaskEnd::Status(1),
            OutputValue::Text("so far\nand the rest\n".into()),
            OutputValue::Null,
        )
        .await
        .expect("finish");
    assert_eq!(finished, FinishOutcome::Recorded);
    let task = db.task(id).await;
    assert_eq!(task.get("live_output"), None, "unset with the result");
    assert_eq!(task.get_str("stdout").ok(), Some("so far\nand the rest\n"));
    let late = store
        .results()
        .write_live_output(id, &copy(attempt))
        .await
        .expect("write");
    assert_eq!(late, LiveWrite::NotOurs, "an ended task takes no live copy");
    assert_eq!(db.task(id).await.get("live_output"), None);

    check_recovery_unsets_a_lost_attempts_copy(&db, &store).await;

    check_a_copy_too_large_is_refused(&db, &store).await;
    db.drop().await;
}

async fn check_recovery_unsets_a_lost_attempts_copy(db: &TestDb, store: &Store) {
    // A lost attempt's copy goes with the recovery that requeues its task.
    let (lost, lost_attempt) = (ObjectId::new(), ObjectId::new());
    db.tasks()
        .insert_one(doc! {
            "_id": lost, "queue": ObjectId::new(), "status": 0, "node": "n1",
            "attempt": lost_attempt, "attempts": 1, "params": {},
            "ctime": DateTime::now(), "mtime": DateTime::now(),
            "lease_until": DateTime::from_millis(DateTime::now().timestamp_millis() - 60_000),
        })
        .await
        .expect("insert lost");
    let wrote = store
        .results()
        .write_live_output(lost, &copy(lost_attempt))
        .await;
    assert_eq!(wrote.expect("write"), LiveWrite::Written);
    let expired = store.recovery().expired_leases(10).await.expect("expired");
    let t = expired
        .iter()
        .find(|t| t.id == lost)
        .expect("the lost task");
    let recovered = store
        .recovery()
        .recover_task(
            t,
            disbatch_store::Recovery::Requeue {
                keep_key_slot: false,
            },
            "test",
        )
        .await
        .expect("recover");
    assert!(recovered);
    let task = db.task(lost).await;
    assert_eq!(task.get_i32("status").ok(), Some(status::QUEUED));
    assert_eq!(task.get("live_output"), None, "unset by recovery");
}

async fn check_a_copy_too_large_is_refused(db: &TestDb, store: &Store) {
    // A document near 16 MiB: the server refuses the copy, and nothing else changes.
    let (big, big_attempt) = (ObjectId::new(), ObjectId::new());
    db.tasks()
        .insert_one(doc! {
            "_id": big, "status": 0, "node": "n1", "attempt": big_attempt,
            "params": {"blob": "x".repeat(16 * 1024 * 1024 - 40 * 1024)},
        })
        .await
        .expect("insert big");
    let mut huge = copy(big_attempt);
    huge.stdout.text = "y".repeat(64 * 1024);
    huge.stderr.text = "z".repeat(64 * 1024);
    let refused = store
        .results()
        .write_live_output(big, &huge)
        .await
        .expect("write");
    assert_eq!(refused, LiveWrite::TooLarge);
}
