//! The task runner and what plugins see and hand back: output, results, persistent workers.

mod dtr_direct;
mod gridfs_output;
mod live_output;
mod live_output_bytes;
mod live_output_views;
mod persistent_worker_hosts;
mod persistent_workers;
mod plugin_contract;
mod result_refusals;
mod result_relay;
mod results;
mod worker_protocol_paths;
