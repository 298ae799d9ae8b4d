//! Flow limits across real DENs: a queue's rate limit (whole and partitioned) and its per-key
//! concurrency hold across several nodes, one of them killed, judged from the attempts'
//! records (start and end of every run), not from any node's view.

use std::collections::HashMap;
use std::time::Duration;

use bson::oid::ObjectId;
use bson::{doc, Document};
use disbatch_model::status;
use disbatch_tests::claim_order::wait_sharers;
use disbatch_tests::wait_runner_of;
use disbatch_tests::{wait_for, write_config, Den, TestDb};
use futures::TryStreamExt;
use nix::sys::signal::{kill, Signal};
use serde_json::json;

/// Every attempt record of `queue`: (task, start ms, end ms), by start.
async fn attempts(db: &TestDb, queue: ObjectId) -> Vec<(ObjectId, i64, i64)> {
    let found: Vec<Document> = db
        .db
        .collection::<Document>("attempts")
        .find(doc! {"queue": queue})
        .await
        .expect("read attempts")
        .try_collect()
        .await
        .expect("attempts");
    let mut runs: Vec<(ObjectId, i64, i64)> = found
        .iter()
        .filter_map(|a| {
            let task = a.get_object_id("task").ok()?;
            let start = a.get_datetime("start").ok()?.timestamp_millis();
            let end = a.get_datetime("end").ok()?.timestamp_millis();
            Some((task, start, end))
        })
        .collect();
    runs.sort_by_key(|r| (r.1, r.0));
    runs
}

/// The most starts any `per` long stretch holds (a stretch starting at each start).
fn most_in_any_window(starts: &[i64], per_ms: i64) -> usize {
    let mut most = 0;
    let mut j = 0;
    for i in 0..starts.len() {
        while j < starts.len() && starts[j] < starts[i] + per_ms {
            j += 1;
        }
        most = most.max(j - i);
    }
    most
}

/// Starts per second over the whole periods from the first start: the starts in the first
/// `k` periods after it, over `k` periods, `k` as many as fit before the last start. A limit
/// that bursts its budget at each period's start and one that spreads it are judged alike.
fn sustained_rate(starts: &[i64], per_ms: i64) -> f64 {
    let (Some(first), Some(last)) = (starts.first(), starts.last()) else {
        return 0.0;
    };
    let periods = (last - first) / per_ms;
    if periods == 0 {
        return 0.0;
    }
    let end = first + periods * per_ms;
    let within = starts.iter().filter(|s| **s < end).count();
    within as f64 / ((periods * per_ms) as f64 / 1000.0)
}

async fn count_attempts(db: &TestDb, queue: ObjectId) -> u64 {
    db.db
        .collection::<Document>("attempts")
        .count_documents(doc! {"queue": queue})
        .await
        .expect("count attempts")
}

/// Starts `n` DENs (n1, n2, …) on the closed queue, waits until each has seen all of them
/// as sharers of it, then opens it to `threads`: every node claims from the first pass.
async fn start_fleet(
    db: &TestDb,
    config: &std::path::Path,
    queue: ObjectId,
    (name, n): (&str, usize),
    threads: i32,
) -> Vec<Den> {
    let dens: Vec<Den> = (1..=n)
        .map(|i| Den::start(config, &format!("n{i}")))
        .collect();
    wait_sharers(&dens.iter().collect::<Vec<_>>(), name, n).await;
    db.set_threads(queue, threads).await;
    dens
}

