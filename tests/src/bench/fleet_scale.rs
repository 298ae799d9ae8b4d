//! Fleet mode: N real DENs on one database behind the counting proxy, per size its idle cost, enqueue→start, a backlog's throughput and spread, and the recovery of a dead host's tasks.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_model::schema::{attempt, queue as qf, task, ATTEMPTS, NODES, QUEUES};
use disbatch_model::status;
use mongodb::{Collection, Database};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::json;

use super::accounting::flatten;
use super::fleet::local_server_pid;
use super::procfs::{self, CpuTicks};
use super::proxy::{HostUri, Proxy};
use super::scale_report::{IdleFigures, ScaleReport, SizeReport};
use super::stats::Latency;
use super::{progress, standalone, BenchOptions};
use crate::harness::{bin_path, echo_plugin, write_config, Den, TestDb};

/// Measures each fleet size of `o.fleet` in turn, each within `o.size_secs`; a size that fails
/// or runs out of time ends the run, and the report says why.
pub async fn run(o: &BenchOptions, command: String) -> anyhow::Result<ScaleReport> {
    progress("fleet mode: starting");
    let uri = o.uri.clone().unwrap_or_else(crate::harness::server_uri);
    let server = HostUri::parse(&uri).map_err(anyhow::Error::msg)?;
    let info = standalone::server_info(&uri, &server).await?;
    progress(&format!("server {} version {}", info.host, info.version));
    let mut sizes = Vec::new();
    let mut stopped = None;
    for &n in o.fleet.as_deref().unwrap_or_default() {
        let db = TestDb::on(uri.clone(), &format!("bench_fleet{n}")).await;
        let measured = tokio::time::timeout(o.size_secs, measure_size(o, &db, &server, n)).await;
        db.drop().await;
        match measured {
            Ok(Ok(s)) => sizes.push(s),
            Ok(Err(e)) => stopped = Some(format!("{n} DENs failed: {e:#}")),
            Err(_) => stopped = Some(format!("{n} DENs took over {:?}", o.size_secs)),
        }
        if let Some(why) = &stopped {
            progress(why);
            break;
        }
    }
    Ok(ScaleReport {
        command,
        machine: procfs::machine(),
        server: info,
        loop_interval_ms: o.loop_ms,
        change_streams: o.change_streams,
        recovery_lease_secs: o.lease_secs,
        sizes,
        stopped,
    })
}

