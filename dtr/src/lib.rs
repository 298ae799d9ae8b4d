//! The task runner: starts one claimed task, runs its plugin, and records the result.

mod attempt;
mod conclude;
pub mod connection;
mod launch;
pub mod live;
pub mod node_link;
pub mod outcome;
pub mod plugin_process;
pub mod prepare;
pub mod record;
pub mod runner;
pub mod sink;
pub mod spool;
pub mod supervisor;
pub mod worker;
