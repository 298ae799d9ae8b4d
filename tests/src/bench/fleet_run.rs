//! One bulk run on a fleet: top the backlog up, open the queue, and measure throughput, latency,
//! round trips, contention and CPU until the last runner has exited.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use bson::{doc, DateTime};
use disbatch_model::schema::task;
use disbatch_model::status;
use serde::Serialize;

use super::accounting::IdleReport;
use super::accounting::{first_claim, reply_latencies, round_trips, RoundTrips};
use super::ceiling::enqueue;
use super::contention::{ClaimCounts, Contention, TaskEnds};
use super::fleet::{ticks, Fleet, DRAIN_LIMIT};
use super::procfs::{self, RunnerSampler, RunnerSamples};
use super::stats::Latency;

/// One bulk run: `tasks` tasks worked from a backlog of `depth`.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub dens: usize,
    pub depth: usize,
    pub repeat: usize,
    pub queued_at_go: u64,
    /// Tasks that ran: more than asked when nodes claimed before they saw the queue close.
    pub tasks: usize,
    /// "tasks" when the asked number succeeded, "time" when the run's time limit came first
    /// (deep queues on a server whose claims slow down with depth).
    pub stopped_by: &'static str,
    /// From the first claim to the last completion.
    pub busy_secs: f64,
    pub tasks_per_sec: f64,
    /// Where `busy_secs` starts: the proxy's first claim, or the moment the queue opened.
    pub first_claim_from: &'static str,
    /// Attempt start minus the later of the task's ctime and the moment the queue opened:
    /// time spent queued behind the backlog plus the claim and the runner's start.
    pub queued_to_start: Latency,
    pub round_trips: RoundTrips,
    /// Claims per task, from the DENs' metrics: how often nodes got in each other's way.
    pub contention: Contention,
    /// Request→reply time at the proxy by `process label`: what each command costs the
    /// server (a claim's latency is its `den findAndModify tasks` entry, or whatever the
    /// DEN claims with).
    pub reply_ms: BTreeMap<String, Latency>,
    pub den_cpu_ms_per_task: f64,
    /// The runners' CPU (with their plugins), as the DENs reaped them.
    pub runner_cpu_ms_per_task: f64,
    /// The server's CPU, when it runs on this machine.
    pub server_cpu_ms_per_task: Option<f64>,
    pub den_peak_rss_kib: u64,
    pub runners: RunnerSamples,
}

