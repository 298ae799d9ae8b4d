//! The store against a real server: claims, slots, counts, probes and what they rely on.

mod attempt_pairs;
mod claims;
mod probes;
mod running;
mod server_contract;
mod slots;
mod task_counts;