#[tokio::test]
async fn a_rate_limit_holds_across_four_dens_one_of_them_killed() {
    let db = TestDb::new("ratefour").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("rated", "echo", 0).await;
    db.set_queue(
        queue,
        doc! {
            "rate_limit": {"starts": 50, "per_s": 10},
            // The killed node's runs come back within a few seconds, and run again.
            "lease": 3, "on_lost": "requeue",
        },
    )
    .await;
    // A two-minute backlog at the limit, and more, so it never runs dry.
    let ids = db
        .insert_tasks(
            queue,
            (0..700)
                .map(|i| doc! {"i": i, "sleep_ms": 50}.into())
                .collect(),
        )
        .await;
    let mut dens = start_fleet(&db, &config, queue, ("rated", 4), 64).await;
    wait_for(
        "the first minute's starts",
        Duration::from_secs(300),
        || async { count_attempts(&db, queue).await >= 300 },
    )
    .await;
    dens[3].kill_hard();
    wait_for("two minutes' starts", Duration::from_secs(400), || async {
        count_attempts(&db, queue).await >= 600
    })
    .await;
    let mut unused = 0.0;
    for den in &dens[..3] {
        unused += den
            .metric("disbatch_den_limit_holds_total{queue=\"rated\",limit=\"unused_grant\"}")
            .await;
    }
    eprintln!("starts granted whose claims went to another node (given back): {unused}");
    drop(dens);
    let runs = attempts(&db, queue).await;
    let starts: Vec<i64> = runs.iter().map(|r| r.1).collect();
    let most = most_in_any_window(&starts, 10_000);
    let rate = sustained_rate(&starts, 10_000);
    let on_killed = db.count(doc! {"queue": queue, "node": "n4"}).await;
    eprintln!(
        "rate limit 50 per 10 s, 4 DENs (n4 killed): {} starts over {:.1} s, most in any 10 s: {most}, sustained {rate:.3}/s ({:.1}% of 5/s); tasks last on n4: {on_killed}",
        starts.len(),
        (starts.last().unwrap_or(&0) - starts.first().unwrap_or(&0)) as f64 / 1000.0,
        rate / 5.0 * 100.0,
    );
    assert!(most <= 50, "{most} starts in one 10 s window");
    assert!(rate >= 0.95 * 5.0, "sustained {rate}/s, under 95% of 5/s");
    assert!(ids.len() >= 600);
    db.drop().await;
}

#[tokio::test]
async fn partitions_have_their_own_budgets_and_a_noisy_one_slows_no_other() {
    let db = TestDb::new("ratepart").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("parted", "echo", 0).await;
    db.set_queue(
        queue,
        doc! {"rate_limit": {"starts": 20, "per_s": 5, "partition": "params.customer"}},
    )
    .await;
    // The noisy customer's backlog is queued first: ahead of every other task.
    db.insert_tasks(
        queue,
        (0..10_000)
            .map(|i| doc! {"customer": "noisy", "i": i}.into())
            .collect(),
    )
    .await;
    let mut quiet = Vec::new();
    for i in 0..100 {
        for customer in ["b", "c"] {
            quiet.push(doc! {"customer": customer, "i": i}.into());
        }
    }
    let quiet_ids = db.insert_tasks(queue, quiet).await;
    let dens = start_fleet(&db, &config, queue, ("parted", 2), 40).await;
    db.wait_complete(&quiet_ids, Duration::from_secs(300)).await;
    drop(dens);
    let runs = attempts(&db, queue).await;
    let customer_of: HashMap<ObjectId, String> = {
        let tasks: Vec<Document> = db
            .tasks()
            .find(doc! {"queue": queue, "status": {"$ne": status::QUEUED}})
            .projection(doc! {"params.customer": 1})
            .await
            .expect("tasks")
            .try_collect()
            .await
            .expect("tasks");
        tasks
            .iter()
            .filter_map(|t| {
                let id = t.get_object_id("_id").ok()?;
                let c = t.get_document("params").ok()?.get_str("customer").ok()?;
                Some((id, c.to_string()))
            })
            .collect()
    };
    for customer in ["noisy", "b", "c"] {
        let starts: Vec<i64> = runs
            .iter()
            .filter(|r| customer_of.get(&r.0).map(String::as_str) == Some(customer))
            .map(|r| r.1)
            .collect();
        let most = most_in_any_window(&starts, 5_000);
        let rate = sustained_rate(&starts, 5_000);
        eprintln!(
            "partition {customer}: {} starts, most in any 5 s: {most}, sustained {rate:.3}/s ({:.1}% of 4/s)",
            starts.len(),
            rate / 4.0 * 100.0
        );
        assert!(most <= 20, "{customer}: {most} starts in one 5 s window");
        if customer != "noisy" {
            assert_eq!(starts.len(), 100, "{customer}: each task ran once");
            assert!(
                rate >= 0.95 * 4.0,
                "{customer}: sustained {rate}/s under 95% of 4/s"
            );
        }
    }
    db.drop().await;
}

