//! The elector: one node of the fleet at a time leads its maintenance (recovery of lost
//! tasks and silent nodes' claims, continuous units, cron ticks), by holding a lease in the
//! database, so the fleet's cost of maintenance does not grow with the number of nodes.
//!
//! The lease is taken and judged on the fleet's time (`fleet_time`, the server's clock), so
//! a node that joins with its host clock ahead does not see a live leader's lease as lapsed.
//! A leader whose host was suspended resumes with that time moved on by the suspend (the
//! boot clock counts it): it sees its lease over, leads nothing until it wins the lease
//! again, and by then another node has taken it if the suspend outlasted the lease.

use std::time::{Duration, Instant};

use bson::DateTime;
use disbatch_model::fleet_time;
use disbatch_store::Store;

#[derive(Debug)]
pub struct Elector {
    lease: Duration,
    try_every: Duration,
    next_try: Option<Instant>,
    /// Until when this node's last successful take keeps it leader, on the fleet's time.
    leads_until: Option<DateTime>,
    /// The node with a sane clock this one leaves the lead to while its own clock is off
    /// (logged when it changes).
    deferring_to: Option<String>,
    /// Whether it led at its last answer: a lease that lapsed between tries (the host was
    /// suspended, or renewals failed) is logged as the end of its lead too.
    said_leading: bool,
}

impl Elector {
    pub fn new(lease: Duration, try_every: Duration) -> Elector {
        Elector {
            lease,
            try_every: try_every.min(lease / 2),
            next_try: None,
            leads_until: None,
            deferring_to: None,
            said_leading: false,
        }
    }

    /// Whether this node leads now, asking the database at most every `try_every`. A failed
    /// try counts as not leading: two leaders would only repeat conditional recoveries, but
    /// a node cut off from the database has nothing to lead. `live_within`: how recent a
    /// heartbeat makes another node live, for the rule on clocks that are off.
    pub async fn leads(&mut self, store: &Store, node: &str, live_within: Duration) -> bool {
        let now = Instant::now();
        if self.next_try.is_none_or(|t| now >= t) {
            self.next_try = Some(now + self.try_every);
            self.try_lease(store, node, live_within).await;
        }
        let leads = self.is_leader();
        match (std::mem::replace(&mut self.said_leading, leads), leads) {
            (false, true) => tracing::info!(node, "leading the fleet's maintenance"),
            (true, false) => tracing::info!(node, "no longer leading the fleet's maintenance"),
            _ => {}
        }
        leads
    }

    async fn try_lease(&mut self, store: &Store, node: &str, live_within: Duration) {
        if fleet_time::is_off() {
            match store
                .nodes()
                .live_node_with_sane_clock(node, live_within, fleet_time::SKEW_BOUND)
                .await
            {
                Ok(Some(other)) => {
                    if self.deferring_to.as_deref() != Some(other.as_str()) {
                        tracing::warn!(
                            node, sane_node = %other, offset_ms = fleet_time::offset_ms().unwrap_or(0),
                            "this host's clock is off: leaving the fleet's maintenance to a node whose clock is not"
                        );
                    }
                    self.deferring_to = Some(other);
                    self.release(store, node).await;
                    return;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "could not read which nodes' clocks are sane");
                    self.leads_until = None;
                    return;
                }
            }
        }
        self.deferring_to = None;
        // Counted from before the request: the lease in the database ends later.
        let taken_at = fleet_time::now();
        match store
            .nodes()
            .take_maintenance_lease(node, taken_at, self.lease)
            .await
        {
            Ok(true) => {
                let lease = i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX);
                self.leads_until = Some(DateTime::from_millis(
                    taken_at.timestamp_millis().saturating_add(lease),
                ));
            }
            Ok(false) => self.leads_until = None,
            Err(e) => {
                tracing::warn!(error = %e, "could not take or renew the maintenance lease");
                self.leads_until = None;
            }
        }
    }

    fn is_leader(&self) -> bool {
        self.leads_until
            .is_some_and(|t| fleet_time::now().timestamp_millis() < t.timestamp_millis())
    }

    /// For a stopping node, or one whose clock is off: hands leadership over at once. Best
    /// effort.
    pub async fn release(&mut self, store: &Store, node: &str) {
        if self.leads_until.take().is_some() {
            if let Err(e) = store.nodes().release_maintenance_lease(node).await {
                tracing::warn!(error = %e, "could not release the maintenance lease; it lapses by itself");
            }
        }
    }
}
