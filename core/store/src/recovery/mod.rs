//! Taking back what a lost node or runner held: lease expiry, lost tasks and their attempt records.

pub(crate) mod leases;
pub(crate) mod lost;
pub(crate) mod lost_records;
pub(crate) mod orphans;
