//! A fleet of real DENs on one database behind the counting proxy, and the measurements taken
//! on it while idle: the baseline and enqueue→start latency (bulk runs: `fleet_run`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bson::oid::ObjectId;
use bson::{doc, Document};
use disbatch_model::schema::{attempt, queue as qf, task, ATTEMPTS, QUEUES};
use disbatch_model::status;
use mongodb::Collection;
use serde_json::json;

use super::accounting::IdleReport;
use super::contention::TaskEnds;
use super::procfs::{self, CpuTicks};
use super::proxy::{HostUri, Proxy};
use super::stats::Latency;
use crate::harness::{bin_path, write_config, Den, TestDb};

/// How long a fleet may take to go quiet after a run: at 100 000 queued tasks SecantusDB
/// takes tens of seconds per claim with four nodes asking at once (60 s was not enough).
pub(super) const DRAIN_LIMIT: Duration = Duration::from_secs(300);

/// The server's process when it listens on this machine, for its CPU time.
pub(super) fn local_server_pid(server: &HostUri) -> Option<u32> {
    let local = server.host.starts_with("127.0.0.1:")
        || server.host.starts_with("localhost:")
        || server.host.starts_with("[::1]:");
    server
        .host
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .filter(|_| local)
        .and_then(procfs::listener_pid)
}