/// Per key, its runs by start: (task, start, end).
fn runs_by_key(
    runs: &[(ObjectId, i64, i64)],
    key_of: &HashMap<ObjectId, i32>,
) -> HashMap<i32, Vec<(ObjectId, i64, i64)>> {
    let mut by_key: HashMap<i32, Vec<(ObjectId, i64, i64)>> = HashMap::new();
    for r in runs {
        if let Some(k) = key_of.get(&r.0) {
            by_key.entry(*k).or_default().push(*r);
        }
    }
    by_key
}

/// The most runs of one key that overlapped in time.
fn most_at_once(runs: &[(ObjectId, i64, i64)]) -> usize {
    let mut edges: Vec<(i64, i32)> = runs.iter().flat_map(|r| [(r.1, 1), (r.2, -1)]).collect();
    // An end and a start at the same millisecond: the end first (the slot was given back).
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in edges {
        now += d;
        most = most.max(now);
    }
    most as usize
}

async fn keyed_queue(
    db: &TestDb,
    name: &str,
    concurrency: Document,
) -> (ObjectId, Vec<ObjectId>, HashMap<ObjectId, i32>) {
    let queue = db.insert_queue(name, "echo", 0).await;
    db.set_queue(queue, doc! {"concurrency": concurrency}).await;
    let mut params = Vec::new();
    for i in 0..10 {
        for account in 0..20 {
            params.push(doc! {"account": account, "i": i, "sleep_ms": 30}.into());
        }
    }
    let ids = db.insert_tasks(queue, params).await;
    let key_of = ids
        .iter()
        .enumerate()
        .map(|(n, id)| (*id, (n % 20) as i32))
        .collect();
    (queue, ids, key_of)
}

#[tokio::test]
async fn one_task_per_key_at_a_time_in_queue_order_across_four_dens() {
    let db = TestDb::new("keyorder").await;
    let config = write_config(&db, "node.json", json!({}));
    let (queue, ids, key_of) = keyed_queue(
        &db,
        "keyed",
        doc! {"key": "params.account", "max": 1, "ordered": true},
    )
    .await;
    let dens = start_fleet(&db, &config, queue, ("keyed", 4), 40).await;
    db.wait_complete(&ids, Duration::from_secs(300)).await;
    drop(dens);
    let runs = attempts(&db, queue).await;
    assert_eq!(runs.len(), 200, "each task ran once");
    let by_key = runs_by_key(&runs, &key_of);
    let mut most = 0;
    for (key, runs) in &by_key {
        most = most.max(most_at_once(runs));
        for pair in runs.windows(2) {
            assert!(
                pair[1].1 >= pair[0].2,
                "key {key}: a run started at {} before the one before it ended at {}",
                pair[1].1,
                pair[0].2
            );
            assert!(
                pair[1].0 > pair[0].0,
                "key {key}: started out of queue order"
            );
        }
    }
    let nodes = futures::future::join_all(
        (1..=4).map(|i| db.count(doc! {"queue": queue, "node": format!("n{i}")})),
    )
    .await;
    eprintln!("20 keys x 10 tasks, max 1 ordered, 4 DENs: most of one key at once {most}; tasks per node {nodes:?}");
    assert_eq!(most, 1);
    db.drop().await;
}

