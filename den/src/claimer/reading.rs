//! The claimer's reading: the queues and running counts read again (and when), which queues
//! this node can serve now, and the nodes it shares each queue with.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use bson::oid::ObjectId;
use disbatch_model::Queue;
use disbatch_store::Result;

use super::{Claimer, Servable, SHARERS_EVERY, SHARERS_SETTLE, SHARER_MAX_AGE};
use crate::runners::executor::Executor;

impl Claimer {
    /// Reads the queues if they were never read: the first heartbeat then says which queues
    /// this node serves, so nodes started together see each other as sharers one heartbeat
    /// sooner, instead of the first to claim laying out lanes alone for a whole pass.
    pub async fn read_queues_first(&mut self, executor: &Executor) -> Result<()> {
        if self.sharers_read_at.is_none() {
            self.refresh(executor.live_runners()).await?;
        }
        Ok(())
    }

    /// Every queue as of the last reading, if it was read within `age` (and ever).
    pub fn queues_read_within(&self, age: std::time::Duration) -> Option<&[Queue]> {
        let (at, queues) = &self.all_queues;
        (self.sharers_read_at.is_some() && at.elapsed() <= age).then_some(queues.as_slice())
    }

    /// The queues this node serves, as of its last reading (published on its heartbeat).
    pub fn served(&self) -> Vec<ObjectId> {
        self.servable.iter().map(|q| q.queue.id).collect()
    }

    /// Reads the queues and the running counts again.
    pub(super) async fn refresh(&mut self, executor_live: u32) -> Result<()> {
        let (queues, problems) = self.store.queues().list_queues().await?;
        self.all_queues = (Instant::now(), queues.clone());
        for problem in problems {
            self.report_once(problem);
        }
        self.servable = queues.iter().filter_map(|q| self.servable(q)).collect();
        self.skips.forget_except(queues.iter().map(|q| q.id));
        self.metrics.queues_skipped(self.skips.skipped_now());
        self.queue_names = queues.iter().map(|q| (q.id, q.name.clone())).collect();
        let servable: HashSet<ObjectId> = self.servable.iter().map(|q| q.queue.id).collect();
        self.windows.retain(|id, _| servable.contains(id));
        self.limits.retain(&servable);
        self.turns.retain(&servable);
        let ids: Vec<ObjectId> = self.servable.iter().map(|q| q.queue.id).collect();
        let snapshot = self
            .store
            .claims()
            .running_snapshot(&self.node, &ids)
            .await?;
        self.view.read(snapshot, executor_live);
        // Every live node that serves a queue and has room gets a lane of its slots, not only
        // those seen holding its tasks: otherwise the node that frees a slot refills it before
        // the others ever see it free, and one node can keep a capped queue to itself.
        let settling = self.sharers_moving || self.started.elapsed() < SHARERS_SETTLE;
        if !settling
            && self
                .sharers_read_at
                .is_some_and(|t| t.elapsed() < SHARERS_EVERY)
        {
            return Ok(());
        }
        self.sharers_read_at = Some(Instant::now());
        let fleet = self.store.nodes().live_nodes(SHARER_MAX_AGE).await?;
        if !fleet.others.is_empty() {
            // A Perl node claims from the moment it runs; a reading may not show it yet.
            self.view.perl_nodes_live();
            let limited: Vec<String> = self
                .servable
                .iter()
                .filter(|q| q.queue.limits.limits_claims())
                .map(|q| format!("{} ({})", q.queue.name, q.queue.id))
                .collect();
            if !limited.is_empty() {
                // Perl nodes know no flow limits: they claim these queues' tasks past them.
                self.report_once(format!(
                    "Perl Disbatch nodes are live beside this one: they do not hold the rate_limit or concurrency of queues {}; stop them or remove the limits",
                    limited.join(", ")
                ));
            }
        }
        let live = fleet.ours;
        let capacity = live
            .iter()
            .map(|n| (n.node.clone(), n.maxthreads))
            .collect();
        let sharers: HashMap<ObjectId, Vec<String>> = ids
            .iter()
            .map(|q| {
                let nodes = live
                    .iter()
                    .filter(|n| n.room != Some(0) && n.serves.contains(q))
                    .map(|n| n.node.clone())
                    .collect();
                (*q, nodes)
            })
            .collect();
        // Published so that whoever needs the fleet to agree on lanes (a test opening a queue,
        // ops adding a node) can see this node has read its sharers, not guess a time.
        self.metrics
            .sharers(sharers.iter().filter_map(|(q, nodes)| {
                let name = self.queue_names.get(q)?;
                Some((name.as_str(), nodes.len()))
            }));
        self.sharers_moving = sharers != self.last_sharers;
        if self.sharers_moving {
            tracing::debug!(?sharers, "the nodes sharing this node's queues changed");
        }
        self.last_sharers.clone_from(&sharers);
        self.view.set_sharers(sharers, capacity);
        Ok(())
    }

    /// Decides whether this node can serve a queue now, logging the reason when not.
    fn servable(&mut self, q: &Queue) -> Option<Servable> {
        if !self.filter.serves(&q.id) {
            return None;
        }
        let plugin = match &q.plugin {
            Ok(p) => p,
            Err(reason) => {
                self.skips.skipped(q.id, &q.name, reason.clone());
                return None;
            }
        };
        if let Err(e) = self.plugins.check(plugin) {
            self.skips.skipped(q.id, &q.name, e.to_string());
            return None;
        }
        let threads = match &q.threads {
            Ok(t) => *t,
            Err(reason) => {
                self.skips.skipped(q.id, &q.name, reason.clone());
                return None;
            }
        };
        if let Some(runtimes) = &self.filter.runtimes {
            if !runtimes.contains(&q.spec.runtime) {
                let reason = format!(
                    "runtime {:?} is not one this node serves ({runtimes:?})",
                    q.spec.runtime
                );
                self.skips.skipped(q.id, &q.name, reason);
                return None;
            }
        }
        if let Some(min_gb) = q.spec.min_gb {
            let available = crate::claimer::host_memory::available_gb().unwrap_or(f64::INFINITY);
            if min_gb > available {
                let reason =
                    format!("needs {min_gb} GB; this node has {available:.1} GB available");
                self.skips.skipped(q.id, &q.name, reason);
                return None;
            }
        }
        if let Some(warning) = &q.sort_warning {
            self.report_once(format!("queue {} ({}): {warning}", q.name, q.id));
        }
        self.skips.served(q.id, &q.name);
        Some(Servable {
            queue: q.clone(),
            threads,
        })
    }
}
