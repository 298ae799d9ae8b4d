//! The claimer (producer): each pass, claims the tasks that queue and node limits allow.

use std::collections::HashSet;

use bson::oid::ObjectId;
use disbatch_core::claim_plan::{node_room, plan_claims, QueueState};
use disbatch_core::model::{Queue, QueueSort};
use disbatch_core::store::{ClaimOutcome, NodeLimit, Store};
use disbatch_core::Result;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::executor::Executor;
use crate::plugin_check::PluginCheck;
use crate::skip_log::SkipLog;

/// Which queues this node serves (`activequeues` wins over `ignorequeues`, as in Disbatch).
#[derive(Debug, Clone, Default)]
pub struct QueueFilter {
    pub active: Vec<String>,
    pub ignore: Vec<String>,
}

impl QueueFilter {
    pub fn serves(&self, queue: &ObjectId) -> bool {
        let hex = queue.to_hex();
        if !self.active.is_empty() {
            self.active.contains(&hex)
        } else {
            !self.ignore.contains(&hex)
        }
    }
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    pub claimed: u32,
    /// Tasks claimed or running on this node after the pass.
    pub on_node: u32,
}

pub struct Claimer {
    store: Store,
    node: String,
    filter: QueueFilter,
    plugins: PluginCheck,
    skips: SkipLog,
    reported: HashSet<String>,
    rotation: usize,
    rng: StdRng,
}

/// A queue this node may claim from this pass.
struct Servable {
    id: ObjectId,
    threads: u32,
    sort: QueueSort,
}

impl Claimer {
    pub fn new(store: Store, node: String, filter: QueueFilter, plugins: PluginCheck) -> Self {
        Claimer {
            store,
            node,
            filter,
            plugins,
            skips: SkipLog::default(),
            reported: HashSet::new(),
            rotation: 0,
            rng: StdRng::from_os_rng(),
        }
    }

    /// Claims up to the limits and starts a runner for each task as soon as it is claimed.
    pub async fn claim_tasks(
        &mut self,
        limit: &NodeLimit,
        executor: &Executor,
    ) -> Result<PassReport> {
        let maxthreads = match limit {
            NodeLimit::Unlimited => None,
            NodeLimit::Max(n) => Some(*n),
            NodeLimit::Invalid(reason) => {
                self.report_once(format!(
                    "node {} starts nothing until fixed: {reason}",
                    self.node
                ));
                return Ok(PassReport::default());
            }
        };
        let (queues, problems) = self.store.list_queues().await?;
        for problem in problems {
            self.report_once(problem);
        }
        let servable: Vec<Servable> = queues.iter().filter_map(|q| self.servable(q)).collect();
        let ids: Vec<ObjectId> = servable.iter().map(|q| q.id).collect();
        let snapshot = self.store.running_snapshot(&self.node, &ids).await?;
        let mut room = node_room(maxthreads, snapshot.on_node);
        let mut report = PassReport {
            claimed: 0,
            on_node: snapshot.on_node,
        };
        if room == 0 || servable.is_empty() {
            return Ok(report);
        }
        let states: Vec<QueueState> = servable
            .iter()
            .map(|q| QueueState {
                id: q.id,
                threads: q.threads,
                running: snapshot.per_queue.get(&q.id).copied().unwrap_or(0),
                held_slots: snapshot.slots.get(&q.id).cloned().unwrap_or_default(),
            })
            .collect();
        self.rotation = self.rotation.wrapping_add(1);
        let mut plan = plan_claims(&states, self.rotation, &mut self.rng);
        // Round-robin one claim per queue per round, so a node cap is shared fairly.
        while room > 0 && plan.iter().any(|q| q.wanted > 0) {
            for claims in plan.iter_mut().filter(|q| q.wanted > 0) {
                if room == 0 {
                    break;
                }
                let Some(slot) = claims.slots.pop() else {
                    claims.wanted = 0;
                    continue;
                };
                let sort = servable
                    .iter()
                    .find(|q| q.id == claims.queue)
                    .map_or(QueueSort::Default, |q| q.sort);
                match self
                    .store
                    .claim_next_task(claims.queue, &self.node, sort, slot)
                    .await?
                {
                    ClaimOutcome::Claimed(task) => {
                        claims.wanted -= 1;
                        room -= 1;
                        report.claimed += 1;
                        report.on_node += 1;
                        if let Err(e) = executor.spawn_runner(task) {
                            tracing::error!(task = %task, error = %e, "could not start the task runner; giving the task back");
                            self.store.give_back_claimed(&self.node, Some(task)).await?;
                            report.on_node -= 1;
                            return Ok(report);
                        }
                    }
                    ClaimOutcome::Empty => claims.wanted = 0,
                    ClaimOutcome::SlotTaken => {} // another node won this slot; try the next
                }
            }
        }
        Ok(report)
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
        if let Some(warning) = &q.sort_warning {
            self.report_once(format!("queue {} ({}): {warning}", q.name, q.id));
        }
        self.skips.served(q.id, &q.name);
        Some(Servable {
            id: q.id,
            threads,
            sort: q.sort,
        })
    }

    fn report_once(&mut self, message: String) {
        if self.reported.insert(message.clone()) {
            tracing::warn!("{message}");
        }
    }
}
