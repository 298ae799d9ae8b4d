//! disbatch-core: what the DEN, the task runner and the DCI share.
//!
//! `config` reads node configs, `store` owns every MongoDB query, `fleet_time` is the
//! database server's clock as this process knows it (every time another host judges),
//! `model` the schema's values, `output` the GridFS placement rules, `plugin` the plugin
//! allow-list, `claim_plan` the per-pass claim decisions, `durability` whether the write
//! concern survives a failover,
//! `redact` keeps credentials out of messages and `printable` makes stored text safe to show.

pub mod backoff;
pub mod balance;
pub mod chaining;
pub mod claim_plan;
pub mod client_json;
pub mod config;
pub mod driver_error;
pub mod durability;
pub mod error;
pub mod fleet_time;
pub mod handoff;
pub mod held;
pub mod isolation;
pub mod lanes;
pub mod limits;
pub mod logging;
pub mod model;
pub mod names;
pub mod open_files;
#[cfg(feature = "serve")]
pub mod ops_metrics;
pub mod output;
pub mod plugin;
pub mod plugin_env;
pub mod printable;
pub mod queue_balance;
pub mod raw_doc;
#[cfg(feature = "serve")]
pub mod readiness;
pub mod redact;
pub mod relay;
pub mod result_batches;
pub mod run_policy;
pub mod schedule;
pub mod scheduler;
#[cfg(feature = "serve")]
pub mod serve;
pub mod store;
pub mod utf8;
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
