//! Fleet mode's bulk figures: a backlog worked by the whole fleet (throughput, requests, CPU, each node's share).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::bail;
use bson::doc;
use bson::oid::ObjectId;
use disbatch_model::schema::task;
use disbatch_model::status;

use super::ceiling::enqueue;
use super::fleet_scale::ScaleFleet;
use super::procfs;
use super::proxy::Counts;
use super::scale_report::{BacklogFigures, Share};

impl ScaleFleet {
    /// `depth` tasks enqueued into the closed queue; once the fleet is quiet again the queue
    /// opens and runs until every task succeeded or `limit` passed.
    pub(super) async fn backlog(
        &self,
        depth: usize,
        idle_rate: f64,
        limit: Duration,
    ) -> anyhow::Result<BacklogFigures> {
        let t_enqueue = Instant::now();
        enqueue(&self.tasks(), self.queue, depth).await?;
        self.settle(idle_rate).await?;
        let enqueue_settle_secs = t_enqueue.elapsed().as_secs_f64();

        let c0 = self.proxy.snapshot();
        let cpu0 = self.ticks();
        let server0 = self.server_pid.and_then(procfs::cpu_ticks);
        let t0 = Instant::now();
        self.set_threads(self.queue, self.threads).await?;
        let succeeded = doc! {task::QUEUE: self.queue, task::STATUS: status::SUCCEEDED};
        let deadline = Instant::now() + limit;
        let all = loop {
            let done = self.count(succeeded.clone()).await?;
            if done as usize >= depth {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        self.set_threads(self.queue, 0).await?;
        self.wait_quiet(self.queue).await?;
        let window = t0.elapsed().as_secs_f64();
        let counts: Counts = self.proxy.snapshot().since(&c0);
        let cpu1 = self.ticks();
        let server1 = self.server_pid.and_then(procfs::cpu_ticks);

        let tasks = self.read_tasks(succeeded).await?;
        let done = tasks.len();
        if done == 0 {
            bail!("no task of the backlog ran");
        }
        let ids: Vec<ObjectId> = tasks.iter().map(|t| t.id).collect();
        let starts = self.attempt_starts(&ids).await?;
        let first = starts.values().map(|s| s.0).min().unwrap_or(0);
        let last = tasks
            .iter()
            .filter_map(|t| t.mtime())
            .max()
            .unwrap_or(first);
        let busy_secs = ((last - first) as f64 / 1000.0).max(1e-3);
        let mut per_node: BTreeMap<String, u64> = (0..self.dens.len())
            .map(|i| (self.node_name(i), 0))
            .collect();
        for t in &tasks {
            if let Ok(node) = t.doc.get_str(task::NODE) {
                *per_node.entry(node.to_string()).or_default() += 1;
            }
        }
        let min = per_node.values().copied().min().unwrap_or(0);
        let max = per_node.values().copied().max().unwrap_or(0);
        let pct = |v: u64| v as f64 * 100.0 / done as f64;
        let hz = procfs::clock_ticks();
        let per_task_ms = |ticks: u64| ticks as f64 / hz * 1000.0 / done as f64;
        self.clear(self.queue).await?;
        Ok(BacklogFigures {
            depth,
            tasks: done,
            stopped_by: if all { "tasks" } else { "time" },
            enqueue_settle_secs,
            busy_secs,
            tasks_per_sec: done as f64 / busy_secs,
            requests_per_task: (counts.app_total() as f64 - idle_rate * window) / done as f64,
            raw_requests_per_task: counts.app_total() as f64 / done as f64,
            den_cpu_ms_per_task: per_task_ms(cpu1.own.saturating_sub(cpu0.own)),
            runner_cpu_ms_per_task: per_task_ms(cpu1.children.saturating_sub(cpu0.children)),
            server_cpu_ms_per_task: match (server0, server1) {
                (Some(a), Some(b)) => Some(per_task_ms(b.own.saturating_sub(a.own))),
                _ => None,
            },
            share: Share {
                nodes_used: per_node.values().filter(|v| **v > 0).count(),
                min,
                max,
                min_percent: pct(min),
                max_percent: pct(max),
                even_percent: 100.0 / self.dens.len() as f64,
            },
        })
    }

    /// Waits until a whole second's requests are back near the idle rate: after a backlog is
    /// enqueued, every node reads its change stream's insert events.
    async fn settle(&self, idle_rate: f64) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(300);
        let quiet = idle_rate * 1.5 + 2.0;
        loop {
            let before = self.proxy.snapshot();
            tokio::time::sleep(Duration::from_secs(1)).await;
            let rate = self.proxy.snapshot().since(&before).app_total() as f64;
            if rate <= quiet {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("still {rate} requests/s 300 s after the backlog was enqueued (idle {idle_rate:.1}/s)");
            }
        }
    }

    /// Waits until, for a whole second, none of `queue`'s tasks is claimed or running and no
    /// runner is alive.
    async fn wait_quiet(&self, queue: ObjectId) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut quiet_since: Option<Instant> = None;
        loop {
            let busy = self
                .count(doc! {task::QUEUE: queue, task::STATUS: {"$in": [status::CLAIMED, status::RUNNING]}})
                .await?;
            let live: usize = self.pids.iter().map(|p| procfs::children(*p).len()).sum();
            if busy == 0 && live == 0 {
                if quiet_since.get_or_insert_with(Instant::now).elapsed() >= Duration::from_secs(1)
                {
                    return Ok(());
                }
            } else {
                quiet_since = None;
            }
            if Instant::now() > deadline {
                bail!("120 s after the queue closed: {busy} tasks busy, {live} runners alive");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