async fn measure_size(
    o: &BenchOptions,
    db: &TestDb,
    server: &HostUri,
    n: usize,
) -> anyhow::Result<SizeReport> {
    let threads = o.fleet_threads_for(n);
    let t0 = Instant::now();
    let mut fleet = ScaleFleet::start(o, db, server, n, threads).await?;
    let start_secs = t0.elapsed().as_secs_f64();
    progress(&format!("{n} DENs up in {start_secs:.1} s"));
    tokio::time::sleep(Duration::from_millis(o.loop_ms * 5).max(Duration::from_secs(5))).await;
    let idle = fleet.idle(o.idle).await.context("idle window")?;
    let load_after_idle = procfs::load_1m();
    progress(&format!(
        "{n} DENs idle: {:.1} requests/s ({:.2} per DEN), server CPU {:?}%, {} connections",
        idle.figures.requests_per_sec,
        idle.figures.requests_per_sec_per_den,
        idle.figures.server_cpu_percent,
        idle.figures.open_connections
    ));
    // A client of the DCI: tasks, then their queue's work signal.
    let store = db.den_store().await;
    let mut paused_inserts = Vec::new();
    for via in [Some(&store), None] {
        let p = fleet
            .paused_insert(via, o.paused_tasks, o.paused_watch)
            .await
            .context("paused insert")?;
        progress(&format!(
            "{n} DENs: {} tasks into the paused queue ({}) in {:.1} s; server under {}% after {:?} s",
            p.tasks,
            p.how,
            p.insert_secs,
            super::scale_report::SETTLED_PERCENT,
            p.settled_after_secs
        ));
        paused_inserts.push(p);
    }
    let (enqueue_to_start, requests_per_probe) = fleet
        .probes(Some(&store), o.latency_tasks, o.latency_gap, idle.app_rate)
        .await
        .context("enqueue→start probes")?;
    let (enqueue_to_start_direct, _) = fleet
        .probes(None, o.latency_tasks, o.latency_gap, idle.app_rate)
        .await
        .context("enqueue→start probes, inserted directly")?;
    progress(&format!(
        "{n} DENs enqueue→start p50 {:.1} ms p99 {:.1} ms, {requests_per_probe:.1} requests per probe",
        enqueue_to_start.p50_ms, enqueue_to_start.p99_ms
    ));
    let backlog = fleet
        .backlog(
            o.tasks,
            idle.app_rate,
            o.run_secs.max(Duration::from_secs(300)),
        )
        .await
        .context("backlog")?;
    let load_after_backlog = procfs::load_1m();
    progress(&format!(
        "{n} DENs backlog: {} tasks, {:.1} tasks/s, share {}–{}",
        backlog.tasks, backlog.tasks_per_sec, backlog.share.min, backlog.share.max
    ));
    let mut recovery = Vec::new();
    if n >= 2 {
        fleet.start_long_tasks(o.lease_secs).await?;
        recovery.push(fleet.recover(false).await.context("a follower's death")?);
        if n >= 3 {
            recovery.push(fleet.recover(true).await.context("the leader's death")?);
        }
        for r in &recovery {
            progress(&format!(
                "{n} DENs: {} {} died with {} tasks, retaken after {:.1}–{:.1} s",
                r.victim,
                r.node,
                r.tasks,
                r.retaken_ms.0 / 1000.0,
                r.retaken_ms.1 / 1000.0
            ));
        }
    }
    drop(fleet);
    Ok(SizeReport {
        dens: n,
        threads,
        start_secs,
        idle: idle.figures,
        enqueue_to_start,
        requests_per_probe,
        enqueue_to_start_direct,
        paused_inserts,
        backlog,
        recovery,
        load_1m: (load_after_idle, load_after_backlog),
    })
}

struct Idle {
    figures: IdleFigures,
    /// App requests per second: what other phases subtract.
    app_rate: f64,
}

/// N DENs, each with its own config file (so a host's runners can be found by it) and node
/// name; stopped, with every runner they started, when dropped.
pub(super) struct ScaleFleet {
    pub(super) db: Database,
    pub(super) proxy: Proxy,
    pub(super) dens: Vec<Den>,
    pub(super) pids: Vec<u32>,
    pub(super) configs: Vec<PathBuf>,
    pub(super) server_pid: Option<u32>,
    pub(super) queue: ObjectId,
    pub(super) threads: u32,
    pub(super) loop_ms: u64,
    /// When the last node started: recovery waits until every node has been connected a
    /// lease and 5 s, before which the leader defers expired tasks (den/src/maintenance/reaper.rs).
    pub(super) last_start: Instant,
    /// The long tasks' queue and lease, once made.
    pub(super) long: Option<(ObjectId, u64)>,
    /// Nodes are named `PREFIX-000`, `PREFIX-001`, ….
    pub(super) node_prefix: String,
}

