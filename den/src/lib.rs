//! The Disbatch execution node: heartbeat, orphan reaping, claiming and runner spawning.

pub mod check_config;
pub mod claimer;
pub mod count_writer;
pub mod durability;
pub mod maintenance;
pub mod metrics;
pub mod node;
pub mod reload;
pub mod runners;
pub mod wake;

pub use node::Node;
