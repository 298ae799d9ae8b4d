//! The node's upkeep as registered chores: each has a name, how often it runs, whether only the
//! maintenance leader runs it, and a run. A maintenance pass runs those due, in their order;
//! the `lead` chore decides whether this node leads, and a leader-only chore is stopped (what
//! it keeps dropped) on the first pass this node does not lead.

mod every_node;
mod leader;

use std::time::{Duration, Instant};

use disbatch_model::Queue;
use disbatch_store::{Result, Store};
use futures::future::BoxFuture;

use crate::claimer::Claimer;
use crate::maintenance::balancer::Balancer;
use crate::maintenance::pruner::Pruner;
use crate::metrics::DenMetrics;
use crate::runners::executor::Executor;
use crate::wake::notifier::Notifier;

/// In loop intervals: how often an idle node (no runners, nothing claimed by its last pass,
/// no queue waiting for a slot) reads queues and running counts on its timer. Work signals
/// wake it for new, requeued and come-due tasks (the leader at once, through its stream; the
/// others at their next heartbeat, through the leader's fan-out); this reading catches
/// whatever no signal reported (a signal lost to an outage or a leader change, a task whose
/// `_id` is older than the probe's bound) at a cost of 0.3 requests/s per idle node at the
/// default interval. The leader's chores take a reading within two intervals more.
pub const IDLE_READ_INTERVALS: u32 = 10;
/// In loop intervals: a node whose heartbeat is older than this gets no fan-out.
pub const FANOUT_LIVE_INTERVALS: u32 = 5;

/// How often a chore runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Every {
    /// On every maintenance pass (the chore may keep a longer period of its own).
    Pass,
    /// At most once per period, from the end of its last run.
    Period(Duration),
    /// When its last run said (the lease recovery: when the next lease may pass).
    AsItSays,
}

/// Whether a chore runs before the pass claims tasks, or after (so it never delays a claim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    BeforeClaim,
    AfterClaim,
}

/// When a chore is next due, as its run says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Its period from now (for `Every::Pass`: the next maintenance pass).
    Period,
    /// At this time.
    At(Instant),
    /// It had nothing to do this pass: due again on the next one.
    NextPass,
}

/// What a maintenance pass lends its chores.
pub struct Cx<'a> {
    pub store: &'a Store,
    pub name: &'a str,
    pub interval: Duration,
    pub metrics: &'a DenMetrics,
    pub executor: &'a Executor,
    pub claimer: &'a mut Claimer,
    pub notifier: Option<&'a Notifier>,
    /// Since the database last answered after an outage (leases are judged after it).
    pub connected_for: Duration,
    /// This node is short of tasks or runs nothing: it starts new work on the leader's marks.
    pub waiting_for_work: bool,
    /// Set by the `lead` chore, read by those after it.
    pub leading: bool,
    /// The shutdown began: nothing new is started.
    pub stopping: bool,
    queues: Option<Vec<Queue>>,
}

impl<'a> Cx<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: &'a Store,
        name: &'a str,
        interval: Duration,
        metrics: &'a DenMetrics,
        executor: &'a Executor,
        claimer: &'a mut Claimer,
        notifier: Option<&'a Notifier>,
        connected_for: Duration,
    ) -> Cx<'a> {
        Cx {
            store,
            name,
            interval,
            metrics,
            executor,
            claimer,
            notifier,
            connected_for,
            waiting_for_work: false,
            leading: false,
            stopping: false,
            queues: None,
        }
    }

    /// The queues, read once for the pass: the claimer's reading, kept fresh by queue
    /// changes' events and an idle node's periodic reading (one request less on each of the
    /// leader's passes), else the database's. Two intervals of slack: a reading due every
    /// tenth pass is a little more than ten intervals old just before it is made.
    pub async fn queues(&mut self) -> Result<&[Queue]> {
        if self.queues.is_none() {
            let reading = self
                .claimer
                .queues_read_within(self.interval * (IDLE_READ_INTERVALS + 2))
                .map(<[Queue]>::to_vec);
            self.queues = Some(match reading {
                Some(queues) => queues,
                None => self.store.queues().list_queues().await?.0,
            });
        }
        Ok(self.queues.as_deref().unwrap_or_default())
    }
}

/// What the registry knows of a chore besides its work: its name, how often it runs, whether
/// only the maintenance leader runs it, its phase, and how long after start it is first due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub name: &'static str,
    pub every: Every,
    pub leader_only: bool,
    pub phase: Phase,
    first_after: Duration,
}

