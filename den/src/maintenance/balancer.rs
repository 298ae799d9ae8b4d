//! QueueBalance inside the DEN: every node may run it, a lease makes one node at a time do it.
//!
//! Each call of [`Balancer::run_once`] that is due (at most every [`BALANCE_INTERVAL`]) takes or
//! renews the lease, reads the balance document, works out the `max_tasks` in force at local
//! time, shares it out over the document's tiers ([`effective_threads`]) and writes the queues'
//! `threads`, then records its health in the balance document for `GET /monitoring`.

use std::collections::BTreeMap;
use std::time::Duration;

use bson::DateTime;
use disbatch_config::BalanceSettings;
use disbatch_model::fleet_time;
use disbatch_model::queue_balance::{
    effective_threads, max_tasks_at, parse_balance_document, Health, LocalTime, QueueLoad,
    QueueState,
};
use disbatch_store::Result;
use disbatch_store::Store;

/// How often a node tries to balance. Disbatch's daemon ran every 30 s; `GET /monitoring`
/// calls the status stale after 60 s, and a failed-over lease must leave room for that.
pub const BALANCE_INTERVAL: Duration = Duration::from_secs(10);

/// How long a lease lasts without renewal: three intervals, so a holder renews it twice before
/// it could lapse, and a dead holder is replaced within about 40 s (lease + one interval),
/// before monitoring's 60 s.
pub const LEASE_DURATION: Duration = Duration::from_secs(30);

/// What one call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BalanceReport {
    /// `balance.enabled` is false in this node's config: nothing read or written.
    Off,
    /// This node tried less than the interval ago.
    NotDue,
    /// Another node holds the lease and balances.
    NotLeaseHolder,
    /// This node held the lease and wrote a status (OK, WARNING or CRITICAL).
    Ran(BalanceRun),
}

/// A pass this node ran as lease holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalanceRun {
    pub health: Health,
    /// As written to the balance document.
    pub message: String,
    /// The total in force now; `None` when not balancing (disabled, misconfigured, no entries).
    pub max_tasks: Option<i64>,
    /// Queues whose `threads` changed (in pretend mode: would have changed), in tier order.
    pub changes: Vec<ThreadChange>,
    /// Balanced queues left alone because they are paused.
    pub paused: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadChange {
    pub queue: String,
    /// The previous `threads`; `None` when it was not a readable number.
    pub from: Option<i64>,
    pub to: i64,
}

impl BalanceRun {
    fn status(health: Health, message: impl Into<String>) -> BalanceRun {
        BalanceRun {
            health,
            message: message.into(),
            max_tasks: None,
            changes: Vec::new(),
            paused: Vec::new(),
        }
    }
}

/// The DEN's QueueBalance job. Keep one per node and call [`Balancer::tick`] from every pass:
/// it rate-limits itself.
#[derive(Debug, Clone)]
pub struct Balancer {
    settings: BalanceSettings,
    utc_offset_secs: i32,
    interval: Duration,
    lease: Duration,
    last_attempt: Option<DateTime>,
    /// Whether the last attempt held the lease, to log hand-overs once.
    holding: bool,
    /// The last status `tick` logged, so a lasting WARNING is logged once, not every interval.
    last_logged: Option<(Health, String)>,
}

impl Balancer {
    /// A balancer for the config's `balance` switches, reading `max_tasks` in UTC until
    /// [`Balancer::with_utc_offset`] says otherwise.
    pub fn new(settings: &BalanceSettings) -> Balancer {
        Balancer {
            settings: settings.clone(),
            utc_offset_secs: 0,
            interval: BALANCE_INTERVAL,
            lease: LEASE_DURATION,
            last_attempt: None,
            holding: false,
            last_logged: None,
        }
    }

    /// The local time `max_tasks` keys are read in, as seconds east of UTC (Disbatch used the
    /// server's local time zone). A fixed offset: it does not follow daylight-saving changes.
    pub fn with_utc_offset(mut self, utc_offset_secs: i32) -> Balancer {
        self.utc_offset_secs = utc_offset_secs;
        self
    }

    /// Overrides [`BALANCE_INTERVAL`] and [`LEASE_DURATION`] (tests use short ones). The lease
    /// must outlast the interval, or the holder loses it between its own passes.
    pub fn with_timing(mut self, interval: Duration, lease: Duration) -> Balancer {
        self.interval = interval;
        self.lease = lease;
        self
    }

