//! Claiming: the candidates a pass reads and the claim of a batch of them.

pub(in crate::store) mod batch;
pub(in crate::store) mod candidates;
pub(in crate::store) mod running;
