//! The maintenance lease: which node of the fleet runs recovery and continuous units.

use crate::NodeStore;
use std::time::Duration;

use bson::DateTime;

use crate::error::Result;
use disbatch_model::schema::MAINTENANCE_LEASE;

impl NodeStore<'_> {
    /// Takes or renews the maintenance lease for `owner` until `now + duration`; false while
    /// another node holds it unexpired. One update either way (see `take_lease`).
    pub async fn take_maintenance_lease(
        self,
        owner: &str,
        now: DateTime,
        duration: Duration,
    ) -> Result<bool> {
        self.take_lease(MAINTENANCE_LEASE, owner, now, duration)
            .await
    }

    /// Lets the maintenance lease lapse now if `owner` holds it: a stopping leader hands over
    /// at the next node's try instead of a whole lease later.
    pub async fn release_maintenance_lease(self, owner: &str) -> Result<bool> {
        self.release_lease(MAINTENANCE_LEASE, owner).await
    }
}
