//! The chaos run: several nodes work a requeue queue while nodes, runners and the server are
//! killed at random; then every task must be terminal and its attempt records consistent.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use disbatch_model::status;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::harness::restartable::RestartableServer;
use crate::harness::{write_config, Den, TestDb};

/// The shape of one run.
#[derive(Debug, Clone)]
pub struct ChaosOptions {
    pub tasks: usize,
    pub nodes: usize,
    /// How long kills go on; then the fleet is left to settle.
    pub chaos_for: Duration,
    /// Longest the settling may take before the run fails.
    pub settle_within: Duration,
    pub seed: u64,
}

/// What happened, and what the end state showed.
#[derive(Debug, Default)]
pub struct ChaosReport {
    pub seed: u64,
    pub tasks: usize,
    pub succeeded: usize,
    pub orphaned: usize,
    pub node_kills: u32,
    pub runner_kills: u32,
    pub server_restarts: u32,
    /// Attempts closed as lost: tasks taken back from a dead runner.
    pub recoveries: usize,
    /// From killing a runner to its task leaving that attempt, longest seen.
    pub longest_recovery: Duration,
    pub attempts: usize,
    pub elapsed: Duration,
    /// Every inconsistency found; empty when the run passed.
    pub problems: Vec<String>,
}

impl fmt::Display for ChaosReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "chaos run, seed {}", self.seed)?;
        writeln!(
            f,
            "  tasks {}: succeeded {}, orphaned {}",
            self.tasks, self.succeeded, self.orphaned
        )?;
        writeln!(
            f,
            "  kills: nodes {}, runners {}; server restarts {}",
            self.node_kills, self.runner_kills, self.server_restarts
        )?;
        writeln!(
            f,
            "  attempts {}; recoveries (attempts lost) {}; longest recovery after a runner kill {:.1} s",
            self.attempts,
            self.recoveries,
            self.longest_recovery.as_secs_f64()
        )?;
        writeln!(f, "  wall time {:.1} s", self.elapsed.as_secs_f64())?;
        if self.problems.is_empty() {
            write!(f, "  consistent: yes")
        } else {
            writeln!(f, "  PROBLEMS ({}):", self.problems.len())?;
            for p in self.problems.iter().take(20) {
                writeln!(f, "    {p}")?;
            }
            Ok(())
        }
    }
}

/// A runner that was killed, and when, until its task moves on.
struct KilledRunner {
    task: ObjectId,
    attempt: ObjectId,
    at: Instant,
}

