//! Flow limits across nodes: key slots, rate windows and the flow view the claimer reads.

pub(in crate::store) mod flow_view;
pub(in crate::store) mod key_slots;
pub(in crate::store) mod rate_limits;
