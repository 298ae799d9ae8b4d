//! Dependencies, graphs, batches and work units: what waits on what, and its release.

domain_handle!(
    /// Workflows: dependencies, graphs, batches and work units.
    WorkflowStore,
    workflows
);

pub(crate) mod dependencies;
pub(crate) mod graphs;
pub(crate) mod releases;
pub(crate) mod units;
pub(crate) mod views;
