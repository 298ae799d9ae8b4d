//! Persistent workers (plugins/PROTOCOL.md): long-lived plugin processes each running one task
//! at a time, held by a worker host, the task runner in `--worker-host` mode.

pub mod batch;
pub mod host;
pub(crate) mod launch;
pub mod message;
mod node_pipe;
pub mod pool;
pub mod process;

pub use pool::{Lent, Pool};
