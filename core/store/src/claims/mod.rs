//! Claiming: the candidates a pass reads and the claim of a batch of them.

domain_handle!(
    /// Claiming: reading candidates and claiming batches of them, and what runs where.
    ClaimStore,
    claims
);

pub(crate) mod batch;
pub(crate) mod candidates;
pub(crate) mod running;
