//! Measurements without a fleet: one task runner at a time on a pre-claimed no-op task, and the
//! latency the counting proxy adds.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_model::schema::{task, ATTEMPTS};
use disbatch_model::status;
use mongodb::Client;
use serde::Serialize;
use serde_json::json;

use super::proxy::{HostUri, Proxy};
use super::stats::Latency;
use crate::harness::{bin_path, write_config, TestDb};

const NODE: &str = "bench-solo";

/// One runner's cost, measured alone.
#[derive(Debug, Clone, Serialize)]
pub struct RunnerReport {
    pub runs: usize,
    /// Spawn to exit of `disbatch-task-runner` for a claimed no-op task.
    pub spawn_to_exit: Latency,
    /// Requests per run, monitoring excluded, by command.
    pub requests_per_run: f64,
    pub by_command: BTreeMap<String, f64>,
    pub monitoring_per_run: f64,
    pub connections_per_run: f64,
    /// Maximum RSS from `/usr/bin/time -f %M`, when it is installed.
    pub peak_rss_kib: Option<u64>,
}

/// Runs the runner `runs` times (after one warm-up) through a counting proxy.
pub async fn runner(uri: &str, server: &HostUri, runs: usize) -> anyhow::Result<RunnerReport> {
    let db = TestDb::on(uri.to_string(), "bench_runner").await;
    let result = runner_in(&db, server, runs).await;
    db.drop().await;
    result
}

async fn runner_in(db: &TestDb, server: &HostUri, runs: usize) -> anyhow::Result<RunnerReport> {
    let proxy = Proxy::start(server.host.clone()).await?;
    let config = write_config(
        db,
        "runner.json",
        json!({"mongohost": server.with_host(&proxy.addr.to_string()),
               "plugins": {"noop": bin_path("disbatch-plugin-noop")}}),
    );
    let queue = db.insert_queue("bench", "noop", 1).await;
    run_once(db, &config, queue, None).await?;
    let before = proxy.snapshot();
    let mut times = Vec::new();
    for _ in 0..runs {
        times.push(run_once(db, &config, queue, None).await?.0);
    }
    let counts = proxy.snapshot().since(&before);
    if counts.unparsed_connections > 0 {
        bail!("the proxy could not read the runner's connections as MongoDB wire protocol");
    }
    let mut peak = None;
    if Path::new("/usr/bin/time").exists() {
        for _ in 0..3 {
            let rss = run_once(db, &config, queue, Some(&db.path("time.out")))
                .await?
                .1;
            peak = peak.max(rss);
        }
    }
    let n = runs.max(1) as f64;
    let mut by_command = BTreeMap::new();
    for labels in counts.app.values() {
        for (label, count) in labels {
            *by_command.entry(label.clone()).or_insert(0.0) += *count as f64 / n;
        }
    }
    Ok(RunnerReport {
        runs,
        spawn_to_exit: Latency::of(&times),
        requests_per_run: counts.app_total() as f64 / n,
        by_command,
        monitoring_per_run: counts.monitoring_total() as f64 / n,
        connections_per_run: counts.connections as f64 / n,
        peak_rss_kib: peak,
    })
}

/// Inserts a task already claimed by NODE, runs the runner on it, checks that it succeeded.
/// Returns the milliseconds from spawn to exit and, under /usr/bin/time, the peak RSS.
async fn run_once(
    db: &TestDb,
    config: &Path,
    queue: ObjectId,
    time_file: Option<&Path>,
) -> anyhow::Result<(f64, Option<u64>)> {
    let id = ObjectId::new();
    let now = DateTime::now();
    let lease = DateTime::from_millis(now.timestamp_millis() + 60_000);
    db.tasks()
        .insert_one(
            doc! {task::ID: id, task::QUEUE: queue, task::STATUS: status::CLAIMED,
            task::NODE: NODE, task::PARAMS: {}, task::CTIME: now, task::MTIME: now,
            task::STDOUT: Bson::Null, task::STDERR: Bson::Null, task::SLOT: 0_i64,
            task::LEASE_UNTIL: lease},
        )
        .await
        .context("inserting a claimed task")?;
    let runner = bin_path("disbatch-task-runner");
    let mut cmd = match time_file {
        Some(out) => {
            let mut c = tokio::process::Command::new("/usr/bin/time");
            c.arg("-f").arg("%M").arg("-o").arg(out).arg(&runner);
            c
        }
        None => tokio::process::Command::new(&runner),
    };
    cmd.arg("--config")
        .arg(config)
        .arg("--task")
        .arg(id.to_hex())
        .arg("--node")
        .arg(NODE)
        .stdin(std::process::Stdio::null());
    let started = Instant::now();
    let out = cmd.output().await.context("running the task runner")?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    if !out.status.success() {
        bail!(
            "the task runner failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let doc = db
        .tasks()
        .find_one(doc! {task::ID: id})
        .await
        .context("reading the task")?;
    let got = doc.as_ref().and_then(|d| d.get_i32(task::STATUS).ok());
    if got != Some(status::SUCCEEDED) {
        bail!("the no-op task ended with status {got:?}, not succeeded: {doc:?}");
    }
    db.tasks()
        .delete_one(doc! {task::ID: id})
        .await
        .context("deleting the task")?;
    db.db
        .collection::<Document>(ATTEMPTS)
        .delete_many(doc! {})
        .await
        .context("deleting attempts")?;
    let rss = match time_file {
        Some(f) => std::fs::read_to_string(f)
            .ok()
            .and_then(|t| t.lines().last().and_then(|l| l.trim().parse().ok())),
        None => None,
    };
    Ok((ms, rss))
}

/// Round-trip time of `ping`, straight to the server and through a proxy.
#[derive(Debug, Clone, Serialize)]
pub struct ProxyCost {
    pub direct: Latency,
    pub proxied: Latency,
}

pub async fn proxy_cost(uri: &str, server: &HostUri, n: usize) -> anyhow::Result<ProxyCost> {
    let proxy = Proxy::start(server.host.clone()).await?;
    let direct = ping_latency(uri, n).await?;
    let proxied = ping_latency(&server.with_host(&proxy.addr.to_string()), n).await?;
    Ok(ProxyCost { direct, proxied })
}

async fn ping_latency(uri: &str, n: usize) -> anyhow::Result<Latency> {
    let client = Client::with_uri_str(uri).await.context("connecting")?;
    let db = client.database("admin");
    db.run_command(doc! {"ping": 1}).await.context("ping")?;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        db.run_command(doc! {"ping": 1}).await.context("ping")?;
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    client.shutdown().await;
    Ok(Latency::of(&samples))
}

/// What the server says about itself.
#[derive(Debug, Clone, Serialize)]
pub struct ServerInfo {
    /// Host and port only: the URI may carry a password.
    pub host: String,
    pub version: String,
    pub set_name: Option<String>,
}

pub async fn server_info(uri: &str, server: &HostUri) -> anyhow::Result<ServerInfo> {
    let client = Client::with_uri_str(uri).await.context("connecting")?;
    let admin = client.database("admin");
    let build = admin
        .run_command(doc! {"buildInfo": 1})
        .await
        .context("buildInfo")?;
    let hello = admin
        .run_command(doc! {"hello": 1})
        .await
        .context("hello")?;
    let _ = tokio::time::timeout(Duration::from_secs(2), client.shutdown()).await;
    Ok(ServerInfo {
        host: server.host.clone(),
        version: build.get_str("version").unwrap_or("unknown").to_string(),
        set_name: hello.get_str("setName").ok().map(str::to_string),
    })
}