impl Fleet {
    /// One bulk run: tops the backlog up to `depth`, opens the queue, and closes it again
    /// once `tasks` have succeeded or `max_secs` (when given) have passed; counts everything
    /// between opening and the last runner's exit. Without `max_secs`, not reaching `tasks`
    /// within 10 minutes is an error.
    pub async fn run(
        &self,
        depth: usize,
        tasks: usize,
        repeat: usize,
        idle: &IdleReport,
        max_secs: Option<Duration>,
    ) -> anyhow::Result<RunReport> {
        let queued = self
            .count(doc! {task::QUEUE: self.queue, task::STATUS: status::QUEUED})
            .await?;
        if self.graph {
            super::fan::enqueue_fan(&self.db, self.queue, depth).await?;
        } else {
            enqueue(
                &self.db.tasks(),
                self.queue,
                depth.saturating_sub(queued as usize),
            )
            .await?;
        }
        self.settle(idle).await?;
        // A closed queue can still see a claim or two from a node's stale reading; those runs
        // belong to no measurement.
        self.wait_drained(idle, DRAIN_LIMIT).await?;
        self.clear_finished().await?;
        let queued_at_go = self
            .count(doc! {task::QUEUE: self.queue, task::STATUS: status::QUEUED})
            .await?;

        let c0 = self.proxy.snapshot();
        let cpu0 = ticks(&self.pids);
        let server0 = self.server_pid.and_then(procfs::cpu_ticks);
        let claims0 = ClaimCounts::scrape(&self.metrics).await?;
        let ends0 = TaskEnds::scrape(&self.metrics).await?;
        let sampler = RunnerSampler::start(self.pids.clone(), Duration::from_millis(20));
        let t0 = Instant::now();
        let go = DateTime::now().timestamp_millis();
        self.proxy.mark();
        self.set_threads(self.threads).await?;
        let limit = max_secs.unwrap_or(Duration::from_secs(600));
        let all = self
            .wait_succeeded(&ends0, tasks, limit, max_secs.is_some())
            .await?;
        self.set_threads(0).await?;
        self.wait_drained(idle, DRAIN_LIMIT).await?;
        let window = t0.elapsed().as_secs_f64();
        let counts = self.proxy.snapshot().since(&c0);
        let cpu1 = ticks(&self.pids);
        let server1 = self.server_pid.and_then(procfs::cpu_ticks);
        let runners = sampler.finish();
        let claims1 = ClaimCounts::scrape(&self.metrics).await?;
        let den_peak_rss_kib = self
            .pids
            .iter()
            .filter_map(|p| procfs::peak_rss_kib(*p))
            .max()
            .unwrap_or(0);

        if counts.unparsed_connections > 0 {
            bail!(
                "the proxy could not read {} connection(s) as MongoDB wire protocol: the \
                 request counts would be wrong",
                counts.unparsed_connections
            );
        }
        let mut samples = self.samples().await?;
        self.clear_finished().await?;
        let early = samples.len();
        samples.retain(|s| s.start >= go);
        if samples.len() < early {
            super::progress(&format!(
                "warning: {} task(s) started before the queue opened; left out",
                early - samples.len()
            ));
        }
        let done = samples.len();
        if done == 0 {
            bail!("no task ran");
        }
        let (first_claim, first_claim_from) = match first_claim(&counts, idle) {
            Some(ms) if ms >= go => (ms, "proxy"),
            _ => (go, "go"),
        };
        let last = samples.iter().map(|s| s.mtime).max().unwrap_or(first_claim);
        let busy_secs = ((last - first_claim) as f64 / 1000.0).max(1e-3);
        let waits: Vec<f64> = samples
            .iter()
            .map(|s| (s.start - s.ctime.max(go)) as f64)
            .collect();
        let hz = procfs::clock_ticks();
        let per_task_ms = |ticks: u64| ticks as f64 / hz * 1000.0 / done as f64;
        Ok(RunReport {
            dens: self.dens.len(),
            depth,
            repeat,
            queued_at_go,
            tasks: done,
            stopped_by: if all { "tasks" } else { "time" },
            busy_secs,
            tasks_per_sec: done as f64 / busy_secs,
            first_claim_from,
            queued_to_start: Latency::of(&waits),
            round_trips: round_trips(&counts, idle, window, done),
            contention: claims1.per_task_since(&claims0, done),
            reply_ms: reply_latencies(&counts),
            den_cpu_ms_per_task: per_task_ms(cpu1.own.saturating_sub(cpu0.own)),
            runner_cpu_ms_per_task: per_task_ms(cpu1.children.saturating_sub(cpu0.children)),
            server_cpu_ms_per_task: match (server0, server1) {
                (Some(a), Some(b)) => Some(per_task_ms(b.own.saturating_sub(a.own))),
                _ => None,
            },
            den_peak_rss_kib,
            runners,
        })
    }

    /// Waits until the fleet's traffic is back to its idle rate: DENs that watch for new tasks
    /// read every inserted backlog task, and that cost is the enqueue's, not the run's.
    async fn settle(&self, idle: &IdleReport) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let quiet = idle.requests_per_sec * 1.5 + 2.0;
        loop {
            let before = self.proxy.snapshot();
            tokio::time::sleep(Duration::from_secs(1)).await;
            let rate = self.proxy.snapshot().since(&before).app_total() as f64;
            if rate <= quiet {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the fleet still made {rate} requests/s 120 s after the backlog was enqueued (idle: {:.1}/s)", idle.requests_per_sec);
            }
        }
    }
}
