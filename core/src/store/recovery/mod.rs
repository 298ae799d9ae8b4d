//! Taking back what a lost node or runner held: lease expiry, lost tasks and their attempt records.

pub(in crate::store) mod leases;
pub(in crate::store) mod lost;
pub(in crate::store) mod lost_records;
pub(in crate::store) mod orphans;