/// Each DEN's metrics URL, as it prints it once listening.
async fn metrics_listeners(dens: &[Den]) -> anyhow::Result<Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut urls = Vec::new();
    for den in dens {
        loop {
            let url = den
                .log_text()
                .lines()
                .find_map(|l| l.strip_prefix("metrics on ").map(str::to_string));
            if let Some(url) = url {
                urls.push(url);
                break;
            }
            if Instant::now() > deadline {
                bail!("a DEN printed no metrics address within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(urls)
}

/// Real DENs on a database of their own; stopped when dropped.
pub struct Fleet {
    pub db: TestDb,
    pub(super) proxy: Proxy,
    pub(super) dens: Vec<Den>,
    pub(super) pids: Vec<u32>,
    pub(super) queue: ObjectId,
    pub threads: u32,
    pub(super) server_pid: Option<u32>,
    /// The nodes' config file: every runner they start names it.
    config: std::path::PathBuf,
    /// Each DEN's metrics listener.
    pub(super) metrics: Vec<String>,
    /// Runs enqueue one fan-out/fan-in graph instead of independent tasks.
    pub graph: bool,
}

/// The DENs' own CPU, and their runners' and worker hosts': reaped ones (`cutime`) and live
/// ones with their live children (a host and its workers live across a run).
pub(super) fn ticks(pids: &[u32]) -> CpuTicks {
    let mut sum = CpuTicks::default();
    for pid in pids {
        if let Some(t) = procfs::cpu_ticks(*pid) {
            sum.own += t.own;
            sum.children += t.children + live_descendants(*pid, 3);
        }
    }
    sum
}

/// Whether a DEN's child is its worker host (`disbatch-task-runner --worker-host`).
fn is_worker_host(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == b"--worker-host"))
}

fn live_descendants(pid: u32, depth: u32) -> u64 {
    if depth == 0 {
        return 0;
    }
    procfs::children(pid)
        .into_iter()
        .map(|c| {
            procfs::cpu_ticks(c).map_or(0, |t| t.own + t.children) + live_descendants(c, depth - 1)
        })
        .sum()
}

impl Fleet {
    /// Starts `dens` nodes whose `mongohost` is a new counting proxy in front of `server`.
    pub async fn start(
        uri: &str,
        server: &HostUri,
        dens: usize,
        threads: u32,
        loop_ms: u64,
        change_streams: bool,
    ) -> anyhow::Result<Fleet> {
        let db = TestDb::on(uri.to_string(), &format!("bench_{dens}den")).await;
        let proxy = Proxy::start(server.host.clone())
            .await
            .context("starting the counting proxy")?;
        let config = write_config(
            &db,
            "bench.json",
            json!({
                "mongohost": server.with_host(&proxy.addr.to_string()),
                "plugins": {"noop": bin_path("disbatch-plugin-noop")},
                "loop_interval_ms": loop_ms,
                "change_streams": change_streams,
                "metrics_listen": "127.0.0.1:0",
            }),
        );
        let queue = db.insert_queue("bench", "noop", 0).await;
        let dens: Vec<Den> = (0..dens)
            .map(|i| Den::start(&config, &format!("bench-{i}")))
            .collect();
        let pids = dens.iter().map(|d| d.pid().as_raw() as u32).collect();
        let server_pid = local_server_pid(server);
        let metrics = metrics_listeners(&dens).await?;
        let fleet = Fleet {
            db,
            proxy,
            dens,
            pids,
            queue,
            threads,
            server_pid,
            config,
            metrics,
            graph: false,
        };
        fleet.wait_heartbeats().await?;
        Ok(fleet)
    }

    async fn wait_heartbeats(&self) -> anyhow::Result<()> {
        let nodes = self.db.db.collection::<Document>("nodes");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let n = nodes
                .count_documents(doc! {})
                .await
                .context("counting nodes")?;
            if n as usize >= self.dens.len() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let logs: Vec<String> = self.dens.iter().map(|d| d.log_text()).collect();
                bail!(
                    "{n} of {} DENs reported within 30 s; logs:\n{}",
                    self.dens.len(),
                    logs.join("\n---\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(super) async fn count(&self, filter: Document) -> anyhow::Result<u64> {
        self.db
            .tasks()
            .count_documents(filter)
            .await
            .context("counting tasks")
    }

    fn queues(&self) -> Collection<Document> {
        self.db.db.collection(QUEUES)
    }

    fn attempts(&self) -> Collection<Document> {
        self.db.db.collection(ATTEMPTS)
    }

    /// Sets the bench queue's `worker` mode ("process" or "persistent").
    pub async fn set_worker(&self, worker: &str) -> anyhow::Result<()> {
        self.queues()
            .update_one(
                doc! {qf::ID: self.queue},
                doc! {"$set": {qf::WORKER: worker}},
            )
            .await
            .context("setting the queue's worker mode")?;
        Ok(())
    }

    /// Sets a flow limit far above demand on the bench queue: a million starts a second, or
    /// 10 000 running tasks per key (every bench task has the same, missing, key).
    pub async fn set_limits(&self, limits: &str) -> anyhow::Result<()> {
        let set = match limits {
            "rate" => doc! {qf::RATE_LIMIT: {"starts": 1_000_000, "per_s": 1}},
            _ => doc! {qf::CONCURRENCY: {"key": "params.account", "max": 10_000}},
        };
        self.queues()
            .update_one(doc! {qf::ID: self.queue}, doc! {"$set": set})
            .await
            .context("setting the queue's flow limit")?;
        Ok(())
    }

    /// Opens (`threads`) or closes (0) the queue, as ops pause one.
    pub(super) async fn set_threads(&self, threads: u32) -> anyhow::Result<()> {
        self.queues()
            .update_one(
                doc! {qf::ID: self.queue},
                doc! {"$set": {qf::THREADS: threads as i64}},
            )
            .await
            .context("setting the queue's threads")?;
        Ok(())
    }

    /// The idle baseline: requests and DEN CPU over `secs` with no task at all.
    pub async fn idle(&self, secs: Duration) -> anyhow::Result<IdleReport> {
        // Start-up work (indexes, first passes) stays out of the window.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let per_den0: Vec<Option<CpuTicks>> =
            self.pids.iter().map(|p| procfs::cpu_ticks(*p)).collect();
        let server0 = self.server_pid.and_then(procfs::cpu_ticks);
        let c0 = self.proxy.snapshot();
        let t0 = Instant::now();
        tokio::time::sleep(secs).await;
        let elapsed = t0.elapsed().as_secs_f64();
        let counts = self.proxy.snapshot().since(&c0);
        let hz = procfs::clock_ticks();
        let den_cpu_percent = self
            .pids
            .iter()
            .zip(per_den0)
            .map(|(pid, before)| match (before, procfs::cpu_ticks(*pid)) {
                (Some(b), Some(a)) => (a.own - b.own) as f64 / hz / elapsed * 100.0,
                _ => f64::NAN,
            })
            .collect();
        let server_cpu_percent = match (server0, self.server_pid.and_then(procfs::cpu_ticks)) {
            (Some(b), Some(a)) => Some(a.own.saturating_sub(b.own) as f64 / hz / elapsed * 100.0),
            _ => None,
        };
        Ok(IdleReport {
            secs: elapsed,
            requests_per_sec: counts.app_total() as f64 / elapsed,
            monitoring_per_sec: counts.monitoring_total() as f64 / elapsed,
            by_command_per_sec: super::accounting::flatten(&counts.app)
                .into_iter()
                .map(|(k, n)| (k, n as f64 / elapsed))
                .collect(),
            den_cpu_percent,
            server_cpu_percent,
            counts,
        })
    }

    /// Enqueue→start on an idle fleet: `n` tasks inserted one at a time, `gap` apart.
    pub async fn idle_latency(
        &self,
        idle: &IdleReport,
        n: usize,
        gap: Duration,
    ) -> anyhow::Result<Latency> {
        let before = TaskEnds::scrape(&self.metrics).await?;
        // Through the store, as the DCI queues a task (with its work signal): a task inserted
        // straight into the collection waits for the leader's probe, once a pass, and fleet
        // mode measures that path apart.
        let store = self.db.den_store().await;
        self.set_threads(self.threads).await?;
        let mut tick = tokio::time::interval(gap);
        for _ in 0..n {
            tick.tick().await;
            store
                .tasks()
                .insert_tasks(self.queue, vec![doc! {}])
                .await
                .context("enqueueing a latency probe")?;
        }
        self.wait_succeeded(&before, n, Duration::from_secs(60), false)
            .await?;
        self.set_threads(0).await?;
        self.wait_drained(idle, DRAIN_LIMIT).await?;
        let samples = self.samples().await?;
        self.clear_finished().await?;
        let waits: Vec<f64> = samples.iter().map(|s| (s.start - s.ctime) as f64).collect();
        Ok(Latency::of(&waits))
    }

    /// Waits until `n` tasks have succeeded since the counts `before` (taken before the queue
    /// opened) (true) or, when `partial`, until `timeout` passes with at least one (false). Fails at once if any task ends otherwise. Follows the
    /// DENs' metrics, not the database: counting attempts every 50 ms read every attempt of
    /// the run each time, a tenth of the server's CPU taken from the nodes it measures.
    pub(super) async fn wait_succeeded(
        &self,
        before: &TaskEnds,
        n: usize,
        timeout: Duration,
        partial: bool,
    ) -> anyhow::Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            let ends = TaskEnds::scrape(&self.metrics).await?.since(before);
            let ok = ends.succeeded as u64;
            if ok as usize >= n {
                return Ok(true);
            }
            if ends.other > 0.0 {
                let bad = self
                    .attempts()
                    .find_one(doc! {attempt::OUTCOME: {"$nin": ["succeeded", "running"]}})
                    .await
                    .context("looking for failed attempts")?;
                bail!(
                    "{} task(s) did not succeed; one attempt: {bad:?}",
                    ends.other
                );
            }
            if Instant::now() > deadline && partial && ok > 0 {
                return Ok(false);
            }
            if Instant::now() > deadline {
                let mut states = Vec::new();
                for s in [status::QUEUED, status::CLAIMED, status::RUNNING] {
                    states.push((
                        s,
                        self.count(doc! {task::QUEUE: self.queue, task::STATUS: s})
                            .await?,
                    ));
                }
                bail!("{ok} of {n} tasks succeeded within {timeout:?}; tasks by status {states:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until, for a whole second, no task is claimed or running, no attempt is open, no
    /// runner is alive and no request unanswered but those an idle node makes too: a node that
    /// decided to claim just before the queue closed has a claim in flight that the database
    /// does not show yet.
    pub(super) async fn wait_drained(
        &self,
        idle: &IdleReport,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let idle_labels: Vec<&String> = idle.counts.app.values().flat_map(|m| m.keys()).collect();
        let deadline = Instant::now() + timeout;
        let mut quiet_since: Option<Instant> = None;
        loop {
            let busy = self
                .count(doc! {task::QUEUE: self.queue,
                task::STATUS: {"$in": [status::CLAIMED, status::RUNNING]}})
                .await?;
            let open = self
                .attempts()
                .count_documents(doc! {attempt::OUTCOME: "running"})
                .await
                .context("counting open attempts")?;
            // A worker host lives on between runs, idle: only per-task runners count.
            let live = self
                .pids
                .iter()
                .flat_map(|p| procfs::children(*p))
                .filter(|c| !is_worker_host(*c))
                .count();
            let mut in_flight = self.proxy.in_flight();
            in_flight.retain(|label, _| !idle_labels.contains(&label));
            if busy == 0 && open == 0 && live == 0 && in_flight.is_empty() {
                let since = *quiet_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= Duration::from_secs(1) {
                    return Ok(());
                }
            } else {
                quiet_since = None;
            }
            if Instant::now() > deadline {
                bail!("after {timeout:?}: {busy} tasks busy, {open} attempts open, {live} runners alive, requests in flight {in_flight:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every succeeded attempt with its task's ctime and completion mtime (ms since epoch).
    pub(super) async fn samples(&self) -> anyhow::Result<Vec<Sample>> {
        let mut cursor = self
            .attempts()
            .find(doc! {attempt::OUTCOME: "succeeded"})
            .projection(doc! {attempt::TASK: 1, attempt::START: 1})
            .await
            .context("reading attempts")?;
        let mut starts = BTreeMap::new();
        while cursor.advance().await.context("reading attempts")? {
            let a = cursor.deserialize_current().context("attempt")?;
            if let (Ok(t), Ok(s)) = (
                a.get_object_id(attempt::TASK),
                a.get_datetime(attempt::START),
            ) {
                starts.insert(t, s.timestamp_millis());
            }
        }
        let ids: Vec<ObjectId> = starts.keys().copied().collect();
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(1000) {
            let mut cursor = self
                .db
                .tasks()
                .find(doc! {task::ID: {"$in": chunk.to_vec()}})
                .projection(doc! {task::CTIME: 1, task::MTIME: 1})
                .await
                .context("reading tasks")?;
            while cursor.advance().await.context("reading tasks")? {
                let t = cursor.deserialize_current().context("task")?;
                let (Ok(id), Ok(ctime), Ok(mtime)) = (
                    t.get_object_id(task::ID),
                    t.get_datetime(task::CTIME),
                    t.get_datetime(task::MTIME),
                ) else {
                    continue;
                };
                if let Some(start) = starts.get(&id) {
                    out.push(Sample {
                        ctime: ctime.timestamp_millis(),
                        start: *start,
                        mtime: mtime.timestamp_millis(),
                    });
                }
            }
        }
        Ok(out)
    }

    /// Finished tasks and all attempt records go, so each run starts from the same shape.
    pub(super) async fn clear_finished(&self) -> anyhow::Result<()> {
        self.db
            .tasks()
            .delete_many(doc! {task::QUEUE: self.queue, task::COMPLETE: true})
            .await
            .context("deleting finished tasks")?;
        self.attempts()
            .delete_many(doc! {})
            .await
            .context("deleting attempts")?;
        Ok(())
    }

    /// Stops the DENs and drops the database.
    pub async fn finish(mut self) {
        for den in &mut self.dens {
            den.stop();
        }
        // Runners outlive their node by design, and one started by a claim that was in flight
        // as the last run ended would retry its result for minutes against the bench's proxy,
        // which is going away: the bench's runners end with the bench.
        for pid in procfs::processes_naming(&self.config.to_string_lossy()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        self.db.drop().await;
    }
}

pub(super) struct Sample {
    pub(super) ctime: i64,
    pub(super) start: i64,
    pub(super) mtime: i64,
}
