//! The maintenance lease: which node of the fleet runs recovery and continuous units.

use std::time::Duration;

use bson::{doc, DateTime};

use super::schema::{lease, LEASES, MAINTENANCE_LEASE};
use super::Store;
use crate::error::{Error, Result};

impl Store {
    /// Takes or renews the maintenance lease for `owner` until `now + duration`; false while
    /// another node holds it unexpired. One update either way (see `take_lease`).
    pub async fn take_maintenance_lease(
        &self,
        owner: &str,
        now: DateTime,
        duration: Duration,
    ) -> Result<bool> {
        self.take_lease(MAINTENANCE_LEASE, owner, now, duration)
            .await
    }

    /// Lets the maintenance lease lapse now if `owner` holds it: a stopping leader hands over
    /// at the next node's try instead of a whole lease later.
    pub async fn release_maintenance_lease(&self, owner: &str) -> Result<bool> {
        self.collection(LEASES)
            .update_one(
                doc! {lease::ID: MAINTENANCE_LEASE, lease::OWNER: owner},
                doc! {"$set": {lease::UNTIL: DateTime::from_millis(0)}},
            )
            .await
            .map(|r| r.matched_count == 1)
            .map_err(|e| Error::mongo("releasing the maintenance lease", e))
    }
}
