//! Flow limits across nodes: key slots, rate windows and the flow view the claimer reads.

pub(crate) mod flow_view;
pub(crate) mod key_slots;
pub(crate) mod rate_limits;
