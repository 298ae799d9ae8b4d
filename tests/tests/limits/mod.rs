//! Caps and shares across nodes: flow limits, rate windows, queue balance and fair shares.

mod balance_service;
mod continuous_share;
mod fair_sharing;
mod flow_limits;
mod flow_limits_view;
mod held_view;
mod rate_windows;
mod shares_on_a_busy_machine;
