//! The claimer (producer): each pass, claims the tasks that queue and node limits allow.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use bson::oid::ObjectId;
use disbatch_core::claim_plan::{node_room, plan_claims, QueueState};
use disbatch_core::handoff::Handoff;
use disbatch_core::model::Queue;
use disbatch_core::scheduler::{batch_size, pick_spec, SpecState};
use disbatch_core::store::{NodeLimit, RunClaim, Store};
use disbatch_core::Result;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::continuous::{make_continuous_units, ContinuousQueue};
use crate::executor::Executor;
use crate::metrics::DenMetrics;
use crate::plugin_check::PluginCheck;
use crate::running_view::RunningView;
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
    servable: Vec<Servable>,
    queue_names: HashMap<ObjectId, String>,
    view: RunningView,
    metrics: DenMetrics,
}

/// A queue this node may claim from, as of the last refresh.
struct Servable {
    queue: Queue,
    threads: u32,
}

impl Claimer {
    pub fn new(
        store: Store,
        node: String,
        filter: QueueFilter,
        plugins: PluginCheck,
        metrics: DenMetrics,
    ) -> Self {
        Claimer {
            store,
            node,
            filter,
            plugins,
            skips: SkipLog::default(),
            reported: HashSet::new(),
            rng: StdRng::from_os_rng(),
            servable: Vec::new(),
            queue_names: HashMap::new(),
            view: RunningView::default(),
            metrics,
        }
    }

    /// Claims up to the limits and starts a runner for each task as soon as it is claimed.
    /// With `refresh`, the queues and the running counts are read again from the database;
    /// otherwise the last reading is used, kept current with what this node itself claimed and
    /// which of its runners exited, so a wake-up costs only the claims themselves.
    pub async fn claim_tasks(
        &mut self,
        limit: &NodeLimit,
        executor: &Executor,
        refresh: bool,
    ) -> Result<PassReport> {
        for exited in executor.take_exited() {
            self.view.runner_exited(exited.queue, exited.slot);
            if let Some(name) = self.queue_names.get(&exited.queue) {
                self.metrics
                    .runner_exited(name, exited.ran_for, exited.success);
            }
        }
        if refresh || self.view.is_stale() {
            self.refresh(executor.live_runners()).await?;
        }
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
        let mut room = node_room(maxthreads, self.view.on_node);
        let mut report = PassReport {
            claimed: 0,
            on_node: self.view.on_node,
        };
        if room == 0 || self.servable.is_empty() {
            return Ok(report);
        }
        let states: Vec<QueueState> = self
            .servable
            .iter()
            .map(|q| QueueState {
                id: q.queue.id,
                threads: q.threads,
                running: self.view.running(q.queue.id),
                held_slots: self.view.slots(q.queue.id),
            })
            .collect();
        let mut plan = plan_claims(&states, &mut self.rng);
        let mut specs: Vec<SpecState> = plan
            .iter()
            .map(|claims| {
                let q = self.servable.iter().find(|q| q.queue.id == claims.queue);
                let spec = q.map(|q| q.queue.spec.clone()).unwrap_or_default();
                SpecState {
                    priority: spec.priority,
                    weight: spec.weight,
                    cap: q.map_or(0, |q| q.threads),
                    running: self.view.running(claims.queue),
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
            let Some(queue) = self
                .servable
                .iter()
                .find(|q| q.queue.id == plan[i].queue)
                .map(|q| q.queue.clone())
            else {
                specs[i].available = false;
                continue;
            };
            let mut claimed_here = 0;
            while claimed_here < batch {
                let Some(slot) = plan[i].slots.pop() else {
                    break;
                };
                let attempt = ObjectId::new();
                let asked = Instant::now();
                let outcome = self
                    .store
                    .claim_task_to_run(
                        queue.id,
                        &self.node,
                        queue.sort,
                        slot,
                        queue.run.lease,
                        attempt,
                    )
                    .await?;
                match outcome {
                    RunClaim::Claimed(task) => {
                        self.metrics.claimed(&queue.name, asked.elapsed());
                        claimed_here += 1;
                        plan[i].wanted -= 1;
                        specs[i].running += 1;
                        room -= 1;
                        report.claimed += 1;
                        self.view.claimed(queue.id, slot);
                        let handoff = Handoff {
                            task: *task,
                            attempt,
                            queue: queue.raw.clone(),
                            relay: executor.relays(),
                        };
                        let id = handoff.task_id();
                        match executor.spawn_runner(&handoff, Some(slot)) {
                            Ok(()) => self.metrics.runner_started(&queue.name),
                            Err(e) => {
                                tracing::error!(task = ?id, error = %e, "could not start the task runner; giving the task back");
                                if let Some(id) = id {
                                    self.store.give_back_attempt(id, attempt).await?;
                                }
                                self.view.runner_exited(queue.id, Some(slot));
                                report.on_node = self.view.on_node;
                                return Ok(report);
                            }
                        }
                    }
                    RunClaim::Empty => {
                        self.metrics.claim_missed(&queue.name);
                        plan[i].wanted = 0;
                        break;
                    }
                    RunClaim::SlotTaken => {
                        // Another node holds it: remember, so later passes skip it too.
                        self.metrics.claim_missed(&queue.name);
                        self.view.slot_taken(queue.id, slot);
                    }
                }
            }
            // With max_getwork the batch was the queue's share of this pass.
            let share_taken = specs[i].max_getwork.is_some();
            if share_taken || plan[i].wanted == 0 || plan[i].slots.is_empty() || claimed_here == 0 {
                specs[i].available = false;
            }
        }
        report.on_node = self.view.on_node;
        Ok(report)
    }

    /// Reads the queues and the running counts again, and makes continuous queues' units.
    async fn refresh(&mut self, executor_live: u32) -> Result<()> {
        let (queues, problems) = self.store.list_queues().await?;
        for problem in problems {
            self.report_once(problem);
        }
        self.servable = queues.iter().filter_map(|q| self.servable(q)).collect();
        self.queue_names = queues.iter().map(|q| (q.id, q.name.clone())).collect();
        let continuous: Vec<ContinuousQueue> = self
            .servable
            .iter()
            .filter(|q| q.queue.spec.continuous && q.threads > 0 && !q.queue.spec.paused)
            .map(|q| ContinuousQueue {
                id: q.queue.id,
                interval: q.queue.spec.interval,
            })
            .collect();
        if !continuous.is_empty() {
            make_continuous_units(&self.store, &continuous).await?;
        }
        let ids: Vec<ObjectId> = self.servable.iter().map(|q| q.queue.id).collect();
        let snapshot = self.store.running_snapshot(&self.node, &ids).await?;
        self.view = RunningView::from_snapshot(snapshot, executor_live);
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
            queue: q.clone(),
            threads,
        })
    }

    fn report_once(&mut self, message: String) {
        if self.reported.insert(message.clone()) {
            tracing::warn!("{message}");
        }
    }
}
