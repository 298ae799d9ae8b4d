//! The pipes between a DEN and its runners: the handoff, the result relay and result batches.

pub mod handoff;
pub mod relay;
pub mod result_batches;