pub async fn run_chaos(opts: &ChaosOptions) -> ChaosReport {
    let started = Instant::now();
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut report = ChaosReport {
        seed: opts.seed,
        tasks: opts.tasks,
        ..ChaosReport::default()
    };
    let mut server = RestartableServer::start();
    let db = TestDb::on(server.uri(), "chaos").await;
    let config = write_config(&db, "node.json", json!({}));
    let queue = db.insert_queue("chaos", "echo", 12).await;
    db.db
        .collection::<Document>("queues")
        .update_one(
            doc! {"_id": queue},
            doc! {"$set": {"lease": 3, "on_lost": "requeue", "max_retries": 25}},
        )
        .await
        .expect("queue");
    let params: Vec<Bson> = (0..opts.tasks)
        .map(|_| doc! {"sleep_ms": rng.random_range(100..1500_i64)}.into())
        .collect();
    let ids = db.insert_tasks(queue, params).await;
    let names: Vec<String> = (1..=opts.nodes).map(|i| format!("chaos{i}")).collect();
    let mut nodes: Vec<Option<Den>> = names.iter().map(|n| Some(Den::start(&config, n))).collect();
    let mut killed: Vec<KilledRunner> = Vec::new();
    let restart_server_at = opts.chaos_for / 3;
    let mut server_restarted = false;

    while started.elapsed() < opts.chaos_for {
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..1200))).await;
        track_recoveries(&db, &mut killed, &mut report).await;
        if !server_restarted && started.elapsed() >= restart_server_at {
            server.kill();
            tokio::time::sleep(Duration::from_secs(5)).await;
            server.restart();
            server_restarted = true;
            report.server_restarts += 1;
            continue;
        }
        // Dead nodes come back; a live one may die.
        for (i, slot) in nodes.iter_mut().enumerate() {
            if slot.is_none() && rng.random_bool(0.5) {
                *slot = Some(Den::start(&config, &names[i]));
            }
        }
        if rng.random_bool(0.4) {
            let i = rng.random_range(0..nodes.len());
            if let Some(mut den) = nodes[i].take() {
                den.kill_hard();
                report.node_kills += 1;
            }
        } else if let Some((task, attempt, pid)) = random_runner(&db, &mut rng).await {
            if kill(pid, Signal::SIGKILL).is_ok() {
                report.runner_kills += 1;
                killed.push(KilledRunner {
                    task,
                    attempt,
                    at: Instant::now(),
                });
            }
        }
    }
    for (i, slot) in nodes.iter_mut().enumerate() {
        if slot.is_none() {
            *slot = Some(Den::start(&config, &names[i]));
        }
    }
    let settle_deadline = Instant::now() + opts.settle_within;
    loop {
        track_recoveries(&db, &mut killed, &mut report).await;
        let open = db
            .count(doc! {"_id": {"$in": ids.clone()}, "status": {"$in": [-2, -1, 0]}})
            .await;
        if open == 0 && killed.is_empty() {
            break;
        }
        if Instant::now() > settle_deadline {
            report.problems.push(format!(
                "{open} tasks not terminal {:?} after the chaos ended",
                opts.settle_within
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let dens: Vec<i32> = nodes.iter().flatten().map(|d| d.pid().as_raw()).collect();
    wait_until_quiet(&db, &config, &dens, opts.settle_within, &mut report).await;
    check_end_state(&db, &ids, &mut report).await;
    for den in nodes.iter_mut().flatten() {
        den.stop();
    }
    report.elapsed = started.elapsed();
    drop(db);
    drop(server);
    report
}

/// Waits until nothing can still change the history: no runner of this run is alive (a runner
/// whose task is already terminal may still be closing its attempt record, retrying with up
/// to 5 s between tries after the server's restart), no task is claimed or running, and no
/// lost attempt's record is still to be written. `dens` are the nodes, which stay up.
async fn wait_until_quiet(
    db: &TestDb,
    config: &Path,
    dens: &[i32],
    within: Duration,
    report: &mut ChaosReport,
) {
    let deadline = Instant::now() + within;
    let mut pause = Duration::from_millis(10);
    loop {
        let alive = processes_naming(&config.to_string_lossy(), dens);
        let open = db.count(doc! {"status": {"$in": [-1, 0]}}).await;
        let unrecorded = db
            .count(doc! {"unrecorded_attempts": {"$exists": true}})
            .await;
        let running_records = db
            .db
            .collection::<Document>("attempts")
            .count_documents(doc! {"outcome": "running"})
            .await
            .unwrap_or(u64::MAX);
        if alive.is_empty() && open == 0 && unrecorded == 0 && running_records == 0 {
            return;
        }
        if Instant::now() > deadline {
            report.problems.push(format!(
                "not quiet {within:?} after the tasks ended: runners alive {alive:?}, tasks \
                 claimed or running {open}, tasks with unwritten lost records {unrecorded}, \
                 open attempt records {running_records}"
            ));
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// Live processes (zombies aside) other than `except` with an argument containing `needle`.
fn processes_naming(needle: &str, except: &[i32]) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| !except.contains(pid) && *pid != std::process::id() as i32)
        .filter(|pid| {
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
                s.rfind(')')
                    .and_then(|i| s[i + 1..].split_whitespace().next().map(str::to_string))
                    .is_none_or(|state| state == "Z" || state == "X")
            });
            let names = std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|b| *b == 0)
                    .any(|arg| String::from_utf8_lossy(arg).contains(needle))
            });
            names && !zombie
        })
        .collect()
}