impl ScaleFleet {
    async fn start(
        o: &BenchOptions,
        db: &TestDb,
        server: &HostUri,
        n: usize,
        threads: u32,
    ) -> anyhow::Result<ScaleFleet> {
        let proxy = Proxy::start(server.host.clone())
            .await
            .context("starting the counting proxy")?;
        let queue = db.insert_queue("bench", "noop", 0).await;
        let mut fleet = ScaleFleet {
            db: db.db.clone(),
            proxy,
            dens: Vec::with_capacity(n),
            pids: Vec::with_capacity(n),
            configs: Vec::with_capacity(n),
            server_pid: local_server_pid(server),
            queue,
            threads,
            loop_ms: o.loop_ms,
            last_start: Instant::now(),
            long: None,
            node_prefix: o.node_prefix.clone(),
        };
        let mongohost = server.with_host(&fleet.proxy.addr.to_string());
        for i in 0..n {
            let config = write_config(
                db,
                &format!("den-{i}.json"),
                json!({
                    "mongohost": mongohost,
                    "plugins": {"noop": bin_path("disbatch-plugin-noop"), "echo": echo_plugin()},
                    "loop_interval_ms": o.loop_ms,
                    "change_streams": o.change_streams,
                }),
            );
            let den = Den::start(&config, &fleet.node_name(i));
            fleet.pids.push(den.pid().as_raw() as u32);
            fleet.dens.push(den);
            fleet.configs.push(config);
            if fleet.dens.len().is_multiple_of(o.start_batch.max(1)) || i + 1 == n {
                fleet.wait_heartbeats().await?;
            }
        }
        fleet.last_start = Instant::now();
        Ok(fleet)
    }

