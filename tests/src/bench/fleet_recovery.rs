//! Fleet mode's recovery figure: a host dies (its DEN and runners SIGKILLed) while every node runs long tasks, and the time until another node runs each of its tasks.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_model::schema::{
    lease, node, queue as qf, task, LEASES, MAINTENANCE_LEASE, NODES, QUEUES,
};
use disbatch_model::status;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::fleet_scale::{ScaleFleet, TaskDoc};
use super::procfs;
use super::scale_report::RecoveryFigures;

/// A long task's first attempt sleeps this long (an hour: it never ends by itself); a retry
/// (`attempts` > 1) of `disbatch-plugin-echo`'s `sleep_first_ms` returns at once.
const LONG_TASK_MS: i64 = 3_600_000;

impl ScaleFleet {
    /// A queue of 2 long tasks per node (`on_lost: requeue`, lease `lease_s`), all running.
    pub(super) async fn start_long_tasks(&mut self, lease_s: u64) -> anyhow::Result<()> {
        let n = 2 * self.dens.len();
        let queue = ObjectId::new();
        self.db
            .collection::<Document>(QUEUES)
            .insert_one(doc! {qf::ID: queue, qf::NAME: "long", qf::PLUGIN: "echo",
            qf::THREADS: 0, qf::LEASE: lease_s as i64, qf::ON_LOST: "requeue"})
            .await
            .context("making the long tasks' queue")?;
        let now = DateTime::now();
        let docs: Vec<Document> = (0..n)
            .map(|_| {
                doc! {task::QUEUE: queue, task::STATUS: status::QUEUED, task::NODE: Bson::Null,
                task::PARAMS: {"sleep_first_ms": LONG_TASK_MS}, task::CTIME: now, task::MTIME: now,
                task::STDOUT: Bson::Null, task::STDERR: Bson::Null}
            })
            .collect();
        self.tasks()
            .insert_many(docs)
            .await
            .context("enqueueing long tasks")?;
        // Opened only once every node has read every other as serving the queue
        // (`disbatch_den_sharers`): before, the first node to see the tasks has no lanes to
        // keep to and takes them all.
        let deadline = Instant::now() + Duration::from_secs(60);
        let live = self.dens.len() as f64;
        let sample = "disbatch_den_sharers{queue=\"long\"}";
        let mut unread = self.dens.iter().collect::<Vec<_>>();
        while !unread.is_empty() {
            let mut still = Vec::new();
            for den in unread {
                if den.metric(sample).await < live {
                    still.push(den);
                }
            }
            unread = still;
            if unread.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                super::progress(&format!(
                    "warning: {} nodes had not read every node serving the long queue within 60 s",
                    unread.len()
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.set_threads(queue, n as u32).await?;
        let deadline = Instant::now() + Duration::from_secs(120);
        while self
            .count(doc! {task::QUEUE: queue, task::STATUS: status::RUNNING})
            .await?
            < n as u64
        {
            if Instant::now() > deadline {
                bail!("{n} long tasks were not all running within 120 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Renewals under way, and every node connected long enough to recover (see last_start).
        let ready = self.last_start + Duration::from_secs(lease_s + 6);
        tokio::time::sleep_until(ready.max(Instant::now() + Duration::from_secs(2)).into()).await;
        self.long = Some((queue, lease_s));
        Ok(())
    }

    /// Lanes may leave a node without long tasks (at 100 nodes the leader held none): two
    /// more go to `victim` alone, the other live nodes held at `maxthreads` 0 meanwhile (as
    /// ops cap a node), and uncapped again before the kill so they can take its tasks.
    async fn give_long_tasks(&mut self, victim: &str, queue: ObjectId) -> anyhow::Result<()> {
        super::progress(&format!("{victim} holds no long task: giving it two"));
        let others: Vec<String> = (0..self.dens.len())
            .map(|i| self.node_name(i))
            .filter(|n| n != victim)
            .collect();
        let nodes = self.db.collection::<Document>(NODES);
        let capped = doc! {node::NODE: {"$in": others}};
        nodes
            .update_many(capped.clone(), doc! {"$set": {node::MAXTHREADS: 0}})
            .await
            .context("capping the other nodes")?;
        // Each node reads its cap back with its next heartbeat, every interval.
        tokio::time::sleep(Duration::from_millis(self.loop_ms * 2 + 500)).await;
        let now = DateTime::now();
        let docs: Vec<Document> = (0..2)
            .map(|_| {
                doc! {task::QUEUE: queue, task::STATUS: status::QUEUED, task::NODE: Bson::Null,
                task::PARAMS: {"sleep_first_ms": LONG_TASK_MS}, task::CTIME: now, task::MTIME: now,
                task::STDOUT: Bson::Null, task::STDERR: Bson::Null}
            })
            .collect();
        self.tasks()
            .insert_many(docs)
            .await
            .context("enqueueing long tasks")?;
        self.db
            .collection::<Document>(QUEUES)
            .update_one(doc! {qf::ID: queue}, doc! {"$inc": {qf::THREADS: 2}})
            .await
            .context("raising the long queue's threads")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mine = doc! {task::QUEUE: queue, task::STATUS: status::RUNNING, task::NODE: victim};
        while self.count(mine.clone()).await? < 2 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        nodes
            .update_many(capped, doc! {"$unset": {node::MAXTHREADS: ""}})
            .await
            .context("uncapping the other nodes")?;
        tokio::time::sleep(Duration::from_millis(self.loop_ms * 2 + 500)).await;
        Ok(())
    }

    /// Kills a live node's host (the DEN, then its runners: with the DEN gone first no node
    /// sees the runners exit, so only the lease path can recover them), and times until each
    /// of its long tasks started again elsewhere and succeeded.
    pub(super) async fn recover(&mut self, leader: bool) -> anyhow::Result<RecoveryFigures> {
        let Some((queue, lease_s)) = self.long else {
            bail!("no long tasks running");
        };
        let owner = self
            .db
            .collection::<Document>(LEASES)
            .find_one(doc! {lease::ID: MAINTENANCE_LEASE})
            .await
            .context("reading the maintenance lease")?
            .and_then(|d| d.get_str(lease::OWNER).ok().map(str::to_string));
        let running = self
            .read_tasks(doc! {task::QUEUE: queue, task::STATUS: status::RUNNING})
            .await?;
        let held = |name: &str| running.iter().filter(|t| t.node() == Some(name)).count();
        let live: Vec<usize> = self
            .dens
            .iter_mut()
            .enumerate()
            .filter_map(|(i, d)| d.is_running().then_some(i))
            .collect();
        let mut candidates: Vec<usize> = live
            .into_iter()
            .filter(|i| (owner.as_deref() == Some(self.node_name(*i).as_str())) == leader)
            .collect();
        candidates.sort_by_key(|i| std::cmp::Reverse(held(&self.node_name(*i))));
        let Some(&victim) = candidates.first() else {
            bail!(
                "no live {} to kill (leader {owner:?})",
                if leader { "leader" } else { "follower" }
            );
        };
        let name = self.node_name(victim);
        let running = if held(&name) == 0 {
            self.give_long_tasks(&name, queue).await?;
            self.read_tasks(doc! {task::QUEUE: queue, task::STATUS: status::RUNNING})
                .await?
        } else {
            running
        };
        let mine: Vec<&TaskDoc> = running
            .iter()
            .filter(|t| t.node() == Some(name.as_str()))
            .collect();
        if mine.is_empty() {
            bail!("{name} holds none of the long tasks");
        }
        let ids: Vec<ObjectId> = mine.iter().map(|t| t.id).collect();
        let runners = procfs::children(self.pids[victim]);
        let killed = DateTime::now().timestamp_millis();
        self.dens[victim].kill_hard();
        let config = self.configs[victim].to_string_lossy().to_string();
        for pid in runners.into_iter().chain(procfs::processes_naming(&config)) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        // A lease, the maintenance lease (15 intervals) and a follower's try (5) at most.
        let bound = Duration::from_secs(lease_s + 60) + Duration::from_millis(self.loop_ms * 20);
        self.wait_done(&ids, bound).await?;
        let starts = self.attempt_starts(&ids).await?;
        let done = self
            .read_tasks(doc! {task::ID: {"$in": ids.clone()}})
            .await?;
        let range = |v: Vec<f64>| {
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            (lo, hi)
        };
        let lease_left = mine
            .iter()
            .filter_map(|t| t.doc.get_datetime(task::LEASE_UNTIL).ok())
            .map(|u| (u.timestamp_millis() - killed) as f64)
            .collect();
        let retaken = starts.values().map(|s| (s.0 - killed) as f64).collect();
        let taken_by: BTreeSet<&str> = starts.values().map(|s| s.1.as_str()).collect();
        if taken_by.contains(name.as_str()) {
            bail!("a task of the killed node {name} ran again on {name}");
        }
        Ok(RecoveryFigures {
            victim: if leader { "leader" } else { "follower" },
            node: name,
            tasks: ids.len(),
            lease_left_ms: range(lease_left),
            retaken_ms: range(retaken),
            done_ms: range(
                done.iter()
                    .filter_map(|t| t.mtime())
                    .map(|m| (m - killed) as f64)
                    .collect(),
            ),
            taken_by: taken_by.len(),
        })
    }
}
