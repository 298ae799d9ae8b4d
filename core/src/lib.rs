//! disbatch-core: what the DEN, the task runner and the DCI share, in layers; each uses only
//! those below it (issue 53 regroups the rest the same way):
//! - `serve`: serving an axum app with bounded connections (the DCI, the DEN's metrics),
//!   readiness and the operational metrics;
//! - `store`: every MongoDB query and index (`store/conn/indexes.rs`);
//! - `config`: node configs, the plugin allow-list, the plugins' environment, and a binary's
//!   start from its config file (`config::startup`);
//! - `process`: the process itself (`logging`, `isolation`, `open_files`, `backoff`);
//! - `wire`: the pipes between a DEN and its runners (`handoff`, `relay`, `result_batches`);
//! - `model`: the schema's names (`model::schema`: collections and fields) and values, and the
//!   rules on them (queues, statuses, limits, schedules, workflows, retention, GridFS
//!   placement, tasks and attempts as passed around), bson only;
//! - `text`: bytes and text safe to show, store and log (`printable`, `redact`, `utf8`,
//!   `client_json`, `raw_doc`);
//! - at the ground: `error`, `driver_error`, and `fleet_time` (the database server's clock as
//!   this process knows it: every time another host judges).
//!
//! No module imports one above it
//! (config reads `error` for its errors until the layers are crates).

pub mod config;
pub mod driver_error;
pub mod error;
pub mod fleet_time;
pub mod model;
pub mod process;
#[cfg(feature = "serve")]
pub mod serve;
pub mod store;
pub mod text;
pub mod wire;

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