    /// Waits until every node started so far has its `nodes` document.
    async fn wait_heartbeats(&mut self) -> anyhow::Result<()> {
        let nodes = self.db.collection::<Document>(NODES);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let seen = nodes
                .count_documents(doc! {})
                .await
                .context("counting nodes")?;
            if seen as usize >= self.dens.len() {
                return Ok(());
            }
            if let Some(dead) = self.dens.iter_mut().position(|d| !d.is_running()) {
                let den = &self.dens[dead];
                bail!(
                    "node {} exited at start:\n{}",
                    den.node,
                    tail(&den.log_text())
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{seen} of {} nodes heartbeat within 60 s; the last one's log:\n{}",
                    self.dens.len(),
                    self.dens
                        .last()
                        .map(|d| tail(&d.log_text()))
                        .unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(super) fn tasks(&self) -> Collection<Document> {
        self.db.collection("tasks")
    }

    pub(super) async fn set_threads(&self, queue: ObjectId, threads: u32) -> anyhow::Result<()> {
        self.db
            .collection::<Document>(QUEUES)
            .update_one(
                doc! {qf::ID: queue},
                doc! {"$set": {qf::THREADS: threads as i64}},
            )
            .await
            .context("setting a queue's threads")?;
        Ok(())
    }

    pub(super) async fn count(&self, filter: Document) -> anyhow::Result<u64> {
        self.tasks()
            .count_documents(filter)
            .await
            .context("counting tasks")
    }

    pub(super) fn ticks(&self) -> CpuTicks {
        let mut sum = CpuTicks::default();
        for t in self.pids.iter().filter_map(|p| procfs::cpu_ticks(*p)) {
            sum.own += t.own;
            sum.children += t.children;
        }
        sum
    }

    async fn idle(&self, secs: Duration) -> anyhow::Result<Idle> {
        let per_den0: Vec<Option<CpuTicks>> =
            self.pids.iter().map(|p| procfs::cpu_ticks(*p)).collect();
        let server0 = self.server_pid.and_then(procfs::cpu_ticks);
        let c0 = self.proxy.snapshot();
        let t0 = Instant::now();
        tokio::time::sleep(secs).await;
        let elapsed = t0.elapsed().as_secs_f64();
        let counts = self.proxy.snapshot().since(&c0);
        let hz = procfs::clock_ticks();
        let den_cpu: Vec<f64> = self
            .pids
            .iter()
            .zip(per_den0)
            .filter_map(|(pid, before)| {
                let (b, a) = (before?, procfs::cpu_ticks(*pid)?);
                Some(a.own.saturating_sub(b.own) as f64 / hz / elapsed * 100.0)
            })
            .collect();
        let server_cpu_percent = match (server0, self.server_pid.and_then(procfs::cpu_ticks)) {
            (Some(b), Some(a)) => Some(a.own.saturating_sub(b.own) as f64 / hz / elapsed * 100.0),
            _ => None,
        };
        let by_command = flatten(&counts.app);
        let get_more: u64 = by_command
            .iter()
            .filter(|(k, _)| k.contains(" getMore"))
            .map(|(_, n)| n)
            .sum();
        let rss: Vec<u64> = self
            .pids
            .iter()
            .filter_map(|p| procfs::rss_kib(*p))
            .collect();
        let n = self.dens.len() as f64;
        let all = (counts.app_total() + counts.monitoring_total()) as f64 / elapsed;
        Ok(Idle {
            app_rate: counts.app_total() as f64 / elapsed,
            figures: IdleFigures {
                secs: elapsed,
                requests_per_sec: all,
                requests_per_sec_per_den: all / n,
                monitoring_per_sec: counts.monitoring_total() as f64 / elapsed,
                get_more_per_sec: get_more as f64 / elapsed,
                by_command_per_sec: by_command
                    .into_iter()
                    .map(|(k, v)| (k, v as f64 / elapsed))
                    .collect(),
                server_cpu_percent,
                den_cpu_percent_total: den_cpu.iter().sum(),
                den_cpu_percent_max: den_cpu.iter().copied().fold(0.0, f64::max),
                open_connections: counts.open,
                connections_per_den: counts.open as f64 / n,
                server_fds: self.server_pid.and_then(procfs::open_fds),
                den_rss_mib_total: rss.iter().sum::<u64>() as f64 / 1024.0,
                den_rss_mib_max: rss.iter().copied().max().unwrap_or(0) as f64 / 1024.0,
            },
        })
    }

    /// Tasks inserted one at a time, `gap` apart, into the idle fleet with the queue open:
    /// through `store` (the DCI's path) or straight into the collection.
    async fn probes(
        &self,
        store: Option<&disbatch_store::Store>,
        n: usize,
        gap: Duration,
        idle_rate: f64,
    ) -> anyhow::Result<(Latency, f64)> {
        self.set_threads(self.queue, self.threads).await?;
        // The queue change wakes every node; its readings stay out of the probes' count.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let c0 = self.proxy.snapshot();
        let t0 = Instant::now();
        let mut tick = tokio::time::interval(gap);
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            tick.tick().await;
            let id = match store {
                Some(store) => store
                    .tasks()
                    .insert_tasks(self.queue, vec![doc! {}])
                    .await
                    .context("enqueueing a probe")?
                    .first()
                    .copied()
                    .context("the probe's id")?,
                None => {
                    let now = DateTime::now();
                    let id = ObjectId::new();
                    self.tasks()
                        .insert_one(
                            doc! {task::ID: id, task::QUEUE: self.queue, task::STATUS: status::QUEUED,
                            task::NODE: Bson::Null, task::PARAMS: {}, task::CTIME: now, task::MTIME: now,
                            task::STDOUT: Bson::Null, task::STDERR: Bson::Null},
                        )
                        .await
                        .context("enqueueing a probe")?;
                    id
                }
            };
            ids.push(id);
        }
        self.wait_done(&ids, Duration::from_secs(60)).await?;
        let window = t0.elapsed().as_secs_f64();
        let counts = self.proxy.snapshot().since(&c0);
        self.set_threads(self.queue, 0).await?;
        let starts = self.attempt_starts(&ids).await?;
        let mut waits = Vec::with_capacity(n);
        for t in self
            .read_tasks(doc! {task::ID: {"$in": ids.clone()}})
            .await?
        {
            if let (Some(start), Ok(ctime)) = (starts.get(&t.id), t.doc.get_datetime(task::CTIME)) {
                waits.push((start.0 - ctime.timestamp_millis()) as f64);
            }
        }
        self.clear(self.queue).await?;
        let above_idle = counts.app_total() as f64 - idle_rate * window;
        Ok((Latency::of(&waits), (above_idle / n as f64).max(0.0)))
    }

    pub(super) async fn wait_done(
        &self,
        ids: &[ObjectId],
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let done = self
                .count(doc! {task::ID: {"$in": ids.to_vec()}, task::STATUS: status::SUCCEEDED})
                .await?;
            if done as usize >= ids.len() {
                return Ok(());
            }
            let failed = self
                .count(doc! {task::ID: {"$in": ids.to_vec()}, task::COMPLETE: true,
                task::STATUS: {"$ne": status::SUCCEEDED}})
                .await?;
            if failed > 0 {
                bail!("{failed} task(s) ended other than succeeded");
            }
            if Instant::now() > deadline {
                bail!("{done} of {} tasks succeeded within {timeout:?}", ids.len());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The succeeded attempts of `ids`: their start (ms since the epoch) and node.
    pub(super) async fn attempt_starts(
        &self,
        ids: &[ObjectId],
    ) -> anyhow::Result<BTreeMap<ObjectId, (i64, String)>> {
        let mut out = BTreeMap::new();
        for chunk in ids.chunks(1000) {
            let mut cursor = self
                .db
                .collection::<Document>(ATTEMPTS)
                .find(doc! {attempt::TASK: {"$in": chunk.to_vec()}, attempt::OUTCOME: "succeeded"})
                .projection(doc! {attempt::TASK: 1, attempt::START: 1, attempt::NODE: 1})
                .await
                .context("reading attempts")?;
            while cursor.advance().await.context("reading attempts")? {
                let a = cursor.deserialize_current().context("an attempt")?;
                if let (Ok(t), Ok(s)) = (
                    a.get_object_id(attempt::TASK),
                    a.get_datetime(attempt::START),
                ) {
                    let node = a.get_str(attempt::NODE).unwrap_or("?").to_string();
                    out.insert(t, (s.timestamp_millis(), node));
                }
            }
        }
        Ok(out)
    }

    pub(super) async fn read_tasks(&self, filter: Document) -> anyhow::Result<Vec<TaskDoc>> {
        let mut cursor = self
            .tasks()
            .find(filter)
            .projection(doc! {task::PARAMS: 0, task::STDOUT: 0, task::STDERR: 0})
            .await
            .context("reading tasks")?;
        let mut out = Vec::new();
        while cursor.advance().await.context("reading tasks")? {
            let doc = cursor.deserialize_current().context("a task")?;
            if let Ok(id) = doc.get_object_id(task::ID) {
                out.push(TaskDoc { id, doc });
            }
        }
        Ok(out)
    }

    pub(super) async fn clear(&self, queue: ObjectId) -> anyhow::Result<()> {
        self.tasks()
            .delete_many(doc! {task::QUEUE: queue, task::COMPLETE: true})
            .await
            .context("deleting finished tasks")?;
        self.db
            .collection::<Document>(ATTEMPTS)
            .delete_many(doc! {attempt::QUEUE: queue})
            .await
            .context("deleting attempts")?;
        Ok(())
    }

    /// SIGTERM to every live node at once (stopping a hundred one by one takes long), up to
    /// 20 s for them to exit, SIGKILL for any left; then every runner they started, which
    /// outlive their node by design and would run the bench's hour-long tasks on.
    fn stop_all(&mut self) {
        for den in &mut self.dens {
            if den.is_running() {
                let _ = kill(den.pid(), Signal::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.dens.iter_mut().any(|d| d.is_running()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        for den in &mut self.dens {
            // Reaps those that exited; kills the rest.
            den.kill_hard();
        }
        for config in &self.configs {
            for pid in procfs::processes_naming(&config.to_string_lossy()) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }
}

impl Drop for ScaleFleet {
    fn drop(&mut self) {
        self.stop_all();
    }
}

pub(super) struct TaskDoc {
    pub(super) id: ObjectId,
    pub(super) doc: Document,
}

impl TaskDoc {
    pub(super) fn node(&self) -> Option<&str> {
        self.doc.get_str(task::NODE).ok()
    }

    pub(super) fn mtime(&self) -> Option<i64> {
        self.doc
            .get_datetime(task::MTIME)
            .ok()
            .map(|d| d.timestamp_millis())
    }
}

impl ScaleFleet {
    /// Zero-padded, so the nodes' lanes (sorted by name) follow their start order.
    pub(super) fn node_name(&self, i: usize) -> String {
        format!("{}-{i:03}", self.node_prefix)
    }
}

/// The end of a log, for an error message.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
