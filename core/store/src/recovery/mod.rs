//! Taking back what a lost node or runner held: lease expiry, lost tasks and their attempt records.

domain_handle!(
    /// Recovery: leases, orphans and lost tasks taken back, with their attempt records.
    RecoveryStore,
    recovery
);

pub(crate) mod leases;
pub(crate) mod lost;
pub(crate) mod lost_records;
pub(crate) mod orphans;
