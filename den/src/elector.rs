//! The elector: one node of the fleet at a time leads its maintenance (recovery of lost
//! tasks and silent nodes' claims, continuous units), by holding a lease in the database, so
//! the fleet's cost of maintenance does not grow with the number of nodes.

use std::time::{Duration, Instant};

use bson::DateTime;
use disbatch_core::store::Store;

/// How long leadership lasts without renewal: a dead leader is replaced within this plus one
/// try of another node.
pub const LEASE: Duration = Duration::from_secs(15);
/// How often the leader renews and the others try: a third of the lease, so a leader renews
/// twice before it could lapse, while a follower costs one request per interval.
pub const TRY_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct Elector {
    lease: Duration,
    try_every: Duration,
    next_try: Option<Instant>,
    /// Until when this node's last successful take keeps it leader (by its own clock).
    leads_until: Option<Instant>,
}

impl Default for Elector {
    fn default() -> Self {
        Elector::new(LEASE, TRY_EVERY)
    }
}

impl Elector {
    pub fn new(lease: Duration, try_every: Duration) -> Elector {
        Elector {
            lease,
            try_every: try_every.min(lease / 2),
            next_try: None,
            leads_until: None,
        }
    }

    /// Whether this node leads now, asking the database at most every `try_every`. A failed
    /// try counts as not leading: two leaders would only repeat conditional recoveries, but
    /// a node cut off from the database has nothing to lead.
    pub async fn leads(&mut self, store: &Store, node: &str) -> bool {
        let now = Instant::now();
        if self.next_try.is_none_or(|t| now >= t) {
            self.next_try = Some(now + self.try_every);
            let was = self.is_leader();
            match store
                .take_maintenance_lease(node, DateTime::now(), self.lease)
                .await
            {
                // Counted from before the request: the lease in the database ends later.
                Ok(true) => self.leads_until = Some(now + self.lease),
                Ok(false) => self.leads_until = None,
                Err(e) => {
                    tracing::warn!(error = %e, "could not take or renew the maintenance lease");
                    self.leads_until = None;
                }
            }
            match (was, self.is_leader()) {
                (false, true) => tracing::info!(node, "leading the fleet's maintenance"),
                (true, false) => tracing::info!(node, "no longer leading the fleet's maintenance"),
                _ => {}
            }
        }
        self.is_leader()
    }

    fn is_leader(&self) -> bool {
        self.leads_until.is_some_and(|t| Instant::now() < t)
    }

    /// For a stopping node: hands leadership over at once. Best effort.
    pub async fn release(&mut self, store: &Store, node: &str) {
        if self.leads_until.take().is_some() {
            if let Err(e) = store.release_maintenance_lease(node).await {
                tracing::warn!(error = %e, "could not release the maintenance lease; it lapses by itself");
            }
        }
    }
}
