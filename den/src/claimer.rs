//! The claimer (producer): each pass, claims the tasks that queue and node limits allow.

use std::collections::HashSet;

use bson::oid::ObjectId;
use disbatch_core::claim_plan::{node_room, plan_claims, QueueState};
use disbatch_core::model::SpecFields;
use disbatch_core::model::{Queue, QueueSort};
use disbatch_core::scheduler::{batch_size, pick_spec, SpecState};
use disbatch_core::store::{ClaimOutcome, NodeLimit, Store};
use disbatch_core::Result;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::continuous::{make_continuous_units, ContinuousQueue};
use crate::executor::Executor;
use crate::plugin_check::PluginCheck;
use crate::skip_log::SkipLog;

/// Which queues this node serves (`activequeues` wins over `ignorequeues`, as in Disbatch).
#[derive(Debug, Clone, Default)]
pub struct QueueFilter {
    pub active: Vec<String>,
    pub ignore: Vec<String>,
    /// Coordinate runtimes served; None serves every queue's runtime.
    pub runtimes: Option<Vec<String>>,
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
    rng: StdRng,
}

/// A queue this node may claim from this pass.
struct Servable {
    id: ObjectId,
    threads: u32,
    sort: QueueSort,
    spec: SpecFields,
    /// How long a claim may wait for its runner to start before any node recovers it.
    lease: std::time::Duration,
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
        let continuous: Vec<ContinuousQueue> = servable
            .iter()
            .filter(|q| q.spec.continuous && q.threads > 0 && !q.spec.paused)
            .map(|q| ContinuousQueue {
                id: q.id,
                interval: q.spec.interval,
            })
            .collect();
        if !continuous.is_empty() {
            make_continuous_units(&self.store, &continuous).await?;
        }
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
        let mut plan = plan_claims(&states, &mut self.rng);
        let mut specs: Vec<SpecState> = plan
            .iter()
            .map(|claims| {
                let q = servable.iter().find(|q| q.id == claims.queue);
                let spec = q.map(|q| q.spec.clone()).unwrap_or_default();
                SpecState {
                    priority: spec.priority,
                    weight: spec.weight,
                    cap: q.map_or(0, |q| q.threads),
                    running: snapshot.per_queue.get(&claims.queue).copied().unwrap_or(0),
                    max_getwork: spec.max_getwork,
                    paused: spec.paused,
                    available: claims.wanted > 0,
                }
            })
            .collect();
        // Coordinate's scheduler picks a queue, the node claims a batch from it, and the
        // pick is made again with the new running counts until the node is full.
        while room > 0 {
            let Some(i) = pick_spec(&specs, &mut self.rng) else {
                break;
            };
            let batch = batch_size(&specs[i], room).min(plan[i].wanted);
            let queue = servable.iter().find(|q| q.id == plan[i].queue);
            let sort = queue.map_or(QueueSort::Default, |q| q.sort);
            let lease = queue.map_or(disbatch_core::run_policy::DEFAULT_LEASE, |q| q.lease);
            let mut claimed_here = 0;
            while claimed_here < batch {
                let Some(slot) = plan[i].slots.pop() else {
                    break;
                };
                match self
                    .store
                    .claim_next_task(plan[i].queue, &self.node, sort, slot, lease)
                    .await?
                {
                    ClaimOutcome::Claimed(task) => {
                        claimed_here += 1;
                        plan[i].wanted -= 1;
                        specs[i].running += 1;
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
                    ClaimOutcome::Empty => {
                        plan[i].wanted = 0;
                        break;
                    }
                    ClaimOutcome::SlotTaken => {} // another node won this slot; try the next
                }
            }
            // With max_getwork the batch was the queue's share of this pass.
            let share_taken = specs[i].max_getwork.is_some();
            if share_taken || plan[i].wanted == 0 || plan[i].slots.is_empty() || claimed_here == 0 {
                specs[i].available = false;
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
            let available = crate::host::available_gb().unwrap_or(f64::INFINITY);
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
            id: q.id,
            threads,
            sort: q.sort,
            spec: q.spec.clone(),
            lease: q.run.lease,
        })
    }

    fn report_once(&mut self, message: String) {
        if self.reported.insert(message.clone()) {
            tracing::warn!("{message}");
        }
    }
}
