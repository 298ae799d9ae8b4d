//! Dependencies, graphs, batches and work units: what waits on what, and its release.

pub(crate) mod dependencies;
pub(crate) mod graphs;
pub(crate) mod releases;
pub(crate) mod units;
pub(crate) mod views;
