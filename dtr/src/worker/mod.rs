//! Persistent workers (plugins/PROTOCOL.md): long-lived plugin processes each running one task
//! at a time, held by a worker host, the task runner in `--worker-host` mode.

pub mod batch;
pub mod host;
pub mod message;
mod node_pipe;
pub mod pool;
pub mod process;
pub mod run;

pub use pool::{Lent, Pool};
