//! The cron maker: the maintenance leader enqueues one task per tick of each queue's `schedule`.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bson::oid::ObjectId;
use disbatch_model::fleet_time;
use disbatch_model::schedule::{self, Plan, Schedule};
use disbatch_model::Queue;
use disbatch_store::Result;
use disbatch_store::{parse_queue, Store};

use crate::metrics::DenMetrics;

/// The leader's schedule keeping between passes. A new leader starts from what the queue
/// documents say: the ticks settled, and the unique index for what a dead leader enqueued.
#[derive(Debug)]
pub struct Schedules {
    grace: Duration,
    /// When this leader's last pass began, in this term: ticks since then are late only
    /// because the pass was, and are enqueued however late (a slow leader drops none).
    last_pass: Option<bson::DateTime>,
    /// Queues whose schedule is skipped now, with the reason last logged.
    skipped: HashMap<ObjectId, String>,
    /// Whether this term made sure of the unique index on ticks.
    index_made: bool,
}

impl Schedules {
    /// For nodes passing every `loop_interval` (it sets how late a tick may be).
    pub fn new(loop_interval: Duration) -> Schedules {
        Schedules {
            grace: schedule::grace(loop_interval),
            last_pass: None,
            skipped: HashMap::new(),
            index_made: false,
        }
    }

    /// For a node that stops leading: the next leader keeps the schedules.
    pub fn forget(&mut self, metrics: &DenMetrics) {
        if !self.skipped.is_empty() {
            self.skipped.clear();
            metrics.schedules_invalid(0);
        }
        self.index_made = false;
        self.last_pass = None;
    }

    /// One pass over every scheduled queue: their due ticks enqueued, missed ones settled by
    /// policy, a paused queue's passed over. `reading`, the claimer's (None when stale), only
    /// says whether any queue has a schedule: those that do are read afresh, so a pause or
    /// another leader's last tick is never a reading old.
    pub async fn pass(
        &mut self,
        store: &Store,
        reading: Option<&[Queue]>,
        metrics: &DenMetrics,
    ) -> Result<()> {
        let none = |qs: &[Queue]| !qs.iter().any(Queue::has_schedule);
        let started = fleet_time::now();
        if reading.is_some_and(none) && self.skipped.is_empty() {
            self.last_pass = Some(started);
            return Ok(());
        }
        // Ticks since this term's last pass were this leader's to enqueue: missed only by a
        // gap in leadership, which a new term's first pass judges by the grace alone.
        let grace = match self.last_pass {
            Some(last) => {
                let since = started
                    .timestamp_millis()
                    .saturating_sub(last.timestamp_millis());
                let since = u64::try_from(since).unwrap_or(0);
                self.grace
                    .max(Duration::from_millis(since) + Duration::from_secs(1))
            }
            None => self.grace,
        };
        let mut seen = HashSet::new();
        for d in store.queues().scheduled_queues().await? {
            // A queue without an ObjectId `_id` is reported by the queue reading already.
            let Ok(q) = parse_queue(&d) else { continue };
            seen.insert(q.id);
            match self.keep(store, &q, grace, metrics).await {
                Ok(None) => self.readable(&q),
                Ok(Some(why)) => self.skip(&q, why),
                Err(e) => match e.refusal() {
                    Some(why) => self.skip(&q, format!("the server refused a write: {why}")),
                    None => return Err(e),
                },
            }
        }
        self.skipped.retain(|id, _| seen.contains(id));
        metrics.schedules_invalid(self.skipped.len());
        // Only a pass that went through: one that failed left its ticks for the next.
        self.last_pass = Some(started);
        Ok(())
    }

    /// Keeps one queue's schedule; Some(reason) when it cannot be kept.
    async fn keep(
        &mut self,
        store: &Store,
        q: &Queue,
        grace: Duration,
        metrics: &DenMetrics,
    ) -> Result<Option<String>> {
        let schedule = match schedule::read(&q.raw) {
            None => return Ok(None),
            Some(Err(why)) => return Ok(Some(why)),
            Some(Ok(s)) => s,
        };
        let now = fleet_time::now();
        let basis = schedule.basis();
        let counted = q.schedule_basis() == Some(basis.as_str());
        let last = q
            .schedule_last()
            .filter(|_| counted)
            .and_then(schedule::from_bson);
        let (Some(last), Some(chrono_now)) = (last, schedule::from_bson(now)) else {
            // New, changed, or its record unreadable: it starts from now, owing nothing before.
            if store
                .queues()
                .start_schedule(q.id, &basis, now, counted)
                .await?
            {
                tracing::info!(queue = %q.id, name = %q.name, schedule = %basis, "schedule started: ticks from now on are enqueued");
            }
            return Ok(None);
        };
        let plan = match schedule.plan(last, chrono_now, grace) {
            Ok(plan) => plan,
            Err(why) => return Ok(Some(why)),
        };
        let Some(through) = plan.through else {
            return Ok(None);
        };
        let ticks = plan.due.len() as u64 + plan.skipped;
        // As `continuous_queues` reads a pause; threads a node cannot read stop it too.
        let paused = q.spec.paused || !matches!(q.threads, Ok(t) if t > 0);
        if paused {
            metrics.schedule_ticks(&q.name, "paused", ticks);
        } else {
            self.enqueue(store, q, &schedule, &plan, metrics).await?;
        }
        store
            .queues()
            .settle_schedule(q.id, &basis, schedule::to_bson(through))
            .await?;
        Ok(None)
    }

    async fn enqueue(
        &mut self,
        store: &Store,
        q: &Queue,
        schedule: &Schedule,
        plan: &Plan,
        metrics: &DenMetrics,
    ) -> Result<()> {
        if !plan.due.is_empty() && !self.index_made {
            store.queues().ensure_schedule_index().await?;
            self.index_made = true;
        }
        for due in &plan.due {
            let tick = schedule::to_bson(due.tick);
            let made = store
                .queues()
                .insert_scheduled_task(q.id, tick, &schedule.params, due.missed)
                .await?;
            let outcome = match (made, due.missed) {
                (false, _) => "already",
                (true, Some(_)) => "missed_once",
                (true, None) => "enqueued",
            };
            metrics.schedule_ticks(&q.name, outcome, 1);
            if let (true, Some(missed)) = (made, due.missed) {
                tracing::info!(queue = %q.id, name = %q.name, %tick, missed, "ticks missed past the grace: one task enqueued for the latest");
            }
        }
        if plan.skipped > 0 {
            metrics.schedule_ticks(&q.name, "skipped", plan.skipped);
            tracing::info!(queue = %q.id, name = %q.name, skipped = plan.skipped, policy = schedule.missed.as_str(), "ticks missed past the grace were not enqueued");
        }
        Ok(())
    }

    /// Warns when a queue's schedule starts being skipped or its reason changes.
    fn skip(&mut self, q: &Queue, why: String) {
        if self.skipped.get(&q.id) != Some(&why) {
            tracing::warn!(queue = %q.id, name = %q.name, "schedule skipped: {why}");
            self.skipped.insert(q.id, why);
        }
    }

    fn readable(&mut self, q: &Queue) {
        if self.skipped.remove(&q.id).is_some() {
            tracing::info!(queue = %q.id, name = %q.name, "schedule is kept again");
        }
    }
}