    /// For the node loop: one rate-limited attempt at the current time. Never fails: errors
    /// are logged (and recorded as CRITICAL when this node holds the lease), and the next try
    /// comes after the interval, so a balancing problem never stops claiming.
    pub async fn tick(&mut self, store: &Store, node: &str) {
        match self.run_once(store, node, fleet_time::now()).await {
            Ok(BalanceReport::Ran(run)) => {
                let status = (run.health, run.message);
                if self.last_logged.as_ref() != Some(&status) {
                    if status.0 == Health::Ok {
                        tracing::info!(message = %status.1, "QueueBalance");
                    } else {
                        tracing::warn!(status = %status.0, message = %status.1, "QueueBalance");
                    }
                    self.last_logged = Some(status);
                }
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(
                error = %e,
                retry_in = ?self.interval,
                "QueueBalance pass failed"
            ),
        }
    }

    /// One attempt at `now`: does nothing when balancing is off in the config, when the last
    /// attempt was less than the interval ago, or when another node holds the lease. Errors
    /// are database failures; a misconfigured balance document is a CRITICAL status, not an
    /// error.
    pub async fn run_once(
        &mut self,
        store: &Store,
        node: &str,
        now: DateTime,
    ) -> Result<BalanceReport> {
        if !self.settings.enabled {
            return Ok(BalanceReport::Off);
        }
        if !self.due(now) {
            return Ok(BalanceReport::NotDue);
        }
        // Counted as an attempt even if it fails, so a failing database is retried at the
        // interval, not on every one-second pass.
        self.last_attempt = Some(now);

        let ours = store
            .queues()
            .take_balance_lease(node, now, self.lease)
            .await?;
        if ours != self.holding {
            if ours {
                tracing::info!(node, "this node now runs QueueBalance");
            } else {
                tracing::info!(node, "another node runs QueueBalance now");
            }
            self.holding = ours;
        }
        if !ours {
            return Ok(BalanceReport::NotLeaseHolder);
        }

        let now_secs = now.timestamp_millis().div_euclid(1000);
        let run = match self.balance(store, now_secs).await {
            Ok(run) => run,
            Err(e) => {
                let message = format!("QueueBalance: {e}");
                if let Err(write) = store
                    .queues()
                    .record_balance_status(Health::Critical.as_str(), &message, now_secs)
                    .await
                {
                    tracing::warn!(error = %write, "could not record the QueueBalance failure");
                }
                return Err(e);
            }
        };
        store
            .queues()
            .record_balance_status(run.health.as_str(), &run.message, now_secs)
            .await?;
        Ok(BalanceReport::Ran(run))
    }

    /// For a stopping node: gives up the lease, if held, so another node takes over at its
    /// next attempt rather than when the lease expires. Best effort: failures are logged.
    /// (A later attempt by this balancer simply takes the lease again.)
    pub async fn release(&self, store: &Store, node: &str) {
        if !self.holding {
            return;
        }
        if let Err(e) = store.queues().release_balance_lease(node).await {
            tracing::warn!(error = %e, "could not release the QueueBalance lease; it expires by itself");
        }
    }

    fn due(&self, now: DateTime) -> bool {
        let Some(last) = self.last_attempt else {
            return true;
        };
        let elapsed = now
            .timestamp_millis()
            .saturating_sub(last.timestamp_millis());
        let interval = i64::try_from(self.interval.as_millis()).unwrap_or(i64::MAX);
        // A clock that went backwards must not stop balancing until it catches up.
        elapsed < 0 || elapsed >= interval
    }

    /// The work of a pass as lease holder; returns the status to record.
    async fn balance(&self, store: &Store, now_secs: i64) -> Result<BalanceRun> {
        let pretend = self.settings.pretend;
        let document = store.queues().balance_document().await?;
        let plan = match parse_balance_document(document.as_ref()) {
            Ok(plan) => plan,
            Err(reason) => {
                // Leave every queue as it is: a half-understood document is no basis for limits.
                return Ok(BalanceRun::status(
                    Health::Critical,
                    format!("QueueBalance: {reason}"),
                ));
            }
        };
        if let Some(until) = plan.disabled {
            if until > now_secs {
                let local = LocalTime::from_unix(until, self.utc_offset_secs);
                return Ok(BalanceRun::status(
                    Health::Ok,
                    format!("QueueBalance disabled until {local}"),
                ));
            }
            if !pretend {
                store
                    .queues()
                    .clear_expired_balance_disabled(now_secs)
                    .await?;
                tracing::info!("QueueBalance is no longer disabled");
            }
        }
        let running = if pretend {
            "QueueBalance is running (pretend)"
        } else {
            "QueueBalance is running"
        };
        let names: Vec<String> = plan.tiers.iter().flatten().cloned().collect();
        if names.is_empty() {
            return Ok(BalanceRun::status(Health::Ok, running));
        }
        let local = LocalTime::from_unix(now_secs, self.utc_offset_secs);
        let Some(max_tasks) = max_tasks_at(&plan.max_tasks, local.week_time()) else {
            return Ok(BalanceRun::status(
                Health::Warning,
                "QueueBalance: max_tasks has no entries; queue threads left alone",
            ));
        };

        let states = store.queues().balance_queue_states(&names).await?;
        let by_name: BTreeMap<&str, &QueueState> =
            states.iter().map(|s| (s.name.as_str(), s)).collect();
        let unknown: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| !by_name.contains_key(n))
            .collect();
        // Unknown names drop out of their tier; a paused queue can claim nothing, so it waits
        // for nothing, but what it still runs occupies capacity.
        let tiers: Vec<Vec<QueueLoad>> = plan
            .tiers
            .iter()
            .map(|tier| {
                tier.iter()
                    .filter_map(|name| by_name.get(name.as_str()))
                    .map(|s| {
                        let queued = if s.paused { 0 } else { s.queued };
                        QueueLoad::new(s.name.clone(), queued, s.running)
                    })
                    .collect()
            })
            .collect();
        let limits = effective_threads(max_tasks, &tiers);
        if self.settings.verbose {
            tracing::info!(max_tasks, local = %local, ?tiers, ?limits, "QueueBalance computed");
        }

        let mut run = BalanceRun::status(Health::Ok, running);
        run.max_tasks = Some(max_tasks);
        for name in &names {
            let (Some(state), Some(&to)) = (by_name.get(name.as_str()), limits.get(name)) else {
                continue;
            };
            if state.paused {
                run.paused.push(name.clone());
                continue;
            }
            if state.threads == Some(to) {
                continue;
            }
            if !pretend && !store.queues().set_balanced_threads(&state.id, to).await? {
                // Paused or deleted since it was read: the next pass sees it as it is.
                continue;
            }
            if self.settings.log || self.settings.verbose {
                tracing::info!(queue = %name, from = ?state.threads, to, pretend, "QueueBalance changed threads");
            } else {
                tracing::debug!(queue = %name, from = ?state.threads, to, pretend, "QueueBalance changed threads");
            }
            run.changes.push(ThreadChange {
                queue: name.clone(),
                from: state.threads,
                to,
            });
        }
        if !unknown.is_empty() {
            run.health = Health::Warning;
            run.message = format!(
                "{running}; unknown queues in the balance document were skipped: {}",
                unknown.join(", ")
            );
        }
        Ok(run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enabled() -> BalanceSettings {
        BalanceSettings {
            enabled: true,
            ..Default::default()
        }
    }

    #[test]
    fn attempts_are_rate_limited_by_the_interval() {
        let mut b = Balancer::new(&enabled());
        let t = DateTime::from_millis(1_000_000);
        assert!(b.due(t), "the first attempt is always due");
        b.last_attempt = Some(t);
        assert!(!b.due(DateTime::from_millis(1_000_000 + 9_999)));
        assert!(b.due(DateTime::from_millis(1_000_000 + 10_000)));
        assert!(
            b.due(DateTime::from_millis(1_000_000 - 1)),
            "a clock that went back does not block balancing"
        );
    }

    #[test]
    fn defaults_leave_monitoring_room_for_a_failover() {
        // A dead holder's lease lapses after LEASE_DURATION; the next node tries within one
        // interval after that. Monitoring reports CRITICAL after 60 s without a status.
        assert!(LEASE_DURATION > BALANCE_INTERVAL * 2);
        assert!(LEASE_DURATION + BALANCE_INTERVAL < Duration::from_secs(60));
    }
}
