//! Real DENs: claims, scheduling, leases, retries, the maintenance leader, start-up and shutdown.

mod attempts;
mod basic;
mod coordinate_semantics;
mod idle_cost;
mod leases;
mod lifecycle;
mod maintenance_leader;
mod metrics;
mod retention;
mod retry_policies;
mod retry_policy_api;
mod run_control;
mod scheduler;
mod two_nodes;
mod wakeups;
