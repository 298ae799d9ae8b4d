//! The claimer (producer): each pass, claims the tasks that queue and node limits allow.

pub mod host_memory;
pub mod lanes;
pub mod plan;
pub mod plugin_check;
pub mod running_view;
pub mod shares;
pub mod skip_log;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::claimer::batch::BatchReport;
use crate::claimer::plan::{node_room, plan_claims, QueueClaims, QueueState};
use crate::claimer::shares::{share_room, SpecState};
use bson::oid::ObjectId;
use disbatch_model::Queue;
use disbatch_store::Result;
use disbatch_store::{ClaimWindow, NodeLimit, SkipReason, Store};
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::claimer::plugin_check::PluginCheck;
use crate::claimer::running_view::RunningView;
use crate::claimer::skip_log::SkipLog;
use crate::metrics::DenMetrics;
use crate::runners::executor::Executor;

mod batch;
mod beside_perl;
mod continuous;
mod empty_queues;
mod limits;
mod reading;
mod reserve;
mod retries_due;
mod spare;

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

/// A node whose heartbeat is older than this gets no lane: it may be gone.
const SHARER_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(5);
/// Which nodes share a queue changes slowly (a node starts, stops, fills up): read at most
/// this often, not at every reading of running counts.
const SHARERS_EVERY: std::time::Duration = std::time::Duration::from_secs(2);
/// While a node is this young, or the sharers it last read differed from the reading before,
/// it reads them at every reading: nodes started together with a backlog waiting each see
/// the others only once they have heartbeat, and one that laid out lanes alone would keep
/// refilling every slot as its own until its next look (measured: 231/28/41 of 300 tasks).
const SHARERS_SETTLE: std::time::Duration = std::time::Duration::from_secs(10);
/// Most tasks one pass claims; a pass that reaches it is followed by another at once.
const MAX_PASS_CLAIMS: u32 = 256;
/// Most candidates read for one batch.
const MAX_CANDIDATES: usize = 512;
/// Most claim rounds in one pass: a round claims for every queue the scheduler shares room to.
const MAX_ROUNDS: usize = 4;
/// How long a queue found empty is left unread without a signal, unless the wiring says.
const DEFAULT_EMPTY_AGE: std::time::Duration = std::time::Duration::from_secs(10);
/// Tasks remembered as unrunnable here (failed or refused); past it the set starts afresh,
/// so memory stays bounded and a refused task is at worst tried once more.
const MAX_UNRUNNABLE: usize = 10_000;

/// Whether a claim pass reads queues and running counts before claiming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Read them now.
    Now,
    /// Read them if the last reading is over a second old.
    IfStale,
    /// Claim from the last reading, however old: an idle node woken by new work, whose view
    /// (nothing of its own running) is as good as a fresh one for the first claim; the slot
    /// index refuses what a stale count would get wrong.
    Last,
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    pub claimed: u32,
    /// Tasks claimed or running on this node after the pass.
    pub on_node: u32,
    /// The pass stopped at its claim limit: run the next one without waiting.
    pub more: bool,
    /// Whether new tasks would have been claimed: a queue with room had too few claimable
    /// ones (true), or not (false: the node was full, or every queue had more than its
    /// room, was full or was held back). None when the pass stopped before looking.
    pub short_of_tasks: Option<bool>,
    /// The node had room but a queue it serves had no slot for it (at its `threads`, or
    /// every free slot another lane's): it reads again every pass, not at an idle node's
    /// pace, so it takes its lane back as soon as a slot frees.
    pub waiting_for_slots: bool,
    /// A queue's flow limits held tasks back: the next pass is due by then at the latest.
    pub held_until: Option<Instant>,
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
    /// Per queue: where its head was last read.
    windows: HashMap<ObjectId, ClaimWindow>,
    /// Per queue: candidates read beyond the last batch, for the next ones.
    spares: spare::Spares,
    /// Queues a read found empty, left unread until signalled or aged.
    empty: empty_queues::EmptyQueues,
    /// When to ask again for continuous queues' turns.
    turns: continuous::TurnClock,
    /// What this node knows of its queues' rate-limit windows.
    limits: limits::LimitViews,
    /// When retries this node's runners queued come due, and their queues.
    retries_due: retries_due::RetriesDue,
    /// Queued tasks this node will not try again: undecodable, or refused by the server.
    unrunnable: HashSet<ObjectId>,
    /// When the live nodes sharing queues were last read.
    sharers_read_at: Option<Instant>,
    /// Every queue, as the last reading found them, and when: the maintenance leader uses
    /// this list rather than reading the queues again on each of its passes.
    all_queues: (Instant, Vec<Queue>),
    /// The sharers last read, and whether they differed from the reading before.
    last_sharers: HashMap<ObjectId, Vec<String>>,
    sharers_moving: bool,
    started: Instant,
    /// The queue filter or the plugins changed (a reload): read the queues again first.
    reconfigured: bool,
    metrics: DenMetrics,
}

