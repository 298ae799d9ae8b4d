//! disbatch-core: what the DEN, the task runner and the DCI share.
//!
//! Grouped by layer (issue 53 regroups the rest the same way):
//! - `text`: bytes and text safe to show, store and log (`printable`, `redact`, `utf8`,
//!   `client_json`, `raw_doc`);
//! - `process`: the process itself (`logging`, `isolation`, `open_files`, `backoff`);
//! - `wire`: the pipes between a DEN and its runners (`handoff`, `relay`, `result_batches`);
//! - `config` reads node configs, `store` owns every MongoDB query, `fleet_time` is the
//!   database server's clock as this process knows it (every time another host judges),
//!   `model` the schema's values, `output` the GridFS placement rules, `plugin` the plugin
//!   allow-list, `claim_plan` the per-pass claim decisions, `durability` whether the write
//!   concern survives a failover.

pub mod balance;
pub mod chaining;
pub mod claim_plan;
pub mod config;
pub mod driver_error;
pub mod durability;
pub mod error;
pub mod fleet_time;
pub mod held;
pub mod lanes;
pub mod limits;
pub mod model;
pub mod names;
#[cfg(feature = "serve")]
pub mod ops_metrics;
pub mod output;
pub mod plugin;
pub mod plugin_env;
pub mod process;
pub mod queue_balance;
#[cfg(feature = "serve")]
pub mod readiness;
pub mod run_policy;
pub mod schedule;
pub mod scheduler;
#[cfg(feature = "serve")]
pub mod serve;
pub mod store;
pub mod text;
pub mod wire;
pub mod work_spec;
pub mod worker_policy;
pub mod workflow;

pub use error::{Error, Result};

/// This build's version, reported on node documents.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit of this build (abbreviated), "unknown" when built outside a git checkout
/// without `DISBATCH_GIT_SHA` set (see `build.rs`).
pub const GIT_SHA: &str = env!("DISBATCH_GIT_SHA");

/// What `--version` prints after each program's name: `0.1.0 (git abc1234def56)`.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("DISBATCH_GIT_SHA"),
    ")"
);
