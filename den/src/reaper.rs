//! The orphan reaper: claimed tasks that never started become orphaned, as in Disbatch 4.

use std::time::Duration;

use disbatch_core::store::Store;
use disbatch_core::Result;

/// Disbatch's recommendation: a task still claimed after 5 minutes will not start.
pub const ORPHAN_AGE: Duration = Duration::from_secs(5 * 60);

/// Marks this node's stale claims orphaned (-6) and logs how many.
pub async fn reap_orphaned_tasks(store: &Store, node: &str) -> Result<u64> {
    let reaped = store.reap_orphans(node, ORPHAN_AGE).await?;
    if reaped > 0 {
        tracing::warn!(
            reaped,
            "claimed tasks that never started were marked orphaned (-6)"
        );
    }
    Ok(reaped)
}