#[tokio::test]
async fn at_most_three_tasks_per_key_across_four_dens() {
    let db = TestDb::new("keythree").await;
    let config = write_config(&db, "node.json", json!({}));
    let (queue, ids, key_of) =
        keyed_queue(&db, "three", doc! {"key": "params.account", "max": 3}).await;
    let dens = start_fleet(&db, &config, queue, ("three", 4), 80).await;
    db.wait_complete(&ids, Duration::from_secs(300)).await;
    drop(dens);
    let runs = attempts(&db, queue).await;
    assert_eq!(runs.len(), 200, "each task ran once");
    let most = runs_by_key(&runs, &key_of)
        .values()
        .map(|r| most_at_once(r))
        .max()
        .unwrap_or(0);
    eprintln!("20 keys x 10 tasks, max 3, 4 DENs: most of one key at once {most}");
    assert!(most <= 3, "{most} tasks of one key ran at once");
    assert!(most >= 2, "no key ever ran two at once (most {most})");
    db.drop().await;
}

/// In a queue whose keys are not `ordered`, a task waiting for its retry lets go of its key
/// slot: the key's next task runs meanwhile instead of waiting out the backoff (an hour here).
#[tokio::test]
async fn a_retry_waiting_in_an_unordered_queue_frees_its_key_for_the_next_task() {
    let db = TestDb::new("keyfree").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("unordered", "echo", 0).await;
    db.set_queue(
        queue,
        doc! {
            "concurrency": {"key": "params.account", "max": 1},
            "retry": {"max_attempts": 3, "base_s": 3600, "jitter": 0},
        },
    )
    .await;
    let ids = db
        .insert_tasks(
            queue,
            vec![
                doc! {"account": "a", "exit_code": 3}.into(),
                doc! {"account": "a"}.into(),
            ],
        )
        .await;
    let den = Den::start(&config, "n1");
    db.set_threads(queue, 2).await;
    db.wait_complete(&ids[1..], Duration::from_secs(120)).await;
    let waiting = db.task(ids[0]).await;
    assert_eq!(
        waiting.get_i32("status").ok(),
        Some(status::QUEUED),
        "waiting for its retry: {waiting}"
    );
    assert!(waiting.get_datetime("not_before").is_ok(), "{waiting}");
    assert!(
        waiting.get("concurrency_slot").is_none() && waiting.get("concurrency_key").is_none(),
        "its key slot was let go: {waiting}"
    );
    assert_eq!(
        db.task(ids[1]).await.get_i32("status").ok(),
        Some(status::SUCCEEDED)
    );
    drop(den);
    db.drop().await;
}

#[tokio::test]
async fn a_retry_keeps_its_place_and_a_dead_nodes_key_slot_comes_back() {
    let db = TestDb::new("keyretry").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("retried", "echo", 0).await;
    db.set_queue(
        queue,
        doc! {
            "concurrency": {"key": "params.account", "max": 1, "ordered": true},
            "max_retries": 2, "lease": 3, "on_lost": "orphan",
        },
    )
    .await;
    let started = db.path("started.txt");
    let gate = db.path("gate");
    let started_path = started.to_string_lossy().to_string();
    // The first asks for a retry a second later (twice, then fails); the second holds on the
    // gate until its node is killed; the third must run after both.
    let ids = db
        .insert_tasks(
            queue,
            vec![
                doc! {"account": "a", "result": {"retry": true, "delay": 1}}.into(),
                doc! {"account": "a", "append_to": &started_path, "hold_until": gate.to_string_lossy().to_string()}.into(),
                doc! {"account": "a"}.into(),
            ],
        )
        .await;
    let mut n1 = Den::start(&config, "n1");
    db.set_threads(queue, 4).await;
    wait_for(
        "the second task to start",
        Duration::from_secs(120),
        || async { started.exists() },
    )
    .await;
    let first = db.task(ids[0]).await;
    assert_eq!(
        first.get_i32("status").ok(),
        Some(status::FAILED),
        "retried, then failed: {first}"
    );
    assert_eq!(first.get_i32("attempts").ok(), Some(2), "{first}");
    // The node and its runner die: only recovery can give the key slot back.
    let runner = wait_runner_of(&db, "n1", ids[1]).await;
    n1.kill_hard();
    kill(runner, Signal::SIGKILL).expect("kill the runner");
    let n2 = Den::start(&config, "n2");
    db.wait_complete(&ids[2..], Duration::from_secs(120)).await;
    drop(n2);
    // Were the plugin still waiting, it goes now.
    std::fs::write(&gate, "").expect("open the gate");
    let second = db.task(ids[1]).await;
    assert!(
        second.get("concurrency_slot").is_none(),
        "the dead node's key slot was given back: {second}"
    );
    assert_eq!(
        second.get_i32("status").ok(),
        Some(status::ORPHANED),
        "orphaned: {second}"
    );
    let third = db.task(ids[2]).await;
    assert_eq!(
        third.get_i32("status").ok(),
        Some(status::SUCCEEDED),
        "{third}"
    );
    let runs = attempts(&db, queue).await;
    let order: Vec<ObjectId> = runs.iter().map(|r| r.0).collect();
    assert_eq!(
        order.first().copied(),
        Some(ids[0]),
        "the first task ran first: {runs:?}"
    );
    let first_runs: Vec<_> = runs.iter().filter(|r| r.0 == ids[0]).collect();
    let second_start = runs.iter().find(|r| r.0 == ids[1]).map(|r| r.1);
    assert_eq!(first_runs.len(), 2, "{runs:?}");
    assert!(
        second_start.is_some_and(|s| s >= first_runs[1].2),
        "the second started before the first's retry ended: {runs:?}"
    );
    assert_eq!(order.last().copied(), Some(ids[2]), "{runs:?}");
    db.drop().await;
}

