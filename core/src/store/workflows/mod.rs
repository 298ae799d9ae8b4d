//! Dependencies, graphs, batches and work units: what waits on what, and its release.

pub(in crate::store) mod dependencies;
pub(in crate::store) mod graphs;
pub(in crate::store) mod releases;
pub(in crate::store) mod units;
pub(in crate::store) mod views;