impl Spec {
    pub fn on_every_node(name: &'static str, every: Every) -> Spec {
        Spec {
            name,
            every,
            leader_only: false,
            phase: Phase::BeforeClaim,
            first_after: Duration::ZERO,
        }
    }

    pub fn leader(name: &'static str, every: Every) -> Spec {
        Spec {
            leader_only: true,
            ..Spec::on_every_node(name, every)
        }
    }

    /// Runs after the pass claims, so it never delays a claim.
    pub fn after_claim(self) -> Spec {
        Spec {
            phase: Phase::AfterClaim,
            ..self
        }
    }

    /// First due this long after start, not at the first maintenance pass.
    pub fn first_after(self, after: Duration) -> Spec {
        Spec {
            first_after: after,
            ..self
        }
    }

    pub fn runs(self, chore: impl Chore + 'static) -> Registered {
        (self, Box::new(chore))
    }
}

/// A chore as registered: what it is, and its work.
pub type Registered = (Spec, Box<dyn Chore>);

/// The work of one chore of the node's upkeep.
pub trait Chore: Send {
    fn run<'a, 'b: 'a>(&'a mut self, cx: &'a mut Cx<'b>) -> BoxFuture<'a, Result<Next>>;
    /// This node does not lead (a leader-only chore): drop what only a leader keeps. True when
    /// the chore is then due at once, should the node lead again.
    fn stop(&mut self, _metrics: &DenMetrics) -> bool {
        false
    }
    /// The node stops: give back what it holds in the database (a lease).
    fn release<'a>(&'a mut self, _store: &'a Store, _node: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

struct Entry {
    spec: Spec,
    chore: Box<dyn Chore>,
    next: Instant,
    stopped: bool,
}

/// The registered chores, in the order a pass runs them.
pub struct Chores {
    entries: Vec<Entry>,
}

/// What the standard chores are made from.
pub struct Settings {
    pub name: String,
    pub interval: Duration,
    pub dead_node_after: Duration,
    pub counts_reconcile: Duration,
    pub stats_interval: Duration,
    pub pruner: Pruner,
    pub balancer: Balancer,
}

impl Chores {
    pub fn new(chores: Vec<Registered>) -> Chores {
        let now = Instant::now();
        let entries = chores
            .into_iter()
            .map(|(spec, chore)| Entry {
                next: now + spec.first_after,
                spec,
                chore,
                stopped: false,
            })
            .collect();
        Chores { entries }
    }

    /// Every chore of a DEN, in the order a pass runs them.
    pub fn standard(s: Settings) -> Chores {
        let mut chores = every_node::before_leading(s.interval);
        let balancer = s.balancer;
        chores.extend(leader::chores(
            &s.name,
            s.interval,
            s.dead_node_after,
            s.counts_reconcile,
            s.stats_interval,
            s.pruner,
        ));
        chores.extend(every_node::after_leading(balancer));
        Chores::new(chores)
    }

    /// Each chore's name, period, whether only the leader runs it, and its phase: what the
    /// book lists.
    pub fn catalog(&self) -> Vec<(&'static str, Every, bool, Phase)> {
        self.entries
            .iter()
            .map(|e| (e.spec.name, e.spec.every, e.spec.leader_only, e.spec.phase))
            .collect()
    }

    /// Runs the chores of `phase` that are due, in order; the first failure ends the pass.
    pub async fn run_due(&mut self, phase: Phase, cx: &mut Cx<'_>) -> Result<()> {
        for e in self.entries.iter_mut().filter(|e| e.spec.phase == phase) {
            if e.spec.leader_only && !cx.leading {
                if !e.stopped && e.chore.stop(cx.metrics) {
                    e.next = Instant::now();
                }
                e.stopped = true;
                continue;
            }
            e.stopped = false;
            if Instant::now() < e.next {
                continue;
            }
            match e.chore.run(cx).await? {
                Next::Period => {
                    if let Every::Period(period) = e.spec.every {
                        e.next = Instant::now() + period;
                    }
                }
                Next::At(at) => e.next = at,
                Next::NextPass => {}
            }
        }
        Ok(())
    }

    /// The node stops: the chores of `phase` drop what they keep (background runs end), then
    /// give back what they hold (the maintenance lease, the balancer's).
    pub async fn stop(&mut self, phase: Phase, store: &Store, node: &str, metrics: &DenMetrics) {
        let of_phase = |e: &&mut Entry| e.spec.phase == phase;
        for e in self.entries.iter_mut().filter(of_phase) {
            e.chore.stop(metrics);
        }
        for e in self.entries.iter_mut().filter(of_phase) {
            e.chore.release(store, node).await;
        }
    }
}