/// A queue this node may claim from, as of the last refresh.
struct Servable {
    queue: Queue,
    threads: u32,
}

impl PassReport {
    /// Counts one batch of `queue` into the pass.
    fn add_batch(&mut self, queue: ObjectId, batch: &BatchReport) {
        if batch.claimed == 0 && batch.lost > 0 {
            // Other nodes took every slot or task it reached for: it is waiting for
            // a slot as much as one that found none free, and an idle node's pace
            // (reading every tenth pass, claiming from a stale view in between)
            // would keep it losing the same race (measured: a node that ran nothing
            // for 20 s beside two that shared 300 tasks).
            self.waiting_for_slots = true;
            tracing::debug!(queue = %queue, lost = batch.lost, "every claim of the batch went to another node");
        }
        if batch.held {
            // Held back, not out of work: read every pass, and at once when a limit
            // frees.
            self.waiting_for_slots = true;
        }
        self.held_until = earliest(self.held_until, batch.held_until);
        self.claimed += batch.claimed;
        self.short_of_tasks = Some(self.short_of_tasks == Some(true) || batch.out_of_tasks);
    }
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
            windows: HashMap::new(),
            spares: spare::Spares::default(),
            empty: empty_queues::EmptyQueues::new(DEFAULT_EMPTY_AGE),
            retries_due: retries_due::RetriesDue::default(),
            turns: continuous::TurnClock::default(),
            limits: limits::LimitViews::default(),
            unrunnable: HashSet::new(),
            sharers_read_at: None,
            all_queues: (Instant::now(), Vec::new()),
            last_sharers: HashMap::new(),
            sharers_moving: false,
            started: Instant::now(),
            reconfigured: false,
            metrics,
        }
    }

    /// Keeps slots seen held as their lanes' for `window` (see `RunningView`): the wiring
    /// gives three loop intervals, time for a node reading every pass to take its slot back.
    pub fn with_contest_window(mut self, window: std::time::Duration) -> Self {
        self.view = RunningView::with_contest_window(window);
        self
    }

    /// Reads a queue found empty again after `age` even if nothing signalled it (the wiring
    /// gives ten loop intervals, an idle node's reading pace).
    pub fn with_empty_queue_age(mut self, age: std::time::Duration) -> Self {
        self.empty = empty_queues::EmptyQueues::new(age);
        self
    }

    /// Tasks may have been queued anywhere (a signal that names no queue): read every queue
    /// found empty again.
    pub fn forget_empty_queues(&mut self) {
        self.empty.forget_all();
    }

    /// Tasks may have been queued in `queue`: read it again even if found empty.
    pub fn forget_empty_queue(&mut self, queue: ObjectId) {
        self.empty.forget(queue);
    }

    /// Serves other queues or plugins from the next pass on (a config reload); claims
    /// already made and runners already started are not touched.
    pub fn reconfigure(&mut self, filter: QueueFilter, plugins: PluginCheck) {
        self.filter = filter;
        self.plugins = plugins;
        self.reconfigured = true;
    }

    /// Claims up to the limits and starts a runner for each task as soon as it is claimed.
    /// `read` says whether the queues and the running counts are read again first; otherwise
    /// the last reading is used, kept current with what this node itself claimed and which of
    /// its runners exited, so a wake-up costs only the claims themselves. Once
    /// `stopping` is set, no further batch is claimed; a batch already claimed still gets its
    /// runners.
    pub async fn claim_tasks(
        &mut self,
        limit: &NodeLimit,
        executor: &Executor,
        read: Reading,
        stopping: &AtomicBool,
    ) -> Result<PassReport> {
        self.note_exited_runners(executor);
        self.take_due_retries();
        if stopping.load(Ordering::Relaxed) {
            return Ok(PassReport::default());
        }
        let never_read = self.servable.is_empty() && self.view.is_stale();
        let reconfigured = std::mem::take(&mut self.reconfigured);
        if read == Reading::Now
            || (read == Reading::IfStale && self.view.is_stale())
            || never_read
            || reconfigured
        {
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
        let mut room = node_room(maxthreads, self.view.on_node).min(MAX_PASS_CLAIMS);
        let mut report = PassReport {
            on_node: self.view.on_node,
            ..PassReport::default()
        };
        if room == 0 || self.servable.is_empty() {
            report.short_of_tasks = Some(false);
            return Ok(report);
        }
        let (mut plan, mut specs, waiting_for_slots) = self.plan_pass(room);
        report.waiting_for_slots = waiting_for_slots;
        // Per queue, what this pass claimed: max_getwork bounds it, and operators (and the
        // tests) see that it held.
        let mut claimed_here = vec![0u32; plan.len()];
        // Rounds: the room is shared by the scheduler, each queue's share claimed in one
        // batch; a queue that came up short for reasons other than running dry goes again.
        'rounds: for _ in 0..MAX_ROUNDS {
            let most: Vec<u32> = plan.iter().map(|c| c.wanted).collect();
            let shares = share_room(&specs, room, &most, &mut self.rng);
            if shares.iter().all(|n| *n == 0) {
                break;
            }
            for (i, share) in shares.into_iter().enumerate() {
                if stopping.load(Ordering::Relaxed) {
                    break 'rounds;
                }
                if share == 0 || room == 0 {
                    continue;
                }
                let Some(queue) = self
                    .servable
                    .iter()
                    .find(|q| q.queue.id == plan[i].queue)
                    .map(|q| q.queue.clone())
                else {
                    specs[i].available = false;
                    continue;
                };
                let batch = match self
                    .claim_share(&queue, &mut plan[i], share.min(room), executor)
                    .await
                {
                    Ok(Some(batch)) => batch,
                    Ok(None) => {
                        specs[i].available = false;
                        continue;
                    }
                    Err(e) => {
                        self.record_pass_claims(&plan, &claimed_here);
                        return Err(e);
                    }
                };
                report.add_batch(queue.id, &batch);
                claimed_here[i] += batch.claimed;
                plan[i].wanted = plan[i].wanted.saturating_sub(batch.claimed);
                specs[i].running += batch.claimed;
                room -= batch.claimed.min(room);
                if batch.spawn_failed {
                    self.record_pass_claims(&plan, &claimed_here);
                    report.on_node = self.view.on_node;
                    return Ok(report);
                }
                // With max_getwork the batch was the queue's share of this pass.
                let progress = batch.claimed > 0 || batch.lost > 0 || batch.fresh_exclusions;
                if batch.ran_dry
                    || !progress
                    || specs[i].max_getwork.is_some()
                    || plan[i].wanted == 0
                    || plan[i].slots.is_empty()
                {
                    specs[i].available = false;
                }
            }
            if room == 0 {
                break;
            }
        }
        self.record_pass_claims(&plan, &claimed_here);
        report.on_node = self.view.on_node;
        report.more = report.claimed >= MAX_PASS_CLAIMS;
        report.short_of_tasks.get_or_insert(false);
        Ok(report)
    }

    /// Claims `n` tasks of `queue` in one batch; None when the server refused the queue's
    /// read or claim: its own documents are at fault, and every other queue goes on.
    async fn claim_share(
        &mut self,
        queue: &Queue,
        claims: &mut QueueClaims,
        n: u32,
        executor: &Executor,
    ) -> Result<Option<BatchReport>> {
        match self.claim_or_make(queue, claims, n, executor).await {
            Ok(batch) => Ok(Some(batch)),
            Err(e) => match e.refusal() {
                Some(why) => {
                    self.metrics.claim_missed(&queue.name, "refused");
                    self.report_once(format!(
                        "queue {} ({}): the server refused its claims this pass: {why}",
                        queue.name, queue.id
                    ));
                    Ok(None)
                }
                None => Err(e),
            },
        }
    }

    /// Takes the runners that exited since the last pass: their slots are free, a retry they
    /// queued is noted, and their ends are counted.
    fn note_exited_runners(&mut self, executor: &Executor) {
        for exited in executor.take_exited() {
            self.view.runner_exited(exited.queue, exited.slot);
            // Queued again behind the window, perhaps; with the tasks stream closed no event
            // says so.
            if exited.outcome == Some(disbatch_model::task::Outcome::Retry) {
                if let Some(w) = self.windows.get_mut(&exited.queue) {
                    w.reset();
                }
                self.spares.forget(exited.queue);
                self.empty.forget(exited.queue);
            }
            if let Some(at) = exited.retry_at {
                self.retries_due.note(at, exited.queue);
            }
            if let Some(name) = self.queue_names.get(&exited.queue) {
                self.metrics
                    .runner_exited(name, exited.ran_for, exited.success);
                self.metrics.task_finished(name, exited.outcome);
                if exited.discarded {
                    self.metrics.task_discarded(name);
                }
            }
        }
    }

    /// This pass's plan for `room`: what each queue may claim, the queues' states for sharing
    /// the room, and whether a queue had no slot for this node.
    fn plan_pass(&mut self, room: u32) -> (Vec<QueueClaims>, Vec<SpecState>, bool) {
        let states: Vec<QueueState> = self
            .servable
            .iter()
            .map(|q| QueueState {
                id: q.queue.id,
                threads: q.threads,
                running: self.view.running(q.queue.id),
                held_slots: self.view.slots(q.queue.id),
                lane: self.view.lane(q.queue.id, q.threads, &self.node),
                contested: self.view.contested(q.queue.id),
            })
            .collect();
        let plan = plan_claims(&states, room, &mut self.rng);
        let mut waiting_for_slots = false;
        for q in states
            .iter()
            .filter(|q| q.threads > 0 && !plan.iter().any(|c| c.queue == q.id))
        {
            waiting_for_slots = true;
            tracing::debug!(
                queue = %q.id,
                threads = q.threads,
                running = q.running,
                held = ?q.held_slots,
                contested = ?q.contested,
                lane = ?q.lane,
                "no slot for this node in the queue"
            );
        }
        let specs: Vec<SpecState> = plan
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
        (plan, specs, waiting_for_slots)
    }

    fn record_pass_claims(&self, plan: &[QueueClaims], claimed: &[u32]) {
        for (queue, n) in plan.iter().zip(claimed) {
            if let (true, Some(name)) = (*n > 0, self.queue_names.get(&queue.queue)) {
                self.metrics.claimed_in_pass(name, *n);
            }
        }
    }

    /// Fails a task no runner can be handed (or, when the server will not even take that
    /// write, leaves it queued) and never picks it again.
    async fn set_unrunnable(&mut self, id: ObjectId, reason: SkipReason, why: &str) -> Result<()> {
        if self.unrunnable.contains(&id) {
            return Ok(());
        }
        if self.unrunnable.len() >= MAX_UNRUNNABLE {
            self.unrunnable.clear();
        }
        self.unrunnable.insert(id);
        self.store
            .claims()
            .fail_unrunnable_task(id, &self.node, reason, why)
            .await?;
        Ok(())
    }

    /// Forgets where each queue's head was: tasks may have been queued again behind it.
    /// When the next retry this node queued comes due, if one does.
    pub fn next_retry_due(&self) -> Option<Instant> {
        self.retries_due.next()
    }

    /// Reads again from the heads of queues whose retries came due: the retried tasks are
    /// behind their claim windows.
    fn take_due_retries(&mut self) {
        for queue in self.retries_due.take_due(Instant::now()) {
            if let Some(w) = self.windows.get_mut(&queue) {
                w.reset();
            }
            self.spares.forget(queue);
            self.empty.forget(queue);
        }
    }

    pub fn reset_windows(&mut self) {
        self.windows.values_mut().for_each(ClaimWindow::reset);
        self.spares.clear();
    }

    fn report_once(&mut self, message: String) {
        if self.reported.insert(message.clone()) {
            tracing::warn!("{message}");
        }
    }
}

/// The earlier of two times, either perhaps unknown.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
