//! Claiming: the candidates a pass reads and the claim of a batch of them.

pub(crate) mod batch;
pub(crate) mod candidates;
pub(crate) mod running;
