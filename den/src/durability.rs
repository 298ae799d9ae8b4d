//! The start-up line on durability: whether claims, leases and results the server
//! acknowledges survive its failover, with what to set when they do not.

use disbatch_store::durability::Verdict;
use disbatch_store::Store;

/// Asks the server once and logs one line: a warning when a failover could roll back
/// acknowledged writes, else what was found. Never stops the node.
pub async fn report(store: &Store) {
    match store.durability().await {
        Verdict::Warning(text) => tracing::warn!("{text}"),
        other => tracing::info!("{}", other.text()),
    }
}
