//! Fleet mode's paused-backlog figures: a bulk insert into a paused queue with the fleet idle,
//! through our writers (one work signal per batch) and straight into the collection (ops, Perl
//! tools), and what the server spends on it after the insert ends.

use std::time::{Duration, Instant};

use anyhow::Context;
use bson::oid::ObjectId;
use bson::{doc, Bson, DateTime, Document};
use disbatch_model::schema::task;
use disbatch_model::status;
use disbatch_store::Store;

use super::fleet_scale::ScaleFleet;
use super::procfs;
use super::scale_report::{PausedInsertFigures, SETTLED_PERCENT};

/// Tasks per insert: what a client's bulk `POST /tasks` or an ops script sends at once.
const BATCH: usize = 10_000;

impl ScaleFleet {
    /// Inserts `n` tasks into the fleet's queue (paused: `threads` 0) in batches, through
    /// `store` or straight into the collection, watches the server for `watch` after, then
    /// deletes them.
    pub(super) async fn paused_insert(
        &self,
        store: Option<&Store>,
        n: usize,
        watch: Duration,
    ) -> anyhow::Result<PausedInsertFigures> {
        self.set_threads(self.queue, 0).await?;
        let t0 = Instant::now();
        let mut left = n;
        while left > 0 {
            let k = left.min(BATCH);
            let params: Vec<Document> = (0..k).map(|i| doc! {"i": i as i64}).collect();
            match store {
                Some(store) => {
                    store
                        .tasks()
                        .insert_tasks(self.queue, params)
                        .await
                        .context("inserting through the store")?;
                }
                None => {
                    let now = DateTime::now();
                    let docs: Vec<Document> = params
                        .into_iter()
                        .map(|p| {
                            doc! {task::ID: ObjectId::new(), task::QUEUE: self.queue,
                            task::STATUS: status::QUEUED, task::NODE: Bson::Null, task::PARAMS: p,
                            task::CTIME: now, task::MTIME: now,
                            task::STDOUT: Bson::Null, task::STDERR: Bson::Null}
                        })
                        .collect();
                    self.tasks()
                        .insert_many(docs)
                        .await
                        .context("inserting directly")?;
                }
            }
            left -= k;
        }
        let insert_secs = t0.elapsed().as_secs_f64();
        let hz = procfs::clock_ticks();
        let mut server_cpu_after = Vec::new();
        let mut requests_after = Vec::new();
        let mut settled_after_secs = None;
        let end = Instant::now();
        while end.elapsed() < watch {
            let c0 = self.proxy.snapshot();
            let s0 = self.server_pid.and_then(procfs::cpu_ticks);
            let w0 = Instant::now();
            tokio::time::sleep(Duration::from_secs(1)).await;
            let secs = w0.elapsed().as_secs_f64();
            let counts = self.proxy.snapshot().since(&c0);
            requests_after.push(counts.app_total() as f64 / secs);
            if let (Some(b), Some(a)) = (s0, self.server_pid.and_then(procfs::cpu_ticks)) {
                let cpu = a.own.saturating_sub(b.own) as f64 / hz / secs * 100.0;
                if cpu < SETTLED_PERCENT && settled_after_secs.is_none() {
                    settled_after_secs = Some(w0.duration_since(end).as_secs_f64());
                }
                server_cpu_after.push(cpu);
            }
        }
        self.tasks()
            .delete_many(doc! {task::QUEUE: self.queue})
            .await
            .context("deleting the paused backlog")?;
        Ok(PausedInsertFigures {
            how: if store.is_some() { "store" } else { "direct" },
            tasks: n,
            insert_secs,
            server_cpu_after,
            requests_after,
            settled_after_secs,
        })
    }
}