#[tokio::test]
async fn a_cancelled_or_timed_out_task_gives_its_key_slot_back() {
    let db = TestDb::new("keyends").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("ends", "echo", 0).await;
    db.set_queue(
        queue,
        doc! {"concurrency": {"key": "params.account", "max": 1}, "timeout": 2},
    )
    .await;
    let started = db.path("started.txt");
    let started_path = started.to_string_lossy().to_string();
    let gate = db.path("gate").to_string_lossy().to_string();
    // One key: the first runs until cancelled, the second until its timeout, the third ends.
    let ids = db
        .insert_tasks(
            queue,
            vec![
                doc! {"account": "a", "append_to": &started_path, "hold_until": &gate}.into(),
                doc! {"account": "a", "append_to": &started_path, "sleep_ms": 600_000}.into(),
                doc! {"account": "a"}.into(),
            ],
        )
        .await;
    let n1 = Den::start(&config, "n1");
    db.set_threads(queue, 4).await;
    wait_for("the first task to run", Duration::from_secs(60), || async {
        disbatch_tests::read_lines(&started).len() == 1
    })
    .await;
    let second = db.task(ids[1]).await;
    assert_eq!(
        second.get_i32("status").ok(),
        Some(status::QUEUED),
        "its key is busy: {second}"
    );
    let store = db.den_store().await;
    store.tasks().cancel_task(ids[0]).await.expect("cancel");
    db.wait_complete(&ids, Duration::from_secs(120)).await;
    drop(n1);
    std::fs::write(&gate, "").expect("open the gate");
    let statuses: Vec<Option<i32>> = futures::future::join_all(ids.iter().map(|id| db.task(*id)))
        .await
        .iter()
        .map(|t| t.get_i32("status").ok())
        .collect();
    // Cancelled, failed by its timeout, succeeded: each in turn, the key's slot passed on.
    assert_eq!(
        statuses,
        [
            Some(status::CANCELLED),
            Some(status::FAILED),
            Some(status::SUCCEEDED)
        ]
    );
    let runs = attempts(&db, queue).await;
    let order: Vec<ObjectId> = runs.iter().map(|r| r.0).collect();
    assert_eq!(order, ids, "{runs:?}");
    for pair in runs.windows(2) {
        assert!(
            pair[1].1 >= pair[0].2,
            "runs of one key overlapped: {runs:?}"
        );
    }
    assert_eq!(
        db.count(doc! {"queue": queue, "concurrency_slot": {"$exists": true}})
            .await,
        0,
        "no key slot is left held"
    );
    db.drop().await;
}