/// A runner of a running task, chosen at random from the nodes' documents: (task, attempt,
/// pid).
async fn random_runner(db: &TestDb, rng: &mut StdRng) -> Option<(ObjectId, ObjectId, Pid)> {
    let mut cursor = db
        .db
        .collection::<Document>("nodes")
        .find(doc! {})
        .await
        .ok()?;
    let mut runners = Vec::new();
    while cursor.advance().await.unwrap_or(false) {
        let Ok(node) = cursor.deserialize_current() else {
            continue;
        };
        for r in node
            .get_array("runners")
            .map(|a| a.to_vec())
            .unwrap_or_default()
        {
            if let Some(r) = r.as_document() {
                if let (Ok(task), Ok(pid)) = (r.get_object_id("task"), r.get_i64("pid")) {
                    runners.push((task, pid));
                }
            }
        }
    }
    if runners.is_empty() {
        return None;
    }
    let (task, pid) = runners[rng.random_range(0..runners.len())];
    let doc = db.tasks().find_one(doc! {"_id": task}).await.ok()??;
    if doc.get_i32("status").ok() != Some(status::RUNNING) {
        return None;
    }
    Some((
        task,
        doc.get_object_id("attempt").ok()?,
        Pid::from_raw(pid as i32),
    ))
}

/// Drops killed runners whose task has moved on, noting how long that took.
async fn track_recoveries(db: &TestDb, killed: &mut Vec<KilledRunner>, report: &mut ChaosReport) {
    let mut still = Vec::new();
    for k in killed.drain(..) {
        let Ok(Some(task)) = db.tasks().find_one(doc! {"_id": k.task}).await else {
            still.push(k); // the server may be down
            continue;
        };
        let same = task.get_object_id("attempt").ok() == Some(k.attempt)
            && task.get_i32("status").ok() == Some(status::RUNNING);
        if same {
            still.push(k);
        } else {
            report.longest_recovery = report.longest_recovery.max(k.at.elapsed());
        }
    }
    *killed = still;
}

async fn check_end_state(db: &TestDb, ids: &[ObjectId], report: &mut ChaosReport) {
    let mut by_task: HashMap<ObjectId, Vec<Document>> = HashMap::new();
    let mut cursor = db
        .db
        .collection::<Document>("attempts")
        .find(doc! {})
        .await
        .expect("attempts");
    while cursor.advance().await.expect("attempts") {
        let a = cursor.deserialize_current().expect("attempt");
        report.attempts += 1;
        if a.get_str("outcome").ok() == Some("lost") {
            report.recoveries += 1;
        }
        if let Ok(task) = a.get_object_id("task") {
            by_task.entry(task).or_default().push(a);
        }
    }
    for id in ids {
        let task = db.task(*id).await;
        let records = by_task.remove(id).unwrap_or_default();
        let outcome_count = |o: &str| {
            records
                .iter()
                .filter(|a| a.get_str("outcome").ok() == Some(o))
                .count()
        };
        if outcome_count("running") > 0 {
            report
                .problems
                .push(format!("task {id}: an attempt is still open"));
        }
        let started = task.get_i32("attempts").unwrap_or(0) as usize;
        if started != records.len() {
            report.problems.push(format!(
                "task {id}: attempts {started} but {} attempt records",
                records.len()
            ));
        }
        match task.get_i32("status").ok() {
            Some(status::SUCCEEDED) => {
                report.succeeded += 1;
                let winners: Vec<&Document> = records
                    .iter()
                    .filter(|a| a.get_str("outcome").ok() == Some("succeeded"))
                    .collect();
                let current = task.get_object_id("attempt").ok();
                if winners.len() != 1 || winners[0].get_object_id("_id").ok() != current {
                    report.problems.push(format!(
                        "task {id}: {} succeeded attempts, the task names {current:?}",
                        winners.len()
                    ));
                }
            }
            Some(status::ORPHANED) => report.orphaned += 1,
            other => report
                .problems
                .push(format!("task {id}: not terminal, status {other:?}")),
        }
    }
}
